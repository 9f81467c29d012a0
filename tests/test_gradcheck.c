/* tests/test_gradcheck.c — every differentiable op's backward against finite differences.
 *
 * A parameterized test walks the op table (0..NA_OP_COUNT-1) through the rows of
 * tests/op_cases.c: an elementwise op is checked on its row's range (clear of its kinks) with
 * each of its argument variants, any other op by the check its row names (gc_<op>, here), so
 * an op added to NA_OP_MAP without a row or without that check fails. Each case builds f64 CPU leaves of random small shapes (the run's seed is printed in every
 * failure message; replay with NANOAMP_TEST_SEED=<seed>), confirms the function really records
 * the op under test, and runs na_gradcheck with PyTorch's defaults (eps 1e-6, atol 1e-5,
 * rtol 1e-3) unless a case explains otherwise. Inputs stay small: a check costs two forward
 * evaluations per input element.
 */
#include "op_cases.h"
#include "src/autograd/graph.h" /* to confirm a case records the op it claims to check */

/* ---- per-run state ------------------------------------------------------------------ */

static uint64_t g_seed;
static th_rng g_rng;

static void gc_begin(na_op op) {
    g_seed = th_run_seed();
    g_rng.s = g_seed * 0x100000001B3ull + (uint64_t)op;
    na_manual_seed(g_seed); /* na_gradcheck draws its output weights from the generator */
}

static int64_t rdim(int64_t lo, int64_t hi) { return th_rng_int(&g_rng, lo, hi); }

/* ---- inputs: contiguous f64 CPU leaves that require grad -------------------------------- */

static na_tensor *leaf_from(int ndim, const int64_t *shape, const double *vals) {
    return th_leaf(NA_DTYPE_F64, ndim, shape, vals);
}

typedef enum { IN_UNIFORM, IN_SIGNED, IN_DISTINCT, IN_GRID } in_kind;

/* IN_UNIFORM: [lo, hi). IN_SIGNED: magnitude in [lo, hi), random sign (keeps clear of 0).
 * IN_DISTINCT: a random permutation of well separated values in [-2, 2] (no ties for max).
 * IN_GRID: multiples of 1/lo in [-hi, hi] (values exact in a narrow dtype). */
static na_tensor *input(in_kind kind, int ndim, const int64_t *shape, double lo, double hi) {
    int64_t n = th_numel(ndim, shape);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case IN_UNIFORM: v[i] = th_rng_uniform(&g_rng, lo, hi); break;
        case IN_SIGNED:
            v[i] = th_rng_uniform(&g_rng, lo, hi) * (th_rng_u64(&g_rng) & 1 ? 1 : -1);
            break;
        case IN_DISTINCT: v[i] = -2.0 + 4.0 * ((double)i + 0.5) / (double)n; break;
        case IN_GRID: {
            int64_t k = th_rng_int(&g_rng, -(int64_t)(hi * lo), (int64_t)(hi * lo));
            v[i] = (double)k / lo;
            break;
        }
        }
    }
    if (kind == IN_DISTINCT) /* Fisher-Yates */
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = th_rng_int(&g_rng, 0, i);
            double t = v[i];
            v[i] = v[j];
            v[j] = t;
        }
    na_tensor *t = leaf_from(ndim, shape, v);
    free(v);
    return t;
}
#define UNIFORM(lo, hi, ...) input(IN_UNIFORM, NA_SHAPE(__VA_ARGS__), lo, hi)
#define SIGNED(lo, hi, ...) input(IN_SIGNED, NA_SHAPE(__VA_ARGS__), lo, hi)
#define DISTINCT(...) input(IN_DISTINCT, NA_SHAPE(__VA_ARGS__), 0, 0)

/* Uniform in [lo, hi) but at least `gap` away from each kink. */
static na_tensor *away_from(int ndim, const int64_t *shape, double lo, double hi,
                            const double *kinks, int n_kinks, double gap) {
    int64_t n = th_numel(ndim, shape);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        do {
            v[i] = th_rng_uniform(&g_rng, lo, hi);
            ok = true;
            for (int k = 0; k < n_kinks; k++) ok &= fabs(v[i] - kinks[k]) >= gap;
        } while (!ok);
    }
    na_tensor *t = leaf_from(ndim, shape, v);
    free(v);
    return t;
}

/* ---- running a check ------------------------------------------------------------------ */

static bool graph_has_op_(const na_node *n, na_op op, int depth) {
    if (!n || depth > 64) return false;
    if (n->op->id == (int)op) return true;
    for (int k = 0; k < n->n_inputs; k++)
        if (n->inputs[k] && graph_has_op_(n->inputs[k]->grad_fn, op, depth + 1)) return true;
    return false;
}

static void describe_inputs(char *buf, size_t size, na_tensor **in, int n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < size; i++) {
        char d[NA_DESCRIBE_MAX];
        k += (size_t)snprintf(buf + k, size - k, "%s%s", i ? ", " : "",
                              na_tensor_describe(in[i], d, sizeof d));
    }
}

/* Checks f's gradients w.r.t. in[0..n) (those that require grad). `op` must appear in the
 * graph f builds (NA_OP_COUNT: don't check). */
