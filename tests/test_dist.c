/* The communicator, DDP wrapper and SyncBatchNorm in a world of one process (always runs, with
 * or without MPI), and the engine's leaf hook they stand on. The multi-process checks are
 * tests/test_dist_mpi.c, run under mpirun. */
#include "helpers.h"
#include "nanoamp/cuda.h"
#include "nanoamp/dist.h"
#include "nanoamp/nn.h"
#include "src/autograd/graph.h" /* the leaf hook */
#include "src/dist/dist_internal.h" /* the SyncBatchNorm path hook */

static void clear_launcher_env(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                          "NANOAMP_DIST_COLLECTIVES"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

Test(dist, world_of_one_collectives_are_identities) {
    clear_launcher_env();
    na_dist *d = na_dist_init();
    cr_assert_not_null(d, "%s", na_last_error());
    cr_assert_eq(na_dist_rank(d), 0);
    cr_assert_eq(na_dist_world_size(d), 1);
    cr_assert_eq(na_dist_rank(NULL), 0);
    cr_assert_eq(na_dist_world_size(NULL), 1);
    na_dtype dts[] = {NA_DTYPE_F64, NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16, NA_DTYPE_I32};
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
        na_tensor *t = TH_OK(na_from_host(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(3),
                                          TH_V(1, -2, 3)));
        t = TH_OK(na_cast(t, dts[k]));
        TH_RC(na_dist_all_reduce(d, t, NA_DIST_SUM));
        TH_RC(na_dist_all_reduce(d, t, NA_DIST_MAX));
        if (na_dtype_is_float(dts[k])) TH_RC(na_dist_all_reduce(d, t, NA_DIST_AVG));
        TH_RC(na_dist_broadcast(d, t, 0));
        na_tensor *g = TH_OK(na_zeros(dts[k], NA_DEVICE_CPU, NA_SHAPE(1, 3)));
        TH_RC(na_dist_all_gather(d, t, g));
        static const double want[3] = {1, -2, 3};
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(na_get(t, i), want[i], "%s", na_dtype_name(dts[k]));
            cr_assert_eq(na_get(g, i), na_get(t, i));
        }
    }
    int64_t c[2] = {5, 7};
    double f[1] = {2.5};
    TH_RC(na_dist_all_reduce_i64(d, c, 2, NA_DIST_SUM));
    TH_RC(na_dist_all_reduce_f64(d, f, 1, NA_DIST_AVG));
    cr_assert(c[0] == 5 && c[1] == 7 && f[0] == 2.5);
    TH_RC(na_dist_check_same(d, 42, "flags"));
    TH_RC(na_dist_barrier(d));
    cr_assert_eq(na_dist_bytes(d), 0, "a world of 1 sends nothing");
    na_dist_free(d);
    na_step_end();
}

/* No other rank waits in a world of 1: na_dist_abort hands the code back and the process goes
 * on (the multi-rank abort is dist_mpi_abort). */
Test(dist, abort_in_a_world_of_one_returns_the_code) {
    clear_launcher_env();
    na_dist *d = na_dist_init();
    cr_assert_not_null(d, "%s", na_last_error());
    cr_assert_eq(na_dist_abort(d, 7), 7);
    cr_assert_eq(na_dist_abort(NULL, 3), 3);
    TH_RC(na_dist_barrier(d)); /* still usable */
    na_dist_free(d);
}

