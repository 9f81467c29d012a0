/* kernels/cpu/cpu_conv.c — 2-d convolution (im2col + GEMM) and pooling, NCHW.
 *
 * Per group g (Cg = C_in/groups, Cog = C_out/groups, K = Cg*kh*kw, P = oh*ow) and block of
 * nb images laid side by side (columns b*P .. b*P+P-1 belong to image b):
 *   forward        Y (Cog x nb*P)   = W[g] (Cog x K) @ col(x[.., g]) (K x nb*P), + bias,
 *                                     scattered to y[n, g]
 *   backward data  gcol (K x nb*P)  = W[g]^T @ gy[.., g];   gx[n, g] = col2im(gcol)
 *   backward wt    gW[g] (Cog x K) += gy[.., g] @ col(x[.., g])^T, summed over the batch
 * One block holds as many images as fit a few MiB of scratch, so the GEMMs are large (the
 * MNIST shapes run as one or two GEMMs per call instead of 128 small ones).
 * f16/bf16 tensors are widened per image into f32 scratch; outputs (and the weight gradient
 * summed over the whole batch) accumulate in f32 and are rounded once.
 * On the thread pool (cpu_parallel.h) the batch is cut into up to 8 image ranges fixed by the
 * problem's size, each a task of im2col + single-threaded GEMM (+ col2im); the weight gradient
 * is one partial per range, added in range order, so no result depends on the thread count.
 * Pooling runs over ranges of (n, c) planes.
 *
 * Pooling windows: cell (oy*sh - ph + i*dh, ox*sw - pw + j*dw). Max pooling ignores padded
 * cells, takes the first maximum (NaN propagates) and saves its flat index iy*W + ix within
 * the (n, c) plane (-1 for a window with no cell inside the input). Average pooling divides
 * by the number of window cells inside the padded input (count_include_pad) or inside the
 * input (otherwise).
 */
#include <stdlib.h>

#include "common/dense_order.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_parallel.h"

static int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

/* [lo, hi): the output positions o whose input position o*s - p + k*d lies in [0, size) */
static void valid_range(int64_t size, int64_t out, int64_t s, int64_t p, int64_t kd,
                        int64_t *lo, int64_t *hi) {
    int64_t l = ceil_div(p - kd, s), h = ceil_div(size + p - kd, s);
    *lo = l < 0 ? 0 : l > out ? out : l;
    *hi = h < *lo ? *lo : h > out ? out : h;
}

/* Images per GEMM: as many as keep the column matrix and the output block within about
 * na_cpu_conv_block_budget elements (4 MiB of f32), so one large GEMM replaces many small
 * ones. The per-thread scratch is that big: at 16 MiB (the old budget) ResNet-9's step at
 * batch 32 held 72 MiB of scratch and grew RSS by 240 MiB; at 4 MiB it holds 29 MiB, grows
 * by 216 MiB and runs no slower (530 against 540 ms; the MNIST CNN's step unchanged). */
int64_t na_cpu_conv_block_budget = (int64_t)1 << 20;

static int64_t images_per_block(const na_conv_geom *g) {
    int64_t cg = g->c_in / g->groups, cog = g->c_out / g->groups;
    int64_t per = (cg * g->kh * g->kw + cog) * g->oh * g->ow;
    int64_t nb = per > 0 ? na_cpu_conv_block_budget / per : g->n;
    return nb < 1 ? 1 : nb > g->n ? g->n : nb;
}

static int check_geom(const char *fn, const na_conv_geom *g, bool conv) {
    if (g->n < 0 || g->c_in < 0 || g->h < 0 || g->w < 0 || g->c_out < 0 || g->oh < 0 ||
        g->ow < 0 || g->kh <= 0 || g->kw <= 0 || g->sh <= 0 || g->sw <= 0 || g->ph < 0 ||
        g->pw < 0 || g->dh <= 0 || g->dw <= 0)
        return na_set_error(NA_EINVAL,
                            "%s: bad geometry n=%lld c_in=%lld h=%lld w=%lld c_out=%lld "
                            "oh=%lld ow=%lld k=%dx%d s=%dx%d p=%dx%d d=%dx%d",
                            fn, (long long)g->n, (long long)g->c_in, (long long)g->h,
                            (long long)g->w, (long long)g->c_out, (long long)g->oh,
                            (long long)g->ow, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh,
                            g->dw);
    if (conv && (g->groups <= 0 || g->c_in % g->groups || g->c_out % g->groups))
        return na_set_error(NA_EINVAL, "%s: %d groups do not divide c_in=%lld, c_out=%lld", fn,
                            g->groups, (long long)g->c_in, (long long)g->c_out);
    return NA_OK;
}

/* ---- the split over the pool ---------------------------------------------------------------
 * Tasks are ranges of images, their number fixed by the problem (never by the thread count),
 * so every image's output, and the order in which the weight gradient's per-task partials are
 * added, are the same for any number of threads. */
enum { NA_CPU_CONV_TASKS = 8 };            /* image ranges of a large convolution */
#define NA_CPU_CONV_TASK_MACS ((int64_t)1 << 20) /* below this much work per task: one task */

int64_t na_cpu_conv_tasks(const na_conv_geom *g) {
    int64_t per_image = g->c_out * (g->c_in / g->groups) * g->kh * g->kw * g->oh * g->ow;
    return g->n < 1 ? 1 : na_cpu_split(g->n * per_image, NA_CPU_CONV_TASK_MACS,
                                       g->n < NA_CPU_CONV_TASKS ? g->n : NA_CPU_CONV_TASKS);
}

/* The weight gradient's tasks: as conv_tasks, but their partials (wsize elements each) kept
 * within the block budget. */
static int64_t weight_grad_tasks(const na_conv_geom *g, int64_t wsize) {
    int64_t t = na_cpu_conv_tasks(g), fit = wsize > 0 ? na_cpu_conv_block_budget / wsize : t;
    return t < fit ? t : fit < 1 ? 1 : fit;
}

typedef struct conv_job conv_job;
static int conv2d_bwd_weight_direct_range(const conv_job *j, int64_t lo, int64_t hi, int64_t t);
struct conv_job {
    const na_conv_geom *g;
    const na_view *x, *gy, *bias;
    na_view *y, *gx;
    const void *wv, *bb; /* weights and bias in the compute type */
    void *gw;            /* weight gradient partials, one per task */
    int64_t tasks;
    int (*range)(const conv_job *j, int64_t lo, int64_t hi, int64_t task); /* images lo..hi */
    na_cpu_task_status status;
};

static void conv_task(void *ctx, int64_t t) {
    conv_job *j = ctx;
    int64_t lo, hi;
    na_cpu_task_range(j->g->n, j->tasks, t, 1, &lo, &hi);
    if (j->range(j, lo, hi, t)) na_cpu_task_fail(&j->status);
}

static int conv_run(conv_job *j) {
    na_cpu_parallel_for(j->g->n ? j->tasks : 0, conv_task, j);
    return na_cpu_task_status_raise(&j->status);
}

