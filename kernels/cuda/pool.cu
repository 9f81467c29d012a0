/* kernels/cuda/pool.cu — 2-d max and average pooling, forward and backward, on contiguous
 * NCHW views or channels-last ones (strides [C*H*W, 1, W*C, C]; the kernels take any strides).
 *
 * Forward: one thread per output element walks its window. Threads follow the memory order
 * of the views: ox fastest when they are all contiguous, c fastest otherwise (channels-last:
 * neighbouring threads read and write neighbouring channels, coalesced). Max pooling keeps the first
 * maximum in window order (row by row; a NaN wins) and saves its flat index in the input
 * plane, ih * W + iw (as PyTorch's max_pool2d_with_indices; -1 for a window with no cell in
 * the input). Average pooling divides by the number of window cells inside the padded input
 * (count_include_pad) or inside the input — the CPU backend's rule.
 *
 * Backward gathers instead of scattering: one thread per input element sums the gradients
 * of the windows that contain it (max: only where the saved index is this element), in a
 * fixed order, so there are no atomics and the result is deterministic.
 */
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_internal.h"

static bool pool2_on(void);
static bool is_pool2x2(const na_conv_geom *g);

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

/* Element strides of a 4-d view [N, C, H, W] (x, gx: input-shaped; y, gy, idx: output) */
struct pool_strides {
    int64_t n, c, h, w;
};
/* x (or gx), y (or gy) and idx */
struct pool_layout {
    pool_strides x, y, i;
};

static pool_strides pool_strides_of(const na_view *v) {
    pool_strides s = {v->stride[0], v->stride[1], v->stride[2], v->stride[3]};
    return s;
}

/* The layout of the call's views (idx may be NULL); *cl: not all contiguous, so the threads
 * go channels fastest. */
static pool_layout pool_layout_of(const na_view *x, const na_view *y, const na_view *idx,
                                  bool *cl) {
    pool_layout l;
    l.x = pool_strides_of(x);
    l.y = pool_strides_of(y);
    l.i = idx ? pool_strides_of(idx) : l.y;
    *cl = !na_cuda_is_contiguous(x) || !na_cuda_is_contiguous(y) ||
          (idx && !na_cuda_is_contiguous(idx));
    return l;
}

static __device__ __forceinline__ int64_t pool_off(const pool_strides &s, int64_t n, int64_t c,
                                                   int64_t y, int64_t x) {
    return n * s.n + c * s.c + y * s.h + x * s.w;
}

