/* tests/test_io.c — safetensors checkpoints: byte-exact output (vectors from safetensors' own
 * tests), bit-exact round trips of every dtype, every corruption class rejected with the right
 * message, atomic saves that leave the previous file intact, and the convenience calls. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nanoamp/cuda.h"
#include "nanoamp/error.h"
#include "nanoamp/io.h"
#include "nanoamp/tensor.h"
#include "src/data/splitmix.h"
#include "tmpdir.h"

/* ---- helpers ------------------------------------------------------------------------------ */


static void cleanup(void) {
    na_step_end();
    rm_rf(tmpdir);
}

TestSuite(checkpoint, .init = make_tmpdir, .fini = cleanup);

static const char *tpath(const char *name) {
    static char bufs[64][512];
    static int k;
    char *b = bufs[k++ % 64];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void write_raw(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    if (n) cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* A safetensors file from a header string (length field = strlen unless n_override) and
 * `data_len` data bytes (0x11, 0x22, ...). */
static void write_st(const char *path, const char *header, size_t data_len, uint64_t n_override,
                     bool use_override) {
    size_t hl = strlen(header);
    uint64_t n = use_override ? n_override : hl;
    size_t total = 8 + hl + data_len;
    uint8_t *b = malloc(total);
    for (int k = 0; k < 8; k++) b[k] = (uint8_t)(n >> (8 * k));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)(0x11 * (i + 1));
    write_raw(path, b, total);
    free(b);
}

#define assert_msg_has(s) \
    cr_assert(strstr(na_last_error(), (s)) != NULL, "message lacks \"%s\": %s", (s), na_last_error())

static void expect_load_fail(const char *header, size_t data_len, const char *const *parts) {
    const char *p = tpath("bad.safetensors");
    write_st(p, header, data_len, 0, false);
    na_clear_error();
    na_checkpoint *ck = na_checkpoint_load(p);
    cr_assert_null(ck, "accepted: %s", header);
    cr_assert_eq(na_last_status(), NA_EFORMAT, "status %d for %s: %s", na_last_status(), header,
                 na_last_error());
    assert_msg_has("na_checkpoint_load");
    assert_msg_has(p);
    for (int i = 0; parts && parts[i]; i++) assert_msg_has(parts[i]);
}

static void expect_load_ok(const char *header, size_t data_len) {
    const char *p = tpath("ok.safetensors");
    write_st(p, header, data_len, 0, false);
    na_checkpoint *ck = na_checkpoint_load(p);
    cr_assert_not_null(ck, "rejected %s: %s", header, na_last_error());
    na_checkpoint_free(ck);
}

/* ---- byte-exact output: the vectors of safetensors' own tests (tensor.rs) ------------------- */

Test(checkpoint, writes_the_same_bytes_as_safetensors) {
    const float v[6] = {0, 1, 2, 3, 4, 5};
    static const uint8_t attn_0[] = {
        64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100,
        116, 121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34,
        58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115,
        101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63,
        0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};
    static const uint8_t attn0_aligned[] = {
        72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116,
        121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58,
        91, 49, 44, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102,
        115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 32, 32, 32, 32, 32,
        32, 32, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0,
        160, 64};
    static const uint8_t empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
    static const uint8_t empty_meta[] = {
        40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95,
        95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112,
        116, 34, 125, 125, 32, 32, 32, 32, 32};
    struct {
        const char *name;
        int ndim;
        int64_t shape[4];
        const char *meta;
        const uint8_t *want;
        size_t len;
    } cases[] = {
        {"attn.0", 3, {1, 2, 3}, NULL, attn_0, sizeof attn_0},
        {"attn0", 4, {1, 1, 2, 3}, NULL, attn0_aligned, sizeof attn0_aligned},
        {NULL, 0, {0}, NULL, empty, sizeof empty},
        {NULL, 0, {0}, "pt", empty_meta, sizeof empty_meta},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        na_checkpoint *ck = na_checkpoint_new();
        if (cases[c].name)
            cr_assert_eq(na_checkpoint_add_host(ck, cases[c].name, NA_DTYPE_F32, cases[c].ndim,
                                                cases[c].shape, v),
                         NA_OK);
        if (cases[c].meta) na_checkpoint_set_meta(ck, "framework", cases[c].meta);
        cr_assert_eq(na_checkpoint_save(ck, tpath("v.safetensors")), NA_OK, "%s", na_last_error());
        na_checkpoint_free(ck);
        size_t len;
        uint8_t *got = read_all(tpath("v.safetensors"), &len);
        cr_assert_eq(len, cases[c].len, "case %zu: %zu bytes, want %zu", c, len, cases[c].len);
        cr_assert_eq(memcmp(got, cases[c].want, len), 0, "case %zu differs", c);
        free(got);
        ck = na_checkpoint_load(tpath("v.safetensors"));
        cr_assert_not_null(ck, "%s", na_last_error());
        na_checkpoint_free(ck);
    }
}

/* ---- round trips -------------------------------------------------------------------------- */

Test(checkpoint, round_trip_is_bit_exact_for_every_dtype) {
    const uint64_t f64[] = {0x7FF8000000000123ull /* NaN with payload */, 0xFFF0000000000001ull,
                            0x8000000000000000ull /* -0 */, 0x7FF0000000000000ull,
                            0x0000000000000001ull /* denormal */, 0x3FF0000000000000ull};
    const uint32_t f32[] = {0x7FC00001u, 0x7F800001u /* signalling NaN */, 0xFFFFFFFFu,
                            0x80000000u, 0x00000001u, 0x3F800000u, 0x7F7FFFFFu, 0xFF800000u};
    const uint16_t f16[] = {0x7E01, 0x7C01, 0xFE00, 0x8000, 0x0001, 0x3C00, 0x7BFF, 0xFC00};
    const uint16_t bf16[] = {0x7FC1, 0x7F81, 0xFFFF, 0x8000, 0x0001, 0x3F80};
    const int32_t i32[] = {INT32_MIN, -1, 0, 1, INT32_MAX, 123456789};
    uint8_t u8[256];
    for (int k = 0; k < 256; k++) u8[k] = (uint8_t)k;
    const float scalar = -0.0f;

    struct {
        const char *name;
        na_dtype dt;
        int ndim;
        int64_t shape[3];
        const void *data;
        size_t bytes;
    } t[] = {
        {"w.f64", NA_DTYPE_F64, 2, {2, 3}, f64, sizeof f64},
        {"w.f32", NA_DTYPE_F32, 3, {2, 2, 2}, f32, sizeof f32},
        {"w.f16", NA_DTYPE_F16, 1, {8}, f16, sizeof f16},
        {"w.bf16", NA_DTYPE_BF16, 2, {3, 2}, bf16, sizeof bf16},
        {"labels", NA_DTYPE_I32, 1, {6}, i32, sizeof i32},
        {"bytes", NA_DTYPE_U8, 2, {16, 16}, u8, sizeof u8},
        {"scalar", NA_DTYPE_F32, 0, {0}, &scalar, 4},
        {"empty", NA_DTYPE_F16, 1, {0}, NULL, 0},
        {"empty2", NA_DTYPE_F64, 2, {3, 0}, NULL, 0},
    };
    enum { NT = sizeof t / sizeof t[0] };
    na_tensor *src[NT];
    na_checkpoint *ck = na_checkpoint_new();
    for (int i = 0; i < NT; i++) {
        src[i] = na_tensor_new(t[i].dt, NA_DEVICE_CPU, t[i].ndim, t[i].shape);
        cr_assert_not_null(src[i], "%s: %s", t[i].name, na_last_error());
        if (t[i].bytes) cr_assert_eq(na_copy_from_host(src[i], t[i].data), NA_OK);
        cr_assert_eq(na_checkpoint_add(ck, t[i].name, src[i]), NA_OK, "%s", na_last_error());
    }
    cr_assert_eq(na_checkpoint_set_meta(ck, "epoch", "3"), NA_OK);
    cr_assert_eq(na_checkpoint_set_meta(ck, "note", "quote \" backslash \\ newline \n tab \t "
                                                    "ctrl \x01 unicode \xc3\xa9\xe2\x82\xac"),
                 NA_OK);
    cr_assert_eq(na_checkpoint_set_meta(ck, "epoch", "4"), NA_OK); /* replaces */
    cr_assert_eq(na_checkpoint_count(ck), NT);
    cr_assert_eq(na_checkpoint_save(ck, tpath("rt.safetensors")), NA_OK, "%s", na_last_error());
    na_checkpoint_free(ck);

    ck = na_checkpoint_load(tpath("rt.safetensors"));
    cr_assert_not_null(ck, "%s", na_last_error());
    cr_assert_eq(na_checkpoint_count(ck), NT);
    cr_assert_str_eq(na_checkpoint_get_meta(ck, "epoch"), "4");
    cr_assert_str_eq(na_checkpoint_get_meta(ck, "note"),
                     "quote \" backslash \\ newline \n tab \t ctrl \x01 unicode \xc3\xa9\xe2\x82\xac");
    cr_assert_null(na_checkpoint_get_meta(ck, "missing"));
    cr_assert_eq(na_checkpoint_meta_count(ck), 2);
    for (int i = 0; i < NT; i++) {
        na_checkpoint_entry e;
        cr_assert_eq(na_checkpoint_get(ck, t[i].name, &e), NA_OK, "%s", na_last_error());
        cr_assert_str_eq(e.name, t[i].name);
        cr_assert_eq(e.dtype, t[i].dt);
        cr_assert_eq(e.ndim, t[i].ndim);
        for (int d = 0; d < e.ndim; d++) cr_assert_eq(e.shape[d], t[i].shape[d]);
        cr_assert_eq(e.nbytes, t[i].bytes);
        cr_assert_eq(e.numel, (int64_t)(t[i].bytes / na_dtype_size(t[i].dt)));
        if (e.nbytes) {
            cr_assert_eq(memcmp(e.data, t[i].data, e.nbytes), 0, "%s differs", t[i].name);
            cr_assert_eq((uintptr_t)e.data % na_dtype_size(e.dtype), 0, "misaligned");
        }
        /* into a fresh tensor, then back */
        na_tensor *dst = na_tensor_new(t[i].dt, NA_DEVICE_CPU, t[i].ndim, t[i].shape);
        cr_assert_eq(na_checkpoint_copy_into(ck, t[i].name, dst), NA_OK, "%s", na_last_error());
        if (t[i].bytes) {
            uint8_t back[2048];
            cr_assert_eq(na_copy_to_host(dst, back), NA_OK);
            cr_assert_eq(memcmp(back, t[i].data, t[i].bytes), 0, "%s differs", t[i].name);
        }
        na_tensor_free(dst);
    }
    /* file order: by dtype alignment, then name; offsets contiguous */
    const char *order[] = {"empty2", "w.f64", "scalar", "w.f32", "labels", "w.bf16",
                           "empty",  "w.f16", "bytes"};
    size_t len;
    char *raw = (char *)read_all(tpath("rt.safetensors"), &len);
    raw[len - 1] = 0;
    const char *prev = raw + 8;
    for (int i = 0; i < NT; i++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\":{", order[i]);
        const char *at = strstr(raw + 8, key);
        cr_assert_not_null(at, "%s missing", order[i]);
        cr_assert_gt(at, prev, "%s out of order", order[i]);
        prev = at;
    }
    cr_assert_not_null(strstr(raw + 8, "{\"__metadata__\":{\"epoch\":\"4\",\"note\":\"quote \\\" "
                                       "backslash \\\\ newline \\n tab \\t ctrl \\u0001 unicode "));
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)(uint8_t)raw[k] << (8 * k);
    cr_assert_eq(hl % 8, 0);
    free(raw);
    na_checkpoint_free(ck);
    for (int i = 0; i < NT; i++) na_tensor_free(src[i]);
}

