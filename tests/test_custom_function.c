/* tests/test_custom_function.c — user-defined functions (na_function, nanoamp/autograd.h):
 * gradients checked by finite differences (one and several inputs and outputs, an input that
 * needs no gradient, a non-differentiable output), the autocast contract of both kinds (the
 * dtypes forward and backward see, autocast off inside a forward that casts its inputs),
 * the trace, grad mode, accumulation, detach, the step arena, and the errors. */
#include "helpers.h"
#include "nanoamp/nn.h"

/* ---- functions ---------------------------------------------------------------------------- */

/* y = a * x^3, by a raw loop over f64 data; a is the call's argument, kept as a plain value */
static int cube_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    double *a = na_function_data(c, sizeof *a);
    *a = *(const double *)na_function_arg(c);
    na_tensor *x = na_contiguous(in[0]);
    if (!x || (out[0] = na_empty_like(x)) == NULL) return na_last_status();
    const double *xd = x->data;
    double *yd = out[0]->data;
    for (int64_t i = 0; i < x->numel; i++) yd[i] = *a * xd[i] * xd[i] * xd[i];
    return na_function_save(c, x);
}
static int cube_bwd(na_function_ctx *c, na_tensor *const *gout, na_tensor **gin) {
    double a = *(double *)na_function_data(c, sizeof a);
    na_tensor *x = na_function_saved(c, 0);
    gin[0] = na_scale(na_mul(gout[0], na_mul(x, x)), 3 * a); /* dy/dx = 3 a x^2 */
    return gin[0] ? 1 : na_last_status();
}
static const na_function cube = {.name = "cube", .n_inputs = 1, .n_outputs = 1,
                                 .forward = cube_fwd, .backward = cube_bwd};

/* (x * y, x + y) through ops; records whether backward was asked for y's gradient */
static bool mulsum_wanted_y;
static int mulsum_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    out[0] = na_mul(in[0], in[1]);
    out[1] = na_add(in[0], in[1]);
    if (!out[0] || !out[1]) return na_last_status();
    na_function_save(c, in[0]);
    return na_function_save(c, in[1]);
}
static int mulsum_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    na_tensor *x = na_function_saved(c, 0), *y = na_function_saved(c, 1);
    gin[0] = na_add(na_mul(g[0], y), g[1]);
    mulsum_wanted_y = na_function_needs_input_grad(c, 1);
    if (mulsum_wanted_y) gin[1] = na_add(na_mul(g[0], x), g[1]);
    return 2;
}
static const na_function mulsum = {.name = "mulsum", .n_inputs = 2, .n_outputs = 2,
                                   .forward = mulsum_fwd, .backward = mulsum_bwd};

/* (x^2, sign(x)) with the sign marked non-differentiable; keeps the gradient it got for it */
static double sq_sign_gsign_sum = -1;
static int sq_sign_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    out[0] = na_mul(in[0], in[0]);
    out[1] = na_div(in[0], na_abs(in[0]));
    na_function_mark_non_differentiable(c, 1);
    return out[1] ? na_function_save(c, in[0]) : na_last_status();
}
static int sq_sign_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    sq_sign_gsign_sum = na_item(na_sum(na_abs(g[1])));
    gin[0] = na_scale(na_mul(g[0], na_function_saved(c, 0)), 2);
    return 1;
}
static const na_function sq_sign = {.name = "sq_sign", .n_inputs = 1, .n_outputs = 2,
                                    .forward = sq_sign_fwd, .backward = sq_sign_bwd};

static na_tensor *gc_cube(na_tensor **in, void *ctx) {
    double a = 0.5;
    return na_function_apply1(&cube, in, &a);
}
static na_tensor *gc_mulsum(na_tensor **in, void *ctx) { /* both outputs, or only one */
    na_tensor *o[2];
    if (na_function_apply(&mulsum, in, o, NULL)) return NULL;
    int which = *(int *)ctx;
    return which == 2 ? na_add(na_scale(o[0], 3), o[1]) : o[which];
}
static na_tensor *gc_sq_sign(na_tensor **in, void *ctx) {
    na_tensor *o[2];
    return na_function_apply(&sq_sign, in, o, NULL) ? NULL : na_mul(o[0], o[1]);
}

static na_tensor *leaf64(th_rng *r, int64_t n) {
    double v[8];
    for (int64_t i = 0; i < n; i++) v[i] = th_rng_uniform(r, 0.3, 2) * (i % 2 ? -1 : 1);
    return th_leaf(NA_DTYPE_F64, NA_SHAPE(n), v);
}

