/* na_dataset: allocation, freeing and the synthetic CIFAR-shaped dataset. */
#include <math.h>
#include <stdlib.h>

#include "nanoamp/data.h"
#include "nanoamp/error.h"
#include "splitmix.h"

na_dataset *na_dataset_new(int64_t n, int channels, int height, int width, int num_classes) {
    if (n <= 0 || channels <= 0 || height <= 0 || width <= 0 || num_classes <= 0) {
        na_set_error(NA_EINVAL,
                     "na_dataset_new: n=%lld, channels=%d, height=%d, width=%d, num_classes=%d: "
                     "all must be positive",
                     (long long)n, channels, height, width, num_classes);
        return NULL;
    }
    int64_t per = (int64_t)channels * height * width, bytes;
    if (__builtin_mul_overflow(per, n, &bytes) || bytes > ((int64_t)1 << 40)) {
        na_set_error(NA_EINVAL, "na_dataset_new: %lld images of %dx%dx%d are too large",
                     (long long)n, channels, height, width);
        return NULL;
    }
    na_dataset *ds = calloc(1, sizeof *ds);
    if (ds) {
        ds->images = calloc((size_t)bytes, 1);
        ds->labels = calloc((size_t)n, sizeof(int32_t));
    }
    if (!ds || !ds->images || !ds->labels) {
        na_dataset_free(ds);
        na_set_error(NA_ENOMEM, "na_dataset_new: cannot allocate %lld image bytes",
                     (long long)bytes);
        return NULL;
    }
    ds->n = n;
    ds->channels = channels;
    ds->height = height;
    ds->width = width;
    ds->num_classes = num_classes;
    return ds;
}

void na_dataset_free(na_dataset *ds) {
    if (!ds) return;
    free(ds->images);
    free(ds->labels);
    free(ds);
}

na_dataset *na_dataset_synthetic_cifar(int64_t n, uint64_t seed) {
    /* One colour (RGB offsets) and one stripe orientation/frequency per class. */
    static const int colour[10][3] = {
        {60, -30, -30}, {-30, 60, -30}, {-30, -30, 60}, {50, 50, -40}, {50, -40, 50},
        {-40, 50, 50},  {0, 0, 0},      {40, 10, -20},  {-20, 40, 10}, {10, -20, 40}};
    na_dataset *ds = na_dataset_new(n, 3, 32, 32, 10);
    if (!ds) return NULL;
    const double pi = 3.14159265358979323846;
    uint64_t s = na_splitmix64_mix(seed ^ 0x5EEDC1FA5EEDC1FAull);
    for (int64_t i = 0; i < n; i++) {
        int k = (int)na_splitmix64_below(&s, 10);
        ds->labels[i] = k;
        double angle = k * pi / 10, freq = 2 * pi * (2 + k % 3) / 32;
        double phase = 2 * pi * (double)(na_splitmix64_next(&s) >> 11) * 0x1p-53;
        double cs = cos(angle), sn = sin(angle);
        uint8_t *img = ds->images + i * 3 * 32 * 32;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 32; y++)
                for (int x = 0; x < 32; x++) {
                    double stripe = sin(freq * (x * cs + y * sn) + phase);
                    double noise = (double)(na_splitmix64_next(&s) >> 11) * 0x1p-53 * 48 - 24;
                    double v = 128 + colour[k][c] + 48 * stripe + noise;
                    v = v < 0 ? 0 : v > 255 ? 255 : v;
                    img[(c * 32 + y) * 32 + x] = (uint8_t)lrint(v);
                }
    }
    return ds;
}
