/* tests/test_half.c — fp16/bf16 conversions and the Philox RNG in kernels/common.
 *
 * The conversions are checked bit for bit against independent references written here in
 * exact double arithmetic (ldexp decoders; f16 rounding by searching the sorted table of all
 * f16 values; bf16 rounding by frexp/ulp arithmetic), never against the same bit tricks. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/philox.h"
#include "cpu/cpu_internal.h" /* na_cpu_f32_to_f16 and the other array conversions */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* _mm_getcsr / _mm_setcsr */
#endif

/* ---- helpers ------------------------------------------------------------------------------ */

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- independent references ------------------------------------------------------------- */

/* f16 decode by the definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormal 2^-14 * m/1024. */
static double ref_f16_decode(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp((double)(1024 + m), e - 25);
    return s ? -v : v;
}

/* bf16 decode: (-1)^s * 2^(e-127) * (1 + m/128), subnormal 2^-126 * m/128. */
static double ref_bf16_decode(uint16_t b) {
    int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -133);
    else v = ldexp((double)(128 + m), e - 134);
    return s ? -v : v;
}

/* Values of the non-negative f16 patterns 0x0000..0x7C00, in increasing order; entry 0x7C00
 * holds 65536, the value the next (even) pattern would have, so rounding ties above 65504
 * go "to even" = overflow, exactly like the IEEE rule. */
static double f16_table[0x7C01];
static void build_f16_table(void) {
    for (int h = 0; h < 0x7C00; h++) f16_table[h] = ref_f16_decode((uint16_t)h);
    f16_table[0x7C00] = 65536.0;
}

static uint16_t ref_f32_to_f16(float f) {
    double d = (double)f;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isnan(f)) return sign | 0x7E00;
    double a = fabs(d);
    if (a >= 65536.0) return sign | 0x7C00;
    /* largest lo with table[lo] <= a */
    int lo = 0, hi = 0x7C00;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (f16_table[mid] <= a) lo = mid; else hi = mid;
    }
    if (f16_table[lo] == a) return sign | (uint16_t)lo;
    hi = lo + 1;
    double dlo = a - f16_table[lo], dhi = f16_table[hi] - a; /* both exact (Sterbenz) */
    int pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    return sign | (uint16_t)pick; /* pick == 0x7C00 is inf */
}

/* f32 -> bf16 by arithmetic: scale to units of the bf16 ulp, round half to even, rescale. */
static uint16_t ref_f32_to_bf16(float f) {
    if (isnan(f)) return 0x7FC0;
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isinf(f)) return sign | 0x7F80;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);                 /* a in [2^(e-1), 2^e) */
    if (e < -125) e = -125;       /* subnormal range: ulp is 2^-133 */
    double ulp = ldexp(1.0, e - 8); /* 8 significant bits */
    double q = a / ulp, fl = floor(q), fr = q - fl;
    if (fr > 0.5 || (fr == 0.5 && fmod(fl, 2.0) == 1.0)) fl += 1.0;
    double r = fl * ulp;
    if (r >= ldexp(1.0, 128)) return sign | 0x7F80;
    uint32_t u = fbits((float)r); /* r is a bf16 value, exactly a float */
    cr_assert_eq(u & 0xFFFF, 0);
    return sign | (uint16_t)(u >> 16);
}

/* ---- f16 ---------------------------------------------------------------------------------- */

Test(half, f16_all_patterns_decode_and_roundtrip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = na_f16_bits_to_f32((uint16_t)h);
        uint32_t u = fbits(f);
        int e = (h >> 10) & 31, m = h & 1023;
        cr_assert_eq(u >> 31, h >> 15, "sign of %04x", h);
        if (e == 31 && m) {
            cr_assert(isnan(f), "%04x -> %08x not NaN", h, u);
            cr_assert_eq(u & 0x7FFFFFFF, 0x7FC00000u | ((uint32_t)m << 13),
                         "payload %04x -> %08x", h, u);
            cr_assert_eq(na_f32_to_f16_bits(f), (h & 0x8000) | 0x7E00, "NaN back %04x", h);
        } else {
            cr_assert_eq((double)f, ref_f16_decode((uint16_t)h), "decode %04x", h);
            cr_assert_eq(na_f32_to_f16_bits(f), h, "roundtrip %04x", h);
        }
    }
}

