/* tests/test_conv_graph.c — the host logic of the cuDNN graph convolutions
 * (kernels/cuda/conv_graph_host.c), on the CPU: problems described from views (NCHW and
 * channels-last strides, groups, bias), their errors, pointer alignment, the engine filter,
 * the choice of the fastest timed plan, the bounded plan cache, the conv + GenStats kind
 * (conv2d_stats: its sums and the rules that keep cuDNN from being asked what it documents no
 * engine for), and the layout check that both cuDNN paths (and the im2col fallback) start
 * from (na_conv_layout_of). The cuDNN calls themselves need a GPU: scripts/gpu-switch-check
 * runs the parity suites with NANOAMP_CUDNN_GRAPH=1 and NANOAMP_CONV_BN_STATS=1.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/conv_graph.h"
#include "nanoamp/error.h"

static _Alignas(64) unsigned char buf[256];

/* A 4-d view over buf (+ `at` bytes) with the given shape and strides (NULL: contiguous). */
static na_view view4(na_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d,
                     const int64_t *strides, size_t at) {
    na_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dt;
    v.device = NA_DEVICE_CUDA;
    v.ndim = 4;
    v.shape[0] = a, v.shape[1] = b, v.shape[2] = c, v.shape[3] = d;
    if (strides)
        for (int i = 0; i < 4; i++) v.stride[i] = strides[i];
    else
        v.stride[3] = 1, v.stride[2] = d, v.stride[1] = c * d, v.stride[0] = b * c * d;
    v.numel = a * b * c * d;
    v.data = buf + at;
    return v;
}

/* n=2, c_in=4 -> c_out=6, 5x7 input, 3x3 kernel, stride 2, pad 1, dilation 1, groups 2:
 * output 3x4 */
static na_conv_geom geom(void) {
    na_conv_geom g;
    memset(&g, 0, sizeof g);
    g.n = 2, g.c_in = 4, g.h = 5, g.w = 7, g.c_out = 6, g.oh = 3, g.ow = 4;
    g.kh = 3, g.kw = 3, g.sh = 2, g.sw = 2, g.ph = 1, g.pw = 1, g.dh = 1, g.dw = 1, g.groups = 2;
    return g;
}

/* x, w, y: contiguous views of geom()'s tensors */
#define GEOM_VIEWS(dt)                                                                     \
    na_view x = view4(dt, 2, 4, 5, 7, NULL, 0), w = view4(dt, 6, 2, 3, 3, NULL, 0),        \
            y = view4(dt, 2, 6, 3, 4, NULL, 0)

/* na_cg_problem_init with TF32, determinism and autotuning off */
static int plain_init(na_cg_problem *p, na_cg_kind kind, const na_conv_geom *g, const na_view *x,
                      const na_view *w, const na_view *y, const na_view *bias, const char *who) {
    return na_cg_problem_init(p, kind, g, x, w, y, bias, NULL, NULL, false, false, false, who);
}

static void expect_tensor(const na_cg_tensor *t, const int64_t dim[4], const int64_t str[4]) {
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(t->dim[i], dim[i], "dim %d: %lld, want %lld", i, (long long)t->dim[i],
                     (long long)dim[i]);
        cr_expect_eq(t->stride[i], str[i], "stride %d: %lld, want %lld", i,
                     (long long)t->stride[i], (long long)str[i]);
    }
}

Test(conv_graph, nchw_problem_takes_the_geometry_and_the_strides) {
    na_conv_geom g = geom();
    GEOM_VIEWS(NA_DTYPE_F16);
    na_cg_problem p;
    cr_assert_eq(na_cg_problem_init(&p, NA_CG_FWD, &g, &x, &w, &y, NULL, NULL, NULL, false, true,
                                    false, "t"),
                 NA_OK, "%s", na_last_error());
    expect_tensor(&p.t[NA_CG_X], (int64_t[]){2, 4, 5, 7}, (int64_t[]){140, 35, 7, 1});
    expect_tensor(&p.t[NA_CG_W], (int64_t[]){6, 2, 3, 3}, (int64_t[]){18, 9, 3, 1});
    expect_tensor(&p.t[NA_CG_Y], (int64_t[]){2, 6, 3, 4}, (int64_t[]){72, 12, 4, 1});
    cr_expect_eq(p.kind, NA_CG_FWD);
    cr_expect_eq(p.dtype, NA_DTYPE_F16);
    cr_expect_eq(p.deterministic, 1);
    cr_expect_eq(p.stride[0], 2);
    cr_expect_eq(p.pad[1], 1);
    cr_expect_eq(p.dilation[0], 1);
    cr_expect_eq(p.t[NA_CG_BIAS].dim[1], 0, "no bias outside the fused kind");
}

