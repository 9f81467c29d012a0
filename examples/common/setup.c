/* What the trainers do before training: pick OpenBLAS's kernels, measure the data's
 * per-channel statistics (see trainer.h). */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "trainer.h"

void trainer_tune_blas(char **argv) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (getenv("OPENBLAS_CORETYPE") || getenv("NANOAMP_NO_BLAS_TUNE")) return;
    __builtin_cpu_init();
    const char *core = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        core = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        core = "Haswell";
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("NANOAMP_NO_BLAS_TUNE", "1", 1); /* once */
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the default kernels */
#else
    (void)argv;
#endif
}


void trainer_channel_stats(const na_dataset *ds, float *mean, float *std) {
    int64_t plane = (int64_t)ds->height * ds->width;
    for (int c = 0; c < ds->channels; c++) {
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < ds->n; i++) {
            const uint8_t *p = ds->images + (i * ds->channels + c) * plane;
            for (int64_t j = 0; j < plane; j++) {
                double v = p[j] / 255.0;
                s += v, s2 += v * v;
            }
        }
        double n = (double)ds->n * (double)plane;
        mean[c] = (float)(s / n);
        std[c] = (float)sqrt(fmax(s2 / n - (s / n) * (s / n), 1e-12));
    }
}

