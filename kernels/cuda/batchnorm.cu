/* kernels/cuda/batchnorm.cu — batch norm over x [N, C, S] (S = H*W; 1 for BatchNorm1d).
 *
 * x and y share a float dtype (f16/bf16 allowed); gamma, beta, running and saved statistics
 * are f32 (f64 for f64 x); the math is f32 (f64). One block per channel, in fixed order:
 *   train:    mean = sum(x)/M, var = sum((x-mean)^2)/M (two passes: no cancellation),
 *             invstd = 1/sqrt(var + eps), y = (x - mean) * (invstd * gamma) + beta,
 *             running = (1-momentum)*running + momentum*stat with var*M/(M-1) (unbiased;
 *             var itself when M == 1), M = N*S.
 *   eval:     y = (x - running_mean) * (1/sqrt(running_var + eps) * gamma) + beta.
 *   backward: xhat = (x - mean)*invstd; ggamma = sum(gy*xhat), gbeta = sum(gy);
 *             train: gx = (gy - mean(gy) - xhat*mean(gy*xhat)) * (invstd * gamma);
 *             eval (mean/invstd are the running stats): gx = gy * (invstd * gamma).
 *   relu:     (BatchNorm + ReLU fused) y = relu(y) before the store; backward takes the fused
 *             output y and uses gy * relu'(y) wherever gy appears above.
 * These are the CPU backend's formulas, term for term (kernels/cpu/cpu_batchnorm.c).
 * gamma/beta NULL means affine off (1 and 0); ggamma/gbeta/gx NULL are not written.
 * Other kernels for the same math, behind switches read once (kernels/cuda/cuda_internal.h):
 * NANOAMP_CUDA_BN=v2 (many blocks per channel, Welford partials) and, for s == 1 (x is [M, C]
 * rows: BatchNorm1d and channels-last activations), NANOAMP_CUDA_BN_ROWS=1 (threads across
 * the channels, coalesced; common/bn_rows.h).
 */
#include <type_traits>

#include "common/bn_rows.h"
#include "common/bn_stats.h"
#include "common/elementwise.h"
#include "common/welford.h"
#include "cuda_common.cuh"
#include "cuda_internal.h"

/* NANOAMP_CUDA_BN=v2 (read once): the many-blocks-per-channel kernels below */
static bool bn_v2(void) {
    static int on = -1;
    if (on < 0) on = na_cuda_env_is("NANOAMP_CUDA_BN", "v2");
    return on == 1;
}

/* NANOAMP_CUDA_BN_ROWS=1 (read once): calls with s == 1 (x is [M, C] rows: BatchNorm1d and
 * channels-last activations) take the row kernels (na_cuda_bn_rows_*), whatever
 * NANOAMP_CUDA_BN says */
static bool bn_rows_for(int64_t s) {
    static int on = -1;
    if (on < 0) on = na_cuda_env_is("NANOAMP_CUDA_BN_ROWS", NULL);
    return on == 1 && s == 1;
}

struct bn_geom {
    int64_t n, c, s, m; /* m = n*s elements per channel */
};

static __device__ __forceinline__ int64_t bn_off(const bn_geom &g, int64_t ch, int64_t j) {
    int64_t i = j / g.s;
    return (i * g.c + ch) * g.s + (j - i * g.s);
}

/* ReLU and its gradient factor from the output, as the elementwise kernels compute them */
static __device__ __forceinline__ float bn_relu(float v) { return na_unary_f(NA_UNARY_RELU, v, 0, 0); }
static __device__ __forceinline__ double bn_relu(double v) { return na_unary_d(NA_UNARY_RELU, v, 0, 0); }
static __device__ __forceinline__ float bn_relu_grad(float y) { return na_unary_grad_f(NA_UNARY_RELU, y, y, 0, 0); }
static __device__ __forceinline__ double bn_relu_grad(double y) { return na_unary_grad_d(NA_UNARY_RELU, y, y, 0, 0); }
/* gy at o, times relu'(y) when the forward fused ReLU (ry, the forward's output, not NULL) */
template <typename C>
static __device__ __forceinline__ C bn_gy(const void *gy, int gydt, const void *ry, int rydt,
                                          int64_t o) {
    C g = na_ld<C>(gy, gydt, o);
    return ry ? g * bn_relu_grad(na_ld<C>(ry, rydt, o)) : g;
}

/* Every CUDA finalize (k_bn_train, k_bn2_finalize, k_bn_finalize) takes invstd and the
 * running statistics from common/bn_stats.h (its overloads by the compute type C), as the CPU
 * does. */
template <typename C>
__global__ void k_bn_train(const void *x, int xdt, const void *gamma, const void *beta, int pdt,
                           void *rmean, void *rvar, int rdt, void *y, int ydt, void *smean,
                           void *sinvstd, int sdt, bn_geom g, C momentum, C eps, bool relu) {
    __shared__ C sm[32];
    for (int64_t ch = blockIdx.x; ch < g.c; ch += gridDim.x) {
        C s = (C)0;
        for (int64_t j = threadIdx.x; j < g.m; j += blockDim.x) s += na_ld<C>(x, xdt, bn_off(g, ch, j));
        s = na_row_reduce(s, na_op_sum(), sm);
        const C mean = s / (C)g.m;
        C q = (C)0;
        for (int64_t j = threadIdx.x; j < g.m; j += blockDim.x) {
            C d = na_ld<C>(x, xdt, bn_off(g, ch, j)) - mean;
            q += d * d;
        }
        q = na_row_reduce(q, na_op_sum(), sm);
        const C var = q / (C)g.m;
        const C invstd = na_bn_invstd(var, eps);
        if (threadIdx.x == 0) {
            if (smean) na_st(smean, sdt, ch, mean);
            if (sinvstd) na_st(sinvstd, sdt, ch, invstd);
            if (rmean) na_st(rmean, rdt, ch, na_bn_running_mean(na_ld<C>(rmean, rdt, ch), mean, momentum));
            if (rvar) na_st(rvar, rdt, ch, na_bn_running_var(na_ld<C>(rvar, rdt, ch), var, g.m, momentum));
        }
        if (!y) continue; /* statistics only */
        const C scale = invstd * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
        const C shift = beta ? na_ld<C>(beta, pdt, ch) : (C)0;
        for (int64_t j = threadIdx.x; j < g.m; j += blockDim.x) {
            int64_t o = bn_off(g, ch, j);
            C v = (na_ld<C>(x, xdt, o) - mean) * scale + shift;
            na_st(y, ydt, o, relu ? bn_relu(v) : v);
        }
    }
}

template <typename C>
__global__ void k_bn_eval(const void *x, int xdt, const void *gamma, const void *beta, int pdt,
                          const void *rmean, const void *rvar, int rdt, void *y, int ydt,
                          int64_t c, int64_t s, int64_t total, C eps, bool relu) {
    NA_GRID_STRIDE(e, total) {
        int64_t ch = (e / s) % c;
        C rv = rvar ? na_ld<C>(rvar, rdt, ch) : (C)1;
        C rm = rmean ? na_ld<C>(rmean, rdt, ch) : (C)0;
        C scale = ((C)1 / na_sqrt(rv + eps)) * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
        C shift = beta ? na_ld<C>(beta, pdt, ch) : (C)0;
        C v = (na_ld<C>(x, xdt, e) - rm) * scale + shift;
        na_st(y, ydt, e, relu ? bn_relu(v) : v);
    }
}

template <typename C>
__global__ void k_bn_bwd(const void *x, int xdt, const void *gy, int gydt, const void *ry,
                         int rydt, const void *gamma,
                         int pdt, const void *mean, const void *invstd, int sdt, void *gx,
                         int gxdt, void *ggamma, void *gbeta, int gdt, bn_geom g, bool train) {
    __shared__ C sm[32];
    for (int64_t ch = blockIdx.x; ch < g.c; ch += gridDim.x) {
        const C mu = mean ? na_ld<C>(mean, sdt, ch) : (C)0;
        const C is = invstd ? na_ld<C>(invstd, sdt, ch) : (C)1;
        C sg = (C)0, sgx = (C)0;
        for (int64_t j = threadIdx.x; j < g.m; j += blockDim.x) {
            int64_t o = bn_off(g, ch, j);
            C gv = bn_gy<C>(gy, gydt, ry, rydt, o);
            sg += gv;
            sgx += gv * ((na_ld<C>(x, xdt, o) - mu) * is);
        }
        sg = na_row_reduce(sg, na_op_sum(), sm);
        sgx = na_row_reduce(sgx, na_op_sum(), sm);
        if (threadIdx.x == 0) {
            if (ggamma) na_st(ggamma, gdt, ch, sgx);
            if (gbeta) na_st(gbeta, gdt, ch, sg);
        }
        if (!gx) continue;
        const C scale = is * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
        const C mg = sg / (C)g.m, mgx = sgx / (C)g.m;
        for (int64_t j = threadIdx.x; j < g.m; j += blockDim.x) {
            int64_t o = bn_off(g, ch, j);
            C gv = bn_gy<C>(gy, gydt, ry, rydt, o);
            C v = train ? na_bn_grad(gv, na_ld<C>(x, xdt, o), mu, is, mg, mgx, scale) : gv * scale;
            na_st(gx, gxdt, o, v);
        }
    }
}

