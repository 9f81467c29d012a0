/* tests/test_cpu_kernels.c — the CPU backend's kernels, called directly through na_cpu_backend.
 *
 * Views are built here by hand (stack structs over malloc'ed data, contiguous strides), so
 * these tests do not depend on the front-end. GEMM and convolution are checked against their
 * specification (kernels/cpu/cpu_reference.c): run in f64 for the fixed cases, and in each
 * dtype, within the rounding-error bound of a sum, on random shapes (section "the
 * specification"). Other references are independent loops in double precision (the adjoint
 * loops of pooling, two-pass batch statistics); f16/bf16 results are checked bit for bit
 * against the round-to-nearest-even of the f32 computation on the widened inputs, which is
 * the backend contract.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common/elementwise.h"
#include "common/half.h"
#include "common/optim.h"
#include "common/philox.h"
#include "cpu/cpu_direct_conv.h" /* the AVX2 weight gradient's copies */
#include "cpu/cpu_internal.h"
#include "nanoamp/error.h"
#include "nanoamp/tensor.h" /* NA_SHAPE */
#include "nanoamp/threads.h"

static const na_backend *B = &na_cpu_backend;

/* ---- helpers ------------------------------------------------------------------------------ */

static size_t esize(na_dtype dt) {
    switch (dt) {
    case NA_DTYPE_F64: return 8;
    case NA_DTYPE_F32: case NA_DTYPE_I32: return 4;
    case NA_DTYPE_F16: case NA_DTYPE_BF16: return 2;
    default: return 1;
    }
}

static na_view mk(na_dtype dt, int ndim, const int64_t *shape) {
    na_view t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.device = NA_DEVICE_CPU;
    t.ndim = ndim;
    int64_t n = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = n;
        n *= shape[d];
    }
    t.numel = n;
    t.data = calloc((size_t)(n ? n : 1), esize(dt));
    cr_assert(t.data);
    return t;
}
#define MK(dt, ...) mk(dt, NA_SHAPE(__VA_ARGS__))

static void rm(na_view *t) {
    free(t->data);
    t->data = NULL;
}

static double get(const na_view *t, int64_t i) {
    switch (t->dtype) {
    case NA_DTYPE_F64: return ((double *)t->data)[i];
    case NA_DTYPE_F32: return ((float *)t->data)[i];
    case NA_DTYPE_F16: return na_f16_bits_to_f32(((uint16_t *)t->data)[i]);
    case NA_DTYPE_BF16: return na_bf16_bits_to_f32(((uint16_t *)t->data)[i]);
    case NA_DTYPE_I32: return ((int32_t *)t->data)[i];
    default: return ((uint8_t *)t->data)[i];
    }
}

static void set(na_view *t, int64_t i, double v) {
    switch (t->dtype) {
    case NA_DTYPE_F64: ((double *)t->data)[i] = v; break;
    case NA_DTYPE_F32: ((float *)t->data)[i] = (float)v; break;
    case NA_DTYPE_F16: ((uint16_t *)t->data)[i] = na_f32_to_f16_bits((float)v); break;
    case NA_DTYPE_BF16: ((uint16_t *)t->data)[i] = na_f32_to_bf16_bits((float)v); break;
    case NA_DTYPE_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    default: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    }
}

static uint64_t rng_state = 0x1234567;
static double urand(void) { /* [0, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1p-53;
}
static void fill_rand(na_view *t, double lo, double hi) {
    for (int64_t i = 0; i < t->numel; i++) set(t, i, lo + (hi - lo) * urand());
}

/* |got - want| <= atol + rtol*|want| for each element, NaN only where want is NaN */
static void expect_close_arr(const na_view *t, const double *want, double atol, double rtol,
                             const char *what) {
    for (int64_t i = 0; i < t->numel; i++) {
        double g = get(t, i), w = want[i];
        if (isnan(w)) {
            cr_assert(isnan(g), "%s[%lld]: got %.9g, want NaN", what, (long long)i, g);
            continue;
        }
        cr_assert(fabs(g - w) <= atol + rtol * fabs(w), "%s[%lld]: got %.9g, want %.9g", what,
                  (long long)i, g, w);
    }
}

/* bitwise equality of two tensors of the same dtype */
static void expect_same_bits(const na_view *a, const na_view *b, const char *what) {
    cr_assert_eq(a->dtype, b->dtype);
    cr_assert_eq(a->numel, b->numel);
    size_t es = esize(a->dtype);
    for (int64_t i = 0; i < a->numel; i++)
        cr_assert(!memcmp((char *)a->data + i * es, (char *)b->data + i * es, es),
                  "%s[%lld]: got %.9g, want %.9g", what, (long long)i, get(a, i), get(b, i));
}

/* f32 copy of t (widened values) */
static na_view widened(const na_view *t) {
    na_view w = mk(NA_DTYPE_F32, t->ndim, t->shape);
    for (int64_t i = 0; i < t->numel; i++) set(&w, i, get(t, i));
    return w;
}

/* t rounded (RNE) from an f32 tensor */
static na_view rounded(na_dtype dt, const na_view *f) {
    na_view r = mk(dt, f->ndim, f->shape);
    for (int64_t i = 0; i < f->numel; i++) set(&r, i, get(f, i));
    return r;
}

/* ---- the table ---------------------------------------------------------------------------- */

/* Every kernel of the list is in the CPU table: the reference backend is complete, optional
 * kernels included. */
Test(cpu_backend, table_has_every_listed_kernel) {
#define EXPECT_KERNEL_(kernel, params) cr_assert_not_null(B->kernel, "cpu lacks " #kernel);
    NA_BACKEND_KERNELS(EXPECT_KERNEL_, EXPECT_KERNEL_)
#undef EXPECT_KERNEL_
    cr_assert_str_eq(B->name, "cpu");
}

/* An optional kernel a backend leaves NULL is reported by name, not called. */
Test(cpu_backend, missing_optional_kernel_is_named) {
    na_backend partial = na_cpu_backend;
    cr_assert_eq(NA_BACKEND_NEED(&partial, sgd_step), NA_OK);
    partial.sgd_step = NULL;
    na_clear_error();
    cr_assert_eq(NA_BACKEND_NEED(&partial, sgd_step), NA_ENOTSUP);
    cr_assert(strstr(na_last_error(), "sgd_step is not implemented on cpu"), "%s",
              na_last_error());
}

/* The optimizer kernels read the learning rate from t->lr (f64 0-dim) when given: a replayed
 * CUDA graph's way to see each step's value. */
/* The A/B switches read their variable once: the value that matched, only an exact match, and
 * the first answer kept after the environment changes. */
Test(cpu_backend, env_switch_reads_once_and_matches_exactly) {
    _Atomic int on = -1, other = -1, unset = -1;
    setenv("NANOAMP_TEST_SWITCH", "off", 1);
    cr_expect(na_cpu_env_is(&on, "NANOAMP_TEST_SWITCH", "off"));
    cr_expect(!na_cpu_env_is(&other, "NANOAMP_TEST_SWITCH", "of"), "a prefix is not a match");
    unsetenv("NANOAMP_TEST_SWITCH");
    cr_expect(na_cpu_env_is(&on, "NANOAMP_TEST_SWITCH", "off"), "read once: the answer stays");
    cr_expect(!na_cpu_env_is(&unset, "NANOAMP_TEST_SWITCH", "off"), "unset is not a match");
    setenv("NANOAMP_TEST_SWITCH", "off", 1);
    cr_expect(!na_cpu_env_is(&unset, "NANOAMP_TEST_SWITCH", "off"), "read once: stays false");
    unsetenv("NANOAMP_TEST_SWITCH");
}

Test(cpu_backend, optim_reads_the_learning_rate_from_a_device_scalar) {
    float p[2] = {1, 2}, g[2] = {1, 1}, step = 0;
    double lr = 0.25;
    na_view vp = {.data = p, .dtype = NA_DTYPE_F32, .ndim = 1, .shape = {2}, .stride = {1},
                  .numel = 2};
    na_view vg = vp, vs = {.data = &step, .dtype = NA_DTYPE_F32, .numel = 1};
    vg.data = g;
    na_view vlr = {.data = &lr, .dtype = NA_DTYPE_F64, .numel = 1};
    na_view *ps[] = {&vp}, *ss[] = {&vs};
    const na_view *gs[] = {&vg};
    na_optim_tensors t = {.n = 1, .params = ps, .grads = gs, .steps = ss, .lr = &vlr};
    na_optim_hparams h = {.lr = 0.5};
    cr_assert_eq(B->sgd_step(&t, &h), NA_OK, "%s", na_last_error());
    cr_assert(p[0] == 0.75f && p[1] == 1.75f, "lr from the scalar: %g %g", p[0], p[1]);
    t.lr = NULL;
    cr_assert_eq(B->sgd_step(&t, &h), NA_OK);
    cr_assert(p[0] == 0.25f && p[1] == 1.25f, "lr from h: %g %g", p[0], p[1]);
    vlr.dtype = NA_DTYPE_F32;
    t.lr = &vlr;
    cr_assert_eq(B->sgd_step(&t, &h), NA_EDTYPE);
    cr_assert(strstr(na_last_error(), "lr must be an f64 scalar"), "%s", na_last_error());
}

/* The optimizer steps over several tensors, large and small, f32 and f16 gradients, with a
 * loss scale: every element is the rule of common/optim.h applied once per step, bit for bit,
 * at any thread count (a chunk skipped or repeated, or a tensor's state mixed with another's,
 * would show). */
Test(cpu_backend, optim_steps_apply_the_element_rule_to_every_element) {
    enum { NT = 3 };
    const int64_t sizes[NT] = {150001, 3, 70000};
    for (int adam = 0; adam <= 1; adam++)
        for (int threads = 1; threads <= 4; threads *= 2) {
            cr_assert_eq(na_set_num_threads(threads), NA_OK);
            na_view p[NT], g[NT], m[NT], v[NT], vm[NT], st[NT];
            na_view *ps[NT], *ms[NT], *vs[NT], *vms[NT], *ss[NT];
            const na_view *gs[NT];
            float steps[NT] = {0}, inv_scale = 0.5f;
            float *ref[NT], *mref[NT], *vref[NT], *vmref[NT];
            na_optim_hparams h = {.lr = 0.01, .weight_decay = 0.1, .momentum = 0.9,
                                  .nesterov = true, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                  .amsgrad = true};
            for (int i = 0; i < NT; i++) {
                int64_t n = sizes[i];
                p[i] = mk(NA_DTYPE_F32, 1, &n);
                g[i] = mk(i == 1 ? NA_DTYPE_F16 : NA_DTYPE_F32, 1, &n);
                m[i] = mk(NA_DTYPE_F32, 1, &n);
                v[i] = mk(NA_DTYPE_F32, 1, &n);
                vm[i] = mk(NA_DTYPE_F32, 1, &n);
                st[i] = (na_view){.data = &steps[i], .dtype = NA_DTYPE_F32, .numel = 1};
                ref[i] = malloc((size_t)n * sizeof(float));
                mref[i] = calloc((size_t)n, sizeof(float));
                vref[i] = calloc((size_t)n, sizeof(float));
                vmref[i] = calloc((size_t)n, sizeof(float));
                for (int64_t k = 0; k < n; k++) {
                    set(&p[i], k, sin(0.001 * (double)k + i));
                    set(&g[i], k, cos(0.0007 * (double)k * (i + 1)));
                    ref[i][k] = (float)get(&p[i], k);
                }
                ps[i] = &p[i], gs[i] = &g[i], ms[i] = &m[i], vs[i] = &v[i], vms[i] = &vm[i];
                ss[i] = &st[i];
            }
            na_view vinv = {.data = &inv_scale, .dtype = NA_DTYPE_F32, .numel = 1};
            na_optim_tensors t = {.n = NT, .params = ps, .grads = gs, .steps = ss, .exp_avg = ms,
                                  .exp_avg_sq = adam ? vs : NULL,
                                  .max_exp_avg_sq = adam ? vms : NULL, .inv_scale = &vinv};
            for (int step = 1; step <= 2; step++) {
                cr_assert_eq(adam ? B->adam_step(&t, &h) : B->sgd_step(&t, &h), NA_OK, "%s",
                             na_last_error());
                na_optim_scalars sc = na_optim_prepare(&h, (float)step);
                for (int i = 0; i < NT; i++)
                    for (int64_t k = 0; k < sizes[i]; k++) {
                        float gk = (float)get(&g[i], k) * inv_scale;
                        ref[i][k] = adam ? na_adam_elem(ref[i][k], gk, &mref[i][k], &vref[i][k],
                                                        &vmref[i][k], &sc)
                                         : na_sgd_elem(ref[i][k], gk, &mref[i][k], &sc);
                    }
            }
            for (int i = 0; i < NT; i++) {
                cr_assert_eq(steps[i], 2.0f);
                for (int64_t k = 0; k < sizes[i]; k++)
                    cr_assert(((float *)p[i].data)[k] == ref[i][k],
                              "%s, %d threads: tensor %d element %lld: %.9g, the rule %.9g",
                              adam ? "adam" : "sgd", threads, i, (long long)k,
                              ((float *)p[i].data)[k], ref[i][k]);
                free(p[i].data), free(g[i].data), free(m[i].data), free(v[i].data);
                free(vm[i].data), free(ref[i]), free(mref[i]), free(vref[i]), free(vmref[i]);
            }
        }
    na_set_num_threads(1);
}

/* ---- memory ------------------------------------------------------------------------------- */

Test(cpu_memory, alloc_copy_free) {
    uint8_t *p = B->alloc(100);
    cr_assert(p);
    cr_assert_eq((uintptr_t)p % 64, 0);
    uint8_t src[100];
    for (int i = 0; i < 100; i++) src[i] = (uint8_t)i;
    cr_assert_eq(B->memcpy_h2d(p, src, 100), NA_OK);
    uint8_t *q = B->alloc(100);
    cr_assert_eq(B->memcpy_d2d(q, p, 100), NA_OK);
    uint8_t back[100];
    cr_assert_eq(B->memcpy_d2h(back, q, 100), NA_OK);
    cr_assert(!memcmp(back, src, 100));
    cr_assert_eq(B->synchronize(), NA_OK);
    B->free(p);
    B->free(q);
    void *z = B->alloc(0);
    cr_assert(z);
    B->free(z);
}

Test(cpu_memory, alloc_failure_sets_error) {
    na_clear_error();
    cr_assert_null(B->alloc(SIZE_MAX - 8));
    cr_assert_eq(na_last_status(), NA_ENOMEM);
    cr_assert(strstr(na_last_error(), "cpu_alloc"), "%s", na_last_error());
}

/* ---- fills -------------------------------------------------------------------------------- */

Test(cpu_fill, fill_and_arange_all_dtypes) {
    na_dtype dts[] = {NA_DTYPE_F64, NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16, NA_DTYPE_I32,
                      NA_DTYPE_U8};
    for (int k = 0; k < 6; k++) {
        na_view t = MK(dts[k], 3, 5);
        cr_assert_eq(B->fill(&t, 7.0), NA_OK);
        for (int i = 0; i < 15; i++) cr_assert_eq(get(&t, i), 7.0);
        cr_assert_eq(B->arange(&t, 2.0, 3.0), NA_OK);
        for (int i = 0; i < 15; i++) cr_assert_eq(get(&t, i), 2.0 + 3.0 * i);
        rm(&t);
    }
    na_view h = MK(NA_DTYPE_F16, 1);
    B->fill(&h, 0.1);
    cr_assert_eq(((uint16_t *)h.data)[0], na_f32_to_f16_bits(0.1f));
    rm(&h);
}

Test(cpu_fill, uniform_normal_reproducible) {
    na_view a = MK(NA_DTYPE_F32, 10001), b = MK(NA_DTYPE_F32, 10001), c = MK(NA_DTYPE_F32, 10001);
    cr_assert_eq(B->fill_uniform(&a, -2.0, 3.0, 42, 7), NA_OK);
    B->fill_uniform(&b, -2.0, 3.0, 42, 7);
    B->fill_uniform(&c, -2.0, 3.0, 42, 8);
    expect_same_bits(&a, &b, "uniform");
    int differ = 0;
    double mean = 0;
    for (int i = 0; i < 10001; i++) {
        double v = get(&a, i);
        cr_assert(v >= -2.0 && v < 3.0);
        cr_assert_eq((float)v, -2.0f + 5.0f * na_philox_uniform(42, 7, (uint64_t)i));
        differ += get(&a, i) != get(&c, i);
        mean += v / 10001;
    }
    cr_assert_gt(differ, 9900);
    cr_assert(fabs(mean - 0.5) < 0.05, "mean %g", mean);

    /* f16 uniform is the RNE of the f32 value (but below hi); f64 uses the same draws */
    na_view h = MK(NA_DTYPE_F16, 10001), d = MK(NA_DTYPE_F64, 10001);
    B->fill_uniform(&h, -2.0, 3.0, 42, 7);
    B->fill_uniform(&d, -2.0, 3.0, 42, 7);
    for (int i = 0; i < 10001; i++) {
        uint16_t want = na_f32_to_f16_bits((float)get(&a, i));
        if (na_f16_bits_to_f32(want) >= 3.0) want--; /* rounded up to hi: the value below */
        cr_assert_eq(((uint16_t *)h.data)[i], want);
        cr_assert(fabs(get(&d, i) - get(&a, i)) < 1e-6);
    }

    /* [lo, hi) holds after rounding: f16/bf16 round draws near 1 up to 1.0 unless handled,
     * and in f32 1 + (1 - 2^-24) rounds to 2 */
    na_view h16 = MK(NA_DTYPE_F16, 1 << 16), hb = MK(NA_DTYPE_BF16, 1 << 16),
              f2 = MK(NA_DTYPE_F32, 1 << 16);
    B->fill_uniform(&h16, 0.0, 1.0, 5, 0);
    B->fill_uniform(&hb, 0.0, 1.0, 5, 0);
    B->fill_uniform(&f2, 1.0, 2.0, 5, 0);
    int top16 = 0, topb = 0;
    for (int i = 0; i < 1 << 16; i++) {
        cr_assert(get(&h16, i) >= 0 && get(&h16, i) < 1, "f16 %d: %g", i, get(&h16, i));
        cr_assert(get(&hb, i) >= 0 && get(&hb, i) < 1, "bf16 %d: %g", i, get(&hb, i));
        cr_assert(get(&f2, i) >= 1 && get(&f2, i) < 2, "f32 %d: %.9g", i, get(&f2, i));
        top16 += get(&h16, i) == 1 - 0x1p-11;
        topb += get(&hb, i) == 1 - 0x1p-8;
    }
    cr_assert_gt(top16, 0);
    cr_assert_gt(topb, 0);
    rm(&h16); rm(&hb); rm(&f2);

    B->fill_normal(&a, 1.0, 2.0, 9, 0);
    B->fill_normal(&b, 1.0, 2.0, 9, 0);
    expect_same_bits(&a, &b, "normal");
    double m = 0, v = 0;
    for (int i = 0; i < 10001; i++) m += get(&a, i) / 10001;
    for (int i = 0; i < 10001; i++) v += (get(&a, i) - m) * (get(&a, i) - m) / 10000;
    cr_assert(fabs(m - 1.0) < 0.1 && fabs(sqrt(v) - 2.0) < 0.1, "mean %g std %g", m, sqrt(v));
    cr_assert_eq((float)get(&a, 5), 1.0f + 2.0f * na_philox_normal(9, 0, 5));
    rm(&a); rm(&b); rm(&c); rm(&h); rm(&d);
}

Test(cpu_fill, dropout_mask) {
    na_view m = MK(NA_DTYPE_F32, 20000);
    cr_assert_eq(B->dropout_mask(&m, 0.25, 3, 11), NA_OK);
    int zeros = 0;
    for (int i = 0; i < 20000; i++) {
        double v = get(&m, i);
        bool keep = (double)na_philox_uniform(3, 11, (uint64_t)i) >= 0.25;
        cr_assert_eq(v, keep ? (float)(1.0 / 0.75) : 0.0);
        zeros += v == 0;
    }
    cr_assert(fabs(zeros / 20000.0 - 0.25) < 0.02);
    na_view h = MK(NA_DTYPE_BF16, 100);
    B->dropout_mask(&h, 0.5, 3, 11);
    for (int i = 0; i < 100; i++) cr_assert(get(&h, i) == 0 || get(&h, i) == 2.0);
    rm(&m);
    rm(&h);
}

Test(cpu_fill, random_fill_rejects_int) {
    na_view t = MK(NA_DTYPE_I32, 4);
    cr_assert_eq(B->fill_uniform(&t, 0, 1, 1, 1), NA_EDTYPE);
    cr_assert(strstr(na_last_error(), "cpu_fill_uniform"));
    rm(&t);
}

/* ---- copy --------------------------------------------------------------------------------- */

Test(cpu_copy, transposed_strided_source) {
    na_view a = MK(NA_DTYPE_F32, 3, 4); /* viewed as its transpose [4, 3] */
    for (int i = 0; i < 12; i++) set(&a, i, i);
    na_view v = a;
    v.shape[0] = 4; v.shape[1] = 3;
    v.stride[0] = 1; v.stride[1] = 4;
    na_view d = MK(NA_DTYPE_F32, 4, 3), h = MK(NA_DTYPE_F16, 4, 3), w = MK(NA_DTYPE_F64, 4, 3);
    cr_assert_eq(B->copy(&d, &v), NA_OK);
    cr_assert_eq(B->copy(&h, &v), NA_OK);
    cr_assert_eq(B->copy(&w, &v), NA_OK);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++) {
            cr_assert_eq(get(&d, r * 3 + c), c * 4 + r);
            cr_assert_eq(get(&h, r * 3 + c), c * 4 + r);
            cr_assert_eq(get(&w, r * 3 + c), c * 4 + r);
        }
    /* a 3-d permuted view with a broadcast (stride 0) dim */
    na_view b = MK(NA_DTYPE_F32, 2, 3);
    for (int i = 0; i < 6; i++) set(&b, i, i + 1);
    na_view bv = b;
    bv.ndim = 3;
    bv.shape[0] = 3; bv.shape[1] = 4; bv.shape[2] = 2;
    bv.stride[0] = 1; bv.stride[1] = 0; bv.stride[2] = 3;
    bv.numel = 24;
    na_view out = MK(NA_DTYPE_F32, 3, 4, 2);
    cr_assert_eq(B->copy(&out, &bv), NA_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) cr_assert_eq(get(&out, (i * 4 + j) * 2 + k), k * 3 + i + 1);
    rm(&a); rm(&d); rm(&h); rm(&w); rm(&b); rm(&out);
}

/* A cast large enough to be split over the pool (na_cpu_convert_f) gives every element the
 * bits of half.h at 1, 2 and 3 threads: random f32 bit patterns (NaNs, subnormals, infinities
 * among them) to f16 and bf16, and those back to f32 and across (f16 -> bf16). */
Test(cpu_copy, conversions_over_the_pool_as_half_h) {
    int64_t n = 300007; /* several tasks, and a ragged end */
    na_view f = MK(NA_DTYPE_F32, n), h = MK(NA_DTYPE_F16, n), b = MK(NA_DTYPE_BF16, n),
            back = MK(NA_DTYPE_F32, n), hb = MK(NA_DTYPE_BF16, n);
    uint32_t *u = f.data;
    for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)(urand() * 4294967296.0);
    for (int threads = 1; threads <= 3; threads++) {
        cr_assert_eq(na_set_num_threads(threads), NA_OK);
        memset(h.data, 0, (size_t)n * 2), memset(b.data, 0, (size_t)n * 2);
        cr_assert_eq(B->copy(&h, &f), NA_OK);
        cr_assert_eq(B->copy(&b, &f), NA_OK);
        cr_assert_eq(B->copy(&hb, &h), NA_OK);
        for (int64_t i = 0; i < n; i++) {
            float v = ((float *)f.data)[i];
            uint16_t hv = na_f32_to_f16_bits(v);
            cr_assert_eq(((uint16_t *)h.data)[i], hv, "f16 %lld, %d threads", (long long)i,
                         threads);
            cr_assert_eq(((uint16_t *)b.data)[i], na_f32_to_bf16_bits(v), "bf16 %lld",
                         (long long)i);
            cr_assert_eq(((uint16_t *)hb.data)[i], na_f32_to_bf16_bits(na_f16_bits_to_f32(hv)),
                         "f16 -> bf16 %lld", (long long)i);
        }
        cr_assert_eq(B->copy(&back, &h), NA_OK);
        for (int64_t i = 0; i < n; i++) {
            float want = na_f16_bits_to_f32(((uint16_t *)h.data)[i]);
            cr_assert(!memcmp((float *)back.data + i, &want, 4), "f16 -> f32 %lld", (long long)i);
        }
    }
    na_set_num_threads(1);
    rm(&f), rm(&h), rm(&b), rm(&back), rm(&hb);
}