#define NA_CPU_DEFINE_CONV(T, SFX, GEMM)                                                    \
    /* rows of col (Cg*kh*kw of them, row stride ld) from the Cg channel planes at x */     \
    static void im2col_##SFX(const na_conv_geom *g, int64_t cg, const T *restrict x,        \
                             T *restrict col, int64_t ld) {                                 \
        const int64_t H = g->h, W = g->w, OH = g->oh, OW = g->ow, SH = g->sh, SW = g->sw;   \
        const int64_t PH = g->ph, PW = g->pw, DH = g->dh, DW = g->dw;                       \
        const int KH = g->kh, KW = g->kw;                                                   \
        for (int64_t c = 0; c < cg; c++)                                                    \
            for (int ki = 0; ki < KH; ki++)                                                 \
                for (int kj = 0; kj < KW; kj++) {                                           \
                    T *row = col + ((c * KH + ki) * KW + kj) * ld;                          \
                    const T *plane = x + c * H * W;                                         \
                    int64_t ylo, yhi, xlo, xhi;                                             \
                    valid_range(H, OH, SH, PH, ki * DH, &ylo, &yhi);                        \
                    valid_range(W, OW, SW, PW, kj * DW, &xlo, &xhi);                        \
                    for (int64_t oy = 0; oy < OH; oy++) {                                   \
                        T *r = row + oy * OW;                                               \
                        if (oy < ylo || oy >= yhi) {                                        \
                            for (int64_t ox = 0; ox < OW; ox++) r[ox] = 0;                  \
                            continue;                                                       \
                        }                                                                   \
                        /* b + ox*SW >= 0 for ox >= xlo */                                  \
                        int64_t b = (oy * SH - PH + ki * DH) * W - PW + kj * DW;            \
                        for (int64_t ox = 0; ox < xlo; ox++) r[ox] = 0;                     \
                        if (SW == 1)                                                        \
                            for (int64_t ox = xlo; ox < xhi; ox++) r[ox] = plane[b + ox];   \
                        else                                                                \
                            for (int64_t ox = xlo; ox < xhi; ox++) r[ox] = plane[b + ox * SW]; \
                        for (int64_t ox = xhi; ox < OW; ox++) r[ox] = 0;                    \
                    }                                                                       \
                }                                                                           \
    }                                                                                       \
    /* x planes += col2im(col), col rows of stride ld */                                    \
    static void col2im_##SFX(const na_conv_geom *g, int64_t cg, const T *restrict col,      \
                             int64_t ld, T *restrict x) {                                   \
        const int64_t H = g->h, W = g->w, OH = g->oh, OW = g->ow, SH = g->sh, SW = g->sw;   \
        const int64_t PH = g->ph, PW = g->pw, DH = g->dh, DW = g->dw;                       \
        const int KH = g->kh, KW = g->kw;                                                   \
        for (int64_t c = 0; c < cg; c++)                                                    \
            for (int ki = 0; ki < KH; ki++)                                                 \
                for (int kj = 0; kj < KW; kj++) {                                           \
                    const T *row = col + ((c * KH + ki) * KW + kj) * ld;                    \
                    T *plane = x + c * H * W;                                               \
                    int64_t ylo, yhi, xlo, xhi;                                             \
                    valid_range(H, OH, SH, PH, ki * DH, &ylo, &yhi);                        \
                    valid_range(W, OW, SW, PW, kj * DW, &xlo, &xhi);                        \
                    for (int64_t oy = ylo; oy < yhi; oy++) {                                \
                        const T *r = row + oy * OW;                                         \
                        int64_t b = (oy * SH - PH + ki * DH) * W - PW + kj * DW;            \
                        for (int64_t ox = xlo; ox < xhi; ox++) plane[b + ox * SW] += r[ox]; \
                    }                                                                       \
                }                                                                           \
    }                                                                                       \
    /* col (K x nb*P, image b in columns [b*P, (b+1)*P)) for group gi of images n0.. */     \
    static void im2col_block_##SFX(const na_conv_geom *g, const na_view *x, int64_t n0,     \
                                   int64_t nb, int64_t gi, T *xb, T *col) {                 \
        int64_t cg = g->c_in / g->groups, HW = g->h * g->w, P = g->oh * g->ow;              \
        for (int64_t b = 0; b < nb; b++) {                                                  \
            const T *xv = na_cpu_view_##SFX(x->dtype, x->data,                              \
                                            ((n0 + b) * g->c_in + gi * cg) * HW, cg * HW, xb); \
            im2col_##SFX(g, cg, xv, col + b * P, nb * P);                                   \
        }                                                                                   \
    }                                                                                       \
    /* blk (Cog x nb*P) = group gi's channels of images n0.. of t [N, C_out, P] */          \
    static void gather_out_##SFX(const na_conv_geom *g, const na_view *t, int64_t n0,       \
                                 int64_t nb, int64_t gi, T *blk) {                          \
        int64_t cog = g->c_out / g->groups, P = g->oh * g->ow;                              \
        for (int64_t b = 0; b < nb; b++)                                                    \
            for (int64_t co = 0; co < cog; co++)                                            \
                na_cpu_load_##SFX(t->dtype, t->data,                                        \
                                  ((n0 + b) * g->c_out + gi * cog + co) * P, P,             \
                                  blk + co * nb * P + b * P);                               \
    }                                                                                       \
                                                                                            \
    /* y for images [lo, hi) */                                                             \
    static int conv2d_range_##SFX(const conv_job *j, int64_t lo, int64_t hi, int64_t t) {   \
        const char *fn = "cpu_conv2d";                                                      \
        const na_conv_geom *g = j->g;                                                       \
        const T *wv = j->wv, *bb = j->bb;                                                   \
        (void)t;                                                                            \
        int64_t G = g->groups, cg = g->c_in / G, cog = g->c_out / G;                        \
        int64_t K = cg * g->kh * g->kw, P = g->oh * g->ow, HW = g->h * g->w;                \
        int64_t NB = images_per_block(g);                                                   \
        T *xb = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)(cg * HW) * sizeof(T), fn);        \
        T *col = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)(K * NB * P) * sizeof(T), fn);    \
        T *yb = na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)(cog * NB * P) * sizeof(T), fn);   \
        if (!xb || !col || !yb) return NA_ENOMEM;                                           \
        for (int64_t n0 = lo; n0 < hi; n0 += NB) {                                          \
            int64_t nb = hi - n0 < NB ? hi - n0 : NB, ld = nb * P;                          \
            for (int64_t gi = 0; gi < G; gi++) {                                            \
                im2col_block_##SFX(g, j->x, n0, nb, gi, xb, col);                           \
                int st = GEMM(false, false, cog, ld, K, 1, wv + gi * cog * K, K, col, ld,   \
                              0, yb, ld);                                                   \
                if (st) return st;                                                          \
                for (int64_t b = 0; b < nb; b++)                                            \
                    for (int64_t co = 0; co < cog; co++) {                                  \
                        T *r = yb + co * ld + b * P, bv = bb[gi * cog + co];                \
                        if (j->bias)                                                        \
                            for (int64_t p = 0; p < P; p++) r[p] += bv;                     \
                        na_cpu_store_##SFX(j->y->dtype, j->y->data,                         \
                                           ((n0 + b) * g->c_out + gi * cog + co) * P, P, r); \
                    }                                                                       \
            }                                                                               \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    /* gx for images [lo, hi) */                                                            \
    static int conv2d_bwd_data_range_##SFX(const conv_job *j, int64_t lo, int64_t hi,       \
                                           int64_t t) {                                     \
        const char *fn = "cpu_conv2d_backward_data";                                        \
        const na_conv_geom *g = j->g;                                                       \
        const T *wv = j->wv;                                                                \
        (void)t;                                                                            \
        int64_t G = g->groups, cg = g->c_in / G, cog = g->c_out / G;                        \
        int64_t K = cg * g->kh * g->kw, P = g->oh * g->ow, HW = g->h * g->w;                \
        int64_t NB = images_per_block(g);                                                   \
        T *gxb = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)(cg * HW) * sizeof(T), fn);       \
        T *col = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)(K * NB * P) * sizeof(T), fn);    \
        T *gyb = na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)(cog * NB * P) * sizeof(T), fn);  \
        if (!gxb || !col || !gyb) return NA_ENOMEM;                                         \
        for (int64_t n0 = lo; n0 < hi; n0 += NB) {                                          \
            int64_t nb = hi - n0 < NB ? hi - n0 : NB, ld = nb * P;                          \
            for (int64_t gi = 0; gi < G; gi++) {                                            \
                gather_out_##SFX(g, j->gy, n0, nb, gi, gyb);                                \
                int st = GEMM(true, false, K, ld, cog, 1, wv + gi * cog * K, K, gyb, ld,    \
                              0, col, ld);                                                  \
                if (st) return st;                                                          \
                for (int64_t b = 0; b < nb; b++) {                                          \
                    int64_t off = ((n0 + b) * g->c_in + gi * cg) * HW;                      \
                    T *gxv = na_cpu_out_##SFX(j->gx->dtype, j->gx->data, off, gxb);         \
                    memset(gxv, 0, (size_t)(cg * HW) * sizeof(T));                          \
                    col2im_##SFX(g, cg, col + b * P, ld, gxv);                              \
                    na_cpu_store_##SFX(j->gx->dtype, j->gx->data, off, cg * HW, gxv);       \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    /* task t's partial (c_out x K) = the weight gradient of images [lo, hi) (lo < hi) */   \
    static int conv2d_bwd_weight_range_##SFX(const conv_job *j, int64_t lo, int64_t hi,     \
                                             int64_t t) {                                   \
        const char *fn = "cpu_conv2d_backward_weight";                                      \
        const na_conv_geom *g = j->g;                                                       \
        int64_t G = g->groups, cg = g->c_in / G, cog = g->c_out / G;                        \
        int64_t K = cg * g->kh * g->kw, P = g->oh * g->ow, HW = g->h * g->w;                \
        T *gw = (T *)j->gw + t * g->c_out * K;                                              \
        int64_t NB = images_per_block(g);                                                   \
        T *xb = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)(cg * HW) * sizeof(T), fn);        \
        T *col = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)(K * NB * P) * sizeof(T), fn);    \
        T *gyb = na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)(cog * NB * P) * sizeof(T), fn);  \
        if (!xb || !col || !gyb) return NA_ENOMEM;                                          \
        for (int64_t n0 = lo; n0 < hi; n0 += NB) {                                          \
            int64_t nb = hi - n0 < NB ? hi - n0 : NB, ld = nb * P;                          \
            for (int64_t gi = 0; gi < G; gi++) {                                            \
                im2col_block_##SFX(g, j->x, n0, nb, gi, xb, col);                           \
                gather_out_##SFX(g, j->gy, n0, nb, gi, gyb);                                \
                int st = GEMM(false, true, cog, K, ld, 1, gyb, ld, col, ld,                 \
                              n0 == lo ? 0 : 1, gw + gi * cog * K, K);                      \
                if (st) return st;                                                          \
            }                                                                               \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    static int conv2d_##SFX(const na_conv_geom *g, const na_view *x, const na_view *w,      \
                            const na_view *bias, na_view *y) {                              \
        const char *fn = "cpu_conv2d";                                                      \
        int64_t K = g->c_in / g->groups * g->kh * g->kw;                                    \
        T *wb = na_cpu_scratch(NA_CPU_SCRATCH_3, (size_t)(g->c_out * K) * sizeof(T), fn);   \
        T *bb = na_cpu_scratch(NA_CPU_SCRATCH_4, (size_t)g->c_out * sizeof(T), fn);         \
        if (!wb || !bb) return NA_ENOMEM;                                                   \
        conv_job j = {.g = g, .x = x, .bias = bias, .y = y, .bb = bb,                       \
                      .wv = na_cpu_view_##SFX(w->dtype, w->data, 0, g->c_out * K, wb),      \
                      .tasks = na_cpu_conv_tasks(g), .range = conv2d_range_##SFX};          \
        if (bias) na_cpu_load_##SFX(bias->dtype, bias->data, 0, g->c_out, bb);              \
        else memset(bb, 0, (size_t)g->c_out * sizeof(T));                                   \
        return conv_run(&j);                                                                \
    }                                                                                       \
                                                                                            \
    static int conv2d_bwd_data_##SFX(const na_conv_geom *g, const na_view *gy,              \
                                     const na_view *w, na_view *gx) {                       \
        const char *fn = "cpu_conv2d_backward_data";                                        \
        int64_t K = g->c_in / g->groups * g->kh * g->kw;                                    \
        T *wb = na_cpu_scratch(NA_CPU_SCRATCH_3, (size_t)(g->c_out * K) * sizeof(T), fn);   \
        if (!wb) return NA_ENOMEM;                                                          \
        conv_job j = {.g = g, .gy = gy, .gx = gx, .tasks = na_cpu_conv_tasks(g),            \
                      .range = conv2d_bwd_data_range_##SFX,                                 \
                      .wv = na_cpu_view_##SFX(w->dtype, w->data, 0, g->c_out * K, wb)};     \
        return conv_run(&j);                                                                \
    }                                                                                       \
                                                                                            \
    /* one partial gradient per task, added in task order */                                \
    static int conv2d_bwd_weight_##SFX(const na_conv_geom *g, const na_view *x,             \
                                       const na_view *gy, na_view *gw) {                    \
        const char *fn = "cpu_conv2d_backward_weight";                                      \
        int64_t wsize = g->c_out * (g->c_in / g->groups) * g->kh * g->kw;                   \
        int64_t tasks = weight_grad_tasks(g, wsize);                                        \
        T *gwb = na_cpu_scratch(NA_CPU_SCRATCH_3, (size_t)(wsize * tasks) * sizeof(T), fn); \
        if (!gwb) return NA_ENOMEM;                                                         \
        /* with one task its partial is the gradient, written in place when gw is of T */   \
        T *gwv = tasks == 1 ? na_cpu_out_##SFX(gw->dtype, gw->data, 0, gwb) : gwb;          \
        if (g->n == 0) memset(gwv, 0, (size_t)wsize * sizeof(T));                           \
        conv_job j = {.g = g, .x = x, .gy = gy, .gw = gwv, .tasks = tasks,                  \
                      .range = sizeof(T) == sizeof(float) &&                                \
                                       na_cpu_direct_wgrad_usable(g)                        \
                                   ? conv2d_bwd_weight_direct_range                         \
                                   : conv2d_bwd_weight_range_##SFX};                        \
        int st = conv_run(&j);                                                              \
        if (st) return st;                                                                  \
        for (int64_t t = 1; t < tasks; t++)                                                 \
            for (int64_t i = 0; i < wsize; i++) gwv[i] += gwv[t * wsize + i];               \
        na_cpu_store_##SFX(gw->dtype, gw->data, 0, wsize, gwv);                             \
        return NA_OK;                                                                       \
    }

NA_CPU_DEFINE_CONV(float, f, na_cpu_sgemm)
NA_CPU_DEFINE_CONV(double, d, na_cpu_dgemm)

/* task t's weight-gradient partial of images [lo, hi) on the direct path (cpu_direct_conv.c) */
static int conv2d_bwd_weight_direct_range(const conv_job *j, int64_t lo, int64_t hi, int64_t t) {
    const na_conv_geom *g = j->g;
    float *gw = (float *)j->gw + t * g->c_out * (g->c_in / g->groups) * g->kh * g->kw;
    return na_cpu_direct_conv2d_wgrad_range(g, j->x, j->gy, lo, hi, gw);
}

/* f64 (any operand) runs the GEMM path in double; f32 compute runs the direct convolution
 * (cpu_direct_conv.c) where it applies (`direct_ok`), else the GEMM path in float. */
#define NA_CPU_CONV_DISPATCH(fn, name, direct_ok, direct_call, a, b, c, ...)                \
    do {                                                                                    \
        NA_CPU_CHECK_FLOAT(fn, a);                                                          \
        NA_CPU_CHECK_FLOAT(fn, b);                                                          \
        NA_CPU_CHECK_FLOAT(fn, c);                                                          \
        int st_ = check_geom(fn, g, true);                                                  \
        if (st_) return st_;                                                                \
        bool d_ = a->dtype == NA_DTYPE_F64 || b->dtype == NA_DTYPE_F64 ||                   \
                  c->dtype == NA_DTYPE_F64;                                                 \
        if (d_) return name##_d(g, __VA_ARGS__);                                            \
        return (direct_ok) ? (direct_call) : name##_f(g, __VA_ARGS__);                      \
    } while (0)

static int conv2d_c(const na_conv_geom *g, const na_view *x, const na_view *w,
                    const na_view *bias, na_view *y) {
    NA_CPU_CHECK_FLOAT("cpu_conv2d", bias);
    NA_CPU_CONV_DISPATCH("cpu_conv2d", conv2d, na_cpu_direct_conv_usable(g, false),
                         na_cpu_direct_conv2d(g, x, w, bias, y, false), x, w, y, x, w, bias, y);
}

static int conv2d_backward_data_c(const na_conv_geom *g, const na_view *gy, const na_view *w,
                                  na_view *gx) {
    NA_CPU_CONV_DISPATCH("cpu_conv2d_backward_data", conv2d_bwd_data,
                         na_cpu_direct_conv_usable(g, true),
                         na_cpu_direct_conv2d(g, gy, w, NULL, gx, true), gy, w, gx, gy, w, gx);
}

/* The weight gradient on the direct path is split by images (one partial per task, as the GEMM
 * path) where the partials fit the block budget, else by output channels. */
static bool wgrad_by_rows(const na_conv_geom *g) {
    int64_t wsize = g->c_out * (g->c_in / g->groups) * g->kh * g->kw;
    return g->groups == 1 && g->c_out >= 64 &&
           weight_grad_tasks(g, wsize) < na_cpu_conv_tasks(g) &&
           na_cpu_direct_wgrad_usable(g);
}

static int conv2d_backward_weight_c(const na_conv_geom *g, const na_view *x, const na_view *gy,
                                    na_view *gw) {
    NA_CPU_CONV_DISPATCH("cpu_conv2d_backward_weight", conv2d_bwd_weight, wgrad_by_rows(g),
                         na_cpu_direct_conv2d_wgrad_rows(g, x, gy, gw), x, gy, gw, x, gy, gw);
}

/* ---- pooling ---------------------------------------------------------------------------- */

/* [lo, hi): the window taps i < k whose cell start + i*d lies in [0, size) */
static void win_range(int64_t start, int64_t size, int64_t d, int k, int64_t *lo, int64_t *hi) {
    int64_t l = start >= 0 ? 0 : ceil_div(-start, d);
    int64_t h = start >= size ? 0 : ceil_div(size - start, d);
    *lo = l > k ? k : l;
    *hi = h > k ? k : h < *lo ? *lo : h;
}

/* the geometry as locals: the output stores could otherwise alias *g (-fno-strict-aliasing) */
#define NA_CPU_POOL_LOCALS(g)                                                               \
    const int64_t H = (g)->h, W = (g)->w, OH = (g)->oh, OW = (g)->ow;                       \
    const int64_t SH = (g)->sh, SW = (g)->sw, PH = (g)->ph, PW = (g)->pw, DH = (g)->dh,     \
                  DW = (g)->dw;                                                             \
    const int KH = (g)->kh, KW = (g)->kw;                                                   \
    const int64_t HW = H * W, P = OH * OW;                                                  \
    (void)SH; (void)SW; (void)PH; (void)PW; (void)DH; (void)DW; (void)KH; (void)KW

/* for each output (oy, ox) of a plane: BODY with the window's valid taps [ilo, ihi) x
 * [jlo, jhi), its top-left cell (y0, x0) and the output index o */
#define NA_CPU_POOL_FOR_EACH_OUTPUT(BODY)                                                   \
    for (int64_t oy = 0; oy < OH; oy++) {                                                   \
        int64_t y0 = oy * SH - PH, ilo, ihi;                                                \
        win_range(y0, H, DH, KH, &ilo, &ihi);                                               \
        for (int64_t ox = 0; ox < OW; ox++) {                                               \
            int64_t x0 = ox * SW - PW, jlo, jhi, o = oy * OW + ox;                          \
            win_range(x0, W, DW, KW, &jlo, &jhi);                                           \
            BODY                                                                            \
        }                                                                                   \
    }

/* ---- the 2x2 stride-2 max pool of CNNs, branch-free and vectorized --------------------------
 * Windows 2x2, stride 2, no padding or dilation, each inside the input. Same bits and indices
 * as the generic loop below, which stays the specification (tests compare the two on random
 * inputs with NaNs and ties): the first maximum in row-major window order wins, and the first
 * NaN wins over any number. f32 rows run 16 windows at a time with AVX-512 where the CPU has
 * it (else 4 with SSE2); f16 and bf16 planes the same 16 windows, converted in registers and
 * never widened into f32 copies, where it has AVX-512BW (na_cpu_half512), or 8 windows where
 * it has AVX2 + F16C (na_cpu_half_avx2). The f32 backward
 * needs no such path: its memset and one scatter per output already run at memory speed (a 2x2
 * select version measured 1.5-2x slower); f16/bf16 planes scatter their halves directly
 * (max_pool_bwd_2x2_half), with no f32 plane and no conversions. */
bool na_cpu_pool_force_generic = false;

static bool is_pool_2x2(const na_conv_geom *g) {
    return !na_cpu_pool_force_generic && g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 &&
           g->ph == 0 && g->pw == 0 && g->dh == 1 && g->dw == 1 && 2 * g->oh <= g->h &&
           2 * g->ow <= g->w && g->h * g->w <= INT32_MAX;
}

/* the generic loop's "v replaces best" (larger, or a NaN over a number) as selects */
#define NA_CPU_POOL_TAKE(T, v, off)                                                         \
    do {                                                                                    \
        T v_ = (v);                                                                         \
        int take_ = (v_ > best) | ((v_ != v_) & (best == best));                            \
        best = take_ ? v_ : best;                                                           \
        bi = take_ ? (off) : bi;                                                            \
    } while (0)

#ifdef __SSE2__
#include <emmintrin.h>
/* NA_CPU_POOL_TAKE on four windows at once */
static inline void pool_take_sse2(__m128 v, __m128i off, __m128 *best, __m128i *bi) {
    __m128 nan_over_number = _mm_and_ps(_mm_cmpunord_ps(v, v), _mm_cmpord_ps(*best, *best));
    __m128 take = _mm_or_ps(_mm_cmpgt_ps(v, *best), nan_over_number);
    *best = _mm_or_ps(_mm_and_ps(take, v), _mm_andnot_ps(take, *best));
    __m128i t = _mm_castps_si128(take);
    *bi = _mm_or_si128(_mm_and_si128(t, off), _mm_andnot_si128(t, *bi));
}

/* f32 windows four at a time with SSE2 (every x86-64; the compiler does not vectorize the
 * scalar loop below); returns how many outputs it wrote */
static int64_t max_pool_2x2_sse2_f(const float *r0, const float *r1, int64_t ow, int32_t at,
                                   int32_t w, float *y, int32_t *idx) {
    const __m128i first = _mm_set_epi32(6, 4, 2, 0); /* the windows' offsets in a row pair */
    const __m128i right = _mm_set1_epi32(1), below = _mm_set1_epi32(w);
    const __m128i diag = _mm_set1_epi32(w + 1);
    int64_t ox = 0;
    for (; ox + 4 <= ow; ox += 4) {
        __m128 a0 = _mm_loadu_ps(r0 + 2 * ox), a1 = _mm_loadu_ps(r0 + 2 * ox + 4);
        __m128 b0 = _mm_loadu_ps(r1 + 2 * ox), b1 = _mm_loadu_ps(r1 + 2 * ox + 4);
        __m128 best = _mm_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)); /* even columns */
        __m128i bi = _mm_setzero_si128();
        pool_take_sse2(_mm_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)), right, &best, &bi);
        pool_take_sse2(_mm_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)), below, &best, &bi);
        pool_take_sse2(_mm_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)), diag, &best, &bi);
        _mm_storeu_ps(y + ox, best);
        __m128i base = _mm_add_epi32(_mm_set1_epi32(at + 2 * (int32_t)ox), first);
        _mm_storeu_si128((__m128i *)(idx + ox), _mm_add_epi32(base, bi));
    }
    return ox;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "cpu/cpu_half_simd.h"
