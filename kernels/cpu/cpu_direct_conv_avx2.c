/* kernels/cpu/cpu_direct_conv_avx2.c — the direct convolution's forward and data gradient on
 * AVX2 + FMA + F16C CPUs without AVX-512F (f32 compute, NCHW).
 *
 * The AVX-512 file's scheme (cpu_direct_conv.c: read its header) at 8 lanes and 16 ymm
 * registers: per chunk of up to 24 output pixels (three 8-lane tiles, across image boundaries
 * for small images), a panel panel[k][lane] of the input under tap k = (ci, ki, kj), zero
 * outside the input, then per block of 4 output channels a 4 x 24 register tile
 *     acc[i][t] = bias[co] + sum over k of w[co][k] * panel[k][8t ..]
 * (12 accumulators, 3 panel vectors and one broadcast weight: the 16 registers), stored
 * straight into y's rows. The shape, the K blocks, the image passes, the weight packing (in
 * blocks of 4 outputs) and the data gradient as a convolution of gy with the flipped,
 * transposed weights are the AVX-512 file's (cpu_direct_conv.h).
 *
 * f16/bf16 inputs (autocast) are read in place by the packer, 8 halves at a time, and widened
 * in registers (f16: vcvtph2ps, exact; bf16: << 16), so the panel holds the floats a widened
 * copy would; an f16/bf16 output is rounded from the registers into its half rows (RNE, NaN
 * as common/half.h: f16 sign | 0x7E00, bf16 0x7FC0), the bits of na_cpu_store_f of the f32
 * sums. Each output is one f32 sum in a fixed order (k ascending), tasks are the AVX-512
 * path's image ranges, so results do not depend on the thread count.
 *
 * AVX2 has no 16-bit masked loads: a run of halves loads the 8 halves of its window moved
 * inside the plane and shuffles its lanes into place (pshufb, the other lanes zero). f32 runs
 * take vmaskmovps (masked-off lanes are neither read nor faulted).
 */
#include "cpu/cpu_direct_conv.h"
#include "cpu/cpu_half_simd.h" /* na_h8_widen / na_h8_narrow: halves in registers */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <string.h>
#include <immintrin.h>

#define NA_AVX2_FMA __attribute__((target("avx2,fma,f16c")))

enum { MR = NA_DC2_MR, L = NA_DC2_LANES, NT = NA_DC2_NT, CHUNK = NA_DC2_CHUNK };

bool na_cpu_dc_avx2_cpu(void) {
    /* asked once (CPUID traps in a VM); F16C read directly, as cpu_convert.c does */
    static _Atomic int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        unsigned a, b, c, d;
        has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    }
    return has;
}

/* ---- packing ------------------------------------------------------------------------------ */

static void prefetch_l2(const void *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i, 0, 2);
}

/* The input runs of one 8-lane tile (first pixel pt, in output row oy0 = pt / OW: divided
 * once per tile, not per tap, for the first layer's one channel) for one tap: lanes
 * [a[q], b[q]) read x[off[q] + l] (a tile touches at most 8 output rows). */
typedef struct {
    int n;
    int64_t off[L];
    int a[L], b[L];
} dc2_runs;

static void tile_runs(const dc_shape *s, int64_t pt, int64_t oy0, int ki, int kj,
                      dc2_runs *r) {
    int64_t P = s->OH * s->OW, last = pt + L < P ? pt + L : P;
    r->n = 0;
    for (int64_t oy = oy0; oy * s->OW < last; oy++) {
        int64_t iy = oy * s->sh - s->ph + (int64_t)ki * s->dh;
        if (iy < 0 || iy >= s->H) continue;
        int64_t row0 = oy * s->OW - pt;                 /* lane of this row's ox = 0 */
        int64_t a = row0 > 0 ? row0 : 0;                /* lanes of this output row */
        int64_t b = row0 + s->OW < last - pt ? row0 + s->OW : last - pt;
        int64_t xa = row0 + s->pw - kj, xb = xa + s->W; /* lanes whose ix is in [0, W) */
        if (xa > a) a = xa;
        if (xb < b) b = xb;
        if (a >= b) continue;
        r->off[r->n] = iy * s->W - xa; /* lane l reads row iy, column l - xa */
        r->a[r->n] = (int)a;
        r->b[r->n] = (int)b;
        r->n++;
    }
}

