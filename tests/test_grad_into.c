/* tests/test_grad_into.c — gradients zero_grad marked (nanoamp/autograd.h, "Zeroed
 * gradients"): the backward writes them in place (conv2d, linear and matmul weights and
 * biases) or copies the first contribution, with the very values of a fill + add (checked
 * against the same steps with the gradients filled by hand, which takes the add path) over
 * several steps, with accumulation across backwards, a weight used twice, retained graphs,
 * and f32/f16/bf16 parameters; the backward no longer makes a weight-sized temporary; and a
 * gradient nobody wrote still reads as zeros, to the engine's leaf hook, to the optimizer and
 * to clipping. Values compare with ==, so -0 equals +0 (the one difference the header names). */
#include <string.h>

#include "helpers.h"
#include "src/autograd/graph.h" /* the leaf hook */

#define CIN 3
#define COUT 4
#define HW 5
#define FEAT (COUT * HW * HW)
#define OUTF 6
#define N_PARAMS 6

/* A conv2d + linear + matmul net; one parameter set. w_lin is used twice (two linears). */
typedef struct {
    na_tensor *p[N_PARAMS]; /* conv w, conv b, linear w, linear b, matmul w, unused */
} net;

static na_tensor *persistent_leaf(na_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    na_manual_seed(seed);
    na_tensor *t = TH_OK(na_tensor_new(dt, NA_DEVICE_CPU, ndim, shape));
    TH_RC(na_copy_(t, TH_OK(na_randn(dt, NA_DEVICE_CPU, ndim, shape, 0.0, 0.5))));
    TH_RC(na_tensor_set_requires_grad(t, true));
    return t;
}

static net net_new(na_dtype dt) {
    net m;
    m.p[0] = persistent_leaf(dt, NA_SHAPE(COUT, CIN, 3, 3), 1);
    m.p[1] = persistent_leaf(dt, NA_SHAPE(COUT), 2);
    m.p[2] = persistent_leaf(dt, NA_SHAPE(OUTF, FEAT), 3);
    m.p[3] = persistent_leaf(dt, NA_SHAPE(OUTF), 4);
    m.p[4] = persistent_leaf(dt, NA_SHAPE(OUTF, OUTF), 5);
    m.p[5] = persistent_leaf(dt, NA_SHAPE(7), 6);
    return m;
}

static void net_free(net *m) {
    for (int i = 0; i < N_PARAMS; i++) na_tensor_free(m->p[i]);
}

/* The step's loss for batch `seed`: conv -> relu -> flatten -> linear (w_lin) twice (on the
 * features and on their square) -> @ w_mm -> mean of squares. */
static na_tensor *loss_of(net *m, na_dtype dt, uint64_t seed) {
    na_manual_seed(100 + seed);
    na_tensor *x = TH_OK(na_randn(dt, NA_DEVICE_CPU, NA_SHAPE(2, CIN, HW, HW), 0.0, 1.0));
    na_conv2d_opts co = {.padding = {1, 1}};
    na_tensor *h = TH_OK(na_relu(TH_OK(na_conv2d(x, m->p[0], m->p[1], &co))));
    h = TH_OK(na_reshape(h, 2, (const int64_t[]){2, FEAT}));
    na_tensor *y = TH_OK(na_add(TH_OK(na_linear(h, m->p[2], m->p[3])),
                                TH_OK(na_linear(TH_OK(na_mul(h, h)), m->p[2], NULL))));
    y = TH_OK(na_matmul(y, m->p[4]));
    return TH_OK(na_mean(TH_OK(na_cast(TH_OK(na_mul(y, y)), NA_DTYPE_F32))));
}

/* zero_grad (the marks) or, for the reference, a fill by hand: the add path of before. */
static void zero(net *m, bool mark) {
    for (int i = 0; i < N_PARAMS; i++)
        if (m->p[i]->grad)
            TH_RC(mark ? na_tensor_zero_grad(m->p[i]) : na_fill_(m->p[i]->grad, 0.0));
}

