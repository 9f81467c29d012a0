/* kernels/cpu/cpu_internal.h — helpers shared by the CPU backend's files (not installed).
 *
 * The CPU backend is the reference the CUDA backend is checked against, so its numerics follow
 * the GPU: f16/bf16 are widened to f32, computed and accumulated in f32 and rounded once on
 * store (common/half.h); f64 computes in double. bf16 GEMMs on AVX512_BF16 are the one
 * exception (below): the same accumulation in another order, denormals flushed. Every kernel
 * works on chunks of at most NA_CPU_CHUNK elements converted into stack buffers (f32 data is
 * used in place; the direct convolution's packing, the 2x2 max pool and its backward,
 * BatchNorm and the sums convert f16/bf16 in registers instead, cpu_half_simd.h), so the
 * per-element loops stay simple and vectorizable and no kernel mallocs per call. Larger
 * temporaries (rows, im2col columns, GEMM packing) come from thread-local scratch buffers that
 * only grow: once a training step has run, later steps allocate nothing.
 */
#ifndef NANOAMP_KERNELS_CPU_INTERNAL_H
#define NANOAMP_KERNELS_CPU_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "common/float8.h"
#include "common/half.h"
#include "nanoamp/error.h"
#include "nanoamp/threads.h" /* na_cpu_reproducible */

#define NA_CPU_CHUNK 1024
/* The total of 8 lanes a[0..7] in the order every vectorized sum of the backend uses (pairs,
 * then pairs of pairs): the order is part of the numerics, written once. */
#define NA_CPU_LANES8_TOTAL(a) \
    ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))

/* ---- scratch ---------------------------------------------------------------------------- */

/* One kernel call may hold several slots at once; the GEMM packing slots are used only inside
 * na_cpu_gemm_*, so any kernel may call the GEMM while it holds slots 0..5. */
enum {
    NA_CPU_SCRATCH_0,
    NA_CPU_SCRATCH_1,
    NA_CPU_SCRATCH_2,
    NA_CPU_SCRATCH_3,
    NA_CPU_SCRATCH_4,
    NA_CPU_SCRATCH_5,
    NA_CPU_SCRATCH_PACK_A,
    NA_CPU_SCRATCH_PACK_B,
    NA_CPU_SCRATCH_COUNT
};

/* A 64-byte aligned buffer of at least `bytes` for this thread's `slot` (contents undefined),
 * or NULL with an NA_ENOMEM error naming `fn`. Freed when the thread exits. */
void *na_cpu_scratch(int slot, size_t bytes, const char *fn);

/* ---- dtypes ----------------------------------------------------------------------------- */

static inline bool na_cpu_is_float(na_dtype dt) {
    return dt == NA_DTYPE_F32 || dt == NA_DTYPE_F64 || dt == NA_DTYPE_F16 || dt == NA_DTYPE_BF16;
}

/* Sets "<fn>: unsupported dtype <dt> for <what>" and returns NA_EDTYPE. */
int na_cpu_bad_dtype(const char *fn, const char *what, na_dtype dt);

/* NA_EDTYPE unless t (may be NULL when allowed) is a float tensor. */
#define NA_CPU_CHECK_FLOAT(fn, t)                                                           \
    do {                                                                                    \
        if ((t) && !na_cpu_is_float((t)->dtype))                                            \
            return na_cpu_bad_dtype(fn, #t, (t)->dtype);                                    \
    } while (0)

/* Saturating float -> integer conversions (NaN -> 0), defined for every input. */
static inline int64_t na_cpu_d_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}
static inline int32_t na_cpu_d_to_i32(double v) {
    int64_t i = na_cpu_d_to_i64(v);
    return i > INT32_MAX ? INT32_MAX : i < INT32_MIN ? INT32_MIN : (int32_t)i;
}
/* u8 takes the low byte of the truncated integer, as a C cast of an integer does. */
static inline uint8_t na_cpu_d_to_u8(double v) { return (uint8_t)(uint64_t)na_cpu_d_to_i64(v); }

