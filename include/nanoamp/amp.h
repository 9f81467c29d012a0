/* nanoamp/amp.h — mixed precision: autocast (nanoamp/autocast.h, included here), loss
 * scaling, fp32 master weights, model conversion, a precision recommendation and a training
 * monitor.
 *
 * Two ways to train in mixed precision, as the field knows them (docs/mixed-precision.md):
 *
 * PyTorch style ("native AMP"): an f32 model, autocast regions in which each op runs in the
 * dtype its rule says, and a GradScaler:
 *
 *     na_grad_scaler *gs = na_grad_scaler_new(NULL);        // 2^16, x2, x0.5, every 2000
 *     for (...) {
 *         na_autocast_begin(NA_DTYPE_F16);
 *         na_tensor *loss = na_cross_entropy(na_module_forward(net, x), y, NULL);
 *         na_autocast_end();
 *         na_backward(na_grad_scaler_scale(gs, loss), NULL);
 *         na_grad_scaler_step(gs, opt);       // unscales; skipped on the device on inf/NaN
 *         na_grad_scaler_update(gs);          // backoff or growth, on the device
 *         na_optim_zero_grad(opt);
 *         na_step_end();
 *     }
 *
 * Apex style ("O2"): the model converted to f16 except BatchNorm, f32 master weights, dynamic
 * loss scaling:
 *
 *     na_module *half = na_model_to_half(net, NA_DTYPE_F16);     // takes net
 *     na_fp16_optimizer_cfg fc = NA_FP16_OPTIMIZER_DYNAMIC;
 *     na_fp16_optimizer *fo = na_fp16_optimizer_new(na_sgd_new(NA_NO_TENSORS, &sgd_cfg),
 *                                                   na_module_parameters(half), &fc);
 *     for (...) {
 *         na_tensor *loss = na_cross_entropy(na_module_forward(half, x), y, NULL);
 *         na_fp16_optimizer_backward(fo, loss, true);
 *         na_fp16_optimizer_step(fo);
 *         na_fp16_optimizer_zero_grad(fo);
 *         na_step_end();
 *     }
 *
 * Where state lives: the loss scale, the growth tracker and the found-inf flags are tensors on
 * the parameters' device. Unscaling and the inf/NaN check are one fused pass; the optimizer
 * kernel reads found_inf and skips on the device; the update runs on the device. Nothing in a
 * training step reads them on the host; the calls that do (get_scale, stats, the monitor's
 * record_scaler, the fp16 optimizer's clip and verbose messages) say so. On the CPU backend a
 * read is free.
 */
#ifndef NANOAMP_AMP_H
#define NANOAMP_AMP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nanoamp/autocast.h" /* autocast regions, rules and the trace: part of the ops layer */
#include "nanoamp/nn.h"
#include "nanoamp/ops.h"
#include "nanoamp/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== loss scaling ==========================================================================
 * One interface, four rules (kernels/common/amp.h has them exactly):
 *   NA_SCALER_GRAD          PyTorch's GradScaler: backoff x0.5 and reset on inf; x2 after
 *                           growth_interval clean steps, never to inf.
 *   NA_SCALER_STATIC        a fixed scale; never skips a step by itself (Apex LossScaler(N)).
 *   NA_SCALER_APEX_LEGACY   Apex fp16_utils' DynamicLossScaler: init 2^32, /2 (at least 1) on
 *                           overflow, x2 when (iteration - last overflow) % 1000 == 0.
 *   NA_SCALER_APEX          Apex amp's dynamic LossScaler: init 2^16, /2 on overflow (at least
 *                           min_scale if given), x2 after 2000 clean steps, at most 2^24.
 * Start from one of the config macros and change fields.
 *
 * Which steps are skipped: GRAD, APEX and APEX_LEGACY skip every step whose gradients hold an
 * inf or NaN (the optimizer leaves parameters and state untouched). STATIC never skips: an inf
 * or NaN gradient is applied to the weights (Apex's static loss scale; use it only to follow
 * an Apex recipe). For a fixed scale that still skips non-finite steps, PyTorch-style, use
 * NA_GRAD_SCALER_FIXED(s): a GRAD scaler whose growth and backoff factors are both 1.
 *
 * Bounds, for every kind: the scale never falls below max(min_scale, NA_GRAD_SCALER_FLOOR)
 * nor grows above max_scale (when > 0) or to inf. A STATIC or fixed scale, and a new scale
 * given to update_to, must lie within them (else NA_EINVAL). PyTorch's GradScaler has no
 * floor: its scale can halve down to 0, after which unscaling turns zero gradients into NaN.
 *
 * Per step, with any number of losses and optimizers (one scaler for all of them):
 *   na_backward(na_grad_scaler_scale(gs, loss), NULL);   // for each loss
 *   na_grad_scaler_unscale_(gs, opt);  na_optim_clip_grad_norm(opt, 1.0);  // optional
 *   na_grad_scaler_step(gs, opt);                        // for each optimizer
 *   na_grad_scaler_update(gs);                           // once, after every step
 * Each optimizer skips on its own found_inf; the scale backs off once if any found one.
 * unscale_ refuses f16 gradients, as PyTorch: native AMP keeps f32 parameters (use the fp16
 * optimizer below for an f16 model). With bf16 autocast no scaler is needed; a scaler used
 * with bf16 still works. */
