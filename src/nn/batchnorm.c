/* BatchNorm1d / BatchNorm2d modules over na_batch_norm, with PyTorch's running statistics:
 * momentum or cumulative average (momentum=None), track_running_stats, affine. */
#include <inttypes.h>

#include "nanoamp/state.h"
#include "src/nn/module.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h"

typedef struct {
    na_batch_norm_cfg cfg;
    int64_t c;
    na_tensor *weight, *bias;                            /* NULL when !affine */
    na_tensor *running_mean, *running_var, *num_batches; /* NULL when not tracking */
    na_batch_norm_fn impl; /* training mode's forward in place of na_batch_norm, or NULL */
    void *impl_ctx;
    bool count_on_device;  /* na_module_count_batches_on_device: counted by kernels */
    struct {               /* from the Conv2d before it (na_batch_norm_offer_sums) */
        na_tensor *y, *sum, *sqsum;
        unsigned long step; /* the arena generation it was offered in */
    } offer;
} bn_state;

/* ++count by kernels on the count's device, no host value (a replayed graph counts too):
 * widened to f64, one added, stored back, saturating at INT32_MAX as the host count does. */
static int count_by_kernels(na_tensor *count) {
    const na_backend *be = na_be(count);
    na_tensor *w = be ? na_empty(NA_DTYPE_F64, count->device, 0, NULL) : NULL;
    na_tensor *w1 = w ? na_empty(NA_DTYPE_F64, count->device, 0, NULL) : NULL;
    if (!w1) return na_last_status();
    int rc = be->copy(&w->view, &count->view);
    if (!rc) rc = be->unary(NA_UNARY_ADD_SCALAR, &w->view, &w1->view, 1.0, 0.0);
    if (!rc) rc = be->copy(&count->view, &w1->view);
    return rc;
}

int na_batch_norm_set_impl(na_module *bn, na_batch_norm_fn fn, void *ctx) {
    if (!bn || !na_module_is_batch_norm(bn, NULL))
        return na_set_error(NA_EINVAL, "na_batch_norm_set_impl: %s is not a BatchNorm",
                            bn ? bn->type_name : "NULL");
    bn_state *s = bn->state;
    s->impl = fn;
    s->impl_ctx = ctx;
    return NA_OK;
}

static na_tensor *bn_forward(na_module *m, na_tensor *x) {
    bn_state *s = m->state;
    char d[NA_DESCRIBE_MAX];
    bool two_d = m->kind == NA_MODULE_BATCH_NORM2D;
    if ((two_d ? x->ndim != 4 : x->ndim != 2 && x->ndim != 3) || x->shape[1] != s->c) {
        na_set_error(NA_ESHAPE, "%s(%" PRId64 "): expected input %s with %" PRId64 " channels in "
                     "dim 1, got %s", m->type_name, s->c, two_d ? "[N, C, H, W]" : "[N, C] or "
                     "[N, C, L]", s->c, na_tensor_describe(x, d, sizeof d));
        return NULL;
    }
    bool track = s->cfg.track_running_stats;
    na_tensor *offered_y = s->offer.y, *sum = s->offer.sum, *sqsum = s->offer.sqsum;
    unsigned long offered_step = s->offer.step;
    s->offer.y = s->offer.sum = s->offer.sqsum = NULL; /* an offer serves one forward */
    na_tensor *(*bn)(na_tensor *, na_tensor *, na_tensor *, na_tensor *, na_tensor *, bool,
                     double, double) = s->cfg.fuse_relu ? na_batch_norm_relu : na_batch_norm;
    if (!m->training && track) /* eval with running statistics */
        return bn(x, s->running_mean, s->running_var, s->weight, s->bias, false, 0.0, s->cfg.eps);
    double momentum = s->cfg.momentum;
    /* host memory (see nn.h) unless counted on the device, which refuses a cumulative average */
    int32_t *count = track ? s->num_batches->data : NULL;
    if (track && s->cfg.cumulative_average) momentum = 1.0 / ((double)*count + 1.0);
    na_tensor *rm = track ? s->running_mean : NULL, *rv = track ? s->running_var : NULL;
    na_tensor *y;
    /* the step first: an offer from an ended step points at freed tensors */
    bool offered = offered_step == na_arena_generation() && offered_y == x;
    if (m->training && s->impl) {
        y = s->impl(s->impl_ctx, x, rm, rv, s->weight, s->bias, true, momentum, s->cfg.eps,
                    s->cfg.fuse_relu);
    } else if (offered) { /* the batch statistics from the sums the conv made of x */
        y = na_batch_norm_sums(x, sum, sqsum, rm, rv, s->weight, s->bias, momentum, s->cfg.eps,
                               s->cfg.fuse_relu);
    } else {
        y = bn(x, rm, rv, s->weight, s->bias, true, momentum, s->cfg.eps);
    }
    /* counted once the batch was used */
    if (y && count && s->count_on_device && count_by_kernels(s->num_batches)) return NULL;
    if (y && count && !s->count_on_device && *count < INT32_MAX) ++*count;
    return y;
}

