/* fp32 master weights: Apex's FP16_Optimizer around any nanoamp optimizer, and the fp16util
 * helpers for users who manage master weights themselves.
 *
 * The wrapped optimizer's parameters are the f32 masters (or the model's own f32 parameters,
 * or one flat f32 buffer per group). A step is three device passes and no host round trip:
 *   update_master_grads: one fused amp_unscale from the model's f16 gradients into the f32
 *     master gradients (and in place for f32 parameters), with the overflow flag;
 *   step: the scaler's update kernel (once per step, as Apex's step(): bringing the master
 *     gradients up to date twice in one iteration counts once), then the optimizer kernel
 *     with found_inf (skips on the device) and copies = the f16 parameters (each updated
 *     master is rounded into its model parameter in the same pass); with a flat master, one
 *     copy pass from the flat buffer's views instead. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/amp/amp_internal.h"
#include "src/tensor/tensor_internal.h"

typedef struct {
    na_tensor *model;       /* the model's parameter (not owned) */
    na_tensor *master;      /* its f32 value: model itself, an owned copy, or a flat view */
    na_tensor *master_grad; /* the f32 gradient the unscale writes (master->grad, or for f32
                               parameters their own) */
    bool owned;             /* master (and master_grad, its .grad) allocated here */
    bool flat_view;         /* master is a persistent view into a flat buffer, and its
                               grad the same slice of the flat gradient */
    int64_t opt_index;      /* the optimizer parameter holding its value */
} fp_param;

struct na_fp16_optimizer {
    na_optim *opt;
    na_grad_scaler *scaler;
    bool flat_master, verbose;
    bool have_device;
    na_device device;
    int64_t n;
    fp_param *ps;
    int n_flats;
    na_tensor **flats; /* owned flat masters, with their .grad */
    na_tensor *found_inf; /* f32 0-dim: the last update_master_grads' overflow flag */
    bool grads_fresh;     /* update_master_grads ran since the last step */
    /* per optimizer parameter (in the optimizer's order), rebuilt when groups are added */
    int64_t n_opt;
    na_tensor **opt_grads, **opt_copies;
};

/* ---- making ---------------------------------------------------------------------------------- */

void na_fp16_optimizer_free(na_fp16_optimizer *fo) {
    if (!fo) return;
    for (int64_t i = 0; i < fo->n; i++) {
        fp_param *p = &fo->ps[i];
        if (p->owned || p->flat_view) na_tensor_free(p->master); /* and its grad */
    }
    for (int k = 0; k < fo->n_flats; k++) na_tensor_free(fo->flats[k]);
    na_optim_free(fo->opt);
    na_grad_scaler_free(fo->scaler);
    na_tensor_free(fo->found_inf);
    free(fo->ps);
    free(fo->flats);
    free(fo->opt_grads);
    free(fo->opt_copies);
    free(fo);
}

na_fp16_optimizer *na_fp16_optimizer_new(na_optim *opt, na_tensor_list params,
                                         const na_fp16_optimizer_cfg *cfg) {
    const char *fn = "na_fp16_optimizer_new";
    if (opt && na_tensor_list_check(fn, params)) {
        na_optim_free(opt);
        return NULL;
    }
    if (!opt) {
        na_set_error(na_last_status() ? na_last_status() : NA_EINVAL, "%s: NULL optimizer (%s)",
                     fn, na_last_error());
        return NULL;
    }
    if (na_optim_num_params(opt) != 0) {
        na_set_error(NA_EINVAL, "%s: the optimizer already holds %" PRId64 " parameters; make it "
                     "without any (na_sgd_new(NA_NO_TENSORS, &cfg)): the fp16 optimizer adds the "
                     "f32 master weights as its parameters", fn, na_optim_num_params(opt));
        na_optim_free(opt);
        return NULL;
    }
    na_fp16_optimizer_cfg c = cfg ? *cfg : (na_fp16_optimizer_cfg)NA_FP16_OPTIMIZER_DEFAULTS;
    na_fp16_optimizer *fo = calloc(1, sizeof *fo);
    if (!fo) {
        na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
        na_optim_free(opt);
        return NULL;
    }
    fo->opt = opt;
    fo->flat_master = c.flat_master;
    fo->verbose = c.verbose;
    if (!(fo->scaler = na_grad_scaler_new(&c.scaler))) {
        na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
        na_fp16_optimizer_free(fo);
        return NULL;
    }
    if (params.n && na_fp16_optimizer_add_group(fo, params) < 0) {
        na_fp16_optimizer_free(fo);
        return NULL;
    }
    return fo;
}

