/* kernels/common/elementwise.h — the per-element math of every unary and binary op, written
 * once for both backends (host and device) and for both compute types (float for
 * f32/f16/bf16, double for f64).
 *
 * na_unary_f(op, x, a, b)           y = f(x) with the op's scalar parameters a, b
 * na_unary_grad_f(op, x, y, a, b)   dy/dx, from x and/or y = f(x)
 * na_binary_f(op, x, y)
 * and the same with the _d suffix for double.
 */
#ifndef NANOAMP_KERNELS_COMMON_ELEMENTWISE_H
#define NANOAMP_KERNELS_COMMON_ELEMENTWISE_H

#include <math.h>

#include "common/hd.h"
#include "backend.h"

#define NA_SQRT1_2 0.70710678118654752440
#define NA_INV_SQRT_2PI 0.39894228040143267794

#define NA_DEFINE_ELEMENTWISE_(T, SFX, EXP, LOG, SQRT, POW, FABS, TANH, ERF)                \
    static NA_HD T na_unary_##SFX(int op, T x, T a, T b) {                                  \
        switch (op) {                                                                       \
        case NA_UNARY_NEG: return -x;                                                       \
        case NA_UNARY_SCALE: return x * a;                                                  \
        case NA_UNARY_ADD_SCALAR: return x + a;                                             \
        case NA_UNARY_EXP: return EXP(x);                                                   \
        case NA_UNARY_LOG: return LOG(x);                                                   \
        case NA_UNARY_SQRT: return SQRT(x);                                                 \
        case NA_UNARY_RSQRT: return (T)1 / SQRT(x);                                         \
        case NA_UNARY_POW: return POW(x, a);                                                \
        case NA_UNARY_ABS: return FABS(x);                                                  \
        case NA_UNARY_CLAMP: return x < a ? a : (x > b ? b : x);                            \
        case NA_UNARY_RELU: return x > (T)0 ? x : (T)0;                                     \
        case NA_UNARY_GELU: return (T)0.5 * x * ((T)1 + ERF(x * (T)NA_SQRT1_2));            \
        case NA_UNARY_SIGMOID: return (T)1 / ((T)1 + EXP(-x));                              \
        case NA_UNARY_TANH: return TANH(x);                                                 \
        default: return (T)NAN;                                                             \
        }                                                                                   \
    }                                                                                       \
    static NA_HD T na_unary_grad_##SFX(int op, T x, T y, T a, T b) {                        \
        switch (op) {                                                                       \
        case NA_UNARY_NEG: return (T)-1;                                                    \
        case NA_UNARY_SCALE: return a;                                                      \
        case NA_UNARY_ADD_SCALAR: return (T)1;                                              \
        case NA_UNARY_EXP: return y;                                                        \
        case NA_UNARY_LOG: return (T)1 / x;                                                 \
        case NA_UNARY_SQRT: return (T)0.5 / y;                                              \
        case NA_UNARY_RSQRT: return (T)-0.5 * y * y * y;                                    \
        case NA_UNARY_POW: return a == (T)0 ? (T)0 : a * POW(x, a - (T)1);                  \
        case NA_UNARY_ABS: return x > (T)0 ? (T)1 : (x < (T)0 ? (T)-1 : (T)0);              \
        case NA_UNARY_CLAMP: return (x >= a && x <= b) ? (T)1 : (T)0;                       \
        case NA_UNARY_RELU: return x > (T)0 ? (T)1 : (T)0;                                  \
        case NA_UNARY_GELU:                                                                 \
            return (T)0.5 * ((T)1 + ERF(x * (T)NA_SQRT1_2)) +                               \
                   x * (T)NA_INV_SQRT_2PI * EXP((T)-0.5 * x * x);                           \
        case NA_UNARY_SIGMOID: return y * ((T)1 - y);                                       \
        case NA_UNARY_TANH: return (T)1 - y * y;                                            \
        default: return (T)NAN;                                                             \
        }                                                                                   \
    }                                                                                       \
    static NA_HD T na_binary_##SFX(int op, T x, T y) {                                      \
        switch (op) {                                                                       \
        case NA_BINARY_ADD: return x + y;                                                   \
        case NA_BINARY_SUB: return x - y;                                                   \
        case NA_BINARY_MUL: return x * y;                                                   \
        case NA_BINARY_DIV: return x / y;                                                   \
        default: return (T)NAN;                                                             \
        }                                                                                   \
    }

NA_DEFINE_ELEMENTWISE_(float, f, expf, logf, sqrtf, powf, fabsf, tanhf, erff)
NA_DEFINE_ELEMENTWISE_(double, d, exp, log, sqrt, pow, fabs, tanh, erf)

#undef NA_DEFINE_ELEMENTWISE_
#endif
