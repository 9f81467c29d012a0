/* examples/amp/amp_lessons.h — the experiments of docs/mixed-precision.md, as functions.
 *
 * Each experiment (amp_lesson_<name>, in lesson_<file>.c) runs nanoamp's real code (autocast,
 * the GradScaler, the fp16 optimizer) and returns its numbers; its program's run function
 * (amp_<name>_run) prints them, and tests/test_amp_lessons.c checks them and checks that every
 * number the guide quotes is one of them ("quotes": the exact strings the guide contains, as
 * the programs print them). In the guide's order:
 *
 *   amp-formats         the limits of f16, bf16 and f32 (--svg: their number lines)
 *   amp-trace           the autocast rule table (--rules) and the trace of one CNN step
 *   amp-accumulation    f16 sums that stall and f16 exp/softmax that overflow: why products
 *                       accumulate in f32 and exp, softmax and the losses run in f32
 *   amp-underflow       gradients that underflow to zero in f16, kept by loss scaling
 *   amp-loss-scaling    an MLP whose f16 gradients underflow: it fails unscaled and learns
 *                       with the GradScaler (--svg: its gradients on the f16 number line)
 *   amp-overflow        an overflow the dynamic scaler detects, skips and recovers from
 *                       (--log: the scale's sawtooth in a real run, as a CSV for amp-plot)
 *   amp-master-weights  small updates lost in f16 and bf16 weights, kept by f32 masters,
 *                       for one weight and in a real run (the MLP with bf16 weights)
 *   amp-batchnorm       why BatchNorm's statistics stay in f32
 *   amp-fp8             why FP8 needs one scale per tensor; delayed scaling against an amax
 *                       jump
 */
#ifndef NANOAMP_EXAMPLES_AMP_LESSONS_H
#define NANOAMP_EXAMPLES_AMP_LESSONS_H

#include <stdbool.h>
#include <stdio.h>

#include "nanoamp.h"

#define AMP_MAX_QUOTES 48
typedef struct {
    const char *key;
    char text[128]; /* the guide holds it exactly (training runs too: they are reproducible) */
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
    int normal_scaled;               /* scaled gradients g x scale in f16's normal range */
    double max_rel_err_plain;        /* over the gradients that did not vanish */
    double max_rel_err_scaled;
    amp_quotes quotes;
} amp_underflow_result;
int amp_lesson_underflow(amp_underflow_result *r);
/* The f16/bf16/f32 table the guide opens with (amp-formats): only the format fields. */
int amp_lesson_formats(amp_underflow_result *r);
/* The f16 and bf16 number lines (amp-formats --svg). */
int amp_formats_svg(FILE *svg);

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
/* One step of the MNIST CNN (model_mnist_cnn in examples/common/models.h). */
int amp_lesson_trace(amp_trace_result *r);

/* ---- 3b. accumulation and the fp32 list ----------------------------------------------------- */
typedef struct {
    int n;                     /* values summed */
    double x, x_f16, exact;    /* the value, as f16, and n * x_f16 */
    double sum_f16;            /* an f16 accumulator: each partial sum rounded to f16 */
    double stalled_at;         /* where it stopped growing, after stalled_step additions */
    int stalled_step;
    double spacing_at_stall;   /* the f16 spacing there */
    double sum_f32;            /* na_sum of the f16 tensor (f32 accumulation) */
    double matmul_f16;         /* na_matmul of ones [1, n] and the values [n, 1] in f16 */
    double exp_last_finite_x, exp_last_finite, exp_inf_at; /* exp in f16, steps of 0.01 */
    double logit;              /* the logits (logit, -logit) */
    double exp_f16_logit;      /* exp(logit) in f16 */
    double softmax_f16[2];     /* exp then divide, in f16 */
    double softmax_f32[2];     /* the same under f16 autocast: exp and sum in f32 */
    double softmax_nanoamp_f16[2]; /* na_softmax on the f16 logits */
    double ce_f16, ce_f32;     /* -log p of the second class: f16 softmax, f32 log_softmax */
    amp_quotes quotes;
} amp_accumulation_result;
int amp_lesson_accumulation(amp_accumulation_result *r);

/* The autocast rule table (amp-trace --rules): na_autocast_print_rules's lines. Returns the
 * number of lines written to out, or -1. */
int amp_rules_print(FILE *out);

/* ---- 4. master weights ----------------------------------------------------------------------- */
enum { AMP_MASTER_F16, AMP_MASTER_BF16, AMP_MASTER_KINDS }; /* the 16-bit weight's dtype */
typedef struct {
    int steps;
    double lr, grad, update;   /* the update lr * |grad| each step */
    /* per 16-bit dtype (f16, bf16) */
    double weight16[AMP_MASTER_KINDS]; /* a weight stored and updated in 16 bits */
    double master[AMP_MASTER_KINDS];   /* the f32 master of the fp16 optimizer */
    double model[AMP_MASTER_KINDS];    /* the 16-bit model weight copied from the master */
    double half_ulp[AMP_MASTER_KINDS]; /* half the spacing at 1.0: smaller updates vanish */
    double f32_reference;              /* the same steps in plain f32 */
    amp_quotes quotes;
} amp_master_result;
int amp_lesson_master_weights(amp_master_result *r);
/* The same in a real run: the MLP of lesson 5 (loss factor 1) trained with plain SGD from the
 * same seed and batches, with f32 weights, with bf16 weights updated in place, and with bf16
 * weights stepped through f32 masters (na_fp16_optimizer, static scale 1); no autocast. Data
 * as amp_lesson_loss_scaling's (fails, -1, without it). */
