/* CIFAR-10 binary readers: na_cifar_load_files and na_cifar10_load.
 *
 * A file is a sequence of 3073-byte records: 1 label byte (0..9), then 3072 pixel bytes
 * (1024 red, 1024 green, 1024 blue, each 32x32 row-major, i.e. CHW). Every file's size is
 * checked (stat) before anything is allocated; records are read in bounded chunks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nanoamp/data.h"
#include "nanoamp/error.h"
#include "reader.h"

#define CIFAR_PIXELS 3072
#define CIFAR_CLASSES 10
#define CIFAR_CHUNK_RECORDS 256

/* Size of one CIFAR file after validation, or a negative status. */
static int64_t cifar_file_records(const char *fn, const char *path, bool exact_size) {
    if (!path) return na_set_error(NA_EINVAL, "%s: a file path is NULL", fn);
    struct stat st;
    FILE *f = na_fopen_regular(fn, path, &st);
    if (!f) return na_last_status();
    unsigned char m[2];
    bool gz = fread(m, 1, 2, f) == 2 && m[0] == 0x1f && m[1] == 0x8b;
    fclose(f);
    int64_t size = (int64_t)st.st_size;
    if (size == 0) return na_set_error(NA_EFORMAT, "%s: '%s' is empty", fn, path);
    if (size % NA_CIFAR_RECORD_BYTES != 0) {
        const char *hint = gz ? " (it looks gzip-compressed: extract the binary version first)" : "";
        return na_set_error(NA_EFORMAT,
                            "%s: '%s' is %lld bytes, not a multiple of the %d-byte record "
                            "(1 label byte + 3072 pixel bytes): %lld whole records and %lld stray "
                            "bytes%s",
                            fn, path, (long long)size, NA_CIFAR_RECORD_BYTES,
                            (long long)(size / NA_CIFAR_RECORD_BYTES),
                            (long long)(size % NA_CIFAR_RECORD_BYTES), hint);
    }
    if (exact_size && size != (int64_t)NA_CIFAR_RECORD_BYTES * NA_CIFAR_FILE_RECORDS)
        return na_set_error(NA_EFORMAT,
                            "%s: '%s' is %lld bytes (%lld records), expected exactly 30730000 "
                            "(10000 records of 3073 bytes) as in the official CIFAR-10 files",
                            fn, path, (long long)size, (long long)(size / NA_CIFAR_RECORD_BYTES));
    return size / NA_CIFAR_RECORD_BYTES;
}

/* Reads `records` records of one file into images/labels. */
static int cifar_read_file(const char *fn, const char *path, int64_t records, uint8_t *images,
                           int32_t *labels, uint8_t *chunk) {
    struct stat st;
    FILE *f = na_fopen_regular(fn, path, &st);
    if (!f) return na_last_status();
    for (int64_t r0 = 0; r0 < records; r0 += CIFAR_CHUNK_RECORDS) {
        int64_t nr = records - r0 < CIFAR_CHUNK_RECORDS ? records - r0 : CIFAR_CHUNK_RECORDS;
        size_t want = (size_t)nr * NA_CIFAR_RECORD_BYTES;
        size_t got = fread(chunk, 1, want, f);
        if (got != want) {
            int err = ferror(f);
            fclose(f);
            return na_set_error(NA_EIO, "%s: '%s': %s at offset %lld", fn, path,
                                err ? strerror(errno) : "file shrank while reading",
                                (long long)(r0 * NA_CIFAR_RECORD_BYTES + (int64_t)got));
        }
        for (int64_t k = 0; k < nr; k++) {
            const uint8_t *rec = chunk + k * NA_CIFAR_RECORD_BYTES;
            int64_t rec_i = r0 + k;
            if (rec[0] >= CIFAR_CLASSES) {
                fclose(f);
                return na_set_error(NA_EFORMAT,
                                    "%s: '%s': label %u of record %lld (offset %lld) is out of "
                                    "range 0..%d",
                                    fn, path, rec[0], (long long)rec_i,
                                    (long long)(rec_i * NA_CIFAR_RECORD_BYTES), CIFAR_CLASSES - 1);
            }
            labels[rec_i] = rec[0];
            memcpy(images + rec_i * CIFAR_PIXELS, rec + 1, CIFAR_PIXELS);
        }
    }
    fclose(f);
    return NA_OK;
}

