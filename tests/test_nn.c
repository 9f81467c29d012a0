/* Modules: every layer's forward against hand-computed values, backward by gradcheck in f64,
 * BatchNorm's running statistics, names, counts, initialization, device/dtype conversion. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/autocast.h"
#include "nanoamp/autograd.h"
#include "nanoamp/error.h"
#include "nanoamp/nn.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static void set_values(na_tensor *t, const float *v) {
    cr_assert_eq(t->dtype, NA_DTYPE_F32);
    cr_assert_eq(na_copy_from_host(t, v), NA_OK, "%s", na_last_error());
}

static void expect_values(const na_tensor *t, const double *want, int64_t n, double tol) {
    cr_assert_not_null(t, "%s", na_last_error());
    cr_assert_eq(t->numel, n, "numel %lld, expected %lld", (long long)t->numel, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        double got = na_get(t, i);
        cr_assert(fabs(got - want[i]) <= tol * (1.0 + fabs(want[i])),
                  "element %lld: got %.9g, expected %.9g", (long long)i, got, want[i]);
    }
}

static na_tensor *input(int ndim, const int64_t *shape, const float *v) {
    na_tensor *x = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, v);
    cr_assert_not_null(x, "%s", na_last_error());
    return x;
}

static void teardown(void) { na_step_end(); }
TestSuite(nn, .fini = teardown);

/* ---- Linear / Conv2d ------------------------------------------------------------------------ */

Test(nn, linear_forward_by_hand) {
    na_module *m = na_linear_new(3, 2, true);
    cr_assert_not_null(m, "%s", na_last_error());
    set_values(na_module_get(m, "weight"), (float[]){1, 2, 3, 4, 5, 6});
    set_values(na_module_get(m, "bias"), (float[]){0.5f, -0.5f});
    na_tensor *y = na_module_forward(m, input(NA_SHAPE(2, 3), (float[]){1, 0, -1, 2, 1, 0}));
    /* [1,0,-1]·[1,2,3]+.5 = -1.5, ·[4,5,6]-.5 = -2.5; [2,1,0]: 4+.5, 13-.5 */
    expect_values(y, (double[]){-1.5, -2.5, 4.5, 12.5}, 4, 1e-6);
    cr_assert_eq(y->shape[0], 2);
    cr_assert_eq(y->shape[1], 2);
    na_module *nb = na_linear_new(3, 2, false);
    cr_assert_null(na_module_get(nb, "bias"));
    cr_assert_eq(na_module_num_params(nb), 6);
    na_module_free(m);
    na_module_free(nb);
}

Test(nn, conv2d_forward_by_hand) {
    na_module *m = na_conv2d_new(1, 1, 2, 2, NULL, true);
    cr_assert_not_null(m, "%s", na_last_error());
    set_values(na_module_get(m, "weight"), (float[]){1, 1, 1, 1});
    set_values(na_module_get(m, "bias"), (float[]){0.5f});
    float v[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    na_tensor *y = na_module_forward(m, input(NA_SHAPE(1, 1, 3, 3), v));
    /* 2x2 window sums of [[0,1,2],[3,4,5],[6,7,8]], plus 0.5 */
    expect_values(y, (double[]){8.5, 12.5, 20.5, 24.5}, 4, 1e-6);
    na_module_free(m);
}

/* Direct convolution in double: the reference for the option combinations. */
static void conv_ref(const float *x, const float *w, const float *b, double *y, int n, int ci,
                     int h, int wd, int co, int kh, int kw, const na_conv2d_opts *o, int oh, int ow) {
    int g = o->groups ? o->groups : 1, cig = ci / g, cog = co / g;
    int sh = o->stride[0] ? o->stride[0] : 1, sw = o->stride[1] ? o->stride[1] : 1;
    int dh = o->dilation[0] ? o->dilation[0] : 1, dw = o->dilation[1] ? o->dilation[1] : 1;
    for (int in = 0; in < n; in++)
        for (int oc = 0; oc < co; oc++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double s = b ? b[oc] : 0;
                    int grp = oc / cog;
                    for (int c = 0; c < cig; c++)
                        for (int ky = 0; ky < kh; ky++)
                            for (int kx = 0; kx < kw; kx++) {
                                int iy = oy * sh - o->padding[0] + ky * dh;
                                int ix = ox * sw - o->padding[1] + kx * dw;
                                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                                s += (double)x[((in * ci + grp * cig + c) * h + iy) * wd + ix] *
                                     w[((oc * cig + c) * kh + ky) * kw + kx];
                            }
                    y[((in * co + oc) * oh + oy) * ow + ox] = s;
                }
}

Test(nn, conv2d_options_match_direct_convolution) {
    const na_conv2d_opts cases[] = {
        {.padding = {1, 1}},
        {.stride = {2, 1}, .padding = {1, 0}},
        {.dilation = {2, 2}, .padding = {2, 1}},
        {.groups = 2, .padding = {1, 1}, .stride = {2, 2}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        na_manual_seed(7 + k);
        const na_conv2d_opts *o = &cases[k];
        int n = 2, ci = 4, h = 5, wd = 6, co = 6, kh = 3, kw = 2;
        na_module *m = na_conv2d_new(ci, co, kh, kw, o, true);
        cr_assert_not_null(m, "%s", na_last_error());
        na_tensor *x = na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n, ci, h, wd), -1, 1);
        na_tensor *y = na_module_forward(m, x);
        cr_assert_not_null(y, "case %zu: %s", k, na_last_error());
        int oh = (int)y->shape[2], ow = (int)y->shape[3];
        double ref[2 * 6 * 8 * 8];
        cr_assert_leq(y->numel, 2 * 6 * 8 * 8);
        conv_ref(x->data, na_module_get(m, "weight")->data, na_module_get(m, "bias")->data, ref,
                 n, ci, h, wd, co, kh, kw, o, oh, ow);
        expect_values(y, ref, y->numel, 1e-5);
        na_module_free(m);
        na_step_end();
    }
}

