/* FP8 scaling recipes (nanoamp/fp8.h) against an independent re-implementation of Transformer
 * Engine's rules written here (ref_*), step by step and bit for bit, over scripted amax
 * sequences with 0, inf, NaN, tiny values, jumps both ways and more steps than the history
 * holds; the current recipe; the formats per role; the checkpoint round trip; bad input.
 *
 * The reference follows TE's PyTorch-level description of the fused update
 * (fused_amax_and_scale_update_after_reduction): a [len, n] history whose row 0 is this step's
 * amax; when that amax is not 0, the amax used is the fmax (NaN-skipping) reduction of the
 * whole history, the history is torch.roll(h, -1, 0) with row 0 then zeroed; the scale is
 * (fp8_max * 2^-margin) / amax, kept when amax is 0 or not finite, FLT_MAX where it
 * overflows; scale_inv = 1 / scale. It works on a copy with a separate rolled array, not in
 * place as the library does. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "helpers.h"
#include "nanoamp/cuda.h"
#include "nanoamp/dist.h"
#include "nanoamp/fp8.h"
#include "nanoamp/io.h"

#define NR NA_FP8_ROLE_COUNT
#define MAXLEN 1024

typedef struct {
    int64_t len;
    float h[MAXLEN][NR], scale[NR], scale_inv[NR];
} ref_state;

static void ref_init(ref_state *s, int64_t len) {
    memset(s, 0, sizeof *s);
    s->len = len;
    for (int r = 0; r < NR; r++) s->scale[r] = s->scale_inv[r] = 1.0f;
}

static float ref_fp8_max(na_fp8_formats formats, int r) {
    return formats == NA_FP8_FORMATS_HYBRID && r == 2 ? 57344.0f : 448.0f;
}

static void ref_record(ref_state *s, int r, float a) {
    if (isnan(a) || isnan(s->h[0][r])) s->h[0][r] = NAN;
    else s->h[0][r] = fmaxf(s->h[0][r], a);
}

static void ref_update(ref_state *s, const na_fp8_recipe_cfg *c) {
    for (int r = 0; r < NR; r++) {
        float last = s->h[0][r], amax = 0;
        if (last != 0) {
            float rolled[MAXLEN];
            for (int64_t i = 0; i < s->len; i++) {
                amax = fmaxf(amax, s->h[i][r]);
                rolled[(i + s->len - 1) % s->len] = s->h[i][r]; /* torch.roll(h, -1) */
            }
            rolled[0] = 0;
            for (int64_t i = 0; i < s->len; i++) s->h[i][r] = rolled[i];
        }
        if (c->amax_algo == NA_FP8_AMAX_MOST_RECENT) amax = last;
        float sf = s->scale[r];
        if (isfinite(amax) && amax > 0)
            sf = (ref_fp8_max(c->formats, r) / (float)(1ull << c->margin)) / amax;
        if (isinf(sf)) sf = FLT_MAX;
        s->scale[r] = sf;
        s->scale_inv[r] = 1.0f / sf;
    }
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void expect_same(const na_fp8_scaling *fs, const ref_state *ref, const char *what,
                        int step) {
    for (int r = 0; r < NR; r++) {
        cr_assert_eq(bits(na_fp8_scaling_scale(fs, r)), bits(ref->scale[r]),
                     "%s step %d %s: scale %.9g, reference %.9g", what, step, na_fp8_role_name(r),
                     (double)na_fp8_scaling_scale(fs, r), (double)ref->scale[r]);
        cr_assert_eq(bits(na_fp8_scaling_scale_inv(fs, r)), bits(ref->scale_inv[r]),
                     "%s step %d %s: scale_inv %.9g, reference %.9g", what, step,
                     na_fp8_role_name(r), (double)na_fp8_scaling_scale_inv(fs, r),
                     (double)ref->scale_inv[r]);
        for (int64_t i = 0; i < ref->len; i++)
            cr_assert_eq(bits(na_fp8_scaling_history(fs, r, i)), bits(ref->h[i][r]),
                         "%s step %d %s: history[%lld] %.9g, reference %.9g", what, step,
                         na_fp8_role_name(r), (long long)i,
                         (double)na_fp8_scaling_history(fs, r, i), (double)ref->h[i][r]);
    }
}

