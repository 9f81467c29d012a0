/* nanoamp/autocast.h — autocast: each op computes in the dtype its rule says.
 *
 * Autocast is part of how an op runs (src/ops): an op's front-end asks it which dtype to
 * compute in and casts its inputs accordingly. nanoamp/amp.h includes this header, so the
 * mixed-precision API stays one include away; the loss scalers, master weights and model
 * conversion that use it live above (src/amp).
 *
 * Inside an autocast region each op runs in the dtype its rule says (nanoamp/ops.h,
 * NA_OP_MAP), as PyTorch's CUDA lists (see docs/mixed-precision.md for the table):
 *   lower    cast float inputs to the region's f16/bf16: matmul, linear, conv2d
 *   fp32     cast float inputs to f32: softmax, log_softmax, cross_entropy, mse_loss, exp, log,
 *            rsqrt, pow, sum (so an f16 input gives an f32 output)
 *   promote  cast float inputs to the widest among them (PyTorch's promote list: none of
 *            nanoamp's ops; available through na_autocast_set_rule)
 *   as_is    run in the inputs' dtype: everything else. Binary ops (add, sub, mul, div)
 *            promote natively, as PyTorch's result_type: f16 with f32 gives f32, but a 0-dim
 *            tensor does not widen one with dimensions. mean keeps an f16 input f16
 *            (accumulating in f32). BatchNorm takes f16/bf16 input with f32 parameters and
 *            statistics, computes in f32 and returns the input's dtype.
 * f64 and integer tensors are never cast. Casts of f32 parameters (leaves that require grad)
 * are made once per outermost region and reused; the cast is differentiable, so gradients
 * reach the f32 weights in f32.
 *
 *     na_autocast_begin(NA_DTYPE_F16);
 *     na_tensor *logits = na_linear(x, w, b);               // f16 compute, f16 output
 *     na_tensor *loss = na_cross_entropy(logits, y, NULL);  // f32
 *     na_autocast_end();
 */
#ifndef NANOAMP_AUTOCAST_H
#define NANOAMP_AUTOCAST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nanoamp/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens a region computing lower-precision ops in dt (NA_DTYPE_F16 or NA_DTYPE_BF16).
 * Regions nest (at most 16 deep) and are per thread. */
int na_autocast_begin(na_dtype dt);
/* The same, checking first that dev can compute in dt: CUDA without a device fails with
 * NA_EDEVICE; bf16 on a CUDA device older than sm_80 fails with NA_EDTYPE and PyTorch's
 * message ("Current CUDA Device does not support bfloat16. Please switch dtype to float16.").
 * Without this check the same error comes from the first op that would cast to bf16 on such
 * a device. */
int na_autocast_begin_device(na_device dev, na_dtype dt);
/* NA_OK when dev can compute in dt (see na_autocast_begin_device), else the error. */
int na_autocast_check_device(na_device dev, na_dtype dt);
/* Opens a region in which nothing is cast (inside an enabled one). */
int na_autocast_begin_disabled(void);
int na_autocast_end(void);
bool na_autocast_enabled(void);
na_dtype na_autocast_dtype(void); /* the innermost region's dtype (f16 when none) */
int na_autocast_depth(void);      /* open regions, enabled or not */

/* The rule an op follows now (the default from NA_OP_MAP unless overridden). */
na_amp_rule na_autocast_rule(na_op op);
int na_autocast_set_rule(na_op op, na_amp_rule rule); /* override one op */
void na_autocast_reset_rules(void);
const char *na_amp_rule_name(na_amp_rule rule); /* "as_is", "lower", "fp32", "promote" */
/* Prints the rule table: one line per op with its current rule, marked when overridden. */
void na_autocast_print_rules(FILE *out);

/* Casts made through the weight cache in the current outermost region (for tests). */
uint64_t na_autocast_cache_casts(void);

