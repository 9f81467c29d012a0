/* Custom functions (nanoamp/autograd.h, na_function): a user's forward, backward and autocast
 * rule run as one op of the graph, as PyTorch's autograd.Function with custom_fwd/custom_bwd.
 * An ops-layer thing: a call consults autocast and records nodes like any op's front-end.
 *
 * The engine's nodes have one output each, so a call that needs a gradient records, in the
 * step arena:
 *   - a function node whose output is a hidden one-element f64 CPU tensor (the bundle); its
 *     backward (function_backward) calls the user's backward with every output's gradient;
 *   - one node per differentiable output, with the bundle as its input; its backward
 *     (output_backward) hands the output's gradient to the context and 2^j to the bundle.
 * The output nodes consume the bundle, so the engine runs all of them before the function
 * node, and the bundle's gradient (a sum of 2^j, reset by every pass) says which outputs
 * received a gradient in this pass: a gradient handed over in an earlier pass that failed is
 * never taken for one. Outputs that received none get zeros. The trace sees a call once,
 * under the function's name; the plumbing nodes are NA_OP_PLUMBING, which it leaves out.
 */
#include "src/ops/ops_internal.h"

struct na_function_ctx {
    const na_function *f;
    void *arg;       /* forward only */
    bool in_forward; /* the calls marked "forward only" check this */
    unsigned needs_grad; /* bit k: inputs[k] requires grad and the call records a gradient */
    unsigned non_diff;   /* bit j: outputs[j] was marked non-differentiable */
    na_tensor *inputs[NA_FUNCTION_MAX_INPUTS]; /* as forward saw them (after autocast) */
    na_tensor *outputs[NA_FUNCTION_MAX_OUTPUTS];
    na_tensor *saved[NA_FUNCTION_MAX_SAVED];
    uint32_t saved_version[NA_FUNCTION_MAX_SAVED]; /* when forward returned */
    int n_saved;
    bool no_materialize; /* na_function_set_materialize_grads(ctx, false) */
    void *data;
    size_t data_size;
    na_tensor *grad_out[NA_FUNCTION_MAX_OUTPUTS]; /* handed over by the output nodes */
    bool fwd_autocast; /* the autocast state forward ran under, reopened for backward */
    na_dtype fwd_dtype;
    na_graph_op fn_op, out_op;
};

_Static_assert(NA_FUNCTION_MAX_INPUTS <= NA_NODE_MAX_INPUTS, "a function's inputs are a node's");
_Static_assert(NA_FUNCTION_MAX_OUTPUTS < 32, "outputs are bits of the bundle's gradient");

/* ---- backward ------------------------------------------------------------------------------ */

static int output_backward(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_function_ctx *c = n->extra;
    int j = (int)n->i[0];
    c->grad_out[j] = gout;
    gin[0] = na_scalar(NA_DTYPE_F64, NA_DEVICE_CPU, (double)(1u << j));
    return gin[0] ? NA_OK : na_last_status();
}

/* A gradient the user's backward returned for input k, checked against that input. */
static int check_grad(const na_function_ctx *c, int k, const na_tensor *g) {
    const char *name = c->f->name;
    const na_tensor *in = c->inputs[k];
    char a[NA_DESCRIBE_MAX], b[NA_DESCRIBE_MAX];
    na_tensor_describe(g, a, sizeof a);
    na_tensor_describe(in, b, sizeof b);
    if (!in)
        return na_set_error(NA_EINVAL, "%s returned a gradient %s for input %d, which was NULL",
                            name, a, k);
    int rc = !na_same_shape(g, in)    ? NA_ESHAPE
             : g->dtype != in->dtype   ? NA_EDTYPE
             : g->device != in->device ? NA_EDEVICE
                                       : NA_OK;
    if (rc)
        return na_set_error(rc, "%s returned a gradient %s for input %d, which is %s (a gradient "
                            "has its input's shape, dtype and device)", name, a, k, b);
    return NA_OK;
}

/* A callback's negative status: its own message, or one saying who returned what (a callback
 * that returns an error without na_set_error; the message was cleared before the call). */
static int callback_failed(const na_function *f, const char *which, int rc) {
    if (na_last_status() != NA_OK) return rc;
    return na_set_error(rc, "%s's %s returned %d (%s) without a message (na_set_error says "
                        "what went wrong)", f->name, which, rc, na_status_str(rc));
}

