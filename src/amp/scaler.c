/* Loss scaling: PyTorch's GradScaler and the Apex scalers behind one interface.
 *
 * The host keeps only bookkeeping (which optimizer was unscaled or stepped since the last
 * update, as PyTorch's per-optimizer states); the numbers live on the device: the scale (f32
 * 0-dim), four i32 counters (tracker, last overflow, updates, skipped) and one found_inf flag per
 * optimizer. unscale_ is one fused kernel over all of an optimizer's gradients, step passes the
 * optimizer's flag to the optimizer kernel (which skips on the device), update is one kernel
 * that combines every optimizer's flag and applies the rule (kernels/common/amp.h). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/amp.h"
#include "src/amp/amp_internal.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h"

typedef enum { STAGE_READY, STAGE_UNSCALED, STAGE_STEPPED } stage;

typedef struct {
    const na_optim *opt;
    stage st;
    na_tensor *found_inf; /* f32 0-dim on the scaler's device */
} opt_record;

/* The hyper-parameters held as state: those of the kernel's table but the per-call new scale. */
enum { HP_STATE = NA_AMP_HP_NEW_SCALE };
#define NA_NAME_(id, name, ...) name,
static const char *const hp_names[HP_STATE] = {NA_AMP_HP_MAP(NA_NAME_)};
static const char *const ctr_names[NA_AMP_CTR_COUNT] = {NA_AMP_CTR_MAP(NA_NAME_)};
#undef NA_NAME_

struct na_grad_scaler {
    bool enabled;
    bool scaled; /* scale() has been called: PyTorch's _scale exists */
    na_device device;
    na_tensor *scale;                         /* f32 0-dim */
    na_tensor *counters;                      /* i32 [NA_AMP_CTR_COUNT] */
    na_tensor *ctr_view[NA_AMP_CTR_COUNT];    /* i32 0-dim views of the counters */
    na_tensor *kind;                          /* i32 0-dim, CPU */
    na_tensor *hp[HP_STATE];                  /* f64 0-dim, CPU, indexed NA_AMP_HP_* */
    bool listed; /* the state was handed out (and maybe loaded): check it at the next scale() */
    int n_recs, cap_recs;
    opt_record *recs;
};

/* ---- helpers shared by the amp files --------------------------------------------------------- */

na_tensor *na_amp_persistent_view_(na_tensor *base, int64_t offset, int ndim,
                                   const int64_t *shape) {
    na_tensor *v = calloc(1, sizeof *v);
    if (!v) {
        na_set_error(NA_ENOMEM, "amp: out of host memory");
        return NULL;
    }
    v->dtype = base->dtype;
    v->device = base->device;
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++) v->shape[i] = shape[i];
    v->numel = na_shape_numel(ndim, shape);
    na_set_contiguous_strides(v);
    v->data = (char *)base->data + offset * (int64_t)na_dtype_size(base->dtype);
    v->base = base;
    v->persistent = true;
    return v;
}

static void repoint_views(na_grad_scaler *gs) {
    for (int k = 0; k < NA_AMP_CTR_COUNT; k++) {
        gs->ctr_view[k]->data = (int32_t *)gs->counters->data + k;
        gs->ctr_view[k]->device = gs->counters->device;
    }
}

/* ---- making ---------------------------------------------------------------------------------- */

const char *na_scaler_kind_name(na_scaler_kind kind) {
    static const char *names[] = {"grad_scaler", "static", "apex_legacy", "apex"};
    return (unsigned)kind < NA_AMP_KIND_COUNT ? names[kind] : "?";
}

/* The lowest scale the rules reach: min_scale, or the floor when min_scale is 0. */
static double lower_bound(double min_s) {
    return min_s > NA_GRAD_SCALER_FLOOR ? min_s : NA_GRAD_SCALER_FLOOR;
}

