/* amp-trace — the autocast trace of one training step of the MNIST CNN; --rules prints the rule
 * table instead. Lesson of docs/mixed-precision.md; what it prints is what the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-trace [--rules]\n"
                           "traces each op of one f16 training step of the MNIST CNN: inputs' "
                           "dtypes, autocast rule, compute and output dtype;\n"
                           "--rules prints the autocast rule of every op instead\n",
                           "--rules", false, amp_trace_run);
}
