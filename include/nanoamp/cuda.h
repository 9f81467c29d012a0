/* nanoamp/cuda.h — the CUDA device: presence, capability, settings, statistics.
 * In a build without CUDA every query answers "no device" and na_cuda_* setters fail with
 * NA_EDEVICE. */
#ifndef NANOAMP_CUDA_H
#define NANOAMP_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

bool na_cuda_built(void);     /* the CUDA backend is compiled in */
bool na_cuda_available(void); /* built in and a device is present */
/* Compute capability of the current device; NA_EDEVICE when none. */
int na_cuda_capability(int *major, int *minor);
bool na_cuda_bf16_supported(void); /* sm_80 and newer */
/* TF32 tensor-core math for f32 matrix products and convolutions; off by default, on at start
 * with NANOAMP_TF32=1. */
int na_cuda_set_tf32(bool enabled);
bool na_cuda_tf32(void); /* TF32 math is on (false when there is no device) */
int na_cuda_synchronize(void);
/* The CUDA stream (a cudaStream_t) every nanoamp kernel, copy and library call runs on: launch
 * your own kernels on it and they are ordered with nanoamp's, with no synchronisation. NULL
 * when there is no device. */
void *na_cuda_stream(void);
/* Device->host copies and explicit synchronizations made through the backend so far: a
 * training step's count of these is its number of host round trips. */
uint64_t na_cuda_sync_count(void);
/* Device memory: bytes currently allocated by nanoamp, and the peak since start. */
uint64_t na_cuda_bytes_in_use(void);
uint64_t na_cuda_peak_bytes(void);
const char *na_cuda_device_name(void); /* "" when none */

#ifdef __cplusplus
}
#endif
#endif
