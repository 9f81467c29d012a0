/* Loss scaling: the four scalers' rules over scripted sequences of clean and overflowing steps,
 * PyTorch's GradScaler contract (stages, errors, several optimizers and losses, clipping,
 * save/load) and the fused unscale kernel. Cases follow PyTorch's test_cuda.py
 * (test_grad_scaling_*) and ../shared/docs/reference/amp-facts.md. */
#include "helpers.h"

#include "common/amp.h"
#include "kernels/backend.h"
#include "nanoamp/io.h"
#include "nanoamp/nn.h"
#include "nanoamp/optim.h"

static void teardown(void) { na_step_end(); }
TestSuite(amp_scaler, .fini = teardown);

/* ---- helpers --------------------------------------------------------------------------------- */

static na_tensor *param(int64_t n, const float *v) {
    na_tensor *p = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n));
    cr_assert_not_null(p, "%s", na_last_error());
    TH_RC(na_copy_from_host(p, v));
    TH_RC(na_tensor_set_requires_grad(p, true));
    return p;
}

static na_optim *sgd_on(na_tensor *p, double lr, double momentum) {
    na_sgd_cfg c = {.lr = lr, .momentum = momentum};
    na_optim *o = na_sgd_new(NA_NO_TENSORS, &c);
    cr_assert_not_null(o, "%s", na_last_error());
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(p)), 0, "%s", na_last_error());
    return o;
}

static na_grad_scaler *scaler(na_grad_scaler_cfg c) {
    na_grad_scaler *gs = na_grad_scaler_new(&c);
    cr_assert_not_null(gs, "%s", na_last_error());
    return gs;
}

static const float X4[4] = {0.5f, -1.0f, 2.0f, 0.25f};

/* loss = sum(w * x): grad = x. Backward of the scaled loss, then (optionally) an inf in the
 * gradient, as PyTorch's _run_scaling_case injects it. */
static void backward_scaled(na_grad_scaler *gs, na_tensor *w, bool inject_inf) {
    na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(4), 0.5, -1, 2, 0.25);
    na_tensor *loss = TH_OK(na_sum(TH_OK(na_mul(w, x))));
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, loss)), NULL));
    if (inject_inf) {
        float g[4];
        TH_RC(na_copy_to_host(w->grad, g));
        g[1] = INFINITY;
        TH_RC(na_copy_from_host(w->grad, g));
    }
}

static void full_step(na_grad_scaler *gs, na_optim *opt, na_tensor *w, bool inject_inf) {
    backward_scaled(gs, w, inject_inf);
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    TH_RC(na_optim_zero_grad(opt));
    na_step_end();
}

static na_grad_scaler_stats stats(const na_grad_scaler *gs) {
    na_grad_scaler_stats s;
    TH_RC(na_grad_scaler_stats_get(gs, &s));
    return s;
}

/* ---- the rules ------------------------------------------------------------------------------- */

Test(amp_scaler, defaults_are_pytorchs) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    cr_assert_not_null(gs);
    na_grad_scaler_cfg c = na_grad_scaler_config(gs);
    cr_assert_eq(c.kind, NA_SCALER_GRAD);
    cr_assert_eq(c.init_scale, 65536.0);
    cr_assert_eq(c.growth_factor, 2.0);
    cr_assert_eq(c.backoff_factor, 0.5);
    cr_assert_eq(c.growth_interval, 2000);
    cr_assert(c.enabled);
    cr_assert_eq(na_grad_scaler_get_scale(gs), 65536.0);
    na_grad_scaler_free(gs);
}

/* test_grad_scaling_update_scale: scale 4, growth 2, backoff 0.25, interval 2. */
Test(amp_scaler, pytorch_update_rule) {
    na_grad_scaler *gs = scaler((na_grad_scaler_cfg){.kind = NA_SCALER_GRAD, .init_scale = 4,
                                                     .growth_factor = 2, .backoff_factor = 0.25,
                                                     .growth_interval = 2, .enabled = true});
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.1, 0);
    full_step(gs, opt, w, false);
    cr_assert_eq(stats(gs).scale, 4.0);
    cr_assert_eq(stats(gs).growth_tracker, 1);
    full_step(gs, opt, w, false);
    cr_assert_eq(stats(gs).scale, 8.0);
    cr_assert_eq(stats(gs).growth_tracker, 0);
    full_step(gs, opt, w, true);
    cr_assert_eq(stats(gs).scale, 2.0);
    cr_assert_eq(stats(gs).growth_tracker, 0);
    cr_assert_eq(stats(gs).skipped, 1);
    cr_assert_eq(stats(gs).updates, 3);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* test_grad_scale_will_not_overflow: init 1e38, growth 16: never inf. */
Test(amp_scaler, never_grows_to_inf) {
    na_grad_scaler *gs = scaler((na_grad_scaler_cfg){.kind = NA_SCALER_GRAD, .init_scale = 1e38,
                                                     .growth_factor = 16, .backoff_factor = 0.5,
                                                     .growth_interval = 1, .enabled = true});
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.0, 0);
    for (int i = 0; i < 3; i++) full_step(gs, opt, w, false);
    cr_assert_eq(stats(gs).scale, (double)1e38f, "scale %g", stats(gs).scale);
    /* 2^127 with growth 16 and zero gradients (no overflow): 2^131 is not an f32 */
    TH_RC(na_grad_scaler_update_to(gs, 0x1p127));
    na_tensor *zero = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4)));
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, TH_OK(na_sum(TH_OK(na_mul(w, zero)))))),
                      NULL));
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    cr_assert_eq(stats(gs).skipped, 0);
    cr_assert_eq(stats(gs).scale, 0x1p127);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* The rule itself, straight on the per-element math shared by both backends. */
