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
 *            elemt: the train gx with given sums over a given count (SyncBatchNorm: over
 *            all ranks), one pass (na_bn_grad, common/bn_stats.h, as every gx above)
 *   train with y NULL: the statistics only
 *   relu     (BatchNorm + ReLU fused) y = relu(y) as it is stored; backward takes the fused
 *            output y and uses gy * relu'(y) for gy: ReLU's own expressions (the RELU row of
 *            common/elementwise_ops.h, written out so the loops vectorize), so fused and
 *            unfused f32 results are bit-identical (tests/test_ops.c checks it).
 * Sums are pairwise within each (n, c) row and pairwise across the N rows. Channels are
 * split over the thread pool, each computed whole by one thread. f16/bf16 operands are read
 * in place and converted in registers where the CPU has AVX-512F/BW/VL (the half loops below,
 * bn_half_ok), or 8 lanes at a time where it has AVX2 + F16C (bn_half_avx2_ok,
 * na_cpu_half_avx2); elsewhere, and with na_cpu_half512_off, widened once per channel
 * (bn_rows) rather than once per pass, the same bits either way. The forward of all-f32 operands takes
 * the same AVX-512 loops, the same bits as the f32 loops. On AVX2 + F16C without those
 * (na_cpu_bn_order) the training backward walks memory in its order, a block of channels
 * image by image (bn_backward_o), and the forward takes the 8-lane loops for every kind:
 * the same bits again. gamma/beta NULL
 * mean 1/0. Parameters and statistics may be of any float dtype (f32 normally, f64 for f64 x).
 *
 * The f32 loops are built twice, for the baseline x86-64 (SSE2) and for AVX2 (chosen at run
 * time): twice the vector width took the CNN's BatchNorm+ReLU backward from 5.8-5.95 to
 * 4.3 ms on its first layer (na-kbench bn, one thread). Without FMA, so that nothing is
 * contracted: both builds compute the same operations in the same order and give the same
 * bits (tests/test_cpu_kernels.c compares them).
 */

#include "common/bn_stats.h"
#include "cpu/cpu_half_simd.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_parallel.h"

bool na_cpu_bn_order_off = false;
bool na_cpu_bn_order(void) {
#ifdef NA_CPU_HALF_SIMD
    static _Atomic int env_off = -1;
    return !na_cpu_bn_order_off && !na_cpu_env_is(&env_off, "NANOAMP_CPU_BN_ORDER", "off") &&
           !na_cpu_half512_off && na_cpu_use_avx2() && na_cpu_convert_is_fast() &&
           (na_cpu_half_avx2_prefer || !na_cpu_half512());
#else
    return false;
#endif
}

static double param(const na_view *t, int64_t i, double dflt) {
    return t ? na_cpu_get(t->dtype, t->data, i) : dflt;
}

static void set_param(na_view *t, int64_t i, double v) {
    if (t) na_cpu_set(t->dtype, t->data, i, v);
}

/* A channel's N rows of one operand: row ni's elements start at v[base + ni*stride]. Half
 * operands are widened once per channel into a buffer (stride S), so that the two or three
 * passes over a channel convert nothing more; f32/f64 ones are read in place (stride C*S). */
typedef struct {
    na_view v;
    int64_t base, stride;
} bn_rows;

/* the cache lines of row ni's first n elements, fetched ahead: a channel's rows are short and
 * C*S apart, so the hardware prefetchers start each row cold (prefetches change no result) */
static inline void row_prefetch(const bn_rows *r, int64_t ni, int64_t n) {
    if (!r->v.data) return;
    size_t es = na_dtype_size(r->v.dtype);
    const char *a = (const char *)r->v.data + (size_t)(r->base + ni * r->stride) * es;
    const char *e = a + (size_t)n * es;
    for (; a < e; a += 64) __builtin_prefetch(a);
    __builtin_prefetch(e - 1);
}

