/* amp-loss-scaling — an MLP whose f16 gradients underflow: without loss scaling it learns little,
 * with the GradScaler it learns as f32 does; --svg FILE draws the first step's gradients on the
 * f16 number line, as they are and scaled. Lesson of docs/mixed-precision.md
 * (tests/test_amp_lessons.c checks what it prints and draws). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-loss-scaling [--svg FILE.svg]\n"
                           "trains an MLP on Fashion-MNIST ($NANOAMP_DATA, else "
                           "/usr/share/datasets/fashion-mnist) with its loss x 1e-5, three "
                           "times: f32, f16 without loss scaling, f16 with the GradScaler;\n"
                           "--svg also draws the first step's gradients on the f16 number "
                           "line\n", "--svg", true, amp_loss_scaling_run);
}