Test(amp_scaler, update_math_pytorch_backoff_in_double) {
    double hp[NA_AMP_HP_COUNT] = {2.0, 0.3, 3, 0, 0, 0};
    float s = 3.0f;
    int32_t ctr[NA_AMP_CTR_COUNT] = {0, -1, 0, 0};
    na_amp_update(NA_AMP_KIND_GRAD_SCALER, hp, &s, ctr, true);
    cr_assert_eq(s, (float)(3.0 * 0.3)); /* computed in double, stored once as f32 */
    cr_assert_eq(na_amp_inv_scale(3.0f), (float)(1.0 / 3.0));
}

/* _run_scaling_case: init 128, growth 2, interval 1; infs injected at iterations 2 and 5 of 8:
 * final scale = 128 * 2^6 * 0.5^2, and params match an unscaled control that skips the same
 * steps (bit for bit: the scales are powers of two). */
Test(amp_scaler, final_scale_and_params_match_control) {
    for (int enabled = 0; enabled < 2; enabled++) {
        na_grad_scaler *gs = scaler((na_grad_scaler_cfg){.kind = NA_SCALER_GRAD,
                                                         .init_scale = 128, .growth_factor = 2,
                                                         .backoff_factor = 0.5,
                                                         .growth_interval = 1,
                                                         .enabled = enabled != 0});
        na_tensor *w = param(4, X4), *wc = param(4, X4);
        na_optim *opt = sgd_on(w, 0.125, 0.9), *ctl = sgd_on(wc, 0.125, 0.9);
        int skipped = 0, unskipped = 0;
        for (int it = 0; it < 8; it++) {
            bool inf = enabled && (it == 2 || it == 5);
            full_step(gs, opt, w, inf);
            if (inf) {
                skipped++;
                continue;
            }
            unskipped++;
            na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(4), 0.5, -1, 2, 0.25);
            TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(wc, x)))), NULL));
            TH_RC(na_optim_step(ctl, NULL));
            TH_RC(na_optim_zero_grad(ctl));
            na_step_end();
        }
        double want = enabled ? 128.0 * pow(2.0, unskipped) * pow(0.5, skipped) : 1.0;
        cr_assert_eq(na_grad_scaler_get_scale(gs), want, "enabled %d: scale %g, expected %g",
                     enabled, na_grad_scaler_get_scale(gs), want);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(na_get(w, i), na_get(wc, i), "enabled %d: param %d", enabled, i);
        na_optim_free(opt);
        na_optim_free(ctl);
        na_tensor_free(w);
        na_tensor_free(wc);
        na_grad_scaler_free(gs);
    }
}

/* Apex legacy DynamicLossScaler: cur_iter 0, last_overflow_iter -1; growth when
 * (cur_iter - last_overflow_iter) % window == 0. Window 3: clean updates at cur_iter 0, 1, 2:
 * (0+1)%3, (1+1)%3 no; (2+1)%3 == 0 -> x2 at the third update. */
Test(amp_scaler, apex_legacy_rule_scripted) {
    na_grad_scaler_cfg c = NA_APEX_LEGACY_SCALER_DEFAULTS;
    c.init_scale = 1024;
    c.growth_interval = 3;
    na_grad_scaler *gs = scaler(c);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.0, 0);
    /* step:      0     1     2     3(inf) 4     5     6     7 */
    bool inf[] = {0, 0, 0, 1, 0, 0, 0, 0};
    double want[] = {1024, 1024, 2048, 1024, 1024, 1024, 2048, 2048};
    int64_t last[] = {-1, -1, -1, 3, 3, 3, 3, 3};
    for (int i = 0; i < 8; i++) {
        full_step(gs, opt, w, inf[i]);
        na_grad_scaler_stats s = stats(gs);
        cr_assert_eq(s.scale, want[i], "update %d: scale %g, expected %g", i, s.scale, want[i]);
        cr_assert_eq(s.growth_tracker, i + 1, "cur_iter");
        cr_assert_eq(s.last_overflow_iter, last[i]);
    }
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* With Apex's defaults (2^32, window 1000, min 1): the first growth is at the 1000th clean
 * update (cur_iter 999), and after an overflow at cur_iter k the next growth is at k + 1000. */
Test(amp_scaler, apex_legacy_first_growth_exactly) {
    na_grad_scaler_cfg c = NA_APEX_LEGACY_SCALER_DEFAULTS;
    cr_assert_eq(c.init_scale, 4294967296.0);
    cr_assert_eq(c.growth_interval, 1000);
    cr_assert_eq(c.min_scale, 1.0);
    na_grad_scaler *gs = scaler(c);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.0, 0);
    for (int i = 0; i < 998; i++) full_step(gs, opt, w, false);
    cr_assert_eq(stats(gs).scale, 4294967296.0);
    full_step(gs, opt, w, false); /* the 999th clean update: cur_iter 998 */
    cr_assert_eq(stats(gs).scale, 4294967296.0);
    full_step(gs, opt, w, false); /* cur_iter 999: (999 + 1) % 1000 == 0 */
    cr_assert_eq(stats(gs).scale, 8589934592.0);
    full_step(gs, opt, w, true); /* overflow at cur_iter 1000 */
    cr_assert_eq(stats(gs).scale, 4294967296.0);
    cr_assert_eq(stats(gs).last_overflow_iter, 1000);
    for (int i = 0; i < 999; i++) full_step(gs, opt, w, false); /* cur_iter 1001..1999 */
    cr_assert_eq(stats(gs).scale, 4294967296.0);
    full_step(gs, opt, w, false); /* cur_iter 2000: 2000 - 1000 = 1000 */
    cr_assert_eq(stats(gs).scale, 8589934592.0);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

