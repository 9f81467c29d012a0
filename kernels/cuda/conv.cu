/* kernels/cuda/conv.cu — 2-d convolution (cross-correlation, groups, stride, padding,
 * dilation): forward, backward data, backward weight.
 *
 * Layouts: x, y (gx, gy) and w (gw) all contiguous NCHW / [K, C/g, R, S], or all channels-last
 * (x, y: N, H, W, C memory; w: K, R, S, C/g) — na_conv_layout_of (conv_graph_host.c) tells
 * which, and anything else is refused with the views' shapes and strides. Every path below
 * (both cuDNN APIs and the im2col fallback) serves both layouts; bias is added per channel in
 * y's layout.
 *
 * With cuDNN (NA_HAVE_CUDNN): the legacy convolution API. Per problem (geometry, dtype,
 * layout, math mode, determinism, find) a bounded table keeps the descriptors, built once,
 * and the algorithm of each kind of call, chosen once with cudnnGet*Algorithm_v7 or, with
 * NANOAMP_CUDNN_FIND=1, by timing with cudnnFind*AlgorithmEx; freed by
 * na_cuda_conv_cache_release (at process exit).
 * Math: f16/bf16 with f32 compute and tensor cores; f32 with FMA math (no TF32) unless TF32
 * is enabled (na_cuda_set_tf32); f64 in f64. For f32/f64, FFT and Winograd algorithms are
 * skipped (their error is larger than the parity tolerance of f32). With
 * NANOAMP_DETERMINISTIC=1 only algorithms cuDNN reports as deterministic are taken.
 * Workspaces come from the backend's scratch buffer.
 * NANOAMP_CUDNN_GRAPH=1: f32/f16/bf16 convolutions go through cuDNN's graph API first
 * (conv_graph.cu, its own plan cache); a problem it does not serve comes back here.
 * conv2d_stats (y and its per-channel sums) runs only through the graph API (conv + GenStats,
 * whatever NANOAMP_CUDNN_GRAPH says) or not at all (*done = false).
 *
 * Without cuDNN, when cuDNN offers no algorithm, or with NANOAMP_CONV_IM2COL=1 (for tests):
 * im2col + gemm. Per group and per chunk of images, the patches of x are unfolded into a
 * column buffer [K = C_in/g*kh*kw, OH*OW] and multiplied with the weights; backward data
 * multiplies W^T with gy into an f32 column buffer and folds it back (col2im, a gather: no
 * atomics); backward weight accumulates gy @ col^T over the images in f32 and converts once.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda/conv_graph.h"

struct conv_dims {
    int64_t n, cin, h, w, cout, oh, ow;
    int kh, kw, sh, sw, ph, pw, dh, dw, groups;
    int64_t cin_g, cout_g, K, ohw; /* per group: input/output channels, patch size; OH*OW */
    bool nhwc; /* channels-last: x, y in N, H, W, C memory, w in K, R, S, C/g */
};

static conv_dims conv_dims_of(const na_conv_geom *g, na_conv_layout layout) {
    conv_dims d;
    d.nhwc = layout == NA_CONV_NHWC;
    d.n = g->n;
    d.cin = g->c_in;
    d.h = g->h;
    d.w = g->w;
    d.cout = g->c_out;
    d.oh = g->oh;
    d.ow = g->ow;
    d.kh = g->kh;
    d.kw = g->kw;
    d.sh = g->sh > 0 ? g->sh : 1;
    d.sw = g->sw > 0 ? g->sw : 1;
    d.ph = g->ph;
    d.pw = g->pw;
    d.dh = g->dh > 0 ? g->dh : 1;
    d.dw = g->dw > 0 ? g->dw : 1;
    d.groups = g->groups > 0 ? g->groups : 1;
    d.cin_g = d.cin / d.groups;
    d.cout_g = d.cout / d.groups;
    d.K = d.cin_g * d.kh * d.kw;
    d.ohw = d.oh * d.ow;
    return d;
}

/* ---- im2col / col2im ----------------------------------------------------------------------- */
/* Element offset of x[b][c][ih][iw] (also gx) in the problem's layout. */
static __device__ __forceinline__ int64_t conv_x_off(const conv_dims &d, int64_t b, int64_t c,
                                                     int64_t ih, int64_t iw) {
    return d.nhwc ? ((b * d.h + ih) * d.w + iw) * d.cin + c : ((b * d.cin + c) * d.h + ih) * d.w + iw;
}

/* Row kk of a column buffer in w's memory order: (ci, ky, kx) for NCHW, (ky, kx, ci) for
 * channels-last (KRSC), so that one output channel's weights are one contiguous row of K. */
