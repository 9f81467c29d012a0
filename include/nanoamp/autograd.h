/* nanoamp/autograd.h — reverse-mode automatic differentiation, and functions of your own
 * (na_function: a forward, a backward and an autocast contract; implemented in the ops layer,
 * src/ops/custom.c, since a call consults autocast like any op).
 *
 * Ops record a node when an input requires grad and grad mode is on. na_backward walks the
 * graph from `root` in reverse topological order and ACCUMULATES (+=) into the .grad of
 * every leaf tensor that requires grad: call zero_grad (optimizer) or na_tensor_zero_grad
 * between steps, or gradients of several backward calls add up. The .grad of a persistent
 * leaf is persistent (freed with it); graph nodes live in the step arena and vanish at
 * na_step_end(). Gradients of intermediates go back to the arena as soon as the pass has
 * used them (their memory is reused within the step), so after na_backward a non-leaf's
 * .grad is NULL.
 *
 * Zeroed gradients. zero_grad does not fill a gradient: it marks it zero (t->grad->
 * zero_deferred), and the next backward writes it whole where an op can (the weight and
 * bias gradients of conv2d, linear and matmul go straight into .grad, as a GEMM with beta 0)
 * or copies its first contribution there, instead of a fill, a temporary and an add. A
 * gradient nobody wrote still reads as zeros: na_backward ends with every mark filled in,
 * and every nanoamp function that reads or writes gradients (optimizers, clipping, the
 * scaler, the fp16 optimizer, DDP, module conversion, step graphs, na_get, na_copy_to_host)
 * fills them in first. Only code that reads a gradient's memory otherwise between zero_grad
 * and the next backward (t->grad->data, an op on t->grad) calls na_grad_settle() first.
 * The values are those of fill + add, bit for bit, except that a gradient that is exactly -0
 * now stays -0 (0 + -0 was +0), as in PyTorch with set_to_none. On CUDA this waits for a
 * GPU check: zero_grad fills CUDA gradients at once unless NANOAMP_GRAD_INPLACE=1.
 *
 * Saved activations. na_backward also gives back, as soon as the last node that needs them
 * has run, the forward tensors that no user code can reach: the outputs a Sequential passes
 * from one child to the next, a Residual's body output, and what an op made for its own
 * backward (masks, indices, statistics). Everything the user holds stays as it was: the root,
 * the tensors ops returned to user code (a model's output, an intermediate of a module
 * forward of your own), inputs, leaves and persistent tensors. The graph is then used up, as
 * in PyTorch without retain_graph: walking it again fails with NA_ESTATE (and adds nothing).
 * To walk one graph several times, use na_backward_retain for every walk but the last. An op
 * given a tensor na_backward gave back fails with NA_ESTATE, naming the op.
 *
 * In-place writes. Every tensor counts the in-place writes to its memory (t->version: na_copy_,
 * na_fill_, na_copy_from_host, a custom function's na_function_mark_dirty; a view's writes
 * count on its base). A node whose backward reads a value (exp's output, mul's inputs: the op
 * table's reads column, nanoamp/ops.h) that was written after the op ran fails na_backward
 * with NA_ESTATE, as PyTorch: "one of the variables needed for gradient computation has been
 * modified by an inplace operation", naming the tensor and the op. Writes through t->data
 * directly are invisible to the count: a custom function that writes an input says so with
 * na_function_mark_dirty.
 *
 *     na_tensor_set_requires_grad(w, true);
 *     na_tensor *loss = na_sum(na_mul(w, w));
 *     na_backward(loss, NULL);        // w->grad += 2*w
 *     na_step_end();
 */
#ifndef NANOAMP_AUTOGRAD_H
#define NANOAMP_AUTOGRAD_H

#include <stddef.h>

#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs the backward pass. `grad` is the gradient of root (same shape, dtype and device);
 * NULL means 1 and is only allowed for a one-element root. Returns NA_OK or an error. */
int na_backward(na_tensor *root, na_tensor *grad);
/* The same, keeping every saved tensor, so the graph can be walked again (PyTorch's
 * retain_graph=True); gradients of intermediates are still given back. */
