/* Global gradient-norm clipping: one fused norm kernel (which also makes the clip factor on
 * the device), then each gradient multiplied in place by that factor. No host round trip. */
#include <inttypes.h>
#include <math.h>

#include "nanoamp/autograd.h"
#include "nanoamp/ops.h" /* na_cast */
#include "nanoamp/optim.h"
#include "src/optim/optim_internal.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h"

/* g *= coef (f32 0-dim, broadcast), in place through the backend's binary kernel. */
static int scale_in_place(na_view *g, na_tensor *coef) {
    if (g->dtype != coef->dtype && !(coef = na_cast(coef, g->dtype))) return na_last_status();
    na_broadcast bc = {.ndim = g->ndim};
    for (int i = 0; i < g->ndim; i++) bc.shape[i] = g->shape[i], bc.a_stride[i] = g->stride[i];
    return na_backend_get(g->device)->binary(NA_BINARY_MUL, g, &coef->view, g, &bc);
}

na_tensor *na_clip_grad_norm(na_tensor_list list, double max_norm) {
    const char *fn = "na_clip_grad_norm";
    if (na_tensor_list_check(fn, list) || na_grad_settle()) return NULL;
    if (!(max_norm >= 0)) {
        na_set_error(NA_EINVAL, "%s: need max_norm >= 0 (got %g)", fn, max_norm);
        return NULL;
    }
    int64_t n = list.n;
    na_tensor *const *params = list.items;
    const na_view **grads = na_arena_host_alloc((size_t)(n ? n : 1) * sizeof *grads);
    if (!grads) return NULL;
    int count = 0;
    na_device dev = NA_DEVICE_CPU;
    int rc = NA_OK;
    for (int64_t i = 0; i < n && !rc; i++) {
        const na_tensor *g = params[i] ? params[i]->grad : NULL;
        if (!g) continue;
        if (count && g->device != dev)
            rc = na_set_error(NA_EDEVICE,
                              "%s: gradients on %s and %s: clip each device's "
                              "parameters separately",
                              fn, na_device_name(dev), na_device_name(g->device));
        else if (!na_is_contiguous(g) || !na_dtype_is_float(g->dtype))
            rc = na_set_error(NA_EINVAL,
                              "%s: gradient of parameter %" PRId64 " is not a contiguous "
                              "float tensor",
                              fn, i);
        dev = g->device;
        grads[count++] = &g->view;
    }
    const na_backend *be = rc ? NULL : na_backend_get(dev);
    if (be && (rc = NA_BACKEND_NEED(be, l2norm))) be = NULL;
    na_tensor *norm = be ? na_empty(NA_DTYPE_F32, dev, 0, NULL) : NULL;
    na_tensor *coef = norm ? na_empty(NA_DTYPE_F32, dev, 0, NULL) : NULL;
    if (coef) rc = be->l2norm(count, grads, &norm->view, &coef->view, max_norm);
    na_no_grad_begin();
    for (int i = 0; coef && !rc && i < count; i++) rc = scale_in_place((na_view *)grads[i], coef);
    na_no_grad_end();
    if (!coef || rc) {
        if (!rc) rc = na_last_status();
        na_set_error(rc, "%s: %s", fn, na_last_error());
        return NULL;
    }
    return norm;
}

na_tensor *na_optim_clip_grad_norm(na_optim *o, double max_norm) {
    return na_clip_grad_norm(na_optim_parameters(o), max_norm);
}
