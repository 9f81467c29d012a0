/* kernels/cpu/cpu_fill.c — fills, random fills and the strided, converting copy.
 *
 * Random fills are pure functions of (seed, offset, element index) through common/philox.h,
 * so the CUDA backend produces the same tensors. The value formulas, which CUDA must follow:
 *   uniform: f32 compute (f64 for f64 tensors): v = lo + (hi - lo) * u, u = na_philox_uniform,
 *            a multiply then an add (no FMA); v is stored rounded to the dtype, and when the
 *            stored value is >= hi (RNE rounded up to hi, which f16/bf16 do for u near 1, and
 *            f32 can too) the dtype's next value below it is stored instead, so [lo, hi) holds
 *   normal:  mean + std * z, z = na_philox_normal
 *   dropout: (double)u >= p ? 1/(1-p) : 0, the scale computed in double, stored in the dtype
 *   arange:  start + i * step computed in double, then stored in the dtype
 */
#include "common/dense_order.h"
#include "common/philox.h"
#include "cpu/cpu_internal.h"

int na_cpu_fill(na_view *t, double value) {
    int64_t n = t->numel;
    switch (t->dtype) {
    case NA_DTYPE_F64: {
        double *p = t->data;
        for (int64_t i = 0; i < n; i++) p[i] = value;
    } break;
    case NA_DTYPE_F32: {
        float *p = t->data, v = (float)value;
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } break;
    case NA_DTYPE_F16:
    case NA_DTYPE_BF16: {
        uint16_t *p = t->data;
        uint16_t v = t->dtype == NA_DTYPE_F16 ? na_f32_to_f16_bits((float)value)
                                              : na_f32_to_bf16_bits((float)value);
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } break;
    case NA_DTYPE_I32: {
        int32_t *p = t->data, v = na_cpu_d_to_i32(value);
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } break;
    case NA_DTYPE_U8: memset(t->data, na_cpu_d_to_u8(value), (size_t)n); break;
    case NA_DTYPE_F8E4M3:
    case NA_DTYPE_F8E5M2: { /* one byte: the value's code, through f32 as a cast does */
        uint8_t v;
        na_cpu_set(t->dtype, &v, 0, value);
        memset(t->data, v, (size_t)n);
    } break;
    default: return na_cpu_bad_dtype("cpu_fill", "t", t->dtype);
    }
    return NA_OK;
}

int na_cpu_arange(na_view *t, double start, double step) {
    if (!na_dtype_size(t->dtype)) return na_cpu_bad_dtype("cpu_arange", "t", t->dtype);
    for (int64_t i = 0; i < t->numel; i++) na_cpu_set(t->dtype, t->data, i, start + (double)i * step);
    return NA_OK;
}

/* Fills t with f(i) computed in f32 (f64 for an f64 tensor), chunk by chunk. */
#define NA_CPU_RANDOM_FILL(fn, t, EXPR_F, EXPR_D)                                           \
    do {                                                                                    \
        NA_CPU_CHECK_FLOAT(fn, t);                                                          \
        int64_t n_ = (t)->numel;                                                            \
        if ((t)->dtype == NA_DTYPE_F64) {                                                   \
            double *p_ = (t)->data;                                                         \
            for (int64_t i = 0; i < n_; i++) p_[i] = (EXPR_D);                              \
        } else {                                                                            \
            float buf_[NA_CPU_CHUNK];                                                       \
            for (int64_t o_ = 0; o_ < n_; o_ += NA_CPU_CHUNK) {                             \
                int64_t c_ = n_ - o_ < NA_CPU_CHUNK ? n_ - o_ : NA_CPU_CHUNK;               \
                float *q_ = na_cpu_out_f((t)->dtype, (t)->data, o_, buf_);                  \
                for (int64_t j_ = 0; j_ < c_; j_++) {                                       \
                    uint64_t i = (uint64_t)(o_ + j_);                                       \
                    q_[j_] = (EXPR_F);                                                      \
                }                                                                           \
                na_cpu_store_f((t)->dtype, (t)->data, o_, c_, q_);                          \
            }                                                                               \
        }                                                                                   \
    } while (0)

