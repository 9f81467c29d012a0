/* nanoamp/dist.h — data parallelism: a communicator over processes (MPI for host tensors,
 * NCCL for CUDA tensors, bootstrapped through MPI), a DDP wrapper that averages gradients
 * over ranks while backward runs, and SyncBatchNorm.
 *
 *     na_dist *d = na_dist_init();            // mpirun's environment, or a world of 1
 *     na_ddp *ddp = na_ddp_new(d, net, NULL);  // rank 0's parameters and buffers everywhere
 *     for (...) {                             // each rank its own shard of the batch
 *         na_tensor *loss = na_cross_entropy(na_module_forward(net, x), y, NULL);
 *         na_backward(loss, NULL);            // buckets start their all-reduce as they fill
 *         na_ddp_finish(ddp);                 // waits; every grad is the average over ranks
 *         na_optim_step(opt, NULL);
 *         na_optim_zero_grad(opt);
 *         na_step_end();
 *     }
 *     na_ddp_free(ddp);
 *     na_dist_free(d);
 *
 * Launch with `mpirun -np N prog ...` (docs/distributed.md). Without a launcher, or in a build
 * without MPI (meson option -Ddist=disabled, or no MPI found), na_dist_init gives a world of
 * one process in which every collective is a no-op or a copy, so the same program runs alone.
 *
 * NANOAMP_DIST_COLLECTIVES=1 (read once, by na_dist_init) makes a world of 1 run the real
 * paths, to measure or exercise them with one process: collectives on CUDA tensors go through
 * an NCCL communicator of one rank (its id made locally: no launcher or MPI needed) on the
 * dist stream, DDP copies gradients into its buckets, starts them from the engine hook and
 * waits for them in na_ddp_finish as with several ranks, and na_dist_bytes counts. Host
 * tensors take the same path except the MPI call itself (MPI is never started for a world of
 * 1); host arrays (na_dist_all_reduce_i64/_f64), barrier and na_dist_check_same stay
 * no-ops; SyncBatchNorm runs its own forward and backward (its collectives add nothing). A
 * CUDA tensor then needs NCCL and a device: NA_ENOTSUP / NA_ECUDA
 * otherwise. Without the variable (or with world > 1) nothing changes.
 *
 * Collectives are blocking and must be called by every rank in the same order with tensors of
 * the same shape and dtype. Host tensors go through MPI, CUDA tensors through NCCL on a stream
 * of its own that is ordered after nanoamp's stream (na_cuda_stream) and before whatever
 * follows. Errors: every call returns a negative na_status and sets a message naming the op,
 * the tensor and the rank; MPI errors are returned (MPI_ERRORS_RETURN), never fatal inside
 * nanoamp. A rank that dies ends the job: Open MPI's launcher aborts every rank when one exits
 * without MPI_Finalize. A rank that stops (SIGSTOP, a hang) is found by the timeout: every wait
 * for a collective polls (sleeping as it waits longer: no core spins) and after the timeout
 * (na_dist_set_timeout) fails with NA_EIO, naming the ranks that did not answer; NCCL's
 * communicator is then aborted (ncclCommAbort).
 */
#ifndef NANOAMP_DIST_H
#define NANOAMP_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nanoamp/amp.h"
#include "nanoamp/error.h"
#include "nanoamp/fp8.h"
#include "nanoamp/nn.h"
#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct na_dist na_dist;

/* AVG is SUM divided by the world size, in the tensor's dtype. (Not named na_reduce_op /
 * NA_REDUCE_*: the kernels' reduction enum of kernels/backend.h has those names.) */
typedef enum { NA_DIST_SUM, NA_DIST_AVG, NA_DIST_MAX } na_dist_op;

bool na_dist_built_with_mpi(void);  /* MPI compiled in (meson -Ddist) */
bool na_dist_built_with_nccl(void); /* NCCL compiled in (CUDA backend and NCCL found) */

/* ---- the communicator ------------------------------------------------------------------- */
/* Joins the job the launcher started: mpirun's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK}, or the
 * RANK / WORLD_SIZE / LOCAL_RANK convention (checked against MPI's own numbers). Without a
 * launcher (or WORLD_SIZE=1): a world of 1, no MPI call made. With CUDA available, selects
 * device local_rank % device count: call it before making any CUDA tensor. NULL + error on
 * failure (e.g. WORLD_SIZE > 1 in a build without MPI). One per process. */
