/* kernels/cuda/optim.cu — multi-tensor SGD and Adam/AdamW steps and the global L2 norm.
 *
 * The per-element rules are kernels/common/optim.h, shared with the CPU backend: parameter and
 * gradient widened to f32 (the gradient times *inv_scale when given), f32 state, the result
 * rounded once to the parameter's dtype (and to the copy's). Nothing here synchronizes:
 * found_inf, inv_scale, the step counts and (when given) the learning rate are read on the
 * device, so an amp step that must be skipped is skipped by the kernels themselves, and a
 * replayed CUDA graph takes each step's learning rate.
 *
 * Steps: every element of parameter i needs the step count after this step's increment.
 * The update kernel reads steps[i] and uses steps[i] + 1; a second, tiny kernel then stores
 * the increments (after the update in stream order, so no block sees a half-updated count).
 *
 * L2 norm: one f32 partial sum of squares per chunk, in a scratch buffer, then one block
 * adds the partials in chunk order: deterministic, no atomics.
 */
#include <string.h>

#include "common/optim.h"
#include "multi_tensor.cuh"

struct mt_optim {
    na_mt_chunks c;
    void *p[NA_MT_MAX];
    const void *g[NA_MT_MAX];
    float *m[NA_MT_MAX], *v[NA_MT_MAX], *vmax[NA_MT_MAX];
    void *copy[NA_MT_MAX];
    float *step[NA_MT_MAX];
    uint8_t pdt[NA_MT_MAX], gdt[NA_MT_MAX], cdt[NA_MT_MAX];
};

template <bool ADAM>
__global__ void k_optim_step(mt_optim a, na_optim_hparams h, const float *found_inf,
                             const float *inv_scale, const double *lr) {
    if (found_inf && *found_inf != 0.0f) return; /* skipped: nothing changes */
    if (lr) h.lr = *lr;
    const float inv = inv_scale ? *inv_scale : 1.0f;
    const int64_t total = a.c.chunk_start[a.c.n];
    for (int64_t chunk = blockIdx.x; chunk < total; chunk += gridDim.x) {
        int64_t lo, hi;
        int t = na_mt_locate(a.c, chunk, &lo, &hi);
        na_optim_scalars s = na_optim_prepare(&h, *a.step[t] + 1.0f);
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float p = na_ld_f(a.p[t], a.pdt[t], i);
            float g = na_ld_f(a.g[t], a.gdt[t], i);
            if (inv_scale) g *= inv;
            if (ADAM)
                p = na_adam_elem(p, g, a.m[t] + i, a.v[t] + i, a.vmax[t] ? a.vmax[t] + i : NULL, &s);
            else
                p = na_sgd_elem(p, g, a.m[t] ? a.m[t] + i : NULL, &s);
            na_st_f(a.p[t], a.pdt[t], i, p);
            if (a.copy[t]) na_st_f(a.copy[t], a.cdt[t], i, p);
        }
    }
}

struct mt_steps {
    int n;
    float *step[NA_MT_MAX];
};

__global__ void k_steps_inc(mt_steps s, const float *found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    int t = threadIdx.x;
    if (t < s.n) *s.step[t] += 1.0f;
}

static int check_f32_scalar(const na_view *t, const char *who, const char *what) {
    if (t && (t->dtype != NA_DTYPE_F32 || t->numel != 1))
        return na_set_error(NA_EDTYPE, "%s (cuda): %s must be an f32 scalar", who, what);
    return NA_OK;
}