static __device__ __forceinline__ int64_t conv_kk(const conv_dims &d, int64_t ci, int ky, int kx) {
    return d.nhwc ? ((int64_t)ky * d.kw + kx) * d.cin_g + ci : (ci * d.kh + ky) * d.kw + kx;
}

/* col[b][kk][p] = x[img0+b][grp*cin_g + ci][oy*sh - ph + ky*dh][ox*sw - pw + kx*dw] or 0 */
template <typename C>
__global__ void k_im2col(const void *x, int xdt, void *col, int cdt, conv_dims d, int64_t img0,
                         int grp, int64_t total) {
    NA_GRID_STRIDE(e, total) {
        int64_t p = e % d.ohw;
        int64_t t = e / d.ohw;
        int64_t kk = t % d.K;
        int64_t b = t / d.K;
        int64_t ci, r; /* kk = conv_kk(ci, r / kw, r % kw) */
        if (d.nhwc) {
            r = kk / d.cin_g;
            ci = kk - r * d.cin_g;
        } else {
            ci = kk / (d.kh * d.kw);
            r = kk - ci * (d.kh * d.kw);
        }
        int ky = (int)(r / d.kw), kx = (int)(r % d.kw);
        int64_t oy = p / d.ow, ox = p - (p / d.ow) * d.ow;
        int64_t ih = oy * d.sh - d.ph + (int64_t)ky * d.dh;
        int64_t iw = ox * d.sw - d.pw + (int64_t)kx * d.dw;
        C v = (C)0;
        if (ih >= 0 && ih < d.h && iw >= 0 && iw < d.w)
            v = na_ld<C>(x, xdt, conv_x_off(d, img0 + b, grp * d.cin_g + ci, ih, iw));
        na_st(col, cdt, e, v);
    }
}

/* gx[img0+b][grp*cin_g + ci][ih][iw] = sum of the column entries that read it; threads in
 * gx's memory order */
template <typename C>
__global__ void k_col2im(const void *col, int cdt, void *gx, int gxdt, conv_dims d, int64_t img0,
                         int grp, int64_t total) {
    NA_GRID_STRIDE(e, total) {
        const na_nchw_index at = na_nchw_at(e, d.cin_g, d.h, d.w, d.nhwc);
        const int64_t ci = at.c, ih = at.h, iw = at.w, b = at.n;
        C s = (C)0;
        for (int ky = 0; ky < d.kh; ky++) {
            int64_t ny = ih + d.ph - (int64_t)ky * d.dh;
            if (ny < 0 || ny % d.sh) continue;
            int64_t oy = ny / d.sh;
            if (oy >= d.oh) continue;
            for (int kx = 0; kx < d.kw; kx++) {
                int64_t nx = iw + d.pw - (int64_t)kx * d.dw;
                if (nx < 0 || nx % d.sw) continue;
                int64_t ox = nx / d.sw;
                if (ox >= d.ow) continue;
                int64_t kk = conv_kk(d, ci, ky, kx);
                s += na_ld<C>(col, cdt, (b * d.K + kk) * d.ohw + oy * d.ow + ox);
            }
        }
        na_st(gx, gxdt, conv_x_off(d, img0 + b, grp * d.cin_g + ci, ih, iw), s);
    }
}

static int im2col(const conv_dims &d, const void *x, na_dtype xdt, void *col, na_dtype cdt,
                  int64_t img0, int64_t nb, int grp) {
    int64_t total = nb * d.K * d.ohw;
    unsigned grid = na_grid(total, NA_BLOCK);
    if (xdt == NA_DTYPE_F64)
        k_im2col<double><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x, xdt, col, cdt, d, img0, grp, total);
    else
        k_im2col<float><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(x, xdt, col, cdt, d, img0, grp, total);
    NA_CUDA_LAUNCH_CHECK("k_im2col");
    return NA_OK;
}

static int col2im(const conv_dims &d, const void *col, na_dtype cdt, void *gx, na_dtype gxdt,
                  int64_t img0, int64_t nb, int grp) {
    int64_t total = nb * d.cin_g * d.h * d.w;
    unsigned grid = na_grid(total, NA_BLOCK);
    if (cdt == NA_DTYPE_F64)
        k_col2im<double><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(col, cdt, gx, gxdt, d, img0, grp, total);
    else
        k_col2im<float><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(col, cdt, gx, gxdt, d, img0, grp, total);
    NA_CUDA_LAUNCH_CHECK("k_col2im");
    return NA_OK;
}

/* images per chunk so that the column buffer stays under ~256 MiB */
static int64_t chunk_images(const conv_dims &d, size_t esize) {
    size_t per = (size_t)d.K * (size_t)d.ohw * esize;
    int64_t nb = per ? (int64_t)(((size_t)256 << 20) / per) : d.n;
    if (nb < 1) nb = 1;
    if (nb > d.n) nb = d.n;
    return nb;
}

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static na_dtype acc_dtype(na_dtype dt) { return dt == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32; }

