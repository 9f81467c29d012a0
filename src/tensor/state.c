/* Tensor lists (include/nanoamp/state.h): the one builder of state names, and the one in-place
 * storage swap that moves or converts state tensors (modules, scalers). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/state.h"

int na_tensor_list_check(const char *fn, na_tensor_list l) {
    if (l.n < 0) /* a maker failed: keep its message */
        return na_last_status() ? na_last_status()
                                : na_set_error(NA_EINVAL, "%s: invalid tensor list", fn);
    if (l.n > 0 && !l.items)
        return na_set_error(NA_EINVAL, "%s: a list of %lld tensors without items", fn,
                            (long long)l.n);
    return NA_OK;
}

int na_named_tensors_add(na_named_tensors *l, na_tensor *t, const char *fmt, ...) {
    if (!l || !fmt) return na_set_error(NA_EINVAL, "na_named_tensors_add: NULL list or name");
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *name = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (l->n == l->cap && name) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        na_named_tensor *p = realloc(l->items, (size_t)cap * sizeof *p);
        if (p) l->items = p, l->cap = cap;
    }
    if (!name || l->n == l->cap) {
        free(name);
        return na_set_error(NA_ENOMEM, "na_named_tensors_add: out of host memory listing '%s'",
                            fmt);
    }
    va_start(ap, fmt);
    vsnprintf(name, (size_t)len + 1, fmt, ap);
    va_end(ap);
    l->items[l->n++] = (na_named_tensor){.name = name, .tensor = t};
    return NA_OK;
}

void na_named_tensors_free(na_named_tensors *l) {
    if (!l) return;
    for (int64_t i = 0; i < l->n; i++) free(l->items[i].name);
    free(l->items);
    *l = (na_named_tensors){0};
}

void na_named_tensors_truncate(na_named_tensors *l, int64_t n) {
    while (l && l->n > n && l->n > 0) free(l->items[--l->n].name);
}

na_tensor *na_named_tensors_find(const na_named_tensors *l, const char *name) {
    for (int64_t i = 0; l && name && i < l->n; i++)
        if (!strcmp(l->items[i].name, name)) return l->items[i].tensor;
    return NULL;
}

int na_tensor_convert_(na_tensor *t, na_dtype dt, na_device dev) {
    if (!t || !t->persistent || t->base)
        return na_set_error(NA_EINVAL, "na_tensor_convert_: need a persistent tensor that owns "
                            "its memory");
    if (t->dtype == dt && t->device == dev) return NA_OK;
    na_tensor *tmp = na_tensor_new(dt, dev, t->ndim, t->shape);
    if (!tmp) return na_last_status();
    int rc = na_copy_(tmp, t);
    if (rc) {
        na_tensor_free(tmp);
        return rc;
    }
    /* swap storage: tmp now holds the old data and frees it through the old device */
    void *data = t->data;
    na_dtype odt = t->dtype;
    na_device odev = t->device;
    t->data = tmp->data, t->dtype = dt, t->device = dev;
    tmp->data = data, tmp->dtype = odt, tmp->device = odev;
    na_tensor_free(tmp);
    return NA_OK;
}
