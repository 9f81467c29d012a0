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

template <class F> static inline int dispatch_unary_op(int op, F &&f) {
    switch (op) {
    case NA_UNARY_NEG: return f(op_c<NA_UNARY_NEG>{});
    case NA_UNARY_SCALE: return f(op_c<NA_UNARY_SCALE>{});
    case NA_UNARY_ADD_SCALAR: return f(op_c<NA_UNARY_ADD_SCALAR>{});
    case NA_UNARY_EXP: return f(op_c<NA_UNARY_EXP>{});
    case NA_UNARY_LOG: return f(op_c<NA_UNARY_LOG>{});
    case NA_UNARY_SQRT: return f(op_c<NA_UNARY_SQRT>{});
    case NA_UNARY_RSQRT: return f(op_c<NA_UNARY_RSQRT>{});
    case NA_UNARY_POW: return f(op_c<NA_UNARY_POW>{});
    case NA_UNARY_ABS: return f(op_c<NA_UNARY_ABS>{});
    case NA_UNARY_CLAMP: return f(op_c<NA_UNARY_CLAMP>{});
    case NA_UNARY_RELU: return f(op_c<NA_UNARY_RELU>{});
    case NA_UNARY_GELU: return f(op_c<NA_UNARY_GELU>{});
    case NA_UNARY_SIGMOID: return f(op_c<NA_UNARY_SIGMOID>{});
    case NA_UNARY_TANH: return f(op_c<NA_UNARY_TANH>{});
    default: return na_set_error(NA_EINVAL, "unary (cuda): invalid op %d", op);
    }
}

template <class F> static inline int dispatch_binary_op(int op, F &&f) {
    switch (op) {
    case NA_BINARY_ADD: return f(op_c<NA_BINARY_ADD>{});
    case NA_BINARY_SUB: return f(op_c<NA_BINARY_SUB>{});
    case NA_BINARY_MUL: return f(op_c<NA_BINARY_MUL>{});
    case NA_BINARY_DIV: return f(op_c<NA_BINARY_DIV>{});
    default: return na_set_error(NA_EINVAL, "binary (cuda): invalid op %d", op);
    }
}

static inline bool any_f64(const na_view *a, const na_view *b, const na_view *c,
                    const na_view *d) {
    return (a && a->dtype == NA_DTYPE_F64) || (b && b->dtype == NA_DTYPE_F64) ||
           (c && c->dtype == NA_DTYPE_F64) || (d && d->dtype == NA_DTYPE_F64);
}

#endif