/* kind and its hyper-parameters hp (indexed NA_AMP_HP_*) make a valid rule. */
static int validate(const char *fn, na_scaler_kind kind, const double *hp) {
    double growth = hp[NA_AMP_HP_GROWTH], backoff = hp[NA_AMP_HP_BACKOFF];
    double interval = hp[NA_AMP_HP_INTERVAL];
    double min_s = hp[NA_AMP_HP_MIN], max_s = hp[NA_AMP_HP_MAX];
    if ((unsigned)kind >= NA_AMP_KIND_COUNT)
        return na_set_error(NA_EINVAL, "%s: unknown scaler kind %d", fn, (int)kind);
    if (!(min_s == 0.0 || (min_s >= NA_GRAD_SCALER_FLOOR && isfinite((float)min_s))) ||
        !(max_s == 0.0 || (max_s >= lower_bound(min_s) && isfinite((float)max_s))))
        return na_set_error(NA_EINVAL, "%s: min_scale must be 0 (the floor, 2^-24) or at least "
                            "the floor, and max_scale 0 (none) or at least max(min_scale, floor), "
                            "both finite in f32 (got %g, %g)", fn, min_s, max_s);
    if (kind == NA_SCALER_STATIC) return NA_OK;
    /* growth and backoff both exactly 1: a GradScaler with a fixed scale (it still skips) */
    bool fixed = kind == NA_SCALER_GRAD && growth == 1.0 && backoff == 1.0;
    if (!fixed && (!(growth > 1.0) || !isfinite(growth)))
        return na_set_error(NA_EINVAL, "%s: The growth factor must be > 1.0 (got %g; a %s "
                            "scaler with growth and backoff both 1.0 keeps a fixed scale)", fn,
                            growth, na_scaler_kind_name(NA_SCALER_GRAD));
    if (kind == NA_SCALER_GRAD && !fixed && !(backoff < 1.0 && backoff > 0.0))
        return na_set_error(NA_EINVAL, "%s: The backoff factor must be < 1.0 (and > 0; got %g; "
                            "1.0 only together with growth 1.0, a fixed scale)", fn, backoff);
    if (!(interval >= 1.0 && interval <= (double)INT32_MAX) || interval != floor(interval))
        return na_set_error(NA_EINVAL, "%s: the growth interval must be an integer in [1, 2^31) "
                            "(got %g)", fn, interval);
    return NA_OK;
}

/* A scale the scaler may hold: finite in f32, within [lower bound, max_scale]. */
static int check_bounds(const char *fn, const char *what, double s, double min_s, double max_s) {
    if (!(s > 0.0) || !isfinite((float)s))
        return na_set_error(NA_EINVAL, "%s: %s must be > 0 and finite in f32 (got %g)", fn, what,
                            s);
    if (s < lower_bound(min_s)) {
        if (min_s > 0.0)
            return na_set_error(NA_EINVAL, "%s: %s %g is below min_scale %g", fn, what, s, min_s);
        return na_set_error(NA_EINVAL, "%s: %s %g is below the floor 2^-24 "
                            "(NA_GRAD_SCALER_FLOOR)", fn, what, s);
    }
    if (max_s > 0.0 && s > max_s)
        return na_set_error(NA_EINVAL, "%s: %s %g is above max_scale %g", fn, what, s, max_s);
    return NA_OK;
}

void na_grad_scaler_free(na_grad_scaler *gs) {
    if (!gs) return;
    for (int k = 0; k < NA_AMP_CTR_COUNT; k++) na_tensor_free(gs->ctr_view[k]);
    na_tensor_free(gs->counters);
    na_tensor_free(gs->scale);
    na_tensor_free(gs->kind);
    for (int k = 0; k < HP_STATE; k++) na_tensor_free(gs->hp[k]);
    for (int i = 0; i < gs->n_recs; i++) na_tensor_free(gs->recs[i].found_inf);
    free(gs->recs);
    free(gs);
}

