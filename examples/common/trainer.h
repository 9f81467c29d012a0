/* examples/common/trainer.h — what the MNIST and CIFAR trainers share: the command line
 * (cli.c), the model and the checks before training (setup.c), the training loop and
 * evaluation (trainer.c), the amp recipes (amp_step.c), checkpoints (checkpoint.c), the
 * progress bar and the --json line (report.c), the --report page (run_report.c). Each trainer
 * only loads its data. */
#ifndef NANOAMP_EXAMPLES_TRAINER_H
#define NANOAMP_EXAMPLES_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "nanoamp.h"

typedef struct {
    const char *program;   /* "mnist-train" */
    const char *data_dir;  /* --data (NULL: the trainer's search, described by data_hint) */
    const char *data_hint; /* for --help: where the trainer looks without --data */
    const char *model;     /* --model */
    int64_t epochs, batch, limit, test_limit;
    double lr;             /* < 0: the optimizer's default (0.05 SGD, 1e-3 AdamW) */
    double momentum;
    double weight_decay;   /* < 0: the optimizer's default (0 SGD, 0.01 AdamW) */
    double label_smoothing;
    const char *optim;     /* sgd | adamw */
    na_device device;
    const char *amp;       /* off | fp16 | bf16 | o2 | fp8 | auto */
    const char *fp8_recipe; /* --fp8-recipe delayed | current */
    const char *fp8_format; /* --fp8-format hybrid | e4m3 */
    int64_t fp8_history;   /* --fp8-history N (delayed: steps of amax history); 0: 1024 */
    int64_t fp8_margin;    /* --fp8-margin N (delayed: scale / 2^N, >= 0) */
    const char *loss_scale; /* NULL (not given: dynamic), "dynamic" or a number */
    int64_t growth_interval; /* 0 (not given: 2000) or the dynamic scaler's growth interval */
    bool amp_trace;
    const char *log_path;  /* --log FILE.csv */
    const char *report_path; /* --report FILE.html (run_report.h) */
    uint64_t seed;
    const char *save_path, *resume_path;
    bool json, quiet;
    bool has_synthetic;    /* the trainer offers --synthetic */
    int64_t synthetic;     /* CIFAR: --synthetic N */
    const char *schedule;  /* constant | onecycle */
    /* data parallel (under mpirun; see docs/distributed.md) */
    const char *allreduce_dtype; /* f32 | f16 | bf16 */
    int64_t bucket_mb;     /* 0 (not given: na_ddp's default, 25) */
    bool sync_bn;
    bool no_broadcast_buffers; /* each rank keeps its own BatchNorm running statistics */
    double dist_timeout;   /* --dist-timeout SECONDS; 0 (not given): na_dist's default */
    int threads;           /* --threads N; 0 (not given): $NANOAMP_THREADS, else the cores */
    bool cuda_graph;       /* --cuda-graph: full batches replayed as a CUDA graph */
    bool channels_last;    /* --channels-last: the training batches' images channels-last */
    uint64_t given;        /* the flags given a value (trainer_flag_given): with --resume the
                              others take the checkpoint's values */
} trainer_opts;

/* The defaults every trainer starts from (a trainer changes what its recipe needs). */
trainer_opts trainer_defaults(const char *model);
/* Parses argv over the values already in *o (which --help shows as the defaults). `models` is
 * "mlp|cnn" etc. Returns 0, 1 for --help or --version (printed), or -1 with a message
 * (trainer_start_failed: under mpirun, once for all ranks). */
int trainer_parse_args(trainer_opts *o, int argc, char **argv, const char *models);

/* What a trainer hands to trainer_run: its data sets (the caller frees them after) and the
 * batcher's augmentation. trainer_run fills in the rest. */
#define TRAINER_MAX_CHANNELS 3
typedef struct {
    na_dataset *train, *test; /* cut to --limit / --test-limit images */
    na_batcher_cfg batcher;   /* augmentation (crop_pad, hflip, prefetch); the rest is filled */
    na_module *net;           /* model_by_name(--model), freed by trainer_run */
    int64_t input_shape[4];   /* one input image as [1, C, H, W] */
    float mean[TRAINER_MAX_CHANNELS], std[TRAINER_MAX_CHANNELS]; /* of the training images */
} trainer_job;

