/* mnist-train — trains an MLP or a small CNN on MNIST-format data (Fashion-MNIST by default).
 *
 *   MLP: 784 -> 256 -> ReLU -> 10
 *   CNN: conv(1->32, 3x3, pad 1) + BN + ReLU + maxpool 2
 *        conv(32->64, 3x3, pad 1) + BN + ReLU + maxpool 2
 *        linear(64*7*7 -> 128) + ReLU -> linear(128 -> 10)
 *
 * Data: --data DIR, else $NANOAMP_DATA, ./data/mnist, /usr/share/datasets/fashion-mnist (where
 * Debian's dataset-fashion-mnist package puts it); the four IDX files, .gz or not.
 *
 * The models are examples/common/models.c's; the training step of each --amp mode is in
 * examples/common/amp_step.c (trainer_amp_loss, trainer_amp_step), shared with cifar-train,
 * na-bench and the tests; the loop around it is examples/common/trainer.c. mnist-minimal.c
 * writes the --model mlp --amp fp16 step out in the open, in one loop to copy. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../common/blas_tune.h"
#include "../common/trainer.h"

static bool is_dir(const char *p) {
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static const char *find_data(const char *given) {
    if (given) return given;
    static char env_dir[4096];
    const char *env = getenv("NANOAMP_DATA");
    if (env && *env) {
        snprintf(env_dir, sizeof env_dir, "%s/mnist", env);
        return is_dir(env_dir) ? env_dir : env;
    }
    if (is_dir("data/mnist")) return "data/mnist";
    return "/usr/share/datasets/fashion-mnist";
}

int main(int argc, char **argv) {
    blas_tune_reexec(argv);
    trainer_opts o = trainer_defaults("cnn");
    o.data_hint = "$NANOAMP_DATA[/mnist], ./data/mnist, /usr/share/datasets/fashion-mnist";
    int rc = trainer_parse_args(&o, argc, argv, "cnn|mlp");
    if (rc) return rc < 0 ? 2 : 0;
    const char *dir = find_data(o.data_dir);
    na_dataset *train = na_mnist_load(dir, true), *test = train ? na_mnist_load(dir, false) : NULL;
    if (train && test) {
        rc = trainer_run(&o, &(trainer_job){.train = train, .test = test,
                                            .batcher = {.prefetch = true}});
    } else {
        /* where to get the files when they are not there (NA_EIO), not when damaged */
        trainer_start_failed(&o, "%s%s", na_last_error(), na_last_status() != NA_EIO ? "" :
                             "\n(put train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte"
                             "[.gz], t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz] "
                             "in a directory and pass --data DIR, or apt-get install "
                             "dataset-fashion-mnist)");
        rc = 1;
    }
    na_dataset_free(train);
    na_dataset_free(test);
    return rc;
}
