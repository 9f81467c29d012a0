/* The amp recipes (off, fp16, bf16, o2, fp8) that the trainers, na-bench and the tests share, and the
 * trainers' options for them: --amp, --loss-scale, --growth-interval, --log (see trainer.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "run_report.h"
#include "trainer.h"
#include "trainer_internal.h"

#define SGD_DEFAULT_LR 0.05

/* The optimizer of --optim over params (NA_NO_TENSORS for the fp16 optimizer to fill). */
static na_optim *make_optimizer(const trainer_opts *o, na_tensor_list params) {
    if (!strcmp(o->optim, "adamw")) {
        na_adam_cfg c = NA_ADAMW_DEFAULTS;
        if (o->lr >= 0) c.lr = o->lr;
        if (o->weight_decay >= 0) c.weight_decay = o->weight_decay;
        return na_adamw_new(params, &c);
    }
    na_sgd_cfg c = NA_SGD_DEFAULTS;
    c.lr = o->lr >= 0 ? o->lr : SGD_DEFAULT_LR, c.momentum = o->momentum;
    c.weight_decay = o->weight_decay > 0 ? o->weight_decay : 0;
    c.nesterov = o->momentum > 0;
    return na_sgd_new(params, &c);
}

/* The four recipes. The model is converted in place for o2 (its tensors keep their names, so
 * checkpoints of every mode name tensors alike). */
