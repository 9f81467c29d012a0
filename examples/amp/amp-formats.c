/* amp-formats — the limits of f16, bf16 and f32, each checked by casting through nanoamp's own
 * conversions; --svg FILE draws the f16 and bf16 number lines. Lesson of
 * docs/mixed-precision.md (tests/test_amp_lessons.c checks what it prints and draws). */
#include "amp_lessons.h"

int main(int argc, char **argv) {
    return amp_lesson_main(argc, argv,
                           "usage: amp-formats [--svg FILE.svg]\n"
                           "prints the limits of f16, bf16 and f32; --svg also draws their "
                           "number lines\n", "--svg", true, amp_formats_run);
}
