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
 *       inf:   scale = max(min_scale, scale / growth); unskipped = 0
 *       clean: unskipped += 1
 *       then:  if unskipped == window { scale = min(max_scale, scale * growth); unskipped = 0 }
 *   Apex legacy DynamicLossScaler (apex/fp16_utils/loss_scaler.py update_scale):
 *       inf:   scale = max(scale / growth, min_scale); last_overflow_iter = cur_iter
 *       clean: if (cur_iter - last_overflow_iter) % window == 0: scale *= growth
 *       both:  cur_iter += 1            (cur_iter starts at 0, last_overflow_iter at -1)
 *   Static: the scale never changes and no step is ever skipped.
 * Bounds, under every rule: a scale that backs off stops at the lower bound, max(min_scale,
 * NA_AMP_SCALE_FLOOR); one that grows stops at max_scale when given, and never grows to inf
 * (Apex computes in Python doubles, where it would take far longer to get there; here the
 * scale is f32 as PyTorch's). The floor is our addition: PyTorch's scale halves on to 0 in f32
 * (about 165 overflows from 2^16), after which every clean step unscales 0 * inf = NaN without
 * flagging it.
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

#include "common/half.h" /* na_f32_bits */
#include "common/hd.h"

/* Scaler kinds (the values of na_scaler_kind in nanoamp/amp.h; src/amp checks they agree). */
enum {
    NA_AMP_KIND_GRAD_SCALER = 0, /* PyTorch GradScaler */
    NA_AMP_KIND_STATIC = 1,      /* a fixed scale (Apex LossScaler / static loss_scale) */
    NA_AMP_KIND_APEX_LEGACY = 2, /* Apex fp16_utils DynamicLossScaler */
    NA_AMP_KIND_APEX = 3,        /* Apex amp LossScaler("dynamic") */
    NA_AMP_KIND_COUNT
};

/* The scaler's hyper-parameters, one table for the kernel and the scaler's state (src/amp):
 * X(ID, name in the state list). amp_update_scale takes them as an array of NA_AMP_HP_COUNT
 * doubles in host memory, indexed NA_AMP_HP_<ID>; the scaler keeps each as an f64 0-dim
 * tensor named as here (PyTorch's state_dict keys). */
#define NA_AMP_HP_MAP(X)                                                                   \
    X(GROWTH, "growth_factor")    /* > 1 (Apex: scale_factor; Apex rules divide by it) */  \
    X(BACKOFF, "backoff_factor")  /* PyTorch only */                                       \
    X(INTERVAL, "growth_interval") /* Apex: scale_window */                                \
    X(MIN, "min_scale")           /* 0 for none (the floor still applies) */               \
    X(MAX, "max_scale")           /* 0 for none */

enum {
#define NA_AMP_HP_ENUM_(id, name) NA_AMP_HP_##id,
    NA_AMP_HP_MAP(NA_AMP_HP_ENUM_)
#undef NA_AMP_HP_ENUM_
    NA_AMP_HP_NEW_SCALE, /* not state, set per call: > 0 sets the scale instead of the rule */
    NA_AMP_HP_COUNT
};

/* The i32 counters tensor ([NA_AMP_CTR_COUNT]) amp_update_scale maintains, and their names
 * in the scaler's state list: X(ID, name, initial value). */
#define NA_AMP_CTR_MAP(X)                                                                  \
    X(TRACKER, "_growth_tracker", 0)           /* PyTorch tracker; Apex unskipped, cur_iter */ \
    X(LAST_OVERFLOW, "last_overflow_iter", -1) /* Apex legacy */                              \
    X(UPDATES, "updates", 0)                   /* updates made */                             \
    X(SKIPPED, "skipped_steps", 0)             /* updates that skipped their step (inf/NaN) */

enum {
#define NA_AMP_CTR_ENUM_(id, name, init) NA_AMP_CTR_##id,
    NA_AMP_CTR_MAP(NA_AMP_CTR_ENUM_)
#undef NA_AMP_CTR_ENUM_
    NA_AMP_CTR_COUNT
};

/* The lowest scale any rule reaches: 2^-24, f16's smallest subnormal. Below it every f16
 * gradient of magnitude <= 1 rounds to 0, so a smaller scale carries no information; its
 * reciprocal 2^24 is exact in f32, so unscaling a zero gives 0, never NaN. (nanoamp/amp.h's
 * NA_GRAD_SCALER_FLOOR is the same number; tests/test_amp_scaler.c checks they agree.) */
#define NA_AMP_SCALE_FLOOR 5.9604644775390625e-08

/* PyTorch: inv_scale = _scale.double().reciprocal().float(). */
static NA_HD float na_amp_inv_scale(float scale) { return (float)(1.0 / (double)scale); }

/* One gradient element (widened to f32): flags a non-finite input, returns it unscaled. The
 * multiply happens even when the value is not finite, as PyTorch's kernel does. */
static NA_HD float na_amp_unscale_value(float v, float inv_scale) {
    return inv_scale == 1.0f ? v : v * inv_scale;
}
static NA_HD float na_amp_unscale_elem(float v, float inv_scale, bool *nonfinite) {
    if (!isfinite(v)) *nonfinite = true;
    return na_amp_unscale_value(v, inv_scale);
}
/* 1 where v is not finite (all exponent bits set), else 0: na_amp_unscale_elem's flag as an
 * integer, whose OR over many values vectorizes */
static NA_HD uint32_t na_amp_nonfinite_bit(float v) {
    return (na_f32_bits(v) & 0x7F800000u) == 0x7F800000u;
}

static NA_HD int32_t na_amp_ctr_inc(int32_t c) { return c < INT32_MAX ? c + 1 : c; }

/* A scale after backoff: not below min_scale (when given) nor the floor. */
static NA_HD float na_amp_backed_off(double s, const double *hp) {
    double lo = hp[NA_AMP_HP_MIN] > NA_AMP_SCALE_FLOOR ? hp[NA_AMP_HP_MIN] : NA_AMP_SCALE_FLOOR;
    return (float)(s < lo ? lo : s);
}

/* A grown scale: not above max_scale (when given); `old` when it would not be finite in f32. */
static NA_HD float na_amp_grown(double s, const double *hp, float old) {
    if (hp[NA_AMP_HP_MAX] > 0.0 && s > hp[NA_AMP_HP_MAX]) s = hp[NA_AMP_HP_MAX];
    float g = (float)s;
    return isfinite(g) ? g : old;
}

/* One update of scale and counters for kind, given whether any inf/NaN was found. */
static NA_HD void na_amp_update(int kind, const double *hp, float *scale, int32_t *ctr,
                                bool found) {
    double growth = hp[NA_AMP_HP_GROWTH];
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
            *scale = na_amp_backed_off(s * hp[NA_AMP_HP_BACKOFF], hp);
            ctr[NA_AMP_CTR_TRACKER] = 0;
        } else {
            int32_t t = ctr[NA_AMP_CTR_TRACKER] + 1;
            if (t == interval) {
                *scale = na_amp_grown(s * growth, hp, *scale);
                t = 0;
            }
            ctr[NA_AMP_CTR_TRACKER] = t;
        }
        break;
    case NA_AMP_KIND_APEX:
        if (found) {
            *scale = na_amp_backed_off(s / growth, hp);
            ctr[NA_AMP_CTR_TRACKER] = 0;
        } else {
            ctr[NA_AMP_CTR_TRACKER] += 1;
        }
        if (ctr[NA_AMP_CTR_TRACKER] == interval) {
            *scale = na_amp_grown((double)*scale * growth, hp, *scale);
            ctr[NA_AMP_CTR_TRACKER] = 0;
        }
        break;
    case NA_AMP_KIND_APEX_LEGACY: {
        int32_t cur = ctr[NA_AMP_CTR_TRACKER];
        if (found) {
            *scale = na_amp_backed_off(s / growth, hp);
            ctr[NA_AMP_CTR_LAST_OVERFLOW] = cur;
        } else if (interval > 0 &&
                   ((int64_t)cur - (int64_t)ctr[NA_AMP_CTR_LAST_OVERFLOW]) % interval == 0) {
            *scale = na_amp_grown(s * growth, hp, *scale);
        }
        ctr[NA_AMP_CTR_TRACKER] = na_amp_ctr_inc(cur);
    } break;
    default: /* NA_AMP_KIND_STATIC */
        break;
    }
}

#endif
