/* na-bench — nanoamp's benchmarks (see bench.h and docs/benchmarks.md). bench/run runs them
 * side by side with their PyTorch twins (bench/torch/) and prints the table. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_util.h"
#include "../examples/common/blas_tune.h"
#include "na_config.h"

int bench_parse_device(const char *s, na_device *dev) {
    if (!strcmp(s, "cpu")) *dev = NA_DEVICE_CPU;
    else if (!strcmp(s, "cuda")) *dev = NA_DEVICE_CUDA;
    else {
        fprintf(stderr, "na-bench: --device expects cpu or cuda, got '%s'\n", s);
        return -1;
    }
    return 0;
}

static void error_line(const char *key, const char *msg) {
    bench_json j;
    bench_json_begin(&j, stdout);
    bench_json_str(&j, "key", key);
    bench_json_str(&j, "impl", "nanoamp");
    bench_json_str(&j, "error", msg);
    bench_json_end(&j);
}

int bench_check_device(na_device dev, const char *key) {
    if (dev != NA_DEVICE_CUDA || na_cuda_available()) return 0;
    error_line(key, na_cuda_built() ? "no CUDA device" : "built without CUDA");
    return -1;
}

void bench_sync(na_device dev) {
    if (dev == NA_DEVICE_CUDA) na_cuda_synchronize();
}

int bench_fail(const char *key, const char *what) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s: %s", what, na_last_error());
    fprintf(stderr, "na-bench %s: %s\n", key, msg);
    error_line(key, msg);
    return 1;
}

static int info_main(void) {
    int major = 0, minor = 0;
    bool cuda = na_cuda_available();
    if (cuda) na_cuda_capability(&major, &minor);
    bench_json j;
    bench_json_begin(&j, stdout);
    bench_json_str(&j, "bench", "info");
    bench_json_str(&j, "impl", "nanoamp");
    bench_json_bool(&j, "cuda_built", na_cuda_built());
    bench_json_bool(&j, "cuda_available", cuda);
    bench_json_str(&j, "cuda_device", cuda ? na_cuda_device_name() : "");
    bench_json_int(&j, "cuda_capability", cuda ? major * 10 + minor : 0);
    bench_json_bool(&j, "cuda_bf16", cuda && na_cuda_bf16_supported());
    bench_json_bool(&j, "cudnn", NA_HAVE_CUDNN);
    bench_json_bool(&j, "blas", NA_HAVE_BLAS);
    bench_json_bool(&j, "mpi", na_dist_built_with_mpi());
    bench_json_int(&j, "nproc", bench_nproc());
    const char *core = blas_tune_core(); /* bench/run sets OPENBLAS_CORETYPE from it */
    bench_json_str(&j, "blas_core", core ? core : "");
    bench_json_end(&j);
    return 0;
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "info")) return info_main();
    if (!strcmp(cmd, "overhead")) return bench_overhead_main(argc, argv);
    if (!strcmp(cmd, "train")) return bench_train_main(argc, argv);
    bool help = !strcmp(cmd, "--help") || !strcmp(cmd, "-h");
    if (!help && *cmd)
        fprintf(stderr, "%s: unknown command '%s'\n", argv[0], cmd);
    else if (!help)
        fprintf(stderr, "%s: no command given\n", argv[0]);
    fprintf(help ? stdout : stderr,
            "usage: %s info | overhead [options] | train [options]\n"
            "  overhead --device cpu|cuda --ops N --warmup N --repeats N\n"
            "  train --model mlp|cnn|resnet9 --device cpu|cuda --amp off|fp16|bf16|o2|fp8\n"
            "        --batch N --warmup N --repeats N --steps N --threads N [--profile]\n"
            "        [--cuda-graph] [--channels-last] [--tf32] [--ddp [--allreduce-dtype T]]\n"
            "(bench/run runs them all beside PyTorch; see docs/benchmarks.md)\n",
            argv[0]);
    return help ? 0 : 2;
}
