/* Convolution, pooling and batch normalization front-ends (NCHW). The kernels are the
 * backends' (im2col + GEMM on the CPU, cuDNN on CUDA); backward sits beside each forward. */
#include <inttypes.h>
#include <math.h>

#include "src/autograd/graph.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h"

static int or_default(int v, int d) { return v > 0 ? v : d; }

static na_conv_geom *geom_copy(const na_conv_geom *g) {
    na_conv_geom *c = na_arena_host_alloc(sizeof *c);
    if (c) *c = *g;
    return c;
}

/* ---- conv2d ------------------------------------------------------------------------------ */

na_tensor *na_conv2d(na_tensor *x, na_tensor *w, na_tensor *b, const na_conv2d_opts *opts) {
    const char *fn = "na_conv2d";
    char s1[NA_DESCRIBE_MAX], s2[NA_DESCRIBE_MAX];
    na_conv2d_opts o = opts ? *opts : (na_conv2d_opts){0};
    if (!na_check_float(fn, x, "input") || !na_check_float(fn, w, "weight") ||
        !na_check_same_device(fn, x, w) || (b && (!na_check_float(fn, b, "bias") ||
                                                  !na_check_same_device(fn, x, b))))
        return NULL;
    na_conv_geom g = {.kh = 0};
    g.groups = or_default(o.groups, 1);
    g.sh = or_default(o.stride[0], 1), g.sw = or_default(o.stride[1], 1);
    g.dh = or_default(o.dilation[0], 1), g.dw = or_default(o.dilation[1], 1);
    g.ph = o.padding[0], g.pw = o.padding[1];
    bool ok = x->ndim == 4 && w->ndim == 4 && g.ph >= 0 && g.pw >= 0 &&
              x->shape[1] % g.groups == 0 && w->shape[0] % g.groups == 0 &&
              w->shape[1] * g.groups == x->shape[1] &&
              (!b || (b->ndim == 1 && b->shape[0] == w->shape[0]));
    if (ok) {
        g.n = x->shape[0], g.c_in = x->shape[1], g.h = x->shape[2], g.w = x->shape[3];
        g.c_out = w->shape[0], g.kh = (int)w->shape[2], g.kw = (int)w->shape[3];
        g.oh = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
        g.ow = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
        ok = g.oh > 0 && g.ow > 0 && g.h + 2 * g.ph >= g.dh * (g.kh - 1) + 1 &&
             g.w + 2 * g.pw >= g.dw * (g.kw - 1) + 1;
    }
    if (!ok) {
        na_set_error(NA_ESHAPE, "%s: input %s and weight %s (groups %d, stride %dx%d, padding "
                     "%dx%d, dilation %dx%d) do not make a convolution: expected input [N, C, H, "
                     "W], weight [C_out, C/groups, kh, kw]%s and a window that fits", fn,
                     na_tensor_describe(x, s1, sizeof s1), na_tensor_describe(w, s2, sizeof s2),
                     g.groups, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, b ? ", bias [C_out]" : "");
        return NULL;
    }
    na_tensor *ins[3] = {x, w, b};
    if (na_autocast_inputs(NA_OP_CONV2D, ins, b ? 3 : 2) != NA_OK) return NULL;
    if (!na_check_same_dtype(fn, ins[0], ins[1]) || (b && !na_check_same_dtype(fn, ins[0], ins[2])))
        return NULL;
    x = na_contiguous(ins[0]), w = na_contiguous(ins[1]), b = b ? na_contiguous(ins[2]) : NULL;
    if (!x || !w || (ins[2] && !b)) return NULL;
    na_tensor *y = na_empty(x->dtype, x->device, NA_SHAPE(g.n, g.c_out, g.oh, g.ow));
    if (!y || na_be(x)->conv2d(&g, &x->view, &w->view, NA_VIEW_OF(b), &y->view) != NA_OK)
        return NULL;
    na_tensor *in[3] = {x, w, b};
    na_node *n = na_graph_record(NA_OP_CONV2D, y, 3, in);
    if (n && !(n->extra = geom_copy(&g))) return NULL;
    return y;
}

int na_bw_CONV2D(na_node *n, na_tensor *gout, na_tensor **gin) {
    const na_conv_geom *g = n->extra;
    na_tensor *x = n->inputs[0], *w = n->inputs[1], *gy = na_contiguous(gout);
    if (!gy) return na_last_status();
    const na_backend *be = na_be(x);
    int rc;
    if (na_node_needs_grad(n, 0)) {
        if (!(gin[0] = na_empty_like(x))) return na_last_status();
        if ((rc = be->conv2d_backward_data(g, &gy->view, &w->view, &gin[0]->view))) return rc;
    }
    if (na_node_needs_grad(n, 1)) {
        if (!(gin[1] = na_empty_like(w))) return na_last_status();
        if ((rc = be->conv2d_backward_weight(g, &x->view, &gy->view, &gin[1]->view))) return rc;
    }
    if (na_node_needs_grad(n, 2)) { /* gb = sum of gy over N, H, W */
        na_tensor *r = na_reshape(gy, 3, (const int64_t[]){g->n, g->c_out, -1});
        r = r ? na_sum_dim(r, 2, false) : NULL;
        if (!(gin[2] = r ? na_sum_dim(r, 0, false) : NULL)) return na_last_status();
    }
    return NA_OK;
}

