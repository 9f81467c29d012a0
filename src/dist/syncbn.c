/* SyncBatchNorm: a BatchNorm whose training-mode batch statistics are those of the whole
 * batch over all ranks (PyTorch's SyncBatchNorm, the same two reductions).
 *
 * One custom function over the backend's BatchNorm kernels, with the ReLU after it fused in
 * when the module is (na_module_fuse_bn_relu), so that its passes over x are plain
 * BatchNorm+ReLU's: two for the statistics and one for y forward, one for the sums and one for
 * gx backward (the first version composed some twenty differentiable ops: its BatchNorm
 * layers took 97 of a 160 ms CNN step, 27 of them in collectives; the second made one forward
 * and two backward passes more and ran the ReLU on its own, 2.8x plain BatchNorm's time).
 * Per channel, n_r values on rank r, N on all:
 *   forward   batch_norm_train without y (eps 0: its invstd gives the variance back) -> this
 *             rank's mean and biased variance (Welford, two passes); one all-gather of every
 *             rank's [mean; var; count]; the global mean and variance by Chan's combination,
 *             mean = sum(n_r mean_r) / N, var = sum(n_r (var_r + (mean_r - mean)^2)) / N, in
 *             which nothing cancels (PyTorch gathers the same three); batch_norm_eval with
 *             them (and the ReLU) writes y.
 *   backward  batch_norm_backward without gx: this rank's sum(gy), sum(gy * xhat) (gy times
 *             relu'(y) when fused: y is saved, the next layer keeps it anyway), which are the
 *             weight and bias gradients (DDP averages them); one all-reduce of the two sums;
 *             batch_norm_backward_elemt with the global sums and N writes gx. Fused with the
 *             ReLU, where the backend has batch_norm_relu_backward_x (CPU, f32/f64/f16 x),
 *             both passes are that kernel instead, which recomputes relu'(y) from x (the
 *             forward's y, from the saved global variance and beta, bit for bit): each pass
 *             then reads x and gy, not y, the passes being split by the all-reduce so that
 *             every operand comes from memory twice (perf: the gx pass reading y took 1.9x
 *             plain BatchNorm's, whose second pass finds the channel in the cache).
 * Statistics in f32 (f64 for f64 x), as na_batch_norm's. */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "src/dist/dist_internal.h"
#include "src/nn/module.h"
#include "src/tensor/tensor_internal.h"

/* On CUDA the one-pass kernels (batch_norm_train without y, batch_norm_backward_elemt) are
 * new and have not run on a GPU yet: NANOAMP_CUDA_SYNCBN_ELEMT=1 takes them; until a GPU run
 * shows their parity (scripts/gpu-check), CUDA keeps the earlier composition, a y it throws
 * away forward and gx as the eval-mode gradient plus a correction made of batch_norm_eval
 * (two more passes) backward. The CPU takes the one-pass kernels (the composition too under
 * the test hook na_syncbn_composed_on_cpu, so that it is tested here). */
bool na_syncbn_composed_on_cpu = false;

static bool one_pass(const na_tensor *x) {
    if (x->device != NA_DEVICE_CUDA) return !na_syncbn_composed_on_cpu;
    const char *e = getenv("NANOAMP_CUDA_SYNCBN_ELEMT");
    return e && !strcmp(e, "1");
}

typedef struct {
    na_dist *d;
    na_tensor *running_mean, *running_var; /* may be NULL */
    double momentum, eps;
    bool relu; /* BatchNorm + ReLU */
} sbn_args;

typedef struct {
    na_dist *d;
    int64_t nb, c, sp; /* x as the kernels see it: [nb, c, sp] ([N*H*W, C, 1] channels-last) */
    int64_t count;     /* values per channel over all ranks */
    bool affine;       /* the weight was saved (after x, mean, invstd) */
    bool relu;         /* the output, the variance and the bias were saved (after them) */
    bool bias;         /* with relu: the bias was saved (last) */
    double eps;
} sbn_ctx;

/* A copy of t (the step arena). */
static na_tensor *copy_of(const na_tensor *t) {
    na_tensor *r = na_empty_like(t);
    return r && !na_copy_(r, t) ? r : NULL;
}

