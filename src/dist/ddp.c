/* The data-parallel wrapper (PyTorch's DDP): parameters and buffers from rank 0, gradients
 * averaged over ranks in buckets whose all-reduce starts during backward.
 *
 * Buckets hold the trainable parameters in reverse registration order, the order backward
 * finishes them. Each bucket owns a flat buffer in its reduction dtype; the engine's leaf hook
 * (src/autograd/graph.h) copies a gradient into its slice as soon as it is final, and once a
 * bucket's last slice is in, the bucket's all-reduce starts (buckets start strictly in order,
 * so every rank issues the same collectives in the same sequence even when gradients finish
 * in a different order). na_ddp_finish waits and copies the averages back, then broadcasts
 * rank 0's buffers (one flat tensor per dtype and device, PyTorch's broadcast_buffers) unless
 * the config turns that off. The f32 path sums and then divides by the world size; a
 * compressed (f16/bf16) bucket is divided first, so the sum stays in range, then summed in the
 * narrow dtype. In a world of one nothing is copied or sent: the wrapper only counts; unless
 * NANOAMP_DIST_COLLECTIVES=1, which runs every step of the path above with one rank (NCCL for
 * CUDA buckets; host buckets skip only the MPI call). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/autograd/graph.h"
#include "src/dist/dist_internal.h"

#define DDP_DEFAULT_BUCKET_BYTES (25 * 1024 * 1024)

typedef struct {
    int first, count; /* params [first, first + count) of na_ddp.params */
    int64_t numel;
    na_dtype dt;    /* reduction dtype */
    na_tensor *buf; /* flat [numel], persistent, on the parameters' device (NULL when
                       !na_dist_collectives: a world of 1 without NANOAMP_DIST_COLLECTIVES) */
    int pending;    /* gradients not yet final in this backward */
    na_dist_req req;
    bool started;
} bucket;

typedef struct {
    na_tensor *t;
    int index;
} param_ref;

/* The buffers of one dtype and device, broadcast as one flat tensor. */
typedef struct {
    na_dtype dt;
    na_device dev;
    int64_t numel;
    na_tensor *flat;
} buffer_group;

struct na_ddp {
    na_dist *d;
    na_ddp_config cfg;
    int n;               /* trainable parameters */
    na_tensor **params;  /* in bucket order (reverse registration) */
    int64_t *offset;     /* of each parameter in its bucket's buffer */
    int *bucket_of;
    bool *ready;         /* final in this backward */
    param_ref *by_addr;  /* params sorted by address: the hook's lookup */
    int n_buckets;
    bucket *buckets;
    int next_start;      /* buckets start in order */
    bool sync;
    int64_t bytes_step, bytes_last; /* started so far in this backward; in the last one */
    na_graph_leaf_hook prev; /* the hook this wrapper chains to */
    int n_buffers, n_groups;   /* broadcast from rank 0 after each synced step */
    na_tensor **buffers;
    int *group_of;
    int64_t *buffer_offset;    /* in its group's flat tensor */
    buffer_group *groups;
};

static na_ddp *active; /* one wrapper at a time owns the engine hook */

static int by_addr(const void *pa, const void *pb) {
    uintptr_t a = (uintptr_t)((const param_ref *)pa)->t, b = (uintptr_t)((const param_ref *)pb)->t;
    return a < b ? -1 : a > b;
}

static const char *param_name(const na_tensor *t) { return t->name ? t->name : "(unnamed)"; }

/* flat[off, off + numel of like), shaped as like. */
static na_tensor *view_in(na_tensor *flat, int64_t off, const na_tensor *like) {
    na_tensor *s = na_slice(flat, off, off + like->numel);
    return s ? na_reshape(s, like->ndim, like->shape) : NULL;
}

/* The slice of bucket b's buffer that holds parameter i, shaped as the parameter. */
static na_tensor *slice_of(na_ddp *p, int i) {
    return view_in(p->buckets[p->bucket_of[i]].buf, p->offset[i], p->params[i]);
}

/* Rank 0's buffers (BatchNorm's running statistics) on every rank, one broadcast per dtype
 * and device (PyTorch's broadcast_buffers). */
static int copy_buffers(na_ddp *p, bool into_flat) {
    int rc = NA_OK;
    for (int i = 0; i < p->n_buffers && !rc; i++) {
        na_tensor *v = view_in(p->groups[p->group_of[i]].flat, p->buffer_offset[i], p->buffers[i]);
        rc = !v ? na_last_status() : into_flat ? na_copy_(v, p->buffers[i])
                                               : na_copy_(p->buffers[i], v);
    }
    return rc;
}
static int broadcast_buffers(na_ddp *p) {
    int rc = NA_OK, rank = na_dist_rank(p->d);
    if (rank == 0) rc = copy_buffers(p, true);
    for (int g = 0; g < p->n_groups && !rc; g++) rc = na_dist_broadcast(p->d, p->groups[g].flat, 0);
    if (!rc && rank != 0) rc = copy_buffers(p, false);
    return rc ? na_set_error(rc, "na_ddp_finish: rank %d: broadcasting the buffers: %s", rank,
                             na_last_error())
              : NA_OK;
}

