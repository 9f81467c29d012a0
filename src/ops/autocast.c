/* Autocast: per-op dtype rules applied to an op's inputs, regions, a cache for weight casts and
 * the rule table (listed, changed at run time). Part of the ops layer: the front-ends ask it
 * how to run; the trace that explains each decision is autocast_trace.c. */
#include <assert.h>

#include "nanoamp/cuda.h"
#include "src/ops/ops_internal.h"

#define MAX_DEPTH 16
#define CACHE_SLOTS 512

typedef struct {
    bool enabled;
    na_dtype dtype;
    bool in_backward; /* opened for a custom function's backward: holds while backward runs */
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
        na_autocast_trace_forget();
    }
    /* a region opened inside a custom backward's region holds there too */
    bool in_backward = depth > 0 && stack[depth - 1].in_backward;
    stack[depth++] = (region){enabled, dt, in_backward};
    return NA_OK;
}

int na_autocast_begin_backward(bool enabled, na_dtype dt) {
    int rc = begin(enabled, dt);
    if (!rc) stack[depth - 1].in_backward = true;
    return rc;
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
        na_autocast_trace_forget();
    }
    return NA_OK;
}

/* The ops a backward function calls compute in the forward's dtypes: no casting while the
 * engine runs backward, even inside an open region, except in the region a custom function's
 * backward reopens (its forward's autocast state). */
bool na_autocast_enabled(void) {
    if (depth == 0 || !stack[depth - 1].enabled) return false;
    return !na_graph_in_backward() || stack[depth - 1].in_backward;
}
na_dtype na_autocast_dtype(void) { return depth ? stack[depth - 1].dtype : NA_DTYPE_F16; }
int na_autocast_depth(void) { return depth; }
uint64_t na_autocast_cache_casts(void) { return cache_casts; }

/* ---- the rule table ------------------------------------------------------------------------- */

na_amp_rule na_autocast_rule(na_op op) {
    if ((unsigned)op >= NA_OP_COUNT) return NA_AMP_AS_IS;
    return rule_overridden[op] ? rule_override[op] : na_op_defs[op].rule;
}

int na_autocast_set_rule(na_op op, na_amp_rule rule) {
    if ((unsigned)op >= NA_OP_COUNT || (unsigned)rule >= NA_AMP_RULE_COUNT)
        return na_set_error(NA_EINVAL, "na_autocast_set_rule: unknown op %d or rule %d", (int)op,
                            (int)rule);
    if (!na_op_defs[op].asks_autocast && rule != NA_AMP_AS_IS)
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
        const char *note = rule_overridden[i] && r != na_op_defs[i].rule ? " (overridden)"
                           : !na_op_defs[i].asks_autocast                ? " (fixed)"
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

/* Replaces each eligible input by its cast to target (what applying a rule means). */
static int cast_eligible(const char *what, na_tensor **ins, int n, na_dtype target) {
    for (int k = 0; k < n; k++) {
        if (!eligible(ins[k]) || ins[k]->dtype == target) continue;
        if (target == NA_DTYPE_BF16 && ins[k]->device == NA_DEVICE_CUDA && !bf16_on_cuda())
            return na_set_error(NA_EDTYPE, "autocast: %s in a bf16 region on cuda: " NO_BF16_MSG
                                " (%s)", what, na_cuda_device_name());
        ins[k] = cached_cast(ins[k], target);
        if (!ins[k]) return na_last_status();
    }
    return NA_OK;
}

int na_autocast_inputs(na_op op, na_tensor **ins, int n) {
    assert(na_op_defs[op].asks_autocast && "a FIXED op in NA_OP_MAP asked autocast");
    if (!na_autocast_enabled()) return NA_OK;
    na_amp_rule rule = na_autocast_rule(op);
    bool tracing = na_autocast_trace_mode() != NA_AMP_TRACE_OFF;
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
        if (tracing) na_autocast_trace_decision(op, ins, n, rule, NA_DTYPE_COUNT);
        return NA_OK;
    }
    for (int k = 0; k < n && !any; k++) any = eligible(ins[k]);
    if (tracing) na_autocast_trace_decision(op, ins, n, rule, any ? target : NA_DTYPE_COUNT);
    return cast_eligible(na_op_name(op), ins, n, target);
}

int na_autocast_function_inputs(const char *name, bool cast, na_dtype target, na_tensor **ins,
                                int n) {
    if (!na_autocast_enabled()) return NA_OK;
    na_amp_rule rule = !cast ? NA_AMP_AS_IS : target == NA_DTYPE_F32 ? NA_AMP_FP32 : NA_AMP_LOWER;
    bool any = false;
    for (int k = 0; k < n && !any; k++) any = eligible(ins[k]);
    if (na_autocast_trace_mode() != NA_AMP_TRACE_OFF)
        na_autocast_trace_decision(NA_OP_CUSTOM, ins, n, rule,
                                   cast && any ? target : NA_DTYPE_COUNT);
    return cast ? cast_eligible(name, ins, n, target) : NA_OK;
}
