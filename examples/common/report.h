/* examples/common/report.h — what the trainers print: the progress bar, the line after each
 * epoch and the --json summary. Formatting only (no I/O but the printing calls), so that it
 * can be tested without a terminal. */
#ifndef NANOAMP_EXAMPLES_REPORT_H
#define NANOAMP_EXAMPLES_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trainer.h"

/* The state of one epoch's progress bar. */
typedef struct {
    int64_t epoch, epochs;  /* epoch counts from 1 */
    int64_t step, steps;    /* steps done in this epoch, steps per epoch */
    double elapsed_s;       /* since the epoch began */
    double images_per_s;
    double loss;            /* mean of the losses read so far in this epoch */
    bool scaled;            /* an enabled loss scaler: show the scale and the skipped steps */
    double scale;
    int64_t skipped;        /* steps skipped so far in the run */
} trainer_progress;

/* tqdm's layout, fitted into width - 1 columns so that a terminal never wraps it:
 *   epoch 1/2  46%|#####      | 54/118 [00:03<00:03, 1834 img/s, loss 0.5123, scale 65536, skipped 3]
 * The remaining time is this epoch's, from its rate so far. The bar takes the room left, 10 to
 * 40 cells. Where the whole line does not fit, fields are dropped whole (never cut, the
 * bracket always closed), in this order: img/s, scale, remaining time, step counts, the bar,
 * elapsed time, skipped, loss, percentage, epoch. So at 80 columns a scaled run shows
 *   epoch 1/2  46%|########          | 54/118 [00:03<00:03, loss 0.5123, skipped 3]
 * Returns buf. */
char *trainer_progress_format(const trainer_progress *p, int width, char *buf, size_t size);
/* The same as a plain line, for output that is not a terminal (a log, mpirun): no bar, under
 * TRAINER_PLAIN_WIDTH columns. */
#define TRAINER_PLAIN_WIDTH 80
char *trainer_progress_plain(const trainer_progress *p, char *buf, size_t size);
/* The width of the terminal on fd (TIOCGWINSZ), else $COLUMNS, else 80. */
int trainer_terminal_width(int fd);

/* "epoch 1/2: train loss 0.5123, test loss 0.4567, test accuracy 84.20%, 12.3 s" */
char *trainer_epoch_format(int64_t epoch, int64_t epochs, double train_loss, double test_loss,
                           double test_acc, double seconds, char *buf, size_t size);

/* The results the --json line reports. Non-finite numbers are written as null. */
typedef struct {
    const char *amp_mode;
    double images_per_s, train_time_s, test_acc, test_loss, final_loss, final_scale;
    int64_t params, skipped_steps;
    int64_t graph_steps;      /* --cuda-graph: steps taken by replaying the graph */
    int64_t diverged_at_step; /* 0: no divergence */
    int world_size;           /* ranks (mpirun -np); 0 is written as 1. images_per_s counts
                                 all ranks' images, "batch" is --batch (per rank) */
    double lr, weight_decay;  /* what ran: the optimizer's base lr and weight decay (group 0) */
    const char *fp8_recipe, *fp8_format; /* --amp fp8: "delayed"/"current", "hybrid"/"e4m3";
                                            NULL (null in the JSON) otherwise */
    int64_t saturated;        /* fp8: values beyond their format's max when cast, this run */
} trainer_result;

/* The amp mode that ran and, for fp8, its recipe, format and saturated count (amp_step.c). */
void trainer_amp_result(const trainer_amp *a, trainer_result *r);
/* One line of strict JSON (RFC 8259: no NaN or Infinity) with the options and the results. */
void trainer_json_print(FILE *f, const trainer_opts *o, const trainer_result *r);
/* The run's sentence: test accuracy, and images/s and training time when it trained. */
void trainer_summary_print(FILE *f, const trainer_opts *o, const trainer_result *r, bool trained);
#endif
