/* IDX (MNIST-format) readers: na_idx_load and na_mnist_load.
 *
 * An IDX file is a 4-byte magic 00 00 TT DD (TT = 0x08 for u8 data, DD = number of dims),
 * DD big-endian u32 dims, then the C-order data. Every size is checked before it is used:
 * the magic and dims are validated first, the payload size is computed with overflow checks
 * and compared with the file size (plain files) before allocating; gzip streams are read in
 * bounded chunks into a buffer that grows with the data actually present, never beyond what
 * the header announced, so a lying header cannot make us allocate gigabytes. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nanoamp/data.h"
#include "nanoamp/error.h"
#include "reader.h"

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u
#define IDX_MAX_BYTES ((int64_t)1 << 32) /* payload cap: 4 GiB (MNIST is 47 MB) */
#define IDX_NUM_CLASSES 10

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

static const char *idx_kind(uint32_t magic) {
    return magic == IDX_MAGIC_IMAGES ? "an IDX u8 image file (magic 0x00000803, dims N, rows, cols)"
                                     : "an IDX u8 label file (magic 0x00000801, dim N)";
}

/* Reads one IDX u8 file with `ndim` dims into a fresh buffer. dims[] gets the dims. */
static int idx_read(const char *fn, const char *path, uint32_t want_magic, int64_t *dims,
                    uint8_t **data_out, int64_t *bytes_out) {
    const int ndim = (int)(want_magic & 0xff);
    const int64_t header = 4 + 4 * (int64_t)ndim;
    *data_out = NULL;
    na_reader r;
    int st = na_reader_open(&r, fn, path);
    if (st) return st;

    unsigned char hdr[16];
    int64_t got = na_reader_read(&r, hdr, 4);
    if (got < 0) goto fail_status;
    if (got < 4) {
        st = na_set_error(NA_EFORMAT,
                          "%s: '%s' is truncated: %lld %sbytes, but the IDX magic alone takes 4 "
                          "(expected %s)%s",
                          fn, path, (long long)got, na_reader_kind(&r), idx_kind(want_magic),
                          na_reader_eof_note(&r));
        goto fail;
    }
    uint32_t magic = be32(hdr);
    if (magic != want_magic) {
        const char *why = "";
        if (magic == IDX_MAGIC_IMAGES || magic == IDX_MAGIC_LABELS)
            why = magic == IDX_MAGIC_IMAGES ? " (this is an image file: images and labels swapped?)"
                                            : " (this is a label file: images and labels swapped?)";
        else if ((magic >> 16) != 0)
            why = " (the first two bytes must be zero)";
        else if (((magic >> 8) & 0xff) != 0x08)
            why = " (data type byte is not 0x08 = unsigned byte)";
        else
            why = " (wrong number of dimensions)";
        st = na_set_error(NA_EFORMAT,
                          "%s: '%s': bad magic 0x%08x at offset 0, expected 0x%08x for %s%s", fn,
                          path, magic, want_magic, idx_kind(want_magic), why);
        goto fail;
    }
    got = na_reader_read(&r, hdr + 4, header - 4);
    if (got < 0) goto fail_status;
    if (got < header - 4) {
        st = na_set_error(NA_EFORMAT,
                          "%s: '%s' is truncated: the %lld-byte header ends at offset %lld%s", fn,
                          path, (long long)header, (long long)(4 + got), na_reader_eof_note(&r));
        goto fail;
    }
    uint64_t bytes = 1;
    for (int i = 0; i < ndim; i++) {
        uint32_t d = be32(hdr + 4 + 4 * i);
        if (d == 0) {
            st = na_set_error(NA_EFORMAT, "%s: '%s': dimension %d (at offset %d) is 0", fn, path,
                              i, 4 + 4 * i);
            goto fail;
        }
        dims[i] = d;
        if (__builtin_mul_overflow(bytes, (uint64_t)d, &bytes) || bytes > (uint64_t)IDX_MAX_BYTES) {
            st = na_set_error(NA_EFORMAT,
                              "%s: '%s': the dims in the header (offsets 4..%lld) describe more "
                              "than %lld bytes of data (limit)",
                              fn, path, (long long)header - 1, (long long)IDX_MAX_BYTES);
            goto fail;
        }
    }
    const int64_t want = (int64_t)bytes;

    if (!r.is_gz) {
        int64_t have = r.size - header;
        if (have != want) {
            if (have < want)
                st = na_set_error(NA_EFORMAT,
                                  "%s: '%s' is truncated: the header announces %lld data bytes "
                                  "after the %lld-byte header, the file has %lld (%lld bytes in "
                                  "all, expected %lld)",
                                  fn, path, (long long)want, (long long)header, (long long)have,
                                  (long long)r.size, (long long)(header + want));
            else
                st = na_set_error(NA_EFORMAT,
                                  "%s: '%s' has %lld trailing bytes after offset %lld: the header "
                                  "announces %lld data bytes (file size %lld, expected %lld)",
                                  fn, path, (long long)(have - want), (long long)(header + want),
                                  (long long)want, (long long)r.size, (long long)(header + want));
            goto fail;
        }
        uint8_t *data = malloc((size_t)want);
        if (!data) {
            st = na_set_error(NA_ENOMEM, "%s: '%s': cannot allocate %lld bytes", fn, path,
                              (long long)want);
            goto fail;
        }
        got = na_reader_read(&r, data, want);
        if (got != want) {
            free(data);
            if (got < 0) goto fail_status;
            st = na_set_error(NA_EIO, "%s: '%s': file shrank while reading: data ends at offset %lld",
                              fn, path, (long long)(header + got));
            goto fail;
        }
        *data_out = data;
    } else {
        /* Grow with the data actually decompressed, never past `want`. */
        int64_t cap = want < ((int64_t)1 << 20) ? want : ((int64_t)1 << 20), len = 0;
        uint8_t *data = malloc((size_t)cap);
        if (!data) {
            st = na_set_error(NA_ENOMEM, "%s: '%s': cannot allocate %lld bytes", fn, path,
                              (long long)cap);
            goto fail;
        }
        while (len < want) {
            if (len == cap) {
                int64_t ncap = cap * 2 < want ? cap * 2 : want;
                uint8_t *nd = realloc(data, (size_t)ncap);
                if (!nd) {
                    free(data);
                    st = na_set_error(NA_ENOMEM, "%s: '%s': cannot allocate %lld bytes", fn,
                                      path, (long long)ncap);
                    goto fail;
                }
                data = nd;
                cap = ncap;
            }
            int64_t ask = cap - len;
            got = na_reader_read(&r, data + len, ask);
            if (got < 0) {
                free(data);
                goto fail_status;
            }
            len += got;
            if (got < ask) break; /* short read: end of stream */
        }
        if (len < want) {
            free(data);
            st = na_set_error(NA_EFORMAT,
                              "%s: '%s' is truncated: the header announces %lld data bytes after "
                              "the %lld-byte header, the decompressed gzip stream has %lld "
                              "(ends at offset %lld, expected %lld)%s",
                              fn, path, (long long)want, (long long)header, (long long)len,
                              (long long)(header + len), (long long)(header + want),
                              na_reader_eof_note(&r));
            goto fail;
        }
        unsigned char extra[4096];
        int64_t more = 0;
        for (;;) { /* count trailing bytes, up to a bound */
            got = na_reader_read(&r, extra, sizeof extra);
            if (got < 0) {
                free(data);
                goto fail_status;
            }
            more += got;
            if (got < (int64_t)sizeof extra || more >= ((int64_t)1 << 24)) break;
        }
        if (more) {
            free(data);
            st = na_set_error(NA_EFORMAT,
                              "%s: '%s' has %s%lld trailing bytes after decompressed offset %lld: "
                              "the header announces %lld data bytes",
                              fn, path, more >= ((int64_t)1 << 24) ? "at least " : "",
                              (long long)more, (long long)(header + want), (long long)want);
            goto fail;
        }
        *data_out = data;
    }
    na_reader_close(&r);
    *bytes_out = want;
    return NA_OK;

fail_status:
    st = na_last_status();
fail:
    na_reader_close(&r);
    return st;
}

