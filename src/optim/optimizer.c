/* Optimizers: parameter groups, their state, the step (one multi-tensor kernel call per
 * group and device), zero_grad and the state as named tensors.
 *
 * A group's hyper-parameters live in f64 0-dim CPU tensors: reading them is free, and a
 * checkpoint saves and restores them like any other state. Parameter state (step count,
 * moments) is f32 on the parameter's device and made when the parameter is added. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "nanoamp/autograd.h"
#include "nanoamp/optim.h"
#include "src/optim/optim_internal.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h" /* na_tensor_bump_version */

enum { HP_LR, HP_WEIGHT_DECAY, HP_INITIAL_LR, HP_MOMENTUM, HP_DAMPENING, HP_BETA1, HP_BETA2,
       HP_EPS, HP_COUNT };
static const char *const hp_names[HP_COUNT] = {"lr", "weight_decay", "initial_lr", "momentum",
                                               "dampening", "beta1", "beta2", "eps"};

typedef struct {
    int64_t first, count;    /* its parameters: ps[first .. first+count) */
    na_tensor *hp[HP_COUNT]; /* NULL where the rule has no such hyper-parameter */
    /* na_optim_set_lr_on_device: hp[HP_LR]'s value on each device of the group's parameters
     * (f64 0-dim), which the kernels read; NULL when off */
    na_tensor *lr_dev[NA_DEVICE_COUNT];
} opt_group;

typedef struct {
    na_tensor *param;
    na_tensor *step, *exp_avg, *exp_avg_sq, *max_exp_avg_sq; /* NULL when unused */
} param_state;

struct na_optim {
    na_optim_kind kind;
    na_optim_hparams cfg; /* the config: new groups start from it; flags come from it */
    int n_groups;
    opt_group *groups;
    int64_t n;
    param_state *ps;
    /* the lists of one kernel call, n entries each, kept so a step allocates nothing */
    const na_view **l_grads;
    na_view **l_params, **l_steps, **l_m, **l_v, **l_vmax, **l_copies;
};

static const char *kind_fn(na_optim_kind k) {
    return k == NA_OPTIM_SGD ? "na_sgd_new" : k == NA_OPTIM_ADAM ? "na_adam_new" : "na_adamw_new";
}

static bool uses_exp_avg(const na_optim *o) {
    return o->kind != NA_OPTIM_SGD || o->cfg.momentum != 0;
}

/* ---- validation -------------------------------------------------------------------------- */

/* Which hyper-parameters a rule has: lr, weight decay and the base lr always; SGD momentum and
 * dampening; Adam betas and eps. */
static bool hp_used(na_optim_kind k, int hp) {
    return hp <= HP_INITIAL_LR || (k == NA_OPTIM_SGD ? hp <= HP_DAMPENING : hp > HP_DAMPENING);
}

/* The valid values of each: finite, >= 0 and below hi (at most hi where closed). A loaded
 * momentum of 3e38 or an infinite weight decay would only turn the weights into NaN. */
static const struct {
    const char *what;
    double hi;
    bool closed;
} hp_rule[HP_COUNT] = {
    [HP_LR] = {"learning rate", INFINITY, false},
    [HP_WEIGHT_DECAY] = {"weight_decay", INFINITY, false},
    [HP_INITIAL_LR] = {"initial learning rate", INFINITY, false},
    [HP_MOMENTUM] = {"momentum", 1, false},
    [HP_DAMPENING] = {"dampening", 1, true},
    [HP_BETA1] = {"beta1", 1, false},
    [HP_BETA2] = {"beta2", 1, false},
    [HP_EPS] = {"eps", INFINITY, false},
};

/* NA_OK, or NA_EINVAL "<where>: invalid momentum 3e+38 (expected 0 <= momentum < 1)". */
static int check_hp(const char *where, int k, double v) {
    double hi = hp_rule[k].hi;
    if (v >= 0 && (v < hi || (hp_rule[k].closed && v == hi))) return NA_OK;
    char want[64];
    if (isinf(hi)) snprintf(want, sizeof want, "a finite value >= 0");
    else
        snprintf(want, sizeof want, "0 <= %s %s %g", hp_names[k], hp_rule[k].closed ? "<=" : "<",
                 hi);
    return na_set_error(NA_EINVAL, "%s: invalid %s %g (expected %s)", where, hp_rule[k].what, v,
                        want);
}

