/* kernels/cpu/cpu_optim.c — multi-tensor optimizer steps and the global L2 norm.
 *
 * Each parameter is walked in chunks of NA_CPU_CHUNK: parameter and gradient are widened to
 * f32 (in place when already f32), updated with the per-element rules of common/optim.h
 * against the f32 state, and rounded once on store, as the CUDA kernels do. found_inf and
 * inv_scale (and lr) are host memory here, so reading them costs nothing.
 */
#include "common/optim.h"
#include "cpu/cpu_internal.h"

typedef enum { RULE_SGD, RULE_ADAM } rule;

static float scalar(const na_view *t, float dflt) { return t ? *(const float *)t->data : dflt; }

static int step_one(rule r, const na_optim_tensors *t, const na_optim_hparams *h, int i,
                    float inv_scale) {
    const char *fn = r == RULE_SGD ? "cpu_sgd_step" : "cpu_adam_step";
    na_view *p = t->params[i];
    const na_view *g = t->grads[i];
    na_view *copy = t->copies ? t->copies[i] : NULL;
    NA_CPU_CHECK_FLOAT(fn, p);
    NA_CPU_CHECK_FLOAT(fn, g);
    NA_CPU_CHECK_FLOAT(fn, copy);
    float *step = t->steps[i]->data;
    *step += 1.0f;
    na_optim_scalars s = na_optim_prepare(h, *step);
    float *m = t->exp_avg ? t->exp_avg[i]->data : NULL;
    float *v = t->exp_avg_sq ? t->exp_avg_sq[i]->data : NULL;
    float *vmax = t->max_exp_avg_sq ? t->max_exp_avg_sq[i]->data : NULL;
    float pbuf[NA_CPU_CHUNK], gbuf[NA_CPU_CHUNK];
    for (int64_t off = 0; off < p->numel; off += NA_CPU_CHUNK) {
        int64_t n = p->numel - off < NA_CPU_CHUNK ? p->numel - off : NA_CPU_CHUNK;
        float *pv = na_cpu_out_f(p->dtype, p->data, off, pbuf);
        if (pv == pbuf) na_cpu_load_f(p->dtype, p->data, off, n, pbuf);
        na_cpu_load_f(g->dtype, g->data, off, n, gbuf);
        if (t->inv_scale)
            for (int64_t k = 0; k < n; k++) gbuf[k] *= inv_scale;
        if (r == RULE_SGD) {
            for (int64_t k = 0; k < n; k++)
                pv[k] = na_sgd_elem(pv[k], gbuf[k], m ? m + off + k : NULL, &s);
        } else {
            for (int64_t k = 0; k < n; k++)
                pv[k] = na_adam_elem(pv[k], gbuf[k], m + off + k, v + off + k,
                                     vmax ? vmax + off + k : NULL, &s);
        }
        na_cpu_store_f(p->dtype, p->data, off, n, pv);
        if (copy) na_cpu_store_f(copy->dtype, copy->data, off, n, pv);
    }
    return NA_OK;
}

static int optim_step(rule r, const na_optim_tensors *t, const na_optim_hparams *h) {
    bool need_m = r == RULE_ADAM || h->momentum != 0.0;
    if ((need_m && !t->exp_avg) || (r == RULE_ADAM && (!t->exp_avg_sq ||
                                                       (h->amsgrad && !t->max_exp_avg_sq))))
        return na_set_error(NA_EINVAL, "%s: state tensors missing for these hyper-parameters",
                            r == RULE_SGD ? "cpu_sgd_step" : "cpu_adam_step");
    if (scalar(t->found_inf, 0.0f) != 0.0f) return NA_OK; /* skipped: nothing changes */
    float inv_scale = scalar(t->inv_scale, 1.0f);
    if (t->lr && (t->lr->dtype != NA_DTYPE_F64 || t->lr->numel != 1))
        return na_set_error(NA_EDTYPE, "%s: lr must be an f64 scalar",
                            r == RULE_SGD ? "cpu_sgd_step" : "cpu_adam_step");
    na_optim_hparams hh = *h;
    if (t->lr) hh.lr = *(const double *)t->lr->data;
    for (int i = 0; i < t->n; i++) {
        int rc = step_one(r, t, &hh, i, inv_scale);
        if (rc) return rc;
    }
    return NA_OK;
}

int na_cpu_sgd_step(const na_optim_tensors *t, const na_optim_hparams *h) {
    return optim_step(RULE_SGD, t, h);
}

int na_cpu_adam_step(const na_optim_tensors *t, const na_optim_hparams *h) {
    return optim_step(RULE_ADAM, t, h);
}

int na_cpu_l2norm(int n, const na_view *const *xs, na_view *norm, na_view *coef,
                  double max_norm) {
    na_cpu_psum_f acc = {{0}, 0}; /* pairwise over chunks: f32 accumulation stays accurate */
    float buf[NA_CPU_CHUNK];
    for (int i = 0; i < n; i++) {
        const na_view *x = xs[i];
        NA_CPU_CHECK_FLOAT("cpu_l2norm", x);
        for (int64_t off = 0; off < x->numel; off += NA_CPU_CHUNK) {
            int64_t c = x->numel - off < NA_CPU_CHUNK ? x->numel - off : NA_CPU_CHUNK;
            na_cpu_load_f(x->dtype, x->data, off, c, buf);
            for (int64_t k = 0; k < c; k++) buf[k] *= buf[k];
            na_cpu_psum_add_f(&acc, na_cpu_sum_f(buf, c));
        }
    }
    float total = sqrtf(na_cpu_psum_total_f(&acc));
    *(float *)norm->data = total;
    if (coef) *(float *)coef->data = na_clip_coef(total, max_norm);
    return NA_OK;
}