/* Element i of any dtype, as double (exact for every dtype). */
static inline double na_cpu_get(na_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case NA_DTYPE_F64: return ((const double *)p)[i];
    case NA_DTYPE_F32: return ((const float *)p)[i];
    case NA_DTYPE_F16: return na_f16_bits_to_f32(((const uint16_t *)p)[i]);
    case NA_DTYPE_BF16: return na_bf16_bits_to_f32(((const uint16_t *)p)[i]);
    case NA_DTYPE_I32: return ((const int32_t *)p)[i];
    case NA_DTYPE_U8: return ((const uint8_t *)p)[i];
    case NA_DTYPE_F8E4M3: return na_e4m3_bits_to_f32(((const uint8_t *)p)[i]);
    case NA_DTYPE_F8E5M2: return na_e5m2_bits_to_f32(((const uint8_t *)p)[i]);
    default: return NAN;
    }
}

/* Store v into element i; f16/bf16/FP8 go through f32 (as c10::Half(double) does). */
static inline void na_cpu_set(na_dtype dt, void *p, int64_t i, double v) {
    switch (dt) {
    case NA_DTYPE_F64: ((double *)p)[i] = v; break;
    case NA_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case NA_DTYPE_F16: ((uint16_t *)p)[i] = na_f32_to_f16_bits((float)v); break;
    case NA_DTYPE_BF16: ((uint16_t *)p)[i] = na_f32_to_bf16_bits((float)v); break;
    case NA_DTYPE_I32: ((int32_t *)p)[i] = na_cpu_d_to_i32(v); break;
    case NA_DTYPE_U8: ((uint8_t *)p)[i] = na_cpu_d_to_u8(v); break;
    case NA_DTYPE_F8E4M3: ((uint8_t *)p)[i] = na_f32_to_e4m3_bits((float)v); break;
    case NA_DTYPE_F8E5M2: ((uint8_t *)p)[i] = na_f32_to_e5m2_bits((float)v); break;
    default: break;
    }
}

/* ---- whole-array half conversions (cpu_convert.c) -------------------------------------------
 * Bit-identical to the common/half.h functions for every input (NaNs included), using F16C /
 * AVX2 when the CPU has them (chosen at run time). */
void na_cpu_f32_to_f16(uint16_t *dst, const float *src, int64_t n);
void na_cpu_f16_to_f32(float *dst, const uint16_t *src, int64_t n);
void na_cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
void na_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);
/* Whether the instruction paths are in use; test hook: na_cpu_convert_force_soft turns them off. */
bool na_cpu_convert_is_fast(void);
extern bool na_cpu_convert_force_soft;
/* Whether the CPU has AVX-512F/BW/VL (asked once) and the hook below is off: then the array
 * conversions run 16 lanes at a time (cpu_half_simd.h), and the direct convolution's packing,
 * the 2x2 max pool (forward and backward), BatchNorm and na_cpu_sum_any_f read f16/bf16
 * tensors in place, converting in registers, where they otherwise widen them into f32 copies.
 * The same bits either way; test hook:
 * na_cpu_half512_off keeps the AVX2 conversions and the widening copies (on the AVX2 direct
 * convolution too, whose packer otherwise reads f16/bf16 in place). */
bool na_cpu_half512(void);
extern bool na_cpu_half512_off;
/* Whether BatchNorm, the 2x2 max pool (forward and backward) and na_cpu_sum_any_f read and
 * write f16/bf16 in place 8 lanes at a time with AVX2 + F16C (cpu_half_simd.h's na_h8_*),
 * with the bits of the widening path: the CPU has AVX2 and F16C, the AVX-512 loops above are
 * not chosen, na_cpu_use_avx2() (so na_cpu_force_baseline turns them off too),
 * NANOAMP_CPU_HALF_AVX2 is not "off" (read once) and neither hook is set:
 * na_cpu_half_avx2_off turns these loops off, na_cpu_half512_off both these and the AVX-512
 * ones (the widening specification). na_cpu_half_avx2_prefer (tests) takes these loops even
 * where the AVX-512 ones could run, so that an AVX-512 machine tests them too. */
