/* Model conversion for Apex-style training: the network in f16 (or bf16) except BatchNorm
 * (Apex's network_to_half = tofp16 + BN_convert_float, FP16Model = convert_network + input
 * cast). The conversion itself is na_module_to_dtype with a skip predicate. */
#include <stdlib.h>

#include "src/amp/amp_internal.h"

static bool check_half(const char *fn, na_dtype dt) {
    if (dt == NA_DTYPE_F16 || dt == NA_DTYPE_BF16) return true;
    na_set_error(NA_EDTYPE, "%s: converts to f16 or bf16, got %s", fn, na_dtype_name(dt));
    return false;
}

int na_model_convert(na_module *m, na_dtype dt) {
    const char *fn = "na_model_convert";
    if (!m) return na_set_error(NA_EINVAL, "%s: NULL module", fn);
    if (!check_half(fn, dt)) return na_last_status();
    /* Every BatchNorm keeps f32: Apex keeps affine ones (their parameters); the statistics of
     * a non-affine one stay f32 too, as na_batch_norm (and cuDNN) need for f16 input. */
    int rc = na_module_to_dtype(m, dt, na_module_is_batch_norm, NULL);
    return rc ? na_set_error(rc, "%s: %s", fn, na_last_error()) : NA_OK;
}

/* ---- the input cast -------------------------------------------------------------------------- */

typedef struct {
    na_dtype dt;
} cast_state;

static na_tensor *cast_forward(na_module *m, na_tensor *x) {
    const cast_state *s = na_module_data(m);
    return na_dtype_is_float(x->dtype) ? na_cast(x, s->dt) : x;
}

na_module *na_cast_input_new(na_dtype dt) {
    if (!check_half("na_cast_input_new", dt)) return NULL;
    cast_state *s = malloc(sizeof *s);
    if (!s) {
        na_set_error(NA_ENOMEM, "na_cast_input_new: out of host memory");
        return NULL;
    }
    s->dt = dt;
    na_module *m = na_module_new(dt == NA_DTYPE_F16 ? "tofp16" : "tobf16", cast_forward, s, free);
    if (!m) free(s);
    return m;
}

/* ---- FP16Model ------------------------------------------------------------------------------- */

static na_tensor *fp16_model_forward(na_module *m, na_tensor *x) {
    const cast_state *s = na_module_data(m);
    na_module *net = na_module_child_at(m, 0, NULL);
    na_tensor *h = na_dtype_is_float(x->dtype) ? na_cast(x, s->dt) : x;
    return h ? na_module_forward(net, h) : NULL;
}

na_module *na_model_to_half(na_module *m, na_dtype dt) {
    const char *fn = "na_model_to_half";
    if (!m) {
        na_set_error(NA_EINVAL, "%s: NULL module (%s)", fn, na_last_error());
        return NULL;
    }
    cast_state *s = check_half(fn, dt) ? malloc(sizeof *s) : NULL;
    if (!s || na_model_convert(m, dt)) {
        if (!s && na_last_status() == NA_OK) na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
        free(s);
        na_module_free(m);
        return NULL;
    }
    s->dt = dt;
    na_module *w = na_module_new("FP16Model", fp16_model_forward, s, free);
    if (!w) {
        free(s);
        na_module_free(m);
        return NULL;
    }
    na_module_train(w, na_module_is_training(m));
    if (na_module_add_child(w, "network", m)) { /* takes m, also on failure */
        na_module_free(w);
        return NULL;
    }
    return w;
}