Test(dist, misuse_is_reported) {
    clear_launcher_env();
    na_dist *d = na_dist_init();
    cr_assert_not_null(d);
    na_tensor *i = TH_OK(na_zeros(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2)));
    cr_assert_eq(na_dist_all_reduce(d, i, NA_DIST_AVG), NA_EDTYPE);
    cr_assert(strstr(na_last_error(), "AVG") && strstr(na_last_error(), "rank 0"));
    na_tensor *f8 = TH_OK(na_zeros(NA_DTYPE_F8E5M2, NA_DEVICE_CPU, NA_SHAPE(2)));
    cr_assert_eq(na_dist_all_reduce(d, f8, NA_DIST_SUM), NA_EDTYPE); /* no FP8 sums */
    cr_assert(strstr(na_last_error(), "na_dist_all_reduce") && strstr(na_last_error(), "f8e5m2"),
              "%s", na_last_error());
    cr_assert_eq(na_dist_all_reduce(NULL, i, NA_DIST_SUM), NA_EINVAL);
    cr_assert_eq(na_dist_broadcast(d, i, 1), NA_EINVAL);
    cr_assert(strstr(na_last_error(), "root 1"));
    na_tensor *g = TH_OK(na_zeros(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2, 2)));
    cr_assert_eq(na_dist_all_gather(d, i, g), NA_ESHAPE);
    na_tensor *m = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3)));
    cr_assert_eq(na_dist_all_reduce(d, TH_OK(na_transpose(m, 0, 1)), NA_DIST_SUM), NA_EINVAL);
    cr_assert(strstr(na_last_error(), "not contiguous"));
    cr_assert_eq(na_dist_all_reduce_i64(d, NULL, 1, NA_DIST_SUM), NA_EINVAL);
    int64_t one = 1;
    cr_assert_eq(na_dist_all_reduce_i64(d, &one, 1, NA_DIST_AVG), NA_EINVAL);
    na_dist_free(d);
    na_step_end();
}

Test(dist, launcher_environment_is_checked) {
    clear_launcher_env();
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "5", 1);
    cr_assert_null(na_dist_init());
    cr_assert_eq(na_last_status(), NA_EINVAL);
    cr_assert(strstr(na_last_error(), "RANK=5"), "%s", na_last_error());
    setenv("RANK", "x", 1);
    cr_assert_null(na_dist_init());
    setenv("WORLD_SIZE", "1", 1);
    setenv("RANK", "0", 1);
    na_dist *d = na_dist_init();
    cr_assert_not_null(d, "WORLD_SIZE=1 is a world of one: %s", na_last_error());
    na_dist_free(d);
    if (!na_dist_built_with_mpi()) { /* a real multi-rank launch needs MPI */
        setenv("WORLD_SIZE", "2", 1);
        cr_assert_null(na_dist_init());
        cr_assert_eq(na_last_status(), NA_ENOTSUP);
        cr_assert(strstr(na_last_error(), "without MPI"), "%s", na_last_error());
    }
    clear_launcher_env();
}

/* ---- the engine's leaf hook ---------------------------------------------------------------- */

typedef struct {
    na_tensor *seen[8];
    double grad_then[8]; /* the leaf's grad[0] when the hook fired */
    int n, fail_at;
} hook_log;

static int log_leaf(na_tensor *leaf, void *ctx) {
    hook_log *l = ctx;
    if (l->n == l->fail_at) return na_set_error(NA_EIO, "hook refused");
    l->seen[l->n] = leaf;
    l->grad_then[l->n++] = leaf->grad ? na_get(leaf->grad, 0) : NAN;
    return NA_OK;
}

Test(dist, leaf_hook_fires_once_per_leaf_when_its_grad_is_final) {
    /* loss = sum(a * b + a) * sum(c): a has two consumers; the engine runs the first input's
     * branch first, so a and b (last consumer a * b, a its input 0) are final before c */
    na_tensor *a = TH_OK(na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    na_tensor *b = TH_OK(na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2)));
    na_tensor *c = TH_OK(na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1)));
    TH_RC(na_fill_(a, 2));
    TH_RC(na_fill_(b, 3));
    TH_RC(na_fill_(c, 5));
    na_tensor *leaves[3] = {a, b, c};
    for (int i = 0; i < 3; i++) TH_RC(na_tensor_set_requires_grad(leaves[i], true));
    hook_log log = {.fail_at = -1};
    na_graph_leaf_hook old = na_graph_set_leaf_hook((na_graph_leaf_hook){log_leaf, &log});
    na_tensor *loss = TH_OK(na_mul(na_sum(na_add(na_mul(a, b), a)), na_sum(c)));
    TH_RC(na_backward(loss, NULL));
    cr_assert_eq(log.n, 3, "each leaf once, got %d calls", log.n);
    cr_assert(log.seen[0] == a && log.seen[1] == b && log.seen[2] == c, "order a, b, c");
    for (int k = 0; k < 3; k++) /* final: equal to the gradient once backward is over */
        cr_assert_eq(log.grad_then[k], na_get(log.seen[k]->grad, 0), "leaf %d", k);
    cr_assert_eq(na_get(a->grad, 0), 5 * (3 + 1));

    log = (hook_log){.fail_at = 1}; /* a failing hook stops backward with its status */
    loss = TH_OK(na_mul(na_sum(na_add(na_mul(a, b), a)), na_sum(c)));
    cr_assert_eq(na_backward(loss, NULL), NA_EIO);
    cr_assert(strstr(na_last_error(), "hook refused"));
    na_graph_set_leaf_hook(old);
    na_step_end();
    for (int i = 0; i < 3; i++) na_tensor_free(leaves[i]);
}

