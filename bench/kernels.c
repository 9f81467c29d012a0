/* na-kbench — CPU kernel micro-benchmarks, for before/after numbers of one kernel at a time
 * (the training step is na-bench's job). Each case prints the minimum over --repeats timed
 * calls, in milliseconds, which is the figure least disturbed by other work on the machine.
 *
 *   na-kbench [--repeats N] [--cpu-clock] [case...]
 *             cases: conv, conv-resnet9, gemm, convert, maxpool, relu, bn, bn-resnet9, peak (default: all), run
 *             in this order; every argument is checked first. --cpu-clock times CPU time (all
 *             threads) instead of wall time: with NANOAMP_THREADS=1 it compares kernels on a
 *             machine that is busy with other work.
 *
 * conv:    the MNIST CNN's two convolutions (batch 128), forward and gradients, f32 through
 *          the direct AVX-512 convolution and the im2col + GEMM path (cpu_direct_conv.c,
 *          cpu_conv.c), and bf16 (x, w, y in bf16) widened to f32 (bf16_widening, the
 *          specification) and on vdpbf16ps (bf16_dpbf16, where the CPU has it), and f16
 *          (f32 compute, the halves converted in the packing); "n" is the rate in GFLOP/s
 *          (integer), "gflops" the same unrounded, "pct_peak" its percentage of this
 *          machine's measured peak for the compute ("peak": f32 FMA or bf16 vdpbf16ps,
 *          bench/peak.h). A "total" row per variant divides all the case's FLOPs by
 *          all its time. conv-resnet9: the same for ResNet-9's six distinct 3x3 layers at
 *          batch 32.
 * peak:    the peak-FLOP probes of bench/peak.h on the backend's threads: "gflops" per probe.
 * gemm:    the MNIST MLP's matrix products (batch 128: both forwards, both weight gradients,
 *          the hidden layer's data gradient) and a 512^3 one, through the backend's gemm: f32
 *          (OpenBLAS when built with it), bf16 on the widening path and bf16 on vdpbf16ps
 *          (where the CPU has AVX512_BF16; cpu_gemm.c), and f16 (widened, OpenBLAS's f32
 *          product); "n" is the rate in GFLOP/s.
 * convert: f32 <-> f16 / bf16 of 4.8M elements (one CNN activation set), through the
 *          portable half.h loops, F16C / AVX2 and AVX-512 (16 lanes; cpu_convert.c).
 * maxpool: the MNIST CNN's two 2x2 max pools (batch 128), forward with indices and backward,
 *          f32, f16 and bf16, through the generic window loop and the 2x2 path (cpu_conv.c;
 *          for f16/bf16 the 2x2 backward scatters halves directly, generic goes through f32).
 * relu:    ReLU forward and backward over the CNN's first activation (128x32x28x28), f32 and
 *          f16 (the unary kernels of cpu_elementwise.c).
 * bn:      the MNIST CNN's two BatchNorm+ReLU layers (batch 128), training forward and
 *          backward, f32, f16 and bf16 activations with f32 parameters (cpu_batchnorm.c);
 *          syncbn_*: SyncBatchNorm's kernels for the same layers, without the collectives
 *          (src/dist/syncbn.c, cpu_syncbn.c); *_backward_y: relu'(y) read from y instead.
 * bn-resnet9: the same for ResNet-9's BatchNorm layers at batch 32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "peak.h"
#include "cpu/cpu_internal.h"
#include "nanoamp/threads.h"

static int repeats = 20;
static bool cpu_clock; /* --cpu-clock: the process's CPU time instead of wall time */

static double now_s(void) { return cpu_clock ? bench_cpu_s() : bench_now_s(); }

/* min over `repeats` runs of body, in ms */
#define BENCH_MIN_MS(result, body)                                                          \
    do {                                                                                    \
        double best_ = 1e300;                                                               \
        for (int r_ = 0; r_ < repeats; r_++) {                                              \
            double t0_ = now_s();                                                           \
            body;                                                                           \
            double dt_ = (now_s() - t0_) * 1e3;                                             \
            if (dt_ < best_) best_ = dt_;                                                   \
        }                                                                                   \
        (result) = best_;                                                                   \
    } while (0)

