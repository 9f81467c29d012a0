/* Views, copies and casts: reshape, permute/transpose, slice, contiguous (also in a memory
 * format), pad, cast, to_device.
 * Each op's backward sits right after its forward. */
#include <inttypes.h>
#include <string.h>

#include "src/ops/ops_internal.h"

/* ---- reshape ------------------------------------------------------------------------ */

na_tensor *na_reshape(na_tensor *t, int ndim, const int64_t *shape) {
    const char *fn = "na_reshape";
    if (!na_check_tensor(fn, t, "input")) return NULL;
    if (ndim < 0 || ndim > NA_MAX_DIMS) {
        na_set_error(NA_ESHAPE, "%s: %d dims requested, at most %d supported", fn, ndim, NA_MAX_DIMS);
        return NULL;
    }
    int64_t s[NA_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1 && infer < 0) infer = i;
        else if (s[i] < 0) {
            na_set_error(NA_ESHAPE, "%s: invalid size %" PRId64 " at dim %d", fn, s[i], i);
            return NULL;
        } else known *= s[i];
    }
    if (infer >= 0) s[infer] = known ? t->numel / known : 0;
    if (na_shape_numel(ndim, s) != t->numel) {
        char b[NA_DESCRIBE_MAX];
        na_set_error(NA_ESHAPE, "%s: cannot view %s (%" PRId64 " elements) with %d dims of %" PRId64
                     " elements", fn, na_tensor_describe(t, b, sizeof b), t->numel, ndim,
                     na_shape_numel(ndim, s));
        return NULL;
    }
    na_tensor *src = na_is_contiguous(t) ? t : na_contiguous(t);
    if (!src) return NULL;
    na_tensor *out = na_tensor_view_header(src);
    if (!out) return NULL;
    out->ndim = ndim;
    memcpy(out->shape, s, sizeof(int64_t) * (size_t)ndim);
    na_set_contiguous_strides(out);
    na_op_record(NA_OP_RESHAPE, out, 1, &src);
    return out;
}

int na_bw_RESHAPE(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *x = n->inputs[0];
    return (gin[0] = na_reshape(gout, x->ndim, x->shape)) ? NA_OK : na_last_status();
}

na_tensor *na_flatten(na_tensor *t, int start_dim) {
    if (!na_check_tensor("na_flatten", t, "input")) return NULL;
    if (t->ndim == 0) return na_reshape(t, 1, (const int64_t[]){1});
    if (!na_check_dim("na_flatten", t, &start_dim)) return NULL;
    int64_t s[NA_MAX_DIMS];
    for (int i = 0; i < start_dim; i++) s[i] = t->shape[i];
    s[start_dim] = -1;
    return na_reshape(t, start_dim + 1, s);
}

na_tensor *na_expand_to(na_tensor *t, int ndim, const int64_t *shape) {
    char a[NA_DESCRIBE_MAX];
    na_tensor *v = t && ndim >= t->ndim ? na_tensor_view_header(t) : NULL;
    if (!v) {
        if (t) na_set_error(NA_ESHAPE, "na_expand_to: cannot expand %s to %d dims",
                            na_tensor_describe(t, a, sizeof a), ndim);
        return NULL;
    }
    int lead = ndim - t->ndim;
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t size = d >= lead ? t->shape[d - lead] : 1;
        if (size != 1 && size != shape[d]) {
            na_set_error(NA_ESHAPE, "na_expand_to: %s does not broadcast to dim %d of size %" PRId64,
                         na_tensor_describe(t, a, sizeof a), d, shape[d]);
            return NULL;
        }
        v->shape[d] = shape[d];
        v->stride[d] = size == 1 ? 0 : t->stride[d - lead];
    }
    v->numel = na_shape_numel(ndim, shape);
    na_tensor *out = na_empty(t->dtype, t->device, ndim, shape);
    return out && na_be(t)->copy(&out->view, &v->view) == NA_OK ? out : NULL;
}

/* ---- permute / transpose --------------------------------------------------------------- */

na_tensor *na_permute(na_tensor *t, const int *perm) {
    const char *fn = "na_permute";
    if (!na_check_tensor(fn, t, "input")) return NULL;
    bool seen[NA_MAX_DIMS] = {0};
    for (int i = 0; i < t->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= t->ndim || seen[perm[i]]) {
            na_set_error(NA_EINVAL, "%s: perm is not a permutation of %d dims (entry %d = %d)",
                         fn, t->ndim, i, perm[i]);
            return NULL;
        }
        seen[perm[i]] = true;
    }
    na_tensor *out = na_tensor_view_header(t);
    if (!out) return NULL;
    for (int i = 0; i < t->ndim; i++) {
        out->shape[i] = t->shape[perm[i]];
        out->stride[i] = t->stride[perm[i]];
    }
    na_node *n = na_op_record(NA_OP_PERMUTE, out, 1, &t);
    if (n)
        for (int i = 0; i < t->ndim; i++) n->i[i] = perm[i];
    return out;
}

