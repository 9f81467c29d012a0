/* kernels/cuda/unary.cu — y = f(x) for the unary ops (see elementwise.cuh). */
#include "elementwise.cuh"

/* ---- unary --------------------------------------------------------------------------- */
template <class T, int OP>
__global__ void k_unary(const typename T::S *x, typename T::S *y, int64_t n, typename T::C a,
                        typename T::C b) {
    NA_GRID_STRIDE(i, n) T::st(y, i, ew_unary<OP>(T::ld(x, i), a, b));
}

static __device__ __forceinline__ float unary_rt(int op, float x, float a, float b) { return na_unary_f(op, x, a, b); }
static __device__ __forceinline__ double unary_rt(int op, double x, double a, double b) { return na_unary_d(op, x, a, b); }

template <typename C>
__global__ void k_unary_any(int op, const void *x, int xdt, void *y, int ydt, int64_t n, C a, C b) {
    NA_GRID_STRIDE(i, n) na_st(y, ydt, i, unary_rt(op, na_ld<C>(x, xdt, i), a, b));
}

int na_cuda_unary(na_unary_op op, const na_view *x, na_view *y, double a, double b) {
    int64_t n = y->numel;
    if (n == 0) return NA_OK;
    unsigned grid = na_grid(n, NA_BLOCK);
    cudaStream_t st = na_cuda_ctx.stream;
    if (x->dtype != y->dtype) {
        if (any_f64(x, y, NULL, NULL))
            k_unary_any<double><<<grid, NA_BLOCK, 0, st>>>(op, x->data, x->dtype, y->data,
                                                           y->dtype, n, a, b);
        else
            k_unary_any<float><<<grid, NA_BLOCK, 0, st>>>(op, x->data, x->dtype, y->data,
                                                          y->dtype, n, (float)a, (float)b);
        NA_CUDA_LAUNCH_CHECK("k_unary_any");
        return NA_OK;
    }
    return dispatch_unary_op(op, [&](auto opc) -> int {
        constexpr int OP = decltype(opc)::value;
        return na_dispatch_float(y->dtype, "unary", [&](auto tag) -> int {
            typedef typename decltype(tag)::T T;
            typedef typename T::C C;
            k_unary<T, OP><<<grid, NA_BLOCK, 0, st>>>((const typename T::S *)x->data,
                                                      (typename T::S *)y->data, n, (C)a, (C)b);
            NA_CUDA_LAUNCH_CHECK("k_unary");
            return NA_OK;
        });
    });
}

