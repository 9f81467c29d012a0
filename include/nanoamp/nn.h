/* nanoamp/nn.h — modules: layers with parameters and buffers, containers, initialization.
 *
 * A module is a forward function plus named tensors and named children. Parameters are
 * persistent f32 tensors that require grad (made on the CPU; move them with na_module_to);
 * buffers are persistent tensors without grad (BatchNorm's running statistics). A module
 * owns its tensors and its children: na_module_free releases the whole tree.
 *
 * Names are dotted paths relative to the module asked, as PyTorch's state_dict:
 * "features.0.weight", "bn.running_mean". Sequential children are named "0", "1", ...
 *
 *     na_manual_seed(0);                         // initialization draws from na_rand's generator
 *     na_module *net = NA_SEQUENTIAL(
 *         na_conv2d_new(1, 32, 3, 3, &(na_conv2d_opts){.padding = {1, 1}}, true),
 *         na_batch_norm2d_new(32, NULL), na_relu_new(),
 *         na_max_pool2d_new(&(na_pool2d_opts){.kernel = {2, 2}}),
 *         na_flatten_new(1), na_linear_new(32 * 14 * 14, 10, true));
 *     if (!net) fprintf(stderr, "%s\n", na_last_error());
 *     na_module_to(net, NA_DEVICE_CUDA);
 *     na_tensor *logits = na_module_forward(net, x);     // a step tensor
 *     na_tensor *loss = na_cross_entropy(logits, labels, NULL);
 *     na_module_free(net);
 *
 * Losses are plain functions of nanoamp/ops.h: na_cross_entropy (CrossEntropyLoss) and
 * na_mse_loss (MSELoss). A model's parameters go to an optimizer as a list
 * (na_module_parameters); its state goes to a checkpoint as a named list (na_module_state).
 *
 * Moving (na_module_to) and converting (na_module_to_dtype) change each tensor in place: the
 * na_tensor structs stay the same, so pointers held elsewhere stay valid. An optimizer's
 * state is made for the parameters' device when the optimizer is made: move the model first.
 */
#ifndef NANOAMP_NN_H
#define NANOAMP_NN_H

#include <stdbool.h>
#include <stdint.h>

#include "nanoamp/error.h"
#include "nanoamp/ops.h"
#include "nanoamp/state.h"
#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct na_module na_module;

/* X(ID, type name as printed) */
#define NA_MODULE_KIND_MAP(X)                   \
    X(CUSTOM, "Custom")                         \
    X(SEQUENTIAL, "Sequential")                 \
    X(RESIDUAL, "Residual")                     \
    X(LINEAR, "Linear")                         \
    X(CONV2D, "Conv2d")                         \
    X(BATCH_NORM1D, "BatchNorm1d")              \
    X(BATCH_NORM2D, "BatchNorm2d")              \
    X(RELU, "ReLU")                             \
    X(GELU, "GELU")                             \
    X(SIGMOID, "Sigmoid")                       \
    X(TANH, "Tanh")                             \
    X(MAX_POOL2D, "MaxPool2d")                  \
    X(AVG_POOL2D, "AvgPool2d")                  \
    X(GLOBAL_AVG_POOL2D, "GlobalAvgPool2d")     \
    X(GLOBAL_MAX_POOL2D, "GlobalMaxPool2d")     \
    X(DROPOUT, "Dropout")                       \
    X(FLATTEN, "Flatten")                       \
    X(SCALE, "Scale")

typedef enum {
#define NA_MODULE_KIND_ENUM_(id, name) NA_MODULE_##id,
    NA_MODULE_KIND_MAP(NA_MODULE_KIND_ENUM_)
#undef NA_MODULE_KIND_ENUM_
        NA_MODULE_KIND_COUNT
} na_module_kind;

typedef na_tensor *(*na_module_forward_fn)(na_module *m, na_tensor *x);

/* ---- running a module ---------------------------------------------------------------- */
/* m's forward on x. NULL (error kept) when x is NULL, so calls can be chained. */
na_tensor *na_module_forward(na_module *m, na_tensor *x);
/* Training mode (the default for a new module) or eval mode, for m and all its children:
 * BatchNorm uses batch statistics and Dropout drops only in training mode. */
void na_module_train(na_module *m, bool training);
void na_module_eval(na_module *m); /* na_module_train(m, false) */
bool na_module_is_training(const na_module *m);
/* Zeroes the .grad of every parameter that has one (gradients accumulate; the zeros are
 * written lazily, by the next backward: nanoamp/autograd.h, "Zeroed gradients"). */
int na_module_zero_grad(na_module *m);
void na_module_free(na_module *m); /* the tree, its parameters, buffers and grads; NULL ok */

/* ---- layers (every constructor returns NULL with an error on bad arguments) --------- */
/* y = x W^T + b: weight [out, in], bias [out]. Weight ~ kaiming_uniform(a=sqrt(5)), i.e.
 * U(-1/sqrt(in), 1/sqrt(in)); bias U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's defaults). */
