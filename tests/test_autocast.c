/* tests/test_autocast.c — autocast regions: every op's output dtype under f16 and bf16
 * regions, nesting and disabled regions, types that are never cast, the weight-cast cache,
 * gradients through cached casts, rule overrides and misuse.
 *
 * The expected rules are written out by hand in the rows of tests/op_cases.c (PyTorch's CUDA
 * autocast lists, see docs/mixed-precision.md) and compared with the op table. Elementwise ops
 * are checked from their row (its rule, its input range); any other op by the check its row
 * names (ac_<op>, here): an op added to NA_OP_MAP without a row or that check fails. Values
 * computed under autocast are compared bit for bit with the same op run outside autocast on
 * inputs cast by hand (PyTorch's _run_autocast_outofplace).
 */
#include "op_cases.h"

/* The region's lower dtype for the case being run. */
static na_dtype LOW;

static na_tensor *f32(int ndim, const int64_t *shape) {
    int64_t n = th_numel(ndim, shape);
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 5) % 7) - 3 + 0.5; /* exact in f16/bf16 */
    na_tensor *t = th_tensor(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, v);
    free(v);
    return t;
}
static na_tensor *as(na_dtype dt, na_tensor *t) {
    na_no_grad_begin();
    na_tensor *c = TH_OK(na_cast(t, dt));
    na_no_grad_end();
    return c;
}
static na_tensor *low(int ndim, const int64_t *shape) { return as(LOW, f32(ndim, shape)); }
#define F32(...) f32(NA_SHAPE(__VA_ARGS__))
#define LOWT(...) low(NA_SHAPE(__VA_ARGS__))
#define F32_0DIM() f32(0, NULL)
#define LOW_0DIM() low(0, NULL)

static void expect_dt(const na_tensor *t, na_dtype want, const char *what) {
    cr_assert_not_null(t, "%s: failed: %s", what, na_last_error());
    cr_assert_eq(t->dtype, want, "%s in a %s region: got %s, expected %s", what, na_dtype_name(LOW),
                 na_dtype_name(t->dtype), na_dtype_name(want));
}

/* Bitwise equality of an autocast result with a control run outside autocast. */
static void expect_same(na_tensor *got, na_tensor *control, const char *what) {
    cr_assert_not_null(got, "%s: %s", what, na_last_error());
    cr_assert_not_null(control, "%s (control): %s", what, na_last_error());
    cr_assert_eq(got->dtype, control->dtype, "%s: dtype %s vs control %s", what,
                 na_dtype_name(got->dtype), na_dtype_name(control->dtype));
    cr_assert_eq(got->numel, control->numel);
    for (int64_t i = 0; i < got->numel; i++) {
        double a = na_get(got, i), b = na_get(control, i);
        cr_assert(a == b || (isnan(a) && isnan(b)), "%s: element %" PRId64 ": %.9g, control %.9g",
                  what, i, a, b);
    }
}

/* Runs `expr` inside a region (already open) and `control` outside it. */
#define SAME_AS_CONTROL(what, expr, control)       \
    do {                                           \
        na_tensor *got_ = (expr);                  \
        TH_RC(na_autocast_begin_disabled());       \
        na_tensor *ctl_ = (control);               \
        TH_RC(na_autocast_end());                  \
        expect_same(got_, ctl_, what);             \
    } while (0)

/* ---- per-op dtype checks (run inside a region of dtype LOW) ---------------------------------- */

/* Binary elementwise ops are in no PyTorch list: they promote natively, by result_type
 * (f16 + f32 gives f32), under autocast or not. A 0-dim tensor does not promote a dimensioned
 * one of the same category: f16 [2, 2] * f32 0-dim stays f16, two 0-dim tensors promote. */
