/* nanoamp/fp8.h — FP8 per-tensor scaling recipes, as Transformer Engine defines them.
 *
 * An FP8 number line is short (E4M3: largest 448, E5M2: largest 57344, a few bits of mantissa),
 * so each FP8 tensor travels with one f32 scale: x8 = cast(x * scale), and scale_inv = 1 / scale
 * multiplies the product of a GEMM made from x8. The recipe decides the scale:
 *
 *   delayed  (TE's DelayedScaling, the default) the scale used in a step comes from the amax
 *            (max |x|) of earlier steps, kept in a history of amax_history_len steps; after each
 *            step update() turns the history into the next scale:
 *                amax  = max over the history ("max") or this step's amax ("most_recent")
 *                scale = fp8_max / amax / 2^margin
 *            No extra pass over the tensor: the cast that uses the scale records the amax.
 *   current  (TE's Float8CurrentScaling) the scale from this tensor's own amax in this step,
 *            scale = fp8_max / amax: one more read of the tensor, no history.
 *
 * and the formats: HYBRID (the default) E4M3 for the forward tensors (a layer's input and
 * weight), E5M2 for the gradients (its output gradient), which need range more than precision;
 * or E4M3 for all three.
 *
 * One layer's state (na_fp8_scaling) holds its three tensors, by role:
 *
 *     na_fp8_recipe_cfg rc = NA_FP8_RECIPE_DEFAULTS;        // delayed, hybrid, 1024, max, 0
 *     na_fp8_scaling *fs = na_fp8_scaling_new(&rc);
 *     for (...) {
 *         float s = na_fp8_scaling_scale(fs, NA_FP8_INPUT);   // the scale to cast x with
 *         na_fp8_scaling_record(fs, NA_FP8_INPUT, x);         // this step's amax of x
 *         ...                                                 // weight and grad_output alike
 *         na_fp8_scaling_update(fs);                          // after the step
 *     }
 *     na_fp8_scaling_free(fs);
 *
 * Under data parallelism every rank must cast with the same scales: na_dist_fp8_reduce_amax
 * (nanoamp/dist.h) takes each recorded amax's max over ranks; call it before update().
 *
 * The rules, exactly as Transformer Engine's fused update (common/recipe/delayed_scaling.cu,
 * the path TE's PyTorch modules take unless NVTE_UNFUSED_FP8_UPDATE is set):
 *   - the history is [amax_history_len, 3] f32 (TE's layout: one column per tensor); row 0 is
 *     this step's amax, which record() raises to max(row 0, amax) (NaN wins: a NaN recorded
 *     stays visible), and which a rolling update() leaves at 0 for the next step;
 *   - update(), per tensor, with a = row 0:
 *       a == 0:  nothing rolls, the scale stays (a tensor unused in a step does not age its
 *                history);
 *       else:    the history rolls up one row (row i takes row i+1, the last row takes a, row 0
 *                becomes 0); "max" takes the largest finite-or-inf value of the whole window
 *                (NaN is skipped, as CUDA's fmaxf does), "most_recent" takes a itself;
 *       then, if that amax is finite and > 0: scale = (fp8_max * 2^-margin) / amax in f32,
 *       FLT_MAX where that overflows to inf (a tiny amax); otherwise (0, inf, NaN) the previous
 *       scale stays; scale_inv = 1 / scale.
 *     So an inf keeps the scale for as long as it sits in the window (amax_history_len steps
 *     under "max"), while a NaN under "max" is ignored. TE's unfused Python path
 *     (_default_get_amax_and_update_history / _default_sf_compute) always rolls and lets a NaN
 *     in the window freeze the scale instead; nanoamp follows the fused kernel.
 *   - current: record() sets the amax and at once scale = fp8_max / amax (f32), FLT_MAX where
 *     that is inf, and 1 where the amax is 0, inf or NaN (TE's compute_scale_from_amax with
 *     epsilon 0); update() changes nothing.
 * Before the first update every scale and scale_inv is 1, every history value 0 (TE's start).
 *
 * Where the state lives: f32 tensors on the CPU, so every number can be read at no cost and a
 * checkpoint holds them as they are. Recording the amax of a CUDA tensor reads one float back
 * (a sync per call).
 */
