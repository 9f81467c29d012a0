/* Elementwise ops: binary with NumPy broadcasting, unary math and activations, dropout.
 * Each op's backward sits right after its forward; backward formulas reuse the forward ops
 * (grad mode is off while they run) so both backends share them. */
#include <inttypes.h>

#include "src/ops/ops_internal.h"

/* ---- broadcasting ---------------------------------------------------------------------- */

static bool broadcast_geometry(const char *fn, const na_tensor *a, const na_tensor *b,
                               na_broadcast *bc) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    bc->ndim = nd;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char x[NA_DESCRIBE_MAX], y[NA_DESCRIBE_MAX];
            na_set_error(NA_ESHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %" PRId64
                         " vs %" PRId64 ")", fn, na_tensor_describe(a, x, sizeof x),
                         na_tensor_describe(b, y, sizeof y), i, sa, sb);
            return false;
        }
        bc->shape[i] = sa > sb ? sa : sb;
        if (sa == 0 || sb == 0) bc->shape[i] = 0;
        bc->a_stride[i] = (ia >= 0 && sa != 1) ? a->stride[ia] : 0;
        bc->b_stride[i] = (ib >= 0 && sb != 1) ? b->stride[ib] : 0;
    }
    return true;
}

/* g (a contiguous result of broadcasting) summed down to `shape`. */
na_tensor *na_sum_to_shape(na_tensor *g, int ndim, const int64_t *shape) {
    int lead = g->ndim - ndim;
    na_tensor *r = g;
    for (int d = 0; d < g->ndim && r; d++) {
        int64_t target = d >= lead ? shape[d - lead] : 1;
        if (r->shape[d] != target) r = na_sum_dim(r, d, true);
    }
    return r ? na_reshape(r, ndim, shape) : NULL;
}

static na_tensor *binary(const char *fn, na_op op, na_binary_op bop, na_tensor *a, na_tensor *b) {
    if (!na_check_float(fn, a, "a") || !na_check_float(fn, b, "b") ||
        !na_check_same_device(fn, a, b))
        return NULL;
    na_tensor *ins[2] = {a, b};
    if (na_autocast_inputs(op, ins, 2) != NA_OK) return NULL;
    na_dtype dt = na_result_float(ins[0], ins[1]);
    a = na_cast(ins[0], dt);
    b = na_cast(ins[1], dt);
    na_broadcast bc;
    if (!a || !b || !broadcast_geometry(fn, a, b, &bc)) return NULL;
    na_tensor *out;
    if (na_same_dense_layout(a, b) && na_memory_format_of(a) != NA_FORMAT_CONTIGUOUS) {
        /* one shape, one non-C-order layout (channels-last): kept, the op runs on the memory */
        if (!(out = na_empty_like_format(a)) || na_binary_on_memory(bop, out, a, b) != NA_OK)
            return NULL;
    } else {
        out = na_empty(dt, a->device, bc.ndim, bc.shape);
        if (!out || na_be(out)->binary(bop, &a->view, &b->view, &out->view, &bc) != NA_OK)
            return NULL;
    }
    na_tensor *in[2] = {a, b};
    na_op_record(op, out, 2, in);
    return out;
}

na_tensor *na_add(na_tensor *a, na_tensor *b) { return binary("na_add", NA_OP_ADD, NA_BINARY_ADD, a, b); }
na_tensor *na_sub(na_tensor *a, na_tensor *b) { return binary("na_sub", NA_OP_SUB, NA_BINARY_SUB, a, b); }
na_tensor *na_mul(na_tensor *a, na_tensor *b) { return binary("na_mul", NA_OP_MUL, NA_BINARY_MUL, a, b); }
na_tensor *na_div(na_tensor *a, na_tensor *b) { return binary("na_div", NA_OP_DIV, NA_BINARY_DIV, a, b); }

/* Sets gin[k] = g summed to input k's shape, when input k needs a gradient. */
static int reduce_into(na_node *n, int k, na_tensor *g, na_tensor **gin) {
    if (!na_node_needs_grad(n, k)) return NA_OK;
    if (!g) return na_last_status();
    na_tensor *x = n->inputs[k];
    gin[k] = na_sum_to_shape(g, x->ndim, x->shape);
    return gin[k] ? NA_OK : na_last_status();
}

int na_bw_ADD(na_node *n, na_tensor *gout, na_tensor **gin) {
    int rc = reduce_into(n, 0, gout, gin);
    return rc ? rc : reduce_into(n, 1, gout, gin);
}

int na_bw_SUB(na_node *n, na_tensor *gout, na_tensor **gin) {
    int rc = reduce_into(n, 0, gout, gin);
    return rc ? rc : reduce_into(n, 1, na_node_needs_grad(n, 1) ? na_neg(gout) : NULL, gin);
}

int na_bw_MUL(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *a = n->inputs[0], *b = n->inputs[1];
    int rc = reduce_into(n, 0, na_node_needs_grad(n, 0) ? na_mul(gout, b) : NULL, gin);
    return rc ? rc : reduce_into(n, 1, na_node_needs_grad(n, 1) ? na_mul(gout, a) : NULL, gin);
}

