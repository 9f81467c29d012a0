/* bench/peak.h — the measured arithmetic peak of this machine, the yardstick for the kernels'
 * GFLOP/s (na-kbench peak; the conv cases give each layer's % of it).
 *
 * A probe is a loop of independent multiply-adds in registers, nothing read from memory, run
 * as many small tasks on the CPU backend's thread pool (na_cpu_parallel_for, so on the same
 * threads as the kernels, NANOAMP_THREADS of them); the best of a few timed rounds counts.
 *   f32_fma_avx512   vfmadd231ps zmm: 16 lanes x 2 flops per instruction
 *   bf16_dp_avx512   vdpbf16ps zmm: 32 bf16 products summed pairwise into 16 f32 lanes,
 *                    64 flops per instruction (the instruction oneDNN's bf16 kernels run on)
 *   f32_fma_avx2     vfmadd231ps ymm: 8 lanes x 2 flops per instruction (the CPUs without
 *                    AVX-512: Haswell to Zen 3)
 * A probe the CPU lacks (no AVX-512F, no AVX512_BF16, no AVX2 + FMA) reports 0. */
#ifndef NANOAMP_BENCH_PEAK_H
#define NANOAMP_BENCH_PEAK_H

typedef enum {
    BENCH_PEAK_F32_FMA,
    BENCH_PEAK_BF16_DP,
    BENCH_PEAK_F32_FMA_AVX2,
    BENCH_PEAK_COUNT
} bench_peak_kind;

/* "f32_fma_avx512" / "bf16_dp_avx512" / "f32_fma_avx2" */
const char *bench_peak_name(bench_peak_kind kind);

/* GFLOP/s of the probe over the pool's threads: measured on the first call (about 0.1 s),
 * remembered after; 0 where the CPU lacks the instruction. */
double bench_peak_gflops(bench_peak_kind kind);

/* The yardstick of f32 compute on this CPU: the widest FMA it has (AVX-512, else AVX2). */
bench_peak_kind bench_peak_f32(void);

/* The yardstick of bf16 compute: vdpbf16ps where the CPU has it, else the f32 one (bf16 is
 * then widened and multiplied in f32). */
bench_peak_kind bench_peak_bf16(void);

#endif