Test(checkpoint, saves_views_in_c_order) {
    const float v[6] = {1, 2, 3, 4, 5, 6};
    na_tensor *x = na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2, 3), v);
    na_tensor *xt = na_transpose(x, 0, 1); /* [3, 2]: 1 4 2 5 3 6 */
    cr_assert_not_null(xt, "%s", na_last_error());
    na_checkpoint *ck = na_checkpoint_new();
    cr_assert_eq(na_checkpoint_add(ck, "xt", xt), NA_OK);
    cr_assert_eq(na_checkpoint_save(ck, tpath("view.safetensors")), NA_OK, "%s", na_last_error());
    na_checkpoint_free(ck);
    ck = na_checkpoint_load(tpath("view.safetensors"));
    na_checkpoint_entry e;
    cr_assert_eq(na_checkpoint_get(ck, "xt", &e), NA_OK);
    const float want[6] = {1, 4, 2, 5, 3, 6};
    cr_assert_eq(e.ndim, 2);
    cr_assert_eq(e.shape[0], 3);
    cr_assert_eq(memcmp(e.data, want, sizeof want), 0);
    na_checkpoint_free(ck);
}

Test(checkpoint, copy_into_names_the_mismatch) {
    na_tensor *w = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(10, 128));
    na_checkpoint *ck = na_checkpoint_new();
    na_checkpoint_add(ck, "fc.weight", w);
    cr_assert_eq(na_checkpoint_save(ck, tpath("m.safetensors")), NA_OK);
    na_checkpoint_free(ck);
    ck = na_checkpoint_load(tpath("m.safetensors"));
    cr_assert_not_null(ck);

    na_tensor *small = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(10, 64));
    cr_assert_eq(na_checkpoint_copy_into(ck, "fc.weight", small), NA_ESHAPE);
    assert_msg_has("checkpoint tensor 'fc.weight' has shape [10, 128] but the model's is [10, 64]");
    assert_msg_has(tpath("m.safetensors"));

    na_tensor *half = na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(10, 128));
    cr_assert_eq(na_checkpoint_copy_into(ck, "fc.weight", half), NA_EDTYPE);
    assert_msg_has("checkpoint tensor 'fc.weight' has dtype f32 but the model's is f16");

    cr_assert_eq(na_checkpoint_copy_into(ck, "fc.bias", small), NA_EINVAL);
    assert_msg_has("no tensor 'fc.bias'");
    na_checkpoint_entry e;
    cr_assert_eq(na_checkpoint_get(ck, "fc.bias", &e), NA_EINVAL);
    cr_assert(!na_checkpoint_has(ck, "fc.bias"));
    cr_assert(na_checkpoint_has(ck, "fc.weight"));
    cr_assert_eq(na_checkpoint_entry_at(ck, 0, &e), NA_OK);
    cr_assert_str_eq(e.name, "fc.weight");
    cr_assert_eq(na_checkpoint_entry_at(ck, 1, &e), NA_EINVAL);
    na_checkpoint_free(ck);
    na_tensor_free(w);
    na_tensor_free(small);
    na_tensor_free(half);
}