Test(cpu_copy, conversions_round_to_nearest_even) {
    int n = 4096;
    na_view f = MK(NA_DTYPE_F32, n), h = MK(NA_DTYPE_F16, n), b = MK(NA_DTYPE_BF16, n),
              back = MK(NA_DTYPE_F32, n);
    for (int i = 0; i < n; i++) ((float *)f.data)[i] = (float)((urand() - 0.5) * 1e5 * urand());
    ((float *)f.data)[0] = 1.0f + 0x1p-11f; /* a tie: rounds to even (1.0) */
    ((float *)f.data)[1] = 1.0f + 3 * 0x1p-11f; /* a tie: rounds to even (1 + 2^-9) */
    ((float *)f.data)[2] = 70000.0f;            /* overflow: inf */
    ((float *)f.data)[3] = NAN;
    cr_assert_eq(B->copy(&h, &f), NA_OK);
    cr_assert_eq(B->copy(&b, &f), NA_OK);
    for (int i = 0; i < n; i++) {
        float v = ((float *)f.data)[i];
        cr_assert_eq(((uint16_t *)h.data)[i], na_f32_to_f16_bits(v), "f16 %d", i);
        cr_assert_eq(((uint16_t *)b.data)[i], na_f32_to_bf16_bits(v), "bf16 %d", i);
    }
    cr_assert_eq(get(&h, 0), 1.0);
    cr_assert_eq(get(&h, 1), 1.0 + 0x1p-9);
    cr_assert(isinf(get(&h, 2)));
    cr_assert(isnan(get(&h, 3)));
    cr_assert_eq(B->copy(&back, &h), NA_OK);
    for (int i = 0; i < n; i++) {
        if (isnan(get(&h, i))) cr_assert(isnan(get(&back, i)));
        else cr_assert_eq(get(&back, i), get(&h, i));
    }

    /* integers */
    na_view i32 = MK(NA_DTYPE_I32, 5), u8 = MK(NA_DTYPE_U8, 5), fl = MK(NA_DTYPE_F32, 5),
              d = MK(NA_DTYPE_F64, 5);
    int32_t iv[5] = {-3, 0, 7, 255, 16777217};
    memcpy(i32.data, iv, sizeof iv);
    cr_assert_eq(B->copy(&d, &i32), NA_OK);
    for (int i = 0; i < 5; i++) cr_assert_eq(get(&d, i), iv[i]);
    cr_assert_eq(B->copy(&fl, &i32), NA_OK);
    cr_assert_eq(get(&fl, 4), (double)(float)16777217);
    uint8_t uv[5] = {0, 1, 128, 200, 255};
    memcpy(u8.data, uv, 5);
    cr_assert_eq(B->copy(&fl, &u8), NA_OK);
    for (int i = 0; i < 5; i++) cr_assert_eq(get(&fl, i), uv[i]);
    float fv[5] = {-2.7f, 2.7f, 1e10f, NAN, 254.9f};
    memcpy(fl.data, fv, sizeof fv);
    cr_assert_eq(B->copy(&i32, &fl), NA_OK);
    cr_assert_eq(((int32_t *)i32.data)[0], -2);
    cr_assert_eq(((int32_t *)i32.data)[1], 2);
    cr_assert_eq(((int32_t *)i32.data)[2], INT32_MAX);
    cr_assert_eq(((int32_t *)i32.data)[3], 0);
    cr_assert_eq(B->copy(&u8, &fl), NA_OK);
    cr_assert_eq(((uint8_t *)u8.data)[1], 2);
    cr_assert_eq(((uint8_t *)u8.data)[4], 254);
    rm(&f); rm(&h); rm(&b); rm(&back); rm(&i32); rm(&u8); rm(&fl); rm(&d);
}

/* ---- unary -------------------------------------------------------------------------------- */

/* The want of every unary kernel is the op's own math in double (kernels/common/
 * elementwise_ops.h, one row per op), so a new op needs no case here: that math is checked
 * against hand-computed values (tests/op_cases.c, forward suite) and finite differences
 * (gradcheck); this file checks the loops around it (dtypes, rounding, chunks). */
static double ref_unary(int op, double x, double a, double b) { return na_unary_d(op, x, a, b); }
static double ref_grad(int op, double x, double a, double b) {
    return na_unary_grad_d(op, x, na_unary_d(op, x, a, b), a, b);
}

static void run_unary_case(na_dtype dt, double atol, double rtol) {
    const int n = 3000; /* > one chunk */
    for (int op = 0; op < NA_UNARY_COUNT; op++) {
        double a = op == NA_UNARY_POW ? 2.5 : op == NA_UNARY_CLAMP ? -0.5 : 1.75;
        double b = 0.75;
        bool pos = op == NA_UNARY_LOG || op == NA_UNARY_SQRT || op == NA_UNARY_RSQRT ||
                   op == NA_UNARY_POW;
        na_view x = MK(dt, n), y = MK(dt, n), gy = MK(dt, n), gx = MK(dt, n);
        fill_rand(&x, pos ? 0.1 : -3, 3);
        fill_rand(&gy, -1, 1);
        double *want = malloc(n * sizeof(double)), *gwant = malloc(n * sizeof(double));
        for (int i = 0; i < n; i++) {
            double xv = get(&x, i);
            if (op == NA_UNARY_ABS && xv == 0) set(&x, i, xv = 0.5);
            want[i] = ref_unary(op, xv, a, b);
            gwant[i] = get(&gy, i) * ref_grad(op, xv, a, b);
        }
        cr_assert_eq(B->unary(op, &x, &y, a, b), NA_OK);
        char what[64];
        snprintf(what, sizeof what, "unary %d (%d)", op, (int)dt);
        expect_close_arr(&y, want, atol, rtol, what);
        cr_assert_eq(B->unary_backward(op, &x, &y, &gy, &gx, a, b), NA_OK);
        snprintf(what, sizeof what, "unary grad %d (%d)", op, (int)dt);
        expect_close_arr(&gx, gwant, atol * 4, rtol * 4, what);
        free(want); free(gwant);
        rm(&x); rm(&y); rm(&gy); rm(&gx);
    }
}

Test(cpu_unary, every_op_and_grad_f64) { run_unary_case(NA_DTYPE_F64, 1e-13, 1e-12); }
Test(cpu_unary, every_op_and_grad_f32) { run_unary_case(NA_DTYPE_F32, 1e-6, 1e-5); }

Test(cpu_unary, f16_rounds_once_from_f32) {
    na_dtype dts[] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int k = 0; k < 2; k++)
        for (int op = 0; op < NA_UNARY_COUNT; op++) {
            na_view x = MK(dts[k], 2500), y = MK(dts[k], 2500);
            fill_rand(&x, 0.1, 4);
            na_view xf = widened(&x), yf = MK(NA_DTYPE_F32, 2500);
            cr_assert_eq(B->unary(op, &x, &y, 1.5, 2.0), NA_OK);
            cr_assert_eq(B->unary(op, &xf, &yf, 1.5, 2.0), NA_OK);
            na_view want = rounded(dts[k], &yf);
            expect_same_bits(&y, &want, "f16 unary");
            /* the backward too */
            na_view gy = MK(dts[k], 2500), gx = MK(dts[k], 2500), gyf, gxf = MK(NA_DTYPE_F32, 2500);
            fill_rand(&gy, -1, 1);
            gyf = widened(&gy);
            na_view yw = widened(&y);
            cr_assert_eq(B->unary_backward(op, &x, &y, &gy, &gx, 1.5, 2.0), NA_OK);
            cr_assert_eq(B->unary_backward(op, &xf, &yw, &gyf, &gxf, 1.5, 2.0), NA_OK);
            na_view gwant = rounded(dts[k], &gxf);
            expect_same_bits(&gx, &gwant, "f16 unary grad");
            rm(&x); rm(&y); rm(&xf); rm(&yf); rm(&want); rm(&gy); rm(&gx); rm(&gyf); rm(&gxf);
            rm(&gwant); rm(&yw);
        }
}

Test(cpu_unary, rejects_int_dtype) {
    na_view x = MK(NA_DTYPE_I32, 4), y = MK(NA_DTYPE_I32, 4);
    na_clear_error();
    cr_assert_eq(B->unary(NA_UNARY_EXP, &x, &y, 0, 0), NA_EDTYPE);
    cr_assert(strstr(na_last_error(), "cpu_unary"), "%s", na_last_error());
    cr_assert(strstr(na_last_error(), "i32"), "%s", na_last_error());
    rm(&x); rm(&y);
}

/* ---- binary ------------------------------------------------------------------------------- */

static na_broadcast bc2(int64_t r, int64_t c, int64_t ar, int64_t ac, int64_t br, int64_t bcs) {
    na_broadcast bc = {.ndim = 2, .shape = {r, c}, .a_stride = {ar, ac}, .b_stride = {br, bcs}};
    return bc;
}

Test(cpu_binary, broadcast_row_vector) {
    na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F64, NA_DTYPE_F16};
    for (int k = 0; k < 3; k++) {
        na_view a = MK(dts[k], 2, 3), b = MK(dts[k], 3), o = MK(dts[k], 2, 3);
        for (int i = 0; i < 6; i++) set(&a, i, i + 1);
        for (int i = 0; i < 3; i++) set(&b, i, 10 * (i + 1));
        na_broadcast bc = bc2(2, 3, 3, 1, 0, 1);
        for (int op = 0; op < NA_BINARY_COUNT; op++) {
            cr_assert_eq(B->binary(op, &a, &b, &o, &bc), NA_OK);
            double want[6];
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++) {
                    double x = i * 3 + j + 1, y = 10 * (j + 1);
                    double r = op == NA_BINARY_ADD ? x + y : op == NA_BINARY_SUB ? x - y
                               : op == NA_BINARY_MUL ? x * y : x / y;
                    want[i * 3 + j] = dts[k] == NA_DTYPE_F16 ? na_round_f16((float)r)
                                      : dts[k] == NA_DTYPE_F32 ? (float)r : r;
                }
            expect_close_arr(&o, want, 0, 0, "binary [2,3] op [3]");
        }
        rm(&a); rm(&b); rm(&o);
    }
}

Test(cpu_binary, broadcast_outer_and_long_rows) {
    na_view a = MK(NA_DTYPE_F32, 2, 1), b = MK(NA_DTYPE_F32, 1, 3), o = MK(NA_DTYPE_F32, 2, 3);
    set(&a, 0, 2); set(&a, 1, 3);
    for (int i = 0; i < 3; i++) set(&b, i, i + 1);
    na_broadcast bc = bc2(2, 3, 1, 0, 0, 1);
    cr_assert_eq(B->binary(NA_BINARY_MUL, &a, &b, &o, &bc), NA_OK);
    double want[6] = {2, 4, 6, 3, 6, 9};
    expect_close_arr(&o, want, 0, 0, "[2,1]*[1,3]");
    /* scalar (0-d) op long vector, both orders, > one chunk */
    int n = 5000;
    na_view s = MK(NA_DTYPE_F32, 1), v = MK(NA_DTYPE_F32, n), out = MK(NA_DTYPE_F32, n);
    set(&s, 0, 4);
    fill_rand(&v, -1, 1);
    na_broadcast b1 = {.ndim = 1, .shape = {n}, .a_stride = {1}, .b_stride = {0}};
    cr_assert_eq(B->binary(NA_BINARY_SUB, &v, &s, &out, &b1), NA_OK);
    for (int i = 0; i < n; i++) cr_assert_eq(get(&out, i), (float)(get(&v, i) - 4));
    /* [3, 1, 2] + [1, 4, 2] -> [3, 4, 2] */
    na_view x = MK(NA_DTYPE_F64, 3, 1, 2), y = MK(NA_DTYPE_F64, 1, 4, 2), z = MK(NA_DTYPE_F64, 3, 4, 2);
    fill_rand(&x, -1, 1);
    fill_rand(&y, -1, 1);
    na_broadcast b3 = {.ndim = 3, .shape = {3, 4, 2}, .a_stride = {2, 0, 1}, .b_stride = {0, 2, 1}};
    cr_assert_eq(B->binary(NA_BINARY_ADD, &x, &y, &z, &b3), NA_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++)
                cr_assert_eq(get(&z, (i * 4 + j) * 2 + k), get(&x, i * 2 + k) + get(&y, j * 2 + k));
    rm(&a); rm(&b); rm(&o); rm(&s); rm(&v); rm(&out); rm(&x); rm(&y); rm(&z);
}

/* ---- reductions --------------------------------------------------------------------------- */

Test(cpu_reduce, sum_mean_max_middle_and_last_axis) {
    na_view x = MK(NA_DTYPE_F32, 2, 3, 4);
    fill_rand(&x, -5, 5);
    set(&x, 0 * 12 + 1 * 4 + 2, 100);   /* max of [0, :, 2] at r = 1 */
    set(&x, 0 * 12 + 2 * 4 + 2, 100);   /* a tie later: first one wins */
    na_view o = MK(NA_DTYPE_F32, 2, 4), idx = MK(NA_DTYPE_I32, 2, 4);
    for (int op = 0; op < NA_REDUCE_COUNT; op++) {
        cr_assert_eq(B->reduce(op, &x, &o, &idx, 2, 3, 4), NA_OK);
        for (int a = 0; a < 2; a++)
            for (int i = 0; i < 4; i++) {
                double s = 0, m = -INFINITY;
                int mi = -1;
                for (int j = 0; j < 3; j++) {
                    double v = get(&x, (a * 3 + j) * 4 + i);
                    s += v;
                    if (v > m) { m = v; mi = j; }
                }
                double want = op == NA_REDUCE_SUM ? s : op == NA_REDUCE_MEAN ? s / 3 : m;
                cr_assert(fabs(get(&o, a * 4 + i) - want) < 1e-5, "op %d", op);
                if (op == NA_REDUCE_MAX) cr_assert_eq(get(&idx, a * 4 + i), mi);
            }
    }
    cr_assert_eq(get(&idx, 2), 1);
    /* the last axis (inner == 1) */
    na_view o2 = MK(NA_DTYPE_F32, 6), i2 = MK(NA_DTYPE_I32, 6);
    cr_assert_eq(B->reduce(NA_REDUCE_MAX, &x, &o2, &i2, 6, 4, 1), NA_OK);
    for (int r = 0; r < 6; r++) {
        double m = -INFINITY;
        int mi = 0;
        for (int j = 0; j < 4; j++)
            if (get(&x, r * 4 + j) > m) { m = get(&x, r * 4 + j); mi = j; }
        cr_assert_eq(get(&o2, r), m);
        cr_assert_eq(get(&i2, r), mi);
    }
    cr_assert_eq(B->argmax(&x, &i2, 6, 4, 1), NA_OK);
    cr_assert_eq(get(&i2, 1), 2); /* x[6] = 100 */
    cr_assert_eq(B->reduce(NA_REDUCE_MEAN, &x, &o2, NULL, 6, 4, 1), NA_OK);
    for (int r = 0; r < 6; r++) {
        double s = 0;
        for (int j = 0; j < 4; j++) s += get(&x, r * 4 + j);
        cr_assert(fabs(get(&o2, r) - s / 4) < 1e-5);
    }
    rm(&x); rm(&o); rm(&idx); rm(&o2); rm(&i2);
}

/* na_cpu_sum_f's AVX2 build adds in the baseline build's order: the same bits for every
 * length from 0 to 3000 over random signs and magnitudes (on a CPU without AVX2 both runs
 * take the baseline). */
Test(cpu_reduce, sum_avx2_build_gives_the_baseline_bits) {
    enum { N = 3000 };
    float *x = malloc(N * sizeof(float));
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(z >> 33) % 200001 - 100000) * ldexpf(1.0f, (int)(z >> 20 & 15) - 12);
    }
    for (int64_t n = 0; n <= N; n++) {
        na_cpu_force_baseline = true;
        float base = na_cpu_sum_f(x, n);
        na_cpu_force_baseline = false;
        float fast = na_cpu_sum_f(x, n);
        cr_assert(memcmp(&base, &fast, sizeof base) == 0, "n = %lld: %.9g against %.9g",
                  (long long)n, fast, base);
    }
    free(x);
}

Test(cpu_reduce, long_sums_accurate_and_f16_to_f32) {
    int64_t n = 1 << 21;
    na_view x = MK(NA_DTYPE_F32, n), o = MK(NA_DTYPE_F32, 1);
    double want = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = (float)(0.1 + urand());
        ((float *)x.data)[i] = v;
        want += v;
    }
    cr_assert_eq(B->reduce(NA_REDUCE_SUM, &x, &o, NULL, 1, n, 1), NA_OK);
    cr_assert(fabs(get(&o, 0) - want) / want < 1e-6, "got %.9g want %.9g", get(&o, 0), want);
    /* the same down two columns (inner > 1): blocked */
    rm(&o);
    o = MK(NA_DTYPE_F32, 2);
    cr_assert_eq(B->reduce(NA_REDUCE_SUM, &x, &o, NULL, 1, n / 2, 2), NA_OK);
    cr_assert(fabs(get(&o, 0) + get(&o, 1) - want) / want < 1e-6);
    /* f16 input, f32 output, and f64 */
    na_view h = MK(NA_DTYPE_F16, 3000), of = MK(NA_DTYPE_F32, 1), d = MK(NA_DTYPE_F64, 3000),
              od = MK(NA_DTYPE_F64, 1);
    double hs = 0;
    for (int i = 0; i < 3000; i++) {
        set(&h, i, 60.0 * urand());
        hs += get(&h, i);
        set(&d, i, get(&h, i));
    }
    cr_assert_eq(B->reduce(NA_REDUCE_SUM, &h, &of, NULL, 1, 3000, 1), NA_OK);
    cr_assert(fabs(get(&of, 0) - hs) < 1e-6 * hs, "f16 sum %g vs %g", get(&of, 0), hs);
    cr_assert_gt(get(&of, 0), 65504.0); /* would overflow in f16 */
    cr_assert_eq(B->reduce(NA_REDUCE_MEAN, &d, &od, NULL, 1, 3000, 1), NA_OK);
    cr_assert(fabs(get(&od, 0) - hs / 3000) < 1e-12);
    rm(&x); rm(&o); rm(&h); rm(&of); rm(&d); rm(&od);
}

Test(cpu_reduce, max_propagates_nan_and_scatter_grad) {
    na_view x = MK(NA_DTYPE_F32, 2, 4), o = MK(NA_DTYPE_F32, 2), idx = MK(NA_DTYPE_I32, 2);
    float v[8] = {1, NAN, 5, NAN, 3, 3, 2, 1};
    memcpy(x.data, v, sizeof v);
    cr_assert_eq(B->reduce(NA_REDUCE_MAX, &x, &o, &idx, 2, 4, 1), NA_OK);
    cr_assert(isnan(get(&o, 0)));
    cr_assert_eq(get(&idx, 0), 1);
    cr_assert_eq(get(&o, 1), 3);
    cr_assert_eq(get(&idx, 1), 0);
    na_view gy = MK(NA_DTYPE_F32, 2), gx = MK(NA_DTYPE_F32, 2, 4);
    set(&gy, 0, 7); set(&gy, 1, -2);
    fill_rand(&gx, 5, 6); /* must be zeroed by the kernel */
    cr_assert_eq(B->scatter_max_grad(&gy, &idx, &gx, 2, 4, 1), NA_OK);
    double want[8] = {0, 7, 0, 0, -2, 0, 0, 0};
    expect_close_arr(&gx, want, 0, 0, "scatter_max_grad");
    rm(&x); rm(&o); rm(&idx); rm(&gy); rm(&gx);
}

/* ---- softmax ------------------------------------------------------------------------------ */

Test(cpu_softmax, rows_sum_to_one_and_backward) {
    int rows = 5, cols = 1300;
    na_view x = MK(NA_DTYPE_F32, rows, cols), y = MK(NA_DTYPE_F32, rows, cols),
              ly = MK(NA_DTYPE_F32, rows, cols);
    fill_rand(&x, -8, 8);
    set(&x, 3, 80); /* large values: the max shift matters */
    cr_assert_eq(B->softmax(&x, &y, rows, cols, false), NA_OK);
    cr_assert_eq(B->softmax(&x, &ly, rows, cols, true), NA_OK);
    for (int r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0, sy = 0, sl = 0;
        for (int c = 0; c < cols; c++) m = fmax(m, get(&x, r * cols + c));
        for (int c = 0; c < cols; c++) s += exp(get(&x, r * cols + c) - m);
        for (int c = 0; c < cols; c++) {
            int64_t i = r * cols + c;
            double p = exp(get(&x, i) - m) / s;
            cr_assert(fabs(get(&y, i) - p) < 1e-6 + 1e-5 * p);
            cr_assert(fabs(get(&ly, i) - log(p)) < 1e-5 * fmax(1, fabs(log(p))));
            sy += get(&y, i);
            sl += exp(get(&ly, i));
        }
        cr_assert(fabs(sy - 1) < 1e-5, "row %d sums to %.9g", r, sy);
        cr_assert(fabs(sl - 1) < 1e-5);
    }
    /* backward vs the formula in double */
    na_view gy = MK(NA_DTYPE_F32, rows, cols), gx = MK(NA_DTYPE_F32, rows, cols);
    fill_rand(&gy, -1, 1);
    for (int lg = 0; lg < 2; lg++) {
        na_view *yy = lg ? &ly : &y;
        cr_assert_eq(B->softmax_backward(yy, &gy, &gx, rows, cols, lg), NA_OK);
        for (int r = 0; r < rows; r++) {
            double dot = 0, sg = 0;
            for (int c = 0; c < cols; c++) {
                dot += get(&gy, r * cols + c) * get(yy, r * cols + c);
                sg += get(&gy, r * cols + c);
            }
            for (int c = 0; c < cols; c++) {
                int64_t i = r * cols + c;
                double want = lg ? get(&gy, i) - exp(get(yy, i)) * sg
                                 : get(yy, i) * (get(&gy, i) - dot);
                cr_assert(fabs(get(&gx, i) - want) < 1e-5, "lg %d [%lld] %g vs %g", lg,
                          (long long)i, get(&gx, i), want);
            }
        }
    }
    /* f16 in, f32 out: equals the f32 softmax of the widened input */
    na_view h = MK(NA_DTYPE_F16, rows, cols), hy = MK(NA_DTYPE_F32, rows, cols);
    for (int64_t i = 0; i < x.numel; i++) set(&h, i, get(&x, i));
    na_view hf = widened(&h), hfy = MK(NA_DTYPE_F32, rows, cols);
    cr_assert_eq(B->softmax(&h, &hy, rows, cols, false), NA_OK);
    cr_assert_eq(B->softmax(&hf, &hfy, rows, cols, false), NA_OK);
    expect_same_bits(&hy, &hfy, "softmax f16->f32");
    rm(&x); rm(&y); rm(&ly); rm(&gy); rm(&gx); rm(&h); rm(&hy); rm(&hf); rm(&hfy);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

Test(cpu_cross_entropy, hand_computed_with_and_without_smoothing) {
    /* logits [2, 3] */
    double lv[6] = {1, 2, 3, -1, 0.5, 0};
    int32_t lab[2] = {2, 0};
    na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F64, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int k = 0; k < 4; k++) {
        na_dtype ldt = dts[k] == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
        na_view x = MK(dts[k], 2, 3), y = MK(NA_DTYPE_I32, 2), loss = MK(ldt, 2),
                  lse = MK(ldt, 2), g = MK(ldt, 2), gx = MK(dts[k], 2, 3);
        for (int i = 0; i < 6; i++) set(&x, i, lv[i]);
        memcpy(y.data, lab, sizeof lab);
        set(&g, 0, 1.0); set(&g, 1, 0.5);
        double tol = dts[k] == NA_DTYPE_F64 ? 1e-14 : dts[k] == NA_DTYPE_F32 ? 1e-6
                     : dts[k] == NA_DTYPE_F16 ? 2e-3 : 1.6e-2;
        for (int sm = 0; sm < 2; sm++) {
            double e = sm ? 0.1 : 0.0;
            cr_assert_eq(B->cross_entropy(&x, &y, &loss, &lse, e), NA_OK);
            cr_assert_eq(B->cross_entropy_backward(&x, &y, &lse, &g, &gx, e), NA_OK);
            for (int r = 0; r < 2; r++) {
                double m = -INFINITY, s = 0, sx = 0;
                for (int c = 0; c < 3; c++) m = fmax(m, lv[r * 3 + c]);
                for (int c = 0; c < 3; c++) {
                    s += exp(lv[r * 3 + c] - m);
                    sx += lv[r * 3 + c];
                }
                double ls = m + log(s);
                double want = ls - ((1 - e) * lv[r * 3 + lab[r]] + e / 3 * sx);
                cr_assert(fabs(get(&lse, r) - ls) < 1e-6, "lse %g vs %g", get(&lse, r), ls);
                cr_assert(fabs(get(&loss, r) - want) < 1e-6, "dt %d e %g loss %g vs %g",
                          (int)dts[k], e, get(&loss, r), want);
                for (int c = 0; c < 3; c++) {
                    double p = exp(lv[r * 3 + c] - ls);
                    double gw = get(&g, r) * (p - ((1 - e) * (c == lab[r]) + e / 3));
                    cr_assert(fabs(get(&gx, r * 3 + c) - gw) <= tol * fmax(1, fabs(gw)),
                              "dt %d e %g gx %g vs %g", (int)dts[k], e, get(&gx, r * 3 + c), gw);
                }
            }
        }
        rm(&x); rm(&y); rm(&loss); rm(&lse); rm(&g); rm(&gx);
    }
}

Test(cpu_cross_entropy, backward_matches_finite_differences_f64) {
    int n = 3, c = 7;
    na_view x = MK(NA_DTYPE_F64, n, c), y = MK(NA_DTYPE_I32, n), loss = MK(NA_DTYPE_F64, n),
              lse = MK(NA_DTYPE_F64, n), g = MK(NA_DTYPE_F64, n), gx = MK(NA_DTYPE_F64, n, c);
    fill_rand(&x, -3, 3);
    int32_t lab[3] = {0, 6, 3};
    memcpy(y.data, lab, sizeof lab);
    for (int i = 0; i < n; i++) set(&g, i, 1.0);
    B->cross_entropy(&x, &y, &loss, &lse, 0.2);
    B->cross_entropy_backward(&x, &y, &lse, &g, &gx, 0.2);
    for (int i = 0; i < n * c; i++) {
        double keep = get(&x, i), h = 1e-6, lp = 0, lm = 0;
        set(&x, i, keep + h);
        B->cross_entropy(&x, &y, &loss, &lse, 0.2);
        for (int r = 0; r < n; r++) lp += get(&loss, r);
        set(&x, i, keep - h);
        B->cross_entropy(&x, &y, &loss, &lse, 0.2);
        for (int r = 0; r < n; r++) lm += get(&loss, r);
        set(&x, i, keep);
        cr_assert(fabs((lp - lm) / (2 * h) - get(&gx, i)) < 1e-7);
    }
    /* a label out of range: NaN, not a crash */
    lab[1] = 9;
    memcpy(y.data, lab, sizeof lab);
    B->cross_entropy(&x, &y, &loss, &lse, 0.0);
    cr_assert(isnan(get(&loss, 1)) && !isnan(get(&loss, 0)));
    rm(&x); rm(&y); rm(&loss); rm(&lse); rm(&g); rm(&gx);
}

