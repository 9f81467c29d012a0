/* kernels/cuda/backend.cu — the CUDA backend's context, memory and table, and nanoamp/cuda.h.
 *
 * One device (0; pick another with CUDA_VISIBLE_DEVICES), one non-blocking stream on which
 * every kernel, copy and library call is enqueued, a cuBLAS and a cuBLASLt handle (with a
 * 32 MiB workspace) and, when built with cuDNN, a cuDNN handle (made at the first
 * convolution), all bound to that stream.
 *
 * Initialisation is lazy and happens once: na_cuda_backend_init() returns the table, or NULL
 * with NA_EDEVICE when there is no driver or no device (cudaGetDeviceCount fails or finds
 * none); a failure is remembered, so later calls answer at once with the same message.
 *
 * Memory: alloc/free are cudaMalloc/cudaFree of the arena's big chunks and of persistent
 * tensors; a host-side table of live pointers keeps the bytes in use and the peak
 * (na_cuda_bytes_in_use / na_cuda_peak_bytes), which also count the internal workspaces
 * (the cuBLASLt workspace, the scratch of cuDNN workspaces and im2col). memcpy_d2h and synchronize wait for the stream and count one host
 * round trip each (na_cuda_sync_count).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda/conv_graph.h"

na_cuda_context na_cuda_ctx;

/* ---- live allocations (pointer -> bytes), open addressing ---------------------------- */
typedef struct {
    uintptr_t key; /* 0: empty, 1: deleted */
    size_t bytes;
} na_alloc_slot;
static na_alloc_slot *alloc_table;
static size_t alloc_cap, alloc_used; /* slots, slots not empty (live + deleted) */

static size_t alloc_hash(uintptr_t k, size_t cap) {
    uint64_t x = (uint64_t)k;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static bool alloc_table_put(uintptr_t key, size_t bytes) {
    if ((alloc_used + 1) * 2 > alloc_cap) {
        size_t ncap = alloc_cap ? alloc_cap * 2 : 256;
        na_alloc_slot *nt = (na_alloc_slot *)calloc(ncap, sizeof *nt);
        if (!nt) return false;
        size_t live = 0;
        for (size_t i = 0; i < alloc_cap; i++) {
            if (alloc_table[i].key > 1) {
                size_t h = alloc_hash(alloc_table[i].key, ncap);
                while (nt[h].key) h = (h + 1) & (ncap - 1);
                nt[h] = alloc_table[i];
                live++;
            }
        }
        free(alloc_table);
        alloc_table = nt;
        alloc_cap = ncap;
        alloc_used = live;
    }
    size_t h = alloc_hash(key, alloc_cap);
    while (alloc_table[h].key > 1) h = (h + 1) & (alloc_cap - 1);
    if (alloc_table[h].key == 0) alloc_used++;
    alloc_table[h].key = key;
    alloc_table[h].bytes = bytes;
    return true;
}

/* bytes of a live pointer (and forget it); false when unknown */
static bool alloc_table_take(uintptr_t key, size_t *bytes) {
    if (!alloc_cap) return false;
    size_t h = alloc_hash(key, alloc_cap);
    while (alloc_table[h].key) {
        if (alloc_table[h].key == key) {
            *bytes = alloc_table[h].bytes;
            alloc_table[h].key = 1;
            return true;
        }
        h = (h + 1) & (alloc_cap - 1);
    }
    return false;
}

/* ---- graph capture guards ---------------------------------------------------------------- */
int na_cuda_capture_forbids(const char *fn, const char *what, ...) {
    if (!na_cuda_ctx.capturing) return NA_OK;
    char msg[400];
    va_list ap;
    va_start(ap, what);
    vsnprintf(msg, sizeof msg, what, ap);
    va_end(ap);
    if (!na_cuda_ctx.capture_error[0])
        snprintf(na_cuda_ctx.capture_error, sizeof na_cuda_ctx.capture_error, "%s", msg);
    return na_set_error(NA_ENOTSUP, "%s: not allowed in a CUDA graph capture: %s", fn, msg);
}

/* ---- memory ----------------------------------------------------------------------------- */
static void count_in(size_t bytes) {
    na_cuda_ctx.bytes_in_use += bytes;
    if (na_cuda_ctx.bytes_in_use > na_cuda_ctx.peak_bytes)
        na_cuda_ctx.peak_bytes = na_cuda_ctx.bytes_in_use;
}

static void *cuda_alloc(size_t bytes) {
    if (na_cuda_capture_forbids("cuda alloc", "the step allocates %zu bytes of device memory (a "
                                "first step, a new shape or a growing step arena: capture after "
                                "warm-up steps of the same shapes)", bytes))
        return NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        na_set_error(e == cudaErrorMemoryAllocation ? NA_ENOMEM : NA_ECUDA,
                     "cuda alloc: cudaMalloc(%zu bytes) failed: %s (nanoamp holds %llu bytes; "
                     "device has %zu of %zu bytes free)",
                     bytes, cudaGetErrorString(e), (unsigned long long)na_cuda_ctx.bytes_in_use,
                     free_b, total_b);
        return NULL;
    }
    if (!alloc_table_put((uintptr_t)p, bytes)) {
        cudaFree(p);
        na_set_error(NA_ENOMEM, "cuda alloc: out of host memory for the allocation table");
        return NULL;
    }
    count_in(bytes);
    return p;
}

