/* kernels/cuda/conv_graph.h — 2-d convolutions through cuDNN's graph API (plain C interface).
 *
 * NANOAMP_CUDNN_GRAPH=1 (read once; off by default) sends conv2d's forward, backward data and
 * backward weight in f32, f16 and bf16 through cuDNN's backend graph API (cudnnBackend*, in
 * cudnn_graph.h) instead of the legacy convolution calls; f64 stays on the legacy path. Per
 * problem a bounded cache keeps the execution plan, chosen on the problem's first call:
 *  - the engines of heuristic mode A, then of mode FALLBACK, each filtered by its notes
 *    (na_cg_engine_rejects: non-deterministic ones under NANOAMP_DETERMINISTIC=1; for f32
 *    FFT/Winograd, down-converting and, unless TF32 is on, tensor-core engines);
 *  - NANOAMP_CUDNN_FIND=1: up to NA_CG_MAX_TIMED plans that build are timed with CUDA events on
 *    the call's own buffers, the fastest kept; otherwise the first plan that builds.
 * A problem no plan serves takes the legacy path from then on (cached); the reason is printed
 * to stderr under NANOAMP_CUDNN_GRAPH_VERBOSE=1, as is each plan chosen ("conv graph: ...").
 * Workspaces come from the backend's scratch buffer (counted in the peak).
 *
 * Layout: tensor descriptors take the views' own strides in the logical order cuDNN wants
 * (x, y: N, C, H, W; w: K, C/groups, R, S), so NCHW views and channels-last views (strides
 * H*W*C, 1, W*C, C, as PyTorch writes them) are served by the same code.
 *
 * Two halves: the host logic here in plain C (conv_graph_host.c, built in every configuration
 * and unit tested on the CPU by tests/test_conv_graph.c), and the cuDNN calls
 * (conv_graph.cu, built with cuDNN 9 and the CUDA backend).
 */
#ifndef NANOAMP_KERNELS_CUDA_CONV_GRAPH_H
#define NANOAMP_KERNELS_CUDA_CONV_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a graph computes. FWD_BIAS_RELU: y = relu(conv(x, w) + bias), one graph. FWD_STATS:
 * y = conv(x, w) and a GenStats operation on y: per output channel k, sum[k] and sqsum[k] of y
 * over N, OH, OW (f32), for the training BatchNorm that follows (conv2d_stats). */
typedef enum {
    NA_CG_FWD,
    NA_CG_BWD_DATA,
    NA_CG_BWD_FILTER,
    NA_CG_FWD_BIAS_RELU,
    NA_CG_FWD_STATS,
    NA_CG_KINDS
} na_cg_kind;

/* The tensors of a graph, in unique-id order: x (the input; gx for backward data), w (the
 * filter; gw for backward weight), y (the output; gy for the backward kinds), bias ([1, K,
 * 1, 1]; FWD_BIAS_RELU only), sum and sqsum ([1, K, 1, 1] f32; FWD_STATS only). */
enum { NA_CG_X, NA_CG_W, NA_CG_Y, NA_CG_BIAS, NA_CG_SUM, NA_CG_SQSUM, NA_CG_TENSORS };

typedef struct {
    int64_t dim[4];    /* x, y: N, C, H, W; w: K, C/groups, R, S; bias, sums: 1, K, 1, 1 */
    int64_t stride[4]; /* the view's strides in elements, in the order of dim */
    int64_t align;     /* bytes the data pointer is aligned to: 2, 4, 8 or 16 */
} na_cg_tensor;

/* One problem, also the plan cache's key: zero-filled by na_cg_problem_init, then compared
 * bytewise (padding included: there is none, every field is 64-bit). */
typedef struct {
    int64_t kind;  /* na_cg_kind */
    int64_t dtype; /* na_dtype of every tensor */
    int64_t tf32, deterministic, autotune;
    na_cg_tensor t[NA_CG_TENSORS]; /* bias / sums all zero outside their kinds */
    int64_t pad[2], stride[2], dilation[2];
} na_cg_problem;