/* y (or gy) of group grp from image img0 on, as the gemm operand Y_g[b] (cout_g x OHW):
 * offset, row stride, batch stride, and t: stored transposed (channels-last: OHW rows of
 * cout elements, of which the group's cout_g are a column block). */
struct conv_y_operand {
    int64_t off, ld, batch_stride;
    bool t;
};
static conv_y_operand y_operand(const conv_dims &d, int64_t img0, int grp) {
    conv_y_operand o;
    o.batch_stride = d.cout * d.ohw;
    o.t = d.nhwc;
    o.off = d.nhwc ? img0 * d.ohw * d.cout + grp * d.cout_g : (img0 * d.cout + grp * d.cout_g) * d.ohw;
    o.ld = d.nhwc ? d.cout : d.ohw;
    return o;
}

static int fallback_forward(const conv_dims &d, const na_view *x, const na_view *w,
                            na_view *y) {
    na_dtype dt = x->dtype;
    size_t es = na_dtype_size(dt);
    int64_t nb = chunk_images(d, es);
    char *col = (char *)na_cuda_scratch(align256((size_t)nb * d.K * d.ohw * es));
    if (!col) return na_last_status();
    for (int64_t img0 = 0; img0 < d.n; img0 += nb) {
        int64_t cnt = d.n - img0 < nb ? d.n - img0 : nb;
        for (int grp = 0; grp < d.groups; grp++) {
            NA_TRY(im2col(d, x->data, dt, col, dt, img0, cnt, grp));
            conv_y_operand yo = y_operand(d, img0, grp);
            const char *wg = (const char *)w->data + (size_t)grp * d.cout_g * d.K * es;
            na_gemm_args g; /* Y_g[b] = W_g @ col[b]; stored transposed: Y_g^T = col^T @ W_g^T */
            memset(&g, 0, sizeof g);
            g.dtype = dt;
            g.a = yo.t ? col : wg;
            g.b = yo.t ? wg : col;
            g.ta = g.tb = yo.t;
            g.c = (char *)y->data + (size_t)yo.off * es;
            g.m = yo.t ? d.ohw : d.cout_g;
            g.n = yo.t ? d.cout_g : d.ohw;
            g.k = d.K;
            g.lda = yo.t ? d.ohw : d.K;
            g.ldb = yo.t ? d.K : d.ohw;
            g.ldc = yo.ld;
            g.batch = cnt;
            g.stride_a = yo.t ? d.K * d.ohw : 0;
            g.stride_b = yo.t ? 0 : d.K * d.ohw;
            g.stride_c = yo.batch_stride;
            g.alpha = 1.0f;
            g.beta = 0.0f;
            NA_TRY(na_cuda_gemm_ex(&g, dt));
        }
    }
    return NA_OK;
}

static int fallback_backward_data(const conv_dims &d, const na_view *gy, const na_view *w,
                                  na_view *gx) {
    na_dtype dt = gy->dtype, ct = acc_dtype(dt);
    size_t es = na_dtype_size(dt), cs = na_dtype_size(ct);
    int64_t nb = chunk_images(d, cs);
    char *col = (char *)na_cuda_scratch(align256((size_t)nb * d.K * d.ohw * cs));
    if (!col) return na_last_status();
    for (int64_t img0 = 0; img0 < d.n; img0 += nb) {
        int64_t cnt = d.n - img0 < nb ? d.n - img0 : nb;
        for (int grp = 0; grp < d.groups; grp++) {
            conv_y_operand yo = y_operand(d, img0, grp);
            na_gemm_args g; /* col[b] (K x OHW) = W_g^T (K x cout_g) @ gy_g[b] */
            memset(&g, 0, sizeof g);
            g.dtype = dt;
            g.a = (const char *)w->data + (size_t)grp * d.cout_g * d.K * es;
            g.ta = true;
            g.b = (const char *)gy->data + (size_t)yo.off * es;
            g.tb = yo.t;
            g.c = col;
            g.m = d.K;
            g.n = d.ohw;
            g.k = d.cout_g;
            g.lda = d.K;
            g.ldb = yo.ld;
            g.ldc = d.ohw;
            g.batch = cnt;
            g.stride_a = 0;
            g.stride_b = yo.batch_stride;
            g.stride_c = d.K * d.ohw;
            g.alpha = 1.0f;
            g.beta = 0.0f;
            NA_TRY(na_cuda_gemm_ex(&g, ct));
            NA_TRY(col2im(d, col, ct, gx->data, gx->dtype, img0, cnt, grp));
        }
    }
    return NA_OK;
}