bool na_cpu_half_avx2(void);
extern bool na_cpu_half_avx2_off, na_cpu_half_avx2_prefer;
/* Whether BatchNorm's backward walks memory in its order, a block of channels image by image
 * (cpu_batchnorm.c's bn_*_o), instead of channel by channel, and its training forward takes
 * the 8-lane loops (one channel at a time) for all-f32 operands as for halves: the CPU
 * has AVX2 and F16C and the AVX-512 loops are not chosen (as na_cpu_half_avx2, without its own
 * switch), NANOAMP_CPU_BN_ORDER is not "off" (read once), na_cpu_bn_order_off (tests) and
 * na_cpu_half512_off are not set. The same bits either way. */
bool na_cpu_bn_order(void);
extern bool na_cpu_bn_order_off;

/* dst[0..n) (dtype ddt) = src[0..n) (dtype sdt) through f32, rounded once: float-typed dtypes
 * but f64 (f32 only in or out: i32/u8/FP8 loads too), split over the pool for large n (the
 * same bits at any split). An f32 dst is written directly, an f32 src read in place. */
void na_cpu_convert_f(na_dtype ddt, void *dst, na_dtype sdt, const void *src, int64_t n);

/* ---- contiguous chunk conversion ---------------------------------------------------------
 * na_cpu_load_f(dt, p, off, n, dst)   dst[0..n) = (float) p[off..off+n)
 * na_cpu_view_f(dt, p, off, n, buf)   the f32 values of p[off..off+n): p itself when it is f32,
 *                                     else buf filled by load
 * na_cpu_store_f(dt, p, off, n, src)  p[off..off+n) = src rounded once to dt
 * and the _d forms for double. Float-typed dtypes only (plus i32/u8/FP8 in load/store). */

static inline void na_cpu_load_f(na_dtype dt, const void *p, int64_t off, int64_t n, float *dst) {
    switch (dt) {
    case NA_DTYPE_F32: memcpy(dst, (const float *)p + off, (size_t)n * sizeof(float)); break;
    case NA_DTYPE_F64: {
        const double *s = (const double *)p + off;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
    } break;
    case NA_DTYPE_F16: na_cpu_f16_to_f32(dst, (const uint16_t *)p + off, n); break;
    case NA_DTYPE_BF16: na_cpu_bf16_to_f32(dst, (const uint16_t *)p + off, n); break;
    case NA_DTYPE_I32: {
        const int32_t *s = (const int32_t *)p + off;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
    } break;
    case NA_DTYPE_U8: {
        const uint8_t *s = (const uint8_t *)p + off;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
    } break;
    case NA_DTYPE_F8E4M3:
    case NA_DTYPE_F8E5M2:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)na_cpu_get(dt, p, off + i);
        break;
    default: for (int64_t i = 0; i < n; i++) dst[i] = NAN; break;
    }
}

static inline void na_cpu_load_d(na_dtype dt, const void *p, int64_t off, int64_t n, double *dst) {
    switch (dt) {
    case NA_DTYPE_F64: memcpy(dst, (const double *)p + off, (size_t)n * sizeof(double)); break;
    case NA_DTYPE_F32: {
        const float *s = (const float *)p + off;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
    } break;
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = na_cpu_get(dt, p, off + i);
        break;
    }
}

static inline const float *na_cpu_view_f(na_dtype dt, const void *p, int64_t off, int64_t n,
                                         float *buf) {
    if (dt == NA_DTYPE_F32) return (const float *)p + off;
    na_cpu_load_f(dt, p, off, n, buf);
    return buf;
}

static inline const double *na_cpu_view_d(na_dtype dt, const void *p, int64_t off, int64_t n,
                                          double *buf) {
    if (dt == NA_DTYPE_F64) return (const double *)p + off;
    na_cpu_load_d(dt, p, off, n, buf);
    return buf;
}

