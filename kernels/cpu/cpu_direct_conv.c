/* kernels/cpu/cpu_direct_conv.c — direct 2-d convolution on AVX-512 (f32 compute, NCHW).
 *
 * The im2col + GEMM path (cpu_conv.c) moves every activation three or four times around the
 * product: im2col, OpenBLAS's own packing, the output block back into NCHW, and for the data
 * gradient a gather of gy, a zero fill and col2im. Here the product reads its input through a
 * small packed panel and writes its output in place:
 *
 *   per image and group, per chunk of up to 48 output pixels (p = oy*OW + ox, three 16-lane
 *   tiles), pack panel[k][lane] = x[ci][oy*sh - ph + ki*dh][ox - pw + kj] for k = (ci, ki, kj),
 *   zero outside the input (masked unaligned loads, one per output row the tile touches);
 *   then per block of 8 output channels an 8 x 48 register tile
 *       acc[i][t] = bias[co] + sum over k of w[co][k] * panel[k][16t ..]
 *   (24 accumulators, one FMA per accumulator per k), stored straight into y's rows; an
 *   f16/bf16 y (autocast) is rounded from the registers into its half rows (RNE, NaN as
 *   half.h), with no f32 copy of y and no conversion pass.
 *
 * The data gradient of a stride-1, dilation-1 convolution is itself such a convolution: gy
 * convolved with the weights flipped in space and transposed in channels, padded by k-1-p. So
 * the same code writes gx directly, with no col2im and no zero fill.
 *
 * Each output element is one sum in a fixed order (k ascending) and tasks are image ranges
 * fixed by the problem's size, so results do not depend on the thread count. The order
 * differs from the GEMM path's, so the two agree to rounding, not bit for bit (tests in
 * tests/test_cpu_kernels.c hold both to the specification's error bound).
 *
 * The weight gradient gW = gy . col^T reduces along pixels. For 3x3 kernels output channels
 * run in the lanes (wgrad_lanes): gy transposed per block of images, x copied once into padded
 * planes whose shifted addresses are the 9 taps, an FMA chain per element over the pixels. Other
 * shapes run dot products over 16-pixel lanes (abt): the columns packed per block of images in
 * whole 16-pixel tiles by the same packer, gy's rows copied beside them, and no OpenBLAS
 * packing. (bf16: the pairs are consecutive pixels on both.)
 *
 * Used for f32 compute (f32, f16 and bf16 tensors, widened per image as the GEMM path does;
 * f16 input on a CPU with AVX-512BW is read in place instead, its 16-bit runs converted by the
 * packer with vcvtph2ps, so it costs the f32 path's time at half the bytes; f64, the gradient
 * checks' reference, keeps the GEMM path) when the CPU has AVX-512F, the
 * horizontal stride and dilation are 1 (the panel's rows are then contiguous input runs), and
 * NANOAMP_CPU_CONV is not "gemm". Measured in docs/benchmarks.md.
 *
 * A CPU with AVX2 + FMA + F16C but no AVX-512F runs the forward and the data gradient on the
 * 8-lane tiles of cpu_direct_conv_avx2.c (4 outputs x 24 pixels), through this file's job,
 * passes and weight packing (blocks of NA_DC2_MR outputs); its 3x3 weight gradient runs
 * wgrad_lanes with the 8-lane tile na_cpu_dc_wgrad_tile_avx2, its copies by the 8x8
 * transposes and plane copy of that file (halves widened in registers), other sizes im2col +
 * GEMM (na_cpu_direct_wgrad_usable).
 *
 * bf16 x bf16 (autocast bf16) on AVX512_BF16 (na_cpu_bf16_fast): the same kernels read the bf16
 * tensors in place and multiply with vdpbf16ps, which adds a pair of bf16 products into each
 * f32 lane. The forward's panel holds 32-bit pairs of input channels per tap, the weights the
 * same pairs, and the tile broadcasts a pair where the f32 tile broadcasts a float; the weight
 * gradient's rows are bf16 in whole 32-pixel vectors, so its pairs are consecutive pixels.
 * The products are exact in f32, so each output is the widening path's f32 sum in another
 * order, rounded once; denormal inputs and results are zero (the instruction's DAZ/FTZ). The
 * widening path stays the specification (NANOAMP_CPU_BF16=off, na_cpu_bf16_force_spec).
 */

#include "cpu/cpu_direct_conv.h"
#include "cpu/cpu_half_simd.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_parallel.h"
#include "nanoamp/threads.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define NA_DC_X86 1
#include <immintrin.h>
#define NA_AVX512 __attribute__((target("avx512f,fma")))
#define NA_BF16 __attribute__((target("avx512f,fma,avx512bw,avx512vl,avx512bf16")))
/* the tiles that round to a half output (na_h512_store) */
#define NA_AVX512_HALF __attribute__((target("avx512f,fma,avx512bw,avx512vl,f16c")))
#define NA_BF16_HALF __attribute__((target("avx512f,fma,avx512bw,avx512vl,avx512bf16,f16c")))
#endif

bool na_cpu_conv_force_gemm = false;
bool na_cpu_conv_half_out_off = false;

enum { DC_MR = 8, DC_LANES = 16, DC_NT = 3, DC_CHUNK = DC_LANES * DC_NT };
enum { NA_CPU_DIRECT_ROW_TASKS = 8 }; /* most tasks of a weight gradient split by rows */

static bool env_forces_gemm(void) {
    static _Atomic int gemm = -1;
    return na_cpu_env_is(&gemm, "NANOAMP_CPU_CONV", "gemm");
}

bool na_cpu_direct_avx2_off = false;

/* AVX2 + FMA + F16C and no AVX-512F (which takes the AVX-512 tiles), the hook off */
bool na_cpu_direct_avx2(void) {
    return !na_cpu_direct_avx2_off && !na_cpu_has_avx512f() && na_cpu_dc_avx2_cpu();
}

bool na_cpu_direct_conv_usable(const na_conv_geom *g, bool backward_data) {
    if (na_cpu_conv_force_gemm || na_cpu_reproducible() || env_forces_gemm() ||
        (!na_cpu_has_avx512f() && !na_cpu_direct_avx2()))
        return false;
    if (g->sw != 1 || g->dw != 1 || g->h * g->w > INT32_MAX || g->oh * g->ow > INT32_MAX)
        return false;
    /* the data gradient as a convolution of gy needs padding k-1-p >= 0 */
    return !backward_data ||
           (g->sh == 1 && g->dh == 1 && g->ph <= g->kh - 1 && g->pw <= g->kw - 1);
}

bool na_cpu_wgrad_avx2_off = false;
bool na_cpu_wgrad_avx2_copies_off = false;

/* NANOAMP_CPU_WGRAD_AVX2=off: the AVX2 weight gradient back to im2col + GEMM (A/B timing) */
static bool env_wgrad_avx2_off(void) {
    static _Atomic int off = -1;
    return na_cpu_env_is(&off, "NANOAMP_CPU_WGRAD_AVX2", "off");
}

/* the 3x3 shapes whose taps the padded planes hold (wgrad_lanes), not empty */
static bool wgrad_lanes_shape(const na_conv_geom *g) {
    return g->kh == 3 && g->kw == 3 && g->oh > 0 && g->ow > 0 && g->c_in > 0 &&
           g->c_out > 0 && (g->oh - 1) * g->sh + 2 * g->dh < g->h + 2 * g->ph &&
           g->ow + 2 <= g->w + 2 * g->pw;
}

/* AVX-512F: every shape; AVX2: the 3x3 shapes of wgrad_lanes (abt is AVX-512 only) but maps
 * of at most 16 output pixels with 256 or more input channels a group: there the 8-lane tile
 * ran 1.1-1.2x the GEMM path's time (ResNet-9's 512 -> 512 4x4 layer, batch 32, one thread:
 * 59-63 ms against 55-58, 2026-12-02; its 256 -> 512 8x8 layer ties, 73-83 against 79-80) */
bool na_cpu_direct_wgrad_usable(const na_conv_geom *g) {
    if (!na_cpu_direct_conv_usable(g, false)) return false;
    if (na_cpu_has_avx512f()) return true;
    bool small_deep = g->oh * g->ow <= 16 && g->c_in / g->groups >= 256;
    return !na_cpu_wgrad_avx2_off && !env_wgrad_avx2_off() && g->n > 0 &&
           wgrad_lanes_shape(g) && !small_deep;
}

int64_t na_cpu_dc_block_channels(const dc_shape *s, bool bf) {
    int64_t taps = (int64_t)s->KH * s->KW, most = 1344 / taps < 1 ? 1 : 1344 / taps;
    if (bf) most *= 2;
    int64_t blocks = (s->cin + most - 1) / most, bc = (s->cin + blocks - 1) / blocks;
    return bf && blocks > 1 ? (bc + 1) / 2 * 2 : bc;
}

/* rows of one K block's panel: floats, or bf16 pairs */
static int64_t panel_rows(const dc_shape *s, bool bf) {
    int64_t bc = na_cpu_dc_block_channels(s, bf), taps = (int64_t)s->KH * s->KW;
    return (bf ? (bc + 1) / 2 : bc) * taps;
}

#ifdef NA_DC_X86

/* ---- packing ------------------------------------------------------------------------------ */

/* Asks for the bytes at p in L2 ahead of their packing: an image's planes come from L3 or
 * memory, and the packer's masked loads stalled on them. */
static void prefetch_l2(const void *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i, 0, 2);
}

/* The input runs of one tile for one tap: lane l reads x[off[s] + l] where bit l of m[s] is
 * set (a 16-lane tile touches at most 16 output rows). */
