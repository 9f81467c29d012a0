/* The backward pass: a dynamic tape walked in reverse topological order.
 *
 * Gradients of non-leaf tensors are kept in their .grad (step arena) while the pass runs;
 * leaves that require grad accumulate (+=) into their .grad, which for a persistent leaf is
 * persistent. A gradient block made by the pass goes back to the arena as soon as nothing
 * holds it: the pass counts, per block, the non-leaf .grad slots and the node's own
 * gradients in flight that refer to it (views and adopted gradients share blocks).
 *
 * zero_grad only marks a gradient as zero (src/tensor/deferred_zero.h). The first
 * contribution to a marked gradient is written, not added: by the op itself where it can
 * (node->grad_into: the weight gradients of conv2d, linear and matmul, and a cast weight's
 * through the cast's backward, go straight into .grad), else copied. Later contributions
 * add, as before: adding with a GEMM's beta = 1 would round f16/bf16 once instead of twice
 * and let BLAS add K-blocked partial sums, so results would change. The pass ends by filling
 * the marks it did not reach, and fills a leaf's before the leaf hook reads it: after
 * na_backward nothing is left marked. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "src/autograd/graph.h"
#include "src/autograd/profile.h"
#include "src/tensor/arena.h"
#include "src/tensor/deferred_zero.h"
#include "src/tensor/tensor_internal.h"

static _Thread_local int no_grad_depth;
static _Thread_local bool in_backward;
static unsigned visit_epoch;
static na_graph_observer observer;
static na_graph_backward_observer backward_observer;

void na_no_grad_begin(void) { no_grad_depth++; }
void na_no_grad_end(void) {
    if (no_grad_depth > 0) no_grad_depth--;
}
bool na_grad_enabled(void) { return no_grad_depth == 0; }
bool na_graph_in_backward(void) { return in_backward; }

na_graph_observer na_graph_set_observer(na_graph_observer fn) {
    na_graph_observer old = observer;
    observer = fn;
    return old;
}

na_graph_backward_observer na_graph_set_backward_observer(na_graph_backward_observer fn) {
    na_graph_backward_observer old = backward_observer;
    backward_observer = fn;
    return old;
}

na_node *na_graph_record(const na_graph_op *op, na_tensor *out, int n_inputs,
                         na_tensor *const *inputs) {
    if (observer) observer(op, out, n_inputs, inputs);
    if (na_profile_on() && !in_backward) /* a backward's ops count to its node */
        na_profile_mark(op->name, false, out->device, na_profile_layer());
    if (!na_grad_enabled() || !op->backward) return NULL;
    bool any = false;
    for (int k = 0; k < n_inputs; k++) any |= inputs[k] && inputs[k]->requires_grad;
    if (!any) return NULL;
    na_node *n = na_arena_host_alloc(sizeof *n);
    if (!n) return NULL;
    n->op = op;
    n->n_inputs = n_inputs;
    for (int k = 0; k < n_inputs; k++) n->inputs[k] = inputs[k];
    n->out = out;
    for (int k = 0; k < n_inputs; k++)
        n->versions[k] = inputs[k] ? na_tensor_version(inputs[k]) : 0;
    n->versions[NA_NODE_MAX_INPUTS] = na_tensor_version(out);
    n->layer = na_profile_layer();
    out->requires_grad = true;
    out->grad_fn = n;
    return n;
}

int na_tensor_set_requires_grad(na_tensor *t, bool requires_grad) {
    if (!na_check_tensor("na_tensor_set_requires_grad", t, "tensor")) return na_last_status();
    if (requires_grad && !na_dtype_is_float(t->dtype))
        return na_set_error(NA_EDTYPE, "na_tensor_set_requires_grad: only float tensors can "
                            "require grad, got %s", na_dtype_name(t->dtype));
    if (t->grad_fn)
        return na_set_error(NA_EINVAL, "na_tensor_set_requires_grad: only leaves can be changed "
                            "(this tensor was made by %s)", t->grad_fn->op->name);
    t->requires_grad = requires_grad;
    return NA_OK;
}

int na_tensor_zero_grad(na_tensor *t) { return t ? na_zero_defer(t->grad) : NA_OK; }

int na_grad_settle(void) { return na_zero_settle_all(); }

