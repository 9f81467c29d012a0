/* The training loop shared by the example trainers (see trainer.h). */
#include "trainer.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "report.h"
#include "trainer_internal.h"

/* trainer_evaluate's batch when no training batch is at hand (the trainers' default --batch);
 * trainer_run evaluates in its training batches, so evaluation needs no larger activations
 * than training (a batch of 1000 doubled the CNN's peak RSS). */
#define EVAL_BATCH_DEFAULT 128

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* With dist (several ranks), each rank evaluates its shard of ds, every sample once over all
 * ranks (no padding), and the counts and loss sums are summed across ranks: every rank
 * returns the numbers of the whole set. channels_last: the images go in channels-last, as
 * the training batches do under --channels-last (the same values, the network's layout). */
static int evaluate_in_batches(na_module *net, const na_dataset *ds, const float *mean,
                               const float *std, na_device dev, na_dtype input_dtype,
                               bool channels_last, int64_t batch, na_dist *dist,
                               double *accuracy, double *loss) {
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = batch, .mean = mean,
                                                         .std = std,
                                                         .world_size = na_dist_world_size(dist),
                                                         .rank = na_dist_rank(dist),
                                                         .shard_no_pad = true});
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    int32_t *y = malloc(sizeof(int32_t) * (size_t)batch);
    int32_t *pred = malloc(sizeof(int32_t) * (size_t)batch);
    int rc = b ? NA_OK : na_last_status();
    if (!rc && (!x || !y || !pred)) rc = na_set_error(NA_ENOMEM, "evaluation: out of host memory");
    int64_t n, correct = 0, seen = 0;
    double loss_sum = 0;
    na_module_eval(net);
    na_no_grad_begin();
    if (!rc) rc = na_batcher_start_epoch(b, 0);
    while (!rc && na_batcher_next(b, x, y, &n)) {
        int64_t shape[4] = {n, ds->channels, ds->height, ds->width};
        na_tensor *xt = na_from_host(NA_DTYPE_F32, dev, 4, shape, x);
        na_tensor *yt = na_from_host(NA_DTYPE_I32, dev, NA_SHAPE(n), y);
        if (xt && channels_last) xt = na_to_channels_last(xt);
        if (xt) xt = na_cast(xt, input_dtype);
        na_tensor *logits = xt ? na_module_forward(net, xt) : NULL;
        na_tensor *am = logits ? na_argmax(logits, 1, false) : NULL;
        na_tensor *ce = am && yt ? na_cross_entropy(logits, yt, NULL) : NULL;
        if (!ce || na_copy_to_host(am, pred) != NA_OK) rc = na_last_status();
        for (int64_t i = 0; !rc && i < n; i++) correct += pred[i] == y[i];
        if (!rc) loss_sum += na_item(ce) * (double)n, seen += n;
        na_step_end();
    }
    na_no_grad_end();
    na_module_train(net, true);
    free(x), free(y), free(pred);
    na_batcher_free(b);
    if (dist) { /* every rank gets here (no collective per batch: shards may differ by one) */
        int64_t counts[3] = {rc != 0, correct, seen};
        int crc = na_dist_all_reduce_i64(dist, counts, 3, NA_DIST_SUM);
        if (!crc) crc = na_dist_all_reduce_f64(dist, &loss_sum, 1, NA_DIST_SUM);
        if (crc) rc = crc;
        else if (!rc && counts[0]) rc = na_set_error(NA_ESTATE, "evaluation failed on another rank");
        correct = counts[1], seen = counts[2];
    }
    if (!rc && !seen) rc = na_set_error(NA_EINVAL, "evaluation: the test set is empty");
    if (rc) return rc;
    *accuracy = (double)correct / (double)seen;
    *loss = loss_sum / (double)seen;
    return NA_OK;
}

