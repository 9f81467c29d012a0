/* The SVG pictures of docs/mixed-precision.md (see amp_plot.h): a training log, and number lines.
 * Plain C, no library. */
#include "amp_plot.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef amp_plot_row row;

enum { W = 900, H = 580, LEFT = 80, RIGHT = 30, TOP = 70, GAP = 60, PANEL = 200 };

static double xmap(double v, double lo, double hi) {
    return LEFT + (hi > lo ? (v - lo) / (hi - lo) : 0.5) * (W - LEFT - RIGHT);
}
static double ymap(double v, double lo, double hi, int top) {
    return top + PANEL - (hi > lo ? (v - lo) / (hi - lo) : 0.5) * PANEL;
}

void amp_plot_escape(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else fputc(*s, f);
    }
}

/* A "nice" tick step for a span. */
static double tick_step(double span, int want) {
    double raw = span / want, p = pow(10.0, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void polyline(FILE *f, const row *r, int n, int top, double x0, double x1, double lo,
                     double hi, bool log_scale, const char *color) {
    bool open = false;
    for (int i = 0; i < n; i++) {
        double v = log_scale ? log2(r[i].scale) : r[i].loss;
        if (!isfinite(v)) { /* a gap */
            if (open) fputs("\"/>\n", f);
            open = false;
            continue;
        }
        if (!open)
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                    color);
        open = true;
        fprintf(f, "%.1f,%.1f ", xmap(r[i].step, x0, x1), ymap(v, lo, hi, top));
    }
    if (open) fputs("\"/>\n", f);
}

static void frame(FILE *f, int top, const char *label) {
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n",
            LEFT, top, W - LEFT - RIGHT, PANEL);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"13\" fill=\"#333\">%s</text>\n", LEFT,
            top - 8, label);
}

/* The FP8 columns of a log's header (the monitor's "fp8.<layer>.<role>.scale,..saturated"
 * pairs after the four): their count, names into names (the scale column's, less ".scale"). */
#define MAX_FP8_TENSORS 64
static int fp8_columns(char *header, char names[][64]) {
    int k = 0, col = 0;
    for (char *tok = strtok(header, ",\n"); tok; tok = strtok(NULL, ",\n"), col++) {
        size_t len = strlen(tok);
        if (col < 4 || (col - 4) % 2 || k == MAX_FP8_TENSORS || len < 11 ||
            strncmp(tok, "fp8.", 4) || strcmp(tok + len - 6, ".scale"))
            continue;
        snprintf(names[k++], 64, "%.*s", (int)(len - 10), tok + 4);
    }
    return k;
}

int amp_plot_svg(FILE *csv, FILE *svg, const char *title, char *err, size_t err_size) {
    static char line[16384];
    if (!fgets(line, sizeof line, csv) || strncmp(line, "step,loss,scale,skipped", 23) != 0) {
        snprintf(err, err_size, "expected the header 'step,loss,scale,skipped'");
        return -1;
    }
    static char names[MAX_FP8_TENSORS][64];
    int t = fp8_columns(line, names), n = 0, cap = 0, lineno = 1;
    row *r = NULL;
    double *fp8 = NULL; /* per row: t scales, then t saturated counts */
    while (fgets(line, sizeof line, csv)) {
        lineno++;
        if (line[0] == '\n' || line[0] == '\0') continue;
        row x;
        int used = 0;
        if (sscanf(line, "%lf,%lf,%lf,%lf%n", &x.step, &x.loss, &x.scale, &x.skipped, &used) != 4) {
            snprintf(err, err_size, "line %d: expected 4 numbers: %.60s", lineno, line);
            free(r), free(fp8);
            return -1;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            row *p = realloc(r, (size_t)cap * sizeof *p);
            double *q = p ? realloc(fp8, (size_t)cap * 2 * (size_t)(t ? t : 1) * sizeof *q) : NULL;
            if (p) r = p;
            if (q) fp8 = q;
            if (!p || !q) {
                snprintf(err, err_size, "out of memory");
                free(r), free(fp8);
                return -1;
            }
        }
        const char *p = line + used;
        for (int j = 0; j < 2 * t; j++) { /* scale, saturated per tensor */
            int k = 0;
            double v = NAN;
            if (sscanf(p, ",%lf%n", &v, &k) != 1) {
                snprintf(err, err_size, "line %d: expected %d FP8 columns: %.60s", lineno, 2 * t,
                         line);
                free(r), free(fp8);
                return -1;
            }
            fp8[(size_t)n * 2 * t + (size_t)(j % 2 ? t + j / 2 : j / 2)] = v;
            p += k;
        }
        r[n++] = x;
    }
    if (!n) {
        snprintf(err, err_size, "the log has no rows");
        free(fp8);
        return -1;
    }
    if (!t) {
        amp_plot_log(svg, title, r, n);
    } else { /* the log's picture above the FP8 one, one document */
        fprintf(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\">\n",
                W, 2 * H);
        amp_plot_log(svg, title, r, n);
        fprintf(svg, "<g transform=\"translate(0 %d)\">\n", H);
        const char *labels[MAX_FP8_TENSORS];
        for (int k = 0; k < t; k++) labels[k] = names[k];
        amp_plot_fp8(svg, r, n, t, labels, fp8);
        fprintf(svg, "</g>\n</svg>\n");
    }
    free(r), free(fp8);
    return n;
}

