/* amp-batchnorm — why BatchNorm's statistics stay in f32: each reason computed. Lesson of
 * docs/mixed-precision.md; the numbers it prints are the ones the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(int argc, char **argv) {
    int rc = amp_lesson_args(argc, argv,
                             "usage: amp-batchnorm\n"
                             "a BatchNorm channel's sums, running statistics and eps in f16, "
                             "bf16 and f32\n", NULL, false, NULL);
    if (rc >= 0) return rc;
    amp_batchnorm_result r;
    if (amp_lesson_batchnorm(&r)) return 1;
    amp_batchnorm_print(&r, stdout);
    return 0;
}
