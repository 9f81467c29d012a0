/* kernels/cpu/cpu_gemm.c — matrix products: CBLAS when available, else a built-in blocked GEMM.
 *
 * The built-in GEMM is the classic Goto/BLIS structure: op(B) is packed into KC x NC panels of
 * NR columns, op(A) into MC x KC panels of MR rows, and a register-blocked MR x NR micro-kernel
 * (GNU vector extensions, 16-byte vectors: SSE2 on any x86-64, NEON on arm64) runs over them.
 * Transposes are absorbed by the packing. Edge tiles are zero-padded in the packs and only
 * the valid part is written back. It reaches a few GFLOP/s per core without -march flags;
 * OpenBLAS is several times faster and is used for f32/f64 when the build found it.
 *
 * f16/bf16 products are computed as a GPU computes them: A, B (and C when beta != 0) widened
 * to f32, an f32 GEMM with f32 accumulation, bias and relu in f32, one rounding on store.
 * bf16 x bf16 on a CPU with AVX512_BF16 skips the widening: the same blocking with bf16 pair
 * packs and a vdpbf16ps micro-kernel (f32 accumulation too; another summation order, and
 * denormals read and written as zero: cpu_internal.h). The widening path is its specification.
 */
#include <limits.h>

#include "common/elementwise.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_parallel.h"
#include "na_config.h"

#if NA_HAVE_BLAS
#include <cblas.h>
#endif

bool na_cpu_gemm_force_builtin = false;

#define NA_GEMM_MR 6
#define NA_GEMM_KC 256
#define NA_GEMM_MC (NA_GEMM_MR * 22)
#define NA_GEMM_NC 1024

typedef float na_vf __attribute__((vector_size(16)));
typedef double na_vd __attribute__((vector_size(16)));