Test(amp_scaler, apex_legacy_minimum_one) {
    na_grad_scaler_cfg c = NA_APEX_LEGACY_SCALER_DEFAULTS;
    c.init_scale = 2;
    na_grad_scaler *gs = scaler(c);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.0, 0);
    for (int i = 0; i < 3; i++) full_step(gs, opt, w, true);
    cr_assert_eq(stats(gs).scale, 1.0);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* Apex amp LossScaler: /2 on overflow (at least min), x2 after `window` clean updates, at most
 * max; the start is min(max, init). */
Test(amp_scaler, apex_amp_rule_scripted) {
    na_grad_scaler_cfg c = NA_APEX_SCALER_DEFAULTS;
    cr_assert_eq(c.init_scale, 65536.0);
    cr_assert_eq(c.growth_interval, 2000);
    cr_assert_eq(c.max_scale, 16777216.0);
    c.init_scale = 1e9; /* clamped to 2^24 */
    c.growth_interval = 2;
    c.min_scale = 4194304.0; /* 2^22 */
    na_grad_scaler *gs = scaler(c);
    cr_assert_eq(na_grad_scaler_get_scale(gs), 16777216.0);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.0, 0);
    bool inf[] = {0, 0, 1, 1, 1, 0, 0, 0};
    double want[] = {16777216, 16777216, 8388608, 4194304, 4194304, 4194304, 8388608, 8388608};
    int64_t unskipped[] = {1, 0, 0, 0, 0, 1, 0, 1};
    for (int i = 0; i < 8; i++) {
        full_step(gs, opt, w, inf[i]);
        cr_assert_eq(stats(gs).scale, want[i], "update %d: %g, expected %g", i, stats(gs).scale,
                     want[i]);
        cr_assert_eq(stats(gs).growth_tracker, unskipped[i], "update %d: unskipped", i);
    }
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* Static: the scale never changes and the step is never skipped (Apex's has_overflow is
 * always False): an inf gradient reaches the parameters. */
Test(amp_scaler, static_never_skips) {
    na_grad_scaler *gs = scaler((na_grad_scaler_cfg)NA_STATIC_SCALER(128.0));
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.5, 0);
    full_step(gs, opt, w, false);
    cr_assert_eq(na_get(w, 0), 0.5 - 0.5 * 0.5);
    full_step(gs, opt, w, true);
    cr_assert(isinf(na_get(w, 1)));
    cr_assert_eq(stats(gs).scale, 128.0);
    cr_assert_eq(stats(gs).skipped, 0);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

Test(amp_scaler, update_to_sets_the_scale_only) {
    na_grad_scaler *gs = scaler((na_grad_scaler_cfg){.kind = NA_SCALER_GRAD, .init_scale = 4,
                                                     .growth_factor = 2, .backoff_factor = 0.5,
                                                     .growth_interval = 3, .enabled = true});
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.0, 0);
    full_step(gs, opt, w, false);
    backward_scaled(gs, w, false);
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update_to(gs, 3.0));
    cr_assert_eq(stats(gs).scale, 3.0);
    cr_assert_eq(stats(gs).growth_tracker, 1); /* untouched */
    TH_EXPECT_STATUS(na_grad_scaler_update_to(gs, -1), NA_EINVAL, "new scale");
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

Test(amp_scaler, invalid_configs) {
    na_grad_scaler_cfg c = NA_GRAD_SCALER_DEFAULTS;
    c.growth_factor = 1.0;
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "The growth factor must be > 1.0");
    c = (na_grad_scaler_cfg)NA_GRAD_SCALER_DEFAULTS;
    c.backoff_factor = 1.0;
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "The backoff factor must be < 1.0");
    c = (na_grad_scaler_cfg)NA_GRAD_SCALER_DEFAULTS;
    c.growth_interval = 0;
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "growth interval");
    c = (na_grad_scaler_cfg)NA_GRAD_SCALER_DEFAULTS;
    c.init_scale = 1e39;
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "init_scale");
    na_grad_scaler *off = na_grad_scaler_new(&(na_grad_scaler_cfg){.enabled = false});
    cr_assert_not_null(off, "a disabled scaler needs no valid factors: %s", na_last_error());
    na_grad_scaler_free(off);
}

/* ---- bounds: the floor, min_scale and max_scale under every rule ----------------------------- */

/* 400 overflows alternating with clean steps halve the scale 400 times: f32 would reach 0 after
 * about 165 (PyTorch's does), and a clean step at scale 0 unscales 0 * inf = NaN unflagged.
 * Every dynamic rule stops at the floor instead, and clean steps there stay finite. */