Test(custom_function, gradcheck_one_input_raw_loop) {
    th_rng r = {th_run_seed()};
    na_tensor *x = leaf64(&r, 5);
    TH_RC(na_gradcheck(gc_cube, NULL, &x, 1, NULL));
}

Test(custom_function, gradcheck_two_inputs_two_outputs) {
    th_rng r = {th_run_seed()};
    na_tensor *in[2] = {leaf64(&r, 4), leaf64(&r, 4)};
    for (int which = 0; which <= 2; which++) { /* output 0 alone, 1 alone, both */
        TH_RC(na_gradcheck(gc_mulsum, &which, in, 2, NULL));
        cr_assert(mulsum_wanted_y);
    }
}

Test(custom_function, input_not_needing_grad) {
    th_rng r = {th_run_seed()};
    na_tensor *in[2] = {leaf64(&r, 4), leaf64(&r, 4)};
    TH_RC(na_tensor_set_requires_grad(in[1], false));
    int both = 2;
    TH_RC(na_gradcheck(gc_mulsum, &both, in, 2, NULL));
    cr_assert(!mulsum_wanted_y, "backward was told y needs a gradient");
    cr_assert_null(in[1]->grad);
}

Test(custom_function, non_differentiable_output) {
    th_rng r = {th_run_seed()};
    na_tensor *x = leaf64(&r, 4);
    TH_RC(na_gradcheck(gc_sq_sign, NULL, &x, 1, NULL));
    cr_assert_eq(sq_sign_gsign_sum, 0.0, "the sign's gradient should be zeros");
    na_tensor *o[2];
    TH_RC(na_function_apply(&sq_sign, &x, o, NULL));
    cr_assert(o[0]->requires_grad && !o[1]->requires_grad && !o[1]->grad_fn);
}

/* ---- grad mode, accumulation, detach, the arena ------------------------------------------- */

Test(custom_function, grad_mode_accumulation_detach) {
    na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(2), TH_V(1, -2));
    double a = 1;
    na_no_grad_begin();
    na_tensor *y = TH_OK(na_function_apply1(&cube, &x, &a));
    na_no_grad_end();
    cr_assert(!y->requires_grad && !y->grad_fn, "recorded under no-grad");
    TH_EXPECT(y, 0, 0, "forward under no-grad", 1, -8);
    for (int pass = 1; pass <= 2; pass++) { /* dy/dx = 3x^2 = 3, 12; twice: += */
        TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_function_apply1(&cube, &x, &a)))), NULL));
        TH_EXPECT(x->grad, 0, 0, "accumulated", 3.0 * pass, 12.0 * pass);
    }
    na_tensor *d = TH_OK(na_detach(TH_OK(na_function_apply1(&cube, &x, &a))));
    cr_assert(!d->requires_grad && !d->grad_fn);
    TH_EXPECT(d, 0, 0, "detached", 1, -8);
}

static int identity_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    out[0] = in[0]; /* returns its input: the graph must not turn the leaf into a non-leaf */
    return NA_OK;
}
static int identity_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    gin[0] = g[0];
    return 1;
}
static const na_function identity = {.name = "identity", .n_inputs = 1, .n_outputs = 1,
                                     .forward = identity_fwd, .backward = identity_bwd};

Test(custom_function, forward_returning_its_input) {
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(3, 4));
    na_tensor *y = TH_OK(na_function_apply1(&identity, &x, NULL));
    cr_assert(y != x && y->data == x->data, "a view of the input, sharing its memory");
    cr_assert_null(x->grad_fn, "the leaf stays a leaf");
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_scale(y, 2)))), NULL));
    TH_EXPECT(x->grad, 0, 0, "identity", 2, 2);
}

Test(custom_function, step_arena_owns_every_call) {
    na_tensor *w = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(64));
    TH_RC(na_fill_(w, 0.5));
    TH_RC(na_tensor_set_requires_grad(w, true));
    double a = 2;
    size_t capacity = 0;
    for (int step = 0; step < 5; step++) {
        na_tensor *o[2];
        TH_RC(na_function_apply(&mulsum, (na_tensor *[]){w, w}, o, NULL));
        TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_function_apply1(&cube, o, &a)))), NULL));
        na_step_end();
        cr_assert_eq(na_arena_used(NA_DEVICE_CPU), 0);
        if (step == 1) capacity = na_arena_capacity(NA_DEVICE_CPU);
        if (step > 1) cr_assert_eq(na_arena_capacity(NA_DEVICE_CPU), capacity, "the arena grew");
    }
    cr_assert_not_null(w->grad, "a persistent leaf's gradient outlives the step");
    na_tensor_free(w);
}