/* ---- pooling ------------------------------------------------------------------------------- */

static bool pool_geometry(const char *fn, const na_tensor *x, const na_pool2d_opts *opts,
                          na_conv_geom *g) {
    char s[NA_DESCRIBE_MAX];
    na_pool2d_opts o = opts ? *opts : (na_pool2d_opts){0};
    *g = (na_conv_geom){.kh = o.kernel[0], .kw = o.kernel[1], .ph = o.padding[0],
                        .pw = o.padding[1], .dh = 1, .dw = 1, .groups = 1,
                        .count_include_pad = o.count_include_pad};
    g->sh = or_default(o.stride[0], g->kh), g->sw = or_default(o.stride[1], g->kw);
    bool ok = x->ndim == 4 && g->kh > 0 && g->kw > 0 && g->ph >= 0 && g->pw >= 0 &&
              2 * g->ph <= g->kh && 2 * g->pw <= g->kw;
    if (ok) {
        g->n = x->shape[0], g->c_in = g->c_out = x->shape[1], g->h = x->shape[2], g->w = x->shape[3];
        g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
        g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
        ok = g->h + 2 * g->ph >= g->kh && g->w + 2 * g->pw >= g->kw;
    }
    if (!ok)
        na_set_error(NA_ESHAPE, "%s: a %dx%d window (stride %dx%d, padding %dx%d) does not fit input "
                     "%s (expected [N, C, H, W], padding at most half the window)", fn, g->kh, g->kw,
                     g->sh, g->sw, g->ph, g->pw, na_tensor_describe(x, s, sizeof s));
    return ok;
}

static na_tensor *pool(const char *fn, na_op op, na_tensor *x, const na_pool2d_opts *opts) {
    na_conv_geom g;
    if (!na_check_float(fn, x, "input") || !pool_geometry(fn, x, opts, &g) ||
        !(x = na_contiguous(x)))
        return NULL;
    na_tensor *y = na_empty(x->dtype, x->device, NA_SHAPE(g.n, g.c_out, g.oh, g.ow));
    na_tensor *idx = op == NA_OP_MAX_POOL2D ? na_empty(NA_DTYPE_I32, x->device, y ? y->ndim : 0,
                                                       y ? y->shape : NULL) : NULL;
    if (!y || (op == NA_OP_MAX_POOL2D && !idx)) return NULL;
    const na_backend *be = na_be(x);
    int rc = op == NA_OP_MAX_POOL2D ? be->max_pool2d(&g, &x->view, &y->view, &idx->view)
                                    : be->avg_pool2d(&g, &x->view, &y->view);
    if (rc) return NULL;
    na_node *n = na_graph_record(op, y, 1, &x);
    if (n) {
        n->saved[0] = idx;
        if (!(n->extra = geom_copy(&g))) return NULL;
    }
    return y;
}

na_tensor *na_max_pool2d(na_tensor *x, const na_pool2d_opts *opts) {
    return pool("na_max_pool2d", NA_OP_MAX_POOL2D, x, opts);
}
na_tensor *na_avg_pool2d(na_tensor *x, const na_pool2d_opts *opts) {
    return pool("na_avg_pool2d", NA_OP_AVG_POOL2D, x, opts);
}

int na_bw_MAX_POOL2D(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *gy = na_contiguous(gout), *gx = gy ? na_empty_like(n->inputs[0]) : NULL;
    if (!gx) return na_last_status();
    gin[0] = gx;
    return na_be(gx)->max_pool2d_backward(n->extra, &gy->view, &n->saved[0]->view, &gx->view);
}

int na_bw_AVG_POOL2D(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *gy = na_contiguous(gout), *gx = gy ? na_empty_like(n->inputs[0]) : NULL;
    if (!gx) return na_last_status();
    gin[0] = gx;
    return na_be(gx)->avg_pool2d_backward(n->extra, &gy->view, &gx->view);
}

