/* Lessons 1 and 1b (amp-formats, amp-underflow): the limits of f16, bf16 and f32, and gradients
 * that underflow to zero in f16 without loss scaling and survive with it (see amp_lessons.h). */
#include <math.h>
#include <string.h>

#include "amp_plot.h"
#include "lesson_internal.h"

/* A layer y = x W^T (x = [[1]], W [8, 1]) whose output gradients are tiny: loss = sum(y * g)
 * with g = 1e-3 ... 1e-10, so dL/dW = g. Under f16 autocast the gradient reaching the f16 layer
 * is g rounded to f16: below 2^-25 it is 0, below 2^-14 it keeps fewer bits. Scaling the loss by
 * 65536 moves g into f16's range; unscaling happens in f32. */

static const double underflow_g[AMP_UNDERFLOW_N] = {1e-3, 1e-4, 1e-5, 1e-6,
                                                    1e-7, 1e-8, 1e-9, 1e-10};

static int underflow_run(bool scaled, double scale, double *grad) {
    na_tensor *w = leaf(NA_DTYPE_F32, NA_SHAPE(AMP_UNDERFLOW_N, 1), 1.0);
    CHECK(w);
    float gv[AMP_UNDERFLOW_N];
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) gv[i] = (float)underflow_g[i];
    na_tensor *x = na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 1));
    na_tensor *g = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, AMP_UNDERFLOW_N), gv);
    CHECK(x && g);
    CHECK_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *y = na_linear(x, w, NULL); /* f16 */
    na_tensor *loss = y ? na_sum(na_mul(y, g)) : NULL;
    CHECK_RC(na_autocast_end());
    CHECK(loss);
    if (scaled) {
        na_grad_scaler_cfg c = NA_GRAD_SCALER_DEFAULTS;
        c.init_scale = scale;
        na_grad_scaler *gs = na_grad_scaler_new(&c);
        na_optim *opt = na_sgd_new(NA_NO_TENSORS, NULL);
        CHECK(gs && opt && na_optim_add_group(opt, NA_TENSORS(w)) == 0);
        CHECK_RC(na_backward(na_grad_scaler_scale(gs, loss), NULL));
        CHECK_RC(na_grad_scaler_unscale_(gs, opt)); /* in f32, on the f32 gradient */
        na_optim_free(opt);
        na_grad_scaler_free(gs);
    } else {
        CHECK_RC(na_backward(loss, NULL));
    }
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) grad[i] = na_get(w->grad, i);
    na_tensor_free(w);
    na_step_end();
    return 0;
}

static void formats(amp_underflow_result *r) {
    r->f16_max = 65504.0;
    r->f16_min_normal = ldexp(1, -14);
    r->f16_min_subnormal = ldexp(1, -24);
    r->f16_eps = ldexp(1, -10);
    r->bf16_max = ldexp(2 - ldexp(1, -7), 127);
    r->bf16_min_normal = ldexp(1, -126);
    r->bf16_eps = ldexp(1, -7);
    const na_dtype H = NA_DTYPE_F16, B = NA_DTYPE_BF16;
    r->formats_checked =
        round_trip(H, r->f16_max) == r->f16_max && isinf(round_trip(H, 65520.0)) &&
        round_trip(H, r->f16_min_normal) == r->f16_min_normal &&
        round_trip(H, r->f16_min_subnormal) == r->f16_min_subnormal &&
        round_trip(H, ldexp(1, -25)) == 0 && round_trip(H, 1 + r->f16_eps) == 1 + r->f16_eps &&
        round_trip(H, 1 + r->f16_eps / 2) == 1 && round_trip(B, r->bf16_max) == r->bf16_max &&
        round_trip(B, r->bf16_min_normal) == r->bf16_min_normal &&
        round_trip(B, 1 + r->bf16_eps) == 1 + r->bf16_eps &&
        round_trip(B, 1 + r->bf16_eps / 2) == 1;
    na_step_end();
    amp_quotes *q = &r->quotes;
    quote(q, "fmt_max", "largest finite        %-12.6g %-12.6g %-12.6g", r->f16_max, r->bf16_max,
          (double)3.40282346638528859812e+38);
    quote(q, "fmt_min_normal", "smallest normal       %-12.6g %-12.6g %-12.6g", r->f16_min_normal,
          r->bf16_min_normal, ldexp(1, -126));
    quote(q, "fmt_min_sub", "smallest subnormal    %-12.6g %-12.6g %-12.6g", r->f16_min_subnormal,
          ldexp(1, -133), ldexp(1, -149));
    quote(q, "fmt_eps", "spacing at 1.0        %-12.6g %-12.6g %-12.6g", r->f16_eps, r->bf16_eps,
          ldexp(1, -23));
}

