/* The step arena (internal). Two kinds of memory come from it:
 *  - host memory for tensor structs, graph nodes and small scratch (na_arena_host_alloc),
 *  - device memory for tensor data, one arena per device (na_arena_data_alloc).
 * The host arena bump-allocates from chunks; na_arena_reset (at na_step_end) keeps the memory
 * and, when a step needed more than one chunk, replaces them by one chunk of the total size.
 * A data arena takes blocks from its chunks' free ranges by best fit, so a block freed within
 * the step (na_arena_data_free) is reused; it grows by chunks of a quarter of what it holds,
 * never merges them, and at reset frees every chunk whole. Either way, from the second step
 * on a step of the same shape allocates nothing. */
#ifndef NANOAMP_SRC_ARENA_H
#define NANOAMP_SRC_ARENA_H
#include <stdbool.h>
#include <stddef.h>

#include "nanoamp/dtype.h"

void *na_arena_host_alloc(size_t bytes); /* zeroed; NULL (error set) on failure */
void *na_arena_data_alloc(na_device dev, size_t bytes); /* 256-byte aligned, not zeroed */
/* Gives a block of na_arena_data_alloc back before the step ends (bytes: as asked); the next
 * allocations reuse it. Only for blocks nothing refers to any more. */
void na_arena_data_free(na_device dev, void *p, size_t bytes);
void na_arena_reset(void);
/* A point in the host arena's allocations: whether a pointer was allocated after it tells a
 * step tensor made since (its header is in the host arena, which frees nothing in a step). */
typedef struct {
    int chunk;
    size_t used;
} na_arena_mark;
na_arena_mark na_arena_host_mark(void);
bool na_arena_host_newer(na_arena_mark m, const void *p);
/* Increments at every reset: caches of step tensors compare it to know they are stale. */
unsigned long na_arena_generation(void);
/* Called by na_step_end before the arena is reset (one hook: the profiler's env mode). */
void na_arena_set_step_hook(void (*fn)(void));
bool na_step_hook_installed(void);
#endif
