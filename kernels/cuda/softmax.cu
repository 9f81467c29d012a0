/* kernels/cuda/softmax.cu — softmax / log-softmax over the last axis, their backward, and the
 * fused log-softmax + NLL (cross-entropy with label smoothing) forward and backward.
 *
 * One block row per matrix row: blockDim.x threads (32..512, by the row length) stride over
 * the columns, blockDim.y rows share a block when rows are short. Three passes over the row
 * (max, sum of exp, write), reading x from global memory each time (it stays in L1/L2).
 * Math in f32 (f64 for f64 inputs); x, y, gy, gx may each have their own float dtype ("y may
 * be wider than x"), loaded and stored through the runtime dtype.
 *
 *   softmax      y = exp(x - m) / s                 m = max x, s = sum exp(x - m)
 *   log_softmax  y = x - m - log(s)
 *   backward     softmax: gx = y * (gy - sum(gy*y));  log: gx = gy - exp(y) * sum(gy)
 *   CE           lse = m + log(s); loss = lse - ((1-e) x[label] + (e/C) sum(x))
 *                (loss and lse NaN for a label outside [0, C), as the CPU backend)
 *   CE backward  gx = g * (exp(x - lse) - ((1-e)[c == label] + e/C))
 */
#include "cuda_common.cuh"

#define ROWS_LOOP(rows)                                                                       \
    for (int64_t base_ = (int64_t)blockIdx.x * blockDim.y; base_ < (rows);                    \
         base_ += (int64_t)gridDim.x * blockDim.y)

static void row_geometry(int64_t rows, int64_t cols, dim3 *block, unsigned *grid) {
    int tx = na_row_threads(cols);
    int ty = tx >= 256 ? 1 : 256 / tx;
    *block = dim3(tx, ty);
    *grid = na_grid(rows, ty);
}

template <typename C, bool LOG>
__global__ void k_softmax(const void *x, int xdt, void *y, int ydt, int64_t rows, int64_t cols) {
    __shared__ C sm[32];
    ROWS_LOOP(rows) {
        int64_t o = base_ + threadIdx.y;
        bool act = o < rows;
        const int64_t off = o * cols;
        C m = (C)-INFINITY;
        if (act)
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
                m = na_op_max()(m, na_ld<C>(x, xdt, off + j));
        m = na_row_reduce(m, na_op_max(), sm);
        C s = (C)0;
        if (act)
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
                s += na_exp(na_ld<C>(x, xdt, off + j) - m);
        s = na_row_reduce(s, na_op_sum(), sm);
        if (act) {
            C ls = na_log(s);
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
                C v = na_ld<C>(x, xdt, off + j) - m;
                na_st(y, ydt, off + j, LOG ? v - ls : na_exp(v) / s);
            }
        }
    }
}

int na_cuda_softmax(const na_view *x, na_view *y, int64_t rows, int64_t cols, bool log) {
    if (rows * cols == 0) return NA_OK;
    dim3 block;
    unsigned grid;
    row_geometry(rows, cols, &block, &grid);
    cudaStream_t st = na_cuda_ctx.stream;
    bool d = x->dtype == NA_DTYPE_F64 || y->dtype == NA_DTYPE_F64;
    if (d && log) k_softmax<double, true><<<grid, block, 0, st>>>(x->data, x->dtype, y->data, y->dtype, rows, cols);
    else if (d) k_softmax<double, false><<<grid, block, 0, st>>>(x->data, x->dtype, y->data, y->dtype, rows, cols);
    else if (log) k_softmax<float, true><<<grid, block, 0, st>>>(x->data, x->dtype, y->data, y->dtype, rows, cols);
    else k_softmax<float, false><<<grid, block, 0, st>>>(x->data, x->dtype, y->data, y->dtype, rows, cols);
    NA_CUDA_LAUNCH_CHECK("k_softmax");
    return NA_OK;
}

template <typename C, bool LOG>
__global__ void k_softmax_bwd(const void *y, int ydt, const void *gy, int gydt, void *gx,
                              int gxdt, int64_t rows, int64_t cols) {
    __shared__ C sm[32];
    ROWS_LOOP(rows) {
        int64_t o = base_ + threadIdx.y;
        bool act = o < rows;
        const int64_t off = o * cols;
        C s = (C)0;
        if (act)
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
                C g = na_ld<C>(gy, gydt, off + j);
                s += LOG ? g : g * na_ld<C>(y, ydt, off + j);
            }
        s = na_row_reduce(s, na_op_sum(), sm);
        if (act)
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
                C g = na_ld<C>(gy, gydt, off + j);
                C yv = na_ld<C>(y, ydt, off + j);
                na_st(gx, gxdt, off + j, LOG ? g - na_exp(yv) * s : yv * (g - s));
            }
    }
}

int na_cuda_softmax_backward(const na_view *y, const na_view *gy, na_view *gx,
                             int64_t rows, int64_t cols, bool log) {
    if (rows * cols == 0) return NA_OK;
    dim3 block;
    unsigned grid;
    row_geometry(rows, cols, &block, &grid);
    cudaStream_t st = na_cuda_ctx.stream;
    bool d = y->dtype == NA_DTYPE_F64 || gx->dtype == NA_DTYPE_F64;
#define LAUNCH_SMB(C, L)                                                                      \
    k_softmax_bwd<C, L><<<grid, block, 0, st>>>(y->data, y->dtype, gy->data, gy->dtype,       \
                                                gx->data, gx->dtype, rows, cols)
    if (d && log) LAUNCH_SMB(double, true);
    else if (d) LAUNCH_SMB(double, false);
    else if (log) LAUNCH_SMB(float, true);
    else LAUNCH_SMB(float, false);
#undef LAUNCH_SMB
    NA_CUDA_LAUNCH_CHECK("k_softmax_bwd");
    return NA_OK;
}