/* ---- DDP and SyncBatchNorm in a world of one ------------------------------------------------ */

static na_module *mlp(void) {
    na_manual_seed(7);
    return NA_SEQUENTIAL(na_linear_new(6, 16, true), na_batch_norm1d_new(16, NULL),
                         na_relu_new(), na_linear_new(16, 3, true));
}

static double step_grads(na_module *net, na_ddp *ddp, double *g, int64_t n) {
    na_manual_seed(11);
    na_tensor *x = na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(8, 6), 0, 1);
    na_tensor *y = na_arange(NA_DTYPE_I32, NA_DEVICE_CPU, 0, 8, 1);
    y = na_cast(na_scale(na_cast(y, NA_DTYPE_F32), 0.25), NA_DTYPE_I32);
    na_tensor *loss = TH_OK(na_cross_entropy(na_module_forward(net, x), y, NULL));
    double l = na_item(loss);
    TH_RC(na_module_zero_grad(net));
    TH_RC(na_backward(loss, NULL));
    if (ddp) TH_RC(na_ddp_finish(ddp));
    na_tensor_list ps = na_module_parameters(net);
    int64_t k = 0;
    for (int64_t i = 0; i < ps.n; i++)
        for (int64_t j = 0; j < ps.items[i]->numel && k < n; j++) g[k++] = na_get(ps.items[i]->grad, j);
    na_step_end();
    return l;
}

Test(dist, ddp_in_a_world_of_one_leaves_gradients_and_counts_bytes) {
    clear_launcher_env();
    na_dist *d = na_dist_init();
    na_module *net = mlp();
    int64_t np = na_module_num_params(net);
    double *g0 = calloc((size_t)np, sizeof *g0), *g1 = calloc((size_t)np, sizeof *g1);
    double l0 = step_grads(net, NULL, g0, np);
    na_ddp *ddp = na_ddp_new(d, net, &(na_ddp_config){.bucket_bytes = 256});
    cr_assert_not_null(ddp, "%s", na_last_error());
    cr_assert_null(na_ddp_new(d, net, NULL), "one wrapper at a time");
    cr_assert(strstr(na_last_error(), "another na_ddp"));
    /* 256-byte buckets, reverse order: {12 + 192 bytes}, {64 + 64 + 64}, {384 alone} */
    cr_assert_eq(na_ddp_num_buckets(ddp), 3, "got %d", na_ddp_num_buckets(ddp));
    double l1 = step_grads(net, ddp, g1, np);
    cr_assert_eq(l0, l1);
    for (int64_t i = 0; i < np; i++) cr_assert_eq(g0[i], g1[i], "grad %" PRId64, i);
    cr_assert_eq(na_ddp_bytes_last_step(ddp), 4 * np);
    TH_RC(na_ddp_set_sync(ddp, false)); /* accumulation: nothing counted, grads untouched */
    step_grads(net, ddp, g1, np);
    cr_assert_eq(na_ddp_bytes_last_step(ddp), 4 * np, "the last synced step's bytes stay");
    na_ddp_free(ddp);
    ddp = na_ddp_new(d, net, &(na_ddp_config){.allreduce_dtype = NA_DTYPE_BF16});
    cr_assert_not_null(ddp, "%s", na_last_error());
    cr_assert_eq(na_ddp_num_buckets(ddp), 1);
    step_grads(net, ddp, g1, np);
    cr_assert_eq(na_ddp_bytes_last_step(ddp), 2 * np, "bf16 buckets: half the bytes");
    na_ddp_free(ddp);
    cr_assert_null(na_ddp_new(d, net, &(na_ddp_config){.allreduce_dtype = NA_DTYPE_I32}));
    cr_assert_eq(na_last_status(), NA_EDTYPE);
    free(g0);
    free(g1);
    na_module_free(net);
    na_dist_free(d);
}

