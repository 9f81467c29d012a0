/* tests/op_cases.c — the table of op cases (see tests/op_cases.h).
 *
 * Forward references are written by hand: literals, or double arithmetic from libm (gelu's
 * erf form), never the library's ops. Input ranges and scalar arguments are those the CUDA
 * parity tolerances were tuned on (an H200): keep them when touching a row.
 */
#include "op_cases.h"

/* ---- rows of elementwise ops ------------------------------------------------------------- */

#define ARGS(...) .args = (const oc_args[]){__VA_ARGS__}, \
                  .n_args = (int)(sizeof((oc_args[]){__VA_ARGS__}) / sizeof(oc_args))
#define REFS(...) .refs = (const oc_ref[]){__VA_ARGS__}, \
                  .n_refs = (int)(sizeof((oc_ref[]){__VA_ARGS__}) / sizeof(oc_ref))
#define POSITIVE {.lo = 0.2, .hi = 3}
#define UNARY(rule_, ...) {.kind = OC_UNARY, .rule = (rule_), __VA_ARGS__}
#define BINARY(rule_, ...) {.kind = OC_BINARY, .rule = (rule_), __VA_ARGS__}
#define CUSTOM(rule_, ...) {.kind = OC_CUSTOM, .rule = (rule_), __VA_ARGS__}

static double ref_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }

