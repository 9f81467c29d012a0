/* Internals shared by the op front-ends of src/ops. */
#ifndef NANOAMP_SRC_OPS_INTERNAL_H
#define NANOAMP_SRC_OPS_INTERNAL_H

#include "src/autograd/graph.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h"

/* v when set (> 0), else the default d: zeroed option fields take the defaults. */
static inline int na_or_default(int v, int d) { return v > 0 ? v : d; }

/* A copy of a convolution / pooling geometry in the step arena (a node's extra block). */
static inline na_conv_geom *na_conv_geom_copy(const na_conv_geom *g) {
    na_conv_geom *c = na_arena_host_alloc(sizeof *c);
    if (c) *c = *g;
    return c;
}
#endif