#define NA_POOL_AVX512 __attribute__((target("avx512f")))
/* NA_CPU_POOL_TAKE on sixteen windows at once */
NA_POOL_AVX512 static inline void pool_take_avx512(__m512 v, int32_t off, __m512 *best,
                                                    __m512i *bi) {
    __mmask16 take = _mm512_cmp_ps_mask(v, *best, _CMP_GT_OQ) |
                     (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) &
                      _mm512_cmp_ps_mask(*best, *best, _CMP_ORD_Q));
    *best = _mm512_mask_mov_ps(*best, take, v);
    *bi = _mm512_mask_mov_epi32(*bi, take, _mm512_set1_epi32(off));
}

/* the 16 windows of outputs ox.. of a row from the 32 inputs a0:a1 (row r0) and b0:b1 (row
 * r1), their even and odd columns by two-source permutes; their indices stored under mask mo */
NA_POOL_AVX512 static inline __m512 pool_16_avx512(__m512 a0, __m512 a1, __m512 b0, __m512 b1,
                                                   int64_t ox, int32_t at, int32_t w,
                                                   __mmask16 mo, int32_t *idx) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4,
                                          2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __m512 best = _mm512_permutex2var_ps(a0, even, a1);
    __m512i bi = _mm512_setzero_si512();
    pool_take_avx512(_mm512_permutex2var_ps(a0, odd, a1), 1, &best, &bi);
    pool_take_avx512(_mm512_permutex2var_ps(b0, even, b1), w, &best, &bi);
    pool_take_avx512(_mm512_permutex2var_ps(b0, odd, b1), w + 1, &best, &bi);
    __m512i base = _mm512_add_epi32(_mm512_set1_epi32(at + 2 * (int32_t)ox), even);
    _mm512_mask_storeu_epi32(idx + ox, mo, _mm512_add_epi32(base, bi));
    return best;
}