int amp_plot_fp8(FILE *svg, const amp_plot_row *r, int n, int t, const char *const *names,
                 const double *v) {
    if (n < 1 || t < 1 || !r || !v) return -1;
    static const char *colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    double x0 = r[0].step, x1 = r[n - 1].step, lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < t; k++) {
            double e = log2(v[(size_t)i * 2 * t + k]);
            if (isfinite(e)) lo = fmin(lo, e), hi = fmax(hi, e);
        }
    if (!isfinite(lo)) lo = 0, hi = 1;
    lo = floor(lo), hi = ceil(hi);
    if (hi == lo) lo -= 1, hi += 1;
    int top = TOP, panel = H - TOP - 60;
    fprintf(svg, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(svg, "<text x=\"%d\" y=\"24\" font-size=\"16\">FP8 scales per tensor (log2 axis); "
                 "red dots: steps whose casts saturated</text>\n", LEFT);
    fprintf(svg, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                 "fill=\"none\" stroke=\"#999\"/>\n", LEFT, top, W - LEFT - RIGHT, panel);
    double es = fmax(1.0, ceil((hi - lo) / 8));
    for (double e = lo; e <= hi; e += es)
        fprintf(svg, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">2^%g"
                     "</text>\n", LEFT - 6, top + panel - (e - lo) / (hi - lo) * panel + 4, e);
    for (int k = 0; k < t; k++) {
        const char *c = colors[k % 9];
        fprintf(svg, "<polyline class=\"fp8-scale\" fill=\"none\" stroke=\"%s\" points=\"", c);
        for (int i = 0; i < n; i++) {
            double e = log2(v[(size_t)i * 2 * t + k]);
            if (isfinite(e))
                fprintf(svg, "%.1f,%.1f ", xmap(r[i].step, x0, x1),
                        top + panel - (e - lo) / (hi - lo) * panel);
        }
        fprintf(svg, "\"/>\n");
        for (int i = 0; i < n; i++) { /* the running count rose: this step saturated */
            double now = v[(size_t)i * 2 * t + t + k], before = i ? v[(size_t)(i - 1) * 2 * t + t + k]
                                                                   : 0;
            double e = log2(v[(size_t)i * 2 * t + k]);
            if (now > before && isfinite(e))
                fprintf(svg, "<circle class=\"saturated\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" "
                             "fill=\"#d62728\"><title>%s: %g saturated</title></circle>\n",
                        xmap(r[i].step, x0, x1), top + panel - (e - lo) / (hi - lo) * panel,
                        names[k], now - before);
        }
        fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"%s\">", LEFT + 8 + 200 * (k % 4),
                top + panel + 20 + 12 * (k / 4), c);
        amp_plot_escape(svg, names[k]);
        fprintf(svg, "</text>\n");
    }
    return ferror(svg) ? -1 : 0;
}

