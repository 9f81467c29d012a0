/* kernels/common/bn_stats.h — a training BatchNorm's per-channel statistics once they are
 * reduced: the inverse standard deviation, PyTorch's running-statistics update, the training
 * backward's gx per element (na_bn_grad), and the mean
 * and variance from a sum and a sum of squares (the batch_norm_finalize kernel, fed by a
 * convolution that summed its own output: conv2d_stats). Written once here for the CPU
 * backend and every CUDA BatchNorm kernel, so they update running statistics with the same
 * expressions. Plain C99, host + device; every name ends in _f (float) or _d (double); C++
 * (the CUDA kernels' templates) also gets each under its bare name, overloaded on the type.
 */
#ifndef NANOAMP_KERNELS_COMMON_BN_STATS_H
#define NANOAMP_KERNELS_COMMON_BN_STATS_H

#include <math.h>
#include <stdint.h>

#include "common/hd.h"

#define NA_BN_STATS_DEFINE_(T, SFX, SQRT)                                                   \
    static NA_HD T na_bn_invstd##SFX(T var, T eps) { return (T)1 / SQRT(var + eps); }       \
    /* running = (1 - momentum) * running + momentum * batch mean */                        \
    static NA_HD T na_bn_running_mean##SFX(T running, T mean, T momentum) {                 \
        return ((T)1 - momentum) * running + momentum * mean;                               \
    }                                                                                       \
    /* the same with the unbiased variance, var * m/(m-1) over m values (var when m == 1) */\
    static NA_HD T na_bn_running_var##SFX(T running, T var, int64_t m, T momentum) {        \
        T unbiased = m > 1 ? var * ((T)m / (T)(m - 1)) : var;                               \
        return ((T)1 - momentum) * running + momentum * unbiased;                           \
    }                                                                                       \
    /* mean and biased variance of m values from their sum and sum of squares. sqsum/m -    \
     * mean^2 cancels when |mean| is large against the spread (the Welford kernels do not); \
     * rounding can make it negative, which is clamped to 0 */                              \
    static NA_HD void na_bn_from_sums##SFX(T sum, T sqsum, int64_t m, T *mean, T *var) {    \
        *mean = sum / (T)m;                                                                 \
        T v = sqsum / (T)m - *mean * *mean;                                                 \
        *var = v > (T)0 ? v : (T)0;                                                         \
    }                                                                                       \
    /* a training backward's gx from gy (times relu'(y) when fused), mg = sum(gy)/M and     \
     * mgx = sum(gy*xhat)/M, scale = invstd * gamma */                                      \
    static NA_HD T na_bn_grad##SFX(T gy, T x, T mean, T invstd, T mg, T mgx, T scale) {     \
        return (gy - mg - ((x - mean) * invstd) * mgx) * scale;                             \
    }

NA_BN_STATS_DEFINE_(float, _f, sqrtf)
NA_BN_STATS_DEFINE_(double, _d, sqrt)
#ifdef __cplusplus
NA_BN_STATS_DEFINE_(float, , sqrtf)
NA_BN_STATS_DEFINE_(double, , sqrt)
#endif
#undef NA_BN_STATS_DEFINE_

#endif
