/* The four experiments of docs/mixed-precision.md (see amp_lessons.h). Each runs the library's
 * real code path and records the numbers the guide quotes. */
#include "amp_lessons.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#define CHECK(expr)                                                                      \
    do {                                                                                 \
        if (!(expr)) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,         \
                    na_last_error());                                                    \
            return -1;                                                                   \
        }                                                                                \
    } while (0)
#define CHECK_RC(expr) CHECK((expr) == NA_OK)

static void quote(amp_quotes *qs, const char *key, const char *fmt, ...) {
    if (qs->n == AMP_MAX_QUOTES) return;
    amp_quote *q = &qs->q[qs->n++];
    q->key = key;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->text, sizeof q->text, fmt, ap);
    va_end(ap);
    size_t n = strlen(q->text); /* no trailing blanks: the guide quotes these lines as they are */
    while (n && q->text[n - 1] == ' ') q->text[--n] = '\0';
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
        na_optim *opt = na_sgd_new(NULL, NULL);
        CHECK(gs && opt && na_optim_add_group(opt, 1, &w) == 0);
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

int amp_lesson_underflow(amp_underflow_result *r) {
    *r = (amp_underflow_result){.scale = 65536.0};
    formats(r);
    if (underflow_run(false, 0, r->plain) || underflow_run(true, r->scale, r->scaled)) return -1;
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) {
        r->truth[i] = (float)underflow_g[i];
        if (r->plain[i] == 0) r->zeros_plain++;
        else r->max_rel_err_plain = fmax(r->max_rel_err_plain, fabs(r->plain[i] / r->truth[i] - 1));
        if (r->scaled[i] == 0) r->zeros_scaled++;
        else
            r->max_rel_err_scaled =
                fmax(r->max_rel_err_scaled, fabs(r->scaled[i] / r->truth[i] - 1));
    }
    amp_quotes *q = &r->quotes;
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) {
        static const char *keys[AMP_UNDERFLOW_N] = {"row0", "row1", "row2", "row3",
                                                    "row4", "row5", "row6", "row7"};
        quote(q, keys[i], "%-8.0e %-14.6g %-14.6g", r->truth[i], r->plain[i], r->scaled[i]);
    }
    quote(q, "zeros_plain", "%d of %d gradients are 0", r->zeros_plain, AMP_UNDERFLOW_N);
    quote(q, "zeros_scaled", "%d of %d gradients are 0", r->zeros_scaled, AMP_UNDERFLOW_N);
    quote(q, "err_plain", "%.0f%%", 100 * r->max_rel_err_plain);
    quote(q, "err_scaled", "%.2f%%", 100 * r->max_rel_err_scaled);
    return 0;
}

void amp_underflow_print(const amp_underflow_result *r, FILE *out) {
    fprintf(out, "gradient dL/dW of y = x W^T under f16 autocast (x = 1, loss = sum(y * g))\n\n");
    fprintf(out, "%-8s %-14s %s\n", "true", "f16, no scale", "scaled x65536");
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) fprintf(out, "%s\n", r->quotes.q[4 + i].text);
    fprintf(out, "\nwithout scaling: %s (largest error of the rest: %s)\n",
            amp_quote_get(&r->quotes, "zeros_plain"), amp_quote_get(&r->quotes, "err_plain"));
    fprintf(out, "with scaling:    %s (largest error: %s)\n",
            amp_quote_get(&r->quotes, "zeros_scaled"), amp_quote_get(&r->quotes, "err_scaled"));
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
    na_optim *opt = na_sgd_new(NULL, &sc);
    CHECK(gs && opt && na_optim_add_group(opt, 1, &w) == 0);
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
    na_optim *opt = na_sgd_new(net, &sc);
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
/* A weight at 1.0 receives the same small update (lr 1e-3 x gradient -0.1) 1000 times. Stored
 * in f16 it never moves: 1e-4 is less than half the f16 spacing at 1.0 (2^-11), so every rounded
 * sum is 1.0 again. The fp16 optimizer adds the updates to an f32 master and copies it to the f16
 * weight, which then moves as the f32 reference does. */