typedef enum {
    NA_SCALER_GRAD = 0,
    NA_SCALER_STATIC = 1,
    NA_SCALER_APEX_LEGACY = 2,
    NA_SCALER_APEX = 3,
} na_scaler_kind;

/* The lowest scale any kind reaches, 2^-24: f16's smallest subnormal. Below it every f16
 * gradient of magnitude <= 1 rounds to 0; its reciprocal is exact in f32. */
#define NA_GRAD_SCALER_FLOOR 5.9604644775390625e-08

typedef struct {
    na_scaler_kind kind;
    double init_scale;      /* within [min_scale, max_scale] (Apex amp: capped at max_scale) */
    double growth_factor;   /* > 1 (Apex: scale_factor; Apex rules also divide by it); GRAD:
                               1 together with backoff_factor 1 for a fixed scale */
    double backoff_factor;  /* in (0, 1); PyTorch's rule only */
    int64_t growth_interval; /* >= 1 (Apex: scale_window) */
    double min_scale;       /* lower bound, >= NA_GRAD_SCALER_FLOOR; 0: the floor */
    double max_scale;       /* upper bound; 0 for none */
    bool enabled;           /* false: scale() returns the loss, step() is a plain step */
    na_device device;       /* where the state is made; it follows the first scaled loss */
} na_grad_scaler_cfg;

#define NA_GRAD_SCALER_DEFAULTS                                                          \
    { .kind = NA_SCALER_GRAD, .init_scale = 65536.0, .growth_factor = 2.0,               \
      .backoff_factor = 0.5, .growth_interval = 2000, .enabled = true }
/* PyTorch-style fixed scale s: skips steps with inf/NaN gradients, the scale never moves. */
#define NA_GRAD_SCALER_FIXED(s)                                                          \
    { .kind = NA_SCALER_GRAD, .init_scale = (s), .growth_factor = 1.0,                   \
      .backoff_factor = 1.0, .growth_interval = 2000, .enabled = true }
/* Apex's static scale s: never skips, an inf gradient reaches the weights. */
#define NA_STATIC_SCALER(s)                                                              \
    { .kind = NA_SCALER_STATIC, .init_scale = (s), .growth_factor = 2.0,                 \
      .backoff_factor = 0.5, .growth_interval = 1, .enabled = true }
#define NA_APEX_LEGACY_SCALER_DEFAULTS                                                   \
    { .kind = NA_SCALER_APEX_LEGACY, .init_scale = 4294967296.0, .growth_factor = 2.0,   \
      .backoff_factor = 0.5, .growth_interval = 1000, .min_scale = 1.0, .enabled = true }
#define NA_APEX_SCALER_DEFAULTS                                                          \
    { .kind = NA_SCALER_APEX, .init_scale = 65536.0, .growth_factor = 2.0,               \
      .backoff_factor = 0.5, .growth_interval = 2000, .max_scale = 16777216.0,           \
      .enabled = true }

typedef struct na_grad_scaler na_grad_scaler;

