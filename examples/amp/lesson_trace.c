/* Lesson 3 (amp-trace): the autocast trace of one f16 training step of the MNIST CNN
 * (examples/common/models.h) on random input, and the rule table (see amp_lessons.h). */
#include <string.h>

#include "../common/models.h"
#include "lesson_internal.h"

static void trace_collect(const na_amp_trace_record *rec, void *ctx) {
    amp_trace_result *r = ctx;
    if (r->n < AMP_TRACE_MAX) r->rec[r->n++] = *rec;
}

int amp_lesson_trace(amp_trace_result *r) {
    memset(r, 0, sizeof *r);
    na_manual_seed(0);
    na_module *net = model_mnist_cnn();
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

int amp_rules_print(FILE *out) {
    na_autocast_print_rules(out);
    return ferror(out) ? -1 : NA_OP_COUNT + 1;
}

int amp_trace_run(const char *rules) {
    if (rules) return amp_rules_print(stdout) < 0;
    amp_trace_result res, *r = &res;
    if (amp_lesson_trace(r)) return 1;
    printf("one training step of the MNIST CNN, f16 autocast (batch of 4 random images)\n\n");
    char line[160];
    for (int i = 0; i < r->n; i++)
        printf("amp: %s\n", na_amp_trace_format(&r->rec[i], line, sizeof line));
    printf("\n%s, %d by the fp32 rule; %s (%s); loss %.4f, scale after the step %.0f\n",
           amp_quote_get(&r->quotes, "lower_ops"), r->fp32_ops,
           amp_quote_get(&r->quotes, "weight_casts"), amp_quote_get(&r->quotes, "casts"),
           r->loss, r->scale);
    return 0;
}
