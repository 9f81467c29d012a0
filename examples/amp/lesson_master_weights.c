/* Lesson 4 (amp-master-weights): small updates lost in f16 and bf16 weights and kept by f32
 * master weights (see amp_lessons.h). */
#include <math.h>

#include "lesson_internal.h"

/* A weight at 1.0 receives the same small update (lr 1e-3 x gradient -0.125) 1000 times. Stored
 * in f16 it never moves: 1.25e-4 is less than half the f16 spacing at 1.0 (2^-11), so every rounded
 * sum is 1.0 again; in bf16 (half spacing 2^-8) likewise. The fp16 optimizer adds the updates to
 * an f32 master and copies it to the 16-bit weight, which then moves as the f32 reference does. */

static int master_run(amp_master_result *r, na_dtype dt, int k) {
    na_sgd_cfg sc = {.lr = r->lr};
    /* (a) the 16-bit weight updated in place; (b) the same weight under the fp16 optimizer */
    na_tensor *wa = leaf(dt, NA_SHAPE(1), 1.0), *wb = leaf(dt, NA_SHAPE(1), 1.0);
    na_optim *oa = na_sgd_new(NA_NO_TENSORS, &sc), *ob = na_sgd_new(NA_NO_TENSORS, &sc);
    CHECK(wa && oa && wb && ob && na_optim_add_group(oa, NA_TENSORS(wa)) == 0);
    na_fp16_optimizer *fo = na_fp16_optimizer_new(ob, NA_NO_TENSORS, NULL); /* static scale 1 */
    CHECK(fo && na_fp16_optimizer_add_group(fo, NA_TENSORS(wb)) == 0);
    for (int s = 0; s < r->steps; s++) {
        /* loss = grad * w: dL/dw = grad (in the weight's dtype) */
        CHECK_RC(na_backward(na_scale(na_sum(wa), r->grad), NULL));
        CHECK_RC(na_optim_step(oa, NULL));
        CHECK_RC(na_optim_zero_grad(oa));
        CHECK_RC(na_fp16_optimizer_backward(fo, na_scale(na_sum(wb), r->grad), true));
        CHECK_RC(na_fp16_optimizer_step(fo));
        CHECK_RC(na_fp16_optimizer_zero_grad(fo));
        na_step_end();
    }
    r->weight16[k] = na_get(wa, 0);
    r->master[k] = na_get(na_fp16_optimizer_master(fo, 0), 0);
    r->model[k] = na_get(wb, 0);
    r->half_ulp[k] = ldexp(1.0, dt == NA_DTYPE_F16 ? -11 : -8);
    na_fp16_optimizer_free(fo);
    na_optim_free(oa);
    na_tensor_free(wa);
    na_tensor_free(wb);
    return 0;
}

int amp_lesson_master_weights(amp_master_result *r) {
    *r = (amp_master_result){.steps = 1000, .lr = 1e-3, .grad = -0.125}; /* exact in 16 bits */
    if (master_run(r, NA_DTYPE_F16, AMP_MASTER_F16) || master_run(r, NA_DTYPE_BF16, AMP_MASTER_BF16))
        return -1;
    /* (c) the f32 reference */
    na_sgd_cfg sc = {.lr = r->lr};
    na_tensor *wc = leaf(NA_DTYPE_F32, NA_SHAPE(1), 1.0);
    na_optim *oc = na_sgd_new(NA_NO_TENSORS, &sc);
    CHECK(wc && oc && na_optim_add_group(oc, NA_TENSORS(wc)) == 0);
    for (int s = 0; s < r->steps; s++) {
        CHECK_RC(na_backward(na_scale(na_sum(wc), r->grad), NULL));
        CHECK_RC(na_optim_step(oc, NULL));
        CHECK_RC(na_optim_zero_grad(oc));
        na_step_end();
    }
    r->update = r->lr * fabs((double)(float)r->grad);
    r->f32_reference = na_get(wc, 0);
    na_optim_free(oc);
    na_tensor_free(wc);
    amp_quotes *q = &r->quotes;
    const int H = AMP_MASTER_F16, B = AMP_MASTER_BF16;
    quote(q, "weight16", "16-bit weight updated in place:  %-13.7f %.7f", r->weight16[H],
          r->weight16[B]);
    quote(q, "master", "f32 master weight:               %-13.7f %.7f", r->master[H], r->master[B]);
    quote(q, "model", "16-bit copy of the master:       %-13.10g %.10g", r->model[H], r->model[B]);
    quote(q, "reference", "plain f32 training:              %.7f", r->f32_reference);
    quote(q, "steps", "%d SGD steps of lr %g x gradient %g, an update of %g each", r->steps,
          r->lr, r->grad, r->update);
    quote(q, "half_ulp_f16", "%.11g", r->half_ulp[H]);
    quote(q, "half_ulp_bf16", "%.8g", r->half_ulp[B]);
    return 0;
}

int amp_master_weights_run(const char *unused) {
    (void)unused;
    amp_master_result res, *r = &res;
    if (amp_lesson_master_weights(r)) return 1;
    printf("a weight at 1.0, %s (half the spacing at 1.0 is 2^-11 = %s in f16, 2^-8 = "
           "%s in bf16)\n\n", amp_quote_get(&r->quotes, "steps"),
           amp_quote_get(&r->quotes, "half_ulp_f16"), amp_quote_get(&r->quotes, "half_ulp_bf16"));
    printf("%-32s %-13s %s\n", "", "f16", "bf16");
    printf("%s\n%s\n%s\n%s\n", amp_quote_get(&r->quotes, "weight16"),
           amp_quote_get(&r->quotes, "master"), amp_quote_get(&r->quotes, "model"),
           amp_quote_get(&r->quotes, "reference"));
    amp_master_mlp_result mr, *m = &mr;
    if (amp_lesson_master_mlp(NULL, m)) { /* the data is optional: the table above stands */
        fprintf(stderr, "amp-master-weights: no MLP run: %s\n", na_last_error());
        return 0;
    }
    printf("\nthe same in a real run: %s; same seed and batches in every run\n\n",
           amp_quote_get(&m->quotes, "setup"));
    printf("%-32s %9s %12s %11s\n", "weights", "unchanged", "final loss", "test acc");
    printf("%s\n%s\n%s\n", amp_quote_get(&m->quotes, "f32"), amp_quote_get(&m->quotes, "bf16"),
           amp_quote_get(&m->quotes, "bf16m"));
    printf("\nunchanged: the share of the model's weights the first step left as they were\n");
    return 0;
}
