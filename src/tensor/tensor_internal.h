/* Helpers shared by the tensor code and the layers above it (internal). */
#ifndef NANOAMP_SRC_TENSOR_INTERNAL_H
#define NANOAMP_SRC_TENSOR_INTERNAL_H

#include "kernels/backend.h"
#include "nanoamp/error.h"
#include "nanoamp/tensor.h"

/* A step tensor with contiguous strides and no data yet (data = NULL). */
na_tensor *na_tensor_header(na_dtype dt, na_device dev, int ndim, const int64_t *shape);
/* A step tensor struct that views `base` (copying its geometry). */
na_tensor *na_tensor_view_header(na_tensor *base);
void na_set_contiguous_strides(na_tensor *t);
/* Gives the memory of a step tensor that owns it (no view, not persistent) back to the arena
 * before the step ends; t->data becomes NULL. Only when nothing refers to that memory. */
void na_tensor_release(na_tensor *t);
int64_t na_shape_numel(int ndim, const int64_t *shape);

/* The tensor that owns t's memory: t, or the base a view shares. */
static inline na_tensor *na_tensor_owner(const na_tensor *t) {
    return t->base ? t->base : (na_tensor *)t;
}
/* Version counters (na_tensor.version) live on the owner, so views share them. */
static inline uint32_t na_tensor_version(const na_tensor *t) {
    return na_tensor_owner(t)->version;
}
static inline void na_tensor_bump_version(na_tensor *t) { na_tensor_owner(t)->version++; }

/* The backend of t's device (error set, NULL if unavailable). */
const na_backend *na_be(const na_tensor *t);

/* na_tensor_describe, then " (name)" when t has a name: "[2] f32 cpu (w)". */
const char *na_tensor_describe_named(const na_tensor *t, char *buf, size_t size);

/* Checks that set a message naming `fn` and return false on failure. na_check_tensor
 * refuses NULL and a tensor whose memory na_backward gave back (released). */
bool na_check_tensor(const char *fn, const na_tensor *t, const char *what);
bool na_check_float(const char *fn, const na_tensor *t, const char *what);
bool na_check_same_device(const char *fn, const na_tensor *a, const na_tensor *b);
bool na_check_same_dtype(const char *fn, const na_tensor *a, const na_tensor *b);
/* Normalizes a possibly negative dim; false with an error if out of range. */
bool na_check_dim(const char *fn, const na_tensor *t, int *dim);

/* The wider of two float dtypes (f16 with bf16 gives f32). */
na_dtype na_promote_float(na_dtype a, na_dtype b);
/* The dtype of a binary op on float tensors a and b, as PyTorch's result_type: a 0-dim
 * tensor does not widen one with dimensions (f16 [N] with f32 0-dim gives f16); otherwise
 * na_promote_float. */
na_dtype na_result_float(const na_tensor *a, const na_tensor *b);

/* ---- memory formats (memory_format.c; the ops' side in src/ops/shape.c) ---- */
/* Shaped and formatted as t (contiguous unless t is channels-last), t's dtype and device. */
na_tensor *na_empty_like_format(const na_tensor *t);
/* out = a (op) b, all three of one shape and one dense layout, over their memory as rows */
int na_binary_on_memory(na_binary_op op, na_tensor *out, const na_tensor *a, const na_tensor *b);
/* a and b have one shape and one dense layout: elementwise work can run on flat views. */
bool na_same_dense_layout(const na_tensor *a, const na_tensor *b);
/* t when dense in either format, else a contiguous copy (recorded, as na_contiguous). */
na_tensor *na_dense(na_tensor *t);
/* t in the memory format of `like` (a gradient brought to its input's layout; recorded). */
na_tensor *na_as_format_of(na_tensor *t, const na_tensor *like);
/* [outer, r, inner] split of t around `dim`. */
void na_split_dims(const na_tensor *t, int dim, int64_t *outer, int64_t *r, int64_t *inner);
#endif