static void expect_same_grads(net *a, net *b, const char *what) {
    for (int i = 0; i < N_PARAMS; i++) {
        na_tensor *ga = a->p[i]->grad, *gb = b->p[i]->grad;
        cr_assert_eq(ga == NULL, gb == NULL, "%s: parameter %d", what, i);
        for (int64_t k = 0; ga && k < ga->numel; k++) {
            double x = na_get(ga, k), y = na_get(gb, k);
            cr_assert(x == y, "%s: parameter %d element %" PRId64 ": %.9g, the add path %.9g",
                      what, i, k, x, y);
        }
    }
}

/* Both nets take the same steps; `backwards` backward passes a step (accumulating), each on
 * a fresh graph or (retain) the same one walked again. */
static void compare_steps(na_dtype dt, int backwards, bool retain, bool zero_between) {
    net a = net_new(dt), b = net_new(dt);
    for (int step = 0; step < 3; step++) {
        if (step == 0 || zero_between) zero(&a, true), zero(&b, false);
        for (int k = 0; k < 2; k++) { /* a's pass, then b's */
            net *m = k ? &b : &a;
            na_tensor *loss = loss_of(m, dt, (uint64_t)step);
            for (int j = 0; j < backwards; j++) {
                bool last = j == backwards - 1;
                if (!retain && j) loss = loss_of(m, dt, (uint64_t)(step + 10 * j));
                TH_RC(retain && !last ? na_backward_retain(loss, NULL) : na_backward(loss, NULL));
            }
            na_step_end();
        }
        char what[96];
        snprintf(what, sizeof what, "%s, step %d, %d backward(s)%s%s", na_dtype_name(dt), step,
                 backwards, retain ? ", retained" : "", zero_between ? "" : ", no zero_grad");
        expect_same_grads(&a, &b, what);
    }
    cr_assert_null(a.p[5]->grad, "a parameter outside the graph gets no gradient");
    net_free(&a);
    net_free(&b);
}

Test(grad_into, same_values_as_fill_and_add_f32) {
    compare_steps(NA_DTYPE_F32, 1, false, true);
    compare_steps(NA_DTYPE_F32, 2, false, true);
    compare_steps(NA_DTYPE_F32, 2, true, true);
    compare_steps(NA_DTYPE_F32, 1, false, false);
}

Test(grad_into, same_values_as_fill_and_add_f16_bf16) {
    for (int d = 0; d < 2; d++) {
        na_dtype dt = d ? NA_DTYPE_BF16 : NA_DTYPE_F16;
        compare_steps(dt, 1, false, true);
        compare_steps(dt, 2, true, true);
        compare_steps(dt, 2, false, false);
    }
}

/* A marked gradient's memory is never read: stale contents (NaN here) do not leak in. */
static void poison(na_tensor *g) {
    float nan = 0.0f / 0.0f;
    cr_assert_eq(g->dtype, NA_DTYPE_F32);
    for (int64_t k = 0; k < g->numel; k++) memcpy((float *)g->data + k, &nan, sizeof nan);
}

Test(grad_into, backward_writes_marked_gradients_without_reading_them) {
    net a = net_new(NA_DTYPE_F32), b = net_new(NA_DTYPE_F32);
    TH_RC(na_backward(loss_of(&a, NA_DTYPE_F32, 0), NULL));
    na_step_end();
    a.p[5]->grad = TH_OK(na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(7)));
    b.p[5]->grad = TH_OK(na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(7)));
    zero(&a, true);
    for (int i = 0; i < N_PARAMS; i++) poison(a.p[i]->grad);
    TH_RC(na_backward(loss_of(&a, NA_DTYPE_F32, 1), NULL));
    TH_RC(na_backward(loss_of(&b, NA_DTYPE_F32, 1), NULL));
    na_step_end();
    expect_same_grads(&a, &b, "after a backward over stale memory");
    for (int64_t k = 0; k < 7; k++) /* outside the graph: the backward's end filled it */
        cr_assert(((float *)a.p[5]->grad->data)[k] == 0.0f, "unused parameter, element %" PRId64,
                  k);
    net_free(&a);
    net_free(&b);
}

