/* amp-plot — turns a training log (mnist-train --log run.csv, or any na_amp_monitor CSV) into an
 * SVG: the loss, the loss scale on a log axis, skipped steps marked.
 *
 *   amp-plot run.csv            writes run.svg
 *   amp-plot run.csv out.svg    writes out.svg ("-" for stdout)
 *   amp-plot --title TEXT ...   the picture's title (default: the log's file name)
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "amp_plot.h"

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("amp-plot (nanoamp %s)\n", NANOAMP_VERSION);
        return 0;
    }
    const char *title = NULL;
    if (argc == 2 && !strcmp(argv[1], "--title")) {
        fprintf(stderr, "amp-plot: --title needs a value (the picture's title)\n");
        return 2;
    }
    if (argc >= 3 && !strcmp(argv[1], "--title")) {
        title = argv[2];
        argv[2] = argv[0], argv += 2, argc -= 2; /* the rest as if without it */
    }
    bool help = argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    if (help || argc < 2 || argc > 3) {
        fprintf(help ? stdout : stderr,
                "usage: amp-plot [--title TEXT] LOG.csv [OUT.svg | -] | --help | --version\n"
                "draws the loss, the loss scale (log axis) and the skipped steps of a training "
                "log (columns step,loss,scale,skipped), and below them, where the log has them "
                "(--amp fp8), each FP8 tensor's scale and the steps it saturated\n");
        return help ? 0 : 2;
    }
    char out[4096];
    if (argc == 3) {
        snprintf(out, sizeof out, "%s", argv[2]);
    } else {
        snprintf(out, sizeof out, "%s", argv[1]);
        size_t len = strlen(out);
        if (len > 4 && !strcmp(out + len - 4, ".csv")) out[len - 4] = '\0';
        strncat(out, ".svg", sizeof out - strlen(out) - 1);
    }
    FILE *in = fopen(argv[1], "r");
    if (!in) {
        fprintf(stderr, "amp-plot: cannot read %s\n", argv[1]);
        return 1;
    }
    FILE *svg = strcmp(out, "-") ? fopen(out, "w") : stdout;
    if (!svg) {
        fprintf(stderr, "amp-plot: cannot write %s\n", out);
        fclose(in);
        return 1;
    }
    char err[256];
    int n = amp_plot_svg(in, svg, title ? title : argv[1], err, sizeof err);
    fclose(in);
    if (svg != stdout && fclose(svg) != 0) n = -1, snprintf(err, sizeof err, "write failed");
    if (n < 0) {
        fprintf(stderr, "amp-plot: %s: %s\n", argv[1], err);
        if (svg != stdout) remove(out);
        return 1;
    }
    if (svg != stdout) fprintf(stderr, "amp-plot: %d steps -> %s\n", n, out);
    return 0;
}
