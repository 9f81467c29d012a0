/* examples/common/models.h — the reference models of the trainers and the benchmarks. */
#ifndef NANOAMP_EXAMPLES_MODELS_H
#define NANOAMP_EXAMPLES_MODELS_H
#include "nanoamp.h"

/* 784 -> 256 -> ReLU -> 10 (input [N, 1, 28, 28], flattened) */
na_module *model_mnist_mlp(void);
/* conv(1->32, 3x3, pad 1)+BN+ReLU+maxpool2 -> conv(32->64, 3x3, pad 1)+BN+ReLU+maxpool2 ->
 * linear(64*7*7 -> 128)+ReLU -> linear(128 -> 10) */
na_module *model_mnist_cnn(void);
/* The ResNet-9 of the DAWNBench CIFAR-10 record: prep conv 64; layer1 conv 128 + maxpool +
 * residual(conv 128, conv 128); layer2 conv 256 + maxpool; layer3 conv 512 + maxpool +
 * residual(conv 512, conv 512); global max pool; linear 512 -> 10 (no bias); output * 0.125. Every conv
 * is 3x3, pad 1, no bias, followed by BN and ReLU. */
na_module *model_resnet9(void);
#define MODEL_NAMES "mlp, cnn or resnet9"
/* The model called `name` ("mlp", "cnn", "resnet9") with its BatchNorm + ReLU pairs fused
 * (na_module_fuse_bn_relu: same state names and results, less memory) and each Conv2d linked
 * to its BatchNorm (na_module_fuse_conv_bn: batch sums from the conv under
 * NANOAMP_CONV_BN_STATS), as the trainers and na-bench run it; input_shape (may be NULL) receives the shape of one input image as
 * [1, C, H, W]. NULL with an error for an unknown name. */
na_module *model_by_name(const char *name, int64_t input_shape[4]);
#endif
