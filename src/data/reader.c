/* Bounded reading of plain or gzip-compressed files (see reader.h).
 *
 * gzip goes through inflate() directly rather than gzread(): gzread stops silently at a
 * missing trailer and skips anything after the last member, and both must be errors here. */
#include "reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nanoamp/error.h"

#define NA_READER_CHUNK ((int64_t)1 << 20) /* inflate takes an unsigned int: <= 1 MiB a call */
#define NA_READER_GZ_IN (64 * 1024)        /* compressed bytes read from the file at a time */

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

bool na_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

FILE *na_fopen_regular(const char *fn, const char *path, struct stat *st) {
    /* O_NONBLOCK: opening a FIFO that has no writer would wait for one forever */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        na_set_error(NA_EIO, "%s: cannot open '%s': %s", fn, path, strerror(errno));
        return NULL;
    }
    FILE *f = NULL;
    if (fstat(fd, st) != 0)
        na_set_error(NA_EIO, "%s: cannot stat '%s': %s", fn, path, strerror(errno));
    else if (!S_ISREG(st->st_mode))
        na_set_error(NA_EIO, "%s: '%s' is %s, not a regular file", fn, path,
                     file_kind(st->st_mode));
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb")))
        na_set_error(NA_EIO, "%s: cannot open '%s': %s", fn, path, strerror(errno));
    if (!f) close(fd);
    return f;
}

int na_reader_open(na_reader *r, const char *fn, const char *path) {
    memset(r, 0, sizeof *r);
    r->fn = fn;
    r->path = path;
    r->size = -1;
    if (!path) return na_set_error(NA_EINVAL, "%s: file path is NULL", fn);
    struct stat st;
    FILE *f = na_fopen_regular(fn, path, &st);
    if (!f) return na_last_status();
    unsigned char magic[2];
    size_t got = fread(magic, 1, 2, f);
    if (fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return na_set_error(NA_EIO, "%s: cannot seek in '%s': %s", fn, path, strerror(errno));
    }
    r->f = f;
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        r->is_gz = true;
        r->file_size = (int64_t)st.st_size;
        r->in = malloc(NA_READER_GZ_IN);
        /* 16 + 15: a gzip wrapper (header, CRC-32 and length checked by inflate), 32K window */
        if (!r->in || inflateInit2(&r->zs, 16 + 15) != Z_OK) {
            na_reader_close(r);
            return na_set_error(NA_ENOMEM, "%s: '%s': out of memory for the gzip decoder", fn,
                                path);
        }
        r->zs_ready = true;
        return NA_OK;
    }
    r->size = (int64_t)st.st_size;
    return NA_OK;
}

/* File offset of the next compressed byte inflate will see. */
static int64_t gz_offset(const na_reader *r) { return r->in_end - (int64_t)r->zs.avail_in; }

/* Tops the input up to at least `need` bytes (fewer only at the end of the file); returns
 * the bytes now available or a negative status. */
static int64_t gz_fill(na_reader *r, unsigned need) {
    if (r->zs.avail_in >= need) return r->zs.avail_in;
    if (r->zs.avail_in) memmove(r->in, r->zs.next_in, r->zs.avail_in); /* next_in may be NULL */
    r->zs.next_in = r->in;
    while (r->zs.avail_in < need) {
        size_t got = fread(r->in + r->zs.avail_in, 1, NA_READER_GZ_IN - r->zs.avail_in, r->f);
        if (got == 0) {
            if (ferror(r->f))
                return na_set_error(NA_EIO, "%s: read error in '%s' at offset %lld: %s", r->fn,
                                    r->path, (long long)r->in_end, strerror(errno));
            break;
        }
        r->zs.avail_in += (uInt)got;
        r->in_end += (int64_t)got;
    }
    return r->zs.avail_in;
}

/* After a member's trailer: the file must end here or go on with another member. */
static int gz_next_member(na_reader *r) {
    int64_t at = gz_offset(r), avail = gz_fill(r, 2);
    if (avail < 0) return (int)avail;
    if (avail == 0) {
        r->at_end = true;
        return NA_OK;
    }
    if (avail < 2 || r->zs.next_in[0] != 0x1f || r->zs.next_in[1] != 0x8b)
        return na_set_error(NA_EFORMAT,
                            "%s: '%s': %lld trailing bytes after the end of the gzip data at file "
                            "offset %lld (not another gzip member: the file is damaged)",
                            r->fn, r->path, (long long)(r->file_size - at), (long long)at);
    r->member_at = at;
    return inflateReset(&r->zs) == Z_OK ? NA_OK
                                        : na_set_error(NA_EFORMAT, "%s: '%s': gzip reset failed",
                                                       r->fn, r->path);
}

static int64_t gz_read(na_reader *r, unsigned char *p, int64_t n) {
    int64_t done = 0;
    while (done < n && !r->at_end) {
        int64_t avail = gz_fill(r, 1);
        if (avail < 0) return avail;
        if (avail == 0)
            return na_set_error(NA_EFORMAT,
                                "%s: '%s' is truncated: the gzip stream is cut off at file offset "
                                "%lld (decompressed offset %lld), inside the member that starts at "
                                "offset %lld: its data or its CRC-32/length trailer is missing",
                                r->fn, r->path, (long long)r->in_end, (long long)(r->pos + done),
                                (long long)r->member_at);
        uInt want = (uInt)(n - done < NA_READER_CHUNK ? n - done : NA_READER_CHUNK);
        r->zs.next_out = p + done;
        r->zs.avail_out = want;
        int64_t at = gz_offset(r);
        int ret = inflate(&r->zs, Z_NO_FLUSH);
        done += want - r->zs.avail_out;
        if (ret == Z_STREAM_END) {
            int st = gz_next_member(r);
            if (st) return st;
        } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
            return na_set_error(ret == Z_MEM_ERROR ? NA_ENOMEM : NA_EFORMAT,
                                "%s: '%s': corrupt gzip data near file offset %lld (decompressed "
                                "offset %lld): %s",
                                r->fn, r->path, (long long)at, (long long)(r->pos + done),
                                r->zs.msg ? r->zs.msg : zError(ret));
        }
    }
    r->pos += done;
    return done;
}

int64_t na_reader_read(na_reader *r, void *buf, int64_t n) {
    if (r->is_gz) return gz_read(r, buf, n);
    unsigned char *p = buf;
    int64_t done = 0;
    while (done < n) {
        int64_t want = n - done < NA_READER_CHUNK ? n - done : NA_READER_CHUNK;
        size_t got = fread(p + done, 1, (size_t)want, r->f);
        done += (int64_t)got;
        if ((int64_t)got < want) {
            if (ferror(r->f))
                return na_set_error(NA_EIO, "%s: read error in '%s' at offset %lld: %s", r->fn,
                                    r->path, (long long)(r->pos + done), strerror(errno));
            break;
        }
    }
    r->pos += done;
    return done;
}

void na_reader_close(na_reader *r) {
    if (r->f) fclose(r->f);
    if (r->zs_ready) inflateEnd(&r->zs);
    free(r->in);
    r->f = NULL;
    r->in = NULL;
    r->zs_ready = false;
}

const char *na_reader_kind(const na_reader *r) { return r->is_gz ? "gzip " : ""; }