static unsigned bn_blocks(int64_t c) {
    int64_t cap = 65535;
    return (unsigned)(c < cap ? (c > 0 ? c : 1) : cap);
}

#define DT_OR0(t) ((t) ? (int)(t)->dtype : 0)
#define DATA_OR0(t) ((t) ? (t)->data : NULL)

int na_cuda_batch_norm_train(const na_view *x, const na_view *gamma, const na_view *beta,
                             na_view *running_mean, na_view *running_var, na_view *y,
                             na_view *save_mean, na_view *save_invstd, int64_t n, int64_t c,
                             int64_t s, double momentum, double eps, bool relu) {
    if (bn_v2() || bn_rows_for(s)) {
        na_cuda_bn_args a = {};
        a.x = x, a.gamma = gamma, a.beta = beta, a.y = y, a.running_mean = running_mean;
        a.running_var = running_var, a.save_mean = save_mean, a.save_invstd = save_invstd;
        a.n = n, a.c = c, a.s = s, a.momentum = momentum, a.eps = eps, a.train = true;
        a.relu = relu;
        return bn_rows_for(s) ? na_cuda_bn_rows_train(&a) : na_cuda_bn2_train(&a);
    }
    bn_geom g = {n, c, s, n * s};
    if (c == 0 || g.m == 0) return NA_OK;
    int tx = na_row_threads(g.m);
    int pdt = gamma ? (int)gamma->dtype : DT_OR0(beta);
    int rdt = running_mean ? (int)running_mean->dtype : DT_OR0(running_var);
    int sdt = save_mean ? (int)save_mean->dtype : DT_OR0(save_invstd);
#define LAUNCH_BN(C)                                                                          \
    k_bn_train<C><<<bn_blocks(c), tx, 0, na_cuda_ctx.stream>>>(                               \
        x->data, x->dtype, DATA_OR0(gamma), DATA_OR0(beta), pdt, DATA_OR0(running_mean),      \
        DATA_OR0(running_var), rdt, DATA_OR0(y), DT_OR0(y), DATA_OR0(save_mean),                   \
        DATA_OR0(save_invstd), sdt, g, (C)momentum, (C)eps, relu)
    if (x->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_train");
    return NA_OK;
}

int na_cuda_batch_norm_eval(const na_view *x, const na_view *gamma, const na_view *beta,
                            const na_view *running_mean, const na_view *running_var,
                            na_view *y, int64_t n, int64_t c, int64_t s, double eps,
                            bool relu) {
    if (bn_v2() || bn_rows_for(s)) { /* eval reads the running stats only; the struct's
                                       * fields serve training too */
        na_cuda_bn_args a = {};
        a.x = x, a.gamma = gamma, a.beta = beta, a.y = y;
        a.running_mean = (na_view *)running_mean, a.running_var = (na_view *)running_var;
        a.n = n, a.c = c, a.s = s, a.eps = eps, a.relu = relu;
        return bn_rows_for(s) ? na_cuda_bn_rows_eval(&a) : na_cuda_bn2_eval(&a);
    }
    int64_t total = n * c * s;
    if (total == 0) return NA_OK;
    int pdt = gamma ? (int)gamma->dtype : DT_OR0(beta);
    int rdt = running_mean ? (int)running_mean->dtype : DT_OR0(running_var);
    unsigned grid = na_grid(total, NA_BLOCK);
#define LAUNCH_BN(C)                                                                          \
    k_bn_eval<C><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(                                  \
        x->data, x->dtype, DATA_OR0(gamma), DATA_OR0(beta), pdt, DATA_OR0(running_mean),      \
        DATA_OR0(running_var), rdt, y->data, y->dtype, c, s, total, (C)eps, relu)
    if (x->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_eval");
    return NA_OK;
}

/* batch_norm_finalize: a thread per channel, the math of common/bn_stats.h; grid-stride, as
 * na_grid caps the blocks */
template <typename C>
__global__ void k_bn_finalize(const void *sum, const void *sqsum, int tdt, int64_t count,
                              void *rmean, void *rvar, int rdt, void *smean, void *svar,
                              void *sinvstd, int sdt, int64_t c, C momentum, C eps) {
    NA_GRID_STRIDE(ch, c) {
        C mean, var;
        na_bn_from_sums(na_ld<C>(sum, tdt, ch), na_ld<C>(sqsum, tdt, ch), count, &mean, &var);
        na_st(smean, sdt, ch, mean);
        na_st(svar, sdt, ch, var);
        na_st(sinvstd, sdt, ch, na_bn_invstd(var, eps));
        if (rmean)
            na_st(rmean, rdt, ch, na_bn_running_mean(na_ld<C>(rmean, rdt, ch), mean, momentum));
        if (rvar)
            na_st(rvar, rdt, ch,
                  na_bn_running_var(na_ld<C>(rvar, rdt, ch), var, count, momentum));
    }
}

int na_cuda_batch_norm_finalize(const na_view *sum, const na_view *sqsum, int64_t count,
                                na_view *running_mean, na_view *running_var, na_view *save_mean,
                                na_view *save_var, na_view *save_invstd, int64_t c,
                                double momentum, double eps) {
    if (count <= 0 || sum->numel != c || sqsum->numel != c || sum->dtype != sqsum->dtype ||
        save_mean->dtype != save_var->dtype || save_mean->dtype != save_invstd->dtype)
        return na_set_error(NA_EINVAL, "cuda_batch_norm_finalize: %lld values over %lld channels "
                            "(sum has %lld, sqsum %lld); the sums of one dtype, the saved "
                            "statistics of one dtype",
                            (long long)count, (long long)c, (long long)sum->numel,
                            (long long)sqsum->numel);
    if (c == 0) return NA_OK;
    int rdt = running_mean ? (int)running_mean->dtype : DT_OR0(running_var);
#define LAUNCH_BN(C)                                                                          \
    k_bn_finalize<C><<<na_grid(c, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(              \
        sum->data, sqsum->data, sum->dtype, count, DATA_OR0(running_mean),                    \
        DATA_OR0(running_var), rdt, save_mean->data, save_var->data, save_invstd->data,       \
        save_mean->dtype, c, (C)momentum, (C)eps)
    if (sum->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_finalize");
    return NA_OK;
}

int na_cuda_batch_norm_backward(const na_view *x, const na_view *gy, const na_view *gamma,
                                const na_view *mean, const na_view *invstd, na_view *gx,
                                na_view *ggamma, na_view *gbeta, int64_t n, int64_t c,
                                int64_t s, bool train, const na_view *relu_y) {
    if (bn_v2() || bn_rows_for(s)) {
        na_cuda_bn_args a = {};
        a.x = x, a.gy = gy, a.gamma = gamma, a.mean = mean, a.invstd = invstd;
        a.gx = gx, a.ggamma = ggamma, a.gbeta = gbeta;
        a.n = n, a.c = c, a.s = s, a.train = train;
        a.y = (na_view *)relu_y, a.relu = relu_y != NULL; /* backward only reads y */
        return bn_rows_for(s) ? na_cuda_bn_rows_backward(&a) : na_cuda_bn2_backward(&a);
    }
    bn_geom g = {n, c, s, n * s};
    if (c == 0) return NA_OK;
    if (g.m == 0) { /* no elements: the parameter gradients are zero */
        if (ggamma) NA_TRY(na_cuda_fill(ggamma, 0.0));
        if (gbeta) NA_TRY(na_cuda_fill(gbeta, 0.0));
        return NA_OK;
    }
    int tx = na_row_threads(g.m);
    int gdt = ggamma ? (int)ggamma->dtype : DT_OR0(gbeta);
    int sdt = mean ? (int)mean->dtype : DT_OR0(invstd);
#define LAUNCH_BN(C)                                                                          \
    k_bn_bwd<C><<<bn_blocks(c), tx, 0, na_cuda_ctx.stream>>>(                                 \
        x->data, x->dtype, gy->data, gy->dtype, DATA_OR0(relu_y), DT_OR0(relu_y),            \
        DATA_OR0(gamma), DT_OR0(gamma),                                                       \
        DATA_OR0(mean), DATA_OR0(invstd), sdt, DATA_OR0(gx), DT_OR0(gx), DATA_OR0(ggamma),    \
        DATA_OR0(gbeta), gdt, g, train)
    if (x->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_bwd");
    return NA_OK;
}

/* batch_norm_backward_elemt: the training gx from given sums over `count` values (SyncBatchNorm
 * passes the sums over all ranks), one thread per element in any layout (ch = (e / s) % c) */
template <typename C>
__global__ void k_bn_bwd_elemt(const void *x, int xdt, const void *gy, int gydt, const void *ry,
                               int rydt, const void *gamma, int pdt, const void *mean,
                               const void *invstd, int sdt, const void *sum_gy,
                               const void *sum_gyxhat, int tdt, C count, void *gx, int gxdt,
                               int64_t c, int64_t s, int64_t total) {
    NA_GRID_STRIDE(e, total) {
        int64_t ch = (e / s) % c;
        const C is = na_ld<C>(invstd, sdt, ch);
        const C scale = is * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
        const C mg = na_ld<C>(sum_gy, tdt, ch) / count, mgx = na_ld<C>(sum_gyxhat, tdt, ch) / count;
        C v = na_bn_grad(bn_gy<C>(gy, gydt, ry, rydt, e), na_ld<C>(x, xdt, e),
                         na_ld<C>(mean, sdt, ch), is, mg, mgx, scale);
        na_st(gx, gxdt, e, v);
    }
}

int na_cuda_batch_norm_backward_elemt(const na_view *x, const na_view *gy, const na_view *gamma,
                                      const na_view *mean, const na_view *invstd,
                                      const na_view *sum_gy, const na_view *sum_gyxhat,
                                      int64_t count, na_view *gx, int64_t n, int64_t c,
                                      int64_t s, const na_view *relu_y) {
    int64_t total = n * c * s;
    if (count <= 0 || sum_gy->dtype != sum_gyxhat->dtype || mean->dtype != invstd->dtype)
        return na_set_error(NA_EINVAL, "cuda_batch_norm_backward_elemt: %lld values per channel; "
                            "the sums of one dtype, mean and invstd of one", (long long)count);
    if (total == 0) return NA_OK;
    unsigned grid = na_grid(total, NA_BLOCK);
#define LAUNCH_BN(C)                                                                          \
    k_bn_bwd_elemt<C><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(                             \
        x->data, x->dtype, gy->data, gy->dtype, DATA_OR0(relu_y), DT_OR0(relu_y),            \
        DATA_OR0(gamma), DT_OR0(gamma), mean->data, invstd->data, mean->dtype, sum_gy->data, \
        sum_gyxhat->data, sum_gy->dtype, (C)count, gx->data, gx->dtype, c, s, total)
    if (x->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_bwd_elemt");
    return NA_OK;
}

/* batch_norm_relu_backward_x: not on CUDA (SyncBatchNorm passes the saved y to
 * batch_norm_backward and batch_norm_backward_elemt instead) */
int na_cuda_batch_norm_relu_backward_x(const na_view *, const na_view *, const na_view *,
                                       const na_view *, const na_view *, const na_view *, double,
                                       const na_view *, const na_view *, const na_view *, int64_t,
                                       na_view *, na_view *, na_view *, int64_t, int64_t, int64_t,
                                       bool *done) {
    *done = false;
    return NA_OK;
}

/* batch_norm_eval_rows: not on CUDA (SyncBatchNorm runs batch_norm_eval) */
int na_cuda_batch_norm_eval_rows(const na_view *, const na_view *, const na_view *,
                                 const na_view *, const na_view *, na_view *, int64_t, int64_t,
                                 int64_t, double, bool, bool *done) {
    *done = false;
    return NA_OK;
}

/* ==== v2 (NANOAMP_CUDA_BN=v2): many blocks per channel ===================================
 *
 * A channel (N rows of S contiguous elements) is cut into tiles of NA_BN_THREADS threads x
 * NA_BN_VPT vectors (common/welford.h); the grid is (tiles, channels), so a 64-channel layer
 * of ResNet-9 at batch 512 runs 64 x 128 blocks instead of 64. A vector is 16 bytes (4 f32,
 * 8 f16/bf16, 2 f64) when S is a multiple of it and every pointer is 16-byte aligned, else
 * one element (the same kernels, scalar loads). Each thread issues all its loads before it
 * uses any (NA_BN_VPT loads in flight), and indexes by one 32-bit division per vector.
 *
 *   train:    stats (per tile: Welford partials)  -> finalize (per channel, one warp: the
 *             fixed-order combination, mean/invstd, running stats, scale/shift)
 *             -> apply (y = (x - mean) * scale + shift, optional ReLU): two reads, one write;
 *   eval:     coefficients from the running stats -> apply;
 *   backward: sums (per tile: sum g, sum g*xhat with g = gy, or gy where y is not <= 0 with relu)
 *             -> finalize (ggamma, gbeta, the per-channel terms) -> apply (gx).
 * Every combination order is fixed (common/welford.h) and independent of the grid: results
 * are deterministic, with no atomics. The formulas are the CPU backend's (the v1 comment at
 * the top); f16/bf16 are converted by the hardware (cvt.rn), which gives the bits of
 * common/half.h for every non-NaN value (na_hw in cuda_common.cuh says why;
 * na_cuda_check_half_intrinsics checks it on the device). Partials and per-channel terms live in the backend's
 * scratch buffer. */
struct bn2_geom {
    int64_t c, s, m;     /* channels, row length, elements per channel (N*S) */
    int64_t sv, nvec;    /* vectors per row, per channel */
    int64_t tiles;       /* per channel (na_bn_tiles) */
    bool idx32;          /* nvec < 2^32: 32-bit index division */
};

/* element offset of vector k of channel ch (VW elements per vector) */
template <int VW>
static __device__ __forceinline__ int64_t bn2_off(const bn2_geom &g, int64_t ch, int64_t k) {
    int64_t row = g.idx32 ? (int64_t)((uint32_t)k / (uint32_t)g.sv) : k / g.sv;
    return (row * g.c + ch) * g.s + (k - row * g.sv) * VW;
}

/* Welford / sum2 partials of compute type C, and their warp shuffles */
template <typename C> struct bn2_ops;
template <> struct bn2_ops<float> {
    typedef na_welford_f W;
    typedef na_sum2_f P;
    static __device__ __forceinline__ W w_empty() { return na_welford_empty_f(); }
    static __device__ __forceinline__ W w_of(const float *v, int k) { return na_welford_of_f(v, k); }
    static __device__ __forceinline__ W w_of_upto(const float *v, int k) { return na_welford_of_upto_f(v, k); }
    static __device__ __forceinline__ W merge(W a, W b) { return na_welford_merge_f(a, b); }
    static __device__ __forceinline__ float fb(int64_t na, int64_t nb) { return na_welford_fb_f(na, nb); }
    static __device__ __forceinline__ W merge_fb(W a, W b, float f) { return na_welford_merge_fb_f(a, b, f); }
    static __device__ __forceinline__ P p_empty() { return na_sum2_empty_f(); }
    static __device__ __forceinline__ P merge(P a, P b) { return na_sum2_merge_f(a, b); }
};
template <> struct bn2_ops<double> {
    typedef na_welford_d W;
    typedef na_sum2_d P;
    static __device__ __forceinline__ W w_empty() { return na_welford_empty_d(); }
    static __device__ __forceinline__ W w_of(const double *v, int k) { return na_welford_of_d(v, k); }
    static __device__ __forceinline__ W w_of_upto(const double *v, int k) { return na_welford_of_upto_d(v, k); }
    static __device__ __forceinline__ W merge(W a, W b) { return na_welford_merge_d(a, b); }
    static __device__ __forceinline__ double fb(int64_t na, int64_t nb) { return na_welford_fb_d(na, nb); }
    static __device__ __forceinline__ W merge_fb(W a, W b, double f) { return na_welford_merge_fb_d(a, b, f); }
    static __device__ __forceinline__ P p_empty() { return na_sum2_empty_d(); }
    static __device__ __forceinline__ P merge(P a, P b) { return na_sum2_merge_d(a, b); }
};

template <typename W> static __device__ __forceinline__ W bn2_shfl_down_w(W w, int o) {
    w.n = __shfl_down_sync(0xffffffffu, w.n, o);
    w.mean = __shfl_down_sync(0xffffffffu, w.mean, o);
    w.m2 = __shfl_down_sync(0xffffffffu, w.m2, o);
    return w;
}
template <typename P> static __device__ __forceinline__ P bn2_shfl_down_p(P p, int o) {
    p.a = __shfl_down_sync(0xffffffffu, p.a, o);
    p.b = __shfl_down_sync(0xffffffffu, p.b, o);
    return p;
}
static __device__ __forceinline__ na_welford_f bn2_shfl(na_welford_f v, int o) { return bn2_shfl_down_w(v, o); }
static __device__ __forceinline__ na_welford_d bn2_shfl(na_welford_d v, int o) { return bn2_shfl_down_w(v, o); }
static __device__ __forceinline__ na_sum2_f bn2_shfl(na_sum2_f v, int o) { return bn2_shfl_down_p(v, o); }
static __device__ __forceinline__ na_sum2_d bn2_shfl(na_sum2_d v, int o) { return bn2_shfl_down_p(v, o); }

/* na_*_tree32 across the lanes of a warp: lane 0 ends with the tree's result */
template <typename C, typename T> static __device__ __forceinline__ T bn2_warp_tree(T v) {
#pragma unroll
    for (int o = NA_WELFORD_LANES / 2; o > 0; o >>= 1) v = bn2_ops<C>::merge(v, bn2_shfl(v, o));
    return v;
}

/* na_*_block over the block's threads: thread 0 ends with the result. `smem` holds 32. */
template <typename C, typename T>
static __device__ __forceinline__ T bn2_block(T v, T empty, T *smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = bn2_warp_tree<C>(v);
    __syncthreads(); /* smem may still be read by the previous tile */
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) v = bn2_warp_tree<C>(lane < (int)(blockDim.x >> 5) ? smem[lane] : empty);
    return v;
}

/* na_*_combine of the `count` partials at p (one warp; lane 0 ends with the result) */
template <typename C, typename T>
static __device__ __forceinline__ T bn2_warp_combine(const T *p, int64_t count, T empty) {
    T v = empty;
    for (int64_t k = threadIdx.x; k < count; k += NA_WELFORD_LANES) v = bn2_ops<C>::merge(v, p[k]);
    return bn2_warp_tree<C>(v);
}

#define BN2_CH_LOOP(ch) for (int64_t ch = blockIdx.y; ch < g.c; ch += gridDim.y)
#define BN2_TILE_LOOP(t) for (int64_t t = blockIdx.x; t < g.tiles; t += gridDim.x)

/* per-tile Welford partials of x: parts[ch * tiles + tile] */
template <int DT, int VW>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bn2_stats(const void *__restrict__ x, bn2_geom g,
            typename bn2_ops<typename na_hw<DT>::C>::W *__restrict__ parts) {
    typedef typename na_hw<DT>::C C;
    typedef bn2_ops<C> O;
    __shared__ typename O::W sm[32];
    BN2_CH_LOOP(ch) BN2_TILE_LOOP(t) {
        C v[NA_BN_VPT][VW];
        bool ok[NA_BN_VPT];
#pragma unroll
        for (int j = 0; j < NA_BN_VPT; j++) { /* every load first: NA_BN_VPT in flight */
            int64_t k = na_bn_tile_vec(t, j, threadIdx.x);
            ok[j] = k < g.nvec;
            if (ok[j]) na_vld<DT, VW>(x, bn2_off<VW>(g, ch, k), v[j]);
        }
        typename O::W acc = O::w_empty();
#pragma unroll
        for (int j = 0; j < NA_BN_VPT; j++)
            if (ok[j]) acc = O::merge(acc, O::w_of(v[j], VW));
        acc = bn2_block<C>(acc, O::w_empty(), sm);
        if (threadIdx.x == 0) parts[ch * g.tiles + t] = acc;
    }
}

/* coefficient layout per channel: [mean, scale, shift] forward; backward adds mg, mgx and
 * keeps invstd: [mean, scale, invstd, mg, mgx] */
#define BN2_NCOEF 5

/* one warp per channel: combine the partials, write the statistics and the coefficients */
template <typename C>
__global__ void k_bn2_finalize(const typename bn2_ops<C>::W *__restrict__ parts, bn2_geom g,
                               const void *gamma, const void *beta, int pdt, void *rmean,
                               void *rvar, int rdt, void *smean, void *sinvstd, int sdt,
                               C *__restrict__ coef, C momentum, C eps) {
    int64_t ch = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    if (ch >= g.c) return;
    typename bn2_ops<C>::W w =
        bn2_warp_combine<C>(parts + ch * g.tiles, g.tiles, bn2_ops<C>::w_empty());
    if (threadIdx.x != 0) return;
    const C mean = w.mean, var = w.m2 / (C)g.m;
    const C invstd = na_bn_invstd(var, eps);
    if (smean) na_st(smean, sdt, ch, mean);
    if (sinvstd) na_st(sinvstd, sdt, ch, invstd);
    if (rmean) na_st(rmean, rdt, ch, na_bn_running_mean(na_ld<C>(rmean, rdt, ch), mean, momentum));
    if (rvar) na_st(rvar, rdt, ch, na_bn_running_var(na_ld<C>(rvar, rdt, ch), var, g.m, momentum));
    coef[ch * BN2_NCOEF + 0] = mean;
    coef[ch * BN2_NCOEF + 1] = invstd * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
    coef[ch * BN2_NCOEF + 2] = beta ? na_ld<C>(beta, pdt, ch) : (C)0;
}

/* eval: the coefficients from the running statistics */
template <typename C>
__global__ void k_bn2_eval_coef(bn2_geom g, const void *gamma, const void *beta, int pdt,
                                const void *rmean, const void *rvar, int rdt,
                                C *__restrict__ coef, C eps) {
    NA_GRID_STRIDE(ch, g.c) {
        C rv = rvar ? na_ld<C>(rvar, rdt, ch) : (C)1;
        coef[ch * BN2_NCOEF + 0] = rmean ? na_ld<C>(rmean, rdt, ch) : (C)0;
        coef[ch * BN2_NCOEF + 1] =
            ((C)1 / na_sqrt(rv + eps)) * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
        coef[ch * BN2_NCOEF + 2] = beta ? na_ld<C>(beta, pdt, ch) : (C)0;
    }
}

/* y = (x - mean) * scale + shift (then relu) */
template <int DT, int VW, bool RELU>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bn2_apply(const void *__restrict__ x, void *__restrict__ y, bn2_geom g,
            const typename na_hw<DT>::C *__restrict__ coef) {
    typedef typename na_hw<DT>::C C;
    BN2_CH_LOOP(ch) {
        const C mean = coef[ch * BN2_NCOEF], scale = coef[ch * BN2_NCOEF + 1],
                shift = coef[ch * BN2_NCOEF + 2];
        BN2_TILE_LOOP(t) {
            C v[NA_BN_VPT][VW];
            int64_t off[NA_BN_VPT];
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                int64_t k = na_bn_tile_vec(t, j, threadIdx.x);
                off[j] = k < g.nvec ? bn2_off<VW>(g, ch, k) : -1;
                if (off[j] >= 0) na_vld<DT, VW>(x, off[j], v[j]);
            }
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                if (off[j] < 0) continue;
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    C r = (v[j][i] - mean) * scale + shift;
                    v[j][i] = RELU ? NA_RELU(C, r) : r;
                }
                na_vst<DT, VW>(y, off[j], v[j]);
            }
        }
    }
}

/* per-tile (sum g, sum g*xhat), g = gy (where y is not <= 0 with RELU) */
template <int DT, int VW, bool RELU>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bn2_bwd_sums(const void *__restrict__ x, const void *__restrict__ y,
               const void *__restrict__ gy, bn2_geom g, const void *mean, const void *invstd,
               int sdt, typename bn2_ops<typename na_hw<DT>::C>::P *__restrict__ parts) {
    typedef typename na_hw<DT>::C C;
    typedef bn2_ops<C> O;
    __shared__ typename O::P sm[32];
    BN2_CH_LOOP(ch) {
        const C mu = mean ? na_ld<C>(mean, sdt, ch) : (C)0;
        const C is = invstd ? na_ld<C>(invstd, sdt, ch) : (C)1;
        BN2_TILE_LOOP(t) {
            C xv[NA_BN_VPT][VW], gv[NA_BN_VPT][VW], yv[NA_BN_VPT][VW];
            bool ok[NA_BN_VPT];
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                int64_t k = na_bn_tile_vec(t, j, threadIdx.x);
                ok[j] = k < g.nvec;
                if (!ok[j]) continue;
                int64_t o = bn2_off<VW>(g, ch, k);
                na_vld<DT, VW>(x, o, xv[j]);
                na_vld<DT, VW>(gy, o, gv[j]);
                if (RELU) na_vld<DT, VW>(y, o, yv[j]);
            }
            typename O::P acc = O::p_empty();
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                if (!ok[j]) continue;
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    C gvi = RELU ? NA_RELU_PASS(C, yv[j][i], gv[j][i]) : gv[j][i];
                    acc.a += gvi;
                    acc.b += gvi * ((xv[j][i] - mu) * is);
                }
            }
            acc = bn2_block<C>(acc, O::p_empty(), sm);
            if (threadIdx.x == 0) parts[ch * g.tiles + t] = acc;
        }
    }
}