Test(amp_scaler, alternating_overflows_stop_at_the_floor) {
    cr_assert_eq(NA_AMP_SCALE_FLOOR, NA_GRAD_SCALER_FLOOR, "the kernels' floor is the header's");
    cr_assert_eq(NA_GRAD_SCALER_FLOOR, ldexp(1.0, -24));
    na_grad_scaler_cfg cfgs[] = {NA_GRAD_SCALER_DEFAULTS, NA_APEX_SCALER_DEFAULTS,
                                 NA_APEX_LEGACY_SCALER_DEFAULTS};
    cfgs[2].min_scale = 0; /* the legacy default stops at 1: test the floor itself */
    for (int k = 0; k < 3; k++) {
        na_grad_scaler *gs = scaler(cfgs[k]);
        na_tensor *w = param(4, X4);
        na_optim *opt = sgd_on(w, 0.0, 0);
        for (int i = 0; i < 800; i++) {
            full_step(gs, opt, w, i % 2 == 0);
            double s = stats(gs).scale;
            cr_assert(s >= NA_GRAD_SCALER_FLOOR, "%s, update %d: scale %g below the floor",
                      na_scaler_kind_name(cfgs[k].kind), i, s);
            for (int j = 0; j < 4; j++)
                cr_assert(isfinite(na_get(w, j)), "%s, update %d: parameter %d is %g",
                          na_scaler_kind_name(cfgs[k].kind), i, j, na_get(w, j));
        }
        cr_assert_eq(stats(gs).scale, NA_GRAD_SCALER_FLOOR, "%s: %g",
                     na_scaler_kind_name(cfgs[k].kind), stats(gs).scale);
        cr_assert_eq(stats(gs).skipped, 400);
        na_optim_free(opt);
        na_tensor_free(w);
        na_grad_scaler_free(gs);
    }
}

/* max_scale caps growth and min_scale backoff under every dynamic rule; a static or fixed
 * scale outside [min_scale, max_scale] is refused, as is an explicit new scale. */
Test(amp_scaler, min_and_max_scale_under_every_rule) {
    na_grad_scaler_cfg cfgs[] = {NA_GRAD_SCALER_DEFAULTS, NA_APEX_SCALER_DEFAULTS,
                                 NA_APEX_LEGACY_SCALER_DEFAULTS};
    for (int k = 0; k < 3; k++) {
        na_grad_scaler_cfg c = cfgs[k];
        const char *name = na_scaler_kind_name(c.kind);
        c.init_scale = 256, c.growth_interval = 1, c.min_scale = 64, c.max_scale = 1024;
        na_grad_scaler *gs = scaler(c);
        na_tensor *w = param(4, X4);
        na_optim *opt = sgd_on(w, 0.0, 0);
        for (int i = 0; i < 6; i++) full_step(gs, opt, w, false);
        cr_assert_eq(stats(gs).scale, 1024.0, "%s: grew to %g past max_scale", name,
                     stats(gs).scale);
        for (int i = 0; i < 6; i++) full_step(gs, opt, w, true);
        cr_assert_eq(stats(gs).scale, 64.0, "%s: fell to %g below min_scale", name,
                     stats(gs).scale);
        TH_EXPECT_STATUS(na_grad_scaler_update_to(gs, 2048), NA_EINVAL, "max_scale");
        TH_EXPECT_STATUS(na_grad_scaler_update_to(gs, 32), NA_EINVAL, "min_scale");
        cr_assert_eq(stats(gs).scale, 64.0);
        na_optim_free(opt);
        na_tensor_free(w);
        na_grad_scaler_free(gs);
    }
    na_grad_scaler_cfg fixed[] = {NA_STATIC_SCALER(2048.0), NA_GRAD_SCALER_FIXED(2048.0)};
    for (int k = 0; k < 2; k++) {
        na_grad_scaler_cfg c = fixed[k];
        c.max_scale = 1024;
        TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "max_scale");
        c.max_scale = 0, c.min_scale = 4096;
        TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "min_scale");
        c.min_scale = 0, c.init_scale = NA_GRAD_SCALER_FLOOR / 2;
        TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "floor");
    }
    na_grad_scaler_cfg c = NA_GRAD_SCALER_DEFAULTS;
    c.min_scale = 1e-10; /* below the floor */
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "min_scale");
    c.min_scale = 8, c.max_scale = 4;
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "min_scale");
}

/* The PyTorch-style fixed scale: a GradScaler whose growth and backoff are 1. It skips a step
 * whose gradients hold an inf or NaN (the weights stay finite) and its scale never moves,
 * unlike the static (Apex) scaler, which applies the inf. */
Test(amp_scaler, fixed_grad_scaler_skips_overflows_and_keeps_its_scale) {
    na_grad_scaler_cfg c = NA_GRAD_SCALER_FIXED(128.0);
    cr_assert_eq(c.kind, NA_SCALER_GRAD);
    cr_assert_eq(c.growth_factor, 1.0);
    cr_assert_eq(c.backoff_factor, 1.0);
    na_grad_scaler *gs = scaler(c);
    cr_assert_eq(na_grad_scaler_kind(gs), NA_SCALER_GRAD);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.5, 0);
    full_step(gs, opt, w, false);
    cr_assert_eq(na_get(w, 0), 0.5 - 0.5 * 0.5, "a clean step is taken");
    float before[4];
    TH_RC(na_copy_to_host(w, before));
    full_step(gs, opt, w, true);
    for (int j = 0; j < 4; j++)
        cr_assert_eq(na_get(w, j), before[j], "parameter %d moved on an overflow", j);
    cr_assert_eq(stats(gs).skipped, 1);
    cr_assert_eq(stats(gs).scale, 128.0, "no backoff");
    for (int i = 0; i < 5; i++) full_step(gs, opt, w, i % 2 == 0);
    cr_assert_eq(stats(gs).scale, 128.0, "never moves: %g", stats(gs).scale);
    cr_assert_eq(stats(gs).skipped, 4);
    /* one factor of 1 alone is still PyTorch's error */
    c.backoff_factor = 0.5;
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "The growth factor must be > 1.0");
    c = (na_grad_scaler_cfg)NA_GRAD_SCALER_FIXED(128.0);
    c.growth_factor = 2.0;
    TH_EXPECT_ERROR(na_grad_scaler_new(&c), NA_EINVAL, "The backoff factor must be < 1.0");
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* ---- the GradScaler contract ----------------------------------------------------------------- */

