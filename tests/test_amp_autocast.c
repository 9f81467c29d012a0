/* Autocast beyond the basics (tests/test_autocast.c): every op of the table under f16 and bf16
 * against PyTorch's lists, bit-for-bit against hand-cast inputs with autocast off (PyTorch's
 * _run_autocast_outofplace), nesting and disabled regions, the weight-cast cache, ignored
 * types, BatchNorm with half input and f32 parameters, the rule table (listing, overriding),
 * the trace (API and NANOAMP_AMP_TRACE) and the device checks. */
#include "op_cases.h"

#include "nanoamp/cuda.h"
#include "nanoamp/nn.h"

static void teardown(void) {
    while (na_autocast_depth() > 0) na_autocast_end();
    na_autocast_reset_rules();
    na_step_end();
}
TestSuite(amp_autocast, .fini = teardown);

/* ---- one call per op
 * --------------------------------------------------------------------------------- Values are
 * drawn in f32 from a fixed seed, stored as `store`, then cast to `compute` (the control's hand
 * cast; equal to store under autocast). */

static na_tensor *mk(na_dtype store, na_dtype compute, int ndim, const int64_t *shape, double lo,
                     double hi) {
    na_tensor *t = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, lo, hi));
    t = TH_OK(na_cast(t, store));
    return TH_OK(na_cast(t, compute));
}
#define X23(s, c) mk(s, c, NA_SHAPE(2, 3), -1, 1)

typedef na_tensor *(*op_fn)(na_dtype store, na_dtype compute);

static na_tensor *f_matmul(na_dtype s, na_dtype c) {
    return na_matmul(X23(s, c), mk(s, c, NA_SHAPE(3, 4), -1, 1));
}
static na_tensor *f_linear(na_dtype s, na_dtype c) {
    return na_linear(X23(s, c), mk(s, c, NA_SHAPE(4, 3), -1, 1), mk(s, c, NA_SHAPE(4), -1, 1));
}
static na_tensor *f_sum(na_dtype s, na_dtype c) { return na_sum(X23(s, c)); }
static na_tensor *f_mean(na_dtype s, na_dtype c) { return na_mean(X23(s, c)); }
static na_tensor *f_max(na_dtype s, na_dtype c) { return na_max(X23(s, c)); }
static na_tensor *f_argmax(na_dtype s, na_dtype c) { return na_argmax(X23(s, c), 1, false); }
static na_tensor *f_softmax(na_dtype s, na_dtype c) { return na_softmax(X23(s, c)); }
static na_tensor *f_log_softmax(na_dtype s, na_dtype c) { return na_log_softmax(X23(s, c)); }
static na_tensor *f_cross_entropy(na_dtype s, na_dtype c) {
    na_tensor *labels = TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 2, 0);
    return na_cross_entropy(X23(s, c), labels, NULL);
}
static na_tensor *f_mse_loss(na_dtype s, na_dtype c) {
    return na_mse_loss(X23(s, c), X23(s, c), NA_REDUCTION_MEAN);
}
static na_tensor *f_dropout(na_dtype s, na_dtype c) { return na_dropout(X23(s, c), 0.5, true); }
static na_tensor *f_cast(na_dtype s, na_dtype c) { return na_cast(X23(s, c), NA_DTYPE_F64); }
static na_tensor *f_to_device(na_dtype s, na_dtype c) {
    return na_to_device(X23(s, c), NA_DEVICE_CPU);
}
static na_tensor *f_reshape(na_dtype s, na_dtype c) {
    return na_reshape(X23(s, c), NA_SHAPE(3, 2));
}
static na_tensor *f_permute(na_dtype s, na_dtype c) {
    return na_permute(X23(s, c), (const int[]){1, 0});
}
static na_tensor *f_slice(na_dtype s, na_dtype c) { return na_slice(X23(s, c), 0, 1); }
static na_tensor *f_contiguous(na_dtype s, na_dtype c) {
    return na_contiguous(na_transpose(X23(s, c), 0, 1));
}
static na_tensor *f_pad(na_dtype s, na_dtype c) { return na_pad_dim(X23(s, c), 1, 2, 1); }
static na_tensor *f_conv2d(na_dtype s, na_dtype c) {
    return na_conv2d(mk(s, c, NA_SHAPE(1, 2, 4, 4), -1, 1), mk(s, c, NA_SHAPE(3, 2, 3, 3), -1, 1),
                     mk(s, c, NA_SHAPE(3), -1, 1), &(na_conv2d_opts){.padding = {1, 1}});
}
typedef na_tensor *(*bn_fn)(na_tensor *, na_tensor *, na_tensor *, na_tensor *, na_tensor *,
                            bool, double, double);