/* ---- outputs used by some passes only ------------------------------------------------------- */

static int fail_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    return na_set_error(NA_EINVAL, "deliberate failure");
}
static const na_function failing = {.name = "failing", .n_inputs = 1, .n_outputs = 1,
                                    .forward = identity_fwd, .backward = fail_bwd};

Test(custom_function, a_failed_pass_leaves_no_gradient_behind) {
    /* o1's gradient reaches the function in a pass that fails before the function's backward;
     * the next pass, which uses o0 only, must not see it (both orders of the failing sum) */
    for (int order = 0; order < 2; order++) {
        na_tensor *in[2] = {th_leaf(NA_DTYPE_F64, NA_SHAPE(1), TH_V(2)),
                            th_leaf(NA_DTYPE_F64, NA_SHAPE(1), TH_V(5))};
        na_tensor *o[2];
        TH_RC(na_function_apply(&mulsum, in, o, NULL));
        na_tensor *bad = TH_OK(na_function_apply1(&failing, &o[0], NULL));
        na_tensor *s1 = TH_OK(na_scale(o[1], 100));
        na_tensor *root = TH_OK(order ? na_add(bad, s1) : na_add(s1, bad));
        TH_EXPECT_STATUS(na_backward(TH_OK(na_sum(root)), NULL), NA_EINVAL, "failing",
                         "deliberate failure");
        TH_RC(na_tensor_zero_grad(in[0]));
        TH_RC(na_tensor_zero_grad(in[1]));
        TH_RC(na_backward(TH_OK(na_sum(o[0])), NULL)); /* d(xy)/dx = y = 5, d/dy = x = 2 */
        TH_EXPECT(in[0]->grad, 0, 0, "x after the failed pass", 5);
        TH_EXPECT(in[1]->grad, 0, 0, "y after the failed pass", 2);
    }
}

/* ---- autocast: what forward and backward see ------------------------------------------------ */

typedef struct {
    na_dtype fwd_in[3], bwd_gout;
    bool fwd_autocast, bwd_autocast;
    na_dtype fwd_matmul, bwd_matmul; /* what an autocast-able op computed in */
} seen;
static seen g_seen;

static int probe_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    for (int k = 0; k < 3; k++) g_seen.fwd_in[k] = in[k]->dtype;
    g_seen.fwd_autocast = na_autocast_enabled();
    na_tensor *m = na_matmul(in[0], in[0]);
    if (!m) return na_last_status();
    g_seen.fwd_matmul = m->dtype;
    out[0] = na_add(na_mul(in[0], in[1]), na_cast(in[2], in[0]->dtype));
    return out[0] ? na_function_save(c, in[0]) : na_last_status();
}
static int probe_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    g_seen.bwd_gout = g[0]->dtype;
    g_seen.bwd_autocast = na_autocast_enabled();
    na_tensor *m = na_matmul(g[0], g[0]);
    if (!m) return na_last_status();
    g_seen.bwd_matmul = m->dtype;
    /* not the true gradient (only the dtypes matter here), in the input's dtype */
    gin[0] = na_cast(g[0], na_function_saved(c, 0)->dtype);
    return 3;
}
static const na_function probe_cast = {.name = "probe_f32", .n_inputs = 3, .n_outputs = 1,
                                       .forward = probe_fwd, .backward = probe_bwd,
                                       .cast_inputs = true, .forward_dtype = NA_DTYPE_F32};
static const na_function probe_as_called = {.name = "probe_as_called", .n_inputs = 3,
                                            .n_outputs = 1, .forward = probe_fwd,
                                            .backward = probe_bwd};

/* Applies f to (f16 leaf, f32 leaf, f64) [2, 2] inside `region` (0: none) and runs backward
 * outside it; returns the f16 leaf. */
