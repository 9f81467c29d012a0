/* kernels/cuda/unary_backward.cu — gx = gy * f'(x, y) for the unary ops (see elementwise.cuh). */
#include "elementwise.cuh"

/* ---- unary backward: gx = gy * f'(x, y) --------------------------------------------------- */
template <class T, int OP>
__global__ void k_unary_bwd(const typename T::S *x, const typename T::S *y,
                            const typename T::S *gy, typename T::S *gx, int64_t n,
                            typename T::C a, typename T::C b) {
    typedef typename T::C C;
    NA_GRID_STRIDE(i, n) {
        C xv = x ? T::ld(x, i) : (C)0;
        C yv = y ? T::ld(y, i) : (C)0;
        T::st(gx, i, T::ld(gy, i) * ew_grad<OP>(xv, yv, a, b));
    }
}

static __device__ __forceinline__ float grad_rt(int op, float x, float y, float a, float b) { return na_unary_grad_f(op, x, y, a, b); }
static __device__ __forceinline__ double grad_rt(int op, double x, double y, double a, double b) { return na_unary_grad_d(op, x, y, a, b); }

template <typename C>
__global__ void k_unary_bwd_any(int op, const void *x, int xdt, const void *y, int ydt,
                                const void *gy, int gydt, void *gx, int gxdt, int64_t n, C a,
                                C b) {
    NA_GRID_STRIDE(i, n) {
        C xv = x ? na_ld<C>(x, xdt, i) : (C)0;
        C yv = y ? na_ld<C>(y, ydt, i) : (C)0;
        na_st(gx, gxdt, i, na_ld<C>(gy, gydt, i) * grad_rt(op, xv, yv, a, b));
    }
}

int na_cuda_unary_backward(na_unary_op op, const na_view *x, const na_view *y,
                           const na_view *gy, na_view *gx, double a, double b) {
    int64_t n = gx->numel;
    if (n == 0) return NA_OK;
    unsigned grid = na_grid(n, NA_BLOCK);
    cudaStream_t st = na_cuda_ctx.stream;
    na_dtype dt = gx->dtype;
    bool same = gy->dtype == dt && (!x || x->dtype == dt) && (!y || y->dtype == dt);
    const void *xp = x ? x->data : NULL, *yp = y ? y->data : NULL;
    if (!same) {
        int xdt = x ? (int)x->dtype : 0, ydt = y ? (int)y->dtype : 0;
        if (any_f64(x, y, gy, gx))
            k_unary_bwd_any<double><<<grid, NA_BLOCK, 0, st>>>(
                op, xp, xdt, yp, ydt, gy->data, gy->dtype, gx->data, gx->dtype, n, a, b);
        else
            k_unary_bwd_any<float><<<grid, NA_BLOCK, 0, st>>>(
                op, xp, xdt, yp, ydt, gy->data, gy->dtype, gx->data, gx->dtype, n, (float)a,
                (float)b);
        NA_CUDA_LAUNCH_CHECK("k_unary_bwd_any");
        return NA_OK;
    }
    return dispatch_unary_op(op, [&](auto opc) -> int {
        constexpr int OP = decltype(opc)::value;
        return na_dispatch_float(dt, "unary_backward", [&](auto tag) -> int {
            typedef typename decltype(tag)::T T;
            typedef typename T::C C;
            typedef typename T::S S;
            k_unary_bwd<T, OP><<<grid, NA_BLOCK, 0, st>>>((const S *)xp, (const S *)yp,
                                                          (const S *)gy->data, (S *)gx->data, n,
                                                          (C)a, (C)b);
            NA_CUDA_LAUNCH_CHECK("k_unary_bwd");
            return NA_OK;
        });
    });
}

