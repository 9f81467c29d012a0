/* The training monitor (skip rate, alerts, CSV) and the CSV -> SVG plotter of examples/amp. */
#include <signal.h>
#include <sys/resource.h>

#include "helpers.h"

#include "../examples/amp/amp_plot.h"
#include "nanoamp/fp8.h"
#include "nanoamp/io.h"
#include "nanoamp/optim.h"

static void teardown(void) { na_step_end(); }
TestSuite(amp_monitor, .fini = teardown);

/* An empty file at path (a mkstemp template, filled in). */
static void temp_file(char *path) {
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp %s", path);
    close(fd);
}

static na_amp_monitor *monitor(na_amp_monitor_cfg c) {
    na_amp_monitor *m = na_amp_monitor_new(&c);
    cr_assert_not_null(m, "%s", na_last_error());
    return m;
}

Test(amp_monitor, skip_rate_over_the_window) {
    na_amp_monitor_cfg c = NA_AMP_MONITOR_DEFAULTS;
    c.window = 10;
    na_amp_monitor *m = monitor(c);
    unsigned a = 0;
    for (int i = 0; i < 10; i++) a = na_amp_monitor_record(m, i, 1.0, 65536, i < 2);
    cr_assert_eq(na_amp_monitor_skip_rate(m), 0.2);
    cr_assert_eq(a & NA_AMP_ALERT_SKIP_RATE, 0);
    for (int i = 10; i < 14; i++) a = na_amp_monitor_record(m, i, 1.0, 65536, true);
    /* window now: steps 4..13, skips at 10..13 */
    cr_assert_eq(na_amp_monitor_skip_rate(m), 0.4);
    cr_assert(a & NA_AMP_ALERT_SKIP_RATE);
    cr_assert_eq(na_amp_monitor_skipped(m), 6);
    cr_assert_eq(na_amp_monitor_steps(m), 14);
    char buf[256];
    cr_assert(strstr(na_amp_monitor_describe(m, buf, sizeof buf), "40% of the last 10 steps"),
              "%s", buf);
    na_amp_monitor_free(m);
}

Test(amp_monitor, scale_collapse_and_loss_alerts) {
    na_amp_monitor *m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
    unsigned a = 0;
    double scale = 65536;
    for (int i = 0; i < 10; i++) a = na_amp_monitor_record(m, i, 1.0, scale /= 1.2, false);
    cr_assert_eq(a & NA_AMP_ALERT_SCALE_COLLAPSE, 0, "only 10 records");
    a = na_amp_monitor_record(m, 10, 1.0, scale / 1.2, false); /* 1.2^10 ~ 6.2: not yet 10x */
    cr_assert_eq(a & NA_AMP_ALERT_SCALE_COLLAPSE, 0);
    for (int i = 11; i < 14; i++) a = na_amp_monitor_record(m, i, 1.0, scale /= 2, false);
    cr_assert(a & NA_AMP_ALERT_SCALE_COLLAPSE);
    cr_assert(na_amp_monitor_alerts(m) & NA_AMP_ALERT_SCALE_COLLAPSE);
    a = na_amp_monitor_record(m, 14, NAN, scale, true);
    cr_assert(a & NA_AMP_ALERT_NONFINITE_LOSS);
    na_amp_monitor_free(m);

    na_amp_monitor_cfg c = NA_AMP_MONITOR_DEFAULTS;
    c.loss_rise_steps = 5;
    m = monitor(c);
    for (int i = 0; i < 20; i++) a = na_amp_monitor_record(m, i, 2.0 - 0.05 * i, 1024, false);
    cr_assert_eq(a & NA_AMP_ALERT_LOSS_RISING, 0);
    for (int i = 0; i < 4; i++) a = na_amp_monitor_record(m, 20 + i, 3.0 + i, 1024, false);
    cr_assert_eq(a & NA_AMP_ALERT_LOSS_RISING, 0, "4 rising steps");
    a = na_amp_monitor_record(m, 24, 8.0, 1024, false);
    cr_assert(a & NA_AMP_ALERT_LOSS_RISING);
    na_amp_monitor_free(m);
}