static void promote_case(na_tensor *(*op)(na_tensor *, na_tensor *), const char *name) {
    na_dtype other = LOW == NA_DTYPE_F16 ? NA_DTYPE_BF16 : NA_DTYPE_F16;
    expect_dt(op(F32(2, 2), F32(2, 2)), NA_DTYPE_F32, name);
    expect_dt(op(LOWT(2, 2), LOWT(2, 2)), LOW, name);
    expect_dt(op(F32(2, 2), LOWT(2, 2)), NA_DTYPE_F32, name);
    expect_dt(op(LOWT(2, 2), F32(2)), NA_DTYPE_F32, name);
    expect_dt(op(LOWT(2, 2), F32(1)), NA_DTYPE_F32, "a [1] tensor has a dimension");
    expect_dt(op(LOWT(2, 2), as(other, F32(2, 2))), NA_DTYPE_F32, name);
    expect_dt(op(as(NA_DTYPE_F64, F32(2)), LOWT(2)), NA_DTYPE_F64, name);
    expect_dt(op(LOWT(2, 2), F32_0DIM()), LOW, "low [2, 2] with an f32 0-dim tensor");
    expect_dt(op(F32_0DIM(), LOWT(2, 2)), LOW, "an f32 0-dim tensor with low [2, 2]");
    expect_dt(op(LOWT(2), as(NA_DTYPE_F64, F32_0DIM())), LOW, "low [2] with an f64 0-dim tensor");
    expect_dt(op(F32_0DIM(), LOW_0DIM()), NA_DTYPE_F32, "two 0-dim tensors promote");
    /* f32 + low computes in f32: the same as casting the low input up by hand */
    na_tensor *a = F32(2, 2), *b = LOWT(2, 2);
    SAME_AS_CONTROL(name, op(a, b), op(a, as(NA_DTYPE_F32, b)));
    /* low * f32 0-dim computes in low: the same as casting the 0-dim input down by hand */
    na_tensor *z = F32_0DIM();
    SAME_AS_CONTROL(name, op(b, z), op(b, as(LOW, z)));
}

/* as_is unary: f32 stays f32, low stays low, f64 stays f64 */
#define AS_IS_UNARY(fn, name, call)                                         \
    void fn(const oc_case *row) {                                           \
        (void)row;                                                          \
        na_tensor *x;                                                       \
        x = F32(2, 3);                                                      \
        expect_dt(call, NA_DTYPE_F32, name);                                \
        x = LOWT(2, 3);                                                     \
        expect_dt(call, LOW, name);                                         \
        x = as(NA_DTYPE_F64, F32(2, 3));                                    \
        expect_dt(call, NA_DTYPE_F64, name);                                \
    }
AS_IS_UNARY(ac_max, "max", na_max_dim(x, 1, false))
AS_IS_UNARY(ac_dropout, "dropout", na_dropout(x, 0.5, true))
AS_IS_UNARY(ac_reshape, "reshape", na_reshape(x, NA_SHAPE(-1)))
AS_IS_UNARY(ac_permute, "permute", na_permute(x, (const int[]){1, 0}))
AS_IS_UNARY(ac_slice, "slice", na_slice(x, 1, 2))
AS_IS_UNARY(ac_contiguous, "contiguous", na_contiguous(TH_OK(na_transpose(x, 0, 1))))
AS_IS_UNARY(ac_pad, "pad", na_pad_dim(x, 1, 1, 2))
AS_IS_UNARY(ac_to_device, "to_device", na_to_device(x, NA_DEVICE_CPU))

/* fp32 ops: f32 from low inputs, f64 untouched; equal to the op on hand-cast f32 inputs */
#define FP32_UNARY(fn, name, call, domain)                                          \
    void fn(const oc_case *row) {                                                   \
        (void)row;                                                                  \
        na_tensor *x;                                                               \
        x = domain(NA_DTYPE_F32, NA_SHAPE(2, 3));                                   \
        expect_dt(call, NA_DTYPE_F32, name);                                        \
        x = domain(LOW, NA_SHAPE(2, 3));                                            \
        na_tensor *low_in = x;                                                      \
        expect_dt(call, NA_DTYPE_F32, name " of a low-precision input");            \
        x = as(NA_DTYPE_F32, low_in);                                               \
        na_tensor *up = x;                                                          \
        x = low_in;                                                                 \
        na_tensor *got = call;                                                      \
        x = up;                                                                     \
        SAME_AS_CONTROL(name, got, call);                                           \
        x = domain(NA_DTYPE_F64, NA_SHAPE(2, 3));                                   \
        expect_dt(call, NA_DTYPE_F64, name " of f64 (never cast)");                 \
    }
