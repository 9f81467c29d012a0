/* Autocast: per-op dtype rules applied to an op's inputs, a cache for weight casts, the rule
 * table (listed, changed at run time) and the trace that explains each op's dtype. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/amp.h"
#include "nanoamp/cuda.h"
#include "src/amp/amp_internal.h"
#include "src/tensor/arena.h"
#include "src/tensor/tensor_internal.h"

#define MAX_DEPTH 16
#define CACHE_SLOTS 512
#define MAX_PENDING 8

_Static_assert((int)NA_SCALER_GRAD == NA_AMP_KIND_GRAD_SCALER &&
                   (int)NA_SCALER_STATIC == NA_AMP_KIND_STATIC &&
                   (int)NA_SCALER_APEX_LEGACY == NA_AMP_KIND_APEX_LEGACY &&
                   (int)NA_SCALER_APEX == NA_AMP_KIND_APEX,
               "na_scaler_kind and kernels/common/amp.h disagree");

typedef struct {
    bool enabled;
    na_dtype dtype;
} region;

typedef struct {
    const na_tensor *src;
    na_tensor *cast;
} cache_entry;

static _Thread_local region stack[MAX_DEPTH];
static _Thread_local int depth;
static _Thread_local cache_entry cache[CACHE_SLOTS];
static _Thread_local int cache_used;
static _Thread_local unsigned long cache_generation;
static _Thread_local uint64_t cache_casts;
static bool rule_overridden[NA_OP_COUNT];
static na_amp_rule rule_override[NA_OP_COUNT];

/* Ops whose front-end never asks autocast (views, copies, and the ops that run in their input's
 * dtype by design: BatchNorm with f32 statistics, pooling, dropout, argmax). Overriding their
 * rule would do nothing, so na_autocast_set_rule refuses it. */
static bool consults_rules(na_op op) {
    switch (op) {
    case NA_OP_CAST: case NA_OP_TO_DEVICE: case NA_OP_RESHAPE: case NA_OP_PERMUTE:
    case NA_OP_SLICE: case NA_OP_CONTIGUOUS: case NA_OP_BATCH_NORM: case NA_OP_MAX_POOL2D:
    case NA_OP_AVG_POOL2D: case NA_OP_ARGMAX: case NA_OP_DROPOUT:
        return false;
    default: return true;
    }
}

/* ---- the trace's per-thread state ---------------------------------------------------------- */

typedef struct {
    na_op op;
    int n;
    na_dtype in[NA_AMP_TRACE_MAX_INPUTS];
    na_amp_rule rule;
    na_dtype compute; /* NA_DTYPE_COUNT: no eligible input, the output's dtype tells */
    unsigned long generation;
} pending_op;

static int env_mode = -1; /* NANOAMP_AMP_TRACE, read once */
static _Thread_local bool trace_set;  /* an API call chose the mode for this thread */
static _Thread_local na_amp_trace_mode trace_mode;
static _Thread_local FILE *trace_out;
static _Thread_local na_amp_trace_fn trace_fn;
static _Thread_local void *trace_ctx;
static _Thread_local pending_op pending[MAX_PENDING];
static _Thread_local int n_pending;

static na_amp_trace_mode current_trace_mode(void) {
    if (trace_set) return trace_mode;
    if (env_mode < 0) {
        const char *e = getenv("NANOAMP_AMP_TRACE");
        env_mode = !e || !*e || !strcmp(e, "0") ? NA_AMP_TRACE_OFF
                   : !strcmp(e, "all")          ? NA_AMP_TRACE_ALL
                                                : NA_AMP_TRACE_REGIONS;
    }
    return (na_amp_trace_mode)env_mode;
}

void na_autocast_trace(na_amp_trace_mode mode, FILE *out) {
    trace_set = true;
    trace_mode = (unsigned)mode <= NA_AMP_TRACE_ALL ? mode : NA_AMP_TRACE_OFF;
    trace_out = out;
    trace_fn = NULL;
    trace_ctx = NULL;
    n_pending = 0;
}