#define NA_CPU_DEFINE_GEMM(T, SFX, VEC)                                                     \
    enum { VL_##SFX = (int)(sizeof(VEC) / sizeof(T)), NR_##SFX = 2 * VL_##SFX };            \
                                                                                            \
    /* tile[MR][NR] = A panel (kc x MR, p-major) @ B panel (kc x NR, p-major) */            \
    static void ukernel_##SFX(int64_t kc, const T *restrict a, const T *restrict b,         \
                              T *restrict tile) {                                           \
        VEC acc[NA_GEMM_MR][2];                                                             \
        memset(acc, 0, sizeof acc);                                                         \
        for (int64_t p = 0; p < kc; p++) {                                                  \
            VEC b0, b1;                                                                     \
            memcpy(&b0, b + p * NR_##SFX, sizeof b0);                                       \
            memcpy(&b1, b + p * NR_##SFX + VL_##SFX, sizeof b1);                            \
            const T *ap = a + p * NA_GEMM_MR;                                               \
            for (int i = 0; i < NA_GEMM_MR; i++) {                                          \
                T av = ap[i];                                                               \
                acc[i][0] += av * b0;                                                       \
                acc[i][1] += av * b1;                                                       \
            }                                                                               \
        }                                                                                   \
        memcpy(tile, acc, sizeof acc);                                                      \
    }                                                                                       \
                                                                                            \
    /* op(A)[i0 + i, p0 + p] for i < mc, p < kc into MR-row panels, zero padded */          \
    static void pack_a_##SFX(bool ta, const T *a, int64_t lda, int64_t i0, int64_t p0,      \
                             int64_t mc, int64_t kc, T *dst) {                              \
        for (int64_t ir = 0; ir < mc; ir += NA_GEMM_MR) {                                   \
            int64_t mr = mc - ir < NA_GEMM_MR ? mc - ir : NA_GEMM_MR;                       \
            T *d = dst + ir * kc;                                                           \
            if (!ta) {                                                                      \
                for (int64_t i = 0; i < mr; i++) {                                          \
                    const T *s = a + (i0 + ir + i) * lda + p0;                              \
                    for (int64_t p = 0; p < kc; p++) d[p * NA_GEMM_MR + i] = s[p];          \
                }                                                                           \
            } else {                                                                        \
                for (int64_t p = 0; p < kc; p++) {                                          \
                    const T *s = a + (p0 + p) * lda + i0 + ir;                              \
                    for (int64_t i = 0; i < mr; i++) d[p * NA_GEMM_MR + i] = s[i];          \
                }                                                                           \
            }                                                                               \
            for (int64_t i = mr; i < NA_GEMM_MR; i++)                                       \
                for (int64_t p = 0; p < kc; p++) d[p * NA_GEMM_MR + i] = 0;                 \
        }                                                                                   \
    }                                                                                       \
                                                                                            \
    /* op(B)[p0 + p, j0 + j] for p < kc, j < nc into NR-column panels, zero padded */       \
    static void pack_b_##SFX(bool tb, const T *b, int64_t ldb, int64_t p0, int64_t j0,      \
                             int64_t kc, int64_t nc, T *dst) {                              \
        for (int64_t jr = 0; jr < nc; jr += NR_##SFX) {                                     \
            int64_t nr = nc - jr < NR_##SFX ? nc - jr : NR_##SFX;                           \
            T *d = dst + jr * kc;                                                           \
            if (!tb) {                                                                      \
                for (int64_t p = 0; p < kc; p++) {                                          \
                    const T *s = b + (p0 + p) * ldb + j0 + jr;                              \
                    int64_t j = 0;                                                          \
                    for (; j < nr; j++) d[p * NR_##SFX + j] = s[j];                         \
                    for (; j < NR_##SFX; j++) d[p * NR_##SFX + j] = 0;                      \
                }                                                                           \
            } else {                                                                        \
                for (int64_t j = 0; j < nr; j++) {                                          \
                    const T *s = b + (j0 + jr + j) * ldb + p0;                              \
                    for (int64_t p = 0; p < kc; p++) d[p * NR_##SFX + j] = s[p];            \
                }                                                                           \
                for (int64_t j = nr; j < NR_##SFX; j++)                                     \
                    for (int64_t p = 0; p < kc; p++) d[p * NR_##SFX + j] = 0;               \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
                                                                                            \
    /* C = beta * C (C not read when beta == 0) */                                          \
    static void scale_c_##SFX(int64_t m, int64_t n, T beta, T *c, int64_t ldc) {            \
        for (int64_t i = 0; i < m; i++) {                                                   \
            T *r = c + i * ldc;                                                             \
            if (beta == 0)                                                                  \
                for (int64_t j = 0; j < n; j++) r[j] = 0;                                   \
            else if (beta != 1)                                                             \
                for (int64_t j = 0; j < n; j++) r[j] *= beta;                               \
        }                                                                                   \
    }                                                                                       \
                                                                                            \
    int na_cpu_##SFX##gemm_builtin(bool ta, bool tb, int64_t m, int64_t n, int64_t k,       \
                                   T alpha, const T *a, int64_t lda, const T *b,            \
                                   int64_t ldb, T beta, T *c, int64_t ldc) {                \
        if (m <= 0 || n <= 0) return NA_OK;                                                 \
        if (k <= 0 || alpha == 0) {                                                         \
            scale_c_##SFX(m, n, beta, c, ldc);                                              \
            return NA_OK;                                                                   \
        }                                                                                   \
        int64_t kc_max = k < NA_GEMM_KC ? k : NA_GEMM_KC;                                   \
        int64_t nc_max = n < NA_GEMM_NC ? n : NA_GEMM_NC;                                   \
        int64_t mc_max = m < NA_GEMM_MC ? m : NA_GEMM_MC;                                   \
        int64_t nc_pad = (nc_max + NR_##SFX - 1) / NR_##SFX * NR_##SFX;                     \
        int64_t mc_pad = (mc_max + NA_GEMM_MR - 1) / NA_GEMM_MR * NA_GEMM_MR;               \
        T *bp = na_cpu_scratch(NA_CPU_SCRATCH_PACK_B, (size_t)(kc_max * nc_pad) * sizeof(T), \
                               "cpu_gemm");                                                 \
        T *ap = na_cpu_scratch(NA_CPU_SCRATCH_PACK_A, (size_t)(kc_max * mc_pad) * sizeof(T), \
                               "cpu_gemm");                                                 \
        if (!ap || !bp) return NA_ENOMEM;                                                   \
        T tile[NA_GEMM_MR * NR_##SFX];                                                      \
        for (int64_t jc = 0; jc < n; jc += NA_GEMM_NC) {                                    \
            int64_t nc = n - jc < NA_GEMM_NC ? n - jc : NA_GEMM_NC;                         \
            for (int64_t pc = 0; pc < k; pc += NA_GEMM_KC) {                                \
                int64_t kc = k - pc < NA_GEMM_KC ? k - pc : NA_GEMM_KC;                     \
                bool first = pc == 0;                                                       \
                pack_b_##SFX(tb, b, ldb, pc, jc, kc, nc, bp);                               \
                for (int64_t ic = 0; ic < m; ic += NA_GEMM_MC) {                            \
                    int64_t mc = m - ic < NA_GEMM_MC ? m - ic : NA_GEMM_MC;                 \
                    pack_a_##SFX(ta, a, lda, ic, pc, mc, kc, ap);                           \
                    for (int64_t jr = 0; jr < nc; jr += NR_##SFX) {                         \
                        int64_t nr = nc - jr < NR_##SFX ? nc - jr : NR_##SFX;               \
                        for (int64_t ir = 0; ir < mc; ir += NA_GEMM_MR) {                   \
                            int64_t mr = mc - ir < NA_GEMM_MR ? mc - ir : NA_GEMM_MR;       \
                            ukernel_##SFX(kc, ap + ir * kc, bp + jr * kc, tile);            \
                            T *cb = c + (ic + ir) * ldc + jc + jr;                          \
                            for (int64_t i = 0; i < mr; i++) {                              \
                                T *cr = cb + i * ldc;                                       \
                                const T *tr = tile + i * NR_##SFX;                          \
                                if (!first)                                                 \
                                    for (int64_t j = 0; j < nr; j++) cr[j] += alpha * tr[j]; \
                                else if (beta == 0)                                         \
                                    for (int64_t j = 0; j < nr; j++) cr[j] = alpha * tr[j]; \
                                else                                                        \
                                    for (int64_t j = 0; j < nr; j++)                        \
                                        cr[j] = alpha * tr[j] + beta * cr[j];               \
                            }                                                               \
                        }                                                                   \
                    }                                                                       \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        return NA_OK;                                                                       \
    }

NA_CPU_DEFINE_GEMM(float, s, na_vf)
NA_CPU_DEFINE_GEMM(double, d, na_vd)

/* ---- bf16 x bf16 on AVX512_BF16 ----------------------------------------------------------
 * The same blocking, for vdpbf16ps: lane j of acc += a[2j] * b[2j] + a[2j+1] * b[2j+1]. Both
 * packs hold K in pairs, zero padded to an even count: B's NR-column panel as
 * dst[(pp * NR + j) * 2 + h] = op(B)[2pp + h, j] (one 512-bit vector: 16 columns x one pair),
 * A's MR-row panel as one 32-bit pair per row, dst[pp * MR + i], broadcast to every lane. The
 * packs read bf16 straight from A and B (half the bytes of the widened copies). The 12 x 32
 * tile keeps 24 accumulators in registers. Each element of C sums its pairs in order within a
 * KC block and the blocks in order, on the calling thread: no result depends on the thread
 * count. */
#if NA_CPU_BF16_KERNELS
#include <immintrin.h>

#define NA_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
enum { BF16_MR = 12, BF16_NR = 32, BF16_KC = 384, BF16_MC = BF16_MR * 16, BF16_NC = 1024 };

/* C (mr x nr, row stride ldc) = alpha * A (MR rows x kp pairs) @ B panel (kp pairs x NR)
 * + beta * C on a product's first K block (C not read when beta == 0), C += that product on
 * the later ones: the built-in GEMM's write-back (the compiler may fuse its multiply and add:
 * one rounding fewer, within the same bound, still deterministic). Row i's
 * pair pp is the 32 bits at a + i * rs + pp * cs (bf16 units): a packed panel (rs 2, cs
 * 2 * MR) or op(A) itself when it is row-major (rs lda, cs 2). */
NA_BF16 static void ukernel_bf16(int64_t kp, const uint16_t *a, int64_t rs, int64_t cs,
                                 const uint16_t *restrict b, float *c, int64_t ldc, int64_t mr,
                                 int64_t nr, float alpha, float beta, bool first) {
    __m512 acc[BF16_MR][2];
    for (int i = 0; i < BF16_MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t pp = 0; pp < kp; pp++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + pp * 2 * BF16_NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + pp * 2 * BF16_NR + 32);
        const uint16_t *ap = a + pp * cs;
        for (int i = 0; i < BF16_MR; i++) {
            uint32_t pair;
            memcpy(&pair, ap + i * rs, sizeof pair);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mk[2] = {nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1),
                       nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1)};
    for (int i = 0; i < BF16_MR; i++) {
        if (i >= mr) break;
        for (int h = 0; h < 2; h++) {
            float *cr = c + i * ldc + 16 * h;
            __m512 v = _mm512_mul_ps(va, acc[i][h]);
            if (!first) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk[h], cr), v);
            else if (beta != 0)
                v = _mm512_add_ps(v, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mk[h], cr)));
            _mm512_mask_storeu_ps(cr, mk[h], v);
        }
    }
}

/* lane 2j <- x's element j, lane 2j + 1 <- y's, for j < 16 (_mm512_permutex2var_epi16) */
#define BF16_INTERLEAVE_LO                                                                  \
    _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, \
                     6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0)

/* op(A)[i0 + i, p0 + p] for i < mc, p < kc into MR-row panels of pairs, zero padded */
NA_BF16 static void pack_a_bf16(bool ta, const uint16_t *a, int64_t lda, int64_t i0,
                                int64_t p0, int64_t mc, int64_t kc, uint32_t *dst) {
    int64_t kp = (kc + 1) / 2;
    __m512i lo = BF16_INTERLEAVE_LO;
    for (int64_t ir = 0; ir < mc; ir += BF16_MR) {
        int64_t mr = mc - ir < BF16_MR ? mc - ir : BF16_MR;
        uint32_t *d = dst + ir * kp;
        if (!ta) { /* a row's pair is one 32-bit word */
            for (int64_t i = 0; i < mr; i++) {
                const uint16_t *s = a + (i0 + ir + i) * lda + p0;
                for (int64_t pp = 0; pp < kc / 2; pp++)
                    memcpy(&d[pp * BF16_MR + i], s + 2 * pp, 4);
                if (kc & 1) d[(kp - 1) * BF16_MR + i] = s[kc - 1];
            }
            for (int64_t i = mr; i < BF16_MR; i++)
                for (int64_t pp = 0; pp < kp; pp++) d[pp * BF16_MR + i] = 0;
        } else { /* rows 2pp and 2pp + 1 interleaved, the padding rows zero */
            __mmask32 rows = (__mmask32)((1u << mr) - 1);
            for (int64_t pp = 0; pp < kp; pp++) {
                const uint16_t *s0 = a + (p0 + 2 * pp) * lda + i0 + ir;
                __m512i r0 = _mm512_maskz_loadu_epi16(rows, s0), r1 = _mm512_setzero_si512();
                if (2 * pp + 1 < kc) r1 = _mm512_maskz_loadu_epi16(rows, s0 + lda);
                _mm512_mask_storeu_epi32(d + pp * BF16_MR, (1 << BF16_MR) - 1,
                                         _mm512_permutex2var_epi16(r0, lo, r1));
            }
        }
    }
}

/* op(B)[p0 + p, j0 + j] for p < kc, j < nc into NR-column panels of pairs, zero padded */
NA_BF16 static void pack_b_bf16(bool tb, const uint16_t *b, int64_t ldb, int64_t p0,
                                int64_t j0, int64_t kc, int64_t nc, uint16_t *dst) {
    int64_t kp = (kc + 1) / 2;
    /* lane 2j <- row 2pp's column j, lane 2j + 1 <- row 2pp + 1's: columns 0-15, 16-31 */
    __m512i lo = BF16_INTERLEAVE_LO;
    __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t jr = 0; jr < nc; jr += BF16_NR) {
        int64_t nr = nc - jr < BF16_NR ? nc - jr : BF16_NR;
        uint16_t *d = dst + jr * 2 * kp;
        uint32_t *d32 = (uint32_t *)d; /* pairs: d32[pp * NR + j] */
        if (!tb) {
            for (int64_t pp = 0; pp < kp; pp++) {
                uint16_t *dp = d + pp * 2 * BF16_NR;
                const uint16_t *s0 = b + (p0 + 2 * pp) * ldb + j0 + jr, *s1 = s0 + ldb;
                bool odd = 2 * pp + 1 == kc;
                if (nr == BF16_NR && !odd) {
                    __m512i r0 = _mm512_loadu_si512(s0), r1 = _mm512_loadu_si512(s1);
                    _mm512_storeu_si512(dp, _mm512_permutex2var_epi16(r0, lo, r1));
                    _mm512_storeu_si512(dp + 32, _mm512_permutex2var_epi16(r0, hi, r1));
                    continue;
                }
                int64_t j = 0;
                for (; j < nr; j++) dp[2 * j] = s0[j], dp[2 * j + 1] = odd ? 0 : s1[j];
                for (; j < BF16_NR; j++) dp[2 * j] = dp[2 * j + 1] = 0;
            }
        } else { /* a column's pair is one 32-bit word */
            for (int64_t j = 0; j < BF16_NR; j++) {
                const uint16_t *s = b + (j0 + jr + j) * ldb + p0;
                if (j >= nr) {
                    for (int64_t pp = 0; pp < kp; pp++) d32[pp * BF16_NR + j] = 0;
                    continue;
                }
                for (int64_t pp = 0; pp < kc / 2; pp++)
                    memcpy(&d32[pp * BF16_NR + j], s + 2 * pp, 4);
                if (kc & 1) d32[(kp - 1) * BF16_NR + j] = s[kc - 1];
            }
        }
    }
}

static int gemm_one_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                         float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return NA_OK;
    if (k <= 0 || alpha == 0) {
        scale_c_s(m, n, beta, c, ldc);
        return NA_OK;
    }
    int64_t kp_max = ((k < BF16_KC ? k : BF16_KC) + 1) / 2;
    int64_t nc_max = n < BF16_NC ? n : BF16_NC, mc_max = m < BF16_MC ? m : BF16_MC;
    int64_t nc_pad = (nc_max + BF16_NR - 1) / BF16_NR * BF16_NR;
    int64_t mc_pad = (mc_max + BF16_MR - 1) / BF16_MR * BF16_MR;
    uint16_t *bp = na_cpu_scratch(NA_CPU_SCRATCH_PACK_B,
                                  (size_t)(2 * kp_max * nc_pad) * sizeof(uint16_t), "cpu_gemm");
    uint32_t *ap = na_cpu_scratch(NA_CPU_SCRATCH_PACK_A,
                                  (size_t)(kp_max * mc_pad) * sizeof(uint32_t), "cpu_gemm");
    if (!ap || !bp) return NA_ENOMEM;
    for (int64_t jc = 0; jc < n; jc += BF16_NC) {
        int64_t nc = n - jc < BF16_NC ? n - jc : BF16_NC;
        for (int64_t pc = 0; pc < k; pc += BF16_KC) {
            int64_t kc = k - pc < BF16_KC ? k - pc : BF16_KC, kp = (kc + 1) / 2;
            /* a row-major A's pairs are read in place (packing it cost a quarter of the
             * MLP's products, once per column panel), but for an odd K's last pair and a
             * partial last row panel (packed) */
            bool in_place = !ta && kc % 2 == 0;
            pack_b_bf16(tb, b, ldb, pc, jc, kc, nc, bp);
            for (int64_t ic = 0; ic < m; ic += BF16_MC) {
                int64_t mc = m - ic < BF16_MC ? m - ic : BF16_MC, full = mc / BF16_MR * BF16_MR;
                if (!in_place) pack_a_bf16(ta, a, lda, ic, pc, mc, kc, ap);
                else if (full < mc) pack_a_bf16(ta, a, lda, ic + full, pc, mc - full, kc, ap);
                for (int64_t jr = 0; jr < nc; jr += BF16_NR) {
                    int64_t nr = nc - jr < BF16_NR ? nc - jr : BF16_NR;
                    for (int64_t ir = 0; ir < mc; ir += BF16_MR) {
                        int64_t mr = mc - ir < BF16_MR ? mc - ir : BF16_MR;
                        bool direct = in_place && ir < full;
                        const uint16_t *at = direct ? a + (ic + ir) * lda + pc
                                             : (const uint16_t *)(ap + (in_place ? 0 : ir * kp));
                        ukernel_bf16(kp, at, direct ? lda : 2, direct ? 2 : 2 * BF16_MR,
                                     bp + jr * 2 * kp, c + (ic + ir) * ldc + jc + jr, ldc, mr,
                                     nr, alpha, beta, pc == 0);
                    }
                }
            }
        }
    }
    return NA_OK;
}
#endif

#if NA_HAVE_BLAS
/* CBLAS takes int sizes and checks leading dimensions (printing through xerbla otherwise). */
static bool blas_ok(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                    int64_t ldc) {
    if (na_cpu_gemm_force_builtin || na_cpu_reproducible()) return false;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return false;
    int64_t ca = ta ? m : k, cb = tb ? k : n;
    return lda >= (ca > 1 ? ca : 1) && ldb >= (cb > 1 ? cb : 1) && ldc >= (n > 1 ? n : 1);
}
#endif

/* One GEMM on the calling thread: CBLAS when it takes the sizes, else the built-in one. */
#define NA_CPU_DEFINE_GEMM_ONE(T, SFX, CBLAS)                                                \
    static int gemm_one_##SFX(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,   \
                              const T *a, int64_t lda, const T *b, int64_t ldb, T beta, T *c, \
                              int64_t ldc) {                                                \
        if (NA_HAVE_BLAS && k > 0 && blas_ok(ta, tb, m, n, k, lda, ldb, ldc)) {             \
            CBLAS(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,                            \
                  tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a,         \
                  (int)lda, b, (int)ldb, beta, c, (int)ldc);                                \
            return NA_OK;                                                                   \
        }                                                                                   \
        return na_cpu_##SFX##gemm_builtin(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); \
    }
#if NA_HAVE_BLAS
NA_CPU_DEFINE_GEMM_ONE(float, s, cblas_sgemm)
NA_CPU_DEFINE_GEMM_ONE(double, d, cblas_dgemm)
#else
#define blas_ok(...) false
#define NA_CPU_NO_CBLAS(...) (void)0
NA_CPU_DEFINE_GEMM_ONE(float, s, NA_CPU_NO_CBLAS)
NA_CPU_DEFINE_GEMM_ONE(double, d, NA_CPU_NO_CBLAS)
#endif

/* ---- the split over the pool -----------------------------------------------------------------
 * A product worth splitting (and not already inside a pool task) is cut into panels of C:
 * column panels when C is at least as wide as tall, else row panels, their number and bounds
 * fixed by the shape alone. Each panel is one single-threaded GEMM over the full k, so every
 * element of C is the same sum whatever the number of threads. */
#define NA_CPU_GEMM_TASK_FLOPS ((int64_t)1 << 24) /* work per panel worth a wake-up */
enum { NA_CPU_GEMM_TASKS = 8, NA_CPU_GEMM_MIN_PANEL = 64, NA_CPU_GEMM_ALIGN = 16 };

#define NA_CPU_DEFINE_GEMM_SPLIT(TI, T, SFX)                                                 \
    typedef struct {                                                                        \
        bool ta, tb, by_cols;                                                               \
        int64_t m, n, k, lda, ldb, ldc, tasks;                                              \
        T alpha, beta;                                                                      \
        const TI *a, *b;                                                                    \
        T *c;                                                                               \
        na_cpu_task_status status;                                                          \
    } gemm_job_##SFX;                                                                       \
    static void gemm_task_##SFX(void *ctx, int64_t t) {                                     \
        gemm_job_##SFX *j = ctx;                                                            \
        int64_t lo, hi, st;                                                                 \
        na_cpu_task_range(j->by_cols ? j->n : j->m, j->tasks, t, NA_CPU_GEMM_ALIGN, &lo, &hi); \
        if (j->by_cols) /* columns lo..hi of op(B) and C */                                 \
            st = gemm_one_##SFX(j->ta, j->tb, j->m, hi - lo, j->k, j->alpha, j->a, j->lda,  \
                                j->tb ? j->b + lo * j->ldb : j->b + lo, j->ldb, j->beta,    \
                                j->c + lo, j->ldc);                                         \
        else /* rows lo..hi of op(A) and C */                                               \
            st = gemm_one_##SFX(j->ta, j->tb, hi - lo, j->n, j->k, j->alpha,                \
                                j->ta ? j->a + lo : j->a + lo * j->lda, j->lda, j->b,       \
                                j->ldb, j->beta, j->c + lo * j->ldc, j->ldc);               \
        if (st) na_cpu_task_fail(&j->status);                                               \
    }                                                                                       \
    int na_cpu_##SFX##gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,      \
                           const TI *a, int64_t lda, const TI *b, int64_t ldb, T beta, T *c, \
                           int64_t ldc) {                                                   \
        if (m <= 0 || n <= 0) return NA_OK;                                                 \
        bool by_cols = n >= m;                                                              \
        int64_t wide = by_cols ? n : m, most = wide / NA_CPU_GEMM_MIN_PANEL;                \
        int64_t tasks = na_cpu_in_parallel() ? 1                                            \
                        : na_cpu_split(2 * m * n * (k > 0 ? k : 1), NA_CPU_GEMM_TASK_FLOPS, \
                                       most < NA_CPU_GEMM_TASKS ? most : NA_CPU_GEMM_TASKS); \
        if (tasks <= 1)                                                                     \
            return gemm_one_##SFX(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);    \
        gemm_job_##SFX j = {.ta = ta, .tb = tb, .by_cols = by_cols, .m = m, .n = n, .k = k,  \
                            .lda = lda, .ldb = ldb, .ldc = ldc, .tasks = tasks,             \
                            .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c};          \
        na_cpu_parallel_for(tasks, gemm_task_##SFX, &j);                                    \
        return na_cpu_task_status_raise(&j.status);                                         \
    }