Test(nn, conv2d_rejects_bad_channels) {
    cr_assert_null(na_conv2d_new(3, 4, 3, 3, &(na_conv2d_opts){.groups = 2}, true));
    cr_assert(strstr(na_last_error(), "multiples of groups"), "%s", na_last_error());
    cr_assert_null(na_linear_new(0, 3, true));
}

/* ---- parameter-free layers -------------------------------------------------------------------- */

Test(nn, activations_by_hand) {
    float v[4] = {-2, -0.5f, 0, 1.5f};
    struct {
        na_module *m;
        double (*f)(double);
    } cases[4];
    cases[0].m = na_relu_new(), cases[1].m = na_gelu_new();
    cases[2].m = na_sigmoid_new(), cases[3].m = na_tanh_new();
    for (int k = 0; k < 4; k++) {
        na_tensor *y = na_module_forward(cases[k].m, input(NA_SHAPE(4), v));
        double want[4];
        for (int i = 0; i < 4; i++) {
            double x = v[i];
            want[i] = k == 0   ? (x > 0 ? x : 0)
                      : k == 1 ? 0.5 * x * (1 + erf(x / sqrt(2.0)))
                      : k == 2 ? 1 / (1 + exp(-x))
                               : tanh(x);
        }
        expect_values(y, want, 4, 1e-6);
        na_module_free(cases[k].m);
    }
}

Test(nn, pooling_by_hand) {
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)i;
    na_module *mp = na_max_pool2d_new(&(na_pool2d_opts){.kernel = {2, 2}});
    na_module *ap = na_avg_pool2d_new(&(na_pool2d_opts){.kernel = {2, 2}, .count_include_pad = true});
    na_module *gap = na_global_avg_pool2d_new(), *gmp = na_global_max_pool2d_new();
    na_tensor *x = input(NA_SHAPE(1, 1, 4, 4), v);
    expect_values(na_module_forward(mp, x), (double[]){5, 7, 13, 15}, 4, 0);
    expect_values(na_module_forward(ap, x), (double[]){2.5, 4.5, 10.5, 12.5}, 4, 1e-7);
    na_tensor *g = na_module_forward(gap, x);
    expect_values(g, (double[]){7.5}, 1, 1e-7);
    cr_assert_eq(g->ndim, 2);
    expect_values(na_module_forward(gmp, x), (double[]){15}, 1, 0);
    cr_assert_null(na_max_pool2d_new(&(na_pool2d_opts){.kernel = {0, 2}}));
    cr_assert_null(na_max_pool2d_new(NULL));
    na_module_free(mp), na_module_free(ap), na_module_free(gap), na_module_free(gmp);
}

Test(nn, dropout_flatten_scale) {
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    na_tensor *x = input(NA_SHAPE(2, 2, 2), v);
    na_module *d = na_dropout_new(0.5);
    na_tensor *y = na_module_forward(d, x);
    for (int i = 0; i < 8; i++) { /* dropped, or kept and scaled by 1/(1-p) */
        double e = na_get(y, i);
        cr_assert(e == 0 || e == 2 * v[i], "element %d: %g", i, e);
    }
    na_module_eval(d);
    cr_assert_eq(na_module_forward(d, x), x, "eval-mode dropout is the identity");
    cr_assert_null(na_dropout_new(1.5));

    na_module *f = na_flatten_new(1);
    na_tensor *fl = na_module_forward(f, x);
    cr_assert_eq(fl->ndim, 2);
    cr_assert_eq(fl->shape[1], 4);
    na_module *s = na_scale_new(0.125);
    double want[8];
    for (int i = 0; i < 8; i++) want[i] = 0.125 * v[i];
    expect_values(na_module_forward(s, x), want, 8, 0);
    na_module_free(d), na_module_free(f), na_module_free(s);
}

Test(nn, sequential_and_residual) {
    na_module *lin = na_linear_new(2, 2, false);
    set_values(na_module_get(lin, "weight"), (float[]){1, -1, 2, 0});
    na_module *res = na_residual_new(NA_SEQUENTIAL(lin, na_relu_new()));
    na_module *net = NA_SEQUENTIAL(res, na_scale_new(2.0));
    cr_assert_not_null(net, "%s", na_last_error());
    na_tensor *y = na_module_forward(net, input(NA_SHAPE(1, 2), (float[]){1, 3}));
    /* lin: [1-3, 2] = [-2, 2]; relu: [0, 2]; + x: [1, 5]; * 2 */
    expect_values(y, (double[]){2, 10}, 2, 0);
    cr_assert_not_null(na_module_get(net, "0.body.0.weight"));
    cr_assert_eq(na_module_kind_of(na_module_child_at(net, 0, NULL)), NA_MODULE_RESIDUAL);
    cr_assert_str_eq(na_module_type_name(net), "Sequential");
    na_module_free(net);
}

Test(nn, sequential_takes_ownership_of_failed_lists) {
    na_module *net = NA_SEQUENTIAL(na_relu_new(), na_linear_new(-1, 2, true), na_relu_new());
    cr_assert_null(net);
    cr_assert(strstr(na_last_error(), "na_linear_new"), "%s", na_last_error());
}

