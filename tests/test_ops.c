/* tests/test_ops.c — every op's forward against values computed by hand.
 *
 * A parameterized test walks the op table (0..NA_OP_COUNT-1) through the rows of
 * tests/op_cases.c: an elementwise op is checked against its row's references, any other op by
 * the forward check its row names (fw_<op>, here), so an op added to NA_OP_MAP without a row or
 * without that check fails the suite. Inputs are small literals; expected values are literals
 * or plain double arithmetic written out by hand (exp/log/erf from libm, naive loops for conv
 * and pooling), never the library's ops. Float ops run in f32 and f64.
 *
 * The numerics section checks the f16/bf16 contract (nanoamp/dtype.h, kernels/backend.h):
 * widen to f32, compute and accumulate in f32, round once to nearest even on store. The cases
 * are chosen so that a kernel accumulating in f16/bf16 would give a different answer.
 */
#include "op_cases.h"
#include "nanoamp/threads.h"

static const na_dtype FLOATS[] = {NA_DTYPE_F32, NA_DTYPE_F64};
#define FOR_FLOATS(dt) \
    for (size_t dt##_i_ = 0, dt##_go_ = 1; dt##_i_ < 2; dt##_i_++, dt##_go_ = 1) \
        for (na_dtype dt = FLOATS[dt##_i_]; dt##_go_; dt##_go_ = 0)

/* Tolerances for results of transcendental math: a few ulps of the dtype. */
static double rtol_of(na_dtype dt) { return dt == NA_DTYPE_F64 ? 1e-13 : 4e-7; }
static double atol_of(na_dtype dt) { return dt == NA_DTYPE_F64 ? 1e-15 : 1e-7; }

/* "<what> (<dtype>)" in a rotating buffer. */
static const char *W(const char *what, na_dtype dt) {
    static char buf[8][128];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s (%s)", what, na_dtype_name(dt));
    return buf[k];
}

/* (not through TH_TENSOR: NA_SHAPE would expand into two arguments on the way) */
#define T(dt, ndim_shape, ...) th_tensor_cpu_((dt), ndim_shape, TH_V(__VA_ARGS__), TH_N(__VA_ARGS__))

static void expect_dtype(const na_tensor *t, na_dtype dt, const char *what) {
    cr_assert_not_null(t, "%s: NULL (%s)", what, na_last_error());
    cr_assert_eq(t->dtype, dt, "%s: dtype %s, expected %s", what, na_dtype_name(t->dtype),
                 na_dtype_name(dt));
}

/* ---- elementwise ops: the table's references ------------------------------------------ */

static na_tensor *lit_tensor(na_dtype dt, const oc_lit *l) {
    return th_tensor(dt, NA_DEVICE_CPU, l->ndim, l->shape, l->v);
}

/* Every reference of an elementwise row, in f32 and f64: output dtype, shape and values. */
static void forward_refs(const oc_case *c) {
    for (int r = 0; r < c->n_refs; r++) {
        const oc_ref *ref = &c->refs[r];
        const oc_lit *shape_of = ref->ref ? &ref->in[0] : &ref->out;
        char what[96];
        const char *name = na_op_name(oc_op_of(c));
        if (strcmp(ref->what, name)) snprintf(what, sizeof what, "%s %s", name, ref->what);
        else snprintf(what, sizeof what, "%s", name);
        double *want = malloc(sizeof(double) * (size_t)shape_of->n);
        for (int64_t i = 0; i < shape_of->n; i++)
            want[i] = ref->ref ? ref->ref(ref->in[0].v[i]) : ref->out.v[i];
        FOR_FLOATS(dt) {
            na_tensor *in[2] = {lit_tensor(dt, &ref->in[0]), NULL};
            if (c->kind == OC_BINARY) in[1] = lit_tensor(dt, &ref->in[1]);
            na_tensor *y = TH_OK(oc_call(c, in, ref->args));
            expect_dtype(y, dt, W(what, dt));
            th_expect_shape(y, shape_of->ndim, shape_of->shape, W(what, dt));
            th_expect(y, want, shape_of->n, ref->rounded ? atol_of(dt) : 0,
                      ref->rounded ? rtol_of(dt) : 0, W(what, dt));
        }
        free(want);
    }
}

/* Beyond the references: views as inputs and the promotion of mixed dtypes. */
void fw_add(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *a = T(dt, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
        na_tensor *y = TH_OK(na_add(TH_OK(na_transpose(a, 0, 1)), T(dt, NA_SHAPE(2), 100, 200)));
        TH_EXPECT(y, 0, 0, W("add of a transposed view", dt), 101, 204, 102, 205, 103, 206);
    }
    /* mixed float dtypes promote to the wider one */
    na_tensor *y = TH_OK(na_add(T(NA_DTYPE_F32, NA_SHAPE(1), 1), T(NA_DTYPE_F64, NA_SHAPE(1), 2)));
    expect_dtype(y, NA_DTYPE_F64, "add f32+f64");
    y = TH_OK(na_add(T(NA_DTYPE_F16, NA_SHAPE(1), 1), T(NA_DTYPE_BF16, NA_SHAPE(1), 2)));
    expect_dtype(y, NA_DTYPE_F32, "add f16+bf16");
    TH_EXPECT(y, 0, 0, "add f16+bf16", 3);
}

void fw_neg(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) cr_assert(signbit(na_get(TH_OK(na_neg(T(dt, NA_SHAPE(1), 0))), 0)),
                             "%s: neg(0) must be -0", W("neg", dt));
}

/* ---- matrix products ------------------------------------------------------------------------ */

void fw_matmul(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *a = T(dt, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
        na_tensor *b = T(dt, NA_SHAPE(3, 2), 7, 8, 9, 10, 11, 12);
        na_tensor *y = TH_OK(na_matmul(a, b));
        th_expect_shape(y, NA_SHAPE(2, 2), W("matmul 2x3 @ 3x2", dt));
        TH_EXPECT(y, 0, 0, W("matmul 2x3 @ 3x2", dt), 58, 64, 139, 154);
        /* the same product from transposed views */
        na_tensor *at = T(dt, NA_SHAPE(3, 2), 1, 4, 2, 5, 3, 6), *bt = T(dt, NA_SHAPE(2, 3), 7, 9, 11, 8, 10, 12);
        y = TH_OK(na_matmul(TH_OK(na_transpose(at, 0, 1)), TH_OK(na_transpose(bt, 0, 1))));
        TH_EXPECT(y, 0, 0, W("matmul of transposed views", dt), 58, 64, 139, 154);
        /* batched [2,2,2] @ shared [2,2] */
        na_tensor *ab = T(dt, NA_SHAPE(2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8);
        na_tensor *s = T(dt, NA_SHAPE(2, 2), 1, 0, 1, 1);
        y = TH_OK(na_matmul(ab, s));
        th_expect_shape(y, NA_SHAPE(2, 2, 2), W("matmul batched @ shared", dt));
        TH_EXPECT(y, 0, 0, W("matmul batched @ shared", dt), 3, 2, 7, 4, 11, 6, 15, 8);
        /* shared [2,2] @ batched [2,2,2] */
        y = TH_OK(na_matmul(s, ab));
        TH_EXPECT(y, 0, 0, W("matmul shared @ batched", dt), 1, 2, 4, 6, 5, 6, 12, 14);
        /* batched @ batched */
        na_tensor *bb = T(dt, NA_SHAPE(2, 2, 1), 1, -1, 2, 0.5);
        y = TH_OK(na_matmul(ab, bb));
        th_expect_shape(y, NA_SHAPE(2, 2, 1), W("matmul batched @ batched", dt));
        TH_EXPECT(y, 0, 0, W("matmul batched @ batched", dt), -1, -1, 13, 18);
    }
}

void fw_linear(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
        na_tensor *w = T(dt, NA_SHAPE(2, 3), 1, 0, -1, 0.5, 0.5, 0.5);
        na_tensor *b = T(dt, NA_SHAPE(2), 10, -1);
        na_tensor *y = TH_OK(na_linear(x, w, b));
        th_expect_shape(y, NA_SHAPE(2, 2), W("linear", dt));
        TH_EXPECT(y, 0, 0, W("linear with bias", dt), 8, 2, 8, 6.5);
        TH_EXPECT(TH_OK(na_linear(x, w, NULL)), 0, 0, W("linear without bias", dt), -2, 3, -2, 7.5);
        /* 3-d input [1, 2, 3] */
        y = TH_OK(na_linear(TH_OK(na_reshape(x, NA_SHAPE(1, 2, 3))), w, b));
        th_expect_shape(y, NA_SHAPE(1, 2, 2), W("linear 3-d", dt));
        TH_EXPECT(y, 0, 0, W("linear 3-d", dt), 8, 2, 8, 6.5);
    }
}

/* ---- reductions ---------------------------------------------------------------------------- */

void fw_sum(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
        na_tensor *y = TH_OK(na_sum(x));
        th_expect_shape(y, 0, NULL, W("sum all", dt));
        TH_EXPECT(y, 0, 0, W("sum all", dt), 21);
        y = TH_OK(na_sum_dim(x, 0, false));
        th_expect_shape(y, NA_SHAPE(3), W("sum dim 0", dt));
        TH_EXPECT(y, 0, 0, W("sum dim 0", dt), 5, 7, 9);
        y = TH_OK(na_sum_dim(x, 1, true));
        th_expect_shape(y, NA_SHAPE(2, 1), W("sum dim 1 keepdim", dt));
        TH_EXPECT(y, 0, 0, W("sum dim 1 keepdim", dt), 6, 15);
        TH_EXPECT(TH_OK(na_sum_dim(x, -1, false)), 0, 0, W("sum dim -1", dt), 6, 15);
        /* over a transposed view */
        TH_EXPECT(TH_OK(na_sum_dim(TH_OK(na_transpose(x, 0, 1)), 1, false)), 0, 0,
                  W("sum of a transposed view", dt), 5, 7, 9);
    }
}
void fw_mean(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
        TH_EXPECT(TH_OK(na_mean(x)), 0, 0, W("mean all", dt), 3.5);
        TH_EXPECT(TH_OK(na_mean_dim(x, 0, false)), 0, 0, W("mean dim 0", dt), 2.5, 3.5, 4.5);
        na_tensor *y = TH_OK(na_mean_dim(x, 1, true));
        th_expect_shape(y, NA_SHAPE(2, 1), W("mean dim 1 keepdim", dt));
        TH_EXPECT(y, 0, 0, W("mean dim 1 keepdim", dt), 2, 5);
    }
}
void fw_max(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 1, 5, 3, 4, 2, 6);
        TH_EXPECT(TH_OK(na_max(x)), 0, 0, W("max all", dt), 6);
        TH_EXPECT(TH_OK(na_max_dim(x, 1, false)), 0, 0, W("max dim 1", dt), 5, 6);
        na_tensor *y = TH_OK(na_max_dim(x, 0, true));
        th_expect_shape(y, NA_SHAPE(1, 3), W("max dim 0 keepdim", dt));
        TH_EXPECT(y, 0, 0, W("max dim 0 keepdim", dt), 4, 5, 6);
        TH_EXPECT(TH_OK(na_max(T(dt, NA_SHAPE(3), -3, -1, -2))), 0, 0, W("max of negatives", dt), -1);
    }
}
void fw_argmax(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 1, 5, 3, 4, 2, 6);
        na_tensor *i = TH_OK(na_argmax(x, 1, false));
        expect_dtype(i, NA_DTYPE_I32, W("argmax", dt));
        TH_EXPECT(i, 0, 0, W("argmax dim 1", dt), 1, 2);
        TH_EXPECT(TH_OK(na_argmax(x, 0, false)), 0, 0, W("argmax dim 0", dt), 1, 0, 1);
        i = TH_OK(na_argmax(T(dt, NA_SHAPE(2, 3), 3, 3, 1, 0, 2, 2), -1, true));
        th_expect_shape(i, NA_SHAPE(2, 1), W("argmax keepdim", dt));
        TH_EXPECT(i, 0, 0, W("argmax ties take the first", dt), 0, 1);
    }
}