/* lanes [a, b) of 8 32-bit lanes set */
NA_AVX2_FMA static inline __m256i lanes32(int a, int b) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_si256(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(a - 1)),
                            _mm256_cmpgt_epi32(_mm256_set1_epi32(b), idx));
}

/* the same for 8 16-bit lanes */
NA_AVX2_FMA static inline __m128i lanes16(int a, int b) {
    const __m128i idx = _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm_and_si128(_mm_cmpgt_epi16(idx, _mm_set1_epi16((short)(a - 1))),
                         _mm_cmpgt_epi16(_mm_set1_epi16((short)b), idx));
}

/* dst[k*CHUNK + l] = the input under tap k = (ci - c0, ki, kj) of output pixel pt + l, for
 * the f32 channels [c0, c1) of the planes at x: zero outside the input and past the last
 * pixel. Addresses are formed as integers: a masked-off lane's may lie outside the plane. */
NA_AVX2_FMA static void pack_f32(const dc_shape *s, const float *x, int64_t pt, int64_t c0,
                                 int64_t c1, float *restrict dst) {
    const int64_t HW = s->H * s->W, taps = (int64_t)s->KH * s->KW;
    const uintptr_t step = (uintptr_t)HW * sizeof(float);
    const int64_t oy0 = pt / s->OW;
    dc2_runs r;
    for (int ki = 0; ki < s->KH; ki++)
        for (int kj = 0; kj < s->KW; kj++) {
            tile_runs(s, pt, oy0, ki, kj, &r);
            float *d = dst + (ki * s->KW + kj) * CHUNK;
            uintptr_t plane = (uintptr_t)(x + c0 * HW);
            if (r.n <= 2) { /* the usual case: runs in registers */
                __m256i m0 = r.n > 0 ? lanes32(r.a[0], r.b[0]) : _mm256_setzero_si256();
                __m256i m1 = r.n > 1 ? lanes32(r.a[1], r.b[1]) : _mm256_setzero_si256();
                uintptr_t o0 = (uintptr_t)(r.n > 0 ? r.off[0] : 0) * sizeof(float);
                uintptr_t o1 = (uintptr_t)(r.n > 1 ? r.off[1] : 0) * sizeof(float);
                for (int64_t ci = c0; ci < c1; ci++, d += taps * CHUNK, plane += step) {
                    __m256 v = _mm256_maskload_ps((const float *)(plane + o0), m0);
                    v = _mm256_or_ps(v, _mm256_maskload_ps((const float *)(plane + o1), m1));
                    _mm256_store_ps(d, v);
                }
                continue;
            }
            __m256i m[L];
            for (int q = 0; q < r.n; q++) m[q] = lanes32(r.a[q], r.b[q]);
            for (int64_t ci = c0; ci < c1; ci++, d += taps * CHUNK, plane += step) {
                __m256 v = _mm256_setzero_ps();
                for (int q = 0; q < r.n; q++)
                    v = _mm256_or_ps(v, _mm256_maskload_ps(
                                            (const float *)(plane + (uintptr_t)r.off[q] *
                                                                        sizeof(float)),
                                            m[q]));
                _mm256_store_ps(d, v);
            }
        }
}

/* The shuffle that takes lanes [a, b) of a run from the 8 halves at base (the run's
 * window [off, off + 8) moved inside the plane): lane l gets element l + off - base, the
 * others zero (pshufb's 0x80). */