int trainer_evaluate(na_module *net, const na_dataset *ds, const float *mean, const float *std,
                     na_device dev, na_dtype input_dtype, double *accuracy, double *loss) {
    return evaluate_in_batches(net, ds, mean, std, dev, input_dtype, false, EVAL_BATCH_DEFAULT,
                               NULL, accuracy, loss);
}

/* ---- the loop ------------------------------------------------------------------------------ */

typedef struct {
    const trainer_opts *o;
    trainer_job *job;
    trainer_amp *amp;
    na_dist *dist;          /* several ranks; NULL for one */
    int world;
    bool failed_alone;      /* a failure the other ranks do not know of (a training step) */
    int64_t fail_step;      /* NANOAMP_TEST_FAIL_STEP (a test hook), else 0 */
    na_batcher *b;
    float *x;
    int32_t *y;
    int64_t steps;          /* per epoch */
    na_lr_schedule sched;
    bool tty;
    double last_draw;
    trainer_result res;
    int64_t images;
    /* --cuda-graph: the persistent batch and loss the graph reads and writes, eager steps
     * before the capture, the graph (NULL before the capture or when it failed) */
    na_tensor *gx, *gy, *gloss;
    int64_t warmup_left;
    na_step_graph *graph;
} run_state;

#define GRAPH_WARMUP_STEPS 2 /* the second step of a shape allocates nothing new */

/* Draws the bar: on a terminal at the first and last step and at most every 0.1 s between;
 * otherwise a plain line every 10 s. The scaler is read (a sync on CUDA) only where the loss
 * was (read_now). */
static void show_progress(run_state *r, trainer_progress *p, bool read_now) {
    double t = now_s();
    bool last = p->step == p->steps;
    bool due = r->tty ? p->step == 1 || last || t - r->last_draw >= 0.1
                      : t - r->last_draw >= 10 && !last; /* the epoch's line follows its end */
    if (r->o->quiet || !due) return;
    na_grad_scaler *gs = trainer_amp_scaler(r->amp);
    na_grad_scaler_stats st;
    if (read_now && p->scaled && na_grad_scaler_stats_get(gs, &st) == NA_OK)
        p->scale = st.scale, p->skipped = st.skipped;
    char line[512];
    trainer_progress_format(p, r->tty ? trainer_terminal_width(STDERR_FILENO) : 200, line,
                            sizeof line);
    fprintf(stderr, r->tty ? "\r%s\033[K%s" : "%s\n%s", line, r->tty && last ? "\n" : "");
    fflush(stderr);
    r->last_draw = t;
}

/* What to print before a message so that it starts on a line of its own, not on the bar's. */
static const char *after_bar(const run_state *r) {
    return r->tty && !r->o->quiet ? "\n" : "";
}

/* The step's forward and loss; with `trace` (--amp-trace, the first step) printing the dtype of
 * each op: the autocast regions' ops, or every op for o2/off. The loss, or NULL. */
static na_tensor *step_loss(run_state *r, na_tensor *x, na_tensor *y, bool trace) {
    if (trace)
        na_autocast_trace(r->amp->autocast ? NA_AMP_TRACE_REGIONS : NA_AMP_TRACE_ALL, stderr);
    na_tensor *loss = trainer_amp_loss(r->amp, r->job->net, x, y, r->o->label_smoothing);
    if (trace) na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
    return loss;
}

/* A full batch's step with --cuda-graph: the batch into the graph's inputs, then an eager step
 * (warm-up, or after a failed capture), the capture, or a replay. The loss, or NULL. */
static na_tensor *graph_step(run_state *r, bool trace) {
    const trainer_opts *o = r->o;
    if (na_copy_from_host(r->gx, r->x) || na_copy_from_host(r->gy, r->y)) return NULL;
    if (r->warmup_left == 0 && !r->graph) {
        r->warmup_left = -1; /* one try */
        r->graph = trainer_amp_capture(r->amp, r->job->net, r->gx, r->gy, o->label_smoothing,
                                       r->gloss);
        if (!r->graph)
            fprintf(stderr, "%s%s: --cuda-graph: %s; training eagerly\n", after_bar(r), o->program,
                    na_last_error());
    }
    if (r->graph) {
        if (na_step_graph_replay(r->graph)) return NULL;
        r->res.graph_steps++;
        return r->gloss;
    }
    if (r->warmup_left > 0) r->warmup_left--;
    na_tensor *loss = step_loss(r, r->gx, r->gy, trace);
    return loss && !trainer_amp_step(r->amp, loss) ? loss : NULL;
}

