/* Lesson 6 (amp-batchnorm): why BatchNorm's statistics stay in f32, each reason computed (see
 * amp_lessons.h). */
#include <math.h>

#include "lesson_internal.h"

/* What would go wrong if BatchNorm's statistics lived in f16, each claim computed: a channel's
 * sum of squares, a counter that stops, running statistics that do not move, and eps below
 * f16's normal range. Then nanoamp's batch norm on the same channel in f16, which keeps its
 * statistics in f32. */

static bool f16_is_subnormal(double v) {
    na_tensor *t = na_cast(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, v), NA_DTYPE_F16);
    uint16_t bits = 0xffff;
    if (t) na_copy_to_host(t, &bits);
    return (bits & 0x7fff) != 0 && ((bits >> 10) & 0x1f) == 0;
}

int amp_lesson_batchnorm(amp_batchnorm_result *r) {
    *r = (amp_batchnorm_result){.rs_steps = 100, .rs_target = 1.002};
    const na_dtype F32 = NA_DTYPE_F32, H = NA_DTYPE_F16;
    /* the variance's sums: one channel of 128 x 28 x 28 values of unit variance */
    na_manual_seed(3);
    na_tensor *x = na_randn(F32, NA_DEVICE_CPU, NA_SHAPE(128, 1, 28, 28), 0, 1);
    na_tensor *x16 = x ? na_cast(x, H) : NULL;
    CHECK(x16);
    na_tensor *sq = na_sum(na_mul(x, x)), *sq16 = na_sum(na_mul(x16, x16));
    CHECK(sq && sq16 && sq16->dtype == H); /* outside autocast: f32 accumulation, f16 result */
    r->sumsq_f32 = na_item(sq);
    r->sumsq_f16 = na_item(sq16);
    /* nanoamp's batch norm: f16 input, f32 statistics, weight and bias; against all-f32 */
    na_tensor *out[2];
    for (int k = 0; k < 2; k++) {
        na_tensor *rm = na_zeros(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        na_tensor *rv = na_ones(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        na_tensor *w = na_ones(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        na_tensor *b = na_zeros(F32, NA_DEVICE_CPU, NA_SHAPE(1));
        CHECK(rm && rv && w && b);
        out[k] = na_batch_norm(k ? x16 : x, rm, rv, w, b, true, 0.1, 1e-5);
        CHECK(out[k]);
    }
    CHECK(out[1]->dtype == H);
    na_tensor *err = na_max(na_abs(na_sub(na_cast(out[1], F32), out[0])));
    CHECK(err);
    r->bn_max_err = na_item(err);
    r->bn_finite = isfinite(r->bn_max_err);
    na_step_end();
    /* an f16 accumulator adding one value at a time stops where 1 is below half its spacing */
    double c = 0;
    for (int i = 0; i < AMP_BN_VALUES; i++) {
        na_tensor *next = na_add(na_scalar(H, NA_DEVICE_CPU, c), na_ones(H, NA_DEVICE_CPU, 0, NULL));
        CHECK(next);
        double v = na_item(next);
        na_step_end();
        if (v == c) break;
        c = v;
    }
    r->f16_counter = c;
    /* running mean = 0.9 running + 0.1 batch mean, one rounding to the storage dtype per update
     * (as a fused kernel does), from 1.0 toward batch means of 1.002 */
    double rs[3] = {1, 1, 1};
    const na_dtype dts[3] = {F32, H, NA_DTYPE_BF16};
    for (int s = 0; s < r->rs_steps; s++)
        for (int k = 0; k < 3; k++)
            rs[k] = round_trip(dts[k], (float)(0.9f * (float)rs[k] + 0.1f * (float)r->rs_target));
    r->rs_f32 = rs[0], r->rs_f16 = rs[1], r->rs_bf16 = rs[2];
    /* eps = 1e-5 in f16 */
    r->eps_f16 = round_trip(H, 1e-5);
    r->eps_subnormal = r->eps_f16 < ldexp(1, -14) && f16_is_subnormal(1e-5);
    r->eps_absorbed_f16 = r->eps_absorbed_f32 = NAN;
    for (int e = -30; e <= 30; e++) {
        double v = ldexp(1, e);
        if (isnan(r->eps_absorbed_f16) && round_trip(H, v + r->eps_f16) == v)
            r->eps_absorbed_f16 = v;
        if (isnan(r->eps_absorbed_f32) && (double)(float)(v + (double)1e-5f) == v)
            r->eps_absorbed_f32 = v;
    }
    amp_quotes *q = &r->quotes;
    quote(q, "channel", "one BatchNorm channel of the MNIST CNN: %d values (128 x 28 x 28), "
          "x ~ N(0, 1)", AMP_BN_VALUES);
    quote(q, "sumsq", "sum of x^2 over the channel:  f32 %.6g, stored in f16 %g", r->sumsq_f32,
          r->sumsq_f16);
    quote(q, "counter", "an f16 sum adding 1 at a time stops at %.0f", r->f16_counter);
    quote(q, "running", "running mean after %d updates toward %g:  f32 %.7f  f16 %.7f  bf16 %.7f",
          r->rs_steps, r->rs_target, r->rs_f32, r->rs_f16, r->rs_bf16);
    quote(q, "eps", "eps = 1e-5 in f16: %.6g, %s", r->eps_f16,
          r->eps_subnormal ? "a subnormal (exponent bits 0)" : "NOT subnormal");
    quote(q, "absorbed", "var + eps == var from var = %g in f16 (%g in f32)", r->eps_absorbed_f16,
          r->eps_absorbed_f32);
    quote(q, "bn", "nanoamp's batch norm, f16 input, f32 statistics: largest difference from "
          "f32 %.3g", r->bn_max_err);
    return 0;
}

int amp_batchnorm_run(const char *unused) {
    (void)unused;
    amp_batchnorm_result res, *r = &res;
    if (amp_lesson_batchnorm(r)) return 1;
    printf("%s\n\n", amp_quote_get(&r->quotes, "channel"));
    static const char *keys[] = {"sumsq", "counter", "running", "eps", "absorbed", "bn"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        printf("%s\n", amp_quote_get(&r->quotes, keys[i]));
    return 0;
}
