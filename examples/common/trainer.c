/* The training loop shared by the example trainers (see trainer.h). */
#include "trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- command line ------------------------------------------------------------------------ */

static void usage(const char *prog, const char *models) {
    printf("usage: %s [options]\n"
           "  --data DIR            data directory\n"
           "  --model %-13s model (default shown first)\n"
           "  --epochs N            epochs (default 2)\n"
           "  --batch N             batch size (default 128)\n"
           "  --lr X                learning rate\n"
           "  --optim sgd|adamw     optimizer\n"
           "  --weight-decay X      weight decay\n"
           "  --label-smoothing X   cross-entropy label smoothing in [0, 1]\n"
           "  --schedule constant|onecycle  learning-rate schedule\n"
           "  --device cpu|cuda     where to train (default cpu)\n"
           "  --amp off|fp16|bf16|o2|auto   mixed precision (default off)\n"
           "  --loss-scale dynamic|N        loss scaling with --amp fp16/o2\n"
           "  --amp-trace           print the dtype every op ran in (first step)\n"
           "  --log FILE.csv        per-step loss, scale, skipped\n"
           "  --seed N              seed for init, shuffling, augmentation (default 1)\n"
           "  --save FILE           checkpoint after every epoch (safetensors)\n"
           "  --resume FILE         continue from a checkpoint\n"
           "  --limit N             use only the first N training images\n"
           "  --test-limit N        evaluate on the first N test images only\n"
           "  --json                last line of output: one JSON object with the results\n"
           "  --quiet               no progress output\n",
           prog, models);
}

