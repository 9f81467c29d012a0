/* Which precision to train in, from what the device can do. */
#include "nanoamp/amp.h"
#include "nanoamp/error.h"
#include "nanoamp/cuda.h"

const char *na_amp_mode_name(na_amp_mode mode) {
    static const char *names[] = {"f32", "bf16", "f16", "fp8"};
    return (unsigned)mode <= NA_AMP_MODE_FP8 ? names[mode] : "?";
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

na_amp_recommendation na_amp_recommend_model(na_device dev, int64_t params) {
    na_amp_recommendation r = na_amp_recommend(dev);
    int major = 0, minor = 0;
    bool fp8_cores = dev == NA_DEVICE_CUDA && na_cuda_available() &&
                     !na_cuda_capability(&major, &minor) && major * 10 + minor >= 89;
    if (!fp8_cores || params < NA_AMP_FP8_MIN_PARAMS) return r;
    r.mode = NA_AMP_MODE_FP8;
    r.dtype = NA_DTYPE_BF16;
    r.loss_scaling = false;
    r.reason = "cuda sm_89+ and a large model (>= 1e8 parameters): FP8 tensor cores for its "
               "Linear and Conv2d layers, with per-tensor delayed scaling; bf16 for the rest";
    return r;
}