static void check_opts(const char *what, na_op op, na_gradcheck_fn f, void *ctx, na_tensor **in,
                       int n, const na_gradcheck_opts *opts) {
    char shapes[512];
    describe_inputs(shapes, sizeof shapes, in, n);
    na_clear_error();
    na_tensor *y = f(in, ctx);
    cr_assert_not_null(y, "%s (%s): forward failed: %s [seed %" PRIu64 "]", what, shapes,
                       na_last_error(), g_seed);
    if (op != NA_OP_COUNT)
        cr_assert(graph_has_op_(y->grad_fn, op, 0),
                  "%s (%s): the case does not record a %s node", what, shapes, na_op_name(op));
    int rc = na_gradcheck(f, ctx, in, n, opts);
    cr_assert_eq(rc, NA_OK, "%s (%s): %s [seed %" PRIu64 ", replay with NANOAMP_TEST_SEED=%" PRIu64
                 "]", what, shapes, na_last_error(), g_seed, g_seed);
    na_step_end();
}
static void check(const char *what, na_op op, na_gradcheck_fn f, void *ctx, na_tensor **in,
                  int n) {
    check_opts(what, op, f, ctx, in, n, NULL);
}

/* ---- elementwise ops, from the table: inputs in the row's range ------------------------- */

/* Input i of elementwise op c, of shape [d0, d1] (d0 = 0: a 0-dim tensor), in the row's
 * range and clear of its kinks. */
static na_tensor *row_input(const oc_case *c, int i, oc_args args, int64_t d0, int64_t d1) {
    oc_range r = oc_range_of(c, i);
    int ndim = d0 ? 2 : 0;
    const int64_t shape[2] = {d0, d1};
    if (r.either_sign) return input(IN_SIGNED, ndim, shape, r.lo, r.hi);
    if (c->kinks == OC_KINK_AT_0) return away_from(ndim, shape, r.lo, r.hi, TH_V(0), 1, 0.05);
    if (c->kinks == OC_KINKS_AT_ARGS)
        return away_from(ndim, shape, r.lo, r.hi, TH_V(args.a, args.b), 2, 0.05);
    return input(IN_UNIFORM, ndim, shape, r.lo, r.hi);
}
/* A binary op's input of any shape, in the row's range. */
static na_tensor *row_input_nd(const oc_case *c, int i, int ndim, const int64_t *shape) {
    oc_range r = oc_range_of(c, i);
    return input(r.either_sign ? IN_SIGNED : IN_UNIFORM, ndim, shape, r.lo, r.hi);
}

typedef struct {
    const oc_case *c;
    oc_args args;
    bool transpose; /* apply the op to a transposed view of input 0 */
} elementwise_ctx;

static na_tensor *f_elementwise(na_tensor **in, void *vctx) {
    elementwise_ctx *e = vctx;
    /* a unary op's check passes one input: in[1] exists only for a binary op */
    na_tensor *x[2] = {e->transpose ? na_transpose(in[0], 0, 1) : in[0],
                       e->c->binary ? in[1] : NULL};
    return oc_call(e->c, x, e->args);
}

/* Same shapes, broadcasting both ways, a 0-dim operand and a transposed view. */
static void gc_binary(const oc_case *c) {
    na_op op = oc_op_of(c);
    elementwise_ctx e = {c, {0, 0}, false};
    int64_t r1 = rdim(2, 3), r2 = rdim(2, 3), r3 = rdim(2, 4);
#define A_IN(...) row_input_nd(c, 0, NA_SHAPE(__VA_ARGS__))
#define B_IN(...) row_input_nd(c, 1, NA_SHAPE(__VA_ARGS__))
    na_tensor *same[2] = {A_IN(r1, r2), B_IN(r1, r2)};
    check("same shape", op, f_elementwise, &e, same, 2);
    na_tensor *bc1[2] = {A_IN(r1, 1, r3), B_IN(r2, r3)}; /* [3,1,4] with [2,4] */
    check("broadcast [r1,1,r3] with [r2,r3]", op, f_elementwise, &e, bc1, 2);
    na_tensor *bc2[2] = {A_IN(r2, r3), B_IN(r1, 1, r3)};
    check("broadcast [r2,r3] with [r1,1,r3]", op, f_elementwise, &e, bc2, 2);
    na_tensor *bc3[2] = {A_IN(r1, r2), B_IN(r1, 1)};
    check("broadcast [r1,r2] with [r1,1]", op, f_elementwise, &e, bc3, 2);
    na_tensor *s[2] = {A_IN(r1, r2), row_input_nd(c, 1, 0, NULL)};
    check("broadcast [r1,r2] with a 0-dim tensor", op, f_elementwise, &e, s, 2);
    elementwise_ctx et = {c, {0, 0}, true};
    na_tensor *tv[2] = {A_IN(r2, r1), B_IN(r1, r2)};
    check("transposed view as a", op, f_elementwise, &et, tv, 2);
#undef A_IN
#undef B_IN
}

