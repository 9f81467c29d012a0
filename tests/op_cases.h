/* tests/op_cases.h — the one table of op cases that the four per-op suites walk.
 *
 * One row per op of NA_OP_MAP (tests/op_cases.c), as ggml's test-backend-ops: how to call
 * the op, where its inputs lie, its scalar arguments, its forward values computed by hand,
 * its autocast rule as PyTorch's lists give it, and its CUDA parity tolerance. The suites read
 * the rows:
 *
 *     tests/test_ops.c          forward values against the row's hand-computed references
 *     tests/test_gradcheck.c    backward against finite differences, on the row's domain
 *     tests/test_autocast.c     output dtype under f16/bf16 regions, from the row's rule
 *     tests/test_cuda_parity.c  CUDA against the CPU, forward and backward, within tolerance
 *
 * Elementwise ops (OC_UNARY, OC_BINARY) are checked by the suites from the row alone: a new
 * elementwise op needs one row and nothing else. Other ops (OC_CUSTOM) name in their row one
 * check per suite (fw_*, gc_*, ac_*, par_*), each written in its suite's file; an elementwise
 * row may name one too, for checks beyond the generic ones. Each suite fails when an op has
 * no row, or when a row lacks the check that suite needs.
 *
 * The checks are declared weak (OC_CHECK below): every suite's executable links this table
 * but only its own checks, so the other suites' checks read as NULL there.
 */
#ifndef NANOAMP_TESTS_OP_CASES_H
#define NANOAMP_TESTS_OP_CASES_H

#include "helpers.h"

typedef enum {
    OC_MISSING, /* a zeroed row: the op has no case */
    OC_UNARY,   /* y = f(x[, a[, b]]), elementwise */
    OC_BINARY,  /* y = f(a, b), elementwise with broadcasting */
    OC_CUSTOM,  /* its own checks, named in the row */
} oc_kind;

/* Where an elementwise op's inputs lie. */
typedef struct {
    double lo, hi;    /* uniform in [lo, hi] */
    bool either_sign; /* then a random sign (a divisor kept clear of 0 on both sides) */
} oc_range;

/* Kinks a finite difference must not straddle (gradcheck keeps inputs 0.05 away). */
typedef enum { OC_SMOOTH, OC_KINK_AT_0, OC_KINKS_AT_ARGS } oc_kinks;

/* Scalar arguments of an elementwise op: scale's factor, pow's exponent, clamp's bounds. */
typedef struct {
    double a, b;
} oc_args;

/* A tensor literal: shape and values in C order (ndim 0: one value). */
typedef struct {
    int ndim;
    int64_t shape[3];
    int64_t n;
    const double *v;
} oc_lit;
/* OC_T((2, 3), 1, 2, 3, 4, 5, 6): a [2, 3] literal; OC_T((), 0.5): a 0-dim one. */
#define OC_T(dims, ...) \
    {OC_NDIM_ dims, {OC_DIMS_ dims}, TH_N(__VA_ARGS__), TH_V(__VA_ARGS__)}
#define OC_NDIM_(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define OC_DIMS_(...) __VA_ARGS__
/* a 1-d literal: OC_V(1, -2, 3) */
#define OC_V(...) {1, {TH_N(__VA_ARGS__)}, TH_N(__VA_ARGS__), TH_V(__VA_ARGS__)}

/* One forward value check, computed by hand: op(in[0][, in[1]]; args) == out, in f32 and
 * f64. `ref` instead of `out` gives out[i] = ref(in[0][i]) in double arithmetic (libm). */
typedef struct {
    const char *what;
    oc_args args;
    oc_lit in[2], out;
    bool rounded; /* out is rounded: within a few ulps of the dtype (exact otherwise) */
    double (*ref)(double x);
} oc_ref;

typedef struct oc_case oc_case;
struct oc_case {
    oc_kind kind;
    na_amp_rule rule; /* the autocast rule, by hand (PyTorch's CUDA lists, amp-facts.md) */
    bool ac_out_fixed; /* under autocast the output is always ac_out (argmax: i32) */
    na_dtype ac_out;

    /* elementwise ops: the call, the inputs, the arguments, the references */
    na_tensor *(*unary)(na_tensor *x);
    na_tensor *(*unary_a)(na_tensor *x, double a);
    na_tensor *(*unary_ab)(na_tensor *x, double a, double b);
    na_tensor *(*binary)(na_tensor *a, na_tensor *b);
    oc_range in, in2; /* inputs; in2: a binary op's second (defaults: in; unary [-2, 2],
                         binary [-1, 1]) */
    oc_kinks kinks;
    const oc_args *args; /* variants of the scalar arguments, each checked in every suite */
    int n_args;
    const oc_ref *refs;
    int n_refs;
    /* CUDA parity: ||cuda - cpu|| / ||cpu|| within oc_tol_of(dtype), or exactly equal */
    bool parity_exact;

    /* checks of the op's own (required for OC_CUSTOM, optional extras otherwise) */
    void (*forward)(const oc_case *row);
    void (*gradcheck)(const oc_case *row);
    void (*autocast)(const oc_case *row); /* runs inside an f16 or a bf16 region */
    void (*parity)(const oc_case *row, na_dtype dt);
};

