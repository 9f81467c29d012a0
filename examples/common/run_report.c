/* --report FILE.html (see run_report.h): what the run records as it goes, and the page. */
#include "run_report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../amp/amp_plot.h"

/* what a sample is: a parameter's gradient, a layer's output, or an FP8 layer's operand (its
 * input or weight times the scale its cast uses, on its format's line) */
typedef enum { SAMPLE_GRADIENT, SAMPLE_ACTIVATION, SAMPLE_FP8 } sample_kind;

typedef struct {
    int64_t step;   /* of the run, from 1 */
    sample_kind kind;
    char name[64];  /* "1.weight", "layer 2 (ReLU)" */
    na_dtype dtype; /* the tensor's */
    double scale;   /* gradients: the loss scale they carry; FP8 operands: their cast's (1:
                       none) */
    na_amp_hist h;  /* on the run's line; an FP8 operand's on its format's */
} sample;

typedef struct {
    int64_t epoch;
    double train_loss, test_loss, test_acc, images_per_s, seconds;
} epoch_row;

typedef struct {
    char *text; /* "linear | f32,f32,f32 | lower | f16 | f16 | f32" (the columns, '|'-split) */
} trace_row;

typedef struct {
    char name[40];            /* the record's, copied: a custom function's may not outlive us */
    na_amp_backward_record r; /* the first step's backward row */
} backward_row;

struct run_report {
    const trainer_opts *o;
    na_module *net;
    const char *mode; /* the amp mode that runs */
    na_dtype line;    /* the dtype in use: the histograms' number line */
    int64_t at;       /* the step under way (from 0) */
    bool sampling, traced;
    int n_sampled;    /* steps sampled */
    int64_t sampled_steps[RUN_REPORT_MAX_SAMPLES];
    bool print_trace;
    sample *s;
    int64_t ns, cs;
    epoch_row *e;
    int64_t ne, ce;
    amp_plot_row *r;
    int64_t nr, cr;
    char **alert; /* "step N: text" */
    int64_t na, ca;
    trace_row *t;
    int64_t nt, ct;
    backward_row *bw;
    int64_t nbw, cbw;
    double last_time;  /* res->train_time_s at the last epoch */
    int64_t last_images;
    char *json;        /* the final --json line */
    const char *status; /* "running", "complete", "stopped" */
    bool unwritable;    /* a write failed (and was said): the run stops, no more tries */
};

/* Appends one zeroed item to a growing array; NULL when out of memory. */
static void *grow(void *array, int64_t *n, int64_t *cap, size_t size) {
    void **a = array;
    if (*n == *cap) {
        int64_t c = *cap ? 2 * *cap : 16;
        void *p = realloc(*a, (size_t)c * size);
        if (!p) return NULL;
        *a = p, *cap = c;
    }
    void *item = (char *)*a + (size_t)(*n)++ * size;
    memset(item, 0, size);
    return item;
}
#define APPEND(rp, arr, n, cap) grow(&(rp)->arr, &(rp)->n, &(rp)->cap, sizeof *(rp)->arr)

