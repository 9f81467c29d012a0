/* Collectives on CUDA tensors through NCCL, bootstrapped over MPI (rank 0's ncclUniqueId is
 * broadcast), on a stream of their own.
 *
 * Ordering: each collective waits for an event recorded on nanoamp's stream (na_cuda_stream),
 * so it reads the values the kernels before it wrote, and nanoamp's stream waits for the
 * collective's event before running anything after it. Faults: NCCL reports a dead peer or a
 * network error asynchronously, and a collective with a missing peer never completes; so the
 * host never blocks in CUDA on a collective: it polls the event, asks ncclCommGetAsyncError
 * between polls, and after the communicator's NCCL timeout (na_dist_timeout: 600 s unless
 * set) aborts the communicator (ncclCommAbort), which frees the stuck kernels, and returns
 * NA_EIO naming the ranks that did not answer (comm.c's waiter). Later collectives on an
 * aborted communicator fail at once. */
#include <cuda_runtime.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f() for f(void) */
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdlib.h>

#include "nanoamp/cuda.h"
#include "src/dist/dist_internal.h"

struct na_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t inputs_ready; /* recorded on nanoamp's stream before each collective */
    bool aborted;
};

static int cuda_error(const char *fn, const char *call, cudaError_t e) {
    return na_set_error(NA_ECUDA, "%s: %s failed: %s", fn, call, cudaGetErrorString(e));
}
static int nccl_error(const na_dist *d, const char *fn, const char *call, ncclResult_t r) {
    return na_set_error(NA_EIO, "%s: rank %d of %d: %s failed: %s", fn, d->rank, d->world, call,
                        ncclGetErrorString(r));
}

int na_nccl_select_device(int local_rank) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        (void)cudaGetLastError(); /* no device: host tensors only */
        return NA_OK;
    }
    cudaError_t e = cudaSetDevice(local_rank % n);
    return e == cudaSuccess ? NA_OK : cuda_error("na_dist_init", "cudaSetDevice", e);
}

/* The communicator, made at the first collective over CUDA tensors (every rank gets there,
 * since collectives are called by all); in a world of 1 (NANOAMP_DIST_COLLECTIVES=1) a
 * communicator of one rank whose id needs no broadcast. */
static na_nccl *comm_of(na_dist *d, const char *fn) {
    if (d->nccl) {
        if (d->nccl->aborted) {
            na_set_error(NA_EIO, "%s: rank %d: the NCCL communicator was aborted after an "
                         "earlier failure", fn, d->rank);
            return NULL;
        }
        return d->nccl;
    }
    na_nccl *c = calloc(1, sizeof *c);
    if (!c) {
        na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        return NULL;
    }
    ncclUniqueId id;
    ncclResult_t r = ncclSuccess;
    int ndev = 0, rc = NA_OK;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        (void)cudaGetLastError();
        rc = na_set_error(NA_ECUDA, "%s: rank %d of %d: NCCL needs a CUDA device and none is "
                          "visible", fn, d->rank, d->world);
    }
    if (!rc && d->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
        rc = nccl_error(d, fn, "ncclGetUniqueId", r);
    /* every rank joins the broadcast, so a failure on rank 0 does not strand the others; a
     * world of 1 (NANOAMP_DIST_COLLECTIVES=1) has no MPI and needs none */
#if NA_HAVE_MPI
    MPI_Request rq;
    int mrc = d->world > 1 ? na_dist_mpi_finish(d, MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0,
                                                              d->comm, &rq),
                                                &rq, fn, "MPI_Ibcast", "the ncclUniqueId")
                           : NA_OK;
    if (!rc) rc = mrc;
#endif /* without MPI there is no world larger than 1 (na_dist_init refuses it) */
    if (!rc && (r = ncclCommInitRank(&c->comm, d->world, id, d->rank)) != ncclSuccess)
        rc = nccl_error(d, fn, "ncclCommInitRank", r);
    cudaError_t e;
    if (!rc && (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)))
        rc = cuda_error(fn, "cudaStreamCreateWithFlags", e);
    if (!rc && (e = cudaEventCreateWithFlags(&c->inputs_ready, cudaEventDisableTiming)))
        rc = cuda_error(fn, "cudaEventCreateWithFlags", e);
    if (rc) {
        if (c->comm) ncclCommDestroy(c->comm);
        free(c);
        return NULL;
    }
    return d->nccl = c;
}

void na_nccl_abort(na_dist *d) {
    na_nccl *c = d->nccl;
    if (c && !c->aborted) ncclCommAbort(c->comm); /* frees kernels waiting for other ranks */
    if (c) c->aborted = true;
}

void na_nccl_free(na_dist *d) {
    na_nccl *c = d->nccl;
    if (!c) return;
    if (!c->aborted) ncclCommDestroy(c->comm);
    cudaEventDestroy(c->inputs_ready);
    cudaStreamDestroy(c->stream);
    free(c);
    d->nccl = NULL;
}

