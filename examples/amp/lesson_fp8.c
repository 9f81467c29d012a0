/* Lesson 9 (amp-fp8): why FP8 needs one f32 scale per tensor, and what delayed scaling gets
 * wrong when an amax jumps (see amp_lessons.h). The tensors are a real layer's: the first
 * Linear of the MNIST MLP (examples/common/models.h) at its first step on Fashion-MNIST, its
 * input, its weight and the gradient of its output. Every cast is nanoamp's own (na_cast to
 * f8e4m3 / f8e5m2, PyTorch's rules bit for bit), every scale comes from nanoamp's recipes
 * (nanoamp/fp8.h). */
#include <math.h>
#include <stdlib.h>

#include "../common/models.h"
#include "amp_plot.h"
#include "lesson_internal.h"

/* The first batch of the loss-scaling lesson's runs (same seed and batcher), on the host. */
static int first_batch(const char *dir, float *x, int32_t *y) {
    amp_fashion d;
    if (amp_fashion_load(dir, &d)) return -1;
    na_batcher *b = amp_fashion_batcher(d.train, MLP_BATCH, true);
    int64_t n = 0;
    int rc = b && na_batcher_next(b, x, y, &n) && n == MLP_BATCH ? 0 : -1;
    na_batcher_free(b);
    amp_fashion_free(&d);
    return rc;
}

/* The three tensors of the MLP's first Linear (y = x W^T + b) at the first step, in f32: its
 * input x, its weight W and dL/dy, the output gradient both backward GEMMs take. */
static int first_layer_tensors(const char *dir, amp_fp8_result *r) {
    float *x = malloc((size_t)MLP_BATCH * 784 * sizeof *x);
    int32_t y[MLP_BATCH];
    CHECK(x);
    if (first_batch(dir, x, y)) {
        free(x);
        return -1;
    }
    /* dL/dy comes out of GEMMs: their summation order the same on every CPU (the guide quotes
     * the shares) */
    bool was_reproducible = na_cpu_reproducible();
    na_cpu_set_reproducible(true);
    na_manual_seed(1);
    na_module *net = model_mnist_mlp();
    na_tensor_list p = net ? na_module_parameters(net) : NA_NO_TENSORS;
    int rc = p.n == 4 ? 0 : -1; /* fc1 weight, bias; fc2 weight, bias */
    na_tensor *xt = rc ? NULL : na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(MLP_BATCH, 784), x);
    na_tensor *yt = na_from_host(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(MLP_BATCH), y);
    /* the first Linear's output as a leaf, so that backward leaves dL/dy in its grad */
    na_tensor *h = xt ? na_detach(na_linear(xt, p.items[0], p.items[1])) : NULL;
    if (h && na_tensor_set_requires_grad(h, true)) h = NULL;
    na_tensor *logits = h ? na_linear(na_relu(h), p.items[2], p.items[3]) : NULL;
    na_tensor *loss = logits && yt ? na_cross_entropy(logits, yt, NULL) : NULL;
    if (!loss || na_backward(loss, NULL)) rc = -1;
    const na_tensor *src[AMP_FP8_ROLES] = {xt, rc ? NULL : p.items[0], rc ? NULL : h->grad};
    for (int k = 0; !rc && k < AMP_FP8_ROLES; k++) {
        r->n[k] = src[k]->numel;
        r->values[k] = malloc((size_t)r->n[k] * sizeof(float));
        if (!r->values[k] || na_copy_to_host(src[k], r->values[k])) rc = -1;
    }
    na_cpu_set_reproducible(was_reproducible);
    if (rc) fprintf(stderr, "amp-fp8: the first layer's tensors: %s\n", na_last_error());
    na_step_end();
    na_tensor_free(h);
    na_module_free(net);
    free(x);
    return rc;
}