void na_autocast_trace_callback(na_amp_trace_mode mode, na_amp_trace_fn fn, void *ctx) {
    FILE *keep = trace_out;
    na_autocast_trace(mode, keep);
    trace_fn = fn;
    trace_ctx = ctx;
}

na_amp_trace_mode na_autocast_trace_mode(void) { return current_trace_mode(); }

/* ---- regions --------------------------------------------------------------------------------- */

static void cache_clear(void) {
    for (int i = 0; i < CACHE_SLOTS; i++) cache[i] = (cache_entry){0};
    cache_used = 0;
    cache_casts = 0;
}

static int begin(bool enabled, na_dtype dt) {
    if (depth == MAX_DEPTH)
        return na_set_error(NA_ESTATE, "na_autocast_begin: regions nest at most %d deep",
                            MAX_DEPTH);
    if (depth == 0) {
        cache_clear();
        cache_generation = na_arena_generation();
        n_pending = 0;
    }
    stack[depth++] = (region){enabled, dt};
    return NA_OK;
}

int na_autocast_begin(na_dtype dt) {
    if (dt != NA_DTYPE_F16 && dt != NA_DTYPE_BF16)
        return na_set_error(NA_EDTYPE, "na_autocast_begin: the region dtype must be f16 or bf16, "
                            "got %s", na_dtype_name(dt));
    return begin(true, dt);
}

static int bf16_on_cuda(void) {
    static int supported = -1; /* the device does not change under a process */
    if (supported < 0) supported = na_cuda_bf16_supported() ? 1 : 0;
    return supported;
}

#define NO_BF16_MSG "Current CUDA Device does not support bfloat16. Please switch dtype to float16."

int na_autocast_check_device(na_device dev, na_dtype dt) {
    const char *fn = "na_autocast_check_device";
    if (dt != NA_DTYPE_F16 && dt != NA_DTYPE_BF16)
        return na_set_error(NA_EDTYPE, "%s: autocast computes in f16 or bf16, got %s", fn,
                            na_dtype_name(dt));
    if (dev == NA_DEVICE_CPU) return NA_OK; /* emulated bit-exactly, both dtypes */
    if (dev != NA_DEVICE_CUDA)
        return na_set_error(NA_EINVAL, "%s: unknown device %d", fn, (int)dev);
    if (!na_cuda_available())
        return na_set_error(NA_EDEVICE, "%s: autocast on cuda, but no CUDA device is available%s",
                            fn, na_cuda_built() ? "" : " (this build has no CUDA backend)");
    if (dt == NA_DTYPE_BF16 && !bf16_on_cuda())
        return na_set_error(NA_EDTYPE, "%s: " NO_BF16_MSG " (bf16 needs sm_80 or newer; %s)", fn,
                            na_cuda_device_name());
    return NA_OK;
}

int na_autocast_begin_device(na_device dev, na_dtype dt) {
    int rc = na_autocast_check_device(dev, dt);
    if (rc) return na_set_error(rc, "na_autocast_begin_device: %s", na_last_error());
    return na_autocast_begin(dt);
}

int na_autocast_begin_disabled(void) {
    return begin(false, depth ? stack[depth - 1].dtype : NA_DTYPE_F16);
}

int na_autocast_end(void) {
    if (depth == 0) return na_set_error(NA_ESTATE, "na_autocast_end: no autocast region is open");
    if (--depth == 0) { /* the outermost region ends: drop the weight casts */
        cache_clear();
        n_pending = 0;
    }
    return NA_OK;
}

bool na_autocast_enabled(void) { return depth > 0 && stack[depth - 1].enabled; }
na_dtype na_autocast_dtype(void) { return depth ? stack[depth - 1].dtype : NA_DTYPE_F16; }
int na_autocast_depth(void) { return depth; }
uint64_t na_autocast_cache_casts(void) { return cache_casts; }

/* ---- the rule table ------------------------------------------------------------------------- */

