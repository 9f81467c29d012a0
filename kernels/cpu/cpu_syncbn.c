/* kernels/cpu/cpu_syncbn.c — the two backward passes of SyncBatchNorm fused with its ReLU
 * (batch_norm_relu_backward_x, kernels/backend.h), with relu'(y) recomputed from x instead of
 * read from the saved y.
 *
 * SyncBatchNorm's backward is two passes over the whole layer with a collective between them
 * (this rank's sums, then gx from the sums over all ranks), so the second pass cannot find a
 * channel in the cache as plain BatchNorm's does: x, gy and y come back from memory twice.
 * The forward's y is relu((x - mean) * scale + shift) with scale = invstd(var, eps) * gamma,
 * shift = beta, exactly as batch_norm_eval computes it (the same f32 expressions, nothing
 * contracted), so its sign, and with it relu'(y), is recomputed from x bit for bit: each pass
 * reads x and gy, not y (three streams of four become two of three).
 *
 * Per element the results are those of batch_norm_backward (gx NULL) and
 * batch_norm_backward_elemt with relu_y = that y, bit for bit: the same masks (the sums pass
 * gy where y is not <= 0, NA_RELU_GRAD; the gx pass gy where y > 0, as chan_gx of
 * cpu_batchnorm.c), the same order of the sums (8 lanes, halves above 128 elements, chunks of
 * NA_CPU_CHUNK added by a pairwise counter over the rows) and na_bn_grad (common/bn_stats.h).
 * tests/test_cpu_kernels.c compares them. x of f32, f64 or f16 (converted a chunk at a time,
 * as cpu_batchnorm.c does): an f16 y is 0 also where the pre-ReLU value is at most 2^-25 (it
 * rounds to 0), so the f16 masks compare with 2^-25. bf16: *done = false (conversions differ
 * on f32 subnormals: some flush them to 0). */
#include "common/bn_stats.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_parallel.h"

static double sbn_param(const na_view *t, int64_t i, double dflt) {
    return t ? na_cpu_get(t->dtype, t->data, i) : dflt;
}

