/* The experiments of docs/mixed-precision.md (see amp_lessons.h). Each runs the library's
 * real code path and records the numbers the guide quotes. */
#include "amp_lessons.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "amp_plot.h"

#define CHECK(expr)                                                                      \
    do {                                                                                 \
        if (!(expr)) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,         \
                    na_last_error());                                                    \
            return -1;                                                                   \
        }                                                                                \
    } while (0)
#define CHECK_RC(expr) CHECK((expr) == NA_OK)

static void vquote(amp_quotes *qs, const char *key, double rel, const char *fmt, va_list ap) {
    if (qs->n == AMP_MAX_QUOTES) return;
    amp_quote *q = &qs->q[qs->n++];
    q->key = key;
    q->rel = rel;
    vsnprintf(q->text, sizeof q->text, fmt, ap);
    size_t n = strlen(q->text); /* no trailing blanks: the guide quotes these lines as they are */
    while (n && q->text[n - 1] == ' ') q->text[--n] = '\0';
}

static void quote(amp_quotes *qs, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vquote(qs, key, 0, fmt, ap);
    va_end(ap);
}

/* A line of training results: its numbers vary a little with the CPU's BLAS kernels. */
static void quote_approx(amp_quotes *qs, const char *key, double rel, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vquote(qs, key, rel, fmt, ap);
    va_end(ap);
}

const char *amp_quote_get(const amp_quotes *qs, const char *key) {
    for (int i = 0; i < qs->n; i++)
        if (!strcmp(qs->q[i].key, key)) return qs->q[i].text;
    return "";
}

static na_tensor *leaf(na_dtype dt, int ndim, const int64_t *shape, double fill) {
    na_tensor *t = na_tensor_new(dt, NA_DEVICE_CPU, ndim, shape);
    if (!t || na_fill_(t, fill) || na_tensor_set_requires_grad(t, true)) {
        na_tensor_free(t);
        return NULL;
    }
    return t;
}

/* ==== 1. underflow ============================================================================ */
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

/* v stored as dt and read back. */
static double round_trip(na_dtype dt, double v) {
    na_tensor *t = na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, v);
    return t ? na_item(na_cast(t, dt)) : NAN;
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

void amp_formats_print(const amp_underflow_result *r, FILE *out) {
    fprintf(out, "%-21s %-12s %-12s %s\n", "", "f16", "bf16", "f32");
    fprintf(out, "%s\n%s\n%s\n%s\n", amp_quote_get(&r->quotes, "fmt_max"),
            amp_quote_get(&r->quotes, "fmt_min_normal"), amp_quote_get(&r->quotes, "fmt_min_sub"),
            amp_quote_get(&r->quotes, "fmt_eps"));
    fprintf(out, "(checked by casting: %s)\n\n", r->formats_checked ? "ok" : "MISMATCH");
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
    return amp_plot_number_lines(svg, "f16 and bf16: where each magnitude lands", 2, NULL, 0);
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

void amp_underflow_print(const amp_underflow_result *r, FILE *out) {
    fprintf(out, "gradient dL/dW of y = x W^T under f16 autocast (x = 1, loss = sum(y * g))\n\n");
    fprintf(out, "%-8s %-14s %-10s %-14s %s\n", "true", "f16, no scale", "g in f16",
            "scaled x65536", "g x 65536 in f16");
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) fprintf(out, "%s\n", r->quotes.q[4 + i].text);
    fprintf(out, "\nwithout scaling: %s (largest error of the rest: %s)\n",
            amp_quote_get(&r->quotes, "zeros_plain"), amp_quote_get(&r->quotes, "err_plain"));
    fprintf(out, "with scaling:    %s (largest error: %s); %s\n",
            amp_quote_get(&r->quotes, "zeros_scaled"), amp_quote_get(&r->quotes, "err_scaled"),
            amp_quote_get(&r->quotes, "normal_scaled"));
}

/* ==== 2. overflow ============================================================================= */
/* A linear regression y = x w^T trained with f16 autocast and a GradScaler (65536, x2 after 4
 * clean steps, x0.5 on overflow). At step 5 one batch has inputs 1000 times too large: its scaled
 * f16 gradients overflow to inf, the scaler finds it, the optimizer kernel skips the step
 * (weights untouched), the scale halves, and 4 clean steps later it is back. */

