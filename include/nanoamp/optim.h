/* nanoamp/optim.h — SGD, Adam, AdamW, learning-rate schedules, gradient-norm clipping.
 *
 * An optimizer holds parameter groups; each group has its own hyper-parameters (lr and
 * weight decay can be changed per group; the rest come from the optimizer's config). The
 * update is one multi-tensor kernel per group and device (kernels/backend.h), so on CUDA a
 * step needs no host round trip, and a mixed-precision step (GradScaler, fp32 master
 * weights) can skip on the device: see na_optim_step_opts.
 *
 *     na_adam_cfg cfg = NA_ADAMW_DEFAULTS;           // lr 1e-3, betas (0.9, 0.999), wd 1e-2
 *     na_optim *opt = na_adamw_new(na_module_parameters(net), &cfg);  // NULL + na_last_error()
 *     na_lr_schedule sched = na_lr_one_cycle(total_steps);
 *     for (int64_t t = 0; t < total_steps; t++) {
 *         na_lr_schedule_apply(&sched, opt, t);      // lr of step t, for every group
 *         ... forward, na_backward(loss, NULL) ...
 *         na_optim_step(opt, NULL);
 *         na_optim_zero_grad(opt);
 *         na_step_end();
 *     }
 *     na_optim_free(opt);
 *
 * Optimizers take parameter lists (nanoamp/state.h), not modules: na_module_parameters(net)
 * lists a model's trainable parameters, NA_TENSORS(w, b) any tensors of one's own.
 *
 * Gradients: a parameter whose .grad is NULL is skipped (its state and step count do not
 * change). na_optim_zero_grad zeroes gradients rather than freeing them, so their memory
 * stays put from step to step; a zero gradient is still a step (weight decay and momentum
 * apply), as PyTorch with set_to_none=False. The zeros are written lazily: the next backward
 * writes over a zeroed gradient instead of adding to it (nanoamp/autograd.h, "Zeroed
 * gradients"); na_optim_step and clipping read one nobody wrote as zeros.
 *
 * State is allocated when a parameter is added, f32, on the parameter's device: make the
 * optimizer after moving the model (na_module_to, nanoamp/nn.h). Parameters may be f32, f16 or
 * bf16 (the update is computed in f32 and rounded once).
 */
#ifndef NANOAMP_OPTIM_H
#define NANOAMP_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "nanoamp/error.h"
#include "nanoamp/state.h"
#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct na_optim na_optim;
typedef enum { NA_OPTIM_SGD, NA_OPTIM_ADAM, NA_OPTIM_ADAMW } na_optim_kind;

/* ---- configs: start from the DEFAULTS and change fields ------------------------------- */
/* PyTorch's SGD: lr >= 0, 0 <= momentum < 1, 0 <= dampening <= 1, weight_decay >= 0, all
 * finite (PyTorch bounds only lr, momentum and weight_decay, and from below; a momentum >= 1
 * or an infinite value never converges); nesterov needs momentum > 0 and dampening 0. */
typedef struct {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
} na_sgd_cfg;
#define NA_SGD_DEFAULTS { .lr = 1e-3 }

/* PyTorch's Adam / AdamW: lr >= 0, 0 <= beta1, beta2 < 1, eps >= 0, weight_decay >= 0, all
 * finite. */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    bool amsgrad;
} na_adam_cfg;
#define NA_ADAM_DEFAULTS { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8 }
#define NA_ADAMW_DEFAULTS \
    { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2 }

/* ---- making -------------------------------------------------------------------------- */
/* An optimizer with one group holding params (NA_NO_TENSORS: no group yet; add groups with
 * na_optim_add_group). The pointers are copied. NULL with an error on an invalid config or
 * list (a failed na_module_parameters keeps its error). */
na_optim *na_sgd_new(na_tensor_list params, const na_sgd_cfg *cfg);
na_optim *na_adam_new(na_tensor_list params, const na_adam_cfg *cfg);
na_optim *na_adamw_new(na_tensor_list params, const na_adam_cfg *cfg); /* decoupled decay */
void na_optim_free(na_optim *o); /* its state; not the parameters. NULL is fine */

