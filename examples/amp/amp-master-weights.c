/* amp-master-weights — small updates lost in f16 weights and kept by f32 master weights.
 * Lesson of docs/mixed-precision.md; the numbers it prints are the ones the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(void) {
    amp_master_result r;
    if (amp_lesson_master_weights(&r)) return 1;
    amp_master_print(&r, stdout);
    return 0;
}
