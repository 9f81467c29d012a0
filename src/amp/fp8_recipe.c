/* FP8 per-tensor scaling: Transformer Engine's delayed and current recipes (nanoamp/fp8.h has
 * the rules). Host only: the state is four small f32/f64 CPU tensors, which are also its state
 * list, so a checkpoint saves and loads them as they are. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/autocast.h"
#include "nanoamp/autograd.h"
#include "nanoamp/fp8.h"
#include "nanoamp/ops.h"

#define NA_FP8_MARGIN_MAX 64 /* beyond it 2^-margin * 448 nears f32's subnormals: scale 0 */

struct na_fp8_scaling {
    na_fp8_recipe_cfg cfg;
    int64_t len;                         /* history rows */
    na_tensor *history, *scale, *scale_inv, *updates; /* [len, 3], [3], [3] f32; 0-dim f64 */
    float *h, *sc, *si;                  /* their data */
    double *n;
    int64_t saturated[NA_FP8_ROLE_COUNT], saturated_total[NA_FP8_ROLE_COUNT]; /* not state */
};

double na_fp8_format_max(na_fp8_format f) {
    return f == NA_FP8_E4M3 ? NA_FP8_E4M3_MAX : f == NA_FP8_E5M2 ? NA_FP8_E5M2_MAX : NAN;
}

int na_fp8_format_dtype(na_fp8_format f) {
    return f == NA_FP8_E4M3 ? (int)NA_DTYPE_F8E4M3 : f == NA_FP8_E5M2 ? (int)NA_DTYPE_F8E5M2 : -1;
}

/* name from a table, "?" out of range */
static const char *pick(const char *const *names, int n, int i) {
    return i >= 0 && i < n ? names[i] : "?";
}
const char *na_fp8_format_name(na_fp8_format f) {
    return pick((const char *const[]){"e4m3", "e5m2"}, 2, (int)f);
}
const char *na_fp8_recipe_kind_name(na_fp8_recipe_kind k) {
    return pick((const char *const[]){"delayed", "current"}, 2, (int)k);
}
const char *na_fp8_formats_name(na_fp8_formats f) {
    return pick((const char *const[]){"hybrid", "e4m3"}, 2, (int)f);
}
const char *na_fp8_amax_algo_name(na_fp8_amax_algo a) {
    return pick((const char *const[]){"max", "most_recent"}, 2, (int)a);
}
const char *na_fp8_role_name(na_fp8_role r) {
    return pick((const char *const[]){"input", "weight", "grad_output"}, NA_FP8_ROLE_COUNT, (int)r);
}

na_fp8_format na_fp8_formats_format(na_fp8_formats formats, na_fp8_role r) {
    /* HYBRID: gradients need range (E5M2 reaches 57344 and has inf), the forward precision */
    return formats == NA_FP8_FORMATS_HYBRID && r == NA_FP8_GRAD_OUTPUT ? NA_FP8_E5M2
                                                                       : NA_FP8_E4M3;
}

int na_fp8_recipe_check(const char *fn, const na_fp8_recipe_cfg *c) {
    if (!c) return na_set_error(NA_EINVAL, "%s: NULL recipe config", fn);
    if (c->kind != NA_FP8_RECIPE_DELAYED && c->kind != NA_FP8_RECIPE_CURRENT)
        return na_set_error(NA_EINVAL, "%s: kind %d is not a recipe (delayed %d, current %d)", fn,
                            (int)c->kind, NA_FP8_RECIPE_DELAYED, NA_FP8_RECIPE_CURRENT);
    if (c->formats != NA_FP8_FORMATS_HYBRID && c->formats != NA_FP8_FORMATS_E4M3)
        return na_set_error(NA_EINVAL, "%s: formats %d is not a format choice (hybrid %d, "
                            "e4m3 %d)", fn, (int)c->formats, NA_FP8_FORMATS_HYBRID,
                            NA_FP8_FORMATS_E4M3);
    if (c->kind == NA_FP8_RECIPE_CURRENT) {
        /* TE's Float8CurrentScaling has no margin; a silent one would be a different recipe */
        if (c->margin != 0)
            return na_set_error(NA_EINVAL, "%s: margin %d: current scaling takes none (0)", fn,
                                c->margin);
        return NA_OK;
    }
    if (c->amax_history_len < 1)
        return na_set_error(NA_EINVAL, "%s: amax_history_len %lld: delayed scaling needs at "
                            "least 1 step of history (Transformer Engine's default 1024)", fn,
                            (long long)c->amax_history_len);
    if (c->amax_history_len > (int64_t)1 << 24)
        return na_set_error(NA_EINVAL, "%s: amax_history_len %lld is above 2^24", fn,
                            (long long)c->amax_history_len);
    if (c->amax_algo != NA_FP8_AMAX_MAX && c->amax_algo != NA_FP8_AMAX_MOST_RECENT)
        return na_set_error(NA_EINVAL, "%s: amax_algo %d is not max (%d) or most_recent (%d)",
                            fn, (int)c->amax_algo, NA_FP8_AMAX_MAX, NA_FP8_AMAX_MOST_RECENT);
    if (c->margin < 0 || c->margin > NA_FP8_MARGIN_MAX)
        return na_set_error(NA_EINVAL, "%s: margin %d is outside [0, %d] (the scale is divided "
                            "by 2^margin)", fn, c->margin, NA_FP8_MARGIN_MAX);
    return NA_OK;
}