na_tensor *na_detach(na_tensor *t) {
    if (!na_check_tensor("na_detach", t, "input")) return NULL;
    na_tensor *v = na_tensor_view_header(t);
    if (v) {
        v->requires_grad = false;
        v->grad_fn = NULL;
        v->grad = NULL;
    }
    return v;
}

/* ---- topological order -------------------------------------------------------------------- */

typedef struct {
    na_node **items;
    size_t n, cap;
} node_list;

static int push(node_list *l, na_node *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        na_node **p = realloc(l->items, cap * sizeof *p);
        if (!p) return na_set_error(NA_ENOMEM, "na_backward: out of memory sorting the graph");
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = n;
    return NA_OK;
}

/* Post-order DFS without recursion: `order` ends with the root's node last. */
static int topo_sort(na_node *root, node_list *order) {
    node_list stack = {0};
    unsigned mark = ++visit_epoch;
    int rc = push(&stack, root);
    /* visit = mark: on the stack; visit = mark+1<<31 flag: children pushed */
    while (!rc && stack.n) {
        na_node *n = stack.items[stack.n - 1];
        if (n->visit == (mark | 0x80000000u)) {
            stack.n--;
            continue;
        }
        if (n->visit == mark) { /* children done: emit */
            n->visit = mark | 0x80000000u;
            stack.n--;
            rc = push(order, n);
            continue;
        }
        n->visit = mark;
        for (int k = 0; k < n->n_inputs && !rc; k++) {
            na_tensor *in = n->inputs[k];
            if (in && in->grad_fn && (in->grad_fn->visit & 0x7fffffffu) != mark)
                rc = push(&stack, in->grad_fn);
        }
    }
    free(stack.items);
    return rc;
}

/* ---- the leaf hook: when each leaf's gradient is final ------------------------------------ */

static na_graph_leaf_hook leaf_hook;

na_graph_leaf_hook na_graph_set_leaf_hook(na_graph_leaf_hook hook) {
    na_graph_leaf_hook old = leaf_hook;
    leaf_hook = hook;
    return old;
}

/* A leaf and the position in `order` of the last node (run last, so lowest) that consumes it. */
typedef struct {
    na_tensor *leaf;
    size_t last;
    int k;
} leaf_final;

static int by_leaf_then_last(const void *pa, const void *pb) {
    const leaf_final *a = pa, *b = pb;
    if (a->leaf != b->leaf) return (uintptr_t)a->leaf < (uintptr_t)b->leaf ? -1 : 1;
    return a->last != b->last ? (a->last < b->last ? -1 : 1) : a->k - b->k;
}
static int by_firing_order(const void *pa, const void *pb) { /* the graph's shape alone */
    const leaf_final *a = pa, *b = pb;
    return a->last != b->last ? (a->last > b->last ? -1 : 1) : a->k - b->k;
}

/* Each leaf requiring grad once, with its last consumer, in firing order; *n entries. */
static int leaf_schedule(const node_list *order, leaf_final **out, size_t *n) {
    size_t m = 0, cap = 0;
    for (size_t i = 0; i < order->n; i++) cap += (size_t)order->items[i]->n_inputs;
    leaf_final *e = malloc((cap ? cap : 1) * sizeof *e);
    if (!e) return na_set_error(NA_ENOMEM, "na_backward: out of memory ordering the leaves");
    for (size_t i = 0; i < order->n; i++)
        for (int k = 0; k < order->items[i]->n_inputs; k++) {
            na_tensor *t = order->items[i]->inputs[k];
            if (t && !t->grad_fn && t->requires_grad) e[m++] = (leaf_final){t, i, k};
        }
    qsort(e, m, sizeof *e, by_leaf_then_last);
    size_t u = 0;
    for (size_t i = 0; i < m; i++)
        if (!u || e[u - 1].leaf != e[i].leaf) e[u++] = e[i];
    qsort(e, u, sizeof *e, by_firing_order);
    *out = e;
    *n = u;
    return NA_OK;
}

/* Calls the hook for the scheduled leaves whose last consumer is order position i. */
static int fire_final(const leaf_final *e, size_t n, size_t *next, size_t i) {
    int rc = NA_OK;
    for (; !rc && *next < n && e[*next].last == i; ++*next)
        if (!(rc = na_zero_settle(e[*next].leaf->grad))) /* no node wrote it */
            rc = leaf_hook.fn(e[*next].leaf, leaf_hook.ctx);
    return rc;
}