#define NA_CPU_DEFINE_SBN(T, SFX, NAME)                                                        \
    /* (sum of gm, sum of gm * xhat) over n values, gm = gy where (x-mean)*fsc+fsh is not <= \
     * thr (relu'(y) of the forward's y, NA_RELU_GRAD): dual_sum's order (cpu_batchnorm.c) */ \
    static void sbn_sums_##NAME(const T *g, const T *x, int64_t n, T mean, T invstd, T fsc,  \
                                T fsh, T thr, T *s1, T *s2) {                               \
        if (n > 128) {                                                                      \
            int64_t h = (n / 2 + 7) & ~(int64_t)7;                                          \
            T a1, a2, b1, b2;                                                               \
            sbn_sums_##NAME(g, x, h, mean, invstd, fsc, fsh, thr, &a1, &a2);                \
            sbn_sums_##NAME(g + h, x + h, n - h, mean, invstd, fsc, fsh, thr, &b1, &b2);    \
            *s1 = a1 + b1;                                                                  \
            *s2 = a2 + b2;                                                                  \
            return;                                                                         \
        }                                                                                   \
        typedef T v8 __attribute__((vector_size(8 * sizeof(T))));                           \
        v8 zero = {0}, va1 = zero, va2 = zero, vm = zero + mean, vs = zero + invstd;        \
        v8 vfs = zero + fsc, vfh = zero + fsh, vthr = zero + thr;                           \
        int64_t i = 0;                                                                      \
        for (; i + 8 <= n; i += 8) {                                                        \
            v8 gv, xv;                                                                      \
            memcpy(&gv, g + i, sizeof gv);                                                  \
            memcpy(&xv, x + i, sizeof xv);                                                  \
            v8 yv = (xv - vm) * vfs + vfh; /* y before the ReLU, as the forward's */        \
            gv = gv * __builtin_convertvector(~(yv <= vthr) & 1, v8); /* relu'(y) */        \
            va1 += gv;                                                                      \
            va2 += gv * ((xv - vm) * vs);                                                   \
        }                                                                                   \
        T acc1[8], acc2[8];                                                                 \
        memcpy(acc1, &va1, sizeof acc1);                                                    \
        memcpy(acc2, &va2, sizeof acc2);                                                    \
        T t1 = NA_CPU_LANES8_TOTAL(acc1);                                                   \
        T t2 = NA_CPU_LANES8_TOTAL(acc2);                                                   \
        for (; i < n; i++) {                                                                \
            T yv = (x[i] - mean) * fsc + fsh;                                               \
            T gm = g[i] * (yv <= thr ? (T)0 : (T)1);                                        \
            t1 += gm;                                                                       \
            t2 += gm * ((x[i] - mean) * invstd);                                            \
        }                                                                                   \
        *s1 = t1;                                                                           \
        *s2 = t2;                                                                           \
    }                                                                                       \
    /* channels [c0, c1): the sums (gx NULL) or gx; x, gy and gx of dtype dt, read and       \
     * written a chunk at a time in T (f16: converted, as cpu_batchnorm.c's loops do); thr:  \
     * the largest pre-ReLU value whose y is 0 once stored in dt (0; f16: 2^-25, which       \
     * rounds to 0, the next value up to 2^-24) */                                          \
    static void sbn_channels_##NAME(const na_view *xv, const na_view *gyv,                  \
                                    const na_view *gamma, const na_view *beta,              \
                                    const na_view *mean_t, const na_view *var_t, T eps,     \
                                    const na_view *invstd_t, const na_view *sg,             \
                                    const na_view *sgx, int64_t count, na_view *gx,         \
                                    na_view *gg, na_view *gb, int64_t n, int64_t c,         \
                                    int64_t s, int64_t c0, int64_t c1, T thr) {             \
        T xb[NA_CPU_CHUNK], gyb[NA_CPU_CHUNK], ob[NA_CPU_CHUNK];                            \
        na_dtype dt = xv->dtype;                                                            \
        for (int64_t ch = c0; ch < c1; ch++) {                                              \
            T mean = (T)sbn_param(mean_t, ch, 0), invstd = (T)sbn_param(invstd_t, ch, 1);   \
            T g = (T)sbn_param(gamma, ch, 1);                                               \
            /* the forward's scale and shift, as batch_norm_eval computes them */           \
            T fsc = na_bn_invstd_##SFX((T)sbn_param(var_t, ch, 1), eps) * g;                \
            T fsh = (T)sbn_param(beta, ch, 0);                                              \
            T scale = invstd * g, mg = 0, mgx = 0;                                          \
            if (gx) {                                                                       \
                mg = (T)sbn_param(sg, ch, 0) / (T)count;                                    \
                mgx = (T)sbn_param(sgx, ch, 0) / (T)count;                                  \
            }                                                                               \
            na_cpu_psum_##SFX a1 = {{0}, 0}, a2 = {{0}, 0};                                 \
            for (int64_t ni = 0; ni < n; ni++)                                              \
                for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                             \
                    int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;              \
                    int64_t off = (ni * c + ch) * s + o;                                    \
                    const T *x = na_cpu_view_##SFX(dt, xv->data, off, cnt, xb);             \
                    const T *gy = na_cpu_view_##SFX(dt, gyv->data, off, cnt, gyb);          \
                    if (!gx) {                                                              \
                        T s1, s2;                                                           \
                        sbn_sums_##NAME(gy, x, cnt, mean, invstd, fsc, fsh, thr, &s1, &s2); \
                        na_cpu_psum_add_##SFX(&a1, s1);                                     \
                        na_cpu_psum_add_##SFX(&a2, s2);                                     \
                        continue;                                                           \
                    }                                                                       \
                    T *out = na_cpu_out_##SFX(dt, gx->data, off, ob);                       \
                    for (int64_t i = 0; i < cnt; i++) {                                     \
                        T yv = (x[i] - mean) * fsc + fsh;                                   \
                        out[i] = na_bn_grad_##SFX(gy[i] * (yv > thr ? (T)1 : (T)0), x[i],   \
                                                  mean, invstd, mg, mgx, scale);            \
                    }                                                                       \
                    na_cpu_store_##SFX(dt, gx->data, off, cnt, out);                        \
                }                                                                           \
            if (gx) continue;                                                               \
            T sum_gy = na_cpu_psum_total_##SFX(&a1);                                        \
            T sum_gyxh = na_cpu_psum_total_##SFX(&a2);                                      \
            if (gg) na_cpu_set(gg->dtype, gg->data, ch, sum_gyxh);                          \
            if (gb) na_cpu_set(gb->dtype, gb->data, ch, sum_gy);                            \
        }                                                                                   \
    }

