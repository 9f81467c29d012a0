/* The lessons of docs/mixed-precision.md: their numbers are what the physics says (checked
 * against independent roundings), every line the guide quotes from the programs' output is
 * still exactly what they print, and the pictures they draw are well-formed SVG with the
 * expected elements. Runs the same functions as examples/amp/amp-*. */
#include "helpers.h"
#include "tmpdir.h"

#include <ctype.h>

#include "../examples/amp/amp_lessons.h"
#include "../examples/amp/amp_plot.h"

static void teardown(void) { na_step_end(); }
TestSuite(amp_lessons, .fini = teardown);

/* docs/<name>, found from the source file's path (relative to the build directory the compiler
 * ran in, which is where meson runs the tests, or the executable's parent). */
static char *read_doc(const char *name) {
    char path[4096], exe[4096], rel[256];
    snprintf(rel, sizeof rel, "/../docs/%s", name);
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
    cr_assert_fail("docs/%s not found (tried %s)", name, path);
    return NULL;
}
static char *read_guide(void) { return read_doc("mixed-precision.md"); }

/* The picture the guide shows is, byte for byte, what the lesson draws now (the guide's
 * "regenerate" commands write it). */
static void expect_doc_picture(const char *svg, const char *img) {
    char name[64];
    snprintf(name, sizeof name, "img/%s", img);
    char *doc = read_doc(name);
    size_t i = 0;
    while (svg[i] && svg[i] == doc[i]) i++;
    cr_assert(svg[i] == doc[i], "docs/%s differs from what the lesson draws at byte %zu "
              "(regenerate it: docs/mixed-precision.md, the commands after the list): \"%.40s\" "
              "vs \"%.40s\"", name, i, doc + i, svg + i);
    free(doc);
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
    /* x65536 makes 1e-9 normal (>= 2^-14) but leaves 1e-10 subnormal */
    cr_assert_eq(r.normal_scaled, 7);
    cr_assert(r.truth[6] * r.scale >= ldexp(1, -14) && r.truth[7] * r.scale < ldexp(1, -14));
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
    char *guide = read_guide(), line[192], text[160];
    for (int i = 0; i < r.n; i++) { /* the guide shows the whole trace */
        snprintf(line, sizeof line, "amp: %s\n", na_amp_trace_format(&r.rec[i], text, sizeof text));
        cr_assert(strstr(guide, line), "docs/mixed-precision.md does not show trace line %d as "
                  "amp-trace prints it: \"%s\"", i, line);
    }
    free(guide);
}

Test(amp_lessons, accumulation) {
    amp_accumulation_result r;
    cr_assert_eq(amp_lesson_accumulation(&r), 0, "%s", na_last_error());
    double x = th_round_f16(0.1), acc = 0;
    for (int i = 0; i < 4096; i++) acc = th_round_f16(acc + x); /* an f16 accumulator */
    cr_assert_eq(r.x_f16, x);
    cr_assert_eq(r.sum_f16, acc);
    cr_assert_eq(r.sum_f16, 256.0, "256 + 0.1 rounds to 256 (spacing 0.25)");
    cr_assert_eq(r.spacing_at_stall, 0.25);
    cr_assert_eq(th_round_f16(256 + x), 256.0);
    cr_assert_eq(r.sum_f32, 4096 * x, "exact in f32");
    cr_assert_eq(r.sum_f32, 409.5);
    cr_assert_eq(r.matmul_f16, 409.5, "f32 accumulation, one rounding to f16 (409.5 is an f16)");
    /* exp in f16: the last finite and the first infinite f16 x are neighbours */
    cr_assert_eq(r.exp_last_finite, th_round_f16(exp(r.exp_last_finite_x)));
    cr_assert(r.exp_last_finite <= 65504 && exp(r.exp_inf_at) >= 65520);
    cr_assert_eq(r.exp_inf_at, r.exp_last_finite_x + ldexp(1, -7), "adjacent f16s in [8, 16)");
    cr_assert(isinf(th_round_f16(exp(th_round_f16(11.1)))), "exp(11.1) is inf in f16");
    cr_assert(isinf(r.exp_f16_logit));
    cr_assert(isnan(r.softmax_f16[0]), "inf / inf");
    cr_assert_eq(r.softmax_f16[1], 0.0, "exp(-20) rounds to 0 in f16");
    cr_assert_eq(r.softmax_f32[0], 1.0);
    cr_assert_lt(fabs(r.softmax_f32[1] / exp(-40) - 1), 1e-5);
    cr_assert_eq(r.softmax_nanoamp_f16[0], 1.0, "no overflow once the max is subtracted");
    cr_assert_eq(r.softmax_nanoamp_f16[1], 0.0, "but e^-40 is 0 in f16");
    cr_assert(isinf(r.ce_f16) && r.ce_f16 > 0);
    cr_assert_lt(fabs(r.ce_f32 - 40), 1e-4);
    expect_quoted(&r.quotes, "amp-accumulation");
}