/* A scale at its floor means the gradients overflow even there: the scaler can do nothing
 * more. From numbers (the floor 2^-24, or cfg.scale_floor) and from a scaler (its own lower
 * bound: min_scale, else the floor). */
Test(amp_monitor, scale_at_the_floor) {
    na_amp_monitor *m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
    unsigned a = na_amp_monitor_record(m, 0, 1.0, 2 * NA_GRAD_SCALER_FLOOR, true);
    cr_assert_eq(a & NA_AMP_ALERT_SCALE_FLOOR, 0);
    a = na_amp_monitor_record(m, 1, 1.0, NA_GRAD_SCALER_FLOOR, true);
    cr_assert(a & NA_AMP_ALERT_SCALE_FLOOR);
    char buf[256];
    cr_assert(strstr(na_amp_monitor_describe(m, buf, sizeof buf), "floor"), "%s", buf);
    na_amp_monitor_free(m);
    na_amp_monitor_cfg c = NA_AMP_MONITOR_DEFAULTS;
    c.scale_floor = 1.0;
    m = monitor(c);
    cr_assert(na_amp_monitor_record(m, 0, 1.0, 1.0, true) & NA_AMP_ALERT_SCALE_FLOOR);
    na_amp_monitor_free(m);

    for (int with_min = 0; with_min < 2; with_min++) {
        na_grad_scaler_cfg gc = {.kind = NA_SCALER_GRAD, .init_scale = 4, .growth_factor = 2,
                                 .backoff_factor = 0.5, .growth_interval = 2000,
                                 .min_scale = with_min ? 1.0 : 0.0, .enabled = true};
        na_grad_scaler *gs = na_grad_scaler_new(&gc);
        cr_assert_not_null(gs, "%s", na_last_error());
        na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
        TH_RC(na_fill_(w, 1.0));
        TH_RC(na_tensor_set_requires_grad(w, true));
        na_sgd_cfg sc = {.lr = 0.1};
        na_optim *opt = na_sgd_new(NA_NO_TENSORS, &sc);
        cr_assert_eq(na_optim_add_group(opt, NA_TENSORS(w)), 0);
        m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
        int first_alert = -1;
        for (int i = 0; i < 40 && first_alert < 0; i++) { /* every step overflows */
            na_tensor *loss = TH_OK(na_sum(TH_OK(na_scale(w, INFINITY))));
            TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, loss)), NULL));
            TH_RC(na_grad_scaler_step(gs, opt));
            TH_RC(na_grad_scaler_update(gs));
            TH_RC(na_optim_zero_grad(opt));
            if (na_amp_monitor_record_scaler(m, i, loss, gs) & NA_AMP_ALERT_SCALE_FLOOR)
                first_alert = i;
            na_step_end();
        }
        /* 4 -> 2 -> 1: at min_scale 1 after 2 updates; 4 * 2^-k = 2^-24 after 26 */
        cr_assert_eq(first_alert, with_min ? 1 : 25, "min_scale %g: first alert at %d",
                     gc.min_scale, first_alert);
        na_amp_monitor_free(m);
        na_optim_free(opt);
        na_tensor_free(w);
        na_grad_scaler_free(gs);
    }
}

/* A log that cannot be written says why at once; one that fills up (here a file size limit,
 * as a full disk) stops there and says so, never a silently short log. */
