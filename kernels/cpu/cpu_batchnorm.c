/* kernels/cpu/cpu_batchnorm.c — batch normalization over x viewed as [N, C, S].
 *
 * Per channel, with M = N*S, computed in f32 (f64 when x is f64):
 *   train    mean = sum(x)/M, var = sum((x-mean)^2)/M (two passes), invstd = 1/sqrt(var+eps)
 *            y = (x - mean) * (invstd * gamma) + beta
 *            running_mean = (1-momentum)*running_mean + momentum*mean
 *            running_var  = (1-momentum)*running_var  + momentum*var*M/(M-1)  (var when M == 1)
 *   eval     the same y with running_mean and 1/sqrt(running_var + eps)
 *   backward xhat = (x - mean)*invstd; ggamma = sum(gy*xhat); gbeta = sum(gy);
 *            train: gx = (gy - gbeta/M - xhat*ggamma/M) * (invstd * gamma)
 *            eval:  gx = gy * (invstd * gamma)
 * Sums are pairwise within each (n, c) row and pairwise across the N rows. gamma/beta NULL
 * mean 1/0. Parameters and statistics may be of any float dtype (f32 normally, f64 for f64 x).
 */
#include "cpu/cpu_internal.h"

static double param(const na_view *t, int64_t i, double dflt) {
    return t ? na_cpu_get(t->dtype, t->data, i) : dflt;
}

static void set_param(na_view *t, int64_t i, double v) {
    if (t) na_cpu_set(t->dtype, t->data, i, v);
}