template <bool ADAM>
static int optim_step(const na_optim_tensors *t, const na_optim_hparams *h) {
    const char *who = ADAM ? "adam_step" : "sgd_step";
    bool need_m = ADAM || h->momentum != 0.0;
    if ((need_m && !t->exp_avg) || (ADAM && (!t->exp_avg_sq || (h->amsgrad && !t->max_exp_avg_sq))))
        return na_set_error(NA_EINVAL, "%s (cuda): state tensors missing for these hyper-parameters", who);
    NA_TRY(check_f32_scalar(t->found_inf, who, "found_inf"));
    NA_TRY(check_f32_scalar(t->inv_scale, who, "inv_scale"));
    const float *fi = t->found_inf ? (const float *)t->found_inf->data : NULL;
    const float *is = t->inv_scale ? (const float *)t->inv_scale->data : NULL;
    if (t->lr && (t->lr->dtype != NA_DTYPE_F64 || t->lr->numel != 1))
        return na_set_error(NA_EDTYPE, "%s (cuda): lr must be an f64 scalar", who);
    const double *lr = t->lr ? (const double *)t->lr->data : NULL;
    cudaStream_t st = na_cuda_ctx.stream;
    int i = 0;
    while (i < t->n) {
        mt_optim a;
        memset(&a, 0, sizeof a);
        mt_steps s;
        memset(&s, 0, sizeof s);
        for (; i < t->n && a.c.n < NA_MT_MAX; i++) {
            na_view *p = t->params[i];
            const na_view *g = t->grads[i];
            na_view *cp = t->copies ? t->copies[i] : NULL;
            if (!na_dtype_is_float(p->dtype) || !na_dtype_is_float(g->dtype) ||
                (cp && !na_dtype_is_float(cp->dtype)))
                return na_set_error(NA_EDTYPE, "%s (cuda): parameter %d: float tensors expected", who, i);
            NA_TRY(check_f32_scalar(t->steps[i], who, "steps[i]"));
            if (p->numel == 0) continue;
            int k = na_mt_add(&a.c, p->numel);
            a.p[k] = p->data;
            a.g[k] = g->data;
            a.m[k] = need_m ? (float *)t->exp_avg[i]->data : NULL;
            a.v[k] = ADAM ? (float *)t->exp_avg_sq[i]->data : NULL;
            a.vmax[k] = (ADAM && h->amsgrad) ? (float *)t->max_exp_avg_sq[i]->data : NULL;
            a.copy[k] = cp ? cp->data : NULL;
            a.step[k] = (float *)t->steps[i]->data;
            a.pdt[k] = (uint8_t)p->dtype;
            a.gdt[k] = (uint8_t)g->dtype;
            a.cdt[k] = cp ? (uint8_t)cp->dtype : 0;
            s.step[s.n++] = a.step[k];
        }
        if (!a.c.n) continue;
        k_optim_step<ADAM><<<na_mt_grid(na_mt_total(&a.c)), 256, 0, st>>>(a, *h, fi, is, lr);
        NA_CUDA_LAUNCH_CHECK("k_optim_step");
        k_steps_inc<<<1, NA_MT_MAX, 0, st>>>(s, fi);
        NA_CUDA_LAUNCH_CHECK("k_steps_inc");
    }
    /* empty parameters still count their step */
    mt_steps s;
    memset(&s, 0, sizeof s);
    for (int j = 0; j < t->n; j++) {
        if (t->params[j]->numel != 0) continue;
        s.step[s.n++] = (float *)t->steps[j]->data;
        if (s.n == NA_MT_MAX) {
            k_steps_inc<<<1, NA_MT_MAX, 0, st>>>(s, fi);
            NA_CUDA_LAUNCH_CHECK("k_steps_inc");
            s.n = 0;
        }
    }
    if (s.n) {
        k_steps_inc<<<1, NA_MT_MAX, 0, st>>>(s, fi);
        NA_CUDA_LAUNCH_CHECK("k_steps_inc");
    }
    return NA_OK;
}

int na_cuda_sgd_step(const na_optim_tensors *t, const na_optim_hparams *h) {
    return optim_step<false>(t, h);
}

int na_cuda_adam_step(const na_optim_tensors *t, const na_optim_hparams *h) {
    return optim_step<true>(t, h);
}

/* ---- global L2 norm ------------------------------------------------------------------------ */
struct mt_norm {
    na_mt_chunks c;
    const void *x[NA_MT_MAX];
    uint8_t dt[NA_MT_MAX];
};

__global__ void k_l2_partial(mt_norm a, float *partials) {
    __shared__ float sm[32];
    const int64_t total = a.c.chunk_start[a.c.n];
    for (int64_t chunk = blockIdx.x; chunk < total; chunk += gridDim.x) {
        int64_t lo, hi;
        int t = na_mt_locate(a.c, chunk, &lo, &hi);
        float s = 0.0f;
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float v = na_ld_f(a.x[t], a.dt[t], i);
            s += v * v;
        }
        s = na_row_reduce(s, na_op_sum(), sm);
        if (threadIdx.x == 0) partials[chunk] = s;
    }
}

__global__ void k_l2_final(const float *partials, int64_t n, float *norm, float *coef,
                           double max_norm) {
    __shared__ float sm[32];
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
    s = na_row_reduce(s, na_op_sum(), sm);
    if (threadIdx.x == 0) {
        float total = sqrtf(s);
        *norm = total;
        if (coef) *coef = na_clip_coef(total, max_norm);
    }
}

int na_cuda_l2norm(int n, const na_view *const *xs, na_view *norm, na_view *coef,
                   double max_norm) {
    NA_TRY(check_f32_scalar(norm, "l2norm", "norm"));
    NA_TRY(check_f32_scalar(coef, "l2norm", "coef"));
    int64_t chunks = 0;
    for (int i = 0; i < n; i++) {
        if (!na_dtype_is_float(xs[i]->dtype))
            return na_set_error(NA_EDTYPE, "l2norm (cuda): tensor %d is not a float tensor", i);
        chunks += (xs[i]->numel + NA_MT_CHUNK - 1) / NA_MT_CHUNK;
    }
    float *partials = (float *)na_cuda_scratch((size_t)(chunks ? chunks : 1) * sizeof(float));
    if (!partials) return na_last_status();
    cudaStream_t st = na_cuda_ctx.stream;
    int64_t base = 0;
    int i = 0;
    while (i < n) {
        mt_norm a;
        memset(&a, 0, sizeof a);
        for (; i < n && a.c.n < NA_MT_MAX; i++) {
            if (xs[i]->numel == 0) continue;
            int k = na_mt_add(&a.c, xs[i]->numel);
            a.x[k] = xs[i]->data;
            a.dt[k] = (uint8_t)xs[i]->dtype;
        }
        if (!a.c.n) continue;
        int64_t cnt = na_mt_total(&a.c);
        k_l2_partial<<<na_mt_grid(cnt), 256, 0, st>>>(a, partials + base);
        NA_CUDA_LAUNCH_CHECK("k_l2_partial");
        base += cnt;
    }
    k_l2_final<<<1, 512, 0, st>>>(partials, base, (float *)norm->data,
                                  coef ? (float *)coef->data : NULL, max_norm);
    NA_CUDA_LAUNCH_CHECK("k_l2_final");
    return NA_OK;
}
