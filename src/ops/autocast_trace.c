/* The autocast trace: for each op, its inputs' dtypes as they came, the rule autocast applied,
 * the dtype it computed in and its output's. Autocast hands over its half of a decision
 * (na_autocast_trace_decision); the recorder's observer hands over the op's output, and the
 * line is complete. */
#include <stdlib.h>
#include <string.h>

#include "src/ops/ops_internal.h"

#define MAX_PENDING 8

/* ---- per-thread state ----- ---------------------------------------------------------- */

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
static _Thread_local const char *fp8_name; /* the op the FP8 details belong to, or NULL */
static _Thread_local na_amp_trace_fp8 fp8_info;
static _Thread_local unsigned long fp8_generation;

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


void na_autocast_trace_decision(na_op op, na_tensor *const *ins, int n, na_amp_rule rule,
                                na_dtype compute) {
    if (n_pending == MAX_PENDING) { /* stale entries of ops that failed: drop the oldest */
        memmove(pending, pending + 1, (MAX_PENDING - 1) * sizeof *pending);
        n_pending--;
    }
    pending_op *p = &pending[n_pending++];
    *p = (pending_op){.op = op, .n = n < NA_AMP_TRACE_MAX_INPUTS ? n : NA_AMP_TRACE_MAX_INPUTS,
                      .rule = rule, .compute = compute, .generation = na_arena_generation()};
    for (int k = 0; k < p->n; k++) p->in[k] = ins[k] ? ins[k]->dtype : NA_DTYPE_COUNT;
}

void na_autocast_trace_forget(void) { n_pending = 0; }

void na_autocast_trace_fp8(const char *name, const na_amp_trace_fp8 *info) {
    fp8_name = name && info ? name : NULL;
    if (fp8_name) fp8_info = *info, fp8_generation = na_arena_generation();
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
    const char *op_name = r->name ? r->name : na_op_name(r->op);
    snprintf(name, sizeof name, "%*s%s", 2 * r->nesting, "", op_name);
    const char *out = dt_name(r->out);
    int len = snprintf(buf, size, "%-15s in %-18s rule %-8s compute %-5s out %s", name, ins, rule,
                       dt_name(r->compute), out);
    /* the accumulation, only where it is wider than the compute dtype (matmul, conv2d and the
     * reductions on f16/bf16), in a column of its own */
    if (r->accumulate != NA_DTYPE_COUNT && r->accumulate != r->compute && len >= 0 &&
        (size_t)len < size)
        len += snprintf(buf + len, size - (size_t)len, "%*s acc %s", 5 - (int)strlen(out), "",
                        dt_name(r->accumulate));
    static const char *roles[NA_AMP_TRACE_FP8_ROLES] = {"input", "weight", "grad_output"};
    for (int f = 0; r->fp8 && f < NA_AMP_TRACE_FP8_ROLES && len >= 0 && (size_t)len < size;
         f++) {
        const char *fmt = dt_name(r->fp8->dtype[f]);
        if (!strncmp(fmt, "f8", 2)) fmt += 2; /* the format's name: e4m3, e5m2 */
        char amax[24] = "-";
        if (r->fp8->amax[f] == r->fp8->amax[f])
            snprintf(amax, sizeof amax, "%.4g", (double)r->fp8->amax[f]);
        len += snprintf(buf + len, size - (size_t)len, "%s%s %s scale %.4g amax %s",
                        f ? ", " : "  fp8 ", roles[f], fmt, (double)r->fp8->scale[f], amax);
    }
    return buf;
}

/* Where an op's arithmetic really runs, given the dtype of its data. BatchNorm's is f32 for
 * f16/bf16 data: it normalizes with f32 statistics, weight and bias (as cuDNN's) and rounds
 * only its output. */
static na_dtype true_compute(na_op op, na_dtype data) {
    bool low = data == NA_DTYPE_F16 || data == NA_DTYPE_BF16;
    return (op == NA_OP_BATCH_NORM || op == NA_OP_BATCH_NORM_RELU) && low ? NA_DTYPE_F32 : data;
}

/* What an op's sums (dot products, reductions, statistics, pooling windows) accumulate in on
 * both backends: f32 for f16/bf16/f32 data, f64 for f64 (cuBLASLt with CUBLAS_COMPUTE_32F,
 * cuDNN convolutions with an f32 compute type, the CPU widening to f32); NA_DTYPE_COUNT for
 * an op that sums nothing (the table's NOACC). */
static na_dtype accumulation(na_op op, na_dtype compute) {
    bool sums = op < NA_OP_COUNT && na_op_defs[op].accumulates; /* a custom function: unknown */
    if (!sums || !na_dtype_is_float(compute)) return NA_DTYPE_COUNT;
    return compute == NA_DTYPE_F64 ? NA_DTYPE_F64 : NA_DTYPE_F32;
}

static na_dtype first_float(int n, na_tensor *const *inputs, na_dtype fallback) {
    for (int k = 0; k < n; k++)
        if (inputs[k] && na_dtype_is_float(inputs[k]->dtype)) return inputs[k]->dtype;
    return fallback;
}

/* The recorder's observer: every op passes here once its output exists. */
static void trace_op(const na_graph_op *gop, const na_tensor *out, int n_inputs,
                     na_tensor *const *inputs) {
    na_amp_trace_mode mode = current_trace_mode();
    if (mode == NA_AMP_TRACE_OFF || !out || gop->id == NA_OP_PLUMBING) return;
    bool region = na_autocast_depth() > 0;
    if (mode == NA_AMP_TRACE_REGIONS && !region) return;
    na_op op = (na_op)gop->id;
    unsigned long gen = na_arena_generation();
    while (n_pending && pending[n_pending - 1].generation != gen) n_pending--;
    int j = n_pending - 1;
    while (j >= 0 && pending[j].op != op) j--;
    na_amp_trace_record r = {.op = op, .name = gop->name, .region = region,
                             .enabled = na_autocast_enabled(), .out = out->dtype,
                             .device = out->device, .rule = NA_AMP_AS_IS};
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
    if (fp8_name && r.name && !strcmp(fp8_name, r.name) && fp8_generation == gen) {
        r.fp8 = &fp8_info; /* its products run on FP8 operands, summing in f32 */
        r.compute = fp8_info.dtype[0];
        r.accumulate = NA_DTYPE_F32;
        fp8_name = NULL;
    }
    if (trace_fn) {
        trace_fn(&r, trace_ctx);
        return;
    }
    char line[400];
    fprintf(trace_out ? trace_out : stderr, "amp: %s\n",
            na_amp_trace_format(&r, line, sizeof line));
}

/* Installed when the library loads: NANOAMP_AMP_TRACE (read at the first op) then traces from
 * the start, and na_autocast_trace needs no hook of its own. With tracing off the observer
 * costs one test per op. */
__attribute__((constructor)) static void install_trace(void) { na_graph_set_observer(trace_op); }