typedef struct {
    int n;
    int64_t off[DC_LANES];
    __mmask16 m[DC_LANES];
} dc_runs;

static void tile_runs(const dc_shape *s, int64_t pt, int ki, int kj, dc_runs *r) {
    int64_t P = s->OH * s->OW, last = pt + DC_LANES < P ? pt + DC_LANES : P;
    r->n = 0;
    for (int64_t oy = pt / s->OW; oy * s->OW < last; oy++) {
        int64_t iy = oy * s->sh - s->ph + (int64_t)ki * s->dh;
        if (iy < 0 || iy >= s->H) continue;
        int64_t row0 = oy * s->OW - pt;             /* lane of this row's ox = 0 */
        int64_t a = row0 > 0 ? row0 : 0;            /* lanes of this output row */
        int64_t b = row0 + s->OW < last - pt ? row0 + s->OW : last - pt;
        int64_t xa = row0 + s->pw - kj, xb = xa + s->W; /* lanes whose ix is in [0, W) */
        if (xa > a) a = xa;
        if (xb < b) b = xb;
        if (a >= b) continue;
        r->off[r->n] = iy * s->W - xa;              /* lane l reads row iy, column l - xa */
        r->m[r->n] = (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
        r->n++;
    }
}

/* dst[k*ld + l] = the input under tap k = (ci - c0, ki, kj) of output pixel pt + l, for the
 * channels [c0, c1) of the planes at x: zero outside the input and past the last pixel */
NA_AVX512 static void pack_tile(const dc_shape *s, const float *x, int64_t pt, int64_t c0,
                                int64_t c1, float *restrict dst, int64_t ld) {
    const int64_t HW = s->H * s->W, taps = (int64_t)s->KH * s->KW;
    dc_runs runs;
    for (int ki = 0; ki < s->KH; ki++)
        for (int kj = 0; kj < s->KW; kj++) {
            tile_runs(s, pt, ki, kj, &runs);
            float *d = dst + (ki * s->KW + kj) * ld;
            /* masked-off lanes are neither read nor faulted: the address may lie outside the
             * plane, so it is formed as an integer. A tile within two output rows (the usual
             * case) takes the loop with its runs in registers. */
            uintptr_t plane = (uintptr_t)(x + c0 * HW), step = (uintptr_t)HW * sizeof(float);
            if (runs.n <= 2) {
                __mmask16 m0 = runs.n > 0 ? runs.m[0] : 0, m1 = runs.n > 1 ? runs.m[1] : 0;
                uintptr_t o0 = (uintptr_t)(runs.n > 0 ? runs.off[0] : 0) * sizeof(float);
                uintptr_t o1 = (uintptr_t)(runs.n > 1 ? runs.off[1] : 0) * sizeof(float);
                for (int64_t ci = c0; ci < c1; ci++, d += taps * ld, plane += step) {
                    __m512 v = _mm512_maskz_loadu_ps(m0, (const void *)(plane + o0));
                    v = _mm512_mask_loadu_ps(v, m1, (const void *)(plane + o1));
                    _mm512_storeu_ps(d, v);
                }
                continue;
            }
            for (int64_t ci = c0; ci < c1; ci++, d += taps * ld, plane += step) {
                __m512 v = _mm512_setzero_ps();
                for (int q = 0; q < runs.n; q++)
                    v = _mm512_mask_loadu_ps(
                        v, runs.m[q],
                        (const void *)(plane + (uintptr_t)runs.off[q] * sizeof(float)));
                _mm512_storeu_ps(d, v);
            }
        }
}

/* The 16 bf16 lanes of one tile for one tap, from the plane at byte address `plane`: the f32
 * packer's masked loads at half the width. */
NA_BF16 static inline __m256i runs_load_bf16(const dc_runs *r, uintptr_t plane) {
    __m256i v = _mm256_setzero_si256();
    for (int q = 0; q < r->n; q++) {
        uintptr_t at = plane + (uintptr_t)r->off[q] * sizeof(uint16_t);
        v = _mm256_mask_loadu_epi16(v, r->m[q], (const void *)at);
    }
    return v;
}

/* bf16 planes, for the forward and the data gradient: dst[(tap*np + p)*ld + l] (32 bits) =
 * the pair (channel c0+2p in the low half, c0+2p+1 in the high half) under tap = (ki, kj) of
 * output pixel pt + l, np = ceil((c1 - c0)/2); zero outside the input, past the last pixel
 * and past c1 (an odd count's last pair). Pairs along channels, not taps: the runs of a tap
 * serve both loads of a pair, and 9 taps would split a pair across channels. */
NA_BF16 static void pack_tile_pairs(const dc_shape *s, const uint16_t *x, int64_t pt, int64_t c0,
                                    int64_t c1, uint32_t *restrict dst, int64_t ld) {
    const int64_t HW = s->H * s->W, np = (c1 - c0 + 1) / 2;
    const uintptr_t step = (uintptr_t)HW * sizeof(uint16_t);
    dc_runs runs;
    for (int ki = 0; ki < s->KH; ki++)
        for (int kj = 0; kj < s->KW; kj++) {
            tile_runs(s, pt, ki, kj, &runs);
            uint32_t *d = dst + (ki * s->KW + kj) * np * ld;
            uintptr_t plane = (uintptr_t)(x + c0 * HW);
            for (int64_t p = 0; p < np; p++, d += ld, plane += 2 * step) {
                __m256i lo = runs_load_bf16(&runs, plane);
                __m256i hi = c0 + 2 * p + 1 < c1 ? runs_load_bf16(&runs, plane + step)
                                                  : _mm256_setzero_si256();
                _mm512_storeu_si512(d, _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                                       _mm512_slli_epi32(
                                                           _mm512_cvtepu16_epi32(hi), 16)));
            }
        }
}

/* 16-bit planes in pack_tile's layout, 16 lanes per row and tap: as bf16 for the bf16 tiles
 * (the weight gradient; the product pairs consecutive pixels), or, with widen_f16, f16 widened
 * in registers (vcvtph2ps, exact and as half.h) into f32 for the f32 tiles, so that the input
 * is read once at half the bytes, not widened into an f32 copy first: the same floats as
 * pack_tile of the widened planes. */
NA_BF16 static void pack_tile_16(const dc_shape *s, const uint16_t *x, int64_t pt, int64_t c0,
                                 int64_t c1, void *restrict dst, int64_t ld, bool widen_f16) {
    const int64_t HW = s->H * s->W, taps = (int64_t)s->KH * s->KW;
    const uintptr_t step = (uintptr_t)HW * sizeof(uint16_t);
    const size_t esz = widen_f16 ? sizeof(float) : sizeof(uint16_t);
    dc_runs runs;
    for (int ki = 0; ki < s->KH; ki++)
        for (int kj = 0; kj < s->KW; kj++) {
            tile_runs(s, pt, ki, kj, &runs);
            char *d = (char *)dst + (size_t)((ki * s->KW + kj) * ld) * esz;
            uintptr_t plane = (uintptr_t)(x + c0 * HW);
            for (int64_t ci = c0; ci < c1; ci++, d += (size_t)(taps * ld) * esz, plane += step) {
                __m256i v = runs_load_bf16(&runs, plane);
                if (widen_f16) _mm512_storeu_ps((float *)d, _mm512_cvtph_ps(v));
                else _mm256_storeu_si256((__m256i *)d, v);
            }
        }
}

/* ---- the register tile ---------------------------------------------------------------------
 * rows (<= 8) output channels x NT tiles of one chunk, lanes l < valid[t]:
 *     acc[i][t] = (partial ? the stored partial sums : bias[i]) + w . panel
 * wp: the block's packed weights [K][8] (rows past `rows` are zero). The sums go to f32 rows
 * (o->f[t] + i*o->ldf: y itself, or a chunk's partial sums when a half output has several K
 * blocks), or, in the last K block of an f16/bf16 output, are rounded once in registers
 * (na_h512_narrow: RNE, NaN as half.h) to the half rows o->h[t] + i*o->ldh, so a half output
 * has no f32 copy and no conversion pass; the bits are those of the f32 sums rounded by
 * na_cpu_store_f. The _h tiles (AVX-512BW/VL, F16C) have both stores; the plain ones f32 only. */
typedef struct {
    float *f[DC_NT];    /* f32 sums of each tile's lanes, row i at f[t] + i*ldf */
    int64_t ldf;
    uint16_t *h[DC_NT]; /* the half output, row i at h[t] + i*ldh, when half */
    int64_t ldh;
    bool partial;       /* a later K block: start from f's partial sums */
    bool half, f16;     /* round to f16 (else bf16) into h instead of storing f */
} dc_out;