na_module *na_linear_new(int64_t in_features, int64_t out_features, bool bias);
/* weight [out, in/groups, kh, kw], bias [out]; opts as na_conv2d (NULL: stride 1, no
 * padding, dilation 1, one group). Initialized as Linear with fan_in = in/groups*kh*kw. */
na_module *na_conv2d_new(int64_t in_channels, int64_t out_channels, int kh, int kw,
                         const na_conv2d_opts *opts, bool bias);

/* BatchNorm (PyTorch semantics). Start from NA_BATCH_NORM_DEFAULTS and change fields:
 *   affine: parameters weight (ones) and bias (zeros);
 *   track_running_stats: buffers running_mean (zeros), running_var (ones) and
 *     num_batches_tracked (i32, kept in host memory so reading it never synchronizes; it
 *     stays on the CPU and in i32 through na_module_to / na_module_to_dtype; only
 *     na_module_count_batches_on_device moves it to the device). Off: batch
 *     statistics in eval mode too, and no buffers;
 *   momentum: running = (1 - momentum) * running + momentum * batch_stat (unbiased var);
 *   cumulative_average (PyTorch's momentum=None): momentum 1/num_batches_tracked instead;
 *   fuse_relu: the output is relu(BatchNorm(x)), one na_batch_norm_relu op each way (a
 *     replaced training forward, SyncBatchNorm's, is followed by a separate na_relu). */
typedef struct {
    double eps, momentum;
    bool affine, track_running_stats, cumulative_average, fuse_relu;
} na_batch_norm_cfg;
#define NA_BATCH_NORM_DEFAULTS \
    { .eps = 1e-5, .momentum = 0.1, .affine = true, .track_running_stats = true }
/* BatchNorm1d takes [N, C] or [N, C, L], BatchNorm2d [N, C, H, W]; cfg NULL: defaults. */
na_module *na_batch_norm1d_new(int64_t num_features, const na_batch_norm_cfg *cfg);
na_module *na_batch_norm2d_new(int64_t num_features, const na_batch_norm_cfg *cfg);
/* Fuses, in every Sequential of net's tree, each BatchNorm directly followed by a ReLU: the
 * BatchNorm gets fuse_relu and the ReLU passes its input through. The ReLU stays in its place,
 * so parameter and buffer names (state_dicts, checkpoints) do not change; outputs and
 * gradients are those of the unfused net (bit for bit in f32 on the CPU). Returns the number
 * of pairs fused (0 again on a fused net), or a negative status with an error. */
int na_module_fuse_bn_relu(na_module *net);
/* Links, in every Sequential of net's tree, each Conv2d directly followed by a BatchNorm2d:
 * when that BatchNorm normalizes with batch statistics and NANOAMP_CONV_BN_STATS turns the
 * route on for the device, the conv computes its output's per-channel sums in the same pass
 * (na_conv2d_sums) and the BatchNorm takes its statistics from them (na_batch_norm_sums), with
 * no pass of its own over the activation. Otherwise both run as before, bit for bit. Names,
 * state_dicts and the graph's nodes do not change. Returns the number of pairs linked (0
 * again on a linked net), or a negative status with an error. */
int na_module_fuse_conv_bn(na_module *net);
/* Moves every tracking BatchNorm's num_batches_tracked of net's tree to the device of its
 * running statistics (still i32) and counts batches there by kernels, with no host value, so
 * that a training step replayed as a CUDA graph (na_step_graph_capture) counts too. Reading
 * the count is then a device read. Refused (NA_ENOTSUP, nothing changed) when a BatchNorm has
 * cumulative_average, whose momentum is computed from the count on the host. Returns the
 * number of BatchNorms that count on the device, or a negative status. */
int na_module_count_batches_on_device(na_module *net);

na_module *na_relu_new(void);
na_module *na_gelu_new(void); /* exact (erf) form */
na_module *na_sigmoid_new(void);
na_module *na_tanh_new(void);
/* opts as na_max_pool2d / na_avg_pool2d (kernel required; stride 0 means the kernel). */
na_module *na_max_pool2d_new(const na_pool2d_opts *opts);
na_module *na_avg_pool2d_new(const na_pool2d_opts *opts);
na_module *na_global_avg_pool2d_new(void); /* [N, C, H, W] -> [N, C] */
na_module *na_global_max_pool2d_new(void); /* [N, C, H, W] -> [N, C] */
na_module *na_dropout_new(double p);       /* p in [0, 1]; identity in eval mode */
na_module *na_flatten_new(int start_dim);  /* dims start_dim.. merged (PyTorch: 1) */
na_module *na_scale_new(double factor);    /* y = factor * x (ResNet-9's 0.125 output) */

/* ---- containers ----------------------------------------------------------------------- */
/* Runs mods in order; takes ownership of all of them, also on failure. A NULL among mods
 * (a constructor that failed) frees the others and returns NULL with that error kept, so
 * constructors can be nested without checks. */