Test(nn, errors_name_the_failing_child) {
    na_module *net = NA_SEQUENTIAL(na_linear_new(4, 3, true), na_relu_new(), na_linear_new(5, 2, true));
    na_tensor *y = na_module_forward(net, na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 4)));
    cr_assert_null(y);
    cr_assert(strstr(na_last_error(), "2 (Linear): "), "%s", na_last_error());
    cr_assert_null(na_module_forward(net, NULL)); /* a failed input passes through */
    na_module_free(net);
}

/* ---- BatchNorm ----------------------------------------------------------------------------------- */

/* x [2, 2, 1, 2]: channel 0 holds 1, 2, 3, 4 (mean 2.5, biased var 1.25, unbiased 5/3);
 * channel 1 holds 0, 0, 2, 2 (mean 1, biased var 1, unbiased 4/3). */
static const float bn_x[8] = {1, 2, 0, 0, 3, 4, 2, 2};
static const double bn_mean[2] = {2.5, 1}, bn_var[2] = {1.25, 1}, bn_uvar[2] = {5.0 / 3, 4.0 / 3};

static void bn_expect(const na_tensor *y, const double *mean, const double *var, const double *w,
                      const double *b) {
    double want[8];
    for (int i = 0; i < 8; i++) {
        int c = (i / 2) % 2;
        want[i] = (bn_x[i] - mean[c]) / sqrt(var[c] + 1e-5) * w[c] + b[c];
    }
    expect_values(y, want, 8, 1e-5);
}

Test(nn, batch_norm2d_train_updates_running_stats_and_eval_uses_them) {
    na_module *bn = na_batch_norm2d_new(2, NULL);
    cr_assert_not_null(bn, "%s", na_last_error());
    expect_values(na_module_get(bn, "running_var"), (double[]){1, 1}, 2, 0);
    expect_values(na_module_get(bn, "weight"), (double[]){1, 1}, 2, 0);
    set_values(na_module_get(bn, "weight"), (float[]){2, 0.5f});
    set_values(na_module_get(bn, "bias"), (float[]){1, -1});
    na_tensor *x = input(NA_SHAPE(2, 2, 1, 2), bn_x);
    bn_expect(na_module_forward(bn, x), bn_mean, bn_var, (double[]){2, 0.5}, (double[]){1, -1});
    double rm[2], rv[2];
    for (int c = 0; c < 2; c++) rm[c] = 0.1 * bn_mean[c], rv[c] = 0.9 + 0.1 * bn_uvar[c];
    expect_values(na_module_get(bn, "running_mean"), rm, 2, 1e-6);
    expect_values(na_module_get(bn, "running_var"), rv, 2, 1e-6);
    na_tensor *nbt = na_module_get(bn, "num_batches_tracked");
    cr_assert_eq(nbt->dtype, NA_DTYPE_I32);
    cr_assert_eq(na_item(nbt), 1);

    na_module_eval(bn);
    bn_expect(na_module_forward(bn, x), rm, rv, (double[]){2, 0.5}, (double[]){1, -1});
    expect_values(na_module_get(bn, "running_mean"), rm, 2, 1e-6); /* eval changes nothing */
    cr_assert_eq(na_item(nbt), 1);
    na_module_free(bn);
}

Test(nn, batch_norm_cumulative_average) {
    na_batch_norm_cfg cfg = NA_BATCH_NORM_DEFAULTS;
    cfg.cumulative_average = true; /* PyTorch momentum=None */
    na_module *bn = na_batch_norm2d_new(2, &cfg);
    float x2[8];
    for (int i = 0; i < 8; i++) x2[i] = (i / 2) % 2 == 0 ? bn_x[i] + 1 : 2 * bn_x[i];
    /* second batch: channel 0 mean 3.5 (unbiased var 5/3), channel 1 mean 2 (var 16/3) */
    cr_assert_not_null(na_module_forward(bn, input(NA_SHAPE(2, 2, 1, 2), bn_x)));
    expect_values(na_module_get(bn, "running_mean"), bn_mean, 2, 1e-6); /* factor 1/1 */
    expect_values(na_module_get(bn, "running_var"), bn_uvar, 2, 1e-6);
    cr_assert_not_null(na_module_forward(bn, input(NA_SHAPE(2, 2, 1, 2), x2)));
    expect_values(na_module_get(bn, "running_mean"), (double[]){(2.5 + 3.5) / 2, (1 + 2) / 2.0}, 2, 1e-6);
    expect_values(na_module_get(bn, "running_var"),
                  (double[]){(5.0 / 3 + 5.0 / 3) / 2, (4.0 / 3 + 16.0 / 3) / 2}, 2, 1e-6);
    cr_assert_eq(na_item(na_module_get(bn, "num_batches_tracked")), 2);
    na_module_free(bn);
}

/* Counted by kernels (what a replayed CUDA graph needs), BatchNorm gives the same outputs and
 * statistics and the same count as counted on the host; a cumulative average is refused. */
