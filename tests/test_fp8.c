/* tests/test_fp8.c — the FP8 dtypes (f8e4m3, f8e5m2): na_cast against PyTorch 2.15's casts,
 * safetensors, the ops' refusal, and na_scaled_mm against torch._scaled_mm.
 *
 * The references are PyTorch's own outputs, kept compact in headers made by the scripts beside
 * this file (tests/fp8_reference.py, tests/fp8_scaled_mm_reference.py; CI has no torch):
 * hashes over 2^24 cast outputs per format, the full decode tables, explicit edge cases, and
 * _scaled_mm outputs for a few shapes (the MNIST MLP's layers among them). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/float8.h"
#include "fp8_reference.h"
#include "fp8_scaled_mm_reference.h"
#include "nanoamp/error.h"
#include "nanoamp/io.h"
#include "nanoamp/ops.h"
#include "nanoamp/tensor.h"
#include "tmpdir.h"

static const na_dtype FMT[2] = {NA_DTYPE_F8E4M3, NA_DTYPE_F8E5M2};

/* The test set's pattern i (tests/fp8_reference.py: bulk_bits). */
static uint32_t bulk_bits(uint32_t i) { return i << 8 | (uint32_t)(i * 2654435761u) >> 24; }

/* The reference's hash of one block of codes (fp8_reference.py: block_hashes). */
static uint64_t block_hash(const uint8_t *codes, int64_t first, int64_t n) {
    uint64_t h = 0;
    for (int64_t j = 0; j < n; j++) {
        uint64_t i = (uint64_t)(first + j);
        h += ((uint64_t)codes[j] + 1) * (((i * 2246822519u) & 0xFFFFFFFFu) | 1u);
    }
    return h;
}

/* x (host, numel values of dtype src) through na_cast to dst, back in host memory. */
static na_tensor *cast_host(na_dtype src, const void *x, int64_t numel, na_dtype dst) {
    na_tensor *t = na_from_host(src, NA_DEVICE_CPU, NA_SHAPE(numel), x);
    cr_assert(t, "%s", na_last_error());
    na_tensor *c = na_cast(t, dst);
    cr_assert(c && c->dtype == dst, "na_cast %s -> %s: %s", na_dtype_name(src),
              na_dtype_name(dst), na_last_error());
    return c;
}

Test(fp8, dtype_names_and_sizes) {
    cr_expect_str_eq(na_dtype_name(NA_DTYPE_F8E4M3), "f8e4m3");
    cr_expect_str_eq(na_dtype_name(NA_DTYPE_F8E5M2), "f8e5m2");
    cr_expect_eq(na_dtype_size(NA_DTYPE_F8E4M3), 1);
    cr_expect_eq(na_dtype_size(NA_DTYPE_F8E5M2), 1);
    cr_expect(na_dtype_is_fp8(NA_DTYPE_F8E5M2) && !na_dtype_is_fp8(NA_DTYPE_BF16));
    cr_expect(!na_dtype_is_float(NA_DTYPE_F8E4M3)); /* storage: no op computes in it */
    cr_expect_str_eq(na_safetensors_dtype_name(NA_DTYPE_F8E4M3), "F8_E4M3");
    cr_expect_str_eq(na_safetensors_dtype_name(NA_DTYPE_F8E5M2), "F8_E5M2");
}

/* 2^24 f32 patterns (every sign / exponent / top-15-mantissa prefix), both formats, through
 * na_cast, hashed per block as the reference was. */
Test(fp8, f32_to_fp8_matches_pytorch_on_2pow24_patterns, .timeout = 120) {
    const int64_t n = (int64_t)1 << 24;
    uint32_t *x = malloc((size_t)n * 4);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) x[i] = bulk_bits((uint32_t)i);
    for (int f = 0; f < 2; f++) {
        na_tensor *c = cast_host(NA_DTYPE_F32, x, n, FMT[f]);
        const uint8_t *codes = c->data;
        int bad = 0;
        for (int64_t b = 0; b < n / NA_REF_BLOCK; b++) {
            if (block_hash(codes + b * NA_REF_BLOCK, b * NA_REF_BLOCK, NA_REF_BLOCK) ==
                na_ref_bulk_hash[f][b])
                continue;
            if (bad++ < 3)
                cr_log_error("%s: block %" PRId64 " (patterns 0x%08x..) differs from PyTorch",
                             na_dtype_name(FMT[f]), b, bulk_bits((uint32_t)(b * NA_REF_BLOCK)));
        }
        cr_expect_eq(bad, 0, "%s: %d of 256 blocks differ", na_dtype_name(FMT[f]), bad);
        /* the scalar function the CUDA kernels run gives the same codes */
        int diff = 0;
        for (int64_t i = 0; i < n; i += 97) {
            float v;
            memcpy(&v, &x[i], 4);
            uint8_t s = f ? na_f32_to_e5m2_bits(v) : na_f32_to_e4m3_bits(v);
            diff += s != codes[i];
        }
        cr_expect_eq(diff, 0, "%s: the common scalar conversion differs from na_cast",
                     na_dtype_name(FMT[f]));
        na_step_end();
    }
    free(x);
}

