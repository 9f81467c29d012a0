/* kernels/cuda/cuda_common.cuh — what every CUDA kernel file of the backend shares.
 *
 *  - the backend's context (one device, one stream, cuBLAS/cuBLASLt/cuDNN handles, counters);
 *  - status checks: every CUDA/cuBLAS/cuDNN call goes through NA_CUDA_CHECK / NA_CUBLAS_CHECK /
 *    NA_CUDNN_CHECK, which turn a failure into na_set_error(NA_ECUDA, "<fn>: <call> failed:
 *    <status string>") and return the status; kernel launches are followed by
 *    NA_CUDA_LAUNCH_CHECK("kernel name");
 *  - dtype traits (storage type S, compute type C, load/store with the RNE conversions of
 *    common/half.h, bit-identical to the CPU backend) and runtime-dtype loads/stores for the
 *    secondary tensors of an op;
 *  - block-wide reductions (fixed order: results do not depend on timing);
 *  - strided-offset helpers and grid sizing.
 *
 * Everything here is internal to kernels/cuda; the public face is nanoamp/cuda.h and the
 * na_backend table returned by na_cuda_backend_init().
 */
#ifndef NANOAMP_KERNELS_CUDA_COMMON_CUH
#define NANOAMP_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "na_config.h"
#include "backend.h"
#include "common/dense_order.h"
#include "common/float8.h"
#include "common/half.h"
#include "nanoamp/cuda.h"
#include "nanoamp/error.h"

#if NA_HAVE_CUDNN
#include <cudnn.h>
#endif

/* ---- context ----------------------------------------------------------------------- */
struct na_cuda_context {
    int state; /* 0: not initialised, 1: ready, -1: failed (init_error says why) */
    char init_error[512];
    int init_status; /* NA_EDEVICE (no driver / no device) or NA_ECUDA */
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_workspace;
    size_t lt_workspace_size;
#if NA_HAVE_CUDNN
    cudnnHandle_t dnn;
#endif
    int major, minor, sm_count;
    char name[256];
    bool tf32;
    uint64_t sync_count;
    uint64_t bytes_in_use, peak_bytes;
    void *scratch; /* grown on demand, see na_cuda_scratch */
    size_t scratch_size;
    /* step graphs (backend.cu): recording the stream now; why the recording cannot be used
     * (the first forbidden call, "" when none); graphs alive; scratch buffers outgrown while
     * graphs were alive (their recorded kernels still use them), freed with the last graph */
    bool capturing;
    char capture_error[512];
    int graphs_live;
    struct na_cuda_retired { void *p; size_t bytes; } *retired;
    int n_retired;
};
extern na_cuda_context na_cuda_ctx;

/* Called where a graph capture cannot follow (a sync, an allocation, a host copy): when
 * capturing, keeps the first reason for graph_end and returns NA_ENOTSUP with it set as the
 * error; otherwise NA_OK. `what` says what the step did. */
int na_cuda_capture_forbids(const char *fn, const char *what, ...)
    __attribute__((format(printf, 2, 3)));

/* A device buffer of at least `bytes` for the op being enqueued (shared by all ops: the
 * stream orders them). NULL with an error set on failure. Growing it synchronizes the stream
 * (only while shapes are new). */
void *na_cuda_scratch(size_t bytes);

#if NA_HAVE_CUDNN
/* The cuDNN handle (created on first use, bound to the stream). */
int na_cuda_dnn(cudnnHandle_t *out);
#endif

/* ---- status checks ------------------------------------------------------------------ */
#define NA_CUDA_CHECK(call)                                                                   \
    do {                                                                                      \
        cudaError_t na_e_ = (call);                                                           \
        if (na_e_ != cudaSuccess) {                                                           \
            (void)cudaGetLastError();                                                         \
            return na_set_error(NA_ECUDA, "%s: %s failed: %s (%s)", __func__, #call,          \
                                cudaGetErrorString(na_e_), cudaGetErrorName(na_e_));          \
        }                                                                                     \
    } while (0)

