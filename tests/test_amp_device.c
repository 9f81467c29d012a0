/* Loss scaling on a CUDA device, when there is one (skipped otherwise): the device kernels
 * agree with the CPU reference bit for bit (unscale, every scaler rule), and a whole
 * mixed-precision training step — scale, backward, unscale + inf check, the optimizer's
 * skip-or-step, the scale update, zero_grad — makes no host round trip, for the GradScaler and
 * for the fp16 optimizer, clean and overflowing alike. */
#include "helpers.h"

#include "kernels/backend.h"
#include "nanoamp/cuda.h"
#include "nanoamp/nn.h"
#include "nanoamp/optim.h"

static void setup(void) {
    if (!na_cuda_available()) cr_skip_test("no CUDA device");
}
static void teardown(void) { na_step_end(); }
TestSuite(amp_device, .init = setup, .fini = teardown);

static na_tensor *to(na_tensor *t, na_device dev) { return TH_OK(na_to_device(t, dev)); }

/* amp_unscale: same bits on both devices, for every dtype pair, with and without an inf. */
Test(amp_device, unscale_matches_the_cpu) {
    const na_backend *gpu = na_backend_get(NA_DEVICE_CUDA), *cpu = na_backend_get(NA_DEVICE_CPU);
    cr_assert_not_null(gpu->amp_unscale, "amp_unscale is not implemented on cuda");
    na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    int64_t sizes[] = {1, 1000, 65537, 3 * 2048 * 32 + 1};
    for (int din = 0; din < 3; din++)
        for (int dout = 0; dout < 3; dout++)
            for (int bad = 0; bad < 2; bad++) {
                na_manual_seed(5);
                const na_view *in_c[4], *in_g[4];
                na_tensor *out_c[4], *out_g[4];
                na_view *vout_c[4], *vout_g[4];
                for (int i = 0; i < 4; i++) {
                    na_tensor *x =
                        TH_OK(na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(sizes[i]), 0, 3000));
                    x = TH_OK(na_cast(x, dts[din]));
                    if (bad && i == 2) { /* an inf in the middle of the third tensor */
                        na_tensor *v = TH_OK(na_slice(x, 100, 101));
                        TH_RC(na_fill_(v, INFINITY));
                    }
                    in_c[i] = &x->view;
                    in_g[i] = &to(x, NA_DEVICE_CUDA)->view;
                    out_c[i] = TH_OK(na_empty(dts[dout], NA_DEVICE_CPU, NA_SHAPE(sizes[i])));
                    out_g[i] = TH_OK(na_empty(dts[dout], NA_DEVICE_CUDA, NA_SHAPE(sizes[i])));
                    vout_c[i] = &out_c[i]->view, vout_g[i] = &out_g[i]->view;
                }
                na_tensor *sc =
                    TH_OK(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 3.0)); /* 1/3 inexact */
                na_tensor *sg = to(sc, NA_DEVICE_CUDA);
                na_tensor *fc = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL));
                na_tensor *fg = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CUDA, 0, NULL));
                TH_RC(cpu->amp_unscale(4, in_c, vout_c, &sc->view, &fc->view));
                TH_RC(gpu->amp_unscale(4, in_g, vout_g, &sg->view, &fg->view));
                cr_assert_eq(na_item(fg), na_item(fc));
                cr_assert_eq(na_item(fg), bad ? 1.0 : 0.0);
                for (int i = 0; i < 4; i++) {
                    na_tensor *back = to(out_g[i], NA_DEVICE_CPU);
                    size_t bytes = (size_t)sizes[i] * na_dtype_size(dts[dout]);
                    cr_assert(!memcmp(back->data, out_c[i]->data, bytes),
                              "%s -> %s, tensor %d differs", na_dtype_name(dts[din]),
                              na_dtype_name(dts[dout]), i);
                }
                na_step_end();
            }
}

