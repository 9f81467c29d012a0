/* tests/test_tensor.c — tensors: constructors, the generator, moving data, views, casts,
 * the two lifetimes (persistent tensors and the step arena) and error reporting.
 *
 * Random fills are checked statistically and, for f64, element by element against
 * kernels/common/philox.h (checked against the Random123 known-answer vectors in
 * tests/test_half.c). Every error case checks the status, that the message names the function
 * and the offending shapes/dtypes, and that nothing crashed.
 */
#include "common/philox.h"
#include "helpers.h"
#include "nanoamp/cuda.h"

static const na_dtype ALL_DTYPES[] = {NA_DTYPE_F64, NA_DTYPE_F32, NA_DTYPE_F16,
                                      NA_DTYPE_BF16, NA_DTYPE_I32, NA_DTYPE_U8,
                                      NA_DTYPE_F8E4M3, NA_DTYPE_F8E5M2};
_Static_assert(sizeof ALL_DTYPES / sizeof ALL_DTYPES[0] == NA_DTYPE_COUNT, "every dtype");

/* ---- constructors ------------------------------------------------------------------------ */

Test(tensor, zeros_ones_full_in_every_dtype) {
    for (int d = 0; d < NA_DTYPE_COUNT; d++) {
        na_dtype dt = ALL_DTYPES[d];
        const char *nm = na_dtype_name(dt);
        na_tensor *z = TH_OK(na_zeros(dt, NA_DEVICE_CPU, NA_SHAPE(2, 3)));
        cr_assert_eq(z->dtype, dt);
        cr_assert_eq(z->device, NA_DEVICE_CPU);
        th_expect_shape(z, NA_SHAPE(2, 3), nm);
        cr_assert(na_is_contiguous(z) && z->stride[0] == 3 && z->stride[1] == 1, "%s strides", nm);
        cr_assert(!z->persistent && !z->requires_grad && !z->grad && !z->grad_fn && !z->base);
        TH_EXPECT(z, 0, 0, nm, 0, 0, 0, 0, 0, 0);
        TH_EXPECT(TH_OK(na_ones(dt, NA_DEVICE_CPU, NA_SHAPE(3))), 0, 0, nm, 1, 1, 1);
        TH_EXPECT(TH_OK(na_full(dt, NA_DEVICE_CPU, NA_SHAPE(2), 7)), 0, 0, nm, 7, 7);
        na_tensor *s = TH_OK(na_scalar(dt, NA_DEVICE_CPU, 3));
        cr_assert_eq(s->ndim, 0, "%s: na_scalar is 0-dim", nm);
        cr_assert_eq(s->numel, 1);
        cr_assert_eq(na_item(s), 3.0, "%s: scalar value", nm);
        na_tensor *e = TH_OK(na_empty_like(z));
        th_expect_shape(e, NA_SHAPE(2, 3), nm);
        cr_assert_eq(e->dtype, dt);
        cr_assert_neq(e->data, z->data);
        TH_EXPECT(TH_OK(na_zeros_like(TH_OK(na_ones(dt, NA_DEVICE_CPU, NA_SHAPE(2))))), 0, 0, nm, 0, 0);
    }
    TH_EXPECT(TH_OK(na_full(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2), -2.5)), 0, 0, "full -2.5", -2.5, -2.5);
    TH_EXPECT(TH_OK(na_full(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(1), 0.1)), 0, 0, "full f16 0.1 (RNE)",
              0.0999755859375);
    /* empty tensors are fine */
    na_tensor *z0 = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(0, 4)));
    cr_assert_eq(z0->numel, 0);
}

Test(tensor, arange) {
    TH_EXPECT(TH_OK(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 0, 5, 1)), 0, 0, "arange(0,5,1)", 0, 1, 2, 3, 4);
    TH_EXPECT(TH_OK(na_arange(NA_DTYPE_F64, NA_DEVICE_CPU, 1, 2, 0.25)), 0, 0, "arange(1,2,.25)", 1, 1.25, 1.5, 1.75);
    TH_EXPECT(TH_OK(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 5, 0, -2)), 0, 0, "arange(5,0,-2)", 5, 3, 1);
    TH_EXPECT(TH_OK(na_arange(NA_DTYPE_I32, NA_DEVICE_CPU, 0, 3, 1)), 0, 0, "arange i32", 0, 1, 2);
    TH_EXPECT(TH_OK(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 0, 1, 0.3)), 1e-7, 1e-6, "arange(0,1,.3)", 0, 0.3, 0.6, 0.9);
    na_tensor *e = TH_OK(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 3, 3, 1));
    th_expect_shape(e, NA_SHAPE(0), "empty arange");
    e = TH_OK(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 3, 0, 1));
    th_expect_shape(e, NA_SHAPE(0), "arange going the wrong way");
    TH_EXPECT_ERROR(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 0, 1, 0), NA_EINVAL, "na_arange", "step");
}