#define NA_DC_DEFINE_TILE(NAME, NT, TARGET, HALF, E, VT, VLOAD, BCAST, MAC)               \
    TARGET static void NAME(int64_t K, const void *wpv, const void *panelv, const float *bias, \
                            int rows, const dc_out *o, const int *valid) {                  \
        const E *restrict wp = wpv, *restrict panel = panelv;                               \
        const int64_t ldf = o->ldf;                                                         \
        __m512 acc[DC_MR][NT];                                                              \
        __mmask16 m[NT];                                                                    \
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                                \
            m[t] = (__mmask16)((1u << valid[t]) - 1);                                       \
        _Pragma("GCC unroll 8") for (int i = 0; i < DC_MR; i++) {                           \
            __m512 b0 = _mm512_set1_ps(bias && i < rows ? bias[i] : 0.0f);                  \
            _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                            \
                acc[i][t] = o->partial && i < rows                                          \
                                ? _mm512_maskz_loadu_ps(m[t], o->f[t] + i * ldf)            \
                                : b0;                                                       \
        }                                                                                   \
        for (int64_t k = 0; k < K; k++) {                                                   \
            VT v[NT];                                                                       \
            _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                            \
                v[t] = VLOAD(panel + k * DC_CHUNK + t * DC_LANES);                          \
            _Pragma("GCC unroll 8") for (int i = 0; i < DC_MR; i++) {                       \
                VT wv = BCAST(wp[k * DC_MR + i]);                                           \
                _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                        \
                    acc[i][t] = MAC(acc[i][t], wv, v[t]);                                   \
            }                                                                               \
        }                                                                                   \
        if (HALF && o->half) {                                                              \
            const int64_t ldh = o->ldh;                                                     \
            const bool f16 = o->f16;                                                        \
            _Pragma("GCC unroll 8") for (int i = 0; i < DC_MR; i++) {                       \
                if (i >= rows) break;                                                       \
                _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                        \
                    NA_DC_STORE_HALF(HALF, f16, o->h[t] + i * ldh, m[t], acc[i][t]);        \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        _Pragma("GCC unroll 8") for (int i = 0; i < DC_MR; i++) {                           \
            if (i >= rows) break;                                                           \
            _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                            \
                _mm512_mask_storeu_ps(o->f[t] + i * ldf, m[t], acc[i][t]);                  \
        }                                                                                   \
    }
/* the half store exists only in the _h tiles (the plain ones are built without BW/VL/F16C) */
#define NA_DC_STORE_HALF(HALF, f16, p, m, v) NA_DC_STORE_HALF_##HALF(f16, p, m, v)
#define NA_DC_STORE_HALF_0(f16, p, m, v) ((void)(f16), (void)(p), (void)(m), (void)(v))
#define NA_DC_STORE_HALF_1(f16, p, m, v) na_h512_store(f16, p, m, v)
/* acc += w * v: one f32 FMA per lane, or (bf16) the lane's pair of products, in f32 */
#define NA_DC_FMA(acc, w, v) _mm512_fmadd_ps(w, v, acc)
#define NA_DC_DOT(acc, w, v) _mm512_dpbf16_ps(acc, (__m512bh)(w), (__m512bh)(v))
#define NA_DC_LOAD_SI(p) _mm512_loadu_si512((const void *)(p))
#define NA_DC_SET1_PAIR(x) _mm512_set1_epi32((int)(x))
#define NA_DC_TILES(NT)                                                                     \
    NA_DC_DEFINE_TILE(tile##NT, NT, NA_AVX512, 0, float, __m512, _mm512_load_ps,            \
                      _mm512_set1_ps, NA_DC_FMA)                                            \
    NA_DC_DEFINE_TILE(tile_bf16_##NT, NT, NA_BF16, 0, uint32_t, __m512i, NA_DC_LOAD_SI,     \
                      NA_DC_SET1_PAIR, NA_DC_DOT)                                           \
    NA_DC_DEFINE_TILE(tile##NT##_h, NT, NA_AVX512_HALF, 1, float, __m512, _mm512_load_ps,   \
                      _mm512_set1_ps, NA_DC_FMA)                                            \
    NA_DC_DEFINE_TILE(tile_bf16_##NT##_h, NT, NA_BF16_HALF, 1, uint32_t, __m512i,           \
                      NA_DC_LOAD_SI, NA_DC_SET1_PAIR, NA_DC_DOT)
NA_DC_TILES(1)
NA_DC_TILES(2)
NA_DC_TILES(3)

/* [bf16][half output][tiles] of a chunk: the f32 tile reads K rows of floats, the bf16 tile K
 * pairs */
typedef void dc_tile_fn(int64_t, const void *, const void *, const float *, int, const dc_out *,
                        const int *);
static dc_tile_fn *const dc_tiles[2][2][DC_NT + 1] = {
    {{NULL, tile1, tile2, tile3}, {NULL, tile1_h, tile2_h, tile3_h}},
    {{NULL, tile_bf16_1, tile_bf16_2, tile_bf16_3},
     {NULL, tile_bf16_1_h, tile_bf16_2_h, tile_bf16_3_h}}};

/* Where conv_images writes: dc_dst (cpu_direct_conv.h), partial sums of cout x DC_CHUNK. */

/* the convolution of nb images of one group: image b's input planes at x + b*x_img elements
 * (f32, bf16 with `bf`, or f16 with `xh`, packed as floats), its output as d says.
 * The images' 16-pixel tiles are taken three at a time, across image boundaries, so small
 * images fill whole panels. wp packed for the group (floats, or bf16 pairs). */
NA_AVX512 static void conv_images(const dc_shape *s, bool bf, bool xh, int64_t nb, const void *x,
                                  int64_t x_img, const void *wp, const float *bias,
                                  const dc_dst *d, void *panel) {
    const int64_t P = s->OH * s->OW, tiles = (P + DC_LANES - 1) / DC_LANES, total = nb * tiles;
    const int64_t taps = (int64_t)s->KH * s->KW, bc = na_cpu_dc_block_channels(s, bf);
    const int64_t esz = bf || xh ? (int64_t)sizeof(uint16_t) : (int64_t)sizeof(float);
    const int64_t oesz = d->half ? (int64_t)sizeof(uint16_t) : (int64_t)sizeof(float);
    const char *xc = x;
    int64_t fetched = (DC_NT - 1) / tiles; /* images asked for ahead so far */
    for (int64_t t0 = 0; t0 < total; t0 += DC_NT) {
        int nt = (int)(total - t0 < DC_NT ? total - t0 : DC_NT);
        int64_t ahead = (t0 + 2 * DC_NT - 1) / tiles; /* the last image of the next chunk */
        for (; fetched < ahead && fetched + 1 < nb; fetched++)
            prefetch_l2(xc + (fetched + 1) * x_img * esz, s->cin * s->H * s->W * esz);
        const char *xt[DC_NT];
        char *out[DC_NT]; /* each tile's first output element, of oesz bytes */
        int64_t pt[DC_NT];
        int valid[DC_NT];
        for (int t = 0; t < nt; t++) {
            int64_t b = (t0 + t) / tiles;
            pt[t] = (t0 + t) % tiles * DC_LANES;
            valid[t] = (int)(P - pt[t] < DC_LANES ? P - pt[t] : DC_LANES);
            xt[t] = xc + b * x_img * esz;
            out[t] = (char *)d->y + (b * d->y_img + pt[t]) * oesz;
        }
        for (int64_t c0 = 0; c0 < s->cin; c0 += bc) {
            int64_t c1 = c0 + bc < s->cin ? c0 + bc : s->cin;
            /* this block's rows of the panel and its first row of the packed weights */
            int64_t kn = bf ? (c1 - c0 + 1) / 2 * taps : (c1 - c0) * taps;
            int64_t k0 = bf ? c0 / 2 * taps : c0 * taps, wk = bf ? s->KP : s->K;
            for (int t = 0; t < nt; t++) {
                if (bf)
                    pack_tile_pairs(s, (const uint16_t *)xt[t], pt[t], c0, c1,
                                    (uint32_t *)panel + t * DC_LANES, DC_CHUNK);
                else if (xh)
                    pack_tile_16(s, (const uint16_t *)xt[t], pt[t], c0, c1,
                                 (float *)panel + t * DC_LANES, DC_CHUNK, true);
                else
                    pack_tile(s, (const float *)xt[t], pt[t], c0, c1,
                              (float *)panel + t * DC_LANES, DC_CHUNK);
            }
            /* a half output: rounded in the last K block, partial sums before it in part */
            dc_out o = {.partial = c0 > 0, .half = d->half && c1 == s->cin, .f16 = d->f16,
                        .ldf = d->half ? DC_CHUNK : P, .ldh = P};
            for (int64_t b = 0; b < s->blocks; b++) {
                int64_t co = b * DC_MR;
                int rows = (int)(s->cout - co < DC_MR ? s->cout - co : DC_MR);
                const float *bb = bias ? bias + co : NULL;
                const char *wb = (const char *)wp + (b * wk + k0) * DC_MR * 4; /* 4: f32 or pair */
                for (int t = 0; t < nt; t++) {
                    if (!d->half) {
                        o.f[t] = (float *)out[t] + co * P;
                    } else {
                        o.h[t] = (uint16_t *)out[t] + co * P;
                        o.f[t] = d->part ? d->part + co * DC_CHUNK + t * DC_LANES : NULL;
                    }
                }
                dc_tiles[bf][d->half][nt](kn, wb, panel, bb, rows, &o, valid);
            }
        }
    }
}

/* ---- the weight gradient ------------------------------------------------------------------- */

/* Lane l of the result is the sum of the 16 lanes of in[l]: halves, quarters, pairs and
 * single lanes of vectors added in four rounds of shuffles (15 adds per 16 sums where
 * reducing each vector alone takes 4 adds and 4 shuffles). The inputs are taken in the order
 * that makes the result come out in lane order. */
NA_AVX512 static __m512 lane_sums16(const __m512 in[16]) {
    static const int at[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
    __m512 v[16], w[8], x[4], y[2];
    for (int l = 0; l < 16; l++) v[at[l]] = in[l];
    for (int k = 0; k < 8; k++) /* 256-bit halves: v[k] in lanes 0-7, v[k+8] in 8-15 */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[k], v[k + 8], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[k], v[k + 8], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int k = 0; k < 4; k++) /* 128-bit quarters */
        x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[k], w[k + 4], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(w[k], w[k + 4], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int k = 0; k < 2; k++) /* pairs within each 128-bit lane */
        y[k] = _mm512_add_ps(_mm512_shuffle_ps(x[k], x[k + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[k], x[k + 2], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* gW[co][k] = sum over pixels l of gy[co][l] * col[k][l], both as rows of L pixels (a block of
 * images, each padded with zeros to whole 16-pixel vectors). The sum runs along the rows of
 * both, so a 4 x 6 tile of gW keeps 24 vector accumulators of 16 pixel lanes: each step loads
 * 4 + 6 vectors for 24 FMAs, and the lanes are summed once per tile. */
#define NA_DC_DEFINE_ABT(NAME, TARGET, E, VT, STEP, MAC)                                   \
    TARGET static void NAME(int64_t M, int64_t N, int64_t L, const E *A, int64_t lda,        \
                            const E *B, float *C, int64_t ldc, bool accumulate) {           \
        enum { TM = 4, TN = 6 };                                                            \
        for (int64_t n0 = 0; n0 < N; n0 += TN)                                              \
            for (int64_t m0 = 0; m0 < M; m0 += TM) {                                        \
                /* rows past M or N repeat the last one; their sums are not stored */       \
                const E *ar[TM], *br[TN];                                                   \
                for (int i = 0; i < TM; i++) ar[i] = A + (m0 + i < M ? m0 + i : M - 1) * lda; \
                for (int j = 0; j < TN; j++) br[j] = B + (n0 + j < N ? n0 + j : N - 1) * L; \
                __m512 acc[TM][TN];                                                         \
                _Pragma("GCC unroll 4") for (int i = 0; i < TM; i++)                        \
                    _Pragma("GCC unroll 6") for (int j = 0; j < TN; j++)                    \
                        acc[i][j] = _mm512_setzero_ps();                                    \
                for (int64_t l = 0; l < L; l += STEP) {                                     \
                    VT a[TM];                                                               \
                    _Pragma("GCC unroll 4") for (int i = 0; i < TM; i++)                    \
                        a[i] = (VT)_mm512_loadu_si512((const void *)(ar[i] + l));           \
                    _Pragma("GCC unroll 6") for (int j = 0; j < TN; j++) {                  \
                        VT b = (VT)_mm512_loadu_si512((const void *)(br[j] + l));           \
                        _Pragma("GCC unroll 4") for (int i = 0; i < TM; i++)                \
                            acc[i][j] = MAC(acc[i][j], a[i], b);                            \
                    }                                                                       \
                }                                                                           \
                abt_store(acc, M, N, m0, n0, C, ldc, accumulate);                           \
            }                                                                               \
    }

/* the 24 lane sums of an abt tile, in two transposing reductions (16 + 8), into C */
NA_AVX512 static void abt_store(__m512 acc[4][6], int64_t M, int64_t N, int64_t m0, int64_t n0,
                                float *C, int64_t ldc, bool accumulate) {
    enum { TM = 4, TN = 6 };
    float sums[32];
    __m512 v[16];
    for (int q = 0; q < 16; q++) v[q] = acc[q / TN][q % TN];
    _mm512_storeu_ps(sums, lane_sums16(v));
    for (int q = 0; q < 8; q++) v[q] = acc[(16 + q) / TN][(16 + q) % TN];
    for (int q = 8; q < 16; q++) v[q] = _mm512_setzero_ps();
    _mm512_storeu_ps(sums + 16, lane_sums16(v));
    for (int i = 0; i < TM && m0 + i < M; i++)
        for (int j = 0; j < TN && n0 + j < N; j++) {
            float *c = C + (m0 + i) * ldc + n0 + j, t = sums[i * TN + j];
            *c = accumulate ? *c + t : t;
        }
}

#define NA_DC_FMA_AB(acc, a, b) _mm512_fmadd_ps(a, b, acc)
/* f32: 16 pixels a step; bf16: 32, each lane summing a pair of consecutive pixels' products */
NA_DC_DEFINE_ABT(abt, NA_AVX512, float, __m512, DC_LANES, NA_DC_FMA_AB)
NA_DC_DEFINE_ABT(abt_bf16, NA_BF16, uint16_t, __m512i, 2 * DC_LANES, NA_DC_DOT)

/* ---- the 3x3 weight gradient with output channels in lanes ---------------------------------
 * gW[co][c][ki][kj] = sum over images and output pixels (oy, ox) of gy[co][oy][ox] *
 * xp[c][oy*sh + ki*dh][ox + kj], xp the input with its zero border (ph rows, pw columns) copied
 * once per image: the 9 taps are 9 shifted addresses into one padded plane, where the
 * lane-sum kernel above packs 9 column rows. The tile holds 32 output channels (two vectors,
 * gy transposed to [pixel][32 channels]) x the 9 taps of one input channel in 18 accumulators;
 * each output pixel loads 2 vectors of gy and broadcasts 9 inputs for 18 FMAs, and the sum over
 * pixels stays in its lane, so there are no lane sums and no pixels padded to whole vectors
 * (abt_bf16's rows are 32-pixel vectors: a 4x4 map's 16 pixels fill half of one). The
 * accumulators start from the running sums ct[k][co] (K x 32-channel blocks) and go back there
 * after each block of images, so every element is one chain of FMAs over the images and pixels
 * in order, however the images are blocked and the rows split. bf16 (vdpbf16ps): gy as pairs
 * of consecutive pixels of an output row per channel ([pair][32][2], an odd row's last pair
 * padded with a zero), the input pair broadcast as 32 bits from the padded row (one spare zero
 * column). */
enum { WL_CO = 32 }; /* output channels per tile: two f32 vectors */

NA_AVX512 static inline __attribute__((always_inline)) void
wl_tile_f32_ow(const float *restrict gt, const float *restrict xp, int64_t x_img, int64_t nb,
               const dc_shape *s, int64_t Wp, float *restrict ct, int64_t ld, int64_t OW) {
    __m512 acc[9][2];
    _Pragma("GCC unroll 9") for (int t = 0; t < 9; t++) {
        acc[t][0] = _mm512_loadu_ps(ct + t * ld);
        acc[t][1] = _mm512_loadu_ps(ct + t * ld + 16);
    }
    const int64_t rs = s->sh * Wp, ks = s->dh * Wp;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t oy = 0; oy < s->OH; oy++) {
            const float *x0 = xp + b * x_img + oy * rs, *x1 = x0 + ks, *x2 = x1 + ks;
            _Pragma("GCC unroll 8") for (int64_t ox = 0; ox < OW; ox++, gt += WL_CO) {
                __m512 g0 = _mm512_loadu_ps(gt), g1 = _mm512_loadu_ps(gt + 16);
                const float *xr[3] = {x0 + ox, x1 + ox, x2 + ox};
                _Pragma("GCC unroll 3") for (int ki = 0; ki < 3; ki++)
                    _Pragma("GCC unroll 3") for (int kj = 0; kj < 3; kj++) {
                        __m512 w = _mm512_set1_ps(xr[ki][kj]);
                        acc[ki * 3 + kj][0] = _mm512_fmadd_ps(g0, w, acc[ki * 3 + kj][0]);
                        acc[ki * 3 + kj][1] = _mm512_fmadd_ps(g1, w, acc[ki * 3 + kj][1]);
                    }
            }
        }
    _Pragma("GCC unroll 9") for (int t = 0; t < 9; t++) {
        _mm512_storeu_ps(ct + t * ld, acc[t][0]);
        _mm512_storeu_ps(ct + t * ld + 16, acc[t][1]);
    }
}

NA_BF16 static inline __attribute__((always_inline)) void
wl_tile_bf16_ow(const uint16_t *restrict gt, const uint16_t *restrict xp, int64_t x_img,
                int64_t nb, const dc_shape *s, int64_t Wp, float *restrict ct, int64_t ld,
                int64_t OW) {
    __m512 acc[9][2];
    _Pragma("GCC unroll 9") for (int t = 0; t < 9; t++) {
        acc[t][0] = _mm512_loadu_ps(ct + t * ld);
        acc[t][1] = _mm512_loadu_ps(ct + t * ld + 16);
    }
    const int64_t rs = s->sh * Wp, ks = s->dh * Wp;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t oy = 0; oy < s->OH; oy++) {
            const uint16_t *x0 = xp + b * x_img + oy * rs, *x1 = x0 + ks, *x2 = x1 + ks;
            _Pragma("GCC unroll 4") for (int64_t ox = 0; ox < OW; ox += 2, gt += 2 * WL_CO) {
                __m512bh g0 = (__m512bh)_mm512_loadu_si512((const void *)gt);
                __m512bh g1 = (__m512bh)_mm512_loadu_si512((const void *)(gt + WL_CO));
                const uint16_t *xr[3] = {x0 + ox, x1 + ox, x2 + ox};
                _Pragma("GCC unroll 3") for (int ki = 0; ki < 3; ki++)
                    _Pragma("GCC unroll 3") for (int kj = 0; kj < 3; kj++) {
                        int32_t pair;
                        memcpy(&pair, xr[ki] + kj, sizeof pair);
                        __m512bh w = (__m512bh)_mm512_set1_epi32(pair);
                        acc[ki * 3 + kj][0] = _mm512_dpbf16_ps(acc[ki * 3 + kj][0], g0, w);
                        acc[ki * 3 + kj][1] = _mm512_dpbf16_ps(acc[ki * 3 + kj][1], g1, w);
                    }
            }
        }
    _Pragma("GCC unroll 9") for (int t = 0; t < 9; t++) {
        _mm512_storeu_ps(ct + t * ld, acc[t][0]);
        _mm512_storeu_ps(ct + t * ld + 16, acc[t][1]);
    }
}

/* the tiles with the row widths of ResNet-9's small maps known to the compiler (rows of 4 and
 * 8 pixels fully unrolled: a 4x4 map's row loop cost a quarter of its time), else any width */
#define NA_WL_TILE(NAME, TARGET, E)                                                         \
    TARGET static void NAME(const E *gt, const E *xp, int64_t x_img, int64_t nb,            \
                            const dc_shape *s, int64_t Wp, float *ct, int64_t ld) {         \
        if (s->OW == 4) NAME##_ow(gt, xp, x_img, nb, s, Wp, ct, ld, 4);                      \
        else if (s->OW == 8) NAME##_ow(gt, xp, x_img, nb, s, Wp, ct, ld, 8);                 \
        else NAME##_ow(gt, xp, x_img, nb, s, Wp, ct, ld, s->OW);                             \
    }
NA_WL_TILE(wl_tile_f32, NA_AVX512, float)
NA_WL_TILE(wl_tile_bf16, NA_BF16, uint16_t)

/* dst[c*ldd + r] = src[r*lds + c] for a 16 x 16 block of 32-bit words */
NA_AVX512 static void transpose16(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps((const float *)(src + i * lds));
    for (int i = 0; i < 8; i++) { /* per 128-bit lane L: elements 4L, 4L+1 / 4L+2, 4L+3 */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + k], lane L: column 4L + k of rows 4i .. 4i+3 */
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int k = 0; k < 4; k++) { /* lanes of the four row groups gathered per column */
        __m512 a = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
        __m512 b = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
        __m512 d = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
        _mm512_storeu_ps((float *)(dst + k * ldd), _mm512_shuffle_f32x4(a, c, 0x88));
        _mm512_storeu_ps((float *)(dst + (8 + k) * ldd), _mm512_shuffle_f32x4(a, c, 0xDD));
        _mm512_storeu_ps((float *)(dst + (4 + k) * ldd), _mm512_shuffle_f32x4(b, d, 0x88));
        _mm512_storeu_ps((float *)(dst + (12 + k) * ldd), _mm512_shuffle_f32x4(b, d, 0xDD));
    }
}

/* wgrad_range's work for 3x3 kernels (the same arguments) */
static int wgrad_lanes(const na_conv_geom *g, const na_view *x, const na_view *gy, int64_t lo,
                       int64_t hi, int64_t r0, int64_t r1, float *gw) {
    const char *fn = "cpu_conv2d_backward_weight";
    int64_t G = g->groups, cg = g->c_in / G, cog = g->c_out / G, rows = r1 - r0;
    dc_shape s = {.cin = cg, .H = g->h, .W = g->w, .cout = cog, .OH = g->oh, .OW = g->ow,
                  .KH = 3, .KW = 3, .sh = g->sh, .ph = g->ph, .pw = g->pw, .dh = g->dh};
    bool bf = x->dtype == NA_DTYPE_BF16 && gy->dtype == NA_DTYPE_BF16 && na_cpu_bf16_fast();
    /* AVX2 (no AVX-512F): the 8-lane tile over f32 copies (8 x 8 transposes, halves widened
     * in registers; element by element under na_cpu_wgrad_avx2_copies_off) */
    bool avx2 = !na_cpu_has_avx512f();
    bf = bf && !avx2;
    size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    const int64_t K = cg * 9, P = s.OH * s.OW, HW = s.H * s.W;
    const int64_t blocks = (rows + WL_CO - 1) / WL_CO, RP = blocks * WL_CO;
    /* the padded planes; bf16: one spare zero column for an odd row's last pair */
    const int64_t Hp = s.H + 2 * s.ph, Wp = s.W + 2 * s.pw + (bf ? 1 : 0), plane = Hp * Wp;
    /* gy's pixels per image as the tile reads them: bf16 pairs of each row */
    const int64_t OWq = bf ? (s.OW + 1) / 2 * 2 : s.OW, PQ = s.OH * OWq;
    /* images per block: transposed gy and padded planes within half the block budget */
    int64_t per = PQ * RP + cg * plane, NB = na_cpu_conv_block_budget / 2 / per;
    /* AVX2: within a sixteenth (256 KiB of f32, half of Zen 3's L2), as the tile reads gt
     * once per 8 channels and each input channel: at half the budget (2 MiB) the first
     * layer's block came from L3 each time (conv1 f16 2.9 -> 2.5 ms, conv2 23 -> 19 ms,
     * medians, one thread); but at least 512 pixels a block, as each block also sweeps ct
     * (K x RP, L3-sized for deep layers: ResNet-9's 4x4 layer took 1.5x as long at 2 images
     * a block). The sums are the same: ct carries each chain across blocks. */
    if (avx2) {
        int64_t most = NB, fit = na_cpu_conv_block_budget / 16 / per, px = (512 + PQ - 1) / PQ;
        NB = fit > px ? fit : px < most ? px : most;
    }
    NB = NB < 1 ? 1 : NB > hi - lo ? hi - lo : NB;
    float *ct = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)(K * RP) * sizeof(float), fn);
    char *gt = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)(NB * PQ * RP) * esz, fn);
    char *xp = na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)(NB * cg * plane) * esz, fn);
    float *row = bf ? NULL : na_cpu_scratch(NA_CPU_SCRATCH_4, (size_t)(P > s.W ? P : s.W) *
                                                                  sizeof(float), fn);
    if (!ct || !gt || !xp || (!bf && !row)) return NA_ENOMEM;
    for (int64_t gi = 0; gi < G; gi++) {
        memset(ct, 0, (size_t)(K * RP) * sizeof(float));
        for (int64_t n0 = lo; n0 < hi; n0 += NB) {
            int64_t nb = hi - n0 < NB ? hi - n0 : NB;
            /* gt[blk][b][pixel][32]: gy rows r0 + blk*32 + j of image n0 + b, zero past r1;
             * 16 rows at a time by 16 x 16 transposes of 32-bit words (f32 gy, or bf16 pairs
             * when the rows hold whole pairs), the rest one element at a time */
            if (avx2 && !na_cpu_wgrad_avx2_copies_off) {
                /* AVX2: 8 x 8 transposes, halves widened in registers; each element of gt
                 * written once, rows past r1 as zeros, so no memset (element by element,
                 * below, the copies cost 3.7x the tile on the first layer's f16) */
                size_t gsz = na_dtype_size(gy->dtype);
                for (int64_t b = 0; b < nb; b++)
                    for (int64_t blk = 0; blk < blocks; blk++) {
                        int64_t at = ((n0 + b) * g->c_out + gi * cog + r0 + blk * WL_CO) * P;
                        int64_t nr = rows - blk * WL_CO < WL_CO ? rows - blk * WL_CO : WL_CO;
                        na_cpu_dc_transpose_avx2(gy->dtype, (const char *)gy->data + at * gsz,
                                                 P, nr, WL_CO, P,
                                                 (float *)gt + (blk * nb + b) * PQ * WL_CO,
                                                 WL_CO);
                    }
            } else {
                memset(gt, 0, (size_t)(nb * PQ * RP) * esz);
                bool words = bf ? s.OW % 2 == 0 : gy->dtype == NA_DTYPE_F32;
                int64_t nw = bf ? P / 2 : P; /* 32-bit words per row */
                for (int64_t b = 0; b < nb; b++)
                    for (int64_t r = 0; r < rows; r++) {
                        int64_t at = ((n0 + b) * g->c_out + gi * cog + r0 + r) * P;
                        int64_t blk = r / WL_CO, j = r % WL_CO;
                        int64_t base = (blk * nb + b) * PQ * WL_CO;
                        if (!avx2 && words && j % 16 == 0 && rows - r >= 16) {
                            const uint32_t *src = (const uint32_t *)((const char *)gy->data +
                                                                     (size_t)at * esz);
                            uint32_t *d = (uint32_t *)((char *)gt + (size_t)base * esz) + j;
                            int64_t q = 0;
                            for (; q + 16 <= nw; q += 16)
                                transpose16(src + q, nw, d + q * WL_CO, WL_CO);
                            for (int64_t i = 0; i < 16; i++)
                                for (int64_t t = q; t < nw; t++)
                                    d[t * WL_CO + i] = src[i * nw + t];
                            r += 15;
                            continue;
                        }
                        if (bf) {
                            const uint16_t *src = (const uint16_t *)gy->data + at;
                            uint16_t *d = (uint16_t *)gt + base;
                            for (int64_t oy = 0; oy < s.OH; oy++)
                                for (int64_t ox = 0; ox < s.OW; ox++) {
                                    int64_t q = oy * OWq + ox; /* pair q/2, its half q%2 */
                                    d[(q / 2 * WL_CO + j) * 2 + q % 2] = src[oy * s.OW + ox];
                                }
                        } else {
                            const float *src = na_cpu_view_f(gy->dtype, gy->data, at, P, row);
                            float *d = (float *)gt + base + j;
                            for (int64_t p = 0; p < P; p++) d[p * WL_CO] = src[p];
                        }
                    }
            }
            /* xp[c][b]: the padded planes of image n0 + b, a channel's images in a row */
            if (avx2 && !na_cpu_wgrad_avx2_copies_off) /* halves widened in registers */
                for (int64_t b = 0; b < nb; b++)
                    for (int64_t c = 0; c < cg; c++) {
                        int64_t at = ((n0 + b) * g->c_in + gi * cg + c) * HW;
                        na_cpu_dc_pad_plane_avx2(x->dtype,
                                                 (const char *)x->data +
                                                     at * na_dtype_size(x->dtype),
                                                 s.H, s.W, s.ph, s.pw, Hp, Wp,
                                                 (float *)xp + (c * nb + b) * plane);
                    }
            else {
                memset(xp, 0, (size_t)(nb * cg * plane) * esz);
                for (int64_t b = 0; b < nb; b++)
                    for (int64_t c = 0; c < cg; c++) {
                        int64_t at = ((n0 + b) * g->c_in + gi * cg + c) * HW;
                        char *d = xp + (size_t)((c * nb + b) * plane + s.ph * Wp + s.pw) * esz;
                        for (int64_t iy = 0; iy < s.H; iy++, d += (size_t)Wp * esz) {
                            if (bf)
                                memcpy(d, (const uint16_t *)x->data + at + iy * s.W,
                                       (size_t)s.W * esz);
                            else
                                na_cpu_load_f(x->dtype, x->data, at + iy * s.W, s.W,
                                              (float *)d);
                        }
                    }
            }
            for (int64_t blk = 0; blk < blocks; blk++)
                for (int64_t c = 0; c < cg; c++) {
                    const char *gb = gt + (size_t)(blk * nb * PQ * WL_CO) * esz;
                    const char *xc = xp + (size_t)(c * nb * plane) * esz;
                    float *cc = ct + c * 9 * RP + blk * WL_CO;
                    if (avx2)
                        na_cpu_dc_wgrad_tile_avx2((const float *)gb, (const float *)xc, plane,
                                                  nb, &s, Wp, cc, RP);
                    else if (bf)
                        wl_tile_bf16((const uint16_t *)gb, (const uint16_t *)xc, plane, nb, &s,
                                     Wp, cc, RP);
                    else
                        wl_tile_f32((const float *)gb, (const float *)xc, plane, nb, &s, Wp,
                                    cc, RP);
                }
        }
        /* ct[k][r] into gW's rows by 16 x 16 transposes (a whole column at a time read ct
         * with a stride of RP floats: a fifth of the 4x4 layer's time), the edges one by one */
        float *gr = gw + (gi * cog + r0) * K;
        if (avx2 && !na_cpu_wgrad_avx2_copies_off) {
            na_cpu_dc_transpose_avx2(NA_DTYPE_F32, ct, RP, K, K, rows, gr, K);
            continue;
        }
        for (int64_t k0 = 0; k0 < K; k0 += 16)
            for (int64_t q0 = 0; q0 < rows; q0 += 16) {
                if (!avx2 && k0 + 16 <= K && q0 + 16 <= rows) {
                    transpose16((const uint32_t *)(ct + k0 * RP + q0), RP,
                                (uint32_t *)(gr + q0 * K + k0), K);
                    continue;
                }
                for (int64_t r = q0; r < rows && r < q0 + 16; r++)
                    for (int64_t k = k0; k < K && k < k0 + 16; k++)
                        gr[r * K + k] = ct[k * RP + r];
            }
    }
    return NA_OK;
}