static na_tensor *any_dt(na_dtype dt, int ndim, const int64_t *shape) { return as(dt, f32(ndim, shape)); }
FP32_UNARY(ac_sum, "sum", na_sum(x), any_dt)
/* mean is in no PyTorch list (unlike sum): it runs in its input's dtype, accumulating in f32 */
void ac_mean(const oc_case *row) {
    (void)row;
    expect_dt(na_mean_dim(F32(2, 3), 0, true), NA_DTYPE_F32, "mean");
    na_tensor *x = LOWT(2, 3);
    expect_dt(na_mean(x), LOW, "mean of a low-precision input");
    SAME_AS_CONTROL("mean", na_mean_dim(x, 1, false), na_mean_dim(x, 1, false));
    expect_dt(na_mean(as(NA_DTYPE_F64, x)), NA_DTYPE_F64, "mean of f64");
}
FP32_UNARY(ac_softmax, "softmax", na_softmax(x), any_dt)
FP32_UNARY(ac_log_softmax, "log_softmax", na_log_softmax(x), any_dt)

void ac_cross_entropy(const oc_case *row) {
    (void)row;
    na_tensor *labels = TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 0, 2);
    expect_dt(na_cross_entropy(F32(2, 3), labels, NULL), NA_DTYPE_F32, "cross_entropy");
    na_tensor *x = LOWT(2, 3);
    expect_dt(na_cross_entropy(x, labels, NULL), NA_DTYPE_F32, "cross_entropy of low logits");
    SAME_AS_CONTROL("cross_entropy", na_cross_entropy(x, labels, NULL),
                    na_cross_entropy(as(NA_DTYPE_F32, x), labels, NULL));
    cr_assert_eq(labels->dtype, NA_DTYPE_I32, "integer labels are never cast");
    expect_dt(na_cross_entropy(as(NA_DTYPE_F64, x), labels, NULL), NA_DTYPE_F64, "cross_entropy of f64");
}

void ac_mse_loss(const oc_case *row) {
    (void)row;
    expect_dt(na_mse_loss(F32(3), F32(3), NA_REDUCTION_MEAN), NA_DTYPE_F32, "mse_loss");
    na_tensor *a = LOWT(3), *b = LOWT(3);
    expect_dt(na_mse_loss(a, b, NA_REDUCTION_MEAN), NA_DTYPE_F32, "mse_loss of low inputs");
    expect_dt(na_mse_loss(a, F32(3), NA_REDUCTION_NONE), NA_DTYPE_F32, "mse_loss low, f32");
    SAME_AS_CONTROL("mse_loss", na_mse_loss(a, b, NA_REDUCTION_SUM),
                    na_mse_loss(as(NA_DTYPE_F32, a), as(NA_DTYPE_F32, b), NA_REDUCTION_SUM));
}

/* lower ops: f32 in, region dtype out; the same as the op on hand-cast inputs */
void ac_matmul(const oc_case *row) {
    (void)row;
    na_tensor *a = F32(2, 3), *b = F32(3, 2);
    expect_dt(na_matmul(a, b), LOW, "matmul");
    expect_dt(na_matmul(LOWT(2, 3), b), LOW, "matmul low @ f32");
    SAME_AS_CONTROL("matmul", na_matmul(a, b), na_matmul(as(LOW, a), as(LOW, b)));
    expect_dt(na_matmul(as(NA_DTYPE_F64, a), as(NA_DTYPE_F64, b)), NA_DTYPE_F64, "matmul of f64");
}
void ac_linear(const oc_case *row) {
    (void)row;
    na_tensor *x = F32(2, 3), *w = F32(4, 3), *b = F32(4);
    expect_dt(na_linear(x, w, b), LOW, "linear");
    expect_dt(na_linear(x, w, NULL), LOW, "linear without bias");
    SAME_AS_CONTROL("linear", na_linear(x, w, b), na_linear(as(LOW, x), as(LOW, w), as(LOW, b)));
    expect_dt(na_linear(as(NA_DTYPE_F64, x), as(NA_DTYPE_F64, w), NULL), NA_DTYPE_F64, "linear of f64");
}
void ac_conv2d(const oc_case *row) {
    (void)row;
    na_tensor *x = F32(1, 2, 4, 4), *w = F32(3, 2, 3, 3), *b = F32(3);
    expect_dt(na_conv2d(x, w, b, NULL), LOW, "conv2d");
    SAME_AS_CONTROL("conv2d", na_conv2d(x, w, b, NULL), na_conv2d(as(LOW, x), as(LOW, w), as(LOW, b), NULL));
    expect_dt(na_conv2d(as(NA_DTYPE_F64, x), as(NA_DTYPE_F64, w), NULL, NULL), NA_DTYPE_F64, "conv2d of f64");
}