Test(amp_monitor, csv_write_errors_are_reported_with_the_file_and_reason) {
    na_amp_monitor *m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
    cr_assert_eq(na_amp_monitor_open_csv(m, "/tmp"), NA_EIO);
    cr_assert(strstr(na_last_error(), "'/tmp': Is a directory"), "%s", na_last_error());
    cr_assert_eq(na_amp_monitor_open_csv(m, "/dev/full"), NA_EIO);
    cr_assert(strstr(na_last_error(), "'/dev/full': No space left on device"), "%s",
              na_last_error());

    char csv[] = "/tmp/amp_monitor_XXXXXX";
    temp_file(csv);
    TH_RC(na_amp_monitor_open_csv(m, csv));
    signal(SIGXFSZ, SIG_IGN); /* the write then fails with EFBIG instead of killing us */
    struct rlimit lim = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int64_t step = 0;
    for (; step < 1000 && na_amp_monitor_csv_status(m) == NA_OK; step++)
        na_amp_monitor_record(m, step, 0.5, 65536, false);
    cr_assert_lt(step, 1000, "4096 bytes hold fewer than 1000 lines");
    cr_assert_gt(step, 10);
    cr_assert_eq(na_amp_monitor_csv_status(m), NA_EIO);
    cr_assert(strstr(na_last_error(), csv), "%s", na_last_error());
    cr_assert(strstr(na_last_error(), "File too large"), "%s", na_last_error());
    na_amp_monitor_free(m);
    remove(csv);
}

Test(amp_monitor, csv_from_a_scaler_and_the_svg_plot) {
    char csv[] = "/tmp/amp_monitor_XXXXXX";
    temp_file(csv);
    na_amp_monitor *m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
    TH_RC(na_amp_monitor_open_csv(m, csv));
    na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
    gc.growth_interval = 3;
    na_grad_scaler *gs = na_grad_scaler_new(&gc);
    na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3));
    TH_RC(na_fill_(w, 1.0));
    TH_RC(na_tensor_set_requires_grad(w, true));
    na_sgd_cfg sc = {.lr = 0.01};
    na_optim *opt = na_sgd_new(NA_NO_TENSORS, &sc);
    cr_assert_eq(na_optim_add_group(opt, NA_TENSORS(w)), 0);
    for (int step = 0; step < 8; step++) {
        na_tensor *loss = TH_OK(na_sum(TH_OK(na_mul(w, w))));
        TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, loss)), NULL));
        if (step == 4) TH_RC(na_fill_(w->grad, NAN));
        TH_RC(na_grad_scaler_step(gs, opt));
        TH_RC(na_grad_scaler_update(gs));
        TH_RC(na_optim_zero_grad(opt));
        if (step % 2 == 1) /* every other step: skips in between are still counted */
            na_amp_monitor_record_scaler(m, step, loss, gs);
        na_step_end();
    }
    cr_assert_eq(na_amp_monitor_skipped(m), 1);
    cr_assert_eq(na_amp_monitor_steps(m), 8);
    cr_assert_eq(na_amp_monitor_scale(m), na_grad_scaler_get_scale(gs));
    na_amp_monitor_free(m); /* closes the file */

    FILE *f = fopen(csv, "r");
    char line[256];
    cr_assert(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "step,loss,scale,skipped\n");
    int rows = 0, skipped_rows = 0;
    while (fgets(line, sizeof line, f)) {
        long long s, k;
        double loss, scale;
        cr_assert_eq(sscanf(line, "%lld,%lf,%lf,%lld", &s, &loss, &scale, &k), 4, "%s", line);
        rows++;
        skipped_rows += k > 0;
        if (s == 5) cr_assert_eq(k, 1, "the skip at step 4 is reported at step 5");
    }
    cr_assert_eq(rows, 4);
    cr_assert_eq(skipped_rows, 1);
    rewind(f);
    char svg_path[] = "/tmp/amp_plot_XXXXXX";
    temp_file(svg_path);
    FILE *svg = fopen(svg_path, "w");
    cr_assert_not_null(svg);
    char err[128];
    cr_assert_eq(amp_plot_svg(f, svg, "test <run>", err, sizeof err), 4, "%s", err);
    fclose(svg);
    fclose(f);
    f = fopen(svg_path, "r");
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_assert(strstr(text, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    cr_assert(strstr(text, "test &lt;run&gt; (4 steps, 1 skipped)"), "title escaped");
    cr_assert(strstr(text, "loss scale (log2 axis)"));
    int polylines = 0, skips = 0;
    for (const char *p = text; (p = strstr(p, "<polyline")); p++) polylines++;
    for (const char *p = text; (p = strstr(p, "class=\"skip\"")); p++) skips++;
    cr_assert_eq(polylines, 2, "the loss and the scale");
    cr_assert_eq(skips, 1);
    cr_assert(strstr(text, "2^16"), "log2 ticks");
    cr_assert(strstr(text, "</svg>"));
    remove(csv);
    remove(svg_path);
    na_optim_free(opt);
    na_tensor_free(w);
    na_grad_scaler_free(gs);
}

/* One training step with a scaler (the gradients made non-finite when overflow), recorded. */
static unsigned monitored_step(na_amp_monitor *m, na_grad_scaler *gs, na_optim *opt, na_tensor *w,
                               int step, bool overflow) {
    na_tensor *loss = TH_OK(na_sum(TH_OK(na_mul(w, w))));
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, loss)), NULL));
    if (overflow) TH_RC(na_fill_(w->grad, INFINITY));
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    TH_RC(na_optim_zero_grad(opt));
    unsigned a = na_amp_monitor_record_scaler(m, step, loss, gs);
    na_step_end();
    return a;
}

