/* Graph nodes and the op table (internal).
 *
 * An op's front-end calls na_graph_record() after computing its output; when any input
 * requires grad (and grad mode is on) it gets a node in the step arena, fills the node's
 * saved tensors and scalars, and the op's backward (named in the op table) later turns the
 * output gradient into input gradients. */
#ifndef NANOAMP_SRC_GRAPH_H
#define NANOAMP_SRC_GRAPH_H

#include "nanoamp/autograd.h"
#include "nanoamp/ops.h"

#define NA_NODE_MAX_INPUTS 5
#define NA_NODE_MAX_SAVED 4

struct na_node {
    na_op op;
    int n_inputs;
    na_tensor *inputs[NA_NODE_MAX_INPUTS]; /* NULL entries allowed (optional inputs) */
    na_tensor *saved[NA_NODE_MAX_SAVED];   /* whatever the backward needs */
    double f[4];                           /* scalar parameters */
    int64_t i[8];                          /* integer parameters (dims, flags) */
    void *extra;                           /* op-specific block in the arena */
    na_tensor *out;
    unsigned visit; /* topological-sort mark */
};

/* gin[k] receives the gradient for inputs[k] (same shape and device, any float dtype: the
 * engine casts to the input's dtype); leave it NULL when !na_node_needs_grad(n, k). */
typedef int (*na_backward_fn)(na_node *n, na_tensor *gout, na_tensor **gin);

typedef struct {
    const char *name;
    na_amp_rule amp_rule;
    bool differentiable;
    na_backward_fn backward;
} na_op_def;

extern const na_op_def na_op_defs[NA_OP_COUNT];

/* Declared for every op in NA_OP_MAP; defined beside each op's forward. */
#define NA_OP_BW_DECL_(id, name, rule, diff) int na_bw_##id(na_node *n, na_tensor *gout, na_tensor **gin);
NA_OP_MAP(NA_OP_BW_DECL_)
#undef NA_OP_BW_DECL_

/* A node for `out` when grad mode is on and some input requires grad, else NULL (also NULL
 * with an error set if the arena is exhausted: check na_last_status() only when it matters). */
na_node *na_graph_record(na_op op, na_tensor *out, int n_inputs, na_tensor *const *inputs);

static inline bool na_node_needs_grad(const na_node *n, int k) {
    return n->inputs[k] && n->inputs[k]->requires_grad;
}
#endif