Test(dist, sync_batchnorm_in_a_world_of_one_is_batchnorm) {
    clear_launcher_env();
    na_dist *d = na_dist_init();
    na_module *net = mlp();
    int64_t np = na_module_num_params(net);
    double *g0 = calloc((size_t)np, sizeof *g0), *g1 = calloc((size_t)np, sizeof *g1);
    double l0 = step_grads(net, NULL, g0, np);
    TH_RC(na_module_sync_batchnorm(net, d));
    double l1 = step_grads(net, NULL, g1, np);
    cr_assert_eq(l0, l1);
    for (int64_t i = 0; i < np; i++) cr_assert_eq(g0[i], g1[i], "grad %" PRId64, i);
    TH_RC(na_module_sync_batchnorm(net, NULL));
    cr_assert_eq(na_module_sync_batchnorm(NULL, d), NA_EINVAL);
    free(g0);
    free(g1);
    na_module_free(net);
    na_dist_free(d);
}

/* ---- NANOAMP_DIST_COLLECTIVES=1: a world of 1 through the real paths ----------------------- */

static na_dist *world_of_one_with_collectives(void) {
    clear_launcher_env();
    setenv("NANOAMP_DIST_COLLECTIVES", "1", 1);
    na_dist *d = na_dist_init();
    unsetenv("NANOAMP_DIST_COLLECTIVES"); /* read once: d keeps it */
    cr_assert_not_null(d, "%s", na_last_error());
    cr_assert(na_dist_collectives(d) && na_dist_world_size(d) == 1);
    return d;
}

/* Plain SGD on the MLP for a few steps; every loss into loss[], the parameters at the end into
 * p[]. With ddp, its buckets carry the gradients. */
static void sgd_steps(na_dist *d, const na_ddp_config *cfg, double *loss, int steps, double *p,
                      int64_t np, int64_t *bytes_last) {
    na_module *net = mlp();
    na_ddp *ddp = d ? na_ddp_new(d, net, cfg) : NULL;
    cr_assert(!d || ddp, "%s", na_last_error());
    na_optim *opt = na_sgd_new(na_module_parameters(net), &(na_sgd_cfg){.lr = 0.1});
    cr_assert_not_null(opt, "%s", na_last_error());
    double g[1];
    for (int s = 0; s < steps; s++) {
        loss[s] = step_grads(net, ddp, g, 1);
        TH_RC(na_optim_step(opt, NULL));
        na_step_end();
    }
    na_tensor_list ps = na_module_parameters(net);
    int64_t k = 0;
    for (int64_t i = 0; i < ps.n; i++)
        for (int64_t j = 0; j < ps.items[i]->numel && k < np; j++) p[k++] = na_get(ps.items[i], j);
    if (bytes_last) *bytes_last = na_ddp_bytes_last_step(ddp);
    na_optim_free(opt);
    na_ddp_free(ddp);
    na_module_free(net);
}

