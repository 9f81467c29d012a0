/* kernels/common/philox.h — Philox4x32-10 counter-based RNG, one definition for host and device.
 *
 * Philox4x32-10 as in Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3" (SC'11) and
 * the Random123 library.  Every random fill in nanoamp (CPU and CUDA) maps elements to counters
 * with the functions below, so a fill is a pure function of (seed, offset, element index): the
 * same tensor comes out on both backends and for any thread/block decomposition.
 *
 * Element -> counter mapping, for element i (uint64) of a fill with generator seed `seed` and the
 * generator's running `offset` (both uint64):
 *     ctr = { lo32(i/4), hi32(i/4), lo32(offset), hi32(offset) }
 *     key = { lo32(seed), hi32(seed) }
 *     element i takes lane i%4 of philox4x32_10(ctr, key).
 *
 * uniform: (u >> 8) * 2^-24, i.e. 24 random bits, in [0, 1), exactly representable in f32.
 *
 * normal (Box–Muller on lane pairs): element i uses lanes (0,1) of its block if i%4 is 0 or 1,
 * else lanes (2,3); with a the first and b the second lane of the pair,
 *     u1 = ((a >> 8) + 1) * 2^-24   in (0, 1], never 0, so logf(u1) is finite
 *     u2 = (b >> 8) * 2^-24         in [0, 1)
 *     r  = sqrtf(-2 logf(u1))
 * the even member of the pair (i%2 == 0) gets r*cosf(2π u2), the odd member r*sinf(2π u2).
 * Integer outputs and uniforms are bit-identical on host and device; normals go through the
 * libm / CUDA math logf, sqrtf, cosf, sinf and may differ in the last ulp between backends.
 */
#ifndef NANOAMP_KERNELS_COMMON_PHILOX_H
#define NANOAMP_KERNELS_COMMON_PHILOX_H

#include <math.h>
#include <stdint.h>

#include "common/hd.h"

#define NA_PHILOX_M0 0xD2511F53u
#define NA_PHILOX_M1 0xCD9E8D57u
#define NA_PHILOX_W0 0x9E3779B9u
#define NA_PHILOX_W1 0xBB67AE85u

static NA_HD void na_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)NA_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)NA_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += NA_PHILOX_W0;
        k1 += NA_PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The Philox block (4 lanes) holding element i of a fill. */
static NA_HD void na_philox_block(uint64_t seed, uint64_t offset, uint64_t i, uint32_t out[4]) {
    uint64_t blk = i >> 2;
    uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)offset,
                       (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    na_philox4x32_10(ctr, key, out);
}

static NA_HD uint32_t na_philox_u32(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t out[4];
    na_philox_block(seed, offset, i, out);
    return out[i & 3u];
}

static NA_HD float na_philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
    return (float)(na_philox_u32(seed, offset, i) >> 8) * 0x1p-24f;
}

static NA_HD float na_philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t out[4];
    na_philox_block(seed, offset, i, out);
    unsigned pair = (unsigned)(i & 2u);                      /* lanes (0,1) or (2,3) */
    float u1 = (float)((out[pair] >> 8) + 1u) * 0x1p-24f;    /* (0, 1] */
    float u2 = (float)(out[pair + 1u] >> 8) * 0x1p-24f;      /* [0, 1) */
    float r = sqrtf(-2.0f * logf(u1));
    float t = 6.28318530717958647692f * u2;
    return (i & 1u) ? r * sinf(t) : r * cosf(t);
}

#endif
