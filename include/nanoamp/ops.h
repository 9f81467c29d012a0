/* nanoamp/ops.h — the op table and the differentiable ops.
 *
 * Every op is declared once in NA_OP_MAP: its id, its name, its autocast rule (what dtype it
 * computes in inside an autocast region; see nanoamp/autocast.h), whether its front-end asks
 * autocast at all, the backend kernel of an elementwise unary op, whether its sums accumulate
 * wider than its data, and whether it has a backward. Tests walk this table: an op added here
 * without a forward test, a gradient check and a CUDA parity case fails the suite.
 *
 * Every op returns a new step tensor (see nanoamp/tensor.h) or NULL with na_last_error() set.
 * If an input requires grad (and grad mode is on), the op records a graph node so that
 * na_backward can run its backward. Inputs may be views; float inputs of different dtypes
 * in binary ops promote to the wider one (f16 + bf16 -> f32), except that a 0-dim tensor does
 * not widen a tensor with dimensions (PyTorch's result_type: f16 [N] * f32 0-dim is f16).
 *
 *     na_tensor *logits = na_linear(x, w, b);             // x [N, in], w [out, in], b [out]
 *     na_tensor *loss = na_cross_entropy(logits, labels, NULL);  // labels: i32 [N]
 *     na_backward(loss, NULL);                             // w->grad += dloss/dw
 */
#ifndef NANOAMP_OPS_H
#define NANOAMP_OPS_H

#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Autocast rules (PyTorch's CastPolicy, see docs/mixed-precision.md). */
typedef enum {
    NA_AMP_AS_IS,   /* run in the inputs' dtype */
    NA_AMP_LOWER,   /* cast float inputs to the region's f16/bf16 (matmul, linear, conv) */
    NA_AMP_FP32,    /* cast float inputs to f32 (softmax, losses, exp, log, sum, ...) */
    NA_AMP_PROMOTE, /* cast float inputs to the widest among them (PyTorch's promote list;
                       no op here by default: binary ops promote natively, see below) */
    NA_AMP_RULE_COUNT
} na_amp_rule;

/* The op table: one row per op, every fact about an op that code elsewhere looks up.
 *   X(ID, name, rule, autocast, unary, sums, differentiable, reads)
 *   rule       its default autocast rule, NA_AMP_<rule> (na_autocast_set_rule overrides it)
 *   autocast   ASKS: the front-end asks autocast to cast its inputs by the rule; FIXED: the op
 *              always runs in its inputs' dtype (views, copies, casts, and the ops that keep
 *              their input's dtype by design: BatchNorm with f32 statistics, pooling, dropout,
 *              argmax), so its rule stays AS_IS
 *   unary      the backend's elementwise kernel NA_UNARY_<unary> (kernels/backend.h) that
 *              computes it, or NONE
 *   sums       ACC: its sums (dot products, reductions, statistics, windows) accumulate in
 *              f32 for f16/bf16 data (the trace's acc column); NOACC: it sums nothing
 *   differentiable   false: it records no node (its output is an integer tensor)
 *   reads      whose values its backward reads: IN0, IN01 (inputs 0 and 1), OUT (its output),
 *              or both (IN1_OUT, IN01_OUT); NONE: shapes only, or tensors it made itself. An
 *              in-place write to one of them between the op and na_backward fails backward
 *              (version counters, nanoamp/autograd.h)
 * Its backward is na_bw_<ID>, written right below its forward in src/ops. */