Test(conv_graph, channels_last_strides_pass_through_and_make_another_key) {
    na_conv_geom g = geom();
    /* channels-last: [N, C, H, W] with strides H*W*C, 1, W*C, C */
    na_view xl = view4(NA_DTYPE_BF16, 2, 4, 5, 7, (int64_t[]){140, 1, 28, 4}, 0);
    na_view wl = view4(NA_DTYPE_BF16, 6, 2, 3, 3, (int64_t[]){18, 1, 6, 2}, 0);
    na_view yl = view4(NA_DTYPE_BF16, 2, 6, 3, 4, (int64_t[]){72, 1, 24, 6}, 0);
    na_cg_problem nhwc, nchw;
    cr_assert_eq(plain_init(&nhwc, NA_CG_BWD_DATA, &g, &xl, &wl, &yl, NULL, "t"), NA_OK, "%s",
                 na_last_error());
    expect_tensor(&nhwc.t[NA_CG_X], (int64_t[]){2, 4, 5, 7}, (int64_t[]){140, 1, 28, 4});
    expect_tensor(&nhwc.t[NA_CG_W], (int64_t[]){6, 2, 3, 3}, (int64_t[]){18, 1, 6, 2});
    expect_tensor(&nhwc.t[NA_CG_Y], (int64_t[]){2, 6, 3, 4}, (int64_t[]){72, 1, 24, 6});
    GEOM_VIEWS(NA_DTYPE_BF16);
    cr_assert_eq(plain_init(&nchw, NA_CG_BWD_DATA, &g, &x, &w, &y, NULL, "t"), NA_OK, "%s",
                 na_last_error());
    cr_expect_neq(memcmp(&nhwc, &nchw, sizeof nhwc), 0, "layouts must not share a plan");
}

Test(conv_graph, unset_stride_and_dilation_mean_1_and_groups_0_means_1) {
    na_conv_geom g = geom();
    g.sh = g.sw = g.dh = g.dw = 0, g.groups = 0, g.c_out = 4, g.oh = 5, g.ow = 7;
    na_view x = view4(NA_DTYPE_F32, 2, 4, 5, 7, NULL, 0);
    na_view w = view4(NA_DTYPE_F32, 4, 4, 3, 3, NULL, 0);
    na_view y = view4(NA_DTYPE_F32, 2, 4, 5, 7, NULL, 0);
    na_cg_problem p;
    cr_assert_eq(na_cg_problem_init(&p, NA_CG_BWD_FILTER, &g, &x, &w, &y, NULL, NULL, NULL, true,
                                    false, true, "t"), NA_OK, "%s", na_last_error());
    cr_expect(p.stride[0] == 1 && p.stride[1] == 1 && p.dilation[0] == 1 && p.dilation[1] == 1);
    cr_expect_eq(p.t[NA_CG_W].dim[1], 4, "one group: the filter sees every input channel");
    cr_expect_eq(p.tf32, 1, "f32 keeps the TF32 setting");
    cr_expect_eq(p.autotune, 1);
}

Test(conv_graph, tf32_is_part_of_the_key_for_f32_only) {
    na_conv_geom g = geom();
    na_cg_problem a, b;
    for (int half = 0; half < 2; half++) {
        na_dtype dt = half ? NA_DTYPE_F16 : NA_DTYPE_F32;
        na_view x = view4(dt, 2, 4, 5, 7, NULL, 0), w = view4(dt, 6, 2, 3, 3, NULL, 0);
        na_view y = view4(dt, 2, 6, 3, 4, NULL, 0);
        cr_assert_eq(plain_init(&a, NA_CG_FWD, &g, &x, &w, &y, NULL, "t"), NA_OK);
        cr_assert_eq(
            na_cg_problem_init(&b, NA_CG_FWD, &g, &x, &w, &y, NULL, NULL, NULL, true, false, false,
                               "t"),
            NA_OK);
        if (half)
            cr_expect_eq(memcmp(&a, &b, sizeof a), 0, "f16 has no TF32: one plan serves both");
        else
            cr_expect_neq(memcmp(&a, &b, sizeof a), 0, "f32 strict and TF32 are two plans");
    }
}

Test(conv_graph, misaligned_data_is_another_problem) {
    na_conv_geom g = geom();
    GEOM_VIEWS(NA_DTYPE_F16);
    na_cg_problem a, b;
    cr_assert_eq(plain_init(&a, NA_CG_FWD, &g, &x, &w, &y, NULL, "t"), NA_OK);
    x.data = buf + 2;
    cr_assert_eq(plain_init(&b, NA_CG_FWD, &g, &x, &w, &y, NULL, "t"), NA_OK);
    cr_expect_eq(a.t[NA_CG_X].align, 16);
    cr_expect_eq(b.t[NA_CG_X].align, 2);
    cr_expect_neq(memcmp(&a, &b, sizeof a), 0);
}

Test(conv_graph, alignment_of_addresses) {
    cr_expect_eq(na_cg_alignment(buf), 16);
    cr_expect_eq(na_cg_alignment(buf + 2), 2);
    cr_expect_eq(na_cg_alignment(buf + 4), 4);
    cr_expect_eq(na_cg_alignment(buf + 8), 8);
    cr_expect_eq(na_cg_alignment(buf + 24), 8);
    cr_expect_eq(na_cg_alignment(buf + 48), 16);
    cr_expect_eq(na_cg_alignment(buf + 1), 2, "below 2 bytes is reported as 2 (f16's size)");
    cr_expect_eq(na_cg_alignment(NULL), 16);
}

