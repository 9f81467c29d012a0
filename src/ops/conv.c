/* Convolution front-end ([N, C, H, W], contiguous or channels-last). The kernels are the
 * backends' (im2col + GEMM or the direct kernel on the CPU, cuDNN on CUDA); backward sits
 * beside the forward. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "src/ops/ops_internal.h"

/* ---- conv2d ------------------------------------------------------------------------------ */

/* A device switch of the environment, read at each call: "0" off, "1" on CUDA, "all" on every
 * device (how the CPU tests a CUDA rule); unset: `unset`, one of those. */
static bool env_device_switch(const char *name, const char *unset, na_device dev) {
    const char *e = getenv(name);
    if (!e) e = unset;
    return strcmp(e, "all") == 0 || (strcmp(e, "1") == 0 && dev == NA_DEVICE_CUDA);
}

/* How many zero input channels to add: a channels-last f16/bf16 convolution whose input
 * channels are not a multiple of 8 (an RGB first layer) misses cuDNN's tensor-core kernels,
 * which read channels in groups of 8; padding the input and the weight with zero channels
 * computes the same output on those kernels. */
static int64_t conv_channel_padding(const na_conv_geom *g, const na_tensor *x) {
    bool half = x->dtype == NA_DTYPE_F16 || x->dtype == NA_DTYPE_BF16;
    if (!half || g->groups != 1 || g->c_in % 8 == 0 ||
        na_memory_format_of(x) != NA_FORMAT_CHANNELS_LAST ||
        /* NANOAMP_CONV_PAD_CHANNELS, asked last (a getenv): on CUDA unless set otherwise */
        !env_device_switch("NANOAMP_CONV_PAD_CHANNELS", "1", x->device))
        return 0;
    return 8 - g->c_in % 8;
}

/* The geometry of x ⊛ w under opts, or false with an error naming fn, the shapes and opts. */
static bool conv_geometry(const char *fn, const na_tensor *x, const na_tensor *w,
                          const na_tensor *b, const na_conv2d_opts *opts, na_conv_geom *gp) {
    char s1[NA_DESCRIBE_MAX], s2[NA_DESCRIBE_MAX];
    na_conv2d_opts o = opts ? *opts : (na_conv2d_opts){0};
    na_conv_geom g = {.kh = 0};
    g.groups = na_or_default(o.groups, 1);
    g.sh = na_or_default(o.stride[0], 1), g.sw = na_or_default(o.stride[1], 1);
    g.dh = na_or_default(o.dilation[0], 1), g.dw = na_or_default(o.dilation[1], 1);
    g.ph = o.padding[0], g.pw = o.padding[1];
    bool ok = x->ndim == 4 && w->ndim == 4 && g.ph >= 0 && g.pw >= 0 &&
              x->shape[1] % g.groups == 0 && w->shape[0] % g.groups == 0 &&
              w->shape[1] * g.groups == x->shape[1] &&
              (!b || (b->ndim == 1 && b->shape[0] == w->shape[0]));
    if (ok) {
        g.n = x->shape[0], g.c_in = x->shape[1], g.h = x->shape[2], g.w = x->shape[3];
        g.c_out = w->shape[0], g.kh = (int)w->shape[2], g.kw = (int)w->shape[3];
        g.oh = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
        g.ow = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
        ok = g.oh > 0 && g.ow > 0 && g.h + 2 * g.ph >= g.dh * (g.kh - 1) + 1 &&
             g.w + 2 * g.pw >= g.dw * (g.kw - 1) + 1;
    }
    if (!ok)
        na_set_error(NA_ESHAPE, "%s: input %s and weight %s (groups %d, stride %dx%d, padding "
                     "%dx%d, dilation %dx%d) do not make a convolution: expected input [N, C, H, "
                     "W], weight [C_out, C/groups, kh, kw]%s and a window that fits", fn,
                     na_tensor_describe(x, s1, sizeof s1), na_tensor_describe(w, s2, sizeof s2),
                     g.groups, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, b ? ", bias [C_out]" : "");
    *gp = g;
    return ok;
}

