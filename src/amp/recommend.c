/* Which precision to train in, from what the device can do. */
#include "nanoamp/amp.h"
#include "nanoamp/error.h"
#include "nanoamp/cuda.h"

const char *na_amp_mode_name(na_amp_mode mode) {
    static const char *names[] = {"f32", "bf16", "f16"};
    return (unsigned)mode <= NA_AMP_MODE_F16 ? names[mode] : "?";
}

na_amp_recommendation na_amp_recommend(na_device dev) {
    na_amp_recommendation r = {.mode = NA_AMP_MODE_F32, .dtype = NA_DTYPE_F32};
    if (dev == NA_DEVICE_CPU) {
        r.mode = NA_AMP_MODE_BF16;
        r.dtype = NA_DTYPE_BF16;
        r.reason = "cpu: bf16, PyTorch's CPU autocast default (f32's range, no loss scaling); "
                   "nanoamp's CPU backend emulates bf16 bit-exactly in f32, so it checks "
                   "numerics but is slower than f32";
        return r;
    }
    int major = 0, minor = 0;
    if (dev != NA_DEVICE_CUDA || !na_cuda_available() || na_cuda_capability(&major, &minor)) {
        r.reason = "no usable device for mixed precision: f32";
        return r;
    }
    if (na_cuda_bf16_supported()) {
        r.mode = NA_AMP_MODE_BF16;
        r.dtype = NA_DTYPE_BF16;
        r.reason = "cuda sm_80+: bf16 tensor cores, f32's exponent range, no loss scaling needed";
    } else if (major >= 7) {
        r.mode = NA_AMP_MODE_F16;
        r.dtype = NA_DTYPE_F16;
        r.loss_scaling = true;
        r.reason = "cuda sm_70-sm_75: f16 tensor cores but no bf16; f16's narrow range needs "
                   "dynamic loss scaling";
    } else {
        r.reason = "cuda before sm_70: no tensor cores, mixed precision would not be faster: f32";
    }
    return r;
}
