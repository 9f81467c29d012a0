/* Apex-style mixed precision: model conversion (network_to_half / FP16Model, BatchNorm kept in
 * f32), the FP16 optimizer with f32 master weights (against a plain f32 optimizer, flat against
 * non-flat, overflow handling, clipping, deferral, save/load) and the fp16util helpers. Cases
 * follow Apex's tests/L0/run_fp16util and run_mixed_adam (amp-facts.md). */
#include "helpers.h"

#include "nanoamp/io.h"
#include "nanoamp/nn.h"
#include "nanoamp/optim.h"

static void teardown(void) { na_step_end(); }
TestSuite(amp_master, .fini = teardown);

static na_module *ok_module_(na_module *m, const char *expr) {
    cr_assert_not_null(m, "%s: %s", expr, na_last_error());
    return m;
}
#define OK_MODULE(expr) ok_module_((expr), #expr)

/* ---- conversion ------------------------------------------------------------------------------ */

/* Apex's DummyNetWrapper: an affine BN on top, a non-affine BN inside, two blocks with affine
 * BN. */
static na_module *dummy_block(void) {
    return NA_SEQUENTIAL(na_conv2d_new(10, 10, 2, 2, NULL, true), na_batch_norm2d_new(10, NULL));
}
static na_module *dummy_net(void) {
    na_batch_norm_cfg nonaffine = NA_BATCH_NORM_DEFAULTS;
    nonaffine.affine = false;
    return NA_SEQUENTIAL(na_batch_norm2d_new(3, NULL),
                         NA_SEQUENTIAL(na_conv2d_new(3, 10, 2, 2, NULL, true),
                                       na_batch_norm2d_new(10, &nonaffine), dummy_block(),
                                       dummy_block()));
}

static bool under_batch_norm(na_module *root, const char *name) {
    /* the owning module of "a.b.weight" is "a.b" */
    char path[128];
    snprintf(path, sizeof path, "%s", name);
    char *dot = strrchr(path, '.');
    if (!dot) return false;
    *dot = '\0';
    na_module *m = root;
    for (char *tok = strtok(path, "."); tok && m; tok = strtok(NULL, ".")) {
        na_module *next = NULL;
        for (int i = 0; i < na_module_num_children(m); i++) {
            const char *cn;
            na_module *c = na_module_child_at(m, i, &cn);
            if (!strcmp(cn, tok)) next = c;
        }
        m = next;
    }
    return m && na_module_is_batch_norm(m, NULL);
}

/* test_params_and_buffers + test_output_is_half. */
Test(amp_master, model_to_half_keeps_batch_norm_f32) {
    na_manual_seed(1);
    na_module *half = OK_MODULE(na_model_to_half(OK_MODULE(dummy_net()), NA_DTYPE_F16));
    cr_assert_str_eq(na_module_type_name(half), "FP16Model");
    na_module *net = na_module_child_at(half, 0, NULL);
    na_named_tensors l = {0};
    TH_RC(na_module_named_tensors(net, NA_MODULE_STATE, "", &l));
    int f16 = 0, f32 = 0;
    for (int64_t i = 0; i < l.n; i++) {
        const char *name = l.items[i].name;
        na_tensor *t = l.items[i].tensor;
        if (strstr(name, "num_batches_tracked")) {
            cr_assert_eq(t->dtype, NA_DTYPE_I32, "%s", name);
            continue;
        }
        na_dtype want = under_batch_norm(net, name) ? NA_DTYPE_F32 : NA_DTYPE_F16;
        cr_assert_eq(t->dtype, want, "%s is %s, expected %s", name, na_dtype_name(t->dtype),
                     na_dtype_name(want));
        want == NA_DTYPE_F16 ? f16++ : f32++;
    }
    cr_assert_eq(f16, 6, "3 convs x (weight, bias)");
    cr_assert_eq(f32, 3 * 4 + 2, "3 affine BN x 4 tensors + the non-affine BN's statistics");
    na_named_tensors_free(&l);
    /* every parameter is f16 except affine BatchNorm's */
    TH_RC(na_module_named_tensors(net, NA_MODULE_PARAMS, "", &l));
    for (int64_t i = 0; i < l.n; i++) {
        na_module *owner = l.items[i].owner;
        bool affine_bn = na_module_is_affine_batch_norm(owner, NULL);
        cr_assert_eq(l.items[i].tensor->dtype, affine_bn ? NA_DTYPE_F32 : NA_DTYPE_F16, "%s",
                     l.items[i].name);
    }
    na_named_tensors_free(&l);
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3, 8, 8), -1, 1));
    na_tensor *y = TH_OK(na_module_forward(half, x));
    cr_assert_eq(y->dtype, NA_DTYPE_F16);
    TH_RC(na_backward(TH_OK(na_sum(y)), NULL));
    na_tensor *w0 = na_module_get(half, "network.1.0.weight");
    cr_assert_not_null(w0);
    cr_assert_eq(w0->grad->dtype, NA_DTYPE_F16);
    cr_assert_eq(na_module_get(half, "network.0.weight")->grad->dtype, NA_DTYPE_F32);
    na_module_free(half);
}