static na_tensor *run_probe(const na_function *f, na_dtype region, bool disabled_inside) {
    g_seen = (seen){0};
    na_tensor *h = th_leaf(NA_DTYPE_F16, NA_SHAPE(2, 2), TH_V(1, 2, 3, 4));
    na_tensor *w = th_leaf(NA_DTYPE_F32, NA_SHAPE(2, 2), TH_V(1, 1, 1, 1));
    na_tensor *d = TH_TENSOR(NA_DTYPE_F64, NA_SHAPE(2, 2), 0, 0, 0, 0);
    if (region != NA_DTYPE_COUNT) TH_RC(na_autocast_begin(region));
    if (disabled_inside) TH_RC(na_autocast_begin_disabled());
    na_tensor *y = TH_OK(na_function_apply1(f, (na_tensor *[]){h, w, d}, NULL));
    if (disabled_inside) TH_RC(na_autocast_end());
    if (region != NA_DTYPE_COUNT) TH_RC(na_autocast_end());
    TH_RC(na_backward(y, TH_OK(na_ones(y->dtype, NA_DEVICE_CPU, NA_SHAPE(2, 2)))));
    cr_assert_not_null(h->grad);
    cr_assert_eq(h->grad->dtype, NA_DTYPE_F16, "a leaf's gradient has its dtype");
    return h;
}

Test(custom_function, cast_inputs_in_a_region) {
    run_probe(&probe_cast, NA_DTYPE_F16, false);
    cr_assert_eq(g_seen.fwd_in[0], NA_DTYPE_F32, "the f16 input is cast to f32");
    cr_assert_eq(g_seen.fwd_in[1], NA_DTYPE_F32);
    cr_assert_eq(g_seen.fwd_in[2], NA_DTYPE_F64, "f64 is never cast");
    cr_assert(!g_seen.fwd_autocast, "autocast is off inside forward");
    cr_assert_eq(g_seen.fwd_matmul, NA_DTYPE_F32, "a matmul in forward computes in f32");
    cr_assert_eq(g_seen.bwd_gout, NA_DTYPE_F32);
    cr_assert(!g_seen.bwd_autocast, "backward runs under forward's state: off");
    cr_assert_eq(g_seen.bwd_matmul, NA_DTYPE_F32);
}

Test(custom_function, as_called_in_a_region) {
    run_probe(&probe_as_called, NA_DTYPE_F16, false);
    cr_assert_eq(g_seen.fwd_in[0], NA_DTYPE_F16, "inputs arrive as they are");
    cr_assert_eq(g_seen.fwd_in[1], NA_DTYPE_F32);
    cr_assert(g_seen.fwd_autocast, "autocast stays on inside forward");
    cr_assert_eq(g_seen.fwd_matmul, NA_DTYPE_F16, "a matmul in forward is autocast");
    cr_assert_eq(g_seen.bwd_gout, NA_DTYPE_F32, "f16 * f32 promotes: an f32 output");
    cr_assert(g_seen.bwd_autocast, "backward runs under forward's state: f16 autocast");
    cr_assert_eq(g_seen.bwd_matmul, NA_DTYPE_F16, "a matmul in backward is autocast");
}

Test(custom_function, cast_inputs_outside_enabled_regions) {
    for (int disabled = 0; disabled < 2; disabled++) { /* no region; a disabled sub-region */
        run_probe(&probe_cast, disabled ? NA_DTYPE_F16 : NA_DTYPE_COUNT, disabled);
        cr_assert_eq(g_seen.fwd_in[0], NA_DTYPE_F16, "nothing is cast");
        cr_assert(!g_seen.fwd_autocast && !g_seen.bwd_autocast);
        cr_assert_eq(g_seen.fwd_matmul, NA_DTYPE_F16);
    }
}

Test(custom_function, bf16_region_and_an_f16_forward_dtype) {
    static const na_function to_f16 = {.name = "probe_f16", .n_inputs = 3, .n_outputs = 1,
                                       .forward = probe_fwd, .backward = probe_bwd,
                                       .cast_inputs = true, .forward_dtype = NA_DTYPE_F16};
    run_probe(&to_f16, NA_DTYPE_BF16, false);
    cr_assert_eq(g_seen.fwd_in[1], NA_DTYPE_F16, "cast to the declared dtype, not the region's");
    run_probe(&probe_as_called, NA_DTYPE_BF16, false);
    cr_assert_eq(g_seen.fwd_matmul, NA_DTYPE_BF16);
    cr_assert_eq(g_seen.bwd_matmul, NA_DTYPE_BF16, "backward reopens the region's dtype");
}