/* ---- gemm --------------------------------------------------------------------------------- */

static void check_gemm(na_dtype dt, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                       int64_t batch, float alpha, float beta, bool bias, bool relu) {
    int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2; /* padded rows */
    int64_t sa = (ta ? k : m) * lda + 5, sb = (tb ? n : k) * ldb, sc = m * ldc + 7;
    na_view a = MK(dt, batch * sa), b = MK(dt, batch * sb), c = MK(dt, batch * sc),
              bi = MK(dt, n);
    fill_rand(&a, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&c, -1, 1);
    fill_rand(&bi, -1, 1);
    /* the want: the specification on f64 copies (the padding of C stays as it was) */
    na_view a64 = rounded(NA_DTYPE_F64, &a), b64 = rounded(NA_DTYPE_F64, &b),
            want = rounded(NA_DTYPE_F64, &c), bi64 = rounded(NA_DTYPE_F64, &bi);
    na_gemm_args g = {.dtype = dt, .a = a.data, .b = b.data, .bias = bias ? bi.data : NULL,
                      .c = c.data, .ta = ta, .tb = tb, .relu = relu, .m = m, .n = n, .k = k,
                      .lda = lda, .ldb = ldb, .ldc = ldc, .batch = batch, .stride_a = sa,
                      .stride_b = sb, .stride_c = sc, .alpha = alpha, .beta = beta};
    cr_assert_eq(B->gemm(&g), NA_OK, "%s", na_last_error());
    na_gemm_args r = g;
    r.dtype = NA_DTYPE_F64, r.a = a64.data, r.b = b64.data, r.c = want.data;
    r.bias = bias ? bi64.data : NULL;
    cr_assert_eq(na_cpu_ref_gemm(&r), NA_OK);
    /* padding between rows and batches is untouched */
    double tol = dt == NA_DTYPE_F64 ? 1e-12 : 1e-5 * sqrt((double)k) + 1e-6;
    char what[96];
    snprintf(what, sizeof what, "gemm dt=%d %lldx%lldx%lld ta=%d tb=%d", (int)dt, (long long)m,
             (long long)n, (long long)k, ta, tb);
    expect_close_arr(&c, want.data, tol, tol, what);
    rm(&a); rm(&b); rm(&c); rm(&bi); rm(&a64); rm(&b64); rm(&want); rm(&bi64);
}

Test(cpu_gemm, all_transposes_batched_bias_relu) {
    for (int t = 0; t < 4; t++) {
        check_gemm(NA_DTYPE_F32, 5, 7, 3, t & 1, t & 2, 1, 1.0f, 0.0f, false, false);
        check_gemm(NA_DTYPE_F32, 13, 9, 21, t & 1, t & 2, 3, 0.5f, 2.0f, true, true);
        check_gemm(NA_DTYPE_F64, 13, 9, 21, t & 1, t & 2, 2, -1.5f, 0.25f, true, false);
    }
    check_gemm(NA_DTYPE_F32, 4, 6, 0, false, false, 1, 1.0f, 0.5f, true, false); /* k = 0 */
}

Test(cpu_gemm, beta_zero_ignores_garbage_in_c) {
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4] = {NAN, INFINITY, NAN, NAN};
    na_gemm_args g = {.dtype = NA_DTYPE_F32, .a = a, .b = b, .c = c, .m = 2, .n = 2, .k = 2,
                      .lda = 2, .ldb = 2, .ldc = 2, .batch = 1, .alpha = 1, .beta = 0};
    cr_assert_eq(B->gemm(&g), NA_OK);
    for (int i = 0; i < 4; i++) cr_assert_eq(c[i], a[i]);
    na_cpu_gemm_force_builtin = true;
    float c2[4] = {NAN, NAN, NAN, NAN};
    g.c = c2;
    cr_assert_eq(B->gemm(&g), NA_OK);
    na_cpu_gemm_force_builtin = false;
    for (int i = 0; i < 4; i++) cr_assert_eq(c2[i], a[i]);
}

Test(cpu_gemm, builtin_vs_reference_odd_and_blocked_sizes) {
    int64_t sizes[][3] = {{37, 53, 29}, {1, 1, 1}, {6, 8, 1}, {7, 17, 300}, {150, 1100, 260}};
    for (int s = 0; s < 5; s++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
            if (s == 4 && t != 0 && t != 3) continue; /* the big one: two combos */
            int64_t lda = ta ? m : k, ldb = tb ? k : n;
            na_view a = MK(NA_DTYPE_F32, m * k), b = MK(NA_DTYPE_F32, k * n),
                      c = MK(NA_DTYPE_F32, m * n), ad = MK(NA_DTYPE_F64, m * k),
                      bd = MK(NA_DTYPE_F64, k * n), cd = MK(NA_DTYPE_F64, m * n);
            fill_rand(&a, -1, 1);
            fill_rand(&b, -1, 1);
            fill_rand(&c, -1, 1);
            for (int64_t i = 0; i < m * k; i++) set(&ad, i, get(&a, i));
            for (int64_t i = 0; i < k * n; i++) set(&bd, i, get(&b, i));
            for (int64_t i = 0; i < m * n; i++) set(&cd, i, get(&c, i));
            na_view want = rounded(NA_DTYPE_F64, &c);
            na_gemm_args r = {.dtype = NA_DTYPE_F64, .a = ad.data, .b = bd.data, .c = want.data,
                              .ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda,
                              .ldb = ldb, .ldc = n, .batch = 1, .alpha = 0.75f, .beta = -0.5f};
            cr_assert_eq(na_cpu_ref_gemm(&r), NA_OK);
            cr_assert_eq(na_cpu_sgemm_builtin(ta, tb, m, n, k, 0.75f, a.data, lda, b.data, ldb,
                                              -0.5f, c.data, n), NA_OK);
            cr_assert_eq(na_cpu_dgemm_builtin(ta, tb, m, n, k, 0.75, ad.data, lda, bd.data, ldb,
                                              -0.5, cd.data, n), NA_OK);
            char what[80];
            snprintf(what, sizeof what, "builtin sgemm %lldx%lldx%lld t%d", (long long)m,
                     (long long)n, (long long)k, t);
            expect_close_arr(&c, want.data, 1e-5 * sqrt((double)k), 1e-5, what);
            expect_close_arr(&cd, want.data, 1e-12, 1e-12, what);
            rm(&a); rm(&b); rm(&c); rm(&ad); rm(&bd); rm(&cd); rm(&want);
        }
}

Test(cpu_gemm, builtin_through_backend) {
    na_cpu_gemm_force_builtin = true;
    for (int t = 0; t < 4; t++) {
        check_gemm(NA_DTYPE_F32, 13, 9, 21, t & 1, t & 2, 3, 0.5f, 2.0f, true, true);
        check_gemm(NA_DTYPE_F64, 8, 11, 5, t & 1, t & 2, 2, 1.0f, 0.0f, false, true);
    }
    na_cpu_gemm_force_builtin = false;
}

/* na_cpu_set_reproducible: the backend's f32 product is the built-in GEMM's, bit for bit, and
 * neither vdpbf16ps nor the direct convolution is taken (both depend on the CPU). */
Test(cpu_gemm, reproducible_mode_takes_the_builtin_kernels) {
    enum { M = 150, N = 300, K = 260 };
    na_view a = MK(NA_DTYPE_F32, M * K), b = MK(NA_DTYPE_F32, K * N), c = MK(NA_DTYPE_F32, M * N),
            want = MK(NA_DTYPE_F32, M * N);
    fill_rand(&a, -1, 1);
    fill_rand(&b, -1, 1);
    cr_assert_eq(na_cpu_sgemm_builtin(false, false, M, N, K, 1.0f, a.data, K, b.data, N, 0.0f,
                                      want.data, N), NA_OK);
    na_gemm_args g = {.dtype = NA_DTYPE_F32, .a = a.data, .b = b.data, .c = c.data, .m = M, .n = N,
                      .k = K, .lda = K, .ldb = N, .ldc = N, .batch = 1, .alpha = 1, .beta = 0};
    cr_assert(!na_cpu_reproducible(), "off by default");
    na_cpu_set_reproducible(true);
    cr_assert_eq(B->gemm(&g), NA_OK);
    bool bf16_fast = na_cpu_bf16_fast();
    na_conv_geom geom = {.h = 28, .w = 28, .kh = 3, .kw = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1,
                         .dh = 1, .dw = 1, .oh = 28, .ow = 28};
    bool direct = na_cpu_direct_conv_usable(&geom, false);
    na_cpu_set_reproducible(false);
    cr_assert(!memcmp(c.data, want.data, sizeof(float) * M * N), "the built-in GEMM's bits");
    cr_assert(!bf16_fast, "bf16 products widen");
    cr_assert(!direct, "convolutions take im2col + GEMM");
    rm(&a); rm(&b); rm(&c); rm(&want);
}

/* f16/bf16: widen, f32 gemm (same backend), f32 bias/relu, one rounding -> bitwise equal
 * (bf16 on its widening path, the specification; vdpbf16ps sums in another order) */
Test(cpu_gemm, half_paths_round_once) {
    na_cpu_bf16_force_spec = true;
    na_dtype dts[] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int q = 0; q < 2; q++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t m = 9, n = 10, k = 33, batch = 2;
            int64_t lda = ta ? m : k, ldb = tb ? k : n;
            na_view a = MK(dts[q], batch, m * k), b = MK(dts[q], batch, k * n),
                      c = MK(dts[q], batch, m * n), bi = MK(dts[q], n);
            fill_rand(&a, -2, 2);
            fill_rand(&b, -2, 2);
            fill_rand(&c, -2, 2);
            fill_rand(&bi, -1, 1);
            na_view af = widened(&a), bf = widened(&b), cf = widened(&c), bif = widened(&bi);
            na_gemm_args g = {.dtype = dts[q], .a = a.data, .b = b.data, .bias = bi.data,
                              .c = c.data, .ta = ta, .tb = tb, .relu = true, .m = m, .n = n,
                              .k = k, .lda = lda, .ldb = ldb, .ldc = n, .batch = batch,
                              .stride_a = m * k, .stride_b = k * n, .stride_c = m * n,
                              .alpha = 1.25f, .beta = 0.5f};
            cr_assert_eq(B->gemm(&g), NA_OK);
            g.dtype = NA_DTYPE_F32;
            g.a = af.data; g.b = bf.data; g.c = cf.data; g.bias = bif.data;
            cr_assert_eq(B->gemm(&g), NA_OK);
            na_view want = rounded(dts[q], &cf);
            expect_same_bits(&c, &want, "half gemm");
            /* and close to the double-precision product */
            rm(&a); rm(&b); rm(&c); rm(&bi); rm(&af); rm(&bf); rm(&cf); rm(&bif); rm(&want);
        }
    na_cpu_bf16_force_spec = false;
}

/* ---- convolution -------------------------------------------------------------------------- */

static na_conv_geom conv_geom(int64_t n, int64_t ci, int64_t h, int64_t w, int64_t co, int k,
                              int s, int p, int d, int groups) {
    na_conv_geom g = {.n = n, .c_in = ci, .h = h, .w = w, .c_out = co, .kh = k, .kw = k,
                      .sh = s, .sw = s, .ph = p, .pw = p, .dh = d, .dw = d, .groups = groups};
    g.oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
    g.ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
    return g;
}

static void check_conv(na_dtype dt, na_conv_geom g, bool bias, double tol) {
    int64_t cg = g.c_in / g.groups;
    na_view x = MK(dt, g.n, g.c_in, g.h, g.w), w = MK(dt, g.c_out, cg, g.kh, g.kw),
              b = MK(dt, g.c_out), y = MK(dt, g.n, g.c_out, g.oh, g.ow),
              gy = MK(dt, g.n, g.c_out, g.oh, g.ow), gx = MK(dt, g.n, g.c_in, g.h, g.w),
              gw = MK(dt, g.c_out, cg, g.kh, g.kw);
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    fill_rand(&gx, 9, 10); /* overwritten */
    fill_rand(&gw, 9, 10);
    /* the want: the specification on f64 copies */
    na_view x64 = rounded(NA_DTYPE_F64, &x), w64 = rounded(NA_DTYPE_F64, &w),
            b64 = rounded(NA_DTYPE_F64, &b), gy64 = rounded(NA_DTYPE_F64, &gy),
            yw = rounded(NA_DTYPE_F64, &y), gxw = rounded(NA_DTYPE_F64, &gx),
            gww = rounded(NA_DTYPE_F64, &gw);
    cr_assert_eq(na_cpu_ref_conv2d(&g, &x64, &w64, bias ? &b64 : NULL, &yw), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &gy64, &w64, &gxw), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &x64, &gy64, &gww), NA_OK);
    cr_assert_eq(B->conv2d(&g, &x, &w, bias ? &b : NULL, &y), NA_OK, "%s", na_last_error());
    cr_assert_eq(B->conv2d_backward_data(&g, &gy, &w, &gx), NA_OK);
    cr_assert_eq(B->conv2d_backward_weight(&g, &x, &gy, &gw), NA_OK);
    char what[128];
    snprintf(what, sizeof what, "conv dt=%d k%dx%d s%d p%d d%d g%d", (int)dt, g.kh, g.kw, g.sh,
             g.ph, g.dh, g.groups);
    expect_close_arr(&y, yw.data, tol, tol, what);
    expect_close_arr(&gx, gxw.data, tol, tol, what);
    expect_close_arr(&gw, gww.data, tol, tol, what);
    rm(&x); rm(&w); rm(&b); rm(&y); rm(&gy); rm(&gx); rm(&gw);
    rm(&x64); rm(&w64); rm(&b64); rm(&gy64); rm(&yw); rm(&gxw); rm(&gww);
}

Test(cpu_conv, versus_reference_in_f64) {
    na_dtype dts[] = {NA_DTYPE_F64, NA_DTYPE_F32};
    for (int k = 0; k < 2; k++) {
        double tol = k ? 2e-5 : 1e-12;
        check_conv(dts[k], conv_geom(2, 4, 9, 8, 6, 3, 2, 1, 2, 2), true, tol); /* s2 p1 d2 g2 */
        check_conv(dts[k], conv_geom(3, 3, 7, 7, 5, 3, 1, 1, 1, 1), true, tol);
        check_conv(dts[k], conv_geom(2, 6, 5, 4, 9, 1, 1, 0, 1, 3), true, tol); /* pointwise */
        check_conv(dts[k], conv_geom(1, 2, 6, 9, 4, 2, 3, 2, 1, 1), false, tol);
        check_conv(dts[k], conv_geom(2, 4, 5, 5, 4, 3, 1, 1, 1, 4), false, tol); /* depthwise */
        check_conv(dts[k], conv_geom(1, 2, 6, 7, 2, 3, 1, 3, 2, 1), true, tol); /* pad > reach */
        na_conv_geom r = {.n = 2, .c_in = 3, .h = 7, .w = 9, .c_out = 2, .kh = 2, .kw = 3,
                          .sh = 1, .sw = 2, .ph = 1, .pw = 2, .dh = 2, .dw = 1, .groups = 1};
        r.oh = (r.h + 2 * r.ph - r.dh * (r.kh - 1) - 1) / r.sh + 1;
        r.ow = (r.w + 2 * r.pw - r.dw * (r.kw - 1) - 1) / r.sw + 1;
        check_conv(dts[k], r, true, tol); /* non-square everything */
    }
    na_cpu_gemm_force_builtin = true;
    check_conv(NA_DTYPE_F32, conv_geom(2, 4, 9, 8, 6, 3, 2, 1, 2, 2), true, 2e-5);
    na_cpu_gemm_force_builtin = false;
    /* several images per block, and a last partial block */
    int64_t keep = na_cpu_conv_block_budget;
    na_cpu_conv_block_budget = 2 * (2 * 9 + 3) * 5 * 4;
    check_conv(NA_DTYPE_F64, conv_geom(5, 4, 9, 8, 6, 3, 2, 1, 2, 2), true, 1e-12);
    na_cpu_conv_block_budget = 1; /* one image per block */
    check_conv(NA_DTYPE_F32, conv_geom(3, 3, 7, 7, 5, 3, 1, 1, 1, 1), true, 2e-5);
    na_cpu_conv_block_budget = keep;
}

Test(cpu_conv, half_rounds_once) {
    na_conv_geom g = conv_geom(2, 4, 8, 8, 6, 3, 1, 1, 1, 2);
    na_dtype dts[] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int q = 0; q < 2; q++) {
        na_view x = MK(dts[q], 2, 4, 8, 8), w = MK(dts[q], 6, 2, 3, 3), b = MK(dts[q], 6),
                  y = MK(dts[q], 2, 6, 8, 8), gy = MK(dts[q], 2, 6, 8, 8),
                  gx = MK(dts[q], 2, 4, 8, 8), gw = MK(dts[q], 6, 2, 3, 3);
        fill_rand(&x, -1, 1);
        fill_rand(&w, -1, 1);
        fill_rand(&b, -1, 1);
        fill_rand(&gy, -1, 1);
        na_view xf = widened(&x), wf = widened(&w), bf = widened(&b), gyf = widened(&gy),
                  yf = MK(NA_DTYPE_F32, 2, 6, 8, 8), gxf = MK(NA_DTYPE_F32, 2, 4, 8, 8),
                  gwf = MK(NA_DTYPE_F32, 6, 2, 3, 3);
        cr_assert_eq(B->conv2d(&g, &x, &w, &b, &y), NA_OK);
        cr_assert_eq(B->conv2d(&g, &xf, &wf, &bf, &yf), NA_OK);
        cr_assert_eq(B->conv2d_backward_data(&g, &gy, &w, &gx), NA_OK);
        cr_assert_eq(B->conv2d_backward_data(&g, &gyf, &wf, &gxf), NA_OK);
        cr_assert_eq(B->conv2d_backward_weight(&g, &x, &gy, &gw), NA_OK);
        cr_assert_eq(B->conv2d_backward_weight(&g, &xf, &gyf, &gwf), NA_OK);
        na_view r1 = rounded(dts[q], &yf), r2 = rounded(dts[q], &gxf), r3 = rounded(dts[q], &gwf);
        expect_same_bits(&y, &r1, "conv half y");
        expect_same_bits(&gx, &r2, "conv half gx");
        expect_same_bits(&gw, &r3, "conv half gw");
        rm(&x); rm(&w); rm(&b); rm(&y); rm(&gy); rm(&gx); rm(&gw); rm(&xf); rm(&wf); rm(&bf);
        rm(&gyf); rm(&yf); rm(&gxf); rm(&gwf); rm(&r1); rm(&r2); rm(&r3);
    }
}

/* ---- the specification ------------------------------------------------------------------
 * The fast paths (OpenBLAS, the blocked GEMM, im2col convolution in blocks of images) against
 * the plain loops of kernels/cpu/cpu_reference.c, in the same dtype, on random shapes. Both
 * sum the same products in the compute type (f32; f64 for f64) in different orders, so each
 * is within k*u*S of the exact sum (S: the sum of the products' magnitudes, k: their count,
 * u: the unit roundoff) and then rounded once to the output dtype. */

static int64_t irand(int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(urand() * (double)(hi - lo + 1));
}

static double unit_roundoff(na_dtype dt) {
    switch (dt) {
    case NA_DTYPE_F64: return 0x1p-53;
    case NA_DTYPE_F16: return 0x1p-11;
    case NA_DTYPE_BF16: return 0x1p-8;
    default: return 0x1p-24;
    }
}

/* |x| elementwise, same dtype */
static na_view absolute(const na_view *t) {
    na_view r = mk(t->dtype, t->ndim, t->shape);
    for (int64_t i = 0; i < t->numel; i++) set(&r, i, fabs(get(t, i)));
    return r;
}

/* fast and ref agree within the bound; mag is S per element (the specification run on the
 * magnitudes), terms the number of products (plus the added bias/beta terms) */
static void expect_within_sum_bound(const na_view *fast, const na_view *ref, const na_view *mag,
                                    int64_t terms, const char *what) {
    double u_acc = fast->dtype == NA_DTYPE_F64 ? 0x1p-53 : 0x1p-24;
    double u_out = unit_roundoff(fast->dtype);
    double tiny = fast->dtype == NA_DTYPE_F16 ? 0x1p-24 : 0; /* f16's smallest subnormal */
    for (int64_t i = 0; i < ref->numel; i++) {
        double f = get(fast, i), r = get(ref, i);
        double tol = 2.1 * (double)terms * u_acc * get(mag, i) + 2.1 * u_out * fabs(r) + tiny;
        cr_assert(fabs(f - r) <= tol, "%s [%lld]: fast %.10g, specification %.10g (bound %.3g)",
                  what, (long long)i, f, r, tol);
    }
}

static const na_dtype float_dtypes[] = {NA_DTYPE_F64, NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};

/* One GEMM case: shapes, transposes, padded leading dimensions, batch strides, alpha, beta
 * (0: C is garbage and must not be read), bias, relu. */
typedef struct {
    na_dtype dt;
    int64_t m, n, k, batch, lda, ldb, ldc, sa, sb, sc;
    bool ta, tb, bias, relu;
    float alpha, beta;
} gemm_case;

/* The backend's gemm, the built-in blocked GEMM and, for bf16 where it is not what the backend
 * runs, the widening path (the bf16 specification, na_cpu_bf16_force_spec) against the
 * specification within the bound of an f32 sum of k + 2 terms; and the backend's bf16 against
 * the widening path within the sum of both bounds (the same exact products, summed in two
 * orders). Returns nothing; asserts. */
static void check_gemm_case(const gemm_case *q) {
    na_dtype dt = q->dt;
    int64_t m = q->m, n = q->n, k = q->k, batch = q->batch;
    na_view a = MK(dt, batch * q->sa), b = MK(dt, batch * q->sb), c = MK(dt, batch * q->sc),
            bi = MK(dt, n);
    fill_rand(&a, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&bi, -1, 1);
    if (q->beta == 0) for (int64_t i = 0; i < c.numel; i++) set(&c, i, NAN);
    else fill_rand(&c, -1, 1);
    na_gemm_args g = {.dtype = dt, .a = a.data, .b = b.data, .bias = q->bias ? bi.data : NULL,
                      .ta = q->ta, .tb = q->tb, .relu = q->relu, .m = m, .n = n, .k = k,
                      .lda = q->lda, .ldb = q->ldb, .ldc = q->ldc, .batch = batch,
                      .stride_a = q->sa, .stride_b = q->sb, .stride_c = q->sc,
                      .alpha = q->alpha, .beta = q->beta};
    /* the specification, and on magnitudes (no relu) the scale of the bound */
    na_view ref = rounded(dt, &c), mag = absolute(&c), aa = absolute(&a), ab = absolute(&b),
            abi = absolute(&bi);
    na_gemm_args r = g;
    r.c = ref.data;
    cr_assert_eq(na_cpu_ref_gemm(&r), NA_OK);
    r = g;
    r.a = aa.data, r.b = ab.data, r.bias = q->bias ? abi.data : NULL, r.c = mag.data;
    r.alpha = fabsf(q->alpha), r.beta = fabsf(q->beta), r.relu = false;
    cr_assert_eq(na_cpu_ref_gemm(&r), NA_OK);
    char what[200];
    bool widening = dt == NA_DTYPE_BF16 && na_cpu_bf16_fast();
    na_view out[3];
    int paths = widening ? 3 : 2;
    for (int path = 0; path < paths; path++) {
        static const char *names[] = {"backend", "built-in", "widening (spec)"};
        na_view fast = rounded(dt, &c);
        g.c = fast.data;
        na_cpu_gemm_force_builtin = path == 1;
        na_cpu_bf16_force_spec = path == 2;
        int rc = B->gemm(&g);
        na_cpu_gemm_force_builtin = na_cpu_bf16_force_spec = false;
        cr_assert_eq(rc, NA_OK, "%s", na_last_error());
        snprintf(what, sizeof what, "%s gemm %s m%lld n%lld k%lld ta%d tb%d batch%lld alpha%g "
                 "beta%g bias%d relu%d", names[path], na_dtype_name(dt), (long long)m,
                 (long long)n, (long long)k, q->ta, q->tb, (long long)batch, q->alpha, q->beta,
                 q->bias, q->relu);
        if (q->beta == 0) /* garbage C outside the outputs stays; NaN == NaN here */
            for (int64_t i = 0; i < c.numel; i++)
                if (isnan(get(&ref, i)))
                    cr_assert(isnan(get(&fast, i)), "%s [%lld] written", what, (long long)i);
        na_view fast_ok = rounded(dt, &fast), ref_ok = rounded(dt, &ref),
                mag_ok = rounded(dt, &mag);
        for (int64_t i = 0; i < c.numel; i++) /* compare the outputs only */
            if (isnan(get(&ref, i))) set(&fast_ok, i, 0), set(&ref_ok, i, 0), set(&mag_ok, i, 0);
        expect_within_sum_bound(&fast_ok, &ref_ok, &mag_ok, k + 2, what);
        out[path] = fast_ok;
        rm(&fast); rm(&ref_ok); rm(&mag_ok);
    }
    if (widening) {
        na_view mag_ok = rounded(dt, &mag);
        for (int64_t i = 0; i < c.numel; i++)
            if (isnan(get(&ref, i))) set(&mag_ok, i, 0);
        snprintf(what, sizeof what, "vdpbf16ps against widening m%lld n%lld k%lld ta%d tb%d",
                 (long long)m, (long long)n, (long long)k, q->ta, q->tb);
        expect_within_sum_bound(&out[0], &out[2], &mag_ok, 2 * (k + 2), what);
        rm(&mag_ok);
    }
    for (int path = 0; path < paths; path++) rm(&out[path]);
    rm(&a); rm(&b); rm(&c); rm(&bi); rm(&ref); rm(&mag); rm(&aa); rm(&ab); rm(&abi);
}

