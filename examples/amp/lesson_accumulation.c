/* Lesson 2b (amp-accumulation): why autocast multiplies in f16 but accumulates in f32, and why
 * exp, softmax and the losses are on its fp32 list (see amp_lessons.h). Every rounding is
 * nanoamp's: the f16 accumulator adds in f32 and rounds each partial sum with common/half.h,
 * as an f16 add does; the rest are the library's ops on f16 and f32 tensors. */
#include <math.h>

#include "common/half.h"
#include "lesson_internal.h"

static double f16(double v) { return na_f16_bits_to_f32(na_f32_to_f16_bits((float)v)); }

/* the logits' softmax three ways: exp then divide in f16, the same under f16 autocast (exp
 * and sum by the fp32 rule), and nanoamp's softmax on the f16 logits (max subtracted) */
static int softmaxes(amp_accumulation_result *r) {
    float logits[2] = {(float)r->logit, (float)-r->logit};
    na_tensor *x32 = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 2), logits);
    na_tensor *x16 = x32 ? na_cast(x32, NA_DTYPE_F16) : NULL;
    CHECK(x16);
    na_tensor *e16 = na_exp(x16); /* outside autocast: f16 in, f16 out */
    na_tensor *naive16 = e16 ? na_div(e16, na_sum(e16)) : NULL;
    CHECK_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *e32 = na_exp(x16); /* the fp32 rule: f32 out */
    na_tensor *naive32 = e32 ? na_div(e32, na_sum(e32)) : NULL;
    CHECK_RC(na_autocast_end());
    na_tensor *sm16 = na_softmax(x16);
    na_tensor *ce16 = sm16 ? na_neg(na_log(sm16)) : NULL;  /* -log p, p an f16 softmax */
    na_tensor *ce32 = na_neg(na_log_softmax(x32));         /* -log p in f32 */
    CHECK(naive16 && naive32 && ce16 && ce32);
    CHECK(naive16->dtype == NA_DTYPE_F16 && naive32->dtype == NA_DTYPE_F32 &&
          sm16->dtype == NA_DTYPE_F16);
    for (int i = 0; i < 2; i++) {
        r->softmax_f16[i] = na_get(naive16, i);
        r->softmax_f32[i] = na_get(naive32, i);
        r->softmax_nanoamp_f16[i] = na_get(sm16, i);
    }
    r->exp_f16_logit = na_get(e16, 0);
    r->ce_f16 = na_get(ce16, 1);
    r->ce_f32 = na_get(ce32, 1);
    na_step_end();
    return 0;
}

/* the largest f16 x whose exp is finite in f16 (by nanoamp's f16 exp), and the next f16 */
static int exp_limit(amp_accumulation_result *r) {
    for (uint16_t b = na_f32_to_f16_bits(10.0f); b < na_f32_to_f16_bits(12.0f); b++) {
        double xv = na_f16_bits_to_f32(b);
        na_tensor *x = na_full(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(1), xv);
        na_tensor *e = x ? na_exp(x) : NULL;
        CHECK(e);
        double v = na_get(e, 0);
        na_step_end();
        if (isinf(v)) {
            r->exp_inf_at = xv;
            return 0;
        }
        r->exp_last_finite_x = xv, r->exp_last_finite = v;
    }
    CHECK(!"exp in f16 overflows below 12");
    return -1;
}

/* "NaN" for any NaN (printf's spelling carries its sign bit), else %g */
static const char *num(double v, char *buf, size_t size) {
    if (isnan(v)) snprintf(buf, size, "NaN");
    else snprintf(buf, size, "%g", v);
    return buf;
}