static int fallback_backward_weight(const conv_dims &d, const na_view *x, const na_view *gy,
                                    na_view *gw) {
    na_dtype dt = x->dtype, ct = acc_dtype(dt);
    size_t es = na_dtype_size(dt), cs = na_dtype_size(ct);
    int64_t nb = chunk_images(d, es);
    size_t col_bytes = align256((size_t)nb * d.K * d.ohw * es);
    size_t acc_bytes = align256((size_t)d.cout * d.K * cs);
    char *ws = (char *)na_cuda_scratch(col_bytes + acc_bytes);
    if (!ws) return na_last_status();
    char *col = ws, *acc = ws + col_bytes;
    NA_CUDA_CHECK(cudaMemsetAsync(acc, 0, (size_t)d.cout * d.K * cs, na_cuda_ctx.stream));
    for (int64_t img0 = 0; img0 < d.n; img0 += nb) {
        int64_t cnt = d.n - img0 < nb ? d.n - img0 : nb;
        for (int grp = 0; grp < d.groups; grp++) {
            NA_TRY(im2col(d, x->data, dt, col, dt, img0, cnt, grp));
            for (int64_t b = 0; b < cnt; b++) {
                conv_y_operand yo = y_operand(d, img0 + b, grp);
                na_gemm_args g; /* acc_g (cout_g x K) += gy_g[b] (cout_g x OHW) @ col[b]^T */
                memset(&g, 0, sizeof g);
                g.dtype = dt;
                g.a = (const char *)gy->data + (size_t)yo.off * es;
                g.ta = yo.t;
                g.b = col + (size_t)b * d.K * d.ohw * es;
                g.tb = true;
                g.c = acc + (size_t)grp * d.cout_g * d.K * cs;
                g.m = d.cout_g;
                g.n = d.K;
                g.k = d.ohw;
                g.lda = yo.ld;
                g.ldb = d.ohw;
                g.ldc = d.K;
                g.batch = 1;
                g.alpha = 1.0f;
                g.beta = 1.0f;
                NA_TRY(na_cuda_gemm_ex(&g, ct));
            }
        }
    }
    return na_cuda_convert(gw->data, gw->dtype, acc, ct, d.cout * d.K); /* acc: gw's memory order */
}

/* ---- cuDNN ----------------------------------------------------------------------------------- */
enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER, CONV_KINDS };
#if NA_HAVE_CUDNN
/* One problem: geometry, dtype, layout, math and determinism settings. */
struct dnn_key {
    int32_t dtype, layout, tf32, det, find;
    int64_t n, cin, h, w, cout, oh, ow;
    int32_t kh, kw, sh, sw, ph, pw, dh, dw, groups;
};
/* The algorithm chosen for one kind of call (forward, backward data, backward filter). */
struct dnn_choice {
    bool chosen, found; /* chosen: asked cuDNN; found: an algorithm qualified */
    int algo;
    cudnnMathType_t math;
    size_t ws;
};
/* A cached problem: its descriptors, built once, and the choice per kind. */
struct dnn_entry {
    bool used;
    dnn_key key;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnMathType_t conv_math; /* the math type the conv descriptor holds now */
    dnn_choice kind[CONV_KINDS];
};
/* Bounded: a direct-mapped table; a new problem that lands on a used slot evicts it (its
 * descriptors destroyed). A network has a few dozen distinct convolutions. */
#define DNN_CACHE 128
static dnn_entry dnn_cache[DNN_CACHE];

static cudnnDataType_t dnn_type(na_dtype dt) {
    switch (dt) {
    case NA_DTYPE_F16: return CUDNN_DATA_HALF;
    case NA_DTYPE_BF16: return CUDNN_DATA_BFLOAT16;
    case NA_DTYPE_F64: return CUDNN_DATA_DOUBLE;
    default: return CUDNN_DATA_FLOAT;
    }
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/* Destroys an entry's descriptors (every status checked; the first failure is reported). */
static int dnn_entry_release(dnn_entry *e) {
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS, s;
    if (e->x && (s = cudnnDestroyTensorDescriptor(e->x)) != CUDNN_STATUS_SUCCESS) st = s;
    if (e->y && (s = cudnnDestroyTensorDescriptor(e->y)) != CUDNN_STATUS_SUCCESS) st = s;
    if (e->w && (s = cudnnDestroyFilterDescriptor(e->w)) != CUDNN_STATUS_SUCCESS) st = s;
    if (e->conv && (s = cudnnDestroyConvolutionDescriptor(e->conv)) != CUDNN_STATUS_SUCCESS) st = s;
    memset(e, 0, sizeof *e);
    if (st != CUDNN_STATUS_SUCCESS)
        return na_set_error(NA_ECUDA, "conv2d (cuda): destroying a cached cuDNN descriptor failed: %s",
                            cudnnGetErrorString(st));
    return NA_OK;
}

extern "C" int na_cuda_conv_cache_release(void) {
    int rc = na_cuda_conv_graph_release();
    for (int i = 0; i < DNN_CACHE; i++)
        if (dnn_cache[i].used) {
            int r = dnn_entry_release(&dnn_cache[i]);
            if (r < 0 && rc == NA_OK) rc = r;
        }
    return rc;
}

/* A dense [N, C, H, W] tensor of the problem's layout, with its strides (size-1 dims get
 * the layout's strides too, whatever the view said: the memory is the same). */
static int dnn_tensor(cudnnTensorDescriptor_t desc, cudnnDataType_t t, const conv_dims &d,
                      int64_t c, int64_t h, int64_t w) {
    const int64_t dim[4] = {d.n, c, h, w};
    int64_t str[4];
    na_conv_layout_strides(d.nhwc ? NA_CONV_NHWC : NA_CONV_NCHW, dim, str);
    NA_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(desc, t, (int)d.n, (int)c, (int)h, (int)w,
                                                (int)str[0], (int)str[1], (int)str[2], (int)str[3]));
    return NA_OK;
}