int na_cpu_fill_uniform(na_view *t, double lo, double hi, uint64_t seed, uint64_t offset) {
    NA_CPU_CHECK_FLOAT("cpu_fill_uniform", t);
    float lof = (float)lo, spanf = (float)(hi - lo);
    double span = hi - lo;
    int64_t n = t->numel;
    switch (t->dtype) {
    case NA_DTYPE_F64: {
        double *p = t->data;
        for (int64_t i = 0; i < n; i++) {
            double v = lo + span * (double)na_philox_uniform(seed, offset, (uint64_t)i);
            p[i] = v >= hi ? nextafter(v, -INFINITY) : v;
        }
    } break;
    case NA_DTYPE_F32: {
        float *p = t->data;
        for (int64_t i = 0; i < n; i++) {
            float v = lof + spanf * na_philox_uniform(seed, offset, (uint64_t)i);
            p[i] = (double)v >= hi ? nextafterf(v, -INFINITY) : v;
        }
    } break;
    default: { /* f16, bf16 */
        bool f16 = t->dtype == NA_DTYPE_F16;
        uint16_t *p = t->data;
        for (int64_t i = 0; i < n; i++) {
            float v = lof + spanf * na_philox_uniform(seed, offset, (uint64_t)i);
            uint16_t b = f16 ? na_f32_to_f16_bits(v) : na_f32_to_bf16_bits(v);
            double r = f16 ? na_f16_bits_to_f32(b) : na_bf16_bits_to_f32(b);
            p[i] = r >= hi ? na_half_bits_prev(b) : b;
        }
    } break;
    }
    return NA_OK;
}

int na_cpu_fill_normal(na_view *t, double mean, double std, uint64_t seed, uint64_t offset) {
    float meanf = (float)mean, stdf = (float)std;
    NA_CPU_RANDOM_FILL("cpu_fill_normal", t,
                       meanf + stdf * na_philox_normal(seed, offset, i),
                       mean + std * (double)na_philox_normal(seed, offset, (uint64_t)i));
    return NA_OK;
}

int na_cpu_dropout_mask(na_view *mask, double p, uint64_t seed, uint64_t offset) {
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    float scalef = (float)scale;
    NA_CPU_RANDOM_FILL("cpu_dropout_mask", mask,
                       (double)na_philox_uniform(seed, offset, i) >= p ? scalef : 0.0f,
                       (double)na_philox_uniform(seed, offset, (uint64_t)i) >= p ? scale : 0.0);
    return NA_OK;
}

/* ---- copy ------------------------------------------------------------------------------- */

/* Merge adjacent dims of src that are laid out contiguously w.r.t. each other, so a plain
 * contiguous tensor becomes one long row. Returns the new ndim (>= 1). */
static int coalesce(int ndim, const int64_t *shape, const int64_t *stride, int64_t *cs,
                    int64_t *cst) {
    int k = -1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (k >= 0 && cst[k] == stride[d] * shape[d]) {
            cs[k] *= shape[d];
            cst[k] = stride[d];
        } else {
            k++;
            cs[k] = shape[d];
            cst[k] = stride[d];
        }
    }
    if (k < 0) { /* a single element */
        cs[0] = 1;
        cst[0] = 1;
        return 1;
    }
    return k + 1;
}

/* How elements move from src to dst: same dtype (bytes), through float, or through double
 * (whenever f64 or i32 is involved, where float would lose bits). */
typedef enum { COPY_BYTES, COPY_F, COPY_D } copy_kind;

/* dst not dense (a padded region): element by element, both offsets counted in C order, the
 * values through double (exact for every dtype) */
static int copy_walk(na_view *dst, const na_view *src) {
    int nd = dst->ndim;
    int64_t ctr[NA_MAX_DIMS] = {0}, so = 0, dof = 0;
    for (int64_t i = 0; i < dst->numel; i++) {
        na_cpu_set(dst->dtype, dst->data, dof, na_cpu_get(src->dtype, src->data, so));
        for (int k = nd - 1; k >= 0; k--) {
            so += src->stride[k], dof += dst->stride[k];
            if (++ctr[k] < dst->shape[k]) break;
            so -= src->stride[k] * dst->shape[k], dof -= dst->stride[k] * dst->shape[k];
            ctr[k] = 0;
        }
    }
    return NA_OK;
}