#define NA_CPU_DEFINE_BN(T, SFX, SQRT)                                                      \
    /* sum over the channel's N rows of f(x) (and of f(x, gy) when gy is given) */          \
    static T chan_sum_##SFX(const na_view *x, int64_t n, int64_t c, int64_t s, int64_t ch) { \
        na_cpu_psum_##SFX acc = {{0}, 0};                                                   \
        for (int64_t ni = 0; ni < n; ni++)                                                  \
            na_cpu_psum_add_##SFX(&acc, na_cpu_sum_any_##SFX(x->dtype, x->data,             \
                                                             (ni * c + ch) * s, s));        \
        return na_cpu_psum_total_##SFX(&acc);                                               \
    }                                                                                       \
    static T chan_sqdev_##SFX(const na_view *x, int64_t n, int64_t c, int64_t s,            \
                              int64_t ch, T mean) {                                         \
        T buf[NA_CPU_CHUNK], t[NA_CPU_CHUNK];                                               \
        na_cpu_psum_##SFX acc = {{0}, 0};                                                   \
        for (int64_t ni = 0; ni < n; ni++)                                                  \
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                                 \
                int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;                  \
                const T *v = na_cpu_view_##SFX(x->dtype, x->data, (ni * c + ch) * s + o, cnt, buf); \
                for (int64_t i = 0; i < cnt; i++) t[i] = (v[i] - mean) * (v[i] - mean);     \
                na_cpu_psum_add_##SFX(&acc, na_cpu_sum_##SFX(t, cnt));                      \
            }                                                                               \
        return na_cpu_psum_total_##SFX(&acc);                                               \
    }                                                                                       \
    /* y = (x - mean) * scale + shift over the channel */                                   \
    static void chan_affine_##SFX(const na_view *x, na_view *y, int64_t n, int64_t c,       \
                                  int64_t s, int64_t ch, T mean, T scale, T shift) {        \
        T buf[NA_CPU_CHUNK], ob[NA_CPU_CHUNK];                                              \
        for (int64_t ni = 0; ni < n; ni++)                                                  \
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                                 \
                int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;                  \
                int64_t off = (ni * c + ch) * s + o;                                        \
                const T *v = na_cpu_view_##SFX(x->dtype, x->data, off, cnt, buf);           \
                T *out = na_cpu_out_##SFX(y->dtype, y->data, off, ob);                      \
                for (int64_t i = 0; i < cnt; i++) out[i] = (v[i] - mean) * scale + shift;   \
                na_cpu_store_##SFX(y->dtype, y->data, off, cnt, out);                       \
            }                                                                               \
    }                                                                                       \
    static void bn_train_##SFX(const na_view *x, const na_view *gamma,                      \
                               const na_view *beta, na_view *rm, na_view *rv,               \
                               na_view *y, na_view *sm, na_view *si, int64_t n,             \
                               int64_t c, int64_t s, T momentum, T eps) {                   \
        int64_t M = n * s;                                                                  \
        for (int64_t ch = 0; ch < c; ch++) {                                                \
            T mean = chan_sum_##SFX(x, n, c, s, ch) / (T)M;                                 \
            T var = chan_sqdev_##SFX(x, n, c, s, ch, mean) / (T)M;                          \
            T invstd = (T)1 / SQRT(var + eps);                                              \
            T scale = invstd * (T)param(gamma, ch, 1), shift = (T)param(beta, ch, 0);       \
            chan_affine_##SFX(x, y, n, c, s, ch, mean, scale, shift);                       \
            set_param(sm, ch, mean);                                                        \
            set_param(si, ch, invstd);                                                      \
            if (rm) set_param(rm, ch, ((T)1 - momentum) * (T)param(rm, ch, 0) + momentum * mean); \
            if (rv) {                                                                       \
                T unbiased = M > 1 ? var * ((T)M / (T)(M - 1)) : var;                       \
                set_param(rv, ch, ((T)1 - momentum) * (T)param(rv, ch, 0) + momentum * unbiased); \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    static void bn_eval_##SFX(const na_view *x, const na_view *gamma,                       \
                              const na_view *beta, const na_view *rm,                       \
                              const na_view *rv, na_view *y, int64_t n, int64_t c,          \
                              int64_t s, T eps) {                                           \
        for (int64_t ch = 0; ch < c; ch++) {                                                \
            T invstd = (T)1 / SQRT((T)param(rv, ch, 1) + eps);                              \
            T scale = invstd * (T)param(gamma, ch, 1), shift = (T)param(beta, ch, 0);       \
            chan_affine_##SFX(x, y, n, c, s, ch, (T)param(rm, ch, 0), scale, shift);        \
        }                                                                                   \
    }                                                                                       \
    static void bn_backward_##SFX(const na_view *x, const na_view *gy,                      \
                                  const na_view *gamma, const na_view *mean_t,              \
                                  const na_view *invstd_t, na_view *gx, na_view *gg,        \
                                  na_view *gb, int64_t n, int64_t c, int64_t s, bool train) { \
        T xb[NA_CPU_CHUNK], gb_[NA_CPU_CHUNK], t[NA_CPU_CHUNK], ob[NA_CPU_CHUNK];           \
        int64_t M = n * s;                                                                  \
        bool need_sums = train || gg || gb;                                                 \
        for (int64_t ch = 0; ch < c; ch++) {                                                \
            T mean = (T)param(mean_t, ch, 0), invstd = (T)param(invstd_t, ch, 1);           \
            T scale = invstd * (T)param(gamma, ch, 1);                                      \
            T sum_gy = 0, sum_gyxh = 0;                                                     \
            if (need_sums) {                                                                \
                na_cpu_psum_##SFX a1 = {{0}, 0}, a2 = {{0}, 0};                             \
                for (int64_t ni = 0; ni < n; ni++)                                          \
                    for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                         \
                        int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;          \
                        int64_t off = (ni * c + ch) * s + o;                                \
                        const T *xv = na_cpu_view_##SFX(x->dtype, x->data, off, cnt, xb);   \
                        const T *gv = na_cpu_view_##SFX(gy->dtype, gy->data, off, cnt, gb_); \
                        na_cpu_psum_add_##SFX(&a1, na_cpu_sum_##SFX(gv, cnt));              \
                        for (int64_t i = 0; i < cnt; i++) t[i] = gv[i] * ((xv[i] - mean) * invstd); \
                        na_cpu_psum_add_##SFX(&a2, na_cpu_sum_##SFX(t, cnt));               \
                    }                                                                       \
                sum_gy = na_cpu_psum_total_##SFX(&a1);                                      \
                sum_gyxh = na_cpu_psum_total_##SFX(&a2);                                    \
            }                                                                               \
            set_param(gg, ch, sum_gyxh);                                                    \
            set_param(gb, ch, sum_gy);                                                      \
            if (!gx) continue;                                                              \
            T mgy = sum_gy / (T)M, mgyxh = sum_gyxh / (T)M;                                 \
            for (int64_t ni = 0; ni < n; ni++)                                              \
                for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                             \
                    int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;              \
                    int64_t off = (ni * c + ch) * s + o;                                    \
                    const T *gv = na_cpu_view_##SFX(gy->dtype, gy->data, off, cnt, gb_);    \
                    T *out = na_cpu_out_##SFX(gx->dtype, gx->data, off, ob);                \
                    if (train) {                                                            \
                        const T *xv = na_cpu_view_##SFX(x->dtype, x->data, off, cnt, xb);   \
                        for (int64_t i = 0; i < cnt; i++)                                   \
                            out[i] = (gv[i] - mgy - ((xv[i] - mean) * invstd) * mgyxh) * scale; \
                    } else {                                                                \
                        for (int64_t i = 0; i < cnt; i++) out[i] = gv[i] * scale;           \
                    }                                                                       \
                    na_cpu_store_##SFX(gx->dtype, gx->data, off, cnt, out);                 \
                }                                                                           \
        }                                                                                   \
    }