static int validate(const char *fn, na_optim_kind k, const na_optim_hparams *h) {
    const double v[HP_COUNT] = {h->lr, h->weight_decay, h->lr, h->momentum, h->dampening,
                                h->beta1, h->beta2, h->eps};
    for (int i = 0; i < HP_COUNT; i++) {
        int rc = hp_used(k, i) ? check_hp(fn, i, v[i]) : NA_OK;
        if (rc) return rc;
    }
    if (k == NA_OPTIM_SGD && h->nesterov && (h->momentum <= 0 || h->dampening != 0))
        return na_set_error(NA_EINVAL, "%s: nesterov momentum requires a momentum > 0 and zero "
                            "dampening (got momentum %g, dampening %g)", fn, h->momentum,
                            h->dampening);
    return NA_OK;
}

/* ---- making ------------------------------------------------------------------------------ */

static na_optim *optim_new(na_optim_kind k, const na_optim_hparams *h, na_tensor_list params) {
    if (na_tensor_list_check(kind_fn(k), params) || validate(kind_fn(k), k, h)) return NULL;
    na_optim *o = calloc(1, sizeof *o);
    if (!o) {
        na_set_error(NA_ENOMEM, "%s: out of host memory", kind_fn(k));
        return NULL;
    }
    o->kind = k;
    o->cfg = *h;
    o->cfg.decoupled_weight_decay = k == NA_OPTIM_ADAMW;
    if (params.n && na_optim_add_group(o, params) < 0) {
        na_optim_free(o);
        return NULL;
    }
    return o;
}

na_optim *na_sgd_new(na_tensor_list params, const na_sgd_cfg *cfg) {
    na_sgd_cfg c = cfg ? *cfg : (na_sgd_cfg)NA_SGD_DEFAULTS;
    na_optim_hparams h = {.lr = c.lr, .weight_decay = c.weight_decay, .momentum = c.momentum,
                          .dampening = c.dampening, .nesterov = c.nesterov};
    return optim_new(NA_OPTIM_SGD, &h, params);
}

static na_optim *adam_new(na_optim_kind k, na_tensor_list params, const na_adam_cfg *cfg) {
    na_adam_cfg c = cfg ? *cfg : k == NA_OPTIM_ADAM ? (na_adam_cfg)NA_ADAM_DEFAULTS
                                                    : (na_adam_cfg)NA_ADAMW_DEFAULTS;
    na_optim_hparams h = {.lr = c.lr, .weight_decay = c.weight_decay, .beta1 = c.beta1,
                          .beta2 = c.beta2, .eps = c.eps, .amsgrad = c.amsgrad};
    return optim_new(k, &h, params);
}
na_optim *na_adam_new(na_tensor_list params, const na_adam_cfg *cfg) {
    return adam_new(NA_OPTIM_ADAM, params, cfg);
}
na_optim *na_adamw_new(na_tensor_list params, const na_adam_cfg *cfg) {
    return adam_new(NA_OPTIM_ADAMW, params, cfg);
}

static void free_state(param_state *s) {
    na_tensor_free(s->step);
    na_tensor_free(s->exp_avg);
    na_tensor_free(s->exp_avg_sq);
    na_tensor_free(s->max_exp_avg_sq);
}

static void free_lr_dev(opt_group *g) {
    for (int d = 0; d < NA_DEVICE_COUNT; d++) {
        na_tensor_free(g->lr_dev[d]);
        g->lr_dev[d] = NULL;
    }
}

static void free_group(opt_group *g) {
    for (int k = 0; k < HP_COUNT; k++) na_tensor_free(g->hp[k]);
    free_lr_dev(g);
}

void na_optim_free(na_optim *o) {
    if (!o) return;
    for (int64_t i = 0; i < o->n; i++) free_state(&o->ps[i]);
    for (int g = 0; g < o->n_groups; g++) free_group(&o->groups[g]);
    free(o->groups);
    free(o->ps);
    free(o->l_grads);
    free(o->l_params), free(o->l_steps), free(o->l_m), free(o->l_v), free(o->l_vmax);
    free(o->l_copies);
    free(o);
}

static double hp(const opt_group *g, int k) { return *(const double *)g->hp[k]->data; }
static void hp_set(opt_group *g, int k, double v) { *(double *)g->hp[k]->data = v; }

/* The group's lr into its device copies (host->device copies on the stream, no sync). */
static int upload_lr(const opt_group *g) {
    for (int d = 0; d < NA_DEVICE_COUNT; d++) {
        int rc = g->lr_dev[d] ? na_copy_from_host(g->lr_dev[d], g->hp[HP_LR]->data) : NA_OK;
        if (rc) return rc;
    }
    return NA_OK;
}

