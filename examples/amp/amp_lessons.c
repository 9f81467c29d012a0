/* What the lessons share (see amp_lessons.h): the quotes they record for the guide, small
 * tensors, and the programs' arguments and output files. Each lesson is in its own file,
 * lesson_<name>.c. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "lesson_internal.h"

void quote(amp_quotes *qs, const char *key, const char *fmt, ...) {
    if (qs->n == AMP_MAX_QUOTES) return;
    amp_quote *q = &qs->q[qs->n++];
    q->key = key;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->text, sizeof q->text, fmt, ap);
    va_end(ap);
    size_t n = strlen(q->text); /* no trailing blanks: the guide quotes these lines as they are */
    while (n && q->text[n - 1] == ' ') q->text[--n] = '\0';
}

const char *amp_quote_get(const amp_quotes *qs, const char *key) {
    for (int i = 0; i < qs->n; i++)
        if (!strcmp(qs->q[i].key, key)) return qs->q[i].text;
    return "";
}

na_tensor *leaf(na_dtype dt, int ndim, const int64_t *shape, double fill) {
    na_tensor *t = na_tensor_new(dt, NA_DEVICE_CPU, ndim, shape);
    if (!t || na_fill_(t, fill) || na_tensor_set_requires_grad(t, true)) {
        na_tensor_free(t);
        return NULL;
    }
    return t;
}

double round_trip(na_dtype dt, double v) {
    na_tensor *t = na_scalar(NA_DTYPE_F32, NA_DEVICE_CPU, v);
    return t ? na_item(na_cast(t, dt)) : NAN;
}

static const float FASHION_MEAN[1] = {0.2860f}, FASHION_STD[1] = {0.3530f};

int amp_fashion_load(const char *dir, amp_fashion *d) {
    if (!dir) dir = getenv("NANOAMP_DATA");
    if (!dir || !*dir) dir = "/usr/share/datasets/fashion-mnist";
    d->train = na_mnist_load(dir, true);
    d->test = d->train ? na_mnist_load(dir, false) : NULL;
    if (!d->test) {
        na_dataset_free(d->train);
        return na_set_error(na_last_status(), "Fashion-MNIST in %s (set NANOAMP_DATA): %s", dir,
                            na_last_error());
    }
    if (d->train->n > MLP_TRAIN_N) d->train->n = MLP_TRAIN_N; /* the first images only */
    if (d->test->n > MLP_TEST_N) d->test->n = MLP_TEST_N;
    return 0;
}

void amp_fashion_free(amp_fashion *d) {
    na_dataset_free(d->train);
    na_dataset_free(d->test);
}

na_batcher *amp_fashion_batcher(const na_dataset *ds, int64_t batch, bool shuffled) {
    return na_batcher_new(ds, &(na_batcher_cfg){.batch_size = batch, .seed = 1,
                                                .shuffle = shuffled, .drop_last = shuffled,
                                                .mean = FASHION_MEAN, .std = FASHION_STD});
}

/* ==== the programs ============================================================================ */

int amp_lesson_args(int argc, char **argv, const char *usage, const char *opt, bool takes_value,
                    const char **value) {
    if (value) *value = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s", usage);
            return 0;
        }
        if (opt && !strcmp(argv[i], opt) && (!takes_value || i + 1 < argc)) {
            *value = takes_value ? argv[++i] : "";
            continue;
        }
        if (opt && takes_value && !strcmp(argv[i], opt))
            fprintf(stderr, "%s: %s needs a value\n%s", argv[0], opt, usage);
        else
            fprintf(stderr, "%s: unexpected argument '%s'\n%s", argv[0], argv[i], usage);
        return 2;
    }
    return -1;
}

int amp_lesson_main(int argc, char **argv, const char *usage, const char *opt, bool takes_value,
                    int (*run)(const char *value)) {
    const char *value = NULL;
    int rc = amp_lesson_args(argc, argv, usage, opt, takes_value, opt ? &value : NULL);
    return rc >= 0 ? rc : run(value);
}

int amp_write_svg(const char *path, int (*draw)(FILE *svg)) {
    FILE *f = fopen(path, "w");
    int rc = f ? draw(f) : -1;
    if (f && fclose(f) != 0) rc = -1;
    if (rc) fprintf(stderr, "cannot write %s\n", path);
    else fprintf(stderr, "wrote %s\n", path);
    return rc ? 1 : 0;
}