Test(half, f32_to_f16_random_bits_vs_reference) {
    build_f16_table();
    uint64_t s = 0x5EED1234ull;
    uint32_t bad = 0, first_bad = 0;
    for (uint32_t n = 0; n < 10000000u / 2; n++) {
        uint64_t r = splitmix64(&s);
        uint32_t w[2] = {(uint32_t)r, (uint32_t)(r >> 32)};
        for (int k = 0; k < 2; k++) {
            float f = bitsf(w[k]);
            if (na_f32_to_f16_bits(f) != ref_f32_to_f16(f) && !bad++) first_bad = w[k];
        }
    }
    cr_assert_eq(bad, 0, "%u mismatches, first f32 bits %08x", bad, first_bad);
}

Test(half, f32_to_f16_random_in_range_vs_reference) {
    /* exponents concentrated on the f16 range (2^-26 .. 2^17), where all the rounding happens */
    build_f16_table();
    uint64_t s = 0xF16F16ull;
    uint32_t bad = 0, first_bad = 0;
    for (uint32_t n = 0; n < 4000000u; n++) {
        uint64_t r = splitmix64(&s);
        uint32_t e = 101u + (uint32_t)((r >> 32) % 44u);
        uint32_t mant = (uint32_t)r & 0x7FFFFFu;
        if ((r >> 40) & 1) mant &= ~0xFFFu;            /* bias towards exact ties */
        uint32_t u = (uint32_t)((r >> 63) << 31) | (e << 23) | mant;
        float f = bitsf(u);
        if (na_f32_to_f16_bits(f) != ref_f32_to_f16(f) && !bad++) first_bad = u;
    }
    cr_assert_eq(bad, 0, "%u mismatches, first f32 bits %08x", bad, first_bad);
}