/* ---- softmax and losses ---------------------------------------------------------------------- */

void fw_softmax(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        /* the second row is the first shifted by 1000: a stable softmax gives the same */
        na_tensor *y = TH_OK(na_softmax(T(dt, NA_SHAPE(2, 3), 1, 2, 3, 1001, 1002, 1003)));
        TH_EXPECT(y, atol_of(dt), rtol_of(dt), W("softmax [1,2,3]", dt), 0.09003057317038046,
                  0.24472847105479764, 0.6652409557748219, 0.09003057317038046,
                  0.24472847105479764, 0.6652409557748219);
    }
}
void fw_log_softmax(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *y = TH_OK(na_log_softmax(T(dt, NA_SHAPE(2, 3), 1, 2, 3, -1000, -1001, -1002)));
        TH_EXPECT(y, atol_of(dt), rtol_of(dt), W("log_softmax", dt), -2.4076059644443806,
                  -1.4076059644443806, -0.4076059644443806, -0.4076059644443806,
                  -1.4076059644443806, -2.4076059644443806);
    }
}

/* Reference cross-entropy of one row: lse - sum_c q_c x_c, q = (1-e) onehot + e/C. */
static double ref_ce_row(const double *x, int c, int label, double e) {
    double m = x[0];
    for (int i = 1; i < c; i++) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < c; i++) s += exp(x[i] - m);
    double lse = m + log(s), loss = 0;
    for (int i = 0; i < c; i++) loss -= ((i == label ? 1 - e : 0) + e / c) * (x[i] - lse);
    return loss;
}

void fw_cross_entropy(const oc_case *row) {
    (void)row;
    static const double x[] = {1, 2, 3, 1, 0, -1};
    FOR_FLOATS(dt) {
        na_tensor *logits = th_tensor(dt, NA_DEVICE_CPU, NA_SHAPE(2, 3), x);
        na_tensor *labels = T(NA_DTYPE_I32, NA_SHAPE(2), 2, 0);
        for (int s = 0; s < 2; s++) {
            double e = s ? 0.1 : 0.0;
            double l0 = ref_ce_row(x, 3, 2, e), l1 = ref_ce_row(x + 3, 3, 0, e);
            if (!s) /* -log softmax([1,2,3])[2] by hand */
                cr_assert(fabs(l0 - 0.4076059644443806) < 1e-15, "reference CE row 0");
            char what[64];
            snprintf(what, sizeof what, "cross_entropy smoothing %g", e);
            na_cross_entropy_opts o = {NA_REDUCTION_NONE, e};
            na_tensor *y = TH_OK(na_cross_entropy(logits, labels, &o));
            expect_dtype(y, dt, W(what, dt));
            th_expect_shape(y, NA_SHAPE(2), W(what, dt));
            TH_EXPECT(y, atol_of(dt), rtol_of(dt), W(what, dt), l0, l1);
            o.reduction = NA_REDUCTION_SUM;
            y = TH_OK(na_cross_entropy(logits, labels, &o));
            th_expect_shape(y, 0, NULL, W(what, dt));
            TH_EXPECT(y, atol_of(dt), rtol_of(dt), W(what, dt), l0 + l1);
            o.reduction = NA_REDUCTION_MEAN;
            TH_EXPECT(TH_OK(na_cross_entropy(logits, labels, &o)), atol_of(dt), rtol_of(dt),
                      W(what, dt), (l0 + l1) / 2);
        }
        /* NULL opts: mean, no smoothing */
        TH_EXPECT(TH_OK(na_cross_entropy(logits, labels, NULL)), atol_of(dt), rtol_of(dt),
                  W("cross_entropy default opts", dt),
                  (ref_ce_row(x, 3, 2, 0) + ref_ce_row(x + 3, 3, 0, 0)) / 2);
    }
}