int amp_plot_log(FILE *svg, const char *title, const amp_plot_row *r, int n) {
    if (n < 1 || !r) return -1;
    double x0 = r[0].step, x1 = r[n - 1].step, lmin = INFINITY, lmax = -INFINITY;
    double smin = INFINITY, smax = -INFINITY;
    int skipped = 0;
    for (int i = 0; i < n; i++) {
        if (isfinite(r[i].loss)) lmin = fmin(lmin, r[i].loss), lmax = fmax(lmax, r[i].loss);
        double ls = log2(r[i].scale);
        if (isfinite(ls)) smin = fmin(smin, ls), smax = fmax(smax, ls);
        skipped += r[i].skipped > 0;
    }
    if (!isfinite(lmin)) lmin = 0, lmax = 1;
    if (!isfinite(smin)) smin = 0, smax = 1;
    smin = floor(smin), smax = ceil(smax);
    if (smax == smin) smin -= 1, smax += 1;
    if (lmax == lmin) lmin -= 0.5, lmax += 0.5;
    int top1 = TOP, top2 = TOP + PANEL + GAP;

    fprintf(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n", W, H, W, H);
    fprintf(svg, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(svg, "<text x=\"%d\" y=\"24\" font-size=\"16\">", LEFT);
    amp_plot_escape(svg, title ? title : "training log");
    fprintf(svg, " (%d steps, %d skipped)</text>\n", n, skipped);
    frame(svg, top1, "loss");
    frame(svg, top2, "loss scale (log2 axis) as logged, after each step's update; a skipped "
                     "step's dot at the scale that overflowed");

    /* skipped steps: red lines across both panels */
    for (int i = 0; i < n; i++) {
        if (!(r[i].skipped > 0)) continue;
        double x = xmap(r[i].step, x0, x1);
        fprintf(svg, "<line class=\"skip\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
                     "stroke=\"#d62728\" stroke-opacity=\"0.5\"/>\n", x, top1, x, top2 + PANEL);
    }
    /* axes: loss ticks, scale ticks at powers of two, step ticks */
    double ts = tick_step(lmax - lmin, 4);
    for (double v = ceil(lmin / ts) * ts; v <= lmax + 1e-12; v += ts)
        fprintf(svg, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g</text>\n",
                LEFT - 6, ymap(v, lmin, lmax, top1) + 4, v);
    double es = fmax(1.0, ceil((smax - smin) / 6));
    for (double e = smin; e <= smax; e += es)
        fprintf(svg, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">2^%g</text>\n",
                LEFT - 6, ymap(e, smin, smax, top2) + 4, e);
    double xs = tick_step(x1 - x0 > 0 ? x1 - x0 : 1, 8);
    for (double v = ceil(x0 / xs) * xs; v <= x1 + 1e-9; v += xs)
        fprintf(svg,
                "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
                xmap(v, x0, x1), top2 + PANEL + 16, v);
    fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">step</text>\n",
            (LEFT + W - RIGHT) / 2, top2 + PANEL + 34);
    /* legend, top right: what each colour is */
    static const struct { const char *color, *label; double opacity; } keys[] = {
        {"#1f77b4", "loss", 1}, {"#2ca02c", "loss scale", 1},
        {"#d62728", "skipped step (inf/NaN gradients)", 0.5}};
    for (int k = 0; k < 3; k++) {
        int lx = W - RIGHT - 330, ly = 38 + 12 * k; /* below the title */
        fprintf(svg, "<line class=\"legend\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                     "stroke=\"%s\" stroke-opacity=\"%g\" stroke-width=\"3\"/>\n",
                lx, ly - 4, lx + 20, ly - 4, keys[k].color, keys[k].opacity);
        fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"11\">%s</text>\n", lx + 26, ly,
                keys[k].label);
    }
    polyline(svg, r, n, top1, x0, x1, lmin, lmax, false, "#1f77b4");
    polyline(svg, r, n, top2, x0, x1, smin, smax, true, "#2ca02c");
    for (int i = 0; i < n; i++) { /* skipped steps at the scale they ran with: the row before's */
        double ran = i > 0 ? r[i - 1].scale : r[i].scale;
        if (r[i].skipped > 0 && isfinite(log2(ran)))
            fprintf(svg, "<circle class=\"skip-dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" "
                         "fill=\"#d62728\"/>\n", xmap(r[i].step, x0, x1),
                    ymap(log2(ran), smin, smax, top2));
    }
    fprintf(svg, "</svg>\n");
    return ferror(svg) ? -1 : 0;
}