/* na_conv2d; with sum != NULL, na_conv2d_sums (fn names the caller) */
static na_tensor *conv2d(const char *fn, na_tensor *x, na_tensor *w, na_tensor *b,
                         const na_conv2d_opts *opts, na_tensor **sum, na_tensor **sqsum) {
    if (!na_check_float(fn, x, "input") || !na_check_float(fn, w, "weight") ||
        !na_check_same_device(fn, x, w) || (b && (!na_check_float(fn, b, "bias") ||
                                                  !na_check_same_device(fn, x, b))))
        return NULL;
    na_conv_geom g;
    if (!conv_geometry(fn, x, w, b, opts, &g)) return NULL;
    na_tensor *ins[3] = {x, w, b};
    if (na_autocast_inputs(NA_OP_CONV2D, ins, b ? 3 : 2) != NA_OK) return NULL;
    if (!na_check_same_dtype(fn, ins[0], ins[1]) || (b && !na_check_same_dtype(fn, ins[0], ins[2])))
        return NULL;
    /* a channels-last x takes a channels-last weight (cuDNN's KRSC) and gives a channels-last y */
    x = na_dense(ins[0]);
    na_memory_format f = x ? na_memory_format_of(x) : NA_FORMAT_CONTIGUOUS;
    w = na_contiguous_format(ins[1], f), b = b ? na_contiguous(ins[2]) : NULL;
    if (!x || !w || (ins[2] && !b)) return NULL;
    int64_t pad = conv_channel_padding(&g, x);
    if (pad > 0) { /* zero channels, in x and w alike, change no output */
        if (!(x = na_pad_dim(x, 1, 0, pad)) || !(w = na_pad_dim(w, 1, 0, pad))) return NULL;
        g.c_in += pad;
    }
    na_tensor *y = na_empty_format(x->dtype, x->device, NA_SHAPE(g.n, g.c_out, g.oh, g.ow), f);
    if (!y) return NULL;
    const na_backend *be = na_be(x);
    bool summed = false;
    if (sum && env_device_switch("NANOAMP_CONV_BN_STATS", "0", x->device)) {
        na_dtype sdt = x->dtype == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
        if (!(*sum = na_empty(sdt, x->device, NA_SHAPE(g.c_out))) ||
            !(*sqsum = na_empty(sdt, x->device, NA_SHAPE(g.c_out))) ||
            be->conv2d_stats(&g, &x->view, &w->view, NA_VIEW_OF(b), &y->view, &(*sum)->view,
                             &(*sqsum)->view, &summed) != NA_OK)
            return NULL;
    }
    if (sum && !summed) *sum = *sqsum = NULL; /* not served: the plain convolution */
    if (!summed && be->conv2d(&g, &x->view, &w->view, NA_VIEW_OF(b), &y->view) != NA_OK)
        return NULL;
    na_tensor *in[3] = {x, w, b};
    na_node *n = na_op_record(NA_OP_CONV2D, y, 3, in);
    if (n && !(n->extra = na_conv_geom_copy(&g))) return NULL;
    return y;
}

na_tensor *na_conv2d(na_tensor *x, na_tensor *w, na_tensor *b, const na_conv2d_opts *opts) {
    return conv2d("na_conv2d", x, w, b, opts, NULL, NULL);
}

na_tensor *na_conv2d_sums(na_tensor *x, na_tensor *w, na_tensor *b, const na_conv2d_opts *opts,
                          na_tensor **sum, na_tensor **sqsum) {
    if (!sum || !sqsum) {
        na_set_error(NA_EINVAL, "na_conv2d_sums: sum and sqsum must not be NULL");
        return NULL;
    }
    *sum = *sqsum = NULL;
    return conv2d("na_conv2d_sums", x, w, b, opts, sum, sqsum);
}