na_grad_scaler *na_grad_scaler_new(const na_grad_scaler_cfg *cfg) {
    const char *fn = "na_grad_scaler_new";
    na_grad_scaler_cfg c = cfg ? *cfg : (na_grad_scaler_cfg)NA_GRAD_SCALER_DEFAULTS;
    double hp[NA_AMP_HP_COUNT] = {
        [NA_AMP_HP_GROWTH] = c.growth_factor, [NA_AMP_HP_BACKOFF] = c.backoff_factor,
        [NA_AMP_HP_INTERVAL] = (double)c.growth_interval, [NA_AMP_HP_MIN] = c.min_scale,
        [NA_AMP_HP_MAX] = c.max_scale};
    if (c.enabled && validate(fn, c.kind, hp))
        return NULL; /* PyTorch checks the factors only when enabled */
    double init = c.init_scale;
    if (c.enabled && c.kind == NA_SCALER_APEX && c.max_scale > 0.0 && init > c.max_scale)
        init = c.max_scale; /* Apex: min(max_loss_scale, init_scale) */
    if (c.enabled && check_bounds(fn, "init_scale", init, c.min_scale, c.max_scale)) return NULL;
    if ((unsigned)c.device >= NA_DEVICE_COUNT) {
        na_set_error(NA_EINVAL, "%s: unknown device %d", fn, (int)c.device);
        return NULL;
    }
    na_grad_scaler *gs = calloc(1, sizeof *gs);
    if (!gs) {
        na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
        return NULL;
    }
    gs->enabled = c.enabled;
    gs->device = c.device;
    if (!gs->enabled) return gs; /* PyTorch: a disabled scaler holds no state */
    bool ok = (gs->scale = na_tensor_new(NA_DTYPE_F32, c.device, 0, NULL)) &&
              (gs->counters = na_tensor_new(NA_DTYPE_I32, c.device, NA_SHAPE(NA_AMP_CTR_COUNT))) &&
              (gs->kind = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, 0, NULL));
    for (int k = 0; ok && k < NA_AMP_CTR_COUNT; k++)
        ok = (gs->ctr_view[k] = na_amp_persistent_view_(gs->counters, k, 0, NULL)) != NULL;
    for (int k = 0; ok && k < HP_STATE; k++)
        ok = (gs->hp[k] = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, 0, NULL)) != NULL;
    if (ok) {
#define NA_INIT_(id, name, init) init,
        int32_t ctr[NA_AMP_CTR_COUNT] = {NA_AMP_CTR_MAP(NA_INIT_)};
#undef NA_INIT_
        *(int32_t *)gs->kind->data = (int32_t)c.kind;
        for (int k = 0; k < HP_STATE; k++) *(double *)gs->hp[k]->data = hp[k];
        ok = !na_fill_(gs->scale, init) && !na_copy_from_host(gs->counters, ctr);
    }
    if (!ok) {
        na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
        na_grad_scaler_free(gs);
        return NULL;
    }
    return gs;
}

/* ---- reading --------------------------------------------------------------------------------- */

bool na_grad_scaler_is_enabled(const na_grad_scaler *gs) { return gs && gs->enabled; }

static double hp_get(const na_grad_scaler *gs, int k) { return *(const double *)gs->hp[k]->data; }

/* The kernel's hyper-parameter array: the state's values and the call's new scale. */
static void hp_values(const na_grad_scaler *gs, double new_scale, double hp[NA_AMP_HP_COUNT]) {
    for (int k = 0; k < HP_STATE; k++) hp[k] = hp_get(gs, k);
    hp[NA_AMP_HP_NEW_SCALE] = new_scale;
}

na_scaler_kind na_grad_scaler_kind(const na_grad_scaler *gs) {
    /* a disabled scaler acts as a static scale of 1: it never skips a step */
    return gs && gs->enabled ? (na_scaler_kind) * (const int32_t *)gs->kind->data
                             : NA_SCALER_STATIC;
}

na_grad_scaler_cfg na_grad_scaler_config(const na_grad_scaler *gs) {
    na_grad_scaler_cfg c = {0};
    if (!gs) return c;
    c.enabled = gs->enabled;
    c.device = gs->device;
    if (!gs->enabled) return c;
    c.kind = na_grad_scaler_kind(gs);
    c.init_scale = na_grad_scaler_get_scale(gs);
    c.growth_factor = hp_get(gs, NA_AMP_HP_GROWTH);
    c.backoff_factor = hp_get(gs, NA_AMP_HP_BACKOFF);
    c.growth_interval = (int64_t)hp_get(gs, NA_AMP_HP_INTERVAL);
    c.min_scale = hp_get(gs, NA_AMP_HP_MIN);
    c.max_scale = hp_get(gs, NA_AMP_HP_MAX);
    return c;
}

double na_grad_scaler_get_scale(const na_grad_scaler *gs) {
    if (!gs || !gs->enabled) return 1.0;
    return na_item(gs->scale);
}

const na_tensor *na_grad_scaler_scale_tensor(const na_grad_scaler *gs) {
    return gs && gs->enabled ? gs->scale : NULL;
}

const na_tensor *na_grad_scaler_found_inf(const na_grad_scaler *gs, const na_optim *opt) {
    for (int i = 0; gs && i < gs->n_recs; i++)
        if (gs->recs[i].opt == opt) return gs->recs[i].found_inf;
    return NULL;
}