Test(conv_graph, bias_of_k_or_1k11_is_described_as_1k11) {
    na_conv_geom g = geom();
    GEOM_VIEWS(NA_DTYPE_F16);
    na_view b1 = view4(NA_DTYPE_F16, 1, 6, 1, 1, NULL, 32);
    na_view b0 = b1;
    b0.ndim = 1, b0.shape[0] = 6, b0.stride[0] = 1;
    na_cg_problem p0, p1;
    cr_assert_eq(plain_init(&p0, NA_CG_FWD_BIAS_RELU, &g, &x, &w, &y, &b0, "t"),
                 NA_OK, "%s", na_last_error());
    cr_assert_eq(plain_init(&p1, NA_CG_FWD_BIAS_RELU, &g, &x, &w, &y, &b1, "t"),
                 NA_OK, "%s", na_last_error());
    expect_tensor(&p0.t[NA_CG_BIAS], (int64_t[]){1, 6, 1, 1}, (int64_t[]){6, 1, 1, 1});
    cr_expect_eq(memcmp(&p0, &p1, sizeof p0), 0);
    /* with a channels-last y the bias's unit dims follow that layout */
    na_view yl = view4(NA_DTYPE_F16, 2, 6, 3, 4, (int64_t[]){72, 1, 24, 6}, 0);
    cr_assert_eq(plain_init(&p1, NA_CG_FWD_BIAS_RELU, &g, &x, &w, &yl, &b1, "t"),
                 NA_OK, "%s", na_last_error());
    expect_tensor(&p1.t[NA_CG_BIAS], (int64_t[]){1, 6, 1, 1}, (int64_t[]){6, 1, 6, 6});
    b0.shape[0] = 5;
    cr_expect_eq(plain_init(&p0, NA_CG_FWD_BIAS_RELU, &g, &x, &w, &y, &b0, "t"), NA_ESHAPE);
    cr_expect(strstr(na_last_error(), "[6] or [1, 6, 1, 1]"), "%s", na_last_error());
    cr_expect_eq(plain_init(&p0, NA_CG_FWD_BIAS_RELU, &g, &x, &w, &y, NULL, "t"), NA_EINVAL);
}

/* ---- conv + GenStats (conv2d_stats): the sums, their checks and the not-served rules ---- */

/* an f32 [n] view over buf (+ `at` bytes) with stride `st` */
static na_view view1(na_dtype dt, int64_t n, int64_t st, size_t at) {
    na_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dt;
    v.device = NA_DEVICE_CUDA;
    v.ndim = 1;
    v.shape[0] = n, v.stride[0] = st, v.numel = n;
    v.data = buf + at;
    return v;
}

/* geom()'s x, w, y channels-last (w KRSC) in dtype dt */
#define GEOM_VIEWS_NHWC(dt)                                                                \
    na_view xl = view4(dt, 2, 4, 5, 7, (int64_t[]){140, 1, 28, 4}, 0),                    \
            wl = view4(dt, 6, 2, 3, 3, (int64_t[]){18, 1, 6, 2}, 0),                      \
            yl = view4(dt, 2, 6, 3, 4, (int64_t[]){72, 1, 24, 6}, 0)

static int stats_init(na_cg_problem *p, const na_view *x, const na_view *w, const na_view *y,
                      const na_view *sum, const na_view *sqsum) {
    na_conv_geom g = geom();
    return na_cg_problem_init(p, NA_CG_FWD_STATS, &g, x, w, y, NULL, sum, sqsum, false, false,
                              false, "conv2d_stats");
}

Test(conv_graph, stats_problem_has_the_sums_in_ys_layout_and_its_own_key) {
    GEOM_VIEWS_NHWC(NA_DTYPE_F16);
    na_view sum = view1(NA_DTYPE_F32, 6, 1, 64), sq = view1(NA_DTYPE_F32, 6, 1, 128);
    na_cg_problem p, plain;
    cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum, &sq), NA_OK, "%s", na_last_error());
    cr_expect_eq(p.kind, NA_CG_FWD_STATS);
    expect_tensor(&p.t[NA_CG_SUM], (int64_t[]){1, 6, 1, 1}, (int64_t[]){6, 1, 6, 6});
    expect_tensor(&p.t[NA_CG_SQSUM], (int64_t[]){1, 6, 1, 1}, (int64_t[]){6, 1, 6, 6});
    cr_expect_eq(p.t[NA_CG_BIAS].dim[1], 0, "no bias in the stats kind");
    na_conv_geom g = geom();
    cr_assert_eq(plain_init(&plain, NA_CG_FWD, &g, &xl, &wl, &yl, NULL, "t"), NA_OK);
    cr_expect_eq(plain.t[NA_CG_SUM].dim[1], 0, "no sums outside the stats kind");
    cr_expect_neq(memcmp(&p, &plain, sizeof p), 0, "conv + GenStats: not the plain forward's plan");
    /* [1, K, 1, 1] sums and an NCHW y: the unit dims take NCHW's strides */
    GEOM_VIEWS(NA_DTYPE_F32);
    na_view sum4 = view4(NA_DTYPE_F32, 1, 6, 1, 1, NULL, 64);
    cr_assert_eq(stats_init(&p, &x, &w, &y, &sum4, &sq), NA_OK, "%s", na_last_error());
    expect_tensor(&p.t[NA_CG_SUM], (int64_t[]){1, 6, 1, 1}, (int64_t[]){6, 1, 1, 1});
}