/* na_checkpoint_check_finite finds the first inf or NaN of every float dtype from its bits
 * and names the file, the tensor and the element; integers and finite values pass. */
Test(checkpoint, check_finite_names_the_first_bad_element) {
    const na_dtype dts[] = {NA_DTYPE_F64, NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_BF16};
    const double bad[] = {NAN, INFINITY, -INFINITY};
    const char *said[] = {"nan", "inf", "-inf"};
    for (size_t d = 0; d < 4; d++)
        for (size_t b = 0; b < 3; b++) {
            na_tensor *t = na_tensor_new(dts[d], NA_DEVICE_CPU, NA_SHAPE(3, 5));
            na_tensor *ok = na_tensor_new(dts[d], NA_DEVICE_CPU, NA_SHAPE(4));
            na_tensor *ints = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2));
            double v[15];
            for (int k = 0; k < 15; k++) v[k] = dts[d] == NA_DTYPE_F16 ? 65504.0 : 1e30; /* max-ish */
            v[7] = bad[b], v[11] = NAN;
            na_tensor *f64 = na_from_host(NA_DTYPE_F64, NA_DEVICE_CPU, 2, (int64_t[]){3, 5}, v);
            cr_assert_eq(na_copy_(t, f64), NA_OK, "%s", na_last_error());
            na_fill_(ok, -2.5), na_fill_(ints, -1);
            na_checkpoint *ck = na_checkpoint_new();
            na_checkpoint_add(ck, "w", t), na_checkpoint_add(ck, "ok", ok);
            na_checkpoint_add(ck, "i", ints);
            cr_assert_eq(na_checkpoint_save(ck, tpath("f.safetensors")), NA_OK);
            na_checkpoint_free(ck);
            ck = na_checkpoint_load(tpath("f.safetensors"));
            cr_assert_not_null(ck, "%s", na_last_error());
            cr_assert_eq(na_checkpoint_check_finite(ck, "ok"), NA_OK, "%s", na_last_error());
            cr_assert_eq(na_checkpoint_check_finite(ck, "i"), NA_OK, "%s", na_last_error());
            cr_assert_eq(na_checkpoint_check_finite(ck, "w"), NA_EINVAL, "%s %s accepted",
                         na_dtype_name(dts[d]), said[b]);
            char want[256];
            snprintf(want, sizeof want, "tensor 'w' holds %s at element 7 (of 15)", said[b]);
            assert_msg_has(want);
            assert_msg_has(tpath("f.safetensors"));
            cr_assert_eq(na_checkpoint_check_finite(ck, "nope"), NA_EINVAL);
            na_checkpoint_free(ck);
            na_tensor_free(t), na_tensor_free(ok), na_tensor_free(ints);
        }
}

/* A state dict as PyTorch + safetensors write it: BatchNorm's num_batches_tracked is I64
 * (and I64 sorts first), plus an I64 vector with values that do not fit everywhere. */
static void write_torch_style(const char *path) {
    const char *header =
        "{\"big\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
        "\"bn.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]},"
        "\"bn.running_mean\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[32,40]}}";
    const int64_t ints[4] = {7, -1, 3000000001LL, 1234};
    const float mean[2] = {0.5f, -2.0f};
    size_t hl = strlen(header), total = 8 + hl + sizeof ints + sizeof mean;
    uint8_t *b = malloc(total);
    for (int k = 0; k < 8; k++) b[k] = (uint8_t)((uint64_t)hl >> (8 * k));
    memcpy(b + 8, header, hl);
    memcpy(b + 8 + hl, ints, sizeof ints); /* the host is little-endian, as the format */
    memcpy(b + 8 + hl + sizeof ints, mean, sizeof mean);
    write_raw(path, b, total);
    free(b);
}