static int function_backward(na_node *n, na_tensor *gout, na_tensor **gin) {
    na_function_ctx *c = n->extra;
    const na_function *f = c->f;
    if (!f->backward) /* PyTorch: "You must implement ... backward" */
        return na_set_error(NA_ESTATE, "%s has no backward (.backward is NULL) but a gradient "
                            "reached it: give it one, mark its outputs non-differentiable, or "
                            "na_detach them", f->name);
    unsigned received = (unsigned)na_item(gout);
    na_tensor *gouts[NA_FUNCTION_MAX_OUTPUTS];
    for (int j = 0; j < f->n_outputs; j++) {
        bool got = received >> j & 1;
        gouts[j] = got ? c->grad_out[j] : c->no_materialize ? NULL : na_zeros_like(c->outputs[j]);
        c->grad_out[j] = NULL;
        if (!gouts[j] && (got || !c->no_materialize)) return na_last_status();
    }
    int rc = c->fwd_autocast ? na_autocast_begin_backward(true, c->fwd_dtype) : NA_OK;
    if (rc) return rc;
    na_tensor *user[NA_FUNCTION_MAX_INPUTS] = {0};
    na_clear_error();
    int count = f->backward(c, gouts, user);
    if (c->fwd_autocast) na_autocast_end();
    if (count < 0) return callback_failed(f, "backward", count);
    if (count != f->n_inputs)
        return na_set_error(NA_EINVAL, "%s returned %d gradients for its %d inputs (return "
                            "n_inputs: one gradient per input, NULL for none)", f->name, count,
                            f->n_inputs);
    for (int k = 0; k < f->n_inputs; k++) {
        if (!user[k]) continue;
        if ((rc = check_grad(c, k, user[k]))) return rc;
        gin[k] = user[k];
    }
    return NA_OK;
}

/* ---- forward -------------------------------------------------------------------------------- */

static int check_function(const char *fn, const na_function *f) {
    if (!f || !f->name || !f->forward)
        return na_set_error(NA_EINVAL, "%s: a function needs a name and a forward", fn);
    if (f->n_inputs < 0 || f->n_inputs > NA_FUNCTION_MAX_INPUTS || f->n_outputs < 1 ||
        f->n_outputs > NA_FUNCTION_MAX_OUTPUTS)
        return na_set_error(NA_EINVAL, "%s: %s has %d inputs and %d outputs (at most %d inputs, "
                            "1 to %d outputs)", fn, f->name, f->n_inputs, f->n_outputs,
                            NA_FUNCTION_MAX_INPUTS, NA_FUNCTION_MAX_OUTPUTS);
    na_dtype d = f->forward_dtype;
    if (!f->cast_inputs && d != NA_FUNCTION_DTYPE_UNSET)
        return na_set_error(NA_EINVAL, "%s: %s sets .forward_dtype %s without .cast_inputs, "
                            "which alone casts: set .cast_inputs = true to run forward in %s, or "
                            "leave .forward_dtype unset to run as called", fn, f->name,
                            na_dtype_name(d), na_dtype_name(d));
    if (f->cast_inputs && d != NA_FUNCTION_DTYPE_UNSET && d != NA_DTYPE_F32 &&
        d != NA_DTYPE_F16 && d != NA_DTYPE_BF16)
        return na_set_error(NA_EDTYPE, "%s: %s casts its inputs to %s (f32, f16 or bf16 only)",
                            fn, f->name, na_dtype_name(d));
    return NA_OK;
}

/* What a .cast_inputs forward computes in: f32 when .forward_dtype is left unset. */
static na_dtype forward_dtype_of(const na_function *f) {
    return f->forward_dtype == NA_FUNCTION_DTYPE_UNSET ? NA_DTYPE_F32 : f->forward_dtype;
}

static int run_forward(na_function_ctx *c) {
    const na_function *f = c->f;
    /* .cast_inputs: forward computes in its own dtype with autocast off (custom_fwd) */
    bool off = f->cast_inputs && na_autocast_enabled();
    int rc = off ? na_autocast_begin_disabled() : NA_OK;
    if (rc) return rc;
    c->fwd_autocast = na_autocast_enabled();
    c->fwd_dtype = na_autocast_dtype();
    c->in_forward = true;
    na_no_grad_begin();
    na_clear_error();
    rc = f->forward(c, c->inputs, c->outputs);
    if (rc < 0) rc = callback_failed(f, "forward", rc);
    na_no_grad_end();
    c->in_forward = false;
    c->arg = NULL;
    if (off) na_autocast_end();
    if (rc) return na_set_error(rc < 0 ? rc : NA_EINVAL, "forward of %s failed: %s", f->name,
                                rc < 0 ? na_last_error() : "it returned a positive value");
    for (int k = 0; k < c->n_saved; k++) c->saved_version[k] = na_tensor_version(c->saved[k]);
    return NA_OK;
}

