/* tests/test_profile.c — the profiler (nanoamp/profile.h): calls per op kind and per layer of
 * a small known graph, forward and backward; times that add up to the wall time; nothing
 * recorded unless asked; the CPU clock; misuse. */
#include "helpers.h"
#include "nanoamp/profile.h"

/* Linear(3, 4) -> ReLU -> Linear(4, 2), summed: a graph whose op counts are known. */
static na_tensor *mlp_loss(na_module *net) {
    na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(2, 3), 1, -2, 0.5, 0.25, 3, -1);
    return TH_OK(na_sum(TH_OK(na_module_forward(net, x))));
}

static na_module *mlp(void) {
    na_manual_seed(1);
    na_module *net = NA_SEQUENTIAL(na_linear_new(3, 4, true), na_relu_new(),
                                   na_linear_new(4, 2, true));
    cr_assert_not_null(net, "%s", na_last_error());
    return net;
}

static int64_t calls_of(const char *name) {
    const na_profile_row *r = na_profile_op(name);
    return r ? r->calls : 0;
}

static const na_profile_row *layer_row(const char *name) {
    const na_profile_row *rows;
    int n = na_profile_layers(&rows);
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].name, name)) return &rows[i];
    return NULL;
}

Test(profile, counts_each_op_kind_forward_and_backward) {
    na_module *net = mlp();
    TH_RC(na_profile_begin());
    cr_assert(na_profile_running());
    TH_RC(na_backward(mlp_loss(net), NULL));
    TH_RC(na_profile_end());
    cr_assert(!na_profile_running());
    cr_assert_eq(calls_of("linear"), 2);
    cr_assert_eq(calls_of("relu"), 1);
    cr_assert_eq(calls_of("sum"), 1);
    cr_assert_eq(calls_of("linear backward"), 2);
    cr_assert_eq(calls_of("relu backward"), 1);
    cr_assert_eq(calls_of("sum backward"), 1);
    /* the backward's own ops (matmul, sum) count to the node they serve */
    cr_assert_eq(calls_of("matmul"), 0);
    cr_assert_eq(calls_of("(outside ops)"), 1);
    const na_profile_row *rows;
    int n = na_profile_ops(&rows);
    cr_assert_eq(n, 7, "6 op kinds and the time outside ops, got %d rows", n);
    /* each layer: its forward and its backward */
    const char *layers[] = {"0 (Linear)", "1 (ReLU)", "2 (Linear)"};
    for (int i = 0; i < 3; i++) {
        const na_profile_row *r = layer_row(layers[i]);
        cr_assert_not_null(r, "layer %s missing", layers[i]);
        cr_assert_eq(r->calls, 2, "%s: %lld calls", layers[i], (long long)r->calls);
    }
    cr_assert_eq(layer_row("(no module)")->calls, 2, "the sum and its backward");
    na_module_free(net);
    na_step_end();
    na_profile_reset();
}

Test(profile, times_are_non_negative_and_add_up_to_the_wall_time) {
    na_module *net = mlp();
    TH_RC(na_profile_begin());
    for (int i = 0; i < 3; i++) TH_RC(na_backward(mlp_loss(net), NULL));
    TH_RC(na_profile_end());
    const na_profile_row *rows;
    int n = na_profile_ops(&rows);
    double sum = 0, wall = na_profile_wall_ms();
    cr_assert(wall > 0);
    for (int i = 0; i < n; i++) {
        cr_assert(rows[i].ms >= 0, "%s: %g ms", rows[i].name, rows[i].ms);
        cr_assert(i == 0 || rows[i].ms <= rows[i - 1].ms, "rows are sorted by time");
        sum += rows[i].ms;
    }
    cr_assert(sum <= wall * (1 + 1e-9) + 1e-9, "rows %g ms, wall %g ms", sum, wall);
    cr_assert(sum >= wall * 0.999, "the rows cover the step: %g of %g ms", sum, wall);
    cr_assert_eq(calls_of("linear backward"), 6);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    na_profile_print(f);
    fclose(f);
    cr_assert(strstr(buf, "linear backward") && strstr(buf, "% step") && strstr(buf, "1 (ReLU)"),
              "%s", buf);
    free(buf);
    na_module_free(net);
    na_step_end();
    na_profile_reset();
}

/* NANOAMP_PROFILE_CLOCK=cpu: the thread's CPU time, so 60 ms asleep between two ops count
 * in the wall clock's profile and not in the CPU clock's (read at each na_profile_begin) */
static double profile_with_a_sleep(void) {
    na_module *net = mlp();
    TH_RC(na_profile_begin());
    TH_RC(na_backward(mlp_loss(net), NULL));
    nanosleep(&(struct timespec){0, 60 * 1000 * 1000}, NULL);
    TH_RC(na_backward(mlp_loss(net), NULL));
    TH_RC(na_profile_end());
    double wall = na_profile_wall_ms();
    const na_profile_row *r = na_profile_op("linear");
    cr_assert(r && r->ms >= 0 && r->ms <= wall, "linear %g of %g ms", r ? r->ms : -1, wall);
    na_module_free(net);
    na_step_end();
    na_profile_reset();
    return wall;
}

Test(profile, cpu_clock_leaves_out_the_time_asleep) {
    cr_assert(profile_with_a_sleep() >= 60, "wall clock");
    setenv("NANOAMP_PROFILE_CLOCK", "cpu", 1);
    double cpu = profile_with_a_sleep();
    unsetenv("NANOAMP_PROFILE_CLOCK");
    cr_assert(cpu > 0 && cpu < 30, "CPU clock: %g ms", cpu);
    cr_assert(profile_with_a_sleep() >= 60, "wall clock again");
}

Test(profile, off_by_default_and_after_reset) {
    na_module *net = mlp();
    TH_RC(na_backward(mlp_loss(net), NULL));
    const na_profile_row *rows;
    cr_assert_eq(na_profile_ops(&rows), 0, "no profile ran: no rows");
    cr_assert_null(rows);
    cr_assert_eq(na_profile_layers(&rows), 0);
    cr_assert_null(na_profile_op("linear"));
    TH_RC(na_profile_begin());
    TH_RC(na_backward(mlp_loss(net), NULL));
    TH_RC(na_profile_end());
    cr_assert_gt(na_profile_ops(&rows), 0);
    na_profile_reset();
    cr_assert_eq(na_profile_ops(&rows), 0, "reset drops the results");
    TH_RC(na_backward(mlp_loss(net), NULL));
    cr_assert_eq(na_profile_ops(&rows), 0, "and records nothing after");
    na_module_free(net);
    na_step_end();
}

Test(profile, misuse_is_an_error) {
    TH_EXPECT_STATUS(na_profile_end(), NA_ESTATE, "na_profile_end", "no profile");
    TH_RC(na_profile_begin());
    TH_EXPECT_STATUS(na_profile_begin(), NA_ESTATE, "na_profile_begin", "already running");
    TH_RC(na_profile_end());
    na_profile_reset();
}
