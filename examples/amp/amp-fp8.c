/* amp-fp8 — why FP8 needs one f32 scale per tensor, shown on a real layer's tensors, and what
 * delayed scaling does when an amax jumps. Lesson of docs/mixed-precision.md; the numbers it
 * prints are the ones the guide quotes (tests/test_amp_lessons.c checks both). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-fp8 [--svg FILE]\n"
                           "the MNIST MLP's first layer cast to E4M3 and E5M2 with and without a "
                           "scale, and delayed against current scaling through an amax jump\n"
                           "(reads Fashion-MNIST from $NANOAMP_DATA or "
                           "/usr/share/datasets/fashion-mnist)\n"
                           "  --svg FILE  also draw the tensors on the FP8 number lines\n",
                           "--svg", true, amp_fp8_run);
}
