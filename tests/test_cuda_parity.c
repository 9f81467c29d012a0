/* tests/test_cuda_parity.c — the CUDA backend against the CPU reference.
 *
 * Two layers:
 *  - op parity (suite cuda_ops): every op of the table (NA_OP_MAP) runs forward and backward
 *    through its public front-end on the CPU and on CUDA, on the same random inputs, in f32,
 *    f16 and bf16 (ops that compute in f32, like cross-entropy, take logits of each dtype).
 *    The CUDA inputs are copies made with na_to_device of CPU leaves, so the CUDA gradients
 *    flow back through TO_DEVICE into CPU leaves; outputs and gradients are compared.
 *    The rows of tests/op_cases.c give the cases: an elementwise op runs from its row (its
 *    input range, argument variants and tolerance), any other op by the check its row names
 *    (par_<op>, here); an op without a row or that check fails `cuda_ops.every_op_has_a_case`
 *    (which runs with or without a GPU).
 *  - kernel parity (suite cuda_kernels): each na_backend function is called directly
 *    (kernels/backend.h through na_backend_get) on both backends, with every output
 *    pre-filled with NaN so an element a kernel forgets to write shows up. Sizes are chosen
 *    not to be multiples of block sizes (1, 7, 33, 1000, 4099, ...).
 *
 * Tolerance: ||cuda - cpu|| / ||cpu|| <= 1e-5 for f32 and 1e-2 for f16/bf16. f32 is strict:
 * the suite turns TF32 off (NANOAMP_TF32=0) unless NANOAMP_TF32=1 asks for it, and then
 * compares f32 within TF32_TOL (10-bit mantissa operands); exact for integer outputs, fills, copies and the uniform / dropout random fills;
 * positions where both are NaN agree. Inputs are random with a fresh seed per run (set
 * NANOAMP_TEST_SEED to replay one); every failure message carries the seed.
 * Without a CUDA device every test but the table check skips. NANOAMP_PARITY_ON_CPU=1 runs the
 * whole suite with the CPU in CUDA's place (a check of the harness itself, no GPU needed).
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "common/half.h"
#include "cpu/cpu_internal.h"   /* na_cpu_bf16_fast, na_cpu_bf16_force_spec */
#include "cuda/conv_graph.h"    /* na_conv_layout_strides (host code, in every build) */
#include "cuda/cuda_internal.h" /* declarations only; called under NA_HAVE_CUDA */
#include "nanoamp/autograd.h"
#include "nanoamp/cuda.h"
#include "nanoamp/error.h"
#include "nanoamp/ops.h"
#include "nanoamp/tensor.h"
#include "op_cases.h"

/* ---- context: seed, what is being checked --------------------------------------------- */

static uint64_t g_seed, g_rng;
static char g_what[256];

static void what(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_what, sizeof g_what, fmt, ap);
    va_end(ap);
}

#define CTX "[%s; seed %" PRIu64 "] "
#define CTXA g_what, g_seed

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static double urand(double lo, double hi) {
    return lo + (hi - lo) * (double)(splitmix(&g_rng) >> 11) * 0x1p-53;
}

static void seed_init(void) {
    const char *env = getenv("NANOAMP_TEST_SEED");
    if (env && *env) {
        g_seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    }
    g_rng = g_seed;
    what("setup");
}

static const na_backend *cpu, *gpu;
/* NANOAMP_TF32=1: f32 products on CUDA use TF32 (otherwise the suite forces strict f32) */
static bool g_tf32;
/* TF32 rounds operands to 11 significant bits (unit roundoff 2^-11 = 4.9e-4); dot products of
 * random signs keep that relative size: 2e-3 leaves a 4x margin and stays 5x under f16's. */
#define TF32_TOL 2e-3
/* The device under test: CUDA; the CPU itself with NANOAMP_PARITY_ON_CPU=1, which checks the
 * harness (cases, front-ends, comparisons) on a machine without a GPU. */
static na_device g_dev2 = NA_DEVICE_CUDA;
static int g_side; /* 0 while the CPU reference runs, 1 while the device under test runs */

static bool self_test(void) {
    const char *e = getenv("NANOAMP_PARITY_ON_CPU");
    return e && *e && strcmp(e, "0") != 0;
}

/* The CPU side is the specification: bf16 products on the widening path, not on vdpbf16ps
 * (another summation order, denormals flushed). Read once, before the test's first product. */
static void spec_bf16(void) { setenv("NANOAMP_CPU_BF16", "off", 1); }

/* Every GPU test starts here: skip without a device, else seed and fetch both backends. */
#define REQUIRE_CUDA()                                                                     \
    do {                                                                                   \
        spec_bf16();                                                                       \
        if (self_test()) {                                                                 \
            g_dev2 = NA_DEVICE_CPU;                                                        \
        } else if (!na_cuda_available()) {                                                 \
            cr_skip_test("no CUDA device (built with CUDA: %s)", na_cuda_built() ? "yes" : "no"); \
            return;                                                                        \
        }                                                                                  \
        seed_init();                                                                       \
        na_cpu_bf16_force_spec = true; /* the CPU side is the spec: bf16 products widened */ \
        cpu = na_backend_get(NA_DEVICE_CPU);                                               \
        gpu = na_backend_get(g_dev2);                                                      \
        cr_assert(cpu && gpu, "backends: %s", na_last_error());                            \
        if (g_dev2 == NA_DEVICE_CUDA) {                                                    \
            const char *tf_ = getenv("NANOAMP_TF32");                                      \
            g_tf32 = tf_ && strcmp(tf_, "1") == 0;                                         \
            cr_assert_eq(na_cuda_set_tf32(g_tf32), NA_OK, "%s", na_last_error());          \
        }                                                                                  \
    } while (0)

#define TRC(expr)                                                                          \
    do {                                                                                   \
        int trc_ = (expr);                                                                 \
        cr_assert_eq(trc_, NA_OK, CTX "%s returned %d: %s", CTXA, #expr, trc_,             \
                     na_last_error());                                                     \
    } while (0)
#define TOK(expr)                                                                          \
    ({                                                                                     \
        na_tensor *tok_ = (expr);                                                          \
        cr_assert_not_null(tok_, CTX "%s returned NULL: %s", CTXA, #expr, na_last_error()); \
        tok_;                                                                              \
    })

static const na_dtype float_dtypes[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
#define N_FLOAT_DTYPES 3
static const int64_t sizes[] = {1, 7, 33, 1000, 4099};
#define N_SIZES 5

static double tol_of(na_dtype dt) { return oc_tol_of(dt); }

/* tol, widened to TF32_TOL for f32 values when TF32 is on (exact comparisons stay exact) */
static double tf32_tol(na_dtype dt, double tol) {
    return g_tf32 && dt == NA_DTYPE_F32 && tol > 0 && tol < TF32_TOL ? TF32_TOL : tol;
}

/* ---- host conversions --------------------------------------------------------------------- */

static void *pack(na_dtype dt, const double *v, int64_t n) {
    void *b = malloc((size_t)(n ? n : 1) * 8);
    cr_assert_not_null(b);
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case NA_DTYPE_F64: ((double *)b)[i] = v[i]; break;
        case NA_DTYPE_F32: ((float *)b)[i] = (float)v[i]; break;
        case NA_DTYPE_F16: ((uint16_t *)b)[i] = na_f32_to_f16_bits((float)v[i]); break;
        case NA_DTYPE_BF16: ((uint16_t *)b)[i] = na_f32_to_bf16_bits((float)v[i]); break;
        case NA_DTYPE_I32: ((int32_t *)b)[i] = (int32_t)v[i]; break;
        case NA_DTYPE_U8: ((uint8_t *)b)[i] = (uint8_t)v[i]; break;
        default: break;
        }
    }
    return b;
}

static double *unpack(na_dtype dt, const void *b, int64_t n) {
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case NA_DTYPE_F64: v[i] = ((const double *)b)[i]; break;
        case NA_DTYPE_F32: v[i] = ((const float *)b)[i]; break;
        case NA_DTYPE_F16: v[i] = na_f16_bits_to_f32(((const uint16_t *)b)[i]); break;
        case NA_DTYPE_BF16: v[i] = na_bf16_bits_to_f32(((const uint16_t *)b)[i]); break;
        case NA_DTYPE_I32: v[i] = ((const int32_t *)b)[i]; break;
        case NA_DTYPE_U8: v[i] = ((const uint8_t *)b)[i]; break;
        default: v[i] = NAN; break;
        }
    }
    return v;
}

static double *rand_vals(int64_t n, double lo, double hi) {
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = urand(lo, hi);
    return v;
}

