/* tests/test_autograd.c — the engine: accumulation, grad mode, detach, graph shapes (a tensor
 * used twice, diamonds), persistent leaves' gradients, explicit root gradients and the
 * requires_grad rules. Expected gradients are derived by hand in the comments. */
#include "helpers.h"
#include "src/autograd/graph.h" /* the recorder's observer */

static na_tensor *leaf32(int ndim, const int64_t *shape, const double *v) {
    return th_leaf(NA_DTYPE_F32, ndim, shape, v);
}

Test(autograd, backward_accumulates_across_calls) {
    na_tensor *w = leaf32(NA_SHAPE(3), TH_V(1, -2, 0.5));
    /* loss = sum(w*w): dloss/dw = 2w */
    na_tensor *loss = TH_OK(na_sum(TH_OK(na_mul(w, w))));
    TH_RC(na_backward(loss, NULL));
    cr_assert_not_null(w->grad);
    TH_EXPECT(w->grad, 0, 0, "first backward", 2, -4, 1);
    /* a second backward on a fresh graph adds (the header's contract: +=) */
    loss = TH_OK(na_sum(TH_OK(na_mul(w, w))));
    TH_RC(na_backward_retain(loss, NULL));
    TH_EXPECT(w->grad, 0, 0, "second backward accumulates", 4, -8, 2);
    /* and the same graph, retained, run again adds once more */
    TH_RC(na_backward_retain(loss, NULL));
    TH_EXPECT(w->grad, 0, 0, "the same graph again", 6, -12, 3);
    TH_RC(na_tensor_zero_grad(w));
    TH_EXPECT(w->grad, 0, 0, "zero_grad", 0, 0, 0);
    TH_RC(na_backward(loss, NULL));
    TH_EXPECT(w->grad, 0, 0, "after zero_grad", 2, -4, 1);
    /* that walk did not retain: the graph is used up, and a walk more fails without adding */
    TH_EXPECT_STATUS(na_backward(loss, NULL), NA_ESTATE, "already walked", "na_backward_retain");
    TH_EXPECT(w->grad, 0, 0, "after the refused walk", 2, -4, 1);
    TH_RC(na_tensor_zero_grad(TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1))))); /* no grad: fine */
}

Test(autograd, no_grad_regions_record_nothing_and_nest) {
    na_tensor *w = leaf32(NA_SHAPE(2), TH_V(1, 2));
    cr_assert(na_grad_enabled());
    na_no_grad_begin();
    cr_assert(!na_grad_enabled());
    na_no_grad_begin();
    na_tensor *y = TH_OK(na_mul(w, w));
    na_no_grad_end();
    cr_assert(!na_grad_enabled(), "no-grad regions nest");
    na_tensor *z = TH_OK(na_exp(w));
    na_no_grad_end();
    cr_assert(na_grad_enabled());
    cr_assert(!y->requires_grad && !y->grad_fn, "an op under no-grad records no node");
    cr_assert(!z->requires_grad && !z->grad_fn);
    TH_EXPECT(y, 0, 0, "values are still computed", 1, 4);
    TH_EXPECT_STATUS(na_backward(TH_OK(na_sum(y)), NULL), NA_ESTATE, "na_backward", "does not require grad");
    cr_assert_null(w->grad);
    na_no_grad_end(); /* an unbalanced end is harmless */
    cr_assert(na_grad_enabled());
    /* and recording resumes */
    y = TH_OK(na_mul(w, w));
    cr_assert(y->requires_grad && y->grad_fn);
}

Test(autograd, no_node_without_an_input_that_requires_grad) {
    na_tensor *a = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 1, 2);
    na_tensor *y = TH_OK(na_exp(TH_OK(na_mul(a, a))));
    cr_assert(!y->requires_grad && !y->grad_fn);
}

Test(autograd, detach_cuts_the_graph_and_shares_memory) {
    na_tensor *w = leaf32(NA_SHAPE(3), TH_V(1, 2, 3));
    na_tensor *d = TH_OK(na_detach(w));
    cr_assert(!d->requires_grad && !d->grad_fn && !d->grad);
    cr_assert_eq(d->data, w->data, "detach shares memory");
    /* y = sum(w * detach(w)): only the first factor carries gradient: dy/dw = w */
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(w, d)))), NULL));
    TH_EXPECT(w->grad, 0, 0, "gradient through the attached factor only", 1, 2, 3);
    /* detach of a non-leaf */
    na_tensor *e = TH_OK(na_exp(w));
    na_tensor *de = TH_OK(na_detach(e));
    cr_assert(!de->grad_fn && !de->requires_grad);
    cr_assert_eq(de->data, e->data);
}

