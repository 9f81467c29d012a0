/* mnist-minimal — one epoch of mnist-train's MLP with f16 autocast and a GradScaler, written
 * out in the open: the loop below is the whole recipe, the part to copy into a program of
 * your own. mnist-train runs the same step (examples/common/amp_step.c) inside its machinery
 * (flags, progress bar, checkpoints, JSON); tests/mnist_minimal.sh checks that both end on
 * the same loss, bit for bit, as
 *
 *   mnist-minimal [DATA_DIR [TRAIN_LIMIT [TEST_LIMIT]]]
 *   mnist-train --model mlp --amp fp16 --epochs 1 --batch 128 --seed 1 --limit TRAIN_LIMIT ...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/blas_tune.h"
#include "../common/models.h"
#include "../common/trainer.h"

#define BATCH 128

/* The share of `ds` the model classifies right (eval mode, no graph). */
static double accuracy(na_module *net, const na_dataset *ds, const float *mean, const float *std) {
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = BATCH, .mean = mean, .std = std});
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    int32_t y[BATCH], pred[BATCH];
    int64_t n, right = 0, seen = 0;
    na_module_eval(net);
    na_no_grad_begin();
    for (bool ok = x && !na_batcher_start_epoch(b, 0); ok && na_batcher_next(b, x, y, &n);) {
        na_tensor *xt = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n, 1, 28, 28), x);
        na_tensor *am = xt ? na_argmax(na_module_forward(net, xt), 1, false) : NULL;
        if (!(ok = am && na_copy_to_host(am, pred) == NA_OK)) seen = 0;
        for (int64_t i = 0; ok && i < n; i++) right += pred[i] == y[i];
        seen += ok ? n : 0;
        na_step_end();
    }
    na_no_grad_end();
    free(x);
    na_batcher_free(b);
    return seen ? (double)right / (double)seen : -1;
}

int main(int argc, char **argv) {
    /* OpenBLAS's kernels for this CPU, as the trainers choose them (it may re-execute the
     * program once): the GEMMs' sums, and so the losses, depend on the kernels */
    blas_tune_reexec(argv);
    bool help = argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    /* no options: an option a user brings from mnist-train (--data DIR) is not a directory */
    int option = 0;
    for (int i = 1; i < argc && !help && !option; i++)
        if (argv[i][0] == '-') option = i;
    if (help || argc > 4 || option) {
        if (option)
            fprintf(stderr, "%s: unknown option '%s' (this program takes no options: the data "
                    "directory is its first argument)\n", argv[0], argv[option]);
        fprintf(help ? stdout : stderr, "usage: %s [DATA_DIR [TRAIN_LIMIT [TEST_LIMIT]]]\n", argv[0]);
        return help ? 0 : 2;
    }
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    na_dataset *train = na_mnist_load(dir, true), *test = train ? na_mnist_load(dir, false) : NULL;
    if (!test) {
        fprintf(stderr, "%s: %s\n", argv[0], na_last_error());
        na_dataset_free(train);
        return 1;
    }
    for (int i = 2; i < argc && i < 4; i++) { /* the first N images only */
        char *end;
        long long v = strtoll(argv[i], &end, 10);
        na_dataset *ds = i == 2 ? train : test;
        if (end == argv[i] || *end || v < 1) {
            fprintf(stderr, "%s: %s: expected a number of images >= 1, got '%s'\n", argv[0],
                    i == 2 ? "TRAIN_LIMIT" : "TEST_LIMIT", argv[i]);
            na_dataset_free(train);
            na_dataset_free(test);
            return 2;
        }
        if (v < ds->n) ds->n = v;
    }
    float mean[1], std[1];
    trainer_channel_stats(train, mean, std);

    na_manual_seed(1);
    na_module *net = model_mnist_mlp(); /* 784 -> 256 -> ReLU -> 10, f32 parameters */
    na_sgd_cfg cfg = NA_SGD_DEFAULTS;
    cfg.lr = 0.05, cfg.momentum = 0.9, cfg.nesterov = true;
    na_optim *opt = net ? na_sgd_new(na_module_parameters(net), &cfg) : NULL;
    na_grad_scaler *gs = na_grad_scaler_new(NULL); /* 65536, x0.5 on overflow, x2 per 2000 */
    na_batcher *b = na_batcher_new(train, &(na_batcher_cfg){
        .batch_size = BATCH, .seed = 1, .shuffle = true, .mean = mean, .std = std, .prefetch = true});
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    int32_t y[BATCH];
    int64_t n, step = 0, steps = b ? na_batcher_steps_per_epoch(b) : 0;
    double last_loss = 0;
    int rc = opt && gs && x ? na_batcher_start_epoch(b, 0) : na_last_status();
    while (!rc && na_batcher_next(b, x, y, &n)) {
        /* ---- the training step ---- */
        na_tensor *xt = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n, 1, 28, 28), x);
        na_tensor *yt = na_from_host(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(n), y);
        na_autocast_begin(NA_DTYPE_F16);      /* linear layers in f16, the loss in f32 */
        na_tensor *loss = na_cross_entropy(na_module_forward(net, xt), yt, NULL);
        na_autocast_end();
        na_tensor *scaled = na_grad_scaler_scale(gs, loss); /* loss x scale: small grads live */
        rc = !scaled || na_backward(scaled, NULL)           /* f32 parameter grads (+=) */
             || na_grad_scaler_step(gs, opt)                /* unscale; skip if inf/NaN */
             || na_grad_scaler_update(gs)                   /* halve or grow the scale */
             || na_optim_zero_grad(opt);
        if (!rc && ++step == steps) last_loss = na_item(loss); /* a host read: only once */
        na_step_end();                        /* frees everything this step made */
        /* ---- */
    }
    double acc = rc ? -1 : accuracy(net, test, mean, std);
    if (rc || acc < 0)
        fprintf(stderr, "%s: %s\n", argv[0], na_last_error());
    else
        printf("final loss %.6f, test accuracy %.4f, loss scale %g\n", last_loss, acc,
               na_grad_scaler_get_scale(gs));
    free(x);
    na_batcher_free(b);
    na_grad_scaler_free(gs);
    na_optim_free(opt);
    na_module_free(net);
    na_dataset_free(train);
    na_dataset_free(test);
    return rc || acc < 0 ? 1 : 0;
}