int na_conv2d_grads(na_tensor *gy, na_tensor *x, na_tensor *w, const na_conv2d_opts *opts,
                    na_tensor **gx, na_tensor **gw) {
    const char *fn = "na_conv2d_grads";
    char s1[NA_DESCRIBE_MAX];
    na_conv_geom g;
    if (!na_check_float(fn, gy, "gy") || !na_check_float(fn, x, "input") ||
        !na_check_float(fn, w, "weight") || !na_check_same_device(fn, x, w) ||
        !na_check_same_device(fn, x, gy) || !na_check_same_dtype(fn, x, w) ||
        !na_check_same_dtype(fn, x, gy) || !conv_geometry(fn, x, w, NULL, opts, &g))
        return na_last_status();
    if (gy->ndim != 4 || gy->shape[0] != g.n || gy->shape[1] != g.c_out ||
        gy->shape[2] != g.oh || gy->shape[3] != g.ow)
        return na_set_error(NA_ESHAPE, "%s: gy %s is not the output's shape [%lld, %lld, %lld, "
                            "%lld]", fn, na_tensor_describe(gy, s1, sizeof s1), (long long)g.n,
                            (long long)g.c_out, (long long)g.oh, (long long)g.ow);
    /* the kernels' plain NCHW views; nothing is recorded */
    if (!(gy = na_contiguous(gy)) || !(x = na_contiguous(x)) || !(w = na_contiguous(w)))
        return na_last_status();
    const na_backend *be = na_be(x);
    int rc;
    if (gx && (!(*gx = na_empty_like(x)) ||
               (rc = be->conv2d_backward_data(&g, &gy->view, &w->view, &(*gx)->view))))
        return *gx ? rc : na_last_status();
    if (gw && (!(*gw = na_empty_like(w)) ||
               (rc = be->conv2d_backward_weight(&g, &x->view, &gy->view, &(*gw)->view))))
        return *gw ? rc : na_last_status();
    return NA_OK;
}

int na_bw_CONV2D(na_node *n, na_tensor *gout, na_tensor **gin) {
    const na_conv_geom *g = n->extra;
    na_tensor *x = n->inputs[0], *w = n->inputs[1], *gy = na_as_format_of(gout, n->out);
    if (!gy) return na_last_status();
    const na_backend *be = na_be(x);
    int rc;
    if (na_node_needs_grad(n, 0)) {
        if (!(gin[0] = na_empty_like_format(x))) return na_last_status();
        if ((rc = be->conv2d_backward_data(g, &gy->view, &w->view, &gin[0]->view))) return rc;
    }
    if (na_node_needs_grad(n, 1)) { /* into the weight's .grad when the engine offers it */
        if (!(gin[1] = na_node_grad_buffer(n, 1, w))) return na_last_status();
        if ((rc = be->conv2d_backward_weight(g, &x->view, &gy->view, &gin[1]->view))) return rc;
    }
    if (na_node_needs_grad(n, 2)) { /* gb = sum of gy over N, H, W: the rows of [rows, C_out] */
        na_tensor *r;
        if (na_memory_format_of(gy) == NA_FORMAT_CHANNELS_LAST) { /* the memory is [N*H*W, C_out] */
            if ((r = na_tensor_view_header(gy))) {
                r->ndim = 2, r->shape[0] = gy->numel / g->c_out, r->shape[1] = g->c_out;
                na_set_contiguous_strides(r);
            }
        } else { /* [N, C_out, H*W] summed over H*W first */
            r = na_reshape(gy, 3, (const int64_t[]){g->n, g->c_out, -1});
            r = r ? na_sum_dim(r, 2, false) : NULL;
        }
        if (!(gin[2] = r ? na_grad_sum_rows(n, 2, r) : NULL)) return na_last_status();
    }
    return NA_OK;
}