/* ---- the generator ---------------------------------------------------------------------- */

Test(tensor, rand_range_moments_and_philox_values) {
    const int64_t n = 20000;
    na_manual_seed(42);
    cr_assert_eq(na_rng_seed(), 42u);
    cr_assert_eq(na_rng_offset(), 0u);
    na_tensor *u = TH_OK(na_rand(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(n), -1, 3));
    cr_assert_eq(na_rng_offset(), 1u, "each fill takes the next offset");
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = na_get(u, i);
        cr_assert(v >= -1 && v < 3, "rand f64 element %" PRId64 " = %g outside [-1, 3)", i, v);
        cr_assert_eq(v, -1 + 4 * (double)na_philox_uniform(42, 0, (uint64_t)i),
                     "rand f64 element %" PRId64 " is not the Philox stream's", i);
        sum += v;
        sq += v * v;
    }
    double mean = sum / n, var = sq / n - mean * mean;
    /* uniform(-1, 3): mean 1, variance 16/12; 6 standard errors */
    cr_assert(fabs(mean - 1) < 6 * sqrt(16.0 / 12 / n), "rand mean %g", mean);
    cr_assert(fabs(var - 16.0 / 12) < 0.05, "rand variance %g", var);

    na_tensor *z = TH_OK(na_randn(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(n), 2, 0.5));
    sum = sq = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = na_get(z, i);
        cr_assert_eq(v, 2 + 0.5 * (double)na_philox_normal(42, 1, (uint64_t)i),
                     "randn f64 element %" PRId64 " is not the Philox stream's", i);
        sum += v;
        sq += v * v;
    }
    mean = sum / n;
    double sd = sqrt(sq / n - mean * mean);
    cr_assert(fabs(mean - 2) < 6 * 0.5 / sqrt((double)n), "randn mean %g", mean);
    cr_assert(fabs(sd - 0.5) < 0.02, "randn std %g", sd);

    /* f32: the same stream, rounded; range holds */
    na_manual_seed(42);
    na_tensor *u32 = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n), -1, 3));
    for (int64_t i = 0; i < n; i++) {
        double v = na_get(u32, i);
        cr_assert(v >= -1 && v < 3, "rand f32 element %" PRId64 " = %g outside [-1, 3)", i, v);
        cr_assert(fabs(v - na_get(u, i)) <= 4 * 0x1p-23, "rand f32 differs from the f64 stream");
    }
}

Test(tensor, rand_same_seed_same_numbers_new_offset_new_numbers) {
    for (int d = 0; d < 4; d++) { /* the float dtypes */
        na_dtype dt = ALL_DTYPES[d];
        na_manual_seed(7);
        na_tensor *a = TH_OK(na_rand(dt, NA_DEVICE_CPU, NA_SHAPE(64), 0, 1));
        na_tensor *b = TH_OK(na_rand(dt, NA_DEVICE_CPU, NA_SHAPE(64), 0, 1));
        na_manual_seed(7);
        na_tensor *a2 = TH_OK(na_rand(dt, NA_DEVICE_CPU, NA_SHAPE(64), 0, 1));
        na_manual_seed(8);
        na_tensor *c = TH_OK(na_rand(dt, NA_DEVICE_CPU, NA_SHAPE(64), 0, 1));
        /* replaying a saved state replays the stream */
        na_rng_set_state(7, 1);
        na_tensor *b2 = TH_OK(na_rand(dt, NA_DEVICE_CPU, NA_SHAPE(64), 0, 1));
        int same_ab = 0, same_ac = 0;
        for (int i = 0; i < 64; i++) {
            cr_assert_eq(na_get(a, i), na_get(a2, i), "%s: same seed, different numbers", na_dtype_name(dt));
            cr_assert_eq(na_get(b, i), na_get(b2, i), "%s: replayed state, different numbers", na_dtype_name(dt));
            same_ab += na_get(a, i) == na_get(b, i);
            same_ac += na_get(a, i) == na_get(c, i);
        }
        cr_assert(same_ab < 8, "%s: consecutive fills agree in %d of 64 places", na_dtype_name(dt), same_ab);
        cr_assert(same_ac < 8, "%s: seeds 7 and 8 agree in %d of 64 places", na_dtype_name(dt), same_ac);
    }
}

/* [lo, hi) must hold after rounding to the storage dtype too: in f16, uniform draws above
 * 1 - 2^-12 round up to 1.0 unless the kernel takes care. */
Test(tensor, rand_half_stays_below_hi) {
    na_manual_seed(3);
    const int64_t n = 1 << 16;
    na_tensor *h = TH_OK(na_rand(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(n), 0, 1));
    na_tensor *b = TH_OK(na_rand(NA_DTYPE_BF16, NA_DEVICE_CPU, NA_SHAPE(n), 0, 1));
    for (int64_t i = 0; i < n; i++) {
        double v = na_get(h, i), w = na_get(b, i);
        cr_assert(v >= 0 && v < 1, "rand f16 element %" PRId64 " = %g outside [0, 1)", i, v);
        cr_assert(w >= 0 && w < 1, "rand bf16 element %" PRId64 " = %g outside [0, 1)", i, w);
    }
}