/* the input masks of the 16 windows from output ox of a row of ow: 2n columns in two halves */
#define NA_POOL_MASKS(ow, ox)                                                               \
    int64_t n = ow - ox < 16 ? ow - ox : 16, cols = 2 * n;                                  \
    __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xFFFF : (1u << cols) - 1);                     \
    __mmask16 m1 = (__mmask16)(cols > 16 ? (1u << (cols - 16)) - 1 : 0);                    \
    __mmask16 mo = (__mmask16)((1u << n) - 1)

/* a whole output row, sixteen windows at a time with AVX-512, the row's end masked (a row of
 * 7 or 14 outputs, as in the MNIST CNN, is one step where SSE2 left a scalar tail) */
NA_POOL_AVX512 static int64_t max_pool_2x2_avx512_f(const float *r0, const float *r1,
                                                     int64_t ow, int32_t at, int32_t w,
                                                     float *y, int32_t *idx) {
    for (int64_t ox = 0; ox < ow; ox += 16) {
        NA_POOL_MASKS(ow, ox);
        __m512 a0 = _mm512_maskz_loadu_ps(m0, r0 + 2 * ox);
        __m512 a1 = _mm512_maskz_loadu_ps(m1, r0 + 2 * ox + 16);
        __m512 b0 = _mm512_maskz_loadu_ps(m0, r1 + 2 * ox);
        __m512 b1 = _mm512_maskz_loadu_ps(m1, r1 + 2 * ox + 16);
        _mm512_mask_storeu_ps(y + ox, mo, pool_16_avx512(a0, a1, b0, b1, ox, at, w, mo, idx));
    }
    return ow;
}

/* the same row of f16 (f16) or bf16 inputs and outputs, converted in registers
 * (cpu_half_simd.h): the maximum of halves is one of them, so its rounding gives it back,
 * NaNs made canonical as the widening path's store makes them */
NA_HALF512 static void max_pool_2x2_avx512_h(bool f16, const uint16_t *r0, const uint16_t *r1,
                                             int64_t ow, int32_t at, int32_t w, uint16_t *y,
                                             int32_t *idx) {
    for (int64_t ox = 0; ox < ow; ox += 16) {
        NA_POOL_MASKS(ow, ox);
        __m512 a0 = na_h512_load(f16, r0 + 2 * ox, m0);
        __m512 a1 = na_h512_load(f16, r0 + 2 * ox + 16, m1);
        __m512 b0 = na_h512_load(f16, r1 + 2 * ox, m0);
        __m512 b1 = na_h512_load(f16, r1 + 2 * ox + 16, m1);
        na_h512_store(f16, y + ox, mo, pool_16_avx512(a0, a1, b0, b1, ox, at, w, mo, idx));
    }
}
#endif

/* NA_CPU_POOL_TAKE on eight windows at once (AVX2) */
NA_HALF_AVX2 static inline void pool_take_avx2(__m256 v, int32_t off, __m256 *best,
                                                __m256i *bi) {
    __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, *best, _CMP_GT_OQ),
                               _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q),
                                             _mm256_cmp_ps(*best, *best, _CMP_ORD_Q)));
    *best = _mm256_blendv_ps(*best, v, take);
    *bi = _mm256_blendv_epi8(*bi, _mm256_set1_epi32(off), _mm256_castps_si256(take));
}

/* max_pool_2x2_avx512_h eight windows at a time in AVX2 + F16C (na_cpu_half_avx2): the 16
 * halves of a row pair's 8 windows widened into two vectors of 8, their even and odd columns
 * by in-lane shuffles (windows in the order 0 1 4 5 2 3 6 7, put back in order by one
 * cross-lane permute of the maxima and of their offsets); a row's last < 8 windows by
 * AVX2's 32-bit masked loads and stores (a window's two columns are one lane), y's halves
 * through a buffer (na_h8_store) */
NA_HALF_AVX2 static void max_pool_2x2_avx2_h(bool f16, const uint16_t *r0, const uint16_t *r1,
                                             int64_t ow, int32_t at, int32_t w, uint16_t *y,
                                             int32_t *idx) {
    const __m256i lane2 = _mm256_set_epi32(14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t ox = 0; ox < ow; ox += 8) {
        int64_t n = ow - ox < 8 ? ow - ox : 8;
        __m256i lanes = na_lanes8(n);
        /* window k's two columns are 32-bit lane k of the row: masked 32-bit loads, lanes
         * past n zero; a0, b0 windows 0-3, a1, b1 windows 4-7 */
        __m128i l0 = _mm256_castsi256_si128(lanes), l1 = _mm256_extracti128_si256(lanes, 1);
        __m256 a0 = na_h8_widen(f16, _mm_maskload_epi32((const int *)(const void *)(r0 + 2 * ox), l0));
        __m256 a1 = na_h8_widen(f16, _mm_maskload_epi32((const int *)(const void *)(r0 + 2 * ox + 8), l1));
        __m256 b0 = na_h8_widen(f16, _mm_maskload_epi32((const int *)(const void *)(r1 + 2 * ox), l0));
        __m256 b1 = na_h8_widen(f16, _mm_maskload_epi32((const int *)(const void *)(r1 + 2 * ox + 8), l1));
        __m256 best = _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0));
        __m256i bi = _mm256_setzero_si256();
        pool_take_avx2(_mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)), 1, &best, &bi);
        pool_take_avx2(_mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)), w, &best, &bi);
        pool_take_avx2(_mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)), w + 1, &best, &bi);
        best = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(best), _MM_SHUFFLE(3, 1, 2, 0)));
        bi = _mm256_permute4x64_epi64(bi, _MM_SHUFFLE(3, 1, 2, 0));
        __m256i ix = _mm256_add_epi32(_mm256_set1_epi32(at + 2 * (int32_t)ox),
                                      _mm256_add_epi32(lane2, bi));
        if (n == 8) _mm256_storeu_si256((__m256i *)(idx + ox), ix);
        else _mm256_maskstore_epi32(idx + ox, lanes, ix);
        na_h8_store(f16, y + ox, n, best);
    }
    _mm256_zeroupper(); /* on every path to the return, ow == 0 too (avx_upper_state) */
}