/* < 0: error; 0: cuDNN can't describe this problem (use the fallback); 1: ready */
static int dnn_describe(const conv_dims &d, na_dtype dt, cudnnMathType_t math, dnn_entry *e) {
    if (!fits_int(d.n) || !fits_int(d.cin * d.h * d.w) || !fits_int(d.cout * d.oh * d.ow))
        return 0; /* every dim and stride an int */
    cudnnDataType_t t = dnn_type(dt);
    NA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->x));
    NA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->y));
    NA_CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->w));
    NA_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&e->conv));
    NA_TRY(dnn_tensor(e->x, t, d, d.cin, d.h, d.w));
    NA_TRY(dnn_tensor(e->y, t, d, d.cout, d.oh, d.ow));
    NA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(e->w, t, d.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                              (int)d.cout, (int)d.cin_g, d.kh, d.kw));
    NA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        e->conv, d.ph, d.pw, d.sh, d.sw, d.dh, d.dw, CUDNN_CROSS_CORRELATION,
        dt == NA_DTYPE_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    NA_CUDNN_CHECK(cudnnSetConvolutionGroupCount(e->conv, d.groups));
    NA_CUDNN_CHECK(cudnnSetConvolutionMathType(e->conv, math));
    e->conv_math = math;
    int on, oc, oh, ow;
    NA_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &on, &oc, &oh, &ow));
    if (on != d.n || oc != d.cout || oh != d.oh || ow != d.ow)
        return na_set_error(NA_ESHAPE,
                            "conv2d (cuda): output [%lld, %lld, %lld, %lld] does not follow from "
                            "the geometry (cuDNN computes [%d, %d, %d, %d])",
                            (long long)d.n, (long long)d.cout, (long long)d.oh, (long long)d.ow,
                            on, oc, oh, ow);
    return 1;
}

/* f32 math: FMA only (strict f32) unless TF32 is on. TF32 is CUDNN_TENSOR_OP_MATH on float
 * data; never CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, which may round f32 operands to f16. */
static cudnnMathType_t dnn_math(na_dtype dt) {
    if (dt == NA_DTYPE_F16 || dt == NA_DTYPE_BF16) return CUDNN_TENSOR_OP_MATH;
    if (dt == NA_DTYPE_F32) return na_cuda_ctx.tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    return CUDNN_DEFAULT_MATH;
}

static bool inaccurate_algo(int kind, int algo) {
    switch (kind) {
    case CONV_FWD:
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case CONV_BWD_DATA:
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    default:
        return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
    }
}