Test(checkpoint, i64_tensors_from_pytorch_convert_where_the_values_fit) {
    const char *p = tpath("torch.safetensors");
    write_torch_style(p);
    na_checkpoint *ck = na_checkpoint_load(p);
    cr_assert_not_null(ck, "%s", na_last_error());
    na_checkpoint_entry e;
    cr_assert_eq(na_checkpoint_get(ck, "bn.num_batches_tracked", &e), NA_OK);
    cr_assert_eq(e.dtype, NA_DTYPE_COUNT);
    cr_assert_str_eq(e.file_dtype, "I64");
    cr_assert_eq(e.ndim, 0);
    cr_assert_eq(e.nbytes, 8);

    /* the scalar into the model's i32 buffer, and into float tensors that hold 1234 exactly */
    const na_dtype into[] = {NA_DTYPE_I32, NA_DTYPE_F32, NA_DTYPE_F16, NA_DTYPE_F64};
    for (int i = 0; i < 4; i++) {
        na_tensor *t = na_tensor_new(into[i], NA_DEVICE_CPU, 0, NULL);
        cr_assert_eq(na_checkpoint_copy_into(ck, "bn.num_batches_tracked", t), NA_OK, "%s: %s",
                     na_dtype_name(into[i]), na_last_error());
        cr_assert_eq(na_item(t), 1234, "%s", na_dtype_name(into[i]));
        na_tensor_free(t);
    }
    /* bf16 has 8 significant bits: 1234 would become 1232 */
    na_tensor *b16 = na_tensor_new(NA_DTYPE_BF16, NA_DEVICE_CPU, 0, NULL);
    cr_assert_eq(na_checkpoint_copy_into(ck, "bn.num_batches_tracked", b16), NA_EDTYPE);
    assert_msg_has("'bn.num_batches_tracked' (I64) holds 1234 at element 0");
    assert_msg_has("bf16");
    na_tensor_free(b16);

    /* values that do not fit: an error naming the tensor, the value and the element */
    na_tensor *i32 = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(3));
    cr_assert_eq(na_checkpoint_copy_into(ck, "big", i32), NA_EDTYPE);
    assert_msg_has("'big'");
    assert_msg_has("3000000001 at element 2");
    assert_msg_has("i32");
    assert_msg_has(p);
    na_tensor *u8 = na_tensor_new(NA_DTYPE_U8, NA_DEVICE_CPU, NA_SHAPE(3));
    cr_assert_eq(na_checkpoint_copy_into(ck, "big", u8), NA_EDTYPE);
    assert_msg_has("-1 at element 1");
    na_tensor *f32 = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3));
    cr_assert_eq(na_checkpoint_copy_into(ck, "big", f32), NA_EDTYPE);
    assert_msg_has("3000000001 at element 2"); /* 3000000001 needs 32 significant bits */
    na_tensor *f64 = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(3));
    cr_assert_eq(na_checkpoint_copy_into(ck, "big", f64), NA_OK, "%s", na_last_error());
    cr_assert_eq(na_get(f64, 0), 7);
    cr_assert_eq(na_get(f64, 1), -1);
    cr_assert_eq(na_get(f64, 2), 3000000001.0);
    /* the shape is still checked */
    na_tensor *i32x2 = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2));
    cr_assert_eq(na_checkpoint_copy_into(ck, "big", i32x2), NA_ESHAPE);

    /* saving the loaded checkpoint keeps the I64 tensors as they were */
    cr_assert_eq(na_checkpoint_save(ck, tpath("again.safetensors")), NA_OK, "%s", na_last_error());
    na_checkpoint *again = na_checkpoint_load(tpath("again.safetensors"));
    cr_assert_not_null(again, "%s", na_last_error());
    na_checkpoint_entry a;
    cr_assert_eq(na_checkpoint_get(again, "big", &a), NA_OK);
    cr_assert_str_eq(a.file_dtype, "I64");
    cr_assert_eq(memcmp(a.data, (const int64_t[]){7, -1, 3000000001LL}, 24), 0);
    na_checkpoint_free(again);
    na_checkpoint_free(ck);

    /* the model's tensors by name, as a trainer resumes */
    na_tensor *count = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, 0, NULL);
    na_tensor *mean = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
    na_named_tensors bn = {0};
    cr_assert_eq(na_named_tensors_add(&bn, count, "bn.%s", "num_batches_tracked"), NA_OK);
    cr_assert_eq(na_named_tensors_add(&bn, mean, "bn.%s", "running_mean"), NA_OK);
    cr_assert_eq(na_checkpoint_load_list(p, &bn, false), NA_OK, "%s", na_last_error());
    na_named_tensors_free(&bn);
    cr_assert_eq(na_item(count), 1234);
    cr_assert_eq(na_get(mean, 1), -2.0);
    na_tensor_free(count);
    na_tensor_free(mean);
    na_tensor_free(i32);
    na_tensor_free(u8);
    na_tensor_free(f32);
    na_tensor_free(f64);
    na_tensor_free(i32x2);
}

Test(checkpoint, writer_rejects_bad_entries) {
    na_checkpoint *ck = na_checkpoint_new();
    const float v[2] = {1, 2};
    cr_assert_eq(na_checkpoint_add_host(ck, "a", NA_DTYPE_F32, NA_SHAPE(2), v), NA_OK);
    cr_assert_eq(na_checkpoint_add_host(ck, "a", NA_DTYPE_F32, NA_SHAPE(2), v), NA_EINVAL);
    assert_msg_has("already");
    cr_assert_eq(na_checkpoint_add_host(ck, "__metadata__", NA_DTYPE_F32, NA_SHAPE(2), v),
                 NA_EINVAL);
    cr_assert_eq(na_checkpoint_add_host(ck, "bad\xff", NA_DTYPE_F32, NA_SHAPE(2), v), NA_EINVAL);
    assert_msg_has("UTF-8");
    cr_assert_eq(na_checkpoint_add_host(ck, "neg", NA_DTYPE_F32, NA_SHAPE(-1), v), NA_EINVAL);
    cr_assert_eq(na_checkpoint_add_host(ck, "dt", NA_DTYPE_COUNT, NA_SHAPE(2), v), NA_EDTYPE);
    cr_assert_eq(na_checkpoint_add_host(ck, "nodata", NA_DTYPE_F32, NA_SHAPE(2), NULL), NA_EINVAL);
    cr_assert_eq(na_checkpoint_add(ck, "null", NULL), NA_EINVAL);
    cr_assert_eq(na_checkpoint_set_meta(ck, "k", "\xc3"), NA_EINVAL);
    cr_assert_eq(na_checkpoint_count(ck), 1);
    cr_assert_eq(na_checkpoint_save(ck, NULL), NA_EINVAL);
    na_checkpoint_free(ck);
    na_checkpoint_free(NULL);
}

/* ---- hostile files ------------------------------------------------------------------------ */

#define F32_2x3 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}"