NA_AVX2_FMA static inline __m128i run_shuffle(int64_t off, int64_t base, int a, int b) {
    __m128i e = _mm_add_epi16(_mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7),
                              _mm_set1_epi16((short)(off - base)));
    __m128i lo = _mm_slli_epi16(e, 1); /* the element's bytes 2e, 2e + 1 */
    __m128i c = _mm_or_si128(lo, _mm_slli_epi16(_mm_add_epi16(lo, _mm_set1_epi16(1)), 8));
    __m128i in = lanes16(a, b);
    return _mm_or_si128(_mm_and_si128(c, in),
                        _mm_andnot_si128(in, _mm_set1_epi16((short)0x8080)));
}

/* pack_f32's floats from f16 (f16) or bf16 planes, widened in registers. AVX2 has no 16-bit
 * masked load: each run loads the 8 halves of its window moved inside the plane (a plane's
 * first and last pixels) and shuffles its lanes into place; planes of fewer than 8 pixels
 * are gathered lane by lane. */
NA_AVX2_FMA static void pack_16(const dc_shape *s, const uint16_t *x, int64_t pt, int64_t c0,
                                int64_t c1, float *restrict dst, bool f16) {
    const int64_t HW = s->H * s->W, taps = (int64_t)s->KH * s->KW;
    const int64_t oy0 = pt / s->OW;
    dc2_runs r;
    for (int ki = 0; ki < s->KH; ki++)
        for (int kj = 0; kj < s->KW; kj++) {
            tile_runs(s, pt, oy0, ki, kj, &r);
            float *d = dst + (ki * s->KW + kj) * CHUNK;
            if (HW < L) {
                for (int64_t ci = c0; ci < c1; ci++, d += taps * CHUNK) {
                    const uint16_t *plane = x + ci * HW;
                    uint16_t h[L] = {0};
                    for (int q = 0; q < r.n; q++)
                        for (int l = r.a[q]; l < r.b[q]; l++) h[l] = plane[r.off[q] + l];
                    _mm256_store_ps(d, na_h8_widen(f16, _mm_loadu_si128((const __m128i *)h)));
                }
                continue;
            }
            __m128i sh[L];
            int64_t base[L];
            for (int q = 0; q < r.n; q++) {
                int64_t o = r.off[q];
                base[q] = o < 0 ? 0 : o + L > HW ? HW - L : o;
                sh[q] = run_shuffle(o, base[q], r.a[q], r.b[q]);
            }
            const uint16_t *plane = x + c0 * HW;
            if (r.n <= 2) { /* the usual case: runs in registers */
                const __m128i z = _mm_set1_epi16((short)0x8080);
                __m128i s0 = r.n > 0 ? sh[0] : z, s1 = r.n > 1 ? sh[1] : z;
                int64_t b0 = r.n > 0 ? base[0] : 0, b1 = r.n > 1 ? base[1] : 0;
                for (int64_t ci = c0; ci < c1; ci++, d += taps * CHUNK, plane += HW) {
                    __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(plane + b0)), s0);
                    v = _mm_or_si128(v, _mm_shuffle_epi8(
                                            _mm_loadu_si128((const __m128i *)(plane + b1)), s1));
                    _mm256_store_ps(d, na_h8_widen(f16, v));
                }
                continue;
            }
            for (int64_t ci = c0; ci < c1; ci++, d += taps * CHUNK, plane += HW) {
                __m128i v = _mm_setzero_si128();
                for (int q = 0; q < r.n; q++)
                    v = _mm_or_si128(v, _mm_shuffle_epi8(
                                            _mm_loadu_si128((const __m128i *)(plane + base[q])),
                                            sh[q]));
                _mm256_store_ps(d, na_h8_widen(f16, v));
            }
        }
}

/* ---- the register tile -------------------------------------------------------------------
 * rows (<= 4) output channels x nt tiles of one chunk, lanes l < valid[t]:
 *     acc[i][t] = (partial ? the stored partial sums : bias[i]) + w . panel
 * wp: the block's packed weights [K][4] (rows past `rows` are zero). The sums go to f32 rows
 * (f[t] + i*ldf: y itself, or a chunk's partial sums when a half output has several K
 * blocks), or, in the last K block of an f16/bf16 output, are rounded in registers to the
 * half rows h[t] + i*ldh. */
