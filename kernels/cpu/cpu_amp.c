/* kernels/cpu/cpu_amp.c — loss scaling on the CPU: the fused unscale + inf/NaN check over many
 * tensors, and the scaler update. The per-element math is kernels/common/amp.h, shared with the
 * CUDA kernels; scale, found_inf and the counters are host memory here, so reading them is
 * free, but nothing here needs the host to look at them: the CUDA kernels do the same work
 * without a round trip. */
#include "common/amp.h"
#include "cpu/cpu_internal.h"

int na_cpu_amp_unscale(int n, const na_view *const *in, na_view *const *out,
                       const na_view *scale, na_view *found_inf) {
    const char *fn = "cpu_amp_unscale";
    if (scale->dtype != NA_DTYPE_F32 || (found_inf && found_inf->dtype != NA_DTYPE_F32))
        return na_set_error(NA_EDTYPE, "%s: scale and found_inf must be f32", fn);
    float inv = na_amp_inv_scale(*(const float *)scale->data);
    bool nonfinite = false;
    float buf[NA_CPU_CHUNK], ob[NA_CPU_CHUNK];
    for (int i = 0; i < n; i++) {
        const na_view *x = in[i];
        na_view *y = out[i];
        NA_CPU_CHECK_FLOAT(fn, x);
        NA_CPU_CHECK_FLOAT(fn, y);
        if (x->numel != y->numel)
            return na_set_error(NA_ESHAPE, "%s: tensor %d has %lld elements in and %lld out", fn, i,
                                (long long)x->numel, (long long)y->numel);
        for (int64_t off = 0; off < x->numel; off += NA_CPU_CHUNK) {
            int64_t c = x->numel - off < NA_CPU_CHUNK ? x->numel - off : NA_CPU_CHUNK;
            /* f32 read and written in place; the flag as an OR of bits, so that the loop
             * vectorizes (the branch per element kept it scalar: 7% of the MLP's f16 step) */
            const float *v = na_cpu_view_f(x->dtype, x->data, off, c, buf);
            float *o = na_cpu_out_f(y->dtype, y->data, off, ob);
            uint32_t bad = 0;
            for (int64_t k = 0; k < c; k++) {
                bad |= na_amp_nonfinite_bit(v[k]);
                o[k] = na_amp_unscale_value(v[k], inv);
            }
            nonfinite |= bad != 0;
            na_cpu_store_f(y->dtype, y->data, off, c, o);
        }
    }
    if (nonfinite && found_inf) *(float *)found_inf->data = 1.0f;
    return NA_OK;
}

int na_cpu_amp_update_scale(int kind, const double *hp, na_view *scale, na_view *counters,
                            int n_found, const na_view *const *found_infs) {
    const char *fn = "cpu_amp_update_scale";
    if (scale->dtype != NA_DTYPE_F32 || counters->dtype != NA_DTYPE_I32 ||
        counters->numel != NA_AMP_CTR_COUNT)
        return na_set_error(NA_EINVAL, "%s: expected an f32 scale and i32 [%d] counters", fn,
                            NA_AMP_CTR_COUNT);
    if (kind < 0 || kind >= NA_AMP_KIND_COUNT)
        return na_set_error(NA_EINVAL, "%s: unknown scaler kind %d", fn, kind);
    bool found = false;
    for (int k = 0; k < n_found; k++) found |= *(const float *)found_infs[k]->data != 0.0f;
    na_amp_update(kind, hp, scale->data, counters->data, found);
    return NA_OK;
}

int na_cpu_note_nonfinite(const na_view *x, na_view *first, double step) {
    const char *fn = "cpu_note_nonfinite";
    NA_CPU_CHECK_FLOAT(fn, x);
    if (first->dtype != NA_DTYPE_F64 || first->numel != 1)
        return na_set_error(NA_EDTYPE, "%s: first must be an f64 scalar", fn);
    double *f = first->data, buf[NA_CPU_CHUNK];
    for (int64_t off = 0; *f == 0 && off < x->numel; off += NA_CPU_CHUNK) {
        int64_t c = x->numel - off < NA_CPU_CHUNK ? x->numel - off : NA_CPU_CHUNK;
        na_cpu_load_d(x->dtype, x->data, off, c, buf); /* exact: a large f64 stays finite */
        for (int64_t k = 0; k < c; k++)
            if (!isfinite(buf[k])) {
                *f = step;
                break;
            }
    }
    return NA_OK;
}
