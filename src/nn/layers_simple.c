/* Layers without parameters: activations, pooling, dropout, flatten, scale. Each forward is
 * one op of nanoamp/ops.h; the state holds the op's options. */
#include "src/nn/module.h"

typedef struct {
    na_pool2d_opts pool;
    double value; /* Dropout p, Scale factor */
    int dim;      /* Flatten start_dim */
} simple_state;

static simple_state *st(na_module *m) { return m->state; }

static na_tensor *relu_fw(na_module *m, na_tensor *x) { (void)m; return na_relu(x); }
static na_tensor *gelu_fw(na_module *m, na_tensor *x) { (void)m; return na_gelu(x); }
static na_tensor *sigmoid_fw(na_module *m, na_tensor *x) { (void)m; return na_sigmoid(x); }
static na_tensor *tanh_fw(na_module *m, na_tensor *x) { (void)m; return na_tanh(x); }
static na_tensor *max_pool_fw(na_module *m, na_tensor *x) { return na_max_pool2d(x, &st(m)->pool); }
static na_tensor *avg_pool_fw(na_module *m, na_tensor *x) { return na_avg_pool2d(x, &st(m)->pool); }
static na_tensor *gap_fw(na_module *m, na_tensor *x) { (void)m; return na_global_avg_pool2d(x); }
static na_tensor *gmp_fw(na_module *m, na_tensor *x) { (void)m; return na_global_max_pool2d(x); }
static na_tensor *dropout_fw(na_module *m, na_tensor *x) {
    return na_dropout(x, st(m)->value, m->training);
}
static na_tensor *flatten_fw(na_module *m, na_tensor *x) { return na_flatten(x, st(m)->dim); }
static na_tensor *scale_fw(na_module *m, na_tensor *x) { return na_scale(x, st(m)->value); }

static na_module *simple(na_module_kind kind, na_module_forward_fn fw) {
    return na_module_make(kind, fw, sizeof(simple_state));
}

na_module *na_relu_new(void) { return simple(NA_MODULE_RELU, relu_fw); }
na_module *na_gelu_new(void) { return simple(NA_MODULE_GELU, gelu_fw); }
na_module *na_sigmoid_new(void) { return simple(NA_MODULE_SIGMOID, sigmoid_fw); }
na_module *na_tanh_new(void) { return simple(NA_MODULE_TANH, tanh_fw); }
na_module *na_global_avg_pool2d_new(void) { return simple(NA_MODULE_GLOBAL_AVG_POOL2D, gap_fw); }
na_module *na_global_max_pool2d_new(void) { return simple(NA_MODULE_GLOBAL_MAX_POOL2D, gmp_fw); }

static na_module *pool_new(const char *fn, na_module_kind kind, na_module_forward_fn fw,
                           const na_pool2d_opts *opts) {
    /* the window is checked here so a bad model fails when built, not at its first batch */
    if (!opts || opts->kernel[0] <= 0 || opts->kernel[1] <= 0 || opts->stride[0] < 0 ||
        opts->stride[1] < 0 || opts->padding[0] < 0 || opts->padding[1] < 0 ||
        2 * opts->padding[0] > opts->kernel[0] || 2 * opts->padding[1] > opts->kernel[1]) {
        na_set_error(NA_EINVAL, "%s: need a positive kernel, stride >= 0 and padding at most "
                     "half the kernel", fn);
        return NULL;
    }
    na_module *m = simple(kind, fw);
    if (m) st(m)->pool = *opts;
    return m;
}
na_module *na_max_pool2d_new(const na_pool2d_opts *opts) {
    return pool_new("na_max_pool2d_new", NA_MODULE_MAX_POOL2D, max_pool_fw, opts);
}
na_module *na_avg_pool2d_new(const na_pool2d_opts *opts) {
    return pool_new("na_avg_pool2d_new", NA_MODULE_AVG_POOL2D, avg_pool_fw, opts);
}

na_module *na_dropout_new(double p) {
    if (!(p >= 0.0 && p <= 1.0)) {
        na_set_error(NA_EINVAL, "na_dropout_new: p must be in [0, 1], got %g", p);
        return NULL;
    }
    na_module *m = simple(NA_MODULE_DROPOUT, dropout_fw);
    if (m) st(m)->value = p;
    return m;
}

na_module *na_flatten_new(int start_dim) {
    na_module *m = simple(NA_MODULE_FLATTEN, flatten_fw);
    if (m) st(m)->dim = start_dim;
    return m;
}

na_module *na_scale_new(double factor) {
    na_module *m = simple(NA_MODULE_SCALE, scale_fw);
    if (m) st(m)->value = factor;
    return m;
}
