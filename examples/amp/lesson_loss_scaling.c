/* Lesson 5 (amp-loss-scaling, and amp-overflow --log): the MNIST MLP (examples/common/models.h)
 * on Fashion-MNIST, f32 or f16 autocast, with or without a GradScaler (see amp_lessons.h).
 * Everything but the precision and the scaler is the same in every run: seed, initialization,
 * batches, optimizer. */
#include <math.h>
#include <stdlib.h>

#include "../common/models.h"
#include "amp_plot.h"
#include "lesson_internal.h"

typedef struct {
    na_dtype amp;           /* autocast around forward and loss: F16, BF16, or F32 (off) */
    bool scaled;            /* a GradScaler (else a plain step) */
    double loss_factor;     /* the loss is the cross-entropy times this */
    int steps;
    int64_t growth_interval; /* the GradScaler's (0: PyTorch's 2000) */
    const char *log_csv;    /* the monitor's per-step CSV, or NULL */
    bool bf16_weights;      /* the model converted to bf16 (na_model_to_half) */
    bool masters;           /* ... stepped through f32 masters (na_fp16_optimizer, scale 1) */
    double sgd_lr;          /* > 0: plain SGD with this lr instead of Adam */
} mlp_run_cfg;

typedef struct {
    double zero_frac;       /* gradient elements exactly 0 at the first step */
    double first_loss, final_loss, test_acc;
    double first_scale, max_scale, final_scale;
    int64_t skipped;
    int first_skip;
    int64_t n_grads;
    float *grads;           /* the first step's gradients, when asked for (grads != NULL) */
    double unchanged_frac;  /* model weights the first step left as they were */
} mlp_run_out;

/* The model's parameters as f32, one after another, into a malloc'd *out. */
static int weights_to_host(na_module *net, float **out, int64_t *n) {
    na_tensor_list ps = na_module_parameters(net);
    *n = 0;
    for (int64_t i = 0; i < ps.n; i++) *n += ps.items[i]->numel;
    *out = malloc((size_t)*n * sizeof **out);
    if (!*out) return na_set_error(NA_ENOMEM, "weights_to_host: %lld weights", (long long)*n);
    for (int64_t i = 0, off = 0; i < ps.n; i++) {
        if (na_copy_to_host(na_cast(ps.items[i], NA_DTYPE_F32), *out + off)) return -1;
        off += ps.items[i]->numel;
    }
    return 0;
}