static na_optim_hparams group_hparams(const na_optim *o, const opt_group *g) {
    na_optim_hparams h = o->cfg; /* flags (nesterov, amsgrad, decoupled) */
    h.lr = hp(g, HP_LR);
    h.weight_decay = hp(g, HP_WEIGHT_DECAY);
    if (o->kind == NA_OPTIM_SGD) {
        h.momentum = hp(g, HP_MOMENTUM);
        h.dampening = hp(g, HP_DAMPENING);
    } else {
        h.beta1 = hp(g, HP_BETA1);
        h.beta2 = hp(g, HP_BETA2);
        h.eps = hp(g, HP_EPS);
    }
    return h;
}

static int check_new_param(const char *fn, const na_optim *o, na_tensor *const *params, int64_t i) {
    char d[NA_DESCRIBE_MAX];
    const na_tensor *p = params[i];
    if (!p) return na_set_error(NA_EINVAL, "%s: parameter %" PRId64 " is NULL", fn, i);
    if (!p->persistent || !na_dtype_is_float(p->dtype) || !p->requires_grad ||
        !na_is_contiguous(p) || p->grad_fn)
        return na_set_error(NA_EINVAL, "%s: parameter %" PRId64 " (%s%s) must be a persistent, "
                            "contiguous float leaf that requires grad", fn, i,
                            p->name ? p->name : "", na_tensor_describe(p, d, sizeof d));
    for (int64_t k = 0; k < o->n; k++)
        if (o->ps[k].param == p)
            return na_set_error(NA_EINVAL, "%s: parameter %" PRId64 " is already in the optimizer",
                                fn, i);
    for (int64_t k = 0; k < i; k++)
        if (params[k] == p)
            return na_set_error(NA_EINVAL, "%s: parameter %" PRId64 " appears twice", fn, i);
    return NA_OK;
}

static int grow(void **p, size_t elem, int64_t count) {
    void *q = realloc(*p, (size_t)count * elem);
    if (!q && count) return na_set_error(NA_ENOMEM, "na_optim_add_group: out of host memory");
    *p = q;
    return NA_OK;
}

static na_tensor *state_tensor(const na_tensor *p, bool scalar) {
    return scalar ? na_tensor_new(NA_DTYPE_F32, p->device, 0, NULL)
                  : na_tensor_new(NA_DTYPE_F32, p->device, p->ndim, p->shape);
}

int na_optim_add_group(na_optim *o, na_tensor_list list) {
    const char *fn = "na_optim_add_group";
    int64_t n = list.n;
    na_tensor *const *params = list.items;
    if (!o) return na_set_error(NA_EINVAL, "%s: NULL optimizer", fn);
    if (na_tensor_list_check(fn, list)) return na_last_status();
    for (int64_t i = 0; i < n; i++) {
        int rc = check_new_param(fn, o, params, i);
        if (rc) return rc;
    }
    int64_t total = o->n + n;
    int rc = grow((void **)&o->groups, sizeof(opt_group), o->n_groups + 1);
    if (!rc) rc = grow((void **)&o->ps, sizeof(param_state), total);
    if (!rc) rc = grow((void **)&o->l_grads, sizeof(void *), total);
    na_view ***lists[] = {&o->l_params, &o->l_steps, &o->l_m, &o->l_v, &o->l_vmax, &o->l_copies};
    for (size_t k = 0; k < sizeof lists / sizeof *lists && !rc; k++)
        rc = grow((void **)lists[k], sizeof(void *), total);
    if (rc) return rc;

    opt_group *g = &o->groups[o->n_groups];
    *g = (opt_group){.first = o->n, .count = n};
    bool sgd = o->kind == NA_OPTIM_SGD;
    double init[HP_COUNT] = {o->cfg.lr, o->cfg.weight_decay, o->cfg.lr, o->cfg.momentum,
                             o->cfg.dampening, o->cfg.beta1, o->cfg.beta2, o->cfg.eps};
    for (int k = 0; k < HP_COUNT && !rc; k++) {
        if (!hp_used(o->kind, k)) continue;
        if (!(g->hp[k] = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, 0, NULL)))
            rc = na_last_status();
        else hp_set(g, k, init[k]);
    }
    int64_t made = 0;
    for (; made < n && !rc; made++) {
        const na_tensor *p = params[made];
        param_state *s = &o->ps[o->n + made];
        *s = (param_state){.param = params[made]};
        bool ok = (s->step = state_tensor(p, true)) &&
                  (!uses_exp_avg(o) || (s->exp_avg = state_tensor(p, false))) &&
                  (sgd || (s->exp_avg_sq = state_tensor(p, false))) &&
                  (sgd || !o->cfg.amsgrad || (s->max_exp_avg_sq = state_tensor(p, false)));
        if (!ok) {
            free_state(s);
            rc = na_last_status();
            break;
        }
    }
    if (rc) { /* roll back this group */
        for (int64_t i = 0; i < made; i++) free_state(&o->ps[o->n + i]);
        free_group(g);
        return na_set_error(rc, "%s: %s", fn, na_last_error());
    }
    o->n = total;
    bool lr_dev = na_optim_lr_on_device(o);
    o->n_groups++;
    if (lr_dev && (rc = na_optim_set_lr_on_device(o, true))) return rc;
    return o->n_groups - 1;
}