int na_grad_scaler_stats_get(const na_grad_scaler *gs, na_grad_scaler_stats *out) {
    if (!gs || !out) return na_set_error(NA_EINVAL, "na_grad_scaler_stats_get: NULL argument");
    *out = (na_grad_scaler_stats){.scale = 1.0, .last_overflow_iter = -1};
    if (!gs->enabled) return NA_OK;
    int32_t ctr[NA_AMP_CTR_COUNT];
    int rc = na_copy_to_host(gs->counters, ctr);
    if (rc) return rc;
    out->scale = na_item(gs->scale);
    out->growth_tracker = ctr[NA_AMP_CTR_TRACKER];
    out->last_overflow_iter = ctr[NA_AMP_CTR_LAST_OVERFLOW];
    out->updates = ctr[NA_AMP_CTR_UPDATES];
    out->skipped = ctr[NA_AMP_CTR_SKIPPED];
    return NA_OK;
}

na_device na_grad_scaler_device_(const na_grad_scaler *gs) { return gs->device; }

double na_grad_scaler_floor_(const na_grad_scaler *gs) {
    return gs && gs->enabled ? lower_bound(hp_get(gs, NA_AMP_HP_MIN)) : NA_GRAD_SCALER_FLOOR;
}

int na_grad_scaler_to_device_(na_grad_scaler *gs, na_device dev) {
    if (!gs->enabled || gs->device == dev) {
        gs->device = dev;
        return NA_OK;
    }
    int rc = na_tensor_convert_(gs->scale, NA_DTYPE_F32, dev);
    if (!rc) rc = na_tensor_convert_(gs->counters, NA_DTYPE_I32, dev);
    for (int i = 0; !rc && i < gs->n_recs; i++)
        rc = na_tensor_convert_(gs->recs[i].found_inf, NA_DTYPE_F32, dev);
    repoint_views(gs);
    if (!rc) gs->device = dev;
    return rc;
}

/* After the state was handed out: the rule and the scale must be valid (a loaded checkpoint
 * is hostile input). Reads the scale once (a sync on CUDA). */
static int check_listed(const char *fn, na_grad_scaler *gs) {
    if (!gs->listed) return NA_OK;
    double hp[NA_AMP_HP_COUNT];
    hp_values(gs, 0.0, hp);
    int rc = validate(fn, na_grad_scaler_kind(gs), hp);
    if (!rc)
        rc = check_bounds(fn, "the scale", na_item(gs->scale), hp[NA_AMP_HP_MIN],
                          hp[NA_AMP_HP_MAX]);
    if (rc) return na_set_error(rc, "%s (the scaler's state as loaded or set)", na_last_error());
    gs->listed = false;
    return NA_OK;
}

/* ---- the step -------------------------------------------------------------------------------- */

static int check_scaled(const char *fn, const na_grad_scaler *gs) {
    if (!gs->scaled)
        return na_set_error(NA_ESTATE, "%s: Attempted %s but _scale is None.  This may indicate "
                            "your script did not use scaler.scale(loss or outputs) earlier in the "
                            "iteration.", fn, strstr(fn, "unscale_") ? "unscale_"
                                              : strstr(fn, "step") ? "step" : "update");
    return NA_OK;
}

static opt_record *record_of(na_grad_scaler *gs, const na_optim *opt) {
    for (int i = 0; i < gs->n_recs; i++)
        if (gs->recs[i].opt == opt) return &gs->recs[i];
    if (gs->n_recs == gs->cap_recs) {
        int cap = gs->cap_recs ? 2 * gs->cap_recs : 4;
        opt_record *r = realloc(gs->recs, (size_t)cap * sizeof *r);
        if (!r) {
            na_set_error(NA_ENOMEM, "na_grad_scaler: out of host memory");
            return NULL;
        }
        gs->recs = r, gs->cap_recs = cap;
    }
    na_tensor *f = na_tensor_new(NA_DTYPE_F32, gs->device, 0, NULL);
    if (!f) return NULL;
    gs->recs[gs->n_recs] = (opt_record){.opt = opt, .st = STAGE_READY, .found_inf = f};
    return &gs->recs[gs->n_recs++];
}

/* opt's record for unscale_ or step, once the loss was scaled; NULL with an error. */
static opt_record *scaled_record(const char *fn, na_grad_scaler *gs, const na_optim *opt) {
    return check_scaled(fn, gs) ? NULL : record_of(gs, opt);
}

