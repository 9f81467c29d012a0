/* kernels/common/welford.h — per-channel statistics from partials combined in a fixed order,
 * for the many-blocks-per-channel BatchNorm kernels (kernels/cuda/batchnorm.cu, switches
 * NANOAMP_CUDA_BN=v2 and, for rows, NANOAMP_CUDA_BN_ROWS=1 with common/bn_rows.h) and their
 * host-side reference (tests/test_welford.c).
 *
 * A partial is (count n, mean, M2 = sum of squared deviations from mean). Partials merge by
 * Chan et al.'s rule, which never forms sum(x^2) - n*mean^2, so a channel with a large mean
 * and a small spread keeps its variance (no catastrophic cancellation):
 *   n = na + nb, delta = mean_b - mean_a,
 *   mean = mean_a + delta * nb/n,  M2 = M2_a + M2_b + delta^2 * na*nb/n.
 * Merging is not associative in floating point, so every step of the GPU's reduction has ONE
 * order, written here and nowhere else:
 *   - a 16-byte vector of V values is one partial, made by two passes over its registers
 *     (na_welford_of); a thread folds its vectors in order (na_welford_merge(acc, vec));
 *   - 32 lanes combine as a tree: for o = 16, 8, 4, 2, 1, lane i < o takes
 *     merge(lane i, lane i + o) (na_welford_tree32; the device's __shfl_down_sync gives lane
 *     i exactly lane i + o's value, so its lane 0 equals this function's result bit for bit);
 *   - a block is its warps' trees, then one tree over the warp results padded with empty
 *     partials (na_welford_block);
 *   - a channel's partials, one per tile, are folded by 32 lanes, lane i taking partials
 *     i, i + 32, i + 64, ... in order, then one tree (na_welford_combine).
 * A tile (NA_BN_THREADS threads x NA_BN_VPT vectors) depends only on the shape and the
 * vector width, never on the grid, so the statistics are the same on every GPU and every
 * launch: deterministic, with no atomics on floats.
 * The backward's two sums (sum dy, sum dy*xhat) use the same orders with plain addition
 * (na_sum2_*). Plain C99, host + device; every name ends in _f (float) or _d (double).
 */
#ifndef NANOAMP_KERNELS_COMMON_WELFORD_H
#define NANOAMP_KERNELS_COMMON_WELFORD_H

#include <stdint.h>

#include "common/hd.h"

/* Threads of a BatchNorm block and 16-byte vectors per thread in one tile. */
#define NA_BN_THREADS 256
#define NA_BN_VPT 4
/* Lanes that fold a channel's partials (one warp). */
#define NA_WELFORD_LANES 32

/* Vector k of tile t handled by thread th in its j-th load: consecutive threads read
 * consecutive vectors (coalesced), a thread's loads are NA_BN_THREADS vectors apart. */
static NA_HD int64_t na_bn_tile_vec(int64_t tile, int j, int th) {
    return tile * (NA_BN_THREADS * NA_BN_VPT) + (int64_t)j * NA_BN_THREADS + th;
}
/* Tiles of a channel of nvec vectors. */
static NA_HD int64_t na_bn_tiles(int64_t nvec) {
    const int64_t tv = NA_BN_THREADS * NA_BN_VPT;
    return nvec > 0 ? (nvec + tv - 1) / tv : 1;
}

/* The fixed combining orders, once for any partial type P with merge M(a, b) (a first). */
#define NA_FIXED_ORDER_DEFINE_(P, NAME, SFX, M, EMPTY)                                      \
    /* n lanes, n a power of 2: for o = n/2, ..., 1, lane i < o takes M(lane i, lane i+o) */ \
    static NA_HD P na_##NAME##_tree_##SFX(P *lane, int n) {                                 \
        for (int o = n / 2; o > 0; o >>= 1)                                                 \
            for (int i = 0; i < o; i++) lane[i] = M(lane[i], lane[i + o]);                  \
        return lane[0];                                                                     \
    }                                                                                       \
    static NA_HD P na_##NAME##_tree32_##SFX(P *lane) {                                      \
        return na_##NAME##_tree_##SFX(lane, NA_WELFORD_LANES);                              \
    }                                                                                       \
    /* lanes[nthreads] of one block (nthreads a multiple of 32, at most 1024); clobbers */  \
    static NA_HD P na_##NAME##_block_##SFX(P *lanes, int nthreads) {                        \
        P warp[NA_WELFORD_LANES];                                                           \
        for (int w = 0; w < NA_WELFORD_LANES; w++)                                          \
            warp[w] = w < nthreads / 32 ? na_##NAME##_tree32_##SFX(lanes + 32 * w) : EMPTY(); \
        return na_##NAME##_tree32_##SFX(warp);                                              \
    }                                                                                       \
    static NA_HD P na_##NAME##_combine_##SFX(const P *parts, int64_t count) {               \
        P lane[NA_WELFORD_LANES];                                                           \
        for (int i = 0; i < NA_WELFORD_LANES; i++) {                                        \
            lane[i] = EMPTY();                                                              \
            for (int64_t k = i; k < count; k += NA_WELFORD_LANES) lane[i] = M(lane[i], parts[k]); \
        }                                                                                   \
        return na_##NAME##_tree32_##SFX(lane);                                              \
    }