Test(half, f16_edges) {
    build_f16_table();
    struct { float f; uint16_t h; } c[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000},
        {INFINITY, 0x7C00}, {-INFINITY, 0xFC00},
        {1.0f, 0x3C00}, {-2.0f, 0xC000},
        {65504.0f, 0x7BFF}, {-65504.0f, 0xFBFF},
        {65519.99f, 0x7BFF}, {65520.0f, 0x7C00}, {-65520.0f, 0xFC00},
        {FLT_MAX, 0x7C00}, {-FLT_MAX, 0xFC00},
        {0x1p-14f, 0x0400},                      /* min normal */
        {0x1p-24f, 0x0001}, {-0x1p-24f, 0x8001}, /* min subnormal */
        {0x1p-25f, 0x0000}, {-0x1p-25f, 0x8000}, /* half min subnormal: tie -> even (0) */
        {0x1.000002p-25f, 0x0001},               /* just above the tie */
        {0x1.8p-24f, 0x0002},                    /* 1.5 * 2^-24: tie 1|2 -> 2 (even, up) */
        {0x1.4p-23f, 0x0002},                    /* 2.5 * 2^-24: tie 2|3 -> 2 (even, down) */
        {0x1.ff8p-15f, 0x03FF},                  /* max subnormal */
        {0x1.ffcp-15f, 0x0400},                  /* tie max subnormal | min normal -> 0x400 */
        {0x1.ffbffep-15f, 0x03FF},               /* just below that tie */
        {0x1.002p+0f, 0x3C00},                   /* 1 + 2^-11: tie 0x3C00|0x3C01 -> down */
        {0x1.006p+0f, 0x3C02},                   /* 1 + 3*2^-11: tie 0x3C01|0x3C02 -> up */
        {0x1.002002p+0f, 0x3C01},                /* just above a tie -> up */
        {0x1.001fffep+0f, 0x3C00},               /* just below a tie -> down */
        {0x1.ffep+0f, 0x4000},                   /* tie 0x3FFF|0x4000 -> carry into exponent */
        {0x1p-30f, 0x0000}, {FLT_MIN, 0x0000}, {0x1p-149f, 0x0000}, {-0x1p-149f, 0x8000},
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        cr_assert_eq(na_f32_to_f16_bits(c[k].f), c[k].h, "case %zu: %a -> %04x, want %04x", k,
                     (double)c[k].f, na_f32_to_f16_bits(c[k].f), c[k].h);
        cr_assert_eq(ref_f32_to_f16(c[k].f), c[k].h, "reference disagrees on case %zu", k);
    }
    /* NaNs: both signs, quiet and signalling, with payloads -> sign | 0x7E00 */
    uint32_t nans[] = {0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0xFFFFFFFF,
                       0x7FFFE000, 0x7F802000};
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++)
        cr_assert_eq(na_f32_to_f16_bits(bitsf(nans[k])), (nans[k] >> 16 & 0x8000) | 0x7E00,
                     "NaN %08x", nans[k]);
    /* f16 NaNs decode to quiet f32 NaNs with sign and payload kept */
    cr_assert_eq(fbits(na_f16_bits_to_f32(0x7C01)), 0x7FC02000u); /* signalling -> quiet */
    cr_assert_eq(fbits(na_f16_bits_to_f32(0xFE00)), 0xFFC00000u);
    cr_assert_eq(fbits(na_f16_bits_to_f32(0x7FFF)), 0x7FFFE000u);
    cr_assert_eq(fbits(na_f16_bits_to_f32(0x0001)), fbits(0x1p-24f));
    cr_assert_eq(fbits(na_f16_bits_to_f32(0x8000)), 0x80000000u);
    /* round helpers */
    cr_assert_eq(na_round_f16(65519.99f), 65504.0f);
    cr_assert(isinf(na_round_f16(65520.0f)));
    cr_assert_eq(na_round_f16(0x1.002p+0f), 1.0f);
    cr_assert_eq(na_round_f16(0.1f), (float)ref_f16_decode(0x2E66));
    cr_assert(isnan(na_round_f16(NAN)));
}

/* ---- bf16 --------------------------------------------------------------------------------- */

Test(half, bf16_all_patterns_decode_and_roundtrip) {
    for (uint32_t b = 0; b < 65536; b++) {
        float f = na_bf16_bits_to_f32((uint16_t)b);
        uint32_t u = fbits(f);
        int e = (b >> 7) & 255, m = b & 127;
        cr_assert_eq(u, b << 16, "decode bits %04x", b);
        if (e == 255 && m) {
            cr_assert(isnan(f));
            cr_assert_eq(na_f32_to_bf16_bits(f), 0x7FC0, "NaN back %04x", b);
        } else {
            cr_assert_eq((double)f, ref_bf16_decode((uint16_t)b), "decode %04x", b);
            cr_assert_eq(signbit(f) != 0, (b >> 15) != 0);
            cr_assert_eq(na_f32_to_bf16_bits(f), b, "roundtrip %04x", b);
        }
    }
}

Test(half, f32_to_bf16_random_bits_vs_reference) {
    uint64_t s = 0xBF16BF16ull;
    uint32_t bad = 0, first_bad = 0;
    for (uint32_t n = 0; n < 10000000u / 2; n++) {
        uint64_t r = splitmix64(&s);
        uint32_t w[2] = {(uint32_t)r, (uint32_t)(r >> 32)};
        for (int k = 0; k < 2; k++) {
            if (k == 1 && (n & 1)) w[1] = (w[1] & 0xFFFF0000u) | 0x8000u; /* exact ties */
            float f = bitsf(w[k]);
            if (na_f32_to_bf16_bits(f) != ref_f32_to_bf16(f) && !bad++) first_bad = w[k];
        }
    }
    cr_assert_eq(bad, 0, "%u mismatches, first f32 bits %08x", bad, first_bad);
}