static int parse_i64(const char *flag, const char *s, int64_t *out, int64_t min) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < min) {
        fprintf(stderr, "%s: expected an integer >= %" PRId64 ", got '%s'\n", flag, min, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_f64(const char *flag, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) {
        fprintf(stderr, "%s: expected a number, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

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

trainer_opts trainer_defaults(const char *model) {
    return (trainer_opts){.program = "", .model = model, .epochs = 2, .batch = 128, .lr = -1,
                          .momentum = 0.9, .optim = "sgd", .device = NA_DEVICE_CPU, .amp = "off",
                          .loss_scale = "dynamic", .seed = 1, .schedule = "constant"};
}

int trainer_parse_args(trainer_opts *o, int argc, char **argv, const char *models) {
    const char *p = strrchr(argv[0], '/');
    o->program = p ? p + 1 : argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        int64_t n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(o->program, models);
            return 1;
        } else if (!strcmp(a, "--json")) {
            o->json = true, takes = false;
        } else if (!strcmp(a, "--quiet")) {
            o->quiet = true, takes = false;
        } else if (!strcmp(a, "--amp-trace")) {
            o->amp_trace = true, takes = false;
        } else if (!v) {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", o->program, a);
            return -1;
        } else if (!strcmp(a, "--data")) {
            o->data_dir = v;
        } else if (!strcmp(a, "--model")) {
            if (!one_of(v, models)) {
                fprintf(stderr, "--model: expected %s, got '%s'\n", models, v);
                return -1;
            }
            o->model = v;
        } else if (!strcmp(a, "--epochs")) {
            if (parse_i64(a, v, &o->epochs, 1)) return -1;
        } else if (!strcmp(a, "--batch")) {
            if (parse_i64(a, v, &o->batch, 1)) return -1;
        } else if (!strcmp(a, "--limit")) {
            if (parse_i64(a, v, &o->limit, 1)) return -1;
        } else if (!strcmp(a, "--test-limit")) {
            if (parse_i64(a, v, &o->test_limit, 1)) return -1;
        } else if (!strcmp(a, "--synthetic")) {
            if (parse_i64(a, v, &o->synthetic, 1)) return -1;
        } else if (!strcmp(a, "--seed")) {
            if (parse_i64(a, v, &n, 0)) return -1;
            o->seed = (uint64_t)n;
        } else if (!strcmp(a, "--lr")) {
            if (parse_f64(a, v, &o->lr) || o->lr < 0) {
                fprintf(stderr, "--lr: expected a number >= 0\n");
                return -1;
            }
        } else if (!strcmp(a, "--weight-decay") || !strcmp(a, "--label-smoothing")) {
            double x;
            if (parse_f64(a, v, &x) || x < 0 || (a[2] == 'l' && x > 1)) {
                fprintf(stderr, "%s: expected a number >= 0 (<= 1 for label smoothing), got '%s'\n", a, v);
                return -1;
            }
            if (a[2] == 'w') o->weight_decay = x;
            else o->label_smoothing = x;
        } else if (!strcmp(a, "--optim")) {
            if (!one_of(v, "sgd|adamw")) {
                fprintf(stderr, "--optim: expected sgd or adamw, got '%s'\n", v);
                return -1;
            }
            o->optim = v;
        } else if (!strcmp(a, "--device")) {
            if (!one_of(v, "cpu|cuda")) {
                fprintf(stderr, "--device: expected cpu or cuda, got '%s'\n", v);
                return -1;
            }
            o->device = strcmp(v, "cuda") ? NA_DEVICE_CPU : NA_DEVICE_CUDA;
        } else if (!strcmp(a, "--amp")) {
            if (!one_of(v, "off|fp16|bf16|o2|auto")) {
                fprintf(stderr, "--amp: expected off, fp16, bf16, o2 or auto, got '%s'\n", v);
                return -1;
            }
            o->amp = v;
        } else if (!strcmp(a, "--loss-scale")) {
            double s;
            if (strcmp(v, "dynamic") && (parse_f64(a, v, &s) || !(s > 0))) {
                fprintf(stderr, "--loss-scale: expected 'dynamic' or a number > 0, got '%s'\n", v);
                return -1;
            }
            o->loss_scale = v;
        } else if (!strcmp(a, "--log")) {
            o->log_path = v;
        } else if (!strcmp(a, "--save")) {
            o->save_path = v;
        } else if (!strcmp(a, "--resume")) {
            o->resume_path = v;
        } else if (!strcmp(a, "--schedule")) {
            if (!one_of(v, "constant|onecycle")) {
                fprintf(stderr, "--schedule: expected constant or onecycle, got '%s'\n", v);
                return -1;
            }
            o->schedule = v;
        } else {
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", o->program, a);
            return -1;
        }
        if (takes) i++;
    }
    if (o->lr < 0) o->lr = strcmp(o->optim, "adamw") ? 0.05 : 1e-3;
    return 0;
}

/* ---- BLAS kernels ------------------------------------------------------------------------ */

void trainer_tune_blas(char **argv) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (getenv("OPENBLAS_CORETYPE") || getenv("NANOAMP_NO_BLAS_TUNE")) return;
    __builtin_cpu_init();
    const char *core = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        core = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        core = "Haswell";
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("NANOAMP_NO_BLAS_TUNE", "1", 1); /* once */
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the default kernels */
#else
    (void)argv;
#endif
}

/* ---- data helpers ------------------------------------------------------------------------- */

void trainer_channel_stats(const na_dataset *ds, float *mean, float *std) {
    int64_t plane = (int64_t)ds->height * ds->width;
    for (int c = 0; c < ds->channels; c++) {
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < ds->n; i++) {
            const uint8_t *p = ds->images + (i * ds->channels + c) * plane;
            for (int64_t j = 0; j < plane; j++) {
                double v = p[j] / 255.0;
                s += v, s2 += v * v;
            }
        }
        double n = (double)ds->n * (double)plane;
        mean[c] = (float)(s / n);
        std[c] = (float)sqrt(fmax(s2 / n - (s / n) * (s / n), 1e-12));
    }
}

/* ---- progress ------------------------------------------------------------------------------ */