/* A case of shape m x n x k with the padding of leading dimensions and batch strides drawn */
static gemm_case gemm_case_of(na_dtype dt, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                              int64_t batch) {
    gemm_case q = {.dt = dt, .m = m, .n = n, .k = k, .batch = batch, .ta = ta, .tb = tb};
    q.lda = (ta ? m : k) + irand(0, 3), q.ldb = (tb ? k : n) + irand(0, 3);
    q.ldc = n + irand(0, 3);
    q.sa = (ta ? k : m) * q.lda + irand(0, 5), q.sb = (tb ? n : k) * q.ldb + irand(0, 5);
    q.sc = m * q.ldc + irand(0, 5);
    q.alpha = 1.0f, q.beta = 0.0f;
    return q;
}

/* One random GEMM: everything of gemm_case drawn */
static void random_gemm_case(na_dtype dt, bool big) {
    int64_t m = big ? irand(100, 150) : irand(1, 20), n = big ? irand(40, 300) : irand(1, 20);
    int64_t k = big ? irand(250, 520) : irand(0, 40), batch = big ? 1 : irand(1, 3);
    bool ta = urand() < 0.5, tb = urand() < 0.5;
    gemm_case q = gemm_case_of(dt, m, n, k, ta, tb, batch);
    q.bias = urand() < 0.5, q.relu = urand() < 0.3;
    float alphas[] = {1.0f, -0.75f, 0.0f}, betas[] = {0.0f, 1.0f, 0.5f};
    q.alpha = alphas[irand(0, 2)], q.beta = betas[irand(0, 2)];
    if (urand() < 0.5) q.alpha = 1.0f; /* alpha 0 is rare in practice: not too often here */
    check_gemm_case(&q);
}

Test(cpu_reference, gemm_fast_paths_meet_the_specification) {
    for (int t = 0; t < 160; t++) random_gemm_case(float_dtypes[t % 4], false);
    /* across the blocked GEMM's panels (MC 132, KC 256) */
    for (int t = 0; t < 4; t++) random_gemm_case(float_dtypes[t], true);
}

/* bf16 on vdpbf16ps (na_cpu_bf16_fast): the edges of its 12 x 32 tile, its K pairs (odd K)
 * and its blocks (KC 384, MC 192, NC 1024), every transpose, against the specification and
 * the widening path (check_gemm_case). */
Test(cpu_reference, bf16_dot_edges_meet_the_specification) {
    if (!na_cpu_bf16_fast()) cr_skip_test("no AVX512_BF16 (or NANOAMP_CPU_BF16=off)");
    int64_t shapes[][3] = {{1, 1, 1},   {13, 33, 1},  {11, 31, 3},  {12, 32, 2},
                           {25, 65, 385}, {193, 40, 767}, {7, 1030, 9}, {128, 10, 784}};
    for (int s = 0; s < 8; s++)
        for (int t = 0; t < 4; t++) {
            gemm_case q = gemm_case_of(NA_DTYPE_BF16, shapes[s][0], shapes[s][1], shapes[s][2],
                                       t & 1, t & 2, s < 4 ? 2 : 1);
            q.alpha = t == 3 ? -0.75f : 1.0f, q.beta = t == 2 ? 0.5f : 0.0f;
            q.bias = t & 1, q.relu = t == 1;
            check_gemm_case(&q);
        }
}

/* c (1 x 1) = a (1 x 2) @ b (2 x 1) in bf16, on the path the hook selects */
static float bf16_dot2(const float a[2], const float b[2], bool spec) {
    uint16_t ab[2] = {na_f32_to_bf16_bits(a[0]), na_f32_to_bf16_bits(a[1])};
    uint16_t bb[2] = {na_f32_to_bf16_bits(b[0]), na_f32_to_bf16_bits(b[1])}, cb = 0x7fc0;
    na_gemm_args g = {.dtype = NA_DTYPE_BF16, .a = ab, .b = bb, .c = &cb, .m = 1, .n = 1,
                      .k = 2, .lda = 2, .ldb = 1, .ldc = 1, .batch = 1, .alpha = 1, .beta = 0};
    na_cpu_bf16_force_spec = spec;
    int rc = B->gemm(&g);
    na_cpu_bf16_force_spec = false;
    cr_assert_eq(rc, NA_OK, "%s", na_last_error());
    return na_bf16_bits_to_f32(cb);
}

/* vdpbf16ps reads denormal bf16 inputs as zero and flushes denormal f32 results to zero,
 * whatever MXCSR says; the widening path (the GPU's numerics) keeps both. Normal values give
 * the same exact products on both. */
Test(cpu_gemm, bf16_dot_flushes_denormals) {
    if (!na_cpu_bf16_fast()) cr_skip_test("no AVX512_BF16 (or NANOAMP_CPU_BF16=off)");
    float normal_a[2] = {1.5f, 2.0f}, normal_b[2] = {2.0f, 0.25f};
    cr_assert_eq(bf16_dot2(normal_a, normal_b, false), 3.5f);
    cr_assert_eq(bf16_dot2(normal_a, normal_b, true), 3.5f);
    /* a denormal input: 2^-130 x 2^100 = 2^-30, a normal result */
    float den_a[2] = {0x1p-130f, 0.0f}, big_b[2] = {0x1p100f, 0.0f};
    cr_assert_eq(bf16_dot2(den_a, big_b, true), 0x1p-30f);
    cr_assert_eq(bf16_dot2(den_a, big_b, false), 0.0f, "the input was not read as zero");
    /* normal inputs, a denormal result: 2^-64 x 2^-64 = 2^-128 (a bf16 denormal) */
    float tiny[2] = {0x1p-64f, 0.0f};
    cr_assert_eq(bf16_dot2(tiny, tiny, true), 0x1p-128f);
    cr_assert_eq(bf16_dot2(tiny, tiny, false), 0.0f, "the result was not flushed");
}

static void bf16_env_off(void) { setenv("NANOAMP_CPU_BF16", "off", 1); }

/* ---- the direct convolution's border (cpu_direct_conv.c) ------------------------------------
 * Small maps, where most output pixels have taps over the padding: 1x1 to 8x8, vertical stride
 * 1 and 2 (the direct path's; horizontal stride 2 takes the GEMM path), padding 0 and 1, odd
 * channel counts (37 outputs: several 8-channel blocks and a short one; 70: the weight gradient
 * split by output channels too), batch 1 and 3, f32, bf16 and f16; the
 * forward, data gradient and weight gradient as shipped against the specification
 * (cpu_reference.c). f32: the direct path sums in f32, so each output is within
 * expect_within_sum_bound's 2.1 K 2^-24 S + 2.1 2^-24 |y| of the specification (S the sum of
 * |products|, K the terms); bf16 inputs with f32 outputs (vdpbf16ps where the CPU has it, else
 * the widening path): exact products summed in f32, the same bound. A dropped or doubled tap
 * moves an output by one product, on average |x w| = 1/4 against a bound of about 1e-4 here. */