na_amp_rule na_autocast_rule(na_op op) {
    if ((unsigned)op >= NA_OP_COUNT) return NA_AMP_AS_IS;
    return rule_overridden[op] ? rule_override[op] : na_op_default_amp_rule(op);
}

int na_autocast_set_rule(na_op op, na_amp_rule rule) {
    if ((unsigned)op >= NA_OP_COUNT || (unsigned)rule >= NA_AMP_RULE_COUNT)
        return na_set_error(NA_EINVAL, "na_autocast_set_rule: unknown op %d or rule %d", (int)op,
                            (int)rule);
    if (!consults_rules(op) && rule != NA_AMP_AS_IS)
        return na_set_error(NA_EINVAL, "na_autocast_set_rule: %s always runs in its input's dtype "
                            "(its front-end does not consult autocast); cast its input instead",
                            na_op_name(op));
    rule_overridden[op] = true;
    rule_override[op] = rule;
    return NA_OK;
}

void na_autocast_reset_rules(void) {
    for (int i = 0; i < NA_OP_COUNT; i++) rule_overridden[i] = false;
}

const char *na_amp_rule_name(na_amp_rule rule) {
    static const char *names[] = {"as_is", "lower", "fp32", "promote"};
    return (unsigned)rule < NA_AMP_RULE_COUNT ? names[rule] : "?";
}

void na_autocast_print_rules(FILE *out) {
    if (!out) out = stdout;
    static const char *what[] = {
        "run in the inputs' dtype",
        "cast float inputs to the region's f16/bf16",
        "cast float inputs to f32",
        "cast float inputs to the widest among them",
    };
    fprintf(out, "%-14s %-8s %s\n", "op", "rule", "meaning");
    for (int i = 0; i < NA_OP_COUNT; i++) {
        na_amp_rule r = na_autocast_rule((na_op)i);
        const char *note = rule_overridden[i] && r != na_op_default_amp_rule((na_op)i)
                               ? " (overridden)"
                           : !consults_rules((na_op)i) ? " (fixed)"
                                                       : "";
        fprintf(out, "%-14s %-8s %s%s\n", na_op_name((na_op)i), na_amp_rule_name(r), what[r], note);
    }
}

/* ---- casting ----------------------------------------------------------------------------- */

/* Eligible: a float tensor other than f64 (PyTorch's is_autocast_eligible). */
static bool eligible(const na_tensor *t) {
    return t && na_dtype_is_float(t->dtype) && t->dtype != NA_DTYPE_F64;
}

/* f32 leaves that require grad (parameters) are cast once per outermost region. Only casts
 * made with grad mode on are cached: one made under no-grad records no node, and reusing it
 * later with grad on would silently cut the weight out of the graph. */
static na_tensor *cached_cast(na_tensor *t, na_dtype dt) {
    bool cacheable = dt != NA_DTYPE_F32 && t->dtype == NA_DTYPE_F32 && t->requires_grad &&
                     !t->grad_fn && !t->base && na_grad_enabled();
    if (!cacheable) return na_cast(t, dt);
    if (cache_generation != na_arena_generation()) { /* the step ended inside the region */
        cache_clear();
        cache_generation = na_arena_generation();
    }
    size_t h = ((uintptr_t)t >> 4) % CACHE_SLOTS;
    for (int probe = 0; probe < CACHE_SLOTS; probe++, h = (h + 1) % CACHE_SLOTS) {
        if (cache[h].src == t && cache[h].cast->dtype == dt) return cache[h].cast;
        if (!cache[h].src) break;
    }
    na_tensor *c = na_cast(t, dt);
    if (c && cache_used < CACHE_SLOTS * 3 / 4 && !cache[h].src) {
        cache[h] = (cache_entry){t, c};
        cache_used++;
        cache_casts++;
    }
    return c;
}

