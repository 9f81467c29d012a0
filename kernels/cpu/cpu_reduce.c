/* kernels/cpu/cpu_reduce.c — reductions, argmax, softmax and the fused cross-entropy.
 *
 * Accumulation is f32 (f64 when x or the output is f64). Sums are pairwise along contiguous
 * runs; sums across rows (inner > 1) are blocked (256 rows per partial), so the error grows
 * far slower than r. MAX follows the first maximum and propagates NaN (the first NaN wins),
 * as torch.max does.
 */
#include "cpu/cpu_internal.h"

#define NA_CPU_BLOCK_ROWS 256

static bool is_f64(const na_view *t) { return t && t->dtype == NA_DTYPE_F64; }

/* v takes over from best (max with NaN propagation) */
#define NA_CPU_MAX_TAKES(v, best) ((v) > (best) || ((v) != (v) && (best) == (best)))

#define NA_CPU_DEFINE_REDUCE(T, SFX)                                                        \
    static void sum_##SFX(const na_view *x, na_view *out, int64_t outer, int64_t r,         \
                          int64_t inner, bool mean) {                                       \
        T tot[NA_CPU_CHUNK], blk[NA_CPU_CHUNK], buf[NA_CPU_CHUNK];                          \
        T rt = (T)r;                                                                        \
        if (inner == 1) {                                                                   \
            for (int64_t o = 0; o < outer; o++) {                                           \
                T s = na_cpu_sum_any_##SFX(x->dtype, x->data, o * r, r);                    \
                if (mean) s = s / rt;                                                       \
                na_cpu_store_##SFX(out->dtype, out->data, o, 1, &s);                        \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        for (int64_t o = 0; o < outer; o++) {                                               \
            for (int64_t i0 = 0; i0 < inner; i0 += NA_CPU_CHUNK) {                          \
                int64_t c = inner - i0 < NA_CPU_CHUNK ? inner - i0 : NA_CPU_CHUNK;          \
                for (int64_t i = 0; i < c; i++) tot[i] = 0;                                 \
                for (int64_t j0 = 0; j0 < r; j0 += NA_CPU_BLOCK_ROWS) {                     \
                    int64_t j1 = r - j0 < NA_CPU_BLOCK_ROWS ? r : j0 + NA_CPU_BLOCK_ROWS;   \
                    for (int64_t i = 0; i < c; i++) blk[i] = 0;                             \
                    for (int64_t j = j0; j < j1; j++) {                                     \
                        const T *row = na_cpu_view_##SFX(x->dtype, x->data,                 \
                                                         (o * r + j) * inner + i0, c, buf); \
                        for (int64_t i = 0; i < c; i++) blk[i] += row[i];                   \
                    }                                                                       \
                    for (int64_t i = 0; i < c; i++) tot[i] += blk[i];                       \
                }                                                                           \
                if (mean)                                                                   \
                    for (int64_t i = 0; i < c; i++) tot[i] = tot[i] / rt;                   \
                na_cpu_store_##SFX(out->dtype, out->data, o * inner + i0, c, tot);          \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    /* out and idx may each be NULL; r >= 1 */                                              \
    static void max_##SFX(const na_view *x, na_view *out, na_view *idx,                     \
                          int64_t outer, int64_t r, int64_t inner) {                        \
        T best[NA_CPU_CHUNK], buf[NA_CPU_CHUNK];                                            \
        int32_t bi[NA_CPU_CHUNK];                                                           \
        for (int64_t o = 0; o < outer; o++) {                                               \
            for (int64_t i0 = 0; i0 < inner; i0 += NA_CPU_CHUNK) {                          \
                int64_t c = inner - i0 < NA_CPU_CHUNK ? inner - i0 : NA_CPU_CHUNK;          \
                if (inner == 1) { /* a contiguous run of r */                               \
                    T bv = 0;                                                               \
                    int32_t bj = 0;                                                         \
                    for (int64_t j0 = 0; j0 < r; j0 += NA_CPU_CHUNK) {                      \
                        int64_t cc = r - j0 < NA_CPU_CHUNK ? r - j0 : NA_CPU_CHUNK;         \
                        const T *v = na_cpu_view_##SFX(x->dtype, x->data, o * r + j0, cc, buf); \
                        for (int64_t j = 0; j < cc; j++)                                    \
                            if ((j0 == 0 && j == 0) || NA_CPU_MAX_TAKES(v[j], bv)) {        \
                                bv = v[j];                                                  \
                                bj = (int32_t)(j0 + j);                                     \
                            }                                                               \
                    }                                                                       \
                    best[0] = bv;                                                           \
                    bi[0] = bj;                                                             \
                } else {                                                                    \
                    na_cpu_load_##SFX(x->dtype, x->data, o * r * inner + i0, c, best);      \
                    for (int64_t i = 0; i < c; i++) bi[i] = 0;                              \
                    for (int64_t j = 1; j < r; j++) {                                       \
                        const T *v = na_cpu_view_##SFX(x->dtype, x->data,                   \
                                                       (o * r + j) * inner + i0, c, buf);   \
                        for (int64_t i = 0; i < c; i++)                                     \
                            if (NA_CPU_MAX_TAKES(v[i], best[i])) {                          \
                                best[i] = v[i];                                             \
                                bi[i] = (int32_t)j;                                         \
                            }                                                               \
                    }                                                                       \
                }                                                                           \
                if (out) na_cpu_store_##SFX(out->dtype, out->data, o * inner + i0, c, best); \
                if (idx) memcpy((int32_t *)idx->data + o * inner + i0, bi, (size_t)c * 4);  \
            }                                                                               \
        }                                                                                   \
    }

NA_CPU_DEFINE_REDUCE(float, f)
NA_CPU_DEFINE_REDUCE(double, d)

int na_cpu_reduce(na_reduce_op op, const na_view *x, na_view *out, na_view *idx,
                  int64_t outer, int64_t r, int64_t inner) {
    NA_CPU_CHECK_FLOAT("cpu_reduce", x);
    NA_CPU_CHECK_FLOAT("cpu_reduce", out);
    if (idx && idx->dtype != NA_DTYPE_I32) return na_cpu_bad_dtype("cpu_reduce", "idx", idx->dtype);
    if (outer < 0 || r < 0 || inner < 0)
        return na_set_error(NA_EINVAL, "cpu_reduce: negative extent [%lld, %lld, %lld]",
                            (long long)outer, (long long)r, (long long)inner);
    if (r > INT32_MAX && op == NA_REDUCE_MAX && idx)
        return na_set_error(NA_EINVAL, "cpu_reduce: %lld rows do not fit an i32 index",
                            (long long)r);
    bool d = is_f64(x) || is_f64(out);
    switch (op) {
    case NA_REDUCE_SUM:
    case NA_REDUCE_MEAN:
        if (d) sum_d(x, out, outer, r, inner, op == NA_REDUCE_MEAN);
        else sum_f(x, out, outer, r, inner, op == NA_REDUCE_MEAN);
        return NA_OK;
    case NA_REDUCE_MAX:
        if (r == 0) { /* empty: -inf, index -1 */
            for (int64_t i = 0; i < outer * inner; i++) {
                if (out) na_cpu_set(out->dtype, out->data, i, -INFINITY);
                if (idx) ((int32_t *)idx->data)[i] = -1;
            }
            return NA_OK;
        }
        if (d) max_d(x, out, idx, outer, r, inner);
        else max_f(x, out, idx, outer, r, inner);
        return NA_OK;
    default: return na_set_error(NA_EINVAL, "cpu_reduce: unknown reduce op %d", (int)op);
    }
}

int na_cpu_argmax(const na_view *x, na_view *idx, int64_t outer, int64_t r, int64_t inner) {
    NA_CPU_CHECK_FLOAT("cpu_argmax", x);
    if (idx->dtype != NA_DTYPE_I32) return na_cpu_bad_dtype("cpu_argmax", "idx", idx->dtype);
    if (r <= 0 || r > INT32_MAX)
        return na_set_error(NA_EINVAL, "cpu_argmax: cannot take argmax over %lld elements",
                            (long long)r);
    if (is_f64(x)) max_d(x, NULL, idx, outer, r, inner);
    else max_f(x, NULL, idx, outer, r, inner);
    return NA_OK;
}

int na_cpu_scatter_max_grad(const na_view *gy, const na_view *idx, na_view *gx,
                            int64_t outer, int64_t r, int64_t inner) {
    NA_CPU_CHECK_FLOAT("cpu_scatter_max_grad", gy);
    NA_CPU_CHECK_FLOAT("cpu_scatter_max_grad", gx);
    if (idx->dtype != NA_DTYPE_I32)
        return na_cpu_bad_dtype("cpu_scatter_max_grad", "idx", idx->dtype);
    size_t esz = na_dtype_size(gx->dtype);
    memset(gx->data, 0, (size_t)(outer * r * inner) * esz);
    const int32_t *ix = idx->data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int32_t j = ix[o * inner + i];
            if (j < 0 || j >= r)
                return na_set_error(NA_EINVAL,
                                    "cpu_scatter_max_grad: index %d at [%lld, %lld] outside [0, %lld)",
                                    (int)j, (long long)o, (long long)i, (long long)r);
            int64_t dst = (o * r + j) * inner + i, src = o * inner + i;
            if (gy->dtype == gx->dtype)
                memcpy((char *)gx->data + (size_t)dst * esz,
                       (const char *)gy->data + (size_t)src * esz, esz);
            else
                na_cpu_set(gx->dtype, gx->data, dst, na_cpu_get(gy->dtype, gy->data, src));
        }
    return NA_OK;
}

