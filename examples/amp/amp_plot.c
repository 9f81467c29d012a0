/* The CSV -> SVG plot of a training log (see amp_plot.h). Plain C, no library. */
#include "amp_plot.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double step, loss, scale, skipped;
} row;

enum { W = 900, H = 560, LEFT = 80, RIGHT = 30, TOP = 50, GAP = 60, PANEL = 200 };

static double xmap(double v, double lo, double hi) {
    return LEFT + (hi > lo ? (v - lo) / (hi - lo) : 0.5) * (W - LEFT - RIGHT);
}
static double ymap(double v, double lo, double hi, int top) {
    return top + PANEL - (hi > lo ? (v - lo) / (hi - lo) : 0.5) * PANEL;
}

static void escape(FILE *f, const char *s) {
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

int amp_plot_svg(FILE *csv, FILE *svg, const char *title, char *err, size_t err_size) {
    char line[512];
    if (!fgets(line, sizeof line, csv) || strncmp(line, "step,loss,scale,skipped", 23) != 0) {
        snprintf(err, err_size, "expected the header 'step,loss,scale,skipped'");
        return -1;
    }
    int n = 0, cap = 0, lineno = 1;
    row *r = NULL;
    while (fgets(line, sizeof line, csv)) {
        lineno++;
        if (line[0] == '\n' || line[0] == '\0') continue;
        row x;
        if (sscanf(line, "%lf,%lf,%lf,%lf", &x.step, &x.loss, &x.scale, &x.skipped) != 4) {
            snprintf(err, err_size, "line %d: expected 4 numbers: %.60s", lineno, line);
            free(r);
            return -1;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            row *p = realloc(r, (size_t)cap * sizeof *p);
            if (!p) {
                snprintf(err, err_size, "out of memory");
                free(r);
                return -1;
            }
            r = p;
        }
        r[n++] = x;
    }
    if (!n) {
        snprintf(err, err_size, "the log has no rows");
        return -1;
    }
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
    escape(svg, title ? title : "training log");
    fprintf(svg, " (%d steps, %d skipped)</text>\n", n, skipped);
    frame(svg, top1, "loss");
    frame(svg, top2, "loss scale (log2 axis)");

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
    polyline(svg, r, n, top1, x0, x1, lmin, lmax, false, "#1f77b4");
    polyline(svg, r, n, top2, x0, x1, smin, smax, true, "#2ca02c");
    for (int i = 0; i < n; i++) /* skipped steps on the scale line */
        if (r[i].skipped > 0 && isfinite(log2(r[i].scale)))
            fprintf(svg, "<circle class=\"skip-dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" "
                         "fill=\"#d62728\"/>\n", xmap(r[i].step, x0, x1),
                    ymap(log2(r[i].scale), smin, smax, top2));
    fprintf(svg, "</svg>\n");
    free(r);
    return n;
}