Test(custom_function, trace_shows_the_declared_rule) {
    th_trace_log log = {0};
    na_autocast_trace_callback(NA_AMP_TRACE_REGIONS, th_trace_collect, &log);
    run_probe(&probe_cast, NA_DTYPE_F16, false);
    na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    const na_amp_trace_record *fn = NULL;
    for (int i = 0; i < log.n; i++)
        if (log.r[i].name && !strcmp(log.r[i].name, "probe_f32")) fn = &log.r[i];
    cr_assert_not_null(fn, "the function is traced under its name (%d records)", log.n);
    cr_assert_eq(fn->op, NA_OP_COUNT);
    cr_assert_eq(fn->rule, NA_AMP_FP32);
    cr_assert_eq(fn->in[0], NA_DTYPE_F16, "inputs as they came, before the cast");
    cr_assert_eq(fn->compute, NA_DTYPE_F32);
    cr_assert_eq(fn->nesting, 0);
    char line[160];
    cr_assert(strstr(na_amp_trace_format(fn, line, sizeof line), "probe_f32") == line, "%s", line);
    cr_assert(strstr(line, "rule fp32") && strstr(line, "in f16,f32,f64"), "%s", line);
    int inner = 0; /* the casts and the forward's ops, indented under it */
    for (const na_amp_trace_record *r = log.r; r < fn; r++) inner += r->nesting == 1;
    cr_assert_geq(inner, 2, "casts and forward ops nested under the function");
}

/* ---- errors -------------------------------------------------------------------------------- */

static int wrong_count_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    gin[0] = g[0];
    return 2;
}
static na_tensor *g_bad_grad;
static int given_grad_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    gin[0] = g_bad_grad;
    return 1;
}
static int save_in_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    return na_function_save(c, g[0]);
}

/* x [2] f32 through a function whose backward is bwd: na_backward fails naming it */
static void expect_backward_error(na_function_backward bwd, int status, const char *detail) {
    na_function f = {.name = "my_op", .n_inputs = 1, .n_outputs = 1, .forward = identity_fwd,
                     .backward = bwd};
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(1, 2));
    na_tensor *y = TH_OK(na_function_apply1(&f, &x, NULL));
    TH_EXPECT_STATUS(na_backward(TH_OK(na_sum(y)), NULL), status, "backward of my_op failed");
    cr_assert(strstr(na_last_error(), detail), "\"%s\" does not say \"%s\"", na_last_error(),
              detail);
    cr_assert_null(x->grad);
}

Test(custom_function, backward_errors_name_the_function) {
    expect_backward_error(wrong_count_bwd, NA_EINVAL,
                          "my_op returned 2 gradients for its 1 inputs");
    g_bad_grad = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3), 1, 1, 1);
    expect_backward_error(given_grad_bwd, NA_ESHAPE, "gradient [3] f32 cpu for input 0, which is "
                                                     "[2] f32 cpu");
    g_bad_grad = TH_TENSOR(NA_DTYPE_F16, NA_SHAPE(2), 1, 1);
    expect_backward_error(given_grad_bwd, NA_EDTYPE, "gradient [2] f16 cpu for input 0");
    /* a CUDA gradient for a CPU input, without a GPU: a header that claims CUDA is enough,
     * since the check reads only the header */
    g_bad_grad = TH_OK(na_detach(TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 1, 1)));
    g_bad_grad->device = NA_DEVICE_CUDA;
    expect_backward_error(given_grad_bwd, NA_EDEVICE, "gradient [2] f32 cuda for input 0");
    expect_backward_error(save_in_bwd, NA_ESTATE, "na_function_save: my_op: only its forward");
    expect_backward_error(fail_bwd, NA_EINVAL, "deliberate failure");
}

static int failing_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    return na_function_saved(c, 0) ? NA_OK : na_last_status();
}
static int null_output_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    out[0] = in[0];
    return NA_OK; /* out[1] left NULL */
}

