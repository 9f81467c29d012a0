/* kernels/cuda/amp.cu — loss scaling on the device: the fused unscale + inf/NaN check over a
 * list of gradients, and the scaler update. Per-element math and the update rules are
 * kernels/common/amp.h, shared with the CPU backend. Neither kernel synchronizes: the scale,
 * found_inf and the counters never leave the device.
 */
#include <string.h>

#include "common/amp.h"
#include "multi_tensor.cuh"

struct mt_unscale {
    na_mt_chunks c;
    const void *in[NA_MT_MAX];
    void *out[NA_MT_MAX];
    uint8_t idt[NA_MT_MAX], odt[NA_MT_MAX];
};

/* found_inf is only ever set to 1 (racy writes of the same value are harmless) */
__global__ void k_amp_unscale(mt_unscale a, const float *scale, float *found_inf) {
    const float inv = na_amp_inv_scale(*scale);
    bool nonfinite = false;
    const int64_t total = a.c.chunk_start[a.c.n];
    for (int64_t chunk = blockIdx.x; chunk < total; chunk += gridDim.x) {
        int64_t lo, hi;
        int t = na_mt_locate(a.c, chunk, &lo, &hi);
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
            na_st_f(a.out[t], a.odt[t], i,
                    na_amp_unscale_elem(na_ld_f(a.in[t], a.idt[t], i), inv, &nonfinite));
    }
    if (nonfinite && found_inf) *found_inf = 1.0f;
}

int na_cuda_amp_unscale(int n, const na_view *const *in, na_view *const *out,
                        const na_view *scale, na_view *found_inf) {
    if (scale->dtype != NA_DTYPE_F32 || (found_inf && found_inf->dtype != NA_DTYPE_F32))
        return na_set_error(NA_EDTYPE, "amp_unscale (cuda): scale and found_inf must be f32");
    cudaStream_t st = na_cuda_ctx.stream;
    int i = 0;
    while (i < n) {
        mt_unscale a;
        memset(&a, 0, sizeof a);
        for (; i < n && a.c.n < NA_MT_MAX; i++) {
            const na_view *x = in[i];
            na_view *y = out[i];
            if (!na_dtype_is_float(x->dtype) || !na_dtype_is_float(y->dtype))
                return na_set_error(NA_EDTYPE, "amp_unscale (cuda): tensor %d is not a float tensor", i);
            if (x->numel != y->numel)
                return na_set_error(NA_ESHAPE, "amp_unscale (cuda): tensor %d has %lld elements in "
                                    "and %lld out", i, (long long)x->numel, (long long)y->numel);
            if (x->numel == 0) continue;
            int k = na_mt_add(&a.c, x->numel);
            a.in[k] = x->data;
            a.out[k] = y->data;
            a.idt[k] = (uint8_t)x->dtype;
            a.odt[k] = (uint8_t)y->dtype;
        }
        if (!a.c.n) continue;
        k_amp_unscale<<<na_mt_grid(na_mt_total(&a.c)), 256, 0, st>>>(
            a, (const float *)scale->data, found_inf ? (float *)found_inf->data : NULL);
        NA_CUDA_LAUNCH_CHECK("k_amp_unscale");
    }
    return NA_OK;
}

#define AMP_MAX_FOUND 32
struct amp_update_args {
    double hp[NA_AMP_HP_COUNT];
    int n_found;
    const float *found[AMP_MAX_FOUND];
};

__global__ void k_amp_update(int kind, amp_update_args a, float *scale, int32_t *ctr) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    bool found = false;
    for (int k = 0; k < a.n_found; k++) found |= *a.found[k] != 0.0f;
    na_amp_update(kind, a.hp, scale, ctr, found);
}

int na_cuda_amp_update_scale(int kind, const double *hp, na_view *scale, na_view *counters,
                             int n_found, const na_view *const *found_infs) {
    if (scale->dtype != NA_DTYPE_F32 || counters->dtype != NA_DTYPE_I32 ||
        counters->numel != NA_AMP_CTR_COUNT)
        return na_set_error(NA_EINVAL, "amp_update_scale (cuda): expected an f32 scale and i32 "
                            "[%d] counters", NA_AMP_CTR_COUNT);
    if (kind < 0 || kind >= NA_AMP_KIND_COUNT)
        return na_set_error(NA_EINVAL, "amp_update_scale (cuda): unknown scaler kind %d", kind);
    if (n_found < 0 || n_found > AMP_MAX_FOUND)
        return na_set_error(NA_EINVAL, "amp_update_scale (cuda): %d found_inf flags (at most %d)",
                            n_found, AMP_MAX_FOUND);
    amp_update_args a;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < NA_AMP_HP_COUNT; k++) a.hp[k] = hp[k];
    a.n_found = n_found;
    for (int k = 0; k < n_found; k++) {
        if (found_infs[k]->dtype != NA_DTYPE_F32)
            return na_set_error(NA_EDTYPE, "amp_update_scale (cuda): found_inf %d is not f32", k);
        a.found[k] = (const float *)found_infs[k]->data;
    }
    k_amp_update<<<1, 32, 0, na_cuda_ctx.stream>>>(kind, a, (float *)scale->data,
                                                   (int32_t *)counters->data);
    NA_CUDA_LAUNCH_CHECK("k_amp_update");
    return NA_OK;
}

/* Every block that finds an inf or NaN writes the same step: the race is harmless. */
__global__ void k_note_nonfinite(const void *x, int dt, int64_t n, double *first, double step) {
    bool bad = false;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        bad |= !isfinite(na_ld_d(x, dt, i)); /* exact: a large f64 stays finite */
    if (__syncthreads_or(bad) && threadIdx.x == 0 && *first == 0.0) *first = step;
}

int na_cuda_note_nonfinite(const na_view *x, na_view *first, double step) {
    if (!na_dtype_is_float(x->dtype) || first->dtype != NA_DTYPE_F64 || first->numel != 1)
        return na_set_error(NA_EDTYPE, "note_nonfinite (cuda): expected a float x and an f64 "
                            "scalar first");
    if (x->numel == 0) return NA_OK;
    int64_t blocks = (x->numel + 255) / 256;
    k_note_nonfinite<<<(unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, na_cuda_ctx.stream>>>(
        x->data, (int)x->dtype, x->numel, (double *)first->data, step);
    NA_CUDA_LAUNCH_CHECK("k_note_nonfinite");
    return NA_OK;
}