/* A formatted copy (malloc), or NULL. */
static char *format_new(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format_new(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    va_end(ap);
    return s;
}

run_report *run_report_new(const trainer_opts *o, na_module *net, const trainer_amp *amp) {
    run_report *rp = calloc(1, sizeof *rp);
    if (!rp) {
        na_set_error(NA_ENOMEM, "--report: out of host memory");
        return NULL;
    }
    bool low = amp->autocast || amp->fo;
    *rp = (run_report){.o = o, .net = net, .mode = amp->mode, .status = "running",
                       .line = low ? amp->dtype : NA_DTYPE_F32, .print_trace = o->amp_trace};
    return rp;
}

void run_report_free(run_report *rp) {
    if (!rp) return;
    for (int64_t i = 0; i < rp->na; i++) free(rp->alert[i]);
    for (int64_t i = 0; i < rp->nt; i++) free(rp->t[i].text);
    free(rp->alert), free(rp->t), free(rp->bw), free(rp->s), free(rp->e), free(rp->r), free(rp->json);
    free(rp);
}

void run_report_step(run_report *rp, int64_t at, bool epoch_start) {
    if (!rp) return;
    rp->at = at;
    rp->sampling = (at == 0 || epoch_start) && rp->n_sampled < RUN_REPORT_MAX_SAMPLES;
    if (rp->sampling) rp->sampled_steps[rp->n_sampled++] = at + 1;
}

bool run_report_sampling(const run_report *rp) { return rp && rp->sampling; }

void run_report_unsample(run_report *rp) {
    if (!rp || !rp->sampling) return;
    rp->sampling = false;
    rp->n_sampled--;
}

static void on_trace(const na_amp_trace_record *r, void *ctx) {
    run_report *rp = ctx;
    char line[160], ins[64] = "";
    if (rp->print_trace) fprintf(stderr, "amp: %s\n", na_amp_trace_format(r, line, sizeof line));
    size_t k = 0;
    for (int i = 0; i < r->n_inputs && k < sizeof ins; i++)
        k += (size_t)snprintf(ins + k, sizeof ins - k, "%s%s", i ? "," : "",
                              r->in[i] == NA_DTYPE_COUNT ? "-" : na_dtype_name(r->in[i]));
    const char *acc = r->accumulate == NA_DTYPE_COUNT ? "-" : na_dtype_name(r->accumulate);
    const char *rule = r->region && !r->enabled ? "off" : na_amp_rule_name(r->rule);
    char *text = format_new("%*s%s|%s|%s|%s|%s|%s", 2 * r->nesting, "",
                            r->name ? r->name : na_op_name(r->op), ins, rule,
                            na_dtype_name(r->compute), na_dtype_name(r->out), acc);
    trace_row *row = text ? APPEND(rp, t, nt, ct) : NULL;
    if (row) row->text = text;
    else free(text); /* out of memory: the table misses a row, the step goes on */
}

static void on_backward(const na_amp_backward_record *r, void *ctx) {
    run_report *rp = ctx;
    char line[192];
    if (rp->print_trace)
        fprintf(stderr, "amp: %s\n", na_amp_trace_backward_format(r, line, sizeof line));
    backward_row *row = r->name ? APPEND(rp, bw, nbw, cbw) : NULL; /* the table has its head */
    if (!row) return; /* out of memory: the table misses a row, the step goes on */
    snprintf(row->name, sizeof row->name, "%s", r->name);
    row->r = *r;
}

bool run_report_trace_begin(run_report *rp, na_amp_trace_mode mode, bool print) {
    if (!rp || rp->at != 0 || rp->traced) return false;
    rp->traced = true, rp->print_trace = print;
    na_autocast_trace_callback(mode, on_trace, rp);
    na_amp_trace_backward_callback(true, on_backward, rp);
    return true;
}

void run_report_trace_end(run_report *rp) {
    (void)rp;
    na_autocast_trace_callback(NA_AMP_TRACE_OFF, NULL, NULL);
}

static int add_sample(run_report *rp, sample_kind kind, const char *name, const na_tensor *t,
                      double scale, na_dtype line) {
    sample *s = APPEND(rp, s, ns, cs);
    if (!s) return na_set_error(NA_ENOMEM, "--report: out of host memory");
    *s = (sample){.step = rp->at + 1, .kind = kind, .dtype = t->dtype, .scale = scale};
    snprintf(s->name, sizeof s->name, "%s", name);
    int rc = na_amp_hist_init(&s->h, line);
    return rc ? rc : na_amp_hist_add_tensor(&s->h, t);
}

/* --amp fp8: the FP8 layer child's input x and its weight, each times the scale its cast uses
 * this step, on its format's line (no grad mode: these ops record nothing) */
static int add_fp8_samples(run_report *rp, const trainer_amp *amp, na_module *child,
                           const char *name, na_tensor *x) {
    for (int i = 0; amp->fp8 && i < na_fp8_model_layers(amp->fp8); i++) {
        const char *path;
        na_fp8_scaling *fs = na_fp8_model_layer(amp->fp8, i, &path);
        if (strcmp(path, name)) continue;
        na_named_tensors ps = {0};
        int rc = na_module_named_tensors(child, NA_MODULE_PARAMS, "", &ps);
        na_tensor *w = NULL;
        for (int64_t k = 0; !rc && k < ps.n; k++)
            if (!strcmp(ps.items[k].name, "weight")) w = ps.items[k].tensor;
        na_tensor *op[2] = {x, w};
        const na_fp8_role role[2] = {NA_FP8_INPUT, NA_FP8_WEIGHT};
        for (int k = 0; !rc && k < 2 && op[k]; k++) {
            double sc = na_fp8_scaling_scale(fs, role[k]);
            na_tensor *t = na_scale(na_cast(op[k], NA_DTYPE_F32), sc);
            char label[64];
            snprintf(label, sizeof label, "%s %s", name, na_fp8_role_name(role[k]));
            rc = t ? add_sample(rp, SAMPLE_FP8, label, t, sc,
                                na_fp8_format_dtype(na_fp8_scaling_format(fs, role[k])))
                   : na_last_status();
        }
        na_named_tensors_free(&ps);
        return rc;
    }
    return NA_OK;
}

int run_report_activations(run_report *rp, const trainer_amp *amp, na_module *net, na_tensor *x) {
    if (!run_report_sampling(rp) || !x) return NA_OK;
    /* the top-level layers: below o2's wrapper (FP16Model: its input cast is done here) */
    while (na_module_num_children(net) == 1) net = na_module_child_at(net, 0, NULL);
    na_module_train(net, false); /* BatchNorm's running statistics stay as they are */
    na_no_grad_begin();
    if (amp->channels_last && x->ndim == 4) x = na_to_channels_last(x);
    if (amp->fo && x) x = na_cast(x, amp->dtype);
    int rc = amp->autocast ? na_autocast_begin(amp->dtype) : NA_OK;
    for (int i = 0; !rc && i < na_module_num_children(net); i++) {
        const char *name;
        na_module *child = na_module_child_at(net, i, &name);
        char label[64];
        if (x && (rc = add_fp8_samples(rp, amp, child, name, x))) break;
        if (!x || !(x = na_module_forward(child, x))) {
            rc = na_last_status();
            break;
        }
        snprintf(label, sizeof label, "%s (%s)", name, na_module_type_name(child));
        rc = add_sample(rp, SAMPLE_ACTIVATION, label, x, 1.0, rp->line);
    }
    if (amp->autocast) na_autocast_end();
    na_no_grad_end();
    na_module_train(net, true);
    return rc ? na_set_error(rc, "--report: the activations of step %" PRId64 ": %s", rp->at + 1,
                             na_last_error()) : NA_OK;
}

int run_report_grads(run_report *rp, const trainer_amp *amp) {
    if (!run_report_sampling(rp)) return NA_OK;
    na_named_tensors params = {0};
    na_grad_scaler *gs = trainer_amp_scaler(amp);
    double scale = na_grad_scaler_is_enabled(gs) ? na_grad_scaler_get_scale(gs) : 1.0;
    int rc = na_module_named_tensors(rp->net, NA_MODULE_PARAMS, "", &params);
    for (int64_t i = 0; !rc && i < params.n; i++)
        if (params.items[i].tensor->grad)
            rc = add_sample(rp, SAMPLE_GRADIENT, params.items[i].name,
                            params.items[i].tensor->grad, scale, rp->line);
    na_named_tensors_free(&params);
    return rc ? na_set_error(rc, "--report: the gradients of step %" PRId64 ": %s", rp->at + 1,
                             na_last_error()) : NA_OK;
}

int run_report_scale(run_report *rp, int64_t at, double loss, double scale, int64_t skipped,
                     const char *alerts) {
    if (!rp) return NA_OK;
    amp_plot_row *row = APPEND(rp, r, nr, cr);
    char *text = alerts && *alerts ? format_new("step %" PRId64 ": %s", at + 1, alerts) : NULL;
    char **a = text ? APPEND(rp, alert, na, ca) : NULL;
    if (!row || (alerts && *alerts && !a)) {
        free(text);
        return na_set_error(NA_ENOMEM, "--report: out of host memory");
    }
    *row = (amp_plot_row){(double)at + 1, loss, scale, (double)skipped};
    if (a) *a = text;
    return NA_OK;
}

/* ---- the page ------------------------------------------------------------------------------ */

static const char STYLE[] =
    "body{font-family:sans-serif;max-width:960px;margin:1em auto;color:#222}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;"
    "text-align:left}th{background:#eee}td.n{text-align:right}pre{white-space:pre-wrap;"
    "background:#f6f6f6;padding:6px}h3{margin-bottom:2px}.zero{color:#777}.bad{color:#c00}"
    "svg{max-width:100%;height:auto}.pics{display:grid;grid-template-columns:1fr 1fr;gap:4px}pre.op{margin:0;padding:0;background:none}";

static void pct(FILE *f, int64_t part, int64_t n, const char *cls) {
    double v = n ? 100.0 * (double)part / (double)n : 0;
    bool mark = part && cls; /* a share worth the eye: grey for zeros, red for losses */
    fprintf(f, "<td class=\"n%s%s\">%.2f%%</td>", mark ? " " : "", mark ? cls : "", v);
}

static void config_section(FILE *f, const run_report *rp) {
    const trainer_opts *o = rp->o;
    fputs("<h2 id=\"config\">Configuration</h2>\n<table>\n", f);
#define ROW(k, fmt, ...) fprintf(f, "<tr><th>%s</th><td>" fmt "</td></tr>\n", k, __VA_ARGS__)
    ROW("program", "%s", o->program);
    ROW("model", "%s", o->model);
    ROW("device", "%s", na_device_name(o->device));
    ROW("amp", "%s (ran: %s; number line: %s)", o->amp, rp->mode, na_dtype_name(rp->line));
    ROW("loss scale", "%s", o->loss_scale ? o->loss_scale : "dynamic (where amp scales)");
    ROW("epochs, batch", "%" PRId64 ", %" PRId64, o->epochs, o->batch);
    ROW("optimizer, schedule", "%s, %s", o->optim, o->schedule);
    ROW("seed", "%" PRIu64, o->seed);
#undef ROW
    fputs("</table>\n", f);
}

static void loss_section(FILE *f, const run_report *rp) {
    fputs("<h2 id=\"loss\">Loss</h2>\n", f);
    if (!rp->ne) fputs("<p>No epoch finished yet.</p>\n", f);
    else fputs("<table><tr><th>epoch</th><th>train loss</th><th>test loss</th><th>test accuracy"
               "</th><th>images/s</th><th>seconds</th></tr>\n", f);
    for (int64_t i = 0; i < rp->ne; i++) {
        const epoch_row *e = &rp->e[i];
        fprintf(f, "<tr><td class=\"n\">%" PRId64 "</td><td class=\"n\">%.4f</td><td class=\"n\">"
                "%.4f</td><td class=\"n\">%.2f%%</td><td class=\"n\">%.0f</td><td class=\"n\">%.2f"
                "</td></tr>\n", e->epoch, e->train_loss, e->test_loss, 100 * e->test_acc,
                e->images_per_s, e->seconds);
    }
    if (rp->ne) fputs("</table>\n<p>Train loss: the mean of the losses read during the epoch "
                      "(every 10th step); test loss and accuracy after it.</p>\n", f);
}

/* An amp_plot picture inline: drawn into memory (svg_begin), then copied into the page without
 * its namespace (svg_end): an HTML page's svg element needs none, and the page then names no
 * http address at all. */
typedef struct {
    char *buf;
    size_t n;
    FILE *m;
} svg_buffer;
static FILE *svg_begin(svg_buffer *b) {
    *b = (svg_buffer){0};
    return b->m = open_memstream(&b->buf, &b->n);
}
static void svg_end(FILE *f, svg_buffer *b) {
    static const char ns[] = " xmlns=\"http://www.w3.org/2000/svg\"";
    if (!b->m) return;
    fclose(b->m);
    char *at = strstr(b->buf, ns);
    if (at) memmove(at, at + strlen(ns), strlen(at + strlen(ns)) + 1);
    fputs(b->buf, f);
    free(b->buf);
}

static void scale_section(FILE *f, const run_report *rp) {
    fputs("<h2 id=\"scale\">Loss scale</h2>\n", f);
    if (rp->nr) {
        char title[128];
        snprintf(title, sizeof title, "--amp %s, per step", rp->mode);
        svg_buffer b;
        if (svg_begin(&b)) amp_plot_log(b.m, title, rp->r, (int)rp->nr);
        svg_end(f, &b);
        fputs("<p>The scale is the scaler's after the step's update; a red line marks a step "
              "skipped for inf/NaN gradients. Without loss scaling the scale stays 1.</p>\n", f);
    } else {
        fputs("<p>No step recorded yet.</p>\n", f);
    }
    fprintf(f, "<h3>Amp monitor alerts</h3>\n<ul>\n%s", rp->na ? "" : "<li>none</li>\n");
    for (int64_t i = 0; i < rp->na; i++) {
        fputs("<li>", f);
        amp_plot_escape(f, rp->alert[i]);
        fputs("</li>\n", f);
    }
    fputs("</ul>\n", f);
}

/* one table row and picture per tensor of a sampled step */
static void hist_row(FILE *f, const sample *s) {
    const na_amp_hist *h = &s->h;
    fputs("<tr><td>", f);
    amp_plot_escape(f, s->name);
    if (s->scale != 1.0) fprintf(f, " (x %g)", s->scale);
    fprintf(f, "</td><td>%s</td>", na_dtype_name(s->kind == SAMPLE_FP8 ? h->dtype : s->dtype));
    fprintf(f, "<td class=\"n\">%" PRId64 "</td>", h->n);
    pct(f, h->zero, h->n, "zero");
    pct(f, h->underflow, h->n, "bad");
    pct(f, h->subnormal, h->n, "bad");
    pct(f, h->normal, h->n, NULL);
    pct(f, h->overflow, h->n, "bad");
    pct(f, h->nonfinite, h->n, "bad");
    fputs("</tr>\n", f);
}

static void hist_picture(FILE *f, const sample *s) {
    static const char *const what[] = {"gradient of", "output of", "FP8 operand"};
    static const char *const color[] = {"#1f77b4", "#9467bd", "#2ca02c"};
    double count[NA_AMP_HIST_BINS];
    for (int b = 0; b < NA_AMP_HIST_BINS; b++) count[b] = (double)s->h.bins[b];
    char title[128];
    snprintf(title, sizeof title, "step %" PRId64 ": %s %s (%s), log2 |x|", s->step,
             what[s->kind], s->name,
             na_dtype_name(s->kind == SAMPLE_FP8 ? s->h.dtype : s->dtype));
    svg_buffer b;
    if (svg_begin(&b))
        amp_plot_hist_line(b.m, title, na_dtype_name(s->h.dtype), count, NA_AMP_HIST_LO,
                           NA_AMP_HIST_BINS, color[s->kind]);
    svg_end(f, &b);
}

/* per sampled step: a table of the shares, one row per tensor, then their pictures */
static void hist_block(FILE *f, const run_report *rp, sample_kind kind) {
    const char *line = na_dtype_name(rp->line);
    int sub, norm;
    double max;
    na_amp_dtype_range(rp->line, &sub, &norm, &max);
    if (kind == SAMPLE_FP8)
        fputs("<p>Number lines: each operand's FP8 format (f8e4m3: subnormals from 2^-9, "
              "normals from 2^-6, largest 448, beyond it clipped; f8e5m2: from 2^-16, 2^-14, "
              "57344). Sampled steps:", f);
    else
        fprintf(f, "<p>Number line: %s (subnormals from 2^%d, normals from 2^%d, largest %g). "
                "Sampled steps:", line, sub, norm, max);
    for (int i = 0; i < rp->n_sampled; i++) fprintf(f, " %" PRId64, rp->sampled_steps[i]);
    fprintf(f, " (the first step, then the first of each epoch, at most %d).</p>\n",
            RUN_REPORT_MAX_SAMPLES);
    static const char *const head[] = {"parameter", "layer", "operand"};
    for (int k = 0; k < rp->n_sampled; k++) {
        int64_t step = rp->sampled_steps[k];
        fprintf(f, "<h3>step %" PRId64 "</h3>\n<table><tr><th>%s</th><th>%s</th>"
                "<th>elements</th><th>zero</th><th>rounds to 0%s%s</th><th>subnormal</th>"
                "<th>normal</th><th>overflow</th><th>inf/NaN</th></tr>\n", step, head[kind],
                kind == SAMPLE_FP8 ? "format" : "dtype", kind == SAMPLE_FP8 ? "" : " in ",
                kind == SAMPLE_FP8 ? "" : line);
        for (int64_t i = 0; i < rp->ns; i++)
            if (rp->s[i].kind == kind && rp->s[i].step == step) hist_row(f, &rp->s[i]);
        fputs("</table>\n<div class=\"pics\">\n", f);
        for (int64_t i = 0; i < rp->ns; i++)
            if (rp->s[i].kind == kind && rp->s[i].step == step) hist_picture(f, &rp->s[i]);
        fputs("</div>\n", f);
    }
}

/* the first step's backward rows (na_amp_trace_backward): each node's incoming gradient */
static void backward_table(FILE *f, const run_report *rp) {
    if (!rp->nbw) return;
    fputs("<h3>backward</h3>\n<p>Each backward op in the order it ran, with the gradient it "
          "received (of its output, times the loss scale) and the shares of its elements that "
          "are exactly zero, subnormal or inf/NaN in its own dtype.</p>\n<table><tr><th>op</th>"
          "<th>gradient</th><th>zero</th><th>subnormal</th><th>inf/NaN</th></tr>\n", f);
    for (int64_t i = 0; i < rp->nbw; i++) {
        const na_amp_backward_record *r = &rp->bw[i].r;
        fputs("<tr><td>", f);
        amp_plot_escape(f, rp->bw[i].name);
        fprintf(f, "</td><td>%s [", na_dtype_name(r->dtype));
        for (int d = 0; d < r->ndim; d++) fprintf(f, "%s%" PRId64, d ? "," : "", r->shape[d]);
        fputs("]</td>", f);
        if (r->counted) {
            pct(f, r->zero, r->n, "zero");
            pct(f, r->subnormal, r->n, "bad");
            pct(f, r->nonfinite, r->n, "bad");
        } else {
            fputs("<td>-</td><td>-</td><td>-</td>", f);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void trace_section(FILE *f, const run_report *rp) {
    fputs("<h2 id=\"trace\">Autocast trace</h2>\n", f);
    if (!rp->nt) {
        fputs("<p>No op traced: the trace is of the run's first step (a resumed run starts "
              "later; with --cuda-graph on CUDA it is an eager warm-up step).</p>\n", f);
        return;
    }
    fprintf(f, "<p>The first step's forward and loss, op by op (%s; indented: casts made for "
            "the op below them).</p>\n<table><tr><th>op</th><th>input dtypes</th><th>rule</th>"
            "<th>compute</th><th>output</th><th>accumulate</th></tr>\n",
            rp->line == NA_DTYPE_F32 || !strcmp(rp->mode, "o2") ? "every op"
                                                                  : "the autocast regions' ops");
    for (int64_t i = 0; i < rp->nt; i++) {
        char cell[160];
        snprintf(cell, sizeof cell, "%s", rp->t[i].text);
        char *c = cell;
        for (int col = 0; c; col++) { /* the op (indented: in a pre), then the dtypes */
            char *bar = strchr(c, '|');
            if (bar) *bar = '\0';
            fputs(col ? "<td>" : "<tr><td><pre class=\"op\">", f);
            amp_plot_escape(f, c);
            fputs(col ? "</td>" : "</pre></td>", f);
            c = bar ? bar + 1 : NULL;
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    backward_table(f, rp);
}

static void write_page(FILE *f, const run_report *rp) {
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>");
    amp_plot_escape(f, rp->o->program);
    fprintf(f, " run report</title>\n<style>%s</style></head><body>\n<h1>", STYLE);
    amp_plot_escape(f, rp->o->program);
    fprintf(f, ": run report</h1>\n<p>Status: <b>%s</b>, %" PRId64 " of %" PRId64 " epoch(s) "
            "reported (this page is rewritten after every epoch).</p>\n", rp->status, rp->ne,
            rp->o->epochs);
    config_section(f, rp);
    loss_section(f, rp);
    scale_section(f, rp);
    fputs("<h2 id=\"gradients\">Gradients</h2>\n<p>Each parameter's gradient as backward left it, "
          "before unscaling (times the loss scale shown), counted as it would be stored in the "
          "dtype in use: what rounds to 0 there is lost before the optimizer sees it.</p>\n", f);
    hist_block(f, rp, SAMPLE_GRADIENT);
    fputs("<h2 id=\"activations\">Activations</h2>\n<p>Each top-level layer's output on the "
          "sampled batch (a second forward in eval mode, without gradients).</p>\n", f);
    hist_block(f, rp, SAMPLE_ACTIVATION);
    bool fp8 = false;
    for (int64_t i = 0; i < rp->ns; i++) fp8 = fp8 || rp->s[i].kind == SAMPLE_FP8;
    if (fp8) {
        fputs("<h2 id=\"fp8\">FP8 operands</h2>\n<p>Each FP8 layer's input and weight on the "
              "sampled batch, times the scale its cast used in that step, on its format's line: "
              "what rounds to 0 or overflows (clipped to the format's largest value) there is "
              "what the scale did not save. The output gradients' amax and scales are in the "
              "trace and in --log.</p>\n", f);
        hist_block(f, rp, SAMPLE_FP8);
    }
    trace_section(f, rp);
    fputs("<h2 id=\"json\">Final JSON</h2>\n", f);
    if (rp->json) {
        fputs("<pre>", f);
        amp_plot_escape(f, rp->json);
        fputs("</pre>\n", f);
    } else {
        fputs("<p>At the end of the run.</p>\n", f);
    }
    fputs("</body></html>\n", f);
}

/* The page into a temporary file beside the path, renamed over it: a reader never sees half a
 * page, and a failed write leaves the last page. */
static int save(run_report *rp) {
    const char *path = rp->o->report_path;
    if (rp->unwritable) return 1;
    size_t len = strlen(path) + sizeof ".XXXXXX";
    char *tmp = malloc(len);
    int fd = -1, err = 0;
    FILE *f = NULL;
    if (tmp) snprintf(tmp, len, "%s.XXXXXX", path), fd = mkstemp(tmp);
    mode_t mask = umask(0); /* mkstemp's 0600: the page gets a new file's usual mode */
    umask(mask);
    if (fd >= 0) fchmod(fd, 0666 & ~mask);
    if (fd < 0 || !(f = fdopen(fd, "w"))) {
        err = tmp ? errno : ENOMEM;
        if (fd >= 0) close(fd);
    } else {
        errno = 0;
        write_page(f, rp);
        if (ferror(f)) err = errno ? errno : EIO;
        if (fclose(f) && !err) err = errno ? errno : EIO;
        if (!err && rename(tmp, path)) err = errno;
    }
    if (fd >= 0 && err) unlink(tmp);
    free(tmp);
    if (err)
        fprintf(stderr, "%s: --report %s: cannot write the page: %s\n", rp->o->program, path,
                strerror(err));
    rp->unwritable = err != 0;
    return err ? 1 : 0;
}

int run_report_epoch(run_report *rp, int64_t epoch, double train_loss, const trainer_result *res,
                     int64_t images) {
    if (!rp) return 0;
    epoch_row *e = APPEND(rp, e, ne, ce);
    if (!e) {
        fprintf(stderr, "%s: --report: out of host memory\n", rp->o->program);
        return 1;
    }
    double t = res->train_time_s - rp->last_time;
    *e = (epoch_row){epoch, train_loss, res->test_loss, res->test_acc,
                     t > 0 ? (double)(images - rp->last_images) / t : NAN, t};
    rp->last_time = res->train_time_s, rp->last_images = images;
    return save(rp);
}

int run_report_finish(run_report *rp, const trainer_result *res, bool ok) {
    if (!rp) return 0;
    char *buf = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&buf, &size);
    if (m) {
        trainer_json_print(m, rp->o, res);
        fclose(m);
        free(rp->json);
        rp->json = buf;
    }
    rp->status = ok ? "complete" : "stopped (see the program's messages)";
    return save(rp);
}