Test(dist, collectives_switch_runs_ddp_buckets_on_the_cpu_with_plain_results) {
    na_dist *d = world_of_one_with_collectives();
    na_module *probe = mlp();
    int64_t np = na_module_num_params(probe);
    /* what na_ddp_new broadcasts from rank 0, and na_ddp_finish after each step */
    int64_t state_bytes = 0, buffer_bytes = 0;
    for (int which = NA_MODULE_PARAMS; which <= NA_MODULE_BUFFERS; which++) {
        na_named_tensors st = {0};
        TH_RC(na_module_named_tensors(probe, which, "", &st));
        for (int64_t k = 0; k < st.n; k++)
            state_bytes += st.items[k].tensor->numel *
                           (int64_t)na_dtype_size(st.items[k].tensor->dtype);
        if (which == NA_MODULE_BUFFERS)
            for (int64_t k = 0; k < st.n; k++)
                buffer_bytes += st.items[k].tensor->numel *
                                (int64_t)na_dtype_size(st.items[k].tensor->dtype);
        na_named_tensors_free(&st);
    }
    na_module_free(probe);
    enum { STEPS = 4 };
    double l0[STEPS], l1[STEPS];
    double *p0 = calloc((size_t)np, sizeof *p0), *p1 = calloc((size_t)np, sizeof *p1);
    int64_t bytes_last = 0;
    sgd_steps(NULL, NULL, l0, STEPS, p0, np, NULL);
    sgd_steps(d, &(na_ddp_config){.bucket_bytes = 256}, l1, STEPS, p1, np, &bytes_last);
    for (int s = 0; s < STEPS; s++) cr_assert_eq(l0[s], l1[s], "loss of step %d", s);
    for (int64_t i = 0; i < np; i++) cr_assert_eq(p0[i], p1[i], "parameter %" PRId64, i);
    cr_assert_eq(bytes_last, 4 * np, "f32 buckets: 4 bytes a parameter, got %" PRId64, bytes_last);
    /* the bucket path ran: the broadcast at start, every bucket and the buffers' broadcast
     * after each step were handed over; without that broadcast, only the buckets */
    cr_assert_eq(na_dist_bytes(d), state_bytes + STEPS * (4 * np + buffer_bytes),
                 "counted %" PRId64, na_dist_bytes(d));
    int64_t before = na_dist_bytes(d);
    sgd_steps(d, &(na_ddp_config){.no_broadcast_buffers = true}, l1, STEPS, p1, np, NULL);
    cr_assert_eq(na_dist_bytes(d) - before, state_bytes + STEPS * 4 * np, "counted %" PRId64,
                 na_dist_bytes(d) - before);
    /* an f16 reduction really goes through f16 buckets: the parameters move, not bit-equal */
    sgd_steps(d, &(na_ddp_config){.allreduce_dtype = NA_DTYPE_F16}, l1, STEPS, p1, np,
              &bytes_last);
    cr_assert_eq(bytes_last, 2 * np);
    bool differs = false;
    for (int64_t i = 0; i < np; i++) {
        differs |= p0[i] != p1[i];
        cr_assert_float_eq(p0[i], p1[i], 1e-3, "parameter %" PRId64, i);
    }
    cr_assert(differs, "f16 buckets round the gradients");
    free(p0);
    free(p1);
    na_dist_free(d);
}

/* A CUDA tensor under the switch needs NCCL and a device: without them, a clear error, never
 * a silent no-op. No CUDA tensor can be made without a device, so a host tensor is relabelled
 * (the check fails before anything reads its data). */
Test(dist, collectives_switch_without_a_device_fails_cleanly) {
    if (na_cuda_available()) cr_skip_test("a CUDA device is present (dist_cuda covers it)");
    na_dist *d = world_of_one_with_collectives();
    na_tensor *t = TH_OK(na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(4)));
    na_tensor fake = *t;
    fake.device = NA_DEVICE_CUDA;
    int rc = na_dist_all_reduce(d, &fake, NA_DIST_SUM);
    cr_assert(rc == NA_ENOTSUP || rc == NA_ECUDA, "got %d: %s", rc, na_last_error());
    cr_assert(strstr(na_last_error(), na_dist_built_with_nccl() ? "NCCL needs a CUDA device"
                                                                : "built without NCCL"),
              "%s", na_last_error());
    cr_assert(strstr(na_last_error(), "na_dist_all_reduce"), "%s", na_last_error());
    na_dist_free(d);
    na_step_end();
}

/* On a device (the GPU check; suite dist_cuda, which meson's cuda suite runs): every
 * collective over a one-rank NCCL communicator is an identity, ordered after the kernels that
 * wrote its input, and counted. */
