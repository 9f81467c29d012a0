/* bench/peak.c — the peak-FLOP probes of bench/peak.h.
 *
 * Each task runs ACC independent accumulator chains (enough to cover the FMA latency times the
 * FMA ports: 4 cycles x 2 on Zen 3/4 and Skylake-X; 5 x 2 on Haswell) for PEAK_ITERS rounds; the work is cut into
 * many tasks so that the pool balances it over its threads, and the best of PEAK_ROUNDS timed
 * rounds (after one untimed round that starts the workers) is the peak. */
#include "peak.h"

#include <stdint.h>

#include "bench_util.h"
#include "cpu/cpu_parallel.h"
#include "nanoamp/threads.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_X86 1
#endif

enum { ACC = 12, PEAK_ITERS = 100000, TASKS_PER_THREAD = 16, PEAK_ROUNDS = 20 };

static volatile float peak_sink; /* keeps the accumulators alive */

#ifdef PEAK_X86
__attribute__((target("avx512f"))) static void probe_f32_fma(void *ctx, int64_t t) {
    (void)ctx;
    __m512 acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps((float)(i + t));
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < PEAK_ITERS; k++)
        for (int i = 0; i < ACC; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, acc[i]);
    peak_sink = _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static void probe_f32_fma_avx2(void *ctx, int64_t t) {
    (void)ctx;
    __m256 acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm256_set1_ps((float)(i + t));
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < PEAK_ITERS; k++)
        for (int i = 0; i < ACC; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 s = acc[0];
    for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, acc[i]);
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    peak_sink = lanes[0] + lanes[7];
}

__attribute__((target("avx512f,avx512bf16"))) static void probe_bf16_dp(void *ctx, int64_t t) {
    (void)ctx;
    __m512 acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps((float)(i + t));
    /* bf16 pairs (1.0, 2^-20): tiny products, so the sums stay finite */
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80),
                   b = (__m512bh)_mm512_set1_epi32(0x35803580);
    for (int k = 0; k < PEAK_ITERS; k++)
        for (int i = 0; i < ACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, acc[i]);
    peak_sink = _mm512_reduce_add_ps(s);
}
#endif

static const struct {
    const char *name;
    double flops_per_instr;
#ifdef PEAK_X86
    void (*probe)(void *, int64_t);
#endif
} probes[BENCH_PEAK_COUNT] = {
#ifdef PEAK_X86
    [BENCH_PEAK_F32_FMA] = {"f32_fma_avx512", 32, probe_f32_fma},
    [BENCH_PEAK_BF16_DP] = {"bf16_dp_avx512", 64, probe_bf16_dp},
    [BENCH_PEAK_F32_FMA_AVX2] = {"f32_fma_avx2", 16, probe_f32_fma_avx2},
#else
    [BENCH_PEAK_F32_FMA] = {"f32_fma_avx512", 32},
    [BENCH_PEAK_BF16_DP] = {"bf16_dp_avx512", 64},
    [BENCH_PEAK_F32_FMA_AVX2] = {"f32_fma_avx2", 16},
#endif
};

const char *bench_peak_name(bench_peak_kind kind) { return probes[kind].name; }

static bool cpu_has(bench_peak_kind kind) {
#ifdef PEAK_X86
    __builtin_cpu_init();
    if (kind == BENCH_PEAK_F32_FMA) return __builtin_cpu_supports("avx512f");
    if (kind == BENCH_PEAK_F32_FMA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
    (void)kind;
    return false;
#endif
}

bench_peak_kind bench_peak_f32(void) {
    return cpu_has(BENCH_PEAK_F32_FMA) ? BENCH_PEAK_F32_FMA : BENCH_PEAK_F32_FMA_AVX2;
}

bench_peak_kind bench_peak_bf16(void) {
    return cpu_has(BENCH_PEAK_BF16_DP) ? BENCH_PEAK_BF16_DP : bench_peak_f32();
}

double bench_peak_gflops(bench_peak_kind kind) {
    static double measured[BENCH_PEAK_COUNT];
    static bool done[BENCH_PEAK_COUNT];
    if (done[kind]) return measured[kind];
    done[kind] = true;
    if (!cpu_has(kind)) return measured[kind] = 0;
#ifdef PEAK_X86
    int64_t tasks = (int64_t)na_get_num_threads() * TASKS_PER_THREAD;
    double flops = (double)tasks * PEAK_ITERS * ACC * probes[kind].flops_per_instr, best = 0;
    for (int r = 0; r <= PEAK_ROUNDS; r++) {
        double t0 = bench_now_s();
        na_cpu_parallel_for(tasks, probes[kind].probe, NULL);
        double rate = flops / (bench_now_s() - t0) / 1e9;
        if (r > 0 && rate > best) best = rate; /* round 0 starts the workers */
    }
    measured[kind] = best;
#endif
    return measured[kind];
}