int amp_lesson_overflow(amp_overflow_result *r) {
    *r = (amp_overflow_result){.recovered_at = -1};
    na_manual_seed(42);
    na_tensor *w = leaf(NA_DTYPE_F32, NA_SHAPE(1, 4), 0.0);
    CHECK(w);
    na_tensor *w_true = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 4));
    na_tensor *x = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(16, 4));
    CHECK(w_true && x);
    CHECK_RC(na_copy_from_host(w_true, (float[]){0.5f, -0.25f, 0.75f, 1.0f}));
    CHECK_RC(na_init_uniform_(x, -1, 1));
    na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
    gc.growth_interval = 4;
    na_grad_scaler *gs = na_grad_scaler_new(&gc);
    na_sgd_cfg sc = {.lr = 0.5};
    na_optim *opt = na_sgd_new(NA_NO_TENSORS, &sc);
    CHECK(gs && opt && na_optim_add_group(opt, NA_TENSORS(w)) == 0);
    double start = na_grad_scaler_get_scale(gs);
    for (int s = 0; s < AMP_OVERFLOW_STEPS; s++) {
        bool bad = s == AMP_OVERFLOW_BAD_STEP;
        na_tensor *xb = bad ? na_scale(x, 1000.0) : x;
        na_tensor *t = na_linear(xb, w_true, NULL);
        CHECK(xb && t);
        float before[4], after[4];
        CHECK_RC(na_copy_to_host(w, before));
        r->scale_before[s] = na_grad_scaler_get_scale(gs);
        CHECK_RC(na_autocast_begin(NA_DTYPE_F16));
        na_tensor *loss = na_mse_loss(na_linear(xb, w, NULL), t, NA_REDUCTION_MEAN);
        CHECK_RC(na_autocast_end());
        CHECK(loss);
        r->loss[s] = na_item(loss);
        CHECK_RC(na_backward(na_grad_scaler_scale(gs, loss), NULL));
        CHECK_RC(na_grad_scaler_step(gs, opt));
        r->found_inf[s] = na_item(na_grad_scaler_found_inf(gs, opt)) != 0;
        CHECK_RC(na_grad_scaler_update(gs));
        CHECK_RC(na_optim_zero_grad(opt));
        r->scale_after[s] = na_grad_scaler_get_scale(gs);
        CHECK_RC(na_copy_to_host(w, after));
        r->weights_changed[s] = memcmp(before, after, sizeof before) != 0;
        r->skipped += r->found_inf[s];
        if (r->recovered_at < 0 && s > AMP_OVERFLOW_BAD_STEP &&
            r->scale_after[s] >= r->scale_before[AMP_OVERFLOW_BAD_STEP])
            r->recovered_at = s;
        na_step_end();
    }
    na_optim_free(opt);
    na_grad_scaler_free(gs);
    na_tensor_free(w);
    na_tensor_free(w_true);
    na_tensor_free(x);
    amp_quotes *q = &r->quotes;
    static const char *keys[AMP_OVERFLOW_STEPS] = {"row0", "row1", "row2", "row3", "row4",
                                                   "row5", "row6", "row7", "row8", "row9",
                                                   "row10", "row11"};
    for (int s = 0; s < AMP_OVERFLOW_STEPS; s++)
        quote(q, keys[s], "%4d %9.0f %12.6g %6s %8s %9.0f", s, r->scale_before[s], r->loss[s],
              r->found_inf[s] ? "inf" : "-", r->weights_changed[s] ? "stepped" : "SKIPPED",
              r->scale_after[s]);
    quote(q, "skipped", "%d of %d steps skipped", r->skipped, AMP_OVERFLOW_STEPS);
    quote(q, "recovered", "back to %.0f after step %d",
          r->scale_before[AMP_OVERFLOW_BAD_STEP], r->recovered_at);
    quote(q, "start", "%.0f", start);
    return 0;
}

void amp_overflow_print(const amp_overflow_result *r, FILE *out) {
    fprintf(out, "linear regression, f16 autocast, GradScaler(65536, x2 every 4 clean steps, "
                 "x0.5 on inf); step %d's inputs are 1000x too large\n\n", AMP_OVERFLOW_BAD_STEP);
    fprintf(out, "%4s %9s %12s %6s %8s %9s\n", "step", "scale", "loss", "grads", "update",
            "new scale");
    for (int s = 0; s < AMP_OVERFLOW_STEPS; s++) fprintf(out, "%s\n", r->quotes.q[s].text);
    fprintf(out, "\n%s; the scale is %s\n", amp_quote_get(&r->quotes, "skipped"),
            amp_quote_get(&r->quotes, "recovered"));
}

/* ==== 3. trace ================================================================================ */
/* One training step of the MNIST CNN on random input, f16 autocast, traced. */

na_module *amp_mnist_cnn(void) {
    na_conv2d_opts pad1 = {.padding = {1, 1}};
    na_pool2d_opts pool2 = {.kernel = {2, 2}};
    return NA_SEQUENTIAL(na_conv2d_new(1, 32, 3, 3, &pad1, true), na_batch_norm2d_new(32, NULL),
                         na_relu_new(), na_max_pool2d_new(&pool2),
                         na_conv2d_new(32, 64, 3, 3, &pad1, true), na_batch_norm2d_new(64, NULL),
                         na_relu_new(), na_max_pool2d_new(&pool2), na_flatten_new(1),
                         na_linear_new(64 * 7 * 7, 128, true), na_relu_new(),
                         na_linear_new(128, 10, true));
}

static void trace_collect(const na_amp_trace_record *rec, void *ctx) {
    amp_trace_result *r = ctx;
    if (r->n < AMP_TRACE_MAX) r->rec[r->n++] = *rec;
}