/* [2C] in pdt as its two halves [C]. */
static int halves(na_tensor *t, int64_t c, na_tensor **a, na_tensor **b) {
    *a = na_slice(t, 0, c);
    *b = na_slice(t, c, 2 * c);
    return *a && *b ? NA_OK : na_last_status();
}

static int sbn_forward(na_function_ctx *fc, na_tensor *const *in, na_tensor **out) {
    const sbn_args *a = na_function_arg(fc);
    sbn_ctx *s = na_function_data(fc, sizeof *s);
    na_tensor *x = in[0] ? na_dense(in[0]) : NULL, *w = in[1], *b = in[2];
    if (!s || !x) return na_last_status();
    int64_t c = x->shape[1], nb = x->shape[0], sp = x->numel / (nb * c != 0 ? nb * c : 1);
    if (na_memory_format_of(x) == NA_FORMAT_CHANNELS_LAST) nb *= sp, sp = 1;
    *s = (sbn_ctx){.d = a->d, .nb = nb, .c = c, .sp = sp, .count = nb * sp,
                   .affine = w != NULL, .relu = a->relu, .bias = b != NULL, .eps = a->eps};
    int rc = na_dist_all_reduce_i64(a->d, &s->count, 1, NA_DIST_SUM);
    if (rc) return rc;
    if (s->count <= 1)
        return na_set_error(NA_ESHAPE, "SyncBatchNorm: expected more than 1 value per channel "
                            "over all ranks, got %lld", (long long)s->count);
    na_dtype pdt = x->dtype == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    const na_backend *be = na_be(x);
    int world = na_dist_world_size(a->d);
    /* this rank's [mean; var; count] per channel, and every rank's: [world, 3, C] */
    na_tensor *mine = na_empty(pdt, x->device, NA_SHAPE(3, c));
    na_tensor *all = na_empty(pdt, x->device, NA_SHAPE(world, 3, c));
    na_tensor *istd = na_empty(pdt, x->device, NA_SHAPE(c)), *row[3];
    for (int k = 0; k < 3 && mine; k++) row[k] = na_reshape(na_slice(mine, k, k + 1), NA_SHAPE(c));
    if (!all || !istd || !mine || !row[0] || !row[1] || !row[2]) return na_last_status();
    bool composed = !one_pass(x);
    na_tensor *unused = composed ? na_empty_like_format(x) : NULL; /* y, thrown away */
    if (composed && !unused) return na_last_status();
    rc = be->batch_norm_train(&x->view, NULL, NULL, NULL, NULL, NA_VIEW_OF(unused),
                              &row[0]->view, &istd->view, nb, c, sp, 0.0, 0.0, false);
    na_tensor_free(unused);
    if (rc) return rc;
    double n = (double)s->count;
    rc = na_copy_(row[1], na_div(na_full(pdt, x->device, NA_SHAPE(c), 1.0), na_mul(istd, istd)));
    if (!rc) rc = na_fill_(row[2], (double)(nb * sp));
    if (!rc) rc = na_dist_all_gather(a->d, mine, all);
    if (rc) return rc;
    /* Chan's combination: every term a sum of positives, nothing cancels */
    na_tensor *planes = na_contiguous(na_transpose(all, 0, 1)), *rk[3]; /* [3, world, C] */
    for (int k = 0; k < 3 && planes; k++)
        rk[k] = na_reshape(na_slice(planes, k, k + 1), NA_SHAPE(world, c));
    if (!planes || !rk[0] || !rk[1] || !rk[2]) return na_last_status();
    na_tensor *gmean = na_scale(na_sum_dim(na_mul(rk[2], rk[0]), 0, false), 1.0 / n);
    na_tensor *dm = na_sub(rk[0], gmean);
    na_tensor *gvar = na_scale(na_sum_dim(na_mul(rk[2], na_add(rk[1], na_mul(dm, dm))), 0, false),
                               1.0 / n); /* biased */
    na_tensor *ginv = na_rsqrt(na_add_scalar(gvar, a->eps));
    na_tensor *y = na_empty_like_format(x);
    if (!gvar || !gmean || !ginv || !y) return na_last_status();
    /* the same y in memory order where the backend can (CPU: f32, f16, bf16 on AVX2 without
     * AVX-512) */
    bool in_rows = false;
    if (be->batch_norm_eval_rows &&
        (rc = be->batch_norm_eval_rows(&x->view, NA_VIEW_OF(w), NA_VIEW_OF(b), &gmean->view,
                                       &gvar->view, &y->view, nb, c, sp, a->eps, a->relu,
                                       &in_rows)))
        return rc;
    if (!in_rows && (rc = be->batch_norm_eval(&x->view, NA_VIEW_OF(w), NA_VIEW_OF(b),
                                              &gmean->view, &gvar->view, &y->view, nb, c, sp,
                                              a->eps, a->relu)))
        return rc;
    if (a->running_mean) { /* as na_batch_norm: the unbiased variance, over the whole batch */
        double mo = a->momentum;
        na_tensor *rm = na_add(na_scale(a->running_mean, 1.0 - mo), na_scale(gmean, mo));
        na_tensor *rv = na_add(na_scale(a->running_var, 1.0 - mo),
                               na_scale(gvar, mo * n / (n - 1.0)));
        rc = rm && rv ? na_copy_(a->running_mean, rm) : na_last_status();
        if (!rc) rc = na_copy_(a->running_var, rv);
        if (rc) return rc;
    }
    out[0] = y;
    if ((rc = na_function_save(fc, x)) || (rc = na_function_save(fc, gmean)) ||
        (rc = na_function_save(fc, ginv)) || (w && (rc = na_function_save(fc, w))) ||
        (a->relu && ((rc = na_function_save(fc, y)) || (rc = na_function_save(fc, gvar)) ||
                     (b && (rc = na_function_save(fc, b))))))
        return rc;
    return NA_OK;
}

