/* Checkpoints in the safetensors format (see include/nanoamp/io.h).
 *
 * Writing mirrors safetensors' serialize(): tensors sorted by descending dtype (I64 of a loaded
 * file, F64, F32, I32, BF16, F16, U8 — the order of safetensors' Dtype enum), then by name;
 * compact JSON with "__metadata__" first (its keys sorted, for reproducible files); the header
 * space-padded to a multiple of 8 so that every tensor's data is aligned in the file.
 *
 * Reading mirrors SafeTensors::read_metadata + Metadata::validate, in the same order of
 * checks, with messages that name the file, the tensor and the values. Beyond safetensors it
 * rejects duplicate keys (serde would keep the last), dtypes nanoamp has no type for (except
 * I64, converted on copy), ranks above NA_CHECKPOINT_MAX_DIMS and dims above INT64_MAX. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "src/data/reader.h"
#include "nanoamp/error.h"
#include "nanoamp/io.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nanoamp checkpoints assume a little-endian host (safetensors data is little-endian)"
#endif

typedef struct {
    char *name;
    na_dtype dtype; /* NA_DTYPE_COUNT for I64 */
    int st;         /* the file's dtype: index in dtypes[] */
    int ndim;
    int64_t *shape; /* ndim values (NULL when ndim == 0) */
    int64_t numel;
    size_t nbytes;
    const na_tensor *tensor; /* writer: a referenced tensor ... */
    const void *data;        /* ... or referenced host data; reader: the tensor's bytes */
    void *owned;             /* reader: a realigned copy, when the file's offset was odd */
    uint64_t begin, end;     /* reader: data_offsets */
} ck_entry;

struct na_checkpoint {
    ck_entry *e;
    int64_t n, cap;
    int64_t *by_name; /* reader: entry indices sorted by name (binary search) */
    char **mkey, **mval;
    int64_t mn, mcap;
    unsigned char *data; /* reader: the data section */
    char *path;          /* reader: for messages */
};

/* ---- dtypes ------------------------------------------------------------------------- */
/* The safetensors dtypes nanoamp reads, in safetensors' write order (its Dtype enum,
 * descending); an entry's `st` indexes this table. I64 has no nanoamp dtype (dt is
 * NA_DTYPE_COUNT): PyTorch writes num_batches_tracked as I64, so such tensors load as raw
 * 8-byte integers and na_checkpoint_copy_into converts them. */
static const struct {
    na_dtype dt;
    const char *name;
    size_t size;
} dtypes[] = {
    {NA_DTYPE_COUNT, "I64", 8}, {NA_DTYPE_F64, "F64", 8},   {NA_DTYPE_F32, "F32", 4},
    {NA_DTYPE_I32, "I32", 4},   {NA_DTYPE_BF16, "BF16", 2}, {NA_DTYPE_F16, "F16", 2},
    {NA_DTYPE_F8E4M3, "F8_E4M3", 1}, {NA_DTYPE_F8E5M2, "F8_E5M2", 1}, {NA_DTYPE_U8, "U8", 1},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))
_Static_assert(N_DTYPES == NA_DTYPE_COUNT + 1, "every nanoamp dtype has a safetensors name");

/* Index in dtypes[] of a nanoamp dtype, or of a safetensors name; -1 if none. */
static int st_of_dtype(na_dtype dt) {
    for (int i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dt == dt && dt != NA_DTYPE_COUNT) return i;
    return -1;
}

static int st_of_name(const char *s) {
    for (int i = 0; s && i < N_DTYPES; i++)
        if (strcmp(s, dtypes[i].name) == 0) return i;
    return -1;
}

const char *na_safetensors_dtype_name(na_dtype dt) {
    int k = st_of_dtype(dt);
    return k < 0 ? NULL : dtypes[k].name;
}

bool na_safetensors_dtype_parse(const char *s, na_dtype *out) {
    int k = st_of_name(s);
    if (k < 0 || dtypes[k].dt == NA_DTYPE_COUNT) return false;
    if (out) *out = dtypes[k].dt;
    return true;
}

/* "[10, 64]" into buf (size >= 64); long shapes end in ", ...]". */
static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim; i++) {
        if (at + 2 + 20 + 7 >= size) {
            snprintf(buf + at, size - at, ", ...]");
            return;
        }
        at += (size_t)snprintf(buf + at, size - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    }
    snprintf(buf + at, size - at, "]");
}

/* ---- building ----------------------------------------------------------------------- */
na_checkpoint *na_checkpoint_new(void) {
    na_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) na_set_error(NA_ENOMEM, "na_checkpoint_new: out of memory");
    return ck;
}

void na_checkpoint_free(na_checkpoint *ck) {
    if (!ck) return;
    for (int64_t i = 0; i < ck->n; i++) {
        free(ck->e[i].name);
        free(ck->e[i].shape);
        free(ck->e[i].owned);
    }
    for (int64_t i = 0; i < ck->mn; i++) {
        free(ck->mkey[i]);
        free(ck->mval[i]);
    }
    free(ck->e);
    free(ck->by_name);
    free(ck->mkey);
    free(ck->mval);
    free(ck->data);
    free(ck->path);
    free(ck);
}

static int64_t find_linear(const na_checkpoint *ck, const char *name) {
    for (int64_t i = 0; i < ck->n; i++)
        if (strcmp(ck->e[i].name, name) == 0) return i;
    return -1;
}