/* ||a - b|| / ||b|| <= tol (absolute when ||b|| == 0); NaN must match NaN. */
static void expect_close(const double *a, const double *b, int64_t n, double tol,
                         const char *label) {
    double num = 0, den = 0, worst = -1;
    int64_t wi = -1;
    for (int64_t i = 0; i < n; i++) {
        bool an = a[i] != a[i], bn = b[i] != b[i];
        cr_assert(an == bn, CTX "%s: element %" PRId64 " is %g on CUDA, %g on the CPU", CTXA,
                  label, i, a[i], b[i]);
        if (an) continue;
        if (isinf(a[i]) || isinf(b[i])) {
            cr_assert(a[i] == b[i], CTX "%s: element %" PRId64 " is %g on CUDA, %g on the CPU",
                      CTXA, label, i, a[i], b[i]);
            continue;
        }
        double d = a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
        if (fabs(d) > worst) {
            worst = fabs(d);
            wi = i;
        }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    cr_assert(rel <= tol,
              CTX "%s: relative error %.3g > %.1g (%" PRId64 " elements; worst at %" PRId64
                  ": cuda %.9g, cpu %.9g)",
              CTXA, label, rel, tol, n, wi, wi >= 0 ? a[wi] : 0.0, wi >= 0 ? b[wi] : 0.0);
}

/* ================================================================================================
 * Op parity through the front-ends
 * ================================================================================================ */

typedef struct {
    na_dtype dt;
    int ndim;
    int64_t shape[NA_MAX_DIMS];
    double lo, hi;        /* random uniform range */
    bool either_sign;     /* ... with a random sign */
    const double *vals;   /* or these values */
    bool grad;
} in_spec;

typedef na_tensor *(*op_fn)(na_tensor **in, void *ctx);

static int64_t spec_numel(const in_spec *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

static double *tensor_values(const na_tensor *t) {
    void *b = malloc((size_t)(t->numel ? t->numel : 1) * 8);
    cr_assert_not_null(b);
    TRC(na_copy_to_host(t, b));
    double *v = unpack(t->dtype, b, t->numel);
    free(b);
    return v;
}

static na_tensor *leaf(const in_spec *s, const double *vals) {
    na_tensor *t = TOK(na_tensor_new(s->dt, NA_DEVICE_CPU, s->ndim, s->shape));
    void *b = pack(s->dt, vals, t->numel);
    TRC(na_copy_from_host(t, b));
    free(b);
    if (s->grad) TRC(na_tensor_set_requires_grad(t, true));
    return t;
}

static void compare_tensors(const na_tensor *g, const na_tensor *c, double tol, const char *label) {
    cr_assert_eq(g->ndim, c->ndim, CTX "%s: ndim %d on CUDA, %d on the CPU", CTXA, label,
                 g->ndim, c->ndim);
    for (int d = 0; d < c->ndim; d++)
        cr_assert_eq(g->shape[d], c->shape[d], CTX "%s: dim %d is %" PRId64 " vs %" PRId64, CTXA,
                     label, d, g->shape[d], c->shape[d]);
    cr_assert_eq(g->dtype, c->dtype, CTX "%s: dtype %s on CUDA, %s on the CPU", CTXA, label,
                 na_dtype_name(g->dtype), na_dtype_name(c->dtype));
    double *a = tensor_values(g), *b = tensor_values(c);
    expect_close(a, b, c->numel, na_dtype_is_float(c->dtype) ? tf32_tol(c->dtype, tol) : 0.0, label);
    free(a);
    free(b);
}

/* Runs f on CPU leaves and on CUDA copies of identical leaves; compares the outputs and, when
 * an input wants a gradient, the gradients of a random output gradient. */
static void run_parity(const char *label, op_fn f, void *ctx, int n, const in_spec *spec,
                       double tol) {
    na_tensor *lc[8], *lg[8], *ing[8];
    double *vals[8];
    bool any_grad = false;
    cr_assert(n <= 8);
    what("%s", label);
    for (int i = 0; i < n; i++) {
        int64_t m = spec_numel(&spec[i]);
        vals[i] = rand_vals(m, spec[i].lo, spec[i].hi);
        if (spec[i].either_sign)
            for (int64_t j = 0; j < m; j++) vals[i][j] *= splitmix(&g_rng) & 1 ? 1 : -1;
        if (spec[i].vals) memcpy(vals[i], spec[i].vals, (size_t)m * sizeof(double));
        lc[i] = leaf(&spec[i], vals[i]);
        lg[i] = leaf(&spec[i], vals[i]);
        any_grad |= spec[i].grad;
    }
    g_side = 0;
    na_tensor *oc = f(lc, ctx);
    cr_assert_not_null(oc, CTX "CPU forward failed: %s", CTXA, na_last_error());
    for (int i = 0; i < n; i++) ing[i] = TOK(na_to_device(lg[i], g_dev2));
    g_side = 1;
    na_tensor *og = f(ing, ctx);
    cr_assert_not_null(og, CTX "CUDA forward failed: %s", CTXA, na_last_error());
    char buf[300];
    snprintf(buf, sizeof buf, "%s: forward", label);
    compare_tensors(og, oc, tol, buf);

    if (any_grad && na_dtype_is_float(oc->dtype)) {
        double *gv = rand_vals(oc->numel, -1, 1);
        void *gb = pack(oc->dtype, gv, oc->numel);
        na_tensor *gyc = TOK(na_from_host(oc->dtype, oc->device, oc->ndim, oc->shape, gb));
        na_tensor *gyg = TOK(na_from_host(og->dtype, og->device, og->ndim, og->shape, gb));
        free(gb);
        free(gv);
        TRC(na_backward(oc, gyc));
        TRC(na_backward(og, gyg));
        for (int i = 0; i < n; i++) {
            if (!spec[i].grad) continue;
            snprintf(buf, sizeof buf, "%s: gradient of input %d", label, i);
            what("%s", buf);
            cr_assert((lc[i]->grad != NULL) == (lg[i]->grad != NULL),
                      CTX "gradient present on one device only", CTXA);
            /* The gradient of a broadcast input sums k = out/in products; the two backends sum
             * in different orders (CPU pairwise, CUDA a tree), whose rounding differs by about
             * sqrt(k) f32 ulps of the summands, and cancellation makes that large relative to
             * the result: widen the tolerance by sqrt(k) for such inputs (seen on the H200:
             * [1] * [5, 1000], k = 5000, relative error 1.5e-5). */
            double k = lc[i]->numel ? (double)oc->numel / (double)lc[i]->numel : 1.0;
            double gtol = k > 1.0 && spec[i].dt != NA_DTYPE_F64 ? tol * sqrt(k) : tol;
            if (lc[i]->grad) compare_tensors(lg[i]->grad, lc[i]->grad, gtol, buf);
        }
    }
    for (int i = 0; i < n; i++) {
        na_tensor_free(lc[i]);
        na_tensor_free(lg[i]);
        free(vals[i]);
    }
    na_step_end();
}

/* shorthand for specs */
#define SPEC(dt_, lo_, hi_, grad_, ...)                                                      \
    ((in_spec){.dt = (dt_), .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
               .shape = {__VA_ARGS__}, .lo = (lo_), .hi = (hi_), .grad = (grad_)})

/* ---- op functions ------------------------------------------------------------------------- */

typedef struct {
    int op;
    double a, b;
    int dim;
    bool keepdim;
    na_dtype dt;
    uint64_t seed;
    na_cross_entropy_opts ce;
    na_reduction red;
    na_conv2d_opts conv;
    na_pool2d_opts pool;
    int perm[NA_MAX_DIMS];
    int64_t shape[NA_MAX_DIMS];
    int ndim;
    bool training, affine, running, relu;
    bool channels_last; /* conv, pool, BN: input 0 converted to channels-last first */
    na_tensor *rm[2], *rv[2]; /* batch norm running stats per device */
} op_ctx;

typedef struct {
    const oc_case *c;
    oc_args args;
} elementwise_ctx;

static na_tensor *f_elementwise(na_tensor **in, void *ctx) {
    elementwise_ctx *e = ctx;
    return oc_call(e->c, in, e->args);
}

/* an input spec in the range the row gives input i */
static in_spec row_spec(const oc_case *c, int i, na_dtype dt, int ndim, const int64_t *shape) {
    oc_range r = oc_range_of(c, i);
    in_spec s = {.dt = dt, .ndim = ndim, .lo = r.lo, .hi = r.hi, .either_sign = r.either_sign,
                 .grad = true};
    memcpy(s.shape, shape, sizeof(int64_t) * (size_t)ndim);
    return s;
}

/* Sizes around block sizes, and broadcasting both ways. */
static void par_binary(const oc_case *c, na_dtype dt) {
    elementwise_ctx e = {c, {0, 0}};
    double tol = oc_parity_tol(c, dt);
    char l[128];
    for (int s = 0; s < N_SIZES; s++) {
        in_spec sp[2] = {row_spec(c, 0, dt, NA_SHAPE(sizes[s])),
                         row_spec(c, 1, dt, NA_SHAPE(sizes[s]))};
        snprintf(l, sizeof l, "%s %s [%" PRId64 "]", na_op_name(oc_op_of(c)), na_dtype_name(dt),
                 sizes[s]);
        run_parity(l, f_elementwise, &e, 2, sp, tol);
    }
    in_spec b1[2] = {row_spec(c, 0, dt, NA_SHAPE(7, 33)), row_spec(c, 1, dt, NA_SHAPE(33))};
    run_parity("broadcast [7,33] . [33]", f_elementwise, &e, 2, b1, tol);
    in_spec b2[2] = {row_spec(c, 0, dt, NA_SHAPE(3, 1, 33)), row_spec(c, 1, dt, NA_SHAPE(7, 1))};
    run_parity("broadcast [3,1,33] . [7,1]", f_elementwise, &e, 2, b2, tol);
    in_spec b3[2] = {row_spec(c, 0, dt, NA_SHAPE(1)), row_spec(c, 1, dt, NA_SHAPE(5, 1000))};
    run_parity("broadcast [1] . [5,1000]", f_elementwise, &e, 2, b3, tol);
}

/* Every argument variant of the row, on sizes around block sizes and on a 3-d tensor. */
static void par_unary(const oc_case *c, na_dtype dt) {
    double tol = oc_parity_tol(c, dt);
    char l[128];
    for (int v = 0; v < oc_n_args(c); v++) {
        elementwise_ctx e = {c, oc_arg(c, v)};
        char name[64];
        if (c->n_args)
            snprintf(name, sizeof name, "%s(a=%g, b=%g) %s", na_op_name(oc_op_of(c)), e.args.a,
                     e.args.b, na_dtype_name(dt));
        else
            snprintf(name, sizeof name, "%s %s", na_op_name(oc_op_of(c)), na_dtype_name(dt));
        for (int s = 0; s < N_SIZES; s++) {
            in_spec sp[1] = {row_spec(c, 0, dt, NA_SHAPE(sizes[s]))};
            snprintf(l, sizeof l, "%s [%" PRId64 "]", name, sizes[s]);
            run_parity(l, f_elementwise, &e, 1, sp, tol);
        }
        in_spec sp2[1] = {row_spec(c, 0, dt, NA_SHAPE(3, 5, 7))};
        snprintf(l, sizeof l, "%s [3,5,7]", name);
        run_parity(l, f_elementwise, &e, 1, sp2, tol);
    }
}

static na_tensor *f_matmul(na_tensor **in, void *c) { (void)c; return na_matmul(in[0], in[1]); }

void par_matmul(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    in_spec a[2] = {SPEC(dt, -1, 1, true, 7, 33), SPEC(dt, -1, 1, true, 33, 5)};
    run_parity("matmul [7,33]@[33,5]", f_matmul, NULL, 2, a, tol);
    in_spec b[2] = {SPEC(dt, -1, 1, true, 65, 129), SPEC(dt, -1, 1, true, 129, 33)};
    run_parity("matmul [65,129]@[129,33]", f_matmul, NULL, 2, b, tol);
    in_spec c[2] = {SPEC(dt, -1, 1, true, 3, 7, 33), SPEC(dt, -1, 1, true, 3, 33, 17)};
    run_parity("matmul [3,7,33]@[3,33,17]", f_matmul, NULL, 2, c, tol);
    in_spec d[2] = {SPEC(dt, -1, 1, true, 1, 1), SPEC(dt, -1, 1, true, 1, 1)};
    run_parity("matmul [1,1]@[1,1]", f_matmul, NULL, 2, d, tol);
    in_spec e[2] = {SPEC(dt, -1, 1, true, 2, 5, 1000), SPEC(dt, -1, 1, true, 1000, 7)};
    run_parity("matmul [2,5,1000]@[1000,7]", f_matmul, NULL, 2, e, tol);
}

static na_tensor *f_linear(na_tensor **in, void *c) {
    return na_linear(in[0], in[1], ((op_ctx *)c)->a != 0 ? in[2] : NULL);
}

void par_linear(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    op_ctx bias = {.a = 1}, nobias = {.a = 0};
    in_spec a[3] = {SPEC(dt, -1, 1, true, 7, 33), SPEC(dt, -1, 1, true, 17, 33),
                    SPEC(dt, -1, 1, true, 17)};
    run_parity("linear [7,33] w[17,33] b", f_linear, &bias, 3, a, tol);
    run_parity("linear [7,33] w[17,33]", f_linear, &nobias, 2, a, tol);
    in_spec b[3] = {SPEC(dt, -1, 1, true, 2, 5, 1000), SPEC(dt, -1, 1, true, 33, 1000),
                    SPEC(dt, -1, 1, true, 33)};
    run_parity("linear [2,5,1000] w[33,1000] b", f_linear, &bias, 3, b, tol);
    in_spec c[3] = {SPEC(dt, -1, 1, true, 1, 1), SPEC(dt, -1, 1, true, 1, 1),
                    SPEC(dt, -1, 1, true, 1)};
    run_parity("linear [1,1] w[1,1] b", f_linear, &bias, 3, c, tol);
}

static na_tensor *f_reduce(na_tensor **in, void *cv) {
    op_ctx *c = cv;
    switch (c->op) {
    case NA_OP_SUM: return c->dim < 0 ? na_sum(in[0]) : na_sum_dim(in[0], c->dim, c->keepdim);
    case NA_OP_MEAN: return c->dim < 0 ? na_mean(in[0]) : na_mean_dim(in[0], c->dim, c->keepdim);
    case NA_OP_MAX: return c->dim < 0 ? na_max(in[0]) : na_max_dim(in[0], c->dim, c->keepdim);
    default: return na_argmax(in[0], c->dim < 0 ? 0 : c->dim, c->keepdim);
    }
}

void par_reduce(const oc_case *row, na_dtype dt) {
    na_op op = oc_op_of(row);
    const double tol = oc_parity_tol(row, dt);
    /* sums of positive values: no cancellation, so the relative error is the summation's */
    double lo = op == NA_OP_MAX || op == NA_OP_ARGMAX ? -1 : 0.5, hi = 1.5;
    bool grad = op != NA_OP_ARGMAX;
    char l[128];
    for (int s = 0; s < N_SIZES; s++) {
        op_ctx c = {.op = op, .dim = op == NA_OP_ARGMAX ? 0 : -1};
        in_spec sp[1] = {SPEC(dt, lo, hi, grad, sizes[s])};
        snprintf(l, sizeof l, "%s %s all of [%" PRId64 "]", na_op_name(op), na_dtype_name(dt), sizes[s]);
        run_parity(l, f_reduce, &c, 1, sp, tol);
    }
    op_ctx c1 = {.op = op, .dim = 1, .keepdim = false};
    in_spec a[1] = {SPEC(dt, lo, hi, grad, 7, 33)};
    run_parity("reduce [7,33] dim 1", f_reduce, &c1, 1, a, tol);
    op_ctx c2 = {.op = op, .dim = 1, .keepdim = true};
    in_spec b[1] = {SPEC(dt, lo, hi, grad, 3, 1000, 7)};
    run_parity("reduce [3,1000,7] dim 1 keepdim", f_reduce, &c2, 1, b, tol);
    op_ctx c3 = {.op = op, .dim = 0, .keepdim = false};
    in_spec d[1] = {SPEC(dt, lo, hi, grad, 33, 65)};
    run_parity("reduce [33,65] dim 0", f_reduce, &c3, 1, d, tol);
    op_ctx c4 = {.op = op, .dim = op == NA_OP_ARGMAX ? 0 : -1};
    in_spec e[1] = {SPEC(dt, lo, hi, grad, 70001)};
    run_parity("reduce all of [70001]", f_reduce, &c4, 1, e, tol);
}

static na_tensor *f_softmax(na_tensor **in, void *cv) {
    return ((op_ctx *)cv)->op == NA_OP_SOFTMAX ? na_softmax(in[0]) : na_log_softmax(in[0]);
}

void par_softmax(const oc_case *row, na_dtype dt) {
    na_op op = oc_op_of(row);
    const double tol = oc_parity_tol(row, dt);
    op_ctx c = {.op = op};
    static const int64_t shp[][2] = {{7, 33}, {1, 1000}, {3, 4099}, {5, 1}, {1, 1}};
    char l[128];
    for (int i = 0; i < 5; i++) {
        in_spec sp[1] = {SPEC(dt, -4, 4, true, shp[i][0], shp[i][1])};
        snprintf(l, sizeof l, "%s %s [%" PRId64 ",%" PRId64 "]", na_op_name(op),
                 na_dtype_name(dt), shp[i][0], shp[i][1]);
        run_parity(l, f_softmax, &c, 1, sp, tol);
    }
}

static na_tensor *f_ce(na_tensor **in, void *cv) {
    return na_cross_entropy(in[0], in[1], &((op_ctx *)cv)->ce);
}

void par_cross_entropy(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    static const int64_t shp[][2] = {{7, 33}, {33, 1000}, {1, 1}, {5, 4099}};
    static const na_reduction reds[] = {NA_REDUCTION_MEAN, NA_REDUCTION_SUM, NA_REDUCTION_NONE};
    char l[160];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 3; r++)
            for (int sm = 0; sm < 2; sm++) {
                int64_t n = shp[i][0], cl = shp[i][1];
                double *labels = malloc((size_t)n * sizeof *labels);
                for (int64_t k = 0; k < n; k++) labels[k] = (double)(splitmix(&g_rng) % (uint64_t)cl);
                op_ctx c = {.ce = {.reduction = reds[r], .label_smoothing = sm ? 0.1 : 0.0}};
                in_spec sp[2] = {SPEC(dt, -3, 3, true, n, cl), SPEC(NA_DTYPE_I32, 0, 0, false, n)};
                sp[1].vals = labels;
                snprintf(l, sizeof l, "cross_entropy %s [%" PRId64 ",%" PRId64 "] reduction %d smoothing %g",
                         na_dtype_name(dt), n, cl, r, c.ce.label_smoothing);
                run_parity(l, f_ce, &c, 2, sp, tol);
                free(labels);
            }
}

static na_tensor *f_mse(na_tensor **in, void *cv) { return na_mse_loss(in[0], in[1], ((op_ctx *)cv)->red); }

void par_mse_loss(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    static const na_reduction reds[] = {NA_REDUCTION_MEAN, NA_REDUCTION_SUM, NA_REDUCTION_NONE};
    for (int r = 0; r < 3; r++) {
        op_ctx c = {.red = reds[r]};
        in_spec a[2] = {SPEC(dt, -1, 1, true, 7, 33), SPEC(dt, -1, 1, true, 7, 33)};
        run_parity("mse_loss [7,33]", f_mse, &c, 2, a, tol);
        in_spec b[2] = {SPEC(dt, -1, 1, true, 4099), SPEC(dt, -1, 1, true, 4099)};
        run_parity("mse_loss [4099]", f_mse, &c, 2, b, tol);
    }
}

static na_tensor *f_dropout(na_tensor **in, void *cv) {
    op_ctx *c = cv;
    na_manual_seed(c->seed); /* both devices draw the same mask */
    return na_dropout(in[0], c->a, true);
}

void par_dropout(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    for (int s = 0; s < N_SIZES; s++) {
        op_ctx c = {.a = 0.3, .seed = splitmix(&g_rng)};
        in_spec sp[1] = {SPEC(dt, -1, 1, true, sizes[s])};
        run_parity("dropout p=0.3", f_dropout, &c, 1, sp, tol);
    }
    op_ctx c = {.a = 0.9, .seed = splitmix(&g_rng)};
    in_spec sp[1] = {SPEC(dt, -1, 1, true, 33, 65)};
    run_parity("dropout p=0.9", f_dropout, &c, 1, sp, tol);
}

static na_tensor *f_cast(na_tensor **in, void *cv) { return na_cast(in[0], ((op_ctx *)cv)->dt); }

void par_cast(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    for (int k = 0; k < N_FLOAT_DTYPES; k++) {
        op_ctx c = {.dt = float_dtypes[k]};
        in_spec sp[1] = {SPEC(dt, -3, 3, true, 4099)};
        char l[96];
        snprintf(l, sizeof l, "cast %s -> %s", na_dtype_name(dt), na_dtype_name(c.dt));
        run_parity(l, f_cast, &c, 1, sp, tol);
    }
}

/* On CUDA: back to the CPU, so the graph holds two TO_DEVICE nodes (CPU -> CUDA -> CPU); on
 * the CPU a CPU -> CPU copy. */
static na_tensor *f_to_device(na_tensor **in, void *cv) {
    (void)cv;
    return na_to_device(na_scale(in[0], 2.0), NA_DEVICE_CPU);
}

void par_to_device(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    in_spec one[1] = {SPEC(dt, -1, 1, true, 33, 7)};
    run_parity("to_device round trip", f_to_device, NULL, 1, one, tol);
}

static na_tensor *f_shape(na_tensor **in, void *cv) {
    op_ctx *c = cv;
    switch (c->op) {
    case NA_OP_RESHAPE: return na_reshape(in[0], c->ndim, c->shape);
    case NA_OP_PERMUTE:
        return c->keepdim ? na_contiguous(na_permute(in[0], c->perm)) : na_permute(in[0], c->perm);
    case NA_OP_SLICE: return na_slice(in[0], (int64_t)c->a, (int64_t)c->b);
    default: return na_contiguous(na_transpose(in[0], 0, 1));
    }
}

void par_shape(const oc_case *row, na_dtype dt) {
    na_op op = oc_op_of(row);
    const double tol = oc_parity_tol(row, dt);
    op_ctx c = {.op = op};
    switch (op) {
    case NA_OP_RESHAPE: {
        c.ndim = 3;
        c.shape[0] = 5; c.shape[1] = -1; c.shape[2] = 3;
        in_spec sp[1] = {SPEC(dt, -1, 1, true, 7, 15)};
        run_parity("reshape [7,15] -> [5,-1,3]", f_shape, &c, 1, sp, tol);
    } break;
    case NA_OP_PERMUTE: {
        c.perm[0] = 2; c.perm[1] = 0; c.perm[2] = 1;
        in_spec sp[1] = {SPEC(dt, -1, 1, true, 3, 7, 33)};
        run_parity("permute [3,7,33] (2,0,1)", f_shape, &c, 1, sp, tol);
        c.keepdim = true; /* and made contiguous: the strided copy kernel */
        run_parity("contiguous(permute [3,7,33] (2,0,1))", f_shape, &c, 1, sp, tol);
        in_spec big[1] = {SPEC(dt, -1, 1, true, 5, 33, 65)};
        run_parity("contiguous(permute [5,33,65] (2,0,1))", f_shape, &c, 1, big, tol);
    } break;
    case NA_OP_SLICE: {
        c.a = 5; c.b = 20;
        in_spec sp[1] = {SPEC(dt, -1, 1, true, 33, 7)};
        run_parity("slice [33,7] 5:20", f_shape, &c, 1, sp, tol);
        c.a = 0; c.b = 1;
        run_parity("slice [33,7] 0:1", f_shape, &c, 1, sp, tol);
    } break;
    default: {
        in_spec sp[1] = {SPEC(dt, -1, 1, true, 33, 65)};
        run_parity("contiguous(transpose [33,65])", f_shape, &c, 1, sp, tol);
        in_spec one[1] = {SPEC(dt, -1, 1, true, 1, 1)};
        run_parity("contiguous(transpose [1,1])", f_shape, &c, 1, one, tol);
    } break;
    }
}

/* input 0, channels-last when the case asks (conv, pool, BN: the ops' channels-last paths) */
static na_tensor *in0(na_tensor **in, const op_ctx *c) {
    return c->channels_last ? na_to_channels_last(in[0]) : in[0];
}

static na_tensor *f_pad(na_tensor **in, void *cv) {
    op_ctx *c = cv;
    return na_pad_dim(in0(in, c), c->dim, (int64_t)c->a, (int64_t)c->b);
}

void par_pad(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    op_ctx last = {.dim = 1, .a = 2, .b = 3};
    in_spec sp[1] = {SPEC(dt, -1, 1, true, 33, 7)};
    run_parity("pad [33,7] dim 1 (2, 3)", f_pad, &last, 1, sp, tol);
    op_ctx ch = {.dim = 1, .a = 0, .b = 5, .channels_last = true};
    in_spec img[1] = {SPEC(dt, -1, 1, true, 4, 3, 9, 11)};
    run_parity("pad channels of channels-last [4,3,9,11] 3 -> 8", f_pad, &ch, 1, img, tol);
}

static na_tensor *f_conv(na_tensor **in, void *cv) {
    op_ctx *c = cv;
    return na_conv2d(in0(in, c), in[1], c->a != 0 ? in[2] : NULL, &c->conv);
}

typedef struct {
    int64_t n, cin, h, w, cout;
    int k, stride, pad, dil, groups;
    bool bias;
} conv_case;

static const conv_case conv_cases[] = {
    {2, 3, 9, 11, 4, 3, 1, 1, 1, 1, true},
    {2, 4, 8, 8, 6, 3, 2, 1, 1, 2, true},
    {1, 3, 13, 7, 5, 3, 1, 2, 2, 1, false},
    {3, 8, 5, 5, 16, 1, 1, 0, 1, 1, true},
    {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, true},
    {2, 16, 12, 12, 32, 5, 2, 2, 1, 4, true},
};
#define N_CONV_CASES (int)(sizeof conv_cases / sizeof conv_cases[0])

void par_conv2d(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    char l[160];
    for (int i = 0; i < 2 * N_CONV_CASES; i++) { /* each case contiguous, then channels-last */
        const conv_case *k = &conv_cases[i % N_CONV_CASES];
        op_ctx c = {.a = k->bias ? 1 : 0, .channels_last = i >= N_CONV_CASES};
        c.conv.stride[0] = c.conv.stride[1] = k->stride;
        c.conv.padding[0] = c.conv.padding[1] = k->pad;
        c.conv.dilation[0] = c.conv.dilation[1] = k->dil;
        c.conv.groups = k->groups;
        in_spec sp[3] = {SPEC(dt, -1, 1, true, k->n, k->cin, k->h, k->w),
                         SPEC(dt, -0.5, 0.5, true, k->cout, k->cin / k->groups, k->k, k->k),
                         SPEC(dt, -0.5, 0.5, true, k->cout)};
        snprintf(l, sizeof l, "conv2d %s case %d (k%d s%d p%d d%d g%d)%s", na_dtype_name(dt),
                 i % N_CONV_CASES, k->k, k->stride, k->pad, k->dil, k->groups,
                 c.channels_last ? " channels-last" : "");
        run_parity(l, f_conv, &c, k->bias ? 3 : 2, sp, tol);
    }
}

static na_tensor *f_pool(na_tensor **in, void *cv) {
    op_ctx *c = cv;
    na_tensor *x = in0(in, c);
    return c->op == NA_OP_MAX_POOL2D ? na_max_pool2d(x, &c->pool) : na_avg_pool2d(x, &c->pool);
}

void par_pool(const oc_case *row, na_dtype dt) {
    na_op op = oc_op_of(row);
    const double tol = oc_parity_tol(row, dt);
    static const int geo[][3] = {{3, 2, 1}, {2, 2, 0}, {3, 1, 1}, {5, 3, 2}};
    char l[128];
    for (int i = 0; i < 8; i++) /* each geometry contiguous, then channels-last */
        for (int inc = 0; inc < 2; inc++) {
            if (inc && op == NA_OP_MAX_POOL2D) continue;
            op_ctx c = {.op = op, .channels_last = i >= 4};
            c.pool.kernel[0] = c.pool.kernel[1] = geo[i % 4][0];
            c.pool.stride[0] = c.pool.stride[1] = geo[i % 4][1];
            c.pool.padding[0] = c.pool.padding[1] = geo[i % 4][2];
            c.pool.count_include_pad = inc;
            in_spec sp[1] = {SPEC(dt, -1, 1, true, 2, 3, 11, 13)};
            snprintf(l, sizeof l, "%s %s k%d s%d p%d include_pad %d%s", na_op_name(op),
                     na_dtype_name(dt), geo[i % 4][0], geo[i % 4][1], geo[i % 4][2], inc,
                     c.channels_last ? " channels-last" : "");
            run_parity(l, f_pool, &c, 1, sp, tol);
        }
}

static na_tensor *f_bn(na_tensor **in, void *cv) {
    op_ctx *c = cv;
    int d = g_side;
    return (c->relu ? na_batch_norm_relu : na_batch_norm)(
        in0(in, c), c->running ? c->rm[d] : NULL, c->running ? c->rv[d] : NULL,
        c->affine ? in[1] : NULL, c->affine ? in[2] : NULL, c->training, 0.1, 1e-5);
}

static na_tensor *stats_tensor(na_device dev, int64_t c, const double *v) {
    na_tensor *t = TOK(na_tensor_new(NA_DTYPE_F32, dev, 1, (int64_t[]){c}));
    void *b = pack(NA_DTYPE_F32, v, c);
    TRC(na_copy_from_host(t, b));
    free(b);
    return t;
}

void par_batch_norm(const oc_case *row, na_dtype dt) {
    const double tol = oc_parity_tol(row, dt);
    /* the last two: channels-last ([N*H*W, C] rows on the device) */
    static const int64_t shp[][4] = {{4, 3, 5, 7}, {16, 5, 1, 1}, {2, 33, 3, 1}, {7, 1, 1, 1},
                                     {4, 3, 5, 7}, {8, 64, 6, 5}};
    static const int nd[] = {4, 2, 3, 2, 4, 4};
    char l[160];
    for (int i = 0; i < 6; i++)
        for (int mode = 0; mode < 4; mode++) { /* train+running, train, eval, train no affine */
            int64_t C = shp[i][1];
            op_ctx c = {.training = mode != 2, .running = mode != 1, .affine = mode != 3,
                        .relu = oc_op_of(row) == NA_OP_BATCH_NORM_RELU, .channels_last = i >= 4};
            double *rm = rand_vals(C, -0.5, 0.5), *rv = rand_vals(C, 0.5, 2);
            for (int d = 0; d < 2; d++) {
                c.rm[d] = stats_tensor(d ? g_dev2 : NA_DEVICE_CPU, C, rm);
                c.rv[d] = stats_tensor(d ? g_dev2 : NA_DEVICE_CPU, C, rv);
            }
            in_spec sp[3];
            sp[0] = (in_spec){.dt = dt, .ndim = nd[i], .lo = -2, .hi = 3, .grad = true};
            memcpy(sp[0].shape, shp[i], sizeof shp[i]);
            sp[1] = SPEC(NA_DTYPE_F32, 0.5, 1.5, true, C);
            sp[2] = SPEC(NA_DTYPE_F32, -0.5, 0.5, true, C);
            snprintf(l, sizeof l, "%s %s shape %d mode %d%s", na_op_name(oc_op_of(row)),
                     na_dtype_name(dt), i, mode, c.channels_last ? " channels-last" : "");
            run_parity(l, f_bn, &c, c.affine ? 3 : 1, sp, tol);
            if (c.running && c.training) {
                char m[200];
                snprintf(m, sizeof m, "%s: running_mean", l);
                compare_tensors(c.rm[1], c.rm[0], 1e-5, m);
                snprintf(m, sizeof m, "%s: running_var", l);
                compare_tensors(c.rv[1], c.rv[0], 1e-5, m);
            }
            for (int d = 0; d < 2; d++) {
                na_tensor_free(c.rm[d]);
                na_tensor_free(c.rv[d]);
            }
            free(rm);
            free(rv);
            na_step_end();
        }
}

/* ---- NaN rows: NaN propagates through ReLU (and its fusions), clamp and max pooling ---------- */

static na_tensor *f_relu(na_tensor **in, void *c) { (void)c; return na_relu(in[0]); }
static na_tensor *f_clamp(na_tensor **in, void *c) { (void)c; return na_clamp(in[0], -1, 1); }

/* NaN at the first element, in a channel's weight, in a pooling window: every side computes
 * the same NaNs (expect_close demands NaN where the CPU has one) and the same gradients. */
static void par_nan_rows(na_dtype dt) {
    double tol = tol_of(dt);
    static const double xv[] = {NAN, -1, 2, 0, 0.5, -0.25, 3, NAN};
    in_spec sp[1] = {SPEC(dt, -1, 1, true, 8)};
    sp[0].vals = xv;
    run_parity("relu with NaN", f_relu, NULL, 1, sp, tol);
    run_parity("clamp with NaN", f_clamp, NULL, 1, sp, tol);
    op_ctx pc = {.op = NA_OP_MAX_POOL2D, .pool = {.kernel = {2, 2}}};
    in_spec pp[1] = {SPEC(dt, -1, 1, true, 1, 2, 2, 2)};
    pp[0].vals = xv;
    run_parity("max_pool2d with NaN", f_pool, &pc, 1, pp, tol);
    static const double wv[] = {NAN, 1, 0.5};
    op_ctx bc = {.training = true, .affine = true, .relu = true};
    in_spec bp[3] = {SPEC(dt, -2, 3, true, 4, 3, 5, 7), SPEC(NA_DTYPE_F32, 0.5, 1.5, true, 3),
                     SPEC(NA_DTYPE_F32, -0.5, 0.5, true, 3)};
    bp[1].vals = wv;
    run_parity("batch_norm_relu with a NaN weight", f_bn, &bc, 3, bp, tol);
}

Test(cuda_ops, nan_propagates) {
    REQUIRE_CUDA();
    for (int d = 0; d < N_FLOAT_DTYPES; d++) {
        if (float_dtypes[d] == NA_DTYPE_BF16 && g_dev2 == NA_DEVICE_CUDA &&
            !na_cuda_bf16_supported())
            continue;
        par_nan_rows(float_dtypes[d]);
    }
}

/* ---- walking the table ---------------------------------------------------------------------- */

Test(cuda_ops, every_op_has_a_case) {
    oc_expect_every_op_has_a_row();
    for (int op = 0; op < NA_OP_COUNT; op++)
        if (oc_cases[op].kind == OC_CUSTOM)
            cr_expect_not_null(oc_cases[op].parity, "op %d (%s) has no CUDA parity check: name "
                               "one in its row (tests/op_cases.c) and write it in "
                               "tests/test_cuda_parity.c", op, na_op_name((na_op)op));
}

typedef struct {
    int op;
    int dt;
} op_param;

ParameterizedTestParameters(cuda_ops, parity) {
    static op_param params[NA_OP_COUNT * N_FLOAT_DTYPES];
    for (int op = 0; op < NA_OP_COUNT; op++)
        for (int d = 0; d < N_FLOAT_DTYPES; d++)
            params[op * N_FLOAT_DTYPES + d] = (op_param){op, (int)float_dtypes[d]};
    return cr_make_param_array(op_param, params, NA_OP_COUNT * N_FLOAT_DTYPES);
}

ParameterizedTest(op_param *p, cuda_ops, parity, .timeout = 300) {
    REQUIRE_CUDA();
    if (p->dt == NA_DTYPE_BF16 && g_dev2 == NA_DEVICE_CUDA && !na_cuda_bf16_supported()) {
        cr_skip_test("bf16 needs sm_80");
        return;
    }
    const oc_case *c = oc_case_of((na_op)p->op);
    cr_log_info("op %s, %s, seed %" PRIu64, na_op_name((na_op)p->op),
                na_dtype_name((na_dtype)p->dt), g_seed);
    if (c->kind == OC_UNARY) par_unary(c, (na_dtype)p->dt);
    else if (c->kind == OC_BINARY) par_binary(c, (na_dtype)p->dt);
    else cr_assert_not_null(c->parity, "op %s has no parity case", na_op_name((na_op)p->op));
    if (c->parity) c->parity(c, (na_dtype)p->dt);
}

/* ================================================================================================
 * Kernel parity: the backend functions called directly, outputs poisoned with NaN
 * ================================================================================================ */

/* One view on each backend (headers built here, memory from the backend's alloc). */
typedef struct {
    na_view c, g;
} rt;

static void rt_header(na_view *t, na_device dev, na_dtype dt, int ndim, const int64_t *shape) {
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->device = dev;
    t->ndim = ndim;
    t->numel = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->stride[d] = t->numel;
        t->numel *= shape[d];
    }
}

