/* FP8 amax across ranks: every recorded amax becomes its max over ranks before the scales are
 * updated, so every rank casts with the same scales (nanoamp/dist.h). */
#include <math.h>
#include <stdlib.h>

#include "nanoamp/dist.h"
#include "nanoamp/fp8.h"

int na_dist_fp8_reduce_amax(na_dist *d, na_fp8_scaling *const *states, int n) {
    const char *fn = "na_dist_fp8_reduce_amax";
    if (n < 0 || (n > 0 && !states))
        return na_set_error(NA_EINVAL, "%s: %d states at %p", fn, n, (const void *)states);
    for (int i = 0; i < n; i++)
        if (!states[i]) return na_set_error(NA_EINVAL, "%s: state %d is NULL", fn, i);
    if (n == 0) return NA_OK;
    /* per amax two values: the amax (NaN as 0) and a NaN flag, so that max over ranks is
     * well defined and a NaN anywhere is a NaN everywhere */
    const int per = 2 * NA_FP8_ROLE_COUNT;
    double *v = malloc((size_t)n * per * sizeof *v);
    if (!v) return na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < NA_FP8_ROLE_COUNT; r++) {
            float a = na_fp8_scaling_amax(states[i], (na_fp8_role)r);
            v[i * per + 2 * r] = isnan(a) ? 0.0 : (double)a;
            v[i * per + 2 * r + 1] = isnan(a) ? 1.0 : 0.0;
        }
    int rc = na_dist_all_reduce_f64(d, v, n * per, NA_DIST_MAX);
    /* the max over ranks is >= this rank's amax, so recording it (delayed: max with row 0;
     * current: the amax and its scale) makes row 0 the reduced value */
    for (int i = 0; i < n && !rc; i++)
        for (int r = 0; r < NA_FP8_ROLE_COUNT && !rc; r++) {
            const double *e = &v[i * per + 2 * r];
            float amax = e[1] != 0 ? NAN : (float)e[0];
            rc = na_fp8_scaling_record_amax(states[i], (na_fp8_role)r, amax);
        }
    free(v);
    if (rc) return na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
    return NA_OK;
}