Test(amp_lessons, master_weights) {
    amp_master_result r;
    cr_assert_eq(amp_lesson_master_weights(&r), 0, "%s", na_last_error());
    const na_dtype dts[AMP_MASTER_KINDS] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    cr_assert_eq(r.half_ulp[AMP_MASTER_F16], ldexp(1, -11));
    cr_assert_eq(r.half_ulp[AMP_MASTER_BF16], ldexp(1, -8));
    for (int k = 0; k < AMP_MASTER_KINDS; k++) {
        cr_assert(r.update < r.half_ulp[k], "the update is below half the spacing at 1.0");
        cr_assert_eq(r.weight16[k], 1.0, "%s: every update rounded away", na_dtype_name(dts[k]));
        cr_assert_eq(r.master[k], r.f32_reference, "the master moves as plain f32 training");
        cr_assert_eq(r.model[k], th_round(dts[k], r.master[k]));
    }
    cr_assert(fabs(r.f32_reference - (1 + r.steps * r.update)) < 1e-4, "%g", r.f32_reference);
    expect_quoted(&r.quotes, "amp-master-weights");
}

/* ---- the rule table ---------------------------------------------------------------------- */

/* What fn writes, as a malloc'd string. */
static char *capture(int (*fn)(FILE *)) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cr_assert_geq(fn(f), 0);
    fclose(f);
    return buf;
}

Test(amp_lessons, rules_table_is_the_librarys_and_the_guides) {
    char *text = capture(amp_rules_print);
    char *guide = read_guide();
    int op = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), op++) {
        cr_assert(strstr(guide, line), "docs/mixed-precision.md does not show the rule table "
                  "line as amp-trace --rules prints it: \"%s\"", line);
        if (op < 0) continue; /* the header */
        char name[32], rule[16];
        cr_assert_eq(sscanf(line, "%31s %15s", name, rule), 2, "%s", line);
        cr_assert_lt(op, NA_OP_COUNT, "more lines than ops");
        cr_assert_str_eq(name, na_op_name((na_op)op));
        cr_assert_str_eq(rule, na_amp_rule_name(na_autocast_rule((na_op)op)), "%s", name);
    }
    cr_assert_eq(op, NA_OP_COUNT, "one line per op");
    free(guide);
    free(text);
}

/* ---- pictures ------------------------------------------------------------------------------ */

/* Well-formed enough for a browser: every tag closed in order, one root <svg>, text without a
 * raw '<' or a bare '&'. Returns the number of elements. */