typedef struct {
    float *f[NT];
    int64_t ldf;
    uint16_t *h[NT];
    int64_t ldh;
    bool partial, half, f16;
} dc2_out;

NA_AVX2_FMA static inline __m256i lane_mask(int n) { return lanes32(0, n); }

NA_AVX2_FMA static inline void store_f32(float *p, int valid, __m256i m, __m256 v) {
    if (valid == L) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, m, v);
}

NA_AVX2_FMA static inline void store_half(uint16_t *p, int valid, bool f16, __m256 v) {
    __m128i h = na_h8_narrow(f16, v);
    if (valid == L) {
        _mm_storeu_si128((__m128i *)p, h);
        return;
    }
    uint16_t t[L];
    _mm_storeu_si128((__m128i *)t, h);
    memcpy(p, t, (size_t)valid * sizeof(uint16_t));
}

#define NA_DC2_DEFINE_TILE(NAME, NTT)                                                       \
    NA_AVX2_FMA static void NAME(int64_t K, const float *restrict wp,                       \
                                 const float *restrict panel, const float *bias, int rows,  \
                                 const dc2_out *o, const int *valid) {                      \
        const int64_t ldf = o->ldf;                                                         \
        __m256 acc[MR][NTT];                                                                \
        __m256i m[NTT];                                                                     \
        _Pragma("GCC unroll 3") for (int t = 0; t < NTT; t++) m[t] = lane_mask(valid[t]);   \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                              \
            __m256 b0 = _mm256_set1_ps(bias && i < rows ? bias[i] : 0.0f);                  \
            _Pragma("GCC unroll 3") for (int t = 0; t < NTT; t++)                           \
                acc[i][t] = o->partial && i < rows                                          \
                                ? _mm256_maskload_ps(o->f[t] + i * ldf, m[t])               \
                                : b0;                                                       \
        }                                                                                   \
        for (int64_t k = 0; k < K; k++) {                                                   \
            __m256 v[NTT];                                                                  \
            _Pragma("GCC unroll 3") for (int t = 0; t < NTT; t++)                           \
                v[t] = _mm256_load_ps(panel + k * CHUNK + t * L);                           \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                          \
                __m256 w = _mm256_broadcast_ss(wp + k * MR + i);                            \
                _Pragma("GCC unroll 3") for (int t = 0; t < NTT; t++)                       \
                    acc[i][t] = _mm256_fmadd_ps(w, v[t], acc[i][t]);                        \
            }                                                                               \
        }                                                                                   \
        if (o->half) {                                                                      \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                          \
                if (i >= rows) break;                                                       \
                _Pragma("GCC unroll 3") for (int t = 0; t < NTT; t++)                       \
                    store_half(o->h[t] + i * o->ldh, valid[t], o->f16, acc[i][t]);          \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                              \
            if (i >= rows) break;                                                           \
            _Pragma("GCC unroll 3") for (int t = 0; t < NTT; t++)                           \
                store_f32(o->f[t] + i * ldf, valid[t], m[t], acc[i][t]);                    \
        }                                                                                   \
    }
NA_DC2_DEFINE_TILE(tile1, 1)
NA_DC2_DEFINE_TILE(tile2, 2)
NA_DC2_DEFINE_TILE(tile3, 3)

typedef void dc2_tile_fn(int64_t, const float *, const float *, const float *, int,
                         const dc2_out *, const int *);
static dc2_tile_fn *const dc2_tiles[NT + 1] = {NULL, tile1, tile2, tile3};

