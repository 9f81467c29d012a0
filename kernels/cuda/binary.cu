/* kernels/cuda/binary.cu — broadcasting binary ops and the per-channel bias (+ relu) used by
 * gemm and conv (see elementwise.cuh). */
#include "elementwise.cuh"

/* ---- binary with broadcasting ---------------------------------------------------------- */
template <class T, int OP>
__global__ void k_binary_flat(const typename T::S *a, const typename T::S *b, typename T::S *out,
                              int64_t n) {
    NA_GRID_STRIDE(i, n) T::st(out, i, ew_binary<OP>(T::ld(a, i), T::ld(b, i)));
}

static __device__ __forceinline__ void bc_offsets(const na_broadcast &bc, int64_t i,
                                                  int64_t *ia, int64_t *ib) {
    int64_t oa = 0, ob = 0;
    for (int d = bc.ndim - 1; d >= 0; d--) {
        int64_t s = bc.shape[d];
        int64_t q = i / s;
        int64_t c = i - q * s;
        oa += c * bc.a_stride[d];
        ob += c * bc.b_stride[d];
        i = q;
    }
    *ia = oa;
    *ib = ob;
}

template <class T, int OP>
__global__ void k_binary_bc(const typename T::S *a, const typename T::S *b, typename T::S *out,
                            na_broadcast bc, int64_t n) {
    NA_GRID_STRIDE(i, n) {
        int64_t ia, ib;
        bc_offsets(bc, i, &ia, &ib);
        T::st(out, i, ew_binary<OP>(T::ld(a, ia), T::ld(b, ib)));
    }
}

template <typename C, int OP>
__global__ void k_binary_any(const void *a, int adt, const void *b, int bdt, void *out, int odt,
                             na_broadcast bc, int64_t n) {
    NA_GRID_STRIDE(i, n) {
        int64_t ia, ib;
        bc_offsets(bc, i, &ia, &ib);
        na_st(out, odt, i, ew_binary<OP>(na_ld<C>(a, adt, ia), na_ld<C>(b, bdt, ib)));
    }
}

/* the strides of a contiguous tensor of bc's shape, size-1 dims ignored */
static bool bc_is_flat(const na_broadcast *bc, const int64_t *stride) {
    int64_t expect = 1;
    for (int d = bc->ndim - 1; d >= 0; d--) {
        if (bc->shape[d] != 1 && stride[d] != expect) return false;
        expect *= bc->shape[d];
    }
    return true;
}

int na_cuda_binary(na_binary_op op, const na_view *a, const na_view *b, na_view *out,
                   const na_broadcast *bcp) {
    int64_t n = out->numel;
    if (n == 0) return NA_OK;
    na_broadcast bc;
    if (bcp) {
        bc = *bcp;
    } else { /* same shapes */
        bc.ndim = out->ndim;
        int64_t s = 1;
        for (int d = out->ndim - 1; d >= 0; d--) {
            bc.shape[d] = out->shape[d];
            bc.a_stride[d] = bc.b_stride[d] = s;
            s *= out->shape[d];
        }
    }
    if (bc.ndim == 0) { /* 0-dim: one element */
        bc.ndim = 1;
        bc.shape[0] = 1;
        bc.a_stride[0] = bc.b_stride[0] = 0;
    }
    bool flat = bc_is_flat(&bc, bc.a_stride) && bc_is_flat(&bc, bc.b_stride);
    unsigned grid = na_grid(n, NA_BLOCK);
    cudaStream_t st = na_cuda_ctx.stream;
    return dispatch_binary_op(op, [&](auto opc) -> int {
        constexpr int OP = decltype(opc)::value;
        if (a->dtype == out->dtype && b->dtype == out->dtype) {
            return na_dispatch_float(out->dtype, "binary", [&](auto tag) -> int {
                typedef typename decltype(tag)::T T;
                typedef typename T::S S;
                if (flat)
                    k_binary_flat<T, OP><<<grid, NA_BLOCK, 0, st>>>(
                        (const S *)a->data, (const S *)b->data, (S *)out->data, n);
                else
                    k_binary_bc<T, OP><<<grid, NA_BLOCK, 0, st>>>(
                        (const S *)a->data, (const S *)b->data, (S *)out->data, bc, n);
                NA_CUDA_LAUNCH_CHECK("k_binary");
                return NA_OK;
            });
        }
        if (any_f64(a, b, out, NULL))
            k_binary_any<double, OP><<<grid, NA_BLOCK, 0, st>>>(
                a->data, a->dtype, b->data, b->dtype, out->data, out->dtype, bc, n);
        else
            k_binary_any<float, OP><<<grid, NA_BLOCK, 0, st>>>(
                a->data, a->dtype, b->data, b->dtype, out->data, out->dtype, bc, n);
        NA_CUDA_LAUNCH_CHECK("k_binary_any");
        return NA_OK;
    });
}

/* ---- bias (+ relu) over [outer, channels, inner] ------------------------------------------ */
template <typename C>
__global__ void k_add_bias(void *y, int ydt, const void *bias, int bdt, int64_t channels,
                           int64_t inner, int64_t n, bool relu) {
    NA_GRID_STRIDE(i, n) {
        C v = na_ld<C>(y, ydt, i);
        if (bias) v = v + na_ld<C>(bias, bdt, (i / inner) % channels);
        if (relu) v = NA_RELU(C, v);
        na_st(y, ydt, i, v);
    }
}

int na_cuda_add_bias(void *y, na_dtype ydt, const void *bias, na_dtype bdt, int64_t outer,
                     int64_t channels, int64_t inner, bool relu) {
    int64_t n = outer * channels * inner;
    if (n == 0 || (!bias && !relu)) return NA_OK;
    unsigned grid = na_grid(n, NA_BLOCK);
    if (ydt == NA_DTYPE_F64)
        k_add_bias<double><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(y, ydt, bias, bdt, channels,
                                                                      inner, n, relu);
    else
        k_add_bias<float><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(y, ydt, bias, bdt, channels,
                                                                     inner, n, relu);
    NA_CUDA_LAUNCH_CHECK("k_add_bias");
    return NA_OK;
}
