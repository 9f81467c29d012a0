/* Matrix products: matmul (2-d and batched) and linear (x @ w^T + b with the bias fused).
 * Transposed views are passed to the GEMM as transpose flags, never copied. */
#include <inttypes.h>

#include "src/ops/ops_internal.h"

/* How the last two dims of t are stored: row-major (trans=false, ld = row stride) or as the
 * transpose of a row-major matrix (trans=true). Anything else needs a contiguous copy. */
static bool matrix_layout(const na_tensor *t, bool *trans, int64_t *ld) {
    int nd = t->ndim;
    int64_t rows = t->shape[nd - 2], cols = t->shape[nd - 1];
    int64_t sr = t->stride[nd - 2], sc = t->stride[nd - 1];
    if ((sc == 1 || cols == 1) && sr >= (cols > 1 ? cols : 1)) {
        *trans = false;
        *ld = sr;
        return true;
    }
    if ((sr == 1 || rows == 1) && sc >= (rows > 1 ? rows : 1)) {
        *trans = true;
        *ld = sc;
        return true;
    }
    return false;
}

/* Batch dims must be contiguous among themselves: stride of one batch entry. */
static bool batch_stride(const na_tensor *t, int64_t *stride) {
    int nd = t->ndim;
    if (nd == 2) {
        *stride = 0;
        return true;
    }
    int64_t s = t->stride[nd - 3];
    for (int i = nd - 4; i >= 0; i--)
        if (t->shape[i + 1] != 1 && t->stride[i] != t->stride[i + 1] * t->shape[i + 1]) return false;
    /* a matrix of the batch must not overlap the next one */
    *stride = s;
    return true;
}

static na_tensor *gemm_operand(na_tensor *t, bool *trans, int64_t *ld, int64_t *bstride) {
    if (matrix_layout(t, trans, ld) && batch_stride(t, bstride)) return t;
    na_tensor *c = na_contiguous(t);
    if (!c) return NULL;
    matrix_layout(c, trans, ld);
    batch_stride(c, bstride);
    return c;
}

/* out = a @ b (out NULL: a new step tensor), shaped `shape` (nb batch dims, then m, n): the
 * GEMM of na_matmul, for operands it checked. *a and *b become the operands the GEMM read
 * (contiguous copies where their layout needed one). */
static na_tensor *gemm_into(na_tensor **a, na_tensor **b, na_tensor *out, int nb,
                            const int64_t *shape) {
    int64_t m = shape[nb], n = shape[nb + 1];
    na_gemm_args g = {.dtype = (*a)->dtype, .m = m, .n = n, .k = (*a)->shape[(*a)->ndim - 1],
                      .alpha = 1.0f, .beta = 0.0f};
    *a = gemm_operand(*a, &g.ta, &g.lda, &g.stride_a);
    *b = gemm_operand(*b, &g.tb, &g.ldb, &g.stride_b);
    if (!*a || !*b || (!out && !(out = na_empty((*a)->dtype, (*a)->device, nb + 2, shape))))
        return NULL;
    g.a = (*a)->data, g.b = (*b)->data, g.c = out->data;
    g.ldc = n, g.stride_c = m * n;
    g.batch = na_shape_numel(nb, shape);
    return na_be(out)->gemm(&g) == NA_OK ? out : NULL;
}