static int64_t find(const na_checkpoint *ck, const char *name) {
    if (!ck->by_name) return find_linear(ck, name);
    int64_t lo = 0, hi = ck->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->e[ck->by_name[mid]].name, name);
        if (c == 0) return ck->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int add_entry(na_checkpoint *ck, const char *fn, const char *name, na_dtype dtype,
                     int ndim, const int64_t *shape, const na_tensor *t, const void *data) {
    if (!ck || !name) return na_set_error(NA_EINVAL, "%s: %s is NULL", fn, ck ? "name" : "ck");
    if (ck->by_name)
        return na_set_error(NA_ESTATE, "%s: cannot add '%s' to a checkpoint read from a file",
                            fn, name);
    if (strcmp(name, "__metadata__") == 0)
        return na_set_error(NA_EINVAL, "%s: '__metadata__' is reserved for the metadata", fn);
    if (na_utf8_check((const unsigned char *)name, strlen(name)))
        return na_set_error(NA_EINVAL, "%s: tensor name is not valid UTF-8", fn);
    if (find_linear(ck, name) >= 0)
        return na_set_error(NA_EINVAL, "%s: a tensor named '%s' is already in the checkpoint", fn,
                            name);
    if (!na_safetensors_dtype_name(dtype))
        return na_set_error(NA_EDTYPE, "%s: tensor '%s' has an invalid dtype (%d)", fn, name,
                            (int)dtype);
    if (ndim < 0 || ndim > NA_MAX_DIMS || (ndim > 0 && !shape))
        return na_set_error(NA_EINVAL, "%s: tensor '%s' has ndim %d (expected 0..%d with a shape)",
                            fn, name, ndim, NA_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            return na_set_error(NA_EINVAL, "%s: tensor '%s' has an invalid shape", fn, name);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)na_dtype_size(dtype), &nbytes) ||
        nbytes > (uint64_t)INT64_MAX)
        return na_set_error(NA_EINVAL, "%s: tensor '%s' is too large", fn, name);
    if (!t && !data && numel > 0)
        return na_set_error(NA_EINVAL, "%s: tensor '%s' has no data", fn, name);
    if (ck->n == ck->cap) {
        int64_t cap = ck->cap ? ck->cap * 2 : 16;
        ck_entry *e = realloc(ck->e, (size_t)cap * sizeof *e);
        if (!e) return na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        ck->e = e;
        ck->cap = cap;
    }
    ck_entry en = {0};
    en.name = strdup(name);
    if (ndim > 0) en.shape = malloc((size_t)ndim * sizeof(int64_t));
    if (!en.name || (ndim > 0 && !en.shape)) {
        free(en.name);
        free(en.shape);
        return na_set_error(NA_ENOMEM, "%s: out of memory", fn);
    }
    if (ndim > 0) memcpy(en.shape, shape, (size_t)ndim * sizeof(int64_t));
    en.dtype = dtype;
    en.st = st_of_dtype(dtype);
    en.ndim = ndim;
    en.numel = (int64_t)numel;
    en.nbytes = (size_t)nbytes;
    en.tensor = t;
    en.data = data;
    ck->e[ck->n++] = en;
    return NA_OK;
}

int na_checkpoint_add(na_checkpoint *ck, const char *name, const na_tensor *t) {
    if (!t) return na_set_error(NA_EINVAL, "na_checkpoint_add: tensor '%s' is NULL",
                                name ? name : "(null)");
    return add_entry(ck, "na_checkpoint_add", name, t->dtype, t->ndim, t->shape, t, NULL);
}

int na_checkpoint_add_host(na_checkpoint *ck, const char *name, na_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
    return add_entry(ck, "na_checkpoint_add_host", name, dtype, ndim, shape, NULL, data);
}

/* Appends a pair (taking ownership of both strings, freed on failure). */
static int meta_append(na_checkpoint *ck, char *key, char *value) {
    if (ck->mn == ck->mcap) {
        int64_t cap = ck->mcap ? ck->mcap * 2 : 8;
        char **k = realloc(ck->mkey, (size_t)cap * sizeof *k);
        if (k) ck->mkey = k;
        char **v = k ? realloc(ck->mval, (size_t)cap * sizeof *v) : NULL;
        if (v) ck->mval = v;
        if (!k || !v) {
            free(key);
            free(value);
            return NA_ENOMEM;
        }
        ck->mcap = cap;
    }
    ck->mkey[ck->mn] = key;
    ck->mval[ck->mn] = value;
    ck->mn++;
    return NA_OK;
}

int na_checkpoint_set_meta(na_checkpoint *ck, const char *key, const char *value) {
    const char *fn = "na_checkpoint_set_meta";
    if (!ck || !key || !value)
        return na_set_error(NA_EINVAL, "%s: %s is NULL", fn, !ck ? "ck" : !key ? "key" : "value");
    if (na_utf8_check((const unsigned char *)key, strlen(key)) ||
        na_utf8_check((const unsigned char *)value, strlen(value)))
        return na_set_error(NA_EINVAL, "%s: key or value of '%s' is not valid UTF-8", fn, key);
    char *v = strdup(value);
    if (!v) return na_set_error(NA_ENOMEM, "%s: out of memory", fn);
    for (int64_t i = 0; i < ck->mn; i++)
        if (strcmp(ck->mkey[i], key) == 0) {
            free(ck->mval[i]);
            ck->mval[i] = v;
            return NA_OK;
        }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return na_set_error(NA_ENOMEM, "%s: out of memory", fn);
    }
    if (meta_append(ck, k, v)) return na_set_error(NA_ENOMEM, "%s: out of memory", fn);
    return NA_OK;
}

/* ---- saving ------------------------------------------------------------------------- */
static _Thread_local const na_checkpoint *sort_ck; /* qsort has no context argument */

