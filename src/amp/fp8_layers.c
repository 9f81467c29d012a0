/* FP8 Linear and Conv2d (nanoamp/fp8.h): each a custom function whose forward casts x and w to
 * FP8 with their recipe's scales and multiplies them with f32 sums, and whose backward casts
 * the output gradient and runs both gradient products on FP8 operands the same way. The
 * FP8 autocast region and na_fp8_model, which gives a model's layers these forwards, are
 * here too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/autocast.h"
#include "nanoamp/autograd.h"
#include "nanoamp/fp8.h"
#include "src/nn/module.h"

/* ---- casting with a scale ----------------------------------------------------------------- */

typedef struct {
    na_tensor *q;      /* the FP8 tensor */
    float scale, amax; /* amax NaN: not read (delayed scaling outside grad mode) */
} fp8_cast;

/* |x * scale| > fmax, counted on the host; only called when the amax says some are. */
static int64_t count_saturated(na_tensor *xs, float fmax) {
    float *h = malloc(sizeof(float) * (size_t)(xs->numel ? xs->numel : 1));
    if (!h || na_copy_to_host(xs, h)) {
        free(h);
        return -1;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < xs->numel; i++) n += fabsf(h[i]) > fmax;
    free(h);
    return n;
}

/* x (any float dtype) cast to role r's format with the scale r's recipe gives: the amax read
 * and recorded first under current scaling, after (and only when record) under delayed.
 * Saturating, as TE's casts: x * scale is clamped to +-fmax (NaN stays) before the cast. */
static int cast_scaled(na_fp8_scaling *s, na_fp8_role r, na_tensor *x, bool record,
                       fp8_cast *out) {
    na_fp8_format f = na_fp8_scaling_format(s, r);
    float fmax = (float)na_fp8_format_max(f);
    bool current = na_fp8_scaling_config(s).kind == NA_FP8_RECIPE_CURRENT;
    int rc = NA_OK;
    out->amax = NAN;
    if (current || record) {
        na_tensor *m = na_fp8_amax(x);
        if (!m) return na_last_status();
        out->amax = (float)na_item(m);
    }
    if (current) rc = na_fp8_scaling_record_amax(s, r, out->amax);
    out->scale = na_fp8_scaling_scale(s, r);
    if (!rc && !current && record) rc = na_fp8_scaling_record_amax(s, r, out->amax);
    if (rc) return rc;
    na_tensor *xs = na_scale(x->dtype == NA_DTYPE_F32 ? x : na_cast(x, NA_DTYPE_F32),
                             (double)out->scale);
    if (!xs) return na_last_status();
    if (record && out->amax * out->scale > fmax) {
        int64_t n = count_saturated(xs, fmax);
        if (n < 0 || na_fp8_scaling_count_saturated(s, r, n)) return na_last_status();
    }
    out->q = na_cast(na_clamp(xs, -fmax, fmax), (na_dtype)na_fp8_format_dtype(f));
    return out->q ? NA_OK : na_last_status();
}

/* What a layer's forward leaves for its backward (the FP8 operands are saved tensors). */
typedef struct {
    na_fp8_scaling *s;
    bool record;
    float scale_inv_x, scale_inv_w;
    na_conv2d_opts opts; /* Conv2d */
    na_dtype dt[3];      /* of x, w, b: their gradients' */
    int x_ndim;
    int64_t x_shape[NA_MAX_DIMS];
} fp8_saved;

typedef struct {
    na_fp8_scaling *s;
    const na_conv2d_opts *opts; /* NULL: Linear */
} fp8_call;

/* The trace's details of a layer's call: its casts so far, grad_output's format and scale. */
static void trace_call(const char *name, na_fp8_scaling *s, const fp8_cast *cx,
                       const fp8_cast *cw) {
    if (na_autocast_trace_mode() == NA_AMP_TRACE_OFF) return;
    na_amp_trace_fp8 t;
    for (int r = 0; r < NA_FP8_ROLE_COUNT; r++)
        t.dtype[r] = (na_dtype)na_fp8_format_dtype(na_fp8_scaling_format(s, (na_fp8_role)r));
    t.scale[0] = cx->scale, t.amax[0] = cx->amax;
    t.scale[1] = cw->scale, t.amax[1] = cw->amax;
    t.scale[2] = na_fp8_scaling_scale(s, NA_FP8_GRAD_OUTPUT), t.amax[2] = NAN;
    na_autocast_trace_fp8(name, &t);
}