Test(conv_graph, stats_problem_refuses_bad_sums_with_a_message) {
    GEOM_VIEWS_NHWC(NA_DTYPE_F16);
    na_view sum = view1(NA_DTYPE_F32, 6, 1, 64), sq = view1(NA_DTYPE_F32, 6, 1, 128);
    na_view bad = view1(NA_DTYPE_F32, 5, 1, 64);
    na_cg_problem p;
    cr_expect_eq(stats_init(&p, &xl, &wl, &yl, &bad, &sq), NA_ESHAPE);
    cr_expect(strstr(na_last_error(), "conv2d_stats") &&
              strstr(na_last_error(), "sum must be [6] or [1, 6, 1, 1]"), "%s", na_last_error());
    cr_expect_eq(p.kind, 0, "a refused problem is left zeroed");
    bad = view1(NA_DTYPE_F16, 6, 1, 128);
    cr_expect_eq(stats_init(&p, &xl, &wl, &yl, &sum, &bad), NA_EDTYPE);
    cr_expect(strstr(na_last_error(), "sqsum is f16, the sums are f32"), "%s", na_last_error());
    bad = view4(NA_DTYPE_F32, 1, 6, 2, 1, NULL, 64);
    cr_expect_eq(stats_init(&p, &xl, &wl, &yl, &sum, &bad), NA_ESHAPE, "[1, 6, 2, 1] is no vector");
    cr_expect_eq(stats_init(&p, &xl, &wl, &yl, NULL, &sq), NA_EINVAL);
    cr_expect(strstr(na_last_error(), "no sum"), "%s", na_last_error());
}

Test(conv_graph, stats_rules_turn_away_what_cudnn_documents_no_engine_for) {
    na_view sum = view1(NA_DTYPE_F32, 6, 1, 64), sq = view1(NA_DTYPE_F32, 6, 1, 128);
    na_cg_problem p;
    {
        GEOM_VIEWS_NHWC(NA_DTYPE_F16);
        cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum, &sq), NA_OK, "%s", na_last_error());
        cr_expect_null(na_cg_stats_rejects(&p, 9), "f16 channels-last: ConvBNfprop's pattern");
        cr_expect_null(na_cg_stats_rejects(&p, 7), "f16 GenStats predates Ampere");
        xl.data = buf + 8; /* 8-byte aligned */
        cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum, &sq), NA_OK);
        const char *why = na_cg_stats_rejects(&p, 9);
        cr_expect(why && strstr(why, "16-byte"), "%s", why ? why : "(null)");
        na_view sum2 = view1(NA_DTYPE_F32, 6, 2, 64);
        xl.data = buf;
        cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum2, &sq), NA_OK);
        why = na_cg_stats_rejects(&p, 9);
        cr_expect(why && strstr(why, "packed sums"), "%s", why ? why : "(null)");
    }
    {
        GEOM_VIEWS_NHWC(NA_DTYPE_F32);
        xl.data = buf + 8;
        cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum, &sq), NA_OK);
        cr_expect_null(na_cg_stats_rejects(&p, 8), "f32 from Ampere on (no alignment rule)");
        const char *why = na_cg_stats_rejects(&p, 7);
        cr_expect(why && strstr(why, "8.0"), "%s", why ? why : "(null)");
    }
    {
        GEOM_VIEWS_NHWC(NA_DTYPE_BF16);
        cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum, &sq), NA_OK);
        const char *why = na_cg_stats_rejects(&p, 9);
        cr_expect(why && strstr(why, "f16 or f32"), "%s", why ? why : "(null)");
    }
    {
        GEOM_VIEWS(NA_DTYPE_F16); /* NCHW */
        cr_assert_eq(stats_init(&p, &x, &w, &y, &sum, &sq), NA_OK);
        const char *why = na_cg_stats_rejects(&p, 9);
        cr_expect(why && strstr(why, "NHWC"), "%s", why ? why : "(null)");
        GEOM_VIEWS_NHWC(NA_DTYPE_F16);
        cr_assert_eq(stats_init(&p, &xl, &w, &yl, &sum, &sq), NA_OK); /* a KCRS filter */
        cr_expect_not_null(na_cg_stats_rejects(&p, 9), "w must be KRSC as well");
        cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum, &sq), NA_OK);
        cr_expect_null(na_cg_stats_rejects(&p, 9));
        na_conv_geom g = geom();
        cr_assert_eq(plain_init(&p, NA_CG_FWD, &g, &x, &w, &y, NULL, "t"), NA_OK);
        cr_expect_null(na_cg_stats_rejects(&p, 9), "the rules are the stats kind's only");
    }
}