int na_bw_PERMUTE(na_node *n, na_tensor *gout, na_tensor **gin) {
    int inv[NA_MAX_DIMS];
    for (int i = 0; i < gout->ndim; i++) inv[n->i[i]] = i;
    return (gin[0] = na_permute(gout, inv)) ? NA_OK : na_last_status();
}

na_tensor *na_transpose(na_tensor *t, int d0, int d1) {
    if (!na_check_tensor("na_transpose", t, "input") || !na_check_dim("na_transpose", t, &d0) ||
        !na_check_dim("na_transpose", t, &d1))
        return NULL;
    int perm[NA_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    return na_permute(t, perm);
}

/* ---- slice of the leading dim ----------------------------------------------------------- */

/* The elements [start, start + len) of t's dim, as a view (not recorded). */
static na_tensor *narrow_view(na_tensor *t, int dim, int64_t start, int64_t len) {
    na_tensor *v = na_tensor_view_header(t);
    if (!v) return NULL;
    v->shape[dim] = len;
    v->numel = na_shape_numel(v->ndim, v->shape);
    v->data = (char *)t->data + start * t->stride[dim] * (int64_t)na_dtype_size(t->dtype);
    return v;
}

na_tensor *na_slice(na_tensor *t, int64_t start, int64_t stop) {
    const char *fn = "na_slice";
    if (!na_check_tensor(fn, t, "input")) return NULL;
    if (t->ndim == 0 || start < 0 || stop > t->shape[0] || start > stop) {
        char b[NA_DESCRIBE_MAX];
        na_set_error(NA_EINVAL, "%s: rows [%" PRId64 ", %" PRId64 ") out of range for %s", fn,
                     start, stop, na_tensor_describe(t, b, sizeof b));
        return NULL;
    }
    na_tensor *out = narrow_view(t, 0, start, stop - start);
    if (!out) return NULL;
    na_node *n = na_op_record(NA_OP_SLICE, out, 1, &t);
    if (n) n->i[0] = start;
    return out;
}

int na_bw_SLICE(na_node *n, na_tensor *gout, na_tensor **gin) { /* zeros around gout's rows */
    int64_t after = n->inputs[0]->shape[0] - n->i[0] - gout->shape[0];
    return (gin[0] = na_pad_dim(gout, 0, n->i[0], after)) ? NA_OK : na_last_status();
}

/* ---- contiguous -------------------------------------------------------------------------- */

na_tensor *na_contiguous(na_tensor *t) {
    if (!na_check_tensor("na_contiguous", t, "input")) return NULL;
    if (na_is_contiguous(t)) return t;
    na_tensor *out = na_empty(t->dtype, t->device, t->ndim, t->shape);
    if (!out || na_be(t)->copy(&out->view, &t->view) != NA_OK) return NULL;
    na_op_record(NA_OP_CONTIGUOUS, out, 1, &t);
    return out;
}

int na_bw_CONTIGUOUS(na_node *n, na_tensor *gout, na_tensor **gin) {
    gin[0] = gout;
    return NA_OK;
}

/* ---- memory formats (src/tensor/memory_format.c has the layouts) ------------------------ */

na_tensor *na_contiguous_format(na_tensor *t, na_memory_format f) {
    const char *fn = "na_contiguous_format";
    char s[NA_DESCRIBE_MAX];
    if (!na_check_tensor(fn, t, "input")) return NULL;
    if (f == NA_FORMAT_CONTIGUOUS) return na_contiguous(t);
    if (f != NA_FORMAT_CHANNELS_LAST) {
        na_set_error(NA_EINVAL, "%s: unknown memory format %d", fn, (int)f);
        return NULL;
    }
    if (t->ndim != 4) {
        na_set_error(NA_ESHAPE, "%s: channels-last needs 4 dims [N, C, H, W], got %s", fn,
                     na_tensor_describe(t, s, sizeof s));
        return NULL;
    }
    if (na_is_channels_last(t)) return t;
    na_tensor *out = na_empty_format(t->dtype, t->device, 4, t->shape, f);
    if (!out || na_be(t)->copy(&out->view, &t->view) != NA_OK) return NULL;
    /* the same node as na_contiguous: the gradient passes through as it comes */
    na_op_record(NA_OP_CONTIGUOUS, out, 1, &t);
    return out;
}

na_tensor *na_to_channels_last(na_tensor *t) {
    return na_contiguous_format(t, NA_FORMAT_CHANNELS_LAST);
}

na_tensor *na_dense(na_tensor *t) {
    return na_is_contiguous(t) || na_is_channels_last(t) ? t : na_contiguous(t);
}

na_tensor *na_as_format_of(na_tensor *t, const na_tensor *like) {
    return na_contiguous_format(t, na_memory_format_of(like));
}

/* ---- pad --------------------------------------------------------------------------------- */

na_tensor *na_pad_dim(na_tensor *t, int dim, int64_t before, int64_t after) {
    const char *fn = "na_pad_dim";
    char s[NA_DESCRIBE_MAX];
    if (!na_check_tensor(fn, t, "input") || !na_check_dim(fn, t, &dim)) return NULL;
    if (before < 0 || after < 0) {
        na_set_error(NA_EINVAL, "%s: padding of dim %d of %s must be >= 0 (got %" PRId64
                     " before, %" PRId64 " after)", fn, dim, na_tensor_describe(t, s, sizeof s),
                     before, after);
        return NULL;
    }
    if (!(t = na_dense(t))) return NULL;
    int64_t shape[NA_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[dim] += before + after;
    na_tensor *out = na_empty_format(t->dtype, t->device, t->ndim, shape, na_memory_format_of(t));
    na_tensor *inner = out ? narrow_view(out, dim, before, t->shape[dim]) : NULL;
    const na_backend *be = na_be(t);
    if (!inner || be->fill(&out->view, 0.0) != NA_OK || be->copy(&inner->view, &t->view) != NA_OK)
        return NULL;
    na_node *n = na_op_record(NA_OP_PAD, out, 1, &t);
    if (n) n->i[0] = dim, n->i[1] = before;
    return out;
}

int na_bw_PAD(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *x = n->inputs[0];
    int dim = (int)n->i[0];
    na_tensor *part = narrow_view(gout, dim, n->i[1], x->shape[dim]);
    na_tensor *gx = part ? na_empty_like_format(x) : NULL;
    if (!gx || na_be(gx)->copy(&gx->view, &part->view) != NA_OK) return na_last_status();
    gin[0] = gx;
    return NA_OK;
}

/* ---- cast ------------------------------------------------------------------------------ */

na_tensor *na_cast(na_tensor *x, na_dtype dt) {
    const char *fn = "na_cast";
    if (!na_check_tensor(fn, x, "input")) return NULL;
    if ((unsigned)dt >= NA_DTYPE_COUNT) {
        na_set_error(NA_EDTYPE, "%s: unknown dtype %d", fn, (int)dt);
        return NULL;
    }
    if (dt == x->dtype) return x;
    /* a channels-last x gives a channels-last cast (autocast keeps a network's layout) */
    na_tensor *out = na_empty_format(dt, x->device, x->ndim, x->shape, na_memory_format_of(x));
    if (!out || na_be(x)->copy(&out->view, &x->view) != NA_OK) return NULL;
    if (na_dtype_is_float(x->dtype) && na_dtype_is_float(dt)) na_op_record(NA_OP_CAST, out, 1, &x);
    return out;
}

int na_bw_CAST(na_node *n, na_tensor *gout, na_tensor **gin) {
    /* an autocast weight's zeroed f32 gradient: the cast written there, not into a
     * weight-sized copy first (the MLP's f16 step spent 6% on that copy and its add) */
    na_tensor *into = n->grad_into[0];
    if (into) return na_copy_(into, gout) ? na_last_status() : (gin[0] = into, NA_OK);
    return (gin[0] = na_cast(gout, n->inputs[0]->dtype)) ? NA_OK : na_last_status();
}

/* ---- to_device ------------------------------------------------------------------------- */

na_tensor *na_to_device(const na_tensor *t, na_device dev) {
    if (!na_check_tensor("na_to_device", t, "input")) return NULL;
    na_tensor *out = na_empty(t->dtype, dev, t->ndim, t->shape);
    if (!out || na_copy_(out, t) != NA_OK) return NULL;
    if (na_dtype_is_float(t->dtype)) {
        na_tensor *in = (na_tensor *)t;
        na_op_record(NA_OP_TO_DEVICE, out, 1, &in);
    }
    return out;
}

int na_bw_TO_DEVICE(na_node *n, na_tensor *gout, na_tensor **gin) {
    return (gin[0] = na_to_device(gout, n->inputs[0]->device)) ? NA_OK : na_last_status();
}
