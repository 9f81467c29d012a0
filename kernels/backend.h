/* kernels/backend.h — the compute interface one device implements.
 *
 * src/ calls kernels only through na_backend_get(device)->fn(...). The CPU backend
 * (kernels/cpu) is the reference: complete and simple. The CUDA backend (kernels/cuda) must
 * agree with it within per-dtype tolerances (tests/test_cuda_parity.c).
 *
 * Contract for every kernel:
 *  - its views (nanoamp/view.h) are on the backend's device, contiguous (C order) unless a
 *    comment says otherwise, and their shapes/dtypes were checked by the front-end in src/;
 *  - f16/bf16 are computed as a GPU computes: widened to f32, f32 math and accumulation,
 *    one round-to-nearest-even on store (kernels/common/half.h). f64 computes in f64;
 *  - the per-element math comes from kernels/common/elementwise.h, shared by both backends
 *    and generated, like the op enums below, from the lists in common/elementwise_ops.h;
 *  - a kernel returns NA_OK or a negative na_status with na_set_error() naming the call.
 *    CUDA kernels run asynchronously on the backend's stream; nothing here synchronizes
 *    except memcpy_d2h and synchronize.
 */
#ifndef NANOAMP_KERNELS_BACKEND_H
#define NANOAMP_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/elementwise_ops.h"
#include "na_config.h"
#include "nanoamp/error.h"
#include "nanoamp/view.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The elementwise kernels' ops, in the order of their lists (common/elementwise_ops.h). */
typedef enum {
#define NA_UNARY_ENUM_(NAME, ...) NA_UNARY_##NAME,
    NA_UNARY_OPS(NA_UNARY_ENUM_)
#undef NA_UNARY_ENUM_
    NA_UNARY_COUNT
} na_unary_op;

typedef enum {
#define NA_BINARY_ENUM_(NAME, ...) NA_BINARY_##NAME,
    NA_BINARY_OPS(NA_BINARY_ENUM_)
#undef NA_BINARY_ENUM_
    NA_BINARY_COUNT
} na_binary_op;

typedef enum { NA_REDUCE_SUM, NA_REDUCE_MEAN, NA_REDUCE_MAX, NA_REDUCE_COUNT } na_reduce_op;

/* Broadcast geometry of a binary op: out has `shape`; element (i0..in) of out reads
 * a[sum ik*a_stride[k]] and b[sum ik*b_stride[k]] (stride 0 on broadcast dims). */
typedef struct {
    int ndim;
    int64_t shape[NA_MAX_DIMS];
    int64_t a_stride[NA_MAX_DIMS];
    int64_t b_stride[NA_MAX_DIMS];
} na_broadcast;

/* Row-major, batched: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] (+ bias[n], then
 * relu). op(X) = X^T when the t flag is set. A, B, C, bias share `dtype`; accumulation is
 * f32 (f64 for f64). lda/ldb/ldc are the row strides of A, B, C as stored. */
typedef struct {
    na_dtype dtype;
    const void *a, *b, *bias; /* bias may be NULL */
    void *c;
    bool ta, tb, relu;
    int64_t m, n, k, lda, ldb, ldc;
    int64_t batch, stride_a, stride_b, stride_c; /* elements between batch entries */
    float alpha, beta;
} na_gemm_args;

/* One scaled FP8 product (na_scaled_mm): C = (*scale_a * *scale_b) * (A @ B) (+ bias[n]),
 * f32 accumulation, one rounding to c_dtype (f32 or bf16). A [m, k] is row-major (lda), B
 * [k, n] is stored as its transpose ([n, k] row-major, ldb): the layout cuBLASLt's FP8 GEMM
 * takes. scale_a, scale_b: f32, one element each, on the device; bias NULL or c_dtype. */
typedef struct {
    na_dtype a_dtype, b_dtype, c_dtype;
    const void *a, *b, *scale_a, *scale_b, *bias;
    void *c;
    int64_t m, n, k, lda, ldb;
} na_scaled_mm_args;

