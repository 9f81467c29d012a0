/* Deferred zeros (src/tensor/deferred_zero.h).
 *
 * The list may hold entries whose mark was since cleared (claimed or settled one by one): a
 * clear is O(1) and the list is emptied by the next na_zero_settle_all, which the backward
 * pass calls when it ends, so it stays as long as the parameters zeroed between two passes. */
#include "src/tensor/deferred_zero.h"

#include <stdlib.h>
#include <string.h>

#include "src/tensor/tensor_internal.h"

static na_tensor **marked;
static size_t n_marked, cap_marked;

/* On CUDA the marks wait for a GPU run that shows parity and speed (issue 14): the switch
 * NANOAMP_GRAD_INPLACE=1 turns them on; off, zero_grad fills as before. Read once. */
static bool defer_on(na_device dev) {
    static int cuda_on = -1;
    if (dev == NA_DEVICE_CPU) return true;
    if (cuda_on < 0) {
        const char *v = getenv("NANOAMP_GRAD_INPLACE");
        cuda_on = v && v[0] && strcmp(v, "0") != 0;
    }
    return cuda_on;
}

int na_zero_defer(na_tensor *t) {
    if (!t || t->zero_deferred) return NA_OK;
    /* a step graph records the fill: a mark is host state, which a replay never sees */
    if (!t->persistent || !na_is_contiguous(t) || na_step_graph_capturing() ||
        !defer_on(t->device))
        return na_fill_(t, 0.0);
    if (n_marked == cap_marked) {
        size_t cap = cap_marked ? 2 * cap_marked : 64;
        na_tensor **p = realloc(marked, cap * sizeof *p);
        if (!p) return na_fill_(t, 0.0); /* no room to remember it: fill it now */
        marked = p;
        cap_marked = cap;
    }
    marked[n_marked++] = t;
    t->zero_deferred = true;
    return NA_OK;
}

void na_zero_claim(na_tensor *t) {
    if (t) t->zero_deferred = false;
}

int na_zero_settle(na_tensor *t) {
    if (!na_zero_deferred(t)) return NA_OK;
    t->zero_deferred = false;
    return na_fill_(t, 0.0);
}

int na_zero_settle_memory(const na_tensor *t) {
    if (!t) return NA_OK;
    int rc = na_zero_settle((na_tensor *)t);
    return rc ? rc : na_zero_settle(t->base);
}

int na_zero_settle_all(void) {
    int rc = NA_OK;
    size_t kept = 0; /* the ones a failed fill left marked */
    for (size_t i = 0; i < n_marked; i++) {
        int r = na_zero_settle(marked[i]);
        if (r) {
            marked[i]->zero_deferred = true;
            marked[kept++] = marked[i];
            rc = rc ? rc : r;
        }
    }
    n_marked = kept;
    return rc;
}

void na_zero_forget(na_tensor *t) {
    size_t u = 0;
    for (size_t i = 0; i < n_marked; i++)
        if (marked[i] != t) marked[u++] = marked[i];
    n_marked = u;
}