typedef struct {
    bool tty, quiet;
    double start, last_print;
    int64_t total;
} progress;

static void progress_show(progress *p, int64_t epoch, int64_t epochs, int64_t step, int64_t steps,
                          double loss, double ips, bool force) {
    if (p->quiet) return;
    double t = now_s();
    double every = p->tty ? 0.1 : 10.0;
    if (!force && t - p->last_print < every) return;
    p->last_print = t;
    double frac = steps ? (double)step / (double)steps : 1.0;
    double eta = ips > 0 ? (double)(steps - step) * (p->total / (double)(steps ? steps : 1)) / ips : 0;
    if (p->tty) {
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\repoch %" PRId64 "/%" PRId64 " [%s] %5.1f%% loss %.4f  %.0f img/s  ETA %.0fs ",
                epoch + 1, epochs, bar, 100 * frac, loss, ips, eta);
        if (force) fputc('\n', stderr);
    } else {
        fprintf(stderr, "epoch %" PRId64 "/%" PRId64 " step %" PRId64 "/%" PRId64 " loss %.4f %.0f img/s\n",
                epoch + 1, epochs, step, steps, loss, ips);
    }
    fflush(stderr);
}

/* ---- evaluation ---------------------------------------------------------------------------- */

static double evaluate(na_module *net, const na_dataset *ds, const float *mean, const float *std,
                       na_device dev, na_dtype input_dtype) {
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 1000, .mean = mean, .std = std});
    if (!b) return NAN;
    float *x = malloc(na_batcher_batch_bytes(b));
    int32_t *y = malloc(sizeof(int32_t) * 1000);
    int32_t *pred = malloc(sizeof(int32_t) * 1000);
    int64_t n, correct = 0, seen = 0;
    na_module_eval(net);
    na_no_grad_begin();
    na_batcher_start_epoch(b, 0);
    while (x && y && pred && na_batcher_next(b, x, y, &n)) {
        int64_t shape[4] = {n, ds->channels, ds->height, ds->width};
        na_tensor *xt = na_from_host(NA_DTYPE_F32, dev, 4, shape, x);
        if (xt) xt = na_cast(xt, input_dtype);
        na_tensor *logits = xt ? na_module_forward(net, xt) : NULL;
        na_tensor *am = logits ? na_argmax(logits, 1, false) : NULL;
        if (!am || na_copy_to_host(am, pred) != NA_OK) {
            fprintf(stderr, "evaluation failed: %s\n", na_last_error());
            seen = 0;
            break;
        }
        for (int64_t i = 0; i < n; i++) correct += pred[i] == y[i];
        seen += n;
        na_step_end();
    }
    na_no_grad_end();
    na_module_train(net, true);
    free(x), free(y), free(pred);
    na_batcher_free(b);
    return seen ? (double)correct / (double)seen : NAN;
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

/* ---- mixed precision (--amp, --loss-scale, --amp-trace, --log) ------------------------------ */


/* The optimizer-side state of a checkpoint: "optim." (or, for o2, "fp16." with the masters)
 * and "scaler." for an enabled GradScaler. */
static int amp_state(const trainer_amp *a, na_named_tensors *out) {
    na_named_tensors l = {0};
    *out = (na_named_tensors){0};
    int rc = a->fo ? na_fp16_optimizer_state(a->fo, &l) : na_optim_state(a->opt, &l);
    int64_t n = l.n;
    na_named_tensors sc = {0};
    if (!rc && a->gs && na_grad_scaler_is_enabled(a->gs)) rc = na_grad_scaler_state(a->gs, &sc);
    if (!rc && !(out->items = calloc((size_t)(n + sc.n + 1), sizeof *out->items)))
        rc = na_set_error(NA_ENOMEM, "checkpoint: out of host memory");
    for (int64_t i = 0; !rc && i < n + sc.n; i++) {
        const na_named_tensor *it = i < n ? &l.items[i] : &sc.items[i - n];
        const char *prefix = i >= n ? "scaler." : a->fo ? "fp16." : "optim.";
        size_t len = strlen(prefix) + strlen(it->name) + 1;
        char *name = malloc(len);
        if (!name) rc = na_set_error(NA_ENOMEM, "checkpoint: out of host memory");
        else snprintf(name, len, "%s%s", prefix, it->name);
        out->items[out->n++] = (na_named_tensor){.name = name, .tensor = it->tensor};
    }
    na_named_tensors_free(&l);
    na_named_tensors_free(&sc);
    if (rc) na_named_tensors_free(out);
    return rc;
}