int amp_lesson_trace(amp_trace_result *r) {
    memset(r, 0, sizeof *r);
    na_manual_seed(0);
    na_module *net = amp_mnist_cnn();
    CHECK(net);
    na_tensor *x = na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 1, 28, 28), 0, 1);
    na_tensor *labels = na_from_host(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(4),
                                     (int32_t[]){3, 1, 4, 1});
    na_sgd_cfg sc = {.lr = 0.01, .momentum = 0.9};
    na_optim *opt = na_sgd_new(na_module_parameters(net), &sc);
    na_grad_scaler *gs = na_grad_scaler_new(NULL);
    CHECK(x && labels && opt && gs);
    na_amp_trace_mode saved = na_autocast_trace_mode();
    na_autocast_trace_callback(NA_AMP_TRACE_REGIONS, trace_collect, r);
    CHECK_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *loss = na_cross_entropy(na_module_forward(net, x), labels, NULL);
    r->weight_casts = (int)na_autocast_cache_casts();
    CHECK_RC(na_autocast_end());
    na_autocast_trace(saved, NULL);
    CHECK(loss);
    r->loss = na_item(loss);
    CHECK_RC(na_backward(na_grad_scaler_scale(gs, loss), NULL));
    CHECK_RC(na_grad_scaler_step(gs, opt));
    CHECK_RC(na_grad_scaler_update(gs));
    r->scale = na_grad_scaler_get_scale(gs);
    for (int i = 0; i < r->n; i++) {
        const na_amp_trace_record *t = &r->rec[i];
        if (t->op == NA_OP_CAST) r->casts++;
        else if (t->rule == NA_AMP_LOWER) r->lower_ops++;
        else if (t->rule == NA_AMP_FP32 && t->nesting == 0) r->fp32_ops++;
    }
    na_grad_scaler_free(gs);
    na_optim_free(opt);
    na_module_free(net);
    na_step_end();
    amp_quotes *q = &r->quotes;
    quote(q, "lower_ops", "%d ops ran in f16 by the lower rule", r->lower_ops);
    quote(q, "weight_casts", "%d weight casts", r->weight_casts);
    quote(q, "casts", "%d casts in all", r->casts);
    char line[160];
    bool bn = false, ce = false, conv = false, fc = false;
    for (int i = 0; i < r->n; i++) { /* the first line of each op the guide discusses */
        const na_amp_trace_record *t = &r->rec[i];
        na_amp_trace_format(t, line, sizeof line);
        if (t->op == NA_OP_CONV2D && !conv) conv = true, quote(q, "conv2d", "%s", line);
        if (t->op == NA_OP_BATCH_NORM && !bn) bn = true, quote(q, "batch_norm", "%s", line);
        if (t->op == NA_OP_LINEAR && !fc) fc = true, quote(q, "linear", "%s", line);
        if (t->op == NA_OP_CROSS_ENTROPY && !ce) ce = true, quote(q, "cross_entropy", "%s", line);
    }
    return 0;
}

void amp_trace_print(const amp_trace_result *r, FILE *out) {
    fprintf(out, "one training step of the MNIST CNN, f16 autocast (batch of 4 random images)\n\n");
    char line[160];
    for (int i = 0; i < r->n; i++)
        fprintf(out, "amp: %s\n", na_amp_trace_format(&r->rec[i], line, sizeof line));
    fprintf(out, "\n%s, %d by the fp32 rule; %s (%s); loss %.4f, scale after the step %.0f\n",
            amp_quote_get(&r->quotes, "lower_ops"), r->fp32_ops,
            amp_quote_get(&r->quotes, "weight_casts"), amp_quote_get(&r->quotes, "casts"),
            r->loss, r->scale);
}

/* ==== 4. master weights ======================================================================= */
/* A weight at 1.0 receives the same small update (lr 1e-3 x gradient -0.125) 1000 times. Stored
 * in f16 it never moves: 1.25e-4 is less than half the f16 spacing at 1.0 (2^-11), so every rounded
 * sum is 1.0 again; in bf16 (half spacing 2^-8) likewise. The fp16 optimizer adds the updates to
 * an f32 master and copies it to the 16-bit weight, which then moves as the f32 reference does. */

static int master_run(amp_master_result *r, na_dtype dt, int k) {
    na_sgd_cfg sc = {.lr = r->lr};
    /* (a) the 16-bit weight updated in place; (b) the same weight under the fp16 optimizer */
    na_tensor *wa = leaf(dt, NA_SHAPE(1), 1.0), *wb = leaf(dt, NA_SHAPE(1), 1.0);
    na_optim *oa = na_sgd_new(NA_NO_TENSORS, &sc), *ob = na_sgd_new(NA_NO_TENSORS, &sc);
    CHECK(wa && oa && wb && ob && na_optim_add_group(oa, NA_TENSORS(wa)) == 0);
    na_fp16_optimizer *fo = na_fp16_optimizer_new(ob, NA_NO_TENSORS, NULL); /* static scale 1 */
    CHECK(fo && na_fp16_optimizer_add_group(fo, NA_TENSORS(wb)) == 0);
    for (int s = 0; s < r->steps; s++) {
        /* loss = grad * w: dL/dw = grad (in the weight's dtype) */
        CHECK_RC(na_backward(na_scale(na_sum(wa), r->grad), NULL));
        CHECK_RC(na_optim_step(oa, NULL));
        CHECK_RC(na_optim_zero_grad(oa));
        CHECK_RC(na_fp16_optimizer_backward(fo, na_scale(na_sum(wb), r->grad), true));
        CHECK_RC(na_fp16_optimizer_step(fo));
        CHECK_RC(na_fp16_optimizer_zero_grad(fo));
        na_step_end();
    }
    r->weight16[k] = na_get(wa, 0);
    r->master[k] = na_get(na_fp16_optimizer_master(fo, 0), 0);
    r->model[k] = na_get(wb, 0);
    r->half_ulp[k] = ldexp(1.0, dt == NA_DTYPE_F16 ? -11 : -8);
    na_fp16_optimizer_free(fo);
    na_optim_free(oa);
    na_tensor_free(wa);
    na_tensor_free(wb);
    return 0;
}