static double mlp_accuracy(na_module *net, const na_dataset *ds) {
    na_batcher *b = amp_fashion_batcher(ds, 1000, false);
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

static int mlp_run(const amp_fashion *d, const mlp_run_cfg *c, mlp_run_out *o, bool keep_grads) {
    *o = (mlp_run_out){.first_skip = -1};
    bool was_reproducible = na_cpu_reproducible();
    na_cpu_set_reproducible(true); /* the same bits on every CPU: the guide quotes them */
    na_manual_seed(1);
    na_module *net = model_mnist_mlp();
    if (net && c->bf16_weights) net = na_model_to_half(net, NA_DTYPE_BF16);
    na_adam_cfg ac = NA_ADAM_DEFAULTS;
    na_sgd_cfg sc = {.lr = c->sgd_lr};
    na_tensor_list ps = net && !c->masters ? na_module_parameters(net) : NA_NO_TENSORS;
    na_optim *opt = !net ? NULL : c->sgd_lr > 0 ? na_sgd_new(ps, &sc) : na_adam_new(ps, &ac);
    na_fp16_optimizer *fo = opt && c->masters ? na_fp16_optimizer_new(opt,
                                                    na_module_parameters(net), NULL) : NULL;
    na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
    gc.enabled = c->scaled;
    if (c->growth_interval) gc.growth_interval = c->growth_interval;
    na_grad_scaler *gs = na_grad_scaler_new(&gc);
    na_batcher *b = amp_fashion_batcher(d->train, MLP_BATCH, true);
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    na_amp_monitor *mon = c->log_csv ? na_amp_monitor_new(NULL) : NULL;
    int rc = opt && gs && x && (!c->log_csv || mon) && (!c->masters || fo) ? 0 : -1;
    float *before = NULL;
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
            bool autocast = c->amp != NA_DTYPE_F32;
            if (autocast && (rc = na_autocast_begin(c->amp))) break;
            na_tensor *ce = xt && yt ? na_cross_entropy(na_module_forward(net, xt), yt, NULL)
                                     : NULL;
            if (autocast) na_autocast_end();
            na_tensor *loss = ce ? na_scale(ce, c->loss_factor) : NULL;
            double scale = na_grad_scaler_is_enabled(gs) ? na_grad_scaler_get_scale(gs) : 1.0;
            if (!loss || (fo ? na_fp16_optimizer_backward(fo, loss, true)
                            : na_backward(na_grad_scaler_scale(gs, loss), NULL)) ||
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
            int64_t nw = 0;
            if (s == 0 && weights_to_host(net, &before, &nw)) {
                rc = -1;
                break;
            }
            if (fo ? na_fp16_optimizer_step(fo) || na_fp16_optimizer_zero_grad(fo)
                   : na_grad_scaler_step(gs, opt) || na_grad_scaler_update(gs) ||
                         na_optim_zero_grad(opt)) {
                rc = -1;
                break;
            }
            float *after = NULL;
            if (s == 0 && weights_to_host(net, &after, &nw)) {
                free(after);
                rc = -1;
                break;
            }
            for (int64_t j = 0, same = 0; after && j < nw; j++) {
                same += after[j] == before[j];
                if (j == nw - 1) o->unchanged_frac = (double)same / (double)nw;
            }
            free(after);
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
    free(before);
    if (fo) na_fp16_optimizer_free(fo); /* and its optimizer */
    else na_optim_free(opt);
    na_module_free(net);
    na_cpu_set_reproducible(was_reproducible);
    return rc ? -1 : 0;
}

int amp_lesson_loss_scaling(const char *data_dir, amp_loss_scaling_result *r) {
    *r = (amp_loss_scaling_result){.loss_factor = 1e-5, .steps = 200,
                                   .adam_eps = ((na_adam_cfg)NA_ADAM_DEFAULTS).eps};
    amp_fashion d;
    if (amp_fashion_load(data_dir, &d)) return -1;
    static const char *names[AMP_RUNS] = {"f32", "f16", "f16s", "bf16"};
    static const na_dtype amp[AMP_RUNS] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int k = 0; k < AMP_RUNS; k++) {
        mlp_run_cfg c = {.amp = amp[k], .scaled = k == AMP_RUN_F16_SCALED,
                         .loss_factor = r->loss_factor, .steps = r->steps};
        mlp_run_out o;
        if (mlp_run(&d, &c, &o, k == AMP_RUN_F32)) {
            amp_fashion_free(&d);
            return -1;
        }
        r->zero_frac[k] = o.zero_frac;
        r->final_loss[k] = o.final_loss;
        r->test_acc[k] = o.test_acc;
        if (k == AMP_RUN_F32) r->grads = o.grads, r->n_grads = o.n_grads;
        if (k == AMP_RUN_F16_SCALED) r->scale = o.first_scale, r->skipped = o.skipped;
    }
    amp_fashion_free(&d);
    amp_hist h = {.n = r->n_grads, .values = r->grads, .scale = 1.0};
    double zero;
    amp_hist_f16_shares(&h, &r->zero_share, &r->subnormal_share, &zero);
    h.scale = r->scale;
    amp_hist_f16_shares(&h, &r->zero_share_scaled, &r->subnormal_share_scaled, &zero);
    int64_t below_eps = 0;
    for (int64_t i = 0; i < r->n_grads; i++) below_eps += fabsf(r->grads[i]) < r->adam_eps;
    r->below_eps_share = r->n_grads ? (double)below_eps / (double)r->n_grads : NAN;
    quote(&r->quotes, "below_eps", "%.0f%% of the first step's f32 gradients are below Adam's eps "
          "(%g)", 100 * r->below_eps_share, r->adam_eps);
    quote(&r->quotes, "shares", "%.1f%% would round to 0 in f16 and %.1f%% be subnormal; times "
          "%.0f: %.1f%% and %.1f%%", 100 * r->zero_share, 100 * r->subnormal_share, r->scale,
          100 * r->zero_share_scaled, 100 * r->subnormal_share_scaled);
    quote(&r->quotes, "setup", "MLP 784-256-10, Adam, Fashion-MNIST (%d train / %d test "
          "images), %d steps of batch %d, loss = cross-entropy x %g", MLP_TRAIN_N, MLP_TEST_N,
          r->steps, MLP_BATCH, r->loss_factor);
    static const char *what[AMP_RUNS] = {"f32", "f16, no scaling", "f16 + GradScaler",
                                         "bf16, no scaling"};
    for (int k = 0; k < AMP_RUNS; k++) {
        quote(&r->quotes, names[k], "%-18s %8.1f%% %12.4f %10.1f%%", what[k],
              100 * r->zero_frac[k], r->final_loss[k], 100 * r->test_acc[k]);
    }
    quote(&r->quotes, "skipped", "the GradScaler skipped %lld of %d steps", (long long)r->skipped,
          r->steps);
    return 0;
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

/* ---- master weights in a real run ------------------------------------------------------------ */

int amp_lesson_master_mlp(const char *data_dir, amp_master_mlp_result *r) {
    *r = (amp_master_mlp_result){.steps = 200, .lr = 0.01};
    amp_fashion d;
    if (amp_fashion_load(data_dir, &d)) return -1;
    static const char *keys[AMP_MLP_KINDS] = {"f32", "bf16", "bf16m"};
    static const char *what[AMP_MLP_KINDS] = {"f32 weights", "bf16 weights, updated in place",
                                              "bf16 weights + f32 masters"};
    for (int k = 0; k < AMP_MLP_KINDS; k++) {
        mlp_run_cfg c = {.amp = NA_DTYPE_F32, .loss_factor = 1.0, .steps = r->steps,
                         .bf16_weights = k != AMP_MLP_F32, .masters = k == AMP_MLP_MASTERS,
                         .sgd_lr = r->lr};
        mlp_run_out o;
        if (mlp_run(&d, &c, &o, false)) {
            amp_fashion_free(&d);
            return -1;
        }
        r->unchanged[k] = o.unchanged_frac;
        r->final_loss[k] = o.final_loss;
        r->test_acc[k] = o.test_acc;
        quote(&r->quotes, keys[k], "%-32s %8.1f%% %12.4f %10.1f%%", what[k], 100 * o.unchanged_frac,
              o.final_loss, 100 * o.test_acc);
    }
    amp_fashion_free(&d);
    quote(&r->quotes, "setup", "MLP 784-256-10, SGD lr %g, Fashion-MNIST (%d train / %d test "
          "images), %d steps of batch %d", r->lr, MLP_TRAIN_N, MLP_TEST_N, r->steps, MLP_BATCH);
    return 0;
}

/* ---- the scale's sawtooth ---------------------------------------------------------------------- */

int amp_lesson_sawtooth(const char *data_dir, const char *csv_path, amp_sawtooth_result *r) {
    *r = (amp_sawtooth_result){.steps = AMP_SAWTOOTH_STEPS};
    amp_fashion d;
    if (amp_fashion_load(data_dir, &d)) return -1;
    mlp_run_cfg c = {.amp = NA_DTYPE_F16, .scaled = true, .loss_factor = 1.0, .steps = r->steps,
                     .growth_interval = AMP_SAWTOOTH_INTERVAL, .log_csv = csv_path};
    mlp_run_out o;
    int rc = mlp_run(&d, &c, &o, false);
    amp_fashion_free(&d);
    if (rc) return -1;
    r->skipped = o.skipped;
    r->max_scale = o.max_scale;
    r->final_scale = o.final_scale;
    r->first_skip = o.first_skip;
    r->first_loss = o.first_loss;
    r->final_loss = o.final_loss;
    quote(&r->quotes, "setup", "the MLP of amp-loss-scaling (loss x 1), f16 autocast, "
          "GradScaler growing x2 every %d clean steps", AMP_SAWTOOTH_INTERVAL);
    quote(&r->quotes, "summary", "%lld of %d steps skipped, the first at step %d; "
                 "the scale peaked at 2^%.0f", (long long)r->skipped, r->steps, r->first_skip,
                 log2(r->max_scale));
    quote(&r->quotes, "loss", "loss %.3f -> %.3f", r->first_loss, r->final_loss);
    return 0;
}

static amp_loss_scaling_result drawn; /* what draw() draws */
static int draw(FILE *svg) { return amp_loss_scaling_svg(&drawn, svg); }

int amp_loss_scaling_run(const char *svg_path) {
    amp_loss_scaling_result *r = &drawn;
    if (amp_lesson_loss_scaling(NULL, r)) {
        fprintf(stderr, "amp-loss-scaling: %s\n", na_last_error());
        return 1;
    }
    printf("%s; same seed and batches in every run\n\n", amp_quote_get(&r->quotes, "setup"));
    printf("%-18s %9s %12s %11s\n", "run", "grads = 0", "final loss", "test acc");
    printf("%s\n%s\n%s\n%s\n", amp_quote_get(&r->quotes, "f32"),
           amp_quote_get(&r->quotes, "f16"), amp_quote_get(&r->quotes, "f16s"),
           amp_quote_get(&r->quotes, "bf16"));
    printf("\ngrads = 0: the share of the first step's gradient elements that are exactly 0\n"
           "final loss: the cross-entropy without the factor, mean of the last 20 steps\n"
           "%s; its scale at the first step: %.0f\n"
           "of the first step's true (f32) gradients,\n%s\n%s\n",
           amp_quote_get(&r->quotes, "skipped"), r->scale, amp_quote_get(&r->quotes, "shares"),
           amp_quote_get(&r->quotes, "below_eps"));
    int rc = svg_path ? amp_write_svg(svg_path, draw) : 0;
    amp_loss_scaling_free(r);
    return rc;
}

int amp_sawtooth_run(const char *csv_path) {
    amp_sawtooth_result res, *r = &res;
    if (amp_lesson_sawtooth(NULL, csv_path, r)) {
        fprintf(stderr, "amp-overflow: %s\n", na_last_error());
        return 1;
    }
    printf("\n%s:\n%s\n%s\nfinal scale %.0f\n", amp_quote_get(&r->quotes, "setup"),
           amp_quote_get(&r->quotes, "summary"),
           amp_quote_get(&r->quotes, "loss"), r->final_scale);
    printf("per-step log: %s\n", csv_path);
    return 0;
}
