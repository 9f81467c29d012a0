/* kernels/cuda/multi_tensor.cuh — launching one kernel over a list of tensors (Apex's
 * multi_tensor_apply, simplified): each launch takes up to NA_MT_MAX tensors, passed by value
 * in the kernel's arguments; every tensor is cut into chunks of NA_MT_CHUNK elements and a
 * block walks chunks (grid-stride). chunk_start[t] is the first chunk of tensor t in the
 * launch (chunk_start[n] = the launch's chunk count); a block finds its tensor by a short
 * linear search. Used by the optimizer steps, the global L2 norm and amp's unscale.
 */
#ifndef NANOAMP_KERNELS_CUDA_MULTI_TENSOR_CUH
#define NANOAMP_KERNELS_CUDA_MULTI_TENSOR_CUH

#include "cuda_common.cuh"

#define NA_MT_MAX 24
#define NA_MT_CHUNK 8192

struct na_mt_chunks {
    int n;
    int64_t chunk_start[NA_MT_MAX + 1];
    int64_t numel[NA_MT_MAX];
};

/* Adds a tensor of `numel` elements; returns its slot. */
static inline int na_mt_add(na_mt_chunks *c, int64_t numel) {
    if (c->n == 0) c->chunk_start[0] = 0;
    int t = c->n++;
    c->numel[t] = numel;
    c->chunk_start[t + 1] = c->chunk_start[t] + (numel + NA_MT_CHUNK - 1) / NA_MT_CHUNK;
    return t;
}

static inline int64_t na_mt_total(const na_mt_chunks *c) { return c->n ? c->chunk_start[c->n] : 0; }

/* The tensor of chunk c and the chunk's element range [*lo, *hi). */
static __device__ __forceinline__ int na_mt_locate(const na_mt_chunks &c, int64_t chunk,
                                                   int64_t *lo, int64_t *hi) {
    int t = 0;
    while (chunk >= c.chunk_start[t + 1]) t++;
    *lo = (chunk - c.chunk_start[t]) * NA_MT_CHUNK;
    int64_t h = *lo + NA_MT_CHUNK;
    *hi = h < c.numel[t] ? h : c.numel[t];
    return t;
}

static inline unsigned na_mt_grid(int64_t chunks) {
    int64_t cap = (int64_t)(na_cuda_ctx.sm_count > 0 ? na_cuda_ctx.sm_count : 80) * 8;
    return (unsigned)(chunks < 1 ? 1 : (chunks < cap ? chunks : cap));
}

#endif
