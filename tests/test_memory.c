/* tests/test_memory.c — the step arena's reuse of freed blocks and the backward pass giving
 * intermediate gradients back: the memory a backward adds does not grow with the depth of a
 * chain, freed blocks are reused, values stay exact where gradients share blocks (views, a
 * tensor used twice), and what the user holds stays intact. */
#include "helpers.h"
#include "cpu/cpu_internal.h"
#include "nanoamp/nn.h"
#include "nanoamp/threads.h"
#include "src/tensor/arena.h"

#define WIDTH 4096 /* f32: 16 KiB a tensor, so one gradient is one arena block of 16 KiB */

/* Bytes the backward of a chain of `depth` scalings of x adds on top of its forward, at the
 * end of the pass (*after) and at its high-water mark (*peak). */
static void chain_backward_bytes(int depth, size_t *after, size_t *peak) {
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(WIDTH), -1, 1));
    TH_RC(na_tensor_set_requires_grad(x, true));
    na_tensor *y = x;
    for (int i = 0; i < depth; i++) y = TH_OK(na_scale(y, 1.0 + 1.0 / 64));
    na_tensor *loss = TH_OK(na_sum(y));
    size_t forward = na_arena_used(NA_DEVICE_CPU);
    na_arena_peak_reset();
    TH_RC(na_backward(loss, NULL));
    *after = na_arena_used(NA_DEVICE_CPU) - forward;
    *peak = na_arena_peak(NA_DEVICE_CPU) - forward;
    na_step_end();
}

Test(memory, backward_of_a_chain_holds_o1_gradients) {
    size_t after8, peak8, after64, peak64;
    chain_backward_bytes(8, &after8, &peak8);
    chain_backward_bytes(64, &after64, &peak64);
    size_t block = WIDTH * sizeof(float);
    /* what stays: x's gradient (a step leaf's own); the 63 intermediate gradients are gone */
    cr_assert(after64 <= after8 + 1024, "after the pass: depth 64 holds %zu bytes, depth 8 %zu",
              after64, after8);
    cr_assert(after64 <= 2 * block, "depth 64 still holds %zu bytes (a gradient is %zu)",
              after64, block);
    /* and at no time more than a few gradients at once */
    cr_assert(peak64 <= peak8 + 1024, "peak: depth 64 %zu bytes, depth 8 %zu", peak64, peak8);
    cr_assert(peak64 <= 4 * block, "peak of the pass %zu bytes", peak64);
}

Test(memory, a_freed_block_is_reused) {
    void *a = na_arena_data_alloc(NA_DEVICE_CPU, 1 << 16);
    void *b = na_arena_data_alloc(NA_DEVICE_CPU, 1 << 16);
    cr_assert(a && b && a != b);
    size_t used = na_arena_used(NA_DEVICE_CPU);
    na_arena_data_free(NA_DEVICE_CPU, a, 1 << 16);
    cr_assert_eq(na_arena_used(NA_DEVICE_CPU), used - (1 << 16));
    cr_assert_eq(na_arena_data_alloc(NA_DEVICE_CPU, 1 << 16), a, "the same size takes the block");
    na_arena_data_free(NA_DEVICE_CPU, a, 1 << 16);
    cr_assert_eq(na_arena_data_alloc(NA_DEVICE_CPU, 1 << 12), a, "a smaller one takes its start");
    na_arena_data_free(NA_DEVICE_CPU, a, 1 << 12);
    /* neighbours merge: both blocks freed make room for one twice as big, at a's place */
    na_arena_data_free(NA_DEVICE_CPU, b, 1 << 16);
    if ((char *)b == (char *)a + (1 << 16))
        cr_assert_eq(na_arena_data_alloc(NA_DEVICE_CPU, 2 << 16), a);
    na_step_end();
    size_t allocs = na_arena_chunk_allocs(NA_DEVICE_CPU);
    for (int i = 0; i < 100; i++) { /* a step that frees as it goes allocates nothing new */
        void *p = na_arena_data_alloc(NA_DEVICE_CPU, 1 << 18);
        cr_assert_not_null(p);
        na_arena_data_free(NA_DEVICE_CPU, p, 1 << 18);
    }
    cr_assert_eq(na_arena_chunk_allocs(NA_DEVICE_CPU), allocs);
    na_step_end();
}

/* Gradients that share blocks: x -> y (a view) used twice by add, transposed, squared. The
 * gradient is 8x exactly (powers of two), whatever block reuse happens inside the pass. */
