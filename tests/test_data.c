/* tests/test_data.c — IDX and CIFAR-10 readers (valid and hostile files, plain and gzip),
 * the synthetic dataset, and the batcher (shuffle, normalization, crop/flip, seek, prefetch).
 *
 * Every file is written by hand into a fresh mkdtemp directory; every corruption case checks
 * the status and the pieces of the message a user needs (file, expected, found, offset). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "nanoamp/data.h"
#include "nanoamp/error.h"
#include "src/data/splitmix.h"
#include "tmpdir.h"

/* ---- helpers ------------------------------------------------------------------------------ */


static void cleanup(void) { rm_rf(tmpdir); }

static const char *tpath(const char *name) {
    static char bufs[64][512];
    static int k;
    char *b = bufs[k++ % 64];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static void write_bytes(const char *path, const void *p, size_t n, bool gz) {
    if (gz) {
        gzFile g = gzopen(path, "wb");
        cr_assert_not_null(g);
        if (n) cr_assert_eq(gzwrite(g, p, (unsigned)n), (int)n);
        cr_assert_eq(gzclose(g), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        if (n) cr_assert_eq(fwrite(p, 1, n, f), n);
        cr_assert_eq(fclose(f), 0);
    }
}

static void put_be32(uint8_t *b, uint32_t v) {
    b[0] = (uint8_t)(v >> 24);
    b[1] = (uint8_t)(v >> 16);
    b[2] = (uint8_t)(v >> 8);
    b[3] = (uint8_t)v;
}

/* An IDX image file of n images rows x cols (pixel = (i*7 + k) & 255), in buf (malloc'd). */
static uint8_t *idx_images(uint32_t n, uint32_t rows, uint32_t cols, size_t *len) {
    size_t data = (size_t)n * rows * cols;
    uint8_t *b = malloc(16 + data);
    put_be32(b, 0x00000803);
    put_be32(b + 4, n);
    put_be32(b + 8, rows);
    put_be32(b + 12, cols);
    for (size_t k = 0; k < data; k++) b[16 + k] = (uint8_t)((k * 7 + k / 13) & 255);
    *len = 16 + data;
    return b;
}

static uint8_t *idx_labels(uint32_t n, size_t *len) {
    uint8_t *b = malloc(8 + n);
    put_be32(b, 0x00000801);
    put_be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)((i * 3) % 10);
    *len = 8 + n;
    return b;
}

#define assert_msg_has(s) \
    cr_assert(strstr(na_last_error(), (s)) != NULL, "message lacks \"%s\": %s", (s), na_last_error())

/* Loads img/lab (written plain or gzip) and expects a failure with status and substrings. */
static void expect_idx_fail(const uint8_t *img, size_t il, const uint8_t *lab, size_t ll,
                            bool gz, int status, const char *const *parts) {
    write_bytes(tpath("img"), img, il, gz);
    write_bytes(tpath("lab"), lab, ll, gz);
    na_clear_error();
    na_dataset *ds = na_idx_load(tpath("img"), tpath("lab"));
    cr_assert_null(ds, "%s file was accepted", gz ? "gzip" : "plain");
    cr_assert_eq(na_last_status(), status, "status %d (%s), want %d: %s", na_last_status(),
                 na_status_str(na_last_status()), status, na_last_error());
    assert_msg_has("na_idx_load");
    for (int i = 0; parts && parts[i]; i++) assert_msg_has(parts[i]);
}

/* ---- IDX: valid files --------------------------------------------------------------------- */

TestSuite(idx, .init = make_tmpdir, .fini = cleanup);

static void check_idx_dataset(const na_dataset *ds, uint32_t n, uint32_t rows, uint32_t cols,
                              const uint8_t *img, const uint8_t *lab) {
    cr_assert_not_null(ds, "%s", na_last_error());
    cr_assert_eq(ds->n, n);
    cr_assert_eq(ds->channels, 1);
    cr_assert_eq(ds->height, (int)rows);
    cr_assert_eq(ds->width, (int)cols);
    cr_assert_eq(ds->num_classes, 10);
    cr_assert_eq(memcmp(ds->images, img + 16, (size_t)n * rows * cols), 0);
    for (uint32_t i = 0; i < n; i++) cr_assert_eq(ds->labels[i], lab[8 + i]);
}

Test(idx, loads_plain_and_gzip_in_any_combination) {
    size_t il, ll;
    uint8_t *img = idx_images(5, 4, 3, &il), *lab = idx_labels(5, &ll);
    for (int combo = 0; combo < 4; combo++) {
        write_bytes(tpath("img"), img, il, combo & 1);
        write_bytes(tpath("lab"), lab, ll, combo & 2);
        na_dataset *ds = na_idx_load(tpath("img"), tpath("lab"));
        check_idx_dataset(ds, 5, 4, 3, img, lab);
        na_dataset_free(ds);
    }
    free(img);
    free(lab);
}

Test(idx, gzip_is_detected_by_magic_not_by_name) {
    size_t il, ll;
    uint8_t *img = idx_images(2, 2, 2, &il), *lab = idx_labels(2, &ll);
    write_bytes(tpath("images.bin"), img, il, true); /* gzip without .gz */
    write_bytes(tpath("labels.gz"), lab, ll, false); /* plain named .gz */
    na_dataset *ds = na_idx_load(tpath("images.bin"), tpath("labels.gz"));
    check_idx_dataset(ds, 2, 2, 2, img, lab);
    na_dataset_free(ds);
    free(img);
    free(lab);
}

Test(idx, a_large_gzip_file_is_read_in_chunks) {
    size_t il, ll;
    uint8_t *img = idx_images(3000, 28, 28, &il), *lab = idx_labels(3000, &ll); /* 2.3 MB */
    write_bytes(tpath("img"), img, il, true);
    write_bytes(tpath("lab"), lab, ll, true);
    na_dataset *ds = na_idx_load(tpath("img"), tpath("lab"));
    check_idx_dataset(ds, 3000, 28, 28, img, lab);
    na_dataset_free(ds);
    free(img);
    free(lab);
}

Test(idx, mnist_load_finds_plain_or_gz_files) {
    size_t il, ll;
    uint8_t *img = idx_images(4, 28, 28, &il), *lab = idx_labels(4, &ll);
    write_bytes(tpath("train-images-idx3-ubyte.gz"), img, il, true);
    write_bytes(tpath("train-labels-idx1-ubyte"), lab, ll, false);
    na_dataset *ds = na_mnist_load(tmpdir, true);
    check_idx_dataset(ds, 4, 28, 28, img, lab);
    na_dataset_free(ds);

    cr_assert_null(na_mnist_load(tmpdir, false));
    cr_assert_eq(na_last_status(), NA_EIO);
    assert_msg_has("t10k-images-idx3-ubyte");
    assert_msg_has(tmpdir);
    free(img);
    free(lab);
}

/* ---- IDX: hostile files ------------------------------------------------------------------- */

Test(idx, rejects_every_corruption_plain_and_gzip) {
    size_t il, ll;
    for (int gz = 0; gz < 2; gz++) {
        uint8_t *img = idx_images(3, 4, 5, &il), *lab = idx_labels(3, &ll); /* 60 data bytes */
        uint8_t *bad = malloc(il + 64);

        /* wrong magic */
        memcpy(bad, img, il);
        put_be32(bad, 0x00000804);
        expect_idx_fail(bad, il, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){tpath("img"), "bad magic 0x00000804 at offset 0",
                                         "expected 0x00000803", NULL});
        /* magic written little-endian */
        bad[0] = 0x03, bad[1] = 0x08, bad[2] = 0, bad[3] = 0;
        expect_idx_fail(bad, il, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"bad magic 0x03080000", "first two bytes", NULL});
        /* wrong data type */
        put_be32(bad, 0x00000903);
        expect_idx_fail(bad, il, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"0x00000903", "unsigned byte", NULL});
        /* wrong number of dims */
        put_be32(bad, 0x00000802);
        expect_idx_fail(bad, il, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"0x00000802", "number of dimensions", NULL});
        /* images and labels swapped */
        expect_idx_fail(lab, ll, img, il, gz, NA_EFORMAT,
                        (const char *[]){"bad magic 0x00000801", "swapped", NULL});
        /* labels file with images magic in the label slot */
        memcpy(bad, lab, ll);
        put_be32(bad, 0x00000803);
        write_bytes(tpath("img"), img, il, gz);
        write_bytes(tpath("lab"), bad, ll, gz);
        cr_assert_null(na_idx_load(tpath("img"), tpath("lab")));
        assert_msg_has(tpath("lab"));
        assert_msg_has("expected 0x00000801");

        /* truncated magic and truncated header */
        expect_idx_fail(img, 2, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"truncated", "magic alone takes 4", NULL});
        expect_idx_fail(img, 10, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"truncated", "16-byte header ends at offset 10", NULL});
        expect_idx_fail(img, il, lab, 6, gz, NA_EFORMAT,
                        (const char *[]){tpath("lab"), "8-byte header ends at offset 6", NULL});
        /* truncated data: one byte short */
        expect_idx_fail(img, il - 1, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"truncated", "announces 60 data bytes", "expected 76",
                                         NULL});
        expect_idx_fail(img, il, lab, ll - 1, gz, NA_EFORMAT,
                        (const char *[]){tpath("lab"), "truncated", "announces 3 data bytes",
                                         NULL});
        /* trailing bytes */
        memcpy(bad, img, il);
        bad[il] = 0xAB;
        bad[il + 1] = 0xCD;
        expect_idx_fail(bad, il + 2, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"2 trailing bytes after", "offset 76", NULL});
        /* a dim of 0 */
        memcpy(bad, img, il);
        put_be32(bad + 8, 0);
        expect_idx_fail(bad, il, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"dimension 1 (at offset 8) is 0", NULL});
        /* N*rows*cols overflows 32 and 64 bits: rejected before any allocation */
        put_be32(bad + 4, 0xFFFFFFFFu);
        put_be32(bad + 8, 0xFFFFFFFFu);
        put_be32(bad + 12, 0xFFFFFFFFu);
        expect_idx_fail(bad, il, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"more than 4294967296 bytes", NULL});
        /* 60000 x 28 x 28 announced (47 MB, under the cap), 60 bytes present */
        put_be32(bad + 4, 60000);
        put_be32(bad + 8, 28);
        put_be32(bad + 12, 28);
        size_t ll60k;
        uint8_t *lab60k = idx_labels(60000, &ll60k);
        expect_idx_fail(bad, il, lab60k, ll60k, gz, NA_EFORMAT,
                        (const char *[]){"truncated", "announces 47040000 data bytes", NULL});
        free(lab60k);
        /* count mismatch */
        uint8_t *lab2 = idx_labels(2, &ll);
        expect_idx_fail(img, il, lab2, ll, gz, NA_EFORMAT,
                        (const char *[]){"3 images", "2 labels", tpath("img"), tpath("lab"),
                                         NULL});
        free(lab2);
        /* label out of range */
        free(lab);
        lab = idx_labels(3, &ll);
        lab[8 + 1] = 10;
        expect_idx_fail(img, il, lab, ll, gz, NA_EFORMAT,
                        (const char *[]){"label 10 of sample 1 (offset 9)", "0..9", NULL});
        lab[8 + 1] = 255;
        expect_idx_fail(img, il, lab, ll, gz, NA_EFORMAT, (const char *[]){"label 255", NULL});
        free(bad);
        free(img);
        free(lab);
    }
}

