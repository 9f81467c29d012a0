/* amp-overflow — an overflow the dynamic loss scaler detects, skips and recovers from; --log
 * FILE.csv also trains the MLP of amp-loss-scaling with a scaler that grows every 10 steps and
 * logs the scale's sawtooth for amp-plot. Lesson of docs/mixed-precision.md; the numbers it
 * prints are the ones the guide quotes (tests/test_amp_lessons.c checks both). */
#include <stdio.h>

#include "amp_lessons.h"

int main(int argc, char **argv) {
    const char *csv;
    int rc = amp_lesson_args(argc, argv,
                             "usage: amp-overflow [--log FILE.csv]\n"
                             "a linear regression whose step 5 overflows in f16: detected, "
                             "skipped, the scale halved and grown back;\n"
                             "--log also trains an MLP on Fashion-MNIST ($NANOAMP_DATA, else "
                             "/usr/share/datasets/fashion-mnist) with a GradScaler growing every "
                             "10 steps, and writes its per-step log (amp-plot FILE.csv draws it)\n",
                             "--log", true, &csv);
    if (rc >= 0) return rc;
    amp_overflow_result r;
    if (amp_lesson_overflow(&r)) return 1;
    amp_overflow_print(&r, stdout);
    if (!csv) return 0;
    amp_sawtooth_result s;
    if (amp_lesson_sawtooth(NULL, csv, &s)) {
        fprintf(stderr, "amp-overflow: %s\n", na_last_error());
        return 1;
    }
    amp_sawtooth_print(&s, stdout);
    printf("per-step log: %s\n", csv);
    return 0;
}