na_tensor *na_fp8_amax(na_tensor *x) {
    const char *fn = "na_fp8_amax";
    if (!x || !na_dtype_is_float(x->dtype)) {
        na_set_error(NA_EDTYPE, "%s: need a float tensor, got %s", fn,
                     x ? na_dtype_name(x->dtype) : "NULL");
        return NULL;
    }
    if (x->numel == 0) return na_zeros(NA_DTYPE_F32, x->device, 0, NULL);
    /* abs and max are exact in any dtype; a disabled region keeps a user's autocast rule
     * from lowering them, and no-grad keeps the read out of the graph */
    na_no_grad_begin();
    na_autocast_begin_disabled();
    na_tensor *m = na_max(na_abs(x));
    if (m && m->dtype != NA_DTYPE_F32) m = na_cast(m, NA_DTYPE_F32);
    na_autocast_end();
    na_no_grad_end();
    if (!m) na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
    return m;
}

void na_fp8_scaling_free(na_fp8_scaling *s) {
    if (!s) return;
    na_tensor_free(s->history);
    na_tensor_free(s->scale);
    na_tensor_free(s->scale_inv);
    na_tensor_free(s->updates);
    free(s);
}

na_fp8_scaling *na_fp8_scaling_new(const na_fp8_recipe_cfg *cfg) {
    const char *fn = "na_fp8_scaling_new";
    na_fp8_recipe_cfg c = cfg ? *cfg : (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS;
    if (na_fp8_recipe_check(fn, &c)) return NULL;
    na_fp8_scaling *s = calloc(1, sizeof *s);
    if (!s) {
        na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
        return NULL;
    }
    s->cfg = c;
    /* current scaling keeps one row: the amax it took its scale from, for the getters */
    s->len = c.kind == NA_FP8_RECIPE_DELAYED ? c.amax_history_len : 1;
    if (!(s->history = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU,
                                     NA_SHAPE(s->len, NA_FP8_ROLE_COUNT))) ||
        !(s->scale = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(NA_FP8_ROLE_COUNT))) ||
        !(s->scale_inv = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU,
                                       NA_SHAPE(NA_FP8_ROLE_COUNT))) ||
        !(s->updates = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, 0, NULL))) {
        na_set_error(na_last_status(), "%s: %s", fn, na_last_error());
        na_fp8_scaling_free(s);
        return NULL;
    }
    s->h = s->history->data, s->sc = s->scale->data, s->si = s->scale_inv->data;
    s->n = s->updates->data;
    for (int r = 0; r < NA_FP8_ROLE_COUNT; r++) s->sc[r] = s->si[r] = 1.0f; /* TE's start */
    return s;
}

na_fp8_recipe_cfg na_fp8_scaling_config(const na_fp8_scaling *s) {
    return s ? s->cfg : (na_fp8_recipe_cfg){0};
}

na_fp8_format na_fp8_scaling_format(const na_fp8_scaling *s, na_fp8_role r) {
    return na_fp8_formats_format(s ? s->cfg.formats : NA_FP8_FORMATS_HYBRID, r);
}

static bool role_ok(na_fp8_role r) { return (int)r >= 0 && r < NA_FP8_ROLE_COUNT; }

static int check_args(const char *fn, const na_fp8_scaling *s, na_fp8_role r) {
    if (!s) return na_set_error(NA_EINVAL, "%s: NULL scaling state", fn);
    if (!role_ok(r))
        return na_set_error(NA_EINVAL, "%s: role %d is not input (0), weight (1) or "
                            "grad_output (2)", fn, (int)r);
    return NA_OK;
}

/* The largest finite f32 stands in for a scale that overflows (TE: a tiny amax). */
static float finite_scale(float scale) { return isinf(scale) ? FLT_MAX : scale; }

