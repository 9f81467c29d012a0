/* Internals shared by the amp files (src/amp). */
#ifndef NANOAMP_SRC_AMP_INTERNAL_H
#define NANOAMP_SRC_AMP_INTERNAL_H

#include "common/amp.h"
#include "kernels/backend.h"
#include "nanoamp/amp.h"
#include "nanoamp/autograd.h"
#include "nanoamp/error.h"
#include "src/tensor/arena.h"

_Static_assert((int)NA_SCALER_GRAD == NA_AMP_KIND_GRAD_SCALER &&
                   (int)NA_SCALER_STATIC == NA_AMP_KIND_STATIC &&
                   (int)NA_SCALER_APEX_LEGACY == NA_AMP_KIND_APEX_LEGACY &&
                   (int)NA_SCALER_APEX == NA_AMP_KIND_APEX,
               "na_scaler_kind and kernels/common/amp.h disagree");

/* ---- the scaler, for the fp16 optimizer ---------------------------------------------------- */
/* out[i] = in[i] * (1/scale) with the inf/NaN check into found_inf (zeroed first), one fused
 * pass (any float dtypes: f16 model gradients into f32 master gradients). */
int na_grad_scaler_unscale_into_(na_grad_scaler *gs, int n, const na_view *const *in,
                                 na_view *const *out, na_tensor *found_inf);
/* One update from the given flags (the scaler's own per-optimizer bookkeeping untouched). */
int na_grad_scaler_update_from_(na_grad_scaler *gs, int n_found, const na_view *const *flags);
/* Moves the scaler's state to dev (no-op when already there). */
int na_grad_scaler_to_device_(na_grad_scaler *gs, na_device dev);
na_device na_grad_scaler_device_(const na_grad_scaler *gs);
/* The lowest scale gs's rule reaches: its min_scale, or NA_GRAD_SCALER_FLOOR. */
double na_grad_scaler_floor_(const na_grad_scaler *gs);
/* A persistent header viewing `count` elements of base from element `offset` with the given
 * shape (freed by na_tensor_free without touching base's memory). */
na_tensor *na_amp_persistent_view_(na_tensor *base, int64_t offset, int ndim,
                                   const int64_t *shape);
#endif
