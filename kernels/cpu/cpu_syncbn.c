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
 * tests/test_cpu_kernels.c compares them. x of f32, f64, f16 or bf16: a half y is 0 also
 * where the pre-ReLU value rounds to 0 (f16: at most 2^-25; bf16: at most 2^-134, every CPU
 * conversion being common/half.h's), so the masks compare with that. On AVX2 + F16C the
 * loops below (memory order, halves converted in registers) run instead of the chunked ones,
 * and batch_norm_eval_rows gives SyncBatchNorm's forward y the same way. */

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
    float thr;
    const struct sk_chan *q; /* the AVX2 loops' per-channel constants, NULL: the chunked loops */
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
                j->sgx, j->count, j->gx, j->gg, j->gb, j->n, j->c, j->s, c0, c1, j->thr);
}

/* ---- AVX2 + F16C: in memory order, halves converted in registers --------------------------
 * The loops above convert an f16/bf16 operand a chunk at a time into f32 stack buffers (a
 * pass of its own per operand and pass) and walk a channel's N rows, C*S apart, which the
 * hardware prefetchers start cold at every row (the CNN's rows are 784 and 196 elements).
 * These read the halves in place, 8 lanes at a time (vcvtph2ps, bf16 << 16), round gx in
 * registers as common/half.h does, and walk memory in its order: the sums pass a block of
 * channels at a time, row by row over the block (each channel's chunks still added in the
 * order above: one pairwise counter per channel), the gx pass any range of rows (each element
 * is its own). The same operations in the same order as sbn_sums / the gx loop above, nothing
 * contracted (no FMA in the target), so the same bits (tests/test_cpu_kernels.c compares them
 * with na_cpu_syncbn_avx2_off). */
bool na_cpu_syncbn_avx2_off = false;

#if defined(__x86_64__) && defined(__GNUC__)
#define SBN_FAST 1
#include <cpuid.h>
#include <immintrin.h>
#define SBN_AVX2 __attribute__((target("avx2,f16c")))
enum { SK_F32, SK_F16, SK_BF16 };

/* a channel's constants, as sbn_channels computes them */
typedef struct sk_chan {
    float mean, invstd, fsc, fsh, scale, mg, mgx;
} sk_chan;

static void sk_constants(const sbn_job *j, sk_chan *q) {
    float eps = (float)j->eps;
    for (int64_t ch = 0; ch < j->c; ch++) {
        float g = (float)sbn_param(j->gamma, ch, 1), invstd = (float)sbn_param(j->invstd, ch, 1);
        q[ch] = (sk_chan){.mean = (float)sbn_param(j->mean, ch, 0), .invstd = invstd,
                          .fsc = na_bn_invstd_f((float)sbn_param(j->var, ch, 1), eps) * g,
                          .fsh = (float)sbn_param(j->beta, ch, 0), .scale = invstd * g};
        if (j->gx) {
            q[ch].mg = (float)sbn_param(j->sg, ch, 0) / (float)j->count;
            q[ch].mgx = (float)sbn_param(j->sgx, ch, 0) / (float)j->count;
        }
    }
}

static bool sk_usable(void) {
    static _Atomic int f16c = -1, env_off = -1; /* CPUID asked once: it traps in a VM */
    if (f16c < 0) {
        unsigned a, b, c, d;
        f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    }
    bool ok = f16c && !na_cpu_env_is(&env_off, "NANOAMP_CPU_SYNCBN", "off");
    /* not yet where the AVX-512 loops run (plain BatchNorm's eval there is AVX-512): these
     * were measured on AVX2-only CPUs, the earlier loops stay on the others until measured
     * (the tests reach these there through na_cpu_half_avx2_prefer) */
    return ok && !na_cpu_syncbn_avx2_off && na_cpu_use_avx2() &&
           (!na_cpu_half512() || na_cpu_half_avx2_prefer);
}