static ncclDataType_t nccl_type(na_dtype dt) {
    switch (dt) {
    case NA_DTYPE_F64: return ncclFloat64;
    case NA_DTYPE_F16: return ncclFloat16;
    case NA_DTYPE_BF16: return ncclBfloat16;
    case NA_DTYPE_I32: return ncclInt32;
    case NA_DTYPE_U8:
    case NA_DTYPE_F8E4M3:
    case NA_DTYPE_F8E5M2: return ncclUint8; /* bytes: reductions of FP8 are refused before */
    default: return ncclFloat32;
    }
}

static ncclRedOp_t nccl_op(na_dist_op op) {
    return op == NA_DIST_MAX ? ncclMax : op == NA_DIST_AVG ? ncclAvg : ncclSum;
}

/* The comm stream waits for what nanoamp's stream has queued so far. */
static int order_after_compute(na_nccl *c, const char *fn) {
    cudaError_t e = cudaEventRecord(c->inputs_ready, (cudaStream_t)na_cuda_stream());
    if (!e) e = cudaStreamWaitEvent(c->stream, c->inputs_ready, 0);
    return e ? cuda_error(fn, "cudaEventRecord/cudaStreamWaitEvent", e) : NA_OK;
}

/* An event after the collective just queued on the comm stream, into r. */
static int record_done(na_nccl *c, na_dist_req *r, const char *fn) {
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (!e && (e = cudaEventRecord(ev, c->stream))) cudaEventDestroy(ev);
    if (e) return cuda_error(fn, "cudaEventRecord", e);
    r->event = ev;
    r->active = true;
    return NA_OK;
}

/* Waits on the host (polling, bounded by the NCCL timeout) so that a dead rank ends in an
 * error, not a hang; this is one host wait per DDP step. A watchdog thread aborting the
 * communicator would allow a stream wait instead (docs/distributed.md, "A rank that dies"). */
int na_nccl_wait(na_dist *d, na_dist_req *r, const char *fn, const char *what) {
    na_nccl *c = d->nccl;
    cudaEvent_t ev = r->event;
    r->event = NULL;
    r->active = false;
    na_dist_waiter w;
    na_dist_waiter_start(d, &w, true);
    int rc = NA_OK;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            rc = cuda_error(fn, "cudaEventQuery", e);
            break;
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(c->comm, &async);
        if (async != ncclSuccess) rc = nccl_error(d, fn, what, async);
        else rc = na_dist_waiter_nap(d, &w, fn, NULL, what);
        if (rc) { /* frees the kernels that wait for the missing rank */
            ncclCommAbort(c->comm);
            c->aborted = true;
            break;
        }
    }
    if (!rc) { /* what runs next on nanoamp's stream sees the result */
        cudaError_t e = cudaStreamWaitEvent((cudaStream_t)na_cuda_stream(), ev, 0);
        if (e) rc = cuda_error(fn, "cudaStreamWaitEvent", e);
    }
    cudaEventDestroy(ev);
    return rc;
}

/* Queues one collective (launch), then waits for it like a request. */
#define NCCL_COLLECTIVE_(d, fn, what, call)                                  \
    do {                                                                     \
        na_nccl *c_ = comm_of(d, fn);                                        \
        if (!c_) return na_last_status();                                    \
        int rc_ = order_after_compute(c_, fn);                               \
        if (rc_) return rc_;                                                 \
        ncclResult_t r_ = (call);                                            \
        if (r_ != ncclSuccess) return nccl_error(d, fn, #call, r_);          \
        na_dist_req req_ = {0};                                              \
        if ((rc_ = record_done(c_, &req_, fn))) return rc_;                  \
        return na_nccl_wait(d, &req_, fn, what);                             \
    } while (0)

int na_nccl_all_reduce(na_dist *d, na_tensor *t, na_dist_op op, const char *fn) {
    NCCL_COLLECTIVE_(d, fn, "ncclAllReduce",
                     ncclAllReduce(t->data, t->data, (size_t)t->numel, nccl_type(t->dtype),
                                   nccl_op(op), c_->comm, c_->stream));
}

int na_nccl_broadcast(na_dist *d, na_tensor *t, int root, const char *fn) {
    NCCL_COLLECTIVE_(d, fn, "ncclBroadcast",
                     ncclBroadcast(t->data, t->data, (size_t)t->numel, nccl_type(t->dtype), root,
                                   c_->comm, c_->stream));
}

int na_nccl_all_gather(na_dist *d, const na_tensor *in, na_tensor *out, const char *fn) {
    NCCL_COLLECTIVE_(d, fn, "ncclAllGather",
                     ncclAllGather(in->data, out->data, (size_t)in->numel, nccl_type(in->dtype),
                                   c_->comm, c_->stream));
}

int na_nccl_start_sum(na_dist *d, na_tensor *t, na_dist_req *r, const char *fn) {
    na_nccl *c = comm_of(d, fn);
    if (!c) return na_last_status();
    int rc = order_after_compute(c, fn);
    if (rc) return rc;
    ncclResult_t res = ncclAllReduce(t->data, t->data, (size_t)t->numel, nccl_type(t->dtype),
                                     ncclSum, c->comm, c->stream);
    if (res != ncclSuccess) return nccl_error(d, fn, "ncclAllReduce", res);
    return record_done(c, r, fn);
}