Test(tensor, rand_needs_a_float_dtype) {
    TH_EXPECT_ERROR(na_rand(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(3), 0, 1), NA_EDTYPE, "na_rand", "i32");
    TH_EXPECT_ERROR(na_randn(NA_DTYPE_U8, NA_DEVICE_CPU, NA_SHAPE(3), 0, 1), NA_EDTYPE, "na_randn", "u8");
}

/* ---- moving data ---------------------------------------------------------------------------- */

Test(tensor, from_host_copy_to_host_round_trip_every_dtype) {
    for (int d = 0; d < NA_DTYPE_COUNT; d++) {
        na_dtype dt = ALL_DTYPES[d];
        size_t es = na_dtype_size(dt), n = 37;
        unsigned char in[37 * 8], out[38 * 8]; /* out: one spare element to catch overruns */
        for (size_t i = 0; i < n * es; i++) in[i] = (unsigned char)(i * 37 + 11); /* any bits */
        na_tensor *t = TH_OK(na_from_host(dt, NA_DEVICE_CPU, NA_SHAPE(37), in));
        memset(out, 0xA5, sizeof out);
        TH_RC(na_copy_to_host(t, out));
        cr_assert(memcmp(in, out, n * es) == 0, "%s: round trip changed the bytes", na_dtype_name(dt));
        cr_assert_eq(out[n * es], 0xA5, "%s: copy_to_host wrote past numel", na_dtype_name(dt));
        /* copy_from_host into an existing tensor */
        na_tensor *u = TH_OK(na_empty(dt, NA_DEVICE_CPU, NA_SHAPE(37)));
        TH_RC(na_copy_from_host(u, in));
        TH_RC(na_copy_to_host(u, out));
        cr_assert(memcmp(in, out, n * es) == 0, "%s: copy_from_host", na_dtype_name(dt));
    }
}

Test(tensor, copy_to_host_of_a_view_is_c_order) {
    int32_t v[6] = {0, 1, 2, 3, 4, 5}, out[6];
    na_tensor *t = TH_OK(na_from_host(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2, 3), v));
    TH_RC(na_copy_to_host(TH_OK(na_transpose(t, 0, 1)), out));
    static const int32_t want[6] = {0, 3, 1, 4, 2, 5};
    for (int i = 0; i < 6; i++) cr_assert_eq(out[i], want[i], "element %d", i);
    TH_EXPECT_STATUS(na_copy_from_host(TH_OK(na_transpose(t, 0, 1)), v), NA_EINVAL,
                     "na_copy_from_host", "contiguous");
}

Test(tensor, copy_fill_and_item) {
    na_tensor *a = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2, 2), 1, 2, 3, 4);
    na_tensor *d = TH_OK(na_empty(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(2, 2)));
    TH_RC(na_copy_(d, TH_OK(na_transpose(a, 0, 1))));
    TH_EXPECT(d, 0, 0, "copy_ of a view with conversion", 1, 3, 2, 4);
    TH_RC(na_fill_(d, -0.5));
    TH_EXPECT(d, 0, 0, "fill_", -0.5, -0.5, -0.5, -0.5);
    TH_EXPECT_STATUS(na_copy_(d, TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3), 1, 2, 3)), NA_ESHAPE,
                     "na_copy_", "[2, 2]", "[3]");
    na_tensor *one = TH_OK(na_slice(TH_OK(na_reshape(a, NA_SHAPE(4))), 2, 3));
    cr_assert_eq(na_item(one), 3.0, "item of a one-element view");
    na_clear_error();
    cr_assert(isnan(na_item(a)), "item of 4 elements must be NaN");
    cr_assert(strstr(na_last_error(), "na_item") && strstr(na_last_error(), "4 elements"),
              "message: %s", na_last_error());
}

/* ---- views ------------------------------------------------------------------------------ */