void ac_argmax(const oc_case *row) {
    (void)row;
    expect_dt(na_argmax(F32(2, 3), 1, false), NA_DTYPE_I32, "argmax");
    expect_dt(na_argmax(LOWT(2, 3), 1, false), NA_DTYPE_I32, "argmax of low");
}
void ac_cast(const oc_case *row) {
    (void)row;
    na_tensor *x = F32(2);
    expect_dt(na_cast(x, NA_DTYPE_F16), NA_DTYPE_F16, "explicit cast to f16");
    expect_dt(na_cast(x, NA_DTYPE_BF16), NA_DTYPE_BF16, "explicit cast to bf16");
    cr_assert_eq(na_cast(x, NA_DTYPE_F32), x, "an explicit cast to its own dtype is the identity");
    expect_dt(na_cast(LOWT(2), NA_DTYPE_F64), NA_DTYPE_F64, "explicit cast to f64");
}
void ac_batch_norm(const oc_case *row) {
    na_tensor *(*bn)(na_tensor *, na_tensor *, na_tensor *, na_tensor *, na_tensor *, bool,
                     double, double) =
        oc_op_of(row) == NA_OP_BATCH_NORM_RELU ? na_batch_norm_relu : na_batch_norm;
    na_tensor *rm = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    na_tensor *rv = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    na_tensor *w = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    expect_dt(bn(F32(3, 2), rm, rv, w, NULL, true, 0.1, 1e-5), NA_DTYPE_F32, "batch_norm");
    expect_dt(bn(LOWT(3, 2, 2), rm, rv, w, NULL, true, 0.1, 1e-5), LOW,
              "batch_norm of low input (f32 statistics)");
    cr_assert_eq(rm->dtype, NA_DTYPE_F32, "running statistics stay f32");
}
void ac_pool(const oc_case *row) {
    bool max = oc_op_of(row) == NA_OP_MAX_POOL2D;
    na_pool2d_opts k2 = {.kernel = {2, 2}};
    const char *nm = max ? "max_pool2d" : "avg_pool2d";
    na_tensor *(*pool)(na_tensor *, const na_pool2d_opts *) = max ? na_max_pool2d : na_avg_pool2d;
    expect_dt(pool(F32(1, 1, 4, 4), &k2), NA_DTYPE_F32, nm);
    expect_dt(pool(LOWT(1, 1, 4, 4), &k2), LOW, nm);
}

/* ---- elementwise ops, from the table ------------------------------------------------------- */

/* A tensor of dtype dt with values spread over input i's range of row c (a fixed pattern). */
static na_tensor *row_tensor(const oc_case *c, int i, na_dtype dt, int ndim, const int64_t *shape) {
    oc_range r = oc_range_of(c, i);
    int64_t n = th_numel(ndim, shape);
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t k = 0; k < n; k++) {
        v[k] = r.lo + (r.hi - r.lo) * (double)((k * 5) % 7) / 6;
        if (r.either_sign && k % 2) v[k] = -v[k];
    }
    na_tensor *t = th_tensor(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, v);
    free(v);
    return as(dt, t);
}

/* The output dtype the row's rule gives for an input of dtype `in` in a region of LOW. */
static na_dtype dtype_by_rule(const oc_case *c, na_dtype in) {
    if (in == NA_DTYPE_F64) return NA_DTYPE_F64; /* never cast */
    switch (c->rule) {
    case NA_AMP_LOWER: return LOW;
    case NA_AMP_FP32: return NA_DTYPE_F32;
    default: return in;
    }
}

/* A unary op on f32, low and f64 inputs: the dtype its rule gives, and (when the rule casts)
 * the same values as the op run outside autocast on inputs cast by hand. */
static void ac_unary(const oc_case *c) {
    static const na_dtype ins[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_F64};
    const char *name = na_op_name(oc_op_of(c));
    oc_args args = oc_arg(c, 0);
    for (int k = 0; k < 3; k++) {
        na_dtype in = ins[k] == NA_DTYPE_F16 ? LOW : ins[k], want = dtype_by_rule(c, in);
        na_tensor *x = row_tensor(c, 0, in, NA_SHAPE(2, 3));
        char what[96];
        snprintf(what, sizeof what, "%s of %s", name, na_dtype_name(in));
        na_tensor *got = oc_call(c, &x, args);
        expect_dt(got, want, what);
        if (want != in) {
            na_tensor *by_hand = as(want, x);
            SAME_AS_CONTROL(what, got, oc_call(c, &by_hand, args));
        }
    }
}