static na_dataset *cifar_load(const char *fn, const char *const *paths, int n_paths,
                              bool exact_size) {
    if (!paths || n_paths <= 0) {
        na_set_error(NA_EINVAL, "%s: need at least one file (got %d)", fn, n_paths);
        return NULL;
    }
    int64_t total = 0;
    int64_t *counts = malloc((size_t)n_paths * sizeof *counts);
    if (!counts) {
        na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        return NULL;
    }
    for (int i = 0; i < n_paths; i++) {
        counts[i] = cifar_file_records(fn, paths[i], exact_size);
        if (counts[i] < 0) {
            free(counts);
            return NULL;
        }
        total += counts[i]; /* each file is < 2^63 bytes, so the sum of a few cannot overflow */
        if (total > ((int64_t)1 << 40) / CIFAR_PIXELS) {
            free(counts);
            na_set_error(NA_EFORMAT, "%s: %lld records are too many", fn, (long long)total);
            return NULL;
        }
    }
    na_dataset *ds = na_dataset_new(total, 3, 32, 32, CIFAR_CLASSES);
    uint8_t *chunk = malloc((size_t)CIFAR_CHUNK_RECORDS * NA_CIFAR_RECORD_BYTES);
    if (!ds || !chunk) {
        if (ds) na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        goto fail;
    }
    int64_t at = 0;
    for (int i = 0; i < n_paths; i++) {
        if (cifar_read_file(fn, paths[i], counts[i], ds->images + at * CIFAR_PIXELS,
                            ds->labels + at, chunk))
            goto fail;
        at += counts[i];
    }
    free(chunk);
    free(counts);
    return ds;
fail:
    free(chunk);
    free(counts);
    na_dataset_free(ds);
    return NULL;
}

na_dataset *na_cifar_load_files(const char *const *paths, int n_paths, bool exact_size) {
    return cifar_load("na_cifar_load_files", paths, n_paths, exact_size);
}


na_dataset *na_cifar10_load(const char *dir, bool train) {
    const char *fn = "na_cifar10_load";
    if (!dir) {
        na_set_error(NA_EINVAL, "%s: dir is NULL", fn);
        return NULL;
    }
    static const char *const train_names[] = {"data_batch_1.bin", "data_batch_2.bin",
                                              "data_batch_3.bin", "data_batch_4.bin",
                                              "data_batch_5.bin"};
    static const char *const test_names[] = {"test_batch.bin"};
    const char *const *names = train ? train_names : test_names;
    int n = train ? 5 : 1;
    char paths[5][4096];
    const char *ptrs[5];
    /* Use <dir> unless the files are only in <dir>/cifar-10-batches-bin (the tarball's). */
    const char *sub = "";
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/%s", dir, names[0]);
    if (!na_path_exists(probe)) {
        snprintf(probe, sizeof probe, "%s/cifar-10-batches-bin/%s", dir, names[0]);
        if (na_path_exists(probe)) sub = "cifar-10-batches-bin/";
    }
    for (int i = 0; i < n; i++) {
        int len = snprintf(paths[i], sizeof paths[i], "%s/%s%s", dir, sub, names[i]);
        if (len < 0 || (size_t)len >= sizeof paths[i]) {
            na_set_error(NA_EINVAL, "%s: path '%s/%s%s' is too long", fn, dir, sub, names[i]);
            return NULL;
        }
        if (!na_path_exists(paths[i])) {
            na_set_error(NA_EIO,
                         "%s: missing '%s': download the CIFAR-10 binary version "
                         "(cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html) "
                         "and extract it so that data_batch_1.bin .. data_batch_5.bin and "
                         "test_batch.bin are in '%s' or '%s/cifar-10-batches-bin'",
                         fn, paths[i], dir, dir);
            return NULL;
        }
        ptrs[i] = paths[i];
    }
    return cifar_load(fn, ptrs, n, true);
}
