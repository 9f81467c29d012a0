/* kernels/cpu/cpu_reference.c — the specification of the GEMM and of the convolution.
 *
 * Plain loops, one output element at a time, written as the math is written (llm.c's
 * matmul_forward_cpu): what na_cpu_gemm (OpenBLAS or the blocked GEMM) and na_cpu_conv2d*
 * (im2col + GEMM, blocks of images) must compute, up to the order of the additions (and,
 * for bf16 GEMMs on vdpbf16ps, denormals flushed to zero: cpu_internal.h).
 * tests/test_cpu_kernels.c checks the fast paths against these on random shapes for every
 * dtype, so a fast path can never silently become the definition. Nothing else calls them:
 * they are slow on purpose.
 *
 * Numerics are the backend contract (kernels/backend.h): elements are loaded as the compute
 * type (f32; f64 when an operand is f64), each output element sums its products in one
 * accumulator of that type, and the result is rounded once to the output's dtype.
 */
#include "common/elementwise.h"
#include "cpu/cpu_internal.h"

/* element i of view v as the compute type T */
#define LOAD(T, v, i) ((T)na_cpu_get((v)->dtype, (v)->data, (i)))

#define NA_CPU_DEFINE_REFERENCE(T, SFX)                                                     \
    /* C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] (+ bias[j], then relu). As in BLAS, \
     * A and B are not read when alpha is 0, nor C when beta is 0. */                       \
    static void gemm_##SFX(const na_gemm_args *g) {                                         \
        na_dtype dt = g->dtype;                                                             \
        for (int64_t q = 0; q < g->batch; q++) {                                            \
            int64_t a0 = q * g->stride_a, b0 = q * g->stride_b, c0 = q * g->stride_c;       \
            for (int64_t i = 0; i < g->m; i++)                                              \
                for (int64_t j = 0; j < g->n; j++) {                                        \
                    T acc = 0;                                                              \
                    for (int64_t p = 0; p < g->k; p++) {                                    \
                        if (g->alpha == 0) break;                                           \
                        int64_t ai = a0 + (g->ta ? p * g->lda + i : i * g->lda + p);        \
                        int64_t bi = b0 + (g->tb ? j * g->ldb + p : p * g->ldb + j);        \
                        acc += (T)na_cpu_get(dt, g->a, ai) * (T)na_cpu_get(dt, g->b, bi);   \
                    }                                                                       \
                    int64_t ci = c0 + i * g->ldc + j;                                       \
                    T v = (T)g->alpha * acc;                                                \
                    if (g->beta != 0) v += (T)g->beta * (T)na_cpu_get(dt, g->c, ci);        \
                    if (g->bias) v += (T)na_cpu_get(dt, g->bias, j);                        \
                    if (g->relu) v = na_unary_##SFX(NA_UNARY_RELU, v, 0, 0);                \
                    na_cpu_set(dt, g->c, ci, v);                                            \
                }                                                                           \
        }                                                                                   \
    }                                                                                       \
                                                                                            \
    /* y[n, co, oy, ox] = sum over the group's input channels c and taps (i, j) that land   \
     * inside x of x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw] * w[co, c, i, j]           \
     * (+ bias[co]) */                                                                      \
    static void conv2d_##SFX(const na_conv_geom *g, const na_view *x, const na_view *w,     \
                             const na_view *bias, na_view *y) {                             \
        int64_t cg = g->c_in / g->groups, cog = g->c_out / g->groups;                       \
        for (int64_t n = 0; n < g->n; n++)                                                  \
            for (int64_t co = 0; co < g->c_out; co++)                                       \
                for (int64_t oy = 0; oy < g->oh; oy++)                                      \
                    for (int64_t ox = 0; ox < g->ow; ox++) {                                \
                        int64_t c_first = co / cog * cg;                                    \
                        T acc = 0;                                                          \
                        for (int64_t c = 0; c < cg; c++)                                    \
                            for (int64_t i = 0; i < g->kh; i++)                             \
                                for (int64_t j = 0; j < g->kw; j++) {                       \
                                    int64_t iy = oy * g->sh - g->ph + i * g->dh;            \
                                    int64_t ix = ox * g->sw - g->pw + j * g->dw;            \
                                    if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)       \
                                        continue;                                           \
                                    int64_t xi = ((n * g->c_in + c_first + c) * g->h + iy)  \
                                                 * g->w + ix;                               \
                                    int64_t wi = ((co * cg + c) * g->kh + i) * g->kw + j;   \
                                    acc += LOAD(T, x, xi) * LOAD(T, w, wi);                 \
                                }                                                           \
                        if (bias) acc += LOAD(T, bias, co);                                 \
                        na_cpu_set(y->dtype, y->data,                                       \
                                   ((n * g->c_out + co) * g->oh + oy) * g->ow + ox, acc);   \
                    }                                                                       \
    }                                                                                       \
                                                                                            \
    /* gx[n, ci, iy, ix] = sum of gy[n, co, oy, ox] * w[co, ci mod cg, i, j] over the       \
     * outputs (oy, ox) of the group's channels co whose tap (i, j) reads (iy, ix):         \
     * iy = oy*sh - ph + i*dh and ix = ox*sw - pw + j*dw */                                 \
    static void conv2d_backward_data_##SFX(const na_conv_geom *g, const na_view *gy,        \
                                           const na_view *w, na_view *gx) {                 \
        int64_t cg = g->c_in / g->groups, cog = g->c_out / g->groups;                       \
        for (int64_t n = 0; n < g->n; n++)                                                  \
            for (int64_t ci = 0; ci < g->c_in; ci++)                                        \
                for (int64_t iy = 0; iy < g->h; iy++)                                       \
                    for (int64_t ix = 0; ix < g->w; ix++) {                                 \
                        int64_t co_first = ci / cg * cog, c = ci % cg;                      \
                        T acc = 0;                                                          \
                        for (int64_t co = co_first; co < co_first + cog; co++)              \
                            for (int64_t i = 0; i < g->kh; i++)                             \
                                for (int64_t j = 0; j < g->kw; j++) {                       \
                                    int64_t ty = iy + g->ph - i * g->dh;                    \
                                    int64_t tx = ix + g->pw - j * g->dw;                    \
                                    if (ty < 0 || tx < 0 || ty % g->sh || tx % g->sw)       \
                                        continue;                                           \
                                    int64_t oy = ty / g->sh, ox = tx / g->sw;               \
                                    if (oy >= g->oh || ox >= g->ow) continue;               \
                                    int64_t gi = ((n * g->c_out + co) * g->oh + oy)         \
                                                 * g->ow + ox;                              \
                                    int64_t wi = ((co * cg + c) * g->kh + i) * g->kw + j;   \
                                    acc += LOAD(T, gy, gi) * LOAD(T, w, wi);                \
                                }                                                           \
                        na_cpu_set(gx->dtype, gx->data,                                     \
                                   ((n * g->c_in + ci) * g->h + iy) * g->w + ix, acc);      \
                    }                                                                       \
    }                                                                                       \
                                                                                            \
    /* gw[co, c, i, j] = sum over images n and outputs (oy, ox) whose tap (i, j) lands      \
     * inside x of gy[n, co, oy, ox] * x[n, group's channel c, oy*sh - ph + i*dh,           \
     * ox*sw - pw + j*dw] */                                                                \
    static void conv2d_backward_weight_##SFX(const na_conv_geom *g, const na_view *x,       \
                                             const na_view *gy, na_view *gw) {              \
        int64_t cg = g->c_in / g->groups, cog = g->c_out / g->groups;                       \
        for (int64_t co = 0; co < g->c_out; co++)                                           \
            for (int64_t c = 0; c < cg; c++)                                                \
                for (int64_t i = 0; i < g->kh; i++)                                         \
                    for (int64_t j = 0; j < g->kw; j++) {                                   \
                        int64_t c_first = co / cog * cg;                                    \
                        T acc = 0;                                                          \
                        for (int64_t n = 0; n < g->n; n++)                                  \
                            for (int64_t oy = 0; oy < g->oh; oy++)                          \
                                for (int64_t ox = 0; ox < g->ow; ox++) {                    \
                                    int64_t iy = oy * g->sh - g->ph + i * g->dh;            \
                                    int64_t ix = ox * g->sw - g->pw + j * g->dw;            \
                                    if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)       \
                                        continue;                                           \
                                    int64_t xi = ((n * g->c_in + c_first + c) * g->h + iy)  \
                                                 * g->w + ix;                               \
                                    int64_t gi = ((n * g->c_out + co) * g->oh + oy)         \
                                                 * g->ow + ox;                              \
                                    acc += LOAD(T, gy, gi) * LOAD(T, x, xi);                \
                                }                                                           \
                        na_cpu_set(gw->dtype, gw->data,                                     \
                                   ((co * cg + c) * g->kh + i) * g->kw + j, acc);           \
                    }                                                                       \
    }

