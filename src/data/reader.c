/* Bounded reading of plain or gzip-compressed files (see reader.h). */
#include "reader.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "nanoamp/error.h"

#define NA_READER_CHUNK ((int64_t)1 << 20) /* gzread takes an unsigned int: read <= 1 MiB */

int na_reader_open(na_reader *r, const char *fn, const char *path) {
    memset(r, 0, sizeof *r);
    r->fn = fn;
    r->path = path;
    r->size = -1;
    if (!path) return na_set_error(NA_EINVAL, "%s: file path is NULL", fn);
    FILE *f = fopen(path, "rb");
    if (!f) return na_set_error(NA_EIO, "%s: cannot open '%s': %s", fn, path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return na_set_error(NA_EIO, "%s: '%s' is not a regular file", fn, path);
    }
    unsigned char magic[2];
    size_t got = fread(magic, 1, 2, f);
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        fclose(f);
        r->gz = gzopen(path, "rb");
        if (!r->gz)
            return na_set_error(NA_EIO, "%s: cannot open gzip file '%s': %s", fn, path,
                                errno ? strerror(errno) : "out of memory");
        gzbuffer(r->gz, 128 * 1024);
        r->is_gz = true;
        return NA_OK;
    }
    if (fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return na_set_error(NA_EIO, "%s: cannot seek in '%s': %s", fn, path, strerror(errno));
    }
    r->f = f;
    r->size = (int64_t)st.st_size;
    return NA_OK;
}

int64_t na_reader_read(na_reader *r, void *buf, int64_t n) {
    unsigned char *p = buf;
    int64_t done = 0;
    while (done < n) {
        int64_t want = n - done;
        if (want > NA_READER_CHUNK) want = NA_READER_CHUNK;
        if (r->is_gz) {
            int got = gzread(r->gz, p + done, (unsigned)want);
            if (got < 0) {
                int errnum = 0;
                const char *msg = gzerror(r->gz, &errnum);
                return na_set_error(errnum == Z_ERRNO ? NA_EIO : NA_EFORMAT,
                                    "%s: '%s': corrupt gzip data near decompressed offset %lld: %s",
                                    r->fn, r->path, (long long)(r->pos + done),
                                    errnum == Z_ERRNO ? strerror(errno) : msg);
            }
            if (got == 0) break;
            done += got;
        } else {
            size_t got = fread(p + done, 1, (size_t)want, r->f);
            done += (int64_t)got;
            if ((int64_t)got < want) {
                if (ferror(r->f))
                    return na_set_error(NA_EIO, "%s: read error in '%s' at offset %lld: %s",
                                        r->fn, r->path, (long long)(r->pos + done),
                                        strerror(errno));
                break;
            }
        }
    }
    r->pos += done;
    return done;
}

void na_reader_close(na_reader *r) {
    if (r->f) fclose(r->f);
    if (r->gz) gzclose(r->gz);
    r->f = NULL;
    r->gz = NULL;
}

const char *na_reader_kind(const na_reader *r) { return r->is_gz ? "gzip " : ""; }

const char *na_reader_eof_note(na_reader *r) {
    if (!r->is_gz) return "";
    int errnum = Z_OK;
    gzerror(r->gz, &errnum);
    return errnum == Z_BUF_ERROR ? " (the gzip stream is cut off)" : "";
}
