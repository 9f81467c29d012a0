/* kernels/cpu/cpu_convert.c — whole-array f16/bf16 <-> f32 conversions, fast where the CPU can.
 *
 * Every CPU kernel converts half data through these (na_cpu_load_f / na_cpu_store_f), so they
 * decide the speed of f16/bf16 on the CPU. The result must stay bit-identical to the shared
 * conversions in common/half.h (the CUDA backend uses them too; parity is compared bit for bit),
 * and tests/test_half.c proves it over all 2^32 f32 and all 2^16 half inputs, NaNs included.
 *
 * On x86 with AVX2 + F16C (chosen at run time, so the build runs on any x86):
 *   f32 -> f16: vcvtps2ph with round-to-nearest-even in the instruction (MXCSR is not read);
 *               it keeps NaN payloads, so NaNs are rewritten to sign | 0x7E00 as half.h does.
 *   f16 -> f32: vcvtph2ps (exact; a NaN keeps sign and payload and is made quiet, as half.h).
 *   bf16:       the half.h bit formulas on 8 lanes of integers (cpu_half_simd.h's na_h8_*).
 *               AVX512_BF16's vcvtneps2bf16 is not used: it flushes f32 subnormals to zero and
 *               keeps NaN payloads, where half.h rounds subnormals and returns 0x7FC0.
 * With AVX-512F/BW/VL (na_cpu_half512): the same conversions 16 lanes at a time, the tail
 * masked (cpu_half_simd.h; the kernels that convert in registers use the same functions).
 * Elsewhere, or with na_cpu_convert_force_soft set, plain loops over the half.h functions. */
#include "cpu/cpu_half_simd.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_parallel.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define NA_CPU_X86_FAST 1
#include <cpuid.h>
#include <immintrin.h>
#endif

bool na_cpu_convert_force_soft = false;

/* ---- portable loops (the specification, inlined from half.h) ----------------------------- */

static void f32_to_f16_soft(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = na_f32_to_f16_bits(src[i]);
}
static void f16_to_f32_soft(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = na_f16_bits_to_f32(src[i]);
}
static void f32_to_bf16_soft(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = na_f32_to_bf16_bits(src[i]);
}
static void bf16_to_f32_soft(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = na_bf16_bits_to_f32(src[i]);
}

#ifdef NA_CPU_X86_FAST
#define NA_AVX2_F16C __attribute__((target("avx2,f16c")))
/* GCC leaves out the vzeroupper it owes when an AVX function ends in a tail call (here the
 * soft loop for the last < 8 elements). The dirty upper halves then make every SSE
 * instruction after the call pay a transition cost until something clears them: BatchNorm
 * on f16 data ran 3x slower than on bf16 (na-kbench bn). So they are cleared by hand. */
#define na_avx_upper_clear() _mm256_zeroupper()

/* 8 lanes a step through cpu_half_simd.h's na_h8_widen / na_h8_narrow (the conversions the
 * AVX2 half loops of BatchNorm, the max pool and the sums use, so tests/test_half.c's every-input
 * checks prove those too), the last < 8 by the soft loops */
NA_AVX2_F16C static void f32_to_half_avx2(bool f16, uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), na_h8_narrow(f16, _mm256_loadu_ps(src + i)));
    na_avx_upper_clear();
    (f16 ? f32_to_f16_soft : f32_to_bf16_soft)(dst + i, src + i, n - i);
}
NA_AVX2_F16C static void half_to_f32_avx2(bool f16, float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, na_h8_widen(f16, _mm_loadu_si128((const __m128i *)(src + i))));
    na_avx_upper_clear();
    (f16 ? f16_to_f32_soft : bf16_to_f32_soft)(dst + i, src + i, n - i);
}
static void f32_to_f16_f16c(uint16_t *d, const float *s, int64_t n) { f32_to_half_avx2(true, d, s, n); }
static void f16_to_f32_f16c(float *d, const uint16_t *s, int64_t n) { half_to_f32_avx2(true, d, s, n); }
static void f32_to_bf16_avx2(uint16_t *d, const float *s, int64_t n) {
    f32_to_half_avx2(false, d, s, n);
}
static void bf16_to_f32_avx2(float *d, const uint16_t *s, int64_t n) {
    half_to_f32_avx2(false, d, s, n);
}
#endif