static int cmp_write_order(const void *a, const void *b) {
    const ck_entry *x = &sort_ck->e[*(const int64_t *)a], *y = &sort_ck->e[*(const int64_t *)b];
    if (x->st != y->st) return x->st < y->st ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* The padded header for entries in `order`. */
static int build_header(const na_checkpoint *ck, const int64_t *order, na_sbuf *h) {
    na_sbuf_put(h, "{", 1);
    if (ck->mn > 0) {
        char ***keys = malloc((size_t)ck->mn * sizeof *keys);
        if (!keys) return na_set_error(NA_ENOMEM, "na_checkpoint_save: out of memory");
        for (int64_t i = 0; i < ck->mn; i++) keys[i] = &ck->mkey[i];
        qsort(keys, (size_t)ck->mn, sizeof *keys, cmp_str_ptr);
        na_sbuf_puts(h, "\"__metadata__\":{");
        for (int64_t i = 0; i < ck->mn; i++) {
            int64_t k = keys[i] - ck->mkey;
            if (i) na_sbuf_put(h, ",", 1);
            na_sbuf_json_string(h, ck->mkey[k]);
            na_sbuf_put(h, ":", 1);
            na_sbuf_json_string(h, ck->mval[k]);
        }
        na_sbuf_put(h, "}", 1);
        free(keys);
        if (ck->n > 0) na_sbuf_put(h, ",", 1);
    }
    uint64_t offset = 0;
    for (int64_t i = 0; i < ck->n; i++) {
        const ck_entry *e = &ck->e[order[i]];
        if (i) na_sbuf_put(h, ",", 1);
        na_sbuf_json_string(h, e->name);
        na_sbuf_puts(h, ":{\"dtype\":\"");
        na_sbuf_puts(h, dtypes[e->st].name);
        na_sbuf_puts(h, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) na_sbuf_printf(h, d ? ",%" PRId64 : "%" PRId64, e->shape[d]);
        na_sbuf_printf(h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset,
                       offset + e->nbytes);
        offset += e->nbytes;
    }
    na_sbuf_put(h, "}", 1);
    while (!h->oom && h->len % 8) na_sbuf_put(h, " ", 1);
    if (h->oom) return na_set_error(NA_ENOMEM, "na_checkpoint_save: out of memory");
    return NA_OK;
}

static int write_all(FILE *f, const void *p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

#define TMP_INFIX ".tmp." /* a save writes "<path>.tmp.<pid>" first */

/* The directory part of path ("." when there is none), malloc'ed. */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* Removes the "<path>.tmp.<pid>" files that saves of this very checkpoint left behind when
 * they were killed before cleaning up (SIGKILL, SIGXFSZ): only names of exactly that form,
 * only pids other than ours of processes that no longer exist. A live process's temporary
 * (another trainer saving the same file right now) is never touched. Best effort: a failure
 * here does not fail the save. */
static void remove_stale_temporaries(const char *dir, const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t blen = strlen(base), ilen = strlen(TMP_INFIX);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *name = de->d_name;
        if (strncmp(name, base, blen) != 0 || strncmp(name + blen, TMP_INFIX, ilen) != 0) continue;
        const char *digits = name + blen + ilen;
        long pid = 0;
        size_t k = 0;
        for (; digits[k] >= '0' && digits[k] <= '9' && pid <= INT32_MAX; k++)
            pid = pid * 10 + (digits[k] - '0');
        if (k == 0 || digits[k] != '\0' || digits[0] == '0' || pid > INT32_MAX ||
            pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == -1 && errno == ESRCH) (void)unlinkat(dirfd(d), name, 0);
    }
    closedir(d);
}

int na_checkpoint_save(const na_checkpoint *ck, const char *path) {
    const char *fn = "na_checkpoint_save";
    if (!ck || !path) return na_set_error(NA_EINVAL, "%s: %s is NULL", fn, ck ? "path" : "ck");
    int st = NA_OK;
    int64_t *order = malloc((size_t)(ck->n ? ck->n : 1) * sizeof *order);
    na_sbuf h = {0};
    void *scratch = NULL;
    size_t tmp_len = strlen(path) + 32;
    char *tmp = malloc(tmp_len), *dir = NULL;
    FILE *f = NULL;
    if (!order || !tmp) {
        st = na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        goto done;
    }
    for (int64_t i = 0; i < ck->n; i++) order[i] = i;
    sort_ck = ck;
    qsort(order, (size_t)ck->n, sizeof *order, cmp_write_order);
    sort_ck = NULL;
    if ((st = build_header(ck, order, &h))) goto done;

    size_t max_bytes = 0;
    for (int64_t i = 0; i < ck->n; i++)
        if (ck->e[i].tensor && ck->e[i].nbytes > max_bytes) max_bytes = ck->e[i].nbytes;
    if (max_bytes && !(scratch = malloc(max_bytes))) {
        st = na_set_error(NA_ENOMEM, "%s: cannot allocate %zu bytes to stage a tensor", fn,
                          max_bytes);
        goto done;
    }

    dir = dir_of(path);
    if (!dir) {
        st = na_set_error(NA_ENOMEM, "%s: out of memory", fn);
        goto done;
    }
    remove_stale_temporaries(dir, path);
    snprintf(tmp, tmp_len, "%s" TMP_INFIX "%ld", path, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f) {
        st = na_set_error(NA_EIO, "%s: cannot create '%s': %s", fn, tmp, strerror(errno));
        goto done;
    }
    unsigned char len8[8];
    uint64_t n = h.len;
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)(n >> (8 * k));
    if (write_all(f, len8, 8) || write_all(f, h.p, h.len)) goto write_error;
    for (int64_t i = 0; i < ck->n; i++) {
        const ck_entry *e = &ck->e[order[i]];
        if (e->nbytes == 0) continue;
        const void *src = e->data;
        if (e->tensor) {
            if (e->tensor->dtype != e->dtype || e->tensor->numel != e->numel) {
                st = na_set_error(NA_ESTATE, "%s: tensor '%s' changed since it was added", fn,
                                  e->name);
                goto fail;
            }
            if (na_copy_to_host(e->tensor, scratch)) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", na_last_error());
                st = na_set_error(na_last_status() ? na_last_status() : NA_EIO,
                                  "%s: cannot read tensor '%s': %s", fn, e->name, msg);
                goto fail;
            }
            src = scratch;
        }
        if (write_all(f, src, e->nbytes)) goto write_error;
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) goto write_error;
    int rc = fclose(f);
    f = NULL;
    if (rc != 0) goto write_error;
    if (rename(tmp, path) != 0) {
        st = na_set_error(NA_EIO, "%s: cannot rename '%s' to '%s': %s", fn, tmp, path,
                          strerror(errno));
        goto fail;
    }
    /* Make the rename itself durable. */
    {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
    goto done;

write_error: {
    int err = errno;
    st = na_set_error(NA_EIO, "%s: writing '%s' failed: %s%s (the previous '%s', if any, is "
                              "unchanged)",
                      fn, tmp, strerror(err),
                      err == EFBIG    ? " (EFBIG: the file-size limit, ulimit -f, is reached)"
                      : err == ENOSPC ? " (ENOSPC: the file system is full)"
                      : err == EIO    ? " (EIO: the device reported an error)"
                                      : "",
                      path);
}
fail:
    if (f) fclose(f);
    f = NULL;
    unlink(tmp);
done:
    free(order);
    free(h.p);
    free(scratch);
    free(tmp);
    free(dir);
    return st;
}