/* One epoch; returns 0, or 1 after saying what failed (a step, a loss that is not finite). */
static int train_epoch(run_state *r, int64_t epoch, double *train_loss) {
    const trainer_opts *o = r->o;
    const na_dataset *train = r->job->train;
    trainer_amp *amp = r->amp;
    double t0 = now_s(), loss_sum = 0;
    int64_t n, step = 0, loss_count = 0, images = 0;
    trainer_progress p = {.epoch = epoch + 1, .epochs = o->epochs, .steps = r->steps,
                          .scaled = na_grad_scaler_is_enabled(trainer_amp_scaler(amp)),
                          .scale = NAN};
    int rc = 0;
    if (na_batcher_start_epoch(r->b, epoch) != NA_OK) {
        fprintf(stderr, "%s: %s\n", o->program, na_last_error());
        return 1;
    }
    while (!rc && na_batcher_next(r->b, r->x, r->y, &n)) {
        int64_t at = epoch * r->steps + step, shape[4] = {n, train->channels, train->height,
                                                          train->width};
        na_lr_schedule_apply(&r->sched, amp->opt, at);
        bool trace = o->amp_trace && at == 0;
        bool graphed = r->gx && n == o->batch; /* a partial batch runs eagerly */
        na_tensor *loss = NULL;
        if (graphed) {
            loss = graph_step(r, trace);
        } else {
            na_tensor *xt = na_from_host(NA_DTYPE_F32, o->device, 4, shape, r->x);
            na_tensor *yt = na_from_host(NA_DTYPE_I32, o->device, NA_SHAPE(n), r->y);
            loss = step_loss(r, xt, yt, trace);
        }
        if (loss && at + 1 == r->fail_step) /* after forward: the others go on to backward */
            loss = NULL, na_set_error(NA_EIO, "NANOAMP_TEST_FAIL_STEP=%" PRId64 " (a test hook)",
                                      r->fail_step);
        if (!loss || (!graphed && trainer_amp_step(amp, loss) != NA_OK)) {
            /* the others wait for its gradients: trainer_run ends the job (na_dist_abort) */
            r->failed_alone = r->dist != NULL;
            fprintf(stderr, "%s%s%s: training step %" PRId64 " failed: %s%s\n", after_bar(r),
                    o->program, r->failed_alone && !na_dist_rank(r->dist) ? " (rank 0)" : "",
                    at + 1, na_last_error(), r->failed_alone ? " (ending the job on every rank)" : "");
            rc = 1;
        } else if (amp->mon) { /* --log: one line per step (reads the loss: a sync on CUDA) */
            unsigned alerts = na_amp_monitor_record_scaler(amp->mon, at, loss,
                                                           trainer_amp_scaler(amp));
            if (alerts & ~amp->alerts_shown) {
                char why[256];
                fprintf(stderr, "%s%s: amp monitor at step %" PRId64 ": %s\n", after_bar(r),
                        o->program, at, na_amp_monitor_describe(amp->mon, why, sizeof why));
                amp->alerts_shown |= alerts;
            }
        }
        images += n, step++;
        /* Reading the loss is a host round trip (a sync on CUDA): only at the first and the
         * last step and every 10th, for the display and to notice divergence. */
        bool read_now = !rc && (step == 1 || step % 10 == 0 || step == r->steps);
        if (read_now) {
            r->res.final_loss = na_item(loss);
            /* the mean over the ranks: the loss of the global batch, and a divergence that
             * every rank sees, so that all stop at the same step */
            if (r->dist && na_dist_all_reduce_f64(r->dist, &r->res.final_loss, 1, NA_DIST_AVG)) {
                fprintf(stderr, "%s%s: step %" PRId64 ": %s\n", after_bar(r), o->program, at + 1,
                        na_last_error());
                rc = 1;
                na_step_end();
                break;
            }
            if (!isfinite(r->res.final_loss)) {
                r->res.diverged_at_step = at + 1;
                fprintf(stderr, "%s%s: training diverged at step %" PRId64 " (the loss is %s)\n",
                        after_bar(r), o->program, at + 1,
                        isnan(r->res.final_loss) ? "nan" : "infinite");
                rc = 1;
            }
            loss_sum += r->res.final_loss, loss_count++;
        }
        if (!rc) {
            double el = now_s() - t0;
            p.step = step, p.elapsed_s = el, p.loss = loss_sum / (double)loss_count;
            p.images_per_s = el > 0 ? (double)(images * r->world) / el : 0; /* all ranks' */
            show_progress(r, &p, read_now);
        }
        na_step_end();
    }
    r->res.train_time_s += now_s() - t0;
    r->images += images;
    *train_loss = loss_count ? loss_sum / (double)loss_count : NAN;
    return rc;
}