Test(half, bf16_edges) {
    struct { float f; uint16_t b; } c[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000},
        {INFINITY, 0x7F80}, {-INFINITY, 0xFF80},
        {1.0f, 0x3F80}, {-2.0f, 0xC000},
        {FLT_MAX, 0x7F80}, {-FLT_MAX, 0xFF80},          /* rounds up past max finite */
        {0x1.fep+127f, 0x7F7F},                          /* bf16 max finite */
        {0x1.fefffep+127f, 0x7F7F},                      /* just below the overflow tie */
        {0x1.ffp+127f, 0x7F80},                          /* tie max|inf -> even (inf) */
        {0x1p-126f, 0x0080},                             /* min normal */
        {0x1p-133f, 0x0001}, {-0x1p-133f, 0x8001},       /* min subnormal */
        {0x1p-134f, 0x0000}, {-0x1p-134f, 0x8000},       /* half min subnormal: tie -> 0 */
        {0x1.0002p-134f, 0x0001},                        /* just above (+1 f32 ulp) */
        {0x1.8p-133f, 0x0002},                           /* tie 1|2 -> 2 (up) */
        {0x1.4p-132f, 0x0002},                           /* tie 2|3 -> 2 (down) */
        {0x1p-149f, 0x0000},
        {0x1.01p+0f, 0x3F80},                            /* tie 0x3F80|0x3F81 -> down */
        {0x1.03p+0f, 0x3F82},                            /* tie 0x3F81|0x3F82 -> up */
        {0x1.010002p+0f, 0x3F81}, {0x1.00fffep+0f, 0x3F80},
        {0x1.ffp+0f, 0x4000},                            /* carry into exponent */
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        cr_assert_eq(na_f32_to_bf16_bits(c[k].f), c[k].b, "case %zu: %a -> %04x, want %04x", k,
                     (double)c[k].f, na_f32_to_bf16_bits(c[k].f), c[k].b);
        cr_assert_eq(ref_f32_to_bf16(c[k].f), c[k].b, "reference disagrees on case %zu", k);
    }
    uint32_t nans[] = {0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF,
                       0x7F80FFFF, 0x7FFF8000};
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++)
        cr_assert_eq(na_f32_to_bf16_bits(bitsf(nans[k])), 0x7FC0, "NaN %08x", nans[k]);
    cr_assert_eq(na_round_bf16(0x1.01p+0f), 1.0f);
    cr_assert(isinf(na_round_bf16(FLT_MAX)));
    cr_assert(isnan(na_round_bf16(NAN)));
}

/* ---- the CPU backend's array conversions (kernels/cpu/cpu_convert.c) ----------------------
 * Their instruction paths (F16C and AVX2; AVX-512, the 16-lane register conversions of
 * cpu_half_simd.h that the kernels also use inside their loads) must give the half.h bits
 * for every input, NaNs included (they rewrite NaN payloads as half.h does), so the CPU
 * backend stays bit for bit with the CUDA one. All 2^32 f32 inputs go through in blocks
 * against the scalar half.h functions; all 2^16 half inputs the other way; then a sample
 * under FTZ, DAZ and a directed rounding mode in MXCSR, which no path may depend on. */

enum { CONV_BLOCK = 1 << 16 };

static void f32_block(uint32_t hi, float *x) { /* x[j] has the bits hi << 16 | j */
    uint32_t *u = (uint32_t *)(void *)x;
    for (uint32_t j = 0; j < CONV_BLOCK; j++) u[j] = hi << 16 | j;
}

