/* kernels/cuda/conv_graph.cu — conv2d through cuDNN's backend graph API (see conv_graph.h).
 *
 * Per problem (na_cg_problem: kind, dtype, dims, strides, alignments, math mode,
 * determinism, autotune) the first call builds the operation graph, asks the heuristics
 * (mode A, then FALLBACK) for engine configurations, drops those whose notes
 * na_cg_engine_rejects, and finalizes execution plans: the first that builds, or with
 * NANOAMP_CUDNN_FIND=1 the fastest of up to NA_CG_MAX_TIMED, timed with CUDA events on the
 * call's own buffers (the warm-up). The plan and the descriptors it was made from stay in the
 * cache (conv_graph_host.c) until evicted or na_cuda_conv_graph_release. Later calls make one
 * variant pack (the data pointers and the workspace) and execute.
 *
 * Any failing status of one engine configuration passes it over for the next (as
 * cudnn-frontend does); a failing graph or heuristic mode, no engine left, or a cached plan
 * that fails to run sends the problem to the legacy path for good (na_cg_status_verdict; the
 * reason printed under NANOAMP_CUDNN_GRAPH_VERBOSE=1). Only CUDA event and descriptor-release
 * failures are errors. A plan used while a step graph is captured is pinned in the cache until
 * the last step graph is freed (na_cuda_conv_graph_unpin). The conv + GenStats kind
 * (conv2d_stats) has no legacy path: its problems are "not served" (the caller runs conv2d
 * and a BatchNorm), also when na_cg_stats_rejects says cuDNN documents no engine for them
 * (then nothing is asked of cuDNN). Needs cuDNN 9 (the
 * graph API's v9 names); with an older cuDNN or none, the graph path serves nothing.
 */
#include <stdio.h>

#include "cuda_common.cuh"
#include "cuda/conv_graph.h"

#if NA_HAVE_CUDNN && CUDNN_MAJOR >= 9
#define NA_CG_BUILT 1
#else
#define NA_CG_BUILT 0
#endif

extern "C" bool na_cuda_conv_graph_enabled(void) {
    static int on = -1;
    if (on < 0) on = NA_CG_BUILT && na_cuda_env_is("NANOAMP_CUDNN_GRAPH", "1");
    return on == 1;
}

#if NA_CG_BUILT
typedef cudnnBackendDescriptor_t cg_desc;

static bool cg_verbose(void) {
    static int on = -1;
    if (on < 0) on = na_cuda_env_is("NANOAMP_CUDNN_GRAPH_VERBOSE", NULL);
    return on == 1;
}

/* The first failing cuDNN call of a sequence; the calls after it are skipped. */
struct cg_status {
    cudnnStatus_t st;
    char call[112];
};

static bool cg_note(cg_status *s, cudnnStatus_t st, const char *fn, const char *what) {
    if (st == CUDNN_STATUS_SUCCESS) return true;
    s->st = st;
    snprintf(s->call, sizeof s->call, "%s(%s)", fn, what);
    return false;
}
static bool cg_create(cg_status *s, cudnnBackendDescriptorType_t type, cg_desc *d,
                      const char *what) {
    *d = NULL;
    return !s->st && cg_note(s, cudnnBackendCreateDescriptor(type, d), "cudnnBackendCreateDescriptor", what);
}
static bool cg_finalize(cg_status *s, cg_desc d, const char *what) {
    return !s->st && cg_note(s, cudnnBackendFinalize(d), "cudnnBackendFinalize", what);
}
static bool cg_set_(cg_status *s, cg_desc d, const char *what, cudnnBackendAttributeName_t a,
                    cudnnBackendAttributeType_t t, int64_t n, const void *v) {
    return !s->st && cg_note(s, cudnnBackendSetAttribute(d, a, t, n, v), "cudnnBackendSetAttribute", what);
}
static bool cg_get_(cg_status *s, cg_desc d, const char *what, cudnnBackendAttributeName_t a,
                    cudnnBackendAttributeType_t t, int64_t n, int64_t *got, void *v) {
    return !s->st && cg_note(s, cudnnBackendGetAttribute(d, a, t, n, got, v), "cudnnBackendGetAttribute", what);
}
#define CG_SET(s, d, attr, type, n, v) cg_set_(s, d, #attr, attr, type, n, v)
#define CG_GET(s, d, attr, type, n, got, v) cg_get_(s, d, #attr, attr, type, n, got, v)