Test(checkpoint, accepts_valid_variants) {
    expect_load_ok(F32_2x3, 24);
    expect_load_ok("  \n" F32_2x3 "   \t\r\n", 24);                  /* whitespace around */
    expect_load_ok("{\"a\":{\"data_offsets\":[0,24],\"shape\":[2,3],\"dtype\":\"F32\"}}", 24);
    expect_load_ok("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],"
                   "\"extra\":[1,{\"x\":null},true,-1.5e3,\"s\"]}}", 24);  /* ignored field */
    expect_load_ok("{\"__metadata__\":null,\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                   "\"data_offsets\":[0,24]}}", 24);
    expect_load_ok("{}", 0);
    expect_load_ok("{\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                   "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1);
    expect_load_ok("{\"\\u00e9\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[1],"
                   "\"data_offsets\":[0,1]}}", 1);

    /* an unpadded header with odd offsets: data is realigned for the caller */
    write_st(tpath("odd.safetensors"),
             "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"f\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}", 5, 0, false);
    na_checkpoint *ck = na_checkpoint_load(tpath("odd.safetensors"));
    cr_assert_not_null(ck, "%s", na_last_error());
    na_checkpoint_entry e;
    cr_assert_eq(na_checkpoint_get(ck, "f", &e), NA_OK);
    cr_assert_eq((uintptr_t)e.data % 4, 0);
    cr_assert_eq(((const uint8_t *)e.data)[0], 0x22);
    cr_assert_eq(na_checkpoint_entry_at(ck, 0, &e), NA_OK);
    cr_assert_str_eq(e.name, "b"); /* file order */
    na_checkpoint_free(ck);
}

Test(checkpoint, rejects_bad_sizes_and_header_lengths) {
    const char *p = tpath("short.safetensors");
    for (size_t n = 0; n < 8; n++) {
        write_raw(p, "\x08\0\0\0\0\0\0\0", n);
        cr_assert_null(na_checkpoint_load(p));
        cr_assert_eq(na_last_status(), NA_EFORMAT);
        assert_msg_has("too small for the 8-byte header length");
        assert_msg_has(p);
    }
    write_st(p, "{}", 0, 100000001, true);
    cr_assert_null(na_checkpoint_load(p));
    assert_msg_has("header length 100000001");
    assert_msg_has("exceeds the limit of 100000000");
    write_st(p, "{}", 0, UINT64_MAX, true);
    cr_assert_null(na_checkpoint_load(p));
    assert_msg_has("exceeds the limit");
    write_st(p, "{}      ", 0, 9, true); /* 8 + 9 > 16 */
    cr_assert_null(na_checkpoint_load(p));
    assert_msg_has("runs past the end of the file: 8 + 9 > 16 bytes");
    /* header length 2 leaves the spaces as data: 6 bytes unaccounted for */
    write_st(p, "{}      ", 0, 2, true);
    cr_assert_null(na_checkpoint_load(p));
    assert_msg_has("trailing bytes");

    /* data too short / too long */
    expect_load_fail(F32_2x3, 23, (const char *[]){"ends at file offset", "missing bytes", NULL});
    expect_load_fail(F32_2x3, 25, (const char *[]){"trailing bytes", NULL});
    cr_assert_null(na_checkpoint_load(tpath("nope.safetensors")));
    cr_assert_eq(na_last_status(), NA_EIO);
    cr_assert_null(na_checkpoint_load(tmpdir));
    cr_assert_eq(na_last_status(), NA_EIO);
}

Test(checkpoint, rejects_bad_utf8_and_json) {
    /* invalid UTF-8: bad continuation, overlong '/', a surrogate, beyond U+10FFFF, truncated */
    const char *utf8[] = {"{\"a\xc3\x28\":1}", "{\"\xc0\xaf\":1}", "{\"\xed\xa0\x80\":1}",
                          "{\"\xf4\x90\x80\x80\":1}", "{\"\xe2\x82"};
    for (size_t i = 0; i < sizeof utf8 / sizeof utf8[0]; i++)
        expect_load_fail(utf8[i], 0, (const char *[]){"not valid UTF-8", "file offset", NULL});

    const char *json[] = {
        "",                                      /* empty */
        "[]",                                    /* not an object */
        "{",                                     /* unterminated */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},}", /* trailing , */
        "{'a':1}",                               /* single quotes */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[02,3],\"data_offsets\":[0,24]}}", /* leading 0 */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0,3],\"data_offsets\":[0,24]}}", /* fraction */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,24]}}",  /* negative */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}} x", /* trailing */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}{}",
        "{\"\\ud800\":1}",                       /* lone surrogate */
        "{\"\\udc00x\":1}",
        "{\"a\\q\":1}",                          /* bad escape */
        "{\"a\tb\":1}",                          /* raw control character */
        "{/* c */}",                             /* comment */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24,48]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,99999999999999999999]}}",
        "{\"a\":{\"dtype\":F32,\"shape\":[2,3],\"data_offsets\":[0,24]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3]}}",        /* missing data_offsets */
        "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}}", /* missing shape */
        "{\"a\":{\"shape\":[2,3],\"data_offsets\":[0,24]}}",   /* missing dtype */
        "{\"a\":{}}",
        "{\"a\":[]}",
        "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
        "{\"__metadata__\":{\"k\":1}}",          /* metadata value not a string */
        "{\"__metadata__\":[]}",
        "{\"__metadata__\":{},\"__metadata__\":{}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"x\":tru}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"x\":1.}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"x\":01}}",
        "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
    };
    for (size_t i = 0; i < sizeof json / sizeof json[0]; i++)
        expect_load_fail(json[i], 24, (const char *[]){"invalid JSON header at byte", NULL});

    /* a deeply nested ignored value hits the depth limit instead of the stack */
    char deep[1200];
    int k = snprintf(deep, sizeof deep,
                     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"x\":");
    for (int d = 0; d < 500; d++) deep[k++] = '[';
    for (int d = 0; d < 500; d++) deep[k++] = ']';
    deep[k++] = '}';
    deep[k++] = '}';
    deep[k] = 0;
    expect_load_fail(deep, 24, (const char *[]){"nesting deeper than 128", NULL});
}

