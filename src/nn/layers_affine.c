/* Linear and Conv2d: the layers with weight and bias, initialized as PyTorch does
 * (kaiming_uniform(a = sqrt(5)) weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) bias). */
#include <math.h>

#include "src/nn/module.h"

typedef struct {
    na_tensor *weight, *bias; /* bias may be NULL */
    na_conv2d_opts opts;      /* Conv2d only */
    na_module *bn;            /* Conv2d only: the BatchNorm it feeds sums (or NULL) */
    na_affine_fn impl;        /* the forward in place of the plain op (na_affine_set_impl) */
    void *impl_ctx;
} affine_state;

/* Registers weight (and bias) of the given weight shape and draws their initial values. */
static na_module *make_affine(na_module_kind kind, na_module_forward_fn fwd, int ndim,
                              const int64_t *wshape, bool bias) {
    na_module *m = na_module_make(kind, fwd, sizeof(affine_state));
    affine_state *s = m ? m->state : NULL;
    if (!s || !(s->weight = na_module_new_tensor(m, "weight", false, ndim, wshape)) ||
        (bias && !(s->bias = na_module_new_tensor(m, "bias", false, NA_SHAPE(wshape[0])))) ||
        na_init_kaiming_uniform_(s->weight, sqrt(5.0)))
        goto fail;
    if (s->bias) {
        int64_t fan = na_init_fan_in(s->weight);
        double bound = fan > 0 ? 1.0 / sqrt((double)fan) : 0.0;
        if (na_init_uniform_(s->bias, -bound, bound)) goto fail;
    }
    return m;
fail:
    na_module_free(m);
    return NULL;
}

int na_affine_set_impl(na_module *m, na_affine_fn fn, void *ctx) {
    if (!m || (m->kind != NA_MODULE_LINEAR && m->kind != NA_MODULE_CONV2D))
        return na_set_error(NA_EINVAL, "na_affine_set_impl: %s is not a Linear or a Conv2d",
                            m ? m->type_name : "NULL");
    affine_state *s = m->state;
    s->impl = fn;
    s->impl_ctx = ctx;
    return NA_OK;
}

static na_tensor *linear_forward(na_module *m, na_tensor *x) {
    affine_state *s = m->state;
    if (s->impl) return s->impl(s->impl_ctx, x, s->weight, s->bias, NULL);
    return na_linear(x, s->weight, s->bias);
}

na_module *na_linear_new(int64_t in_features, int64_t out_features, bool bias) {
    if (in_features <= 0 || out_features <= 0) {
        na_set_error(NA_EINVAL, "na_linear_new: features must be positive, got in %lld, out %lld",
                     (long long)in_features, (long long)out_features);
        return NULL;
    }
    return make_affine(NA_MODULE_LINEAR, linear_forward, NA_SHAPE(out_features, in_features),
                       bias);
}

static na_tensor *conv2d_forward(na_module *m, na_tensor *x) {
    affine_state *s = m->state;
    if (s->impl) return s->impl(s->impl_ctx, x, s->weight, s->bias, &s->opts);
    if (!s->bn || !na_batch_norm_takes_sums(s->bn))
        return na_conv2d(x, s->weight, s->bias, &s->opts);
    na_tensor *sum, *sqsum, *y = na_conv2d_sums(x, s->weight, s->bias, &s->opts, &sum, &sqsum);
    if (y && sum) na_batch_norm_offer_sums(s->bn, y, sum, sqsum);
    return y;
}

bool na_conv2d_link_batch_norm(na_module *conv, na_module *bn) {
    affine_state *s = conv->state;
    if (s->bn) return false;
    s->bn = bn;
    return true;
}

na_module *na_conv2d_new(int64_t in_channels, int64_t out_channels, int kh, int kw,
                         const na_conv2d_opts *opts, bool bias) {
    na_conv2d_opts o = opts ? *opts : (na_conv2d_opts){0};
    int groups = o.groups > 0 ? o.groups : 1;
    if (in_channels <= 0 || out_channels <= 0 || kh <= 0 || kw <= 0 || o.groups < 0 ||
        in_channels % groups || out_channels % groups || o.padding[0] < 0 || o.padding[1] < 0 ||
        o.stride[0] < 0 || o.stride[1] < 0 || o.dilation[0] < 0 || o.dilation[1] < 0) {
        na_set_error(NA_EINVAL, "na_conv2d_new: invalid conv %lld -> %lld channels, kernel %dx%d, "
                     "groups %d, stride %dx%d, padding %dx%d, dilation %dx%d (channels must be "
                     "positive multiples of groups)", (long long)in_channels,
                     (long long)out_channels, kh, kw, o.groups, o.stride[0], o.stride[1],
                     o.padding[0], o.padding[1], o.dilation[0], o.dilation[1]);
        return NULL;
    }
    na_module *m = make_affine(NA_MODULE_CONV2D, conv2d_forward,
                               NA_SHAPE(out_channels, in_channels / groups, kh, kw), bias);
    if (m) ((affine_state *)m->state)->opts = o;
    return m;
}