/* 8 values of kind k at p[i..i+8) as f32 */
SBN_AVX2 static inline __m256 sk_load8(const void *p, int k, int64_t i) {
    if (k == SK_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (k == SK_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float sk_get(const void *p, int k, int64_t i) {
    if (k == SK_F32) return ((const float *)p)[i];
    uint16_t b = ((const uint16_t *)p)[i];
    return k == SK_F16 ? na_f16_bits_to_f32(b) : na_bf16_bits_to_f32(b);
}
/* 8 lanes rounded to kind k at p[i..i+8): na_f32_to_f16_bits / na_f32_to_bf16_bits */
SBN_AVX2 static inline void sk_store8(void *p, int k, int64_t i, __m256 v) {
    if (k == SK_F32) {
        _mm256_storeu_ps((float *)p + i, v);
        return;
    }
    __m128i h;
    if (k == SK_F16) { /* vcvtps2ph rounds to nearest even; NaNs become sign | 0x7E00 */
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)),
                                      _mm_set1_epi16(0x7C00));
        __m128i canon = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)),
                                     _mm_set1_epi16(0x7E00));
        h = _mm_blendv_epi8(h, canon, nan);
    } else { /* (x + 0x7FFF + odd) >> 16, NaN -> 0x7FC0 */
        __m256i x = _mm256_castps_si256(v);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                         _mm256_set1_epi32(0x7F800000));
        r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
        r = _mm256_packus_epi32(r, r); /* per 128-bit lane: r0-3 r0-3 | r4-7 r4-7 */
        h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(r, 0x08));
    }
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
}
static inline void sk_set(void *p, int k, int64_t i, float v) {
    if (k == SK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = k == SK_F16 ? na_f32_to_f16_bits(v) : na_f32_to_bf16_bits(v);
}

/* sbn_sums_f over n values at off: the same split, lanes and tail */
SBN_AVX2 static void sk_sums(const void *g, const void *x, int k, int64_t off, int64_t n,
                             const sk_chan *q, float thr, float *s1, float *s2) {
    if (n > 128) {
        int64_t h = (n / 2 + 7) & ~(int64_t)7;
        float a1, a2, b1, b2;
        sk_sums(g, x, k, off, h, q, thr, &a1, &a2);
        sk_sums(g, x, k, off + h, n - h, q, thr, &b1, &b2);
        *s1 = a1 + b1;
        *s2 = a2 + b2;
        return;
    }
    __m256 va1 = _mm256_setzero_ps(), va2 = va1, vm = _mm256_set1_ps(q->mean),
           vs = _mm256_set1_ps(q->invstd), vfs = _mm256_set1_ps(q->fsc),
           vfh = _mm256_set1_ps(q->fsh), vthr = _mm256_set1_ps(thr), one = _mm256_set1_ps(1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(sk_load8(x, k, off + i), vm);
        __m256 yv = _mm256_add_ps(_mm256_mul_ps(d, vfs), vfh); /* the forward's pre-ReLU y */
        __m256 gv = _mm256_mul_ps(sk_load8(g, k, off + i),
                                  _mm256_andnot_ps(_mm256_cmp_ps(yv, vthr, _CMP_LE_OQ), one));
        va1 = _mm256_add_ps(va1, gv);
        va2 = _mm256_add_ps(va2, _mm256_mul_ps(gv, _mm256_mul_ps(d, vs)));
    }
    float a1[8], a2[8];
    _mm256_storeu_ps(a1, va1);
    _mm256_storeu_ps(a2, va2);
    float t1 = NA_CPU_LANES8_TOTAL(a1), t2 = NA_CPU_LANES8_TOTAL(a2);
    for (; i < n; i++) {
        float xv = sk_get(x, k, off + i), yv = (xv - q->mean) * q->fsc + q->fsh;
        float gm = sk_get(g, k, off + i) * (yv <= thr ? 0.0f : 1.0f);
        t1 += gm;
        t2 += gm * ((xv - q->mean) * q->invstd);
    }
    *s1 = t1;
    *s2 = t2;
}

/* the sums of channels [c0, c1), SK_BLOCK channels at a time, row by row over the block */
enum { SK_BLOCK = 32 };
SBN_AVX2 static void sk_sums_channels(const sbn_job *j, int k, int64_t c0, int64_t c1) {
    int64_t c = j->c, s = j->s;
    for (int64_t b0 = c0; b0 < c1; b0 += SK_BLOCK) {
        int64_t b1 = c1 - b0 < SK_BLOCK ? c1 : b0 + SK_BLOCK;
        na_cpu_psum_f a1[SK_BLOCK], a2[SK_BLOCK];
        for (int64_t ch = b0; ch < b1; ch++) a1[ch - b0] = a2[ch - b0] = (na_cpu_psum_f){{0}, 0};
        for (int64_t ni = 0; ni < j->n; ni++)
            for (int64_t ch = b0; ch < b1; ch++)
                for (int64_t o = 0; o < s; o += NA_CPU_CHUNK) {
                    float s1, s2;
                    sk_sums(j->gy->data, j->x->data, k, (ni * c + ch) * s + o,
                            s - o < NA_CPU_CHUNK ? s - o : NA_CPU_CHUNK, &j->q[ch], j->thr, &s1,
                            &s2);
                    na_cpu_psum_add_f(&a1[ch - b0], s1);
                    na_cpu_psum_add_f(&a2[ch - b0], s2);
                }
        for (int64_t ch = b0; ch < b1; ch++) {
            if (j->gg) na_cpu_set(j->gg->dtype, j->gg->data, ch, na_cpu_psum_total_f(&a2[ch - b0]));
            if (j->gb) na_cpu_set(j->gb->dtype, j->gb->data, ch, na_cpu_psum_total_f(&a1[ch - b0]));
        }
    }
}

/* gx of rows [r0, r1) of the N*C rows (row r: image r / C, channel r % C): na_bn_grad with
 * gy * relu'(y), relu' 1 where the pre-ReLU y is above thr (NaN: 0), as the gx loop above */
SBN_AVX2 static void sk_gx_rows(const sbn_job *j, int k, int64_t r0, int64_t r1) {
    int64_t s = j->s;
    const void *x = j->x->data, *g = j->gy->data;
    void *out = j->gx->data;
    __m256 vthr = _mm256_set1_ps(j->thr), one = _mm256_set1_ps(1);
    for (int64_t r = r0; r < r1; r++) {
        const sk_chan *q = &j->q[r % j->c];
        __m256 vm = _mm256_set1_ps(q->mean), vi = _mm256_set1_ps(q->invstd),
               vfs = _mm256_set1_ps(q->fsc), vfh = _mm256_set1_ps(q->fsh),
               vmg = _mm256_set1_ps(q->mg), vmx = _mm256_set1_ps(q->mgx),
               vs = _mm256_set1_ps(q->scale);
        int64_t off = r * s, i = 0;
        for (; i + 8 <= s; i += 8) {
            __m256 d = _mm256_sub_ps(sk_load8(x, k, off + i), vm);
            __m256 yv = _mm256_add_ps(_mm256_mul_ps(d, vfs), vfh);
            __m256 gm = _mm256_mul_ps(sk_load8(g, k, off + i),
                                      _mm256_and_ps(_mm256_cmp_ps(yv, vthr, _CMP_GT_OQ), one));
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(d, vi), vmx);
            sk_store8(out, k, off + i,
                      _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(gm, vmg), t), vs));
        }
        for (; i < s; i++) {
            float xv = sk_get(x, k, off + i), yv = (xv - q->mean) * q->fsc + q->fsh;
            sk_set(out, k, off + i,
                   na_bn_grad_f(sk_get(g, k, off + i) * (yv > j->thr ? 1.0f : 0.0f), xv, q->mean,
                                q->invstd, q->mg, q->mgx, q->scale));
        }
    }
}

