/* The module tree: construction, ownership, forward, modes and named tensors. */
#include <stdlib.h>
#include <string.h>

#include "nanoamp/autograd.h"
#include "src/nn/module.h"

static const char *const kind_names[NA_MODULE_KIND_COUNT] = {
#define NA_MODULE_KIND_NAME_(id, name) name,
    NA_MODULE_KIND_MAP(NA_MODULE_KIND_NAME_)
#undef NA_MODULE_KIND_NAME_
};

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static na_module *make(na_module_kind kind, const char *type_name, na_module_forward_fn fwd) {
    na_module *m = calloc(1, sizeof *m);
    if (m && !(m->type_name = str_dup(type_name))) {
        free(m);
        m = NULL;
    }
    if (!m) {
        na_set_error(NA_ENOMEM, "%s: out of host memory making a module", type_name);
        return NULL;
    }
    m->kind = kind;
    m->forward = fwd;
    m->training = true;
    return m;
}

na_module *na_module_make(na_module_kind kind, na_module_forward_fn forward, size_t state_size) {
    na_module *m = make(kind, kind_names[kind], forward);
    if (m && state_size) {
        if (!(m->state = calloc(1, state_size))) {
            na_module_free(m);
            na_set_error(NA_ENOMEM, "%s: out of host memory", kind_names[kind]);
            return NULL;
        }
        m->free_state = free;
    }
    return m;
}

na_module *na_module_new(const char *type_name, na_module_forward_fn forward, void *state,
                         void (*free_state)(void *state)) {
    if (!type_name || !forward) {
        na_set_error(NA_EINVAL, "na_module_new: type_name and forward are required");
        return NULL;
    }
    na_module *m = make(NA_MODULE_CUSTOM, type_name, forward);
    if (m) m->state = state, m->free_state = free_state;
    return m;
}

void na_module_free(na_module *m) {
    if (!m) return;
    for (int i = 0; i < m->n_slots; i++) {
        na_tensor_free(m->slots[i].t);
        free(m->slots[i].name);
    }
    for (int i = 0; i < m->n_children; i++) {
        na_module_free(m->children[i]);
        free(m->child_names[i]);
    }
    if (m->free_state) m->free_state(m->state);
    free(m->slots);
    free(m->children);
    free(m->child_names);
    free(m->type_name);
    free(m);
}

void *na_module_state(const na_module *m) { return m ? m->state : NULL; }

/* ---- registration ------------------------------------------------------------------------ */

/* A name is free when it is non-empty, has no '.', and no tensor or child uses it. */
static int check_name(const char *fn, const na_module *m, const char *name) {
    if (!name || !*name || strchr(name, '.'))
        return na_set_error(NA_EINVAL, "%s: invalid name '%s' (non-empty, without '.')", fn,
                            name ? name : "(null)");
    for (int i = 0; i < m->n_slots; i++)
        if (!strcmp(m->slots[i].name, name))
            return na_set_error(NA_EINVAL, "%s: %s already has a tensor named '%s'", fn,
                                m->type_name, name);
    for (int i = 0; i < m->n_children; i++)
        if (!strcmp(m->child_names[i], name))
            return na_set_error(NA_EINVAL, "%s: %s already has a child named '%s'", fn,
                                m->type_name, name);
    return NA_OK;
}

static int add_slot(const char *fn, na_module *m, const char *name, na_tensor *t, bool buffer) {
    int rc = NA_OK;
    if (!m || !t) {
        rc = t ? na_set_error(NA_EINVAL, "%s: NULL module", fn)
               : na_set_error(NA_EINVAL, "%s: NULL tensor for '%s'", fn, name ? name : "");
    } else if (!t->persistent || t->base) {
        rc = na_set_error(NA_EINVAL, "%s: '%s' must be a persistent tensor (na_tensor_new)", fn,
                          name ? name : "");
    } else if (!buffer && !na_dtype_is_float(t->dtype)) {
        rc = na_set_error(NA_EDTYPE, "%s: parameter '%s' must be float, got %s", fn, name,
                          na_dtype_name(t->dtype));
    } else {
        rc = check_name(fn, m, name);
    }
    if (!rc && m->n_slots == m->cap_slots) {
        int cap = m->cap_slots ? 2 * m->cap_slots : 4;
        na_module_slot *s = realloc(m->slots, (size_t)cap * sizeof *s);
        if (!s) rc = na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
        else m->slots = s, m->cap_slots = cap;
    }
    char *copy = rc ? NULL : str_dup(name);
    if (!rc && !copy) rc = na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
    if (!rc && !buffer) rc = na_tensor_set_requires_grad(t, true);
    if (rc) {
        free(copy);
        na_tensor_free(t); /* ownership was given, also on failure */
        return rc;
    }
    t->name = copy;
    m->slots[m->n_slots++] = (na_module_slot){.name = copy, .t = t, .buffer = buffer};
    return NA_OK;
}