/* Adds a group of parameters (persistent float tensors that require grad, not already in the
 * optimizer) with the optimizer's hyper-parameters. Returns the group's index (>= 0) or a
 * negative status. */
int na_optim_add_group(na_optim *o, na_tensor_list params);

/* ---- stepping -------------------------------------------------------------------------- */
typedef struct {
    /* f32 0-dim on the parameters' device, or NULL: when nonzero nothing changes (params,
     * state, step counts, copies). Read by the kernel: no host round trip. */
    const na_tensor *found_inf;
    /* f32 0-dim or NULL: gradients are multiplied by it before use (unscaling). */
    const na_tensor *inv_scale;
    /* NULL: each parameter's .grad. Else one entry per parameter of the optimizer, in the
     * order added (NULL entries skip that parameter), of any float dtype: e.g. the f16
     * gradients of a half model whose f32 master weights this optimizer holds. */
    na_tensor *const *grads;
    /* NULL, or one entry per parameter (NULL entries allowed): the updated parameter is
     * written there too, rounded to its dtype (the f16 model copy of an f32 master). */
    na_tensor *const *copies;
} na_optim_step_opts;
/* One step for every parameter that has a gradient. opts may be NULL. */
int na_optim_step(na_optim *o, const na_optim_step_opts *opts);
int na_optim_zero_grad(na_optim *o); /* zeroes every existing gradient (lazily: see above) */

/* ---- inspecting and changing ------------------------------------------------------------- */
na_optim_kind na_optim_kind_of(const na_optim *o);
int na_optim_num_groups(const na_optim *o);
int64_t na_optim_num_params(const na_optim *o);
na_tensor *na_optim_param(const na_optim *o, int64_t i); /* in the order added */
na_tensor_list na_optim_parameters(const na_optim *o);   /* all of them: a step list */
int na_optim_param_group(const na_optim *o, int64_t i);  /* the group of parameter i */
/* group -1: every group. lr and weight_decay finite and >= 0. */
int na_optim_set_lr(na_optim *o, int group, double lr);
/* The learning rate read on the device, for a training step replayed as a CUDA graph
 * (na_step_graph_capture, nanoamp/tensor.h), where a host value would be frozen at capture.
 * On: every group keeps an f64 copy of its lr on each device of its parameters, which the
 * optimizer kernels read in place of the host value (the same double: the same update, bit
 * for bit). na_optim_set_lr and na_optim_set_initial_lr (so na_lr_schedule_apply) write it at
 * once, a host->device copy enqueued on the stream (no sync), and so does every
 * na_optim_step outside a capture (a value loaded through the state list). Groups added
 * later get their copies too. Off (the default): the host value, passed at each launch. */
int na_optim_set_lr_on_device(na_optim *o, bool on);
bool na_optim_lr_on_device(const na_optim *o);
int na_optim_set_weight_decay(na_optim *o, int group, double weight_decay);
double na_optim_lr(const na_optim *o, int group);           /* NAN for a bad group */
double na_optim_weight_decay(const na_optim *o, int group); /* NAN for a bad group */
/* A group's base lr, which schedules scale: the config's lr when the group was added, or
 * what na_optim_set_initial_lr set (it sets the lr too: a group with its own base lr). */
double na_optim_initial_lr(const na_optim *o, int group);
int na_optim_set_initial_lr(na_optim *o, int group, double lr);

/* ---- saving and loading ---------------------------------------------------------------- */
/* The state protocol (nanoamp/state.h): appends the optimizer's whole state, each name
 * prefixed with prefix:
 *   "state.<i>.step"             f32 0-dim, steps taken by parameter i (i in order added)
 *   "state.<i>.momentum_buffer"  SGD with momentum
 *   "state.<i>.exp_avg", "state.<i>.exp_avg_sq", "state.<i>.max_exp_avg_sq" (amsgrad)
 *   "group.<g>.lr", ".weight_decay", ".initial_lr", and ".momentum", ".dampening" (SGD) or
 *   ".beta1", ".beta2", ".eps" (Adam/AdamW): f64 0-dim CPU tensors.
 * Load into an optimizer made the same way (same parameters, groups and config); loaded
 * hyper-parameters are checked at the next step, or at once with na_optim_check. */