#define NA_CPU_DEFINE_BN(T, SFX, NAME, DT)                                                  \
    /* channel ch of v [n, c, s] as rows: widened into buf (n*s of T) when v is not of T    \
     * and buf is given, else in place (read chunk by chunk, converting, when not of T) */  \
    static bn_rows rows_##NAME(const na_view *v, int64_t n, int64_t c, int64_t s, int64_t ch, \
                              T *buf) {                                                     \
        bn_rows r = {.base = ch * s, .stride = c * s};                                      \
        if (!v) return r;                                                                   \
        r.v = *v;                                                                           \
        if (v->dtype == DT || !buf) return r;                                               \
        for (int64_t ni = 0; ni < n; ni++)                                                  \
            na_cpu_load_##SFX(v->dtype, v->data, (ni * c + ch) * s, s, buf + ni * s);       \
        r.v.dtype = DT;                                                                     \
        r.v.data = buf;                                                                     \
        r.base = 0;                                                                         \
        r.stride = s;                                                                       \
        return r;                                                                           \
    }                                                                                       \
    /* sum over the channel's N rows, each row in the order na_cpu_sum_any takes for x's own \
     * dtype (a widened half row: pairwise within chunks, chunks by a pairwise counter) */  \
    static T chan_sum_##NAME(const bn_rows *x, na_dtype orig, int64_t n, int64_t s) {       \
        na_cpu_psum_##SFX acc = {{0}, 0};                                                   \
        for (int64_t ni = 0; ni < n; ni++) {                                                \
            int64_t off = x->base + ni * x->stride;                                         \
            const T *row = (const T *)x->v.data + off;                                      \
            if (x->v.dtype == orig || s <= NA_CPU_CHUNK) {                                  \
                na_cpu_psum_add_##SFX(&acc, na_cpu_sum_any_##SFX(x->v.dtype, x->v.data, off, s)); \
                continue;                                                                   \
            }                                                                               \
            na_cpu_psum_##SFX r = {{0}, 0};                                                 \
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK)                                   \
                na_cpu_psum_add_##SFX(&r, na_cpu_sum_##SFX(row + o, s - o < NA_CPU_CHUNK    \
                                                                        ? s - o : NA_CPU_CHUNK)); \
            na_cpu_psum_add_##SFX(&acc, na_cpu_psum_total_##SFX(&r));                       \
        }                                                                                   \
        return na_cpu_psum_total_##SFX(&acc);                                               \
    }                                                                                       \
    static T chan_sqdev_##NAME(const bn_rows *x, int64_t n, int64_t s, T mean) {            \
        T buf[NA_CPU_CHUNK], t[NA_CPU_CHUNK];                                               \
        na_cpu_psum_##SFX acc = {{0}, 0};                                                   \
        for (int64_t ni = 0; ni < n; ni++)                                                  \
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                                 \
                int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;                  \
                const T *v = na_cpu_view_##SFX(x->v.dtype, x->v.data,                       \
                                               x->base + ni * x->stride + o, cnt, buf);     \
                for (int64_t i = 0; i < cnt; i++) t[i] = (v[i] - mean) * (v[i] - mean);     \
                na_cpu_psum_add_##SFX(&acc, na_cpu_sum_##SFX(t, cnt));                      \
            }                                                                               \
        return na_cpu_psum_total_##SFX(&acc);                                               \
    }                                                                                       \
    /* y = (x - mean) * scale + shift over the channel, then relu when asked */             \
    static void chan_affine_##NAME(const bn_rows *x, na_view *y, int64_t n, int64_t c,      \
                                  int64_t s, int64_t ch, T mean, T scale, T shift,          \
                                  bool relu) {                                              \
        T buf[NA_CPU_CHUNK], ob[NA_CPU_CHUNK];                                              \
        for (int64_t ni = 0; ni < n; ni++)                                                  \
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                                 \
                int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;                  \
                int64_t off = (ni * c + ch) * s + o;                                        \
                const T *v = na_cpu_view_##SFX(x->v.dtype, x->v.data,                       \
                                               x->base + ni * x->stride + o, cnt, buf);     \
                T *out = na_cpu_out_##SFX(y->dtype, y->data, off, ob);                      \
                for (int64_t i = 0; i < cnt; i++) out[i] = (v[i] - mean) * scale + shift;   \
                if (relu)                                                                   \
                    for (int64_t i = 0; i < cnt; i++)                                       \
                        out[i] = NA_RELU(T, out[i]);                                        \
                na_cpu_store_##SFX(y->dtype, y->data, off, cnt, out);                       \
            }                                                                               \
    }                                                                                       \
    static void bn_train_##NAME(const na_view *x, const na_view *gamma,                     \
                               const na_view *beta, na_view *rm, na_view *rv,               \
                               na_view *y, na_view *sm, na_view *si, int64_t n,             \
                               int64_t c, int64_t s, T momentum, T eps, bool relu,          \
                               int64_t c0, int64_t c1, T *xw) {                             \
        int64_t M = n * s;                                                                  \
        for (int64_t ch = c0; ch < c1; ch++) {                                              \
            bn_rows xr = rows_##NAME(x, n, c, s, ch, xw);                                   \
            T mean = chan_sum_##NAME(&xr, x->dtype, n, s) / (T)M;                           \
            T var = chan_sqdev_##NAME(&xr, n, s, mean) / (T)M;                              \
            T invstd = na_bn_invstd_##SFX(var, eps);                                        \
            T scale = invstd * (T)param(gamma, ch, 1), shift = (T)param(beta, ch, 0);       \
            if (y) chan_affine_##NAME(&xr, y, n, c, s, ch, mean, scale, shift, relu);       \
            set_param(sm, ch, mean);                                                        \
            set_param(si, ch, invstd);                                                      \
            T rmean = (T)param(rm, ch, 0), rvar = (T)param(rv, ch, 1);                      \
            if (rm) set_param(rm, ch, na_bn_running_mean_##SFX(rmean, mean, momentum));     \
            if (rv) set_param(rv, ch, na_bn_running_var_##SFX(rvar, var, M, momentum));     \
        }                                                                                   \
    }                                                                                       \
    static void bn_eval_##NAME(const na_view *x, const na_view *gamma,                      \
                              const na_view *beta, const na_view *rm,                       \
                              const na_view *rv, na_view *y, int64_t n, int64_t c,          \
                              int64_t s, T eps, bool relu, int64_t c0, int64_t c1) {        \
        for (int64_t ch = c0; ch < c1; ch++) {                                              \
            T invstd = na_bn_invstd_##SFX((T)param(rv, ch, 1), eps);                        \
            T scale = invstd * (T)param(gamma, ch, 1), shift = (T)param(beta, ch, 0);       \
            bn_rows xr = rows_##NAME(x, n, c, s, ch, NULL);                                 \
            chan_affine_##NAME(&xr, y, n, c, s, ch, (T)param(rm, ch, 0), scale, shift, relu); \
        }                                                                                   \
    }                                                                                       \
    /* gy * relu'(y) when y is given (NA_RELU_GRAD: 0 where y <= 0), else gy */             \
    static inline T masked_gy_##NAME(const T *g, const T *y, int64_t i) {                   \
        return y ? g[i] * NA_RELU_GRAD(T, y[i]) : g[i];                                     \
    }                                                                                       \
    /* (sum of gm, sum of gm * xhat) over n values, gm = masked_gy: the order of            \
     * na_cpu_sum (8 lanes, pairwise above 128) for each, in one pass with no buffers */    \
    static void dual_sum_##NAME(const T *g, const T *y, const T *x, T mean, T invstd,       \
                               int64_t n, T *s1, T *s2) {                                   \
        if (n > 128) {                                                                      \
            int64_t h = (n / 2 + 7) & ~(int64_t)7;                                          \
            T a1, a2, b1, b2;                                                               \
            dual_sum_##NAME(g, y, x, mean, invstd, h, &a1, &a2);                            \
            dual_sum_##NAME(g + h, y ? y + h : NULL, x + h, mean, invstd, n - h, &b1, &b2); \
            *s1 = a1 + b1;                                                                  \
            *s2 = a2 + b2;                                                                  \
            return;                                                                         \
        }                                                                                   \
        /* lane j of each 8-wide vector is acc[j] of na_cpu_sum: the same order */          \
        typedef T v8 __attribute__((vector_size(8 * sizeof(T))));                           \
        v8 zero = {0}, va1 = zero, va2 = zero, vm = zero + mean, vs = zero + invstd;        \
        int64_t i = 0;                                                                      \
        for (; i + 8 <= n; i += 8) {                                                        \
            v8 gv, xv;                                                                      \
            memcpy(&gv, g + i, sizeof gv);                                                  \
            memcpy(&xv, x + i, sizeof xv);                                                  \
            if (y) {                                                                        \
                v8 yv;                                                                      \
                memcpy(&yv, y + i, sizeof yv);                                              \
                gv = gv * __builtin_convertvector(~(yv <= zero) & 1, v8); /* NA_RELU_GRAD */ \
            }                                                                               \
            va1 += gv;                                                                      \
            va2 += gv * ((xv - vm) * vs);                                                   \
        }                                                                                   \
        T acc1[8], acc2[8];                                                                 \
        memcpy(acc1, &va1, sizeof acc1);                                                    \
        memcpy(acc2, &va2, sizeof acc2);                                                    \
        T t1 = NA_CPU_LANES8_TOTAL(acc1);                                                   \
        T t2 = NA_CPU_LANES8_TOTAL(acc2);                                                   \
        for (; i < n; i++) {                                                                \
            T gm = masked_gy_##NAME(g, y, i);                                               \
            t1 += gm;                                                                       \
            t2 += gm * ((x[i] - mean) * invstd);                                            \
        }                                                                                   \
        *s1 = t1;                                                                           \
        *s2 = t2;                                                                           \
    }                                                                                       \
    /* cnt elements of rows r at row ni, offset o: in place, widened, or converted into buf */ \
    static inline const T *row_##NAME(const bn_rows *r, int64_t ni, int64_t o, int64_t cnt, \
                                     T *buf) {                                              \
        if (!r->v.data) return NULL;                                                        \
        return na_cpu_view_##SFX(r->v.dtype, r->v.data, r->base + ni * r->stride + o, cnt, buf); \
    }                                                                                       \
    /* channel ch's gx: train, (gm - mgy - xhat*mgyxh) * scale (na_bn_grad); eval,         \
     * gm * scale; gm = gy * relu'(y) where y's rows are given, else gy */                  \
    static void chan_gx_##NAME(const bn_rows *xr, const bn_rows *gr, const bn_rows *yr,     \
                              na_view *gx, int64_t n, int64_t c, int64_t s, int64_t ch,     \
                              T mean, T invstd, T scale, T mgy, T mgyxh, bool train) {      \
        T xb[NA_CPU_CHUNK], gb_[NA_CPU_CHUNK], ob[NA_CPU_CHUNK], yb[NA_CPU_CHUNK];          \
        for (int64_t ni = 0; ni < n; ni++)                                                  \
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                                 \
                int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;                  \
                int64_t off = (ni * c + ch) * s + o;                                        \
                const T *gv = row_##NAME(gr, ni, o, cnt, gb_);                              \
                const T *yv = row_##NAME(yr, ni, o, cnt, yb);                               \
                T *out = na_cpu_out_##SFX(gx->dtype, gx->data, off, ob);                    \
                if (train) {                                                                \
                    const T *xv = row_##NAME(xr, ni, o, cnt, xb);                           \
                    if (yv)                                                                 \
                        for (int64_t i = 0; i < cnt; i++)                                   \
                            out[i] = na_bn_grad_##SFX(gv[i] * (yv[i] > (T)0 ? (T)1 : (T)0), \
                                                      xv[i], mean, invstd, mgy, mgyxh, scale); \
                    else                                                                    \
                        for (int64_t i = 0; i < cnt; i++)                                   \
                            out[i] = na_bn_grad_##SFX(gv[i], xv[i], mean, invstd, mgy, mgyxh, \
                                                      scale);                               \
                } else if (yv) {                                                            \
                    for (int64_t i = 0; i < cnt; i++)                                       \
                        out[i] = gv[i] * (yv[i] > (T)0 ? (T)1 : (T)0) * scale;              \
                } else {                                                                    \
                    for (int64_t i = 0; i < cnt; i++) out[i] = gv[i] * scale;               \
                }                                                                           \
                na_cpu_store_##SFX(gx->dtype, gx->data, off, cnt, out);                     \
            }                                                                               \
    }                                                                                       \
    static void bn_backward_##NAME(const na_view *x, const na_view *gy,                     \
                                  const na_view *relu_y, const na_view *gamma,              \
                                  const na_view *mean_t, const na_view *invstd_t,           \
                                  na_view *gx, na_view *gg, na_view *gb, int64_t n,         \
                                  int64_t c, int64_t s, bool train, int64_t c0,             \
                                  int64_t c1, T *xw, T *gw) {                               \
        T xb[NA_CPU_CHUNK], gb_[NA_CPU_CHUNK], yb[NA_CPU_CHUNK];                            \
        int64_t M = n * s;                                                                  \
        bool need_sums = train || gg || gb;                                                 \
        for (int64_t ch = c0; ch < c1; ch++) {                                              \
            T mean = (T)param(mean_t, ch, 0), invstd = (T)param(invstd_t, ch, 1);           \
            T scale = invstd * (T)param(gamma, ch, 1);                                      \
            T sum_gy = 0, sum_gyxh = 0;                                                     \
            bn_rows xr = rows_##NAME(x, n, c, s, ch, xw), gr = rows_##NAME(gy, n, c, s, ch, gw); \
            bn_rows yr = rows_##NAME(relu_y, n, c, s, ch, NULL);                            \
            if (relu_y && gr.v.data == gw) { /* widened gy: ReLU's mask applied once, here */ \
                for (int64_t ni = 0; ni < n; ni++)                                          \
                    for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                         \
                        int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;          \
                        T *g = gw + ni * s + o;                                             \
                        const T *yv = row_##NAME(&yr, ni, o, cnt, yb);                      \
                        for (int64_t i = 0; i < cnt; i++)                                   \
                            g[i] = g[i] * NA_RELU_GRAD(T, yv[i]);                           \
                    }                                                                       \
                yr.v.data = NULL; /* gy now holds gy * relu'(y) */                          \
            }                                                                               \
            if (need_sums) {                                                                \
                na_cpu_psum_##SFX a1 = {{0}, 0}, a2 = {{0}, 0};                             \
                for (int64_t ni = 0; ni < n; ni++)                                          \
                    for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {                         \
                        int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;          \
                        if (ni + 1 < n && o == 0) {                                         \
                            int64_t pn = s < NA_CPU_CHUNK ? s : NA_CPU_CHUNK;               \
                            row_prefetch(&xr, ni + 1, pn);                                  \
                            row_prefetch(&gr, ni + 1, pn);                                  \
                            row_prefetch(&yr, ni + 1, pn);                                  \
                        }                                                                   \
                        const T *xv = row_##NAME(&xr, ni, o, cnt, xb);                      \
                        const T *gv = row_##NAME(&gr, ni, o, cnt, gb_);                     \
                        const T *yv = row_##NAME(&yr, ni, o, cnt, yb);                      \
                        T s1, s2;                                                           \
                        dual_sum_##NAME(gv, yv, xv, mean, invstd, cnt, &s1, &s2);           \
                        na_cpu_psum_add_##SFX(&a1, s1);                                     \
                        na_cpu_psum_add_##SFX(&a2, s2);                                     \
                    }                                                                       \
                sum_gy = na_cpu_psum_total_##SFX(&a1);                                      \
                sum_gyxh = na_cpu_psum_total_##SFX(&a2);                                    \
            }                                                                               \
            set_param(gg, ch, sum_gyxh);                                                    \
            set_param(gb, ch, sum_gy);                                                      \
            if (!gx) continue;                                                              \
            chan_gx_##NAME(&xr, &gr, &yr, gx, n, c, s, ch, mean, invstd, scale,            \
                           sum_gy / (T)M, sum_gyxh / (T)M, train);                          \
        }                                                                                   \
    }                                                                                       \
    /* gx from given sums over count values (batch_norm_backward_elemt): one pass, nothing  \
     * widened */                                                                           \
    static void bn_backward_elemt_##NAME(const na_view *x, const na_view *gy,               \
                                        const na_view *relu_y, const na_view *gamma,        \
                                        const na_view *mean_t, const na_view *invstd_t,     \
                                        const na_view *sg, const na_view *sgx, int64_t count, \
                                        na_view *gx, int64_t n, int64_t c, int64_t s,       \
                                        int64_t c0, int64_t c1) {                           \
        for (int64_t ch = c0; ch < c1; ch++) {                                              \
            T mean = (T)param(mean_t, ch, 0), invstd = (T)param(invstd_t, ch, 1);           \
            bn_rows xr = rows_##NAME(x, n, c, s, ch, NULL), gr = rows_##NAME(gy, n, c, s, ch, NULL); \
            bn_rows yr = rows_##NAME(relu_y, n, c, s, ch, NULL);                            \
            chan_gx_##NAME(&xr, &gr, &yr, gx, n, c, s, ch, mean, invstd,                    \
                           invstd * (T)param(gamma, ch, 1), (T)param(sg, ch, 0) / (T)count, \
                           (T)param(sgx, ch, 0) / (T)count, true);                          \
        }                                                                                   \
    }