static void push_pending(na_op op, na_tensor *const *ins, int n, na_amp_rule rule) {
    if (n_pending == MAX_PENDING) { /* stale entries of ops that failed: drop the oldest */
        memmove(pending, pending + 1, (MAX_PENDING - 1) * sizeof *pending);
        n_pending--;
    }
    pending_op *p = &pending[n_pending++];
    *p = (pending_op){.op = op, .n = n < NA_AMP_TRACE_MAX_INPUTS ? n : NA_AMP_TRACE_MAX_INPUTS,
                      .rule = rule, .compute = NA_DTYPE_COUNT,
                      .generation = na_arena_generation()};
    for (int k = 0; k < p->n; k++) p->in[k] = ins[k] ? ins[k]->dtype : NA_DTYPE_COUNT;
}

int na_autocast_inputs(na_op op, na_tensor **ins, int n) {
    if (!na_autocast_enabled()) return NA_OK;
    na_amp_rule rule = na_autocast_rule(op);
    bool tracing = current_trace_mode() != NA_AMP_TRACE_OFF;
    na_dtype target;
    bool any = false;
    switch (rule) {
    case NA_AMP_LOWER: target = stack[depth - 1].dtype; break;
    case NA_AMP_FP32: target = NA_DTYPE_F32; break;
    case NA_AMP_PROMOTE: {
        target = NA_DTYPE_F16;
        for (int k = 0; k < n; k++) {
            if (!eligible(ins[k])) continue;
            target = any ? na_promote_float(target, ins[k]->dtype) : ins[k]->dtype;
            any = true;
        }
        break;
    }
    default: /* as_is: nothing to cast; traced so that casts the op makes itself (a binary
              * op's promotion) are reported under it, and its inputs as they came */
        if (tracing) push_pending(op, ins, n, rule);
        return NA_OK;
    }
    for (int k = 0; k < n && !any; k++) any = eligible(ins[k]);
    if (tracing) {
        push_pending(op, ins, n, rule);
        if (any) pending[n_pending - 1].compute = target;
    }
    for (int k = 0; k < n; k++) {
        if (!eligible(ins[k]) || ins[k]->dtype == target) continue;
        if (target == NA_DTYPE_BF16 && ins[k]->device == NA_DEVICE_CUDA && !bf16_on_cuda())
            return na_set_error(NA_EDTYPE, "autocast: %s in a bf16 region on cuda: " NO_BF16_MSG
                                " (%s)", na_op_name(op), na_cuda_device_name());
        ins[k] = cached_cast(ins[k], target);
        if (!ins[k]) return na_last_status();
    }
    return NA_OK;
}

/* ---- the trace ------------------------------------------------------------------------------- */

static const char *dt_name(na_dtype dt) { return dt == NA_DTYPE_COUNT ? "-" : na_dtype_name(dt); }

const char *na_amp_trace_format(const na_amp_trace_record *r, char *buf, size_t size) {
    char ins[64];
    size_t k = 0;
    ins[0] = '\0';
    for (int i = 0; i < r->n_inputs && k < sizeof ins; i++)
        k += (size_t)snprintf(ins + k, sizeof ins - k, "%s%s", i ? "," : "", dt_name(r->in[i]));
    const char *rule = r->region && !r->enabled ? "off" : na_amp_rule_name(r->rule);
    char name[40];
    snprintf(name, sizeof name, "%*s%s", 2 * r->nesting, "", na_op_name(r->op));
    const char *out = dt_name(r->out);
    int len = snprintf(buf, size, "%-15s in %-18s rule %-8s compute %-5s out %s", name, ins, rule,
                       dt_name(r->compute), out);
    /* the accumulation, only where it is wider than the compute dtype (matmul, conv2d and the
     * reductions on f16/bf16), in a column of its own */
    if (r->accumulate != NA_DTYPE_COUNT && r->accumulate != r->compute && len >= 0 &&
        (size_t)len < size)
        snprintf(buf + len, size - (size_t)len, "%*s acc %s", 5 - (int)strlen(out), "",
                 dt_name(r->accumulate));
    return buf;
}

