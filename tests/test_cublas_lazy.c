/* kernels/cuda/cublas_lazy.c: a CUDA build does not load cuBLAS until the backend calls it.
 *
 * libcublasLt alone is ~147 MiB of resident pages; a CPU run of a CUDA build must not carry
 * it. The first cuBLAS call loads both libraries and forwards; cuBLASLt's descriptor calls
 * run on the host, so that part is checked without a GPU. On a GPU machine the first call is
 * the backend's initialization (it creates the handles), and the test checks that instead. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* cublasLt.h: f() */
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "nanoamp.h"

static bool mapped(const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert(f, "cannot read /proc/self/maps");
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

Test(cublas_lazy, not_loaded_by_cpu_work_then_loaded_on_first_call) {
    /* CPU work alone never loads cuBLAS, on any machine */
    na_tensor *a = na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, 2, (int64_t[]){4, 4});
    cr_assert(a && na_matmul(a, a));
    cr_assert(!mapped("libcublasLt.so"), "CPU work loaded cuBLASLt");
    cr_assert(!mapped("libcublas.so"), "CPU work loaded cuBLAS");
    /* Asking for CUDA initializes the backend. Without a device that stops at
     * cudaGetDeviceCount: still no cuBLAS. With one, initialization creates the cuBLAS and
     * cuBLASLt handles (kernels/cuda/backend.cu), which is that first call: then both are
     * loaded. So on a GPU machine this checks the loading through the backend's own calls, on
     * a CPU machine through the forwarder below. */
    bool device = na_cuda_available();
    cr_assert_eq(mapped("libcublasLt.so"), device, "cuBLASLt %s with%s a device",
                 device ? "not loaded by the backend's initialization" : "loaded",
                 device ? "" : "out");
    cr_assert_eq(mapped("libcublas.so"), device, "cuBLAS %s with%s a device",
                 device ? "not loaded by the backend's initialization" : "loaded",
                 device ? "" : "out");

    /* a descriptor call runs on the host: it works through the forwarder either way */
    cublasLtMatmulDesc_t desc = NULL;
    cublasStatus_t st = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cr_assert_eq(st, CUBLAS_STATUS_SUCCESS, "first call through the forwarder: %s",
                 cublasGetStatusString(st));
    cr_assert(desc);
    cr_assert(mapped("libcublasLt.so"), "the first call did not load cuBLASLt");
    cr_assert_eq(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
    na_step_end();
}
