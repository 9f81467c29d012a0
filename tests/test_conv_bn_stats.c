/* tests/test_conv_bn_stats.c — a convolution that hands the training BatchNorm after it the
 * batch sums of its output (NANOAMP_CONV_BN_STATS): na_conv2d_sums gives each output
 * channel's sum and sum of squares with y; na_batch_norm_sums takes its statistics from them
 * (the backend's batch_norm_finalize, then the eval kernel's normalization); and
 * na_module_fuse_conv_bn links a model's Conv2d + BatchNorm2d pairs so that the route runs
 * inside na_module_forward. The CPU computes the sums in a second pass (the reference of the
 * cuDNN graph that fuses them; parity rows in test_cuda_parity.c). Off, everything is
 * na_conv2d + na_batch_norm bit for bit; on, the same values up to rounding, except where
 * sum(y^2)/M - mean^2 cancels, which one test shows on purpose. */
#include <stdlib.h>

#include "helpers.h"
#include "kernels/backend.h"
#include "nanoamp/nn.h"

static void route(bool on) {
    if (on)
        setenv("NANOAMP_CONV_BN_STATS", "all", 1); /* the CUDA route, here on the CPU */
    else
        unsetenv("NANOAMP_CONV_BN_STATS");
}

/* t's values in logical (C) order as doubles, valid until na_step_end */
static const double *vals(na_tensor *t) {
    na_tensor *c = TH_OK(na_cast(TH_OK(na_contiguous(t)), NA_DTYPE_F64));
    return c->data;
}

/* max |a - b| over max |b|, the latter at least 0.01: a conv bias followed by BatchNorm has a
 * gradient of 0 up to rounding (BatchNorm removes the mean), whose noise is not a difference */
static double rel_diff(na_tensor *a, na_tensor *b) {
    cr_assert_eq(a->numel, b->numel);
    const double *x = vals(a), *y = vals(b);
    double d = 0, m = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        d = fmax(d, fabs(x[i] - y[i]));
        m = fmax(m, fabs(y[i]));
    }
    return d / fmax(m, 1e-2);
}

static na_tensor *leaf(int ndim, const int64_t *shape, uint64_t seed, double mean, double std,
                       na_dtype dt) {
    na_manual_seed(seed);
    na_tensor *t = TH_OK(na_tensor_new(dt, NA_DEVICE_CPU, ndim, shape));
    TH_RC(na_copy_(t, TH_OK(na_randn(dt, NA_DEVICE_CPU, ndim, shape, mean, std))));
    TH_RC(na_tensor_set_requires_grad(t, true));
    return t;
}

static const na_conv2d_opts pad1 = {.padding = {1, 1}};

