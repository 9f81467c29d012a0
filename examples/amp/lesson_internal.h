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

/* Fashion-MNIST for the lessons that train or take a real layer's tensors (5, 6, 7, 9): the
 * first MLP_TRAIN_N training and MLP_TEST_N test images of dir (NULL: $NANOAMP_DATA, else
 * /usr/share/datasets/fashion-mnist). Fails (-1, the error naming the directory) when they
 * are not there. */
enum { MLP_TRAIN_N = 8192, MLP_TEST_N = 2000, MLP_BATCH = 128 };
typedef struct {
    na_dataset *train, *test;
} amp_fashion;
int amp_fashion_load(const char *dir, amp_fashion *d);
void amp_fashion_free(amp_fashion *d);
/* Batches of ds normalized with Fashion-MNIST's mean and std; shuffled: seed 1, the last
 * partial batch dropped (the training runs'), else in order, every image. */
na_batcher *amp_fashion_batcher(const na_dataset *ds, int64_t batch, bool shuffled);

/* amp-overflow --log: the sawtooth lesson, printed (lesson_loss_scaling.c). */
int amp_sawtooth_run(const char *csv_path);

#endif