NA_CPU_DEFINE_BN(float, f, f, NA_DTYPE_F32)
NA_CPU_DEFINE_BN(double, d, d, NA_DTYPE_F64)

/* The AVX2 build of the f32 loops (GCC on x86-64; clang and other targets keep the baseline).
 * The compiler clears the upper register halves at every return and call out of these
 * functions (tests/avx_upper_state.py checks the library for exits that do not). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2")
NA_CPU_DEFINE_BN(float, f, f_avx2, NA_DTYPE_F32)
#pragma GCC pop_options

/* f32 compute through the AVX2 build where the CPU has it */
#define NA_BN_F32(name, ...) (na_cpu_use_avx2() ? name##_f_avx2 : name##_f)(__VA_ARGS__)
#else
#define NA_BN_F32(name, ...) name##_f(__VA_ARGS__)
#endif

/* ---- the split over the pool: ranges of channels, each channel computed as on one thread ---- */

enum { BN_TRAIN, BN_EVAL, BN_BACKWARD, BN_ELEMT };
#define NA_CPU_BN_TASK_ELEMS ((int64_t)1 << 15) /* elements per task worth a wake-up */
enum { NA_CPU_BN_TASKS = 32 };

typedef struct {
    int kind;
    bool f64, train, relu;
    const na_view *x, *gy, *relu_y, *gamma, *beta, *mean, *invstd;
    const na_view *eval_rm, *eval_rv; /* the running statistics eval normalizes with */
    const na_view *sum_gy, *sum_gyxh; /* elemt: the given sums over count values */
    int64_t count;
    na_view *rm, *rv, *y, *gx, *gg, *gb, *sm, *si;
    int64_t n, c, s, tasks;
    double momentum, eps;
    float *oq;   /* the memory-order backward's gx constants, 5 per channel (bn_backward_o) */
    bool o_rows; /* its gx pass: tasks over rows */
} bn_job;

/* A buffer to widen one channel of v into (bn_rows), when v is not of the compute type and
 * the channel holds at most 4M elements; NULL: v is read and converted chunk by chunk. */
static void *widen_buffer(int slot, const na_view *v, bool f64, int64_t n, int64_t s) {
    na_dtype dt = f64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    if (!v || v->dtype == dt || n * s > ((int64_t)1 << 22)) return NULL;
    return na_cpu_scratch(slot, (size_t)(n * s) * (f64 ? sizeof(double) : sizeof(float)),
                          "cpu_batch_norm");
}

/* ---- f16/bf16 operands read in place (AVX-512F/BW/VL, na_cpu_half512) ---------------------
 * The f32 loops above widen a half channel into a row buffer (or chunk buffers) and then read
 * the buffer: a conversion pass, then f32 traffic. These read the halves themselves, 16 (or,
 * in the sums, 8) at a time, converting in registers (cpu_half_simd.h), and round the outputs
 * in registers. The same operations in the same order as the f32 loops over the widened
 * buffer, so the same bits (tests/test_cpu_kernels.c compares them with na_cpu_half512_off):
 * the sums keep na_cpu_sum_f's 8 accumulators and pairwise split, the chunks and the pairwise
 * counters; ReLU's gradient is NA_RELU_GRAD as the widened gy buffer applies it (1 where y is
 * NaN). FMA is available to the compiler here (AVX-512F), so each product that an addition
 * follows goes through NA_NOFUSE: nothing is contracted, as in the f32 builds. */
#ifdef NA_CPU_HALF_SIMD
#define NA_NOFUSE(v) __asm__("" : "+v"(v))
enum { HK_NONE = -1, HK_F32, HK_F16, HK_BF16 };

/* operand kinds these loops read and write; HK_NONE: not one of f32, f16, bf16 */
static int hkind(const na_view *v) {
    if (!v) return HK_F32;
    switch (v->dtype) {
    case NA_DTYPE_F32: return HK_F32;
    case NA_DTYPE_F16: return HK_F16;
    case NA_DTYPE_BF16: return HK_BF16;
    default: return HK_NONE;
    }
}

NA_HALF512 static inline __m512 hload16(const void *p, int k, int64_t i, __mmask16 m) {
    if (k == HK_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    return na_h512_load(k == HK_F16, (const uint16_t *)p + i, m);
}
NA_HALF512 static inline __m256 hload8(const void *p, int k, int64_t i, __mmask8 m) {
    if (k == HK_F32) return _mm256_maskz_loadu_ps(m, (const float *)p + i);
    return na_h256_load(k == HK_F16, (const uint16_t *)p + i, m);
}
NA_HALF512 static inline void hstore16(void *p, int k, int64_t i, __mmask16 m, __m512 v) {
    if (k == HK_F32) _mm512_mask_storeu_ps((float *)p + i, m, v);
    else na_h512_store(k == HK_F16, (uint16_t *)p + i, m, v);
}
NA_HALF512 static inline float hsum8(__m256 v) {
    float a[8];
    _mm256_storeu_ps(a, v);
    return NA_CPU_LANES8_TOTAL(a);
}
static inline __mmask8 hmask8(int64_t n) { return (__mmask8)(n >= 8 ? 0xFFu : (1u << n) - 1u); }

/* the cache lines of elements [off, off+n) of p (kind k), fetched ahead: a channel's rows are
 * short and far apart (N rows at a stride of C*S), so the hardware prefetchers start each row
 * cold */
static inline void hprefetch(const void *p, int k, int64_t off, int64_t n) {
    if (!p) return;
    size_t es = k == HK_F32 ? 4 : 2;
    const char *a = (const char *)p + (size_t)off * es, *e = a + (size_t)n * es;
    for (; a < e; a += 64) __builtin_prefetch(a);
    __builtin_prefetch(e - 1);
}
/* the same for a row about to be written */
static inline void hprefetch_w(void *p, int k, int64_t off, int64_t n) {
    if (!p) return;
    size_t es = k == HK_F32 ? 4 : 2;
    char *a = (char *)p + (size_t)off * es, *e = a + (size_t)n * es;
    for (; a < e; a += 64) __builtin_prefetch(a, 1);
    __builtin_prefetch(e - 1, 1);
}

/* na_cpu_sum_f of (x - mean)^2 over x[off..off+n), as chan_sqdev sums its chunk buffer */
NA_HALF512 static float hsum_sqdev(const void *x, int kx, int64_t off, int64_t n, float mean) {
    if (n > 128) {
        int64_t h = (n / 2 + 7) & ~(int64_t)7;
        return hsum_sqdev(x, kx, off, h, mean) + hsum_sqdev(x, kx, off + h, n - h, mean);
    }
    __m256 acc = _mm256_setzero_ps(), vm = _mm256_set1_ps(mean);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(hload8(x, kx, off + i, 0xFF), vm);
        __m256 t = _mm256_mul_ps(d, d);
        NA_NOFUSE(t);
        acc = _mm256_add_ps(acc, t);
    }
    float s = hsum8(acc);
    if (i < n) {
        float t[8];
        __m256 d = _mm256_sub_ps(hload8(x, kx, off + i, hmask8(n - i)), vm);
        __m256 dd = _mm256_mul_ps(d, d);
        NA_NOFUSE(dd);
        _mm256_storeu_ps(t, dd);
        for (int64_t j = 0; j < n - i; j++) s += t[j];
    }
    return s;
}

/* gy * relu'(y) (NA_RELU_GRAD) when y is given, else gy: 8 lanes */
NA_HALF512 static inline __m256 hmasked8(__m256 g, const void *y, int ky, int64_t i, __mmask8 m) {
    if (!y) return g;
    __mmask8 le = _mm256_cmp_ps_mask(hload8(y, ky, i, m), _mm256_setzero_ps(), _CMP_LE_OQ);
    __m256 r = _mm256_mul_ps(g, _mm256_mask_mov_ps(_mm256_set1_ps(1), le, _mm256_setzero_ps()));
    NA_NOFUSE(r);
    return r;
}

/* dual_sum_f over gm = gy * relu'(y) and gm * xhat at [off, off+n): the same order */
NA_HALF512 static void hdual_sum(const void *g, int kg, const void *y, int ky, const void *x,
                                 int kx, int64_t off, int64_t n, float mean, float invstd,
                                 float *s1, float *s2) {
    if (n > 128) {
        int64_t h = (n / 2 + 7) & ~(int64_t)7;
        float a1, a2, b1, b2;
        hdual_sum(g, kg, y, ky, x, kx, off, h, mean, invstd, &a1, &a2);
        hdual_sum(g, kg, y, ky, x, kx, off + h, n - h, mean, invstd, &b1, &b2);
        *s1 = a1 + b1;
        *s2 = a2 + b2;
        return;
    }
    __m256 va1 = _mm256_setzero_ps(), va2 = va1, vm = _mm256_set1_ps(mean),
           vs = _mm256_set1_ps(invstd);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gm = hmasked8(hload8(g, kg, off + i, 0xFF), y, ky, off + i, 0xFF);
        __m256 p = _mm256_mul_ps(gm, _mm256_mul_ps(_mm256_sub_ps(hload8(x, kx, off + i, 0xFF), vm),
                                                   vs));
        NA_NOFUSE(p);
        va1 = _mm256_add_ps(va1, gm);
        va2 = _mm256_add_ps(va2, p);
    }
    float t1 = hsum8(va1), t2 = hsum8(va2);
    if (i < n) {
        __mmask8 m = hmask8(n - i);
        float a[8], b[8];
        __m256 gm = hmasked8(hload8(g, kg, off + i, m), y, ky, off + i, m);
        _mm256_storeu_ps(a, gm);
        __m256 p = _mm256_mul_ps(gm, _mm256_mul_ps(_mm256_sub_ps(hload8(x, kx, off + i, m), vm),
                                                   vs));
        NA_NOFUSE(p);
        _mm256_storeu_ps(b, p);
        for (int64_t j = 0; j < n - i; j++) {
            t1 += a[j];
            t2 += b[j];
        }
    }
    *s1 = t1;
    *s2 = t2;
}