/* Does perf entry (algo, status, determinism, mathType, memory) qualify? */
template <typename P>
static bool perf_ok(const P &p, int kind, na_dtype dt, bool det) {
    if (p.status != CUDNN_STATUS_SUCCESS) return false;
    if (det && p.determinism != CUDNN_DETERMINISTIC) return false;
    if ((dt == NA_DTYPE_F32 || dt == NA_DTYPE_F64) && inaccurate_algo(kind, (int)p.algo)) return false;
    if (dt == NA_DTYPE_F32 && p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
    if (dt == NA_DTYPE_F32 && !na_cuda_ctx.tf32 && p.mathType != CUDNN_FMA_MATH &&
        p.mathType != CUDNN_DEFAULT_MATH)
        return false;
    if (p.memory > ((size_t)1 << 30)) return false;
    return true;
}

template <typename P> static void take_first_ok(const P *perf, int cnt, int kind, na_dtype dt,
                                                bool det, dnn_choice *c) {
    for (int i = 0; i < cnt && !c->found; i++)
        if (perf_ok(perf[i], kind, dt, det)) {
            c->found = true;
            c->algo = (int)perf[i].algo;
            c->math = perf[i].mathType;
            c->ws = perf[i].memory;
        }
}

static size_t dnn_hash(const dnn_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return (size_t)(h % DNN_CACHE);
}

/* NANOAMP_CUDNN_FIND=1 (read once): choose by timing (cudnnFind*AlgorithmEx, on the call's
 * own buffers, the first time a problem is seen: the warm-up steps) instead of cuDNN's
 * heuristic. Finding runs every candidate once and synchronizes; its workspace is the
 * backend's scratch buffer, grown to at least 64 MiB. */
#define DNN_FIND_WS ((size_t)64 << 20)

/* The cached entry of a problem: descriptors made on first use, evicting the slot's last
 * problem. *ok = false when cuDNN can't describe it. */
static int dnn_lookup(const conv_dims &d, na_dtype dt, dnn_entry **out, bool *ok) {
    dnn_key key;
    memset(&key, 0, sizeof key);
    key.dtype = dt;
    key.layout = d.nhwc ? NA_CONV_NHWC : NA_CONV_NCHW;
    key.tf32 = na_cuda_ctx.tf32;
    key.det = na_cuda_deterministic();
    key.find = na_cuda_cudnn_find();
    key.n = d.n; key.cin = d.cin; key.h = d.h; key.w = d.w;
    key.cout = d.cout; key.oh = d.oh; key.ow = d.ow;
    key.kh = d.kh; key.kw = d.kw; key.sh = d.sh; key.sw = d.sw;
    key.ph = d.ph; key.pw = d.pw; key.dh = d.dh; key.dw = d.dw; key.groups = d.groups;
    dnn_entry *e = &dnn_cache[dnn_hash(&key)];
    *out = e;
    *ok = true;
    if (e->used && memcmp(&e->key, &key, sizeof key) == 0) return NA_OK;
    if (e->used) NA_TRY(dnn_entry_release(e));
    int rc = dnn_describe(d, dt, dnn_math(dt), e);
    if (rc <= 0) {
        int r = dnn_entry_release(e); /* half-made descriptors */
        *ok = false;
        return rc < 0 ? rc : r;
    }
    e->used = true;
    e->key = key;
    return NA_OK;
}

/* The choice for `kind` of entry e; chosen on first use (heuristic, or timed with
 * NANOAMP_CUDNN_FIND=1 on the call's buffers x, w, y). */
static int dnn_choose(int kind, dnn_entry *e, na_dtype dt, const void *x, const void *w,
                      const void *y) {
    dnn_choice *c = &e->kind[kind];
    if (c->chosen) return NA_OK;
    c->chosen = true;
    c->found = false;
    const bool det = e->key.det;
    cudnnHandle_t h;
    NA_TRY(na_cuda_dnn(&h));
    void *ws = NULL;
    size_t wsb = 0;
    if (e->key.find) { /* cudnnFind* allocates, synchronizes and runs every algorithm */
        NA_TRY(na_cuda_capture_forbids("conv2d", "a new convolution is autotuned "
                                       "(NANOAMP_CUDNN_FIND=1: run warm-up steps before capture)"));
        wsb = na_cuda_ctx.scratch_size > DNN_FIND_WS ? na_cuda_ctx.scratch_size : DNN_FIND_WS;
        if (!(ws = na_cuda_scratch(wsb))) return na_last_status();
    }
    int cnt = 0;
    if (kind == CONV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        if (e->key.find)
            NA_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
                h, e->x, x, e->w, w, e->conv, e->y, (void *)y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                &cnt, perf, ws, wsb));
        else
            NA_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
                h, e->x, e->w, e->conv, e->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &cnt, perf));
        take_first_ok(perf, cnt, kind, dt, det, c);
    } else if (kind == CONV_BWD_DATA) { /* x: gx (out), y: gy */
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        if (e->key.find)
            NA_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
                h, e->w, w, e->y, y, e->conv, e->x, (void *)x,
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &cnt, perf, ws, wsb));
        else
            NA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                h, e->w, e->y, e->conv, e->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &cnt, perf));
        take_first_ok(perf, cnt, kind, dt, det, c);
    } else { /* w: gw (out) */
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        if (e->key.find)
            NA_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                h, e->x, x, e->y, y, e->conv, e->w, (void *)w,
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &cnt, perf, ws, wsb));
        else
            NA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                h, e->x, e->y, e->conv, e->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &cnt, perf));
        take_first_ok(perf, cnt, kind, dt, det, c);
    }
    if (c->found && dt == NA_DTYPE_F32 && !na_cuda_ctx.tf32) c->math = CUDNN_FMA_MATH;
    return NA_OK;
}

