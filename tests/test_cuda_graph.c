/* --cuda-graph on a GPU: the trainers' step (examples/common/amp_step.c) captured after two
 * eager steps and replayed gives what eager steps give, over a learning-rate schedule that
 * changes every step, a new batch every step, a loss scale that grows during the replays
 * (growth interval 2) and BatchNorm's count; and a step that cannot be captured is refused
 * with its reason and leaves the training state as it was. Skips without a GPU (and with
 * NANOAMP_PARITY_ON_CPU=1: graphs are CUDA only; tests/test_tensor.c checks the cpu refusal).
 *
 * Replays run the same kernels with the same algorithms on the same addresses as eager steps,
 * so the results should be bit-identical; the test allows a small tolerance (cuDNN's
 * backward-weight algorithms may add in a varying order) and logs whether they were. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/common/models.h"
#include "../examples/common/trainer.h"
#include "nanoamp.h"

#define STEPS 7
#define WARMUP 2
#define BATCH 16

static void need_gpu(void) {
    const char *e = getenv("NANOAMP_PARITY_ON_CPU");
    if (e && *e == '1') cr_skip_test("step graphs are CUDA only (NANOAMP_PARITY_ON_CPU=1)");
    if (!na_cuda_available()) cr_skip_test("no CUDA device: %s", na_last_error());
}

typedef struct {
    na_module *net;
    trainer_amp amp;
    na_tensor *x, *y, *loss; /* persistent: the graph's batch and loss */
    na_lr_schedule sched;
    double losses[STEPS];
} run_state;

static void batch_of(int step, const int64_t shape[4], float *x, int32_t *y) {
    int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
    for (int64_t i = 0; i < n; i++) x[i] = sinf(0.37f * (float)i + (float)step);
    for (int64_t i = 0; i < shape[0]; i++) y[i] = (int32_t)((i * 7 + step) % 10);
}

static void setup(run_state *r, const char *model, const char *mode, int64_t shape[4]) {
    trainer_opts o = {.program = "test", .model = model, .lr = 0.05, .momentum = 0.9,
                      .optim = "sgd", .device = NA_DEVICE_CUDA, .amp = mode, .quiet = true,
                      .growth_interval = strcmp(mode, "fp16") ? 0 : 2};
    na_manual_seed(3);
    r->net = model_by_name(model, shape);
    cr_assert_not_null(r->net, "%s", na_last_error());
    shape[0] = BATCH;
    cr_assert_eq(na_module_to(r->net, NA_DEVICE_CUDA), NA_OK, "%s", na_last_error());
    cr_assert_eq(trainer_amp_setup(&o, r->net, &r->amp), NA_OK, "%s", na_last_error());
    cr_assert_eq(trainer_amp_graph_prepare(&r->amp, r->net, NA_DEVICE_CUDA), NA_OK, "%s",
                 na_last_error());
    r->x = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CUDA, 4, shape);
    r->y = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CUDA, NA_SHAPE(BATCH));
    r->loss = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CUDA, 0, NULL);
    cr_assert(r->x && r->y && r->loss, "%s", na_last_error());
    r->sched = na_lr_one_cycle(STEPS);
}

static void next_batch(run_state *r, int s, const int64_t shape[4]) {
    float *x = malloc(sizeof(float) * (size_t)r->x->numel);
    int32_t y[BATCH];
    batch_of(s, shape, x, y);
    cr_assert_eq(na_lr_schedule_apply(&r->sched, r->amp.opt, s), NA_OK);
    cr_assert_eq(na_copy_from_host(r->x, x), NA_OK);
    cr_assert_eq(na_copy_from_host(r->y, y), NA_OK);
    free(x);
}

static void eager_step(run_state *r, int s) {
    na_tensor *loss = trainer_amp_loss(&r->amp, r->net, r->x, r->y, 0.0);
    cr_assert_not_null(loss, "step %d: %s", s, na_last_error());
    cr_assert_eq(trainer_amp_step(&r->amp, loss), NA_OK, "step %d: %s", s, na_last_error());
    r->losses[s] = na_item(loss);
    na_step_end();
}

