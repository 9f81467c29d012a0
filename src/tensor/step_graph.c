/* One training step recorded once as a device graph and replayed (nanoamp/tensor.h).
 *
 * The contract that keeps a replay's memory right (see na_step_graph_capture):
 *  - the capture starts with the device's step arena empty (right after na_step_end), so
 *    every arena block the recorded kernels touch was handed out during the capture and is
 *    written by them before it is read: a replay never reads arena memory that something
 *    else wrote between replays, and other code may use those blocks between replays (the
 *    one stream orders everything);
 *  - the arena may not grow during the capture (the backend refuses allocations then), and a
 *    data arena never frees a chunk, so every recorded address stays valid;
 *  - what the step reads from outside the arena (parameters, inputs, optimizer and scaler
 *    state) are persistent tensors, which the caller keeps alive and at the same storage
 *    while the graph lives; values that change per step live there, on the device.
 * The step runs its host code once, at the capture; the host state it changes must not
 * matter to later steps (everything that does is on the device: scales, counters, flags,
 * the learning rate with na_optim_set_lr_on_device, BatchNorm's count with
 * na_module_count_batches_on_device). The random generator's offset is a host counter, so a
 * step that draws random numbers is refused. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "nanoamp/error.h"
#include "nanoamp/tensor.h"
#include "src/tensor/arena.h"
#include "src/tensor/deferred_zero.h"

struct na_step_graph {
    na_device dev;
    const na_backend *be;
    void *graph;
};

static bool capturing;

bool na_step_graph_capturing(void) { return capturing; }

/* The device's backend if it can record graphs, else NULL with the reason set. */
static const na_backend *graph_backend(const char *fn, na_device dev) {
    if (dev == NA_DEVICE_CPU) {
        na_set_error(NA_ENOTSUP, "%s: step graphs are a CUDA feature; the cpu device runs "
                     "every step eagerly", fn);
        return NULL;
    }
    const na_backend *be = na_backend_get(dev);
    if (!be) {
        na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
        return NULL;
    }
    if (!be->graph_begin) {
        na_set_error(NA_ENOTSUP, "%s: the %s backend cannot record graphs", fn, be->name);
        return NULL;
    }
    return be;
}

na_step_graph *na_step_graph_capture(na_device dev, na_step_fn step, void *ctx) {
    const char *fn = "na_step_graph_capture";
    if (!step) {
        na_set_error(NA_EINVAL, "%s: NULL step function", fn);
        return NULL;
    }
    if (capturing) {
        na_set_error(NA_ESTATE, "%s: a capture is already under way", fn);
        return NULL;
    }
    const na_backend *be = graph_backend(fn, dev);
    if (!be) return NULL;
    if (na_arena_used(dev)) {
        na_set_error(NA_ESTATE, "%s: %zu bytes of the %s step arena are in use: call "
                     "na_step_end() before the capture (a replay must not read step tensors "
                     "made outside it)", fn, na_arena_used(dev), na_device_name(dev));
        return NULL;
    }
    if (na_step_hook_installed()) {
        na_set_error(NA_ENOTSUP, "%s: a step hook is installed (the profiler, NANOAMP_PROFILE): "
                     "it reads the device at every step end", fn);
        return NULL;
    }
    na_step_graph *g = calloc(1, sizeof *g);
    if (!g) {
        na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
        return NULL;
    }
    *g = (na_step_graph){.dev = dev, .be = be};
    uint64_t rng = na_rng_offset();
    /* gradients zeroed before: filled now, outside the recording, as a replay fills them */
    int rc = na_zero_settle_all();
    if (!rc) rc = be->graph_begin();
    if (rc) {
        free(g);
        na_set_error(rc, "%s: %s", fn, na_last_error());
        return NULL;
    }
    capturing = true;
    rc = step(ctx);
    bool drew = na_rng_offset() != rng;
    /* the step's own error wins; the backend's reason (a sync, an allocation) comes next */
    char why[512] = "";
    if (rc) snprintf(why, sizeof why, "the step failed: %s", na_last_error());
    int end = be->graph_end(!rc && !drew, &g->graph);
    if (!rc && end) snprintf(why, sizeof why, "%s", na_last_error());
    capturing = false;
    na_rng_set_state(na_rng_seed(), rng); /* nothing ran: nothing was drawn */
    na_step_end();
    if (!rc && !end && drew)
        snprintf(why, sizeof why, "the step draws random numbers (dropout, random init): the "
                 "generator's offset is a host counter, so every replay would draw the same");
    if (why[0]) {
        if (g->graph) be->graph_free(g->graph);
        free(g);
        na_set_error(rc ? rc : end ? end : NA_ENOTSUP, "%s: %s; the step did not run (run it "
                     "eagerly)", fn, why);
        return NULL;
    }
    return g;
}

int na_step_graph_replay(na_step_graph *g) {
    if (!g) return na_set_error(NA_EINVAL, "na_step_graph_replay: NULL graph");
    if (capturing)
        return na_set_error(NA_ESTATE, "na_step_graph_replay: called during a capture");
    int rc = na_zero_settle_all(); /* gradients zeroed since: the recording reads them */
    if (!rc) rc = g->be->graph_launch(g->graph);
    return rc ? na_set_error(rc, "na_step_graph_replay: %s", na_last_error()) : NA_OK;
}

void na_step_graph_free(na_step_graph *g) {
    if (!g) return;
    g->be->graph_free(g->graph);
    free(g);
}
