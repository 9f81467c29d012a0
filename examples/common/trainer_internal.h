/* examples/common/trainer_internal.h — what the files of examples/common share among
 * themselves (not the trainers): strict number parsing, the setup before training, the
 * checkpoint format and --resume, the agreement of ranks and evaluation. */
#ifndef NANOAMP_EXAMPLES_TRAINER_INTERNAL_H
#define NANOAMP_EXAMPLES_TRAINER_INTERNAL_H

#include "trainer.h"

/* Whole-string parsers (no empty string, no leading space or sign where none belongs, no
 * trailing characters, no overflow). They set nothing and return false on a bad string. */
bool trainer_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
bool trainer_parse_u64(const char *s, uint64_t *out);
bool trainer_parse_f64(const char *s, double *out); /* finite only */

/* Before training (setup.c): cuts the data sets to --limit / --test-limit, seeds, builds the
 * model, checks that the images fit it and that --save is writable, and measures the training
 * images' per-channel mean and std into job->batcher. Says what failed; 0 or -1. */
int trainer_setup(const trainer_opts *o, trainer_job *job);
/* Ctrl-C ends the run after the step under way (setup.c): trainer_catch_interrupt installs
 * the handler (not where SIGINT is ignored), trainer_interrupted says whether it came. */
void trainer_catch_interrupt(void);
bool trainer_interrupted(void);

/* Whether flag ("--lr") was given a value on the command line (cli.c). */
bool trainer_flag_given(const trainer_opts *o, const char *flag);

/* ---- checkpoints (checkpoint.c) --------------------------------------------------------
 * A checkpoint: the model's state, the optimizer's ("optim." or, for o2, "fp16."), the
 * scaler's ("scaler."), the monitor's with --log ("monitor.") and the metadata epochs_done,
 * seed, rng_offset and the run it belongs to: epochs, batch, schedule, amp (the mode that ran),
 * label_smoothing, steps_per_epoch, world_size (older checkpoints lack these; what they lack
 * is not filled in or checked). */
typedef struct {
    int64_t epochs_done, steps_per_epoch;
    int world_size;
} trainer_saved_run;
int trainer_checkpoint_save(const char *path, na_module *net, const trainer_amp *amp,
                            const trainer_opts *o, const trainer_saved_run *run);

/* --resume, in three steps around the setup; every message names the key or the flag and the
 * checkpoint's value (the caller adds the file). */
typedef struct {
    na_checkpoint *ck; /* the file, read once (the ranks compare it: trainer_check_ranks_agree) */
    int64_t epochs_done;
    uint64_t rng_offset;
} trainer_resume;
/* Before trainer_setup: reads o->resume_path; each of --epochs, --batch, --seed, --schedule,
 * --amp, --label-smoothing left out takes the saved run's value; --seed or --schedule given
 * with another value is refused. Call trainer_resume_close either way. */
int trainer_resume_open(trainer_opts *o, trainer_resume *rs);
/* After trainer_amp_setup: the state into net and amp, but what a flag given sets (--lr and
 * --weight-decay: every group's; --loss-scale / --growth-interval: the scaler's rule and
 * trackers, and with --loss-scale N its scale), which takes effect. Refused: another amp
 * mode than the saved one, a tensor holding inf/NaN (the tensor and the element named),
 * optimizer hyper-parameters out of range (na_optim_check). Restores the random generator. */
int trainer_resume_load(const trainer_opts *o, const trainer_resume *rs, na_module *net,
                        const trainer_amp *amp);
/* With the batcher's steps per epoch: a one-cycle run resumed with another length (--epochs,
 * or the steps of --batch, --limit, ranks) is refused; another number of ranks than the saved
 * run's is said (unless --quiet). */
int trainer_resume_check_run(const trainer_opts *o, const trainer_resume *rs, int64_t steps,
                             int world);
void trainer_resume_close(trainer_resume *rs);

/* Under mpirun (ranks.c). The options as rank r of d acts on them: rank 0 as given; with
 * several ranks the others print nothing but errors (their program name says "(rank r)",
 * written into program), keep no --log, write no --save. */
