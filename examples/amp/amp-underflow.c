/* amp-underflow — gradients that underflow to zero in f16 without loss scaling, and survive with
 * it. Lesson of docs/mixed-precision.md; the numbers it prints are the ones the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-underflow\n"
                           "the gradients 1e-3 .. 1e-10 of one layer under f16 autocast, "
                           "without and with a loss scale of 65536\n", NULL, false, amp_underflow_run);
}