/* Every argument variant, on a contiguous [r1, r2] leaf and on a transposed view. */
static void gc_unary(const oc_case *c) {
    na_op op = oc_op_of(c);
    for (int v = 0; v < oc_n_args(c); v++) {
        elementwise_ctx e = {c, oc_arg(c, v), false};
        char what[96];
        int64_t r1 = rdim(1, 4), r2 = rdim(2, 4);
        snprintf(what, sizeof what, "%s(a=%g, b=%g)", na_op_name(op), e.args.a, e.args.b);
        na_tensor *x = row_input(c, 0, e.args, r1, r2);
        check(what, op, f_elementwise, &e, &x, 1);
        e.transpose = true;
        snprintf(what, sizeof what, "%s(a=%g, b=%g) of a transposed view", na_op_name(op),
                 e.args.a, e.args.b);
        x = row_input(c, 0, e.args, r2, r1);
        check(what, op, f_elementwise, &e, &x, 1);
    }
}

/* ---- matmul and linear ------------------------------------------------------------------- */

typedef struct {
    bool ta, tb; /* operands are given transposed: use their transposed views */
    int permute_a; /* a given as [m, B, k]: permute to a strided [B, m, k] view */
} matmul_ctx;

static na_tensor *f_matmul(na_tensor **in, void *vctx) {
    matmul_ctx *c = vctx;
    na_tensor *a = in[0], *b = in[1];
    if (c->ta) a = na_transpose(a, -2, -1);
    if (c->tb) b = na_transpose(b, -2, -1);
    if (c->permute_a) a = na_permute(a, (const int[]){1, 0, 2});
    return na_matmul(a, b);
}

void gc_matmul(const oc_case *row) {
    (void)row;
    int64_t m = rdim(1, 3), k = rdim(2, 4), n = rdim(1, 3), bt = rdim(2, 3);
    matmul_ctx plain = {0};
    na_tensor *p2[2] = {UNIFORM(-1, 1, m, k), UNIFORM(-1, 1, k, n)};
    check("2-d", NA_OP_MATMUL, f_matmul, &plain, p2, 2);
    na_tensor *p3[2] = {UNIFORM(-1, 1, bt, m, k), UNIFORM(-1, 1, bt, k, n)};
    check("batched", NA_OP_MATMUL, f_matmul, &plain, p3, 2);
    na_tensor *sa[2] = {UNIFORM(-1, 1, m, k), UNIFORM(-1, 1, bt, k, n)};
    check("shared 2-d a with batched b", NA_OP_MATMUL, f_matmul, &plain, sa, 2);
    na_tensor *sb[2] = {UNIFORM(-1, 1, bt, m, k), UNIFORM(-1, 1, k, n)};
    check("batched a with shared 2-d b", NA_OP_MATMUL, f_matmul, &plain, sb, 2);
    na_tensor *p4[2] = {UNIFORM(-1, 1, 2, 2, m, k), UNIFORM(-1, 1, 2, 2, k, n)};
    check("4-d batched", NA_OP_MATMUL, f_matmul, &plain, p4, 2);
    matmul_ctx tt = {.ta = true, .tb = true};
    na_tensor *t3[2] = {UNIFORM(-1, 1, bt, k, m), UNIFORM(-1, 1, n, k)};
    check("transposed batched a with transposed shared b", NA_OP_MATMUL, f_matmul, &tt, t3, 2);
    na_tensor *t2[2] = {UNIFORM(-1, 1, k, m), UNIFORM(-1, 1, n, k)};
    check("both 2-d transposed", NA_OP_MATMUL, f_matmul, &tt, t2, 2);
    matmul_ctx pa = {.permute_a = 1};
    na_tensor *pv[2] = {UNIFORM(-1, 1, m, bt, k), UNIFORM(-1, 1, bt, k, n)};
    check("strided batch view as a", NA_OP_MATMUL, f_matmul, &pa, pv, 2);
}

static na_tensor *f_linear(na_tensor **in, void *vctx) {
    (void)vctx;
    return na_linear(in[0], in[1], in[2]);
}
static na_tensor *f_linear_nobias(na_tensor **in, void *vctx) {
    (void)vctx;
    return na_linear(in[0], in[1], NULL);
}

void gc_linear(const oc_case *row) {
    (void)row;
    int64_t n = rdim(1, 3), fin = rdim(2, 4), fout = rdim(1, 3);
    na_tensor *wb[3] = {UNIFORM(-1, 1, n, fin), UNIFORM(-1, 1, fout, fin), UNIFORM(-1, 1, fout)};
    check("with bias", NA_OP_LINEAR, f_linear, NULL, wb, 3);
    na_tensor *nb[2] = {UNIFORM(-1, 1, n, fin), UNIFORM(-1, 1, fout, fin)};
    check("without bias", NA_OP_LINEAR, f_linear_nobias, NULL, nb, 2);
    na_tensor *x3[3] = {UNIFORM(-1, 1, 2, n, fin), UNIFORM(-1, 1, fout, fin), UNIFORM(-1, 1, fout)};
    check("3-d input with bias", NA_OP_LINEAR, f_linear, NULL, x3, 3);
}

/* ---- reductions ------------------------------------------------------------------------- */

#define ALL 99
typedef struct {
    na_op op;
    int dim; /* ALL: over everything */
    bool keepdim;
} reduce_ctx;

