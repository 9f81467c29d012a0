/* examples/common/trainer_internal.h — what the files of examples/common share among
 * themselves (not the trainers): strict number parsing, the setup before training and the
 * checkpoint format. */
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

/* A checkpoint: the model's state, the optimizer's ("optim." or, for o2, "fp16."), the
 * scaler's ("scaler.") and the metadata epochs_done, seed and rng_offset. */
int trainer_checkpoint_save(const char *path, na_module *net, const trainer_amp *amp,
                            int64_t epochs_done, uint64_t seed);
/* Loads all of the above into net and amp and restores the random generator. The message
 * names the file and, for bad metadata, the key. */
int trainer_checkpoint_load(const char *path, na_module *net, const trainer_amp *amp,
                            int64_t *epochs_done);
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
/* All ranks have the same flags that change the math, the same model (names, dtypes, shapes)
 * and the same data (na_dist_check_same on a hash of each): 0, or -1 after saying on every
 * rank which one differs. */
int trainer_check_ranks_agree(na_dist *d, const trainer_opts *o, const trainer_job *job);
#endif