Test(amp_master, convert_in_place_and_cast_input_module) {
    na_manual_seed(1);
    na_module *net = OK_MODULE(dummy_net());
    na_tensor *w = na_module_get(net, "1.0.weight");
    TH_RC(na_model_convert(net, NA_DTYPE_BF16));
    cr_assert_eq(na_module_get(net, "1.0.weight"), w, "the tensor structs stay");
    cr_assert_eq(w->dtype, NA_DTYPE_BF16);
    cr_assert_eq(na_module_get(net, "0.weight")->dtype, NA_DTYPE_F32);
    na_module *seq = OK_MODULE(NA_SEQUENTIAL(na_cast_input_new(NA_DTYPE_BF16), net));
    na_tensor *y = TH_OK(na_module_forward(seq, TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU,
                                                              NA_SHAPE(2, 3, 8, 8), -1, 1))));
    cr_assert_eq(y->dtype, NA_DTYPE_BF16);
    TH_EXPECT_STATUS(na_model_convert(seq, NA_DTYPE_F32), NA_EDTYPE, "f16 or bf16");
    na_module_free(seq);
}

/* ---- the fp16 optimizer ---------------------------------------------------------------------- */

static na_module *mlp(uint64_t seed) {
    na_manual_seed(seed);
    return OK_MODULE(NA_SEQUENTIAL(na_linear_new(8, 16, true), na_relu_new(),
                                   na_linear_new(16, 4, true)));
}

typedef struct {
    na_tensor *x, *y;
} batch;

static batch make_batch(int step, double in_scale) {
    na_manual_seed(1000 + (uint64_t)step);
    batch b = {TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(16, 8), -in_scale, in_scale)),
               TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(16, 4), -1, 1))};
    return b;
}

static na_tensor *mse(na_module *m, batch b) {
    na_tensor *out = TH_OK(na_module_forward(m, b.x));
    return TH_OK(na_mse_loss(TH_OK(na_cast(out, NA_DTYPE_F32)), b.y, NA_REDUCTION_MEAN));
}

static na_fp16_optimizer *fp16_opt(na_optim *inner, na_module *half, na_fp16_optimizer_cfg c) {
    na_fp16_optimizer *fo = na_fp16_optimizer_new(inner, na_module_parameters(half), &c);
    cr_assert_not_null(fo, "%s", na_last_error());
    return fo;
}

static double max_rel_diff(const na_tensor *a, const na_tensor *b) {
    double worst = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        double x = na_get(a, i), y = na_get(b, i);
        double d = fabs(x - y) / (fabs(y) + 1e-2);
        if (d > worst) worst = d;
    }
    return worst;
}

static double max_abs_diff(na_module *ref, const na_fp16_optimizer *fo) {
    na_named_tensors l = {0};
    TH_RC(na_module_named_tensors(ref, NA_MODULE_PARAMS, "", &l));
    double worst = 0;
    for (int64_t i = 0; i < l.n; i++)
        for (int64_t k = 0; k < l.items[i].tensor->numel; k++) {
            double d =
                fabs(na_get(l.items[i].tensor, k) - na_get(na_fp16_optimizer_master(fo, i), k));
            if (d > worst) worst = d;
        }
    na_named_tensors_free(&l);
    return worst;
}

/* Against a plain f32 optimizer on the same model and data (test_fp16_optimizer): the f32
 * masters stay close to the f32 control over many steps, for SGD with momentum and Adam. */