/* An output the graph may own: a fresh header, unless forward returned one of its inputs, a
 * persistent tensor or one already in a graph (then a view of it, as na_detach gives). */
static int adopt_outputs(na_function_ctx *c) {
    const na_function *f = c->f;
    for (int j = 0; j < f->n_outputs; j++) {
        na_tensor *t = c->outputs[j];
        if (!t) return na_set_error(NA_EINVAL, "forward of %s left output %d NULL", f->name, j);
        bool shared = t->persistent || t->requires_grad || t->grad_fn;
        for (int k = 0; k < f->n_inputs; k++) shared |= t == c->inputs[k];
        for (int i = 0; i < j; i++) shared |= t == c->outputs[i];
        if (shared && !(c->outputs[j] = na_detach(t))) return na_last_status();
    }
    return NA_OK;
}

static int record(na_function_ctx *c) {
    const na_function *f = c->f;
    unsigned diff = 0;
    for (int j = 0; j < f->n_outputs; j++)
        if (!(c->non_diff >> j & 1) && na_dtype_is_float(c->outputs[j]->dtype)) diff |= 1u << j;
    if (!c->needs_grad || !diff) return NA_OK;
    na_tensor *bundle = na_zeros(NA_DTYPE_F64, NA_DEVICE_CPU, 0, NULL);
    if (!bundle) return na_last_status();
    c->fn_op = (na_graph_op){.id = NA_OP_PLUMBING, .name = f->name, .backward = function_backward};
    c->out_op = (na_graph_op){.id = NA_OP_PLUMBING, .name = f->name, .backward = output_backward,
                              .keeps_gout = true}; /* in c->grad_out, for function_backward */
    na_node *n = na_graph_record(&c->fn_op, bundle, f->n_inputs, c->inputs);
    if (!n) return na_last_status();
    n->extra = c;
    n->kept = c->saved; /* the pass keeps them (an output, say) until backward has run */
    n->n_kept = c->n_saved;
    for (int j = 0; j < f->n_outputs; j++) {
        if (!(diff >> j & 1)) continue;
        na_node *o = na_graph_record(&c->out_op, c->outputs[j], 1, &bundle);
        if (!o) return na_last_status();
        o->extra = c;
        o->i[0] = j;
    }
    return NA_OK;
}

int na_function_apply(const na_function *f, na_tensor *const *inputs, na_tensor **outputs,
                      void *arg) {
    const char *fn = "na_function_apply";
    int rc = check_function(fn, f);
    if (rc) return rc;
    if (!outputs || (f->n_inputs && !inputs))
        return na_set_error(NA_EINVAL, "%s: %s: NULL %s array", fn, f->name,
                            outputs ? "inputs" : "outputs");
    for (int j = 0; j < f->n_outputs; j++) outputs[j] = NULL;
    for (int k = 0; k < f->n_inputs; k++)
        if (inputs[k] && !na_check_tensor(fn, inputs[k], f->name)) return na_last_status();
    na_function_ctx *c = na_arena_host_alloc(sizeof *c);
    if (!c) return na_last_status();
    c->f = f;
    c->arg = arg;
    for (int k = 0; k < f->n_inputs; k++) c->inputs[k] = inputs[k];
    rc = na_autocast_function_inputs(f->name, f->cast_inputs, forward_dtype_of(f), c->inputs,
                                     f->n_inputs);
    for (int k = 0; k < f->n_inputs; k++) { /* without a backward too: it fails at backward */
        bool needs = c->inputs[k] && c->inputs[k]->requires_grad;
        if (needs && na_grad_enabled()) c->needs_grad |= 1u << k;
    }
    if (!rc) rc = run_forward(c);
    if (!rc) rc = adopt_outputs(c);
    if (!rc) { /* the trace's line for the call: an op without a backward records nothing */
        na_graph_op seen = {.id = NA_OP_CUSTOM, .name = f->name};
        na_graph_record(&seen, c->outputs[0], f->n_inputs, c->inputs);
        rc = record(c);
    }
    if (rc) return na_set_error(rc, "%s: %s", fn, na_last_error());
    for (int j = 0; j < f->n_outputs; j++) outputs[j] = c->outputs[j];
    return NA_OK;
}

