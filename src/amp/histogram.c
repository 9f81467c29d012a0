/* Magnitudes on a dtype's number line (nanoamp/amp.h, na_amp_hist): host code over host copies,
 * rounding as the casts do (kernels/common/half.h, float8.h), so "rounds to 0 in f16" means what
 * a cast to f16 would make of the value. E4M3 has no inf: what its cast clips to 448 (beyond
 * 464, 448's rounding range) counts as overflow, as E5M2's inf does. */
#include <math.h>
#include <stdlib.h>

#include "common/float8.h"
#include "common/half.h"
#include "nanoamp/amp.h"
#include "nanoamp/error.h"

int na_amp_dtype_range(na_dtype dt, int *min_subnormal_log2, int *min_normal_log2, double *max) {
    int sub, norm;
    double hi;
    switch (dt) {
    case NA_DTYPE_F16: sub = -24, norm = -14, hi = 65504.0; break;
    case NA_DTYPE_BF16: sub = -133, norm = -126, hi = 3.3895313892515355e38; break;
    case NA_DTYPE_F32: sub = -149, norm = -126, hi = 3.4028234663852886e38; break;
    case NA_DTYPE_F8E4M3: sub = -9, norm = -6, hi = 448.0; break;
    case NA_DTYPE_F8E5M2: sub = -16, norm = -14, hi = 57344.0; break;
    default:
        return na_set_error(NA_EDTYPE, "na_amp_dtype_range: %s has no number line here (expected "
                            "f16, bf16, f32, f8e4m3 or f8e5m2)", na_dtype_name(dt));
    }
    if (min_subnormal_log2) *min_subnormal_log2 = sub;
    if (min_normal_log2) *min_normal_log2 = norm;
    if (max) *max = hi;
    return NA_OK;
}

int na_amp_hist_init(na_amp_hist *h, na_dtype dt) {
    if (!h) return na_set_error(NA_EINVAL, "na_amp_hist_init: NULL histogram");
    if (na_amp_dtype_range(dt, NULL, NULL, NULL))
        return na_set_error(NA_EDTYPE, "na_amp_hist_init: %s", na_last_error());
    *h = (na_amp_hist){.dtype = dt};
    return NA_OK;
}

static float round_to(na_dtype dt, float v) {
    switch (dt) {
    case NA_DTYPE_F16: return na_round_f16(v);
    case NA_DTYPE_BF16: return na_round_bf16(v);
    case NA_DTYPE_F8E4M3: return fabsf(v) > 464.0f ? v * INFINITY
                                                   : na_e4m3_bits_to_f32(na_f32_to_e4m3_bits(v));
    case NA_DTYPE_F8E5M2: return na_e5m2_bits_to_f32(na_f32_to_e5m2_bits(v));
    default: return v;
    }
}

int na_amp_hist_add(na_amp_hist *h, const float *x, int64_t n) {
    int norm;
    if (!h || (n > 0 && !x)) return na_set_error(NA_EINVAL, "na_amp_hist_add: NULL argument");
    if (n < 0) return na_set_error(NA_EINVAL, "na_amp_hist_add: n %lld < 0", (long long)n);
    if (na_amp_dtype_range(h->dtype, NULL, &norm, NULL))
        return na_set_error(NA_EINVAL, "na_amp_hist_add: not initialized (na_amp_hist_init)");
    float min_normal = ldexpf(1.0f, norm);
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], r = fabsf(round_to(h->dtype, v));
        if (!isfinite(v)) {
            h->nonfinite++;
            continue;
        }
        if (v == 0) {
            h->zero++;
            continue;
        }
        if (r == 0) h->underflow++;
        else if (isinf(r)) h->overflow++;
        else if (r < min_normal) h->subnormal++;
        else h->normal++;
        int e;
        frexp(fabs((double)v), &e); /* |v| = m 2^e, m in [0.5, 1): floor(log2 |v|) = e - 1 */
        h->bins[e - 1 - NA_AMP_HIST_LO]++;
    }
    h->n += n;
    return NA_OK;
}

/* x's values as host floats (malloc; NULL with the error set): its own bits copied (a sync on
 * CUDA), widened here, exactly, as a cast would: no op runs, so nothing is traced or recorded
 * and the backward pass can count its gradients in flight (src/amp/backward_trace.c). */
static float *host_floats(const na_tensor *x) {
    int64_t n = x->numel ? x->numel : 1;
    float *f = malloc(sizeof(float) * (size_t)n);
    uint16_t *h = x->dtype == NA_DTYPE_F32 ? NULL : malloc(sizeof(uint16_t) * (size_t)n);
    int rc = !f || (x->dtype != NA_DTYPE_F32 && !h)
                 ? na_set_error(NA_ENOMEM, "na_amp_hist_add_tensor: out of host memory")
                 : na_copy_to_host(x, h ? (void *)h : (void *)f); /* settles a marked gradient */
    for (int64_t i = 0; !rc && h && i < x->numel; i++)
        f[i] = x->dtype == NA_DTYPE_F16 ? na_f16_bits_to_f32(h[i]) : na_bf16_bits_to_f32(h[i]);
    free(h);
    if (rc) {
        free(f);
        return NULL;
    }
    return f;
}

int na_amp_hist_add_tensor(na_amp_hist *h, const na_tensor *x) {
    if (!x) return na_set_error(NA_EINVAL, "na_amp_hist_add_tensor: NULL tensor");
    if (x->dtype != NA_DTYPE_F32 && x->dtype != NA_DTYPE_F16 && x->dtype != NA_DTYPE_BF16) {
        char d[NA_DESCRIBE_MAX];
        return na_set_error(NA_EDTYPE, "na_amp_hist_add_tensor: needs f32, f16 or bf16, got %s",
                            na_tensor_describe(x, d, sizeof d));
    }
    float *host = host_floats(x);
    int rc = host ? na_amp_hist_add(h, host, x->numel) : na_last_status();
    free(host);
    return rc;
}
