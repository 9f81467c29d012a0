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
#endif