/* 8 windows of a 2x2 backward in AVX2, the first n of them real (pool_bwd_16_h's rule, 8
 * lanes): window k's index iv[k], gradient gy[k], top-left cell at[k] of the plane; its two
 * cells of the top row to r0 + 2k, of the bottom row to r1 + 2k as one 32-bit lane each. Full
 * 8-lane loads where `avail` elements of gy and iv lie ahead, full stores where the plane
 * (hw cells, r0 and r1 `room0`, `room1` cells from its end) has 16 cells ahead: the caller
 * orders the windows so that what lanes past n write there (zeros) is rewritten later
 * (max_pool_bwd_2x2_avx2_h). false: an index inside the plane but outside its window. */
NA_HALF_AVX2 static inline bool pool_bwd_8_h(bool f16, const uint16_t *gy, const int32_t *iv,
                                             int64_t n, int64_t avail, __m256i at, int32_t w,
                                             int32_t hw, uint16_t *r0, int64_t room0,
                                             uint16_t *r1, int64_t room1) {
    const __m128i abs = _mm_set1_epi16(0x7FFF), inf = _mm_set1_epi16(f16 ? 0x7C00 : 0x7F80);
    const __m256i neg = _mm256_set1_epi32(-1);
    __m256i lanes = na_lanes8(n), i;
    __m128i b;
    if (avail >= 8) { /* lanes past n: the next windows' data, masked off below */
        i = _mm256_loadu_si256((const __m256i *)iv);
        b = _mm_loadu_si128((const __m128i *)gy);
    } else {
        i = _mm256_maskload_epi32(iv, lanes);
        b = na_h8_bits(gy, n);
    }
    /* lanes past n: index -1, off the plane, so they pass and write zeros */
    i = _mm256_blendv_epi8(neg, i, lanes);
    __m256i d = _mm256_sub_epi32(i, at);
    __m256i k0 = _mm256_cmpeq_epi32(d, _mm256_setzero_si256()),
            k1 = _mm256_cmpeq_epi32(d, _mm256_set1_epi32(1)),
            kw = _mm256_cmpeq_epi32(d, _mm256_set1_epi32(w)),
            kw1 = _mm256_cmpeq_epi32(d, _mm256_set1_epi32(w + 1));
    __m256i in_plane = _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(hw), i),
                                        _mm256_cmpgt_epi32(i, neg));
    __m256i own = _mm256_or_si256(_mm256_or_si256(k0, k1), _mm256_or_si256(kw, kw1));
    if (_mm256_movemask_epi8(_mm256_andnot_si256(own, in_plane))) return false;
    __m128i a = _mm_and_si128(b, abs);
    __m128i nan = f16 ? _mm_or_si128(_mm_andnot_si128(abs, b), _mm_set1_epi16(0x7E00))
                      : _mm_set1_epi16(0x7FC0);
    b = _mm_andnot_si128(_mm_cmpeq_epi16(a, _mm_setzero_si128()), b); /* -0: +0 */
    b = _mm_blendv_epi8(b, nan, _mm_cmpgt_epi16(a, inf));
    __m256i b32 = _mm256_cvtepu16_epi32(b);
    __m256i top = _mm256_or_si256(_mm256_and_si256(b32, k0),
                                  _mm256_slli_epi32(_mm256_and_si256(b32, k1), 16));
    __m256i bot = _mm256_or_si256(_mm256_and_si256(b32, kw),
                                  _mm256_slli_epi32(_mm256_and_si256(b32, kw1), 16));
    /* masked stores only where they must be: they are microcoded on Zen (the widening path
     * ran faster than these with a masked store a row) */
    if (room0 >= 16) _mm256_storeu_si256((__m256i *)r0, top);
    else _mm256_maskstore_epi32((int *)(void *)r0, lanes, top);
    if (room1 >= 16) _mm256_storeu_si256((__m256i *)r1, bot);
    else _mm256_maskstore_epi32((int *)(void *)r1, lanes, bot);
    return true;
}

/* max_pool_bwd_2x2_avx512_h in 8 lanes of AVX2 (na_cpu_half_avx2), branch-free (a
 * per-window branch on where the index points mispredicted on random data and ran slower
 * than the widening path). gy and iv hold `avail` elements from the plane's start. A row's
 * last < 8 windows go first, with full 8-lane stores where the plane has room: the zeros
 * their extra lanes write land past the row's windows, on the next cell rows' starts (which
 * the row's first 8 windows, or the next rows, write after them), leftover columns or rows
 * (which the caller zeroes after), never before the plane's end. false as pool_bwd_16_h,
 * having written part of the plane. */
NA_HALF_AVX2 static bool max_pool_bwd_2x2_avx2_h(bool f16, const uint16_t *gy,
                                                 const int32_t *iv, int64_t avail, int64_t oh,
                                                 int64_t ow, int32_t w, int32_t hw,
                                                 uint16_t *gx) {
    const __m256i lane2 = _mm256_set_epi32(14, 12, 10, 8, 6, 4, 2, 0);
    int64_t tail = ow % 8, full = ow - tail;
    for (int64_t oy = 0; oy < oh; oy++) {
        int64_t c0 = 2 * oy * w, p0 = oy * ow;
        for (int64_t k = tail ? -1 : 0; k < full; k += k < 0 ? 1 : 8) {
            int64_t ox = k < 0 ? full : k, n = k < 0 ? tail : 8, c = c0 + 2 * ox;
            __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int32_t)c), lane2);
            if (!pool_bwd_8_h(f16, gy + p0 + ox, iv + p0 + ox, n, avail - p0 - ox, at, w, hw,
                              gx + c, hw - c, gx + c + w, hw - c - w))
                return false;
        }
    }
    return true;
}

/* 16 windows of a 2x2 backward at once, f16 (f16) or bf16 gy and gx, the lanes under mo:
 * window k's top-left cell is at[k] of the plane (hw cells, rows of w); *top and *bot get,
 * per 32-bit lane, the window's two cells of its top and bottom row (the left one at the lower
 * address): gy's bits where the index points, 0 elsewhere (branch-free: the winner is data).
 * gy is made what the f32 path's 0 + gy rounded back gives: -0 is +0, NaNs canonical (half.h's
 * store: f16 sign | 0x7E00, bf16 0x7FC0). false: an index inside the plane but outside its
 * window. */
NA_HALF512 static inline bool pool_bwd_16_h(bool f16, const uint16_t *gy, const int32_t *iv,
                                            __mmask16 mo, __m512i at, int32_t w, int32_t hw,
                                            __m512i *top, __m512i *bot) {
    const __m256i abs = _mm256_set1_epi16(0x7FFF), inf = _mm256_set1_epi16(f16 ? 0x7C00 : 0x7F80);
    __m512i i = _mm512_maskz_loadu_epi32(mo, iv), d = _mm512_sub_epi32(i, at);
    __mmask16 k0 = _mm512_mask_cmpeq_epi32_mask(mo, d, _mm512_setzero_si512());
    __mmask16 k1 = _mm512_mask_cmpeq_epi32_mask(mo, d, _mm512_set1_epi32(1));
    __mmask16 kw = _mm512_mask_cmpeq_epi32_mask(mo, d, _mm512_set1_epi32(w));
    __mmask16 kw1 = _mm512_mask_cmpeq_epi32_mask(mo, d, _mm512_set1_epi32(w + 1));
    __mmask16 in_plane = _mm512_mask_cmplt_epu32_mask(mo, i, _mm512_set1_epi32(hw));
    if (in_plane & ~(k0 | k1 | kw | kw1)) return false;
    __m256i b = _mm256_maskz_loadu_epi16(mo, gy), a = _mm256_and_si256(b, abs);
    __m256i nan = f16 ? _mm256_or_si256(_mm256_andnot_si256(abs, b), _mm256_set1_epi16(0x7E00))
                      : _mm256_set1_epi16(0x7FC0);
    b = _mm256_mask_mov_epi16(b, _mm256_cmpeq_epi16_mask(a, _mm256_setzero_si256()),
                              _mm256_setzero_si256());
    b = _mm256_mask_mov_epi16(b, _mm256_cmpgt_epi16_mask(a, inf), nan);
    *top = _mm512_or_si512(
        _mm512_cvtepu16_epi32(_mm256_maskz_mov_epi16(k0, b)),
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_mov_epi16(k1, b)), 16));
    *bot = _mm512_or_si512(
        _mm512_cvtepu16_epi32(_mm256_maskz_mov_epi16(kw, b)),
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_mov_epi16(kw1, b)), 16));
    return true;
}

/* output rows [oy0, oy1) of a plane's 2x2 backward (ow windows a row, input rows of w, hw
 * cells) into gx: 16 windows a step along a row, or, where two rows fit in 16 lanes (ow <= 8,
 * the 14x14 layer's 7), two rows a step. false as pool_bwd_16_h, having written part of it. */
NA_HALF512 static bool max_pool_bwd_2x2_avx512_h(bool f16, const uint16_t *gy,
                                                 const int32_t *iv, int64_t oh, int64_t ow,
                                                 int32_t w, int32_t hw, uint16_t *gx) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i top, bot;
    int64_t oy = 0;
    if (2 * ow <= 16) {
        /* lanes [0, ow): row oy, [ow, 2ow): row oy + 1, whose cells lie 2w further on */
        __mmask16 lo = na_h512_mask(ow), hi = (__mmask16)(na_h512_mask(2 * ow) & ~lo);
        __m512i off = _mm512_mask_add_epi32(_mm512_slli_epi32(lane, 1), hi,
                                            _mm512_slli_epi32(lane, 1),
                                            _mm512_set1_epi32(2 * w - 2 * (int32_t)ow));
        for (; oy + 2 <= oh; oy += 2) {
            uint16_t *r0 = gx + 2 * oy * w, *r1 = r0 + w;
            if (!pool_bwd_16_h(f16, gy + oy * ow, iv + oy * ow, lo | hi,
                               _mm512_add_epi32(_mm512_set1_epi32(2 * (int32_t)oy * w), off), w,
                               hw, &top, &bot))
                return false;
            _mm512_mask_storeu_epi32(r0, lo, top);
            _mm512_mask_storeu_epi32(r1, lo, bot);
            /* lane k >= ow lands at r0 + 2w + 2(k - ow) */
            _mm512_mask_storeu_epi32(r0 + 2 * w - 2 * ow, hi, top);
            _mm512_mask_storeu_epi32(r1 + 2 * w - 2 * ow, hi, bot);
        }
    }
    for (; oy < oh; oy++) {
        uint16_t *r0 = gx + 2 * oy * w, *r1 = r0 + w;
        for (int64_t ox = 0; ox < ow; ox += 16) {
            __mmask16 mo = na_h512_mask(ow - ox);
            __m512i at = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(2 * oy * w + 2 * ox)),
                                          _mm512_slli_epi32(lane, 1));
            if (!pool_bwd_16_h(f16, gy + oy * ow + ox, iv + oy * ow + ox, mo, at, w, hw, &top,
                               &bot))
                return false;
            _mm512_mask_storeu_epi32(r0 + 2 * ox, mo, top);
            _mm512_mask_storeu_epi32(r1 + 2 * ox, mo, bot);
        }
    }
    return true;
}

