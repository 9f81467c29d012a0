/* amp-loss-scaling — an MLP whose f16 gradients underflow: without loss scaling it learns little,
 * with the GradScaler it learns as f32 does; --svg FILE draws the first step's gradients on the
 * f16 number line, as they are and scaled. Lesson of docs/mixed-precision.md
 * (tests/test_amp_lessons.c checks what it prints and draws). */
#include <stdio.h>

#include "amp_lessons.h"

static amp_loss_scaling_result result;
static int draw(FILE *svg) { return amp_loss_scaling_svg(&result, svg); }

int main(int argc, char **argv) {
    const char *svg_path;
    int rc = amp_lesson_args(argc, argv,
                             "usage: amp-loss-scaling [--svg FILE.svg]\n"
                             "trains an MLP on Fashion-MNIST ($NANOAMP_DATA, else "
                             "/usr/share/datasets/fashion-mnist) with its loss x 1e-5, three "
                             "times: f32, f16 without loss scaling, f16 with the GradScaler;\n"
                             "--svg also draws the first step's gradients on the f16 number "
                             "line\n", "--svg", true, &svg_path);
    if (rc >= 0) return rc;
    if (amp_lesson_loss_scaling(NULL, &result)) {
        fprintf(stderr, "amp-loss-scaling: %s\n", na_last_error());
        return 1;
    }
    amp_loss_scaling_print(&result, stdout);
    rc = svg_path ? amp_write_svg(svg_path, draw) : 0;
    amp_loss_scaling_free(&result);
    return rc;
}