/* ---- what the pass frees: gradient blocks and saved activations ---------------------------- */

/* A block's references, keyed by the tensor that owns it (views share their base's block). */
typedef struct {
    int refs;
    bool io;     /* activations: some node has it as an input or output */
    bool saved;  /* activations: some node keeps it in saved[] */
    bool pinned; /* activations: also a gradient, or the root: never freed by the pass */
} block_refs;

typedef struct {
    na_tensor **keys; /* open addressing, at most half full */
    block_refs *vals;
    size_t cap, n;
    bool broken; /* out of memory for the table: free nothing more */
} ref_table;

typedef struct {
    na_arena_mark mark; /* gradient blocks whose owner was made after it are the pass's own */
    ref_table grads;    /* the pass's gradient blocks: .grad slots and gradients in flight */
    ref_table acts;     /* the forward's blocks the nodes refer to (empty when retaining) */
    bool free_saved;    /* give activations back after their last use (not na_backward_retain) */
} pass;

static na_tensor *owner_of(na_tensor *t) { return na_tensor_owner(t); }

static bool pass_made(const pass *p, const na_tensor *o) {
    return !o->persistent && o->data && na_arena_host_newer(p->mark, o);
}

static size_t slot_of(na_tensor *const *keys, size_t cap, const na_tensor *o) {
    size_t h = ((uintptr_t)o >> 4) & (cap - 1);
    while (keys[h] && keys[h] != o) h = (h + 1) & (cap - 1);
    return h;
}

static bool grow_table(ref_table *t) {
    size_t cap = t->cap ? 2 * t->cap : 256;
    na_tensor **keys = calloc(cap, sizeof *keys);
    block_refs *vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return false;
    }
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->keys[i]) continue;
        size_t h = slot_of(keys, cap, t->keys[i]);
        keys[h] = t->keys[i];
        vals[h] = t->vals[i];
    }
    free(t->keys);
    free(t->vals);
    t->keys = keys, t->vals = vals, t->cap = cap;
    return true;
}

/* The entry of o, added (zeroed) when `insert`; NULL when absent or out of memory. */
static block_refs *refs_of(ref_table *t, na_tensor *o, bool insert) {
    if (t->broken) return NULL;
    if (insert && 2 * (t->n + 1) > t->cap && !grow_table(t)) {
        t->broken = true;
        return NULL;
    }
    if (!t->cap) return NULL;
    size_t h = slot_of(t->keys, t->cap, o);
    if (!t->keys[h]) {
        if (!insert) return NULL;
        t->keys[h] = o;
        t->n++;
    }
    return &t->vals[h];
}

static void hold(pass *p, na_tensor *g) {
    na_tensor *o = owner_of(g);
    if (!pass_made(p, o)) { /* a gradient that is (a view of) an activation keeps it alive */
        block_refs *a = refs_of(&p->acts, o, false);
        if (a) a->pinned = true;
        return;
    }
    block_refs *r = refs_of(&p->grads, o, true);
    if (r) ++r->refs;
}

/* One reference less; the block goes back to the arena when that was the last. */
static void unhold(pass *p, na_tensor *g) {
    na_tensor *o = owner_of(g);
    block_refs *r = pass_made(p, o) ? refs_of(&p->grads, o, false) : NULL;
    if (r && --r->refs == 0) na_tensor_release(o);
}

/* A node's references to forward tensors: its inputs, saved tensors, output and kept ones. */
#define NODE_REFS(n) ((n)->n_inputs + NA_NODE_MAX_SAVED + 1 + (n)->n_kept)
static na_tensor *node_ref(const na_node *n, int j) {
    if (j < n->n_inputs) return n->inputs[j];
    j -= n->n_inputs;
    if (j < NA_NODE_MAX_SAVED) return n->saved[j];
    return j == NA_NODE_MAX_SAVED ? n->out : n->kept[j - NA_NODE_MAX_SAVED - 1];
}
/* Reference j is one of saved[] (made for the backward alone), not also the output. */
static bool ref_is_saved(const na_node *n, int j) {
    int s = j - n->n_inputs;
    return s >= 0 && s < NA_NODE_MAX_SAVED && n->saved[s] != n->out;
}

