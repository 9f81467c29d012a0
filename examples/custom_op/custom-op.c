/* custom-op — your own op in C: swish (swish.c) with its hand-written backward, checked by
 * finite differences (na_gradcheck), then used in a small classifier trained twice from the
 * same start: in f32, and under f16 autocast with a GradScaler. The last line printed is one
 * JSON object: the gradient check, both runs' losses and the dtypes swish's forward saw and
 * its backward received in each (f32 in both: swish declares .cast_inputs = f32).
 *
 *   custom-op [--device cpu|cuda] [--steps N] [--amp-trace]
 *
 * --amp-trace prints the dtype each op of the amp run's first forward ran in: swish shows
 * there with its declared rule (fp32), between the f16 linear layers.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "swish.h"

#define N_POINTS 256
#define HIDDEN 32
#define CLASSES 3

static bool amp_trace;

/* Points in [-2, 2]^2, labelled by a ring and the sign of x*y: no linear model separates
 * them, so the hidden swish layers have work to do. */
static void make_data(float *x, int32_t *y) {
    uint64_t s = 12345;
    for (int i = 0; i < N_POINTS; i++) {
        for (int d = 0; d < 2; d++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[2 * i + d] = (float)((s >> 40) * 0x1p-24 * 4.0 - 2.0);
        }
        float a = x[2 * i], b = x[2 * i + 1];
        y[i] = a * a + b * b < 1.0f ? 0 : a * b > 0 ? 1 : 2;
    }
}

static na_tensor *gc_swish(na_tensor **in, void *ctx) { return swish(in[0]); }

/* "ok", or nanoamp's message on a mismatch (written into buf). */
static const char *check_gradients(char *buf, size_t size) {
    na_manual_seed(7);
    na_tensor *x = na_randn(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(3, 5), 0.0, 2.0);
    int rc = x ? na_tensor_set_requires_grad(x, true) : na_last_status();
    if (!rc) rc = na_gradcheck(gc_swish, NULL, &x, 1, NULL);
    snprintf(buf, size, "%s", rc ? na_last_error() : "ok");
    na_step_end();
    return buf;
}

typedef struct {
    double first, last, scale;
    swish_seen seen;
} run_result;

/* A persistent parameter of `shape`, N(0, std) from the seeded generator, on dev. */
static na_tensor *param(na_device dev, int ndim, const int64_t *shape, double std) {
    na_tensor *p = na_tensor_new(NA_DTYPE_F32, dev, ndim, shape);
    na_tensor *v = na_randn(NA_DTYPE_F32, NA_DEVICE_CPU, ndim, shape, 0.0, std);
    if (!p || !v || na_copy_(p, v) || na_tensor_set_requires_grad(p, true)) {
        na_tensor_free(p);
        return NULL;
    }
    return p;
}

/* Trains 2 -> HIDDEN -> swish -> HIDDEN -> swish -> CLASSES for `steps` full-batch steps of
 * SGD with momentum, in f32 or (amp) under f16 autocast with a GradScaler. */
static int train(na_device dev, int steps, bool amp, run_result *r) {
    float xs[2 * N_POINTS];
    int32_t ys[N_POINTS];
    make_data(xs, ys);
    na_manual_seed(1); /* the same start for both runs */
    na_tensor *w[6] = {param(dev, NA_SHAPE(HIDDEN, 2), 0.7), param(dev, NA_SHAPE(HIDDEN), 0.1),
                       param(dev, NA_SHAPE(HIDDEN, HIDDEN), 0.18),
                       param(dev, NA_SHAPE(HIDDEN), 0.1),
                       param(dev, NA_SHAPE(CLASSES, HIDDEN), 0.18),
                       param(dev, NA_SHAPE(CLASSES), 0.1)};
    na_sgd_cfg cfg = NA_SGD_DEFAULTS;
    cfg.lr = 0.1, cfg.momentum = 0.9;
    bool ok = true;
    for (int i = 0; i < 6; i++) ok &= w[i] != NULL;
    na_optim *opt = ok ? na_sgd_new(NA_TENSORS(w[0], w[1], w[2], w[3], w[4], w[5]), &cfg) : NULL;
    na_grad_scaler *gs = amp ? na_grad_scaler_new(NULL) : NULL;
    int rc = opt && (gs || !amp) ? NA_OK : na_last_status();
    swish_dtypes = (swish_seen){0};
    for (int step = 0; step < steps && !rc; step++) {
        na_tensor *x = na_from_host(NA_DTYPE_F32, dev, NA_SHAPE(N_POINTS, 2), xs);
        na_tensor *y = na_from_host(NA_DTYPE_I32, dev, NA_SHAPE(N_POINTS), ys);
        bool trace = amp && amp_trace && step == 0;
        if (trace) na_autocast_trace(NA_AMP_TRACE_REGIONS, stderr);
        if (amp) na_autocast_begin_device(dev, NA_DTYPE_F16); /* linear in f16, swish in f32 */
        na_tensor *h = swish(na_linear(x, w[0], w[1]));
        h = swish(na_linear(h, w[2], w[3]));
        na_tensor *loss = na_cross_entropy(na_linear(h, w[4], w[5]), y, NULL);
        if (amp) na_autocast_end();
        if (trace) na_autocast_trace(NA_AMP_TRACE_OFF, NULL);
        if (!loss) {
            rc = na_last_status();
        } else if (amp) {
            rc = na_backward(na_grad_scaler_scale(gs, loss), NULL) ||
                 na_grad_scaler_step(gs, opt) || na_grad_scaler_update(gs) ||
                 na_optim_zero_grad(opt);
        } else {
            rc = na_backward(loss, NULL) || na_optim_step(opt, NULL) || na_optim_zero_grad(opt);
        }
        if (!rc && step == 0) r->first = na_item(loss); /* host reads: first and last only */
        if (!rc && step == steps - 1) r->last = na_item(loss);
        na_step_end();
    }
    if (rc && !na_last_status()) rc = NA_EINVAL;
    r->scale = gs ? na_grad_scaler_get_scale(gs) : 1.0;
    r->seen = swish_dtypes;
    na_grad_scaler_free(gs);
    na_optim_free(opt);
    for (int i = 0; i < 6; i++) na_tensor_free(w[i]);
    return rc;
}