static int expect_well_formed_svg(const char *svg) {
    cr_assert(!strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39), "root element");
    char stack[16][32];
    int depth = 0, elements = 0;
    for (const char *p = svg; *p; p++) {
        if (*p == '&')
            cr_assert(!strncmp(p, "&amp;", 5) || !strncmp(p, "&lt;", 4) || !strncmp(p, "&gt;", 4) ||
                      !strncmp(p, "&quot;", 6), "a bare '&' at %.20s", p);
        if (*p != '<') continue;
        const char *end = strchr(p, '>');
        cr_assert_not_null(end, "unterminated tag at %.20s", p);
        for (const char *q = p + 1; q < end; q++) cr_assert_neq(*q, '<', "'<' inside a tag");
        char name[32];
        bool closing = p[1] == '/';
        cr_assert_eq(sscanf(p + 1 + closing, "%31[a-zA-Z0-9]", name), 1, "tag at %.20s", p);
        if (closing) {
            cr_assert_gt(depth, 0, "</%s> closes nothing", name);
            cr_assert_str_eq(stack[--depth], name, "</%s> closes <%s>", name, stack[depth]);
        } else {
            elements++;
            cr_assert(depth > 0 || elements == 1, "one root element");
            if (end[-1] != '/') {
                cr_assert_lt(depth, 16);
                snprintf(stack[depth++], sizeof stack[0], "%s", name);
            }
        }
        p = end;
    }
    cr_assert_eq(depth, 0, "<%s> is never closed", depth ? stack[depth - 1] : "");
    return elements;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}

Test(amp_lessons, formats_svg_draws_both_number_lines) {
    char *svg = capture(amp_formats_svg);
    expect_well_formed_svg(svg);
    static const char *zones[] = {"zone-zero", "zone-subnormal", "zone-normal", "zone-overflow"};
    for (int i = 0; i < 4; i++) cr_assert_eq(count(svg, zones[i]), 5, "%s on each line", zones[i]);
    static const char *names[] = {">f32<", ">f16<", ">bf16<", ">f8e4m3<", ">f8e5m2<"};
    for (int i = 0; i < 5; i++) cr_assert(strstr(svg, names[i]), "%s", names[i]);
    cr_assert(strstr(svg, "subnormals from 2^-24, normals from 2^-14, largest 65504; spacing at 1: "
                          "2^-10"));
    cr_assert(strstr(svg, "subnormals from 2^-133, normals from 2^-126"));
    cr_assert(strstr(svg, "largest 448; spacing at 1: 2^-3") && strstr(svg, "largest 57344"));
    cr_assert(strstr(svg, ">overflow: inf<") && strstr(svg, ">overflow: 448 (saturates)<"));
    /* one shared axis: every line has the same ticks */
    cr_assert_eq(count(svg, ">2^-160<"), 5);
    cr_assert_eq(count(svg, ">2^0<"), 5);
    cr_assert_eq(count(svg, "class=\"bar\""), 0, "no histogram");
    expect_doc_picture(svg, "formats.svg");
    free(svg);
}

/* ---- loss scaling in training -------------------------------------------------------------- */

static void skip_without_data(int rc) {
    if (rc && strstr(na_last_error(), "Fashion-MNIST"))
        cr_skip_test("%s (scripts/install-deps installs it)", na_last_error());
    cr_assert_eq(rc, 0, "%s", na_last_error());
}

static amp_loss_scaling_result scaling;
static int draw_scaling(FILE *f) { return amp_loss_scaling_svg(&scaling, f); }

