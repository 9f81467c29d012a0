/* The CPU thread pool (nanoamp/threads.h, kernels/cpu/cpu_parallel.h): every task runs exactly
 * once for any task count, nested loops and pool sizes; na_set_num_threads checks its
 * argument; and training steps of the MNIST CNN (conv + BatchNorm + ReLU + max pool + linear,
 * forward, backward, SGD) and of the MLP give bit-identical parameters with 1, 2 and 4
 * threads. The batch is large enough that every kernel of the step is split into several
 * tasks (and the weight gradient of the convolutions into several partials). */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../examples/common/models.h"
#include "cpu/cpu_parallel.h"
#include "nanoamp.h"

/* ---- the pool --------------------------------------------------------------------------- */

#define MAX_TASKS 1200

typedef struct {
    atomic_int runs[MAX_TASKS];
    atomic_int inline_inner; /* inner tasks that ran inside a task (nested loops run inline) */
    int64_t inner;           /* tasks of the nested loop each task runs (0: none) */
} counts;

static void count_inner(void *ctx, int64_t t) {
    counts *c = ctx;
    (void)t;
    if (na_cpu_in_parallel()) atomic_fetch_add(&c->inline_inner, 1);
}

static void count_task(void *ctx, int64_t t) {
    counts *c = ctx;
    atomic_fetch_add(&c->runs[t], 1);
    if (c->inner) na_cpu_parallel_for(c->inner, count_inner, c);
}

static void check_once_each(int64_t n, int64_t inner) {
    static counts c;
    memset(&c, 0, sizeof c);
    c.inner = inner;
    cr_assert_eq(na_cpu_parallel_for(n, count_task, &c), 0);
    for (int64_t t = 0; t < MAX_TASKS; t++)
        cr_assert_eq(atomic_load(&c.runs[t]), t < n ? 1 : 0,
                     "threads %d, %lld tasks: task %lld ran %d times", na_get_num_threads(),
                     (long long)n, (long long)t, atomic_load(&c.runs[t]));
    cr_assert_eq(atomic_load(&c.inline_inner), n * inner, "nested loops must run inline");
    cr_assert(!na_cpu_in_parallel(), "the caller is no longer in a task after the loop");
}

Test(threads, every_task_runs_once) {
    const int64_t sizes[] = {0, 1, 2, 3, 7, 17, 255, 1001};
    const int threads[] = {1, 2, 3, 4, 2, 1};
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        cr_assert_eq(na_set_num_threads(threads[i]), NA_OK, "%s", na_last_error());
        cr_assert_eq(na_get_num_threads(), threads[i]);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            check_once_each(sizes[k], 0);
            check_once_each(sizes[k], 3);
        }
    }
}

Test(threads, workers_follow_the_size) {
    cr_assert_eq(na_set_num_threads(1), NA_OK);
    check_once_each(64, 0);
    int64_t started = na_cpu_pool_threads_started;
    cr_assert_eq(na_set_num_threads(4), NA_OK);
    cr_assert_eq(na_cpu_pool_threads_started, started, "workers start lazily, on a loop");
    check_once_each(64, 0);
    cr_assert_eq(na_cpu_pool_threads_started, started + 3, "a pool of 4 has 3 workers");
    check_once_each(64, 0);
    cr_assert_eq(na_cpu_pool_threads_started, started + 3, "and keeps them between loops");
    cr_assert_eq(na_set_num_threads(2), NA_OK);
    check_once_each(64, 0);
    cr_assert_eq(na_cpu_pool_threads_started, started + 4, "resized: 1 new worker");
}

Test(threads, set_num_threads_checks_its_argument) {
    cr_assert_eq(na_set_num_threads(3), NA_OK);
    const int bad[] = {0, -1, NA_MAX_THREADS + 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        na_clear_error();
        cr_assert_eq(na_set_num_threads(bad[i]), NA_EINVAL);
        char want[32];
        snprintf(want, sizeof want, "got %d", bad[i]);
        cr_assert(strstr(na_last_error(), "na_set_num_threads") &&
                      strstr(na_last_error(), want),
                  "message: %s", na_last_error());
        cr_assert_eq(na_get_num_threads(), 3, "a refused size changes nothing");
    }
}

/* a failing task's status and message reach the caller's thread, whichever thread ran it */
static void fail_task(void *ctx, int64_t t) {
    if (t == 5) {
        na_set_error(NA_ENOMEM, "task %lld failed", (long long)t);
        na_cpu_task_fail(ctx);
    }
}

Test(threads, task_errors_reach_the_caller) {
    for (int threads = 1; threads <= 4; threads *= 2) {
        cr_assert_eq(na_set_num_threads(threads), NA_OK);
        for (int round = 0; round < 20; round++) {
            na_clear_error();
            na_cpu_task_status st = {0};
            na_cpu_parallel_for(64, fail_task, &st);
            cr_assert_eq(na_cpu_task_status_raise(&st), NA_ENOMEM);
            cr_assert_str_eq(na_last_error(), "task 5 failed");
        }
        na_cpu_task_status ok = {0};
        cr_assert_eq(na_cpu_task_status_raise(&ok), NA_OK);
    }
}

