/* The autocast trace's backward rows (na_amp_trace_backward, src/amp/backward_trace.c): each
 * node's incoming gradient counted in its own dtype (zero, -0 too; subnormal; inf/NaN) against
 * hand-counted values at each line's boundaries, the rows in the order the nodes run, their
 * text, and the same counts from a CUDA gradient (a host copy). */
#include "helpers.h"

#include "nanoamp/amp.h"
#include "nanoamp/cuda.h"

static void teardown(void) {
    na_amp_trace_backward(false, NULL);
    na_step_end();
}
TestSuite(amp_backward_trace, .fini = teardown);
TestSuite(amp_backward_trace_cuda, .fini = teardown);

typedef struct {
    int n;
    na_amp_backward_record r[16];
    char name[16][32];
} bw_log;

static void collect(const na_amp_backward_record *r, void *ctx) {
    bw_log *l = ctx;
    cr_assert_lt(l->n, 16, "more rows than the test expects");
    l->r[l->n] = *r;
    snprintf(l->name[l->n], sizeof l->name[0], "%s", r->name ? r->name : "(begin)");
    l->n++;
}

/* The rows of y = neg(x), backward with gradient g (dtype dt, on dev): the begin record, then
 * neg's, whose incoming gradient is g itself. */
static bw_log trace_neg(na_dtype dt, na_device dev, int64_t n, const double *g) {
    double *ones = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ones[i] = 1;
    na_tensor *x = th_tensor(dt, dev, NA_SHAPE(n), ones);
    free(ones);
    TH_RC(na_tensor_set_requires_grad(x, true));
    na_tensor *y = TH_OK(na_neg(x));
    bw_log log = {0};
    na_amp_trace_backward_callback(true, collect, &log);
    int rc = na_backward(y, th_tensor(dt, dev, NA_SHAPE(n), g));
    na_amp_trace_backward(false, NULL);
    TH_RC(rc);
    cr_assert_eq(log.n, 2, "the begin record and neg's row");
    cr_assert_null(log.r[0].name);
    cr_assert_str_eq(log.name[1], "neg");
    cr_assert_eq(log.r[1].dtype, dt);
    cr_assert_eq(log.r[1].device, dev);
    cr_assert(log.r[1].ndim == 1 && log.r[1].shape[0] == n && log.r[1].n == n);
    return log;
}

static void expect_counts(const na_amp_backward_record *r, int64_t zero, int64_t subnormal,
                          int64_t nonfinite) {
    cr_assert(r->counted, "%s: counted", na_dtype_name(r->dtype));
    cr_assert_eq(r->zero, zero, "%s: zeros", na_dtype_name(r->dtype));
    cr_assert_eq(r->subnormal, subnormal, "%s: subnormals", na_dtype_name(r->dtype));
    cr_assert_eq(r->nonfinite, nonfinite, "%s: inf/NaN", na_dtype_name(r->dtype));
}

/* Each dtype's line at its edges: -0 is a zero, the smallest subnormal and the largest
 * subnormal are subnormal, the smallest normal is not, inf and NaN of either sign are
 * non-finite. */
static const double F32_G[] = {0.0, -0.0, 0x1p-149, -0x1.fffffcp-127, 0x1p-126, 1.0,
                               INFINITY, -INFINITY, NAN};
static const double F16_G[] = {0.0, -0.0, 0x1p-24, -0x1.ff8p-15, 0x1p-14, 65504.0,
                               0x1p-30 /* rounds to 0 when the f16 gradient is made */,
                               INFINITY, -NAN};
static const double BF16_G[] = {-0.0, 0x1p-133, 0x1p-127, 0x1p-126,
                                0x1p-30 /* normal in bf16, 0 in f16 */, -INFINITY, NAN};
#define COUNT(a) ((int64_t)(sizeof(a) / sizeof(a)[0]))

Test(amp_backward_trace, counts_zero_subnormal_and_nonfinite_in_the_gradients_dtype) {
    bw_log l = trace_neg(NA_DTYPE_F32, NA_DEVICE_CPU, COUNT(F32_G), F32_G);
    expect_counts(&l.r[1], 2, 2, 3);
    l = trace_neg(NA_DTYPE_F16, NA_DEVICE_CPU, COUNT(F16_G), F16_G);
    expect_counts(&l.r[1], 3, 2, 2);
    l = trace_neg(NA_DTYPE_BF16, NA_DEVICE_CPU, COUNT(BF16_G), BF16_G);
    expect_counts(&l.r[1], 1, 2, 2);
    /* an f64 gradient has no line here: a row without counts */
    l = trace_neg(NA_DTYPE_F64, NA_DEVICE_CPU, COUNT(F32_G), F32_G);
    cr_assert(!l.r[1].counted);
    char line[192];
    na_amp_trace_backward_format(&l.r[1], line, sizeof line);
    cr_assert(strstr(line, "zero       -  subnormal       -  non-finite       -"), "%s", line);
}