/* Rows [r0, r1) of every group's weight gradient (at gw + (gi*cog + r)*K, f32) over images
 * [lo, hi): per block of about 1024 pixels, gy's rows copied with zero tails to whole 16-pixel
 * tiles, then per slice of whole input channels the block's im2col columns packed the same
 * way and abt. A tile of abt sums its lanes once per product, so a product needs many pixels:
 * with all K rows of columns in one block, ResNet-9's deep layers (2304-4608 rows) fit only
 * 112-256 pixels in the budget, and the lane sums cost a third of their weight gradient; the
 * slices keep the pixels and put the budget's limit on the rows instead. An f32 gy whose images
 * are whole vectors of at least 512 pixels is read in place, an image at a time (the copy
 * would cost more than the product for few channels, as in a first layer). */
static int wgrad_range(const na_conv_geom *g, const na_view *x, const na_view *gy, int64_t lo,
                       int64_t hi, int64_t r0, int64_t r1, float *gw) {
    /* the padded planes hold every tap of an output map no larger than the geometry's; empty
     * problems (no scratch to ask for) stay with abt */
    if (wgrad_lanes_shape(g) && r1 > r0 && hi > lo)
        return wgrad_lanes(g, x, gy, lo, hi, r0, r1, gw);
    const char *fn = "cpu_conv2d_backward_weight";
    if (!na_cpu_has_avx512f()) /* abt is AVX-512 only (na_cpu_direct_wgrad_usable) */
        return na_set_error(NA_EINVAL, "%s: no direct weight gradient for this shape here", fn);
    int64_t G = g->groups, cg = g->c_in / G, cog = g->c_out / G, rows = r1 - r0;
    dc_shape s = {.cin = cg, .H = g->h, .W = g->w, .cout = cog, .OH = g->oh, .OW = g->ow,
                  .KH = g->kh, .KW = g->kw, .sh = g->sh, .ph = g->ph, .pw = g->pw, .dh = g->dh};
    int64_t taps = (int64_t)g->kh * g->kw;
    s.K = cg * taps;
    /* bf16 x and gy: packed and multiplied as bf16, rows padded to whole 32-pixel vectors */
    bool bf = x->dtype == NA_DTYPE_BF16 && gy->dtype == NA_DTYPE_BF16 && na_cpu_bf16_fast();
    /* f16 x: packed into f32 columns from the halves in place (pack_tile_16) */
    bool xh = !bf && x->dtype == NA_DTYPE_F16 && na_cpu_half512();
    size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    int64_t P = g->oh * g->ow, HW = g->h * g->w, P16 = (P + DC_LANES - 1) / DC_LANES * DC_LANES;
    bool in_place = (bf ? P % (2 * DC_LANES) == 0 : gy->dtype == NA_DTYPE_F32 && P == P16) &&
                    P >= 512;
    int64_t NB = in_place || 1024 / P16 < 1 ? 1 : 1024 / P16;
    NB = NB > hi - lo ? hi - lo : NB;
    int64_t step = bf ? 2 * DC_LANES : DC_LANES, LB = (NB * P16 + step - 1) / step * step;
    /* channels per slice: the columns within half the block budget (ResNet-9's step's RSS
     * growth stays at 215 MiB; at the whole budget it was 219), in near-equal slices */
    int64_t most = na_cpu_conv_block_budget / 2 / (taps * LB), slices;
    most = most < 1 ? 1 : most > cg ? cg : most;
    slices = (cg + most - 1) / most;
    int64_t sc = (cg + slices - 1) / slices;
    float *xb = bf || xh ? NULL : na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)(sc * HW) * esz, fn);
    void *col = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)(sc * taps * LB) * esz, fn);
    char *gyb = in_place ? NULL : na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)(rows * LB) * esz, fn);
    if ((!bf && !xh && !xb) || !col || (!in_place && !gyb)) return NA_ENOMEM;
    for (int64_t n0 = lo; n0 < hi; n0 += NB) {
        int64_t nb = hi - n0 < NB ? hi - n0 : NB, L = (nb * P16 + step - 1) / step * step;
        for (int64_t gi = 0; gi < G; gi++) {
            int64_t first = (n0 * g->c_out + gi * cog + r0) * P; /* gy row r0 of image n0 */
            for (int64_t r = 0; r < rows && !in_place; r++) {
                char *d = gyb + (size_t)(r * L) * esz;
                for (int64_t b = 0; b < nb; b++) {
                    int64_t at = first + (b * g->c_out + r) * P;
                    if (bf)
                        memcpy(d + (size_t)(b * P16) * esz, (const uint16_t *)gy->data + at,
                               (size_t)P * esz);
                    else
                        na_cpu_load_f(gy->dtype, gy->data, at, P, (float *)d + b * P16);
                    memset(d + (size_t)(b * P16 + P) * esz, 0, (size_t)(P16 - P) * esz);
                }
                memset(d + (size_t)(nb * P16) * esz, 0, (size_t)(L - nb * P16) * esz);
            }
            const char *a = in_place ? (const char *)gy->data + (size_t)first * esz : gyb;
            for (int64_t c0 = 0; c0 < cg; c0 += sc) {
                int64_t c1 = c0 + sc < cg ? c0 + sc : cg;
                for (int64_t b = 0; b < nb; b++) {
                    int64_t at = ((n0 + b) * g->c_in + gi * cg + c0) * HW;
                    if (bf) {
                        const uint16_t *xv = (const uint16_t *)x->data + at;
                        uint16_t *cb = (uint16_t *)col + b * P16;
                        for (int64_t pt = 0; pt < P; pt += DC_LANES)
                            pack_tile_16(&s, xv, pt, 0, c1 - c0, cb + pt, L, false);
                        continue;
                    }
                    if (xh) {
                        const uint16_t *xv = (const uint16_t *)x->data + at;
                        for (int64_t pt = 0; pt < P; pt += DC_LANES)
                            pack_tile_16(&s, xv, pt, 0, c1 - c0, (float *)col + b * P16 + pt, L, true);
                        continue;
                    }
                    const float *xv = na_cpu_view_f(x->dtype, x->data, at, (c1 - c0) * HW, xb);
                    if (x->dtype == NA_DTYPE_F32 && n0 + b + 1 < hi)
                        prefetch_l2(xv + g->c_in * HW, (c1 - c0) * HW * 4);
                    for (int64_t pt = 0; pt < P; pt += DC_LANES)
                        pack_tile(&s, xv, pt, 0, c1 - c0, (float *)col + b * P16 + pt, L);
                }
                float *c = gw + (gi * cog + r0) * s.K + c0 * taps;
                int64_t lda = in_place ? P : L, kn = (c1 - c0) * taps;
                if (bf) {
                    for (int64_t k = 0; k < kn && L > nb * P16; k++) /* the 32-pixel tail */
                        memset((uint16_t *)col + k * L + nb * P16, 0,
                               (size_t)(L - nb * P16) * esz);
                    abt_bf16(rows, kn, L, (const uint16_t *)a, lda, col, c, s.K, n0 != lo);
                } else {
                    abt(rows, kn, L, (const float *)a, lda, col, c, s.K, n0 != lo);
                }
            }
        }
    }
    return NA_OK;
}