Test(amp_lessons, loss_scaling_rescues_f16_training) {
    skip_without_data(amp_lesson_loss_scaling(NULL, &scaling));
    amp_loss_scaling_result *r = &scaling;
    const int F32 = AMP_RUN_F32, H = AMP_RUN_F16, HS = AMP_RUN_F16_SCALED, BF = AMP_RUN_BF16;
    /* the first step: identical weights and batch in every run */
    cr_assert_lt(r->zero_frac[F32], 0.01, "f32 gradients are not 0");
    cr_assert_gt(r->zero_frac[H], 0.9, "without scaling most f16 gradients underflow to 0");
    cr_assert_lt(r->zero_frac[HS], 0.01, "with the GradScaler they survive");
    /* the end: unscaled f16 stalls, scaled f16 learns as f32 does */
    cr_assert_gt(r->final_loss[H], 2 * r->final_loss[F32], "%g vs %g", r->final_loss[H],
                 r->final_loss[F32]);
    cr_assert_lt(r->test_acc[H], r->test_acc[F32] - 0.15);
    cr_assert_lt(fabs(r->final_loss[HS] - r->final_loss[F32]), 0.02);
    cr_assert_lt(fabs(r->test_acc[HS] - r->test_acc[F32]), 0.01);
    cr_assert_gt(r->test_acc[F32], 0.8, "the task is learnable in 200 steps");
    /* bf16: f32's range, so no scaler and no zero gradients, and it learns as f32 does */
    cr_assert_lt(r->zero_frac[BF], 0.01, "bf16 gradients do not underflow");
    cr_assert_lt(fabs(r->final_loss[BF] - r->final_loss[F32]), 0.02);
    cr_assert_lt(fabs(r->test_acc[BF] - r->test_acc[F32]), 0.01);
    /* Adam's eps: the factor 1e-5 puts a good part of the f32 gradients below it */
    int64_t below = 0;
    for (int64_t i = 0; i < r->n_grads; i++) below += fabsf(r->grads[i]) < 1e-8f;
    cr_assert_eq(r->below_eps_share, (double)below / (double)r->n_grads);
    cr_assert_gt(r->below_eps_share, 0.1);
    cr_assert_eq(r->scale, 65536.0);
    cr_assert_eq(r->skipped, 0);
    cr_assert_gt(r->zero_share, 0.3, "a good part of the true gradients is below 2^-25");
    cr_assert_lt(r->zero_share_scaled, 1e-4, "scaled, almost none: %g", r->zero_share_scaled);
    expect_quoted(&r->quotes, "amp-loss-scaling");
    char *svg = capture(draw_scaling);
    expect_well_formed_svg(svg);
    cr_assert_eq(count(svg, "class=\"zone-subnormal\""), 1, "the f16 line only");
    cr_assert_gt(count(svg, "class=\"bar\""), 10, "two histograms");
    cr_assert_eq(count(svg, "<rect class=\"legend\""), 2);
    cr_assert(strstr(svg, "(x 65536): 0.0% would round to 0 in f16"));
    cr_assert_eq(count(svg, "class=\"y-label\""), 1, "the bars' axis says what they count");
    expect_doc_picture(svg, "gradients.svg");
    free(svg);
    amp_loss_scaling_free(r);
}