Test(amp_master, tracks_a_plain_f32_optimizer) {
    for (int use_adam = 0; use_adam < 2; use_adam++) {
        na_module *ref = mlp(5), *half = OK_MODULE(na_model_to_half(mlp(5), NA_DTYPE_F16));
        na_sgd_cfg sc = {.lr = 0.05, .momentum = 0.9};
        na_adam_cfg ac = NA_ADAM_DEFAULTS;
        ac.lr = 3e-3;
        na_tensor_list ps = na_module_parameters(ref);
        na_optim *ctl = use_adam ? na_adam_new(ps, &ac) : na_sgd_new(ps, &sc);
        na_optim *inner = use_adam ? na_adam_new(NA_NO_TENSORS, &ac)
                                   : na_sgd_new(NA_NO_TENSORS, &sc);
        na_fp16_optimizer *fo = fp16_opt(inner, half, (na_fp16_optimizer_cfg){
                                                          .scaler = NA_STATIC_SCALER(128.0)});
        double first = 0, last = 0;
        for (int step = 0; step < 60; step++) {
            batch b = make_batch(step % 8, 1.0);
            na_tensor *l = mse(ref, b);
            TH_RC(na_backward(l, NULL));
            TH_RC(na_optim_step(ctl, NULL));
            TH_RC(na_optim_zero_grad(ctl));
            na_tensor *lh = mse(half, b);
            if (step == 0) first = na_item(lh);
            last = na_item(lh);
            TH_RC(na_fp16_optimizer_backward(fo, lh, true));
            TH_RC(na_fp16_optimizer_step(fo));
            TH_RC(na_fp16_optimizer_zero_grad(fo));
            na_step_end();
            if (step == 6 || step == 59) { /* Apex's bar: 1e-3 after 7 iterations */
                double d = max_abs_diff(ref, fo);
                double tol = step == 6 ? 1e-3 : 1e-2;
                cr_assert(d <= tol, "%s, after %d steps: masters %g away from f32 (tol %g)",
                          use_adam ? "adam" : "sgd", step + 1, d, tol);
            }
        }
        cr_assert(last < 0.8 * first, "the half model learns: %g -> %g", first, last);
        for (int64_t i = 0; i < na_fp16_optimizer_num_params(fo); i++) {
            na_tensor *master = na_fp16_optimizer_master(fo, i);
            cr_assert_eq(master->dtype, NA_DTYPE_F32);
            /* the model holds the masters rounded to f16 */
            na_tensor *p = na_fp16_optimizer_model_param(fo, i);
            cr_assert_eq(p->dtype, NA_DTYPE_F16);
            for (int64_t k = 0; k < p->numel; k++)
                cr_assert_eq(na_get(p, k), th_round_f16(na_get(master, k)));
        }
        na_optim_free(ctl);
        na_fp16_optimizer_free(fo);
        na_module_free(ref);
        na_module_free(half);
    }
}

static void run_fp16(na_module *half, na_fp16_optimizer *fo, int steps) {
    for (int step = 0; step < steps; step++) {
        batch b = make_batch(step, 1.0);
        TH_RC(na_fp16_optimizer_backward(fo, mse(half, b), true));
        TH_RC(na_fp16_optimizer_step(fo));
        TH_RC(na_fp16_optimizer_zero_grad(fo));
        na_step_end();
    }
}

/* One flat f32 master buffer or one master per parameter: the same numbers. */
Test(amp_master, flat_and_per_parameter_masters_identical) {
    na_module *a = OK_MODULE(na_model_to_half(mlp(7), NA_DTYPE_F16));
    na_module *b = OK_MODULE(na_model_to_half(mlp(7), NA_DTYPE_F16));
    na_adam_cfg ac = NA_ADAMW_DEFAULTS;
    na_fp16_optimizer_cfg ca = NA_FP16_OPTIMIZER_DYNAMIC, cb = NA_FP16_OPTIMIZER_DYNAMIC;
    cb.flat_master = true;
    na_fp16_optimizer *fa = fp16_opt(na_adamw_new(NA_NO_TENSORS, &ac), a, ca);
    na_fp16_optimizer *fb = fp16_opt(na_adamw_new(NA_NO_TENSORS, &ac), b, cb);
    cr_assert_eq(na_optim_num_params(na_fp16_optimizer_optim(fa)), 4);
    cr_assert_eq(na_optim_num_params(na_fp16_optimizer_optim(fb)), 1);
    run_fp16(a, fa, 20);
    run_fp16(b, fb, 20);
    for (int64_t i = 0; i < na_fp16_optimizer_num_params(fa); i++) {
        na_tensor *ma = na_fp16_optimizer_master(fa, i), *mb = na_fp16_optimizer_master(fb, i);
        na_tensor *pa = na_fp16_optimizer_model_param(fa, i),
                  *pb = na_fp16_optimizer_model_param(fb, i);
        for (int64_t k = 0; k < ma->numel; k++) {
            cr_assert_eq(na_get(ma, k), na_get(mb, k), "master %lld[%lld]", (long long)i,
                         (long long)k);
            cr_assert_eq(na_get(pa, k), na_get(pb, k), "param %lld[%lld]", (long long)i,
                         (long long)k);
        }
    }
    na_fp16_optimizer_free(fa);
    na_fp16_optimizer_free(fb);
    na_module_free(a);
    na_module_free(b);
}

/* An overflowing step is skipped (masters, model and optimizer state untouched), the dynamic
 * scale halves, clip_master_grads says -1. */