template <typename C, bool CL>
__global__ void k_max_pool(const void *x, int xdt, void *y, int ydt, int32_t *idx, pool_geom p,
                           pool_layout l, int64_t total) {
    NA_GRID_STRIDE(e, total) {
        const na_nchw_index o = na_nchw_at(e, p.c, p.oh, p.ow, CL);
        const int64_t oy = o.h, ox = o.w, base = pool_off(l.x, o.n, o.c, 0, 0);
        C best = (C)-INFINITY;
        int64_t bi = INT64_MAX;
        for (int ky = 0; ky < p.kh; ky++) {
            int64_t ih = oy * p.sh - p.ph + (int64_t)ky * p.dh;
            if (ih < 0 || ih >= p.h) continue;
            for (int kx = 0; kx < p.kw; kx++) {
                int64_t iw = ox * p.sw - p.pw + (int64_t)kx * p.dw;
                if (iw < 0 || iw >= p.w) continue;
                int64_t j = ih * p.w + iw;
                C v = na_ld<C>(x, xdt, base + ih * l.x.h + iw * l.x.w);
                if (na_better(v, j, best, bi)) {
                    best = v;
                    bi = j;
                }
            }
        }
        na_st(y, ydt, pool_off(l.y, o.n, o.c, oy, ox), best);
        if (idx) idx[pool_off(l.i, o.n, o.c, oy, ox)] = bi == INT64_MAX ? -1 : (int32_t)bi;
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

template <typename C, bool CL>
__global__ void k_avg_pool(const void *x, int xdt, void *y, int ydt, pool_geom p, pool_layout l,
                           int64_t total) {
    NA_GRID_STRIDE(e, total) {
        const na_nchw_index o = na_nchw_at(e, p.c, p.oh, p.ow, CL);
        const int64_t oy = o.h, ox = o.w, base = pool_off(l.x, o.n, o.c, 0, 0);
        C s = (C)0;
        for (int ky = 0; ky < p.kh; ky++) {
            int64_t ih = oy * p.sh - p.ph + (int64_t)ky * p.dh;
            if (ih < 0 || ih >= p.h) continue;
            for (int kx = 0; kx < p.kw; kx++) {
                int64_t iw = ox * p.sw - p.pw + (int64_t)kx * p.dw;
                if (iw < 0 || iw >= p.w) continue;
                s += na_ld<C>(x, xdt, base + ih * l.x.h + iw * l.x.w);
            }
        }
        int div = avg_divisor(p, oy, ox);
        na_st(y, ydt, pool_off(l.y, o.n, o.c, oy, ox), div > 0 ? s / (C)div : (C)0);
    }
}

/* MAX: gy where idx says this element; else (avg) gy / divisor. One thread per input element
 * (l.x: gx's strides, l.y: gy's). */
template <typename C, bool MAX, bool CL>
__global__ void k_pool_bwd(const void *gy, int gydt, const int32_t *idx, void *gx, int gxdt,
                           pool_geom p, pool_layout l, int64_t total) {
    NA_GRID_STRIDE(e, total) {
        const na_nchw_index a = na_nchw_at(e, p.c, p.h, p.w, CL);
        const int64_t ih = a.h, iw = a.w;
        const int64_t obase = pool_off(l.y, a.n, a.c, 0, 0), ibase = pool_off(l.i, a.n, a.c, 0, 0);
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
                int64_t o = obase + oy * l.y.h + ox * l.y.w;
                if (MAX) {
                    if (idx[ibase + oy * l.i.h + ox * l.i.w] == self) s += na_ld<C>(gy, gydt, o);
                } else {
                    int div = avg_divisor(p, oy, ox);
                    if (div > 0) s += na_ld<C>(gy, gydt, o) / (C)div;
                }
            }
        }
        na_st(gx, gxdt, pool_off(l.x, a.n, a.c, ih, iw), s);
    }
}

/* f(C{}, CL) with C the compute type of dt (double for f64, else float) and CL a
 * std::integral_constant<bool, cl> */
template <class F> static int pool_dispatch(na_dtype dt, bool cl, F &&f) {
    if (dt == NA_DTYPE_F64) return cl ? f(0.0, std::true_type{}) : f(0.0, std::false_type{});
    return cl ? f(0.0f, std::true_type{}) : f(0.0f, std::false_type{});
}

static int max_pool_generic(const na_conv_geom *g, const na_view *x, na_view *y, na_view *idx) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.oh * p.ow;
    if (total == 0) return NA_OK;
    bool cl;
    pool_layout l = pool_layout_of(x, y, idx, &cl);
    int32_t *ip = idx ? (int32_t *)idx->data : NULL;
    return pool_dispatch(x->dtype, cl, [&](auto c, auto clt) -> int {
        k_max_pool<decltype(c), clt.value><<<na_grid(total, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            x->data, x->dtype, y->data, y->dtype, ip, p, l, total);
        NA_CUDA_LAUNCH_CHECK("k_max_pool");
        return NA_OK;
    });
}

static int max_pool_backward_generic(const na_conv_geom *g, const na_view *gy,
                                     const na_view *idx, na_view *gx) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.h * p.w;
    if (total == 0) return NA_OK;
    bool cl;
    pool_layout l = pool_layout_of(gx, gy, idx, &cl);
    const int32_t *ip = (const int32_t *)idx->data;
    return pool_dispatch(gx->dtype, cl, [&](auto c, auto clt) -> int {
        k_pool_bwd<decltype(c), true, clt.value><<<na_grid(total, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, ip, gx->data, gx->dtype, p, l, total);
        NA_CUDA_LAUNCH_CHECK("k_pool_bwd");
        return NA_OK;
    });
}