static void direct_border_case(na_dtype dt, int64_t n, int64_t ci, int64_t co, int64_t hw,
                               int sh, int p) {
    na_conv_geom g = conv_geom(n, ci, hw, hw, co, 3, 1, p, 1, 1);
    g.sh = sh, g.oh = (hw + 2 * p - 3) / sh + 1;
    if (hw + 2 * p < 3) return; /* the kernel does not fit */
    const na_dtype f32 = NA_DTYPE_F32;
    na_view x = MK(dt, n, ci, hw, hw), w = MK(dt, co, ci, 3, 3), b = MK(dt, co),
            gy = MK(dt, n, co, g.oh, g.ow);
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    na_view ax = absolute(&x), aw = absolute(&w), ab = absolute(&b), agy = absolute(&gy);
    na_view y[3], gx[3], gw[3]; /* as shipped, the specification, its magnitudes */
    for (int v = 0; v < 3; v++) {
        y[v] = MK(f32, n, co, g.oh, g.ow);
        gx[v] = MK(f32, n, ci, hw, hw);
        gw[v] = MK(f32, co, ci, 3, 3);
    }
    fill_rand(&y[0], 9, 10); /* every output is overwritten */
    fill_rand(&gx[0], 9, 10);
    fill_rand(&gw[0], 9, 10);
    int rc = B->conv2d(&g, &x, &w, &b, &y[0]);
    if (!rc) rc = B->conv2d_backward_data(&g, &gy, &w, &gx[0]);
    if (!rc) rc = B->conv2d_backward_weight(&g, &x, &gy, &gw[0]);
    cr_assert_eq(rc, NA_OK, "%s", na_last_error());
    cr_assert_eq(na_cpu_ref_conv2d(&g, &x, &w, &b, &y[1]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &gy, &w, &gx[1]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &x, &gy, &gw[1]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d(&g, &ax, &aw, &ab, &y[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &agy, &aw, &gx[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &ax, &agy, &gw[2]), NA_OK);
    char what[160];
    snprintf(what, sizeof what, "direct border %s: n%lld c%lld->%lld %lldx%lld s%d p%d",
             na_dtype_name(dt), (long long)n, (long long)ci, (long long)co, (long long)hw,
             (long long)hw, sh, p);
    expect_within_sum_bound(&y[0], &y[1], &y[2], ci * 9 + 1, what);
    expect_within_sum_bound(&gx[0], &gx[1], &gx[2], co * 9, what);
    expect_within_sum_bound(&gw[0], &gw[1], &gw[2], n * g.oh * g.ow, what);
    if (co >= 64 && na_cpu_direct_wgrad_usable(&g)) { /* the split by output channels */
        fill_rand(&gw[0], 9, 10);
        cr_assert_eq(na_cpu_direct_conv2d_wgrad_rows(&g, &x, &gy, &gw[0]), NA_OK, "%s",
                     na_last_error());
        strncat(what, ", by rows", sizeof what - strlen(what) - 1);
        expect_within_sum_bound(&gw[0], &gw[1], &gw[2], n * g.oh * g.ow, what);
    }
    for (int v = 0; v < 3; v++) rm(&y[v]), rm(&gx[v]), rm(&gw[v]);
    rm(&x); rm(&w); rm(&b); rm(&gy); rm(&ax); rm(&aw); rm(&ab); rm(&agy);
}

Test(cpu_conv, direct_border_taps_against_specification, .timeout = 120) {
    na_conv_geom g = conv_geom(1, 3, 4, 4, 37, 3, 1, 1, 1, 1);
    if (!na_cpu_direct_conv_usable(&g, false))
        cr_skip("this CPU has neither AVX-512F nor AVX2+FMA+F16C (or NANOAMP_CPU_CONV=gemm): "
                "no direct convolution");
    static const int64_t maps[] = {1, 2, 3, 4, 5, 6, 7, 8}, batches[] = {1, 3};
    /* odd; 33: one bf16 pair short; 70 outputs: also the weight gradient split by output
     * channels (direct_border_case), its tasks' rows not whole 32-channel tiles */
    static const int64_t chans[][2] = {{3, 37}, {33, 37}, {5, 70}};
    static const na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_BF16, NA_DTYPE_F16};
    for (int d = 0; d < 3; d++)
        for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++)
            for (int bi = 0; bi < 2; bi++)
                for (int c = 0; c < 3; c++)
                    for (int sh = 1; sh <= 2; sh++)
                        for (int p = 0; p <= 1; p++) {
                            direct_border_case(dts[d], batches[bi], chans[c][0], chans[c][1],
                                               maps[m], sh, p);
                        }
}

/* NANOAMP_CPU_BF16=off (read once, here in this test's own process) selects the widening
 * path: the denormal result survives. */
Test(cpu_gemm, bf16_env_off_selects_the_widening_path, .init = bf16_env_off) {
    cr_assert(!na_cpu_bf16_fast());
    float tiny[2] = {0x1p-64f, 0.0f};
    cr_assert_eq(bf16_dot2(tiny, tiny, false), 0x1p-128f);
}

/* One random convolution: groups, stride, padding (up to past the kernel's reach), dilation,
 * bias, non-square everything, images per block; forward and both adjoints, as shipped (the
 * direct AVX-512 convolution where it applies), on the GEMM path with the backend's GEMM and
 * the built-in one, against the specification. `big` draws more channels and pixels: several
 * 8-channel blocks and 48-pixel chunks with partial tails. */
static void random_conv_case(na_dtype dt, bool big) {
    int64_t cmax = big ? 12 : 3, smax = big ? 24 : 10;
    na_conv_geom g = {.n = irand(1, 3), .groups = (int)irand(1, 3), .kh = (int)irand(1, 4),
                      .kw = (int)irand(1, 4), .sh = (int)irand(1, 3), .sw = (int)irand(1, 3),
                      .ph = (int)irand(0, 3), .pw = (int)irand(0, 3), .dh = (int)irand(1, 3),
                      .dw = (int)irand(1, 3)};
    if (big && urand() < 0.7) g.sw = g.dw = 1; /* mostly shapes the direct path takes */
    g.c_in = g.groups * irand(1, cmax);
    g.c_out = g.groups * irand(1, cmax);
    g.h = irand(1, smax);
    g.w = irand(1, smax);
    g.oh = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
    g.ow = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
    if (g.oh < 1 || g.ow < 1) return; /* the kernel does not fit: not a convolution */
    bool bias = urand() < 0.5;
    int64_t cg = g.c_in / g.groups, cog = g.c_out / g.groups;
    na_view x = MK(dt, g.n, g.c_in, g.h, g.w), w = MK(dt, g.c_out, cg, g.kh, g.kw),
            b = MK(dt, g.c_out), gy = MK(dt, g.n, g.c_out, g.oh, g.ow);
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    na_view ax = absolute(&x), aw = absolute(&w), ab = absolute(&b), agy = absolute(&gy);
    na_view y[3], gx[3], gw[3]; /* the specification, its magnitudes, the fast path */
    for (int s = 0; s < 3; s++) {
        y[s] = MK(dt, g.n, g.c_out, g.oh, g.ow);
        gx[s] = MK(dt, g.n, g.c_in, g.h, g.w);
        gw[s] = MK(dt, g.c_out, cg, g.kh, g.kw);
    }
    cr_assert_eq(na_cpu_ref_conv2d(&g, &x, &w, bias ? &b : NULL, &y[0]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &gy, &w, &gx[0]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &x, &gy, &gw[0]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d(&g, &ax, &aw, bias ? &ab : NULL, &y[1]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &agy, &aw, &gx[1]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &ax, &agy, &gw[1]), NA_OK);
    int64_t keep = na_cpu_conv_block_budget;
    for (int variant = 0; variant < 5; variant++) {
        /* 0: as shipped; 1: the built-in GEMM; 2: one image per block; 3: the GEMM path;
         * 4: as shipped with the least scratch (the direct path's weight gradient then packs
         * its columns one input channel at a time) */
        na_cpu_gemm_force_builtin = variant == 1;
        na_cpu_conv_force_gemm = variant >= 1 && variant <= 3;
        if (variant == 2 || variant == 4) na_cpu_conv_block_budget = 1;
        fill_rand(&y[2], 9, 10); /* every output is overwritten */
        fill_rand(&gx[2], 9, 10);
        fill_rand(&gw[2], 9, 10);
        int rc = B->conv2d(&g, &x, &w, bias ? &b : NULL, &y[2]);
        if (!rc) rc = B->conv2d_backward_data(&g, &gy, &w, &gx[2]);
        if (!rc) rc = B->conv2d_backward_weight(&g, &x, &gy, &gw[2]);
        na_cpu_gemm_force_builtin = false;
        na_cpu_conv_force_gemm = false;
        na_cpu_conv_block_budget = keep;
        cr_assert_eq(rc, NA_OK, "%s", na_last_error());
        char what[200];
        snprintf(what, sizeof what, "conv %s variant %d n%lld c%lld->%lld %lldx%lld k%dx%d "
                 "s%dx%d p%dx%d d%dx%d g%d bias%d", na_dtype_name(dt), variant, (long long)g.n,
                 (long long)g.c_in, (long long)g.c_out, (long long)g.h, (long long)g.w, g.kh,
                 g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups, bias);
        expect_within_sum_bound(&y[2], &y[0], &y[1], cg * g.kh * g.kw + 1, what);
        expect_within_sum_bound(&gx[2], &gx[0], &gx[1], cog * g.kh * g.kw, what);
        expect_within_sum_bound(&gw[2], &gw[0], &gw[1], g.n * g.oh * g.ow, what);
    }
    for (int s = 0; s < 3; s++) rm(&y[s]), rm(&gx[s]), rm(&gw[s]);
    rm(&x); rm(&w); rm(&b); rm(&gy); rm(&ax); rm(&aw); rm(&ab); rm(&agy);
}

Test(cpu_reference, conv_fast_paths_meet_the_specification) {
    for (int t = 0; t < 400; t++) random_conv_case(float_dtypes[t % 4], false);
    for (int t = 0; t < 60; t++) random_conv_case(float_dtypes[t % 4], true);
}

/* The direct convolution against the GEMM path on one geometry, f32: forward, data gradient
 * (when the direct path takes it) and weight gradient agree to f32 rounding of K-term sums of
 * products of magnitude < 1, and not bit for bit (identical bits would mean the direct path
 * did not run: the two sum in different orders). */
static void direct_against_gemm(na_conv_geom g) {
    int64_t cg = g.c_in / g.groups, K = cg * g.kh * g.kw;
    na_view x = MK(NA_DTYPE_F32, g.n, g.c_in, g.h, g.w),
            w = MK(NA_DTYPE_F32, g.c_out, cg, g.kh, g.kw), b = MK(NA_DTYPE_F32, g.c_out),
            gy = MK(NA_DTYPE_F32, g.n, g.c_out, g.oh, g.ow), y[2], gx[2], gw[2];
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    bool data = na_cpu_direct_conv_usable(&g, true), wgrad = na_cpu_direct_wgrad_usable(&g);
    for (int v = 0; v < 2; v++) {
        y[v] = MK(NA_DTYPE_F32, g.n, g.c_out, g.oh, g.ow);
        gx[v] = MK(NA_DTYPE_F32, g.n, g.c_in, g.h, g.w);
        gw[v] = MK(NA_DTYPE_F32, g.c_out, cg, g.kh, g.kw);
        na_cpu_conv_force_gemm = v == 1;
        cr_assert_eq(B->conv2d(&g, &x, &w, &b, &y[v]), NA_OK);
        cr_assert_eq(B->conv2d_backward_data(&g, &gy, &w, &gx[v]), NA_OK);
        cr_assert_eq(B->conv2d_backward_weight(&g, &x, &gy, &gw[v]), NA_OK);
        na_cpu_conv_force_gemm = false;
    }
    char what[160];
    snprintf(what, sizeof what, "direct against GEMM: n%lld c%lld->%lld %lldx%lld k%d p%d",
             (long long)g.n, (long long)g.c_in, (long long)g.c_out, (long long)g.h,
             (long long)g.w, g.kh, g.ph);
    double tol = 4e-7 * (double)(K > g.n * g.oh * g.ow ? K : g.n * g.oh * g.ow);
    na_view *got[3] = {&y[0], &gx[0], &gw[0]}, *want[3] = {&y[1], &gx[1], &gw[1]};
    for (int q = 0; q < 3; q++) {
        na_view w64 = rounded(NA_DTYPE_F64, want[q]);
        expect_close_arr(got[q], w64.data, tol, 1e-5, what);
        bool differs = false;
        for (int64_t i = 0; i < got[q]->numel && !differs; i++)
            differs = get(got[q], i) != get(want[q], i);
        /* the weight gradient is im2col + GEMM on the AVX2 path */
        cr_assert(differs || (q == 1 && !data) || (q == 2 && !wgrad),
                  "%s: output %d has the GEMM path's bits", what, q);
        rm(&w64);
    }
    rm(&x); rm(&w); rm(&b); rm(&gy);
    for (int v = 0; v < 2; v++) rm(&y[v]), rm(&gx[v]), rm(&gw[v]);
}

/* The direct convolution is taken where it should be (this CPU permitting) and agrees with
 * the GEMM path on the MNIST CNN's layers, on channels enough for several K blocks, on
 * images smaller than one 16-pixel tile (tiles of several images share a panel), and on a
 * layer whose weight gradient is split by output channels. */
Test(cpu_conv, direct_path_against_gemm_path) {
    na_conv_geom g = conv_geom(4, 32, 14, 14, 64, 3, 1, 1, 1, 1);
    if (!na_cpu_direct_conv_usable(&g, false))
        cr_skip("this CPU has neither AVX-512F nor AVX2+FMA+F16C (or NANOAMP_CPU_CONV=gemm): "
                "no direct convolution");
    cr_assert(na_cpu_direct_conv_usable(&g, true));
    na_conv_geom s2 = conv_geom(4, 32, 14, 14, 64, 3, 2, 1, 1, 1);
    cr_assert(!na_cpu_direct_conv_usable(&s2, false), "horizontal stride 2: the GEMM path");
    cr_assert(!na_cpu_direct_conv_usable(&s2, true));
    direct_against_gemm(g);
    direct_against_gemm(conv_geom(3, 1, 28, 28, 32, 3, 1, 1, 1, 1)); /* first layer: 784 px */
    direct_against_gemm(conv_geom(3, 320, 5, 6, 12, 3, 1, 1, 1, 1)); /* K 2880: 3 K blocks */
    direct_against_gemm(conv_geom(5, 24, 3, 4, 20, 3, 1, 1, 1, 2));  /* 12-px images, groups */
    /* a weight gradient too wide for one partial per image range: split by output channels */
    direct_against_gemm(conv_geom(2, 256, 2, 3, 520, 3, 1, 1, 1, 1));
}

/* ---- the AVX2 direct convolution (cpu_direct_conv_avx2.c) ----------------------------------
 * Forward and data gradient on the AVX2 + FMA tiles (as shipped on a CPU without AVX-512F)
 * against the specification within expect_within_sum_bound, and against the same call with
 * na_cpu_direct_avx2_off (im2col + GEMM): inputs f32, f16, bf16 (read in place by the
 * packer), outputs f32 or the input's half dtype (rounded by the tiles), random geometries
 * with odd sizes, padding up to the kernel's reach, vertical stride and dilation 2, groups,
 * batch 1, 1 or 3 input channels, output counts not a multiple of the 4-channel tile; a NaN
 * and infinities in x and gy must reach the outputs they touch as the specification has them.
 * Returns whether some output differs in bits from the GEMM path's (the sums' orders differ,
 * so identical bits everywhere would mean the AVX2 tiles did not run). */
static void expect_within_sum_bound_nonfinite(const na_view *fast, const na_view *ref,
                                              const na_view *mag, int64_t terms,
                                              const char *what) {
    double u_out = unit_roundoff(fast->dtype);
    double tiny = fast->dtype == NA_DTYPE_F16 ? 0x1p-24 : 0;
    for (int64_t i = 0; i < ref->numel; i++) {
        double f = get(fast, i), r = get(ref, i);
        if (isnan(r) || isinf(r)) {
            cr_assert(isnan(r) ? isnan(f) : f == r, "%s [%lld]: fast %g, specification %g",
                      what, (long long)i, f, r);
            continue;
        }
        double tol = 2.1 * (double)terms * 0x1p-24 * get(mag, i) + 2.1 * u_out * fabs(r) + tiny;
        cr_assert(fabs(f - r) <= tol, "%s [%lld]: fast %.10g, specification %.10g (bound %.3g)",
                  what, (long long)i, f, r, tol);
    }
}

static int64_t avx2_wgrad_cases, avx2_wgrad_differs; /* 3x3 weight gradients on the tile */

/* A random 3x3 weight-gradient geometry: channel counts across the 8-lane and 32-channel
 * blocks, cout not a multiple of 8, vertical stride and dilation 2, padding 0-2; false when
 * the draw has no output (draw again). */
static bool random_wgrad3_geom(na_conv_geom *g) {
    int64_t chans[3] = {1, 3, irand(1, 40)};
    na_conv_geom r = {.n = irand(1, 4), .groups = urand() < 0.2 ? 2 : 1, .kh = 3, .kw = 3,
                      .sh = (int)irand(1, 2), .sw = 1, .dh = urand() < 0.2 ? 2 : 1, .dw = 1};
    r.ph = (int)irand(0, 2);
    r.pw = (int)irand(0, 2);
    r.c_in = r.groups * chans[irand(0, 2)];
    r.c_out = r.groups * irand(1, 75);
    r.h = irand(1, 18);
    r.w = irand(1, 18);
    r.oh = (r.h + 2 * r.ph - r.dh * 2 - 1) / r.sh + 1;
    r.ow = r.w + 2 * r.pw - 2;
    *g = r;
    return r.h + 2 * r.ph >= r.dh * 2 + 1 && r.w + 2 * r.pw >= 3;
}

static bool avx2_direct_case(na_conv_geom g, na_dtype in, na_dtype out, bool nonfinite) {
    int64_t cg = g.c_in / g.groups, cog = g.c_out / g.groups, taps = (int64_t)g.kh * g.kw;
    na_view x = MK(in, g.n, g.c_in, g.h, g.w), w = MK(in, g.c_out, cg, g.kh, g.kw),
            b = MK(in, g.c_out), gy = MK(in, g.n, g.c_out, g.oh, g.ow);
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    if (nonfinite) {
        set(&x, x.numel / 3, NAN);
        set(&x, 2 * x.numel / 3, INFINITY);
        set(&gy, gy.numel / 4, NAN);
        set(&gy, gy.numel / 2, -INFINITY);
    }
    na_view ax = absolute(&x), aw = absolute(&w), ab = absolute(&b), agy = absolute(&gy);
    bool bias = urand() < 0.7, data = na_cpu_direct_conv_usable(&g, true);
    cr_assert(na_cpu_direct_conv_usable(&g, false), "the AVX2 tiles take this forward");
    bool wgrad = na_cpu_direct_wgrad_usable(&g);
    na_view y[4], gx[4], gw[4]; /* as shipped, the GEMM path, the specification, magnitudes */
    for (int v = 0; v < 4; v++) {
        y[v] = MK(out, g.n, g.c_out, g.oh, g.ow);
        gx[v] = MK(out, g.n, g.c_in, g.h, g.w);
        gw[v] = MK(out, g.c_out, cg, g.kh, g.kw);
    }
    for (int v = 0; v < 2; v++) {
        fill_rand(&y[v], 9, 10); /* every output is overwritten */
        fill_rand(&gx[v], 9, 10);
        fill_rand(&gw[v], 9, 10);
        na_cpu_direct_avx2_off = v == 1;
        int rc = B->conv2d(&g, &x, &w, bias ? &b : NULL, &y[v]);
        if (!rc) rc = B->conv2d_backward_data(&g, &gy, &w, &gx[v]);
        if (!rc) rc = B->conv2d_backward_weight(&g, &x, &gy, &gw[v]);
        na_cpu_direct_avx2_off = false;
        cr_assert_eq(rc, NA_OK, "%s", na_last_error());
    }
    cr_assert_eq(na_cpu_ref_conv2d(&g, &x, &w, bias ? &b : NULL, &y[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &gy, &w, &gx[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &x, &gy, &gw[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d(&g, &ax, &aw, bias ? &ab : NULL, &y[3]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &agy, &aw, &gx[3]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &ax, &agy, &gw[3]), NA_OK);
    char what[200];
    snprintf(what, sizeof what, "avx2 direct %s -> %s%s: n%lld c%lld->%lld %lldx%lld k%dx%d "
             "s%d p%dx%d d%d g%d bias%d", na_dtype_name(in), na_dtype_name(out),
             nonfinite ? " nonfinite" : "", (long long)g.n, (long long)g.c_in,
             (long long)g.c_out, (long long)g.h, (long long)g.w, g.kh, g.kw, g.sh, g.ph, g.pw,
             g.dh, g.groups, bias);
    expect_within_sum_bound_nonfinite(&y[0], &y[2], &y[3], cg * taps + 1, what);
    expect_within_sum_bound_nonfinite(&gx[0], &gx[2], &gx[3], cog * taps, what);
    /* the weight gradient: an infinity in gy over the padding makes inf x 0 = NaN on both
     * paths that multiply the padding's zeros (the specification skips those taps), so its
     * non-finite outputs are held to the GEMM path's */
    for (int64_t i = 0; i < gw[0].numel; i++) {
        double f = get(&gw[0], i), m = get(&gw[1], i), r = get(&gw[2], i);
        if (isfinite(r) && isfinite(m)) {
            double tol = 2.1 * (double)(g.n * g.oh * g.ow) * 0x1p-24 * get(&gw[3], i) +
                         2.1 * unit_roundoff(out) * fabs(r) +
                         (out == NA_DTYPE_F16 ? 0x1p-24 : 0);
            cr_assert(fabs(f - r) <= tol, "%s gw[%lld]: fast %.10g, specification %.10g "
                      "(bound %.3g)", what, (long long)i, f, r, tol);
        } else {
            cr_assert(isnan(m) ? isnan(f) : f == m, "%s gw[%lld]: fast %g, GEMM path %g",
                      what, (long long)i, f, m);
        }
    }
    bool differs = false;
    size_t es = esize(out);
    /* the 3x3 weight gradient's 8-lane tile (its sums' order differs from the GEMM path's) */
    if (wgrad) {
        bool d = false;
        for (int64_t i = 0; i < gw[0].numel && !d; i++)
            d = memcmp((char *)gw[0].data + i * es, (char *)gw[1].data + i * es, es) != 0;
        avx2_wgrad_cases++;
        avx2_wgrad_differs += d;
    }
    for (int64_t i = 0; i < y[0].numel && !differs; i++)
        differs = memcmp((char *)y[0].data + i * es, (char *)y[1].data + i * es, es) != 0;
    for (int64_t i = 0; i < gx[0].numel && !differs && data; i++)
        differs = memcmp((char *)gx[0].data + i * es, (char *)gx[1].data + i * es, es) != 0;
    for (int v = 0; v < 4; v++) rm(&y[v]), rm(&gx[v]), rm(&gw[v]);
    rm(&x); rm(&w); rm(&b); rm(&gy); rm(&ax); rm(&aw); rm(&ab); rm(&agy);
    return differs;
}

Test(cpu_conv, direct_avx2_against_specification, .timeout = 120) {
    na_conv_geom g = conv_geom(2, 32, 14, 14, 64, 3, 1, 1, 1, 1);
    if (!na_cpu_direct_avx2())
        cr_skip("not an AVX2+FMA+F16C CPU without AVX-512F: the AVX2 tiles do not run");
    cr_assert(na_cpu_direct_conv_usable(&g, false) && na_cpu_direct_conv_usable(&g, true));
    cr_assert(na_cpu_direct_wgrad_usable(&g), "the 3x3 weight gradient takes the AVX2 tile");
    na_conv_geom g5 = conv_geom(2, 32, 14, 14, 64, 5, 1, 2, 1, 1);
    cr_assert(!na_cpu_direct_wgrad_usable(&g5), "a 5x5 weight gradient stays im2col + GEMM");
    na_conv_geom deep4 = conv_geom(2, 256, 4, 4, 32, 3, 1, 1, 1, 1), deep5 = deep4;
    deep5.h = deep5.w = deep5.oh = deep5.ow = 5;
    cr_assert(!na_cpu_direct_wgrad_usable(&deep4), "4x4 maps of 256 channels: im2col + GEMM");
    cr_assert(na_cpu_direct_wgrad_usable(&deep5), "5x5 maps of 256 channels: the AVX2 tile");
    na_cpu_wgrad_avx2_off = true;
    bool woff = na_cpu_direct_wgrad_usable(&g);
    na_cpu_wgrad_avx2_off = false;
    cr_assert(!woff, "na_cpu_wgrad_avx2_off: im2col + GEMM");
    na_cpu_direct_avx2_off = true;
    bool off = na_cpu_direct_conv_usable(&g, false) || na_cpu_direct_wgrad_usable(&g);
    na_cpu_direct_avx2_off = false;
    cr_assert(!off, "na_cpu_direct_avx2_off: im2col + GEMM");
    static const na_dtype ins[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    int64_t differ = 0, cases = 0;
    /* the MNIST CNN's layers, several K blocks (partial sums; a half output's in scratch),
     * 12-pixel images across chunks, one-pixel rows and columns */
    na_conv_geom fixed[] = {
        conv_geom(3, 1, 28, 28, 32, 3, 1, 1, 1, 1), g,
        conv_geom(2, 320, 5, 6, 13, 3, 1, 1, 1, 1), conv_geom(5, 24, 3, 4, 20, 3, 1, 1, 1, 2),
        conv_geom(2, 3, 1, 9, 6, 1, 1, 0, 1, 1), conv_geom(2, 3, 9, 1, 6, 1, 1, 0, 1, 1),
        conv_geom(1, 1, 1, 1, 5, 1, 1, 0, 1, 1),
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        for (int d = 0; d < 3; d++)
            for (int o = 0; o < 2; o++, cases++)
                differ += avx2_direct_case(fixed[i], ins[d], o ? ins[d] : NA_DTYPE_F32, i == 1);
    for (int t = 0; t < 240; t++) {
        int64_t chans[3] = {1, 3, irand(1, 12)};
        na_conv_geom r = {.n = irand(1, 3), .groups = (int)irand(1, 3), .kh = (int)irand(1, 5),
                          .kw = (int)irand(1, 5), .sh = (int)irand(1, 2), .sw = 1,
                          .dh = urand() < 0.2 ? 2 : 1, .dw = 1};
        r.ph = (int)irand(0, r.kh - 1 + (urand() < 0.1)); /* sometimes past the data grad's */
        r.pw = (int)irand(0, r.kw - 1);
        r.c_in = r.groups * chans[irand(0, 2)];
        r.c_out = r.groups * irand(1, 13);
        r.h = irand(1, 20);
        r.w = irand(1, 20);
        r.oh = (r.h + 2 * r.ph - r.dh * (r.kh - 1) - 1) / r.sh + 1;
        r.ow = (r.w + 2 * r.pw - (r.kw - 1) - 1) + 1;
        if (r.h + 2 * r.ph < r.dh * (r.kh - 1) + 1 || r.w + 2 * r.pw < r.kw) continue;
        na_dtype in = ins[t % 3], out = t / 3 % 2 ? in : NA_DTYPE_F32;
        differ += avx2_direct_case(r, in, out, t % 7 == 0);
        cases++;
    }
    /* 3x3 weight gradients: channel counts across the 8-lane and 32-channel blocks, cout not
     * a multiple of 8, vertical stride and dilation 2, padding 0-2 */
    for (int t = 0; t < 120; t++) {
        na_conv_geom r;
        if (!random_wgrad3_geom(&r)) continue;
        na_dtype in = ins[t % 3], out = t / 3 % 2 ? in : NA_DTYPE_F32;
        differ += avx2_direct_case(r, in, out, t % 7 == 0);
        cases++;
    }
    cr_assert(differ > cases / 2, "%lld of %lld cases have the GEMM path's bits everywhere",
              (long long)(cases - differ), (long long)cases);
    cr_assert(avx2_wgrad_cases > 100 && avx2_wgrad_differs > avx2_wgrad_cases / 2,
              "%lld of %lld weight gradients have the GEMM path's bits everywhere",
              (long long)(avx2_wgrad_cases - avx2_wgrad_differs), (long long)avx2_wgrad_cases);
}

/* The AVX2 tiles' image ranges are fixed by the problem: the same bits at 1, 2 and 3 threads
 * (forward and data gradient, f32 and a bf16 output). */
Test(cpu_conv, direct_avx2_same_bits_at_any_thread_count) {
    na_conv_geom g = conv_geom(12, 20, 11, 13, 18, 3, 1, 1, 1, 1);
    if (!na_cpu_direct_avx2())
        cr_skip("not an AVX2+FMA+F16C CPU without AVX-512F: the AVX2 tiles do not run");
    for (int o = 0; o < 2; o++) {
        na_dtype dt = o ? NA_DTYPE_BF16 : NA_DTYPE_F32;
        na_view x = MK(dt, g.n, g.c_in, g.h, g.w), w = MK(dt, g.c_out, g.c_in, 3, 3),
                gy = MK(dt, g.n, g.c_out, g.oh, g.ow), y[3], gx[3];
        fill_rand(&x, -1, 1);
        fill_rand(&w, -1, 1);
        fill_rand(&gy, -1, 1);
        for (int t = 0; t < 3; t++) {
            y[t] = MK(dt, g.n, g.c_out, g.oh, g.ow);
            gx[t] = MK(dt, g.n, g.c_in, g.h, g.w);
            cr_assert_eq(na_set_num_threads(t + 1), NA_OK);
            cr_assert_eq(B->conv2d(&g, &x, &w, NULL, &y[t]), NA_OK, "%s", na_last_error());
            cr_assert_eq(B->conv2d_backward_data(&g, &gy, &w, &gx[t]), NA_OK, "%s",
                         na_last_error());
        }
        na_set_num_threads(1);
        for (int t = 1; t < 3; t++) {
            expect_same_bits(&y[t], &y[0], "AVX2 direct forward at 2-3 threads against 1");
            expect_same_bits(&gx[t], &gx[0], "AVX2 direct data gradient at 2-3 threads against 1");
        }
        for (int t = 0; t < 3; t++) rm(&y[t]), rm(&gx[t]);
        rm(&x); rm(&w); rm(&gy);
    }
}

/* ---- the AVX2 3x3 weight gradient's copies (cpu_direct_conv.h) -----------------------------
 * na_cpu_dc_transpose_avx2 and na_cpu_dc_pad_plane_avx2 against element loops: every dtype
 * with random bit patterns (NaNs with payloads, infinities, subnormals: halves widened as
 * half.h does), row and column counts around the 8 x 8 blocks, the zero lanes up to nw, and
 * nothing written outside (a sentinel in every other element of dst). src is allocated to
 * its last element read. */
static void *random_bits(na_dtype dt, int64_t n) {
    size_t es = esize(dt);
    uint8_t *p = malloc((size_t)(n > 0 ? n : 1) * es);
    cr_assert(p);
    for (size_t i = 0; i < (size_t)n * es; i++) p[i] = (uint8_t)(urand() * 256);
    return p;
}

static uint32_t widened_bits(na_dtype dt, const void *src, int64_t i) {
    float f;
    if (dt == NA_DTYPE_F32) f = ((const float *)src)[i];
    else if (dt == NA_DTYPE_F16) f = na_f16_bits_to_f32(((const uint16_t *)src)[i]);
    else f = na_bf16_bits_to_f32(((const uint16_t *)src)[i]);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

enum { WGRAD_SENTINEL = 0x7FBADBAD };

Test(cpu_conv, avx2_wgrad_transpose_against_element_loop) {
    if (!na_cpu_dc_avx2_cpu()) cr_skip("no AVX2+FMA+F16C: the AVX2 transposes do not run");
    static const na_dtype dts[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    static const int64_t nrs[] = {1, 3, 7, 8, 9, 15, 17, 32}, ncs[] = {1, 2, 7, 8, 9, 14, 23, 196};
    int64_t cases = 0;
    for (int d = 0; d < 3; d++)
        for (size_t a = 0; a < sizeof nrs / sizeof nrs[0]; a++)
            for (size_t b = 0; b < sizeof ncs / sizeof ncs[0]; b++)
                for (int e = 0; e < 4; e++) {
                    int64_t nr = nrs[a], nc = ncs[b];
                    int64_t nw = e == 0 ? nr : e == 1 ? (nr + 7) / 8 * 8 : e == 2 ? nr + 5 : 32;
                    if (nw < nr) continue;
                    int64_t lds = nc + (e & 1 ? 3 : 0), ldd = nw + (e >= 2 ? 0 : 2);
                    na_dtype dt = dts[d];
                    void *src = random_bits(dt, (nr - 1) * lds + nc);
                    int64_t dn = (nc + 1) * ldd; /* a row past nc: nothing written there */
                    uint32_t *dst = malloc((size_t)dn * sizeof *dst);
                    for (int64_t i = 0; i < dn; i++) dst[i] = WGRAD_SENTINEL;
                    na_cpu_dc_transpose_avx2(dt, src, lds, nr, nw, nc, (float *)dst, ldd);
                    for (int64_t c = 0; c <= nc; c++)
                        for (int64_t r = 0; r < ldd; r++) {
                            uint32_t want = c == nc || r >= nw ? WGRAD_SENTINEL
                                            : r >= nr         ? 0
                                                              : widened_bits(dt, src, r * lds + c);
                            cr_assert_eq(dst[c * ldd + r], want,
                                         "%s nr %lld nw %lld nc %lld lds %lld ldd %lld: "
                                         "dst[%lld][%lld] %08x, want %08x",
                                         na_dtype_name(dt), (long long)nr, (long long)nw,
                                         (long long)nc, (long long)lds, (long long)ldd,
                                         (long long)c, (long long)r, dst[c * ldd + r], want);
                        }
                    free(src);
                    free(dst);
                    cases++;
                }
    cr_assert(cases > 500);
}

Test(cpu_conv, avx2_wgrad_pad_plane_against_element_loop) {
    if (!na_cpu_dc_avx2_cpu()) cr_skip("no AVX2+FMA+F16C: the AVX2 plane copy does not run");
    static const na_dtype dts[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    static const int64_t hs[] = {1, 2, 5, 14}, ws[] = {1, 3, 7, 8, 9, 17, 28};
    for (int d = 0; d < 3; d++)
        for (size_t a = 0; a < sizeof hs / sizeof hs[0]; a++)
            for (size_t b = 0; b < sizeof ws / sizeof ws[0]; b++)
                for (int p = 0; p < 9; p++) {
                    int64_t H = hs[a], W = ws[b], ph = p % 3, pw = p / 3;
                    int64_t Hp = H + 2 * ph + (p & 1), Wp = W + 2 * pw + (p % 4 == 3);
                    na_dtype dt = dts[d];
                    void *src = random_bits(dt, H * W);
                    int64_t dn = Hp * Wp + 9; /* 9 past the plane: never written */
                    uint32_t *dst = malloc((size_t)dn * sizeof *dst);
                    for (int64_t i = 0; i < dn; i++) dst[i] = WGRAD_SENTINEL;
                    na_cpu_dc_pad_plane_avx2(dt, src, H, W, ph, pw, Hp, Wp, (float *)dst);
                    for (int64_t i = 0; i < dn; i++) {
                        int64_t y = i / Wp - ph, x = i % Wp - pw;
                        uint32_t want = i >= Hp * Wp ? WGRAD_SENTINEL
                                        : y >= 0 && y < H && x >= 0 && x < W
                                            ? widened_bits(dt, src, y * W + x)
                                            : 0;
                        cr_assert_eq(dst[i], want,
                                     "%s %lldx%lld pad %lld,%lld in %lldx%lld: [%lld] %08x, "
                                     "want %08x", na_dtype_name(dt), (long long)H, (long long)W,
                                     (long long)ph, (long long)pw, (long long)Hp, (long long)Wp,
                                     (long long)i, dst[i], want);
                    }
                    free(src);
                    free(dst);
                }
}

/* The AVX2 3x3 weight gradient with its vector copies gives the bits of the same tile fed by
 * the element loops (na_cpu_wgrad_avx2_copies_off): the CNN's layers over several blocks of
 * images, output counts not a multiple of 8 or 32, odd output widths, one input channel,
 * groups, vertical stride and dilation 2, no padding, a layer split by output channels;
 * f32, f16 and bf16 in, gW f32 or the input's dtype; NaNs and infinities in some cases. */
static void wgrad_copies_case(na_conv_geom g, na_dtype in, na_dtype out, bool nonfinite) {
    int64_t cg = g.c_in / g.groups;
    na_view x = MK(in, g.n, g.c_in, g.h, g.w), gy = MK(in, g.n, g.c_out, g.oh, g.ow), gw[2];
    fill_rand(&x, -1, 1);
    fill_rand(&gy, -1, 1);
    if (nonfinite) {
        set(&x, x.numel / 3, NAN);
        set(&gy, gy.numel / 2, -INFINITY);
    }
    cr_assert(na_cpu_direct_wgrad_usable(&g), "n%lld c%lld->%lld %lldx%lld: the AVX2 tile",
              (long long)g.n, (long long)g.c_in, (long long)g.c_out, (long long)g.h,
              (long long)g.w);
    for (int v = 0; v < 2; v++) {
        gw[v] = MK(out, g.c_out, cg, 3, 3);
        fill_rand(&gw[v], 9, 10);
        na_cpu_wgrad_avx2_copies_off = v == 1;
        int rc = B->conv2d_backward_weight(&g, &x, &gy, &gw[v]);
        na_cpu_wgrad_avx2_copies_off = false;
        cr_assert_eq(rc, NA_OK, "%s", na_last_error());
    }
    char what[160];
    snprintf(what, sizeof what, "AVX2 wgrad %s -> %s: n%lld c%lld->%lld %lldx%lld s%d p%dx%d d%d "
             "g%d: vector copies against element loops", na_dtype_name(in), na_dtype_name(out),
             (long long)g.n, (long long)g.c_in, (long long)g.c_out, (long long)g.h,
             (long long)g.w, g.sh, g.ph, g.pw, g.dh, g.groups);
    expect_same_bits(&gw[0], &gw[1], what);
    rm(&x); rm(&gy); rm(&gw[0]); rm(&gw[1]);
}

Test(cpu_conv, avx2_wgrad_copies_same_bits_as_element_loops, .timeout = 120) {
    if (!na_cpu_direct_avx2())
        cr_skip("not an AVX2+FMA+F16C CPU without AVX-512F: the AVX2 tile does not run");
    static const na_dtype ins[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    na_conv_geom s2 = conv_geom(3, 4, 11, 9, 13, 3, 1, 1, 1, 1), d2 = s2;
    s2.sh = 2, s2.oh = (11 + 2 - 2 - 1) / 2 + 1;
    d2.dh = 2, d2.oh = 11 + 2 - 4;
    na_conv_geom fixed[] = {
        conv_geom(5, 1, 28, 28, 32, 3, 1, 1, 1, 1),  /* first layer, 3 blocks of images */
        conv_geom(4, 32, 14, 14, 64, 3, 1, 1, 1, 1), /* second layer, 2 blocks */
        conv_geom(3, 1, 9, 7, 13, 3, 1, 1, 1, 1),    /* one channel, odd width, 13 outputs */
        conv_geom(2, 5, 6, 9, 37, 3, 1, 0, 1, 1),    /* no padding, a 5-row second block */
        conv_geom(3, 6, 9, 11, 15, 3, 1, 1, 1, 3),   /* groups of 2 -> 5 */
        conv_geom(2, 3, 4, 4, 70, 3, 1, 1, 1, 1),    /* K 27, 70 outputs */
        conv_geom(2, 128, 2, 3, 520, 3, 1, 1, 1, 1), /* split by output channels */
        s2, d2,
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        for (int d = 0; d < 3; d++)
            for (int o = 0; o < 2; o++)
                wgrad_copies_case(fixed[i], ins[d], o ? ins[d] : NA_DTYPE_F32, i == 2);
    for (int t = 0; t < 60; t++) {
        na_conv_geom r;
        if (!random_wgrad3_geom(&r)) continue;
        na_dtype in = ins[t % 3];
        wgrad_copies_case(r, in, t / 3 % 2 ? in : NA_DTYPE_F32, t % 7 == 0);
    }
}

/* f16 x, w, bias and gy on the direct convolution, outputs f16 (autocast) and f32: the packer
 * reads the halves in place and converts them in registers (na_cpu_half512), the other path
 * widens them into f32 copies first (na_cpu_half512_off). The same floats reach the same f32
 * tiles in the same order, so forward, data gradient and weight gradient must have the same
 * bits. */
static void f16_packer_case(na_conv_geom g, na_dtype in, na_dtype out) {
    int64_t cg = g.c_in / g.groups;
    na_view x = MK(in, g.n, g.c_in, g.h, g.w), w = MK(in, g.c_out, cg, g.kh, g.kw),
            b = MK(in, g.c_out), gy = MK(in, g.n, g.c_out, g.oh, g.ow), y[2], gx[2], gw[2];
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    set(&x, 1, 3e-6); /* an f16 subnormal: widened exactly on both paths */
    set(&x, x.numel - 1, in == NA_DTYPE_F16 ? -2e-7 : -1e-39); /* the last pixel's */
    for (int v = 0; v < 2; v++) {
        y[v] = MK(out, g.n, g.c_out, g.oh, g.ow);
        gx[v] = MK(out, g.n, g.c_in, g.h, g.w);
        gw[v] = MK(out, g.c_out, cg, g.kh, g.kw);
        na_cpu_half512_off = v == 1;
        cr_assert_eq(B->conv2d(&g, &x, &w, &b, &y[v]), NA_OK);
        cr_assert_eq(B->conv2d_backward_data(&g, &gy, &w, &gx[v]), NA_OK);
        cr_assert_eq(B->conv2d_backward_weight(&g, &x, &gy, &gw[v]), NA_OK);
        na_cpu_half512_off = false;
    }
    char what[3][96];
    const char *names[3] = {"forward", "data gradient", "weight gradient"};
    for (int q = 0; q < 3; q++)
        snprintf(what[q], sizeof what[q], "%s packer -> %s: n%lld c%lld->%lld %lldx%lld: %s",
                 na_dtype_name(in), na_dtype_name(out), (long long)g.n, (long long)g.c_in,
                 (long long)g.c_out, (long long)g.h, (long long)g.w, names[q]);
    expect_same_bits(&y[0], &y[1], what[0]);
    expect_same_bits(&gx[0], &gx[1], what[1]);
    expect_same_bits(&gw[0], &gw[1], what[2]);
    rm(&x); rm(&w); rm(&b); rm(&gy);
    for (int v = 0; v < 2; v++) rm(&y[v]), rm(&gx[v]), rm(&gw[v]);
}

/* On the AVX2 path (na_cpu_direct_avx2) the packer reads bf16 in place too, and
 * na_cpu_half512_off widens both first: f16 and bf16 there. */
Test(cpu_conv, f16_read_by_the_packer_same_bits_as_widened) {
    na_conv_geom g = conv_geom(4, 32, 14, 14, 64, 3, 1, 1, 1, 1);
    if (!na_cpu_direct_conv_usable(&g, false) || (!na_cpu_half512() && !na_cpu_direct_avx2()))
        cr_skip("this CPU has neither AVX-512F/BW/VL nor AVX2+FMA+F16C: f16 is widened before "
                "the direct convolution");
    na_conv_geom s2 = conv_geom(2, 5, 9, 8, 6, 3, 1, 1, 1, 1);
    s2.sh = 2, s2.oh = (s2.h + 2 - 3) / 2 + 1; /* vertical stride 2 */
    for (int i = 0; i < (na_cpu_direct_avx2() ? 2 : 1); i++)
        for (int o = 0; o < 2; o++) {
            na_dtype in = i ? NA_DTYPE_BF16 : NA_DTYPE_F16;
            na_dtype out = o ? NA_DTYPE_F32 : in;
            f16_packer_case(g, in, out);
            f16_packer_case(conv_geom(3, 1, 28, 28, 32, 3, 1, 1, 1, 1), in, out); /* layer 1 */
            f16_packer_case(conv_geom(3, 320, 5, 6, 12, 3, 1, 1, 1, 1), in, out); /* K blocks */
            f16_packer_case(conv_geom(5, 24, 3, 4, 20, 3, 1, 1, 1, 2), in, out); /* groups */
            f16_packer_case(conv_geom(2, 3, 9, 7, 5, 3, 1, 2, 1, 1), in, out); /* padding */
            f16_packer_case(conv_geom(2, 256, 2, 3, 520, 3, 1, 1, 1, 1), in, out); /* rows */
            f16_packer_case(conv_geom(1, 3, 1, 13, 7, 1, 1, 0, 1, 1), in, out); /* 1 x 13 */
            f16_packer_case(s2, in, out);
        }
}

/* ---- the half output's epilogue (cpu_direct_conv.c) -----------------------------------------
 * An f16/bf16 output of the direct forward and data gradient is rounded from the f32 register
 * tiles straight into the half planes. The sums are the f32 output's: so (1) the half output
 * has exactly the bits of the same kernel's f32 output rounded by half.h (RNE, NaN as half.h,
 * overflow to inf), and (2) the bits of the former path, f32 planes converted after the fact
 * (na_cpu_conv_half_out_off). Inputs of dtype `in` (f32; f16 read by the packer; bf16 on
 * vdpbf16ps, or widened with `spec`), outputs f16 and bf16; a few large inputs overflow f16
 * and a NaN reaches its neighbours. */
static void half_out_case(na_conv_geom g, na_dtype in, bool spec) {
    int64_t cg = g.c_in / g.groups;
    na_view x = MK(in, g.n, g.c_in, g.h, g.w), w = MK(in, g.c_out, cg, g.kh, g.kw),
            b = MK(in, g.c_out), gy = MK(in, g.n, g.c_out, g.oh, g.ow);
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    /* f16 overflow (|y| > 65504): a large input under each group's first output's weights */
    int64_t K = cg * g.kh * g.kw;
    for (int64_t gi = 0; gi < g.groups; gi++)
        for (int64_t k = 0; k < K; k++) set(&w, gi * (g.c_out / g.groups) * K + k, 100);
    set(&x, x.numel / 3, 3e4);
    set(&x, x.numel / 2, -3e4);
    set(&gy, gy.numel / 3, 3e4);
    set(&x, 2 * x.numel / 3, NAN);
    set(&gy, 2 * gy.numel / 3, NAN);
    bool data = na_cpu_direct_conv_usable(&g, true);
    na_cpu_bf16_force_spec = spec;
    na_view y32 = MK(NA_DTYPE_F32, g.n, g.c_out, g.oh, g.ow), gx32 = MK(NA_DTYPE_F32, g.n, g.c_in, g.h, g.w);
    cr_assert_eq(B->conv2d(&g, &x, &w, &b, &y32), NA_OK, "%s", na_last_error());
    cr_assert_eq(B->conv2d_backward_data(&g, &gy, &w, &gx32), NA_OK, "%s", na_last_error());
    char what[200];
    int64_t overflow = 0, nans = 0;
    for (int o = 0; o < 2; o++) {
        na_dtype out = o ? NA_DTYPE_BF16 : NA_DTYPE_F16;
        na_view y[2], gx[2];
        for (int v = 0; v < 2; v++) {
            y[v] = MK(out, g.n, g.c_out, g.oh, g.ow);
            gx[v] = MK(out, g.n, g.c_in, g.h, g.w);
            na_cpu_conv_half_out_off = v == 1;
            int rc = B->conv2d(&g, &x, &w, &b, &y[v]);
            if (!rc) rc = B->conv2d_backward_data(&g, &gy, &w, &gx[v]);
            na_cpu_conv_half_out_off = false;
            cr_assert_eq(rc, NA_OK, "%s", na_last_error());
        }
        snprintf(what, sizeof what, "half epilogue %s -> %s%s: n%lld c%lld->%lld %lldx%lld k%d s%d p%d g%d",
                 na_dtype_name(in), na_dtype_name(out), spec ? " (widening)" : "", (long long)g.n,
                 (long long)g.c_in, (long long)g.c_out, (long long)g.h, (long long)g.w, g.kh,
                 g.sh, g.ph, g.groups);
        expect_same_bits(&y[0], &y[1], what);
        if (data) expect_same_bits(&gx[0], &gx[1], what);
        const na_view *h[2] = {&y[0], &gx[0]}, *f[2] = {&y32, &gx32};
        for (int q = 0; q < 2; q++)
            for (int64_t i = 0; i < f[q]->numel && (q == 0 || data); i++) {
                float s = ((const float *)f[q]->data)[i];
                uint16_t want = o ? na_f32_to_bf16_bits(s) : na_f32_to_f16_bits(s);
                uint16_t got = ((const uint16_t *)h[q]->data)[i];
                cr_assert_eq(got, want, "%s: %s[%lld] = 0x%04x, the f32 sum %.9g rounds to 0x%04x",
                             what, q ? "gx" : "y", (long long)i, got, s, want);
                overflow += !o && isinf(get(h[q], i)) && isfinite(s);
                nans += isnan(s);
            }
        for (int v = 0; v < 2; v++) rm(&y[v]), rm(&gx[v]);
    }
    na_cpu_bf16_force_spec = false;
    cr_assert(overflow > 0 && nans > 0, "%s: the case reaches f16 overflow and NaN", what);
    rm(&x); rm(&w); rm(&b); rm(&gy); rm(&y32); rm(&gx32);
}

Test(cpu_conv, half_output_rounded_in_registers_same_bits, .timeout = 120) {
    na_conv_geom g = conv_geom(3, 7, 9, 11, 13, 3, 1, 1, 1, 1);
    if (!na_cpu_direct_conv_usable(&g, false) || (!na_cpu_half512() && !na_cpu_direct_avx2()))
        cr_skip("this CPU has neither AVX-512F/BW/VL nor AVX2+FMA+F16C: half outputs go "
                "through f32 planes");
    na_conv_geom s2 = conv_geom(2, 5, 9, 8, 6, 3, 1, 1, 1, 1);
    s2.sh = 2, s2.oh = (s2.h + 2 - 3) / 2 + 1; /* vertical stride 2: no direct data gradient */
    na_conv_geom shapes[] = {
        g,                                           /* odd sizes, a 9-row last block */
        s2,
        conv_geom(2, 5, 12, 10, 3, 3, 1, 0, 1, 1),   /* no padding, 3 outputs */
        conv_geom(2, 6, 13, 9, 10, 5, 1, 2, 1, 2),   /* 5x5, groups of 3 */
        conv_geom(2, 3, 9, 7, 5, 3, 1, 2, 1, 1),     /* padding past the reach */
        conv_geom(3, 1, 28, 28, 32, 3, 1, 1, 1, 1),  /* first layer: 784 px */
        conv_geom(3, 320, 5, 6, 12, 3, 1, 1, 1, 1),  /* K 2880: several K blocks (partials) */
        conv_geom(2, 301, 4, 5, 17, 3, 1, 1, 1, 1),  /* K blocks, odd channels, 17 outputs */
        conv_geom(5, 24, 3, 4, 20, 3, 1, 1, 1, 2),   /* 12-px images across chunks, groups */
    };
    na_dtype ins[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int d = 0; d < 3; d++) {
            half_out_case(shapes[i], ins[d], false);
            if (ins[d] == NA_DTYPE_BF16 && na_cpu_bf16_fast()) half_out_case(shapes[i], ins[d], true);
        }
}

/* ---- bf16 products on AVX512_BF16 (cpu_direct_conv.c, na_cpu_bf16_fast) --------------------
 * One geometry with bf16 x, w, bias and gy, outputs of dtype `out` (f32: the sums themselves,
 * bf16: as autocast stores them): forward, data gradient and weight gradient on the vdpbf16ps
 * path (as shipped), on the widening f32 path (na_cpu_bf16_force_spec) and in the
 * specification (cpu_reference.c). Each of the three is a K-term f32 sum of exact products
 * (a bf16 x bf16 product fits f32's 24 bits) in its own order, so any two agree within
 * expect_within_sum_bound: 2.1 K 2^-24 S + 2.1 u_out |y| with S the sum of |products| and
 * u_out 2^-24 (f32) or 2^-8 (bf16); the fast path must also differ from the widening path
 * somewhere (else it did not run: the orders differ). */
static void bf16_dot_case(na_conv_geom g, na_dtype out) {
    const na_dtype bf = NA_DTYPE_BF16;
    int64_t cg = g.c_in / g.groups, cog = g.c_out / g.groups, taps = (int64_t)g.kh * g.kw;
    na_view x = MK(bf, g.n, g.c_in, g.h, g.w), w = MK(bf, g.c_out, cg, g.kh, g.kw),
            b = MK(bf, g.c_out), gy = MK(bf, g.n, g.c_out, g.oh, g.ow);
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    fill_rand(&b, -1, 1);
    fill_rand(&gy, -1, 1);
    na_view ax = absolute(&x), aw = absolute(&w), ab = absolute(&b), agy = absolute(&gy);
    bool direct = na_cpu_direct_conv_usable(&g, false), data = na_cpu_direct_conv_usable(&g, true);
    na_view y[4], gx[4], gw[4]; /* fast, widening, specification, magnitudes */
    for (int v = 0; v < 4; v++) {
        y[v] = MK(out, g.n, g.c_out, g.oh, g.ow);
        gx[v] = MK(out, g.n, g.c_in, g.h, g.w);
        gw[v] = MK(out, g.c_out, cg, g.kh, g.kw);
    }
    for (int v = 0; v < 2; v++) {
        na_cpu_bf16_force_spec = v == 1;
        int rc = B->conv2d(&g, &x, &w, &b, &y[v]);
        if (!rc) rc = B->conv2d_backward_data(&g, &gy, &w, &gx[v]);
        if (!rc) rc = B->conv2d_backward_weight(&g, &x, &gy, &gw[v]);
        na_cpu_bf16_force_spec = false;
        cr_assert_eq(rc, NA_OK, "%s", na_last_error());
    }
    cr_assert_eq(na_cpu_ref_conv2d(&g, &x, &w, &b, &y[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &gy, &w, &gx[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &x, &gy, &gw[2]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d(&g, &ax, &aw, &ab, &y[3]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&g, &agy, &aw, &gx[3]), NA_OK);
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&g, &ax, &agy, &gw[3]), NA_OK);
    char what[200];
    na_view *res[3][4] = {{&y[0], &y[1], &y[2], &y[3]}, {&gx[0], &gx[1], &gx[2], &gx[3]},
                          {&gw[0], &gw[1], &gw[2], &gw[3]}};
    int64_t terms[3] = {cg * taps + 1, cog * taps, g.n * g.oh * g.ow};
    const char *names[3] = {"forward", "data gradient", "weight gradient"};
    for (int q = 0; q < 3; q++) {
        snprintf(what, sizeof what, "bf16 %s -> %s: n%lld c%lld->%lld %lldx%lld k%d s%d p%d g%d",
                 names[q], na_dtype_name(out), (long long)g.n, (long long)g.c_in,
                 (long long)g.c_out, (long long)g.h, (long long)g.w, g.kh, g.sh, g.ph, g.groups);
        na_view **r = res[q];
        expect_within_sum_bound(r[0], r[2], r[3], terms[q], what); /* fast vs specification */
        expect_within_sum_bound(r[0], r[1], r[3], terms[q], what); /* fast vs widening */
        expect_within_sum_bound(r[1], r[2], r[3], terms[q], what); /* widening vs spec */
        bool differs = false;
        for (int64_t i = 0; i < r[0]->numel && !differs; i++)
            differs = get(r[0], i) != get(r[1], i);
        /* off the direct path (horizontal stride or dilation 2, or a data gradient of vertical
         * stride 2) the widening path runs; one input channel pairs each product with a zero,
         * summed in the widening path's order; a bf16 output may round both alike */
        bool one_channel = (q == 0 ? cg : q == 1 ? cog : 2) < 2;
        cr_assert(differs || !direct || (q == 1 && !data) || one_channel || out == bf,
                  "%s: the fast path has the widening path's bits", what);
    }
    for (int v = 0; v < 4; v++) rm(&y[v]), rm(&gx[v]), rm(&gw[v]);
    rm(&x); rm(&w); rm(&b); rm(&gy); rm(&ax); rm(&aw); rm(&ab); rm(&agy);
}

/* Odd channel counts (a pair's zero half), padding, vertical stride 2 (horizontal stride 2
 * takes the GEMM path, widening), groups, several K blocks, the MNIST CNN's and ResNet-9's
 * layers (smaller batches), in f32 and bf16 outputs. */
Test(cpu_conv, bf16_dot_against_widening_path_and_specification, .timeout = 120) {
    na_conv_geom g = conv_geom(2, 3, 9, 7, 5, 3, 1, 1, 1, 1);
    if (!na_cpu_bf16_fast() || !na_cpu_direct_conv_usable(&g, false))
        cr_skip("this CPU has no AVX512_BF16 (or NANOAMP_CPU_BF16=off): widening path only");
    na_conv_geom shapes[] = {
        g,
        conv_geom(3, 7, 6, 11, 9, 3, 1, 2, 1, 1),   /* odd channels, padding past the reach */
        conv_geom(2, 5, 12, 10, 3, 3, 1, 0, 1, 1),  /* no padding */
        conv_geom(2, 6, 13, 9, 10, 5, 1, 2, 1, 2),  /* 5x5, groups of 3 */
        conv_geom(2, 9, 11, 8, 4, 2, 1, 1, 2, 1),   /* dilation 2: the GEMM path */
        conv_geom(3, 320, 5, 6, 12, 3, 1, 1, 1, 1), /* K 2880: two bf16 K blocks */
        conv_geom(2, 301, 4, 5, 7, 3, 1, 1, 1, 1),  /* two K blocks, an odd channel count */
        conv_geom(4, 1, 28, 28, 32, 3, 1, 1, 1, 1), /* MNIST CNN conv1 */
        conv_geom(4, 32, 14, 14, 64, 3, 1, 1, 1, 1), /* MNIST CNN conv2 */
        conv_geom(1, 3, 32, 32, 64, 3, 1, 1, 1, 1), /* ResNet-9's layers, one image */
        conv_geom(1, 64, 32, 32, 128, 3, 1, 1, 1, 1),
        conv_geom(1, 128, 16, 16, 256, 3, 1, 1, 1, 1),
        conv_geom(1, 256, 8, 8, 512, 3, 1, 1, 1, 1),
        conv_geom(2, 512, 4, 4, 512, 3, 1, 1, 1, 1),
    };
    na_conv_geom s2 = conv_geom(2, 5, 9, 8, 6, 3, 1, 1, 1, 1);
    s2.sh = 2, s2.oh = (s2.h + 2 - 3) / 2 + 1; /* vertical stride 2: direct but the data grad */
    bf16_dot_case(s2, NA_DTYPE_F32);
    na_conv_geom d2 = conv_geom(2, 9, 11, 8, 4, 3, 1, 2, 1, 1);
    d2.dh = 2, d2.oh = 11 + 4 - 4 - 1 + 1; /* vertical dilation 2: direct */
    bf16_dot_case(d2, NA_DTYPE_F32);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        bf16_dot_case(shapes[i], NA_DTYPE_F32);
        if (i < 9) bf16_dot_case(shapes[i], NA_DTYPE_BF16);
    }
}

/* NANOAMP_CPU_BF16=off (read once, at the first bf16 product: Criterion runs each test in a
 * process of its own) keeps the widening path: the bits of na_cpu_bf16_force_spec's. */
Test(cpu_conv, bf16_env_off_keeps_the_widening_path) {
    na_conv_geom g = conv_geom(2, 16, 9, 9, 8, 3, 1, 1, 1, 1);
    setenv("NANOAMP_CPU_BF16", "off", 1);
    cr_assert(!na_cpu_bf16_fast(), "NANOAMP_CPU_BF16=off: no vdpbf16ps");
    na_view x = MK(NA_DTYPE_BF16, g.n, g.c_in, g.h, g.w), w = MK(NA_DTYPE_BF16, 8, 16, 3, 3),
            y[2];
    fill_rand(&x, -1, 1);
    fill_rand(&w, -1, 1);
    for (int v = 0; v < 2; v++) {
        y[v] = MK(NA_DTYPE_F32, g.n, g.c_out, g.oh, g.ow);
        na_cpu_bf16_force_spec = v == 1;
        int rc = B->conv2d(&g, &x, &w, NULL, &y[v]);
        na_cpu_bf16_force_spec = false;
        cr_assert_eq(rc, NA_OK, "%s", na_last_error());
    }
    expect_same_bits(&y[0], &y[1], "NANOAMP_CPU_BF16=off against the widening path");
    rm(&x); rm(&w); rm(&y[0]); rm(&y[1]);
}

/* vdpbf16ps takes denormal inputs as zero and flushes denormal results to zero (DAZ/FTZ,
 * whatever MXCSR says); the widening path and the specification keep both, as the GPU does.
 * A 1x1 convolution of one channel (x: 2^-130 a bf16 denormal, 2^-100, 1, 2^-126 the least
 * normal) by weights 2^20 and 2^-30: 2^-130 x 2^20 = 2^-110 is lost to DAZ, and 2^-100 x 2^-30
 * = 2^-130 (an f32 denormal) to FTZ. Both only below 1.2e-38, f32's least normal. */
Test(cpu_conv, bf16_dot_flushes_denormals) {
    na_conv_geom g = conv_geom(1, 1, 1, 4, 2, 1, 1, 0, 1, 1);
    if (!na_cpu_bf16_fast() || !na_cpu_direct_conv_usable(&g, false))
        cr_skip("this CPU has no AVX512_BF16 (or NANOAMP_CPU_BF16=off): widening path only");
    na_view x = MK(NA_DTYPE_BF16, 1, 1, 1, 4), w = MK(NA_DTYPE_BF16, 2, 1, 1, 1);
    double xs[4] = {0x1p-130, 0x1p-100, 1, 0x1p-126}, ws[2] = {0x1p20, 0x1p-30};
    for (int i = 0; i < 4; i++) set(&x, i, xs[i]);
    for (int i = 0; i < 2; i++) set(&w, i, ws[i]);
    cr_assert_eq(get(&x, 0), 0x1p-130, "2^-130 is a bf16 denormal");
    /* [fast, widening][output channel][pixel] */
    double want[2][2][4] = {{{0, 0x1p-80, 0x1p20, 0x1p-106}, {0, 0, 0x1p-30, 0}},
                            {{0x1p-110, 0x1p-80, 0x1p20, 0x1p-106}, {0, 0x1p-130, 0x1p-30, 0}}};
    for (int v = 0; v < 2; v++) {
        na_view y = MK(NA_DTYPE_F32, 1, 2, 1, 4);
        na_cpu_bf16_force_spec = v == 1;
        int rc = B->conv2d(&g, &x, &w, NULL, &y);
        na_cpu_bf16_force_spec = false;
        cr_assert_eq(rc, NA_OK, "%s", na_last_error());
        for (int i = 0; i < 8; i++)
            cr_assert_eq(get(&y, i), want[v][i / 4][i % 4], "%s y[%d] = %a, want %a",
                         v ? "widening" : "vdpbf16ps", i, get(&y, i), want[v][i / 4][i % 4]);
        rm(&y);
    }
    rm(&x); rm(&w);
}

/* The weight gradient split by output channels takes as many tasks as the thread count asks
 * for (two per thread): its bits must not depend on that. A layer wide enough for the split,
 * at 1, 2, 3 and 4 threads, in f32 and in bf16 (on AVX512_BF16, the vdpbf16ps path). */
static void wgrad_rows_same_bits(na_dtype dt) {
    na_conv_geom g = conv_geom(6, 32, 16, 16, 256, 3, 1, 1, 1, 1); /* blocks of 4 images */
    na_view x = MK(dt, g.n, g.c_in, g.h, g.w), gy = MK(dt, g.n, g.c_out, g.oh, g.ow), gw[4];
    fill_rand(&x, -1, 1);
    fill_rand(&gy, -1, 1);
    int64_t keep = na_cpu_conv_block_budget;
    na_cpu_conv_block_budget = 4096; /* no room for per-image partials: split by rows */
    for (int t = 0; t < 4; t++) {
        gw[t] = MK(NA_DTYPE_F32, g.c_out, g.c_in, g.kh, g.kw);
        cr_assert_eq(na_set_num_threads(t + 1), NA_OK);
        cr_assert_eq(B->conv2d_backward_weight(&g, &x, &gy, &gw[t]), NA_OK, "%s",
                     na_last_error());
    }
    na_cpu_conv_block_budget = keep;
    na_set_num_threads(1);
    for (int t = 1; t < 4; t++) {
        char what[64];
        snprintf(what, sizeof what, "%s weight gradient at %d threads against 1",
                 na_dtype_name(dt), t + 1);
        expect_same_bits(&gw[t], &gw[0], what);
    }
    for (int t = 0; t < 4; t++) rm(&gw[t]);
    rm(&x); rm(&gy);
}

Test(cpu_conv, weight_gradient_by_rows_same_bits_at_any_thread_count) {
    na_conv_geom g = conv_geom(6, 32, 16, 16, 256, 3, 1, 1, 1, 1);
    if (!na_cpu_direct_wgrad_usable(&g))
        cr_skip("this CPU has no AVX-512F (or NANOAMP_CPU_CONV=gemm): no direct weight gradient");
    wgrad_rows_same_bits(NA_DTYPE_F32);
    wgrad_rows_same_bits(NA_DTYPE_BF16);
}

/* The specification itself, on numbers worked by hand. */
Test(cpu_reference, hand_worked_gemm_and_conv) {
    /* [1 2; 3 4]^T @ [5 6; 7 8] * 2 + 1*C + bias, relu: A^T = [1 3; 2 4] */
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {1, -200, 0, 0}, bias[2] = {0.5f, 1};
    na_gemm_args g = {.dtype = NA_DTYPE_F32, .a = a, .b = b, .c = c, .bias = bias, .ta = true,
                      .relu = true, .m = 2, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2,
                      .batch = 1, .alpha = 2, .beta = 1};
    cr_assert_eq(na_cpu_ref_gemm(&g), NA_OK);
    /* A^T B = [26 30; 38 44] */
    float want[4] = {2 * 26 + 1 + 0.5f, 0 /* 60 - 200 + 1 < 0 */, 2 * 38 + 0.5f, 2 * 44 + 1};
    for (int i = 0; i < 4; i++) cr_assert_eq(c[i], want[i], "c[%d] = %g", i, c[i]);

    /* 1 image, 1 channel 3x3, kernel 2x2 with stride 2, padding 1, dilation 1:
     * outputs (0,0) (0,1) (1,0) (1,1) read x at rows -1..0 / 1..2 and cols -1..0 / 1..2 */
    na_conv_geom cg = {.n = 1, .c_in = 1, .h = 3, .w = 3, .c_out = 1, .oh = 2, .ow = 2,
                       .kh = 2, .kw = 2, .sh = 2, .sw = 2, .ph = 1, .pw = 1, .dh = 1, .dw = 1,
                       .groups = 1};
    na_view x = MK(NA_DTYPE_F64, 1, 1, 3, 3), w = MK(NA_DTYPE_F64, 1, 1, 2, 2),
            y = MK(NA_DTYPE_F64, 1, 1, 2, 2), gx = MK(NA_DTYPE_F64, 1, 1, 3, 3),
            gw = MK(NA_DTYPE_F64, 1, 1, 2, 2);
    for (int i = 0; i < 9; i++) set(&x, i, i + 1); /* 1..9 */
    for (int i = 0; i < 4; i++) set(&w, i, 10 * (i + 1)); /* 10 20 / 30 40 */
    cr_assert_eq(na_cpu_ref_conv2d(&cg, &x, &w, NULL, &y), NA_OK);
    double wy[4] = {40 * 1, 30 * 2 + 40 * 3, 20 * 4 + 40 * 7, 10 * 5 + 20 * 6 + 30 * 8 + 40 * 9};
    for (int i = 0; i < 4; i++) cr_assert_eq(get(&y, i), wy[i], "y[%d] = %g", i, get(&y, i));
    /* adjoints with gy = 1: gx counts the taps reading each cell, gw sums the cells each tap
     * reads */
    na_view gy = MK(NA_DTYPE_F64, 1, 1, 2, 2);
    for (int i = 0; i < 4; i++) set(&gy, i, 1);
    cr_assert_eq(na_cpu_ref_conv2d_backward_data(&cg, &gy, &w, &gx), NA_OK);
    double wgx[9] = {40, 30, 40, 20, 10, 20, 40, 30, 40};
    for (int i = 0; i < 9; i++) cr_assert_eq(get(&gx, i), wgx[i], "gx[%d] = %g", i, get(&gx, i));
    cr_assert_eq(na_cpu_ref_conv2d_backward_weight(&cg, &x, &gy, &gw), NA_OK);
    double wgw[4] = {5, 6 + 4, 8 + 2, 9 + 7 + 3 + 1};
    for (int i = 0; i < 4; i++) cr_assert_eq(get(&gw, i), wgw[i], "gw[%d] = %g", i, get(&gw, i));
    rm(&x); rm(&w); rm(&y); rm(&gx); rm(&gw); rm(&gy);
}

/* ---- pooling ------------------------------------------------------------------------------ */

Test(cpu_pool, max_pool_forward_backward) {
    na_conv_geom g = conv_geom(2, 3, 7, 6, 3, 3, 2, 1, 1, 1);
    na_view x = MK(NA_DTYPE_F32, 2, 3, 7, 6), y = MK(NA_DTYPE_F32, 2, 3, g.oh, g.ow),
              idx = MK(NA_DTYPE_I32, 2, 3, g.oh, g.ow), gy = MK(NA_DTYPE_F32, 2, 3, g.oh, g.ow),
              gx = MK(NA_DTYPE_F32, 2, 3, 7, 6);
    fill_rand(&x, -3, -1); /* all negative: a padded zero must not win */
    set(&x, 0, get(&x, 1)); /* a tie inside one window */
    fill_rand(&gy, -1, 1);
    fill_rand(&gx, 5, 6);
    cr_assert_eq(B->max_pool2d(&g, &x, &y, &idx), NA_OK);
    cr_assert_eq(B->max_pool2d_backward(&g, &gy, &idx, &gx), NA_OK);
    double *gxw = calloc((size_t)x.numel, sizeof(double));
    for (int64_t pl = 0; pl < 6; pl++)
        for (int64_t oy = 0; oy < g.oh; oy++)
            for (int64_t ox = 0; ox < g.ow; ox++) {
                double m = -INFINITY;
                int64_t mi = -1;
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++) {
                        int64_t iy = oy * 2 - 1 + i, ix = ox * 2 - 1 + j;
                        if (iy < 0 || iy >= 7 || ix < 0 || ix >= 6) continue;
                        double v = get(&x, pl * 42 + iy * 6 + ix);
                        if (v > m) { m = v; mi = iy * 6 + ix; }
                    }
                int64_t o = (pl * g.oh + oy) * g.ow + ox;
                cr_assert_eq(get(&y, o), m);
                cr_assert_eq(get(&idx, o), mi);
                gxw[pl * 42 + mi] += get(&gy, o);
            }
    expect_close_arr(&gx, gxw, 1e-6, 0, "max_pool backward");
    /* f16 / f64 give the same indices */
    na_view xh = MK(NA_DTYPE_F64, 2, 3, 7, 6), yh = MK(NA_DTYPE_F64, 2, 3, g.oh, g.ow),
              ih = MK(NA_DTYPE_I32, 2, 3, g.oh, g.ow);
    for (int64_t i = 0; i < x.numel; i++) set(&xh, i, get(&x, i));
    cr_assert_eq(B->max_pool2d(&g, &xh, &yh, &ih), NA_OK);
    expect_same_bits(&ih, &idx, "max_pool f64 idx");
    free(gxw);
    rm(&x); rm(&y); rm(&idx); rm(&gy); rm(&gx); rm(&xh); rm(&yh); rm(&ih);
}

/* The 2x2 stride-2 path against the generic window loop (its specification), bit for bit:
 * values from a small set so windows hold ties, signed zeros, infinities and NaNs of both
 * signs (the first NaN in window order wins, so its sign shows which one did). */
Test(cpu_pool, max_pool_2x2_same_bits_and_indices_as_generic) {
    const double vals[] = {-1, 0, -0.0, 1, 2, 2, INFINITY, -INFINITY, NAN, -NAN};
    /* vector blocks of 4 (SSE2), 8 (AVX2 halves) and 16 (AVX-512) windows, and their tails */
    const int64_t shapes[][4] = {{2, 3, 6, 8}, {1, 2, 7, 9}, {3, 1, 2, 2}, {1, 1, 5, 2},
                                 {2, 2, 4, 15}, {1, 2, 4, 33}, {1, 1, 2, 34}, {2, 1, 4, 70},
                                 {1, 2, 4, 12}, {2, 1, 3, 26}, {1, 1, 2, 28}};
    const na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F64, NA_DTYPE_F16, NA_DTYPE_BF16};
    int nan_windows = 0, later_ties = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
            const int64_t *xs = shapes[s];
            na_conv_geom g = conv_geom(xs[0], xs[1], xs[2], xs[3], xs[1], 2, 2, 0, 1, 1);
            na_view x = MK(dts[t], xs[0], xs[1], xs[2], xs[3]);
            na_view y[3], idx[2];
            for (int k = 0; k < 3; k++) y[k] = MK(dts[t], xs[0], xs[1], g.oh, g.ow);
            for (int k = 0; k < 2; k++) idx[k] = MK(NA_DTYPE_I32, xs[0], xs[1], g.oh, g.ow);
            for (int64_t i = 0; i < x.numel; i++)
                set(&x, i, vals[(int)(urand() * (sizeof vals / sizeof vals[0]))]);
            na_cpu_pool_force_generic = true;
            cr_assert_eq(B->max_pool2d(&g, &x, &y[0], &idx[0]), NA_OK);
            na_cpu_pool_force_generic = false;
            /* halves: AVX-512 or AVX2 where the CPU has them, then AVX2 preferred */
            for (int pref = 0; pref < 2; pref++) {
                na_cpu_half_avx2_prefer = pref;
                cr_assert_eq(B->max_pool2d(&g, &x, &y[1], &idx[1]), NA_OK);
                cr_assert_eq(B->max_pool2d(&g, &x, &y[2], NULL), NA_OK);
                na_cpu_half_avx2_prefer = false;
                expect_same_bits(&y[1], &y[0], "2x2 max_pool y");
                expect_same_bits(&idx[1], &idx[0], "2x2 max_pool idx");
                expect_same_bits(&y[2], &y[0], "2x2 max_pool y without idx");
            }
            int64_t HW = xs[2] * xs[3], P = g.oh * g.ow;
            for (int64_t o = 0; o < y[0].numel; o++) { /* what the inputs exercised */
                int64_t pl = o / P, p = o % P, at = pl * HW + (p / g.ow) * 2 * xs[3] + p % g.ow * 2;
                nan_windows += isnan(get(&y[0], o));
                later_ties += get(&idx[0], o) != at - pl * HW && get(&x, at) == get(&y[0], o);
            }
            for (int k = 0; k < 3; k++) rm(&y[k]);
            for (int k = 0; k < 2; k++) rm(&idx[k]);
            rm(&x);
        }
    cr_assert(nan_windows > 10 && later_ties == 0, "NaN windows %d, ties won late %d",
              nan_windows, later_ties);
}

/* The 2x2 backward on f16/bf16 gy and gx, which scatters the halves without an f32 plane,
 * against the generic path (0 + gy in f32, rounded), bit for bit: gradients with signed zeros,
 * infinities, subnormals and NaNs with payloads of both signs; indices from the forward, and
 * planes whose indices leave their windows (two outputs on one input, summed by the f32 path)
 * or the plane (skipped). */
Test(cpu_pool, max_pool_2x2_backward_half_same_bits_as_generic) {
    const uint16_t f16_bits[] = {0x8000, 0x0000, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x7D01, 0xFE37,
                                 0x7E00, 0x3C00};
    const uint16_t bf16_bits[] = {0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x807F, 0x7F81, 0xFFC1,
                                  0x7FC0, 0x3F80};
    /* rows of up to 8 windows run two rows a step: 8 (16 lanes), 7, 4, 1; odd rows left */
    const int64_t shapes[][4] = {{2, 3, 6, 8}, {1, 2, 7, 9}, {3, 1, 2, 2}, {1, 1, 5, 2},
                                 {2, 2, 28, 28}, {1, 2, 14, 15}, {1, 2, 6, 16}, {2, 1, 5, 17},
                                 {1, 1, 4, 18}, {1, 2, 9, 66}, {2, 2, 14, 14}};
    const na_dtype dts[] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int t = 0; t < 2; t++)
            for (int corrupt = 0; corrupt < 2; corrupt++) {
                const int64_t *xs = shapes[sh];
                na_conv_geom g = conv_geom(xs[0], xs[1], xs[2], xs[3], xs[1], 2, 2, 0, 1, 1);
                na_view x = MK(dts[t], xs[0], xs[1], xs[2], xs[3]);
                na_view y = MK(dts[t], xs[0], xs[1], g.oh, g.ow);
                na_view idx = MK(NA_DTYPE_I32, xs[0], xs[1], g.oh, g.ow);
                na_view gy = MK(dts[t], xs[0], xs[1], g.oh, g.ow), gx[3];
                fill_rand(&x, -1, 1);
                fill_rand(&gy, -2, 2);
                for (int64_t i = 0; i < gy.numel; i++)
                    if (urand() < 0.3) {
                        int k = (int)(urand() * 10);
                        ((uint16_t *)gy.data)[i] = t ? bf16_bits[k] : f16_bits[k];
                    }
                cr_assert_eq(B->max_pool2d(&g, &x, &y, &idx), NA_OK);
                int64_t P = g.oh * g.ow, HW = xs[2] * xs[3];
                if (corrupt && P > 1) {
                    int32_t *iv = idx.data;
                    iv[1] = iv[0];                  /* plane 0: two outputs on one input */
                    iv[idx.numel - 1] = (int32_t)HW; /* the last plane: outside it, skipped */
                    if (idx.numel > P) iv[P] = -1;  /* plane 1: skipped */
                }
                /* v 0: the CPU's half path (AVX-512 or AVX2), 1: the generic one, 2: AVX2
                 * preferred (the AVX2 path on an AVX-512 machine) */
                for (int v = 0; v < 3; v++) {
                    gx[v] = MK(dts[t], xs[0], xs[1], xs[2], xs[3]);
                    fill_rand(&gx[v], 5, 6); /* every element is written */
                    na_cpu_pool_force_generic = v == 1;
                    na_cpu_half_avx2_prefer = v == 2;
                    cr_assert_eq(B->max_pool2d_backward(&g, &gy, &idx, &gx[v]), NA_OK);
                    na_cpu_pool_force_generic = false;
                    na_cpu_half_avx2_prefer = false;
                }
                char msg[96];
                snprintf(msg, sizeof msg, "2x2 max_pool backward %s [%lld %lld %lld %lld] %d",
                         na_dtype_name(dts[t]), (long long)xs[0], (long long)xs[1],
                         (long long)xs[2], (long long)xs[3], corrupt);
                expect_same_bits(&gx[0], &gx[1], msg);
                expect_same_bits(&gx[2], &gx[1], msg);
                rm(&x); rm(&y); rm(&idx); rm(&gy); rm(&gx[0]); rm(&gx[1]); rm(&gx[2]);
            }
}

Test(cpu_pool, avg_pool_count_include_pad) {
    for (int cip = 0; cip < 2; cip++) {
        na_conv_geom g = conv_geom(1, 2, 5, 5, 2, 3, 2, 1, 1, 1);
        g.count_include_pad = cip;
        na_view x = MK(NA_DTYPE_F64, 1, 2, 5, 5), y = MK(NA_DTYPE_F64, 1, 2, g.oh, g.ow),
                  gy = MK(NA_DTYPE_F64, 1, 2, g.oh, g.ow), gx = MK(NA_DTYPE_F64, 1, 2, 5, 5);
        fill_rand(&x, -1, 1);
        fill_rand(&gy, -1, 1);
        cr_assert_eq(B->avg_pool2d(&g, &x, &y), NA_OK);
        cr_assert_eq(B->avg_pool2d_backward(&g, &gy, &gx), NA_OK);
        double gxw[50] = {0};
        for (int pl = 0; pl < 2; pl++)
            for (int oy = 0; oy < g.oh; oy++)
                for (int ox = 0; ox < g.ow; ox++) {
                    double s = 0;
                    int cnt = 0;
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 3; j++) {
                            int iy = oy * 2 - 1 + i, ix = ox * 2 - 1 + j;
                            if (iy < 0 || iy >= 5 || ix < 0 || ix >= 5) continue;
                            s += get(&x, pl * 25 + iy * 5 + ix);
                            cnt++;
                        }
                    double div = cip ? 9 : cnt;
                    int o = (pl * g.oh + oy) * g.ow + ox;
                    cr_assert(fabs(get(&y, o) - s / div) < 1e-14);
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 3; j++) {
                            int iy = oy * 2 - 1 + i, ix = ox * 2 - 1 + j;
                            if (iy < 0 || iy >= 5 || ix < 0 || ix >= 5) continue;
                            gxw[pl * 25 + iy * 5 + ix] += get(&gy, o) / div;
                        }
                }
        expect_close_arr(&gx, gxw, 1e-14, 0, "avg_pool backward");
        /* corner output (0, 0) covers 4 cells inside, 9 with padding */
        double corner = (get(&x, 0) + get(&x, 1) + get(&x, 5) + get(&x, 6)) / (cip ? 9 : 4);
        cr_assert(fabs(get(&y, 0) - corner) < 1e-14);
        rm(&x); rm(&y); rm(&gy); rm(&gx);
    }
}

/* ---- batch norm --------------------------------------------------------------------------- */

Test(cpu_batchnorm, train_running_stats_hand_numbers) {
    /* N = 2, C = 1, S = 2: x = {1, 2, 3, 6}: mean 3, biased var 3.5, unbiased 14/3 */
    na_view x = MK(NA_DTYPE_F32, 2, 1, 2), y = MK(NA_DTYPE_F32, 2, 1, 2), gam = MK(NA_DTYPE_F32, 1),
              bet = MK(NA_DTYPE_F32, 1), rm_ = MK(NA_DTYPE_F32, 1), rv = MK(NA_DTYPE_F32, 1),
              sm = MK(NA_DTYPE_F32, 1), si = MK(NA_DTYPE_F32, 1);
    double xv[4] = {1, 2, 3, 6};
    for (int i = 0; i < 4; i++) set(&x, i, xv[i]);
    set(&gam, 0, 2); set(&bet, 0, 0.5); set(&rm_, 0, 0); set(&rv, 0, 1);
    cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, &rm_, &rv, &y, &sm, &si, 2, 1, 2, 0.1, 1e-5, false),
                 NA_OK);
    double invstd = 1 / sqrt(3.5 + 1e-5);
    cr_assert(fabs(get(&sm, 0) - 3) < 1e-6);
    cr_assert(fabs(get(&si, 0) - invstd) < 1e-6);
    cr_assert(fabs(get(&rm_, 0) - 0.3) < 1e-6, "running mean %g", get(&rm_, 0));
    cr_assert(fabs(get(&rv, 0) - (0.9 + 0.1 * 14.0 / 3.0)) < 1e-6, "running var %g", get(&rv, 0));
    for (int i = 0; i < 4; i++)
        cr_assert(fabs(get(&y, i) - ((xv[i] - 3) * invstd * 2 + 0.5)) < 1e-5);
    /* relu fused: the same values with the negative ones (x = 1, 2) cut to 0 */
    cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, NULL, NULL, &y, &sm, &si, 2, 1, 2, 0.1, 1e-5,
                                     true), NA_OK);
    for (int i = 0; i < 4; i++)
        cr_assert(fabs(get(&y, i) - fmax(0, (xv[i] - 3) * invstd * 2 + 0.5)) < 1e-5, "relu y[%d]", i);
    cr_assert_eq(get(&y, 0), 0);
    /* without running stats or affine */
    cr_assert_eq(B->batch_norm_train(&x, NULL, NULL, NULL, NULL, &y, &sm, &si, 2, 1, 2, 0.1, 1e-5, false),
                 NA_OK);
    for (int i = 0; i < 4; i++) cr_assert(fabs(get(&y, i) - (xv[i] - 3) * invstd) < 1e-5);
    rm(&x); rm(&y); rm(&gam); rm(&bet); rm(&rm_); rm(&rv); rm(&sm); rm(&si);
}

/* y and grads of batch norm in double by hand, for [N, C, S] */
static void check_bn(na_dtype dt, int64_t n, int64_t c, int64_t s, double tol) {
    na_dtype pdt = dt == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    na_view x = MK(dt, n, c, s), y = MK(dt, n, c, s), gy = MK(dt, n, c, s), gx = MK(dt, n, c, s),
              gam = MK(pdt, c), bet = MK(pdt, c), rm_ = MK(pdt, c), rv = MK(pdt, c),
              sm = MK(pdt, c), si = MK(pdt, c), gg = MK(pdt, c), gb = MK(pdt, c);
    fill_rand(&x, -2, 3);
    fill_rand(&gy, -1, 1);
    fill_rand(&gam, 0.5, 1.5);
    fill_rand(&bet, -1, 1);
    fill_rand(&rm_, -0.5, 0.5);
    fill_rand(&rv, 0.5, 2);
    double *rm0 = malloc(c * sizeof(double)), *rv0 = malloc(c * sizeof(double));
    for (int64_t ch = 0; ch < c; ch++) { rm0[ch] = get(&rm_, ch); rv0[ch] = get(&rv, ch); }
    cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, &rm_, &rv, &y, &sm, &si, n, c, s, 0.1, 1e-5, false),
                 NA_OK);
    cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &sm, &si, &gx, &gg, &gb, n, c, s, true, NULL),
                 NA_OK);
    int64_t M = n * s;
    for (int64_t ch = 0; ch < c; ch++) {
        double mean = 0, var = 0, sg = 0, sgx = 0;
        for (int64_t a = 0; a < n; a++)
            for (int64_t i = 0; i < s; i++) mean += get(&x, (a * c + ch) * s + i) / M;
        for (int64_t a = 0; a < n; a++)
            for (int64_t i = 0; i < s; i++) {
                double d = get(&x, (a * c + ch) * s + i) - mean;
                var += d * d / M;
            }
        double is = 1 / sqrt(var + 1e-5), gm = get(&gam, ch), bt = get(&bet, ch);
        cr_assert(fabs(get(&sm, ch) - mean) < tol);
        cr_assert(fabs(get(&si, ch) - is) < tol * is);
        cr_assert(fabs(get(&rm_, ch) - (0.9 * rm0[ch] + 0.1 * mean)) < tol);
        cr_assert(fabs(get(&rv, ch) - (0.9 * rv0[ch] + 0.1 * var * M / (M - 1))) < tol * 10);
        for (int64_t a = 0; a < n; a++)
            for (int64_t i = 0; i < s; i++) {
                int64_t k = (a * c + ch) * s + i;
                double xh = (get(&x, k) - mean) * is;
                cr_assert(fabs(get(&y, k) - (xh * gm + bt)) < tol * 10, "bn y");
                sg += get(&gy, k);
                sgx += get(&gy, k) * xh;
            }
        cr_assert(fabs(get(&gg, ch) - sgx) < tol * M, "ggamma %g vs %g", get(&gg, ch), sgx);
        cr_assert(fabs(get(&gb, ch) - sg) < tol * M);
        for (int64_t a = 0; a < n; a++)
            for (int64_t i = 0; i < s; i++) {
                int64_t k = (a * c + ch) * s + i;
                double xh = (get(&x, k) - mean) * is;
                double want = (get(&gy, k) - sg / M - xh * sgx / M) * is * gm;
                cr_assert(fabs(get(&gx, k) - want) < tol * 10, "bn gx %g vs %g", get(&gx, k), want);
            }
    }
    /* eval forward and eval backward */
    cr_assert_eq(B->batch_norm_eval(&x, &gam, &bet, &rm_, &rv, &y, n, c, s, 1e-5, false), NA_OK);
    na_view eis = MK(pdt, c);
    for (int64_t ch = 0; ch < c; ch++) set(&eis, ch, 1 / sqrt(get(&rv, ch) + 1e-5));
    cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &rm_, &eis, &gx, &gg, NULL, n, c, s, false, NULL),
                 NA_OK);
    for (int64_t ch = 0; ch < c; ch++) {
        double is = 1 / sqrt(get(&rv, ch) + 1e-5), sgx = 0;
        for (int64_t a = 0; a < n; a++)
            for (int64_t i = 0; i < s; i++) {
                int64_t k = (a * c + ch) * s + i;
                double xh = (get(&x, k) - get(&rm_, ch)) * is;
                cr_assert(fabs(get(&y, k) - (xh * get(&gam, ch) + get(&bet, ch))) < tol * 10);
                cr_assert(fabs(get(&gx, k) - get(&gy, k) * is * get(&gam, ch)) < tol * 10);
                sgx += get(&gy, k) * xh;
            }
        cr_assert(fabs(get(&gg, ch) - sgx) < tol * M);
    }
    free(rm0); free(rv0);
    rm(&x); rm(&y); rm(&gy); rm(&gx); rm(&gam); rm(&bet); rm(&rm_); rm(&rv); rm(&sm); rm(&si);
    rm(&gg); rm(&gb); rm(&eis);
}