/* The amp recipes, in one place for the trainers, na-bench and the tests (amp_step.c):
 *   off   f32; a disabled GradScaler (a plain optimizer step)
 *   fp16  autocast f16 around forward and loss, PyTorch's GradScaler
 *   bf16  autocast bf16 around forward and loss, a disabled GradScaler
 *   o2    Apex O2: the model converted to f16 except BatchNorm, f32 master weights and loss
 *         scaling in the fp16 optimizer, the input cast to f16
 *   fp8   Transformer Engine style: FP8 autocast regions (nanoamp/fp8.h) around forward and
 *         loss, the Linear and Conv2d layers in FP8 with per-tensor scales (a->fp8, its recipe
 *         from trainer_amp_fp8_recipe), the rest under the bf16 rules; no loss scaling; the
 *         scales updated after each step
 * One step in every mode (as tests/test_cuda_training.c and bench/train.c run it):
 *     na_tensor *loss = trainer_amp_loss(&amp, net, x, y, 0.0);  // forward + loss
 *     trainer_amp_step(&amp, loss);                              // backward, step, zero_grad
 *     na_step_end(); */
typedef struct {
    const char *mode;      /* off | fp16 | bf16 | o2 (after resolving auto) */
    bool autocast;         /* fp16 / bf16: autocast regions around forward and loss */
    na_dtype dtype;        /* the autocast dtype, or o2's model dtype */
    na_grad_scaler *gs;    /* fp16 / bf16 / off (disabled unless fp16); NULL for o2 */
    na_fp16_optimizer *fo; /* o2 */
    na_optim *opt;         /* the optimizer whose lr the schedule sets */
    na_amp_monitor *mon;   /* --log, --report */
    struct run_report *report; /* --report (run_report.h) */
    unsigned alerts_shown;
    na_ddp *ddp;           /* data parallel (trainer_amp_init_dist), else NULL */
    na_dist *dist;         /* fp8 under data parallelism: the amax values are reduced over it */
    na_fp8_model *fp8;     /* fp8: the model's FP8 layers and their scaling state */
    na_fp8_recipe_cfg fp8_cfg; /* fp8: the recipe (trainer_amp_init's default, or the options') */
    bool channels_last;    /* trainer_amp_loss converts 4-d inputs to channels-last */
} trainer_amp;

/* The recipe of mode for net: takes opt (freed by trainer_amp_free, also on failure), made with
 * net's parameters, or for o2 without any (the fp16 optimizer adds the f32 masters). scaler:
 * the GradScaler's configuration for fp16, the fp16 optimizer's for o2 (NULL: PyTorch's
 * defaults, Apex's dynamic scaler). o2 converts net to f16 in place. No checks of the device:
 * na_autocast_check_device tells whether it computes in f16/bf16. Call trainer_amp_free
 * either way. */
int trainer_amp_init(trainer_amp *a, const char *mode, na_module *net, na_optim *opt,
                     const na_grad_scaler_cfg *scaler);
/* The FP8 recipe of the options (--fp8-recipe, --fp8-format, --fp8-history, --fp8-margin). */
na_fp8_recipe_cfg trainer_amp_fp8_recipe(const trainer_opts *o);
/* The same, data parallel over dist unless it is NULL: gradients go through an na_ddp
 * (ddp_cfg; made after o2's conversion, before the fp16 optimizer takes its masters), which
 * trainer_amp_step finishes after backward, before the unscale and the step. A collective:
 * every rank calls it. */
int trainer_amp_init_dist(trainer_amp *a, const char *mode, na_module *net, na_optim *opt,
                          const na_grad_scaler_cfg *scaler, na_dist *dist,
                          const na_ddp_config *ddp_cfg);
/* The recipe the options ask for (trainer_amp_init): resolves o->amp (auto: na_amp_recommend
 * for o->device), checks the device, makes the optimizer, the scaler from --loss-scale and
 * --growth-interval, and the --log monitor. On failure the message names the option at fault;
 * call trainer_amp_free either way. */