Test(amp_scaler, unscale_twice_or_after_step_is_an_error) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.1, 0);
    backward_scaled(gs, w, false);
    TH_RC(na_grad_scaler_unscale_(gs, opt));
    th_expect(w->grad, TH_V(0.5, -1, 2, 0.25), 4, 0, 0, "unscaled grads");
    TH_EXPECT_STATUS(na_grad_scaler_unscale_(gs, opt), NA_ESTATE,
                     "unscale_() has already been called on this optimizer since the last "
                     "update().");
    TH_RC(na_grad_scaler_step(gs, opt)); /* knows not to unscale again */
    TH_EXPECT_STATUS(na_grad_scaler_unscale_(gs, opt), NA_ESTATE,
                     "unscale_() is being called after step().");
    TH_EXPECT_STATUS(na_grad_scaler_step(gs, opt), NA_ESTATE,
                     "step() has already been called since the last update().");
    TH_RC(na_grad_scaler_update(gs));
    TH_EXPECT_STATUS(na_grad_scaler_update(gs), NA_ESTATE, "No inf checks were recorded");
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

Test(amp_scaler, calls_before_scale_are_errors) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.1, 0);
    TH_EXPECT_STATUS(na_grad_scaler_unscale_(gs, opt), NA_ESTATE, "Attempted unscale_ but _scale "
                     "is None");
    TH_EXPECT_STATUS(na_grad_scaler_step(gs, opt), NA_ESTATE, "Attempted step");
    TH_EXPECT_STATUS(na_grad_scaler_update(gs), NA_ESTATE, "Attempted update");
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

Test(amp_scaler, f16_gradients_are_refused) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_tensor *w = na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(4));
    TH_RC(na_tensor_set_requires_grad(w, true));
    na_optim *opt = sgd_on(w, 0.1, 0);
    na_tensor *loss = TH_OK(na_sum(w));
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, loss)), NULL));
    cr_assert_eq(w->grad->dtype, NA_DTYPE_F16);
    TH_EXPECT_STATUS(na_grad_scaler_unscale_(gs, opt), NA_EDTYPE,
                     "Attempting to unscale FP16 gradients.");
    TH_EXPECT_STATUS(na_grad_scaler_step(gs, opt), NA_EDTYPE, "Attempting to unscale FP16");
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* A skipped step changes nothing: parameters, moments, step counts (Adam). */
Test(amp_scaler, skipped_step_leaves_params_and_state) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_tensor *w = param(4, X4);
    na_adam_cfg ac = NA_ADAM_DEFAULTS;
    ac.lr = 0.01;
    na_optim *opt = na_adam_new(NA_NO_TENSORS, &ac);
    cr_assert_eq(na_optim_add_group(opt, NA_TENSORS(w)), 0);
    full_step(gs, opt, w, false);
    na_named_tensors st = {0};
    TH_RC(na_optim_state(opt, "", &st));
    float before[4][4], after[4][4], wb[4], wa[4];
    TH_RC(na_copy_to_host(w, wb));
    for (int64_t i = 0; i < st.n && i < 4; i++)
        TH_RC(na_copy_to_host(st.items[i].tensor, before[i]));
    double scale = na_grad_scaler_get_scale(gs);
    full_step(gs, opt, w, true);
    TH_RC(na_copy_to_host(w, wa));
    for (int64_t i = 0; i < st.n && i < 4; i++)
        TH_RC(na_copy_to_host(st.items[i].tensor, after[i]));
    cr_assert(!memcmp(wa, wb, sizeof wa), "the parameters changed");
    for (int64_t i = 0; i < st.n && i < 4; i++)
        cr_assert(!memcmp(before[i], after[i], (size_t)st.items[i].tensor->numel * 4),
                  "%s changed", st.items[i].name);
    cr_assert_eq(na_grad_scaler_get_scale(gs), scale * 0.5);
    na_named_tensors_free(&st);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* test_grad_scaling_multiple: two optimizers, one sees an inf: it skips, the other steps, the
 * scale backs off once. */
Test(amp_scaler, two_optimizers_one_overflowing) {
    na_grad_scaler *gs = scaler((na_grad_scaler_cfg){.kind = NA_SCALER_GRAD, .init_scale = 128,
                                                     .growth_factor = 2, .backoff_factor = 0.5,
                                                     .growth_interval = 1, .enabled = true});
    na_tensor *a = param(4, X4), *b = param(4, X4);
    na_optim *oa = sgd_on(a, 0.5, 0), *ob = sgd_on(b, 0.5, 0);
    na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(4), 0.5, -1, 2, 0.25);
    na_tensor *la = TH_OK(na_sum(TH_OK(na_mul(a, x)))), *lb = TH_OK(na_sum(TH_OK(na_mul(b, x))));
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, la)), NULL)); /* two losses */
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, lb)), NULL));
    TH_RC(na_fill_(a->grad, INFINITY));
    TH_RC(na_grad_scaler_unscale_(gs, ob)); /* unscale_ chosen per optimizer */
    TH_RC(na_grad_scaler_step(gs, oa));
    TH_RC(na_grad_scaler_step(gs, ob));
    TH_RC(na_grad_scaler_update(gs));
    th_expect(a, TH_V(0.5, -1, 2, 0.25), 4, 0, 0, "a skipped");
    th_expect(b, TH_V(0.25, -0.5, 1, 0.125), 4, 0, 0, "b stepped");
    cr_assert_eq(na_item(na_grad_scaler_found_inf(gs, oa)), 1.0);
    cr_assert_eq(na_item(na_grad_scaler_found_inf(gs, ob)), 0.0);
    cr_assert_eq(na_grad_scaler_get_scale(gs), 64.0, "backed off once");
    cr_assert_eq(stats(gs).skipped, 1);
    na_optim_free(oa);
    na_optim_free(ob);
    na_tensor_free(a);
    na_tensor_free(b);
    na_grad_scaler_free(gs);
}