/* ---- loading ------------------------------------------------------------------------ */
static int fmt_error(const char *path, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static int fmt_error(const char *path, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return na_set_error(NA_EFORMAT, "na_checkpoint_load: '%s': %s", path, msg);
}

static int json_error(const char *path, const na_json *j) {
    return fmt_error(path, "invalid JSON header at byte %zu (file offset %zu): %s", j->err_at,
                     j->err_at + 8, j->err);
}

/* Parses one tensor's info object into e (name already set). */
static bool parse_tensor_info(na_json *j, ck_entry *e) {
    bool have_dtype = false, have_shape = false, have_offsets = false;
    int64_t shape[NA_CHECKPOINT_MAX_DIMS];
    if (!na_json_expect(j, '{')) return false;
    if (na_json_peek(j) == '}') {
        j->i++;
        return na_json_fail(j, "tensor '%s': missing field 'dtype'", e->name);
    }
    for (;;) {
        char *key = NULL;
        if (!na_json_string(j, &key)) return false;
        if (!na_json_expect(j, ':')) {
            free(key);
            return false;
        }
        bool ok = true;
        if (strcmp(key, "dtype") == 0) {
            char *dt = NULL;
            if (have_dtype)
                ok = na_json_fail(j, "tensor '%s': duplicate field 'dtype'", e->name);
            else if ((ok = na_json_string(j, &dt))) {
                e->st = st_of_name(dt);
                if (e->st < 0)
                    ok = na_json_fail(j,
                                      "tensor '%s': unknown dtype '%.40s' (nanoamp reads F64, F32, "
                                      "F16, BF16, I32, U8, and I64 converted on copy)",
                                      e->name, dt);
                else
                    e->dtype = dtypes[e->st].dt;
                free(dt);
            }
            have_dtype = true;
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape)
                ok = na_json_fail(j, "tensor '%s': duplicate field 'shape'", e->name);
            else if ((ok = na_json_expect(j, '['))) {
                int nd = 0;
                if (na_json_peek(j) == ']')
                    j->i++;
                else
                    for (;;) {
                        uint64_t v;
                        if (!(ok = na_json_uint(j, &v))) break;
                        if (nd == NA_CHECKPOINT_MAX_DIMS) {
                            ok = na_json_fail(j, "tensor '%s': more than %d dimensions", e->name,
                                              NA_CHECKPOINT_MAX_DIMS);
                            break;
                        }
                        if (v > (uint64_t)INT64_MAX) {
                            ok = na_json_fail(j, "tensor '%s': dimension %d is %" PRIu64
                                                 ", above the supported 2^63-1",
                                              e->name, nd, v);
                            break;
                        }
                        shape[nd++] = (int64_t)v;
                        int more = na_json_after_item(j, ']');
                        if (more > 0) continue;
                        if (more == 0) break;
                        ok = na_json_fail(j, "tensor '%s': expected ',' or ']' in the shape",
                                          e->name);
                        break;
                    }
                if (ok) {
                    e->ndim = nd;
                    if (nd > 0) {
                        e->shape = malloc((size_t)nd * sizeof(int64_t));
                        if (!e->shape)
                            ok = na_json_fail(j, "out of memory");
                        else
                            memcpy(e->shape, shape, (size_t)nd * sizeof(int64_t));
                    }
                }
            }
            have_shape = true;
        } else if (strcmp(key, "data_offsets") == 0) {
            if (have_offsets)
                ok = na_json_fail(j, "tensor '%s': duplicate field 'data_offsets'", e->name);
            else
                ok = na_json_expect(j, '[') && na_json_uint(j, &e->begin) &&
                     na_json_expect(j, ',') && na_json_uint(j, &e->end) &&
                     (na_json_peek(j) == ']' ||
                      na_json_fail(j, "tensor '%s': data_offsets must hold exactly 2 integers",
                                   e->name)) &&
                     na_json_expect(j, ']');
            have_offsets = true;
        } else {
            ok = na_json_skip(j, 2); /* unknown fields are ignored, as serde does */
        }
        free(key);
        if (!ok) return false;
        int more = na_json_after_item(j, '}');
        if (more > 0) continue;
        if (more == 0) break;
        return na_json_fail(j, "expected ',' or '}' in the info of tensor '%s'", e->name);
    }
    if (!have_dtype) return na_json_fail(j, "tensor '%s': missing field 'dtype'", e->name);
    if (!have_shape) return na_json_fail(j, "tensor '%s': missing field 'shape'", e->name);
    if (!have_offsets) return na_json_fail(j, "tensor '%s': missing field 'data_offsets'", e->name);
    return true;
}

static bool parse_metadata(na_json *j, na_checkpoint *ck) {
    if (na_json_peek(j) == 'n') return na_json_skip(j, 1); /* null: no metadata */
    if (!na_json_expect(j, '{')) return false;
    if (na_json_peek(j) == '}') {
        j->i++;
        return true;
    }
    for (;;) {
        char *k = NULL, *v = NULL;
        if (!na_json_string(j, &k)) return false;
        if (!na_json_expect(j, ':')) {
            free(k);
            return false;
        }
        if (na_json_peek(j) != '"') {
            na_json_fail(j, "__metadata__ value of '%.60s' is not a string", k);
            free(k);
            return false;
        }
        if (!na_json_string(j, &v)) {
            free(k);
            return false;
        }
        if (meta_append(ck, k, v)) return na_json_fail(j, "out of memory");
        int more = na_json_after_item(j, '}');
        if (more > 0) continue;
        if (more == 0) return true;
        return na_json_fail(j, "expected ',' or '}' in __metadata__");
    }
}