na_tensor *na_grad_scaler_scale(na_grad_scaler *gs, na_tensor *loss) {
    const char *fn = "na_grad_scaler_scale";
    char d[NA_DESCRIBE_MAX];
    if (!gs || !na_check_float(fn, loss, "loss")) {
        if (!gs) na_set_error(NA_EINVAL, "%s: NULL scaler", fn);
        return NULL;
    }
    if (!gs->enabled) return loss;
    if (check_listed(fn, gs)) return NULL;
    if (loss->device != gs->device) {
        for (int i = 0; i < gs->n_recs; i++)
            if (gs->recs[i].st != STAGE_READY) {
                na_set_error(NA_EDEVICE, "%s: loss %s is not on the scaler's device (%s) in the "
                             "middle of a step", fn, na_tensor_describe(loss, d, sizeof d),
                             na_device_name(gs->device));
                return NULL;
            }
        if (na_grad_scaler_to_device_(gs, loss->device)) return NULL;
    }
    gs->scaled = true;
    na_tensor *l = na_cast(loss, NA_DTYPE_F32);
    return l ? na_mul(l, gs->scale) : NULL;
}

int na_grad_scaler_unscale_into_(na_grad_scaler *gs, int n, const na_view *const *in,
                                 na_view *const *out, na_tensor *found_inf) {
    const na_backend *be = na_backend_get(gs->device);
    if (!be) return na_last_status();
    int rc = NA_BACKEND_NEED(be, amp_unscale);
    if (!rc) rc = na_grad_settle(); /* a marked gradient reads (or is written over) as zeros */
    /* disabled: a scale of 1 (the copy and the inf/NaN check still happen) */
    const na_tensor *scale = gs->enabled ? gs->scale : na_scalar(NA_DTYPE_F32, gs->device, 1.0);
    if (!rc && !scale) rc = na_last_status();
    if (!rc && found_inf) rc = be->fill(&found_inf->view, 0.0);
    if (!rc && n) rc = be->amp_unscale(n, in, out, &scale->view, NA_VIEW_OF(found_inf));
    return rc;
}

int na_grad_scaler_unscale_(na_grad_scaler *gs, na_optim *opt) {
    const char *fn = "na_grad_scaler_unscale_";
    char d[NA_DESCRIBE_MAX];
    if (!gs || !opt) return na_set_error(NA_EINVAL, "%s: NULL scaler or optimizer", fn);
    if (!gs->enabled) return NA_OK;
    opt_record *r = scaled_record(fn, gs, opt);
    if (!r) return na_last_status();
    if (r->st == STAGE_UNSCALED)
        return na_set_error(NA_ESTATE, "%s: unscale_() has already been called on this optimizer "
                            "since the last update().", fn);
    if (r->st == STAGE_STEPPED)
        return na_set_error(NA_ESTATE, "%s: unscale_() is being called after step().", fn);
    int64_t np = na_optim_num_params(opt);
    na_view **grads = na_arena_host_alloc((size_t)(np ? np : 1) * sizeof *grads);
    if (!grads) return na_last_status();
    int count = 0;
    for (int64_t i = 0; i < np; i++) {
        na_tensor *g = na_optim_param(opt, i)->grad;
        if (!g) continue;
        if (g->dtype == NA_DTYPE_F16)
            return na_set_error(NA_EDTYPE, "%s: Attempting to unscale FP16 gradients. (parameter "
                                "%" PRId64 " is %s: native AMP keeps f32 parameters; for an f16 "
                                "model use na_fp16_optimizer)", fn, i,
                                na_tensor_describe(g, d, sizeof d));
        if (g->device != gs->device || !na_is_contiguous(g) || !na_dtype_is_float(g->dtype))
            return na_set_error(NA_EDEVICE, "%s: gradient of parameter %" PRId64 " is %s; expected "
                                "a contiguous float tensor on the scaler's device (%s)", fn, i,
                                na_tensor_describe(g, d, sizeof d), na_device_name(gs->device));
        grads[count++] = &g->view;
    }
    int rc = na_grad_scaler_unscale_into_(gs, count, (const na_view *const *)grads, grads,
                                          r->found_inf);
    if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    r->st = STAGE_UNSCALED;
    return NA_OK;
}

int na_grad_scaler_step(na_grad_scaler *gs, na_optim *opt) {
    const char *fn = "na_grad_scaler_step";
    if (!gs || !opt) return na_set_error(NA_EINVAL, "%s: NULL scaler or optimizer", fn);
    if (!gs->enabled) return na_optim_step(opt, NULL);
    opt_record *r = scaled_record(fn, gs, opt);
    if (!r) return na_last_status();
    int rc = NA_OK;
    if (r->st == STAGE_STEPPED)
        return na_set_error(NA_ESTATE, "%s: step() has already been called since the last "
                            "update().", fn);
    if (r->st == STAGE_READY && (rc = na_grad_scaler_unscale_(gs, opt))) return rc;
    bool never_skips = na_grad_scaler_kind(gs) == NA_SCALER_STATIC;
    na_optim_step_opts o = {.found_inf = never_skips ? NULL : r->found_inf};
    rc = na_optim_step(opt, &o);
    if (rc) return rc;
    r->st = STAGE_STEPPED;
    return NA_OK;
}

