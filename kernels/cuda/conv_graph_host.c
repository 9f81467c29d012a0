/* kernels/cuda/conv_graph_host.c — the host logic of the cuDNN graph convolutions, in plain C
 * (see conv_graph.h): problems (the cache key and the tensors' dims and strides), the engine
 * filter, the choice of the fastest timed plan and the bounded plan cache. No CUDA here, so
 * every build has it and tests/test_conv_graph.c checks it on the CPU.
 */
#include "cuda/conv_graph.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanoamp/error.h"

static const char *const kind_names[NA_CG_KINDS] = {"forward", "backward data",
                                                    "backward weight", "forward+bias+relu",
                                                    "forward+stats"};

static int64_t at_least_1(int v) { return v > 0 ? v : 1; }

int64_t na_cg_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int64_t align = 16;
    while (align > 2 && a % (uintptr_t)align) align /= 2;
    return align;
}

/* t from a 4-d view whose shape must be want[0..3]; < 0 with an error otherwise */
static int tensor_of(na_cg_tensor *t, const na_view *v, const int64_t want[4], na_dtype dt,
                     const char *who, const char *name) {
    if (!v || !v->data)
        return na_set_error(NA_EINVAL, "%s: conv graph: no %s tensor", who, name);
    if (v->dtype != dt)
        return na_set_error(NA_EDTYPE, "%s: conv graph: %s is %s, x is %s", who, name,
                            na_dtype_name(v->dtype), na_dtype_name(dt));
    if (v->ndim != 4 || v->shape[0] != want[0] || v->shape[1] != want[1] ||
        v->shape[2] != want[2] || v->shape[3] != want[3])
        return na_set_error(NA_ESHAPE,
                            "%s: conv graph: %s has %d dims [%lld, %lld, %lld, %lld], the "
                            "geometry wants [%lld, %lld, %lld, %lld]",
                            who, name, v->ndim, (long long)v->shape[0],
                            (long long)(v->ndim > 1 ? v->shape[1] : 0),
                            (long long)(v->ndim > 2 ? v->shape[2] : 0),
                            (long long)(v->ndim > 3 ? v->shape[3] : 0), (long long)want[0],
                            (long long)want[1], (long long)want[2], (long long)want[3]);
    for (int i = 0; i < 4; i++) {
        if (v->stride[i] < 1)
            return na_set_error(NA_EINVAL, "%s: conv graph: %s's stride %lld on dim %d (cuDNN "
                                "takes strides >= 1)", who, name, (long long)v->stride[i], i);
        t->dim[i] = want[i];
        t->stride[i] = v->stride[i];
    }
    t->align = na_cg_alignment(v->data);
    return NA_OK;
}

/* A per-channel vector (bias, sum, sqsum: `name`) of dtype dt: [K] or [1, K, 1, 1], described
 * as [1, K, 1, 1] whose unit dims have the strides they would have in y's layout (NCHW y: [K,
 * 1, 1, 1]; channels-last y: [K, 1, K, K]), as cuDNN's pointwise and GenStats operations
 * expect operands of one layout. `dt_is` says whose dtype it must have ("x is f16"). */
static int channel_vector_of(na_cg_tensor *t, const na_view *b, const na_cg_tensor *y, int64_t k,
                             na_dtype dt, const char *dt_is, const char *who, const char *name) {
    if (!b || !b->data) return na_set_error(NA_EINVAL, "%s: conv graph: no %s", who, name);
    if (b->dtype != dt)
        return na_set_error(NA_EDTYPE, "%s: conv graph: %s is %s, %s", who, name,
                            na_dtype_name(b->dtype), dt_is);
    int cdim = b->ndim == 1 ? 0 : 1;
    bool ok = b->ndim == 1 ? b->shape[0] == k
                           : b->ndim == 4 && b->shape[0] == 1 && b->shape[1] == k &&
                                 b->shape[2] == 1 && b->shape[3] == 1;
    if (!ok || b->stride[cdim] < 1)
        return na_set_error(NA_ESHAPE, "%s: conv graph: %s must be [%lld] or [1, %lld, 1, 1] "
                            "with a positive stride (it has %d dims, %lld elements)",
                            who, name, (long long)k, (long long)k, b->ndim, (long long)b->numel);
    int64_t s = b->stride[cdim];
    for (int i = 0; i < 4; i++) {
        t->dim[i] = i == 1 ? k : 1;
        t->stride[i] = i != 1 && y->stride[i] > y->stride[1] ? s * k : s;
    }
    t->align = na_cg_alignment(b->data);
    return NA_OK;
}