/* ---- softmax ---------------------------------------------------------------------------- */

#define NA_CPU_DEFINE_SOFTMAX(T, SFX, EXP, LOG)                                             \
    static T row_max_##SFX(const T *v, int64_t n) {                                         \
        T m = v[0];                                                                         \
        for (int64_t i = 1; i < n; i++) m = v[i] > m ? v[i] : m;                            \
        return m;                                                                           \
    }                                                                                       \
    static int softmax_##SFX(const na_view *x, na_view *y, int64_t rows, int64_t cols,      \
                             bool take_log) {                                               \
        T *row = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)cols * sizeof(T), "cpu_softmax"); \
        T *e = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)cols * sizeof(T), "cpu_softmax");   \
        if (!row || !e) return NA_ENOMEM;                                                   \
        for (int64_t r = 0; r < rows; r++) {                                                \
            na_cpu_load_##SFX(x->dtype, x->data, r * cols, cols, row);                      \
            T m = row_max_##SFX(row, cols);                                                 \
            for (int64_t i = 0; i < cols; i++) e[i] = EXP(row[i] - m);                      \
            T s = na_cpu_sum_##SFX(e, cols);                                                \
            if (take_log) {                                                                 \
                T ls = LOG(s);                                                              \
                for (int64_t i = 0; i < cols; i++) e[i] = (row[i] - m) - ls;                \
            } else {                                                                        \
                for (int64_t i = 0; i < cols; i++) e[i] = e[i] / s;                         \
            }                                                                               \
            na_cpu_store_##SFX(y->dtype, y->data, r * cols, cols, e);                       \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    static int softmax_backward_##SFX(const na_view *y, const na_view *gy, na_view *gx,     \
                                      int64_t rows, int64_t cols, bool take_log) {          \
        const char *fn = "cpu_softmax_backward";                                            \
        T *yr = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)cols * sizeof(T), fn);             \
        T *gr = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)cols * sizeof(T), fn);             \
        T *t = na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)cols * sizeof(T), fn);              \
        if (!yr || !gr || !t) return NA_ENOMEM;                                             \
        for (int64_t r = 0; r < rows; r++) {                                                \
            na_cpu_load_##SFX(y->dtype, y->data, r * cols, cols, yr);                       \
            na_cpu_load_##SFX(gy->dtype, gy->data, r * cols, cols, gr);                     \
            if (take_log) {                                                                 \
                T s = na_cpu_sum_##SFX(gr, cols);                                           \
                for (int64_t i = 0; i < cols; i++) t[i] = gr[i] - EXP(yr[i]) * s;           \
            } else {                                                                        \
                for (int64_t i = 0; i < cols; i++) t[i] = gr[i] * yr[i];                    \
                T dot = na_cpu_sum_##SFX(t, cols);                                          \
                for (int64_t i = 0; i < cols; i++) t[i] = yr[i] * (gr[i] - dot);            \
            }                                                                               \
            na_cpu_store_##SFX(gx->dtype, gx->data, r * cols, cols, t);                     \
        }                                                                                   \
        return NA_OK;                                                                       \
    }