static int update(na_grad_scaler *gs, int n_found, const na_view *const *flags,
                  double new_scale) {
    const char *fn = "na_grad_scaler_update";
    na_scaler_kind kind = na_grad_scaler_kind(gs);
    double hp[NA_AMP_HP_COUNT];
    hp_values(gs, new_scale, hp);
    int rc = validate(fn, kind, hp);
    if (rc) return rc; /* e.g. values set through the state list since the last scale() */
    const na_backend *be = na_backend_get(gs->device);
    if (!be) return na_last_status();
    if ((rc = NA_BACKEND_NEED(be, amp_update_scale)))
        return na_set_error(rc, "%s: %s", fn, na_last_error());
    return be->amp_update_scale((int)kind, hp, &gs->scale->view, &gs->counters->view, n_found,
                                flags);
}

int na_grad_scaler_update_from_(na_grad_scaler *gs, int n_found, const na_view *const *flags) {
    return gs->enabled ? update(gs, n_found, flags, 0.0) : NA_OK;
}

static int update_common(const char *fn, na_grad_scaler *gs, double new_scale) {
    if (!gs) return na_set_error(NA_EINVAL, "%s: NULL scaler", fn);
    if (!gs->enabled) return NA_OK;
    int rc = check_scaled(fn, gs);
    if (rc) return rc;
    const na_view **flags = na_arena_host_alloc((size_t)(gs->n_recs ? gs->n_recs : 1) *
                                                  sizeof *flags);
    if (!flags) return na_last_status();
    int n = 0;
    for (int i = 0; i < gs->n_recs; i++)
        if (gs->recs[i].st != STAGE_READY) flags[n++] = &gs->recs[i].found_inf->view;
    if (!n && !(new_scale > 0.0))
        return na_set_error(NA_ESTATE, "%s: No inf checks were recorded prior to update() (call "
                            "na_grad_scaler_step for each optimizer first).", fn);
    rc = update(gs, n, flags, new_scale);
    if (rc) return rc;
    for (int i = 0; i < gs->n_recs; i++) gs->recs[i].st = STAGE_READY;
    return NA_OK;
}

int na_grad_scaler_update(na_grad_scaler *gs) {
    return update_common("na_grad_scaler_update", gs, 0.0);
}

int na_grad_scaler_update_to(na_grad_scaler *gs, double new_scale) {
    const char *fn = "na_grad_scaler_update_to";
    bool bounded = gs && gs->enabled;
    int rc = check_bounds(fn, "the new scale", new_scale,
                          bounded ? hp_get(gs, NA_AMP_HP_MIN) : 0.0,
                          bounded ? hp_get(gs, NA_AMP_HP_MAX) : 0.0);
    return rc ? rc : update_common(fn, gs, new_scale);
}

/* ---- state ----------------------------------------------------------------------------------- */

int na_grad_scaler_state(na_grad_scaler *gs, const char *prefix, na_named_tensors *out) {
    const char *fn = "na_grad_scaler_state";
    if (!gs || !out) return na_set_error(NA_EINVAL, "%s: NULL scaler or output", fn);
    for (int i = 0; i < gs->n_recs; i++)
        if (gs->recs[i].st != STAGE_READY)
            return na_set_error(NA_ESTATE, "%s: the state may only be taken at the beginning of "
                                "an iteration, or at the end after update()", fn);
    if (!gs->enabled) return NA_OK;
    const char *pf = prefix ? prefix : "";
    int64_t n0 = out->n;
    int rc = na_named_tensors_add(out, gs->scale, "%sscale", pf);
    for (int k = 0; !rc && k < NA_AMP_CTR_COUNT; k++)
        rc = na_named_tensors_add(out, gs->ctr_view[k], "%s%s", pf, ctr_names[k]);
    if (!rc) rc = na_named_tensors_add(out, gs->kind, "%skind", pf);
    for (int k = 0; !rc && k < HP_STATE; k++)
        rc = na_named_tensors_add(out, gs->hp[k], "%s%s", pf, hp_names[k]);
    if (rc) na_named_tensors_truncate(out, n0);
    else gs->listed = true;
    return rc;
}
