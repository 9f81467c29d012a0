/* kernels/cpu/cpu_backend.c — the CPU backend's table, memory, scratch and pairwise sums.
 *
 * Memory is plain host memory: 64-byte aligned, sizes rounded up to 64 bytes so vector loops
 * may read a whole last line. Copies are memcpy and nothing is asynchronous.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu/cpu_half_simd.h"
#include "cpu/cpu_internal.h"

/* ---- memory ----------------------------------------------------------------------------- */

void *na_cpu_alloc(size_t bytes) {
    if (bytes > SIZE_MAX - 63) {
        na_set_error(NA_ENOMEM, "cpu_alloc: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    size_t rounded = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) na_set_error(NA_ENOMEM, "cpu_alloc: out of memory allocating %zu bytes", bytes);
    return p;
}

void na_cpu_free(void *p) { free(p); }

int na_cpu_memcpy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memcpy(dst, src, bytes);
    return NA_OK;
}

int na_cpu_synchronize(void) { return NA_OK; }

/* ---- scratch ---------------------------------------------------------------------------- */

typedef struct {
    void *p[NA_CPU_SCRATCH_COUNT];
    size_t cap[NA_CPU_SCRATCH_COUNT];
    bool registered;
} scratch_set;

static _Thread_local scratch_set tls_scratch;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

/* Over all threads (workers grow their buffers concurrently). */
static atomic_size_t scratch_held, scratch_peak;

static void scratch_count(size_t freed, size_t taken) {
    size_t now = atomic_fetch_add(&scratch_held, taken - freed) + taken - freed;
    size_t peak = atomic_load(&scratch_peak);
    while (now > peak && !atomic_compare_exchange_weak(&scratch_peak, &peak, now)) {}
}
size_t na_cpu_scratch_bytes(void) { return atomic_load(&scratch_held); }
size_t na_cpu_scratch_peak(void) { return atomic_load(&scratch_peak); }

static atomic_bool reproducible;
void na_cpu_set_reproducible(bool on) { atomic_store(&reproducible, on); }
bool na_cpu_reproducible(void) { return atomic_load(&reproducible); }

static void scratch_release(void *arg) {
    scratch_set *s = arg;
    for (int i = 0; i < NA_CPU_SCRATCH_COUNT; i++) {
        scratch_count(s->cap[i], 0);
        free(s->p[i]);
        s->p[i] = NULL;
        s->cap[i] = 0;
    }
}

static void scratch_make_key(void) { pthread_key_create(&scratch_key, scratch_release); }

void *na_cpu_scratch(int slot, size_t bytes, const char *fn) {
    scratch_set *s = &tls_scratch;
    if (bytes <= s->cap[slot]) return s->p[slot];
    if (!s->registered) {
        pthread_once(&scratch_once, scratch_make_key);
        pthread_setspecific(scratch_key, s); /* frees the buffers at thread exit */
        s->registered = true;
    }
    if (bytes > SIZE_MAX - 63) {
        na_set_error(NA_ENOMEM, "%s: cannot allocate %zu bytes of scratch", fn, bytes);
        return NULL;
    }
    size_t want = bytes + bytes / 2; /* grow geometrically so the high-water mark settles */
    if (want < bytes || want > SIZE_MAX - 63) want = bytes;
    want = (want + 63) & ~(size_t)63;
    /* the old buffer goes first: its contents are not kept, and holding both would raise the
     * process's peak memory by the old size */
    scratch_count(s->cap[slot], 0);
    free(s->p[slot]);
    s->p[slot] = NULL;
    s->cap[slot] = 0;
    void *p = aligned_alloc(64, want);
    if (!p) {
        na_set_error(NA_ENOMEM, "%s: out of memory allocating %zu bytes of scratch", fn, want);
        return NULL;
    }
    scratch_count(0, want);
    s->p[slot] = p;
    s->cap[slot] = want;
    return p;
}

int na_cpu_bad_dtype(const char *fn, const char *what, na_dtype dt) {
    return na_set_error(NA_EDTYPE, "%s: unsupported dtype %s for %s", fn, na_dtype_name(dt),
                        what);
}

/* ---- pairwise sums ---------------------------------------------------------------------- */

/* The pairwise sum of x[0..n): 8 lanes up to 128 values, halves above (na_cpu_sum_f/_d). */
#define NA_CPU_DEFINE_PAIRWISE(T, NAME)                                                     \
    static T NAME(const T *x, int64_t n) {                                                  \
        if (n <= 128) {                                                                     \
            T acc[8] = {0};                                                                 \
            int64_t i = 0;                                                                  \
            for (; i + 8 <= n; i += 8)                                                      \
                for (int j = 0; j < 8; j++) acc[j] += x[i + j];                             \
            T s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])); \
            for (; i < n; i++) s += x[i];                                                   \
            return s;                                                                       \
        }                                                                                   \
        int64_t h = (n / 2 + 7) & ~(int64_t)7;                                              \
        return NAME(x, h) + NAME(x + h, n - h);                                             \
    }