/* Describes a problem from the geometry and the views (x, w, y as above; bias only for
 * FWD_BIAS_RELU, sum and sqsum only for FWD_STATS, else NULL). x, w, y must be 4-d with the
 * geometry's shapes, one float dtype (f32, f16, bf16: f64 is the legacy path's), strides >= 1;
 * bias (x's dtype) and the sums (f32) [K] or [1, K, 1, 1] with a positive stride, described as
 * [1, K, 1, 1] whose unit dims take strides as in y's layout. NA_OK, or NA_EDTYPE / NA_ESHAPE
 * / NA_EINVAL with a message naming `who` and the shapes. */
int na_cg_problem_init(na_cg_problem *p, na_cg_kind kind, const na_conv_geom *g,
                       const na_view *x, const na_view *w, const na_view *y,
                       const na_view *bias, const na_view *sum, const na_view *sqsum,
                       bool tf32, bool deterministic, bool autotune, const char *who);

/* "forward f16 x [8, 3, 32, 32] str [3072, 1024, 32, 1] w [...] y [...] stride 1x1 pad 1x1
 * dil 1x1" into buf (truncated to n bytes); returns buf. */
const char *na_cg_problem_str(const na_cg_problem *p, char *buf, size_t n);

/* The largest of 16, 8, 4, 2 bytes that divides the address (16 for NULL). */
int64_t na_cg_alignment(const void *p);

/* An engine's numerical and behaviour notes as bits (conv_graph.cu maps cuDNN's notes). */
enum {
    NA_CG_NOTE_TENSOR_CORE = 1u << 0,
    NA_CG_NOTE_DOWN_CONVERT = 1u << 1,     /* computes in a narrower type than the inputs */
    NA_CG_NOTE_REDUCED_PRECISION = 1u << 2, /* reduces in a narrower type than f32 */
    NA_CG_NOTE_FFT = 1u << 3,
    NA_CG_NOTE_WINOGRAD = 1u << 4,          /* any Winograd tile */
    NA_CG_NOTE_NONDETERMINISTIC = 1u << 5,
    NA_CG_NOTE_RUNTIME_COMPILED = 1u << 6,  /* compiled with NVRTC when its plan is built */
};

/* NULL when an engine with these notes may serve the problem, else why not. The rules: never
 * down-converting or reduced-precision engines (the CPU reference accumulates in f32); with
 * `deterministic`, no non-deterministic engine; for f32 no FFT or Winograd (their error is
 * above the f32 parity tolerance, as on the legacy path) and, unless `tf32`, no tensor-core
 * engine (on f32 data that is TF32: strict f32 is the default); runtime-compiled engines only
 * when `allow_runtime_compiled` (seconds of NVRTC in the warm-up for a plain convolution,
 * which precompiled engines serve; the fused graphs (bias+relu, stats) may need them). */
const char *na_cg_engine_rejects(unsigned notes, na_dtype dt, bool tf32, bool deterministic,
                                 bool allow_runtime_compiled);

/* NULL when cuDNN may serve a FWD_STATS problem on a GPU of compute capability cc_major.x,
 * else why not: what cuDNN documents for GenStats (the runtime fusion engines' constraints,
 * and the ConvBNfprop pattern's, whose partial form conv + GenStats is ours) and so is not
 * even tried. x f16, or f32 from compute capability 8.0 (no bf16); x, y NHWC and w KRSC fully
 * packed (channels-last; size-1 dims aside); the sums packed; f16 pointers 16-byte aligned.
 * Other kinds: NULL. */
const char *na_cg_stats_rejects(const na_cg_problem *p, int cc_major);

/* Most plans timed per problem under NANOAMP_CUDNN_FIND=1, and most engine configurations
 * asked of each heuristic mode. */
#define NA_CG_MAX_TIMED 8
#define NA_CG_MAX_CONFIGS 32

