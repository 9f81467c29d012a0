/* examples/common/run_report.h — --report FILE.html: one self-contained page of the run (inline
 * SVG and CSS, no script, nothing fetched), rewritten atomically (a temporary file renamed over
 * the path) after every epoch and complete at the end:
 *   Configuration  the options as the run took them;
 *   Loss           train and test loss, test accuracy, images/s per epoch;
 *   Loss scale     loss and scale per step with the skipped steps (amp_plot_log), the amp
 *                  monitor's alerts;
 *   Gradients      for the sampled steps (the first, then the first of each epoch, at most
 *                  RUN_REPORT_MAX_SAMPLES), each parameter's gradient as backward left it
 *                  (times the loss scale) on the number line of the dtype in use
 *                  (na_amp_hist: f16 for fp16/o2, bf16, f32 for off): the shares that are 0,
 *                  round to 0, are subnormal or overflow;
 *   Activations    the same for each top-level layer's output, from an extra forward of the
 *                  sampled batch in eval mode without gradients (BatchNorm's statistics and
 *                  the run's numbers are untouched);
 *   Autocast trace the first step's ops as a table (the --amp-trace observer's records),
 *                  then its backward rows (each node's incoming gradient: zero, subnormal and
 *                  inf/NaN shares in its dtype);
 *   Final JSON     the --json line.
 * Its cost: the monitor reads loss and scale every step (a sync on CUDA, as --log); the samples
 * copy the tensors to the host on their steps only. Hooked into the loop by trainer_amp (its
 * report member): trainer_step_loss, trainer_amp_step and trainer_amp_record call in here. */
#ifndef NANOAMP_EXAMPLES_RUN_REPORT_H
#define NANOAMP_EXAMPLES_RUN_REPORT_H

#include "report.h"
#include "trainer.h"

#define RUN_REPORT_MAX_SAMPLES 8

typedef struct run_report run_report;

/* For net trained by amp (after trainer_amp_init): NULL with a message on failure. */
run_report *run_report_new(const trainer_opts *o, na_module *net, const trainer_amp *amp);
void run_report_free(run_report *rp); /* NULL is fine */

/* Before step `at` (from 0) of the run; epoch_start: the epoch's first step. Every function
 * below does nothing for a NULL report. */
void run_report_step(run_report *rp, int64_t at, bool epoch_start);
bool run_report_sampling(const run_report *rp); /* this step is sampled */
/* This step is not sampled after all: --cuda-graph's capture and replays cannot stop to copy
 * tensors to the host. */
void run_report_unsample(run_report *rp);
/* The first step's trace into the table (and printed as --amp-trace prints when print): true
 * when it began (end it with run_report_trace_end), false when the caller traces itself. The
 * backward rows begin too; run_report_trace_end leaves them on for the step's backward
 * (na_amp_trace_backward(false, NULL) ends them). */
bool run_report_trace_begin(run_report *rp, na_amp_trace_mode mode, bool print);
void run_report_trace_end(run_report *rp);
/* A sampled step's activations: net's top-level layers on x as trainer_amp_loss feeds it. */
int run_report_activations(run_report *rp, const trainer_amp *amp, na_module *net, na_tensor *x);
/* A sampled step's gradients, between backward and the optimizer step. */
int run_report_grads(run_report *rp, const trainer_amp *amp);
/* A monitor record: step, loss, scale, steps skipped since the last, new alerts' text ("" for
 * none). */
int run_report_scale(run_report *rp, int64_t at, double loss, double scale, int64_t skipped,
                     const char *alerts);
/* After an epoch's evaluation: its numbers (images: every rank's so far, res: the run's so far),
 * then the page is rewritten. Returns 0, or 1 after saying what failed (naming the path). */
int run_report_epoch(run_report *rp, int64_t epoch, double train_loss, const trainer_result *res,
                     int64_t images);
/* The end: the final JSON and whether the run completed; the page is rewritten. 0 or 1. */
int run_report_finish(run_report *rp, const trainer_result *res, bool ok);

#endif