/* y[off..off+n) = (x - mean) * scale + shift, relu'd when asked (NA_RELU: NaN stays NaN) */
NA_HALF512 static void haffine(const void *x, int kx, void *y, int ky, int64_t off, int64_t n,
                               float mean, float scale, float shift, bool relu) {
    __m512 vm = _mm512_set1_ps(mean), vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(shift),
           zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = na_h512_mask(n - i);
        __m512 t = _mm512_mul_ps(_mm512_sub_ps(hload16(x, kx, off + i, m), vm), vs);
        NA_NOFUSE(t);
        t = _mm512_add_ps(t, vb);
        if (relu) t = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(t, zero, _CMP_LE_OQ), zero);
        hstore16(y, ky, off + i, m, t);
    }
}

/* channels [c0, c1) of bn_train_f with x of f32/f16/bf16 (bn_half_ok); y NULL: the statistics
 * only */
NA_HALF512 static void bn_train_h(const na_view *x, const na_view *gamma, const na_view *beta,
                                  na_view *rm, na_view *rv, na_view *y, na_view *sm,
                                  na_view *si, int64_t n, int64_t c, int64_t s, float momentum,
                                  float eps, bool relu, int64_t c0, int64_t c1) {
    int kx = hkind(x), ky = hkind(y);
    int64_t M = n * s;
    for (int64_t ch = c0; ch < c1; ch++) {
        /* chan_sum_f over the widened rows: na_cpu_sum_any_f's order per row */
        na_cpu_psum_f acc = {{0}, 0};
        for (int64_t ni = 0; ni < n; ni++) {
            if (ni + 1 < n)
                hprefetch(x->data, kx, ((ni + 1) * c + ch) * s,
                          s < NA_CPU_CHUNK ? s : NA_CPU_CHUNK);
            na_cpu_psum_add_f(&acc, na_cpu_sum_any_f(x->dtype, x->data, (ni * c + ch) * s, s));
        }
        float mean = na_cpu_psum_total_f(&acc) / (float)M;
        na_cpu_psum_f sq = {{0}, 0};
        for (int64_t ni = 0; ni < n; ni++)
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK)
                na_cpu_psum_add_f(&sq, hsum_sqdev(x->data, kx, (ni * c + ch) * s + o,
                                                  s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK,
                                                  mean));
        float var = na_cpu_psum_total_f(&sq) / (float)M;
        float invstd = na_bn_invstd_f(var, eps);
        float scale = invstd * (float)param(gamma, ch, 1), shift = (float)param(beta, ch, 0);
        for (int64_t ni = 0; y && ni < n; ni++) {
            if (ni + 1 < n && s <= NA_CPU_CHUNK)
                hprefetch_w(y->data, ky, ((ni + 1) * c + ch) * s, s);
            haffine(x->data, kx, y->data, ky, (ni * c + ch) * s, s, mean, scale, shift, relu);
        }
        set_param(sm, ch, mean);
        set_param(si, ch, invstd);
        float rmean = (float)param(rm, ch, 0), rvar = (float)param(rv, ch, 1);
        if (rm) set_param(rm, ch, na_bn_running_mean_f(rmean, mean, momentum));
        if (rv) set_param(rv, ch, na_bn_running_var_f(rvar, var, M, momentum));
    }
}

NA_HALF512 static void bn_eval_h(const na_view *x, const na_view *gamma, const na_view *beta,
                                 const na_view *rm, const na_view *rv, na_view *y, int64_t n,
                                 int64_t c, int64_t s, float eps, bool relu, int64_t c0,
                                 int64_t c1) {
    int kx = hkind(x), ky = hkind(y);
    for (int64_t ch = c0; ch < c1; ch++) {
        float invstd = na_bn_invstd_f((float)param(rv, ch, 1), eps);
        float scale = invstd * (float)param(gamma, ch, 1), shift = (float)param(beta, ch, 0);
        float mean = (float)param(rm, ch, 0);
        for (int64_t ni = 0; ni < n; ni++)
            haffine(x->data, kx, y->data, ky, (ni * c + ch) * s, s, mean, scale, shift, relu);
    }
}

/* channels [c0, c1) of bn_backward_f with gy of f16/bf16 and widened (bn_half_ok) */
NA_HALF512 static void bn_backward_h(const na_view *x, const na_view *gy, const na_view *relu_y,
                                     const na_view *gamma, const na_view *mean_t,
                                     const na_view *invstd_t, na_view *gx, na_view *gg,
                                     na_view *gb, int64_t n, int64_t c, int64_t s, bool train,
                                     int64_t c0, int64_t c1) {
    int kx = hkind(x), kg = hkind(gy), ky = hkind(relu_y), kgx = hkind(gx);
    const void *yp = relu_y ? relu_y->data : NULL;
    int64_t M = n * s;
    bool need_sums = train || gg || gb;
    for (int64_t ch = c0; ch < c1; ch++) {
        float mean = (float)param(mean_t, ch, 0), invstd = (float)param(invstd_t, ch, 1);
        float scale = invstd * (float)param(gamma, ch, 1);
        float sum_gy = 0, sum_gyxh = 0;
        if (need_sums) {
            na_cpu_psum_f a1 = {{0}, 0}, a2 = {{0}, 0};
            for (int64_t ni = 0; ni < n; ni++)
                for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {
                    float s1, s2;
                    if (ni + 1 < n && o == 0) {
                        int64_t nx = ((ni + 1) * c + ch) * s;
                        int64_t cnt = s < NA_CPU_CHUNK ? s : NA_CPU_CHUNK;
                        hprefetch(gy->data, kg, nx, cnt);
                        hprefetch(x->data, kx, nx, cnt);
                        hprefetch(yp, ky, nx, cnt);
                    }
                    hdual_sum(gy->data, kg, yp, ky, x->data, kx, (ni * c + ch) * s + o,
                              s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK, mean, invstd, &s1,
                              &s2);
                    na_cpu_psum_add_f(&a1, s1);
                    na_cpu_psum_add_f(&a2, s2);
                }
            sum_gy = na_cpu_psum_total_f(&a1);
            sum_gyxh = na_cpu_psum_total_f(&a2);
        }
        set_param(gg, ch, sum_gyxh);
        set_param(gb, ch, sum_gy);
        if (!gx) continue;
        /* chan_gx_f over the widened gy * relu'(y): na_bn_grad, or gm * scale */
        __m512 vm = _mm512_set1_ps(mean), vi = _mm512_set1_ps(invstd),
               vmg = _mm512_set1_ps(sum_gy / (float)M), vmx = _mm512_set1_ps(sum_gyxh / (float)M),
               vs = _mm512_set1_ps(scale), zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1);
        for (int64_t ni = 0; ni < n; ni++) {
            int64_t off = (ni * c + ch) * s;
            if (ni + 1 < n && s <= NA_CPU_CHUNK) hprefetch_w(gx->data, kgx, off + c * s, s);
            for (int64_t i = 0; i < s; i += 16) {
                __mmask16 m = na_h512_mask(s - i);
                __m512 gm = hload16(gy->data, kg, off + i, m);
                if (yp) {
                    __mmask16 le = _mm512_cmp_ps_mask(hload16(yp, ky, off + i, m), zero,
                                                      _CMP_LE_OQ);
                    gm = _mm512_mul_ps(gm, _mm512_mask_mov_ps(one, le, zero));
                    NA_NOFUSE(gm);
                }
                __m512 out;
                if (train) {
                    __m512 xh = _mm512_mul_ps(
                        _mm512_sub_ps(hload16(x->data, kx, off + i, m), vm), vi);
                    __m512 q = _mm512_mul_ps(xh, vmx);
                    NA_NOFUSE(q);
                    out = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(gm, vmg), q), vs);
                } else {
                    out = _mm512_mul_ps(gm, vs);
                }
                hstore16(gx->data, kgx, off + i, m, out);
            }
        }
    }
}

/* ---- the same loops 8 lanes at a time in AVX2 + F16C (na_cpu_half_avx2) --------------------
 * For CPUs without AVX-512BW: each function below is its AVX-512 namesake above with 8-lane
 * vectors, a row's tail of fewer than 8 loaded and stored through a zeroed buffer
 * (cpu_half_simd.h's na_h8_*); the same operations in the same order, so the same bits as
 * the f32 loops over the widened buffers. Built without FMA: nothing is contracted. Taken
 * where some operand is f16/bf16; all-f32 operands stay in the f32 loops' AVX2 build. */
/* always inlined: an out-of-line copy returns a vector with the upper halves dirty */
#define NA_AINLINE __attribute__((always_inline))
NA_HALF_AVX2 NA_AINLINE static inline __m256 aload8(const void *p, int k, int64_t i, int64_t n) {
    if (k == HK_F32) return na_f8_load((const float *)p + i, n);
    return na_h8_load(k == HK_F16, (const uint16_t *)p + i, n);
}
NA_HALF_AVX2 NA_AINLINE static inline void astore8(void *p, int k, int64_t i, int64_t n, __m256 v) {
    if (k == HK_F32) na_f8_store((float *)p + i, n, v);
    else na_h8_store(k == HK_F16, (uint16_t *)p + i, n, v);
}
NA_HALF_AVX2 NA_AINLINE static inline float asum8(__m256 v) {
    float a[8];
    _mm256_storeu_ps(a, v);
    return NA_CPU_LANES8_TOTAL(a);
}