/* amp_update_scale: each rule over a scripted sequence, same scale and counters. */
Test(amp_device, update_rules_match_the_cpu) {
    const na_backend *gpu = na_backend_get(NA_DEVICE_CUDA), *cpu = na_backend_get(NA_DEVICE_CPU);
    cr_assert_not_null(gpu->amp_update_scale, "amp_update_scale is not implemented on cuda");
    const bool seq[] = {0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
    for (int kind = 0; kind < 4; kind++) {
        double hp[6] = {2.0, 0.25, 3, kind == 3 ? 1024 : 1, 65536, 0};
        na_tensor *sc = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL);
        na_tensor *sg = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CUDA, 0, NULL);
        na_tensor *cc = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(4));
        na_tensor *cg = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CUDA, NA_SHAPE(4));
        TH_RC(na_fill_(sc, 4096));
        TH_RC(na_fill_(sg, 4096));
        TH_RC(na_copy_from_host(cc, (int32_t[]){0, -1, 0, 0}));
        TH_RC(na_copy_from_host(cg, (int32_t[]){0, -1, 0, 0}));
        for (size_t i = 0; i < sizeof seq; i++) {
            na_tensor *f1 = TH_OK(na_full(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL, 0));
            na_tensor *f2 = TH_OK(na_full(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL, seq[i]));
            const na_view *fcs[2] = {&f1->view, &f2->view};
            const na_view *fgs[2] = {&to(f1, NA_DEVICE_CUDA)->view, &to(f2, NA_DEVICE_CUDA)->view};
            TH_RC(cpu->amp_update_scale(kind, hp, &sc->view, &cc->view, 2, fcs));
            TH_RC(gpu->amp_update_scale(kind, hp, &sg->view, &cg->view, 2, fgs));
            cr_assert_eq(na_item(sg), na_item(sc), "kind %d update %zu: scale %g vs %g", kind, i,
                         na_item(sg), na_item(sc));
            for (int k = 0; k < 4; k++)
                cr_assert_eq(na_get(cg, k), na_get(cc, k), "kind %d update %zu counter %d", kind,
                             i, k);
            na_step_end();
        }
        na_tensor_free(sc), na_tensor_free(sg), na_tensor_free(cc), na_tensor_free(cg);
    }
}

static na_module *mlp_on(na_device dev, bool half) {
    na_manual_seed(3);
    na_module *m =
        NA_SEQUENTIAL(na_linear_new(16, 32, true), na_relu_new(), na_linear_new(32, 8, true));
    cr_assert_not_null(m, "%s", na_last_error());
    TH_RC(na_module_to(m, dev));
    if (half) TH_RC(na_model_convert(m, NA_DTYPE_F16));
    return m;
}

/* One GradScaler step (MSE loss: no label check on the host) on dev; returns the loss tensor. */
static void grad_scaler_step(na_module *m, na_optim *opt, na_grad_scaler *gs, na_device dev,
                             double in_scale) {
    na_manual_seed(9);
    na_tensor *x =
        to(TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(64, 16), -in_scale, in_scale)), dev);
    na_tensor *y = to(TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(64, 8), -1, 1)), dev);
    TH_RC(na_autocast_begin(NA_DTYPE_F16));
    na_tensor *loss = TH_OK(na_mse_loss(TH_OK(na_module_forward(m, x)), y, NA_REDUCTION_MEAN));
    TH_RC(na_autocast_end());
    TH_RC(na_backward(TH_OK(na_grad_scaler_scale(gs, loss)), NULL));
    TH_RC(na_grad_scaler_step(gs, opt));
    TH_RC(na_grad_scaler_update(gs));
    TH_RC(na_optim_zero_grad(opt));
}

Test(amp_device, grad_scaler_step_has_no_host_round_trip) {
    na_module *m = mlp_on(NA_DEVICE_CUDA, false), *mc = mlp_on(NA_DEVICE_CPU, false);
    na_sgd_cfg sc = {.lr = 0.1, .momentum = 0.9};
    na_optim *opt = na_sgd_new(na_module_parameters(m), &sc);
    na_optim *oc = na_sgd_new(na_module_parameters(mc), &sc);
    na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
    gc.growth_interval = 2;
    na_grad_scaler *gs = na_grad_scaler_new(&gc), *gsc = na_grad_scaler_new(&gc);
    /* the x1e4 batch overflows at 65536 */
    double in_scale[] = {1, 1, 1e4, 1, 1, 1};
    for (int s = 0; s < 6; s++) {
        /* host-made inputs are copied in before counting; the step itself must not sync */
        na_manual_seed(9);
        uint64_t before = na_cuda_sync_count();
        grad_scaler_step(m, opt, gs, NA_DEVICE_CUDA, in_scale[s]);
        uint64_t syncs = na_cuda_sync_count() - before;
        cr_assert_eq(syncs, 0, "step %d made %llu host round trips", s, (unsigned long long)syncs);
        grad_scaler_step(mc, oc, gsc, NA_DEVICE_CPU, in_scale[s]);
        cr_assert_eq(na_grad_scaler_get_scale(gs), na_grad_scaler_get_scale(gsc), "step %d", s);
        na_step_end();
    }
    na_grad_scaler_stats st;
    TH_RC(na_grad_scaler_stats_get(gs, &st));
    cr_assert_eq(st.skipped, 1);
    na_tensor *w = na_module_get(m, "0.weight"), *wc = na_module_get(mc, "0.weight");
    for (int64_t k = 0; k < w->numel; k += 37)
        cr_assert(fabs(na_get(w, k) - na_get(wc, k)) < 2e-3, "weight %lld: %g vs %g",
                  (long long)k, na_get(w, k), na_get(wc, k));
    na_grad_scaler_free(gs), na_grad_scaler_free(gsc);
    na_optim_free(opt), na_optim_free(oc);
    na_module_free(m), na_module_free(mc);
}