Test(amp_master, overflow_step_skipped_and_scale_halved) {
    for (int flat = 0; flat < 2; flat++) {
        na_module *half = OK_MODULE(na_model_to_half(mlp(9), NA_DTYPE_F16));
        na_sgd_cfg sc = {.lr = 0.05, .momentum = 0.9};
        na_fp16_optimizer_cfg c = NA_FP16_OPTIMIZER_DYNAMIC;
        c.flat_master = flat;
        na_fp16_optimizer *fo = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), half, c);
        run_fp16(half, fo, 2);
        cr_assert_eq(na_grad_scaler_get_scale(na_fp16_optimizer_scaler(fo)), 65536.0);
        int64_t n = na_fp16_optimizer_num_params(fo);
        float before[4][256], pbefore[4][256];
        for (int64_t i = 0; i < n; i++) {
            TH_RC(na_copy_to_host(na_fp16_optimizer_master(fo, i), before[i]));
            na_tensor *p32 = TH_OK(na_cast(na_fp16_optimizer_model_param(fo, i), NA_DTYPE_F32));
            TH_RC(na_copy_to_host(p32, pbefore[i]));
        }
        na_named_tensors st = {0};
        TH_RC(na_optim_state(na_fp16_optimizer_optim(fo), "", &st));
        float mom[256];
        TH_RC(na_copy_to_host(na_named_tensors_find(&st, "state.0.momentum_buffer"), mom));
        batch b = make_batch(0, 1e4); /* activations x 1e4: scaled f16 gradients overflow */
        TH_RC(na_fp16_optimizer_backward(fo, mse(half, b), true));
        cr_assert(na_fp16_optimizer_overflow(fo));
        cr_assert_eq(na_fp16_optimizer_clip_master_grads(fo, 1.0), -1.0);
        TH_RC(na_fp16_optimizer_step(fo));
        cr_assert_eq(na_grad_scaler_get_scale(na_fp16_optimizer_scaler(fo)), 32768.0);
        for (int64_t i = 0; i < n; i++) {
            float now[256], pnow[256];
            na_tensor *m = na_fp16_optimizer_master(fo, i);
            TH_RC(na_copy_to_host(m, now));
            TH_RC(na_copy_to_host(
                TH_OK(na_cast(na_fp16_optimizer_model_param(fo, i), NA_DTYPE_F32)), pnow));
            cr_assert(!memcmp(now, before[i], (size_t)m->numel * 4), "master %lld moved",
                      (long long)i);
            cr_assert(!memcmp(pnow, pbefore[i], (size_t)m->numel * 4), "param %lld moved",
                      (long long)i);
        }
        float mom2[256];
        TH_RC(na_copy_to_host(na_named_tensors_find(&st, "state.0.momentum_buffer"), mom2));
        cr_assert(!memcmp(
            mom, mom2,
            sizeof(float) * (size_t)na_named_tensors_find(&st, "state.0.momentum_buffer")->numel));
        na_named_tensors_free(&st);
        TH_RC(na_fp16_optimizer_zero_grad(fo));
        na_step_end();
        run_fp16(half, fo, 1); /* recovers */
        cr_assert(!na_fp16_optimizer_overflow(fo));
        na_grad_scaler_stats s;
        TH_RC(na_grad_scaler_stats_get(na_fp16_optimizer_scaler(fo), &s));
        cr_assert_eq(s.skipped, 1);
        cr_assert_eq(s.updates, 4);
        na_fp16_optimizer_free(fo);
        na_module_free(half);
    }
}

/* clip_master_grads: PyTorch's rule on the f32 master gradients; returns the total norm. */
Test(amp_master, clip_master_grads) {
    na_module *half = OK_MODULE(na_model_to_half(mlp(3), NA_DTYPE_F16));
    na_sgd_cfg sc = {.lr = 0.1};
    na_fp16_optimizer *fo = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), half,
                                     (na_fp16_optimizer_cfg){.scaler = NA_STATIC_SCALER(64.0)});
    TH_RC(na_fp16_optimizer_backward(fo, mse(half, make_batch(0, 1.0)), true));
    double sq = 0;
    for (int64_t i = 0; i < na_fp16_optimizer_num_params(fo); i++) {
        na_tensor *g = na_fp16_optimizer_master(fo, i)->grad;
        for (int64_t k = 0; k < g->numel; k++) sq += na_get(g, k) * na_get(g, k);
    }
    double norm = na_fp16_optimizer_clip_master_grads(fo, 0.01);
    cr_assert(fabs(norm - sqrt(sq)) < 1e-4 * sqrt(sq), "norm %g, expected %g", norm, sqrt(sq));
    cr_assert(norm > 0.01);
    double sq2 = 0;
    for (int64_t i = 0; i < na_fp16_optimizer_num_params(fo); i++) {
        na_tensor *g = na_fp16_optimizer_master(fo, i)->grad;
        for (int64_t k = 0; k < g->numel; k++) sq2 += na_get(g, k) * na_get(g, k);
    }
    cr_assert(fabs(sqrt(sq2) - 0.01) < 1e-5, "clipped norm %g", sqrt(sq2));
    na_fp16_optimizer_free(fo);
    na_module_free(half);
}

