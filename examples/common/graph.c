/* --cuda-graph in the training loop (see trainer_internal.h): the persistent batch and loss,
 * the eager warm-up steps, the one capture and the replays. The step's recipe, capture
 * included, is amp_step.c's. */
#include <stdio.h>

#include "run_report.h"
#include "trainer_internal.h"

#define GRAPH_WARMUP_STEPS 2 /* the second step of a shape allocates nothing new */

na_tensor *trainer_step_loss(const trainer_amp *amp, na_module *net, na_tensor *x, na_tensor *y,
                             double label_smoothing, bool trace) {
    na_amp_trace_mode mode = amp->autocast ? NA_AMP_TRACE_REGIONS : NA_AMP_TRACE_ALL;
    /* --report records the first step's trace (and prints it with --amp-trace); the backward
     * rows go on until the step is done (train_epoch turns them off) */
    bool recorded = run_report_trace_begin(amp->report, mode, trace);
    if (trace && !recorded) {
        na_autocast_trace(mode, stderr);
        na_amp_trace_backward(true, stderr);
    }
    na_tensor *loss = trainer_amp_loss(amp, net, x, y, label_smoothing);
    if (recorded) run_report_trace_end(amp->report);
    if (trace && !recorded) na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    /* a sampled step's activations: a second forward, without gradients */
    if (loss && run_report_activations(amp->report, amp, net, x)) return NULL;
    return loss;
}

int trainer_graph_setup(trainer_graph *g, const trainer_opts *o, const trainer_job *job,
                        trainer_amp *amp, na_dist *dist) {
    int rc = trainer_amp_graph_prepare(amp, job->net, o->device);
    if (rc == NA_ENOTSUP) {
        if (!o->quiet)
            fprintf(stderr, "%s: --cuda-graph: %s; training eagerly\n", o->program, na_last_error());
        return NA_OK;
    }
    int64_t shape[4] = {o->batch, job->train->channels, job->train->height, job->train->width};
    if (!rc && (!(g->x = na_tensor_new(NA_DTYPE_F32, o->device, 4, shape)) ||
                !(g->y = na_tensor_new(NA_DTYPE_I32, o->device, NA_SHAPE(o->batch))) ||
                !(g->loss = na_tensor_new(NA_DTYPE_F32, o->device, 0, NULL))))
        rc = na_last_status();
    g->warmup_left = GRAPH_WARMUP_STEPS;
    return trainer_ranks_all_ok(dist, o, rc, "--cuda-graph", NULL) ? NA_OK : NA_ESTATE;
}

na_tensor *trainer_graph_step(trainer_graph *g, const trainer_opts *o, trainer_amp *amp,
                              na_module *net, const float *x, const int32_t *y, bool trace,
                              const char *after_bar) {
    if (na_copy_from_host(g->x, x) || na_copy_from_host(g->y, y)) return NULL;
    if (g->graph || g->warmup_left == 0) run_report_unsample(amp->report);
    if (g->warmup_left == 0 && !g->graph) {
        g->warmup_left = -1; /* one try */
        g->graph = trainer_amp_capture(amp, net, g->x, g->y, o->label_smoothing, g->loss);
        if (!g->graph)
            fprintf(stderr, "%s%s: --cuda-graph: %s; training eagerly\n", after_bar, o->program,
                    na_last_error());
    }
    if (g->graph) {
        if (na_step_graph_replay(g->graph)) return NULL;
        g->replays++;
        return g->loss;
    }
    if (g->warmup_left > 0) g->warmup_left--;
    na_tensor *loss = trainer_step_loss(amp, net, g->x, g->y, o->label_smoothing, trace);
    return loss && !trainer_amp_step(amp, loss) ? loss : NULL;
}

void trainer_graph_free(trainer_graph *g) {
    na_step_graph_free(g->graph);
    na_tensor_free(g->x), na_tensor_free(g->y), na_tensor_free(g->loss);
    *g = (trainer_graph){0};
}