#define NA_CUDA_LAUNCH_CHECK(kname)                                                           \
    do {                                                                                      \
        cudaError_t na_e_ = cudaGetLastError();                                               \
        if (na_e_ != cudaSuccess)                                                             \
            return na_set_error(NA_ECUDA, "%s: launch of %s failed: %s (%s)", __func__,       \
                                kname, cudaGetErrorString(na_e_), cudaGetErrorName(na_e_));   \
    } while (0)

#define NA_CUBLAS_CHECK(call)                                                                 \
    do {                                                                                      \
        cublasStatus_t na_s_ = (call);                                                        \
        if (na_s_ != CUBLAS_STATUS_SUCCESS)                                                   \
            return na_set_error(NA_ECUDA, "%s: %s failed: %s", __func__, #call,               \
                                cublasGetStatusString(na_s_));                                \
    } while (0)

#if NA_HAVE_CUDNN
#define NA_CUDNN_CHECK(call)                                                                  \
    do {                                                                                      \
        cudnnStatus_t na_s_ = (call);                                                         \
        if (na_s_ != CUDNN_STATUS_SUCCESS)                                                    \
            return na_set_error(NA_ECUDA, "%s: %s failed: %s", __func__, #call,               \
                                cudnnGetErrorString(na_s_));                                  \
    } while (0)
#endif

/* Switches: getenv(name) equals `want` (NULL: set, non-empty and not "0"). Each caller keeps
 * the answer of its first call in a static, so a switch is read once per process. */
static inline bool na_cuda_env_is(const char *name, const char *want) {
    const char *v = getenv(name);
    if (!v || !v[0]) return false;
    return want ? strcmp(v, want) == 0 : strcmp(v, "0") != 0;
}

/* The switches the convolution paths share (conv.cu, conv_graph.cu), read once per file:
 * NANOAMP_CUDNN_FIND=1 chooses cuDNN's algorithms or plans by timing them,
 * NANOAMP_DETERMINISTIC=1 takes only deterministic ones. */
static inline bool na_cuda_cudnn_find(void) {
    static int on = -1;
    if (on < 0) on = na_cuda_env_is("NANOAMP_CUDNN_FIND", NULL);
    return on == 1;
}
static inline bool na_cuda_deterministic(void) {
    static int on = -1;
    if (on < 0) on = na_cuda_env_is("NANOAMP_DETERMINISTIC", NULL);
    return on == 1;
}

/* Propagate a negative status from a helper. */
#define NA_TRY(expr)                                                                          \
    do {                                                                                      \
        int na_rc_ = (expr);                                                                  \
        if (na_rc_ < 0) return na_rc_;                                                        \
    } while (0)

/* ---- launch geometry ---------------------------------------------------------------- */
#define NA_BLOCK 256

/* Blocks for a grid-stride loop over n items with `block` threads: enough to fill the device
 * a few times over, never more than needed, at least 1. */
static inline unsigned na_grid(int64_t n, int block) {
    int64_t want = (n + block - 1) / block;
    int64_t cap = (int64_t)(na_cuda_ctx.sm_count > 0 ? na_cuda_ctx.sm_count : 80) * 32;
    if (want > cap) want = cap;
    if (want < 1) want = 1;
    return (unsigned)want;
}

#define NA_GRID_STRIDE(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- integer conversions (as the CPU backend: saturating, NaN -> 0; u8 takes the low byte
 * of the truncated integer) ------------------------------------------------------------- */
static __host__ __device__ __forceinline__ int64_t na_d_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}
static __host__ __device__ __forceinline__ int32_t na_d_to_i32(double v) {
    int64_t i = na_d_to_i64(v);
    return i > INT32_MAX ? INT32_MAX : (i < INT32_MIN ? INT32_MIN : (int32_t)i);
}
static __host__ __device__ __forceinline__ uint8_t na_d_to_u8(double v) {
    return (uint8_t)(uint64_t)na_d_to_i64(v);
}