static void cuda_free(void *p) {
    if (!p) return;
    /* freeing waits for the stream: during a capture the buffer is kept (the capture fails) */
    if (na_cuda_capture_forbids("cuda free", "the step frees device memory (%p)", p)) return;
    size_t bytes = 0;
    if (alloc_table_take((uintptr_t)p, &bytes)) na_cuda_ctx.bytes_in_use -= bytes;
    /* kernels still queued may use the buffer: let them finish first */
    cudaError_t e = cudaStreamSynchronize(na_cuda_ctx.stream);
    if (e == cudaSuccess) e = cudaFree(p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        na_set_error(NA_ECUDA, "cuda free: cudaFree(%p) failed: %s", p, cudaGetErrorString(e));
    }
}

static int cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    if (!bytes) return NA_OK;
    NA_TRY(na_cuda_capture_forbids("cuda memcpy_h2d", "the step copies %zu bytes from the host "
                                   "(a replay would repeat the values of the capture: copy "
                                   "inputs into persistent tensors before each replay)", bytes));
    /* From pageable memory this returns once src has been staged, so the caller may reuse
     * src right away; from pinned memory the copy is asynchronous. */
    NA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, na_cuda_ctx.stream));
    return NA_OK;
}

static int cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    NA_TRY(na_cuda_capture_forbids("cuda memcpy_d2h", "the step waits for the device (a "
                                   "device->host copy of %zu bytes: a value read on the host, "
                                   "such as na_item or a check of the loss scale)", bytes));
    na_cuda_ctx.sync_count++;
    if (bytes)
        NA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, na_cuda_ctx.stream));
    NA_CUDA_CHECK(cudaStreamSynchronize(na_cuda_ctx.stream));
    return NA_OK;
}

static int cuda_memcpy_d2d(void *dst, const void *src, size_t bytes) {
    if (!bytes) return NA_OK;
    NA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, na_cuda_ctx.stream));
    return NA_OK;
}

static int cuda_synchronize(void) {
    NA_TRY(na_cuda_capture_forbids("cuda synchronize", "the step synchronizes the device (a "
                                   "host wait, such as DDP's wait for NCCL)"));
    na_cuda_ctx.sync_count++;
    NA_CUDA_CHECK(cudaStreamSynchronize(na_cuda_ctx.stream));
    return NA_OK;
}

/* The profiler's clock (nanoamp/profile.h): events on the one stream. */
static void *cuda_event_record(void) {
    if (na_cuda_capture_forbids("cuda event", "the profiler records events in the step (turn "
                                "off NANOAMP_PROFILE / na_profile_begin)"))
        return NULL;
    cudaEvent_t e = NULL;
    cudaError_t err = cudaEventCreate(&e);
    if (err == cudaSuccess) err = cudaEventRecord(e, na_cuda_ctx.stream);
    if (err == cudaSuccess) return (void *)e;
    (void)cudaGetLastError();
    if (e) cudaEventDestroy(e);
    na_set_error(NA_ECUDA, "cuda event: cudaEventRecord failed: %s", cudaGetErrorString(err));
    return NULL;
}

static int cuda_event_elapsed_ms(void *start, void *end, double *ms) {
    float f = 0;
    NA_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)end));
    NA_CUDA_CHECK(cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end));
    *ms = f;
    return NA_OK;
}

