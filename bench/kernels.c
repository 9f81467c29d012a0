/* na-kbench — CPU kernel micro-benchmarks, for before/after numbers of one kernel at a time
 * (the training step is na-bench's job). Each case prints the minimum over --repeats timed
 * calls, in milliseconds, which is the figure least disturbed by other work on the machine.
 *
 *   na-kbench [--repeats N] [--cpu-clock] [case...]
 *             cases: conv, conv-resnet9, convert, maxpool, relu, bn (default: all), run in this
 *             order; every argument is checked first. --cpu-clock times CPU time (all
 *             threads) instead of wall time: with NANOAMP_THREADS=1 it compares kernels on a
 *             machine that is busy with other work.
 *
 * conv:    the MNIST CNN's two convolutions (batch 128), forward and gradients, f32, through
 *          the direct AVX-512 convolution and the im2col + GEMM path (cpu_direct_conv.c,
 *          cpu_conv.c), then bf16 (rows ending _bf16) widened to f32 and, with AVX512_BF16,
 *          multiplied as bf16; "n" is the rate in GFLOP/s. conv-resnet9: the same for
 *          ResNet-9's six distinct 3x3 layers at batch 32.
 * convert: f32 <-> f16 / bf16 of 4.8M elements (one CNN activation set), through the
 *          portable half.h loops and through the CPU's instructions (cpu_convert.c).
 * maxpool: the MNIST CNN's two 2x2 max pools (batch 128), forward with indices, f32 and f16,
 *          through the generic window loop and the 2x2 path (cpu_conv.c).
 * relu:    ReLU forward and backward over the CNN's first activation (128x32x28x28), f32 and
 *          f16 (the unary kernels of cpu_elementwise.c).
 * bn:      the MNIST CNN's two BatchNorm+ReLU layers (batch 128), training forward and
 *          backward, f32, f16 and bf16 activations with f32 parameters (cpu_batchnorm.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cpu/cpu_internal.h"

static int repeats = 20;
static bool cpu_clock; /* --cpu-clock: the process's CPU time instead of wall time */

