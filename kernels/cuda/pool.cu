/* kernels/cuda/pool.cu — 2-d max and average pooling (NCHW), forward and backward.
 *
 * Forward: one thread per output element walks its window. Max pooling keeps the first
 * maximum in window order (row by row; a NaN wins) and saves its flat index in the input
 * plane, ih * W + iw (as PyTorch's max_pool2d_with_indices; -1 for a window with no cell in
 * the input). Average pooling divides by the number of window cells inside the padded input
 * (count_include_pad) or inside the input — the CPU backend's rule.
 *
 * Backward gathers instead of scattering: one thread per input element sums the gradients
 * of the windows that contain it (max: only where the saved index is this element), in a
 * fixed order, so there are no atomics and the result is deterministic.
 */
#include "cuda_common.cuh"

struct pool_geom {
    int64_t c, h, w, oh, ow;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    bool include_pad;
};

static pool_geom pool_geom_of(const na_conv_geom *g) {
    pool_geom p;
    p.c = g->c_in;
    p.h = g->h;
    p.w = g->w;
    p.oh = g->oh;
    p.ow = g->ow;
    p.kh = g->kh;
    p.kw = g->kw;
    p.sh = g->sh > 0 ? g->sh : 1;
    p.sw = g->sw > 0 ? g->sw : 1;
    p.ph = g->ph;
    p.pw = g->pw;
    p.dh = g->dh > 0 ? g->dh : 1;
    p.dw = g->dw > 0 ? g->dw : 1;
    p.include_pad = g->count_include_pad;
    return p;
}

template <typename C>
__global__ void k_max_pool(const void *x, int xdt, void *y, int ydt, int32_t *idx, pool_geom p,
                           int64_t total) {
    NA_GRID_STRIDE(e, total) {
        int64_t ox = e % p.ow;
        int64_t t = e / p.ow;
        int64_t oy = t % p.oh;
        int64_t plane = t / p.oh; /* n * c + c */
        const int64_t base = plane * p.h * p.w;
        C best = (C)-INFINITY;
        int64_t bi = INT64_MAX;
        for (int ky = 0; ky < p.kh; ky++) {
            int64_t ih = oy * p.sh - p.ph + (int64_t)ky * p.dh;
            if (ih < 0 || ih >= p.h) continue;
            for (int kx = 0; kx < p.kw; kx++) {
                int64_t iw = ox * p.sw - p.pw + (int64_t)kx * p.dw;
                if (iw < 0 || iw >= p.w) continue;
                int64_t j = ih * p.w + iw;
                C v = na_ld<C>(x, xdt, base + j);
                if (na_better(v, j, best, bi)) {
                    best = v;
                    bi = j;
                }
            }
        }
        na_st(y, ydt, e, best);
        if (idx) idx[e] = bi == INT64_MAX ? -1 : (int32_t)bi;
    }
}

/* divisor of output (oy, ox): window cells inside the padded input (count_include_pad) or
 * inside the input (as the CPU backend) */
static __device__ __forceinline__ int avg_divisor(const pool_geom &p, int64_t oy, int64_t ox) {
    int64_t ylo = p.include_pad ? -p.ph : 0, yhi = p.include_pad ? p.h + p.ph : p.h;
    int64_t xlo = p.include_pad ? -p.pw : 0, xhi = p.include_pad ? p.w + p.pw : p.w;
    int ch = 0, cw = 0;
    for (int ky = 0; ky < p.kh; ky++) {
        int64_t ih = oy * p.sh - p.ph + (int64_t)ky * p.dh;
        ch += (ih >= ylo && ih < yhi);
    }
    for (int kx = 0; kx < p.kw; kx++) {
        int64_t iw = ox * p.sw - p.pw + (int64_t)kx * p.dw;
        cw += (iw >= xlo && iw < xhi);
    }
    return ch * cw;
}

template <typename C>
__global__ void k_avg_pool(const void *x, int xdt, void *y, int ydt, pool_geom p, int64_t total) {
    NA_GRID_STRIDE(e, total) {
        int64_t ox = e % p.ow;
        int64_t t = e / p.ow;
        int64_t oy = t % p.oh;
        int64_t plane = t / p.oh;
        const int64_t base = plane * p.h * p.w;
        C s = (C)0;
        for (int ky = 0; ky < p.kh; ky++) {
            int64_t ih = oy * p.sh - p.ph + (int64_t)ky * p.dh;
            if (ih < 0 || ih >= p.h) continue;
            for (int kx = 0; kx < p.kw; kx++) {
                int64_t iw = ox * p.sw - p.pw + (int64_t)kx * p.dw;
                if (iw < 0 || iw >= p.w) continue;
                s += na_ld<C>(x, xdt, base + ih * p.w + iw);
            }
        }
        int div = avg_divisor(p, oy, ox);
        na_st(y, ydt, e, div > 0 ? s / (C)div : (C)0);
    }
}