static void rt_upload(rt *t, const double *vals) {
    void *b = pack(t->c.dtype, vals, t->c.numel);
    size_t bytes = (size_t)t->c.numel * na_dtype_size(t->c.dtype);
    TRC(cpu->memcpy_h2d(t->c.data, b, bytes));
    TRC(gpu->memcpy_h2d(t->g.data, b, bytes));
    free(b);
}

static void rt_poison(rt *t) {
    double v = na_dtype_is_float(t->c.dtype) ? NAN : -77;
    if (t->c.numel == 0) return;
    TRC(cpu->fill(&t->c, v));
    TRC(gpu->fill(&t->g, v));
}

/* vals NULL: poisoned (NaN; -77 for integers) */
static rt *rt_new(na_dtype dt, int ndim, const int64_t *shape, const double *vals) {
    rt *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    rt_header(&t->c, NA_DEVICE_CPU, dt, ndim, shape);
    rt_header(&t->g, g_dev2, dt, ndim, shape);
    size_t bytes = (size_t)t->c.numel * na_dtype_size(dt);
    t->c.data = cpu->alloc(bytes ? bytes : 8);
    t->g.data = gpu->alloc(bytes ? bytes : 8);
    cr_assert(t->c.data && t->g.data, CTX "alloc: %s", CTXA, na_last_error());
    if (vals) rt_upload(t, vals);
    else rt_poison(t);
    return t;
}
#define RT(dt, vals, ...) rt_new((dt), NA_SHAPE(__VA_ARGS__), (vals))