/* The output dtype autocast's rule for linear and conv2d gives: bf16 inside an enabled bf16
 * region (an FP8 region is one), f32 elsewhere. */
static na_dtype out_dtype(void) {
    return na_autocast_enabled() && na_autocast_dtype() == NA_DTYPE_BF16 ? NA_DTYPE_BF16
                                                                         : NA_DTYPE_F32;
}

/* t in dt (a cast when it differs) */
static na_tensor *as_dtype(na_tensor *t, na_dtype dt) {
    return !t || t->dtype == dt ? t : na_cast(t, dt);
}

static na_tensor *scalar_f32(const na_tensor *like, float v) {
    return na_scalar(NA_DTYPE_F32, like->device, (double)v);
}

/* Casts x and w (xin: x as given, b the bias), saves them and the scales for backward. */
static int cast_inputs(na_function_ctx *c, const fp8_call *call, const char *name,
                       const na_tensor *xin, na_tensor *x, na_tensor *w, const na_tensor *b,
                       fp8_cast *cx, fp8_cast *cw, fp8_saved **sv) {
    /* a training call (forward itself runs in no-grad mode): an evaluation records nothing */
    bool record = na_function_needs_input_grad(c, 0) || na_function_needs_input_grad(c, 1) ||
                  na_function_needs_input_grad(c, 2);
    int rc = cast_scaled(call->s, NA_FP8_INPUT, x, record, cx);
    if (!rc) rc = cast_scaled(call->s, NA_FP8_WEIGHT, w, record, cw);
    if (!rc) rc = na_function_save(c, cx->q);
    if (!rc) rc = na_function_save(c, cw->q);
    if (rc) return rc;
    if (!(*sv = na_function_data(c, sizeof **sv))) return na_last_status();
    **sv = (fp8_saved){.s = call->s, .record = record, .scale_inv_x = 1.0f / cx->scale,
                       .scale_inv_w = 1.0f / cw->scale};
    if (call->opts) (*sv)->opts = *call->opts;
    (*sv)->dt[0] = xin->dtype, (*sv)->dt[1] = w->dtype;
    (*sv)->dt[2] = b ? b->dtype : NA_DTYPE_F32;
    (*sv)->x_ndim = xin->ndim;
    memcpy((*sv)->x_shape, xin->shape, sizeof(int64_t) * (size_t)xin->ndim);
    trace_call(name, call->s, cx, cw);
    return NA_OK;
}

/* dy cast to grad_output's format (the backward's one cast); *scale_inv its 1 / scale. */
static na_tensor *cast_grad(const fp8_saved *sv, na_tensor *dy, float *scale_inv) {
    fp8_cast cg;
    if (cast_scaled(sv->s, NA_FP8_GRAD_OUTPUT, dy, sv->record, &cg)) return NULL;
    *scale_inv = 1.0f / cg.scale;
    return cg.q;
}

/* ---- Linear -------------------------------------------------------------------------------- */