Test(conv_graph, stats_problem_string_names_the_kind_and_the_sums) {
    GEOM_VIEWS_NHWC(NA_DTYPE_F16);
    na_view sum = view1(NA_DTYPE_F32, 6, 1, 64), sq = view1(NA_DTYPE_F32, 6, 1, 128);
    na_cg_problem p;
    cr_assert_eq(stats_init(&p, &xl, &wl, &yl, &sum, &sq), NA_OK);
    char s[640];
    na_cg_problem_str(&p, s, sizeof s);
    cr_expect(strstr(s, "forward+stats f16 x [2, 4, 5, 7]"), "%s", s);
    cr_expect(strstr(s, " sum [1, 6, 1, 1] str [6, 1, 6, 6] sqsum [1, 6, 1, 1]"), "%s", s);
    cr_expect(strstr(s, "stride 2x2 pad 1x1 dil 1x1") && !strstr(s, "bias"), "%s", s);
    na_conv_geom g = geom();
    cr_assert_eq(plain_init(&p, NA_CG_FWD, &g, &xl, &wl, &yl, NULL, "t"), NA_OK);
    na_cg_problem_str(&p, s, sizeof s);
    cr_expect(!strstr(s, "sum") && strstr(s, "stride 2x2"), "the plain forward has no sums: %s", s);
}

Test(conv_graph, views_that_do_not_match_are_refused_with_the_shapes) {
    na_conv_geom g = geom();
    GEOM_VIEWS(NA_DTYPE_F32);
    na_cg_problem p;
    na_view bad = view4(NA_DTYPE_F32, 2, 6, 3, 5, NULL, 0);
    cr_expect_eq(plain_init(&p, NA_CG_FWD, &g, &x, &w, &bad, NULL, "conv2d"), NA_ESHAPE);
    cr_expect(strstr(na_last_error(), "conv2d") && strstr(na_last_error(), "[2, 6, 3, 5]") &&
              strstr(na_last_error(), "[2, 6, 3, 4]"), "%s", na_last_error());
    bad = view4(NA_DTYPE_F16, 6, 2, 3, 3, NULL, 0);
    cr_expect_eq(plain_init(&p, NA_CG_FWD, &g, &x, &bad, &y, NULL, "t"), NA_EDTYPE);
    bad = view4(NA_DTYPE_F32, 2, 4, 5, 7, (int64_t[]){140, 35, 0, 1}, 0);
    cr_expect_eq(plain_init(&p, NA_CG_FWD, &g, &bad, &w, &y, NULL, "t"), NA_EINVAL);
    x.dtype = w.dtype = y.dtype = NA_DTYPE_F64;
    cr_expect_eq(plain_init(&p, NA_CG_FWD, &g, &x, &w, &y, NULL, "t"),
                 NA_EDTYPE, "f64 is the legacy path's");
    x.dtype = w.dtype = y.dtype = NA_DTYPE_F32;
    g.groups = 4; /* 6 output channels are not divisible by 4 */
    cr_expect_eq(plain_init(&p, NA_CG_FWD, &g, &x, &w, &y, NULL, "t"), NA_EINVAL);
}

Test(conv_graph, problem_string_names_kind_dtype_and_shapes) {
    na_conv_geom g = geom();
    GEOM_VIEWS(NA_DTYPE_F16);
    na_cg_problem p;
    cr_assert_eq(plain_init(&p, NA_CG_BWD_FILTER, &g, &x, &w, &y, NULL, "t"), NA_OK);
    char s[512];
    na_cg_problem_str(&p, s, sizeof s);
    cr_expect(strstr(s, "backward weight f16"), "%s", s);
    cr_expect(strstr(s, "x [2, 4, 5, 7] str [140, 35, 7, 1]"), "%s", s);
    cr_expect(strstr(s, "w [6, 2, 3, 3]") && strstr(s, "y [2, 6, 3, 4]"), "%s", s);
    cr_expect(strstr(s, "stride 2x2 pad 1x1 dil 1x1"), "%s", s);
    char small[12];
    na_cg_problem_str(&p, small, sizeof small);
    cr_expect_eq(strlen(small), sizeof small - 1, "truncated, terminated");
}