Test(tensor, reshape_views_and_infers_minus_one) {
    na_tensor *x = TH_OK(na_arange(NA_DTYPE_F32, NA_DEVICE_CPU, 0, 24, 1));
    na_tensor *r = TH_OK(na_reshape(x, NA_SHAPE(2, -1, 4)));
    th_expect_shape(r, NA_SHAPE(2, 3, 4), "reshape [2, -1, 4]");
    cr_assert_eq(r->data, x->data, "reshape of a contiguous tensor shares memory");
    cr_assert_eq(r->base, x, "a view names its base");
    cr_assert(r->stride[0] == 12 && r->stride[1] == 4 && r->stride[2] == 1);
    na_tensor *r2 = TH_OK(na_reshape(r, NA_SHAPE(-1)));
    cr_assert_eq(r2->base, x, "a view of a view names the first base");
    th_expect_shape(TH_OK(na_reshape(x, 0 + 1, (const int64_t[]){24})), NA_SHAPE(24), "reshape [24]");
    /* writes through the base show in the view */
    TH_RC(na_fill_(x, 2));
    cr_assert_eq(na_get(r, 23), 2.0);
    TH_EXPECT_ERROR(na_reshape(x, NA_SHAPE(5, -1)), NA_ESHAPE, "na_reshape", "[24]");
    TH_EXPECT_ERROR(na_reshape(x, NA_SHAPE(-1, -1)), NA_ESHAPE, "na_reshape");
    TH_EXPECT_ERROR(na_reshape(x, NA_SHAPE(7, 4)), NA_ESHAPE, "na_reshape", "24");
}

Test(tensor, transpose_permute_slice_contiguous_and_get_on_strided_views) {
    na_tensor *x = TH_OK(na_reshape(TH_OK(na_arange(NA_DTYPE_F64, NA_DEVICE_CPU, 0, 24, 1)),
                                    NA_SHAPE(2, 3, 4)));
    na_tensor *p = TH_OK(na_permute(x, (const int[]){1, 2, 0}));
    th_expect_shape(p, NA_SHAPE(3, 4, 2), "permute (1,2,0)");
    cr_assert(p->stride[0] == 4 && p->stride[1] == 1 && p->stride[2] == 12, "permuted strides");
    cr_assert(!na_is_contiguous(p));
    /* na_get walks the strides: p[j, k, i] = x[i, j, k] = 12i + 4j + k */
    for (int j = 0; j < 3; j++)
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 2; i++)
                cr_assert_eq(na_get(p, (j * 4 + k) * 2 + i), 12.0 * i + 4 * j + k,
                             "p[%d,%d,%d]", j, k, i);
    na_tensor *t = TH_OK(na_transpose(x, 1, -1));
    th_expect_shape(t, NA_SHAPE(2, 4, 3), "transpose(1, -1)");
    /* slice of the leading dim of a permuted view */
    na_tensor *s = TH_OK(na_slice(p, 1, 3));
    th_expect_shape(s, NA_SHAPE(2, 4, 2), "slice of a view");
    cr_assert_eq(na_get(s, 0), 4.0, "s[0,0,0] = x[0,1,0]");
    cr_assert_eq(na_get(s, 15), 12.0 + 8 + 3, "s[1,3,1] = x[1,2,3]");
    na_tensor *c = TH_OK(na_contiguous(s));
    cr_assert(na_is_contiguous(c));
    for (int i = 0; i < 16; i++) cr_assert_eq(na_get(c, i), na_get(s, i), "contiguous element %d", i);
    /* slice of a contiguous tensor is contiguous and offset */
    na_tensor *rows = TH_OK(na_slice(x, 1, 2));
    cr_assert(na_is_contiguous(rows));
    cr_assert_eq((const char *)rows->data - (const char *)x->data, 12 * 8);
    cr_assert_eq(na_get(rows, 0), 12.0);
    /* na_get on a half view */
    na_tensor *h = TH_OK(na_transpose(TH_TENSOR(NA_DTYPE_F16, NA_SHAPE(2, 2), 0.5, 1.5, -2, 65504), 0, 1));
    TH_EXPECT(h, 0, 0, "f16 transposed view", 0.5, -2, 1.5, 65504);
    na_clear_error();
    cr_assert(isnan(na_get(x, 24)), "na_get out of range is NaN");
    cr_assert(strstr(na_last_error(), "na_get"), "message: %s", na_last_error());
}

Test(tensor, describe) {
    char buf[NA_DESCRIBE_MAX];
    na_tensor *x = TH_OK(na_zeros(NA_DTYPE_BF16, NA_DEVICE_CPU, NA_SHAPE(2, 3)));
    cr_assert_str_eq(na_tensor_describe(x, buf, sizeof buf), "[2, 3] bf16 cpu");
    cr_assert_str_eq(na_tensor_describe(TH_OK(na_scalar(NA_DTYPE_I32, NA_DEVICE_CPU, 1)), buf, sizeof buf),
                     "[] i32 cpu");
    cr_assert_str_eq(na_tensor_describe(NULL, buf, sizeof buf), "(null)");
    char small[8];
    na_tensor_describe(x, small, sizeof small); /* truncates, never overflows */
    cr_assert_eq(strlen(small), 7);
}

/* ---- casts ------------------------------------------------------------------------------ */

/* Every f16 value round-trips f16 -> f32 -> f16; random f32 values round to nearest even
 * (reference: kernels/common/half.h, checked exhaustively in tests/test_half.c). */