/* The table, indexed by op id. */
extern const oc_case oc_cases[NA_OP_COUNT];

/* The row of op `op`, asserting it exists. */
const oc_case *oc_case_of(na_op op);
/* The op of a row. */
na_op oc_op_of(const oc_case *c);
/* Every op has a row, its kind set. Each suite runs this in its table test. */
void oc_expect_every_op_has_a_row(void);

/* The scalar-argument variants of a row (one of zeros when the row gives none). */
int oc_n_args(const oc_case *c);
oc_args oc_arg(const oc_case *c, int i);
/* Calls an elementwise op: in[1] is the second input of a binary op. */
na_tensor *oc_call(const oc_case *c, na_tensor *const *in, oc_args args);
/* The range of input i (0 or 1) of an elementwise op. */
oc_range oc_range_of(const oc_case *c, int i);
/* CUDA against the CPU, ||cuda - cpu|| / ||cpu||: 1e-5 for f32 (TF32 off), 1e-2 for f16 and
 * bf16 (one rounding), 1e-12 for f64. Tuned on an H200: keep them. */
double oc_tol_of(na_dtype dt);
/* The parity tolerance of op c's outputs in dtype dt (0: exactly equal). */
double oc_parity_tol(const oc_case *c, na_dtype dt);

/* ---- the checks of ops with their own logic (weak: each suite links only its own) ---- */
#define OC_CHECK __attribute__((weak))

/* tests/test_ops.c */
OC_CHECK void fw_add(const oc_case *row), fw_neg(const oc_case *row), fw_matmul(const oc_case *row),
    fw_linear(const oc_case *row), fw_sum(const oc_case *row), fw_mean(const oc_case *row),
    fw_max(const oc_case *row), fw_argmax(const oc_case *row), fw_softmax(const oc_case *row),
    fw_log_softmax(const oc_case *row), fw_cross_entropy(const oc_case *row),
    fw_mse_loss(const oc_case *row), fw_dropout(const oc_case *row), fw_cast(const oc_case *row),
    fw_to_device(const oc_case *row), fw_reshape(const oc_case *row), fw_permute(const oc_case *row),
    fw_slice(const oc_case *row), fw_contiguous(const oc_case *row), fw_pad(const oc_case *row), fw_conv2d(const oc_case *row),
    fw_batch_norm(const oc_case *row), fw_max_pool2d(const oc_case *row),
    fw_avg_pool2d(const oc_case *row);
/* tests/test_gradcheck.c */
OC_CHECK void gc_matmul(const oc_case *row), gc_linear(const oc_case *row),
    gc_reduce(const oc_case *row), gc_softmax(const oc_case *row), gc_cross_entropy(const oc_case *row),
    gc_mse_loss(const oc_case *row), gc_dropout(const oc_case *row), gc_cast(const oc_case *row),
    gc_to_device(const oc_case *row), gc_reshape(const oc_case *row), gc_permute(const oc_case *row),
    gc_slice(const oc_case *row), gc_contiguous(const oc_case *row), gc_pad(const oc_case *row), gc_conv2d(const oc_case *row),
    gc_batch_norm(const oc_case *row), gc_pool(const oc_case *row);
/* tests/test_autocast.c */
OC_CHECK void ac_matmul(const oc_case *row), ac_linear(const oc_case *row),
    ac_sum(const oc_case *row), ac_mean(const oc_case *row), ac_max(const oc_case *row),
    ac_argmax(const oc_case *row), ac_softmax(const oc_case *row), ac_log_softmax(const oc_case *row),
    ac_cross_entropy(const oc_case *row), ac_mse_loss(const oc_case *row), ac_dropout(const oc_case *row),
    ac_cast(const oc_case *row), ac_to_device(const oc_case *row), ac_reshape(const oc_case *row),
    ac_permute(const oc_case *row), ac_slice(const oc_case *row), ac_contiguous(const oc_case *row), ac_pad(const oc_case *row),
    ac_conv2d(const oc_case *row), ac_batch_norm(const oc_case *row), ac_pool(const oc_case *row);
/* tests/test_cuda_parity.c */
OC_CHECK void par_matmul(const oc_case *row, na_dtype dt), par_linear(const oc_case *row, na_dtype dt),
    par_reduce(const oc_case *row, na_dtype dt), par_softmax(const oc_case *row, na_dtype dt),
    par_cross_entropy(const oc_case *row, na_dtype dt), par_mse_loss(const oc_case *row, na_dtype dt),
    par_dropout(const oc_case *row, na_dtype dt), par_cast(const oc_case *row, na_dtype dt),
    par_to_device(const oc_case *row, na_dtype dt), par_shape(const oc_case *row, na_dtype dt),
    par_pad(const oc_case *row, na_dtype dt),
    par_conv2d(const oc_case *row, na_dtype dt), par_pool(const oc_case *row, na_dtype dt),
    par_batch_norm(const oc_case *row, na_dtype dt);

#endif