/* Runs one convolution through cuDNN; *done = false when cuDNN can't (use the fallback). */
static int dnn_run(int kind, const conv_dims &d, na_dtype dt, const void *x, const void *w,
                   void *y, bool *done) {
    *done = false;
    cudnnHandle_t h;
    NA_TRY(na_cuda_dnn(&h));
    dnn_entry *e = NULL;
    bool ok = false;
    NA_TRY(dnn_lookup(d, dt, &e, &ok));
    if (!ok) return NA_OK;
    NA_TRY(dnn_choose(kind, e, dt, x, w, y));
    dnn_choice *c = &e->kind[kind];
    if (!c->found) return NA_OK;
    if (e->conv_math != c->math) {
        NA_CUDNN_CHECK(cudnnSetConvolutionMathType(e->conv, c->math));
        e->conv_math = c->math;
    }
    void *ws = NULL;
    if (c->ws) {
        ws = na_cuda_scratch(c->ws);
        if (!ws) return na_last_status();
    }
    float af = 1.0f, bf = 0.0f;
    double ad = 1.0, bd = 0.0;
    const void *alpha = dt == NA_DTYPE_F64 ? (const void *)&ad : (const void *)&af;
    const void *beta = dt == NA_DTYPE_F64 ? (const void *)&bd : (const void *)&bf;
    cudnnStatus_t st;
    if (kind == CONV_FWD)
        st = cudnnConvolutionForward(h, alpha, e->x, x, e->w, w, e->conv,
                                     (cudnnConvolutionFwdAlgo_t)c->algo, ws, c->ws, beta, e->y, y);
    else if (kind == CONV_BWD_DATA) /* x: gx (out), y: gy (in) */
        st = cudnnConvolutionBackwardData(h, alpha, e->w, w, e->y, y, e->conv,
                                          (cudnnConvolutionBwdDataAlgo_t)c->algo, ws, c->ws,
                                          beta, e->x, (void *)x);
    else /* w: gw (out) */
        st = cudnnConvolutionBackwardFilter(h, alpha, e->x, x, e->y, y, e->conv,
                                            (cudnnConvolutionBwdFilterAlgo_t)c->algo, ws, c->ws,
                                            beta, e->w, (void *)w);
    /* the whole NOT_SUPPORTED kind (cuDNN 9's sub-codes: _SHAPE, _SHARED_MEMORY_INSUFFICIENT,
     * ...): remember, this problem takes the fallback */
    if (na_cudnn_status_kind(st, CUDNN_MAJOR) ==
        na_cudnn_status_kind(CUDNN_STATUS_NOT_SUPPORTED, CUDNN_MAJOR)) {
        c->found = false;
        return NA_OK;
    }
    if (st != CUDNN_STATUS_SUCCESS)
        return na_set_error(NA_ECUDA, "conv2d (cuda): cudnnConvolution%s failed: %s",
                            kind == CONV_FWD ? "Forward"
                                             : (kind == CONV_BWD_DATA ? "BackwardData" : "BackwardFilter"),
                            cudnnGetErrorString(st));
    *done = true;
    return NA_OK;
}
#else
extern "C" int na_cuda_conv_cache_release(void) { return NA_OK; }
#endif

/* cuDNN for one call (unless NANOAMP_CONV_IM2COL=1): the graph path when switched on and it
 * serves the problem, else the legacy calls. The views as the legacy path takes them: x, w, y
 * for forward, gx, w, gy for backward data, x, gw, gy for backward weight. *done = false:
 * neither served it (the im2col fallback runs). */
#if NA_HAVE_CUDNN
static int cudnn_run(int kind, const conv_dims &d, const na_conv_geom *g, const na_view *xv,
                     const na_view *wv, const na_view *yv, bool *done) {
    *done = false;
    if (na_cuda_env_is("NANOAMP_CONV_IM2COL", NULL)) return NA_OK;
    if (na_cuda_conv_graph_enabled()) {
        static const na_cg_kind graph_kind[CONV_KINDS] = {NA_CG_FWD, NA_CG_BWD_DATA, NA_CG_BWD_FILTER};
        NA_TRY(na_cuda_conv_graph_run(graph_kind[kind], g, xv, wv, yv, done));
        if (*done) return NA_OK;
    }
    na_dtype dt = kind == CONV_BWD_DATA ? yv->dtype : xv->dtype; /* the one conv_problem checked */
    return dnn_run(kind, d, dt, xv->data, wv->data, yv->data, done);
}
#else
static int cudnn_run(int, const conv_dims &, const na_conv_geom *, const na_view *,
                     const na_view *, const na_view *, bool *done) {
    *done = false;
    return NA_OK;
}
#endif

/* The dims of one call (x, w, y as cudnn_run takes them; `kind` names them), after the checks
 * every path needs: a float dtype, channels divisible by the groups, one layout. */