static na_dataset *idx_load(const char *fn, const char *images_path, const char *labels_path) {
    int64_t idims[3], ldims[1], ibytes, lbytes;
    uint8_t *images = NULL, *labels = NULL;
    if (idx_read(fn, images_path, IDX_MAGIC_IMAGES, idims, &images, &ibytes)) return NULL;
    if (idx_read(fn, labels_path, IDX_MAGIC_LABELS, ldims, &labels, &lbytes)) {
        free(images);
        return NULL;
    }
    na_dataset *ds = NULL;
    if (idims[0] != ldims[0]) {
        na_set_error(NA_EFORMAT,
                     "%s: image/label count mismatch: '%s' has %lld images but '%s' has %lld labels",
                     fn, images_path, (long long)idims[0], labels_path, (long long)ldims[0]);
        goto done;
    }
    if (idims[1] > INT_MAX || idims[2] > INT_MAX) {
        na_set_error(NA_EFORMAT, "%s: '%s': images of %lldx%lld pixels are too large", fn,
                     images_path, (long long)idims[1], (long long)idims[2]);
        goto done;
    }
    for (int64_t i = 0; i < lbytes; i++) {
        if (labels[i] >= IDX_NUM_CLASSES) {
            na_set_error(NA_EFORMAT,
                         "%s: '%s': label %u of sample %lld (offset %lld) is out of range 0..%d",
                         fn, labels_path, labels[i], (long long)i, (long long)(8 + i),
                         IDX_NUM_CLASSES - 1);
            goto done;
        }
    }
    ds = calloc(1, sizeof *ds);
    int32_t *lab = malloc((size_t)lbytes * sizeof(int32_t));
    if (!ds || !lab) {
        free(ds);
        free(lab);
        ds = NULL;
        na_set_error(NA_ENOMEM, "%s: cannot allocate %lld labels", fn, (long long)lbytes);
        goto done;
    }
    for (int64_t i = 0; i < lbytes; i++) lab[i] = labels[i];
    ds->n = idims[0];
    ds->channels = 1;
    ds->height = (int)idims[1];
    ds->width = (int)idims[2];
    ds->num_classes = IDX_NUM_CLASSES;
    ds->images = images;
    ds->labels = lab;
    images = NULL;
done:
    free(images);
    free(labels);
    return ds;
}