NA_CPU_DEFINE_PAIRWISE(float, pairwise_f)
NA_CPU_DEFINE_PAIRWISE(double, pairwise_d)

/* ---- CPU features, asked once (CPUID traps to the hypervisor in a VM) ------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#define NA_CPU_FEATURE(name)                                                                \
    do {                                                                                    \
        static _Atomic int has_ = -1;                                                       \
        if (has_ < 0) {                                                                     \
            __builtin_cpu_init();                                                           \
            has_ = __builtin_cpu_supports(name) != 0;                                       \
        }                                                                                   \
        return has_;                                                                        \
    } while (0)
#else
#define NA_CPU_FEATURE(name) return false
#endif
bool na_cpu_has_avx512f(void) { NA_CPU_FEATURE("avx512f"); }
static bool has_avx512bf16(void) { NA_CPU_FEATURE("avx512bf16"); }
static bool has_avx512bw(void) { NA_CPU_FEATURE("avx512bw"); }
static bool has_avx512vl(void) { NA_CPU_FEATURE("avx512vl"); }

bool na_cpu_env_is(_Atomic int *cache, const char *name, const char *value) {
    int v = atomic_load(cache);
    if (v < 0) { /* racing first reads store the same answer */
        const char *e = getenv(name);
        v = e && strcmp(e, value) == 0;
        atomic_store(cache, v);
    }
    return v;
}

bool na_cpu_bf16_force_spec = false;
bool na_cpu_bf16_fast(void) {
    static _Atomic int env_off = -1;
    return NA_CPU_BF16_KERNELS && !na_cpu_bf16_force_spec && !na_cpu_reproducible() &&
           !na_cpu_env_is(&env_off, "NANOAMP_CPU_BF16", "off") && has_avx512bf16() &&
           has_avx512bw() && has_avx512vl() && na_cpu_has_avx512f();
}
static bool has_avx2(void) { NA_CPU_FEATURE("avx2"); }

bool na_cpu_half512_off = false;
bool na_cpu_half512(void) {
    return !na_cpu_half512_off && na_cpu_has_avx512f() && has_avx512bw() && has_avx512vl();
}

bool na_cpu_force_baseline = false;
bool na_cpu_use_avx2(void) { return has_avx2() && !na_cpu_force_baseline; }

bool na_cpu_half_avx2_off = false, na_cpu_half_avx2_prefer = false;
bool na_cpu_half_avx2(void) {
    static _Atomic int env_off = -1;
    return !na_cpu_half_avx2_off && !na_cpu_env_is(&env_off, "NANOAMP_CPU_HALF_AVX2", "off") && !na_cpu_half512_off && na_cpu_use_avx2() &&
           na_cpu_convert_is_fast() && (na_cpu_half_avx2_prefer || !na_cpu_half512());
}

/* The same sum built for AVX2 (GCC on x86-64; the AVX2 builds use GCC's pragma): twice the
 * lanes per instruction, the same order of additions, so the same bits
 * (tests/test_cpu_kernels.c compares the builds). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2")
NA_CPU_DEFINE_PAIRWISE(float, pairwise_f_avx2)
#pragma GCC pop_options

float na_cpu_sum_f(const float *x, int64_t n) {
    return na_cpu_use_avx2() ? pairwise_f_avx2(x, n) : pairwise_f(x, n);
}
#else
float na_cpu_sum_f(const float *x, int64_t n) { return pairwise_f(x, n); }
#endif
double na_cpu_sum_d(const double *x, int64_t n) { return pairwise_d(x, n); }

#ifdef NA_CPU_HALF_SIMD
/* pairwise_f over f16/bf16 read in place and converted in registers: the same 8 accumulators,
 * the same split and the same additions as pairwise_f over the widened copy, so the same bits */
NA_HALF512 static float pairwise_h512_leaf(bool f16, const uint16_t *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, na_h256_load(f16, x + i, 0xFF));
    float a[8];
    _mm256_storeu_ps(a, acc);
    float s = NA_CPU_LANES8_TOTAL(a);
    if (i < n) {
        _mm256_storeu_ps(a, na_h256_load(f16, x + i, (__mmask8)((1u << (n - i)) - 1u)));
        for (int64_t j = 0; j < n - i; j++) s += a[j];
    }
    return s;
}
/* the same leaf in AVX2 + F16C (na_cpu_half_avx2), the tail by na_h8_load (lanes past n 0) */
NA_HALF_AVX2 static float pairwise_h8_leaf(bool f16, const uint16_t *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, na_h8_load(f16, x + i, 8));
    float a[8];
    _mm256_storeu_ps(a, acc);
    float s = NA_CPU_LANES8_TOTAL(a);
    if (i < n) {
        _mm256_storeu_ps(a, na_h8_load(f16, x + i, n - i));
        for (int64_t j = 0; j < n - i; j++) s += a[j];
    }
    _mm256_zeroupper(); /* on every path to the return, n == 0 too (avx_upper_state) */
    return s;
}
/* the split, outside the AVX function (its one exit clears the upper halves) */
static float pairwise_h512(bool f16, bool avx2, const uint16_t *x, int64_t n) {
    if (n <= 128) return avx2 ? pairwise_h8_leaf(f16, x, n) : pairwise_h512_leaf(f16, x, n);
    int64_t h = (n / 2 + 7) & ~(int64_t)7;
    return pairwise_h512(f16, avx2, x, h) + pairwise_h512(f16, avx2, x + h, n - h);
}
#endif