int na_optim_state(na_optim *o, const char *prefix, na_named_tensors *out);
/* Every group's hyper-parameters as na_optim_step checks them: finite; lr, initial_lr,
 * weight_decay, eps >= 0; momentum, beta1, beta2 in [0, 1); dampening in [0, 1]; nesterov
 * with a momentum > 0 and no dampening. For values just loaded through the state list: NA_OK,
 * or NA_EINVAL naming the key as na_optim_state lists it after prefix, "optim.group.0.momentum:
 * invalid momentum inf (expected 0 <= momentum < 1)". */
int na_optim_check(const na_optim *o, const char *prefix);

/* ---- learning-rate schedules --------------------------------------------------------------- */
/* Closed forms of PyTorch's schedulers as functions of the step t (0 for the first step):
 * the lr to use for step t given a group's base lr (its initial lr). Stateless: the training
 * loop's step count is the schedule's whole state. */
typedef enum {
    NA_LR_CONSTANT,  /* base */
    NA_LR_STEP,      /* StepLR: base * gamma^floor(t / step_size) */
    NA_LR_COSINE,    /* CosineAnnealingLR: eta_min + (base - eta_min)(1 + cos(pi t/t_max))/2 */
    NA_LR_LINEAR,    /* LinearLR (warmup): base * (start + (end - start) min(t, total)/total) */
    NA_LR_ONE_CYCLE, /* OneCycleLR with max_lr = base (below) */
} na_lr_kind;

typedef struct {
    na_lr_kind kind;
    int64_t step_size; double gamma;                       /* STEP */
    int64_t t_max; double eta_min;                         /* COSINE */
    double start_factor, end_factor; int64_t total_iters;  /* LINEAR */
    /* ONE_CYCLE: warm from base/div_factor to base over pct_start of total_steps, then anneal
     * to base/(div_factor*final_div_factor) (three_phase: back to base/div_factor first);
     * cosine annealing unless anneal_linear. Steps t > total_steps are an error. Only the lr
     * cycles (PyTorch's cycle_momentum is not done). */
    int64_t total_steps; double pct_start, div_factor, final_div_factor;
    bool three_phase, anneal_linear;
} na_lr_schedule;

na_lr_schedule na_lr_constant(void);
na_lr_schedule na_lr_step(int64_t step_size, double gamma);
na_lr_schedule na_lr_cosine(int64_t t_max, double eta_min);
na_lr_schedule na_lr_linear(double start_factor, double end_factor, int64_t total_iters);
/* pct_start 0.3, div_factor 25, final_div_factor 1e4, cosine (PyTorch's defaults). */
na_lr_schedule na_lr_one_cycle(int64_t total_steps);

/* The lr for step t; NAN with an error for an invalid schedule or step. */
double na_lr_schedule_lr(const na_lr_schedule *s, double base_lr, int64_t t);
/* Sets every group's lr to na_lr_schedule_lr(s, na_optim_initial_lr(o, g), t); NA_EINVAL
 * naming the group when its initial lr is not finite and >= 0 (a loaded NaN). */
int na_lr_schedule_apply(const na_lr_schedule *s, na_optim *o, int64_t t);

/* ---- gradient clipping -------------------------------------------------------------------- */
/* PyTorch's clip_grad_norm_: total = sqrt(sum of every gradient element squared), f32
 * accumulation; gradients are multiplied by min(1, max_norm / (total + 1e-6)). Parameters
 * without a gradient are ignored; all gradients must be on one device. Returns total as an
 * f32 0-dim step tensor on that device (read it with na_item: a sync on CUDA). When total
 * is inf or NaN the gradients are left unchanged, so the caller (or the GradScaler's skip)
 * sees them: check isfinite(na_item(total)). max_norm >= 0 (inf: only measure). */
na_tensor *na_clip_grad_norm(na_tensor_list params, double max_norm);
/* na_clip_grad_norm(na_optim_parameters(o), max_norm) */
na_tensor *na_optim_clip_grad_norm(na_optim *o, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
