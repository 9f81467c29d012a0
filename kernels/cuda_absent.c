/* kernels/cuda_absent.c — nanoamp/cuda.h in a build without the CUDA backend.
 *
 * Honest answers: not built, no device, no capability; the setters and na_cuda_synchronize
 * fail with NA_EDEVICE and say how to get a CUDA build; counters stay at zero. (The CUDA
 * build implements these in kernels/cuda/backend.cu.)
 */
#include <stddef.h>

#include "nanoamp/cuda.h"
#include "nanoamp/error.h"

#define NOT_BUILT "nanoamp was built without the CUDA backend (configure with nvcc on the PATH, or -Dcuda=enabled)"

bool na_cuda_built(void) { return false; }

bool na_cuda_available(void) { return false; }

int na_cuda_capability(int *major, int *minor) {
    if (major) *major = 0;
    if (minor) *minor = 0;
    return na_set_error(NA_EDEVICE, "na_cuda_capability: " NOT_BUILT);
}

bool na_cuda_bf16_supported(void) { return false; }

int na_cuda_set_tf32(bool enabled) {
    (void)enabled;
    return na_set_error(NA_EDEVICE, "na_cuda_set_tf32: " NOT_BUILT);
}

int na_cuda_synchronize(void) { return na_set_error(NA_EDEVICE, "na_cuda_synchronize: " NOT_BUILT); }

void *na_cuda_stream(void) { return NULL; }

uint64_t na_cuda_sync_count(void) { return 0; }

uint64_t na_cuda_bytes_in_use(void) { return 0; }

uint64_t na_cuda_peak_bytes(void) { return 0; }

const char *na_cuda_device_name(void) { return ""; }

bool na_cuda_tf32(void) { return false; }