Test(amp_lessons, sawtooth_log_and_its_plot) {
    make_tmpdir();
    char csv[512], svg_path[512];
    snprintf(csv, sizeof csv, "%s/run.csv", tmpdir);
    snprintf(svg_path, sizeof svg_path, "%s/run.svg", tmpdir);
    amp_sawtooth_result r;
    int rc = amp_lesson_sawtooth(NULL, csv, &r);
    if (rc) rm_rf(tmpdir);
    skip_without_data(rc);
    cr_assert_eq(r.steps, AMP_SAWTOOTH_STEPS);
    cr_assert_geq(r.skipped, 5, "it climbs into overflow again and again");
    cr_assert_gt(r.max_scale, 65536.0, "it grew before the first overflow");
    cr_assert_geq(r.first_skip, AMP_SAWTOOTH_INTERVAL);
    cr_assert_lt(r.final_loss, r.first_loss / 3, "the skips do not stop the training");
    FILE *f = fopen(csv, "r");
    cr_assert_not_null(f);
    char line[256];
    int rows = 0, skipped_rows = 0;
    cr_assert_not_null(fgets(line, sizeof line, f));
    while (fgets(line, sizeof line, f)) {
        double step, loss, scale, skipped;
        cr_assert_eq(sscanf(line, "%lf,%lf,%lf,%lf", &step, &loss, &scale, &skipped), 4);
        rows++, skipped_rows += skipped > 0;
    }
    cr_assert_eq(rows, AMP_SAWTOOTH_STEPS);
    cr_assert_eq(skipped_rows, r.skipped);
    /* the same bits with another thread count (and, by na_cpu_set_reproducible, on any CPU) */
    char csv1[512];
    snprintf(csv1, sizeof csv1, "%s/run1.csv", tmpdir);
    int threads = na_get_num_threads();
    cr_assert_eq(na_set_num_threads(threads == 1 ? 2 : 1), 0);
    amp_sawtooth_result r1;
    cr_assert_eq(amp_lesson_sawtooth(NULL, csv1, &r1), 0, "%s", na_last_error());
    cr_assert_eq(na_set_num_threads(threads), 0);
    cr_assert(!na_cpu_reproducible(), "the lesson restores the mode");
    FILE *f1 = fopen(csv1, "r");
    cr_assert_not_null(f1);
    rewind(f);
    int c0, c1;
    do c0 = fgetc(f), c1 = fgetc(f1); while (c0 == c1 && c0 != EOF);
    cr_assert_eq(c0, c1, "the log differs with %d and %d threads", threads, threads == 1 ? 2 : 1);
    fclose(f1);
    rewind(f);
    FILE *svg = fopen(svg_path, "w");
    char err[128];
    cr_assert_eq(amp_plot_svg(f, svg, AMP_SAWTOOTH_TITLE, err, sizeof err), AMP_SAWTOOTH_STEPS,
                 "%s", err);
    fclose(svg);
    fclose(f);
    f = fopen(svg_path, "r");
    static char text[1 << 20];
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    expect_well_formed_svg(text);
    cr_assert_eq(count(text, "class=\"skip\""), r.skipped);
    cr_assert_eq(count(text, "class=\"legend\""), 3, "loss, scale, skipped step");
    cr_assert(strstr(text, ">skipped step (inf/NaN gradients)<"));
    /* each skip's dot at the scale that overflowed: the logged scale is after the update, so
     * a skipped row holds half of it and the row before the scale itself */
    cr_assert_eq(count(text, "class=\"skip-dot\""), r.skipped);
    expect_doc_picture(text, "sawtooth.svg");
    char *guide = read_guide();
    cr_assert(strstr(guide, "amp-plot --title \"" AMP_SAWTOOTH_TITLE "\" sawtooth.csv "
                            "docs/img/sawtooth.svg"), "the guide's command draws this title");
    free(guide);
    expect_quoted(&r.quotes, "amp-overflow --log");
    rm_rf(tmpdir);
}

/* ---- master weights in a real run ------------------------------------------------------------ */

Test(amp_lessons, master_weights_in_a_real_run) {
    amp_master_mlp_result r;
    skip_without_data(amp_lesson_master_mlp(NULL, &r));
    const int F32 = AMP_MLP_F32, B = AMP_MLP_BF16, M = AMP_MLP_MASTERS;
    cr_assert_lt(r.unchanged[F32], 0.01, "f32 weights all move");
    cr_assert_gt(r.unchanged[B], 0.3, "most bf16 updates are rounded away: %g", r.unchanged[B]);
    cr_assert_gt(r.unchanged[M], 0.3, "the bf16 copy of a master moves only in whole steps");
    cr_assert_gt(r.final_loss[B], r.final_loss[F32] + 0.05, "in place, bf16 learns less");
    cr_assert_lt(fabs(r.final_loss[M] - r.final_loss[F32]), 0.01, "masters learn as f32");
    cr_assert_lt(fabs(r.test_acc[M] - r.test_acc[F32]), 0.01);
    expect_quoted(&r.quotes, "amp-master-weights (the MLP)");
}

/* ---- BatchNorm ------------------------------------------------------------------------------- */

Test(amp_lessons, batchnorm_reasons) {
    amp_batchnorm_result r;
    cr_assert_eq(amp_lesson_batchnorm(&r), 0, "%s", na_last_error());
    cr_assert(r.sumsq_f32 > 65504 && isfinite(r.sumsq_f32), "%g", r.sumsq_f32);
    cr_assert(isinf(r.sumsq_f16), "above f16's largest finite number");
    cr_assert_eq(r.f16_counter, 2048.0, "2048 + 1 rounds to 2048 (spacing 2)");
    cr_assert_eq(r.rs_f16, 1.0, "each update is below half the f16 spacing at 1.0");
    cr_assert_eq(r.rs_bf16, 1.0);
    cr_assert_lt(fabs(r.rs_f32 - r.rs_target), 1e-5);
    cr_assert_eq(r.eps_f16, th_round_f16(1e-5));
    cr_assert(r.eps_f16 < ldexp(1, -14) && r.eps_subnormal, "1e-5 < 2^-14: subnormal");
    cr_assert_eq(r.eps_absorbed_f16, ldexp(1, -5));
    cr_assert_eq(r.eps_absorbed_f32, 256.0);
    cr_assert(r.bn_finite);
    cr_assert(r.bn_max_err > 0 && r.bn_max_err < 0.01, "f16 rounding only: %g", r.bn_max_err);
    expect_quoted(&r.quotes, "amp-batchnorm");
}