Test(custom_function, forward_and_definition_errors) {
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(1, 2));
    na_function f = {.name = "my_op", .n_inputs = 1, .n_outputs = 1, .forward = failing_fwd};
    TH_EXPECT_ERROR(na_function_apply1(&f, &x, NULL), NA_EINVAL,
                    "na_function_apply: forward of my_op failed: na_function_saved: my_op saved "
                    "0 tensors, asked for number 0");
    f = (na_function){.name = "two", .n_inputs = 1, .n_outputs = 2, .forward = null_output_fwd};
    na_tensor *o[2] = {x, x};
    TH_EXPECT_STATUS(na_function_apply(&f, &x, o, NULL), NA_EINVAL,
                     "forward of two left output 1 NULL");
    cr_assert(!o[0] && !o[1], "outputs are NULL after a failure");
    TH_EXPECT_ERROR(na_function_apply1(&f, &x, NULL), NA_EINVAL, "two has 2 outputs");
    f = (na_function){.name = "none", .n_inputs = 1, .n_outputs = 0, .forward = identity_fwd};
    TH_EXPECT_ERROR(na_function_apply1(&f, &x, NULL), NA_EINVAL, "none has 1 inputs and 0 outputs");
    f = (na_function){.n_inputs = 1, .n_outputs = 1, .forward = identity_fwd};
    TH_EXPECT_ERROR(na_function_apply1(&f, &x, NULL), NA_EINVAL, "needs a name and a forward");
    f = (na_function){.name = "to_int", .n_inputs = 1, .n_outputs = 1, .forward = identity_fwd,
                      .cast_inputs = true, .forward_dtype = NA_DTYPE_I32};
    TH_EXPECT_ERROR(na_function_apply1(&f, &x, NULL), NA_EDTYPE, "to_int casts its inputs to i32");
}

/* ---- a function that saves its output, inside containers (issue 24) ------------------------- */

/* y = exp(x), saving y for backward (PyTorch's Exp example) */
static int myexp_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    out[0] = na_exp(in[0]);
    return out[0] ? na_function_save(c, out[0]) : na_last_status();
}
static int myexp_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    gin[0] = na_mul(g[0], na_function_saved(c, 0));
    return gin[0] ? 1 : na_last_status();
}
static const na_function myexp = {.name = "myexp", .n_inputs = 1, .n_outputs = 1,
                                  .forward = myexp_fwd, .backward = myexp_bwd};
static na_tensor *myexp_module_fwd(na_module *m, na_tensor *x) {
    (void)m;
    return na_function_apply1(&myexp, &x, NULL);
}

/* Sequential(scale 0.5, myexp, scale 2) and Sequential(scale 0.5, Residual(myexp), scale 2):
 * the function's saved output is what a container hands on and may give back once used; it
 * must live until the function's backward. d/dx = exp(x/2), and 1 + exp(x/2). */
Test(custom_function, saved_output_inside_sequential_and_residual) {
    for (int residual = 0; residual < 2; residual++) {
        na_module *body = na_module_new("MyExp", myexp_module_fwd, NULL, NULL);
        na_module *net = NA_SEQUENTIAL(na_scale_new(0.5), residual ? na_residual_new(body) : body,
                                       na_scale_new(2.0));
        cr_assert_not_null(net, "%s", na_last_error());
        static const double xv[] = {0.1, 0.2, -0.3};
        na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(3), xv);
        TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_module_forward(net, x)))), NULL));
        for (int i = 0; i < 3; i++) {
            double want = residual + exp(xv[i] / 2);
            cr_assert(fabs(na_get(x->grad, i) - want) < 1e-12, "residual %d: dx[%d] = %.17g, "
                      "expected %.17g", residual, i, na_get(x->grad, i), want);
        }
        na_step_end();
        na_module_free(net);
    }
}

/* ---- a tensor na_backward gave back (issue 24) ----------------------------------------------- */

static na_tensor *g_stashed;
static na_tensor *stash_fwd(na_module *m, na_tensor *x) {
    (void)m;
    g_stashed = x; /* what Sequential handed this child: an intermediate it may give back */
    return na_scale(x, 3);
}

/* Ops given a released tensor fail naming the op, instead of reading freed memory. */
Test(custom_function, a_released_tensor_is_refused_by_name) {
    na_module *net = NA_SEQUENTIAL(na_scale_new(2), na_module_new("Stash", stash_fwd, NULL, NULL),
                                   na_scale_new(1));
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(4), TH_V(1, 2, 3, 4));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_module_forward(net, x)))), NULL));
    cr_assert_not_null(g_stashed);
    TH_EXPECT_ERROR(na_relu(g_stashed), NA_ESTATE, "na_relu: input [4] f32 cpu was released",
                    "na_backward_retain");
    TH_EXPECT_ERROR(na_add(x, g_stashed), NA_ESTATE, "na_add: b [4] f32 cpu was released");
    na_clear_error();
    cr_assert(isnan(na_get(g_stashed, 0)));
    cr_assert(strstr(na_last_error(), "na_get: tensor [4] f32 cpu was released"), "%s",
              na_last_error());
    TH_EXPECT_STATUS(na_fill_(g_stashed, 1), NA_ESTATE, "na_fill_");
    na_step_end();
    na_module_free(net);
}