/* Destroys *d (NULL is fine); a failure is noted in s when s has none yet. */
static void cg_destroy(cg_desc *d, cg_status *s) {
    if (*d) {
        cudnnStatus_t st = cudnnBackendDestroyDescriptor(*d);
        if (s && !s->st) cg_note(s, st, "cudnnBackendDestroyDescriptor", "");
    }
    *d = NULL;
}

/* A cached plan with everything it was made from: the graph's tensors, operations and
 * operation graph, the chosen engine configuration and the execution plan. */
#define CG_PARTS 16 /* the bias+relu graph has 13 */
struct cg_plan {
    cg_desc part[CG_PARTS];
    int n_part;
    cg_desc cfg, plan;
    int64_t workspace, engine;
    int n_uids, slot[NA_CG_TENSORS]; /* the graph's non-virtual tensors (NA_CG_X, ...) */
};

static void cg_plan_free(cg_plan *pl, cg_status *s) {
    if (!pl) return;
    cg_destroy(&pl->plan, s);
    cg_destroy(&pl->cfg, s);
    for (int i = pl->n_part - 1; i >= 0; i--) cg_destroy(&pl->part[i], s);
    free(pl);
}

static cg_desc *cg_part(cg_plan *pl) { return &pl->part[pl->n_part++]; }