/* ---- the programs' arguments ----------------------------------------------------------------- */

Test(amp_lessons, arguments) {
    const char *v = "unset";
    char *help[] = {"amp-x", "--help", NULL}, *bad[] = {"amp-x", "--nope", NULL};
    char *svg[] = {"amp-x", "--svg", "out.svg", NULL}, *missing[] = {"amp-x", "--svg", NULL};
    char *flag[] = {"amp-x", "--rules", NULL}, *none[] = {"amp-x", NULL};
    FILE *saved_out = stdout, *saved_err = stderr; /* the usage goes nowhere, stderr is read */
    stdout = fopen("/dev/null", "w"), stderr = tmpfile();
    int rc_help = amp_lesson_args(2, help, "usage\n", "--svg", true, &v);
    int rc_bad = amp_lesson_args(2, bad, "usage\n", "--svg", true, &v);
    int rc_missing = amp_lesson_args(2, missing, "usage\n", "--svg", true, &v);
    char said[256] = {0};
    rewind(stderr);
    size_t got = fread(said, 1, sizeof said - 1, stderr);
    said[got] = '\0';
    fclose(stdout), fclose(stderr);
    stdout = saved_out, stderr = saved_err;
    cr_assert(strstr(said, "amp-x: unexpected argument '--nope'\nusage\n"), "%s", said);
    cr_assert(strstr(said, "amp-x: --svg needs a value\nusage\n"), "%s", said);
    cr_assert_eq(rc_help, 0);
    cr_assert_eq(rc_bad, 2);
    cr_assert_eq(rc_missing, 2, "--svg without its value");
    cr_assert_eq(amp_lesson_args(3, svg, "usage\n", "--svg", true, &v), -1);
    cr_assert_str_eq(v, "out.svg");
    cr_assert_eq(amp_lesson_args(2, flag, "usage\n", "--rules", false, &v), -1);
    cr_assert_str_eq(v, "");
    cr_assert_eq(amp_lesson_args(1, none, "usage\n", "--rules", false, &v), -1);
    cr_assert_null(v);
}

/* ---- FP8: one scale per tensor ------------------------------------------------------------- */

/* Of v's nonzero values, the share with |v| * scale (in f32) <= limit (or > limit: above). */
static double share_beyond(const float *v, int64_t n, double scale, double limit, bool above) {
    int64_t hit = 0, nonzero = 0;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] == 0.0f) continue;
        nonzero++;
        double m = fabs((double)(float)(v[i] * (float)scale));
        hit += above ? m > limit : m <= limit;
    }
    return (double)hit / (double)nonzero;
}

static const amp_fp8_result *fp8_drawn;
static int draw_fp8(FILE *f) { return amp_fp8_svg(fp8_drawn, f); }