/* 2-d convolution / pooling geometry, NCHW. For conv: weight [C_out, C_in/groups, kh, kw]. */
typedef struct {
    int64_t n, c_in, h, w;      /* input */
    int64_t c_out, oh, ow;      /* output (pooling: c_out == c_in) */
    int kh, kw, sh, sw, ph, pw, dh, dw, groups;
    bool count_include_pad; /* avg pooling only */
} na_conv_geom;

/* ---- optimizer kernels' arguments (layers and optimizers; see src/optim) --------------- */

/* One multi-tensor optimizer step over n parameters. Every list has n entries; tensors are
 * contiguous and on the backend's device; entry i of every list belongs to params[i].
 * Mixed precision fits without copies:
 *  - grads may have another float dtype than params (f16 model grads, f32 master weights);
 *  - inv_scale (f32 0-dim, or NULL): each gradient is multiplied by it before use;
 *  - found_inf (f32 0-dim, or NULL): when nonzero the kernel changes nothing at all
 *    (params, state, steps, copies); read on the device, no host round trip;
 *  - copies (NULL, or n entries each NULL or shaped as params[i]): receives the updated
 *    parameter rounded to its own dtype (the f16 model copy of an f32 master weight).
 * lr (f64 0-dim, or NULL): the learning rate, read on the device in place of h->lr (the same
 * double, so the same update), so that a replayed CUDA graph sees each step's new value.
 * State is f32. steps[i] (f32 0-dim) counts the steps taken: the kernel increments it and
 * uses the new value (Adam's bias corrections; SGD: a step count of 0 before the step means
 * "no momentum history yet", so buf = g). */
typedef struct {
    int n;
    na_view *const *params;          /* updated in place; any float dtype */
    const na_view *const *grads;     /* any float dtype */
    na_view *const *steps;           /* f32 0-dim */
    na_view *const *exp_avg;         /* Adam first moment; SGD momentum buffer (NULL when
                                        momentum is 0) */
    na_view *const *exp_avg_sq;      /* Adam second moment (NULL for SGD) */
    na_view *const *max_exp_avg_sq;  /* Adam amsgrad's running max of exp_avg_sq, or NULL */
    na_view *const *copies;          /* may be NULL; entries may be NULL */
    const na_view *found_inf;        /* may be NULL */
    const na_view *inv_scale;        /* may be NULL */
    const na_view *lr;               /* may be NULL: h->lr */
} na_optim_tensors;

/* Hyper-parameters of one call (one parameter group). */
typedef struct {
    double lr, weight_decay;
    double momentum, dampening; /* SGD */
    bool nesterov;              /* SGD */
    double beta1, beta2, eps;   /* Adam / AdamW */
    bool amsgrad;               /* Adam / AdamW: max_exp_avg_sq is given */
    bool decoupled_weight_decay; /* AdamW: p *= 1 - lr*wd; Adam: g += wd*p */
} na_optim_hparams;

/* ---- the kernel list ---------------------------------------------------------------------
 * Every kernel of a backend, once: NA_BACKEND_KERNELS(X, OPT) calls X(name, params) for a
 * kernel every backend implements and OPT(name, params) for an optional one, which a backend
 * may leave NULL (a backend without them expands OPT to nothing when it builds its table;
 * front-ends check with NA_BACKEND_NEED). Every kernel returns int (NA_OK or a negative
 * na_status). The list generates the na_backend fields below, each backend's declarations
 * (na_cpu_<name> in cpu/cpu_internal.h, na_cuda_<name> in cuda/cuda_common.cuh) and each
 * backend's table, so adding a kernel is: one line here, one definition per backend.
 * Views are on the backend's device; pointers to const are read, the others written. */
