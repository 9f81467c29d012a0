/* Learning-rate schedules as closed forms of the step count (PyTorch's formulas). */
#include <inttypes.h>
#include <math.h>

#include "nanoamp/error.h"
#include "nanoamp/optim.h"

#define NA_PI 3.14159265358979323846

na_lr_schedule na_lr_constant(void) { return (na_lr_schedule){.kind = NA_LR_CONSTANT}; }
na_lr_schedule na_lr_step(int64_t step_size, double gamma) {
    return (na_lr_schedule){.kind = NA_LR_STEP, .step_size = step_size, .gamma = gamma};
}
na_lr_schedule na_lr_cosine(int64_t t_max, double eta_min) {
    return (na_lr_schedule){.kind = NA_LR_COSINE, .t_max = t_max, .eta_min = eta_min};
}
na_lr_schedule na_lr_linear(double start_factor, double end_factor, int64_t total_iters) {
    return (na_lr_schedule){.kind = NA_LR_LINEAR, .start_factor = start_factor,
                            .end_factor = end_factor, .total_iters = total_iters};
}
na_lr_schedule na_lr_one_cycle(int64_t total_steps) {
    return (na_lr_schedule){.kind = NA_LR_ONE_CYCLE, .total_steps = total_steps,
                            .pct_start = 0.3, .div_factor = 25.0, .final_div_factor = 1e4};
}

static double anneal(const na_lr_schedule *s, double from, double to, double pct) {
    if (s->anneal_linear) return (to - from) * pct + from;
    return to + (from - to) / 2.0 * (cos(NA_PI * pct) + 1.0);
}

/* OneCycleLR.get_lr: phases end at (float) step indices; the last phase takes any later t. */
static double one_cycle(const na_lr_schedule *s, double max_lr, int64_t t) {
    double initial = max_lr / s->div_factor, min_lr = initial / s->final_div_factor;
    double p = s->pct_start * (double)s->total_steps, last = (double)s->total_steps - 1.0;
    double ends[3], from[3], to[3];
    int n;
    if (s->three_phase) {
        n = 3;
        ends[0] = p - 1, from[0] = initial, to[0] = max_lr;
        ends[1] = 2 * p - 2, from[1] = max_lr, to[1] = initial;
        ends[2] = last, from[2] = initial, to[2] = min_lr;
    } else {
        n = 2;
        ends[0] = p - 1, from[0] = initial, to[0] = max_lr;
        ends[1] = last, from[1] = max_lr, to[1] = min_lr;
    }
    double start = 0, step = (double)t;
    for (int i = 0; i < n; i++) {
        if (step <= ends[i] || i == n - 1) {
            double span = ends[i] - start;
            return anneal(s, from[i], to[i], span > 0 ? (step - start) / span : 1.0);
        }
        start = ends[i];
    }
    return min_lr; /* not reached */
}

double na_lr_schedule_lr(const na_lr_schedule *s, double base, int64_t t) {
    const char *fn = "na_lr_schedule_lr";
    if (!s || t < 0) {
        na_set_error(NA_EINVAL, "%s: need a schedule and a step >= 0 (got %" PRId64 ")", fn, t);
        return NAN;
    }
    switch (s->kind) {
    case NA_LR_CONSTANT: return base;
    case NA_LR_STEP:
        if (s->step_size > 0) return base * pow(s->gamma, (double)(t / s->step_size));
        na_set_error(NA_EINVAL, "%s: step schedule needs step_size > 0", fn);
        return NAN;
    case NA_LR_COSINE:
        if (s->t_max > 0)
            return s->eta_min +
                   (base - s->eta_min) * (1.0 + cos(NA_PI * (double)t / (double)s->t_max)) / 2.0;
        na_set_error(NA_EINVAL, "%s: cosine schedule needs t_max > 0", fn);
        return NAN;
    case NA_LR_LINEAR:
        if (s->total_iters > 0 && s->start_factor > 0 && s->start_factor <= 1 &&
            s->end_factor >= 0 && s->end_factor <= 1) {
            int64_t k = t < s->total_iters ? t : s->total_iters;
            return base * (s->start_factor + (s->end_factor - s->start_factor) * (double)k /
                                                 (double)s->total_iters);
        }
        na_set_error(NA_EINVAL, "%s: linear schedule needs start_factor in (0, 1], end_factor in "
                     "[0, 1] and total_iters > 0 (got %g, %g, %" PRId64 ")", fn, s->start_factor,
                     s->end_factor, s->total_iters);
        return NAN;
    case NA_LR_ONE_CYCLE:
        if (!(s->total_steps > 0 && s->pct_start >= 0 && s->pct_start <= 1 && s->div_factor > 0 &&
              s->final_div_factor > 0)) {
            na_set_error(NA_EINVAL, "%s: one-cycle schedule needs total_steps > 0, pct_start in "
                         "[0, 1] and positive div factors", fn);
            return NAN;
        }
        if (t > s->total_steps) {
            na_set_error(NA_EINVAL, "%s: tried to step %" PRId64 " times; the one-cycle schedule "
                         "has %" PRId64 " total steps", fn, t, s->total_steps);
            return NAN;
        }
        return one_cycle(s, base, t);
    }
    na_set_error(NA_EINVAL, "%s: unknown schedule kind %d", fn, (int)s->kind);
    return NAN;
}

int na_lr_schedule_apply(const na_lr_schedule *s, na_optim *o, int64_t t) {
    for (int g = 0; g < na_optim_num_groups(o); g++) {
        double base = na_optim_initial_lr(o, g); /* a loaded value, maybe NaN: say so */
        if (!(base >= 0 && isfinite(base)))
            return na_set_error(NA_EINVAL, "na_lr_schedule_apply: group %d's initial_lr is %g "
                                "(expected a finite value >= 0)", g, base);
        double lr = na_lr_schedule_lr(s, base, t);
        if (isnan(lr)) return na_last_status();
        int rc = na_optim_set_lr(o, g, lr);
        if (rc) return rc;
    }
    return NA_OK;
}