/* The script: per step up to two amax records per role (a second cast of the same tensor in
 * a step); -1 means no record. Zeros, inf, NaN, a subnormal whose scale overflows, jumps of
 * 10^4 up and down, and a long quiet tail so every value leaves a short history. */
static const float SCRIPT[][NR][2] = {
    {{1.0f, -1}, {0.5f, -1}, {3e-3f, -1}},
    {{2.0f, 1.5f}, {0.5f, -1}, {4e-3f, 1e-3f}},
    {{0.0f, -1}, {0.25f, -1}, {-1, -1}},
    {{0.5f, -1}, {INFINITY, -1}, {1e-2f, -1}},
    {{1e4f, -1}, {0.25f, -1}, {NAN, -1}},
    {{1.0f, -1}, {0.125f, -1}, {2e-3f, -1}},
    {{NAN, 2.0f}, {0.125f, -1}, {2e-3f, -1}},
    {{3.0f, -1}, {1e-40f, -1}, {0.0f, -1}},
    {{1e-3f, -1}, {0.0f, -1}, {5e3f, -1}},
    {{1e-3f, -1}, {0.2f, -1}, {1e-4f, -1}},
    {{7.0f, -1}, {0.2f, -1}, {1e-4f, -1}},
    {{7.0f, -1}, {0.3f, -1}, {1e-4f, -1}},
    {{0.1f, -1}, {0.3f, -1}, {1e-4f, -1}},
    {{0.1f, -1}, {0.3f, -1}, {INFINITY, -1}},
    {{0.1f, -1}, {0.3f, -1}, {1e-4f, -1}},
    {{0.1f, -1}, {0.3f, -1}, {1e-4f, -1}},
    {{0.1f, -1}, {0.3f, -1}, {1e-4f, -1}},
    {{0.1f, -1}, {0.3f, -1}, {1e-4f, -1}},
};
#define NSTEPS ((int)(sizeof SCRIPT / sizeof SCRIPT[0]))

static void run_script_step(na_fp8_scaling *fs, ref_state *ref, int t) {
    for (int r = 0; r < NR; r++)
        for (int k = 0; k < 2; k++) {
            float a = SCRIPT[t][r][k];
            if (a == -1) continue;
            TH_RC(na_fp8_scaling_record_amax(fs, r, a));
            if (ref) ref_record(ref, r, a);
        }
}

static void check_recipe(na_fp8_recipe_cfg c) {
    char what[128];
    snprintf(what, sizeof what, "%s %s len %lld margin %d", na_fp8_formats_name(c.formats),
             na_fp8_amax_algo_name(c.amax_algo), (long long)c.amax_history_len, c.margin);
    na_fp8_scaling *fs = na_fp8_scaling_new(&c);
    cr_assert_not_null(fs, "%s: %s", what, na_last_error());
    static ref_state ref;
    ref_init(&ref, c.amax_history_len);
    expect_same(fs, &ref, what, -1);
    for (int t = 0; t < NSTEPS; t++) {
        run_script_step(fs, &ref, t);
        expect_same(fs, &ref, what, t); /* recorded */
        TH_RC(na_fp8_scaling_update(fs));
        ref_update(&ref, &c);
        expect_same(fs, &ref, what, t); /* updated */
    }
    cr_assert_eq(na_fp8_scaling_updates(fs), NSTEPS);
    na_fp8_scaling_free(fs);
}

Test(fp8_recipe, delayed_matches_transformer_engine_rules) {
    const int64_t lens[] = {1, 2, 4, 16, 1024};
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < 2; a++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
                for (int m = 0; m <= 3; m += 3)
                    check_recipe((na_fp8_recipe_cfg){.kind = NA_FP8_RECIPE_DELAYED,
                                                     .formats = (na_fp8_formats)f,
                                                     .amax_history_len = lens[l],
                                                     .amax_algo = (na_fp8_amax_algo)a,
                                                     .margin = m});
}