/* Counts every node's references to the forward's step blocks; the root is the user's. */
static void count_saved(pass *p, const node_list *order, na_tensor *root) {
    for (size_t i = 0; i < order->n; i++)
        for (int j = 0; j < NODE_REFS(order->items[i]); j++) {
            na_tensor *t = node_ref(order->items[i], j), *o = t ? owner_of(t) : NULL;
            block_refs *r = o && !o->persistent && o->data ? refs_of(&p->acts, o, true) : NULL;
            if (!r) continue;
            r->refs++;
            bool in_saved = ref_is_saved(order->items[i], j);
            r->saved |= in_saved;
            r->io |= !in_saved;
        }
    block_refs *r = refs_of(&p->acts, owner_of(root), false);
    if (r) r->pinned = true;
}

/* Only what no user code can reach: an op's output marked internal, or a tensor an op made
 * for its backward alone. */
static bool freeable(const na_tensor *o, const block_refs *r) {
    bool internal = o->grad_fn && o->grad_fn->out == o && o->grad_fn->out_internal;
    return !r->pinned && (internal || (r->saved && !r->io && !o->grad_fn && !o->requires_grad));
}

/* After node n's backward: one reference less to each block it kept. */
static void release_saved(pass *p, const na_node *n) {
    if (!p->free_saved) return;
    for (int j = 0; j < NODE_REFS(n); j++) {
        na_tensor *t = node_ref(n, j), *o = t ? owner_of(t) : NULL;
        block_refs *r = o ? refs_of(&p->acts, o, false) : NULL;
        if (r && --r->refs == 0 && freeable(o, r)) na_tensor_release(o);
    }
}

/* A node an earlier na_backward used up (walked without retain, its saved tensors perhaps
 * given back) cannot run again, as in PyTorch without retain_graph. */
static int check_not_used(const char *fn, const na_node *n) {
    bool freed = false;
    for (int j = 0; j < NODE_REFS(n); j++)
        freed |= node_ref(n, j) && !owner_of(node_ref(n, j))->data;
    if (n->walked || freed)
        return na_set_error(NA_ESTATE, "%s: the graph of %s was already walked by na_backward, "
                            "which uses it up%s; walk it with na_backward_retain every time but "
                            "the last", fn, n->op->name,
                            freed ? " and gave its saved tensors back" : "");
    return NA_OK;
}

int na_graph_version_error(const char *fn, const na_tensor *t, const char *place,
                           const char *op, uint32_t expected) {
    char b[2 * NA_DESCRIBE_MAX];
    return na_set_error(NA_ESTATE, "%s: one of the variables needed for gradient computation has "
                        "been modified by an inplace operation: %s, %s of %s, is at version %u; "
                        "expected version %u instead (it was written after %s saved it: write a "
                        "copy, or write it before %s runs)", fn,
                        na_tensor_describe_named(t, b, sizeof b), place, op,
                        (unsigned)na_tensor_version(t), (unsigned)expected, op, op);
}

/* The values n's backward reads (its op's `reads`) must be those the op saw: an in-place
 * write since (a version bump) would make the gradient silently wrong. */
static int check_versions(const char *fn, const na_node *n) {
    for (int k = 0; k <= n->n_inputs; k++) {
        int slot = k < n->n_inputs ? k : NA_NODE_MAX_INPUTS;
        na_tensor *t = k < n->n_inputs ? n->inputs[k] : n->out;
        if (!(n->op->reads >> slot & 1) || !t || na_tensor_version(t) == n->versions[slot])
            continue;
        char place[32];
        snprintf(place, sizeof place, k < n->n_inputs ? "input %d" : "the output", k);
        return na_graph_version_error(fn, t, place, n->op->name, n->versions[slot]);
    }
    return NA_OK;
}

void na_graph_mark_internal(na_tensor *t) {
    if (t && t->grad_fn && t->grad_fn->out == t && !t->base && !t->persistent)
        t->grad_fn->out_internal = true;
}
void na_graph_unmark_internal(na_tensor *t) {
    na_tensor *o = t ? owner_of(t) : NULL;
    if (o && o->grad_fn && o->grad_fn->out == o) o->grad_fn->out_internal = false;
}

/* ---- accumulation -------------------------------------------------------------------------- */

/* Offers each input of n that is a leaf with a marked gradient of the input's own shape,
 * dtype and device as the place to write that gradient (node->grad_into). */
