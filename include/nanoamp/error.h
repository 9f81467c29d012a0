/* nanoamp/error.h — status codes and the last error message.
 *
 * No function in nanoamp exits or aborts on a user error. A failing call returns NULL or a
 * negative na_status and records a message that names the function and what was wrong
 * (shapes, dtypes, device, file, offset). Read it with na_last_error(); it is per thread and
 * stays until the next failure or na_clear_error().
 *
 *     na_tensor *c = na_matmul(a, b);
 *     if (!c) fprintf(stderr, "nanoamp: %s\n", na_last_error());
 *     // e.g. "na_matmul: inner dimensions differ: a is [2, 3] (f32), b is [4, 5] (f32)"
 */
#ifndef NANOAMP_ERROR_H
#define NANOAMP_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, text): one list makes the enum (NA_<name> = value) and the strings. */
#define NA_STATUS_MAP(X)                                   \
    X(EINVAL, -1, "invalid argument")                      \
    X(ESHAPE, -2, "shape mismatch")                        \
    X(EDTYPE, -3, "unsupported dtype")                     \
    X(EDEVICE, -4, "device not available")                 \
    X(ENOMEM, -5, "out of memory")                         \
    X(EIO, -6, "i/o error")                                \
    X(EFORMAT, -7, "malformed file")                       \
    X(ESTATE, -8, "invalid state")                         \
    X(ECUDA, -9, "CUDA/cuBLAS/cuDNN error")                \
    X(ENOTSUP, -10, "not supported")

typedef enum {
    NA_OK = 0,
#define NA_STATUS_ENUM_(name, value, text) NA_##name = value,
    NA_STATUS_MAP(NA_STATUS_ENUM_)
#undef NA_STATUS_ENUM_
} na_status;

/* "invalid argument" for NA_EINVAL, "ok" for NA_OK, "unknown status" otherwise. */
const char *na_status_str(int status);

/* The message of the last failure on this thread ("" when there was none). */
const char *na_last_error(void);

/* The status of the last failure on this thread (NA_OK when there was none). */
int na_last_status(void);

void na_clear_error(void);

/* Record a failure; returns `status` so callers can `return na_set_error(...)`.
 * Used by the library and by extensions; the message is printf-formatted. */
int na_set_error(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