Test(checkpoint, rejects_bad_tensor_info) {
    expect_load_fail("{\"a\":{\"dtype\":\"I16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6,
                     (const char *[]){"tensor 'a'", "unknown dtype 'I16'", NULL});
    expect_load_fail("{\"a\":{\"dtype\":\"f32\",\"shape\":[6],\"data_offsets\":[0,24]}}", 24,
                     (const char *[]){"unknown dtype 'f32'", NULL});
    /* duplicate tensor names */
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]}}",
                     24, (const char *[]){"duplicate tensor name 'a'", NULL});
    expect_load_fail("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                     (const char *[]){"duplicate __metadata__ key 'k'", NULL});
    /* gap, overlap, not starting at 0, end before begin */
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                     12, (const char *[]){"tensor 'b'", "[8, 12]", "leave a gap after",
                                          "'a', which ends at 4", NULL});
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                     12, (const char *[]){"tensor 'b'", "overlap", "ends at 8", NULL});
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                     (const char *[]){"tensor 'a'", "must start at 0", NULL});
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,2]}}",
                     4, (const char *[]){"tensor 'b'", "[4, 2] end before they begin", NULL});
    /* shape x dtype size overflows, or disagrees with the offsets */
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                     "\"data_offsets\":[0,0]}}",
                     0, (const char *[]){"tensor 'a'", "overflows 64 bits", NULL});
    expect_load_fail("{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
                     "\"data_offsets\":[0,0]}}",
                     0, (const char *[]){"overflows 64 bits", NULL});
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
                     (const char *[]){"tensor 'a'", "shape [2, 3] of F32 needs 24 bytes",
                                      "[0, 20] span 20", NULL});
    expect_load_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808,0],"
                     "\"data_offsets\":[0,0]}}",
                     0, (const char *[]){"above the supported", NULL});
    /* rank above the limit */
    char big[600];
    int k = snprintf(big, sizeof big, "{\"a\":{\"dtype\":\"U8\",\"shape\":[");
    for (int d = 0; d < 65; d++) k += snprintf(big + k, sizeof big - k, d ? ",1" : "1");
    snprintf(big + k, sizeof big - k, "],\"data_offsets\":[0,1]}}");
    expect_load_fail(big, 1, (const char *[]){"more than 64 dimensions", NULL});
}

/* ---- atomic saves ------------------------------------------------------------------------- */