static void print_number(double v) { /* JSON has no NaN or infinity */
    if (isfinite(v)) printf("%.6g", v);
    else printf("null");
}

static void print_dtypes(unsigned bits) {
    printf("[");
    for (int dt = 0, first = 1; dt < NA_DTYPE_COUNT; dt++)
        if (bits >> dt & 1) printf("%s\"%s\"", first ? "" : ", ", na_dtype_name(dt)), first = 0;
    printf("]");
}

/* A whole number in [1, 10^6], nothing after it ("3x" is no count). */
static bool parse_steps(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!isdigit((unsigned char)s[0]) || *end || errno || v < 1 || v > 1000000) return false;
    *out = (int)v;
    return true;
}

int main(int argc, char **argv) {
    na_device dev = NA_DEVICE_CPU;
    int steps = 150;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cuda")) {
            dev = NA_DEVICE_CUDA, i++;
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cpu")) {
            i++;
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc && parse_steps(argv[i + 1], &steps)) {
            i++;
        } else if (!strcmp(argv[i], "--amp-trace")) {
            amp_trace = true;
        } else {
            bool help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            if (!help)
                fprintf(stderr, "%s: unknown or incomplete argument '%s'\n", argv[0], argv[i]);
            fprintf(help ? stdout : stderr, "usage: %s [--device cpu|cuda] [--steps N (1..10^6)] "
                    "[--amp-trace]\n", argv[0]);
            return help ? 0 : 2;
        }
    }
    char gradcheck[256];
    check_gradients(gradcheck, sizeof gradcheck);
    printf("gradcheck of swish (f64, CPU): %s\n", gradcheck);
    run_result runs[2] = {{0}};
    const char *names[2] = {"f32", "amp_fp16"};
    for (int amp = 0; amp < 2; amp++) {
        if (train(dev, steps, amp, &runs[amp])) {
            fprintf(stderr, "%s: %s run: %s\n", argv[0], names[amp], na_last_error());
            return 1;
        }
        printf("%-8s loss %.4f -> %.4f after %d steps on %s\n", names[amp], runs[amp].first,
               runs[amp].last, steps, na_device_name(dev));
    }
    printf("{\"gradcheck\": \"");
    for (const char *c = gradcheck; *c; c++) /* a message may quote: keep the JSON valid */
        printf(*c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
    printf("\", \"device\": \"%s\", \"steps\": %d", na_device_name(dev), steps);
    for (int amp = 0; amp < 2; amp++) {
        const run_result *r = &runs[amp];
        printf(", \"%s\": {\"loss_first\": ", names[amp]);
        print_number(r->first);
        printf(", \"loss_last\": ");
        print_number(r->last);
        printf(", \"loss_scale\": %g, \"forward_dtypes\": ", r->scale);
        print_dtypes(r->seen.forward);
        printf(", \"backward_dtypes\": ");
        print_dtypes(r->seen.backward);
        printf("}");
    }
    printf("}\n");
    return strcmp(gradcheck, "ok") ? 1 : 0;
}
