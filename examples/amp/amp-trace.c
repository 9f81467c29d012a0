/* amp-trace — the autocast trace of one training step of the MNIST CNN; --rules prints the rule
 * table instead. Lesson of docs/mixed-precision.md; what it prints is what the guide quotes
 * (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(int argc, char **argv) {
    const char *rules;
    int rc = amp_lesson_args(argc, argv,
                             "usage: amp-trace [--rules]\n"
                             "traces each op of one f16 training step of the MNIST CNN: inputs' "
                             "dtypes, autocast rule, compute and output dtype;\n"
                             "--rules prints the autocast rule of every op instead\n",
                             "--rules", false, &rules);
    if (rc >= 0) return rc;
    if (rules) return amp_rules_print(stdout) < 0;
    amp_trace_result r;
    if (amp_lesson_trace(&r)) return 1;
    amp_trace_print(&r, stdout);
    return 0;
}
