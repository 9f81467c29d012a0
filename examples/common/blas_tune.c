/* OpenBLAS's kernels chosen from the CPU's features (see blas_tune.h). */
#include "blas_tune.h"

#include <stdlib.h>
#include <unistd.h>

const char *blas_tune_core(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (getenv("NANOAMP_NO_BLAS_TUNE")) return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

void blas_tune_reexec(char **argv) {
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : blas_tune_core();
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("NANOAMP_NO_BLAS_TUNE", "1", 1); /* once */
    execv("/proc/self/exe", argv);
}
