/* kernels/cuda/reduce.cu — sum / mean / max (+ index of the first max) and argmax of x viewed
 * as [outer, r, inner], and the scatter of max gradients.
 *
 * Accumulation is in f32 (f64 when x or out is f64) whatever the storage dtype. Every reduction
 * combines partial results in a fixed order (no atomics), so results are deterministic.
 * Three shapes of work:
 *  - inner == 1 (rows are contiguous): one block row per output, threads stride over r;
 *  - inner == 1, few rows and long r: split each row into segments (pass 1 writes per-segment
 *    partials to scratch), then combine the partials in segment order (pass 2);
 *  - inner > 1: a block covers 32 consecutive outputs along inner (coalesced loads) and
 *    blockDim.y threads stride over r; partials are combined along y in order.
 * MAX keeps the smallest index among equal maxima; a NaN is the max (its first occurrence).
 */
#include "cuda_common.cuh"

template <typename C, int OP> struct red_acc {
    C v;
    int64_t i;
    __device__ __forceinline__ void init() {
        if (OP == NA_REDUCE_MAX) {
            v = (C)-INFINITY;
            i = INT64_MAX;
        } else {
            v = (C)0;
            i = 0;
        }
    }
    __device__ __forceinline__ void add(C x, int64_t j) {
        if (OP == NA_REDUCE_MAX) {
            if (na_better(x, j, v, i)) { v = x; i = j; }
        } else {
            v += x;
        }
    }
    /* combine across the x dimension of the block (every thread must call) */
    __device__ __forceinline__ void row_reduce(C *sv, int64_t *si) {
        if (OP == NA_REDUCE_MAX) na_row_reduce_argmax(v, i, sv, si);
        else v = na_row_reduce(v, na_op_sum(), sv);
    }
};

template <typename C, int OP>
__device__ __forceinline__ void red_store(const red_acc<C, OP> &a, void *out, int odt,
                                          int32_t *idx, int64_t o, int64_t r) {
    if (OP == NA_REDUCE_MEAN) {
        if (out) na_st(out, odt, o, a.v / (C)r);
    } else {
        if (out) na_st(out, odt, o, a.v);
    }
    if (OP == NA_REDUCE_MAX && idx) idx[o] = a.i == INT64_MAX ? -1 : (int32_t)a.i; /* r == 0 */
}

/* inner == 1; PARTIAL: rows are the segment partials (pv, pi) of pass 1, S per row */
template <typename C, int OP, bool PARTIAL>
__global__ void k_reduce_rows(const void *x, int xdt, const C *pv, const int64_t *pi, void *out,
                              int odt, int32_t *idx, int64_t rows, int64_t len, int64_t r) {
    __shared__ C sv[32];
    __shared__ int64_t si[32];
    for (int64_t base = (int64_t)blockIdx.x * blockDim.y; base < rows;
         base += (int64_t)gridDim.x * blockDim.y) {
        int64_t o = base + threadIdx.y;
        red_acc<C, OP> a;
        a.init();
        if (o < rows) {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
                if (PARTIAL) {
                    if (OP == NA_REDUCE_MAX) {
                        if (na_better(pv[o * len + j], pi[o * len + j], a.v, a.i)) {
                            a.v = pv[o * len + j];
                            a.i = pi[o * len + j];
                        }
                    } else {
                        a.v += pv[o * len + j];
                    }
                } else {
                    a.add(na_ld<C>(x, xdt, o * len + j), j);
                }
            }
        }
        a.row_reduce(sv, si);
        if (o < rows && threadIdx.x == 0) red_store(a, out, odt, idx, o, r);
    }
}

/* pass 1 of the split path: block (s, o) reduces x[o, s*seg : (s+1)*seg] */
template <typename C, int OP>
__global__ void k_reduce_seg(const void *x, int xdt, int64_t rows, int64_t r, int64_t seg,
                             int64_t nseg, C *pv, int64_t *pi) {
    __shared__ C sv[32];
    __shared__ int64_t si[32];
    for (int64_t o = blockIdx.y; o < rows; o += gridDim.y) {
        int64_t s = blockIdx.x;
        int64_t lo = s * seg, hi = lo + seg < r ? lo + seg : r;
        red_acc<C, OP> a;
        a.init();
        for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
            a.add(na_ld<C>(x, xdt, o * r + j), j);
        a.row_reduce(sv, si);
        if (threadIdx.x == 0) {
            pv[o * nseg + s] = a.v;
            pi[o * nseg + s] = a.i;
        }
    }
}