Test(nn, batch_norm_counts_batches_on_device) {
    na_module *host = NA_SEQUENTIAL(na_batch_norm2d_new(2, NULL));
    na_module *dev = NA_SEQUENTIAL(na_batch_norm2d_new(2, NULL));
    cr_assert_eq(na_module_count_batches_on_device(dev), 1, "%s", na_last_error());
    for (int k = 1; k <= 3; k++) {
        na_tensor *x = input(NA_SHAPE(2, 2, 1, 2), bn_x);
        na_tensor *yh = na_module_forward(host, x), *yd = na_module_forward(dev, x);
        cr_assert(yh && yd, "%s", na_last_error());
        cr_assert(!memcmp(yh->data, yd->data, 8 * sizeof(float)), "batch %d: outputs", k);
        cr_assert_eq(na_item(na_module_get(dev, "0.num_batches_tracked")), k);
        na_step_end();
    }
    cr_assert_eq(na_item(na_module_get(host, "0.num_batches_tracked")), 3);
    cr_assert(!memcmp(na_module_get(host, "0.running_var")->data,
                      na_module_get(dev, "0.running_var")->data, 2 * sizeof(float)));
    na_tensor *nbt = na_module_get(dev, "0.num_batches_tracked");
    *(int32_t *)nbt->data = INT32_MAX; /* saturates as the host count does */
    na_tensor *x = input(NA_SHAPE(2, 2, 1, 2), bn_x);
    cr_assert_not_null(na_module_forward(dev, x));
    cr_assert_eq(na_item(nbt), INT32_MAX);

    na_batch_norm_cfg cfg = NA_BATCH_NORM_DEFAULTS;
    cfg.cumulative_average = true;
    na_module *cum = NA_SEQUENTIAL(na_batch_norm2d_new(2, NULL), na_batch_norm2d_new(2, &cfg));
    cr_assert_eq(na_module_count_batches_on_device(cum), NA_ENOTSUP);
    cr_assert(strstr(na_last_error(), "cumulative_average"), "%s", na_last_error());
    cr_assert_not_null(na_module_forward(cum, x)); /* nothing changed: counted on the host */
    cr_assert_eq(na_item(na_module_get(cum, "0.num_batches_tracked")), 1);
    cr_assert_eq(na_module_count_batches_on_device(NULL), NA_EINVAL);
    na_module_free(host), na_module_free(dev), na_module_free(cum);
}

Test(nn, batch_norm_without_running_stats_uses_batch_stats_in_eval) {
    na_batch_norm_cfg cfg = NA_BATCH_NORM_DEFAULTS;
    cfg.track_running_stats = false;
    cfg.affine = false;
    na_module *bn = na_batch_norm2d_new(2, &cfg);
    na_named_tensors l = {0};
    cr_assert_eq(na_module_named_tensors(bn, NA_MODULE_STATE, "", &l), NA_OK);
    cr_assert_eq(l.n, 0, "no parameters and no buffers");
    na_named_tensors_free(&l);
    na_module_eval(bn);
    bn_expect(na_module_forward(bn, input(NA_SHAPE(2, 2, 1, 2), bn_x)), bn_mean, bn_var,
              (double[]){1, 1}, (double[]){0, 0});
    na_module_free(bn);
}

Test(nn, batch_norm_errors) {
    na_module *bn1 = na_batch_norm1d_new(3, NULL);
    cr_assert_null(na_module_forward(bn1, na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 3))));
    cr_assert(strstr(na_last_error(), "more than 1 value per channel"), "%s", na_last_error());
    cr_assert_eq(na_item(na_module_get(bn1, "num_batches_tracked")), 0);
    expect_values(na_module_get(bn1, "running_var"), (double[]){1, 1, 1}, 3, 0);
    cr_assert_null(na_module_forward(bn1, na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 2))));
    cr_assert(strstr(na_last_error(), "3 channels"), "%s", na_last_error());
    na_module *bn2 = na_batch_norm2d_new(3, NULL);
    cr_assert_null(na_module_forward(bn2, na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3))));
    cr_assert(strstr(na_last_error(), "[N, C, H, W]"), "%s", na_last_error());
    /* the op wants both running statistics or neither */
    na_tensor *rm = na_module_get(bn2, "running_mean");
    cr_assert_null(na_batch_norm(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3)), rm, NULL,
                                 NULL, NULL, true, 0.1, 1e-5));
    cr_assert(strstr(na_last_error(), "both running_mean and running_var"), "%s", na_last_error());
    na_batch_norm_cfg bad = {.momentum = 0.1}; /* eps 0: not from the defaults */
    cr_assert_null(na_batch_norm2d_new(3, &bad));
    cr_assert(strstr(na_last_error(), "eps > 0"), "%s", na_last_error());
    /* BatchNorm1d on [N, C, L] works */
    cr_assert_not_null(na_module_forward(bn1, na_randn(NA_DTYPE_F32, NA_DEVICE_CPU,
                                                       NA_SHAPE(2, 3, 4), 0, 1)), "%s", na_last_error());
    na_module_free(bn1);
    na_module_free(bn2);
}

/* ---- names, counts, initialization ---------------------------------------------------------------- */

/* The MNIST CNN of the issue. */
static na_module *mnist_cnn(void) {
    na_conv2d_opts pad1 = {.padding = {1, 1}};
    na_pool2d_opts pool2 = {.kernel = {2, 2}};
    return NA_SEQUENTIAL(na_conv2d_new(1, 32, 3, 3, &pad1, true), na_batch_norm2d_new(32, NULL),
                         na_relu_new(), na_max_pool2d_new(&pool2),
                         na_conv2d_new(32, 64, 3, 3, &pad1, true), na_batch_norm2d_new(64, NULL),
                         na_relu_new(), na_max_pool2d_new(&pool2), na_flatten_new(1),
                         na_linear_new(3136, 128, true), na_relu_new(), na_linear_new(128, 10, true));
}