/* conv_images of cpu_direct_conv.c at 8 lanes (the arguments of na_cpu_dc_images_avx2) */
NA_AVX2_FMA static void images(const dc_shape *s, na_dtype xdt, int64_t nb, const void *x,
                               int64_t x_img, const float *wp, const float *bias,
                               const dc_dst *d, float *panel) {
    const int64_t P = s->OH * s->OW, tiles = (P + L - 1) / L, total = nb * tiles;
    const int64_t taps = (int64_t)s->KH * s->KW, bc = na_cpu_dc_block_channels(s, false);
    const int64_t esz = xdt == NA_DTYPE_F32 ? (int64_t)sizeof(float) : (int64_t)sizeof(uint16_t);
    const int64_t oesz = d->half ? (int64_t)sizeof(uint16_t) : (int64_t)sizeof(float);
    const bool f16 = xdt == NA_DTYPE_F16;
    const char *xc = x;
    int64_t fetched = (NT - 1) / tiles; /* images asked for ahead so far */
    for (int64_t t0 = 0; t0 < total; t0 += NT) {
        int nt = (int)(total - t0 < NT ? total - t0 : NT);
        int64_t ahead = (t0 + 2 * NT - 1) / tiles; /* the last image of the next chunk */
        for (; fetched < ahead && fetched + 1 < nb; fetched++)
            prefetch_l2(xc + (fetched + 1) * x_img * esz, s->cin * s->H * s->W * esz);
        const char *xt[NT];
        char *out[NT]; /* each tile's first output element, of oesz bytes */
        int64_t pt[NT];
        int valid[NT];
        for (int t = 0; t < nt; t++) {
            int64_t b = (t0 + t) / tiles;
            pt[t] = (t0 + t) % tiles * L;
            valid[t] = (int)(P - pt[t] < L ? P - pt[t] : L);
            xt[t] = xc + b * x_img * esz;
            out[t] = (char *)d->y + (b * d->y_img + pt[t]) * oesz;
        }
        for (int64_t c0 = 0; c0 < s->cin; c0 += bc) {
            int64_t c1 = c0 + bc < s->cin ? c0 + bc : s->cin;
            int64_t kn = (c1 - c0) * taps, k0 = c0 * taps;
            for (int t = 0; t < nt; t++) {
                if (xdt == NA_DTYPE_F32)
                    pack_f32(s, (const float *)xt[t], pt[t], c0, c1, panel + t * L);
                else
                    pack_16(s, (const uint16_t *)xt[t], pt[t], c0, c1, panel + t * L, f16);
            }
            /* a half output: rounded in the last K block, partial sums before it in part */
            dc2_out o = {.partial = c0 > 0, .half = d->half && c1 == s->cin, .f16 = d->f16,
                         .ldf = d->half ? CHUNK : P, .ldh = P};
            for (int64_t b = 0; b < s->blocks; b++) {
                int64_t co = b * MR;
                int rows = (int)(s->cout - co < MR ? s->cout - co : MR);
                for (int t = 0; t < nt; t++) {
                    if (!d->half) {
                        o.f[t] = (float *)out[t] + co * P;
                    } else {
                        o.h[t] = (uint16_t *)out[t] + co * P;
                        o.f[t] = d->part ? d->part + co * CHUNK + t * L : NULL;
                    }
                }
                dc2_tiles[nt](kn, wp + (b * s->K + k0) * MR, panel, bias ? bias + co : NULL,
                              rows, &o, valid);
            }
        }
    }
}

void na_cpu_dc_images_avx2(const dc_shape *s, na_dtype xdt, int64_t nb, const void *x,
                           int64_t x_img, const float *wp, const float *bias, const dc_dst *d,
                           float *panel) {
    images(s, xdt, nb, x, x_img, wp, bias, d, panel);
}

/* ---- the 3x3 weight gradient (cpu_direct_conv.h) ------------------------------------------ */

enum { WL_CO = 32 }; /* the AVX-512 file's block of output channels in gt */

