/* tests/test_channels_last.c — channels-last activations (nanoamp/tensor.h, "memory formats")
 * end to end: a small residual network (conv, BatchNorm+ReLU, max pooling, conv, BatchNorm,
 * ReLU, residual add, average pooling) fed a channels-last input keeps every activation
 * channels-last and computes the loss and every gradient of the same network fed the
 * contiguous input; autocast keeps the layout; copies write channels-last and strided
 * destinations; and the channel padding of f16/bf16 first layers (NANOAMP_CONV_PAD_CHANNELS)
 * pads input and weight with zeros and changes nothing else. Per-op forward, gradient and
 * parity checks of the channels-last paths are in the op suites (op_cases.c rows). */
#include <stdlib.h>

#include "helpers.h"
#include "src/autograd/graph.h" /* to see the padded convolution's inputs */

#define N_PARAMS 8

typedef struct {
    na_tensor *p[N_PARAMS]; /* conv1 w, b, bn1 gamma, beta, conv2 w, b, bn2 gamma, beta */
} net;

static na_tensor *param(int ndim, const int64_t *shape, uint64_t seed, double mean) {
    na_manual_seed(seed);
    na_tensor *t = TH_OK(na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape));
    TH_RC(na_copy_(t, TH_OK(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, mean, 0.3))));
    TH_RC(na_tensor_set_requires_grad(t, true));
    return t;
}

static net net_new(void) {
    net m;
    m.p[0] = param(NA_SHAPE(8, 3, 3, 3), 1, 0);
    m.p[1] = param(NA_SHAPE(8), 2, 0);
    m.p[2] = param(NA_SHAPE(8), 3, 1);
    m.p[3] = param(NA_SHAPE(8), 4, 0);
    m.p[4] = param(NA_SHAPE(8, 8, 3, 3), 5, 0);
    m.p[5] = param(NA_SHAPE(8), 6, 0);
    m.p[6] = param(NA_SHAPE(8), 7, 1);
    m.p[7] = param(NA_SHAPE(8), 8, 0);
    return m;
}

static void net_free(net *m) {
    for (int i = 0; i < N_PARAMS; i++) na_tensor_free(m->p[i]);
}

static void expect_format(const na_tensor *t, na_memory_format f, const char *what) {
    cr_assert_not_null(t, "%s: NULL (%s)", what, na_last_error());
    cr_assert_eq(na_memory_format_of(t), f, "%s: memory format %d, expected %d", what,
                 (int)na_memory_format_of(t), (int)f);
}

/* The loss of the network on x; with `f` given, checks that every activation has format f. */
static na_tensor *forward(net *m, na_tensor *x, na_memory_format f) {
    na_conv2d_opts pad1 = {.padding = {1, 1}};
    na_tensor *h = TH_OK(na_conv2d(x, m->p[0], m->p[1], &pad1));
    expect_format(h, f, "conv1");
    h = TH_OK(na_batch_norm_relu(h, NULL, NULL, m->p[2], m->p[3], true, 0.1, 1e-5));
    expect_format(h, f, "bn1+relu");
    h = TH_OK(na_max_pool2d(h, &(na_pool2d_opts){.kernel = {2, 2}}));
    expect_format(h, f, "max pool");
    na_tensor *r = TH_OK(na_conv2d(h, m->p[4], m->p[5], &pad1));
    r = TH_OK(na_batch_norm(r, NULL, NULL, m->p[6], m->p[7], true, 0.1, 1e-5));
    expect_format(r, f, "bn2");
    r = TH_OK(na_relu(r));
    expect_format(r, f, "relu");
    h = TH_OK(na_add(h, r)); /* the residual: two channels-last operands */
    expect_format(h, f, "residual add");
    h = TH_OK(na_avg_pool2d(h, &(na_pool2d_opts){.kernel = {2, 2}}));
    expect_format(h, f, "avg pool");
    return TH_OK(na_mean(TH_OK(na_mul(h, h))));
}

