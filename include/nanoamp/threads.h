/* nanoamp/threads.h — the CPU backend's thread pool.
 *
 * CPU kernels that are worth splitting (convolution, BatchNorm, pooling, large elementwise
 * ops, the optimizer step) run on one pool: the calling thread plus N-1 workers that sleep
 * while there is no work. Work is cut into pieces fixed by the problem's size, never by the
 * thread count, and partial sums are added in a fixed order, so every result is bit-identical
 * for any number of threads. Large matrix products are split over the pool too, and OpenBLAS
 * is kept to one thread of its own (its idle workers spin and would compete with the pool's).
 *
 * The size is, in this order: the last na_set_num_threads, the environment variable
 * NANOAMP_THREADS (read once; ignored unless an integer in [1, NA_MAX_THREADS]), the number
 * of online cores.
 */
#ifndef NANOAMP_THREADS_H
#define NANOAMP_THREADS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest pool size accepted. */
#define NA_MAX_THREADS 256

/* Sets the pool size to n threads in all (1: everything runs on the calling thread). Returns
 * NA_OK, or NA_EINVAL (message naming n) when n is not in [1, NA_MAX_THREADS]. Workers are
 * started on the next parallel kernel and joined when the size changes or the program exits.
 * Call it from the thread that runs the model, between steps. */
int na_set_num_threads(int n);

/* The pool size now in force (resolving the default on first use). */
int na_get_num_threads(void);

/* Bytes of scratch (im2col columns, GEMM packing, rows) the CPU kernels hold now over all
 * threads, and the most they ever held: memory outside the step arena's peak. */
size_t na_cpu_scratch_bytes(void);
size_t na_cpu_scratch_peak(void);
/* Reproducible CPU numerics (off by default): when on, f32/f64 matrix products run nanoamp's
 * built-in GEMM instead of OpenBLAS (whose kernels, chosen per CPU, sum in different orders),
 * bf16 products widen to f32 instead of taking vdpbf16ps, and convolutions take im2col + that
 * GEMM instead of the AVX-512 direct kernel. Every CPU kernel then sums in one order fixed by
 * the shapes, so a run gives the same bits for any thread count and on x86-64 CPUs with or
 * without AVX-512 (what is left to the CPU is libm's expf/logf, which glibc may build with FMA;
 * its results differ between builds rarely if at all), at about half OpenBLAS's GEMM rate. The amp lessons (examples/amp) use it so that the guide can quote
 * their training runs exactly. Call it between steps. */
void na_cpu_set_reproducible(bool on);
bool na_cpu_reproducible(void);

#ifdef __cplusplus
}
#endif

#endif