Test(autograd, a_tensor_used_twice) {
    na_tensor *a = leaf32(NA_SHAPE(2, 2), TH_V(1, -2, 3, 0.5));
    /* d sum(a*a) / da = 2a */
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(a, a)))), NULL));
    TH_EXPECT(a->grad, 0, 0, "a*a", 2, -4, 6, 1);
    /* a non-leaf used twice: b = 3a, y = sum(b*b + b): dy/da = 3(2b + 1) = 18a + 3 */
    na_tensor *a2 = leaf32(NA_SHAPE(2), TH_V(1, -1));
    na_tensor *b = TH_OK(na_scale(a2, 3));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_add(TH_OK(na_mul(b, b)), b)))), NULL));
    TH_EXPECT(a2->grad, 0, 0, "non-leaf used twice", 21, -15);
}

Test(autograd, diamond_graph) {
    /* x -> b = exp(x) -> c = 2b, d = b*b -> y = sum(c + d): dy/dx = (2 + 2b) * b */
    na_tensor *x = th_leaf(NA_DTYPE_F64, NA_SHAPE(3), TH_V(0, 1, -0.5));
    na_tensor *b = TH_OK(na_exp(x));
    na_tensor *y = TH_OK(na_sum(TH_OK(na_add(TH_OK(na_scale(b, 2)), TH_OK(na_mul(b, b))))));
    TH_RC(na_backward(y, NULL));
    double want[3];
    for (int i = 0; i < 3; i++) {
        double bv = exp((double[]){0, 1, -0.5}[i]);
        want[i] = (2 + 2 * bv) * bv;
    }
    th_expect(x->grad, want, 3, 1e-14, 1e-14, "diamond");
    /* two leaves meeting twice: y = sum((p + q) * (p - q)) = sum(p^2 - q^2) */
    na_tensor *p = th_leaf(NA_DTYPE_F64, NA_SHAPE(2), TH_V(3, -1));
    na_tensor *q = th_leaf(NA_DTYPE_F64, NA_SHAPE(2), TH_V(2, 5));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(TH_OK(na_add(p, q)), TH_OK(na_sub(p, q)))))), NULL));
    TH_EXPECT(p->grad, 0, 0, "p", 6, -2);
    TH_EXPECT(q->grad, 0, 0, "q", -4, -10);
}

Test(autograd, broadcast_gradients_sum_back_to_the_input_shape) {
    na_tensor *a = leaf32(NA_SHAPE(2, 1), TH_V(1, 2));
    na_tensor *b = leaf32(NA_SHAPE(3), TH_V(10, 20, 30));
    /* y = sum(a * b) over [2, 3]: dy/da[i] = sum b = 60, dy/db[j] = sum a = 3 */
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(a, b)))), NULL));
    th_expect_shape(a->grad, NA_SHAPE(2, 1), "grad of a");
    th_expect_shape(b->grad, NA_SHAPE(3), "grad of b");
    TH_EXPECT(a->grad, 0, 0, "grad of a", 60, 60);
    TH_EXPECT(b->grad, 0, 0, "grad of b", 3, 3, 3);
}

Test(autograd, gradients_through_views_reach_the_base) {
    na_tensor *x = leaf32(NA_SHAPE(3, 2), TH_V(1, 2, 3, 4, 5, 6));
    /* y = sum(slice(transpose(x))[1] * [1, 10, 100]) picks column 1 of x */
    na_tensor *row = TH_OK(na_slice(TH_OK(na_transpose(x, 0, 1)), 1, 2));
    na_tensor *y = TH_OK(na_sum(TH_OK(na_mul(row, TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(1, 3), 1, 10, 100)))));
    TH_RC(na_backward(y, NULL));
    TH_EXPECT(x->grad, 0, 0, "view gradient", 0, 1, 0, 10, 0, 100);
}

Test(autograd, persistent_leaves_get_persistent_grads) {
    na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
    cr_assert_not_null(w, "%s", na_last_error());
    TH_RC(na_copy_(w, TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 3, -1)));
    TH_RC(na_tensor_set_requires_grad(w, true));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(w, w)))), NULL));
    cr_assert_not_null(w->grad);
    cr_assert(w->grad->persistent, "the grad of a persistent leaf is persistent");
    na_tensor *g = w->grad;
    na_step_end();
    /* churn the arena so that stale memory would show */
    for (int i = 0; i < 4; i++) TH_OK(na_full(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4096), 99));
    cr_assert_eq(w->grad, g, "the grad tensor survives na_step_end");
    TH_EXPECT(w->grad, 0, 0, "grad after na_step_end", 6, -2);
    /* the next step accumulates into the same tensor */
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_scale(w, 0.5)))), NULL));
    cr_assert_eq(w->grad, g);
    TH_EXPECT(w->grad, 0, 0, "accumulated in the next step", 6.5, -1.5);
    na_step_end();
    na_tensor_free(w); /* frees the grad too (ASan would see a leak otherwise) */
}