Test(conv_graph, engine_filter) {
    const na_dtype f32 = NA_DTYPE_F32, f16 = NA_DTYPE_F16, bf16 = NA_DTYPE_BF16;
    cr_expect_null(na_cg_engine_rejects(0, f32, false, false, false));
    cr_expect_null(na_cg_engine_rejects(NA_CG_NOTE_TENSOR_CORE, f16, false, true, false));
    cr_expect_null(na_cg_engine_rejects(NA_CG_NOTE_TENSOR_CORE, f32, true, false, false),
                   "TF32 on: tensor cores serve f32");
    cr_expect_not_null(na_cg_engine_rejects(NA_CG_NOTE_TENSOR_CORE, f32, false, false, false),
                       "strict f32: no TF32");
    cr_expect_not_null(na_cg_engine_rejects(NA_CG_NOTE_FFT, f32, true, false, false));
    cr_expect_not_null(na_cg_engine_rejects(NA_CG_NOTE_WINOGRAD, f32, false, false, false));
    cr_expect_null(na_cg_engine_rejects(NA_CG_NOTE_WINOGRAD | NA_CG_NOTE_TENSOR_CORE, f16, false,
                                        false, false), "as the legacy path: Winograd on f16");
    cr_expect_not_null(na_cg_engine_rejects(NA_CG_NOTE_NONDETERMINISTIC, bf16, false, true, false));
    cr_expect_null(na_cg_engine_rejects(NA_CG_NOTE_NONDETERMINISTIC, bf16, false, false, false));
    cr_expect_not_null(na_cg_engine_rejects(NA_CG_NOTE_DOWN_CONVERT, f32, true, false, false));
    cr_expect_not_null(
        na_cg_engine_rejects(NA_CG_NOTE_REDUCED_PRECISION, f16, false, false, false));
    cr_expect_not_null(na_cg_engine_rejects(NA_CG_NOTE_RUNTIME_COMPILED, f16, false, false, false));
    cr_expect_null(na_cg_engine_rejects(NA_CG_NOTE_RUNTIME_COMPILED, f16, false, false, true));
    const char *why = na_cg_engine_rejects(NA_CG_NOTE_NONDETERMINISTIC, f16, false, true, false);
    cr_expect(why && strstr(why, "NANOAMP_DETERMINISTIC"), "%s", why ? why : "(null)");
}

Test(conv_graph, fastest_skips_failed_runs) {
    cr_expect_eq(na_cg_fastest((float[]){0.5f, 0.25f, 0.75f}, 3), 1);
    cr_expect_eq(na_cg_fastest((float[]){-1.0f, 0.5f, NAN, 0.5f}, 4), 1, "first on ties");
    cr_expect_eq(na_cg_fastest((float[]){-1.0f, NAN, INFINITY}, 3), -1);
    cr_expect_eq(na_cg_fastest(NULL, 0), -1);
    cr_expect_eq(na_cg_fastest((float[]){0.0f, 0.1f}, 2), 0);
}

/* distinct problems: the same geometry with N = i + 1 */
static na_cg_problem problem_n(int i) {
    na_conv_geom g = geom();
    g.n = i + 1;
    na_view x = view4(NA_DTYPE_F16, g.n, 4, 5, 7, NULL, 0),
            w = view4(NA_DTYPE_F16, 6, 2, 3, 3, NULL, 0);
    na_view y = view4(NA_DTYPE_F16, g.n, 6, 3, 4, NULL, 0);
    na_cg_problem p;
    cr_assert_eq(plain_init(&p, NA_CG_FWD, &g, &x, &w, &y, NULL, "t"), NA_OK);
    return p;
}

Test(conv_graph, cache_is_bounded_and_evicts_the_least_recently_used) {
    static na_cg_cache c; /* large: not on the stack */
    memset(&c, 0, sizeof c);
    static int plans[NA_CG_CACHE_CAP + 1];
    void *evicted = (void *)1;
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) {
        na_cg_problem p = problem_n(i);
        cr_assert_null(na_cg_cache_find(&c, &p));
        na_cg_entry *e = na_cg_cache_claim(&c, &p, &evicted);
        cr_assert_null(evicted, "slot %d: a free slot evicts nothing", i);
        e->plan = &plans[i];
    }
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) {
        na_cg_problem p = problem_n(i);
        na_cg_entry *e = na_cg_cache_find(&c, &p);
        cr_assert_not_null(e, "problem %d cached", i);
        cr_expect_eq(e->plan, &plans[i]);
    }
    /* every problem was used in order 0..CAP-1; use problem 0 again: 1 is now the oldest */
    na_cg_problem p0 = problem_n(0), p1 = problem_n(1), pn = problem_n(NA_CG_CACHE_CAP);
    cr_assert_not_null(na_cg_cache_find(&c, &p0));
    na_cg_entry *e = na_cg_cache_claim(&c, &pn, &evicted);
    cr_expect_eq(evicted, &plans[1], "the least recently used plan is handed back to be freed");
    e->plan = &plans[NA_CG_CACHE_CAP];
    cr_expect_null(na_cg_cache_find(&c, &p1));
    cr_expect_not_null(na_cg_cache_find(&c, &p0));
    e = na_cg_cache_find(&c, &pn);
    cr_assert_not_null(e);
    cr_expect_eq(e->plan, &plans[NA_CG_CACHE_CAP]);
    int used = 0;
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) used += c.e[i].used;
    cr_expect_eq(used, NA_CG_CACHE_CAP);
    /* a dropped entry is free again and found no more */
    e = na_cg_cache_find(&c, &p0);
    cr_assert_not_null(e);
    na_cg_cache_drop(e);
    cr_expect_null(na_cg_cache_find(&c, &p0));
    e = na_cg_cache_claim(&c, &p1, &evicted);
    cr_expect_null(evicted, "the dropped slot is reused before evicting");
    cr_expect_null(e->plan, "a fresh entry has no plan (the legacy path) until one is set");
}

/* Plans used during a capture are pinned: a live step graph replays them, so a stream of new
 * problems must evict the others, never these, until the last graph is freed. */
