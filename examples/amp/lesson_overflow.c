/* Lesson 2 (amp-overflow): an overflow the dynamic loss scaler detects, skips and recovers
 * from (see amp_lessons.h; the sawtooth of --log is in lesson_loss_scaling.c). */
#include <string.h>

#include "lesson_internal.h"

/* A linear regression y = x w^T trained with f16 autocast and a GradScaler (65536, x2 after 4
 * clean steps, x0.5 on overflow). At step 5 one batch has inputs 1000 times too large: its scaled
 * f16 gradients overflow to inf, the scaler finds it, the optimizer kernel skips the step
 * (weights untouched), the scale halves, and 4 clean steps later it is back. */

int amp_lesson_overflow(amp_overflow_result *r) {
    *r = (amp_overflow_result){.recovered_at = -1};
    na_manual_seed(42);
    na_tensor *w = leaf(NA_DTYPE_F32, NA_SHAPE(1, 4), 0.0);
    CHECK(w);
    na_tensor *w_true = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 4));
    na_tensor *x = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(16, 4));
    CHECK(w_true && x);
    CHECK_RC(na_copy_from_host(w_true, (float[]){0.5f, -0.25f, 0.75f, 1.0f}));
    CHECK_RC(na_init_uniform_(x, -1, 1));
    na_grad_scaler_cfg gc = NA_GRAD_SCALER_DEFAULTS;
    gc.growth_interval = 4;
    na_grad_scaler *gs = na_grad_scaler_new(&gc);
    na_sgd_cfg sc = {.lr = 0.5};
    na_optim *opt = na_sgd_new(NA_NO_TENSORS, &sc);
    CHECK(gs && opt && na_optim_add_group(opt, NA_TENSORS(w)) == 0);
    double start = na_grad_scaler_get_scale(gs);
    for (int s = 0; s < AMP_OVERFLOW_STEPS; s++) {
        bool bad = s == AMP_OVERFLOW_BAD_STEP;
        na_tensor *xb = bad ? na_scale(x, 1000.0) : x;
        na_tensor *t = na_linear(xb, w_true, NULL);
        CHECK(xb && t);
        float before[4], after[4];
        CHECK_RC(na_copy_to_host(w, before));
        r->scale_before[s] = na_grad_scaler_get_scale(gs);
        CHECK_RC(na_autocast_begin(NA_DTYPE_F16));
        na_tensor *loss = na_mse_loss(na_linear(xb, w, NULL), t, NA_REDUCTION_MEAN);
        CHECK_RC(na_autocast_end());
        CHECK(loss);
        r->loss[s] = na_item(loss);
        CHECK_RC(na_backward(na_grad_scaler_scale(gs, loss), NULL));
        CHECK_RC(na_grad_scaler_step(gs, opt));
        r->found_inf[s] = na_item(na_grad_scaler_found_inf(gs, opt)) != 0;
        CHECK_RC(na_grad_scaler_update(gs));
        CHECK_RC(na_optim_zero_grad(opt));
        r->scale_after[s] = na_grad_scaler_get_scale(gs);
        CHECK_RC(na_copy_to_host(w, after));
        r->weights_changed[s] = memcmp(before, after, sizeof before) != 0;
        r->skipped += r->found_inf[s];
        if (r->recovered_at < 0 && s > AMP_OVERFLOW_BAD_STEP &&
            r->scale_after[s] >= r->scale_before[AMP_OVERFLOW_BAD_STEP])
            r->recovered_at = s;
        na_step_end();
    }
    na_optim_free(opt);
    na_grad_scaler_free(gs);
    na_tensor_free(w);
    na_tensor_free(w_true);
    na_tensor_free(x);
    amp_quotes *q = &r->quotes;
    static const char *keys[AMP_OVERFLOW_STEPS] = {"row0", "row1", "row2", "row3", "row4",
                                                   "row5", "row6", "row7", "row8", "row9",
                                                   "row10", "row11"};
    for (int s = 0; s < AMP_OVERFLOW_STEPS; s++)
        quote(q, keys[s], "%4d %9.0f %12.6g %6s %8s %9.0f", s, r->scale_before[s], r->loss[s],
              r->found_inf[s] ? "inf" : "-", r->weights_changed[s] ? "stepped" : "SKIPPED",
              r->scale_after[s]);
    quote(q, "skipped", "%d of %d steps skipped", r->skipped, AMP_OVERFLOW_STEPS);
    quote(q, "recovered", "back to %.0f after step %d",
          r->scale_before[AMP_OVERFLOW_BAD_STEP], r->recovered_at);
    quote(q, "start", "%.0f", start);
    return 0;
}

int amp_overflow_run(const char *csv_path) {
    amp_overflow_result res, *r = &res;
    if (amp_lesson_overflow(r)) return 1;
    printf("linear regression, f16 autocast, GradScaler(65536, x2 every 4 clean steps, "
           "x0.5 on inf); step %d's inputs are 1000x too large\n\n", AMP_OVERFLOW_BAD_STEP);
    printf("%4s %9s %12s %6s %8s %9s\n", "step", "scale", "loss", "grads", "update",
           "new scale");
    for (int s = 0; s < AMP_OVERFLOW_STEPS; s++) printf("%s\n", r->quotes.q[s].text);
    printf("\n%s; the scale is %s\n", amp_quote_get(&r->quotes, "skipped"),
           amp_quote_get(&r->quotes, "recovered"));
    if (csv_path) return amp_sawtooth_run(csv_path);
    return 0;
}