int na_cuda_max_pool2d(const na_conv_geom *g, const na_view *x, na_view *y, na_view *idx) {
    if (pool2_on() && is_pool2x2(g)) return na_cuda_max_pool2x2(g, x, y, idx);
    return max_pool_generic(g, x, y, idx);
}

int na_cuda_max_pool2d_backward(const na_conv_geom *g, const na_view *gy, const na_view *idx,
                                na_view *gx) {
    if (pool2_on() && is_pool2x2(g)) return na_cuda_max_pool2x2_backward(g, gy, idx, gx);
    return max_pool_backward_generic(g, gy, idx, gx);
}

int na_cuda_avg_pool2d(const na_conv_geom *g, const na_view *x, na_view *y) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.oh * p.ow;
    if (total == 0) return NA_OK;
    bool cl;
    pool_layout l = pool_layout_of(x, y, NULL, &cl);
    return pool_dispatch(x->dtype, cl, [&](auto c, auto clt) -> int {
        k_avg_pool<decltype(c), clt.value><<<na_grid(total, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            x->data, x->dtype, y->data, y->dtype, p, l, total);
        NA_CUDA_LAUNCH_CHECK("k_avg_pool");
        return NA_OK;
    });
}

int na_cuda_avg_pool2d_backward(const na_conv_geom *g, const na_view *gy, na_view *gx) {
    pool_geom p = pool_geom_of(g);
    int64_t total = g->n * p.c * p.h * p.w;
    if (total == 0) return NA_OK;
    bool cl;
    pool_layout l = pool_layout_of(gx, gy, NULL, &cl);
    return pool_dispatch(gx->dtype, cl, [&](auto c, auto clt) -> int {
        k_pool_bwd<decltype(c), false, clt.value><<<na_grid(total, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            gy->data, gy->dtype, NULL, gx->data, gx->dtype, p, l, total);
        NA_CUDA_LAUNCH_CHECK("k_pool_bwd");
        return NA_OK;
    });
}

/* ==== 2x2 windows, stride 2 (NANOAMP_CUDA_POOL2=1) =======================================
 * The max pool of CNNs: windows 2x2, stride 2, no padding, dilation 1. Same values and
 * indices as the generic kernel and the CPU's 2x2 path (kernels/cpu/cpu_conv.c): the window
 * is read in row-major order (a, b / c, d), the first element starts, a later one replaces it
 * when larger or when it is a NaN and the best is not (the first NaN wins), and the index is
 * the flat ih * W + iw in the plane. A thread takes two neighbouring windows: 4 elements of
 * each input row in one load when W is a multiple of 4 and the rows are aligned (16 bytes
 * for f32, 8 for f16/bf16), else two windows from scalar loads; the index math is 32-bit
 * when the tensor allows. Backward: windows do not overlap, so each input element gets the
 * gradient of its one window where the saved index names it and 0 elsewhere (0 + gy, as the
 * CPU's zero-fill and add: a -0 gradient becomes +0 on both); rows and columns beyond the
 * last window get 0. No atomics, deterministic. Contiguous NCHW views only: channels-last
 * ones take the generic strided kernels (already coalesced, channels fastest). */
static bool pool2_on(void) {
    static int on = -1;
    if (on < 0) on = na_cuda_env_is("NANOAMP_CUDA_POOL2", NULL);
    return on == 1;
}

static bool is_pool2x2(const na_conv_geom *g) {
    return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 &&
           (g->dh <= 1) && (g->dw <= 1) && 2 * g->oh <= g->h && 2 * g->ow <= g->w &&
           g->h * g->w <= INT32_MAX;
}

struct pool2_geom {
    int64_t h, w, oh, ow, pairs; /* pairs: window pairs per output row, (ow + 1) / 2 */
    bool idx32;
};