Test(conv_graph, cache_never_evicts_a_plan_pinned_for_a_step_graph) {
    static na_cg_cache c;
    memset(&c, 0, sizeof c);
    static int plans[3 * NA_CG_CACHE_CAP];
    void *evicted = NULL;
    /* problem 0 is the oldest, and pinned (captured); the rest fill the cache */
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) {
        na_cg_problem p = problem_n(i);
        na_cg_entry *e = na_cg_cache_claim(&c, &p, &evicted);
        cr_assert_not_null(e);
        e->plan = &plans[i];
        if (i == 0) na_cg_cache_pin(e);
    }
    /* a whole cache's worth of new problems: each evicts an unpinned plan, never plan 0 */
    for (int i = NA_CG_CACHE_CAP; i < 2 * NA_CG_CACHE_CAP; i++) {
        na_cg_problem p = problem_n(i);
        na_cg_entry *e = na_cg_cache_claim(&c, &p, &evicted);
        cr_assert_not_null(e);
        cr_expect_neq(evicted, &plans[0], "problem %d evicted the pinned plan", i);
        cr_expect_not_null(evicted, "problem %d: a full cache evicts an unpinned plan", i);
        e->plan = &plans[i];
    }
    na_cg_problem p0 = problem_n(0);
    na_cg_entry *e0 = na_cg_cache_find(&c, &p0);
    cr_assert_not_null(e0, "the pinned problem is still cached");
    cr_expect_eq(e0->plan, &plans[0]);
    /* every entry pinned: nothing can be claimed, nothing is evicted */
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) na_cg_cache_pin(&c.e[i]);
    na_cg_problem pn = problem_n(2 * NA_CG_CACHE_CAP);
    evicted = (void *)1;
    cr_expect_null(na_cg_cache_claim(&c, &pn, &evicted), "a cache of pinned plans has no room");
    cr_expect_null(evicted);
    /* the last graph freed: the least recently used may go again (problem 0, found above, is
     * newer than the problems before the last claims) */
    na_cg_cache_unpin_all(&c);
    na_cg_entry *e = na_cg_cache_claim(&c, &pn, &evicted);
    cr_assert_not_null(e);
    cr_expect_not_null(evicted);
    cr_expect_neq(evicted, &plans[0]);
    for (int i = 0; i < NA_CG_CACHE_CAP; i++) cr_expect(!c.e[i].pinned || &c.e[i] == e);
}

/* What a failing cuDNN status does (cuDNN 9's values, cudnn_graph.h: kinds of thousands). Any
 * failure of one engine configuration passes it over, whatever its kind (cudnn-frontend does
 * so while building plans): an NVRTC compile failure (INTERNAL_ERROR_COMPILATION_FAILED 4001),
 * INTERNAL_ERROR 4000, EXECUTION_FAILED 5000, SUBLIBRARY_LOADING_FAILED 1008, as BAD_PARAM
 * 2000 and NOT_SUPPORTED 3000 were. A failing graph or cached plan is never an error either:
 * the plain path serves the problem (before, only BAD_PARAM and NOT_SUPPORTED did, and the
 * others failed the convolution, and with it conv2d_stats' forward). */
Test(conv_graph, every_failing_status_tries_the_next_config_or_the_plain_path) {
    static const int fails[] = {1001, 1002, 1008, 2000, 2002, 2003, 3000, 3001, 3007, 3010,
                                4000, 4001, 4003, 4004, 5000, 5001, 5003};
    cr_expect_eq(na_cg_status_verdict(0, NA_CG_AT_CONFIG), NA_CG_OK);
    cr_expect_eq(na_cg_status_verdict(0, NA_CG_AT_GRAPH), NA_CG_OK);
    cr_expect_eq(na_cg_status_verdict(0, NA_CG_AT_RUN), NA_CG_OK);
    for (size_t i = 0; i < sizeof fails / sizeof fails[0]; i++) {
        int st = fails[i];
        cr_expect_eq(na_cg_status_verdict(st, NA_CG_AT_CONFIG), NA_CG_NEXT_CONFIG,
                     "status %d of one engine configuration: try the next", st);
        cr_expect_eq(na_cg_status_verdict(st, NA_CG_AT_GRAPH), NA_CG_UNSERVED,
                     "status %d of the graph: the plain path", st);
        cr_expect_eq(na_cg_status_verdict(st, NA_CG_AT_RUN), NA_CG_UNSERVED,
                     "status %d of the cached plan: the plain path", st);
    }
}

/* The legacy path's fallback to im2col takes cuDNN 9's whole NOT_SUPPORTED kind (3000-3099),
 * not only 3000 itself; under cuDNN 8 each status is its own kind (NOT_SUPPORTED was 9). */
Test(conv_graph, status_kinds_group_cudnn9_sub_codes) {
    for (int st = 3000; st <= 3014; st++)
        cr_expect_eq(na_cudnn_status_kind(st, 9), 3000, "status %d is of the NOT_SUPPORTED kind", st);
    cr_expect_eq(na_cudnn_status_kind(2003, 9), 2000);
    cr_expect_eq(na_cudnn_status_kind(4001, 9), 4000);
    cr_expect_eq(na_cudnn_status_kind(0, 9), 0);
    cr_expect_neq(na_cudnn_status_kind(4000, 9), na_cudnn_status_kind(3000, 9));
    cr_expect_eq(na_cudnn_status_kind(9, 8), 9, "cuDNN 8: NOT_SUPPORTED is its own kind");
    cr_expect_neq(na_cudnn_status_kind(8, 8), na_cudnn_status_kind(9, 8));
}