/* MAX: gy where idx says this element; else (avg) gy / divisor. One thread per input element. */
template <typename C, bool MAX>
__global__ void k_pool_bwd(const void *gy, int gydt, const int32_t *idx, void *gx, int gxdt,
                           pool_geom p, int64_t total) {
    NA_GRID_STRIDE(e, total) {
        int64_t iw = e % p.w;
        int64_t t = e / p.w;
        int64_t ih = t % p.h;
        int64_t plane = t / p.h;
        const int64_t obase = plane * p.oh * p.ow;
        const int32_t self = (int32_t)(ih * p.w + iw);
        C s = (C)0;
        for (int ky = 0; ky < p.kh; ky++) {
            int64_t ny = ih + p.ph - (int64_t)ky * p.dh; /* = oy * sh */
            if (ny < 0 || ny % p.sh) continue;
            int64_t oy = ny / p.sh;
            if (oy >= p.oh) continue;
            for (int kx = 0; kx < p.kw; kx++) {
                int64_t nx = iw + p.pw - (int64_t)kx * p.dw;
                if (nx < 0 || nx % p.sw) continue;
                int64_t ox = nx / p.sw;
                if (ox >= p.ow) continue;
                int64_t o = obase + oy * p.ow + ox;
                if (MAX) {
                    if (idx[o] == self) s += na_ld<C>(gy, gydt, o);
                } else {
                    int div = avg_divisor(p, oy, ox);
                    if (div > 0) s += na_ld<C>(gy, gydt, o) / (C)div;
                }
            }
        }
        na_st(gx, gxdt, e, s);
    }
}

int na_cuda_max_pool2d(const na_conv_geom *g, const na_view *x, na_view *y, na_view *idx) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.oh * p.ow;
    if (total == 0) return NA_OK;
    unsigned grid = na_grid(total, NA_BLOCK);
    int32_t *ip = idx ? (int32_t *)idx->data : NULL;
    if (x->dtype == NA_DTYPE_F64)
        k_max_pool<double><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x->data, x->dtype, y->data,
                                                                      y->dtype, ip, p, total);
    else
        k_max_pool<float><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x->data, x->dtype, y->data,
                                                                     y->dtype, ip, p, total);
    NA_CUDA_LAUNCH_CHECK("k_max_pool");
    return NA_OK;
}

int na_cuda_max_pool2d_backward(const na_conv_geom *g, const na_view *gy, const na_view *idx,
                                na_view *gx) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.h * p.w;
    if (total == 0) return NA_OK;
    unsigned grid = na_grid(total, NA_BLOCK);
    const int32_t *ip = (const int32_t *)idx->data;
    if (gx->dtype == NA_DTYPE_F64)
        k_pool_bwd<double, true><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, ip, gx->data, gx->dtype, p, total);
    else
        k_pool_bwd<float, true><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, ip, gx->data, gx->dtype, p, total);
    NA_CUDA_LAUNCH_CHECK("k_pool_bwd");
    return NA_OK;
}

int na_cuda_avg_pool2d(const na_conv_geom *g, const na_view *x, na_view *y) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.oh * p.ow;
    if (total == 0) return NA_OK;
    unsigned grid = na_grid(total, NA_BLOCK);
    if (x->dtype == NA_DTYPE_F64)
        k_avg_pool<double><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x->data, x->dtype, y->data,
                                                                      y->dtype, p, total);
    else
        k_avg_pool<float><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x->data, x->dtype, y->data,
                                                                     y->dtype, p, total);
    NA_CUDA_LAUNCH_CHECK("k_avg_pool");
    return NA_OK;
}

int na_cuda_avg_pool2d_backward(const na_conv_geom *g, const na_view *gy, na_view *gx) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.h * p.w;
    if (total == 0) return NA_OK;
    unsigned grid = na_grid(total, NA_BLOCK);
    if (gx->dtype == NA_DTYPE_F64)
        k_pool_bwd<double, false><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, NULL, gx->data, gx->dtype, p, total);
    else
        k_pool_bwd<float, false><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, NULL, gx->data, gx->dtype, p, total);
    NA_CUDA_LAUNCH_CHECK("k_pool_bwd");
    return NA_OK;
}