Test(idx, rejects_corrupt_and_cut_gzip_streams) {
    size_t il, ll;
    uint8_t *img = idx_images(50, 28, 28, &il), *lab = idx_labels(50, &ll);
    write_bytes(tpath("img"), img, il, true);
    write_bytes(tpath("lab"), lab, ll, true);
    FILE *f = fopen(tpath("img"), "rb");
    uint8_t gzb[1 << 16];
    size_t gzn = fread(gzb, 1, sizeof gzb, f);
    fclose(f);
    cr_assert_gt(gzn, 100);

    /* cut in the middle of the deflate stream */
    write_bytes(tpath("cut"), gzb, gzn / 2, false);
    cr_assert_null(na_idx_load(tpath("cut"), tpath("lab")));
    cr_assert_eq(na_last_status(), NA_EFORMAT, "%s", na_last_error());
    assert_msg_has(tpath("cut"));
    assert_msg_has("truncated");

    /* garbage inside the deflate stream */
    memset(gzb + 20, 0xFF, 40);
    write_bytes(tpath("garbage"), gzb, gzn, false);
    cr_assert_null(na_idx_load(tpath("garbage"), tpath("lab")));
    cr_assert(na_last_status() == NA_EFORMAT || na_last_status() == NA_EIO);
    assert_msg_has(tpath("garbage"));

    /* only the gzip magic */
    write_bytes(tpath("magic"), "\x1f\x8b", 2, false);
    cr_assert_null(na_idx_load(tpath("magic"), tpath("lab")));
    assert_msg_has(tpath("magic"));
    free(img);
    free(lab);
}

/* One complete gzip member (RFC 1952) holding n bytes, in a malloc'd buffer. */
static uint8_t *gz_member(const void *p, size_t n, size_t *len) {
    z_stream zs = {0};
    cr_assert_eq(deflateInit2(&zs, 9, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&zs, (uLong)n);
    uint8_t *out = malloc(cap);
    zs.next_in = (Bytef *)p;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
    *len = cap - zs.avail_out;
    deflateEnd(&zs);
    return out;
}

/* Writes the concatenation of parts (each repeated reps[i] times) to path. */
static void write_parts(const char *path, int n, const uint8_t *const *parts, const size_t *lens,
                        const int *reps) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < reps[i]; r++) cr_assert_eq(fwrite(parts[i], 1, lens[i], f), lens[i]);
    cr_assert_eq(fclose(f), 0);
}