void fw_mse_loss(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *a = T(dt, NA_SHAPE(3), 1, 2, 3), *b = T(dt, NA_SHAPE(3), 1.5, 2, 1);
        TH_EXPECT(TH_OK(na_mse_loss(a, b, NA_REDUCTION_NONE)), 0, 0, W("mse none", dt), 0.25, 0, 4);
        TH_EXPECT(TH_OK(na_mse_loss(a, b, NA_REDUCTION_SUM)), 0, 0, W("mse sum", dt), 4.25);
        TH_EXPECT(TH_OK(na_mse_loss(a, b, NA_REDUCTION_MEAN)), atol_of(dt), rtol_of(dt),
                  W("mse mean", dt), 4.25 / 3);
    }
}

/* ---- misc -------------------------------------------------------------------------------- */

void fw_dropout(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        const int64_t n = 4096;
        const double p = 0.25;
        na_manual_seed(1234);
        na_tensor *x = TH_OK(na_ones(dt, NA_DEVICE_CPU, NA_SHAPE(n)));
        na_tensor *y = TH_OK(na_dropout(x, p, true));
        int zeros = 0;
        double keep = dt == NA_DTYPE_F32 ? (double)(float)(1 / (1 - p)) : 1 / (1 - p);
        for (int64_t i = 0; i < n; i++) {
            double v = na_get(y, i);
            cr_assert(v == 0 || v == keep, "%s: element %" PRId64 " is %g, expected 0 or %g",
                      W("dropout", dt), i, v, keep);
            zeros += v == 0;
        }
        /* binomial(4096, 0.25): mean 1024, sd 27.7; +-7 sd */
        cr_assert(zeros > 1024 - 194 && zeros < 1024 + 194, "%s: %d zeros of 4096 at p = 0.25",
                  W("dropout", dt), zeros);
        /* same seed -> same mask; the next call draws a different one */
        na_manual_seed(1234);
        na_tensor *y2 = TH_OK(na_dropout(x, p, true)), *y3 = TH_OK(na_dropout(x, p, true));
        int same = 0;
        for (int64_t i = 0; i < n; i++) {
            cr_assert_eq(na_get(y2, i), na_get(y, i), "%s: same seed, different mask", W("dropout", dt));
            same += na_get(y3, i) == na_get(y, i);
        }
        cr_assert(same < n, "%s: consecutive calls gave the same mask", W("dropout", dt));
        /* eval and p = 0 are the identity (the very tensor) */
        cr_assert_eq(na_dropout(x, p, false), x, "dropout in eval must return its input");
        cr_assert_eq(na_dropout(x, 0.0, true), x, "dropout with p = 0 must return its input");
        /* scaling: 2 * 1/(1-0.5) */
        na_manual_seed(7);
        y = TH_OK(na_dropout(TH_OK(na_full(dt, NA_DEVICE_CPU, NA_SHAPE(64), 2.0)), 0.5, true));
        for (int i = 0; i < 64; i++)
            cr_assert(na_get(y, i) == 0 || na_get(y, i) == 4, "%s: 2 dropped at p=0.5 gives %g",
                      W("dropout", dt), na_get(y, i));
    }
}

void fw_cast(const oc_case *row) {
    (void)row;
    /* f32 -> f16: ties to even, overflow to inf, underflow to signed zero */
    na_tensor *x = T(NA_DTYPE_F32, NA_SHAPE(7), 1 + 0x1p-11, 1 + 3 * 0x1p-11, 65520, 65519, -1e-8, 0.1, -2.5);
    na_tensor *h = TH_OK(na_cast(x, NA_DTYPE_F16));
    expect_dtype(h, NA_DTYPE_F16, "cast f32->f16");
    TH_EXPECT(h, 0, 0, "cast f32->f16", 1, 1 + 0x1p-9, INFINITY, 65504, -0.0, 0.0999755859375, -2.5);
    cr_assert(signbit(na_get(h, 4)), "cast f32->f16: -1e-8 must become -0");
    /* and back exactly */
    na_tensor *back = TH_OK(na_cast(h, NA_DTYPE_F32));
    expect_dtype(back, NA_DTYPE_F32, "cast f16->f32");
    TH_EXPECT(back, 0, 0, "cast f16->f32", 1, 1 + 0x1p-9, INFINITY, 65504, -0.0, 0.0999755859375, -2.5);
    /* f32 -> bf16 */
    na_tensor *xb = T(NA_DTYPE_F32, NA_SHAPE(4), 1 + 0x1p-8, 1 + 3 * 0x1p-8, 0.1, 3.4028234663852886e38); /* FLT_MAX rounds up to inf in bf16 */
    na_tensor *b = TH_OK(na_cast(xb, NA_DTYPE_BF16));
    TH_EXPECT(b, 0, 0, "cast f32->bf16", 1, 1 + 0x1p-6, 0.10009765625, INFINITY);
    /* f64 -> f32 rounds to nearest */
    na_tensor *d = T(NA_DTYPE_F64, NA_SHAPE(2), 1 + 0x1p-24, 1 + 3 * 0x1p-24);
    TH_EXPECT(TH_OK(na_cast(d, NA_DTYPE_F32)), 0, 0, "cast f64->f32", 1, 1 + 0x1p-22);
    /* float <-> int on integral values */
    na_tensor *i = TH_OK(na_cast(T(NA_DTYPE_F32, NA_SHAPE(3), 3, -2, 0), NA_DTYPE_I32));
    expect_dtype(i, NA_DTYPE_I32, "cast f32->i32");
    TH_EXPECT(i, 0, 0, "cast f32->i32", 3, -2, 0);
    TH_EXPECT(TH_OK(na_cast(T(NA_DTYPE_U8, NA_SHAPE(2), 200, 7), NA_DTYPE_F32)), 0, 0, "cast u8->f32", 200, 7);
    /* same dtype: the very tensor */
    cr_assert_eq(na_cast(x, NA_DTYPE_F32), x, "cast to the same dtype must return its input");
    /* a strided view casts in C order */
    na_tensor *v = TH_OK(na_transpose(T(NA_DTYPE_F32, NA_SHAPE(2, 2), 1, 2, 3, 4), 0, 1));
    TH_EXPECT(TH_OK(na_cast(v, NA_DTYPE_F64)), 0, 0, "cast of a view", 1, 3, 2, 4);
}

void fw_to_device(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 2), 1, 2, 3, 4);
        na_tensor *y = TH_OK(na_to_device(x, NA_DEVICE_CPU));
        cr_assert_eq(y->device, NA_DEVICE_CPU);
        cr_assert_neq(y->data, x->data, "to_device makes a copy");
        th_expect_shape(y, NA_SHAPE(2, 2), W("to_device", dt));
        TH_EXPECT(y, 0, 0, W("to_device", dt), 1, 2, 3, 4);
        y = TH_OK(na_to_device(TH_OK(na_transpose(x, 0, 1)), NA_DEVICE_CPU));
        TH_EXPECT(y, 0, 0, W("to_device of a view", dt), 1, 3, 2, 4);
    }
    na_tensor *l = TH_OK(na_to_device(T(NA_DTYPE_I32, NA_SHAPE(2), 5, -6), NA_DEVICE_CPU));
    TH_EXPECT(l, 0, 0, "to_device i32", 5, -6);
}

/* ---- views --------------------------------------------------------------------------------- */

void fw_reshape(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 0, 1, 2, 3, 4, 5);
        na_tensor *y = TH_OK(na_reshape(x, NA_SHAPE(3, -1)));
        th_expect_shape(y, NA_SHAPE(3, 2), W("reshape [3, -1]", dt));
        cr_assert_eq(y->data, x->data, "reshape of a contiguous tensor is a view");
        TH_EXPECT(y, 0, 0, W("reshape", dt), 0, 1, 2, 3, 4, 5);
        y = TH_OK(na_reshape(TH_OK(na_transpose(x, 0, 1)), NA_SHAPE(-1)));
        TH_EXPECT(y, 0, 0, W("reshape of a transposed view", dt), 0, 3, 1, 4, 2, 5);
        y = TH_OK(na_flatten(TH_OK(na_reshape(x, NA_SHAPE(1, 2, 3))), 1));
        th_expect_shape(y, NA_SHAPE(1, 6), W("flatten", dt));
    }
}