/* one warp per channel: ggamma = sum g*xhat, gbeta = sum g, and gx's coefficients */
template <typename C>
__global__ void k_bn2_bwd_finalize(const typename bn2_ops<C>::P *__restrict__ parts,
                                   bn2_geom g, const void *gamma, int pdt, const void *mean,
                                   const void *invstd, int sdt, void *ggamma, void *gbeta,
                                   int gdt, C *__restrict__ coef) {
    int64_t ch = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    if (ch >= g.c) return;
    typename bn2_ops<C>::P p =
        bn2_warp_combine<C>(parts + ch * g.tiles, g.tiles, bn2_ops<C>::p_empty());
    if (threadIdx.x != 0) return;
    if (ggamma) na_st(ggamma, gdt, ch, p.b);
    if (gbeta) na_st(gbeta, gdt, ch, p.a);
    const C is = invstd ? na_ld<C>(invstd, sdt, ch) : (C)1;
    coef[ch * BN2_NCOEF + 0] = mean ? na_ld<C>(mean, sdt, ch) : (C)0;
    coef[ch * BN2_NCOEF + 1] = is * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
    coef[ch * BN2_NCOEF + 2] = is;
    coef[ch * BN2_NCOEF + 3] = p.a / (C)g.m;
    coef[ch * BN2_NCOEF + 4] = p.b / (C)g.m;
}