/* Max |a - b| over the model's state (parameters and buffers, num_batches_tracked too). */
static double state_diff(na_module *a, na_module *b, bool *identical) {
    na_named_tensors la = {0}, lb = {0};
    cr_assert_eq(na_module_state(a, "", &la), NA_OK);
    cr_assert_eq(na_module_state(b, "", &lb), NA_OK);
    cr_assert_eq(la.n, lb.n);
    double worst = 0;
    for (int64_t i = 0; i < la.n; i++) {
        na_tensor *ta = na_cast(na_to_device(la.items[i].tensor, NA_DEVICE_CPU), NA_DTYPE_F64);
        na_tensor *tb = na_cast(na_to_device(lb.items[i].tensor, NA_DEVICE_CPU), NA_DTYPE_F64);
        cr_assert(ta && tb, "%s", na_last_error());
        for (int64_t k = 0; k < ta->numel; k++) {
            double d = fabs(na_get(ta, k) - na_get(tb, k));
            if (d > 0) *identical = false;
            if (d > worst || d != d) worst = d;
        }
    }
    na_named_tensors_free(&la), na_named_tensors_free(&lb);
    na_step_end();
    return worst;
}

static void free_run(run_state *r) {
    trainer_amp_free(&r->amp);
    na_module_free(r->net);
    na_tensor_free(r->x), na_tensor_free(r->y), na_tensor_free(r->loss);
}

static void check(const char *model, const char *mode, double tol) {
    need_gpu();
    int64_t shape[4];
    run_state e = {0}, g = {0};
    setup(&e, model, mode, shape);
    setup(&g, model, mode, shape);
    for (int s = 0; s < STEPS; s++) {
        next_batch(&e, s, shape);
        eager_step(&e, s);
    }
    na_step_graph *graph = NULL;
    for (int s = 0; s < STEPS; s++) {
        next_batch(&g, s, shape);
        if (s < WARMUP) {
            eager_step(&g, s);
            continue;
        }
        if (!graph) {
            graph = trainer_amp_capture(&g.amp, g.net, g.x, g.y, 0.0, g.loss);
            cr_assert_not_null(graph, "%s %s: %s", model, mode, na_last_error());
        }
        uint64_t syncs = na_cuda_sync_count();
        cr_assert_eq(na_step_graph_replay(graph), NA_OK, "%s", na_last_error());
        cr_assert_eq(na_cuda_sync_count(), syncs, "a replay does no host round trip");
        g.losses[s] = na_item(g.loss);
    }
    bool identical = true;
    for (int s = 0; s < STEPS; s++) {
        double d = fabs(e.losses[s] - g.losses[s]);
        if (d > 0) identical = false;
        cr_assert(d <= tol * fabs(e.losses[s]), "%s %s step %d: loss %.9g eager, %.9g replayed",
                  model, mode, s, e.losses[s], g.losses[s]);
    }
    double worst = state_diff(e.net, g.net, &identical);
    cr_assert(worst <= tol, "%s %s: the model's state differs by %g after %d steps", model, mode,
              worst, STEPS);
    na_grad_scaler *se = trainer_amp_scaler(&e.amp), *sg = trainer_amp_scaler(&g.amp);
    if (na_grad_scaler_is_enabled(se)) {
        na_grad_scaler_stats a, b;
        cr_assert_eq(na_grad_scaler_stats_get(se, &a), NA_OK);
        cr_assert_eq(na_grad_scaler_stats_get(sg, &b), NA_OK);
        cr_assert(a.scale == b.scale && a.skipped == b.skipped, "scale %g/%g, skipped %lld/%lld",
                  a.scale, b.scale, (long long)a.skipped, (long long)b.skipped);
        if (!strcmp(mode, "fp16"))
            cr_assert_gt(b.scale, 65536.0, "the scale grew during the replays");
    }
    cr_log_info("cuda_graph %s %s: %d steps (%d replayed), %s (max state diff %g)\n", model,
                mode, STEPS, STEPS - WARMUP, identical ? "bit-identical" : "within tolerance",
                worst);
    na_step_graph_free(graph);
    free_run(&e), free_run(&g);
}

