/* Moving a module tree to a device and converting its dtype, tensor by tensor, in place.
 *
 * In place means the na_tensor struct is kept and only its storage is swapped: an optimizer,
 * a cast cache or a user holding the pointer sees the new device/dtype. */
#include "nanoamp/autograd.h" /* na_grad_settle */
#include "src/nn/module.h"

/* t gets storage of dtype dt on dev holding its values (converted); its gradient too. */
static int convert(na_tensor *t, na_dtype dt, na_device dev) {
    if (!t) return NA_OK;
    int rc = na_tensor_convert_(t, dt, dev);
    return rc ? rc : convert(t->grad, dt, dev);
}

typedef struct {
    bool to_device;
    na_device dev;
    na_dtype dt;
    na_module_pred skip;
    void *ctx;
} convert_job;

static int convert_tree(na_module *m, const convert_job *j) {
    int settled = na_grad_settle(); /* zero_grad's marks: real zeros move, not stale memory */
    if (settled) return settled;
    bool skip = !j->to_device && j->skip && j->skip(m, j->ctx);
    for (int i = 0; i < m->n_slots && !skip; i++) {
        na_tensor *t = m->slots[i].t;
        if (!na_dtype_is_float(t->dtype)) continue; /* counters stay i32 in host memory */
        int rc = j->to_device ? convert(t, t->dtype, j->dev) : convert(t, j->dt, t->device);
        if (rc)
            return na_set_error(rc, "%s: converting %s.%s: %s", j->to_device ? "na_module_to"
                                : "na_module_to_dtype", m->type_name, m->slots[i].name,
                                na_last_error());
    }
    for (int i = 0; i < m->n_children; i++) {
        int rc = convert_tree(m->children[i], j);
        if (rc) return rc;
    }
    return NA_OK;
}

int na_module_to(na_module *m, na_device dev) {
    if (!m) return na_set_error(NA_EINVAL, "na_module_to: NULL module");
    if ((unsigned)dev >= NA_DEVICE_COUNT)
        return na_set_error(NA_EINVAL, "na_module_to: unknown device %d", (int)dev);
    return convert_tree(m, &(convert_job){.to_device = true, .dev = dev});
}

int na_module_to_dtype(na_module *m, na_dtype dt, na_module_pred skip, void *ctx) {
    if (!m) return na_set_error(NA_EINVAL, "na_module_to_dtype: NULL module");
    if (!na_dtype_is_float(dt))
        return na_set_error(NA_EDTYPE, "na_module_to_dtype: target must be a float dtype, got %s",
                            na_dtype_name(dt));
    return convert_tree(m, &(convert_job){.dt = dt, .skip = skip, .ctx = ctx});
}