/* Numbers worked by hand from the rules, so the reference itself is pinned down. */
Test(fp8_recipe, delayed_by_hand) {
    na_fp8_recipe_cfg c = NA_FP8_RECIPE_DEFAULTS;
    c.amax_history_len = 3;
    na_fp8_scaling *fs = na_fp8_scaling_new(&c);
    cr_assert_not_null(fs, "%s", na_last_error());
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 1.0f); /* before any update */
    TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, 2.0f));
    TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_GRAD_OUTPUT, 2.0f));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 1.0f); /* delayed: not yet */
    TH_RC(na_fp8_scaling_update(fs));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 224.0f);        /* 448 / 2 */
    cr_assert_eq(na_fp8_scaling_scale_inv(fs, NA_FP8_INPUT), 1.0f / 224.0f);
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_GRAD_OUTPUT), 28672.0f); /* 57344 / 2 */
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_WEIGHT), 1.0f); /* amax 0: kept */
    cr_assert_eq(na_fp8_scaling_history(fs, NA_FP8_INPUT, 2), 2.0f); /* rolled to the end */
    cr_assert_eq(na_fp8_scaling_amax(fs, NA_FP8_INPUT), 0.0f);       /* a new row 0 */
    /* a jump down: max still sees 2 for the window's length */
    TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, 0.5f));
    TH_RC(na_fp8_scaling_update(fs));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 224.0f);
    TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, 0.5f));
    TH_RC(na_fp8_scaling_update(fs));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 224.0f); /* 2 is in row 1: oldest */
    TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, 0.5f));
    TH_RC(na_fp8_scaling_update(fs));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 896.0f); /* 2 gone: 448 / 0.5 */
    /* inf keeps the scale; a step without a record (amax 0) neither rolls nor changes it */
    TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, INFINITY));
    TH_RC(na_fp8_scaling_update(fs));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 896.0f);
    TH_RC(na_fp8_scaling_update(fs));
    cr_assert_eq(na_fp8_scaling_history(fs, NA_FP8_INPUT, 2), INFINITY);
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_INPUT), 896.0f);
    char buf[1024];
    na_fp8_scaling_describe(fs, buf, sizeof buf);
    cr_assert(strstr(buf, "fp8 delayed hybrid max margin 0 history 3, update 6"), "%s", buf);
    cr_assert(strstr(buf, "grad_output e5m2 scale 28672"), "%s", buf);
    /* as docs/mixed-precision.md shows it */
    cr_assert(strstr(buf, "fp8 delayed hybrid max margin 0 history 3, update 6\n"
                          "  input       e4m3 scale 896 scale_inv 0.00111607148 amax 0 "
                          "(window max inf)\n"),
              "%s", buf);
    na_fp8_scaling_free(fs);
}

Test(fp8_recipe, current_scaling) {
    na_fp8_recipe_cfg c = NA_FP8_RECIPE_CURRENT_DEFAULTS;
    na_fp8_scaling *fs = na_fp8_scaling_new(&c);
    cr_assert_not_null(fs, "%s", na_last_error());
    /* the scale follows this tensor's own amax at once, both ways */
    const float amax[] = {2.0f, 1e4f, 0.5f, 0.0f, INFINITY, NAN, 1e-40f, 3.0f};
    for (size_t i = 0; i < sizeof amax / sizeof amax[0]; i++) {
        for (int r = 0; r < NR; r++) {
            TH_RC(na_fp8_scaling_record_amax(fs, r, amax[i]));
            float want = isfinite(amax[i]) && amax[i] > 0 ? ref_fp8_max(c.formats, r) / amax[i]
                                                          : 1.0f;
            if (isinf(want)) want = FLT_MAX;
            cr_assert_eq(bits(na_fp8_scaling_scale(fs, r)), bits(want), "amax %g %s: %.9g vs %.9g",
                         (double)amax[i], na_fp8_role_name(r), (double)na_fp8_scaling_scale(fs, r),
                         (double)want);
            cr_assert_eq(bits(na_fp8_scaling_scale_inv(fs, r)), bits(1.0f / want));
        }
        float before = na_fp8_scaling_scale(fs, NA_FP8_INPUT);
        TH_RC(na_fp8_scaling_update(fs)); /* no history: nothing moves */
        cr_assert_eq(bits(na_fp8_scaling_scale(fs, NA_FP8_INPUT)), bits(before));
    }
    /* from a tensor: amax 3 of [-3, 1, 2] */
    na_tensor *x = TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3), -3, 1, 2);
    TH_RC(na_fp8_scaling_record(fs, NA_FP8_WEIGHT, x));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_WEIGHT), 448.0f / 3.0f);
    char buf[512];
    na_fp8_scaling_describe(fs, buf, sizeof buf);
    cr_assert(strstr(buf, "fp8 current hybrid"), "%s", buf);
    na_fp8_scaling_free(fs);
    na_step_end();
}

