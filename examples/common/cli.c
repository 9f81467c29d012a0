/* The trainers' command line: one table of options, from which --help is printed with the
 * defaults the trainer actually starts from (see trainer.h). */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_internal.h"

#ifndef NANOAMP_VERSION
#define NANOAMP_VERSION "unknown"
#endif

bool trainer_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s || !(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1]))))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < min || v > max) return false;
    *out = v;
    return true;
}

bool trainer_parse_u64(const char *s, uint64_t *out) {
    if (!s || !isdigit((unsigned char)s[0])) return false; /* strtoull takes "-1" */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool trainer_parse_f64(const char *s, double *out) {
    if (!s || !*s || isspace((unsigned char)s[0])) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* Whether s is one of the words of list ("a|b|c"). */
static bool one_of(const char *s, const char *list) {
    size_t n = strlen(s);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, s, n) == 0) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

enum opt_id {
    O_DATA, O_MODEL, O_EPOCHS, O_BATCH, O_LR, O_OPTIM, O_WEIGHT_DECAY, O_LABEL_SMOOTHING,
    O_SCHEDULE, O_DEVICE, O_AMP, O_LOSS_SCALE, O_GROWTH_INTERVAL, O_AMP_TRACE, O_LOG, O_REPORT,
    O_SEED,
    O_SAVE, O_RESUME, O_LIMIT, O_TEST_LIMIT, O_SYNTHETIC, O_THREADS, O_JSON, O_QUIET, O_VERSION,
    O_HELP, O_ALLREDUCE_DTYPE, O_BUCKET_MB, O_SYNC_BN, O_CUDA_GRAPH, O_CHANNELS_LAST,
    O_NO_BROADCAST_BUFFERS, O_DIST_TIMEOUT, O_FP8_RECIPE, O_FP8_FORMAT, O_FP8_HISTORY,
    O_FP8_MARGIN
};

static const struct {
    enum opt_id id;
    const char *name, *arg, *help; /* arg NULL: a flag without a value */
} options[] = {
    {O_DATA, "--data", "DIR", "data directory"},
    {O_MODEL, "--model", NULL /* the models */, "model"},
    {O_EPOCHS, "--epochs", "N", "epochs"},
    {O_BATCH, "--batch", "N", "batch size per rank (under mpirun -np R the global batch is R x N)"},
    {O_LR, "--lr", "X", "learning rate (peak of the one-cycle schedule)"},
    {O_OPTIM, "--optim", "sgd|adamw", "optimizer (SGD: Nesterov momentum 0.9)"},
    {O_WEIGHT_DECAY, "--weight-decay", "X", "weight decay (AdamW: decoupled)"},
    {O_LABEL_SMOOTHING, "--label-smoothing", "X", "cross-entropy label smoothing in [0, 1]"},
    {O_SCHEDULE, "--schedule", "constant|onecycle", "learning-rate schedule"},
    {O_DEVICE, "--device", "cpu|cuda", "where to train"},
    {O_AMP, "--amp", "off|fp16|bf16|o2|fp8|auto",
     "mixed precision: fp16 = autocast + GradScaler, bf16 = autocast, o2 = Apex O2 (f16 "
     "model, f32 master weights), fp8 = Linear and Conv2d in FP8 with per-tensor scales, the "
     "rest bf16 autocast (Transformer Engine), auto = the device's best (fp8 only on CUDA "
     "sm_89+ for a model of at least 1e8 parameters)"},
    {O_FP8_RECIPE, "--fp8-recipe", "delayed|current",
     "fp8: scales from an amax history of earlier steps (delayed) or from each tensor's own "
     "amax (current)"},
    {O_FP8_FORMAT, "--fp8-format", "hybrid|e4m3",
     "fp8: hybrid = E4M3 forward, E5M2 gradients; e4m3 = E4M3 for both"},
    {O_FP8_HISTORY, "--fp8-history", "N", "fp8 delayed: steps of amax history (>= 1)"},
    {O_FP8_MARGIN, "--fp8-margin", "N", "fp8 delayed: scales divided by 2^N (0..64)"},
    {O_LOSS_SCALE, "--loss-scale", "dynamic|N",
     "fp16/o2 only. N with fp16: a GradScaler held at N (steps with inf/NaN gradients are "
     "skipped); with o2: Apex's static LossScaler (never skips)"},
    {O_GROWTH_INTERVAL, "--growth-interval", "N",
     "fp16/o2 dynamic scaling: clean steps before the scale doubles"},
    {O_AMP_TRACE, "--amp-trace", NULL, "print the dtype every op ran in, then each backward op's gradient: its shares that are "
     "zero, subnormal, inf/NaN (first step)"},
    {O_LOG, "--log", "FILE.csv", "per-step loss, scale, skipped"},
    {O_REPORT, "--report", "FILE.html",
     "one self-contained HTML page of the run, rewritten after every epoch: loss, loss scale, "
     "gradients and activations on the dtype's number line, the first step's autocast trace"},
    {O_SEED, "--seed", "N", "seed for init, shuffling, augmentation"},
    {O_SAVE, "--save", "FILE", "checkpoint after every epoch (safetensors)"},
    {O_RESUME, "--resume", "FILE", "continue from a checkpoint"},
    {O_LIMIT, "--limit", "N", "train on the first N images only"},
    {O_TEST_LIMIT, "--test-limit", "N", "evaluate on the first N test images only"},
    {O_SYNTHETIC, "--synthetic", "N", "train on N generated images of the data set's shape"},
    {O_ALLREDUCE_DTYPE, "--allreduce-dtype", "DTYPE",
     "data parallel: f32, f16 or bf16, the dtype gradients are summed in across ranks (f16/bf16 "
     "halve the bytes)"},
    {O_BUCKET_MB, "--bucket-mb", "N", "data parallel: MiB of gradients per all-reduce bucket"},
    {O_SYNC_BN, "--sync-bn", NULL, "data parallel: BatchNorm statistics over all ranks' batches"},
    {O_NO_BROADCAST_BUFFERS, "--no-broadcast-buffers", NULL,
     "data parallel: each rank keeps its own BatchNorm running statistics (by default rank "
     "0's are every rank's after each step)"},
    {O_DIST_TIMEOUT, "--dist-timeout", "SECONDS",
     "data parallel: how long a collective waits for the other ranks before failing, naming "
     "the ranks that did not answer"},
    {O_CUDA_GRAPH, "--cuda-graph", NULL,
     "CUDA only: after 2 warm-up steps, each full batch's step is one replayed CUDA graph (no "
     "host work per step); where a graph cannot serve, says why and trains eagerly"},
    {O_CHANNELS_LAST, "--channels-last", NULL,
     "train on channels-last (NHWC) images: the convolutions' activations stay in cuDNN's "
     "tensor-core layout; on CUDA an f16/bf16 RGB first layer is padded to 8 channels"},
    {O_THREADS, "--threads", "N", "CPU threads (the CPU backend's pool; OpenBLAS uses one)"},
    {O_JSON, "--json", NULL, "last line of output: one JSON object with the results"},
    {O_QUIET, "--quiet", NULL, "no progress output"},
    {O_VERSION, "--version", NULL, "print the program and library version"},
    {O_HELP, "--help", NULL, "this help"},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

/* The default of option id as o holds it before parsing; "" for none worth showing. */
static const char *default_of(enum opt_id id, const trainer_opts *o, char *buf, size_t size) {
    switch (id) {
    case O_DATA: return o->data_hint ? o->data_hint : "";
    case O_MODEL: return o->model;
    case O_EPOCHS: snprintf(buf, size, "%" PRId64, o->epochs); return buf;
    case O_BATCH: snprintf(buf, size, "%" PRId64, o->batch); return buf;
    case O_SEED: snprintf(buf, size, "%" PRIu64, o->seed); return buf;
    case O_LR:
        if (o->lr < 0) return "0.05 with sgd, 0.001 with adamw";
        snprintf(buf, size, "%g", o->lr);
        return buf;
    case O_WEIGHT_DECAY:
        if (o->weight_decay < 0) return "0 with sgd, 0.01 with adamw";
        snprintf(buf, size, "%g", o->weight_decay);
        return buf;
    case O_LABEL_SMOOTHING: snprintf(buf, size, "%g", o->label_smoothing); return buf;
    case O_OPTIM: return o->optim;
    case O_SCHEDULE: return o->schedule;
    case O_DEVICE: return na_device_name(o->device);
    case O_AMP: return o->amp;
    case O_FP8_RECIPE: return "delayed";
    case O_FP8_FORMAT: return "hybrid";
    case O_FP8_HISTORY: return "1024";
    case O_FP8_MARGIN: return "0";
    case O_LOSS_SCALE: return "dynamic";
    case O_GROWTH_INTERVAL: return "2000";
    case O_LIMIT: case O_TEST_LIMIT: return "all";
    case O_SYNTHETIC: return "off";
    case O_ALLREDUCE_DTYPE: return o->allreduce_dtype;
    case O_BUCKET_MB: return "25";
    case O_DIST_TIMEOUT: return "$NANOAMP_DIST_TIMEOUT_S, else 1800 s, NCCL 600 s";
    case O_THREADS: return "$NANOAMP_THREADS, else the core count";
    default: return "";
    }
}

static void usage(const trainer_opts *o, const char *models) {
    printf("usage: %s [options]\n", o->program);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (options[i].id == O_SYNTHETIC && !o->has_synthetic) continue;
        char head[64], buf[64];
        const char *arg = options[i].id == O_MODEL ? models : options[i].arg;
        snprintf(head, sizeof head, "%s%s%s", options[i].name, arg ? " " : "", arg ? arg : "");
        const char *def = default_of(options[i].id, o, buf, sizeof buf);
        printf("  %-28s %s%s%s%s\n", head, options[i].help, *def ? " (default: " : "", def,
               *def ? ")" : "");
    }
}

static int bad_value(const trainer_opts *o, const char *flag, const char *expected,
                     const char *got) {
    trainer_start_failed(o, "%s: expected %s, got '%s'", flag, expected, got);
    return -1;
}

/* Sets the option id from its value v. */
static int set_option(trainer_opts *o, enum opt_id id, const char *flag, const char *v,
                      const char *models) {
    int64_t n;
    double x;
    o->given |= UINT64_C(1) << id;
    switch (id) {
    case O_DATA: o->data_dir = v; return 0;
    case O_LOG: o->log_path = v; return 0;
    case O_REPORT: o->report_path = v; return 0;
    case O_SAVE: o->save_path = v; return 0;
    case O_RESUME: o->resume_path = v; return 0;
    case O_EPOCHS: case O_BATCH: case O_LIMIT: case O_TEST_LIMIT: case O_SYNTHETIC:
        if (!trainer_parse_i64(v, 1, INT64_MAX, &n)) return bad_value(o, flag, "an integer >= 1", v);
        *(id == O_EPOCHS ? &o->epochs : id == O_BATCH ? &o->batch : id == O_LIMIT ? &o->limit
          : id == O_TEST_LIMIT ? &o->test_limit : &o->synthetic) = n;
        return 0;
    case O_FP8_HISTORY:
        if (!trainer_parse_i64(v, 1, 1 << 24, &n))
            return bad_value(o, flag, "an integer in [1, 2^24] (steps of amax history)", v);
        o->fp8_history = n;
        return 0;
    case O_FP8_MARGIN:
        if (!trainer_parse_i64(v, 0, 64, &n))
            return bad_value(o, flag, "an integer in [0, 64] (scales are divided by 2^N)", v);
        o->fp8_margin = n;
        return 0;
    case O_BUCKET_MB:
        if (!trainer_parse_i64(v, 1, 1 << 20, &n))
            return bad_value(o, flag, "an integer in [1, 2^20]", v);
        o->bucket_mb = n;
        return 0;
    case O_GROWTH_INTERVAL:
        if (!trainer_parse_i64(v, 1, INT32_MAX, &n))
            return bad_value(o, flag, "an integer in [1, 2^31)", v);
        o->growth_interval = n;
        return 0;
    case O_THREADS:
        if (!trainer_parse_i64(v, 1, NA_MAX_THREADS, &n)) {
            char range[48];
            snprintf(range, sizeof range, "an integer in [1, %d]", NA_MAX_THREADS);
            return bad_value(o, flag, range, v);
        }
        o->threads = (int)n;
        return 0;
    case O_SEED:
        if (!trainer_parse_u64(v, &o->seed)) return bad_value(o, flag, "an integer >= 0", v);
        return 0;
    case O_LR: case O_WEIGHT_DECAY:
        if (!trainer_parse_f64(v, &x) || x < 0) return bad_value(o, flag, "a number >= 0", v);
        *(id == O_LR ? &o->lr : &o->weight_decay) = x;
        return 0;
    case O_DIST_TIMEOUT:
        if (!trainer_parse_f64(v, &x) || !(x > 0) || x > 1e9)
            return bad_value(o, flag, "seconds in (0, 1e9]", v);
        o->dist_timeout = x;
        return 0;
    case O_LABEL_SMOOTHING:
        if (!trainer_parse_f64(v, &x) || x < 0 || x > 1)
            return bad_value(o, flag, "a number in [0, 1]", v);
        o->label_smoothing = x;
        return 0;
    case O_ALLREDUCE_DTYPE:
        if (!strcmp(v, "f8e4m3") || !strcmp(v, "f8e5m2")) /* a dtype, but not one to sum in */
            return bad_value(o, flag, "f32, f16 or bf16 (an FP8 dtype such as f8e4m3 or f8e5m2 "
                             "stores values, gradients are not summed in it)", v);
        break;
    case O_LOSS_SCALE:
        if (strcmp(v, "dynamic") && (!trainer_parse_f64(v, &x) || !(x > 0) || x > FLT_MAX))
            return bad_value(o, flag, "'dynamic' or a number in (0, 3.4e38]", v);
        o->loss_scale = v;
        return 0;
    default: break;
    }
    /* the options that take one word of a list */
    const char *list = id == O_MODEL ? models : id == O_OPTIM ? "sgd|adamw"
                     : id == O_SCHEDULE ? "constant|onecycle" : id == O_DEVICE ? "cpu|cuda"
                     : id == O_ALLREDUCE_DTYPE ? "f32|f16|bf16" : id == O_FP8_RECIPE ? "delayed|current"
                     : id == O_FP8_FORMAT ? "hybrid|e4m3" : "off|fp16|bf16|o2|fp8|auto";
    if (!one_of(v, list)) return bad_value(o, flag, list, v);
    if (id == O_MODEL) o->model = v;
    else if (id == O_OPTIM) o->optim = v;
    else if (id == O_SCHEDULE) o->schedule = v;
    else if (id == O_DEVICE) o->device = strcmp(v, "cuda") ? NA_DEVICE_CPU : NA_DEVICE_CUDA;
    else if (id == O_ALLREDUCE_DTYPE) o->allreduce_dtype = v;
    else if (id == O_FP8_RECIPE) o->fp8_recipe = v;
    else if (id == O_FP8_FORMAT) o->fp8_format = v;
    else o->amp = v;
    return 0;
}

trainer_opts trainer_defaults(const char *model) {
    return (trainer_opts){.program = "", .model = model, .epochs = 2, .batch = 128, .lr = -1,
                          .momentum = 0.9, .weight_decay = -1, .optim = "sgd",
                          .device = NA_DEVICE_CPU, .amp = "off", .seed = 1,
                          .schedule = "constant", .allreduce_dtype = "f32",
                          .fp8_recipe = "delayed", .fp8_format = "hybrid"};
}

int trainer_parse_args(trainer_opts *o, int argc, char **argv, const char *models) {
    const char *p = strrchr(argv[0], '/');
    o->program = p ? p + 1 : argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        size_t k = 0;
        while (k < N_OPTIONS && !(strlen(options[k].name) == name_len &&
                                  !strncmp(options[k].name, a, name_len) &&
                                  (options[k].id != O_SYNTHETIC || o->has_synthetic)))
            k++;
        if (k == N_OPTIONS && strcmp(a, "-h")) {
            trainer_start_failed(o, "unknown option %.*s (see --help)", (int)name_len, a);
            return -1;
        }
        enum opt_id id = k == N_OPTIONS ? O_HELP : options[k].id;
        bool takes = k < N_OPTIONS && (options[k].arg || id == O_MODEL);
        if (!takes && eq) {
            trainer_start_failed(o, "%.*s takes no value", (int)name_len, a);
            return -1;
        }
        if (id == O_HELP) {
            usage(o, models);
            return 1;
        } else if (id == O_VERSION) {
            printf("%s (nanoamp %s)\n", o->program, NANOAMP_VERSION);
            return 1;
        } else if (!takes) {
            *(id == O_JSON ? &o->json : id == O_QUIET ? &o->quiet : id == O_SYNC_BN ? &o->sync_bn
              : id == O_CUDA_GRAPH ? &o->cuda_graph : id == O_CHANNELS_LAST ? &o->channels_last
              : id == O_NO_BROADCAST_BUFFERS ? &o->no_broadcast_buffers : &o->amp_trace) = true;
            continue;
        }
        /* "--data --epochs 1": the next flag is no value (--data=--x is one, if need be) */
        const char *v = eq ? eq + 1 : i + 1 < argc && strncmp(argv[i + 1], "--", 2) ? argv[++i]
                      : NULL;
        if (!v || !*v) {
            trainer_start_failed(o, "%.*s needs a value%s%s (see --help)", (int)name_len, a,
                                 !eq && i + 1 < argc ? ", not the flag " : "",
                                 !eq && i + 1 < argc ? argv[i + 1] : "");
            return -1;
        }
        char flag[32];
        snprintf(flag, sizeof flag, "%.*s", (int)name_len, a);
        if (set_option(o, id, flag, v, models)) return -1;
    }
    if (o->cuda_graph && o->device != NA_DEVICE_CUDA) {
        trainer_start_failed(o, "%s", TRAINER_CUDA_GRAPH_NEEDS_CUDA);
        return -1;
    }
    if (o->synthetic && o->data_dir) {
        trainer_start_failed(o, "--synthetic trains on generated images: it reads no --data");
        return -1;
    }
    /* with --resume and no --amp the checkpoint's mode decides (checked once it is read) */
    bool amp_known = strcmp(o->amp, "auto") && (!o->resume_path || trainer_flag_given(o, "--amp"));
    if (amp_known && trainer_amp_check_scaling(o, o->amp)) {
        trainer_start_failed(o, "%s", na_last_error());
        return -1;
    }
    return 0;
}

bool trainer_flag_given(const trainer_opts *o, const char *flag) {
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!strcmp(options[i].name, flag)) return o->given >> options[i].id & 1;
    return false;
}