static bool parse_header(na_json *j, na_checkpoint *ck) {
    bool have_meta = false;
    if (!na_json_expect(j, '{')) return false;
    if (na_json_peek(j) == '}') {
        j->i++;
    } else
        for (;;) {
            char *key = NULL;
            if (!na_json_string(j, &key)) return false;
            if (!na_json_expect(j, ':')) {
                free(key);
                return false;
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (have_meta) return na_json_fail(j, "duplicate key '__metadata__'");
                have_meta = true;
                if (!parse_metadata(j, ck)) return false;
            } else {
                if (ck->n == ck->cap) {
                    int64_t cap = ck->cap ? ck->cap * 2 : 16;
                    ck_entry *e = realloc(ck->e, (size_t)cap * sizeof *e);
                    if (!e) {
                        free(key);
                        return na_json_fail(j, "out of memory");
                    }
                    ck->e = e;
                    ck->cap = cap;
                }
                ck_entry *e = &ck->e[ck->n++];
                memset(e, 0, sizeof *e);
                e->name = key;
                if (!parse_tensor_info(j, e)) return false;
            }
            int more = na_json_after_item(j, '}');
            if (more > 0) continue;
            if (more == 0) break;
            return na_json_fail(j, "expected ',' or '}' after a top-level entry");
        }
    na_json_ws(j);
    if (j->i != j->n) return na_json_fail(j, "trailing characters after the JSON object");
    return true;
}

static int cmp_by_name(const void *a, const void *b) {
    const ck_entry *x = &sort_ck->e[*(const int64_t *)a], *y = &sort_ck->e[*(const int64_t *)b];
    return strcmp(x->name, y->name);
}