/* inner > 1: block (32, TY) covers outputs [o, i0 .. i0+31]; y strides over r */
template <typename C, int OP>
__global__ void k_reduce_cols(const void *x, int xdt, void *out, int odt, int32_t *idx,
                              int64_t outer, int64_t r, int64_t inner) {
    __shared__ C sv[1024];
    __shared__ int64_t si[1024];
    int64_t i = (int64_t)blockIdx.x * 32 + threadIdx.x;
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
        red_acc<C, OP> a;
        a.init();
        if (i < inner)
            for (int64_t j = threadIdx.y; j < r; j += blockDim.y)
                a.add(na_ld<C>(x, xdt, (o * r + j) * inner + i), j);
        __syncthreads();
        sv[threadIdx.y * 32 + threadIdx.x] = a.v;
        si[threadIdx.y * 32 + threadIdx.x] = a.i;
        __syncthreads();
        if (threadIdx.y == 0 && i < inner) {
            for (unsigned y = 1; y < blockDim.y; y++) {
                C v = sv[y * 32 + threadIdx.x];
                if (OP == NA_REDUCE_MAX) {
                    int64_t j = si[y * 32 + threadIdx.x];
                    if (na_better(v, j, a.v, a.i)) { a.v = v; a.i = j; }
                } else {
                    a.v += v;
                }
            }
            red_store(a, out, odt, idx, o * inner + i, r);
        }
    }
}

template <typename C, int OP>
static int reduce_launch(const na_view *x, na_view *out, na_view *idx, int64_t outer,
                         int64_t r, int64_t inner) {
    cudaStream_t st = na_cuda_ctx.stream;
    void *op = out ? out->data : NULL;
    int odt = out ? (int)out->dtype : 0;
    int32_t *ip = idx ? (int32_t *)idx->data : NULL;
    int64_t nout = outer * inner;
    if (nout == 0) return NA_OK;
    if (inner == 1) {
        int64_t sms = na_cuda_ctx.sm_count > 0 ? na_cuda_ctx.sm_count : 80;
        if (outer < sms * 2 && r >= 32768) {
            /* split long rows */
            int64_t nseg = (r + 8191) / 8192;
            int64_t cap = (sms * 8 + outer - 1) / outer;
            if (nseg > cap) nseg = cap;
            if (nseg > 1024) nseg = 1024;
            if (nseg < 2) nseg = 2;
            int64_t seg = (r + nseg - 1) / nseg;
            nseg = (r + seg - 1) / seg;
            size_t vbytes = ((size_t)(outer * nseg) * sizeof(C) + 255) & ~(size_t)255;
            char *ws = (char *)na_cuda_scratch(vbytes + (size_t)(outer * nseg) * sizeof(int64_t));
            if (!ws) return na_last_status();
            C *pv = (C *)ws;
            int64_t *pi = (int64_t *)(ws + vbytes);
            dim3 grid((unsigned)nseg, (unsigned)(outer < 65535 ? outer : 65535));
            k_reduce_seg<C, OP><<<grid, 256, 0, st>>>(x->data, x->dtype, outer, r, seg, nseg, pv, pi);
            NA_CUDA_LAUNCH_CHECK("k_reduce_seg");
            int tx = na_row_threads(nseg);
            k_reduce_rows<C, OP, true><<<na_grid(outer, 1), dim3(tx, 1), 0, st>>>(
                NULL, 0, pv, pi, op, odt, ip, outer, nseg, r);
            NA_CUDA_LAUNCH_CHECK("k_reduce_rows");
            return NA_OK;
        }
        int tx = na_row_threads(r);
        int ty = tx >= 256 ? 1 : 256 / tx;
        k_reduce_rows<C, OP, false><<<na_grid(outer, ty), dim3(tx, ty), 0, st>>>(
            x->data, x->dtype, NULL, NULL, op, odt, ip, outer, r, r);
        NA_CUDA_LAUNCH_CHECK("k_reduce_rows");
        return NA_OK;
    }
    int ty = r >= 64 ? 16 : (r >= 8 ? 8 : 1);
    int64_t gx = (inner + 31) / 32;
    if (gx > 0x7fffffff) return na_set_error(NA_EINVAL, "reduce (cuda): inner %lld too large", (long long)inner);
    dim3 grid((unsigned)gx, (unsigned)(outer < 65535 ? outer : 65535));
    k_reduce_cols<C, OP><<<grid, dim3(32, ty), 0, st>>>(x->data, x->dtype, op, odt, ip, outer, r,
                                                      inner);
    NA_CUDA_LAUNCH_CHECK("k_reduce_cols");
    return NA_OK;
}