int na_cg_problem_init(na_cg_problem *p, na_cg_kind kind, const na_conv_geom *g,
                       const na_view *x, const na_view *w, const na_view *y,
                       const na_view *bias, const na_view *sum, const na_view *sqsum,
                       bool tf32, bool deterministic, bool autotune, const char *who) {
    memset(p, 0, sizeof *p);
    if ((int)kind < 0 || kind >= NA_CG_KINDS)
        return na_set_error(NA_EINVAL, "%s: conv graph: kind %d is not one of the %d kinds", who,
                            (int)kind, NA_CG_KINDS);
    na_dtype dt = x ? x->dtype : NA_DTYPE_COUNT;
    if (dt != NA_DTYPE_F32 && dt != NA_DTYPE_F16 && dt != NA_DTYPE_BF16)
        return na_set_error(NA_EDTYPE, "%s: conv graph: dtype %s (f32, f16 and bf16 only)", who,
                            na_dtype_name(dt));
    int64_t groups = at_least_1(g->groups);
    if (g->c_in % groups || g->c_out % groups)
        return na_set_error(NA_EINVAL, "%s: conv graph: %lld input / %lld output channels are "
                            "not divisible by %lld groups", who, (long long)g->c_in,
                            (long long)g->c_out, (long long)groups);
    p->kind = kind;
    p->dtype = dt;
    p->tf32 = tf32 && dt == NA_DTYPE_F32; /* TF32 changes nothing else: one plan serves */
    p->deterministic = deterministic;
    p->autotune = autotune;
    const int64_t xs[4] = {g->n, g->c_in, g->h, g->w};
    const int64_t ws[4] = {g->c_out, g->c_in / groups, g->kh, g->kw};
    const int64_t ys[4] = {g->n, g->c_out, g->oh, g->ow};
    int rc = tensor_of(&p->t[NA_CG_X], x, xs, dt, who, kind == NA_CG_BWD_DATA ? "gx" : "x");
    if (rc == NA_OK)
        rc = tensor_of(&p->t[NA_CG_W], w, ws, dt, who, kind == NA_CG_BWD_FILTER ? "gw" : "w");
    if (rc == NA_OK)
        rc = tensor_of(&p->t[NA_CG_Y], y, ys, dt, who,
                       kind == NA_CG_BWD_DATA || kind == NA_CG_BWD_FILTER ? "gy" : "y");
    char x_is[24];
    snprintf(x_is, sizeof x_is, "x is %s", na_dtype_name(dt));
    const na_cg_tensor *yt = &p->t[NA_CG_Y];
    if (rc == NA_OK && kind == NA_CG_FWD_BIAS_RELU)
        rc = channel_vector_of(&p->t[NA_CG_BIAS], bias, yt, g->c_out, dt, x_is, who, "bias");
    if (rc == NA_OK && kind == NA_CG_FWD_STATS)
        rc = channel_vector_of(&p->t[NA_CG_SUM], sum, yt, g->c_out, NA_DTYPE_F32,
                               "the sums are f32", who, "sum");
    if (rc == NA_OK && kind == NA_CG_FWD_STATS)
        rc = channel_vector_of(&p->t[NA_CG_SQSUM], sqsum, yt, g->c_out, NA_DTYPE_F32,
                               "the sums are f32", who, "sqsum");
    if (rc < 0) {
        memset(p, 0, sizeof *p);
        return rc;
    }
    p->pad[0] = g->ph, p->pad[1] = g->pw;
    p->stride[0] = at_least_1(g->sh), p->stride[1] = at_least_1(g->sw);
    p->dilation[0] = at_least_1(g->dh), p->dilation[1] = at_least_1(g->dw);
    return NA_OK;
}

void na_conv_layout_strides(na_conv_layout layout, const int64_t dim[4], int64_t stride[4]) {
    if (layout == NA_CONV_NHWC) {
        stride[1] = 1, stride[3] = dim[1], stride[2] = dim[3] * dim[1];
        stride[0] = dim[2] * stride[2];
    } else {
        stride[3] = 1, stride[2] = dim[3], stride[1] = dim[2] * dim[3];
        stride[0] = dim[1] * stride[1];
    }
}