Test(conv_bn_stats, sums_are_those_of_the_output) {
    na_dtype dts[2] = {NA_DTYPE_F32, NA_DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (int cl = 0; cl < 2; cl++) {
            na_tensor *x = leaf(NA_SHAPE(4, 3, 6, 5), 1, 0, 1, dts[d]);
            na_tensor *w = leaf(NA_SHAPE(5, 3, 3, 3), 2, 0, 0.5, dts[d]);
            na_tensor *b = leaf(NA_SHAPE(5), 3, 2, 1, dts[d]);
            na_tensor *xi = cl ? TH_OK(na_to_channels_last(x)) : x, *sum, *sqsum;
            na_tensor *plain = TH_OK(na_conv2d(xi, w, b, &pad1));
            route(false);
            na_tensor *y = TH_OK(na_conv2d_sums(xi, w, b, &pad1, &sum, &sqsum));
            cr_assert(!sum && !sqsum, "no sums while NANOAMP_CONV_BN_STATS is unset");
            cr_assert_eq(rel_diff(y, plain), 0.0);
            route(true);
            y = TH_OK(na_conv2d_sums(xi, w, b, &pad1, &sum, &sqsum));
            cr_assert(sum && sqsum, "sums on the CPU with NANOAMP_CONV_BN_STATS=all");
            cr_assert_eq(na_memory_format_of(y), na_memory_format_of(plain));
            cr_assert(sum->dtype == NA_DTYPE_F32 && sum->ndim == 1 && sum->shape[0] == 5);
            cr_assert(!sum->requires_grad && !sqsum->requires_grad, "sums are outside autograd");
            cr_assert_eq(rel_diff(y, plain), 0.0, "the same convolution");
            const double *v = vals(y), *s = vals(sum), *q = vals(sqsum);
            for (int k = 0; k < 5; k++) { /* f64 sums of y's stored values over N, H, W */
                double es = 0, eq = 0, abs_sum = 0;
                for (int n = 0; n < 4; n++)
                    for (int i = 0; i < 30; i++) {
                        double e = v[(n * 5 + k) * 30 + i];
                        es += e, eq += e * e, abs_sum += fabs(e);
                    }
                cr_assert_leq(fabs(s[k] - es), 1e-6 * abs_sum, "%s cl %d: sum[%d] %g, expected %g",
                              na_dtype_name(dts[d]), cl, k, s[k], es);
                cr_assert_leq(fabs(q[k] - eq), 1e-6 * eq, "sqsum[%d] %g, expected %g", k, q[k], eq);
            }
            na_step_end();
        }
    route(false);
}

/* Under autocast the convolution computes in the low dtype (its rule); its sums stay f32 and
 * are those of the rounded output the BatchNorm reads. */
Test(conv_bn_stats, autocast_sums_the_low_precision_output) {
    route(true);
    na_tensor *x = leaf(NA_SHAPE(2, 3, 5, 5), 31, 0, 1, NA_DTYPE_F32);
    na_tensor *w = leaf(NA_SHAPE(4, 3, 3, 3), 32, 0, 0.5, NA_DTYPE_F32), *sum, *sqsum;
    TH_RC(na_autocast_begin(NA_DTYPE_BF16));
    na_tensor *y = TH_OK(na_conv2d_sums(x, w, NULL, &pad1, &sum, &sqsum));
    na_tensor *z =
        TH_OK(na_batch_norm_sums(y, sum, sqsum, NULL, NULL, NULL, NULL, 0.1, 1e-5, true));
    na_autocast_end();
    cr_assert(y->dtype == NA_DTYPE_BF16 && z->dtype == NA_DTYPE_BF16, "conv under bf16 autocast");
    cr_assert(sum && sum->dtype == NA_DTYPE_F32 && sqsum->dtype == NA_DTYPE_F32, "f32 sums");
    const double *v = vals(y), *s = vals(sum);
    for (int k = 0; k < 4; k++) {
        double e = 0, a = 0;
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < 25; i++) {
                double yi = v[(n * 4 + k) * 25 + i];
                e += yi, a += fabs(yi);
            }
        cr_assert_leq(fabs(s[k] - e), 1e-6 * a, "sum[%d] %g of the bf16 output, expected %g", k,
                      s[k], e);
    }
    na_tensor_free(x);
    na_tensor_free(w);
    na_step_end();
    route(false);
}

/* The finalize kernel against hand-computed values: channel 0 holds 1, 2, 3, 4; channel 1 has
 * sqsum/M a little below mean^2 (rounding in a real sum), which must give variance 0. */