static void cuda_event_free(void *event) {
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

void *na_cuda_scratch(size_t bytes) {
    if (bytes <= na_cuda_ctx.scratch_size && na_cuda_ctx.scratch) return na_cuda_ctx.scratch;
    if (na_cuda_capture_forbids("na_cuda_scratch", "a kernel workspace grows to %zu bytes (a "
                                "first step or a new shape: capture after warm-up)", bytes))
        return NULL;
    size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
    want = (want + want / 4 + 255) & ~(size_t)255; /* some headroom for the next shape */
    if (na_cuda_ctx.scratch && na_cuda_ctx.graphs_live) {
        /* recorded graphs still use it: keep it until the last of them is freed */
        na_cuda_context::na_cuda_retired *r = (na_cuda_context::na_cuda_retired *)realloc(
            na_cuda_ctx.retired, (size_t)(na_cuda_ctx.n_retired + 1) * sizeof *r);
        if (!r) {
            na_set_error(NA_ENOMEM, "na_cuda_scratch: out of host memory");
            return NULL;
        }
        r[na_cuda_ctx.n_retired++] = {na_cuda_ctx.scratch, na_cuda_ctx.scratch_size};
        na_cuda_ctx.retired = r;
        na_cuda_ctx.scratch = NULL; /* still counted in bytes_in_use until freed */
        na_cuda_ctx.scratch_size = 0;
    }
    if (na_cuda_ctx.scratch) {
        cudaError_t e = cudaStreamSynchronize(na_cuda_ctx.stream);
        if (e == cudaSuccess) e = cudaFree(na_cuda_ctx.scratch);
        na_cuda_ctx.bytes_in_use -= na_cuda_ctx.scratch_size;
        na_cuda_ctx.scratch = NULL;
        na_cuda_ctx.scratch_size = 0;
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            na_set_error(NA_ECUDA, "na_cuda_scratch: cudaFree failed: %s", cudaGetErrorString(e));
            return NULL;
        }
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        na_set_error(e == cudaErrorMemoryAllocation ? NA_ENOMEM : NA_ECUDA,
                     "na_cuda_scratch: cudaMalloc(%zu bytes) for a kernel workspace failed: %s",
                     want, cudaGetErrorString(e));
        return NULL;
    }
    count_in(want);
    na_cuda_ctx.scratch = p;
    na_cuda_ctx.scratch_size = want;
    return p;
}

/* ---- step graphs (src/tensor/step_graph.c) -------------------------------------------------
 * Global capture mode: a CUDA call that is unsafe during a capture, from any thread, fails
 * and invalidates it rather than running. The backend's own guards (na_cuda_capture_forbids)
 * catch the usual causes first and name them. */
static int cuda_graph_begin(void) {
    na_cuda_ctx.capture_error[0] = 0;
    NA_CUDA_CHECK(cudaStreamBeginCapture(na_cuda_ctx.stream, cudaStreamCaptureModeGlobal));
    na_cuda_ctx.capturing = true;
    return NA_OK;
}

static int cuda_graph_end(bool ok, void **out) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(na_cuda_ctx.stream, &graph);
    na_cuda_ctx.capturing = false;
    *out = NULL;
    if (e != cudaSuccess) (void)cudaGetLastError();
    int rc = NA_OK;
    if (na_cuda_ctx.capture_error[0])
        rc = na_set_error(NA_ENOTSUP, "%s", na_cuda_ctx.capture_error);
    else if (e != cudaSuccess)
        rc = na_set_error(NA_ECUDA, "cudaStreamEndCapture failed: %s (%s): a call in the step "
                          "that a capture does not allow", cudaGetErrorString(e),
                          cudaGetErrorName(e));
    if (!rc && ok) {
        cudaGraphExec_t exec = NULL;
        e = cudaGraphInstantiate(&exec, graph, 0);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            rc = na_set_error(NA_ECUDA, "cudaGraphInstantiate failed: %s", cudaGetErrorString(e));
        } else {
            *out = (void *)exec;
            na_cuda_ctx.graphs_live++;
        }
    }
    if (graph) cudaGraphDestroy(graph);
    return rc;
}

static int cuda_graph_launch(void *graph) {
    NA_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, na_cuda_ctx.stream));
    return NA_OK;
}

static void cuda_graph_free(void *graph) {
    if (!graph) return;
    (void)cudaStreamSynchronize(na_cuda_ctx.stream); /* a replay may still run */
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
    if (--na_cuda_ctx.graphs_live > 0) return;
    na_cuda_conv_graph_unpin(); /* no graph replays a cached convolution plan any more */
    for (int i = 0; i < na_cuda_ctx.n_retired; i++) {
        (void)cudaFree(na_cuda_ctx.retired[i].p);
        na_cuda_ctx.bytes_in_use -= na_cuda_ctx.retired[i].bytes;
    }
    free(na_cuda_ctx.retired);
    na_cuda_ctx.retired = NULL;
    na_cuda_ctx.n_retired = 0;
}