Test(cuda_graph, mlp_off) { check("mlp", "off", 1e-6); }
Test(cuda_graph, mlp_fp16) { check("mlp", "fp16", 1e-5); }
Test(cuda_graph, cnn_off) { check("cnn", "off", 1e-5); }
Test(cuda_graph, cnn_fp16) { check("cnn", "fp16", 1e-4); }
Test(cuda_graph, cnn_o2) { check("cnn", "o2", 1e-4); }
Test(cuda_graph, resnet9_bf16) {
    if (!na_cuda_bf16_supported()) cr_skip_test("bf16 needs sm_80");
    check("resnet9", "bf16", 1e-3);
}

/* ---- refusals: the reason named, nothing run, the eager step right after as usual ---- */

typedef struct {
    run_state *r;
    int what; /* 0: a host read, 1: dropout, 2: a host->device copy */
} bad_step;

static int run_bad_step(void *ctx) {
    bad_step *b = ctx;
    na_tensor *loss = trainer_amp_loss(&b->r->amp, b->r->net, b->r->x, b->r->y, 0.0);
    if (!loss) return na_last_status();
    if (b->what == 0) (void)na_item(loss);
    if (b->what == 1 && !na_dropout(loss, 0.5, true)) return na_last_status();
    if (b->what == 2 && na_copy_from_host(b->r->loss, (float[]){1})) return na_last_status();
    return trainer_amp_step(&b->r->amp, loss) ? na_last_status() : NA_OK;
}

Test(cuda_graph, refusals_name_the_reason_and_change_nothing) {
    need_gpu();
    int64_t shape[4];
    run_state r = {0};
    setup(&r, "mlp", "off", shape);
    for (int s = 0; s < WARMUP; s++) {
        next_batch(&r, s, shape);
        eager_step(&r, s);
    }
    const char *why[] = {"waits for the device", "random numbers", "copies"};
    bool same = true;
    for (int k = 0; k < 3; k++) {
        uint64_t rng = na_rng_offset();
        bad_step b = {&r, k};
        cr_assert_null(na_step_graph_capture(NA_DEVICE_CUDA, run_bad_step, &b));
        cr_assert(strstr(na_last_error(), why[k]) && strstr(na_last_error(), "did not run"),
                  "case %d: %s", k, na_last_error());
        cr_assert_eq(na_rng_offset(), rng, "the generator is as before");
        cr_assert_not(na_step_graph_capturing());
        cr_assert_eq(na_arena_used(NA_DEVICE_CUDA), 0, "the step was ended");
    }
    /* the parameters are those of the warm-up: the refused captures ran nothing */
    run_state ref = {0};
    setup(&ref, "mlp", "off", shape);
    for (int s = 0; s < WARMUP; s++) {
        next_batch(&ref, s, shape);
        eager_step(&ref, s);
    }
    cr_assert_eq(state_diff(ref.net, r.net, &same), 0.0);
    /* the profiler records events: refused */
    cr_assert_eq(na_profile_begin(), NA_OK);
    bad_step ok = {&r, -1};
    cr_assert_null(na_step_graph_capture(NA_DEVICE_CUDA, run_bad_step, &ok));
    cr_assert(strstr(na_last_error(), "profiler"), "%s", na_last_error());
    na_profile_end();
    na_profile_reset();
    /* and then it captures */
    na_step_graph *g = na_step_graph_capture(NA_DEVICE_CUDA, run_bad_step, &ok);
    cr_assert_not_null(g, "%s", na_last_error());
    cr_assert_eq(na_step_graph_replay(g), NA_OK);
    na_step_graph_free(g);
    free_run(&r), free_run(&ref);
}