const oc_case oc_cases[NA_OP_COUNT] = {
    /* binary ops are in no PyTorch list: they promote natively, by result_type */
    [NA_OP_ADD] = BINARY(NA_AMP_AS_IS, .binary = na_add, .forward = fw_add,
        REFS({"[2,3]+[3]", .in = {OC_T((2, 3), 1, 2, 3, 4, 5, 6), OC_V(10, 20, 30)},
              .out = OC_T((2, 3), 11, 22, 33, 14, 25, 36)},
             {"[3,1]+[2]", .in = {OC_T((3, 1), 1, 2, 3), OC_V(10, 20)},
              .out = OC_T((3, 2), 11, 21, 12, 22, 13, 23)},
             {"0-dim+[2]", .in = {OC_T((), 0.5), OC_V(1, -1)}, .out = OC_V(1.5, -0.5)})),
    [NA_OP_SUB] = BINARY(NA_AMP_AS_IS, .binary = na_sub,
        REFS({"[2,3]-[3]", .in = {OC_T((2, 3), 1, 2, 3, 4, 5, 6), OC_V(10, 20, 30)},
              .out = OC_T((2, 3), -9, -18, -27, -6, -15, -24)},
             {"[2]-[3,1]", .in = {OC_V(10, 20), OC_T((3, 1), 1, 2, 3)},
              .out = OC_T((3, 2), 9, 19, 8, 18, 7, 17)})),
    [NA_OP_MUL] = BINARY(NA_AMP_AS_IS, .binary = na_mul,
        REFS({"[2,3]*[3]", .in = {OC_T((2, 3), 1, 2, 3, 4, 5, 6), OC_V(10, 20, 30)},
              .out = OC_T((2, 3), 10, 40, 90, 40, 100, 180)},
             {"[2,1]*[1,2]", .in = {OC_T((2, 1), -1, 0.5), OC_T((1, 2), 4, 6)},
              .out = OC_T((2, 2), -4, -6, 2, 3)})),
    [NA_OP_DIV] = BINARY(NA_AMP_AS_IS, .binary = na_div, .in2 = {0.5, 2, .either_sign = true},
        REFS({"[2,3]/[3]", .in = {OC_T((2, 3), 1, 2, 3, 4, 5, 6), OC_V(2, 4, 8)},
              .out = OC_T((2, 3), 0.5, 0.5, 0.375, 2, 1.25, 0.75)},
             {"div by zero is IEEE", .in = {OC_V(1, -1, 1), OC_V(0, 0, 3)},
              .out = OC_V(INFINITY, -INFINITY, 1.0 / 3), .rounded = true})),

    [NA_OP_NEG] = UNARY(NA_AMP_AS_IS, .unary = na_neg, .forward = fw_neg,
        REFS({"neg", .in = {OC_V(1, -2, 0, 3.5)}, .out = OC_V(-1, 2, 0, -3.5)})),
    [NA_OP_SCALE] = UNARY(NA_AMP_AS_IS, .unary_a = na_scale, ARGS({.a = 1.7}, {.a = -2.5}),
        REFS({"scale 2.5", .args = {.a = 2.5}, .in = {OC_V(1, -2, 3)}, .out = OC_V(2.5, -5, 7.5)})),
    [NA_OP_ADD_SCALAR] = UNARY(NA_AMP_AS_IS, .unary_a = na_add_scalar, ARGS({.a = 0.3}, {.a = -1.25}),
        REFS({"add_scalar 0.5", .args = {.a = 0.5}, .in = {OC_V(1, -2, 3)}, .out = OC_V(1.5, -1.5, 3.5)})),
    /* exp, log, rsqrt, pow: PyTorch's fp32 list; sqrt is in none */
    [NA_OP_EXP] = UNARY(NA_AMP_FP32, .unary = na_exp,
        REFS({"exp", .in = {OC_V(0, 1, -1, 2)}, .rounded = true,
              .out = OC_V(1, 2.718281828459045, 0.36787944117144233, 7.38905609893065)})),
    [NA_OP_LOG] = UNARY(NA_AMP_FP32, .unary = na_log, .in = POSITIVE,
        REFS({"log", .in = {OC_V(1, 2.718281828459045, 0.5, 10, 0)}, .rounded = true,
              .out = OC_V(0, 1, -0.6931471805599453, 2.302585092994046, -INFINITY)})),
    [NA_OP_SQRT] = UNARY(NA_AMP_AS_IS, .unary = na_sqrt, .in = POSITIVE,
        REFS({"sqrt", .in = {OC_V(4, 2, 0.25, 0)}, .rounded = true,
              .out = OC_V(2, 1.4142135623730951, 0.5, 0)})),
    [NA_OP_RSQRT] = UNARY(NA_AMP_FP32, .unary = na_rsqrt, .in = POSITIVE,
        REFS({"rsqrt", .in = {OC_V(4, 0.25, 2)}, .rounded = true,
              .out = OC_V(0.5, 2, 0.7071067811865476)})),
    [NA_OP_POW] = UNARY(NA_AMP_FP32, .unary_a = na_pow, .in = {.lo = 0.2, .hi = 2},
        ARGS({.a = 2.5}, {.a = 2}, {.a = 3}, {.a = 0.5}, {.a = -1.5}),
        REFS({"pow 2", .args = {.a = 2}, .in = {OC_V(2, 3, -4)}, .out = OC_V(4, 9, 16), .rounded = true},
             {"pow 0.5", .args = {.a = 0.5}, .in = {OC_V(4, 9, 0.25)}, .out = OC_V(2, 3, 0.5), .rounded = true},
             {"pow -1", .args = {.a = -1}, .in = {OC_V(2, 4)}, .out = OC_V(0.5, 0.25), .rounded = true},
             {"pow 3", .args = {.a = 3}, .in = {OC_V(2, -3)}, .out = OC_V(8, -27), .rounded = true})),
    [NA_OP_ABS] = UNARY(NA_AMP_AS_IS, .unary = na_abs, .kinks = OC_KINK_AT_0,
        REFS({"abs", .in = {OC_V(-1.5, 0, 2, -0.25)}, .out = OC_V(1.5, 0, 2, 0.25)})),
    [NA_OP_CLAMP] = UNARY(NA_AMP_AS_IS, .unary_ab = na_clamp, .kinks = OC_KINKS_AT_ARGS,
        ARGS({-0.4, 0.6}),
        REFS({"clamp [-1, 1]", .args = {-1, 1}, .in = {OC_V(-2, -0.5, 0.25, 2, 1)},
              .out = OC_V(-1, -0.5, 0.25, 1, 1)})),
    [NA_OP_RELU] = UNARY(NA_AMP_AS_IS, .unary = na_relu, .kinks = OC_KINK_AT_0,
        REFS({"relu", .in = {OC_V(-1, 0, 2, -0.5, 3)}, .out = OC_V(0, 0, 2, 0, 3)})),
    [NA_OP_GELU] = UNARY(NA_AMP_AS_IS, .unary = na_gelu,
        REFS({"gelu by hand", .in = {OC_V(-1, 0, 1)}, .rounded = true,
              .out = OC_V(-0.15865525393145707, 0, 0.8413447460685429)},
             {"gelu vs 0.5x(1+erf(x/sqrt 2))", .in = {OC_V(-3, -1, -0.5, 0, 0.5, 1, 2)},
              .ref = ref_gelu, .rounded = true})),
    [NA_OP_SIGMOID] = UNARY(NA_AMP_AS_IS, .unary = na_sigmoid,
        REFS({"sigmoid", .in = {OC_V(0, 2, -2)}, .rounded = true,
              .out = OC_V(0.5, 0.8807970779778823, 0.11920292202211755)})),
    [NA_OP_TANH] = UNARY(NA_AMP_AS_IS, .unary = na_tanh,
        REFS({"tanh", .in = {OC_V(0, 0.5, -1)}, .rounded = true,
              .out = OC_V(0, 0.46211715726000974, -0.7615941559557649)})),
    /* softplus: PyTorch's fp32 list; softplus(-x) = softplus(x) - x */
    [NA_OP_SOFTPLUS] = UNARY(NA_AMP_FP32, .unary = na_softplus,
        REFS({"softplus", .in = {OC_V(0, 1, -1, 2, 100)}, .rounded = true,
              .out = OC_V(0.6931471805599453, 1.3132616875182228, 0.31326168751822286,
                          2.1269280110429727, 100)})),

    /* ---- ops with checks of their own ---- */
    [NA_OP_MATMUL] = CUSTOM(NA_AMP_LOWER, .forward = fw_matmul, .gradcheck = gc_matmul,
                            .autocast = ac_matmul, .parity = par_matmul),
    [NA_OP_LINEAR] = CUSTOM(NA_AMP_LOWER, .forward = fw_linear, .gradcheck = gc_linear,
                            .autocast = ac_linear, .parity = par_linear),
    [NA_OP_SUM] = CUSTOM(NA_AMP_FP32, .forward = fw_sum, .gradcheck = gc_reduce,
                         .autocast = ac_sum, .parity = par_reduce),
    /* mean is in no PyTorch list (unlike sum): its input's dtype, accumulated in f32 */
    [NA_OP_MEAN] = CUSTOM(NA_AMP_AS_IS, .forward = fw_mean, .gradcheck = gc_reduce,
                          .autocast = ac_mean, .parity = par_reduce),
    [NA_OP_MAX] = CUSTOM(NA_AMP_AS_IS, .forward = fw_max, .gradcheck = gc_reduce,
                         .autocast = ac_max, .parity = par_reduce),
    /* not differentiable: no gradient check */
    [NA_OP_ARGMAX] = CUSTOM(NA_AMP_AS_IS, .ac_out_fixed = true, .ac_out = NA_DTYPE_I32,
                            .forward = fw_argmax, .autocast = ac_argmax, .parity = par_reduce),
    [NA_OP_SOFTMAX] = CUSTOM(NA_AMP_FP32, .forward = fw_softmax, .gradcheck = gc_softmax,
                             .autocast = ac_softmax, .parity = par_softmax),
    [NA_OP_LOG_SOFTMAX] = CUSTOM(NA_AMP_FP32, .forward = fw_log_softmax,
                                 .gradcheck = gc_softmax, .autocast = ac_log_softmax,
                                 .parity = par_softmax),
    [NA_OP_CROSS_ENTROPY] = CUSTOM(NA_AMP_FP32, .forward = fw_cross_entropy,
                                   .gradcheck = gc_cross_entropy, .autocast = ac_cross_entropy,
                                   .parity = par_cross_entropy),
    [NA_OP_MSE_LOSS] = CUSTOM(NA_AMP_FP32, .forward = fw_mse_loss, .gradcheck = gc_mse_loss,
                              .autocast = ac_mse_loss, .parity = par_mse_loss),
    [NA_OP_DROPOUT] = CUSTOM(NA_AMP_AS_IS, .forward = fw_dropout, .gradcheck = gc_dropout,
                             .autocast = ac_dropout, .parity = par_dropout),
    /* conversions are exact functions; the autocast example casts to f64 */
    [NA_OP_CAST] = CUSTOM(NA_AMP_AS_IS, .parity_exact = true, .ac_out_fixed = true,
                          .ac_out = NA_DTYPE_F64, .forward = fw_cast, .gradcheck = gc_cast,
                          .autocast = ac_cast, .parity = par_cast),
    [NA_OP_TO_DEVICE] = CUSTOM(NA_AMP_AS_IS, .forward = fw_to_device, .gradcheck = gc_to_device,
                               .autocast = ac_to_device, .parity = par_to_device),
    /* views and copies move values: exact */
    [NA_OP_RESHAPE] = CUSTOM(NA_AMP_AS_IS, .parity_exact = true, .forward = fw_reshape,
                             .gradcheck = gc_reshape, .autocast = ac_reshape, .parity = par_shape),
    [NA_OP_PERMUTE] = CUSTOM(NA_AMP_AS_IS, .parity_exact = true, .forward = fw_permute,
                             .gradcheck = gc_permute, .autocast = ac_permute, .parity = par_shape),
    [NA_OP_SLICE] = CUSTOM(NA_AMP_AS_IS, .parity_exact = true, .forward = fw_slice, .gradcheck = gc_slice,
                           .autocast = ac_slice, .parity = par_shape),
    [NA_OP_CONTIGUOUS] = CUSTOM(NA_AMP_AS_IS, .parity_exact = true, .forward = fw_contiguous,
                                .gradcheck = gc_contiguous, .autocast = ac_contiguous,
                                .parity = par_shape),
    [NA_OP_PAD] = CUSTOM(NA_AMP_AS_IS, .parity_exact = true, .forward = fw_pad, .gradcheck = gc_pad,
                         .autocast = ac_pad, .parity = par_pad),
    [NA_OP_CONV2D] = CUSTOM(NA_AMP_LOWER, .forward = fw_conv2d, .gradcheck = gc_conv2d,
                            .autocast = ac_conv2d, .parity = par_conv2d),
    /* BatchNorm computes in f32 whatever its input (cuDNN's rule), in no autocast list */
    [NA_OP_BATCH_NORM] = CUSTOM(NA_AMP_AS_IS, .forward = fw_batch_norm,
                                .gradcheck = gc_batch_norm, .autocast = ac_batch_norm,
                                .parity = par_batch_norm),
    /* BatchNorm + ReLU fused: batch_norm's checks with relu applied (they read the row's op) */
    [NA_OP_BATCH_NORM_RELU] = CUSTOM(NA_AMP_AS_IS, .forward = fw_batch_norm,
                                     .gradcheck = gc_batch_norm, .autocast = ac_batch_norm,
                                     .parity = par_batch_norm),
    [NA_OP_MAX_POOL2D] = CUSTOM(NA_AMP_AS_IS, .forward = fw_max_pool2d, .gradcheck = gc_pool,
                                .autocast = ac_pool, .parity = par_pool),
    [NA_OP_AVG_POOL2D] = CUSTOM(NA_AMP_AS_IS, .forward = fw_avg_pool2d, .gradcheck = gc_pool,
                                .autocast = ac_pool, .parity = par_pool),
};

