/* kernels/common/bn_rows.h — the fixed order of the BatchNorm kernels for rows: x [M, C]
 * row-major (S == 1: BatchNorm1d, and channels-last activations, which the front-end passes
 * as n = N*H*W, c = C, s = 1), switch NANOAMP_CUDA_BN_ROWS=1 (kernels/cuda/batchnorm.cu);
 * tests/test_welford.c runs the same order on the host against f64.
 *
 * The channel-per-block kernels read such x with stride C; these read it along the rows:
 *  - a vector is vw neighbouring channels of one row (16 bytes when C and the pointers allow,
 *    else one channel); a block is bx x by threads (bx * by = NA_BN_THREADS): bx vectors
 *    side by side (coalesced), by rows;
 *  - the rows are cut into chunks of whole steps (by * NA_BN_VPT rows); the chunk size
 *    depends only on M and the channel blocks, never on the GPU, and aims at about
 *    NA_BN_ROWS_BLOCKS blocks; one block per (chunk, channel block) writes one partial per
 *    channel;
 *  - in step s of its chunk, thread (tx, ty) loads rows na_bn_rows_row(g, chunk, s, j, ty),
 *    j < NA_BN_VPT (all loads first); per channel those values (the rows < M: a prefix of j)
 *    are one partial (na_welford_of), folded into the thread's in step order
 *    (na_welford_merge, the same counts for all its channels: one na_welford_fb per step);
 *  - the by threads of a channel combine as one tree (na_welford_tree over by lanes, ty
 *    order); the chunk partials of a channel combine as na_welford_combine (the v2 kernels'
 *    finalize).
 * The backward's (sum g, sum g*xhat) follow the same order with plain addition, value by
 * value (j, then steps). Deterministic, no atomics. Plain C99, host + device.
 */
#ifndef NANOAMP_KERNELS_COMMON_BN_ROWS_H
#define NANOAMP_KERNELS_COMMON_BN_ROWS_H

#include <stdint.h>

#include "common/hd.h"
#include "common/welford.h"

/* Blocks a statistics pass aims at (a few waves on a large GPU). */
#define NA_BN_ROWS_BLOCKS 2048

typedef struct {
    int64_t m, c;    /* rows, channels */
    int64_t cv;      /* vectors per row, c / vw */
    int vw, bx, by;  /* channels per vector; block: bx vectors x by rows */
    int64_t cblocks; /* blocks across a row, ceil(cv / bx) */
    int64_t step;    /* rows of one step: by * NA_BN_VPT */
    int64_t steps;   /* steps per chunk */
    int64_t chunks;  /* chunks (partials per channel), >= 1 */
} na_bn_rows_geom;

/* vw must divide c */
static NA_HD na_bn_rows_geom na_bn_rows_geom_of(int64_t m, int64_t c, int vw) {
    na_bn_rows_geom g;
    g.m = m;
    g.c = c;
    g.vw = vw;
    g.cv = c / vw;
    g.bx = 1;
    while (g.bx < 32 && g.bx < g.cv) g.bx *= 2;
    g.by = NA_BN_THREADS / g.bx;
    g.cblocks = g.cv > 0 ? (g.cv + g.bx - 1) / g.bx : 1;
    g.step = (int64_t)g.by * NA_BN_VPT;
    const int64_t all = m > 0 ? (m + g.step - 1) / g.step : 1; /* steps over all rows */
    int64_t want = NA_BN_ROWS_BLOCKS / g.cblocks;
    if (want < 1) want = 1;
    if (want > all) want = all;
    g.steps = (all + want - 1) / want;
    g.chunks = (all + g.steps - 1) / g.steps;
    return g;
}

/* The row of load j of thread row ty in step s of chunk k. */
static NA_HD int64_t na_bn_rows_row(const na_bn_rows_geom *g, int64_t k, int64_t s, int j,
                                    int ty) {
    return (k * g->steps + s) * g->step + (int64_t)j * g->by + ty;
}

#endif