static void ac_binary(const oc_case *c) { promote_case(c->binary, na_op_name(oc_op_of(c))); }

/* ---- walking the table -------------------------------------------------------------------- */

Test(autocast, every_op_has_a_dtype_check_and_its_rule_is_as_written) {
    oc_expect_every_op_has_a_row();
    for (int op = 0; op < NA_OP_COUNT; op++) {
        const oc_case *c = &oc_cases[op];
        if (c->kind == OC_CUSTOM)
            cr_expect_not_null(c->autocast, "op %s has no autocast check: name one in its row "
                               "(tests/op_cases.c) and write it in tests/test_autocast.c",
                               na_op_name((na_op)op));
        cr_expect_eq(na_op_default_amp_rule((na_op)op), c->rule,
                     "op %s: the op table says rule %s, tests/op_cases.c (PyTorch's lists) %s",
                     na_op_name((na_op)op),
                     na_amp_rule_name(na_op_default_amp_rule((na_op)op)),
                     na_amp_rule_name(c->rule));
        cr_expect_eq(na_autocast_rule((na_op)op), c->rule, "op %s: current rule",
                     na_op_name((na_op)op));
    }
}

ParameterizedTestParameters(autocast, op_dtypes) {
    static int params[2 * NA_OP_COUNT]; /* op * 2 + (0: f16 region, 1: bf16 region) */
    for (int i = 0; i < 2 * NA_OP_COUNT; i++) params[i] = i;
    return cr_make_param_array(int, params, 2 * NA_OP_COUNT);
}

ParameterizedTest(int *p, autocast, op_dtypes) {
    na_op op = (na_op)(*p / 2);
    const oc_case *c = oc_case_of(op);
    LOW = *p % 2 ? NA_DTYPE_BF16 : NA_DTYPE_F16;
    if (c->kind == OC_CUSTOM)
        cr_assert_not_null(c->autocast, "op %s has no autocast check", na_op_name(op));
    TH_RC(na_autocast_begin(LOW));
    if (c->kind == OC_UNARY) ac_unary(c);
    if (c->kind == OC_BINARY) ac_binary(c);
    if (c->autocast) c->autocast(c);
    TH_RC(na_autocast_end());
    cr_assert(!na_autocast_enabled());
}

/* ---- regions -------------------------------------------------------------------------------- */

Test(autocast, outside_a_region_nothing_is_cast) {
    cr_assert(!na_autocast_enabled());
    cr_assert_eq(na_autocast_depth(), 0);
    expect_dt(na_matmul(F32(2, 2), F32(2, 2)), NA_DTYPE_F32, "matmul outside");
    LOW = NA_DTYPE_F16;
    expect_dt(na_exp(LOWT(2)), NA_DTYPE_F16, "exp of f16 outside");
    expect_dt(na_sum(LOWT(2)), NA_DTYPE_F16, "sum of f16 outside");
}

/* PyTorch's result_type outside autocast too: an f32 0-dim tensor (a scalar) does not widen
 * an f16 tensor; the gradient reaching the f32 scalar is f32. */
Test(autocast, zero_dim_tensors_do_not_promote_dimensioned_ones) {
    LOW = NA_DTYPE_F16;
    na_tensor *s = th_leaf(NA_DTYPE_F32, 0, NULL, TH_V(0.5));
    na_tensor *x = LOWT(3);
    na_tensor *y = TH_OK(na_mul(x, s));
    expect_dt(y, NA_DTYPE_F16, "f16 [3] * f32 0-dim");
    for (int i = 0; i < 3; i++) cr_assert_eq(na_get(y, i), 0.5 * na_get(x, i));
    TH_RC(na_backward(TH_OK(na_sum(y)), NULL));
    cr_assert_eq(s->grad->dtype, NA_DTYPE_F32);
    TH_EXPECT(s->grad, 0, 0, "d/ds sum(x * s) = sum(x)", na_get(x, 0) + na_get(x, 1) + na_get(x, 2));
    expect_dt(na_add(LOW_0DIM(), F32_0DIM()), NA_DTYPE_F32, "two 0-dim tensors promote");
}