/* Several losses per step: backward(..., false) for each, then update_master_grads once. */
Test(amp_master, deferred_master_grad_update) {
    na_module *a = OK_MODULE(na_model_to_half(mlp(4), NA_DTYPE_F16));
    na_module *b = OK_MODULE(na_model_to_half(mlp(4), NA_DTYPE_F16));
    na_sgd_cfg sc = {.lr = 0.1};
    na_fp16_optimizer_cfg c = {.scaler = NA_STATIC_SCALER(256.0)};
    na_fp16_optimizer *fa = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), a, c);
    na_fp16_optimizer *fb = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), b, c);
    batch b0 = make_batch(0, 1.0), b1 = make_batch(1, 1.0);
    TH_RC(na_fp16_optimizer_backward(fa, mse(a, b0), false));
    TH_EXPECT_STATUS(na_fp16_optimizer_step(fa), NA_ESTATE, "not up to date");
    TH_RC(na_fp16_optimizer_backward(fa, mse(a, b1), false));
    TH_RC(na_fp16_optimizer_update_master_grads(fa));
    TH_RC(na_fp16_optimizer_step(fa));
    TH_RC(na_fp16_optimizer_backward(fb, TH_OK(na_add(mse(b, b0), mse(b, b1))), true));
    TH_RC(na_fp16_optimizer_step(fb));
    for (int64_t i = 0; i < na_fp16_optimizer_num_params(fa); i++) {
        double d = max_rel_diff(na_fp16_optimizer_master(fa, i), na_fp16_optimizer_master(fb, i));
        cr_assert(d < 1e-3, "param %lld: %g", (long long)i, d);
    }
    na_fp16_optimizer_free(fa);
    na_fp16_optimizer_free(fb);
    na_module_free(a);
    na_module_free(b);
}

/* Apex FP16_Optimizer: the scale is updated once per step(), however many times the master
 * gradients were brought up to date (backward(loss, true) for each of two losses, Apex's
 * "naive" way, or backward(..., false) twice then update_master_grads). An overflow in either
 * loss skips the step and backs off once. */
Test(amp_master, one_scale_update_per_step) {
    for (int way = 0; way < 3; way++) { /* 0: naive, 1: deferred, 2: naive with an overflow */
        na_module *half = OK_MODULE(na_model_to_half(mlp(6), NA_DTYPE_F16));
        na_sgd_cfg sc = {.lr = 0.05};
        na_fp16_optimizer_cfg c = NA_FP16_OPTIMIZER_DYNAMIC;
        c.scaler.growth_interval = 2;
        na_fp16_optimizer *fo = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), half, c);
        na_grad_scaler *gs = na_fp16_optimizer_scaler(fo);
        bool naive = way != 1;
        TH_RC(na_fp16_optimizer_backward(fo, mse(half, make_batch(0, way == 2 ? 1e4 : 1.0)),
                                         naive));
        TH_RC(na_fp16_optimizer_backward(fo, mse(half, make_batch(1, 1.0)), naive));
        if (!naive) TH_RC(na_fp16_optimizer_update_master_grads(fo));
        TH_RC(na_fp16_optimizer_step(fo));
        na_grad_scaler_stats st;
        TH_RC(na_grad_scaler_stats_get(gs, &st));
        cr_assert_eq(st.updates, 1, "way %d: %lld scale updates in one step", way,
                     (long long)st.updates);
        cr_assert_eq(st.skipped, way == 2 ? 1 : 0, "way %d", way);
        cr_assert_eq(st.growth_tracker, way == 2 ? 0 : 1, "way %d: unskipped", way);
        cr_assert_eq(st.scale, way == 2 ? 32768.0 : 65536.0, "way %d: scale %g", way, st.scale);
        na_fp16_optimizer_free(fo);
        na_module_free(half);
        na_step_end();
    }
}