int na_bw_DIV(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *b = n->inputs[1];
    na_tensor *g_over_b = na_div(gout, b); /* d(a/b)/da = 1/b */
    int rc = reduce_into(n, 0, g_over_b, gin);
    if (rc || !na_node_needs_grad(n, 1)) return rc;
    /* d(a/b)/db = -(a/b)/b */
    na_tensor *gb = g_over_b ? na_neg(na_mul(g_over_b, n->out)) : NULL;
    return reduce_into(n, 1, gb, gin);
}

/* ---- unary -------------------------------------------------------------------------- */

/* An op whose row in NA_OP_MAP names a backend unary kernel: y = f(x; a, b). */
static na_tensor *unary(const char *fn, na_op op, na_tensor *x, double a, double b) {
    na_unary_op uop = na_op_defs[op].unary;
    if (!na_check_float(fn, x, "input")) return NULL;
    na_tensor *ins[1] = {x};
    if (na_autocast_inputs(op, ins, 1) != NA_OK) return NULL;
    x = na_dense(ins[0]); /* either format: the kernel walks the memory */
    if (!x) return NULL;
    na_tensor *out = na_empty_like_format(x);
    if (!out || na_be(x)->unary(uop, &x->view, &out->view, a, b) != NA_OK) return NULL;
    na_node *n = na_op_record(op, out, 1, &x);
    if (n) {
        n->i[0] = uop;
        n->f[0] = a;
        n->f[1] = b;
    }
    return out;
}

static int unary_backward(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *x = n->inputs[0], *g = na_as_format_of(gout, x);
    na_tensor *gx = g ? na_empty_like_format(x) : NULL;
    if (!gx) return na_last_status();
    gin[0] = gx;
    return na_be(x)->unary_backward((na_unary_op)n->i[0], &x->view, &n->out->view, &g->view,
                                     &gx->view, n->f[0], n->f[1]);
}

/* The front-end na_<lower> of op ID and its backward; the kernel comes from the op table. */
#define NA_UNARY_OP_(lower, ID, args, a, b)                                                     \
    na_tensor *na_##lower args { return unary("na_" #lower, NA_OP_##ID, x, a, b); }            \
    int na_bw_##ID(na_node *n, na_tensor *gout, na_tensor **gin) {                             \
        return unary_backward(n, gout, gin);                                                   \
    }
NA_UNARY_OP_(neg, NEG, (na_tensor * x), 0, 0)
NA_UNARY_OP_(scale, SCALE, (na_tensor * x, double s), s, 0)
NA_UNARY_OP_(add_scalar, ADD_SCALAR, (na_tensor * x, double s), s, 0)
NA_UNARY_OP_(exp, EXP, (na_tensor * x), 0, 0)
NA_UNARY_OP_(log, LOG, (na_tensor * x), 0, 0)
NA_UNARY_OP_(sqrt, SQRT, (na_tensor * x), 0, 0)
NA_UNARY_OP_(rsqrt, RSQRT, (na_tensor * x), 0, 0)
NA_UNARY_OP_(pow, POW, (na_tensor * x, double p), p, 0)
NA_UNARY_OP_(abs, ABS, (na_tensor * x), 0, 0)
NA_UNARY_OP_(clamp, CLAMP, (na_tensor * x, double lo, double hi), lo, hi)
NA_UNARY_OP_(relu, RELU, (na_tensor * x), 0, 0)
NA_UNARY_OP_(gelu, GELU, (na_tensor * x), 0, 0)
NA_UNARY_OP_(sigmoid, SIGMOID, (na_tensor * x), 0, 0)
NA_UNARY_OP_(tanh, TANH, (na_tensor * x), 0, 0)
NA_UNARY_OP_(softplus, SOFTPLUS, (na_tensor * x), 0, 0)
#undef NA_UNARY_OP_

/* ---- dropout --------------------------------------------------------------------------- */

na_tensor *na_dropout(na_tensor *x, double p, bool training) {
    const char *fn = "na_dropout";
    if (!na_check_float(fn, x, "input")) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        na_set_error(NA_EINVAL, "%s: p must be in [0, 1], got %g", fn, p);
        return NULL;
    }
    if (!training || p == 0.0) return x;
    na_tensor *mask = na_empty(x->dtype, x->device, x->ndim, x->shape);
    if (!mask) return NULL;
    const na_backend *be = na_be(x);
    if (be->dropout_mask(&mask->view, p, na_rng_seed(), na_rng_reserve((uint64_t)x->numel)))
        return NULL;
    na_broadcast bc;
    if (!broadcast_geometry(fn, x, mask, &bc)) return NULL;
    na_tensor *out = na_empty_like(mask);
    if (!out || be->binary(NA_BINARY_MUL, &x->view, &mask->view, &out->view, &bc) != NA_OK)
        return NULL;
    na_node *n = na_op_record(NA_OP_DROPOUT, out, 1, &x);
    if (n) n->saved[0] = mask;
    return out;
}

int na_bw_DROPOUT(na_node *n, na_tensor *gout, na_tensor **gin) {
    return (gin[0] = na_mul(gout, n->saved[0])) ? NA_OK : na_last_status();
}