#define NA_WELFORD_DEFINE_(T, SFX)                                                          \
    typedef struct {                                                                        \
        int64_t n;                                                                          \
        T mean, m2;                                                                         \
    } na_welford_##SFX;                                                                     \
    static NA_HD na_welford_##SFX na_welford_empty_##SFX(void) {                            \
        na_welford_##SFX w = {0, (T)0, (T)0};                                               \
        return w;                                                                           \
    }                                                                                       \
    /* the partial of k values: mean first, then the squared deviations from it */          \
    static NA_HD na_welford_##SFX na_welford_of_##SFX(const T *v, int k) {                  \
        T s = (T)0, q = (T)0;                                                               \
        for (int i = 0; i < k; i++) s += v[i];                                              \
        const T mean = s / (T)k;                                                            \
        for (int i = 0; i < k; i++) q += (v[i] - mean) * (v[i] - mean);                     \
        na_welford_##SFX w = {k, mean, q};                                                  \
        return w;                                                                           \
    }                                                                                       \
    /* the weight of b in a merge: a kernel whose partials share their counts computes it   \
     * once for many channels (na_welford_merge_fb) */                                      \
    static NA_HD T na_welford_fb_##SFX(int64_t na, int64_t nb) {                            \
        return (T)nb / (T)(na + nb);                                                        \
    }                                                                                       \
    /* the merge of two non-empty partials, fb = na_welford_fb(a.n, b.n) */                 \
    static NA_HD na_welford_##SFX na_welford_merge_fb_##SFX(na_welford_##SFX a,             \
                                                            na_welford_##SFX b, T fb) {     \
        na_welford_##SFX r;                                                                 \
        r.n = a.n + b.n;                                                                    \
        const T delta = b.mean - a.mean;                                                    \
        r.mean = a.mean + delta * fb;                                                       \
        r.m2 = a.m2 + b.m2 + delta * delta * ((T)a.n * fb);                                 \
        return r;                                                                           \
    }                                                                                       \
    /* na_welford_of for k <= NA_BN_VPT with loops of the constant length NA_BN_VPT (the    \
     * values past k skipped: the same sums), so a kernel keeps v in registers */          \
    static NA_HD na_welford_##SFX na_welford_of_upto_##SFX(const T *v, int k) {             \
        T s = (T)0, q = (T)0;                                                               \
        for (int i = 0; i < NA_BN_VPT; i++)                                                 \
            if (i < k) s += v[i];                                                           \
        const T mean = s / (T)k;                                                            \
        for (int i = 0; i < NA_BN_VPT; i++)                                                 \
            if (i < k) q += (v[i] - mean) * (v[i] - mean);                                  \
        na_welford_##SFX w = {k, mean, q};                                                  \
        return w;                                                                           \
    }                                                                                       \
    static NA_HD na_welford_##SFX na_welford_merge_##SFX(na_welford_##SFX a,                \
                                                         na_welford_##SFX b) {              \
        if (b.n == 0) return a;                                                             \
        if (a.n == 0) return b;                                                             \
        return na_welford_merge_fb_##SFX(a, b, na_welford_fb_##SFX(a.n, b.n));              \
    }                                                                                       \
    NA_FIXED_ORDER_DEFINE_(na_welford_##SFX, welford, SFX, na_welford_merge_##SFX,          \
                           na_welford_empty_##SFX)                                          \
                                                                                            \
    /* (sum dy, sum dy*xhat) of the backward */                                             \
    typedef struct {                                                                        \
        T a, b;                                                                             \
    } na_sum2_##SFX;                                                                        \
    static NA_HD na_sum2_##SFX na_sum2_empty_##SFX(void) {                                  \
        na_sum2_##SFX s = {(T)0, (T)0};                                                     \
        return s;                                                                           \
    }                                                                                       \
    static NA_HD na_sum2_##SFX na_sum2_merge_##SFX(na_sum2_##SFX x, na_sum2_##SFX y) {      \
        na_sum2_##SFX s = {x.a + y.a, x.b + y.b};                                           \
        return s;                                                                           \
    }                                                                                       \
    NA_FIXED_ORDER_DEFINE_(na_sum2_##SFX, sum2, SFX, na_sum2_merge_##SFX,                   \
                           na_sum2_empty_##SFX)

NA_WELFORD_DEFINE_(float, f)
NA_WELFORD_DEFINE_(double, d)

#endif
