/* FP8 Linear and Conv2d (nanoamp/fp8.h): forward and both backward products against
 * Transformer Engine's computation made in PyTorch (tests/fp8_layers_reference.py: the
 * Linear's by torch._scaled_mm, the Conv2d's by the f64 convolution and torch.nn.grad on the
 * same FP8 tensors), which is the straight-through derivative of the forward; the saturation
 * counts; the FP8 autocast region (what runs in FP8 and in which dtype, the trace's FP8
 * columns); a model's state and updates; bad input. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "fp8_layers_reference.h"
#include "helpers.h"
#include "nanoamp/cuda.h"
#include "nanoamp/fp8.h"

/* fp8_layers_reference.py: value */
static na_tensor *value(int ndim, const int64_t *shape, int seed, double spread) {
    na_tensor *t = na_empty(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape);
    float *d = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        uint32_t h = (uint32_t)((uint64_t)(i + 7919 * seed) * 2654435761u);
        d[i] = (float)(((int64_t)(h >> 20) - 2048) / 2048.0 * spread);
    }
    return t;
}

/* A leaf on dev holding t's values, requiring grad */
static na_tensor *leaf(na_tensor *t, na_device dev) {
    na_tensor *p = na_tensor_new(NA_DTYPE_F32, dev, t->ndim, t->shape);
    cr_assert(p && na_copy_from_host(p, t->data) == NA_OK, "%s", na_last_error());
    p->requires_grad = true;
    return p;
}

/* Each element within the f32 bound of a sum in another order: K * 2^-24 * its magnitude. */
static void expect_close(const char *what, const char *name, const na_tensor *got,
                         const uint32_t *want_bits, const uint32_t *mag_bits, int64_t k) {
    na_tensor *g = na_contiguous(na_to_device(na_cast((na_tensor *)got, NA_DTYPE_F32),
                                              NA_DEVICE_CPU));
    cr_assert_not_null(g, "%s %s: %s", name, what, na_last_error());
    const float *v = g->data;
    double worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < g->numel; i++) {
        float want, mag;
        memcpy(&want, &want_bits[i], 4);
        memcpy(&mag, &mag_bits[i], 4);
        double tol = ldexp((double)k * mag, -24) + 1e-30, err = fabs((double)v[i] - want);
        if (err / tol > worst) worst = err / tol;
        if (err > tol && bad++ < 5)
            cr_log_error("%s %s [%" PRId64 "]: %.9g, torch %.9g (tol %.3g)", name, what, i, v[i],
                         want, tol);
    }
    cr_expect_eq(bad, 0, "%s %s: %d of %" PRId64 " out of tolerance", name, what, bad, g->numel);
    printf("fp8 layer %s %s: worst |got - torch| / tolerance = %.3g\n", name, what, worst);
}

/* Every reference case on dev: the same tolerances on CUDA (its casts are kernels/common's,
 * its products f32 sums in another order). */