Test(idx, gzip_trailer_is_checked_and_trailing_bytes_are_rejected) {
    size_t il, ll, gl, ml;
    uint8_t *img = idx_images(20, 4, 5, &il), *lab = idx_labels(20, &ll);
    write_bytes(tpath("lab"), lab, ll, true);
    uint8_t *g = gz_member(img, il, &gl);
    uint8_t *bad = malloc(gl + 16);
    const char *p = tpath("img");

    /* the intact member loads */
    write_bytes(p, g, gl, false);
    na_dataset *ds = na_idx_load(p, tpath("lab"));
    check_idx_dataset(ds, 20, 4, 5, img, lab);
    na_dataset_free(ds);

    /* trailer (CRC-32 + length) missing, or only the length missing: all data is there */
    for (size_t cut = 8; cut >= 4; cut -= 4) {
        write_bytes(p, g, gl - cut, false);
        char off[64];
        snprintf(off, sizeof off, "cut off at file offset %zu", gl - cut);
        expect_idx_fail(g, gl - cut, lab, ll, false, NA_EFORMAT,
                        (const char *[]){p, "truncated", off, "trailer", NULL});
    }
    /* a wrong CRC-32, a wrong length */
    memcpy(bad, g, gl);
    bad[gl - 8] ^= 0x01;
    expect_idx_fail(bad, gl, lab, ll, false, NA_EFORMAT,
                    (const char *[]){p, "incorrect data check", "file offset", NULL});
    memcpy(bad, g, gl);
    bad[gl - 4] ^= 0x01;
    expect_idx_fail(bad, gl, lab, ll, false, NA_EFORMAT,
                    (const char *[]){p, "incorrect length check", NULL});
    /* garbage (or zero padding) after the stream */
    memcpy(bad, g, gl);
    memcpy(bad + gl, "garbage!", 8);
    char off[128];
    snprintf(off, sizeof off, "8 trailing bytes after the end of the gzip data at file offset %zu",
             gl);
    expect_idx_fail(bad, gl + 8, lab, ll, false, NA_EFORMAT, (const char *[]){p, off, NULL});
    memset(bad + gl, 0, 3);
    expect_idx_fail(bad, gl + 3, lab, ll, false, NA_EFORMAT,
                    (const char *[]){"3 trailing bytes", NULL});
    bad[gl] = 0x1f; /* one byte that could start a member */
    expect_idx_fail(bad, gl + 1, lab, ll, false, NA_EFORMAT,
                    (const char *[]){"1 trailing bytes", NULL});

    /* concatenated members are one stream (as gzip -d reads them): the file split in two
     * members loads; a second member beyond the announced data is trailing data */
    size_t l1, l2;
    uint8_t *m1 = gz_member(img, 30, &l1), *m2 = gz_member(img + 30, il - 30, &l2);
    write_parts(p, 2, (const uint8_t *[]){m1, m2}, (size_t[]){l1, l2}, (int[]){1, 1});
    ds = na_idx_load(p, tpath("lab"));
    check_idx_dataset(ds, 20, 4, 5, img, lab);
    na_dataset_free(ds);
    uint8_t *m3 = gz_member("xyz", 3, &ml);
    write_parts(p, 2, (const uint8_t *[]){g, m3}, (size_t[]){gl, ml}, (int[]){1, 1});
    cr_assert_null(na_idx_load(p, tpath("lab")));
    assert_msg_has("3 trailing bytes after decompressed offset 416");
    /* the labels file is checked the same way */
    uint8_t *gl2 = gz_member(lab, ll, &ml);
    write_bytes(p, g, gl, false);
    write_bytes(tpath("lab"), gl2, ml - 8, false);
    cr_assert_null(na_idx_load(p, tpath("lab")));
    assert_msg_has(tpath("lab"));
    assert_msg_has("trailer");
    free(m1);
    free(m2);
    free(m3);
    free(gl2);
    free(bad);
    free(g);
    free(img);
    free(lab);
}

/* A gzip file whose header announces n samples: the header in its own member, then `megs`
 * members of 1 MiB of zero bytes (a few hundred bytes each: real, highly compressible data). */
static void write_zero_bomb(const char *path, uint32_t magic, uint32_t n, uint32_t rows,
                            uint32_t cols, int megs) {
    uint8_t hdr[16];
    put_be32(hdr, magic);
    put_be32(hdr + 4, n);
    put_be32(hdr + 8, rows);
    put_be32(hdr + 12, cols);
    size_t hl, zl, zeros = 1 << 20;
    uint8_t *h = gz_member(hdr, magic == 0x00000803 ? 16 : 8, &hl);
    uint8_t *zbuf = calloc(zeros, 1);
    uint8_t *z = gz_member(zbuf, zeros, &zl);
    write_parts(path, 2, (const uint8_t *[]){h, z}, (size_t[]){hl, zl}, (int[]){1, megs});
    free(h);
    free(z);
    free(zbuf);
}

/* na_idx_load in a forked child: its status, message, seconds, and how much its peak RSS grew
 * (KiB) while loading. */
typedef struct {
    int status;
    long rss_growth_kb;
    double seconds;
    char msg[512];
} load_probe;