Test(memory, gradients_sharing_blocks_stay_exact) {
    for (int step = 0; step < 3; step++) {
        na_manual_seed(7);
        na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(64, 64), -1, 1));
        TH_RC(na_tensor_set_requires_grad(x, true));
        na_tensor *y = TH_OK(na_reshape(x, NA_SHAPE(4096)));
        na_tensor *z = TH_OK(na_add(y, y));
        na_tensor *w = TH_OK(na_transpose(TH_OK(na_reshape(z, NA_SHAPE(64, 64))), 0, 1));
        na_tensor *v = TH_OK(na_mul(w, w));
        TH_RC(na_backward(TH_OK(na_sum(v)), NULL));
        const float *xs = x->data, *g = x->grad->data;
        for (int i = 0; i < 4096; i++)
            cr_assert_eq(g[i], 8 * xs[i], "step %d element %d: %g, expected %g", step, i, g[i],
                         8 * xs[i]);
        na_step_end();
    }
}

Test(memory, what_the_user_holds_survives_backward) {
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(WIDTH), -1, 1));
    TH_RC(na_tensor_set_requires_grad(x, true));
    na_tensor *y = TH_OK(na_exp(x));
    float y0[WIDTH];
    memcpy(y0, y->data, sizeof y0);
    na_tensor *root = TH_OK(na_mul(y, y));
    na_tensor *v = TH_OK(na_full(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(WIDTH), 0.5));
    TH_RC(na_backward(root, v));
    /* y (saved by exp's and mul's nodes, held here), the given root gradient, and x's
     * gradient keep their memory; more ops after the pass do not overwrite them */
    for (int i = 0; i < 8; i++) TH_OK(na_scale(x, 3.0));
    cr_assert_not_null(y->data);
    cr_assert_eq(memcmp(y->data, y0, sizeof y0), 0, "a tensor the user holds changed");
    for (int i = 0; i < WIDTH; i++) {
        cr_assert_eq(((float *)v->data)[i], 0.5f, "the root gradient given changed");
        double want = 0.5 * 2 * y0[i] * y0[i];
        cr_assert(th_close(((float *)x->grad->data)[i], want, 1e-6, 1e-5), "x.grad[%d]", i);
    }
    cr_assert_null(root->grad, "an intermediate's gradient is given back after the pass");
    na_step_end();
}

/* ---- saved activations ----------------------------------------------------------------- */

#define SEQ_BATCH 64
#define SEQ_WIDTH 256 /* an activation is 64 KiB */

/* Eight Linear + ReLU: 16 activations a Sequential hands from child to child. */
static na_module *deep_mlp(void) {
    na_module *m = NA_SEQUENTIAL(na_linear_new(SEQ_WIDTH, SEQ_WIDTH, true), na_relu_new());
    for (int i = 1; m && i < 8; i++) {
        na_sequential_append(m, na_linear_new(SEQ_WIDTH, SEQ_WIDTH, true));
        na_sequential_append(m, na_relu_new());
    }
    return m;
}

/* The parameters' gradients after one pass, in a malloc'ed copy. */
static float *param_grads(na_module *m, size_t *n) {
    na_tensor_list ps = na_module_parameters(m);
    size_t total = 0;
    for (int64_t i = 0; i < ps.n; i++) total += (size_t)ps.items[i]->numel;
    float *g = malloc(total * sizeof *g), *at = g;
    for (int64_t i = 0; i < ps.n; i++) {
        memcpy(at, ps.items[i]->grad->data, (size_t)ps.items[i]->numel * sizeof *g);
        at += ps.items[i]->numel;
        TH_RC(na_tensor_zero_grad(ps.items[i]));
    }
    *n = total;
    return g;
}

Test(memory, backward_gives_back_what_a_sequential_passes_between_children) {
    na_manual_seed(3);
    na_module *m = deep_mlp();
    cr_assert_not_null(m, "%s", na_last_error());
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(SEQ_BATCH, SEQ_WIDTH), -1, 1));
    size_t before = na_arena_used(NA_DEVICE_CPU);
    na_tensor *out = TH_OK(na_module_forward(m, x));
    na_tensor *loss = TH_OK(na_sum(out));
    float out0 = ((float *)out->data)[5];
    size_t forward = na_arena_used(NA_DEVICE_CPU) - before;
    size_t block = SEQ_BATCH * SEQ_WIDTH * sizeof(float);
    cr_assert(forward >= 16 * block, "the forward holds %zu bytes", forward);

    /* a walk that retains changes nothing, and gives the same gradients as one that frees */
    TH_RC(na_backward_retain(loss, NULL));
    cr_assert_geq(na_arena_used(NA_DEVICE_CPU) - before, forward);
    size_t n1, n2;
    float *g1 = param_grads(m, &n1);
    TH_RC(na_backward(loss, NULL));
    float *g2 = param_grads(m, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(g1, g2, n1 * sizeof *g1), 0, "gradients differ when activations are freed");
    free(g1);
    free(g2);

    /* what is left of the forward: the output, what the module's layers made inside (Linear's
     * matmul before its bias), the loss; not the 15 activations handed along */
    size_t after = na_arena_used(NA_DEVICE_CPU) - before;
    cr_assert(after + 15 * block <= forward + 1024, "after backward %zu bytes of the forward's %zu "
              "are still held (an activation is %zu)", after, forward, block);
    for (int i = 0; i < 8; i++) TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(SEQ_BATCH, SEQ_WIDTH), 5, 6));
    cr_assert_eq(((float *)out->data)[5], out0, "the model's output (held by the user) changed");

    /* the graph is used up: walking it again fails and says how to keep it */
    TH_EXPECT_STATUS(na_backward(loss, NULL), NA_ESTATE, "na_backward_retain");
    na_step_end();
    na_module_free(m);
}