na_tensor *na_matmul(na_tensor *a, na_tensor *b) {
    const char *fn = "na_matmul";
    char x[NA_DESCRIBE_MAX], y[NA_DESCRIBE_MAX];
    if (!na_check_float(fn, a, "a") || !na_check_float(fn, b, "b") ||
        !na_check_same_device(fn, a, b))
        return NULL;
    if (a->ndim < 2 || b->ndim < 2) {
        na_set_error(NA_ESHAPE, "%s: operands need at least 2 dims, got %s and %s", fn,
                     na_tensor_describe(a, x, sizeof x), na_tensor_describe(b, y, sizeof y));
        return NULL;
    }
    na_tensor *ins[2] = {a, b};
    if (na_autocast_inputs(NA_OP_MATMUL, ins, 2) != NA_OK) return NULL;
    a = ins[0], b = ins[1];
    if (!na_check_same_dtype(fn, a, b)) return NULL;
    int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1];
    int64_t k2 = b->shape[b->ndim - 2], n = b->shape[b->ndim - 1];
    if (k != k2) {
        na_set_error(NA_ESHAPE, "%s: inner dimensions differ: a is %s, b is %s", fn,
                     na_tensor_describe(a, x, sizeof x), na_tensor_describe(b, y, sizeof y));
        return NULL;
    }
    /* batch dims: equal, or one side has none (it is then shared by every batch entry) */
    const na_tensor *big = a->ndim >= b->ndim ? a : b;
    int nb = big->ndim - 2;
    if (a->ndim > 2 && b->ndim > 2) {
        bool same = a->ndim == b->ndim;
        for (int i = 0; same && i < nb; i++) same = a->shape[i] == b->shape[i];
        if (!same) {
            na_set_error(NA_ESHAPE, "%s: batch dims of %s and %s differ (equal batch dims, or one "
                         "2-d operand, are supported)", fn, na_tensor_describe(a, x, sizeof x),
                         na_tensor_describe(b, y, sizeof y));
            return NULL;
        }
    }
    int64_t shape[NA_MAX_DIMS];
    for (int i = 0; i < nb; i++) shape[i] = big->shape[i];
    shape[nb] = m, shape[nb + 1] = n;
    na_tensor *out = gemm_into(&a, &b, NULL, nb, shape);
    if (!out) return NULL;
    na_tensor *in[2] = {a, b};
    na_op_record(NA_OP_MATMUL, out, 2, in);
    return out;
}

/* Input k's gradient l @ r: into the engine's n->grad_into[k] when it offered one and no
 * batch sum follows (input k has the product's dims), else as na_matmul (summed to the
 * input's shape when it was shared over the batch). */
static na_tensor *grad_product(const na_node *n, int k, na_tensor *l, na_tensor *r, int nd) {
    const na_tensor *in = n->inputs[k];
    na_tensor *into = n->grad_into[k];
    if (into && in->ndim == nd && l && r && l->dtype == into->dtype)
        return gemm_into(&l, &r, into, nd - 2, in->shape);
    na_tensor *g = na_matmul(l, r);
    return g && in->ndim < nd ? na_sum_to_shape(g, in->ndim, in->shape) : g;
}

int na_bw_MATMUL(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *a = n->inputs[0], *b = n->inputs[1];
    int nd = gout->ndim;
    if (na_node_needs_grad(n, 0) && /* ga = gout @ b^T */
        !(gin[0] = grad_product(n, 0, gout, na_transpose(b, b->ndim - 2, b->ndim - 1), nd)))
        return na_last_status();
    if (na_node_needs_grad(n, 1) && /* gb = a^T @ gout */
        !(gin[1] = grad_product(n, 1, na_transpose(a, a->ndim - 2, a->ndim - 1), gout, nd)))
        return na_last_status();
    return NA_OK;
}

na_tensor *na_linear(na_tensor *x, na_tensor *w, na_tensor *b) {
    const char *fn = "na_linear";
    char s1[NA_DESCRIBE_MAX], s2[NA_DESCRIBE_MAX];
    if (!na_check_float(fn, x, "x") || !na_check_float(fn, w, "weight") ||
        !na_check_same_device(fn, x, w) || (b && (!na_check_float(fn, b, "bias") ||
                                                  !na_check_same_device(fn, x, b))))
        return NULL;
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))) {
        na_set_error(NA_ESHAPE, "%s: expected x [.., in], weight [out, in], bias [out]; got x %s, "
                     "weight %s%s", fn, na_tensor_describe(x, s1, sizeof s1),
                     na_tensor_describe(w, s2, sizeof s2), b ? " and a bias of the wrong shape" : "");
        return NULL;
    }
    na_tensor *ins[3] = {x, w, b};
    if (na_autocast_inputs(NA_OP_LINEAR, ins, b ? 3 : 2) != NA_OK) return NULL;
    x = ins[0], w = ins[1], b = ins[2];
    if (!na_check_same_dtype(fn, x, w) || (b && !na_check_same_dtype(fn, x, b))) return NULL;
    int64_t in = w->shape[1], outf = w->shape[0], rows = x->numel / (in ? in : 1);
    na_tensor *x2 = na_contiguous(x), *wc = na_contiguous(w), *bc = b ? na_contiguous(b) : NULL;
    if (!x2 || !wc || (b && !bc)) return NULL;
    int64_t shape[NA_MAX_DIMS];
    for (int i = 0; i < x->ndim - 1; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = outf;
    na_tensor *out = na_empty(x->dtype, x->device, x->ndim, shape);
    if (!out) return NULL;
    na_gemm_args g = {.dtype = x->dtype, .a = x2->data, .b = wc->data, .bias = bc ? bc->data : NULL,
                      .c = out->data, .tb = true, .m = rows, .n = outf, .k = in, .lda = in,
                      .ldb = in, .ldc = outf, .batch = 1, .alpha = 1.0f, .beta = 0.0f};
    if (na_be(out)->gemm(&g) != NA_OK) return NULL;
    na_tensor *inputs[3] = {x2, wc, bc};
    na_op_record(NA_OP_LINEAR, out, 3, inputs);
    return out;
}