Test(conv_bn_stats, finalize_by_hand) {
    const na_backend *be = na_backend_get(NA_DEVICE_CPU);
    na_tensor *sum = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 10, 8);
    na_tensor *sqsum = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 30, 15.99);
    na_tensor *rm = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 0, 1);
    na_tensor *rv = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 1, 2);
    na_tensor *mean = TH_OK(na_empty(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    na_tensor *var = TH_OK(na_empty(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    na_tensor *invstd = TH_OK(na_empty(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    TH_RC(be->batch_norm_finalize(&sum->view, &sqsum->view, 4, &rm->view, &rv->view, &mean->view,
                                  &var->view, &invstd->view, 2, 0.1, 1e-5));
    th_expect(mean, TH_V(2.5, 2), 2, 0, 1e-7, "mean");
    th_expect(var, TH_V(1.25, 0), 2, 1e-6, 1e-7, "biased variance, clamped at 0");
    th_expect(invstd, TH_V(1 / sqrt(1.25 + 1e-5), 1 / sqrt(1e-5)), 2, 0, 1e-6, "invstd");
    /* running: 0.9 * old + 0.1 * stat, the variance unbiased (4/3) */
    th_expect(rm, TH_V(0.25, 0.9 + 0.2), 2, 1e-6, 0, "running_mean");
    th_expect(rv, TH_V(0.9 + 0.1 * 1.25 * 4 / 3, 1.8), 2, 1e-6, 0, "running_var");
    TH_EXPECT_STATUS(be->batch_norm_finalize(&sum->view, &sqsum->view, 0, NULL, NULL, &mean->view,
                                             &var->view, &invstd->view, 2, 0.1, 1e-5),
                     NA_EINVAL, "0 values");
    na_step_end();
}

/* conv -> BatchNorm(+ReLU) with the statistics from the sums against na_conv2d + na_batch_norm:
 * output, running statistics and the gradients of x, w, gamma and beta. */
Test(conv_bn_stats, batch_norm_from_sums_matches_batch_norm) {
    for (int relu = 0; relu < 2; relu++)
        for (int cl = 0; cl < 2; cl++) {
            na_tensor *p[4] = {leaf(NA_SHAPE(4, 3, 6, 6), 11, 0, 1, NA_DTYPE_F32),
                               leaf(NA_SHAPE(6, 3, 3, 3), 12, 0.1, 0.4, NA_DTYPE_F32),
                               leaf(NA_SHAPE(6), 13, 1, 0.3, NA_DTYPE_F32),
                               leaf(NA_SHAPE(6), 14, 0, 0.3, NA_DTYPE_F32)};
            na_tensor *r = TH_OK(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 6, 6, 6), 0, 1));
            na_tensor *out[2], *grads[2][4], *rstat[2][2];
            for (int k = 0; k < 2; k++) { /* k = 0: plain; 1: from the sums */
                rstat[k][0] = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(6), 0, 0, 0, 0, 0, 0);
                rstat[k][1] = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(6), 1, 1, 1, 1, 1, 1);
                na_tensor *x = cl ? TH_OK(na_to_channels_last(p[0])) : p[0], *sum, *sqsum;
                route(k == 1);
                na_tensor *y = TH_OK(na_conv2d_sums(x, p[1], NULL, &pad1, &sum, &sqsum));
                cr_assert_eq(sum != NULL, k == 1);
                out[k] = TH_OK(na_batch_norm_sums(y, sum, sqsum, rstat[k][0], rstat[k][1], p[2],
                                                  p[3], 0.1, 1e-5, relu));
                cr_assert_eq(na_memory_format_of(out[k]), na_memory_format_of(x));
                for (int i = 0; i < 4; i++) TH_RC(na_tensor_zero_grad(p[i]));
                TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(out[k], r)))), NULL));
                for (int i = 0; i < 4; i++) /* a copy */
                    grads[k][i] = TH_OK(na_cast(p[i]->grad, NA_DTYPE_F64));
            }
            cr_assert_leq(rel_diff(out[1], out[0]), 2e-5, "relu %d cl %d: output", relu, cl);
            for (int i = 0; i < 2; i++)
                cr_assert_leq(rel_diff(rstat[1][i], rstat[0][i]), 2e-5, "running stat %d", i);
            for (int i = 0; i < 4; i++)
                cr_assert_leq(rel_diff(grads[1][i], grads[0][i]), 1e-4, "relu %d cl %d: grad %d",
                              relu, cl, i);
            for (int i = 0; i < 4; i++) na_tensor_free(p[i]);
            na_step_end();
        }
    route(false);
}

