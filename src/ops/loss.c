/* Softmax, log-softmax and the losses: fused cross-entropy (log-softmax + NLL with label
 * smoothing) and MSE. All compute in f32 (f64 for f64); autocast casts their inputs to f32. */
#include <inttypes.h>
#include <stdlib.h>

#include "src/ops/ops_internal.h"

/* ---- softmax / log-softmax ------------------------------------------------------------- */

static na_tensor *softmax(const char *fn, na_op op, na_tensor *x, bool log) {
    if (!na_check_float(fn, x, "input")) return NULL;
    if (x->ndim == 0) {
        na_set_error(NA_ESHAPE, "%s: needs at least one dim", fn);
        return NULL;
    }
    na_tensor *ins[1] = {x};
    if (na_autocast_inputs(op, ins, 1) != NA_OK || !(x = na_contiguous(ins[0]))) return NULL;
    int64_t cols = x->shape[x->ndim - 1], rows = cols ? x->numel / cols : 0;
    na_tensor *y = na_empty_like(x);
    if (!y || na_be(x)->softmax(&x->view, &y->view, rows, cols, log) != NA_OK) return NULL;
    na_node *n = na_op_record(op, y, 1, &x);
    if (n) n->i[0] = rows, n->i[1] = cols;
    return y;
}

na_tensor *na_softmax(na_tensor *x) { return softmax("na_softmax", NA_OP_SOFTMAX, x, false); }
na_tensor *na_log_softmax(na_tensor *x) {
    return softmax("na_log_softmax", NA_OP_LOG_SOFTMAX, x, true);
}

static int softmax_backward(na_node *n, na_tensor *gout, na_tensor **gin, bool log) {
    na_tensor *g = na_contiguous(gout), *gx = g ? na_empty_like(n->inputs[0]) : NULL;
    if (!gx) return na_last_status();
    gin[0] = gx;
    return na_be(gx)->softmax_backward(&n->out->view, &g->view, &gx->view, n->i[0], n->i[1], log);
}
int na_bw_SOFTMAX(na_node *n, na_tensor *gout, na_tensor **gin) {
    return softmax_backward(n, gout, gin, false);
}
int na_bw_LOG_SOFTMAX(na_node *n, na_tensor *gout, na_tensor **gin) {
    return softmax_backward(n, gout, gin, true);
}

/* ---- reduction of a per-element loss ---------------------------------------------------- */

static na_tensor *reduce_loss(na_tensor *per, na_reduction r) {
    switch (r) {
    case NA_REDUCTION_MEAN: return na_mean(per);
    case NA_REDUCTION_SUM: return na_sum(per);
    default: return per;
    }
}

/* The per-element gradient of a reduced loss: gout broadcast to `like` (scaled by 1/numel for
 * a mean), in dtype dt. */
static na_tensor *loss_grad(na_tensor *gout, na_reduction r, const na_tensor *like, na_dtype dt) {
    na_tensor *g = na_cast(gout, dt);
    if (g && r != NA_REDUCTION_NONE) g = na_expand_to(g, like->ndim, like->shape);
    if (g && r == NA_REDUCTION_MEAN) g = na_scale(g, 1.0 / (double)(like->numel ? like->numel : 1));
    return g ? na_contiguous(g) : NULL;
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

static bool check_labels(const char *fn, const na_tensor *labels, int64_t classes) {
    if (labels->device != NA_DEVICE_CPU) return true; /* checked on the device: NaN loss */
    const int32_t *l = labels->data;
    for (int64_t i = 0; i < labels->numel; i++) {
        if (l[i] < 0 || l[i] >= classes) {
            na_set_error(NA_EINVAL, "%s: label %" PRId32 " at index %" PRId64 " is out of range "
                         "[0, %" PRId64 ")", fn, l[i], i, classes);
            return false;
        }
    }
    return true;
}

na_tensor *na_cross_entropy(na_tensor *logits, na_tensor *labels,
                            const na_cross_entropy_opts *opts) {
    const char *fn = "na_cross_entropy";
    char s1[NA_DESCRIBE_MAX], s2[NA_DESCRIBE_MAX];
    na_cross_entropy_opts o = opts ? *opts : (na_cross_entropy_opts){0};
    if (!na_check_float(fn, logits, "logits") || !na_check_tensor(fn, labels, "labels") ||
        !na_check_same_device(fn, logits, labels))
        return NULL;
    if (logits->ndim != 2 || labels->dtype != NA_DTYPE_I32 || labels->ndim != 1 ||
        labels->shape[0] != logits->shape[0]) {
        na_set_error(NA_ESHAPE, "%s: expected logits [N, C] and i32 labels [N]; got logits %s, "
                     "labels %s", fn, na_tensor_describe(logits, s1, sizeof s1),
                     na_tensor_describe(labels, s2, sizeof s2));
        return NULL;
    }
    if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0) ||
        (unsigned)o.reduction > NA_REDUCTION_NONE) {
        na_set_error(NA_EINVAL, "%s: label_smoothing must be in [0, 1] (got %g) and reduction "
                     "mean, sum or none", fn, o.label_smoothing);
        return NULL;
    }
    na_tensor *ins[1] = {logits};
    if (na_autocast_inputs(NA_OP_CROSS_ENTROPY, ins, 1) != NA_OK) return NULL;
    na_tensor *x = na_contiguous(ins[0]), *lab = na_contiguous(labels);
    if (!x || !lab || !check_labels(fn, lab, x->shape[1])) return NULL;
    na_dtype acc = x->dtype == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    int64_t n_rows = x->shape[0];
    na_tensor *per = na_empty(acc, x->device, NA_SHAPE(n_rows));
    na_tensor *lse = na_empty(acc, x->device, NA_SHAPE(n_rows));
    if (!per || !lse) return NULL;
    if (na_be(x)->cross_entropy(&x->view, &lab->view, &per->view, &lse->view,
                                o.label_smoothing) != NA_OK) return NULL;
    bool prev = na_grad_enabled();
    if (prev) na_no_grad_begin(); /* the reduction is part of this op's node */
    na_tensor *out = reduce_loss(per, o.reduction);
    if (prev) na_no_grad_end();
    if (!out) return NULL;
    na_tensor *in[2] = {x, lab};
    na_node *n = na_op_record(NA_OP_CROSS_ENTROPY, out, 2, in);
    if (n) {
        n->saved[0] = lse;
        n->saved[1] = per;
        n->i[0] = o.reduction;
        n->f[0] = o.label_smoothing;
    }
    return out;
}

