/* kernels/cpu/cpu_half_simd.h — f16 / bf16 <-> f32 for 16 lanes in AVX-512 registers.
 *
 * The kernels that read half tensors convert them here, in registers, inside their own loads
 * (the direct convolution's packing, the 2x2 max pool, BatchNorm's loops, the sums of
 * na_cpu_sum_any_f, the whole-array conversions of cpu_convert.c that every other kernel's
 * chunks go through), so a half tensor is read once
 * at half the bytes instead of widened into an f32 copy first. Bit-identical to common/half.h
 * for every input: tests/test_half.c runs all 2^32 f32 and all 2^16 half patterns through the
 * array conversions built on these, at every tail length.
 *
 *   f16 -> f32:  vcvtph2ps (exact; a NaN keeps sign and payload and is made quiet, as half.h;
 *                f16 subnormals are converted exactly, MXCSR.DAZ does not apply to them).
 *   f32 -> f16:  vcvtps2ph with round-to-nearest-even in the instruction (MXCSR's rounding
 *                mode and FTZ are not read), NaNs rewritten to sign | 0x7E00 as half.h does
 *                (the instruction keeps their payload).
 *   bf16 -> f32: bits << 16.
 *   f32 -> bf16: half.h's formula on 16 lanes of integers, NaN -> 0x7FC0 (vcvtneps2bf16 is
 *                not used: it flushes f32 subnormals to zero).
 *
 * Only where na_cpu_half512() (cpu_internal.h) says the CPU has AVX-512F/BW/VL: the callers
 * are built with NA_HALF512 and ask it before they call. The 8-lane AVX2 + F16C forms below
 * (na_h8_*, NA_HALF_AVX2) only where na_cpu_half_avx2() says so. */
#ifndef NANOAMP_KERNELS_CPU_HALF_SIMD_H
#define NANOAMP_KERNELS_CPU_HALF_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__)
#define NA_CPU_HALF_SIMD 1
#include <stdbool.h>
#include <stdint.h>
#include <immintrin.h>

#define NA_HALF512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