Test(autocast, nesting_and_disabled_regions) {
    na_tensor *a = F32(2, 2), *b = F32(2, 2);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    cr_assert(na_autocast_enabled());
    cr_assert_eq(na_autocast_dtype(), NA_DTYPE_F16);
    expect_dt(na_matmul(a, b), NA_DTYPE_F16, "matmul in f16");
    TH_RC(na_autocast_begin(NA_DTYPE_BF16));
    cr_assert_eq(na_autocast_dtype(), NA_DTYPE_BF16);
    cr_assert_eq(na_autocast_depth(), 2);
    expect_dt(na_matmul(a, b), NA_DTYPE_BF16, "matmul in a nested bf16 region");
    TH_RC(na_autocast_begin_disabled());
    cr_assert(!na_autocast_enabled(), "a disabled region inside an enabled one");
    expect_dt(na_matmul(a, b), NA_DTYPE_F32, "matmul in a disabled region");
    LOW = NA_DTYPE_F16;
    expect_dt(na_softmax(LOWT(2, 2)), NA_DTYPE_F16, "softmax of f16 in a disabled region");
    TH_RC(na_autocast_end());
    cr_assert(na_autocast_enabled(), "enabled again after the disabled region");
    expect_dt(na_matmul(a, b), NA_DTYPE_BF16, "matmul back in bf16");
    TH_RC(na_autocast_end());
    expect_dt(na_matmul(a, b), NA_DTYPE_F16, "matmul back in f16");
    TH_RC(na_autocast_end());
    cr_assert(!na_autocast_enabled());
    cr_assert_eq(na_autocast_depth(), 0);
    expect_dt(na_matmul(a, b), NA_DTYPE_F32, "matmul after the regions");
}

Test(autocast, f64_and_integer_tensors_are_never_cast) {
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *d = as(NA_DTYPE_F64, F32(2, 2));
    expect_dt(na_matmul(d, d), NA_DTYPE_F64, "matmul f64");
    expect_dt(na_exp(d), NA_DTYPE_F64, "exp f64");
    expect_dt(na_add(d, d), NA_DTYPE_F64, "add f64");
    expect_dt(na_sum(d), NA_DTYPE_F64, "sum f64");
    na_tensor *i = TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 1, 0);
    expect_dt(na_cross_entropy(d, i, NULL), NA_DTYPE_F64, "cross_entropy f64 logits");
    expect_dt(na_to_device(i, NA_DEVICE_CPU), NA_DTYPE_I32, "i32 to_device");
    expect_dt(na_reshape(TH_TENSOR(NA_DTYPE_U8, NA_SHAPE(2), 1, 2), NA_SHAPE(2, 1)), NA_DTYPE_U8, "u8 reshape");
    /* an f32 x with an f64 weight: x goes to f16, the f64 weight is not cast: a dtype error */
    TH_EXPECT_ERROR(na_matmul(F32(2, 2), d), NA_EDTYPE, "na_matmul", "f16", "f64");
    TH_RC(na_autocast_end());
}

/* ---- the weight-cast cache ------------------------------------------------------------------ */

/* A persistent f32 parameter (it must outlive na_step_end below). */
static na_tensor *param(int ndim, const int64_t *shape, const double *v) {
    na_tensor *p = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape);
    cr_assert_not_null(p, "%s", na_last_error());
    TH_RC(na_copy_(p, th_tensor(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, v)));
    TH_RC(na_tensor_set_requires_grad(p, true));
    return p;
}