/* ---- the weight gradient split by output channels -------------------------------------------
 * Where one partial gradient per image range would not fit the block budget (ResNet-9's wide
 * layers), task t computes rows [r0, r1) of gW (multiples of 32 rows for 3x3 kernels, else of
 * 4; at least 32) over the whole batch, packing every image's columns (3x3: padded planes)
 * itself, and needs no partials. Each element is one task's sum over the same blocks in the
 * same order wherever the row cuts fall, so the
 * number of tasks may follow the thread count (two per thread, for balance) without changing
 * a bit: with 8 tasks on 2 threads the repeated packing took 28% of ResNet-9's 128->256
 * weight gradient. */
typedef struct {
    const na_conv_geom *g;
    const na_view *x, *gy;
    float *gw;
    int64_t tasks;
    na_cpu_task_status status;
} wrows_job;

static void wrows_task(void *ctx, int64_t t) {
    wrows_job *j = ctx;
    int64_t r0, r1;
    /* whole 32-channel tiles for the 3x3 kernel (3 threads cut 256 rows into 44s, tiles of
     * which run a quarter empty), whole 4-row tiles for abt */
    int64_t align = j->g->kh == 3 && j->g->kw == 3 ? WL_CO : 4;
    na_cpu_task_range(j->g->c_out, j->tasks, t, align, &r0, &r1);
    if (r0 < r1 && wgrad_range(j->g, j->x, j->gy, 0, j->g->n, r0, r1, j->gw))
        na_cpu_task_fail(&j->status);
}