static int count_tmp_files(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static na_checkpoint *small_ck(float value) {
    static float v[4];
    for (int i = 0; i < 4; i++) v[i] = value;
    na_checkpoint *ck = na_checkpoint_new();
    na_checkpoint_add_host(ck, "w", NA_DTYPE_F32, NA_SHAPE(4), v);
    return ck;
}

Test(checkpoint, failed_write_leaves_the_old_file_intact) {
    const char *p = tpath("model.safetensors");
    na_checkpoint *ck = small_ck(1.0f);
    cr_assert_eq(na_checkpoint_save(ck, p), NA_OK);
    na_checkpoint_free(ck);
    size_t old_len;
    uint8_t *old = read_all(p, &old_len);

    /* a write that fails half way: RLIMIT_FSIZE (works as root too; this test runs in its own
     * process) makes write() fail with EFBIG once the file passes 4 KiB */
    size_t n = 1 << 16;
    float *big = calloc(n, sizeof(float));
    ck = na_checkpoint_new();
    na_checkpoint_add_host(ck, "w", NA_DTYPE_F32, NA_SHAPE((int64_t)n), big);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {4096, 4096}, old_rl;
    getrlimit(RLIMIT_FSIZE, &old_rl);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    int st = na_checkpoint_save(ck, p);
    setrlimit(RLIMIT_FSIZE, &old_rl);
    cr_assert_eq(st, NA_EIO);
    assert_msg_has("writing");
    assert_msg_has(p); /* the temporary's name starts with the target's */
    assert_msg_has("EFBIG");
    assert_msg_has("ulimit -f");
    assert_msg_has("is unchanged");
    na_checkpoint_free(ck);
    free(big);
    size_t len;
    uint8_t *now = read_all(p, &len);
    cr_assert_eq(len, old_len);
    cr_assert_eq(memcmp(now, old, len), 0);
    free(now);
    na_checkpoint *intact = na_checkpoint_load(p);
    cr_assert_not_null(intact, "%s", na_last_error());
    na_checkpoint_entry we;
    cr_assert_eq(na_checkpoint_get(intact, "w", &we), NA_OK);
    cr_assert_eq(((const float *)we.data)[0], 1.0f);
    na_checkpoint_free(intact);
    cr_assert_eq(count_tmp_files(), 0, "a temporary file was left behind");

    /* the target is a directory: the rename fails, the temporary is removed */
    char dirp[600];
    snprintf(dirp, sizeof dirp, "%s/adir", tmpdir);
    mkdir(dirp, 0755);
    ck = small_ck(2.0f);
    cr_assert_neq(na_checkpoint_save(ck, dirp), NA_OK);
    assert_msg_has("rename");
    cr_assert_eq(count_tmp_files(), 0);

    /* the directory does not exist */
    cr_assert_eq(na_checkpoint_save(ck, tpath("no/such/dir/x.safetensors")), NA_EIO);
    assert_msg_has("cannot create");

    /* a read-only directory (only meaningful when not root) */
    if (geteuid() != 0) {
        char ro[600];
        snprintf(ro, sizeof ro, "%s/ro", tmpdir);
        mkdir(ro, 0755);
        char rop[700];
        snprintf(rop, sizeof rop, "%s/model.safetensors", ro);
        cr_assert_eq(na_checkpoint_save(ck, rop), NA_OK);
        chmod(ro, 0555);
        na_checkpoint *ck3 = small_ck(3.0f);
        cr_assert_eq(na_checkpoint_save(ck3, rop), NA_EIO);
        na_checkpoint_free(ck3);
        chmod(ro, 0755);
        na_checkpoint *in = na_checkpoint_load(rop);
        na_checkpoint_entry e;
        na_checkpoint_get(in, "w", &e);
        cr_assert_eq(((const float *)e.data)[0], 2.0f);
        na_checkpoint_free(in);
    }

    /* a successful save replaces the old file */
    cr_assert_eq(na_checkpoint_save(ck, p), NA_OK);
    na_checkpoint_free(ck);
    na_checkpoint *in = na_checkpoint_load(p);
    na_checkpoint_entry e;
    cr_assert_eq(na_checkpoint_get(in, "w", &e), NA_OK);
    cr_assert_eq(((const float *)e.data)[3], 2.0f);
    na_checkpoint_free(in);
    cr_assert_eq(count_tmp_files(), 0);
    free(old);
}

static void write_junk(const char *path) {
    static uint8_t junk[1 << 16];
    write_raw(path, junk, sizeof junk);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

Test(checkpoint, a_save_removes_stale_temporaries_of_its_own_dead_saves_only) {
    const char *p = tpath("model.safetensors");
    pid_t dead = fork(); /* a pid that has certainly exited */
    cr_assert_geq(dead, 0);
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    pid_t live = fork(); /* a live process "saving" the same checkpoint right now */
    cr_assert_geq(live, 0);
    if (live == 0) {
        pause();
        _exit(0);
    }
    char stale[600], alive[600], other[600], suffix[600], longer[600];
    snprintf(stale, sizeof stale, "%s.tmp.%d", p, (int)dead);
    snprintf(alive, sizeof alive, "%s.tmp.%d", p, (int)live);
    snprintf(other, sizeof other, "%s.tmp.%d", tpath("other.safetensors"), (int)dead);
    snprintf(suffix, sizeof suffix, "%s.tmp.%dx", p, (int)dead);
    snprintf(longer, sizeof longer, "%s.bak.tmp.%d", p, (int)dead);
    const char *keep[] = {alive, other, suffix, longer};
    write_junk(stale);
    for (int i = 0; i < 4; i++) write_junk(keep[i]);

    na_checkpoint *ck = small_ck(5.0f);
    int st = na_checkpoint_save(ck, p);
    na_checkpoint_free(ck);
    kill(live, SIGKILL);
    waitpid(live, NULL, 0);
    cr_assert_eq(st, NA_OK, "%s", na_last_error());
    cr_assert(!exists(stale), "the dead save's temporary '%s' is still there", stale);
    for (int i = 0; i < 4; i++) cr_assert(exists(keep[i]), "'%s' was removed", keep[i]);
    cr_assert(exists(p));

    /* a relative path: the temporaries are looked for in the current directory */
    char cwd[600];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(tmpdir), 0);
    write_junk(stale);
    ck = small_ck(6.0f);
    st = na_checkpoint_save(ck, "model.safetensors");
    na_checkpoint_free(ck);
    cr_assert_eq(chdir(cwd), 0);
    cr_assert_eq(st, NA_OK, "%s", na_last_error());
    cr_assert(!exists(stale));
}

/* ---- convenience -------------------------------------------------------------------------- */

Test(checkpoint, save_and_load_state_lists) {
    const float a[3] = {1, 2, 3};
    const int32_t b[2] = {7, -7};
    na_tensor *ta = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3));
    na_tensor *tb = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2));
    na_copy_from_host(ta, a);
    na_copy_from_host(tb, b);
    na_named_tensors out = {0};
    cr_assert_eq(na_named_tensors_add(&out, ta, "p.%s", "a"), NA_OK);
    cr_assert_eq(na_named_tensors_add(&out, tb, "p.%c", 'b'), NA_OK);
    cr_assert_eq(na_checkpoint_save_list(tpath("l.safetensors"), &out), NA_OK, "%s",
                 na_last_error());

    na_tensor *ra = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3));
    na_tensor *rb = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(2));
    na_named_tensors in = {0}, first = {0}, missing = {0};
    cr_assert_eq(na_named_tensors_add(&in, ra, "p.a"), NA_OK);
    cr_assert_eq(na_named_tensors_add(&in, rb, "p.b"), NA_OK);
    cr_assert_eq(na_checkpoint_load_list(tpath("l.safetensors"), &in, true), NA_OK, "%s",
                 na_last_error());
    float ga[3];
    int32_t gb[2];
    na_copy_to_host(ra, ga);
    na_copy_to_host(rb, gb);
    cr_assert_eq(memcmp(ga, a, sizeof a), 0);
    cr_assert_eq(memcmp(gb, b, sizeof b), 0);

    /* strict: the file holds "p.b" too */
    cr_assert_eq(na_named_tensors_add(&first, ra, "p.a"), NA_OK);
    cr_assert_eq(na_checkpoint_load_list(tpath("l.safetensors"), &first, true), NA_EINVAL);
    assert_msg_has("'p.b'");
    assert_msg_has("strict");
    cr_assert_eq(na_checkpoint_load_list(tpath("l.safetensors"), &first, false), NA_OK);
    /* a name the file lacks */
    cr_assert_eq(na_named_tensors_add(&missing, ra, "p.a"), NA_OK);
    cr_assert_eq(na_named_tensors_add(&missing, rb, "p.c"), NA_OK);
    cr_assert_eq(na_checkpoint_load_list(tpath("l.safetensors"), &missing, false), NA_EINVAL);
    assert_msg_has("no tensor 'p.c'");
    /* a list is searched by name; freeing empties it */
    cr_assert_eq(na_named_tensors_find(&in, "p.b"), rb);
    cr_assert_null(na_named_tensors_find(&in, "p"));
    na_named_tensors_truncate(&in, 1);
    cr_assert_eq(in.n, 1);
    cr_assert_null(na_named_tensors_find(&in, "p.b"));
    na_named_tensors *lists[] = {&out, &in, &first, &missing};
    for (int i = 0; i < 4; i++) {
        na_named_tensors_free(lists[i]);
        cr_assert(lists[i]->n == 0 && !lists[i]->items);
    }
    na_tensor_free(ta);
    na_tensor_free(tb);
    na_tensor_free(ra);
    na_tensor_free(rb);
}

static float first_of(const na_tensor *t) {
    float v[3] = {0};
    na_copy_to_host(t, v);
    return v[0];
}