/* train: gx = (g - mean(g) - xhat*mean(g*xhat)) * scale; eval: gx = g * scale */
template <int DT, int VW, bool RELU, bool TRAIN>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bn2_bwd_apply(const void *__restrict__ x, const void *__restrict__ y,
                const void *__restrict__ gy, void *__restrict__ gx, bn2_geom g,
                const typename na_hw<DT>::C *__restrict__ coef) {
    typedef typename na_hw<DT>::C C;
    BN2_CH_LOOP(ch) {
        const C *cf = coef + ch * BN2_NCOEF;
        const C mu = cf[0], scale = cf[1], is = cf[2], mg = cf[3], mgx = cf[4];
        BN2_TILE_LOOP(t) {
            C xv[NA_BN_VPT][VW], gv[NA_BN_VPT][VW], yv[NA_BN_VPT][VW];
            int64_t off[NA_BN_VPT];
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                int64_t k = na_bn_tile_vec(t, j, threadIdx.x);
                off[j] = k < g.nvec ? bn2_off<VW>(g, ch, k) : -1;
                if (off[j] < 0) continue;
                na_vld<DT, VW>(gy, off[j], gv[j]);
                if (TRAIN) na_vld<DT, VW>(x, off[j], xv[j]);
                if (RELU) na_vld<DT, VW>(y, off[j], yv[j]);
            }
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                if (off[j] < 0) continue;
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    C gvi = RELU ? NA_RELU_PASS(C, yv[j][i], gv[j][i]) : gv[j][i];
                    gv[j][i] = TRAIN ? (gvi - mg - ((xv[j][i] - mu) * is) * mgx) * scale
                                     : gvi * scale;
                }
                na_vst<DT, VW>(gx, off[j], gv[j]);
            }
        }
    }
}

