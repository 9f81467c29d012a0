/* kernels/cuda/elementwise.cuh — shared by unary.cu, unary_backward.cu and binary.cu: unary
 * ops, their backward, and broadcasting binary ops.
 *
 * The per-element math is kernels/common/elementwise.h (na_unary_f / na_unary_grad_f /
 * na_binary_f and the _d versions for f64), shared with the CPU backend. Kernels are
 * templated on the dtype and on the op, so each launch runs one straight-line function:
 * load (widen to f32, or f64), math, one round-to-nearest-even store.
 *
 * Fast paths: all tensors of one dtype (the front-end's contract); same-shape binary ops run
 * flat. Otherwise (broadcasting) offsets come from the na_broadcast strides. Tensors of mixed
 * dtypes fall back to a kernel that loads and stores through the runtime dtype (and takes the
 * op at run time: a rare path, kept small). The three files compile in parallel.
 */
#ifndef NANOAMP_KERNELS_CUDA_ELEMENTWISE_CUH
#define NANOAMP_KERNELS_CUDA_ELEMENTWISE_CUH
#include <type_traits>

#include "cuda_common.cuh"
#include "common/elementwise.h"

template <int OP> __device__ __forceinline__ float ew_unary(float x, float a, float b) {
    return na_unary_f(OP, x, a, b);
}
template <int OP> __device__ __forceinline__ double ew_unary(double x, double a, double b) {
    return na_unary_d(OP, x, a, b);
}
template <int OP> __device__ __forceinline__ float ew_grad(float x, float y, float a, float b) {
    return na_unary_grad_f(OP, x, y, a, b);
}
template <int OP>
__device__ __forceinline__ double ew_grad(double x, double y, double a, double b) {
    return na_unary_grad_d(OP, x, y, a, b);
}
template <int OP> __device__ __forceinline__ float ew_binary(float x, float y) {
    return na_binary_f(OP, x, y);
}
template <int OP> __device__ __forceinline__ double ew_binary(double x, double y) {
    return na_binary_d(OP, x, y);
}

template <int N> using op_c = std::integral_constant<int, N>;

/* f(op_c<op>{}): the op as a compile-time constant, one case per row of the lists in
 * common/elementwise_ops.h */
#define NA_EW_UNARY_DISPATCH_(NAME, ...)                                                    \
    case NA_UNARY_##NAME: return f(op_c<NA_UNARY_##NAME>{});
#define NA_EW_BINARY_DISPATCH_(NAME, ...)                                                   \
    case NA_BINARY_##NAME: return f(op_c<NA_BINARY_##NAME>{});

template <class F> static inline int dispatch_unary_op(int op, F &&f) {
    switch (op) {
    NA_UNARY_OPS(NA_EW_UNARY_DISPATCH_)
    default: return na_set_error(NA_EINVAL, "unary (cuda): invalid op %d", op);
    }
}

template <class F> static inline int dispatch_binary_op(int op, F &&f) {
    switch (op) {
    NA_BINARY_OPS(NA_EW_BINARY_DISPATCH_)
    default: return na_set_error(NA_EINVAL, "binary (cuda): invalid op %d", op);
    }
}

static inline bool any_f64(const na_view *a, const na_view *b, const na_view *c,
                    const na_view *d) {
    return (a && a->dtype == NA_DTYPE_F64) || (b && b->dtype == NA_DTYPE_F64) ||
           (c && c->dtype == NA_DTYPE_F64) || (d && d->dtype == NA_DTYPE_F64);
}

#endif