/* A later item's failure (shape, I64 value, strict extra) leaves the earlier ones untouched. */
Test(checkpoint, copy_list_is_all_or_nothing) {
    const float a[3] = {1, 2, 3};
    na_checkpoint *ck = na_checkpoint_new();
    cr_assert_eq(na_checkpoint_add_host(ck, "a", NA_DTYPE_F32, NA_SHAPE(3), a), NA_OK);
    cr_assert_eq(na_checkpoint_add_host(ck, "b", NA_DTYPE_F32, NA_SHAPE(3), a), NA_OK);
    cr_assert_eq(na_checkpoint_save(ck, tpath("aon.safetensors")), NA_OK, "%s", na_last_error());
    na_checkpoint_free(ck);
    na_tensor *ra = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3));
    na_tensor *rb2 = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
    na_fill_(ra, -5);
    na_named_tensors shape = {0}, strict = {0};
    cr_assert_eq(na_named_tensors_add(&shape, ra, "a"), NA_OK);
    cr_assert_eq(na_named_tensors_add(&shape, rb2, "b"), NA_OK);
    cr_assert_eq(na_checkpoint_load_list(tpath("aon.safetensors"), &shape, false), NA_ESHAPE);
    assert_msg_has("'b'");
    cr_assert_eq(first_of(ra), -5.0f);
    cr_assert_eq(na_named_tensors_add(&strict, ra, "a"), NA_OK);
    cr_assert_eq(na_checkpoint_load_list(tpath("aon.safetensors"), &strict, true), NA_EINVAL);
    assert_msg_has("strict");
    cr_assert_eq(first_of(ra), -5.0f);

    /* an I64 value the item cannot hold (3000000001 into i32), after one that fits */
    write_torch_style(tpath("torch.safetensors"));
    na_tensor *mean = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
    na_tensor *ri = na_tensor_new(NA_DTYPE_I32, NA_DEVICE_CPU, NA_SHAPE(3));
    na_fill_(mean, -5);
    na_named_tensors i64 = {0};
    cr_assert_eq(na_named_tensors_add(&i64, mean, "bn.running_mean"), NA_OK);
    cr_assert_eq(na_named_tensors_add(&i64, ri, "big"), NA_OK);
    cr_assert_eq(na_checkpoint_load_list(tpath("torch.safetensors"), &i64, false), NA_EDTYPE);
    assert_msg_has("3000000001");
    cr_assert_eq(first_of(mean), -5.0f);
    /* and all of it when everything fits */
    na_named_tensors_truncate(&shape, 1);
    cr_assert_eq(na_checkpoint_load_list(tpath("aon.safetensors"), &shape, false), NA_OK);
    cr_assert_eq(first_of(ra), 1.0f);
    na_named_tensors *lists[] = {&shape, &strict, &i64};
    for (int i = 0; i < 3; i++) na_named_tensors_free(lists[i]);
    na_tensor_free(ra);
    na_tensor_free(rb2);
    na_tensor_free(ri);
    na_tensor_free(mean);
}

/* A FIFO with no writer would block fopen forever: refused before anything waits. */
Test(checkpoint, a_fifo_is_refused_without_blocking, .timeout = 30) {
    cr_assert_eq(mkfifo(tpath("fifo"), 0600), 0);
    cr_assert_null(na_checkpoint_load(tpath("fifo")));
    cr_assert_eq(na_last_status(), NA_EIO);
    assert_msg_has(tpath("fifo"));
    assert_msg_has("is a FIFO, not a regular file");
}

/* A suite of its own, which meson's cuda suite runs (tests/meson.build): needs a device. */
TestSuite(checkpoint_cuda, .init = make_tmpdir, .fini = cleanup);
Test(checkpoint_cuda, device_tensors_round_trip) {
    if (!na_cuda_available()) cr_skip_test("no CUDA device");
    const uint16_t h[4] = {0x3C00, 0x7E01, 0x8000, 0x0001};
    na_tensor *d = na_from_host(NA_DTYPE_F16, NA_DEVICE_CUDA, NA_SHAPE(2, 2), h);
    cr_assert_not_null(d, "%s", na_last_error());
    na_checkpoint *ck = na_checkpoint_new();
    na_checkpoint_add(ck, "h", d);
    cr_assert_eq(na_checkpoint_save(ck, tpath("d.safetensors")), NA_OK, "%s", na_last_error());
    na_checkpoint_free(ck);
    ck = na_checkpoint_load(tpath("d.safetensors"));
    na_tensor *back = na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CUDA, NA_SHAPE(2, 2));
    cr_assert_eq(na_checkpoint_copy_into(ck, "h", back), NA_OK, "%s", na_last_error());
    uint16_t g[4];
    na_copy_to_host(back, g);
    cr_assert_eq(memcmp(g, h, sizeof h), 0);
    na_checkpoint_free(ck);
    na_tensor_free(back);
}

/* ---- mutation smoke test ------------------------------------------------------------------ */

static uint64_t mix_state;
static uint64_t rnd(void) { return na_splitmix64_next(&mix_state); }

Test(checkpoint, random_mutations_fail_cleanly) {
    /* a valid file with metadata and several dtypes, then 3000 seeded mutations: flipped bytes,
     * truncations and extensions; each load either succeeds (and its entries are consistent) or
     * fails with a message, never crashes (run under ASan/UBSan to catch over-reads) */
    const double d[2] = {1, 2};
    const uint16_t h[3] = {1, 2, 3};
    const uint8_t u[5] = {1, 2, 3, 4, 5};
    na_checkpoint *ck = na_checkpoint_new();
    na_checkpoint_add_host(ck, "d", NA_DTYPE_F64, NA_SHAPE(2, 1), d);
    na_checkpoint_add_host(ck, "h", NA_DTYPE_BF16, NA_SHAPE(3), h);
    na_checkpoint_add_host(ck, "u", NA_DTYPE_U8, NA_SHAPE(5), u);
    na_checkpoint_set_meta(ck, "k", "v");
    cr_assert_eq(na_checkpoint_save(ck, tpath("base.safetensors")), NA_OK);
    na_checkpoint_free(ck);
    size_t len;
    uint8_t *base = read_all(tpath("base.safetensors"), &len);
    uint8_t *buf = malloc(len + 16);
    mix_state = 12345;
    int ok = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, base, len);
        size_t n = len;
        int kind = (int)(rnd() % 4);
        if (kind == 0) n = rnd() % len;                          /* truncate */
        else if (kind == 1) n = len + 1 + rnd() % 8;             /* extend */
        for (int m = 0, nm = 1 + (int)(rnd() % 3); m < nm && n; m++) {
            size_t at = (kind == 3) ? rnd() % 8 : rnd() % n;     /* kind 3: the length field */
            buf[at] = (kind == 3 && at < 8) ? (uint8_t)(buf[at] + (rnd() % 3) - 1)
                                            : (uint8_t)rnd();
        }
        write_raw(tpath("mut.safetensors"), buf, n);
        na_checkpoint *in = na_checkpoint_load(tpath("mut.safetensors"));
        if (!in) {
            cr_assert_neq(na_last_status(), NA_OK);
            cr_assert_neq(na_last_error()[0], '\0');
            continue;
        }
        ok++;
        size_t total = 0;
        for (int64_t i = 0; i < na_checkpoint_count(in); i++) {
            na_checkpoint_entry e;
            cr_assert_eq(na_checkpoint_entry_at(in, i, &e), NA_OK);
            cr_assert_eq(e.nbytes, (size_t)e.numel * na_dtype_size(e.dtype));
            volatile uint8_t sink = 0;
            for (size_t k = 0; k < e.nbytes; k++) sink ^= ((const uint8_t *)e.data)[k];
            (void)sink;
            total += e.nbytes;
        }
        cr_assert_leq(total, n);
        na_checkpoint_free(in);
    }
    cr_assert_gt(ok, 0); /* some mutations only touch data bytes */
    free(buf);
    free(base);
}