na_dataset *na_idx_load(const char *images_path, const char *labels_path) {
    return idx_load("na_idx_load", images_path, labels_path);
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Finds <dir>/<name> or <dir>/<name>.gz. */
static int find_idx(const char *dir, const char *name, char *out, size_t size) {
    int len = snprintf(out, size, "%s/%s", dir, name);
    if (len < 0 || (size_t)len + 3 >= size)
        return na_set_error(NA_EINVAL, "na_mnist_load: path '%s/%s' is too long", dir, name);
    if (is_file(out)) return NA_OK;
    memcpy(out + len, ".gz", 4);
    if (is_file(out)) return NA_OK;
    return na_set_error(NA_EIO,
                        "na_mnist_load: neither '%s/%s' nor '%s/%s.gz' exists; put the four "
                        "MNIST (or Fashion-MNIST) files train-images-idx3-ubyte, "
                        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
                        "(plain or .gz) in '%s'",
                        dir, name, dir, name, dir);
}

na_dataset *na_mnist_load(const char *dir, bool train) {
    if (!dir) {
        na_set_error(NA_EINVAL, "na_mnist_load: dir is NULL");
        return NULL;
    }
    char ip[4096], lp[4096];
    if (find_idx(dir, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", ip, sizeof ip))
        return NULL;
    if (find_idx(dir, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", lp, sizeof lp))
        return NULL;
    return idx_load("na_mnist_load", ip, lp);
}