static int linear_forward(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    const fp8_call *call = na_function_arg(c);
    na_tensor *x = in[0], *w = in[1], *b = in[2];
    int64_t rows = x->numel / w->shape[1], shape[NA_MAX_DIMS];
    na_tensor *x2 = na_reshape(na_contiguous(x), 2, (const int64_t[]){rows, w->shape[1]});
    fp8_cast cx, cw;
    fp8_saved *sv;
    if (!x2) return na_last_status();
    int rc = cast_inputs(c, call, "fp8_linear", x, x2, w, b, &cx, &cw, &sv);
    if (rc) return rc;
    na_tensor *y = na_scaled_mm(cx.q, na_transpose(cw.q, 0, 1), scalar_f32(x, sv->scale_inv_x),
                                scalar_f32(x, sv->scale_inv_w), b, out_dtype());
    for (int i = 0; i < x->ndim - 1; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = w->shape[0];
    out[0] = y ? na_reshape(y, x->ndim, shape) : NULL;
    return out[0] ? NA_OK : na_last_status();
}

/* A gradient in the dtype and shape its input had (gin's contract). */
static na_tensor *as_input(na_tensor *g, na_dtype dt, int ndim, const int64_t *shape) {
    g = as_dtype(g, dt);
    return g ? na_reshape(g, ndim, shape) : NULL;
}

static int linear_backward(na_function_ctx *c, na_tensor *const *gout, na_tensor **gin) {
    const fp8_saved *sv = na_function_data(c, sizeof *sv);
    na_tensor *x8 = na_function_saved(c, 0), *w8 = na_function_saved(c, 1);
    if (!sv || !x8 || !w8) return na_last_status();
    na_tensor *dy = na_reshape(na_contiguous(gout[0]), 2, (const int64_t[]){-1, w8->shape[0]});
    float sg;
    na_tensor *g8 = dy ? cast_grad(sv, dy, &sg) : NULL;
    if (!g8) return na_last_status();
    na_tensor *sg_t = scalar_f32(dy, sg);
    if (na_function_needs_input_grad(c, 0) && /* dx = g8 @ w8 */
        !(gin[0] = as_input(na_scaled_mm(g8, w8, sg_t, scalar_f32(dy, sv->scale_inv_w), NULL,
                                         NA_DTYPE_F32), sv->dt[0], sv->x_ndim, sv->x_shape)))
        return na_last_status();
    if (na_function_needs_input_grad(c, 1) && /* dw = g8^T @ x8 */
        !(gin[1] = as_dtype(na_scaled_mm(na_transpose(g8, 0, 1), x8, sg_t,
                                         scalar_f32(dy, sv->scale_inv_x), NULL, NA_DTYPE_F32),
                            sv->dt[1])))
        return na_last_status();
    if (na_function_needs_input_grad(c, 2) && /* db = the rows of dy summed, in f32 */
        !(gin[2] = as_dtype(na_sum_dim(as_dtype(dy, NA_DTYPE_F32), 0, false), sv->dt[2])))
        return na_last_status();
    return 3;
}

static const na_function fp8_linear_fn = {.name = "fp8_linear", .n_inputs = 3, .n_outputs = 1,
                                          .forward = linear_forward,
                                          .backward = linear_backward};

/* ---- Conv2d ------------------------------------------------------------------------------- */

/* FP8 operands widened to f32: exact, so the f32 convolution sums exact products in f32. The
 * inner ops run in a disabled autocast region, or conv2d's rule would lower them to bf16. */
static na_tensor *widen(na_tensor *q) { return na_cast(q, NA_DTYPE_F32); }

static int conv_forward(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    const fp8_call *call = na_function_arg(c);
    na_tensor *x = in[0], *w = in[1], *b = in[2];
    fp8_cast cx, cw;
    fp8_saved *sv;
    int rc = cast_inputs(c, call, "fp8_conv2d", x, x, w, b, &cx, &cw, &sv);
    if (rc) return rc;
    na_dtype odt = out_dtype();
    na_autocast_begin_disabled();
    /* alpha as na_scaled_mm's: the f32 product of the two scale_inv values */
    na_tensor *y = na_scale(na_conv2d(widen(cx.q), widen(cw.q), NULL, call->opts),
                            (double)(sv->scale_inv_x * sv->scale_inv_w));
    if (y && b)
        y = na_add(y, na_reshape(as_dtype(b, NA_DTYPE_F32), 4,
                                 (const int64_t[]){1, b->shape[0], 1, 1}));
    out[0] = as_dtype(y, odt);
    na_autocast_end();
    return out[0] ? NA_OK : na_last_status();
}

static int conv_backward(na_function_ctx *c, na_tensor *const *gout, na_tensor **gin) {
    const fp8_saved *sv = na_function_data(c, sizeof *sv);
    na_tensor *x8 = na_function_saved(c, 0), *w8 = na_function_saved(c, 1);
    if (!sv || !x8 || !w8) return na_last_status();
    float sg;
    na_tensor *dy = gout[0], *g8 = cast_grad(sv, dy, &sg), *gx = NULL, *gw = NULL;
    bool nx = na_function_needs_input_grad(c, 0), nw = na_function_needs_input_grad(c, 1);
    if (!g8) return na_last_status();
    na_autocast_begin_disabled();
    int rc = na_conv2d_grads(widen(g8), widen(x8), widen(w8), &sv->opts, nx ? &gx : NULL,
                             nw ? &gw : NULL);
    if (!rc && nx && !(gin[0] = as_dtype(na_scale(gx, (double)(sg * sv->scale_inv_w)), sv->dt[0])))
        rc = na_last_status();
    if (!rc && nw && !(gin[1] = as_dtype(na_scale(gw, (double)(sg * sv->scale_inv_x)), sv->dt[1])))
        rc = na_last_status();
    if (!rc && na_function_needs_input_grad(c, 2)) { /* db: dy summed over N, H, W in f32 */
        na_tensor *d3 = na_reshape(na_contiguous(as_dtype(dy, NA_DTYPE_F32)), 3,
                                   (const int64_t[]){dy->shape[0], dy->shape[1], -1});
        na_tensor *db = d3 ? na_sum_dim(na_sum_dim(d3, 2, false), 0, false) : NULL;
        if (!(gin[2] = as_dtype(db, sv->dt[2]))) rc = na_last_status();
    }
    na_autocast_end();
    return rc ? rc : 3;
}

static const na_function fp8_conv2d_fn = {.name = "fp8_conv2d", .n_inputs = 3, .n_outputs = 1,
                                          .forward = conv_forward, .backward = conv_backward};

/* ---- the public calls ------------------------------------------------------------------------ */

static bool check_call(const char *fn, na_tensor *x, na_tensor *w, na_fp8_scaling *s) {
    if (!s) {
        na_set_error(NA_EINVAL, "%s: NULL scaling state", fn);
        return false;
    }
    if (!x || !w) {
        na_set_error(NA_EINVAL, "%s: NULL %s", fn, x ? "weight" : "input");
        return false;
    }
    return true;
}

na_tensor *na_fp8_linear(na_tensor *x, na_tensor *w, na_tensor *b, na_fp8_scaling *s) {
    const char *fn = "na_fp8_linear";
    if (!check_call(fn, x, w, s)) return NULL;
    /* the plain op's checks (shapes, dtypes, devices) first, without running it */
    char s1[NA_DESCRIBE_MAX], s2[NA_DESCRIBE_MAX];
    bool fp8_in = na_dtype_is_fp8(x->dtype) || na_dtype_is_fp8(w->dtype) ||
                  (b && na_dtype_is_fp8(b->dtype));
    if (fp8_in || !na_dtype_is_float(x->dtype) || !na_dtype_is_float(w->dtype) ||
        x->dtype == NA_DTYPE_F64 || w->dtype == NA_DTYPE_F64) {
        na_set_error(NA_EDTYPE, "%s: x and weight must be f32, bf16 or f16 (it casts them to FP8 "
                     "itself), got x %s, weight %s", fn, na_tensor_describe(x, s1, sizeof s1),
                     na_tensor_describe(w, s2, sizeof s2));
        return NULL;
    }
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) || x->device != w->device ||
        (b && b->device != x->device)) {
        na_set_error(NA_ESHAPE, "%s: expected x [.., in], weight [out, in], bias [out] on one "
                     "device; got x %s, weight %s%s", fn, na_tensor_describe(x, s1, sizeof s1),
                     na_tensor_describe(w, s2, sizeof s2), b ? " and a bias" : "");
        return NULL;
    }
    fp8_call call = {.s = s};
    na_tensor *y = na_function_apply1(&fp8_linear_fn, (na_tensor *[]){x, w, b}, &call);
    if (!y) na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
    return y;
}