int amp_lesson_master_weights(amp_master_result *r) {
    *r = (amp_master_result){.steps = 1000, .lr = 1e-3, .grad = -0.125}; /* exact in 16 bits */
    if (master_run(r, NA_DTYPE_F16, AMP_MASTER_F16) || master_run(r, NA_DTYPE_BF16, AMP_MASTER_BF16))
        return -1;
    /* (c) the f32 reference */
    na_sgd_cfg sc = {.lr = r->lr};
    na_tensor *wc = leaf(NA_DTYPE_F32, NA_SHAPE(1), 1.0);
    na_optim *oc = na_sgd_new(NA_NO_TENSORS, &sc);
    CHECK(wc && oc && na_optim_add_group(oc, NA_TENSORS(wc)) == 0);
    for (int s = 0; s < r->steps; s++) {
        CHECK_RC(na_backward(na_scale(na_sum(wc), r->grad), NULL));
        CHECK_RC(na_optim_step(oc, NULL));
        CHECK_RC(na_optim_zero_grad(oc));
        na_step_end();
    }
    r->update = r->lr * fabs((double)(float)r->grad);
    r->f32_reference = na_get(wc, 0);
    na_optim_free(oc);
    na_tensor_free(wc);
    amp_quotes *q = &r->quotes;
    const int H = AMP_MASTER_F16, B = AMP_MASTER_BF16;
    quote(q, "weight16", "16-bit weight updated in place:  %-13.7f %.7f", r->weight16[H],
          r->weight16[B]);
    quote(q, "master", "f32 master weight:               %-13.7f %.7f", r->master[H], r->master[B]);
    quote(q, "model", "16-bit copy of the master:       %-13.10g %.10g", r->model[H], r->model[B]);
    quote(q, "reference", "plain f32 training:              %.7f", r->f32_reference);
    quote(q, "steps", "%d SGD steps of lr %g x gradient %g, an update of %g each", r->steps,
          r->lr, r->grad, r->update);
    quote(q, "half_ulp_f16", "%.11g", r->half_ulp[H]);
    quote(q, "half_ulp_bf16", "%.8g", r->half_ulp[B]);
    return 0;
}

void amp_master_print(const amp_master_result *r, FILE *out) {
    fprintf(out, "a weight at 1.0, %s (half the spacing at 1.0 is 2^-11 = %s in f16, 2^-8 = "
                 "%s in bf16)\n\n", amp_quote_get(&r->quotes, "steps"),
            amp_quote_get(&r->quotes, "half_ulp_f16"), amp_quote_get(&r->quotes, "half_ulp_bf16"));
    fprintf(out, "%-32s %-13s %s\n", "", "f16", "bf16");
    fprintf(out, "%s\n%s\n%s\n%s\n", amp_quote_get(&r->quotes, "weight16"),
            amp_quote_get(&r->quotes, "master"), amp_quote_get(&r->quotes, "model"),
            amp_quote_get(&r->quotes, "reference"));
}

/* ==== 2b. the rule table ====================================================================== */

int amp_rules_print(FILE *out) {
    na_autocast_print_rules(out);
    return ferror(out) ? -1 : NA_OP_COUNT + 1;
}

/* ==== 5. loss scaling in training ============================================================= */
/* An MLP on Fashion-MNIST (amp_lessons.h says which), f32 or f16 autocast, with or without a
 * GradScaler. Everything but the precision and the scaler is the same in every run: seed,
 * initialization, batches, optimizer. */

static const float FASHION_MEAN[1] = {0.2860f}, FASHION_STD[1] = {0.3530f};
enum { MLP_TRAIN_N = 8192, MLP_TEST_N = 2000, MLP_BATCH = 128 };

typedef struct {
    na_dataset *train, *test;
} mlp_data;

static int mlp_data_load(const char *dir, mlp_data *d) {
    if (!dir) dir = getenv("NANOAMP_DATA");
    if (!dir || !*dir) dir = "/usr/share/datasets/fashion-mnist";
    d->train = na_mnist_load(dir, true);
    d->test = d->train ? na_mnist_load(dir, false) : NULL;
    if (!d->test) {
        na_dataset_free(d->train);
        return na_set_error(na_last_status(), "Fashion-MNIST in %s (set NANOAMP_DATA): %s", dir,
                            na_last_error());
    }
    if (d->train->n > MLP_TRAIN_N) d->train->n = MLP_TRAIN_N; /* the first images only */
    if (d->test->n > MLP_TEST_N) d->test->n = MLP_TEST_N;
    return 0;
}