static load_probe probe_idx_load(const char *images, const char *labels) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        load_probe r = {0};
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        long before = ru.ru_maxrss;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        na_dataset *ds = na_idx_load(images, labels);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        getrusage(RUSAGE_SELF, &ru);
        r.status = ds ? NA_OK : na_last_status();
        r.rss_growth_kb = ru.ru_maxrss - before;
        r.seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        snprintf(r.msg, sizeof r.msg, "%s", na_last_error());
        if (write(fds[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(2);
        _exit(0);
    }
    close(fds[1]);
    load_probe r = {.status = 1};
    ssize_t got = read(fds[0], &r, sizeof r);
    close(fds[0]);
    int ws;
    waitpid(pid, &ws, 0);
    cr_assert(got == (ssize_t)sizeof r && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
              "the loading child died (status 0x%x)", ws);
    return r;
}

static void expect_cheap_failure(const char *images, const char *labels, const char *needle) {
    load_probe r = probe_idx_load(images, labels);
    cr_log_info("peak RSS grew by %ld KiB in %.3f s: %s", r.rss_growth_kb, r.seconds, r.msg);
    cr_assert_eq(r.status, NA_EFORMAT, "status %d: %s", r.status, r.msg);
    cr_assert(strstr(r.msg, needle), "message lacks \"%s\": %s", needle, r.msg);
    cr_assert_lt(r.rss_growth_kb, 64 * 1024, "peak memory grew by %ld KiB: %s", r.rss_growth_kb,
                 r.msg);
    cr_assert_lt(r.seconds, 5.0, "took %.1f s: %s", r.seconds, r.msg);
}

Test(idx, lying_gzip_headers_cost_only_what_the_files_hold, .timeout = 120) {
    const uint32_t n = 600 * 1024; /* 600 MiB of 32x32 images, 614400 labels */
    char big_img[600], big_lab[600], small_lab[600], short_img[600];
    snprintf(big_img, sizeof big_img, "%s", tpath("big-images.gz"));
    snprintf(big_lab, sizeof big_lab, "%s", tpath("big-labels.gz"));
    snprintf(small_lab, sizeof small_lab, "%s", tpath("small-labels.gz"));
    snprintf(short_img, sizeof short_img, "%s", tpath("short-images.gz"));
    write_zero_bomb(big_img, 0x00000803, n, 32, 32, 600); /* all 600 MiB present */
    write_zero_bomb(big_lab, 0x00000801, n * 1024, 0, 0, 600);
    write_zero_bomb(small_lab, 0x00000801, n, 0, 0, 0); /* no labels at all */
    write_zero_bomb(short_img, 0x00000803, n * 1024, 1, 1, 1);
    struct stat st;
    cr_assert_eq(stat(big_img, &st), 0);
    cr_assert_lt(st.st_size, 2 << 20, "the test file is %lld bytes", (long long)st.st_size);

    /* counts disagree: found from the headers, before any data is read */
    size_t ll;
    uint8_t *lab = idx_labels(5, &ll);
    write_bytes(tpath("five-labels"), lab, ll, true);
    free(lab);
    expect_cheap_failure(big_img, tpath("five-labels"), "614400 images but");
    /* the labels file ends at once: the images are not read beyond it */
    expect_cheap_failure(big_img, small_lab, "small-labels.gz' is truncated");
    /* the other way round: 600 MiB of labels, 1 MiB of images announced as 600 MiB */
    expect_cheap_failure(short_img, big_lab, "short-images.gz' is truncated");
}

Test(idx, missing_files_and_bad_arguments) {
    cr_assert_null(na_idx_load(tpath("nope"), tpath("nope2")));
    cr_assert_eq(na_last_status(), NA_EIO);
    assert_msg_has("cannot open");
    assert_msg_has(tpath("nope"));
    cr_assert_null(na_idx_load(NULL, NULL));
    cr_assert_eq(na_last_status(), NA_EINVAL);
    cr_assert_null(na_idx_load(tmpdir, tmpdir)); /* a directory */
    cr_assert_eq(na_last_status(), NA_EIO);
    cr_assert_null(na_mnist_load(NULL, true));
}

/* A FIFO with no writer would block fopen forever: it is refused before anything waits. A
 * directory where a data file belongs is named for what it is, not reported missing. */
Test(idx, fifos_and_directories_are_refused_without_blocking, .timeout = 30) {
    cr_assert_eq(mkfifo(tpath("fifo"), 0600), 0);
    cr_assert_null(na_idx_load(tpath("fifo"), tpath("fifo")));
    cr_assert_eq(na_last_status(), NA_EIO);
    assert_msg_has(tpath("fifo"));
    assert_msg_has("is a FIFO, not a regular file");
    const char *p[] = {tpath("fifo")};
    cr_assert_null(na_cifar_load_files(p, 1, false));
    assert_msg_has("is a FIFO, not a regular file");
    cr_assert_null(na_idx_load(tmpdir, tmpdir));
    assert_msg_has("is a directory, not a regular file");

    cr_assert_eq(mkdir(tpath("train-images-idx3-ubyte"), 0755), 0);
    write_bytes(tpath("train-labels-idx1-ubyte"), "x", 1, false);
    cr_assert_null(na_mnist_load(tmpdir, true));
    cr_assert_eq(na_last_status(), NA_EIO);
    assert_msg_has("train-images-idx3-ubyte' is a directory, not a regular file");
}

/* ---- CIFAR -------------------------------------------------------------------------------- */

TestSuite(cifar, .init = make_tmpdir, .fini = cleanup);

/* records with label (first + r) % 10 and pixel k = (r*31 + k) & 255 */
static uint8_t *cifar_records(int n, int first) {
    uint8_t *b = malloc((size_t)n * 3073);
    for (int r = 0; r < n; r++) {
        b[r * 3073] = (uint8_t)((first + r) % 10);
        for (int k = 0; k < 3072; k++) b[r * 3073 + 1 + k] = (uint8_t)((r * 31 + k) & 255);
    }
    return b;
}

Test(cifar, loads_small_files_in_chw_order) {
    uint8_t *a = cifar_records(3, 0), *b = cifar_records(2, 7);
    write_bytes(tpath("a.bin"), a, 3 * 3073, false);
    write_bytes(tpath("b.bin"), b, 2 * 3073, false);
    const char *paths[] = {tpath("a.bin"), tpath("b.bin")};
    na_dataset *ds = na_cifar_load_files(paths, 2, false);
    cr_assert_not_null(ds, "%s", na_last_error());
    cr_assert_eq(ds->n, 5);
    cr_assert_eq(ds->channels, 3);
    cr_assert_eq(ds->height, 32);
    cr_assert_eq(ds->width, 32);
    cr_assert_eq(ds->num_classes, 10);
    int want_labels[] = {0, 1, 2, 7, 8};
    for (int i = 0; i < 5; i++) cr_assert_eq(ds->labels[i], want_labels[i]);
    /* record 1 of file a: green channel (c=1), row 2, col 5 = byte 1 + 1024 + 2*32 + 5 */
    cr_assert_eq(ds->images[1 * 3072 + 1024 + 2 * 32 + 5], a[3073 + 1 + 1024 + 69]);
    cr_assert_eq(memcmp(ds->images + 3 * 3072, b + 1, 3072), 0);
    cr_assert_eq(memcmp(ds->images + 4 * 3072, b + 3073 + 1, 3072), 0);
    na_dataset_free(ds);

    /* exact_size demands the official 10000 records */
    cr_assert_null(na_cifar_load_files(paths, 2, true));
    cr_assert_eq(na_last_status(), NA_EFORMAT);
    assert_msg_has(tpath("a.bin"));
    assert_msg_has("expected exactly 30730000");
    free(a);
    free(b);
}

Test(cifar, rejects_bad_files) {
    uint8_t *a = cifar_records(3, 0);
    const char *p[] = {tpath("x.bin")};
    /* size not a multiple of 3073 */
    write_bytes(p[0], a, 2 * 3073 + 5, false);
    cr_assert_null(na_cifar_load_files(p, 1, false));
    cr_assert_eq(na_last_status(), NA_EFORMAT);
    assert_msg_has(p[0]);
    assert_msg_has("6151 bytes, not a multiple of the 3073-byte record");
    assert_msg_has("2 whole records and 5 stray bytes");
    /* label > 9 */
    a[3073] = 10;
    write_bytes(p[0], a, 3 * 3073, false);
    cr_assert_null(na_cifar_load_files(p, 1, false));
    cr_assert_eq(na_last_status(), NA_EFORMAT);
    assert_msg_has("label 10 of record 1 (offset 3073)");
    /* empty */
    write_bytes(p[0], a, 0, false);
    cr_assert_null(na_cifar_load_files(p, 1, false));
    assert_msg_has("empty");
    /* missing */
    const char *m[] = {tpath("missing.bin")};
    cr_assert_null(na_cifar_load_files(m, 1, false));
    cr_assert_eq(na_last_status(), NA_EIO);
    assert_msg_has(m[0]);
    /* gzip-compressed file gets a hint */
    write_bytes(p[0], a, 3073, true);
    cr_assert_null(na_cifar_load_files(p, 1, false));
    assert_msg_has("gzip");
    cr_assert_null(na_cifar_load_files(NULL, 0, false));
    cr_assert_eq(na_last_status(), NA_EINVAL);
    free(a);
}

Test(cifar, cifar10_load_finds_official_files_or_says_where_to_put_them) {
    cr_assert_null(na_cifar10_load(tmpdir, true));
    cr_assert_eq(na_last_status(), NA_EIO);
    assert_msg_has("data_batch_1.bin");
    assert_msg_has("cifar-10-batches-bin");
    assert_msg_has("https://www.cs.toronto.edu/~kriz/cifar.html");
    assert_msg_has(tmpdir);

    /* an official-size test_batch.bin (all-zero records: label 0) in the tarball's folder */
    char sub[512];
    snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin", tmpdir);
    cr_assert_eq(mkdir(sub, 0755), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/test_batch.bin", sub);
    FILE *f = fopen(path, "wb");
    cr_assert_eq(ftruncate(fileno(f), 30730000), 0);
    uint8_t rec[3073] = {3};
    rec[1 + 3071] = 200;
    fseek(f, 9999L * 3073, SEEK_SET);
    fwrite(rec, 1, sizeof rec, f);
    fclose(f);
    na_dataset *ds = na_cifar10_load(tmpdir, false);
    cr_assert_not_null(ds, "%s", na_last_error());
    cr_assert_eq(ds->n, 10000);
    cr_assert_eq(ds->labels[0], 0);
    cr_assert_eq(ds->labels[9999], 3);
    cr_assert_eq(ds->images[9999 * 3072 + 3071], 200);
    na_dataset_free(ds);

    /* train split: batches 1..4 present, 5 missing */
    for (int i = 1; i <= 4; i++) {
        snprintf(path, sizeof path, "%s/data_batch_%d.bin", sub, i);
        f = fopen(path, "wb");
        cr_assert_eq(ftruncate(fileno(f), 30730000), 0);
        fclose(f);
    }
    cr_assert_null(na_cifar10_load(tmpdir, true));
    assert_msg_has("data_batch_5.bin");
    /* a directory by that name is there, not missing */
    snprintf(path, sizeof path, "%s/data_batch_5.bin", sub);
    cr_assert_eq(mkdir(path, 0755), 0);
    cr_assert_null(na_cifar10_load(tmpdir, true));
    assert_msg_has("data_batch_5.bin' is a directory, not a regular file");
    cr_assert_null(strstr(na_last_error(), "missing"), "%s", na_last_error());
}

/* ---- synthetic ---------------------------------------------------------------------------- */

Test(synthetic, deterministic_and_learnable) {
    na_dataset *a = na_dataset_synthetic_cifar(2000, 42), *b = na_dataset_synthetic_cifar(2000, 42);
    na_dataset *c = na_dataset_synthetic_cifar(2000, 43);
    cr_assert(a && b && c);
    cr_assert_eq(a->channels, 3);
    cr_assert_eq(a->height, 32);
    cr_assert_eq(memcmp(a->images, b->images, 2000 * 3072), 0);
    cr_assert_eq(memcmp(a->labels, b->labels, 2000 * 4), 0);
    cr_assert_neq(memcmp(a->images, c->images, 2000 * 3072), 0);
    int count[10] = {0};
    for (int i = 0; i < 2000; i++) {
        cr_assert(a->labels[i] >= 0 && a->labels[i] < 10);
        count[a->labels[i]]++;
    }
    for (int k = 0; k < 10; k++) cr_assert_gt(count[k], 100);
    /* nearest class mean (trained on a, tested on c) is far above chance */
    double *mean = calloc(10 * 3072, sizeof(double));
    for (int i = 0; i < 2000; i++)
        for (int p = 0; p < 3072; p++) mean[a->labels[i] * 3072 + p] += a->images[i * 3072 + p];
    for (int k = 0; k < 10; k++)
        for (int p = 0; p < 3072; p++) mean[k * 3072 + p] /= count[k];
    int correct = 0;
    for (int i = 0; i < 2000; i++) {
        int best = -1;
        double bd = 0;
        for (int k = 0; k < 10; k++) {
            double d = 0;
            for (int p = 0; p < 3072; p++) {
                double t = c->images[i * 3072 + p] - mean[k * 3072 + p];
                d += t * t;
            }
            if (best < 0 || d < bd) best = k, bd = d;
        }
        correct += best == c->labels[i];
    }
    cr_assert_gt(correct, 1000, "nearest-mean accuracy %d/2000", correct);
    free(mean);
    na_dataset_free(a);
    na_dataset_free(b);
    na_dataset_free(c);
}

/* ---- batcher ------------------------------------------------------------------------------ */

/* n samples of 1x1x2 whose pixels encode the index (lo, hi byte); label = index % 10 */
static na_dataset *indexed_dataset(int64_t n) {
    na_dataset *ds = na_dataset_new(n, 1, 1, 2, 10);
    cr_assert_not_null(ds);
    for (int64_t i = 0; i < n; i++) {
        ds->images[2 * i] = (uint8_t)(i & 255);
        ds->images[2 * i + 1] = (uint8_t)(i >> 8);
        ds->labels[i] = (int32_t)(i % 10);
    }
    return ds;
}

static int64_t decode_index(const float *x) {
    return lrintf(x[0] * 255.0f) + 256 * lrintf(x[1] * 255.0f);
}

/* The dataset indices of one epoch, in order. Returns the count. */
static int64_t epoch_order(na_batcher *b, int64_t epoch, int64_t *out, int64_t bsz,
                           int64_t *nbatches) {
    float x[2 * 64];
    int32_t y[64];
    int64_t got, total = 0;
    *nbatches = 0;
    cr_assert_eq(na_batcher_start_epoch(b, epoch), NA_OK);
    while (na_batcher_next(b, x, y, &got)) {
        cr_assert(got > 0 && got <= bsz);
        for (int64_t k = 0; k < got; k++) {
            out[total] = decode_index(x + 2 * k);
            cr_assert_eq(y[k], out[total] % 10);
            total++;
        }
        (*nbatches)++;
    }
    return total;
}

Test(batcher, shuffle_is_a_seeded_permutation_per_epoch) {
    na_dataset *ds = indexed_dataset(103);
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 10, .seed = 7, .shuffle = true});
    na_batcher *b2 = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 10, .seed = 7, .shuffle = true});
    cr_assert(b && b2, "%s", na_last_error());
    cr_assert_eq(na_batcher_steps_per_epoch(b), 11);
    int64_t o0[103], o1[103], o0b[103], nb;
    cr_assert_eq(epoch_order(b, 0, o0, 10, &nb), 103);
    cr_assert_eq(nb, 11);
    cr_assert_eq(epoch_order(b, 1, o1, 10, &nb), 103);
    cr_assert_eq(epoch_order(b2, 0, o0b, 10, &nb), 103);
    bool seen[103] = {0};
    int moved = 0, differs = 0;
    for (int i = 0; i < 103; i++) {
        cr_assert(o0[i] >= 0 && o0[i] < 103);
        cr_assert(!seen[o0[i]], "index %lld twice", (long long)o0[i]);
        seen[o0[i]] = true;
        moved += o0[i] != i;
        differs += o0[i] != o1[i];
        cr_assert_eq(o0[i], o0b[i]); /* same seed, same epoch, same order */
    }
    cr_assert_gt(moved, 80);
    cr_assert_gt(differs, 80);
    /* the public permutation is the batcher's order */
    int64_t perm[103];
    na_shuffle_permutation(perm, 103, 7, 1);
    cr_assert_eq(memcmp(perm, o1, sizeof perm), 0);
    na_batcher_free(b);
    na_batcher_free(b2);

    /* no shuffle: identity; a different seed: a different order */
    b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 16});
    cr_assert_eq(epoch_order(b, 3, o0, 16, &nb), 103);
    for (int i = 0; i < 103; i++) cr_assert_eq(o0[i], i);
    na_batcher_free(b);
    b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 16, .seed = 8, .shuffle = true});
    epoch_order(b, 0, o1, 16, &nb);
    cr_assert_neq(memcmp(o0b, o1, sizeof o1), 0);
    na_batcher_free(b);
    na_dataset_free(ds);
}