static na_tensor *call_bn(bn_fn bn, na_dtype s, na_dtype c) {
    na_tensor *x = mk(s, c, NA_SHAPE(2, 3, 2, 2), -1, 1);
    na_tensor *w = mk(NA_DTYPE_F32, NA_DTYPE_F32, NA_SHAPE(3), 0.5, 1.5);
    na_tensor *b = mk(NA_DTYPE_F32, NA_DTYPE_F32, NA_SHAPE(3), -1, 1);
    na_tensor *rm = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    na_tensor *rv = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    return bn(x, rm, rv, w, b, true, 0.1, 1e-5);
}
static na_tensor *f_batch_norm(na_dtype s, na_dtype c) { return call_bn(na_batch_norm, s, c); }
static na_tensor *f_batch_norm_relu(na_dtype s, na_dtype c) {
    return call_bn(na_batch_norm_relu, s, c);
}
static na_tensor *f_max_pool2d(na_dtype s, na_dtype c) {
    return na_max_pool2d(mk(s, c, NA_SHAPE(1, 2, 4, 4), -1, 1),
                         &(na_pool2d_opts){.kernel = {2, 2}});
}
static na_tensor *f_avg_pool2d(na_dtype s, na_dtype c) {
    return na_avg_pool2d(mk(s, c, NA_SHAPE(1, 2, 4, 4), -1, 1),
                         &(na_pool2d_opts){.kernel = {2, 2}, .count_include_pad = true});
}

/* The call of each op that is not elementwise (elementwise ones come from their row in
 * tests/op_cases.c); the expected rule and fixed outputs are in the rows too. */
static const op_fn custom_calls[NA_OP_COUNT] = {
    [NA_OP_MATMUL] = f_matmul,
    [NA_OP_LINEAR] = f_linear,
    [NA_OP_SUM] = f_sum,
    [NA_OP_MEAN] = f_mean,
    [NA_OP_MAX] = f_max,
    [NA_OP_ARGMAX] = f_argmax,
    [NA_OP_SOFTMAX] = f_softmax,
    [NA_OP_LOG_SOFTMAX] = f_log_softmax,
    [NA_OP_CROSS_ENTROPY] = f_cross_entropy,
    [NA_OP_MSE_LOSS] = f_mse_loss,
    [NA_OP_DROPOUT] = f_dropout,
    [NA_OP_CAST] = f_cast,
    [NA_OP_TO_DEVICE] = f_to_device,
    [NA_OP_RESHAPE] = f_reshape,
    [NA_OP_PERMUTE] = f_permute,
    [NA_OP_SLICE] = f_slice,
    [NA_OP_CONTIGUOUS] = f_contiguous,
    [NA_OP_PAD] = f_pad,
    [NA_OP_CONV2D] = f_conv2d,
    [NA_OP_BATCH_NORM] = f_batch_norm,
    [NA_OP_BATCH_NORM_RELU] = f_batch_norm_relu,
    [NA_OP_MAX_POOL2D] = f_max_pool2d,
    [NA_OP_AVG_POOL2D] = f_avg_pool2d,
};

/* An elementwise op on [2, 3] inputs drawn from its row's range (magnitudes), with its
 * first argument variant. */
static na_tensor *run_elementwise(const oc_case *c, na_dtype s, na_dtype cd) {
    na_tensor *in[2];
    for (int i = 0; i < (c->kind == OC_BINARY ? 2 : 1); i++) {
        oc_range r = oc_range_of(c, i);
        in[i] = mk(s, cd, NA_SHAPE(2, 3), r.lo, r.hi);
    }
    return oc_call(c, in, oc_arg(c, 0));
}

static na_tensor *run(na_op op, na_dtype store, na_dtype compute) {
    const oc_case *c = oc_case_of(op);
    na_manual_seed(11);
    if (c->kind != OC_CUSTOM) return run_elementwise(c, store, compute);
    cr_assert_not_null(custom_calls[op], "op %s has no autocast call: add one here",
                       na_op_name(op));
    return custom_calls[op](store, compute);
}