static void set_scale(na_fp8_scaling *s, int r, float scale) {
    s->sc[r] = finite_scale(scale);
    s->si[r] = 1.0f / s->sc[r];
}

int na_fp8_scaling_record_amax(na_fp8_scaling *s, na_fp8_role r, float amax) {
    const char *fn = "na_fp8_scaling_record_amax";
    int rc = check_args(fn, s, r);
    if (rc) return rc;
    if (amax < 0)
        return na_set_error(NA_EINVAL, "%s: amax %g of %s is negative (an amax is max |x|)", fn,
                            (double)amax, na_fp8_role_name(r));
    float *a = &s->h[r]; /* row 0 */
    if (s->cfg.kind == NA_FP8_RECIPE_CURRENT) {
        *a = amax;
        float fmax = (float)na_fp8_format_max(na_fp8_scaling_format(s, r));
        /* TE's compute_scale_from_amax: nothing to scale by for 0, inf or NaN: 1 */
        set_scale(s, r, isfinite(amax) && amax > 0 ? fmax / amax : 1.0f);
        return NA_OK;
    }
    /* several casts of one role in a step: the largest, and a NaN stays */
    if (isnan(amax) || amax > *a) *a = amax;
    return NA_OK;
}

int na_fp8_scaling_record(na_fp8_scaling *s, na_fp8_role r, na_tensor *x) {
    const char *fn = "na_fp8_scaling_record";
    int rc = check_args(fn, s, r);
    if (rc) return rc;
    na_tensor *m = na_fp8_amax(x);
    if (!m) return na_set_error(na_last_status(), "%s (%s): %s", fn, na_fp8_role_name(r),
                                na_last_error());
    return na_fp8_scaling_record_amax(s, r, (float)na_item(m));
}

/* One role's delayed update (TE's fused kernel): roll unless row 0 is 0, then the scale. */
static void update_role(na_fp8_scaling *s, int r) {
    const int64_t len = s->len, W = NA_FP8_ROLE_COUNT;
    float *h = s->h;
    const float last = h[r];
    float amax = 0; /* the window's max, NaN skipped: fmaxf keeps the number */
    if (last != 0.0f) {
        for (int64_t i = 0; i + 1 < len; i++) {
            h[i * W + r] = h[(i + 1) * W + r];
            amax = fmaxf(amax, h[i * W + r]);
        }
        h[(len - 1) * W + r] = last;
        amax = fmaxf(amax, last);
        h[r] = 0; /* row 0: the next step's amax (when len is 1, last went nowhere else) */
    }
    if (s->cfg.amax_algo == NA_FP8_AMAX_MOST_RECENT) amax = last;
    if (isfinite(amax) && amax > 0) {
        /* scaled max in f32 first, as TE: fp8_max * 2^-margin is exact for margin <= 64 */
        float scaled_max = (float)na_fp8_format_max(na_fp8_scaling_format(s, r)) *
                           ldexpf(1.0f, -s->cfg.margin);
        set_scale(s, r, scaled_max / amax);
    } else {
        set_scale(s, r, s->sc[r]); /* kept; scale_inv follows it, as TE writes both */
    }
}

/* The state list lets a checkpoint write anything: a scale must stay finite and > 0 (1 / scale
 * is what the GEMM multiplies by), the count a whole number. */
static int check_loaded(const char *fn, const na_fp8_scaling *s) {
    for (int r = 0; r < NA_FP8_ROLE_COUNT; r++)
        if (!(isfinite(s->sc[r]) && s->sc[r] > 0))
            return na_set_error(NA_EINVAL, "%s: the scale of %s as loaded or set is %g (need "
                                "finite and > 0)", fn, na_fp8_role_name(r), (double)s->sc[r]);
    if (!(*s->n >= 0 && *s->n < 9007199254740992.0 && *s->n == floor(*s->n)))
        return na_set_error(NA_EINVAL, "%s: the update count as loaded or set is %g (need a "
                            "whole number >= 0)", fn, *s->n);
    return NA_OK;
}

int na_fp8_scaling_update(na_fp8_scaling *s) {
    const char *fn = "na_fp8_scaling_update";
    if (!s) return na_set_error(NA_EINVAL, "%s: NULL scaling state", fn);
    int rc = check_loaded(fn, s);
    if (rc) return rc;
    if (s->cfg.kind == NA_FP8_RECIPE_DELAYED)
        for (int r = 0; r < NA_FP8_ROLE_COUNT; r++) update_role(s, r);
    *s->n += 1;
    for (int r = 0; r < NA_FP8_ROLE_COUNT; r++) s->saturated[r] = 0;
    return NA_OK;
}