NA_CPU_DEFINE_SOFTMAX(float, f, expf, logf)
NA_CPU_DEFINE_SOFTMAX(double, d, exp, log)

int na_cpu_softmax(const na_view *x, na_view *y, int64_t rows, int64_t cols, bool log) {
    NA_CPU_CHECK_FLOAT("cpu_softmax", x);
    NA_CPU_CHECK_FLOAT("cpu_softmax", y);
    if (rows <= 0 || cols <= 0) return NA_OK;
    return is_f64(x) || is_f64(y) ? softmax_d(x, y, rows, cols, log)
                                  : softmax_f(x, y, rows, cols, log);
}

int na_cpu_softmax_backward(const na_view *y, const na_view *gy, na_view *gx,
                            int64_t rows, int64_t cols, bool log) {
    NA_CPU_CHECK_FLOAT("cpu_softmax_backward", y);
    NA_CPU_CHECK_FLOAT("cpu_softmax_backward", gy);
    NA_CPU_CHECK_FLOAT("cpu_softmax_backward", gx);
    if (rows <= 0 || cols <= 0) return NA_OK;
    return is_f64(y) || is_f64(gy) || is_f64(gx)
               ? softmax_backward_d(y, gy, gx, rows, cols, log)
               : softmax_backward_f(y, gy, gx, rows, cols, log);
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

/* loss_n = lse_n - ((1-e) x[n,label] + (e/C) sum_c x[n,c]), lse_n = m + log sum exp(x - m).
 * A label outside [0, C) gives NaN loss and lse (as the CUDA kernel does). */
#define NA_CPU_DEFINE_CE(T, SFX, EXP, LOG)                                                  \
    static int ce_##SFX(const na_view *logits, const na_view *labels, na_view *loss,        \
                        na_view *lse, T e) {                                                \
        int64_t rows = logits->shape[0], cols = logits->numel / (rows ? rows : 1);          \
        T *row = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)cols * sizeof(T), "cpu_cross_entropy"); \
        T *ex = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)cols * sizeof(T), "cpu_cross_entropy"); \
        if (!row || !ex) return NA_ENOMEM;                                                  \
        const int32_t *lab = labels->data;                                                  \
        T on = (T)1 - e, off = e / (T)cols;                                                 \
        for (int64_t r = 0; r < rows; r++) {                                                \
            T l, ls;                                                                        \
            int32_t y = lab[r];                                                             \
            if (y < 0 || y >= cols) {                                                       \
                l = ls = (T)NAN;                                                            \
            } else {                                                                        \
                na_cpu_load_##SFX(logits->dtype, logits->data, r * cols, cols, row);        \
                T m = row_max_##SFX(row, cols);                                             \
                for (int64_t i = 0; i < cols; i++) ex[i] = EXP(row[i] - m);                 \
                ls = m + LOG(na_cpu_sum_##SFX(ex, cols));                                   \
                T target = on * row[y];                                                     \
                if (e != 0) target += off * na_cpu_sum_##SFX(row, cols);                    \
                l = ls - target;                                                            \
            }                                                                               \
            na_cpu_store_##SFX(loss->dtype, loss->data, r, 1, &l);                          \
            if (lse) na_cpu_store_##SFX(lse->dtype, lse->data, r, 1, &ls);                  \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    static int ce_backward_##SFX(const na_view *logits, const na_view *labels,              \
                                 const na_view *lse, const na_view *g, na_view *gx,         \
                                 T e) {                                                     \
        int64_t rows = logits->shape[0], cols = logits->numel / (rows ? rows : 1);          \
        T *row = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)cols * sizeof(T),                 \
                                "cpu_cross_entropy_backward");                              \
        if (!row) return NA_ENOMEM;                                                         \
        const int32_t *lab = labels->data;                                                  \
        T on = (T)1 - e, off = e / (T)cols;                                                 \
        for (int64_t r = 0; r < rows; r++) {                                                \
            T gr, ls;                                                                       \
            na_cpu_load_##SFX(g->dtype, g->data, r, 1, &gr);                                \
            na_cpu_load_##SFX(lse->dtype, lse->data, r, 1, &ls);                            \
            int32_t y = lab[r];                                                             \
            na_cpu_load_##SFX(logits->dtype, logits->data, r * cols, cols, row);            \
            if (y < 0 || y >= cols) {                                                       \
                for (int64_t i = 0; i < cols; i++) row[i] = (T)NAN;                         \
            } else {                                                                        \
                T xy = row[y];                                                              \
                for (int64_t i = 0; i < cols; i++) row[i] = gr * (EXP(row[i] - ls) - off);  \
                row[y] = gr * (EXP(xy - ls) - (on + off));                                  \
            }                                                                               \
            na_cpu_store_##SFX(gx->dtype, gx->data, r * cols, cols, row);                   \
        }                                                                                   \
        return NA_OK;                                                                       \
    }