static void expect_same(const na_tensor *a, const na_tensor *b, const char *what) {
    cr_assert_eq(a->dtype, b->dtype, "%s: dtype %s vs %s", what, na_dtype_name(a->dtype),
                 na_dtype_name(b->dtype));
    cr_assert_eq(a->numel, b->numel, "%s", what);
    for (int64_t i = 0; i < a->numel; i++) {
        double x = na_get(a, i), y = na_get(b, i);
        cr_assert(x == y || (isnan(x) && isnan(y)), "%s: element %lld: %.9g vs %.9g", what,
                  (long long)i, x, y);
    }
}

/* Every op: the table's rule is PyTorch's, the output dtype follows it under f16 and bf16 for
 * f32, f16 and bf16 inputs, and the result equals (bit for bit) the op run without autocast on
 * inputs cast by hand. An op added to the table without a case here fails. */
Test(amp_autocast, every_op_under_f16_and_bf16) {
    na_dtype regions[] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    na_dtype stores[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int op = 0; op < NA_OP_COUNT; op++) {
        const oc_case *c = oc_case_of(op);
        cr_assert_eq(na_op_default_amp_rule(op), c->rule, "op %s: rule %s, PyTorch's is %s",
                     na_op_name(op), na_amp_rule_name(na_op_default_amp_rule(op)),
                     na_amp_rule_name(c->rule));
        for (int r = 0; r < 2; r++)
            for (int s = 0; s < 3; s++) {
                na_dtype region = regions[r], store = stores[s];
                na_dtype target = c->rule == NA_AMP_LOWER ? region
                                  : c->rule == NA_AMP_FP32 ? NA_DTYPE_F32
                                                           : store;
                na_dtype want = c->ac_out_fixed ? c->ac_out : target;
                char what[96];
                snprintf(what, sizeof what, "%s in a %s region on %s inputs", na_op_name(op),
                         na_dtype_name(region), na_dtype_name(store));
                TH_RC(na_autocast_begin(region));
                na_tensor *got = run(op, store, store);
                TH_RC(na_autocast_end());
                cr_assert_not_null(got, "%s: %s", what, na_last_error());
                cr_assert_eq(got->dtype, want, "%s: output %s, expected %s", what,
                             na_dtype_name(got->dtype), na_dtype_name(want));
                na_tensor *control = run(op, store, target);
                cr_assert_not_null(control, "%s (control): %s", what, na_last_error());
                expect_same(got, control, what);
                na_step_end();
            }
    }
}

/* f16 inputs to f32-rule ops give f32 (softmax/sum on half return float). */
Test(amp_autocast, half_inputs_to_fp32_ops_give_f32) {
    na_op ops[] = {NA_OP_EXP, NA_OP_LOG, NA_OP_RSQRT, NA_OP_POW, NA_OP_SUM,
                   NA_OP_SOFTMAX, NA_OP_LOG_SOFTMAX, NA_OP_CROSS_ENTROPY, NA_OP_MSE_LOSS};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        TH_RC(na_autocast_begin(NA_DTYPE_F16));
        na_tensor *y = run(ops[i], NA_DTYPE_F16, NA_DTYPE_F16);
        TH_RC(na_autocast_end());
        cr_assert_not_null(y);
        cr_assert_eq(y->dtype, NA_DTYPE_F32, "%s on f16 gave %s", na_op_name(ops[i]),
                     na_dtype_name(y->dtype));
    }
}

/* mean is in no PyTorch list: an f16 mean stays f16 (PyTorch's mean on half returns half),
 * accumulated in f32 and rounded once. */
Test(amp_autocast, mean_of_f16_stays_f16_accumulated_in_f32) {
    na_manual_seed(5);
    na_tensor *x = TH_OK(na_cast(TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1000), 0, 1)),
                                 NA_DTYPE_F16));
    double sum = 0;
    for (int64_t i = 0; i < x->numel; i++) sum += na_get(x, i);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *m = TH_OK(na_mean(x));
    TH_RC(na_autocast_end());
    cr_assert_eq(m->dtype, NA_DTYPE_F16);
    cr_assert_eq(na_get(m, 0), th_round_f16(sum / 1000), "mean %.8g, f16 of the exact %.8g",
                 na_get(m, 0), sum / 1000);
}

Test(amp_autocast, promote_mixed_inputs_to_the_widest) {
    na_tensor *h = TH_TENSOR(NA_DTYPE_F16, NA_SHAPE(2), 1, 2);
    na_tensor *b = TH_TENSOR(NA_DTYPE_BF16, NA_SHAPE(2), 1, 2);
    na_tensor *f = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 1, 2);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    cr_assert_eq(TH_OK(na_add(h, f))->dtype, NA_DTYPE_F32);
    cr_assert_eq(TH_OK(na_mul(h, h))->dtype, NA_DTYPE_F16);
    cr_assert_eq(TH_OK(na_sub(h, b))->dtype, NA_DTYPE_F32);
    cr_assert_eq(TH_OK(na_div(b, b))->dtype, NA_DTYPE_BF16);
    TH_RC(na_autocast_end());
}