static double now_s(void) {
    if (!cpu_clock) return bench_now_s();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
    for (int soft = 1; soft >= 0; soft--) {
        na_cpu_convert_force_soft = soft;
        const char *v = soft ? "portable" : (na_cpu_convert_is_fast() ? "f16c_avx2" : "portable");
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
    na_cpu_convert_force_soft = false;
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
    const na_dtype dts[2] = {NA_DTYPE_F32, NA_DTYPE_F16};
    int rc = 0;
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 2; t++) {
            const int64_t *xs = shapes[s];
            int64_t ys[4] = {xs[0], xs[1], xs[2] / 2, xs[3] / 2};
            na_conv_geom g = {.n = xs[0], .c_in = xs[1], .h = xs[2], .w = xs[3], .c_out = xs[1],
                              .oh = ys[2], .ow = ys[3], .kh = 2, .kw = 2, .sh = 2, .sw = 2,
                              .dh = 1, .dw = 1, .groups = 1};
            na_view x = bench_view(dts[t], 4, xs), y = bench_view(dts[t], 4, ys),
                    idx = bench_view(NA_DTYPE_I32, 4, ys);
            if (!x.data || !y.data || !idx.data) return 1;
            bench_fill(&x);
            char name[64];
            snprintf(name, sizeof name, "max_pool2d_%s_%lldx%lld",
                     dts[t] == NA_DTYPE_F32 ? "f32" : "f16", (long long)xs[2], (long long)xs[3]);
            for (int generic = 1; generic >= 0; generic--) {
                na_cpu_pool_force_generic = generic;
                const char *v = generic ? "generic" : "2x2";
                double ms;
                BENCH_MIN_MS(ms, rc |= na_cpu_max_pool2d(&g, &x, &y, &idx));
                print_row(name, v, x.numel, ms);
            }
            na_cpu_pool_force_generic = false;
            free(x.data), free(y.data), free(idx.data);
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

static int bench_bn(void) {
    const int64_t shapes[2][4] = {{128, 32, 28, 28}, {128, 64, 14, 14}};
    const na_dtype dts[3] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    int rc = 0;
    for (int l = 0; l < 2; l++)
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
            free(x.data), free(y.data), free(gy.data), free(gx.data), free(gg.data), free(gb.data);
            for (int k = 0; k < 6; k++) free(p[k].data);
        }
    return rc != 0;
}

/* One layer's forward, data gradient (not for a first layer: its input needs none) and
 * weight gradient, the tensors of dtype dt, as the hooks set now; rows named
 * <net>_conv<l>_<cin>x<cout>_<pass><suffix>, "n" the rate in GFLOP/s. */
static int bench_conv_passes(const char *net, int l, const int64_t *L, na_dtype dt,
                             const char *suffix, const char *variant) {
    na_conv_geom g = {.n = L[0], .c_in = L[1], .h = L[3], .w = L[3], .c_out = L[2],
                      .oh = L[3], .ow = L[3], .kh = 3, .kw = 3, .sh = 1, .sw = 1, .ph = 1,
                      .pw = 1, .dh = 1, .dw = 1, .groups = 1};
    int64_t xs[4] = {L[0], L[1], L[3], L[3]}, ys[4] = {L[0], L[2], L[3], L[3]},
            ws[4] = {L[2], L[1], 3, 3}, bs[1] = {L[2]};
    na_view x = bench_view(dt, 4, xs), y = bench_view(dt, 4, ys), w = bench_view(dt, 4, ws),
            b = bench_view(dt, 1, bs), gx = bench_view(dt, 4, xs), gw = bench_view(dt, 4, ws);
    int rc = !x.data || !y.data || !w.data || !b.data || !gx.data || !gw.data;
    if (!rc) {
        bench_fill(&x), bench_fill(&w), bench_fill(&b), bench_fill(&y);
        double gflop = 2.0 * L[0] * L[1] * L[2] * 9 * L[3] * L[3] / 1e9, ms;
        char name[96];
                BENCH_MIN_MS(ms, rc |= na_cpu_conv2d(&g, &x, &w, &b, &y));
        snprintf(name, sizeof name, "%s_conv%d_%lldx%lld_forward%s", net, l + 1,
                 (long long)L[1], (long long)L[2], suffix);
        print_row(name, variant, (int64_t)(gflop * 1e3 / ms), ms);
        if (L[1] > 3) {
            BENCH_MIN_MS(ms, rc |= na_cpu_conv2d_backward_data(&g, &y, &w, &gx));
            snprintf(name, sizeof name, "%s_conv%d_%lldx%lld_backward_data%s", net, l + 1,
                     (long long)L[1], (long long)L[2], suffix);
            print_row(name, variant, (int64_t)(gflop * 1e3 / ms), ms);
        }
        BENCH_MIN_MS(ms, rc |= na_cpu_conv2d_backward_weight(&g, &x, &y, &gw));
        snprintf(name, sizeof name, "%s_conv%d_%lldx%lld_backward_weight%s", net, l + 1,
                 (long long)L[1], (long long)L[2], suffix);
        print_row(name, variant, (int64_t)(gflop * 1e3 / ms), ms);
    }
    free(x.data), free(y.data), free(w.data), free(b.data), free(gx.data), free(gw.data);
    return rc;
}

/* Convolutions 3x3, padding 1: f32 through the direct convolution (where this CPU has it) and
 * the im2col + GEMM path; then bf16 tensors (rows ending _bf16) widened to f32 (the
 * specification) and, where the CPU has AVX512_BF16, multiplied as bf16 (vdpbf16ps). One row
 * per layer: {batch, c_in, c_out, h = w}. */
static int bench_conv_layers(const char *net, const int64_t (*layers)[4], int count) {
    int rc = 0;
    for (int l = 0; l < count; l++) {
        const int64_t *L = layers[l];
        na_conv_geom g = {.n = L[0], .c_in = L[1], .h = L[3], .w = L[3], .c_out = L[2],
                          .oh = L[3], .ow = L[3], .kh = 3, .kw = 3, .sh = 1, .sw = 1, .ph = 1,
                          .pw = 1, .dh = 1, .dw = 1, .groups = 1};
        bool direct = na_cpu_direct_conv_usable(&g, false);
        for (int gemm = 1; gemm >= 0; gemm--) {
            na_cpu_conv_force_gemm = gemm;
            rc |= bench_conv_passes(net, l, L, NA_DTYPE_F32, "",
                                    gemm || !direct ? "im2col_gemm" : "direct_avx512");
        }
        na_cpu_conv_force_gemm = false;
        for (int dot = 0; dot <= (int)na_cpu_bf16_dot(); dot++) {
            bool keep = na_cpu_bf16_force_spec;
            na_cpu_bf16_force_spec = !dot;
            rc |= bench_conv_passes(net, l, L, NA_DTYPE_BF16, "_bf16",
                                    dot ? "direct_avx512_bf16"
                                        : direct ? "direct_avx512_widen" : "im2col_gemm_widen");
            na_cpu_bf16_force_spec = keep;
        }
    }
    return rc != 0;
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

static const struct {
    const char *name;
    int (*run)(void);
} cases[] = {
    {"conv", bench_conv},
    {"conv-resnet9", bench_conv_resnet9},
    {"convert", bench_convert},
    {"maxpool", bench_maxpool},
    {"relu", bench_relu},
    {"bn", bench_bn},
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