Test(fp8_recipe, formats_per_role) {
    cr_assert_eq(na_fp8_formats_format(NA_FP8_FORMATS_HYBRID, NA_FP8_INPUT), NA_FP8_E4M3);
    cr_assert_eq(na_fp8_formats_format(NA_FP8_FORMATS_HYBRID, NA_FP8_WEIGHT), NA_FP8_E4M3);
    cr_assert_eq(na_fp8_formats_format(NA_FP8_FORMATS_HYBRID, NA_FP8_GRAD_OUTPUT), NA_FP8_E5M2);
    for (int r = 0; r < NR; r++)
        cr_assert_eq(na_fp8_formats_format(NA_FP8_FORMATS_E4M3, r), NA_FP8_E4M3);
    cr_assert_eq(na_fp8_format_max(NA_FP8_E4M3), 448.0);
    cr_assert_eq(na_fp8_format_max(NA_FP8_E5M2), 57344.0);
    cr_assert_str_eq(na_fp8_format_name(NA_FP8_E5M2), "e5m2");
    /* E4M3 for all: the gradient's scale from 448, not 57344 */
    na_fp8_recipe_cfg c = NA_FP8_RECIPE_DEFAULTS;
    c.formats = NA_FP8_FORMATS_E4M3;
    na_fp8_scaling *fs = na_fp8_scaling_new(&c);
    cr_assert_not_null(fs);
    cr_assert_eq(na_fp8_scaling_format(fs, NA_FP8_GRAD_OUTPUT), NA_FP8_E4M3);
    TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_GRAD_OUTPUT, 4.0f));
    TH_RC(na_fp8_scaling_update(fs));
    cr_assert_eq(na_fp8_scaling_scale(fs, NA_FP8_GRAD_OUTPUT), 112.0f);
    na_fp8_scaling_free(fs);
}

Test(fp8_recipe, amax_of_tensors) {
    const na_dtype dts[] = {NA_DTYPE_F64, NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (size_t i = 0; i < 4; i++) {
        na_tensor *x = TH_TENSOR(dts[i], NA_SHAPE(2, 3), 0.5, -6, 2, 0, 5.5, -0.25);
        na_tensor *m = TH_OK(na_fp8_amax(x));
        cr_assert_eq(m->dtype, NA_DTYPE_F32);
        cr_assert_eq(m->ndim, 0);
        cr_assert_eq(na_item(m), 6.0, "%s: %g", na_dtype_name(dts[i]), na_item(m));
        na_tensor *y = TH_TENSOR(dts[i], NA_SHAPE(3), 1, NAN, -2);
        cr_assert(isnan(na_item(TH_OK(na_fp8_amax(y)))), "%s: NaN propagates",
                  na_dtype_name(dts[i]));
    }
    na_tensor *e = TH_OK(na_empty(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(0, 4)));
    cr_assert_eq(na_item(TH_OK(na_fp8_amax(e))), 0.0);
    na_tensor *xi = TH_OK(na_zeros(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2)));
    TH_EXPECT_ERROR(na_fp8_amax(xi), NA_EDTYPE, "na_fp8_amax", "i32");
    /* a record from a tensor equals a record of its amax */
    na_fp8_scaling *fs = na_fp8_scaling_new(NULL), *gs = na_fp8_scaling_new(NULL);
    na_tensor *x = TH_TENSOR(NA_DTYPE_BF16, NA_SHAPE(4), 0.5, -3.5, 1, 2);
    TH_RC(na_fp8_scaling_record(fs, NA_FP8_INPUT, x));
    TH_RC(na_fp8_scaling_record_amax(gs, NA_FP8_INPUT, 3.5f));
    cr_assert_eq(na_fp8_scaling_amax(fs, NA_FP8_INPUT), 3.5f);
    TH_RC(na_fp8_scaling_update(fs));
    TH_RC(na_fp8_scaling_update(gs));
    cr_assert_eq(bits(na_fp8_scaling_scale(fs, NA_FP8_INPUT)),
                 bits(na_fp8_scaling_scale(gs, NA_FP8_INPUT)));
    na_fp8_scaling_free(fs);
    na_fp8_scaling_free(gs);
    na_step_end();
}