Test(batcher, drop_last_skips_the_partial_batch) {
    na_dataset *ds = indexed_dataset(103);
    na_batcher *b = na_batcher_new(
        ds, &(na_batcher_cfg){.batch_size = 10, .seed = 1, .shuffle = true, .drop_last = true});
    cr_assert_eq(na_batcher_steps_per_epoch(b), 10);
    int64_t o[103], nb;
    cr_assert_eq(epoch_order(b, 0, o, 10, &nb), 100);
    cr_assert_eq(nb, 10);
    bool seen[103] = {0};
    for (int i = 0; i < 100; i++) {
        cr_assert(!seen[o[i]]);
        seen[o[i]] = true;
    }
    /* after the end, next keeps returning false until a new epoch */
    float x[20];
    int32_t y[10];
    int64_t got = -1;
    cr_assert(!na_batcher_next(b, x, y, &got));
    cr_assert_eq(got, 0);
    na_batcher_free(b);
    na_dataset_free(ds);
}

/* The sorted copy of n indices (to compare batches as sets). */
static void sorted(const int64_t *in, int64_t n, int64_t *out) {
    memmove(out, in, (size_t)n * sizeof *out);
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int64_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
}

Test(batcher, shards_are_disjoint_and_together_are_the_epoch) {
    enum { N = 103, B = 5, MAXW = 4 };
    na_dataset *ds = indexed_dataset(N);
    for (int world = 2; world <= MAXW; world++) {
        /* one rank with world * B per batch: batch k of every rank together is its batch k */
        na_batcher *one = na_batcher_new(
            ds, &(na_batcher_cfg){.batch_size = B * world, .seed = 7, .shuffle = true});
        int64_t whole[N], nb1;
        cr_assert_eq(epoch_order(one, 1, whole, B * world, &nb1), N);
        int64_t shard[MAXW][N], got[MAXW], steps = -1;
        int count[N] = {0};
        for (int r = 0; r < world; r++) {
            na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = B, .seed = 7,
                                                                 .shuffle = true,
                                                                 .world_size = world, .rank = r});
            cr_assert(b, "%s", na_last_error());
            int64_t nb;
            got[r] = epoch_order(b, 1, shard[r], B, &nb);
            /* padded to a multiple of world: every rank has ceil(N / world) samples and the
             * same number of steps */
            cr_assert_eq(got[r], (N + world - 1) / world, "world %d rank %d", world, r);
            cr_assert_eq(nb, na_batcher_steps_per_epoch(b));
            if (r) cr_assert_eq(nb, steps);
            steps = nb;
            for (int64_t i = 0; i < got[r]; i++) count[shard[r][i]]++;
            na_batcher_free(b);
        }
        cr_assert_eq(steps, nb1);
        /* the union is the epoch; only the world - 1 or fewer padded samples come twice */
        int twice = 0;
        for (int i = 0; i < N; i++) {
            cr_assert(count[i] == 1 || count[i] == 2, "index %d seen %d times", i, count[i]);
            twice += count[i] == 2;
        }
        cr_assert_eq(twice, (int)(got[0] * world - N));
        /* step k of all ranks, as a set, is step k of one rank with world x the batch; the
         * last one also holds the padding, which is the start of the epoch's order */
        for (int64_t k = 0; k < steps; k++) {
            int64_t joint[MAXW * B], want[MAXW * B], m = 0;
            for (int r = 0; r < world; r++)
                for (int64_t i = k * B; i < (k + 1) * B && i < got[r]; i++) joint[m++] = shard[r][i];
            int64_t w = k * B * world, wn = N - w < B * world ? N - w : B * world;
            cr_assert(m >= wn && m - wn < world, "world %d step %lld", world, (long long)k);
            memcpy(want, whole + w, (size_t)wn * sizeof *want);
            memcpy(want + wn, whole, (size_t)(m - wn) * sizeof *want);
            sorted(want, m, want);
            sorted(joint, m, joint);
            cr_assert_eq(memcmp(joint, want, (size_t)m * sizeof *want), 0, "world %d step %lld",
                         world, (long long)k);
        }
        na_batcher_free(one);
    }
    /* evaluation without padding: exactly the epoch, each sample once */
    int count[N] = {0};
    for (int r = 0; r < 4; r++) {
        na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = B, .world_size = 4,
                                                             .rank = r, .shard_no_pad = true});
        int64_t o[N], nb, n = epoch_order(b, 0, o, B, &nb);
        cr_assert_eq(n, N / 4 + (r < N % 4));
        for (int64_t i = 0; i < n; i++) count[o[i]]++;
        na_batcher_free(b);
    }
    for (int i = 0; i < N; i++) cr_assert_eq(count[i], 1);
    na_dataset_free(ds);
}

