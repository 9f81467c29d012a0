/* Internals shared by the amp files (src/amp) and the one hook the autograd engine calls. */
#ifndef NANOAMP_SRC_AMP_INTERNAL_H
#define NANOAMP_SRC_AMP_INTERNAL_H

#include "kernels/backend.h"
#include "nanoamp/amp.h"
#include "nanoamp/autograd.h"
#include "nanoamp/error.h"
#include "src/tensor/arena.h"

/* Called by na_graph_record (src/autograd/engine.c) for every op once its output exists: the
 * trace completes the op's line here (a flag test when tracing is off). */
void na_amp_trace_op(na_op op, const na_tensor *out, int n_inputs, na_tensor *const *inputs);

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
/* Appends the scaler's state (na_grad_scaler_state) named prefix + name to out. */
int na_grad_scaler_state_into_(na_grad_scaler *gs, const char *prefix, na_named_tensors *out,
                               int64_t *cap);

/* Appends (prefix + name, t) to a list being built (cap: its capacity, 0 at first). */
int na_amp_list_add_(na_named_tensors *l, int64_t *cap, const char *prefix, const char *name,
                     na_tensor *t);

/* Replaces t's storage by storage on dev holding the same values (the struct stays). */
int na_amp_move_tensor_(na_tensor *t, na_device dev);
/* A persistent header viewing `count` elements of base from element `offset` with the given
 * shape (freed by na_tensor_free without touching base's memory). */
na_tensor *na_amp_persistent_view_(na_tensor *base, int64_t offset, int ndim,
                                   const int64_t *shape);
#endif