static int grow(void **p, size_t elem, int64_t count) {
    void *q = realloc(*p, (size_t)(count ? count : 1) * elem);
    if (!q) return na_set_error(NA_ENOMEM, "na_fp16_optimizer_add_group: out of host memory");
    *p = q;
    return NA_OK;
}

/* An f32 persistent leaf that requires grad, with a zeroed persistent gradient. */
static na_tensor *new_master(na_device dev, int ndim, const int64_t *shape) {
    na_tensor *m = na_tensor_new(NA_DTYPE_F32, dev, ndim, shape);
    if (!m) return NULL;
    if (na_tensor_set_requires_grad(m, true) ||
        !(m->grad = na_tensor_new(NA_DTYPE_F32, dev, ndim, shape))) {
        na_tensor_free(m);
        return NULL;
    }
    return m;
}

static int check_param(const char *fn, na_fp16_optimizer *fo, const na_tensor *p, int64_t i) {
    char d[NA_DESCRIBE_MAX];
    if (!p || !p->persistent || !na_dtype_is_float(p->dtype) || p->dtype == NA_DTYPE_F64 ||
        !p->requires_grad || p->grad_fn || !na_is_contiguous(p))
        return na_set_error(NA_EINVAL, "%s: parameter %" PRId64 " (%s) must be a persistent, "
                            "contiguous f32/f16/bf16 leaf that requires grad", fn, i,
                            na_tensor_describe(p, d, sizeof d));
    if (fo->have_device && p->device != fo->device)
        return na_set_error(NA_EDEVICE, "%s: parameter %" PRId64 " is on %s, the others on %s",
                            fn, i, na_device_name(p->device), na_device_name(fo->device));
    for (int64_t k = 0; k < fo->n; k++)
        if (fo->ps[k].model == p)
            return na_set_error(NA_EINVAL, "%s: parameter %" PRId64 " is already in the fp16 "
                                "optimizer", fn, i);
    return NA_OK;
}

int na_fp16_optimizer_add_group(na_fp16_optimizer *fo, na_tensor_list list) {
    const char *fn = "na_fp16_optimizer_add_group";
    int64_t n = list.n;
    na_tensor *const *params = list.items;
    if (!fo) return na_set_error(NA_EINVAL, "%s: NULL fp16 optimizer", fn);
    if (na_tensor_list_check(fn, list)) return na_last_status();
    for (int64_t i = 0; i < n; i++) {
        int rc = check_param(fn, fo, params[i], i);
        if (rc) return rc;
        for (int64_t k = 0; k < i; k++)
            if (params[k] == params[i])
                return na_set_error(NA_EINVAL, "%s: parameter %" PRId64 " appears twice", fn, i);
        if (!fo->have_device) {
            fo->have_device = true;
            fo->device = params[i]->device;
        }
    }
    if (!n) return na_optim_add_group(fo->opt, NA_NO_TENSORS);
    if (!fo->found_inf) {
        if (!(fo->found_inf = na_tensor_new(NA_DTYPE_F32, fo->device, 0, NULL)) ||
            na_grad_scaler_to_device_(fo->scaler, fo->device))
            return na_last_status();
    }
    int rc = grow((void **)&fo->ps, sizeof(fp_param), fo->n + n);
    na_tensor **group = rc ? NULL : malloc((size_t)(n + 1) * sizeof *group);
    if (!rc && !group) rc = na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
    if (rc) return rc;
    int64_t first_opt = na_optim_num_params(fo->opt), n_group = 0, made = 0;
    na_tensor *flat = NULL;
    int64_t flat_numel = 0;
    for (int64_t i = 0; i < n; i++)
        if (params[i]->dtype != NA_DTYPE_F32) flat_numel += params[i]->numel;
    bool use_flat = fo->flat_master && flat_numel > 0;
    if (use_flat) {
        rc = grow((void **)&fo->flats, sizeof *fo->flats, fo->n_flats + 1);
        if (!rc && !(flat = new_master(fo->device, NA_SHAPE(flat_numel)))) rc = na_last_status();
        if (!rc) group[n_group++] = flat;
    }
    int64_t off = 0;
    for (; made < n && !rc; made++) {
        na_tensor *p = params[made];
        fp_param *fp = &fo->ps[fo->n + made];
        *fp = (fp_param){.model = p};
        if (p->dtype == NA_DTYPE_F32) { /* used directly: its own gradient is unscaled in place */
            fp->master = p;
            fp->opt_index = first_opt + n_group;
            group[n_group++] = p;
        } else if (use_flat) {
            fp->flat_view = true;
            fp->opt_index = first_opt;
            fp->master = na_amp_persistent_view_(flat, off, p->ndim, p->shape);
            fp->master_grad = fp->master ? na_amp_persistent_view_(flat->grad, off, p->ndim,
                                                                   p->shape) : NULL;
            if (fp->master) fp->master->grad = fp->master_grad;
            if (!fp->master_grad || na_copy_(fp->master, p)) {
                rc = na_last_status();
                na_tensor_free(fp->master);
                break;
            }
            off += p->numel;
        } else {
            fp->owned = true;
            fp->opt_index = first_opt + n_group;
            if (!(fp->master = new_master(fo->device, p->ndim, p->shape)) ||
                na_copy_(fp->master, p)) {
                rc = na_last_status();
                na_tensor_free(fp->master);
                break;
            }
            fp->master_grad = fp->master->grad;
            group[n_group++] = fp->master;
        }
    }
    if (!rc) rc = grow((void **)&fo->opt_grads, sizeof(void *), first_opt + n_group);
    if (!rc) rc = grow((void **)&fo->opt_copies, sizeof(void *), first_opt + n_group);
    int g = rc ? rc : na_optim_add_group(fo->opt, (na_tensor_list){n_group, group});
    free(group);
    if (g >= 0) fo->n_opt = first_opt + n_group;
    if (g < 0) { /* roll back this group (the optimizer added nothing when it failed) */
        for (int64_t i = 0; i < made; i++) {
            fp_param *fp = &fo->ps[fo->n + i];
            if (fp->owned || fp->flat_view) na_tensor_free(fp->master); /* and its grad */
        }
        na_tensor_free(flat);
        return na_set_error(g, "%s: %s", fn, na_last_error());
    }
    fo->n += n;
    if (flat) fo->flats[fo->n_flats++] = flat;
    return g;
}