/* ---- dtype traits -------------------------------------------------------------------- */
/* S: storage type; C: compute type (float for f32/f16/bf16, double for f64 and the integer
 * types, which only fills and copies use); ld/st convert with round-to-nearest-even. */
template <int DT> struct na_dt;
template <> struct na_dt<NA_DTYPE_F32> {
    typedef float S;
    typedef float C;
    static __device__ __forceinline__ C ld(const S *p, int64_t i) { return p[i]; }
    static __device__ __forceinline__ void st(S *p, int64_t i, C v) { p[i] = v; }
    static __host__ __device__ __forceinline__ S from_double(double v) { return (float)v; }
    static __device__ __forceinline__ double to_double(S v) { return (double)v; }
};
template <> struct na_dt<NA_DTYPE_F64> {
    typedef double S;
    typedef double C;
    static __device__ __forceinline__ C ld(const S *p, int64_t i) { return p[i]; }
    static __device__ __forceinline__ void st(S *p, int64_t i, C v) { p[i] = v; }
    static __host__ __device__ __forceinline__ S from_double(double v) { return v; }
    static __device__ __forceinline__ double to_double(S v) { return v; }
};
template <> struct na_dt<NA_DTYPE_F16> {
    typedef uint16_t S;
    typedef float C;
    static __device__ __forceinline__ C ld(const S *p, int64_t i) { return na_f16_bits_to_f32(p[i]); }
    static __device__ __forceinline__ void st(S *p, int64_t i, C v) { p[i] = na_f32_to_f16_bits(v); }
    static __host__ __device__ __forceinline__ S from_double(double v) { return na_f32_to_f16_bits((float)v); }
    static __device__ __forceinline__ double to_double(S v) { return (double)na_f16_bits_to_f32(v); }
};
template <> struct na_dt<NA_DTYPE_BF16> {
    typedef uint16_t S;
    typedef float C;
    static __device__ __forceinline__ C ld(const S *p, int64_t i) { return na_bf16_bits_to_f32(p[i]); }
    static __device__ __forceinline__ void st(S *p, int64_t i, C v) { p[i] = na_f32_to_bf16_bits(v); }
    static __host__ __device__ __forceinline__ S from_double(double v) { return na_f32_to_bf16_bits((float)v); }
    static __device__ __forceinline__ double to_double(S v) { return (double)na_bf16_bits_to_f32(v); }
};
template <> struct na_dt<NA_DTYPE_I32> {
    typedef int32_t S;
    typedef double C;
    static __device__ __forceinline__ C ld(const S *p, int64_t i) { return (double)p[i]; }
    static __device__ __forceinline__ void st(S *p, int64_t i, C v) { p[i] = na_d_to_i32(v); }
    static __host__ __device__ __forceinline__ S from_double(double v) { return na_d_to_i32(v); }
    static __device__ __forceinline__ double to_double(S v) { return (double)v; }
};
template <> struct na_dt<NA_DTYPE_U8> {
    typedef uint8_t S;
    typedef double C;
    static __device__ __forceinline__ C ld(const S *p, int64_t i) { return (double)p[i]; }
    static __device__ __forceinline__ void st(S *p, int64_t i, C v) { p[i] = na_d_to_u8(v); }
    static __host__ __device__ __forceinline__ S from_double(double v) { return na_d_to_u8(v); }
    static __device__ __forceinline__ double to_double(S v) { return (double)v; }
};