Test(nn, mnist_cnn_names_and_parameter_count) {
    na_module *net = mnist_cnn();
    cr_assert_not_null(net, "%s", na_last_error());
    int64_t conv1 = 32 * 1 * 3 * 3 + 32, bn1 = 2 * 32, conv2 = 64 * 32 * 3 * 3 + 64, bn2 = 2 * 64;
    int64_t fc1 = 3136 * 128 + 128, fc2 = 128 * 10 + 10;
    cr_assert_eq(na_module_num_params(net), conv1 + bn1 + conv2 + bn2 + fc1 + fc2);
    cr_assert_eq(na_module_num_params(net), 421834);

    na_named_tensors p = {0}, b = {0}, s = {0};
    cr_assert_eq(na_module_named_tensors(net, NA_MODULE_PARAMS, "", &p), NA_OK);
    const char *pn[] = {"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias",
                        "5.weight", "5.bias", "9.weight", "9.bias", "11.weight", "11.bias"};
    cr_assert_eq(p.n, 12);
    for (int i = 0; i < 12; i++) {
        cr_assert_str_eq(p.items[i].name, pn[i]);
        cr_assert(p.items[i].tensor->requires_grad && p.items[i].tensor->persistent);
        cr_assert_eq(p.items[i].tensor->dtype, NA_DTYPE_F32);
    }
    cr_assert(na_module_is_affine_batch_norm(p.items[2].owner, NULL), "owner of 1.weight is a BN");
    cr_assert_not(na_module_is_batch_norm(p.items[0].owner, NULL));
    cr_assert_eq(na_module_kind_of(p.items[8].owner), NA_MODULE_LINEAR);
    cr_assert_eq(na_module_named_tensors(net, NA_MODULE_BUFFERS, "", &b), NA_OK);
    const char *bnm[] = {"1.running_mean", "1.running_var", "1.num_batches_tracked",
                         "5.running_mean", "5.running_var", "5.num_batches_tracked"};
    cr_assert_eq(b.n, 6);
    for (int i = 0; i < 6; i++) {
        cr_assert_str_eq(b.items[i].name, bnm[i]);
        cr_assert_not(b.items[i].tensor->requires_grad);
    }
    /* state_dict order: each module's parameters then its buffers */
    cr_assert_eq(na_module_named_tensors(net, NA_MODULE_STATE, "", &s), NA_OK);
    cr_assert_eq(s.n, 18);
    cr_assert_str_eq(s.items[4].name, "1.running_mean");
    cr_assert_eq(na_named_tensors_find(&s, "9.weight"), na_module_get(net, "9.weight"));

    na_manual_seed(1);
    na_tensor *y = na_module_forward(net, na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 1, 28, 28), 0, 1));
    cr_assert_not_null(y, "%s", na_last_error());
    cr_assert_eq(y->shape[0], 2);
    cr_assert_eq(y->shape[1], 10);
    na_named_tensors_free(&p), na_named_tensors_free(&b), na_named_tensors_free(&s);
    na_module_free(net);
}

static na_tensor *custom_forward(na_module *m, na_tensor *x) {
    return na_module_forward(na_module_child_at(m, 0, NULL), na_mul(x, na_module_get(m, "gain")));
}

Test(nn, custom_module_dotted_names) {
    int *state = malloc(sizeof *state);
    na_module *m = na_module_new("Gained", custom_forward, state, free);
    na_tensor *gain = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
    cr_assert_eq(na_module_add_param(m, "gain", gain), NA_OK);
    cr_assert(gain->requires_grad);
    cr_assert_eq(na_module_add_child(m, "features", NA_SEQUENTIAL(na_linear_new(2, 2, true))), NA_OK);
    cr_assert_neq(na_module_add_child(m, "features", na_relu_new()), NA_OK, "duplicate name");
    cr_assert_neq(na_module_add_buffer(m, "a.b", na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1))), NA_OK);
    na_named_tensors l = {0};
    cr_assert_eq(na_module_named_tensors(m, NA_MODULE_PARAMS, "", &l), NA_OK);
    cr_assert_eq(l.n, 3);
    cr_assert_str_eq(l.items[0].name, "gain");
    cr_assert_str_eq(l.items[1].name, "features.0.weight");
    cr_assert_str_eq(l.items[2].name, "features.0.bias");
    /* the state protocol appends, prefixed; every item names the module holding it */
    cr_assert_eq(na_module_add_buffer(m, "count", na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, 0, NULL)), NA_OK);
    cr_assert_eq(na_module_state(m, "model.", &l), NA_OK);
    cr_assert_eq(l.n, 7);
    const char *names[] = {"model.gain", "model.count", "model.features.0.weight",
                           "model.features.0.bias"};
    for (int i = 0; i < 4; i++) cr_assert_str_eq(l.items[3 + i].name, names[i]);
    cr_assert_eq(l.items[4].owner, m);
    cr_assert_eq(l.items[6].owner, na_module_child_at(na_module_child_at(m, 0, NULL), 0, NULL));
    cr_assert_eq(na_named_tensors_find(&l, "model.features.0.bias"), na_module_get(m, "features.0.bias"));
    na_named_tensors_free(&l);
    /* the parameters for an optimizer: trainable ones, in the same order */
    cr_assert_eq(na_tensor_set_requires_grad(gain, false), NA_OK);
    na_tensor_list ps = na_module_parameters(m);
    cr_assert_eq(ps.n, 2, "%s", na_last_error());
    cr_assert_eq(ps.items[0], na_module_get(m, "features.0.weight"));
    cr_assert_eq(ps.items[1], na_module_get(m, "features.0.bias"));
    cr_assert_eq(na_module_parameters(NULL).n, -1);
    cr_assert(strstr(na_last_error(), "na_module_parameters"), "%s", na_last_error());
    cr_assert_neq(na_module_state(NULL, "", &l), NA_OK);
    cr_assert_str_eq(na_module_type_name(m), "Gained");
    cr_assert_eq(na_module_data(m), state);
    set_values(gain, (float[]){1, 2});
    cr_assert_not_null(na_module_forward(m, input(NA_SHAPE(1, 2), (float[]){1, 1})), "%s", na_last_error());
    na_module_free(m);
}