NA_CPU_DEFINE_GEMM_SPLIT(float, float, s)
NA_CPU_DEFINE_GEMM_SPLIT(double, double, d)
#if NA_CPU_BF16_KERNELS
NA_CPU_DEFINE_GEMM_SPLIT(uint16_t, float, bf16)
#else
int na_cpu_bf16gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                    float *c, int64_t ldc) {
    return na_set_error(NA_ENOTSUP, "cpu_bf16gemm: built without the AVX512_BF16 kernels");
}
#endif

/* ---- the backend entry ------------------------------------------------------------------ */

/* C rows += bias, then relu, in the compute type. */
#define NA_CPU_DEFINE_EPILOGUE(T, SFX)                                                      \
    static void epilogue_##SFX(T *c, int64_t ldc, int64_t m, int64_t n, const T *bias,      \
                               bool relu) {                                                 \
        for (int64_t i = 0; i < m; i++) {                                                   \
            T *r = c + i * ldc;                                                             \
            if (bias)                                                                       \
                for (int64_t j = 0; j < n; j++) r[j] += bias[j];                            \
            if (relu)                                                                       \
                for (int64_t j = 0; j < n; j++) r[j] = na_unary_##SFX(NA_UNARY_RELU, r[j], 0, 0); \
        }                                                                                   \
    }
