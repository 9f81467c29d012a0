/* kernels/cuda/copy.cu — dtype-converting copies.
 *
 * src any view (strided: the offset of each element comes from src's shape and strides);
 * dst contiguous, or dense in another order (channels-last: both are then read in dst's
 * memory order), or any view (a padded region: an element walk). Every dtype pair,
 * converting through double, which is exact for every source type, so the result is the
 * direct conversion (f64 -> f16/bf16 goes through f32, as on the
 * CPU; float -> integer saturates, NaN -> 0). Same dtype and contiguous: cudaMemcpyAsync.
 */
#include "cuda_common.cuh"

/* ---- copy -------------------------------------------------------------------------------- */
template <class TD, class TS>
__global__ void k_copy(typename TD::S *dst, const typename TS::S *src, int64_t n) {
    NA_GRID_STRIDE(i, n) dst[i] = TD::from_double(TS::to_double(src[i]));
}

/* strided, same dtype: move the bits (by element size) */
template <typename E>
__global__ void k_copy_strided_bits(E *dst, const E *src, na_strided g, int64_t n) {
    NA_GRID_STRIDE(i, n) dst[i] = src[na_strided_offset(g, i)];
}

/* strided with conversion (rare): runtime dtypes through double */
__global__ void k_copy_strided_any(void *dst, int ddt, const void *src, int sdt, na_strided g,
                                   int64_t n) {
    NA_GRID_STRIDE(i, n) na_st_d(dst, ddt, i, na_ld_d(src, sdt, na_strided_offset(g, i)));
}

/* contiguous, an FP8 side: runtime dtypes through f32 (common/float8.h, as on the CPU; the
 * f64 <-> FP8 pairs go through f32 too, as PyTorch's casts do) */
__global__ void k_copy_fp8(void *dst, int ddt, const void *src, int sdt, int64_t n) {
    NA_GRID_STRIDE(i, n) na_st_f(dst, ddt, i, na_ld_f(src, sdt, i));
}

static int copy_impl(void *dst, na_dtype ddt, const void *src, na_dtype sdt, int64_t n,
                     const na_strided *g) {
    if (n == 0) return NA_OK;
    if (!g && ddt == sdt) {
        NA_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * na_dtype_size(ddt),
                                      cudaMemcpyDeviceToDevice, na_cuda_ctx.stream));
        return NA_OK;
    }
    unsigned grid = na_grid(n, NA_BLOCK);
    cudaStream_t st = na_cuda_ctx.stream;
    if (g) {
        if (ddt == sdt) {
            switch (na_dtype_size(ddt)) {
            case 1: k_copy_strided_bits<uint8_t><<<grid, NA_BLOCK, 0, st>>>((uint8_t *)dst, (const uint8_t *)src, *g, n); break;
            case 2: k_copy_strided_bits<uint16_t><<<grid, NA_BLOCK, 0, st>>>((uint16_t *)dst, (const uint16_t *)src, *g, n); break;
            case 4: k_copy_strided_bits<uint32_t><<<grid, NA_BLOCK, 0, st>>>((uint32_t *)dst, (const uint32_t *)src, *g, n); break;
            default: k_copy_strided_bits<uint64_t><<<grid, NA_BLOCK, 0, st>>>((uint64_t *)dst, (const uint64_t *)src, *g, n); break;
            }
        } else {
            k_copy_strided_any<<<grid, NA_BLOCK, 0, st>>>(dst, ddt, src, sdt, *g, n);
        }
        NA_CUDA_LAUNCH_CHECK("k_copy_strided");
        return NA_OK;
    }
    if (na_dtype_is_fp8(ddt) || na_dtype_is_fp8(sdt)) {
        k_copy_fp8<<<grid, NA_BLOCK, 0, st>>>(dst, ddt, src, sdt, n);
        NA_CUDA_LAUNCH_CHECK("k_copy_fp8");
        return NA_OK;
    }
    return na_dispatch_all(ddt, "copy", [&](auto dtag) -> int {
        typedef typename decltype(dtag)::T TD;
        return na_dispatch_all(sdt, "copy", [&](auto stag) -> int {
            typedef typename decltype(stag)::T TS;
            k_copy<TD, TS><<<grid, NA_BLOCK, 0, st>>>((typename TD::S *)dst,
                                                      (const typename TS::S *)src, n);
            NA_CUDA_LAUNCH_CHECK("k_copy");
            return NA_OK;
        });
    });
}

/* dst not dense (a padded region): both strided, runtime dtypes through double */
__global__ void k_copy_walk(void *dst, int ddt, na_strided dg, const void *src, int sdt,
                            na_strided sg, int64_t n) {
    NA_GRID_STRIDE(i, n) {
        na_st_d(dst, ddt, na_strided_offset(dg, i), na_ld_d(src, sdt, na_strided_offset(sg, i)));
    }
}

int na_cuda_copy(na_view *dst, const na_view *src) {
    if (dst->numel != src->numel)
        return na_set_error(NA_ESHAPE, "copy (cuda): dst has %lld elements, src %lld",
                            (long long)dst->numel, (long long)src->numel);
    if (!na_cuda_is_contiguous(dst)) { /* written in dst's memory order when dst is dense */
        int perm[NA_MAX_DIMS];
        if (!na_view_same_shape(dst, src))
            return na_set_error(NA_ESHAPE, "copy (cuda): a strided dst needs src's shape");
        if (na_dense_order(dst, perm)) {
            na_view d = na_view_permuted(dst, perm), s = na_view_permuted(src, perm);
            return na_cuda_copy(&d, &s);
        }
        if (dst->numel == 0) return NA_OK;
        k_copy_walk<<<na_grid(dst->numel, NA_BLOCK), NA_BLOCK, 0, na_cuda_ctx.stream>>>(
            dst->data, dst->dtype, na_strided_of(dst), src->data, src->dtype, na_strided_of(src),
            dst->numel);
        NA_CUDA_LAUNCH_CHECK("k_copy_walk");
        return NA_OK;
    }
    if (na_cuda_is_contiguous(src))
        return copy_impl(dst->data, dst->dtype, src->data, src->dtype, src->numel, NULL);
    na_strided g = na_strided_of(src);
    return copy_impl(dst->data, dst->dtype, src->data, src->dtype, src->numel, &g);
}

int na_cuda_convert(void *dst, na_dtype dst_dt, const void *src, na_dtype src_dt, int64_t n) {
    return copy_impl(dst, dst_dt, src, src_dt, n, NULL);
}