/* ---- host side ---- */
static bool aligned16(const na_view *t) { return !t || ((uintptr_t)t->data & 15u) == 0; }

/* geometry for vectors of vw elements (1: scalar) */
static bn2_geom bn2_geom_of(int64_t n, int64_t c, int64_t s, int vw) {
    bn2_geom g;
    g.c = c;
    g.s = s;
    g.m = n * s;
    g.sv = s / vw;
    g.nvec = n * g.sv;
    g.tiles = na_bn_tiles(g.nvec);
    g.idx32 = g.nvec < ((int64_t)1 << 32);
    return g;
}

/* 16-byte vectors when S and every pointer allow them */
static int bn2_width(na_dtype dt, int64_t s, const na_view *a, const na_view *b,
                     const na_view *c, const na_view *d) {
    int vw = 16 / (int)na_dtype_size(dt);
    return s % vw == 0 && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d) ? vw : 1;
}

static dim3 bn2_grid(const bn2_geom &g) {
    int64_t gx = g.tiles < INT32_MAX ? g.tiles : INT32_MAX, gy = g.c < 65535 ? g.c : 65535;
    return dim3((unsigned)gx, (unsigned)gy);
}

static const dim3 bn2_warps(32, 8); /* finalize kernels: one warp per channel */
static unsigned bn2_warp_blocks(int64_t c) { return (unsigned)((c + 7) / 8); }

/* scratch: partials (c * tiles of `part` bytes), then coefficients */
static int bn2_scratch(const bn2_geom &g, size_t part, size_t csize, void **parts, void **coef) {
    size_t pb = ((size_t)(g.c * g.tiles) * part + 255) & ~(size_t)255;
    char *p = (char *)na_cuda_scratch(pb + (size_t)g.c * BN2_NCOEF * csize);
    if (!p) return na_last_status();
    *parts = p;
    *coef = p + pb;
    return NA_OK;
}

/* calls F with the dtype tag, the vector width (as a std::integral_constant) and relu */
template <int VW> struct bn2_vw { static const int value = VW; };
template <class F> static int bn2_dispatch(na_dtype dt, int vw, bool relu, const char *who, F &&f) {
    return na_dispatch_float(dt, who, [&](auto tag) -> int {
        constexpr int DT = decltype(tag)::dtype;
        constexpr int V = 16 / (int)sizeof(typename na_hw<DT>::S);
        if (vw == 1) return relu ? f(tag, bn2_vw<1>{}, std::true_type{}) : f(tag, bn2_vw<1>{}, std::false_type{});
        return relu ? f(tag, bn2_vw<V>{}, std::true_type{}) : f(tag, bn2_vw<V>{}, std::false_type{});
    });
}

/* The forward's per-channel coefficients, for v2's and the row kernels' apply passes: in
 * training from the statistics' partials (also writing the saved and running statistics),
 * in eval from the running statistics. */
template <typename C>
static int bn2_coefficients(const na_cuda_bn_args *a, bool train, const bn2_geom &g,
                            const typename bn2_ops<C>::W *parts, C *coef) {
    int pdt = a->gamma ? (int)a->gamma->dtype : DT_OR0(a->beta);
    int rdt = a->running_mean ? (int)a->running_mean->dtype : DT_OR0(a->running_var);
    int sdt = a->save_mean ? (int)a->save_mean->dtype : DT_OR0(a->save_invstd);
    cudaStream_t st = na_cuda_ctx.stream;
    if (train) {
        k_bn2_finalize<C><<<bn2_warp_blocks(g.c), bn2_warps, 0, st>>>(
            parts, g, DATA_OR0(a->gamma), DATA_OR0(a->beta), pdt, DATA_OR0(a->running_mean),
            DATA_OR0(a->running_var), rdt, DATA_OR0(a->save_mean), DATA_OR0(a->save_invstd), sdt,
            coef, (C)a->momentum, (C)a->eps);
        NA_CUDA_LAUNCH_CHECK("k_bn2_finalize");
    } else {
        k_bn2_eval_coef<C><<<na_grid(g.c, NA_BLOCK), NA_BLOCK, 0, st>>>(
            g, DATA_OR0(a->gamma), DATA_OR0(a->beta), pdt, DATA_OR0(a->running_mean),
            DATA_OR0(a->running_var), rdt, coef, (C)a->eps);
        NA_CUDA_LAUNCH_CHECK("k_bn2_eval_coef");
    }
    return NA_OK;
}