static int save_checkpoint(const char *path, na_module *net, const trainer_amp *amp, int64_t epoch,
                           uint64_t seed) {
    na_checkpoint *ck = na_checkpoint_new();
    na_named_tensors model = {0}, state = {0};
    int rc = ck ? NA_OK : na_last_status();
    if (!rc) rc = na_module_named_tensors(net, NA_MODULE_STATE, &model);
    for (int64_t i = 0; !rc && i < model.n; i++)
        rc = na_checkpoint_add(ck, model.items[i].name, model.items[i].tensor);
    if (!rc) rc = amp_state(amp, &state);
    for (int64_t i = 0; !rc && i < state.n; i++)
        rc = na_checkpoint_add(ck, state.items[i].name, state.items[i].tensor);
    char buf[64];
    snprintf(buf, sizeof buf, "%" PRId64, epoch);
    if (!rc) rc = na_checkpoint_set_meta(ck, "epochs_done", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, seed);
    if (!rc) rc = na_checkpoint_set_meta(ck, "seed", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, na_rng_offset());
    if (!rc) rc = na_checkpoint_set_meta(ck, "rng_offset", buf);
    if (!rc) rc = na_checkpoint_save(ck, path);
    na_named_tensors_free(&model);
    na_named_tensors_free(&state);
    na_checkpoint_free(ck);
    return rc;
}

static int load_checkpoint(const char *path, na_module *net, const trainer_amp *amp,
                           int64_t *epochs_done) {
    na_checkpoint *ck = na_checkpoint_load(path);
    if (!ck) return na_last_status();
    na_named_tensors model = {0}, state = {0};
    int rc = na_module_named_tensors(net, NA_MODULE_STATE, &model);
    for (int64_t i = 0; !rc && i < model.n; i++)
        rc = na_checkpoint_copy_into(ck, model.items[i].name, model.items[i].tensor);
    if (!rc) rc = amp_state(amp, &state);
    for (int64_t i = 0; !rc && i < state.n; i++)
        rc = na_checkpoint_copy_into(ck, state.items[i].name, state.items[i].tensor);
    const char *e = na_checkpoint_get_meta(ck, "epochs_done");
    const char *s = na_checkpoint_get_meta(ck, "seed");
    const char *off = na_checkpoint_get_meta(ck, "rng_offset");
    if (!rc && (!e || !s || !off))
        rc = na_set_error(NA_EFORMAT, "%s: not a trainer checkpoint (metadata epochs_done/seed/"
                          "rng_offset missing)", path);
    if (!rc) {
        *epochs_done = strtoll(e, NULL, 10);
        na_rng_set_state(strtoull(s, NULL, 10), strtoull(off, NULL, 10));
    }
    na_named_tensors_free(&model);
    na_named_tensors_free(&state);
    na_checkpoint_free(ck);
    return rc;
}

/* ---- the loop ------------------------------------------------------------------------------ */

static na_optim *make_optimizer(const trainer_opts *o, na_module *net) {
    if (!strcmp(o->optim, "adamw")) {
        na_adam_cfg c = NA_ADAMW_DEFAULTS;
        c.lr = o->lr;
        if (o->weight_decay > 0) c.weight_decay = o->weight_decay;
        return na_adamw_new(net, &c);
    }
    na_sgd_cfg c = NA_SGD_DEFAULTS;
    c.lr = o->lr, c.momentum = o->momentum, c.weight_decay = o->weight_decay;
    c.nesterov = o->momentum > 0;
    return na_sgd_new(net, &c);
}

