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
#include "run_report.h"
#include "trainer_internal.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    trainer_graph graph; /* --cuda-graph */
    /* f64 0-dim on the device: the first step whose loss was inf or NaN, 0 for none
     * (na_amp_note_nonfinite; read with the loss) */
    na_tensor *first_bad;
} run_state;

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
    if (r->tty) trainer_progress_format(p, trainer_terminal_width(STDERR_FILENO), line, sizeof line);
    else trainer_progress_plain(p, line, sizeof line);
    fprintf(stderr, r->tty ? "\r%s\033[K%s" : "%s\n%s", line, r->tty && last ? "\n" : "");
    fflush(stderr);
    r->last_draw = t;
}

/* What to print before a message so that it starts on a line of its own, not on the bar's. */
static const char *after_bar(const run_state *r) {
    return r->tty && !r->o->quiet ? "\n" : "";
}

/* The loss into res.final_loss, the mean over the ranks (the global batch's), and into *first
 * the first step whose loss was not finite on any rank (0: none), so that all stop at the
 * same step. Only where the loss is read anyway (the flag's read then finds the stream idle);
 * with ranks one all-reduce, a second only after a divergence. */
static int read_loss(run_state *r, na_tensor *loss, int64_t *first) {
    double v[2] = {na_item(loss), na_item(r->first_bad)}, sum[2] = {v[0], v[1] != 0};
    if (r->dist && na_dist_all_reduce_f64(r->dist, sum, 2, NA_DIST_SUM)) return na_last_status();
    r->res.final_loss = r->dist ? sum[0] / r->world : v[0];
    if (r->dist && sum[1] > 0) { /* the earliest over the ranks: the max of -step */
        v[1] = v[1] ? -v[1] : -INFINITY;
        if (na_dist_all_reduce_f64(r->dist, &v[1], 1, NA_DIST_MAX)) return na_last_status();
        v[1] = -v[1];
    }
    *first = (int64_t)v[1];
    return NA_OK;
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
    while (!rc && !trainer_interrupted() && na_batcher_next(r->b, r->x, r->y, &n)) {
        int64_t at = epoch * r->steps + step, shape[4] = {n, train->channels, train->height,
                                                          train->width};
        bool trace = o->amp_trace && at == 0;
        run_report_step(amp->report, at, step == 0);
        bool graphed = r->graph.x && n == o->batch; /* a partial batch runs eagerly */
        na_tensor *loss = NULL;
        if (na_lr_schedule_apply(&r->sched, amp->opt, at)) {
            /* loss stays NULL: the step fails below, saying why */
        } else if (graphed) {
            loss = trainer_graph_step(&r->graph, o, amp, r->job->net, r->x, r->y, trace,
                                      after_bar(r));
        } else {
            na_tensor *xt = na_from_host(NA_DTYPE_F32, o->device, 4, shape, r->x);
            na_tensor *yt = na_from_host(NA_DTYPE_I32, o->device, NA_SHAPE(n), r->y);
            loss = trainer_step_loss(amp, r->job->net, xt, yt, o->label_smoothing, trace);
        }
        if (loss && at + 1 == r->fail_step) /* after forward: the others go on to backward */
            loss = NULL, na_set_error(NA_EIO, "NANOAMP_TEST_FAIL_STEP=%" PRId64 " (a test hook)",
                                      r->fail_step);
        if (!loss || (!graphed && trainer_amp_step(amp, loss) != NA_OK) ||
            na_amp_note_nonfinite(r->first_bad, loss, at + 1)) {
            /* the others wait for its gradients: trainer_run ends the job (na_dist_abort) */
            r->failed_alone = r->dist != NULL;
            fprintf(stderr, "%s%s%s: training step %" PRId64 " failed: %s%s\n", after_bar(r),
                    o->program, r->failed_alone && !na_dist_rank(r->dist) ? " (rank 0)" : "",
                    at + 1, na_last_error(), r->failed_alone ? " (ending the job on every rank)" : "");
            rc = 1;
        } else if (amp->mon && trainer_amp_record(amp, o, at, loss, after_bar(r))) {
            r->failed_alone = r->dist != NULL; /* only rank 0 logs */
            rc = 1;
        }
        if (na_amp_trace_backward_on()) /* the first step's backward rows: its backward ran */
            na_amp_trace_backward(false, NULL);
        images += n, step++;
        /* Reading the loss is a host round trip (a sync on CUDA): only at the first and the
         * last step and every 10th, for the display and to notice divergence. */
        bool read_now = !rc && (step == 1 || step % 10 == 0 || step == r->steps);
        if (read_now) {
            int64_t first = 0;
            if (read_loss(r, loss, &first)) {
                fprintf(stderr, "%s%s: step %" PRId64 ": %s\n", after_bar(r), o->program, at + 1,
                        na_last_error());
                rc = 1;
                na_step_end();
                break;
            }
            if (first) {
                r->res.diverged_at_step = first;
                fprintf(stderr, "%s%s: training diverged at step %" PRId64 " (its loss was inf "
                        "or nan)\n", after_bar(r), o->program, first);
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
    if (!rc && trainer_interrupted()) {
        fprintf(stderr, "%s%s: interrupted at epoch %" PRId64 ", step %" PRId64 " of %" PRId64
                "\n", after_bar(r), o->program, epoch + 1, step, r->steps);
        rc = 130; /* the shell's status for SIGINT */
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
        int rc = trains ? train_epoch(r, epoch, &train_loss) : 0;
        if (rc) return rc;
        if (trainer_evaluate_ranks(job->net, job->test, job->batcher.mean, job->batcher.std,
                                   o->device, input_dtype, r->amp->channels_last, o->batch,
                                   r->dist, &r->res.test_acc, &r->res.test_loss)) {
            fprintf(stderr, "%s: evaluation failed: %s\n", o->program, na_last_error());
            return 1;
        }
        if (!isfinite(r->res.test_loss)) { /* the last update diverged: no loss read since */
            r->res.diverged_at_step = (trains ? epoch + 1 : epoch) * r->steps;
            fprintf(stderr, "%s: training diverged at step %" PRId64 " (the test loss after it is "
                    "%s)\n", o->program, r->res.diverged_at_step,
                    isnan(r->res.test_loss) ? "nan" : "infinite");
            return 1;
        }
        if (!trains) break;
        if (run_report_epoch(r->amp->report, epoch + 1, train_loss, &r->res, r->images * r->world))
            return 1;
        if (!o->quiet) {
            char line[256];
            fprintf(stderr, "%s\n", trainer_epoch_format(epoch + 1, o->epochs, train_loss,
                                                         r->res.test_loss, r->res.test_acc,
                                                         now_s() - t0, line, sizeof line));
        }
        /* rank 0 alone saves (the others have no save_path), atomically; the others wait
         * here until the file is complete, and all stop if it failed */
        trainer_saved_run run = {epoch + 1, r->steps, r->world};
        bool saved = !o->save_path ||
                     !trainer_checkpoint_save(o->save_path, job->net, r->amp, o, &run);
        if (!saved)
            fprintf(stderr, "%s: --save %s: %s\n", o->program, o->save_path, na_last_error());
        if (!trainer_ranks_ok(r->dist, o, saved)) return 1;
    }
    return 0;
}

/* The sentence, --json's line (also after divergence), --report's last page (1: unwritten). */
static int report(const run_state *r, bool ok) {
    const trainer_opts *o = r->o;
    trainer_result res = r->res;
    na_grad_scaler *gs = trainer_amp_scaler(r->amp);
    na_grad_scaler_stats st = {.scale = 1.0};
    if (na_grad_scaler_is_enabled(gs) && na_grad_scaler_stats_get(gs, &st))
        st = (na_grad_scaler_stats){.scale = NAN};
    trainer_amp_result(r->amp, &res);
    res.skipped_steps = st.skipped, res.final_scale = st.scale;
    res.params = na_module_num_params(r->job->net);
    res.graph_steps = r->graph.replays;
    res.lr = na_optim_initial_lr(r->amp->opt, 0); /* what ran: a resumed run's too */
    res.weight_decay = na_optim_weight_decay(r->amp->opt, 0);
    res.world_size = r->world;
    /* all ranks' images (each trains as many) */
    res.images_per_s = res.train_time_s > 0
                           ? (double)(r->images * r->world) / res.train_time_s : NAN;
    if (ok && !o->quiet) trainer_summary_print(stdout, o, &res, r->images > 0);
    if (o->json && (ok || res.diverged_at_step)) trainer_json_print(stdout, o, &res);
    fflush(stdout);
    return run_report_finish(r->amp->report, &res, ok);
}

/* trainer_run on the ranks of dist (NULL: one process). *failed_alone: this rank failed where
 * the others cannot know (they wait in a collective for it). */
static int run(const trainer_opts *opts, trainer_job *job, na_dist *dist, bool *failed_alone) {
    trainer_opts o = *opts; /* with --resume, the flags left out become the checkpoint's */
    trainer_amp amp = {0};
    trainer_resume rs = {0};
    run_state r = {.o = &o, .job = job, .amp = &amp, .dist = dist,
                   .world = na_dist_world_size(dist), .tty = isatty(STDERR_FILENO) != 0,
                   .res = {.test_acc = NAN, .test_loss = NAN, .final_loss = NAN}};
    int rc = 1;
    int64_t start_epoch = 0;
    /* a test hook (tests/trainer_dist.sh): training step N fails on the ranks where it is set,
     * as a step that fails on one rank only would */
    const char *fail_step = getenv("NANOAMP_TEST_FAIL_STEP");
    if (fail_step && !trainer_parse_i64(fail_step, 1, INT64_MAX, &r.fail_step)) r.fail_step = 0;
    int st = o.resume_path ? trainer_resume_open(&o, &rs) : NA_OK; /* every rank reads it */
    if (st) fprintf(stderr, "%s: --resume %s: %s\n", o.program, o.resume_path, na_last_error());
    /* Every step that may fail on one rank only is agreed on before the next collective. */
    if (!trainer_ranks_ok(dist, &o, !st && trainer_setup(&o, job) == 0) ||
        trainer_check_ranks_agree(dist, &o, job, rs.ck))
        goto done;
    /* in this order, so that nothing runs (the batcher's prefetch thread) when one fails */
    if (!trainer_ranks_all_ok(dist, &o, na_module_to(job->net, o.device), "--device",
                              na_device_name(o.device)) ||
        !trainer_ranks_all_ok(dist, &o, trainer_amp_setup_dist(&o, job->net, dist, &amp), NULL,
                              NULL) ||
        (o.resume_path &&
         !trainer_ranks_all_ok(dist, &o, trainer_resume_load(&o, &rs, job->net, &amp),
                               "--resume", o.resume_path)))
        goto done;
    /* each rank its shard of every epoch's order (--batch per rank) */
    na_batcher_cfg bc = job->batcher;
    bc.batch_size = o.batch, bc.seed = o.seed, bc.shuffle = true;
    bc.world_size = r.world, bc.rank = na_dist_rank(dist);
    r.b = na_batcher_new(job->train, &bc);
    r.x = r.b ? malloc(na_batcher_batch_bytes(r.b)) : NULL;
    r.y = malloc(sizeof(int32_t) * (size_t)o.batch);
    r.first_bad = na_tensor_new(NA_DTYPE_F64, o.device, 0, NULL);
    bool ready = r.b && r.x && r.y && r.first_bad && !na_fill_(r.first_bad, 0);
    if (!ready)
        fprintf(stderr, "%s: setup failed: %s\n", o.program,
                r.b && r.first_bad ? "out of host memory" : na_last_error());
    if (!trainer_ranks_ok(dist, &o, ready)) goto done;
    r.steps = na_batcher_steps_per_epoch(r.b);
    start_epoch = rs.epochs_done;
    if (o.resume_path) {
        st = trainer_resume_check_run(&o, &rs, r.steps, r.world);
        trainer_resume_close(&rs); /* the file's bytes are not needed any more */
        if (!trainer_ranks_all_ok(dist, &o, st, "--resume", o.resume_path)) goto done;
        if (!o.quiet)
            fprintf(stderr, "resumed from %s after %" PRId64 " epoch(s)\n", o.resume_path,
                    start_epoch);
    }
    if (o.cuda_graph && trainer_graph_setup(&r.graph, &o, job, &amp, dist) != NA_OK) goto done;
    r.sched = !strcmp(o.schedule, "onecycle") ? na_lr_one_cycle(r.steps * o.epochs)
                                               : na_lr_constant();
    rc = train(&r, start_epoch);
    if (report(&r, rc == 0) && !rc) rc = 1;
done:
    *failed_alone = r.failed_alone;
    trainer_resume_close(&rs);
    trainer_graph_free(&r.graph);
    na_tensor_free(r.first_bad);
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
    if (na_dist_world_size(d) == 1) trainer_catch_interrupt(); /* mpirun ends ranks together */
    /* a world of 1 trains without the wrapper, unless NANOAMP_DIST_COLLECTIVES asks for it */
    int rc = run(&o, job, na_dist_collectives(d) ? d : NULL, &failed_alone);
    /* The other ranks wait in a collective for this one, and finalizing would wait for them:
     * end the job instead (MPI_Abort: the launcher stops every rank, exit status rc). */
    if (failed_alone) return na_dist_abort(d, rc);
    na_dist_free(d);
    return rc;
}
