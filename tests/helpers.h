/* tests/helpers.h — small helpers shared by the foundation suites (Criterion).
 *
 * Tensors from double literals, element checks with a tolerance, a seeded test RNG and
 * reference roundings to f16/bf16. The roundings use kernels/common/half.h, whose conversions
 * tests/test_half.c checks bit for bit against independent exact references; everything else
 * here is plain double arithmetic, never the library's ops.
 *
 *     na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2, 2), 1, 2, 3, 4);
 *     th_expect(na_relu(x), TH_V(1, 2, 3, 4), 4, 0, 0, "relu");
 */
#ifndef NANOAMP_TESTS_HELPERS_H
#define NANOAMP_TESTS_HELPERS_H

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/half.h"
#include "nanoamp/amp.h"
#include "nanoamp/autograd.h"
#include "nanoamp/error.h"
#include "nanoamp/ops.h"
#include "nanoamp/tensor.h"

/* A double array literal: TH_V(1, 2, 3). */
#define TH_V(...) ((const double[]){__VA_ARGS__})
#define TH_N(...) ((int64_t)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)))

/* ---- checking calls ------------------------------------------------------------------ */

static inline na_tensor *th_ok_(na_tensor *t, const char *expr, const char *file, int line) {
    cr_assert_not_null(t, "%s:%d: %s returned NULL: %s", file, line, expr, na_last_error());
    return t;
}
/* The tensor an expression returns, asserting it is not NULL (the message is the library's). */
#define TH_OK(expr) th_ok_((expr), #expr, __FILE__, __LINE__)
/* Asserts a status call returned NA_OK. */
#define TH_RC(expr)                                                                        \
    do {                                                                                   \
        int th_rc_ = (expr);                                                               \
        cr_assert_eq(th_rc_, NA_OK, "%s returned %d: %s", #expr, th_rc_, na_last_error()); \
    } while (0)

/* Asserts the last call failed with `status` and a message containing every needle. */
static inline void th_expect_error(const void *result, int status, const char *what,
                                   const char *const *needles, int n_needles) {
    cr_assert_null(result, "%s: expected failure, got a tensor", what);
    cr_assert_eq(na_last_status(), status, "%s: status %d (%s), expected %d; message: %s", what,
                 na_last_status(), na_status_str(na_last_status()), status, na_last_error());
    for (int i = 0; i < n_needles; i++)
        cr_assert(strstr(na_last_error(), needles[i]) != NULL,
                  "%s: message \"%s\" does not mention \"%s\"", what, na_last_error(), needles[i]);
}
#define TH_EXPECT_ERROR(expr, status, ...)                                                   \
    do {                                                                                   \
        na_clear_error();                                                                  \
        const void *th_r_ = (expr);                                                        \
        static const char *const th_needles_[] = {__VA_ARGS__};                            \
        th_expect_error(th_r_, status, #expr, th_needles_,                                 \
                        (int)(sizeof th_needles_ / sizeof th_needles_[0]));                \
    } while (0)
#define TH_EXPECT_STATUS(expr, status, ...)                                                  \
    do {                                                                                   \
        na_clear_error();                                                                  \
        int th_s_ = (expr);                                                                \
        cr_assert_eq(th_s_, status, "%s returned %d, expected %d (%s)", #expr, th_s_, status, \
                     na_last_error());                                                     \
        static const char *const th_needles_[] = {__VA_ARGS__};                            \
        for (size_t th_i_ = 0; th_i_ < sizeof th_needles_ / sizeof th_needles_[0]; th_i_++) \
            cr_assert(strstr(na_last_error(), th_needles_[th_i_]) != NULL,                 \
                      "%s: message \"%s\" does not mention \"%s\"", #expr, na_last_error(),  \
                      th_needles_[th_i_]);                                                 \
    } while (0)

/* ---- reference roundings ------------------------------------------------------------- */

static inline double th_round_f16(double x) { return na_f16_bits_to_f32(na_f32_to_f16_bits((float)x)); }
static inline double th_round_bf16(double x) {
    return na_bf16_bits_to_f32(na_f32_to_bf16_bits((float)x));
}
static inline double th_round_f32(double x) { return (double)(float)x; }
/* x rounded to dtype dt (through f32 for f16/bf16: exact for the literals the tests use). */
static inline double th_round(na_dtype dt, double x) {
    switch (dt) {
    case NA_DTYPE_F32: return th_round_f32(x);
    case NA_DTYPE_F16: return th_round_f16(x);
    case NA_DTYPE_BF16: return th_round_bf16(x);
    default: return x;
    }
}

/* ---- tensors from doubles ------------------------------------------------------------- */

static inline int64_t th_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* A step tensor of dtype dt holding vals (converted; f16/bf16 rounded to nearest even). */
static inline na_tensor *th_tensor(na_dtype dt, na_device dev, int ndim, const int64_t *shape,
                                   const double *vals) {
    int64_t n = th_numel(ndim, shape);
    void *buf = malloc((size_t)(n ? n : 1) * 8);
    cr_assert_not_null(buf);
    for (int64_t i = 0; i < n; i++) {
        double v = vals[i];
        switch (dt) {
        case NA_DTYPE_F64: ((double *)buf)[i] = v; break;
        case NA_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
        case NA_DTYPE_F16: ((uint16_t *)buf)[i] = na_f32_to_f16_bits((float)v); break;
        case NA_DTYPE_BF16: ((uint16_t *)buf)[i] = na_f32_to_bf16_bits((float)v); break;
        case NA_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
        case NA_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
        default: cr_assert_fail("th_tensor: bad dtype %d", (int)dt);
        }
    }
    na_tensor *t = na_from_host(dt, dev, ndim, shape, buf);
    free(buf);
    cr_assert_not_null(t, "th_tensor: na_from_host failed: %s", na_last_error());
    return t;
}
/* TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2, 3), 1, 2, 3, 4, 5, 6) on the CPU. */
#define TH_TENSOR(dt, ndim_shape, ...) th_tensor_cpu_((dt), ndim_shape, TH_V(__VA_ARGS__), TH_N(__VA_ARGS__))
static inline na_tensor *th_tensor_cpu_(na_dtype dt, int ndim, const int64_t *shape,
                                        const double *vals, int64_t n_vals) {
    cr_assert_eq(th_numel(ndim, shape), n_vals, "TH_TENSOR: %" PRId64 " values for %" PRId64
                 " elements", n_vals, th_numel(ndim, shape));
    return th_tensor(dt, NA_DEVICE_CPU, ndim, shape, vals);
}

/* A float CPU leaf that requires grad. */
static inline na_tensor *th_leaf(na_dtype dt, int ndim, const int64_t *shape, const double *vals) {
    na_tensor *t = th_tensor(dt, NA_DEVICE_CPU, ndim, shape, vals);
    TH_RC(na_tensor_set_requires_grad(t, true));
    return t;
}

/* ---- checks ------------------------------------------------------------------------------ */

static inline bool th_close(double got, double want, double atol, double rtol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static inline void th_expect_shape(const na_tensor *t, int ndim, const int64_t *shape,
                                   const char *what) {
    cr_assert_not_null(t, "%s: NULL tensor (%s)", what, na_last_error());
    char buf[NA_DESCRIBE_MAX];
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    cr_assert(same, "%s: shape is %s, expected %d dims", what,
              na_tensor_describe(t, buf, sizeof buf), ndim);
    cr_assert_eq(t->numel, th_numel(ndim, shape), "%s: numel %" PRId64, what, t->numel);
}

/* Every element of t (C order, views allowed) is within atol + rtol*|want| of want[i]. */
static inline void th_expect(const na_tensor *t, const double *want, int64_t n, double atol,
                             double rtol, const char *what) {
    cr_assert_not_null(t, "%s: NULL tensor (%s)", what, na_last_error());
    cr_assert_eq(t->numel, n, "%s: %" PRId64 " elements, expected %" PRId64, what, t->numel, n);
    for (int64_t i = 0; i < n; i++) {
        double got = na_get(t, i);
        cr_assert(th_close(got, want[i], atol, rtol),
                  "%s: element %" PRId64 " is %.17g, expected %.17g (atol %g, rtol %g)", what, i,
                  got, want[i], atol, rtol);
    }
}
#define TH_EXPECT(t, atol, rtol, what, ...) \
    th_expect((t), TH_V(__VA_ARGS__), TH_N(__VA_ARGS__), (atol), (rtol), (what))

/* Exact equality (bitwise for finite values; NaN matches NaN). */
static inline void th_expect_exact(const na_tensor *t, const double *want, int64_t n,
                                   const char *what) {
    th_expect(t, want, n, 0.0, 0.0, what);
}

/* ---- the test RNG -------------------------------------------------------------------- */

/* splitmix64: independent of the library's Philox generator. */
typedef struct {
    uint64_t s;
} th_rng;
static inline uint64_t th_rng_u64(th_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double th_rng_uniform(th_rng *r, double lo, double hi) {
    return lo + (hi - lo) * (double)(th_rng_u64(r) >> 11) * 0x1p-53;
}
static inline int64_t th_rng_int(th_rng *r, int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(th_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* The run's seed: NANOAMP_TEST_SEED if set, else from the clock and pid (printed on failure
 * by the suites that use it, so a failing run can be replayed). */
static inline uint64_t th_run_seed(void) {
    const char *env = getenv("NANOAMP_TEST_SEED");
    if (env && *env) return strtoull(env, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    th_rng r = {(uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                ((uint64_t)getpid() << 32)};
    return th_rng_u64(&r) & 0xFFFFFFFFull; /* short enough to type back in */
}

/* The trace records of the ops run while it is installed:
 *   th_trace_log log = {0}; na_autocast_trace_callback(mode, th_trace_collect, &log); */
typedef struct {
    int n;
    na_amp_trace_record r[256];
} th_trace_log;
static inline void th_trace_collect(const na_amp_trace_record *r, void *ctx) {
    th_trace_log *l = ctx;
    if (l->n < 256) l->r[l->n++] = *r;
}

#endif