int na_module_add_param(na_module *m, const char *name, na_tensor *t) {
    return add_slot("na_module_add_param", m, name, t, false);
}
int na_module_add_buffer(na_module *m, const char *name, na_tensor *t) {
    return add_slot("na_module_add_buffer", m, name, t, true);
}

na_tensor *na_module_new_tensor(na_module *m, const char *name, bool buffer, int ndim,
                                const int64_t *shape) {
    na_tensor *t = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape);
    if (!t || add_slot(buffer ? "na_module_add_buffer" : "na_module_add_param", m, name, t, buffer))
        return NULL;
    return t;
}

int na_module_add_child(na_module *m, const char *name, na_module *child) {
    const char *fn = "na_module_add_child";
    if (!child)
        return na_last_status() ? na_last_status() : na_set_error(NA_EINVAL, "%s: NULL child", fn);
    int rc = m ? check_name(fn, m, name) : na_set_error(NA_EINVAL, "%s: NULL module", fn);
    if (!rc && m->n_children == m->cap_children) {
        int cap = m->cap_children ? 2 * m->cap_children : 4;
        na_module **c = realloc(m->children, (size_t)cap * sizeof *c);
        char **nm = c ? realloc(m->child_names, (size_t)cap * sizeof *nm) : NULL;
        if (c) m->children = c;
        if (nm) m->child_names = nm, m->cap_children = cap;
        else rc = na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
    }
    char *copy = rc ? NULL : str_dup(name);
    if (!rc && !copy) rc = na_set_error(NA_ENOMEM, "%s: out of host memory", fn);
    if (rc) {
        na_module_free(child);
        return rc;
    }
    m->children[m->n_children] = child;
    m->child_names[m->n_children++] = copy;
    return NA_OK;
}

/* ---- running ----------------------------------------------------------------------------- */

na_tensor *na_module_forward(na_module *m, na_tensor *x) {
    if (!m) {
        na_set_error(NA_EINVAL, "na_module_forward: NULL module");
        return NULL;
    }
    if (!x) { /* an earlier step of a chain failed: keep its message */
        if (!na_last_status())
            na_set_error(NA_EINVAL, "na_module_forward: NULL input to %s", m->type_name);
        return NULL;
    }
    return m->forward(m, x);
}

void na_module_train(na_module *m, bool training) {
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->n_children; i++) na_module_train(m->children[i], training);
}
void na_module_eval(na_module *m) { na_module_train(m, false); }
bool na_module_is_training(const na_module *m) { return m && m->training; }

int na_module_zero_grad(na_module *m) {
    if (!m) return NA_OK;
    for (int i = 0; i < m->n_slots; i++) {
        int rc = m->slots[i].buffer ? NA_OK : na_tensor_zero_grad(m->slots[i].t);
        if (rc) return rc;
    }
    for (int i = 0; i < m->n_children; i++) {
        int rc = na_module_zero_grad(m->children[i]);
        if (rc) return rc;
    }
    return NA_OK;
}

/* ---- inspecting -------------------------------------------------------------------------- */

na_module_kind na_module_kind_of(const na_module *m) { return m ? m->kind : NA_MODULE_CUSTOM; }
const char *na_module_type_name(const na_module *m) { return m ? m->type_name : "?"; }
int na_module_num_children(const na_module *m) { return m ? m->n_children : 0; }