/* NULL cfg: NA_GRAD_SCALER_DEFAULTS. NULL with an error on an invalid config. */
na_grad_scaler *na_grad_scaler_new(const na_grad_scaler_cfg *cfg);
void na_grad_scaler_free(na_grad_scaler *gs); /* NULL is fine */

/* loss (any float dtype, any shape) as f32 times the scale: a step tensor to call na_backward
 * on. Disabled: loss itself. The scaler's state moves to loss's device on first use. */
na_tensor *na_grad_scaler_scale(na_grad_scaler *gs, na_tensor *loss);
/* Unscales opt's gradients in place (fused, with the inf/NaN check into opt's found_inf).
 * At most once per optimizer between updates: again, or after step(), is an NA_ESTATE error
 * with PyTorch's message. f16 gradients: NA_EDTYPE "Attempting to unscale FP16 gradients.". */
int na_grad_scaler_unscale_(na_grad_scaler *gs, na_optim *opt);
/* Unscales (if not done yet) and steps opt unless its gradients held an inf or NaN (decided
 * by the optimizer kernel from found_inf: no host round trip). STATIC never skips. */
int na_grad_scaler_step(na_grad_scaler *gs, na_optim *opt);
/* Applies the rule once (on the device) from every optimizer's found_inf since the last
 * update, and makes all optimizers ready for the next step. */
int na_grad_scaler_update(na_grad_scaler *gs);
/* PyTorch's update(new_scale): the scale becomes new_scale, the tracker is left alone.
 * new_scale must lie within the scaler's bounds (see above). */
int na_grad_scaler_update_to(na_grad_scaler *gs, double new_scale);

/* The current scale (1 when disabled). Reads the device: a sync on CUDA. */
double na_grad_scaler_get_scale(const na_grad_scaler *gs);
/* The scale as the f32 0-dim tensor on the device (NULL when disabled). */
const na_tensor *na_grad_scaler_scale_tensor(const na_grad_scaler *gs);
/* opt's found_inf flag (f32 0-dim), or NULL if opt was never unscaled by gs. */
const na_tensor *na_grad_scaler_found_inf(const na_grad_scaler *gs, const na_optim *opt);
bool na_grad_scaler_is_enabled(const na_grad_scaler *gs);
/* A disabled scaler reports NA_SCALER_STATIC: it acts as a static scale of 1. */
na_scaler_kind na_grad_scaler_kind(const na_grad_scaler *gs);
const char *na_scaler_kind_name(na_scaler_kind kind); /* "grad_scaler", "static", ... */
na_grad_scaler_cfg na_grad_scaler_config(const na_grad_scaler *gs); /* current values */

typedef struct {
    double scale;
    int64_t growth_tracker;     /* PyTorch tracker; Apex unskipped; Apex legacy cur_iter */
    int64_t last_overflow_iter; /* Apex legacy; -1 before the first overflow */
    int64_t updates;            /* update() calls so far */
    int64_t skipped;            /* updates at which some optimizer skipped its step */
} na_grad_scaler_stats;
/* Reads the counters (a sync on CUDA). */
int na_grad_scaler_stats_get(const na_grad_scaler *gs, na_grad_scaler_stats *out);

/* The state protocol (nanoamp/state.h), PyTorch's state_dict keys after prefix:
 *   "scale" f32 0-dim; "_growth_tracker", "last_overflow_iter", "updates", "skipped_steps"
 *   i32 0-dim (on the scaler's device); "kind" i32 0-dim, "growth_factor", "backoff_factor",
 *   "growth_interval", "min_scale", "max_scale" f64 0-dim (CPU).
 * Only between update() and the next step (NA_ESTATE otherwise), as PyTorch's pickling. A
 * disabled scaler has no state (appends nothing). The list hands out the live tensors, so
 * the next scale() checks them (kind, factors, bounds, the scale within them: one read of
 * the scale, a sync on CUDA, once per listing) and fails with NA_EINVAL on a bad loaded
 * value. */
int na_grad_scaler_state(na_grad_scaler *gs, const char *prefix, na_named_tensors *out);