/* Resolves --amp (auto: na_amp_recommend) and makes the optimizer, the scaler or the fp16
 * optimizer and the monitor. The model is converted in place for o2 (its tensors keep their
 * names, so checkpoints of every mode name tensors alike). */
int trainer_amp_setup(const trainer_opts *o, na_module *net, trainer_amp *a) {
    *a = (trainer_amp){.mode = o->amp, .dtype = NA_DTYPE_F32};
    if (!strcmp(a->mode, "auto")) {
        na_amp_recommendation r = na_amp_recommend(o->device);
        a->mode = r.mode == NA_AMP_MODE_BF16 ? "bf16" : r.mode == NA_AMP_MODE_F16 ? "fp16" : "off";
        if (!o->quiet) fprintf(stderr, "--amp auto: %s (%s)\n", a->mode, r.reason);
    }
    bool fp16 = !strcmp(a->mode, "fp16"), bf16 = !strcmp(a->mode, "bf16");
    bool o2 = !strcmp(a->mode, "o2"), dynamic = !strcmp(o->loss_scale, "dynamic");
    double static_scale = dynamic ? 1.0 : strtod(o->loss_scale, NULL);
    if (fp16 || bf16) {
        a->autocast = true;
        a->dtype = fp16 ? NA_DTYPE_F16 : NA_DTYPE_BF16;
        if (na_autocast_check_device(o->device, a->dtype)) return na_last_status();
    }
    if (o2) {
        a->dtype = NA_DTYPE_F16;
        if (na_model_convert(net, NA_DTYPE_F16)) return na_last_status();
        na_fp16_optimizer_cfg fc = {.scaler = NA_APEX_SCALER_DEFAULTS};
        if (!dynamic) fc.scaler = (na_grad_scaler_cfg)NA_STATIC_SCALER(static_scale);
        fc.scaler.device = o->device;
        if (!(a->fo = na_fp16_optimizer_new(make_optimizer(o, NULL), net, &fc)))
            return na_last_status();
        a->opt = na_fp16_optimizer_optim(a->fo);
    } else {
        /* a GradScaler for fp16; disabled (a plain step) for bf16 and off */
        na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
        if (fp16 && !dynamic) gc = (na_grad_scaler_cfg)NA_STATIC_SCALER(static_scale);
        gc.enabled = fp16;
        gc.device = o->device;
        if (!(a->gs = na_grad_scaler_new(&gc)) || !(a->opt = make_optimizer(o, net)))
            return na_last_status();
    }
    if (o->log_path) {
        if (!(a->mon = na_amp_monitor_new(NULL)) || na_amp_monitor_open_csv(a->mon, o->log_path))
            return na_last_status();
    }
    return NA_OK;
}

void trainer_amp_free(trainer_amp *a) {
    if (a->fo) na_fp16_optimizer_free(a->fo); /* frees its optimizer */
    else na_optim_free(a->opt);
    na_grad_scaler_free(a->gs);
    na_amp_monitor_free(a->mon);
}

static na_grad_scaler *amp_scaler(const trainer_amp *a) {
    return a->fo ? na_fp16_optimizer_scaler(a->fo) : a->gs;
}

na_tensor *trainer_amp_loss(const trainer_amp *a, na_module *net, na_tensor *x, na_tensor *y,
                            double label_smoothing) {
    if (a->fo && x) x = na_cast(x, a->dtype); /* o2: the model is f16 */
    if (a->autocast && na_autocast_begin(a->dtype) != NA_OK) return NULL;
    na_tensor *logits = x && y ? na_module_forward(net, x) : NULL;
    na_tensor *loss = logits ? na_cross_entropy(logits, y, &(na_cross_entropy_opts){
                                                    .label_smoothing = label_smoothing})
                             : NULL;
    if (a->autocast) na_autocast_end();
    return loss;
}