na_tensor *na_fp8_conv2d(na_tensor *x, na_tensor *w, na_tensor *b, const na_conv2d_opts *opts,
                         na_fp8_scaling *s) {
    const char *fn = "na_fp8_conv2d";
    if (!check_call(fn, x, w, s)) return NULL;
    char s1[NA_DESCRIBE_MAX];
    if (na_dtype_is_fp8(x->dtype) || na_dtype_is_fp8(w->dtype) || x->dtype == NA_DTYPE_F64 ||
        !na_dtype_is_float(x->dtype)) {
        na_set_error(NA_EDTYPE, "%s: x and weight must be f32, bf16 or f16 (it casts them to FP8 "
                     "itself), got x %s", fn, na_tensor_describe(x, s1, sizeof s1));
        return NULL;
    }
    na_conv2d_opts o = opts ? *opts : (na_conv2d_opts){0};
    fp8_call call = {.s = s, .opts = &o};
    na_tensor *y = na_function_apply1(&fp8_conv2d_fn, (na_tensor *[]){x, w, b}, &call);
    if (!y) na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
    return y;
}

/* ---- FP8 autocast regions ------------------------------------------------------------------- */

#define MAX_FP8_REGIONS 16
static _Thread_local int fp8_at[MAX_FP8_REGIONS]; /* the autocast depth each region opened */
static _Thread_local int n_fp8;