static na_tensor *f_reduce(na_tensor **in, void *vctx) {
    reduce_ctx *c = vctx;
    switch (c->op) {
    case NA_OP_SUM: return c->dim == ALL ? na_sum(in[0]) : na_sum_dim(in[0], c->dim, c->keepdim);
    case NA_OP_MEAN: return c->dim == ALL ? na_mean(in[0]) : na_mean_dim(in[0], c->dim, c->keepdim);
    default: return c->dim == ALL ? na_max(in[0]) : na_max_dim(in[0], c->dim, c->keepdim);
    }
}

void gc_reduce(const oc_case *row) {
    na_op op = oc_op_of(row);
    static const int dims[] = {ALL, 0, 1, -1};
    int64_t a = rdim(2, 3), b = rdim(1, 3), c = rdim(2, 3);
    for (int i = 0; i < 4; i++)
        for (int keep = 0; keep < 2; keep++) {
            if (dims[i] == ALL && keep) continue;
            reduce_ctx ctx = {op, dims[i], keep};
            char what[64];
            snprintf(what, sizeof what, "%s over %s%s", na_op_name(op),
                     dims[i] == ALL ? "all" : dims[i] == 0 ? "dim 0" : dims[i] == 1 ? "dim 1" : "dim -1",
                     keep ? " (keepdim)" : "");
            /* max: distinct values, so no ties put the gradient on an arbitrary element */
            na_tensor *x = op == NA_OP_MAX ? DISTINCT(a, b, c) : UNIFORM(-2, 2, a, b, c);
            check(what, op, f_reduce, &ctx, &x, 1);
        }
}

/* ---- softmax and losses -------------------------------------------------------------------- */

typedef struct {
    bool log, transpose;
} softmax_ctx;
static na_tensor *f_softmax(na_tensor **in, void *vctx) {
    softmax_ctx *c = vctx;
    na_tensor *x = c->transpose ? na_transpose(in[0], -2, -1) : in[0];
    return c->log ? na_log_softmax(x) : na_softmax(x);
}
void gc_softmax(const oc_case *row) {
    na_op op = oc_op_of(row);
    bool log = op == NA_OP_LOG_SOFTMAX;
    int64_t n = rdim(1, 3), c = rdim(2, 5);
    softmax_ctx ctx = {log, false};
    na_tensor *x = UNIFORM(-3, 3, n, c);
    check("[n, c]", op, f_softmax, &ctx, &x, 1);
    x = UNIFORM(-3, 3, 2, n, c);
    check("[2, n, c]", op, f_softmax, &ctx, &x, 1);
    softmax_ctx tctx = {log, true};
    x = UNIFORM(-3, 3, c, n);
    check("over a transposed view", op, f_softmax, &tctx, &x, 1);
}

typedef struct {
    na_tensor *labels;
    na_cross_entropy_opts opts;
} ce_ctx;
static na_tensor *f_ce(na_tensor **in, void *vctx) {
    ce_ctx *c = vctx;
    return na_cross_entropy(in[0], c->labels, &c->opts);
}
void gc_cross_entropy(const oc_case *row) {
    (void)row;
    static const char *red_names[] = {"mean", "sum", "none"};
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 2; s++) {
            int64_t n = rdim(2, 4), classes = rdim(2, 5);
            double lab[4];
            for (int i = 0; i < n; i++) lab[i] = (double)th_rng_int(&g_rng, 0, classes - 1);
            ce_ctx ctx = {th_tensor(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(n), lab),
                          {(na_reduction)r, s ? 0.1 : 0.0}};
            char what[64];
            snprintf(what, sizeof what, "reduction %s, smoothing %g", red_names[r],
                     ctx.opts.label_smoothing);
            na_tensor *x = UNIFORM(-2, 2, n, classes);
            check(what, NA_OP_CROSS_ENTROPY, f_ce, &ctx, &x, 1);
        }
}

static na_tensor *f_mse(na_tensor **in, void *vctx) {
    return na_mse_loss(in[0], in[1], *(na_reduction *)vctx);
}
void gc_mse_loss(const oc_case *row) {
    (void)row;
    static const char *red_names[] = {"mean", "sum", "none"};
    for (int r = 0; r < 3; r++) {
        na_reduction red = (na_reduction)r;
        int64_t a = rdim(1, 3), b = rdim(2, 4);
        na_tensor *in[2] = {UNIFORM(-2, 2, a, b), UNIFORM(-2, 2, a, b)};
        check(red_names[r], NA_OP_MSE_LOSS, f_mse, &red, in, 2);
    }
}

/* ---- dropout, cast, to_device ------------------------------------------------------------ */

typedef struct {
    double p;
    uint64_t seed;
} dropout_ctx;
/* Re-seeds before drawing the mask: every evaluation (analytic and each finite difference)
 * must use the same mask or the numeric derivative is meaningless. */