static int cmp_by_offsets(const void *a, const void *b) {
    const ck_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

na_checkpoint *na_checkpoint_load(const char *path) {
    if (!path) {
        na_set_error(NA_EINVAL, "na_checkpoint_load: path is NULL");
        return NULL;
    }
    na_checkpoint *ck = calloc(1, sizeof *ck);
    char *header = NULL;
    FILE *f = NULL;
    if (!ck || !(ck->path = strdup(path))) {
        na_set_error(NA_ENOMEM, "na_checkpoint_load: out of memory");
        goto fail;
    }
    struct stat sb;
    if (!(f = na_fopen_regular("na_checkpoint_load", path, &sb))) goto fail;
    const uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        fmt_error(path, "the file is %" PRIu64 " bytes, too small for the 8-byte header length",
                  size);
        goto fail;
    }
    unsigned char len8[8];
    if (fread(len8, 1, 8, f) != 8) goto read_error;
    uint64_t n = 0;
    for (int k = 0; k < 8; k++) n |= (uint64_t)len8[k] << (8 * k);
    if (n > NA_SAFETENSORS_MAX_HEADER) {
        fmt_error(path, "header length %" PRIu64 " (bytes 0..7) exceeds the limit of %d bytes", n,
                  NA_SAFETENSORS_MAX_HEADER);
        goto fail;
    }
    if (8 + n > size) {
        fmt_error(path,
                  "header length %" PRIu64 " (bytes 0..7) runs past the end of the file: 8 + %" PRIu64
                  " > %" PRIu64 " bytes",
                  n, n, size);
        goto fail;
    }
    header = malloc(n ? n : 1);
    if (!header) {
        na_set_error(NA_ENOMEM, "na_checkpoint_load: cannot allocate %" PRIu64 " header bytes", n);
        goto fail;
    }
    if (fread(header, 1, n, f) != n) goto read_error;
    size_t bad = na_utf8_check((const unsigned char *)header, n);
    if (bad) {
        fmt_error(path, "the header is not valid UTF-8 (byte 0x%02x at file offset %zu)",
                  (unsigned char)header[bad - 1], bad - 1 + 8);
        goto fail;
    }
    na_json j = {.s = header, .n = n};
    if (!parse_header(&j, ck)) {
        json_error(path, &j);
        goto fail;
    }
    ck->by_name = malloc((size_t)(ck->n ? ck->n : 1) * sizeof(int64_t));
    if (!ck->by_name) {
        na_set_error(NA_ENOMEM, "na_checkpoint_load: out of memory");
        goto fail;
    }
    /* validate offsets in file order (as safetensors: sorted by data_offsets) */
    for (int64_t i = 0; i < ck->n; i++) ck->by_name[i] = i;
    if (ck->n > 1) {
        qsort(ck->e, (size_t)ck->n, sizeof *ck->e, cmp_by_offsets);
        sort_ck = ck;
        qsort(ck->by_name, (size_t)ck->n, sizeof *ck->by_name, cmp_by_name);
        sort_ck = NULL;
    }
    for (int64_t i = 1; i < ck->n; i++)
        if (strcmp(ck->e[ck->by_name[i]].name, ck->e[ck->by_name[i - 1]].name) == 0) {
            fmt_error(path, "duplicate tensor name '%s' in the header", ck->e[ck->by_name[i]].name);
            goto fail;
        }
    uint64_t start = 0;
    for (int64_t i = 0; i < ck->n; i++) {
        ck_entry *e = &ck->e[i];
        if (e->begin != start || e->end < e->begin) {
            if (e->end < e->begin)
                fmt_error(path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before "
                                "they begin",
                          e->name, e->begin, e->end);
            else if (i == 0)
                fmt_error(path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "]: the first tensor must start at 0 (no gap)",
                          e->name, e->begin, e->end);
            else
                fmt_error(path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] %s the previous tensor '%s', which ends at %" PRIu64,
                          e->name, e->begin, e->end,
                          e->begin > start ? "leave a gap after" : "overlap", ck->e[i - 1].name,
                          start);
            goto fail;
        }
        start = e->end;
        uint64_t numel = 1, nbytes;
        bool ovf = false;
        for (int d = 0; d < e->ndim; d++)
            ovf = ovf || __builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel);
        const size_t esize = dtypes[e->st].size;
        ovf = ovf || __builtin_mul_overflow(numel, (uint64_t)esize, &nbytes);
        char sh[160];
        shape_str(sh, sizeof sh, e->ndim, e->shape);
        if (ovf) {
            fmt_error(path, "tensor '%s': shape %s x %zu-byte %s overflows 64 bits", e->name, sh,
                      esize, dtypes[e->st].name);
            goto fail;
        }
        if (nbytes != e->end - e->begin) {
            fmt_error(path,
                      "tensor '%s': shape %s of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64
                      ", %" PRIu64 "] span %" PRIu64,
                      e->name, sh, dtypes[e->st].name, nbytes, e->begin, e->end,
                      e->end - e->begin);
            goto fail;
        }
        e->numel = (int64_t)numel; /* <= nbytes <= file size */
        e->nbytes = (size_t)nbytes;
    }
    const uint64_t data_size = size - 8 - n;
    if (start != data_size) {
        fmt_error(path,
                  "the tensors' data ends at file offset %" PRIu64 " (8 + %" PRIu64 " + %" PRIu64
                  ") but the file is %" PRIu64 " bytes (%s)",
                  8 + n + start, n, start, size,
                  start < data_size ? "trailing bytes" : "missing bytes");
        goto fail;
    }
    if (ck->mn > 0) { /* metadata sorted by key; duplicates rejected */
        char ***kp = malloc((size_t)ck->mn * sizeof *kp);
        char **k2 = malloc((size_t)ck->mn * sizeof *k2);
        char **v2 = malloc((size_t)ck->mn * sizeof *v2);
        if (!kp || !k2 || !v2) {
            free(kp);
            free(k2);
            free(v2);
            na_set_error(NA_ENOMEM, "na_checkpoint_load: out of memory");
            goto fail;
        }
        for (int64_t i = 0; i < ck->mn; i++) kp[i] = &ck->mkey[i];
        qsort(kp, (size_t)ck->mn, sizeof *kp, cmp_str_ptr);
        for (int64_t i = 0; i < ck->mn; i++) {
            int64_t at = kp[i] - ck->mkey;
            k2[i] = ck->mkey[at];
            v2[i] = ck->mval[at];
        }
        free(kp);
        free(ck->mkey);
        free(ck->mval);
        ck->mkey = k2;
        ck->mval = v2;
        ck->mcap = ck->mn;
        for (int64_t i = 1; i < ck->mn; i++)
            if (strcmp(ck->mkey[i], ck->mkey[i - 1]) == 0) {
                fmt_error(path, "duplicate __metadata__ key '%s'", ck->mkey[i]);
                goto fail;
            }
    }
    ck->data = malloc(data_size ? data_size : 1);
    if (!ck->data) {
        na_set_error(NA_ENOMEM, "na_checkpoint_load: '%s': cannot allocate %" PRIu64 " data bytes",
                     path, data_size);
        goto fail;
    }
    if (data_size && fread(ck->data, 1, data_size, f) != data_size) goto read_error;
    for (int64_t i = 0; i < ck->n; i++) {
        ck_entry *e = &ck->e[i];
        e->data = ck->data + e->begin;
        if (e->nbytes && e->begin % dtypes[e->st].size != 0) { /* realign */
            e->owned = malloc(e->nbytes);
            if (!e->owned) {
                na_set_error(NA_ENOMEM, "na_checkpoint_load: out of memory");
                goto fail;
            }
            memcpy(e->owned, e->data, e->nbytes);
            e->data = e->owned;
        }
    }
    fclose(f);
    free(header);
    return ck;

read_error:
    na_set_error(NA_EIO, "na_checkpoint_load: read error in '%s': %s", path,
                 ferror(f) ? strerror(errno) : "the file shrank while reading");
fail:
    if (f) fclose(f);
    free(header);
    na_checkpoint_free(ck);
    return NULL;
}

/* ---- queries ------------------------------------------------------------------------ */
static void fill_entry(const ck_entry *e, na_checkpoint_entry *out) {
    out->name = e->name;
    out->dtype = e->dtype;
    out->file_dtype = dtypes[e->st].name;
    out->ndim = e->ndim;
    out->shape = e->shape;
    out->numel = e->numel;
    out->data = e->data;
    out->nbytes = e->nbytes;
}

int64_t na_checkpoint_count(const na_checkpoint *ck) { return ck ? ck->n : 0; }

int na_checkpoint_entry_at(const na_checkpoint *ck, int64_t i, na_checkpoint_entry *out) {
    if (!ck || !out || i < 0 || i >= ck->n)
        return na_set_error(NA_EINVAL, "na_checkpoint_entry_at: index %lld out of range 0..%lld",
                            (long long)i, (long long)(ck ? ck->n - 1 : -1));
    fill_entry(&ck->e[i], out);
    return NA_OK;
}

bool na_checkpoint_has(const na_checkpoint *ck, const char *name) {
    return ck && name && find(ck, name) >= 0;
}

int na_checkpoint_get(const na_checkpoint *ck, const char *name, na_checkpoint_entry *out) {
    if (!ck || !name || !out)
        return na_set_error(NA_EINVAL, "na_checkpoint_get: NULL argument");
    int64_t i = find(ck, name);
    if (i < 0)
        return na_set_error(NA_EINVAL, "na_checkpoint_get: no tensor '%s' in checkpoint%s%s%s",
                            name, ck->path ? " '" : "", ck->path ? ck->path : "",
                            ck->path ? "'" : "");
    fill_entry(&ck->e[i], out);
    return NA_OK;
}