static int bn2_forward(const na_cuda_bn_args *a, bool train) {
    const na_view *x = a->x;
    if (a->c == 0 || a->n * a->s == 0) return NA_OK;
    int vw = bn2_width(x->dtype, a->s, x, a->y, NULL, NULL);
    bn2_geom g = bn2_geom_of(a->n, a->c, a->s, vw);
    cudaStream_t st = na_cuda_ctx.stream;
    return bn2_dispatch(x->dtype, vw, a->relu, "batch_norm (v2)", [&](auto tag, auto w, auto relu) -> int {
        constexpr int DT = decltype(tag)::dtype;
        constexpr int VW = decltype(w)::value;
        typedef typename na_hw<DT>::C C;
        typedef bn2_ops<C> O;
        void *parts = NULL, *coef = NULL;
        NA_TRY(bn2_scratch(g, sizeof(typename O::W), sizeof(C), &parts, &coef));
        if (train) {
            k_bn2_stats<DT, VW><<<bn2_grid(g), NA_BN_THREADS, 0, st>>>(x->data, g, (typename O::W *)parts);
            NA_CUDA_LAUNCH_CHECK("k_bn2_stats");
        }
        NA_TRY(bn2_coefficients<C>(a, train, g, (const typename O::W *)parts, (C *)coef));
        if (!a->y) return NA_OK; /* statistics only */
        k_bn2_apply<DT, VW, decltype(relu)::value><<<bn2_grid(g), NA_BN_THREADS, 0, st>>>(
            x->data, a->y->data, g, (const C *)coef);
        NA_CUDA_LAUNCH_CHECK("k_bn2_apply");
        return NA_OK;
    });
}

extern "C" int na_cuda_bn2_train(const na_cuda_bn_args *a) { return bn2_forward(a, true); }
extern "C" int na_cuda_bn2_eval(const na_cuda_bn_args *a) { return bn2_forward(a, false); }

/* The backward's cases with no pass over the elements (*done set): no channels, or no
 * elements (the parameter gradients are zero); a fused ReLU without its output is refused. */
static int bn_backward_trivial(const na_cuda_bn_args *a, const char *who, bool *done) {
    *done = true;
    if (a->c == 0) return NA_OK;
    if (a->n * a->s == 0) {
        if (a->ggamma) NA_TRY(na_cuda_fill(a->ggamma, 0.0));
        if (a->gbeta) NA_TRY(na_cuda_fill(a->gbeta, 0.0));
        return NA_OK;
    }
    if (a->relu && !a->y)
        return na_set_error(NA_EINVAL, "%s (cuda): relu needs the forward's output y", who);
    *done = false;
    return NA_OK;
}

/* The backward's per-channel coefficients from the sums' partials (also writing ggamma and
 * gbeta), for v2's and the row kernels' gx passes. */
template <typename C>
static int bn2_bwd_coefficients(const na_cuda_bn_args *a, const bn2_geom &g,
                                const typename bn2_ops<C>::P *parts, C *coef) {
    int gdt = a->ggamma ? (int)a->ggamma->dtype : DT_OR0(a->gbeta);
    int sdt = a->mean ? (int)a->mean->dtype : DT_OR0(a->invstd);
    k_bn2_bwd_finalize<C><<<bn2_warp_blocks(g.c), bn2_warps, 0, na_cuda_ctx.stream>>>(
        parts, g, DATA_OR0(a->gamma), DT_OR0(a->gamma), DATA_OR0(a->mean), DATA_OR0(a->invstd),
        sdt, DATA_OR0(a->ggamma), DATA_OR0(a->gbeta), gdt, coef);
    NA_CUDA_LAUNCH_CHECK("k_bn2_bwd_finalize");
    return NA_OK;
}

extern "C" int na_cuda_bn2_backward(const na_cuda_bn_args *a) {
    bool done;
    NA_TRY(bn_backward_trivial(a, "batch_norm backward v2", &done));
    if (done) return NA_OK;
    const na_view *x = a->x;
    int vw = bn2_width(x->dtype, a->s, x, a->gy, a->gx, a->relu ? a->y : NULL);
    bn2_geom g = bn2_geom_of(a->n, a->c, a->s, vw);
    int sdt = a->mean ? (int)a->mean->dtype : DT_OR0(a->invstd);
    const void *yd = a->relu ? a->y->data : NULL;
    cudaStream_t st = na_cuda_ctx.stream;
    return bn2_dispatch(x->dtype, vw, a->relu, "batch_norm_backward (v2)", [&](auto tag, auto w, auto relu) -> int {
        constexpr int DT = decltype(tag)::dtype;
        constexpr int VW = decltype(w)::value;
        constexpr bool RELU = decltype(relu)::value;
        typedef typename na_hw<DT>::C C;
        typedef bn2_ops<C> O;
        void *parts = NULL, *coef = NULL;
        NA_TRY(bn2_scratch(g, sizeof(typename O::P), sizeof(C), &parts, &coef));
        k_bn2_bwd_sums<DT, VW, RELU><<<bn2_grid(g), NA_BN_THREADS, 0, st>>>(
            x->data, yd, a->gy->data, g, DATA_OR0(a->mean), DATA_OR0(a->invstd), sdt,
            (typename O::P *)parts);
        NA_CUDA_LAUNCH_CHECK("k_bn2_bwd_sums");
        NA_TRY(bn2_bwd_coefficients<C>(a, g, (const typename O::P *)parts, (C *)coef));
        if (!a->gx) return NA_OK;
        if (a->train)
            k_bn2_bwd_apply<DT, VW, RELU, true><<<bn2_grid(g), NA_BN_THREADS, 0, st>>>(
                x->data, yd, a->gy->data, a->gx->data, g, (const C *)coef);
        else
            k_bn2_bwd_apply<DT, VW, RELU, false><<<bn2_grid(g), NA_BN_THREADS, 0, st>>>(
                x->data, yd, a->gy->data, a->gx->data, g, (const C *)coef);
        NA_CUDA_LAUNCH_CHECK("k_bn2_bwd_apply");
        return NA_OK;
    });
}

/* ==== rows (NANOAMP_CUDA_BN_ROWS=1): x [M, C] row-major, s == 1 ============================
 * The order is common/bn_rows.h's: blocks of bx vectors (vw neighbouring channels, 16 bytes
 * when C and the pointers allow) x by rows, so a warp reads whole stretches of rows
 * (coalesced) where the channel-per-block kernels read every element C apart.
 *   train:    stats (per chunk and channel: Welford partials) -> the v2 finalize (one warp per
 *             channel, na_welford_combine over the chunks) -> apply: two reads, one write;
 *   eval:     the v2 coefficients from the running stats -> apply;
 *   backward: sums (per chunk and channel) -> the v2 finalize -> apply (gx), ReLU's gradient
 *             fused as in v2.
 * Same formulas, conversions and partial layout (parts[ch * chunks + chunk]) as v2. */

/* The common/bn_rows.h tree over the block's by rows of thread column tx (ty order); every
 * thread of the block calls it; the result is for ty == 0. `sm` holds NA_BN_THREADS. */
template <typename C, typename T>
static __device__ __forceinline__ T bnr_tree(T v, T *sm) {
    const int at = threadIdx.y * blockDim.x + threadIdx.x;
    __syncthreads(); /* sm may still be read by the previous channel */
    sm[at] = v;
    __syncthreads();
    for (int o = blockDim.y / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.y < o) sm[at] = bn2_ops<C>::merge(sm[at], sm[at + o * blockDim.x]);
        __syncthreads();
    }
    return sm[threadIdx.x];
}

#define BNR_CB_LOOP(cb) for (int64_t cb = blockIdx.y; cb < g.cblocks; cb += gridDim.y)