na_tensor *na_function_apply1(const na_function *f, na_tensor *const *inputs, void *arg) {
    if (f && f->n_outputs > 1) {
        na_set_error(NA_EINVAL, "na_function_apply1: %s has %d outputs: use na_function_apply",
                     f->name ? f->name : "(unnamed)", f->n_outputs);
        return NULL;
    }
    na_tensor *out = NULL;
    return na_function_apply(f, inputs, &out, arg) ? NULL : out;
}

/* ---- the context ----------------------------------------------------------------------------- */

static bool forward_only(const char *fn, const na_function_ctx *c) {
    if (!c) return na_set_error(NA_EINVAL, "%s: NULL context", fn), false;
    if (!c->in_forward)
        return na_set_error(NA_ESTATE, "%s: %s: only its forward may call this", fn, c->f->name),
               false;
    return true;
}

int na_function_save(na_function_ctx *c, na_tensor *t) {
    const char *fn = "na_function_save";
    if (!forward_only(fn, c)) return na_last_status();
    if (!na_check_tensor(fn, t, "tensor")) return na_last_status();
    if (c->n_saved == NA_FUNCTION_MAX_SAVED)
        return na_set_error(NA_EINVAL, "%s: %s saves more than %d tensors", fn, c->f->name,
                            NA_FUNCTION_MAX_SAVED);
    c->saved[c->n_saved++] = t;
    return NA_OK;
}

na_tensor *na_function_saved(const na_function_ctx *c, int k) {
    const char *fn = "na_function_saved";
    if (!c || k < 0 || k >= c->n_saved) {
        na_set_error(NA_EINVAL, "%s: %s saved %d tensors, asked for number %d", fn,
                     c ? c->f->name : "(NULL context)", c ? c->n_saved : 0, k);
        return NULL;
    }
    na_tensor *t = c->saved[k];
    if (!c->in_forward && na_tensor_version(t) != c->saved_version[k]) { /* as PyTorch's unpack */
        char place[32];
        snprintf(place, sizeof place, "saved tensor %d", k);
        na_graph_version_error(fn, t, place, c->f->name, c->saved_version[k]);
        return NULL;
    }
    return t;
}

void *na_function_data(na_function_ctx *c, size_t size) {
    const char *fn = "na_function_data";
    if (!c) return na_set_error(NA_EINVAL, "%s: NULL context", fn), NULL;
    if (!c->data) {
        if (!(c->data = na_arena_host_alloc(size ? size : 1))) return NULL;
        c->data_size = size;
    } else if (size > c->data_size) {
        na_set_error(NA_EINVAL, "%s: %s asks for %zu bytes, its block has %zu", fn, c->f->name,
                     size, c->data_size);
        return NULL;
    }
    return c->data;
}

void *na_function_arg(const na_function_ctx *c) {
    return forward_only("na_function_arg", c) ? c->arg : NULL;
}

int na_function_mark_non_differentiable(na_function_ctx *c, int k) {
    const char *fn = "na_function_mark_non_differentiable";
    if (!forward_only(fn, c)) return na_last_status();
    if (k < 0 || k >= c->f->n_outputs)
        return na_set_error(NA_EINVAL, "%s: %s has %d outputs, got output %d", fn, c->f->name,
                            c->f->n_outputs, k);
    c->non_diff |= 1u << k;
    return NA_OK;
}

int na_function_mark_dirty(na_function_ctx *c, int k) {
    const char *fn = "na_function_mark_dirty";
    if (!forward_only(fn, c)) return na_last_status();
    if (k < 0 || k >= c->f->n_inputs || !c->inputs[k])
        return na_set_error(NA_EINVAL, "%s: %s has %d inputs, got input %d%s", fn, c->f->name,
                            c->f->n_inputs, k, k >= 0 && k < c->f->n_inputs ? " (NULL)" : "");
    na_tensor *t = c->inputs[k];
    if (!t->grad_fn && (c->needs_grad >> k & 1)) /* PyTorch refuses it too */
        return na_set_error(NA_ESTATE, "%s: %s writes input %d in place, a leaf that requires "
                            "grad (its gradient would be of values it no longer holds): write a "
                            "copy", fn, c->f->name, k);
    na_tensor_bump_version(t);
    return NA_OK;
}

int na_function_set_materialize_grads(na_function_ctx *c, bool materialize) {
    if (!forward_only("na_function_set_materialize_grads", c)) return na_last_status();
    c->no_materialize = !materialize;
    return NA_OK;
}

bool na_function_needs_input_grad(const na_function_ctx *c, int k) {
    return c && k >= 0 && k < c->f->n_inputs && (c->needs_grad >> k & 1);
}

const na_function *na_function_of(const na_function_ctx *c) { return c ? c->f : NULL; }