static bool compressed(const bucket *b) { return b->dt == NA_DTYPE_F16 || b->dt == NA_DTYPE_BF16; }

/* Gradient i into its slice (zeros when it has none), divided by the world size first when
 * the bucket is compressed, whatever the gradient's own dtype (an f16 gradient into an f16
 * bucket too): the sum of N pre-divided values stays in the narrow range, and the bucket
 * then holds the mean (PyTorch's fp16_compress_hook divides before its all-reduce too). */
static int copy_in(na_ddp *p, int i) {
    na_tensor *t = p->params[i], *s = slice_of(p, i);
    if (!s) return na_last_status();
    if (!t->grad) return na_fill_(s, 0.0);
    if (!compressed(&p->buckets[p->bucket_of[i]])) return na_copy_(s, t->grad);
    na_tensor *q = na_scale(t->grad, 1.0 / p->d->world); /* in the gradient's dtype, rounded once */
    return q ? na_copy_(s, q) : na_last_status();
}

static int start_ready_buckets(na_ddp *p) {
    while (p->next_start < p->n_buckets && !p->buckets[p->next_start].pending) {
        bucket *b = &p->buckets[p->next_start++];
        char what[64];
        snprintf(what, sizeof what, "gradient bucket %d of %d", (int)(b - p->buckets),
                 p->n_buckets);
        b->started = true;
        p->bytes_step += b->numel * (int64_t)na_dtype_size(b->dt);
        if (!na_dist_collectives(p->d)) continue;
        int rc = na_dist_start_sum(p->d, b->buf, &b->req, "na_ddp", what);
        if (rc) return rc;
    }
    for (int k = 0; k < p->next_start; k++) na_dist_poke(p->d, &p->buckets[k].req);
    return NA_OK;
}

static int mark_ready(na_ddp *p, int i) {
    if (p->ready[i]) return NA_OK;
    p->ready[i] = true;
    if (na_dist_collectives(p->d)) {
        int rc = copy_in(p, i);
        if (rc) return na_set_error(rc, "na_ddp: rank %d: gradient of %s into its bucket: %s",
                                    p->d->rank, param_name(p->params[i]), na_last_error());
    }
    p->buckets[p->bucket_of[i]].pending--;
    return start_ready_buckets(p);
}

static int leaf_final(na_tensor *leaf, void *ctx) {
    na_ddp *p = ctx;
    param_ref key = {leaf, 0}, *hit = NULL;
    if (p->sync) hit = bsearch(&key, p->by_addr, (size_t)p->n, sizeof key, by_addr);
    if (hit) return mark_ready(p, hit->index);
    return p->prev.fn ? p->prev.fn(leaf, p->prev.ctx) : NA_OK;
}

static void reset_step(na_ddp *p) {
    memset(p->ready, 0, (size_t)p->n * sizeof *p->ready);
    for (int k = 0; k < p->n_buckets; k++) {
        p->buckets[k].pending = p->buckets[k].count;
        p->buckets[k].started = false;
    }
    p->next_start = 0;
    p->bytes_step = 0;
}

/* Parameter i's gradient = its slice, averaged (a gradient is made where none was). */
static int copy_out(na_ddp *p, int i) {
    na_tensor *t = p->params[i], *s = slice_of(p, i);
    if (!s) return na_last_status();
    if (!t->grad && !(t->grad = na_tensor_new(t->dtype, t->device, t->ndim, t->shape)))
        return na_last_status();
    return na_copy_(t->grad, s);
}

int na_ddp_finish(na_ddp *p) {
    const char *fn = "na_ddp_finish";
    if (!p) return na_set_error(NA_EINVAL, "%s: the wrapper is NULL", fn);
    if (!p->sync) return NA_OK;
    int rc = na_grad_settle(); /* gradients zero_grad marked and no backward wrote */
    /* parameters that got no gradient in this backward count as zeros */
    for (int i = 0; i < p->n && !rc; i++) rc = mark_ready(p, i);
    na_no_grad_begin();
    for (int k = 0; k < p->n_buckets && !rc; k++) {
        bucket *b = &p->buckets[k];
        char what[64];
        snprintf(what, sizeof what, "gradient bucket %d of %d", k, p->n_buckets);
        if (!na_dist_collectives(p->d)) continue;
        rc = na_dist_wait(p->d, &b->req, fn, what);
        if (!rc && !compressed(b)) { /* summed: now the average */
            na_tensor *q = na_scale(b->buf, 1.0 / p->d->world);
            rc = q ? na_copy_(b->buf, q) : na_last_status();
        }
        for (int i = b->first; i < b->first + b->count && !rc; i++) rc = copy_out(p, i);
    }
    /* after this step's forward updated them: the next forward starts from rank 0's, as
     * PyTorch's broadcast before each forward gives it */
    if (!rc && p->n_groups) rc = broadcast_buffers(p);
    na_no_grad_end();
    /* a failed rank leaves its requests; the others end with the launcher (docs/distributed.md) */
    for (int k = 0; rc && k < p->n_buckets; k++) p->buckets[k].req.active = false;
    p->bytes_last = p->bytes_step;
    reset_step(p);
    return rc;
}