Test(dist_cuda, collectives_switch_goes_through_nccl) {
    if (!na_cuda_available() || !na_dist_built_with_nccl())
        cr_skip_test("needs a CUDA device and NCCL");
    na_dist *d = world_of_one_with_collectives();
    na_tensor *h = TH_OK(na_from_host(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(3), TH_V(1, -2, 3)));
    na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    int64_t bytes = 0;
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
        /* made by a kernel just before: the collective must wait for it */
        na_tensor *t = TH_OK(na_to_device(na_scale(na_cast(h, dts[k]), 1.0), NA_DEVICE_CUDA));
        TH_RC(na_dist_all_reduce(d, t, NA_DIST_SUM));
        TH_RC(na_dist_all_reduce(d, t, NA_DIST_AVG));
        TH_RC(na_dist_all_reduce(d, t, NA_DIST_MAX));
        TH_RC(na_dist_broadcast(d, t, 0));
        na_tensor *g = TH_OK(na_zeros(dts[k], NA_DEVICE_CUDA, NA_SHAPE(1, 3)));
        TH_RC(na_dist_all_gather(d, t, g));
        bytes += 5 * 3 * (int64_t)na_dtype_size(dts[k]);
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(na_get(t, i), na_get(h, i), "%s", na_dtype_name(dts[k]));
            cr_assert_eq(na_get(g, i), na_get(h, i), "%s all-gather", na_dtype_name(dts[k]));
        }
    }
    cr_assert_eq(na_dist_bytes(d), bytes);
    na_dist_free(d);
    na_step_end();
}

/* One BatchNorm2d step (forward, backward) on x [6, 4, 5, 5]: the output, x's gradient, the
 * parameters' gradients and the running statistics, in order. */
static void bn_step(na_module *bn, na_tensor *x, na_tensor *r, bool channels_last,
                    na_tensor **out) {
    TH_RC(na_tensor_zero_grad(x));
    TH_RC(na_module_zero_grad(bn));
    na_tensor *y = TH_OK(na_module_forward(bn, channels_last ? TH_OK(na_to_channels_last(x)) : x));
    TH_RC(na_backward(TH_OK(na_sum(TH_OK(na_mul(y, r)))), NULL));
    na_named_tensors st = {0};
    TH_RC(na_module_state(bn, "", &st)); /* weight, bias, running_mean, running_var, count */
    cr_assert_eq(st.n, 5);
    na_tensor *got[7] = {y, x->grad, st.items[0].tensor->grad, st.items[1].tensor->grad,
                         st.items[2].tensor, st.items[3].tensor, NULL};
    for (int k = 0; k < 6; k++) { /* copies: the next step overwrites grads and statistics */
        out[k] = TH_OK(na_empty_like(got[k]));
        TH_RC(na_copy_(out[k], got[k]));
    }
    na_named_tensors_free(&st);
}

/* With NANOAMP_DIST_COLLECTIVES=1 SyncBatchNorm runs its own forward and backward in a world
 * of 1 (its collectives add nothing): it must be BatchNorm, to f32 rounding, on data whose
 * mean is far from 0 (where sums of squares would cancel), over two steps (the second with
 * running statistics that lag the batch's), on dev, x in NCHW and channels-last memory; relu:
 * BatchNorm2d + ReLU fused (na_module_fuse_bn_relu, as the trainers run it: SyncBatchNorm
 * fuses the ReLU into its own function) against na_batch_norm_relu; x of dtype dt (f16: y and
 * x.grad rounded once from the same f32 expressions, so at mean 1 the f32 roundings of the
 * statistics stay below 1e-6 too; the SyncBatchNorm that added an f16 correction to an f16 gx
 * did not). */