Test(batcher, a_shard_resumes_exactly) {
    enum { N = 300, B = 16, WORLD = 3 };
    na_dataset *ds = na_dataset_synthetic_cifar(N, 5);
    for (int pf = 0; pf < 2; pf++)
        for (int r = 0; r < WORLD; r++) {
            na_batcher_cfg cfg = {.batch_size = B, .seed = 3, .shuffle = true, .crop_pad = 4,
                                  .hflip = true, .prefetch = pf, .world_size = WORLD, .rank = r};
            na_batcher *run = na_batcher_new(ds, &cfg), *resumed = na_batcher_new(ds, &cfg);
            cr_assert(run && resumed, "%s", na_last_error());
            int64_t steps = na_batcher_steps_per_epoch(run), fl = (int64_t)B * 3072, got, got2;
            cr_assert_eq(steps, (N / WORLD + B - 1) / B);
            float *x = malloc(fl * sizeof(float)), *x2 = malloc(fl * sizeof(float));
            int32_t y[B], y2[B];
            /* the uninterrupted run's epoch 1, step 3 */
            cr_assert_eq(na_batcher_start_epoch(run, 1), NA_OK);
            for (int k = 0; k < 4; k++) cr_assert(na_batcher_next(run, x, y, &got));
            cr_assert_eq(na_batcher_seek(resumed, 1, 3), NA_OK);
            cr_assert(na_batcher_next(resumed, x2, y2, &got2));
            cr_assert_eq(got, got2);
            cr_assert_eq(memcmp(y, y2, sizeof y), 0);
            cr_assert_eq(memcmp(x, x2, (size_t)got * 3072 * sizeof(float)), 0);
            free(x), free(x2);
            na_batcher_free(run);
            na_batcher_free(resumed);
        }
    na_dataset_free(ds);
}