/* hsum_sqdev: na_cpu_sum_f of (x - mean)^2 over x[off..off+n) */
NA_HALF_AVX2 static float asum_sqdev(const void *x, int kx, int64_t off, int64_t n, float mean) {
    if (n > 128) {
        int64_t h = (n / 2 + 7) & ~(int64_t)7;
        return asum_sqdev(x, kx, off, h, mean) + asum_sqdev(x, kx, off + h, n - h, mean);
    }
    __m256 acc = _mm256_setzero_ps(), vm = _mm256_set1_ps(mean);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(aload8(x, kx, off + i, 8), vm);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
    }
    float s = asum8(acc);
    if (i < n) {
        float t[8];
        __m256 d = _mm256_sub_ps(aload8(x, kx, off + i, n - i), vm);
        _mm256_storeu_ps(t, _mm256_mul_ps(d, d));
        for (int64_t j = 0; j < n - i; j++) s += t[j];
    }
    return s;
}

/* hmasked8: gy * relu'(y) (NA_RELU_GRAD: 0 where y <= 0, 1 where y is NaN) when y is given */
NA_HALF_AVX2 NA_AINLINE static inline __m256 amasked8(__m256 g, const void *y, int ky, int64_t i, int64_t n) {
    if (!y) return g;
    __m256 le = _mm256_cmp_ps(aload8(y, ky, i, n), _mm256_setzero_ps(), _CMP_LE_OQ);
    return _mm256_mul_ps(g, _mm256_andnot_ps(le, _mm256_set1_ps(1)));
}

/* adual_sum's leaf of at most 128 values; always inlined, so that kinds given as constants
 * (the kind-specialized copies below) leave no branch on them in the loop */
NA_HALF_AVX2 NA_AINLINE static inline void adual_leaf(const void *g, int kg, const void *y,
                                                      int ky, const void *x, int kx, int64_t off,
                                                      int64_t n, float mean, float invstd,
                                                      float *s1, float *s2) {
    __m256 va1 = _mm256_setzero_ps(), va2 = va1, vm = _mm256_set1_ps(mean),
           vs = _mm256_set1_ps(invstd);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gm = amasked8(aload8(g, kg, off + i, 8), y, ky, off + i, 8);
        __m256 xh = _mm256_mul_ps(_mm256_sub_ps(aload8(x, kx, off + i, 8), vm), vs);
        va1 = _mm256_add_ps(va1, gm);
        va2 = _mm256_add_ps(va2, _mm256_mul_ps(gm, xh));
    }
    float t1 = asum8(va1), t2 = asum8(va2);
    if (i < n) {
        float a[8], b[8];
        __m256 gm = amasked8(aload8(g, kg, off + i, n - i), y, ky, off + i, n - i);
        __m256 xh = _mm256_mul_ps(_mm256_sub_ps(aload8(x, kx, off + i, n - i), vm), vs);
        _mm256_storeu_ps(a, gm);
        _mm256_storeu_ps(b, _mm256_mul_ps(gm, xh));
        for (int64_t j = 0; j < n - i; j++) {
            t1 += a[j];
            t2 += b[j];
        }
    }
    *s1 = t1;
    *s2 = t2;
}

/* hdual_sum: dual_sum_f over gm = gy * relu'(y) and gm * xhat at [off, off+n); adual_sum
 * takes the kinds as given, adual_sum_<kind> has every operand of that kind */
#define NA_ADUAL_SUM(SFX, KG, KY, KX)                                                       \
    NA_HALF_AVX2 static void adual_sum##SFX(const void *g, int kg, const void *y, int ky,    \
                                            const void *x, int kx, int64_t off, int64_t n,  \
                                            float mean, float invstd, float *s1, float *s2) { \
        if (n > 128) {                                                                      \
            int64_t h = (n / 2 + 7) & ~(int64_t)7;                                          \
            float a1, a2, b1, b2;                                                           \
            adual_sum##SFX(g, kg, y, ky, x, kx, off, h, mean, invstd, &a1, &a2);            \
            adual_sum##SFX(g, kg, y, ky, x, kx, off + h, n - h, mean, invstd, &b1, &b2);    \
            *s1 = a1 + b1;                                                                  \
            *s2 = a2 + b2;                                                                  \
            return;                                                                         \
        }                                                                                   \
        (void)kg, (void)ky, (void)kx;                                                       \
        adual_leaf(g, KG, y, KY, x, KX, off, n, mean, invstd, s1, s2);                      \
    }
NA_ADUAL_SUM(, kg, ky, kx)
NA_ADUAL_SUM(_f32, HK_F32, HK_F32, HK_F32)
NA_ADUAL_SUM(_f16, HK_F16, HK_F16, HK_F16)
NA_ADUAL_SUM(_bf16, HK_BF16, HK_BF16, HK_BF16)
#undef NA_ADUAL_SUM

/* haffine: y[off..off+n) = (x - mean) * scale + shift, relu'd when asked (NaN stays NaN) */
NA_HALF_AVX2 static void aaffine(const void *x, int kx, void *y, int ky, int64_t off, int64_t n,
                                 float mean, float scale, float shift, bool relu) {
    __m256 vm = _mm256_set1_ps(mean), vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(shift),
           zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256 t = _mm256_mul_ps(_mm256_sub_ps(aload8(x, kx, off + i, m), vm), vs);
        t = _mm256_add_ps(t, vb);
        if (relu) t = _mm256_andnot_ps(_mm256_cmp_ps(t, zero, _CMP_LE_OQ), t);
        astore8(y, ky, off + i, m, t);
    }
}

/* bn_train_h in 8 lanes: channels [c0, c1); y NULL: the statistics only */
NA_HALF_AVX2 static void bn_train_a(const na_view *x, const na_view *gamma, const na_view *beta,
                                    na_view *rm, na_view *rv, na_view *y, na_view *sm,
                                    na_view *si, int64_t n, int64_t c, int64_t s, float momentum,
                                    float eps, bool relu, int64_t c0, int64_t c1) {
    int kx = hkind(x), ky = hkind(y);
    int64_t M = n * s;
    for (int64_t ch = c0; ch < c1; ch++) {
        /* chan_sum_f over the widened rows: na_cpu_sum_any_f's order per row (it reads the
         * halves in place too, na_cpu_sum_half_direct) */
        na_cpu_psum_f acc = {{0}, 0};
        for (int64_t ni = 0; ni < n; ni++) {
            if (ni + 1 < n)
                hprefetch(x->data, kx, ((ni + 1) * c + ch) * s,
                          s < NA_CPU_CHUNK ? s : NA_CPU_CHUNK);
            na_cpu_psum_add_f(&acc, na_cpu_sum_any_f(x->dtype, x->data, (ni * c + ch) * s, s));
        }
        float mean = na_cpu_psum_total_f(&acc) / (float)M;
        na_cpu_psum_f sq = {{0}, 0};
        for (int64_t ni = 0; ni < n; ni++)
            for (int64_t o = 0; o < s; o += NA_CPU_CHUNK)
                na_cpu_psum_add_f(&sq, asum_sqdev(x->data, kx, (ni * c + ch) * s + o,
                                                  s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK,
                                                  mean));
        float var = na_cpu_psum_total_f(&sq) / (float)M;
        float invstd = na_bn_invstd_f(var, eps);
        float scale = invstd * (float)param(gamma, ch, 1), shift = (float)param(beta, ch, 0);
        for (int64_t ni = 0; y && ni < n; ni++) {
            if (ni + 1 < n && s <= NA_CPU_CHUNK)
                hprefetch_w(y->data, ky, ((ni + 1) * c + ch) * s, s);
            aaffine(x->data, kx, y->data, ky, (ni * c + ch) * s, s, mean, scale, shift, relu);
        }
        set_param(sm, ch, mean);
        set_param(si, ch, invstd);
        float rmean = (float)param(rm, ch, 0), rvar = (float)param(rv, ch, 1);
        if (rm) set_param(rm, ch, na_bn_running_mean_f(rmean, mean, momentum));
        if (rv) set_param(rv, ch, na_bn_running_var_f(rvar, var, M, momentum));
    }
    _mm256_zeroupper(); /* on every path to the return, c0 == c1 too (avx_upper_state) */
}

NA_HALF_AVX2 static void bn_eval_a(const na_view *x, const na_view *gamma, const na_view *beta,
                                   const na_view *rm, const na_view *rv, na_view *y, int64_t n,
                                   int64_t c, int64_t s, float eps, bool relu, int64_t c0,
                                   int64_t c1) {
    int kx = hkind(x), ky = hkind(y);
    for (int64_t ch = c0; ch < c1; ch++) {
        float invstd = na_bn_invstd_f((float)param(rv, ch, 1), eps);
        float scale = invstd * (float)param(gamma, ch, 1), shift = (float)param(beta, ch, 0);
        float mean = (float)param(rm, ch, 0);
        for (int64_t ni = 0; ni < n; ni++)
            aaffine(x->data, kx, y->data, ky, (ni * c + ch) * s, s, mean, scale, shift, relu);
    }
}

/* a channel's constants for agx_row, 8 lanes each */
typedef struct {
    __m256 mean, invstd, mg, mgx, scale;
} agx_consts;
NA_HALF_AVX2 NA_AINLINE static inline agx_consts agx_constants(float mean, float invstd,
                                                               float scale, float mg,
                                                               float mgx) {
    return (agx_consts){_mm256_set1_ps(mean), _mm256_set1_ps(invstd), _mm256_set1_ps(mg),
                        _mm256_set1_ps(mgx), _mm256_set1_ps(scale)};
}

/* chan_gx_f over elements [off, off+n) of one row: train, na_bn_grad; eval, gm * scale; gm =
 * gy * relu'(y) where y is given: NA_RELU_GRAD (1 where y is NaN) when grad_mask, as a widened
 * gy holds it (widen_buffer), else 1 where y > 0, as chan_gx over a gy read in place */