static na_module *bn_new(na_module_kind kind, int64_t c, const na_batch_norm_cfg *cfg) {
    const char *name =
        kind == NA_MODULE_BATCH_NORM2D ? "na_batch_norm2d_new" : "na_batch_norm1d_new";
    na_batch_norm_cfg k = cfg ? *cfg : (na_batch_norm_cfg)NA_BATCH_NORM_DEFAULTS;
    if (c <= 0 || !(k.eps > 0) || !(k.momentum >= 0 && k.momentum <= 1)) {
        na_set_error(NA_EINVAL, "%s: need num_features > 0, eps > 0 and momentum in [0, 1], got "
                     "%" PRId64 ", %g, %g (start from NA_BATCH_NORM_DEFAULTS)", name, c, k.eps,
                     k.momentum);
        return NULL;
    }
    na_module *m = na_module_make(kind, bn_forward, sizeof(bn_state));
    bn_state *s = m ? m->state : NULL;
    if (!s) return NULL;
    s->cfg = k;
    s->c = c;
    if (k.affine) {
        if (!(s->weight = na_module_new_tensor(m, "weight", false, NA_SHAPE(c))) ||
            !(s->bias = na_module_new_tensor(m, "bias", false, NA_SHAPE(c))) ||
            na_fill_(s->weight, 1.0))
            goto fail;
    }
    if (k.track_running_stats) {
        if (!(s->running_mean = na_module_new_tensor(m, "running_mean", true, NA_SHAPE(c))) ||
            !(s->running_var = na_module_new_tensor(m, "running_var", true, NA_SHAPE(c))) ||
            na_fill_(s->running_var, 1.0))
            goto fail;
        s->num_batches = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, 0, NULL);
        if (!s->num_batches || na_module_add_buffer(m, "num_batches_tracked", s->num_batches))
            goto fail;
    }
    return m;
fail:
    na_module_free(m);
    return NULL;
}

na_module *na_batch_norm1d_new(int64_t num_features, const na_batch_norm_cfg *cfg) {
    return bn_new(NA_MODULE_BATCH_NORM1D, num_features, cfg);
}
na_module *na_batch_norm2d_new(int64_t num_features, const na_batch_norm_cfg *cfg) {
    return bn_new(NA_MODULE_BATCH_NORM2D, num_features, cfg);
}

static int count_batches_on_device(na_module *m, bool apply) {
    int n = 0;
    bn_state *s = na_module_is_batch_norm(m, NULL) ? m->state : NULL;
    if (s && s->cfg.track_running_stats) {
        if (s->cfg.cumulative_average)
            return na_set_error(NA_ENOTSUP, "na_module_count_batches_on_device: a %s has "
                                "cumulative_average (momentum=None): its momentum comes from "
                                "the count on the host", m->type_name);
        if (apply) {
            int rc = na_tensor_convert_(s->num_batches, NA_DTYPE_I32, s->running_mean->device);
            if (rc) return rc;
            s->count_on_device = true;
        }
        n++;
    }
    for (int i = 0; i < m->n_children; i++) {
        int k = count_batches_on_device(m->children[i], apply);
        if (k < 0) return k;
        n += k;
    }
    return n;
}

int na_module_count_batches_on_device(na_module *net) {
    if (!net) return na_set_error(NA_EINVAL, "na_module_count_batches_on_device: net is NULL");
    int rc = count_batches_on_device(net, false); /* refuse before changing anything */
    return rc < 0 ? rc : count_batches_on_device(net, true);
}

bool na_batch_norm_takes_sums(const na_module *bn) {
    const bn_state *s = bn->state;
    /* batch statistics: training, or no running ones; a replaced training forward takes x */
    return (bn->training || !s->cfg.track_running_stats) && !(bn->training && s->impl);
}

void na_batch_norm_offer_sums(na_module *bn, na_tensor *y, na_tensor *sum, na_tensor *sqsum) {
    bn_state *s = bn->state;
    s->offer.y = y, s->offer.sum = sum, s->offer.sqsum = sqsum;
    s->offer.step = na_arena_generation();
}

/* the forward of a ReLU whose work its BatchNorm does */
static na_tensor *fused_relu_forward(na_module *m, na_tensor *x) {
    (void)m;
    return x;
}

/* Calls join(a, b) on every two neighbours a, b of every Sequential in net's tree; returns how
 * many it joined (join says whether it did). */
static int join_neighbours(na_module *net, bool (*join)(na_module *a, na_module *b)) {
    int joined = 0;
    for (int i = 0; i < net->n_children; i++) {
        na_module *c = net->children[i];
        if (net->kind == NA_MODULE_SEQUENTIAL && i + 1 < net->n_children &&
            join(c, net->children[i + 1]))
            joined++;
        joined += join_neighbours(c, join);
    }
    return joined;
}

/* a BatchNorm and the ReLU after it, not yet fused */
static bool fuse_bn_relu(na_module *bn, na_module *relu) {
    if (!na_module_is_batch_norm(bn, NULL) || relu->kind != NA_MODULE_RELU ||
        relu->forward == fused_relu_forward)
        return false;
    ((bn_state *)bn->state)->cfg.fuse_relu = true;
    relu->forward = fused_relu_forward;
    return true;
}

/* a Conv2d and the BatchNorm2d after it, not yet linked */
static bool link_conv_bn(na_module *conv, na_module *bn) {
    return conv->kind == NA_MODULE_CONV2D && bn->kind == NA_MODULE_BATCH_NORM2D &&
           na_conv2d_link_batch_norm(conv, bn);
}

int na_module_fuse_bn_relu(na_module *net) {
    if (!net) return na_set_error(NA_EINVAL, "na_module_fuse_bn_relu: net is NULL");
    return join_neighbours(net, fuse_bn_relu);
}

int na_module_fuse_conv_bn(na_module *net) {
    if (!net) return na_set_error(NA_EINVAL, "na_module_fuse_conv_bn: net is NULL");
    return join_neighbours(net, link_conv_bn);
}