typedef struct {
    na_amp_monitor *m;
    na_grad_scaler *gs;
    na_optim *opt;
    na_tensor *w;
} monitored_run;

static monitored_run monitored_new(void) {
    na_amp_monitor_cfg mc = NA_AMP_MONITOR_DEFAULTS;
    mc.window = 4, mc.skip_rate_alert = 0.2;
    na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
    gc.growth_interval = 3;
    monitored_run r = {.m = monitor(mc), .gs = na_grad_scaler_new(&gc),
                       .w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3))};
    TH_RC(na_fill_(r.w, 1.0));
    TH_RC(na_tensor_set_requires_grad(r.w, true));
    r.opt = na_sgd_new(NA_TENSORS(r.w), &(na_sgd_cfg){.lr = 0.01});
    cr_assert(r.m && r.gs && r.opt, "%s", na_last_error());
    return r;
}

static void monitored_free(monitored_run *r) {
    na_amp_monitor_free(r->m), na_grad_scaler_free(r->gs), na_optim_free(r->opt);
    na_tensor_free(r->w);
}

/* The monitor's state saved with the scaler's: a resumed run counts and alerts as one that
 * never stopped (a fresh monitor would take the restored scaler's whole history for its first
 * record: 6 steps with 2 skips, a skip rate of 1/3 over the window instead of 1/4). */