int trainer_amp_init(trainer_amp *a, const char *mode, na_module *net, na_optim *opt,
                     const na_grad_scaler_cfg *scaler) {
    *a = (trainer_amp){.mode = mode, .dtype = NA_DTYPE_F32,
                       .fp8_cfg = (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS};
    bool fp16 = !strcmp(mode, "fp16"), bf16 = !strcmp(mode, "bf16"), o2 = !strcmp(mode, "o2");
    bool fp8 = !strcmp(mode, "fp8");
    int rc = opt ? NA_OK : na_last_status();
    if (!rc && !fp16 && !bf16 && !o2 && !fp8 && strcmp(mode, "off"))
        rc = na_set_error(NA_EINVAL, "trainer_amp_init: amp mode '%s' (expected off, fp16, bf16, "
                          "o2 or fp8)", mode);
    if (!rc && fp8 && !(a->fp8 = na_fp8_model_new(net, &a->fp8_cfg))) rc = na_last_status();
    if (!rc && o2) rc = na_model_convert(net, NA_DTYPE_F16);
    if (rc) {
        na_optim_free(opt);
        return rc;
    }
    if (o2) {
        /* Apex O2: f16 model, f32 master weights in the fp16 optimizer, Apex's dynamic scaler */
        a->dtype = NA_DTYPE_F16;
        na_fp16_optimizer_cfg fc = NA_FP16_OPTIMIZER_DYNAMIC;
        if (scaler) fc.scaler = *scaler;
        if (!(a->fo = na_fp16_optimizer_new(opt, na_module_parameters(net), &fc)))
            return na_last_status();
        a->opt = na_fp16_optimizer_optim(a->fo);
        return NA_OK;
    }
    /* autocast for fp16, bf16 and fp8 (whose regions are bf16 ones); a GradScaler, disabled (a
     * plain step) unless fp16 */
    a->autocast = fp16 || bf16 || fp8;
    if (a->autocast) a->dtype = fp16 ? NA_DTYPE_F16 : NA_DTYPE_BF16;
    na_grad_scaler_cfg gc = scaler ? *scaler : (na_grad_scaler_cfg)NA_GRAD_SCALER_DEFAULTS;
    gc.enabled = fp16;
    a->opt = opt;
    return (a->gs = na_grad_scaler_new(&gc)) ? NA_OK : na_last_status();
}

int trainer_amp_init_dist(trainer_amp *a, const char *mode, na_module *net, na_optim *opt,
                          const na_grad_scaler_cfg *scaler, na_dist *dist,
                          const na_ddp_config *ddp_cfg) {
    /* The wrapper sees the model as it trains (o2: converted to f16 first; trainer_amp_init's
     * conversion is then a no-op) and broadcasts rank 0's parameters before the fp16
     * optimizer copies them into its masters. */
    na_ddp *ddp = NULL;
    if (dist && ((!strcmp(mode, "o2") && na_model_convert(net, NA_DTYPE_F16)) ||
                 !(ddp = na_ddp_new(dist, net, ddp_cfg)))) {
        na_optim_free(opt);
        return na_set_error(na_last_status(), "data parallel: %s", na_last_error());
    }
    int rc = trainer_amp_init(a, mode, net, opt, scaler);
    a->ddp = ddp;
    return rc;
}

/* na_ddp's configuration from --allreduce-dtype, --bucket-mb and --no-broadcast-buffers. */
static void ddp_config(const trainer_opts *o, na_ddp_config *c) {
    const char *dt = o->allreduce_dtype ? o->allreduce_dtype : "f32";
    *c = (na_ddp_config){.bucket_bytes = o->bucket_mb << 20,
                         .no_broadcast_buffers = o->no_broadcast_buffers,
                         .allreduce_dtype = !strcmp(dt, "f16")    ? NA_DTYPE_F16
                                            : !strcmp(dt, "bf16") ? NA_DTYPE_BF16
                                                                  : NA_DTYPE_F32};
}

/* Resolves --amp (auto: na_amp_recommend), refuses scaling options the mode would ignore, and
 * makes the recipe with the optimizer and scaler the options ask for, and the monitor. */
int trainer_amp_setup(const trainer_opts *o, na_module *net, trainer_amp *a) {
    return trainer_amp_setup_dist(o, net, NULL, a);
}

int trainer_amp_check_scaling(const trainer_opts *o, const char *mode) {
    bool auto_ = strcmp(o->amp, mode) != 0;
    const char *scaling_flag = o->loss_scale ? "--loss-scale" : "--growth-interval";
    if ((o->loss_scale || o->growth_interval) && strcmp(mode, "fp16") && strcmp(mode, "o2"))
        return na_set_error(NA_EINVAL, "%s applies to --amp fp16 and o2 only (--amp %s%s%s has "
                            "no loss scaling)", scaling_flag, o->amp, auto_ ? ": " : "",
                            auto_ ? mode : "");
    if (o->growth_interval && o->loss_scale && strcmp(o->loss_scale, "dynamic"))
        return na_set_error(NA_EINVAL, "--growth-interval applies to dynamic loss scaling, not "
                            "to --loss-scale %s", o->loss_scale);
    /* an FP8 option away from its default (trainer_defaults) is one given */
    static const char *const fp8_flags[] = {"--fp8-recipe", "--fp8-format", "--fp8-history",
                                            "--fp8-margin"};
    bool current = o->fp8_recipe && !strcmp(o->fp8_recipe, "current");
    bool set[4] = {current, o->fp8_format && strcmp(o->fp8_format, "hybrid"),
                   o->fp8_history != 0, o->fp8_margin != 0};
    for (int i = 0; i < 4; i++) {
        if (!set[i]) continue;
        if (strcmp(mode, "fp8"))
            return na_set_error(NA_EINVAL, "%s applies to --amp fp8 only (--amp %s%s%s has no FP8 "
                                "layers)", fp8_flags[i], o->amp, auto_ ? ": " : "",
                                auto_ ? mode : "");
        if (current && i >= 2)
            return na_set_error(NA_EINVAL, "%s applies to --fp8-recipe delayed (current scaling "
                                "takes each tensor's own amax: no history, no margin)",
                                fp8_flags[i]);
    }
    return NA_OK;
}

int trainer_amp_setup_dist(const trainer_opts *o, na_module *net, na_dist *dist, trainer_amp *a) {
    const char *mode = o->amp;
    *a = (trainer_amp){.mode = mode};
    bool auto_ = !strcmp(o->amp, "auto");
    if (auto_) {
        na_amp_recommendation r = na_amp_recommend_model(o->device, na_module_num_params(net));
        mode = r.mode == NA_AMP_MODE_FP8    ? "fp8"
               : r.mode == NA_AMP_MODE_BF16 ? "bf16"
               : r.mode == NA_AMP_MODE_F16  ? "fp16"
                                            : "off";
        if (!o->quiet) fprintf(stderr, "--amp auto: %s (%s)\n", mode, r.reason);
    }
    bool fp16 = !strcmp(mode, "fp16"), o2 = !strcmp(mode, "o2");
    bool bf16 = !strcmp(mode, "bf16") || !strcmp(mode, "fp8"); /* fp8's regions are bf16's */
    bool dynamic = !o->loss_scale || !strcmp(o->loss_scale, "dynamic");
    double static_scale = dynamic ? 1.0 : strtod(o->loss_scale, NULL);
    if (trainer_amp_check_scaling(o, mode)) return na_last_status();
    if ((fp16 || bf16) &&
        na_autocast_check_device(o->device, fp16 ? NA_DTYPE_F16 : NA_DTYPE_BF16))
        return na_last_status();
    /* o2: Apex's dynamic LossScaler, or its static one, which never skips a step. fp16: a
     * static scale is a GradScaler that never moves but still skips steps with inf/NaN
     * gradients. */
    na_grad_scaler_cfg sc = o2 ? (na_grad_scaler_cfg)NA_APEX_SCALER_DEFAULTS
                               : (na_grad_scaler_cfg)NA_GRAD_SCALER_DEFAULTS;
    if (!dynamic)
        sc = o2 ? (na_grad_scaler_cfg)NA_STATIC_SCALER(static_scale)
                : (na_grad_scaler_cfg)NA_GRAD_SCALER_FIXED(static_scale);
    if (o->growth_interval) sc.growth_interval = o->growth_interval;
    sc.device = o->device;
    if (dist && o->sync_bn && na_module_sync_batchnorm(net, dist))
        return na_set_error(na_last_status(), "--sync-bn: %s", na_last_error());
    /* o2's optimizer is made without parameters: the fp16 optimizer adds the f32 masters */
    na_tensor_list params = o2 ? NA_NO_TENSORS : na_module_parameters(net);
    na_ddp_config dc;
    ddp_config(o, &dc);
    if (trainer_amp_init_dist(a, mode, net, make_optimizer(o, params), &sc, dist, &dc))
        return na_last_status();
    a->channels_last = o->channels_last;
    a->dist = dist;
    if (a->fp8) { /* the recipe the options ask for, in place of trainer_amp_init's default */
        na_fp8_model_free(a->fp8);
        a->fp8_cfg = trainer_amp_fp8_recipe(o);
        if (!(a->fp8 = na_fp8_model_new(net, &a->fp8_cfg)))
            return na_set_error(na_last_status(), "--amp fp8: %s", na_last_error());
    }
    if (o->log_path || o->report_path) {
        /* a resumed run's log goes on after the interrupted one's */
        if (!(a->mon = na_amp_monitor_new(NULL)) || na_amp_monitor_watch_fp8(a->mon, a->fp8) ||
            (o->log_path && (o->resume_path ? na_amp_monitor_append_csv
                                            : na_amp_monitor_open_csv)(a->mon, o->log_path)))
            return na_set_error(na_last_status(), "--log: %s", na_last_error());
    }
    if (o->report_path && !(a->report = run_report_new(o, net, a))) return na_last_status();
    return NA_OK;
}

void trainer_amp_free(trainer_amp *a) {
    na_ddp_free(a->ddp);
    na_fp8_model_free(a->fp8);
    if (a->fo) na_fp16_optimizer_free(a->fo); /* frees its optimizer */
    else na_optim_free(a->opt);
    na_grad_scaler_free(a->gs);
    na_amp_monitor_free(a->mon);
    run_report_free(a->report);
    *a = (trainer_amp){0};
}

na_grad_scaler *trainer_amp_scaler(const trainer_amp *a) {
    return a->fo ? na_fp16_optimizer_scaler(a->fo) : a->gs;
}

/* forward and loss: in an autocast region (fp16, bf16), or on the input cast to f16 (o2) */
na_tensor *trainer_amp_loss(const trainer_amp *a, na_module *net, na_tensor *x, na_tensor *y,
                            double label_smoothing) {
    if (a->channels_last && x && x->ndim == 4) x = na_to_channels_last(x);
    if (a->fo && x) x = na_cast(x, a->dtype);
    if (a->autocast && (a->fp8 ? na_fp8_autocast_begin() : na_autocast_begin(a->dtype)) != NA_OK)
        return NULL;
    na_tensor *logits = x && y ? na_module_forward(net, x) : NULL;
    na_cross_entropy_opts ce = {.label_smoothing = label_smoothing};
    na_tensor *loss = logits ? na_cross_entropy(logits, y, &ce) : NULL;
    if (a->autocast) a->fp8 ? na_fp8_autocast_end() : na_autocast_end();
    return loss;
}

/* fp8: the next step's scales from this step's amax values (the max over ranks first) */
static int trainer_amp_fp8_update(trainer_amp *a) {
    if (a->dist && na_dist_fp8_reduce_amax(a->dist, na_fp8_model_scalings(a->fp8),
                                           na_fp8_model_layers(a->fp8)))
        return na_last_status();
    return na_fp8_model_update(a->fp8);
}

/* backward, optimizer step (skipped on the device on overflow), scale update, zero_grad. With
 * data parallelism the gradients are averaged over the ranks (na_ddp_finish) right after
 * backward, still scaled and before the inf/NaN check, so that every rank checks the same
 * gradients and skips the same steps. */
int trainer_amp_step(trainer_amp *a, na_tensor *loss) {
    int rc;
    if (a->fo) { /* o2: the fp16 optimizer scales, unscales into the f32 masters, steps them;
                    the f16 model gradients are reduced between backward and unscale */
        rc = na_fp16_optimizer_backward(a->fo, loss, !a->ddp) ||
             (a->ddp && (na_ddp_finish(a->ddp) || na_fp16_optimizer_update_master_grads(a->fo))) ||
             run_report_grads(a->report, a) || na_fp16_optimizer_step(a->fo) ||
             na_fp16_optimizer_zero_grad(a->fo);
    } else { /* the GradScaler; disabled, it passes the loss through and steps plainly */
        na_tensor *scaled = na_grad_scaler_scale(a->gs, loss);
        rc = !scaled || na_backward(scaled, NULL) || (a->ddp && na_ddp_finish(a->ddp)) ||
             run_report_grads(a->report, a) || na_grad_scaler_step(a->gs, a->opt) ||
             na_grad_scaler_update(a->gs) || na_optim_zero_grad(a->opt) ||
             (a->fp8 && trainer_amp_fp8_update(a));
    }
    return rc ? na_last_status() : NA_OK;
}

na_fp8_recipe_cfg trainer_amp_fp8_recipe(const trainer_opts *o) {
    bool current = o->fp8_recipe && !strcmp(o->fp8_recipe, "current");
    na_fp8_recipe_cfg c = current ? (na_fp8_recipe_cfg)NA_FP8_RECIPE_CURRENT_DEFAULTS
                                  : (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS;
    if (o->fp8_format && !strcmp(o->fp8_format, "e4m3")) c.formats = NA_FP8_FORMATS_E4M3;
    if (!current && o->fp8_history > 0) c.amax_history_len = o->fp8_history;
    if (!current) c.margin = (int)o->fp8_margin;
    return c;
}

/* ---- --cuda-graph -------------------------------------------------------------------------- */

int trainer_amp_graph_prepare(trainer_amp *a, na_module *net, na_device dev) {
    if (dev != NA_DEVICE_CUDA)
        return na_set_error(NA_EINVAL, "%s", TRAINER_CUDA_GRAPH_NEEDS_CUDA);
    if (a->ddp)
        return na_set_error(NA_ENOTSUP, "data parallel steps wait on the host for NCCL "
                            "(na_ddp_finish)");
    int rc = na_optim_set_lr_on_device(a->opt, true);
    if (!rc && net) rc = na_module_count_batches_on_device(net) < 0 ? na_last_status() : NA_OK;
    return rc;
}

typedef struct {
    trainer_amp *a;
    na_module *net;
    na_tensor *x, *y, *loss_out;
    double label_smoothing;
} captured_step;

static int run_captured_step(void *ctx) {
    captured_step *c = ctx;
    na_tensor *loss = trainer_amp_loss(c->a, c->net, c->x, c->y, c->label_smoothing);
    if (!loss || trainer_amp_step(c->a, loss) || na_copy_(c->loss_out, loss)) return na_last_status();
    return NA_OK;
}

na_step_graph *trainer_amp_capture(trainer_amp *a, na_module *net, na_tensor *x, na_tensor *y,
                                   double label_smoothing, na_tensor *loss_out) {
    captured_step c = {a, net, x, y, loss_out, label_smoothing};
    return na_step_graph_capture(x->device, run_captured_step, &c);
}

int trainer_amp_record(trainer_amp *amp, const trainer_opts *o, int64_t at, na_tensor *loss,
                       const char *prefix) {
    int64_t skipped = na_amp_monitor_skipped(amp->mon);
    unsigned alerts = na_amp_monitor_record_scaler(amp->mon, at, loss, trainer_amp_scaler(amp));
    char why[256] = "";
    if (alerts & ~amp->alerts_shown) {
        fprintf(stderr, "%s%s: amp monitor at step %" PRId64 ": %s\n", prefix, o->program, at,
                na_amp_monitor_describe(amp->mon, why, sizeof why));
        amp->alerts_shown |= alerts;
    }
    if (amp->report &&
        run_report_scale(amp->report, at, na_item(loss), na_amp_monitor_scale(amp->mon),
                         na_amp_monitor_skipped(amp->mon) - skipped, why)) {
        fprintf(stderr, "%s%s: %s\n", prefix, o->program, na_last_error());
        return 1;
    }
    if (na_amp_monitor_csv_status(amp->mon)) { /* a full disk: the log stops here */
        fprintf(stderr, "%s%s: --log: %s\n", prefix, o->program, na_last_error());
        return 1;
    }
    return 0;
}

void trainer_amp_result(const trainer_amp *a, trainer_result *r) {
    r->amp_mode = a->mode;
    if (!a->fp8) return;
    r->fp8_recipe = na_fp8_recipe_kind_name(a->fp8_cfg.kind);
    r->fp8_format = na_fp8_formats_name(a->fp8_cfg.formats);
    r->saturated = na_fp8_model_saturated(a->fp8);
}