/* the vector part of a row: AVX-512 where the CPU has it, else SSE2 */
static int64_t max_pool_2x2_vec_f(const float *r0, const float *r1, int64_t ow, int32_t at,
                                  int32_t w, float *y, int32_t *idx) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (na_cpu_has_avx512f()) return max_pool_2x2_avx512_f(r0, r1, ow, at, w, y, idx);
#endif
#ifdef __SSE2__
    return max_pool_2x2_sse2_f(r0, r1, ow, at, w, y, idx);
#else
    (void)r0, (void)r1, (void)ow, (void)at, (void)w, (void)y, (void)idx;
    return 0;
#endif
}
#define max_pool_2x2_vec_d(r0, r1, ow, at, w, y, idx) 0

#define NA_CPU_DEFINE_POOL_2X2(T, SFX)                                                      \
    /* one output row from input rows r0, r1; `at` is the flat index of r0[0] */            \
    static void max_pool_2x2_row_##SFX(const T *r0, const T *r1, int64_t ow, int32_t at,    \
                                       int32_t w, T *y, int32_t *idx) {                     \
        for (int64_t ox = max_pool_2x2_vec_##SFX(r0, r1, ow, at, w, y, idx); ox < ow; ox++) { \
            T best = r0[2 * ox];                                                            \
            int32_t bi = 0;                                                                 \
            NA_CPU_POOL_TAKE(T, r0[2 * ox + 1], 1);                                         \
            NA_CPU_POOL_TAKE(T, r1[2 * ox], w);                                             \
            NA_CPU_POOL_TAKE(T, r1[2 * ox + 1], w + 1);                                     \
            y[ox] = best;                                                                   \
            idx[ox] = at + 2 * (int32_t)ox + bi;                                            \
        }                                                                                   \
    }

NA_CPU_DEFINE_POOL_2X2(float, f)
NA_CPU_DEFINE_POOL_2X2(double, d)

/* plane pl of a 2x2 pool whose x and y are both f16 or both bf16, in registers where the CPU
 * has AVX-512BW (na_cpu_half512): read and written at half the bytes, no f32 copies. Returns
 * whether it ran. */
static bool max_pool_2x2_half(const na_conv_geom *g, const na_view *x, na_view *y, int64_t pl,
                              int32_t *iv, int32_t *ib) {
#if defined(__x86_64__) && defined(__GNUC__)
    bool f16 = x->dtype == NA_DTYPE_F16;
    if ((!f16 && x->dtype != NA_DTYPE_BF16) || y->dtype != x->dtype) return false;
    bool avx2 = na_cpu_half_avx2();
    if (!avx2 && !na_cpu_half512()) return false;
    const int64_t W = g->w, HW = g->h * W, OW = g->ow, P = g->oh * OW;
    const uint16_t *xv = (const uint16_t *)x->data + pl * HW;
    uint16_t *yv = (uint16_t *)y->data + pl * P;
    for (int64_t oy = 0; oy < g->oh; oy++)
        (avx2 ? max_pool_2x2_avx2_h : max_pool_2x2_avx512_h)(
            f16, xv + 2 * oy * W, xv + (2 * oy + 1) * W, OW, (int32_t)(2 * oy * W), (int32_t)W,
            yv + oy * OW, iv ? iv + oy * OW : ib);
    return true;
#else
    (void)g, (void)x, (void)y, (void)pl, (void)iv, (void)ib;
    return false;
#endif
}

/* plane pl of a 2x2 pool's backward with gy and gx both f16 or both bf16, where the CPU has
 * AVX-512BW (na_cpu_half512): written at half the bytes, no f32 plane, no conversions. The
 * windows are disjoint, so where each index lies in its own window every gx cell takes at most
 * one gy, and the f32 path's 0 + gy rounded back is gy's bits made canonical (as
 * max_pool_bwd_2x2_avx512_h makes them); cells in no window are 0; indices outside the plane
 * are skipped, as there. Returns false (the caller then redoes the plane through f32) at an
 * index inside the plane but outside its window, or for other dtypes. MXCSR's DAZ, which the
 * f32 path's add would obey on a bf16 subnormal, is not read. */
static bool max_pool_bwd_2x2_half(const na_conv_geom *g, const na_view *gy, const na_view *idx,
                                  const int32_t *iv, na_view *gx, int64_t pl) {
#if defined(__x86_64__) && defined(__GNUC__)
    bool f16 = gy->dtype == NA_DTYPE_F16;
    if ((!f16 && gy->dtype != NA_DTYPE_BF16) || gx->dtype != gy->dtype) return false;
    bool avx2 = na_cpu_half_avx2();
    if (!avx2 && !na_cpu_half512()) return false;
    const int64_t W = g->w, H = g->h, HW = H * W, OW = g->ow, OH = g->oh;
    const uint16_t *gyv = (const uint16_t *)gy->data + pl * OH * OW;
    uint16_t *gxv = (uint16_t *)gx->data + pl * HW;
    /* gy and the indices ahead of the plane's start, for the AVX2 loop's full loads */
    int64_t avail = (gy->numel < idx->numel ? gy->numel : idx->numel) - pl * OH * OW;
    if (!(avx2 ? max_pool_bwd_2x2_avx2_h(f16, gyv, iv, avail, OH, OW, (int32_t)W, (int32_t)HW,
                                         gxv)
               : max_pool_bwd_2x2_avx512_h(f16, gyv, iv, OH, OW, (int32_t)W, (int32_t)HW, gxv)))
        return false;
    if (2 * OW < W) /* columns in no window */
        for (int64_t y = 0; y < 2 * OH; y++)
            for (int64_t x = 2 * OW; x < W; x++) gxv[y * W + x] = 0;
    if (2 * OH < H) memset(gxv + 2 * OH * W, 0, (size_t)((H - 2 * OH) * W) * sizeof(uint16_t));
    return true;
#else
    (void)g, (void)gy, (void)idx, (void)iv, (void)gx, (void)pl;
    return false;
#endif
}