static void match_transformer_engine(na_device dev) {
    for (size_t c = 0; c < sizeof na_ref_layer_cases / sizeof na_ref_layer_cases[0]; c++) {
        __typeof__(na_ref_layer_cases[0]) *r = &na_ref_layer_cases[c];
        const int *s = r->shape;
        int64_t xs[4], ws[4], ys[4], kx, kw, kg; /* the products' sum lengths */
        int nd = r->conv ? 4 : 2;
        na_conv2d_opts o = {.padding = {s[6], s[6]}};
        if (r->conv) {
            int oh = s[2] + 2 * s[6] - s[5] + 1, ow = s[3] + 2 * s[6] - s[5] + 1;
            memcpy(xs, (int64_t[]){s[0], s[1], s[2], s[3]}, sizeof xs);
            memcpy(ws, (int64_t[]){s[4], s[1], s[5], s[5]}, sizeof ws);
            memcpy(ys, (int64_t[]){s[0], s[4], oh, ow}, sizeof ys);
            kx = (int64_t)s[1] * s[5] * s[5] + 1, kg = (int64_t)s[4] * s[5] * s[5];
            kw = (int64_t)s[0] * oh * ow;
        } else {
            memcpy(xs, (int64_t[]){s[0], s[1]}, 2 * sizeof *xs);
            memcpy(ws, (int64_t[]){s[2], s[1]}, 2 * sizeof *ws);
            memcpy(ys, (int64_t[]){s[0], s[2]}, 2 * sizeof *ys);
            kx = s[1] + 1, kg = s[2], kw = s[0];
        }
        na_fp8_recipe_cfg rc = NA_FP8_RECIPE_DEFAULTS;
        if (r->current) rc = (na_fp8_recipe_cfg)NA_FP8_RECIPE_CURRENT_DEFAULTS;
        rc.formats = r->e4m3 ? NA_FP8_FORMATS_E4M3 : NA_FP8_FORMATS_HYBRID;
        na_fp8_scaling *fs = na_fp8_scaling_new(&rc);
        int ci = r->case_index;
        na_tensor *x = leaf(value(nd, xs, 4 * ci, r->spread[0]), dev);
        na_tensor *w = leaf(value(nd, ws, 4 * ci + 1, r->spread[1]), dev);
        na_tensor *b = leaf(value(1, (int64_t[]){ws[0]}, 4 * ci + 2, 1.0), dev);
        na_tensor *dy = value(nd, ys, 4 * ci + 3, r->spread[2]);
        if (dev != NA_DEVICE_CPU) dy = na_to_device(dy, dev);
        na_tensor *y = r->conv ? na_fp8_conv2d(x, w, b, &o, fs) : na_fp8_linear(x, w, b, fs);
        cr_assert(y, "%s: %s", r->name, na_last_error());
        cr_expect_eq(y->dtype, NA_DTYPE_F32, "%s: outside autocast the output is f32", r->name);
        expect_close("y", r->name, y, r->y, r->my, kx);
        cr_assert_eq(na_backward(y, dy), NA_OK, "%s: %s", r->name, na_last_error());
        expect_close("dx", r->name, x->grad, r->dx, r->mdx, kg);
        expect_close("dw", r->name, w->grad, r->dw, r->mdw, kw);
        expect_close("db", r->name, b->grad, r->db, r->mdb, kw);
        /* what the casts recorded: the amax of each tensor, and the saturated values */
        cr_expect_eq(na_fp8_scaling_saturated(fs, NA_FP8_INPUT), r->sat_x, "%s", r->name);
        cr_expect_eq(na_fp8_scaling_saturated(fs, NA_FP8_WEIGHT), r->sat_w, "%s", r->name);
        cr_expect_eq(na_fp8_scaling_saturated(fs, NA_FP8_GRAD_OUTPUT), r->sat_g, "%s", r->name);
        cr_expect_eq(na_fp8_scaling_amax(fs, NA_FP8_INPUT), (float)na_item(na_max(na_abs(x))));
        cr_expect_eq(na_fp8_scaling_amax(fs, NA_FP8_GRAD_OUTPUT),
                     (float)na_item(na_max(na_abs(dy))));
        cr_expect(r->sat_x > 0 || r->current, "%s: the delayed cases saturate", r->name);
        na_fp8_scaling_free(fs);
        na_tensor_free(x), na_tensor_free(w), na_tensor_free(b);
        na_step_end();
    }
}

Test(fp8_layers, forward_and_backward_match_transformer_engine) {
    match_transformer_engine(NA_DEVICE_CPU);
}

Test(fp8_layers_cuda, forward_and_backward_match_transformer_engine) {
    if (!na_cuda_available()) cr_skip_test("no CUDA device");
    match_transformer_engine(NA_DEVICE_CUDA);
}

/* The trace's records, kept. */
typedef struct {
    int n_fp8;
    na_amp_trace_fp8 first;
    char line[400];
} seen_trace;

static void keep_fp8(const na_amp_trace_record *r, void *ctx) {
    seen_trace *t = ctx;
    if (!r->fp8) return;
    if (!t->n_fp8++) {
        t->first = *r->fp8;
        na_amp_trace_format(r, t->line, sizeof t->line);
    }
}

