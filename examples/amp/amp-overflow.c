/* amp-overflow — an overflow the dynamic loss scaler detects, skips and recovers from.
 * Lesson of docs/mixed-precision.md; the numbers it prints are the ones the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(void) {
    amp_overflow_result r;
    if (amp_lesson_overflow(&r)) return 1;
    amp_overflow_print(&r, stdout);
    return 0;
}