int na_bw_LINEAR(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_tensor *x = n->inputs[0], *w = n->inputs[1];
    int64_t in = w->shape[1], outf = w->shape[0];
    na_tensor *g2 = na_reshape(gout, 2, (const int64_t[]){-1, outf});
    if (!g2) return na_last_status();
    if (na_node_needs_grad(n, 0)) { /* gx = gout @ w */
        na_tensor *gx = na_matmul(g2, w);
        if (!(gin[0] = gx ? na_reshape(gx, x->ndim, x->shape) : NULL)) return na_last_status();
    }
    if (na_node_needs_grad(n, 1)) { /* gw = gout^T @ x, into the weight's .grad if offered */
        na_tensor *x2 = na_reshape(x, 2, (const int64_t[]){-1, in});
        if (!(gin[1] = grad_product(n, 1, na_transpose(g2, 0, 1), x2, 2))) return na_last_status();
    }
    if (na_node_needs_grad(n, 2) && !(gin[2] = na_grad_sum_rows(n, 2, g2))) return na_last_status();
    return NA_OK;
}

na_tensor *na_grad_sum_rows(const na_node *n, int k, na_tensor *x) {
    na_tensor *into = n->grad_into[k];
    if (!into || x->ndim != 2 || x->dtype != into->dtype) return na_sum_dim(x, 0, false);
    if (!(x = na_contiguous(x))) return NULL;
    int rc = na_be(x)->reduce(NA_REDUCE_SUM, &x->view, &into->view, NULL, 1, x->shape[0],
                              x->shape[1]);
    return rc ? NULL : into;
}

/* ---- scaled FP8 product ------------------------------------------------------------------ */

/* t (2-d FP8) widened to dt (exact: every FP8 value is a bf16 value), in t's orientation: a
 * transposed view stays a transposed view, so the GEMM reads it with its transpose flag. */
static na_tensor *widen_operand(na_tensor *t, na_dtype dt) {
    bool trans;
    int64_t ld;
    if (!matrix_layout(t, &trans, &ld) || !trans) return na_cast(t, dt);
    na_tensor *w = na_cast(na_transpose(t, 0, 1), dt);
    return w ? na_transpose(w, 0, 1) : NULL;
}

/* Checks one FP8 operand of na_scaled_mm. */
static bool check_fp8_operand(const char *fn, const na_tensor *t, const char *what) {
    char s[NA_DESCRIBE_MAX];
    if (!na_check_tensor(fn, t, what)) return false;
    if (!na_dtype_is_fp8(t->dtype) || t->ndim != 2) {
        na_set_error(na_dtype_is_fp8(t->dtype) ? NA_ESHAPE : NA_EDTYPE,
                     "%s: %s must be a 2-d f8e4m3 or f8e5m2 tensor, got %s", fn, what,
                     na_tensor_describe(t, s, sizeof s));
        return false;
    }
    return true;
}

/* Checks a scale of na_scaled_mm: f32, one element, on the operands' device. */
static bool check_scale(const char *fn, const na_tensor *s, const na_tensor *a, const char *what) {
    char d[NA_DESCRIBE_MAX];
    if (!na_check_tensor(fn, s, what) || !na_check_same_device(fn, a, s)) return false;
    if (s->dtype != NA_DTYPE_F32 || s->numel != 1) {
        na_set_error(s->dtype != NA_DTYPE_F32 ? NA_EDTYPE : NA_ESHAPE,
                     "%s: %s must be an f32 tensor of one element (a per-tensor scale), got %s",
                     fn, what, na_tensor_describe(s, d, sizeof d));
        return false;
    }
    return true;
}

/* The backend's own FP8 GEMM (cuBLASLt on CUDA, behind its switch) when it takes the problem
 * (*done): a row-major, b the transpose of a row-major [n, k] (a Linear weight). */