Test(fp8_layers, region_runs_the_models_layers_in_fp8) {
    na_manual_seed(3);
    na_module *net = NA_SEQUENTIAL(na_linear_new(12, 8, true), na_relu_new(),
                                   na_linear_new(8, 4, true));
    na_fp8_model *fm = na_fp8_model_new(net, NULL);
    cr_assert(fm, "%s", na_last_error());
    cr_assert_eq(na_fp8_model_layers(fm), 2);
    const char *path;
    cr_assert(na_fp8_model_layer(fm, 1, &path) && !strcmp(path, "2"));
    na_tensor *x = value(2, (int64_t[]){5, 12}, 1, 3.0);
    na_fp8_scaling *l0 = na_fp8_model_layer(fm, 0, NULL);
    /* outside a region: the plain layers, f32, nothing recorded */
    na_tensor *plain = na_module_forward(net, x);
    cr_assert(plain && plain->dtype == NA_DTYPE_F32);
    cr_expect_eq(na_fp8_scaling_amax(l0, NA_FP8_INPUT), 0.0f);
    seen_trace t = {0};
    na_autocast_trace_callback(NA_AMP_TRACE_REGIONS, keep_fp8, &t);
    cr_assert_eq(na_fp8_autocast_begin(), NA_OK);
    cr_expect(na_fp8_autocast_enabled());
    na_tensor *y = na_module_forward(net, x);
    /* a plain op in the region follows the bf16 rules; a disabled region turns FP8 off */
    na_tensor *mm = na_matmul(x, na_transpose(x, 0, 1));
    na_autocast_begin_disabled();
    cr_expect(!na_fp8_autocast_enabled());
    cr_expect_eq(na_fp8_autocast_end(), NA_ESTATE, "closing a region that is not FP8");
    na_autocast_end();
    na_tensor *loss = na_cross_entropy(y, na_zeros(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(5)),
                                       NULL);
    cr_assert_eq(na_fp8_autocast_end(), NA_OK);
    na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    cr_expect(!na_fp8_autocast_enabled());
    cr_assert(y && mm && loss, "%s", na_last_error());
    cr_expect_eq(y->dtype, NA_DTYPE_BF16, "linear's bf16 rule: a bf16 output");
    cr_expect_eq(mm->dtype, NA_DTYPE_BF16);
    cr_expect_eq(loss->dtype, NA_DTYPE_F32, "cross_entropy in f32");
    /* the FP8 output is near the plain one: a few FP8 roundings */
    const float *py = plain->data, *fy = na_cast(y, NA_DTYPE_F32)->data;
    for (int i = 0; i < 20; i++) cr_expect(fabsf(py[i] - fy[i]) < 0.1f + 0.1f * fabsf(py[i]));
    cr_expect_eq(t.n_fp8, 2, "each FP8 layer's trace row has its FP8 columns");
    cr_expect_eq(t.first.dtype[0], NA_DTYPE_F8E4M3);
    cr_expect_eq(t.first.dtype[2], NA_DTYPE_F8E5M2, "hybrid: grad_output in E5M2");
    cr_expect_eq(t.first.scale[0], 1.0f, "delayed scaling's first step: scale 1");
    cr_expect_eq(t.first.amax[0], (float)na_item(na_max(na_abs(x))));
    cr_expect(isnan(t.first.amax[2]), "grad_output's amax is not seen in forward");
    cr_expect(strstr(t.line, "fp8_linear") && strstr(t.line, "fp8 input e4m3 scale 1 amax") &&
              strstr(t.line, "grad_output e5m2 scale 1 amax -") && strstr(t.line, "out bf16"),
              "%s", t.line);
    /* backward records grad_output's amax; update() turns the amax values into scales */
    cr_assert_eq(na_backward(loss, NULL), NA_OK, "%s", na_last_error());
    float gamax = na_fp8_scaling_amax(l0, NA_FP8_GRAD_OUTPUT), xamax = t.first.amax[0];
    cr_expect(gamax > 0);
    cr_assert_eq(na_fp8_model_update(fm), NA_OK);
    cr_expect_eq(na_fp8_scaling_scale(l0, NA_FP8_INPUT), 448.0f / xamax);
    cr_expect_eq(na_fp8_scaling_scale(l0, NA_FP8_GRAD_OUTPUT), 57344.0f / gamax);
    /* the state: each layer's four tensors after its path */
    na_named_tensors st = {0};
    cr_assert_eq(na_fp8_model_state(fm, "fp8.", &st), NA_OK);
    cr_expect_eq(st.n, 8);
    cr_expect_str_eq(st.items[0].name, "fp8.0.amax_history");
    cr_expect_str_eq(st.items[7].name, "fp8.2.updates");
    na_named_tensors_free(&st);
    na_fp8_model_free(fm);
    /* freed: the plain layers again */
    cr_assert_eq(na_fp8_autocast_begin(), NA_OK);
    na_tensor *again = na_module_forward(net, x);
    na_fp8_autocast_end();
    cr_expect(again && again->dtype == NA_DTYPE_BF16);
    na_step_end();
    na_module_free(net);
}

Test(fp8_layers, bad_input) {
    na_fp8_scaling *fs = na_fp8_scaling_new(NULL);
    na_tensor *x = value(2, (int64_t[]){4, 6}, 0, 1.0), *w = value(2, (int64_t[]){3, 6}, 1, 1.0);
    na_tensor *x8 = na_cast(x, NA_DTYPE_F8E4M3);
    cr_expect_null(na_fp8_linear(x8, w, NULL, fs));
    cr_expect(strstr(na_last_error(), "na_fp8_linear") && strstr(na_last_error(), "f8e4m3"),
              "%s", na_last_error());
    cr_expect_null(na_fp8_linear(x, na_transpose(w, 0, 1), NULL, fs)); /* shapes */
    cr_expect(strstr(na_last_error(), "na_fp8_linear"), "%s", na_last_error());
    cr_expect_null(na_fp8_linear(x, w, NULL, NULL));
    cr_expect_null(na_fp8_conv2d(x, w, NULL, NULL, fs));
    cr_expect(strstr(na_last_error(), "na_fp8_conv2d"), "%s", na_last_error());
    cr_expect_eq(na_fp8_autocast_end(), NA_ESTATE);
    cr_expect_null(na_fp8_model_new(NULL, NULL));
    na_fp8_recipe_cfg bad = NA_FP8_RECIPE_DEFAULTS;
    bad.amax_history_len = 0;
    na_module *net = na_linear_new(2, 2, false);
    cr_expect_null(na_fp8_model_new(net, &bad));
    cr_expect(strstr(na_last_error(), "amax_history_len"), "%s", na_last_error());
    na_module_free(net);
    na_fp8_scaling_free(fs);
    na_step_end();
}
