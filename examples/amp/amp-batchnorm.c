/* amp-batchnorm — why BatchNorm's statistics stay in f32: each reason computed. Lesson of
 * docs/mixed-precision.md; the numbers it prints are the ones the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-batchnorm\n"
                           "a BatchNorm channel's sums, running statistics and eps in f16, "
                           "bf16 and f32\n", NULL, false, amp_batchnorm_run);
}