/* Epochs start_epoch.. o->epochs, each followed by evaluation and --save. 0, or 1 after
 * saying what failed. */
static int train(run_state *r, int64_t start_epoch) {
    const trainer_opts *o = r->o;
    const trainer_job *job = r->job;
    na_dtype input_dtype = r->amp->fo ? r->amp->dtype : NA_DTYPE_F32;
    if (start_epoch >= o->epochs && !o->quiet)
        fprintf(stderr, "nothing left to train: %s has %" PRId64 " epoch(s) done, --epochs %"
                PRId64 "\n", o->resume_path, start_epoch, o->epochs);
    na_module_train(job->net, true);
    for (int64_t epoch = start_epoch; epoch < o->epochs || epoch == start_epoch; epoch++) {
        double t0 = now_s(), train_loss = NAN;
        bool trains = epoch < o->epochs; /* else: only evaluate what was resumed */
        if (trains && train_epoch(r, epoch, &train_loss)) return 1;
        if (evaluate_in_batches(job->net, job->test, job->batcher.mean, job->batcher.std,
                                o->device, input_dtype, r->amp->channels_last, o->batch,
                                r->dist, &r->res.test_acc, &r->res.test_loss)) {
            fprintf(stderr, "%s: evaluation failed: %s\n", o->program, na_last_error());
            return 1;
        }
        if (!trains) break;
        if (!o->quiet) {
            char line[256];
            fprintf(stderr, "%s\n", trainer_epoch_format(epoch + 1, o->epochs, train_loss,
                                                         r->res.test_loss, r->res.test_acc,
                                                         now_s() - t0, line, sizeof line));
        }
        /* rank 0 alone saves (the others have no save_path), atomically; the others wait
         * here until the file is complete, and all stop if it failed */
        bool saved = !o->save_path ||
                     !trainer_checkpoint_save(o->save_path, job->net, r->amp, epoch + 1, o->seed);
        if (!saved)
            fprintf(stderr, "%s: --save %s: %s\n", o->program, o->save_path, na_last_error());
        if (!trainer_ranks_ok(r->dist, o, saved)) return 1;
    }
    return 0;
}

