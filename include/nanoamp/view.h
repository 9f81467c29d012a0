/* nanoamp/view.h — the plain view of memory that backend kernels take.
 *
 * A view is a dtype, a device, a shape (up to NA_MAX_DIMS dims) with strides in elements, the
 * element count and a pointer to the first element: all a kernel needs to read or write a
 * tensor, and nothing of the framework (no autograd, no arena, no names). Every na_tensor
 * embeds one (t->view; nanoamp/tensor.h), so a front-end passes &t->view to a kernel and user
 * code keeps reading t->dtype, t->shape, t->data. Kernels include this header, never tensor.h.
 *
 *     na_view v = {.dtype = NA_DTYPE_F32, .device = NA_DEVICE_CPU, .ndim = 1,
 *                  .shape = {4}, .stride = {1}, .numel = 4, .data = values};
 *     na_backend_get(NA_DEVICE_CPU)->fill(&v, 0.0);
 *
 * Plain C, usable from C++/CUDA as it is.
 */
#ifndef NANOAMP_VIEW_H
#define NANOAMP_VIEW_H

#include <stdint.h>

#include "nanoamp/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NA_MAX_DIMS 6

/* The members of a view, written once: na_view below and na_tensor's anonymous copy (which
 * lets t->dtype work) are laid out from this same list. */
#define NA_VIEW_MEMBERS                                                                     \
    na_dtype dtype;                                                                         \
    na_device device;                                                                       \
    int ndim;                                                                               \
    int64_t shape[NA_MAX_DIMS];                                                             \
    int64_t stride[NA_MAX_DIMS]; /* in elements */                                          \
    int64_t numel;                                                                          \
    void *data; /* first element; a device pointer for CUDA memory */

typedef struct na_view {
    NA_VIEW_MEMBERS
} na_view;

#ifdef __cplusplus
}
#endif
#endif
