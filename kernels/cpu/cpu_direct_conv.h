/* kernels/cpu/cpu_direct_conv.h — what the direct convolution's AVX-512 file
 * (cpu_direct_conv.c: the shape, the planning, the image passes, the weight packing) shares
 * with its AVX2 + FMA tiles (cpu_direct_conv_avx2.c). Internal to the CPU backend. */
#ifndef NANOAMP_KERNELS_CPU_DIRECT_CONV_H
#define NANOAMP_KERNELS_CPU_DIRECT_CONV_H

#include <stdbool.h>
#include <stdint.h>

#include "nanoamp/dtype.h"

/* One group's convolution as the kernel runs it: cin planes of H x W in, cout planes of
 * OH x OW out, horizontal stride and dilation 1. */
typedef struct {
    int64_t cin, H, W, cout, OH, OW, K, blocks; /* K = cin*KH*KW; blocks of mr outputs */
    int64_t KP; /* bf16 products: K in pairs of channels, KH*KW*ceil(cin/2) */
    int KH, KW, sh, ph, pw, dh;
} dc_shape;

/* Where a pass of images writes: image b's output planes at y + b*y_img elements, f32, or
 * f16/bf16 with `half` (rounded by the tiles' epilogue); a half output with several K blocks
 * keeps each chunk's partial sums in `part` (the group's cout x chunk floats), else NULL. */
typedef struct {
    void *y;
    int64_t y_img;
    bool half, f16;
    float *part;
} dc_dst;

/* Input channels per K block: the panel (K x 48 floats, or K/2 x 48 bf16 pairs; K x 24
 * floats on AVX2) stays within about 256 KiB of L2; bf16 blocks but the last hold whole
 * pairs. */
int64_t na_cpu_dc_block_channels(const dc_shape *s, bool bf);

/* ---- the AVX2 + FMA tiles (cpu_direct_conv_avx2.c) ------------------------------------------
 * 4 output channels x 3 tiles of 8 pixels (12 ymm accumulators); the weights packed as the
 * AVX-512 file packs them, in blocks of NA_DC2_MR outputs. */
enum { NA_DC2_MR = 4, NA_DC2_LANES = 8, NA_DC2_NT = 3, NA_DC2_CHUNK = NA_DC2_LANES * NA_DC2_NT };

/* Whether the CPU has AVX2, FMA and F16C (asked once). */
bool na_cpu_dc_avx2_cpu(void);

/* The convolution of nb images of one group, as the AVX-512 conv_images: image b's input
 * planes at x + b*x_img elements of dtype xdt (f32, or f16/bf16 read in place and widened in
 * registers), its output as d says; wp the group's packed f32 weights [block][K][4]. */
void na_cpu_dc_images_avx2(const dc_shape *s, na_dtype xdt, int64_t nb, const void *x,
                           int64_t x_img, const float *wp, const float *bias, const dc_dst *d,
                           float *panel);

/* The 3x3 weight gradient's tile (the AVX-512 wl_tile_f32 at 8 lanes): for a block of 32 output
 * channels, ct[t*ld + j] += sum over images b < nb, output pixels p of gt[p*32 + j] times x
 * under tap t (xp: padded planes of Wp columns, image b at xp + b*x_img), per 8 channels nine
 * ymm accumulators, one FMA chain per element in pixel order. */
void na_cpu_dc_wgrad_tile_avx2(const float *gt, const float *xp, int64_t x_img, int64_t nb,
                               const dc_shape *s, int64_t Wp, float *ct, int64_t ld);

/* The weight gradient's copies on AVX2 (gy into the tile's [pixel][channel] blocks, the
 * tile's [tap][channel] sums into gW's rows): dst[c*ldd + r] = src[r*lds + c] as f32 for
 * rows r < nr and columns c < nc of src (dt f32, or f16 / bf16 widened in registers with
 * cpu_half_simd.h's na_h8_* bits: exact, as common/half.h), by 8 x 8 transposes in ymm
 * registers; lanes r in [nr, nw) of each dst row are written 0 (nw >= nr), nothing past
 * lane nw nor past row nc - 1 of dst is written, nothing past column nc - 1 or row nr - 1
 * of src is read. */
void na_cpu_dc_transpose_avx2(na_dtype dt, const void *src, int64_t lds, int64_t nr, int64_t nw,
                              int64_t nc, float *dst, int64_t ldd);

/* One padded plane of the 3x3 weight gradient on AVX2: dst (Hp x Wp floats, Hp >= ph + H,
 * Wp >= pw + W) gets the H x W plane src (dt f32, or f16 / bf16 widened as above) at row ph,
 * column pw, and zeros everywhere else; every element of dst written once. */
void na_cpu_dc_pad_plane_avx2(na_dtype dt, const void *src, int64_t H, int64_t W, int64_t ph,
                              int64_t pw, int64_t Hp, int64_t Wp, float *dst);

#endif