static inline void na_cpu_store_f(na_dtype dt, void *p, int64_t off, int64_t n, const float *src) {
    switch (dt) {
    case NA_DTYPE_F32:
        if ((float *)p + off != src) memcpy((float *)p + off, src, (size_t)n * sizeof(float));
        break;
    case NA_DTYPE_F64: {
        double *d = (double *)p + off;
        for (int64_t i = 0; i < n; i++) d[i] = src[i];
    } break;
    case NA_DTYPE_F16: na_cpu_f32_to_f16((uint16_t *)p + off, src, n); break;
    case NA_DTYPE_BF16: na_cpu_f32_to_bf16((uint16_t *)p + off, src, n); break;
    default:
        for (int64_t i = 0; i < n; i++) na_cpu_set(dt, p, off + i, src[i]);
        break;
    }
}

static inline void na_cpu_store_d(na_dtype dt, void *p, int64_t off, int64_t n, const double *src) {
    switch (dt) {
    case NA_DTYPE_F64:
        if ((double *)p + off != src) memcpy((double *)p + off, src, (size_t)n * sizeof(double));
        break;
    case NA_DTYPE_F32: {
        float *d = (float *)p + off;
        for (int64_t i = 0; i < n; i++) d[i] = (float)src[i];
    } break;
    default:
        for (int64_t i = 0; i < n; i++) na_cpu_set(dt, p, off + i, src[i]);
        break;
    }
}

/* Where a kernel writes chunk [off, off+n) of an output: in place when the output is already
 * of the compute type, else the caller's buffer (then na_cpu_store_* rounds it). */
static inline float *na_cpu_out_f(na_dtype dt, void *p, int64_t off, float *buf) {
    return dt == NA_DTYPE_F32 ? (float *)p + off : buf;
}
static inline double *na_cpu_out_d(na_dtype dt, void *p, int64_t off, double *buf) {
    return dt == NA_DTYPE_F64 ? (double *)p + off : buf;
}

/* ---- sums ------------------------------------------------------------------------------- */

/* Pairwise (cascade) sum of x[0..n): error grows with log n, not n. */
float na_cpu_sum_f(const float *x, int64_t n);
double na_cpu_sum_d(const double *x, int64_t n);

/* Pairwise accumulator for a long stream of chunk sums (any chunk count, O(log) memory). */
typedef struct {
    float level[64];
    uint64_t count;
} na_cpu_psum_f;
typedef struct {
    double level[64];
    uint64_t count;
} na_cpu_psum_d;
void na_cpu_psum_add_f(na_cpu_psum_f *s, float v);
float na_cpu_psum_total_f(const na_cpu_psum_f *s);
void na_cpu_psum_add_d(na_cpu_psum_d *s, double v);
double na_cpu_psum_total_d(const na_cpu_psum_d *s);

/* Sum of n elements of any float dtype starting at p[off] (chunked, pairwise), f32 / f64.
 * f16/bf16 are read in place and converted in registers where na_cpu_sum_half_direct(dt)
 * (AVX-512F/BW/VL, na_cpu_half512): the same additions in the same order, so the same bits. */
bool na_cpu_sum_half_direct(na_dtype dt);
float na_cpu_sum_any_f(na_dtype dt, const void *p, int64_t off, int64_t n);
double na_cpu_sum_any_d(na_dtype dt, const void *p, int64_t off, int64_t n);

/* ---- GEMM ------------------------------------------------------------------------------- */

/* Row-major C = alpha * op(A) @ op(B) + beta * C (C not read when beta == 0), one matrix.
 * Uses CBLAS when built with it and the sizes fit its int, else the built-in blocked GEMM.
 * Returns NA_OK or NA_ENOMEM (packing scratch) with the error set. */
int na_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
int na_cpu_dgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                 double *c, int64_t ldc);
/* The built-in cache-blocked GEMM, always compiled (tests call it directly). */
int na_cpu_sgemm_builtin(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc);
int na_cpu_dgemm_builtin(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                         const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                         double *c, int64_t ldc);
/* Test hook: when true, na_cpu_sgemm/dgemm never use CBLAS. */
extern bool na_cpu_gemm_force_builtin;

