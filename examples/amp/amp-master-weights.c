/* amp-master-weights — small updates lost in f16 and bf16 weights and kept by f32 master
 * weights. Lesson of docs/mixed-precision.md; the numbers it prints are the ones the guide
 * quotes (tests/test_amp_lessons.c checks both). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-master-weights\n"
                           "1000 small SGD updates to a weight stored in f16 and in bf16, "
                           "with and without an f32 master weight\n", NULL, false, amp_master_weights_run);
}