static void sync_batchnorm_as_batchnorm(na_device dev, bool relu, na_dtype dt) {
    na_dist *d = world_of_one_with_collectives();
    na_module *plain = na_batch_norm2d_new(4, NULL), *sync = na_batch_norm2d_new(4, NULL);
    cr_assert(plain && sync, "%s", na_last_error());
    if (relu) {
        plain = NA_SEQUENTIAL(plain, na_relu_new());
        sync = NA_SEQUENTIAL(sync, na_relu_new());
        cr_assert(plain && sync, "%s", na_last_error());
        cr_assert_eq(na_module_fuse_bn_relu(plain), 1, "%s", na_last_error());
        cr_assert_eq(na_module_fuse_bn_relu(sync), 1, "%s", na_last_error());
    }
    TH_RC(na_module_to(plain, dev));
    TH_RC(na_module_to(sync, dev));
    TH_RC(na_module_sync_batchnorm(sync, d));
    na_manual_seed(3);
    na_tensor *x = TH_OK(na_tensor_new(dt, dev, NA_SHAPE(6, 4, 5, 5)));
    TH_RC(na_copy_(x, TH_OK(na_add_scalar(na_randn(NA_DTYPE_F32, dev, NA_SHAPE(6, 4, 5, 5), 0,
                                                   3), relu ? 1 : 40))));
    TH_RC(na_tensor_set_requires_grad(x, true));
    na_tensor *r = TH_OK(na_tensor_new(dt, dev, NA_SHAPE(6, 4, 5, 5)));
    TH_RC(na_copy_(r, TH_OK(na_randn(NA_DTYPE_F32, dev, NA_SHAPE(6, 4, 5, 5), 0, 1))));
    const char *what[6] = {"y", "x.grad", "weight.grad", "bias.grad", "running_mean", "running_var"};
    /* at mean 40 the statistics' f32 roundings can flip an f16 rounding of y */
    double tol = dt == NA_DTYPE_F16 && !relu ? 1.0 / 1024 : 1e-6;
    for (int step = 0; step < 4; step++) {
        na_tensor *a[6], *b[6];
        bn_step(plain, x, r, step >= 2, a);
        bn_step(sync, x, r, step >= 2, b);
        for (int k = 0; k < 6; k++) {
            double m = 0;
            for (int64_t i = 0; i < a[k]->numel; i++)
                m = fmax(m, fabs(na_get(a[k], i) - na_get(b[k], i)) / fmax(1.0, fabs(na_get(a[k], i))));
            cr_assert(m < tol, "step %d %s%s: SyncBatchNorm %g from BatchNorm", step,
                      relu ? "relu " : "", what[k], m);
        }
        na_step_end();
    }
    cr_assert_eq(na_dist_bytes(d) > 0, true, "SyncBatchNorm's all-reduces were handed over");
    na_tensor_free(x);
    na_tensor_free(r);
    na_module_free(plain);
    na_module_free(sync);
    na_dist_free(d);
}

Test(dist, collectives_switch_runs_sync_batchnorm_as_batchnorm) {
    sync_batchnorm_as_batchnorm(NA_DEVICE_CPU, false, NA_DTYPE_F32);
}

Test(dist, collectives_switch_runs_sync_batchnorm_relu_as_batchnorm_relu) {
    sync_batchnorm_as_batchnorm(NA_DEVICE_CPU, true, NA_DTYPE_F32);
    sync_batchnorm_as_batchnorm(NA_DEVICE_CPU, true, NA_DTYPE_F16);
    sync_batchnorm_as_batchnorm(NA_DEVICE_CPU, false, NA_DTYPE_F16);
}

/* the composition CUDA keeps until NANOAMP_CUDA_SYNCBN_ELEMT=1, through the CPU's kernels */
Test(dist, sync_batchnorm_composed_as_cuda_keeps_it_runs_as_batchnorm) {
    na_syncbn_composed_on_cpu = true;
    sync_batchnorm_as_batchnorm(NA_DEVICE_CPU, false, NA_DTYPE_F32);
    sync_batchnorm_as_batchnorm(NA_DEVICE_CPU, true, NA_DTYPE_F32);
    na_syncbn_composed_on_cpu = false;
}

/* the same through the CUDA kernels and a one-rank NCCL communicator */
Test(dist, collectives_switch_runs_sync_batchnorm_as_batchnorm_cuda) {
    if (!na_cuda_available() || !na_dist_built_with_nccl())
        cr_skip_test("needs a CUDA device and NCCL");
    for (int one_pass = 0; one_pass < 2; one_pass++) { /* the default, then the new kernels */
        if (one_pass) setenv("NANOAMP_CUDA_SYNCBN_ELEMT", "1", 1);
        sync_batchnorm_as_batchnorm(NA_DEVICE_CUDA, false, NA_DTYPE_F32);
        sync_batchnorm_as_batchnorm(NA_DEVICE_CUDA, true, NA_DTYPE_F32);
        sync_batchnorm_as_batchnorm(NA_DEVICE_CUDA, true, NA_DTYPE_F16);
    }
    unsetenv("NANOAMP_CUDA_SYNCBN_ELEMT");
}