NA_HALF_AVX2 NA_AINLINE static inline void agx_row(const void *x, int kx, const void *g, int kg,
                                                   const void *y, int ky, void *gx, int kgx,
                                                   int64_t off, int64_t n, const agx_consts *k,
                                                   bool train, bool grad_mask) {
    for (int64_t i = 0; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256 gm = aload8(g, kg, off + i, m);
        if (y && grad_mask) {
            gm = amasked8(gm, y, ky, off + i, m);
        } else if (y) {
            __m256 gt = _mm256_cmp_ps(aload8(y, ky, off + i, m), _mm256_setzero_ps(), _CMP_GT_OQ);
            gm = _mm256_mul_ps(gm, _mm256_and_ps(gt, _mm256_set1_ps(1)));
        }
        __m256 out;
        if (train) {
            __m256 xh = _mm256_mul_ps(_mm256_sub_ps(aload8(x, kx, off + i, m), k->mean), k->invstd);
            out = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(gm, k->mg), _mm256_mul_ps(xh, k->mgx)),
                                k->scale);
        } else {
            out = _mm256_mul_ps(gm, k->scale);
        }
        astore8(gx, kgx, off + i, m, out);
    }
}

/* bn_backward_h in 8 lanes: channels [c0, c1) with gy of f16/bf16 */
NA_HALF_AVX2 static void bn_backward_a(const na_view *x, const na_view *gy, const na_view *relu_y,
                                       const na_view *gamma, const na_view *mean_t,
                                       const na_view *invstd_t, na_view *gx, na_view *gg,
                                       na_view *gb, int64_t n, int64_t c, int64_t s, bool train,
                                       int64_t c0, int64_t c1) {
    int kx = hkind(x), kg = hkind(gy), ky = hkind(relu_y), kgx = hkind(gx);
    const void *yp = relu_y ? relu_y->data : NULL;
    int64_t M = n * s;
    bool need_sums = train || gg || gb;
    for (int64_t ch = c0; ch < c1; ch++) {
        float mean = (float)param(mean_t, ch, 0), invstd = (float)param(invstd_t, ch, 1);
        float scale = invstd * (float)param(gamma, ch, 1);
        float sum_gy = 0, sum_gyxh = 0;
        if (need_sums) {
            na_cpu_psum_f a1 = {{0}, 0}, a2 = {{0}, 0};
            for (int64_t ni = 0; ni < n; ni++)
                for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {
                    float s1, s2;
                    if (ni + 1 < n && o == 0) {
                        int64_t nx = ((ni + 1) * c + ch) * s;
                        int64_t cnt = s < NA_CPU_CHUNK ? s : NA_CPU_CHUNK;
                        hprefetch(gy->data, kg, nx, cnt);
                        hprefetch(x->data, kx, nx, cnt);
                        hprefetch(yp, ky, nx, cnt);
                    }
                    adual_sum(gy->data, kg, yp, ky, x->data, kx, (ni * c + ch) * s + o,
                              s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK, mean, invstd, &s1,
                              &s2);
                    na_cpu_psum_add_f(&a1, s1);
                    na_cpu_psum_add_f(&a2, s2);
                }
            sum_gy = na_cpu_psum_total_f(&a1);
            sum_gyxh = na_cpu_psum_total_f(&a2);
        }
        set_param(gg, ch, sum_gyxh);
        set_param(gb, ch, sum_gy);
        if (!gx) continue;
        /* chan_gx_f over the widened gy * relu'(y): na_bn_grad, or gm * scale */
        agx_consts k = agx_constants(mean, invstd, scale, sum_gy / (float)M, sum_gyxh / (float)M);
        for (int64_t ni = 0; ni < n; ni++) {
            int64_t off = (ni * c + ch) * s;
            if (ni + 1 < n && s <= NA_CPU_CHUNK) hprefetch_w(gx->data, kgx, off + c * s, s);
            agx_row(x->data, kx, gy->data, kg, yp, ky, gx->data, kgx, off, s, &k, train, true);
        }
    }
}

/* ---- the backward in memory order (na_cpu_bn_order) ----------------------------------------
 * The loops above walk a channel's N rows, C*S apart, pass after pass: rows of a few hundred
 * elements that the hardware prefetchers start cold at each row, and a channel (the CNN's
 * first layer: three 200 KB half rows) that leaves L2 between the sums and gx passes anyway.
 * bn_backward_o walks memory in its order instead, as SyncBatchNorm's AVX2 loops do
 * (cpu_syncbn.c): each pass takes a block of at most BN_OBLOCK channels image by image, every
 * channel's row in turn, with one pairwise counter per channel; the pool splits the sums
 * pass into tasks of whole channels, at least 8 KiB of them per image, and the gx pass into
 * ranges of rows (bn_run, as cpu_syncbn.c). A channel's chunks reach its
 * counter in the order above (image by image, chunk by chunk) and are summed by the same
 * leaves (adual_sum, agx_row), so every output has the bits of the loops above and of the
 * widening specification; only the order in which channels are visited changes
 * (tests/test_cpu_kernels.c compares them with na_cpu_bn_order_off). The loops are copied
 * per kind (every operand f32, f16 or bf16) so that no branch on kinds stays in them. The
 * training forward keeps one channel at a time: its three passes find the channel in cache
 * (blocks of channels in memory order measured slower on the half layers); under the same
 * switch its all-f32 operands take the 8-lane loops (bn_train_a, with their next-row
 * prefetch) as the halves do. */
enum { BN_OBLOCK = 32 };

/* bn_backward_a (and bn_backward_f, over any of f32/f16/bf16) in memory order: channels
 * [c0, c1). gx's ReLU mask is the one the loops above apply: NA_RELU_GRAD where gy is a half
 * that widen_buffer widens, else y > 0 (they differ only where y is NaN). */
NA_HALF_AVX2 NA_AINLINE static inline void bn_backward_o_body(
    const na_view *x, const na_view *gy, const na_view *relu_y, const na_view *gamma,
    const na_view *mean_t, const na_view *invstd_t, na_view *gx, na_view *gg, na_view *gb,
    int64_t n, int64_t c, int64_t s, bool train, int64_t c0, int64_t c1, int uk, float *oq) {
    /* uk: every operand of that kind (a constant: no branch on kinds in the loops), HK_NONE:
     * each its own; oq given: the sums only, each channel's gx constants stored to oq[5 ch..]
     * for bn_gx_rows_o */
    int kx = uk != HK_NONE ? uk : hkind(x), kg = uk != HK_NONE ? uk : hkind(gy);
    int ky = uk != HK_NONE ? uk : hkind(relu_y), kgx = uk != HK_NONE ? uk : hkind(gx);
    const void *yp = relu_y ? relu_y->data : NULL;
    int64_t M = n * s;
    bool need_sums = train || gg || gb, grad_mask = kg > HK_F32 && M <= ((int64_t)1 << 22);
    for (int64_t b0 = c0; b0 < c1; b0 += BN_OBLOCK) {
        int64_t nb = c1 - b0 < BN_OBLOCK ? c1 - b0 : BN_OBLOCK;
        float mean[BN_OBLOCK], invstd[BN_OBLOCK], sum_gy[BN_OBLOCK] = {0},
              sum_gyxh[BN_OBLOCK] = {0};
        for (int64_t k = 0; k < nb; k++) {
            mean[k] = (float)param(mean_t, b0 + k, 0);
            invstd[k] = (float)param(invstd_t, b0 + k, 1);
        }
        if (need_sums) {
            na_cpu_psum_f a1[BN_OBLOCK], a2[BN_OBLOCK];
            for (int64_t k = 0; k < nb; k++) a1[k] = a2[k] = (na_cpu_psum_f){{0}, 0};
            for (int64_t ni = 0; ni < n; ni++)
                for (int64_t k = 0; k < nb; k++)
                    for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {
                        float s1, s2;
                        int64_t off = (ni * c + b0 + k) * s + o;
                        int64_t cnt = s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK;
                        (uk == HK_F32    ? adual_sum_f32
                         : uk == HK_F16  ? adual_sum_f16
                         : uk == HK_BF16 ? adual_sum_bf16
                                         : adual_sum)(gy->data, kg, yp, ky, x->data, kx, off,
                                                      cnt, mean[k], invstd[k], &s1, &s2);
                        na_cpu_psum_add_f(&a1[k], s1);
                        na_cpu_psum_add_f(&a2[k], s2);
                    }
            for (int64_t k = 0; k < nb; k++) {
                sum_gy[k] = na_cpu_psum_total_f(&a1[k]);
                sum_gyxh[k] = na_cpu_psum_total_f(&a2[k]);
            }
        }
        for (int64_t k = 0; k < nb; k++) {
            set_param(gg, b0 + k, sum_gyxh[k]);
            set_param(gb, b0 + k, sum_gy[k]);
        }
        if (!gx) continue;
        if (oq) {
            for (int64_t k = 0; k < nb; k++) {
                float *o = oq + 5 * (b0 + k);
                o[0] = mean[k], o[1] = invstd[k];
                o[2] = invstd[k] * (float)param(gamma, b0 + k, 1);
                o[3] = sum_gy[k] / (float)M, o[4] = sum_gyxh[k] / (float)M;
            }
            continue;
        }
        agx_consts q[BN_OBLOCK];
        for (int64_t k = 0; k < nb; k++)
            q[k] = agx_constants(mean[k], invstd[k], invstd[k] * (float)param(gamma, b0 + k, 1),
                                 sum_gy[k] / (float)M, sum_gyxh[k] / (float)M);
        for (int64_t ni = 0; ni < n; ni++)
            for (int64_t k = 0; k < nb; k++)
                agx_row(x->data, kx, gy->data, kg, yp, ky, gx->data, kgx, (ni * c + b0 + k) * s,
                        s, &q[k], train, grad_mask);
    }
}

/* gx of rows [r0, r1) of the N*C rows (row r: image r / C, channel r % C) from the constants
 * bn_backward_o_body stored: any split of the rows, each element its own */
NA_HALF_AVX2 NA_AINLINE static inline void bn_gx_rows_o_body(
    const na_view *x, const na_view *gy, const na_view *relu_y, na_view *gx, int64_t n,
    int64_t c, int64_t s, bool train, int64_t r0, int64_t r1, int uk, const float *oq) {
    int kx = uk != HK_NONE ? uk : hkind(x), kg = uk != HK_NONE ? uk : hkind(gy);
    int ky = uk != HK_NONE ? uk : hkind(relu_y), kgx = uk != HK_NONE ? uk : hkind(gx);
    const void *yp = relu_y ? relu_y->data : NULL;
    bool grad_mask = kg > HK_F32 && n * s <= ((int64_t)1 << 22);
    for (int64_t r = r0; r < r1; r++) {
        const float *o = oq + 5 * (r % c);
        agx_consts q = agx_constants(o[0], o[1], o[2], o[3], o[4]);
        agx_row(x->data, kx, gy->data, kg, yp, ky, gx->data, kgx, r * s, s, &q, train,
                grad_mask);
    }
}