#endif /* NA_DC_X86 */

int na_cpu_direct_conv2d_wgrad_range(const na_conv_geom *g, const na_view *x, const na_view *gy,
                                     int64_t lo, int64_t hi, float *gw) {
#ifdef NA_DC_X86
    if (!na_cpu_has_avx512f() && !na_cpu_direct_avx2()) /* through na_cpu_direct_wgrad_usable */
        return na_set_error(NA_EINVAL, "cpu_conv2d_backward_weight: no direct weight gradient "
                                       "on this CPU");
    return wgrad_range(g, x, gy, lo, hi, 0, g->c_out / g->groups, gw);
#else
    (void)g, (void)x, (void)gy, (void)lo, (void)hi, (void)gw;
    return na_set_error(NA_EINVAL, "cpu_conv2d_backward_weight: no direct convolution here");
#endif
}

int na_cpu_direct_conv2d_wgrad_rows(const na_conv_geom *g, const na_view *x, const na_view *gy,
                                    na_view *gw) {
#ifdef NA_DC_X86
    const char *fn = "cpu_conv2d_backward_weight";
    if (!na_cpu_has_avx512f() && !na_cpu_direct_avx2()) /* through na_cpu_direct_wgrad_usable */
        return na_set_error(NA_EINVAL, "%s: no direct weight gradient on this CPU", fn);
    int64_t wsize = g->c_out * (g->c_in / g->groups) * g->kh * g->kw;
    float *gwb = gw->dtype == NA_DTYPE_F32
                     ? gw->data
                     : na_cpu_scratch(NA_CPU_SCRATCH_3, (size_t)wsize * sizeof(float), fn);
    if (!gwb) return NA_ENOMEM;
    if (g->n == 0) memset(gwb, 0, (size_t)wsize * sizeof(float));
    int64_t most = g->c_out / 32 < 1 ? 1 : g->c_out / 32, per_threads = 2 * na_get_num_threads();
    most = most < NA_CPU_DIRECT_ROW_TASKS ? most : NA_CPU_DIRECT_ROW_TASKS;
    most = most < per_threads ? most : per_threads;
    wrows_job j = {.g = g, .x = x, .gy = gy, .gw = gwb, .tasks = g->n ? most : 0};
    na_cpu_parallel_for(j.tasks, wrows_task, &j);
    int st = na_cpu_task_status_raise(&j.status);
    if (!st) na_cpu_store_f(gw->dtype, gw->data, 0, wsize, gwb);
    return st;
#else
    (void)g, (void)x, (void)gy, (void)gw;
    return na_set_error(NA_EINVAL, "cpu_conv2d_backward_weight: no direct convolution here");
#endif
}