static void mlp_data_free(mlp_data *d) {
    na_dataset_free(d->train);
    na_dataset_free(d->test);
}

typedef struct {
    bool f16;               /* f16 autocast around forward and loss */
    bool scaled;            /* a GradScaler (else a plain step) */
    double loss_factor;     /* the loss is the cross-entropy times this */
    int steps;
    int64_t growth_interval; /* the GradScaler's (0: PyTorch's 2000) */
    const char *log_csv;    /* the monitor's per-step CSV, or NULL */
} mlp_run_cfg;

typedef struct {
    double zero_frac;       /* gradient elements exactly 0 at the first step */
    double first_loss, final_loss, test_acc;
    double first_scale, max_scale, final_scale;
    int64_t skipped;
    int first_skip;
    int64_t n_grads;
    float *grads;           /* the first step's gradients, when asked for (grads != NULL) */
} mlp_run_out;

static double mlp_accuracy(na_module *net, const na_dataset *ds) {
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 1000, .mean = FASHION_MEAN,
                                                          .std = FASHION_STD});
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    int32_t y[1000], pred[1000];
    int64_t n, correct = 0, seen = 0;
    na_no_grad_begin();
    while (x && na_batcher_next(b, x, y, &n)) {
        na_tensor *xt = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n, 1, 28, 28), x);
        na_tensor *am = xt ? na_argmax(na_module_forward(net, xt), 1, false) : NULL;
        if (!am || na_copy_to_host(am, pred)) break;
        for (int64_t i = 0; i < n; i++) correct += pred[i] == y[i];
        seen += n;
        na_step_end();
    }
    na_no_grad_end();
    free(x);
    na_batcher_free(b);
    return seen == ds->n ? (double)correct / (double)seen : NAN;
}

static int mlp_run(const mlp_data *d, const mlp_run_cfg *c, mlp_run_out *o, bool keep_grads) {
    *o = (mlp_run_out){.first_skip = -1};
    na_manual_seed(1);
    na_module *net = NA_SEQUENTIAL(na_flatten_new(1), na_linear_new(784, 256, true),
                                   na_relu_new(), na_linear_new(256, 10, true));
    na_adam_cfg ac = NA_ADAM_DEFAULTS;
    na_optim *opt = net ? na_adam_new(na_module_parameters(net), &ac) : NULL;
    na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
    gc.enabled = c->scaled;
    if (c->growth_interval) gc.growth_interval = c->growth_interval;
    na_grad_scaler *gs = na_grad_scaler_new(&gc);
    na_batcher *b = na_batcher_new(d->train, &(na_batcher_cfg){
        .batch_size = MLP_BATCH, .seed = 1, .shuffle = true, .drop_last = true,
        .mean = FASHION_MEAN, .std = FASHION_STD});
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    na_amp_monitor *mon = c->log_csv ? na_amp_monitor_new(NULL) : NULL;
    int rc = opt && gs && x && (!c->log_csv || mon) ? 0 : -1;
    if (!rc && mon) rc = na_amp_monitor_open_csv(mon, c->log_csv);
    int32_t y[MLP_BATCH];
    int64_t n, zeros = 0, total = 0;
    double tail = 0;
    int tail_n = 0;
    for (int64_t epoch = 0, s = 0; !rc && s < c->steps; epoch++) {
        na_batcher_start_epoch(b, epoch);
        while (!rc && s < c->steps && na_batcher_next(b, x, y, &n)) {
            na_tensor *xt = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n, 1, 28, 28), x);
            na_tensor *yt = na_from_host(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(n), y);
            if (c->f16 && (rc = na_autocast_begin(NA_DTYPE_F16))) break;
            na_tensor *ce = xt && yt ? na_cross_entropy(na_module_forward(net, xt), yt, NULL)
                                     : NULL;
            if (c->f16) na_autocast_end();
            na_tensor *loss = ce ? na_scale(ce, c->loss_factor) : NULL;
            double scale = na_grad_scaler_is_enabled(gs) ? na_grad_scaler_get_scale(gs) : 1.0;
            if (!loss || na_backward(na_grad_scaler_scale(gs, loss), NULL) ||
                (c->scaled && na_grad_scaler_unscale_(gs, opt))) {
                rc = -1;
                break;
            }
            if (s == 0) { /* the gradients the optimizer is about to see (unscaled, f32) */
                o->first_scale = scale;
                for (int64_t i = 0; i < na_optim_num_params(opt); i++)
                    o->n_grads += na_optim_param(opt, i)->grad->numel;
                float *g = malloc((size_t)o->n_grads * sizeof *g);
                if (!g) rc = na_set_error(NA_ENOMEM, "mlp_run: %lld gradients",
                                          (long long)o->n_grads);
                for (int64_t i = 0, off = 0; !rc && i < na_optim_num_params(opt); i++) {
                    const na_tensor *gi = na_optim_param(opt, i)->grad;
                    rc = na_copy_to_host(gi, g + off);
                    off += gi->numel;
                }
                for (int64_t j = 0; !rc && j < o->n_grads; j++) zeros += g[j] == 0.0f;
                total = o->n_grads;
                if (keep_grads) o->grads = g;
                else free(g);
                if (rc) break;
            }
            double ce_value = na_item(ce);
            if (na_grad_scaler_step(gs, opt) || na_grad_scaler_update(gs) ||
                na_optim_zero_grad(opt)) {
                rc = -1;
                break;
            }
            if (mon) na_amp_monitor_record_scaler(mon, s, loss, gs);
            na_grad_scaler_stats st = {.scale = 1.0};
            if (na_grad_scaler_is_enabled(gs) && na_grad_scaler_stats_get(gs, &st)) {
                rc = -1;
                break;
            }
            if (st.skipped > o->skipped && o->first_skip < 0) o->first_skip = (int)s;
            o->skipped = st.skipped;
            o->max_scale = fmax(o->max_scale, st.scale);
            if (s == 0) o->first_loss = ce_value;
            if (s >= c->steps - 20) tail += ce_value, tail_n++;
            s++;
            na_step_end();
        }
    }
    if (!rc) {
        o->zero_frac = total ? (double)zeros / (double)total : NAN;
        o->final_loss = tail / tail_n;
        o->final_scale = na_grad_scaler_is_enabled(gs) ? na_grad_scaler_get_scale(gs) : 1.0;
        o->test_acc = mlp_accuracy(net, d->test);
        if (isnan(o->test_acc)) rc = -1;
    }
    if (rc) fprintf(stderr, "mlp_run: %s\n", na_last_error());
    na_step_end();
    na_amp_monitor_free(mon);
    free(x);
    na_batcher_free(b);
    na_grad_scaler_free(gs);
    na_optim_free(opt);
    na_module_free(net);
    return rc ? -1 : 0;
}