Test(tensor, cast_f32_f16_f32_rounds_to_nearest_even) {
    enum { N = 65536 };
    uint16_t *bits = malloc(N * sizeof *bits);
    for (int i = 0; i < N; i++) bits[i] = (uint16_t)i;
    na_tensor *h = TH_OK(na_from_host(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(N), bits));
    na_tensor *f = TH_OK(na_cast(h, NA_DTYPE_F32));
    na_tensor *h2 = TH_OK(na_cast(f, NA_DTYPE_F16));
    uint16_t *back = malloc(N * sizeof *back);
    TH_RC(na_copy_to_host(h2, back));
    for (int i = 0; i < N; i++) {
        bool nan = (i & 0x7C00) == 0x7C00 && (i & 0x3FF);
        if (nan) cr_assert((back[i] & 0x7C00) == 0x7C00 && (back[i] & 0x3FF), "f16 NaN %04x stays NaN", i);
        else cr_assert_eq(back[i], bits[i], "f16 %04x -> f32 -> f16 gave %04x", i, back[i]);
    }
    free(bits);
    free(back);

    th_rng r = {12345};
    enum { M = 20000 };
    float *v = malloc(M * sizeof *v);
    for (int i = 0; i < M; i++) {
        uint32_t u = (uint32_t)th_rng_u64(&r);
        /* exponents around f16's range, incl. subnormals, ties and overflow */
        u = (u & 0x807FFFFFu) | ((uint32_t)(100 + th_rng_int(&r, 0, 48)) << 23);
        if (i % 7 == 0) u &= ~0xFFFu, u |= 0x1000u; /* exact ties */
        memcpy(&v[i], &u, 4);
    }
    na_tensor *x = TH_OK(na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(M), v));
    na_tensor *xh = TH_OK(na_cast(x, NA_DTYPE_F16)), *xb = TH_OK(na_cast(x, NA_DTYPE_BF16));
    na_tensor *xhf = TH_OK(na_cast(xh, NA_DTYPE_F32));
    for (int i = 0; i < M; i++) {
        double want = th_round_f16(v[i]);
        cr_assert(na_get(xh, i) == want && na_get(xhf, i) == want,
                  "f32 %a -> f16 gave %a, expected %a", v[i], na_get(xh, i), want);
        cr_assert_eq(na_get(xb, i), th_round_bf16(v[i]), "f32 %a -> bf16", v[i]);
    }
    free(v);
}

/* ---- lifetimes ------------------------------------------------------------------------ */

Test(tensor, persistent_tensors_survive_step_end) {
    na_tensor *p = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 2));
    cr_assert_not_null(p, "%s", na_last_error());
    cr_assert(p->persistent, "na_tensor_new makes a persistent tensor");
    TH_EXPECT(p, 0, 0, "na_tensor_new is zero-filled", 0, 0, 0, 0, 0, 0);
    TH_RC(na_copy_(p, TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3, 2), 1, 2, 3, 4, 5, 6)));
    for (int step = 0; step < 3; step++) {
        /* churn the arena, then end the step */
        for (int k = 0; k < 10; k++) TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1000)));
        na_step_end();
    }
    TH_EXPECT(p, 0, 0, "persistent values after 3 step ends", 1, 2, 3, 4, 5, 6);
    /* ops on persistent tensors give step tensors */
    na_tensor *q = TH_OK(na_scale(p, 2));
    cr_assert(!q->persistent);
    TH_EXPECT(q, 0, 0, "scale of a persistent tensor", 2, 4, 6, 8, 10, 12);
    na_tensor_free(p);
    na_tensor_free(NULL);                     /* fine */
    na_tensor_free(TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)))); /* ignored */
    na_tensor *z = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(0));
    cr_assert_not_null(z, "an empty persistent tensor: %s", na_last_error());
    na_tensor_free(z);
}

/* One "training step" of fixed shapes: > 1 MiB of step memory, so the first step spills
 * over several chunks. */
static void fixed_step(void) {
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(256, 256), -1, 1));
    na_tensor *w = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(256, 256), -1, 1));
    na_tensor_set_requires_grad(w, true);
    na_tensor *y = TH_OK(na_relu(TH_OK(na_matmul(x, w))));
    na_tensor *loss = TH_OK(na_mean(TH_OK(na_mul(y, y))));
    TH_RC(na_backward(loss, NULL));
    na_tensor *big = TH_OK(na_zeros(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(300000)));
    (void)big;
}

