/* Gradient checking by central finite differences in f64 (PyTorch gradcheck's defaults).
 *
 * With a random output weight v, the analytic side is the vector-Jacobian product J^T v from
 * na_backward(f(x), v); the numeric side, for each input element j, is
 * (v . f(x + eps e_j) - v . f(x - eps e_j)) / (2 eps). A random v makes a wrong Jacobian
 * entry show up with probability 1 while needing one backward pass per check. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/tensor/tensor_internal.h"
#include "nanoamp/autograd.h"

static double dot_with(const na_tensor *y, const double *v) {
    const na_tensor *c = y;
    if (!na_is_contiguous(y)) { /* a plain copy: autograd calls no op front-end */
        na_tensor *copy = na_empty(y->dtype, y->device, y->ndim, y->shape);
        if (!copy || na_copy_(copy, y) != NA_OK) return NAN;
        c = copy;
    }
    const double *p = c->data;
    double s = 0;
    for (int64_t i = 0; i < c->numel; i++) s += p[i] * v[i];
    return s;
}

static na_tensor *eval_no_grad(na_gradcheck_fn f, void *ctx, na_tensor **in) {
    na_no_grad_begin();
    na_tensor *y = f(in, ctx);
    na_no_grad_end();
    return y;
}

int na_gradcheck(na_gradcheck_fn f, void *ctx, na_tensor **inputs, int n_inputs,
                 const na_gradcheck_opts *opts) {
    const char *fn = "na_gradcheck";
    double eps = opts && opts->eps > 0 ? opts->eps : 1e-6;
    double atol = opts && opts->atol > 0 ? opts->atol : 1e-5;
    double rtol = opts && opts->rtol > 0 ? opts->rtol : 1e-3;
    for (int k = 0; k < n_inputs; k++) {
        if (!inputs[k] || inputs[k]->dtype != NA_DTYPE_F64 || inputs[k]->device != NA_DEVICE_CPU ||
            !na_is_contiguous(inputs[k]))
            return na_set_error(NA_EDTYPE, "%s: input %d must be a contiguous f64 CPU tensor", fn, k);
    }
    /* zero the leaves' gradients, run forward with grad, backward with a random v */
    for (int k = 0; k < n_inputs; k++) na_tensor_zero_grad(inputs[k]);
    na_tensor *y = f(inputs, ctx);
    if (!y) return na_set_error(na_last_status(), "%s: forward failed: %s", fn, na_last_error());
    if (y->dtype != NA_DTYPE_F64)
        return na_set_error(NA_EDTYPE, "%s: output is %s, expected f64", fn, na_dtype_name(y->dtype));
    if (!y->requires_grad)
        return na_set_error(NA_ESTATE, "%s: output does not require grad", fn);
    na_tensor *v = na_randn(NA_DTYPE_F64, NA_DEVICE_CPU, y->ndim, y->shape, 0.0, 1.0);
    if (!v || na_backward_retain(y, v) != NA_OK) return na_last_status();
    const double *vd = v->data;

    /* a second backward (grads zeroed first) must give exactly the first: deterministic.
     * (Comparing with twice the first instead fails falsely for a leaf that receives several
     * contributions: (g1 + g2) + g1 + g2 need not round to 2 (g1 + g2).) */
    double **first = calloc((size_t)n_inputs, sizeof *first);
    int rc = NA_OK;
    for (int k = 0; k < n_inputs && !rc; k++) {
        na_tensor *x = inputs[k];
        if (!x->requires_grad) continue;
        if (!x->grad) {
            rc = na_set_error(NA_ESTATE, "%s: input %d requires grad but received none", fn, k);
            break;
        }
        first[k] = malloc(sizeof(double) * (size_t)(x->numel ? x->numel : 1));
        memcpy(first[k], x->grad->data, sizeof(double) * (size_t)x->numel);
    }
    if (!rc) {
        for (int k = 0; k < n_inputs; k++) na_tensor_zero_grad(inputs[k]);
        rc = na_backward_retain(y, v);
    }
    for (int k = 0; k < n_inputs && !rc; k++) {
        if (!first[k]) continue;
        const double *g2 = inputs[k]->grad->data;
        for (int64_t j = 0; j < inputs[k]->numel && !rc; j++)
            if (!(g2[j] == first[k][j]))
                rc = na_set_error(NA_ESTATE, "%s: backward is not deterministic: input %d element "
                                  "%" PRId64 ": first pass %.17g, second pass %.17g",
                                  fn, k, j, first[k][j], g2[j]);
    }

    /* central differences against the first pass */
    for (int k = 0; k < n_inputs && !rc; k++) {
        na_tensor *x = inputs[k];
        if (!first[k]) continue;
        double *xd = x->data;
        for (int64_t j = 0; j < x->numel && !rc; j++) {
            /* read each output before the input changes again: f may return a view of x */
            double keep = xd[j], dp = 0, dm = 0;
            xd[j] = keep + eps;
            na_tensor *yp = eval_no_grad(f, ctx, inputs);
            if (yp) dp = dot_with(yp, vd);
            xd[j] = keep - eps;
            na_tensor *ym = yp ? eval_no_grad(f, ctx, inputs) : NULL;
            if (ym) dm = dot_with(ym, vd);
            xd[j] = keep;
            if (!yp || !ym) {
                rc = na_last_status();
                break;
            }
            double num = (dp - dm) / (2 * eps);
            double ana = first[k][j];
            if (!(fabs(ana - num) <= atol + rtol * fabs(num)))
                rc = na_set_error(NA_ESTATE, "%s: gradient mismatch at input %d element %" PRId64
                                  ": analytic %.10g, numeric %.10g (atol %g, rtol %g)", fn, k, j,
                                  ana, num, atol, rtol);
        }
    }

    /* a zero output gradient must give exactly zero input gradients */
    if (!rc) {
        for (int k = 0; k < n_inputs; k++) na_tensor_zero_grad(inputs[k]);
        na_tensor *z = na_zeros(NA_DTYPE_F64, NA_DEVICE_CPU, y->ndim, y->shape);
        rc = z ? na_backward(y, z) : /* the last walk */ na_last_status();
        for (int k = 0; k < n_inputs && !rc; k++) {
            if (!first[k]) continue;
            const double *g = inputs[k]->grad->data;
            for (int64_t j = 0; j < inputs[k]->numel && !rc; j++)
                if (g[j] != 0.0)
                    rc = na_set_error(NA_ESTATE, "%s: a zero output gradient gave %.10g at input "
                                      "%d element %" PRId64, fn, g[j], k, j);
        }
    }
    for (int k = 0; k < n_inputs; k++) free(first[k]);
    free(first);
    return rc;
}
