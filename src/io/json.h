/* src/io/json.h — a small strict JSON reader/writer for the safetensors header (internal).
 *
 * Not a DOM: the checkpoint parser walks the header with these primitives and keeps only what
 * it needs, so a hostile 100 MB header costs no more than its own size. The grammar is RFC 8259
 * exactly (no comments, no trailing commas, no leading zeros, no lone surrogates, no raw
 * control characters in strings), with a nesting limit of 128 as serde_json. */
#ifndef NA_IO_JSON_H
#define NA_IO_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *s; /* the text (not NUL-terminated) */
    size_t n;
    size_t i;      /* current byte */
    char err[200]; /* what went wrong, at byte err_at */
    size_t err_at;
} na_json;

/* 0 if the n bytes are valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF); otherwise
 * 1 + the offset of the first bad byte. */
size_t na_utf8_check(const unsigned char *s, size_t n);

void na_json_ws(na_json *j);
/* Consumes c (after whitespace); false with an error if the next byte is not c. */
bool na_json_expect(na_json *j, char c);
/* Peeks the next non-whitespace byte; 0 at the end. */
char na_json_peek(na_json *j);
/* After an item of an array or object: consumes ',' (1: another item follows) or `close`
 * (0: the container ended); -1 for anything else (nothing consumed; the caller says what it
 * expected). */
int na_json_after_item(na_json *j, char close);
/* Parses a string into a fresh malloc'ed NUL-terminated buffer (the decoded UTF-8). A string
 * holding U+0000 is rejected (names are C strings). */
bool na_json_string(na_json *j, char **out);
/* Parses a non-negative integer that fits in 64 bits (what Rust's usize accepts). */
bool na_json_uint(na_json *j, uint64_t *out);
/* Validates and skips any value. */
bool na_json_skip(na_json *j, int depth);
/* Records an error at the current position (printf-style); returns false. */
bool na_json_fail(na_json *j, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A growable byte buffer for writing. */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} na_sbuf;
void na_sbuf_put(na_sbuf *b, const char *s, size_t n);
void na_sbuf_puts(na_sbuf *b, const char *s);
void na_sbuf_printf(na_sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Writes s as a JSON string the way serde_json does ("\"", "\\", \b \f \n \r \t, other
 * control characters as \u00xx, everything else verbatim). */
void na_sbuf_json_string(na_sbuf *b, const char *s);

#endif