/* test_autocast_ignored_types: f64 and integers are never cast; a lower-precision op mixing
 * f64 with f16 fails. */
Test(amp_autocast, f64_and_integers_are_never_cast) {
    na_tensor *d = TH_TENSOR(NA_DTYPE_F64, NA_SHAPE(2, 2), 1, 2, 3, 4);
    na_tensor *h = TH_TENSOR(NA_DTYPE_F16, NA_SHAPE(2, 2), 1, 2, 3, 4);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    cr_assert_eq(TH_OK(na_matmul(d, d))->dtype, NA_DTYPE_F64);
    cr_assert_eq(TH_OK(na_softmax(d))->dtype, NA_DTYPE_F64);
    cr_assert_eq(TH_OK(na_sum(d))->dtype, NA_DTYPE_F64);
    cr_assert_eq(TH_OK(na_add(d, d))->dtype, NA_DTYPE_F64);
    na_tensor *labels = TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 1, 0);
    na_tensor *ce = TH_OK(na_cross_entropy(h, labels, NULL));
    cr_assert_eq(ce->dtype, NA_DTYPE_F32);
    cr_assert_eq(labels->dtype, NA_DTYPE_I32);
    TH_EXPECT_ERROR(na_matmul(d, h), NA_EDTYPE, "f64", "f16");
    TH_RC(na_autocast_end());
}

/* ---- regions --------------------------------------------------------------------------------- */

Test(amp_autocast, nesting_and_disabled_regions) {
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1));
    na_tensor *w = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3), -1, 1));
    cr_assert(!na_autocast_enabled());
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *h = TH_OK(na_linear(x, w, NULL));
    cr_assert_eq(h->dtype, NA_DTYPE_F16);
    TH_RC(na_autocast_begin(NA_DTYPE_BF16)); /* the inner dtype wins */
    cr_assert_eq(TH_OK(na_linear(x, w, NULL))->dtype, NA_DTYPE_BF16);
    TH_RC(na_autocast_begin_disabled()); /* nothing is cast in here */
    cr_assert(!na_autocast_enabled());
    cr_assert_eq(na_autocast_depth(), 3);
    cr_assert_eq(TH_OK(na_linear(x, w, NULL))->dtype, NA_DTYPE_F32);
    cr_assert_eq(TH_OK(na_softmax(h))->dtype, NA_DTYPE_F16); /* f16 from outside stays f16 */
    na_tensor *w2 = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(5, 4), -1, 1));
    TH_EXPECT_ERROR(na_linear(h, w2, NULL), NA_EDTYPE, "dtypes differ"); /* .float() it */
    cr_assert_eq(TH_OK(na_linear(TH_OK(na_cast(h, NA_DTYPE_F32)), w2, NULL))->dtype, NA_DTYPE_F32);
    TH_RC(na_autocast_end());
    cr_assert(na_autocast_enabled());
    cr_assert_eq(na_autocast_dtype(), NA_DTYPE_BF16);
    TH_RC(na_autocast_end());
    cr_assert_eq(TH_OK(na_linear(x, w, NULL))->dtype, NA_DTYPE_F16); /* re-entered: no casts */
    TH_RC(na_autocast_end());
    cr_assert(!na_autocast_enabled());
    TH_EXPECT_STATUS(na_autocast_end(), NA_ESTATE, "no autocast region");
    TH_EXPECT_STATUS(na_autocast_begin(NA_DTYPE_F32), NA_EDTYPE, "f16 or bf16");
}

/* test_cast_cache_is_global: one cast per weight per region, across several uses and
 * forwards; gradients reach the f32 weight in f32; the cache is dropped when the outermost
 * region ends. */
