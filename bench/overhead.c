/* bench/overhead.c — framework overhead: a chain of tiny ops with autograd on.
 *
 * x is a 1-element f32 leaf that requires grad; c a 1-element constant (1.0). One iteration
 * builds y = x, then y = y + c, y = y * c, ... alternately (--ops ops in all), runs backward
 * from y, zeroes x's gradient and releases the step (na_step_end). With 1-element tensors the
 * arithmetic is nothing: what is measured is the cost of an op's front end, its graph node,
 * its backward and the arena. Reported per op:
 *   us_per_op      (forward + backward + release) / ops
 *   fwd_us_per_op  forward only / ops
 * On CUDA each op is a kernel launch; the iteration ends with a device synchronization so the
 * time includes the work, not just its submission. bench/torch/overhead.py is the twin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_util.h"

int bench_overhead_main(int argc, char **argv) {
    na_device dev = NA_DEVICE_CPU;
    int64_t ops = 1000, warmup = 5, repeats = 30;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--device")) {
            const char *v = bench_arg_str(argc, argv, &i);
            if (bench_parse_device(v, &dev)) return 2;
        } else if (!strcmp(a, "--ops")) {
            ops = bench_arg_i64(argc, argv, &i, 2);
        } else if (!strcmp(a, "--warmup")) {
            warmup = bench_arg_i64(argc, argv, &i, 0);
        } else if (!strcmp(a, "--repeats")) {
            repeats = bench_arg_i64(argc, argv, &i, 1);
        } else {
            fprintf(stderr, "na-bench overhead: unknown option '%s'\n"
                            "usage: na-bench overhead [--device cpu|cuda] [--ops N] [--warmup N] "
                            "[--repeats N]\n", a);
            return 2;
        }
    }
    char key[64];
    snprintf(key, sizeof key, "overhead/%s", na_device_name(dev));
    if (bench_check_device(dev, key)) return 3;

    na_tensor *x = na_tensor_new(NA_DTYPE_F32, dev, NA_SHAPE(1));
    na_tensor *c = na_tensor_new(NA_DTYPE_F32, dev, NA_SHAPE(1));
    if (!x || !c || na_fill_(x, 0.5) || na_fill_(c, 1.0) || na_tensor_set_requires_grad(x, true))
        return bench_fail(key, "setup");

    double *total = calloc((size_t)repeats, sizeof *total);
    double *fwd = calloc((size_t)repeats, sizeof *fwd);
    if (!total || !fwd) return bench_fail(key, "out of memory");
    for (int64_t r = -warmup; r < repeats; r++) {
        bench_sync(dev);
        double t0 = bench_now_s();
        na_tensor *y = x;
        for (int64_t i = 0; i < ops && y; i++) y = (i & 1) ? na_mul(y, c) : na_add(y, c);
        double t1 = bench_now_s();
        if (!y || na_backward(y, NULL) != NA_OK || na_tensor_zero_grad(x) != NA_OK)
            return bench_fail(key, "chain");
        na_step_end();
        bench_sync(dev);
        double t2 = bench_now_s();
        if (r >= 0) {
            total[r] = (t2 - t0) / (double)ops * 1e6;
            fwd[r] = (t1 - t0) / (double)ops * 1e6;
        }
    }
    bench_stats st = bench_stats_of(total, (int)repeats), sf = bench_stats_of(fwd, (int)repeats);

    bench_json j;
    bench_json_begin(&j, stdout);
    bench_json_str(&j, "bench", "overhead");
    bench_json_str(&j, "key", key);
    bench_json_str(&j, "impl", "nanoamp");
    bench_json_str(&j, "device", na_device_name(dev));
    bench_json_int(&j, "ops", ops);
    bench_json_int(&j, "warmup", warmup);
    bench_json_int(&j, "repeats", repeats);
    bench_json_stats(&j, "us_per_op", &st);
    bench_json_stats(&j, "fwd_us_per_op", &sf);
    bench_json_end(&j);
    free(total);
    free(fwd);
    na_tensor_free(x);
    na_tensor_free(c);
    return 0;
}