int na_fp8_scaling_count_saturated(na_fp8_scaling *s, na_fp8_role r, int64_t n) {
    int rc = check_args("na_fp8_scaling_count_saturated", s, r);
    if (rc) return rc;
    if (n < 0)
        return na_set_error(NA_EINVAL, "na_fp8_scaling_count_saturated: count %lld of %s is "
                            "negative", (long long)n, na_fp8_role_name(r));
    s->saturated[r] += n;
    s->saturated_total[r] += n;
    return NA_OK;
}
int64_t na_fp8_scaling_saturated(const na_fp8_scaling *s, na_fp8_role r) {
    return s && role_ok(r) ? s->saturated[r] : 0;
}
int64_t na_fp8_scaling_saturated_total(const na_fp8_scaling *s, na_fp8_role r) {
    return s && role_ok(r) ? s->saturated_total[r] : 0;
}

float na_fp8_scaling_scale(const na_fp8_scaling *s, na_fp8_role r) {
    return s && role_ok(r) ? s->sc[r] : NAN;
}
float na_fp8_scaling_scale_inv(const na_fp8_scaling *s, na_fp8_role r) {
    return s && role_ok(r) ? s->si[r] : NAN;
}
float na_fp8_scaling_history(const na_fp8_scaling *s, na_fp8_role r, int64_t i) {
    return s && role_ok(r) && i >= 0 && i < s->len ? s->h[i * NA_FP8_ROLE_COUNT + r] : NAN;
}
float na_fp8_scaling_amax(const na_fp8_scaling *s, na_fp8_role r) {
    return na_fp8_scaling_history(s, r, 0);
}
int64_t na_fp8_scaling_updates(const na_fp8_scaling *s) { return s ? (int64_t)*s->n : 0; }

/* The window's max as update() would take it under "max" (NaN skipped), for describe. */
static float window_max(const na_fp8_scaling *s, int r) {
    float m = 0;
    for (int64_t i = 0; i < s->len; i++) m = fmaxf(m, s->h[i * NA_FP8_ROLE_COUNT + r]);
    return m;
}

/* Appends to buf[*at..size), keeping it terminated; stops quietly when full. */
static void put(char *buf, size_t size, size_t *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static void put(char *buf, size_t size, size_t *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *at, size - *at, fmt, ap);
    va_end(ap);
    if (k > 0) *at = (size_t)k < size - *at ? *at + (size_t)k : size - 1;
}

const char *na_fp8_scaling_describe(const na_fp8_scaling *s, char *buf, size_t size) {
    if (!buf || !size) return buf;
    buf[0] = 0;
    if (!s) return buf;
    const na_fp8_recipe_cfg *c = &s->cfg;
    size_t at = 0;
    if (c->kind == NA_FP8_RECIPE_DELAYED)
        put(buf, size, &at, "fp8 delayed %s %s margin %d history %lld, update %lld\n",
            na_fp8_formats_name(c->formats), na_fp8_amax_algo_name(c->amax_algo), c->margin,
            (long long)s->len, (long long)na_fp8_scaling_updates(s));
    else
        put(buf, size, &at, "fp8 current %s, update %lld\n", na_fp8_formats_name(c->formats),
            (long long)na_fp8_scaling_updates(s));
    for (int r = 0; r < NA_FP8_ROLE_COUNT; r++) {
        put(buf, size, &at, "  %-11s %s scale %.9g scale_inv %.9g amax %.9g",
            na_fp8_role_name(r), na_fp8_format_name(na_fp8_scaling_format(s, r)),
            (double)s->sc[r], (double)s->si[r], (double)s->h[r]);
        if (c->kind == NA_FP8_RECIPE_DELAYED)
            put(buf, size, &at, " (window max %.9g)", (double)window_max(s, r));
        put(buf, size, &at, "\n");
    }
    return buf;
}

int na_fp8_scaling_state(na_fp8_scaling *s, const char *prefix, na_named_tensors *out) {
    if (!s || !out) return na_set_error(NA_EINVAL, "na_fp8_scaling_state: NULL state or output");
    const char *pf = prefix ? prefix : "";
    int64_t n0 = out->n;
    int rc = na_named_tensors_add(out, s->history, "%samax_history", pf);
    if (!rc) rc = na_named_tensors_add(out, s->scale, "%sscale", pf);
    if (!rc) rc = na_named_tensors_add(out, s->scale_inv, "%sscale_inv", pf);
    if (!rc) rc = na_named_tensors_add(out, s->updates, "%supdates", pf);
    if (rc) na_named_tensors_truncate(out, n0);
    return rc;
}