int amp_lesson_loss_scaling(const char *data_dir, amp_loss_scaling_result *r) {
    *r = (amp_loss_scaling_result){.loss_factor = 1e-5, .steps = 200};
    mlp_data d;
    if (mlp_data_load(data_dir, &d)) return -1;
    static const char *names[AMP_RUNS] = {"f32", "f16", "f16s"};
    for (int k = 0; k < AMP_RUNS; k++) {
        mlp_run_cfg c = {.f16 = k != AMP_RUN_F32, .scaled = k == AMP_RUN_F16_SCALED,
                         .loss_factor = r->loss_factor, .steps = r->steps};
        mlp_run_out o;
        if (mlp_run(&d, &c, &o, k == AMP_RUN_F32)) {
            mlp_data_free(&d);
            return -1;
        }
        r->zero_frac[k] = o.zero_frac;
        r->final_loss[k] = o.final_loss;
        r->test_acc[k] = o.test_acc;
        if (k == AMP_RUN_F32) r->grads = o.grads, r->n_grads = o.n_grads;
        if (k == AMP_RUN_F16_SCALED) r->scale = o.first_scale, r->skipped = o.skipped;
    }
    mlp_data_free(&d);
    amp_hist h = {.n = r->n_grads, .values = r->grads, .scale = 1.0};
    double zero;
    amp_hist_f16_shares(&h, &r->zero_share, &r->subnormal_share, &zero);
    h.scale = r->scale;
    amp_hist_f16_shares(&h, &r->zero_share_scaled, &r->subnormal_share_scaled, &zero);
    quote_approx(&r->quotes, "shares", 0.02, "%.1f%% would round to 0 in f16 and %.1f%% be subnormal; times "
          "%.0f: %.1f%% and %.1f%%", 100 * r->zero_share, 100 * r->subnormal_share, r->scale,
          100 * r->zero_share_scaled, 100 * r->subnormal_share_scaled);
    quote(&r->quotes, "setup", "MLP 784-256-10, Adam, Fashion-MNIST (%d train / %d test "
          "images), %d steps of batch %d, loss = cross-entropy x %g", MLP_TRAIN_N, MLP_TEST_N,
          r->steps, MLP_BATCH, r->loss_factor);
    static const char *what[AMP_RUNS] = {"f32", "f16, no scaling", "f16 + GradScaler"};
    for (int k = 0; k < AMP_RUNS; k++) {
        quote_approx(&r->quotes, names[k], 0.02, "%-18s %8.1f%% %12.4f %10.1f%%", what[k],
              100 * r->zero_frac[k], r->final_loss[k], 100 * r->test_acc[k]);
    }
    quote(&r->quotes, "skipped", "the GradScaler skipped %lld of %d steps", (long long)r->skipped,
          r->steps);
    return 0;
}