/* the kinds the loops are specialized for: every operand (y where given) of one kind */
static int uniform_kind(const na_view *const *v, int nv) {
    int k = HK_NONE;
    for (int i = 0; i < nv; i++) {
        if (!v[i]) continue;
        int ki = hkind(v[i]);
        if (k != HK_NONE && ki != k) return HK_NONE;
        k = ki;
    }
    return k;
}

NA_HALF_AVX2 static void bn_backward_o(const na_view *x, const na_view *gy, const na_view *relu_y,
                                       const na_view *gamma, const na_view *mean_t,
                                       const na_view *invstd_t, na_view *gx, na_view *gg,
                                       na_view *gb, int64_t n, int64_t c, int64_t s, bool train,
                                       int64_t c0, int64_t c1, float *oq) {
    const na_view *ops[4] = {x, gy, relu_y, gx};
#define BN_BACKWARD_O(uk)                                                                    \
    bn_backward_o_body(x, gy, relu_y, gamma, mean_t, invstd_t, gx, gg, gb, n, c, s, train, c0, \
                       c1, uk, oq)
    switch (uniform_kind(ops, 4)) {
    case HK_F32: BN_BACKWARD_O(HK_F32); break;
    case HK_F16: BN_BACKWARD_O(HK_F16); break;
    case HK_BF16: BN_BACKWARD_O(HK_BF16); break;
    default: BN_BACKWARD_O(HK_NONE); break;
    }
#undef BN_BACKWARD_O
    _mm256_zeroupper();
}

NA_HALF_AVX2 static void bn_gx_rows_o(const na_view *x, const na_view *gy, const na_view *relu_y,
                                      na_view *gx, int64_t n, int64_t c, int64_t s, bool train,
                                      int64_t r0, int64_t r1, const float *oq) {
    const na_view *ops[4] = {x, gy, relu_y, gx};
#define BN_GX_ROWS_O(uk) bn_gx_rows_o_body(x, gy, relu_y, gx, n, c, s, train, r0, r1, uk, oq)
    switch (uniform_kind(ops, 4)) {
    case HK_F32: BN_GX_ROWS_O(HK_F32); break;
    case HK_F16: BN_GX_ROWS_O(HK_F16); break;
    case HK_BF16: BN_GX_ROWS_O(HK_BF16); break;
    default: BN_GX_ROWS_O(HK_NONE); break;
    }
#undef BN_GX_ROWS_O
    _mm256_zeroupper();
}

/* Whether job j's f32 compute takes the half loops: the CPU has AVX-512F/BW/VL, every operand
 * is f32, f16 or bf16, and in the backward gy is a half within widen_buffer's limit, so that
 * ReLU's mask is the widened buffer's. The forward takes them for all-f32 operands too: their
 * 16-wide rows and next-row prefetch took the f32 CNN's first BatchNorm+ReLU forward from
 * 1.75 to 1.0 ms (docs/benchmarks.md); an f32 backward stays in the f32 loops (AVX2, with
 * the same prefetch), which the 64x14 layer ran faster than these. The statistics-only
 * training call (y NULL, SyncBatchNorm's forward) takes them too; batch_norm_backward_elemt
 * stays in the f32 loops. */
static bool bn_half_ok(const bn_job *j) {
    if (j->f64 || !na_cpu_half512()) return false;
    bool x_ok = hkind(j->x) != HK_NONE;
    switch (j->kind) {
    case BN_TRAIN: return x_ok && hkind(j->y) != HK_NONE; /* y NULL: statistics only */
    case BN_EVAL: return x_ok && hkind(j->y) != HK_NONE;
    case BN_BACKWARD:
        return hkind(j->gy) > HK_F32 && j->n * j->s <= ((int64_t)1 << 22) && x_ok &&
               hkind(j->relu_y) != HK_NONE && hkind(j->gx) != HK_NONE;
    default: return false;
    }
}

/* Whether job j takes the 8-lane AVX2 loops (na_cpu_half_avx2: no AVX-512BW): bn_half_ok's
 * conditions, and in the forward some operand f16/bf16 (all-f32 ones keep the f32 loops,
 * already AVX2) */
static bool bn_half_avx2_ok(const bn_job *j) {
    if (j->f64 || !na_cpu_half_avx2()) return false;
    int kx = hkind(j->x), ky = hkind(j->y);
    bool x_ok = kx != HK_NONE;
    switch (j->kind) {
    case BN_TRAIN:
    case BN_EVAL: return x_ok && ky != HK_NONE && (kx > HK_F32 || ky > HK_F32);
    case BN_BACKWARD:
        return hkind(j->gy) > HK_F32 && j->n * j->s <= ((int64_t)1 << 22) && x_ok &&
               hkind(j->relu_y) != HK_NONE && hkind(j->gx) != HK_NONE;
    default: return false;
    }
}

/* Whether job j takes na_cpu_bn_order's loops: the backward in memory order (bn_backward_o)
 * and the training forward (statistics only too) through bn_train_a, every operand f32, f16
 * or bf16 */
static bool bn_order_ok(const bn_job *j) {
    if (j->f64 || !na_cpu_bn_order()) return false;
    bool x_ok = hkind(j->x) != HK_NONE;
    switch (j->kind) {
    case BN_TRAIN: return x_ok && hkind(j->y) != HK_NONE;
    case BN_BACKWARD:
        return x_ok && hkind(j->gy) != HK_NONE && hkind(j->relu_y) != HK_NONE &&
               hkind(j->gx) != HK_NONE;
    default: return false;
    }
}
#endif

static void bn_task(void *ctx, int64_t t) {
    const bn_job *j = ctx;
    int64_t c0, c1;
    na_cpu_task_range(j->c, j->tasks, t, 1, &c0, &c1);
#ifdef NA_CPU_HALF_SIMD
    if (bn_order_ok(j)) {
        if (j->o_rows) {
            int64_t r0, r1;
            na_cpu_task_range(j->n * j->c, j->tasks, t, 1, &r0, &r1);
            bn_gx_rows_o(j->x, j->gy, j->relu_y, j->gx, j->n, j->c, j->s, j->train, r0, r1,
                         j->oq);
        } else if (j->kind == BN_TRAIN)
            bn_train_a(j->x, j->gamma, j->beta, j->rm, j->rv, j->y, j->sm, j->si, j->n, j->c,
                       j->s, (float)j->momentum, (float)j->eps, j->relu, c0, c1);
        else
            bn_backward_o(j->x, j->gy, j->relu_y, j->gamma, j->mean, j->invstd, j->gx, j->gg,
                          j->gb, j->n, j->c, j->s, j->train, c0, c1, j->oq);
        return;
    }
    if (bn_half_avx2_ok(j)) {
        switch (j->kind) {
        case BN_TRAIN:
            bn_train_a(j->x, j->gamma, j->beta, j->rm, j->rv, j->y, j->sm, j->si, j->n, j->c,
                       j->s, (float)j->momentum, (float)j->eps, j->relu, c0, c1);
            return;
        case BN_EVAL:
            bn_eval_a(j->x, j->gamma, j->beta, j->eval_rm, j->eval_rv, j->y, j->n, j->c, j->s,
                      (float)j->eps, j->relu, c0, c1);
            return;
        default:
            bn_backward_a(j->x, j->gy, j->relu_y, j->gamma, j->mean, j->invstd, j->gx, j->gg,
                          j->gb, j->n, j->c, j->s, j->train, c0, c1);
            return;
        }
    }
    if (bn_half_ok(j)) {
        switch (j->kind) {
        case BN_TRAIN:
            bn_train_h(j->x, j->gamma, j->beta, j->rm, j->rv, j->y, j->sm, j->si, j->n, j->c,
                       j->s, (float)j->momentum, (float)j->eps, j->relu, c0, c1);
            return;
        case BN_EVAL:
            bn_eval_h(j->x, j->gamma, j->beta, j->eval_rm, j->eval_rv, j->y, j->n, j->c, j->s,
                      (float)j->eps, j->relu, c0, c1);
            return;
        default:
            bn_backward_h(j->x, j->gy, j->relu_y, j->gamma, j->mean, j->invstd, j->gx, j->gg,
                          j->gb, j->n, j->c, j->s, j->train, c0, c1);
            return;
        }
    }
#endif
    bool one_pass = j->kind == BN_EVAL || j->kind == BN_ELEMT; /* nothing worth widening */
    void *xw = one_pass ? NULL : widen_buffer(NA_CPU_SCRATCH_0, j->x, j->f64, j->n, j->s);
    void *gw = j->kind != BN_BACKWARD ? NULL
                                      : widen_buffer(NA_CPU_SCRATCH_1, j->gy, j->f64, j->n, j->s);
    switch (j->kind) {
    case BN_TRAIN:
        if (j->f64)
            bn_train_d(j->x, j->gamma, j->beta, j->rm, j->rv, j->y, j->sm, j->si, j->n, j->c,
                       j->s, j->momentum, j->eps, j->relu, c0, c1, xw);
        else
            NA_BN_F32(bn_train, j->x, j->gamma, j->beta, j->rm, j->rv, j->y, j->sm, j->si, j->n,
                      j->c, j->s, (float)j->momentum, (float)j->eps, j->relu, c0, c1, xw);
        break;
    case BN_EVAL:
        if (j->f64)
            bn_eval_d(j->x, j->gamma, j->beta, j->eval_rm, j->eval_rv, j->y, j->n, j->c, j->s,
                      j->eps, j->relu, c0, c1);
        else
            NA_BN_F32(bn_eval, j->x, j->gamma, j->beta, j->eval_rm, j->eval_rv, j->y, j->n, j->c,
                      j->s, (float)j->eps, j->relu, c0, c1);
        break;
    case BN_ELEMT:
        if (j->f64)
            bn_backward_elemt_d(j->x, j->gy, j->relu_y, j->gamma, j->mean, j->invstd, j->sum_gy,
                                j->sum_gyxh, j->count, j->gx, j->n, j->c, j->s, c0, c1);
        else
            NA_BN_F32(bn_backward_elemt, j->x, j->gy, j->relu_y, j->gamma, j->mean, j->invstd,
                      j->sum_gy, j->sum_gyxh, j->count, j->gx, j->n, j->c, j->s, c0, c1);
        break;
    default:
        if (j->f64)
            bn_backward_d(j->x, j->gy, j->relu_y, j->gamma, j->mean, j->invstd, j->gx, j->gg,
                          j->gb, j->n, j->c, j->s, j->train, c0, c1, xw, gw);
        else
            NA_BN_F32(bn_backward, j->x, j->gy, j->relu_y, j->gamma, j->mean, j->invstd, j->gx,
                      j->gg, j->gb, j->n, j->c, j->s, j->train, c0, c1, xw, gw);
        break;
    }
}

