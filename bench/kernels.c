/* na-kbench — CPU kernel micro-benchmarks, for before/after numbers of one kernel at a time
 * (the training step is na-bench's job). Each case prints the minimum over --repeats timed
 * calls, in milliseconds, which is the figure least disturbed by other work on the machine.
 *
 *   na-kbench [--repeats N] [case...]     cases: convert (default: all)
 *
 * convert: f32 <-> f16 / bf16 of 4.8M elements (one CNN activation set), through the
 *          portable half.h loops and through the CPU's instructions (cpu_convert.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cpu/cpu_internal.h"

static int repeats = 20;

/* min over `repeats` runs of body, in ms */
#define BENCH_MIN_MS(result, body)                                                          \
    do {                                                                                    \
        double best_ = 1e300;                                                               \
        for (int r_ = 0; r_ < repeats; r_++) {                                              \
            double t0_ = bench_now_s();                                                     \
            body;                                                                           \
            double dt_ = (bench_now_s() - t0_) * 1e3;                                       \
            if (dt_ < best_) best_ = dt_;                                                   \
        }                                                                                   \
        (result) = best_;                                                                   \
    } while (0)

static void print_row(const char *kernel, const char *variant, int64_t n, double ms) {
    bench_json j;
    bench_json_begin(&j, stdout);
    bench_json_str(&j, "bench", "kernel");
    bench_json_str(&j, "kernel", kernel);
    bench_json_str(&j, "variant", variant);
    bench_json_int(&j, "n", n);
    bench_json_num(&j, "min_ms", ms);
    bench_json_end(&j);
}

static int bench_convert(void) {
    const int64_t n = 128 * 16 * 48 * 48; /* ~4.7M */
    float *f = malloc((size_t)n * sizeof *f), *back = malloc((size_t)n * sizeof *back);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!f || !h || !back) return 1;
    for (int64_t i = 0; i < n; i++) f[i] = (float)((i * 2654435761u) % 20001) * 1e-3f - 10.0f;
    for (int soft = 1; soft >= 0; soft--) {
        na_cpu_convert_force_soft = soft;
        const char *v = soft ? "portable" : (na_cpu_convert_is_fast() ? "f16c_avx2" : "portable");
        double ms;
        BENCH_MIN_MS(ms, na_cpu_f32_to_f16(h, f, n));
        print_row("f32_to_f16", v, n, ms);
        BENCH_MIN_MS(ms, na_cpu_f16_to_f32(back, h, n));
        print_row("f16_to_f32", v, n, ms);
        BENCH_MIN_MS(ms, na_cpu_f32_to_bf16(h, f, n));
        print_row("f32_to_bf16", v, n, ms);
        BENCH_MIN_MS(ms, na_cpu_bf16_to_f32(back, h, n));
        print_row("bf16_to_f32", v, n, ms);
    }
    na_cpu_convert_force_soft = false;
    free(f), free(h), free(back);
    return 0;
}

static const struct {
    const char *name;
    int (*run)(void);
} cases[] = {
    {"convert", bench_convert},
};

int main(int argc, char **argv) {
    int ran = 0, rc = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeats")) {
            repeats = (int)bench_arg_i64(argc, argv, &i, 1);
            continue;
        }
        size_t k = 0;
        while (k < sizeof cases / sizeof cases[0] && strcmp(cases[k].name, argv[i])) k++;
        if (k == sizeof cases / sizeof cases[0]) {
            fprintf(stderr, "na-kbench: unknown case '%s'\n", argv[i]);
            return 2;
        }
        rc |= cases[k].run();
        ran = 1;
    }
    for (size_t k = 0; !ran && k < sizeof cases / sizeof cases[0]; k++) rc |= cases[k].run();
    return rc;
}