/* per-chunk Welford partials of x: parts[ch * chunks + chunk] */
template <int DT, int VW>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bnr_stats(const void *__restrict__ x, na_bn_rows_geom g,
            typename bn2_ops<typename na_hw<DT>::C>::W *__restrict__ parts) {
    typedef typename na_hw<DT>::C C;
    typedef bn2_ops<C> O;
    typedef typename O::W W;
    __shared__ W sm[NA_BN_THREADS];
    const int ty = threadIdx.y;
    BNR_CB_LOOP(cb) for (int64_t k = blockIdx.x; k < g.chunks; k += gridDim.x) {
        const int64_t cvi = cb * g.bx + threadIdx.x;
        const bool active = cvi < g.cv;
        W acc[VW];
#pragma unroll
        for (int i = 0; i < VW; i++) acc[i] = O::w_empty();
        int64_t n = 0; /* values per channel folded so far, the same for all VW channels */
        for (int64_t s = 0; s < g.steps && active; s++) {
            C v[NA_BN_VPT][VW];
            int cnt = 0; /* loads of this step inside the rows (a prefix of j) */
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                const int64_t r = na_bn_rows_row(&g, k, s, j, ty);
                if (r < g.m) {
                    na_vld<DT, VW>(x, r * g.c + cvi * VW, v[j]);
                    cnt = j + 1;
                }
            }
            if (cnt == 0) break; /* every later step is beyond the rows too */
            const C fb = O::fb(n, cnt);
#pragma unroll
            for (int i = 0; i < VW; i++) {
                C col[NA_BN_VPT];
#pragma unroll
                for (int j = 0; j < NA_BN_VPT; j++) col[j] = v[j][i];
                const W w = cnt == NA_BN_VPT ? O::w_of(col, NA_BN_VPT) : O::w_of_upto(col, cnt);
                acc[i] = n ? O::merge_fb(acc[i], w, fb) : w; /* = O::merge(acc[i], w) */
            }
            n += cnt;
        }
#pragma unroll
        for (int i = 0; i < VW; i++) {
            const W r = bnr_tree<C>(acc[i], sm);
            if (ty == 0 && active) parts[(cvi * VW + i) * g.chunks + k] = r;
        }
    }
}

/* per-chunk (sum g, sum g*xhat), g = gy (where y is not <= 0 with RELU): parts[ch * chunks + chunk] */
template <int DT, int VW, bool RELU>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bnr_bwd_sums(const void *__restrict__ x, const void *__restrict__ y,
               const void *__restrict__ gy, na_bn_rows_geom g, const void *mean,
               const void *invstd, int sdt,
               typename bn2_ops<typename na_hw<DT>::C>::P *__restrict__ parts) {
    typedef typename na_hw<DT>::C C;
    typedef bn2_ops<C> O;
    typedef typename O::P P;
    __shared__ P sm[NA_BN_THREADS];
    const int ty = threadIdx.y;
    BNR_CB_LOOP(cb) for (int64_t k = blockIdx.x; k < g.chunks; k += gridDim.x) {
        const int64_t cvi = cb * g.bx + threadIdx.x;
        const bool active = cvi < g.cv;
        C mu[VW], is[VW];
        P acc[VW];
#pragma unroll
        for (int i = 0; i < VW; i++) {
            const int64_t ch = active ? cvi * VW + i : 0;
            mu[i] = mean ? na_ld<C>(mean, sdt, ch) : (C)0;
            is[i] = invstd ? na_ld<C>(invstd, sdt, ch) : (C)1;
            acc[i] = O::p_empty();
        }
        for (int64_t s = 0; s < g.steps && active; s++) {
            C xv[NA_BN_VPT][VW], gv[NA_BN_VPT][VW], yv[NA_BN_VPT][VW];
            int cnt = 0;
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                const int64_t r = na_bn_rows_row(&g, k, s, j, ty);
                if (r < g.m) {
                    const int64_t o = r * g.c + cvi * VW;
                    na_vld<DT, VW>(x, o, xv[j]);
                    na_vld<DT, VW>(gy, o, gv[j]);
                    if (RELU) na_vld<DT, VW>(y, o, yv[j]);
                    cnt = j + 1;
                }
            }
            if (cnt == 0) break;
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                if (j >= cnt) break;
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    const C gvi = RELU ? NA_RELU_PASS(C, yv[j][i], gv[j][i]) : gv[j][i];
                    acc[i].a += gvi;
                    acc[i].b += gvi * ((xv[j][i] - mu[i]) * is[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < VW; i++) {
            const P r = bnr_tree<C>(acc[i], sm);
            if (ty == 0 && active) parts[(cvi * VW + i) * g.chunks + k] = r;
        }
    }
}

/* Thread (tx, ty)'s rows of the elementwise passes: step t of all ceil(M / step), load j */
#define BNR_STEP_LOOP(t)                                                                      \
    for (int64_t t = blockIdx.x; t * g.step < g.m; t += gridDim.x)

/* y = (x - mean) * scale + shift (then relu); coef as v2's */
template <int DT, int VW, bool RELU>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bnr_apply(const void *__restrict__ x, void *__restrict__ y, na_bn_rows_geom g,
            const typename na_hw<DT>::C *__restrict__ coef) {
    typedef typename na_hw<DT>::C C;
    BNR_CB_LOOP(cb) {
        const int64_t cvi = cb * g.bx + threadIdx.x;
        if (cvi >= g.cv) continue;
        C mean[VW], scale[VW], shift[VW];
#pragma unroll
        for (int i = 0; i < VW; i++) {
            const C *cf = coef + (cvi * VW + i) * BN2_NCOEF;
            mean[i] = cf[0], scale[i] = cf[1], shift[i] = cf[2];
        }
        BNR_STEP_LOOP(t) {
            C v[NA_BN_VPT][VW];
            int64_t off[NA_BN_VPT];
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                const int64_t r = t * g.step + (int64_t)j * g.by + threadIdx.y;
                off[j] = r < g.m ? r * g.c + cvi * VW : -1;
                if (off[j] >= 0) na_vld<DT, VW>(x, off[j], v[j]);
            }
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                if (off[j] < 0) continue;
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    const C r = (v[j][i] - mean[i]) * scale[i] + shift[i];
                    v[j][i] = RELU ? NA_RELU(C, r) : r;
                }
                na_vst<DT, VW>(y, off[j], v[j]);
            }
        }
    }
}

/* train: gx = (g - mean(g) - xhat*mean(g*xhat)) * scale; eval: gx = g * scale; coef as v2's */
template <int DT, int VW, bool RELU, bool TRAIN>
__global__ void __launch_bounds__(NA_BN_THREADS)
k_bnr_bwd_apply(const void *__restrict__ x, const void *__restrict__ y,
                const void *__restrict__ gy, void *__restrict__ gx, na_bn_rows_geom g,
                const typename na_hw<DT>::C *__restrict__ coef) {
    typedef typename na_hw<DT>::C C;
    BNR_CB_LOOP(cb) {
        const int64_t cvi = cb * g.bx + threadIdx.x;
        if (cvi >= g.cv) continue;
        C mu[VW], scale[VW], is[VW], mg[VW], mgx[VW];
#pragma unroll
        for (int i = 0; i < VW; i++) {
            const C *cf = coef + (cvi * VW + i) * BN2_NCOEF;
            mu[i] = cf[0], scale[i] = cf[1], is[i] = cf[2], mg[i] = cf[3], mgx[i] = cf[4];
        }
        BNR_STEP_LOOP(t) {
            C xv[NA_BN_VPT][VW], gv[NA_BN_VPT][VW], yv[NA_BN_VPT][VW];
            int64_t off[NA_BN_VPT];
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                const int64_t r = t * g.step + (int64_t)j * g.by + threadIdx.y;
                off[j] = r < g.m ? r * g.c + cvi * VW : -1;
                if (off[j] < 0) continue;
                na_vld<DT, VW>(gy, off[j], gv[j]);
                if (TRAIN) na_vld<DT, VW>(x, off[j], xv[j]);
                if (RELU) na_vld<DT, VW>(y, off[j], yv[j]);
            }
#pragma unroll
            for (int j = 0; j < NA_BN_VPT; j++) {
                if (off[j] < 0) continue;
#pragma unroll
                for (int i = 0; i < VW; i++) {
                    const C gvi = RELU ? NA_RELU_PASS(C, yv[j][i], gv[j][i]) : gv[j][i];
                    gv[j][i] = TRAIN ? (gvi - mg[i] - ((xv[j][i] - mu[i]) * is[i]) * mgx[i]) * scale[i]
                                     : gvi * scale[i];
                }
                na_vst<DT, VW>(gx, off[j], gv[j]);
            }
        }
    }
}

/* ---- host side ---- */
static int bnr_check(const na_cuda_bn_args *a, const char *who) {
    if (a->s != 1)
        return na_set_error(NA_EINVAL, "%s (cuda rows): x is [%lld, %lld, %lld]; the row kernels "
                            "take s == 1 ([M, C] rows)", who, (long long)a->n, (long long)a->c,
                            (long long)a->s);
    return NA_OK;
}