int na_cpu_copy(na_view *dst, const na_view *src) {
    size_t esz = na_dtype_size(src->dtype);
    if (!esz) return na_cpu_bad_dtype("cpu_copy", "src", src->dtype);
    if (!na_dtype_size(dst->dtype)) return na_cpu_bad_dtype("cpu_copy", "dst", dst->dtype);
    if (src->numel != dst->numel)
        return na_set_error(NA_ESHAPE, "cpu_copy: src has %lld elements, dst %lld",
                            (long long)src->numel, (long long)dst->numel);
    int64_t n = src->numel;
    if (n == 0) return NA_OK;
    if (!na_view_is_c_order(dst)) { /* written in dst's memory order when dst is dense */
        int perm[NA_MAX_DIMS];
        if (!na_view_same_shape(dst, src))
            return na_set_error(NA_ESHAPE, "cpu_copy: a strided dst needs src's shape");
        if (!na_dense_order(dst, perm)) return copy_walk(dst, src);
        na_view d = na_view_permuted(dst, perm), s = na_view_permuted(src, perm);
        return na_cpu_copy(&d, &s);
    }

    int64_t shape[NA_MAX_DIMS], stride[NA_MAX_DIMS];
    int nd = coalesce(src->ndim, src->shape, src->stride, shape, stride);
    copy_kind kind = src->dtype == dst->dtype ? COPY_BYTES
                     : (src->dtype == NA_DTYPE_F64 || dst->dtype == NA_DTYPE_F64 ||
                        src->dtype == NA_DTYPE_I32 || dst->dtype == NA_DTYPE_I32)
                         ? COPY_D
                         : COPY_F;
    if (nd == 1 && stride[0] == 1) {
        if (kind == COPY_BYTES) return na_cpu_memcpy(dst->data, src->data, (size_t)n * esz);
        /* contiguous conversion: through f32 over the pool (autocast's casts), else chunked */
        if (kind == COPY_F) {
            na_cpu_convert_f(dst->dtype, dst->data, src->dtype, src->data, n);
            return NA_OK;
        }
        double bd[NA_CPU_CHUNK];
        for (int64_t o = 0; o < n; o += NA_CPU_CHUNK) {
            int64_t c = n - o < NA_CPU_CHUNK ? n - o : NA_CPU_CHUNK;
            na_cpu_store_d(dst->dtype, dst->data, o, c,
                           na_cpu_view_d(src->dtype, src->data, o, c, bd));
        }
        return NA_OK;
    }

    /* strided: walk the outer dims with a counter, the innermost dim as a row */
    int64_t rows = n / shape[nd - 1], len = shape[nd - 1], st = stride[nd - 1];
    int64_t ctr[NA_MAX_DIMS] = {0};
    int64_t base = 0, out = 0;
    const char *s = src->data;
    char *d = dst->data;
    for (int64_t r = 0; r < rows; r++) {
        switch (kind) {
        case COPY_BYTES:
            switch (esz) {
            case 1:
                for (int64_t j = 0; j < len; j++) ((uint8_t *)d)[out + j] = ((const uint8_t *)s)[base + j * st];
                break;
            case 2:
                for (int64_t j = 0; j < len; j++) ((uint16_t *)d)[out + j] = ((const uint16_t *)s)[base + j * st];
                break;
            case 4:
                for (int64_t j = 0; j < len; j++) ((uint32_t *)d)[out + j] = ((const uint32_t *)s)[base + j * st];
                break;
            default:
                for (int64_t j = 0; j < len; j++) ((uint64_t *)d)[out + j] = ((const uint64_t *)s)[base + j * st];
                break;
            }
            break;
        case COPY_F:
            for (int64_t j = 0; j < len; j++) {
                float v = (float)na_cpu_get(src->dtype, s, base + j * st);
                na_cpu_store_f(dst->dtype, d, out + j, 1, &v);
            }
            break;
        case COPY_D:
            for (int64_t j = 0; j < len; j++)
                na_cpu_set(dst->dtype, d, out + j, na_cpu_get(src->dtype, s, base + j * st));
            break;
        }
        out += len;
        for (int k = nd - 2; k >= 0; k--) { /* advance the outer counter */
            base += stride[k];
            if (++ctr[k] < shape[k]) break;
            base -= stride[k] * shape[k];
            ctr[k] = 0;
        }
    }
    return NA_OK;
}