/* What casting v * scale to dt (then back, divided by the scale) does to n values. */
static int cast_stats(const float *v, int64_t n, double scale, na_dtype dt, amp_fp8_cast *c) {
    *c = (amp_fp8_cast){.scale = scale};
    na_tensor *t = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n), v);
    na_tensor *q = t ? na_cast(na_cast(na_scale(t, scale), dt), NA_DTYPE_F32) : NULL;
    float *back = malloc((size_t)n * sizeof *back);
    int rc = q && back && !na_copy_to_host(q, back) ? 0 : -1;
    double err2 = 0, ref2 = 0;
    int64_t nonzero = 0;
    for (int64_t i = 0; !rc && i < n; i++) {
        double x = v[i], xs = (double)(float)(v[i] * (float)scale);
        if (x == 0) continue;
        nonzero++;
        c->lost += back[i] == 0.0f;
        /* E4M3 clips to 448 what would round above it (beyond 464, 448's rounding range);
         * E5M2 turns it into inf */
        c->saturated += dt == NA_DTYPE_F8E4M3 ? fabs(xs) > 464.0 : isinf(back[i]);
        if (isfinite(back[i])) {
            double d = back[i] / scale - x;
            err2 += d * d;
            ref2 += x * x;
        }
    }
    if (!rc) {
        c->lost /= (double)nonzero;
        c->saturated /= (double)nonzero;
        c->rel_err = ref2 > 0 ? sqrt(err2 / ref2) : NAN;
    }
    free(back);
    na_step_end();
    na_tensor_free(t);
    CHECK_RC(rc);
    return 0;
}

static double amax_of(const float *v, int64_t n) {
    double a = 0;
    for (int64_t i = 0; i < n; i++) a = fmax(a, fabs((double)v[i]));
    return a;
}

/* The jump: the layer's input (v, n values) times factor[t] at step t, cast to E4M3 with the
 * scale the recipe gives; record its amax; update. */
static double jump_factor(int t) { return t == AMP_FP8_JUMP_STEP ? AMP_FP8_JUMP : 1.0; }

static int jump_run(const float *v, int64_t n, na_fp8_recipe_kind kind, amp_fp8_step *out) {
    na_fp8_recipe_cfg cfg = NA_FP8_RECIPE_DEFAULTS;
    if (kind == NA_FP8_RECIPE_CURRENT) cfg = (na_fp8_recipe_cfg)NA_FP8_RECIPE_CURRENT_DEFAULTS;
    na_fp8_scaling *fs = na_fp8_scaling_new(&cfg);
    CHECK(fs);
    float *xt = malloc((size_t)n * sizeof *xt);
    int rc = xt ? 0 : -1;
    double amax = amax_of(v, n);
    amp_fp8_cast prev = {.scale = -1};
    double prev_factor = -1;
    for (int t = 0; !rc && t < AMP_FP8_JUMP_STEPS; t++) {
        double f = jump_factor(t);
        for (int64_t i = 0; i < n; i++) xt[i] = (float)(v[i] * f);
        /* current scaling measures this step's amax before the cast; delayed casts first */
        if (kind == NA_FP8_RECIPE_CURRENT)
            rc = na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, (float)(amax * f));
        double scale = na_fp8_scaling_scale(fs, NA_FP8_INPUT);
        amp_fp8_step *s = &out[t];
        if (scale == prev.scale && f == prev_factor) s->cast = prev; /* same values, same cast */
        else if (!rc) rc = cast_stats(xt, n, scale, NA_DTYPE_F8E4M3, &s->cast);
        s->factor = f;
        if (!rc && kind == NA_FP8_RECIPE_DELAYED)
            rc = na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, (float)(amax * f));
        if (!rc) rc = na_fp8_scaling_update(fs);
        prev = s->cast, prev_factor = f;
    }
    free(xt);
    na_fp8_scaling_free(fs);
    CHECK_RC(rc);
    return 0;
}

static const char *const ROLE_NAMES[AMP_FP8_ROLES] = {"input x", "weight W", "grad dL/dy"};
/* the quotes' keys: one line per tensor and format, one per row of the jump's table */
static const char *const CAST_KEYS[AMP_FP8_ROLES][2] = {
    {"x_e4m3", "x_e5m2"}, {"w_e4m3", "w_e5m2"}, {"dy_e4m3", "dy_e5m2"}};
static const char *const JUMP_KEYS[AMP_FP8_JUMP_ROWS] = {"jump0", "jump1", "jump2", "jump3",
                                                          "jump4", "jump5", "jump6", "jump7"};

