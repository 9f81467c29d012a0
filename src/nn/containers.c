/* Sequential and Residual: modules made of modules. A failing child's message is prefixed
 * with its name and type, so an error deep in a model says where it happened. */
#include <stdio.h>

#include "src/autograd/graph.h"
#include "src/autograd/profile.h"
#include "src/nn/module.h"

static na_tensor *child_forward(na_module *m, int i, na_tensor *x) {
    bool profiled = na_profile_on();
    if (profiled) na_profile_layer_push(m->child_names[i], m->children[i]->type_name);
    na_tensor *y = na_module_forward(m->children[i], x);
    if (profiled) na_profile_layer_pop();
    if (!y)
        na_set_error(na_last_status() ? na_last_status() : NA_EINVAL, "%s (%s): %s",
                     m->child_names[i], m->children[i]->type_name, na_last_error());
    return y;
}

/* What one child hands the next is unreachable from user code: na_backward may give it back
 * once used. Not the input, nor what the result (perhaps a view of it) refers to. */
static na_tensor *sequential_forward(na_module *m, na_tensor *x) {
    na_tensor *in = x;
    for (int i = 0; i < m->n_children && x; i++) {
        if (x != in) na_graph_mark_internal(x);
        x = child_forward(m, i, x);
    }
    na_graph_unmark_internal(x);
    return x;
}

na_module *na_sequential_new(int n, na_module *const *mods) {
    bool failed = n < 0 || (n > 0 && !mods);
    for (int i = 0; i < n && !failed; i++) failed = !mods[i];
    na_module *m = failed ? NULL : na_module_make(NA_MODULE_SEQUENTIAL, sequential_forward, 0);
    if (!m) { /* take ownership anyway, so nested constructors need no cleanup */
        for (int i = 0; mods && i < n; i++) na_module_free(mods[i]);
        if (!na_last_status()) na_set_error(NA_EINVAL, "na_sequential_new: bad module list");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (na_sequential_append(m, mods[i])) {
            for (int k = i + 1; k < n; k++) na_module_free(mods[k]);
            na_module_free(m);
            return NULL;
        }
    }
    return m;
}

int na_sequential_append(na_module *seq, na_module *mod) {
    if (!seq || seq->kind != NA_MODULE_SEQUENTIAL) {
        na_module_free(mod);
        return na_set_error(NA_EINVAL, "na_sequential_append: not a Sequential");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", seq->n_children);
    return na_module_add_child(seq, name, mod);
}

static na_tensor *residual_forward(na_module *m, na_tensor *x) {
    na_tensor *y = child_forward(m, 0, x);
    if (y != x) na_graph_mark_internal(y);
    return y ? na_add(x, y) : NULL;
}

na_module *na_residual_new(na_module *body) {
    if (!body) {
        if (!na_last_status()) na_set_error(NA_EINVAL, "na_residual_new: NULL body");
        return NULL;
    }
    na_module *m = na_module_make(NA_MODULE_RESIDUAL, residual_forward, 0);
    if (!m) {
        na_module_free(body);
        return NULL;
    }
    if (na_module_add_child(m, "body", body)) {
        na_module_free(m);
        return NULL;
    }
    return m;
}