/* ==== number lines ============================================================================ */

void amp_hist_f16_shares(const amp_hist *h, double *to_zero, double *subnormal, double *zero) {
    int64_t below = 0, sub = 0, zeros = 0;
    for (int64_t i = 0; i < h->n; i++) {
        double v = fabs((double)h->values[i]) * h->scale;
        zeros += v == 0;
        below += v > 0 && v < ldexp(1, -25); /* below half the smallest subnormal */
        sub += v >= ldexp(1, -25) && v < ldexp(1, -14);
    }
    double n = h->n ? (double)h->n : 1;
    *to_zero = (double)below / n, *subnormal = (double)sub / n, *zero = (double)zeros / n;
}

typedef struct {
    const char *name;
    int min_sub, min_normal; /* log2 of the smallest subnormal and normal */
    double max;              /* the largest finite value */
    int mant;                /* mantissa bits: the spacing at 1 is 2^-mant */
    const char *overflow;    /* what a larger value becomes */
    int lo, hi, tick;        /* its own axis: log2 |x| from lo to hi, a label every tick */
} number_format;

enum { N_FORMATS = 5 };
static const number_format FORMATS[N_FORMATS] = {
    {"f32", -149, -126, 3.4028234663852886e38, 23, "inf", -160, 130, 20},
    {"f16", -24, -14, 65504.0, 10, "inf", -48, 18, 4},
    {"bf16", -133, -126, 3.3895313892515355e38, 7, "inf", -140, 130, 20},
    {"f8e4m3", -9, -6, 448.0, 3, "448 (saturates)", -16, 12, 2},
    {"f8e5m2", -16, -14, 57344.0, 2, "inf", -24, 18, 4},
};
/* the axis every format shares in the formats picture: f32's range and room for "overflow" */
static const number_format SHARED_AXIS = {.lo = -160, .hi = 152, .tick = 20};

enum { NL_W = 900, NL_LEFT = 60, NL_RIGHT = 30, NL_PANEL = 150, NL_TOP = 40, NL_LEGEND = 16 };

static double nl_x(double e, const number_format *f) {
    return NL_LEFT + (e - f->lo) / (f->hi - f->lo) * (NL_W - NL_LEFT - NL_RIGHT);
}

/* one zone of the line: [e0, e1) in log2 |x| */
static void nl_zone(FILE *svg, const number_format *f, double e0, double e1, int y, const char *cls,
                    const char *fill, const char *label) {
    e0 = fmax(e0, f->lo), e1 = fmin(e1, f->hi);
    double x0 = nl_x(e0, f), x1 = nl_x(e1, f);
    fprintf(svg, "<rect class=\"%s\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"18\" "
                 "fill=\"%s\"/>\n", cls, x0, y, x1 - x0, fill);
    if (x1 - x0 > 40)
        fprintf(svg, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                (x0 + x1) / 2, y + 13, label);
}

/* f's line at line_y: its name, the zones, the ticks and a caption */
static void nl_line(FILE *svg, const number_format *f, int line_y) {
    fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"12\" font-weight=\"bold\">%s</text>\n",
            8, line_y + 13, f->name);
    double emax = log2(f->max);
    nl_zone(svg, f, f->lo, f->min_sub - 1, line_y, "zone-zero", "#bbbbbb", "rounds to 0");
    nl_zone(svg, f, f->min_sub - 1, f->min_normal, line_y, "zone-subnormal", "#fdd49e",
            "subnormal");
    nl_zone(svg, f, f->min_normal, emax, line_y, "zone-normal", "#c7e9c0", "normal");
    char over[48];
    snprintf(over, sizeof over, "overflow: %s", f->overflow);
    nl_zone(svg, f, emax, f->hi, line_y, "zone-overflow", "#fc9272", over);
    for (int e = f->lo - f->lo % f->tick; e <= f->hi; e += f->tick) {
        if (e < f->lo) continue;
        double x = nl_x(e, f);
        fprintf(svg, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#555\"/>\n",
                x, line_y + 18, x, line_y + 23);
        fprintf(svg, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">"
                     "2^%d</text>\n", x, line_y + 34, e);
    }
    fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#555\">|x|, log2 axis; "
                 "subnormals from 2^%d, normals from 2^%d, largest %g; spacing at 1: 2^-%d "
                 "(%d mantissa bits)</text>\n",
            NL_LEFT, line_y + 48, f->min_sub, f->min_normal, f->max, f->mant, f->mant);
}