int amp_lesson_accumulation(amp_accumulation_result *r) {
    *r = (amp_accumulation_result){.n = 4096, .x = 0.1, .logit = 20};
    r->x_f16 = f16(r->x);
    /* an f16 accumulator: each partial sum rounded to f16 */
    double acc = 0;
    for (int i = 0; i < r->n; i++) {
        double before = acc;
        acc = f16(acc + r->x_f16);
        if (acc == before && r->stalled_at < 0.5) r->stalled_at = acc, r->stalled_step = i;
    }
    r->sum_f16 = acc;
    r->spacing_at_stall = ldexp(1, ilogb(r->stalled_at) - 10);
    /* nanoamp's sum and matmul of the f16 values: f32 accumulation */
    na_tensor *v = na_full(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(r->n, 1), r->x);
    na_tensor *ones = na_full(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(1, r->n), 1.0);
    na_tensor *sum = v ? na_sum(v) : NULL, *mm = ones && v ? na_matmul(ones, v) : NULL;
    CHECK(sum && mm && mm->dtype == NA_DTYPE_F16);
    r->sum_f32 = na_get(sum, 0);
    r->matmul_f16 = na_get(mm, 0);
    r->exact = r->n * r->x_f16;
    na_step_end();
    if (exp_limit(r) || softmaxes(r)) return -1;

    amp_quotes *q = &r->quotes;
    quote(q, "setup", "summing %d x %g (%g in f16 is %.13g; the exact sum of those is %g)", r->n,
          r->x, r->x, r->x_f16, r->exact);
    quote(q, "acc_f16", "f16 accumulator (each partial sum rounded)   %g", r->sum_f16);
    quote(q, "acc_f32", "f32 accumulator (na_sum of the f16 tensor)   %g", r->sum_f32);
    quote(q, "acc_mm", "f16 matmul, f32 accumulation (na_matmul)     %g", r->matmul_f16);
    quote(q, "stall", "the f16 sum reaches %g after %d additions and stays there: the spacing at "
          "%g is %g, so %g + %.4g rounds back to %g", r->stalled_at, r->stalled_step, r->stalled_at,
          r->spacing_at_stall, r->stalled_at, r->x_f16, r->stalled_at);
    quote(q, "exp", "exp in f16: exp(%.9g) = %g; exp(%.9g), the next f16 number, is inf",
          r->exp_last_finite_x, r->exp_last_finite, r->exp_inf_at);
    static const char *rows[3][2] = {{"sm_f16", "f16: exp, then divide by the sum"},
                                     {"sm_f32", "f16 autocast: exp and sum by the fp32 rule"},
                                     {"sm_na", "na_softmax of the f16 logits (max first)"}};
    const double *p[3] = {r->softmax_f16, r->softmax_f32, r->softmax_nanoamp_f16};
    for (int k = 0; k < 3; k++) {
        char a[32], b[32];
        quote(q, rows[k][0], "%-44s %-12s %s", rows[k][1], num(p[k][0], a, sizeof a),
              num(p[k][1], b, sizeof b));
    }
    quote(q, "ce", "-log p of the second class: %g from the f16 softmax, %g from na_log_softmax "
          "in f32", r->ce_f16, r->ce_f32);
    return 0;
}

int amp_accumulation_run(const char *unused) {
    (void)unused;
    amp_accumulation_result res, *r = &res;
    if (amp_lesson_accumulation(r)) return 1;
    const amp_quotes *q = &r->quotes;
    printf("%s\n\n%s\n%s\n%s\n\n%s\n\n", amp_quote_get(q, "setup"), amp_quote_get(q, "acc_f16"),
           amp_quote_get(q, "acc_f32"), amp_quote_get(q, "acc_mm"), amp_quote_get(q, "stall"));
    printf("%s (f16's largest finite number is 65504; from 65520 up a value rounds to inf)\n\n",
           amp_quote_get(q, "exp"));
    printf("softmax of the logits (%g, %g):\n%s\n%s\n%s\n\n%s\n", r->logit, -r->logit,
           amp_quote_get(q, "sm_f16"), amp_quote_get(q, "sm_f32"), amp_quote_get(q, "sm_na"),
           amp_quote_get(q, "ce"));
    return 0;
}