/* SyncBatchNorm's kernels: batch_norm_train without y (the statistics only) gives the
 * statistics of the full call, and batch_norm_backward_elemt with the sums batch_norm_backward
 * made gives its gx bit for bit (both through na_bn_grad), fused ReLU or not; with the sums of
 * two ranks holding the same batch (twice the sums over twice the count) the same gx again,
 * and against the f64 formula over the sums given. */
static void check_bn_elemt(na_dtype dt, int64_t n, int64_t c, int64_t s, bool relu) {
    na_dtype pdt = dt == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    na_cpu_half_avx2_prefer = true; /* the AVX2 loops on an AVX-512 CPU too */
    na_view x = MK(dt, n, c, s), y = MK(dt, n, c, s), gy = MK(dt, n, c, s), gx = MK(dt, n, c, s),
            gx2 = MK(dt, n, c, s), gam = MK(pdt, c), bet = MK(pdt, c), sm = MK(pdt, c),
            si = MK(pdt, c), sm2 = MK(pdt, c), si2 = MK(pdt, c), gg = MK(pdt, c), gb = MK(pdt, c);
    fill_rand(&x, -2, 3);
    fill_rand(&gy, -1, 1);
    fill_rand(&gam, 0.5, 1.5);
    fill_rand(&bet, -1, 1);
    cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, NULL, NULL, &y, &sm, &si, n, c, s, 0.1,
                                     1e-5, relu), NA_OK);
    cr_assert_eq(B->batch_norm_train(&x, NULL, NULL, NULL, NULL, NULL, &sm2, &si2, n, c, s, 0.1,
                                     1e-5, false), NA_OK);
    expect_same_bits(&sm, &sm2, "mean without y");
    expect_same_bits(&si, &si2, "invstd without y");
    const na_view *ry = relu ? &y : NULL;
    cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &sm, &si, &gx, &gg, &gb, n, c, s, true, ry),
                 NA_OK);
    cr_assert_eq(B->batch_norm_backward_elemt(&x, &gy, &gam, &sm, &si, &gb, &gg, n * s, &gx2, n,
                                              c, s, ry), NA_OK);
    expect_same_bits(&gx, &gx2, "batch_norm_backward_elemt gx");
    for (int64_t ch = 0; ch < c; ch++) {
        set(&gb, ch, 2 * get(&gb, ch));
        set(&gg, ch, 2 * get(&gg, ch));
    }
    cr_assert_eq(B->batch_norm_backward_elemt(&x, &gy, &gam, &sm, &si, &gb, &gg, 2 * n * s, &gx2,
                                              n, c, s, ry), NA_OK);
    expect_same_bits(&gx, &gx2, "batch_norm_backward_elemt gx, two ranks' sums");
    /* f16: gx's own rounding (2^-11 relative, values below 5) */
    double tol = dt == NA_DTYPE_F64 ? 1e-12 : dt == NA_DTYPE_F16 ? 2.5e-4 : 2e-6;
    for (int64_t k = 0; k < x.numel; k++) {
        int64_t ch = k / s % c;
        double is = get(&si, ch), g = get(&gy, k) * (relu && !(get(&y, k) > 0) ? 0 : 1);
        double want = (g - get(&gb, ch) / (2 * n * s) -
                       (get(&x, k) - get(&sm, ch)) * is * get(&gg, ch) / (2 * n * s)) *
                      is * get(&gam, ch);
        cr_assert(fabs(get(&gx2, k) - want) < tol * 10, "elemt gx %g vs %g", get(&gx2, k), want);
    }
    cr_assert_eq(B->batch_norm_backward_elemt(&x, &gy, &gam, &sm, &si, &gb, &gg, 0, &gx2, n, c, s,
                                              ry), NA_EINVAL);
    cr_assert(strstr(na_last_error(), "cpu_batch_norm_backward_elemt"), "%s", na_last_error());
    rm(&x); rm(&y); rm(&gy); rm(&gx); rm(&gx2); rm(&gam); rm(&bet); rm(&sm); rm(&si); rm(&sm2);
    rm(&si2); rm(&gg); rm(&gb);
}