/* the lanes [0, n) of 16, n <= 16 */
NA_HALF512 static inline __mmask16 na_h512_mask(int64_t n) {
    return (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
}

/* 16 halves (f16 when f16, else bf16) as f32 */
NA_HALF512 static inline __m512 na_h512_widen(bool f16, __m256i h) {
    if (f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 f32 lanes rounded to halves, as half.h's na_f32_to_f16_bits / na_f32_to_bf16_bits */
NA_HALF512 static inline __m256i na_h512_narrow(bool f16, __m512 v) {
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (f16) {
        __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i canon = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16((short)0x8000)),
                                        _mm256_set1_epi16(0x7E00));
        return _mm256_mask_blend_epi16(nan, h, canon);
    }
    __m512i x = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

/* the halves at p under mask m (other lanes 0, never read) as f32 */
NA_HALF512 static inline __m512 na_h512_load(bool f16, const uint16_t *p, __mmask16 m) {
    return na_h512_widen(f16, _mm256_maskz_loadu_epi16(m, p));
}

/* 8 halves at p under mask m (other lanes 0, never read) as f32: the 8-lane form, for the
 * loops that keep na_cpu_sum_f's 8 accumulators */
NA_HALF512 static inline __m256 na_h256_load(bool f16, const uint16_t *p, __mmask8 m) {
    __m128i h = _mm_maskz_loadu_epi16(m, p);
    if (f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the lanes under m of v, rounded, to the halves at p */
NA_HALF512 static inline void na_h512_store(bool f16, uint16_t *p, __mmask16 m, __m512 v) {
    _mm256_mask_storeu_epi16(p, m, na_h512_narrow(f16, v));
}
#endif

/* (x86-32 too: cpu_convert.c's AVX2 conversions are built from these) */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <stdbool.h>
#include <stdint.h>
#include <immintrin.h>

/* ---- the same conversions 8 lanes at a time in AVX2 + F16C (na_cpu_half_avx2) -------------
 * For the CPUs without AVX-512BW (Zen 3, most laptops): the kernels that read halves in place
 * on AVX-512 run these 8-lane forms there, with the same bits. AVX2 has masked loads and
 * stores of 32-bit lanes only, so a tail of n < 8 halves is loaded as words plus one half and
 * stored through a stack buffer (lanes past n are 0 and nothing past p + n is read or
 * written). Built without FMA: nothing can be contracted. The callers must leave with the
 * upper register halves clear (tests/avx_upper_state.py checks the library; an early return
 * laid out after AVX code needs an explicit _mm256_zeroupper). */
#define NA_HALF_AVX2 __attribute__((target("avx2,f16c")))

/* 8 halves (f16 when f16, else bf16) as f32 */
NA_HALF_AVX2 static inline __m256 na_h8_widen(bool f16, __m128i h) {
    if (f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 f32 lanes rounded to halves, as half.h's na_f32_to_f16_bits / na_f32_to_bf16_bits */
NA_HALF_AVX2 static inline __m128i na_h8_narrow(bool f16, __m256 v) {
    __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    if (f16) {
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32),
                                      _mm256_extracti128_si256(nan32, 1));
        __m128i canon = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)),
                                     _mm_set1_epi16(0x7E00));
        return _mm_blendv_epi8(h, canon, nan);
    }
    __m256i x = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan32);
    /* every lane is in [0, 0xFFFF]: the unsigned saturating pack is exact */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* the n (<= 8) halves at p, lanes past n 0; na_h8_load: as f32. A tail is n/2 whole 32-bit
 * words by a masked load and an odd last half blended in: halves stored one by one into a
 * buffer that one wide load then reads cannot be forwarded from the store queue (a stall of
 * some 20 cycles a tail, measured in the max pool's backward) */
NA_HALF_AVX2 static inline __m128i na_h8_bits(const uint16_t *p, int64_t n) {
    if (n >= 8) return _mm_loadu_si128((const __m128i *)p);
    __m128i words = _mm_cmpgt_epi32(_mm_set1_epi32((int)(n >> 1)), _mm_set_epi32(3, 2, 1, 0));
    __m128i v = _mm_maskload_epi32((const int *)(const void *)p, words);
    if (n & 1) {
        __m128i last = _mm_cmpeq_epi16(_mm_set_epi16(7, 6, 5, 4, 3, 2, 1, 0),
                                       _mm_set1_epi16((short)(n - 1)));
        v = _mm_blendv_epi8(v, _mm_set1_epi16((short)p[n - 1]), last);
    }
    return v;
}
NA_HALF_AVX2 static inline __m256 na_h8_load(bool f16, const uint16_t *p, int64_t n) {
    return na_h8_widen(f16, na_h8_bits(p, n));
}

/* the first n (<= 8) lanes of v, rounded, to the halves at p */
NA_HALF_AVX2 static inline void na_h8_store(bool f16, uint16_t *p, int64_t n, __m256 v) {
    __m128i h = na_h8_narrow(f16, v);
    if (n >= 8) {
        _mm_storeu_si128((__m128i *)p, h);
        return;
    }
    uint16_t t[8];
    _mm_storeu_si128((__m128i *)t, h);
    for (int64_t j = 0; j < n; j++) p[j] = t[j];
}

/* lanes [0, n) of 8 set: the mask of AVX2's 32-bit masked loads and stores */
NA_HALF_AVX2 static inline __m256i na_lanes8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0));
}
/* the n (<= 8) floats at p, lanes past n 0; and the first n lanes of v stored to p */
NA_HALF_AVX2 static inline __m256 na_f8_load(const float *p, int64_t n) {
    if (n >= 8) return _mm256_loadu_ps(p);
    return _mm256_maskload_ps(p, na_lanes8(n));
}
NA_HALF_AVX2 static inline void na_f8_store(float *p, int64_t n, __m256 v) {
    if (n >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, na_lanes8(n), v);
}
#endif

#endif