static void offer_grad_into(na_node *n) {
    for (int k = 0; k < n->n_inputs; k++) {
        na_tensor *t = n->inputs[k], *g = t ? t->grad : NULL;
        bool ok = na_node_needs_grad(n, k) && !t->grad_fn && na_zero_deferred(g) &&
                  g->dtype == t->dtype && g->device == t->device && na_same_shape(g, t) &&
                  na_memory_format_of(g) == na_memory_format_of(t);
        for (int j = 0; ok && j < k; j++) ok = n->inputs[j] != t; /* written once */
        n->grad_into[k] = ok ? g : NULL;
    }
}

/* out = a + b through the backend (shapes, dtype and device equal; a and b may be views; out
 * is contiguous, or in the one dense layout a and b share). */
static int add_same_shape(na_tensor *out, const na_tensor *a, const na_tensor *b) {
    if (na_same_dense_layout(out, a) && na_same_dense_layout(out, b))
        return na_binary_on_memory(NA_BINARY_ADD, out, a, b);
    na_broadcast bc = {.ndim = out->ndim};
    for (int i = 0; i < out->ndim; i++) {
        bc.shape[i] = out->shape[i];
        bc.a_stride[i] = a->stride[i];
        bc.b_stride[i] = b->stride[i];
    }
    return na_be(out)->binary(NA_BINARY_ADD, &a->view, &b->view, &out->view, &bc);
}

static int accumulate(pass *p, na_tensor *t, na_tensor *g) {
    char a[NA_DESCRIBE_MAX], b[NA_DESCRIBE_MAX];
    if (!na_same_shape(t, g))
        return na_set_error(NA_ESTATE, "na_backward: internal error: gradient %s for tensor %s",
                            na_tensor_describe(g, a, sizeof a), na_tensor_describe(t, b, sizeof b));
    if (!t->grad_fn && na_zero_deferred(t->grad)) { /* the first contribution: written */
        na_zero_claim(t->grad);
        return na_copy_(t->grad, g);
    }
    if (g->dtype != t->dtype || g->device != t->device) { /* into t's dtype, onto its device */
        na_tensor *c = na_empty(t->dtype, t->device, g->ndim, g->shape);
        if (!c || na_copy_(c, g) != NA_OK) return na_last_status();
        g = c;
    }
    if (t->grad_fn) { /* non-leaf: never written in place, so adopting g aliases nothing */
        hold(p, g);
        if (!t->grad) {
            t->grad = g;
            return NA_OK;
        }
        /* two channels-last gradients (a residual network's branches) sum channels-last */
        na_tensor *sum = na_same_dense_layout(t->grad, g)
                             ? na_empty_like_format(g)
                             : na_empty(t->dtype, t->device, t->ndim, t->shape);
        if (!sum) return na_last_status();
        int rc = add_same_shape(sum, t->grad, g);
        hold(p, sum);
        unhold(p, t->grad);
        unhold(p, g); /* summed: held by nobody now (a converted copy is freed here) */
        t->grad = sum;
        return rc;
    }
    if (!t->grad) { /* a leaf owns its gradient: persistent for a persistent leaf */
        t->grad = t->persistent ? na_tensor_new(t->dtype, t->device, t->ndim, t->shape)
                                : na_empty(t->dtype, t->device, t->ndim, t->shape);
        if (!t->grad) return na_last_status();
        return na_be(t)->copy(&t->grad->view, &g->view);
    }
    return add_same_shape(t->grad, t->grad, g);
}