#define NA_CPU_DEFINE_POOL(T, SFX)                                                          \
    static int max_pool_##SFX(const na_conv_geom *g, int64_t pl0, int64_t pl1,              \
                              const na_view *x, na_view *y, na_view *idx) {                 \
        const char *fn = "cpu_max_pool2d";                                                  \
        NA_CPU_POOL_LOCALS(g);                                                              \
        const bool pool_2x2 = is_pool_2x2(g);                                               \
        T *xb = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)HW * sizeof(T), fn);               \
        T *yb = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)P * sizeof(T), fn);                \
        /* the 2x2 path writes a row's indices here when the caller wants none */           \
        int32_t *ib = na_cpu_scratch(NA_CPU_SCRATCH_2, (size_t)OW * sizeof(int32_t), fn);   \
        if (!xb || !yb || !ib) return NA_ENOMEM;                                            \
        for (int64_t pl = pl0; pl < pl1; pl++) {                                            \
            if (pool_2x2 && max_pool_2x2_half(g, x, y, pl, idx ? (int32_t *)idx->data + pl * P \
                                                                : NULL, ib))                \
                continue;                                                                   \
            const T *xv = na_cpu_view_##SFX(x->dtype, x->data, pl * HW, HW, xb);            \
            T *yv = na_cpu_out_##SFX(y->dtype, y->data, pl * P, yb);                        \
            int32_t *iv = idx ? (int32_t *)idx->data + pl * P : NULL;                       \
            if (pool_2x2) {                                                                 \
                for (int64_t oy = 0; oy < OH; oy++)                                         \
                    max_pool_2x2_row_##SFX(xv + 2 * oy * W, xv + (2 * oy + 1) * W, OW,      \
                                           (int32_t)(2 * oy * W), (int32_t)W, yv + oy * OW, \
                                           iv ? iv + oy * OW : ib);                         \
            } else NA_CPU_POOL_FOR_EACH_OUTPUT({                                            \
                T best = -INFINITY;                                                         \
                int64_t bi = -1;                                                            \
                for (int64_t i = ilo; i < ihi; i++) {                                       \
                    const T *r = xv + (y0 + i * DH) * W + x0;                               \
                    for (int64_t j = jlo; j < jhi; j++) {                                   \
                        T v = r[j * DW];                                                    \
                        if (bi < 0 || v > best || (v != v && best == best)) {               \
                            best = v;                                                       \
                            bi = (y0 + i * DH) * W + x0 + j * DW;                           \
                        }                                                                   \
                    }                                                                       \
                }                                                                           \
                yv[o] = best;                                                               \
                if (iv) iv[o] = (int32_t)bi;                                                \
            })                                                                              \
            na_cpu_store_##SFX(y->dtype, y->data, pl * P, P, yv);                           \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    static int max_pool_bwd_##SFX(const na_conv_geom *g, int64_t pl0, int64_t pl1,          \
                                  const na_view *gy, const na_view *idx, na_view *gx) {     \
        const char *fn = "cpu_max_pool2d_backward";                                         \
        NA_CPU_POOL_LOCALS(g);                                                              \
        T *gyb = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)P * sizeof(T), fn);               \
        T *gxb = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)HW * sizeof(T), fn);              \
        if (!gyb || !gxb) return NA_ENOMEM;                                                 \
        const bool pool_2x2 = is_pool_2x2(g);                                               \
        for (int64_t pl = pl0; pl < pl1; pl++) {                                            \
            const int32_t *iv = (const int32_t *)idx->data + pl * P;                        \
            if (pool_2x2 && max_pool_bwd_2x2_half(g, gy, idx, iv, gx, pl)) continue;        \
            const T *gyv = na_cpu_view_##SFX(gy->dtype, gy->data, pl * P, P, gyb);          \
            T *gxv = na_cpu_out_##SFX(gx->dtype, gx->data, pl * HW, gxb);                   \
            memset(gxv, 0, (size_t)HW * sizeof(T));                                         \
            for (int64_t p = 0; p < P; p++) {                                               \
                int32_t i = iv[p];                                                          \
                if (i >= 0 && i < HW) gxv[i] += gyv[p];                                     \
            }                                                                               \
            na_cpu_store_##SFX(gx->dtype, gx->data, pl * HW, HW, gxv);                      \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    /* the divisor of a window: taps inside the input, or inside the padded input */        \
    static T avg_divisor_##SFX(const na_conv_geom *g, int64_t y0, int64_t x0, int64_t ilo,  \
                               int64_t ihi, int64_t jlo, int64_t jhi) {                     \
        if (!g->count_include_pad) return (T)((ihi - ilo) * (jhi - jlo));                   \
        int64_t a, b, c, d;                                                                 \
        win_range(y0 + g->ph, g->h + 2 * (int64_t)g->ph, g->dh, g->kh, &a, &b);             \
        win_range(x0 + g->pw, g->w + 2 * (int64_t)g->pw, g->dw, g->kw, &c, &d);             \
        return (T)((b - a) * (d - c));                                                      \
    }                                                                                       \
    static int avg_pool_##SFX(const na_conv_geom *g, int64_t pl0, int64_t pl1,              \
                              const na_view *x, na_view *y) {                               \
        const char *fn = "cpu_avg_pool2d";                                                  \
        NA_CPU_POOL_LOCALS(g);                                                              \
        T *xb = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)HW * sizeof(T), fn);               \
        T *yb = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)P * sizeof(T), fn);                \
        if (!xb || !yb) return NA_ENOMEM;                                                   \
        for (int64_t pl = pl0; pl < pl1; pl++) {                                            \
            const T *xv = na_cpu_view_##SFX(x->dtype, x->data, pl * HW, HW, xb);            \
            T *yv = na_cpu_out_##SFX(y->dtype, y->data, pl * P, yb);                        \
            NA_CPU_POOL_FOR_EACH_OUTPUT({                                                   \
                T s = 0;                                                                    \
                for (int64_t i = ilo; i < ihi; i++) {                                       \
                    const T *r = xv + (y0 + i * DH) * W + x0;                               \
                    for (int64_t j = jlo; j < jhi; j++) s += r[j * DW];                     \
                }                                                                           \
                T dv = avg_divisor_##SFX(g, y0, x0, ilo, ihi, jlo, jhi);                    \
                yv[o] = dv > 0 ? s / dv : 0;                                                \
            })                                                                              \
            na_cpu_store_##SFX(y->dtype, y->data, pl * P, P, yv);                           \
        }                                                                                   \
        return NA_OK;                                                                       \
    }                                                                                       \
    static int avg_pool_bwd_##SFX(const na_conv_geom *g, int64_t pl0, int64_t pl1,          \
                                  const na_view *gy, na_view *gx) {                         \
        const char *fn = "cpu_avg_pool2d_backward";                                         \
        NA_CPU_POOL_LOCALS(g);                                                              \
        T *gyb = na_cpu_scratch(NA_CPU_SCRATCH_0, (size_t)P * sizeof(T), fn);               \
        T *gxb = na_cpu_scratch(NA_CPU_SCRATCH_1, (size_t)HW * sizeof(T), fn);              \
        if (!gyb || !gxb) return NA_ENOMEM;                                                 \
        for (int64_t pl = pl0; pl < pl1; pl++) {                                            \
            const T *gyv = na_cpu_view_##SFX(gy->dtype, gy->data, pl * P, P, gyb);          \
            T *gxv = na_cpu_out_##SFX(gx->dtype, gx->data, pl * HW, gxb);                   \
            memset(gxv, 0, (size_t)HW * sizeof(T));                                         \
            NA_CPU_POOL_FOR_EACH_OUTPUT({                                                   \
                T dv = avg_divisor_##SFX(g, y0, x0, ilo, ihi, jlo, jhi);                    \
                if (dv > 0) {                                                               \
                    T v = gyv[o] / dv;                                                      \
                    for (int64_t i = ilo; i < ihi; i++) {                                   \
                        T *r = gxv + (y0 + i * DH) * W + x0;                                \
                        for (int64_t j = jlo; j < jhi; j++) r[j * DW] += v;                 \
                    }                                                                       \
                }                                                                           \
            })                                                                              \
            na_cpu_store_##SFX(gx->dtype, gx->data, pl * HW, HW, gxv);                      \
        }                                                                                   \
        return NA_OK;                                                                       \
    }

NA_CPU_DEFINE_POOL(float, f)
NA_CPU_DEFINE_POOL(double, d)

/* ---- the split over the pool: ranges of (n, c) planes ------------------------------------ */

#define NA_CPU_POOL_TASK_ELEMS ((int64_t)1 << 15) /* input elements per task worth a wake-up */
enum { NA_CPU_POOL_TASKS = 32 };

typedef struct {
    const na_conv_geom *g;
    const na_view *in, *idx_in;
    na_view *out, *idx_out;
    int (*range)(const na_conv_geom *, int64_t, int64_t, const void *);
    int64_t tasks;
    na_cpu_task_status status;
} pool_job;

/* each kernel's planes [pl0, pl1) with the job's views */
#define NA_CPU_POOL_RANGE(name, SFX, ...)                                                    \
    static int name##_range_##SFX(const na_conv_geom *g, int64_t pl0, int64_t pl1,          \
                                  const void *ctx) {                                        \
        const pool_job *j = ctx;                                                            \
        return name##_##SFX(g, pl0, pl1, __VA_ARGS__);                                      \
    }
#define NA_CPU_POOL_RANGES(SFX)                                                             \
    NA_CPU_POOL_RANGE(max_pool, SFX, j->in, j->out, j->idx_out)                             \
    NA_CPU_POOL_RANGE(max_pool_bwd, SFX, j->in, j->idx_in, j->out)                          \
    NA_CPU_POOL_RANGE(avg_pool, SFX, j->in, j->out)                                         \
    NA_CPU_POOL_RANGE(avg_pool_bwd, SFX, j->in, j->out)
NA_CPU_POOL_RANGES(f)
NA_CPU_POOL_RANGES(d)

static void pool_task(void *ctx, int64_t t) {
    pool_job *j = ctx;
    int64_t planes = j->g->n * j->g->c_in, lo, hi;
    na_cpu_task_range(planes, j->tasks, t, 1, &lo, &hi);
    if (j->range(j->g, lo, hi, j)) na_cpu_task_fail(&j->status);
}

static int pool_run(pool_job *j) {
    int64_t planes = j->g->n * j->g->c_in;
    int64_t plane = j->g->h * j->g->w > j->g->oh * j->g->ow ? j->g->h * j->g->w
                                                              : j->g->oh * j->g->ow;
    j->tasks = na_cpu_split(planes * plane, NA_CPU_POOL_TASK_ELEMS,
                            planes < NA_CPU_POOL_TASKS ? planes : NA_CPU_POOL_TASKS);
    na_cpu_parallel_for(planes ? j->tasks : 0, pool_task, j);
    return na_cpu_task_status_raise(&j->status);
}