/* Clipping after unscale_: clip sees true gradients; step does not unscale again. */
Test(amp_scaler, clipping_after_unscale) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 1.0, 0);
    backward_scaled(gs, w, false);
    TH_RC(na_grad_scaler_unscale_(gs, opt));
    na_tensor *norm = TH_OK(na_optim_clip_grad_norm(opt, 1.0));
    double n = sqrt(0.25 + 1 + 4 + 0.0625);
    cr_assert(fabs(na_item(norm) - n) < 1e-6, "norm %g, expected %g", na_item(norm), n);
    float coef = (float)(1.0 / (n + 1e-6));
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    for (int i = 0; i < 4; i++) {
        double g = (double)(X4[i] * coef);
        cr_assert(fabs(na_get(w, i) - (X4[i] - g)) < 1e-6, "param %d: %g", i, na_get(w, i));
    }
    /* with an inf the norm is inf and the step is skipped anyway */
    backward_scaled(gs, w, true);
    TH_RC(na_grad_scaler_unscale_(gs, opt));
    cr_assert(!isfinite(na_item(TH_OK(na_optim_clip_grad_norm(opt, 1.0)))));
    float before[4];
    TH_RC(na_copy_to_host(w, before));
    TH_RC(na_grad_scaler_step(gs, opt));
    for (int i = 0; i < 4; i++) cr_assert_eq(na_get(w, i), before[i]);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* test_grad_scaling_accumulation: several backward calls, one step. */
Test(amp_scaler, accumulation_over_two_losses) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.25, 0);
    backward_scaled(gs, w, false);
    backward_scaled(gs, w, false);
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    th_expect(w, TH_V(0.5 - 0.25, -1 + 0.5, 2 - 1, 0.25 - 0.125), 4, 0, 0, "two losses");
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