Test(amp_autocast, weight_cast_cache) {
    na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3));
    TH_RC(na_init_uniform_(w, -1, 1));
    TH_RC(na_tensor_set_requires_grad(w, true));
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1));
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *y1 = TH_OK(na_linear(x, w, NULL));
    na_tensor *y2 = TH_OK(na_linear(x, w, NULL));
    TH_RC(na_autocast_begin(NA_DTYPE_F16)); /* nested: same cache */
    na_tensor *y3 = TH_OK(na_matmul(x, TH_OK(na_transpose(w, 0, 1))));
    TH_RC(na_autocast_end());
    cr_assert_eq(na_autocast_cache_casts(), 1, "casts: %llu",
                 (unsigned long long)na_autocast_cache_casts());
    na_tensor *loss = TH_OK(na_add(TH_OK(na_sum(y1)), TH_OK(na_sum(y2))));
    TH_RC(na_autocast_end());
    cr_assert_eq(na_autocast_cache_casts(), 0, "cleared at the end of the outermost region");
    (void)y3;
    TH_RC(na_backward(loss, NULL));
    cr_assert_not_null(w->grad);
    cr_assert_eq(w->grad->dtype, NA_DTYPE_F32);
    /* d/dw of 2*sum(x w^T) = 2 * column sums of x, computed in f16 and widened */
    for (int o = 0; o < 4; o++)
        for (int i = 0; i < 3; i++) {
            double col = th_round_f16(na_get(x, i)) + th_round_f16(na_get(x, 3 + i));
            cr_assert(fabs(na_get(w->grad, o * 3 + i) - 2 * th_round_f16(col)) < 1e-3,
                      "grad[%d,%d] = %g", o, i, na_get(w->grad, o * 3 + i));
        }
    /* a new region casts again */
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    TH_OK(na_linear(x, w, NULL));
    cr_assert_eq(na_autocast_cache_casts(), 1);
    TH_RC(na_autocast_end());
    na_tensor_free(w);
}

/* ---- BatchNorm with half input --------------------------------------------------------------- */

/* test_batchnorm_nonaffine_cuda_half_input / cudnn_batch_norm: f16/bf16 input with f32 weight,
 * bias and running statistics gives the input's dtype; in backward the input gradient has the
 * input's dtype and the parameter gradients f32; the statistics are updated in f32. */
Test(amp_autocast, batch_norm_half_input_f32_params) {
    na_dtype dts[] = {NA_DTYPE_F16, NA_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        na_manual_seed(3);
        na_module *bn = na_batch_norm2d_new(3, NULL);
        cr_assert_not_null(bn);
        na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3, 2, 2), -2, 2));
        na_tensor *xh = TH_OK(na_cast(x, dts[d]));
        TH_RC(na_tensor_set_requires_grad(xh, true));
        na_tensor *y = TH_OK(na_module_forward(bn, xh));
        cr_assert_eq(y->dtype, dts[d]);
        /* against f32 batch norm of the same (rounded) values, rounded once */
        na_module *bn32 = na_batch_norm2d_new(3, NULL);
        cr_assert_not_null(bn32);
        na_tensor *y32 = TH_OK(na_module_forward(bn32, TH_OK(na_cast(xh, NA_DTYPE_F32))));
        for (int64_t i = 0; i < y->numel; i++)
            cr_assert_eq(na_get(y, i), th_round(dts[d], na_get(y32, i)), "y[%lld]", (long long)i);
        na_tensor *rm = na_module_get(bn, "running_mean"),
                  *rm32 = na_module_get(bn32, "running_mean");
        cr_assert_eq(rm->dtype, NA_DTYPE_F32);
        for (int c = 0; c < 3; c++) cr_assert_eq(na_get(rm, c), na_get(rm32, c));
        TH_RC(na_backward(TH_OK(na_sum(y)), NULL));
        cr_assert_eq(xh->grad->dtype, dts[d]);
        cr_assert_eq(na_module_get(bn, "weight")->grad->dtype, NA_DTYPE_F32);
        cr_assert_eq(na_module_get(bn, "bias")->grad->dtype, NA_DTYPE_F32);
        /* under autocast, and in eval mode */
        TH_RC(na_autocast_begin(dts[d]));
        cr_assert_eq(TH_OK(na_module_forward(bn, xh))->dtype, dts[d]);
        na_module_eval(bn);
        cr_assert_eq(TH_OK(na_module_forward(bn, xh))->dtype, dts[d]);
        TH_RC(na_autocast_end());
        na_module_free(bn);
        na_module_free(bn32);
        na_step_end();
    }
}

/* ---- the rule table -------------------------------------------------------------------------- */