/* ---- tracing -------------------------------------------------------------------------------
 * The trace reports, for each op: its name, its inputs' dtypes (before autocast cast them), the
 * rule applied, the dtype it computed in, its output's dtype and, where wider than the compute
 * dtype, the dtype its sums accumulate in (matmul, linear, conv2d and reductions on f16/bf16
 * accumulate in f32). BatchNorm on f16/bf16 input computes in f32. Casts made for an op
 * (autocast's, or a binary op's own promotion) are reported too, indented, just before it:
 *
 *   amp:   cast        in f32              rule as_is    compute f32   out f16
 *   amp: linear        in f32,f32,f32      rule lower    compute f16   out f16   acc f32
 *   amp: batch_norm    in f16,f32,f32      rule as_is    compute f32   out f16
 *
 * A custom function (na_function, nanoamp/autograd.h) is traced under its own name with the
 * rule it declared: fp32 or lower for .cast_inputs (to f32, or to f16/bf16), as_is when it
 * runs as called; the ops its forward calls are indented under it.
 *
 * NANOAMP_AMP_TRACE=1 in the environment traces autocast regions to stderr from the start,
 * NANOAMP_AMP_TRACE=all every op. The backward pass has rows of its own, each gradient's
 * zero, subnormal and inf/NaN shares: na_amp_trace_backward (nanoamp/amp.h). */
typedef enum {
    NA_AMP_TRACE_OFF,
    NA_AMP_TRACE_REGIONS, /* ops run while an autocast region (enabled or disabled) is open */
    NA_AMP_TRACE_ALL      /* every op */
} na_amp_trace_mode;

#define NA_AMP_TRACE_MAX_INPUTS 5
/* An FP8 op's tensors (nanoamp/fp8.h), by role: input, weight, grad_output. */
#define NA_AMP_TRACE_FP8_ROLES 3
typedef struct {
    na_dtype dtype[NA_AMP_TRACE_FP8_ROLES]; /* f8e4m3 / f8e5m2 */
    float scale[NA_AMP_TRACE_FP8_ROLES];    /* the scale the cast used (or, for grad_output in
                                               forward, the one delayed scaling will use) */
    float amax[NA_AMP_TRACE_FP8_ROLES];     /* max |x| seen; NaN: not yet (grad_output) */
} na_amp_trace_fp8;
typedef struct {
    na_op op;           /* NA_OP_COUNT for a custom function (nanoamp/autograd.h) */
    const char *name;   /* the op's name, or the custom function's; NULL: na_op_name(op) */
    int n_inputs;
    na_dtype in[NA_AMP_TRACE_MAX_INPUTS]; /* NA_DTYPE_COUNT for an absent (NULL) input */
    na_amp_rule rule;   /* the rule applied (as_is outside enabled regions) */
    bool region;        /* an autocast region was open */
    bool enabled;       /* ... and it was enabled */
    na_dtype compute;   /* what the op computed in */
    na_dtype accumulate; /* what its sums accumulate in; NA_DTYPE_COUNT when it sums nothing */
    na_dtype out;       /* its output's dtype */
    na_device device;
    int nesting;        /* 1 for casts (and inner ops) made on behalf of another op */
    const na_amp_trace_fp8 *fp8; /* an FP8 op's formats, scales and amax values, else NULL */
} na_amp_trace_record;
typedef void (*na_amp_trace_fn)(const na_amp_trace_record *r, void *ctx);

/* Traces to out (stderr when NULL) in `mode`; NA_AMP_TRACE_OFF stops tracing. */
void na_autocast_trace(na_amp_trace_mode mode, FILE *out);
/* Sends each record to fn instead of printing (fn NULL: back to printing). */
void na_autocast_trace_callback(na_amp_trace_mode mode, na_amp_trace_fn fn, void *ctx);
na_amp_trace_mode na_autocast_trace_mode(void);
/* Hands the trace an FP8 op's formats, scales and amax values (copied) for the record of the
 * next op named name (a custom function's: nanoamp/fp8.h's layers call it from their forward);
 * the line gets them after its columns:
 *   amp: fp8_linear    in f32,f32,f32   rule as_is  compute f8e4m3 out bf16  acc f32
 *        fp8 input e4m3 scale 3.5 amax 128, weight e4m3 scale 1.2e+03 amax 0.37, grad_output
 *        e5m2 scale 1 amax - */
void na_autocast_trace_fp8(const char *name, const na_amp_trace_fp8 *info);
/* The line the trace prints for r (without "amp: " and the newline). Returns buf. */
const char *na_amp_trace_format(const na_amp_trace_record *r, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