Test(nn, train_eval_is_recursive_and_zero_grad) {
    na_module *net = NA_SEQUENTIAL(na_linear_new(2, 2, true), NA_SEQUENTIAL(na_dropout_new(0.5)));
    cr_assert(na_module_is_training(na_module_child_at(na_module_child_at(net, 1, NULL), 0, NULL)));
    na_module_eval(net);
    cr_assert_not(na_module_is_training(na_module_child_at(na_module_child_at(net, 1, NULL), 0, NULL)));
    na_module_train(net, true);
    cr_assert(na_module_is_training(na_module_child_at(net, 0, NULL)));
    na_tensor *y = na_module_forward(net, na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 2)));
    cr_assert_eq(na_backward(na_sum(y), NULL), NA_OK, "%s", na_last_error());
    na_tensor *w = na_module_get(net, "0.weight");
    cr_assert_not_null(w->grad);
    cr_assert_eq(na_module_zero_grad(net), NA_OK);
    for (int i = 0; i < 4; i++) cr_assert_eq(na_get(w->grad, i), 0.0);
    na_module_free(net);
}

Test(nn, init_bounds_and_determinism) {
    na_manual_seed(42);
    na_module *a = na_linear_new(100, 50, true);
    na_module *c = na_conv2d_new(8, 4, 3, 3, &(na_conv2d_opts){.groups = 2}, true);
    na_manual_seed(42);
    na_module *b = na_linear_new(100, 50, true);
    na_manual_seed(43);
    na_module *d = na_linear_new(100, 50, true);
    na_tensor *wa = na_module_get(a, "weight"), *wb = na_module_get(b, "weight");
    cr_assert_eq(memcmp(wa->data, wb->data, (size_t)wa->numel * 4), 0, "same seed, same init");
    cr_assert_neq(memcmp(wa->data, na_module_get(d, "weight")->data, (size_t)wa->numel * 4), 0);
    struct { na_tensor *t; double bound; } cases[] = {
        {wa, 0.1}, {na_module_get(a, "bias"), 0.1}, /* 1/sqrt(100) */
        {na_module_get(c, "weight"), 1 / sqrt(4.0 * 9)}, /* fan_in = 8/2 * 3 * 3 */
        {na_module_get(c, "bias"), 1 / sqrt(4.0 * 9)},
    };
    for (size_t k = 0; k < 4; k++) {
        double mx = 0, sum = 0;
        for (int64_t i = 0; i < cases[k].t->numel; i++) {
            double v = na_get(cases[k].t, i);
            cr_assert(fabs(v) <= cases[k].bound, "case %zu: %g beyond %g", k, v, cases[k].bound);
            mx = fmax(mx, fabs(v));
            sum += v;
        }
        cr_assert(mx > 0.8 * cases[k].bound, "case %zu: values fill the range (max %g)", k, mx);
        if (cases[k].t->numel > 1000)
            cr_assert(fabs(sum / (double)cases[k].t->numel) < 0.1 * cases[k].bound, "centered");
    }
    cr_assert_eq(na_init_fan_in(na_module_get(c, "weight")), 36);
    na_module_free(a), na_module_free(b), na_module_free(c), na_module_free(d);
}

/* ---- dtype and device ------------------------------------------------------------------------------ */

Test(nn, to_dtype_half_except_batch_norm) {
    na_module *net = NA_SEQUENTIAL(na_conv2d_new(2, 4, 3, 3, &(na_conv2d_opts){.padding = {1, 1}}, true),
                                   na_batch_norm2d_new(4, NULL), na_relu_new(),
                                   na_global_avg_pool2d_new(), na_linear_new(4, 3, true));
    na_tensor *w0 = na_module_get(net, "0.weight");
    float before = (float)na_get(w0, 0);
    cr_assert_eq(na_module_to_dtype(net, NA_DTYPE_F16, na_module_is_batch_norm, NULL), NA_OK,
                 "%s", na_last_error());
    cr_assert_eq(na_module_get(net, "0.weight"), w0, "converted in place: same struct");
    cr_assert_eq(w0->dtype, NA_DTYPE_F16);
    cr_assert(w0->requires_grad && w0->persistent);
    cr_assert(fabs(na_get(w0, 0) - before) <= 1e-3 * fabs(before) + 1e-7);
    cr_assert_eq(na_module_get(net, "4.bias")->dtype, NA_DTYPE_F16);
    cr_assert_eq(na_module_get(net, "1.weight")->dtype, NA_DTYPE_F32);
    cr_assert_eq(na_module_get(net, "1.running_var")->dtype, NA_DTYPE_F32);
    cr_assert_eq(na_module_get(net, "1.num_batches_tracked")->dtype, NA_DTYPE_I32);
    na_tensor *x = na_randn(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(2, 2, 5, 5), 0, 1);
    na_tensor *y = na_module_forward(net, x);
    cr_assert_not_null(y, "%s", na_last_error());
    cr_assert_eq(y->dtype, NA_DTYPE_F16);
    /* back to f32 (no skip) converts the gradient-less tensors too; the counter stays i32 */
    cr_assert_eq(na_module_to_dtype(net, NA_DTYPE_F32, NULL, NULL), NA_OK);
    cr_assert_eq(w0->dtype, NA_DTYPE_F32);
    cr_assert_eq(na_module_get(net, "1.num_batches_tracked")->dtype, NA_DTYPE_I32);
    cr_assert_eq(na_module_to(net, NA_DEVICE_CPU), NA_OK);
    cr_assert_neq(na_module_to_dtype(net, NA_DTYPE_I32, NULL, NULL), NA_OK);
    na_module_free(net);
}

