/* libFuzzer harness: na_cifar_load_files on one file (any size; exact_size off). */
#include "fuzz_util.h"
#include "nanoamp/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    static fuzz_file f;
    const char *path = fuzz_file_set(&f, d, n);
    na_clear_error();
    na_dataset *ds = na_cifar_load_files(&path, 1, false);
    if (!ds) {
        FUZZ_CHECK_FAILURE("na_cifar_load_files");
        return 0;
    }
    FUZZ_CHECK(n % NA_CIFAR_RECORD_BYTES == 0 && ds->n == (int64_t)(n / NA_CIFAR_RECORD_BYTES));
    for (int64_t i = 0; i < ds->n; i++) {
        FUZZ_CHECK(ds->labels[i] == d[i * NA_CIFAR_RECORD_BYTES]);
        FUZZ_CHECK(memcmp(ds->images + i * 3072, d + i * NA_CIFAR_RECORD_BYTES + 1, 3072) == 0);
    }
    na_dataset_free(ds);
    return 0;
}