static int check_float(const na_view *t, const char *who) {
    if (!na_dtype_is_float(t->dtype))
        return na_set_error(NA_EDTYPE, "%s (cuda): unsupported dtype %s", who,
                            na_dtype_name(t->dtype));
    return NA_OK;
}

int na_cuda_reduce(na_reduce_op op, const na_view *x, na_view *out, na_view *idx,
                   int64_t outer, int64_t r, int64_t inner) {
    NA_TRY(check_float(x, "reduce"));
    if (out) NA_TRY(check_float(out, "reduce"));
    bool d = x->dtype == NA_DTYPE_F64 || (out && out->dtype == NA_DTYPE_F64);
    switch (op) {
    case NA_REDUCE_SUM:
        return d ? reduce_launch<double, NA_REDUCE_SUM>(x, out, NULL, outer, r, inner)
                 : reduce_launch<float, NA_REDUCE_SUM>(x, out, NULL, outer, r, inner);
    case NA_REDUCE_MEAN:
        return d ? reduce_launch<double, NA_REDUCE_MEAN>(x, out, NULL, outer, r, inner)
                 : reduce_launch<float, NA_REDUCE_MEAN>(x, out, NULL, outer, r, inner);
    case NA_REDUCE_MAX:
        return d ? reduce_launch<double, NA_REDUCE_MAX>(x, out, idx, outer, r, inner)
                 : reduce_launch<float, NA_REDUCE_MAX>(x, out, idx, outer, r, inner);
    default: return na_set_error(NA_EINVAL, "reduce (cuda): invalid op %d", (int)op);
    }
}

int na_cuda_argmax(const na_view *x, na_view *idx, int64_t outer, int64_t r, int64_t inner) {
    NA_TRY(check_float(x, "argmax"));
    if (x->dtype == NA_DTYPE_F64)
        return reduce_launch<double, NA_REDUCE_MAX>(x, NULL, idx, outer, r, inner);
    return reduce_launch<float, NA_REDUCE_MAX>(x, NULL, idx, outer, r, inner);
}

/* gx[o, j, i] = (idx[o, i] == j) ? gy[o, i] : 0, every element written (no zeroing pass) */
template <typename C>
__global__ void k_scatter_max_grad(const void *gy, int gydt, const int32_t *idx, void *gx,
                                   int gxdt, int64_t r, int64_t inner, int64_t n) {
    NA_GRID_STRIDE(e, n) {
        int64_t i = e % inner;
        int64_t t = e / inner;
        int64_t j = t % r;
        int64_t o = t / r;
        int64_t k = o * inner + i;
        C v = (idx[k] == j) ? na_ld<C>(gy, gydt, k) : (C)0;
        na_st(gx, gxdt, e, v);
    }
}

int na_cuda_scatter_max_grad(const na_view *gy, const na_view *idx, na_view *gx,
                             int64_t outer, int64_t r, int64_t inner) {
    int64_t n = outer * r * inner;
    if (n == 0) return NA_OK;
    unsigned grid = na_grid(n, NA_BLOCK);
    if (gx->dtype == NA_DTYPE_F64 || gy->dtype == NA_DTYPE_F64)
        k_scatter_max_grad<double><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, (const int32_t *)idx->data, gx->data, gx->dtype, r, inner, n);
    else
        k_scatter_max_grad<float><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, (const int32_t *)idx->data, gx->data, gx->dtype, r, inner, n);
    NA_CUDA_LAUNCH_CHECK("k_scatter_max_grad");
    return NA_OK;
}
