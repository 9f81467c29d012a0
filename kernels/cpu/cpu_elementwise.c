/* kernels/cpu/cpu_elementwise.c — unary, unary backward and broadcast binary ops.
 *
 * The math is na_unary_*, na_unary_grad_*, na_binary_* from common/elementwise.h. The op
 * switch (one case per row of the lists in common/elementwise_ops.h) is hoisted out of the
 * loops (one loop per op, the op a constant inside it) so the compiler folds the switch and
 * can vectorize. Compute type: double when any operand is f64, else float; f16/bf16
 * operands are widened per chunk and the result rounded once.
 */
#include "common/elementwise.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_parallel.h"

#define NA_CPU_DEFINE_LOOPS(T, SFX)                                                         \
    static void unary_loop_##SFX(int op, const T *x, T *y, int64_t n, T a, T b) {           \
        switch (op) {                                                                       \
        NA_UNARY_OPS(UNARY_CASE_##SFX)                                                      \
        default: break;                                                                     \
        }                                                                                   \
    }                                                                                       \
    static void unary_grad_loop_##SFX(int op, const T *x, const T *y, const T *gy, T *gx,   \
                                      int64_t n, T a, T b) {                                \
        switch (op) {                                                                       \
        NA_UNARY_OPS(GRAD_CASE_##SFX)                                                       \
        default: break;                                                                     \
        }                                                                                   \
    }                                                                                       \
    static void binary_loop_##SFX(int op, const T *a, const T *b, T *o, int64_t n) {        \
        switch (op) {                                                                       \
        NA_BINARY_OPS(BINARY_CASE_##SFX)                                                    \
        default: break;                                                                     \
        }                                                                                   \
    }

#define UNARY_CASE_f(NAME, ...)                                                             \
    case NA_UNARY_##NAME:                                                                   \
        for (int64_t i = 0; i < n; i++) y[i] = na_unary_f(NA_UNARY_##NAME, x[i], a, b);     \
        break;
#define UNARY_CASE_d(NAME, ...)                                                             \
    case NA_UNARY_##NAME:                                                                   \
        for (int64_t i = 0; i < n; i++) y[i] = na_unary_d(NA_UNARY_##NAME, x[i], a, b);     \
        break;
#define GRAD_CASE_f(NAME, ...)                                                              \
    case NA_UNARY_##NAME:                                                                   \
        for (int64_t i = 0; i < n; i++)                                                     \
            gx[i] = gy[i] * na_unary_grad_f(NA_UNARY_##NAME, x[i], y[i], a, b);             \
        break;
#define GRAD_CASE_d(NAME, ...)                                                              \
    case NA_UNARY_##NAME:                                                                   \
        for (int64_t i = 0; i < n; i++)                                                     \
            gx[i] = gy[i] * na_unary_grad_d(NA_UNARY_##NAME, x[i], y[i], a, b);             \
        break;
#define BINARY_CASE_f(NAME, ...)                                                            \
    case NA_BINARY_##NAME:                                                                  \
        for (int64_t i = 0; i < n; i++) o[i] = na_binary_f(NA_BINARY_##NAME, a[i], b[i]);   \
        break;
#define BINARY_CASE_d(NAME, ...)                                                            \
    case NA_BINARY_##NAME:                                                                  \
        for (int64_t i = 0; i < n; i++) o[i] = na_binary_d(NA_BINARY_##NAME, a[i], b[i]);   \
        break;

NA_CPU_DEFINE_LOOPS(float, f)
NA_CPU_DEFINE_LOOPS(double, d)

static bool any_f64(const na_view *a, const na_view *b, const na_view *c,
                    const na_view *d) {
    return (a && a->dtype == NA_DTYPE_F64) || (b && b->dtype == NA_DTYPE_F64) ||
           (c && c->dtype == NA_DTYPE_F64) || (d && d->dtype == NA_DTYPE_F64);
}

/* ---- unary ------------------------------------------------------------------------------ */

#define NA_CPU_DEFINE_UNARY(T, SFX)                                                         \
    static void unary_##SFX(int op, const na_view *x, na_view *y, T a, T b, int64_t lo,     \
                            int64_t n) {                                                    \
        T xb[NA_CPU_CHUNK], yb[NA_CPU_CHUNK];                                               \
        for (int64_t o = lo; o < n; o += NA_CPU_CHUNK) {                                    \
            int64_t c = n - o < NA_CPU_CHUNK ? n - o : NA_CPU_CHUNK;                        \
            const T *xp = na_cpu_view_##SFX(x->dtype, x->data, o, c, xb);                   \
            T *yp = na_cpu_out_##SFX(y->dtype, y->data, o, yb);                             \
            unary_loop_##SFX(op, xp, yp, c, a, b);                                          \
            na_cpu_store_##SFX(y->dtype, y->data, o, c, yp);                                \
        }                                                                                   \
    }                                                                                       \
    /* a missing x or y (NULL) reads as NaN, so an op that needed it shows it */            \
    static void unary_backward_##SFX(int op, const na_view *x, const na_view *y,            \
                                     const na_view *gy, na_view *gx, T a, T b, int64_t lo,  \
                                     int64_t n) {                                           \
        T xb[NA_CPU_CHUNK], yb[NA_CPU_CHUNK], gyb[NA_CPU_CHUNK], gxb[NA_CPU_CHUNK];         \
        for (int64_t o = lo; o < n; o += NA_CPU_CHUNK) {                                    \
            int64_t c = n - o < NA_CPU_CHUNK ? n - o : NA_CPU_CHUNK;                        \
            const T *xp, *yp;                                                               \
            if (x) xp = na_cpu_view_##SFX(x->dtype, x->data, o, c, xb);                     \
            else {                                                                          \
                for (int64_t i = 0; i < c; i++) xb[i] = (T)NAN;                             \
                xp = xb;                                                                    \
            }                                                                               \
            if (y) yp = na_cpu_view_##SFX(y->dtype, y->data, o, c, yb);                     \
            else {                                                                          \
                for (int64_t i = 0; i < c; i++) yb[i] = (T)NAN;                             \
                yp = yb;                                                                    \
            }                                                                               \
            const T *gyp = na_cpu_view_##SFX(gy->dtype, gy->data, o, c, gyb);               \
            T *gxp = na_cpu_out_##SFX(gx->dtype, gx->data, o, gxb);                         \
            unary_grad_loop_##SFX(op, xp, yp, gyp, gxp, c, a, b);                           \
            na_cpu_store_##SFX(gx->dtype, gx->data, o, c, gxp);                             \
        }                                                                                   \
    }

NA_CPU_DEFINE_UNARY(float, f)
NA_CPU_DEFINE_UNARY(double, d)

/* Large arrays are cut into contiguous ranges of whole chunks for the pool (each element's
 * result does not depend on the cut). */
#define NA_CPU_EW_TASK_ELEMS ((int64_t)1 << 16) /* elements per task worth a wake-up */
enum { NA_CPU_EW_TASKS = 32 };

typedef struct {
    int op;
    bool f64;
    const na_view *x, *y, *gy;
    na_view *out;
    double a, b;
    int64_t n, tasks;
} unary_job;

static void unary_task(void *ctx, int64_t t) {
    const unary_job *j = ctx;
    int64_t lo, hi;
    na_cpu_task_range(j->n, j->tasks, t, NA_CPU_CHUNK, &lo, &hi);
    if (j->gy && j->f64) unary_backward_d(j->op, j->x, j->y, j->gy, j->out, j->a, j->b, lo, hi);
    else if (j->gy)
        unary_backward_f(j->op, j->x, j->y, j->gy, j->out, (float)j->a, (float)j->b, lo, hi);
    else if (j->f64) unary_d(j->op, j->x, j->out, j->a, j->b, lo, hi);
    else unary_f(j->op, j->x, j->out, (float)j->a, (float)j->b, lo, hi);
}

static void unary_run(unary_job *j) {
    j->n = j->out->numel;
    j->tasks = na_cpu_split(j->n, NA_CPU_EW_TASK_ELEMS, NA_CPU_EW_TASKS);
    na_cpu_parallel_for(j->n ? j->tasks : 0, unary_task, j);
}

static int check_unary_op(const char *fn, na_unary_op op) {
    if ((unsigned)op >= NA_UNARY_COUNT)
        return na_set_error(NA_EINVAL, "%s: unknown unary op %d", fn, (int)op);
    return NA_OK;
}

int na_cpu_unary(na_unary_op op, const na_view *x, na_view *y, double a, double b) {
    NA_CPU_CHECK_FLOAT("cpu_unary", x);
    NA_CPU_CHECK_FLOAT("cpu_unary", y);
    int st = check_unary_op("cpu_unary", op);
    if (st) return st;
    unary_run(&(unary_job){.op = op, .f64 = any_f64(x, y, NULL, NULL), .x = x, .out = y, .a = a,
                           .b = b});
    return NA_OK;
}

int na_cpu_unary_backward(na_unary_op op, const na_view *x, const na_view *y,
                          const na_view *gy, na_view *gx, double a, double b) {
    NA_CPU_CHECK_FLOAT("cpu_unary_backward", x);
    NA_CPU_CHECK_FLOAT("cpu_unary_backward", y);
    NA_CPU_CHECK_FLOAT("cpu_unary_backward", gy);
    NA_CPU_CHECK_FLOAT("cpu_unary_backward", gx);
    int st = check_unary_op("cpu_unary_backward", op);
    if (st) return st;
    unary_run(&(unary_job){.op = op, .f64 = any_f64(x, y, gy, gx), .x = x, .y = y, .gy = gy,
                           .out = gx, .a = a, .b = b});
    return NA_OK;
}

/* ---- binary ----------------------------------------------------------------------------- */

/* Broadcast geometry with size-1 dims dropped and adjacent dims merged where both operands
 * (and the contiguous output) allow it. */
typedef struct {
    int nd;
    int64_t shape[NA_MAX_DIMS], sa[NA_MAX_DIMS], sb[NA_MAX_DIMS];
} flat_bc;

static void flatten_bc(const na_broadcast *bc, flat_bc *f) {
    int k = -1;
    for (int d = 0; d < bc->ndim; d++) {
        int64_t s = bc->shape[d];
        if (s == 1) continue;
        if (k >= 0 && f->sa[k] == bc->a_stride[d] * s && f->sb[k] == bc->b_stride[d] * s) {
            f->shape[k] *= s;
            f->sa[k] = bc->a_stride[d];
            f->sb[k] = bc->b_stride[d];
        } else {
            k++;
            f->shape[k] = s;
            f->sa[k] = bc->a_stride[d];
            f->sb[k] = bc->b_stride[d];
        }
    }
    if (k < 0) {
        k = 0;
        f->shape[0] = 1;
        f->sa[0] = f->sb[0] = 0;
    }
    f->nd = k + 1;
}

/* The c compute-type values of operand p at p[off + j*st], j < c (st 0 broadcasts one). */
#define NA_CPU_DEFINE_GATHER(T, SFX)                                                        \
    static const T *gather_##SFX(na_dtype dt, const void *p, int64_t off, int64_t st,       \
                                 int64_t c, T *buf) {                                       \
        if (st == 1) return na_cpu_view_##SFX(dt, p, off, c, buf);                          \
        if (st == 0) {                                                                      \
            T v;                                                                            \
            na_cpu_load_##SFX(dt, p, off, 1, &v);                                           \
            for (int64_t j = 0; j < c; j++) buf[j] = v;                                     \
            return buf;                                                                     \
        }                                                                                   \
        for (int64_t j = 0; j < c; j++) buf[j] = (T)na_cpu_get(dt, p, off + j * st);        \
        return buf;                                                                         \
    }                                                                                       \
    static void binary_##SFX(int op, const na_view *a, const na_view *b, na_view *out,      \
                             const flat_bc *f) {                                            \
        T ab[NA_CPU_CHUNK], bb[NA_CPU_CHUNK], ob[NA_CPU_CHUNK];                             \
        int nd = f->nd;                                                                     \
        int64_t len = f->shape[nd - 1], sa = f->sa[nd - 1], sb = f->sb[nd - 1];             \
        int64_t rows = 1;                                                                   \
        for (int d = 0; d < nd - 1; d++) rows *= f->shape[d];                               \
        int64_t ctr[NA_MAX_DIMS] = {0}, oa = 0, ob_ = 0, oo = 0;                            \
        for (int64_t r = 0; r < rows; r++) {                                                \
            for (int64_t j = 0; j < len; j += NA_CPU_CHUNK) {                               \
                int64_t c = len - j < NA_CPU_CHUNK ? len - j : NA_CPU_CHUNK;                \
                const T *ap = gather_##SFX(a->dtype, a->data, oa + j * sa, sa, c, ab);      \
                const T *bp = gather_##SFX(b->dtype, b->data, ob_ + j * sb, sb, c, bb);     \
                T *op_ = na_cpu_out_##SFX(out->dtype, out->data, oo + j, ob);               \
                binary_loop_##SFX(op, ap, bp, op_, c);                                      \
                na_cpu_store_##SFX(out->dtype, out->data, oo + j, c, op_);                  \
            }                                                                               \
            oo += len;                                                                      \
            for (int k = nd - 2; k >= 0; k--) {                                             \
                oa += f->sa[k];                                                             \
                ob_ += f->sb[k];                                                            \
                if (++ctr[k] < f->shape[k]) break;                                          \
                oa -= f->sa[k] * f->shape[k];                                               \
                ob_ -= f->sb[k] * f->shape[k];                                              \
                ctr[k] = 0;                                                                 \
            }                                                                               \
        }                                                                                   \
    }

NA_CPU_DEFINE_GATHER(float, f)
NA_CPU_DEFINE_GATHER(double, d)

int na_cpu_binary(na_binary_op op, const na_view *a, const na_view *b, na_view *out,
                  const na_broadcast *bc) {
    NA_CPU_CHECK_FLOAT("cpu_binary", a);
    NA_CPU_CHECK_FLOAT("cpu_binary", b);
    NA_CPU_CHECK_FLOAT("cpu_binary", out);
    if ((unsigned)op >= NA_BINARY_COUNT)
        return na_set_error(NA_EINVAL, "cpu_binary: unknown binary op %d", (int)op);
    if (bc->ndim < 0 || bc->ndim > NA_MAX_DIMS)
        return na_set_error(NA_EINVAL, "cpu_binary: broadcast ndim %d", bc->ndim);
    for (int d = 0; d < bc->ndim; d++)
        if (bc->shape[d] == 0) return NA_OK;
    flat_bc f;
    flatten_bc(bc, &f);
    if (any_f64(a, b, out, NULL)) binary_d(op, a, b, out, &f);
    else binary_f(op, a, b, out, &f);
    return NA_OK;
}