Test(amp_scaler, disabled_is_transparent) {
    na_grad_scaler_cfg c = NA_GRAD_SCALER_DEFAULTS;
    c.enabled = false;
    na_grad_scaler *gs = scaler(c);
    na_tensor *w = param(4, X4);
    na_optim *opt = sgd_on(w, 0.5, 0);
    na_tensor *loss = TH_OK(na_sum(w));
    cr_assert_eq(na_grad_scaler_scale(gs, loss), loss);
    cr_assert_eq(na_grad_scaler_get_scale(gs), 1.0);
    cr_assert_eq(na_grad_scaler_kind(gs), NA_SCALER_STATIC, "acts as a static scale of 1");
    cr_assert_null(na_grad_scaler_scale_tensor(gs));
    TH_RC(na_backward(loss, NULL));
    TH_RC(na_grad_scaler_unscale_(gs, opt));
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    cr_assert_eq(na_get(w, 0), 0.0);
    na_named_tensors st = {0};
    TH_RC(na_grad_scaler_state(gs, "", &st));
    cr_assert_eq(st.n, 0);
    na_named_tensors_free(&st);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* Save mid-run (scaler + optimizer + params), load into fresh objects, continue: identical. */
Test(amp_scaler, save_load_mid_run_continues_identically) {
    const char *path = "amp_scaler_ckpt.safetensors";
    na_grad_scaler_cfg c = {.kind = NA_SCALER_GRAD, .init_scale = 256, .growth_factor = 2,
                            .backoff_factor = 0.5, .growth_interval = 3, .enabled = true};
    bool inf[12] = {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
    double scale_a[12], scale_b[12];
    float wa[4], wb[4];
    /* run A: 12 steps, saving after step 5 */
    {
        na_grad_scaler *gs = scaler(c);
        na_tensor *w = param(4, X4);
        na_optim *opt = sgd_on(w, 0.125, 0.9);
        for (int i = 0; i < 12; i++) {
            full_step(gs, opt, w, inf[i]);
            scale_a[i] = na_grad_scaler_get_scale(gs);
            if (i == 4) {
                na_checkpoint *ck = na_checkpoint_new();
                na_named_tensors st = {0};
                TH_RC(na_grad_scaler_state(gs, "scaler.", &st));
                TH_RC(na_optim_state(opt, "optim.", &st));
                TH_RC(na_named_tensors_add(&st, w, "w"));
                TH_RC(na_checkpoint_add_list(ck, &st));
                TH_RC(na_checkpoint_save(ck, path));
                na_named_tensors_free(&st);
                na_checkpoint_free(ck);
            }
        }
        TH_RC(na_copy_to_host(w, wa));
        na_optim_free(opt);
        na_tensor_free(w);
        na_grad_scaler_free(gs);
    }
    /* run B: fresh objects, load, steps 5..11 */
    {
        na_grad_scaler *gs = scaler((na_grad_scaler_cfg)NA_GRAD_SCALER_DEFAULTS); /* overwritten */
        na_tensor *w = param(4, (float[]){0, 0, 0, 0});
        na_optim *opt = sgd_on(w, 0.125, 0.9);
        na_checkpoint *ck = na_checkpoint_load(path);
        cr_assert_not_null(ck, "%s", na_last_error());
        na_named_tensors st = {0};
        TH_RC(na_grad_scaler_state(gs, "scaler.", &st));
        TH_RC(na_optim_state(opt, "optim.", &st));
        TH_RC(na_named_tensors_add(&st, w, "w"));
        TH_RC(na_checkpoint_copy_list(ck, &st, true));
        na_named_tensors_free(&st);
        na_checkpoint_free(ck);
        cr_assert_eq(na_grad_scaler_get_scale(gs), scale_a[4]);
        for (int i = 5; i < 12; i++) {
            full_step(gs, opt, w, inf[i]);
            scale_b[i] = na_grad_scaler_get_scale(gs);
            cr_assert_eq(scale_b[i], scale_a[i], "step %d: scale %g vs %g", i, scale_b[i],
                         scale_a[i]);
        }
        TH_RC(na_copy_to_host(w, wb));
        cr_assert(!memcmp(wa, wb, sizeof wa), "parameters differ after resuming");
        cr_assert_eq(stats(gs).skipped, 2);
        na_optim_free(opt);
        na_tensor_free(w);
        na_grad_scaler_free(gs);
    }
    remove(path);
}

/* The state list hands out the live tensors: bad values written through it (a hostile or
 * mismatched checkpoint) are refused at the next scale(), before any step uses them. */
Test(amp_scaler, state_written_through_the_list_is_checked_at_the_next_scale) {
    struct {
        const char *name;
        double value;
        const char *msg;
    } cases[] = {
        {"scale", 0.0, "the scale must be > 0"},
        {"scale", NAN, "the scale must be > 0"},
        {"scale", 1e9, "above max_scale"},
        {"kind", 9, "unknown scaler kind 9"},
        {"growth_factor", 0.5, "growth factor must be > 1.0"},
        {"growth_interval", 2.5, "growth interval must be an integer"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        na_grad_scaler *gs = scaler((na_grad_scaler_cfg)NA_APEX_SCALER_DEFAULTS); /* max 2^24 */
        na_tensor *w = param(4, X4);
        na_named_tensors st = {0};
        TH_RC(na_grad_scaler_state(gs, "s.", &st));
        char name[64];
        snprintf(name, sizeof name, "s.%s", cases[k].name);
        na_tensor *t = na_named_tensors_find(&st, name);
        cr_assert_not_null(t, "%s", name);
        double orig = na_item(t);
        TH_RC(na_fill_(t, cases[k].value));
        cr_assert_null(na_grad_scaler_scale(gs, TH_OK(na_sum(w))), "%s = %g", name,
                       cases[k].value);
        cr_assert_eq(na_last_status(), NA_EINVAL);
        cr_assert(strstr(na_last_error(), cases[k].msg), "%s", na_last_error());
        cr_assert(strstr(na_last_error(), "as loaded or set"), "%s", na_last_error());
        TH_RC(na_fill_(t, orig)); /* the value as it was: accepted */
        TH_OK(na_grad_scaler_scale(gs, TH_OK(na_sum(w))));
        na_named_tensors_free(&st);
        na_tensor_free(w);
        na_grad_scaler_free(gs);
        na_step_end();
    }
}

Test(amp_scaler, state_names) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_named_tensors st = {0};
    TH_RC(na_grad_scaler_state(gs, "", &st));
    const char *want[] = {"scale", "_growth_tracker", "last_overflow_iter", "updates",
                          "skipped_steps", "kind", "growth_factor", "backoff_factor",
                          "growth_interval", "min_scale", "max_scale"};
    cr_assert_eq(st.n, 11);
    for (int i = 0; i < 11; i++) cr_assert_str_eq(st.items[i].name, want[i]);
    cr_assert_eq(na_item(na_named_tensors_find(&st, "scale")), 65536.0);
    cr_assert_eq(na_item(na_named_tensors_find(&st, "growth_interval")), 2000.0);
    na_named_tensors_free(&st);
    na_grad_scaler_free(gs);
}

/* bf16 autocast needs no scaler, but one still works. */
Test(amp_scaler, works_with_bf16_autocast) {
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 4));
    TH_RC(na_init_uniform_(w, -1, 1));
    TH_RC(na_tensor_set_requires_grad(w, true));
    na_optim *opt = sgd_on(w, 0.1, 0);
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 4), -1, 1));
    TH_RC(na_autocast_begin(NA_DTYPE_BF16));
    na_tensor *y = TH_OK(na_linear(x, w, NULL));
    cr_assert_eq(y->dtype, NA_DTYPE_BF16);
    na_tensor *loss = TH_OK(na_mean(y));
    TH_RC(na_autocast_end());
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, loss)), NULL));
    cr_assert_eq(w->grad->dtype, NA_DTYPE_F32);
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    cr_assert_eq(stats(gs).skipped, 0);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* ---- the unscale kernel ---------------------------------------------------------------------- */

/* test_grad_scaling_unscale / test_multi_tensor_scale: sizes around the CPU chunk, f16 and f32
 * in and out, in place; an inf or NaN at the first, middle or last element sets the flag; the
 * flag is never cleared by the kernel. */