Test(tensor, arena_stops_allocating_once_warm) {
    fixed_step();
    size_t used = na_arena_used(NA_DEVICE_CPU), cap = na_arena_capacity(NA_DEVICE_CPU);
    cr_assert(used >= 2400000 + 5 * 256 * 256 * 4, "used %zu bytes after a step", used);
    cr_assert(cap >= used, "capacity %zu < used %zu", cap, used);
    cr_assert(na_arena_chunk_allocs(NA_DEVICE_CPU) >= 2, "a step over 1 MiB spills over chunks");
    na_step_end();
    cr_assert_eq(na_arena_used(NA_DEVICE_CPU), 0u, "used after na_step_end");
    size_t allocs = na_arena_chunk_allocs(NA_DEVICE_CPU);
    size_t warm_cap = na_arena_capacity(NA_DEVICE_CPU);
    cr_assert(warm_cap >= used, "the arena keeps its high-water mark (%zu < %zu)", warm_cap, used);
    for (int step = 0; step < 5; step++) {
        fixed_step();
        cr_assert_eq(na_arena_used(NA_DEVICE_CPU), used, "step %d used %zu bytes, the first %zu", step,
                     na_arena_used(NA_DEVICE_CPU), used);
        na_step_end();
        cr_assert_eq(na_arena_chunk_allocs(NA_DEVICE_CPU), allocs,
                     "step %d of the same shapes allocated (%zu raw allocations, %zu when warm)",
                     step, na_arena_chunk_allocs(NA_DEVICE_CPU), allocs);
        cr_assert_eq(na_arena_capacity(NA_DEVICE_CPU), warm_cap);
    }
}

Test(tensor, arena_used_and_capacity_are_reported) {
    size_t u0 = na_arena_used(NA_DEVICE_CPU);
    TH_OK(na_empty(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1000)));
    size_t u1 = na_arena_used(NA_DEVICE_CPU);
    cr_assert(u1 - u0 >= 4000 && u1 - u0 < 4000 + 512, "4000 bytes took %zu", u1 - u0);
    cr_assert(na_arena_capacity(NA_DEVICE_CPU) >= u1);
    cr_assert_eq(na_arena_capacity(NA_DEVICE_COUNT), 0u);
    na_step_end();
    cr_assert_eq(na_arena_used(NA_DEVICE_CPU), 0u);
}

/* ---- errors: a status, a message naming the function and the shapes, no crash ---------- */

Test(errors, matmul_inner_dims) {
    na_tensor *a = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3)));
    na_tensor *b = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 5)));
    TH_EXPECT_ERROR(na_matmul(a, b), NA_ESHAPE, "na_matmul", "[2, 3]", "[4, 5]");
    TH_EXPECT_ERROR(na_matmul(a, TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)))),
                    NA_ESHAPE, "na_matmul", "[3]");
    TH_EXPECT_ERROR(na_matmul(TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 2, 3))),
                              TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 3, 2)))),
                    NA_ESHAPE, "na_matmul", "[2, 2, 3]", "[3, 3, 2]");
    TH_EXPECT_ERROR(na_matmul(a, TH_OK(na_zeros(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(3, 2)))),
                    NA_EDTYPE, "na_matmul", "f32", "f64");
    TH_EXPECT_ERROR(na_linear(a, b, NULL), NA_ESHAPE, "na_linear", "[2, 3]", "[4, 5]");
}

Test(errors, add_not_broadcastable) {
    na_tensor *a = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3)));
    na_tensor *b = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4)));
    TH_EXPECT_ERROR(na_add(a, b), NA_ESHAPE, "na_add", "[2, 3]", "[4]");
    TH_EXPECT_ERROR(na_mul(b, a), NA_ESHAPE, "na_mul", "[4]", "[2, 3]");
    TH_EXPECT_ERROR(na_mse_loss(a, TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 2))),
                                NA_REDUCTION_MEAN),
                    NA_ESHAPE, "na_mse_loss", "[2, 3]", "[3, 2]");
    TH_EXPECT_ERROR(na_mse_loss(a, a, (na_reduction)7), NA_EINVAL, "na_mse_loss", "reduction 7");
}

Test(errors, unsupported_dtype) {
    na_tensor *i = TH_OK(na_zeros(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2)));
    TH_EXPECT_ERROR(na_exp(i), NA_EDTYPE, "na_exp", "[2] i32");
    TH_EXPECT_ERROR(na_add(i, i), NA_EDTYPE, "na_add", "i32");
    TH_EXPECT_ERROR(na_sum(TH_OK(na_zeros(NA_DTYPE_U8, NA_DEVICE_CPU, NA_SHAPE(2)))), NA_EDTYPE,
                    "na_sum", "u8");
    TH_EXPECT_ERROR(na_zeros((na_dtype)99, NA_DEVICE_CPU, NA_SHAPE(2)), NA_EDTYPE, "na_empty", "99");
    TH_EXPECT_ERROR(na_cast(i, (na_dtype)99), NA_EDTYPE, "na_cast");
}

Test(errors, backward_from_a_non_scalar_without_a_gradient) {
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2, 2), TH_V(1, 2, 3, 4));
    na_tensor *y = TH_OK(na_mul(x, x));
    TH_EXPECT_STATUS(na_backward(y, NULL), NA_ESHAPE, "na_backward", "[2, 2]", "scalar");
    TH_EXPECT_STATUS(na_backward(y, TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4)))),
                     NA_ESHAPE, "na_backward", "[4]", "[2, 2]");
    cr_assert_null(x->grad, "a failed backward must not write gradients");
    na_tensor *c = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1)));
    TH_EXPECT_STATUS(na_backward(c, NULL), NA_ESTATE, "na_backward", "does not require grad");
}