static na_tensor *f_dropout(na_tensor **in, void *vctx) {
    dropout_ctx *c = vctx;
    uint64_t seed = na_rng_seed(), offset = na_rng_offset();
    na_manual_seed(c->seed);
    na_tensor *y = na_dropout(in[0], c->p, true);
    na_rng_set_state(seed, offset); /* leave the caller's generator as it was */
    return y;
}
void gc_dropout(const oc_case *row) {
    (void)row;
    dropout_ctx c = {0.4, g_seed ^ 0xD0D0};
    na_tensor *x = UNIFORM(-2, 2, rdim(2, 4), rdim(3, 5));
    check("p = 0.4", NA_OP_DROPOUT, f_dropout, &c, &x, 1);
    /* the mask of that run really drops something and keeps something (else the check above
     * proved little) */
    na_tensor *ones = TH_OK(na_ones(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(64)));
    na_tensor *y = TH_OK(f_dropout(&ones, &c));
    int zeros = 0;
    for (int i = 0; i < 64; i++) zeros += na_get(y, i) == 0.0;
    cr_assert(zeros > 0 && zeros < 64, "dropout p=0.4 zeroed %d of 64", zeros);
    na_step_end();
}

typedef struct {
    na_dtype via;
} cast_ctx;
static na_tensor *f_cast_round_trip(na_tensor **in, void *vctx) {
    cast_ctx *c = vctx;
    return na_cast(na_cast(in[0], c->via), NA_DTYPE_F64);
}
static na_tensor *f_cast_same(na_tensor **in, void *vctx) {
    (void)vctx;
    return na_cast(in[0], NA_DTYPE_F64);
}
/* Casting f64 -> narrow -> f64 rounds, so central differences of arbitrary inputs would see
 * the rounding (an f32 ulp over 2e-6 is a 6% error). Instead the inputs lie on a grid that
 * the narrow dtype holds exactly (multiples of 1/1024 in [-1, 1] for f32, of 1/64 in
 * [-1.875, 1.875] for f16 and bf16) and eps is one grid step, so x and x +- eps all round-trip
 * exactly: the numeric derivative is exact (it is the output weight v itself).
 * The analytic side is not exact: the backward of a cast is the cast back (as in PyTorch), so
 * the gradient passes through the narrow dtype and arrives as v rounded to it, a relative
 * error up to the dtype's unit roundoff: 2^-24 (f32) and 2^-11 (f16) are within the default
 * rtol 1e-3, bf16's 2^-8 is not, so the bf16 case uses rtol 2^-8 (and nothing looser). */
void gc_cast(const oc_case *row) {
    (void)row;
    cast_ctx c32 = {NA_DTYPE_F32};
    na_tensor *x = input(IN_GRID, NA_SHAPE(rdim(2, 3), rdim(2, 4)), 1024, 1.0);
    check_opts("f64 -> f32 -> f64 on a 1/1024 grid", NA_OP_CAST, f_cast_round_trip, &c32, &x, 1,
               &(na_gradcheck_opts){.eps = 1.0 / 1024});
    cast_ctx c16 = {NA_DTYPE_F16};
    x = input(IN_GRID, NA_SHAPE(rdim(2, 3), rdim(2, 4)), 64, 1.875);
    check_opts("f64 -> f16 -> f64 on a 1/64 grid", NA_OP_CAST, f_cast_round_trip, &c16, &x, 1,
               &(na_gradcheck_opts){.eps = 1.0 / 64});
    cast_ctx cbf = {NA_DTYPE_BF16};
    x = input(IN_GRID, NA_SHAPE(rdim(2, 3), rdim(2, 4)), 64, 1.875);
    check_opts("f64 -> bf16 -> f64 on a 1/64 grid", NA_OP_CAST, f_cast_round_trip, &cbf, &x, 1,
               &(na_gradcheck_opts){.eps = 1.0 / 64, .rtol = 0x1p-8});
    /* f64 -> f64 is the identity: the very tensor comes back, and its gradient is exact */
    x = UNIFORM(-2, 2, 2, 3);
    cr_assert_eq(na_cast(x, NA_DTYPE_F64), x, "cast to the same dtype must return its input");
    check("f64 -> f64 (identity)", NA_OP_COUNT, f_cast_same, NULL, &x, 1);
}

static na_tensor *f_to_device(na_tensor **in, void *vctx) {
    (void)vctx;
    return na_mul(na_to_device(in[0], NA_DEVICE_CPU), in[0]); /* x * copy(x): 2x */
}
void gc_to_device(const oc_case *row) {
    (void)row;
    na_tensor *x = UNIFORM(-2, 2, rdim(1, 3), rdim(2, 4));
    check("cpu -> cpu, times its input", NA_OP_TO_DEVICE, f_to_device, NULL, &x, 1);
}

/* ---- views -------------------------------------------------------------------------------- */