/* ---- the call ------------------------------------------------------------------------------ */

typedef struct {
    const na_conv_geom *g;
    dc_shape s;
    const na_view *x; /* forward: x; data gradient: gy */
    na_view *y;       /* forward: y; data gradient: gx */
    int64_t x_ch, y_ch; /* channels per image of x and y (all groups) */
    bool bf;            /* bf16 x and weights multiplied as bf16 (wp holds pairs) */
    bool xh;            /* f16 x (AVX2: f16 or bf16) read in place, converted by the packer */
    bool avx2;          /* the AVX2 tiles (cpu_direct_conv_avx2.c), blocks of NA_DC2_MR */
    int64_t mr, chunk;  /* outputs per weight block, pixels per chunk of the tiles */
    bool yh;            /* f16/bf16 y rounded by the tiles' epilogue (no f32 copy) */
    const void *wp;
    const float *bias;
    int64_t tasks;
    na_cpu_task_status status;
} dc_job;

/* Task t's images, in passes: every image at once where x is f32, or bf16 on the bf16 path,
 * or f16 read by the packer (read in place), and y is f32 or a half output rounded by the
 * tiles (written in place), else as many as about 1M floats of widened input and f32 output
 * hold. */
static void dc_task(void *ctx, int64_t t) {
#ifdef NA_DC_X86
    dc_job *j = ctx;
    const dc_shape *s = &j->s;
    const char *fn = "cpu_conv2d_direct";
    int64_t lo, hi, G = j->g->groups, HW = s->H * s->W, P = s->OH * s->OW;
    int64_t in_n = s->cin * HW, out_n = s->cout * P;
    na_cpu_task_range(j->g->n, j->tasks, t, 1, &lo, &hi);
    bool x_direct = j->x->dtype == NA_DTYPE_F32 || j->bf || j->xh;
    bool y_direct = j->y->dtype == NA_DTYPE_F32 || j->yh;
    int64_t copied = (x_direct ? 0 : in_n) + (y_direct ? 0 : out_n); /* floats per image */
    int64_t fit = copied ? ((int64_t)1 << 20) / copied : hi - lo;
    int64_t NB = fit < 1 ? 1 : fit > hi - lo ? hi - lo : fit;
    size_t esz = j->bf || j->xh ? sizeof(uint16_t) : sizeof(float);
    size_t oesz = j->yh ? sizeof(uint16_t) : sizeof(float);
    void *panel = na_cpu_scratch(NA_CPU_SCRATCH_1,
                                 (size_t)(panel_rows(s, j->bf) * j->chunk) * sizeof(float), fn);
    size_t xbytes = (size_t)(NB * in_n) * sizeof(float);
    /* f32 output planes to convert, or a half output's partial sums of one chunk */
    bool parts = j->yh && na_cpu_dc_block_channels(s, j->bf) < s->cin;
    size_t ybytes = (size_t)(y_direct ? s->cout * j->chunk : NB * out_n) * sizeof(float);
    float *xb = x_direct ? NULL : na_cpu_scratch(NA_CPU_SCRATCH_0, xbytes, fn);
    float *yb = y_direct && !parts ? NULL : na_cpu_scratch(NA_CPU_SCRATCH_2, ybytes, fn);
    if (!panel || (!x_direct && !xb) || ((!y_direct || parts) && !yb)) {
        na_cpu_task_fail(&j->status);
        return;
    }
    for (int64_t gi = 0; gi < G; gi++)
        for (int64_t n0 = lo; n0 < hi; n0 += NB) {
            int64_t nb = hi - n0 < NB ? hi - n0 : NB;
            int64_t xo = (n0 * j->x_ch + gi * s->cin) * HW, yo = (n0 * j->y_ch + gi * s->cout) * P;
            const void *x = (const char *)j->x->data + (size_t)xo * esz;
            int64_t x_img = j->x_ch * HW;
            dc_dst d = {.y = (char *)j->y->data + (size_t)yo * oesz, .y_img = j->y_ch * P,
                        .half = j->yh, .f16 = j->y->dtype == NA_DTYPE_F16,
                        .part = parts ? yb : NULL};
            if (!x_direct) {
                for (int64_t b = 0; b < nb; b++)
                    na_cpu_load_f(j->x->dtype, j->x->data, xo + b * x_img, in_n, xb + b * in_n);
                x = xb, x_img = in_n;
            }
            if (!y_direct) d.y = yb, d.y_img = out_n;
            const char *wp = (const char *)j->wp + (size_t)(gi * s->blocks * j->mr) *
                                                       (size_t)(j->bf ? s->KP : s->K) * 4;
            const float *bias = j->bias ? j->bias + gi * s->cout : NULL;
            if (j->avx2)
                na_cpu_dc_images_avx2(s, x_direct ? j->x->dtype : NA_DTYPE_F32, nb, x, x_img,
                                      (const float *)wp, bias, &d, panel);
            else
                conv_images(s, j->bf, j->xh, nb, x, x_img, wp, bias, &d, panel);
            for (int64_t b = 0; b < nb && !y_direct; b++)
                na_cpu_store_f(j->y->dtype, j->y->data, yo + b * j->y_ch * P, out_n,
                               yb + b * out_n);
        }
#else
    (void)ctx;
    (void)t;
#endif
}

/* The weights as the tiles read them, for the blocks [lo, hi) of DC_MR outputs (block index
 * gi * s->blocks + b over the groups): each block's panel is contiguous, so the blocks pack in
 * parallel (in ResNet-9's 4x4 layers one thread's packing was 7.6% of the forward).
 *
 * f32: wp[gi][b][k][i], output o = b*8 + i of the group, k = (c, ki, kj) over its inputs; zero
 * past the group's outputs. bf16: wp[gi][b][kp][i] = the pair of output o for channels
 * (c, c+1) at one tap, kp = (K block, tap, channel pair) as pack_tile_pairs lays out the panel;
 * zero past the group's outputs and an odd block's last channel. The data gradient's weights
 * are flipped in space and transposed (input c of the forward is output o here). */
