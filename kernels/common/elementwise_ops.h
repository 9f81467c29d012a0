/* kernels/common/elementwise_ops.h — the list of elementwise kernels, one row per op: the
 * single place their math is written. It generates the na_unary_op / na_binary_op enums
 * (backend.h), the per-element functions for float and double (common/elementwise.h), and
 * both backends' dispatch (cpu/cpu_elementwise.c, cuda/elementwise.cuh).
 *
 *   X(NAME, forward, derivative)   unary: y = f(x) and dy/dx
 *   X(NAME, forward)               binary: f(x, y)
 *
 * Expressions use x, y (unary: y = f(x), the forward's output), the op's scalar
 * parameters a and b, the compute type T (float for f32/f16/bf16, double for f64) and the
 * type-generic math names NA_EW_EXP, NA_EW_LOG, NA_EW_LOG1P, NA_EW_SQRT, NA_EW_POW,
 * NA_EW_FABS, NA_EW_TANH, NA_EW_ERF (expf or exp, ...: common/elementwise.h maps them; add
 * a name there when a row needs a new function).
 *
 * Adding a unary op: (1) a row here; (2) its row in NA_OP_MAP (include/nanoamp/ops.h),
 * naming it in the unary column, and (3) its declaration there; (4) its NA_UNARY_OP_ line
 * in src/ops/elementwise.c; (5) its case in tests/op_cases.c; (6) its rule line in
 * docs/mixed-precision.md (test_amp_lessons checks the table). Every suite fails until
 * each is there.
 */
#ifndef NANOAMP_KERNELS_COMMON_ELEMENTWISE_OPS_H
#define NANOAMP_KERNELS_COMMON_ELEMENTWISE_OPS_H

#define NA_SQRT1_2 0.70710678118654752440

/* ReLU, for the RELU row and every fused ReLU (BatchNorm+ReLU, bias+ReLU): a NaN passes
 * through, as PyTorch's relu (clamp_min), and so does its gradient, which is cut only where
 * the value is <= 0 (PyTorch's threshold_backward on the output). v may be x or y = relu(x):
 * both are <= 0 at the same elements. */
#define NA_RELU(T, v) ((v) <= (T)0 ? (T)0 : (v))
#define NA_RELU_GRAD(T, v) ((v) <= (T)0 ? (T)0 : (T)1)
#define NA_RELU_PASS(T, v, g) ((v) <= (T)0 ? (T)0 : (g)) /* g where the gradient passes */
#define NA_INV_SQRT_2PI 0.39894228040143267794

#define NA_UNARY_OPS(X)                                                                     \
    X(NEG, -x, (T)-1)                                                                       \
    X(SCALE, x * a, a)                                                                      \
    X(ADD_SCALAR, x + a, (T)1)                                                              \
    X(EXP, NA_EW_EXP(x), y)                                                                 \
    X(LOG, NA_EW_LOG(x), (T)1 / x)                                                          \
    X(SQRT, NA_EW_SQRT(x), (T)0.5 / y)                                                      \
    X(RSQRT, (T)1 / NA_EW_SQRT(x), (T)-0.5 * y * y * y)                                     \
    X(POW, NA_EW_POW(x, a), a == (T)0 ? (T)0 : a * NA_EW_POW(x, a - (T)1))   /* x ** a */  \
    X(ABS, NA_EW_FABS(x), x > (T)0 ? (T)1 : (x < (T)0 ? (T)-1 : (T)0))                      \
    X(CLAMP, x < a ? a : (x > b ? b : x), (x >= a && x <= b) ? (T)1 : (T)0) /* to [a, b] */ \
    X(RELU, NA_RELU(T, x), NA_RELU_GRAD(T, x))                                              \
    X(GELU, (T)0.5 * x * ((T)1 + NA_EW_ERF(x * (T)NA_SQRT1_2)),                             \
      (T)0.5 * ((T)1 + NA_EW_ERF(x * (T)NA_SQRT1_2)) +                                      \
          x * (T)NA_INV_SQRT_2PI * NA_EW_EXP((T)-0.5 * x * x))                              \
    X(SIGMOID, (T)1 / ((T)1 + NA_EW_EXP(-x)), y * ((T)1 - y))                               \
    X(TANH, NA_EW_TANH(x), (T)1 - y * y)                                                    \
    X(SOFTPLUS, x > (T)20 ? x : NA_EW_LOG1P(NA_EW_EXP(x)), /* PyTorch's threshold */        \
      (T)1 / ((T)1 + NA_EW_EXP(-x)))

#define NA_BINARY_OPS(X)                                                                    \
    X(ADD, x + y)                                                                           \
    X(SUB, x - y)                                                                           \
    X(MUL, x * y)                                                                           \
    X(DIV, x / y)

#endif
