/* examples/custom_op/swish.cu — swish's CUDA kernels: one thread per element, f32, on the
 * stream the caller passes (nanoamp's: see swish.c). A grid-stride loop covers any n. */
#include <cuda_runtime.h>

#include "swish.h"

static __global__ void k_swish(const float *x, float *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = swish_f32(x[i]);
}

static __global__ void k_swish_grad(const float *x, const float *gy, float *gx, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        gx[i] = swish_grad_f32(x[i], gy[i]);
}

static unsigned blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

/* A launch fails at once (bad configuration) or later, at the next synchronising call: the
 * caller needs no synchronisation, nanoamp's next op runs after the kernel on the stream. */
extern "C" const char *swish_cuda_forward(const float *x, float *y, int64_t n, void *stream) {
    k_swish<<<blocks(n), 256, 0, (cudaStream_t)stream>>>(x, y, n);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

extern "C" const char *swish_cuda_backward(const float *x, const float *gy, float *gx, int64_t n,
                                           void *stream) {
    k_swish_grad<<<blocks(n), 256, 0, (cudaStream_t)stream>>>(x, gy, gx, n);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}