void fw_permute(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = TH_OK(na_reshape(TH_OK(na_arange(dt, NA_DEVICE_CPU, 0, 24, 1)), NA_SHAPE(2, 3, 4)));
        na_tensor *y = TH_OK(na_permute(x, (const int[]){2, 0, 1}));
        th_expect_shape(y, NA_SHAPE(4, 2, 3), W("permute (2,0,1)", dt));
        cr_assert_eq(y->data, x->data, "permute is a view");
        double want[24];
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++) want[(k * 2 + i) * 3 + j] = i * 12 + j * 4 + k;
        th_expect(y, want, 24, 0, 0, W("permute (2,0,1)", dt));
        na_tensor *t = TH_OK(na_transpose(x, 0, -1));
        th_expect_shape(t, NA_SHAPE(4, 3, 2), W("transpose(0, -1)", dt));
        TH_EXPECT(TH_OK(na_slice(t, 1, 2)), 0, 0, W("transpose(0,-1)[1]", dt), 1, 13, 5, 17, 9, 21);
    }
}

void fw_slice(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = TH_OK(na_reshape(TH_OK(na_arange(dt, NA_DEVICE_CPU, 0, 12, 1)), NA_SHAPE(4, 3)));
        na_tensor *y = TH_OK(na_slice(x, 1, 3));
        th_expect_shape(y, NA_SHAPE(2, 3), W("slice [1,3)", dt));
        TH_EXPECT(y, 0, 0, W("slice [1,3)", dt), 3, 4, 5, 6, 7, 8);
        th_expect_shape(TH_OK(na_slice(x, 2, 2)), NA_SHAPE(0, 3), W("empty slice", dt));
        /* slice of a transposed view: columns 1..2 of x */
        y = TH_OK(na_slice(TH_OK(na_transpose(x, 0, 1)), 1, 3));
        TH_EXPECT(y, 0, 0, W("slice of a transposed view", dt), 1, 4, 7, 10, 2, 5, 8, 11);
    }
}

/* na_to_channels_last: the same values, the memory in N, H, W, C order; back with
 * na_contiguous */
static void channels_last_round_trip(na_dtype dt) {
    na_tensor *x = T(dt, NA_SHAPE(1, 2, 2, 3), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    cr_assert(!na_is_channels_last(x) && na_memory_format_of(x) == NA_FORMAT_CONTIGUOUS);
    na_tensor *cl = TH_OK(na_to_channels_last(x));
    cr_assert(na_is_channels_last(cl) && na_memory_format_of(cl) == NA_FORMAT_CHANNELS_LAST);
    cr_assert_eq(na_to_channels_last(cl), cl, "channels-last of a channels-last tensor is itself");
    TH_EXPECT(cl, 0, 0, W("channels-last", dt), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    if (dt == NA_DTYPE_F64) { /* the memory: channel 0's and channel 1's value of each pixel */
        static const double order[12] = {0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11};
        const double *mem = cl->data;
        for (int i = 0; i < 12; i++) cr_assert_eq(mem[i], order[i], "channels-last memory order");
    }
    na_tensor *back = TH_OK(na_contiguous(cl));
    cr_assert(na_is_contiguous(back));
    TH_EXPECT(back, 0, 0, W("back to contiguous", dt), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    /* C == 1 is both formats (the same memory): it reads as contiguous */
    na_tensor *one = TH_OK(na_to_channels_last(T(dt, NA_SHAPE(2, 1, 1, 2), 1, 2, 3, 4)));
    cr_assert(na_is_channels_last(one) && na_is_contiguous(one));
    cr_assert_eq(na_memory_format_of(one), NA_FORMAT_CONTIGUOUS);
    TH_EXPECT_ERROR(na_to_channels_last(T(dt, NA_SHAPE(2, 3), 0, 1, 2, 3, 4, 5)), NA_ESHAPE,
                    "4 dims");
}

void fw_contiguous(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        channels_last_round_trip(dt);
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 0, 1, 2, 3, 4, 5);
        cr_assert_eq(na_contiguous(x), x, "contiguous of a contiguous tensor is itself");
        na_tensor *t = TH_OK(na_transpose(x, 0, 1));
        cr_assert(!na_is_contiguous(t));
        na_tensor *c = TH_OK(na_contiguous(t));
        cr_assert(na_is_contiguous(c));
        cr_assert_neq(c->data, x->data);
        if (dt == NA_DTYPE_F64) { /* the memory itself is in C order */
            static const double order[6] = {0, 3, 1, 4, 2, 5};
            const double *mem = c->data;
            for (int i = 0; i < 6; i++) cr_assert_eq(mem[i], order[i], "contiguous memory order");
        }
        TH_EXPECT(c, 0, 0, W("contiguous", dt), 0, 3, 1, 4, 2, 5);
    }
}

/* na_pad_dim: zeros around one dim, by hand; the input's memory format kept */
void fw_pad(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
        na_tensor *p = TH_OK(na_pad_dim(x, 1, 1, 2));
        cr_assert(p->shape[0] == 2 && p->shape[1] == 6);
        TH_EXPECT(p, 0, 0, W("pad dim 1 (1, 2)", dt), 0, 1, 2, 3, 0, 0, 0, 4, 5, 6, 0, 0);
        p = TH_OK(na_pad_dim(x, 0, 0, 1));
        TH_EXPECT(p, 0, 0, W("pad dim 0 (0, 1)", dt), 1, 2, 3, 4, 5, 6, 0, 0, 0);
        p = TH_OK(na_pad_dim(TH_OK(na_transpose(x, 0, 1)), -1, 1, 0)); /* a view, dim -1 */
        TH_EXPECT(p, 0, 0, W("pad of a transposed view", dt), 0, 1, 4, 0, 2, 5, 0, 3, 6);
        /* channels: [1, 2, 1, 2] channels-last -> [1, 4, 1, 2], still channels-last */
        na_tensor *cl = TH_OK(na_to_channels_last(T(dt, NA_SHAPE(1, 2, 1, 2), 1, 2, 3, 4)));
        p = TH_OK(na_pad_dim(cl, 1, 0, 2));
        cr_assert_eq(na_memory_format_of(p), NA_FORMAT_CHANNELS_LAST, "pad keeps channels-last");
        TH_EXPECT(p, 0, 0, W("pad channels of channels-last", dt), 1, 2, 3, 4, 0, 0, 0, 0);
        TH_EXPECT_ERROR(na_pad_dim(x, 1, -1, 0), NA_EINVAL, ">= 0");
        TH_EXPECT_ERROR(na_pad_dim(x, 2, 1, 0), NA_EINVAL, "dim");
    }
}

/* ---- convolution and pooling ------------------------------------------------------------- */