Test(amp_autocast, override_one_rule_and_list_the_table) {
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1));
    na_tensor *w = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 2), -1, 1));
    TH_RC(na_autocast_set_rule(NA_OP_MATMUL, NA_AMP_FP32));
    cr_assert_eq(na_autocast_rule(NA_OP_MATMUL), NA_AMP_FP32);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    cr_assert_eq(TH_OK(na_matmul(x, w))->dtype, NA_DTYPE_F32);
    TH_RC(na_autocast_set_rule(NA_OP_RELU, NA_AMP_LOWER));
    cr_assert_eq(TH_OK(na_relu(x))->dtype, NA_DTYPE_F16);
    TH_RC(na_autocast_end());
    TH_EXPECT_STATUS(na_autocast_set_rule(NA_OP_BATCH_NORM, NA_AMP_FP32), NA_EINVAL,
                     "batch_norm always runs in its input's dtype");
    TH_EXPECT_STATUS(na_autocast_set_rule(NA_OP_COUNT, NA_AMP_FP32), NA_EINVAL, "unknown op");

    FILE *f = tmpfile();
    na_autocast_print_rules(f);
    rewind(f);
    char line[256];
    int lines = 0;
    bool saw_matmul = false, saw_linear = false, saw_bn = false;
    while (fgets(line, sizeof line, f)) {
        lines++;
        if (strstr(line, "matmul") == line)
            saw_matmul = strstr(line, "fp32") && strstr(line, "(overridden)");
        if (strstr(line, "linear") == line) saw_linear = strstr(line, "lower") != NULL;
        if (strstr(line, "batch_norm") == line) saw_bn = strstr(line, "(fixed)") != NULL;
    }
    fclose(f);
    cr_assert_eq(lines, NA_OP_COUNT + 1);
    cr_assert(saw_matmul && saw_linear && saw_bn);
    na_autocast_reset_rules();
    cr_assert_eq(na_autocast_rule(NA_OP_MATMUL), NA_AMP_LOWER);
}

/* ---- the trace ------------------------------------------------------------------------------- */


Test(amp_autocast, trace_records_each_op) {
    th_trace_log log = {0};
    na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 3));
    na_tensor *b = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4));
    TH_RC(na_tensor_set_requires_grad(w, true));
    TH_RC(na_tensor_set_requires_grad(b, true));
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1));
    na_tensor *labels = TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 1, 0);
    na_autocast_trace_callback(NA_AMP_TRACE_REGIONS, th_trace_collect, &log);
    TH_OK(na_relu(x)); /* outside any region: not traced */
    cr_assert_eq(log.n, 0);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *y = TH_OK(na_linear(x, w, b));
    TH_OK(na_cross_entropy(y, labels, NULL));
    TH_RC(na_autocast_end());
    na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    /* linear: three casts (x, w, b) nested, then the op */
    cr_assert(log.n >= 4, "%d records", log.n);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(log.r[i].op, NA_OP_CAST);
        cr_assert_eq(log.r[i].nesting, 1);
        cr_assert_eq(log.r[i].in[0], NA_DTYPE_F32);
        cr_assert_eq(log.r[i].out, NA_DTYPE_F16);
    }
    const na_amp_trace_record *lin = &log.r[3];
    cr_assert_eq(lin->op, NA_OP_LINEAR);
    cr_assert_eq(lin->n_inputs, 3);
    for (int i = 0; i < 3; i++) cr_assert_eq(lin->in[i], NA_DTYPE_F32, "input %d", i);
    cr_assert_eq(lin->rule, NA_AMP_LOWER);
    cr_assert_eq(lin->compute, NA_DTYPE_F16);
    cr_assert_eq(lin->out, NA_DTYPE_F16);
    cr_assert_eq(lin->nesting, 0);
    cr_assert(lin->region && lin->enabled);
    const na_amp_trace_record *ce = &log.r[log.n - 1];
    cr_assert_eq(ce->op, NA_OP_CROSS_ENTROPY);
    cr_assert_eq(ce->in[0], NA_DTYPE_F16);
    cr_assert_eq(ce->in[1], NA_DTYPE_I32);
    cr_assert_eq(ce->rule, NA_AMP_FP32);
    cr_assert_eq(ce->compute, NA_DTYPE_F32);
    cr_assert_eq(ce->out, NA_DTYPE_F32);
    char line[160];
    na_amp_trace_format(lin, line, sizeof line);
    cr_assert(strstr(line, "linear") == line, "%s", line);
    cr_assert(strstr(line, "in f32,f32,f32") && strstr(line, "rule lower") &&
              strstr(line, "compute f16") && strstr(line, "out f16"), "%s", line);
    na_tensor_free(w);
    na_tensor_free(b);
}