/* ==== model conversion (Apex network_to_half / FP16Model / BN_convert_float) ==================
 * Every float parameter and buffer (and gradient) of the tree becomes dt (f16 or bf16) except
 * BatchNorm's, which keep f32: its parameters (affine BatchNorm, as Apex) and its running
 * statistics, which nanoamp's batch norm (like cuDNN's) keeps in f32 for f16/bf16 input. A
 * non-affine BatchNorm has no parameters, so "every parameter f16 except affine BatchNorm's"
 * holds exactly; Apex would also make a non-affine BatchNorm's statistics f16. In place (the
 * tensor structs stay, so optimizers and pointers stay valid). */
int na_model_convert(na_module *m, na_dtype dt);
/* A module whose forward casts its input to dt (Apex's tofp16). */
na_module *na_cast_input_new(na_dtype dt);
/* Converts m (na_model_convert) and wraps it: an "FP16Model" module, m as its child
 * "network", whose forward casts the input to dt and runs m (outputs stay dt). Takes m (also
 * on failure, when it is freed). */
na_module *na_model_to_half(na_module *m, na_dtype dt);

/* ==== fp32 master weights (Apex FP16_Optimizer) ==============================================
 * Wraps any nanoamp optimizer, made WITHOUT parameters (na_sgd_new(NA_NO_TENSORS, &cfg)): the fp16
 * optimizer adds the f32 master copies of the model's f16/bf16 parameters (f32 parameters are
 * used directly) as the optimizer's parameters, optionally as one flat f32 buffer. Per step:
 *   backward(loss): loss as f32 times the scale, backward (f16 gradients), then (unless
 *     deferred) update_master_grads: the f16 gradients are copied into the f32 master
 *     gradients and unscaled in one fused pass with the overflow check;
 *   step(): updates the scaler once (on the device) from the last update_master_grads'
 *     overflow flag, steps the masters unless that overflowed (the optimizer kernel reads the
 *     flag), then copies the masters into the f16 parameters (fused into the optimizer kernel).
 * Several losses per step: backward(loss, false) for each, then update_master_grads once (or
 * backward(loss, true) for each: the scale is still updated once, at step()). The scaler's
 * kind decides whether an overflowing step is skipped (see loss scaling above): the static
 * default applies it, as Apex's static_loss_scale. */
typedef struct {
    na_grad_scaler_cfg scaler; /* Apex: static 1.0 unless dynamic_loss_scale */
    bool flat_master;          /* one flat f32 master buffer for the f16 parameters */
    bool verbose;              /* step() prints Apex's "Gradient overflow.  Skipping step,
                                  reducing loss scale to S" (reads the flag: a sync on CUDA) */
} na_fp16_optimizer_cfg;
#define NA_FP16_OPTIMIZER_DEFAULTS { .scaler = NA_STATIC_SCALER(1.0) }
#define NA_FP16_OPTIMIZER_DYNAMIC { .scaler = NA_APEX_SCALER_DEFAULTS }

typedef struct na_fp16_optimizer na_fp16_optimizer;

/* Takes opt (freed with the fp16 optimizer, also on failure). params: the model's parameters,
 * a first group (na_module_parameters(model)); NA_NO_TENSORS: add groups with
 * na_fp16_optimizer_add_group. NULL cfg: NA_FP16_OPTIMIZER_DEFAULTS. */
na_fp16_optimizer *na_fp16_optimizer_new(na_optim *opt, na_tensor_list params,
                                         const na_fp16_optimizer_cfg *cfg);
/* A group of model parameters (float, persistent, requiring grad); returns the group index
 * in the wrapped optimizer (its lr etc. are set there) or a negative status. */
int na_fp16_optimizer_add_group(na_fp16_optimizer *fo, na_tensor_list params);
void na_fp16_optimizer_free(na_fp16_optimizer *fo); /* masters, scaler, the optimizer */

int na_fp16_optimizer_backward(na_fp16_optimizer *fo, na_tensor *loss, bool update_master_grads);
int na_fp16_optimizer_update_master_grads(na_fp16_optimizer *fo);
int na_fp16_optimizer_step(na_fp16_optimizer *fo);
/* Clips the master gradients to max_norm (PyTorch's rule) and returns their total norm, or -1
 * when the last update_master_grads found an overflow (reads the flag and the norm: a sync on
 * CUDA). NAN with an error on failure. */