bool na_cpu_sum_half_direct(na_dtype dt) {
#ifdef NA_CPU_HALF_SIMD
    return (dt == NA_DTYPE_F16 || dt == NA_DTYPE_BF16) && (na_cpu_half512() || na_cpu_half_avx2());
#else
    (void)dt;
    return false;
#endif
}

/* na_cpu_sum_any_f's order (pairwise within chunks, chunks by a pairwise counter) over halves
 * read in place; only where na_cpu_sum_half_direct(dt) */
static float sum_half_direct(na_dtype dt, const uint16_t *x, int64_t n) {
#ifdef NA_CPU_HALF_SIMD
    bool f16 = dt == NA_DTYPE_F16, avx2 = na_cpu_half_avx2();
    if (n <= NA_CPU_CHUNK) return pairwise_h512(f16, avx2, x, n);
    na_cpu_psum_f acc = {{0}, 0};
    for (int64_t o = 0; o < n; o += NA_CPU_CHUNK)
        na_cpu_psum_add_f(&acc, pairwise_h512(f16, avx2, x + o,
                                              n - o < NA_CPU_CHUNK ? n - o : NA_CPU_CHUNK));
    return na_cpu_psum_total_f(&acc);
#else
    (void)dt, (void)x, (void)n;
    return 0;
#endif
}

#define NA_CPU_DEFINE_SUMS(T, SFX)                                                          \
    void na_cpu_psum_add_##SFX(na_cpu_psum_##SFX *s, T v) {                                 \
        /* binary counter: level k holds the sum of 2^k values */                           \
        int k = 0;                                                                          \
        uint64_t c = s->count;                                                              \
        while (c & 1u) {                                                                    \
            v = s->level[k] + v;                                                            \
            c >>= 1;                                                                        \
            k++;                                                                            \
        }                                                                                   \
        s->level[k] = v;                                                                    \
        s->count++;                                                                         \
    }                                                                                       \
    T na_cpu_psum_total_##SFX(const na_cpu_psum_##SFX *s) {                                 \
        T t = 0;                                                                            \
        for (int k = 0; k < 64; k++)                                                        \
            if (s->count >> k & 1u) t += s->level[k];                                       \
        return t;                                                                           \
    }                                                                                       \
    T na_cpu_sum_any_##SFX(na_dtype dt, const void *p, int64_t off, int64_t n) {            \
        T buf[NA_CPU_CHUNK];                                                                \
        if (sizeof(T) == 4 && na_cpu_sum_half_direct(dt))                                   \
            return (T)sum_half_direct(dt, (const uint16_t *)p + off, n);                    \
        if (n <= NA_CPU_CHUNK) return na_cpu_sum_##SFX(na_cpu_view_##SFX(dt, p, off, n, buf), n); \
        if (dt == NA_DTYPE_F32 && sizeof(T) == 4) return na_cpu_sum_##SFX((const T *)p + off, n); \
        if (dt == NA_DTYPE_F64 && sizeof(T) == 8) return na_cpu_sum_##SFX((const T *)p + off, n); \
        na_cpu_psum_##SFX acc = {{0}, 0};                                                   \
        for (int64_t o = 0; o < n; o += NA_CPU_CHUNK) {                                     \
            int64_t cnt = n - o < NA_CPU_CHUNK ? n - o : NA_CPU_CHUNK;                      \
            na_cpu_psum_add_##SFX(&acc,                                                     \
                                  na_cpu_sum_##SFX(na_cpu_view_##SFX(dt, p, off + o, cnt, buf), cnt)); \
        }                                                                                   \
        return na_cpu_psum_total_##SFX(&acc);                                               \
    }

NA_CPU_DEFINE_SUMS(float, f)
NA_CPU_DEFINE_SUMS(double, d)

/* ---- the table -------------------------------------------------------------------------- */

const na_backend na_cpu_backend = {
    .name = "cpu",
    .alloc = na_cpu_alloc,
    .free = na_cpu_free,
    .memcpy_h2d = na_cpu_memcpy,
    .memcpy_d2h = na_cpu_memcpy,
    .memcpy_d2d = na_cpu_memcpy,
    .synchronize = na_cpu_synchronize,
#define NA_CPU_ENTRY_(kernel, params) .kernel = na_cpu_##kernel,
    NA_BACKEND_KERNELS(NA_CPU_ENTRY_, NA_CPU_ENTRY_)
#undef NA_CPU_ENTRY_
};

/* The CPU has no FP8 arithmetic: na_scaled_mm widens the operands to bf16/f32 (exact) and runs
 * the GEMM, so a faster bf16 GEMM serves it too. */
int na_cpu_scaled_mm(const na_scaled_mm_args *args, bool *done) {
    (void)args;
    *done = false;
    return NA_OK;
}