Test(autograd, backward_with_an_explicit_gradient) {
    na_tensor *x = leaf32(NA_SHAPE(3), TH_V(1, 2, 3));
    na_tensor *y = TH_OK(na_mul(x, x));
    TH_RC(na_backward(y, TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3), 1, 0.5, -1)));
    TH_EXPECT(x->grad, 0, 0, "dy/dx = 2x * g", 2, 2, -6);
    /* a one-element root may take an explicit gradient too */
    na_tensor *x2 = leaf32(NA_SHAPE(2), TH_V(1, 2));
    TH_RC(na_backward(TH_OK(na_sum(x2)), TH_OK(na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 3))));
    TH_EXPECT(x2->grad, 0, 0, "sum with gradient 3", 3, 3);
    /* backward from a leaf */
    na_tensor *l = leaf32(NA_SHAPE(2), TH_V(5, 6));
    TH_RC(na_backward(l, TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2), 7, 8)));
    TH_EXPECT(l->grad, 0, 0, "leaf root", 7, 8);
}

Test(autograd, requires_grad_rules) {
    na_tensor *i = TH_OK(na_zeros(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2)));
    TH_EXPECT_STATUS(na_tensor_set_requires_grad(i, true), NA_EDTYPE, "na_tensor_set_requires_grad", "i32");
    cr_assert(!i->requires_grad);
    TH_RC(na_tensor_set_requires_grad(i, false)); /* turning it off is fine */
    TH_EXPECT_STATUS(na_tensor_set_requires_grad(TH_OK(na_zeros(NA_DTYPE_U8, NA_DEVICE_CPU, NA_SHAPE(1))), true),
                     NA_EDTYPE, "u8");
    na_tensor *x = leaf32(NA_SHAPE(2), TH_V(1, 2));
    na_tensor *y = TH_OK(na_exp(x));
    TH_EXPECT_STATUS(na_tensor_set_requires_grad(y, false), NA_EINVAL, "leaves", "exp");
    /* an integer op output never requires grad */
    cr_assert(!TH_OK(na_argmax(x, 0, false))->requires_grad);
    /* f16 and bf16 leaves can */
    TH_RC(na_tensor_set_requires_grad(TH_OK(na_zeros(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(1))), true));
    TH_RC(na_tensor_set_requires_grad(TH_OK(na_zeros(NA_DTYPE_BF16, NA_DEVICE_CPU, NA_SHAPE(1))), true));
}

Test(autograd, gradients_keep_the_leaf_dtype) {
    /* an f32 leaf used through an f64 computation gets an f32 gradient */
    na_tensor *w = leaf32(NA_SHAPE(2), TH_V(1.5, -2));
    na_tensor *y = TH_OK(na_sum(TH_OK(na_mul(TH_OK(na_cast(w, NA_DTYPE_F64)),
                                             TH_TENSOR(NA_DTYPE_F64, NA_SHAPE(2), 2, 4)))));
    cr_assert_eq(y->dtype, NA_DTYPE_F64);
    TH_RC(na_backward(y, NULL));
    cr_assert_eq(w->grad->dtype, NA_DTYPE_F32);
    TH_EXPECT(w->grad, 0, 0, "through a cast", 2, 4);
    /* an f16 leaf through f32 math */
    na_tensor *h = th_leaf(NA_DTYPE_F16, NA_SHAPE(2), TH_V(1, 2));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_cast(TH_OK(na_mul(h, h)), NA_DTYPE_F32)))), NULL));
    cr_assert_eq(h->grad->dtype, NA_DTYPE_F16);
    TH_EXPECT(h->grad, 0, 0, "f16 leaf", 2, 4);
}