/* ctx: true to run the convolution on a channels-last copy of x */
static na_tensor *conv_bn_of_sums(na_tensor **in, void *ctx) {
    na_tensor *x = *(bool *)ctx ? na_to_channels_last(in[0]) : in[0], *sum, *sqsum;
    na_tensor *y = x ? na_conv2d_sums(x, in[1], NULL, &pad1, &sum, &sqsum) : NULL;
    cr_assert(y && sum, "the route runs in f64 on the CPU: %s", na_last_error());
    return na_batch_norm_sums(y, sum, sqsum, NULL, NULL, in[2], in[3], 0.1, 1e-5, false);
}

/* The route's forward (statistics from the sums) against its backward (BatchNorm's) in f64. */
Test(conv_bn_stats, gradcheck_f64) {
    route(true);
    na_tensor *in[4] = {leaf(NA_SHAPE(2, 2, 3, 3), 21, 0, 1, NA_DTYPE_F64),
                        leaf(NA_SHAPE(3, 2, 3, 3), 22, 0.2, 0.5, NA_DTYPE_F64),
                        leaf(NA_SHAPE(3), 23, 1, 0.3, NA_DTYPE_F64),
                        leaf(NA_SHAPE(3), 24, 0, 0.3, NA_DTYPE_F64)};
    for (int cl = 0; cl < 2; cl++) TH_RC(na_gradcheck(conv_bn_of_sums, &(bool){cl}, in, 4, NULL));
    for (int i = 0; i < 4; i++) na_tensor_free(in[i]);
    route(false);
}

Test(conv_bn_stats, errors_name_the_argument) {
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 4, 3, 3), -1, 1));
    na_tensor *w = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 4, 1, 1), -1, 1));
    na_tensor *s3 = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    na_tensor *s4 = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4)));
    TH_EXPECT_ERROR(na_conv2d_sums(x, w, NULL, NULL, NULL, NULL), NA_EINVAL, "na_conv2d_sums",
                    "sum");
    TH_EXPECT_ERROR(na_batch_norm_sums(x, s3, s3, NULL, NULL, NULL, NULL, 0.1, 1e-5, false),
                    NA_ESHAPE, "na_batch_norm_sums", "sum is", "[4]");
    TH_EXPECT_ERROR(na_batch_norm_sums(x, s4, NULL, NULL, NULL, NULL, NULL, 0.1, 1e-5, false),
                    NA_EINVAL, "both sum and sqsum");
    na_step_end();
}

/* ---- the module link ---------------------------------------------------------------------- */

/* Conv2d + BatchNorm2d pairs at the top and in a Residual's body, and a Conv2d followed by a
 * pool (not linked). */
static na_module *linkable_net(uint64_t seed) { /* NULL fails the test */
    na_manual_seed(seed);
    na_pool2d_opts pool2 = {.kernel = {2, 2}};
    na_module *m = NA_SEQUENTIAL(
        na_conv2d_new(3, 4, 3, 3, &pad1, true), na_batch_norm2d_new(4, NULL), na_relu_new(),
        na_max_pool2d_new(&pool2),
        na_residual_new(NA_SEQUENTIAL(na_conv2d_new(4, 4, 3, 3, &pad1, false),
                                      na_batch_norm2d_new(4, NULL), na_relu_new())),
        na_conv2d_new(4, 2, 1, 1, NULL, true), na_avg_pool2d_new(&pool2), na_flatten_new(1));
    cr_assert_not_null(m, "%s", na_last_error());
    return m;
}

/* Two training steps and one in eval of `a` and `b` on the same inputs; the largest relative
 * difference of outputs, gradients and state seen (0 when bit for bit). */