Test(amp_autocast, trace_disabled_region_and_all_mode) {
    th_trace_log log = {0};
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1));
    na_autocast_trace_callback(NA_AMP_TRACE_ALL, th_trace_collect, &log);
    TH_OK(na_exp(x));
    cr_assert_eq(log.n, 1);
    cr_assert(!log.r[0].region);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    TH_RC(na_autocast_begin_disabled());
    TH_OK(na_matmul(x, TH_OK(na_transpose(x, 0, 1))));
    TH_RC(na_autocast_end());
    TH_RC(na_autocast_end());
    na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    const na_amp_trace_record *mm = &log.r[log.n - 1];
    cr_assert_eq(mm->op, NA_OP_MATMUL);
    cr_assert(mm->region && !mm->enabled);
    cr_assert_eq(mm->compute, NA_DTYPE_F32);
    char line[160];
    cr_assert(strstr(na_amp_trace_format(mm, line, sizeof line), "rule off"), "%s", line);
}

static const na_amp_trace_record *last_of(const th_trace_log *l, na_op op) {
    for (int i = l->n - 1; i >= 0; i--)
        if (l->r[i].op == op) return &l->r[i];
    cr_assert_fail("no %s record", na_op_name(op));
    return NULL;
}

/* The trace says where an op really computes: BatchNorm's math is f32 (f32 statistics and
 * parameters) on f16 input and output; matrix products and convolutions take f16 inputs and
 * accumulate in f32, reductions of f16 too; elementwise ops have nothing to accumulate. */
Test(amp_autocast, trace_says_where_ops_compute) {
    th_trace_log log = {0};
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 2, 4, 4), -1, 1));
    na_tensor *w = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 2, 3, 3), -1, 1));
    na_tensor *g = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    na_tensor *rm = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    na_tensor *rv = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3)));
    na_autocast_trace_callback(NA_AMP_TRACE_REGIONS, th_trace_collect, &log);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *y = TH_OK(na_conv2d(x, w, NULL, NULL));
    y = TH_OK(na_batch_norm(y, rm, rv, g, NULL, true, 0.1, 1e-5));
    y = TH_OK(na_relu(y));
    TH_OK(na_mean(y));
    TH_RC(na_autocast_end());
    na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    char line[160];
    const na_amp_trace_record *conv = last_of(&log, NA_OP_CONV2D);
    cr_assert_eq(conv->compute, NA_DTYPE_F16);
    cr_assert_eq(conv->accumulate, NA_DTYPE_F32);
    na_amp_trace_format(conv, line, sizeof line);
    cr_assert(strstr(line, "compute f16") && strstr(line, "out f16") && strstr(line, "acc f32"),
              "%s", line);
    const na_amp_trace_record *bn = last_of(&log, NA_OP_BATCH_NORM);
    cr_assert_eq(bn->in[0], NA_DTYPE_F16);
    cr_assert_eq(bn->compute, NA_DTYPE_F32, "BatchNorm computes in %s",
                 na_dtype_name(bn->compute));
    cr_assert_eq(bn->out, NA_DTYPE_F16);
    na_amp_trace_format(bn, line, sizeof line);
    cr_assert(strstr(line, "in f16,f32,") && strstr(line, "compute f32") &&
              strstr(line, "out f16") && !strstr(line, "acc"), "%s", line);
    const na_amp_trace_record *relu = last_of(&log, NA_OP_RELU);
    cr_assert_eq(relu->compute, NA_DTYPE_F16);
    cr_assert_eq(relu->accumulate, NA_DTYPE_COUNT, "relu sums nothing");
    const na_amp_trace_record *mean = last_of(&log, NA_OP_MEAN);
    cr_assert_eq(mean->rule, NA_AMP_AS_IS);
    cr_assert_eq(mean->compute, NA_DTYPE_F16);
    cr_assert_eq(mean->accumulate, NA_DTYPE_F32);
    cr_assert_eq(mean->out, NA_DTYPE_F16);
}

/* Binary ops promote natively (rule as_is): the cast of the narrower input is reported nested
 * under the op, whose inputs are shown as given; a 0-dim f32 input is cast down instead. */