Test(autograd, small_net_backward_end_to_end) {
    /* conv -> relu -> max pool -> flatten -> linear -> cross-entropy, all the way back */
    na_tensor *x = th_leaf(NA_DTYPE_F32, NA_SHAPE(2, 1, 3, 3), TH_V(1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 8, 7, 6, 5, 4, 3, 2, 1));
    na_tensor *w = th_leaf(NA_DTYPE_F32, NA_SHAPE(2, 1, 2, 2), TH_V(1, 0, 0, 1, 0.5, -0.5, 0.25, 1));
    na_tensor *h = TH_OK(na_relu(TH_OK(na_conv2d(x, w, NULL, NULL))));
    na_pool2d_opts k2 = {.kernel = {2, 2}};
    na_tensor *p = TH_OK(na_flatten(TH_OK(na_max_pool2d(h, &k2)), 1));
    na_tensor *fc = th_leaf(NA_DTYPE_F32, NA_SHAPE(3, 2), TH_V(1, -1, 0.5, 0.5, -1, 2));
    na_tensor *logits = TH_OK(na_linear(p, fc, NULL));
    na_tensor *loss = TH_OK(na_cross_entropy(logits, TH_TENSOR(NA_DTYPE_I32, NA_SHAPE(2), 0, 2), NULL));
    TH_RC(na_backward(loss, NULL));
    cr_assert(x->grad && w->grad && fc->grad);
    /* the loss is mean CE: the logits' gradient rows sum to 0, so the fc grad columns do */
    for (int c = 0; c < 2; c++) {
        double s = 0;
        for (int r = 0; r < 3; r++) s += na_get(fc->grad, r * 2 + c);
        cr_assert(fabs(s) < 1e-5, "fc grad column %d sums to %g", c, s);
    }
}

/* ---- what the engine does, and does not do ------------------------------------------------ */


/* The engine sums a tensor's gradient contributions and converts a gradient to its input's
 * dtype with the backend, not by calling op front-ends: during backward the trace shows only
 * the ops the backward functions run (their own adds and casts: none here). */
Test(autograd, the_engine_sums_and_converts_without_running_ops) {
    /* y = exp(x) used twice: z = sum(y*y) sends two contributions to y; dz/dx = 2 exp(2x) */
    na_tensor *x = leaf32(NA_SHAPE(3), TH_V(0, 0.5, -1));
    na_tensor *y = TH_OK(na_exp(x));
    na_tensor *z = TH_OK(na_sum(TH_OK(na_mul(y, y))));
    /* an f16 leaf in an f32 loss: its gradient comes back f32; d sum((h - t)^2)/dh = 2h */
    na_tensor *h = th_leaf(NA_DTYPE_F16, NA_SHAPE(3), TH_V(1, 2, 3));
    na_tensor *t = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3), 0, 0, 0);
    na_tensor *loss = TH_OK(na_add(z, TH_OK(na_mse_loss(h, t, NA_REDUCTION_SUM))));
    th_trace_log log = {0};
    na_amp_trace_mode saved = na_autocast_trace_mode();
    na_autocast_trace_callback(NA_AMP_TRACE_ALL, th_trace_collect, &log);
    int rc = na_backward(loss, NULL);
    na_autocast_trace(saved, NULL);
    TH_RC(rc);
    cr_assert(log.n > 0, "the backward functions' ops are traced");
    for (int i = 0; i < log.n; i++)
        cr_assert(log.r[i].op != NA_OP_ADD && log.r[i].op != NA_OP_CAST,
                  "backward op %d is %s: the engine ran an op of its own", i,
                  na_op_name(log.r[i].op));
    TH_EXPECT(x->grad, 1e-6, 1e-6, "two contributions summed", 2, 2 * exp(1.0), 2 * exp(-2.0));
    cr_assert_eq(h->grad->dtype, NA_DTYPE_F16);
    TH_EXPECT(h->grad, 0, 0, "converted to the f16 leaf", 2, 4, 6);
}

static int seen[8], n_seen;
static void see_op(const na_graph_op *op, const na_tensor *out, int n_inputs,
                   na_tensor *const *inputs) {
    if (n_seen < 8) seen[n_seen] = op->id;
    n_seen++;
}

/* Whoever watches ops registers an observer with the recorder: it sees every op, recorded or
 * not, and a recorded node carries the backward its op named. */
Test(autograd, an_observer_sees_every_op_and_a_node_carries_its_backward) {
    na_tensor *x = leaf32(NA_SHAPE(2), TH_V(1, 2));
    n_seen = 0;
    na_graph_observer before = na_graph_set_observer(see_op);
    na_tensor *y = na_exp(x);
    na_no_grad_begin();
    na_tensor *r = na_relu(x);
    na_no_grad_end();
    na_graph_observer mine = na_graph_set_observer(before);
    cr_assert_eq(mine, see_op);
    cr_assert(y && r);
    cr_assert_eq(n_seen, 2);
    cr_assert_eq(seen[0], NA_OP_EXP);
    cr_assert_eq(seen[1], NA_OP_RELU, "an op under no-grad is observed too");
    cr_assert_null(r->grad_fn);
    cr_assert_not_null(y->grad_fn);
    cr_assert_str_eq(y->grad_fn->op->name, "exp");
    cr_assert_not_null(y->grad_fn->op->backward);
}