/* The index of the smallest time in ms[0..n) among the finite ones >= 0 (a failed run is
 * given a negative time or NaN); the first on ties; -1 when none. */
int na_cg_fastest(const float *ms, int n);

/* ---- what a cuDNN status means (both cuDNN paths) ---------------------------------------- */
/* cuDNN 9 statuses come in kinds, the thousands: NOT_SUPPORTED is 3000 and its sub-codes
 * (NOT_SUPPORTED_SHAPE, ..._SHARED_MEMORY_INSUFFICIENT) 3001-3099; cuDNN 8's were 0-14, each
 * its own kind. The kind of `status` under cuDNN `cudnn_major`. */
int na_cudnn_status_kind(int status, int cudnn_major);

/* Where a status of the graph path came from. */
typedef enum {
    NA_CG_AT_CONFIG, /* one engine configuration: its engine, execution plan, workspace query,
                      * a timed run of its plan */
    NA_CG_AT_GRAPH,  /* the problem's tensors, operations, operation graph, a heuristic mode */
    NA_CG_AT_RUN,    /* the cached plan executed on a call's buffers */
} na_cg_stage;

typedef enum {
    NA_CG_OK,          /* success */
    NA_CG_NEXT_CONFIG, /* pass this engine configuration over, try the next */
    NA_CG_UNSERVED,    /* the graph path does not serve the problem: the plain path does */
} na_cg_verdict;

/* What the graph path does about `status` at `stage`. As cudnn-frontend does when it builds
 * plans, any failure of one engine configuration (an NVRTC compile failure is INTERNAL_ERROR,
 * a missing sub-library SUBLIBRARY_LOADING_FAILED, a launch EXECUTION_FAILED) only passes that
 * configuration over; any failure of the graph or of the cached plan sends the problem to the
 * plain path (the legacy calls, or conv2d + BatchNorm for conv2d_stats), which either serves
 * it or names its own error. None of them fails the convolution. */
na_cg_verdict na_cg_status_verdict(int status, na_cg_stage stage);

/* ---- the memory layout of a convolution (both cuDNN paths) ------------------------------- */
/* The channels-last contract (kernels/backend.h): x and y (gx, gy) are both contiguous NCHW
 * with w (gw) contiguous [K, C/groups, R, S], or all channels-last: x, y with strides
 * [C*H*W, 1, W*C, C], w with [C*R*S, 1, S*C, C] (KRSC memory). Strides of size-1 dims do not
 * count, so a view that is both (C == 1, or H == W == 1) fits either. */
typedef enum { NA_CONV_NCHW, NA_CONV_NHWC } na_conv_layout;

/* The layout of x, w, y (named as for `kind`: gx for backward data, gw for backward weight,
 * gy for the backward kinds), 4-d views. NA_OK with *out set, or NA_EINVAL naming `who`, each
 * view's shape and strides, when they are not all in one of the two layouts. */
int na_conv_layout_of(na_cg_kind kind, const na_view *x, const na_view *w, const na_view *y,
                      na_conv_layout *out, const char *who);

/* The strides of a dense 4-d tensor of dims [N, C, H, W] in `layout`. */
void na_conv_layout_strides(na_conv_layout layout, const int64_t dim[4], int64_t stride[4]);

/* ---- the plan cache: bounded, least recently used evicted ---------------------------------- */
/* A plan that a live CUDA step graph replays must outlive it (its kernels, runtime-compiled
 * ones in modules the plan owns, are recorded in the graph): entries used during a capture are
 * pinned, never evicted, until the last step graph is freed (na_cg_cache_unpin_all). */
#define NA_CG_CACHE_CAP 64

typedef struct {
    bool used, pinned;
    uint64_t hash, last_use;
    na_cg_problem key;
    void *plan;        /* owned by conv_graph.cu; NULL: the problem takes the legacy path */
    int64_t workspace; /* bytes the plan needs */
} na_cg_entry;

typedef struct {
    na_cg_entry e[NA_CG_CACHE_CAP];
    uint64_t clock;
} na_cg_cache;

