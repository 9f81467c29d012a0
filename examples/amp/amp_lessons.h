/* examples/amp/amp_lessons.h — the four experiments of docs/mixed-precision.md, as functions.
 *
 * Each experiment runs nanoamp's real code (autocast, the GradScaler, the fp16 optimizer) and
 * returns its numbers; the programs in examples/amp print them, and tests/test_amp_lessons.c
 * checks them and checks that every number the guide quotes is one of them ("quotes": the
 * exact strings the guide contains, as the programs print them).
 *
 *   amp-underflow       gradients that underflow to zero in f16, kept by loss scaling
 *   amp-overflow        an overflow the dynamic scaler detects, skips and recovers from
 *   amp-trace           the autocast trace of one training step of the MNIST CNN
 *   amp-master-weights  small updates lost in f16 weights, kept by f32 master weights
 */
#ifndef NANOAMP_EXAMPLES_AMP_LESSONS_H
#define NANOAMP_EXAMPLES_AMP_LESSONS_H

#include <stdbool.h>
#include <stdio.h>

#include "nanoamp.h"

#define AMP_MAX_QUOTES 24
typedef struct {
    const char *key;
    char text[96];
} amp_quote;
typedef struct {
    int n;
    amp_quote q[AMP_MAX_QUOTES];
} amp_quotes;
/* The quote under key ("" when absent). */
const char *amp_quote_get(const amp_quotes *qs, const char *key);

/* ---- 1. underflow ---------------------------------------------------------------------------- */
#define AMP_UNDERFLOW_N 8
typedef struct {
    /* the formats, each value checked through nanoamp's own casts (f32 -> f16/bf16 -> f32) */
    double f16_max, f16_min_normal, f16_min_subnormal, f16_eps;
    double bf16_max, bf16_min_normal, bf16_eps;
    bool formats_checked; /* 65520 -> inf, 2^-25 -> 0, 1 + 2^-11 -> 1 in f16, ... */
    double scale;                    /* the loss scale of the second run */
    double truth[AMP_UNDERFLOW_N];   /* the gradient an f32 run computes */
    double plain[AMP_UNDERFLOW_N];   /* f16 autocast, no scaling */
    double scaled[AMP_UNDERFLOW_N];  /* f16 autocast, scaled then unscaled in f32 */
    int zeros_plain, zeros_scaled;
    double max_rel_err_plain;        /* over the gradients that did not vanish */
    double max_rel_err_scaled;
    amp_quotes quotes;
} amp_underflow_result;
int amp_lesson_underflow(amp_underflow_result *r);
void amp_underflow_print(const amp_underflow_result *r, FILE *out);
/* The f16/bf16/f32 table the guide opens with (part of amp-underflow's output). */
void amp_formats_print(const amp_underflow_result *r, FILE *out);

/* ---- 2. overflow ----------------------------------------------------------------------------- */
#define AMP_OVERFLOW_STEPS 12
#define AMP_OVERFLOW_BAD_STEP 5
typedef struct {
    double scale_before[AMP_OVERFLOW_STEPS], scale_after[AMP_OVERFLOW_STEPS];
    double loss[AMP_OVERFLOW_STEPS];
    bool found_inf[AMP_OVERFLOW_STEPS];
    bool weights_changed[AMP_OVERFLOW_STEPS];
    int skipped;
    int recovered_at; /* the first step after the overflow whose scale is back at the start */
    amp_quotes quotes;
} amp_overflow_result;
int amp_lesson_overflow(amp_overflow_result *r);
void amp_overflow_print(const amp_overflow_result *r, FILE *out);

/* ---- 3. trace -------------------------------------------------------------------------------- */
#define AMP_TRACE_MAX 96
typedef struct {
    int n;
    na_amp_trace_record rec[AMP_TRACE_MAX];
    int lower_ops;    /* ops run by the "lower" rule (conv2d, linear) */
    int fp32_ops;     /* ops run by the "fp32" rule */
    int weight_casts; /* casts of f32 parameters made through the cache */
    int casts;        /* all casts autocast made */
    double loss, scale;
    amp_quotes quotes;
} amp_trace_result;
/* The MNIST CNN: conv(1->32, 3x3, pad 1) + BN + ReLU + maxpool 2, conv(32->64) + BN + ReLU +
 * maxpool 2, linear(3136 -> 128) + ReLU, linear(128 -> 10). */
na_module *amp_mnist_cnn(void);
int amp_lesson_trace(amp_trace_result *r);
void amp_trace_print(const amp_trace_result *r, FILE *out);

/* ---- 4. master weights ----------------------------------------------------------------------- */
typedef struct {
    int steps;
    double lr, grad, update;   /* the update lr * |grad| each step */
    double f16_weight;         /* a weight stored and updated in f16 */
    double master;             /* the f32 master of the fp16 optimizer */
    double model;              /* the f16 model weight copied from the master */
    double f32_reference;      /* the same steps in plain f32 */
    double half_ulp;           /* half the f16 spacing at 1.0: smaller updates vanish */
    amp_quotes quotes;
} amp_master_result;
int amp_lesson_master_weights(amp_master_result *r);
void amp_master_print(const amp_master_result *r, FILE *out);

#endif