static void print_row(const char *kernel, const char *variant, int64_t n, double ms) {
    bench_json j;
    bench_json_begin(&j, stdout);
    bench_json_str(&j, "bench", "kernel");
    bench_json_str(&j, "kernel", kernel);
    bench_json_str(&j, "variant", variant);
    bench_json_int(&j, "n", n);
    bench_json_num(&j, "min_ms", ms);
    bench_json_end(&j);
}

static int bench_convert(void) {
    const int64_t n = 128 * 16 * 48 * 48; /* ~4.7M */
    float *f = malloc((size_t)n * sizeof *f), *back = malloc((size_t)n * sizeof *back);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!f || !h || !back) return 1;
    for (int64_t i = 0; i < n; i++) f[i] = (float)((i * 2654435761u) % 20001) * 1e-3f - 10.0f;
    /* 2: the portable loops, 1: F16C / AVX2, 0: the 16-lane AVX-512 conversions */
    for (int path = 2; path >= 0; path--) {
        na_cpu_convert_force_soft = path == 2;
        na_cpu_half512_off = path == 1;
        if (path == 0 && !na_cpu_half512()) continue;
        const char *v = path == 2 || !na_cpu_convert_is_fast() ? "portable"
                        : path == 1                            ? "f16c_avx2"
                                                               : "avx512";
        double ms;
        BENCH_MIN_MS(ms, na_cpu_f32_to_f16(h, f, n));
        print_row("f32_to_f16", v, n, ms);
        BENCH_MIN_MS(ms, na_cpu_f16_to_f32(back, h, n));
        print_row("f16_to_f32", v, n, ms);
        BENCH_MIN_MS(ms, na_cpu_f32_to_bf16(h, f, n));
        print_row("f32_to_bf16", v, n, ms);
        BENCH_MIN_MS(ms, na_cpu_bf16_to_f32(back, h, n));
        print_row("bf16_to_f32", v, n, ms);
    }
    na_cpu_convert_force_soft = false, na_cpu_half512_off = false;
    free(f), free(h), free(back);
    return 0;
}

static na_view bench_view(na_dtype dt, int ndim, const int64_t *shape) {
    na_view v = {.dtype = dt, .device = NA_DEVICE_CPU, .ndim = ndim, .numel = 1};
    for (int d = ndim - 1; d >= 0; d--) {
        v.shape[d] = shape[d];
        v.stride[d] = v.numel;
        v.numel *= shape[d];
    }
    v.data = calloc((size_t)v.numel, na_dtype_size(dt));
    return v;
}