/* ---- in-place writes to what backward reads (issue 24) ---------------------------------------- */

/* y = 2x written into x itself (a raw loop), declared with na_function_mark_dirty */
static int double_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    double *d = in[0]->data;
    for (int64_t i = 0; i < in[0]->numel; i++) d[i] *= 2;
    out[0] = in[0];
    return na_function_mark_dirty(c, 0);
}
static int double_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    return (gin[0] = na_scale(g[0], 2)) ? 1 : na_last_status();
}
static const na_function double_ = {.name = "double_", .n_inputs = 1, .n_outputs = 1,
                                    .forward = double_fwd, .backward = double_bwd};

Test(custom_function, inplace_writes_to_saved_tensors_fail_backward) {
    /* double_(exp(x)): exp's backward reads its output, which double_ overwrote */
    na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(2), TH_V(0, 1));
    na_tensor *e = TH_OK(na_exp(x));
    na_tensor *y = TH_OK(na_function_apply1(&double_, &e, NULL));
    TH_EXPECT(y, 1e-15, 0, "double_", 2, 2 * M_E);
    TH_EXPECT_STATUS(na_backward(TH_OK(na_sum(y)), NULL), NA_ESTATE,
                     "one of the variables needed for gradient computation has been modified by "
                     "an inplace operation: [2] f64 cpu, the output of exp, is at version 1; "
                     "expected version 0");
    cr_assert_null(x->grad, "no gradient from values that are gone");

    /* na_fill_ on an input mul saved; add reads none of its inputs, as in PyTorch */
    na_tensor *w = th_leaf(NA_DTYPE_F64, NA_SHAPE(2), TH_V(3, 4));
    na_tensor *v = TH_TENSOR(NA_DTYPE_F64, NA_SHAPE(2), 1, 2);
    v->name = "v";
    na_tensor *m = TH_OK(na_mul(w, v)), *a = TH_OK(na_add(w, v));
    TH_RC(na_fill_(v, 5));
    TH_EXPECT_STATUS(na_backward(TH_OK(na_sum(m)), NULL), NA_ESTATE,
                     "[2] f64 cpu (v), input 1 of mul, is at version 2; expected version 1");
    TH_RC(na_backward(TH_OK(na_sum(a)), NULL));
    TH_EXPECT(w->grad, 0, 0, "add's gradient", 1, 1);

    /* a custom function's saved tensor, written after its forward (cube's backward hands the
     * NULL on to ops, which say "did an earlier op fail?" with NA_EINVAL and the cause) */
    na_tensor *z = TH_TENSOR(NA_DTYPE_F64, NA_SHAPE(2), 1, 2);
    na_tensor *zw = TH_OK(na_mul(z, w)); /* a non-leaf cube saves */
    double k = 1;
    na_tensor *c = TH_OK(na_function_apply1(&cube, &zw, &k));
    TH_RC(na_copy_(zw, TH_TENSOR(NA_DTYPE_F64, NA_SHAPE(2), 7, 7)));
    TH_EXPECT_STATUS(na_backward(TH_OK(na_sum(c)), NULL), NA_EINVAL,
                     "backward of cube failed", "na_function_saved: one of the variables needed "
                     "for gradient computation has been modified by an inplace operation",
                     "saved tensor 0 of cube");

    /* a leaf that requires grad cannot be written in place */
    TH_EXPECT_ERROR(na_function_apply1(&double_, &w, NULL), NA_ESTATE,
                    "na_function_mark_dirty: double_ writes input 0 in place, a leaf that "
                    "requires grad");
    na_step_end();
}

/* ---- a function without backward; callbacks that fail without a message (issue 24) ---------- */

Test(custom_function, a_function_without_backward_fails_at_backward) {
    na_function f = {.name = "nobwd", .n_inputs = 1, .n_outputs = 1, .forward = myexp_fwd};
    na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(2), TH_V(1, 2));
    na_tensor *y = TH_OK(na_function_apply1(&f, &x, NULL));
    cr_assert(y->requires_grad, "its output is in the graph");
    na_tensor *loss = TH_OK(na_add(TH_OK(na_sum(y)), TH_OK(na_sum(x))));
    TH_EXPECT_STATUS(na_backward(loss, NULL), NA_ESTATE,
                     "backward of nobwd failed: nobwd has no backward (.backward is NULL)");
    na_no_grad_begin(); /* without grad nothing is recorded, and nothing fails */
    y = TH_OK(na_function_apply1(&f, &x, NULL));
    na_no_grad_end();
    cr_assert(!y->requires_grad);
    na_step_end();
}

