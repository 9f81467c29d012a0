/* OpenBLAS's kernels chosen from the CPU's features (see blas_tune.h). */
#include "blas_tune.h"

#include <stdbool.h>
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

/* Whether the launcher started several ranks on this machine (mpirun's variables, or the
 * LOCAL_WORLD_SIZE / WORLD_SIZE convention): read before the communicator exists, since
 * OpenBLAS sizes its thread pool when it loads. */
static bool ranks_share_this_machine(void) {
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "WORLD_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v) > 1;
    }
    return false;
}

void blas_tune_reexec(char **argv) {
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : blas_tune_core();
    /* ranks on one machine: one OpenBLAS thread each unless OPENBLAS_NUM_THREADS says (N
     * ranks of N threads on N cores would fight over them) */
    bool one_thread = !getenv("OPENBLAS_NUM_THREADS") && ranks_share_this_machine();
    if (!core && !one_thread) return;
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
    if (one_thread) setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("NANOAMP_NO_BLAS_TUNE", "1", 1); /* once */
    execv("/proc/self/exe", argv);
}