void amp_loss_scaling_print(const amp_loss_scaling_result *r, FILE *out) {
    fprintf(out, "%s; same seed and batches in every run\n\n", amp_quote_get(&r->quotes, "setup"));
    fprintf(out, "%-18s %9s %12s %11s\n", "run", "grads = 0", "final loss", "test acc");
    fprintf(out, "%s\n%s\n%s\n", amp_quote_get(&r->quotes, "f32"),
            amp_quote_get(&r->quotes, "f16"), amp_quote_get(&r->quotes, "f16s"));
    fprintf(out, "\ngrads = 0: the share of the first step's gradient elements that are exactly 0\n"
                 "final loss: the cross-entropy without the factor, mean of the last 20 steps\n"
                 "%s; its scale at the first step: %.0f\n"
                 "of the first step's true (f32) gradients,\n%s\n",
            amp_quote_get(&r->quotes, "skipped"), r->scale, amp_quote_get(&r->quotes, "shares"));
}

void amp_loss_scaling_free(amp_loss_scaling_result *r) {
    free(r->grads);
    r->grads = NULL;
}

int amp_loss_scaling_svg(const amp_loss_scaling_result *r, FILE *svg) {
    amp_hist h[2] = {
        {.label = "the first step's gradients", .color = "#d62728", .scale = 1.0},
        {.label = "the same, times the loss scale", .color = "#1f77b4", .scale = r->scale},
    };
    for (int i = 0; i < 2; i++) h[i].n = r->n_grads, h[i].values = r->grads;
    char title[128];
    snprintf(title, sizeof title, "gradients of amp-loss-scaling's MLP (loss x %g) on the f16 "
             "number line", r->loss_factor);
    return amp_plot_number_lines(svg, title, 1, h, 2);
}

/* ---- the scale's sawtooth ---------------------------------------------------------------------- */

int amp_lesson_sawtooth(const char *data_dir, const char *csv_path, amp_sawtooth_result *r) {
    *r = (amp_sawtooth_result){.steps = AMP_SAWTOOTH_STEPS};
    mlp_data d;
    if (mlp_data_load(data_dir, &d)) return -1;
    mlp_run_cfg c = {.f16 = true, .scaled = true, .loss_factor = 1.0, .steps = r->steps,
                     .growth_interval = AMP_SAWTOOTH_INTERVAL, .log_csv = csv_path};
    mlp_run_out o;
    int rc = mlp_run(&d, &c, &o, false);
    mlp_data_free(&d);
    if (rc) return -1;
    r->skipped = o.skipped;
    r->max_scale = o.max_scale;
    r->final_scale = o.final_scale;
    r->first_skip = o.first_skip;
    r->first_loss = o.first_loss;
    r->final_loss = o.final_loss;
    quote(&r->quotes, "setup", "the MLP of amp-loss-scaling (loss x 1), f16 autocast, "
          "GradScaler growing x2 every %d clean steps", AMP_SAWTOOTH_INTERVAL);
    quote_approx(&r->quotes, "summary", 0.3, "%lld of %d steps skipped, the first at step %d; "
                 "the scale peaked at 2^%.0f", (long long)r->skipped, r->steps, r->first_skip,
                 log2(r->max_scale));
    quote_approx(&r->quotes, "loss", 0.1, "loss %.3f -> %.3f", r->first_loss, r->final_loss);
    return 0;
}

void amp_sawtooth_print(const amp_sawtooth_result *r, FILE *out) {
    fprintf(out, "\n%s:\n%s\n%s\nfinal scale %.0f\n", amp_quote_get(&r->quotes, "setup"),
            amp_quote_get(&r->quotes, "summary"),
            amp_quote_get(&r->quotes, "loss"), r->final_scale);
}

/* ==== 6. BatchNorm in f32 ===================================================================== */
/* What would go wrong if BatchNorm's statistics lived in f16, each claim computed: a channel's
 * sum of squares, a counter that stops, running statistics that do not move, and eps below
 * f16's normal range. Then nanoamp's batch norm on the same channel in f16, which keeps its
 * statistics in f32. */

static bool f16_is_subnormal(double v) {
    na_tensor *t = na_cast(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, v), NA_DTYPE_F16);
    uint16_t bits = 0xffff;
    if (t) na_copy_to_host(t, &bits);
    return (bits & 0x7fff) != 0 && ((bits >> 10) & 0x1f) == 0;
}

