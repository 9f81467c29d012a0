/* tests/fuzz/fuzz_util.h — shared by the libFuzzer harnesses.
 *
 * The readers take paths, so each input is written to a file first: a memfd (no disk traffic)
 * named through /proc/self/fd, or a temporary file where memfd_create is missing. A broken
 * invariant calls FUZZ_CHECK, which aborts: libFuzzer then saves the input as a crash.
 * Built with _GNU_SOURCE (memfd_create), see meson.build. */
#ifndef NANOAMP_FUZZ_UTIL_H
#define NANOAMP_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "nanoamp/error.h"

#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: invariant failed: %s (last error: %s)\n", __FILE__,    \
                    __LINE__, #cond, na_last_error());                                     \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* A failed load must leave a message that names the function. */
#define FUZZ_CHECK_FAILURE(fn) FUZZ_CHECK(na_last_status() < 0 && strstr(na_last_error(), fn))

typedef struct {
    int fd;
    char path[64];
} fuzz_file;

/* Replaces the file's contents with n bytes of d and returns its path. */
static inline const char *fuzz_file_set(fuzz_file *f, const void *d, size_t n) {
    if (f->path[0] == '\0') {
        f->fd = memfd_create("nanoamp-fuzz", 0);
        if (f->fd >= 0) {
            snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
        } else {
            snprintf(f->path, sizeof f->path, "/tmp/nanoamp-fuzz-XXXXXX");
            f->fd = mkstemp(f->path);
        }
        FUZZ_CHECK(f->fd >= 0);
    }
    FUZZ_CHECK(ftruncate(f->fd, 0) == 0);
    const uint8_t *p = d;
    for (size_t at = 0; at < n;) {
        ssize_t w = pwrite(f->fd, p + at, n - at, (off_t)at);
        FUZZ_CHECK(w > 0);
        at += (size_t)w;
    }
    return f->path;
}

/* d compressed into one gzip member, in a malloc'ed buffer (*len bytes). */
static inline uint8_t *fuzz_gzip(const void *d, size_t n, size_t *len) {
    z_stream zs = {0};
    FUZZ_CHECK(deflateInit2(&zs, 6, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t cap = deflateBound(&zs, (uLong)n);
    uint8_t *out = malloc(cap);
    FUZZ_CHECK(out != NULL);
    zs.next_in = (Bytef *)d;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    FUZZ_CHECK(deflate(&zs, Z_FINISH) == Z_STREAM_END);
    *len = cap - zs.avail_out;
    deflateEnd(&zs);
    return out;
}

/* Inputs that carry two files: bytes 0-1 (little-endian) choose where the rest is split. */
static inline int fuzz_split(const uint8_t *d, size_t n, size_t skip, const uint8_t **a,
                             size_t *an, const uint8_t **b, size_t *bn) {
    if (n < skip) return -1;
    size_t rest = n - skip;
    size_t cut = (size_t)(d[0] | d[1] << 8) % (rest + 1);
    *a = d + skip;
    *an = cut;
    *b = d + skip + cut;
    *bn = rest - cut;
    return 0;
}

#endif
