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
 * These are the CPU backend's formulas, term for term (kernels/cpu/cpu_batchnorm.c).
 * gamma/beta NULL means affine off (1 and 0); ggamma/gbeta/gx NULL are not written.
 */
#include "cuda_common.cuh"

struct bn_geom {
    int64_t n, c, s, m; /* m = n*s elements per channel */
};

static __device__ __forceinline__ int64_t bn_off(const bn_geom &g, int64_t ch, int64_t j) {
    int64_t i = j / g.s;
    return (i * g.c + ch) * g.s + (j - i * g.s);
}

template <typename C>
__global__ void k_bn_train(const void *x, int xdt, const void *gamma, const void *beta, int pdt,
                           void *rmean, void *rvar, int rdt, void *y, int ydt, void *smean,
                           void *sinvstd, int sdt, bn_geom g, C momentum, C eps) {
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
        const C invstd = (C)1 / na_sqrt(var + eps);
        if (threadIdx.x == 0) {
            if (smean) na_st(smean, sdt, ch, mean);
            if (sinvstd) na_st(sinvstd, sdt, ch, invstd);
            if (rmean) {
                C rm = na_ld<C>(rmean, rdt, ch);
                na_st(rmean, rdt, ch, ((C)1 - momentum) * rm + momentum * mean);
            }
            if (rvar) {
                C unbiased = g.m > 1 ? var * ((C)g.m / (C)(g.m - 1)) : var;
                C rv = na_ld<C>(rvar, rdt, ch);
                na_st(rvar, rdt, ch, ((C)1 - momentum) * rv + momentum * unbiased);
            }
        }
        const C scale = invstd * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
        const C shift = beta ? na_ld<C>(beta, pdt, ch) : (C)0;
        for (int64_t j = threadIdx.x; j < g.m; j += blockDim.x) {
            int64_t o = bn_off(g, ch, j);
            na_st(y, ydt, o, (na_ld<C>(x, xdt, o) - mean) * scale + shift);
        }
    }
}

template <typename C>
__global__ void k_bn_eval(const void *x, int xdt, const void *gamma, const void *beta, int pdt,
                          const void *rmean, const void *rvar, int rdt, void *y, int ydt,
                          int64_t c, int64_t s, int64_t total, C eps) {
    NA_GRID_STRIDE(e, total) {
        int64_t ch = (e / s) % c;
        C rv = rvar ? na_ld<C>(rvar, rdt, ch) : (C)1;
        C rm = rmean ? na_ld<C>(rmean, rdt, ch) : (C)0;
        C scale = ((C)1 / na_sqrt(rv + eps)) * (gamma ? na_ld<C>(gamma, pdt, ch) : (C)1);
        C shift = beta ? na_ld<C>(beta, pdt, ch) : (C)0;
        na_st(y, ydt, e, (na_ld<C>(x, xdt, e) - rm) * scale + shift);
    }
}

template <typename C>
__global__ void k_bn_bwd(const void *x, int xdt, const void *gy, int gydt, const void *gamma,
                         int pdt, const void *mean, const void *invstd, int sdt, void *gx,
                         int gxdt, void *ggamma, void *gbeta, int gdt, bn_geom g, bool train) {
    __shared__ C sm[32];
    for (int64_t ch = blockIdx.x; ch < g.c; ch += gridDim.x) {
        const C mu = mean ? na_ld<C>(mean, sdt, ch) : (C)0;
        const C is = invstd ? na_ld<C>(invstd, sdt, ch) : (C)1;
        C sg = (C)0, sgx = (C)0;
        for (int64_t j = threadIdx.x; j < g.m; j += blockDim.x) {
            int64_t o = bn_off(g, ch, j);
            C gv = na_ld<C>(gy, gydt, o);
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
            C gv = na_ld<C>(gy, gydt, o);
            C v;
            if (train) {
                C xh = (na_ld<C>(x, xdt, o) - mu) * is;
                v = (gv - mg - xh * mgx) * scale;
            } else {
                v = gv * scale;
            }
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
                             int64_t s, double momentum, double eps) {
    bn_geom g = {n, c, s, n * s};
    if (c == 0 || g.m == 0) return NA_OK;
    int tx = na_row_threads(g.m);
    int pdt = gamma ? (int)gamma->dtype : DT_OR0(beta);
    int rdt = running_mean ? (int)running_mean->dtype : DT_OR0(running_var);
    int sdt = save_mean ? (int)save_mean->dtype : DT_OR0(save_invstd);
#define LAUNCH_BN(C)                                                                          \
    k_bn_train<C><<<bn_blocks(c), tx, 0, na_cuda_ctx.stream>>>(                               \
        x->data, x->dtype, DATA_OR0(gamma), DATA_OR0(beta), pdt, DATA_OR0(running_mean),      \
        DATA_OR0(running_var), rdt, y->data, y->dtype, DATA_OR0(save_mean),                   \
        DATA_OR0(save_invstd), sdt, g, (C)momentum, (C)eps)
    if (x->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_train");
    return NA_OK;
}

int na_cuda_batch_norm_eval(const na_view *x, const na_view *gamma, const na_view *beta,
                            const na_view *running_mean, const na_view *running_var,
                            na_view *y, int64_t n, int64_t c, int64_t s, double eps) {
    int64_t total = n * c * s;
    if (total == 0) return NA_OK;
    int pdt = gamma ? (int)gamma->dtype : DT_OR0(beta);
    int rdt = running_mean ? (int)running_mean->dtype : DT_OR0(running_var);
    unsigned grid = na_grid(total, NA_BLOCK);
#define LAUNCH_BN(C)                                                                          \
    k_bn_eval<C><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(                                  \
        x->data, x->dtype, DATA_OR0(gamma), DATA_OR0(beta), pdt, DATA_OR0(running_mean),      \
        DATA_OR0(running_var), rdt, y->data, y->dtype, c, s, total, (C)eps)
    if (x->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_eval");
    return NA_OK;
}

int na_cuda_batch_norm_backward(const na_view *x, const na_view *gy, const na_view *gamma,
                                const na_view *mean, const na_view *invstd, na_view *gx,
                                na_view *ggamma, na_view *gbeta, int64_t n, int64_t c,
                                int64_t s, bool train) {
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
        x->data, x->dtype, gy->data, gy->dtype, DATA_OR0(gamma), DT_OR0(gamma),               \
        DATA_OR0(mean), DATA_OR0(invstd), sdt, DATA_OR0(gx), DT_OR0(gx), DATA_OR0(ggamma),    \
        DATA_OR0(gbeta), gdt, g, train)
    if (x->dtype == NA_DTYPE_F64) LAUNCH_BN(double);
    else LAUNCH_BN(float);
#undef LAUNCH_BN
    NA_CUDA_LAUNCH_CHECK("k_bn_bwd");
    return NA_OK;
}