Test(errors, cuda_tensor_without_a_cuda_device) {
    na_clear_error();
    na_tensor *t = na_zeros(NA_DTYPE_F32, NA_DEVICE_CUDA, NA_SHAPE(2));
    if (t) cr_skip_test("a CUDA device is present: this test is for machines without one");
    cr_assert_eq(na_last_status(), NA_EDEVICE, "status %d: %s", na_last_status(), na_last_error());
    cr_assert(strstr(na_last_error(), "CUDA"), "message \"%s\" does not mention CUDA", na_last_error());
    /* and again (the backend lookup is cached), through other entry points */
    TH_EXPECT_ERROR(na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CUDA, NA_SHAPE(2)), NA_EDEVICE, "CUDA");
    na_tensor *x = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    TH_EXPECT_ERROR(na_to_device(x, NA_DEVICE_CUDA), NA_EDEVICE, "CUDA");
    cr_assert_eq(na_arena_capacity(NA_DEVICE_CUDA), 0u);
    TH_EXPECT_ERROR(na_zeros(NA_DTYPE_F32, (na_device)7, NA_SHAPE(2)), NA_EINVAL, "device");
}

Test(errors, null_inputs) {
    na_tensor *x = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    TH_EXPECT_ERROR(na_add(NULL, x), NA_EINVAL, "na_add", "NULL");
    TH_EXPECT_ERROR(na_matmul(x, NULL), NA_EINVAL, "na_matmul", "NULL");
    TH_EXPECT_ERROR(na_relu(NULL), NA_EINVAL, "na_relu", "NULL");
    TH_EXPECT_ERROR(na_sum(NULL), NA_EINVAL, "na_sum", "NULL");
    TH_EXPECT_ERROR(na_reshape(NULL, NA_SHAPE(2)), NA_EINVAL, "na_reshape", "NULL");
    TH_EXPECT_ERROR(na_cross_entropy(NULL, x, NULL), NA_EINVAL, "na_cross_entropy", "NULL");
    TH_EXPECT_ERROR(na_conv2d(x, NULL, NULL, NULL), NA_EINVAL, "na_conv2d", "NULL");
    TH_EXPECT_ERROR(na_batch_norm(NULL, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), NA_EINVAL,
                    "na_batch_norm", "NULL");
    TH_EXPECT_ERROR(na_detach(NULL), NA_EINVAL, "na_detach");
    TH_EXPECT_STATUS(na_backward(NULL, NULL), NA_EINVAL, "na_backward", "NULL");
    TH_EXPECT_STATUS(na_copy_(NULL, x), NA_EINVAL, "na_copy_");
    TH_EXPECT_STATUS(na_tensor_set_requires_grad(NULL, true), NA_EINVAL, "NULL");
    /* an op fed by a failed op says so */
    TH_EXPECT_ERROR(na_relu(na_matmul(x, x)), NA_EINVAL, "na_relu", "na_matmul");
}

Test(errors, bad_dims_and_shapes) {
    na_tensor *x = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3)));
    TH_EXPECT_ERROR(na_sum_dim(x, 2, false), NA_EINVAL, "na_sum_dim", "dim 2", "[2, 3]");
    TH_EXPECT_ERROR(na_max_dim(x, -3, false), NA_EINVAL, "na_max_dim", "-3");
    TH_EXPECT_ERROR(na_argmax(x, 5, false), NA_EINVAL, "na_argmax", "5");
    TH_EXPECT_ERROR(na_transpose(x, 0, 2), NA_EINVAL, "na_transpose", "[2, 3]");
    TH_EXPECT_ERROR(na_permute(x, (const int[]){0, 0}), NA_EINVAL, "na_permute");
    TH_EXPECT_ERROR(na_slice(x, 1, 3), NA_EINVAL, "na_slice", "[2, 3]");
    TH_EXPECT_ERROR(na_slice(x, 2, 1), NA_EINVAL, "na_slice");
    TH_EXPECT_ERROR(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 1, 1, 1, 1, 1, 1)), NA_ESHAPE,
                    "na_empty", "7 dims");
    TH_EXPECT_ERROR(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, -1)), NA_ESHAPE, "na_empty",
                    "negative");
    TH_EXPECT_ERROR(na_softmax(TH_OK(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 1))), NA_ESHAPE, "na_softmax");
    TH_EXPECT_ERROR(na_dropout(x, 1.5, true), NA_EINVAL, "na_dropout", "1.5");
    /* conv: channels that do not match the weight */
    na_tensor *img = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 3, 5, 5)));
    na_tensor *w = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 2, 3, 3)));
    TH_EXPECT_ERROR(na_conv2d(img, w, NULL, NULL), NA_ESHAPE, "na_conv2d", "[1, 3, 5, 5]", "[4, 2, 3, 3]");
    /* a window larger than the input */
    TH_EXPECT_ERROR(na_conv2d(img, TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 3, 7, 7))),
                              NULL, NULL), NA_ESHAPE, "na_conv2d");
    na_pool2d_opts huge = {.kernel = {6, 6}};
    TH_EXPECT_ERROR(na_max_pool2d(img, &huge), NA_ESHAPE, "na_max_pool2d", "[1, 3, 5, 5]");
    na_pool2d_opts pad = {.kernel = {2, 2}, .padding = {2, 2}};
    TH_EXPECT_ERROR(na_avg_pool2d(img, &pad), NA_ESHAPE, "na_avg_pool2d");
}