#ifndef NANOAMP_FP8_H
#define NANOAMP_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "nanoamp/error.h"
#include "nanoamp/nn.h"
#include "nanoamp/state.h"
#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The two OCP 8-bit formats (E4M3 is the "fn" variant: no infinities). */
typedef enum { NA_FP8_E4M3 = 0, NA_FP8_E5M2 = 1 } na_fp8_format;
#define NA_FP8_E4M3_MAX 448.0
#define NA_FP8_E5M2_MAX 57344.0
double na_fp8_format_max(na_fp8_format f);       /* 448, 57344; NAN for an unknown format */
const char *na_fp8_format_name(na_fp8_format f); /* "e4m3", "e5m2", "?" */
/* The storage dtype of a format (NA_DTYPE_F8E4M3 / NA_DTYPE_F8E5M2, what na_cast and
 * na_scaled_mm take); -1 for an unknown format. */
int na_fp8_format_dtype(na_fp8_format f);

typedef enum { NA_FP8_RECIPE_DELAYED = 0, NA_FP8_RECIPE_CURRENT = 1 } na_fp8_recipe_kind;
/* Which format each role gets (TE's recipe.fp8_format: HYBRID or E4M3). */
typedef enum { NA_FP8_FORMATS_HYBRID = 0, NA_FP8_FORMATS_E4M3 = 1 } na_fp8_formats;
typedef enum { NA_FP8_AMAX_MAX = 0, NA_FP8_AMAX_MOST_RECENT = 1 } na_fp8_amax_algo;
const char *na_fp8_recipe_kind_name(na_fp8_recipe_kind k); /* "delayed", "current" */
const char *na_fp8_formats_name(na_fp8_formats f);         /* "hybrid", "e4m3" */
const char *na_fp8_amax_algo_name(na_fp8_amax_algo a);     /* "max", "most_recent" */

typedef struct {
    na_fp8_recipe_kind kind;
    na_fp8_formats formats;
    int64_t amax_history_len; /* delayed: >= 1 (TE's default 1024); current: not used */
    na_fp8_amax_algo amax_algo; /* delayed only */
    int margin;                 /* delayed: in [0, 64], scale divided by 2^margin; current: 0 */
} na_fp8_recipe_cfg;
#define NA_FP8_RECIPE_DEFAULTS                                                             \
    { .kind = NA_FP8_RECIPE_DELAYED, .formats = NA_FP8_FORMATS_HYBRID,                     \
      .amax_history_len = 1024, .amax_algo = NA_FP8_AMAX_MAX, .margin = 0 }
#define NA_FP8_RECIPE_CURRENT_DEFAULTS                                                     \
    { .kind = NA_FP8_RECIPE_CURRENT, .formats = NA_FP8_FORMATS_HYBRID, .amax_history_len = 1 }

/* NA_OK, or NA_EINVAL naming the field that is wrong (fn leads the message). */
int na_fp8_recipe_check(const char *fn, const na_fp8_recipe_cfg *cfg);

/* The tensors of a layer that run in FP8. */
typedef enum {
    NA_FP8_INPUT = 0,       /* x of y = x @ w^T: forward */
    NA_FP8_WEIGHT = 1,      /* w: forward */
    NA_FP8_GRAD_OUTPUT = 2, /* dy: both backward GEMMs */
    NA_FP8_ROLE_COUNT = 3
} na_fp8_role;
const char *na_fp8_role_name(na_fp8_role r); /* "input", "weight", "grad_output" */
/* The role's format under formats (HYBRID: E5M2 for NA_FP8_GRAD_OUTPUT). */
na_fp8_format na_fp8_formats_format(na_fp8_formats formats, na_fp8_role r);

/* max |x| over a float tensor of any dtype, shape and device, as an f32 0-dim step tensor on
 * x's device (0 for an empty tensor; NaN when x holds a NaN, as torch.amax). Not recorded by
 * autograd, untouched by autocast; made of existing ops (abs, max), so it runs on every
 * backend. NULL with an error on a non-float tensor. */
na_tensor *na_fp8_amax(na_tensor *x);

typedef struct na_fp8_scaling na_fp8_scaling;

