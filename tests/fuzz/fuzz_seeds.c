/* Writes the seed corpora of the fuzz harnesses: small valid files of every kind, made with
 * the library's own writer (safetensors) or by hand (IDX, CIFAR), in the framing each harness
 * expects. Usage: fuzz_seeds DIR (creates DIR/<harness>/seed-*). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "nanoamp/io.h"
#include "nanoamp/tensor.h"

static const char *root;

static void put(const char *harness, const char *name, const void *d, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, harness);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/seed-%s", root, harness, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(d, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* Two files in the split framing of fuzz_idx / fuzz_idx_gzip (mode byte when mode >= 0). */
static void put_pair(const char *harness, const char *name, int mode, const uint8_t *a, size_t an,
                     const uint8_t *b, size_t bn) {
    size_t skip = mode >= 0 ? 3 : 2;
    uint8_t *buf = malloc(skip + an + bn);
    buf[0] = (uint8_t)an;
    buf[1] = (uint8_t)(an >> 8);
    if (mode >= 0) buf[2] = (uint8_t)mode;
    memcpy(buf + skip, a, an);
    memcpy(buf + skip + an, b, bn);
    put(harness, name, buf, skip + an + bn);
    free(buf);
}

static void be32(uint8_t *b, uint32_t v) {
    b[0] = (uint8_t)(v >> 24), b[1] = (uint8_t)(v >> 16), b[2] = (uint8_t)(v >> 8), b[3] = (uint8_t)v;
}

static void idx_seeds(void) {
    enum { N = 3, R = 4, C = 5 };
    uint8_t img[16 + N * R * C], lab[8 + N];
    be32(img, 0x803), be32(img + 4, N), be32(img + 8, R), be32(img + 12, C);
    for (int k = 0; k < N * R * C; k++) img[16 + k] = (uint8_t)(k * 7);
    be32(lab, 0x801), be32(lab + 4, N);
    for (int k = 0; k < N; k++) lab[8 + k] = (uint8_t)(k * 3 % 10);
    put_pair("idx", "plain", -1, img, sizeof img, lab, sizeof lab);
    put_pair("idx_gzip", "compress-both", 3, img, sizeof img, lab, sizeof lab);
    size_t gl, ll;
    uint8_t *gi = fuzz_gzip(img, sizeof img, &gl), *gb = fuzz_gzip(lab, sizeof lab, &ll);
    put_pair("idx", "gzip", -1, gi, gl, gb, ll);
    put_pair("idx_gzip", "raw-gzip", 0, gi, gl, gb, ll);
    /* two members back to back */
    size_t l1, l2;
    uint8_t *m1 = fuzz_gzip(img, 20, &l1), *m2 = fuzz_gzip(img + 20, sizeof img - 20, &l2);
    uint8_t *two = malloc(l1 + l2);
    memcpy(two, m1, l1);
    memcpy(two + l1, m2, l2);
    put_pair("idx_gzip", "two-members", 0, two, l1 + l2, gb, ll);
    free(two), free(m1), free(m2), free(gi), free(gb);
}

static void cifar_seeds(void) {
    uint8_t rec[2 * 3073];
    for (size_t k = 0; k < sizeof rec; k++) rec[k] = (uint8_t)(k * 13);
    rec[0] = 3, rec[3073] = 9;
    put("cifar", "one-record", rec, 3073);
    put("cifar", "two-records", rec, sizeof rec);
}

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n ? *n : 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

/* A safetensors file as the library writes it: seeds for the file, header and JSON harnesses. */
static void put_checkpoint(const char *name, na_checkpoint *ck) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tmp.safetensors", root);
    if (na_checkpoint_save(ck, path)) {
        fprintf(stderr, "fuzz_seeds: %s\n", na_last_error());
        exit(1);
    }
    size_t n;
    uint8_t *b = read_file(path, &n);
    remove(path);
    put("safetensors", name, b, n);
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)b[k] << (8 * k);
    size_t data = n - 8 - (size_t)hl;
    b[6] = (uint8_t)data, b[7] = (uint8_t)(data >> 8); /* the header harness's framing */
    put("safetensors_header", name, b + 6, 2 + (size_t)hl);
    put("json", name, b + 8, (size_t)hl);
    free(b);
}

static void safetensors_seeds(void) {
    static const float f32[6] = {1, -2, 3.5f, 0, 1e-3f, 65504};
    static const double f64[2] = {0.1, -7};
    static const int32_t i32 = 1234;
    static const uint8_t u8[3] = {0, 128, 255};
    static const uint16_t half[2] = {0x3c00, 0xc000};
    na_checkpoint *ck = na_checkpoint_new();
    na_checkpoint_add_host(ck, "fc.weight", NA_DTYPE_F32, NA_SHAPE(2, 3), f32);
    na_checkpoint_add_host(ck, "fc.bias", NA_DTYPE_F64, NA_SHAPE(2), f64);
    na_checkpoint_add_host(ck, "bn.num_batches_tracked", NA_DTYPE_I32, 0, NULL, &i32);
    na_checkpoint_add_host(ck, "pixels", NA_DTYPE_U8, NA_SHAPE(3), u8);
    na_checkpoint_add_host(ck, "h", NA_DTYPE_F16, NA_SHAPE(2), half);
    na_checkpoint_add_host(ck, "b", NA_DTYPE_BF16, NA_SHAPE(2, 1), half);
    na_checkpoint_add_host(ck, "empty", NA_DTYPE_F32, NA_SHAPE(0, 4), NULL);
    na_checkpoint_set_meta(ck, "epochs_done", "3");
    na_checkpoint_set_meta(ck, "note", "tab\there \"quoted\" \xc3\xa9");
    put_checkpoint("model", ck);
    na_checkpoint_free(ck);
    ck = na_checkpoint_new();
    put_checkpoint("empty", ck);
    na_checkpoint_free(ck);

    /* PyTorch's I64 buffer, written by hand (the library does not write I64) */
    const char *hdr = "{\"n\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}}    ";
    size_t hl = strlen(hdr);
    uint8_t file[8 + 64 + 8] = {(uint8_t)hl};
    memcpy(file + 8, hdr, hl);
    file[8 + hl] = 42;
    put("safetensors", "i64", file, 8 + hl + 8);
    put("json", "i64", hdr, hl);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) {
        perror(root);
        return 1;
    }
    idx_seeds();
    cifar_seeds();
    safetensors_seeds();
    return 0;
}