typedef enum {
    V_RESHAPE, V_RESHAPE_OF_VIEW, V_PERMUTE, V_SLICE, V_SLICE_OF_VIEW, V_CONTIGUOUS
} view_case;
static na_tensor *f_view(na_tensor **in, void *vctx) {
    na_tensor *x = in[0];
    switch (*(view_case *)vctx) {
    case V_RESHAPE: return na_reshape(x, 2, (const int64_t[]){-1, x->shape[2]});
    case V_RESHAPE_OF_VIEW: /* a non-contiguous input: copied, then viewed */
        return na_reshape(na_permute(x, (const int[]){2, 0, 1}), 1, (const int64_t[]){-1});
    case V_PERMUTE: return na_permute(x, (const int[]){2, 0, 1});
    case V_SLICE: return na_slice(x, 1, x->shape[0]);
    case V_SLICE_OF_VIEW: return na_slice(na_transpose(x, 0, 1), 1, x->shape[1] - 1);
    default: return na_contiguous(na_transpose(x, 0, 2));
    }
}
static void view_check(const char *what, na_op op, view_case vc, na_tensor *x) {
    check(what, op, f_view, &vc, &x, 1);
}
void gc_reshape(const oc_case *row) {
    (void)row;
    view_check("[a, b, c] -> [-1, c]", NA_OP_RESHAPE, V_RESHAPE,
               UNIFORM(-2, 2, rdim(1, 3), rdim(2, 3), rdim(2, 3)));
    view_check("permuted view -> [-1]", NA_OP_RESHAPE, V_RESHAPE_OF_VIEW,
               UNIFORM(-2, 2, rdim(2, 3), rdim(2, 3), rdim(2, 3)));
}
void gc_permute(const oc_case *row) {
    (void)row;
    view_check("(2, 0, 1)", NA_OP_PERMUTE, V_PERMUTE, UNIFORM(-2, 2, rdim(1, 3), 2, rdim(2, 3)));
}
void gc_slice(const oc_case *row) {
    (void)row;
    view_check("rows [1, n)", NA_OP_SLICE, V_SLICE, UNIFORM(-2, 2, rdim(2, 4), rdim(1, 3), 2));
    view_check("rows [1, n-1) of a transposed view", NA_OP_SLICE, V_SLICE_OF_VIEW,
               UNIFORM(-2, 2, 2, rdim(3, 4), rdim(1, 3)));
}
static na_tensor *f_channels_last(na_tensor **in, void *vctx) {
    (void)vctx; /* times the input, so the gradient flows back through the format change */
    return na_mul(na_to_channels_last(in[0]), in[0]);
}
void gc_contiguous(const oc_case *row) {
    (void)row;
    view_check("of a transposed view", NA_OP_CONTIGUOUS, V_CONTIGUOUS,
               UNIFORM(-2, 2, 2, rdim(1, 3), rdim(2, 3)));
    na_tensor *x = UNIFORM(-2, 2, rdim(1, 2), 3, 2, rdim(2, 3));
    check("channels-last, times its input", NA_OP_CONTIGUOUS, f_channels_last, NULL, &x, 1);
}

typedef struct {
    int dim;
    int64_t before, after;
    bool channels_last;
} pad_ctx;
static na_tensor *f_pad(na_tensor **in, void *vctx) {
    pad_ctx *c = vctx;
    na_tensor *x = c->channels_last ? na_to_channels_last(in[0]) : in[0];
    return na_mul(na_pad_dim(x, c->dim, c->before, c->after),
                  na_pad_dim(na_scale(x, 0.5), c->dim, c->before, c->after));
}
void gc_pad(const oc_case *row) {
    (void)row;
    pad_ctx last = {1, 2, 1, false};
    na_tensor *x = UNIFORM(-2, 2, rdim(1, 3), rdim(2, 3));
    check("dim 1 (2, 1), squared", NA_OP_PAD, f_pad, &last, &x, 1);
    pad_ctx first = {0, 0, 2, false};
    x = UNIFORM(-2, 2, rdim(1, 3), 2, rdim(2, 3));
    check("dim 0 (0, 2), squared", NA_OP_PAD, f_pad, &first, &x, 1);
    pad_ctx ch = {1, 0, 5, true};
    x = UNIFORM(-2, 2, rdim(1, 2), 3, 2, 2);
    check("channels of channels-last, 3 -> 8", NA_OP_PAD, f_pad, &ch, &x, 1);
}

/* ---- convolution and pooling ------------------------------------------------------------- */

typedef struct {
    na_conv2d_opts opts;
    bool use_opts;
    bool channels_last; /* input 0 converted first: the op's channels-last path */
} conv_ctx;
static na_tensor *f_conv(na_tensor **in, void *vctx) {
    conv_ctx *c = vctx;
    na_tensor *x = c->channels_last ? na_to_channels_last(in[0]) : in[0];
    return na_conv2d(x, in[1], in[2], c->use_opts ? &c->opts : NULL);
}
static na_tensor *f_conv_nobias(na_tensor **in, void *vctx) {
    conv_ctx *c = vctx;
    return na_conv2d(in[0], in[1], NULL, c->use_opts ? &c->opts : NULL);
}
void gc_conv2d(const oc_case *row) {
    (void)row;
    int64_t n = rdim(1, 2);
    conv_ctx pad = {{.padding = {1, 1}}, true};
    na_tensor *a[3] = {UNIFORM(-1, 1, n, 3, 5, 5), UNIFORM(-1, 1, 4, 3, 3, 3), UNIFORM(-1, 1, 4)};
    check("3x3, padding 1, bias", NA_OP_CONV2D, f_conv, &pad, a, 3);
    conv_ctx grp = {{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2}, true};
    na_tensor *b[3] = {UNIFORM(-1, 1, 1, 4, 6, 5), UNIFORM(-1, 1, 6, 2, 3, 2), UNIFORM(-1, 1, 6)};
    check("groups 2, stride (2,1), padding (1,0), dilation (1,2), bias", NA_OP_CONV2D, f_conv,
          &grp, b, 3);
    conv_ctx dw = {{.stride = {2, 2}, .dilation = {2, 2}, .groups = 2}, true};
    na_tensor *c[2] = {UNIFORM(-1, 1, n, 2, 7, 7), UNIFORM(-1, 1, 2, 1, 3, 3)};
    check("depthwise, stride 2, dilation 2, no bias", NA_OP_CONV2D, f_conv_nobias, &dw, c, 2);
    conv_ctx def = {{{0}}, false};
    na_tensor *d[2] = {UNIFORM(-1, 1, 2, 2, 3, 4), UNIFORM(-1, 1, 3, 2, 2, 2)};
    check("default options (NULL)", NA_OP_CONV2D, f_conv_nobias, &def, d, 2);
    na_tensor *e[3] = {UNIFORM(-1, 1, 2, 3, 2, 2), UNIFORM(-1, 1, 2, 3, 1, 1), UNIFORM(-1, 1, 2)};
    check("1x1 (pointwise), bias", NA_OP_CONV2D, f_conv, &def, e, 3);
    conv_ctx cl = {{.padding = {1, 1}, .stride = {2, 1}}, true, true};
    na_tensor *f[3] = {UNIFORM(-1, 1, n, 3, 5, 4), UNIFORM(-1, 1, 4, 3, 3, 3), UNIFORM(-1, 1, 4)};
    check("channels-last, 3x3, stride (2,1), padding 1, bias", NA_OP_CONV2D, f_conv, &cl, f, 3);
}