int amp_lesson_fp8(const char *data_dir, amp_fp8_result *r) {
    *r = (amp_fp8_result){0};
    if (first_layer_tensors(data_dir, r)) return -1;
    amp_quotes *q = &r->quotes;
    /* 1. each tensor cast as it is and with its own scale fp8_max / amax, in both formats */
    for (int k = 0; k < AMP_FP8_ROLES; k++) {
        r->amax[k] = amax_of(r->values[k], r->n[k]);
        for (int f = 0; f < 2; f++) {
            na_dtype dt = f ? NA_DTYPE_F8E5M2 : NA_DTYPE_F8E4M3;
            double fmax = f ? NA_FP8_E5M2_MAX : NA_FP8_E4M3_MAX;
            if (cast_stats(r->values[k], r->n[k], 1.0, dt, &r->plain[k][f]) ||
                cast_stats(r->values[k], r->n[k], (float)(fmax / r->amax[k]), dt,
                           &r->scaled[k][f]))
                return -1;
        }
    }
    for (int k = 0; k < AMP_FP8_ROLES; k++)
        for (int f = 0; f < 2; f++) {
            const amp_fp8_cast *a = &r->plain[k][f], *b = &r->scaled[k][f];
            char amax[16] = "";
            if (!f) snprintf(amax, sizeof amax, "%.3g", r->amax[k]);
            quote(q, CAST_KEYS[k][f],
                  "%-10s %-6s %9s | %6.1f%% %6.1f%% %8.3f | %9.4g %6.1f%% %8.4f",
                  f ? "" : ROLE_NAMES[k], f ? "e5m2" : "e4m3", amax, 100 * a->lost,
                  100 * a->saturated, a->rel_err, b->scale, 100 * b->lost, b->rel_err);
        }
    /* 2. the amax jump, delayed (max over 1024 steps) against current scaling */
    if (jump_run(r->values[0], r->n[0], NA_FP8_RECIPE_DELAYED, r->delayed) ||
        jump_run(r->values[0], r->n[0], NA_FP8_RECIPE_CURRENT, r->current))
        return -1;
    r->recovered_at = -1;
    for (int t = AMP_FP8_JUMP_STEP + 1; t < AMP_FP8_JUMP_STEPS && r->recovered_at < 0; t++)
        if (r->delayed[t].cast.scale == r->delayed[AMP_FP8_JUMP_STEP - 1].cast.scale)
            r->recovered_at = t;
    int rows[AMP_FP8_JUMP_ROWS] = {0, 1, AMP_FP8_JUMP_STEP - 1, AMP_FP8_JUMP_STEP,
                                   AMP_FP8_JUMP_STEP + 1, AMP_FP8_JUMP_STEP + 2,
                                   r->recovered_at - 1, r->recovered_at};
    for (int i = 0; i < AMP_FP8_JUMP_ROWS; i++) {
        int t = rows[i];
        r->jump_rows[i] = t;
        if (t < 0) continue;
        const amp_fp8_cast *d = &r->delayed[t].cast, *c = &r->current[t].cast;
        quote(q, JUMP_KEYS[i], "%5d %5g | %8.4g %6.2f%% %6.2f%% %8.4f | %8.4g %6.2f%% %8.4f", t,
              r->delayed[t].factor, d->scale, 100 * d->saturated, 100 * d->lost, d->rel_err,
              c->scale, 100 * c->lost, c->rel_err);
    }
    quote(q, "recovered", "the delayed scale is back at step %d, %d steps after the jump",
          r->recovered_at, r->recovered_at - AMP_FP8_JUMP_STEP);
    return 0;
}

void amp_fp8_free(amp_fp8_result *r) {
    for (int k = 0; k < AMP_FP8_ROLES; k++) free(r->values[k]), r->values[k] = NULL;
}

/* h's legend: its label, its scale, and of its nonzero values times the scale the shares that
 * round to 0, stay subnormal and overflow on dt's line (na_amp_hist: rounded as the casts
 * round). */
static int fp8_legend(const amp_hist *h, na_dtype dt, char *text, size_t size) {
    float *v = malloc((size_t)h->n * sizeof *v);
    CHECK(v);
    for (int64_t i = 0; i < h->n; i++) v[i] = (float)(h->values[i] * (float)h->scale);
    na_amp_hist c;
    double max;
    int rc = na_amp_hist_init(&c, dt) || na_amp_hist_add(&c, v, h->n) ||
             na_amp_dtype_range(dt, NULL, NULL, &max);
    free(v);
    CHECK(rc == 0);
    double nz = c.n - c.zero > 0 ? (double)(c.n - c.zero) : 1;
    snprintf(text, size, "%s (x %.4g): of the nonzero values %.1f%% round to 0, %.1f%% are "
             "subnormal, %.1f%% beyond %g", h->label, h->scale, 100 * c.underflow / nz,
             100 * c.subnormal / nz, 100 * c.overflow / nz, max);
    return 0;
}