/* ---- stepping ---------------------------------------------------------------------------- */

static int check_scalar(const char *fn, const char *what, const na_tensor *t, na_device dev) {
    char d[NA_DESCRIBE_MAX];
    if (t && (t->dtype != NA_DTYPE_F32 || t->numel != 1 || t->device != dev))
        return na_set_error(NA_EINVAL, "%s: %s must be a one-element f32 tensor on %s, got %s", fn,
                            what, na_device_name(dev), na_tensor_describe(t, d, sizeof d));
    return NA_OK;
}

/* Gradient (or copy) i must match its parameter. */
static int check_like(const char *fn, const char *what, int64_t i, const na_tensor *p,
                      const na_tensor *t) {
    char a[NA_DESCRIBE_MAX], b[NA_DESCRIBE_MAX];
    if (!na_same_shape(p, t) || t->device != p->device || !na_dtype_is_float(t->dtype) ||
        !na_is_contiguous(t))
        return na_set_error(NA_ESHAPE, "%s: %s of parameter %" PRId64 " is %s, expected a "
                            "contiguous float tensor shaped as the parameter %s", fn, what, i,
                            na_tensor_describe(t, a, sizeof a), na_tensor_describe(p, b, sizeof b));
    return NA_OK;
}

/* One kernel call: the parameters of group g on device dev that have a gradient. */
static int step_group(na_optim *o, const opt_group *g, na_device dev,
                      const na_optim_step_opts *opts, const na_optim_hparams *h) {
    const char *fn = "na_optim_step";
    int count = 0;
    for (int64_t i = g->first; i < g->first + g->count; i++) {
        param_state *s = &o->ps[i];
        na_tensor *p = s->param;
        if (p->device != dev) continue;
        const na_tensor *grad = opts && opts->grads ? opts->grads[i] : p->grad;
        na_tensor *copy = opts && opts->copies ? opts->copies[i] : NULL;
        if (!grad) continue;
        int rc = check_like(fn, "the gradient", i, p, grad);
        if (!rc && copy) rc = check_like(fn, "the copy", i, p, copy);
        if (rc) return rc;
        if (s->step->device != dev)
            return na_set_error(NA_EDEVICE, "%s: parameter %" PRId64 " is on %s but its state on "
                                "%s: make the optimizer after moving the model", fn, i,
                                na_device_name(dev), na_device_name(s->step->device));
        o->l_params[count] = &p->view, o->l_grads[count] = &grad->view;
        o->l_steps[count] = &s->step->view;
        o->l_m[count] = NA_VIEW_OF(s->exp_avg), o->l_v[count] = NA_VIEW_OF(s->exp_avg_sq);
        o->l_vmax[count] = NA_VIEW_OF(s->max_exp_avg_sq), o->l_copies[count] = NA_VIEW_OF(copy);
        count++;
        na_tensor_bump_version(p); /* written in place: a graph that saved it cannot use it */
        if (copy) na_tensor_bump_version(copy);
    }
    if (!count) return NA_OK;
    const na_tensor *found_inf = opts ? opts->found_inf : NULL;
    const na_tensor *inv_scale = opts ? opts->inv_scale : NULL;
    int rc = check_scalar(fn, "found_inf", found_inf, dev);
    if (!rc) rc = check_scalar(fn, "inv_scale", inv_scale, dev);
    if (rc) return rc;
    const na_backend *be = na_backend_get(dev);
    if (!be) return na_last_status();
    bool sgd = o->kind == NA_OPTIM_SGD;
    rc = sgd ? NA_BACKEND_NEED(be, sgd_step) : NA_BACKEND_NEED(be, adam_step);
    if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    na_optim_tensors t = {
        .n = count, .params = o->l_params, .grads = o->l_grads, .steps = o->l_steps,
        .exp_avg = uses_exp_avg(o) ? o->l_m : NULL, .exp_avg_sq = sgd ? NULL : o->l_v,
        .max_exp_avg_sq = o->cfg.amsgrad && !sgd ? o->l_vmax : NULL,
        .copies = opts && opts->copies ? o->l_copies : NULL, .found_inf = NA_VIEW_OF(found_inf),
        .inv_scale = NA_VIEW_OF(inv_scale), .lr = NA_VIEW_OF(g->lr_dev[dev])};
    return sgd ? be->sgd_step(&t, h) : be->adam_step(&t, h);
}

