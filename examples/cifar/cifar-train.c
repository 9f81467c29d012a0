/* cifar-train — trains the ResNet-9 of the DAWNBench CIFAR-10 record (examples/common/models.h)
 * with SGD + Nesterov momentum 0.9, weight decay 5e-4, a one-cycle schedule, label smoothing
 * 0.2, random crop (pad 4) and horizontal flip, per-channel normalization.
 *
 * Data: the CIFAR-10 binary version (data_batch_1.bin ... data_batch_5.bin, test_batch.bin)
 * in --data DIR, else $NANOAMP_DATA/cifar-10-batches-bin, else ./data/cifar-10-batches-bin.
 * --synthetic N trains on N generated images of CIFAR's shape with learnable class patterns
 * (for measuring speed where the data set cannot be downloaded). */
#include <stdio.h>
#include <stdlib.h>

#include "../common/blas_tune.h"
#include "../common/trainer.h"

static const char *find_data(const char *given) {
    static char buf[4096];
    if (given) return given;
    const char *env = getenv("NANOAMP_DATA");
    if (env && *env) {
        snprintf(buf, sizeof buf, "%s/cifar-10-batches-bin", env);
        return buf;
    }
    return "data/cifar-10-batches-bin";
}

int main(int argc, char **argv) {
    blas_tune_reexec(argv);
    /* the DAWNBench recipe: batch 512, SGD + Nesterov 0.9, weight decay 5e-4, one-cycle,
     * label smoothing 0.2 */
    trainer_opts o = trainer_defaults("resnet9");
    o.batch = 512, o.weight_decay = 5e-4, o.label_smoothing = 0.2, o.schedule = "onecycle";
    o.lr = 0.2;
    o.has_synthetic = true;
    o.data_hint = "$NANOAMP_DATA/cifar-10-batches-bin, ./data/cifar-10-batches-bin";
    int rc = trainer_parse_args(&o, argc, argv, "resnet9");
    if (rc) return rc < 0 ? 2 : 0;
    na_dataset *train, *test;
    if (o.synthetic > 0) {
        train = na_dataset_synthetic_cifar(o.synthetic, o.seed);
        test = na_dataset_synthetic_cifar(o.synthetic / 5 > 100 ? o.synthetic / 5 : 100, o.seed + 1);
    } else {
        const char *dir = find_data(o.data_dir);
        train = na_cifar10_load(dir, true);
        test = train ? na_cifar10_load(dir, false) : NULL;
    }
    if (train && test) {
        rc = trainer_run(&o, &(trainer_job){.train = train, .test = test,
                                            .batcher = {.crop_pad = 4, .hflip = true,
                                                        .prefetch = true}});
    } else {
        trainer_start_failed(&o, "%s%s", na_last_error(), na_last_status() != NA_EIO ? "" :
                             "\n(or --synthetic N: train on N generated images of CIFAR's shape)");
        rc = 1;
    }
    na_dataset_free(train);
    na_dataset_free(test);
    return rc;
}