/* Where v lands in f16: "0" (below half the smallest subnormal), "subnormal" or "normal". */
static const char *f16_zone(const amp_underflow_result *r, double v) {
    v = fabs(v);
    return v >= r->f16_min_normal ? "normal" : v > r->f16_min_subnormal / 2 ? "subnormal" : "0";
}

int amp_lesson_formats(amp_underflow_result *r) {
    *r = (amp_underflow_result){.scale = 65536.0};
    formats(r);
    return 0;
}

int amp_formats_svg(FILE *svg) {
    return amp_plot_formats(svg, "f32, f16, bf16 and FP8 on one log2 axis: where each magnitude "
                                 "lands");
}

int amp_lesson_underflow(amp_underflow_result *r) {
    amp_lesson_formats(r);
    if (underflow_run(false, 0, r->plain) || underflow_run(true, r->scale, r->scaled)) return -1;
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) {
        r->truth[i] = (float)underflow_g[i];
        if (r->plain[i] == 0) r->zeros_plain++;
        else r->max_rel_err_plain = fmax(r->max_rel_err_plain, fabs(r->plain[i] / r->truth[i] - 1));
        if (r->scaled[i] == 0) r->zeros_scaled++;
        else
            r->max_rel_err_scaled =
                fmax(r->max_rel_err_scaled, fabs(r->scaled[i] / r->truth[i] - 1));
        r->normal_scaled += !strcmp(f16_zone(r, r->truth[i] * r->scale), "normal");
    }
    amp_quotes *q = &r->quotes;
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) {
        static const char *keys[AMP_UNDERFLOW_N] = {"row0", "row1", "row2", "row3",
                                                    "row4", "row5", "row6", "row7"};
        quote(q, keys[i], "%-8.0e %-14.6g %-10s %-14.6g %s", r->truth[i], r->plain[i],
              f16_zone(r, r->truth[i]), r->scaled[i], f16_zone(r, r->truth[i] * r->scale));
    }
    quote(q, "zeros_plain", "%d of %d gradients are 0", r->zeros_plain, AMP_UNDERFLOW_N);
    quote(q, "zeros_scaled", "%d of %d gradients are 0", r->zeros_scaled, AMP_UNDERFLOW_N);
    quote(q, "normal_scaled", "%d of %d scaled gradients are normal f16 numbers",
          r->normal_scaled, AMP_UNDERFLOW_N);
    quote(q, "err_plain", "%.0f%%", 100 * r->max_rel_err_plain);
    quote(q, "err_scaled", "%.2f%%", 100 * r->max_rel_err_scaled);
    return 0;
}

int amp_formats_run(const char *svg_path) {
    amp_underflow_result res, *r = &res;
    if (amp_lesson_formats(r)) return 1;
    printf("%-21s %-12s %-12s %s\n", "", "f16", "bf16", "f32");
    printf("%s\n%s\n%s\n%s\n", amp_quote_get(&r->quotes, "fmt_max"),
           amp_quote_get(&r->quotes, "fmt_min_normal"), amp_quote_get(&r->quotes, "fmt_min_sub"),
           amp_quote_get(&r->quotes, "fmt_eps"));
    printf("(checked by casting: %s)\n\n", r->formats_checked ? "ok" : "MISMATCH");
    return svg_path ? amp_write_svg(svg_path, amp_formats_svg) : 0;
}

int amp_underflow_run(const char *unused) {
    (void)unused;
    amp_underflow_result res, *r = &res;
    if (amp_lesson_underflow(r)) return 1;
    printf("gradient dL/dW of y = x W^T under f16 autocast (x = 1, loss = sum(y * g))\n\n");
    printf("%-8s %-14s %-10s %-14s %s\n", "true", "f16, no scale", "g in f16",
           "scaled x65536", "g x 65536 in f16");
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) printf("%s\n", r->quotes.q[4 + i].text);
    printf("\nwithout scaling: %s (largest error of the rest: %s)\n",
           amp_quote_get(&r->quotes, "zeros_plain"), amp_quote_get(&r->quotes, "err_plain"));
    printf("with scaling:    %s (largest error: %s); %s\n",
           amp_quote_get(&r->quotes, "zeros_scaled"), amp_quote_get(&r->quotes, "err_scaled"),
           amp_quote_get(&r->quotes, "normal_scaled"));
    return 0;
}