#ifdef NA_CPU_HALF_SIMD
/* 16 lanes a step, the last step masked: no scalar tail (a BatchNorm row of 196 left 4) */
NA_HALF512 static void half_to_f32_512(bool f16, float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = na_h512_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, na_h512_load(f16, src + i, m));
    }
}
NA_HALF512 static void f32_to_half_512(bool f16, uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = na_h512_mask(n - i);
        na_h512_store(f16, dst + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
}
static void f16_to_f32_512(float *d, const uint16_t *s, int64_t n) {
    half_to_f32_512(true, d, s, n);
}
static void bf16_to_f32_512(float *d, const uint16_t *s, int64_t n) {
    half_to_f32_512(false, d, s, n);
}
static void f32_to_f16_512(uint16_t *d, const float *s, int64_t n) {
    f32_to_half_512(true, d, s, n);
}
static void f32_to_bf16_512(uint16_t *d, const float *s, int64_t n) {
    f32_to_half_512(false, d, s, n);
}
#endif

bool na_cpu_convert_is_fast(void) {
#ifdef NA_CPU_X86_FAST
    if (na_cpu_convert_force_soft) return false;
    /* Asked once: CPUID traps to the hypervisor in a VM (microseconds), and this is asked
     * per chunk. F16C is CPUID.1:ECX bit 29, read directly: clang (14) has no "f16c" in
     * __builtin_cpu_supports; its avx2 also checks that the OS saves the AVX state. */
    static _Atomic int fast = -1;
    if (fast < 0) {
        __builtin_cpu_init(); /* idempotent; needed when called before libgcc's constructor */
        unsigned a, b, c, d;
        fast = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
               (c & bit_F16C);
    }
    return fast;
#else
    return false;
#endif
}

#if defined(NA_CPU_X86_FAST) && defined(NA_CPU_HALF_SIMD)
#define NA_CPU_CONVERT_(wide, fast, soft, dst, src, n)                                      \
    (!na_cpu_convert_is_fast() ? soft : na_cpu_half512() ? wide : fast)(dst, src, n)
#elif defined(NA_CPU_X86_FAST)
#define NA_CPU_CONVERT_(wide, fast, soft, dst, src, n)                                      \
    (na_cpu_convert_is_fast() ? fast : soft)(dst, src, n)
#else
#define NA_CPU_CONVERT_(wide, fast, soft, dst, src, n) soft(dst, src, n)
#endif

void na_cpu_f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
    NA_CPU_CONVERT_(f32_to_f16_512, f32_to_f16_f16c, f32_to_f16_soft, dst, src, n);
}
void na_cpu_f16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    NA_CPU_CONVERT_(f16_to_f32_512, f16_to_f32_f16c, f16_to_f32_soft, dst, src, n);
}
void na_cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    NA_CPU_CONVERT_(f32_to_bf16_512, f32_to_bf16_avx2, f32_to_bf16_soft, dst, src, n);
}
void na_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    NA_CPU_CONVERT_(bf16_to_f32_512, bf16_to_f32_avx2, bf16_to_f32_soft, dst, src, n);
}

/* ---- dense conversions over the pool -------------------------------------------------------- */

#define NA_CPU_CONVERT_TASK_ELEMS ((int64_t)1 << 16) /* elements per task worth a wake-up */
enum { NA_CPU_CONVERT_TASKS = 8 };

typedef struct {
    na_dtype ddt, sdt;
    void *dst;
    const void *src;
    int64_t n, tasks;
} convert_job;

/* elements [lo, hi): straight into an f32 dst, else through a chunk of f32 (an f32 src read in
 * place) */
static void convert_range(const convert_job *j, int64_t lo, int64_t hi) {
    if (j->ddt == NA_DTYPE_F32) {
        na_cpu_load_f(j->sdt, j->src, lo, hi - lo, (float *)j->dst + lo);
        return;
    }
    float buf[NA_CPU_CHUNK];
    for (int64_t o = lo; o < hi; o += NA_CPU_CHUNK) {
        int64_t c = hi - o < NA_CPU_CHUNK ? hi - o : NA_CPU_CHUNK;
        na_cpu_store_f(j->ddt, j->dst, o, c, na_cpu_view_f(j->sdt, j->src, o, c, buf));
    }
}

static void convert_task(void *ctx, int64_t t) {
    const convert_job *j = ctx;
    int64_t lo, hi;
    na_cpu_task_range(j->n, j->tasks, t, 64, &lo, &hi);
    if (lo < hi) convert_range(j, lo, hi);
}

void na_cpu_convert_f(na_dtype ddt, void *dst, na_dtype sdt, const void *src, int64_t n) {
    convert_job j = {.ddt = ddt, .sdt = sdt, .dst = dst, .src = src, .n = n};
    j.tasks = na_cpu_in_parallel() ? 1
                                   : na_cpu_split(n, NA_CPU_CONVERT_TASK_ELEMS,
                                                  NA_CPU_CONVERT_TASKS);
    if (j.tasks <= 1) convert_range(&j, 0, n);
    else na_cpu_parallel_for(j.tasks, convert_task, &j);
}
