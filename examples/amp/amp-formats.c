/* amp-formats — the limits of f16, bf16 and f32, each checked by casting through nanoamp's own
 * conversions; --svg FILE draws the f16 and bf16 number lines. Lesson of
 * docs/mixed-precision.md (tests/test_amp_lessons.c checks what it prints and draws). */
#include <stdio.h>

#include "amp_lessons.h"

int main(int argc, char **argv) {
    const char *svg_path;
    int rc = amp_lesson_args(argc, argv,
                             "usage: amp-formats [--svg FILE.svg]\n"
                             "prints the limits of f16, bf16 and f32; --svg also draws their "
                             "number lines\n", "--svg", true, &svg_path);
    if (rc >= 0) return rc;
    amp_underflow_result r;
    if (amp_lesson_formats(&r)) return 1;
    amp_formats_print(&r, stdout);
    return svg_path ? amp_write_svg(svg_path, amp_formats_svg) : 0;
}