Test(nn, to_dtype_converts_gradients) {
    na_module *lin = na_linear_new(3, 2, true);
    na_tensor *y = na_module_forward(lin, na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 3)));
    cr_assert_eq(na_backward(na_sum(y), NULL), NA_OK);
    cr_assert_eq(na_module_to_dtype(lin, NA_DTYPE_F64, NULL, NULL), NA_OK);
    na_tensor *b = na_module_get(lin, "bias");
    cr_assert_eq(b->grad->dtype, NA_DTYPE_F64);
    expect_values(b->grad, (double[]){1, 1}, 2, 0);
    na_module_free(lin);
}

/* ---- backward: gradcheck in f64 -------------------------------------------------------------------- */

static na_tensor *module_fn(na_tensor **inputs, void *ctx) { return na_module_forward(ctx, inputs[0]); }

/* gradcheck of m (converted to f64) w.r.t. an input of the given shape and every parameter. */
static void gradcheck_module(na_module *m, int ndim, const int64_t *shape) {
    cr_assert_not_null(m, "%s", na_last_error());
    cr_assert_eq(na_module_to_dtype(m, NA_DTYPE_F64, NULL, NULL), NA_OK, "%s", na_last_error());
    na_tensor *x = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, ndim, shape);
    cr_assert_eq(na_init_uniform_(x, -1, 1), NA_OK);
    cr_assert_eq(na_tensor_set_requires_grad(x, true), NA_OK);
    na_named_tensors l = {0};
    cr_assert_eq(na_module_named_tensors(m, NA_MODULE_PARAMS, "", &l), NA_OK);
    na_tensor *inputs[32] = {x};
    cr_assert_lt(l.n, 31);
    for (int64_t i = 0; i < l.n; i++) inputs[i + 1] = l.items[i].tensor;
    int rc = na_gradcheck(module_fn, m, inputs, (int)l.n + 1, NULL);
    cr_assert_eq(rc, NA_OK, "%s: %s", na_module_type_name(m), na_last_error());
    na_named_tensors_free(&l);
    na_tensor_free(x);
    na_module_free(m);
    na_step_end();
}

Test(nn, gradcheck_linear_and_activations) {
    na_manual_seed(3);
    gradcheck_module(na_linear_new(4, 3, true), NA_SHAPE(2, 4));
    gradcheck_module(NA_SEQUENTIAL(na_linear_new(3, 4, false), na_gelu_new(), na_linear_new(4, 2, true),
                                   na_sigmoid_new(), na_scale_new(0.125)), NA_SHAPE(3, 3));
    gradcheck_module(NA_SEQUENTIAL(na_tanh_new(), na_residual_new(NA_SEQUENTIAL(na_linear_new(3, 3, true),
                                                                                na_relu_new()))),
                     NA_SHAPE(2, 3));
}

Test(nn, gradcheck_conv2d) {
    na_manual_seed(4);
    gradcheck_module(na_conv2d_new(2, 3, 3, 3, &(na_conv2d_opts){.padding = {1, 1}}, true),
                     NA_SHAPE(2, 2, 4, 4));
    gradcheck_module(na_conv2d_new(4, 2, 2, 3, &(na_conv2d_opts){.stride = {2, 1}, .padding = {1, 1},
                                                                 .dilation = {1, 2}, .groups = 2}, false),
                     NA_SHAPE(1, 4, 5, 5));
}

Test(nn, gradcheck_batch_norm) {
    na_manual_seed(5);
    gradcheck_module(na_batch_norm2d_new(3, NULL), NA_SHAPE(2, 3, 2, 2));
    gradcheck_module(na_batch_norm1d_new(3, NULL), NA_SHAPE(4, 3));
    na_module *ev = na_batch_norm1d_new(2, NULL);
    na_module_eval(ev);
    gradcheck_module(ev, NA_SHAPE(3, 2, 2));
}

Test(nn, gradcheck_small_cnn) {
    na_manual_seed(6);
    na_pool2d_opts p2 = {.kernel = {2, 2}};
    gradcheck_module(NA_SEQUENTIAL(na_conv2d_new(1, 2, 3, 3, &(na_conv2d_opts){.padding = {1, 1}}, true),
                                   na_batch_norm2d_new(2, NULL), na_relu_new(), na_max_pool2d_new(&p2),
                                   na_avg_pool2d_new(&(na_pool2d_opts){.kernel = {1, 2}, .count_include_pad = true}),
                                   na_flatten_new(1), na_linear_new(2 * 2 * 1, 3, true)),
                     NA_SHAPE(2, 1, 4, 4));
    gradcheck_module(NA_SEQUENTIAL(na_conv2d_new(2, 2, 1, 1, NULL, true), na_global_avg_pool2d_new()),
                     NA_SHAPE(2, 2, 3, 3));
    gradcheck_module(NA_SEQUENTIAL(na_conv2d_new(2, 2, 1, 1, NULL, true), na_global_max_pool2d_new()),
                     NA_SHAPE(2, 2, 3, 3));
}