Test(batcher, normalization_per_channel) {
    na_dataset *ds = na_dataset_new(1, 3, 2, 2, 10);
    const uint8_t px[4] = {0, 1, 128, 255};
    for (int c = 0; c < 3; c++) memcpy(ds->images + c * 4, px, 4);
    const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 1, .mean = mean, .std = std});
    cr_assert_not_null(b, "%s", na_last_error());
    float x[12];
    int32_t y[1];
    int64_t got;
    cr_assert(na_batcher_next(b, x, y, &got));
    cr_assert_eq(got, 1);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < 4; k++) {
            double want = (px[k] / 255.0 - mean[c]) / std[c];
            cr_assert_float_eq(x[c * 4 + k], want, 1e-6, "c=%d p=%u: %.9g vs %.9g", c, px[k],
                               x[c * 4 + k], want);
        }
    cr_assert_eq(na_batcher_batch_bytes(b), 12 * sizeof(float));
    na_batcher_free(b);
    /* defaults: x = p / 255 */
    b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 1});
    cr_assert(na_batcher_next(b, x, y, &got));
    cr_assert_eq(x[0], 0.0f);
    cr_assert_eq(x[3], 1.0f);
    cr_assert_float_eq(x[2], 128 / 255.0, 1e-7);
    na_batcher_free(b);
    na_dataset_free(ds);
}

/* Expected crop/flip of an HxW single-channel image (values 1..255) for offsets (oy, ox) in
 * the padded image and flip; padding is 0. */
static void crop_flip_ref(const uint8_t *img, int H, int W, int pad, int oy, int ox, bool flip,
                          uint8_t *out) {
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int cx = flip ? W - 1 - x : x; /* column in the crop */
            int sy = y + oy - pad, sx = cx + ox - pad;
            out[y * W + x] = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? img[sy * W + sx] : 0;
        }
}

Test(batcher, crop_with_zero_padding_and_flip_on_a_hand_made_image) {
    enum { H = 8, W = 8, PAD = 4 };
    na_dataset *ds = na_dataset_new(1, 1, H, W, 10);
    for (int k = 0; k < H * W; k++) ds->images[k] = (uint8_t)(k + 1); /* unique, non-zero */
    na_batcher *b = na_batcher_new(
        ds, &(na_batcher_cfg){.batch_size = 1, .seed = 3, .crop_pad = PAD, .hflip = true});
    cr_assert_not_null(b, "%s", na_last_error());
    int seen_oy[2 * PAD + 1] = {0}, seen_ox[2 * PAD + 1] = {0}, flips = 0, identity = 0;
    const int epochs = 400;
    for (int e = 0; e < epochs; e++) {
        float x[H * W];
        int32_t y[1];
        int64_t got;
        na_batcher_start_epoch(b, e);
        cr_assert(na_batcher_next(b, x, y, &got));
        uint8_t out[H * W], ref[H * W];
        for (int k = 0; k < H * W; k++) out[k] = (uint8_t)lrintf(x[k] * 255.0f);
        int matches = 0, moy = 0, mox = 0;
        bool mflip = false;
        for (int oy = 0; oy <= 2 * PAD; oy++)
            for (int ox = 0; ox <= 2 * PAD; ox++)
                for (int f = 0; f < 2; f++) {
                    crop_flip_ref(ds->images, H, W, PAD, oy, ox, f, ref);
                    if (memcmp(ref, out, sizeof out) == 0) matches++, moy = oy, mox = ox, mflip = f;
                }
        /* (oy, ox) = (0, 0)/(8, 8)-like windows with few image pixels can coincide for both
         * flips only when the window holds no pixel at all, impossible with pad 4 < 8. */
        cr_assert_eq(matches, 1, "epoch %d: output is not one crop/flip of the input", e);
        seen_oy[moy]++;
        seen_ox[mox]++;
        flips += mflip;
        identity += (moy == PAD && mox == PAD && !mflip);
    }
    for (int k = 0; k <= 2 * PAD; k++) {
        cr_assert_gt(seen_oy[k], 10, "row offset %d seen %d times", k - PAD, seen_oy[k]);
        cr_assert_gt(seen_ox[k], 10, "col offset %d seen %d times", k - PAD, seen_ox[k]);
    }
    cr_assert(flips > epochs / 2 - 60 && flips < epochs / 2 + 60, "%d flips", flips);
    cr_assert_gt(identity, 0);
    na_batcher_free(b);

    /* flip only: either the image or its mirror */
    b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 1, .seed = 3, .hflip = true});
    int mirrored = 0;
    for (int e = 0; e < 64; e++) {
        float x[H * W];
        int32_t y[1];
        int64_t got;
        na_batcher_start_epoch(b, e);
        cr_assert(na_batcher_next(b, x, y, &got));
        bool same = true, mirror = true;
        for (int r = 0; r < H; r++)
            for (int c = 0; c < W; c++) {
                uint8_t v = (uint8_t)lrintf(x[r * W + c] * 255.0f);
                same = same && v == ds->images[r * W + c];
                mirror = mirror && v == ds->images[r * W + (W - 1 - c)];
            }
        cr_assert(same != mirror);
        mirrored += mirror;
    }
    cr_assert(mirrored > 10 && mirrored < 54);
    na_batcher_free(b);

    /* padded pixels are zero bytes before normalization: (0 - mean) / std */
    const float mean[1] = {0.5f}, std[1] = {0.25f};
    b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 1, .seed = 5, .crop_pad = PAD,
                                             .mean = mean, .std = std});
    int saw_pad = 0;
    for (int e = 0; e < 20; e++) {
        float x[H * W];
        int32_t y[1];
        int64_t got;
        na_batcher_start_epoch(b, e);
        na_batcher_next(b, x, y, &got);
        for (int k = 0; k < H * W; k++) {
            float v = x[k] * 0.25f + 0.5f; /* back to p/255 */
            int p = (int)lrintf(v * 255.0f);
            cr_assert(p >= 0 && p <= 64, "pixel %d", p);
            if (p == 0) {
                cr_assert_float_eq(x[k], -2.0f, 1e-6);
                saw_pad++;
            }
        }
    }
    cr_assert_gt(saw_pad, 0);
    na_batcher_free(b);
    na_dataset_free(ds);
}

static void collect_epochs(na_batcher *b, int epochs, float *imgs, int32_t *labs, int64_t *sizes,
                           int64_t per_batch_floats, int64_t bsz) {
    int64_t step = 0;
    for (int e = 0; e < epochs; e++) {
        cr_assert_eq(na_batcher_start_epoch(b, e), NA_OK);
        int64_t got;
        while (na_batcher_next(b, imgs + step * per_batch_floats, labs + step * bsz, &got))
            sizes[step++] = got;
    }
}

