/* Pooling front-ends ([N, C, H, W], contiguous or channels-last): max and average over a
 * window, and their global forms. Backward sits beside each forward. */
#include "src/ops/ops_internal.h"

/* ---- pooling ------------------------------------------------------------------------------- */

static bool pool_geometry(const char *fn, const na_tensor *x, const na_pool2d_opts *opts,
                          na_conv_geom *g) {
    char s[NA_DESCRIBE_MAX];
    na_pool2d_opts o = opts ? *opts : (na_pool2d_opts){0};
    *g = (na_conv_geom){.kh = o.kernel[0], .kw = o.kernel[1], .ph = o.padding[0],
                        .pw = o.padding[1], .dh = 1, .dw = 1, .groups = 1,
                        .count_include_pad = o.count_include_pad};
    g->sh = na_or_default(o.stride[0], g->kh), g->sw = na_or_default(o.stride[1], g->kw);
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
        !(x = na_dense(x)))
        return NULL;
    na_memory_format f = na_memory_format_of(x); /* y and idx keep x's */
    na_tensor *y = na_empty_format(x->dtype, x->device, NA_SHAPE(g.n, g.c_out, g.oh, g.ow), f);
    na_tensor *idx = y && op == NA_OP_MAX_POOL2D
                         ? na_empty_format(NA_DTYPE_I32, x->device, y->ndim, y->shape, f) : NULL;
    if (!y || (op == NA_OP_MAX_POOL2D && !idx)) return NULL;
    const na_backend *be = na_be(x);
    int rc = op == NA_OP_MAX_POOL2D ? be->max_pool2d(&g, &x->view, &y->view, &idx->view)
                                    : be->avg_pool2d(&g, &x->view, &y->view);
    if (rc) return NULL;
    na_node *n = na_op_record(op, y, 1, &x);
    if (n) {
        n->saved[0] = idx;
        if (!(n->extra = na_conv_geom_copy(&g))) return NULL;
    }
    return y;
}

na_tensor *na_max_pool2d(na_tensor *x, const na_pool2d_opts *opts) {
    return pool("na_max_pool2d", NA_OP_MAX_POOL2D, x, opts);
}
na_tensor *na_avg_pool2d(na_tensor *x, const na_pool2d_opts *opts) {
    return pool("na_avg_pool2d", NA_OP_AVG_POOL2D, x, opts);
}

/* gy in the forward's layout (y's, idx's and x's), gx in x's */
int na_bw_MAX_POOL2D(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *gy = na_as_format_of(gout, n->out);
    na_tensor *gx = gy ? na_empty_like_format(n->inputs[0]) : NULL;
    if (!gx) return na_last_status();
    gin[0] = gx;
    return na_be(gx)->max_pool2d_backward(n->extra, &gy->view, &n->saved[0]->view, &gx->view);
}

int na_bw_AVG_POOL2D(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *gy = na_as_format_of(gout, n->out);
    na_tensor *gx = gy ? na_empty_like_format(n->inputs[0]) : NULL;
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