NA_CPU_DEFINE_BN(float, f, sqrtf)
NA_CPU_DEFINE_BN(double, d, sqrt)

static int check_extent(const char *fn, const na_view *x, int64_t n, int64_t c, int64_t s) {
    if (n < 0 || c < 0 || s < 0 || n * c * s != x->numel)
        return na_set_error(NA_ESHAPE, "%s: [N, C, S] = [%lld, %lld, %lld] does not match x's "
                            "%lld elements", fn, (long long)n, (long long)c, (long long)s,
                            (long long)x->numel);
    return NA_OK;
}

int na_cpu_batch_norm_train(const na_view *x, const na_view *gamma, const na_view *beta,
                            na_view *running_mean, na_view *running_var, na_view *y,
                            na_view *save_mean, na_view *save_invstd, int64_t n, int64_t c,
                            int64_t s, double momentum, double eps) {
    const char *fn = "cpu_batch_norm_train";
    NA_CPU_CHECK_FLOAT(fn, x);
    NA_CPU_CHECK_FLOAT(fn, y);
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, beta);
    NA_CPU_CHECK_FLOAT(fn, running_mean);
    NA_CPU_CHECK_FLOAT(fn, running_var);
    NA_CPU_CHECK_FLOAT(fn, save_mean);
    NA_CPU_CHECK_FLOAT(fn, save_invstd);
    int st = check_extent(fn, x, n, c, s);
    if (st) return st;
    if (n * s == 0) return na_set_error(NA_EINVAL, "%s: no values per channel (N*S = 0)", fn);
    if (x->dtype == NA_DTYPE_F64)
        bn_train_d(x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd, n, c, s,
                   momentum, eps);
    else
        bn_train_f(x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd, n, c, s,
                   (float)momentum, (float)eps);
    return NA_OK;
}

int na_cpu_batch_norm_eval(const na_view *x, const na_view *gamma, const na_view *beta,
                           const na_view *running_mean, const na_view *running_var,
                           na_view *y, int64_t n, int64_t c, int64_t s, double eps) {
    const char *fn = "cpu_batch_norm_eval";
    NA_CPU_CHECK_FLOAT(fn, x);
    NA_CPU_CHECK_FLOAT(fn, y);
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, beta);
    NA_CPU_CHECK_FLOAT(fn, running_mean);
    NA_CPU_CHECK_FLOAT(fn, running_var);
    int st = check_extent(fn, x, n, c, s);
    if (st) return st;
    if (x->dtype == NA_DTYPE_F64)
        bn_eval_d(x, gamma, beta, running_mean, running_var, y, n, c, s, eps);
    else
        bn_eval_f(x, gamma, beta, running_mean, running_var, y, n, c, s, (float)eps);
    return NA_OK;
}

int na_cpu_batch_norm_backward(const na_view *x, const na_view *gy, const na_view *gamma,
                               const na_view *mean, const na_view *invstd, na_view *gx,
                               na_view *ggamma, na_view *gbeta, int64_t n, int64_t c,
                               int64_t s, bool train) {
    const char *fn = "cpu_batch_norm_backward";
    NA_CPU_CHECK_FLOAT(fn, x);
    NA_CPU_CHECK_FLOAT(fn, gy);
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, mean);
    NA_CPU_CHECK_FLOAT(fn, invstd);
    NA_CPU_CHECK_FLOAT(fn, gx);
    NA_CPU_CHECK_FLOAT(fn, ggamma);
    NA_CPU_CHECK_FLOAT(fn, gbeta);
    int st = check_extent(fn, x, n, c, s);
    if (st) return st;
    if (x->dtype == NA_DTYPE_F64)
        bn_backward_d(x, gy, gamma, mean, invstd, gx, ggamma, gbeta, n, c, s, train);
    else
        bn_backward_f(x, gy, gamma, mean, invstd, gx, ggamma, gbeta, n, c, s, train);
    return NA_OK;
}