double na_fp16_optimizer_clip_master_grads(na_fp16_optimizer *fo, double max_norm);
int na_fp16_optimizer_zero_grad(na_fp16_optimizer *fo); /* model and master gradients */
/* Whether the last update_master_grads found an overflow (a sync on CUDA). */
bool na_fp16_optimizer_overflow(const na_fp16_optimizer *fo);

na_optim *na_fp16_optimizer_optim(const na_fp16_optimizer *fo);
na_grad_scaler *na_fp16_optimizer_scaler(const na_fp16_optimizer *fo);
int64_t na_fp16_optimizer_num_params(const na_fp16_optimizer *fo); /* model parameters */
na_tensor *na_fp16_optimizer_model_param(const na_fp16_optimizer *fo, int64_t i);
/* The f32 tensor holding model parameter i's master value: the parameter itself when f32, a
 * master copy, or (flat) a view into the flat buffer whose grad is the same view into the
 * flat gradient. Its grad is the f32 master gradient update_master_grads writes. */
na_tensor *na_fp16_optimizer_master(const na_fp16_optimizer *fo, int64_t i);

/* The state protocol (nanoamp/state.h), after prefix: "optimizer.<name>" (na_optim_state of
 * the wrapped optimizer, whose parameters are the masters), "scaler.<name>"
 * (na_grad_scaler_state), "fp32_from_fp16.<i>" (master copy of the i-th f16 parameter; or
 * "fp32_from_fp16_flat.<g>" per group when flat). Save the model's state too. */
int na_fp16_optimizer_state(na_fp16_optimizer *fo, const char *prefix, na_named_tensors *out);

/* ---- manual helpers (Apex fp16util) ---------------------------------------------------------
 * For users who keep master weights themselves:
 *     na_param_lists pl;
 *     na_prep_param_lists(model, false, &pl);     // f32 clones of every trainable parameter
 *     na_optim *opt = na_sgd_new((na_tensor_list){pl.n_master, pl.master}, &cfg);
 *     ... backward ...; na_model_grads_to_master_grads(&pl); (unscale); na_optim_step(opt, NULL);
 *     na_master_params_to_model_params(&pl);
 *     na_param_lists_free(&pl);                    // the masters, not the model */
typedef struct {
    int64_t n_model;
    na_tensor **model;  /* the model's parameters that require grad (not owned) */
    int64_t n_master;   /* n_model, or 1 when flat */
    na_tensor **master; /* f32 persistent leaves that require grad, with gradients allocated */
    bool flat;
} na_param_lists;
/* flat: one 1-d f32 master of all parameters (they must share one dtype, as Apex asks). */
int na_prep_param_lists(na_module *model, bool flat, na_param_lists *out);
/* Copies the model gradients into the master gradients (converted to f32); a parameter
 * without a gradient gives a zero master gradient. */
int na_model_grads_to_master_grads(na_param_lists *pl);
/* Copies the master values into the model parameters (rounded to their dtype). */
int na_master_params_to_model_params(na_param_lists *pl);
void na_param_lists_free(na_param_lists *pl);

/* ==== which precision to use ================================================================ */
typedef enum {
    NA_AMP_MODE_F32,  /* no mixed precision */
    NA_AMP_MODE_BF16, /* bf16 autocast, no loss scaling */
    NA_AMP_MODE_F16,  /* f16 autocast with dynamic loss scaling */
    NA_AMP_MODE_FP8,  /* FP8 Linear/Conv2d in bf16 autocast (nanoamp/fp8.h), no loss scaling */
} na_amp_mode;
typedef struct {
    na_amp_mode mode;
    na_dtype dtype;     /* the autocast dtype (f32 for NA_AMP_MODE_F32) */
    bool loss_scaling;  /* use a dynamic GradScaler */
    const char *reason; /* one sentence on why */
} na_amp_recommendation;
/* bf16 where the device computes it natively (CUDA sm_80+), f16 with dynamic loss scaling on
 * CUDA devices with tensor cores but no bf16 (sm_70..sm_75), f32 otherwise. The CPU gets bf16,
 * PyTorch's CPU autocast default: the CPU backend emulates f16/bf16 bit-exactly (widened to f32,
 * rounded on store), so it is slower than f32 there and serves correctness, not speed. */