/* The summary on stdout: a sentence, and the JSON line with --json (also after divergence). */
static void report(const run_state *r, bool ok) {
    const trainer_opts *o = r->o;
    trainer_result res = r->res;
    na_grad_scaler *gs = trainer_amp_scaler(r->amp);
    na_grad_scaler_stats st = {.scale = 1.0};
    if (na_grad_scaler_is_enabled(gs) && na_grad_scaler_stats_get(gs, &st))
        st = (na_grad_scaler_stats){.scale = NAN};
    res.amp_mode = r->amp->mode;
    res.skipped_steps = st.skipped, res.final_scale = st.scale;
    res.params = na_module_num_params(r->job->net);
    res.world_size = r->world;
    /* all ranks' images (each trains as many) */
    res.images_per_s = res.train_time_s > 0
                           ? (double)(r->images * r->world) / res.train_time_s : NAN;
    if (ok && !o->quiet)
        printf("%s: %s on %s, test accuracy %.2f%%, %.0f images/s, %.1f s training\n", o->program,
               o->model, na_device_name(o->device), 100 * res.test_acc, res.images_per_s,
               res.train_time_s);
    if (o->json && (ok || res.diverged_at_step)) trainer_json_print(stdout, o, &res);
    fflush(stdout);
}

/* Says what failed, if status does, after the program name and the option at fault (NULL:
 * none); returns whether every rank is fine (a collective). */
static bool all_ok(const run_state *r, int status, const char *option, const char *value) {
    const trainer_opts *o = r->o;
    if (status)
        fprintf(stderr, "%s: %s%s%s%s%s\n", o->program, option ? option : "",
                option && value ? " " : "", value ? value : "", option ? ": " : "",
                na_last_error());
    return trainer_ranks_ok(r->dist, o, status == NA_OK);
}

/* --cuda-graph: the learning rate and BatchNorm's count onto the device and the graph's
 * persistent batch and loss; where a graph cannot serve (data parallel, a cumulative
 * BatchNorm) it says why and the run trains eagerly. NA_OK, or a status after saying what
 * failed. */
static int graph_setup(run_state *r) {
    const trainer_opts *o = r->o;
    const trainer_job *job = r->job;
    int rc = trainer_amp_graph_prepare(r->amp, job->net, o->device);
    if (rc == NA_ENOTSUP) {
        if (!o->quiet)
            fprintf(stderr, "%s: --cuda-graph: %s; training eagerly\n", o->program, na_last_error());
        return NA_OK;
    }
    int64_t shape[4] = {o->batch, job->train->channels, job->train->height, job->train->width};
    if (!rc && (!(r->gx = na_tensor_new(NA_DTYPE_F32, o->device, 4, shape)) ||
                !(r->gy = na_tensor_new(NA_DTYPE_I32, o->device, NA_SHAPE(o->batch))) ||
                !(r->gloss = na_tensor_new(NA_DTYPE_F32, o->device, 0, NULL))))
        rc = na_last_status();
    r->warmup_left = GRAPH_WARMUP_STEPS;
    return all_ok(r, rc, "--cuda-graph", NULL) ? NA_OK : NA_ESTATE;
}

/* trainer_run on the ranks of dist (NULL: one process). *failed_alone: this rank failed where
 * the others cannot know (they wait in a collective for it). */