static rt *rt_rand(na_dtype dt, double lo, double hi, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    double *v = rand_vals(n, lo, hi);
    rt *t = rt_new(dt, ndim, shape, v);
    free(v);
    return t;
}
#define RTR(dt, lo, hi, ...) rt_rand((dt), (lo), (hi), NA_SHAPE(__VA_ARGS__))

static void rt_free(rt *t) {
    if (!t) return;
    cpu->free(t->c.data);
    gpu->free(t->g.data);
    free(t);
}

static double *rt_values(const na_view *t) {
    const na_backend *be = na_backend_get(t->device);
    void *b = malloc((size_t)(t->numel ? t->numel : 1) * 8);
    cr_assert_not_null(b);
    TRC(be->memcpy_d2h(b, t->data, (size_t)t->numel * na_dtype_size(t->dtype)));
    double *v = unpack(t->dtype, b, t->numel);
    free(b);
    return v;
}

/* Both sides of t take the CPU's values: the next step starts from the same inputs. */
static void rt_take_cpu(rt *t) {
    double *v = rt_values(&t->c);
    rt_upload(t, v);
    free(v);
}

static void rt_cmp(const rt *t, double tol, const char *label) {
    double *a = rt_values(&t->g), *b = rt_values(&t->c);
    expect_close(a, b, t->c.numel, tf32_tol(t->c.dtype, tol), label);
    free(a);
    free(b);
}

/* Runs `call` on both backends: inside it, `be` is the backend and T(x) the side's tensor. */
#define T(p) (side ? &(p)->g : &(p)->c)
#define BOTH(call)                                                                         \
    do {                                                                                   \
        for (int side = 0; side < 2; side++) {                                             \
            const na_backend *be = side ? gpu : cpu;                                       \
            int both_rc_ = (call);                                                         \
            cr_assert_eq(both_rc_, NA_OK, CTX "%s backend: %s returned %d: %s", CTXA,      \
                         be->name, #call, both_rc_, na_last_error());                      \
        }                                                                                  \
    } while (0)

static const na_dtype raw_dtypes[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16, NA_DTYPE_F64};
#define N_RAW_DTYPES 4
static const na_dtype all_dtypes[] = {NA_DTYPE_F64, NA_DTYPE_F32, NA_DTYPE_F16,
                                      NA_DTYPE_BF16, NA_DTYPE_I32, NA_DTYPE_U8};

/* bf16 products on the CPU side take the specification (the widening path), whatever the CPU */
Test(cuda_kernels, cpu_side_is_the_bf16_specification) {
    REQUIRE_CUDA();
    cr_assert(!na_cpu_bf16_fast(), "the CPU reference multiplies bf16 on vdpbf16ps");
}

Test(cuda_kernels, fill_and_arange) {
    REQUIRE_CUDA();
    for (int d = 0; d < 6; d++)
        for (int s = 0; s < N_SIZES; s++) {
            na_dtype dt = all_dtypes[d];
            what("fill %s [%" PRId64 "]", na_dtype_name(dt), sizes[s]);
            rt *t = RT(dt, NULL, sizes[s]);
            BOTH(be->fill(T(t), 3.7));
            rt_cmp(t, 0, "fill 3.7");
            BOTH(be->fill(T(t), -1e6));
            rt_cmp(t, 0, "fill -1e6");
            rt_poison(t);
            BOTH(be->arange(T(t), -3.5, 0.25));
            rt_cmp(t, 0, "arange");
            rt_free(t);
        }
}

Test(cuda_kernels, random_fills) {
    REQUIRE_CUDA();
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int s = 0; s < N_SIZES; s++) {
            na_dtype dt = raw_dtypes[d];
            uint64_t seed = splitmix(&g_rng), off = splitmix(&g_rng) >> (s * 8);
            what("random fills %s [%" PRId64 "] seed %" PRIu64 " offset %" PRIu64,
                 na_dtype_name(dt), sizes[s], seed, off);
            rt *t = RT(dt, NULL, sizes[s]);
            BOTH(be->fill_uniform(T(t), -2, 3, seed, off));
            rt_cmp(t, 0, "uniform (bit-identical)");
            rt_poison(t);
            BOTH(be->fill_normal(T(t), 1, 2, seed, off));
            /* normals are made in f32 through each side's logf/sinf/cosf, which differ by an
             * ulp or so (kernels/common/philox.h): f32-level agreement, also for f64 */
            rt_cmp(t, na_dtype_size(dt) >= 4 ? 1e-6 : tol_of(dt), "normal");
            rt_poison(t);
            BOTH(be->dropout_mask(T(t), 0.3, seed, off));
            rt_cmp(t, 0, "dropout mask (bit-identical)");
            rt_free(t);
        }
}

Test(cuda_kernels, copy_convert_strided) {
    REQUIRE_CUDA();
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++) {
            na_dtype sdt = all_dtypes[a], ddt = all_dtypes[b];
            what("copy %s -> %s", na_dtype_name(sdt), na_dtype_name(ddt));
            bool ints = !na_dtype_is_float(sdt) || !na_dtype_is_float(ddt);
            for (int s = 0; s < N_SIZES; s++) {
                rt *src = RTR(sdt, ints ? -300 : -7e4, ints ? 300 : 7e4, sizes[s]);
                rt *dst = RT(ddt, NULL, sizes[s]);
                BOTH(be->copy(T(dst), T(src)));
                rt_cmp(dst, 0, "contiguous copy");
                rt_free(src);
                rt_free(dst);
            }
            /* strided: the transpose of a [33, 65] buffer, and a column slice of it */
            rt *src = RTR(sdt, ints ? -300 : -3, ints ? 300 : 3, 33, 65);
            rt *dst = RT(ddt, NULL, 65, 33);
            rt view = *src;
            na_view *vs[2] = {&view.c, &view.g};
            for (int k = 0; k < 2; k++) {
                vs[k]->shape[0] = 65; vs[k]->shape[1] = 33;
                vs[k]->stride[0] = 1; vs[k]->stride[1] = 65;
            }
            BOTH(be->copy(T(dst), T(&view)));
            rt_cmp(dst, 0, "strided copy (transpose)");
            rt *dst2 = RT(ddt, NULL, 33, 20);
            for (int k = 0; k < 2; k++) {
                vs[k]->shape[0] = 33; vs[k]->shape[1] = 20;
                vs[k]->stride[0] = 65; vs[k]->stride[1] = 1;
                vs[k]->numel = 33 * 20;
                vs[k]->data = (char *)(k ? src->g.data : src->c.data) + 7 * na_dtype_size(sdt);
            }
            BOTH(be->copy(T(dst2), T(&view)));
            rt_cmp(dst2, 0, "strided copy (column slice)");
            rt_free(src);
            rt_free(dst);
            rt_free(dst2);
        }
}

static void unary_params(int op, double *lo, double *hi, double *a, double *b) {
    *lo = -2; *hi = 2; *a = 0; *b = 0;
    switch (op) {
    case NA_UNARY_SCALE: *a = 1.7; break;
    case NA_UNARY_ADD_SCALAR: *a = 0.3; break;
    case NA_UNARY_LOG: case NA_UNARY_SQRT: case NA_UNARY_RSQRT: *lo = 0.2; *hi = 3; break;
    case NA_UNARY_POW: *a = 2.5; *lo = 0.2; break;
    case NA_UNARY_CLAMP: *a = -0.4; *b = 0.6; break;
    default: break;
    }
}

Test(cuda_kernels, unary_and_backward, .timeout = 300) {
    REQUIRE_CUDA();
    for (int op = 0; op < NA_UNARY_COUNT; op++)
        for (int d = 0; d < N_RAW_DTYPES; d++)
            for (int s = 0; s < N_SIZES; s++) {
                na_dtype dt = raw_dtypes[d];
                double lo, hi, a, b;
                unary_params(op, &lo, &hi, &a, &b);
                what("unary op %d %s [%" PRId64 "]", op, na_dtype_name(dt), sizes[s]);
                rt *x = RTR(dt, lo, hi, sizes[s]);
                rt *y = RT(dt, NULL, sizes[s]);
                BOTH(be->unary((na_unary_op)op, T(x), T(y), a, b));
                rt_cmp(y, tol_of(dt), "unary");
                /* backward from the CPU's y on both sides */
                rt_take_cpu(y);
                rt *gy = RTR(dt, -1, 1, sizes[s]);
                rt *gx = RT(dt, NULL, sizes[s]);
                BOTH(be->unary_backward((na_unary_op)op, T(x), T(y), T(gy), T(gx), a, b));
                rt_cmp(gx, tol_of(dt), "unary_backward");
                rt_free(x);
                rt_free(y);
                rt_free(gy);
                rt_free(gx);
            }
}

/* broadcast geometry of out = a (op) b for C-order shapes sa, sb padded to nd dims */
static na_broadcast make_bc(int nd, const int64_t *sa, const int64_t *sb, int64_t *out) {
    na_broadcast bc;
    memset(&bc, 0, sizeof bc);
    bc.ndim = nd;
    int64_t ra = 1, rb = 1;
    for (int d = nd - 1; d >= 0; d--) {
        out[d] = sa[d] > sb[d] ? sa[d] : sb[d];
        bc.shape[d] = out[d];
        bc.a_stride[d] = sa[d] == 1 ? 0 : ra;
        bc.b_stride[d] = sb[d] == 1 ? 0 : rb;
        ra *= sa[d];
        rb *= sb[d];
    }
    return bc;
}

Test(cuda_kernels, binary_broadcast) {
    REQUIRE_CUDA();
    static const int64_t geo[][2][3] = {
        {{1, 1, 4099}, {1, 1, 4099}}, {{1, 7, 33}, {1, 1, 33}}, {{3, 1, 33}, {1, 7, 1}},
        {{1, 1, 1}, {5, 1, 1000}},    {{1, 1, 1}, {1, 1, 1}},   {{2, 33, 1}, {2, 1, 65}},
    };
    for (int op = 0; op < NA_BINARY_COUNT; op++)
        for (int d = 0; d < N_RAW_DTYPES; d++)
            for (int g = 0; g < 6; g++) {
                na_dtype dt = raw_dtypes[d];
                int64_t out[3];
                na_broadcast bc = make_bc(3, geo[g][0], geo[g][1], out);
                what("binary op %d %s geometry %d", op, na_dtype_name(dt), g);
                rt *a = rt_rand(dt, -1, 1, 3, geo[g][0]);
                rt *b = rt_rand(dt, 0.5, 2, 3, geo[g][1]);
                rt *o = rt_new(dt, 3, out, NULL);
                BOTH(be->binary((na_binary_op)op, T(a), T(b), T(o), &bc));
                rt_cmp(o, tol_of(dt), "binary");
                rt_free(a);
                rt_free(b);
                rt_free(o);
            }
}