static double run_pair(na_module *a, na_module *b, bool stats) {
    double worst = 0;
    na_named_tensors sa = {0}, sb = {0};
    TH_RC(na_module_state(a, "", &sa));
    TH_RC(na_module_state(b, "", &sb));
    for (int step = 0; step < 3; step++) {
        bool training = step < 2;
        na_module_train(a, training);
        na_module_train(b, training);
        na_manual_seed(200 + step);
        na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3, 8, 8), -1, 1));
        route(false);
        na_tensor *ya = TH_OK(na_module_forward(a, x));
        route(stats);
        na_tensor *yb = TH_OK(na_module_forward(b, x));
        worst = fmax(worst, rel_diff(yb, ya));
        if (training) {
            na_module_zero_grad(a);
            na_module_zero_grad(b);
            TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(ya, ya)))), NULL));
            TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(yb, yb)))), NULL));
            na_tensor_list ga = na_module_parameters(a), gb = na_module_parameters(b);
            for (int64_t i = 0; i < ga.n; i++)
                worst = fmax(worst, rel_diff(gb.items[i]->grad, ga.items[i]->grad));
        }
        for (int64_t i = 0; i < sa.n; i++)
            if (sa.items[i].tensor->dtype == NA_DTYPE_F32)
                worst = fmax(worst, rel_diff(sb.items[i].tensor, sa.items[i].tensor));
        na_step_end();
    }
    route(false);
    na_named_tensors_free(&sa);
    na_named_tensors_free(&sb);
    return worst;
}

Test(conv_bn_stats, module_link_counts_and_keeps_names) {
    na_module *plain = linkable_net(5), *linked = linkable_net(5);
    cr_assert_eq(na_module_fuse_conv_bn(linked), 2, "two Conv2d + BatchNorm2d pairs: %s",
                 na_last_error());
    cr_assert_eq(na_module_fuse_conv_bn(linked), 0, "a linked net has nothing left to link");
    cr_assert_lt(na_module_fuse_conv_bn(NULL), 0);
    na_named_tensors sp = {0}, sl = {0};
    TH_RC(na_module_state(plain, "", &sp));
    TH_RC(na_module_state(linked, "", &sl));
    cr_assert_eq(sp.n, sl.n);
    for (int64_t i = 0; i < sp.n; i++) cr_assert_str_eq(sl.items[i].name, sp.items[i].name);
    na_named_tensors_free(&sp);
    na_named_tensors_free(&sl);
    cr_assert_eq(run_pair(plain, linked, false), 0.0, "route off: bit for bit");
    na_module_free(plain);
    na_module_free(linked);
}

Test(conv_bn_stats, module_link_takes_the_route_when_on) {
    na_module *plain = linkable_net(6), *linked = linkable_net(6);
    cr_assert_eq(na_module_fuse_bn_relu(plain), 2);
    cr_assert_eq(na_module_fuse_bn_relu(linked), 2);
    cr_assert_eq(na_module_fuse_conv_bn(linked), 2);
    double d = run_pair(plain, linked, true);
    cr_assert_leq(d, 1e-3, "route on: the same training up to rounding (worst %g)", d);
    na_module_free(plain);
    na_module_free(linked);
}

/* A conv whose output is 1000 plus a spread of about 0.003: sum(y^2)/M - mean^2 cancels in f32
 * and the variance is lost, as the header says. Also proof that the linked net took the route:
 * the default path's Welford statistics keep it. */
Test(conv_bn_stats, cancellation_shows_the_route_ran) {
    na_module *nets[2] = {linkable_net(7), linkable_net(7)};
    cr_assert_eq(na_module_fuse_conv_bn(nets[1]), 2);
    for (int k = 0; k < 2; k++) {
        TH_RC(na_fill_(TH_OK(na_module_get(nets[k], "0.bias")), 1000.0));
        na_tensor *w = TH_OK(na_module_get(nets[k], "0.weight"));
        TH_RC(na_copy_(w, TH_OK(na_scale(w, 1e-2))));
    }
    double d = run_pair(nets[0], nets[1], true);
    cr_assert_geq(d, 0.05, "statistics from the sums lose the variance (difference %g)", d);
    for (int k = 0; k < 2; k++) na_module_free(nets[k]);
}
