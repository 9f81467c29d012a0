/* kernels/cuda/fill.cu — fills, arange and the Philox random fills.
 *
 * Random fills map element i to Philox counters exactly as kernels/common/philox.h says, so a
 * fill is a pure function of (seed, offset, i) and matches the CPU backend for any launch
 * geometry; the value formulas are the CPU backend's (see below).
 */
#include "cuda_common.cuh"
#include "common/philox.h"

/* ---- fill / arange --------------------------------------------------------------------- */
template <class T> __global__ void k_fill(typename T::S *p, int64_t n, typename T::S v) {
    NA_GRID_STRIDE(i, n) p[i] = v;
}

template <class T>
__global__ void k_fill_strided(typename T::S *p, na_strided g, int64_t n, typename T::S v) {
    NA_GRID_STRIDE(i, n) p[na_strided_offset(g, i)] = v;
}

int na_cuda_fill(na_view *t, double value) {
    if (t->numel == 0) return NA_OK;
    return na_dispatch_all(t->dtype, "fill", [&](auto tag) -> int {
        typedef typename decltype(tag)::T T;
        typename T::S v = T::from_double(value);
        int64_t n = t->numel;
        if (na_cuda_is_contiguous(t)) {
            k_fill<T><<<na_grid(n, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
                (typename T::S *)t->data, n, v);
        } else {
            k_fill_strided<T><<<na_grid(n, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
                (typename T::S *)t->data, na_strided_of(t), n, v);
        }
        NA_CUDA_LAUNCH_CHECK("k_fill");
        return NA_OK;
    });
}

template <class T>
__global__ void k_arange(typename T::S *p, int64_t n, double start, double step) {
    /* no FMA contraction: the same double rounding as the CPU's start + i*step */
    NA_GRID_STRIDE(i, n) p[i] = T::from_double(__dadd_rn(start, __dmul_rn((double)i, step)));
}

int na_cuda_arange(na_view *t, double start, double step) {
    if (t->numel == 0) return NA_OK;
    return na_dispatch_all(t->dtype, "arange", [&](auto tag) -> int {
        typedef typename decltype(tag)::T T;
        k_arange<T><<<na_grid(t->numel, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            (typename T::S *)t->data, t->numel, start, step);
        NA_CUDA_LAUNCH_CHECK("k_arange");
        return NA_OK;
    });
}

/* ---- random fills ---------------------------------------------------------------------- */
/* As the CPU backend (kernels/cpu/cpu_fill.c): f32 math for f32/f16/bf16 tensors, f64 for f64;
 * the f32 products and sums are rounded separately (__fmul_rn/__fadd_rn: no FMA contraction,
 * as on the host), so uniform fills and dropout masks are bit-identical to the CPU's. */
enum { RNG_UNIFORM, RNG_NORMAL, RNG_DROPOUT };

template <class T, int KIND>
__global__ void k_random_f(typename T::S *p, int64_t n, uint64_t seed, uint64_t offset, float a,
                           float b, double pd) {
    NA_GRID_STRIDE(i, n) {
        float v;
        if (KIND == RNG_UNIFORM) { /* a = lo, b = hi - lo */
            v = __fadd_rn(a, __fmul_rn(b, na_philox_uniform(seed, offset, (uint64_t)i)));
        } else if (KIND == RNG_NORMAL) { /* a = mean, b = std */
            v = __fadd_rn(a, __fmul_rn(b, na_philox_normal(seed, offset, (uint64_t)i)));
        } else { /* pd = p, b = scale */
            v = (double)na_philox_uniform(seed, offset, (uint64_t)i) >= pd ? b : 0.0f;
        }
        T::st(p, i, v);
        /* as the CPU: rounding to the storage dtype may land on hi (pd); keep [lo, hi) */
        if (KIND == RNG_UNIFORM && (double)T::ld(p, i) >= pd) {
            if constexpr (sizeof(typename T::S) == 2)
                p[i] = na_half_bits_prev(p[i]);
            else
                p[i] = nextafterf(v, -INFINITY);
        }
    }
}

template <int KIND>
__global__ void k_random_d(double *p, int64_t n, uint64_t seed, uint64_t offset, double a,
                           double b, double hi) {
    NA_GRID_STRIDE(i, n) {
        double v;
        if (KIND == RNG_UNIFORM)
        {
            v = __dadd_rn(a, __dmul_rn(b, (double)na_philox_uniform(seed, offset, (uint64_t)i)));
            if (v >= hi) v = nextafter(v, -INFINITY);
        } else if (KIND == RNG_NORMAL)
            v = __dadd_rn(a, __dmul_rn(b, (double)na_philox_normal(seed, offset, (uint64_t)i)));
        else /* a = p, b = scale */
            v = (double)na_philox_uniform(seed, offset, (uint64_t)i) >= a ? b : 0.0;
        p[i] = v;
    }
}

/* a, b: the f64 parameters (lo, hi-lo | mean, std | p, scale); af, bf their f32 forms */
template <int KIND>
static int launch_random(na_view *t, uint64_t seed, uint64_t offset, double a, double b,
                         float af, float bf, const char *who, double hi = 0) {
    if (t->numel == 0) return NA_OK;
    unsigned grid = na_grid(t->numel, NA_BLOCK);
    if (t->dtype == NA_DTYPE_F64) {
        k_random_d<KIND><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>((double *)t->data, t->numel,
                                                                    seed, offset, a, b, hi);
        NA_CUDA_LAUNCH_CHECK("k_random_d");
        return NA_OK;
    }
    return na_dispatch_float(t->dtype, who, [&](auto tag) -> int {
        typedef typename decltype(tag)::T T;
        k_random_f<T, KIND><<<grid, NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            (typename T::S *)t->data, t->numel, seed, offset, af, bf, KIND == RNG_UNIFORM ? hi : a);
        NA_CUDA_LAUNCH_CHECK("k_random_f");
        return NA_OK;
    });
}

int na_cuda_fill_uniform(na_view *t, double lo, double hi, uint64_t seed, uint64_t offset) {
    return launch_random<RNG_UNIFORM>(t, seed, offset, lo, hi - lo, (float)lo, (float)(hi - lo),
                                      "fill_uniform", hi);
}

int na_cuda_fill_normal(na_view *t, double mean, double std, uint64_t seed, uint64_t offset) {
    return launch_random<RNG_NORMAL>(t, seed, offset, mean, std, (float)mean, (float)std,
                                     "fill_normal");
}

int na_cuda_dropout_mask(na_view *mask, double p, uint64_t seed, uint64_t offset) {
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    return launch_random<RNG_DROPOUT>(mask, seed, offset, p, scale, (float)p, (float)scale,
                                      "dropout_mask");
}
