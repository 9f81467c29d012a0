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
#endif