Test(amp_autocast, trace_of_native_promotion) {
    th_trace_log log = {0};
    na_tensor *h = TH_OK(na_cast(TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1)),
                                 NA_DTYPE_F16));
    na_tensor *f = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1));
    na_tensor *s = TH_OK(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 2.0));
    na_autocast_trace_callback(NA_AMP_TRACE_REGIONS, th_trace_collect, &log);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    TH_OK(na_add(h, f));
    TH_OK(na_mul(h, s));
    TH_RC(na_autocast_end());
    na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    cr_assert_eq(log.n, 4, "%d records", log.n);
    cr_assert_eq(log.r[0].op, NA_OP_CAST);
    cr_assert_eq(log.r[0].nesting, 1);
    cr_assert_eq(log.r[0].in[0], NA_DTYPE_F16);
    cr_assert_eq(log.r[0].out, NA_DTYPE_F32);
    const na_amp_trace_record *add = &log.r[1];
    cr_assert_eq(add->op, NA_OP_ADD);
    cr_assert_eq(add->nesting, 0);
    cr_assert_eq(add->rule, NA_AMP_AS_IS);
    cr_assert_eq(add->in[0], NA_DTYPE_F16);
    cr_assert_eq(add->in[1], NA_DTYPE_F32);
    cr_assert_eq(add->compute, NA_DTYPE_F32);
    cr_assert_eq(log.r[2].op, NA_OP_CAST);
    cr_assert_eq(log.r[2].nesting, 1);
    cr_assert_eq(log.r[2].out, NA_DTYPE_F16, "the 0-dim f32 scalar is cast to f16");
    const na_amp_trace_record *mul = &log.r[3];
    cr_assert_eq(mul->op, NA_OP_MUL);
    cr_assert_eq(mul->compute, NA_DTYPE_F16);
    cr_assert_eq(mul->out, NA_DTYPE_F16);
}

/* NANOAMP_AMP_TRACE=1 traces regions to stderr with no API call. */
Test(amp_autocast, trace_from_the_environment) {
    char path[] = "/tmp/amp_trace_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    setenv("NANOAMP_AMP_TRACE", "1", 1);
    cr_assert_eq(na_autocast_trace_mode(), NA_AMP_TRACE_REGIONS);
    FILE *saved = stderr;
    FILE *f = fopen(path, "w");
    stderr = f;
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), -1, 1));
    TH_RC(na_autocast_begin(NA_DTYPE_BF16));
    TH_OK(na_softmax(TH_OK(na_matmul(x, TH_OK(na_transpose(x, 0, 1))))));
    TH_RC(na_autocast_end());
    stderr = saved;
    fclose(f);
    f = fopen(path, "r");
    char buf[2048] = {0};
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    remove(path);
    cr_assert(got > 0);
    cr_assert(strstr(buf, "amp: matmul"), "%s", buf);
    cr_assert(strstr(buf, "compute bf16"), "%s", buf);
    cr_assert(strstr(buf, "amp: softmax") && strstr(buf, "rule fp32"), "%s", buf);
}

/* ---- devices --------------------------------------------------------------------------------- */

Test(amp_autocast, device_checks) {
    TH_RC(na_autocast_check_device(NA_DEVICE_CPU, NA_DTYPE_BF16));
    TH_RC(na_autocast_check_device(NA_DEVICE_CPU, NA_DTYPE_F16));
    TH_EXPECT_STATUS(na_autocast_check_device(NA_DEVICE_CPU, NA_DTYPE_F32), NA_EDTYPE,
                     "f16 or bf16");
    if (!na_cuda_available()) {
        TH_EXPECT_STATUS(na_autocast_begin_device(NA_DEVICE_CUDA, NA_DTYPE_F16), NA_EDEVICE,
                         "no CUDA device");
        cr_assert_eq(na_autocast_depth(), 0);
    } else if (!na_cuda_bf16_supported()) {
        TH_EXPECT_STATUS(na_autocast_begin_device(NA_DEVICE_CUDA, NA_DTYPE_BF16), NA_EDTYPE,
                         "Current CUDA Device does not support bfloat16. Please switch dtype to "
                         "float16.");
    } else {
        TH_RC(na_autocast_begin_device(NA_DEVICE_CUDA, NA_DTYPE_BF16));
        TH_RC(na_autocast_end());
    }
}

Test(amp_autocast, recommendation_for_the_cpu) {
    na_amp_recommendation r = na_amp_recommend(NA_DEVICE_CPU);
    cr_assert_eq(r.mode, NA_AMP_MODE_BF16);
    cr_assert_eq(r.dtype, NA_DTYPE_BF16);
    cr_assert(!r.loss_scaling);
    cr_assert(strstr(r.reason, "emulates"), "%s", r.reason);
    cr_assert_str_eq(na_amp_mode_name(r.mode), "bf16");
    if (!na_cuda_available()) {
        r = na_amp_recommend(NA_DEVICE_CUDA);
        cr_assert_eq(r.mode, NA_AMP_MODE_F32);
    }
}