/* Direct convolution by the definition (double). */
static void ref_conv2d(const double *x, const double *w, const double *b, int n, int c, int h,
                       int wd, int co, int kh, int kw, na_conv2d_opts o, double *y, int *oh,
                       int *ow) {
    int g = o.groups ? o.groups : 1, sh = o.stride[0] ? o.stride[0] : 1,
        sw = o.stride[1] ? o.stride[1] : 1, dh = o.dilation[0] ? o.dilation[0] : 1,
        dw = o.dilation[1] ? o.dilation[1] : 1, ph = o.padding[0], pw = o.padding[1];
    *oh = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
    *ow = (wd + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
    int cg = c / g, cog = co / g;
    for (int ni = 0; ni < n; ni++)
        for (int oc = 0; oc < co; oc++)
            for (int oy = 0; oy < *oh; oy++)
                for (int ox = 0; ox < *ow; ox++) {
                    double s = b ? b[oc] : 0;
                    int grp = oc / cog;
                    for (int ic = 0; ic < cg; ic++)
                        for (int i = 0; i < kh; i++)
                            for (int j = 0; j < kw; j++) {
                                int iy = oy * sh - ph + i * dh, ix = ox * sw - pw + j * dw;
                                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                                s += w[((oc * cg + ic) * kh + i) * kw + j] *
                                     x[((ni * c + grp * cg + ic) * h + iy) * wd + ix];
                            }
                    y[((ni * co + oc) * *oh + oy) * *ow + ox] = s;
                }
}

void fw_conv2d(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        /* one channel, 3x3 input 1..9 */
        na_tensor *x = T(dt, NA_SHAPE(1, 1, 3, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9);
        na_tensor *w = T(dt, NA_SHAPE(1, 1, 2, 2), 1, 2, 3, 4);
        na_tensor *y = TH_OK(na_conv2d(x, w, T(dt, NA_SHAPE(1), 1), NULL));
        th_expect_shape(y, NA_SHAPE(1, 1, 2, 2), W("conv 2x2", dt));
        /* 1*1+2*2+3*4+4*5 + 1 = 38, ... */
        TH_EXPECT(y, 0, 0, W("conv 2x2 + bias", dt), 38, 48, 68, 78);
        na_tensor *ones = TH_OK(na_ones(dt, NA_DEVICE_CPU, NA_SHAPE(1, 1, 3, 3)));
        na_conv2d_opts pad = {.padding = {1, 1}};
        y = TH_OK(na_conv2d(x, ones, NULL, &pad));
        TH_EXPECT(y, 0, 0, W("conv 3x3 ones, padding 1", dt), 12, 21, 16, 27, 45, 33, 24, 39, 28);
        na_conv2d_opts pad_s2 = {.stride = {2, 2}, .padding = {1, 1}};
        TH_EXPECT(TH_OK(na_conv2d(x, ones, NULL, &pad_s2)), 0, 0, W("conv stride 2, padding 1", dt),
                  12, 16, 24, 28);
        /* groups: channel k scaled by w[k] */
        na_tensor *x2 = T(dt, NA_SHAPE(1, 2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8);
        na_conv2d_opts g2 = {.groups = 2};
        TH_EXPECT(TH_OK(na_conv2d(x2, T(dt, NA_SHAPE(2, 1, 1, 1), 2, 3), NULL, &g2)), 0, 0,
                  W("conv groups 2", dt), 2, 4, 6, 8, 15, 18, 21, 24);
        TH_EXPECT(TH_OK(na_conv2d(x2, T(dt, NA_SHAPE(2, 2, 1, 1), 1, 1, 1, -1), NULL, NULL)), 0, 0,
                  W("conv 1x1 mixing channels", dt), 6, 8, 10, 12, -4, -4, -4, -4);
        /* everything at once against the direct definition */
        enum { N = 2, C = 4, H = 6, WD = 5, CO = 4, KH = 3, KW = 2 };
        double xv[N * C * H * WD], wv[CO * (C / 2) * KH * KW], bv[CO], ref[N * CO * H * WD];
        for (int i = 0; i < N * C * H * WD; i++) xv[i] = (double)((i * 7) % 11) - 5;
        for (int i = 0; i < CO * (C / 2) * KH * KW; i++) wv[i] = (double)((i * 5) % 7) - 3;
        for (int i = 0; i < CO; i++) bv[i] = i - 1.5;
        na_conv2d_opts all = {.stride = {2, 1}, .padding = {1, 1}, .dilation = {1, 2}, .groups = 2};
        int oh, ow;
        ref_conv2d(xv, wv, bv, N, C, H, WD, CO, KH, KW, all, ref, &oh, &ow);
        y = TH_OK(na_conv2d(th_tensor(dt, NA_DEVICE_CPU, NA_SHAPE(N, C, H, WD), xv),
                            th_tensor(dt, NA_DEVICE_CPU, NA_SHAPE(CO, C / 2, KH, KW), wv),
                            th_tensor(dt, NA_DEVICE_CPU, NA_SHAPE(CO), bv), &all));
        th_expect_shape(y, NA_SHAPE(N, CO, oh, ow), W("conv stride/pad/dilation/groups", dt));
        th_expect(y, ref, N * CO * oh * ow, 0, 0, W("conv stride/pad/dilation/groups vs direct", dt));
    }
}

/* 4x4 input used by the pooling tests */
#define POOL_X 1, 2, 5, 3, 4, 0, 1, 2, 7, 8, 2, 1, 3, 9, 4, 6

void fw_max_pool2d(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(1, 1, 4, 4), POOL_X);
        na_pool2d_opts k2 = {.kernel = {2, 2}};
        na_tensor *y = TH_OK(na_max_pool2d(x, &k2));
        th_expect_shape(y, NA_SHAPE(1, 1, 2, 2), W("max_pool 2x2", dt));
        TH_EXPECT(y, 0, 0, W("max_pool 2x2", dt), 4, 5, 9, 6);
        na_pool2d_opts k3 = {{3, 3}, {2, 2}, {1, 1}, true};
        TH_EXPECT(TH_OK(na_max_pool2d(x, &k3)), 0, 0, W("max_pool 3x3 s2 p1", dt), 4, 5, 9, 9);
        /* negative values: padding must not count as 0 */
        na_tensor *neg = TH_OK(na_add_scalar(x, -100));
        TH_EXPECT(TH_OK(na_max_pool2d(neg, &k3)), 0, 0, W("max_pool with padding, negatives", dt),
                  -96, -95, -91, -91);
        TH_EXPECT(TH_OK(na_global_max_pool2d(x)), 0, 0, W("global max pool", dt), 9);
    }
}

void fw_avg_pool2d(const oc_case *row) {
    (void)row;
    FOR_FLOATS(dt) {
        na_tensor *x = T(dt, NA_SHAPE(1, 1, 4, 4), POOL_X);
        na_pool2d_opts k2 = {.kernel = {2, 2}};
        TH_EXPECT(TH_OK(na_avg_pool2d(x, &k2)), 0, 0, W("avg_pool 2x2", dt), 1.75, 2.75, 6.75, 3.25);
        na_pool2d_opts inc = {{3, 3}, {2, 2}, {1, 1}, true}, exc = {{3, 3}, {2, 2}, {1, 1}, false};
        TH_EXPECT(TH_OK(na_avg_pool2d(x, &inc)), atol_of(dt), rtol_of(dt),
                  W("avg_pool 3x3 s2 p1 count_include_pad", dt), 7.0 / 9, 13.0 / 9, 31.0 / 9, 33.0 / 9);
        TH_EXPECT(TH_OK(na_avg_pool2d(x, &exc)), atol_of(dt), rtol_of(dt),
                  W("avg_pool 3x3 s2 p1 exclude pad", dt), 7.0 / 4, 13.0 / 6, 31.0 / 6, 33.0 / 9);
        TH_EXPECT(TH_OK(na_global_avg_pool2d(x)), 0, 0, W("global avg pool", dt), 58.0 / 16);
    }
}

/* ---- batch norm ---------------------------------------------------------------------------- */

typedef na_tensor *(*bn_fn)(na_tensor *, na_tensor *, na_tensor *, na_tensor *, na_tensor *,
                            bool, double, double);