/* ---- bf16 products on AVX512_BF16 ----------------------------------------------------------
 * vdpbf16ps multiplies bf16 pairs exactly and adds them into f32 lanes: the numerics of a bf16
 * tensor-core GEMM (f32 accumulation, one rounding on store), in another summation order than
 * the widening f32 path, and with denormal inputs and results read and written as zero
 * (DAZ/FTZ, whatever MXCSR says). The widening path stays the specification: it runs on CPUs
 * without the instruction, with NANOAMP_CPU_BF16=off, and while the test hook is set. */
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 9) ||                  \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define NA_CPU_BF16_KERNELS 1 /* the compiler can build them (target attribute) */
#else
#define NA_CPU_BF16_KERNELS 0
#endif
/* Whether bf16 x bf16 products (the GEMM, the direct convolution's three kernels) take the
 * vdpbf16ps kernels: built with them, the CPU has AVX512_BF16, BW and VL (asked once),
 * NANOAMP_CPU_BF16 is not "off" (read once) and the test hook is off (the CUDA parity suite
 * sets it: the GPU is checked against the specification). */
bool na_cpu_bf16_fast(void);
extern bool na_cpu_bf16_force_spec;
/* C (f32) = alpha * op(A) @ op(B) + beta * C (C not read when beta == 0), A and B bf16 bits,
 * on vdpbf16ps; split over the pool like na_cpu_sgemm. Only where na_cpu_bf16_fast(). NA_OK or
 * NA_ENOMEM. */
int na_cpu_bf16gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                    float *c, int64_t ldc);

/* Test hook: when true, max pooling always takes the generic window loop (the 2x2 stride-2
 * path is checked against it). */
extern bool na_cpu_pool_force_generic;

/* Whether the CPU has AVX2 (asked once) and the hook below is off: then BatchNorm's f32 loops
 * and na_cpu_sum_f run their AVX2 builds (the same code under another target, the same bits;
 * GCC on x86-64 only). Test hook: na_cpu_force_baseline keeps the baseline (SSE2) builds, so
 * that the tests can compare the two bit for bit. */
bool na_cpu_use_avx2(void);
extern bool na_cpu_force_baseline;

/* The CPU backend's A/B switches (NANOAMP_CPU_CONV=gemm, NANOAMP_CPU_HALF_AVX2=off, ...):
 * whether environment variable name equals value, read once into *cache (a static _Atomic int
 * of the caller's, starting at -1), so a hot path asks an int, not the environment. */
bool na_cpu_env_is(_Atomic int *cache, const char *name, const char *value);

/* Test hook: when true, SyncBatchNorm's batch_norm_relu_backward_x keeps its chunked loops
 * (the specification) instead of the AVX2 + F16C ones in memory order (cpu_syncbn.c); the
 * environment's NANOAMP_CPU_SYNCBN=off does the same. */
extern bool na_cpu_syncbn_avx2_off;

/* Test hook: elements of scratch one convolution block (images per GEMM) may use. */
extern int64_t na_cpu_conv_block_budget;

/* ---- convolution (cpu_conv.c, cpu_direct_conv.c) ---------------------------------------- */

/* Whether the CPU has AVX-512F (asked once); the direct convolution and the 2x2 max pool use
 * it when so. */
bool na_cpu_has_avx512f(void);
/* Image-range tasks of a convolution: fixed by its size, never by the thread count. */
int64_t na_cpu_conv_tasks(const na_conv_geom *g);
/* Whether the direct convolution runs this forward (or, with backward_data, its data
 * gradient) in f32 compute: the CPU has AVX-512F, or AVX2 + FMA + F16C (na_cpu_direct_avx2),
 * horizontal stride and dilation are 1 (and for the data gradient stride 1, dilation 1,
 * padding < kernel), NANOAMP_CPU_CONV is not "gemm", reproducible mode is off and the test
 * hook below is off. */