static int64_t i64_at(const ck_entry *e, int64_t k) {
    int64_t x;
    memcpy(&x, (const unsigned char *)e->data + 8 * k, 8);
    return x;
}

/* Prefixes the current message with fn and the tensor name. */
static int wrap_error(int st, const char *fn, const char *name) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", na_last_error());
    return na_set_error(st ? st : NA_EIO, "%s: tensor '%s': %s", fn, name, msg);
}

/* An I64 tensor into dst's dtype, each value checked to be exactly representable there: the
 * integers (range-checked for an integer dst) go through an f64 staging tensor (exact up to
 * 2^53) and the library's own conversion, and for a float dst a read back must give the same
 * value. */
static int stage_i64(const char *fn, const ck_entry *e, const na_tensor *dst, const char *file,
                     na_tensor **staged) {
    const int64_t limit = INT64_C(1) << 53;
    const int64_t lo = dst->dtype == NA_DTYPE_I32 ? INT32_MIN : dst->dtype == NA_DTYPE_U8 ? 0 : -limit;
    const int64_t hi = dst->dtype == NA_DTYPE_I32 ? INT32_MAX : dst->dtype == NA_DTYPE_U8 ? 255 : limit;
    double *v = malloc((size_t)e->numel * sizeof *v);
    na_tensor *f64 = NULL, *conv = NULL;
    int st = NA_OK;
    int64_t bad = -1;
    if (!v) {
        st = na_set_error(NA_ENOMEM, "%s: out of memory converting '%s'", fn, e->name);
        goto done;
    }
    for (int64_t k = 0; k < e->numel && bad < 0; k++) {
        int64_t x = i64_at(e, k);
        if (x < lo || x > hi) bad = k;
        v[k] = (double)x;
    }
    if (bad >= 0) goto done;
    if (!(f64 = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, dst->ndim, dst->shape)) ||
        !(conv = na_tensor_new(dst->dtype, NA_DEVICE_CPU, dst->ndim, dst->shape)) ||
        (st = na_copy_from_host(f64, v)) || (st = na_copy_(conv, f64))) {
        st = wrap_error(st ? st : na_last_status(), fn, e->name);
        goto done;
    }
    for (int64_t k = 0; na_dtype_is_float(dst->dtype) && k < e->numel && bad < 0; k++)
        if (na_get(conv, k) != v[k]) bad = k;
done:
    if (bad >= 0)
        st = na_set_error(NA_EDTYPE,
                          "%s: checkpoint tensor '%s' (I64) holds %" PRId64 " at element %" PRId64
                          ", which the model's %s tensor cannot hold exactly (file '%s')",
                          fn, e->name, i64_at(e, bad), bad, na_dtype_name(dst->dtype), file);
    if (st) na_tensor_free(conv), conv = NULL;
    *staged = conv;
    na_tensor_free(f64);
    free(v);
    return st;
}

/* The entry `name` after the checks a copy into dst makes (present, dtype, shape), or NULL
 * with the message set. */
static const ck_entry *entry_for(const char *fn, const na_checkpoint *ck, const char *name,
                                 const na_tensor *dst) {
    int64_t i = find(ck, name);
    const char *file = ck->path ? ck->path : "(unsaved)";
    if (i < 0) {
        na_set_error(NA_EINVAL, "%s: no tensor '%s' in checkpoint '%s'", fn, name, file);
        return NULL;
    }
    const ck_entry *e = &ck->e[i];
    if (e->dtype != dst->dtype && e->dtype != NA_DTYPE_COUNT) {
        na_set_error(NA_EDTYPE,
                     "%s: checkpoint tensor '%s' has dtype %s but the model's is %s (file '%s')",
                     fn, name, na_dtype_name(e->dtype), na_dtype_name(dst->dtype), file);
        return NULL;
    }
    bool same = e->ndim == dst->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == dst->shape[d];
    if (!same) {
        char a[160], b[160];
        shape_str(a, sizeof a, e->ndim, e->shape);
        shape_str(b, sizeof b, dst->ndim, dst->shape);
        na_set_error(NA_ESHAPE,
                     "%s: checkpoint tensor '%s' has shape %s but the model's is %s (file '%s')",
                     fn, name, a, b, file);
        return NULL;
    }
    return e;
}

/* Writes a checked entry into dst: from the I64 staging tensor when there is one. */
static int commit(const char *fn, const ck_entry *e, na_tensor *dst, const na_tensor *staged) {
    if (e->numel == 0) return NA_OK;
    int st = staged ? na_copy_(dst, staged)
           : e->data ? na_copy_from_host(dst, e->data) : na_copy_(dst, e->tensor);
    return st ? wrap_error(st, fn, e->name) : NA_OK;
}

int na_checkpoint_copy_into(const na_checkpoint *ck, const char *name, na_tensor *dst) {
    const char *fn = "na_checkpoint_copy_into";
    if (!ck || !name || !dst) return na_set_error(NA_EINVAL, "%s: NULL argument", fn);
    const ck_entry *e = entry_for(fn, ck, name, dst);
    if (!e) return na_last_status();
    na_tensor *staged = NULL;
    int st = e->dtype == NA_DTYPE_COUNT && e->numel
                 ? stage_i64(fn, e, dst, ck->path ? ck->path : "(unsaved)", &staged)
                 : NA_OK;
    if (!st) st = commit(fn, e, dst, staged);
    na_tensor_free(staged);
    return st;
}

const char *na_checkpoint_get_meta(const na_checkpoint *ck, const char *key) {
    if (!ck || !key) return NULL;
    for (int64_t i = 0; i < ck->mn; i++)
        if (strcmp(ck->mkey[i], key) == 0) return ck->mval[i];
    return NULL;
}

int64_t na_checkpoint_meta_count(const na_checkpoint *ck) { return ck ? ck->mn : 0; }