/* ---- the step -------------------------------------------------------------------------------- */

int na_fp16_optimizer_update_master_grads(na_fp16_optimizer *fo) {
    const char *fn = "na_fp16_optimizer_update_master_grads";
    if (!fo) return na_set_error(NA_EINVAL, "%s: NULL fp16 optimizer", fn);
    if (!fo->found_inf) return na_set_error(NA_ESTATE, "%s: no parameters were added", fn);
    na_view **in = na_arena_host_alloc((size_t)fo->n * sizeof *in);
    na_view **out = in ? na_arena_host_alloc((size_t)fo->n * sizeof *out) : NULL;
    if (!out) return na_last_status();
    int count = 0, rc = NA_OK;
    for (int64_t i = 0; i < fo->n && !rc; i++) {
        fp_param *p = &fo->ps[i];
        na_tensor *g = p->model->grad;
        if (!g) { /* no gradient: a flat buffer's slice is zeroed; others are skipped */
            if (p->flat_view) rc = na_fill_(p->master_grad, 0.0);
            continue;
        }
        in[count] = &g->view;
        out[count++] = p->master == p->model ? &g->view : &p->master_grad->view;
    }
    if (!rc) rc = na_grad_scaler_unscale_into_(fo->scaler, count, (const na_view *const *)in,
                                               out, fo->found_inf);
    if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    fo->grads_fresh = true;
    return NA_OK;
}

int na_fp16_optimizer_backward(na_fp16_optimizer *fo, na_tensor *loss, bool update_master_grads) {
    const char *fn = "na_fp16_optimizer_backward";
    if (!fo) return na_set_error(NA_EINVAL, "%s: NULL fp16 optimizer", fn);
    na_tensor *scaled = na_grad_scaler_scale(fo->scaler, loss);
    if (!scaled) return na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
    int rc = na_backward(scaled, NULL);
    if (rc) return rc;
    return update_master_grads ? na_fp16_optimizer_update_master_grads(fo) : NA_OK;
}

bool na_fp16_optimizer_overflow(const na_fp16_optimizer *fo) {
    return fo && fo->found_inf && na_item(fo->found_inf) != 0.0;
}

