/* kernels/cuda/cublas_lazy.c — cuBLAS and cuBLASLt loaded on first use, not at program start.
 *
 * Why: libcublasLt alone adds ~147 MiB to the resident set of every process that links it, as
 * soon as the loader maps and relocates it, even where no GPU exists. Most runs of a default
 * (CUDA-enabled) build are CPU runs, so the library does not link cuBLAS; it defines the few
 * cuBLAS entry points the backend calls (below) as forwarders that dlopen the real libraries
 * the first time one is called, which only happens once a CUDA device was found
 * (na_cuda_backend_init creates the handles). A CPU run of a CUDA build then stays small.
 *
 * Adding a cuBLAS call to the backend: add its line to NA_CUBLAS_CALLS (the link fails with an
 * undefined cublas* symbol until one does). Where the libraries cannot be loaded, every
 * forwarder returns CUBLAS_STATUS_NOT_INITIALIZED, and cublasGetStatusString of that status
 * gives the loader's reason, so NA_CUBLAS_CHECK's message says why. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* cublasLt.h: f() */
#include <cublasLt.h>
#include <cublas_v2.h>
#pragma GCC diagnostic pop

#include "na_config.h"

#define NA_STR_(x) #x
#define NA_STR(x) NA_STR_(x)

/* X(return type, name, library (0 cuBLAS, 1 cuBLASLt), (parameters), (arguments)) */
#define NA_CUBLAS_CALLS(X)                                                                        \
    X(cublasStatus_t, cublasCreate_v2, 0, (cublasHandle_t * h), (h))                              \
    X(cublasStatus_t, cublasSetStream_v2, 0, (cublasHandle_t h, cudaStream_t s), (h, s))          \
    X(cublasStatus_t, cublasSetMathMode, 0, (cublasHandle_t h, cublasMath_t m), (h, m))           \
    X(cublasStatus_t, cublasGemmStridedBatchedEx, 0,                                              \
      (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,          \
       const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,    \
       cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct,         \
       int ldc, long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo),      \
      (h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch,     \
       compute, algo))                                                                            \
    X(cublasStatus_t, cublasDgemmStridedBatched, 0,                                               \
      (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,          \
       const double *alpha, const double *A, int lda, long long sa, const double *B, int ldb,      \
       long long sb, const double *beta, double *C, int ldc, long long sc, int batch),             \
      (h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch))               \
    X(cublasStatus_t, cublasLtCreate, 1, (cublasLtHandle_t * h), (h))                              \
    X(cublasStatus_t, cublasLtMatmulDescCreate, 1,                                                \
      (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s), (d, c, s))             \
    X(cublasStatus_t, cublasLtMatmulDescDestroy, 1, (cublasLtMatmulDesc_t d), (d))                \
    X(cublasStatus_t, cublasLtMatmulDescSetAttribute, 1,                                          \
      (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n),      \
      (d, a, buf, n))                                                                             \
    X(cublasStatus_t, cublasLtMatrixLayoutCreate, 1,                                              \
      (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),     \
      (l, t, rows, cols, ld))                                                                     \
    X(cublasStatus_t, cublasLtMatrixLayoutDestroy, 1, (cublasLtMatrixLayout_t l), (l))            \
    X(cublasStatus_t, cublasLtMatrixLayoutSetAttribute, 1,                                        \
      (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *buf, size_t n),   \
      (l, a, buf, n))                                                                             \
    X(cublasStatus_t, cublasLtMatmulPreferenceCreate, 1, (cublasLtMatmulPreference_t * p), (p))    \
    X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, 1, (cublasLtMatmulPreference_t p), (p))     \
    X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute, 1,                                    \
      (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf,     \
       size_t n),                                                                                 \
      (p, a, buf, n))                                                                             \
    X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic, 1,                                          \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,                     \
       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,              \
       cublasLtMatmulPreference_t pref, int want, cublasLtMatmulHeuristicResult_t results[],       \
       int *got),                                                                                 \
      (h, op, a, b, c, d, pref, want, results, got))                                              \
    X(cublasStatus_t, cublasLtMatmul, 1,                                                          \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,             \
       cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta,     \
       const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd,              \
       const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s),              \
      (h, op, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, ws, ws_bytes, s))

static struct {
#define NA_CUBLAS_POINTER(ret, name, lib, params, args) ret(*name) params;
    NA_CUBLAS_CALLS(NA_CUBLAS_POINTER)
#undef NA_CUBLAS_POINTER
    const char *(*cublasGetStatusString)(cublasStatus_t);
} api;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;
static char load_error[512];

/* The soname first (the loader's search path and this library's RUNPATH), then the toolkit's
 * library folder this build was configured with. */
static void *open_library(const char *soname) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
#ifdef NA_CUDA_LIBDIR
    if (!h) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", NA_CUDA_LIBDIR, soname);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
#endif
    if (!h && !load_error[0]) snprintf(load_error, sizeof load_error, "%s", dlerror());
    return h;
}

static void load(void) {
    void *lib[2] = {open_library("libcublas.so." NA_STR(CUBLAS_VER_MAJOR)),
                    open_library("libcublasLt.so." NA_STR(CUBLAS_VER_MAJOR))};
    if (!lib[0] || !lib[1]) return;
#define NA_CUBLAS_RESOLVE(ret, name, which, params, args)                                       \
    if (!(*(void **)&api.name = dlsym(lib[which], #name))) {                                   \
        snprintf(load_error, sizeof load_error, "%s not found in the cuBLAS libraries", #name); \
        return;                                                                                 \
    }
    NA_CUBLAS_CALLS(NA_CUBLAS_RESOLVE)
#undef NA_CUBLAS_RESOLVE
    *(void **)&api.cublasGetStatusString = dlsym(lib[0], "cublasGetStatusString");
    loaded = 1;
}

static int ready(void) {
    pthread_once(&load_once, load);
    return loaded;
}

#define NA_CUBLAS_FORWARD(ret, name, lib, params, args)                                        \
    ret name params {                                                                          \
        return ready() ? api.name args : CUBLAS_STATUS_NOT_INITIALIZED;                        \
    }
NA_CUBLAS_CALLS(NA_CUBLAS_FORWARD)
#undef NA_CUBLAS_FORWARD

const char *cublasGetStatusString(cublasStatus_t status) {
    if (ready() && api.cublasGetStatusString) return api.cublasGetStatusString(status);
    return status == CUBLAS_STATUS_NOT_INITIALIZED && !loaded ? load_error : "cuBLAS error";
}