static int sk_kind(na_dtype dt) {
    return dt == NA_DTYPE_F32 ? SK_F32 : dt == NA_DTYPE_F16 ? SK_F16 : SK_BF16;
}

/* batch_norm_eval's y over rows [r0, r1): (x - mean) * scale + shift, then NA_RELU (NaN
 * stays NaN, -0 becomes 0) when asked, rounded as stored; q[ch] holds mean, scale, shift */
SBN_AVX2 static void sk_eval_rows(const void *x, void *y, int k, const sk_chan *q, int64_t c,
                                  int64_t s, bool relu, int64_t r0, int64_t r1) {
    __m256 zero = _mm256_setzero_ps();
    for (int64_t r = r0; r < r1; r++) {
        const sk_chan *p = &q[r % c];
        __m256 vm = _mm256_set1_ps(p->mean), vs = _mm256_set1_ps(p->scale),
               vb = _mm256_set1_ps(p->fsh);
        int64_t off = r * s, i = 0;
        for (; i + 8 <= s; i += 8) {
            __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(sk_load8(x, k, off + i), vm), vs),
                                     vb);
            if (relu) t = _mm256_blendv_ps(t, zero, _mm256_cmp_ps(t, zero, _CMP_LE_OQ));
            sk_store8(y, k, off + i, t);
        }
        for (; i < s; i++) {
            float t = (sk_get(x, k, off + i) - p->mean) * p->scale + p->fsh;
            sk_set(y, k, off + i, relu ? NA_RELU(float, t) : t);
        }
    }
}

typedef struct {
    const na_view *x;
    na_view *y;
    const sk_chan *q;
    int64_t n, c, s, tasks;
    bool relu;
} sk_eval_job;

static void sk_eval_task(void *ctx, int64_t t) {
    const sk_eval_job *j = ctx;
    int64_t lo, hi;
    na_cpu_task_range(j->n * j->c, j->tasks, t, 1, &lo, &hi);
    sk_eval_rows(j->x->data, j->y->data, sk_kind(j->x->dtype), j->q, j->c, j->s, j->relu, lo, hi);
}

