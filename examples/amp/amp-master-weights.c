/* amp-master-weights — small updates lost in f16 and bf16 weights and kept by f32 master
 * weights. Lesson of docs/mixed-precision.md; the numbers it prints are the ones the guide
 * quotes (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(int argc, char **argv) {
    int rc = amp_lesson_args(argc, argv,
                             "usage: amp-master-weights\n"
                             "1000 small SGD updates to a weight stored in f16 and in bf16, "
                             "with and without an f32 master weight\n", NULL, false, NULL);
    if (rc >= 0) return rc;
    amp_master_result r;
    if (amp_lesson_master_weights(&r)) return 1;
    amp_master_print(&r, stdout);
    return 0;
}