NA_CPU_DEFINE_REFERENCE(float, f)
NA_CPU_DEFINE_REFERENCE(double, d)

/* f64 compute when any operand is f64 (as the fast paths), else f32 */
static bool any_f64(const na_view *a, const na_view *b, const na_view *c) {
    return a->dtype == NA_DTYPE_F64 || b->dtype == NA_DTYPE_F64 || c->dtype == NA_DTYPE_F64;
}

int na_cpu_ref_gemm(const na_gemm_args *g) {
    if (!na_cpu_is_float(g->dtype)) return na_cpu_bad_dtype("cpu_ref_gemm", "A, B, C", g->dtype);
    if (g->dtype == NA_DTYPE_F64) gemm_d(g);
    else gemm_f(g);
    return NA_OK;
}

int na_cpu_ref_conv2d(const na_conv_geom *g, const na_view *x, const na_view *w,
                      const na_view *bias, na_view *y) {
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d", x);
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d", w);
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d", bias);
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d", y);
    if (any_f64(x, w, y)) conv2d_d(g, x, w, bias, y);
    else conv2d_f(g, x, w, bias, y);
    return NA_OK;
}

int na_cpu_ref_conv2d_backward_data(const na_conv_geom *g, const na_view *gy, const na_view *w,
                                    na_view *gx) {
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d_backward_data", gy);
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d_backward_data", w);
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d_backward_data", gx);
    if (any_f64(gy, w, gx)) conv2d_backward_data_d(g, gy, w, gx);
    else conv2d_backward_data_f(g, gy, w, gx);
    return NA_OK;
}

int na_cpu_ref_conv2d_backward_weight(const na_conv_geom *g, const na_view *x,
                                      const na_view *gy, na_view *gw) {
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d_backward_weight", x);
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d_backward_weight", gy);
    NA_CPU_CHECK_FLOAT("cpu_ref_conv2d_backward_weight", gw);
    if (any_f64(x, gy, gw)) conv2d_backward_weight_d(g, x, gy, gw);
    else conv2d_backward_weight_f(g, x, gy, gw);
    return NA_OK;
}