enum { AMP_MLP_F32, AMP_MLP_BF16, AMP_MLP_MASTERS, AMP_MLP_KINDS };
typedef struct {
    int steps;
    double lr;
    double unchanged[AMP_MLP_KINDS]; /* model weights the first step left as they were */
    double final_loss[AMP_MLP_KINDS], test_acc[AMP_MLP_KINDS];
    amp_quotes quotes;
} amp_master_mlp_result;
int amp_lesson_master_mlp(const char *data_dir, amp_master_mlp_result *r);

/* ---- 5. loss scaling in training ------------------------------------------------------------- */
/* The MNIST MLP (784 -> 256 -> ReLU -> 10, model_mnist_mlp) trained with Adam on Fashion-MNIST (the first 8192 training
 * images; the first 2000 test images), its loss multiplied by 1e-5 (the gradients of a loss
 * averaged over 10^5 outputs), three times from the same seed and batches: f32, f16 autocast
 * without scaling, f16 autocast with PyTorch's GradScaler, bf16 autocast without a scaler.
 * Adam divides by the gradients' RMS, so the factor alone changes almost nothing in f32
 * (below_eps_share: the gradients it puts below Adam's eps). Every run is reproducible
 * (na_cpu_set_reproducible). */
enum { AMP_RUN_F32, AMP_RUN_F16, AMP_RUN_F16_SCALED, AMP_RUN_BF16, AMP_RUNS };
typedef struct {
    double loss_factor;
    int steps;
    double zero_frac[AMP_RUNS];  /* gradient elements that are exactly 0 at the first step */
    double final_loss[AMP_RUNS]; /* cross-entropy (without the factor), last 20 steps' mean */
    double test_acc[AMP_RUNS];
    double scale;                /* the GradScaler's scale at the first step */
    double adam_eps;             /* Adam's eps (NA_ADAM_DEFAULTS) */
    double below_eps_share;      /* of the first step's f32 gradients: |g| < eps */
    int64_t skipped;             /* steps the GradScaler skipped */
    /* of the first step's true gradients: the shares f16 would round to 0 and keep only as
     * subnormals, as they are and times the scale */
    double zero_share, subnormal_share, zero_share_scaled, subnormal_share_scaled;
    int64_t n_grads;             /* the first step's true (f32) gradients, for the histogram */
    float *grads;                /* malloc'd: free with amp_loss_scaling_free */
    amp_quotes quotes;
} amp_loss_scaling_result;
/* data_dir: Fashion-MNIST's IDX files; NULL: $NANOAMP_DATA, else
 * /usr/share/datasets/fashion-mnist. Fails (-1, na_last_error) when they are not there. */
int amp_lesson_loss_scaling(const char *data_dir, amp_loss_scaling_result *r);
void amp_loss_scaling_free(amp_loss_scaling_result *r);
/* The first step's gradient magnitudes on the f16 number line, as they are and times the
 * scale (amp-loss-scaling --svg). */
int amp_loss_scaling_svg(const amp_loss_scaling_result *r, FILE *svg);

/* The loss scale's sawtooth in a real run: the same MLP (loss factor 1) with f16 autocast and a
 * GradScaler that grows every AMP_SAWTOOTH_INTERVAL clean steps, so that it keeps climbing
 * into overflow and backing off; the monitor writes every step to csv_path (amp-plot draws
 * it). */
#define AMP_SAWTOOTH_STEPS 300
#define AMP_SAWTOOTH_INTERVAL 10
/* docs/img/sawtooth.svg's title (the guide's amp-plot --title) */
#define AMP_SAWTOOTH_TITLE "amp-overflow --log: the MLP in f16, GradScaler growing every 10 steps"
typedef struct {
    int steps;
    int64_t skipped;
    double max_scale, final_scale;
    int first_skip;      /* the first skipped step */
    double first_loss, final_loss;
    amp_quotes quotes;
} amp_sawtooth_result;
int amp_lesson_sawtooth(const char *data_dir, const char *csv_path, amp_sawtooth_result *r);