/* A flat master's per-parameter views expose their gradient: a view of the flat gradient. */
Test(amp_master, flat_master_views_have_their_grad) {
    na_module *half = OK_MODULE(na_model_to_half(mlp(8), NA_DTYPE_F16));
    na_sgd_cfg sc = {.lr = 0.05};
    na_fp16_optimizer_cfg c = NA_FP16_OPTIMIZER_DYNAMIC;
    c.flat_master = true;
    na_fp16_optimizer *fo = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), half, c);
    TH_RC(na_fp16_optimizer_backward(fo, mse(half, make_batch(0, 1.0)), true));
    const na_tensor *flat_grad = na_optim_param(na_fp16_optimizer_optim(fo), 0)->grad;
    cr_assert_not_null(flat_grad);
    const float *base = flat_grad->data;
    int64_t off = 0;
    double inv = 1.0 / na_grad_scaler_get_scale(na_fp16_optimizer_scaler(fo));
    for (int64_t i = 0; i < na_fp16_optimizer_num_params(fo); i++) {
        na_tensor *m = na_fp16_optimizer_master(fo, i);
        na_tensor *p = na_fp16_optimizer_model_param(fo, i);
        cr_assert_not_null(m->grad, "master view %lld has no grad", (long long)i);
        cr_assert_eq(m->grad->dtype, NA_DTYPE_F32);
        cr_assert_eq(m->grad->numel, p->numel);
        cr_assert_eq((const float *)m->grad->data, base + off, "view %lld: not the flat slice",
                     (long long)i);
        for (int64_t k = 0; k < p->numel; k++) /* the unscaled f16 gradient */
            cr_assert_eq(na_get(m->grad, k), (float)(na_get(p->grad, k) * inv));
        off += p->numel;
    }
    cr_assert_eq(off, flat_grad->numel);
    TH_RC(na_fp16_optimizer_step(fo));
    na_fp16_optimizer_free(fo);
    na_module_free(half);
}

/* zero_grad clears the model's and the masters' gradients. */
Test(amp_master, zero_grad_of_both) {
    na_module *half = OK_MODULE(na_model_to_half(mlp(3), NA_DTYPE_F16));
    na_sgd_cfg sc = {.lr = 0.1};
    na_fp16_optimizer *fo = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), half,
                                     (na_fp16_optimizer_cfg){.scaler = NA_STATIC_SCALER(8)});
    TH_RC(na_fp16_optimizer_backward(fo, mse(half, make_batch(0, 1.0)), true));
    TH_RC(na_fp16_optimizer_zero_grad(fo));
    for (int64_t i = 0; i < na_fp16_optimizer_num_params(fo); i++) {
        na_tensor *gm = na_fp16_optimizer_model_param(fo, i)->grad;
        na_tensor *gM = na_fp16_optimizer_master(fo, i)->grad;
        for (int64_t k = 0; k < gm->numel; k++) {
            cr_assert_eq(na_get(gm, k), 0.0);
            cr_assert_eq(na_get(gM, k), 0.0);
        }
    }
    na_fp16_optimizer_free(fo);
    na_module_free(half);
}

/* f32 parameters (BatchNorm's after conversion) are used directly: no copy, unscaled in place. */
Test(amp_master, f32_parameters_used_directly) {
    na_manual_seed(2);
    na_module *half = OK_MODULE(na_model_to_half(
        OK_MODULE(
            NA_SEQUENTIAL(na_conv2d_new(1, 4, 3, 3, &(na_conv2d_opts){.padding = {1, 1}}, true),
                          na_batch_norm2d_new(4, NULL), na_relu_new(), na_global_avg_pool2d_new(),
                          na_linear_new(4, 3, true))),
        NA_DTYPE_F16));
    na_sgd_cfg sc = {.lr = 0.1, .momentum = 0.9};
    na_fp16_optimizer *fo =
        fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), half, (na_fp16_optimizer_cfg)NA_FP16_OPTIMIZER_DYNAMIC);
    int64_t n = na_fp16_optimizer_num_params(fo), direct = 0;
    for (int64_t i = 0; i < n; i++)
        if (na_fp16_optimizer_master(fo, i) == na_fp16_optimizer_model_param(fo, i)) direct++;
    cr_assert_eq(direct, 2, "BN weight and bias");
    na_tensor *bn_w = na_module_get(half, "network.1.weight");
    float w0 = (float)na_get(bn_w, 0);
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 1, 5, 5), -1, 1));
    na_tensor *labels = TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(4), 0, 1, 2, 1);
    na_tensor *loss = TH_OK(na_cross_entropy(TH_OK(na_module_forward(half, x)), labels, NULL));
    TH_RC(na_fp16_optimizer_backward(fo, loss, true));
    double g0 = na_get(bn_w->grad, 0); /* unscaled in place */
    cr_assert(fabs(g0) < 10, "BN gradient %g looks scaled", g0);
    TH_RC(na_fp16_optimizer_step(fo));
    cr_assert(fabs(na_get(bn_w, 0) - (w0 - 0.1 * (float)g0)) < 1e-6);
    na_fp16_optimizer_free(fo);
    na_module_free(half);
}