static cudnnDataType_t cg_type(int64_t dt) {
    return dt == NA_DTYPE_F16 ? CUDNN_DATA_HALF
                              : dt == NA_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* the unique id of each tensor slot (NA_CG_X, ...), and of the virtual tensors */
static const int64_t cg_uid[NA_CG_TENSORS] = {'x', 'w', 'y', 'b', 's', 'q'};
enum { CG_UID_V1 = 1001, CG_UID_V2 = 1002 };

/* Graphs of more than a convolution: runtime-compiled engines are allowed for them */
static bool cg_fused(int64_t kind) {
    return kind == NA_CG_FWD_BIAS_RELU || kind == NA_CG_FWD_STATS;
}

/* What the caller does with a problem the graph path does not serve: conv2d_stats has no
 * legacy path (conv2d and a BatchNorm run instead) */
static const char *cg_fallback(int64_t kind) {
    return kind == NA_CG_FWD_STATS ? "not served" : "legacy path";
}

static cg_desc cg_tensor(cg_status *s, cg_plan *pl, const na_cg_tensor *t, cudnnDataType_t dt,
                         int64_t uid, bool is_virtual) {
    for (int i = 0; i < NA_CG_TENSORS && !is_virtual; i++)
        if (cg_uid[i] == uid) pl->slot[pl->n_uids++] = i;
    cg_desc *d = cg_part(pl);
    cg_create(s, CUDNN_BACKEND_TENSOR_DESCRIPTOR, d, "tensor");
    CG_SET(s, *d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    CG_SET(s, *d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t->dim);
    CG_SET(s, *d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t->stride);
    CG_SET(s, *d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    CG_SET(s, *d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &t->align);
    if (is_virtual) {
        bool v = true;
        CG_SET(s, *d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    }
    cg_finalize(s, *d, "tensor");
    return *d;
}

/* A pointwise operation y = mode(x[, b]) in f32 math. */
static cg_desc cg_pointwise(cg_status *s, cg_plan *pl, cudnnPointwiseMode_t mode, cg_desc x,
                            cg_desc b, cg_desc y) {
    cg_desc *pw = cg_part(pl);
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cg_create(s, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, pw, "pointwise");
    CG_SET(s, *pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    CG_SET(s, *pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    cg_finalize(s, *pw, "pointwise");
    cg_desc *op = cg_part(pl);
    cg_create(s, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op, "pointwise operation");
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, pw);
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) CG_SET(s, *op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    cg_finalize(s, *op, "pointwise operation");
    return *op;
}

/* The convolution operations' descriptor type and attributes, by kind: x, w, y are the
 * graph's tensors (dx, dw, dy where the operation writes or reads a gradient). */
struct cg_conv_op {
    cudnnBackendDescriptorType_t type;
    const char *name;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
static const cg_conv_op cg_conv_ops[3] = {
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, "forward operation",
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, "backward data operation",
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, "backward filter operation",
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
};

/* A GenStats operation: the f32 sum and sum of squares of y per channel, in f32 math. */
static cg_desc cg_gen_stats(cg_status *s, cg_plan *pl, const na_cg_problem *p, cg_desc y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    cg_desc sum = cg_tensor(s, pl, &p->t[NA_CG_SUM], f32, cg_uid[NA_CG_SUM], false);
    cg_desc sqsum = cg_tensor(s, pl, &p->t[NA_CG_SQSUM], f32, cg_uid[NA_CG_SQSUM], false);
    cg_desc *op = cg_part(pl);
    cg_create(s, CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, op, "GenStats operation");
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode);
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sum);
    CG_SET(s, *op, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sqsum);
    cg_finalize(s, *op, "GenStats operation");
    return *op;
}

/* The operation graph of problem p into pl->part (its last part). */
static void cg_build_graph(cg_status *s, cg_plan *pl, const na_cg_problem *p, cudnnHandle_t h) {
    const cudnnDataType_t dt = cg_type(p->dtype), f32 = CUDNN_DATA_FLOAT;
    const bool fused = p->kind == NA_CG_FWD_BIAS_RELU;
    cg_desc x = cg_tensor(s, pl, &p->t[NA_CG_X], dt, cg_uid[NA_CG_X], false);
    cg_desc w = cg_tensor(s, pl, &p->t[NA_CG_W], dt, cg_uid[NA_CG_W], false);
    cg_desc y = cg_tensor(s, pl, &p->t[NA_CG_Y], dt, cg_uid[NA_CG_Y], false);

    cg_desc *conv = cg_part(pl);
    const int64_t spatial = 2;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cg_create(s, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, conv, "convolution");
    CG_SET(s, *conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    CG_SET(s, *conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    CG_SET(s, *conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
    CG_SET(s, *conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, p->dilation);
    CG_SET(s, *conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, p->stride);
    CG_SET(s, *conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, p->pad);
    CG_SET(s, *conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, p->pad);
    cg_finalize(s, *conv, "convolution");

    /* fused: the convolution writes a virtual f32 tensor shaped (and strided) as y, the bias
     * is added into another, ReLU writes y */
    cg_desc out = fused ? cg_tensor(s, pl, &p->t[NA_CG_Y], f32, CG_UID_V1, true) : y;
    const cg_conv_op *k = &cg_conv_ops[cg_fused(p->kind) ? 0 : p->kind];
    const float one = 1.0f, zero = 0.0f;
    cg_desc *op = cg_part(pl);
    cg_create(s, k->type, op, k->name);
    cg_set_(s, *op, "operation x", k->x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    cg_set_(s, *op, "operation w", k->w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    cg_set_(s, *op, "operation y", k->y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &out);
    cg_set_(s, *op, "operation conv", k->conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, conv);
    cg_set_(s, *op, "operation alpha", k->alpha, CUDNN_TYPE_FLOAT, 1, &one);
    cg_set_(s, *op, "operation beta", k->beta, CUDNN_TYPE_FLOAT, 1, &zero);
    cg_finalize(s, *op, k->name);
    cg_desc ops[3] = {*op};
    int n_ops = 1;
    if (fused) {
        cg_desc b = cg_tensor(s, pl, &p->t[NA_CG_BIAS], dt, cg_uid[NA_CG_BIAS], false);
        cg_desc sum = cg_tensor(s, pl, &p->t[NA_CG_Y], f32, CG_UID_V2, true);
        ops[n_ops++] = cg_pointwise(s, pl, CUDNN_POINTWISE_ADD, out, b, sum);
        ops[n_ops++] = cg_pointwise(s, pl, CUDNN_POINTWISE_RELU_FWD, sum, NULL, y);
    }
    if (p->kind == NA_CG_FWD_STATS) /* GenStats reads y (non-virtual: y is an output too) */
        ops[n_ops++] = cg_gen_stats(s, pl, p, y);
    cg_desc *graph = cg_part(pl);
    cg_create(s, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph, "operation graph");
    CG_SET(s, *graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_ops, ops);
    CG_SET(s, *graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    cg_finalize(s, *graph, "operation graph");
}

/* An engine's notes as NA_CG_NOTE_* bits. */
static unsigned cg_engine_notes(cg_status *s, cg_desc engine) {
    cudnnBackendNumericalNote_t num[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t beh[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t n_num = 0, n_beh = 0;
    CG_GET(s, engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
           CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n_num, num);
    CG_GET(s, engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
           CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n_beh, beh);
    unsigned bits = 0;
    for (int64_t i = 0; i < n_num && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) switch (num[i]) {
        case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: bits |= NA_CG_NOTE_TENSOR_CORE; break;
        case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: bits |= NA_CG_NOTE_DOWN_CONVERT; break;
        case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: bits |= NA_CG_NOTE_REDUCED_PRECISION; break;
        case CUDNN_NUMERICAL_NOTE_FFT: bits |= NA_CG_NOTE_FFT; break;
        case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: bits |= NA_CG_NOTE_NONDETERMINISTIC; break;
        case CUDNN_NUMERICAL_NOTE_WINOGRAD:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13: bits |= NA_CG_NOTE_WINOGRAD; break;
        default: break;
        }
    for (int64_t i = 0; i < n_beh && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
        if (beh[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) bits |= NA_CG_NOTE_RUNTIME_COMPILED;
    return bits;
}

/* A plan that built: its engine configuration, plan, workspace and engine index. */
struct cg_candidate {
    cg_desc cfg, plan;
    int64_t workspace, engine;
};

/* Plans from one heuristic mode appended to cand (up to `want` in all). `why` keeps the last
 * reason an engine was passed over: an engine configuration's failure is a reason, never an
 * error (s: the heuristics' own failures). */
static void cg_candidates(cg_status *s, const na_cg_problem *p, cg_desc graph, cudnnHandle_t h,
                          cudnnBackendHeurMode_t mode, cg_candidate *cand, int *n_cand, int want,
                          char *why, size_t why_n) {
    cg_desc heur = NULL, cfgs[NA_CG_MAX_CONFIGS] = {};
    int64_t count = 0;
    cg_create(s, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur, "heuristics");
    CG_SET(s, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    CG_SET(s, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    cg_finalize(s, heur, "heuristics");
    CG_GET(s, heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
    if (count > NA_CG_MAX_CONFIGS) count = NA_CG_MAX_CONFIGS;
    for (int64_t i = 0; i < count; i++)
        cg_create(s, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i], "engine configuration");
    int64_t got = 0;
    CG_GET(s, heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
    for (int64_t i = 0; i < got && i < count && !s->st && *n_cand < want; i++) {
        cg_status es = {};
        cg_desc engine = NULL, plan = NULL;
        int64_t one = 0, index = -1, ws = 0;
        cg_create(&es, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine, "engine");
        CG_GET(&es, cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one, &engine);
        CG_GET(&es, engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &one, &index);
        unsigned notes = cg_engine_notes(&es, engine);
        cg_destroy(&engine, &es);
        const char *no = es.st ? NULL
                               : na_cg_engine_rejects(notes, (na_dtype)p->dtype, p->tf32,
                                                      p->deterministic, cg_fused(p->kind));
        if (!es.st && !no) {
            cg_create(&es, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan, "execution plan");
            CG_SET(&es, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
            CG_SET(&es, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
            cg_finalize(&es, plan, "execution plan");
            CG_GET(&es, plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &one, &ws);
            if (!es.st && ws > ((int64_t)1 << 30)) no = "needs over 1 GiB of workspace";
        }
        if (na_cg_status_verdict(es.st, NA_CG_AT_CONFIG) == NA_CG_NEXT_CONFIG || no) {
            if (es.st)
                snprintf(why, why_n, "engine %lld: %s: %s", (long long)index, es.call,
                         cudnnGetErrorString(es.st));
            else
                snprintf(why, why_n, "engine %lld: %s", (long long)index, no);
            cg_destroy(&plan, NULL); /* a half-made plan: its own failure is the reason */
            continue;
        }
        cand[*n_cand].cfg = cfgs[i];
        cand[*n_cand].plan = plan;
        cand[*n_cand].workspace = ws;
        cand[*n_cand].engine = index;
        cfgs[i] = NULL; /* now the candidate's */
        (*n_cand)++;
    }
    for (int i = 0; i < NA_CG_MAX_CONFIGS; i++) cg_destroy(&cfgs[i], s);
    cg_destroy(&heur, s);
}

/* Runs a plan of pl's graph on the problem's buffers (ptrs[NA_CG_X...], by tensor slot) and
 * a workspace. */
static cudnnStatus_t cg_execute(cudnnHandle_t h, const cg_plan *pl, cg_desc plan,
                                void *const *ptrs, void *workspace, cg_status *s) {
    int64_t uids[NA_CG_TENSORS];
    void *data[NA_CG_TENSORS];
    for (int i = 0; i < pl->n_uids; i++) uids[i] = cg_uid[pl->slot[i]], data[i] = ptrs[pl->slot[i]];
    cg_desc vp = NULL;
    cg_create(s, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp, "variant pack");
    CG_SET(s, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, pl->n_uids, uids);
    CG_SET(s, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pl->n_uids, data);
    CG_SET(s, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    cg_finalize(s, vp, "variant pack");
    if (!s->st) cg_note(s, cudnnBackendExecute(h, plan, vp), "cudnnBackendExecute", "plan");
    cg_destroy(&vp, s);
    return s->st;
}

/* The fastest candidate by CUDA events (each run once untimed, then 3 times timed). A
 * candidate whose runs fail counts as not timed (passed over). Synchronizes once per
 * candidate. */
static int cg_time(cudnnHandle_t h, cg_candidate *cand, int n, const cg_plan *pl,
                   void *const *ptrs, const na_cg_problem *p, int *best) {
    int64_t ws = 0;
    for (int i = 0; i < n; i++) ws = cand[i].workspace > ws ? cand[i].workspace : ws;
    void *scratch = ws ? na_cuda_scratch((size_t)ws) : NULL;
    if (ws && !scratch) return na_last_status();
    cudaEvent_t ev[2] = {NULL, NULL};
    float ms[NA_CG_MAX_TIMED];
    cudaError_t ce = cudaEventCreate(&ev[0]);
    if (ce == cudaSuccess) ce = cudaEventCreate(&ev[1]);
    for (int i = 0; i < n && ce == cudaSuccess; i++) {
        cg_status s = {};
        ms[i] = -1;
        if (na_cg_status_verdict(cg_execute(h, pl, cand[i].plan, ptrs, scratch, &s),
                                 NA_CG_AT_CONFIG) != NA_CG_OK) {
            if (cg_verbose())
                fprintf(stderr, "nanoamp: conv graph: timing engine %lld: %s failed: %s\n",
                        (long long)cand[i].engine, s.call, cudnnGetErrorString(s.st));
            continue;
        }
        ce = cudaEventRecord(ev[0], na_cuda_ctx.stream);
        for (int r = 0; r < 3 && ce == cudaSuccess && !s.st; r++)
            cg_execute(h, pl, cand[i].plan, ptrs, scratch, &s);
        if (ce == cudaSuccess) ce = cudaEventRecord(ev[1], na_cuda_ctx.stream);
        if (ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
        na_cuda_ctx.sync_count++;
        float t = 0;
        if (ce == cudaSuccess) ce = cudaEventElapsedTime(&t, ev[0], ev[1]);
        if (ce == cudaSuccess && !s.st) ms[i] = t / 3;
    }
    for (int i = 0; i < 2; i++)
        if (ev[i]) (void)cudaEventDestroy(ev[i]);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        char d[512];
        return na_set_error(NA_ECUDA, "conv2d graph (%s): timing with CUDA events failed: %s",
                            na_cg_problem_str(p, d, sizeof d), cudaGetErrorString(ce));
    }
    *best = na_cg_fastest(ms, n);
    if (cg_verbose() && *best >= 0)
        fprintf(stderr, "nanoamp: conv graph: timed %d plans, engine %lld fastest (%.4f ms)\n", n,
                (long long)cand[*best].engine, (double)ms[*best]);
    return NA_OK;
}

static na_cg_cache cg_cache;
/* plans taken out of pinned entries (refused at run time), freed with the last step graph */
static cg_plan *cg_retired[NA_CG_CACHE_CAP];
static int cg_n_retired;

/* Makes the plan of a new problem into *out (NULL, with the reason in why, when the graph
 * path cannot serve it). ptrs: the call's buffers by tensor slot, for timing. */
static int cg_plan_make(const na_cg_problem *p, void *const *ptrs, cg_plan **out, char *why,
                        size_t why_n) {
    *out = NULL;
    snprintf(why, why_n, "no engine configuration from the heuristics");
    cudnnHandle_t h;
    NA_TRY(na_cuda_dnn(&h));
    const char *no = na_cg_stats_rejects(p, na_cuda_ctx.major);
    if (no) { /* documented as unserved: not asked of cuDNN */
        snprintf(why, why_n, "%s", no);
        return NA_OK;
    }
    if (p->autotune)
        NA_TRY(na_cuda_capture_forbids("conv2d graph", "a new convolution is autotuned "
                                       "(NANOAMP_CUDNN_FIND=1: run warm-up steps before capture)"));
    cg_plan *pl = (cg_plan *)calloc(1, sizeof *pl);
    if (!pl) return na_set_error(NA_ENOMEM, "conv2d graph: out of host memory");
    cg_status s = {};
    cg_build_graph(&s, pl, p, h);
    cg_candidate cand[NA_CG_MAX_TIMED] = {};
    int n = 0, want = p->autotune ? NA_CG_MAX_TIMED : 1, best = 0;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && !s.st && n < want; m++) {
        /* a mode that refuses the graph leaves the other's plans standing */
        cg_status ms = {};
        cg_candidates(&ms, p, pl->part[pl->n_part - 1], h, modes[m], cand, &n, want, why, why_n);
        if (na_cg_status_verdict(ms.st, NA_CG_AT_GRAPH) == NA_CG_UNSERVED)
            snprintf(why, why_n, "%s: %s", ms.call, cudnnGetErrorString(ms.st));
    }
    int rc = NA_OK;
    char d[512];
    if (na_cg_status_verdict(s.st, NA_CG_AT_GRAPH) == NA_CG_UNSERVED)
        snprintf(why, why_n, "%s: %s", s.call, cudnnGetErrorString(s.st));
    if (rc == NA_OK && !s.st && n > 1) rc = cg_time(h, cand, n, pl, ptrs, p, &best);
    if (rc == NA_OK && !s.st && n > 0 && best >= 0) {
        pl->cfg = cand[best].cfg;
        pl->plan = cand[best].plan;
        pl->workspace = cand[best].workspace;
        pl->engine = cand[best].engine;
        cand[best].cfg = cand[best].plan = NULL;
        *out = pl;
        pl = NULL;
    } else if (rc == NA_OK && !s.st && n > 0) {
        snprintf(why, why_n, "none of the %d plans ran", n);
    }
    cg_status cs = {};
    for (int i = 0; i < n; i++) {
        cg_destroy(&cand[i].plan, &cs);
        cg_destroy(&cand[i].cfg, &cs);
    }
    cg_plan_free(pl, &cs);
    if (cs.st && rc == NA_OK) {
        cg_plan_free(*out, NULL);
        *out = NULL;
        rc = na_set_error(NA_ECUDA, "conv2d graph (%s): %s failed: %s",
                          na_cg_problem_str(p, d, sizeof d), cs.call, cudnnGetErrorString(cs.st));
    }
    return rc;
}

/* The cached plan of p, made on the problem's first call; NULL: the legacy path serves it.
 * A plan looked up during a capture is pinned: the step graph will replay it. */
static int cg_lookup(const na_cg_problem *p, void *const *ptrs, cg_plan **out) {
    na_cg_entry *e = na_cg_cache_find(&cg_cache, p);
    if (e) {
        if (na_cuda_ctx.capturing) na_cg_cache_pin(e);
        *out = (cg_plan *)e->plan;
        return NA_OK;
    }
    cg_plan *pl = NULL;
    char why[256];
    int rc = cg_plan_make(p, ptrs, &pl, why, sizeof why);
    if (rc < 0) return rc;
    void *evicted = NULL;
    e = na_cg_cache_claim(&cg_cache, p, &evicted);
    cg_status cs = {};
    if (!e) { /* every entry pinned by live step graphs: served uncached, on the legacy path */
        cg_plan_free(pl, &cs);
        *out = NULL;
        if (cg_verbose()) {
            char d[512];
            fprintf(stderr, "nanoamp: conv graph: %s: %s -- the plan cache's %d entries are all "
                    "pinned by live step graphs\n", cg_fallback(p->kind),
                    na_cg_problem_str(p, d, sizeof d), NA_CG_CACHE_CAP);
        }
        if (cs.st)
            return na_set_error(NA_ECUDA, "conv2d graph: freeing an uncached plan: %s failed: %s",
                                cs.call, cudnnGetErrorString(cs.st));
        return NA_OK;
    }
    if (na_cuda_ctx.capturing) na_cg_cache_pin(e);
    cg_plan_free((cg_plan *)evicted, &cs);
    if (cs.st) {
        cg_plan_free(pl, NULL);
        na_cg_cache_drop(e);
        return na_set_error(NA_ECUDA, "conv2d graph: freeing an evicted plan: %s failed: %s",
                            cs.call, cudnnGetErrorString(cs.st));
    }
    e->plan = pl;
    e->workspace = pl ? pl->workspace : 0;
    if (cg_verbose()) {
        char d[512];
        if (pl)
            fprintf(stderr, "nanoamp: conv graph: plan: %s: engine %lld, workspace %lld bytes\n",
                    na_cg_problem_str(p, d, sizeof d), (long long)pl->engine,
                    (long long)pl->workspace);
        else
            fprintf(stderr, "nanoamp: conv graph: %s: %s -- %s\n", cg_fallback(p->kind),
                    na_cg_problem_str(p, d, sizeof d), why);
    }
    *out = pl;
    return NA_OK;
}

#define CG_DATA(v) ((v) ? (v)->data : NULL)

static int cg_run(na_cg_kind kind, const na_conv_geom *g, const na_view *x, const na_view *w,
                  const na_view *y, const na_view *bias, const na_view *sum, const na_view *sqsum,
                  bool *done) {
    static const char *const who[NA_CG_KINDS] = {"conv2d", "conv2d_backward_data",
                                                 "conv2d_backward_weight", "conv2d_bias_relu",
                                                 "conv2d_stats"};
    *done = false;
    na_dtype dt = x->dtype;
    if (dt != NA_DTYPE_F32 && dt != NA_DTYPE_F16 && dt != NA_DTYPE_BF16) return NA_OK;
    na_cg_problem p;
    if (na_cg_problem_init(&p, kind, g, x, w, y, bias, sum, sqsum, na_cuda_ctx.tf32,
                           na_cuda_deterministic(), na_cuda_cudnn_find(), who[kind]) < 0) {
        if (cg_verbose())
            fprintf(stderr, "nanoamp: conv graph: %s: -- %s\n", cg_fallback(kind), na_last_error());
        na_clear_error(); /* the views are not describable here: the legacy path serves them */
        return NA_OK;
    }
    void *ptrs[NA_CG_TENSORS] = {x->data, w->data, y->data, CG_DATA(bias), CG_DATA(sum),
                                 CG_DATA(sqsum)};
    cg_plan *pl = NULL;
    NA_TRY(cg_lookup(&p, ptrs, &pl));
    if (!pl) return NA_OK;
    void *ws = NULL;
    if (pl->workspace && !(ws = na_cuda_scratch((size_t)pl->workspace))) return na_last_status();
    cudnnHandle_t h;
    NA_TRY(na_cuda_dnn(&h));
    if (kind == NA_CG_FWD_STATS) { /* packed f32 [K] (na_cg_stats_rejects) */
        size_t bytes = (size_t)g->c_out * sizeof(float);
        NA_CUDA_CHECK(cudaMemsetAsync(sum->data, 0, bytes, na_cuda_ctx.stream));
        NA_CUDA_CHECK(cudaMemsetAsync(sqsum->data, 0, bytes, na_cuda_ctx.stream));
    }
    cg_status s = {};
    if (cg_execute(h, pl, pl->plan, ptrs, ws, &s) == CUDNN_STATUS_SUCCESS) {
        *done = true;
        return NA_OK;
    }
    char d[512];
    /* any status (na_cg_status_verdict, NA_CG_AT_RUN): the plan refuses these buffers, the
     * legacy path serves the problem from now on */
    na_cg_entry *e = na_cg_cache_find(&cg_cache, &p);
    if (cg_verbose())
        fprintf(stderr, "nanoamp: conv graph: %s: %s -- %s failed: %s\n", cg_fallback(kind),
                na_cg_problem_str(&p, d, sizeof d), s.call, cudnnGetErrorString(s.st));
    if (e) e->plan = NULL;
    if (e && e->pinned && cg_n_retired < NA_CG_CACHE_CAP) { /* a live step graph replays it */
        cg_retired[cg_n_retired++] = pl;
        return NA_OK;
    }
    if (e && e->pinned) return NA_OK; /* kept for good rather than freed under a graph */
    cg_status cs = {};
    cg_plan_free(pl, &cs);
    if (cs.st)
        return na_set_error(NA_ECUDA, "%s (cuda): conv graph: freeing a refused plan: %s failed: %s",
                            who[kind], cs.call, cudnnGetErrorString(cs.st));
    return NA_OK;
}

extern "C" int na_cuda_conv_graph_run(na_cg_kind kind, const na_conv_geom *g, const na_view *x,
                                      const na_view *w, const na_view *y, bool *done) {
    if (cg_fused(kind)) {
        *done = false;
        return na_set_error(NA_EINVAL, "na_cuda_conv_graph_run: the fused kinds take more tensors "
                            "(na_cuda_conv_graph_bias_relu, na_cuda_conv_graph_stats)");
    }
    return cg_run(kind, g, x, w, y, NULL, NULL, NULL, done);
}

extern "C" int na_cuda_conv_graph_bias_relu(const na_conv_geom *g, const na_view *x,
                                            const na_view *w, const na_view *bias,
                                            const na_view *y, bool *done) {
    return cg_run(NA_CG_FWD_BIAS_RELU, g, x, w, y, bias, NULL, NULL, done);
}

extern "C" int na_cuda_conv_graph_stats(const na_conv_geom *g, const na_view *x,
                                        const na_view *w, const na_view *y, const na_view *sum,
                                        const na_view *sqsum, bool *done) {
    return cg_run(NA_CG_FWD_STATS, g, x, w, y, NULL, sum, sqsum, done);
}

extern "C" void na_cuda_conv_graph_unpin(void) {
    na_cg_cache_unpin_all(&cg_cache);
    for (int i = 0; i < cg_n_retired; i++) cg_plan_free(cg_retired[i], NULL);
    cg_n_retired = 0;
}

extern "C" int na_cuda_conv_graph_release(void) {
    cg_status cs = {};
    na_cuda_conv_graph_unpin();
    for (int i = 0; i < NA_CG_CACHE_CAP; i++)
        if (cg_cache.e[i].used) {
            cg_plan_free((cg_plan *)cg_cache.e[i].plan, &cs);
            na_cg_cache_drop(&cg_cache.e[i]);
        }
    if (cs.st)
        return na_set_error(NA_ECUDA, "conv2d graph: freeing the cached plans: %s failed: %s",
                            cs.call, cudnnGetErrorString(cs.st));
    return NA_OK;
}
#else
extern "C" int na_cuda_conv_graph_run(na_cg_kind, const na_conv_geom *, const na_view *,
                                      const na_view *, const na_view *, bool *done) {
    *done = false;
    return NA_OK;
}
extern "C" int na_cuda_conv_graph_bias_relu(const na_conv_geom *, const na_view *,
                                            const na_view *, const na_view *, const na_view *,
                                            bool *done) {
    *done = false;
    return NA_OK;
}
extern "C" int na_cuda_conv_graph_stats(const na_conv_geom *, const na_view *, const na_view *,
                                        const na_view *, const na_view *, const na_view *,
                                        bool *done) {
    *done = false;
    return NA_OK;
}
extern "C" void na_cuda_conv_graph_unpin(void) {}
extern "C" int na_cuda_conv_graph_release(void) { return NA_OK; }
#endif