na_dist *na_dist_init(void);
void na_dist_free(na_dist *d); /* finalizes MPI if init started it; NULL is fine */
/* Ends the whole job from this rank: the program's decision (nanoamp itself never exits), for a
 * rank that failed where the others cannot know it and would wait for it in a collective (a
 * training step that failed on this rank only). With several ranks: aborts the NCCL
 * communicator if one was made (ncclCommAbort), then MPI_Abort on d's communicator with code,
 * which makes the launcher stop every rank (mpirun exits non-zero); it does not return. In a
 * world of 1 (or NULL d) no other rank waits: it returns code and does nothing else, so that
 * `return na_dist_abort(d, 1);` ends a lone process the ordinary way. */
int na_dist_abort(na_dist *d, int code);
/* How long a collective waits for the other ranks, in seconds (> 0, else NA_EINVAL): after it,
 * the waiting rank asks every other rank for a sign of life for min(timeout, 5 s) (a rank
 * waiting in the same collective answers at once, and gives up too), then fails with NA_EIO
 * "... did not complete within T s: rank 1 did not answer"; every later collective on d fails
 * at once, and na_dist_free no longer finalizes MPI (that would wait for the missing rank):
 * end the process, or the job (na_dist_abort). Defaults, as PyTorch's: NANOAMP_DIST_TIMEOUT_S
 * when set (read by na_dist_init, which refuses a value that is not seconds > 0), else 1800 s
 * for MPI (gloo's default) and 600 s for NCCL (NCCL's; NANOAMP_NCCL_TIMEOUT_S, its older
 * name, still sets that one). MPI_Init and the communicator's creation are not bounded. */
int na_dist_set_timeout(na_dist *d, double seconds);
/* The timeout a collective over MPI (nccl false) or NCCL waits with now. */
double na_dist_timeout(const na_dist *d, bool nccl);
/* NULL d answers as a world of 1: rank 0, size 1, local rank 0. */
int na_dist_rank(const na_dist *d);
int na_dist_world_size(const na_dist *d);
int na_dist_local_rank(const na_dist *d);

/* In place on every rank: t = op over ranks of t. Float (f64, f32, f16, bf16) and integer (i32,
 * u8: SUM and MAX only) tensors, contiguous. f16/bf16 travel as 16 bits and each pairwise sum
 * is taken in f32 and rounded (RNE), as NCCL does: one rounding for 2 ranks. */
int na_dist_all_reduce(na_dist *d, na_tensor *t, na_dist_op op);
/* t on every rank = t on root (same shape and dtype everywhere). */
int na_dist_broadcast(na_dist *d, na_tensor *t, int root);
/* out [world, *in.shape] (same dtype and device as in): out[r] = in of rank r. */
int na_dist_all_gather(na_dist *d, const na_tensor *in, na_tensor *out);
int na_dist_barrier(na_dist *d);
/* Host arrays (counts, losses): v[0..n) reduced in place; AVG divides after the sum. */
int na_dist_all_reduce_i64(na_dist *d, int64_t *v, int n, na_dist_op op);
int na_dist_all_reduce_f64(na_dist *d, double *v, int n, na_dist_op op);
/* All-gathers hash: NA_EINVAL "rank R's <what> differs from rank 0's" on every rank if any
 * rank's differs (ranks started with different flags or models). */
int na_dist_check_same(na_dist *d, uint64_t hash, const char *what);
/* The hashes na_dist_check_same compares: FNV-1a, h extended by n bytes (start from
 * NA_DIST_HASH_START); equal inputs give equal hashes on machines of one byte order. */
#define NA_DIST_HASH_START 0xcbf29ce484222325ull
uint64_t na_dist_hash(uint64_t h, const void *p, size_t n);
/* h extended by each state tensor's name, dtype and shape (na_module_state's list): ranks
 * that built different models disagree on it. */
uint64_t na_dist_hash_state(uint64_t h, const na_named_tensors *st);
/* Bytes this rank has handed to collectives so far (payload, not wire traffic: a ring
 * all-reduce of B bytes sends about 2 (N-1)/N * B per rank). */
int64_t na_dist_bytes(const na_dist *d);
/* Whether collectives do real work: world > 1, or NANOAMP_DIST_COLLECTIVES=1 was set at init
 * (false for NULL). A program that skips data-parallel setup in a world of 1 asks this. */
bool na_dist_collectives(const na_dist *d);

