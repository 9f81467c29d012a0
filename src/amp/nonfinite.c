/* The divergence watch (nanoamp/amp.h, na_amp_note_nonfinite): the first step whose loss was
 * not finite, kept on the device by a kernel of each backend (note_nonfinite). */
#include <inttypes.h>

#include "src/amp/amp_internal.h"

int na_amp_note_nonfinite(na_tensor *first, const na_tensor *x, int64_t step) {
    const char *fn = "na_amp_note_nonfinite";
    char a[NA_DESCRIBE_MAX], b[NA_DESCRIBE_MAX];
    if (!first || !x) return na_set_error(NA_EINVAL, "%s: NULL tensor", fn);
    if (first->dtype != NA_DTYPE_F64 || first->ndim != 0 || first->device != x->device ||
        !na_dtype_is_float(x->dtype) || !na_is_contiguous(x))
        return na_set_error(NA_EINVAL, "%s: needs an f64 0-dim first on x's device and a "
                            "contiguous float x, got first %s, x %s", fn,
                            na_tensor_describe(first, a, sizeof a),
                            na_tensor_describe(x, b, sizeof b));
    if (step < 1 || step > (INT64_C(1) << 53))
        return na_set_error(NA_EINVAL, "%s: step %" PRId64 " (expected 1..2^53: 0 means none)",
                            fn, step);
    const na_backend *be = na_backend_get(x->device);
    if (!be) return na_last_status();
    int rc = NA_BACKEND_NEED(be, note_nonfinite);
    if (!rc) rc = be->note_nonfinite(&x->view, &first->view, (double)step);
    return rc ? na_set_error(rc, "%s: %s", fn, na_last_error()) : NA_OK;
}
