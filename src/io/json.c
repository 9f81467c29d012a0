/* A small strict JSON reader/writer (see json.h). */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 128

size_t na_utf8_check(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;      /* no overlongs */
            if (c == 0xED) hi = 0x9F;      /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;      /* no overlongs */
            if (c == 0xF4) hi = 0x8F;      /* <= U+10FFFF */
        } else
            return i + 1;
        if (n - i < len) return i + 1;
        if (s[i + 1] < lo || s[i + 1] > hi) return i + 2;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i + k + 1;
        i += len;
    }
    return 0;
}

bool na_json_fail(na_json *j, const char *fmt, ...) {
    if (j->err[0]) return false; /* keep the first error */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err, sizeof j->err, fmt, ap);
    va_end(ap);
    j->err_at = j->i;
    return false;
}

void na_json_ws(na_json *j) {
    while (j->i < j->n) {
        char c = j->s[j->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        j->i++;
    }
}

char na_json_peek(na_json *j) {
    na_json_ws(j);
    return j->i < j->n ? j->s[j->i] : 0;
}

int na_json_after_item(na_json *j, char close) {
    char d = na_json_peek(j);
    if (d != ',' && d != close) return -1;
    j->i++;
    return d == ',';
}

static const char *describe(na_json *j) {
    static _Thread_local char buf[32];
    if (j->i >= j->n) return "the end of the header";
    unsigned char c = (unsigned char)j->s[j->i];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, sizeof buf, "'%c'", c);
    else
        snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
}