Test(amp_master, save_load_with_masters) {
    const char *path = "amp_master_ckpt.safetensors";
    float final_a[4][256];
    na_adam_cfg ac = NA_ADAM_DEFAULTS;
    {
        na_module *half = OK_MODULE(na_model_to_half(mlp(8), NA_DTYPE_F16));
        na_fp16_optimizer *fo = fp16_opt(na_adam_new(NA_NO_TENSORS, &ac), half,
                                         (na_fp16_optimizer_cfg)NA_FP16_OPTIMIZER_DYNAMIC);
        run_fp16(half, fo, 3);
        na_checkpoint *ck = na_checkpoint_new();
        na_named_tensors st = {0}, ms = {0};
        TH_RC(na_fp16_optimizer_state(fo, "", &st));
        cr_assert_not_null(na_named_tensors_find(&st, "fp32_from_fp16.0"));
        cr_assert_not_null(na_named_tensors_find(&st, "scaler.scale"));
        cr_assert_not_null(na_named_tensors_find(&st, "optimizer.state.0.exp_avg"));
        for (int64_t i = 0; i < st.n; i++)
            TH_RC(na_checkpoint_add(ck, st.items[i].name, st.items[i].tensor));
        TH_RC(na_module_named_tensors(half, NA_MODULE_STATE, "", &ms));
        for (int64_t i = 0; i < ms.n; i++)
            TH_RC(na_checkpoint_add(ck, ms.items[i].name, ms.items[i].tensor));
        TH_RC(na_checkpoint_save(ck, path));
        na_checkpoint_free(ck);
        na_named_tensors_free(&st);
        na_named_tensors_free(&ms);
        for (int step = 3; step < 6; step++) {
            batch b = make_batch(step, 1.0);
            TH_RC(na_fp16_optimizer_backward(fo, mse(half, b), true));
            TH_RC(na_fp16_optimizer_step(fo));
            TH_RC(na_fp16_optimizer_zero_grad(fo));
            na_step_end();
        }
        for (int64_t i = 0; i < 4; i++)
            TH_RC(na_copy_to_host(na_fp16_optimizer_master(fo, i), final_a[i]));
        na_fp16_optimizer_free(fo);
        na_module_free(half);
    }
    {
        na_module *half = OK_MODULE(na_model_to_half(mlp(99), NA_DTYPE_F16)); /* other init */
        na_fp16_optimizer *fo = fp16_opt(na_adam_new(NA_NO_TENSORS, &ac), half,
                                         (na_fp16_optimizer_cfg)NA_FP16_OPTIMIZER_DYNAMIC);
        na_checkpoint *ck = na_checkpoint_load(path);
        cr_assert_not_null(ck, "%s", na_last_error());
        na_named_tensors st = {0}, ms = {0};
        TH_RC(na_fp16_optimizer_state(fo, "", &st));
        for (int64_t i = 0; i < st.n; i++)
            TH_RC(na_checkpoint_copy_into(ck, st.items[i].name, st.items[i].tensor));
        TH_RC(na_module_named_tensors(half, NA_MODULE_STATE, "", &ms));
        for (int64_t i = 0; i < ms.n; i++)
            TH_RC(na_checkpoint_copy_into(ck, ms.items[i].name, ms.items[i].tensor));
        na_checkpoint_free(ck);
        na_named_tensors_free(&st);
        na_named_tensors_free(&ms);
        for (int step = 3; step < 6; step++) {
            batch b = make_batch(step, 1.0);
            TH_RC(na_fp16_optimizer_backward(fo, mse(half, b), true));
            TH_RC(na_fp16_optimizer_step(fo));
            TH_RC(na_fp16_optimizer_zero_grad(fo));
            na_step_end();
        }
        for (int64_t i = 0; i < 4; i++) {
            float now[256];
            na_tensor *m = na_fp16_optimizer_master(fo, i);
            TH_RC(na_copy_to_host(m, now));
            cr_assert(!memcmp(now, final_a[i], (size_t)m->numel * 4), "master %lld differs",
                      (long long)i);
        }
        na_fp16_optimizer_free(fo);
        na_module_free(half);
    }
    remove(path);
}

/* A disabled scaler inside the fp16 optimizer is a static scale of 1 (Apex's default). */
Test(amp_master, disabled_scaler_is_a_scale_of_one) {
    na_module *a = OK_MODULE(na_model_to_half(mlp(4), NA_DTYPE_F16));
    na_module *b = OK_MODULE(na_model_to_half(mlp(4), NA_DTYPE_F16));
    na_sgd_cfg sc = {.lr = 0.1};
    na_fp16_optimizer_cfg off = {.scaler = NA_GRAD_SCALER_DEFAULTS};
    off.scaler.enabled = false;
    na_fp16_optimizer *fa = fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), a, off);
    na_fp16_optimizer *fb =
        fp16_opt(na_sgd_new(NA_NO_TENSORS, &sc), b, (na_fp16_optimizer_cfg)NA_FP16_OPTIMIZER_DEFAULTS);
    run_fp16(a, fa, 3);
    run_fp16(b, fb, 3);
    for (int64_t i = 0; i < na_fp16_optimizer_num_params(fa); i++) {
        na_tensor *ma = na_fp16_optimizer_master(fa, i), *mb = na_fp16_optimizer_master(fb, i);
        for (int64_t k = 0; k < ma->numel; k++) cr_assert_eq(na_get(ma, k), na_get(mb, k));
    }
    na_fp16_optimizer_free(fa);
    na_fp16_optimizer_free(fb);
    na_module_free(a);
    na_module_free(b);
}