Test(amp_lessons, fp8_needs_a_scale_per_tensor_and_delayed_scaling_lags_a_jump) {
    amp_fp8_result r;
    skip_without_data(amp_lesson_fp8(NULL, &r));
    enum { X, W, DY };
    cr_assert_eq(r.n[X], 128 * 784);
    cr_assert_eq(r.n[W], 256 * 784);
    cr_assert_eq(r.n[DY], 128 * 256);
    /* the three amaxes are orders of magnitude apart: no one scale fits them all */
    cr_assert(r.amax[X] > 1 && r.amax[W] < 0.1 && r.amax[DY] < 1e-2, "%g %g %g", r.amax[X],
              r.amax[W], r.amax[DY]);
    for (int k = 0; k < 3; k++) {
        /* unscaled: what rounds to 0 is what lies at or below half the smallest subnormal (ties
         * go to the even 0): 2^-10 in E4M3, 2^-17 in E5M2 */
        cr_assert_float_eq(r.plain[k][0].lost, share_beyond(r.values[k], r.n[k], 1, 0x1p-10, false),
                           1e-12, "role %d e4m3", k);
        cr_assert_float_eq(r.plain[k][1].lost, share_beyond(r.values[k], r.n[k], 1, 0x1p-17, false),
                           1e-12, "role %d e5m2", k);
        for (int f = 0; f < 2; f++) {
            double fmax = f ? 57344.0 : 448.0;
            cr_assert_eq(r.scaled[k][f].scale, (float)(fmax / r.amax[k]));
            cr_assert_eq(r.scaled[k][f].saturated, 0, "the amax lands on fp8_max, none beyond");
            cr_assert_leq(r.scaled[k][f].lost, r.plain[k][f].lost);
            /* 3 (E4M3) or 2 (E5M2) mantissa bits: relative RMS error a few percent */
            cr_assert(r.scaled[k][f].rel_err < (f ? 0.08 : 0.04), "role %d f %d: %g", k, f,
                      r.scaled[k][f].rel_err);
        }
    }
    cr_assert_gt(r.plain[DY][0].lost, 0.99, "the gradient vanishes in E4M3 without a scale");
    cr_assert_eq(r.scaled[DY][0].lost, 0);

    /* the jump: delayed scaling casts step 10 with the scale of the steps before and saturates */
    const int J = AMP_FP8_JUMP_STEP;
    /* TE's rule, in f32: scale = fp8_max / amax, the amax as recorded (an f32) */
    float s0 = 448.0f / (float)r.amax[X], s1 = 448.0f / (float)(r.amax[X] * AMP_FP8_JUMP);
    cr_assert_eq(r.delayed[0].cast.scale, 1.0, "TE's start: scale 1 before the first update");
    cr_assert_eq(r.delayed[J - 1].cast.scale, s0);
    cr_assert_eq(r.delayed[J].cast.scale, s0);
    cr_assert_eq(r.delayed[J].factor, AMP_FP8_JUMP);
    float *x100 = malloc((size_t)r.n[X] * sizeof *x100);
    for (int64_t i = 0; i < r.n[X]; i++) x100[i] = (float)(r.values[X][i] * AMP_FP8_JUMP);
    cr_assert_float_eq(r.delayed[J].cast.saturated, share_beyond(x100, r.n[X], s0, 464, true),
                       1e-12);
    free(x100);
    cr_assert_gt(r.delayed[J].cast.saturated, 0.5);
    /* then the history's max remembers the 100 for its 1024 steps */
    for (int t = J + 1; t < J + 1 + 1024; t++)
        cr_assert_eq(r.delayed[t].cast.scale, s1, "step %d", t);
    cr_assert_eq(r.recovered_at, J + 1 + 1024);
    cr_assert_eq(r.delayed[r.recovered_at].cast.scale, s0);
    /* current scaling follows the jump at once and never saturates */
    for (int t = 0; t < AMP_FP8_JUMP_STEPS; t++) {
        cr_assert_eq(r.current[t].cast.scale, t == J ? s1 : s0, "step %d", t);
        cr_assert_eq(r.current[t].cast.saturated, 0, "step %d", t);
    }
    expect_quoted(&r.quotes, "amp-fp8");
    fp8_drawn = &r;
    char *svg = capture(draw_fp8);
    cr_assert_eq(count(svg, "class=\"bar\"") > 0, true);
    cr_assert_eq(count(svg, "class=\"legend\""), 8, "two histograms on each of four lines");
    /* the legends' shares are the cast's: the gradient vanishes on E4M3's line as it is */
    cr_assert(strstr(svg, "its output's gradient dL/dy (x 1): of the nonzero values 100.0% round "
                          "to 0"));
    expect_doc_picture(svg, "fp8.svg");
    free(svg);
    amp_fp8_free(&r);
}
