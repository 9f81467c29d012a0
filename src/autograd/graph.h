/* Graph nodes and the recorder (internal).
 *
 * An op's front-end calls na_graph_record() after computing its output, naming the op by a
 * na_graph_op: its name and its backward. When any input requires grad (and grad mode is on)
 * the op gets a node in the step arena that keeps that backward, the front-end fills the
 * node's saved tensors and scalars, and na_backward later calls the backward to turn the
 * output gradient into input gradients. The engine knows nothing of the ops above it: a node
 * carries everything its backward needs. */
#ifndef NANOAMP_SRC_GRAPH_H
#define NANOAMP_SRC_GRAPH_H

#include "nanoamp/autograd.h"
#include "src/tensor/tensor_internal.h" /* na_empty_like_format */

#define NA_NODE_MAX_INPUTS 5
#define NA_NODE_MAX_SAVED 4

/* gin[k] receives the gradient for inputs[k] (same shape and device, any float dtype: the
 * engine converts to the input's dtype); leave it NULL when !na_node_needs_grad(n, k).
 * Where n->grad_into[k] is set, the backward may write input k's whole gradient there
 * instead of into a tensor of its own, and says so with gin[k] = n->grad_into[k]. */
typedef int (*na_backward_fn)(na_node *n, na_tensor *gout, na_tensor **gin);

/* An op as the recorder sees it (one static instance per op, in the ops layer's table). */
typedef struct {
    int id;                  /* the ops layer's na_op: handed to the observer, never read here */
    const char *name;        /* for messages ("backward of linear failed: ...") */
    na_backward_fn backward; /* NULL: the op has no gradient and records no node */
    bool keeps_gout;         /* the backward keeps gout for a later node (the engine then
                                leaves its memory alone until the step ends) */
    unsigned reads;          /* whose values the backward reads: bit k input k, NA_READS_OUT
                                the output; na_backward refuses the node when one of them
                                was written in place since the op ran (version counters) */
} na_graph_op;

#define NA_READS_OUT (1u << NA_NODE_MAX_INPUTS)

struct na_node {
    const na_graph_op *op;
    int n_inputs;
    na_tensor *inputs[NA_NODE_MAX_INPUTS]; /* NULL entries allowed (optional inputs) */
    na_tensor *saved[NA_NODE_MAX_SAVED];   /* tensors the op made for its backward and gave
                                              nobody else (a mask, indices, statistics): the
                                              engine frees them after this node's backward */
    double f[4];                           /* scalar parameters */
    int64_t i[8];                          /* integer parameters (dims, flags) */
    void *extra;                           /* op-specific block in the arena */
    /* Set by the engine just before the backward runs: for an input that is a leaf whose
     * .grad zero_grad marked (it reads as zeros; same shape, dtype and device as the input;
     * contiguous), that .grad, so that an op which computes the gradient whole (a GEMM with
     * beta 0, cuDNN's weight gradient) writes it in place: no temporary, no fill, no add.
     * NULL elsewhere, and for every input but the first where one leaf is input twice. */
    na_tensor *grad_into[NA_NODE_MAX_INPUTS];
    /* Tensors the backward reads besides inputs, saved and out (a custom function's saved
     * tensors, perhaps its own outputs): references the pass counts, so it gives none of them
     * back before this node has run; being kept here never makes a tensor freeable. */
    na_tensor *const *kept;
    int n_kept;
    uint32_t versions[NA_NODE_MAX_INPUTS + 1]; /* inputs' and out's versions when recorded */
    na_tensor *out;
    bool out_internal; /* out is unreachable from user code (na_graph_mark_internal) */
    bool walked;       /* its backward ran in a pass that did not retain: used up */
    unsigned visit; /* topological-sort mark */
    int layer;      /* the profiler's layer of the forward (0: none; src/autograd/profile.h) */
};

/* A node for `out` when op has a backward, grad mode is on and some input requires grad, else
 * NULL (also NULL with an error set if the arena is exhausted: check na_last_status() only
 * when it matters). The observer, if any, sees every call first. */
na_node *na_graph_record(const na_graph_op *op, na_tensor *out, int n_inputs,
                         na_tensor *const *inputs);

/* Whoever wants to watch ops as they run (the amp trace, a profiler) registers an observer:
 * na_graph_record calls it for every op, recorded or not, once the op's output exists.
 * One observer per process; returns the one it replaces (NULL: none). */
typedef void (*na_graph_observer)(const na_graph_op *op, const na_tensor *out, int n_inputs,
                                  na_tensor *const *inputs);
na_graph_observer na_graph_set_observer(na_graph_observer fn);

/* Whoever watches the backward pass (the amp trace's backward rows, src/amp/backward_trace.c)
 * registers a backward observer: na_backward calls fn(NULL, NULL) as a pass begins, then
 * fn(op, gout) for each node that receives a gradient, in the order the nodes run, just before
 * its backward (gout: the gradient of the node's output). A non-zero return stops the
 * backward with that status. One per process (fn NULL: none); returns the one it replaces. */
typedef int (*na_graph_backward_observer)(const na_graph_op *op, const na_tensor *gout);
na_graph_backward_observer na_graph_set_backward_observer(na_graph_backward_observer fn);

/* Whoever acts on gradients while backward still runs (the DDP wrapper starts a bucket's
 * all-reduce) registers a leaf hook: na_backward calls fn(leaf, ctx) once per leaf that
 * requires grad, as soon as its .grad is final for this backward (every node that consumes it
 * has run), in an order fixed by the graph's shape alone (last consumer first, then input
 * position), so every process running the same graph sees the same sequence. A non-zero
 * return stops the backward with that status. One hook per process (fn NULL: none); returns
 * the one it replaces. Without a hook the engine does no extra work. */
typedef struct {
    int (*fn)(na_tensor *leaf, void *ctx);
    void *ctx;
} na_graph_leaf_hook;
na_graph_leaf_hook na_graph_set_leaf_hook(na_graph_leaf_hook hook);

/* Says that t, an op's output, is handed to nothing but later ops of the graph (a
 * Sequential's output of one child, passed to the next): once the nodes that use it have run
 * backward, na_backward gives its memory back. Only a tensor that owns its memory and was made
 * by a recorded op is marked; anything else is left alone. na_graph_unmark_internal(t) undoes
 * it for t's memory (a container's result that is a view of an internal tensor). */
void na_graph_mark_internal(na_tensor *t);
void na_graph_unmark_internal(na_tensor *t);

/* The error for a value a backward reads that was written in place after `op` saved it
 * (`place`: "input 1", "the output", "saved tensor 0"): PyTorch's words, NA_ESTATE. */
int na_graph_version_error(const char *fn, const na_tensor *t, const char *place,
                           const char *op, uint32_t expected);

/* True on this thread while na_backward runs backward functions: the ops they call compute
 * in the forward's dtypes (autocast reads this and stays out). */
bool na_graph_in_backward(void);

static inline bool na_node_needs_grad(const na_node *n, int k) {
    return n->inputs[k] && n->inputs[k]->requires_grad;
}
/* Where a backward that computes input k's gradient whole writes it: the engine's
 * grad_into[k] when it offered one (the backward then sets gin[k] to it), else a new step
 * tensor shaped and formatted as `like` (a channels-last weight gets a channels-last
 * gradient; the engine offers grad_into only in the input's own format). */
static inline na_tensor *na_node_grad_buffer(const na_node *n, int k, const na_tensor *like) {
    return n->grad_into[k] ? n->grad_into[k] : na_empty_like_format(like);
}
#endif