int na_backward_retain(na_tensor *root, na_tensor *grad);

/* Only float leaves can require grad. */
int na_tensor_set_requires_grad(na_tensor *t, bool requires_grad);
int na_tensor_zero_grad(na_tensor *t); /* marks t->grad zero if it exists (see above) */
/* Fills in every gradient zero_grad marked and no backward wrote since: the memory then
 * holds the zeros it reads as. Needed only to read a gradient's memory yourself between
 * zero_grad and the next backward. */
int na_grad_settle(void);

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

/* ---- your own op: custom functions (PyTorch's autograd.Function) ----------------------------
 * A function is a forward, a backward and how it behaves under autocast; na_function_apply
 * runs it as one op of the graph. The forward computes its outputs from its inputs however it
 * likes (ops, or raw loops and kernels on t->data); it runs in no-grad mode, so the ops it
 * calls record nothing. It may save tensors and plain values in its context for backward. The
 * backward receives one gradient per output and writes one per input. Everything a call makes
 * (outputs, context, saved values, gradients) lives in the step arena: never free it.
 * docs/custom-ops.md walks through a whole example (examples/custom_op).
 *
 *     static int fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
 *         na_function_save(c, in[0]);
 *         out[0] = na_mul(in[0], in[0]);                  // y = x^2
 *         return out[0] ? NA_OK : na_last_status();
 *     }
 *     static int bwd(na_function_ctx *c, na_tensor *const *gout, na_tensor **gin) {
 *         na_tensor *x = na_function_saved(c, 0);
 *         gin[0] = na_mul(gout[0], na_scale(x, 2.0));     // dy/dx = 2x
 *         return gin[0] ? 1 : na_last_status();           // one gradient per input
 *     }
 *     static const na_function square = {.name = "square", .n_inputs = 1, .n_outputs = 1,
 *                                         .forward = fwd, .backward = bwd};
 *     na_tensor *y = na_function_apply1(&square, &x, NULL);
 *
 * Autocast (PyTorch's custom_fwd / custom_bwd). By default a function runs as called: inside
 * an enabled autocast region its inputs arrive in whatever dtype they have (an f16 activation
 * stays f16) and the ops its forward calls are autocast as usual. With .cast_inputs, inside
 * an enabled region each float input other than f64 is cast to .forward_dtype and autocast is
 * off while forward runs, so a forward written for f32 never sees f16 (outside enabled
 * regions .cast_inputs does nothing). Either way backward runs under the autocast state its
 * forward ran under. The amp trace shows a call under the function's name with its rule.
 *
 * Raw kernels. t->data is the first element (t->stride in elements; na_is_contiguous tells);
 * t->device says where: a host pointer on the CPU, a device pointer on CUDA. Launch CUDA work
 * on na_cuda_stream() (nanoamp/cuda.h), the stream every nanoamp kernel and copy runs on:
 * then no synchronisation is needed, since the next op runs after it in stream order. Work on
 * another stream must be ordered with that one by the user (an event, or cudaStreamSynchronize
 * on both sides). Allocate outputs with na_empty (step arena) on the input's device.
 */
#define NA_FUNCTION_MAX_INPUTS 5  /* a graph node's inputs */
#define NA_FUNCTION_MAX_OUTPUTS 8
#define NA_FUNCTION_MAX_SAVED 8
/* .forward_dtype left out of the initializer (0, which is also NA_DTYPE_F64, never a cast
 * target): with .cast_inputs, f32. */
#define NA_FUNCTION_DTYPE_UNSET NA_DTYPE_F64

typedef struct na_function_ctx na_function_ctx;

/* Fills outputs[0..n_outputs) with new tensors (or views of inputs); returns NA_OK or a
 * negative status (with na_set_error; without, the message says which callback returned which
 * status). inputs[k] may be NULL when the caller passed NULL. */
typedef int (*na_function_forward)(na_function_ctx *ctx, na_tensor *const *inputs,
                                   na_tensor **outputs);