static void bn_run(bn_job *j) {
    j->f64 = j->x->dtype == NA_DTYPE_F64;
#ifdef NA_CPU_HALF_SIMD
    if (j->c && j->kind == BN_BACKWARD && bn_order_ok(j)) {
        /* as SyncBatchNorm's AVX2 backward splits (cpu_syncbn.c): the sums pass over whole
         * channels, at least 8 KiB of them per image and task, so that each task reads long
         * runs in memory order; then gx over any split of the rows. Sizes alone choose the
         * tasks, and each channel's sums are one task's: the bits do not depend on them. */
        int64_t row = j->s * (hkind(j->x) == HK_F32 ? 4 : 2), per = (8192 + row - 1) / row;
        int64_t most = j->c / per > 1 ? j->c / per : 1;
        j->tasks = na_cpu_split(j->x->numel, NA_CPU_BN_TASK_ELEMS,
                                most < NA_CPU_BN_TASKS ? most : NA_CPU_BN_TASKS);
        /* NULL (no memory): the sums pass computes gx too, channel block by block */
        j->oq = j->gx ? na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)j->c * 5 * sizeof(float),
                                       "cpu_batch_norm")
                      : NULL;
        na_cpu_parallel_for(j->tasks, bn_task, j);
        if (!j->oq) return;
        int64_t rows = j->n * j->c;
        j->o_rows = true;
        j->tasks = na_cpu_split(j->x->numel, NA_CPU_BN_TASK_ELEMS,
                                rows < NA_CPU_BN_TASKS ? rows : NA_CPU_BN_TASKS);
        na_cpu_parallel_for(j->tasks, bn_task, j);
        return;
    }
#endif
    j->tasks = na_cpu_split(j->x->numel, NA_CPU_BN_TASK_ELEMS,
                            j->c < NA_CPU_BN_TASKS ? j->c : NA_CPU_BN_TASKS);
    na_cpu_parallel_for(j->c ? j->tasks : 0, bn_task, j);
}

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
                            int64_t s, double momentum, double eps, bool relu) {
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
    bn_run(&(bn_job){.kind = BN_TRAIN, .x = x, .gamma = gamma, .beta = beta,
                     .rm = running_mean, .rv = running_var, .y = y, .sm = save_mean,
                     .si = save_invstd, .n = n, .c = c, .s = s, .momentum = momentum, .eps = eps,
                     .relu = relu});
    return NA_OK;
}

int na_cpu_batch_norm_eval(const na_view *x, const na_view *gamma, const na_view *beta,
                           const na_view *running_mean, const na_view *running_var,
                           na_view *y, int64_t n, int64_t c, int64_t s, double eps,
                           bool relu) {
    const char *fn = "cpu_batch_norm_eval";
    NA_CPU_CHECK_FLOAT(fn, x);
    NA_CPU_CHECK_FLOAT(fn, y);
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, beta);
    NA_CPU_CHECK_FLOAT(fn, running_mean);
    NA_CPU_CHECK_FLOAT(fn, running_var);
    int st = check_extent(fn, x, n, c, s);
    if (st) return st;
    bn_run(&(bn_job){.kind = BN_EVAL, .x = x, .gamma = gamma, .beta = beta,
                     .eval_rm = running_mean, .eval_rv = running_var, .y = y, .n = n, .c = c,
                     .s = s, .eps = eps, .relu = relu});
    return NA_OK;
}

int na_cpu_batch_norm_backward(const na_view *x, const na_view *gy, const na_view *gamma,
                               const na_view *mean, const na_view *invstd, na_view *gx,
                               na_view *ggamma, na_view *gbeta, int64_t n, int64_t c,
                               int64_t s, bool train, const na_view *relu_y) {
    const char *fn = "cpu_batch_norm_backward";
    NA_CPU_CHECK_FLOAT(fn, x);
    NA_CPU_CHECK_FLOAT(fn, gy);
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, mean);
    NA_CPU_CHECK_FLOAT(fn, invstd);
    NA_CPU_CHECK_FLOAT(fn, gx);
    NA_CPU_CHECK_FLOAT(fn, ggamma);
    NA_CPU_CHECK_FLOAT(fn, gbeta);
    NA_CPU_CHECK_FLOAT(fn, relu_y);
    int st = check_extent(fn, x, n, c, s);
    if (st) return st;
    bn_run(&(bn_job){.kind = BN_BACKWARD, .x = x, .gy = gy, .relu_y = relu_y, .gamma = gamma,
                     .mean = mean, .invstd = invstd, .gx = gx, .gg = ggamma, .gb = gbeta,
                     .n = n, .c = c, .s = s, .train = train});
    return NA_OK;
}

int na_cpu_batch_norm_backward_elemt(const na_view *x, const na_view *gy, const na_view *gamma,
                                     const na_view *mean, const na_view *invstd,
                                     const na_view *sum_gy, const na_view *sum_gyxhat,
                                     int64_t count, na_view *gx, int64_t n, int64_t c, int64_t s,
                                     const na_view *relu_y) {
    const char *fn = "cpu_batch_norm_backward_elemt";
    NA_CPU_CHECK_FLOAT(fn, x);
    NA_CPU_CHECK_FLOAT(fn, gy);
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, mean);
    NA_CPU_CHECK_FLOAT(fn, invstd);
    NA_CPU_CHECK_FLOAT(fn, sum_gy);
    NA_CPU_CHECK_FLOAT(fn, sum_gyxhat);
    NA_CPU_CHECK_FLOAT(fn, gx);
    NA_CPU_CHECK_FLOAT(fn, relu_y);
    int st = check_extent(fn, x, n, c, s);
    if (st) return st;
    if (count <= 0 || sum_gy->numel != c || sum_gyxhat->numel != c)
        return na_set_error(NA_EINVAL, "%s: %lld values per channel over %lld channels (sum_gy "
                            "has %lld, sum_gyxhat %lld)", fn, (long long)count, (long long)c,
                            (long long)sum_gy->numel, (long long)sum_gyxhat->numel);
    bn_run(&(bn_job){.kind = BN_ELEMT, .x = x, .gy = gy, .relu_y = relu_y, .gamma = gamma,
                     .mean = mean, .invstd = invstd, .sum_gy = sum_gy, .sum_gyxh = sum_gyxhat,
                     .count = count, .gx = gx, .n = n, .c = c, .s = s});
    return NA_OK;
}

/* channel ch's statistics from its sums over count values, in T (batch_norm_finalize) */
#define NA_CPU_BN_FINALIZE(T, SFX)                                                          \
    static void finalize_##SFX(const na_view *sum, const na_view *sqsum, int64_t m, int64_t ch,\
                               na_view *rm, na_view *rv, na_view *sm, na_view *sv, na_view *si,\
                               T momentum, T eps) {                                         \
        T mean, var, r_mean = (T)param(rm, ch, 0), r_var = (T)param(rv, ch, 1);             \
        na_bn_from_sums_##SFX((T)param(sum, ch, 0), (T)param(sqsum, ch, 0), m, &mean, &var);\
        set_param(sm, ch, mean);                                                            \
        set_param(sv, ch, var);                                                             \
        set_param(si, ch, na_bn_invstd_##SFX(var, eps));                                    \
        if (rm) set_param(rm, ch, na_bn_running_mean_##SFX(r_mean, mean, momentum));        \
        if (rv) set_param(rv, ch, na_bn_running_var_##SFX(r_var, var, m, momentum));        \
    }
NA_CPU_BN_FINALIZE(float, f)
NA_CPU_BN_FINALIZE(double, d)
#undef NA_CPU_BN_FINALIZE

int na_cpu_batch_norm_finalize(const na_view *sum, const na_view *sqsum, int64_t count,
                               na_view *running_mean, na_view *running_var, na_view *save_mean,
                               na_view *save_var, na_view *save_invstd, int64_t c,
                               double momentum, double eps) {
    const char *fn = "cpu_batch_norm_finalize";
    NA_CPU_CHECK_FLOAT(fn, sum);
    NA_CPU_CHECK_FLOAT(fn, sqsum);
    NA_CPU_CHECK_FLOAT(fn, running_mean);
    NA_CPU_CHECK_FLOAT(fn, running_var);
    NA_CPU_CHECK_FLOAT(fn, save_mean);
    NA_CPU_CHECK_FLOAT(fn, save_var);
    NA_CPU_CHECK_FLOAT(fn, save_invstd);
    if (count <= 0 || sum->numel != c || sqsum->numel != c)
        return na_set_error(NA_EINVAL, "%s: %lld values over %lld channels (sum has %lld, sqsum "
                            "%lld)", fn, (long long)count, (long long)c, (long long)sum->numel,
                            (long long)sqsum->numel);
    for (int64_t ch = 0; ch < c; ch++) {
        if (sum->dtype == NA_DTYPE_F64)
            finalize_d(sum, sqsum, count, ch, running_mean, running_var, save_mean, save_var,
                       save_invstd, momentum, eps);
        else
            finalize_f(sum, sqsum, count, ch, running_mean, running_var, save_mean, save_var,
                       save_invstd, (float)momentum, (float)eps);
    }
    return NA_OK;
}
