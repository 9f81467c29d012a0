/* src/data/reader.h — bounded reading of possibly gzip-compressed files (internal).
 *
 * A reader hides whether a file is plain or gzip (detected by the magic bytes 1f 8b, never by
 * the name). Plain files know their size up front, so callers can compare what a header
 * announces with what the file holds before allocating; gzip streams do not, so callers read
 * them in bounded chunks and never trust a header for an allocation size.
 *
 * A gzip file must be one or more complete gzip members (RFC 1952; concatenated members are
 * read as one stream, as gzip -d does), each checked against its CRC-32 and length trailer.
 * A file that ends inside a member (data or trailer missing), a failed check, and bytes after
 * a member that do not start another member are errors (NA_EFORMAT, naming the file offset),
 * never a silent end of data. */
#ifndef NA_DATA_READER_H
#define NA_DATA_READER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <zlib.h>

typedef struct {
    const char *fn;   /* the public function, for messages */
    const char *path;
    FILE *f;
    bool is_gz;
    int64_t size;      /* plain: file size in bytes; gzip: -1 (unknown) */
    int64_t pos;       /* bytes returned so far (decompressed offset for gzip) */
    /* gzip only */
    int64_t file_size;
    z_stream zs;
    bool zs_ready;     /* inflateInit2 succeeded */
    unsigned char *in; /* compressed input */
    int64_t in_end;    /* file offset just past the bytes read into `in` */
    int64_t member_at; /* file offset where the current member starts */
    bool at_end;       /* the last member ended exactly at the end of the file */
} na_reader;

/* Anything by that name, of any type: a directory where a file should be is then opened by
 * na_fopen_regular and named for what it is, never reported missing. */
bool na_path_exists(const char *path);
/* Opens path for reading if it is a regular file, else NULL with NA_EIO naming fn, path and
 * what it is ("a FIFO", "a directory"), decided before anything can block; *st gets its
 * stat. */
FILE *na_fopen_regular(const char *fn, const char *path, struct stat *st);
/* Opens path (a regular file, as na_fopen_regular); on failure sets NA_EIO naming fn and path and returns the status. */
int na_reader_open(na_reader *r, const char *fn, const char *path);
/* Reads up to n bytes; returns how many were read (fewer only at the clean end of the data),
 * or a negative status (message set) on an I/O error or damaged gzip data (see above). */
int64_t na_reader_read(na_reader *r, void *buf, int64_t n);
void na_reader_close(na_reader *r);
/* "gzip " or "" for messages. */
const char *na_reader_kind(const na_reader *r);

#endif
