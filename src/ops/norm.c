/* Batch normalization front-end over dim 1 (f32 statistics and parameters for f16/bf16 data).
 * Backward sits beside the forward. */
#include <inttypes.h>

#include "src/ops/ops_internal.h"

/* ---- batch norm ------------------------------------------------------------------------------ */

static bool check_param(const char *fn, const na_tensor *p, const char *what, na_dtype dt,
                        int64_t c, const na_tensor *x) {
    char s[NA_DESCRIBE_MAX];
    if (!p) return true;
    if (!na_check_tensor(fn, p, what)) return false;
    if (p->ndim != 1 || p->shape[0] != c || p->dtype != dt || p->device != x->device ||
        !na_is_contiguous(p)) {
        na_set_error(NA_ESHAPE, "%s: %s is %s, expected [%" PRId64 "] %s %s", fn, what,
                     na_tensor_describe(p, s, sizeof s), c, na_dtype_name(dt),
                     na_device_name(x->device));
        return false;
    }
    return true;
}

/* na_batch_norm, and with relu na_batch_norm_relu: relu(bn(x)) in one kernel pass, whose
 * backward reads the node's output (the post-ReLU y) for ReLU's mask, so no pre-ReLU tensor
 * is ever made or kept. sum, sqsum (training only; else NULL): x's sums per channel, which
 * give the batch statistics (batch_norm_finalize) that batch_norm_eval then normalizes with. */