Test(amp_device, fp16_optimizer_step_has_no_host_round_trip) {
    for (int flat = 0; flat < 2; flat++) {
        na_module *m = mlp_on(NA_DEVICE_CUDA, true);
        na_sgd_cfg sc = {.lr = 0.1, .momentum = 0.9};
        na_fp16_optimizer_cfg fc = NA_FP16_OPTIMIZER_DYNAMIC;
        fc.flat_master = flat;
        fc.scaler.device = NA_DEVICE_CUDA;
        na_fp16_optimizer *fo = na_fp16_optimizer_new(na_sgd_new(NA_NO_TENSORS, &sc),
                                                      na_module_parameters(m), &fc);
        cr_assert_not_null(fo, "%s", na_last_error());
        double in_scale[] = {1, 1, 1e4, 1};
        for (int s = 0; s < 4; s++) {
            na_manual_seed(9);
            na_tensor *x = to(TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(64, 16),
                                            -in_scale[s], in_scale[s])),
                              NA_DEVICE_CUDA);
            na_tensor *y = to(TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(64, 8), -1, 1)),
                              NA_DEVICE_CUDA);
            uint64_t before = na_cuda_sync_count();
            na_tensor *out = TH_OK(na_module_forward(m, TH_OK(na_cast(x, NA_DTYPE_F16))));
            na_tensor *loss =
                TH_OK(na_mse_loss(TH_OK(na_cast(out, NA_DTYPE_F32)), y, NA_REDUCTION_MEAN));
            TH_RC(na_fp16_optimizer_backward(fo, loss, true));
            TH_RC(na_fp16_optimizer_step(fo));
            TH_RC(na_fp16_optimizer_zero_grad(fo));
            uint64_t syncs = na_cuda_sync_count() - before;
            cr_assert_eq(syncs, 0, "flat %d step %d: %llu host round trips", flat, s,
                         (unsigned long long)syncs);
            na_step_end();
        }
        na_grad_scaler_stats st;
        TH_RC(na_grad_scaler_stats_get(na_fp16_optimizer_scaler(fo), &st));
        cr_assert_eq(st.skipped, 1);
        cr_assert_eq(st.scale, 32768.0);
        for (int64_t i = 0; i < na_fp16_optimizer_num_params(fo); i++) {
            na_tensor *p = na_fp16_optimizer_model_param(fo, i),
                      *ms = na_fp16_optimizer_master(fo, i);
            for (int64_t k = 0; k < p->numel; k += 29)
                cr_assert_eq(na_get(p, k), (double)na_round_f16((float)na_get(ms, k)));
        }
        na_fp16_optimizer_free(fo);
        na_module_free(m);
    }
}

/* na_amp_note_nonfinite on the device: the CPU's answer after every step, no host round trip. */
Test(amp_device, note_nonfinite_matches_the_cpu_without_a_sync) {
    na_tensor *fc = TH_OK(na_zeros(NA_DTYPE_F64, NA_DEVICE_CPU, 0, NULL));
    na_tensor *fg = TH_OK(na_zeros(NA_DTYPE_F64, NA_DEVICE_CUDA, 0, NULL));
    const double losses[] = {2.3, 1e300, NAN, 1.5, INFINITY};
    for (int t = 0; t < 5; t++) {
        na_tensor *lc = TH_OK(na_scalar(NA_DTYPE_F64, NA_DEVICE_CPU, losses[t]));
        na_tensor *lg = to(lc, NA_DEVICE_CUDA); /* f64: 1e300 stays finite */
        uint64_t before = na_cuda_sync_count();
        TH_RC(na_amp_note_nonfinite(fg, lg, t + 1));
        cr_assert_eq(na_cuda_sync_count(), before, "step %d synchronized", t + 1);
        TH_RC(na_amp_note_nonfinite(fc, lc, t + 1));
        cr_assert_eq(na_item(fg), na_item(fc), "after step %d", t + 1);
    }
    cr_assert_eq(na_item(fg), 3.0);
    /* a NaN in the last of 3 x 65536 f16 elements: every block's write is the same step */
    na_tensor *big = TH_OK(na_zeros(NA_DTYPE_F16, NA_DEVICE_CUDA, NA_SHAPE(3 * 65536)));
    TH_RC(na_fill_(TH_OK(na_slice(big, 3 * 65536 - 1, 3 * 65536)), NAN));
    TH_RC(na_fill_(fg, 0));
    TH_RC(na_amp_note_nonfinite(fg, big, 9));
    cr_assert_eq(na_item(fg), 9.0);
}
