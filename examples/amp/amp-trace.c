/* amp-trace — the autocast trace of one training step of the MNIST CNN.
 * Lesson of docs/mixed-precision.md; the numbers it prints are the ones the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(void) {
    amp_trace_result r;
    if (amp_lesson_trace(&r)) return 1;
    amp_trace_print(&r, stdout);
    return 0;
}