int amp_lesson_batchnorm(amp_batchnorm_result *r) {
    *r = (amp_batchnorm_result){.rs_steps = 100, .rs_target = 1.002};
    const na_dtype F32 = NA_DTYPE_F32, H = NA_DTYPE_F16;
    /* the variance's sums: one channel of 128 x 28 x 28 values of unit variance */
    na_manual_seed(3);
    na_tensor *x = na_randn(F32, NA_DEVICE_CPU, NA_SHAPE(128, 1, 28, 28), 0, 1);
    na_tensor *x16 = x ? na_cast(x, H) : NULL;
    CHECK(x16);
    na_tensor *sq = na_sum(na_mul(x, x)), *sq16 = na_sum(na_mul(x16, x16));
    CHECK(sq && sq16 && sq16->dtype == H); /* outside autocast: f32 accumulation, f16 result */
    r->sumsq_f32 = na_item(sq);
    r->sumsq_f16 = na_item(sq16);
    /* nanoamp's batch norm: f16 input, f32 statistics, weight and bias; against all-f32 */
    na_tensor *out[2];
    for (int k = 0; k < 2; k++) {
        na_tensor *rm = na_zeros(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        na_tensor *rv = na_ones(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        na_tensor *w = na_ones(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        na_tensor *b = na_zeros(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        CHECK(rm && rv && w && b);
        out[k] = na_batch_norm(k ? x16 : x, rm, rv, w, b, true, 0.1, 1e-5);
        CHECK(out[k]);
    }
    CHECK(out[1]->dtype == H);
    na_tensor *err = na_max(na_abs(na_sub(na_cast(out[1], F32), out[0])));
    CHECK(err);
    r->bn_max_err = na_item(err);
    r->bn_finite = isfinite(r->bn_max_err);
    na_step_end();
    /* an f16 accumulator adding one value at a time stops where 1 is below half its spacing */
    double c = 0;
    for (int i = 0; i < AMP_BN_VALUES; i++) {
        na_tensor *next = na_add(na_scalar(H, NA_DEVICE_CPU, c), na_ones(H, NA_DEVICE_CPU, 0, NULL));
        CHECK(next);
        double v = na_item(next);
        na_step_end();
        if (v == c) break;
        c = v;
    }
    r->f16_counter = c;
    /* running mean = 0.9 running + 0.1 batch mean, one rounding to the storage dtype per update
     * (as a fused kernel does), from 1.0 toward batch means of 1.002 */
    double rs[3] = {1, 1, 1};
    const na_dtype dts[3] = {F32, H, NA_DTYPE_BF16};
    for (int s = 0; s < r->rs_steps; s++)
        for (int k = 0; k < 3; k++)
            rs[k] = round_trip(dts[k], (float)(0.9f * (float)rs[k] + 0.1f * (float)r->rs_target));
    r->rs_f32 = rs[0], r->rs_f16 = rs[1], r->rs_bf16 = rs[2];
    /* eps = 1e-5 in f16 */
    r->eps_f16 = round_trip(H, 1e-5);
    r->eps_subnormal = r->eps_f16 < ldexp(1, -14) && f16_is_subnormal(1e-5);
    r->eps_absorbed_f16 = r->eps_absorbed_f32 = NAN;
    for (int e = -30; e <= 30; e++) {
        double v = ldexp(1, e);
        if (isnan(r->eps_absorbed_f16) && round_trip(H, v + r->eps_f16) == v)
            r->eps_absorbed_f16 = v;
        if (isnan(r->eps_absorbed_f32) && (double)(float)(v + (double)1e-5f) == v)
            r->eps_absorbed_f32 = v;
    }
    amp_quotes *q = &r->quotes;
    quote(q, "channel", "one BatchNorm channel of the MNIST CNN: %d values (128 x 28 x 28), "
          "x ~ N(0, 1)", AMP_BN_VALUES);
    quote(q, "sumsq", "sum of x^2 over the channel:  f32 %.6g, stored in f16 %g", r->sumsq_f32,
          r->sumsq_f16);
    quote(q, "counter", "an f16 sum adding 1 at a time stops at %.0f", r->f16_counter);
    quote(q, "running", "running mean after %d updates toward %g:  f32 %.7f  f16 %.7f  bf16 %.7f",
          r->rs_steps, r->rs_target, r->rs_f32, r->rs_f16, r->rs_bf16);
    quote(q, "eps", "eps = 1e-5 in f16: %.6g, %s", r->eps_f16,
          r->eps_subnormal ? "a subnormal (exponent bits 0)" : "NOT subnormal");
    quote(q, "absorbed", "var + eps == var from var = %g in f16 (%g in f32)", r->eps_absorbed_f16,
          r->eps_absorbed_f32);
    quote(q, "bn", "nanoamp's batch norm, f16 input, f32 statistics: largest difference from "
          "f32 %.3g", r->bn_max_err);
    return 0;
}

void amp_batchnorm_print(const amp_batchnorm_result *r, FILE *out) {
    fprintf(out, "%s\n\n", amp_quote_get(&r->quotes, "channel"));
    static const char *keys[] = {"sumsq", "counter", "running", "eps", "absorbed", "bn"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        fprintf(out, "%s\n", amp_quote_get(&r->quotes, keys[i]));
}

/* ==== the programs' arguments ================================================================= */

int amp_lesson_args(int argc, char **argv, const char *usage, const char *opt, bool takes_value,
                    const char **value) {
    if (value) *value = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s", usage);
            return 0;
        }
        if (opt && !strcmp(argv[i], opt) && (!takes_value || i + 1 < argc)) {
            *value = takes_value ? argv[++i] : "";
            continue;
        }
        fprintf(stderr, "%s: unexpected argument '%s'\n%s", argv[0], argv[i], usage);
        return 2;
    }
    return -1;
}

int amp_write_svg(const char *path, int (*draw)(FILE *svg)) {
    FILE *f = fopen(path, "w");
    int rc = f ? draw(f) : -1;
    if (f && fclose(f) != 0) rc = -1;
    if (rc) fprintf(stderr, "cannot write %s\n", path);
    else fprintf(stderr, "wrote %s\n", path);
    return rc ? 1 : 0;
}