int na_ddp_set_sync(na_ddp *p, bool sync) {
    if (!p) return na_set_error(NA_EINVAL, "na_ddp_set_sync: the wrapper is NULL");
    p->sync = sync;
    return NA_OK;
}

int64_t na_ddp_bytes_last_step(const na_ddp *p) { return p ? p->bytes_last : 0; }
int na_ddp_num_buckets(const na_ddp *p) { return p ? p->n_buckets : 0; }

void na_ddp_free(na_ddp *p) {
    if (!p) return;
    if (active == p) {
        na_graph_set_leaf_hook(p->prev);
        active = NULL;
    }
    for (int k = 0; k < p->n_buckets; k++) na_tensor_free(p->buckets[k].buf);
    free(p->buckets);
    free(p->params);
    free(p->offset);
    free(p->bucket_of);
    free(p->ready);
    free(p->by_addr);
    for (int g = 0; g < p->n_groups; g++) na_tensor_free(p->groups[g].flat);
    free(p->groups);
    free(p->buffers);
    free(p->group_of);
    free(p->buffer_offset);
    free(p);
}

/* The wrapper's settings, then the state's names, dtypes and shapes: ranks that built
 * different models (or chose different reductions) disagree on it. Field by field: a
 * struct's padding bytes are not part of its value. */
static uint64_t model_hash(const na_named_tensors *st, const na_ddp_config *cfg) {
    uint64_t h = na_dist_hash(NA_DIST_HASH_START, &cfg->bucket_bytes, sizeof cfg->bucket_bytes);
    h = na_dist_hash(h, &cfg->allreduce_dtype, sizeof cfg->allreduce_dtype);
    h = na_dist_hash(h, &cfg->no_broadcast_buffers, sizeof cfg->no_broadcast_buffers);
    return na_dist_hash_state(h, st);
}

/* Buckets in reverse parameter order: a new one when the dtype or device changes or the next
 * gradient would not fit (a gradient larger than a bucket gets a bucket of its own). */
static int make_buckets(na_ddp *p) {
    p->buckets = calloc((size_t)p->n + 1, sizeof *p->buckets);
    if (!p->buckets) return na_set_error(NA_ENOMEM, "na_ddp_new: out of memory");
    bucket *b = NULL;
    for (int i = 0; i < p->n; i++) {
        na_tensor *t = p->params[i];
        na_dtype dt = t->dtype == NA_DTYPE_F64 ? NA_DTYPE_F64 : p->cfg.allreduce_dtype;
        int64_t bytes = t->numel * (int64_t)na_dtype_size(dt);
        if (!b || b->dt != dt || p->params[b->first]->device != t->device ||
            (b->numel * (int64_t)na_dtype_size(dt) + bytes > p->cfg.bucket_bytes && b->count)) {
            b = &p->buckets[p->n_buckets++];
            *b = (bucket){.first = i, .dt = dt};
        }
        p->bucket_of[i] = (int)(b - p->buckets);
        p->offset[i] = b->numel;
        b->numel += t->numel;
        b->count++;
    }
    for (int k = 0; k < p->n_buckets && na_dist_collectives(p->d); k++) {
        b = &p->buckets[k];
        b->buf = na_tensor_new(b->dt, p->params[b->first]->device, NA_SHAPE(b->numel));
        if (!b->buf) return na_last_status();
    }
    return NA_OK;
}

/* The module's buffers grouped by dtype and device, each group a flat tensor (nothing when
 * the broadcast is off or collectives do no work). */