static bool cpu_has_fast_conversions(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

static bool cpu_has_avx512_halves(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

Test(half_cpu, fast_path_in_use_where_the_cpu_has_it) {
    cr_assert_eq(na_cpu_convert_is_fast(), cpu_has_fast_conversions());
    if (!na_cpu_convert_is_fast()) cr_log_info("no AVX2+F16C: only the portable loops checked");
    na_cpu_convert_force_soft = true;
    cr_assert(!na_cpu_convert_is_fast());
    na_cpu_convert_force_soft = false;
    cr_assert_eq(na_cpu_half512(), cpu_has_avx512_halves());
    if (!na_cpu_half512()) cr_log_info("no AVX-512F/BW/VL: the 16-lane conversions not checked");
    na_cpu_half512_off = true;
    cr_assert(!na_cpu_half512());
    na_cpu_half512_off = false;
}

/* each instruction path in turn: AVX-512 (where the CPU has it), then AVX2 + F16C */
#define FOR_EACH_FAST_PATH                                                                   \
    for (int path_ = na_cpu_half512() ? 0 : 1; path_ < 2 || (na_cpu_half512_off = false);   \
         path_++)                                                                            \
        if ((na_cpu_half512_off = path_ == 1), 1)

/* Every f32 bit pattern through `conv`, compared with `ref`: every pattern, not a sample. */
static void all_f32_inputs(void (*conv)(uint16_t *, const float *, int64_t),
                           uint16_t (*ref)(float), const char *what) {
    static float x[CONV_BLOCK];
    static uint16_t got[CONV_BLOCK];
    uint64_t bad = 0;
    uint32_t first_bad = 0;
    for (uint32_t hi = 0; hi < 65536; hi++) {
        f32_block(hi, x);
        conv(got, x, CONV_BLOCK);
        uint32_t miss = 0;
        for (uint32_t j = 0; j < CONV_BLOCK; j++) miss += got[j] != ref(x[j]);
        for (uint32_t j = 0; miss && !bad && j < CONV_BLOCK; j++)
            if (got[j] != ref(x[j]) && !first_bad) first_bad = hi << 16 | j;
        bad += miss;
    }
    cr_assert_eq(bad, 0, "%s: %llu of 2^32 inputs differ from half.h, first f32 bits %08x", what,
                 (unsigned long long)bad, first_bad);
}

static uint16_t ref_f16(float f) { return na_f32_to_f16_bits(f); }
static uint16_t ref_bf16(float f) { return na_f32_to_bf16_bits(f); }

Test(half_cpu, f32_to_f16_every_input_as_half_h) {
    FOR_EACH_FAST_PATH all_f32_inputs(na_cpu_f32_to_f16, ref_f16, "f32 -> f16");
}

Test(half_cpu, f32_to_bf16_every_input_as_half_h) {
    FOR_EACH_FAST_PATH all_f32_inputs(na_cpu_f32_to_bf16, ref_bf16, "f32 -> bf16");
}

static void all_half_inputs(void) {
    static uint16_t h[65536];
    static float got[65536];
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (uint32_t off = 0; off < 16; off++) { /* unaligned starts and every tail length */
        na_cpu_f16_to_f32(got + off, h + off, 65536 - off);
        for (uint32_t i = off; i < 65536; i++)
            cr_assert_eq(fbits(got[i]), fbits(na_f16_bits_to_f32(h[i])), "f16 %04x", i);
        na_cpu_bf16_to_f32(got + off, h + off, 65536 - off);
        for (uint32_t i = off; i < 65536; i++)
            cr_assert_eq(fbits(got[i]), fbits(na_bf16_bits_to_f32(h[i])), "bf16 %04x", i);
    }
}

Test(half_cpu, half_to_f32_every_input_as_half_h) { FOR_EACH_FAST_PATH all_half_inputs(); }

/* f32 -> half at every start and tail length of a 16-lane step, every lane past the count left
 * as it was (the masked stores) */
Test(half_cpu, f32_to_half_tails_write_only_their_count) {
    float x[64];
    uint16_t got[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i * 0.37f - 11.0f;
    x[5] = NAN, x[6] = -INFINITY, x[7] = 1e-30f, x[8] = 65520.0f;
    FOR_EACH_FAST_PATH for (int off = 0; off < 16; off++) for (int n = 0; n <= 40; n++) {
        for (int f16 = 0; f16 < 2; f16++) {
            memset(got, 0xAB, sizeof got);
            (f16 ? na_cpu_f32_to_f16 : na_cpu_f32_to_bf16)(got + off, x + off, n);
            for (int i = 0; i < 64; i++) {
                uint16_t want = i < off || i >= off + n ? 0xABAB
                                : f16             ? na_f32_to_f16_bits(x[i])
                                                  : na_f32_to_bf16_bits(x[i]);
                cr_assert_eq(got[i], want, "%s off %d n %d lane %d", f16 ? "f16" : "bf16", off,
                             n, i);
            }
        }
    }
}

/* 16 low halves per high half (ties, their neighbours and extremes, for every sign, exponent
 * and upper mantissa), then all half inputs, under the current MXCSR. */
static void sample_under_mxcsr(void) {
    static const uint16_t lows[16] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000,
                                      0x3000, 0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xC000, 0xF000,
                                      0xFFFE, 0xFFFF};
    enum { N = 65536 * 16 };
    static float x[N];
    static uint16_t got[N];
    uint32_t *u = (uint32_t *)(void *)x;
    for (uint32_t i = 0; i < N; i++) u[i] = (i >> 4) << 16 | lows[i & 15];
    na_cpu_f32_to_f16(got, x, N);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(got[i], na_f32_to_f16_bits(x[i]), "f16 of %08x", u[i]);
    na_cpu_f32_to_bf16(got, x, N);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(got[i], na_f32_to_bf16_bits(x[i]), "bf16 of %08x", u[i]);
    all_half_inputs();
}

Test(half_cpu, independent_of_ftz_daz_and_rounding_mode) {
#if defined(__x86_64__) || defined(__i386__)
    const unsigned modes[] = {0x8040 | 0x6000, /* FTZ + DAZ, toward zero */
                              0x8040 | 0x4000, /* FTZ + DAZ, up */
                              0x2000};         /* down */
    unsigned saved = _mm_getcsr();
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        _mm_setcsr((saved & ~0xE040u) | modes[k]);
        FOR_EACH_FAST_PATH sample_under_mxcsr();
    }
    _mm_setcsr(saved);
#else
    sample_under_mxcsr();
#endif
}

/* ---- Philox ------------------------------------------------------------------------------- */

Test(philox, random123_known_answers) {
    struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < 3; k++) {
        uint32_t out[4];
        na_philox4x32_10(kat[k].ctr, kat[k].key, out);
        for (int j = 0; j < 4; j++)
            cr_assert_eq(out[j], kat[k].out[j], "kat %zu lane %d: %08x want %08x", k, j, out[j],
                         kat[k].out[j]);
    }
}