/* ---- the table -------------------------------------------------------------------------- */
/* Filled at initialisation from the kernel list (kernels/backend.h). */
static na_backend na_cuda_backend_table;

static void fill_table(na_backend *b) {
    memset(b, 0, sizeof *b);
    b->name = "cuda";
    b->alloc = cuda_alloc;
    b->free = cuda_free;
    b->memcpy_h2d = cuda_memcpy_h2d;
    b->memcpy_d2h = cuda_memcpy_d2h;
    b->memcpy_d2d = cuda_memcpy_d2d;
    b->synchronize = cuda_synchronize;
    b->event_record = cuda_event_record;
    b->event_elapsed_ms = cuda_event_elapsed_ms;
    b->event_free = cuda_event_free;
    b->graph_begin = cuda_graph_begin;
    b->graph_end = cuda_graph_end;
    b->graph_launch = cuda_graph_launch;
    b->graph_free = cuda_graph_free;
#define NA_CUDA_ENTRY_(kernel, params) b->kernel = na_cuda_##kernel;
    NA_BACKEND_KERNELS(NA_CUDA_ENTRY_, NA_CUDA_ENTRY_)
#undef NA_CUDA_ENTRY_
}

/* ---- initialisation -------------------------------------------------------------------- */
/* Remembers why initialisation failed (reported by every later na_cuda_backend_init). */
__attribute__((format(printf, 2, 3))) static void init_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(na_cuda_ctx.init_error, sizeof na_cuda_ctx.init_error, fmt, ap);
    va_end(ap);
    na_cuda_ctx.init_status = status;
    na_cuda_ctx.state = -1;
}

#define INIT_CUDA(call)                                                                       \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            (void)cudaGetLastError();                                                         \
            init_fail(NA_ECUDA, "CUDA backend: %s failed: %s", #call, cudaGetErrorString(e_)); \
            return false;                                                                     \
        }                                                                                     \
    } while (0)
#define INIT_CUBLAS(call)                                                                     \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            init_fail(NA_ECUDA, "CUDA backend: %s failed: %s", #call,                         \
                      cublasGetStatusString(s_));                                             \
            return false;                                                                     \
        }                                                                                     \
    } while (0)

/* At exit: the host-side cuDNN descriptors of the convolution cache (device memory and
 * handles go with the process). */
static void cuda_teardown(void) { (void)na_cuda_conv_cache_release(); }

/* TF32 — what PyTorch does: cuDNN convolutions may use TF32 by default
 * (torch.backends.cudnn.allow_tf32 = True), f32 matmuls may not since PyTorch 1.12
 * (torch.backends.cuda.matmul.allow_tf32 = False); from PyTorch's "CUDA semantics" notes
 * (the references in /work/shared/docs/reference do not state these defaults). nanoamp keeps
 * one switch for both and strict f32 by default until a GPU run shows f32 parity within the
 * TF32 tolerance (tests/test_cuda_parity.c): on, cuBLASLt/cublasGemmEx compute in
 * CUBLAS_COMPUTE_32F_FAST_TF32 (gemm.cu), the cuBLAS handle in CUBLAS_TF32_TENSOR_OP_MATH and
 * cuDNN in CUDNN_TENSOR_OP_MATH for f32 (conv.cu); off, COMPUTE_32F, CUBLAS_DEFAULT_MATH and
 * CUDNN_FMA_MATH. */
int na_cuda_apply_tf32(bool enabled) {
    NA_CUBLAS_CHECK(cublasSetMathMode(na_cuda_ctx.blas, enabled ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                : CUBLAS_DEFAULT_MATH));
    na_cuda_ctx.tf32 = enabled;
    return NA_OK;
}