int na_optim_step(na_optim *o, const na_optim_step_opts *opts) {
    if (!o) return na_set_error(NA_EINVAL, "na_optim_step: NULL optimizer");
    int settled = na_grad_settle(); /* gradients zero_grad marked and no backward wrote */
    if (settled) return settled;
    for (int gi = 0; gi < o->n_groups; gi++) {
        const opt_group *g = &o->groups[gi];
        na_optim_hparams h = group_hparams(o, g);
        int rc = validate("na_optim_step", o->kind, &h); /* loaded or set values too */
        if (rc) return na_set_error(rc, "%s (group %d)", na_last_error(), gi);
        /* a value loaded into the state list reaches the device copies here; a capture
         * records no copy (a replay reads what na_optim_set_lr last wrote) */
        if (!na_step_graph_capturing() && (rc = upload_lr(g)))
            return na_set_error(rc, "na_optim_step: %s", na_last_error());
        for (int dev = 0; dev < NA_DEVICE_COUNT && !rc; dev++)
            rc = step_group(o, g, (na_device)dev, opts, &h);
        if (rc) return rc;
    }
    return NA_OK;
}

int na_optim_zero_grad(na_optim *o) {
    for (int64_t i = 0; o && i < o->n; i++) {
        int rc = na_tensor_zero_grad(o->ps[i].param);
        if (rc) return rc;
    }
    return NA_OK;
}

/* ---- inspecting and changing ------------------------------------------------------------- */

na_optim_kind na_optim_kind_of(const na_optim *o) { return o ? o->kind : NA_OPTIM_SGD; }
int na_optim_num_groups(const na_optim *o) { return o ? o->n_groups : 0; }
int64_t na_optim_num_params(const na_optim *o) { return o ? o->n : 0; }
na_tensor *na_optim_param(const na_optim *o, int64_t i) {
    return o && i >= 0 && i < o->n ? o->ps[i].param : NULL;
}
na_tensor_list na_optim_parameters(const na_optim *o) {
    if (!o) {
        na_set_error(NA_EINVAL, "na_optim_parameters: NULL optimizer");
        return (na_tensor_list){.n = -1};
    }
    na_tensor **ps = na_arena_host_alloc((size_t)(o->n ? o->n : 1) * sizeof *ps);
    if (!ps) return (na_tensor_list){.n = -1};
    for (int64_t i = 0; i < o->n; i++) ps[i] = o->ps[i].param;
    return (na_tensor_list){.n = o->n, .items = ps};
}
int na_optim_param_group(const na_optim *o, int64_t i) {
    for (int g = 0; o && g < o->n_groups; g++)
        if (i >= o->groups[g].first && i < o->groups[g].first + o->groups[g].count) return g;
    return -1;
}

static int set_hp(const char *fn, na_optim *o, int g, int k, double v) {
    if (!o || g < -1 || g >= o->n_groups)
        return na_set_error(NA_EINVAL, "%s: no group %d (the optimizer has %d)", fn, g,
                            o ? o->n_groups : 0);
    if (check_hp(fn, k, v)) return na_last_status();
    for (int i = g < 0 ? 0 : g; i < (g < 0 ? o->n_groups : g + 1); i++) {
        hp_set(&o->groups[i], k, v);
        int rc = k == HP_LR ? upload_lr(&o->groups[i]) : NA_OK;
        if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    }
    return NA_OK;
}