#define NA_CPU_POOL_DISPATCH(fn, name, a, b, ...)                                           \
    do {                                                                                    \
        NA_CPU_CHECK_FLOAT(fn, a);                                                          \
        NA_CPU_CHECK_FLOAT(fn, b);                                                          \
        int st_ = check_geom(fn, g, false);                                                 \
        if (st_) return st_;                                                                \
        bool d_ = a->dtype == NA_DTYPE_F64 || b->dtype == NA_DTYPE_F64;                     \
        return pool_run(&(pool_job){.g = g, __VA_ARGS__,                                    \
                                    .range = d_ ? name##_range_d : name##_range_f});        \
    } while (0)

static int max_pool2d_c(const na_conv_geom *g, const na_view *x, na_view *y, na_view *idx) {
    if (idx && idx->dtype != NA_DTYPE_I32)
        return na_cpu_bad_dtype("cpu_max_pool2d", "idx", idx->dtype);
    NA_CPU_POOL_DISPATCH("cpu_max_pool2d", max_pool, x, y, .in = x, .out = y, .idx_out = idx);
}

static int max_pool2d_backward_c(const na_conv_geom *g, const na_view *gy, const na_view *idx,
                                 na_view *gx) {
    if (idx->dtype != NA_DTYPE_I32)
        return na_cpu_bad_dtype("cpu_max_pool2d_backward", "idx", idx->dtype);
    NA_CPU_POOL_DISPATCH("cpu_max_pool2d_backward", max_pool_bwd, gy, gx, .in = gy, .idx_in = idx,
                         .out = gx);
}

static int avg_pool2d_c(const na_conv_geom *g, const na_view *x, na_view *y) {
    NA_CPU_POOL_DISPATCH("cpu_avg_pool2d", avg_pool, x, y, .in = x, .out = y);
}

static int avg_pool2d_backward_c(const na_conv_geom *g, const na_view *gy, na_view *gx) {
    NA_CPU_POOL_DISPATCH("cpu_avg_pool2d_backward", avg_pool_bwd, gy, gx, .in = gy, .out = gx);
}

/* ---- channels-last views ---------------------------------------------------------------------
 * The kernels above read C order. A call whose views are channels-last (nanoamp/tensor.h: x,
 * y, w and the gradients alike) runs them on C-order scratch copies, the outputs copied back:
 * the reference computes the values of the same call in C order. C-order views pass as they
 * are, with no copy. */
typedef struct {
    int n;
    const na_view *v[4]; /* the call's views; NULL ones (an absent bias) are skipped */
    unsigned written;    /* bit k: v[k] is an output */
    na_view c[4];        /* C-order stand-ins */
    void *buf[4];
} c_order_call;

static int c_order_begin(c_order_call *k) {
    for (int i = 0; i < k->n; i++) {
        const na_view *v = k->v[i];
        if (!v) continue;
        k->c[i] = *v;
        if (na_view_is_c_order(v)) continue;
        size_t bytes = (size_t)v->numel * na_dtype_size(v->dtype);
        if (!(k->buf[i] = malloc(bytes ? bytes : 1)))
            return na_set_error(NA_ENOMEM, "cpu: no memory for a %zu-byte C-order copy of a "
                                "channels-last view", bytes);
        k->c[i].data = k->buf[i];
        int64_t stride = 1;
        for (int d = v->ndim - 1; d >= 0; stride *= v->shape[d], d--) k->c[i].stride[d] = stride;
        if (!(k->written >> i & 1)) {
            int rc = na_cpu_copy(&k->c[i], v);
            if (rc) return rc;
        }
    }
    return NA_OK;
}

static int c_order_end(c_order_call *k, int rc) {
    for (int i = 0; i < k->n; i++) {
        if (!k->buf[i]) continue;
        if (!rc && (k->written >> i & 1)) rc = na_cpu_copy((na_view *)k->v[i], &k->c[i]);
        free(k->buf[i]);
    }
    return rc;
}

/* runs CALL (on k.c[0..n)) for the views given, the views at bit positions of WRITTEN copied back */
#define NA_CPU_IN_C_ORDER(CALL, WRITTEN, ...)                                               \
    do {                                                                                    \
        c_order_call k = {.n = NA_CPU_NARGS_(__VA_ARGS__), .v = {__VA_ARGS__},              \
                          .written = (WRITTEN)};                                            \
        int rc = c_order_begin(&k);                                                         \
        return c_order_end(&k, rc ? rc : (CALL));                                           \
    } while (0)
#define NA_CPU_NARGS_(...) ((int)(sizeof((const na_view *[]){__VA_ARGS__}) / sizeof(const na_view *)))

int na_cpu_conv2d(const na_conv_geom *g, const na_view *x, const na_view *w,
                  const na_view *bias, na_view *y) {
    NA_CPU_IN_C_ORDER(conv2d_c(g, &k.c[0], &k.c[1], bias, &k.c[2]), 1u << 2, x, w, y);
}

int na_cpu_conv2d_backward_data(const na_conv_geom *g, const na_view *gy, const na_view *w,
                                na_view *gx) {
    NA_CPU_IN_C_ORDER(conv2d_backward_data_c(g, &k.c[0], &k.c[1], &k.c[2]), 1u << 2, gy, w, gx);
}

int na_cpu_conv2d_backward_weight(const na_conv_geom *g, const na_view *x, const na_view *gy,
                                  na_view *gw) {
    NA_CPU_IN_C_ORDER(conv2d_backward_weight_c(g, &k.c[0], &k.c[1], &k.c[2]), 1u << 2, x, gy,
                      gw);
}

/* ---- conv2d_stats: the convolution, then each output channel's sum and sum of squares ---- */

/* The sums of channels [c0, c1) of a 4-d y of any strides, over (n, h, w) in that order: chunks
 * of NA_CPU_CHUNK values summed pairwise, the chunk sums pairwise (f32; f64 for f64 y). */
#define NA_CPU_CHANNEL_SUMS(T, SFX)                                                         \
    /* adds the chunk v[0..cnt) to the sums (squares into q) */                             \
    static void chunk_sums_##SFX(const T *v, T *q, int64_t cnt, na_cpu_psum_##SFX *s1,      \
                                 na_cpu_psum_##SFX *s2) {                                   \
        for (int64_t i = 0; i < cnt; i++) q[i] = v[i] * v[i];                               \
        na_cpu_psum_add_##SFX(s1, na_cpu_sum_##SFX(v, cnt));                                \
        na_cpu_psum_add_##SFX(s2, na_cpu_sum_##SFX(q, cnt));                                \
    }                                                                                       \
    static void channel_sums_##SFX(const na_view *y, int64_t c0, int64_t c1, na_view *sum,  \
                                   na_view *sqsum) {                                        \
        T v[NA_CPU_CHUNK], q[NA_CPU_CHUNK];                                                 \
        const int64_t *st = y->stride, W = y->shape[3], hw = y->shape[2] * W;               \
        bool planes = st[3] == 1 && st[2] == W; /* NCHW: each (n, k) plane is one run */    \
        for (int64_t k = c0; k < c1; k++) {                                                 \
            na_cpu_psum_##SFX s1 = {{0}, 0}, s2 = {{0}, 0};                                 \
            int64_t cnt = 0, total = y->shape[0] * hw;                                      \
            for (int64_t n = 0; planes && n < y->shape[0]; n++)                             \
                for (int64_t r = 0; r < hw; r += NA_CPU_CHUNK) {                            \
                    int64_t len = hw - r < NA_CPU_CHUNK ? hw - r : NA_CPU_CHUNK;            \
                    const T *run = na_cpu_view_##SFX(y->dtype, y->data,                     \
                                                     n * st[0] + k * st[1] + r, len, v);    \
                    chunk_sums_##SFX(run, q, len, &s1, &s2);                                \
                }                                                                           \
            for (int64_t i = 0; !planes && i < total; i++) {                                \
                int64_t r = i % hw;                                                         \
                int64_t off = i / hw * st[0] + k * st[1] + r / W * st[2] + r % W * st[3];   \
                v[cnt] = (T)na_cpu_get(y->dtype, y->data, off);                             \
                if (++cnt == NA_CPU_CHUNK || i + 1 == total) {                              \
                    chunk_sums_##SFX(v, q, cnt, &s1, &s2);                                  \
                    cnt = 0;                                                                \
                }                                                                           \
            }                                                                               \
            na_cpu_set(sum->dtype, sum->data, k, na_cpu_psum_total_##SFX(&s1));             \
            na_cpu_set(sqsum->dtype, sqsum->data, k, na_cpu_psum_total_##SFX(&s2));         \
        }                                                                                   \
    }
NA_CPU_CHANNEL_SUMS(float, f)
NA_CPU_CHANNEL_SUMS(double, d)

typedef struct {
    const na_view *y;
    na_view *sum, *sqsum;
    int64_t tasks;
} channel_sums_job;

static void channel_sums_task(void *ctx, int64_t t) {
    const channel_sums_job *j = ctx;
    int64_t c0, c1;
    na_cpu_task_range(j->y->shape[1], j->tasks, t, 1, &c0, &c1);
    if (j->y->dtype == NA_DTYPE_F64)
        channel_sums_d(j->y, c0, c1, j->sum, j->sqsum);
    else
        channel_sums_f(j->y, c0, c1, j->sum, j->sqsum);
}

/* The CPU always computes both (a second pass over y: the reference of what a GPU fuses). */
int na_cpu_conv2d_stats(const na_conv_geom *g, const na_view *x, const na_view *w,
                        const na_view *bias, na_view *y, na_view *sum, na_view *sqsum,
                        bool *done) {
    *done = false;
    NA_CPU_CHECK_FLOAT("cpu_conv2d_stats", sum);
    NA_CPU_CHECK_FLOAT("cpu_conv2d_stats", sqsum);
    if (y->ndim != 4 || sum->numel != y->shape[1] || sqsum->numel != y->shape[1])
        return na_set_error(NA_ESHAPE, "cpu_conv2d_stats: sums of %lld and %lld values for %lld "
                            "output channels", (long long)sum->numel, (long long)sqsum->numel,
                            (long long)(y->ndim == 4 ? y->shape[1] : -1));
    int rc = na_cpu_conv2d(g, x, w, bias, y);
    if (rc) return rc;
    channel_sums_job j = {.y = y, .sum = sum, .sqsum = sqsum,
                          .tasks = na_cpu_split(y->numel, (int64_t)1 << 15, y->shape[1])};
    na_cpu_parallel_for(y->shape[1] ? j.tasks : 0, channel_sums_task, &j);
    *done = true;
    return NA_OK;
}

int na_cpu_max_pool2d(const na_conv_geom *g, const na_view *x, na_view *y, na_view *idx) {
    NA_CPU_IN_C_ORDER(max_pool2d_c(g, &k.c[0], &k.c[1], idx ? &k.c[2] : NULL), 3u << 1, x, y,
                      idx);
}

int na_cpu_max_pool2d_backward(const na_conv_geom *g, const na_view *gy, const na_view *idx,
                               na_view *gx) {
    NA_CPU_IN_C_ORDER(max_pool2d_backward_c(g, &k.c[0], &k.c[1], &k.c[2]), 1u << 2, gy, idx, gx);
}

int na_cpu_avg_pool2d(const na_conv_geom *g, const na_view *x, na_view *y) {
    NA_CPU_IN_C_ORDER(avg_pool2d_c(g, &k.c[0], &k.c[1]), 1u << 1, x, y);
}

int na_cpu_avg_pool2d_backward(const na_conv_geom *g, const na_view *gy, na_view *gx) {
    NA_CPU_IN_C_ORDER(avg_pool2d_backward_c(g, &k.c[0], &k.c[1]), 1u << 1, gy, gx);
}