/* ---- hardware conversions and vector loads (the newer kernels: BatchNorm v2, 2x2 pool) ----
 * na_hw<DT>: storage type S, compute type C, in/out with the conversion instructions.
 * Why the intrinsics equal common/half.h: __float2half_rn and __float2bfloat16_rn are PTX
 * cvt.rn.f16.f32 / cvt.rn.bf16.f32: IEEE round-to-nearest-even, overflow to inf, f16
 * subnormals produced exactly, f32 subnormal inputs kept (no .ftz: this build never uses
 * -use_fast_math) — the rules half.h implements with integer arithmetic. __half2float and
 * __bfloat162float widen exactly (every f16/bf16 value is an f32 value). They differ only on
 * NaN: a NaN stays a NaN either way, but the hardware returns its canonical NaN where half.h
 * keeps the sign (f32 -> f16) or the payload (widening) — sign and payload bits only. */
template <int DT> struct na_hw;
template <> struct na_hw<NA_DTYPE_F32> {
    typedef float S;
    typedef float C;
    static __device__ __forceinline__ C in(S v) { return v; }
    static __device__ __forceinline__ S out(C v) { return v; }
};
template <> struct na_hw<NA_DTYPE_F64> {
    typedef double S;
    typedef double C;
    static __device__ __forceinline__ C in(S v) { return v; }
    static __device__ __forceinline__ S out(C v) { return v; }
};
template <> struct na_hw<NA_DTYPE_F16> {
    typedef __half S;
    typedef float C;
    static __device__ __forceinline__ C in(S v) { return __half2float(v); }
    static __device__ __forceinline__ S out(C v) { return __float2half_rn(v); }
};
template <> struct na_hw<NA_DTYPE_BF16> {
    typedef __nv_bfloat16 S;
    typedef float C;
    static __device__ __forceinline__ C in(S v) { return __bfloat162float(v); }
    static __device__ __forceinline__ S out(C v) { return __float2bfloat16_rn(v); }
};

/* VW elements of storage type S as one load/store (16 bytes when VW*sizeof(S) == 16); the
 * address must be aligned to the pack's size */
template <typename S, int VW> struct alignas(sizeof(S) * VW) na_pack {
    S v[VW];
};

template <int DT, int VW>
static __device__ __forceinline__ void na_vld(const void *p, int64_t off,
                                               typename na_hw<DT>::C *v) {
    typedef typename na_hw<DT>::S S;
    na_pack<S, VW> pk = *reinterpret_cast<const na_pack<S, VW> *>((const S *)p + off);
#pragma unroll
    for (int i = 0; i < VW; i++) v[i] = na_hw<DT>::in(pk.v[i]);
}

template <int DT, int VW>
static __device__ __forceinline__ void na_vst(void *p, int64_t off,
                                                const typename na_hw<DT>::C *v) {
    typedef typename na_hw<DT>::S S;
    na_pack<S, VW> pk;
#pragma unroll
    for (int i = 0; i < VW; i++) pk.v[i] = na_hw<DT>::out(v[i]);
    *reinterpret_cast<na_pack<S, VW> *>((S *)p + off) = pk;
}

/* Tag passed to the generic lambdas of the dispatchers below. */
template <int DT> struct na_dt_tag {
    typedef na_dt<DT> T;
    static const int dtype = DT;
};

/* f(na_dt_tag<DT>{}) for a float dtype; NA_EDTYPE (naming `who`) otherwise. */
template <class F> static inline int na_dispatch_float(na_dtype dt, const char *who, F &&f) {
    switch (dt) {
    case NA_DTYPE_F32: return f(na_dt_tag<NA_DTYPE_F32>{});
    case NA_DTYPE_F64: return f(na_dt_tag<NA_DTYPE_F64>{});
    case NA_DTYPE_F16: return f(na_dt_tag<NA_DTYPE_F16>{});
    case NA_DTYPE_BF16: return f(na_dt_tag<NA_DTYPE_BF16>{});
    default:
        return na_set_error(NA_EDTYPE, "%s (cuda): unsupported dtype %s (expected a float dtype)",
                            who, na_dtype_name(dt));
    }
}