NA_CPU_DEFINE_CE(float, f, expf, logf)
NA_CPU_DEFINE_CE(double, d, exp, log)

int na_cpu_cross_entropy(const na_view *logits, const na_view *labels, na_view *loss,
                         na_view *lse, double smoothing) {
    NA_CPU_CHECK_FLOAT("cpu_cross_entropy", logits);
    NA_CPU_CHECK_FLOAT("cpu_cross_entropy", loss);
    NA_CPU_CHECK_FLOAT("cpu_cross_entropy", lse);
    if (labels->dtype != NA_DTYPE_I32)
        return na_cpu_bad_dtype("cpu_cross_entropy", "labels", labels->dtype);
    if (logits->ndim != 2)
        return na_set_error(NA_ESHAPE, "cpu_cross_entropy: logits must be [N, C], got %d dims",
                            logits->ndim);
    if (logits->numel == 0) return NA_OK;
    return is_f64(logits) ? ce_d(logits, labels, loss, lse, smoothing)
                          : ce_f(logits, labels, loss, lse, (float)smoothing);
}

int na_cpu_cross_entropy_backward(const na_view *logits, const na_view *labels,
                                  const na_view *lse, const na_view *g, na_view *gx,
                                  double smoothing) {
    const char *fn = "cpu_cross_entropy_backward";
    NA_CPU_CHECK_FLOAT(fn, logits);
    NA_CPU_CHECK_FLOAT(fn, lse);
    NA_CPU_CHECK_FLOAT(fn, g);
    NA_CPU_CHECK_FLOAT(fn, gx);
    if (labels->dtype != NA_DTYPE_I32) return na_cpu_bad_dtype(fn, "labels", labels->dtype);
    if (logits->ndim != 2)
        return na_set_error(NA_ESHAPE, "%s: logits must be [N, C], got %d dims", fn,
                            logits->ndim);
    if (logits->numel == 0) return NA_OK;
    return is_f64(logits) ? ce_backward_d(logits, labels, lse, g, gx, smoothing)
                          : ce_backward_f(logits, labels, lse, g, gx, (float)smoothing);
}
