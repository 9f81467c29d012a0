/* IDX (MNIST-format) readers: na_idx_load and na_mnist_load.
 *
 * An IDX file is a 4-byte magic 00 00 TT DD (TT = 0x08 for u8 data, DD = number of dims),
 * DD big-endian u32 dims, then the C-order data. Every size is checked before it is used:
 * the magic and dims of both files are validated (and their counts compared) first, the
 * payload size is computed with overflow checks and compared with the file size (plain files)
 * before allocating; gzip streams are read in bounded chunks into buffers that grow with the
 * data actually present, never beyond what the header announced, so a lying header cannot
 * make us allocate gigabytes. */
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
#define IDX_CHUNK ((int64_t)1 << 20)            /* bytes read (and buffer growth) per step */
#define IDX_TRAILING_COUNT ((int64_t)1 << 24)   /* trailing bytes counted for the message */

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

static const char *idx_kind(uint32_t magic) {
    return magic == IDX_MAGIC_IMAGES ? "an IDX u8 image file (magic 0x00000803, dims N, rows, cols)"
                                     : "an IDX u8 label file (magic 0x00000801, dim N)";
}

/* One IDX file being read: its validated header and the data read so far. */
typedef struct {
    na_reader r;
    const char *path;
    uint32_t magic;
    int64_t header;     /* header bytes: 4 + 4 * ndim */
    int64_t dims[3];
    int64_t want;       /* data bytes the header announces */
    uint8_t *data;      /* len bytes read so far, room for cap */
    int64_t len, cap;
} idx_file;

static void idx_close(idx_file *x) {
    na_reader_close(&x->r);
    free(x->data);
    x->data = NULL;
}

/* Opens path and validates its header (magic, dims, size limit; for plain files also the file
 * size). Reads no data. On failure the file is closed. */