/* f(na_dt_tag<DT>{}) for any dtype. */
template <class F> static inline int na_dispatch_all(na_dtype dt, const char *who, F &&f) {
    switch (dt) {
    case NA_DTYPE_F32: return f(na_dt_tag<NA_DTYPE_F32>{});
    case NA_DTYPE_F64: return f(na_dt_tag<NA_DTYPE_F64>{});
    case NA_DTYPE_F16: return f(na_dt_tag<NA_DTYPE_F16>{});
    case NA_DTYPE_BF16: return f(na_dt_tag<NA_DTYPE_BF16>{});
    case NA_DTYPE_I32: return f(na_dt_tag<NA_DTYPE_I32>{});
    case NA_DTYPE_U8: return f(na_dt_tag<NA_DTYPE_U8>{});
    default: return na_set_error(NA_EDTYPE, "%s (cuda): invalid dtype %d", who, (int)dt);
    }
}

/* ---- runtime-dtype loads and stores (secondary tensors of an op) -------------------- */
static __device__ __forceinline__ double na_ld_d(const void *p, int dt, int64_t i) {
    switch (dt) {
    case NA_DTYPE_F32: return (double)((const float *)p)[i];
    case NA_DTYPE_F64: return ((const double *)p)[i];
    case NA_DTYPE_F16: return (double)na_f16_bits_to_f32(((const uint16_t *)p)[i]);
    case NA_DTYPE_BF16: return (double)na_bf16_bits_to_f32(((const uint16_t *)p)[i]);
    case NA_DTYPE_I32: return (double)((const int32_t *)p)[i];
    case NA_DTYPE_U8: return (double)((const uint8_t *)p)[i];
    case NA_DTYPE_F8E4M3: return (double)na_e4m3_bits_to_f32(((const uint8_t *)p)[i]);
    case NA_DTYPE_F8E5M2: return (double)na_e5m2_bits_to_f32(((const uint8_t *)p)[i]);
    default: return (double)NAN;
    }
}
static __device__ __forceinline__ float na_ld_f(const void *p, int dt, int64_t i) {
    switch (dt) {
    case NA_DTYPE_F32: return ((const float *)p)[i];
    case NA_DTYPE_F64: return (float)((const double *)p)[i];
    case NA_DTYPE_F16: return na_f16_bits_to_f32(((const uint16_t *)p)[i]);
    case NA_DTYPE_BF16: return na_bf16_bits_to_f32(((const uint16_t *)p)[i]);
    case NA_DTYPE_I32: return (float)((const int32_t *)p)[i];
    case NA_DTYPE_U8: return (float)((const uint8_t *)p)[i];
    case NA_DTYPE_F8E4M3: return na_e4m3_bits_to_f32(((const uint8_t *)p)[i]);
    case NA_DTYPE_F8E5M2: return na_e5m2_bits_to_f32(((const uint8_t *)p)[i]);
    default: return NAN;
    }
}
static __device__ __forceinline__ void na_st_d(void *p, int dt, int64_t i, double v) {
    switch (dt) {
    case NA_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case NA_DTYPE_F64: ((double *)p)[i] = v; break;
    case NA_DTYPE_F16: ((uint16_t *)p)[i] = na_f32_to_f16_bits((float)v); break;
    case NA_DTYPE_BF16: ((uint16_t *)p)[i] = na_f32_to_bf16_bits((float)v); break;
    case NA_DTYPE_I32: ((int32_t *)p)[i] = na_d_to_i32(v); break;
    case NA_DTYPE_U8: ((uint8_t *)p)[i] = na_d_to_u8(v); break;
    case NA_DTYPE_F8E4M3: ((uint8_t *)p)[i] = na_f32_to_e4m3_bits((float)v); break;
    case NA_DTYPE_F8E5M2: ((uint8_t *)p)[i] = na_f32_to_e5m2_bits((float)v); break;
    default: break;
    }
}
static __device__ __forceinline__ void na_st_f(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case NA_DTYPE_F32: ((float *)p)[i] = v; break;
    case NA_DTYPE_F64: ((double *)p)[i] = (double)v; break;
    case NA_DTYPE_F16: ((uint16_t *)p)[i] = na_f32_to_f16_bits(v); break;
    case NA_DTYPE_BF16: ((uint16_t *)p)[i] = na_f32_to_bf16_bits(v); break;
    case NA_DTYPE_I32: ((int32_t *)p)[i] = na_d_to_i32((double)v); break;
    case NA_DTYPE_U8: ((uint8_t *)p)[i] = na_d_to_u8((double)v); break;
    case NA_DTYPE_F8E4M3: ((uint8_t *)p)[i] = na_f32_to_e4m3_bits(v); break;
    case NA_DTYPE_F8E5M2: ((uint8_t *)p)[i] = na_f32_to_e5m2_bits(v); break;
    default: break;
    }
}
/* Loads/stores in compute type C (float or double). */
template <typename C> __device__ __forceinline__ C na_ld(const void *p, int dt, int64_t i);
template <> __device__ __forceinline__ float na_ld<float>(const void *p, int dt, int64_t i) {
    return na_ld_f(p, dt, i);
}
template <> __device__ __forceinline__ double na_ld<double>(const void *p, int dt, int64_t i) {
    return na_ld_d(p, dt, i);
}
static __device__ __forceinline__ void na_st(void *p, int dt, int64_t i, float v) { na_st_f(p, dt, i, v); }
static __device__ __forceinline__ void na_st(void *p, int dt, int64_t i, double v) { na_st_d(p, dt, i, v); }

