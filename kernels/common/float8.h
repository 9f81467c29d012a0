/* kernels/common/float8.h — FP8 (E4M3 "fn", E5M2) <-> f32 conversion, one definition for host
 * and device.
 *
 * Why this exists: as for half.h, the CPU backend and the CUDA kernels must give the same byte
 * for every input, and both must equal PyTorch's casts (tests/test_fp8.c checks them against
 * reference bytes made by PyTorch 2.15), so the conversion is written once, in integer bit
 * manipulation only, and shared by both backends. Plain C99 that also compiles as CUDA C++.
 *
 * Formats (OCP 8-bit floating point):
 *   E4M3 ("e4m3fn"): 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is
 *                    the only NaN; largest 448, smallest normal 2^-6, subnormal 2^-9.
 *   E5M2:            5 exponent bits (bias 15), 2 mantissa bits; IEEE-like (inf, NaNs);
 *                    largest 57344, smallest normal 2^-14, subnormal 2^-16. It is the top
 *                    byte of an f16.
 * Semantics (match PyTorch 2.15's tensor.to(float8_*) on the CPU, checked byte for byte):
 *   f32 -> E4M3: round to nearest, ties to even; saturates: beyond +-448 and +-inf -> +-448;
 *                NaN -> sign | 0x7F.
 *   f32 -> E5M2: round to nearest, ties to even; overflow (>= 61440) -> +-inf;
 *                NaN -> sign | 0x7F.
 *   E4M3 -> f32: exact; NaN -> sign | 0x7FF00000.
 *   E5M2 -> f32: exact, as the f16 with these top bits (NaN made quiet: half.h's rule).
 *   Other float dtypes convert through f32 (f64 -> f32 -> FP8, as PyTorch does: double
 *   rounding included; f16/bf16 -> f32 is exact).
 */
#ifndef NANOAMP_KERNELS_COMMON_FLOAT8_H
#define NANOAMP_KERNELS_COMMON_FLOAT8_H

#include "common/half.h"

/* |x| (f32 bits, not NaN) rounded to nearest even into an FP8 magnitude with mbits mantissa
 * bits and exponent bias `bias`, before any overflow handling: the result may exceed the
 * format's largest code (the caller saturates or makes it inf). */
static NA_HD uint32_t na_fp8_round_magnitude(uint32_t a, int mbits, int bias) {
    int emin = 1 - bias;                                   /* exponent of the smallest normal */
    if (a >= (uint32_t)(127 + emin) << 23) {               /* normal in FP8 */
        if (a >= 0x7F800000u) return 0xFFFu;               /* inf: beyond every code */
        int shift = 23 - mbits;
        uint32_t r = (a - ((uint32_t)(127 - bias) << 23)) >> shift; /* rebias, drop bits */
        uint32_t rem = a & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;  /* a carry bumps the exponent */
        return r;
    }
    /* subnormal: m * 2^(emin - mbits); at most half the smallest subnormal ties to 0 */
    if (a <= (uint32_t)(127 + emin - mbits - 1) << 23) return 0;
    uint32_t e = a >> 23;
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = (uint32_t)(150 + emin - mbits) - e;  /* 24 down to 23 - mbits + 1 */
    uint32_t m = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) m++;      /* 2^mbits is the smallest normal */
    return m;
}

static NA_HD uint8_t na_f32_to_e4m3_bits(float f) {
    uint32_t x = na_f32_bits(f), a = x & 0x7FFFFFFFu;
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
    uint32_t r = na_fp8_round_magnitude(a, 3, 7);
    return (uint8_t)(sign | (r > 0x7Eu ? 0x7Eu : r));     /* saturate at 448 */
}

static NA_HD uint8_t na_f32_to_e5m2_bits(float f) {
    uint32_t x = na_f32_bits(f), a = x & 0x7FFFFFFFu;
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
    uint32_t r = na_fp8_round_magnitude(a, 2, 15);
    return (uint8_t)(sign | (r > 0x7Cu ? 0x7Cu : r));     /* overflow -> inf */
}

static NA_HD float na_e4m3_bits_to_f32(uint8_t b) {
    uint32_t sign = ((uint32_t)b & 0x80u) << 24;
    uint32_t e = ((uint32_t)b >> 3) & 0xFu, m = (uint32_t)b & 0x7u;
    if (e == 0xFu && m == 0x7u) return na_f32_from_bits(sign | 0x7FF00000u); /* NaN */
    if (e == 0) {
        if (m == 0) return na_f32_from_bits(sign);
        e = 121u;                                         /* 2^-6 in f32 bias */
        while (!(m & 0x8u)) { m <<= 1; e--; }             /* normalise the subnormal */
        return na_f32_from_bits(sign | (e << 23) | ((m & 0x7u) << 20));
    }
    return na_f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

static NA_HD float na_e5m2_bits_to_f32(uint8_t b) {
    return na_f16_bits_to_f32((uint16_t)((uint16_t)b << 8));
}

#endif
