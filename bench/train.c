/* bench/train.c — one training configuration: step time, images/s, peak memory and host
 * round trips per step.
 *
 * The model (examples/common/models.h) trains on one fixed random batch (x ~ N(0, 1), labels uniform in
 * 0..9) that stays on the device: data loading is not part of the step. One step is
 * forward, cross-entropy (mean), backward, the optimizer step (SGD, lr 0.01, momentum 0.9),
 * zero_grad and na_step_end, in one of the amp modes, each the trainers' recipe
 * (trainer_amp_init, examples/common/trainer.h):
 *   off    f32
 *   fp16   autocast f16 around forward + loss, GradScaler (PyTorch's defaults)
 *   bf16   autocast bf16 around forward + loss, no loss scaling (PyTorch's recipe)
 *   o2     Apex O2: the model converted to f16 except BatchNorm, the input cast to f16, f32
 *          master weights and dynamic loss scaling (na_fp16_optimizer)
 *
 * Timing: --warmup steps first, then --repeats blocks of --steps steps; each block is timed
 * from a synchronized device to a synchronized device and gives one figure (block time /
 * steps). --threads N sets the CPU pool (default: $NANOAMP_BENCH_THREADS, which bench/run
 * sets for both sides, else NANOAMP_THREADS or the core count). Reported: the median, min,
 * max and quartiles of the per-step time over the blocks.
 * Host round trips: na_cuda_sync_count() over the timed steps, not counting the benchmark's
 * own synchronizations at block ends. Memory: the process's peak RSS (getrusage) and its RSS
 * before the model was built; the step arena's peak (na_arena_peak); on CUDA nanoamp's peak
 * device bytes. Run each configuration in a fresh process (bench/run does) so peaks do not mix.
 * bench/torch/train.py is the twin.
 * --profile: one more step after the timed ones runs under the profiler (nanoamp/profile.h),
 * whose table goes to stderr. --profile-steps N: N such steps, each profiled on its own, the
 * last one's table printed; the JSON gets the least wall time of one (profile_step_ms_min)
 * and the least time of the BatchNorm layers' rows, forward and backward together
 * (profile_batchnorm_ms_min: the figure bench/syncbn-cost compares).
 * --cpu-clock: the blocks are timed in the process's CPU time (CLOCK_PROCESS_CPUTIME_ID), not
 * wall time: on a loaded shared machine, with --threads 1, the figure descheduling leaves out.
 * --cuda-graph (CUDA only): after the warm-up (at least 2 steps), the step is captured once
 * (trainer_amp_capture, the trainers' --cuda-graph) and the timed steps are replays of it;
 * the key ends in /graph and "cuda_graph" is true. A step that cannot be captured fails the
 * configuration with the reason (no silent eager figures under a graph key).
 * --channels-last: each step's batch goes in channels-last (trainer_amp's channels_last), so
 * the convolutions' activations stay NHWC; the key ends in /cl.
 * --tf32 (CUDA only): f32 matrix products and convolutions in TF32 (na_cuda_set_tf32, as
 * NANOAMP_TF32=1); the key is unchanged and "tf32" says which math ran (bench/run asks for it
 * on CUDA f32 rows, where PyTorch is also run with TF32, so the f32 row compares like with
 * like).
 *
 * Data parallel (--ddp, under mpirun -np N): every rank trains its own batch of --batch through
 * the trainers' na_ddp (trainer_amp_init_dist, gradients reduced in --allreduce-dtype); rank 0
 * alone prints, with world_size, images_per_s of all ranks and comm_bytes_per_step (payload
 * one rank hands to the all-reduce per step). --ddp in a world of 1 measures the wrapper's
 * overhead. --sync-bn (with --ddp): the BatchNorms are SyncBatchNorms (the trainers'
 * --sync-bn); the key gets /syncbn. In a world of 1 they fall back to BatchNorm unless
 * NANOAMP_DIST_COLLECTIVES=1, which runs their own path with collectives that move nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_util.h"
#include "../examples/common/models.h"
#include "../examples/common/trainer.h"

static const char *const amp_names[] = {"off", "fp16", "bf16", "o2", "fp8"};

typedef struct {
    na_module *net;
    trainer_amp amp;            /* the trainers' recipe for the mode (examples/common) */
    na_tensor *x, *y;           /* the batch: f32 [B, C, H, W], i32 [B] */
    na_tensor *loss;            /* the last step's loss (valid until na_step_end) */
} bench_trainer;

/* One training step; keeps the loss (a step tensor) and does not end the step. */
static int train_step(bench_trainer *t) {
    t->loss = trainer_amp_loss(&t->amp, t->net, t->x, t->y, 0.0);
    return t->loss && trainer_amp_step(&t->amp, t->loss) == NA_OK ? 0 : -1;
}