na_module *na_module_child_at(const na_module *m, int i, const char **name) {
    if (!m || i < 0 || i >= m->n_children) return NULL;
    if (name) *name = m->child_names[i];
    return m->children[i];
}

na_tensor *na_module_get(const na_module *m, const char *path) {
    while (m && path) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
        if (!dot) {
            for (int i = 0; i < m->n_slots; i++)
                if (!strcmp(m->slots[i].name, path)) return m->slots[i].t;
            return NULL;
        }
        const na_module *next = NULL;
        for (int i = 0; i < m->n_children && !next; i++)
            if (strlen(m->child_names[i]) == len && !strncmp(m->child_names[i], path, len))
                next = m->children[i];
        m = next;
        path = dot + 1;
    }
    return NULL;
}

int64_t na_module_num_params(const na_module *m) {
    if (!m) return 0;
    int64_t n = 0;
    for (int i = 0; i < m->n_slots; i++)
        if (!m->slots[i].buffer) n += m->slots[i].t->numel;
    for (int i = 0; i < m->n_children; i++) n += na_module_num_params(m->children[i]);
    return n;
}

bool na_module_is_batch_norm(const na_module *m, void *ctx) {
    (void)ctx;
    return m && (m->kind == NA_MODULE_BATCH_NORM1D || m->kind == NA_MODULE_BATCH_NORM2D);
}

bool na_module_is_affine_batch_norm(const na_module *m, void *ctx) {
    return na_module_is_batch_norm(m, ctx) && na_module_get(m, "weight") != NULL;
}

/* ---- named tensors ----------------------------------------------------------------------- */

void na_named_tensors_free(na_named_tensors *l) {
    if (!l) return;
    for (int64_t i = 0; i < l->n; i++) free(l->items[i].name);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

na_tensor *na_named_tensors_find(const na_named_tensors *l, const char *name) {
    for (int64_t i = 0; l && name && i < l->n; i++)
        if (!strcmp(l->items[i].name, name)) return l->items[i].tensor;
    return NULL;
}

typedef struct {
    na_named_tensors *out;
    int64_t cap;
    int which;
} collector;

static int collect(collector *c, na_module *m, const char *prefix) {
    for (int i = 0; i < m->n_slots; i++) {
        const na_module_slot *s = &m->slots[i];
        if (!(c->which & (s->buffer ? NA_MODULE_BUFFERS : NA_MODULE_PARAMS))) continue;
        if (c->out->n == c->cap) {
            int64_t cap = c->cap ? 2 * c->cap : 16;
            na_named_tensor *p = realloc(c->out->items, (size_t)cap * sizeof *p);
            if (!p) return na_set_error(NA_ENOMEM, "na_module_named_tensors: out of host memory");
            c->out->items = p;
            c->cap = cap;
        }
        size_t n = strlen(prefix) + strlen(s->name) + 1;
        char *name = malloc(n);
        if (!name) return na_set_error(NA_ENOMEM, "na_module_named_tensors: out of host memory");
        strcpy(name, prefix);
        strcat(name, s->name);
        c->out->items[c->out->n++] = (na_named_tensor){.name = name, .tensor = s->t, .owner = m};
    }
    for (int i = 0; i < m->n_children; i++) {
        size_t n = strlen(prefix) + strlen(m->child_names[i]) + 2;
        char *sub = malloc(n);
        if (!sub) return na_set_error(NA_ENOMEM, "na_module_named_tensors: out of host memory");
        strcpy(sub, prefix);
        strcat(sub, m->child_names[i]);
        strcat(sub, ".");
        int rc = collect(c, m->children[i], sub);
        free(sub);
        if (rc) return rc;
    }
    return NA_OK;
}

int na_module_named_tensors(na_module *m, int which, na_named_tensors *out) {
    if (!out) return na_set_error(NA_EINVAL, "na_module_named_tensors: NULL output");
    *out = (na_named_tensors){0};
    if (!m) return na_set_error(NA_EINVAL, "na_module_named_tensors: NULL module");
    collector c = {.out = out, .which = which};
    int rc = collect(&c, m, "");
    if (rc) na_named_tensors_free(out);
    return rc;
}