#define NA_BACKEND_KERNELS(X, OPT)                                                          \
    /* ---- fills ---- */                                                                   \
    X(fill, (na_view *t, double value))                                                     \
    X(arange, (na_view *t, double start, double step))                                      \
    X(fill_uniform, (na_view *t, double lo, double hi, uint64_t seed, uint64_t offset))     \
    X(fill_normal, (na_view *t, double mean, double std, uint64_t seed, uint64_t offset))   \
    /* mask[i] = (uniform(seed, offset, i) >= p) ? 1/(1-p) : 0, in mask's dtype */          \
    X(dropout_mask, (na_view *mask, double p, uint64_t seed, uint64_t offset))              \
    /* dst = src with dtype conversion; same shape; src may be strided (any view); dst is   \
     * contiguous, dense in another order (channels-last), or any view (slowest). */        \
    X(copy, (na_view *dst, const na_view *src))                                             \
                                                                                            \
    /* ---- elementwise ---- */                                                             \
    X(unary, (na_unary_op op, const na_view *x, na_view *y, double a, double b))            \
    /* gx = gy * dy/dx, given x, y = f(x) (both available; each op uses what it needs) */   \
    X(unary_backward, (na_unary_op op, const na_view *x, const na_view *y,                  \
                       const na_view *gy, na_view *gx, double a, double b))                 \
    /* out = a (op) b under broadcasting; a, b, out share out's dtype */                    \
    X(binary, (na_binary_op op, const na_view *a, const na_view *b, na_view *out,           \
               const na_broadcast *bc))                                                     \
                                                                                            \
    /* ---- reductions of x viewed as [outer, r, inner] into out [outer, inner]; `out` may  \
     * have a different float dtype than x (f32 results of f16 inputs). MAX also writes the \
     * index of the first max into `idx` (i32 [outer, inner]) when idx != NULL. ---- */     \
    X(reduce, (na_reduce_op op, const na_view *x, na_view *out, na_view *idx,               \
               int64_t outer, int64_t r, int64_t inner))                                    \
    /* argmax over [outer, r, inner] -> idx i32 [outer, inner] */                           \
    X(argmax, (const na_view *x, na_view *idx, int64_t outer, int64_t r, int64_t inner))    \
    /* gx (zeroed here) [outer, r, inner]: gx[o, idx[o,i], i] = gy[o, i] */                 \
    X(scatter_max_grad, (const na_view *gy, const na_view *idx, na_view *gx,                \
                         int64_t outer, int64_t r, int64_t inner))                          \
                                                                                            \
    /* ---- softmax / log-softmax over the last axis of [rows, cols]; y may be wider than   \
     * x ---- */                                                                            \
    X(softmax, (const na_view *x, na_view *y, int64_t rows, int64_t cols, bool log))        \
    /* from the output y: softmax gx = y*(gy - sum(gy*y)); log: gx = gy - exp(y)*sum(gy) */ \
    X(softmax_backward, (const na_view *y, const na_view *gy, na_view *gx,                  \
                         int64_t rows, int64_t cols, bool log))                             \
    /* Fused log-softmax + NLL with label smoothing e: per-row loss (f32 [N]) and the row's \
     * logsumexp (f32 [N], saved for backward). Labels are i32 [N] in [0, C): the front-end \
     * checks them on the CPU; a CUDA kernel writes NaN for a row whose label is out of     \
     * range. */                                                                            \
    X(cross_entropy, (const na_view *logits, const na_view *labels, na_view *loss,          \
                      na_view *lse, double smoothing))                                      \
    /* gx[n,c] = g[n] * (softmax[n,c] - ((1-e)*[c==label] + e/C)); g is f32 [N] */          \
    X(cross_entropy_backward, (const na_view *logits, const na_view *labels,                \
                               const na_view *lse, const na_view *g, na_view *gx,           \
                               double smoothing))                                           \
                                                                                            \
    X(gemm, (const na_gemm_args *args))                                                     \
    /* na_scaled_mm's FP8 GEMM; *done = false (and NA_OK) when this backend does not take   \
     * the problem (its switch is off, an unsupported layout or pair): nothing was written, \
     * the front-end widens the operands and runs gemm. */                                  \
    OPT(scaled_mm, (const na_scaled_mm_args *args, bool *done))                             \
                                                                                            \
    /* ---- convolution (NCHW); bias may be NULL ---- */                                    \
    X(conv2d, (const na_conv_geom *g, const na_view *x, const na_view *w,                   \
               const na_view *bias, na_view *y))                                            \
    X(conv2d_backward_data, (const na_conv_geom *g, const na_view *gy, const na_view *w,    \
                             na_view *gx))                                                  \
    X(conv2d_backward_weight, (const na_conv_geom *g, const na_view *x, const na_view *gy,  \
                               na_view *gw))                                                \
    /* conv2d that also gives, per output channel, sum[k] and sqsum[k] (sum of squares) of  \
     * y over N, OH, OW, as stored (f32 [C_out]; f64 for f64 y), for a training BatchNorm   \
     * that follows (its batch statistics without a pass over y). *done = false when this   \
     * backend does not compute the two together for the problem: nothing was written, the  \
     * caller runs conv2d and a BatchNorm of its own. */                                    \
    X(conv2d_stats, (const na_conv_geom *g, const na_view *x, const na_view *w,             \
                     const na_view *bias, na_view *y, na_view *sum, na_view *sqsum,         \
                     bool *done))                                                           \
                                                                                            \
    /* ---- pooling (NCHW); max pooling saves the flat index (i32) of each window's first   \
     * max ---- */                                                                          \
    X(max_pool2d, (const na_conv_geom *g, const na_view *x, na_view *y, na_view *idx))      \
    X(max_pool2d_backward, (const na_conv_geom *g, const na_view *gy, const na_view *idx,   \
                            na_view *gx))                                                   \
    X(avg_pool2d, (const na_conv_geom *g, const na_view *x, na_view *y))                    \
    X(avg_pool2d_backward, (const na_conv_geom *g, const na_view *gy, na_view *gx))         \
                                                                                            \
    /* ---- batch norm over x [N, C, S] (S = H*W, 1 for BatchNorm1d). gamma/beta/running    \
     * stats and saved stats are f32 [C] (f64 for f64 x); x and y share a float dtype.      \
     * Training: batch mean and biased variance normalize; save_mean/save_invstd are        \
     * written; if running_mean != NULL: running = (1-momentum)*running + momentum*stat     \
     * with the unbiased variance. gamma/beta may be NULL (affine off). relu: y =           \
     * relu(bn(x)) in the same pass (BatchNorm + ReLU fused, ReLU as NA_UNARY_RELU).        \
     * y NULL: the statistics only (SyncBatchNorm normalizes with the global ones). */      \
    X(batch_norm_train, (const na_view *x, const na_view *gamma, const na_view *beta,       \
                         na_view *running_mean, na_view *running_var, na_view *y,           \
                         na_view *save_mean, na_view *save_invstd, int64_t n, int64_t c,    \
                         int64_t s, double momentum, double eps, bool relu))                \
    X(batch_norm_eval, (const na_view *x, const na_view *gamma, const na_view *beta,        \
                        const na_view *running_mean, const na_view *running_var,            \
                        na_view *y, int64_t n, int64_t c, int64_t s, double eps,            \
                        bool relu))                                                         \
    /* training backward: gx = (gy - mean(gy) - xhat*mean(gy*xhat)) * invstd * gamma;       \
     * ggamma = sum(gy*xhat), gbeta = sum(gy) (each may be NULL). For eval-mode backward    \
     * the front-end passes the running stats as mean/invstd and train=false:               \
     * gx = gy*invstd*gamma. relu_y: NULL, or the output y of a relu forward; then every    \
     * gy above is gy * relu'(y) (0 where y <= 0), ReLU's backward fused in. */             \
    X(batch_norm_backward, (const na_view *x, const na_view *gy, const na_view *gamma,      \
                            const na_view *mean, const na_view *invstd, na_view *gx,        \
                            na_view *ggamma, na_view *gbeta, int64_t n, int64_t c,          \
                            int64_t s, bool train, const na_view *relu_y))                  \
    /* the training gx of batch_norm_backward from given per-channel sums over `count`      \
     * values (f32 [C], f64 for f64 x): gx = (gy - sum_gy/count - xhat*sum_gyxhat/count) *  \
     * invstd * gamma, gy * relu'(y) for gy when relu_y is given. One pass; SyncBatchNorm   \
     * gets this rank's sums from batch_norm_backward with gx NULL and passes the sums over \
     * all ranks (PyTorch's batch_norm_backward_elemt). */                                 \
    X(batch_norm_backward_elemt, (const na_view *x, const na_view *gy, const na_view *gamma,\
                                  const na_view *mean, const na_view *invstd,               \
                                  const na_view *sum_gy, const na_view *sum_gyxhat,         \
                                  int64_t count, na_view *gx, int64_t n, int64_t c,         \
                                  int64_t s, const na_view *relu_y))                        \
    /* SyncBatchNorm fused with its ReLU: batch_norm_backward (gx NULL: ggamma, gbeta) and \
     * batch_norm_backward_elemt (gx given: from sum_gy, sum_gyxhat over count) with relu_y \
     * the forward's y = relu((x - mean) * invstd(var, eps) * gamma + beta) as              \
     * batch_norm_eval computes it, its sign recomputed from x instead of read: each pass   \
     * reads x and gy only. invstd is xhat's, as in those two. *done = false: not computed  \
     * for these operands (the CPU: bf16 x; CUDA: none), the caller passes y to those two. */\
    OPT(batch_norm_relu_backward_x, (const na_view *x, const na_view *gy,                   \
                                     const na_view *gamma, const na_view *beta,             \
                                     const na_view *mean, const na_view *var, double eps,   \
                                     const na_view *invstd, const na_view *sum_gy,          \
                                     const na_view *sum_gyxhat, int64_t count, na_view *gx, \
                                     na_view *ggamma, na_view *gbeta, int64_t n, int64_t c, \
                                     int64_t s, bool *done))                                \
    /* batch_norm_eval's y, bit for bit, in one pass over x in memory order: SyncBatchNorm  \
     * normalizes the whole layer after its all-gather, when no channel is left in the     \
     * cache, so its rows are read as they lie rather than a channel's N rows C*S apart.    \
     * *done = false: not computed for these operands (the CPU: f64 x, or no AVX2 + F16C;  \
     * CUDA: none), the caller runs batch_norm_eval. */                                     \
    OPT(batch_norm_eval_rows, (const na_view *x, const na_view *gamma, const na_view *beta, \
                               const na_view *running_mean, const na_view *running_var,     \
                               na_view *y, int64_t n, int64_t c, int64_t s, double eps,     \
                               bool relu, bool *done))                                      \
    /* a training BatchNorm's statistics from per-channel sums over `count` values (sum,    \
     * sqsum as conv2d_stats gives them): mean = sum/count, var = max(sqsum/count - mean^2, \
     * 0) (biased), invstd = 1/sqrt(var + eps) into save_mean, save_var, save_invstd (f32   \
     * [C]; f64 for f64 sums); running stats (may be NULL) as batch_norm_train.             \
     * batch_norm_eval with save_mean and save_var then normalizes as training would. */    \
    X(batch_norm_finalize, (const na_view *sum, const na_view *sqsum, int64_t count,        \
                            na_view *running_mean, na_view *running_var, na_view *save_mean,\
                            na_view *save_var, na_view *save_invstd, int64_t c,             \
                            double momentum, double eps))                                   \
                                                                                            \
    /* ---- optimizers (src/optim; per-element math: kernels/common/optim.h) ----           \
     * SGD (PyTorch's rule): g' = g*inv_scale + wd*p; buf = steps==0 ? g' :                 \
     * momentum*buf + (1-dampening)*g'; d = nesterov ? g' + momentum*buf : buf (g' when     \
     * momentum is 0); p -= lr*d. */                                                        \
    OPT(sgd_step, (const na_optim_tensors *t, const na_optim_hparams *h))                   \
    /* Adam / AdamW (PyTorch's rule, eps outside the sqrt, bias corrections from steps). */ \
    OPT(adam_step, (const na_optim_tensors *t, const na_optim_hparams *h))                  \
    /* norm = sqrt(sum of x^2 over every element of xs[0..n)), f32 accumulation, into the   \
     * f32 0-dim `norm`. If coef != NULL (f32 0-dim) also coef = na_clip_coef(norm,         \
     * max_norm): min(1, max_norm / (norm + 1e-6)), or 1 when norm is not finite. */        \
    OPT(l2norm, (int n, const na_view *const *xs, na_view *norm, na_view *coef,             \
                 double max_norm))                                                          \
                                                                                            \
    /* ---- amp: loss scaling (src/amp; per-element math and the exact rules in             \
     * kernels/common/amp.h). Neither synchronizes: scale, found_inf and counters stay on   \
     * the device, so a training step's skip-or-step decision needs no host round trip.     \
     * One fused pass over n views (any float dtypes, contiguous; in[i] and out[i] have the \
     * same numel and may be the same memory): out[i] = in[i] * inv_scale, computed in f32  \
     * and rounded once to out[i]'s dtype, where inv_scale = na_amp_inv_scale(*scale) (f32  \
     * 0-dim scale). If any element of any in[i] is inf or NaN, *found_inf (f32 0-dim, may  \
     * be NULL) is set to 1; it is never cleared here. ---- */                              \
    OPT(amp_unscale, (int n, const na_view *const *in, na_view *const *out,                 \
                      const na_view *scale, na_view *found_inf))                            \
    /* One scaler update (na_amp_update): found = any *found_infs[k] != 0 (f32 0-dim each); \
     * scale (f32 0-dim) and counters (i32 [NA_AMP_CTR_COUNT]) are updated in place by the  \
     * rule of `kind` (NA_AMP_KIND_*) with hp[NA_AMP_HP_COUNT] (host memory, read at the    \
     * call). */                                                                            \
    OPT(amp_update_scale, (int kind, const double *hp, na_view *scale, na_view *counters,   \
                           int n_found, const na_view *const *found_infs))                  \
    /* The divergence watch (na_amp_note_nonfinite): *first (f64 0-dim) = step when it is 0 \
     * and some element of x (any float dtype, contiguous) is inf or NaN; else unchanged.   \
     * On the device, no host round trip. */                                               \
    OPT(note_nonfinite, (const na_view *x, na_view *first, double step))