Test(amp_monitor, resumes_from_its_state) {
    char path[] = "/tmp/amp_monitor_ck_XXXXXX";
    temp_file(path);
    bool overflow[7] = {0, 1, 0, 1, 0, 0, 0};
    monitored_run a = monitored_new(), b = monitored_new();
    for (int i = 0; i < 6; i++) monitored_step(a.m, a.gs, a.opt, a.w, i, overflow[i]);
    na_named_tensors st = {0};
    TH_RC(na_amp_monitor_state(a.m, "monitor.", &st));
    TH_RC(na_grad_scaler_state(a.gs, "scaler.", &st));
    TH_RC(na_optim_state(a.opt, "optim.", &st));
    TH_RC(na_named_tensors_add(&st, a.w, "w"));
    cr_assert_str_eq(st.items[0].name, "monitor.counters");
    cr_assert_str_eq(st.items[1].name, "monitor.skip_window");
    cr_assert_eq(st.items[1].tensor->shape[0], 4);
    cr_assert_str_eq(st.items[2].name, "monitor.scale_history");
    TH_RC(na_checkpoint_save_list(path, &st));
    na_named_tensors_free(&st);

    TH_RC(na_amp_monitor_state(b.m, "monitor.", &st));
    TH_RC(na_grad_scaler_state(b.gs, "scaler.", &st));
    TH_RC(na_optim_state(b.opt, "optim.", &st));
    TH_RC(na_named_tensors_add(&st, b.w, "w"));
    TH_RC(na_checkpoint_load_list(path, &st, true));
    unsigned alerts_a = monitored_step(a.m, a.gs, a.opt, a.w, 6, overflow[6]);
    unsigned alerts_b = monitored_step(b.m, b.gs, b.opt, b.w, 6, overflow[6]);
    cr_assert_eq(na_amp_monitor_steps(b.m), 7);
    cr_assert_eq(na_amp_monitor_skipped(b.m), 2);
    cr_assert_eq(na_amp_monitor_skip_rate(b.m), 0.25, "%g", na_amp_monitor_skip_rate(b.m));
    cr_assert_eq(na_amp_monitor_skip_rate(b.m), na_amp_monitor_skip_rate(a.m));
    cr_assert_eq(alerts_b, alerts_a);
    cr_assert_eq(na_amp_monitor_scale(b.m), na_amp_monitor_scale(a.m));

    /* a loaded count that is no count is refused at the next record, which records nothing */
    TH_RC(na_fill_(na_named_tensors_find(&st, "monitor.skip_window"), -1.0));
    cr_assert_eq(monitored_step(b.m, b.gs, b.opt, b.w, 7, false), 0);
    cr_assert(strstr(na_last_error(), "as loaded or set"), "%s", na_last_error());
    cr_assert_eq(na_amp_monitor_steps(b.m), 7);
    na_named_tensors_free(&st);
    monitored_free(&a), monitored_free(&b);
    remove(path);
}

Test(amp_monitor, plot_rejects_bad_logs) {
    char err[128];
    FILE *in = fmemopen((char[]){"a,b,c\n1,2,3\n"}, 12, "r");
    FILE *out = fopen("/dev/null", "w");
    cr_assert_eq(amp_plot_svg(in, out, "x", err, sizeof err), -1);
    cr_assert(strstr(err, "header"));
    fclose(in);
    in = fmemopen((char[]){"step,loss,scale,skipped\n1,2\n"}, 29, "r");
    cr_assert_eq(amp_plot_svg(in, out, "x", err, sizeof err), -1);
    cr_assert(strstr(err, "line 2"), "%s", err);
    fclose(in);
    fclose(out);
}

Test(amp_monitor, invalid_config) {
    na_amp_monitor_cfg c = NA_AMP_MONITOR_DEFAULTS;
    c.window = 0;
    TH_EXPECT_ERROR(na_amp_monitor_new(&c), NA_EINVAL, "window");
}

/* A resumed run's log goes on after the interrupted one's lines: one header, every record. */
Test(amp_monitor, append_csv_keeps_the_earlier_lines) {
    char csv[] = "/tmp/amp_monitor_XXXXXX";
    temp_file(csv);
    for (int run = 0; run < 2; run++) {
        na_amp_monitor *m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
        TH_RC(run ? na_amp_monitor_append_csv(m, csv) : na_amp_monitor_open_csv(m, csv));
        for (int step = 0; step < 3; step++)
            na_amp_monitor_record(m, 3 * run + step, 1.0, 1.0, false);
        na_amp_monitor_free(m);
    }
    FILE *f = fopen(csv, "r");
    char line[256];
    int lines = 0, headers = 0, last = -1;
    while (fgets(line, sizeof line, f)) {
        lines++;
        if (!strncmp(line, "step,", 5)) headers++;
        else last = atoi(line);
    }
    fclose(f);
    cr_assert_eq(headers, 1);
    cr_assert_eq(lines, 7, "%d lines", lines);
    cr_assert_eq(last, 5);
    /* a new file gets its header */
    unlink(csv);
    na_amp_monitor *m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
    TH_RC(na_amp_monitor_append_csv(m, csv));
    na_amp_monitor_free(m);
    f = fopen(csv, "r");
    cr_assert(fgets(line, sizeof line, f) && !strncmp(line, "step,loss,scale,skipped", 23));
    fclose(f);
    unlink(csv);
}