static bool cuda_init_once(void) {
    na_cuda_context *c = &na_cuda_ctx;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        init_fail(NA_EDEVICE, "no CUDA device: cudaGetDeviceCount failed: %s (%s)",
                  cudaGetErrorString(e), cudaGetErrorName(e));
        return false;
    }
    if (count < 1) {
        init_fail(NA_EDEVICE, "no CUDA device: cudaGetDeviceCount found none");
        return false;
    }
    /* the device chosen before the first CUDA call (na_dist_init: local rank), else 0 */
    INIT_CUDA(cudaGetDevice(&c->device));
    INIT_CUDA(cudaSetDevice(c->device));
    cudaDeviceProp prop;
    INIT_CUDA(cudaGetDeviceProperties(&prop, c->device));
    c->major = prop.major;
    c->minor = prop.minor;
    c->sm_count = prop.multiProcessorCount;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    INIT_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    INIT_CUBLAS(cublasCreate(&c->blas));
    INIT_CUBLAS(cublasSetStream(c->blas, c->stream));
    INIT_CUBLAS(cublasLtCreate(&c->lt));
    c->lt_workspace_size = (size_t)32 << 20; /* NVIDIA's advice for Hopper */
    INIT_CUDA(cudaMalloc(&c->lt_workspace, c->lt_workspace_size));
    count_in(c->lt_workspace_size);
    /* NANOAMP_TF32=1: TF32 tensor-core math for f32 GEMMs and convolutions (see
     * na_cuda_apply_tf32); unset or 0 keeps strict f32, today's default. */
    if (na_cuda_apply_tf32(na_cuda_env_is("NANOAMP_TF32", "1")) < 0) {
        init_fail(NA_ECUDA, "CUDA backend: %s", na_last_error());
        return false;
    }
    fill_table(&na_cuda_backend_table);
    atexit(cuda_teardown);
    c->state = 1;
    return true;
}

extern "C" const na_backend *na_cuda_backend_init(void) {
    if (na_cuda_ctx.state == 0) cuda_init_once();
    if (na_cuda_ctx.state == 1) return &na_cuda_backend_table;
    na_set_error(na_cuda_ctx.init_status, "%s", na_cuda_ctx.init_error);
    return NULL;
}

/* Initialise without disturbing the caller's last error (for the boolean queries). */
static bool cuda_ready_quiet(void) {
    if (na_cuda_ctx.state == 0) cuda_init_once();
    return na_cuda_ctx.state == 1;
}

static int cuda_need_device(const char *who) {
    if (cuda_ready_quiet()) return NA_OK;
    return na_set_error(NA_EDEVICE, "%s: %s", who, na_cuda_ctx.init_error);
}

#if NA_HAVE_CUDNN
/* The cuDNN handle, created on first use (loading cuDNN takes a while; programs without
 * convolutions never pay for it) and bound to the backend's stream. */
int na_cuda_dnn(cudnnHandle_t *out) {
    if (!na_cuda_ctx.dnn) {
        cudnnHandle_t h = NULL;
        NA_CUDNN_CHECK(cudnnCreate(&h));
        cudnnStatus_t s = cudnnSetStream(h, na_cuda_ctx.stream);
        if (s != CUDNN_STATUS_SUCCESS) {
            cudnnDestroy(h);
            return na_set_error(NA_ECUDA, "na_cuda_dnn: cudnnSetStream failed: %s",
                                cudnnGetErrorString(s));
        }
        na_cuda_ctx.dnn = h;
    }
    *out = na_cuda_ctx.dnn;
    return NA_OK;
}
#endif

/* ---- nanoamp/cuda.h ------------------------------------------------------------------- */
extern "C" {

bool na_cuda_built(void) { return true; }

bool na_cuda_available(void) { return cuda_ready_quiet(); }

int na_cuda_capability(int *major, int *minor) {
    NA_TRY(cuda_need_device("na_cuda_capability"));
    if (major) *major = na_cuda_ctx.major;
    if (minor) *minor = na_cuda_ctx.minor;
    return NA_OK;
}

bool na_cuda_bf16_supported(void) { return cuda_ready_quiet() && na_cuda_ctx.major >= 8; }

int na_cuda_set_tf32(bool enabled) {
    NA_TRY(cuda_need_device("na_cuda_set_tf32"));
    return na_cuda_apply_tf32(enabled);
}

int na_cuda_synchronize(void) {
    NA_TRY(cuda_need_device("na_cuda_synchronize"));
    return cuda_synchronize();
}

bool na_cuda_tf32(void) { return cuda_ready_quiet() && na_cuda_ctx.tf32; }

void *na_cuda_stream(void) { return cuda_ready_quiet() ? (void *)na_cuda_ctx.stream : NULL; }

uint64_t na_cuda_sync_count(void) { return na_cuda_ctx.sync_count; }
uint64_t na_cuda_bytes_in_use(void) { return na_cuda_ctx.bytes_in_use; }
uint64_t na_cuda_peak_bytes(void) { return na_cuda_ctx.peak_bytes; }

const char *na_cuda_device_name(void) { return cuda_ready_quiet() ? na_cuda_ctx.name : ""; }

} /* extern "C" */