Test(autocast, weight_casts_are_cached_once_per_region) {
    na_tensor *w = param(NA_SHAPE(3, 2), TH_V(1, 2, 3, 4, 5, 6));
    na_tensor *b = param(NA_SHAPE(3), TH_V(1, 0, -1));
    na_tensor *x = F32(4, 2); /* not a parameter: cast per use, not cached */
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    cr_assert_eq(na_autocast_cache_casts(), 0u);
    TH_OK(na_linear(x, w, b));
    cr_assert_eq(na_autocast_cache_casts(), 2u, "w and b cast once: %" PRIu64, na_autocast_cache_casts());
    for (int i = 0; i < 3; i++) TH_OK(na_linear(F32(4, 2), w, b));
    TH_OK(na_matmul(x, TH_OK(na_transpose(w, 0, 1)))); /* a view of w is not cached */
    cr_assert_eq(na_autocast_cache_casts(), 2u, "reuse: %" PRIu64, na_autocast_cache_casts());
    /* a nested region of another dtype casts again, once */
    TH_RC(na_autocast_begin(NA_DTYPE_BF16));
    TH_OK(na_linear(x, w, NULL));
    TH_OK(na_linear(x, w, NULL));
    cr_assert_eq(na_autocast_cache_casts(), 3u, "one bf16 cast of w: %" PRIu64, na_autocast_cache_casts());
    TH_RC(na_autocast_end());
    cr_assert_eq(na_autocast_cache_casts(), 3u, "an inner region's end keeps the cache");
    TH_RC(na_autocast_end());
    cr_assert_eq(na_autocast_cache_casts(), 0u, "the outermost region's end clears the cache");
    /* a new region casts afresh */
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    TH_OK(na_linear(x, w, b));
    cr_assert_eq(na_autocast_cache_casts(), 2u);
    /* a step ending inside the region drops the (freed) cached casts */
    na_step_end();
    x = F32(4, 2);
    na_tensor *y = TH_OK(na_linear(x, w, b));
    cr_assert_eq(na_autocast_cache_casts(), 2u, "recast after na_step_end: %" PRIu64, na_autocast_cache_casts());
    TH_RC(na_autocast_end());
    /* the values are those of a fresh cast (stale memory would show) */
    TH_RC(na_autocast_begin_disabled());
    na_tensor *ctl = TH_OK(na_linear(as(NA_DTYPE_F16, x), as(NA_DTYPE_F16, w), as(NA_DTYPE_F16, b)));
    TH_RC(na_autocast_end());
    expect_same(y, ctl, "linear after a step end inside the region");
    na_tensor_free(w);
    na_tensor_free(b);
}

Test(autocast, gradients_reach_f32_weights_through_the_cached_cast) {
    /* y = sum(linear(x1, w, b)) + sum(linear(x2, w, b)) with the cached f16 casts of w and b:
     * dy/dw[o, i] = sum_n x1[n, i] + x2[n, i]; dy/db[o] = N1 + N2 (exact in f16) */
    na_tensor *w = th_leaf(NA_DTYPE_F32, NA_SHAPE(2, 3), TH_V(0.5, -1, 2, 1, 1, -0.25));
    na_tensor *b = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(0.5, -0.5));
    na_tensor *x1 = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    na_tensor *x2 = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(1, 3), -1, 0.5, 2);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *y1 = TH_OK(na_linear(x1, w, b)), *y2 = TH_OK(na_linear(x2, w, b));
    cr_assert_eq(y1->dtype, NA_DTYPE_F16);
    cr_assert_eq(na_autocast_cache_casts(), 2u);
    na_tensor *loss = TH_OK(na_add(TH_OK(na_sum(y1)), TH_OK(na_sum(y2))));
    cr_assert_eq(loss->dtype, NA_DTYPE_F32, "sum is fp32 under autocast");
    TH_RC(na_autocast_end());
    TH_RC(na_backward(loss, NULL));
    cr_assert_not_null(w->grad);
    cr_assert_eq(w->grad->dtype, NA_DTYPE_F32, "the weight's gradient is f32");
    cr_assert_eq(b->grad->dtype, NA_DTYPE_F32);
    TH_EXPECT(w->grad, 0, 0, "dloss/dw", 4, 7.5, 11, 4, 7.5, 11);
    TH_EXPECT(b->grad, 0, 0, "dloss/db", 3, 3);
}

Test(autocast, a_cast_made_under_no_grad_does_not_cut_later_gradients) {
    na_tensor *w = th_leaf(NA_DTYPE_F32, NA_SHAPE(1, 2), TH_V(1, 2));
    na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(1, 2), 3, 4);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_no_grad_begin();
    TH_OK(na_linear(x, w, NULL)); /* e.g. an evaluation pass first */
    na_no_grad_end();
    na_tensor *y = TH_OK(na_linear(x, w, NULL));
    TH_RC(na_autocast_end());
    cr_assert(y->requires_grad, "the output must be part of the graph");
    TH_RC(na_backward(TH_OK(na_sum(y)), NULL));
    TH_EXPECT(w->grad, 0, 0, "dy/dw = x", 3, 4);
}

/* ---- rules ------------------------------------------------------------------------------------ */