int trainer_amp_setup(const trainer_opts *o, na_module *net, trainer_amp *a);
/* Refuses scaling options (--loss-scale, --growth-interval) that amp mode `mode` would
 * silently ignore, naming the flag; trainer_parse_args calls it for a mode given by name (a
 * command-line error, exit 2), trainer_amp_setup for the one --amp auto chose. */
int trainer_amp_check_scaling(const trainer_opts *o, const char *mode);
/* The same, data parallel over dist unless it is NULL (trainer_amp_init_dist with
 * --allreduce-dtype and --bucket-mb; with --sync-bn the BatchNorms reduce their statistics
 * over dist). A collective: every rank calls it. */
int trainer_amp_setup_dist(const trainer_opts *o, na_module *net, na_dist *dist, trainer_amp *a);
void trainer_amp_free(trainer_amp *a);
/* The scaler in use (the fp16 optimizer's for o2); disabled for off/bf16. */
na_grad_scaler *trainer_amp_scaler(const trainer_amp *a);
/* Forward and cross-entropy: inside an autocast region for fp16/bf16, on an f16 input for o2;
 * an image batch converted to channels-last first when a->channels_last (the network's
 * activations then stay channels-last: nanoamp/tensor.h, memory formats). */
na_tensor *trainer_amp_loss(const trainer_amp *a, na_module *net, na_tensor *x, na_tensor *y,
                            double label_smoothing);
/* Backward, optimizer step (skipped on the device on overflow), scale update, zero_grad. */
int trainer_amp_step(trainer_amp *a, na_tensor *loss);

/* --cuda-graph (nanoamp/tensor.h, na_step_graph_*): the step recorded once and replayed.
 * trainer_amp_graph_prepare readies a and net for it, before the first step: the learning
 * rate and BatchNorm's batch count move to the device (their values then change on the
 * device, so replays stay right; the math is the same). A message and a negative status where
 * a graph cannot serve: not on CUDA (NA_EINVAL), data parallel (NA_ENOTSUP: DDP waits on the
 * host for NCCL), a BatchNorm with a cumulative average (NA_ENOTSUP).
 * trainer_amp_capture records trainer_amp_loss + trainer_amp_step on the persistent batch x, y
 * and a copy of the loss into the persistent f32 0-dim loss_out, without running it: capture
 * after warm-up steps of the same shapes, right after na_step_end, then na_step_graph_replay
 * (after copying each batch into x, y) takes the steps. NULL with the reason as the error
 * (the step did not run: run it eagerly). */
int trainer_amp_graph_prepare(trainer_amp *a, na_module *net, na_device dev);
#define TRAINER_CUDA_GRAPH_NEEDS_CUDA                                                        \
    "--cuda-graph needs --device cuda (a CUDA graph replays the CUDA stream; the cpu runs " \
    "every step eagerly)"
na_step_graph *trainer_amp_capture(trainer_amp *a, na_module *net, na_tensor *x, na_tensor *y,
                                   double label_smoothing, na_tensor *loss_out);

/* Accuracy and mean cross-entropy of net on ds (normalized by mean/std, inputs cast to
 * input_dtype). Prints nothing: a negative status with the library's message on failure. */
int trainer_evaluate(na_module *net, const na_dataset *ds, const float *mean, const float *std,
                     na_device dev, na_dtype input_dtype, double *accuracy, double *loss);

/* Says what failed before trainer_run (printf-style, without the program name: a bad flag,
 * data that does not load). Alone: "program: message" on stderr. Under mpirun the ranks
 * compare (the ranks that are fine, in trainer_run): a failure every rank shares is printed
 * once, by rank 0; one that is a rank's own is printed by it as "program (rank r): message".
 * A collective there: every rank that fails before trainer_run calls it once, then exits. */
void trainer_start_failed(const trainer_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Builds the model, trains, evaluates after each epoch, saves/resumes, prints progress and the
 * JSON line. Returns the process exit code. */
int trainer_run(const trainer_opts *o, trainer_job *job);

/* Per-channel mean and std of a data set's pixels scaled to [0, 1] (the batcher's
 * normalization). */
void trainer_channel_stats(const na_dataset *ds, float *mean, float *std);

#endif