static na_tensor *global_pool(const char *fn, na_tensor *x, bool max) {
    char s[NA_DESCRIBE_MAX];
    if (!na_check_float(fn, x, "input")) return NULL;
    if (x->ndim != 4) {
        na_set_error(NA_ESHAPE, "%s: expected [N, C, H, W], got %s", fn, na_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    na_tensor *r = na_reshape(x, 3, (const int64_t[]){x->shape[0], x->shape[1], -1});
    return r ? (max ? na_max_dim(r, 2, false) : na_mean_dim(r, 2, false)) : NULL;
}
na_tensor *na_global_avg_pool2d(na_tensor *x) { return global_pool("na_global_avg_pool2d", x, false); }
na_tensor *na_global_max_pool2d(na_tensor *x) { return global_pool("na_global_max_pool2d", x, true); }

/* ---- batch norm ------------------------------------------------------------------------------ */

static bool check_param(const char *fn, const na_tensor *p, const char *what, na_dtype dt,
                        int64_t c, const na_tensor *x) {
    char s[NA_DESCRIBE_MAX];
    if (!p) return true;
    if (p->ndim != 1 || p->shape[0] != c || p->dtype != dt || p->device != x->device ||
        !na_is_contiguous(p)) {
        na_set_error(NA_ESHAPE, "%s: %s is %s, expected [%" PRId64 "] %s %s", fn, what,
                     na_tensor_describe(p, s, sizeof s), c, na_dtype_name(dt),
                     na_device_name(x->device));
        return false;
    }
    return true;
}

na_tensor *na_batch_norm(na_tensor *x, na_tensor *running_mean, na_tensor *running_var,
                         na_tensor *weight, na_tensor *bias, bool training, double momentum,
                         double eps) {
    const char *fn = "na_batch_norm";
    char s[NA_DESCRIBE_MAX];
    if (!na_check_float(fn, x, "input")) return NULL;
    if (x->ndim < 2 || x->ndim > 4) {
        na_set_error(NA_ESHAPE, "%s: expected [N, C], [N, C, L] or [N, C, H, W], got %s", fn,
                     na_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    int64_t nb = x->shape[0], c = x->shape[1], sp = x->numel / ((nb * c) != 0 ? nb * c : 1);
    na_dtype pdt = x->dtype == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    if (!check_param(fn, running_mean, "running_mean", pdt, c, x) ||
        !check_param(fn, running_var, "running_var", pdt, c, x) ||
        !check_param(fn, weight, "weight", pdt, c, x) || !check_param(fn, bias, "bias", pdt, c, x))
        return NULL;
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
    if (!(x = na_contiguous(x))) return NULL;
    const na_backend *be = na_be(x);
    na_tensor *y = na_empty_like(x);
    na_tensor *mean = na_empty(pdt, x->device, NA_SHAPE(c));
    na_tensor *invstd = na_empty(pdt, x->device, NA_SHAPE(c));
    if (!y || !mean || !invstd) return NULL;
    int rc = training ? be->batch_norm_train(&x->view, NA_VIEW_OF(weight), NA_VIEW_OF(bias),
                                             NA_VIEW_OF(running_mean), NA_VIEW_OF(running_var),
                                             &y->view, &mean->view, &invstd->view, nb, c, sp,
                                             momentum, eps)
                      : be->batch_norm_eval(&x->view, NA_VIEW_OF(weight), NA_VIEW_OF(bias),
                                            &running_mean->view, &running_var->view, &y->view,
                                            nb, c, sp, eps);
    if (rc) return NULL;
    na_tensor *in[3] = {x, weight, bias};
    na_node *n = na_graph_record(NA_OP_BATCH_NORM, y, 3, in);
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

int na_bw_BATCH_NORM(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *x = n->inputs[0], *w = n->inputs[1], *gy = na_contiguous(gout);
    if (!gy) return na_last_status();
    na_tensor *gx = na_node_needs_grad(n, 0) ? na_empty_like(x) : NULL;
    na_tensor *gw = na_node_needs_grad(n, 1) ? na_empty_like(w) : NULL;
    na_tensor *gb = na_node_needs_grad(n, 2) ? na_empty_like(n->inputs[2]) : NULL;
    if ((na_node_needs_grad(n, 0) && !gx) || (na_node_needs_grad(n, 1) && !gw) ||
        (na_node_needs_grad(n, 2) && !gb))
        return na_last_status();
    gin[0] = gx, gin[1] = gw, gin[2] = gb;
    if (!gx && !gw && !gb) return NA_OK;
    /* the kernel always computes gx; give it a scratch buffer when x needs none */
    if (!gx && !(gx = na_empty_like(x))) return na_last_status();
    return na_be(x)->batch_norm_backward(&x->view, &gy->view, NA_VIEW_OF(w), &n->saved[0]->view,
                                         &n->saved[1]->view, &gx->view, NA_VIEW_OF(gw),
                                         NA_VIEW_OF(gb), n->i[0], n->i[1], n->i[2],
                                         n->i[3] != 0);
}
