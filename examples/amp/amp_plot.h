/* examples/amp/amp_plot.h — the SVG pictures of docs/mixed-precision.md:
 *  - a training log (the monitor's CSV: step,loss,scale,skipped): the loss on top, the loss
 *    scale below on a log2 axis, skipped steps marked in red on both, a legend (amp-plot);
 *  - the number lines of f32, f16, bf16 and the FP8 formats on one axis (amp-formats), and of
 *    f16 with histograms of values drawn on it (amp-loss-scaling).
 *  - one number line (f16, bf16, f32, f8e4m3 or f8e5m2) with a histogram already counted (the trainers'
 *    --report, examples/common/run_report.c).
 * Used by the amp programs, the trainers' run report, tests/test_amp_monitor.c and
 * tests/test_amp_lessons.c. */
#ifndef NANOAMP_EXAMPLES_AMP_PLOT_H
#define NANOAMP_EXAMPLES_AMP_PLOT_H

#include <stdint.h>
#include <stdio.h>

/* Reads csv, writes svg (amp_plot_log). Returns the number of rows plotted (>= 1), or -1 with
 * a message in err (a bad header or row, or an empty log). */
int amp_plot_svg(FILE *csv, FILE *svg, const char *title, char *err, size_t err_size);
/* One row of a training log: the monitor's CSV line (skipped: the steps it skipped). */
typedef struct {
    double step, loss, scale, skipped;
} amp_plot_row;
/* The log's picture from n >= 1 rows. 0, or -1 on bad arguments or a write error. */
int amp_plot_log(FILE *svg, const char *title, const amp_plot_row *rows, int n);
/* The FP8 columns of a log (na_amp_monitor_watch_fp8): t tensors named names[k], per row i
 * v[i*2t + k] the scale and v[i*2t + t + k] the running count of saturated values; drawn as
 * one line of log2 scale per tensor, red dots where the count rose. Part of amp_plot_svg's
 * picture when the log has them (below the log's own). 0, or -1. */
int amp_plot_fp8(FILE *svg, const amp_plot_row *r, int n, int t, const char *const *names,
                 const double *v);
/* s with <, > and & escaped (for SVG and HTML text). */
void amp_plot_escape(FILE *f, const char *s);

/* A histogram of log2 |values[i] * scale|, one bar per power of two. */
typedef struct {
    const char *label, *color;
    int64_t n;
    const float *values;
    double scale;
} amp_hist;
/* Of h's values times h->scale: the shares f16 would round to 0 (0 < |v| < 2^-25), would keep
 * as subnormals (2^-25 <= |v| < 2^-14), and that are 0 already. */
void amp_hist_f16_shares(const amp_hist *h, double *to_zero, double *subnormal, double *zero);
/* The f16 line (n_formats 1) or the f16 and bf16 lines (2), the hists drawn on the f16 line
 * with a legend each (the share that would round to 0, be subnormal, is already 0). Returns 0,
 * or -1 on bad arguments or a write error. */
int amp_plot_number_lines(FILE *svg, const char *title, int n_formats, const amp_hist *h,
                          int n_hist);

/* f32, f16, bf16, f8e4m3 and f8e5m2 on one shared log2 axis (amp-formats --svg): each
 * format's zones, the overflow zone labelled with what a larger value becomes, and each
 * caption with the spacing at 1. 0, or -1 on a write error. */
int amp_plot_formats(FILE *svg, const char *title);

/* Panels of one format's line each ("f32", "f16", "bf16", "f8e4m3", "f8e5m2") with up to two
 * histograms drawn on it, each with its legend line under the panel (the caller's text: the
 * shares it counted, nanoamp's na_amp_hist where the library is at hand; amp-plot itself links
 * only libm). 0, or -1 on an unknown format, bad arguments or a write error. */
typedef struct {
    const char *format;
    int n_hist;
    amp_hist h[2];
    const char *legend[2];
} amp_hist_panel;
int amp_plot_hist_panels(FILE *svg, const char *title, const amp_hist_panel *p, int n);

/* A picture of format's line ("f16", "bf16", "f32", "f8e4m3" or "f8e5m2"): its zones (rounds to 0, subnormal,
 * normal, inf) and above them bars of count[b], the values with 2^(lo+b) <= |x| < 2^(lo+b+1),
 * b < n (those beyond the axis drawn at its ends). 0, or -1 on an unknown format, bad
 * arguments or a write error. */
int amp_plot_hist_line(FILE *svg, const char *title, const char *format, const double *count,
                       int lo, int n, const char *color);

#endif
