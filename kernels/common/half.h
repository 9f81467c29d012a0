/* kernels/common/half.h — fp16 / bf16 <-> fp32 conversion, one definition for host and device.
 *
 * Why this exists: the CPU backend and the CUDA kernels must round identically, so a tensor
 * cast (or an amp autocast) gives the same bits on both devices and parity tests can compare
 * bit for bit.  The conversions are therefore written once, with integer bit manipulation only
 * (no F16C, no cuda_fp16 intrinsics, no dependence on the FPU rounding mode or on FTZ/DAZ), and
 * shared by both backends.  Plain C99 that also compiles as CUDA C++.
 *
 * Semantics (match PyTorch's c10::Half / c10::BFloat16):
 *   f32 -> f16 : round to nearest, ties to even; overflow -> +-inf; subnormals exact;
 *                NaN -> sign | 0x7E00 (quiet NaN, sign kept, payload dropped).
 *   f16 -> f32 : exact; a NaN keeps its sign and payload (mantissa << 13) and is made quiet.
 *   f32 -> bf16: round to nearest, ties to even: (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
 *                overflow -> +-inf; NaN -> 0x7FC0 (canonical quiet NaN).
 *   bf16 -> f32: bits << 16 (exact).
 */
#ifndef NANOAMP_KERNELS_COMMON_HALF_H
#define NANOAMP_KERNELS_COMMON_HALF_H

#include <stdint.h>
#ifndef __CUDA_ARCH__
#include <string.h>
#endif

#include "common/hd.h"

/* Bit casts: memcpy on the host (no aliasing issues, compiles to a move), intrinsics on device. */
static NA_HD uint32_t na_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

static NA_HD float na_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

static NA_HD uint16_t na_f32_to_f16_bits(float f) {
    uint32_t x = na_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);   /* NaN */
    if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  /* >= 65520 (or inf) -> inf */
    if (x >= 0x38800000u) {                                   /* >= 2^-14: f16 normal */
        /* rebias exponent 127 -> 15 and drop 13 mantissa bits; a carry out of the mantissa
         * correctly bumps the exponent (65519.99.. stays below the inf threshold above) */
        uint32_t h = (x - 0x38000000u) >> 13;
        uint32_t rem = x & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    if (x <= 0x33000000u) return sign; /* <= 2^-25: half the smallest subnormal ties to 0 */
    {                                  /* f16 subnormal: m * 2^-24, m in [1, 1024] */
        uint32_t e = x >> 23;          /* 102 .. 112 */
        uint32_t mant = (x & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e;     /* 14 .. 24 */
        uint32_t m = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (m & 1u))) m++; /* m == 1024 is 2^-14, correct */
        return (uint16_t)(sign | m);
    }
}

static NA_HD float na_f16_bits_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1Fu;
    uint32_t m = (uint32_t)h & 0x3FFu;
    if (e == 0x1Fu) {
        if (m == 0) return na_f32_from_bits(sign | 0x7F800000u);      /* inf */
        return na_f32_from_bits(sign | 0x7FC00000u | (m << 13));      /* NaN, made quiet */
    }
    if (e == 0) {
        if (m == 0) return na_f32_from_bits(sign);                    /* +-0 */
        e = 113u;                                                      /* 2^-14 in f32 bias */
        while (!(m & 0x400u)) { m <<= 1; e--; }                        /* normalise subnormal */
        m &= 0x3FFu;
        return na_f32_from_bits(sign | (e << 23) | (m << 13));
    }
    return na_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

static NA_HD uint16_t na_f32_to_bf16_bits(float f) {
    uint32_t x = na_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)0x7FC0u;   /* NaN */
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static NA_HD float na_bf16_bits_to_f32(uint16_t b) {
    return na_f32_from_bits((uint32_t)b << 16);
}

/* The float value after a round trip through f16 / bf16. */
static NA_HD float na_round_f16(float f) { return na_f16_bits_to_f32(na_f32_to_f16_bits(f)); }
static NA_HD float na_round_bf16(float f) { return na_bf16_bits_to_f32(na_f32_to_bf16_bits(f)); }

/* The f16/bf16 value just below the one with bits b (toward -inf); uniform fills use it to
 * keep [lo, hi) when rounding to the storage dtype lands on hi. */
static NA_HD uint16_t na_half_bits_prev(uint16_t b) {
    if ((b & 0x7FFFu) == 0) return 0x8001u; /* +-0 -> the smallest negative subnormal */
    return (uint16_t)(b & 0x8000u ? b + 1u : b - 1u);
}

#endif
