/* examples/custom_op/swish.h — swish (SiLU), y = x * sigmoid(x), as a nanoamp custom function
 * with a hand-written backward, dy/dx = s * (1 + x * (1 - s)) where s = sigmoid(x).
 *
 * One pass over the data each way, where composing ops (sigmoid, mul, and their backwards)
 * would make four tensors. The forward is written for f32 (and f64, for na_gradcheck): it
 * declares .cast_inputs with f32, so inside an f16 autocast region its input is cast to f32
 * before it runs. On the CPU it is a loop; on CUDA (when the backend is built) a tiny kernel
 * in swish.cu, launched on nanoamp's stream.
 *
 *     na_tensor *h = swish(na_linear(x, w, b));
 */
#ifndef EXAMPLES_CUSTOM_OP_SWISH_H
#define EXAMPLES_CUSTOM_OP_SWISH_H

#include <math.h>
#include <stdint.h>

#ifndef __CUDACC__
#include "nanoamp.h"

extern const na_function swish_fn;
/* swish_fn applied to x: the output, or NULL with nanoamp's error set. */
na_tensor *swish(na_tensor *x);

/* The dtypes swish's forward saw and its backward received, as bits (1 << dtype). */
typedef struct {
    unsigned forward, backward;
} swish_seen;
extern swish_seen swish_dtypes;
#endif

/* The math of one element, shared by the CPU loop and the CUDA kernel. */
#ifdef __CUDACC__
#define SWISH_HD __host__ __device__
#else
#define SWISH_HD
#endif
#define SWISH_MATH(T, SUFFIX, EXP)                                                         \
    static inline SWISH_HD T swish_##SUFFIX(T x) { return x / ((T)1 + EXP(-x)); }           \
    static inline SWISH_HD T swish_grad_##SUFFIX(T x, T gy) {                               \
        T s = (T)1 / ((T)1 + EXP(-x));                                                      \
        return gy * s * ((T)1 + x * ((T)1 - s));                                            \
    }
SWISH_MATH(float, f32, expf)
SWISH_MATH(double, f64, exp)

#ifdef __cplusplus
extern "C" {
#endif
/* swish.cu: y = swish(x), and gx = gy * swish'(x), over n f32 elements of device memory,
 * enqueued on `stream` (na_cuda_stream()). NULL on success, else CUDA's error string. */
const char *swish_cuda_forward(const float *x, float *y, int64_t n, void *stream);
const char *swish_cuda_backward(const float *x, const float *gy, float *gx, int64_t n,
                                void *stream);
#ifdef __cplusplus
}
#endif
#endif