/* 4 dims and their strides dense in `layout` (strides of size-1 dims ignored) */
static bool dims_have_layout(const int64_t dim[4], const int64_t stride[4],
                             na_conv_layout layout) {
    int64_t want[4];
    na_conv_layout_strides(layout, dim, want);
    for (int i = 0; i < 4; i++)
        if (dim[i] != 1 && stride[i] != want[i]) return false;
    return true;
}

/* v is a 4-d view dense in `layout` */
static bool has_layout(const na_view *v, na_conv_layout layout) {
    return v->ndim == 4 && dims_have_layout(v->shape, v->stride, layout);
}

int na_conv_layout_of(na_cg_kind kind, const na_view *x, const na_view *w, const na_view *y,
                      na_conv_layout *out, const char *who) {
    const na_view *v[3] = {x, w, y};
    for (int l = NA_CONV_NCHW; l <= NA_CONV_NHWC; l++)
        if (has_layout(x, (na_conv_layout)l) && has_layout(w, (na_conv_layout)l) &&
            has_layout(y, (na_conv_layout)l)) {
            *out = (na_conv_layout)l;
            return NA_OK;
        }
    const bool bwd = kind == NA_CG_BWD_DATA || kind == NA_CG_BWD_FILTER;
    const char *names[3] = {kind == NA_CG_BWD_DATA ? "gx" : "x",
                            kind == NA_CG_BWD_FILTER ? "gw" : "w", bwd ? "gy" : "y"};
    char desc[3][160];
    for (int i = 0; i < 3; i++) {
        const na_view *t = v[i];
        long long d[4] = {0}, s[4] = {0};
        for (int k = 0; k < 4 && k < t->ndim; k++) d[k] = t->shape[k], s[k] = t->stride[k];
        snprintf(desc[i], sizeof desc[i], "%s %dd [%lld, %lld, %lld, %lld] str [%lld, %lld, %lld, "
                 "%lld]", names[i], t->ndim, d[0], d[1], d[2], d[3], s[0], s[1], s[2], s[3]);
    }
    return na_set_error(NA_EINVAL, "%s: the tensors are neither all contiguous NCHW nor all "
                        "channels-last (x, y: strides [C*H*W, 1, W*C, C], w: [C*R*S, 1, S*C, "
                        "C]): %s; %s; %s", who, desc[0], desc[1], desc[2]);
}

const char *na_cg_problem_str(const na_cg_problem *p, char *buf, size_t n) {
    static const char *const names[NA_CG_TENSORS] = {"x", "w", "y", "bias", "sum", "sqsum"};
    if (!n) return buf;
    size_t at = 0;
    int k = (int)p->kind;
    at += (size_t)snprintf(buf, n, "%s %s%s", k >= 0 && k < NA_CG_KINDS ? kind_names[k] : "?",
                           na_dtype_name((na_dtype)p->dtype), p->tf32 ? " (tf32)" : "");
    for (int i = 0; i < NA_CG_TENSORS && at < n; i++) {
        const na_cg_tensor *t = &p->t[i];
        if ((i == NA_CG_BIAS && p->kind != NA_CG_FWD_BIAS_RELU) ||
            (i >= NA_CG_SUM && p->kind != NA_CG_FWD_STATS))
            continue;
        at += (size_t)snprintf(buf + at, n - at, " %s [%lld, %lld, %lld, %lld] str [%lld, %lld, "
                               "%lld, %lld]", names[i], (long long)t->dim[0], (long long)t->dim[1],
                               (long long)t->dim[2], (long long)t->dim[3], (long long)t->stride[0],
                               (long long)t->stride[1], (long long)t->stride[2],
                               (long long)t->stride[3]);
    }
    if (at < n)
        snprintf(buf + at, n - at, " stride %lldx%lld pad %lldx%lld dil %lldx%lld",
                 (long long)p->stride[0], (long long)p->stride[1], (long long)p->pad[0],
                 (long long)p->pad[1], (long long)p->dilation[0], (long long)p->dilation[1]);
    return buf;
}