/* ---- data-parallel training ------------------------------------------------------------- */
typedef struct {
    int64_t bucket_bytes;     /* gradient bytes per bucket; 0: 25 MiB (PyTorch's default) */
    na_dtype allreduce_dtype; /* 0 or NA_DTYPE_F32: reduce in f32; NA_DTYPE_F16 / BF16:
                                 pre-divide by the world size, reduce compressed, widen back.
                                 f64 gradients are always reduced in f64 */
    bool no_broadcast_buffers; /* false (default, PyTorch's broadcast_buffers=True): rank 0's
                                  buffers (BatchNorm's running statistics) on every rank after
                                  each synced step; true: each rank keeps its own */
} na_ddp_config;

typedef struct na_ddp na_ddp;

/* Wraps net (which stays the caller's): broadcasts its parameters and buffers from rank 0,
 * groups the trainable parameters into buckets in reverse registration order (the order
 * backward produces their gradients) and registers the engine hook that starts a bucket's
 * all-reduce as soon as the last gradient in it is final, so communication overlaps the rest
 * of backward. Buckets are started in order on every rank. cfg NULL: defaults. One wrapper
 * active at a time. NULL + error on failure. */
na_ddp *na_ddp_new(na_dist *d, na_module *net, const na_ddp_config *cfg);
/* false: the next backwards accumulate locally with no communication (gradient accumulation:
 * sync off for all micro-batches but the last). */
int na_ddp_set_sync(na_ddp *p, bool sync);
/* After na_backward (with sync on): starts any bucket not yet started (parameters that got no
 * gradient count as zeros), waits for all, and leaves every gradient averaged over ranks;
 * then (unless no_broadcast_buffers) broadcasts rank 0's buffers, which this step's forward
 * updated on each rank from its own shard, so the next forward (training or evaluation) and
 * a checkpoint see rank 0's on every rank, as PyTorch's broadcast before each forward does.
 * Call before unscaling, clipping or stepping. With sync off: NA_OK, nothing done. One
 * backward per synced step (as PyTorch's DDP): a bucket starts once its gradients are final
 * for the backward that runs, so sum several losses first, or use sync off for the others. */
int na_ddp_finish(na_ddp *p);
/* Payload bytes this rank handed to all-reduce in the last synced step (buckets in their
 * reduction dtype; counted in a world of 1 too, where nothing is sent but with
 * NANOAMP_DIST_COLLECTIVES=1 CUDA buckets go through a one-rank NCCL all-reduce). */
int64_t na_ddp_bytes_last_step(const na_ddp *p);
int na_ddp_num_buckets(const na_ddp *p);
void na_ddp_free(na_ddp *p); /* removes the hook; NULL is fine */

/* ---- mixed precision across ranks ------------------------------------------------------- */
/* With na_ddp every rank unscales the same averaged gradients, so every rank finds the same
 * inf/NaN and skips the same steps: nothing more is needed. Where ranks unscale different
 * gradients (each its own shard of the parameters), call this between na_grad_scaler_unscale_
 * and na_grad_scaler_step: opt's found_inf becomes the MAX over ranks, so all skip together
 * and the scale moves the same way everywhere. NA_ESTATE when opt was not unscaled by gs. */
int na_dist_sync_found_inf(na_dist *d, na_grad_scaler *gs, na_optim *opt);
/* FP8 scaling under data parallelism (nanoamp/fp8.h): each recorded amax (row 0 of every
 * role's history, of each of the n states) becomes its max over ranks, so every rank's
 * update() computes the same scales (Transformer Engine reduces its amax buffer so, with max,
 * before the update). Call it after the step's last record and before na_fp8_scaling_update,
 * on every rank with states made the same way. A NaN on any rank is a NaN on all (MPI's max
 * leaves a NaN's fate to the operand order); one collective of 6n doubles. */
int na_dist_fp8_reduce_amax(na_dist *d, na_fp8_scaling *const *states, int n);

/* ---- SyncBatchNorm ---------------------------------------------------------------------- */
/* Every BatchNorm of net computes its training-mode batch statistics over all ranks of d:
 * each rank's per-channel mean, variance and count (f32; f64 for f64 input) all-gathered and
 * combined in forward (Chan's formula: nothing cancels), the two per-channel sums of its
 * backward (of dy and dy * xhat) all-reduced, as PyTorch's SyncBatchNorm. NULL d: back to
 * per-rank statistics. Every rank must run the same BatchNorms in the same order. In a world
 * of 1 it is plain BatchNorm (unless NANOAMP_DIST_COLLECTIVES=1, above). */
int na_module_sync_batchnorm(na_module *net, na_dist *d);

#ifdef __cplusplus
}
#endif
#endif