NA_CPU_DEFINE_EPILOGUE(float, f)
NA_CPU_DEFINE_EPILOGUE(double, d)

/* rows x cols matrix with row stride ld, of dtype dt, widened into contiguous f32 (a dense one
 * over the pool) */
static void widen(na_dtype dt, const void *p, int64_t rows, int64_t cols, int64_t ld, float *dst) {
    if (ld == cols) {
        na_cpu_convert_f(NA_DTYPE_F32, dst, dt, p, rows * cols);
        return;
    }
    for (int64_t r = 0; r < rows; r++) na_cpu_load_f(dt, p, r * ld, cols, dst + r * cols);
}

int na_cpu_gemm(const na_gemm_args *g) {
    const char *fn = "cpu_gemm";
    if (!na_cpu_is_float(g->dtype)) return na_cpu_bad_dtype(fn, "A, B, C", g->dtype);
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0)
        return na_set_error(NA_EINVAL, "%s: negative size m=%lld n=%lld k=%lld batch=%lld", fn,
                            (long long)g->m, (long long)g->n, (long long)g->k,
                            (long long)g->batch);
    int64_t m = g->m, n = g->n, k = g->k;
    if (m == 0 || n == 0) return NA_OK;
    size_t esz = na_dtype_size(g->dtype);
    int st = NA_OK;

    if (g->dtype == NA_DTYPE_F32 || g->dtype == NA_DTYPE_F64) {
        bool d = g->dtype == NA_DTYPE_F64;
        for (int64_t bi = 0; bi < g->batch && !st; bi++) {
            const char *a = (const char *)g->a + (size_t)(bi * g->stride_a) * esz;
            const char *b = (const char *)g->b + (size_t)(bi * g->stride_b) * esz;
            char *c = (char *)g->c + (size_t)(bi * g->stride_c) * esz;
            if (d) {
                st = na_cpu_dgemm(g->ta, g->tb, m, n, k, g->alpha, (const double *)a, g->lda,
                                  (const double *)b, g->ldb, g->beta, (double *)c, g->ldc);
                if (!st && (g->bias || g->relu))
                    epilogue_d((double *)c, g->ldc, m, n, g->bias, g->relu);
            } else {
                st = na_cpu_sgemm(g->ta, g->tb, m, n, k, g->alpha, (const float *)a, g->lda,
                                  (const float *)b, g->ldb, g->beta, (float *)c, g->ldc);
                if (!st && (g->bias || g->relu))
                    epilogue_f((float *)c, g->ldc, m, n, g->bias, g->relu);
            }
        }
        return st;
    }

    /* f16 / bf16: widen, f32 GEMM, f32 epilogue, one rounding; bf16 on vdpbf16ps reads A and
     * B as they are (the product differs from the widening one in summation order and DAZ/FTZ
     * only, cpu_internal.h) */
    bool dot = g->dtype == NA_DTYPE_BF16 && na_cpu_bf16_fast();
    int64_t ar = g->ta ? k : m, ac = g->ta ? m : k;
    int64_t br = g->tb ? n : k, bc = g->tb ? k : n;
    size_t a_bytes = dot ? 0 : (size_t)(ar * ac) * sizeof(float);
    size_t b_bytes = dot ? 0 : (size_t)(br * bc) * sizeof(float);
    float *aw = dot ? NULL : na_cpu_scratch(NA_CPU_SCRATCH_0, a_bytes, fn);
    float *bw = dot ? NULL : na_cpu_scratch(NA_CPU_SCRATCH_1, b_bytes, fn);
    float *cw = na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)(m * n) * sizeof(float), fn);
    float *biasw = g->bias ? na_cpu_scratch(NA_CPU_SCRATCH_3, (size_t)n * sizeof(float), fn) : NULL;
    if ((!dot && (!aw || !bw)) || !cw || (g->bias && !biasw)) return NA_ENOMEM;
    if (g->bias) na_cpu_load_f(g->dtype, g->bias, 0, n, biasw);
    for (int64_t bi = 0; bi < g->batch && !st; bi++) {
        const char *a = (const char *)g->a + (size_t)(bi * g->stride_a) * esz;
        const char *b = (const char *)g->b + (size_t)(bi * g->stride_b) * esz;
        char *c = (char *)g->c + (size_t)(bi * g->stride_c) * esz;
        if (g->beta != 0) widen(g->dtype, c, m, n, g->ldc, cw);
        if (dot) {
            st = na_cpu_bf16gemm(g->ta, g->tb, m, n, k, g->alpha, (const uint16_t *)a, g->lda,
                                 (const uint16_t *)b, g->ldb, g->beta, cw, n);
        } else {
            widen(g->dtype, a, ar, ac, g->lda, aw);
            widen(g->dtype, b, br, bc, g->ldb, bw);
            st = na_cpu_sgemm(g->ta, g->tb, m, n, k, g->alpha, aw, ac, bw, bc, g->beta, cw, n);
        }
        if (st) break;
        epilogue_f(cw, n, m, n, biasw, g->relu);
        if (g->ldc == n)
            na_cpu_convert_f(g->dtype, c, NA_DTYPE_F32, cw, m * n);
        else
            for (int64_t i = 0; i < m; i++) na_cpu_store_f(g->dtype, c, i * g->ldc, n, cw + i * n);
    }
    return st;
}