/* ---- losses are functions of ops.h; check they compose with modules ------------------------------- */

Test(nn, losses_by_hand) {
    na_module *lin = na_linear_new(2, 3, false);
    set_values(na_module_get(lin, "weight"), (float[]){1, 0, 0, 1, 0, 0});
    na_tensor *logits = na_module_forward(lin, input(NA_SHAPE(1, 2), (float[]){1, 2}));
    int32_t label = 1;
    na_tensor *y = na_from_host(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(1), &label);
    /* logits [1, 2, 0]: loss = log(e + e^2 + 1) - 2 */
    expect_values(na_cross_entropy(logits, y, NULL), (double[]){log(exp(1) + exp(2) + 1) - 2}, 1, 1e-6);
    na_tensor *t = input(NA_SHAPE(1, 3), (float[]){0, 0, 0});
    expect_values(na_mse_loss(logits, t, NA_REDUCTION_MEAN), (double[]){5.0 / 3}, 1, 1e-6);
    na_module_free(lin);
}

/* ---- fusing BatchNorm + ReLU ------------------------------------------------------------------- */

/* BN + ReLU pairs at the top level, in a Residual's body and after a Linear (BatchNorm1d), and
 * a BatchNorm with no ReLU after it (left alone). */
static na_module *fusable_net(void) {
    na_conv2d_opts pad1 = {.padding = {1, 1}};
    na_pool2d_opts pool2 = {.kernel = {2, 2}};
    return NA_SEQUENTIAL(
        na_conv2d_new(3, 4, 3, 3, &pad1, true), na_batch_norm2d_new(4, NULL), na_relu_new(),
        na_max_pool2d_new(&pool2),
        na_residual_new(NA_SEQUENTIAL(na_conv2d_new(4, 4, 3, 3, &pad1, false),
                                      na_batch_norm2d_new(4, NULL), na_relu_new())),
        na_flatten_new(1), na_linear_new(36, 5, true), na_batch_norm1d_new(5, NULL),
        na_relu_new(), na_linear_new(5, 2, true), na_batch_norm1d_new(2, NULL));
}

static void expect_same_bits(const na_tensor *a, const na_tensor *b, const char *what, int i) {
    cr_assert(a && b && a->numel == b->numel && a->dtype == NA_DTYPE_F32, "%s %d", what, i);
    cr_assert(!memcmp(a->data, b->data, (size_t)a->numel * sizeof(float)), "%s %d differs", what, i);
}

static void count_op(const na_amp_trace_record *r, void *ctx) { ((int *)ctx)[r->op]++; }

Test(nn, fuse_bn_relu_keeps_names_outputs_and_gradients) {
    na_manual_seed(7);
    na_module *plain = fusable_net();
    na_manual_seed(7);
    na_module *fused = fusable_net();
    cr_assert(plain && fused, "%s", na_last_error());
    cr_assert_eq(na_module_fuse_bn_relu(fused), 3, "three BN + ReLU pairs: %s", na_last_error());
    cr_assert_eq(na_module_fuse_bn_relu(fused), 0, "a fused net has nothing left to fuse");
    cr_assert_lt(na_module_fuse_bn_relu(NULL), 0);
    na_named_tensors sp = {0}, sf = {0};
    cr_assert_eq(na_module_state(plain, "", &sp), NA_OK);
    cr_assert_eq(na_module_state(fused, "", &sf), NA_OK);
    cr_assert_eq(sp.n, sf.n);
    for (int64_t i = 0; i < sp.n; i++) cr_assert_str_eq(sf.items[i].name, sp.items[i].name);
    for (int step = 0; step < 3; step++) { /* two training steps, then eval */
        bool training = step < 2;
        na_module_train(plain, training);
        na_module_train(fused, training);
        na_manual_seed(100 + step);
        na_tensor *x = na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3, 6, 6), -1, 1);
        int ops[NA_OP_COUNT] = {0};
        na_tensor *y[2] = {na_module_forward(plain, x), NULL};
        na_autocast_trace_callback(NA_AMP_TRACE_ALL, count_op, ops);
        y[1] = na_module_forward(fused, x);
        na_autocast_trace_callback(NA_AMP_TRACE_OFF, NULL, NULL);
        cr_assert(y[0] && y[1], "%s", na_last_error());
        cr_assert(ops[NA_OP_BATCH_NORM_RELU] == 3 && ops[NA_OP_BATCH_NORM] == 1 &&
                  ops[NA_OP_RELU] == 0, "the fused net runs 3 fused ops, 1 batch_norm, no relu");
        expect_same_bits(y[1], y[0], "output of step", step);
        if (training) {
            for (int k = 0; k < 2; k++) {
                na_module_zero_grad(k ? fused : plain);
                cr_assert_eq(na_backward(na_sum(na_mul(y[k], y[k])), NULL), NA_OK, "%s",
                             na_last_error());
            }
            na_tensor_list gp = na_module_parameters(plain), gf = na_module_parameters(fused);
            for (int64_t i = 0; i < gp.n; i++) expect_same_bits(gf.items[i]->grad, gp.items[i]->grad, "grad", (int)i);
        }
        for (int64_t i = 0; i < sp.n; i++) /* parameters and running statistics */
            if (sp.items[i].tensor->dtype == NA_DTYPE_F32)
                expect_same_bits(sf.items[i].tensor, sp.items[i].tensor, sp.items[i].name, step);
        na_step_end();
    }
    na_named_tensors_free(&sp);
    na_named_tensors_free(&sf);
    na_module_free(plain);
    na_module_free(fused);
}