/* ---- na_amp_hist: the zones of the f16 and bf16 lines at their boundaries ------------------ */

static na_amp_hist hist_of(na_dtype dt, const float *v, int64_t n) {
    na_amp_hist h;
    cr_assert_eq(na_amp_hist_init(&h, dt), NA_OK, "%s", na_last_error());
    cr_assert_eq(na_amp_hist_add(&h, v, n), NA_OK, "%s", na_last_error());
    return h;
}
static int64_t bin(const na_amp_hist *h, int log2_floor) {
    return h->bins[log2_floor - NA_AMP_HIST_LO];
}

Test(amp_hist, f16_boundaries) {
    const float v[] = {
        0.0f,                         /* zero */
        ldexpf(1, -26),               /* underflow */
        ldexpf(1, -25),               /* half the smallest subnormal: ties to even, 0 */
        -ldexpf(1.5f, -25),           /* rounds up to -2^-24: subnormal */
        ldexpf(1, -24),               /* the smallest subnormal */
        ldexpf(1, -14) - ldexpf(1, -25), /* halfway to 2^-14: rounds to the normal */
        ldexpf(1, -14),               /* the smallest normal */
        65504.0f, 65519.0f,           /* the largest, and the last that rounds to it */
        65520.0f, -1e6f,              /* overflow */
        INFINITY, NAN,                /* not finite */
    };
    na_amp_hist h = hist_of(NA_DTYPE_F16, v, 13);
    cr_assert_eq(h.n, 13);
    cr_assert_eq(h.zero, 1);
    cr_assert_eq(h.underflow, 2);
    cr_assert_eq(h.subnormal, 2);
    cr_assert_eq(h.normal, 4);
    cr_assert_eq(h.overflow, 2);
    cr_assert_eq(h.nonfinite, 2);
    /* bins of log2 |x| as given (not rounded) */
    cr_assert_eq(bin(&h, -26), 1);
    cr_assert_eq(bin(&h, -25), 2); /* 2^-25 and 1.5 x 2^-25 */
    cr_assert_eq(bin(&h, -24), 1);
    cr_assert_eq(bin(&h, -15), 1); /* 2^-14 - 2^-25 */
    cr_assert_eq(bin(&h, -14), 1);
    cr_assert_eq(bin(&h, 15), 3);  /* 65504, 65519, 65520 */
    cr_assert_eq(bin(&h, 19), 1);  /* 1e6 */
    int64_t total = 0;
    for (int b = 0; b < NA_AMP_HIST_BINS; b++) total += h.bins[b];
    cr_assert_eq(total, 10); /* every nonzero finite value once */
}

Test(amp_hist, fp8_boundaries) {
    const float e4[] = {
        ldexpf(1, -10),          /* half the smallest subnormal 2^-9: ties to even, 0 */
        ldexpf(1.5f, -10),       /* rounds up to 2^-9: subnormal */
        ldexpf(1, -7),           /* subnormal (normals from 2^-6) */
        ldexpf(1, -6), 448.0f,   /* the smallest normal, the largest */
        464.0f,                  /* the tie above 448: to the even 448 */
        -464.5f, 1e6f,           /* beyond: clipped to 448 by the cast, overflow here */
    };
    na_amp_hist h = hist_of(NA_DTYPE_F8E4M3, e4, 8);
    cr_assert_eq(h.underflow, 1);
    cr_assert_eq(h.subnormal, 2);
    cr_assert_eq(h.normal, 3);
    cr_assert_eq(h.overflow, 2);
    const float e5[] = {
        ldexpf(1, -17),          /* half of 2^-16: 0 */
        ldexpf(1, -16), ldexpf(1, -15), /* subnormals (normals from 2^-14) */
        ldexpf(1, -14), 57344.0f, 61439.0f, /* normal; the last below the tie rounds to 57344 */
        61440.0f,                /* the tie: inf, as PyTorch's cast */
    };
    h = hist_of(NA_DTYPE_F8E5M2, e5, 7);
    cr_assert_eq(h.underflow, 1);
    cr_assert_eq(h.subnormal, 2);
    cr_assert_eq(h.normal, 3);
    cr_assert_eq(h.overflow, 1);
    int sub, norm;
    double max;
    cr_assert_eq(na_amp_dtype_range(NA_DTYPE_F8E4M3, &sub, &norm, &max), NA_OK);
    cr_assert(sub == -9 && norm == -6 && max == 448.0);
    cr_assert_eq(na_amp_dtype_range(NA_DTYPE_F8E5M2, &sub, &norm, &max), NA_OK);
    cr_assert(sub == -16 && norm == -14 && max == 57344.0);
    cr_assert_eq(na_amp_dtype_range(NA_DTYPE_I32, NULL, NULL, NULL), NA_EDTYPE);
}