static int conv_problem(const na_conv_geom *g, na_cg_kind kind, const na_view *x,
                        const na_view *w, const na_view *y, na_dtype dt, const char *who,
                        conv_dims *d) {
    if (!na_dtype_is_float(dt))
        return na_set_error(NA_EDTYPE, "%s (cuda): unsupported dtype %s", who, na_dtype_name(dt));
    na_conv_layout layout;
    NA_TRY(na_conv_layout_of(kind, x, w, y, &layout, who));
    *d = conv_dims_of(g, layout);
    if (d->cin % d->groups || d->cout % d->groups)
        return na_set_error(NA_EINVAL, "%s (cuda): %lld input / %lld output channels are not "
                            "divisible by %d groups", who, (long long)d->cin, (long long)d->cout,
                            d->groups);
    return NA_OK;
}

int na_cuda_conv2d(const na_conv_geom *g, const na_view *x, const na_view *w,
                   const na_view *bias, na_view *y) {
    conv_dims d;
    NA_TRY(conv_problem(g, NA_CG_FWD, x, w, y, x->dtype, "conv2d", &d));
    if (d.n * d.cout * d.ohw == 0) return NA_OK;
    bool done = false;
    if (d.K > 0) NA_TRY(cudnn_run(CONV_FWD, d, g, x, w, y, &done));
    if (!done) {
        if (d.K == 0) NA_TRY(na_cuda_fill(y, 0.0));
        else NA_TRY(fallback_forward(d, x, w, y));
    }
    if (bias) { /* y as [outer, channels, inner]: channels-last is [N*OH*OW, cout, 1] */
        int64_t outer = d.nhwc ? d.n * d.ohw : d.n, inner = d.nhwc ? 1 : d.ohw;
        NA_TRY(na_cuda_add_bias(y->data, y->dtype, bias->data, bias->dtype, outer, d.cout, inner, false));
    }
    return NA_OK;
}

/* conv2d with each output channel's sum and sum of squares from the same cuDNN graph (conv +
 * GenStats, conv_graph.cu): bias NULL, f32/f16/bf16, either layout as conv2d (the graph path
 * turns away what cuDNN documents no engine for: na_cg_stats_rejects). f32 follows the graph
 * path's math rules (strict f32 unless TF32 is on). *done = false otherwise, or under
 * NANOAMP_CONV_IM2COL=1 (no cuDNN): the caller runs conv2d and its BatchNorm apart. */
int na_cuda_conv2d_stats(const na_conv_geom *g, const na_view *x, const na_view *w,
                         const na_view *bias, na_view *y, na_view *sum, na_view *sqsum,
                         bool *done) {
    *done = false;
    na_dtype dt = x->dtype;
    if (bias || (dt != NA_DTYPE_F32 && dt != NA_DTYPE_F16 && dt != NA_DTYPE_BF16)) return NA_OK;
    conv_dims d = conv_dims(); /* zeroed: gcc does not follow NA_TRY's early return */
    NA_TRY(conv_problem(g, NA_CG_FWD_STATS, x, w, y, dt, "conv2d_stats", &d));
    if (d.n * d.cout * d.ohw == 0 || d.K == 0 || na_cuda_env_is("NANOAMP_CONV_IM2COL", NULL))
        return NA_OK;
    return na_cuda_conv_graph_stats(g, x, w, y, sum, sqsum, done);
}

int na_cuda_conv2d_backward_data(const na_conv_geom *g, const na_view *gy, const na_view *w,
                                 na_view *gx) {
    conv_dims d;
    NA_TRY(conv_problem(g, NA_CG_BWD_DATA, gx, w, gy, gy->dtype, "conv2d_backward_data", &d));
    if (d.n * d.cin * d.h * d.w == 0) return NA_OK;
    if (d.ohw == 0 || d.cout == 0) return na_cuda_fill(gx, 0.0);
    bool done = false;
    NA_TRY(cudnn_run(CONV_BWD_DATA, d, g, gx, w, gy, &done));
    if (!done) NA_TRY(fallback_backward_data(d, gy, w, gx));
    return NA_OK;
}

int na_cuda_conv2d_backward_weight(const na_conv_geom *g, const na_view *x,
                                   const na_view *gy, na_view *gw) {
    conv_dims d;
    NA_TRY(conv_problem(g, NA_CG_BWD_FILTER, x, gw, gy, x->dtype, "conv2d_backward_weight", &d));
    if (d.cout * d.K == 0) return NA_OK;
    if (d.n * d.ohw == 0) return na_cuda_fill(gw, 0.0);
    bool done = false;
    NA_TRY(cudnn_run(CONV_BWD_FILTER, d, g, x, gw, gy, &done));
    if (!done) NA_TRY(fallback_backward_weight(d, x, gy, gw));
    return NA_OK;
}
