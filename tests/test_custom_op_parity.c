/* tests/test_custom_op_parity.c — the custom-op example's swish (examples/custom_op) on CUDA
 * against its CPU loop, through the public path: na_function_apply forward, na_backward
 * into the input's gradient, in f32 and under f16 autocast (swish casts its input to f32).
 * Sizes are not multiples of the kernel's 256-thread blocks. Tolerance: ||cuda - cpu|| /
 * ||cpu|| <= 1e-5 (f32; expf differs in the last bits between the two). Without a CUDA
 * device the tests skip; NANOAMP_PARITY_ON_CPU=1 runs them with the CPU in CUDA's place
 * (a check of the harness), as tests/test_cuda_parity.c. */
#include "helpers.h"
#include "nanoamp/cuda.h"
#include "../examples/custom_op/swish.h"

static na_device g_device = NA_DEVICE_CUDA; /* the device under test */

#define REQUIRE_DEVICE()                                                                   \
    do {                                                                                   \
        const char *e = getenv("NANOAMP_PARITY_ON_CPU");                                   \
        if (e && *e && strcmp(e, "0") != 0) {                                              \
            g_device = NA_DEVICE_CPU;                                                       \
        } else if (!na_cuda_available()) {                                                 \
            cr_skip_test("no CUDA device (built with CUDA: %s)", na_cuda_built() ? "yes" : "no"); \
            return;                                                                        \
        }                                                                                  \
    } while (0)

/* ||a - b|| / ||b|| over two tensors of one shape (copied to the host as f64). */
static double rel_err(na_tensor *a, na_tensor *b) {
    na_tensor *ha = TH_OK(na_cast(TH_OK(na_to_device(a, NA_DEVICE_CPU)), NA_DTYPE_F64));
    na_tensor *hb = TH_OK(na_cast(TH_OK(na_to_device(b, NA_DEVICE_CPU)), NA_DTYPE_F64));
    const double *pa = ha->data, *pb = hb->data;
    double num = 0, den = 0;
    for (int64_t i = 0; i < ha->numel; i++) {
        num += (pa[i] - pb[i]) * (pa[i] - pb[i]);
        den += pb[i] * pb[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* swish forward and backward of n random values in `dt`, on `dev`, (amp: in an f16 region);
 * y and the input's gradient come back through *y and *gx. */
static void run(na_device dev, na_tensor *x_host, na_tensor *gy_host, bool amp, na_tensor **y,
                na_tensor **gx) {
    na_tensor *x = TH_OK(na_to_device(x_host, dev));
    x = TH_OK(na_detach(x));
    TH_RC(na_tensor_set_requires_grad(x, true));
    if (amp) TH_RC(na_autocast_begin_device(dev, NA_DTYPE_F16));
    *y = TH_OK(swish(x));
    if (amp) TH_RC(na_autocast_end());
    TH_RC(na_backward(*y, TH_OK(na_to_device(gy_host, dev))));
    *gx = x->grad;
    cr_assert_not_null(*gx);
}

static void parity(na_dtype dt, bool amp) {
    uint64_t seed = th_run_seed();
    na_manual_seed(seed);
    static const int64_t sizes[] = {1, 7, 255, 1000, 4099, 70001};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = sizes[s];
        na_tensor *x = TH_OK(na_randn(dt, NA_DEVICE_CPU, NA_SHAPE(n), 0.0, 3.0));
        na_tensor *gy = TH_OK(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n), 0.0, 1.0));
        na_tensor *y_cpu, *g_cpu, *y_dev, *g_dev;
        run(NA_DEVICE_CPU, x, gy, amp, &y_cpu, &g_cpu);
        run(g_device, x, gy, amp, &y_dev, &g_dev);
        cr_assert_eq(y_dev->dtype, NA_DTYPE_F32);
        cr_assert_eq(g_dev->dtype, dt, "the gradient has the input's dtype");
        double ey = rel_err(y_dev, y_cpu), eg = rel_err(g_dev, g_cpu);
        cr_assert(ey <= 1e-5 && eg <= (dt == NA_DTYPE_F32 ? 1e-5 : 1e-2),
                  "[seed %" PRIu64 "] n %" PRId64 " %s%s: forward error %g, gradient error %g",
                  seed, n, na_dtype_name(dt), amp ? " under autocast" : "", ey, eg);
        na_step_end();
    }
}

Test(custom_op_parity, swish_f32) {
    REQUIRE_DEVICE();
    parity(NA_DTYPE_F32, false);
}

Test(custom_op_parity, swish_f16_input_under_autocast) {
    REQUIRE_DEVICE();
    parity(NA_DTYPE_F16, true);
}

Test(custom_op_parity, the_cuda_path_is_the_kernel) {
    REQUIRE_DEVICE();
    if (g_device != NA_DEVICE_CUDA) return;
    /* f64 on CUDA reaches swish.c's CUDA branch, which refuses it: the dispatch is real */
    na_tensor *x = TH_OK(na_zeros(NA_DTYPE_F64, NA_DEVICE_CUDA, NA_SHAPE(3)));
    TH_EXPECT_ERROR(swish(x), NA_EDTYPE, "the CUDA kernel computes in f32");
    cr_assert_not_null(na_cuda_stream(), "the stream custom kernels are told to use");
}
