/* src/data/reader.h — bounded reading of possibly gzip-compressed files (internal).
 *
 * A reader hides whether a file is plain or gzip (detected by the magic bytes 1f 8b, never by
 * the name). Plain files know their size up front, so callers can compare what a header
 * announces with what the file holds before allocating; gzip streams do not, so callers read
 * them in bounded chunks and never trust a header for an allocation size. */
#ifndef NA_DATA_READER_H
#define NA_DATA_READER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <zlib.h>

typedef struct {
    const char *fn;   /* the public function, for messages */
    const char *path;
    FILE *f;          /* plain file */
    gzFile gz;        /* gzip stream */
    bool is_gz;
    int64_t size;     /* plain: file size in bytes; gzip: -1 (unknown) */
    int64_t pos;      /* bytes consumed so far (decompressed offset for gzip) */
} na_reader;

/* Opens path; on failure sets NA_EIO naming fn and path and returns the status. */
int na_reader_open(na_reader *r, const char *fn, const char *path);
/* Reads up to n bytes; returns how many were read (fewer only at the end of the data), or a
 * negative status (message set) on an I/O error or corrupt gzip data. */
int64_t na_reader_read(na_reader *r, void *buf, int64_t n);
void na_reader_close(na_reader *r);
/* "gzip " or "" for messages. */
const char *na_reader_kind(const na_reader *r);
/* After a short read: " (the gzip stream is cut off)" when zlib saw a truncated stream,
 * "" otherwise. */
const char *na_reader_eof_note(na_reader *r);

#endif