static int sbn_backward(na_function_ctx *fc, na_tensor *const *gout, na_tensor **gin) {
    sbn_ctx *s = na_function_data(fc, sizeof *s);
    if (!s) return na_last_status();
    na_tensor *x = na_function_saved(fc, 0), *mean = na_function_saved(fc, 1);
    na_tensor *istd = na_function_saved(fc, 2);
    na_tensor *w = s->affine ? na_function_saved(fc, 3) : NULL;
    na_tensor *y = s->relu ? na_function_saved(fc, 3 + s->affine) : NULL;
    na_tensor *fvar = s->relu ? na_function_saved(fc, 4 + s->affine) : NULL;
    na_tensor *b = s->relu && s->bias ? na_function_saved(fc, 5 + s->affine) : NULL;
    na_tensor *gy = x ? na_as_format_of(gout[0], x) : NULL;
    if (!gy || !mean || !istd || (s->affine && !w) || (s->relu && (!y || !fvar)) ||
        (s->relu && s->bias && !b))
        return na_last_status();
    int64_t c = s->c;
    const na_backend *be = na_be(x);
    na_tensor *sums = na_empty(mean->dtype, x->device, NA_SHAPE(2 * c)), *sxh, *sg;
    if (!sums || halves(sums, c, &sxh, &sg)) return na_last_status();
    /* the earlier CUDA composition: the eval-mode gradient now, the correction below */
    bool composed = !one_pass(x);
    na_tensor *gx = composed ? na_empty_like_format(x) : NULL;
    if (composed && !gx) return na_last_status();
    /* fused with the ReLU: where the backend can, relu'(y) is recomputed from x (the
     * forward's y = relu((x - mean) * invstd(var) * gamma + beta), bit for bit), so that
     * neither pass reads y; else the kernels read y */
    bool from_x = false;
    int rc = NA_OK;
    if (y && !composed && be->batch_norm_relu_backward_x)
        rc = be->batch_norm_relu_backward_x(&x->view, &gy->view, NA_VIEW_OF(w), NA_VIEW_OF(b),
                                            &mean->view, &fvar->view, s->eps, &istd->view, NULL,
                                            NULL, 0, NULL, &sxh->view, &sg->view, s->nb, c,
                                            s->sp, &from_x);
    if (!rc && !from_x)
        rc = be->batch_norm_backward(&x->view, &gy->view, NA_VIEW_OF(w), &mean->view,
                                     &istd->view, NA_VIEW_OF(gx), &sxh->view, &sg->view, s->nb,
                                     c, s->sp, false, NA_VIEW_OF(y));
    if (rc) return rc;
    /* this rank's sums are the parameters' gradients: copied before the all-reduce */
    gin[1] = na_function_needs_input_grad(fc, 1) ? copy_of(sxh) : NULL;
    gin[2] = na_function_needs_input_grad(fc, 2) ? copy_of(sg) : NULL;
    if ((na_function_needs_input_grad(fc, 1) && !gin[1]) ||
        (na_function_needs_input_grad(fc, 2) && !gin[2]))
        return na_last_status();
    if ((rc = na_dist_all_reduce(s->d, sums, NA_DIST_SUM))) return rc;
    if (!na_function_needs_input_grad(fc, 0)) return 3;
    if (gx) { /* gx -= invstd * gamma * (sum(gy) + xhat * sum(gy * xhat)) / N, as batch_norm_eval
               * of x with scale -invstd*gamma*sum(gy*xhat)/N, shift -invstd*gamma*sum(gy)/N and
               * the variance 1/invstd^2 (eps 0) */
        na_tensor *f = na_scale(w ? na_mul(istd, w) : istd, -1.0 / (double)s->count);
        na_tensor *scale = f ? na_mul(f, sxh) : NULL, *shift = f ? na_mul(f, sg) : NULL;
        na_tensor *var = na_div(na_full(istd->dtype, x->device, NA_SHAPE(c), 1.0),
                                na_mul(istd, istd));
        na_tensor *t = scale && shift && var ? na_empty_like_format(x) : NULL;
        if (!t) return na_last_status();
        if ((rc = be->batch_norm_eval(&x->view, &scale->view, &shift->view, &mean->view,
                                      &var->view, &t->view, s->nb, c, s->sp, 0.0, false)))
            return rc;
        return (gin[0] = na_add(gx, t)) ? 3 : na_last_status();
    }
    if (!(gin[0] = na_empty_like_format(x))) return na_last_status();
    if (from_x) {
        bool done = false;
        rc = be->batch_norm_relu_backward_x(&x->view, &gy->view, NA_VIEW_OF(w), NA_VIEW_OF(b),
                                            &mean->view, &fvar->view, s->eps, &istd->view,
                                            &sg->view, &sxh->view, s->count, &gin[0]->view,
                                            NULL, NULL, s->nb, c, s->sp, &done);
        if (!rc && !done)
            rc = na_set_error(NA_ESTATE, "SyncBatchNorm: batch_norm_relu_backward_x took "
                              "the sums but not gx");
        return rc ? rc : 3;
    }
    rc = be->batch_norm_backward_elemt(&x->view, &gy->view, NA_VIEW_OF(w), &mean->view,
                                       &istd->view, &sg->view, &sxh->view, s->count,
                                       &gin[0]->view, s->nb, c, s->sp, NA_VIEW_OF(y));
    return rc ? rc : 3;
}

static const na_function sync_batch_norm_fn = {.name = "sync_batch_norm", .n_inputs = 3,
                                               .n_outputs = 1, .forward = sbn_forward,
                                               .backward = sbn_backward};

static na_tensor *sync_batch_norm(void *ctx, na_tensor *x, na_tensor *running_mean,
                                  na_tensor *running_var, na_tensor *weight, na_tensor *bias,
                                  bool training, double momentum, double eps, bool relu) {
    na_dist *d = ctx;
    if (!training || !na_dist_collectives(d) || x->ndim < 2 || x->ndim > 4)
        return (relu ? na_batch_norm_relu : na_batch_norm)(x, running_mean, running_var, weight,
                                                           bias, training, momentum, eps);
    sbn_args a = {d, running_mean, running_var, momentum, eps, relu};
    na_tensor *in[3] = {x, weight, bias};
    return na_function_apply1(&sync_batch_norm_fn, in, &a);
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