#define NA_OP_MAP(X)                                                                      \
    X(ADD,           "add",           AS_IS, ASKS,  NONE,       NOACC, true,  NONE)       \
    X(SUB,           "sub",           AS_IS, ASKS,  NONE,       NOACC, true,  NONE)       \
    X(MUL,           "mul",           AS_IS, ASKS,  NONE,       NOACC, true,  IN01)       \
    X(DIV,           "div",           AS_IS, ASKS,  NONE,       NOACC, true,  IN1_OUT)    \
    X(NEG,           "neg",           AS_IS, ASKS,  NEG,        NOACC, true,  NONE)       \
    X(SCALE,         "scale",         AS_IS, ASKS,  SCALE,      NOACC, true,  NONE)       \
    X(ADD_SCALAR,    "add_scalar",    AS_IS, ASKS,  ADD_SCALAR, NOACC, true,  NONE)       \
    X(EXP,           "exp",           FP32,  ASKS,  EXP,        NOACC, true,  OUT)        \
    X(LOG,           "log",           FP32,  ASKS,  LOG,        NOACC, true,  IN0)        \
    X(SQRT,          "sqrt",          AS_IS, ASKS,  SQRT,       NOACC, true,  OUT)        \
    X(RSQRT,         "rsqrt",         FP32,  ASKS,  RSQRT,      NOACC, true,  OUT)        \
    X(POW,           "pow",           FP32,  ASKS,  POW,        NOACC, true,  IN0)        \
    X(ABS,           "abs",           AS_IS, ASKS,  ABS,        NOACC, true,  IN0)        \
    X(CLAMP,         "clamp",         AS_IS, ASKS,  CLAMP,      NOACC, true,  IN0)        \
    X(RELU,          "relu",          AS_IS, ASKS,  RELU,       NOACC, true,  IN0)        \
    X(GELU,          "gelu",          AS_IS, ASKS,  GELU,       NOACC, true,  IN0)        \
    X(SIGMOID,       "sigmoid",       AS_IS, ASKS,  SIGMOID,    NOACC, true,  OUT)        \
    X(TANH,          "tanh",          AS_IS, ASKS,  TANH,       NOACC, true,  OUT)        \
    X(SOFTPLUS,      "softplus",      FP32,  ASKS,  SOFTPLUS,   NOACC, true,  IN0)        \
    X(MATMUL,        "matmul",        LOWER, ASKS,  NONE,       ACC,   true,  IN01)       \
    X(LINEAR,        "linear",        LOWER, ASKS,  NONE,       ACC,   true,  IN01)       \
    X(SUM,           "sum",           FP32,  ASKS,  NONE,       ACC,   true,  NONE)       \
    X(MEAN,          "mean",          AS_IS, ASKS,  NONE,       ACC,   true,  NONE)       \
    X(MAX,           "max",           AS_IS, ASKS,  NONE,       NOACC, true,  NONE)       \
    X(ARGMAX,        "argmax",        AS_IS, FIXED, NONE,       NOACC, false, NONE)       \
    X(SOFTMAX,       "softmax",       FP32,  ASKS,  NONE,       ACC,   true,  OUT)        \
    X(LOG_SOFTMAX,   "log_softmax",   FP32,  ASKS,  NONE,       ACC,   true,  OUT)        \
    X(CROSS_ENTROPY, "cross_entropy", FP32,  ASKS,  NONE,       ACC,   true,  IN01)       \
    X(MSE_LOSS,      "mse_loss",      FP32,  ASKS,  NONE,       NOACC, true,  NONE)       \
    X(DROPOUT,       "dropout",       AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(CAST,          "cast",          AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(TO_DEVICE,     "to_device",     AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(RESHAPE,       "reshape",       AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(PERMUTE,       "permute",       AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(SLICE,         "slice",         AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(CONTIGUOUS,    "contiguous",    AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(PAD,           "pad",           AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(CONV2D,        "conv2d",        LOWER, ASKS,  NONE,       ACC,   true,  IN01)       \
    X(BATCH_NORM,    "batch_norm",    AS_IS, FIXED, NONE,       ACC,   true,  IN01)       \
    X(BATCH_NORM_RELU, "batch_norm_relu", AS_IS, FIXED, NONE,   ACC,   true,  IN01_OUT)   \
    X(MAX_POOL2D,    "max_pool2d",    AS_IS, FIXED, NONE,       NOACC, true,  NONE)       \
    X(AVG_POOL2D,    "avg_pool2d",    AS_IS, FIXED, NONE,       ACC,   true,  NONE)

typedef enum {
#define NA_OP_ENUM_(id, ...) NA_OP_##id,
    NA_OP_MAP(NA_OP_ENUM_)
#undef NA_OP_ENUM_
        NA_OP_COUNT
} na_op;

const char *na_op_name(na_op op);
bool na_op_differentiable(na_op op);
na_amp_rule na_op_default_amp_rule(na_op op);
bool na_op_asks_autocast(na_op op); /* false for the table's FIXED ops */

/* ---- elementwise (NumPy broadcasting for binary ops) --------------------------------- */
na_tensor *na_add(na_tensor *a, na_tensor *b);
na_tensor *na_sub(na_tensor *a, na_tensor *b);
na_tensor *na_mul(na_tensor *a, na_tensor *b);
na_tensor *na_div(na_tensor *a, na_tensor *b);
na_tensor *na_neg(na_tensor *x);
na_tensor *na_scale(na_tensor *x, double s);      /* x * s */
na_tensor *na_add_scalar(na_tensor *x, double s); /* x + s */
na_tensor *na_exp(na_tensor *x);
na_tensor *na_log(na_tensor *x);
na_tensor *na_sqrt(na_tensor *x);
na_tensor *na_rsqrt(na_tensor *x);
na_tensor *na_pow(na_tensor *x, double p);        /* x ** p */
na_tensor *na_abs(na_tensor *x);
na_tensor *na_clamp(na_tensor *x, double lo, double hi);
na_tensor *na_relu(na_tensor *x);
na_tensor *na_gelu(na_tensor *x);                 /* exact (erf) form, as PyTorch's default */
na_tensor *na_sigmoid(na_tensor *x);
na_tensor *na_tanh(na_tensor *x);
na_tensor *na_softplus(na_tensor *x);             /* log(1 + exp(x)) */

/* ---- matrix products (f32 accumulation whatever the dtype) -------------------------- */
/* [M,K]@[K,N] -> [M,N]; batched [..,M,K]@[..,K,N] with broadcast batch dims; 1-d operands
 * are not accepted (reshape them). */
na_tensor *na_matmul(na_tensor *a, na_tensor *b);
/* y = x @ w^T + b: x [.., in], w [out, in], b [out] or NULL (bias fused into the product). */
na_tensor *na_linear(na_tensor *x, na_tensor *w, na_tensor *b);
/* The scaled FP8 matrix product of torch._scaled_mm:
 *   y = (scale_a * scale_b) * (a @ b) (+ bias), f32 accumulation, one rounding to out_dtype.
 * a [M, K] and b [K, N] are f8e4m3 or f8e5m2 (any pair; b is typically a transposed [N, K]
 * weight, the layout cuBLASLt needs); scale_a and scale_b are f32 tensors of one element, the
 * dequantization factors (the inverse of the factor each operand was multiplied by before its
 * cast to FP8); bias NULL or [N] in f32, bf16 or f16 (added in f32 unless it and the output
 * are bf16); out_dtype f32 or bf16. The CPU widens the
 * operands (exactly) and runs its f32 or bf16 GEMM; CUDA runs cuBLASLt's FP8 GEMM when
 * NANOAMP_CUDA_FP8_GEMM=1 (sm_89 or newer; off by default until a GPU run shows parity), else
 * the same widening. No graph node: FP8 layers write their own backward. */
na_tensor *na_scaled_mm(na_tensor *a, na_tensor *b, na_tensor *scale_a, na_tensor *scale_b,
                        na_tensor *bias, na_dtype out_dtype);

/* ---- reductions (f32 accumulation; f64 for f64) ------------------------------------- */
na_tensor *na_sum(na_tensor *x);                                  /* all -> 0-dim */
na_tensor *na_sum_dim(na_tensor *x, int dim, bool keepdim);
na_tensor *na_mean(na_tensor *x);
na_tensor *na_mean_dim(na_tensor *x, int dim, bool keepdim);
na_tensor *na_max(na_tensor *x); /* all -> 0-dim; the gradient goes to the first max */
na_tensor *na_max_dim(na_tensor *x, int dim, bool keepdim); /* gradient to the first max */
na_tensor *na_argmax(na_tensor *x, int dim, bool keepdim);  /* i32, first max */

/* ---- softmax and losses -------------------------------------------------------------- */
na_tensor *na_softmax(na_tensor *x);     /* over the last axis */
na_tensor *na_log_softmax(na_tensor *x); /* over the last axis */

typedef enum { NA_REDUCTION_MEAN, NA_REDUCTION_SUM, NA_REDUCTION_NONE } na_reduction;
typedef struct {
    na_reduction reduction; /* default (zeroed struct): mean */
    double label_smoothing; /* in [0, 1]: targets (1-e)*onehot + e/C */
} na_cross_entropy_opts;
/* Fused log-softmax + NLL: logits [N, C] float, labels [N] i32 in [0, C) (a label out of
 * range is an error). f32 output. opts may be NULL. */
na_tensor *na_cross_entropy(na_tensor *logits, na_tensor *labels,
                            const na_cross_entropy_opts *opts);
na_tensor *na_mse_loss(na_tensor *a, na_tensor *b, na_reduction reduction);

/* ---- misc --------------------------------------------------------------------------- */
/* Zeroes each element with probability p and scales the rest by 1/(1-p); the mask comes
 * from the global generator. Identity when !training or p == 0. */
na_tensor *na_dropout(na_tensor *x, double p, bool training);
/* Round-to-nearest-even conversion between float dtypes; identity if dt == x->dtype. */
na_tensor *na_cast(na_tensor *x, na_dtype dt);


/* ---- convolution, normalization, pooling (NCHW) ------------------------------------- */
/* Zeroed fields take the defaults: stride 1, padding 0, dilation 1, groups 1. */
typedef struct {
    int stride[2], padding[2], dilation[2];
    int groups;
} na_conv2d_opts;
/* x [N, C_in, H, W], w [C_out, C_in/groups, kh, kw], b [C_out] or NULL; opts may be NULL. */
na_tensor *na_conv2d(na_tensor *x, na_tensor *w, na_tensor *b, const na_conv2d_opts *opts);
/* na_conv2d whose device also sums each output channel, for the training BatchNorm that
 * follows (na_batch_norm_sums), when NANOAMP_CONV_BN_STATS asks for it on x's device ("1":
 * CUDA, "all": every device; unset or "0": never) and the backend serves the problem (on CUDA
 * a cuDNN graph whose epilogue writes the sums: no statistics pass over y). Then *sum and
 * *sqsum are f32 [C_out] (f64 for f64 y): sum(y) and sum(y^2) over N, H, W, outside autograd.
 * Otherwise both are NULL and this is na_conv2d. */
na_tensor *na_conv2d_sums(na_tensor *x, na_tensor *w, na_tensor *b, const na_conv2d_opts *opts,
                          na_tensor **sum, na_tensor **sqsum);

/* The two gradients of y = na_conv2d(x, w, NULL, opts) for an output gradient gy, outside
 * autograd (nothing recorded): *gx = the data gradient (x's shape), *gw = the weight gradient
 * (w's shape), either pointer NULL to skip it; gy, x and w of one float dtype and device,
 * contiguous NCHW results. The kernels of na_conv2d's own backward (the FP8 Conv2d of
 * nanoamp/fp8.h runs them on exactly widened FP8 operands). NA_OK or an error. */
int na_conv2d_grads(na_tensor *gy, na_tensor *x, na_tensor *w, const na_conv2d_opts *opts,
                    na_tensor **gx, na_tensor **gw);

/* stride 0 means stride = kernel. Padding at most half the kernel. Floor output size. */
typedef struct {
    int kernel[2], stride[2], padding[2];
    bool count_include_pad; /* avg pooling: divide by the full window (PyTorch's default true
                               is spelled out here: set it) */
} na_pool2d_opts;
na_tensor *na_max_pool2d(na_tensor *x, const na_pool2d_opts *opts);
na_tensor *na_avg_pool2d(na_tensor *x, const na_pool2d_opts *opts);
na_tensor *na_global_avg_pool2d(na_tensor *x); /* [N, C, H, W] -> [N, C] */
na_tensor *na_global_max_pool2d(na_tensor *x); /* [N, C, H, W] -> [N, C] */

/* Batch normalization over dim 1 of x [N, C], [N, C, L] or [N, C, H, W] (any float dtype).
 * weight/bias (affine, may be NULL) and running_mean/running_var (may be NULL) are f32 [C]
 * (f64 for f64 x); the output has x's dtype. Training normalizes with the batch mean and
 * biased variance and, if running stats are given, updates them in place:
 * running = (1 - momentum) * running + momentum * stat (unbiased variance). Eval uses the
 * running statistics. Training with one value per channel is an error. */
na_tensor *na_batch_norm(na_tensor *x, na_tensor *running_mean, na_tensor *running_var,
                         na_tensor *weight, na_tensor *bias, bool training, double momentum,
                         double eps);
/* relu(na_batch_norm(...)) in one pass each way, same arguments and rules: the output is the
 * only activation kept for backward (ReLU's mask is read from it), none before the ReLU. In
 * f32 on the CPU its values and gradients equal the unfused pair's bit for bit. */
na_tensor *na_batch_norm_relu(na_tensor *x, na_tensor *running_mean, na_tensor *running_var,
                              na_tensor *weight, na_tensor *bias, bool training, double momentum,
                              double eps);
/* Training-mode na_batch_norm (relu false) or na_batch_norm_relu whose batch statistics come
 * from sum and sqsum of x over N, H, W (as na_conv2d_sums gives them for the x it made):
 * mean = sum/M, var = sqsum/M - mean^2 (M values per channel), with no pass over x for them.
 * Output, running-statistics update and gradients are na_batch_norm's up to rounding; the
 * variance loses precision when |mean| is large against the spread (sqsum/M and mean^2
 * cancel), which the default path's Welford statistics do not. sum NULL: na_batch_norm(_relu)
 * in training mode. */
na_tensor *na_batch_norm_sums(na_tensor *x, const na_tensor *sum, const na_tensor *sqsum,
                              na_tensor *running_mean, na_tensor *running_var, na_tensor *weight,
                              na_tensor *bias, double momentum, double eps, bool relu);

#ifdef __cplusplus
}
#endif
#endif
