/* The autocast trace's backward rows (nanoamp/amp.h, na_amp_trace_backward): the engine's
 * backward observer counts each node's incoming gradient on its own dtype's number line
 * (na_amp_hist: a host copy, no op run) while this thread traces, and prints the row or hands
 * it to the caller's function. */
#include <string.h>

#include "src/amp/amp_internal.h"
#include "src/autograd/graph.h"

static _Thread_local bool trace_on;
static _Thread_local FILE *trace_out;
static _Thread_local na_amp_backward_trace_fn trace_fn;
static _Thread_local void *trace_ctx;

void na_amp_trace_backward_callback(bool on, na_amp_backward_trace_fn fn, void *ctx) {
    trace_on = on;
    trace_fn = fn;
    trace_ctx = ctx;
}

void na_amp_trace_backward(bool on, FILE *out) {
    na_amp_trace_backward_callback(on, NULL, NULL);
    trace_out = out;
}

bool na_amp_trace_backward_on(void) { return trace_on; }

/* A share of r's elements, 7 wide: never "0.00%" for a count that is not 0, nor "100.00%" for
 * one short of all (one element dying among millions is the point). */
static const char *share(const na_amp_backward_record *r, int64_t k, char *buf, size_t size) {
    double pct = r->n ? 100.0 * (double)k / (double)r->n : 0;
    if (!r->counted || !r->n) snprintf(buf, size, "%7s", "-");
    else if (k && pct < 0.005) snprintf(buf, size, "%7s", "<0.01%");
    else if (k < r->n && pct >= 99.995) snprintf(buf, size, "%7s", ">99.99%");
    else snprintf(buf, size, "%6.2f%%", pct);
    return buf;
}

const char *na_amp_trace_backward_format(const na_amp_backward_record *r, char *buf,
                                         size_t size) {
    if (!r->name) {
        snprintf(buf, size, "backward");
        return buf;
    }
    char shape[96] = "[", z[16], s[16], nf[16];
    size_t k = 1;
    for (int i = 0; i < r->ndim && k < sizeof shape; i++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", i ? "," : "",
                              (long long)r->shape[i]);
    if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, "]");
    snprintf(buf, size, "%-15s grad %-5s %-16s zero %s  subnormal %s  non-finite %s", r->name,
             na_dtype_name(r->dtype), shape, share(r, r->zero, z, sizeof z),
             share(r, r->subnormal, s, sizeof s), share(r, r->nonfinite, nf, sizeof nf));
    return buf;
}

static int observe(const na_graph_op *op, const na_tensor *g) {
    if (!trace_on) return NA_OK;
    na_amp_backward_record r = {.name = op ? op->name : NULL};
    if (g) {
        r.dtype = g->dtype, r.device = g->device, r.ndim = g->ndim, r.n = g->numel;
        memcpy(r.shape, g->shape, sizeof(int64_t) * (size_t)g->ndim);
        r.counted = g->dtype == NA_DTYPE_F16 || g->dtype == NA_DTYPE_BF16 ||
                    g->dtype == NA_DTYPE_F32; /* an f64 gradient (gradcheck): no line here */
        na_amp_hist h;
        if (r.counted && (na_amp_hist_init(&h, g->dtype) || na_amp_hist_add_tensor(&h, g)))
            return na_set_error(na_last_status(), "the amp trace, counting the gradient of %s: "
                                "%s", r.name, na_last_error());
        if (r.counted) r.zero = h.zero, r.subnormal = h.subnormal, r.nonfinite = h.nonfinite;
    }
    if (trace_fn) {
        trace_fn(&r, trace_ctx);
        return NA_OK;
    }
    char line[192];
    fprintf(trace_out ? trace_out : stderr, "amp: %s\n",
            na_amp_trace_backward_format(&r, line, sizeof line));
    return NA_OK;
}

/* Installed when the library loads, as the forward trace's observer: off, it costs the engine
 * one test per node. */
__attribute__((constructor)) static void install_backward_trace(void) {
    na_graph_set_backward_observer(observe);
}
