/* examples/amp/amp_plot.h — a training log (the monitor's CSV: step,loss,scale,skipped) drawn as
 * an SVG a browser shows: the loss on top, the loss scale below on a log2 axis, skipped steps
 * marked in red on both. Used by amp-plot and by tests/test_amp_monitor.c. */
#ifndef NANOAMP_EXAMPLES_AMP_PLOT_H
#define NANOAMP_EXAMPLES_AMP_PLOT_H

#include <stdio.h>

/* Reads csv, writes svg. Returns the number of rows plotted (>= 1), or -1 with a message in
 * err (a bad header or row, or an empty log). */
int amp_plot_svg(FILE *csv, FILE *svg, const char *title, char *err, size_t err_size);

#endif