typedef struct {
    const dc_shape *s;
    int64_t groups, cog, cg, tasks, mr; /* mr: outputs per block (DC_MR, AVX2 NA_DC2_MR) */
    bool backward_data, bf;
    const void *w; /* f32 (read in place or widened) or bf16 */
    void *wp;
} dc_pack_job;

/* Weight (o, c, tap) of block gb's group as the layout reads it (o, c its output and input
 * here): at e + o*so + c*sc + tap*st, e the group's block's first output, c = 0, tap = 0. The
 * data gradient reads the forward's w[c][o] flipped in space. */
typedef struct {
    const void *e;
    int64_t so, sc, st;
} dc_wsrc;

static dc_wsrc weight_source(const dc_pack_job *p, int64_t gb, size_t esz) {
    const dc_shape *s = p->s;
    const int64_t taps = (int64_t)s->KH * s->KW, gi = gb / s->blocks, o0 = gb % s->blocks * p->mr;
    const int64_t group = gi * p->cog * p->cg * taps; /* the group's first weight */
    if (!p->backward_data) /* w[gi*cog + o][c][tap] */
        return (dc_wsrc){(const char *)p->w + (size_t)(group + o0 * p->cg * taps) * esz,
                         p->cg * taps, taps, 1};
    /* w[gi*cog + c][o][taps - 1 - tap] */
    return (dc_wsrc){(const char *)p->w + (size_t)(group + o0 * taps + taps - 1) * esz, taps,
                     p->cg * taps, -1};
}

/* Each block's panel is written in order, row k (or pair kp) of its 8 outputs at a time, from
 * reads of 8 rows of w, with no fill first: the former loop per output (a memset, then every
 * 8th element) was 2.7% of ResNet-9's bf16 step on one thread (perf), this 1.5%. */
static void pack_weights_f32(const dc_pack_job *p, int64_t lo, int64_t hi) {
    const dc_shape *s = p->s;
    const int64_t taps = (int64_t)s->KH * s->KW;
    const int64_t mr = p->mr;
    for (int64_t gb = lo; gb < hi; gb++) {
        int64_t o0 = gb % s->blocks * mr, rows = s->cout - o0 < mr ? s->cout - o0 : mr;
        dc_wsrc src = weight_source(p, gb, sizeof(float));
        float *d = (float *)p->wp + gb * s->K * mr;
        for (int64_t c = 0; c < s->cin; c++)
            for (int64_t tap = 0; tap < taps; tap++, d += mr) {
                const float *e = (const float *)src.e + c * src.sc + tap * src.st;
                for (int64_t i = 0; i < mr; i++) d[i] = i < rows ? e[i * src.so] : 0.0f;
            }
    }
}

static void pack_weights_bf16(const dc_pack_job *p, int64_t lo, int64_t hi) {
    const dc_shape *s = p->s;
    const int64_t taps = (int64_t)s->KH * s->KW, bc = na_cpu_dc_block_channels(s, true);
    for (int64_t gb = lo; gb < hi; gb++) {
        int64_t o0 = gb % s->blocks * DC_MR, rows = s->cout - o0 < DC_MR ? s->cout - o0 : DC_MR;
        dc_wsrc src = weight_source(p, gb, sizeof(uint16_t));
        uint32_t *d = (uint32_t *)p->wp + gb * s->KP * DC_MR;
        for (int64_t c0 = 0; c0 < s->cin; c0 += bc) {
            int64_t c1 = c0 + bc < s->cin ? c0 + bc : s->cin, np = (c1 - c0 + 1) / 2;
            for (int64_t tap = 0; tap < taps; tap++)
                for (int64_t q = 0; q < np; q++, d += DC_MR) {
                    int64_t c = c0 + 2 * q;
                    const uint16_t *e = (const uint16_t *)src.e + c * src.sc + tap * src.st;
                    int64_t hs = c + 1 < c1 ? src.sc : -1; /* the pair's high half, or zero */
                    for (int64_t i = 0; i < DC_MR; i++)
                        d[i] = i >= rows ? 0
                                         : e[i * src.so] |
                                               (hs < 0 ? 0u : (uint32_t)e[i * src.so + hs] << 16);
                }
        }
    }
}

static void pack_task(void *ctx, int64_t t) {
    const dc_pack_job *p = ctx;
    int64_t lo, hi, n = p->s->blocks * p->groups;
    na_cpu_task_range(n, p->tasks, t, 1, &lo, &hi);
    (p->bf ? pack_weights_bf16 : pack_weights_f32)(p, lo, hi);
}

/* forward (w [C_out, C_in/G, KH, KW]) or, with backward_data, gx from gy: the weights of
 * block b of group gi packed as wp[gi][b][k][i], zero past the group's outputs */
int na_cpu_direct_conv2d(const na_conv_geom *g, const na_view *x, const na_view *w,
                         const na_view *bias, na_view *y, bool backward_data) {
    const char *fn = backward_data ? "cpu_conv2d_backward_data" : "cpu_conv2d";
    int64_t G = g->groups, cg = g->c_in / G, cog = g->c_out / G, taps = (int64_t)g->kh * g->kw;
    dc_job j = {.g = g, .x = x, .y = y, .tasks = na_cpu_conv_tasks(g)};
    if (!backward_data)
        j.s = (dc_shape){.cin = cg, .H = g->h, .W = g->w, .cout = cog, .OH = g->oh, .OW = g->ow,
                         .KH = g->kh, .KW = g->kw, .sh = g->sh, .ph = g->ph, .pw = g->pw,
                         .dh = g->dh};
    else
        j.s = (dc_shape){.cin = cog, .H = g->oh, .W = g->ow, .cout = cg, .OH = g->h, .OW = g->w,
                         .KH = g->kh, .KW = g->kw, .sh = 1, .ph = g->kh - 1 - g->ph,
                         .pw = g->kw - 1 - g->pw, .dh = 1};
    dc_shape *s = &j.s;
    /* the AVX2 tiles where there is no AVX-512F (na_cpu_direct_conv_usable said yes) */
    j.avx2 = !na_cpu_has_avx512f();
    if (j.avx2 && !na_cpu_dc_avx2_cpu()) /* only through na_cpu_direct_conv_usable */
        return na_set_error(NA_EINVAL, "%s: no direct convolution on this CPU", fn);
    j.mr = j.avx2 ? NA_DC2_MR : DC_MR;
    j.chunk = j.avx2 ? NA_DC2_CHUNK : DC_CHUNK;
    s->K = s->cin * taps;
    s->blocks = (s->cout + j.mr - 1) / j.mr;
    j.x_ch = backward_data ? g->c_out : g->c_in;
    j.y_ch = backward_data ? g->c_in : g->c_out;

    s->KP = ((s->cin + 1) / 2) * taps;
    bool x16 = x->dtype == NA_DTYPE_F16 || x->dtype == NA_DTYPE_BF16;
    bool y16 = y->dtype == NA_DTYPE_F16 || y->dtype == NA_DTYPE_BF16;
    j.bf = !j.avx2 && x->dtype == NA_DTYPE_BF16 && w->dtype == NA_DTYPE_BF16 &&
           na_cpu_bf16_fast();
    /* the AVX2 packer reads f16 (F16C) and bf16 in place; na_cpu_half512_off widens them
     * first there too (the same floats: the tests compare the bits) */
    j.xh = j.avx2 ? x16 && !na_cpu_half512_off
                  : !j.bf && x->dtype == NA_DTYPE_F16 && na_cpu_half512();
    j.yh = y16 && (j.avx2 || na_cpu_half512()) && !na_cpu_conv_half_out_off;

    int64_t wsize = g->c_out * cg * taps, psize = G * s->blocks * s->K * j.mr;
    /* the packed weights, the bias, and f32 copies of half weights for the f32 path (f32 ones
     * are read in place: ResNet-9's widest layer has 9 MiB of them) */
    int64_t wcopy = w->dtype == NA_DTYPE_F32 || j.bf ? 0 : wsize;
    float *wp = na_cpu_scratch(NA_CPU_SCRATCH_3,
                               (size_t)(psize + g->c_out + wcopy) * sizeof(float), fn);
    if (!wp) return NA_ENOMEM;
    float *bf = wp + psize;
    /* f32 weights are read in place, half ones widened first (the f32 path) */
    const void *wsrc = j.bf ? w->data : na_cpu_view_f(w->dtype, w->data, 0, wsize, bf + g->c_out);
    /* at least 64 KiB of weights per task: ResNet-9's 512 -> 512 layer (64 blocks of 144 KiB)
     * packs in 8 tasks, the MNIST CNN's first (one block of 288 floats) inline */
    dc_pack_job pj = {.s = s, .groups = G, .cog = cog, .cg = cg, .backward_data = backward_data,
                      .bf = j.bf, .w = wsrc, .wp = wp, .mr = j.mr,
                      .tasks = na_cpu_split(G * s->blocks, 1 + (1 << 14) / (s->K * j.mr), 8)};
    na_cpu_parallel_for(pj.tasks, pack_task, &pj);
    j.wp = wp;
    if (bias) {
        na_cpu_load_f(bias->dtype, bias->data, 0, g->c_out, bf);
        j.bias = bf;
    }
    na_cpu_parallel_for(g->n ? j.tasks : 0, dc_task, &j);
    return na_cpu_task_status_raise(&j.status);
}