static na_tensor *batch_norm(const char *fn, na_op op, bool relu, na_tensor *x,
                             const na_tensor *sum, const na_tensor *sqsum,
                             na_tensor *running_mean, na_tensor *running_var, na_tensor *weight,
                             na_tensor *bias, bool training, double momentum, double eps) {
    char s[NA_DESCRIBE_MAX];
    if (!na_check_float(fn, x, "input")) return NULL;
    if (x->ndim < 2 || x->ndim > 4) {
        na_set_error(NA_ESHAPE, "%s: expected [N, C], [N, C, L] or [N, C, H, W], got %s", fn,
                     na_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    int64_t nb = x->shape[0], c = x->shape[1], sp = x->numel / ((nb * c) != 0 ? nb * c : 1);
    if (na_memory_format_of(x) == NA_FORMAT_CHANNELS_LAST) /* memory [N*H*W, C]: BatchNorm1d's */
        nb *= sp, sp = 1;
    na_dtype pdt = x->dtype == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    if (!check_param(fn, running_mean, "running_mean", pdt, c, x) ||
        !check_param(fn, running_var, "running_var", pdt, c, x) ||
        !check_param(fn, weight, "weight", pdt, c, x) || !check_param(fn, bias, "bias", pdt, c, x) ||
        !check_param(fn, sum, "sum", pdt, c, x) || !check_param(fn, sqsum, "sqsum", pdt, c, x))
        return NULL;
    if (!sum != !sqsum) {
        na_set_error(NA_EINVAL, "%s: give both sum and sqsum, or neither", fn);
        return NULL;
    }
    if (!training && (!running_mean || !running_var)) {
        na_set_error(NA_EINVAL, "%s: eval mode needs running statistics", fn);
        return NULL;
    }
    if (!running_mean != !running_var) { /* kernels update both when running_mean is given */
        na_set_error(NA_EINVAL, "%s: give both running_mean and running_var, or neither", fn);
        return NULL;
    }
    if (training && nb * sp <= 1) {
        na_set_error(NA_ESHAPE, "%s: expected more than 1 value per channel when training, got "
                     "input %s", fn, na_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    if (!(eps > 0) || !(momentum >= 0 && momentum <= 1)) {
        na_set_error(NA_EINVAL, "%s: eps must be > 0 and momentum in [0, 1] (got %g, %g)", fn, eps,
                     momentum);
        return NULL;
    }
    if (!(x = na_dense(x))) return NULL; /* a copy is contiguous: [N, C, S] as computed */
    const na_backend *be = na_be(x);
    na_tensor *y = na_empty_like_format(x);
    na_tensor *mean = na_empty(pdt, x->device, NA_SHAPE(c));
    na_tensor *invstd = na_empty(pdt, x->device, NA_SHAPE(c));
    if (!y || !mean || !invstd) return NULL;
    int rc;
    if (sum) { /* the statistics from the sums, then the same normalization as eval's */
        na_tensor *var = na_empty(pdt, x->device, NA_SHAPE(c));
        if (!var) return NULL;
        rc = be->batch_norm_finalize(&sum->view, &sqsum->view, nb * sp, NA_VIEW_OF(running_mean),
                                     NA_VIEW_OF(running_var), &mean->view, &var->view,
                                     &invstd->view, c, momentum, eps);
        if (!rc)
            rc = be->batch_norm_eval(&x->view, NA_VIEW_OF(weight), NA_VIEW_OF(bias), &mean->view,
                                     &var->view, &y->view, nb, c, sp, eps, relu);
    } else if (training) {
        rc = be->batch_norm_train(&x->view, NA_VIEW_OF(weight), NA_VIEW_OF(bias),
                                  NA_VIEW_OF(running_mean), NA_VIEW_OF(running_var), &y->view,
                                  &mean->view, &invstd->view, nb, c, sp, momentum, eps, relu);
    } else {
        rc = be->batch_norm_eval(&x->view, NA_VIEW_OF(weight), NA_VIEW_OF(bias),
                                 &running_mean->view, &running_var->view, &y->view, nb, c, sp,
                                 eps, relu);
    }
    if (rc) return NULL;
    na_tensor *in[3] = {x, weight, bias};
    na_node *n = na_op_record(op, y, 3, in);
    if (n && !training) { /* backward in eval: the running statistics play the batch's role */
        na_no_grad_begin();
        na_tensor *v = na_rsqrt(na_add_scalar(running_var, eps));
        na_no_grad_end();
        if (!v || be->copy(&invstd->view, &v->view) != NA_OK ||
            be->copy(&mean->view, &running_mean->view) != NA_OK) return NULL;
    }
    if (n) {
        n->saved[0] = mean;
        n->saved[1] = invstd;
        n->i[0] = nb, n->i[1] = c, n->i[2] = sp, n->i[3] = training;
    }
    return y;
}

na_tensor *na_batch_norm(na_tensor *x, na_tensor *running_mean, na_tensor *running_var,
                         na_tensor *weight, na_tensor *bias, bool training, double momentum,
                         double eps) {
    return batch_norm("na_batch_norm", NA_OP_BATCH_NORM, false, x, NULL, NULL, running_mean,
                      running_var, weight, bias, training, momentum, eps);
}

na_tensor *na_batch_norm_relu(na_tensor *x, na_tensor *running_mean, na_tensor *running_var,
                              na_tensor *weight, na_tensor *bias, bool training, double momentum,
                              double eps) {
    return batch_norm("na_batch_norm_relu", NA_OP_BATCH_NORM_RELU, true, x, NULL, NULL,
                      running_mean, running_var, weight, bias, training, momentum, eps);
}

na_tensor *na_batch_norm_sums(na_tensor *x, const na_tensor *sum, const na_tensor *sqsum,
                              na_tensor *running_mean, na_tensor *running_var, na_tensor *weight,
                              na_tensor *bias, double momentum, double eps, bool relu) {
    return batch_norm("na_batch_norm_sums", relu ? NA_OP_BATCH_NORM_RELU : NA_OP_BATCH_NORM,
                      relu, x, sum, sqsum, running_mean, running_var, weight, bias, true,
                      momentum, eps);
}

/* relu_y: the forward's output when ReLU was fused in, else NULL */
static int batch_norm_backward(na_node *n, na_tensor *gout, na_tensor **gin,
                               const na_tensor *relu_y) {
    na_tensor *x = n->inputs[0], *w = n->inputs[1], *gy = na_as_format_of(gout, x);
    if (!gy) return na_last_status();
    na_tensor *gx = na_node_needs_grad(n, 0) ? na_empty_like_format(x) : NULL;
    na_tensor *gw = na_node_needs_grad(n, 1) ? na_empty_like(w) : NULL;
    na_tensor *gb = na_node_needs_grad(n, 2) ? na_empty_like(n->inputs[2]) : NULL;
    if ((na_node_needs_grad(n, 0) && !gx) || (na_node_needs_grad(n, 1) && !gw) ||
        (na_node_needs_grad(n, 2) && !gb))
        return na_last_status();
    gin[0] = gx, gin[1] = gw, gin[2] = gb;
    if (!gx && !gw && !gb) return NA_OK;
    /* the kernel always computes gx; give it a scratch buffer when x needs none */
    if (!gx && !(gx = na_empty_like_format(x))) return na_last_status();
    return na_be(x)->batch_norm_backward(&x->view, &gy->view, NA_VIEW_OF(w), &n->saved[0]->view,
                                         &n->saved[1]->view, &gx->view, NA_VIEW_OF(gw),
                                         NA_VIEW_OF(gb), n->i[0], n->i[1], n->i[2],
                                         n->i[3] != 0, NA_VIEW_OF(relu_y));
}

int na_bw_BATCH_NORM(na_node *n, na_tensor *gout, na_tensor **gin) {
    return batch_norm_backward(n, gout, gin, NULL);
}

int na_bw_BATCH_NORM_RELU(na_node *n, na_tensor *gout, na_tensor **gin) {
    return batch_norm_backward(n, gout, gin, n->out);
}