Test(amp_backward_trace, the_rows_text) {
    char line[192];
    bw_log l = trace_neg(NA_DTYPE_F32, NA_DEVICE_CPU, COUNT(F32_G), F32_G);
    cr_assert_str_eq(na_amp_trace_backward_format(&l.r[0], line, sizeof line), "backward");
    /* 2, 2 and 3 of 9 */
    cr_assert_str_eq(na_amp_trace_backward_format(&l.r[1], line, sizeof line),
                     "neg             grad f32   [9]              zero  22.22%  subnormal  22.22%"
                     "  non-finite  33.33%");
    /* one element of 20001 is not "0.00%", 20000 of them not "100.00%" */
    na_amp_backward_record r = {.name = "mul", .dtype = NA_DTYPE_F16, .ndim = 2,
                                .shape = {3, 6667}, .n = 20001, .counted = true,
                                .zero = 20000, .subnormal = 1, .nonfinite = 0};
    cr_assert_str_eq(na_amp_trace_backward_format(&r, line, sizeof line),
                     "mul             grad f16   [3,6667]         zero >99.99%  subnormal  <0.01%"
                     "  non-finite   0.00%");
}

/* z = sum(exp(x) * w): the rows follow the engine's order (sum, mul, exp), each with the
 * gradient of its op's output; printed, they are one "backward" line and one line per node.
 * Counting runs no op: a forward trace open during backward sees the same ops with the
 * backward rows on and off. */
Test(amp_backward_trace, rows_in_the_order_the_nodes_run) {
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(3), TH_V(0, 1, -200));
    na_tensor *w = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3), 0, 2, 3);
    int forward_ops[2];
    bw_log log = {0};
    char *text = NULL;
    size_t len = 0;
    for (int on = 0; on < 2; on++) {
        na_tensor *z = TH_OK(na_sum(TH_OK(na_mul(TH_OK(na_exp(x)), w))));
        th_trace_log fwd = {0};
        na_autocast_trace_callback(NA_AMP_TRACE_ALL, th_trace_collect, &fwd);
        na_amp_trace_backward_callback(on, collect, &log);
        TH_RC(na_backward_retain(z, NULL));
        FILE *f = on ? open_memstream(&text, &len) : NULL;
        if (f) na_amp_trace_backward(true, f);
        TH_RC(na_backward(z, NULL));
        na_amp_trace_backward(false, NULL);
        na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
        if (f) fclose(f);
        forward_ops[on] = fwd.n;
    }
    cr_assert_eq(forward_ops[1], forward_ops[0], "the counting ran ops of its own");
    cr_assert_eq(log.n, 4);
    const char *want[4] = {"(begin)", "sum", "mul", "exp"};
    const int ndim[4] = {0, 0, 1, 1};
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(log.name[i], want[i], "row %d", i);
        cr_assert_eq(log.r[i].ndim, ndim[i], "row %d", i);
    }
    cr_assert_eq(log.r[1].dtype, NA_DTYPE_F32);
    /* mul's gradient is ones; exp's is w (one 0); x's own gradient exp(x) w holds
     * exp(-200) * 3, 0 in f32, but no node receives it */
    expect_counts(&log.r[2], 0, 0, 0);
    expect_counts(&log.r[3], 1, 0, 0);
    cr_assert_not_null(text);
    char *lines[8];
    int n = 0;
    for (char *p = strtok(text, "\n"); p && n < 8; p = strtok(NULL, "\n")) lines[n++] = p;
    cr_assert_eq(n, 4, "one line per record");
    cr_assert_str_eq(lines[0], "amp: backward");
    for (int i = 1; i < 4; i++) {
        char row[192];
        snprintf(row, sizeof row, "amp: %s", na_amp_trace_backward_format(&log.r[i], row + 5,
                                                                          sizeof row - 5));
        cr_assert_str_eq(lines[i], row, "line %d", i);
    }
    free(text);
}

/* The counting copies a gradient's bits, filling only that gradient where zero_grad marked it
 * (not every marked one, as before: the engine would lose its in-place first writes): it
 * reads as zeros. */
Test(amp_backward_trace, a_marked_gradient_counts_as_zeros) {
    na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4));
    cr_assert_not_null(w, "%s", na_last_error());
    TH_RC(na_tensor_set_requires_grad(w, true));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(w, w)))), NULL));
    TH_RC(na_tensor_zero_grad(w));
    na_amp_hist h;
    TH_RC(na_amp_hist_init(&h, NA_DTYPE_F32));
    TH_RC(na_amp_hist_add_tensor(&h, w->grad));
    cr_assert(h.n == 4 && h.zero == 4, "%lld of %lld zero", (long long)h.zero, (long long)h.n);
    na_tensor_free(w);
}

Test(amp_backward_trace_cuda, a_cuda_gradient_is_counted_as_on_the_cpu) {
    if (!na_cuda_available()) cr_skip_test("no CUDA device");
    const struct {
        na_dtype dt;
        const double *g;
        int64_t n;
    } cases[] = {{NA_DTYPE_F32, F32_G, COUNT(F32_G)}, {NA_DTYPE_F16, F16_G, COUNT(F16_G)},
                 {NA_DTYPE_BF16, BF16_G, COUNT(BF16_G)}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bw_log cpu = trace_neg(cases[c].dt, NA_DEVICE_CPU, cases[c].n, cases[c].g);
        bw_log gpu = trace_neg(cases[c].dt, NA_DEVICE_CUDA, cases[c].n, cases[c].g);
        expect_counts(&gpu.r[1], cpu.r[1].zero, cpu.r[1].subnormal, cpu.r[1].nonfinite);
    }
}