/* batch_norm, and batch_norm_relu (the row's op) against relu of the same references */
void fw_batch_norm(const oc_case *row) {
    bool relu = oc_op_of(row) == NA_OP_BATCH_NORM_RELU;
    bn_fn bn = relu ? na_batch_norm_relu : na_batch_norm;
#define BN_WANT(v) (relu && (v) < 0 ? 0 : (v))
    const double eps = 1e-5, m = 0.1;
    FOR_FLOATS(dt) {
        double tol = dt == NA_DTYPE_F64 ? 1e-12 : 2e-6;
        /* x [4, 2]: channel 0 = 1,2,3,4 (mean 2.5, biased var 1.25, unbiased 5/3);
         * channel 1 = 2,4,6,8 (mean 5, biased var 5, unbiased 20/3) */
        na_tensor *x = T(dt, NA_SHAPE(4, 2), 1, 2, 2, 4, 3, 6, 4, 8);
        na_tensor *w = T(dt, NA_SHAPE(2), 2, 0.5), *b = T(dt, NA_SHAPE(2), 0.5, -1);
        na_tensor *rm = T(dt, NA_SHAPE(2), 0, 0), *rv = T(dt, NA_SHAPE(2), 1, 1);
        na_tensor *y = TH_OK(bn(x, rm, rv, w, b, true, m, eps));
        expect_dtype(y, dt, W("batch_norm train", dt));
        double mean[2] = {2.5, 5}, var[2] = {1.25, 5}, uvar[2] = {5.0 / 3, 20.0 / 3};
        double wv[2] = {2, 0.5}, bv[2] = {0.5, -1}, xv[8] = {1, 2, 2, 4, 3, 6, 4, 8}, want[8];
        for (int i = 0; i < 8; i++) {
            int c = i % 2;
            want[i] = BN_WANT((xv[i] - mean[c]) / sqrt(var[c] + eps) * wv[c] + bv[c]);
        }
        th_expect(y, want, 8, tol, tol, W("batch_norm train output", dt));
        /* running stats after one step: (1-m)*running + m*stat, unbiased variance */
        double rmw[2] = {m * mean[0], m * mean[1]};
        double rvw[2] = {(1 - m) + m * uvar[0], (1 - m) + m * uvar[1]};
        th_expect(rm, rmw, 2, tol, tol, W("batch_norm running_mean", dt));
        th_expect(rv, rvw, 2, tol, tol, W("batch_norm running_var (unbiased)", dt));
        /* eval uses the running statistics and leaves them alone */
        y = TH_OK(bn(x, rm, rv, w, b, false, m, eps));
        for (int i = 0; i < 8; i++) {
            int c = i % 2;
            want[i] = BN_WANT((xv[i] - rmw[c]) / sqrt(rvw[c] + eps) * wv[c] + bv[c]);
        }
        th_expect(y, want, 8, tol, tol, W("batch_norm eval output", dt));
        th_expect(rm, rmw, 2, tol, tol, W("batch_norm eval keeps running_mean", dt));
        th_expect(rv, rvw, 2, tol, tol, W("batch_norm eval keeps running_var", dt));
        /* [N, C, H, W] without affine and without running stats: 8 values of one channel */
        y = TH_OK(bn(T(dt, NA_SHAPE(2, 1, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8), NULL, NULL, NULL, NULL,
                     true, m, eps));
        for (int i = 0; i < 8; i++) want[i] = BN_WANT((i + 1 - 4.5) / sqrt(5.25 + eps));
        th_expect(y, want, 8, tol, tol, W("batch_norm train 4-d, no affine", dt));
    }
#undef BN_WANT
}

/* One BatchNorm (+ ReLU) step in f32 from fixed inputs: y, running stats, gx, gw, gb. */
enum { BNR_N = 8, BNR_C = 12, BNR_S = 1024 }; /* big enough for the pool to split channels */
typedef struct {
    na_tensor *out[6]; /* y, running_mean, running_var, gx, gweight, gbias */
} bn_step;
static na_tensor *bnr_rand(th_rng *r, int ndim, const int64_t *shape, double lo, double hi,
                           bool grad) {
    int64_t n = th_numel(ndim, shape);
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = th_rng_uniform(r, lo, hi);
    na_tensor *t = grad ? th_leaf(NA_DTYPE_F32, ndim, shape, v)
                        : th_tensor(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, v);
    free(v);
    return t;
}
static bn_step bn_relu_step(bool fused, bool training) {
    th_rng r = {1234};
    na_tensor *x = bnr_rand(&r, NA_SHAPE(BNR_N, BNR_C, BNR_S), -2, 2, true);
    na_tensor *gy = bnr_rand(&r, NA_SHAPE(BNR_N, BNR_C, BNR_S), -1, 1, false);
    na_tensor *w = bnr_rand(&r, NA_SHAPE(BNR_C), 0.5, 1.5, true);
    na_tensor *b = bnr_rand(&r, NA_SHAPE(BNR_C), -0.5, 0.5, true);
    na_tensor *rm = bnr_rand(&r, NA_SHAPE(BNR_C), -0.5, 0.5, false);
    na_tensor *rv = bnr_rand(&r, NA_SHAPE(BNR_C), 0.5, 2, false);
    na_tensor *y = fused ? TH_OK(na_batch_norm_relu(x, rm, rv, w, b, training, 0.1, 1e-5))
                         : TH_OK(na_relu(TH_OK(na_batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5))));
    TH_RC(na_backward(y, gy));
    return (bn_step){{y, rm, rv, x->grad, w->grad, b->grad}};
}

/* The fused op is the unfused pair, bit for bit in f32: forward, running statistics and every
 * gradient, in training and eval, whatever the thread count. */
Test(ops, batch_norm_relu_equals_batch_norm_then_relu_bitwise) {
    static const int threads[] = {1, 2, 4};
    static const char *names[6] = {"y", "running_mean", "running_var", "gx", "gweight", "gbias"};
    for (int t = 0; t < 3; t++)
        for (int training = 0; training < 2; training++) {
            TH_RC(na_set_num_threads(threads[t]));
            bn_step f = bn_relu_step(true, training), u = bn_relu_step(false, training);
            for (int i = 0; i < 6; i++) {
                cr_assert_not_null(f.out[i]);
                cr_assert_eq(f.out[i]->numel, u.out[i]->numel);
                cr_assert(!memcmp(f.out[i]->data, u.out[i]->data,
                                  (size_t)f.out[i]->numel * sizeof(float)),
                          "%s differs (threads %d, training %d)", names[i], threads[t], training);
            }
            int64_t cut = 0; /* the inputs reach ReLU's cut */
            for (int64_t i = 0; i < f.out[0]->numel; i++) cut += ((float *)f.out[0]->data)[i] == 0;
            cr_assert(cut > 0 && cut < f.out[0]->numel, "ReLU cut %lld values", (long long)cut);
            na_step_end();
        }
    TH_RC(na_set_num_threads(1));
}

/* ---- walking the table ------------------------------------------------------------------- */

Test(forward, every_op_has_a_forward_test) {
    oc_expect_every_op_has_a_row();
    for (int op = 0; op < NA_OP_COUNT; op++)
        if (oc_cases[op].kind == OC_CUSTOM)
            cr_expect_not_null(oc_cases[op].forward, "op %d (%s) has no forward check: name "
                               "one in its row (tests/op_cases.c) and write it in "
                               "tests/test_ops.c", op, na_op_name((na_op)op));
}

Test(forward, op_names_are_unique_and_set) {
    for (int a = 0; a < NA_OP_COUNT; a++) {
        cr_assert(na_op_name((na_op)a)[0] && strcmp(na_op_name((na_op)a), "?"),
                  "op %d has no name", a);
        for (int b = a + 1; b < NA_OP_COUNT; b++)
            cr_assert(strcmp(na_op_name((na_op)a), na_op_name((na_op)b)), "ops %d and %d share "
                      "the name %s", a, b, na_op_name((na_op)a));
    }
    cr_assert_str_eq(na_op_name(NA_OP_COUNT), "?");
    cr_assert_str_eq(na_op_name(NA_OP_CROSS_ENTROPY), "cross_entropy");
}

ParameterizedTestParameters(forward, op) {
    static int ops[NA_OP_COUNT];
    for (int i = 0; i < NA_OP_COUNT; i++) ops[i] = i;
    return cr_make_param_array(int, ops, NA_OP_COUNT);
}

ParameterizedTest(int *op, forward, op) {
    const oc_case *c = oc_case_of((na_op)*op);
    if (c->kind != OC_CUSTOM) forward_refs(c);
    else cr_assert_not_null(c->forward, "op %s has no forward check", na_op_name((na_op)*op));
    if (c->forward) c->forward(c);
}

