/* nanoamp/autograd.h — reverse-mode automatic differentiation.
 *
 * Ops record a node when an input requires grad and grad mode is on. na_backward walks the
 * graph from `root` in reverse topological order and ACCUMULATES (+=) into the .grad of
 * every leaf tensor that requires grad: call zero_grad (optimizer) or na_tensor_zero_grad
 * between steps, or gradients of several backward calls add up. The .grad of a persistent
 * leaf is persistent (freed with it); graph nodes and non-leaf gradients live in the step
 * arena and vanish at na_step_end().
 *
 *     na_tensor_set_requires_grad(w, true);
 *     na_tensor *loss = na_sum(na_mul(w, w));
 *     na_backward(loss, NULL);        // w->grad += 2*w
 *     na_step_end();
 */
#ifndef NANOAMP_AUTOGRAD_H
#define NANOAMP_AUTOGRAD_H

#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs the backward pass. `grad` is the gradient of root (same shape, dtype and device);
 * NULL means 1 and is only allowed for a one-element root. Returns NA_OK or an error. */
int na_backward(na_tensor *root, na_tensor *grad);

/* Only float leaves can require grad. */
int na_tensor_set_requires_grad(na_tensor *t, bool requires_grad);
int na_tensor_zero_grad(na_tensor *t); /* zeroes t->grad if it exists */

/* No-grad regions nest; ops inside record nothing. */
void na_no_grad_begin(void);
void na_no_grad_end(void);
bool na_grad_enabled(void);

/* A view of t that shares its memory but is cut from the graph. */
na_tensor *na_detach(na_tensor *t);

/* ---- gradient checking ------------------------------------------------------------- */
/* f maps inputs to one output tensor (any shape). The check runs in f64: every input must
 * be an f64 CPU tensor. It compares the analytic vector-Jacobian products with central
 * finite differences for every input element that requires grad, and also checks that
 * backward is deterministic (run twice) and that a zero output gradient gives zero input
 * gradients. Defaults are PyTorch gradcheck's: eps 1e-6, atol 1e-5, rtol 1e-3. */
typedef na_tensor *(*na_gradcheck_fn)(na_tensor **inputs, void *ctx);
typedef struct {
    double eps, atol, rtol; /* 0 means the default */
} na_gradcheck_opts;
/* Returns NA_OK when the gradients agree; otherwise an error whose message names the
 * input, the element, the analytic and the numeric value. */
int na_gradcheck(na_gradcheck_fn f, void *ctx, na_tensor **inputs, int n_inputs,
                 const na_gradcheck_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
