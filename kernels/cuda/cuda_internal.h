/* kernels/cuda/cuda_internal.h — CUDA entry points outside the kernel list (plain C).
 *
 * The kernel list (kernels/backend.h) serves the ops; these are the CUDA backend's newer
 * paths in their direct form, so tests/test_cuda_parity.c can check them against the CPU
 * whatever the switches say, plus device self-checks. The backend entries take these paths
 * when their switch is on (read once, at the first call):
 *   NANOAMP_CUDA_BN=v2    batch_norm_train / _eval / _backward -> na_cuda_bn2_*
 *   NANOAMP_CUDA_BN_ROWS=1  the same with s == 1 (x is [M, C] rows: BatchNorm1d,
 *                         channels-last activations) -> na_cuda_bn_rows_* (before v2)
 *   NANOAMP_CUDA_POOL2=1  max_pool2d(_backward) with a 2x2 window, stride 2, no padding,
 *                         no dilation -> na_cuda_max_pool2x2(_backward)
 * Built only with the CUDA backend (NA_HAVE_CUDA).
 */
#ifndef NANOAMP_KERNELS_CUDA_INTERNAL_H
#define NANOAMP_KERNELS_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One BatchNorm call over x [N, C, S] (the kernel list's contract, plus `relu`):
 *  train:    y = relu?(norm(x)); stats into save_mean/save_invstd, running stats updated;
 *  eval:     y = relu?(norm(x)) with the running stats;
 *  backward: from x, gy (and, with relu, the forward's output y: gy counts where y is not <= 0: NaN passes, NA_RELU_GRAD)
 *            with mean/invstd (the saved stats; the running ones and train = false in eval)
 *            into gx, ggamma, gbeta (each may be NULL).
 * relu = true is BatchNorm + ReLU in one pass each way (na_batch_norm_relu reaches it through
 * the kernel list's relu / relu_y arguments). */
typedef struct {
    const na_view *x, *gamma, *beta; /* gamma/beta NULL: affine off */
    na_view *y;                      /* forward output; backward input when relu */
    na_view *running_mean, *running_var, *save_mean, *save_invstd; /* forward, may be NULL */
    const na_view *gy, *mean, *invstd;                             /* backward */
    na_view *gx, *ggamma, *gbeta;                                  /* backward, may be NULL */
    int64_t n, c, s;
    double momentum, eps;
    bool train, relu;
} na_cuda_bn_args;

int na_cuda_bn2_train(const na_cuda_bn_args *a);
int na_cuda_bn2_eval(const na_cuda_bn_args *a);
int na_cuda_bn2_backward(const na_cuda_bn_args *a);

/* The same calls for s == 1 (x row-major [M = n, C = c]) with threads across the channels
 * (common/bn_rows.h); NA_EINVAL for s != 1. */
int na_cuda_bn_rows_train(const na_cuda_bn_args *a);
int na_cuda_bn_rows_eval(const na_cuda_bn_args *a);
int na_cuda_bn_rows_backward(const na_cuda_bn_args *a);

/* max_pool2d / its backward for a 2x2 window with stride 2, no padding, dilation 1 (the
 * kernel list's contract); NA_EINVAL for any other geometry. Channels-last views are served
 * by the generic strided kernels (the 2x2 kernels read contiguous NCHW rows). */
int na_cuda_max_pool2x2(const na_conv_geom *g, const na_view *x, na_view *y, na_view *idx);
int na_cuda_max_pool2x2_backward(const na_conv_geom *g, const na_view *gy, const na_view *idx,
                                 na_view *gx);

/* Runs the hardware conversions the BatchNorm v2 kernels use against common/half.h on the
 * device: bad[0] counts f32 -> f16 (__float2half_rn) results that differ over all 2^32 f32
 * inputs, bad[1] f32 -> bf16 (__float2bfloat16_rn), bad[2] f16 -> f32 (__half2float) over
 * all 2^16, bad[3] bf16 -> f32 (__bfloat162float); a NaN matches any NaN. Synchronizes. */
int na_cuda_check_half_intrinsics(uint64_t bad[4]);

#ifdef __cplusplus
}
#endif
#endif