typedef struct na_backend {
    const char *name;

    /* memory: raw buffers of the device; alloc returns NULL with an error set on failure */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    int (*memcpy_h2d)(void *dst, const void *src, size_t bytes);
    int (*memcpy_d2h)(void *dst, const void *src, size_t bytes); /* synchronizes */
    int (*memcpy_d2d)(void *dst, const void *src, size_t bytes);
    int (*synchronize)(void);
    /* profiling (optional, NULL where the host clock serves, as on the CPU): an event recorded
     * on the device's stream now (NULL with an error on failure), the milliseconds between
     * two recorded events (waits for `end`), and freeing one (NULL is fine) */
    void *(*event_record)(void);
    int (*event_elapsed_ms)(void *start, void *end, double *ms);
    void (*event_free)(void *event);
    /* step graphs (optional, NULL where the device has none; src/tensor/step_graph.c):
     * graph_begin starts recording the stream (nothing runs until a launch; a host sync, an
     * allocation or a host->device copy until graph_end makes the recording fail, saying
     * why); graph_end(ok, &graph) stops it and, when ok and nothing failed, instantiates the
     * recording into *graph; graph_launch enqueues a recorded graph, graph_free frees one */
    int (*graph_begin)(void);
    int (*graph_end)(bool ok, void **graph);
    int (*graph_launch)(void *graph);
    void (*graph_free)(void *graph);

    /* the kernels of NA_BACKEND_KERNELS, one function pointer each */
#define NA_BACKEND_FIELD_(kernel, params) int (*kernel) params;
    NA_BACKEND_KERNELS(NA_BACKEND_FIELD_, NA_BACKEND_FIELD_)
#undef NA_BACKEND_FIELD_
} na_backend;

/* NA_OK when backend `be` has the optional kernel `kernel`, else NA_ENOTSUP with
 * "<kernel> is not implemented on <backend> (an optional kernel)"; the caller adds its name. */
#define NA_BACKEND_NEED(be, kernel)                                                         \
    ((be)->kernel ? NA_OK                                                                   \
                  : na_set_error(NA_ENOTSUP, "%s is not implemented on %s (an optional "    \
                                 "kernel)", #kernel, (be)->name))

/* The backend of a device, or NULL with an error naming the device when it is not built in
 * (or, for CUDA, when no device is present). */
const na_backend *na_backend_get(na_device dev);

/* Implemented by kernels/cpu and kernels/cuda. */
extern const na_backend na_cpu_backend;
#if NA_HAVE_CUDA
const na_backend *na_cuda_backend_init(void); /* NULL (error set) when no device */
#endif

#ifdef __cplusplus
}
#endif
#endif