int na_fp8_autocast_begin(void) {
    if (n_fp8 == MAX_FP8_REGIONS)
        return na_set_error(NA_ESTATE, "na_fp8_autocast_begin: FP8 regions nest at most %d deep",
                            MAX_FP8_REGIONS);
    int rc = na_autocast_begin(NA_DTYPE_BF16);
    if (rc) return na_set_error(rc, "na_fp8_autocast_begin: %s", na_last_error());
    fp8_at[n_fp8++] = na_autocast_depth();
    return NA_OK;
}

int na_fp8_autocast_end(void) {
    if (!n_fp8 || fp8_at[n_fp8 - 1] != na_autocast_depth())
        return na_set_error(NA_ESTATE, "na_fp8_autocast_end: the innermost autocast region is "
                            "not an FP8 one");
    n_fp8--;
    return na_autocast_end();
}

bool na_fp8_autocast_enabled(void) {
    return n_fp8 && fp8_at[n_fp8 - 1] == na_autocast_depth() && na_autocast_enabled();
}

/* ---- a model's FP8 layers ----------------------------------------------------------------- */

typedef struct {
    na_module *m;
    char *path;
    na_fp8_scaling *s;
} fp8_layer;

struct na_fp8_model {
    int n, cap;
    fp8_layer *layers;
    na_fp8_scaling **scalings; /* layers[i].s, as one array for na_dist_fp8_reduce_amax */
};

/* The forward of an FP8 model's layer (na_affine_fn): FP8 inside an FP8 region. */
static na_tensor *layer_forward(void *ctx, na_tensor *x, na_tensor *w, na_tensor *b,
                                const na_conv2d_opts *opts) {
    na_fp8_scaling *s = ctx;
    if (!na_fp8_autocast_enabled()) return opts ? na_conv2d(x, w, b, opts) : na_linear(x, w, b);
    return opts ? na_fp8_conv2d(x, w, b, opts, s) : na_fp8_linear(x, w, b, s);
}