Test(fp8_recipe, checkpoint_round_trip_bit_for_bit) {
    char path[] = "/tmp/fp8_recipe_ck_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    na_fp8_recipe_cfg c = NA_FP8_RECIPE_DEFAULTS;
    c.amax_history_len = 4;
    na_fp8_scaling *a = na_fp8_scaling_new(&c), *b = na_fp8_scaling_new(&c);
    cr_assert(a && b);
    for (int t = 0; t < 9; t++) { /* leaves inf and NaN in the histories */
        run_script_step(a, NULL, t);
        TH_RC(na_fp8_scaling_update(a));
    }
    run_script_step(a, NULL, 9); /* a recorded, not yet updated step is state too */
    na_named_tensors st = {0};
    TH_RC(na_fp8_scaling_state(a, "fc1.fp8.", &st));
    cr_assert_eq(st.n, 4);
    cr_assert_str_eq(st.items[0].name, "fc1.fp8.amax_history");
    cr_assert_eq(st.items[0].tensor->shape[0], 4);
    cr_assert_eq(st.items[0].tensor->shape[1], 3);
    cr_assert_str_eq(st.items[1].name, "fc1.fp8.scale");
    cr_assert_str_eq(st.items[2].name, "fc1.fp8.scale_inv");
    cr_assert_str_eq(st.items[3].name, "fc1.fp8.updates");
    TH_RC(na_checkpoint_save_list(path, &st));
    na_named_tensors_free(&st);
    TH_RC(na_fp8_scaling_state(b, "fc1.fp8.", &st));
    TH_RC(na_checkpoint_load_list(path, &st, true));
    na_named_tensors_free(&st);
    unlink(path);
    cr_assert_eq(na_fp8_scaling_updates(b), 9);
    /* the loaded state and both continuations agree bit for bit */
    for (int t = 9; t < NSTEPS; t++) {
        if (t > 9) {
            run_script_step(a, NULL, t);
            run_script_step(b, NULL, t);
        }
        for (int r = 0; r < NR; r++) {
            cr_assert_eq(bits(na_fp8_scaling_scale(a, r)), bits(na_fp8_scaling_scale(b, r)));
            cr_assert_eq(bits(na_fp8_scaling_scale_inv(a, r)),
                         bits(na_fp8_scaling_scale_inv(b, r)));
            for (int64_t i = 0; i < 4; i++)
                cr_assert_eq(bits(na_fp8_scaling_history(a, r, i)),
                             bits(na_fp8_scaling_history(b, r, i)), "step %d %s row %lld", t,
                             na_fp8_role_name(r), (long long)i);
        }
        TH_RC(na_fp8_scaling_update(a));
        TH_RC(na_fp8_scaling_update(b));
    }
    /* a history of another length does not load */
    c.amax_history_len = 8;
    na_fp8_scaling *other = na_fp8_scaling_new(&c);
    TH_RC(na_fp8_scaling_state(a, "", &st));
    TH_RC(na_checkpoint_save_list(path, &st));
    na_named_tensors_free(&st);
    TH_RC(na_fp8_scaling_state(other, "", &st));
    TH_EXPECT_STATUS(na_checkpoint_load_list(path, &st, true), NA_ESHAPE, "amax_history");
    na_named_tensors_free(&st);
    unlink(path);
    /* a loaded scale that is not finite and > 0 is refused at the next update */
    TH_RC(na_fp8_scaling_state(b, "", &st));
    na_tensor *scale = na_named_tensors_find(&st, "scale");
    cr_assert_not_null(scale);
    ((float *)scale->data)[1] = 0.0f;
    TH_EXPECT_STATUS(na_fp8_scaling_update(b), NA_EINVAL, "na_fp8_scaling_update", "weight",
                     "as loaded");
    na_named_tensors_free(&st);
    na_fp8_scaling_free(a);
    na_fp8_scaling_free(b);
    na_fp8_scaling_free(other);
}