int na_optim_set_lr_on_device(na_optim *o, bool on) {
    const char *fn = "na_optim_set_lr_on_device";
    if (!o) return na_set_error(NA_EINVAL, "%s: NULL optimizer", fn);
    for (int gi = 0; gi < o->n_groups; gi++) {
        opt_group *g = &o->groups[gi];
        if (!on) {
            free_lr_dev(g);
            continue;
        }
        for (int64_t i = g->first; i < g->first + g->count; i++) {
            na_device d = o->ps[i].param->device;
            if (!g->lr_dev[d] && !(g->lr_dev[d] = na_tensor_new(NA_DTYPE_F64, d, 0, NULL)))
                return na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
        }
        int rc = upload_lr(g);
        if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    }
    return NA_OK;
}

bool na_optim_lr_on_device(const na_optim *o) {
    for (int gi = 0; o && gi < o->n_groups; gi++)
        for (int d = 0; d < NA_DEVICE_COUNT; d++)
            if (o->groups[gi].lr_dev[d]) return true;
    return false;
}
int na_optim_set_lr(na_optim *o, int group, double lr) {
    return set_hp("na_optim_set_lr", o, group, HP_LR, lr);
}
int na_optim_set_weight_decay(na_optim *o, int group, double wd) {
    return set_hp("na_optim_set_weight_decay", o, group, HP_WEIGHT_DECAY, wd);
}
static double get_hp(const na_optim *o, int g, int k) {
    return o && g >= 0 && g < o->n_groups ? hp(&o->groups[g], k) : NAN;
}
int na_optim_set_initial_lr(na_optim *o, int group, double lr) {
    int rc = set_hp("na_optim_set_initial_lr", o, group, HP_INITIAL_LR, lr);
    return rc ? rc : set_hp("na_optim_set_initial_lr", o, group, HP_LR, lr);
}
double na_optim_lr(const na_optim *o, int g) { return get_hp(o, g, HP_LR); }
double na_optim_weight_decay(const na_optim *o, int g) { return get_hp(o, g, HP_WEIGHT_DECAY); }
double na_optim_initial_lr(const na_optim *o, int g) { return get_hp(o, g, HP_INITIAL_LR); }

/* ---- state as named tensors -------------------------------------------------------------- */

int na_optim_state(na_optim *o, const char *prefix, na_named_tensors *out) {
    if (!o || !out) return na_set_error(NA_EINVAL, "na_optim_state: NULL optimizer or output");
    const char *pf = prefix ? prefix : "";
    int64_t n0 = out->n;
    bool sgd = o->kind == NA_OPTIM_SGD;
    int rc = NA_OK;
    for (int64_t i = 0; i < o->n && !rc; i++) {
        const param_state *s = &o->ps[i];
        na_tensor *ts[] = {s->step, s->exp_avg, s->exp_avg_sq, s->max_exp_avg_sq};
        const char *names[] = {"step", sgd ? "momentum_buffer" : "exp_avg", "exp_avg_sq",
                               "max_exp_avg_sq"};
        for (int k = 0; k < 4 && !rc; k++)
            if (ts[k]) rc = na_named_tensors_add(out, ts[k], "%sstate.%" PRId64 ".%s", pf, i,
                                                 names[k]);
    }
    for (int g = 0; g < o->n_groups && !rc; g++)
        for (int k = 0; k < HP_COUNT && !rc; k++)
            if (o->groups[g].hp[k])
                rc = na_named_tensors_add(out, o->groups[g].hp[k], "%sgroup.%d.%s", pf, g,
                                          hp_names[k]);
    if (rc) na_named_tensors_truncate(out, n0);
    return rc;
}

int na_optim_check(const na_optim *o, const char *prefix) {
    if (!o) return na_set_error(NA_EINVAL, "na_optim_check: NULL optimizer");
    const char *pf = prefix ? prefix : "";
    char key[256];
    for (int g = 0; g < o->n_groups; g++) {
        for (int k = 0; k < HP_COUNT; k++) {
            if (!o->groups[g].hp[k]) continue;
            snprintf(key, sizeof key, "%sgroup.%d.%s", pf, g, hp_names[k]);
            if (check_hp(key, k, hp(&o->groups[g], k))) return na_last_status();
        }
        na_optim_hparams h = group_hparams(o, &o->groups[g]);
        snprintf(key, sizeof key, "%sgroup.%d", pf, g);
        if (validate(key, o->kind, &h)) return na_last_status(); /* nesterov's rule */
    }
    return NA_OK;
}
