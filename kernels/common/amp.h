/* kernels/common/amp.h — the per-element math of the loss-scaling kernels, for both backends.
 *
 * Two kernels (kernels/backend.h, "amp: loss scaling") keep every loss-scaling decision on the
 * device, so a mixed-precision training step needs no host round trip:
 *
 *   amp_unscale       one fused pass over all gradients: out = in * inv_scale, and a found_inf
 *                     flag (f32 0-dim) set to 1 if any input element is inf or NaN. inv_scale is
 *                     made from the scale tensor on the device (na_amp_inv_scale).
 *   amp_update_scale  one thread: combines the found_inf flags of every optimizer and applies the
 *                     scaler's rule (na_amp_update) to the scale and its counters.
 *
 * The rules, exactly as their sources (../shared/docs/reference/amp-facts.md):
 *   PyTorch GradScaler (_amp_update_scale_, AmpKernels.cu), in double, stored as f32:
 *       inf:   scale *= backoff; tracker = 0
 *       clean: if tracker + 1 == interval { new = f32(scale * growth); if finite: scale = new;
 *              tracker = 0 } else tracker += 1
 *   Apex amp LossScaler (apex/amp/scaler.py update_scale):
 *       inf:   scale = max(min_scale, scale / growth) (no min when min_scale is 0); unskipped = 0
 *       clean: unskipped += 1
 *       then:  if unskipped == window { scale = min(max_scale, scale * growth); unskipped = 0 }
 *   Apex legacy DynamicLossScaler (apex/fp16_utils/loss_scaler.py update_scale):
 *       inf:   scale = max(scale / growth, min_scale); last_overflow_iter = cur_iter
 *       clean: if (cur_iter - last_overflow_iter) % window == 0: scale *= growth
 *       both:  cur_iter += 1            (cur_iter starts at 0, last_overflow_iter at -1)
 *   Static: the scale never changes and no step is ever skipped.
 * A scale never grows to inf under any rule (Apex computes in Python doubles, where it would
 * take far longer to get there; here the scale is f32 as PyTorch's).
 * An explicit new scale (GradScaler.update(new_scale)) replaces the rule: scale = new_scale,
 * the tracker is left alone.
 * Every update also counts: updates += 1, and skipped += 1 when found (not for Static).
 *
 * Plain C99 that also compiles as CUDA C++ (kernels/common/hd.h).
 */
#ifndef NANOAMP_KERNELS_COMMON_AMP_H
#define NANOAMP_KERNELS_COMMON_AMP_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/hd.h"

/* Scaler kinds (the values of na_scaler_kind in nanoamp/amp.h; src/amp checks they agree). */
enum {
    NA_AMP_KIND_GRAD_SCALER = 0, /* PyTorch GradScaler */
    NA_AMP_KIND_STATIC = 1,      /* a fixed scale (Apex LossScaler / static loss_scale) */
    NA_AMP_KIND_APEX_LEGACY = 2, /* Apex fp16_utils DynamicLossScaler */
    NA_AMP_KIND_APEX = 3,        /* Apex amp LossScaler("dynamic") */
    NA_AMP_KIND_COUNT
};

/* The hyper-parameter array amp_update_scale takes (host memory, NA_AMP_HP_COUNT doubles). */
enum {
    NA_AMP_HP_GROWTH,    /* growth factor (Apex: scale_factor) */
    NA_AMP_HP_BACKOFF,   /* backoff factor (PyTorch only; Apex divides by the growth factor) */
    NA_AMP_HP_INTERVAL,  /* growth interval (Apex: scale_window) */
    NA_AMP_HP_MIN,       /* minimum scale, 0 for none (Apex rules only) */
    NA_AMP_HP_MAX,       /* maximum scale, 0 for none (Apex rules only) */
    NA_AMP_HP_NEW_SCALE, /* > 0: set the scale to this instead of applying the rule */
    NA_AMP_HP_COUNT
};