/* backward, step (skipped on the device on overflow), scale update, zero_grad */
int trainer_amp_step(trainer_amp *a, na_tensor *loss) {
    if (a->fo)
        return na_fp16_optimizer_backward(a->fo, loss, true) || na_fp16_optimizer_step(a->fo) ||
                       na_fp16_optimizer_zero_grad(a->fo)
                   ? na_last_status()
                   : NA_OK;
    na_tensor *scaled = na_grad_scaler_scale(a->gs, loss);
    return !scaled || na_backward(scaled, NULL) || na_grad_scaler_step(a->gs, a->opt) ||
                   na_grad_scaler_update(a->gs) || na_optim_zero_grad(a->opt)
               ? na_last_status()
               : NA_OK;
}

int trainer_run(const trainer_opts *o, trainer_job *job) {
    const na_dataset *train = job->train;
    na_module *net = job->net;
    int rc = 0;
    if (na_module_to(net, o->device) != NA_OK) {
        fprintf(stderr, "%s: %s\n", o->program, na_last_error());
        return 1;
    }
    trainer_amp amp;
    if (trainer_amp_setup(o, net, &amp) != NA_OK) {
        fprintf(stderr, "%s: --amp %s: %s\n", o->program, o->amp, na_last_error());
        trainer_amp_free(&amp);
        return 1;
    }
    na_optim *opt = amp.opt;
    na_dtype input_dtype = amp.fo ? amp.dtype : NA_DTYPE_F32;
    na_batcher_cfg bc = job->batcher;
    bc.batch_size = o->batch, bc.seed = o->seed, bc.shuffle = true;
    na_batcher *b = opt ? na_batcher_new(train, &bc) : NULL;
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    int32_t *y = malloc(sizeof(int32_t) * (size_t)o->batch);
    if (!opt || !b || !x || !y) {
        fprintf(stderr, "%s: setup failed: %s\n", o->program, na_last_error());
        return 1;
    }
    int64_t start_epoch = 0;
    if (o->resume_path) {
        if (load_checkpoint(o->resume_path, net, &amp, &start_epoch) != NA_OK) {
            fprintf(stderr, "%s: --resume: %s\n", o->program, na_last_error());
            return 1;
        }
        if (!o->quiet) fprintf(stderr, "resumed from %s after %" PRId64 " epoch(s)\n", o->resume_path, start_epoch);
    }
    int64_t steps = na_batcher_steps_per_epoch(b), total_steps = steps * o->epochs;
    na_lr_schedule sched = !strcmp(o->schedule, "onecycle") ? na_lr_one_cycle(total_steps) : na_lr_constant();
    progress prog = {.tty = isatty(STDERR_FILENO) != 0, .quiet = o->quiet, .total = o->batch};
    double train_time = 0, final_loss = NAN, test_acc = NAN;
    int64_t images = 0;
    na_module_train(net, true);
    for (int64_t epoch = start_epoch; epoch < o->epochs && !rc; epoch++) {
        na_batcher_start_epoch(b, epoch);
        double t0 = now_s(), loss_sum = 0;
        int64_t n, step = 0, loss_count = 0;
        while (na_batcher_next(b, x, y, &n)) {
            int64_t shape[4] = {n, train->channels, train->height, train->width};
            na_lr_schedule_apply(&sched, opt, epoch * steps + step);
            na_tensor *xt = na_from_host(NA_DTYPE_F32, o->device, 4, shape, x);
            na_tensor *yt = na_from_host(NA_DTYPE_I32, o->device, NA_SHAPE(n), y);
            bool trace = o->amp_trace && epoch == start_epoch && step == 0;
            if (trace) { /* the first step's forward: autocast regions, or every op for o2/off */
                if (!o->quiet) fputc('\n', stderr);
                na_autocast_trace(amp.autocast ? NA_AMP_TRACE_REGIONS : NA_AMP_TRACE_ALL, stderr);
            }
            na_tensor *loss = trainer_amp_loss(&amp, net, xt, yt, o->label_smoothing);
            if (trace) na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
            if (!loss || trainer_amp_step(&amp, loss) != NA_OK) {
                fprintf(stderr, "\n%s: training step failed: %s\n", o->program, na_last_error());
                rc = 1;
                break;
            }
            if (amp.mon) { /* --log: one line per step (reads the loss: a sync on CUDA) */
                unsigned alerts = na_amp_monitor_record_scaler(amp.mon, epoch * steps + step, loss,
                                                               amp_scaler(&amp));
                if (alerts & ~amp.alerts_shown) {
                    char why[256];
                    fprintf(stderr, "\n%s: amp monitor at step %" PRId64 ": %s\n", o->program,
                            epoch * steps + step, na_amp_monitor_describe(amp.mon, why, sizeof why));
                    amp.alerts_shown |= alerts;
                }
            }
            images += n, step++;
            /* reading the loss is a host round trip: do it only for the progress display */
            if (step % 10 == 0 || step == steps) {
                final_loss = na_item(loss);
                loss_sum += final_loss, loss_count++;
                double el = train_time + (now_s() - t0);
                progress_show(&prog, epoch, o->epochs, step, steps, loss_sum / (double)loss_count,
                              images / (el > 0 ? el : 1e-9), step == steps);
            }
            na_step_end();
        }
        train_time += now_s() - t0;
        if (rc) break;
        test_acc = evaluate(net, job->test, bc.mean, bc.std, o->device, input_dtype);
        if (!o->quiet)
            fprintf(stderr, "epoch %" PRId64 ": train loss %.4f, test accuracy %.2f%%\n", epoch + 1,
                    loss_count ? loss_sum / (double)loss_count : NAN, 100 * test_acc);
        if (o->save_path && save_checkpoint(o->save_path, net, &amp, epoch + 1, o->seed) != NA_OK) {
            fprintf(stderr, "%s: --save: %s\n", o->program, na_last_error());
            rc = 1;
        }
    }
    if (!rc && isnan(test_acc))
        test_acc = evaluate(net, job->test, bc.mean, bc.std, o->device, input_dtype);
    na_grad_scaler_stats st = {.scale = 1.0};
    if (na_grad_scaler_is_enabled(amp_scaler(&amp)) && na_grad_scaler_stats_get(amp_scaler(&amp), &st))
        st = (na_grad_scaler_stats){.scale = NAN};
    double ips = train_time > 0 ? (double)images / train_time : 0;
    if (!rc && !o->quiet)
        printf("%s: %s on %s, test accuracy %.2f%%, %.0f images/s, %.1f s training\n", o->program,
               o->model, na_device_name(o->device), 100 * test_acc, ips, train_time);
    if (!rc && o->json)
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"amp\": \"%s\", \"epochs\": %" PRId64
               ", \"batch\": %" PRId64 ", \"train_images_per_s\": %.1f, \"train_time_s\": %.3f, "
               "\"test_acc\": %.4f, \"final_loss\": %.6f, \"params\": %" PRId64 ", \"seed\": %" PRIu64
               ", \"amp_mode\": \"%s\", \"skipped_steps\": %" PRId64 ", \"final_scale\": %.9g}\n",
               o->model, na_device_name(o->device), o->amp, o->epochs, o->batch, ips, train_time,
               test_acc, final_loss, na_module_num_params(net), o->seed, amp.mode, st.skipped,
               st.scale);
    fflush(stdout);
    free(x), free(y);
    na_batcher_free(b);
    trainer_amp_free(&amp);
    return rc;
}