/* ---- the layout of a convolution's tensors (conv.cu's legacy path and the graph path) ---- */
Test(conv_graph, layout_strides_of_nchw_and_channels_last) {
    int64_t s[4];
    na_conv_layout_strides(NA_CONV_NCHW, (int64_t[]){2, 4, 5, 7}, s);
    cr_expect(s[0] == 140 && s[1] == 35 && s[2] == 7 && s[3] == 1);
    na_conv_layout_strides(NA_CONV_NHWC, (int64_t[]){2, 4, 5, 7}, s);
    cr_expect(s[0] == 140 && s[1] == 1 && s[2] == 28 && s[3] == 4, "[%lld, %lld, %lld, %lld]",
              (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
}

Test(conv_graph, layout_of_contiguous_and_channels_last_views) {
    GEOM_VIEWS(NA_DTYPE_F16);
    na_view xl = view4(NA_DTYPE_F16, 2, 4, 5, 7, (int64_t[]){140, 1, 28, 4}, 0);
    na_view wl = view4(NA_DTYPE_F16, 6, 2, 3, 3, (int64_t[]){18, 1, 6, 2}, 0); /* KRSC */
    na_view yl = view4(NA_DTYPE_F16, 2, 6, 3, 4, (int64_t[]){72, 1, 24, 6}, 0);
    na_conv_layout l = (na_conv_layout)-1;
    cr_assert_eq(na_conv_layout_of(NA_CG_FWD, &x, &w, &y, &l, "t"), NA_OK, "%s", na_last_error());
    cr_expect_eq(l, NA_CONV_NCHW);
    cr_assert_eq(na_conv_layout_of(NA_CG_BWD_FILTER, &xl, &wl, &yl, &l, "t"), NA_OK, "%s",
                 na_last_error());
    cr_expect_eq(l, NA_CONV_NHWC);
    /* size-1 dims: a 1-channel input is both; its strides on the unit dim do not matter */
    na_view x1 = view4(NA_DTYPE_F16, 2, 1, 5, 7, (int64_t[]){35, 99, 7, 1}, 0);
    na_view w1 = view4(NA_DTYPE_F16, 6, 1, 3, 3, NULL, 0);
    cr_assert_eq(na_conv_layout_of(NA_CG_FWD, &x1, &w1, &yl, &l, "t"), NA_OK, "%s", na_last_error());
    cr_expect_eq(l, NA_CONV_NHWC);
    cr_assert_eq(na_conv_layout_of(NA_CG_FWD, &x1, &w1, &y, &l, "t"), NA_OK, "%s", na_last_error());
    cr_expect_eq(l, NA_CONV_NCHW);
}

Test(conv_graph, mixed_or_other_layouts_are_refused_with_the_strides) {
    GEOM_VIEWS(NA_DTYPE_F32);
    na_view xl = view4(NA_DTYPE_F32, 2, 4, 5, 7, (int64_t[]){140, 1, 28, 4}, 0);
    na_view wl = view4(NA_DTYPE_F32, 6, 2, 3, 3, (int64_t[]){18, 1, 6, 2}, 0);
    na_view yl = view4(NA_DTYPE_F32, 2, 6, 3, 4, (int64_t[]){72, 1, 24, 6}, 0);
    na_conv_layout l;
    cr_expect_eq(na_conv_layout_of(NA_CG_FWD, &xl, &wl, &y, &l, "conv2d"), NA_EINVAL);
    cr_expect(strstr(na_last_error(), "conv2d") &&
              strstr(na_last_error(), "y 4d [2, 6, 3, 4] str [72, 12, 4, 1]") &&
              strstr(na_last_error(), "x 4d [2, 4, 5, 7] str [140, 1, 28, 4]"), "%s",
              na_last_error());
    cr_expect_eq(na_conv_layout_of(NA_CG_BWD_DATA, &xl, &w, &yl, &l, "conv2d_backward_data"),
                 NA_EINVAL, "an NCHW filter with channels-last activations");
    cr_expect(strstr(na_last_error(), "gx 4d") && strstr(na_last_error(), "gy 4d"), "%s",
              na_last_error());
    na_view wt = view4(NA_DTYPE_F32, 6, 2, 3, 3, (int64_t[]){1, 6, 36, 12}, 0); /* transposed */
    cr_expect_eq(na_conv_layout_of(NA_CG_BWD_FILTER, &x, &wt, &y, &l, "t"), NA_EINVAL);
    cr_expect(strstr(na_last_error(), "gw 4d [6, 2, 3, 3] str [1, 6, 36, 12]"), "%s",
              na_last_error());
    na_view x3 = x;
    x3.ndim = 3;
    cr_expect_eq(na_conv_layout_of(NA_CG_FWD, &x3, &w, &y, &l, "t"), NA_EINVAL);
}