/* NULL cfg: NA_FP8_RECIPE_DEFAULTS. NULL with an error (naming the field) on a bad config. */
na_fp8_scaling *na_fp8_scaling_new(const na_fp8_recipe_cfg *cfg);
void na_fp8_scaling_free(na_fp8_scaling *s); /* NULL is fine */
na_fp8_recipe_cfg na_fp8_scaling_config(const na_fp8_scaling *s);
na_fp8_format na_fp8_scaling_format(const na_fp8_scaling *s, na_fp8_role r);

/* This step's amax of x (na_fp8_amax) into role r's record (see the rules above). A sync on
 * CUDA (one float read). */
int na_fp8_scaling_record(na_fp8_scaling *s, na_fp8_role r, na_tensor *x);
/* The same with the amax given: >= 0 or NaN (inf allowed), else NA_EINVAL. */
int na_fp8_scaling_record_amax(na_fp8_scaling *s, na_fp8_role r, float amax);
/* After the step: the delayed rules above (rolls the histories, new scales); current: none. */
int na_fp8_scaling_update(na_fp8_scaling *s);

/* Getters (NAN for a NULL state or a bad role). */
float na_fp8_scaling_scale(const na_fp8_scaling *s, na_fp8_role r);     /* to multiply x by */
float na_fp8_scaling_scale_inv(const na_fp8_scaling *s, na_fp8_role r); /* 1 / scale */
float na_fp8_scaling_amax(const na_fp8_scaling *s, na_fp8_role r);     /* this step's, row 0 */
int64_t na_fp8_scaling_updates(const na_fp8_scaling *s);               /* update() calls */
/* Row i (0: this step's) of role r's history; NAN when i is out of [0, history length). */
float na_fp8_scaling_history(const na_fp8_scaling *s, na_fp8_role r, int64_t i);

/* One line per role for the amp trace and logs:
 *   "fp8 delayed hybrid max margin 0 history 1024, update 12\n"
 *   "  input       e4m3 scale 3.5 scale_inv 0.285714 amax 0 (window max 128)\n" ...
 * Returns buf (always terminated; "" for a NULL state). */
const char *na_fp8_scaling_describe(const na_fp8_scaling *s, char *buf, size_t size);

/* Saturation: values whose |x * scale| lies beyond the format's largest finite number when a
 * layer casts them (they become +-max: the FP8 layers cast as Transformer Engine does,
 * saturating, for E5M2 too). count adds n to role r's count of this step (until update())
 * and of the state's life. Not part of the state: a resumed run counts from 0. */
int na_fp8_scaling_count_saturated(na_fp8_scaling *s, na_fp8_role r, int64_t n);
int64_t na_fp8_scaling_saturated(const na_fp8_scaling *s, na_fp8_role r);       /* this step */
int64_t na_fp8_scaling_saturated_total(const na_fp8_scaling *s, na_fp8_role r); /* in all */

/* The state protocol (nanoamp/state.h), after prefix: "amax_history" f32 [history length, 3]
 * (TE's layout, columns input, weight, grad_output), "scale" and "scale_inv" f32 [3],
 * "updates" f64 0-dim; all on the CPU, saved and loaded bit for bit. Load into a state made
 * with the same config (the history's shape must match). */
int na_fp8_scaling_state(na_fp8_scaling *s, const char *prefix, na_named_tensors *out);