/* Where an op's arithmetic really runs, given the dtype of its data. BatchNorm's is f32 for
 * f16/bf16 data: it normalizes with f32 statistics, weight and bias (as cuDNN's) and rounds
 * only its output. */
static na_dtype true_compute(na_op op, na_dtype data) {
    bool low = data == NA_DTYPE_F16 || data == NA_DTYPE_BF16;
    return op == NA_OP_BATCH_NORM && low ? NA_DTYPE_F32 : data;
}

/* What an op's sums (dot products, reductions, statistics, pooling windows) accumulate in on
 * both backends: f32 for f16/bf16/f32 data, f64 for f64 (cuBLASLt with CUBLAS_COMPUTE_32F,
 * cuDNN convolutions with an f32 compute type, the CPU widening to f32); NA_DTYPE_COUNT for
 * an op that sums nothing. */
static na_dtype accumulation(na_op op, na_dtype compute) {
    switch (op) {
    case NA_OP_MATMUL: case NA_OP_LINEAR: case NA_OP_CONV2D: case NA_OP_SUM: case NA_OP_MEAN:
    case NA_OP_SOFTMAX: case NA_OP_LOG_SOFTMAX: case NA_OP_CROSS_ENTROPY:
    case NA_OP_BATCH_NORM: case NA_OP_AVG_POOL2D:
        if (!na_dtype_is_float(compute)) return NA_DTYPE_COUNT;
        return compute == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
    default: return NA_DTYPE_COUNT;
    }
}

static na_dtype first_float(int n, na_tensor *const *inputs, na_dtype fallback) {
    for (int k = 0; k < n; k++)
        if (inputs[k] && na_dtype_is_float(inputs[k]->dtype)) return inputs[k]->dtype;
    return fallback;
}

void na_amp_trace_op(na_op op, const na_tensor *out, int n_inputs, na_tensor *const *inputs) {
    na_amp_trace_mode mode = current_trace_mode();
    if (mode == NA_AMP_TRACE_OFF || (unsigned)op >= NA_OP_COUNT || !out) return;
    if (mode == NA_AMP_TRACE_REGIONS && depth == 0) return;
    unsigned long gen = na_arena_generation();
    while (n_pending && pending[n_pending - 1].generation != gen) n_pending--;
    int j = n_pending - 1;
    while (j >= 0 && pending[j].op != op) j--;
    na_amp_trace_record r = {.op = op, .region = depth > 0, .enabled = na_autocast_enabled(),
                             .out = out->dtype, .device = out->device, .rule = NA_AMP_AS_IS};
    int n = n_inputs < NA_AMP_TRACE_MAX_INPUTS ? n_inputs : NA_AMP_TRACE_MAX_INPUTS;
    r.n_inputs = n;
    for (int k = 0; k < n; k++) r.in[k] = inputs[k] ? inputs[k]->dtype : NA_DTYPE_COUNT;
    if (j >= 0) { /* the op autocast prepared: its inputs as they came, its rule and dtype */
        const pending_op *p = &pending[j];
        for (int k = 0; k < p->n && k < n; k++) r.in[k] = p->in[k];
        r.rule = p->rule;
        r.compute = p->compute != NA_DTYPE_COUNT ? p->compute : out->dtype;
        r.nesting = j;
        n_pending = j;
    } else { /* an op autocast left alone: it computes in its output's float dtype (a loss of
              * f16 logits computes in f32), a cast in its input's */
        bool from_input = op == NA_OP_CAST || !na_dtype_is_float(out->dtype);
        r.compute = from_input ? first_float(n, inputs, out->dtype) : out->dtype;
        r.nesting = n_pending;
    }
    r.compute = true_compute(op, r.compute);
    r.accumulate = accumulation(op, r.compute);
    if (trace_fn) {
        trace_fn(&r, trace_ctx);
        return;
    }
    char line[160];
    fprintf(trace_out ? trace_out : stderr, "amp: %s\n",
            na_amp_trace_format(&r, line, sizeof line));
}