int amp_lesson_master_weights(amp_master_result *r) {
    *r = (amp_master_result){.steps = 1000, .lr = 1e-3, .grad = -0.1,
                             .half_ulp = ldexp(1.0, -11)};
    na_sgd_cfg sc = {.lr = r->lr};
    /* (a) the f16 weight updated in place */
    na_tensor *wa = leaf(NA_DTYPE_F16, NA_SHAPE(1), 1.0);
    na_optim *oa = na_sgd_new(NULL, &sc);
    /* (b) the same f16 weight under the fp16 optimizer (f32 master) */
    na_tensor *wb = leaf(NA_DTYPE_F16, NA_SHAPE(1), 1.0);
    na_optim *ob = na_sgd_new(NULL, &sc);
    /* (c) the f32 reference */
    na_tensor *wc = leaf(NA_DTYPE_F32, NA_SHAPE(1), 1.0);
    na_optim *oc = na_sgd_new(NULL, &sc);
    CHECK(wa && oa && wb && ob && wc && oc);
    CHECK(na_optim_add_group(oa, 1, &wa) == 0 && na_optim_add_group(oc, 1, &wc) == 0);
    na_fp16_optimizer *fo = na_fp16_optimizer_new(ob, NULL, NULL); /* static scale 1 */
    CHECK(fo && na_fp16_optimizer_add_group(fo, 1, &wb) == 0);
    for (int s = 0; s < r->steps; s++) {
        /* loss = grad * w: dL/dw = grad (in the weight's dtype) */
        CHECK_RC(na_backward(na_scale(na_sum(wa), r->grad), NULL));
        CHECK_RC(na_optim_step(oa, NULL));
        CHECK_RC(na_optim_zero_grad(oa));
        CHECK_RC(na_fp16_optimizer_backward(fo, na_scale(na_sum(wb), r->grad), true));
        CHECK_RC(na_fp16_optimizer_step(fo));
        CHECK_RC(na_fp16_optimizer_zero_grad(fo));
        CHECK_RC(na_backward(na_scale(na_sum(wc), r->grad), NULL));
        CHECK_RC(na_optim_step(oc, NULL));
        CHECK_RC(na_optim_zero_grad(oc));
        na_step_end();
    }
    r->update = r->lr * fabs((double)(float)r->grad);
    r->f16_weight = na_get(wa, 0);
    r->master = na_get(na_fp16_optimizer_master(fo, 0), 0);
    r->model = na_get(wb, 0);
    r->f32_reference = na_get(wc, 0);
    na_fp16_optimizer_free(fo);
    na_optim_free(oa);
    na_optim_free(oc);
    na_tensor_free(wa);
    na_tensor_free(wb);
    na_tensor_free(wc);
    amp_quotes *q = &r->quotes;
    quote(q, "f16_weight", "f16 weight updated in place: %.7f", r->f16_weight);
    quote(q, "master", "f32 master weight:           %.7f", r->master);
    quote(q, "model", "f16 copy of the master:      %.10g", r->model);
    quote(q, "reference", "plain f32 training:          %.7f", r->f32_reference);
    quote(q, "half_ulp", "%.11g", r->half_ulp);
    return 0;
}

void amp_master_print(const amp_master_result *r, FILE *out) {
    fprintf(out, "a weight at 1.0, %d SGD steps of lr %g x gradient %g (an update of about %.0e "
                 "each; half the f16 spacing at 1.0 is 2^-11 = %s)\n\n", r->steps, r->lr, r->grad,
            r->update, amp_quote_get(&r->quotes, "half_ulp"));
    fprintf(out, "%s\n%s\n%s\n%s\n", amp_quote_get(&r->quotes, "f16_weight"),
            amp_quote_get(&r->quotes, "master"), amp_quote_get(&r->quotes, "model"),
            amp_quote_get(&r->quotes, "reference"));
}