Test(cuda_kernels, reductions, .timeout = 300) {
    REQUIRE_CUDA();
    static const int64_t geo[][3] = {{1, 4099, 1}, {7, 33, 1}, {3, 1000, 7}, {1, 1, 1},
                                     {2, 70001, 1}, {5, 7, 33}, {1, 3, 4099}, {33, 1, 7}};
    for (int op = 0; op < NA_REDUCE_COUNT; op++)
        for (int d = 0; d < N_RAW_DTYPES; d++)
            for (int g = 0; g < 8; g++)
                for (int wide = 0; wide < 2; wide++) {
                    na_dtype dt = raw_dtypes[d], odt = wide ? NA_DTYPE_F32 : dt;
                    if (wide && dt == NA_DTYPE_F64) continue;
                    int64_t O = geo[g][0], R = geo[g][1], I = geo[g][2];
                    what("reduce op %d %s -> %s [%" PRId64 ",%" PRId64 ",%" PRId64 "]", op,
                         na_dtype_name(dt), na_dtype_name(odt), O, R, I);
                    bool mx = op == NA_REDUCE_MAX;
                    rt *x = RTR(dt, mx ? -1 : 0.5, 1.5, O, R, I);
                    rt *o = RT(odt, NULL, O, I);
                    rt *ix = mx ? RT(NA_DTYPE_I32, NULL, O, I) : NULL;
                    BOTH(be->reduce((na_reduce_op)op, T(x), T(o), ix ? T(ix) : NULL, O, R, I));
                    rt_cmp(o, mx ? 0 : tol_of(dt), "reduce");
                    if (ix) {
                        rt_cmp(ix, 0, "reduce max index");
                        rt *am = RT(NA_DTYPE_I32, NULL, O, I);
                        BOTH(be->argmax(T(x), T(am), O, R, I));
                        rt_cmp(am, 0, "argmax");
                        /* scatter of a gradient to the CPU's indices */
                        rt_take_cpu(ix);
                        rt *gy = RTR(odt, -1, 1, O, I);
                        rt *gx = RT(dt, NULL, O, R, I);
                        BOTH(be->scatter_max_grad(T(gy), T(ix), T(gx), O, R, I));
                        rt_cmp(gx, 0, "scatter_max_grad");
                        rt_free(am);
                        rt_free(gy);
                        rt_free(gx);
                    }
                    rt_free(x);
                    rt_free(o);
                    rt_free(ix);
                }
}

Test(cuda_kernels, softmax_and_backward) {
    REQUIRE_CUDA();
    static const int64_t geo[][2] = {{1, 1}, {7, 33}, {3, 1000}, {2, 4099}, {300, 10}, {5, 1}};
    for (int lg = 0; lg < 2; lg++)
        for (int d = 0; d < N_RAW_DTYPES; d++)
            for (int g = 0; g < 6; g++)
                for (int wide = 0; wide < 2; wide++) {
                    na_dtype dt = raw_dtypes[d], ydt = wide ? NA_DTYPE_F32 : dt;
                    int64_t R = geo[g][0], C = geo[g][1];
                    what("%s %s -> %s [%" PRId64 ",%" PRId64 "]", lg ? "log_softmax" : "softmax",
                         na_dtype_name(dt), na_dtype_name(ydt), R, C);
                    rt *x = RTR(dt, -5, 5, R, C);
                    rt *y = RT(ydt, NULL, R, C);
                    BOTH(be->softmax(T(x), T(y), R, C, lg));
                    rt_cmp(y, tol_of(dt), "softmax forward");
                    rt_take_cpu(y);
                    rt *gy = RTR(ydt, -1, 1, R, C);
                    rt *gx = RT(dt, NULL, R, C);
                    BOTH(be->softmax_backward(T(y), T(gy), T(gx), R, C, lg));
                    rt_cmp(gx, tol_of(dt), "softmax backward");
                    rt_free(x);
                    rt_free(y);
                    rt_free(gy);
                    rt_free(gx);
                }
}

Test(cuda_kernels, cross_entropy) {
    REQUIRE_CUDA();
    static const int64_t geo[][2] = {{1, 1}, {7, 33}, {33, 1000}, {3, 4099}, {257, 10}};
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int g = 0; g < 5; g++)
            for (int sm = 0; sm < 2; sm++) {
                na_dtype dt = raw_dtypes[d];
                int64_t N = geo[g][0], C = geo[g][1];
                double e = sm ? 0.1 : 0.0;
                what("cross_entropy %s [%" PRId64 ",%" PRId64 "] smoothing %g", na_dtype_name(dt), N, C, e);
                double *lab = malloc((size_t)N * sizeof *lab);
                for (int64_t i = 0; i < N; i++) lab[i] = (double)(splitmix(&g_rng) % (uint64_t)C);
                if (N > 2) { /* out-of-range labels: NaN rows on both devices */
                    lab[1] = (double)C;
                    lab[2] = -1;
                }
                rt *x = RTR(dt, -4, 4, N, C);
                rt *labels = RT(NA_DTYPE_I32, lab, N);
                rt *loss = RT(NA_DTYPE_F32, NULL, N);
                rt *lse = RT(NA_DTYPE_F32, NULL, N);
                BOTH(be->cross_entropy(T(x), T(labels), T(loss), T(lse), e));
                rt_cmp(loss, tol_of(dt), "loss");
                rt_cmp(lse, tol_of(dt), "lse");
                rt_take_cpu(lse);
                rt *gl = RTR(NA_DTYPE_F32, -1, 1, N);
                rt *gx = RT(dt, NULL, N, C);
                BOTH(be->cross_entropy_backward(T(x), T(labels), T(lse), T(gl), T(gx), e));
                rt_cmp(gx, tol_of(dt), "cross_entropy backward");
                rt_free(x);
                rt_free(labels);
                rt_free(loss);
                rt_free(lse);
                rt_free(gl);
                rt_free(gx);
                free(lab);
            }
}

typedef struct {
    int64_t m, n, k, batch;
    bool ta, tb, bias, relu;
    float alpha, beta;
    int pad; /* extra elements per row of each operand (lda > cols) */
} gemm_case;

static const gemm_case gemm_cases[] = {
    {1, 1, 1, 1, false, false, false, false, 1, 0, 0},
    {7, 5, 33, 1, false, false, false, false, 1, 0, 0},
    {7, 5, 33, 1, true, false, true, false, 1, 0, 0},
    {7, 5, 33, 1, false, true, true, true, 1, 0, 0},
    {65, 33, 129, 1, true, true, false, true, 1, 0, 3},
    {33, 1000, 7, 3, false, false, true, false, 1, 0, 0},
    {33, 17, 1000, 4, false, true, true, true, 0.5f, 0, 1},
    {64, 64, 64, 2, false, false, false, false, 2, 0.5f, 0},
    {17, 9, 0, 1, false, false, true, false, 1, 0, 0}, /* k = 0: C = bias */
    {128, 256, 512, 1, false, true, true, false, 1, 1, 0},
};
#define N_GEMM_CASES (int)(sizeof gemm_cases / sizeof gemm_cases[0])

/* row stride of a matrix with `cols` columns stored with `pad` extra elements (at least 1) */
static int64_t gemm_ld(int64_t cols, int pad) { return cols + pad > 0 ? cols + pad : 1; }

static na_gemm_args gemm_args(int side, const gemm_case *g, na_dtype dt, rt *a, rt *b, rt *c,
                              rt *bias) {
    na_gemm_args x;
    memset(&x, 0, sizeof x);
    x.dtype = dt;
    x.a = T(a)->data;
    x.b = T(b)->data;
    x.c = T(c)->data;
    x.bias = bias ? T(bias)->data : NULL;
    x.ta = g->ta;
    x.tb = g->tb;
    x.relu = g->relu;
    x.m = g->m;
    x.n = g->n;
    x.k = g->k;
    x.lda = gemm_ld(g->ta ? g->m : g->k, g->pad);
    x.ldb = gemm_ld(g->tb ? g->k : g->n, g->pad);
    x.ldc = gemm_ld(g->n, g->pad);
    x.batch = g->batch;
    x.stride_a = (g->ta ? g->k : g->m) * x.lda;
    x.stride_b = (g->tb ? g->n : g->k) * x.ldb;
    x.stride_c = g->m * x.ldc;
    x.alpha = g->alpha;
    x.beta = g->beta;
    return x;
}

Test(cuda_kernels, gemm, .timeout = 300) {
    REQUIRE_CUDA();
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int i = 0; i < N_GEMM_CASES; i++) {
            na_dtype dt = raw_dtypes[d];
            const gemm_case *g = &gemm_cases[i];
            what("gemm %s case %d (m%" PRId64 " n%" PRId64 " k%" PRId64 " b%" PRId64 " ta%d tb%d bias%d relu%d beta %g)",
                 na_dtype_name(dt), i, g->m, g->n, g->k, g->batch, g->ta, g->tb, g->bias,
                 g->relu, g->beta);
            int64_t lda = gemm_ld(g->ta ? g->m : g->k, g->pad);
            int64_t ldb = gemm_ld(g->tb ? g->k : g->n, g->pad);
            int64_t ldc = gemm_ld(g->n, g->pad);
            rt *a = RTR(dt, -1, 1, g->batch * (g->ta ? g->k : g->m) * lda + 1);
            rt *b = RTR(dt, -1, 1, g->batch * (g->tb ? g->n : g->k) * ldb + 1);
            /* C: poisoned when beta == 0 (must not be read); random otherwise */
            rt *c = g->beta != 0 ? RTR(dt, -1, 1, g->batch * g->m * ldc)
                                 : RT(dt, NULL, g->batch * g->m * ldc);
            rt *bias = g->bias ? RTR(dt, -1, 1, g->n) : NULL;
            for (int side = 0; side < 2; side++) {
                const na_backend *be = side ? gpu : cpu;
                na_gemm_args x = gemm_args(side, g, dt, a, b, c, bias);
                TRC(be->gemm(&x));
            }
            /* compare only the written part of C (the padding keeps its poison on both) */
            double *cg = rt_values(&c->g), *cc = rt_values(&c->c);
            int64_t n = g->batch * g->m * g->n, k = 0;
            double *pg = malloc((size_t)n * sizeof *pg), *pc = malloc((size_t)n * sizeof *pc);
            for (int64_t bb = 0; bb < g->batch; bb++)
                for (int64_t r = 0; r < g->m; r++)
                    for (int64_t j = 0; j < g->n; j++, k++) {
                        pg[k] = cg[(bb * g->m + r) * ldc + j];
                        pc[k] = cc[(bb * g->m + r) * ldc + j];
                    }
            expect_close(pg, pc, n, tf32_tol(dt, tol_of(dt)), "gemm");
            free(cg);
            free(cc);
            free(pg);
            free(pc);
            rt_free(a);
            rt_free(b);
            rt_free(c);
            rt_free(bias);
        }
}

static na_conv_geom geom_of(const conv_case *k) {
    na_conv_geom g;
    memset(&g, 0, sizeof g);
    g.n = k->n;
    g.c_in = k->cin;
    g.h = k->h;
    g.w = k->w;
    g.c_out = k->cout;
    g.kh = g.kw = k->k;
    g.sh = g.sw = k->stride;
    g.ph = g.pw = k->pad;
    g.dh = g.dw = k->dil;
    g.groups = k->groups;
    g.oh = (k->h + 2 * k->pad - k->dil * (k->k - 1) - 1) / k->stride + 1;
    g.ow = (k->w + 2 * k->pad - k->dil * (k->k - 1) - 1) / k->stride + 1;
    return g;
}

static void conv_kernels(bool im2col) {
    if (im2col) setenv("NANOAMP_CONV_IM2COL", "1", 1);
    else unsetenv("NANOAMP_CONV_IM2COL");
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int i = 0; i < N_CONV_CASES; i++) {
            na_dtype dt = raw_dtypes[d];
            const conv_case *k = &conv_cases[i];
            na_conv_geom g = geom_of(k);
            what("conv2d kernels %s case %d%s", na_dtype_name(dt), i, im2col ? " (im2col)" : "");
            rt *x = RTR(dt, -1, 1, g.n, g.c_in, g.h, g.w);
            rt *w = RTR(dt, -0.5, 0.5, g.c_out, g.c_in / g.groups, g.kh, g.kw);
            rt *bias = k->bias ? RTR(dt, -0.5, 0.5, g.c_out) : NULL;
            rt *y = RT(dt, NULL, g.n, g.c_out, g.oh, g.ow);
            BOTH(be->conv2d(&g, T(x), T(w), bias ? T(bias) : NULL, T(y)));
            rt_cmp(y, tol_of(dt), "conv2d forward");
            rt *gy = RTR(dt, -1, 1, g.n, g.c_out, g.oh, g.ow);
            rt *gx = RT(dt, NULL, g.n, g.c_in, g.h, g.w);
            BOTH(be->conv2d_backward_data(&g, T(gy), T(w), T(gx)));
            rt_cmp(gx, tol_of(dt), "conv2d backward data");
            rt *gw = RT(dt, NULL, g.c_out, g.c_in / g.groups, g.kh, g.kw);
            BOTH(be->conv2d_backward_weight(&g, T(x), T(gy), T(gw)));
            rt_cmp(gw, tol_of(dt), "conv2d backward weight");
            rt_free(x);
            rt_free(w);
            rt_free(bias);
            rt_free(y);
            rt_free(gy);
            rt_free(gx);
            rt_free(gw);
        }
    unsetenv("NANOAMP_CONV_IM2COL");
}

Test(cuda_kernels, conv2d, .timeout = 300) {
    REQUIRE_CUDA();
    conv_kernels(false);
}

Test(cuda_kernels, conv2d_im2col, .timeout = 300) {
    REQUIRE_CUDA();
    conv_kernels(true);
}

