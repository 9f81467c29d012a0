/* amp-overflow — an overflow the dynamic loss scaler detects, skips and recovers from; --log
 * FILE.csv also trains the MLP of amp-loss-scaling with a scaler that grows every 10 steps and
 * logs the scale's sawtooth for amp-plot. Lesson of docs/mixed-precision.md; the numbers it
 * prints are the ones the guide quotes (tests/test_amp_lessons.c checks both). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-overflow [--log FILE.csv]\n"
                           "a linear regression whose step 5 overflows in f16: detected, "
                           "skipped, the scale halved and grown back;\n"
                           "--log also trains an MLP on Fashion-MNIST ($NANOAMP_DATA, else "
                           "/usr/share/datasets/fashion-mnist) with a GradScaler growing every "
                           "10 steps, and writes its per-step log (amp-plot FILE.csv draws it)\n",
                           "--log", true, amp_overflow_run);
}
