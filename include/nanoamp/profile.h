/* nanoamp/profile.h — where a training step spends its time, per op kind and per layer.
 *
 *     na_profile_begin();
 *     ... one step: forward, backward, optimizer ...
 *     na_profile_end();
 *     na_profile_print(stderr);
 *
 * Each op is timed from the end of the op before it to its own end: an op's row includes its
 * front-end and whatever the caller did since the previous op, and the rows of one profile
 * add up to its wall time (what ran after the last op, such as the optimizer, is the row
 * "(outside ops)"). A backward counts as one call of "<op> backward" per graph node, from the
 * end of the node before it to the end of its gradients' accumulation. On the CPU the clock is
 * the host's, monotonic (with NANOAMP_PROFILE_CLOCK=cpu in the environment, read at
 * na_profile_begin: the calling thread's CPU time, which a loaded machine's descheduling does
 * not inflate; meant for one thread); when every op of the profile ran on CUDA, the
 * intervals are measured between CUDA events recorded on nanoamp's stream, so they are
 * device time (na_profile_end waits for the last event). Layers: an op recorded while a child of a Sequential or Residual runs
 * its forward belongs to that child's dotted path ("1.0 (Conv2d)", the state-dict names),
 * and its backward to the same layer; other ops to "(no module)".
 *
 * With NANOAMP_PROFILE=1 in the environment the library profiles the third step of the
 * process (two steps warm the arena and the libraries' caches; steps end at na_step_end) and
 * prints the table on stderr. Off by default: nothing is recorded and nothing is timed.
 */
#ifndef NANOAMP_PROFILE_H
#define NANOAMP_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Starts a profile, dropping the previous one's results. NA_OK, or NA_ESTATE when a profile
 * is already running. */
int na_profile_begin(void);
/* Stops the profile; its rows stay readable until the next na_profile_begin or
 * na_profile_reset. NA_ESTATE when none is running. */
int na_profile_end(void);
bool na_profile_running(void);
/* Frees every record (the results of the last profile included). */
void na_profile_reset(void);

/* One row of a finished profile: an op kind ("conv2d", "conv2d backward") or a layer. */
typedef struct {
    const char *name; /* valid until the next na_profile_begin / na_profile_reset */
    int64_t calls;
    double ms;
} na_profile_row;

/* The rows of the last finished profile, sorted by time (largest first): *rows points at
 * them (NULL when there are none); returns their number. */
int na_profile_ops(const na_profile_row **rows);
int na_profile_layers(const na_profile_row **rows);
/* The op row called `name` (NULL when the profile has none). */
const na_profile_row *na_profile_op(const char *name);
/* Wall time of the last finished profile, from begin to end. */
double na_profile_wall_ms(void);
/* The tables: op kinds, then layers, each row with calls, total ms and % of the step. */
void na_profile_print(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