int na_bw_CROSS_ENTROPY(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *x = n->inputs[0], *lse = n->saved[0];
    na_tensor *g = loss_grad(gout, (na_reduction)n->i[0], n->saved[1], lse->dtype);
    na_tensor *gx = g ? na_empty_like(x) : NULL;
    if (!gx) return na_last_status();
    gin[0] = gx;
    return na_be(x)->cross_entropy_backward(&x->view, &n->inputs[1]->view, &lse->view, &g->view,
                                             &gx->view, n->f[0]);
}

/* ---- MSE -------------------------------------------------------------------------------- */

na_tensor *na_mse_loss(na_tensor *a, na_tensor *b, na_reduction reduction) {
    const char *fn = "na_mse_loss";
    char s1[NA_DESCRIBE_MAX], s2[NA_DESCRIBE_MAX];
    if (!na_check_float(fn, a, "input") || !na_check_float(fn, b, "target") ||
        !na_check_same_device(fn, a, b))
        return NULL;
    if (!na_same_shape(a, b)) {
        na_set_error(NA_ESHAPE, "%s: input %s and target %s must have the same shape", fn,
                     na_tensor_describe(a, s1, sizeof s1), na_tensor_describe(b, s2, sizeof s2));
        return NULL;
    }
    if ((unsigned)reduction > NA_REDUCTION_NONE) {
        na_set_error(NA_EINVAL, "%s: unknown reduction %d (mean, sum or none)", fn, (int)reduction);
        return NULL;
    }
    na_tensor *ins[2] = {a, b};
    if (na_autocast_inputs(NA_OP_MSE_LOSS, ins, 2) != NA_OK) return NULL;
    na_dtype dt = na_promote_float(ins[0]->dtype, ins[1]->dtype);
    bool prev = na_grad_enabled();
    if (prev) na_no_grad_begin();
    na_tensor *x = na_cast(ins[0], dt), *y = na_cast(ins[1], dt);
    na_tensor *d = (x && y) ? na_sub(x, y) : NULL;
    na_tensor *out = d ? reduce_loss(na_mul(d, d), reduction) : NULL;
    if (prev) na_no_grad_end();
    if (!out) return NULL;
    na_tensor *in[2] = {ins[0], ins[1]};
    na_node *n = na_op_record(NA_OP_MSE_LOSS, out, 2, in);
    if (n) {
        n->saved[0] = d;
        n->i[0] = reduction;
    }
    return out;
}

int na_bw_MSE_LOSS(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *d = n->saved[0];
    na_tensor *g = loss_grad(gout, (na_reduction)n->i[0], d, d->dtype);
    na_tensor *ga = g ? na_mul(na_scale(d, 2.0), g) : NULL; /* d/da (a-b)^2 = 2(a-b) */
    if (!ga) return na_last_status();
    if (na_node_needs_grad(n, 0)) gin[0] = ga;
    if (na_node_needs_grad(n, 1) && !(gin[1] = na_neg(ga))) return na_last_status();
    return NA_OK;
}