Test(fp8, f32_edge_cases_match_pytorch) {
    const int64_t n = (int64_t)(sizeof na_ref_f32_edges / sizeof na_ref_f32_edges[0]);
    cr_assert_gt(n, 2000); /* every FP8 value's neighbours and midpoints, both formats */
    uint32_t *x = malloc((size_t)n * 4);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) x[i] = na_ref_f32_edges[i].bits;
    for (int f = 0; f < 2; f++) {
        const uint8_t *codes = cast_host(NA_DTYPE_F32, x, n, FMT[f])->data;
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            uint8_t want = f ? na_ref_f32_edges[i].e5m2 : na_ref_f32_edges[i].e4m3;
            if (codes[i] != want && bad++ < 10)
                cr_log_error("%s: f32 0x%08x -> 0x%02x, PyTorch 0x%02x", na_dtype_name(FMT[f]),
                             x[i], codes[i], want);
        }
        cr_expect_eq(bad, 0, "%s: %d edge cases differ", na_dtype_name(FMT[f]), bad);
    }
    free(x);
    na_step_end();
}

/* PyTorch's rules, spelled out (also in the edge table, but named here) */
Test(fp8, saturation_and_overflow_rules) {
    cr_expect_eq(na_f32_to_e4m3_bits(INFINITY), 0x7E);   /* +inf -> 448 */
    cr_expect_eq(na_f32_to_e4m3_bits(-INFINITY), 0xFE);
    cr_expect_eq(na_f32_to_e4m3_bits(1e30f), 0x7E);
    cr_expect_eq(na_f32_to_e4m3_bits(NAN), 0x7F);
    cr_expect_eq(na_f32_to_e4m3_bits(0x1p-10f), 0x00);   /* half the smallest subnormal */
    cr_expect_eq(na_f32_to_e5m2_bits(61440.0f), 0x7C);   /* the midpoint above 57344 -> inf */
    cr_expect_eq(na_f32_to_e5m2_bits(61439.0f), 0x7B);
    cr_expect_eq(na_f32_to_e5m2_bits(-INFINITY), 0xFC);
    cr_expect_eq(na_e4m3_bits_to_f32(0x7E), 448.0f);
    cr_expect_eq(na_e5m2_bits_to_f32(0x7B), 57344.0f);
    cr_expect_eq(na_e4m3_bits_to_f32(0x01), 0x1p-9f);
    cr_expect_eq(na_e5m2_bits_to_f32(0x01), 0x1p-16f);
}

/* f64 goes through f32 (double rounding, as PyTorch); f16 and bf16 exhaustively. */
Test(fp8, f64_f16_bf16_sources_match_pytorch) {
    const int64_t n = (int64_t)(sizeof na_ref_f64_edges / sizeof na_ref_f64_edges[0]);
    uint64_t *x = malloc((size_t)n * 8);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) x[i] = na_ref_f64_edges[i].bits;
    uint16_t all[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    for (int f = 0; f < 2; f++) {
        const uint8_t *codes = cast_host(NA_DTYPE_F64, x, n, FMT[f])->data;
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            uint8_t want = f ? na_ref_f64_edges[i].e5m2 : na_ref_f64_edges[i].e4m3;
            if (codes[i] != want && bad++ < 10)
                cr_log_error("%s: f64 0x%016" PRIx64 " -> 0x%02x, PyTorch 0x%02x",
                             na_dtype_name(FMT[f]), x[i], codes[i], want);
        }
        cr_expect_eq(bad, 0, "%s: %d f64 cases differ", na_dtype_name(FMT[f]), bad);
        cr_expect_eq(block_hash(cast_host(NA_DTYPE_F16, all, 65536, FMT[f])->data, 0, 65536),
                     na_ref_f16_hash[f], "%s: f16 sources differ", na_dtype_name(FMT[f]));
        cr_expect_eq(block_hash(cast_host(NA_DTYPE_BF16, all, 65536, FMT[f])->data, 0, 65536),
                     na_ref_bf16_hash[f], "%s: bf16 sources differ", na_dtype_name(FMT[f]));
    }
    free(x);
    na_step_end();
}

