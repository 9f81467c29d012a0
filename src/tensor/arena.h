/* The step arena (internal). Two kinds of memory come from it:
 *  - host memory for tensor structs, graph nodes and small scratch (na_arena_host_alloc),
 *  - device memory for tensor data, one arena per device (na_arena_data_alloc).
 * Each arena bump-allocates from chunks; na_arena_reset (at na_step_end) keeps the memory,
 * and when a step needed more than one chunk it replaces them by one chunk of the total size,
 * so from the second step on a step of the same shape allocates nothing. */
#ifndef NANOAMP_SRC_ARENA_H
#define NANOAMP_SRC_ARENA_H
#include <stddef.h>

#include "nanoamp/dtype.h"

void *na_arena_host_alloc(size_t bytes); /* zeroed; NULL (error set) on failure */
void *na_arena_data_alloc(na_device dev, size_t bytes); /* 256-byte aligned, not zeroed */
void na_arena_reset(void);
/* Increments at every reset: caches of step tensors compare it to know they are stale. */
unsigned long na_arena_generation(void);
/* Called by na_step_end before the arena is reset (one hook: the profiler's env mode). */
void na_arena_set_step_hook(void (*fn)(void));
#endif