static int setup(bench_trainer *t, const char *model, const char *amp, na_device dev,
                 int64_t batch, na_dist *dist, na_dtype allreduce_dtype, bool sync_bn) {
    int64_t shape[4];
    t->net = model_by_name(model, shape);
    if (!t->net || na_module_to(t->net, dev)) return -1;
    if (sync_bn && na_module_sync_batchnorm(t->net, dist)) return -1;
    na_sgd_cfg sgd = NA_SGD_DEFAULTS;
    sgd.lr = 0.01, sgd.momentum = 0.9;
    /* o2: made without parameters, the fp16 optimizer adds the f32 masters */
    na_tensor_list params = strcmp(amp, "o2") ? na_module_parameters(t->net) : NA_NO_TENSORS;
    na_optim *opt = na_sgd_new(params, &sgd);
    na_ddp_config dc = {.allreduce_dtype = allreduce_dtype};
    if (trainer_amp_init_dist(&t->amp, amp, t->net, opt, NULL, dist, &dc)) return -1;
    na_module_train(t->net, true);

    shape[0] = batch;
    t->x = na_tensor_new(NA_DTYPE_F32, dev, 4, shape);
    t->y = na_tensor_new(NA_DTYPE_I32, dev, NA_SHAPE(batch));
    int32_t *labels = t->x && t->y ? malloc(sizeof(int32_t) * (size_t)batch) : NULL;
    if (!labels) return -1;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < batch; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        labels[i] = (int32_t)((s >> 33) % 10);
    }
    na_tensor *r = na_randn(NA_DTYPE_F32, dev, 4, shape, 0.0, 1.0);
    int rc = !r || na_copy_(t->x, r) || na_copy_from_host(t->y, labels) ? -1 : 0;
    free(labels);
    na_step_end();
    return rc;
}

static void teardown(bench_trainer *t) {
    trainer_amp_free(&t->amp);
    na_module_free(t->net);
    na_tensor_free(t->x);
    na_tensor_free(t->y);
}

int bench_train_main(int argc, char **argv) {
    const char *model = "mlp";
    na_device dev = NA_DEVICE_CPU;
    const char *amp = "off";
    int64_t batch = 128, warmup = 5, repeats = 10, steps = 5;
    bool ddp = false, sync_bn = false, cuda_graph = false, channels_last = false, tf32 = false;
    bool cpu_clock = false; /* --cpu-clock: blocks timed in the process's CPU time */
    int64_t profile_steps = 0; /* --profile: 1 */
    const char *allreduce = "f32";
    /* bench/run gives both sides its thread count in NANOAMP_BENCH_THREADS */
    const char *env_threads = getenv("NANOAMP_BENCH_THREADS");
    int64_t threads = env_threads ? atoll(env_threads) : 0; /* 0: the pool's default */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) {
            model = bench_arg_str(argc, argv, &i);
        } else if (!strcmp(a, "--device")) {
            if (bench_parse_device(bench_arg_str(argc, argv, &i), &dev)) return 2;
        } else if (!strcmp(a, "--amp")) {
            const char *v = bench_arg_str(argc, argv, &i);
            int k = 0;
            while (k < 5 && strcmp(v, amp_names[k])) k++;
            if (k == 5) {
                fprintf(stderr, "na-bench train: --amp expects off, fp16, bf16, o2 or fp8, got '%s'\n",
                        v);
                return 2;
            }
            amp = amp_names[k];
        } else if (!strcmp(a, "--batch")) {
            batch = bench_arg_i64(argc, argv, &i, 1);
        } else if (!strcmp(a, "--warmup")) {
            warmup = bench_arg_i64(argc, argv, &i, 0);
        } else if (!strcmp(a, "--repeats")) {
            repeats = bench_arg_i64(argc, argv, &i, 1);
        } else if (!strcmp(a, "--steps")) {
            steps = bench_arg_i64(argc, argv, &i, 1);
        } else if (!strcmp(a, "--ddp")) {
            ddp = true;
        } else if (!strcmp(a, "--sync-bn")) {
            sync_bn = true;
        } else if (!strcmp(a, "--allreduce-dtype")) {
            allreduce = bench_arg_str(argc, argv, &i);
            if (strcmp(allreduce, "f32") && strcmp(allreduce, "f16") && strcmp(allreduce, "bf16")) {
                fprintf(stderr, "na-bench train: --allreduce-dtype expects f32, f16 or bf16\n");
                return 2;
            }
        } else if (!strcmp(a, "--profile")) {
            profile_steps = profile_steps > 1 ? profile_steps : 1;
        } else if (!strcmp(a, "--profile-steps")) {
            profile_steps = bench_arg_i64(argc, argv, &i, 1);
        } else if (!strcmp(a, "--cuda-graph")) {
            cuda_graph = true;
        } else if (!strcmp(a, "--channels-last")) {
            channels_last = true;
        } else if (!strcmp(a, "--tf32")) {
            tf32 = true;
        } else if (!strcmp(a, "--threads")) {
            threads = bench_arg_i64(argc, argv, &i, 1);
        } else if (!strcmp(a, "--cpu-clock")) {
            cpu_clock = true;
        } else {
            fprintf(stderr, "na-bench train: unknown option '%s'\n"
                            "usage: na-bench train --model %s [--device cpu|cuda] "
                            "[--amp off|fp16|bf16|o2|fp8] [--batch N] [--warmup N] "
                            "[--repeats N] [--steps N] [--threads N] [--profile] "
                            "[--profile-steps N] [--cuda-graph] [--channels-last] [--tf32] "
                            "[--cpu-clock] "
                            "[--ddp [--allreduce-dtype f32|f16|bf16] [--sync-bn]]\n",
                    a, MODEL_NAMES);
            return 2;
        }
    }
    char key[128];
    snprintf(key, sizeof key, "train/%s/%s/%s%s%s%s%s%s", na_device_name(dev), model, amp,
             ddp ? "/ddp-" : "", ddp ? allreduce : "", sync_bn ? "/syncbn" : "",
             cuda_graph ? "/graph" : "", channels_last ? "/cl" : "");
    if (cuda_graph && dev != NA_DEVICE_CUDA) {
        na_set_error(NA_EINVAL, "%s", TRAINER_CUDA_GRAPH_NEEDS_CUDA);
        return bench_fail(key, "setup");
    }
    if (tf32 && dev != NA_DEVICE_CUDA) {
        na_set_error(NA_EINVAL, "--tf32 is CUDA's f32 tensor-core math: it needs --device cuda");
        return bench_fail(key, "setup");
    }
    if (cpu_clock && dev != NA_DEVICE_CPU) {
        na_set_error(NA_EINVAL, "--cpu-clock times the host's CPU time, not the device's: it "
                     "needs --device cpu");
        return bench_fail(key, "setup");
    }
    if (sync_bn && !ddp) {
        na_set_error(NA_EINVAL, "--sync-bn reduces BatchNorm statistics over the ranks: it needs "
                     "--ddp");
        return bench_fail(key, "setup");
    }
    if (bench_check_device(dev, key)) return 3;
    if (tf32 && na_cuda_set_tf32(true)) return bench_fail(key, "setup");
    if (dev == NA_DEVICE_CUDA && !strcmp(amp, "bf16") && !na_cuda_bf16_supported()) {
        na_set_error(NA_EDTYPE, "bf16 needs a CUDA device of compute capability 8.0 or newer");
        return bench_fail(key, "setup");
    }

    /* every failure goes through `done`, which frees what was made */
    const char *failed = NULL; /* the stage that failed */