/* A Sequential whose result is a view (Flatten) of what its last-but-one child made: that
 * memory is the user's. */
Test(memory, a_sequential_result_that_views_an_activation_survives) {
    na_manual_seed(5);
    na_module *m = NA_SEQUENTIAL(na_conv2d_new(2, 4, 3, 3, &(na_conv2d_opts){.padding = {1, 1}}, true),
                                 na_relu_new(), na_flatten_new(1));
    cr_assert_not_null(m, "%s", na_last_error());
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 2, 16, 16), -1, 1));
    na_tensor *y = TH_OK(na_module_forward(m, x));
    cr_assert_not_null(y->base, "Flatten should return a view");
    size_t bytes = (size_t)y->numel * sizeof(float);
    float *y0 = malloc(bytes);
    memcpy(y0, y->data, bytes);
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(y, y)))), NULL));
    for (int i = 0; i < 8; i++) TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4, 4, 16, 16), 5, 6));
    cr_assert_not_null(y->base->data);
    cr_assert_eq(memcmp(y->data, y0, bytes), 0, "the result the user holds changed");
    free(y0);
    na_step_end();
    na_module_free(m);
}

/* What an op makes for its own backward (max pool's indices) goes back after that backward. */
Test(memory, an_ops_saved_temporaries_go_back) {
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(8, 16, 32, 32), -1, 1));
    TH_RC(na_tensor_set_requires_grad(x, true));
    na_tensor *y = TH_OK(na_max_pool2d(x, &(na_pool2d_opts){.kernel = {2, 2}}));
    na_tensor *loss = TH_OK(na_sum(y));
    size_t forward = na_arena_used(NA_DEVICE_CPU);
    size_t idx = (size_t)y->numel * sizeof(int32_t);
    TH_RC(na_backward_retain(loss, NULL));
    size_t retained = na_arena_used(NA_DEVICE_CPU);
    TH_RC(na_backward(loss, NULL));
    size_t freed = na_arena_used(NA_DEVICE_CPU);
    cr_assert(retained >= forward && freed + idx <= retained + 1024, /* + the root's ones */ "forward %zu, after the retaining "
              "walk %zu, after the last %zu: the indices (%zu bytes) stay", forward, retained,
              freed, idx);
    cr_assert_not_null(y->data, "the pool's output is the user's");
    TH_EXPECT_STATUS(na_backward(loss, NULL), NA_ESTATE, "graph of sum was already walked",
                     "na_backward_retain");
    na_step_end();
}

/* The CPU kernels' scratch (here im2col columns of a convolution, on the GEMM path) is
 * counted. */
Test(memory, cpu_scratch_is_counted) {
    na_cpu_conv_force_gemm = true;
    size_t before = na_cpu_scratch_peak();
    na_tensor *x = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(8, 64, 64, 64), -1, 1));
    na_tensor *w = TH_OK(na_rand(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(64, 64, 3, 3), -1, 1));
    TH_OK(na_conv2d(x, w, NULL, &(na_conv2d_opts){.padding = {1, 1}}));
    size_t cols = (size_t)64 * 9 * 64 * 64 * sizeof(float); /* one image's columns */
    cr_assert_geq(na_cpu_scratch_peak(), before);
    cr_assert_geq(na_cpu_scratch_peak(), cols, "scratch peak %zu bytes, one image's columns are "
                  "%zu", na_cpu_scratch_peak(), cols);
    cr_assert_geq(na_cpu_scratch_peak(), na_cpu_scratch_bytes());
    cr_assert_gt(na_cpu_scratch_bytes(), 0);
    na_cpu_conv_force_gemm = false;
    na_step_end();
}
