/* Deferred zeros (internal): a persistent tensor that reads as zeros before its memory is
 * filled. zero_grad marks gradients this way instead of filling them; the backward pass then
 * writes a marked gradient whole (no fill, no add), and everything else that reads or writes
 * gradient memory first has the marks filled in (na_zero_settle_all), so a gradient nobody
 * wrote still reads as zeros.
 *
 * The marked tensors are listed (on the host, one list for the process, as the arena), so
 * that the backward pass can settle the ones it did not reach and na_tensor_free can forget
 * one. Only a contiguous persistent tensor is marked, and never while a step graph is
 * captured (a replay would not see the mark), and on CUDA only with NANOAMP_GRAD_INPLACE=1
 * (docs/gpu-check.md): anything else is filled at once. */
#ifndef NANOAMP_SRC_DEFERRED_ZERO_H
#define NANOAMP_SRC_DEFERRED_ZERO_H

#include "nanoamp/tensor.h"

/* t (NULL: nothing) reads as zeros from now on; its memory is filled when first needed. */
int na_zero_defer(na_tensor *t);
/* Whether t is marked: its memory is stale and its value zero. */
static inline bool na_zero_deferred(const na_tensor *t) { return t && t->zero_deferred; }
/* The caller is about to write all of t: the mark goes, the memory is not filled. */
void na_zero_claim(na_tensor *t);
/* Fills t now if it is marked. */
int na_zero_settle(na_tensor *t);
/* Fills t, or the tensor whose memory it views, if marked: before reading t's memory (na_get,
 * na_copy_to_host). Logically const: the value t reads as does not change. */
int na_zero_settle_memory(const na_tensor *t);
/* Fills every marked tensor (a no-op when none is): before reading or writing gradient
 * memory anywhere but in the backward pass (a view may share a marked tensor's memory). */
int na_zero_settle_all(void);
/* t is being freed: drops it from the list. */
void na_zero_forget(na_tensor *t);
#endif