Test(philox, element_to_counter_mapping) {
    uint64_t seeds[] = {0, 42, 0x0123456789ABCDEFull};
    uint64_t offs[] = {0, 7, 0xFEDCBA9876543210ull};
    uint64_t idx[] = {0, 1, 2, 3, 4, 5, 1023, (1ull << 34) + 6, 0xFFFFFFFFFFFFFFFFull};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 9; c++) {
                uint64_t s = seeds[a], o = offs[b], i = idx[c];
                uint32_t ctr[4] = {(uint32_t)(i / 4), (uint32_t)((i / 4) >> 32), (uint32_t)o,
                                   (uint32_t)(o >> 32)};
                uint32_t key[2] = {(uint32_t)s, (uint32_t)(s >> 32)};
                uint32_t out[4];
                na_philox4x32_10(ctr, key, out);
                cr_assert_eq(na_philox_u32(s, o, i), out[i % 4]);
                cr_assert_eq(na_philox_uniform(s, o, i), (float)ldexp((double)(out[i % 4] >> 8), -24));
                /* Box–Muller structure: pair members share r^2 = -2 ln u1 */
                unsigned p = (unsigned)(i % 4) & 2u;
                double u1 = ldexp((double)((out[p] >> 8) + 1), -24);
                double u2 = ldexp((double)(out[p + 1] >> 8), -24);
                double r = sqrt(-2.0 * log(u1));
                double want = (i % 2) ? r * sin(2 * M_PI * u2) : r * cos(2 * M_PI * u2);
                cr_assert(fabs(na_philox_normal(s, o, i) - want) < 1e-5 * (1 + fabs(want)),
                          "normal %g vs %g", (double)na_philox_normal(s, o, i), want);
            }
    /* the known-answer counter 0/key 0 is element 0..3 of seed 0, offset 0 */
    cr_assert_eq(na_philox_u32(0, 0, 0), 0x6627e8d5u);
    cr_assert_eq(na_philox_u32(0, 0, 3), 0x9b00dbd8u);
}