Test(fp8_recipe, bad_config_names_the_field) {
    na_fp8_recipe_cfg c = NA_FP8_RECIPE_DEFAULTS;
    c.amax_history_len = 0;
    TH_EXPECT_ERROR(na_fp8_scaling_new(&c), NA_EINVAL, "na_fp8_scaling_new", "amax_history_len 0");
    c = (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS;
    c.margin = -1;
    TH_EXPECT_ERROR(na_fp8_scaling_new(&c), NA_EINVAL, "margin -1");
    c = (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS;
    c.formats = (na_fp8_formats)7;
    TH_EXPECT_ERROR(na_fp8_scaling_new(&c), NA_EINVAL, "formats 7");
    c = (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS;
    c.kind = (na_fp8_recipe_kind)5;
    TH_EXPECT_ERROR(na_fp8_scaling_new(&c), NA_EINVAL, "kind 5");
    c = (na_fp8_recipe_cfg)NA_FP8_RECIPE_DEFAULTS;
    c.amax_algo = (na_fp8_amax_algo)3;
    TH_EXPECT_ERROR(na_fp8_scaling_new(&c), NA_EINVAL, "amax_algo 3");
    c = (na_fp8_recipe_cfg)NA_FP8_RECIPE_CURRENT_DEFAULTS;
    c.margin = 2;
    TH_EXPECT_ERROR(na_fp8_scaling_new(&c), NA_EINVAL, "margin 2", "current");
    na_fp8_scaling *fs = na_fp8_scaling_new(NULL);
    cr_assert_not_null(fs);
    TH_EXPECT_STATUS(na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, -1.0f), NA_EINVAL, "negative");
    TH_EXPECT_STATUS(na_fp8_scaling_record_amax(fs, (na_fp8_role)3, 1.0f), NA_EINVAL, "role 3");
    cr_assert(isnan(na_fp8_scaling_scale(fs, (na_fp8_role)3)));
    cr_assert(isnan(na_fp8_scaling_history(fs, NA_FP8_INPUT, 1024)));
    na_fp8_scaling_free(fs);
}

/* A world of 1: the reduction leaves every amax (NaN included) as it was. The 2-rank case is
 * tests/test_dist_mpi.c's fp8_amax. */
Test(fp8_recipe, dist_reduce_one_rank) {
    na_dist *d = na_dist_init();
    cr_assert_not_null(d, "%s", na_last_error());
    na_fp8_scaling *a = na_fp8_scaling_new(NULL), *b = na_fp8_scaling_new(NULL);
    TH_RC(na_fp8_scaling_record_amax(a, NA_FP8_INPUT, 3.0f));
    TH_RC(na_fp8_scaling_record_amax(a, NA_FP8_WEIGHT, NAN));
    TH_RC(na_fp8_scaling_record_amax(b, NA_FP8_GRAD_OUTPUT, INFINITY));
    TH_RC(na_dist_fp8_reduce_amax(d, (na_fp8_scaling *[]){a, b}, 2));
    cr_assert_eq(na_fp8_scaling_amax(a, NA_FP8_INPUT), 3.0f);
    cr_assert(isnan(na_fp8_scaling_amax(a, NA_FP8_WEIGHT)));
    cr_assert_eq(na_fp8_scaling_amax(a, NA_FP8_GRAD_OUTPUT), 0.0f);
    cr_assert_eq(na_fp8_scaling_amax(b, NA_FP8_GRAD_OUTPUT), INFINITY);
    TH_EXPECT_STATUS(na_dist_fp8_reduce_amax(d, (na_fp8_scaling *[]){a, NULL}, 2), NA_EINVAL,
                     "state 1");
    na_fp8_scaling_free(a);
    na_fp8_scaling_free(b);
    na_dist_free(d);
}

/* docs/mixed-precision.md's story of an amax that jumps: amax 1 for 10 steps, 100 at step 10,
 * 1 again after. The step of the jump casts with the old scale 448 (100 * 448 saturates E4M3),
 * the next steps with 4.48; "max" keeps 4.48 while the 100 is in the 1024-step window, then
 * returns to 448; "most_recent" returns at once. */
Test(fp8_recipe, amax_jump) {
    for (int a = 0; a < 2; a++) {
        na_fp8_recipe_cfg c = NA_FP8_RECIPE_DEFAULTS;
        c.amax_algo = (na_fp8_amax_algo)a;
        na_fp8_scaling *fs = na_fp8_scaling_new(&c);
        cr_assert_not_null(fs);
        int64_t back = -1; /* the first step casting with 448 again after the jump */
        for (int64_t t = 0; t < 1100; t++) {
            float used = na_fp8_scaling_scale(fs, NA_FP8_INPUT); /* this step's cast */
            if (t == 10) cr_assert_eq(used, 448.0f, "the jump's step casts with %g", (double)used);
            if (t == 11) cr_assert_eq(used, 448.0f / 100.0f);
            if (t > 11 && used == 448.0f && back < 0) back = t;
            TH_RC(na_fp8_scaling_record_amax(fs, NA_FP8_INPUT, t == 10 ? 100.0f : 1.0f));
            TH_RC(na_fp8_scaling_update(fs));
        }
        /* max: step 10's 100 is in the window of the 1024 updates after steps 10..1033, so
         * steps 11..1034 cast with 4.48 */
        cr_assert_eq(back, a == NA_FP8_AMAX_MAX ? 1035 : 12, "%s: back at step %lld",
                     na_fp8_amax_algo_name(c.amax_algo), (long long)back);
        na_fp8_scaling_free(fs);
    }
}

/* The amax of a CUDA tensor: the same ops run there (abs, max, cast), the same answer as the
 * CPU's, NaN included. Runs in the cuda suite (skips without a device). */
Test(fp8_recipe_cuda, amax_matches_cpu) {
    if (!na_cuda_available()) cr_skip_test("no CUDA device");
    const na_dtype dts[] = {NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    for (size_t i = 0; i < 3; i++) {
        na_tensor *x = TH_OK(na_randn(dts[i], NA_DEVICE_CPU, NA_SHAPE(257, 33), 0, 3));
        na_tensor *xc = TH_OK(na_to_device(x, NA_DEVICE_CUDA));
        float cpu = (float)na_item(TH_OK(na_fp8_amax(x)));
        float dev = (float)na_item(TH_OK(na_fp8_amax(xc)));
        cr_assert_eq(bits(cpu), bits(dev), "%s: cuda %.9g, cpu %.9g", na_dtype_name(dts[i]),
                     (double)dev, (double)cpu);
        na_fp8_scaling *fs = na_fp8_scaling_new(NULL);
        TH_RC(na_fp8_scaling_record(fs, NA_FP8_INPUT, xc));
        cr_assert_eq(bits(na_fp8_scaling_amax(fs, NA_FP8_INPUT)), bits(cpu));
        na_fp8_scaling_free(fs);
    }
    na_tensor *y = TH_OK(na_to_device(TH_TENSOR(NA_DTYPE_F32, NA_SHAPE(3), 1, NAN, -2),
                                      NA_DEVICE_CUDA));
    cr_assert(isnan(na_item(TH_OK(na_fp8_amax(y)))));
    na_step_end();
}

/* The recipe's formats are the storage dtypes na_cast writes: the maxima agree with a cast. */
Test(fp8_recipe, formats_are_the_storage_dtypes) {
    cr_assert_eq(na_fp8_format_dtype(NA_FP8_E4M3), NA_DTYPE_F8E4M3);
    cr_assert_eq(na_fp8_format_dtype(NA_FP8_E5M2), NA_DTYPE_F8E5M2);
    cr_assert_eq(na_fp8_format_dtype((na_fp8_format)7), -1);
    na_fp8_format fs[2] = {NA_FP8_E4M3, NA_FP8_E5M2};
    for (int i = 0; i < 2; i++) {
        /* the format's max survives a round trip; twice the max saturates (E4M3) or overflows */
        const float v[2] = {(float)na_fp8_format_max(fs[i]), 2 * (float)na_fp8_format_max(fs[i])};
        na_tensor *x = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2), v);
        na_tensor *q = na_cast(x, (na_dtype)na_fp8_format_dtype(fs[i]));
        cr_assert_not_null(q, "%s", na_last_error());
        na_tensor *back = na_cast(q, NA_DTYPE_F32);
        float r[2];
        cr_assert_eq(na_copy_to_host(back, r), NA_OK);
        cr_assert_eq(r[0], v[0]);
        cr_assert(i == 0 ? r[1] == v[0] : isinf(r[1]), "%s: %g", na_fp8_format_name(fs[i]), r[1]);
        na_tensor_free(back), na_tensor_free(q), na_tensor_free(x);
    }
}
