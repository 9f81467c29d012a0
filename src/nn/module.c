/* The module tree: construction, ownership, forward, modes, parameters and state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/autograd.h"
#include "src/nn/module.h"
#include "src/tensor/arena.h"

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

na_module *na_module_new(const char *type_name, na_module_forward_fn forward, void *data,
                         void (*free_data)(void *data)) {
    if (!type_name || !forward) {
        na_set_error(NA_EINVAL, "na_module_new: type_name and forward are required");
        return NULL;
    }
    na_module *m = make(NA_MODULE_CUSTOM, type_name, forward);
    if (m) m->state = data, m->free_state = free_data;
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

void *na_module_data(const na_module *m) { return m ? m->state : NULL; }

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

/* ---- parameters and state ----------------------------------------------------------------- */

/* The path of the module being visited ("features.0."), grown and cut back as the walk goes. */
typedef struct {
    char *buf;
    size_t len, cap;
} tree_path;

/* Appends text, plus a '.' when dot. */
static bool path_append(tree_path *p, const char *text, bool dot) {
    size_t need = p->len + strlen(text) + 2;
    if (need > p->cap) {
        size_t cap = need > 2 * p->cap ? need : 2 * p->cap;
        char *b = realloc(p->buf, cap);
        if (!b) return false;
        p->buf = b, p->cap = cap;
    }
    p->len += (size_t)sprintf(p->buf + p->len, dot ? "%s." : "%s", text);
    return true;
}

/* Calls visit for each of m's tensors selected by which, in state_dict order; stops at the
 * first nonzero return. */
typedef int (*slot_visit)(void *ctx, na_module *m, const na_module_slot *s, const char *path);

static int walk(na_module *m, int which, tree_path *p, slot_visit visit, void *ctx) {
    size_t len = p->len;
    for (int i = 0; i < m->n_slots; i++) {
        const na_module_slot *s = &m->slots[i];
        if (!(which & (s->buffer ? NA_MODULE_BUFFERS : NA_MODULE_PARAMS))) continue;
        int rc = visit(ctx, m, s, p->buf);
        if (rc) return rc;
    }
    for (int i = 0; i < m->n_children; i++) {
        if (!path_append(p, m->child_names[i], true))
            return na_set_error(NA_ENOMEM, "%s: out of host memory", m->type_name);
        int rc = walk(m->children[i], which, p, visit, ctx);
        p->buf[p->len = len] = '\0';
        if (rc) return rc;
    }
    return NA_OK;
}

static int walk_tree(na_module *m, int which, const char *prefix, slot_visit visit, void *ctx) {
    tree_path p = {0};
    int rc = path_append(&p, prefix ? prefix : "", false) ? walk(m, which, &p, visit, ctx)
                                                          : na_set_error(NA_ENOMEM, "out of host "
                                                                         "memory");
    free(p.buf);
    return rc;
}

static int add_named(void *ctx, na_module *m, const na_module_slot *s, const char *path) {
    na_named_tensors *out = ctx;
    int rc = na_named_tensors_add(out, s->t, "%s%s", path, s->name);
    if (!rc) out->items[out->n - 1].owner = m;
    return rc;
}

int na_module_named_tensors(na_module *m, int which, const char *prefix, na_named_tensors *out) {
    const char *fn = "na_module_named_tensors";
    if (!out || !m) return na_set_error(NA_EINVAL, "%s: NULL %s", fn, m ? "output" : "module");
    int64_t n0 = out->n;
    int rc = walk_tree(m, which, prefix, add_named, out);
    if (rc) na_named_tensors_truncate(out, n0);
    return rc ? na_set_error(rc, "%s: %s", fn, na_last_error()) : NA_OK;
}

int na_module_state(na_module *m, const char *prefix, na_named_tensors *out) {
    return na_module_named_tensors(m, NA_MODULE_STATE, prefix, out);
}

static int add_param(void *ctx, na_module *m, const na_module_slot *s, const char *path) {
    (void)m, (void)path;
    na_tensor_list *l = ctx; /* items NULL: counting */
    if (s->t->requires_grad) { /* frozen parameters are no optimizer's business */
        if (l->items) l->items[l->n] = s->t;
        l->n++;
    }
    return NA_OK;
}

na_tensor_list na_module_parameters(na_module *m) {
    const na_tensor_list failed = {.n = -1};
    if (!m) {
        na_set_error(NA_EINVAL, "na_module_parameters: NULL module");
        return failed;
    }
    na_tensor_list count = {0}, l = {0};
    if (walk_tree(m, NA_MODULE_PARAMS, NULL, add_param, &count)) return failed;
    if (!(l.items = na_arena_host_alloc((size_t)(count.n ? count.n : 1) * sizeof *l.items)) ||
        walk_tree(m, NA_MODULE_PARAMS, NULL, add_param, &l))
        return failed;
    return l;
}