/* The i32 counters tensor ([NA_AMP_CTR_COUNT]) amp_update_scale maintains. */
enum {
    NA_AMP_CTR_TRACKER,       /* PyTorch growth tracker; Apex amp unskipped; Apex legacy cur_iter */
    NA_AMP_CTR_LAST_OVERFLOW, /* Apex legacy last_overflow_iter (starts at -1) */
    NA_AMP_CTR_UPDATES,       /* updates made */
    NA_AMP_CTR_SKIPPED,       /* updates whose step was skipped (an inf or NaN was found) */
    NA_AMP_CTR_COUNT
};

/* PyTorch: inv_scale = _scale.double().reciprocal().float(). */
static NA_HD float na_amp_inv_scale(float scale) { return (float)(1.0 / (double)scale); }

/* One gradient element (widened to f32): flags a non-finite input, returns it unscaled. The
 * multiply happens even when the value is not finite, as PyTorch's kernel does. */
static NA_HD float na_amp_unscale_elem(float v, float inv_scale, bool *nonfinite) {
    if (!isfinite(v)) *nonfinite = true;
    return inv_scale == 1.0f ? v : v * inv_scale;
}

static NA_HD int32_t na_amp_ctr_inc(int32_t c) { return c < INT32_MAX ? c + 1 : c; }

/* One update of scale and counters for kind, given whether any inf/NaN was found. */
static NA_HD void na_amp_update(int kind, const double *hp, float *scale, int32_t *ctr,
                                bool found) {
    double growth = hp[NA_AMP_HP_GROWTH], min_s = hp[NA_AMP_HP_MIN], max_s = hp[NA_AMP_HP_MAX];
    int32_t interval = (int32_t)hp[NA_AMP_HP_INTERVAL];
    double s = (double)*scale;
    ctr[NA_AMP_CTR_UPDATES] = na_amp_ctr_inc(ctr[NA_AMP_CTR_UPDATES]);
    if (found && kind != NA_AMP_KIND_STATIC)
        ctr[NA_AMP_CTR_SKIPPED] = na_amp_ctr_inc(ctr[NA_AMP_CTR_SKIPPED]);
    if (hp[NA_AMP_HP_NEW_SCALE] > 0.0) {
        *scale = (float)hp[NA_AMP_HP_NEW_SCALE];
        return;
    }
    switch (kind) {
    case NA_AMP_KIND_GRAD_SCALER:
        if (found) {
            *scale = (float)(s * hp[NA_AMP_HP_BACKOFF]);
            ctr[NA_AMP_CTR_TRACKER] = 0;
        } else {
            int32_t t = ctr[NA_AMP_CTR_TRACKER] + 1;
            if (t == interval) {
                float grown = (float)(s * growth);
                if (isfinite(grown)) *scale = grown; /* never grow past f32's range to inf */
                t = 0;
            }
            ctr[NA_AMP_CTR_TRACKER] = t;
        }
        break;
    case NA_AMP_KIND_APEX:
        if (found) {
            s = s / growth;
            if (min_s > 0.0 && s < min_s) s = min_s;
            *scale = (float)s;
            ctr[NA_AMP_CTR_TRACKER] = 0;
        } else {
            ctr[NA_AMP_CTR_TRACKER] += 1;
        }
        if (ctr[NA_AMP_CTR_TRACKER] == interval) {
            double g = (double)*scale * growth;
            if (max_s > 0.0 && g > max_s) g = max_s;
            if (isfinite((float)g)) *scale = (float)g;
            ctr[NA_AMP_CTR_TRACKER] = 0;
        }
        break;
    case NA_AMP_KIND_APEX_LEGACY: {
        int32_t cur = ctr[NA_AMP_CTR_TRACKER];
        if (found) {
            s = s / growth;
            if (min_s > 0.0 && s < min_s) s = min_s;
            *scale = (float)s;
            ctr[NA_AMP_CTR_LAST_OVERFLOW] = cur;
        } else if (interval > 0 &&
                   ((int64_t)cur - (int64_t)ctr[NA_AMP_CTR_LAST_OVERFLOW]) % interval == 0) {
            float g = (float)(s * growth);
            if (isfinite(g)) *scale = g;
        }
        ctr[NA_AMP_CTR_TRACKER] = na_amp_ctr_inc(cur);
    } break;
    default: /* NA_AMP_KIND_STATIC */
        break;
    }
}

#endif
