/* The communicator: the launcher's environment, MPI for host tensors (NCCL for CUDA tensors in
 * nccl.c), and a world of one process that needs no MPI at all.
 *
 * f16/bf16 sums: MPI knows no half types, so they travel as 16-bit words and are added by a
 * user MPI_Op that widens both operands to f32 (the CPU backend's array conversion), adds and
 * rounds once (RNE, as kernels/common/half.h). Converting to f32 buffers instead would double
 * the bytes, which is the very thing an f16 all-reduce is meant to save; with two ranks both
 * give the same answer (one rounding), with more each partial sum is rounded, as NCCL does.
 */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "src/dist/dist_internal.h"
#include "src/tensor/tensor_internal.h"

bool na_dist_built_with_mpi(void) { return NA_HAVE_MPI; }
bool na_dist_built_with_nccl(void) { return NA_HAVE_NCCL; }

int na_dist_rank(const na_dist *d) { return d ? d->rank : 0; }
int na_dist_world_size(const na_dist *d) { return d ? d->world : 1; }
int na_dist_local_rank(const na_dist *d) { return d ? d->local_rank : 0; }
int64_t na_dist_bytes(const na_dist *d) { return d ? d->bytes : 0; }
bool na_dist_collectives(const na_dist *d) { return d && (d->world > 1 || d->collectives); }

/* An integer environment variable: false when unset; *bad set when set but not a number. */
static bool env_int(const char *name, int *v, bool *bad) {
    const char *s = getenv(name);
    if (!s || !*s) return false;
    char *end;
    long x = strtol(s, &end, 10);
    if (*end || x < 0 || x > INT_MAX) *bad = true;
    *v = (int)x;
    return true;
}

/* A timeout in seconds from the environment: 0 when unset; *bad when not a positive number. */
static double env_seconds(const char *name, bool *bad) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    double x = strtod(s, &end);
    if (*end || !(x > 0) || !isfinite(x)) *bad = true;
    return *bad ? 0 : x;
}

#if NA_HAVE_MPI
/* ---- MPI -------------------------------------------------------------------------------- */

static MPI_Op half_ops[2][2]; /* [f16, bf16][sum, max], made once MPI runs */
static bool have_half_ops;

/* The pairwise combine of two f16/bf16 arrays (inout = in op inout): both widened to f32 a
 * chunk at a time by the CPU backend's conversion (F16C/AVX2 where the CPU has them,
 * bit-identical to half.h; a per-element half.h loop here took ~15% of a 2-rank MLP step),
 * combined in f32 and rounded once on the way back. MAX keeps a NaN from either side, so an
 * inf/NaN flag reduced with MAX survives. */
#define HALF_CHUNK 1024
static void half_combine(na_dtype dt, bool max, void *in, void *inout, int len) {
    const na_backend *cpu = na_backend_get(NA_DEVICE_CPU);
    float x[HALF_CHUNK], y[HALF_CHUNK];
    for (int o = 0; o < len; o += HALF_CHUNK) {
        int n = len - o < HALF_CHUNK ? len - o : HALF_CHUNK;
        na_view a = {.dtype = dt, .device = NA_DEVICE_CPU, .ndim = 1, .shape = {n}, .stride = {1},
                     .numel = n, .data = (uint16_t *)in + o};
        na_view b = a, fx = a, fy = a;
        b.data = (uint16_t *)inout + o;
        fx.dtype = fy.dtype = NA_DTYPE_F32, fx.data = x, fy.data = y;
        cpu->copy(&fx, &a); /* cannot fail: same shape, known dtypes */
        cpu->copy(&fy, &b);
        if (max)
            for (int i = 0; i < n; i++) y[i] = (x[i] > y[i] || isnan(x[i])) ? x[i] : y[i];
        else
            for (int i = 0; i < n; i++) y[i] += x[i];
        cpu->copy(&b, &fy);
    }
}

#define HALF_OP_(name, dtype, max)                                              \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {       \
        (void)dt;                                                               \
        half_combine(dtype, max, in, inout, *len);                              \
    }