/* ---- f16 / bf16 numerics -------------------------------------------------------------------- */

/* Sums of ones: an f16 accumulator stalls at 2048 (2048 + 1 rounds back to 2048), a bf16 one
 * at 256. f32 accumulation gives the exact count, which the result dtype holds exactly. */
Test(numerics, f16_sum_accumulates_in_f32) {
    na_tensor *x = TH_OK(na_ones(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(3000)));
    na_tensor *s = TH_OK(na_sum(x));
    TH_EXPECT(s, 0, 0, "sum of 3000 f16 ones", 3000);
    TH_EXPECT(TH_OK(na_mean(x)), 0, 0, "mean of 3000 f16 ones", 1);
    na_tensor *x2 = TH_OK(na_ones(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(2, 3000)));
    TH_EXPECT(TH_OK(na_sum_dim(x2, 1, false)), 0, 0, "sum over dim 1 of [2, 3000] f16 ones", 3000, 3000);
    na_tensor *x3 = TH_OK(na_ones(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(3000, 2)));
    TH_EXPECT(TH_OK(na_sum_dim(x3, 0, false)), 0, 0, "sum over dim 0 of [3000, 2] f16 ones", 3000, 3000);
}

Test(numerics, bf16_sum_accumulates_in_f32) {
    na_tensor *x = TH_OK(na_ones(NA_DTYPE_BF16, NA_DEVICE_CPU, NA_SHAPE(300)));
    TH_EXPECT(TH_OK(na_sum(x)), 0, 0, "sum of 300 bf16 ones", 300);
    na_tensor *x2 = TH_OK(na_ones(NA_DTYPE_BF16, NA_DEVICE_CPU, NA_SHAPE(2, 300)));
    TH_EXPECT(TH_OK(na_sum_dim(x2, -1, false)), 0, 0, "sum over dim 1 of bf16 ones", 300, 300);
}

Test(numerics, f16_matmul_accumulates_in_f32_and_rounds_once) {
    /* a dot product of 3000 ones: 3000 with f32 accumulation, 2048 with f16 */
    na_tensor *a = TH_OK(na_ones(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(2, 3000)));
    na_tensor *b = TH_OK(na_ones(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(3000, 1)));
    na_tensor *y = TH_OK(na_matmul(a, b));
    expect_dtype(y, NA_DTYPE_F16, "f16 matmul");
    TH_EXPECT(y, 0, 0, "f16 matmul, K = 3000", 3000, 3000);
    TH_EXPECT(TH_OK(na_linear(a, TH_OK(na_ones(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(1, 3000))), NULL)),
              0, 0, "f16 linear, K = 3000", 3000, 3000);
    /* small integers: exact sums 2049 and 2051 round (ties to even) to 2048 and 2052 */
    na_tensor *x = T(NA_DTYPE_F16, NA_SHAPE(2, 3), 2047, 1, 1, 2047, 2, 2);
    na_tensor *w = T(NA_DTYPE_F16, NA_SHAPE(3, 2), 1, 0, 1, 1, 1, 0);
    double exact[4] = {2049, 1, 2051, 2}, want[4];
    for (int i = 0; i < 4; i++) want[i] = th_round_f16(exact[i]);
    cr_assert(want[0] == 2048 && want[2] == 2052, "reference f16 rounding");
    th_expect_exact(TH_OK(na_matmul(x, w)), want, 4, "f16 matmul == round_f16(exact)");
}

Test(numerics, bf16_matmul_rounds_once_to_nearest_even) {
    /* exact 257 and 259: bf16 holds 256, 258, 260; ties go to 256 and 260 */
    na_tensor *x = T(NA_DTYPE_BF16, NA_SHAPE(2, 3), 255, 1, 1, 255, 2, 2);
    na_tensor *w = T(NA_DTYPE_BF16, NA_SHAPE(3, 2), 1, 0, 1, 1, 1, 0);
    double exact[4] = {257, 1, 259, 2}, want[4];
    for (int i = 0; i < 4; i++) want[i] = th_round_bf16(exact[i]);
    cr_assert(want[0] == 256 && want[2] == 260, "reference bf16 rounding");
    na_tensor *y = TH_OK(na_matmul(x, w));
    expect_dtype(y, NA_DTYPE_BF16, "bf16 matmul");
    th_expect_exact(y, want, 4, "bf16 matmul == round_bf16(exact)");
    /* 300 ones: 300 with f32 accumulation, 256 with bf16 */
    na_tensor *a = TH_OK(na_ones(NA_DTYPE_BF16, NA_DEVICE_CPU, NA_SHAPE(1, 300)));
    na_tensor *b = TH_OK(na_ones(NA_DTYPE_BF16, NA_DEVICE_CPU, NA_SHAPE(300, 1)));
    TH_EXPECT(TH_OK(na_matmul(a, b)), 0, 0, "bf16 matmul, K = 300", 300);
}

Test(numerics, half_elementwise_rounds_the_f32_result) {
    /* f16: 1 + 2^-11 is a tie -> 1; 1 + 3*2^-11 -> 1 + 2^-9; 60000 + 10000 overflows */
    na_tensor *a = T(NA_DTYPE_F16, NA_SHAPE(3), 1, 1, 60000);
    na_tensor *b = T(NA_DTYPE_F16, NA_SHAPE(3), 0x1p-11, 3 * 0x1p-11, 10000);
    na_tensor *y = TH_OK(na_add(a, b));
    expect_dtype(y, NA_DTYPE_F16, "f16 add");
    TH_EXPECT(y, 0, 0, "f16 add", 1, 1 + 0x1p-9, INFINITY);
    /* 3 * (1 + 2^-10) = 3 + 3*2^-10: a tie between 3 + 2^-9 and 3 + 2^-8 -> even */
    double want = th_round_f16(3 * (1 + 0x1p-10));
    cr_assert_eq(want, 3 + 0x1p-8, "reference f16 tie");
    TH_EXPECT(TH_OK(na_mul(T(NA_DTYPE_F16, NA_SHAPE(1), 3), T(NA_DTYPE_F16, NA_SHAPE(1), 1 + 0x1p-10))),
              0, 0, "f16 mul tie", want);
    /* bf16: 1 + 2^-8 -> 1; 1 + 3*2^-8 -> 1 + 2^-6 */
    y = TH_OK(na_add(T(NA_DTYPE_BF16, NA_SHAPE(2), 1, 1), T(NA_DTYPE_BF16, NA_SHAPE(2), 0x1p-8, 3 * 0x1p-8)));
    expect_dtype(y, NA_DTYPE_BF16, "bf16 add");
    TH_EXPECT(y, 0, 0, "bf16 add", 1, 1 + 0x1p-6);
    /* unary math in f32, then one rounding: within half an ulp of the true value plus the
     * f32 error, i.e. at most 1 f16 ulp (2^-10 relative) from round_f16(true) */
    static const double xs[] = {-2, -0.5, 0.25, 1, 3};
    na_tensor *h = th_tensor(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(5), xs);
    double g[5], e[5], s[5];
    for (int i = 0; i < 5; i++) {
        g[i] = th_round_f16(0.5 * xs[i] * (1 + erf(xs[i] / sqrt(2.0))));
        e[i] = th_round_f16(exp(xs[i]));
        s[i] = th_round_f16(1 / (1 + exp(-xs[i])));
    }
    th_expect(TH_OK(na_gelu(h)), g, 5, 0, 0x1p-10, "f16 gelu");
    th_expect(TH_OK(na_exp(h)), e, 5, 0, 0x1p-10, "f16 exp");
    th_expect(TH_OK(na_sigmoid(h)), s, 5, 0, 0x1p-10, "f16 sigmoid");
}