static inline __attribute__((always_inline)) NA_AVX2_FMA void
wgrad_tile_ow(const float *restrict gt, const float *restrict xp, int64_t x_img, int64_t nb,
              const dc_shape *s, int64_t Wp, float *restrict ct, int64_t ld, int64_t OW) {
    const int64_t rs = s->sh * Wp, ks = s->dh * Wp;
    for (int j = 0; j < WL_CO; j += L) { /* 8 channels x 9 taps: 9 accumulators */
        __m256 acc[9];
        for (int t = 0; t < 9; t++) acc[t] = _mm256_loadu_ps(ct + t * ld + j);
        const float *g = gt + j;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t oy = 0; oy < s->OH; oy++) {
                const float *x0 = xp + b * x_img + oy * rs, *x1 = x0 + ks, *x2 = x1 + ks;
                _Pragma("GCC unroll 4") for (int64_t ox = 0; ox < OW; ox++, g += WL_CO) {
                    __m256 gv = _mm256_loadu_ps(g);
                    const float *xr[3] = {x0 + ox, x1 + ox, x2 + ox};
                    for (int ki = 0; ki < 3; ki++)
                        for (int kj = 0; kj < 3; kj++)
                            acc[ki * 3 + kj] = _mm256_fmadd_ps(
                                gv, _mm256_broadcast_ss(xr[ki] + kj), acc[ki * 3 + kj]);
                }
            }
        for (int t = 0; t < 9; t++) _mm256_storeu_ps(ct + t * ld + j, acc[t]);
    }
}

NA_AVX2_FMA void na_cpu_dc_wgrad_tile_avx2(const float *gt, const float *xp, int64_t x_img,
                                           int64_t nb, const dc_shape *s, int64_t Wp, float *ct,
                                           int64_t ld) {
    if (s->OW == 4) wgrad_tile_ow(gt, xp, x_img, nb, s, Wp, ct, ld, 4);
    else if (s->OW == 8) wgrad_tile_ow(gt, xp, x_img, nb, s, Wp, ct, ld, 8);
    else wgrad_tile_ow(gt, xp, x_img, nb, s, Wp, ct, ld, s->OW);
}

