/* examples/amp/lesson_internal.h — what the lesson files share among themselves (not the
 * programs or the tests): the failure check, the quotes the guide holds, small tensors. */
#ifndef NANOAMP_EXAMPLES_LESSON_INTERNAL_H
#define NANOAMP_EXAMPLES_LESSON_INTERNAL_H

#include "amp_lessons.h"

/* On failure: says which expression failed and why, and returns -1 from the lesson. */
#define CHECK(expr)                                                                      \
    do {                                                                                 \
        if (!(expr)) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,         \
                    na_last_error());                                                    \
            return -1;                                                                   \
        }                                                                                \
    } while (0)
#define CHECK_RC(expr) CHECK((expr) == NA_OK)

/* Adds a quote under key (printf-style, trailing blanks dropped): the guide holds it exactly. */
void quote(amp_quotes *qs, const char *key, const char *fmt, ...);

/* A CPU leaf tensor filled with fill that requires grad; NULL on failure. */
na_tensor *leaf(na_dtype dt, int ndim, const int64_t *shape, double fill);
/* v stored as dt and read back. */
double round_trip(na_dtype dt, double v);

/* amp-overflow --log: the sawtooth lesson, printed (lesson_loss_scaling.c). */
int amp_sawtooth_run(const char *csv_path);

#endif