/* Every byte back to f32, bf16, f16 and f64. f16 NaNs: PyTorch keeps f32 payload bits there
 * (0x7F80 for an E4M3 NaN), nanoamp's f32 -> f16 rule gives sign | 0x7E00 for every NaN
 * (common/half.h), so for NaNs only NaN-ness and sign are compared. */
Test(fp8, decode_every_byte_matches_pytorch) {
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i;
    for (int f = 0; f < 2; f++) {
        const char *nm = na_dtype_name(FMT[f]);
        const uint32_t *d32 = cast_host(FMT[f], bytes, 256, NA_DTYPE_F32)->data;
        const uint16_t *dbf = cast_host(FMT[f], bytes, 256, NA_DTYPE_BF16)->data;
        const uint16_t *d16 = cast_host(FMT[f], bytes, 256, NA_DTYPE_F16)->data;
        const double *d64 = cast_host(FMT[f], bytes, 256, NA_DTYPE_F64)->data;
        for (int i = 0; i < 256; i++) {
            cr_expect_eq(d32[i], na_ref_decode_f32[f][i], "%s 0x%02x -> f32 0x%08x, PyTorch 0x%08x",
                         nm, i, d32[i], na_ref_decode_f32[f][i]);
            cr_expect_eq(dbf[i], na_ref_decode_bf16[f][i], "%s 0x%02x -> bf16 0x%04x, PyTorch "
                         "0x%04x", nm, i, dbf[i], na_ref_decode_bf16[f][i]);
            uint16_t w = na_ref_decode_f16[f][i];
            bool nan = (w & 0x7C00) == 0x7C00 && (w & 0x3FF);
            if (nan)
                cr_expect((d16[i] & 0x7C00) == 0x7C00 && (d16[i] & 0x3FF) &&
                          (d16[i] & 0x8000) == (w & 0x8000), "%s 0x%02x -> f16 0x%04x", nm, i,
                          d16[i]);
            else
                cr_expect_eq(d16[i], w, "%s 0x%02x -> f16 0x%04x, PyTorch 0x%04x", nm, i,
                             d16[i], w);
            float v32;
            memcpy(&v32, &na_ref_decode_f32[f][i], 4);
            cr_expect(d64[i] == (double)v32 || (isnan(d64[i]) && isnan(v32)), "%s 0x%02x -> f64",
                      nm, i);
            /* and back: every finite byte (and E5M2's infinities) round-trips */
            if (!isnan(v32)) cr_expect_eq(f ? na_f32_to_e5m2_bits(v32) : na_f32_to_e4m3_bits(v32), i);
        }
        na_step_end();
    }
}

Test(fp8, fill_and_item) {
    na_tensor *t = na_full(NA_DTYPE_F8E4M3, NA_DEVICE_CPU, NA_SHAPE(3), 1000.0);
    cr_assert(t, "%s", na_last_error());
    cr_expect_eq(((uint8_t *)t->data)[2], 0x7E); /* saturated, as a cast */
    cr_expect_eq(na_item(na_full(NA_DTYPE_F8E5M2, NA_DEVICE_CPU, NA_SHAPE(1), 0.3)), 0.3125);
    na_step_end();
}

static void cleanup(void) { rm_rf(tmpdir); }

Test(fp8, safetensors_round_trip, .init = make_tmpdir, .fini = cleanup) {
    char path[300];
    snprintf(path, sizeof path, "%s/fp8.safetensors", tmpdir);
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i;
    na_tensor *a = na_tensor_new(NA_DTYPE_F8E4M3, NA_DEVICE_CPU, NA_SHAPE(16, 16));
    na_tensor *b = na_tensor_new(NA_DTYPE_F8E5M2, NA_DEVICE_CPU, NA_SHAPE(256));
    memcpy(a->data, bytes, 256);
    memcpy(b->data, bytes, 256);
    na_checkpoint *ck = na_checkpoint_new();
    cr_assert(na_checkpoint_add(ck, "a", a) == NA_OK && na_checkpoint_add(ck, "b", b) == NA_OK,
              "%s", na_last_error());
    cr_assert_eq(na_checkpoint_save(ck, path), NA_OK, "%s", na_last_error());
    na_checkpoint_free(ck);
    /* the header names them as the safetensors package does */
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    char head[1024] = {0};
    size_t got = fread(head, 1, sizeof head - 1, fp);
    fclose(fp);
    cr_assert_gt(got, 8);
    for (size_t i = 0; i < got; i++) head[i] = head[i] ? head[i] : ' '; /* the 8-byte length */
    cr_expect(strstr(head, "\"F8_E4M3\"") && strstr(head, "\"F8_E5M2\""), "header: %s", head + 8);
    na_checkpoint *in = na_checkpoint_load(path);
    cr_assert(in, "%s", na_last_error());
    na_tensor *a2 = na_tensor_new(NA_DTYPE_F8E4M3, NA_DEVICE_CPU, NA_SHAPE(16, 16));
    na_tensor *b2 = na_tensor_new(NA_DTYPE_F8E5M2, NA_DEVICE_CPU, NA_SHAPE(256));
    cr_assert(na_checkpoint_copy_into(in, "a", a2) == NA_OK &&
              na_checkpoint_copy_into(in, "b", b2) == NA_OK, "%s", na_last_error());
    cr_expect_arr_eq(a2->data, bytes, 256);
    cr_expect_arr_eq(b2->data, bytes, 256);
    na_checkpoint_free(in);
    na_tensor_free(a), na_tensor_free(b), na_tensor_free(a2), na_tensor_free(b2);
}