typedef struct {
    bool max;
    na_pool2d_opts opts;
    bool channels_last;
} pool_ctx;
static na_tensor *f_pool(na_tensor **in, void *vctx) {
    pool_ctx *c = vctx;
    na_tensor *x = c->channels_last ? na_to_channels_last(in[0]) : in[0];
    return c->max ? na_max_pool2d(x, &c->opts) : na_avg_pool2d(x, &c->opts);
}
void gc_pool(const oc_case *row) {
    na_op op = oc_op_of(row);
    bool max = op == NA_OP_MAX_POOL2D;
    const struct {
        const char *what;
        na_pool2d_opts o;
    } cases[] = {
        {"2x2, stride 2", {.kernel = {2, 2}}},
        {"3x3, stride 2, padding 1 (overlapping), include pad", {{3, 3}, {2, 2}, {1, 1}, true}},
        {"3x3, stride 2, padding 1 (overlapping), exclude pad", {{3, 3}, {2, 2}, {1, 1}, false}},
        {"2x3, stride (1, 2)", {{2, 3}, {1, 2}, {0, 0}, true}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (max && i == 2) continue; /* count_include_pad means nothing to max pooling */
        pool_ctx c = {max, cases[i].o};
        /* distinct values: no ties inside a window */
        na_tensor *x = max ? DISTINCT(rdim(1, 2), 2, 5, 5) : UNIFORM(-2, 2, rdim(1, 2), 2, 5, 5);
        check(cases[i].what, op, f_pool, &c, &x, 1);
        c.channels_last = true;
        char what[128];
        snprintf(what, sizeof what, "channels-last, %s", cases[i].what);
        x = max ? DISTINCT(rdim(1, 2), 3, 5, 5) : UNIFORM(-2, 2, rdim(1, 2), 3, 5, 5);
        check(what, op, f_pool, &c, &x, 1);
    }
}

/* ---- batch norm ----------------------------------------------------------------------------- */

typedef struct {
    bool training, affine, running, no_bias, channels_last;
    na_tensor *rm, *rv;
    na_op op; /* NA_OP_BATCH_NORM or NA_OP_BATCH_NORM_RELU */
} bn_ctx;
static na_tensor *f_bn(na_tensor **in, void *vctx) {
    bn_ctx *c = vctx;
    na_tensor *x = c->channels_last ? na_to_channels_last(in[0]) : in[0];
    return (c->op == NA_OP_BATCH_NORM_RELU ? na_batch_norm_relu : na_batch_norm)(
        x, c->running ? c->rm : NULL, c->running ? c->rv : NULL, c->affine ? in[1] : NULL,
        c->affine && !c->no_bias ? in[2] : NULL, c->training, 0.1, 1e-5);
}
static na_op g_bn_op;
static void bn_case(const char *what, bn_ctx c, int ndim, const int64_t *shape) {
    c.op = g_bn_op;
    int64_t ch = shape[1];
    double rm[8], rv[8];
    for (int i = 0; i < ch; i++) {
        rm[i] = th_rng_uniform(&g_rng, -0.5, 0.5);
        rv[i] = th_rng_uniform(&g_rng, 0.5, 2.0);
    }
    c.rm = th_tensor(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(ch), rm);
    c.rv = th_tensor(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(ch), rv);
    na_tensor *in[3] = {input(IN_UNIFORM, ndim, shape, -2, 2),
                        input(IN_UNIFORM, NA_SHAPE(ch), 0.5, 1.5),
                        input(IN_UNIFORM, NA_SHAPE(ch), -1, 1)};
    check(what, c.op, f_bn, &c, in, c.affine ? (c.no_bias ? 2 : 3) : 1);
}
void gc_batch_norm(const oc_case *row) {
    g_bn_op = oc_op_of(row);
    int64_t n = rdim(2, 3), ch = rdim(2, 3);
    bn_case("train, affine, running stats, [N, C, H, W]", (bn_ctx){true, true, true},
            NA_SHAPE(n, ch, 2, 2));
    bn_case("train, no affine, no running stats, [N, C, H, W]", (bn_ctx){true, false, false},
            NA_SHAPE(n, ch, 2, 2));
    bn_case("train, affine, [N, C]", (bn_ctx){true, true, true}, NA_SHAPE(rdim(3, 5), ch));
    bn_case("train, no affine, [N, C, L]", (bn_ctx){true, false, true}, NA_SHAPE(n, ch, 3));
    bn_case("eval, affine, [N, C, H, W]", (bn_ctx){false, true, true}, NA_SHAPE(n, ch, 2, 2));
    bn_case("eval, no affine, [N, C]", (bn_ctx){false, false, true}, NA_SHAPE(n, ch));
    bn_case("train, weight without bias, [N, C, H, W]", (bn_ctx){true, true, true, true},
            NA_SHAPE(n, ch, 2, 1));
    bn_case("eval, weight without bias, [N, C, L]", (bn_ctx){false, true, true, true},
            NA_SHAPE(n, ch, 2));
    bn_case("channels-last, train, affine, running stats", (bn_ctx){true, true, true, false, true},
            NA_SHAPE(n, ch, 2, 3));
    bn_case("channels-last, eval, affine", (bn_ctx){false, true, true, false, true},
            NA_SHAPE(n, ch, 3, 2));
}

/* ---- walking the table -------------------------------------------------------------------- */

Test(gradcheck, every_differentiable_op_has_a_case) {
    oc_expect_every_op_has_a_row();
    for (int op = 0; op < NA_OP_COUNT; op++) {
        const oc_case *c = &oc_cases[op];
        if (c->kind != OC_CUSTOM) continue; /* elementwise: checked from the row */
        if (na_op_differentiable((na_op)op))
            cr_expect_not_null(c->gradcheck, "op %d (%s) is differentiable but has no gradient "
                               "check: name one in its row (tests/op_cases.c) and write it in "
                               "tests/test_gradcheck.c", op, na_op_name((na_op)op));
        else
            cr_expect_null(c->gradcheck, "op %s has a gradient check but is marked "
                           "non-differentiable", na_op_name((na_op)op));
    }
}

ParameterizedTestParameters(gradcheck, op) {
    static int ops[NA_OP_COUNT];
    for (int i = 0; i < NA_OP_COUNT; i++) ops[i] = i;
    return cr_make_param_array(int, ops, NA_OP_COUNT);
}

ParameterizedTest(int *op, gradcheck, op, .timeout = 120) {
    na_op o = (na_op)*op;
    const oc_case *c = oc_case_of(o);
    if (!na_op_differentiable(o)) {
        /* a non-differentiable op records nothing even when its input requires grad */
        cr_assert_eq(o, NA_OP_ARGMAX, "unexpected non-differentiable op %s", na_op_name(o));
        na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(2, 3), TH_V(1, 5, 2, 0, -1, 3));
        na_tensor *i = TH_OK(na_argmax(x, 1, false));
        cr_assert(!i->requires_grad && !i->grad_fn, "argmax output must not be part of the graph");
        return;
    }
    gc_begin(o);
    if (c->kind == OC_UNARY) gc_unary(c);
    else if (c->kind == OC_BINARY) gc_binary(c);
    else cr_assert_not_null(c->gradcheck, "op %s has no gradient check", na_op_name(o));
    if (c->gradcheck) c->gradcheck(c);
}