/* the sums pass: channel ranges; the gx pass: row ranges */
static void sk_task(void *ctx, int64_t t) {
    const sbn_job *j = ctx;
    int k = sk_kind(j->x->dtype);
    int64_t lo, hi;
    if (j->gx) {
        na_cpu_task_range(j->n * j->c, j->tasks, t, 1, &lo, &hi);
        sk_gx_rows(j, k, lo, hi);
    } else {
        na_cpu_task_range(j->c, j->tasks, t, 1, &lo, &hi);
        sk_sums_channels(j, k, lo, hi);
    }
}
#endif

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
    /* y > 0 exactly where the pre-ReLU value is above a threshold: the largest value whose y
     * is 0 once stored (0; f16: 2^-25, the next value up rounds to 2^-24; bf16: 2^-134, half
     * its least subnormal 2^-133, which rounds to 0 as an even tie) */
    float thr;
    switch (x->dtype) {
    case NA_DTYPE_F32:
    case NA_DTYPE_F64: thr = 0.0f; break;
    case NA_DTYPE_F16: thr = 0x1p-25f; break;
    case NA_DTYPE_BF16: thr = 0x1p-134f; break;
    default: return NA_OK;
    }
    if (gy->dtype != x->dtype || (gx && gx->dtype != x->dtype)) return NA_OK;
    *done = true;
    sbn_job j = {.x = x, .gy = gy, .gamma = gamma, .beta = beta, .mean = mean, .var = var,
                 .invstd = invstd, .sg = sum_gy, .sgx = sum_gyxhat, .gx = gx, .gg = ggamma,
                 .gb = gbeta, .eps = eps, .count = count, .n = n, .c = c, .s = s, .thr = thr};
    if (!c) return NA_OK;
#ifdef SBN_FAST
    if (x->dtype != NA_DTYPE_F64 && sk_usable()) {
        sk_chan *q = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)c * sizeof *q, fn);
        if (!q) return na_last_status();
        sk_constants(&j, q);
        j.q = q;
        if (gx) { /* rows in memory order, any split */
            j.tasks = na_cpu_split(x->numel, (int64_t)1 << 15, n * c < 32 ? n * c : 32);
        } else { /* whole channels, at least 8 KiB of them per image and task (or one task) */
            int64_t row = s * (int64_t)na_dtype_size(x->dtype), per = (8192 + row - 1) / row;
            int64_t most = c / per > 1 ? c / per : 1;
            j.tasks = na_cpu_split(x->numel, (int64_t)1 << 15, most < 32 ? most : 32);
        }
        na_cpu_parallel_for(j.tasks, sk_task, &j);
        return NA_OK;
    }
#endif
    j.tasks = na_cpu_split(x->numel, (int64_t)1 << 15, c < 32 ? c : 32);
    na_cpu_parallel_for(j.tasks, sbn_task, &j);
    return NA_OK;
}

int na_cpu_batch_norm_eval_rows(const na_view *x, const na_view *gamma, const na_view *beta,
                                const na_view *running_mean, const na_view *running_var,
                                na_view *y, int64_t n, int64_t c, int64_t s, double eps,
                                bool relu, bool *done) {
    const char *fn = "cpu_batch_norm_eval_rows";
    *done = false;
    NA_CPU_CHECK_FLOAT(fn, gamma);
    NA_CPU_CHECK_FLOAT(fn, beta);
    NA_CPU_CHECK_FLOAT(fn, running_mean);
    NA_CPU_CHECK_FLOAT(fn, running_var);
    if (n < 0 || c < 0 || s < 0 || n * c * s != x->numel || y->numel != x->numel)
        return na_set_error(NA_ESHAPE, "%s: [N, C, S] = [%lld, %lld, %lld] does not match x's "
                            "%lld elements (y %lld)", fn, (long long)n, (long long)c,
                            (long long)s, (long long)x->numel, (long long)y->numel);
#ifdef SBN_FAST
    bool half_or_f32 = x->dtype == NA_DTYPE_F32 || x->dtype == NA_DTYPE_F16 ||
                       x->dtype == NA_DTYPE_BF16;
    if (!half_or_f32 || y->dtype != x->dtype || !sk_usable()) return NA_OK;
    *done = true;
    if (!c) return NA_OK;
    sk_chan *q = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)c * sizeof *q, fn);
    if (!q) return na_last_status();
    float e = (float)eps;
    for (int64_t ch = 0; ch < c; ch++) { /* bn_eval's scale and shift */
        float invstd = na_bn_invstd_f((float)sbn_param(running_var, ch, 1), e);
        q[ch] = (sk_chan){.mean = (float)sbn_param(running_mean, ch, 0),
                          .scale = invstd * (float)sbn_param(gamma, ch, 1),
                          .fsh = (float)sbn_param(beta, ch, 0)};
    }
    sk_eval_job j = {.x = x, .y = y, .q = q, .n = n, .c = c, .s = s, .relu = relu};
    j.tasks = na_cpu_split(x->numel, (int64_t)1 << 15, n * c < 32 ? n * c : 32);
    na_cpu_parallel_for(j.tasks, sk_eval_task, &j);
#else
    (void)eps, (void)relu;
#endif
    return NA_OK;
}