/* one bar per power of two above f's line: count[b] for [2^(lo+b), 2^(lo+b+1)), the highest
 * (most) 70 units tall */
static void nl_bars(FILE *svg, const number_format *f, const double *count, double most,
                    int line_y, const char *color) {
    for (int b = 0; b < f->hi - f->lo; b++) {
        if (!count[b]) continue;
        double bh = 70 * count[b] / most, x0 = nl_x(f->lo + b, f), x1 = nl_x(f->lo + b + 1, f);
        fprintf(svg, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                     "height=\"%.1f\" fill=\"%s\" fill-opacity=\"0.6\"/>\n",
                x0, line_y - 2 - bh, x1 - x0, bh, color);
    }
}

/* h's bars on f's line at line_y: log2 |value * scale|, one bar per power of two, the highest
 * 70 units tall; values beyond the axis at its ends. 0, or -1 out of memory. */
static int hist_bars(FILE *svg, const number_format *f, const amp_hist *h, int line_y) {
    int nb = f->hi - f->lo;
    double *count = calloc((size_t)nb, sizeof *count);
    if (!count) return -1;
    double most = 0;
    for (int64_t i = 0; i < h->n; i++) {
        double v = fabs((double)h->values[i]) * h->scale;
        if (v == 0) continue;
        int b = (int)fmin(fmax(floor(log2(v)) - f->lo, 0), nb - 1);
        most = fmax(most, ++count[b]);
    }
    if (most > 0) nl_bars(svg, f, count, most, line_y, h->color);
    free(count);
    return 0;
}

