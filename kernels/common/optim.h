/* kernels/common/optim.h — the per-element math of the optimizer kernels, for both backends.
 *
 * The rules are PyTorch's for-loop implementations, operation by operation, in f32 (the
 * state is f32 whatever the parameter's dtype):
 *   SGD:   g += wd*p; buf = first ? g : momentum*buf + (1-dampening)*g;
 *          g = nesterov ? g + momentum*buf : buf; p -= lr*g
 *   Adam:  g += wd*p (AdamW instead: p *= 1 - lr*wd); m = lerp(m, g, 1-beta1);
 *          v = beta2*v + (1-beta2)*g*g; (amsgrad: vmax = max(vmax, v), used for v)
 *          p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), bc_k = 1 - beta_k^step
 * Scalars that depend only on the hyper-parameters and the step (bias corrections) are made
 * once per tensor, in double as PyTorch makes them in Python, by na_optim_prepare.
 */
#ifndef NANOAMP_KERNELS_COMMON_OPTIM_H
#define NANOAMP_KERNELS_COMMON_OPTIM_H

#include <math.h>
#include <stdbool.h>

#include "backend.h"
#include "common/hd.h"

typedef struct {
    float lr, wd, momentum, one_minus_dampening;
    float one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bc2_sqrt, decay;
    bool nesterov, amsgrad, decoupled, first;
} na_optim_scalars;

/* step: the step count after this step's increment (1 on the first step). */
static NA_HD na_optim_scalars na_optim_prepare(const na_optim_hparams *h, float step) {
    na_optim_scalars s;
    s.lr = (float)h->lr;
    s.wd = (float)h->weight_decay;
    s.momentum = (float)h->momentum;
    s.one_minus_dampening = (float)(1.0 - h->dampening);
    s.one_minus_beta1 = (float)(1.0 - h->beta1);
    s.beta2 = (float)h->beta2;
    s.one_minus_beta2 = (float)(1.0 - h->beta2);
    s.eps = (float)h->eps;
    s.step_size = (float)(h->lr / (1.0 - pow(h->beta1, (double)step)));
    s.bc2_sqrt = (float)sqrt(1.0 - pow(h->beta2, (double)step));
    s.decay = (float)(1.0 - h->lr * h->weight_decay);
    s.nesterov = h->nesterov;
    s.amsgrad = h->amsgrad;
    s.decoupled = h->decoupled_weight_decay;
    s.first = step == 1.0f;
    return s;
}

/* torch.lerp: a + w*(b-a), evaluated from the nearer end. */
static NA_HD float na_lerp_f(float a, float b, float w) {
    return fabsf(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

/* One element of SGD; returns the new parameter, updates *buf (unused when momentum is 0). */
static NA_HD float na_sgd_elem(float p, float g, float *buf, const na_optim_scalars *s) {
    if (s->wd != 0.0f) g = g + s->wd * p;
    if (s->momentum != 0.0f) {
        float b = s->first ? g : *buf * s->momentum + s->one_minus_dampening * g;
        *buf = b;
        g = s->nesterov ? g + s->momentum * b : b;
    }
    return p - s->lr * g;
}

/* One element of Adam/AdamW; returns the new parameter, updates the moments. */
static NA_HD float na_adam_elem(float p, float g, float *m, float *v, float *vmax,
                                const na_optim_scalars *s) {
    if (s->decoupled) p = p * s->decay;
    else if (s->wd != 0.0f) g = g + s->wd * p;
    float mm = na_lerp_f(*m, g, s->one_minus_beta1);
    float vv = *v * s->beta2 + s->one_minus_beta2 * g * g;
    *m = mm;
    *v = vv;
    if (s->amsgrad) { /* torch.maximum: NaN wins */
        float mx = *vmax;
        vv = (vv != vv || vv > mx) ? vv : mx;
        *vmax = vv;
    }
    float denom = sqrtf(vv) / s->bc2_sqrt + s->eps;
    return p - s->step_size * (mm / denom);
}

/* Gradient clipping's factor: min(1, max_norm / (norm + 1e-6)) in f32 as PyTorch; 1 when the
 * norm is inf or NaN, so non-finite gradients are left as they are for the caller to see. */
static NA_HD float na_clip_coef(float norm, double max_norm) {
    if (!isfinite(norm)) return 1.0f;
    float c = (float)max_norm / (norm + 1e-6f);
    return c < 1.0f ? c : 1.0f;
}

#endif