static void bench_fill(na_view *v) { /* hashed values in [-1, 1): random signs, some ties */
    for (int64_t i = 0; i < v->numel; i++) {
        uint64_t z = ((uint64_t)i + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
        na_cpu_set(v->dtype, v->data, i, (double)((z >> 33) % 1000) / 500.0 - 1.0);
    }
}

static int bench_maxpool(void) {
    const int64_t shapes[2][4] = {{128, 32, 28, 28}, {128, 64, 14, 14}};
    const na_dtype dts[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    int rc = 0;
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 3; t++) {
            const int64_t *xs = shapes[s];
            int64_t ys[4] = {xs[0], xs[1], xs[2] / 2, xs[3] / 2};
            na_conv_geom g = {.n = xs[0], .c_in = xs[1], .h = xs[2], .w = xs[3], .c_out = xs[1],
                              .oh = ys[2], .ow = ys[3], .kh = 2, .kw = 2, .sh = 2, .sw = 2,
                              .dh = 1, .dw = 1, .groups = 1};
            na_view x = bench_view(dts[t], 4, xs), y = bench_view(dts[t], 4, ys),
                    idx = bench_view(NA_DTYPE_I32, 4, ys), gy = bench_view(dts[t], 4, ys),
                    gx = bench_view(dts[t], 4, xs);
            if (!x.data || !y.data || !idx.data || !gy.data || !gx.data) return 1;
            bench_fill(&x);
            bench_fill(&gy);
            char name[64], bname[80];
            const char *dt = na_dtype_name(dts[t]);
            snprintf(name, sizeof name, "max_pool2d_%s_%lldx%lld", dt, (long long)xs[2],
                     (long long)xs[3]);
            snprintf(bname, sizeof bname, "max_pool2d_backward_%s_%lldx%lld", dt,
                     (long long)xs[2], (long long)xs[3]);
            for (int generic = 1; generic >= 0; generic--) {
                na_cpu_pool_force_generic = generic;
                const char *v = generic ? "generic" : "2x2";
                double ms;
                BENCH_MIN_MS(ms, rc |= na_cpu_max_pool2d(&g, &x, &y, &idx));
                print_row(name, v, x.numel, ms);
                BENCH_MIN_MS(ms, rc |= na_cpu_max_pool2d_backward(&g, &gy, &idx, &gx));
                print_row(bname, v, x.numel, ms);
            }
            na_cpu_pool_force_generic = false;
            free(x.data), free(y.data), free(idx.data), free(gy.data), free(gx.data);
        }
    return rc != 0;
}

static int bench_relu(void) {
    const int64_t shape[4] = {128, 32, 28, 28};
    const na_dtype dts[2] = {NA_DTYPE_F32, NA_DTYPE_F16};
    int rc = 0;
    for (int t = 0; t < 2; t++) {
        na_view x = bench_view(dts[t], 4, shape), y = bench_view(dts[t], 4, shape),
                gy = bench_view(dts[t], 4, shape), gx = bench_view(dts[t], 4, shape);
        if (!x.data || !y.data || !gy.data || !gx.data) return 1;
        bench_fill(&x);
        bench_fill(&gy);
        const char *dt = dts[t] == NA_DTYPE_F32 ? "f32" : "f16";
        char name[64];
        double ms;
        BENCH_MIN_MS(ms, rc |= na_cpu_unary(NA_UNARY_RELU, &x, &y, 0, 0));
        snprintf(name, sizeof name, "relu_%s", dt);
        print_row(name, "", x.numel, ms);
        BENCH_MIN_MS(ms, rc |= na_cpu_unary_backward(NA_UNARY_RELU, &x, &y, &gy, &gx, 0, 0));
        snprintf(name, sizeof name, "relu_backward_%s", dt);
        print_row(name, "", x.numel, ms);
        free(x.data), free(y.data), free(gy.data), free(gx.data);
    }
    return rc != 0;
}

static int bench_bn_layers(const int64_t (*shapes)[4], int layers) {
    const na_dtype dts[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    int rc = 0;
    for (int l = 0; l < layers; l++)
        for (int t = 0; t < 3; t++) {
            const int64_t *xs = shapes[l], cs[1] = {xs[1]};
            int64_t n = xs[0], c = xs[1], s = xs[2] * xs[3];
            na_view x = bench_view(dts[t], 4, xs), y = bench_view(dts[t], 4, xs),
                    gy = bench_view(dts[t], 4, xs), gx = bench_view(dts[t], 4, xs);
            na_view p[6]; /* gamma, beta, running mean/var, saved mean/invstd: f32 */
            for (int k = 0; k < 6; k++) p[k] = bench_view(NA_DTYPE_F32, 1, cs);
            na_view gg = bench_view(NA_DTYPE_F32, 1, cs), gb = bench_view(NA_DTYPE_F32, 1, cs);
            if (!x.data || !y.data || !gy.data || !gx.data || !gg.data || !gb.data) return 1;
            bench_fill(&x), bench_fill(&gy), bench_fill(&p[0]), bench_fill(&p[1]);
            char name[64];
            const char *dt = na_dtype_name(dts[t]);
            double ms;
            BENCH_MIN_MS(ms, rc |= na_cpu_batch_norm_train(&x, &p[0], &p[1], &p[2], &p[3], &y,
                                                           &p[4], &p[5], n, c, s, 0.1, 1e-5,
                                                           true));
            snprintf(name, sizeof name, "bn_relu_%s_%lldx%lld_forward", dt, (long long)c,
                     (long long)xs[2]);
            print_row(name, "", x.numel, ms);
            BENCH_MIN_MS(ms, rc |= na_cpu_batch_norm_backward(&x, &gy, &p[0], &p[4], &p[5], &gx,
                                                              &gg, &gb, n, c, s, true, &y));
            snprintf(name, sizeof name, "bn_relu_%s_%lldx%lld_backward", dt, (long long)c,
                     (long long)xs[2]);
            print_row(name, "", x.numel, ms);
            /* SyncBatchNorm's kernels (src/dist/syncbn.c), the collectives left out: the
             * statistics without y, then y from them (eval_rows, else eval, with the
             * variance); the sums, then gx from them, relu'(y) recomputed from x (else read
             * from y: backward without gx, then elemt) */
            na_view var = bench_view(NA_DTYPE_F32, 1, cs);
            if (!var.data) return 1;
            for (int64_t k = 0; k < c; k++) ((float *)var.data)[k] = 1.0f;
            BENCH_MIN_MS(ms, bool rows = false;
                         rc |= na_cpu_batch_norm_train(&x, NULL, NULL, NULL, NULL, NULL,
                                                       &p[4], &p[5], n, c, s, 0, 0, false);
                         rc |= na_cpu_batch_norm_eval_rows(&x, &p[0], &p[1], &p[4], &var, &y, n,
                                                           c, s, 1e-5, true, &rows);
                         if (!rows) rc |= na_cpu_batch_norm_eval(&x, &p[0], &p[1], &p[4], &var,
                                                                 &y, n, c, s, 1e-5, true));
            snprintf(name, sizeof name, "syncbn_relu_%s_%lldx%lld_forward", dt, (long long)c,
                     (long long)xs[2]);
            print_row(name, "", x.numel, ms);
            BENCH_MIN_MS(ms, bool done = false;
                         rc |= na_cpu_batch_norm_relu_backward_x(&x, &gy, &p[0], &p[1], &p[4],
                                                                 &var, 1e-5, &p[5], NULL, NULL,
                                                                 0, NULL, &gg, &gb, n, c, s,
                                                                 &done);
                         if (!done) /* bf16: relu'(y) from y */
                             rc |= na_cpu_batch_norm_backward(&x, &gy, &p[0], &p[4], &p[5],
                                                              NULL, &gg, &gb, n, c, s, false, &y);
                         if (done)
                             rc |= na_cpu_batch_norm_relu_backward_x(
                                 &x, &gy, &p[0], &p[1], &p[4], &var, 1e-5, &p[5], &gb, &gg,
                                 n * s, &gx, NULL, NULL, n, c, s, &done);
                         else rc |= na_cpu_batch_norm_backward_elemt(&x, &gy, &p[0], &p[4],
                                                                     &p[5], &gb, &gg, n * s,
                                                                     &gx, n, c, s, &y));
            snprintf(name, sizeof name, "syncbn_relu_%s_%lldx%lld_backward", dt, (long long)c,
                     (long long)xs[2]);
            print_row(name, "", x.numel, ms);
            { /* the same reading relu'(y) from y, as CUDA does */
                BENCH_MIN_MS(ms, rc |= na_cpu_batch_norm_backward(&x, &gy, &p[0], &p[4], &p[5],
                                                                  NULL, &gg, &gb, n, c, s, false,
                                                                  &y);
                             rc |= na_cpu_batch_norm_backward_elemt(&x, &gy, &p[0], &p[4], &p[5],
                                                                    &gb, &gg, n * s, &gx, n, c,
                                                                    s, &y));
                snprintf(name, sizeof name, "syncbn_relu_%s_%lldx%lld_backward_y", dt,
                         (long long)c, (long long)xs[2]);
                print_row(name, "", x.numel, ms);
            }
            free(var.data);
            free(x.data), free(y.data), free(gy.data), free(gx.data), free(gg.data), free(gb.data);
            for (int k = 0; k < 6; k++) free(p[k].data);
        }
    return rc != 0;
}

static int bench_bn(void) { /* the MNIST CNN, batch 128 */
    static const int64_t shapes[][4] = {{128, 32, 28, 28}, {128, 64, 14, 14}};
    return bench_bn_layers(shapes, 2);
}

static int bench_bn_resnet9(void) { /* ResNet-9's BatchNorm layers (conv-resnet9's outputs) */
    static const int64_t shapes[][4] = {{32, 64, 32, 32},  {32, 128, 32, 32}, {32, 128, 16, 16},
                                        {32, 256, 16, 16}, {32, 512, 8, 8},   {32, 512, 4, 4}};
    return bench_bn_layers(shapes, 6);
}

/* One convolution row: the print_row fields plus the rate and its share of the dtype's peak. */
static void print_conv_row(const char *kernel, const char *variant, na_dtype dt, double gflop,
                           double ms) {
    /* f16 computes in f32 (no f16 arithmetic on the CPUs this targets) */
    bench_peak_kind pk = dt == NA_DTYPE_BF16 ? bench_peak_bf16() : bench_peak_f32();
    double rate = gflop * 1e3 / ms, peak = bench_peak_gflops(pk);
    bench_json j;
    bench_json_begin(&j, stdout);
    bench_json_str(&j, "bench", "kernel");
    bench_json_str(&j, "kernel", kernel);
    bench_json_str(&j, "variant", variant);
    bench_json_str(&j, "dtype", na_dtype_name(dt));
    bench_json_int(&j, "n", (int64_t)rate); /* GFLOP/s, as before */
    bench_json_num(&j, "min_ms", ms);
    bench_json_num(&j, "gflop", gflop);
    bench_json_num(&j, "gflops", rate);
    bench_json_str(&j, "peak", bench_peak_name(pk));
    bench_json_num(&j, "pct_peak", peak > 0 ? 100 * rate / peak : NAN); /* null: no probe */
    bench_json_end(&j);
}

/* the case names' dtype: none for f32 */
static const char *conv_dtype_suffix(na_dtype dt) {
    return dt == NA_DTYPE_F32 ? "" : dt == NA_DTYPE_BF16 ? "_bf16" : "_f16";
}

/* Convolutions 3x3, padding 1: forward, data gradient (not for a first layer: its input needs
 * none) and weight gradient; f32 through the direct convolution (where this CPU has it) and
 * the im2col + GEMM path, then bf16 through the backend's own choice, then f16 (f32 compute).
 * A variant this CPU lacks (no direct convolution, no vdpbf16ps) has no rows and no total.
 * One row per layer: {batch, c_in, c_out, h = w}; then one total row per variant. */
static int bench_conv_layers(const char *net, const int64_t (*layers)[4], int count) {
    static const struct {
        na_dtype dt;
        int gemm; /* na_cpu_conv_force_gemm */
        bool spec; /* na_cpu_bf16_force_spec: bf16 widened to f32 */
    } runs[] = {{NA_DTYPE_F32, 1, false}, {NA_DTYPE_F32, 0, false}, {NA_DTYPE_BF16, 0, true},
                {NA_DTYPE_BF16, 0, false}, {NA_DTYPE_F16, 0, false}};
    enum { NRUNS = sizeof runs / sizeof runs[0] };
    double total_gflop[NRUNS] = {0}, total_ms[NRUNS] = {0};
    const char *variant[NRUNS] = {0};
    int layers_run[NRUNS] = {0};
    int rc = 0;
    for (int l = 0; l < count; l++) {
        const int64_t *L = layers[l];
        na_conv_geom g = {.n = L[0], .c_in = L[1], .h = L[3], .w = L[3], .c_out = L[2],
                          .oh = L[3], .ow = L[3], .kh = 3, .kw = 3, .sh = 1, .sw = 1, .ph = 1,
                          .pw = 1, .dh = 1, .dw = 1, .groups = 1};
        int64_t xs[4] = {L[0], L[1], L[3], L[3]}, ys[4] = {L[0], L[2], L[3], L[3]},
                ws[4] = {L[2], L[1], 3, 3}, bs[1] = {L[2]};
        double gflop = 2.0 * L[0] * L[1] * L[2] * 9 * L[3] * L[3] / 1e9;
        for (int k = 0; k < NRUNS; k++) {
            na_dtype dt = runs[k].dt;
            na_cpu_bf16_force_spec = false;
            if (dt == NA_DTYPE_BF16 && !runs[k].spec && !na_cpu_bf16_fast()) continue;
            /* f32 direct where this CPU has no direct convolution: the im2col row again */
            if (dt == NA_DTYPE_F32 && !runs[k].gemm && !na_cpu_direct_conv_usable(&g, false))
                continue;
            na_view x = bench_view(dt, 4, xs), y = bench_view(dt, 4, ys),
                    w = bench_view(dt, 4, ws), b = bench_view(dt, 1, bs),
                    gx = bench_view(dt, 4, xs), gw = bench_view(dt, 4, ws);
            if (!x.data || !y.data || !w.data || !b.data || !gx.data || !gw.data) return 1;
            bench_fill(&x), bench_fill(&w), bench_fill(&b), bench_fill(&y);
            na_cpu_conv_force_gemm = runs[k].gemm;
            na_cpu_bf16_force_spec = runs[k].spec;
            /* bf16: widened to f32 (the specification), then on vdpbf16ps where the CPU has it */
            const char *v = runs[k].gemm ? "im2col_gemm"
                            : dt == NA_DTYPE_BF16 ? (runs[k].spec ? "bf16_widening" : "bf16_dpbf16")
                            : !na_cpu_direct_conv_usable(&g, false) ? "im2col_gemm"
                            : na_cpu_direct_avx2() ? "direct_avx2" : "direct_avx512";
            variant[k] = v, layers_run[k]++;
            char name[96];
            const char *dts = conv_dtype_suffix(dt);
            double ms;
            BENCH_MIN_MS(ms, rc |= na_cpu_conv2d(&g, &x, &w, &b, &y));
            snprintf(name, sizeof name, "%s_conv%d_%lldx%lld%s_forward", net, l + 1,
                     (long long)L[1], (long long)L[2], dts);
            print_conv_row(name, v, dt, gflop, ms);
            total_gflop[k] += gflop, total_ms[k] += ms;
            if (L[1] > 3) {
                BENCH_MIN_MS(ms, rc |= na_cpu_conv2d_backward_data(&g, &y, &w, &gx));
                snprintf(name, sizeof name, "%s_conv%d_%lldx%lld%s_backward_data", net, l + 1,
                         (long long)L[1], (long long)L[2], dts);
                print_conv_row(name, v, dt, gflop, ms);
                total_gflop[k] += gflop, total_ms[k] += ms;
            }
            BENCH_MIN_MS(ms, rc |= na_cpu_conv2d_backward_weight(&g, &x, &y, &gw));
            snprintf(name, sizeof name, "%s_conv%d_%lldx%lld%s_backward_weight", net, l + 1,
                     (long long)L[1], (long long)L[2], dts);
            print_conv_row(name, v, dt, gflop, ms);
            total_gflop[k] += gflop, total_ms[k] += ms;
            na_cpu_conv_force_gemm = false, na_cpu_bf16_force_spec = false;
            free(x.data), free(y.data), free(w.data), free(b.data), free(gx.data), free(gw.data);
        }
    }
    for (int k = 0; k < NRUNS; k++) { /* each layer once, as ResNet-9 has its layers */
        if (layers_run[k] < count) continue; /* (no vdpbf16ps or direct convolution here) */
        char name[64];
        snprintf(name, sizeof name, "%s_conv_total%s", net, conv_dtype_suffix(runs[k].dt));
        print_conv_row(name, variant[k], runs[k].dt, total_gflop[k], total_ms[k]);
    }
    return rc != 0;
}

static int bench_peak(void) {
    for (int k = 0; k < BENCH_PEAK_COUNT; k++) {
        bench_json j;
        bench_json_begin(&j, stdout);
        bench_json_str(&j, "bench", "peak");
        bench_json_str(&j, "kernel", bench_peak_name((bench_peak_kind)k));
        bench_json_int(&j, "threads", na_get_num_threads());
        bench_json_num(&j, "gflops", bench_peak_gflops((bench_peak_kind)k)); /* 0: no such unit */
        bench_json_end(&j);
    }
    return 0;
}

static int bench_conv(void) { /* the MNIST CNN, batch 128 */
    static const int64_t layers[][4] = {{128, 1, 32, 28}, {128, 32, 64, 14}};
    return bench_conv_layers("cnn", layers, 2);
}

static int bench_conv_resnet9(void) { /* ResNet-9's distinct 3x3 layers, batch 32 */
    static const int64_t layers[][4] = {{32, 3, 64, 32},   {32, 64, 128, 32}, {32, 128, 128, 16},
                                        {32, 128, 256, 16}, {32, 256, 512, 8}, {32, 512, 512, 4}};
    return bench_conv_layers("resnet9", layers, 6);
}

/* One row per product {m, n, k, ta, tb}, each in f32, bf16 widening and bf16 vdpbf16ps. */
static int bench_gemm(void) {
    static const int64_t shapes[][5] = {{128, 256, 784, 0, 1}, {128, 10, 256, 0, 1},
                                        {10, 256, 128, 1, 0},  {256, 784, 128, 1, 0},
                                        {128, 256, 10, 0, 0},  {512, 512, 512, 0, 0}};
    int rc = 0;
    for (int s = 0; s < 6; s++) {
        const int64_t *S = shapes[s];
        int64_t m = S[0], n = S[1], k = S[2], as[2] = {m, k}, bs[2] = {k, n}, cs[2] = {m, n};
        double gflop = 2.0 * m * n * k / 1e9;
        char name[64];
        snprintf(name, sizeof name, "gemm_%lldx%lldx%lld%s%s", (long long)m, (long long)n,
                 (long long)k, S[3] ? "_ta" : "", S[4] ? "_tb" : "");
        for (int v = 0; v < 4; v++) { /* f32, bf16 widening, bf16 vdpbf16ps, f16 */
            na_dtype dt = v == 0 ? NA_DTYPE_F32 : v < 3 ? NA_DTYPE_BF16 : NA_DTYPE_F16;
            if (v == 2 && !(na_cpu_bf16_force_spec = false, na_cpu_bf16_fast())) continue;
            na_cpu_bf16_force_spec = v == 1;
            na_view a = bench_view(dt, 2, as), b = bench_view(dt, 2, bs), c = bench_view(dt, 2, cs);
            if (!a.data || !b.data || !c.data) return 1;
            bench_fill(&a), bench_fill(&b);
            na_gemm_args g = {.dtype = dt, .a = a.data, .b = b.data, .c = c.data, .ta = S[3],
                              .tb = S[4], .m = m, .n = n, .k = k, .lda = S[3] ? m : k,
                              .ldb = S[4] ? k : n, .ldc = n, .batch = 1, .alpha = 1, .beta = 0};
            double ms;
            BENCH_MIN_MS(ms, rc |= na_cpu_gemm(&g));
            static const char *const names[] = {"f32", "bf16_widening", "bf16_dpbf16",
                                                "f16_widening"};
            print_row(name, names[v], (int64_t)(gflop * 1e3 / ms), ms);
            free(a.data), free(b.data), free(c.data);
        }
        na_cpu_bf16_force_spec = false;
    }
    return rc != 0;
}

static const struct {
    const char *name;
    int (*run)(void);
} cases[] = {
    {"conv", bench_conv},
    {"conv-resnet9", bench_conv_resnet9},
    {"gemm", bench_gemm},
    {"convert", bench_convert},
    {"maxpool", bench_maxpool},
    {"relu", bench_relu},
    {"bn", bench_bn},
    {"bn-resnet9", bench_bn_resnet9},
    {"peak", bench_peak},
};

int main(int argc, char **argv) {
    enum { NCASES = sizeof cases / sizeof cases[0] };
    bool chosen[NCASES] = {false}, any = false;
    /* every argument is checked before anything runs: a mistake costs no benchmark time */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: na-kbench [--repeats N] [--cpu-clock] [case...]\n"
                   "CPU kernel micro-benchmarks: the minimum over N timed calls (default 20), "
                   "in ms; --cpu-clock times CPU time instead of wall time\ncases (default: "
                   "all):");
            for (size_t c = 0; c < NCASES; c++) printf(" %s", cases[c].name);
            printf("\n");
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("na-kbench (nanoamp %s)\n", NANOAMP_VERSION);
            return 0;
        }
        if (!strcmp(argv[i], "--repeats")) {
            repeats = (int)bench_arg_i64(argc, argv, &i, 1);
            continue;
        }
        if (!strcmp(argv[i], "--cpu-clock")) {
            cpu_clock = true;
            continue;
        }
        size_t k = 0;
        while (k < NCASES && strcmp(cases[k].name, argv[i])) k++;
        if (k == NCASES) {
            fprintf(stderr, "na-kbench: unknown case '%s' (cases:", argv[i]);
            for (size_t c = 0; c < NCASES; c++) fprintf(stderr, " %s", cases[c].name);
            fprintf(stderr, ")\n");
            return 2;
        }
        chosen[k] = any = true;
    }
    int rc = 0;
    for (size_t k = 0; k < NCASES; k++)
        if (chosen[k] || !any) rc |= cases[k].run();
    return rc;
}