Test(cpu_batchnorm, statistics_only_and_backward_elemt_with_given_sums) {
    for (int relu = 0; relu < 2; relu++) {
        check_bn_elemt(NA_DTYPE_F64, 4, 3, 50, relu);
        check_bn_elemt(NA_DTYPE_F32, 8, 5, 1100, relu); /* S > one chunk */
        check_bn_elemt(NA_DTYPE_F32, 16, 3, 1, relu);   /* BatchNorm1d */
        check_bn_elemt(NA_DTYPE_F16, 4, 3, 300, relu);  /* widened rows in the sums' pass */
    }
}

/* batch_norm_relu_backward_x (SyncBatchNorm + ReLU): relu'(y) recomputed from x gives
 * batch_norm_backward's sums (gx NULL) and batch_norm_backward_elemt's gx from given sums bit
 * for bit, against the y that batch_norm_eval writes with the same mean, variance, eps, gamma
 * and beta; where that y is exactly 0 (x at the mean, beta 0) and where x is NaN too (both
 * masks: the sums' lets NaN through, the gx pass's does not, as cpu_batchnorm.c's). gamma and
 * beta NULL (affine off) too. f16 x: the same, with the y that rounded to 0 (at most 2^-25);
 * bf16 x: at most 2^-134 (x 1 to 4 times 2^-133, y 0.6 to 2.4 times 2^-134). Both builds:
 * the AVX2 + F16C loops in memory order, where the CPU has them, and the chunked loops
 * (na_cpu_syncbn_avx2_off), each against the y path. */
