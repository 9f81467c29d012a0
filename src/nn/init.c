/* Parameter initialization from the global generator (PyTorch's default schemes).
 *
 * The fill runs on the tensor's own device through the backend's counter-based generator,
 * which gives the same numbers on the CPU and CUDA for the same seed and call sequence. */
#include <math.h>

#include "src/tensor/tensor_internal.h"
#include "nanoamp/nn.h"

int na_init_uniform_(na_tensor *t, double lo, double hi) {
    const char *fn = "na_init_uniform_";
    if (!na_check_float(fn, t, "tensor")) return na_last_status();
    if (!na_is_contiguous(t)) return na_set_error(NA_EINVAL, "%s: tensor must be contiguous", fn);
    if (!(lo <= hi)) return na_set_error(NA_EINVAL, "%s: empty range [%g, %g)", fn, lo, hi);
    const na_backend *be = na_be(t);
    if (!be) return na_last_status();
    na_tensor_bump_version(t);
    return be->fill_uniform(&t->view, lo, hi, na_rng_seed(), na_rng_reserve((uint64_t)t->numel));
}

int64_t na_init_fan_in(const na_tensor *t) {
    if (!t || t->ndim < 2) return -1;
    int64_t fan = t->shape[1];
    for (int i = 2; i < t->ndim; i++) fan *= t->shape[i];
    return fan;
}

int na_init_kaiming_uniform_(na_tensor *t, double a) {
    int64_t fan = na_init_fan_in(t);
    if (fan < 0)
        return na_set_error(NA_ESHAPE, "na_init_kaiming_uniform_: fan_in needs at least 2 dims");
    if (t->numel == 0) return NA_OK; /* nothing to draw (PyTorch: a no-op) */
    double bound = sqrt(2.0 / (1.0 + a * a)) * sqrt(3.0 / (double)fan);
    return na_init_uniform_(t, -bound, bound);
}