na_amp_recommendation na_amp_recommend(na_device dev);
const char *na_amp_mode_name(na_amp_mode mode); /* "f32", "bf16", "f16", "fp8" */
/* The parameter count from which na_amp_recommend_model calls a model large: FP8 pays for its
 * casts and amax reads only where the GEMMs dominate (Transformer Engine's use: models of
 * hundreds of millions of parameters and up). */
#define NA_AMP_FP8_MIN_PARAMS 100000000
/* na_amp_recommend, and FP8 (NA_AMP_MODE_FP8, dtype bf16 for the rest) where the device has
 * FP8 tensor cores (CUDA sm_89 and newer: Ada, Hopper) and the model has at least
 * NA_AMP_FP8_MIN_PARAMS parameters. */
na_amp_recommendation na_amp_recommend_model(na_device dev, int64_t params);

/* ==== divergence without a host round trip =================================================
 * A loop that reads its loss only every k steps (a read is a sync on CUDA) still learns the
 * first step whose loss was inf or NaN: each step notes it on the device,
 *     na_tensor *first = na_tensor_new(NA_DTYPE_F64, dev, 0, NULL);   // 0: none yet
 *     na_fill_(first, 0);
 *     ... each step t (from 1): na_amp_note_nonfinite(first, loss, t);
 *     ... when the loss is read anyway: if (na_item(first) != 0) -> diverged at that step
 * first (f64 0-dim, on x's device) becomes step (>= 1, exact up to 2^53) when it is 0 and x (any
 * float dtype and shape, contiguous) holds an inf or NaN; otherwise nothing changes. One small
 * kernel on the stream, no sync; not recorded by autograd. */
int na_amp_note_nonfinite(na_tensor *first, const na_tensor *x, int64_t step);

/* ==== monitoring ============================================================================
 * Records one line per step (loss, scale, skipped) and watches for trouble:
 *   NA_AMP_ALERT_LOSS_RISING     the loss's moving average (EMA, 0.9) rose for loss_rise_steps
 *                                steps in a row
 *   NA_AMP_ALERT_SKIP_RATE       more than skip_rate_alert of the last `window` steps skipped
 *                                (once at least window/4 steps are recorded)
 *   NA_AMP_ALERT_SCALE_COLLAPSE  the scale is below scale_drop_ratio of its value
 *                                scale_drop_updates records ago
 *   NA_AMP_ALERT_NONFINITE_LOSS  the loss itself is inf or NaN
 *   NA_AMP_ALERT_SCALE_FLOOR     the scale is at its floor (scale_floor, or for
 *                                record_scaler the scaler's min_scale or NA_GRAD_SCALER_FLOOR):
 *                                the gradients overflow even there, the scaler cannot help
 * with an optional CSV log "step,loss,scale,skipped" (examples/amp/amp-plot turns it into an
 * SVG). */
enum {
    NA_AMP_ALERT_LOSS_RISING = 1,
    NA_AMP_ALERT_SKIP_RATE = 2,
    NA_AMP_ALERT_SCALE_COLLAPSE = 4,
    NA_AMP_ALERT_NONFINITE_LOSS = 8,
    NA_AMP_ALERT_SCALE_FLOOR = 16,
};
typedef struct {
    int window;              /* steps in the skip-rate window */
    int loss_rise_steps;
    double skip_rate_alert;  /* a fraction */
    double scale_drop_ratio;
    int scale_drop_updates;
    double scale_floor;      /* for na_amp_monitor_record; 0: NA_GRAD_SCALER_FLOOR */
} na_amp_monitor_cfg;
#define NA_AMP_MONITOR_DEFAULTS                                                     \
    { .window = 100, .loss_rise_steps = 50, .skip_rate_alert = 0.3,                 \
      .scale_drop_ratio = 0.1, .scale_drop_updates = 10 }

typedef struct na_amp_monitor na_amp_monitor;
na_amp_monitor *na_amp_monitor_new(const na_amp_monitor_cfg *cfg); /* NULL: defaults */
void na_amp_monitor_free(na_amp_monitor *m); /* closes the CSV log */
/* Starts a CSV log at path (written through, flushed at each record). NA_EIO with the reason
 * ("Is a directory", "No space left on device") when path cannot be written. */
