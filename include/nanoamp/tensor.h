/* nanoamp/tensor.h — tensors, their memory, and the step arena.
 *
 * A tensor is a dtype, a device, a shape (up to NA_MAX_DIMS dims) with strides in elements,
 * and a pointer to its first element (a device pointer for CUDA tensors). Views (reshape of a
 * contiguous tensor, transpose, permute, slice) share memory with their base.
 *
 * Two lifetimes:
 *  - step tensors: everything an op or na_zeros/na_empty/... returns lives in the per-step
 *    arena and is released all at once by na_step_end(). A user never frees an intermediate.
 *    Once warm, the arena is a few buffers per device near the step's high-water mark: no
 *    malloc (or cudaMalloc) per op. Within a step, na_backward gives back the gradients of
 *    intermediates once consumed (nanoamp/autograd.h), and their memory is reused.
 *  - persistent tensors: na_tensor_new() makes a tensor (and later its .grad) that lives until
 *    na_tensor_free(). Parameters, optimizer state, master weights and scaler state are
 *    persistent and owned by the module/optimizer/scaler that made them.
 *
 *     na_tensor *x = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), values);
 *     na_tensor *y = na_relu(na_matmul(x, w));     // both live until na_step_end()
 *     na_step_end();
 *
 * The framework is single-threaded: one thread builds and runs graphs (error messages and
 * autocast state are per thread; the arena and the RNG are global).
 */
#ifndef NANOAMP_TENSOR_H
#define NANOAMP_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nanoamp/dtype.h"
#include "nanoamp/view.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct na_node na_node;
typedef struct na_tensor na_tensor;

struct na_tensor {
    /* dtype, device, ndim, shape, stride (in elements), numel, data (a device pointer for CUDA
     * tensors): read as t->dtype, ...; &t->view is what backend kernels take (nanoamp/view.h). */
    union {
        na_view view;
        struct {
            NA_VIEW_MEMBERS
        };
    };
    na_tensor *base;       /* the tensor whose memory a view shares, or NULL */
    bool persistent;       /* freed by na_tensor_free, not by na_step_end */
    bool requires_grad;
    na_tensor *grad;       /* accumulated gradient of a leaf (same shape, dtype, device) */
    na_node *grad_fn;      /* the graph node that produced this tensor; NULL for leaves */
    bool zero_deferred;    /* a gradient zero_grad marked: it reads as zeros but its memory
                              is not filled yet (nanoamp/autograd.h, na_grad_settle) */
    const char *name;      /* optional ("features.0.weight"), used in messages */
    uint32_t version;      /* in-place writes to the memory this tensor owns (na_copy_,
                              na_fill_, na_copy_from_host, na_function_mark_dirty): a view's
                              writes count on its base. na_backward refuses a node whose
                              saved tensors were written after it saved them. */
};

/* The kernel view of a tensor that may be NULL (then NULL). */
#define NA_VIEW_OF(t) ((t) ? &(t)->view : NULL)

/* NA_SHAPE(2, 3) expands to the (ndim, shape) pair the constructors take. */
#define NA_SHAPE(...) \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}

/* ---- step tensors (arena) ----------------------------------------------------------- */
na_tensor *na_empty(na_dtype dt, na_device dev, int ndim, const int64_t *shape);
na_tensor *na_zeros(na_dtype dt, na_device dev, int ndim, const int64_t *shape);
na_tensor *na_ones(na_dtype dt, na_device dev, int ndim, const int64_t *shape);
na_tensor *na_full(na_dtype dt, na_device dev, int ndim, const int64_t *shape, double value);
na_tensor *na_scalar(na_dtype dt, na_device dev, double value); /* 0-dim */
/* 1-d [start, start+step, ...) below stop (above stop for a negative step). */
na_tensor *na_arange(na_dtype dt, na_device dev, double start, double stop, double step);
/* Uniform in [lo, hi) and normal(mean, std) from the global counter-based generator:
 * the CPU and CUDA backends produce the very same numbers for the same seed and calls. */
na_tensor *na_rand(na_dtype dt, na_device dev, int ndim, const int64_t *shape, double lo,
                   double hi);
na_tensor *na_randn(na_dtype dt, na_device dev, int ndim, const int64_t *shape, double mean,
                    double std);
/* A copy of host memory holding numel elements of dtype dt. */
na_tensor *na_from_host(na_dtype dt, na_device dev, int ndim, const int64_t *shape,
                        const void *host);
na_tensor *na_empty_like(const na_tensor *t);
na_tensor *na_zeros_like(const na_tensor *t);

/* ---- persistent tensors ------------------------------------------------------------- */
/* Zero-filled; lives (with its .grad) until na_tensor_free. */
na_tensor *na_tensor_new(na_dtype dt, na_device dev, int ndim, const int64_t *shape);
void na_tensor_free(na_tensor *t); /* NULL is fine; step tensors are ignored */

/* ---- the step arena ----------------------------------------------------------------- */
/* Release every step tensor and graph node made since the last call. Gradients of
 * persistent leaves stay. */
void na_step_end(void);
size_t na_arena_capacity(na_device dev); /* bytes reserved (the high-water mark once warm) */
size_t na_arena_used(na_device dev);     /* bytes in use (handed out, not given back) */
/* The largest na_arena_used since the process started or since na_arena_peak_reset(). */
size_t na_arena_peak(na_device dev);
void na_arena_peak_reset(void);
size_t na_arena_chunk_allocs(na_device dev); /* raw allocations made so far (tests check it
                                                stops growing once warm) */