/* ---- the checker itself must be able to fail ------------------------------------------------- */

static na_tensor *f_wrong_grad(na_tensor **in, void *vctx) {
    (void)vctx;
    return na_mul(in[0], na_detach(in[0])); /* value x^2, recorded gradient x instead of 2x */
}
static na_tensor *f_f32_output(na_tensor **in, void *vctx) {
    (void)vctx;
    return na_cast(in[0], NA_DTYPE_F32);
}
static na_tensor *f_identity(na_tensor **in, void *vctx) {
    (void)vctx;
    return na_scale(in[0], 1.0);
}

Test(gradcheck_self, detects_a_wrong_gradient) {
    na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(3), TH_V(0.5, -1.0, 2.0));
    TH_EXPECT_STATUS(na_gradcheck(f_wrong_grad, NULL, &x, 1, NULL), NA_ESTATE,
                     "gradient mismatch", "input 0");
}

Test(gradcheck_self, rejects_non_f64_inputs_and_outputs) {
    na_tensor *x32 = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(1, 2));
    TH_EXPECT_STATUS(na_gradcheck(f_identity, NULL, &x32, 1, NULL), NA_EDTYPE, "f64");
    na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(2), TH_V(1, 2));
    TH_EXPECT_STATUS(na_gradcheck(f_f32_output, NULL, &x, 1, NULL), NA_EDTYPE, "f64");
}

Test(gradcheck_self, passes_a_correct_gradient) {
    na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(3), TH_V(0.5, -1.0, 2.0));
    TH_RC(na_gradcheck(f_identity, NULL, &x, 1, NULL));
}