static double *host_values(const na_tensor *t) {
    double *v = malloc(sizeof(double) * (size_t)t->numel);
    for (int64_t i = 0; i < t->numel; i++) v[i] = na_get(t, i);
    return v;
}

/* ||got - want|| <= rtol * ||want|| + atol * sqrt(n): atol for gradients that are zero but
 * for rounding (a bias followed by BatchNorm) */
static void expect_close(const na_tensor *got, const double *want, double rtol, double atol,
                         const char *what) {
    double err = 0, ref = 0;
    for (int64_t i = 0; i < got->numel; i++) {
        double d = na_get(got, i) - want[i];
        err += d * d, ref += want[i] * want[i];
    }
    double bound = rtol * sqrt(ref) + atol * sqrt((double)got->numel);
    cr_assert(sqrt(err) <= bound, "%s: error norm %.3g > %.3g (reference norm %.3g)", what,
              sqrt(err), bound, sqrt(ref));
}

Test(channels_last, network_stays_channels_last_with_the_same_loss_and_gradients) {
    net m = net_new();
    na_manual_seed(42);
    na_tensor *x0 = TH_OK(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3, 8, 8), 0, 1));
    TH_RC(na_tensor_set_requires_grad(x0, true));
    /* contiguous: the reference */
    na_tensor *loss = forward(&m, x0, NA_FORMAT_CONTIGUOUS);
    TH_RC(na_backward(loss, NULL));
    double want_loss = na_item(loss);
    double *want[N_PARAMS + 1];
    for (int i = 0; i < N_PARAMS; i++) want[i] = host_values(m.p[i]->grad);
    want[N_PARAMS] = host_values(x0->grad);
    for (int i = 0; i < N_PARAMS; i++) TH_RC(na_fill_(m.p[i]->grad, 0));
    na_step_end();

    na_manual_seed(42); /* the same input */
    na_tensor *x = TH_OK(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3, 8, 8), 0, 1));
    TH_RC(na_tensor_set_requires_grad(x, true));
    na_tensor *xcl = TH_OK(na_to_channels_last(x));
    loss = forward(&m, xcl, NA_FORMAT_CHANNELS_LAST);
    TH_RC(na_backward(loss, NULL));
    /* BatchNorm sums its channels in another order over [N*H*W, C] rows: not bit for bit */
    cr_assert(fabs(na_item(loss) - want_loss) <= 1e-5 * fabs(want_loss), "loss %.9g vs %.9g",
              na_item(loss), want_loss);
    static const char *names[N_PARAMS + 1] = {"conv1 w", "conv1 b", "bn1 gamma", "bn1 beta",
                                              "conv2 w", "conv2 b", "bn2 gamma", "bn2 beta",
                                              "input"};
    for (int i = 0; i <= N_PARAMS; i++) {
        na_tensor *g = i < N_PARAMS ? m.p[i]->grad : x->grad;
        expect_format(g, NA_FORMAT_CONTIGUOUS, names[i]); /* .grad has its leaf's format */
        expect_close(g, want[i], 1e-4, 1e-6, names[i]);
        free(want[i]);
    }
    net_free(&m);
}

Test(channels_last, autocast_keeps_the_layout) {
    net m = net_new();
    na_tensor *x = TH_OK(na_to_channels_last(
        TH_OK(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3, 8, 8), 0, 1))));
    TH_RC(na_autocast_begin(NA_DTYPE_BF16));
    na_tensor *loss = forward(&m, x, NA_FORMAT_CHANNELS_LAST);
    TH_RC(na_autocast_end());
    TH_RC(na_backward(loss, NULL));
    cr_assert(isfinite(na_item(loss)));
    for (int i = 0; i < N_PARAMS; i++) expect_format(m.p[i]->grad, NA_FORMAT_CONTIGUOUS, "grad");
    net_free(&m);
}