Test(cuda_kernels, pooling) {
    REQUIRE_CUDA();
    static const int geo[][4] = {{3, 2, 1, 1}, {2, 2, 0, 1}, {3, 1, 1, 1}, {5, 3, 2, 1}, {3, 1, 2, 2}};
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int i = 0; i < 5; i++)
            for (int inc = 0; inc < 2; inc++) {
                na_dtype dt = raw_dtypes[d];
                conv_case k = {2, 3, 11, 13, 3, geo[i][0], geo[i][1], geo[i][2], geo[i][3], 1, false};
                na_conv_geom g = geom_of(&k);
                g.count_include_pad = inc;
                what("pooling %s k%d s%d p%d d%d include_pad %d", na_dtype_name(dt), geo[i][0],
                     geo[i][1], geo[i][2], geo[i][3], inc);
                rt *x = RTR(dt, -1, 1, g.n, g.c_in, g.h, g.w);
                rt *y = RT(dt, NULL, g.n, g.c_in, g.oh, g.ow);
                rt *ix = RT(NA_DTYPE_I32, NULL, g.n, g.c_in, g.oh, g.ow);
                BOTH(be->max_pool2d(&g, T(x), T(y), T(ix)));
                rt_cmp(y, 0, "max_pool2d");
                rt_cmp(ix, 0, "max_pool2d index");
                rt *gy = RTR(dt, -1, 1, g.n, g.c_in, g.oh, g.ow);
                rt *gx = RT(dt, NULL, g.n, g.c_in, g.h, g.w);
                BOTH(be->max_pool2d_backward(&g, T(gy), T(ix), T(gx)));
                rt_cmp(gx, tol_of(dt), "max_pool2d backward");
                if (g.dh == 1) { /* average pooling has no dilation */
                    rt_poison(y);
                    rt_poison(gx);
                    BOTH(be->avg_pool2d(&g, T(x), T(y)));
                    rt_cmp(y, tol_of(dt), "avg_pool2d");
                    BOTH(be->avg_pool2d_backward(&g, T(gy), T(gx)));
                    rt_cmp(gx, tol_of(dt), "avg_pool2d backward");
                }
                rt_free(x);
                rt_free(y);
                rt_free(ix);
                rt_free(gy);
                rt_free(gx);
            }
}

Test(cuda_kernels, batch_norm) {
    REQUIRE_CUDA();
    static const int64_t geo[][3] = {{4, 3, 35}, {16, 5, 1}, {2, 33, 3}, {7, 1, 1}, {64, 8, 1025}};
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int i = 0; i < 5; i++)
            for (int mode = 0; mode < 4; mode++) {
                bool affine = mode & 1, relu = mode & 2; /* relu: BatchNorm + ReLU fused */
                na_dtype dt = raw_dtypes[d], pdt = dt == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
                int64_t N = geo[i][0], C = geo[i][1], S = geo[i][2];
                what("batch_norm %s [%" PRId64 ",%" PRId64 ",%" PRId64 "] affine %d relu %d",
                     na_dtype_name(dt), N, C, S, affine, relu);
                double ptol = dt == NA_DTYPE_F64 ? 1e-12 : 1e-5;
                rt *x = RTR(dt, -2, 3, N, C, S);
                rt *gamma = affine ? RTR(pdt, 0.5, 1.5, C) : NULL;
                rt *beta = affine ? RTR(pdt, -0.5, 0.5, C) : NULL;
                rt *rm = RTR(pdt, -0.5, 0.5, C), *rv = RTR(pdt, 0.5, 2, C);
                rt *y = RT(dt, NULL, N, C, S);
                rt *sm = RT(pdt, NULL, C), *si = RT(pdt, NULL, C);
                BOTH(be->batch_norm_train(T(x), gamma ? T(gamma) : NULL, beta ? T(beta) : NULL,
                                          T(rm), T(rv), T(y), T(sm), T(si), N, C, S, 0.1, 1e-5,
                                          relu));
                rt_cmp(y, tol_of(dt), "batch_norm_train y");
                rt_cmp(sm, ptol, "save_mean");
                rt_cmp(si, ptol, "save_invstd");
                rt_cmp(rm, ptol, "running_mean");
                rt_cmp(rv, ptol, "running_var");
                rt_poison(sm);
                rt_poison(si); /* the statistics only (y NULL), as SyncBatchNorm asks */
                BOTH(be->batch_norm_train(T(x), NULL, NULL, NULL, NULL, NULL, T(sm), T(si), N, C,
                                          S, 0.1, 1e-5, false));
                rt_cmp(sm, ptol, "save_mean without y");
                rt_cmp(si, ptol, "save_invstd without y");
                rt_poison(y);
                BOTH(be->batch_norm_eval(T(x), gamma ? T(gamma) : NULL, beta ? T(beta) : NULL,
                                         T(rm), T(rv), T(y), N, C, S, 1e-5, relu));
                rt_cmp(y, tol_of(dt), "batch_norm_eval y");
                /* backward from the CPU's saved statistics */
                rt_take_cpu(sm);
                rt_take_cpu(si);
                rt_take_cpu(y); /* the ReLU mask from the CPU's output too */
                for (int train = 0; train < 2; train++) {
                    rt *gy = RTR(dt, -1, 1, N, C, S);
                    rt *gx = RT(dt, NULL, N, C, S);
                    rt *gg = RT(pdt, NULL, C), *gb = RT(pdt, NULL, C);
                    BOTH(be->batch_norm_backward(T(x), T(gy), gamma ? T(gamma) : NULL, T(sm),
                                                 T(si), T(gx), T(gg), T(gb), N, C, S, train,
                                                 relu ? T(y) : NULL));
                    rt_cmp(gx, tol_of(dt), train ? "batch_norm_backward gx (train)" : "batch_norm_backward gx (eval)");
                    rt_cmp(gg, dt == NA_DTYPE_F64 ? 1e-12 : tol_of(dt), "ggamma");
                    rt_cmp(gb, dt == NA_DTYPE_F64 ? 1e-12 : tol_of(dt), "gbeta");
                    if (train) { /* SyncBatchNorm's gx: from given sums (the CPU's) over 2M */
                        rt_take_cpu(gg);
                        rt_take_cpu(gb);
                        rt_poison(gx);
                        BOTH(be->batch_norm_backward_elemt(T(x), T(gy), gamma ? T(gamma) : NULL,
                                                           T(sm), T(si), T(gb), T(gg), 2 * N * S,
                                                           T(gx), N, C, S, relu ? T(y) : NULL));
                        rt_cmp(gx, tol_of(dt), "batch_norm_backward_elemt gx");
                    }
                    rt_free(gy);
                    rt_free(gx);
                    rt_free(gg);
                    rt_free(gb);
                }
                rt_free(x);
                rt_free(gamma);
                rt_free(beta);
                rt_free(rm);
                rt_free(rv);
                rt_free(y);
                rt_free(sm);
                rt_free(si);
            }
}

/* ---- conv2d_stats and batch_norm_finalize: a training BatchNorm's statistics from sums -----
 * conv2d_stats may decline a problem (*done = false: cuDNN has no conv + GenStats engine for
 * it); such a row is logged as "not served" and checks nothing more. */

/* Both sides of a 4-d rt take the channels-last strides of its shape (x, y: [C*H*W, 1, W*C, C];
 * a filter: KRSC). Its bytes stay as they are: random inputs stay random, outputs are
 * compared in memory order. */
static void rt_channels_last(rt *t) {
    na_conv_layout_strides(NA_CONV_NHWC, t->c.shape, t->c.stride);
    na_conv_layout_strides(NA_CONV_NHWC, t->g.shape, t->g.stride);
}

/* Per output channel k of the CPU's y (a 4-d view of either layout): scale[k] = the sum of |y|
 * (sq: of y^2), the size a channel's sum (sum of squares) is compared against. */
static double *channel_scale(const rt *y, bool sq) {
    const na_view *v = &y->c;
    double *vals = rt_values(v), *scale = calloc((size_t)v->shape[1], sizeof *scale);
    cr_assert_not_null(scale);
    for (int64_t n = 0; n < v->shape[0]; n++)
        for (int64_t k = 0; k < v->shape[1]; k++)
            for (int64_t h = 0; h < v->shape[2]; h++)
                for (int64_t w = 0; w < v->shape[3]; w++) {
                    double e = vals[n * v->stride[0] + k * v->stride[1] + h * v->stride[2] +
                                    w * v->stride[3]];
                    scale[k] += sq ? e * e : fabs(e);
                }
    free(vals);
    return scale;
}

/* |device - cpu| <= tol * scale[k] for each channel k of a per-channel sum */
static void expect_sums_close(const rt *t, const double *scale, double tol, const char *label) {
    double *a = rt_values(&t->g), *b = rt_values(&t->c);
    for (int64_t k = 0; k < t->c.numel; k++)
        cr_assert(fabs(a[k] - b[k]) <= tol * scale[k] + 1e-30, CTX "%s: channel %" PRId64
                  ": %.9g on the device, %.9g on the CPU (allowed %.3g: %.3g of %.6g)", CTXA,
                  label, k, a[k], b[k], tol * scale[k], tol, scale[k]);
    free(a);
    free(b);
}

/* the last row: ResNet-9's 64 -> 128 3x3 pad 1 convolution (at 16x16, batch 4) */
static const conv_case stats_cases[] = {
    {2, 3, 9, 11, 4, 3, 1, 1, 1, 1, false},
    {3, 8, 5, 5, 16, 1, 1, 0, 1, 1, false},
    {2, 16, 12, 12, 32, 3, 2, 1, 1, 1, false},
    {2, 8, 7, 7, 8, 3, 1, 1, 1, 2, false},
    {4, 64, 16, 16, 128, 3, 1, 1, 1, 1, false},
};
#define N_STATS_CASES (int)(sizeof stats_cases / sizeof stats_cases[0])

Test(cuda_kernels, conv2d_stats, .timeout = 300) {
    REQUIRE_CUDA();
    int served = 0, not_served = 0;
    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int d = 0; d < N_FLOAT_DTYPES; d++)
            for (int i = 0; i < N_STATS_CASES; i++) {
                na_dtype dt = float_dtypes[d];
                const conv_case *k = &stats_cases[i];
                na_conv_geom g = geom_of(k);
                what("conv2d_stats %s case %d (%" PRId64 " -> %" PRId64 ", k%d s%d p%d g%d)%s",
                     na_dtype_name(dt), i, g.c_in, g.c_out, k->k, k->stride, k->pad, k->groups,
                     nhwc ? " channels-last" : "");
                rt *x = RTR(dt, -1, 1, g.n, g.c_in, g.h, g.w);
                rt *w = RTR(dt, -0.5, 0.5, g.c_out, g.c_in / g.groups, g.kh, g.kw);
                rt *y = RT(dt, NULL, g.n, g.c_out, g.oh, g.ow);
                rt *sum = RT(NA_DTYPE_F32, NULL, g.c_out), *sq = RT(NA_DTYPE_F32, NULL, g.c_out);
                if (nhwc) {
                    rt_channels_last(x);
                    rt_channels_last(w);
                    rt_channels_last(y);
                }
                bool done[2] = {false, false};
                BOTH(be->conv2d_stats(&g, T(x), T(w), NULL, T(y), T(sum), T(sq), &done[side]));
                cr_assert(done[0], CTX "the CPU always computes conv2d_stats", CTXA);
                if (done[1]) {
                    served++;
                    rt_cmp(y, tol_of(dt), "conv2d_stats y");
                    double *s1 = channel_scale(y, false), *s2 = channel_scale(y, true);
                    double tol = tf32_tol(dt, tol_of(dt));
                    expect_sums_close(sum, s1, tol, "conv2d_stats sum (of sum |y|)");
                    expect_sums_close(sq, s2, tol, "conv2d_stats sqsum (of sum y^2)");
                    free(s1);
                    free(s2);
                } else {
                    not_served++;
                    cr_log_info(CTX "not served", CTXA);
                }
                rt_free(x);
                rt_free(w);
                rt_free(y);
                rt_free(sum);
                rt_free(sq);
            }
    cr_log_info("conv2d_stats: %d rows served, %d not served (conv2d and BatchNorm apart)", served,
                not_served);
}

/* batch_norm_finalize from sums of `count` values with known means and variances, with and
 * without running statistics; count 1 takes the running variance's m == 1 branch. 2^21
 * channels are more threads than na_grid's cap (32 blocks of 256 per multiprocessor: 1.08 M
 * on an H200), so the kernel's grid-stride loop must reach the last ones (once: f32, running). */
Test(cuda_kernels, batch_norm_finalize) {
    REQUIRE_CUDA();
    static const int64_t cs[] = {1, 7, 33, 1000, (int64_t)1 << 21}, counts[] = {1, 2048};
    static const na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F64};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 2; j++)
                for (int running = 0; running < 2; running++) {
                    if (i == 4 && (d || !j || !running)) continue;
                    na_dtype dt = dts[d];
                    int64_t c = cs[i], m = counts[j];
                    what("batch_norm_finalize %s c %" PRId64 " count %" PRId64 " running %d",
                         na_dtype_name(dt), c, m, running);
                    double *mean = rand_vals(c, -1, 1), *var = rand_vals(c, 0.1, 2);
                    double *sv = malloc((size_t)c * sizeof *sv);
                    double *qv = malloc((size_t)c * sizeof *qv);
                    cr_assert(sv && qv);
                    for (int64_t k = 0; k < c; k++) {
                        sv[k] = (double)m * mean[k];
                        qv[k] = (double)m * (var[k] + mean[k] * mean[k]);
                    }
                    rt *sum = RT(dt, sv, c), *sq = RT(dt, qv, c);
                    rt *rm = RTR(dt, -0.5, 0.5, c), *rv = RTR(dt, 0.5, 2, c);
                    rt *smean = RT(dt, NULL, c), *svar = RT(dt, NULL, c), *sinv = RT(dt, NULL, c);
                    BOTH(be->batch_norm_finalize(T(sum), T(sq), m, running ? T(rm) : NULL,
                                                 running ? T(rv) : NULL, T(smean), T(svar),
                                                 T(sinv), c, 0.1, 1e-5));
                    double ptol = dt == NA_DTYPE_F64 ? 1e-12 : 1e-5;
                    rt_cmp(smean, ptol, "save_mean");
                    rt_cmp(svar, ptol, "save_var");
                    rt_cmp(sinv, ptol, "save_invstd");
                    rt_cmp(rm, ptol, "running_mean");
                    rt_cmp(rv, ptol, "running_var");
                    free(mean);
                    free(var);
                    free(sv);
                    free(qv);
                    rt_free(sum);
                    rt_free(sq);
                    rt_free(rm);
                    rt_free(rv);
                    rt_free(smean);
                    rt_free(svar);
                    rt_free(sinv);
                }
}