/* ---- a training step as a device graph (CUDA graphs) ------------------------------------
 * na_step_graph_capture records what step(ctx) enqueues on dev's stream, without running
 * it, then ends the step (na_step_end); na_step_graph_replay runs the recording again with
 * no host work. Capture after a few eager steps of the same shapes (warm-up), when the step
 * arena is empty (right after na_step_end) and has grown to the step's high-water mark;
 * then replay to take the step. The contract (src/tensor/step_graph.c):
 *  - the step reads only persistent tensors and step tensors it makes itself: copy each
 *    batch into the same persistent input tensors before a replay, and copy what the host
 *    reads afterwards (the loss) into persistent tensors inside the step;
 *  - what changes between steps is read on the device: na_optim_set_lr_on_device,
 *    na_module_count_batches_on_device, the loss scalers' state (always on the device);
 *  - every persistent tensor the step uses stays alive and in place while the graph lives.
 * Capture fails (NULL, a message naming why, and the step did not run: run it eagerly) on
 * the cpu device, in a build or on a machine without CUDA, when the step waits for the
 * device (a device->host copy, a synchronize: loss-scale reads, DDP's NCCL wait), allocates
 * device memory (a first step, a new shape, a growing workspace), copies host data to the
 * device, records profiler events or a step hook is installed, draws random numbers, or
 * fails itself. */
typedef struct na_step_graph na_step_graph;
typedef int (*na_step_fn)(void *ctx); /* NA_OK or a negative status with a message */
na_step_graph *na_step_graph_capture(na_device dev, na_step_fn step, void *ctx);
int na_step_graph_replay(na_step_graph *g); /* enqueues the step on the stream; no sync */
void na_step_graph_free(na_step_graph *g);  /* NULL is fine */
bool na_step_graph_capturing(void);         /* within na_step_graph_capture's step */

/* ---- the generator ------------------------------------------------------------------ */
void na_manual_seed(uint64_t seed); /* also resets the offset */
uint64_t na_rng_seed(void);
uint64_t na_rng_offset(void);
void na_rng_set_state(uint64_t seed, uint64_t offset);
/* The offset (stream) for a fill of n numbers; each call gets a fresh stream. */
uint64_t na_rng_reserve(uint64_t n);

/* ---- moving data -------------------------------------------------------------------- */
int na_copy_to_host(const na_tensor *t, void *host);   /* numel elements, t's dtype, C order */
int na_copy_from_host(na_tensor *t, const void *host); /* into a contiguous tensor */
/* dst = src (shapes equal; dtype conversion allowed; any devices; src may be a view, and so
 * may dst on src's device). Not recorded by autograd. */
int na_copy_(na_tensor *dst, const na_tensor *src);
int na_fill_(na_tensor *t, double value);               /* not recorded by autograd */
double na_item(const na_tensor *t);                     /* a one-element tensor's value */
double na_get(const na_tensor *t, int64_t i);           /* element i in C order, as double */
na_tensor *na_to_device(const na_tensor *t, na_device dev); /* a step copy (differentiable) */

/* ---- shape ------------------------------------------------------------------------- */
bool na_is_contiguous(const na_tensor *t);
bool na_same_shape(const na_tensor *a, const na_tensor *b);
/* "[2, 3] f32 cpu" into buf; returns buf. */
const char *na_tensor_describe(const na_tensor *t, char *buf, size_t size);
#define NA_DESCRIBE_MAX 96

/* Views and reshapes are differentiable; a -1 in shape is inferred. */
na_tensor *na_reshape(na_tensor *t, int ndim, const int64_t *shape);
na_tensor *na_flatten(na_tensor *t, int start_dim); /* dims start_dim.. merged into one */
na_tensor *na_transpose(na_tensor *t, int d0, int d1);
na_tensor *na_permute(na_tensor *t, const int *perm);
na_tensor *na_slice(na_tensor *t, int64_t start, int64_t stop); /* rows [start, stop) of dim 0 */
na_tensor *na_contiguous(na_tensor *t); /* t itself when already contiguous */
/* Zeros along one dim: `before` elements ahead of t's and `after` behind (F.pad on one dim,
 * constant 0); differentiable; the result keeps t's memory format. */
na_tensor *na_pad_dim(na_tensor *t, int dim, int64_t before, int64_t after);

/* ---- memory formats ---------------------------------------------------------------------
 * A 4-d tensor [N, C, H, W] is stored contiguous (C order) or channels-last (N, H, W, C order,
 * strides [C*H*W, 1, W*C, C]; PyTorch's torch.channels_last), the layout cuDNN's tensor-core
 * convolutions want. Ops keep their input's format: convert a network's input once with
 * na_to_channels_last and conv2d, BatchNorm, pooling and same-shape elementwise ops stay
 * channels-last (conv2d converts its weight itself); na_contiguous converts back. */
typedef enum { NA_FORMAT_CONTIGUOUS, NA_FORMAT_CHANNELS_LAST } na_memory_format;
/* Channels-last strides (size-1 dims' strides ignored): true for 4-d tensors only. */
bool na_is_channels_last(const na_tensor *t);
/* NA_FORMAT_CHANNELS_LAST when t is channels-last and not also contiguous (a tensor with
 * C == 1, or H == W == 1, is both: its memory is the same either way). */
na_memory_format na_memory_format_of(const na_tensor *t);
/* A step tensor of that format (channels-last needs 4 dims); values uninitialized. */
na_tensor *na_empty_format(na_dtype dt, na_device dev, int ndim, const int64_t *shape,
                           na_memory_format f);
/* t in format f: t itself when it already is, else a differentiable copy. */
na_tensor *na_contiguous_format(na_tensor *t, na_memory_format f);
na_tensor *na_to_channels_last(na_tensor *t); /* na_contiguous_format(t, CHANNELS_LAST) */

#ifdef __cplusplus
}
#endif
#endif