/* The optimizer and clipping read a gradient marked and never written as zeros. */
Test(grad_into, readers_see_zeros_without_a_backward) {
    net a = net_new(NA_DTYPE_F32);
    TH_RC(na_backward(loss_of(&a, NA_DTYPE_F32, 0), NULL));
    na_step_end();
    na_tensor *w = a.p[2];
    float before = ((float *)w->data)[0];
    zero(&a, true);
    for (int i = 0; i < N_PARAMS - 1; i++) poison(a.p[i]->grad);
    na_tensor_list list = {.n = N_PARAMS - 1, .items = a.p};
    na_tensor *norm = TH_OK(na_clip_grad_norm(list, 1.0));
    cr_assert(na_item(norm) == 0.0, "clip: norm %g of zeroed gradients", na_item(norm));
    na_sgd_cfg sc = {.lr = 0.1, .momentum = 0.9};
    na_optim *o = na_sgd_new(list, &sc);
    cr_assert_not_null(o, "%s", na_last_error());
    zero(&a, true);
    poison(w->grad);
    TH_RC(na_optim_step(o, NULL));
    cr_assert(((float *)w->data)[0] == before, "a step on zero gradients leaves w alone");
    na_optim_free(o);
    na_step_end();
    net_free(&a);
}

/* The leaf hook (DDP's) fires when a gradient is final: a marked one that no gradient
 * reached (its node ran no backward) is zeros by then. */
static int sum_leaf(na_tensor *leaf, void *ctx) {
    double *s = ctx;
    for (int64_t k = 0; k < leaf->grad->numel; k++) *s += fabs(((float *)leaf->grad->data)[k]);
    return NA_OK;
}

/* f(a, b) = sum(b): a gets no gradient (NULL), so the node that made a gets none either. */
static int sum_second(na_function_ctx *c, na_tensor *const *in, na_tensor **out) {
    TH_RC(na_function_save(c, in[1]));
    return (out[0] = na_sum(in[1])) ? NA_OK : na_last_status();
}
static int sum_second_bw(na_function_ctx *c, na_tensor *const *gout, na_tensor **gin) {
    na_tensor *b = na_function_saved(c, 0);
    gin[1] = na_mul(TH_OK(na_ones(b->dtype, b->device, b->ndim, b->shape)), gout[0]);
    return gin[1] ? 2 : na_last_status();
}
static const na_function sum_of_second = {.name = "sum_of_second", .n_inputs = 2,
                                          .n_outputs = 1, .forward = sum_second,
                                          .backward = sum_second_bw};

Test(grad_into, the_leaf_hook_reads_zeros_where_no_gradient_flowed) {
    na_tensor *w = persistent_leaf(NA_DTYPE_F32, NA_SHAPE(4), 7);
    na_tensor *v = persistent_leaf(NA_DTYPE_F32, NA_SHAPE(4), 8);
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(w, v)))), NULL));
    na_step_end();
    TH_RC(na_tensor_zero_grad(w));
    TH_RC(na_tensor_zero_grad(v));
    poison(w->grad);
    poison(v->grad);
    na_tensor *in[2] = {TH_OK(na_scale(w, 2.0)), v};
    na_tensor *loss = TH_OK(na_function_apply1(&sum_of_second, in, NULL));
    double seen = 0;
    na_graph_leaf_hook old = na_graph_set_leaf_hook((na_graph_leaf_hook){sum_leaf, &seen});
    TH_RC(na_backward(loss, NULL));
    na_graph_set_leaf_hook(old);
    na_step_end();
    cr_assert(seen == 4.0, "the hook summed |grad| = %g, want 4 (v's ones, w's zeros)", seen);
    na_tensor_free(w);
    na_tensor_free(v);
}

/* The backward of a layer with a large weight adds no weight-sized block to the arena: the
 * weight's gradient is written in place (before: a temporary, then an add). */
typedef enum { LINEAR, CONV, MATMUL } layer;

