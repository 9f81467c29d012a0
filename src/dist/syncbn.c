/* SyncBatchNorm: a BatchNorm whose training-mode batch statistics are those of the whole
 * batch over all ranks.
 *
 * Written with differentiable ops around one custom function, "all-reduce SUM", whose
 * backward is an all-reduce SUM again (the sum over ranks is linear and its own adjoint). The
 * forward all-reduces each channel's sum and sum of squares; autograd then makes the backward
 * all-reduce the gradients of those two sums, which are exactly the two per-channel sums
 * (of dy and of dy * x) that PyTorch's SyncBatchNorm reduces. The sums are taken of x - K,
 * K the running mean (the same on every rank, near the batch mean), so that E[x^2] - E[x]^2
 * does not cancel catastrophically in f32; without running statistics K = 0. Statistics are
 * in f32 (f64 for f64 input), as na_batch_norm's. */
#include "src/dist/dist_internal.h"
#include "src/nn/module.h"

typedef struct {
    na_dist *d;
} sum_ctx;

static int reduce_copies(na_dist *d, na_tensor *const *in, na_tensor **out, int n) {
    for (int k = 0; k < n; k++) {
        if (!(out[k] = na_empty_like(in[k]))) return na_last_status();
        int rc = na_copy_(out[k], in[k]);
        if (!rc) rc = na_dist_all_reduce(d, out[k], NA_DIST_SUM);
        if (rc) return rc;
    }
    return NA_OK;
}

static int sum_forward(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    sum_ctx *s = na_function_data(c, sizeof *s);
    if (!s) return na_last_status();
    s->d = na_function_arg(c);
    return reduce_copies(s->d, in, out, 2);
}

static int sum_backward(na_function_ctx *c, na_tensor *const *gout, na_tensor **gin) {
    sum_ctx *s = na_function_data(c, sizeof *s);
    int rc = s ? reduce_copies(s->d, gout, gin, 2) : na_last_status();
    return rc ? rc : 2;
}

static const na_function all_reduce_sums = {.name = "sync_batch_norm_all_reduce", .n_inputs = 2,
                                            .n_outputs = 2, .forward = sum_forward,
                                            .backward = sum_backward};

/* [C] -> [1, C, 1] for broadcasting against x viewed as [N, C, S]. */
static na_tensor *per_channel(na_tensor *v) { return na_reshape(v, NA_SHAPE(1, -1, 1)); }

static na_tensor *sync_batch_norm(void *ctx, na_tensor *x, na_tensor *running_mean,
                                  na_tensor *running_var, na_tensor *weight, na_tensor *bias,
                                  bool training, double momentum, double eps) {
    const char *fn = "SyncBatchNorm";
    na_dist *d = ctx;
    if (!training || d->world == 1 || x->ndim < 2)
        return na_batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps);
    na_dtype pdt = x->dtype == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    int64_t c = x->shape[1], count[1] = {x->numel / (c ? c : 1)};
    if (na_dist_all_reduce_i64(d, count, 1, NA_DIST_SUM)) return NULL;
    if (count[0] <= 1) {
        na_set_error(NA_ESHAPE, "%s: expected more than 1 value per channel over all ranks", fn);
        return NULL;
    }
    double nt = (double)count[0];
    na_tensor *x3 = na_reshape(x->dtype == pdt ? x : na_cast(x, pdt), NA_SHAPE(x->shape[0], c, -1));
    na_tensor *shift = running_mean ? per_channel(running_mean) : na_zeros(pdt, x->device, NA_SHAPE(1, c, 1));
    na_tensor *xs = na_sub(x3, shift);
    na_tensor *local[2] = {na_sum_dim(na_sum_dim(xs, 2, false), 0, false),
                           na_sum_dim(na_sum_dim(na_mul(xs, xs), 2, false), 0, false)};
    if (!local[0] || !local[1]) return NULL;
    na_tensor *sums[2];
    if (na_function_apply(&all_reduce_sums, local, sums, d)) return NULL;
    na_tensor *mean_s = na_scale(sums[0], 1.0 / nt);               /* E[x - K] */
    na_tensor *var = na_sub(na_scale(sums[1], 1.0 / nt), na_mul(mean_s, mean_s)); /* biased */
    na_tensor *invstd = na_rsqrt(na_add_scalar(var, eps));
    na_tensor *y = na_mul(na_sub(xs, per_channel(mean_s)), per_channel(invstd));
    if (weight) y = na_add(na_mul(y, per_channel(weight)), per_channel(bias));
    y = na_reshape(y, x->ndim, x->shape);
    if (y && y->dtype != x->dtype) y = na_cast(y, x->dtype);
    if (!y) return NULL;
    if (running_mean) { /* as na_batch_norm: the unbiased variance, over the whole batch */
        na_no_grad_begin();
        na_tensor *mean = na_reshape(na_add(per_channel(mean_s), shift), NA_SHAPE(c));
        na_tensor *rm = na_add(na_scale(running_mean, 1.0 - momentum), na_scale(mean, momentum));
        na_tensor *rv = na_add(na_scale(running_var, 1.0 - momentum),
                               na_scale(var, momentum * nt / (nt - 1.0)));
        int rc = rm && rv ? na_copy_(running_mean, rm) : na_last_status();
        if (!rc) rc = na_copy_(running_var, rv);
        na_no_grad_end();
        if (rc) return NULL;
    }
    return y;
}

/* Every BatchNorm in the tree (pre-order, the same on every rank). */
static int set_impl(na_module *m, na_dist *d) {
    int rc = NA_OK;
    if (na_module_is_batch_norm(m, NULL))
        rc = na_batch_norm_set_impl(m, d ? sync_batch_norm : NULL, d);
    for (int i = 0; i < na_module_num_children(m) && !rc; i++)
        rc = set_impl(na_module_child_at(m, i, NULL), d);
    return rc;
}

int na_module_sync_batchnorm(na_module *net, na_dist *d) {
    if (!net) return na_set_error(NA_EINVAL, "na_module_sync_batchnorm: the module is NULL");
    return set_impl(net, d);
}
