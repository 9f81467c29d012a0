/* libFuzzer harness: na_idx_load through the gzip reader. Input: 2 bytes choosing the split,
 * 1 mode byte, then the two files. Mode bit 0 (images) and bit 1 (labels): gzip-compress that
 * part here (the IDX parser behind a valid gzip stream), else write it as is (the fuzzer's own
 * bytes as the gzip container: members, trailers, trailing bytes). */
#include "fuzz_util.h"
#include "nanoamp/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    static fuzz_file fi, fl;
    const uint8_t *part[2];
    size_t len[2];
    if (fuzz_split(d, n, 3, &part[0], &len[0], &part[1], &len[1])) return 0;
    fuzz_file *files[2] = {&fi, &fl};
    const char *path[2];
    for (int k = 0; k < 2; k++) {
        if (d[2] >> k & 1) {
            size_t gl;
            uint8_t *g = fuzz_gzip(part[k], len[k], &gl);
            path[k] = fuzz_file_set(files[k], g, gl);
            free(g);
        } else {
            path[k] = fuzz_file_set(files[k], part[k], len[k]);
        }
    }
    na_clear_error();
    na_dataset *ds = na_idx_load(path[0], path[1]);
    if (!ds) {
        FUZZ_CHECK_FAILURE("na_idx_load");
        return 0;
    }
    if (d[2] & 1) FUZZ_CHECK((size_t)(ds->n * ds->height * ds->width) == len[0] - 16);
    for (int64_t i = 0; i < ds->n; i++) FUZZ_CHECK(ds->labels[i] >= 0 && ds->labels[i] < 10);
    na_dataset_free(ds);
    return 0;
}
