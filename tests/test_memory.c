/* tests/test_memory.c — the step arena's reuse of freed blocks and the backward pass giving
 * intermediate gradients back: the memory a backward adds does not grow with the depth of a
 * chain, freed blocks are reused, values stay exact where gradients share blocks (views, a
 * tensor used twice), and what the user holds stays intact. */
#include "helpers.h"
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
