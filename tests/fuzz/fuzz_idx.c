/* libFuzzer harness: na_idx_load on an images file and a labels file, plain or gzip as the
 * bytes say. Input: 2 bytes choosing the split, then the two files' bytes back to back. */
#include "fuzz_util.h"
#include "nanoamp/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    static fuzz_file fi, fl;
    const uint8_t *img, *lab;
    size_t in, ln;
    if (fuzz_split(d, n, 2, &img, &in, &lab, &ln)) return 0;
    const char *ip = fuzz_file_set(&fi, img, in), *lp = fuzz_file_set(&fl, lab, ln);
    na_clear_error();
    na_dataset *ds = na_idx_load(ip, lp);
    if (!ds) {
        FUZZ_CHECK_FAILURE("na_idx_load");
        return 0;
    }
    FUZZ_CHECK(ds->n > 0 && ds->channels == 1 && ds->height > 0 && ds->width > 0);
    if (!(in >= 2 && img[0] == 0x1f && img[1] == 0x8b)) /* plain: exactly header + pixels */
        FUZZ_CHECK((size_t)(ds->n * ds->height * ds->width) == in - 16);
    uint64_t sum = 0;
    for (int64_t i = 0; i < ds->n * ds->height * ds->width; i++) sum += ds->images[i];
    for (int64_t i = 0; i < ds->n; i++) FUZZ_CHECK(ds->labels[i] >= 0 && ds->labels[i] < 10);
    (void)sum;
    na_dataset_free(ds);
    return 0;
}