static int run(const trainer_opts *o, trainer_job *job, na_dist *dist, bool *failed_alone) {
    trainer_amp amp = {0};
    run_state r = {.o = o, .job = job, .amp = &amp, .dist = dist,
                   .world = na_dist_world_size(dist), .tty = isatty(STDERR_FILENO) != 0,
                   .res = {.test_acc = NAN, .test_loss = NAN, .final_loss = NAN}};
    int64_t start_epoch = 0;
    int rc = 1;
    /* a test hook (tests/trainer_dist.sh): training step N fails on the ranks where it is set,
     * as a step that fails on one rank only would */
    const char *fail_step = getenv("NANOAMP_TEST_FAIL_STEP");
    if (fail_step && !trainer_parse_i64(fail_step, 1, INT64_MAX, &r.fail_step)) r.fail_step = 0;
    /* Every step that may fail on one rank only is agreed on before the next collective. */
    if (!trainer_ranks_ok(dist, o, trainer_setup(o, job) == 0) ||
        trainer_check_ranks_agree(dist, o, job))
        goto done;
    /* in this order, so that nothing runs (the batcher's prefetch thread) when one fails */
    if (!all_ok(&r, na_module_to(job->net, o->device), NULL, NULL) ||
        !all_ok(&r, trainer_amp_setup_dist(o, job->net, dist, &amp), NULL, NULL))
        goto done;
    if (o->resume_path) { /* every rank reads the same file */
        int st = trainer_checkpoint_load(o->resume_path, job->net, &amp, &start_epoch);
        if (!all_ok(&r, st, "--resume", o->resume_path)) goto done;
        uint64_t where[2] = {(uint64_t)start_epoch, na_rng_offset()};
        if (dist && na_dist_check_same(dist, where[0] * 0x9E3779B97F4A7C15ull ^ where[1],
                                       "--resume checkpoint (epochs done, random state)")) {
            fprintf(stderr, "%s: %s\n", o->program, na_last_error());
            goto done;
        }
        if (!o->quiet)
            fprintf(stderr, "resumed from %s after %" PRId64 " epoch(s)\n", o->resume_path,
                    start_epoch);
    }
    /* each rank its shard of every epoch's order (--batch per rank) */
    na_batcher_cfg bc = job->batcher;
    bc.batch_size = o->batch, bc.seed = o->seed, bc.shuffle = true;
    bc.world_size = r.world, bc.rank = na_dist_rank(dist);
    r.b = na_batcher_new(job->train, &bc);
    r.x = r.b ? malloc(na_batcher_batch_bytes(r.b)) : NULL;
    r.y = malloc(sizeof(int32_t) * (size_t)o->batch);
    bool ready = r.b && r.x && r.y;
    if (!ready)
        fprintf(stderr, "%s: setup failed: %s\n", o->program,
                r.b ? "out of host memory" : na_last_error());
    if (!trainer_ranks_ok(dist, o, ready)) goto done;
    if (o->cuda_graph && graph_setup(&r) != NA_OK) goto done;
    r.steps = na_batcher_steps_per_epoch(r.b);
    r.sched = !strcmp(o->schedule, "onecycle") ? na_lr_one_cycle(r.steps * o->epochs)
                                                : na_lr_constant();
    rc = train(&r, start_epoch);
    report(&r, rc == 0);
done:
    *failed_alone = r.failed_alone;
    na_step_graph_free(r.graph);
    na_tensor_free(r.gx), na_tensor_free(r.gy), na_tensor_free(r.gloss);
    free(r.x), free(r.y);
    na_batcher_free(r.b); /* stops the prefetch thread before the caller frees the data */
    trainer_amp_free(&amp);
    na_module_free(job->net);
    job->net = NULL;
    return rc;
}

int trainer_run(const trainer_opts *opts, trainer_job *job) {
    /* a file-size limit (ulimit -f) then fails the save with EFBIG, naming the file, instead of
     * killing the process (the old checkpoint stays intact either way) */
    signal(SIGXFSZ, SIG_IGN);
    /* the launcher's ranks (mpirun), or a world of one */
    na_dist *d = na_dist_init();
    if (d && opts->dist_timeout > 0) na_dist_set_timeout(d, opts->dist_timeout); /* > 0: cli.c */
    if (!d) {
        fprintf(stderr, "%s: %s\n", opts->program, na_last_error());
        return 1;
    }
    /* the first collective: ranks that failed before trainer_run join it (trainer_start_failed) */
    if (!trainer_ranks_started(d, opts)) {
        na_dist_free(d);
        return 1;
    }
    char program[128];
    trainer_opts o = trainer_rank_opts(opts, d, program, sizeof program);
    bool failed_alone = false;
    /* a world of 1 trains without the wrapper, unless NANOAMP_DIST_COLLECTIVES asks for it */
    int rc = run(&o, job, na_dist_collectives(d) ? d : NULL, &failed_alone);
    /* The other ranks wait in a collective for this one, and finalizing would wait for them:
     * end the job instead (MPI_Abort: the launcher stops every rank, exit status rc). */
    if (failed_alone) return na_dist_abort(d, rc);
    na_dist_free(d);
    return rc;
}