const char *na_cg_engine_rejects(unsigned notes, na_dtype dt, bool tf32, bool deterministic,
                                 bool allow_runtime_compiled) {
    if (notes & NA_CG_NOTE_DOWN_CONVERT) return "down-converts its inputs";
    if (notes & NA_CG_NOTE_REDUCED_PRECISION) return "reduces in less than f32";
    if (deterministic && (notes & NA_CG_NOTE_NONDETERMINISTIC))
        return "non-deterministic (NANOAMP_DETERMINISTIC=1)";
    if (dt == NA_DTYPE_F32 && (notes & (NA_CG_NOTE_FFT | NA_CG_NOTE_WINOGRAD)))
        return "FFT/Winograd on f32 (error above the f32 tolerance)";
    if (dt == NA_DTYPE_F32 && !tf32 && (notes & NA_CG_NOTE_TENSOR_CORE))
        return "tensor cores on f32 are TF32 (strict f32: NANOAMP_TF32 is off)";
    if (!allow_runtime_compiled && (notes & NA_CG_NOTE_RUNTIME_COMPILED))
        return "runtime-compiled (NVRTC in the warm-up)";
    return NULL;
}

const char *na_cg_stats_rejects(const na_cg_problem *p, int cc_major) {
    if (p->kind != NA_CG_FWD_STATS) return NULL;
    if (p->dtype != NA_DTYPE_F16 && p->dtype != NA_DTYPE_F32)
        return "GenStats reads f16 or f32 only";
    if (p->dtype == NA_DTYPE_F32 && cc_major < 8)
        return "GenStats reads f32 from compute capability 8.0 on";
    for (int i = NA_CG_X; i <= NA_CG_Y; i++)
        if (!dims_have_layout(p->t[i].dim, p->t[i].stride, NA_CONV_NHWC))
            return "GenStats wants NHWC fully packed tensors (x, y channels-last, w KRSC)";
    if (p->t[NA_CG_SUM].stride[1] != 1 || p->t[NA_CG_SQSUM].stride[1] != 1)
        return "GenStats wants packed sums (stride 1)";
    if (p->dtype == NA_DTYPE_F16)
        for (int i = 0; i < NA_CG_TENSORS; i++)
            if (i != NA_CG_BIAS && p->t[i].align < 16)
                return "ConvBNfprop wants 16-byte aligned pointers";
    return NULL;
}

int na_cg_fastest(const float *ms, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (isfinite(ms[i]) && ms[i] >= 0 && (best < 0 || ms[i] < ms[best])) best = i;
    return best;
}

/* ---- the plan cache ------------------------------------------------------------------------ */
static uint64_t problem_hash(const na_cg_problem *p) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < sizeof *p; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

na_cg_entry *na_cg_cache_find(na_cg_cache *c, const na_cg_problem *key) {
    uint64_t h = problem_hash(key);
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) {
        na_cg_entry *e = &c->e[i];
        if (e->used && e->hash == h && memcmp(&e->key, key, sizeof *key) == 0) {
            e->last_use = ++c->clock;
            return e;
        }
    }
    return NULL;
}

na_cg_entry *na_cg_cache_claim(na_cg_cache *c, const na_cg_problem *key, void **evicted) {
    na_cg_entry *slot = NULL;
    *evicted = NULL;
    for (int i = 0; i < NA_CG_CACHE_CAP && !(slot && !slot->used); i++) {
        na_cg_entry *e = &c->e[i];
        if (e->pinned) continue;
        if (!slot || !e->used || e->last_use < slot->last_use) slot = e;
    }
    if (!slot) return NULL;
    *evicted = slot->used ? slot->plan : NULL;
    memset(slot, 0, sizeof *slot);
    slot->used = true;
    slot->key = *key;
    slot->hash = problem_hash(key);
    slot->last_use = ++c->clock;
    return slot;
}

void na_cg_cache_drop(na_cg_entry *e) { memset(e, 0, sizeof *e); }

void na_cg_cache_pin(na_cg_entry *e) { e->pinned = true; }

void na_cg_cache_unpin_all(na_cg_cache *c) {
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) c->e[i].pinned = false;
}

/* ---- statuses ------------------------------------------------------------------------------ */
int na_cudnn_status_kind(int status, int cudnn_major) {
    return cudnn_major >= 9 ? status / 1000 * 1000 : status;
}

na_cg_verdict na_cg_status_verdict(int status, na_cg_stage stage) {
    if (status == 0) return NA_CG_OK;
    return stage == NA_CG_AT_CONFIG ? NA_CG_NEXT_CONFIG : NA_CG_UNSERVED;
}
