/* libFuzzer harness: the safetensors header parser and validator. Input: 2 bytes (little-
 * endian) giving the data section's length, then the JSON header; the harness adds the 8-byte
 * length prefix and the data bytes, so mutations go to the JSON rather than to the framing. */
#include "fuzz_util.h"
#include "nanoamp/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    static fuzz_file f;
    if (n < 2) return 0;
    size_t data = (size_t)(d[0] | d[1] << 8), hl = n - 2;
    uint8_t *file = malloc(8 + hl + data);
    FUZZ_CHECK(file != NULL);
    for (int k = 0; k < 8; k++) file[k] = (uint8_t)((uint64_t)hl >> (8 * k));
    memcpy(file + 8, d + 2, hl);
    for (size_t k = 0; k < data; k++) file[8 + hl + k] = (uint8_t)(k * 31 + 7);
    const char *path = fuzz_file_set(&f, file, 8 + hl + data);
    free(file);
    na_clear_error();
    na_checkpoint *ck = na_checkpoint_load(path);
    if (!ck) {
        FUZZ_CHECK_FAILURE("na_checkpoint_load");
        return 0;
    }
    size_t total = 0;
    for (int64_t i = 0; i < na_checkpoint_count(ck); i++) {
        na_checkpoint_entry e;
        FUZZ_CHECK(na_checkpoint_entry_at(ck, i, &e) == NA_OK);
        total += e.nbytes;
    }
    FUZZ_CHECK(total == data);
    na_checkpoint_free(ck);
    return 0;
}
