/* kernels/common/elementwise.h — the per-element math of every unary and binary op, for
 * both backends (host and device) and both compute types (float for f32/f16/bf16, double
 * for f64), generated from the lists in common/elementwise_ops.h.
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

#define NA_EW_FORWARD_CASE_(name, forward, ...) case NA_UNARY_##name: return forward;
#define NA_EW_GRAD_CASE_(name, forward, grad) case NA_UNARY_##name: return grad;
#define NA_EW_BINARY_CASE_(name, forward) case NA_BINARY_##name: return forward;

/* One function body per compute type: the rows' T is a local typedef of NA_EW_T, and
 * NA_EW_T and the NA_EW_ math names pick float's or double's (below). */
#define NA_DEFINE_ELEMENTWISE_(SFX)                                                         \
    static NA_HD NA_EW_T na_unary_##SFX(int op, NA_EW_T x, NA_EW_T a, NA_EW_T b) {          \
        typedef NA_EW_T T;                                                                  \
        switch (op) {                                                                       \
        NA_UNARY_OPS(NA_EW_FORWARD_CASE_)                                                   \
        default: return (T)NAN;                                                             \
        }                                                                                   \
    }                                                                                       \
    static NA_HD NA_EW_T na_unary_grad_##SFX(int op, NA_EW_T x, NA_EW_T y, NA_EW_T a,       \
                                             NA_EW_T b) {                                   \
        typedef NA_EW_T T;                                                                  \
        switch (op) {                                                                       \
        NA_UNARY_OPS(NA_EW_GRAD_CASE_)                                                      \
        default: return (T)NAN;                                                             \
        }                                                                                   \
    }                                                                                       \
    static NA_HD NA_EW_T na_binary_##SFX(int op, NA_EW_T x, NA_EW_T y) {                    \
        typedef NA_EW_T T;                                                                  \
        switch (op) {                                                                       \
        NA_BINARY_OPS(NA_EW_BINARY_CASE_)                                                   \
        default: return (T)NAN;                                                             \
        }                                                                                   \
    }

/* The compute type and math functions of each expansion: (float's, double's). */
#define NA_EW_T NA_EW_PICK_(float, double)
#define NA_EW_EXP NA_EW_PICK_(expf, exp)
#define NA_EW_LOG NA_EW_PICK_(logf, log)
#define NA_EW_LOG1P NA_EW_PICK_(log1pf, log1p)
#define NA_EW_SQRT NA_EW_PICK_(sqrtf, sqrt)
#define NA_EW_POW NA_EW_PICK_(powf, pow)
#define NA_EW_FABS NA_EW_PICK_(fabsf, fabs)
#define NA_EW_TANH NA_EW_PICK_(tanhf, tanh)
#define NA_EW_ERF NA_EW_PICK_(erff, erf)

#define NA_EW_PICK_(f, d) f
NA_DEFINE_ELEMENTWISE_(f)
#undef NA_EW_PICK_
#define NA_EW_PICK_(f, d) d
NA_DEFINE_ELEMENTWISE_(d)
#undef NA_EW_PICK_

#undef NA_DEFINE_ELEMENTWISE_
#undef NA_EW_FORWARD_CASE_
#undef NA_EW_GRAD_CASE_
#undef NA_EW_BINARY_CASE_
#endif
