/* amp-underflow — gradients that underflow to zero in f16 without loss scaling, and survive with
 * it. Lesson of docs/mixed-precision.md; the numbers it prints are the ones the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(void) {
    amp_underflow_result r;
    if (amp_lesson_underflow(&r)) return 1;
    amp_formats_print(&r, stdout);
    amp_underflow_print(&r, stdout);
    return 0;
}