Test(amp_master, the_optimizer_must_start_empty) {
    na_module *half = OK_MODULE(na_model_to_half(mlp(3), NA_DTYPE_F16));
    na_sgd_cfg sc = {.lr = 0.1};
    na_tensor_list ps = na_module_parameters(half);
    TH_EXPECT_ERROR(na_fp16_optimizer_new(na_sgd_new(ps, &sc), ps, NULL), NA_EINVAL,
                    "already holds", "na_sgd_new(NA_NO_TENSORS");
    /* a failed list keeps its maker's message, and the optimizer given is freed */
    TH_EXPECT_ERROR(na_fp16_optimizer_new(na_sgd_new(NA_NO_TENSORS, &sc),
                                          na_module_parameters(NULL), NULL),
                    NA_EINVAL, "na_module_parameters: NULL module");
    na_module_free(half);
}

/* ---- fp16util -------------------------------------------------------------------------------- */

Test(amp_master, param_lists_round_trip) {
    for (int flat = 0; flat < 2; flat++) {
        na_module *half = OK_MODULE(na_model_to_half(mlp(6), NA_DTYPE_F16));
        na_module *net = na_module_child_at(half, 0, NULL);
        na_param_lists pl;
        TH_RC(na_prep_param_lists(net, flat, &pl));
        cr_assert_eq(pl.n_model, 4);
        cr_assert_eq(pl.n_master, flat ? 1 : 4);
        cr_assert_eq(pl.master[0]->dtype, NA_DTYPE_F32);
        cr_assert(pl.master[0]->requires_grad);
        if (flat) cr_assert_eq(pl.master[0]->numel, 8 * 16 + 16 + 16 * 4 + 4);
        /* masters hold the model's values */
        int64_t off = 0;
        for (int64_t i = 0; i < pl.n_model; i++) {
            na_tensor *p = pl.model[i];
            for (int64_t k = 0; k < p->numel; k++)
                cr_assert_eq(na_get(flat ? pl.master[0] : pl.master[i], (flat ? off : 0) + k),
                             na_get(p, k));
            off += p->numel;
        }
        /* grads: model -> master */
        TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_module_forward(half, make_batch(0, 1).x)))), NULL));
        TH_RC(na_model_grads_to_master_grads(&pl));
        off = 0;
        for (int64_t i = 0; i < pl.n_model; i++) {
            na_tensor *g = pl.model[i]->grad;
            for (int64_t k = 0; k < g->numel; k++)
                cr_assert_eq(na_get(flat ? pl.master[0]->grad : pl.master[i]->grad,
                                    (flat ? off : 0) + k), na_get(g, k));
            off += g->numel;
        }
        /* an update on the masters reaches the model, rounded */
        na_sgd_cfg sc = {.lr = 0.001};
        na_optim *opt = na_sgd_new(NA_NO_TENSORS, &sc);
        cr_assert_eq(na_optim_add_group(opt, (na_tensor_list){pl.n_master, pl.master}), 0);
        TH_RC(na_optim_step(opt, NULL));
        TH_RC(na_master_params_to_model_params(&pl));
        off = 0;
        for (int64_t i = 0; i < pl.n_model; i++) {
            na_tensor *p = pl.model[i];
            for (int64_t k = 0; k < p->numel; k++)
                cr_assert_eq(na_get(p, k), th_round_f16(na_get(flat ? pl.master[0] : pl.master[i],
                                                               (flat ? off : 0) + k)));
            off += p->numel;
        }
        na_optim_free(opt);
        na_param_lists_free(&pl);
        na_module_free(half);
    }
}

Test(amp_master, flat_lists_need_one_dtype) {
    na_manual_seed(1);
    na_module *net =
        OK_MODULE(NA_SEQUENTIAL(na_linear_new(3, 3, true), na_batch_norm1d_new(3, NULL)));
    TH_RC(na_model_convert(net, NA_DTYPE_F16));
    na_param_lists pl;
    TH_EXPECT_STATUS(na_prep_param_lists(net, true, &pl), NA_EDTYPE, "one dtype");
    TH_RC(na_prep_param_lists(net, false, &pl));
    cr_assert_eq(pl.n_master, 4);
    na_param_lists_free(&pl);
    na_module_free(net);
}