static int backward(na_tensor *root, na_tensor *grad, bool retain) {
    const char *fn = retain ? "na_backward_retain" : "na_backward";
    char s1[NA_DESCRIBE_MAX], s2[NA_DESCRIBE_MAX];
    if (!na_check_tensor(fn, root, "root")) return na_last_status();
    if (!root->requires_grad)
        return na_set_error(NA_ESTATE, "%s: the root %s does not require grad (no input of the "
                            "graph requires grad, or it was built under no-grad)", fn,
                            na_tensor_describe(root, s1, sizeof s1));
    if (!grad) {
        if (root->numel != 1)
            return na_set_error(NA_ESHAPE, "%s: the root %s is not a scalar: pass its gradient "
                                "explicitly", fn, na_tensor_describe(root, s1, sizeof s1));
        if (!(grad = na_ones(root->dtype, root->device, root->ndim, root->shape)))
            return na_last_status();
    } else if (!na_same_shape(grad, root) || grad->device != root->device) {
        return na_set_error(NA_ESHAPE, "%s: gradient %s does not match the root %s", fn,
                            na_tensor_describe(grad, s1, sizeof s1),
                            na_tensor_describe(root, s2, sizeof s2));
    }
    pass p = {.mark = na_arena_host_mark(), .free_saved = !retain};
    if (backward_observer) {
        int rc = backward_observer(NULL, NULL);
        if (rc) return na_set_error(rc, "%s: the backward observer: %s", fn, na_last_error());
    }
    if (!root->grad_fn) {
        int rc = accumulate(&p, root, grad);
        if (!rc) rc = na_zero_settle_all();
        return !rc && leaf_hook.fn ? leaf_hook.fn(root, leaf_hook.ctx) : rc;
    }

    node_list order = {0};
    int rc = topo_sort(root->grad_fn, &order);
    leaf_final *finals = NULL;
    size_t n_finals = 0, next_final = 0;
    if (!rc && leaf_hook.fn) rc = leaf_schedule(&order, &finals, &n_finals);
    if (!rc && p.free_saved) count_saved(&p, &order, root);
    for (size_t i = 0; i < order.n; i++) order.items[i]->out->grad = NULL; /* fresh pass */
    na_no_grad_begin();
    /* Gradients are computed in the forward's dtypes: autocast reads in_backward and leaves
     * the ops the backward functions call alone, even inside an open region. */
    bool outer = !in_backward;
    in_backward = true;
    if (!rc) rc = accumulate(&p, root, grad);
    for (size_t i = order.n; i-- > 0 && !rc;) {
        na_node *n = order.items[i];
        na_tensor *gout = n->out->grad;
        if (!gout) { /* nothing flowed into this node */
            release_saved(&p, n);
            if (finals) rc = fire_final(finals, n_finals, &next_final, i);
            continue;
        }
        na_tensor *gin[NA_NODE_MAX_INPUTS] = {0};
        if ((rc = check_not_used(fn, n)) || (rc = check_versions(fn, n))) break;
        if (backward_observer && (rc = backward_observer(n->op, gout))) {
            na_set_error(rc, "%s: the backward observer at %s: %s", fn, n->op->name,
                         na_last_error());
            break;
        }
        offer_grad_into(n);
        rc = n->op->backward(n, gout, gin);
        for (int k = 0; k < n->n_inputs; k++) {
            if (gin[k] && gin[k] == n->grad_into[k]) { /* written in place: accumulated */
                na_zero_claim(gin[k]);
                gin[k] = NULL;
            }
            n->grad_into[k] = NULL; /* a retained graph's next walk offers anew */
        }
        if (rc) {
            na_set_error(rc, "%s: backward of %s failed: %s", fn, n->op->name, na_last_error());
            break;
        }
        /* the node's gradients are held while any of them is being accumulated: one may
         * be a view of another's block */
        for (int k = 0; k < n->n_inputs; k++)
            if (gin[k]) hold(&p, gin[k]);
        for (int k = 0; k < n->n_inputs && !rc; k++)
            if (gin[k] && na_node_needs_grad(n, k)) rc = accumulate(&p, n->inputs[k], gin[k]);
        for (int k = 0; k < n->n_inputs && !rc; k++)
            if (gin[k]) unhold(&p, gin[k]);
        if (!rc) { /* consumed */
            if (!n->op->keeps_gout) unhold(&p, gout);
            n->out->grad = NULL;
            n->walked = !retain;
            release_saved(&p, n);
        }
        if (finals && !rc) rc = fire_final(finals, n_finals, &next_final, i);
        if (na_profile_on()) na_profile_mark(n->op->name, true, n->out->device, n->layer);
    }
    if (outer) in_backward = false;
    na_no_grad_end();
    int settled = na_zero_settle_all(); /* the marked gradients no node wrote: zeros */
    if (!rc) rc = settled;
    free(order.items);
    free(finals);
    free(p.grads.keys);
    free(p.grads.vals);
    free(p.acts.keys);
    free(p.acts.vals);
    return rc;
}

int na_backward(na_tensor *root, na_tensor *grad) { return backward(root, grad, false); }
int na_backward_retain(na_tensor *root, na_tensor *grad) { return backward(root, grad, true); }