int na_fp16_optimizer_step(na_fp16_optimizer *fo) {
    const char *fn = "na_fp16_optimizer_step";
    if (!fo) return na_set_error(NA_EINVAL, "%s: NULL fp16 optimizer", fn);
    if (!fo->grads_fresh)
        return na_set_error(NA_ESTATE, "%s: the master gradients are not up to date: call "
                            "na_fp16_optimizer_backward(fo, loss, true), or "
                            "na_fp16_optimizer_update_master_grads after backward(..., false)", fn);
    bool never_skips = na_grad_scaler_kind(fo->scaler) == NA_SCALER_STATIC;
    const na_view *flag = &fo->found_inf->view;
    int rc = na_grad_scaler_update_from_(fo->scaler, 1, &flag);
    if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    if (fo->verbose && !never_skips && na_fp16_optimizer_overflow(fo))
        printf("Gradient overflow.  Skipping step, reducing loss scale to %g\n",
               na_grad_scaler_get_scale(fo->scaler));
    for (int64_t i = 0; i < fo->n_opt; i++) fo->opt_grads[i] = NULL, fo->opt_copies[i] = NULL;
    for (int64_t i = 0; i < fo->n; i++) {
        fp_param *p = &fo->ps[i];
        if (p->flat_view) { /* the flat buffer's gradient is complete (missing slices zeroed) */
            fo->opt_grads[p->opt_index] = na_optim_param(fo->opt, p->opt_index)->grad;
            continue;
        }
        if (!p->model->grad) continue;
        fo->opt_grads[p->opt_index] = p->master == p->model ? p->model->grad : p->master_grad;
        if (p->owned) fo->opt_copies[p->opt_index] = p->model;
    }
    na_optim_step_opts o = {.found_inf = never_skips ? NULL : fo->found_inf,
                            .grads = fo->opt_grads, .copies = fo->opt_copies};
    rc = na_optim_step(fo->opt, &o);
    for (int64_t i = 0; i < fo->n && !rc; i++) /* flat: masters -> model (a no-op if skipped) */
        if (fo->ps[i].flat_view) rc = na_copy_(fo->ps[i].model, fo->ps[i].master);
    if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    fo->grads_fresh = false;
    return NA_OK;
}

double na_fp16_optimizer_clip_master_grads(na_fp16_optimizer *fo, double max_norm) {
    const char *fn = "na_fp16_optimizer_clip_master_grads";
    if (!fo || !fo->found_inf) {
        na_set_error(NA_EINVAL, "%s: no fp16 optimizer or no parameters", fn);
        return NAN;
    }
    if (na_fp16_optimizer_overflow(fo)) return -1.0;
    na_tensor *norm = na_optim_clip_grad_norm(fo->opt, max_norm);
    return norm ? na_item(norm) : NAN;
}

int na_fp16_optimizer_zero_grad(na_fp16_optimizer *fo) {
    if (!fo) return na_set_error(NA_EINVAL, "na_fp16_optimizer_zero_grad: NULL fp16 optimizer");
    for (int64_t i = 0; i < fo->n; i++) {
        int rc = na_tensor_zero_grad(fo->ps[i].model);
        if (rc) return rc;
    }
    return na_optim_zero_grad(fo->opt);
}

/* ---- inspecting and saving ------------------------------------------------------------------- */

na_optim *na_fp16_optimizer_optim(const na_fp16_optimizer *fo) { return fo ? fo->opt : NULL; }
na_grad_scaler *na_fp16_optimizer_scaler(const na_fp16_optimizer *fo) {
    return fo ? fo->scaler : NULL;
}
int64_t na_fp16_optimizer_num_params(const na_fp16_optimizer *fo) { return fo ? fo->n : 0; }
na_tensor *na_fp16_optimizer_model_param(const na_fp16_optimizer *fo, int64_t i) {
    return fo && i >= 0 && i < fo->n ? fo->ps[i].model : NULL;
}
na_tensor *na_fp16_optimizer_master(const na_fp16_optimizer *fo, int64_t i) {
    return fo && i >= 0 && i < fo->n ? fo->ps[i].master : NULL;
}

int na_fp16_optimizer_state(na_fp16_optimizer *fo, const char *prefix, na_named_tensors *out) {
    const char *fn = "na_fp16_optimizer_state";
    if (!fo || !out) return na_set_error(NA_EINVAL, "%s: NULL fp16 optimizer or output", fn);
    const char *pf = prefix ? prefix : "";
    int64_t n0 = out->n;
    char *sub = malloc(strlen(pf) + sizeof "optimizer.");
    if (!sub) return na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
    int rc = na_optim_state(fo->opt, strcat(strcpy(sub, pf), "optimizer."), out);
    if (!rc) rc = na_grad_scaler_state(fo->scaler, strcat(strcpy(sub, pf), "scaler."), out);
    free(sub);
    int64_t k = 0;
    for (int64_t i = 0; !rc && i < fo->n; i++)
        if (fo->ps[i].owned)
            rc = na_named_tensors_add(out, fo->ps[i].master, "%sfp32_from_fp16.%" PRId64, pf, k++);
    for (int g = 0; !rc && g < fo->n_flats; g++)
        rc = na_named_tensors_add(out, fo->flats[g], "%sfp32_from_fp16_flat.%d", pf, g);
    if (rc) na_named_tensors_truncate(out, n0);
    return rc;
}

