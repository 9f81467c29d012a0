/* examples/common/blas_tune.h — OpenBLAS's kernels on CPUs it does not recognize.
 *
 * OpenBLAS picks its kernels when it loads, from the CPU model it recognizes; on CPUs it does
 * not know (common in VMs) it falls back to its slowest SSE3 kernels, 3-5x slower here. The
 * trainers and mnist-minimal call blas_tune_reexec first thing (the kernels change the GEMMs'
 * sums: the program to copy must get the trainer's numbers); na-bench reports blas_tune_core() (bench/run
 * sets OPENBLAS_CORETYPE from it for both sides of the comparison). */
#ifndef NANOAMP_EXAMPLES_BLAS_TUNE_H
#define NANOAMP_EXAMPLES_BLAS_TUNE_H

/* The OPENBLAS_CORETYPE this CPU's features call for: "SkylakeX" with AVX-512, "Haswell" with
 * AVX2 + FMA, else NULL (also off x86-64 and when NANOAMP_NO_BLAS_TUNE is set). */
const char *blas_tune_core(void);

/* If OPENBLAS_CORETYPE is unset and blas_tune_core() names a core, sets it and re-executes the
 * program once (argv as given to main) so that OpenBLAS loads with it; likewise, when the
 * launcher started several ranks on this machine and OPENBLAS_NUM_THREADS is unset, sets it
 * to 1 (one thread per rank). Set OPENBLAS_CORETYPE or OPENBLAS_NUM_THREADS yourself to
 * choose, or NANOAMP_NO_BLAS_TUNE=1 to keep OpenBLAS's core choice. Returns only when it does
 * not re-execute (or the exec fails: OpenBLAS's defaults then). */
void blas_tune_reexec(char **argv);

#endif