/* An op that does not compute in FP8 says which op and which dtype. */
static void expect_refused(na_tensor *r, const char *op, const char *dt) {
    cr_expect_null(r, "%s accepted an %s tensor", op, dt);
    cr_expect(strstr(na_last_error(), op) && strstr(na_last_error(), dt), "%s: message '%s'", op,
              na_last_error());
    cr_expect_eq(na_last_status(), NA_EDTYPE);
}

Test(fp8, ops_refuse_fp8_naming_op_and_dtype) {
    na_tensor *x = na_zeros(NA_DTYPE_F8E4M3, NA_DEVICE_CPU, NA_SHAPE(2, 2));
    na_tensor *y = na_zeros(NA_DTYPE_F8E5M2, NA_DEVICE_CPU, NA_SHAPE(2, 2));
    cr_assert(x && y, "%s", na_last_error());
    expect_refused(na_add(x, x), "na_add", "f8e4m3");
    expect_refused(na_relu(y), "na_relu", "f8e5m2");
    expect_refused(na_matmul(x, x), "na_matmul", "f8e4m3");
    expect_refused(na_sum(y), "na_sum", "f8e5m2");
    na_tensor *w = na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 2));
    expect_refused(na_linear(w, x, NULL), "na_linear", "f8e4m3");
    na_step_end();
}

/* ---- na_scaled_mm vs torch._scaled_mm ----------------------------------------------------- */

/* fp8_scaled_mm_reference.py: operand */
static uint8_t operand_byte(int e5m2, int64_t i, int seed) {
    uint8_t b = (uint8_t)((uint32_t)((uint64_t)(i + 7919 * seed) * 2654435761u) >> 24);
    if (!e5m2 && (b & 0x7F) == 0x7F) b ^= 0x08;
    if (e5m2 && (b & 0x7C) == 0x7C) b ^= 0x40;
    return b;
}

static float fp8_value(int e5m2, uint8_t b) {
    return e5m2 ? na_e5m2_bits_to_f32(b) : na_e4m3_bits_to_f32(b);
}

/* Tolerance: the result of an f32 accumulation in another order differs by at most about
 * k * 2^-24 * sum|a_ik b_kj| (times the scales), so each element is allowed
 * 2^-24 * k * sum|terms| * |sa sb| (+ 1 ulp of the output for bf16, whose rounding can flip
 * when the f32 sums differ). The worst ratio seen is logged. */