/* (plane, oy, first ox) of window pair e */
static __device__ __forceinline__ void pool2_at(const pool2_geom &p, int64_t e, int64_t *plane,
                                                int64_t *oy, int64_t *ox) {
    int64_t q, t;
    if (p.idx32) {
        uint32_t u = (uint32_t)e, pr = (uint32_t)p.pairs, ohh = (uint32_t)p.oh;
        uint32_t r = u / pr;
        q = (int64_t)(u - r * pr);
        *oy = (int64_t)(r % ohh);
        *plane = (int64_t)(r / ohh);
    } else {
        t = e / p.pairs;
        q = e - t * p.pairs;
        *oy = t % p.oh;
        *plane = t / p.oh;
    }
    *ox = 2 * q;
}

template <typename C>
static __device__ __forceinline__ void pool2_take(C v, int32_t off, C &best, int32_t &bi) {
    if (v > best || (v != v && best == best)) {
        best = v;
        bi = off;
    }
}

template <int DT, bool VEC>
__global__ void k_max_pool2x2(const void *__restrict__ x, void *__restrict__ y,
                              int32_t *__restrict__ idx, pool2_geom p, int64_t total) {
    typedef typename na_hw<DT>::C C;
    typedef typename na_hw<DT>::S S;
    NA_GRID_STRIDE(e, total) {
        int64_t plane, oy, ox;
        pool2_at(p, e, &plane, &oy, &ox);
        const int64_t r0 = (plane * p.h + 2 * oy) * p.w + 2 * ox, r1 = r0 + p.w;
        const int n = ox + 1 < p.ow ? 2 : 1; /* windows of this pair */
        C a[4], b[4];
        if (VEC) {
            na_vld<DT, 4>(x, r0, a);
            na_vld<DT, 4>(x, r1, b);
        } else {
            const S *xs = (const S *)x;
#pragma unroll
            for (int i = 0; i < 4; i++) { /* fixed indices keep a, b in registers */
                const bool in = i < 2 * n;
                a[i] = in ? na_hw<DT>::in(xs[r0 + i]) : (C)0;
                b[i] = in ? na_hw<DT>::in(xs[r1 + i]) : (C)0;
            }
        }
        const int32_t w = (int32_t)p.w, at = (int32_t)(2 * oy * p.w + 2 * ox);
        const int64_t o = (plane * p.oh + oy) * p.ow + ox;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (k >= n) break;
            C best = a[2 * k];
            int32_t bi = 0;
            pool2_take(a[2 * k + 1], 1, best, bi);
            pool2_take(b[2 * k], w, best, bi);
            pool2_take(b[2 * k + 1], w + 1, best, bi);
            ((S *)y)[o + k] = na_hw<DT>::out(best);
            if (idx) idx[o + k] = at + 2 * k + bi;
        }
    }
}

template <int DT>
__global__ void k_max_pool2x2_bwd(const void *__restrict__ gy, const int32_t *__restrict__ idx,
                                  void *__restrict__ gx, pool2_geom p, int64_t total) {
    typedef typename na_hw<DT>::C C;
    typedef typename na_hw<DT>::S S;
    NA_GRID_STRIDE(e, total) {
        int64_t plane, oy, ox;
        pool2_at(p, e, &plane, &oy, &ox);
        const int64_t r0 = (plane * p.h + 2 * oy) * p.w + 2 * ox;
        const int32_t at = (int32_t)(2 * oy * p.w + 2 * ox);
        const int n = ox + 1 < p.ow ? 2 : 1;
        for (int k = 0; k < n; k++) {
            const int64_t o = (plane * p.oh + oy) * p.ow + ox + k;
            const int32_t sel = idx[o] - (at + 2 * k); /* 0, 1, w or w + 1 */
            const C g = (C)0 + na_hw<DT>::in(((const S *)gy)[o]);
            for (int r = 0; r < 2; r++)
                for (int c = 0; c < 2; c++)
                    ((S *)gx)[r0 + r * p.w + 2 * k + c] =
                        na_hw<DT>::out(sel == r * (int32_t)p.w + c ? g : (C)0);
        }
    }
}