Test(channels_last, copies_write_channels_last_and_strided_destinations) {
    na_tensor *x = TH_OK(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 0, 24, 1));
    x = TH_OK(na_reshape(x, NA_SHAPE(1, 2, 3, 4)));
    na_tensor *cl = TH_OK(na_empty_format(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(1, 2, 3, 4),
                                          NA_FORMAT_CHANNELS_LAST));
    TH_RC(na_copy_(cl, x)); /* converting, into channels-last memory */
    for (int64_t i = 0; i < 24; i++) cr_assert_eq(na_get(cl, i), (double)i, "element %d", (int)i);
    const uint16_t *mem = cl->data; /* pixel (0, 1) holds channel 0's 1 and channel 1's 13 */
    cr_assert_eq(mem[2], 0x3c00, "1.0 in f16");
    cr_assert_eq(mem[3], 0x4a80, "13.0 in f16");
    TH_EXPECT_ERROR(na_empty_format(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3),
                                    NA_FORMAT_CHANNELS_LAST), NA_ESHAPE, "4 dims");
    /* mixed layouts: the result is contiguous, the values right */
    na_tensor *sum = TH_OK(na_add(TH_OK(na_to_channels_last(x)), x));
    expect_format(sum, NA_FORMAT_CONTIGUOUS, "channels-last + contiguous");
    for (int64_t i = 0; i < 24; i++) cr_assert_eq(na_get(sum, i), 2.0 * (double)i);
}

/* [1, 3, 5, 5] f16 channels-last through a 3x3 convolution of 4 filters */
static na_tensor *first_layer(na_tensor **w_out, na_tensor **x_out, bool channels_last) {
    na_manual_seed(7);
    na_tensor *x = TH_OK(na_randn(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(1, 3, 5, 5), 0, 1));
    na_tensor *w = TH_OK(na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(4, 3, 3, 3)));
    TH_RC(na_copy_(w, TH_OK(na_randn(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(4, 3, 3, 3), 0, 0.5))));
    TH_RC(na_tensor_set_requires_grad(w, true));
    TH_RC(na_tensor_set_requires_grad(x, true));
    *w_out = w, *x_out = x;
    na_tensor *in = channels_last ? TH_OK(na_to_channels_last(x)) : x;
    return TH_OK(na_conv2d(in, w, NULL, &(na_conv2d_opts){.padding = {1, 1}}));
}

Test(channels_last, f16_first_layer_channels_are_padded_to_8) {
    setenv("NANOAMP_CONV_PAD_CHANNELS", "all", 1); /* the CUDA rule, here on the CPU */
    na_tensor *w, *x, *w2, *x2;
    na_tensor *ref = first_layer(&w, &x, false); /* contiguous: never padded */
    cr_assert_eq(ref->grad_fn->inputs[0]->shape[1], 3, "a contiguous input is not padded");
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_cast(ref, NA_DTYPE_F32)))), NULL));
    na_tensor *y = first_layer(&w2, &x2, true);
    const na_node *conv = y->grad_fn;
    cr_assert_eq(conv->inputs[0]->shape[1], 8, "the input went in with 8 channels");
    cr_assert_eq(conv->inputs[1]->shape[1], 8, "the weight went in with 8 channels");
    expect_format(y, NA_FORMAT_CHANNELS_LAST, "padded conv");
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_cast(y, NA_DTYPE_F32)))), NULL));
    double *want = host_values(ref);
    expect_close(y, want, 1e-3, 0, "padded output");
    free(want);
    cr_assert_eq(w2->grad->shape[1], 3, "the weight's gradient has the weight's shape");
    want = host_values(w->grad);
    expect_close(w2->grad, want, 1e-3, 0, "weight gradient");
    free(want);
    want = host_values(x->grad);
    expect_close(x2->grad, want, 1e-3, 0, "input gradient");
    free(want);
    na_tensor_free(w);
    na_tensor_free(w2);
}

Test(channels_last, f32_and_cpu_default_are_not_padded) {
    unsetenv("NANOAMP_CONV_PAD_CHANNELS"); /* the default: CUDA only */
    na_tensor *w, *x;
    na_tensor *y = first_layer(&w, &x, true);
    cr_assert_eq(y->grad_fn->inputs[0]->shape[1], 3, "no padding on the CPU by default");
    na_tensor_free(w);
}