Test(numerics, half_softmax_and_losses) {
    /* softmax of f16 keeps f16 (outside autocast) and matches the rounded f32 result */
    na_tensor *x = T(NA_DTYPE_F16, NA_SHAPE(1, 3), 1, 2, 3);
    na_tensor *y = TH_OK(na_softmax(x));
    expect_dtype(y, NA_DTYPE_F16, "f16 softmax");
    double want[3] = {th_round_f16(0.09003057317038046), th_round_f16(0.24472847105479764),
                      th_round_f16(0.6652409557748219)};
    th_expect(y, want, 3, 0, 0x1p-10, "f16 softmax");
    /* cross-entropy of f16 logits computes and returns f32 */
    na_tensor *labels = T(NA_DTYPE_I32, NA_SHAPE(1), 2);
    na_tensor *l = TH_OK(na_cross_entropy(x, labels, NULL));
    expect_dtype(l, NA_DTYPE_F32, "cross_entropy of f16 logits");
    TH_EXPECT(l, 1e-7, 4e-7, "cross_entropy of f16 logits", 0.4076059644443806);
    l = TH_OK(na_cross_entropy(T(NA_DTYPE_BF16, NA_SHAPE(1, 3), 1, 2, 3), labels, NULL));
    expect_dtype(l, NA_DTYPE_F32, "cross_entropy of bf16 logits");
    TH_EXPECT(l, 1e-7, 4e-7, "cross_entropy of bf16 logits", 0.4076059644443806);
}

Test(numerics, half_conv_pool_batchnorm) {
    /* conv of small integers: exact in f32 accumulation and representable in f16 */
    na_tensor *x = T(NA_DTYPE_F16, NA_SHAPE(1, 1, 3, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9);
    na_tensor *y = TH_OK(na_conv2d(x, T(NA_DTYPE_F16, NA_SHAPE(1, 1, 2, 2), 1, 2, 3, 4),
                                   T(NA_DTYPE_F16, NA_SHAPE(1), 1), NULL));
    expect_dtype(y, NA_DTYPE_F16, "f16 conv");
    TH_EXPECT(y, 0, 0, "f16 conv", 38, 48, 68, 78);
    na_pool2d_opts k2 = {.kernel = {2, 2}};
    na_tensor *p = TH_OK(na_avg_pool2d(T(NA_DTYPE_BF16, NA_SHAPE(1, 1, 4, 4), POOL_X), &k2));
    expect_dtype(p, NA_DTYPE_BF16, "bf16 avg_pool");
    TH_EXPECT(p, 0, 0, "bf16 avg_pool", 1.75, 2.75, 6.75, 3.25);
    /* batch norm of f16 input: f32 parameters and stats, f16 output */
    na_tensor *rm = T(NA_DTYPE_F32, NA_SHAPE(1), 0), *rv = T(NA_DTYPE_F32, NA_SHAPE(1), 1);
    na_tensor *bn = TH_OK(na_batch_norm(T(NA_DTYPE_F16, NA_SHAPE(4, 1), 1, 2, 3, 4), rm, rv,
                                        T(NA_DTYPE_F32, NA_SHAPE(1), 1), T(NA_DTYPE_F32, NA_SHAPE(1), 0),
                                        true, 0.1, 1e-5));
    expect_dtype(bn, NA_DTYPE_F16, "f16 batch_norm");
    double want[4];
    for (int i = 0; i < 4; i++) want[i] = th_round_f16((i + 1 - 2.5) / sqrt(1.25 + 1e-5));
    th_expect(bn, want, 4, 0, 0x1p-10, "f16 batch_norm");
    TH_EXPECT(rm, 1e-7, 1e-6, "running_mean after f16 batch", 0.25);
    TH_EXPECT(rv, 1e-7, 1e-6, "running_var after f16 batch", 0.9 + 0.1 * 5.0 / 3);
}

/* ---- NaN propagates, as in PyTorch (issue 24) ----------------------------------------------- */

/* relu(NaN) is NaN and its gradient passes (threshold_backward cuts only where y <= 0); clamp
 * keeps NaN and gives it no gradient (clamp_backward: x >= lo && x <= hi); max pooling and max
 * pick the NaN and send it the gradient. In f32 and f64. */
Test(numerics, nan_propagates_through_relu_clamp_and_max) {
    static const na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F64};
    for (int d = 0; d < 2; d++) {
        na_dtype dt = dts[d];
        na_tensor *x = th_leaf(dt, NA_SHAPE(4), TH_V(NAN, -1, 2, 0));
        na_tensor *y = TH_OK(na_relu(x));
        TH_EXPECT(y, 0, 0, "relu", NAN, 0, 2, 0);
        TH_RC(na_backward(y, TH_TENSOR(dt, NA_SHAPE(4), 1, 1, 1, 1)));
        TH_EXPECT(x->grad, 0, 0, "relu's gradient", 1, 0, 1, 0);

        na_tensor *c = th_leaf(dt, NA_SHAPE(3), TH_V(NAN, -5, 0.5));
        na_tensor *yc = TH_OK(na_clamp(c, -1, 1));
        TH_EXPECT(yc, 0, 0, "clamp", NAN, -1, 0.5);
        TH_RC(na_backward(yc, TH_TENSOR(dt, NA_SHAPE(3), 1, 1, 1)));
        TH_EXPECT(c->grad, 0, 0, "clamp's gradient", 0, 0, 1);

        na_tensor *p = th_leaf(dt, NA_SHAPE(1, 1, 2, 2), TH_V(1, NAN, 3, 2));
        na_pool2d_opts o = {.kernel = {2, 2}};
        na_tensor *yp = TH_OK(na_max_pool2d(p, &o));
        TH_EXPECT(yp, 0, 0, "max_pool2d", NAN);
        TH_RC(na_backward(TH_OK(na_sum(yp)), NULL));
        TH_EXPECT(p->grad, 0, 0, "max_pool2d's gradient", 0, 1, 0, 0);
        TH_EXPECT(TH_OK(na_global_max_pool2d(p)), 0, 0, "global_max_pool2d", NAN);
        TH_EXPECT(TH_OK(na_max(p)), 0, 0, "max", NAN);
        na_step_end();
    }
}

/* BatchNorm + ReLU with a NaN weight: its channel is NaN, never the 0 that hid it, and the
 * gradient passes there (the bias gradient is the sum of gy, as relu(batch_norm) in PyTorch),
 * fused and unfused alike; S = 64 reaches the vector loops. */
Test(numerics, nan_propagates_through_batch_norm_relu) {
    enum { C = 2, S = 64 };
    for (int fused = 0; fused < 2; fused++) {
        double xv[C * S], gv[C * S], gsum[C] = {0};
        th_rng r = {99};
        for (int i = 0; i < C * S; i++) {
            xv[i] = th_rng_uniform(&r, -2, 2);
            gv[i] = th_rng_uniform(&r, -1, 1);
            gsum[i / S] += (double)(float)gv[i];
        }
        na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(1, C, S), xv);
        na_tensor *w = th_leaf(NA_DTYPE_F32, NA_SHAPE(C), TH_V(NAN, 1));
        na_tensor *b = th_leaf(NA_DTYPE_F32, NA_SHAPE(C), TH_V(0, 0));
        na_tensor *gy = th_tensor(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, C, S), gv);
        na_tensor *y = fused ? TH_OK(na_batch_norm_relu(x, NULL, NULL, w, b, true, 0.1, 1e-5))
                             : TH_OK(na_relu(TH_OK(na_batch_norm(x, NULL, NULL, w, b, true,
                                                                 0.1, 1e-5))));
        for (int i = 0; i < S; i++)
            cr_assert(isnan(na_get(y, i)), "fused %d: y[0, 0, %d] = %g, expected NaN", fused, i,
                      na_get(y, i));
        TH_RC(na_backward(y, gy));
        cr_assert(fabs(na_get(b->grad, 0) - gsum[0]) < 1e-4, "fused %d: bias gradient %g, "
                  "expected the sum of gy %g", fused, na_get(b->grad, 0), gsum[0]);
        na_step_end();
    }
}