int na_checkpoint_meta_at(const na_checkpoint *ck, int64_t i, const char **key,
                          const char **value) {
    if (!ck || i < 0 || i >= ck->mn)
        return na_set_error(NA_EINVAL, "na_checkpoint_meta_at: index %lld out of range",
                            (long long)i);
    if (key) *key = ck->mkey[i];
    if (value) *value = ck->mval[i];
    return NA_OK;
}

/* ---- convenience -------------------------------------------------------------------- */
int na_checkpoint_add_list(na_checkpoint *ck, const na_named_tensors *l) {
    if (!l) return na_set_error(NA_EINVAL, "na_checkpoint_add_list: NULL list");
    int st = NA_OK;
    for (int64_t i = 0; i < l->n && !st; i++)
        st = na_checkpoint_add(ck, l->items[i].name, l->items[i].tensor);
    return st;
}

/* All or nothing: every item is checked (and an I64 entry converted into a staging tensor)
 * before the first is written, so a failure leaves every tensor of l as it was. */
int na_checkpoint_copy_list(const na_checkpoint *ck, const na_named_tensors *l, bool strict) {
    const char *fn = "na_checkpoint_copy_list";
    if (!ck || !l) return na_set_error(NA_EINVAL, "%s: NULL checkpoint or list", fn);
    const char *file = ck->path ? ck->path : "(unsaved)";
    bool *used = calloc((size_t)(ck->n ? ck->n : 1), 1);
    const ck_entry **e = calloc((size_t)(l->n ? l->n : 1), sizeof *e);
    na_tensor **staged = calloc((size_t)(l->n ? l->n : 1), sizeof *staged);
    int st = used && e && staged ? NA_OK : na_set_error(NA_ENOMEM, "%s: out of memory", fn);
    for (int64_t i = 0; i < l->n && !st; i++) {
        if (!(e[i] = entry_for(fn, ck, l->items[i].name, l->items[i].tensor))) {
            st = na_last_status();
            break;
        }
        used[e[i] - ck->e] = true;
        if (e[i]->dtype == NA_DTYPE_COUNT && e[i]->numel)
            st = stage_i64(fn, e[i], l->items[i].tensor, file, &staged[i]);
    }
    for (int64_t k = 0; strict && !st && k < ck->n; k++)
        if (!used[k])
            st = na_set_error(NA_EINVAL, "%s: '%s' holds tensor '%s', which is not among the "
                              "%" PRId64 " tensors to load (strict)", fn,
                              ck->path ? ck->path : "checkpoint", ck->e[k].name, l->n);
    for (int64_t i = 0; i < l->n && !st; i++) st = commit(fn, e[i], l->items[i].tensor, staged[i]);
    for (int64_t i = 0; staged && i < l->n; i++) na_tensor_free(staged[i]);
    free(staged);
    free(e);
    free(used);
    return st;
}

int na_checkpoint_save_list(const char *path, const na_named_tensors *l) {
    na_checkpoint *ck = na_checkpoint_new();
    int st = ck ? na_checkpoint_add_list(ck, l) : na_last_status();
    if (!st) st = na_checkpoint_save(ck, path);
    na_checkpoint_free(ck);
    return st;
}

int na_checkpoint_load_list(const char *path, const na_named_tensors *l, bool strict) {
    na_checkpoint *ck = na_checkpoint_load(path);
    int st = ck ? na_checkpoint_copy_list(ck, l, strict) : na_last_status();
    na_checkpoint_free(ck);
    return st;
}

/* ---- values ------------------------------------------------------------------------- */
/* Element k of a float entry when it is not finite: its class ("nan", "inf", "-inf") from the
 * bits (f16/bf16: exponent all ones), else NULL. */
static const char *nonfinite_at(const ck_entry *e, int64_t k) {
    const unsigned char *p = e->data;
    uint64_t bits = 0, exp, man, sign;
    switch (e->dtype) {
    case NA_DTYPE_F64:
        memcpy(&bits, p + 8 * k, 8);
        exp = bits >> 52 & 0x7ff, man = bits & 0xfffffffffffffull, sign = bits >> 63;
        if (exp != 0x7ff) return NULL;
        break;
    case NA_DTYPE_F32:
        memcpy(&bits, p + 4 * k, 4);
        exp = bits >> 23 & 0xff, man = bits & 0x7fffff, sign = bits >> 31;
        if (exp != 0xff) return NULL;
        break;
    case NA_DTYPE_F16: case NA_DTYPE_BF16:
        memcpy(&bits, p + 2 * k, 2);
        if (e->dtype == NA_DTYPE_F16) exp = bits >> 10 & 0x1f, man = bits & 0x3ff;
        else exp = bits >> 7 & 0xff, man = bits & 0x7f;
        sign = bits >> 15;
        if (exp != (e->dtype == NA_DTYPE_F16 ? 0x1f : 0xff)) return NULL;
        break;
    default: return NULL; /* integers are always finite */
    }
    return man ? "nan" : sign ? "-inf" : "inf";
}

int na_checkpoint_check_finite(const na_checkpoint *ck, const char *name) {
    const char *fn = "na_checkpoint_check_finite";
    if (!ck || !name) return na_set_error(NA_EINVAL, "%s: NULL argument", fn);
    int64_t i = find(ck, name);
    const char *file = ck->path ? ck->path : "(unsaved)";
    if (i < 0)
        return na_set_error(NA_EINVAL, "%s: no tensor '%s' in checkpoint '%s'", fn, name, file);
    const ck_entry *e = &ck->e[i];
    if (!e->data && e->numel)
        return na_set_error(NA_EINVAL, "%s: tensor '%s' is a device tensor added for saving, not "
                            "data read from a file", fn, name);
    for (int64_t k = 0; k < e->numel; k++) {
        const char *what = nonfinite_at(e, k);
        if (what)
            return na_set_error(NA_EINVAL, "checkpoint '%s': tensor '%s' holds %s at element "
                                "%" PRId64 " (of %" PRId64 ")", file, name, what, k, e->numel);
    }
    return NA_OK;
}
