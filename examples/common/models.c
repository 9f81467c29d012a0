#include "models.h"

#include <string.h>

na_module *model_mnist_mlp(void) {
    return NA_SEQUENTIAL(na_flatten_new(1), na_linear_new(784, 256, true), na_relu_new(),
                         na_linear_new(256, 10, true));
}

/* conv 3x3 pad 1 + BN + ReLU, optionally followed by a 2x2 max pool */
static na_module *conv_bn_relu(int64_t cin, int64_t cout, bool bias, bool pool) {
    na_conv2d_opts pad1 = {.padding = {1, 1}};
    na_module *seq = NA_SEQUENTIAL(na_conv2d_new(cin, cout, 3, 3, &pad1, bias),
                                   na_batch_norm2d_new(cout, NULL), na_relu_new());
    if (seq && pool &&
        na_sequential_append(seq, na_max_pool2d_new(&(na_pool2d_opts){.kernel = {2, 2}})) != NA_OK) {
        na_module_free(seq);
        return NULL;
    }
    return seq;
}

na_module *model_mnist_cnn(void) {
    return NA_SEQUENTIAL(conv_bn_relu(1, 32, true, true), conv_bn_relu(32, 64, true, true),
                         na_flatten_new(1), na_linear_new(64 * 7 * 7, 128, true), na_relu_new(),
                         na_linear_new(128, 10, true));
}

static na_module *residual(int64_t c) {
    return na_residual_new(NA_SEQUENTIAL(conv_bn_relu(c, c, false, false),
                                         conv_bn_relu(c, c, false, false)));
}

na_module *model_resnet9(void) {
    return NA_SEQUENTIAL(conv_bn_relu(3, 64, false, false),                        /* prep */
                         conv_bn_relu(64, 128, false, true), residual(128),         /* layer1 */
                         conv_bn_relu(128, 256, false, true),                       /* layer2 */
                         conv_bn_relu(256, 512, false, true), residual(512),        /* layer3 */
                         na_global_max_pool2d_new(), na_linear_new(512, 10, false),
                         na_scale_new(0.125));
}

na_module *model_by_name(const char *name, int64_t input_shape[4]) {
    int64_t c = 1, hw = 28;
    na_module *m;
    if (name && !strcmp(name, "mlp")) {
        m = model_mnist_mlp();
    } else if (name && !strcmp(name, "cnn")) {
        m = model_mnist_cnn();
    } else if (name && !strcmp(name, "resnet9")) {
        m = model_resnet9();
        c = 3, hw = 32;
    } else {
        na_set_error(NA_EINVAL, "model_by_name: unknown model '%s' (expected %s)",
                     name ? name : "(null)", MODEL_NAMES);
        return NULL;
    }
    /* BN + ReLU as one op each way: no pre-ReLU tensor kept, same names, same numbers; each
     * conv feeds its BN the batch sums where NANOAMP_CONV_BN_STATS turns that on */
    if (m && (na_module_fuse_bn_relu(m) < 0 || na_module_fuse_conv_bn(m) < 0)) {
        na_module_free(m);
        return NULL;
    }
    if (m && input_shape) {
        input_shape[0] = 1, input_shape[1] = c, input_shape[2] = hw, input_shape[3] = hw;
    }
    return m;
}