HALF_OP_(f16_sum, NA_DTYPE_F16, false)
HALF_OP_(f16_max, NA_DTYPE_F16, true)
HALF_OP_(bf16_sum, NA_DTYPE_BF16, false)
HALF_OP_(bf16_max, NA_DTYPE_BF16, true)

static int mpi_error(const na_dist *d, const char *fn, const char *call, int rc,
                     const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return na_set_error(NA_EIO, "%s: rank %d of %d: %s of %s failed: %s", fn, d->rank, d->world,
                        call, what, msg);
}

int na_dist_mpi_finish(na_dist *d, int rc, MPI_Request *req, const char *fn, const char *call,
                       const char *what) {
    if (rc != MPI_SUCCESS) return mpi_error(d, fn, call, rc, what);
    na_dist_waiter w;
    na_dist_waiter_start(d, &w, false);
    for (;;) { /* MPI_Wait would spin a core for as long as a rank is missing, with no end */
        int done = 0;
        if ((rc = MPI_Test(req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            return mpi_error(d, fn, call, rc, what);
        if (done) return NA_OK;
        if ((rc = na_dist_waiter_nap(d, &w, fn, call, what))) return rc;
    }
}

static MPI_Datatype mpi_type(na_dtype dt) {
    switch (dt) {
    case NA_DTYPE_F64: return MPI_DOUBLE;
    case NA_DTYPE_F32: return MPI_FLOAT;
    case NA_DTYPE_F16:
    case NA_DTYPE_BF16: return MPI_UINT16_T;
    case NA_DTYPE_I32: return MPI_INT32_T;
    case NA_DTYPE_U8:
    case NA_DTYPE_F8E4M3:
    case NA_DTYPE_F8E5M2: return MPI_UINT8_T; /* FP8 moves as bytes; check_op refuses sums */
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(na_dtype dt, na_dist_op op) {
    int max = op == NA_DIST_MAX;
    if (dt == NA_DTYPE_F16) return half_ops[0][max];
    if (dt == NA_DTYPE_BF16) return half_ops[1][max];
    return max ? MPI_MAX : MPI_SUM;
}

static int mpi_start(na_dist *d, int eworld, int erank, int elocal, const char *fn) {
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
            return na_set_error(NA_EIO, "%s: MPI_Init_thread failed (code %d)", fn, rc);
        d->mpi_started = true;
    }
    /* errors come back as codes: nanoamp reports them and never aborts inside a call */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->comm)) != MPI_SUCCESS)
        return mpi_error(d, fn, "MPI_Comm_dup", rc, "MPI_COMM_WORLD");
    MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(d->comm, &d->rank);
    MPI_Comm_size(d->comm, &d->world);
    if (d->world != eworld || d->rank != erank)
        return na_set_error(NA_EINVAL, "%s: the environment says rank %d of %d but MPI says rank "
                            "%d of %d: launch with mpirun -np %d", fn, erank, eworld, d->rank,
                            d->world, eworld);
    if (elocal >= 0) {
        d->local_rank = elocal;
    } else { /* no launcher variable: the rank among the processes of this node */
        MPI_Comm node;
        if ((rc = MPI_Comm_split_type(d->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node)))
            return mpi_error(d, fn, "MPI_Comm_split_type", rc, "the node's ranks");
        MPI_Comm_rank(node, &d->local_rank);
        MPI_Comm_free(&node);
    }
    if (!have_half_ops) {
        have_half_ops = true;
        MPI_Op_create(f16_sum, 1, &half_ops[0][0]);
        MPI_Op_create(f16_max, 1, &half_ops[0][1]);
        MPI_Op_create(bf16_sum, 1, &half_ops[1][0]);
        MPI_Op_create(bf16_max, 1, &half_ops[1][1]);
    }
    return NA_OK;
}
#endif

na_dist *na_dist_init(void) {
    const char *fn = "na_dist_init";
    int world = 1, rank = 0, local = -1;
    bool bad = false;
    bool ompi = env_int("OMPI_COMM_WORLD_SIZE", &world, &bad);
    if (ompi) {
        env_int("OMPI_COMM_WORLD_RANK", &rank, &bad);
        env_int("OMPI_COMM_WORLD_LOCAL_RANK", &local, &bad);
    } else {
        env_int("WORLD_SIZE", &world, &bad);
        env_int("RANK", &rank, &bad);
        env_int("LOCAL_RANK", &local, &bad);
    }
    if (bad || world < 1 || rank >= world) {
        na_set_error(NA_EINVAL, "%s: the launcher's environment is not a valid rank and world "
                     "size (%s=%s, %s=%s)", fn, ompi ? "OMPI_COMM_WORLD_RANK" : "RANK",
                     getenv(ompi ? "OMPI_COMM_WORLD_RANK" : "RANK"),
                     ompi ? "OMPI_COMM_WORLD_SIZE" : "WORLD_SIZE",
                     getenv(ompi ? "OMPI_COMM_WORLD_SIZE" : "WORLD_SIZE"));
        return NULL;
    }
    na_dist *d = calloc(1, sizeof *d);
    if (!d) {
        na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        return NULL;
    }
    d->world = 1;
    bool bad_nccl = false; /* the older variable keeps its old leniency: bad means default */
    d->nccl_timeout_s = env_seconds("NANOAMP_NCCL_TIMEOUT_S", &bad_nccl);
    d->timeout_s = env_seconds("NANOAMP_DIST_TIMEOUT_S", &bad);
    if (bad) {
        na_set_error(NA_EINVAL, "%s: NANOAMP_DIST_TIMEOUT_S=%s: expected a number of seconds "
                     "> 0", fn, getenv("NANOAMP_DIST_TIMEOUT_S"));
        free(d);
        return NULL;
    }
    const char *coll = getenv("NANOAMP_DIST_COLLECTIVES");
    d->collectives = coll && !strcmp(coll, "1");
#if NA_HAVE_MPI
    d->comm = MPI_COMM_NULL;
    if (world > 1 && mpi_start(d, world, rank, local, fn) != NA_OK) {
        na_dist_free(d);
        return NULL;
    }
#else
    if (world > 1) {
        na_set_error(NA_ENOTSUP, "%s: launched as rank %d of %d, but nanoamp was built without "
                     "MPI (install libopenmpi-dev and rebuild with -Ddist=enabled)", fn, rank,
                     world);
        free(d);
        return NULL;
    }
#endif
    if (world == 1) d->local_rank = 0;
#if NA_HAVE_NCCL
    if (na_nccl_select_device(d->local_rank) != NA_OK) {
        na_dist_free(d);
        return NULL;
    }
#endif
    return d;
}

void na_dist_free(na_dist *d) {
    if (!d) return;
#if NA_HAVE_NCCL
    na_nccl_free(d);
#endif
#if NA_HAVE_MPI
    /* after a timeout both would wait for the rank that did not answer: the process ends
     * without finalizing, and the launcher ends the job */
    if (d->comm != MPI_COMM_NULL && !d->failed) MPI_Comm_free(&d->comm);
    if (d->mpi_started && !d->failed) {
        for (int i = 0; have_half_ops && i < 4; i++) MPI_Op_free(&half_ops[i / 2][i % 2]);
        have_half_ops = false;
        MPI_Finalize();
    }
#endif
    free(d);
}

int na_dist_abort(na_dist *d, int code) {
    if (!d || d->world == 1) return code; /* no other rank waits: the caller ends as it likes */
    fflush(stdout); /* the launcher kills the process: what it printed must be out */
    fflush(stderr);
#if NA_HAVE_NCCL
    na_nccl_abort(d);
#endif
#if NA_HAVE_MPI
    MPI_Abort(d->comm, code);
#endif
    _Exit(code); /* MPI_Abort does not return; if it did, this rank still ends */
}

/* ---- timeouts ---------------------------------------------------------------------------- */

int na_dist_set_timeout(na_dist *d, double seconds) {
    if (!d) return na_set_error(NA_EINVAL, "na_dist_set_timeout: the communicator is NULL");
    if (!(seconds > 0) || !isfinite(seconds))
        return na_set_error(NA_EINVAL, "na_dist_set_timeout: expected seconds > 0, got %g",
                            seconds);
    d->timeout_s = seconds;
    return NA_OK;
}

double na_dist_timeout(const na_dist *d, bool nccl) {
    if (d && d->timeout_s > 0) return d->timeout_s;
    if (nccl) return d && d->nccl_timeout_s > 0 ? d->nccl_timeout_s : 600;
    return 1800;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

#if NA_HAVE_MPI
/* The roll call after a timeout: point-to-point words with this tag (collectives never match
 * them) from every rank that gave up on the collective to every other rank. */
#define ROLL_CALL_TAG 0x6e61
static const int roll_call_word = 1; /* a send's buffer must outlive it */
#endif

/* Whether another rank has given up on a collective (its roll call has arrived). */
static bool peer_gave_up(na_dist *d) {
    int flag = 0;
#if NA_HAVE_MPI
    if (d->world > 1) MPI_Iprobe(MPI_ANY_SOURCE, ROLL_CALL_TAG, d->comm, &flag, MPI_STATUS_IGNORE);
#else
    (void)d;
#endif
    return flag != 0;
}

/* Sends this rank's roll call to every other rank and collects theirs for a grace period
 * (min(timeout, 5 s)): a rank waiting in the same collective answers within ~10 ms, as it
 * probes for roll calls while it waits. Writes the ranks that did not answer ("1, 3") into
 * who; returns how many. */
static int roll_call(na_dist *d, double limit, char *who, size_t size) {
    int missing = 0;
    who[0] = 0;
#if NA_HAVE_MPI
    bool *answered = d->world > 1 ? calloc((size_t)d->world, sizeof *answered) : NULL;
    if (!answered) return 0;
    for (int r = 0; r < d->world; r++) {
        MPI_Request rq;
        if (r != d->rank && MPI_Isend(&roll_call_word, 1, MPI_INT, r, ROLL_CALL_TAG, d->comm,
                                      &rq) == MPI_SUCCESS)
            MPI_Request_free(&rq); /* a stopped rank never takes it: nobody waits for that */
    }
    answered[d->rank] = true;
    int left = d->world - 1;
    for (double end = now_s() + fmin(limit, 5.0); left && now_s() < end;) {
        int flag = 0, word;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, ROLL_CALL_TAG, d->comm, &flag, &st);
        if (!flag) {
            nap_s(1e-3);
            continue;
        }
        MPI_Recv(&word, 1, MPI_INT, st.MPI_SOURCE, ROLL_CALL_TAG, d->comm, MPI_STATUS_IGNORE);
        left -= !answered[st.MPI_SOURCE];
        answered[st.MPI_SOURCE] = true;
    }
    for (int r = 0; r < d->world; r++) {
        if (answered[r]) continue;
        size_t len = strlen(who);
        if (missing++ < 8) snprintf(who + len, size - len, "%s%d", len ? ", " : "", r);
        else if (missing == 9) snprintf(who + len, size - len, ", ...");
    }
    free(answered);
#else
    (void)d, (void)limit, (void)size;
#endif
    return missing;
}

void na_dist_waiter_start(const na_dist *d, na_dist_waiter *w, bool nccl) {
    w->t0 = now_s();
    w->limit = na_dist_timeout(d, nccl);
    w->next_probe = w->t0 + 0.01;
}

int na_dist_waiter_nap(na_dist *d, na_dist_waiter *w, const char *fn, const char *call,
                       const char *what) {
    double t = now_s(), waited = t - w->t0;
    bool peer = false;
    if (t >= w->next_probe) { /* every 10 ms: cheap, and a gave-up rank is known at once */
        peer = peer_gave_up(d);
        w->next_probe = t + 0.01;
    }
    if (waited <= w->limit && !peer) {
        /* spin for 1 ms (a collective usually ends sooner), then sleep waited/16, at most
         * 200 us: a long wait costs no core, and ends at most ~6% late */
        if (waited > 1e-3) nap_s(fmin(waited / 16, 200e-6));
        return NA_OK;
    }
    d->failed = true;
    char who[128];
    int missing = roll_call(d, w->limit, who, sizeof who);
    char op[160], why[80];
    if (call) snprintf(op, sizeof op, "%s of %s", call, what);
    else snprintf(op, sizeof op, "%s", what);
    if (peer)
        snprintf(why, sizeof why, "was abandoned by another rank after its timeout");
    else
        snprintf(why, sizeof why, "did not complete within %g s", w->limit);
    if (d->world == 1)
        return na_set_error(NA_EIO, "%s: rank 0 of 1: %s %s", fn, op, why);
    if (!missing)
        return na_set_error(NA_EIO, "%s: rank %d of %d: %s %s, yet every rank answered: they "
                            "wait in different collectives (called in a different order?)", fn,
                            d->rank, d->world, op, why);
    return na_set_error(NA_EIO, "%s: rank %d of %d: %s %s: rank%s %s did not answer (stopped, "
                        "hung, or slower than the timeout: NANOAMP_DIST_TIMEOUT_S, "
                        "na_dist_set_timeout); the communicator is unusable now", fn, d->rank,
                        d->world, op, why, missing > 1 ? "s" : "", who);
}

/* ---- checks shared by the collectives ---------------------------------------------------- */

/* d is there and no collective on it timed out. */
static int check_usable(const na_dist *d, const char *fn) {
    if (!d) return na_set_error(NA_EINVAL, "%s: the communicator is NULL", fn);
    if (d->failed)
        return na_set_error(NA_EIO, "%s: rank %d of %d: an earlier collective timed out: the "
                            "communicator is unusable", fn, d->rank, d->world);
    return NA_OK;
}

/* "[4, 3] f32 cpu 'fc.weight'" */
static const char *describe(const na_tensor *t, char *buf, size_t size) {
    char s[NA_DESCRIBE_MAX];
    snprintf(buf, size, "%s%s%s%s", na_tensor_describe(t, s, sizeof s), t->name ? " '" : "",
             t->name ? t->name : "", t->name ? "'" : "");
    return buf;
}

static int check_tensor(na_dist *d, const char *fn, const na_tensor *t, const char *what) {
    char s[2 * NA_DESCRIBE_MAX];
    int rc = check_usable(d, fn);
    if (rc) return rc;
    if (!na_check_tensor(fn, t, what)) return na_last_status();
    if (!na_is_contiguous(t))
        return na_set_error(NA_EINVAL, "%s: rank %d: %s %s is not contiguous", fn, d->rank, what,
                            describe(t, s, sizeof s));
    if (t->numel > INT_MAX)
        return na_set_error(NA_ENOTSUP, "%s: rank %d: %s %s has more than 2^31-1 elements", fn,
                            d->rank, what, describe(t, s, sizeof s));
    if (t->device == NA_DEVICE_CUDA && na_dist_collectives(d) && !NA_HAVE_NCCL)
        return na_set_error(NA_ENOTSUP, "%s: rank %d of %d%s: %s %s is a CUDA tensor, but "
                            "nanoamp was built without NCCL", fn, d->rank, d->world,
                            d->world == 1 ? " (NANOAMP_DIST_COLLECTIVES=1)" : "", what,
                            describe(t, s, sizeof s));
    return NA_OK;
}

static int check_op(na_dist *d, const char *fn, const na_tensor *t, na_dist_op op) {
    char s[2 * NA_DESCRIBE_MAX];
    if (op != NA_DIST_SUM && op != NA_DIST_AVG && op != NA_DIST_MAX)
        return na_set_error(NA_EINVAL, "%s: unknown reduce op %d", fn, (int)op);
    if (na_dtype_is_fp8(t->dtype))
        return na_set_error(NA_EDTYPE, "%s: rank %d: %s does not reduce dtype %s (%s): cast to "
                            "f32 or bf16 first", fn, d->rank, fn, na_dtype_name(t->dtype),
                            describe(t, s, sizeof s));
    if (op == NA_DIST_AVG && !na_dtype_is_float(t->dtype))
        return na_set_error(NA_EDTYPE, "%s: rank %d: AVG of the integer tensor %s (use SUM)", fn,
                            d->rank, describe(t, s, sizeof s));
    return NA_OK;
}

/* t *= 1 / world, in t's dtype (AVG after a SUM). */
static int divide_by_world(na_dist *d, na_tensor *t) {
    na_no_grad_begin();
    na_tensor *q = na_scale(t, 1.0 / d->world);
    int rc = q ? na_copy_(t, q) : na_last_status();
    na_no_grad_end();
    return rc;
}

static int64_t bytes_of(const na_tensor *t) {
    return t->numel * (int64_t)na_dtype_size(t->dtype);
}

/* ---- collectives ------------------------------------------------------------------------- */

int na_dist_all_reduce(na_dist *d, na_tensor *t, na_dist_op op) {
    const char *fn = "na_dist_all_reduce";
    int rc = check_tensor(d, fn, t, "tensor");
    if (!rc) rc = check_op(d, fn, t, op);
    if (rc || !na_dist_collectives(d)) return rc;
    d->bytes += bytes_of(t);
#if NA_HAVE_NCCL
    if (t->device == NA_DEVICE_CUDA) return na_nccl_all_reduce(d, t, op, fn);
#endif
    if (d->world == 1) return NA_OK; /* a host tensor: MPI is not started for a world of 1 */
#if NA_HAVE_MPI
    char s[2 * NA_DESCRIBE_MAX];
    MPI_Request rq;
    rc = na_dist_mpi_finish(d, MPI_Iallreduce(MPI_IN_PLACE, t->data, (int)t->numel,
                                              mpi_type(t->dtype), mpi_op(t->dtype, op), d->comm,
                                              &rq),
                            &rq, fn, "MPI_Iallreduce", describe(t, s, sizeof s));
    if (rc) return rc;
#endif
    return op == NA_DIST_AVG ? divide_by_world(d, t) : NA_OK;
}

int na_dist_broadcast(na_dist *d, na_tensor *t, int root) {
    const char *fn = "na_dist_broadcast";
    int rc = check_tensor(d, fn, t, "tensor");
    if (rc) return rc;
    if (root < 0 || root >= d->world)
        return na_set_error(NA_EINVAL, "%s: root %d is not a rank of a world of %d", fn, root,
                            d->world);
    if (!na_dist_collectives(d)) return NA_OK;
    d->bytes += bytes_of(t);
#if NA_HAVE_NCCL
    if (t->device == NA_DEVICE_CUDA) return na_nccl_broadcast(d, t, root, fn);
#endif
    if (d->world == 1) return NA_OK; /* a host tensor */
#if NA_HAVE_MPI
    char s[2 * NA_DESCRIBE_MAX];
    MPI_Request rq;
    rc = na_dist_mpi_finish(d, MPI_Ibcast(t->data, (int)t->numel, mpi_type(t->dtype), root,
                                          d->comm, &rq),
                            &rq, fn, "MPI_Ibcast", describe(t, s, sizeof s));
    if (rc) return rc;
#endif
    return NA_OK;
}

int na_dist_all_gather(na_dist *d, const na_tensor *in, na_tensor *out) {
    const char *fn = "na_dist_all_gather";
    char s1[2 * NA_DESCRIBE_MAX], s2[2 * NA_DESCRIBE_MAX];
    int rc = check_tensor(d, fn, in, "input");
    if (!rc) rc = check_tensor(d, fn, out, "output");
    if (rc) return rc;
    bool fits = out->ndim == in->ndim + 1 && out->shape[0] == d->world &&
                out->dtype == in->dtype && out->device == in->device;
    for (int i = 0; fits && i < in->ndim; i++) fits = out->shape[i + 1] == in->shape[i];
    if (!fits)
        return na_set_error(NA_ESHAPE, "%s: rank %d: output %s must be [%d, *input.shape] of the "
                            "input's dtype and device; input %s", fn, d->rank,
                            describe(out, s1, sizeof s1), d->world, describe(in, s2, sizeof s2));
    if (!na_dist_collectives(d)) return na_be(out)->copy(&out->view, &in->view);
    d->bytes += bytes_of(in);
#if NA_HAVE_NCCL
    if (in->device == NA_DEVICE_CUDA) return na_nccl_all_gather(d, in, out, fn);
#endif
    if (d->world == 1) return na_be(out)->copy(&out->view, &in->view); /* a host tensor */
#if NA_HAVE_MPI
    MPI_Datatype ty = mpi_type(in->dtype);
    MPI_Request rq;
    rc = na_dist_mpi_finish(d, MPI_Iallgather(in->data, (int)in->numel, ty, out->data,
                                              (int)in->numel, ty, d->comm, &rq),
                            &rq, fn, "MPI_Iallgather", describe(in, s1, sizeof s1));
    if (rc) return rc;
#endif
    return NA_OK;
}

int na_dist_barrier(na_dist *d) {
    int rc = check_usable(d, "na_dist_barrier");
#if NA_HAVE_MPI
    MPI_Request rq;
    if (!rc && d->world > 1)
        rc = na_dist_mpi_finish(d, MPI_Ibarrier(d->comm, &rq), &rq, "na_dist_barrier",
                                "MPI_Ibarrier", "the barrier");
#endif
    return rc;
}

/* Host arrays: MPI_IN_PLACE over v[0..n) of the given MPI type. */
static int host_reduce(na_dist *d, const char *fn, void *v, int n, na_dist_op op, bool is_f64) {
    int rc = check_usable(d, fn);
    if (rc) return rc;
    if (n < 0 || (n > 0 && !v))
        return na_set_error(NA_EINVAL, "%s: need n >= 0 values, got n = %d%s", fn, n,
                            v ? "" : " and NULL");
    if (op != NA_DIST_SUM && op != NA_DIST_MAX && (op != NA_DIST_AVG || !is_f64))
        return na_set_error(NA_EINVAL, "%s: op %d is not SUM or MAX%s", fn, (int)op,
                            is_f64 ? " or AVG" : "");
    if (d->world == 1 || n == 0) return NA_OK;
    d->bytes += 8 * (int64_t)n;
#if NA_HAVE_MPI
    MPI_Request rq;
    rc = na_dist_mpi_finish(d, MPI_Iallreduce(MPI_IN_PLACE, v, n,
                                                  is_f64 ? MPI_DOUBLE : MPI_INT64_T,
                                                  op == NA_DIST_MAX ? MPI_MAX : MPI_SUM, d->comm,
                                                  &rq),
                                &rq, fn, "MPI_Iallreduce", "host values");
    if (rc) return rc;
#endif
    if (op == NA_DIST_AVG)
        for (int i = 0; i < n; i++) ((double *)v)[i] /= d->world;
    return NA_OK;
}

int na_dist_all_reduce_i64(na_dist *d, int64_t *v, int n, na_dist_op op) {
    return host_reduce(d, "na_dist_all_reduce_i64", v, n, op, false);
}
int na_dist_all_reduce_f64(na_dist *d, double *v, int n, na_dist_op op) {
    return host_reduce(d, "na_dist_all_reduce_f64", v, n, op, true);
}

int na_dist_check_same(na_dist *d, uint64_t hash, const char *what) {
    const char *fn = "na_dist_check_same";
    int rc = check_usable(d, fn);
    if (rc) return rc;
    if (!what) what = "configuration";
    if (d->world == 1) return NA_OK;
    uint64_t *all = calloc((size_t)d->world, sizeof *all);
    if (!all) return na_set_error(NA_ENOMEM, "%s: out of memory", fn);
#if NA_HAVE_MPI
    MPI_Request rq;
    rc = na_dist_mpi_finish(d, MPI_Iallgather(&hash, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T,
                                              d->comm, &rq),
                            &rq, fn, "MPI_Iallgather", what);
#endif
    for (int r = 1; r < d->world && !rc; r++)
        if (all[r] != all[0])
            rc = na_set_error(NA_EINVAL, "%s: rank %d's %s differs from rank 0's (hash %016" PRIx64
                              " vs %016" PRIx64 "): start every rank with the same flags and "
                              "model", fn, r, what, all[r], all[0]);
    free(all);
    return rc;
}

uint64_t na_dist_hash(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t na_dist_hash_state(uint64_t h, const na_named_tensors *st) {
    for (int64_t k = 0; k < st->n; k++) {
        const na_tensor *t = st->items[k].tensor;
        h = na_dist_hash(h, st->items[k].name, strlen(st->items[k].name) + 1);
        h = na_dist_hash(h, &t->dtype, sizeof t->dtype);
        h = na_dist_hash(h, t->shape, (size_t)t->ndim * sizeof *t->shape);
    }
    return h;
}

/* ---- asynchronous sums (the DDP buckets) ------------------------------------------------- */

int na_dist_start_sum(na_dist *d, na_tensor *t, na_dist_req *r, const char *fn,
                      const char *what) {
    r->active = false;
    r->event = NULL;
    int rc = check_tensor(d, fn, t, what);
    if (rc || !na_dist_collectives(d)) return rc;
    d->bytes += bytes_of(t);
#if NA_HAVE_NCCL
    if (t->device == NA_DEVICE_CUDA) return na_nccl_start_sum(d, t, r, fn);
#endif
    if (d->world == 1) return NA_OK; /* a host tensor: MPI is not started for a world of 1 */
#if NA_HAVE_MPI
    rc = MPI_Iallreduce(MPI_IN_PLACE, t->data, (int)t->numel, mpi_type(t->dtype),
                        mpi_op(t->dtype, NA_DIST_SUM), d->comm, &r->req);
    if (rc != MPI_SUCCESS) return mpi_error(d, fn, "MPI_Iallreduce", rc, what);
    r->active = true;
#endif
    return NA_OK;
}

int na_dist_wait(na_dist *d, na_dist_req *r, const char *fn, const char *what) {
    if (!r->active) return NA_OK;
    r->active = false;
#if NA_HAVE_NCCL
    if (r->event) return na_nccl_wait(d, r, fn, what);
#endif
#if NA_HAVE_MPI
    return na_dist_mpi_finish(d, MPI_SUCCESS, &r->req, fn, "MPI_Iallreduce", what);
#else
    return NA_OK;
#endif
}

void na_dist_poke(na_dist *d, na_dist_req *r) {
    (void)d;
#if NA_HAVE_MPI
    int done = 0; /* a finished request becomes MPI_REQUEST_NULL: waiting on it is free */
    if (r->active && !r->event) MPI_Test(&r->req, &done, MPI_STATUS_IGNORE);
#else
    (void)r;
#endif
}

/* ---- mixed precision --------------------------------------------------------------------- */

int na_dist_sync_found_inf(na_dist *d, na_grad_scaler *gs, na_optim *opt) {
    const char *fn = "na_dist_sync_found_inf";
    if (!d || !gs || !opt) return na_set_error(NA_EINVAL, "%s: NULL argument", fn);
    if (!na_grad_scaler_is_enabled(gs)) return NA_OK;
    /* the scaler hands its flag out read-only; this is the one writer besides the unscale,
     * and it only widens the flag to the ranks' maximum */
    na_tensor *found = (na_tensor *)na_grad_scaler_found_inf(gs, opt);
    if (!found)
        return na_set_error(NA_ESTATE, "%s: this optimizer was not unscaled by this scaler (call "
                            "na_grad_scaler_unscale_ first)", fn);
    return na_dist_all_reduce(d, found, NA_DIST_MAX);
}