static int add_layers(na_fp8_model *fm, na_module *m, const char *path,
                      const na_fp8_recipe_cfg *cfg) {
    na_module_kind k = na_module_kind_of(m);
    if (k == NA_MODULE_LINEAR || k == NA_MODULE_CONV2D) {
        if (fm->n == fm->cap) {
            int cap = fm->cap ? 2 * fm->cap : 8;
            fp8_layer *l = realloc(fm->layers, sizeof *l * (size_t)cap);
            na_fp8_scaling **ss = l ? realloc(fm->scalings, sizeof *ss * (size_t)cap) : NULL;
            if (l) fm->layers = l;
            if (!ss) return na_set_error(NA_ENOMEM, "na_fp8_model_new: out of host memory");
            fm->scalings = ss, fm->cap = cap;
        }
        fp8_layer *l = &fm->layers[fm->n];
        *l = (fp8_layer){.m = m, .path = strdup(path), .s = na_fp8_scaling_new(cfg)};
        fm->scalings[fm->n] = l->s;
        if (l->path && l->s) fm->n++;
        if (!l->path || !l->s) {
            free(l->path);
            na_fp8_scaling_free(l->s);
            return l->s ? na_set_error(NA_ENOMEM, "na_fp8_model_new: out of host memory")
                        : na_last_status();
        }
        return na_affine_set_impl(m, layer_forward, l->s);
    }
    for (int i = 0; i < na_module_num_children(m); i++) {
        const char *name;
        na_module *ch = na_module_child_at(m, i, &name);
        char sub[512];
        if (snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", name) >= (int)sizeof sub)
            return na_set_error(NA_EINVAL, "na_fp8_model_new: module path %s.%s is too long",
                                path, name);
        int rc = add_layers(fm, ch, sub, cfg);
        if (rc) return rc;
    }
    return NA_OK;
}

na_fp8_model *na_fp8_model_new(na_module *net, const na_fp8_recipe_cfg *cfg) {
    const char *fn = "na_fp8_model_new";
    na_fp8_recipe_cfg c = cfg ? *cfg : (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS;
    if (!net) {
        na_set_error(NA_EINVAL, "%s: NULL model", fn);
        return NULL;
    }
    if (na_fp8_recipe_check(fn, &c)) return NULL;
    na_fp8_model *fm = calloc(1, sizeof *fm);
    if (!fm) {
        na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
        return NULL;
    }
    if (add_layers(fm, net, "", &c)) {
        na_fp8_model_free(fm);
        return NULL;
    }
    return fm;
}

void na_fp8_model_free(na_fp8_model *fm) {
    if (!fm) return;
    for (int i = 0; i < fm->n; i++) {
        na_affine_set_impl(fm->layers[i].m, NULL, NULL);
        free(fm->layers[i].path);
        na_fp8_scaling_free(fm->layers[i].s);
    }
    free(fm->layers);
    free(fm->scalings);
    free(fm);
}

int na_fp8_model_layers(const na_fp8_model *fm) { return fm ? fm->n : 0; }

na_fp8_scaling *na_fp8_model_layer(const na_fp8_model *fm, int i, const char **path) {
    if (!fm || i < 0 || i >= fm->n) return NULL;
    if (path) *path = fm->layers[i].path;
    return fm->layers[i].s;
}

na_fp8_scaling *const *na_fp8_model_scalings(const na_fp8_model *fm) {
    return fm ? fm->scalings : NULL;
}

int na_fp8_model_update(na_fp8_model *fm) {
    if (!fm) return na_set_error(NA_EINVAL, "na_fp8_model_update: NULL model state");
    for (int i = 0; i < fm->n; i++) {
        int rc = na_fp8_scaling_update(fm->layers[i].s);
        if (rc) return na_set_error(rc, "na_fp8_model_update: layer %s: %s", fm->layers[i].path,
                                    na_last_error());
    }
    return NA_OK;
}

int64_t na_fp8_model_saturated(const na_fp8_model *fm) {
    int64_t n = 0;
    for (int i = 0; fm && i < fm->n; i++)
        for (int r = 0; r < NA_FP8_ROLE_COUNT; r++)
            n += na_fp8_scaling_saturated_total(fm->layers[i].s, (na_fp8_role)r);
    return n;
}

int na_fp8_model_state(na_fp8_model *fm, const char *prefix, na_named_tensors *out) {
    if (!fm || !out) return na_set_error(NA_EINVAL, "na_fp8_model_state: NULL state or output");
    int64_t n0 = out->n;
    for (int i = 0; i < fm->n; i++) {
        char pf[600];
        snprintf(pf, sizeof pf, "%s%s.", prefix ? prefix : "", fm->layers[i].path);
        int rc = na_fp8_scaling_state(fm->layers[i].s, pf, out);
        if (rc) {
            na_named_tensors_truncate(out, n0);
            return rc;
        }
    }
    return NA_OK;
}