/* ---- the switchable CUDA paths, called directly (kernels/cuda/cuda_internal.h) ----------
 * Each runs whatever the switch says; with the CPU standing in (NANOAMP_PARITY_ON_CPU=1) the
 * device side is the CPU's composition, which checks the harness. */

/* BatchNorm v2 (NANOAMP_CUDA_BN=v2) or, on the CPU, its batch_norm_* kernels (relu fused as
 * the kernel list's relu / relu_y); which: 0 train, 1 eval, 2 backward (a->train: of training
 * or eval). */
static int bn2_call(const na_backend *be, int which, const na_cuda_bn_args *a) {
    if (be != cpu) {
#if NA_HAVE_CUDA
        return which == 0 ? na_cuda_bn2_train(a) : which == 1 ? na_cuda_bn2_eval(a) : na_cuda_bn2_backward(a);
#else
        return NA_EDEVICE;
#endif
    }
    if (which == 0)
        return be->batch_norm_train(a->x, a->gamma, a->beta, a->running_mean, a->running_var,
                                    a->y, a->save_mean, a->save_invstd, a->n, a->c, a->s,
                                    a->momentum, a->eps, a->relu);
    if (which == 1)
        return be->batch_norm_eval(a->x, a->gamma, a->beta, a->running_mean, a->running_var,
                                   a->y, a->n, a->c, a->s, a->eps, a->relu);
    return be->batch_norm_backward(a->x, a->gy, a->gamma, a->mean, a->invstd, a->gx, a->ggamma,
                                   a->gbeta, a->n, a->c, a->s, a->train, a->relu ? a->y : NULL);
}

/* [n, c, s] over buffer v from element `at` (1: misaligned, which refuses 16-byte loads) */
static na_view view3(const na_view *v, int64_t n, int64_t c, int64_t s, int64_t at) {
    na_view o = *v;
    o.data = (char *)v->data + at * (int64_t)na_dtype_size(v->dtype);
    o.ndim = 3;
    o.shape[0] = n, o.shape[1] = c, o.shape[2] = s;
    o.stride[2] = 1, o.stride[1] = s, o.stride[0] = c * s;
    o.numel = n * c * s;
    return o;
}

static void bn2_case(na_dtype dt, int64_t N, int64_t C, int64_t S, bool affine, bool relu,
                     bool shifted) {
    na_dtype pdt = dt == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    double ptol = dt == NA_DTYPE_F64 ? 1e-12 : 1e-5;
    int64_t numel = N * C * S, sh = shifted ? 1 : 0;
    what("batch_norm v2 %s [%" PRId64 ",%" PRId64 ",%" PRId64 "] affine %d relu %d shifted %d",
         na_dtype_name(dt), N, C, S, affine, relu, shifted);
    /* a common offset makes the mean large against the spread (Welford's case) */
    double off = urand(-50, 50);
    rt *x = RTR(dt, off - 2, off + 3, numel + sh), *y = RT(dt, NULL, numel + sh);
    rt *gy = RTR(dt, -1, 1, numel + sh), *gx = RT(dt, NULL, numel + sh);
    rt *gamma = affine ? RTR(pdt, 0.5, 1.5, C) : NULL, *beta = affine ? RTR(pdt, -0.5, 0.5, C) : NULL;
    rt *rm = RTR(pdt, -0.5, 0.5, C), *rv = RTR(pdt, 0.5, 2, C);
    rt *sm = RT(pdt, NULL, C), *si = RT(pdt, NULL, C), *gg = RT(pdt, NULL, C), *gb = RT(pdt, NULL, C);
    for (int step = 0; step < 4; step++) { /* train, eval, backward train, backward eval */
        int which = step < 2 ? step : 2;
        for (int side = 0; side < 2; side++) {
            const na_backend *be = side ? gpu : cpu;
            na_view xv = view3(T(x), N, C, S, sh), yv = view3(T(y), N, C, S, sh);
            na_view gyv = view3(T(gy), N, C, S, sh), gxv = view3(T(gx), N, C, S, sh);
            na_cuda_bn_args a = {.x = &xv, .gamma = gamma ? T(gamma) : NULL,
                                 .beta = beta ? T(beta) : NULL, .y = &yv, .running_mean = T(rm),
                                 .running_var = T(rv), .save_mean = T(sm), .save_invstd = T(si),
                                 .gy = &gyv, .mean = T(sm), .invstd = T(si), .gx = &gxv,
                                 .ggamma = T(gg), .gbeta = T(gb), .n = N, .c = C, .s = S,
                                 .momentum = 0.1, .eps = 1e-5, .train = step == 0 || step == 2,
                                 .relu = relu};
            int rc = bn2_call(be, which, &a);
            cr_assert_eq(rc, NA_OK, CTX "%s side, step %d: %s", CTXA, be->name, step, na_last_error());
        }
        if (step == 0) {
            rt_cmp(y, tol_of(dt), "bn2 train y");
            rt_cmp(sm, ptol, "bn2 save_mean");
            rt_cmp(si, ptol, "bn2 save_invstd");
            rt_cmp(rm, ptol, "bn2 running_mean");
            rt_cmp(rv, ptol, "bn2 running_var");
            /* backward from the CPU's saved statistics and output */
            rt_take_cpu(sm);
            rt_take_cpu(si);
            rt_take_cpu(y);
        } else if (step == 1) {
            rt_cmp(y, tol_of(dt), "bn2 eval y");
            rt_take_cpu(y); /* one y on both sides: the relu mask */
        } else {
            rt_cmp(gx, tol_of(dt), step == 2 ? "bn2 backward gx (train)" : "bn2 backward gx (eval)");
            rt_cmp(gg, dt == NA_DTYPE_F64 ? 1e-12 : tol_of(dt), "bn2 ggamma");
            rt_cmp(gb, dt == NA_DTYPE_F64 ? 1e-12 : tol_of(dt), "bn2 gbeta");
        }
    }
    rt *all[] = {x, y, gy, gx, gamma, beta, rm, rv, sm, si, gg, gb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rt_free(all[i]);
}

Test(cuda_kernels, batch_norm_v2, .timeout = 300) {
    REQUIRE_CUDA();
    /* tiles: one, a few, many (f32 tiles are 4096 elements, f16 8192); S % 4 and % 8 decide
     * 16-byte loads; the shifted views force the scalar path */
    static const int64_t geo[][3] = {{4, 3, 35}, {7, 1, 1}, {2, 33, 3}, {64, 8, 1025},
                                     {32, 4, 1024}, {512, 2, 256}, {3, 2, 16}, {5, 3, 8}};
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int i = 0; i < 8; i++)
            for (int v = 0; v < 4; v++)
                bn2_case(raw_dtypes[d], geo[i][0], geo[i][1], geo[i][2], v & 1, v & 2, false);
    for (int d = 0; d < N_RAW_DTYPES; d++)
        bn2_case(raw_dtypes[d], 8, 3, 64, true, true, true);
}

/* The 2x2 pool (NANOAMP_CUDA_POOL2=1) against the CPU's: exact values, indices and
 * gradients, on inputs full of ties and NaNs. */
Test(cuda_kernels, max_pool_2x2) {
    REQUIRE_CUDA();
    static const int64_t hw[][2] = {{8, 8}, {11, 13}, {12, 16}, {7, 4}, {2, 2}, {16, 6}};
    static const double pick[] = {-1, 0, 1, 2, NAN, 2, -1};
    for (int d = 0; d < N_RAW_DTYPES; d++)
        for (int i = 0; i < 6; i++) {
            na_dtype dt = raw_dtypes[d];
            conv_case k = {3, 5, hw[i][0], hw[i][1], 5, 2, 2, 0, 1, 1, false};
            na_conv_geom g = geom_of(&k);
            g.w = hw[i][1];
            g.ow = (g.w - 2) / 2 + 1;
            what("max_pool 2x2 %s [%" PRId64 "x%" PRId64 "]", na_dtype_name(dt), g.h, g.w);
            int64_t n = g.n * g.c_in * g.h * g.w;
            double *v = malloc((size_t)n * sizeof *v);
            for (int64_t j = 0; j < n; j++) v[j] = pick[splitmix(&g_rng) % 7];
            rt *x = RT(dt, v, g.n, g.c_in, g.h, g.w);
            free(v);
            rt *y = RT(dt, NULL, g.n, g.c_in, g.oh, g.ow);
            rt *ix = RT(NA_DTYPE_I32, NULL, g.n, g.c_in, g.oh, g.ow);
            rt *gy = RTR(dt, -1, 1, g.n, g.c_in, g.oh, g.ow);
            rt *gx = RT(dt, NULL, g.n, g.c_in, g.h, g.w);
            for (int side = 0; side < 2; side++) {
                const na_backend *be = side ? gpu : cpu;
                int rc;
#if NA_HAVE_CUDA
                if (be != cpu) {
                    rc = na_cuda_max_pool2x2(&g, T(x), T(y), T(ix));
                    if (rc == NA_OK) rc = na_cuda_max_pool2x2_backward(&g, T(gy), T(ix), T(gx));
                } else
#endif
                {
                    rc = be->max_pool2d(&g, T(x), T(y), T(ix));
                    if (rc == NA_OK) rc = be->max_pool2d_backward(&g, T(gy), T(ix), T(gx));
                }
                cr_assert_eq(rc, NA_OK, CTX "%s: %s", CTXA, be->name, na_last_error());
            }
            rt_cmp(y, 0, "max_pool 2x2");
            rt_cmp(ix, 0, "max_pool 2x2 index");
            rt_cmp(gx, 0, "max_pool 2x2 backward");
            rt_free(x);
            rt_free(y);
            rt_free(ix);
            rt_free(gy);
            rt_free(gx);
        }
}

/* The conversion instructions the newer kernels use give common/half.h's bits for every
 * non-NaN input (all 2^32 f32, all 2^16 f16 and bf16); see na_hw in cuda_common.cuh. */
Test(cuda_kernels, hardware_half_conversions_match_half_h) {
    REQUIRE_CUDA();
    if (g_dev2 != NA_DEVICE_CUDA) return; /* a device-only claim */
#if NA_HAVE_CUDA
    uint64_t bad[4] = {1, 1, 1, 1};
    TRC(na_cuda_check_half_intrinsics(bad));
    cr_assert(bad[0] == 0 && bad[1] == 0 && bad[2] == 0 && bad[3] == 0,
              "mismatches: f32->f16 %" PRIu64 ", f32->bf16 %" PRIu64 ", f16->f32 %" PRIu64
              ", bf16->f32 %" PRIu64, bad[0], bad[1], bad[2], bad[3]);
#endif
}

Test(cuda_kernels, device_queries) {
    REQUIRE_CUDA();
    if (g_dev2 != NA_DEVICE_CUDA) return;
    int major = 0, minor = 0;
    TRC(na_cuda_capability(&major, &minor));
    cr_assert(major >= 3, "capability %d.%d", major, minor);
    cr_assert(strlen(na_cuda_device_name()) > 0);
    uint64_t before = na_cuda_sync_count();
    TRC(na_cuda_synchronize());
    cr_assert_eq(na_cuda_sync_count(), before + 1, "a synchronize counts one round trip");
    uint64_t in_use = na_cuda_bytes_in_use();
    void *p = gpu->alloc(1 << 20);
    cr_assert_not_null(p, "%s", na_last_error());
    cr_assert_eq(na_cuda_bytes_in_use(), in_use + (1 << 20));
    cr_assert(na_cuda_peak_bytes() >= na_cuda_bytes_in_use());
    gpu->free(p);
    cr_assert_eq(na_cuda_bytes_in_use(), in_use);
    char host[16] = "0123456789abcde";
    void *d = gpu->alloc(16);
    cr_assert_not_null(d);
    TRC(gpu->memcpy_h2d(d, host, 16));
    void *d2 = gpu->alloc(16);
    TRC(gpu->memcpy_d2d(d2, d, 16));
    char back[16] = {0};
    before = na_cuda_sync_count();
    TRC(gpu->memcpy_d2h(back, d2, 16));
    cr_assert_eq(na_cuda_sync_count(), before + 1, "a device-to-host copy counts one round trip");
    cr_assert(memcmp(host, back, 16) == 0);
    gpu->free(d);
    gpu->free(d2);
}

/* ---- optimizer steps, global norm, loss scaling ---------------------------------------------- */

static rt *rt_scalar(na_dtype dt, double v) {
    return rt_new(dt, 0, NULL, (const double[]){v});
}

#define N_OPT_PARAMS 4
static const int64_t opt_sizes[N_OPT_PARAMS] = {1, 1000, 2145, 20000};

/* One optimizer configuration on both backends: parameters of mixed dtypes, f16 grads, f32
 * state, f16 copies, steps starting at 0 or 3, with and without inv_scale / found_inf. */