bool na_cpu_direct_conv_usable(const na_conv_geom *g, bool backward_data);
/* Whether the direct weight gradient runs: AVX-512F any shape; AVX2 (na_cpu_direct_avx2) the
 * 3x3 shapes of the 8-lane tile, unless the test hook na_cpu_wgrad_avx2_off (im2col + GEMM). */
bool na_cpu_direct_wgrad_usable(const na_conv_geom *g);
extern bool na_cpu_wgrad_avx2_off;
/* Test hook: the AVX2 weight gradient's copies element by element, as before the 8 x 8
 * transposes (na_cpu_dc_transpose_avx2): the same tile, so the same bits. */
extern bool na_cpu_wgrad_avx2_copies_off;
/* Whether the direct forward and data gradient take the AVX2 + FMA tiles
 * (cpu_direct_conv_avx2.c): the CPU has AVX2, FMA and F16C but no AVX-512F, and the test hook
 * na_cpu_direct_avx2_off (which sends those CPUs' convolutions to im2col + GEMM) is off. */
bool na_cpu_direct_avx2(void);
extern bool na_cpu_direct_avx2_off;
/* y = conv(x, w) + bias, or with backward_data gx (as y) from gy (as x), bias NULL. Checked
 * arguments; NA_OK or NA_ENOMEM. */
int na_cpu_direct_conv2d(const na_conv_geom *g, const na_view *x, const na_view *w,
                         const na_view *bias, na_view *y, bool backward_data);
/* gw (c_out x K, f32) = the weight gradient of images [lo, hi) (lo < hi), on the direct path
 * (where na_cpu_direct_wgrad_usable(g) said yes). NA_OK or NA_ENOMEM. */
int na_cpu_direct_conv2d_wgrad_range(const na_conv_geom *g, const na_view *x, const na_view *gy,
                                     int64_t lo, int64_t hi, float *gw);
/* gw = the whole weight gradient, split over the pool by output channels (groups == 1, where
 * na_cpu_direct_wgrad_usable(g)); the GEMM path's image split needs one partial gradient
 * per task, which wide layers cannot afford. NA_OK or NA_ENOMEM. */
int na_cpu_direct_conv2d_wgrad_rows(const na_conv_geom *g, const na_view *x, const na_view *gy,
                                    na_view *gw);
/* Test hook: when true, convolutions always take the im2col + GEMM path. */
extern bool na_cpu_conv_force_gemm;
/* Test hook: when true, the direct convolution writes an f16/bf16 output as f32 planes and
 * converts them (na_cpu_store_f), as before its tiles rounded to the half output in registers;
 * the bits must not change. */
extern bool na_cpu_conv_half_out_off;

/* ---- the specification (cpu_reference.c) ------------------------------------------------
 * Plain loops that define what the gemm and conv2d kernels compute (same arguments, same
 * numerics: f32 accumulation, f64 for f64, one rounding); the fast paths are tested against
 * them. Never on the hot path. */
int na_cpu_ref_gemm(const na_gemm_args *g);
int na_cpu_ref_conv2d(const na_conv_geom *g, const na_view *x, const na_view *w,
                      const na_view *bias, na_view *y);
int na_cpu_ref_conv2d_backward_data(const na_conv_geom *g, const na_view *gy, const na_view *w,
                                    na_view *gx);
int na_cpu_ref_conv2d_backward_weight(const na_conv_geom *g, const na_view *x,
                                      const na_view *gy, na_view *gw);

/* ---- memory and kernels (one group per file) -------------------------------------------- */

void *na_cpu_alloc(size_t bytes);
void na_cpu_free(void *p);
int na_cpu_memcpy(void *dst, const void *src, size_t bytes);
int na_cpu_synchronize(void);

/* na_cpu_<name> for every kernel of NA_BACKEND_KERNELS (kernels/backend.h) */
#define NA_CPU_DECLARE_(kernel, params) int na_cpu_##kernel params;
NA_BACKEND_KERNELS(NA_CPU_DECLARE_, NA_CPU_DECLARE_)
#undef NA_CPU_DECLARE_

#endif