/* ---- cross-entropy ---------------------------------------------------------------------- */
template <typename C>
__global__ void k_cross_entropy(const void *x, int xdt, const int32_t *labels, void *loss,
                                int lossdt, void *lse, int lsedt, int64_t rows, int64_t cols,
                                C e) {
    __shared__ C sm[32];
    ROWS_LOOP(rows) {
        int64_t o = base_ + threadIdx.y;
        bool act = o < rows;
        const int64_t off = o * cols;
        C m = (C)-INFINITY;
        if (act)
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
                m = na_op_max()(m, na_ld<C>(x, xdt, off + j));
        m = na_row_reduce(m, na_op_max(), sm);
        C s = (C)0, sx = (C)0;
        if (act)
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
                C v = na_ld<C>(x, xdt, off + j);
                s += na_exp(v - m);
                sx += v;
            }
        s = na_row_reduce(s, na_op_sum(), sm);
        if (e != (C)0) sx = na_row_reduce(sx, na_op_sum(), sm);
        if (act && threadIdx.x == 0) {
            C l = m + na_log(s);
            int32_t lab = labels[o];
            C out;
            if (lab < 0 || (int64_t)lab >= cols) {
                out = l = (C)NAN;
            } else {
                C target = ((C)1 - e) * na_ld<C>(x, xdt, off + lab);
                if (e != (C)0) target += (e / (C)cols) * sx;
                out = l - target;
            }
            na_st(loss, lossdt, o, out);
            if (lse) na_st(lse, lsedt, o, l);
        }
    }
}

int na_cuda_cross_entropy(const na_view *logits, const na_view *labels, na_view *loss,
                          na_view *lse, double smoothing) {
    int64_t rows = logits->shape[0];
    int64_t cols = logits->ndim > 1 ? logits->numel / (rows ? rows : 1) : 1;
    if (rows == 0) return NA_OK;
    dim3 block;
    unsigned grid;
    row_geometry(rows, cols, &block, &grid);
    cudaStream_t st = na_cuda_ctx.stream;
    void *lp = lse ? lse->data : NULL;
    int ldt = lse ? (int)lse->dtype : 0;
    if (logits->dtype == NA_DTYPE_F64)
        k_cross_entropy<double><<<grid, block, 0, st>>>(logits->data, logits->dtype,
                                                        (const int32_t *)labels->data, loss->data,
                                                        loss->dtype, lp, ldt, rows, cols, smoothing);
    else
        k_cross_entropy<float><<<grid, block, 0, st>>>(logits->data, logits->dtype,
                                                       (const int32_t *)labels->data, loss->data,
                                                       loss->dtype, lp, ldt, rows, cols,
                                                       (float)smoothing);
    NA_CUDA_LAUNCH_CHECK("k_cross_entropy");
    return NA_OK;
}

template <typename C>
__global__ void k_cross_entropy_bwd(const void *x, int xdt, const int32_t *labels,
                                    const void *lse, int lsedt, const void *g, int gdt, void *gx,
                                    int gxdt, int64_t cols, int64_t n, C e) {
    NA_GRID_STRIDE(k, n) {
        int64_t o = k / cols;
        int64_t c = k - o * cols;
        int32_t lab = labels[o];
        C v;
        if (lab < 0 || (int64_t)lab >= cols) {
            v = (C)NAN;
        } else {
            C p = na_exp(na_ld<C>(x, xdt, k) - na_ld<C>(lse, lsedt, o));
            C t = ((C)1 - e) * (c == (int64_t)lab ? (C)1 : (C)0) + e / (C)cols;
            v = na_ld<C>(g, gdt, o) * (p - t);
        }
        na_st(gx, gxdt, k, v);
    }
}

int na_cuda_cross_entropy_backward(const na_view *logits, const na_view *labels,
                                   const na_view *lse, const na_view *g, na_view *gx,
                                   double smoothing) {
    int64_t rows = logits->shape[0];
    int64_t n = logits->numel;
    if (n == 0) return NA_OK;
    int64_t cols = n / rows;
    unsigned grid = na_grid(n, NA_BLOCK);
    cudaStream_t st = na_cuda_ctx.stream;
    if (logits->dtype == NA_DTYPE_F64)
        k_cross_entropy_bwd<double><<<grid, NA_BLOCK, 0, st>>>(
            logits->data, logits->dtype, (const int32_t *)labels->data, lse->data, lse->dtype,
            g->data, g->dtype, gx->data, gx->dtype, cols, n, smoothing);
    else
        k_cross_entropy_bwd<float><<<grid, NA_BLOCK, 0, st>>>(
            logits->data, logits->dtype, (const int32_t *)labels->data, lse->data, lse->dtype,
            g->data, g->dtype, gx->data, gx->dtype, cols, n, (float)smoothing);
    NA_CUDA_LAUNCH_CHECK("k_cross_entropy_bwd");
    return NA_OK;
}