/* ---- reading the table -------------------------------------------------------------------- */

const oc_case *oc_case_of(na_op op) {
    cr_assert(op >= 0 && op < NA_OP_COUNT, "op %d is not in the op table", (int)op);
    const oc_case *c = &oc_cases[op];
    cr_assert_neq(c->kind, OC_MISSING, "op %s has no row in tests/op_cases.c", na_op_name(op));
    return c;
}

void oc_expect_every_op_has_a_row(void) {
    for (int op = 0; op < NA_OP_COUNT; op++) {
        const oc_case *c = &oc_cases[op];
        cr_expect_neq(c->kind, OC_MISSING, "op %d (%s) has no row in tests/op_cases.c", op,
                      na_op_name((na_op)op));
        if (c->kind == OC_UNARY)
            cr_expect((c->unary != NULL) + (c->unary_a != NULL) + (c->unary_ab != NULL) == 1,
                      "unary op %s: set exactly one of unary, unary_a, unary_ab",
                      na_op_name((na_op)op));
        if (c->kind == OC_BINARY)
            cr_expect_not_null(c->binary, "binary op %s: no call", na_op_name((na_op)op));
        if (c->kind == OC_UNARY || c->kind == OC_BINARY)
            cr_expect_gt(c->n_refs, 0, "elementwise op %s has no forward reference",
                         na_op_name((na_op)op));
    }
}