Test(amp_scaler, unscale_kernel_sizes_and_flags) {
    const na_backend *be = na_backend_get(NA_DEVICE_CPU);
    cr_assert_not_null(be->amp_unscale);
    int64_t sizes[] = {1, 333, 1023, 1024, 1025, 2049, 33333};
    na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int din = 0; din < 3; din++)
            for (int dout = 0; dout < 3; dout++) {
                int64_t n = sizes[si];
                na_tensor *scale = TH_OK(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 4.0));
                na_tensor *in = TH_OK(na_full(dts[din], NA_DEVICE_CPU, NA_SHAPE(n), 4.0));
                na_tensor *out =
                    din == dout ? in : TH_OK(na_empty(dts[dout], NA_DEVICE_CPU, NA_SHAPE(n)));
                na_tensor *flag = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL));
                const na_view *ins[1] = {&in->view};
                TH_RC(be->amp_unscale(1, ins, (na_view *[]){&out->view}, &scale->view,
                                      &flag->view));
                cr_assert_eq(na_item(flag), 0.0);
                cr_assert_eq(na_get(out, 0), 1.0);
                cr_assert_eq(na_get(out, n - 1), 1.0);
                int64_t where[] = {0, n / 2, n - 1};
                for (int k = 0; k < 3; k++) {
                    na_tensor *bad = TH_OK(na_full(dts[din], NA_DEVICE_CPU, NA_SHAPE(n), 4.0));
                    double v = k == 1 ? NAN : INFINITY;
                    na_tensor *one = TH_OK(na_scalar(dts[din], NA_DEVICE_CPU, v));
                    na_tensor *dst = TH_OK(na_slice(bad, where[k], where[k] + 1));
                    TH_RC(na_copy_(dst, TH_OK(na_reshape(one, NA_SHAPE(1)))));
                    na_tensor *o2 = TH_OK(na_empty(dts[dout], NA_DEVICE_CPU, NA_SHAPE(n)));
                    TH_RC(na_fill_(flag, 0.0));
                    const na_view *b1[1] = {&bad->view};
                    TH_RC(be->amp_unscale(1, b1, (na_view *[]){&o2->view}, &scale->view,
                                          &flag->view));
                    cr_assert_eq(na_item(flag), 1.0, "size %lld, %s at %lld", (long long)n,
                                 k == 1 ? "NaN" : "inf", (long long)where[k]);
                    cr_assert(!isfinite(na_get(o2, where[k])), "the multiply happens anyway");
                    /* a clean pass afterwards leaves the flag set */
                    TH_RC(be->amp_unscale(1, ins, (na_view *[]){&out->view}, &scale->view,
                                          &flag->view));
                    cr_assert_eq(na_item(flag), 1.0);
                }
                na_step_end();
            }
}

Test(amp_scaler, unscale_kernel_f16_into_f32_exact) {
    /* f16 gradients of a scaled loss (value * 1024) come back exactly into f32 masters */
    const na_backend *be = na_backend_get(NA_DEVICE_CPU);
    na_tensor *g = TH_TENSOR(NA_DTYPE_F16, NA_SHAPE(3), 1024 * 0.1, 1024 * -3.0, 65504);
    na_tensor *m = TH_OK(na_empty(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    na_tensor *scale = TH_OK(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 1024));
    na_tensor *flag = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL));
    const na_view *in[1] = {&g->view};
    TH_RC(be->amp_unscale(1, in, (na_view *[]){&m->view}, &scale->view, &flag->view));
    th_expect(m, TH_V(th_round_f16(102.4) / 1024, -3.0, 65504.0 / 1024), 3, 0, 0, "unscaled");
    cr_assert_eq(na_item(flag), 0.0);
}

/* ---- the divergence watch ------------------------------------------------------------------ */

/* na_amp_note_nonfinite keeps the first step whose loss was inf or NaN, whatever follows; a
 * huge but finite f64 is finite; a NaN deep inside a large f16 tensor is found. */
Test(amp_scaler, note_nonfinite_keeps_the_first_bad_step) {
    na_tensor *first = TH_OK(na_zeros(NA_DTYPE_F64, NA_DEVICE_CPU, 0, NULL));
    const double losses[] = {2.3, 1e300, NAN, 1.5, INFINITY, 0.7};
    for (int t = 0; t < 6; t++) {
        na_tensor *loss = TH_OK(na_scalar(NA_DTYPE_F64, NA_DEVICE_CPU, losses[t]));
        TH_RC(na_amp_note_nonfinite(first, loss, t + 1));
        cr_assert_eq(na_item(first), t < 2 ? 0.0 : 3.0, "after step %d: %g", t + 1,
                     na_item(first));
    }
    TH_RC(na_fill_(first, 0));
    na_tensor *big = TH_OK(na_zeros(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(5000)));
    TH_RC(na_amp_note_nonfinite(first, big, 7));
    cr_assert_eq(na_item(first), 0.0);
    TH_RC(na_fill_(TH_OK(na_slice(big, 4321, 4322)), -INFINITY));
    TH_RC(na_amp_note_nonfinite(first, big, 8));
    cr_assert_eq(na_item(first), 8.0);
    /* misuse is an error naming the call */
    na_tensor *f32 = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL));
    cr_assert_eq(na_amp_note_nonfinite(f32, big, 1), NA_EINVAL);
    cr_assert(strstr(na_last_error(), "na_amp_note_nonfinite"), "%s", na_last_error());
    cr_assert_eq(na_amp_note_nonfinite(first, big, 0), NA_EINVAL);
}