static void optim_case(bool adam, const na_optim_hparams *h, bool scaled, double found) {
    rt *p[N_OPT_PARAMS], *g[N_OPT_PARAMS], *st[N_OPT_PARAMS], *m[N_OPT_PARAMS],
        *v[N_OPT_PARAMS], *vm[N_OPT_PARAMS], *cp[N_OPT_PARAMS];
    for (int i = 0; i < N_OPT_PARAMS; i++) {
        int64_t n = opt_sizes[i];
        na_dtype pdt = i % 2 ? NA_DTYPE_F32 : NA_DTYPE_BF16;
        p[i] = rt_rand(pdt, -1, 1, 1, &n);
        g[i] = rt_rand(NA_DTYPE_F16, -1, 1, 1, &n);
        st[i] = rt_scalar(NA_DTYPE_F32, i % 2 ? 3 : 0);
        m[i] = rt_rand(NA_DTYPE_F32, -0.1, 0.1, 1, &n);
        v[i] = rt_rand(NA_DTYPE_F32, 0, 0.01, 1, &n);
        vm[i] = rt_rand(NA_DTYPE_F32, 0, 0.01, 1, &n);
        cp[i] = rt_new(NA_DTYPE_F16, 1, &n, NULL);
    }
    rt *fi = rt_scalar(NA_DTYPE_F32, found), *is = rt_scalar(NA_DTYPE_F32, 0.25);
    for (int side = 0; side < 2; side++) {
        const na_backend *be = side ? gpu : cpu;
        na_view *P[N_OPT_PARAMS], *G[N_OPT_PARAMS], *S[N_OPT_PARAMS], *M[N_OPT_PARAMS],
            *V[N_OPT_PARAMS], *VM[N_OPT_PARAMS], *C[N_OPT_PARAMS];
        for (int i = 0; i < N_OPT_PARAMS; i++) {
            P[i] = T(p[i]); G[i] = T(g[i]); S[i] = T(st[i]); M[i] = T(m[i]);
            V[i] = T(v[i]); VM[i] = T(vm[i]); C[i] = T(cp[i]);
        }
        na_optim_tensors t = {
            .n = N_OPT_PARAMS, .params = P, .grads = (const na_view *const *)G, .steps = S,
            .exp_avg = (adam || h->momentum != 0) ? M : NULL, .exp_avg_sq = adam ? V : NULL,
            .max_exp_avg_sq = (adam && h->amsgrad) ? VM : NULL, .copies = C,
            .found_inf = T(fi), .inv_scale = scaled ? T(is) : NULL};
        cr_assert_not_null(be->sgd_step, CTX "%s has no sgd_step", CTXA, be->name);
        cr_assert_not_null(be->adam_step, CTX "%s has no adam_step", CTXA, be->name);
        TRC(adam ? be->adam_step(&t, h) : be->sgd_step(&t, h));
    }
    for (int i = 0; i < N_OPT_PARAMS; i++) {
        char l[64];
        snprintf(l, sizeof l, "param %d", i);
        rt_cmp(p[i], p[i]->c.dtype == NA_DTYPE_F32 ? 1e-5 : 1e-2, l);
        rt_cmp(st[i], 0, "step count");
        rt_cmp(m[i], 1e-5, "exp_avg / momentum buffer");
        rt_cmp(v[i], 1e-5, "exp_avg_sq");
        rt_cmp(vm[i], 1e-5, "max_exp_avg_sq");
        if (found == 0) rt_cmp(cp[i], 1e-2, "f16 copy");
        rt_free(p[i]); rt_free(g[i]); rt_free(st[i]); rt_free(m[i]);
        rt_free(v[i]); rt_free(vm[i]); rt_free(cp[i]);
    }
    rt_free(fi);
    rt_free(is);
}

Test(cuda_kernels, optimizer_steps) {
    REQUIRE_CUDA();
    const na_optim_hparams sgd[] = {
        {.lr = 0.1},
        {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2},
        {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .nesterov = true, .weight_decay = 1e-4},
    };
    const na_optim_hparams adam[] = {
        {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8},
        {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2,
         .decoupled_weight_decay = true},
        {.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 1e-3,
         .amsgrad = true},
    };
    for (int k = 0; k < 3; k++)
        for (int scaled = 0; scaled < 2; scaled++)
            for (int found = 0; found < 2; found++) {
                what("sgd config %d scaled %d found_inf %d", k, scaled, found);
                optim_case(false, &sgd[k], scaled, found);
                what("adam config %d scaled %d found_inf %d", k, scaled, found);
                optim_case(true, &adam[k], scaled, found);
            }
}

Test(cuda_kernels, l2norm_and_amp) {
    REQUIRE_CUDA();
    cr_assert(gpu->l2norm && gpu->amp_unscale && gpu->amp_update_scale,
              "the device backend lacks l2norm / amp kernels");
    /* global norm over tensors of several dtypes and sizes (one over 30 tensors: 2 launches) */
    enum { NT = 30 };
    rt *xs[NT];
    for (int i = 0; i < NT; i++) {
        int64_t n = i == 0 ? 70001 : (i * 37) % 1001 + 1;
        xs[i] = rt_rand(raw_dtypes[i % 3], -1, 1, 1, &n);
    }
    for (int k = 1; k <= NT; k += NT - 1) {
        what("l2norm over %d tensors", k);
        rt *norm = rt_scalar(NA_DTYPE_F32, NAN), *coef = rt_scalar(NA_DTYPE_F32, NAN);
        for (int side = 0; side < 2; side++) {
            const na_backend *be = side ? gpu : cpu;
            const na_view *X[NT];
            for (int i = 0; i < k; i++) X[i] = T(xs[i]);
            TRC(be->l2norm(k, X, T(norm), T(coef), 1.0));
        }
        rt_cmp(norm, 1e-5, "norm");
        rt_cmp(coef, 1e-5, "clip coefficient");
        rt_free(norm);
        rt_free(coef);
    }
    /* unscale: f16/bf16/f32 in, f32 out, in place for one; an inf in one tensor */
    for (int inf = 0; inf < 2; inf++) {
        what("amp_unscale, inf %d", inf);
        rt *out[NT];
        for (int i = 0; i < NT; i++) out[i] = rt_new(NA_DTYPE_F32, 1, xs[i]->c.shape, NULL);
        if (inf) {
            double *vals = rt_values(&xs[7]->c);
            vals[3] = INFINITY;
            rt_upload(xs[7], vals);
            free(vals);
        }
        rt *scale = rt_scalar(NA_DTYPE_F32, 1024), *fi = rt_scalar(NA_DTYPE_F32, 0);
        for (int side = 0; side < 2; side++) {
            const na_backend *be = side ? gpu : cpu;
            const na_view *I[NT];
            na_view *O[NT];
            for (int i = 0; i < NT; i++) {
                I[i] = T(xs[i]);
                O[i] = T(out[i]);
            }
            TRC(be->amp_unscale(NT, I, O, T(scale), T(fi)));
        }
        for (int i = 0; i < NT; i++) {
            rt_cmp(out[i], 0, "unscaled gradient");
            rt_free(out[i]);
        }
        rt_cmp(fi, 0, "found_inf");
        rt_free(scale);
        rt_free(fi);
    }
    for (int i = 0; i < NT; i++) rt_free(xs[i]);
    /* scaler updates: every kind, clean and overflowing steps, a growth interval of 3 */
    for (int kind = 0; kind < 4; kind++)
        for (int found = 0; found < 2; found++) {
            what("amp_update_scale kind %d found %d", kind, found);
            double hp[6] = {2.0, 0.5, 3, 1.0, 1e6, 0};
            rt *scale = rt_scalar(NA_DTYPE_F32, 65536);
            rt *ctr = rt_new(NA_DTYPE_I32, 1, (const int64_t[]){4}, (const double[]){2, -1, 5, 1});
            rt *f0 = rt_scalar(NA_DTYPE_F32, 0), *f1 = rt_scalar(NA_DTYPE_F32, found);
            for (int rep = 0; rep < 4; rep++)
                for (int side = 0; side < 2; side++) {
                    const na_backend *be = side ? gpu : cpu;
                    const na_view *F[2] = {T(f0), T(f1)};
                    TRC(be->amp_update_scale(kind, hp, T(scale), T(ctr), 2, F));
                }
            rt_cmp(scale, 0, "scale");
            rt_cmp(ctr, 0, "counters");
            rt_free(scale);
            rt_free(ctr);
            rt_free(f0);
            rt_free(f1);
        }
}

/* ---- FP8 (na_cast, na_scaled_mm): the device against the CPU ------------------------------- */

/* x on g_dev2, cast to dt there, back on the CPU */
static na_tensor *fp8_cast_on_device(na_tensor *x, na_dtype dt) {
    na_tensor *d = na_to_device(x, g_dev2);
    na_tensor *c = d ? na_cast(d, dt) : NULL;
    na_tensor *h = c ? na_to_device(c, NA_DEVICE_CPU) : NULL;
    cr_assert(h, "fp8 cast on the device: %s", na_last_error());
    return h;
}

/* Casts to and from both FP8 formats, bit for bit: 2^20 f32 patterns (a stride through all
 * 2^32, specials included), f64 and bf16 sources, every byte decoded to f32 / bf16 / f16. */
Test(cuda_fp8, cast_bit_identical) {
    REQUIRE_CUDA();
    const int64_t n = (int64_t)1 << 20;
    uint32_t *bits = malloc((size_t)n * 4);
    cr_assert(bits);
    for (int64_t i = 0; i < n; i++) bits[i] = (uint32_t)(i * 4093u + (uint32_t)(i >> 10));
    const uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x43E00000u, 0x43E80000u,
                                 0x47700000u, 0x47800000u, 0x3A800000u, 0x37800000u, 0};
    memcpy(bits, specials, sizeof specials);
    uint8_t all[256];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
    const na_dtype fmts[2] = {NA_DTYPE_F8E4M3, NA_DTYPE_F8E5M2};
    const na_dtype srcs[3] = {NA_DTYPE_F32, NA_DTYPE_F64, NA_DTYPE_BF16};
    for (int f = 0; f < 2; f++) {
        na_tensor *x = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n), bits); /* a step tensor */
        for (int s = 0; s < 3; s++) {
            na_tensor *xs = na_cast(x, srcs[s]);
            na_tensor *c = na_cast(xs, fmts[f]), *d = fp8_cast_on_device(xs, fmts[f]);
            cr_assert(c && d, "%s", na_last_error());
            int64_t i = 0;
            while (i < n && ((uint8_t *)c->data)[i] == ((uint8_t *)d->data)[i]) i++;
            cr_expect(i == n, "%s -> %s differs on the device: element %" PRId64 " (f32 0x%08x) "
                      "0x%02x, cpu 0x%02x", na_dtype_name(srcs[s]), na_dtype_name(fmts[f]), i,
                      bits[i < n ? i : 0], i < n ? ((uint8_t *)d->data)[i] : 0,
                      i < n ? ((uint8_t *)c->data)[i] : 0);
        }
        na_tensor *b = na_from_host(fmts[f], NA_DEVICE_CPU, NA_SHAPE(256), all);
        const na_dtype outs[4] = {NA_DTYPE_F32, NA_DTYPE_BF16, NA_DTYPE_F16, NA_DTYPE_F64};
        for (int o = 0; o < 4; o++) {
            na_tensor *c = na_cast(b, outs[o]), *d = fp8_cast_on_device(b, outs[o]);
            cr_assert(c && d, "%s", na_last_error());
            cr_expect(memcmp(c->data, d->data, 256 * na_dtype_size(outs[o])) == 0,
                      "%s -> %s differs on the device", na_dtype_name(fmts[f]),
                      na_dtype_name(outs[o]));
        }
        na_step_end();
    }
    free(bits);
}

/* na_scaled_mm on the device (the widening path, and cuBLASLt's FP8 GEMM with
 * NANOAMP_CUDA_FP8_GEMM=1) against the CPU, to f32 rounding: |diff| <= k 2^-24 sum|a b| |sa sb|
 * (+ 1 bf16 ulp for a bf16 output), over the MNIST MLP's layer shapes. */
Test(cuda_fp8, scaled_mm_parity, .timeout = 300) {
    REQUIRE_CUDA();
    const struct { int64_t m, k, n; na_dtype fa, fb, out; bool bias; } cases[] = {
        {64, 784, 256, NA_DTYPE_F8E4M3, NA_DTYPE_F8E4M3, NA_DTYPE_F32, false},
        {64, 784, 256, NA_DTYPE_F8E4M3, NA_DTYPE_F8E4M3, NA_DTYPE_BF16, true},
        {64, 256, 16, NA_DTYPE_F8E5M2, NA_DTYPE_F8E4M3, NA_DTYPE_BF16, true},
        {64, 256, 10, NA_DTYPE_F8E4M3, NA_DTYPE_F8E5M2, NA_DTYPE_F32, true},
    };
    for (int lt = 0; lt < 2; lt++) {
        setenv("NANOAMP_CUDA_FP8_GEMM", lt ? "1" : "0", 1);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int64_t m = cases[c].m, k = cases[c].k, n = cases[c].n;
            na_tensor *a = na_cast(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(m, k), 0, 30),
                                   cases[c].fa);
            na_tensor *w = na_cast(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n, k), 0, 30),
                                   cases[c].fb);
            na_tensor *sa = na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 0.0371);
            na_tensor *sb = na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 0.5);
            na_tensor *bias = cases[c].bias
                                  ? na_cast(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n), 0, 1),
                                            cases[c].out)
                                  : NULL;
            cr_assert(a && w && sa && sb, "%s", na_last_error());
            na_tensor *yc = na_scaled_mm(a, na_transpose(w, 0, 1), sa, sb, bias, cases[c].out);
            na_tensor *wd = na_to_device(w, g_dev2);
            na_tensor *yd = na_scaled_mm(na_to_device(a, g_dev2), wd ? na_transpose(wd, 0, 1) : NULL,
                                         na_to_device(sa, g_dev2), na_to_device(sb, g_dev2),
                                         bias ? na_to_device(bias, g_dev2) : NULL, cases[c].out);
            cr_assert(yc && yd, "scaled_mm case %zu (lt %d): %s", c, lt, na_last_error());
            const float *pc = na_cast(yc, NA_DTYPE_F32)->data;
            const float *pd = na_cast(na_to_device(yd, NA_DEVICE_CPU), NA_DTYPE_F32)->data;
            na_tensor *af = na_cast(a, NA_DTYPE_F32), *wf = na_cast(w, NA_DTYPE_F32);
            const float *ap = af->data, *wp = wf->data;
            int bad = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double mag = 0;
                    for (int64_t q = 0; q < k; q++) mag += fabs((double)ap[i * k + q] * wp[j * k + q]);
                    double tol = ldexp((double)k * mag * 0.0371 * 0.5, -24) +
                                 (cases[c].out == NA_DTYPE_BF16 ? ldexp(fabs(pc[i * n + j]), -8) : 0);
                    if (fabs((double)pc[i * n + j] - pd[i * n + j]) > tol && bad++ < 5)
                        cr_log_error("scaled_mm case %zu lt %d [%" PRId64 ",%" PRId64 "]: cpu %.9g "
                                     "device %.9g", c, lt, i, j, pc[i * n + j], pd[i * n + j]);
                }
            cr_expect_eq(bad, 0, "scaled_mm case %zu (NANOAMP_CUDA_FP8_GEMM=%d) differs", c, lt);
            na_step_end();
        }
    }
    unsetenv("NANOAMP_CUDA_FP8_GEMM");
}