int amp_fp8_svg(const amp_fp8_result *r, FILE *svg) {
    static const char *const what[AMP_FP8_ROLES] = {"the layer's input x", "its weight W",
                                                    "its output's gradient dL/dy"};
    static const int role[4] = {0, 1, 2, 2}, fmt[4] = {0, 0, 0, 1};
    amp_hist_panel p[4];
    char legend[4][2][192];
    for (int k = 0; k < 4; k++) {
        int q = role[k];
        p[k] = (amp_hist_panel){.format = fmt[k] ? "f8e5m2" : "f8e4m3", .n_hist = 2};
        p[k].h[0] = (amp_hist){.label = what[q], .color = "#d62728", .n = r->n[q],
                               .values = r->values[q], .scale = 1.0};
        p[k].h[1] = (amp_hist){.label = "the same times its scale fp8_max / amax",
                               .color = "#1f77b4", .n = r->n[q], .values = r->values[q],
                               .scale = r->scaled[q][fmt[k]].scale};
        for (int i = 0; i < 2; i++) {
            if (fp8_legend(&p[k].h[i], fmt[k] ? NA_DTYPE_F8E5M2 : NA_DTYPE_F8E4M3,
                           legend[k][i], sizeof legend[k][i]))
                return -1;
            p[k].legend[i] = legend[k][i];
        }
    }
    return amp_plot_hist_panels(svg, "the MNIST MLP's first Linear at its first step on the "
                                "FP8 number lines, as it is and scaled", p, 4);
}

static amp_fp8_result drawn; /* what draw() draws */
static int draw(FILE *svg) { return amp_fp8_svg(&drawn, svg); }

int amp_fp8_run(const char *svg_path) {
    amp_fp8_result *r = &drawn;
    if (amp_lesson_fp8(NULL, r)) {
        fprintf(stderr, "amp-fp8: %s\n", na_last_error());
        amp_fp8_free(r);
        return 1;
    }
    const amp_quotes *q = &r->quotes;
    printf("the MNIST MLP's first Linear (784 -> 256) at its first step, batch %d:\n"
           "its input, its weight and its output's gradient, cast to FP8 as they are (scale 1)\n"
           "and with their own scale fp8_max / amax (lost: nonzero values that became 0;\n"
           "satur.: beyond the format's range, clipped to 448 in E4M3, inf in E5M2;\n"
           "error: relative RMS error of the finite casts)\n\n",
           MLP_BATCH);
    printf("%-10s %-6s %9s | %-24s | %s\n", "tensor", "format", "amax", "scale 1",
           "scale fp8_max / amax");
    printf("%-10s %-6s %9s | %7s %7s %8s | %9s %7s %8s\n", "", "", "", "lost", "satur.",
           "error", "scale", "lost", "error");
    for (int k = 0; k < AMP_FP8_ROLES; k++)
        printf("%s\n%s\n", amp_quote_get(q, CAST_KEYS[k][0]), amp_quote_get(q, CAST_KEYS[k][1]));
    printf("\nthe input times %g at step %d only, cast to E4M3:\ndelayed scaling (history %d, "
           "max) against current scaling\n\n", AMP_FP8_JUMP, AMP_FP8_JUMP_STEP, 1024);
    printf("%5s %5s | %-33s | %s\n", "step", "x", "delayed", "current");
    printf("%5s %5s | %8s %7s %7s %8s | %8s %7s %8s\n", "", "", "scale", "satur.", "lost",
           "error", "scale", "lost", "error");
    for (int i = 0; i < AMP_FP8_JUMP_ROWS; i++) {
        if (i == 2 || i == 6) printf("  ...\n");
        printf("%s\n", amp_quote_get(q, JUMP_KEYS[i]));
    }
    printf("\n%s\n", amp_quote_get(q, "recovered"));
    int rc = svg_path ? amp_write_svg(svg_path, draw) : 0;
    amp_fp8_free(r);
    return rc;
}
