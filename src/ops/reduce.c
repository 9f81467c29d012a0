/* Reductions: sum, mean, max (over everything or one dim) and argmax. They accumulate in f32
 * (f64 for f64) whatever the storage dtype; under autocast sum and mean return f32. */
#include <limits.h>

#include "src/ops/ops_internal.h"

/* The reduced shape: `dim` removed (or kept as 1); dim < 0 means every dim (0-dim result). */
static int reduced_shape(const na_tensor *x, int dim, bool keepdim, int64_t *shape) {
    if (dim < 0) return 0;
    int nd = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i != dim) shape[nd++] = x->shape[i];
        else if (keepdim) shape[nd++] = 1;
    }
    return nd;
}

#define ALL_DIMS INT_MIN /* reduce over every dim */

static na_tensor *reduce(const char *fn, na_op op, na_reduce_op rop, na_tensor *x, int dim,
                         bool keepdim) {
    if (!na_check_float(fn, x, "input")) return NULL;
    if (dim == ALL_DIMS) dim = -1;
    else if (!na_check_dim(fn, x, &dim)) return NULL;
    na_tensor *ins[1] = {x};
    if (na_autocast_inputs(op, ins, 1) != NA_OK || !(x = na_contiguous(ins[0]))) return NULL;
    int64_t outer = 1, r = x->numel, inner = 1, shape[NA_MAX_DIMS];
    if (dim >= 0) na_split_dims(x, dim, &outer, &r, &inner);
    if (r == 0 && rop != NA_REDUCE_SUM) {
        na_set_error(NA_EINVAL, "%s: cannot reduce over an empty dimension", fn);
        return NULL;
    }
    int nd = reduced_shape(x, dim, keepdim, shape);
    na_tensor *out = na_empty(x->dtype, x->device, nd, shape);
    na_tensor *idx = rop == NA_REDUCE_MAX ? na_empty(NA_DTYPE_I32, x->device, nd, shape) : NULL;
    if (!out || (rop == NA_REDUCE_MAX && !idx)) return NULL;
    if (na_be(x)->reduce(rop, &x->view, &out->view, NA_VIEW_OF(idx), outer, r, inner) != NA_OK)
        return NULL;
    na_node *n = na_op_record(op, out, 1, &x);
    if (n) {
        n->i[0] = outer;
        n->i[1] = r;
        n->i[2] = inner;
        n->saved[0] = idx;
    }
    return out;
}

na_tensor *na_sum(na_tensor *x) { return reduce("na_sum", NA_OP_SUM, NA_REDUCE_SUM, x, ALL_DIMS, false); }
na_tensor *na_sum_dim(na_tensor *x, int dim, bool keepdim) {
    return reduce("na_sum_dim", NA_OP_SUM, NA_REDUCE_SUM, x, dim, keepdim);
}
na_tensor *na_mean(na_tensor *x) { return reduce("na_mean", NA_OP_MEAN, NA_REDUCE_MEAN, x, ALL_DIMS, false); }
na_tensor *na_mean_dim(na_tensor *x, int dim, bool keepdim) {
    return reduce("na_mean_dim", NA_OP_MEAN, NA_REDUCE_MEAN, x, dim, keepdim);
}
na_tensor *na_max(na_tensor *x) { return reduce("na_max", NA_OP_MAX, NA_REDUCE_MAX, x, ALL_DIMS, false); }
na_tensor *na_max_dim(na_tensor *x, int dim, bool keepdim) {
    return reduce("na_max_dim", NA_OP_MAX, NA_REDUCE_MAX, x, dim, keepdim);
}

/* gout broadcast back over the reduced dim(s): the input's shape with r folded to 1 */
static na_tensor *expand_back(na_node *n, na_tensor *gout) {
    na_tensor *x = n->inputs[0];
    int64_t kept[3] = {n->i[0], 1, n->i[2]}, full[3] = {n->i[0], n->i[1], n->i[2]};
    na_tensor *g = na_reshape(gout, 3, kept);
    g = g ? na_expand_to(g, 3, full) : NULL;
    return g ? na_reshape(g, x->ndim, x->shape) : NULL;
}

int na_bw_SUM(na_node *n, na_tensor *gout, na_tensor **gin) {
    return (gin[0] = expand_back(n, gout)) ? NA_OK : na_last_status();
}

int na_bw_MEAN(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *g = expand_back(n, gout);
    return (gin[0] = g ? na_scale(g, 1.0 / (double)n->i[1]) : NULL) ? NA_OK : na_last_status();
}

int na_bw_MAX(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *x = n->inputs[0], *g = na_contiguous(gout);
    na_tensor *gx = g ? na_empty(g->dtype, x->device, x->ndim, x->shape) : NULL;
    if (!gx) return na_last_status();
    gin[0] = gx;
    return na_be(x)->scatter_max_grad(&g->view, &n->saved[0]->view, &gx->view, n->i[0], n->i[1],
                                         n->i[2]);
}

na_tensor *na_argmax(na_tensor *x, int dim, bool keepdim) {
    const char *fn = "na_argmax";
    if (!na_check_float(fn, x, "input") || !na_check_dim(fn, x, &dim) || !(x = na_contiguous(x)))
        return NULL;
    int64_t outer, r, inner, shape[NA_MAX_DIMS];
    na_split_dims(x, dim, &outer, &r, &inner);
    if (r == 0) {
        na_set_error(NA_EINVAL, "%s: cannot take argmax over an empty dimension", fn);
        return NULL;
    }
    int nd = reduced_shape(x, dim, keepdim, shape);
    na_tensor *idx = na_empty(NA_DTYPE_I32, x->device, nd, shape);
    if (!idx || na_be(x)->argmax(&x->view, &idx->view, outer, r, inner) != NA_OK) return NULL;
    return idx; /* integer output: never part of the graph */
}

int na_bw_ARGMAX(na_node *n, na_tensor *gout, na_tensor **gin) {
    return na_set_error(NA_ESTATE, "argmax has no gradient");
}