Test(philox, pure_function_of_seed_offset_index) {
    enum { N = 4096 };
    static float fwd[N], nfwd[N];
    for (uint64_t i = 0; i < N; i++) {
        fwd[i] = na_philox_uniform(1234, 99, i);
        nfwd[i] = na_philox_normal(1234, 99, i);
    }
    /* any order, interleaved with other streams, gives the same values */
    uint64_t st = 77;
    for (int k = 0; k < 20000; k++) {
        uint64_t i = splitmix64(&st) % N;
        (void)na_philox_u32(splitmix64(&st), splitmix64(&st), i);
        cr_assert_eq(fbits(na_philox_uniform(1234, 99, i)), fbits(fwd[i]));
        cr_assert_eq(fbits(na_philox_normal(1234, 99, i)), fbits(nfwd[i]));
    }
    for (uint64_t i = N; i-- > 0;) cr_assert_eq(fbits(na_philox_uniform(1234, 99, i)), fbits(fwd[i]));
}

Test(philox, different_offsets_and_seeds_give_different_streams) {
    enum { N = 4096 };
    uint32_t same_off = 0, same_seed = 0, shifted = 0;
    for (uint64_t i = 0; i < N; i++) {
        uint32_t a = na_philox_u32(5, 0, i);
        same_off += a == na_philox_u32(5, 1, i);
        same_seed += a == na_philox_u32(6, 0, i);
        /* offset is not an element shift: offset 1 != elements shifted by 4 */
        shifted += a == na_philox_u32(5, 0, i + 4) || na_philox_u32(5, 1, i) == na_philox_u32(5, 0, i + 4);
    }
    cr_assert_leq(same_off, 1);
    cr_assert_leq(same_seed, 1);
    cr_assert_leq(shifted, 2);
    cr_assert_neq(na_philox_u32(5, 1ull << 32, 0), na_philox_u32(5, 0, 0));   /* high offset word */
    cr_assert_neq(na_philox_u32(1ull << 32, 0, 0), na_philox_u32(0, 0, 0));   /* high seed word */
}

Test(philox, uniform_moments_and_range) {
    const uint32_t n = 1000000;
    double sum = 0, sum2 = 0;
    for (uint32_t i = 0; i < n; i++) {
        float u = na_philox_uniform(2024, 3, i);
        cr_assert(u >= 0.0f && u < 1.0f, "u=%a at %u", (double)u, i);
        sum += u;
        sum2 += (u - 0.5) * (u - 0.5);
    }
    double mean = sum / n, var = sum2 / n - (mean - 0.5) * (mean - 0.5);
    double se_mean = sqrt(1.0 / 12 / n);                 /* 2.9e-4 */
    double se_var = sqrt((1.0 / 80 - 1.0 / 144) / n);    /* 7.5e-5 */
    cr_assert(fabs(mean - 0.5) < 5 * se_mean, "mean %g", mean);
    cr_assert(fabs(var - 1.0 / 12) < 5 * se_var, "var %g", var);
    cr_assert_eq(na_philox_uniform(0, 0, 0), (float)(0x6627e8d5u >> 8) * 0x1p-24f);
}

Test(philox, normal_moments) {
    const uint32_t n = 1000000;
    double sum = 0, sum2 = 0, sum4 = 0;
    for (uint32_t i = 0; i < n; i++) {
        double z = na_philox_normal(2024, 3, i);
        cr_assert(isfinite(z));
        sum += z;
        sum2 += z * z;
        sum4 += z * z * z * z;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    cr_assert(fabs(mean) < 5 * sqrt(1.0 / n), "mean %g", mean);
    cr_assert(fabs(var - 1) < 5 * sqrt(2.0 / n), "var %g", var);
    cr_assert(fabs(sum4 / n - 3) < 5 * sqrt(96.0 / n), "4th moment %g", sum4 / n); /* Var z^4 = 96 */
}