static int make_buffer_groups(na_ddp *p, na_module *net) {
    if (p->cfg.no_broadcast_buffers || !na_dist_collectives(p->d)) return NA_OK;
    na_named_tensors bt = {0};
    int rc = na_module_named_tensors(net, NA_MODULE_BUFFERS, "", &bt);
    if (rc) return rc;
    size_t n = (size_t)bt.n + 1;
    p->buffers = calloc(n, sizeof *p->buffers);
    p->group_of = calloc(n, sizeof *p->group_of);
    p->buffer_offset = calloc(n, sizeof *p->buffer_offset);
    p->groups = calloc(n, sizeof *p->groups);
    if (!p->buffers || !p->group_of || !p->buffer_offset || !p->groups)
        rc = na_set_error(NA_ENOMEM, "na_ddp_new: out of memory");
    for (int64_t k = 0; k < bt.n && !rc; k++) {
        na_tensor *t = bt.items[k].tensor;
        int g = 0;
        while (g < p->n_groups && (p->groups[g].dt != t->dtype || p->groups[g].dev != t->device))
            g++;
        if (g == p->n_groups) p->groups[p->n_groups++] = (buffer_group){t->dtype, t->device, 0, NULL};
        p->buffers[p->n_buffers] = t;
        p->group_of[p->n_buffers] = g;
        p->buffer_offset[p->n_buffers++] = p->groups[g].numel;
        p->groups[g].numel += t->numel;
    }
    na_named_tensors_free(&bt);
    for (int g = 0; g < p->n_groups && !rc; g++) {
        buffer_group *bg = &p->groups[g];
        if (!(bg->flat = na_tensor_new(bg->dt, bg->dev, NA_SHAPE(bg->numel)))) rc = na_last_status();
    }
    return rc;
}

na_ddp *na_ddp_new(na_dist *d, na_module *net, const na_ddp_config *cfg) {
    const char *fn = "na_ddp_new";
    na_ddp_config c = cfg ? *cfg : (na_ddp_config){0};
    if (!c.bucket_bytes) c.bucket_bytes = DDP_DEFAULT_BUCKET_BYTES;
    if (c.allreduce_dtype == NA_DTYPE_F64) c.allreduce_dtype = NA_DTYPE_F32; /* 0 is F64 */
    if (!d || !net) {
        na_set_error(NA_EINVAL, "%s: need a communicator and a module", fn);
        return NULL;
    }
    if (cfg && cfg->allreduce_dtype != NA_DTYPE_F64 && cfg->allreduce_dtype != NA_DTYPE_F32 &&
        cfg->allreduce_dtype != NA_DTYPE_F16 && cfg->allreduce_dtype != NA_DTYPE_BF16) {
        na_set_error(NA_EDTYPE, "%s: allreduce_dtype must be f32, f16 or bf16, got %s", fn,
                     na_dtype_name(cfg->allreduce_dtype));
        return NULL;
    }
    if (c.bucket_bytes < 0) {
        na_set_error(NA_EINVAL, "%s: bucket_bytes must be >= 0, got %" PRId64, fn, c.bucket_bytes);
        return NULL;
    }
    if (active) {
        na_set_error(NA_ESTATE, "%s: another na_ddp is active (free it first)", fn);
        return NULL;
    }
    na_named_tensors st = {0};
    int rc = na_module_state(net, "", &st);
    if (!rc) rc = na_dist_check_same(d, model_hash(&st, &c), "model (parameter names, shapes "
                                     "and dtypes) or DDP settings");
    for (int64_t k = 0; k < st.n && !rc; k++) rc = na_dist_broadcast(d, st.items[k].tensor, 0);
    na_named_tensors_free(&st);
    if (rc) na_set_error(rc, "%s: %s", fn, na_last_error());
    na_tensor_list params = na_module_parameters(net);
    if (!rc) rc = na_tensor_list_check(fn, params);
    na_ddp *p = rc ? NULL : calloc(1, sizeof *p);
    if (!rc && !p) rc = na_set_error(NA_ENOMEM, "%s: out of memory", fn);
    if (rc) return NULL;
    *p = (na_ddp){.d = d, .cfg = c, .n = (int)params.n, .sync = true};
    size_t n = (size_t)p->n + 1;
    p->params = calloc(n, sizeof *p->params);
    p->offset = calloc(n, sizeof *p->offset);
    p->bucket_of = calloc(n, sizeof *p->bucket_of);
    p->ready = calloc(n, sizeof *p->ready);
    p->by_addr = calloc(n, sizeof *p->by_addr);
    if (!p->params || !p->offset || !p->bucket_of || !p->ready || !p->by_addr) {
        na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        na_ddp_free(p);
        return NULL;
    }
    for (int i = 0; i < p->n; i++) {
        p->params[i] = params.items[p->n - 1 - i];
        p->by_addr[i] = (param_ref){p->params[i], i};
    }
    qsort(p->by_addr, (size_t)p->n, sizeof *p->by_addr, by_addr);
    if (make_buckets(p) != NA_OK || make_buffer_groups(p, net) != NA_OK) {
        na_ddp_free(p);
        return NULL;
    }
    reset_step(p);
    p->prev = na_graph_set_leaf_hook((na_graph_leaf_hook){leaf_final, p});
    active = p;
    return p;
}