/* ---- fp16util -------------------------------------------------------------------------------- */

/* A step view of `count` elements of base from `off`, shaped as like. */
static na_tensor *slice_view(na_tensor *base, int64_t off, const na_tensor *like) {
    na_tensor *v = na_tensor_header(base->dtype, base->device, like->ndim, like->shape);
    if (!v) return NULL;
    v->data = (char *)base->data + off * (int64_t)na_dtype_size(base->dtype);
    v->base = base;
    return v;
}

void na_param_lists_free(na_param_lists *pl) {
    if (!pl) return;
    for (int64_t i = 0; pl->master && i < pl->n_master; i++) na_tensor_free(pl->master[i]);
    free(pl->master);
    free(pl->model);
    *pl = (na_param_lists){0};
}

/* Model parameter i's master value (or gradient): its own master, or its slice (from element
 * off) of the flat one. NULL with an error on failure. */
static na_tensor *master_at(const na_param_lists *pl, int64_t i, int64_t off, bool grad) {
    na_tensor *m = pl->master[pl->flat ? 0 : i];
    if (grad) m = m->grad;
    return pl->flat ? slice_view(m, off, pl->model[i]) : m;
}

int na_prep_param_lists(na_module *model, bool flat, na_param_lists *out) {
    const char *fn = "na_prep_param_lists";
    char a[NA_DESCRIBE_MAX], b[NA_DESCRIBE_MAX];
    if (!out) return na_set_error(NA_EINVAL, "%s: NULL output", fn);
    *out = (na_param_lists){.flat = flat};
    if (!model) return na_set_error(NA_EINVAL, "%s: NULL model", fn);
    na_tensor_list l = na_module_parameters(model);
    if (l.n < 0) return na_last_status();
    out->model = malloc((size_t)(l.n ? l.n : 1) * sizeof *out->model);
    out->master = calloc((size_t)(l.n ? l.n : 1), sizeof *out->master);
    int rc = out->model && out->master ? NA_OK
                                       : na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
    int64_t total = 0;
    for (int64_t i = 0; !rc && i < l.n; i++) {
        na_tensor *p = l.items[i];
        if (flat && out->n_model && (p->dtype != out->model[0]->dtype ||
                                     p->device != out->model[0]->device))
            rc = na_set_error(NA_EDTYPE, "%s: a flat master needs every parameter to have one "
                              "dtype and device (as Apex: convert the model first): parameter "
                              "%" PRId64 " (%s) is %s, the first is %s", fn, i,
                              p->name ? p->name : "", na_tensor_describe(p, a, sizeof a),
                              na_tensor_describe(out->model[0], b, sizeof b));
        out->model[out->n_model++] = p;
        total += p->numel;
    }
    if (!rc && flat && out->n_model) {
        out->n_master = 1;
        if (!(out->master[0] = new_master(out->model[0]->device, NA_SHAPE(total))))
            rc = na_last_status();
    }
    for (int64_t i = 0; !rc && !flat && i < out->n_model; i++) {
        const na_tensor *p = out->model[i];
        out->n_master = i + 1;
        if (!(out->master[i] = new_master(p->device, p->ndim, p->shape))) rc = na_last_status();
    }
    for (int64_t i = 0, off = 0; !rc && i < out->n_model; off += out->model[i++]->numel) {
        na_tensor *m = master_at(out, i, off, false); /* the model's values into it */
        rc = m ? na_copy_(m, out->model[i]) : na_last_status();
    }
    if (rc) na_param_lists_free(out);
    return rc;
}

int na_model_grads_to_master_grads(na_param_lists *pl) {
    if (!pl) return na_set_error(NA_EINVAL, "na_model_grads_to_master_grads: NULL lists");
    int rc = na_grad_settle(); /* gradients zero_grad marked read as zeros */
    for (int64_t i = 0, off = 0; i < pl->n_model && !rc; off += pl->model[i++]->numel) {
        const na_tensor *g = pl->model[i]->grad;
        na_tensor *dst = master_at(pl, i, off, true);
        rc = !dst ? na_last_status() : g ? na_copy_(dst, g) : na_fill_(dst, 0.0);
    }
    return rc;
}

int na_master_params_to_model_params(na_param_lists *pl) {
    if (!pl) return na_set_error(NA_EINVAL, "na_master_params_to_model_params: NULL lists");
    int rc = NA_OK;
    for (int64_t i = 0, off = 0; i < pl->n_model && !rc; off += pl->model[i++]->numel) {
        na_tensor *src = master_at(pl, i, off, false);
        rc = src ? na_copy_(pl->model[i], src) : na_last_status();
    }
    return rc;
}