Test(amp_hist, bf16_boundaries) {
    const float v[] = {
        ldexpf(1, -134),         /* half the smallest subnormal: 0 */
        ldexpf(1, -133),         /* the smallest subnormal */
        ldexpf(1, -127),         /* a subnormal */
        ldexpf(1, -126),         /* the smallest normal */
        3.3895313892515355e38f,  /* the largest */
        3.4028234663852886e38f,  /* f32's largest: inf in bf16 */
        ldexpf(1, -30),          /* 0 in f16, normal in bf16 */
    };
    na_amp_hist h = hist_of(NA_DTYPE_BF16, v, 7);
    cr_assert_eq(h.underflow, 1);
    cr_assert_eq(h.subnormal, 2);
    cr_assert_eq(h.normal, 3);
    cr_assert_eq(h.overflow, 1);
    cr_assert_eq(bin(&h, -134), 1);
    cr_assert_eq(bin(&h, 127), 2);
    int sub, norm;
    double max;
    cr_assert_eq(na_amp_dtype_range(NA_DTYPE_BF16, &sub, &norm, &max), NA_OK);
    cr_assert(sub == -133 && norm == -126 && max == 3.3895313892515355e38);
    cr_assert_eq(na_amp_dtype_range(NA_DTYPE_F16, &sub, &norm, &max), NA_OK);
    cr_assert(sub == -24 && norm == -14 && max == 65504.0);
}

Test(amp_hist, f32_line_and_tensor_copies) {
    /* on the f32 line nothing given as f32 underflows; an f16 tensor is counted from its values */
    na_amp_hist h;
    cr_assert_eq(na_amp_hist_init(&h, NA_DTYPE_F32), NA_OK);
    float v[] = {ldexpf(1, -149), ldexpf(1, -126), 1.0f, 0.0f};
    na_tensor *t = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4), v);
    na_tensor *t16 = na_cast(t, NA_DTYPE_F16); /* 2^-149, 2^-126 round to 0 in f16 */
    cr_assert_eq(na_amp_hist_add_tensor(&h, t), NA_OK, "%s", na_last_error());
    cr_assert(h.subnormal == 1 && h.normal == 2 && h.zero == 1 && h.underflow == 0);
    cr_assert_eq(na_amp_hist_add_tensor(&h, t16), NA_OK, "%s", na_last_error());
    cr_assert_eq(h.zero, 4);
    cr_assert_eq(h.n, 8);
    /* refused: a dtype without a line, an uninitialized histogram, an integer tensor */
    cr_assert_eq(na_amp_hist_init(&h, NA_DTYPE_F64), NA_EDTYPE);
    cr_assert(strstr(na_last_error(), "f64"), "%s", na_last_error());
    na_tensor *ti = na_from_host(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(1), (int32_t[]){1});
    cr_assert_eq(na_amp_hist_add_tensor(&h, ti), NA_EDTYPE);
    cr_assert(strstr(na_last_error(), "na_amp_hist_add_tensor"), "%s", na_last_error());
}

/* the run report's picture of counted bins: one bar per nonzero bin on the axis, the four
 * zones, beyond the axis drawn at its ends */