/* Compute-type math overloads (float / double). */
static __device__ __forceinline__ float na_exp(float x) { return expf(x); }
static __device__ __forceinline__ double na_exp(double x) { return exp(x); }
static __device__ __forceinline__ float na_log(float x) { return logf(x); }
static __device__ __forceinline__ double na_log(double x) { return log(x); }
static __device__ __forceinline__ float na_sqrt(float x) { return sqrtf(x); }
static __device__ __forceinline__ double na_sqrt(double x) { return sqrt(x); }

/* ---- strided geometry ---------------------------------------------------------------- */
struct na_strided {
    int ndim;
    int64_t shape[NA_MAX_DIMS];
    int64_t stride[NA_MAX_DIMS];
};

/* Element offset of the flat C-order index i. */
static __device__ __forceinline__ int64_t na_strided_offset(const na_strided &g, int64_t i) {
    int64_t off = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
        int64_t s = g.shape[d];
        int64_t q = i / s;
        off += (i - q * s) * g.stride[d];
        i = q;
    }
    return off;
}

/* Element e of a walk over [N, C, H, W]: w fastest (C order) or, channels_last, c fastest
 * (channels-last memory order), so that threads e, e+1 touch neighbouring memory. */
struct na_nchw_index {
    int64_t n, c, h, w;
};
static __device__ __forceinline__ na_nchw_index na_nchw_at(int64_t e, int64_t c, int64_t h,
                                                          int64_t w, bool channels_last) {
    na_nchw_index a;
    if (channels_last) {
        a.c = e % c;
        e /= c;
        a.w = e % w;
        e /= w;
        a.h = e % h;
        a.n = e / h;
    } else {
        a.w = e % w;
        e /= w;
        a.h = e % h;
        e /= h;
        a.c = e % c;
        a.n = e / c;
    }
    return a;
}

/* Contiguous (C order) ignoring the strides of size-1 dims. */
static inline bool na_cuda_is_contiguous(const na_view *t) { return na_view_is_c_order(t); }

static inline na_strided na_strided_of(const na_view *t) {
    na_strided g;
    g.ndim = t->ndim;
    for (int d = 0; d < NA_MAX_DIMS; d++) {
        g.shape[d] = d < t->ndim ? t->shape[d] : 1;
        g.stride[d] = d < t->ndim ? t->stride[d] : 0;
    }
    return g;
}