/* The v2 geometry whose finalize kernels combine the rows' chunk partials: c channels of m
 * values, `chunks` partials each. */
static bn2_geom bnr_final_geom(const na_bn_rows_geom &g) {
    bn2_geom f = bn2_geom_of(g.m, g.c, 1, 1);
    f.tiles = g.chunks;
    return f;
}

static dim3 bnr_block(const na_bn_rows_geom &g) { return dim3((unsigned)g.bx, (unsigned)g.by); }
static unsigned bnr_cblocks(const na_bn_rows_geom &g) {
    return (unsigned)(g.cblocks < 65535 ? g.cblocks : 65535);
}
/* the statistics passes: one block per chunk and channel block */
static dim3 bnr_stats_grid(const na_bn_rows_geom &g) {
    return dim3((unsigned)(g.chunks < INT32_MAX ? g.chunks : INT32_MAX), bnr_cblocks(g));
}
/* the elementwise passes: enough blocks to fill the device a few times */
static dim3 bnr_apply_grid(const na_bn_rows_geom &g) {
    int64_t steps = (g.m + g.step - 1) / g.step;
    int64_t want = (int64_t)(na_cuda_ctx.sm_count > 0 ? na_cuda_ctx.sm_count : 80) * 8 / g.cblocks;
    if (want < 1) want = 1;
    return dim3((unsigned)(steps < want ? steps : want), bnr_cblocks(g));
}

static int bnr_forward(const na_cuda_bn_args *a, bool train) {
    NA_TRY(bnr_check(a, train ? "batch_norm_train" : "batch_norm_eval"));
    const na_view *x = a->x;
    if (a->c == 0 || a->n == 0) return NA_OK;
    int vw = bn2_width(x->dtype, a->c, x, a->y, NULL, NULL);
    na_bn_rows_geom g = na_bn_rows_geom_of(a->n, a->c, vw);
    bn2_geom f = bnr_final_geom(g);
    cudaStream_t st = na_cuda_ctx.stream;
    return bn2_dispatch(x->dtype, vw, a->relu, "batch_norm (rows)", [&](auto tag, auto w, auto relu) -> int {
        constexpr int DT = decltype(tag)::dtype;
        constexpr int VW = decltype(w)::value;
        typedef typename na_hw<DT>::C C;
        typedef bn2_ops<C> O;
        void *parts = NULL, *coef = NULL;
        NA_TRY(bn2_scratch(f, sizeof(typename O::W), sizeof(C), &parts, &coef));
        if (train) {
            k_bnr_stats<DT, VW><<<bnr_stats_grid(g), bnr_block(g), 0, st>>>(x->data, g, (typename O::W *)parts);
            NA_CUDA_LAUNCH_CHECK("k_bnr_stats");
        }
        NA_TRY(bn2_coefficients<C>(a, train, f, (const typename O::W *)parts, (C *)coef));
        if (!a->y) return NA_OK; /* statistics only */
        k_bnr_apply<DT, VW, decltype(relu)::value><<<bnr_apply_grid(g), bnr_block(g), 0, st>>>(
            x->data, a->y->data, g, (const C *)coef);
        NA_CUDA_LAUNCH_CHECK("k_bnr_apply");
        return NA_OK;
    });
}

extern "C" int na_cuda_bn_rows_train(const na_cuda_bn_args *a) { return bnr_forward(a, true); }
extern "C" int na_cuda_bn_rows_eval(const na_cuda_bn_args *a) { return bnr_forward(a, false); }

extern "C" int na_cuda_bn_rows_backward(const na_cuda_bn_args *a) {
    NA_TRY(bnr_check(a, "batch_norm_backward"));
    bool done;
    NA_TRY(bn_backward_trivial(a, "batch_norm_backward rows", &done));
    if (done) return NA_OK;
    const na_view *x = a->x;
    int vw = bn2_width(x->dtype, a->c, x, a->gy, a->gx, a->relu ? a->y : NULL);
    na_bn_rows_geom g = na_bn_rows_geom_of(a->n, a->c, vw);
    bn2_geom f = bnr_final_geom(g);
    int sdt = a->mean ? (int)a->mean->dtype : DT_OR0(a->invstd);
    const void *yd = a->relu ? a->y->data : NULL;
    cudaStream_t st = na_cuda_ctx.stream;
    return bn2_dispatch(x->dtype, vw, a->relu, "batch_norm_backward (rows)", [&](auto tag, auto w, auto relu) -> int {
        constexpr int DT = decltype(tag)::dtype;
        constexpr int VW = decltype(w)::value;
        constexpr bool RELU = decltype(relu)::value;
        typedef typename na_hw<DT>::C C;
        typedef bn2_ops<C> O;
        void *parts = NULL, *coef = NULL;
        NA_TRY(bn2_scratch(f, sizeof(typename O::P), sizeof(C), &parts, &coef));
        k_bnr_bwd_sums<DT, VW, RELU><<<bnr_stats_grid(g), bnr_block(g), 0, st>>>(
            x->data, yd, a->gy->data, g, DATA_OR0(a->mean), DATA_OR0(a->invstd), sdt,
            (typename O::P *)parts);
        NA_CUDA_LAUNCH_CHECK("k_bnr_bwd_sums");
        NA_TRY(bn2_bwd_coefficients<C>(a, f, (const typename O::P *)parts, (C *)coef));
        if (!a->gx) return NA_OK;
        if (a->train)
            k_bnr_bwd_apply<DT, VW, RELU, true><<<bnr_apply_grid(g), bnr_block(g), 0, st>>>(
                x->data, yd, a->gy->data, a->gx->data, g, (const C *)coef);
        else
            k_bnr_bwd_apply<DT, VW, RELU, false><<<bnr_apply_grid(g), bnr_block(g), 0, st>>>(
                x->data, yd, a->gy->data, a->gx->data, g, (const C *)coef);
        NA_CUDA_LAUNCH_CHECK("k_bnr_bwd_apply");
        return NA_OK;
    });
}

/* ---- the hardware conversions against common/half.h (na_cuda_check_half_intrinsics) ---- */
static __device__ __forceinline__ bool f16_nan(uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }
static __device__ __forceinline__ bool bf16_nan(uint16_t h) { return (h & 0x7FFFu) > 0x7F80u; }
static __device__ __forceinline__ bool f32_same(float a, float b) {
    return (a != a && b != b) || __float_as_uint(a) == __float_as_uint(b);
}

__global__ void k_check_half_intrinsics(unsigned long long *bad) {
    unsigned long long b0 = 0, b1 = 0, b2 = 0, b3 = 0;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < ((uint64_t)1 << 32);
         i += stride) {
        const float f = __uint_as_float((uint32_t)i);
        const uint16_t h = __half_as_ushort(__float2half_rn(f)), hs = na_f32_to_f16_bits(f);
        const uint16_t bb = __bfloat16_as_ushort(__float2bfloat16_rn(f)), bs = na_f32_to_bf16_bits(f);
        b0 += f != f ? !(f16_nan(h) && f16_nan(hs)) : h != hs;
        b1 += f != f ? !(bf16_nan(bb) && bf16_nan(bs)) : bb != bs;
        if (i < 65536) {
            const uint16_t u = (uint16_t)i;
            b2 += !f32_same(__half2float(__ushort_as_half(u)), na_f16_bits_to_f32(u));
            b3 += !f32_same(__bfloat162float(__ushort_as_bfloat16(u)), na_bf16_bits_to_f32(u));
        }
    }
    if (b0) atomicAdd(&bad[0], b0);
    if (b1) atomicAdd(&bad[1], b1);
    if (b2) atomicAdd(&bad[2], b2);
    if (b3) atomicAdd(&bad[3], b3);
}

extern "C" int na_cuda_check_half_intrinsics(uint64_t bad[4]) {
    unsigned long long *d = (unsigned long long *)na_cuda_scratch(4 * sizeof *d);
    if (!d) return na_last_status();
    NA_CUDA_CHECK(cudaMemsetAsync(d, 0, 4 * sizeof *d, na_cuda_ctx.stream));
    k_check_half_intrinsics<<<na_grid((int64_t)1 << 32, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(d);
    NA_CUDA_LAUNCH_CHECK("k_check_half_intrinsics");
    unsigned long long h[4];
    NA_CUDA_CHECK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, na_cuda_ctx.stream));
    NA_CUDA_CHECK(cudaStreamSynchronize(na_cuda_ctx.stream));
    for (int i = 0; i < 4; i++) bad[i] = h[i];
    return NA_OK;
}