/* r[c] = column c of the 8 x 8 block r (row i in r[i]): three rounds of shuffles */
static inline __attribute__((always_inline)) NA_AVX2_FMA void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) { /* [a0 b0 a1 b1 | a4 b4 a5 b5], [a2 b2 a3 b3 | a6 ..] */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* [a0 b0 c0 d0 | a4 b4 c4 d4], then columns 1, 2, 3 */
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) { /* rows 0-3 of column i (and 4 + i) beside rows 4-7 */
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* the m (<= 8) elements of row i at src + off as f32, lanes past m 0: dt is a constant in
 * each instance below (f16 by F16C, bf16 by << 16: cpu_half_simd.h's bits) */
static inline __attribute__((always_inline)) NA_AVX2_FMA __m256
row8(na_dtype dt, const void *src, int64_t off, int64_t m) {
    if (dt == NA_DTYPE_F32) return na_f8_load((const float *)src + off, m);
    return na_h8_load(dt == NA_DTYPE_F16, (const uint16_t *)src + off, m);
}

static inline __attribute__((always_inline)) NA_AVX2_FMA void
transpose_to_f32(na_dtype dt, const void *src, int64_t lds, int64_t nr, int64_t nw, int64_t nc,
                 float *dst, int64_t ldd) {
    for (int64_t r0 = 0; r0 < nw; r0 += L) {
        int64_t w = nw - r0 < L ? nw - r0 : L, v = nr - r0 < 0 ? 0 : nr - r0 < L ? nr - r0 : L;
        if (v == 0) { /* rows past nr: the zeros only */
            for (int64_t c = 0; c < nc; c++)
                na_f8_store(dst + c * ldd + r0, w, _mm256_setzero_ps());
            continue;
        }
        for (int64_t c0 = 0; c0 < nc; c0 += L) {
            int64_t m = nc - c0 < L ? nc - c0 : L;
            __m256 r[L];
            for (int i = 0; i < L; i++)
                r[i] = i < v ? row8(dt, src, (r0 + i) * lds + c0, m) : _mm256_setzero_ps();
            transpose8(r);
            if (w == L && m == L)
                for (int k = 0; k < L; k++) _mm256_storeu_ps(dst + (c0 + k) * ldd + r0, r[k]);
            else
                for (int k = 0; k < m; k++) na_f8_store(dst + (c0 + k) * ldd + r0, w, r[k]);
        }
    }
}

static inline __attribute__((always_inline)) NA_AVX2_FMA void
pad_plane(na_dtype dt, const void *src, int64_t H, int64_t W, int64_t ph, int64_t pw,
          int64_t Hp, int64_t Wp, float *dst) {
    memset(dst, 0, (size_t)(ph * Wp) * sizeof(float));
    for (int64_t iy = 0; iy < H; iy++) {
        float *d = dst + (ph + iy) * Wp;
        for (int64_t c = 0; c < pw; c++) d[c] = 0;
        for (int64_t c = 0; c < W; c += L)
            na_f8_store(d + pw + c, W - c, row8(dt, src, iy * W + c, W - c));
        for (int64_t c = pw + W; c < Wp; c++) d[c] = 0;
    }
    memset(dst + (ph + H) * Wp, 0, (size_t)((Hp - ph - H) * Wp) * sizeof(float));
}

NA_AVX2_FMA void na_cpu_dc_pad_plane_avx2(na_dtype dt, const void *src, int64_t H, int64_t W,
                                          int64_t ph, int64_t pw, int64_t Hp, int64_t Wp,
                                          float *dst) {
    if (dt == NA_DTYPE_F16) pad_plane(NA_DTYPE_F16, src, H, W, ph, pw, Hp, Wp, dst);
    else if (dt == NA_DTYPE_BF16) pad_plane(NA_DTYPE_BF16, src, H, W, ph, pw, Hp, Wp, dst);
    else pad_plane(NA_DTYPE_F32, src, H, W, ph, pw, Hp, Wp, dst);
}

NA_AVX2_FMA void na_cpu_dc_transpose_avx2(na_dtype dt, const void *src, int64_t lds, int64_t nr,
                                          int64_t nw, int64_t nc, float *dst, int64_t ldd) {
    if (dt == NA_DTYPE_F16) transpose_to_f32(NA_DTYPE_F16, src, lds, nr, nw, nc, dst, ldd);
    else if (dt == NA_DTYPE_BF16) transpose_to_f32(NA_DTYPE_BF16, src, lds, nr, nw, nc, dst, ldd);
    else transpose_to_f32(NA_DTYPE_F32, src, lds, nr, nw, nc, dst, ldd);
}

#else /* no AVX2 tiles here: na_cpu_direct_avx2() is false */

bool na_cpu_dc_avx2_cpu(void) { return false; }

void na_cpu_dc_images_avx2(const dc_shape *s, na_dtype xdt, int64_t nb, const void *x,
                           int64_t x_img, const float *wp, const float *bias, const dc_dst *d,
                           float *panel) {
    (void)s, (void)xdt, (void)nb, (void)x, (void)x_img, (void)wp, (void)bias, (void)d,
        (void)panel;
}

void na_cpu_dc_wgrad_tile_avx2(const float *gt, const float *xp, int64_t x_img, int64_t nb,
                               const dc_shape *s, int64_t Wp, float *ct, int64_t ld) {
    (void)gt, (void)xp, (void)x_img, (void)nb, (void)s, (void)Wp, (void)ct, (void)ld;
}

void na_cpu_dc_transpose_avx2(na_dtype dt, const void *src, int64_t lds, int64_t nr, int64_t nw,
                              int64_t nc, float *dst, int64_t ldd) {
    (void)dt, (void)src, (void)lds, (void)nr, (void)nw, (void)nc, (void)dst, (void)ldd;
}

void na_cpu_dc_pad_plane_avx2(na_dtype dt, const void *src, int64_t H, int64_t W, int64_t ph,
                              int64_t pw, int64_t Hp, int64_t Wp, float *dst) {
    (void)dt, (void)src, (void)H, (void)W, (void)ph, (void)pw, (void)Hp, (void)Wp, (void)dst;
}
#endif