Test(amp_hist, hist_line_svg) {
    double count[NA_AMP_HIST_BINS] = {0};
    count[-20 - NA_AMP_HIST_LO] = 5, count[3 - NA_AMP_HIST_LO] = 1;
    count[-100 - NA_AMP_HIST_LO] = 2; /* below f16's axis (2^-48): at its left end */
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    cr_assert_eq(amp_plot_hist_line(f, "grads <1>", "f16", count, NA_AMP_HIST_LO,
                                    NA_AMP_HIST_BINS, "#123456"), 0);
    fclose(f);
    int bars = 0;
    for (const char *p = buf; (p = strstr(p, "class=\"bar\"")); p++) bars++;
    cr_assert_eq(bars, 3, "%s", buf);
    cr_assert(strstr(buf, "grads &lt;1&gt;"));
    cr_assert(strstr(buf, "zone-zero") && strstr(buf, "zone-subnormal") &&
              strstr(buf, "zone-normal") && strstr(buf, "zone-overflow"));
    cr_assert(strstr(buf, "subnormals from 2^-24, normals from 2^-14, largest 65504"), "%s", buf);
    free(buf);
    f = open_memstream(&buf, &n);
    cr_assert_eq(amp_plot_hist_line(f, "x", "fp8", count, NA_AMP_HIST_LO, NA_AMP_HIST_BINS, "#000"), -1);
    fclose(f);
    free(buf);
}

/* --amp fp8's log: per tensor its scale and running saturated count, drawn by amp-plot. The
 * scripted amax values make the input's cast saturate in the third step. */
Test(amp_monitor, fp8_scales_and_saturation_in_the_csv_and_the_plot) {
    char csv[] = "/tmp/amp_monitor_XXXXXX";
    temp_file(csv);
    na_module *net = na_linear_new(4, 2, false);
    na_fp8_model *fm = na_fp8_model_new(net, NULL);
    na_amp_monitor *m = monitor((na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS);
    TH_RC(na_amp_monitor_watch_fp8(m, fm));
    TH_RC(na_amp_monitor_open_csv(m, csv));
    cr_assert_eq(na_amp_monitor_watch_fp8(m, fm), NA_ESTATE, "the header is written");
    na_fp8_scaling *s = na_fp8_model_layer(fm, 0, NULL);
    for (int step = 0; step < 4; step++) {
        TH_RC(na_fp8_scaling_record_amax(s, NA_FP8_INPUT, 2.0f));
        if (step == 2) TH_RC(na_fp8_scaling_count_saturated(s, NA_FP8_INPUT, 5));
        TH_RC(na_fp8_model_update(fm));
        na_amp_monitor_record(m, step, 1.0, 1.0, false);
    }
    na_amp_monitor_free(m);
    FILE *f = fopen(csv, "r");
    char head[1024], row[1024];
    cr_assert(fgets(head, sizeof head, f) && fgets(row, sizeof row, f));
    cr_expect(strstr(head, "step,loss,scale,skipped,fp8..input.scale,fp8..input.saturated,"
                           "fp8..weight.scale"), "%s", head);
    cr_expect(strstr(row, "0,1,1,0,224,0,1,0,1,0"), "%s: 448 / 2 after the first update", row);
    rewind(f);
    char err[128];
    FILE *svg = tmpfile();
    cr_assert_eq(amp_plot_svg(f, svg, "fp8", err, sizeof err), 4, "%s", err);
    fclose(f);
    rewind(svg);
    static char pic[1 << 16];
    size_t len = fread(pic, 1, sizeof pic - 1, svg);
    pic[len] = 0;
    fclose(svg);
    cr_expect(strstr(pic, "FP8 scales per tensor"));
    cr_expect(strstr(pic, "<title>.input: 5 saturated</title>"), "one dot, at step 2");
    cr_expect_eq(strstr(strstr(pic, "class=\"saturated\"") + 1, "class=\"saturated\""), NULL);
    na_fp8_model_free(fm);
    na_module_free(net);
    remove(csv);
}