/* the bars' axis, left of the line at line_y */
static void y_label(FILE *svg, int line_y) {
    fprintf(svg, "<text class=\"y-label\" x=\"%d\" y=\"%d\" font-size=\"9\" "
                 "text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">elements "
                 "per power of 2</text>\n<text x=\"%d\" y=\"%d\" font-size=\"9\" "
                 "text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">(each to "
                 "its peak)</text>\n", 30, line_y - 48, 30, line_y - 48, 42,
            line_y - 48, 42, line_y - 48);
}

static void svg_open(FILE *svg, int height, const char *title, int title_size) {
    fprintf(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n", NL_W, height, NL_W, height);
    fprintf(svg, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"%d\">", NL_LEFT, title_size > 13 ? 24 : 20,
            title_size);
    amp_plot_escape(svg, title);
    fprintf(svg, "</text>\n");
}

int amp_plot_formats(FILE *svg, const char *title) {
    int panel = NL_PANEL - 70, height = NL_TOP + N_FORMATS * panel + 20;
    svg_open(svg, height, title, 15);
    for (int p = 0; p < N_FORMATS; p++) {
        number_format f = FORMATS[p];
        f.lo = SHARED_AXIS.lo, f.hi = SHARED_AXIS.hi, f.tick = SHARED_AXIS.tick;
        nl_line(svg, &f, NL_TOP + p * panel + panel - 60);
    }
    /* 1.0, where the captions' spacing is measured */
    double x1 = NL_LEFT - SHARED_AXIS.lo * (double)(NL_W - NL_LEFT - NL_RIGHT) /
                              (SHARED_AXIS.hi - SHARED_AXIS.lo);
    fprintf(svg, "<line class=\"one\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
                 "stroke=\"#333\" stroke-dasharray=\"3,3\"/>\n", x1, NL_TOP + 10, x1, height - 20);
    fprintf(svg, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">1.0</text>\n",
            x1, NL_TOP + 6);
    fprintf(svg, "</svg>\n");
    return ferror(svg) ? -1 : 0;
}

int amp_plot_number_lines(FILE *svg, const char *title, int n_formats, const amp_hist *h,
                          int n_hist) {
    if (n_formats < 1 || n_formats > 2 || n_hist < 0 || (n_hist && !h)) return -1;
    int panel = n_hist ? NL_PANEL : NL_PANEL - 70; /* room for the bars only when there are any */
    int height = NL_TOP + n_formats * panel + n_hist * NL_LEGEND + 20;
    svg_open(svg, height, title, 15);
    for (int p = 0; p < n_formats; p++) {
        const number_format *f = &FORMATS[1 + p]; /* f16, bf16 */
        int line_y = NL_TOP + p * panel + panel - 60; /* the zones; bars stand above */
        nl_line(svg, f, line_y);
        if (p != 0) continue;
        /* histograms of log2 |value * scale|, one bar per power of two, on the first line */
        for (int k = 0; k < n_hist; k++) {
            if (hist_bars(svg, f, &h[k], line_y)) return -1;
            if (k == 0) y_label(svg, line_y);
            int ly = NL_TOP + n_formats * panel + k * NL_LEGEND;
            fprintf(svg, "<rect class=\"legend\" x=\"%d\" y=\"%d\" width=\"14\" height=\"10\" "
                         "fill=\"%s\" fill-opacity=\"0.6\"/>\n", NL_LEFT, ly - 9, h[k].color);
            fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"11\">", NL_LEFT + 20, ly);
            amp_plot_escape(svg, h[k].label);
            double to_zero, sub, zero;
            amp_hist_f16_shares(&h[k], &to_zero, &sub, &zero);
            fprintf(svg, " (x %g): %.1f%% would round to 0 in f16, %.1f%% subnormal, %.1f%% "
                         "already 0</text>\n", h[k].scale, 100 * to_zero, 100 * sub, 100 * zero);
        }
    }
    fprintf(svg, "</svg>\n");
    return ferror(svg) ? -1 : 0;
}

static const number_format *format_named(const char *name) {
    for (int i = 0; i < N_FORMATS; i++)
        if (name && !strcmp(FORMATS[i].name, name)) return &FORMATS[i];
    return NULL;
}

int amp_plot_hist_panels(FILE *svg, const char *title, const amp_hist_panel *p, int n) {
    if (n < 1 || !p) return -1;
    int height = NL_TOP + 20;
    for (int k = 0; k < n; k++) {
        if (!format_named(p[k].format) || p[k].n_hist < 0 || p[k].n_hist > 2) return -1;
        height += NL_PANEL + p[k].n_hist * NL_LEGEND;
    }
    svg_open(svg, height, title, 15);
    for (int k = 0, y = NL_TOP; k < n; k++) {
        const number_format *f = format_named(p[k].format);
        int line_y = y + NL_PANEL - 60;
        for (int i = 0; i < p[k].n_hist; i++)
            if (hist_bars(svg, f, &p[k].h[i], line_y)) return -1;
        y_label(svg, line_y);
        nl_line(svg, f, line_y);
        y += NL_PANEL;
        for (int i = 0; i < p[k].n_hist; i++, y += NL_LEGEND) {
            fprintf(svg, "<rect class=\"legend\" x=\"%d\" y=\"%d\" width=\"14\" "
                         "height=\"10\" fill=\"%s\" fill-opacity=\"0.6\"/>\n", NL_LEFT, y - 9,
                    p[k].h[i].color);
            fprintf(svg, "<text x=\"%d\" y=\"%d\" font-size=\"11\">", NL_LEFT + 20, y);
            amp_plot_escape(svg, p[k].legend[i]);
            fputs("</text>\n", svg);
        }
    }
    fprintf(svg, "</svg>\n");
    return ferror(svg) ? -1 : 0;
}

int amp_plot_hist_line(FILE *svg, const char *title, const char *format, const double *count,
                       int lo, int n, const char *color) {
    const number_format *f = format_named(format);
    if (!f || n < 0 || (n && !count)) return -1;
    int nb = f->hi - f->lo, height = NL_PANEL + 10, line_y = NL_TOP + NL_PANEL - 70;
    double *c = calloc((size_t)nb, sizeof *c), most = 0;
    if (!c) return -1;
    for (int b = 0; b < n; b++) { /* onto the axis; what lies beyond it goes to its ends */
        int at = (int)fmin(fmax(lo + b - f->lo, 0), nb - 1);
        most = fmax(most, c[at] += count[b]);
    }
    svg_open(svg, height, title, 13);
    if (most > 0) nl_bars(svg, f, c, most, line_y, color);
    nl_line(svg, f, line_y);
    fprintf(svg, "</svg>\n");
    free(c);
    return ferror(svg) ? -1 : 0;
}