Test(autocast, rule_override_and_reset) {
    LOW = NA_DTYPE_F16;
    TH_RC(na_autocast_set_rule(NA_OP_RELU, NA_AMP_FP32));
    TH_RC(na_autocast_set_rule(NA_OP_MATMUL, NA_AMP_FP32));
    TH_RC(na_autocast_set_rule(NA_OP_ADD, NA_AMP_LOWER));
    cr_assert_eq(na_autocast_rule(NA_OP_RELU), NA_AMP_FP32);
    cr_assert_eq(na_op_default_amp_rule(NA_OP_RELU), NA_AMP_AS_IS, "the default stays");
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    expect_dt(na_relu(LOWT(2)), NA_DTYPE_F32, "relu overridden to fp32");
    expect_dt(na_matmul(F32(2, 2), F32(2, 2)), NA_DTYPE_F32, "matmul overridden to fp32");
    expect_dt(na_add(F32(2), F32(2)), NA_DTYPE_F16, "add overridden to lower");
    TH_RC(na_autocast_end());
    na_autocast_reset_rules();
    for (int op = 0; op < NA_OP_COUNT; op++)
        cr_assert_eq(na_autocast_rule((na_op)op), na_op_default_amp_rule((na_op)op), "op %s after reset",
                     na_op_name((na_op)op));
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    expect_dt(na_relu(LOWT(2)), NA_DTYPE_F16, "relu after reset");
    expect_dt(na_matmul(F32(2, 2), F32(2, 2)), NA_DTYPE_F16, "matmul after reset");
    TH_RC(na_autocast_end());
    TH_EXPECT_STATUS(na_autocast_set_rule(NA_OP_COUNT, NA_AMP_FP32), NA_EINVAL, "na_autocast_set_rule");
    TH_EXPECT_STATUS(na_autocast_set_rule(NA_OP_RELU, NA_AMP_RULE_COUNT), NA_EINVAL, "na_autocast_set_rule");
    cr_assert_str_eq(na_amp_rule_name(NA_AMP_LOWER), "lower");
    cr_assert_str_eq(na_amp_rule_name(NA_AMP_FP32), "fp32");
    cr_assert_str_eq(na_amp_rule_name(NA_AMP_PROMOTE), "promote");
    cr_assert_str_eq(na_amp_rule_name(NA_AMP_AS_IS), "as_is");
}

/* ---- misuse ---------------------------------------------------------------------------------- */

Test(autocast, end_without_begin_and_bad_regions) {
    TH_EXPECT_STATUS(na_autocast_end(), NA_ESTATE, "na_autocast_end", "no autocast region");
    TH_EXPECT_STATUS(na_autocast_begin(NA_DTYPE_F32), NA_EDTYPE, "na_autocast_begin", "f32");
    TH_EXPECT_STATUS(na_autocast_begin(NA_DTYPE_F64), NA_EDTYPE, "na_autocast_begin", "f64");
    cr_assert_eq(na_autocast_depth(), 0, "a refused begin opens nothing");
    for (int i = 0; i < 16; i++) TH_RC(na_autocast_begin(NA_DTYPE_F16));
    TH_EXPECT_STATUS(na_autocast_begin(NA_DTYPE_F16), NA_ESTATE, "na_autocast_begin", "16");
    for (int i = 0; i < 16; i++) TH_RC(na_autocast_end());
    TH_EXPECT_STATUS(na_autocast_end(), NA_ESTATE, "na_autocast_end");
}

/* Backward computes each gradient in its forward's dtype, whatever region is open when
 * na_backward runs: the ops inside backward must not be autocast again. */
Test(autocast, backward_inside_a_region_is_not_autocast) {
    na_tensor *w = th_leaf(NA_DTYPE_F32, NA_SHAPE(2, 2), TH_V(1.0 / 3, 2.0 / 3, -1.0 / 7, 0.1));
    na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2, 2), 1.0 / 3, 0.2, 1.0 / 9, -0.3);
    na_tensor *y = TH_OK(na_sum(TH_OK(na_matmul(x, w)))); /* f32, outside any region */
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    TH_RC(na_backward(y, NULL));
    TH_RC(na_autocast_end());
    /* dy/dw[k, j] = sum_i x[i, k] */
    cr_assert_eq(w->grad->dtype, NA_DTYPE_F32);
    TH_EXPECT(w->grad, 1e-7, 1e-6, "f32 gradient computed in f32", 1.0 / 3 + 1.0 / 9,
              1.0 / 3 + 1.0 / 9, 0.2 - 0.3, 0.2 - 0.3);
}