static size_t backward_peak(na_tensor *w, layer l) {
    na_tensor *x = l == CONV ? TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 256, 3, 3)))
                             : TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 512)));
    na_tensor *y = l == CONV ? na_conv2d(x, w, NULL, NULL)
                   : l == LINEAR ? na_linear(x, w, NULL) : na_matmul(x, w);
    na_tensor *loss = TH_OK(na_sum(TH_OK(y)));
    size_t forward = na_arena_used(NA_DEVICE_CPU);
    na_arena_peak_reset();
    TH_RC(na_backward(loss, NULL));
    size_t peak = na_arena_peak(NA_DEVICE_CPU) - forward;
    na_step_end();
    return peak;
}

Test(grad_into, no_weight_sized_temporary_in_the_backward) {
    static const char *names[] = {"linear", "conv2d", "matmul"};
    for (layer l = LINEAR; l <= MATMUL; l++) {
        na_tensor *w = l == CONV ? persistent_leaf(NA_DTYPE_F32, NA_SHAPE(256, 256, 3, 3), 9)
                                 : persistent_leaf(NA_DTYPE_F32, NA_SHAPE(512, 512), 10);
        size_t bytes = (size_t)w->numel * sizeof(float); /* 2.25 MiB, 1 MiB */
        backward_peak(w, l); /* the first backward makes .grad */
        double first = na_get(w->grad, 0);
        TH_RC(na_tensor_zero_grad(w));
        size_t peak = backward_peak(w, l);
        cr_assert(peak < bytes / 2, "%s: the backward's arena peak is %zu bytes, the weight %zu",
                  names[l], peak, bytes);
        cr_assert(na_get(w->grad, 0) == first, "%s: the same gradient again", names[l]);
        na_tensor_free(w);
    }
}

/* A weight cast to f16 for its product (as autocast casts it) gets its f32 gradient from the
 * cast's backward in place: the backward makes the f16 gradient only (before: that and an f32
 * copy of it, then the copy into .grad), with the same values. */
Test(grad_into, cast_weight_gradient_written_in_place) {
    na_tensor *w = persistent_leaf(NA_DTYPE_F32, NA_SHAPE(512, 512), 11);
    size_t bytes = (size_t)w->numel * sizeof(float);
    double first = 0;
    for (int pass = 0; pass < 2; pass++) { /* the first makes .grad, the second is marked */
        if (pass) TH_RC(na_tensor_zero_grad(w));
        na_manual_seed(7);
        na_tensor *x = TH_OK(na_randn(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(2, 512), 0.0, 1.0));
        na_tensor *y = TH_OK(na_linear(x, TH_OK(na_cast(w, NA_DTYPE_F16)), NULL));
        na_tensor *loss = TH_OK(na_sum(TH_OK(na_cast(y, NA_DTYPE_F32))));
        size_t forward = na_arena_used(NA_DEVICE_CPU);
        na_arena_peak_reset();
        TH_RC(na_backward(loss, NULL));
        size_t peak = na_arena_peak(NA_DEVICE_CPU) - forward;
        na_step_end();
        if (!pass) {
            first = na_get(w->grad, 3);
            continue;
        }
        cr_assert(peak < bytes * 3 / 4, "the backward's arena peak is %zu bytes, the f32 weight "
                  "%zu (its f16 gradient half that)", peak, bytes);
        cr_assert(na_get(w->grad, 3) == first && first != 0, "the same gradient again");
    }
    na_tensor_free(w);
}

/* Converting a module moves real zeros, not a zeroed gradient's stale memory. */
Test(grad_into, module_conversion_moves_zeros) {
    na_module *lin = na_linear_new(3, 2, true);
    cr_assert_not_null(lin, "%s", na_last_error());
    na_tensor *x = TH_OK(na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1, 3)));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_module_forward(lin, x)))), NULL));
    na_step_end();
    na_tensor *w = na_module_get(lin, "weight");
    TH_RC(na_module_zero_grad(lin));
    poison(w->grad);
    TH_RC(na_module_to_dtype(lin, NA_DTYPE_F64, NULL, NULL));
    for (int64_t k = 0; k < w->grad->numel; k++)
        cr_assert(((double *)w->grad->data)[k] == 0.0, "element %" PRId64, k);
    na_module_free(lin);
}