trainer_opts trainer_rank_opts(const trainer_opts *o, na_dist *d, char *program, size_t size);
/* The first collective of trainer_run under mpirun, which ranks that failed before it join
 * through trainer_start_failed: whether every rank got to trainer_run (if not, rank 0 names
 * the ranks that failed). True at once for one rank. */
bool trainer_ranks_started(na_dist *d, const trainer_opts *o);
/* Whether ok holds on every rank: a collective at the same point on every rank (true at once
 * for one rank). A rank that was fine says that it stops because another one failed. */
bool trainer_ranks_ok(na_dist *d, const trainer_opts *o, bool ok);
/* The same for a status: says what failed, if it does, after the program name and the option
 * at fault ("--resume", value "ck.safetensors"; NULL: none). */
bool trainer_ranks_all_ok(na_dist *d, const trainer_opts *o, int status, const char *option,
                          const char *value);
/* All ranks have the same --resume checkpoint (resumed: its tensors and metadata; NULL
 * without --resume), the same flags that change the math, the same model (names, dtypes,
 * shapes) and the same data (na_dist_check_same on a hash of each): 0, or -1 after saying on
 * every rank which one differs. */
int trainer_check_ranks_agree(na_dist *d, const trainer_opts *o, const trainer_job *job,
                              const na_checkpoint *resumed);
/* --log's record of step `at` (amp_step.c): prints a new monitor alert, and says (1) when the
 * log could not be written (a full disk); each line starts with prefix. */
int trainer_amp_record(trainer_amp *amp, const trainer_opts *o, int64_t at, na_tensor *loss,
                       const char *prefix);
/* The step's forward and loss (trainer_amp_loss); with `trace` (--amp-trace, the first step)
 * printing the dtype of each op: the autocast regions' ops, or every op for o2/off (graph.c),
 * and turning on the backward rows (na_amp_trace_backward), which the caller turns off once
 * the step's backward ran. */
na_tensor *trainer_step_loss(const trainer_amp *amp, na_module *net, na_tensor *x, na_tensor *y,
                             double label_smoothing, bool trace);
/* --cuda-graph in the loop (graph.c): the persistent batch and loss the graph reads and
 * writes, eager steps before the capture, the graph (NULL before the capture or when it
 * failed) and the steps it replayed. */
typedef struct {
    na_tensor *x, *y, *loss;
    int64_t warmup_left;
    na_step_graph *graph;
    int64_t replays;
} trainer_graph;
/* The learning rate and BatchNorm's count onto the device and the persistent tensors; where a
 * graph cannot serve (data parallel, a cumulative BatchNorm) it says why and leaves g->x NULL:
 * the run trains eagerly. NA_OK, or a status after saying what failed (a collective). */
int trainer_graph_setup(trainer_graph *g, const trainer_opts *o, const trainer_job *job,
                        trainer_amp *amp, na_dist *dist);
/* A full batch's step: the batch into the graph's inputs, then an eager step (warm-up, or
 * after a failed capture), the capture, or a replay. The loss, or NULL. after_bar: what to
 * print before a message (the progress bar's line end). */
na_tensor *trainer_graph_step(trainer_graph *g, const trainer_opts *o, trainer_amp *amp,
                              na_module *net, const float *x, const int32_t *y, bool trace,
                              const char *after_bar);
void trainer_graph_free(trainer_graph *g);

/* Evaluation (evaluate.c): trainer_evaluate in batches of `batch`, the images channels-last
 * when asked (as the training batches); with dist (several ranks) each rank evaluates its
 * shard, every sample once over all ranks, and every rank gets the whole set's numbers (a
 * collective). */
int trainer_evaluate_ranks(na_module *net, const na_dataset *ds, const float *mean,
                           const float *std, na_device dev, na_dtype input_dtype,
                           bool channels_last, int64_t batch, na_dist *dist, double *accuracy,
                           double *loss);
#endif
