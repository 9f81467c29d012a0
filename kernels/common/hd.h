/* kernels/common/hd.h — marks per-element math as callable from host and device.
 * Every header in kernels/common is plain C99 that also compiles as CUDA C++. */
#ifndef NANOAMP_KERNELS_COMMON_HD_H
#define NANOAMP_KERNELS_COMMON_HD_H
#ifdef __CUDACC__
#define NA_HD __host__ __device__ __forceinline__
#else
#define NA_HD __attribute__((always_inline)) inline
#endif
#endif
