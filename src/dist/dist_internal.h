/* The communicator's state and its asynchronous all-reduce, shared by the DDP wrapper and
 * SyncBatchNorm (internal). */
#ifndef NANOAMP_SRC_DIST_INTERNAL_H
#define NANOAMP_SRC_DIST_INTERNAL_H

#include "na_config.h"
#include "nanoamp/autograd.h"
#include "nanoamp/dist.h"

#if NA_HAVE_MPI
#include <mpi.h>
#endif

typedef struct na_nccl na_nccl; /* src/dist/nccl.c */

struct na_dist {
    int rank, world, local_rank;
    bool mpi_started; /* this na_dist called MPI_Init, so it finalizes */
    bool collectives; /* NANOAMP_DIST_COLLECTIVES=1 at init: a world of 1 runs the real paths */
#if NA_HAVE_MPI
    MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
#endif
    na_nccl *nccl; /* made on the first collective over CUDA tensors */
    int64_t bytes;
    double timeout_s;      /* na_dist_set_timeout or NANOAMP_DIST_TIMEOUT_S; 0: the defaults */
    double nccl_timeout_s; /* NANOAMP_NCCL_TIMEOUT_S (its older name, NCCL only), or 0 */
    bool failed;           /* a collective timed out: this communicator is unusable */
};

/* An all-reduce in flight (MPI request, or NCCL work on the communicator's stream). */
typedef struct {
    bool active;
#if NA_HAVE_MPI
    MPI_Request req;
#endif
    void *event; /* NCCL: a cudaEvent_t recorded after the collective */
} na_dist_req;

/* Starts an in-place SUM of the contiguous tensor t over ranks (nothing to do when
 * !na_dist_collectives(d), nor for a host tensor in a world of 1: r stays inactive); what names it in messages. Wait with na_dist_wait before reading t. */
int na_dist_start_sum(na_dist *d, na_tensor *t, na_dist_req *r, const char *fn,
                      const char *what);
int na_dist_wait(na_dist *d, na_dist_req *r, const char *fn, const char *what);
/* A wait for a collective, bounded by the communicator's timeout. */
typedef struct {
    double t0, limit, next_probe;
} na_dist_waiter;
void na_dist_waiter_start(const na_dist *d, na_dist_waiter *w, bool nccl);
/* Between two polls of a collective that has not completed: naps, longer the longer it has
 * waited (never more than 200 us), and returns NA_OK to poll again; once the timeout has
 * passed, or another rank gave up on this collective, marks d failed and returns NA_EIO
 * naming the ranks that did not answer (fn, call (may be NULL) and what, its tensor, say
 * which collective). */
int na_dist_waiter_nap(na_dist *d, na_dist_waiter *w, const char *fn, const char *call,
                       const char *what);

#if NA_HAVE_MPI
/* Waits (as above) for req, a non-blocking MPI collective that `call` started with status rc. */
int na_dist_mpi_finish(na_dist *d, int rc, MPI_Request *req, const char *fn, const char *call,
                       const char *what);
#endif

/* Nudges MPI's progress on r (Open MPI advances non-blocking collectives only inside MPI
 * calls); never blocks. */
void na_dist_poke(na_dist *d, na_dist_req *r);

#if NA_HAVE_NCCL
/* src/dist/nccl.c: the same collectives on CUDA tensors. */
int na_nccl_all_reduce(na_dist *d, na_tensor *t, na_dist_op op, const char *fn);
int na_nccl_broadcast(na_dist *d, na_tensor *t, int root, const char *fn);
int na_nccl_all_gather(na_dist *d, const na_tensor *in, na_tensor *out, const char *fn);
int na_nccl_start_sum(na_dist *d, na_tensor *t, na_dist_req *r, const char *fn);
int na_nccl_wait(na_dist *d, na_dist_req *r, const char *fn, const char *what);
void na_nccl_free(na_dist *d);
void na_nccl_abort(na_dist *d); /* ncclCommAbort, if a communicator was made */
int na_nccl_select_device(int local_rank);
#endif
/* Test hook: SyncBatchNorm on the CPU takes the composition CUDA keeps until
 * NANOAMP_CUDA_SYNCBN_ELEMT=1 (src/dist/syncbn.c). */
extern bool na_syncbn_composed_on_cpu;

#endif
