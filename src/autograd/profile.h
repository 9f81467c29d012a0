/* The profiler's hooks (internal; the public side is nanoamp/profile.h).
 *
 * The recorder marks the end of every forward op and the engine the end of every backward
 * node; the containers say which layer runs. Each call costs one branch while no profile
 * runs. */
#ifndef NANOAMP_SRC_PROFILE_H
#define NANOAMP_SRC_PROFILE_H

#include <stdbool.h>

#include "nanoamp/profile.h"
#include "nanoamp/tensor.h"

extern bool na_profile_on_; /* read through na_profile_on() */
static inline bool na_profile_on(void) { return na_profile_on_; }

/* An op (name, " backward" added when `backward`) ended now on `dev`, in `layer` (0: none). */
void na_profile_mark(const char *name, bool backward, na_device dev, int layer);
/* The layer ops run in now (0: none): what a graph node keeps for its backward. */
int na_profile_layer(void);
/* A child module named `name` of type `type` starts / ends its forward. */
void na_profile_layer_push(const char *name, const char *type);
void na_profile_layer_pop(void);
#endif