na_module *na_sequential_new(int n, na_module *const *mods);
#define NA_SEQUENTIAL(...)                                                               \
    na_sequential_new((int)(sizeof((na_module *[]){__VA_ARGS__}) / sizeof(na_module *)), \
                      (na_module *[]){__VA_ARGS__})
/* Appends mod as child "<count>"; takes ownership (frees mod on failure). */
int na_sequential_append(na_module *seq, na_module *mod);
/* y = x + body(x); child "body". Takes ownership (NULL body: NULL, error kept). */
na_module *na_residual_new(na_module *body);

/* ---- custom modules -------------------------------------------------------------------- */
/* A module of kind NA_MODULE_CUSTOM named type_name (copied), running forward. data is the
 * module's own configuration, freed with free_data (may be NULL) by na_module_free. (Its
 * tensors are registered below; they, not data, are the module's state.) */
na_module *na_module_new(const char *type_name, na_module_forward_fn forward, void *data,
                         void (*free_data)(void *data));
void *na_module_data(const na_module *m); /* the data given to na_module_new */
/* Registers t under name; the module takes ownership of t (a persistent tensor), also on
 * failure. Parameters must be float; they are set to require grad. Names must be unique
 * among the module's tensors and children and contain no '.'. */
int na_module_add_param(na_module *m, const char *name, na_tensor *t);
int na_module_add_buffer(na_module *m, const char *name, na_tensor *t);
int na_module_add_child(na_module *m, const char *name, na_module *child);

/* ---- inspecting ------------------------------------------------------------------------- */
na_module_kind na_module_kind_of(const na_module *m);
const char *na_module_type_name(const na_module *m); /* "BatchNorm2d", or the custom name */
int na_module_num_children(const na_module *m);
na_module *na_module_child_at(const na_module *m, int i, const char **name);
/* The parameter or buffer at a dotted path ("features.1.running_var"), or NULL. */
na_tensor *na_module_get(const na_module *m, const char *path);
/* Total elements of all parameters (buffers not counted). */
int64_t na_module_num_params(const na_module *m);
/* BatchNorm1d/2d, and BatchNorm1d/2d with affine parameters. The signature is that of
 * na_module_pred, so these can be passed to na_module_to_dtype as they are. */
bool na_module_is_batch_norm(const na_module *m, void *ctx);
bool na_module_is_affine_batch_norm(const na_module *m, void *ctx);

/* ---- parameters and state (nanoamp/state.h) ------------------------------------------- */
/* The trainable parameters (those that require grad; frozen ones are left out) of m's tree in
 * state_dict order, for an optimizer: na_sgd_new(na_module_parameters(net), &cfg). A step list
 * (valid until na_step_end); n < 0 with an error on failure. */
na_tensor_list na_module_parameters(na_module *m);

enum { NA_MODULE_PARAMS = 1, NA_MODULE_BUFFERS = 2, NA_MODULE_STATE = 3 };
/* Appends to out the parameters and/or buffers (which: NA_MODULE_PARAMS, _BUFFERS or _STATE =
 * both) of m's tree, named prefix + dotted path, in PyTorch's state_dict order: modules in
 * pre-order, each module's own tensors in the order registered (BatchNorm: weight, bias,
 * running_mean, running_var, num_batches_tracked). Each item's owner is the module holding
 * the tensor. On failure out is as it was. */
int na_module_named_tensors(na_module *m, int which, const char *prefix, na_named_tensors *out);
/* The state protocol (nanoamp/state.h): every parameter and buffer, as
 * na_module_named_tensors(m, NA_MODULE_STATE, prefix, out). */
int na_module_state(na_module *m, const char *prefix, na_named_tensors *out);

/* ---- device and dtype ---------------------------------------------------------------------- */
typedef bool (*na_module_pred)(const na_module *m, void *ctx);
/* Moves every float parameter, buffer and gradient of the tree to dev. */
int na_module_to(na_module *m, na_device dev);
/* Converts the float parameters, buffers and gradients of every module of the tree for which
 * skip(module, ctx) is false (skip NULL: all) to the float dtype dt. The skip test applies
 * to a module's own tensors; its children are asked on their own. Apex O2's "half except
 * BatchNorm": na_module_to_dtype(net, NA_DTYPE_F16, na_module_is_batch_norm, NULL)
 * (na_batch_norm wants f32 running statistics for f16 input, so skip every BatchNorm, not
 * just the affine ones as Apex's convert_network does). */
int na_module_to_dtype(na_module *m, na_dtype dt, na_module_pred skip, void *ctx);

/* ---- initialization (draws from the global generator, as na_rand: same numbers on the CPU
 * and on CUDA for the same seed) ------------------------------------------------------------ */
int na_init_uniform_(na_tensor *t, double lo, double hi);
/* fan_in = shape[1] * prod(shape[2:]) (at least 2 dims). */
int64_t na_init_fan_in(const na_tensor *t);
/* U(-bound, bound), bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)). */
int na_init_kaiming_uniform_(na_tensor *t, double a);

#ifdef __cplusplus
}
#endif
#endif
