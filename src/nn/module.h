/* The module struct and helpers shared by the layer files (internal). */
#ifndef NANOAMP_SRC_NN_MODULE_H
#define NANOAMP_SRC_NN_MODULE_H

#include "nanoamp/error.h"
#include "nanoamp/nn.h"

/* A parameter or buffer held directly by a module. */
typedef struct {
    char *name;
    na_tensor *t;
    bool buffer;
} na_module_slot;

struct na_module {
    na_module_kind kind;
    char *type_name;
    na_module_forward_fn forward;
    bool training;
    int n_slots, cap_slots;
    na_module_slot *slots; /* in registration order */
    int n_children, cap_children;
    na_module **children;
    char **child_names;
    void *state; /* the layer's configuration and tensor shortcuts */
    void (*free_state)(void *state);
};

/* A module of a built-in kind whose state is a zeroed block of state_size bytes (freed with
 * it), or NULL with an error. */
na_module *na_module_make(na_module_kind kind, na_module_forward_fn forward, size_t state_size);
/* A new persistent f32 CPU tensor registered as parameter or buffer (zero-filled); NULL with
 * an error (the module is unchanged). */
na_tensor *na_module_new_tensor(na_module *m, const char *name, bool buffer, int ndim,
                                const int64_t *shape);
/* Who computes a BatchNorm's training-mode forward in place of na_batch_norm (same arguments,
 * same contract, and relu: the BatchNorm is fused with the ReLU after it, so the result is
 * na_batch_norm_relu's; SyncBatchNorm in src/dist reduces the batch statistics over ranks):
 * fn NULL restores na_batch_norm. NA_EINVAL when bn is not a BatchNorm. */
typedef na_tensor *(*na_batch_norm_fn)(void *ctx, na_tensor *x, na_tensor *running_mean,
                                       na_tensor *running_var, na_tensor *weight,
                                       na_tensor *bias, bool training, double momentum,
                                       double eps, bool relu);
int na_batch_norm_set_impl(na_module *bn, na_batch_norm_fn fn, void *ctx);

/* Who computes a Linear's or a Conv2d's forward in place of na_linear / na_conv2d (the same
 * tensors; opts NULL for a Linear): the FP8 layers of src/amp/fp8_layers.c, which fall back to
 * the plain op outside an FP8 autocast region. fn NULL restores the plain op. NA_EINVAL when m
 * is neither a Linear nor a Conv2d. A replaced Conv2d does not offer BatchNorm sums. */
typedef na_tensor *(*na_affine_fn)(void *ctx, na_tensor *x, na_tensor *weight, na_tensor *bias,
                                   const na_conv2d_opts *opts);
int na_affine_set_impl(na_module *m, na_affine_fn fn, void *ctx);

/* A Conv2d and the BatchNorm right after it (na_module_fuse_conv_bn): the conv asks whether
 * the BatchNorm's next forward normalizes with batch statistics (so sums of its input would
 * serve it), and hands it its output y with y's per-channel sums (na_conv2d_sums), which that
 * forward uses when its input is that y, in the same step. */
bool na_batch_norm_takes_sums(const na_module *bn);
void na_batch_norm_offer_sums(na_module *bn, na_tensor *y, na_tensor *sum, na_tensor *sqsum);
/* Links a Conv2d to the BatchNorm after it; false (nothing changed) when already linked. */
bool na_conv2d_link_batch_norm(na_module *conv, na_module *bn);
#endif
