/* The mixed-precision side of the trainers' step: --amp, --loss-scale, --growth-interval,
 * --log (see trainer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

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

/* Resolves --amp (auto: na_amp_recommend) and makes the optimizer, the scaler or the fp16
 * optimizer and the monitor. The model is converted in place for o2 (its tensors keep their
 * names, so checkpoints of every mode name tensors alike). */
int trainer_amp_setup(const trainer_opts *o, na_module *net, trainer_amp *a) {
    *a = (trainer_amp){.mode = o->amp, .dtype = NA_DTYPE_F32};
    bool auto_ = !strcmp(o->amp, "auto");
    if (auto_) {
        na_amp_recommendation r = na_amp_recommend(o->device);
        a->mode = r.mode == NA_AMP_MODE_BF16 ? "bf16" : r.mode == NA_AMP_MODE_F16 ? "fp16" : "off";
        if (!o->quiet) fprintf(stderr, "--amp auto: %s (%s)\n", a->mode, r.reason);
    }
    bool fp16 = !strcmp(a->mode, "fp16"), bf16 = !strcmp(a->mode, "bf16");
    bool o2 = !strcmp(a->mode, "o2");
    bool dynamic = !o->loss_scale || !strcmp(o->loss_scale, "dynamic");
    double static_scale = dynamic ? 1.0 : strtod(o->loss_scale, NULL);
    /* scaling options that the mode would silently ignore are refused */
    const char *scaling_flag = o->loss_scale ? "--loss-scale" : "--growth-interval";
    if ((o->loss_scale || o->growth_interval) && !fp16 && !o2)
        return na_set_error(NA_EINVAL, "%s applies to --amp fp16 and o2 only (--amp %s%s%s has "
                            "no loss scaling)", scaling_flag, o->amp, auto_ ? ": " : "",
                            auto_ ? a->mode : "");
    if (o->growth_interval && !dynamic)
        return na_set_error(NA_EINVAL, "--growth-interval applies to dynamic loss scaling, not "
                            "to --loss-scale %s", o->loss_scale);
    if (fp16 || bf16) {
        a->autocast = true;
        a->dtype = fp16 ? NA_DTYPE_F16 : NA_DTYPE_BF16;
        if (na_autocast_check_device(o->device, a->dtype)) return na_last_status();
    }
    if (o2) {
        a->dtype = NA_DTYPE_F16;
        if (na_model_convert(net, NA_DTYPE_F16)) return na_last_status();
        /* Apex's recipe: its dynamic LossScaler, or its static one, which never skips a step */
        na_fp16_optimizer_cfg fc = {.scaler = NA_APEX_SCALER_DEFAULTS};
        if (!dynamic) fc.scaler = (na_grad_scaler_cfg)NA_STATIC_SCALER(static_scale);
        if (o->growth_interval) fc.scaler.growth_interval = o->growth_interval;
        fc.scaler.device = o->device;
        a->fo = na_fp16_optimizer_new(make_optimizer(o, NA_NO_TENSORS), na_module_parameters(net),
                                      &fc);
        if (!a->fo)
            return na_last_status();
        a->opt = na_fp16_optimizer_optim(a->fo);
    } else {
        /* a GradScaler for fp16 (disabled, a plain step, for bf16 and off). A static scale is a
         * GradScaler that never moves but still skips steps with inf/NaN gradients. */
        na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
        if (!dynamic) gc = (na_grad_scaler_cfg)NA_GRAD_SCALER_FIXED(static_scale);
        if (o->growth_interval) gc.growth_interval = o->growth_interval;
        gc.enabled = fp16;
        gc.device = o->device;
        if (!(a->gs = na_grad_scaler_new(&gc)) ||
            !(a->opt = make_optimizer(o, na_module_parameters(net))))
            return na_last_status();
    }
    if (o->log_path) {
        if (!(a->mon = na_amp_monitor_new(NULL)) || na_amp_monitor_open_csv(a->mon, o->log_path))
            return na_set_error(na_last_status(), "--log: %s", na_last_error());
    }
    return NA_OK;
}

void trainer_amp_free(trainer_amp *a) {
    if (a->fo) na_fp16_optimizer_free(a->fo); /* frees its optimizer */
    else na_optim_free(a->opt);
    na_grad_scaler_free(a->gs);
    na_amp_monitor_free(a->mon);
    *a = (trainer_amp){0};
}

na_grad_scaler *trainer_amp_scaler(const trainer_amp *a) {
    return a->fo ? na_fp16_optimizer_scaler(a->fo) : a->gs;
}

na_tensor *trainer_amp_loss(const trainer_amp *a, na_module *net, na_tensor *x, na_tensor *y,
                            double label_smoothing) {
    if (a->fo && x) x = na_cast(x, a->dtype); /* o2: the model is f16 */
    if (a->autocast && na_autocast_begin(a->dtype) != NA_OK) return NULL;
    na_tensor *logits = x && y ? na_module_forward(net, x) : NULL;
    na_tensor *loss = logits ? na_cross_entropy(logits, y, &(na_cross_entropy_opts){
                                                    .label_smoothing = label_smoothing})
                             : NULL;
    if (a->autocast) na_autocast_end();
    return loss;
}

/* backward, step (skipped on the device on overflow), scale update, zero_grad */
int trainer_amp_step(trainer_amp *a, na_tensor *loss) {
    if (a->fo)
        return na_fp16_optimizer_backward(a->fo, loss, true) || na_fp16_optimizer_step(a->fo) ||
                       na_fp16_optimizer_zero_grad(a->fo)
                   ? na_last_status()
                   : NA_OK;
    na_tensor *scaled = na_grad_scaler_scale(a->gs, loss);
    return !scaled || na_backward(scaled, NULL) || na_grad_scaler_step(a->gs, a->opt) ||
                   na_grad_scaler_update(a->gs) || na_optim_zero_grad(a->opt)
               ? na_last_status()
               : NA_OK;
}
