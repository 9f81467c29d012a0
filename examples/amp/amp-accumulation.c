/* amp-accumulation — an f16 sum that stops growing, and an f16 exp and softmax that overflow:
 * why autocast's products accumulate in f32 and why exp, softmax and the losses run in f32.
 * Lesson of docs/mixed-precision.md (tests/test_amp_lessons.c checks what it prints). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-accumulation\n"
                           "sums 4096 x 0.1 with an f16 and an f32 accumulator, and computes "
                           "exp and a softmax in f16 and in f32\n",
                           NULL, false, amp_accumulation_run);
}