static int idx_open(const char *fn, const char *path, uint32_t want_magic, idx_file *x) {
    memset(x, 0, sizeof *x);
    x->path = path;
    x->magic = want_magic;
    const int ndim = (int)(want_magic & 0xff);
    const int64_t header = 4 + 4 * (int64_t)ndim;
    x->header = header;
    na_reader *r = &x->r;
    int st = na_reader_open(r, fn, path);
    if (st) return st;

    unsigned char hdr[16];
    int64_t got = na_reader_read(r, hdr, 4);
    if (got < 0) goto fail_status;
    if (got < 4) {
        st = na_set_error(NA_EFORMAT,
                          "%s: '%s' is truncated: %lld %sbytes, but the IDX magic alone takes 4 "
                          "(expected %s)",
                          fn, path, (long long)got, na_reader_kind(r), idx_kind(want_magic));
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
    got = na_reader_read(r, hdr + 4, header - 4);
    if (got < 0) goto fail_status;
    if (got < header - 4) {
        st = na_set_error(NA_EFORMAT,
                          "%s: '%s' is truncated: the %lld-byte header ends at offset %lld", fn,
                          path, (long long)header, (long long)(4 + got));
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
        x->dims[i] = d;
        if (__builtin_mul_overflow(bytes, (uint64_t)d, &bytes) || bytes > (uint64_t)IDX_MAX_BYTES) {
            st = na_set_error(NA_EFORMAT,
                              "%s: '%s': the dims in the header (offsets 4..%lld) describe more "
                              "than %lld bytes of data (limit)",
                              fn, path, (long long)header - 1, (long long)IDX_MAX_BYTES);
            goto fail;
        }
    }
    const int64_t want = (int64_t)bytes;
    x->want = want;
    if (!r->is_gz && r->size - header != want) {
        int64_t have = r->size - header;
        if (have < want)
            st = na_set_error(NA_EFORMAT,
                              "%s: '%s' is truncated: the header announces %lld data bytes after "
                              "the %lld-byte header, the file has %lld (%lld bytes in all, "
                              "expected %lld)",
                              fn, path, (long long)want, (long long)header, (long long)have,
                              (long long)r->size, (long long)(header + want));
        else
            st = na_set_error(NA_EFORMAT,
                              "%s: '%s' has %lld trailing bytes after offset %lld: the header "
                              "announces %lld data bytes (file size %lld, expected %lld)",
                              fn, path, (long long)(have - want), (long long)(header + want),
                              (long long)want, (long long)r->size, (long long)(header + want));
        goto fail;
    }
    return NA_OK;

fail_status:
    st = na_last_status();
fail:
    idx_close(x);
    return st;
}

/* Reads data until x->len == upto (<= x->want). The buffer grows with the bytes that actually
 * arrive (a gzip header may lie; a plain file's size was checked against it), so memory stays
 * proportional to the real content however large the announced size. */
static int idx_fill(const char *fn, idx_file *x, int64_t upto) {
    while (x->len < upto) {
        int64_t ask = upto - x->len < IDX_CHUNK ? upto - x->len : IDX_CHUNK;
        if (x->len + ask > x->cap) {
            int64_t cap = x->r.is_gz ? x->cap * 2 : x->want;
            if (cap < x->len + ask) cap = x->len + ask;
            if (cap > x->want) cap = x->want;
            uint8_t *d = realloc(x->data, (size_t)cap);
            if (!d)
                return na_set_error(NA_ENOMEM, "%s: '%s': cannot allocate %lld bytes", fn,
                                    x->path, (long long)cap);
            x->data = d;
            x->cap = cap;
        }
        int64_t got = na_reader_read(&x->r, x->data + x->len, ask);
        if (got < 0) return (int)got;
        x->len += got;
        if (got < ask) {
            if (!x->r.is_gz)
                return na_set_error(NA_EIO, "%s: '%s': file shrank while reading: data ends at "
                                            "offset %lld",
                                    fn, x->path, (long long)(x->header + x->len));
            return na_set_error(NA_EFORMAT,
                                "%s: '%s' is truncated: the header announces %lld data bytes after "
                                "the %lld-byte header, the decompressed gzip stream has %lld (ends "
                                "at offset %lld, expected %lld)",
                                fn, x->path, (long long)x->want, (long long)x->header,
                                (long long)x->len, (long long)(x->header + x->len),
                                (long long)(x->header + x->want));
        }
    }
    return NA_OK;
}

/* After all announced data: the file must end (for gzip: cleanly, trailer checked). */
static int idx_expect_end(const char *fn, idx_file *x) {
    unsigned char extra[4096];
    int64_t more = 0;
    for (;;) { /* count trailing bytes, up to a bound */
        int64_t got = na_reader_read(&x->r, extra, sizeof extra);
        if (got < 0) return (int)got;
        more += got;
        if (got < (int64_t)sizeof extra || more >= IDX_TRAILING_COUNT) break;
    }
    if (!more) return NA_OK;
    return na_set_error(NA_EFORMAT,
                        "%s: '%s' has %s%lld trailing bytes after decompressed offset %lld: the "
                        "header announces %lld data bytes",
                        fn, x->path, more >= IDX_TRAILING_COUNT ? "at least " : "",
                        (long long)more, (long long)(x->header + x->want), (long long)x->want);
}

/* Both headers are checked against each other before any data is read, and the two files are
 * then read side by side, a block of samples at a time: a file that announces more than it
 * holds fails as soon as its data ends, having cost memory for no more samples than the other
 * file really holds. */
static na_dataset *idx_load(const char *fn, const char *images_path, const char *labels_path) {
    idx_file im, lb;
    if (idx_open(fn, images_path, IDX_MAGIC_IMAGES, &im)) return NULL;
    if (idx_open(fn, labels_path, IDX_MAGIC_LABELS, &lb)) {
        idx_close(&im);
        return NULL;
    }
    na_dataset *ds = NULL;
    int32_t *lab = NULL;
    const int64_t n = im.dims[0], pixels = im.dims[1] * im.dims[2];
    if (n != lb.dims[0]) {
        na_set_error(NA_EFORMAT,
                     "%s: image/label count mismatch: '%s' has %lld images but '%s' has %lld labels",
                     fn, images_path, (long long)n, labels_path, (long long)lb.dims[0]);
        goto done;
    }
    if (im.dims[1] > INT_MAX || im.dims[2] > INT_MAX) {
        na_set_error(NA_EFORMAT, "%s: '%s': images of %lldx%lld pixels are too large", fn,
                     images_path, (long long)im.dims[1], (long long)im.dims[2]);
        goto done;
    }
    const int64_t block = pixels < IDX_CHUNK ? IDX_CHUNK / pixels : 1; /* samples per step */
    for (int64_t i0 = 0; i0 < n; i0 += block) {
        int64_t i1 = n - i0 < block ? n : i0 + block;
        if (idx_fill(fn, &lb, i1)) goto done;
        for (int64_t i = i0; i < i1; i++)
            if (lb.data[i] >= IDX_NUM_CLASSES) {
                na_set_error(NA_EFORMAT,
                             "%s: '%s': label %u of sample %lld (offset %lld) is out of range 0..%d",
                             fn, labels_path, lb.data[i], (long long)i, (long long)(lb.header + i),
                             IDX_NUM_CLASSES - 1);
                goto done;
            }
        if (idx_fill(fn, &im, i1 * pixels)) goto done;
    }
    if (idx_expect_end(fn, &im) || idx_expect_end(fn, &lb)) goto done;

    ds = calloc(1, sizeof *ds);
    lab = malloc((size_t)n * sizeof(int32_t));
    if (!ds || !lab) {
        free(ds);
        ds = NULL;
        na_set_error(NA_ENOMEM, "%s: cannot allocate %lld labels", fn, (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) lab[i] = lb.data[i];
    ds->n = n;
    ds->channels = 1;
    ds->height = (int)im.dims[1];
    ds->width = (int)im.dims[2];
    ds->num_classes = IDX_NUM_CLASSES;
    ds->images = im.data; /* exactly im.want bytes: the buffer never grows past it */
    ds->labels = lab;
    im.data = NULL;
    lab = NULL;
done:
    free(lab);
    idx_close(&im);
    idx_close(&lb);
    return ds;
}

na_dataset *na_idx_load(const char *images_path, const char *labels_path) {
    return idx_load("na_idx_load", images_path, labels_path);
}


/* Finds <dir>/<name> or <dir>/<name>.gz. */
static int find_idx(const char *dir, const char *name, char *out, size_t size) {
    int len = snprintf(out, size, "%s/%s", dir, name);
    if (len < 0 || (size_t)len + 3 >= size)
        return na_set_error(NA_EINVAL, "na_mnist_load: path '%s/%s' is too long", dir, name);
    if (na_path_exists(out)) return NA_OK;
    memcpy(out + len, ".gz", 4);
    if (na_path_exists(out)) return NA_OK;
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