Test(errors, cross_entropy_label_out_of_range) {
    na_tensor *logits = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3)));
    TH_EXPECT_ERROR(na_cross_entropy(logits, TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 0, 3), NULL),
                    NA_EINVAL, "na_cross_entropy", "label 3", "index 1", "[0, 3)");
    TH_EXPECT_ERROR(na_cross_entropy(logits, TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), -1, 0), NULL),
                    NA_EINVAL, "na_cross_entropy", "label -1");
    TH_EXPECT_ERROR(na_cross_entropy(logits, TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 0, 1), NULL),
                    NA_ESHAPE, "na_cross_entropy", "f32");
    TH_EXPECT_ERROR(na_cross_entropy(logits, TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(3), 0, 1, 2), NULL),
                    NA_ESHAPE, "na_cross_entropy", "[2, 3]", "[3]");
    na_cross_entropy_opts bad = {NA_REDUCTION_MEAN, 1.5};
    TH_EXPECT_ERROR(na_cross_entropy(logits, TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 0, 1), &bad),
                    NA_EINVAL, "na_cross_entropy", "label_smoothing");
}

Test(errors, batch_norm_one_value_per_channel_in_training) {
    na_tensor *x = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 3)));
    na_tensor *rm = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    na_tensor *rv = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    TH_EXPECT_ERROR(na_batch_norm(x, rm, rv, NULL, NULL, true, 0.1, 1e-5), NA_ESHAPE,
                    "na_batch_norm", "more than 1 value per channel", "[1, 3]");
    TH_EXPECT_ERROR(na_batch_norm(TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 3, 1, 1))),
                                  rm, rv, NULL, NULL, true, 0.1, 1e-5),
                    NA_ESHAPE, "na_batch_norm", "[1, 3, 1, 1]");
    /* eval with one value is fine */
    TH_OK(na_batch_norm(x, rm, rv, NULL, NULL, false, 0.1, 1e-5));
    /* wrongly sized or typed parameters */
    na_tensor *x2 = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3)));
    TH_EXPECT_ERROR(na_batch_norm(x2, TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2))), rv,
                                  NULL, NULL, true, 0.1, 1e-5),
                    NA_ESHAPE, "na_batch_norm", "running_mean", "[2]");
    TH_EXPECT_ERROR(na_batch_norm(x2, rm, rv, TH_OK(na_ones(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(3))),
                                  NULL, true, 0.1, 1e-5),
                    NA_ESHAPE, "na_batch_norm", "weight", "f64");
    TH_EXPECT_ERROR(na_batch_norm(x2, NULL, NULL, NULL, NULL, false, 0.1, 1e-5), NA_EINVAL,
                    "na_batch_norm", "running");
}

/* ---- step graphs ------------------------------------------------------------------------ */

static int count_calls(void *ctx) {
    ++*(int *)ctx;
    return NA_OK;
}

Test(tensor, step_graph_capture_is_refused_without_cuda) {
    int calls = 0;
    cr_assert_null(na_step_graph_capture(NA_DEVICE_CPU, count_calls, &calls));
    cr_assert_eq(na_last_status(), NA_ENOTSUP);
    cr_assert(strstr(na_last_error(), "na_step_graph_capture") &&
              strstr(na_last_error(), "CUDA feature"), "%s", na_last_error());
    if (!na_cuda_available()) {
        cr_assert_null(na_step_graph_capture(NA_DEVICE_CUDA, count_calls, &calls));
        cr_assert_eq(na_last_status(), NA_EDEVICE, "%s", na_last_error());
    }
    cr_assert_eq(calls, 0, "the step is not called");
    cr_assert_null(na_step_graph_capture(NA_DEVICE_CPU, NULL, NULL));
    cr_assert_eq(na_last_status(), NA_EINVAL);
    cr_assert_eq(na_step_graph_replay(NULL), NA_EINVAL);
    cr_assert_not(na_step_graph_capturing());
    na_step_graph_free(NULL);
}