bool na_json_expect(na_json *j, char c) {
    if (na_json_peek(j) != c || j->i >= j->n)
        return na_json_fail(j, "expected '%c', found %s", c, describe(j));
    j->i++;
    return true;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(na_json *j, unsigned *out) {
    if (j->n - j->i < 4) return na_json_fail(j, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(j->s[j->i + k]);
        if (h < 0) {
            j->i += k;
            return na_json_fail(j, "invalid hex digit in \\u escape");
        }
        v = v * 16 + (unsigned)h;
    }
    j->i += 4;
    *out = v;
    return true;
}

/* Scans (out == NULL) or decodes a string; j->i at the opening quote. */
static bool string_impl(na_json *j, char **out) {
    if (na_json_peek(j) != '"') return na_json_fail(j, "expected a string, found %s", describe(j));
    size_t start = ++j->i;
    /* The decoded string is never longer than the raw text. */
    char *buf = NULL;
    size_t len = 0;
    if (out) {
        size_t end = start;
        while (end < j->n && j->s[end] != '"') end += (j->s[end] == '\\') ? 2 : 1;
        if (end > j->n) end = j->n;
        buf = malloc(end - start + 1);
        if (!buf) return na_json_fail(j, "out of memory");
    }
    for (;;) {
        if (j->i >= j->n) {
            free(buf);
            return na_json_fail(j, "unterminated string");
        }
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') {
            j->i++;
            break;
        }
        if (c < 0x20) {
            free(buf);
            return na_json_fail(j, "raw control character 0x%02x in a string", c);
        }
        if (c != '\\') {
            if (buf) buf[len++] = (char)c;
            j->i++;
            continue;
        }
        j->i++;
        if (j->i >= j->n) {
            free(buf);
            return na_json_fail(j, "unterminated escape");
        }
        char e = j->s[j->i++];
        char simple = 0;
        switch (e) {
        case '"': simple = '"'; break;
        case '\\': simple = '\\'; break;
        case '/': simple = '/'; break;
        case 'b': simple = '\b'; break;
        case 'f': simple = '\f'; break;
        case 'n': simple = '\n'; break;
        case 'r': simple = '\r'; break;
        case 't': simple = '\t'; break;
        case 'u': break;
        default:
            j->i--;
            free(buf);
            return na_json_fail(j, "invalid escape '\\%c'", e);
        }
        if (simple) {
            if (buf) buf[len++] = simple;
            continue;
        }
        unsigned cp;
        if (!hex4(j, &cp)) {
            free(buf);
            return false;
        }
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            free(buf);
            return na_json_fail(j, "lone trailing surrogate \\u%04x", cp);
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (j->n - j->i < 2 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u') {
                free(buf);
                return na_json_fail(j, "lone leading surrogate \\u%04x", cp);
            }
            j->i += 2;
            if (!hex4(j, &lo)) {
                free(buf);
                return false;
            }
            if (lo < 0xDC00 || lo > 0xDFFF) {
                free(buf);
                return na_json_fail(j, "leading surrogate \\u%04x not followed by a trailing one",
                                    cp);
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0 && buf) {
            free(buf);
            return na_json_fail(j, "\\u0000 in a name or metadata string is not supported");
        }
        if (!buf) continue;
        /* 6 raw bytes (\uXXXX) or 12 (a pair) always cover the 1-4 encoded bytes. */
        if (cp < 0x80) {
            buf[len++] = (char)cp;
        } else if (cp < 0x800) {
            buf[len++] = (char)(0xC0 | cp >> 6);
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[len++] = (char)(0xE0 | cp >> 12);
            buf[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[len++] = (char)(0xF0 | cp >> 18);
            buf[len++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    if (buf) {
        buf[len] = '\0';
        *out = buf;
    }
    return true;
}

bool na_json_string(na_json *j, char **out) { return string_impl(j, out); }

bool na_json_uint(na_json *j, uint64_t *out) {
    char c = na_json_peek(j);
    if (c == '-') return na_json_fail(j, "expected a non-negative integer, found a negative number");
    if (c < '0' || c > '9') return na_json_fail(j, "expected an integer, found %s", describe(j));
    size_t start = j->i;
    uint64_t v = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        unsigned d = (unsigned)(j->s[j->i] - '0');
        if (v > (UINT64_MAX - d) / 10) {
            j->i = start;
            return na_json_fail(j, "integer does not fit in 64 bits");
        }
        v = v * 10 + d;
        j->i++;
    }
    if (j->i - start > 1 && j->s[start] == '0') {
        j->i = start;
        return na_json_fail(j, "integer with a leading zero");
    }
    if (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E'))
        return na_json_fail(j, "expected an integer, found a fraction or exponent");
    *out = v;
    return true;
}

static bool skip_number(na_json *j) {
    size_t start = j->i;
    if (j->i < j->n && j->s[j->i] == '-') j->i++;
    if (j->i >= j->n || j->s[j->i] < '0' || j->s[j->i] > '9')
        return na_json_fail(j, "invalid number");
    if (j->s[j->i] == '0') {
        j->i++;
    } else {
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
    }
    if (j->i < j->n && j->s[j->i] == '.') {
        j->i++;
        size_t d = j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
        if (j->i == d) return na_json_fail(j, "invalid number: no digit after '.'");
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-')) j->i++;
        size_t d = j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
        if (j->i == d) return na_json_fail(j, "invalid number: no digit in the exponent");
    }
    if (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        j->i = start;
        return na_json_fail(j, "number with a leading zero");
    }
    return true;
}

static bool literal(na_json *j, const char *word) {
    size_t len = strlen(word);
    if (j->n - j->i < len || memcmp(j->s + j->i, word, len) != 0)
        return na_json_fail(j, "invalid literal, found %s", describe(j));
    j->i += len;
    return true;
}

bool na_json_skip(na_json *j, int depth) {
    if (depth > JSON_MAX_DEPTH) return na_json_fail(j, "nesting deeper than %d", JSON_MAX_DEPTH);
    char c = na_json_peek(j);
    switch (c) {
    case '"': return string_impl(j, NULL);
    case 't': return literal(j, "true");
    case 'f': return literal(j, "false");
    case 'n': return literal(j, "null");
    case '[':
        j->i++;
        if (na_json_peek(j) == ']') {
            j->i++;
            return true;
        }
        for (;;) {
            if (!na_json_skip(j, depth + 1)) return false;
            int more = na_json_after_item(j, ']');
            if (more > 0) continue;
            if (more == 0) return true;
            return na_json_fail(j, "expected ',' or ']' in an array, found %s", describe(j));
        }
    case '{':
        j->i++;
        if (na_json_peek(j) == '}') {
            j->i++;
            return true;
        }
        for (;;) {
            if (!string_impl(j, NULL) || !na_json_expect(j, ':') || !na_json_skip(j, depth + 1))
                return false;
            int more = na_json_after_item(j, '}');
            if (more > 0) continue;
            if (more == 0) return true;
            return na_json_fail(j, "expected ',' or '}' in an object, found %s", describe(j));
        }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return skip_number(j);
        return na_json_fail(j, "expected a value, found %s", describe(j));
    }
}

/* ---- writing ------------------------------------------------------------------------- */
void na_sbuf_put(na_sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void na_sbuf_puts(na_sbuf *b, const char *s) { na_sbuf_put(b, s, strlen(s)); }

void na_sbuf_printf(na_sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= sizeof tmp) {
        b->oom = true; /* only short numeric fragments go through here */
        return;
    }
    na_sbuf_put(b, tmp, (size_t)len);
}

void na_sbuf_json_string(na_sbuf *b, const char *s) {
    na_sbuf_put(b, "\"", 1);
    const char *run = s;
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        const char *esc = NULL;
        char ubuf[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
                esc = ubuf;
            }
        }
        if (!esc) continue;
        na_sbuf_put(b, run, (size_t)(p - run));
        na_sbuf_puts(b, esc);
        run = p + 1;
    }
    na_sbuf_puts(b, run);
    na_sbuf_put(b, "\"", 1);
}
