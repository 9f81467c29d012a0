/* The four lessons of docs/mixed-precision.md: their numbers are what the physics says (checked
 * against independent roundings), and every line the guide quotes from the programs' output is
 * still exactly what they print. Runs the same functions as examples/amp/amp-*. */
#include "helpers.h"

#include "../examples/amp/amp_lessons.h"

static void teardown(void) { na_step_end(); }
TestSuite(amp_lessons, .fini = teardown);

/* docs/mixed-precision.md, found from the source file's path (relative to the build directory
 * the compiler ran in, which is where meson runs the tests, or the executable's parent). */
static char *read_guide(void) {
    char path[4096], exe[4096];
    const char *rel = "/../docs/mixed-precision.md";
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    const char *candidates[3] = {NULL, NULL, NULL};
    snprintf(path, sizeof path, "%s%s", dir, rel);
    candidates[0] = path;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    static char alt[8192];
    if (n > 0 && dir[0] != '/') {
        exe[n] = '\0';
        char *s = strrchr(exe, '/');
        if (s) *s = '\0'; /* build/tests */
        snprintf(alt, sizeof alt, "%s/../%s%s", exe, dir, rel);
        candidates[1] = alt;
    }
    for (int i = 0; i < 2; i++) {
        if (!candidates[i]) continue;
        FILE *f = fopen(candidates[i], "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        rewind(f);
        char *buf = malloc((size_t)len + 1);
        cr_assert_not_null(buf);
        cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
        buf[len] = '\0';
        fclose(f);
        return buf;
    }
    cr_assert_fail("docs/mixed-precision.md not found (tried %s)", path);
    return NULL;
}

static void expect_quoted(const amp_quotes *q, const char *lesson) {
    char *guide = read_guide();
    for (int i = 0; i < q->n; i++)
        cr_assert(strstr(guide, q->q[i].text) != NULL,
                  "docs/mixed-precision.md does not quote %s's %s as the program prints it: "
                  "\"%s\"", lesson, q->q[i].key, q->q[i].text);
    free(guide);
}

Test(amp_lessons, underflow) {
    amp_underflow_result r;
    cr_assert_eq(amp_lesson_underflow(&r), 0, "%s", na_last_error());
    cr_assert(r.formats_checked);
    cr_assert_eq(r.f16_max, 65504.0);
    cr_assert_eq(r.f16_min_subnormal, ldexp(1, -24));
    for (int i = 0; i < AMP_UNDERFLOW_N; i++) {
        /* without scaling: the gradient rounded to f16 (then widened) */
        cr_assert_eq(r.plain[i], th_round_f16(r.truth[i]), "row %d", i);
        /* with scaling: round(g * S) in f16, divided by S in f32 */
        double want = (double)(float)(th_round_f16(r.truth[i] * r.scale) * (float)(1.0 / r.scale));
        cr_assert_eq(r.scaled[i], want, "row %d: %g vs %g", i, r.scaled[i], want);
    }
    cr_assert_eq(r.zeros_plain, 3);
    cr_assert_eq(r.zeros_scaled, 0);
    cr_assert(r.max_rel_err_scaled < 1e-3);
    cr_assert(r.max_rel_err_plain > 0.1);
    expect_quoted(&r.quotes, "amp-underflow");
}

Test(amp_lessons, overflow) {
    amp_overflow_result r;
    cr_assert_eq(amp_lesson_overflow(&r), 0, "%s", na_last_error());
    for (int s = 0; s < AMP_OVERFLOW_STEPS; s++) {
        bool bad = s == AMP_OVERFLOW_BAD_STEP;
        cr_assert_eq(r.found_inf[s], bad, "step %d", s);
        cr_assert_eq(r.weights_changed[s], !bad, "step %d: skipped means untouched", s);
        if (bad) cr_assert_eq(r.scale_after[s], r.scale_before[s] / 2);
        if (s > 0 && s != AMP_OVERFLOW_BAD_STEP && s != AMP_OVERFLOW_BAD_STEP + 1)
            cr_assert(r.loss[s] < r.loss[s - 1], "the loss keeps falling at step %d", s);
    }
    cr_assert(r.loss[AMP_OVERFLOW_BAD_STEP + 1] < r.loss[AMP_OVERFLOW_BAD_STEP - 1]);
    cr_assert_eq(r.scale_before[0], 65536.0);
    cr_assert_eq(r.skipped, 1);
    cr_assert_eq(r.recovered_at, AMP_OVERFLOW_BAD_STEP + 4, "4 clean steps to grow back");
    expect_quoted(&r.quotes, "amp-overflow");
}

Test(amp_lessons, trace) {
    amp_trace_result r;
    cr_assert_eq(amp_lesson_trace(&r), 0, "%s", na_last_error());
    cr_assert_eq(r.lower_ops, 4, "2 conv2d + 2 linear");
    cr_assert_eq(r.weight_casts, 8, "4 layers x (weight, bias), each once");
    cr_assert_eq(r.casts, 10, "+ the input image and the logits");
    int bn = 0;
    for (int i = 0; i < r.n; i++) {
        const na_amp_trace_record *t = &r.rec[i];
        if (t->op == NA_OP_CONV2D || t->op == NA_OP_LINEAR) {
            cr_assert_eq(t->compute, NA_DTYPE_F16);
            cr_assert_eq(t->out, NA_DTYPE_F16);
        }
        if (t->op == NA_OP_BATCH_NORM) {
            bn++;
            cr_assert_eq(t->in[0], NA_DTYPE_F16);
            cr_assert_eq(t->in[1], NA_DTYPE_F32);
            cr_assert_eq(t->out, NA_DTYPE_F16);
        }
        if (t->op == NA_OP_CROSS_ENTROPY) cr_assert_eq(t->out, NA_DTYPE_F32);
    }
    cr_assert_eq(bn, 2);
    cr_assert(isfinite(r.loss));
    cr_assert_eq(r.scale, 65536.0);
    expect_quoted(&r.quotes, "amp-trace");
}

Test(amp_lessons, master_weights) {
    amp_master_result r;
    cr_assert_eq(amp_lesson_master_weights(&r), 0, "%s", na_last_error());
    cr_assert(r.update < r.half_ulp, "the update is below half the f16 spacing at 1.0");
    cr_assert_eq(r.half_ulp, ldexp(1, -11));
    cr_assert_eq(r.f16_weight, 1.0, "every update rounded away");
    cr_assert(fabs(r.master - 1.1) < 1e-4, "master %g", r.master);
    cr_assert_eq(r.master, r.f32_reference, "the master moves as plain f32 training");
    cr_assert_eq(r.model, th_round_f16(r.master));
    expect_quoted(&r.quotes, "amp-master-weights");
}