/* ==== FP8 layers ============================================================================
 * Linear and Conv2d computed in FP8 with one f32 scale per tensor (Transformer Engine's
 * Linear; the straight-through convention: the casts count as the identity in backward):
 *
 *   forward   x8 = fp8(x * s_x), w8 = fp8(w * s_w)                 (E4M3, both formats)
 *             y  = (1/s_x)(1/s_w) (x8 @ w8^T) + b                   f32 sums, one rounding
 *   backward  g8 = fp8(dy * s_g)                       (E5M2 under HYBRID, E4M3 under E4M3)
 *             dx = (1/s_g)(1/s_w) (g8 @ w8),  dw = (1/s_g)(1/s_x) (g8^T @ x8),  db = sum dy
 *
 * Each cast saturates (|v| beyond the format's max becomes +-max, NaN stays NaN: TE's
 * satfinite) and is counted (na_fp8_scaling_saturated). The scales come from the layer's
 * na_fp8_scaling by its recipe: delayed takes the scale its history gives and records this
 * tensor's amax (only in grad mode: an evaluation does not move the history); current
 * records the amax first and casts with the scale it gives. The GEMMs are na_scaled_mm
 * (cuBLASLt's FP8 GEMM where the backend has it); the Conv2d's are the convolution's own
 * kernels on the FP8 operands widened to f32 (exact: every FP8 value is an f32 value, and
 * so is every product of two), with the scale product and the bias applied in f32 after
 * them, which is the scaled GEMM's contract with the convolution as the GEMM. The output is
 * bf16 inside an enabled bf16 autocast region (autocast's rule for linear and conv2d), else
 * f32; dx has x's dtype, dw w's, db b's. Inside an FP8 autocast region the amp trace shows
 * the op as fp8_linear / fp8_conv2d with each tensor's format, scale and amax. */
na_tensor *na_fp8_linear(na_tensor *x, na_tensor *w, na_tensor *b, na_fp8_scaling *s);
na_tensor *na_fp8_conv2d(na_tensor *x, na_tensor *w, na_tensor *b, const na_conv2d_opts *opts,
                         na_fp8_scaling *s);

/* An FP8 autocast region (TE's fp8_autocast): a bf16 autocast region in which the Linear and
 * Conv2d layers of an na_fp8_model run in FP8; everything else follows the bf16 rules
 * (BatchNorm, softmax and the losses in f32). Regions nest with autocast's, per thread; FP8
 * holds while the innermost region is an FP8 one (a disabled or f16 region inside turns it
 * off). end() closes the innermost region, which must be an FP8 one (NA_ESTATE otherwise). */
int na_fp8_autocast_begin(void);
int na_fp8_autocast_end(void);
bool na_fp8_autocast_enabled(void);

/* The FP8 state of a model: one na_fp8_scaling (made from cfg, NULL: the defaults) for each
 * Linear and Conv2d of net's tree, whose forward becomes na_fp8_linear / na_fp8_conv2d inside
 * an FP8 autocast region (the plain op elsewhere). net must outlive it; free it to restore the
 * plain layers.
 *
 *     na_fp8_model *fm = na_fp8_model_new(net, NULL);        // delayed, hybrid, 1024
 *     for (...) {
 *         na_fp8_autocast_begin();
 *         na_tensor *loss = na_cross_entropy(na_module_forward(net, x), y, NULL);
 *         na_fp8_autocast_end();
 *         na_backward(loss, NULL);                            // dy's casts record here
 *         na_optim_step(opt); na_optim_zero_grad(opt);
 *         na_fp8_model_update(fm);                            // the next step's scales
 *         na_step_end();
 *     }
 *     na_fp8_model_free(fm);
 *
 * Under data parallelism call na_dist_fp8_reduce_amax(d, na_fp8_model_scalings(fm),
 * na_fp8_model_layers(fm)) before update. */
typedef struct na_fp8_model na_fp8_model;
na_fp8_model *na_fp8_model_new(na_module *net, const na_fp8_recipe_cfg *cfg);
void na_fp8_model_free(na_fp8_model *fm); /* NULL is fine */
int na_fp8_model_layers(const na_fp8_model *fm);   /* the FP8 layers, in state_dict order */
/* Layer i's state, and its dotted path in net ("0", "features.3") when path is not NULL. */
na_fp8_scaling *na_fp8_model_layer(const na_fp8_model *fm, int i, const char **path);
na_fp8_scaling *const *na_fp8_model_scalings(const na_fp8_model *fm); /* all of them */
int na_fp8_model_update(na_fp8_model *fm); /* na_fp8_scaling_update of every layer */
int64_t na_fp8_model_saturated(const na_fp8_model *fm); /* over layers and roles, in all */
/* The state protocol: each layer's na_fp8_scaling_state after prefix + path + "." */
int na_fp8_model_state(na_fp8_model *fm, const char *prefix, na_named_tensors *out);

#ifdef __cplusplus
}
#endif
#endif