Test(fp8, scaled_mm_matches_torch_scaled_mm) {
    for (size_t c = 0; c < sizeof na_ref_mm_cases / sizeof na_ref_mm_cases[0]; c++) {
        __typeof__(na_ref_mm_cases[0]) *r = &na_ref_mm_cases[c];
        int64_t m = r->m, k = r->k, n = r->n;
        uint8_t *ab = malloc((size_t)(m * k)), *bb = malloc((size_t)(n * k));
        float *bias = malloc((size_t)n * sizeof(float));
        cr_assert(ab && bb && bias);
        for (int64_t i = 0; i < m * k; i++) ab[i] = operand_byte(r->a_e5m2, i, 2 * r->case_index);
        for (int64_t i = 0; i < n * k; i++) bb[i] = operand_byte(r->b_e5m2, i, 2 * r->case_index + 1);
        for (int64_t j = 0; j < n; j++) {
            uint64_t h = ((uint64_t)((uint64_t)j * 2654435761u + (uint64_t)r->case_index) &
                          0xFFFFFFFFu) >> 8;
            bias[j] = (float)((int64_t)(h % 201) - 100) / 8.0f;
        }
        na_dtype od = r->bf16_out ? NA_DTYPE_BF16 : NA_DTYPE_F32;
        na_tensor *a = na_from_host(r->a_e5m2 ? NA_DTYPE_F8E5M2 : NA_DTYPE_F8E4M3, NA_DEVICE_CPU,
                                    NA_SHAPE(m, k), ab);
        na_tensor *w = na_from_host(r->b_e5m2 ? NA_DTYPE_F8E5M2 : NA_DTYPE_F8E4M3, NA_DEVICE_CPU,
                                    NA_SHAPE(n, k), bb);
        na_tensor *sa = na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, r->scale_a);
        na_tensor *sb = na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, r->scale_b);
        /* bias 1: in the output's dtype; 2: f32 (added in f32 before the bf16 rounding) */
        na_tensor *bt = r->bias ? na_cast(na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n),
                                                       bias), r->bias == 2 ? NA_DTYPE_F32 : od)
                                : NULL;
        na_tensor *y = na_scaled_mm(a, na_transpose(w, 0, 1), sa, sb, bt, od);
        cr_assert(y, "%s: %s", r->name, na_last_error());
        cr_assert(y->dtype == od && y->shape[0] == m && y->shape[1] == n);
        const float *yf = na_cast(y, NA_DTYPE_F32)->data;
        double worst = 0;
        int bad = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double mag = 0;
                for (int64_t q = 0; q < k; q++)
                    mag += fabs((double)fp8_value(r->a_e5m2, ab[i * k + q]) *
                                fp8_value(r->b_e5m2, bb[j * k + q]));
                float want;
                memcpy(&want, &r->out[i * n + j], 4);
                double tol = ldexp((double)k * mag * fabs((double)r->scale_a * r->scale_b), -24) +
                             (r->bf16_out ? ldexp(fabs(want), -8) : 0) + 1e-30;
                double err = fabs((double)yf[i * n + j] - want);
                if (err / tol > worst) worst = err / tol;
                if (err > tol && bad++ < 5)
                    cr_log_error("%s [%" PRId64 ",%" PRId64 "]: %.9g, torch %.9g (tol %.3g)",
                                 r->name, i, j, yf[i * n + j], want, tol);
            }
        cr_expect_eq(bad, 0, "%s: %d of %" PRId64 " elements out of tolerance", r->name, bad, m * n);
        cr_log_info("%s: worst |y - torch| / tolerance = %.3g", r->name, worst);
        printf("scaled_mm %s: worst |y - torch| / tolerance = %.3g\n", r->name, worst);
        free(ab), free(bb), free(bias);
        na_step_end();
    }
}

Test(fp8, scaled_mm_bad_input) {
    na_tensor *a = na_zeros(NA_DTYPE_F8E4M3, NA_DEVICE_CPU, NA_SHAPE(4, 8));
    na_tensor *b = na_zeros(NA_DTYPE_F8E4M3, NA_DEVICE_CPU, NA_SHAPE(8, 2));
    na_tensor *f = na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(8, 2));
    na_tensor *s = na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, 1.0);
    na_tensor *s2 = na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
    cr_expect_null(na_scaled_mm(a, f, s, s, NULL, NA_DTYPE_F32));
    cr_expect(strstr(na_last_error(), "na_scaled_mm") && strstr(na_last_error(), "f32"), "%s",
              na_last_error());
    cr_expect_null(na_scaled_mm(a, a, s, s, NULL, NA_DTYPE_F32)); /* inner dims */
    cr_expect_eq(na_last_status(), NA_ESHAPE);
    cr_expect_null(na_scaled_mm(a, b, s2, s, NULL, NA_DTYPE_F32)); /* one scale per tensor */
    cr_expect(strstr(na_last_error(), "scale_a"), "%s", na_last_error());
    cr_expect_null(na_scaled_mm(a, b, s, s, NULL, NA_DTYPE_F16));
    cr_expect(strstr(na_last_error(), "out_dtype") && strstr(na_last_error(), "f16"), "%s",
              na_last_error());
    na_tensor *b3 = na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3));
    cr_expect_null(na_scaled_mm(a, b, s, s, b3, NA_DTYPE_BF16)); /* bias shape */
    cr_expect(strstr(na_last_error(), "bias"), "%s", na_last_error());
    cr_expect_null(na_scaled_mm(a, b, s, s, na_zeros(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2)),
                                NA_DTYPE_F32)); /* bias dtype */
    cr_expect(strstr(na_last_error(), "bias") && strstr(na_last_error(), "i32"), "%s",
              na_last_error());
    na_step_end();
}