/* ---- 6. BatchNorm in f32 --------------------------------------------------------------------- */
#define AMP_BN_VALUES (128 * 28 * 28) /* one channel of the MNIST CNN's first BatchNorm */
typedef struct {
    /* the variance's sums */
    double sumsq_f32;        /* sum of x^2 over the channel, x ~ N(0, 1), in f32 */
    double sumsq_f16;        /* the same sum stored in f16 (accumulated in f32): inf */
    double f16_counter;      /* adding 1 at a time to an f16 sum: where it stops */
    /* the running statistics: momentum 0.1 from 1.0 toward batch means of 1.002 */
    int rs_steps;
    double rs_target, rs_f32, rs_f16, rs_bf16;
    /* eps = 1e-5 */
    double eps_f16;          /* 1e-5 stored in f16 */
    bool eps_subnormal;      /* below f16's smallest normal, and its exponent bits are 0 */
    double eps_absorbed_f16; /* the smallest power of two v with v + eps == v in f16 */
    double eps_absorbed_f32; /* ... in f32 */
    /* nanoamp's batch norm on the channel in f16: f32 statistics */
    double bn_max_err;       /* largest |f16 output - f32 output| */
    bool bn_finite;
    amp_quotes quotes;
} amp_batchnorm_result;
int amp_lesson_batchnorm(amp_batchnorm_result *r);

/* ---- 7. FP8: one scale per tensor ------------------------------------------------------------
 * The MNIST MLP's first Linear (model_mnist_mlp) at its first step on the first batch of
 * amp-loss-scaling's run: its input x, its weight W and its output's gradient dL/dy, cast to
 * E4M3 and E5M2 as they are and with their own scale fp8_max / amax. Then the amax jump: x
 * times AMP_FP8_JUMP at step AMP_FP8_JUMP_STEP only, cast to E4M3 for AMP_FP8_JUMP_STEPS steps
 * with the delayed recipe's scale (history 1024, max) and with current scaling. */
enum { AMP_FP8_ROLES = 3, AMP_FP8_JUMP_STEP = 10, AMP_FP8_JUMP_STEPS = 1040,
       AMP_FP8_JUMP_ROWS = 8 };
#define AMP_FP8_JUMP 100.0
typedef struct {
    double scale;     /* the values were multiplied by it before the cast */
    double lost;      /* share of the nonzero values that became 0 */
    double saturated; /* share of the nonzero values beyond the format's range: that E4M3
                         clips to 448 (above 464, which would round beyond 448), that E5M2
                         turns into inf */
    double rel_err;   /* RMS of (cast / scale - value) over RMS of value, finite casts only */
} amp_fp8_cast;
typedef struct {
    double factor; /* x's factor this step */
    amp_fp8_cast cast;
} amp_fp8_step;
typedef struct {
    int64_t n[AMP_FP8_ROLES];
    float *values[AMP_FP8_ROLES]; /* malloc'd: free with amp_fp8_free */
    double amax[AMP_FP8_ROLES];
    amp_fp8_cast plain[AMP_FP8_ROLES][2], scaled[AMP_FP8_ROLES][2]; /* [role][e4m3, e5m2] */
    amp_fp8_step delayed[AMP_FP8_JUMP_STEPS], current[AMP_FP8_JUMP_STEPS];
    int recovered_at;                  /* first step after the jump with the old delayed scale */
    int jump_rows[AMP_FP8_JUMP_ROWS];  /* the steps the table shows */
    amp_quotes quotes;
} amp_fp8_result;
/* data_dir as amp_lesson_loss_scaling's. */
int amp_lesson_fp8(const char *data_dir, amp_fp8_result *r);
void amp_fp8_free(amp_fp8_result *r);
/* The three tensors on the E4M3 line (and the gradient on E5M2's too), as they are and times
 * their scales (amp-fp8 --svg). */
int amp_fp8_svg(const amp_fp8_result *r, FILE *svg);

/* ---- the programs ----------------------------------------------------------------------------
 * Each program's main is amp_lesson_main with its usage, its one option and its run function,
 * which runs the lesson and prints it on stdout; the option's value (NULL when not given) is
 * the run function's argument. The run functions return the exit status. */
int amp_formats_run(const char *svg_path);   /* amp-formats [--svg FILE] */
int amp_trace_run(const char *rules);        /* amp-trace [--rules] */
int amp_accumulation_run(const char *unused); /* amp-accumulation */
int amp_underflow_run(const char *unused);   /* amp-underflow */
int amp_loss_scaling_run(const char *svg_path); /* amp-loss-scaling [--svg FILE] */
int amp_overflow_run(const char *csv_path);  /* amp-overflow [--log FILE.csv] (then the sawtooth) */
int amp_master_weights_run(const char *unused); /* amp-master-weights */
int amp_batchnorm_run(const char *unused);   /* amp-batchnorm */
int amp_fp8_run(const char *svg_path);       /* amp-fp8 [--svg FILE] */
int amp_lesson_main(int argc, char **argv, const char *usage, const char *opt, bool takes_value,
                    int (*run)(const char *value));

/* Each program's arguments: --help (or -h) prints usage and the program exits 0; opt (NULL for
 * none) is the one option it takes: with takes_value its value goes to *value, else *value is
 * set to "" when the flag is given. Returns -1 to go on, else the exit status (0 for --help,
 * 2 for a bad argument, with the usage on stderr). */
int amp_lesson_args(int argc, char **argv, const char *usage, const char *opt, bool takes_value,
                    const char **value);
/* Writes path with draw(file); 0, or 1 with a message on stderr. */
int amp_write_svg(const char *path, int (*draw)(FILE *svg));

#endif