/* gx = 0 on the rows and columns no window covers (odd H or W) */
template <int DT>
__global__ void k_pool2x2_bwd_edges(void *__restrict__ gx, pool2_geom p, int64_t total) {
    typedef typename na_hw<DT>::S S;
    NA_GRID_STRIDE(e, total) {
        int64_t iw = e % p.w, ih = (e / p.w) % p.h;
        if (ih >= 2 * p.oh || iw >= 2 * p.ow) ((S *)gx)[e] = na_hw<DT>::out(0);
    }
}

static pool2_geom pool2_geom_of(const na_conv_geom *g, int64_t *total) {
    pool2_geom p;
    p.h = g->h;
    p.w = g->w;
    p.oh = g->oh;
    p.ow = g->ow;
    p.pairs = (g->ow + 1) / 2;
    *total = g->n * g->c_in * p.oh * p.pairs;
    p.idx32 = *total < ((int64_t)1 << 32);
    return p;
}

static int pool2_check(const na_conv_geom *g, const char *who) {
    if (is_pool2x2(g)) return NA_OK;
    return na_set_error(NA_EINVAL, "%s (cuda): not a 2x2 stride-2 window without padding or "
                        "dilation (kernel %dx%d, stride %d,%d, padding %d,%d, dilation %d,%d)",
                        who, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw);
}

extern "C" int na_cuda_max_pool2x2(const na_conv_geom *g, const na_view *x, na_view *y,
                                   na_view *idx) {
    NA_TRY(pool2_check(g, "max_pool2x2"));
    bool cl;
    (void)pool_layout_of(x, y, idx, &cl);
    if (cl) return max_pool_generic(g, x, y, idx); /* channels-last: the strided kernel */
    int64_t total;
    pool2_geom p = pool2_geom_of(g, &total);
    if (total == 0) return NA_OK;
    /* whole 4-element loads: W % 4 == 0 (so OW = W/2 is even) and an aligned base */
    const size_t es = na_dtype_size(x->dtype);
    const bool vec = p.w % 4 == 0 && 2 * p.ow == p.w && ((uintptr_t)x->data % (4 * es)) == 0;
    int32_t *ip = idx ? (int32_t *)idx->data : NULL;
    unsigned grid = na_grid(total, NA_BLOCK);
    return na_dispatch_float(x->dtype, "max_pool2x2", [&](auto tag) -> int {
        constexpr int DT = decltype(tag)::dtype;
        if (vec) k_max_pool2x2<DT, true><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x->data, y->data, ip, p, total);
        else k_max_pool2x2<DT, false><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x->data, y->data, ip, p, total);
        NA_CUDA_LAUNCH_CHECK("k_max_pool2x2");
        return NA_OK;
    });
}

extern "C" int na_cuda_max_pool2x2_backward(const na_conv_geom *g, const na_view *gy,
                                            const na_view *idx, na_view *gx) {
    NA_TRY(pool2_check(g, "max_pool2x2_backward"));
    bool cl;
    (void)pool_layout_of(gx, gy, idx, &cl);
    if (cl) return max_pool_backward_generic(g, gy, idx, gx);
    int64_t total;
    pool2_geom p = pool2_geom_of(g, &total);
    const int64_t numel = g->n * g->c_in * p.h * p.w;
    if (numel == 0) return NA_OK;
    return na_dispatch_float(gx->dtype, "max_pool2x2_backward", [&](auto tag) -> int {
        constexpr int DT = decltype(tag)::dtype;
        if (total > 0) {
            k_max_pool2x2_bwd<DT><<<na_grid(total, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
                gy->data, (const int32_t *)idx->data, gx->data, p, total);
            NA_CUDA_LAUNCH_CHECK("k_max_pool2x2_bwd");
        }
        if (2 * p.oh < p.h || 2 * p.ow < p.w) {
            k_pool2x2_bwd_edges<DT><<<na_grid(numel, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
                gx->data, p, numel);
            NA_CUDA_LAUNCH_CHECK("k_pool2x2_bwd_edges");
        }
        return NA_OK;
    });
}
