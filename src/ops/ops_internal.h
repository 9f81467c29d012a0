/* Internals of the ops layer (src/ops): the op table's rows, recording an op, autocast, and
 * the helpers the front-ends share. */
#ifndef NANOAMP_SRC_OPS_INTERNAL_H
#define NANOAMP_SRC_OPS_INTERNAL_H

#include "kernels/backend.h"
#include "nanoamp/autocast.h"
#include "nanoamp/ops.h"
#include "src/autograd/graph.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h"

/* ---- the op table (op_table.c: NA_OP_MAP's columns) ------------------------------------- */

#define NA_UNARY_NONE NA_UNARY_COUNT /* the unary column of an op without a unary kernel */

typedef struct {
    na_graph_op graph;  /* id, name and backward: what a node keeps (NULL: no gradient) */
    na_amp_rule rule;   /* the default autocast rule */
    bool asks_autocast; /* the front-end calls na_autocast_inputs (false: FIXED) */
    bool accumulates;   /* its sums accumulate in f32 for f16/bf16 data */
    na_unary_op unary;  /* its backend unary kernel, NA_UNARY_NONE when it has none */
} na_op_def;

extern const na_op_def na_op_defs[NA_OP_COUNT];

/* Every op's backward, written right below its forward. */
#define NA_OP_BW_DECL_(id, ...) int na_bw_##id(na_node *n, na_tensor *gout, na_tensor **gin);
NA_OP_MAP(NA_OP_BW_DECL_)
#undef NA_OP_BW_DECL_

/* Records op's node (na_graph_record) with the backward its table row names. */
static inline na_node *na_op_record(na_op op, na_tensor *out, int n_inputs,
                                    na_tensor *const *inputs) {
    return na_graph_record(&na_op_defs[op].graph, out, n_inputs, inputs);
}

/* Input k's gradient as the sum of x's rows (x [rows, cols] -> [cols]: a bias's gradient),
 * written into the engine's n->grad_into[k] when it offered one (matmul.c). */
na_tensor *na_grad_sum_rows(const na_node *n, int k, na_tensor *x);

/* ---- autocast (autocast.c) and its trace (autocast_trace.c) ------------------------------ */

/* Autocast for one op call: replaces ins[k] by casts when an enabled region is open (and no
 * backward is running). Returns NA_OK or an error. */
int na_autocast_inputs(na_op op, na_tensor **ins, int n);

/* Custom functions (custom.c) are no rows of NA_OP_MAP: their graph op carries the user's
 * name and NA_OP_CUSTOM as its id; the nodes that route their outputs' gradients carry
 * NA_OP_PLUMBING, which the trace leaves out. */
#define NA_OP_CUSTOM ((na_op)NA_OP_COUNT)
#define NA_OP_PLUMBING (-1)

/* Autocast for a custom function's call (PyTorch's custom_fwd): in an enabled region, traces
 * the decision and, when `cast`, replaces each eligible input by its cast to target. */
int na_autocast_function_inputs(const char *name, bool cast, na_dtype target, na_tensor **ins,
                                int n);
/* Opens a region that holds while backward runs: a custom function's backward runs under the
 * autocast state its forward ran under (custom_bwd). Closed with na_autocast_end. */
int na_autocast_begin_backward(bool enabled, na_dtype dt);

/* The trace's half of an autocast decision: op's inputs as they came, the rule applied and
 * the dtype it computes in (NA_DTYPE_COUNT: no eligible input, the output's dtype tells). The
 * op's line is completed when its output is recorded. */
void na_autocast_trace_decision(na_op op, na_tensor *const *ins, int n, na_amp_rule rule,
                                na_dtype compute);
/* Forgets decisions whose op never completed (the outermost region begins or ends). */
void na_autocast_trace_forget(void);

/* ---- helpers shared by the front-ends ----------------------------------------------------- */

/* t broadcast (NumPy rules, aligned right) to `shape`, as a new contiguous tensor: a
 * stride-0 view copied out in one pass. The inverse of na_sum_to_shape. */
na_tensor *na_expand_to(na_tensor *t, int ndim, const int64_t *shape);

/* Reduce g (shape of a broadcast result) to `shape` by summing broadcast dims. */
na_tensor *na_sum_to_shape(na_tensor *g, int ndim, const int64_t *shape);

/* v when set (> 0), else the default d: zeroed option fields take the defaults. */
static inline int na_or_default(int v, int d) { return v > 0 ? v : d; }

/* A copy of a convolution / pooling geometry in the step arena (a node's extra block). */
static inline na_conv_geom *na_conv_geom_copy(const na_conv_geom *g) {
    na_conv_geom *c = na_arena_host_alloc(sizeof *c);
    if (c) *c = *g;
    return c;
}
#endif