/* each Test runs in a fresh process, so the pool's size is still unresolved here */
Test(threads, default_from_the_environment) {
    setenv("NANOAMP_THREADS", "3", 1);
    cr_assert_eq(na_get_num_threads(), 3);
}

Test(threads, bad_environment_means_the_core_count) {
    setenv("NANOAMP_THREADS", "0", 1);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cr_assert_eq(na_get_num_threads(), cores < 1 ? 1 : cores > NA_MAX_THREADS ? NA_MAX_THREADS
                                                                             : (int)cores);
}

/* ---- training steps --------------------------------------------------------------------- */

#define STEPS 2

/* The parameters after STEPS SGD steps of model `name` on one fixed batch of `batch` images
 * with `threads` threads, forward and loss under autocast to `amp` (F32: none), as one
 * malloc'd array of f32 (its length in *count). */
static float *train(const char *name, int64_t batch, int threads, na_dtype amp, int64_t *count) {
    cr_assert_eq(na_set_num_threads(threads), NA_OK, "%s", na_last_error());
    na_manual_seed(7);
    int64_t shape[4];
    na_module *net = model_by_name(name, shape);
    cr_assert_not_null(net, "%s", na_last_error());
    shape[0] = batch;
    na_tensor *x = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, 4, shape);
    na_tensor *y = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(batch));
    int32_t labels[128];
    cr_assert(batch <= 128);
    for (int i = 0; i < batch; i++) labels[i] = (i * 7) % 10;
    cr_assert_eq(na_copy_(x, na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, 4, shape, 0.0, 1.0)), NA_OK);
    cr_assert_eq(na_copy_from_host(y, labels), NA_OK);
    na_step_end();
    na_sgd_cfg cfg = NA_SGD_DEFAULTS;
    cfg.lr = 0.05, cfg.momentum = 0.9;
    na_optim *opt = na_sgd_new(na_module_parameters(net), &cfg);
    cr_assert_not_null(opt, "%s", na_last_error());
    na_module_train(net, true);
    for (int s = 0; s < STEPS; s++) {
        if (amp != NA_DTYPE_F32) cr_assert_eq(na_autocast_begin(amp), NA_OK, "%s", na_last_error());
        na_tensor *loss = na_cross_entropy(na_module_forward(net, x), y, NULL);
        if (amp != NA_DTYPE_F32) na_autocast_end();
        cr_assert_not_null(loss, "%s", na_last_error());
        cr_assert_eq(na_backward(loss, NULL), NA_OK, "%s", na_last_error());
        cr_assert_eq(na_optim_step(opt, NULL), NA_OK, "%s", na_last_error());
        na_optim_zero_grad(opt);
        na_step_end();
    }
    na_named_tensors st = {0};
    cr_assert_eq(na_module_state(net, "", &st), NA_OK); /* parameters and BN statistics */
    *count = 0;
    for (int64_t i = 0; i < st.n; i++) *count += st.items[i].tensor->numel;
    float *all = malloc(sizeof(float) * (size_t)*count), *at = all;
    for (int64_t i = 0; i < st.n; i++) {
        na_tensor *t = st.items[i].tensor;
        if (t->dtype != NA_DTYPE_F32) continue; /* BatchNorm's step counter */
        cr_assert_eq(na_copy_to_host(t, at), NA_OK, "%s", na_last_error());
        at += t->numel;
    }
    *count = at - all;
    na_named_tensors_free(&st);
    na_optim_free(opt);
    na_module_free(net);
    na_tensor_free(x);
    na_tensor_free(y);
    return all;
}

static void same_for_any_thread_count(const char *name, int64_t batch, na_dtype amp) {
    int64_t n1, n;
    float *one = train(name, batch, 1, amp, &n1);
    int64_t started = na_cpu_pool_threads_started;
    const int threads[] = {2, 4};
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        float *many = train(name, batch, threads[i], amp, &n);
        cr_assert_eq(n, n1);
        int64_t first = -1;
        for (int64_t k = 0; k < n && first < 0; k++)
            if (memcmp(&one[k], &many[k], sizeof(float))) first = k;
        cr_assert_eq(first, -1, "%s: %d threads differ from 1 at value %lld: %.9g vs %.9g", name,
                     threads[i], (long long)first, first < 0 ? 0 : many[first],
                     first < 0 ? 0 : one[first]);
        free(many);
    }
    cr_assert_gt(na_cpu_pool_threads_started, started, "the pool's workers ran");
    free(one);
}

Test(threads, cnn_step_bit_identical_for_1_2_4_threads) {
    same_for_any_thread_count("cnn", 32, NA_DTYPE_F32);
}

/* the MLP's products are split from about 16 MFLOP: batch 128 */
Test(threads, mlp_step_bit_identical_for_1_2_4_threads) {
    same_for_any_thread_count("mlp", 128, NA_DTYPE_F32);
}

/* bf16 autocast: its products run on vdpbf16ps where the CPU has AVX512_BF16, split the same way */
Test(threads, mlp_bf16_step_bit_identical_for_1_2_4_threads) {
    same_for_any_thread_count("mlp", 128, NA_DTYPE_BF16);
}