static int scaled_mm_native(na_tensor *a, na_tensor *b, na_tensor *sa, na_tensor *sb,
                            na_tensor *bias, na_tensor *out, bool *done) {
    const na_backend *be = na_be(out);
    bool ta, tb;
    int64_t lda, ldb;
    *done = false;
    if (!be->scaled_mm || !matrix_layout(a, &ta, &lda) || ta || !matrix_layout(b, &tb, &ldb) ||
        !tb)
        return NA_OK;
    na_scaled_mm_args g = {.a_dtype = a->dtype, .b_dtype = b->dtype, .c_dtype = out->dtype,
                           .a = a->data, .b = b->data, .scale_a = sa->data, .scale_b = sb->data,
                           .bias = bias ? bias->data : NULL, .c = out->data,
                           .m = out->shape[0], .n = out->shape[1], .k = a->shape[1],
                           .lda = lda, .ldb = ldb};
    return be->scaled_mm(&g, done);
}

na_tensor *na_scaled_mm(na_tensor *a, na_tensor *b, na_tensor *scale_a, na_tensor *scale_b,
                        na_tensor *bias, na_dtype out_dtype) {
    const char *fn = "na_scaled_mm";
    char x[NA_DESCRIBE_MAX], y[NA_DESCRIBE_MAX];
    if (!check_fp8_operand(fn, a, "a") || !check_fp8_operand(fn, b, "b") ||
        !na_check_same_device(fn, a, b) || !check_scale(fn, scale_a, a, "scale_a") ||
        !check_scale(fn, scale_b, a, "scale_b"))
        return NULL;
    if (out_dtype != NA_DTYPE_F32 && out_dtype != NA_DTYPE_BF16) {
        na_set_error(NA_EDTYPE, "%s: out_dtype must be f32 or bf16, got %s", fn,
                     na_dtype_name(out_dtype));
        return NULL;
    }
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    if (b->shape[0] != k) {
        na_set_error(NA_ESHAPE, "%s: inner dimensions differ: a is %s, b is %s", fn,
                     na_tensor_describe(a, x, sizeof x), na_tensor_describe(b, y, sizeof y));
        return NULL;
    }
    if (bias && (!na_check_tensor(fn, bias, "bias") || !na_check_same_device(fn, a, bias)))
        return NULL;
    if (bias && (!na_dtype_is_float(bias->dtype) || bias->dtype == NA_DTYPE_F64 ||
                 bias->ndim != 1 || bias->shape[0] != n)) {
        na_set_error(NA_ESHAPE, "%s: bias must be [%" PRId64 "] in f32, bf16 or f16, got %s", fn,
                     n, na_tensor_describe(bias, x, sizeof x));
        return NULL;
    }
    /* the epilogue's dtype: bf16 only when the output and the bias (if any) are bf16; an f32
     * bias of a bf16 output is added in f32, then one rounding (as torch._scaled_mm) */
    na_dtype ct = out_dtype == NA_DTYPE_BF16 && (!bias || bias->dtype == NA_DTYPE_BF16)
                      ? NA_DTYPE_BF16 : NA_DTYPE_F32;
    na_tensor *bc = bias ? na_contiguous(na_cast(bias, ct)) : NULL; /* widening: exact */
    na_tensor *out = na_empty(ct, a->device, NA_SHAPE(m, n));
    if (!out || (bias && !bc)) return NULL;
    bool done;
    if (scaled_mm_native(a, b, scale_a, scale_b, bc, out, &done) != NA_OK) return NULL;
    if (!done) {
        /* widened to ct (exact), so the backend's f32 or bf16 GEMM serves: f32 accumulation,
         * alpha = the scale product, bias and one rounding in its epilogue */
        na_tensor *aw = widen_operand(a, ct), *bw = widen_operand(b, ct);
        if (!aw || !bw) return NULL;
        double sa = na_item(scale_a), sb = na_item(scale_b);
        na_gemm_args g = {.dtype = ct, .bias = bc ? bc->data : NULL, .c = out->data, .m = m,
                          .n = n, .k = k, .ldc = n, .batch = 1,
                          .alpha = (float)sa * (float)sb, .beta = 0.0f};
        aw = gemm_operand(aw, &g.ta, &g.lda, &g.stride_a);
        bw = gemm_operand(bw, &g.tb, &g.ldb, &g.stride_b);
        if (!aw || !bw) return NULL;
        g.a = aw->data, g.b = bw->data;
        if (na_be(out)->gemm(&g) != NA_OK) return NULL;
    }
    return ct == out_dtype ? out : na_cast(out, out_dtype);
}