int na_amp_monitor_open_csv(na_amp_monitor *m, const char *path);
/* The same after what path already holds (a resumed run's log goes on), the header only when
 * the file is new or empty. */
int na_amp_monitor_append_csv(na_amp_monitor *m, const char *path);
/* NA_OK while every line of the log was written; after the first failed write (a full disk)
 * the log stops and this returns NA_EIO naming the file and the reason. Records cannot return
 * it (they return alerts): check after each, or at least at the end of the run. */
int na_amp_monitor_csv_status(const na_amp_monitor *m);
/* One step. Returns the alerts raised by this record (0 when none). */
unsigned na_amp_monitor_record(na_amp_monitor *m, int64_t step, double loss, double scale,
                               bool skipped);
/* The same from a loss tensor and a scaler (NULL: scale 1, never skipped): reads the loss, the
 * scale and the skipped counter, so one call per k steps still counts every skip (a sync on
 * CUDA: record every k steps there). */
unsigned na_amp_monitor_record_scaler(na_amp_monitor *m, int64_t step, const na_tensor *loss,
                                      const na_grad_scaler *gs);
int64_t na_amp_monitor_steps(const na_amp_monitor *m);
int64_t na_amp_monitor_skipped(const na_amp_monitor *m);     /* in total */
double na_amp_monitor_skip_rate(const na_amp_monitor *m);    /* over the window */
double na_amp_monitor_scale(const na_amp_monitor *m);        /* the last recorded */
unsigned na_amp_monitor_alerts(const na_amp_monitor *m);     /* raised by the last record */
/* The alerts as text ("loss rising for 50 steps; ..."), "" when none. Returns buf. */
const char *na_amp_monitor_describe(const na_amp_monitor *m, char *buf, size_t size);
/* The state protocol (nanoamp/state.h), after prefix: "counters" f64 [10] (records, steps,
 * skipped, loss average, rising records, last scale, last floor, last alerts, and the
 * scaler's updates and skipped counters at the last record_scaler), "skip_window" f64
 * [window, 2] (steps and skips per record), "scale_history" f64 [scale_drop_updates + 1]; all
 * on the CPU. Saved with the scaler, it lets a resumed run go on counting and alerting as if
 * never stopped (without it, the first record_scaler after a resume would count every skip
 * the restored scaler ever made as one record's). Load into a monitor made with the same
 * config; every record checks the counts are whole numbers >= 0, else records nothing and
 * sets an NA_EINVAL error. The CSV log is not state: it is the caller's file. */
int na_amp_monitor_state(na_amp_monitor *m, const char *prefix, na_named_tensors *out);
/* Logs, with each CSV line, every FP8 layer's scales (nanoamp/fp8.h: as update() left them,
 * the next step's) and running counts of saturated values, per tensor: after the four columns
 * "fp8.<layer>.<role>.scale,fp8.<layer>.<role>.saturated" for each layer and role (input,
 * weight, grad_output). Before the log is opened (NA_ESTATE after); fm NULL: no columns. fm
 * must outlive the monitor's records. */
struct na_fp8_model;
int na_amp_monitor_watch_fp8(na_amp_monitor *m, const struct na_fp8_model *fm);

/* ==== magnitudes on a dtype's number line ===================================================
 * Where a tensor's values fall once stored in dtype (f16, bf16, f32, f8e4m3 or f8e5m2): each
 * value is rounded to dtype as a cast rounds it (to nearest, ties to even: kernels/common/half.h
 * and float8.h) and counted as already zero, rounded to 0 (underflow: not 0, but 0 in dtype),
 * subnormal, normal, overflow (finite, but inf in dtype; for E4M3, which has no inf, beyond 464:
 * what its cast clips to 448) or already inf/NaN; and a histogram of log2 |x| of the
 * values as given, one bin per power of two. For a gradient that is to live in f16, the
 * underflow share is what dies there (docs/mixed-precision.md, lesson 5). Host only, and
 * na_amp_hist_add_tensor copies its tensor to the host (a sync on CUDA): meant for a few
 * sampled steps, never for every step.
 *
 *     na_amp_hist h;
 *     na_amp_hist_init(&h, NA_DTYPE_F16);
 *     na_amp_hist_add_tensor(&h, w->grad);               // any number of tensors
 *     printf("%.1f%% round to 0\n", 100.0 * h.underflow / h.n); */