na_op oc_op_of(const oc_case *c) { return (na_op)(c - oc_cases); }

int oc_n_args(const oc_case *c) { return c->n_args ? c->n_args : 1; }

oc_args oc_arg(const oc_case *c, int i) { return c->n_args ? c->args[i] : (oc_args){0, 0}; }

na_tensor *oc_call(const oc_case *c, na_tensor *const *in, oc_args args) {
    if (c->binary) return c->binary(in[0], in[1]);
    if (c->unary_ab) return c->unary_ab(in[0], args.a, args.b);
    if (c->unary_a) return c->unary_a(in[0], args.a);
    cr_assert_not_null(c->unary, "oc_call: the row has no elementwise call");
    return c->unary(in[0]);
}

static bool range_set(oc_range r) { return r.lo != 0 || r.hi != 0; }

oc_range oc_range_of(const oc_case *c, int i) {
    if (i == 1 && range_set(c->in2)) return c->in2;
    if (range_set(c->in)) return c->in;
    return c->kind == OC_BINARY ? (oc_range){.lo = -1, .hi = 1} : (oc_range){.lo = -2, .hi = 2};
}

double oc_tol_of(na_dtype dt) {
    return dt == NA_DTYPE_F32 ? 1e-5 : dt == NA_DTYPE_F64 ? 1e-12 : 1e-2;
}

double oc_parity_tol(const oc_case *c, na_dtype dt) { return c->parity_exact ? 0.0 : oc_tol_of(dt); }