NA_CPU_DEFINE_SBN(float, f, f)
NA_CPU_DEFINE_SBN(double, d, d)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2")
NA_CPU_DEFINE_SBN(float, f, f_avx2)
#pragma GCC pop_options
#define SBN_F32(...) (na_cpu_use_avx2() ? sbn_channels_f_avx2 : sbn_channels_f)(__VA_ARGS__)
#else
#define SBN_F32(...) sbn_channels_f(__VA_ARGS__)
#endif

typedef struct {
    const na_view *x, *gy, *gamma, *beta, *mean, *var, *invstd, *sg, *sgx;
    na_view *gx, *gg, *gb;
    double eps;
    int64_t count, n, c, s, tasks;
} sbn_job;

static void sbn_task(void *ctx, int64_t t) {
    const sbn_job *j = ctx;
    int64_t c0, c1;
    na_cpu_task_range(j->c, j->tasks, t, 1, &c0, &c1);
    if (j->x->dtype == NA_DTYPE_F64)
        sbn_channels_d(j->x, j->gy, j->gamma, j->beta, j->mean, j->var, j->eps, j->invstd, j->sg,
                       j->sgx, j->count, j->gx, j->gg, j->gb, j->n, j->c, j->s, c0, c1, 0.0);
    else
        SBN_F32(j->x, j->gy, j->gamma, j->beta, j->mean, j->var, (float)j->eps, j->invstd, j->sg,
                j->sgx, j->count, j->gx, j->gg, j->gb, j->n, j->c, j->s, c0, c1,
                j->x->dtype == NA_DTYPE_F16 ? 0x1p-25f : 0.0f);
}

int na_cpu_batch_norm_relu_backward_x(const na_view *x, const na_view *gy, const na_view *gamma,
                                      const na_view *beta, const na_view *mean,
                                      const na_view *var, double eps, const na_view *invstd,
                                      const na_view *sum_gy, const na_view *sum_gyxhat,
                                      int64_t count, na_view *gx, na_view *ggamma,
                                      na_view *gbeta, int64_t n, int64_t c, int64_t s,
                                      bool *done) {
    const char *fn = "cpu_batch_norm_relu_backward_x";
    *done = false;
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, beta);
    NA_CPU_CHECK_FLOAT(fn, mean);
    NA_CPU_CHECK_FLOAT(fn, var);
    NA_CPU_CHECK_FLOAT(fn, invstd);
    NA_CPU_CHECK_FLOAT(fn, sum_gy);
    NA_CPU_CHECK_FLOAT(fn, sum_gyxhat);
    NA_CPU_CHECK_FLOAT(fn, ggamma);
    NA_CPU_CHECK_FLOAT(fn, gbeta);
    if (n < 0 || c < 0 || s < 0 || n * c * s != x->numel || gy->numel != x->numel ||
        (gx && gx->numel != x->numel))
        return na_set_error(NA_ESHAPE, "%s: [N, C, S] = [%lld, %lld, %lld] does not match x's "
                            "%lld elements (gy %lld)", fn, (long long)n, (long long)c,
                            (long long)s, (long long)x->numel, (long long)gy->numel);
    if (gx && (count <= 0 || !sum_gy || !sum_gyxhat || sum_gy->numel != c ||
               sum_gyxhat->numel != c))
        return na_set_error(NA_EINVAL, "%s: gx needs the sums over %lld channels and a count "
                            "> 0 (%lld)", fn, (long long)c, (long long)count);
    /* f32, f64, f16 y: y > 0 exactly where the pre-ReLU value is above a threshold (bf16 is
     * left out: some conversions flush f32 subnormals to 0, others round them) */
    bool ok = x->dtype == NA_DTYPE_F32 || x->dtype == NA_DTYPE_F64 || x->dtype == NA_DTYPE_F16;
    if (!ok || gy->dtype != x->dtype || (gx && gx->dtype != x->dtype)) return NA_OK;
    *done = true;
    sbn_job j = {.x = x, .gy = gy, .gamma = gamma, .beta = beta, .mean = mean, .var = var,
                 .invstd = invstd, .sg = sum_gy, .sgx = sum_gyxhat, .gx = gx, .gg = ggamma,
                 .gb = gbeta, .eps = eps, .count = count, .n = n, .c = c, .s = s};
    j.tasks = na_cpu_split(x->numel, (int64_t)1 << 15, c < 32 ? c : 32);
    na_cpu_parallel_for(c ? j.tasks : 0, sbn_task, &j);
    return NA_OK;
}