Test(batcher, prefetch_matches_sync_and_seek_resumes) {
    enum { N = 300, B = 32, EPOCHS = 3 };
    na_dataset *ds = na_dataset_synthetic_cifar(N, 11);
    const float mean[3] = {0.5f, 0.4f, 0.3f}, std[3] = {0.2f, 0.25f, 0.3f};
    for (int drop = 0; drop < 2; drop++) {
        na_batcher_cfg cfg = {.batch_size = B, .seed = 99, .shuffle = true, .drop_last = drop,
                              .mean = mean, .std = std, .crop_pad = 4, .hflip = true};
        na_batcher *s = na_batcher_new(ds, &cfg);
        cfg.prefetch = true;
        na_batcher *p = na_batcher_new(ds, &cfg);
        cr_assert(s && p, "%s", na_last_error());
        int64_t steps = na_batcher_steps_per_epoch(s), fl = (int64_t)B * 3072;
        cr_assert_eq(steps, drop ? N / B : (N + B - 1) / B);
        size_t nb = (size_t)(EPOCHS * steps);
        float *si = calloc(nb * fl, sizeof(float)), *pi = calloc(nb * fl, sizeof(float));
        int32_t *sl = calloc(nb * B, 4), *pl = calloc(nb * B, 4);
        int64_t *ss = calloc(nb, 8), *ps = calloc(nb, 8);
        collect_epochs(s, EPOCHS, si, sl, ss, fl, B);
        collect_epochs(p, EPOCHS, pi, pl, ps, fl, B);
        cr_assert_eq(memcmp(ss, ps, nb * 8), 0);
        cr_assert_eq(memcmp(sl, pl, nb * B * 4), 0);
        cr_assert_eq(memcmp(si, pi, nb * fl * sizeof(float)), 0, "prefetch output differs");

        /* seek to (epoch 1, step 4) on both: the same batch as the uninterrupted run */
        float *x = malloc(fl * sizeof(float));
        int32_t y[B];
        int64_t got;
        for (int k = 0; k < 2; k++) {
            na_batcher *bb = k ? p : s;
            cr_assert_eq(na_batcher_seek(bb, 1, 4), NA_OK);
            cr_assert_eq(na_batcher_epoch(bb), 1);
            cr_assert_eq(na_batcher_step(bb), 4);
            cr_assert(na_batcher_next(bb, x, y, &got));
            size_t at = (size_t)(steps + 4);
            cr_assert_eq(got, ss[at]);
            cr_assert_eq(memcmp(x, si + at * fl, (size_t)got * 3072 * sizeof(float)), 0);
            cr_assert_eq(memcmp(y, sl + at * B, (size_t)got * 4), 0);
            /* seeking to the end: nothing left */
            cr_assert_eq(na_batcher_seek(bb, 2, steps), NA_OK);
            cr_assert(!na_batcher_next(bb, x, y, &got));
            cr_assert_eq(na_batcher_seek(bb, 0, steps + 1), NA_EINVAL);
            cr_assert_eq(na_batcher_seek(bb, -1, 0), NA_EINVAL);
        }
        /* a fresh batcher seeking straight into epoch 2 agrees too */
        na_batcher *r = na_batcher_new(ds, &cfg);
        cr_assert_eq(na_batcher_seek(r, 2, steps - 1), NA_OK);
        cr_assert(na_batcher_next(r, x, y, &got));
        size_t at = (size_t)(3 * steps - 1);
        cr_assert_eq(got, ss[at]);
        cr_assert_eq(memcmp(x, si + at * fl, (size_t)got * 3072 * sizeof(float)), 0);
        /* freeing while the worker prepares the next batch */
        cr_assert_eq(na_batcher_start_epoch(r, 0), NA_OK);
        cr_assert(na_batcher_next(r, x, y, &got));
        na_batcher_free(r);
        free(x);
        free(si);
        free(pi);
        free(sl);
        free(pl);
        free(ss);
        free(ps);
        na_batcher_free(s);
        na_batcher_free(p);
    }
    na_dataset_free(ds);
}

Test(batcher, rejects_bad_configurations) {
    na_dataset *ds = indexed_dataset(10);
    cr_assert_null(na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 0}));
    cr_assert_eq(na_last_status(), NA_EINVAL);
    assert_msg_has("batch_size");
    cr_assert_null(na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 11, .drop_last = true}));
    assert_msg_has("drop_last");
    const float zero[1] = {0};
    cr_assert_null(na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 2, .std = zero}));
    assert_msg_has("std[0]");
    cr_assert_null(na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 2, .crop_pad = -1}));
    cr_assert_null(na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 2, .world_size = 2, .rank = 2}));
    assert_msg_has("rank 2 of world_size 2");
    cr_assert_null(na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 2, .world_size = -1}));
    cr_assert_null(na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 6, .drop_last = true,
                                                        .world_size = 2, .rank = 1}));
    assert_msg_has("of rank 1");
    cr_assert_null(na_batcher_new(NULL, &(na_batcher_cfg){.batch_size = 2}));
    cr_assert_null(na_batcher_new(ds, NULL));
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = 4});
    int32_t y[4];
    int64_t got;
    cr_assert(!na_batcher_next(b, NULL, y, &got));
    cr_assert_eq(na_last_status(), NA_EINVAL);
    na_batcher_free(b);
    na_batcher_free(NULL);
    na_dataset_free(NULL);
    cr_assert_null(na_dataset_new(0, 1, 1, 1, 10));
    na_dataset_free(ds);
}

/* ---- mutation smoke test ------------------------------------------------------------------ */

static uint64_t mix_state;
static uint64_t rnd(void) { return na_splitmix64_next(&mix_state); }

Test(idx, random_header_mutations_fail_cleanly) {
    /* seeded mutations of the headers, truncations and extensions of both files, plain and
     * gzip: a load either succeeds with consistent sizes or fails with a message */
    size_t il, ll;
    uint8_t *img = idx_images(6, 3, 4, &il), *lab = idx_labels(6, &ll);
    uint8_t *bi = malloc(il + 16), *bl = malloc(ll + 16);
    mix_state = 777;
    for (int it = 0; it < 600; it++) {
        memcpy(bi, img, il);
        memcpy(bl, lab, ll);
        size_t ni = il, nl = ll;
        int kind = (int)(rnd() % 4);
        if (kind == 0) ni = rnd() % il;
        if (kind == 1) nl = (size_t)(rnd() % (ll + 8));
        if (nl > ll) nl = ll; /* the buffer holds ll bytes */
        for (int m = 0; m < 2; m++) {
            if (rnd() & 1)
                bi[rnd() % 16] = (uint8_t)rnd();
            else
                bl[rnd() % 8] = (uint8_t)(rnd() % 16);
        }
        bool gz = rnd() & 1;
        write_bytes(tpath("img"), bi, ni, gz);
        write_bytes(tpath("lab"), bl, nl, !gz);
        na_dataset *ds = na_idx_load(tpath("img"), tpath("lab"));
        if (!ds) {
            cr_assert_neq(na_last_error()[0], '\0');
            continue;
        }
        cr_assert_eq((size_t)(ds->n * ds->height * ds->width), ni - 16);
        for (int64_t i = 0; i < ds->n; i++) cr_assert(ds->labels[i] >= 0 && ds->labels[i] < 10);
        na_dataset_free(ds);
    }
    free(bi);
    free(bl);
    free(img);
    free(lab);
}