#define FAIL(stage) do { failed = (stage); goto done; } while (0)
    na_dist *dist = NULL;
    bench_trainer t = {0};
    double *per_step = NULL;
    na_tensor *last_loss = NULL;
    na_step_graph *graph = NULL; /* --cuda-graph: the step, writing its loss into last_loss */
    if (ddp && !(dist = na_dist_init())) FAIL("na_dist_init");
    na_dtype ar_dtype = !strcmp(allreduce, "f16")    ? NA_DTYPE_F16
                        : !strcmp(allreduce, "bf16") ? NA_DTYPE_BF16 : NA_DTYPE_F32;
    if (threads > 0 && na_set_num_threads((int)(threads < NA_MAX_THREADS ? threads
                                                                          : NA_MAX_THREADS + 1)))
        FAIL("--threads");
    double base_rss = bench_rss_now_mib();
    na_manual_seed(0);
    if (setup(&t, model, amp, dev, batch, dist, ar_dtype, sync_bn)) FAIL("setup");
    t.amp.channels_last = channels_last;
    /* before the warm-up, so that the warm-up steps make what the captured one needs */
    if (cuda_graph && trainer_amp_graph_prepare(&t.amp, t.net, dev)) FAIL("--cuda-graph");

    for (int64_t i = 0; i < warmup; i++) {
        if (train_step(&t)) FAIL("warm-up step");
        na_step_end();
    }
    if (!(per_step = calloc((size_t)repeats, sizeof *per_step))) FAIL("out of memory");
    /* the last step's loss is copied here on the device (no round trip) and read at the end */
    if (!(last_loss = na_tensor_new(NA_DTYPE_F32, dev, 0, NULL))) FAIL("setup");
    if (cuda_graph) {
        if (warmup < 2) {
            na_set_error(NA_EINVAL, "--cuda-graph needs --warmup 2 or more (the step's memory "
                         "must be in place before the capture)");
            FAIL("setup");
        }
        if (!(graph = trainer_amp_capture(&t.amp, t.net, t.x, t.y, 0.0, last_loss)))
            FAIL("--cuda-graph capture");
    }
    uint64_t syncs = 0;
    for (int64_t r = 0; r < repeats; r++) {
        bench_sync(dev);
        uint64_t c0 = na_cuda_sync_count();
        double t0 = cpu_clock ? bench_cpu_s() : bench_now_s();
        for (int64_t i = 0; i < steps && graph; i++)
            if (na_step_graph_replay(graph)) FAIL("graph replay");
        for (int64_t i = 0; i < steps && !graph; i++) {
            if (train_step(&t)) FAIL("step");
            if (r == repeats - 1 && i == steps - 1 && na_copy_(last_loss, t.loss))
                FAIL("keeping the loss");
            na_step_end();
        }
        syncs += na_cuda_sync_count() - c0;
        bench_sync(dev);
        per_step[r] = ((cpu_clock ? bench_cpu_s() : bench_now_s()) - t0) / (double)steps * 1e3;
    }
    double loss = na_item(last_loss);
    /* the profiled steps' minimum wall and BatchNorm layers' time (rows "... (BatchNorm2d)") */
    double prof_wall = INFINITY, prof_bn = INFINITY;
    for (int64_t k = 0; k < profile_steps; k++) {
        na_profile_begin();
        int bad = train_step(&t);
        na_step_end();
        na_profile_end();
        if (bad) FAIL("profiled step");
        const na_profile_row *rows;
        double bn_ms = 0;
        for (int i = 0, n = na_profile_layers(&rows); i < n; i++)
            if (strstr(rows[i].name, "(BatchNorm")) bn_ms += rows[i].ms;
        prof_wall = fmin(prof_wall, na_profile_wall_ms());
        prof_bn = fmin(prof_bn, bn_ms);
        if (k == profile_steps - 1) na_profile_print(stderr);
        na_profile_reset();
    }

    bench_stats st = bench_stats_of(per_step, (int)repeats);
    int world = na_dist_world_size(dist);
    if (na_dist_rank(dist) != 0) goto done; /* rank 0 reports for all */
    bench_json j;
    bench_json_begin(&j, stdout);
    bench_json_str(&j, "bench", "train");
    bench_json_str(&j, "key", key);
    bench_json_str(&j, "impl", "nanoamp");
    bench_json_str(&j, "model", model);
    bench_json_str(&j, "device", na_device_name(dev));
    bench_json_str(&j, "amp", amp);
    bench_json_bool(&j, "cuda_graph", cuda_graph);
    bench_json_bool(&j, "channels_last", channels_last);
    bench_json_int(&j, "batch", batch);
    bench_json_int(&j, "warmup", warmup);
    bench_json_int(&j, "repeats", repeats);
    bench_json_int(&j, "steps", steps);
    bench_json_int(&j, "threads", na_get_num_threads());
    bench_json_int(&j, "params", na_module_num_params(t.net));
    bench_json_stats(&j, "step_ms", &st);
    bench_json_num(&j, "images_per_s", (double)(batch * world) / (st.median * 1e-3));
    if (ddp) {
        bench_json_int(&j, "world_size", world);
        bench_json_str(&j, "allreduce_dtype", allreduce);
        bench_json_int(&j, "comm_bytes_per_step", na_ddp_bytes_last_step(t.amp.ddp));
    }
    bench_json_num(&j, "loss", loss);
    if (profile_steps) {
        bench_json_int(&j, "profile_steps", profile_steps);
        bench_json_num(&j, "profile_step_ms_min", prof_wall);
        bench_json_num(&j, "profile_batchnorm_ms_min", prof_bn);
    }
    bench_json_num(&j, "peak_rss_mib", bench_peak_rss_mib());
    bench_json_num(&j, "base_rss_mib", base_rss);
    bench_json_num(&j, "arena_peak_mib", (double)na_arena_peak(dev) / (1024.0 * 1024.0));
    if (dev == NA_DEVICE_CPU) /* the kernels' per-thread scratch, outside the arena */
        bench_json_num(&j, "scratch_peak_mib", (double)na_cpu_scratch_peak() / (1024.0 * 1024.0));
    if (dev == NA_DEVICE_CUDA) {
        bench_json_num(&j, "cuda_peak_mib", (double)na_cuda_peak_bytes() / (1024.0 * 1024.0));
        bench_json_num(&j, "syncs_per_step", (double)syncs / (double)(repeats * steps));
        bench_json_bool(&j, "tf32", na_cuda_tf32());
    }
    bench_json_end(&j);
done:;
#undef FAIL
    int rc = failed ? bench_fail(key, failed) : 0;
    na_step_graph_free(graph);
    na_tensor_free(last_loss);
    free(per_step);
    teardown(&t);
    na_dist_free(dist);
    return rc;
}