static void check_bn_relu_from_x(na_dtype dt, int64_t n, int64_t c, int64_t s, bool affine) {
    na_dtype pdt = dt == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    na_cpu_half_avx2_prefer = true; /* the AVX2 loops on an AVX-512 CPU too */
    na_view x = MK(dt, n, c, s), y = MK(dt, n, c, s), gy = MK(dt, n, c, s), gx = MK(dt, n, c, s),
            gx2 = MK(dt, n, c, s), gam = MK(pdt, c), bet = MK(pdt, c), sm = MK(pdt, c),
            var = MK(pdt, c), si = MK(pdt, c), gg = MK(pdt, c), gb = MK(pdt, c),
            gg2 = MK(pdt, c), gb2 = MK(pdt, c);
    fill_rand(&x, -2, 3);
    fill_rand(&gy, -1, 1);
    fill_rand(&gam, 0.5, 1.5);
    fill_rand(&bet, -1, 1);
    fill_rand(&sm, 0, 1);
    fill_rand(&var, 0.5, 2);
    /* channel 0: mean 0, beta 0 and the scale 0.3 (about), some x at the mean (y exactly 0)
     * and some 1 to 4 times 2^-24 (bf16: 2^-133), whose y (0.3 to 1.2 times that) rounds to
     * 0 in f16 at 1 and not above (bf16: 0.6 to 2.4 times 2^-134, to 0 at 1 only) */
    set(&bet, 0, 0);
    set(&sm, 0, 0);
    set(&gam, 0, 0.3 * sqrt(get(&var, 0) + 1e-5));
    int tiny = dt == NA_DTYPE_BF16 ? -133 : -24; /* the least half subnormal */
    for (int64_t k = 0; k < n * s; k += 3)
        set(&x, (k / s * c) * s + k % s, k % 2 ? 0 : ldexp(1 + (double)(k % 4), tiny));
    if (c > 1) set(&x, (n - 1) * c * s + s + s / 2, NAN);
    for (int64_t ch = 0; ch < c; ch++) set(&si, ch, 1 / sqrt(get(&var, ch) + 1e-5));
    const na_view *g = affine ? &gam : NULL, *b = affine ? &bet : NULL;
    cr_assert_eq(B->batch_norm_eval(&x, g, b, &sm, &var, &y, n, c, s, 1e-5, true), NA_OK);
    /* batch_norm_eval_rows: the same y bit for bit, with and without the ReLU (f64, or the
     * AVX2 loops off: not done) */
    for (int relu = 0; relu < 2; relu++)
        for (int off = 0; off < 2; off++) {
            na_cpu_syncbn_avx2_off = off;
            bool done = false;
            cr_assert_eq(B->batch_norm_eval(&x, g, b, &sm, &var, &gx, n, c, s, 1e-5, relu), NA_OK);
            fill_rand(&gx2, -1, 1);
            cr_assert_eq(B->batch_norm_eval_rows(&x, g, b, &sm, &var, &gx2, n, c, s, 1e-5, relu,
                                                 &done), NA_OK);
            cr_assert(done == (!off && dt != NA_DTYPE_F64 && na_cpu_use_avx2()),
                      "eval_rows done %d", done);
            char what[96];
            snprintf(what, sizeof what, "eval_rows' y, %s relu %d [%lld, %lld, %lld]",
                     na_dtype_name(dt), relu, (long long)n, (long long)c, (long long)s);
            if (done) expect_same_bits(&gx2, &gx, what);
        }
    na_cpu_syncbn_avx2_off = false;
    int64_t zeros = 0;
    for (int64_t k = 0; k < x.numel; k++) zeros += get(&y, k) == 0;
    cr_assert(zeros > x.numel / 4, "%lld of y's %lld are 0", (long long)zeros, (long long)x.numel);
    cr_assert_eq(B->batch_norm_backward(&x, &gy, g, &sm, &si, NULL, &gg, &gb, n, c, s, false, &y),
                 NA_OK);
    for (int64_t ch = 0; ch < c; ch++) { /* the sums over two ranks, for the gx pass */
        set(&gb2, ch, 2 * get(&gb, ch) + 0.25);
        set(&gg2, ch, 2 * get(&gg, ch) - 0.5);
    }
    cr_assert_eq(B->batch_norm_backward_elemt(&x, &gy, g, &sm, &si, &gb2, &gg2, 2 * n * s, &gx,
                                              n, c, s, &y), NA_OK);
    na_view sg = MK(pdt, c), sgx = MK(pdt, c);
    for (int off = 0; off < 2; off++) {
        na_cpu_syncbn_avx2_off = off;
        const char *path = off ? "chunked loops" : "AVX2 loops";
        char what[128];
        bool done = false;
        cr_assert_eq(B->batch_norm_relu_backward_x(&x, &gy, g, b, &sm, &var, 1e-5, &si, NULL, NULL,
                                                   0, NULL, &sgx, &sg, n, c, s, &done), NA_OK);
        cr_assert(done, "%s x: done", na_dtype_name(dt));
        snprintf(what, sizeof what, "%s, %s %s [%lld, %lld, %lld]", "sum(gy * xhat), relu' from x",
                 na_dtype_name(dt), path, (long long)n, (long long)c, (long long)s);
        expect_same_bits(&sgx, &gg, what);
        snprintf(what, sizeof what, "%s, %s %s [%lld, %lld, %lld]", "sum(gy), relu' from x",
                 na_dtype_name(dt), path, (long long)n, (long long)c, (long long)s);
        expect_same_bits(&sg, &gb, what);
        done = false;
        cr_assert_eq(B->batch_norm_relu_backward_x(&x, &gy, g, b, &sm, &var, 1e-5, &si, &gb2, &gg2,
                                                   2 * n * s, &gx2, NULL, NULL, n, c, s, &done),
                     NA_OK);
        cr_assert(done, "%s x: done", na_dtype_name(dt));
        snprintf(what, sizeof what, "%s, %s %s [%lld, %lld, %lld]", "gx, relu' from x",
                 na_dtype_name(dt), path, (long long)n, (long long)c, (long long)s);
        expect_same_bits(&gx2, &gx, what);
        cr_assert_eq(B->batch_norm_relu_backward_x(&x, &gy, g, b, &sm, &var, 1e-5, &si, NULL, &gg,
                                                   2 * n * s, &gx2, NULL, NULL, n, c, s, &done),
                     NA_EINVAL);
        cr_assert(strstr(na_last_error(), "cpu_batch_norm_relu_backward_x"), "%s",
                  na_last_error());
    }
    na_cpu_syncbn_avx2_off = false, na_cpu_half_avx2_prefer = false;
    rm(&sg); rm(&sgx);
    rm(&x); rm(&y); rm(&gy); rm(&gx); rm(&gx2); rm(&gam); rm(&bet); rm(&sm); rm(&var); rm(&si);
    rm(&gg); rm(&gb); rm(&gg2); rm(&gb2);
}

Test(cpu_batchnorm, relu_backward_from_x_is_backward_and_elemt_with_y) {
    for (int affine = 0; affine < 2; affine++) {
        check_bn_relu_from_x(NA_DTYPE_F64, 4, 3, 50, affine);
        check_bn_relu_from_x(NA_DTYPE_F32, 8, 5, 1100, affine); /* S > one chunk */
        check_bn_relu_from_x(NA_DTYPE_F32, 5, 3, 131, affine);  /* halves, an 8-lane tail */
        check_bn_relu_from_x(NA_DTYPE_F32, 16, 3, 1, affine);   /* BatchNorm1d, channels-last */
    }
    check_bn_relu_from_x(NA_DTYPE_F32, 3, 40, 37, true);    /* channel blocks, 5-lane tails */
    check_bn_relu_from_x(NA_DTYPE_F32, 64, 36, 20, false);  /* several tasks per pass */
    for (int h = 0; h < 2; h++) {
        na_dtype dt = h ? NA_DTYPE_BF16 : NA_DTYPE_F16;
        check_bn_relu_from_x(dt, 4, 3, 300, true); /* y 0 up to 2^-25 (f16), 2^-134 (bf16) */
        check_bn_relu_from_x(dt, 2, 2, 1100, false);
        check_bn_relu_from_x(dt, 5, 3, 131, true);
        check_bn_relu_from_x(dt, 3, 40, 37, true);
        check_bn_relu_from_x(dt, 16, 3, 1, true);
        check_bn_relu_from_x(dt, 64, 36, 20, false);
        check_bn_relu_from_x(dt, 16, 8, 4096, true); /* gx rounding ties */
    }
}

Test(cpu_batchnorm, train_eval_backward_vs_hand_loops) {
    check_bn(NA_DTYPE_F64, 4, 3, 50, 1e-12);
    check_bn(NA_DTYPE_F32, 8, 5, 1100, 2e-6); /* S > one chunk */
    check_bn(NA_DTYPE_F32, 16, 3, 1, 2e-6);   /* BatchNorm1d */
}

/* The backward's sums follow the documented order bit for bit: per (n, c) row a pairwise
 * na_cpu_sum of gy' = gy * relu'(y) (gy alone unfused) and of gy' * xhat, rows added in n
 * order by a pairwise counter. Rows of 1000 (past the 128-element leaves, with a tail). */
Test(cpu_batchnorm, backward_sums_in_the_documented_order) {
    const int64_t n = 5, c = 3, s = 1003;
    for (int fused = 0; fused < 2; fused++) {
        na_view x = MK(NA_DTYPE_F32, n, c, s), y = MK(NA_DTYPE_F32, n, c, s),
                gy = MK(NA_DTYPE_F32, n, c, s), gx = MK(NA_DTYPE_F32, n, c, s),
                gam = MK(NA_DTYPE_F32, c), bet = MK(NA_DTYPE_F32, c), sm = MK(NA_DTYPE_F32, c),
                si = MK(NA_DTYPE_F32, c), gg = MK(NA_DTYPE_F32, c), gb = MK(NA_DTYPE_F32, c);
        fill_rand(&x, -2, 3);
        fill_rand(&gy, -1, 1);
        fill_rand(&gam, 0.5, 1.5);
        fill_rand(&bet, -1, 1);
        cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, NULL, NULL, &y, &sm, &si, n, c, s, 0.1,
                                         1e-5, fused), NA_OK);
        cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &sm, &si, &gx, &gg, &gb, n, c, s, true,
                                            fused ? &y : NULL), NA_OK);
        float *t1 = malloc(s * sizeof(float)), *t2 = malloc(s * sizeof(float));
        for (int64_t ch = 0; ch < c; ch++) {
            float mean = (float)get(&sm, ch), invstd = (float)get(&si, ch);
            na_cpu_psum_f a1 = {{0}, 0}, a2 = {{0}, 0};
            for (int64_t a = 0; a < n; a++) {
                const float *xr = (const float *)x.data + (a * c + ch) * s;
                const float *gr = (const float *)gy.data + (a * c + ch) * s;
                const float *yr = (const float *)y.data + (a * c + ch) * s;
                for (int64_t i = 0; i < s; i++) {
                    t1[i] = fused ? gr[i] * (yr[i] > 0 ? 1.0f : 0.0f) : gr[i];
                    t2[i] = t1[i] * ((xr[i] - mean) * invstd);
                }
                na_cpu_psum_add_f(&a1, na_cpu_sum_f(t1, s));
                na_cpu_psum_add_f(&a2, na_cpu_sum_f(t2, s));
            }
            float want_gb = na_cpu_psum_total_f(&a1), want_gg = na_cpu_psum_total_f(&a2);
            float got_gb = (float)get(&gb, ch), got_gg = (float)get(&gg, ch);
            cr_assert(memcmp(&got_gb, &want_gb, sizeof got_gb) == 0 &&
                      memcmp(&got_gg, &want_gg, sizeof got_gg) == 0,
                      "fused %d channel %lld: gbeta %.9g ggamma %.9g, want %.9g %.9g", fused,
                      (long long)ch, got_gb, got_gg, want_gb, want_gg);
        }
        free(t1), free(t2);
        rm(&x); rm(&y); rm(&gy); rm(&gx); rm(&gam); rm(&bet); rm(&sm); rm(&si); rm(&gg);
        rm(&gb);
    }
}

/* The AVX2 build of BatchNorm's f32 loops gives the baseline build's bits: training forward
 * (running statistics too), eval forward and the training backward, fused with ReLU and not,
 * for f32, f16 and bf16 activations, rows of odd lengths on both sides of the pairwise split
 * (it fails with FMA let into the AVX2 build). On a CPU without AVX2 both runs take the
 * baseline and the test checks nothing new. */
Test(cpu_batchnorm, avx2_build_gives_the_baseline_bits) {
    const int64_t shapes[2][3] = {{3, 4, 37}, {5, 3, 1003}};
    const na_dtype dts[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int sh = 0; sh < 2; sh++)
        for (int t = 0; t < 3; t++)
            for (int relu = 0; relu < 2; relu++) {
                int64_t n = shapes[sh][0], c = shapes[sh][1], s = shapes[sh][2];
                na_dtype dt = dts[t];
                na_view x = MK(dt, n, c, s), gy = MK(dt, n, c, s), gam = MK(NA_DTYPE_F32, c),
                        bet = MK(NA_DTYPE_F32, c);
                fill_rand(&x, -2, 3);
                fill_rand(&gy, -1, 1);
                fill_rand(&gam, 0.5, 1.5);
                fill_rand(&bet, -1, 1);
                na_view out[2][9]; /* y, sm, si, rm, rv, gx, gg, gb, eval y */
                for (int base = 0; base < 2; base++) {
                    na_view *o = out[base];
                    o[0] = MK(dt, n, c, s), o[5] = MK(dt, n, c, s), o[8] = MK(dt, n, c, s);
                    for (int k = 1; k <= 4; k++) o[k] = MK(NA_DTYPE_F32, c);
                    o[6] = MK(NA_DTYPE_F32, c), o[7] = MK(NA_DTYPE_F32, c);
                    for (int64_t ch = 0; ch < c; ch++) set(&o[4], ch, 1.0);
                    na_cpu_force_baseline = base;
                    na_cpu_half512_off = true; /* f32 operands take the AVX-512 loops else */
                    cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, &o[3], &o[4], &o[0], &o[1],
                                                     &o[2], n, c, s, 0.1, 1e-5, relu), NA_OK);
                    cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &o[1], &o[2], &o[5], &o[6],
                                                        &o[7], n, c, s, true,
                                                        relu ? &o[0] : NULL), NA_OK);
                    cr_assert_eq(B->batch_norm_eval(&x, &gam, &bet, &o[3], &o[4], &o[8], n, c, s,
                                                    1e-5, relu), NA_OK);
                }
                na_cpu_force_baseline = false;
                na_cpu_half512_off = false;
                const char *what[9] = {"y", "saved mean", "saved invstd", "running mean",
                                       "running var", "gx", "ggamma", "gbeta", "eval y"};
                for (int k = 0; k < 9; k++) {
                    char msg[96];
                    snprintf(msg, sizeof msg, "%s, %s, relu %d, shape %d", what[k],
                             na_dtype_name(dt), relu, sh);
                    expect_same_bits(&out[0][k], &out[1][k], msg);
                }
                for (int base = 0; base < 2; base++)
                    for (int k = 0; k < 9; k++) rm(&out[base][k]);
                rm(&x); rm(&gy); rm(&gam); rm(&bet);
            }
}

/* BatchNorm with f16/bf16 operands read in place and converted in registers (na_cpu_half512,
 * or 8 lanes of AVX2 + F16C, na_cpu_half_avx2: FOR_EACH_HALF_PATH below) gives the bits of the f32 loops over the widened copies (na_cpu_half512_off): training
 * forward (statistics, running statistics, y), eval forward and the backward (sums and gx),
 * fused with ReLU and not, for rows of odd lengths on both sides of the pairwise split and of
 * NA_CPU_CHUNK, operands of mixed dtypes (half x with f32 y or gx, f32 x with half gy), and
 * channels holding a NaN or an Inf in x or gy, and a NaN in the fused y where x is finite
 * (ReLU's gradient passes it, NA_RELU_GRAD, in the sums and in a widened gy; an f32 gy's gx
 * masks it, y > 0); eval y keeps a NaN through ReLU. All-f32 operands take the same loops
 * and are compared with the f32 loops too. */
static void bn_half_case(int64_t n, int64_t c, int64_t s, na_dtype xd, na_dtype yd, na_dtype gd,
                         na_dtype gxd, int relu, bool special) {
    na_view x = MK(xd, n, c, s), gy = MK(gd, n, c, s), gam = MK(NA_DTYPE_F32, c),
            bet = MK(NA_DTYPE_F32, c), ry = MK(yd, n, c, s);
    fill_rand(&x, -2, 3);
    fill_rand(&gy, -1, 1);
    fill_rand(&gam, 0.5, 1.5);
    fill_rand(&bet, -1, 1);
    fill_rand(&ry, -1, 1); /* a given fused y, with NaNs where x is finite */
    set(&x, 1, 3e-6); /* an f16 subnormal */
    if (special && c >= 3) {
        set(&x, (0 * c + 1) * s + s / 2, NAN);              /* channel 1: NaN */
        set(&x, ((n - 1) * c + 2) * s + s - 1, INFINITY);   /* channel 2: Inf, a tail */
        set(&gy, ((n - 1) * c + 0) * s, NAN);               /* channel 0's gradient */
        set(&ry, (0 * c + (c - 1)) * s + s / 3, NAN);
        set(&ry, (0 * c + (c - 1)) * s, -0.0);
    }
    na_view out[2][13]; /* y, sm, si, rm, rv, gx, gg, gb, eval y, gx (given y), eval gx, and
                         * the statistics-only call's (SyncBatchNorm's: eps 0) mean and invstd */
    for (int v = 0; v < 2; v++) {
        na_view *o = out[v];
        o[0] = MK(yd, n, c, s), o[5] = MK(gxd, n, c, s), o[8] = MK(yd, n, c, s);
        o[9] = MK(gxd, n, c, s), o[10] = MK(gxd, n, c, s);
        for (int k = 1; k <= 4; k++) o[k] = MK(NA_DTYPE_F32, c);
        o[6] = MK(NA_DTYPE_F32, c), o[7] = MK(NA_DTYPE_F32, c);
        o[11] = MK(NA_DTYPE_F32, c), o[12] = MK(NA_DTYPE_F32, c);
        for (int64_t ch = 0; ch < c; ch++) set(&o[4], ch, 1.0);
        if (special && c >= 3) set(&o[3], 0, NAN); /* a NaN running mean: eval y NaN */
        na_cpu_half512_off = v == 1;
        cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, &o[3], &o[4], &o[0], &o[1], &o[2], n, c,
                                         s, 0.1, 1e-5, relu), NA_OK);
        cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &o[1], &o[2], &o[5], &o[6], &o[7], n,
                                            c, s, true, relu ? &o[0] : NULL), NA_OK);
        cr_assert_eq(B->batch_norm_eval(&x, &gam, &bet, &o[3], &o[4], &o[8], n, c, s, 1e-5,
                                        relu), NA_OK);
        cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &o[1], &o[2], &o[9], NULL, NULL, n, c,
                                            s, true, &ry), NA_OK);
        cr_assert_eq(B->batch_norm_backward(&x, &gy, &gam, &o[3], &o[2], &o[10], &o[6], NULL, n,
                                            c, s, false, relu ? &ry : NULL), NA_OK);
        cr_assert_eq(B->batch_norm_train(&x, NULL, NULL, NULL, NULL, NULL, &o[11], &o[12], n, c,
                                         s, 0.0, 0.0, false), NA_OK);
        na_cpu_half512_off = false;
    }
    const char *what[13] = {"y", "saved mean", "saved invstd", "running mean", "running var",
                            "gx", "ggamma", "gbeta", "eval y", "gx (given y)", "eval gx",
                            "statistics-only mean", "statistics-only invstd"};
    for (int k = 0; k < 13; k++) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: [%lld, %lld, %lld] x %s y %s gy %s gx %s relu %d", what[k],
                 (long long)n, (long long)c, (long long)s, na_dtype_name(xd), na_dtype_name(yd),
                 na_dtype_name(gd), na_dtype_name(gxd), relu);
        expect_same_bits(&out[0][k], &out[1][k], msg);
    }
    for (int v = 0; v < 2; v++)
        for (int k = 0; k < 13; k++) rm(&out[v][k]);
    rm(&x); rm(&gy); rm(&gam); rm(&bet); rm(&ry);
}

/* Each in-register path the CPU has: AVX-512 (na_cpu_half512), then the 8-lane AVX2 + F16C
 * loops (na_cpu_half_avx2; on an AVX-512 machine through na_cpu_half_avx2_prefer); `body`
 * compares the default path with the widening one (na_cpu_half512_off). */
#define FOR_EACH_HALF_PATH(body)                                                            \
    do {                                                                                    \
        int paths_ = 0;                                                                     \
        for (int pref_ = 0; pref_ < 2; pref_++) {                                           \
            na_cpu_half_avx2_prefer = pref_ == 1;                                           \
            if (pref_ == 0 ? !na_cpu_half512() && !na_cpu_half_avx2() : !na_cpu_half_avx2() || \
                                                                        !na_cpu_half512())  \
                continue;                                                                   \
            paths_++;                                                                       \
            body;                                                                           \
        }                                                                                   \
        na_cpu_half_avx2_prefer = false;                                                    \
        if (!paths_) cr_skip("this CPU has neither AVX-512F/BW/VL nor AVX2+F16C: halves widen"); \
    } while (0)

static void bn_half_shapes(void) {
    const int64_t shapes[][3] = {{3, 4, 37}, {5, 3, 1003}, {2, 3, 1}, {4, 5, 7},
                                 {2, 3, 196}, {2, 3, 2053}, {1, 3, 129}, {7, 3, 16},
                                 {3, 5, 2}, {2, 3, 3}, {2, 4, 14}, {3, 3, 49}};
    const na_dtype h[2] = {NA_DTYPE_F16, NA_DTYPE_BF16}, F = NA_DTYPE_F32;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int t = 0; t < 2; t++)
            for (int relu = 0; relu < 2; relu++) {
                const int64_t *d = shapes[sh];
                na_dtype dt = h[t];
                bn_half_case(d[0], d[1], d[2], dt, dt, dt, dt, relu, true);
                bn_half_case(d[0], d[1], d[2], dt, dt, dt, dt, relu, false);
                bn_half_case(d[0], d[1], d[2], dt, F, dt, F, relu, true);  /* f32 outputs */
                bn_half_case(d[0], d[1], d[2], F, dt, dt, dt, relu, true);  /* f32 x */
                bn_half_case(d[0], d[1], d[2], dt, h[1 - t], h[1 - t], dt, relu, true);
                if (t == 0) { /* all f32: the same loops, against the AVX2 (or baseline) build */
                    bn_half_case(d[0], d[1], d[2], F, F, F, F, relu, true);
                    bn_half_case(d[0], d[1], d[2], F, F, F, F, relu, false);
                    bn_half_case(d[0], d[1], d[2], F, F, F, dt, relu, true);
                }
            }
}

Test(cpu_batchnorm, half_read_in_place_same_bits_as_widened, .timeout = 120) {
    na_cpu_bn_order_off = true; /* the channel-by-channel loops; memory order: below */
    FOR_EACH_HALF_PATH(bn_half_shapes());
    na_cpu_bn_order_off = false;
}

/* The training forward and backward in memory order (na_cpu_bn_order: blocks of channels,
 * image by image; gx then over rows) give the widening path's bits too: the shapes above, and
 * more channels than one block (32) holds, with a last block of 1 and of 5. On an AVX-512
 * CPU through na_cpu_half_avx2_prefer. */
Test(cpu_batchnorm, memory_order_same_bits_as_widened, .timeout = 120) {
    na_cpu_half_avx2_prefer = true;
    if (!na_cpu_bn_order()) {
        na_cpu_half_avx2_prefer = false;
        cr_skip("this CPU lacks AVX2+F16C: BatchNorm keeps its channel-by-channel loops");
    }
    bn_half_shapes();
    /* the last: more than one task in each pass (the sums over channels, gx over rows) */
    const int64_t shapes[][3] = {{2, 33, 9}, {3, 69, 20}, {2, 37, 130}, {4, 40, 300}};
    const na_dtype h[2] = {NA_DTYPE_F16, NA_DTYPE_BF16}, F = NA_DTYPE_F32;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int t = 0; t < 2; t++)
            for (int relu = 0; relu < 2; relu++) {
                const int64_t *d = shapes[sh];
                bn_half_case(d[0], d[1], d[2], h[t], h[t], h[t], h[t], relu, true);
                bn_half_case(d[0], d[1], d[2], F, F, F, F, relu, true);
                bn_half_case(d[0], d[1], d[2], h[t], F, h[1 - t], F, relu, true);
            }
    na_cpu_half_avx2_prefer = false;
}

/* na_cpu_sum_any_f over f16/bf16 read in place (na_cpu_half512) gives the bits of the sum over
 * the widened chunks, at lengths around the 8-lane, 128 (pairwise) and NA_CPU_CHUNK
 * boundaries, with subnormals, and with an Inf or a NaN in some rows. */
static void sum_half_lengths(void) {
    const int64_t lens[] = {0, 1, 7, 8, 9, 15, 127, 128, 129, 136, 255, 784, 1023, 1024, 1025,
                            2049, 4100, 9999};
    const na_dtype h[2] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int t = 0; t < 2; t++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (int sp = 0; sp < 3; sp++) {
                int64_t n = lens[l];
                na_view x = MK(h[t], n + 3);
                fill_rand(&x, -3, 2);
                if (n > 2) set(&x, 2, 2e-7); /* subnormal in f16 */
                if (sp == 1 && n) set(&x, 3 + (n - 1) / 2, INFINITY);
                if (sp == 2 && n) set(&x, 3 + n - 1, NAN);
                float got, want;
                got = na_cpu_sum_any_f(h[t], x.data, 3, n);
                na_cpu_half512_off = true;
                want = na_cpu_sum_any_f(h[t], x.data, 3, n);
                na_cpu_half512_off = false;
                cr_assert(!memcmp(&got, &want, sizeof got), "%s sum of %lld (case %d): %.9g, "
                          "want %.9g", na_dtype_name(h[t]), (long long)n, sp, got, want);
                rm(&x);
            }
}

Test(cpu_sum, half_read_in_place_same_bits_as_widened) { FOR_EACH_HALF_PATH(sum_half_lengths()); }

Test(cpu_batchnorm, half_input_f32_params) {
    int64_t n = 4, c = 2, s = 30;
    na_view x = MK(NA_DTYPE_F16, n, c, s), y = MK(NA_DTYPE_F16, n, c, s),
              xf, yf = MK(NA_DTYPE_F32, n, c, s), gam = MK(NA_DTYPE_F32, c),
              bet = MK(NA_DTYPE_F32, c), sm = MK(NA_DTYPE_F32, c), si = MK(NA_DTYPE_F32, c);
    fill_rand(&x, -2, 2);
    fill_rand(&gam, 0.5, 1.5);
    fill_rand(&bet, -1, 1);
    xf = widened(&x);
    cr_assert_eq(B->batch_norm_train(&x, &gam, &bet, NULL, NULL, &y, &sm, &si, n, c, s, 0.1, 1e-5, false),
                 NA_OK);
    cr_assert_eq(B->batch_norm_train(&xf, &gam, &bet, NULL, NULL, &yf, &sm, &si, n, c, s, 0.1, 1e-5, false),
                 NA_OK);
    na_view want = rounded(NA_DTYPE_F16, &yf);
    expect_same_bits(&y, &want, "bn f16");
    rm(&x); rm(&y); rm(&xf); rm(&yf); rm(&gam); rm(&bet); rm(&sm); rm(&si); rm(&want);
}