#define NA_AMP_HIST_LO (-150) /* bins[b] counts 2^(LO + b) <= |x| < 2^(LO + b + 1) */
#define NA_AMP_HIST_BINS 280  /* up to 2^130: every finite f32 */
typedef struct {
    na_dtype dtype;  /* the number line: f16, bf16, f32, f8e4m3 or f8e5m2 */
    int64_t n;       /* elements counted */
    int64_t zero, underflow, subnormal, normal, overflow, nonfinite; /* they sum to n */
    int64_t bins[NA_AMP_HIST_BINS]; /* nonzero finite values by floor(log2 |x|) */
} na_amp_hist;
/* The number line of dt (f16, bf16, f32, f8e4m3, f8e5m2): log2 of the smallest subnormal and of the smallest
 * normal, and the largest finite value. NA_EDTYPE for another dtype. */
int na_amp_dtype_range(na_dtype dt, int *min_subnormal_log2, int *min_normal_log2, double *max);
/* An empty histogram on dt's line. NA_EDTYPE for a dtype without one (na_amp_dtype_range). */
int na_amp_hist_init(na_amp_hist *h, na_dtype dt);
/* Counts n host floats. */
int na_amp_hist_add(na_amp_hist *h, const float *x, int64_t n);
/* Counts a float tensor's elements (f32, f16 or bf16, any device: its bits copied to the host
 * and widened there, exactly; no op runs). */
int na_amp_hist_add_tensor(na_amp_hist *h, const na_tensor *x);

/* ==== the backward pass on the number line ===================================================
 * The autocast trace's backward rows (the forward's: nanoamp/autocast.h). While on, each
 * backward pass of this thread (na_backward, na_backward_retain) is traced: a line "backward",
 * then a row per node in the order their backward functions run, with the gradient the node
 * receives (of its op's output): its dtype, its shape and the shares of its elements that are
 * exactly zero (-0 too), subnormal and inf/NaN in that dtype (na_amp_hist on the gradient's
 * own line). Under f16 autocast the cast of the logits to f32 (inside cross_entropy) hands the
 * last linear layer the logits' gradient rounded to f16: what dies there shows on its row.
 *
 *   amp: backward
 *   amp: cast            grad f32   [64,10]          zero   0.00%  subnormal   0.00%  non-finite   0.00%
 *   amp: linear          grad f16   [64,10]          zero   0.00%  subnormal   0.16%  non-finite   0.00%
 *
 * A leaf's own gradient (a parameter's .grad) is no row: count it with na_amp_hist. Each row
 * copies its gradient to the host (a sync on CUDA): meant for one step (mnist-train
 * --amp-trace traces the first), never for every step. A failed copy stops the backward with
 * its error. */
typedef struct {
    const char *name; /* the op's (or custom function's); NULL: the pass begins ("backward") */
    na_dtype dtype;   /* the gradient's */
    na_device device;
    int ndim;
    int64_t shape[NA_MAX_DIMS];
    int64_t n;                          /* its elements */
    bool counted;                       /* f16, bf16 or f32: the counts below are set */
    int64_t zero, subnormal, nonfinite; /* elements exactly 0, subnormal, inf or NaN */
} na_amp_backward_record;
typedef void (*na_amp_backward_trace_fn)(const na_amp_backward_record *r, void *ctx);

/* Traces the backward passes of this thread to out (stderr when NULL) while on; off stops. */
void na_amp_trace_backward(bool on, FILE *out);
/* Sends each record to fn instead of printing (fn NULL: back to printing, to stderr). */
void na_amp_trace_backward_callback(bool on, na_amp_backward_trace_fn fn, void *ctx);
bool na_amp_trace_backward_on(void);
/* The line the trace prints for r (without "amp: " and the newline). Returns buf. */
const char *na_amp_trace_backward_format(const na_amp_backward_record *r, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