/* The entry of `key` (marked as just used), or NULL. */
na_cg_entry *na_cg_cache_find(na_cg_cache *c, const na_cg_problem *key);
/* A fresh entry for `key` (not yet in the cache): a free slot, else the least recently used
 * unpinned one, whose plan is handed to *evicted for the caller to free (NULL when none).
 * NULL when every entry is pinned (the caller serves the problem on the plain path). */
na_cg_entry *na_cg_cache_claim(na_cg_cache *c, const na_cg_problem *key, void **evicted);
/* Empties an entry (a claim whose plan could not be made); its plan is the caller's. */
void na_cg_cache_drop(na_cg_entry *e);
/* Keeps e's plan until na_cg_cache_unpin_all (e is used by a capture). */
void na_cg_cache_pin(na_cg_entry *e);
/* The last step graph is gone: every entry may be evicted again. */
void na_cg_cache_unpin_all(na_cg_cache *c);

/* ---- the cuDNN side (conv_graph.cu; CUDA backend with cuDNN 9) ------------------------------- */

/* NANOAMP_CUDNN_GRAPH=1, read once. */
bool na_cuda_conv_graph_enabled(void);

/* Runs one convolution (kind FWD, BWD_DATA or BWD_FILTER: x, w, y as above, the written one
 * being y, x or w) through its cached plan, making the plan on the first call. *done = false
 * when the graph path does not serve the problem (the caller takes the legacy path), whatever
 * cuDNN's status (na_cg_status_verdict). NA_OK, or a negative status for what is not cuDNN's
 * answer about the problem (host memory, the scratch buffer, CUDA events, releasing
 * descriptors, a capture that forbids autotuning), naming the call and the problem. A problem that
 * gets no plan is cached as such; NANOAMP_CUDNN_GRAPH_VERBOSE=1 prints it once ("conv graph:
 * legacy path: PROBLEM -- REASON"), as it prints each plan ("conv graph: plan: PROBLEM: ..."). */
int na_cuda_conv_graph_run(na_cg_kind kind, const na_conv_geom *g, const na_view *x,
                           const na_view *w, const na_view *y, bool *done);

/* y = relu(conv(x, w) + bias) as one cuDNN graph (bias [K] or [1, K, 1, 1], x's dtype).
 * Internal, for the conv op to use later; *done = false when no fused plan exists for the
 * problem (then compute it unfused). Forward only: the backward needs relu's mask, which
 * the op keeps as y. */
int na_cuda_conv_graph_bias_relu(const na_conv_geom *g, const na_view *x, const na_view *w,
                                 const na_view *bias, const na_view *y, bool *done);

/* y = conv(x, w) with sum[k] and sqsum[k] of y per output channel (FWD_STATS; sums f32 [K]
 * or [1, K, 1, 1]), for conv2d_stats: not behind NANOAMP_CUDNN_GRAPH (the front-end asks only
 * under NANOAMP_CONV_BN_STATS). The sums are zeroed on the stream before the graph runs (cheap,
 * and right whether GenStats writes or accumulates). *done = false when no plan exists for the
 * problem (na_cg_stats_rejects, or none that cuDNN builds): cached, printed once under
 * NANOAMP_CUDNN_GRAPH_VERBOSE=1 as "conv graph: not served: PROBLEM -- REASON"; y is then
 * unwritten (the sums may have been zeroed). */
int na_cuda_conv_graph_stats(const na_conv_geom *g, const na_view *x, const na_view *w,
                             const na_view *y, const na_view *sum, const na_view *sqsum,
                             bool *done);

/* The last step graph was freed (backend.cu): the plans pinned for step graphs may be
 * evicted again, and those they refused at run time are freed. */
void na_cuda_conv_graph_unpin(void);

/* Frees every cached plan (at exit, from na_cuda_conv_cache_release). */
int na_cuda_conv_graph_release(void);

#ifdef __cplusplus
}
#endif
#endif