/* ---- block reductions ---------------------------------------------------------------- */
/* Blocks are (TX, TY): each row y of the block cooperates on one item; blockDim.x is a
 * multiple of 32 (at most 1024). Every thread of the block must call these (they sync).
 * `smem` holds blockDim.x/32 * blockDim.y values of T. The result is returned to every
 * thread of the row, combined in a fixed order. */
struct na_op_sum {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct na_op_max {
    /* NaN wins, as in PyTorch */
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const {
        return (a != a || a > b) ? a : b;
    }
};

template <typename T, class Op>
__device__ __forceinline__ T na_row_reduce(T v, Op op, T *smem) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (blockDim.x == 32) return v;
    const int warps = blockDim.x >> 5;
    T *s = smem + threadIdx.y * warps;
    __syncthreads(); /* smem may still be read by a previous call */
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    v = s[0];
    for (int w = 1; w < warps; w++) v = op(v, s[w]);
    return v;
}

/* (value, index) pairs for max with the first index among equals; NaN wins (first NaN). */
template <typename T>
__device__ __forceinline__ bool na_better(T bv, int64_t bi, T av, int64_t ai) {
    bool bn = bv != bv, an = av != av;
    if (bn) return !an || bi < ai;
    if (an) return false;
    return bv > av || (bv == av && bi < ai);
}

template <typename T>
__device__ __forceinline__ void na_row_reduce_argmax(T &v, int64_t &idx, T *sv, int64_t *si) {
    for (int o = 16; o > 0; o >>= 1) {
        T ov = __shfl_xor_sync(0xffffffffu, v, o);
        int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (na_better(ov, oi, v, idx)) { v = ov; idx = oi; }
    }
    if (blockDim.x == 32) return;
    const int warps = blockDim.x >> 5;
    T *s = sv + threadIdx.y * warps;
    int64_t *t = si + threadIdx.y * warps;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { s[threadIdx.x >> 5] = v; t[threadIdx.x >> 5] = idx; }
    __syncthreads();
    v = s[0];
    idx = t[0];
    for (int w = 1; w < warps; w++)
        if (na_better(s[w], t[w], v, idx)) { v = s[w]; idx = t[w]; }
}

/* Threads along x for a row of `len` elements: 32 .. 1024, a multiple of 32. */
static inline int na_row_threads(int64_t len) {
    if (len <= 64) return 32;
    if (len <= 256) return 64;
    if (len <= 1024) return 128;
    if (len <= 4096) return 256;
    return 512;
}

/* ---- cross-file helpers ------------------------------------------------------------------ */
/* gemm with separate input/output dtypes (a, b: ab_type; c: c_type). Used by the backend's
 * gemm (same dtypes) and the im2col convolution fallback (f16/bf16 in, f32 out). */
int na_cuda_gemm_ex(const na_gemm_args *g, na_dtype c_type);
/* y[n, c, s] (+)= bias[c] then optional relu, for y viewed as [outer, channels, inner]. */
int na_cuda_add_bias(void *y, na_dtype ydt, const void *bias, na_dtype bdt, int64_t outer,
                     int64_t channels, int64_t inner, bool relu);
/* Destroys the cached cuDNN descriptors (conv.cu); NA_OK or the first failure. */
extern "C" int na_cuda_conv_cache_release(void);
/* TF32 for f32 GEMMs and convolutions: sets na_cuda_ctx.tf32 and cuBLAS's math mode. */
int na_cuda_apply_tf32(bool enabled);
/* dst (contiguous, dst_dt) = src (contiguous, src_dt), n elements */
int na_cuda_convert(void *dst, na_dtype dst_dt, const void *src, na_dtype src_dt, int64_t n);

/* na_cuda_<name> for every kernel of NA_BACKEND_KERNELS (kernels/backend.h), defined in the
 * kernel files */
#define NA_CUDA_DECLARE_(kernel, params) int na_cuda_##kernel params;
NA_BACKEND_KERNELS(NA_CUDA_DECLARE_, NA_CUDA_DECLARE_)
#undef NA_CUDA_DECLARE_

#endif