static int silent_fail_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    return NA_EDTYPE; /* no na_set_error */
}
static int silent_fail_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    return NA_ENOMEM;
}

Test(custom_function, a_callback_failing_without_a_message_is_named) {
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(1, 2));
    na_set_error(NA_EIO, "a stale message from long ago");
    na_function f = {.name = "quiet", .n_inputs = 1, .n_outputs = 1, .forward = silent_fail_fwd};
    TH_EXPECT_ERROR(na_function_apply1(&f, &x, NULL), NA_EDTYPE,
                    "forward of quiet failed: quiet's forward returned -3 (unsupported dtype) "
                    "without a message");
    cr_assert_null(strstr(na_last_error(), "stale"), "%s", na_last_error());
    na_set_error(NA_EIO, "a stale message from long ago");
    expect_backward_error(silent_fail_bwd, NA_ENOMEM,
                          "my_op's backward returned -5 (out of memory) without a message");
    cr_assert_null(strstr(na_last_error(), "stale"), "%s", na_last_error());
    na_step_end();
}

/* ---- half-set autocast declarations (issue 24) ------------------------------------------------- */

Test(custom_function, cast_inputs_alone_means_f32_and_forward_dtype_alone_is_refused) {
    na_function f = probe_cast;
    f.forward_dtype = NA_FUNCTION_DTYPE_UNSET; /* .cast_inputs = true alone */
    f.name = "probe_cast_alone";
    run_probe(&f, NA_DTYPE_F16, false);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(g_seen.fwd_in[k], NA_DTYPE_F32, "input %d arrived as %s", k,
                     na_dtype_name(g_seen.fwd_in[k]));
    cr_assert(!g_seen.fwd_autocast, "autocast is off in a casting forward");
    na_step_end();

    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(1, 2));
    f = (na_function){.name = "half_set", .n_inputs = 1, .n_outputs = 1, .forward = identity_fwd,
                      .backward = identity_bwd, .forward_dtype = NA_DTYPE_F16};
    TH_EXPECT_ERROR(na_function_apply1(&f, &x, NULL), NA_EINVAL,
                    "half_set sets .forward_dtype f16 without .cast_inputs",
                    "set .cast_inputs = true");
    na_step_end();
}

/* ---- set_materialize_grads (issue 24) ------------------------------------------------------------ */

static bool g_materialize;
static bool g_got_null[2];
static int mat_fwd(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    out[0] = na_scale(in[0], 2);
    out[1] = na_scale(in[0], 3);
    return out[0] && out[1] ? na_function_set_materialize_grads(c, g_materialize)
                            : na_last_status();
}
static int mat_bwd(na_function_ctx *c, na_tensor *const *g, na_tensor **gin) {
    for (int j = 0; j < 2; j++) g_got_null[j] = !g[j];
    gin[0] = g[1] ? na_add(na_scale(g[0], 2), na_scale(g[1], 3)) : na_scale(g[0], 2);
    return gin[0] ? 1 : na_last_status();
}
static const na_function mat = {.name = "mat", .n_inputs = 1, .n_outputs = 2,
                                .forward = mat_fwd, .backward = mat_bwd};

Test(custom_function, set_materialize_grads_false_gives_null_for_unused_outputs) {
    for (int m = 0; m < 2; m++) {
        g_materialize = m;
        na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2), TH_V(1, 2)), *o[2];
        TH_RC(na_function_apply(&mat, &x, o, NULL));
        TH_RC(na_backward(TH_OK(na_sum(o[0])), NULL)); /* o[1] unused */
        cr_assert(!g_got_null[0], "the used output's gradient is there");
        cr_assert_eq(g_got_null[1], !m, "materialize %d: the unused output's gradient is %s", m,
                     g_got_null[1] ? "NULL" : "zeros");
        TH_EXPECT(x->grad, 0, 0, "gradient", 2, 2);
        na_step_end();
    }
    na_function_ctx *none = NULL;
    TH_EXPECT_STATUS(na_function_set_materialize_grads(none, false), NA_EINVAL, "NULL context");
}
