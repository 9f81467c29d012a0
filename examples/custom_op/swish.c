/* examples/custom_op/swish.c — swish as a custom function: the forward and backward nanoamp
 * calls, each one pass over raw memory (a CPU loop, or swish.cu's kernel on CUDA). */
#include "swish.h"

swish_seen swish_dtypes;

/* out = swish(x) when gy is NULL, else out = gy * swish'(x): x, gy and out are contiguous,
 * of one shape, dtype and device (out made by the caller). */
static int swish_run(const na_tensor *x, const na_tensor *gy, na_tensor *out) {
    int64_t n = x->numel;
    if (x->device == NA_DEVICE_CUDA) {
        if (x->dtype != NA_DTYPE_F32)
            return na_set_error(NA_EDTYPE, "swish: the CUDA kernel computes in f32, got %s",
                                na_dtype_name(x->dtype));
#ifdef CUSTOM_OP_CUDA
        /* nanoamp's stream: the kernel runs after the ops that made x and gy, before the
         * ops that read out, with no synchronisation */
        void *stream = na_cuda_stream();
        const char *err = gy ? swish_cuda_backward(x->data, gy->data, out->data, n, stream)
                             : swish_cuda_forward(x->data, out->data, n, stream);
        return err ? na_set_error(NA_ECUDA, "swish: kernel launch failed: %s", err) : NA_OK;
#else
        return na_set_error(NA_EDEVICE, "swish: built without its CUDA kernel");
#endif
    }
    if (x->dtype == NA_DTYPE_F32) {
        const float *xd = x->data, *g = gy ? gy->data : NULL;
        float *o = out->data;
        for (int64_t i = 0; i < n; i++) o[i] = g ? swish_grad_f32(xd[i], g[i]) : swish_f32(xd[i]);
    } else if (x->dtype == NA_DTYPE_F64) {
        const double *xd = x->data, *g = gy ? gy->data : NULL;
        double *o = out->data;
        for (int64_t i = 0; i < n; i++) o[i] = g ? swish_grad_f64(xd[i], g[i]) : swish_f64(xd[i]);
    } else { /* f16 here would be read as if it were f32: garbage, so refuse it */
        return na_set_error(NA_EDTYPE, "swish: the CPU loop computes in f32 or f64, got %s",
                            na_dtype_name(x->dtype));
    }
    return NA_OK;
}

static int swish_forward(na_function_ctx *ctx, na_tensor *const *in, na_tensor **out) {
    na_tensor *x = na_contiguous(in[0]); /* raw loops read memory in order */
    if (!x) return na_last_status();
    swish_dtypes.forward |= 1u << x->dtype;
    if (!(out[0] = na_empty_like(x))) return na_last_status();
    int rc = swish_run(x, NULL, out[0]);
    return rc ? rc : na_function_save(ctx, x); /* backward needs x, not y */
}

static int swish_backward(na_function_ctx *ctx, na_tensor *const *gout, na_tensor **gin) {
    na_tensor *x = na_function_saved(ctx, 0), *gy = na_contiguous(gout[0]);
    if (!x || !gy) return na_last_status();
    swish_dtypes.backward |= 1u << gy->dtype;
    if (!(gin[0] = na_empty_like(x))) return na_last_status();
    int rc = swish_run(x, gy, gin[0]);
    return rc ? rc : 1; /* one gradient: swish has one input */
}

const na_function swish_fn = {
    .name = "swish",
    .n_inputs = 1,
    .n_outputs = 1,
    .forward = swish_forward,
    .backward = swish_backward,
    .cast_inputs = true, /* under autocast: run in f32, as custom_fwd(cast_inputs=float32) */
    .forward_dtype = NA_DTYPE_F32,
};

na_tensor *swish(na_tensor *x) { return na_function_apply1(&swish_fn, &x, NULL); }