/* grad_outputs[j] has outputs[j]'s shape, dtype and device, and is never NULL: an output
 * that received no gradient (unused, or non-differentiable) gets zeros (NULL instead after
 * na_function_set_materialize_grads(ctx, false)). It may be strided (a view: the gradient of
 * a transpose or a broadcast): a raw loop over ->data calls na_contiguous first, or it reads
 * the wrong elements. Writes
 * grad_inputs[k] with inputs[k]'s shape, dtype and device, or leaves it NULL (no gradient;
 * always fine for an input that does not need one, see na_function_needs_input_grad).
 * Returns the number of gradients it produced, which must be n_inputs (NULL ones count), or
 * a negative status. Wrong count, shape, dtype or device fail na_backward with a message
 * naming the function and the input. */
typedef int (*na_function_backward)(na_function_ctx *ctx, na_tensor *const *grad_outputs,
                                    na_tensor **grad_inputs);

/* A function's definition: usually a static const (the graph keeps a pointer to it, and the
 * trace its name, until the step ends). */
typedef struct {
    const char *name; /* in messages and the amp trace */
    int n_inputs;     /* 0..NA_FUNCTION_MAX_INPUTS */
    int n_outputs;    /* 1..NA_FUNCTION_MAX_OUTPUTS */
    na_function_forward forward;
    na_function_backward backward; /* NULL: none; a gradient reaching it fails na_backward */
    bool cast_inputs;              /* false: run as called; true: run forward in forward_dtype */
    na_dtype forward_dtype;        /* with cast_inputs: f32 (also when unset), f16 or bf16; set
                                      without cast_inputs, na_function_apply refuses it */
} na_function;

/* Runs f on inputs (f->n_inputs of them, NULL entries allowed) and fills outputs
 * (f->n_outputs). The outputs require grad, and backward reaches f->backward, when grad
 * mode is on and some input requires grad (f without a backward then fails na_backward, as
 * PyTorch, when a gradient reaches it). `arg` is handed to forward
 * (na_function_arg), for parameters that are not tensors. Returns NA_OK or an error naming
 * the function (outputs are then NULL). */
int na_function_apply(const na_function *f, na_tensor *const *inputs, na_tensor **outputs,
                      void *arg);
/* The same for a function of one output: that output, or NULL with an error set. */
na_tensor *na_function_apply1(const na_function *f, na_tensor *const *inputs, void *arg);

/* ---- the context (forward and backward) ---- */
/* Forward only: keeps t (an input, an output or any tensor) for backward, in order. */
int na_function_save(na_function_ctx *ctx, na_tensor *t);
/* The k-th saved tensor (NULL with an error when there is none, or, in backward, when it was
 * written in place after forward returned: "modified by an inplace operation"). */
na_tensor *na_function_saved(const na_function_ctx *ctx, int k);
/* Plain values: a zeroed block of `size` bytes in the step arena, made at the first call;
 * later calls (forward or backward) return the same block. NULL with an error when `size`
 * exceeds the first call's. */
void *na_function_data(na_function_ctx *ctx, size_t size);
/* Forward only: the `arg` given to na_function_apply (backward must save what it needs). */
void *na_function_arg(const na_function_ctx *ctx);
/* Forward only: output k is not differentiable (an index, a mask): it never requires grad,
 * and backward receives zeros for it. Integer outputs are never differentiable. */
int na_function_mark_non_differentiable(na_function_ctx *ctx, int k);
/* Forward only: forward wrote input k in place (through ->data, or a raw kernel). Counts as
 * an in-place write (see "In-place writes" above): a node that saved the old values fails
 * backward instead of using the new ones. A leaf that requires grad cannot be written
 * (NA_ESTATE, as PyTorch). */
int na_function_mark_dirty(na_function_ctx *ctx, int k);
/* Forward only: false gives backward NULL (instead of zeros) for every output that received
 * no gradient (PyTorch's ctx.set_materialize_grads(False)); default true. */
int na_function_set_materialize_grads(na_function_ctx *ctx, bool materialize);
/* Whether input k needs a gradient: it requires grad and grad mode was on at the call. In
 * backward, a function may skip the gradients nobody needs. */
bool na_function_needs_input_grad(const na_function_ctx *ctx, int k);
const na_function *na_function_of(const na_function_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
