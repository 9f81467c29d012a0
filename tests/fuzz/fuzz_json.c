/* libFuzzer harness: the strict JSON reader of the safetensors header (src/io/json.h) on
 * arbitrary bytes: skipping a value, a string, an unsigned integer, the UTF-8 check. */
#include "fuzz_util.h"
#include "json.h"

static void check_state(const na_json *j, bool ok) {
    FUZZ_CHECK(j->i <= j->n);
    if (!ok) FUZZ_CHECK(j->err[0] != '\0' && j->err_at <= j->n);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    na_json j = {.s = (const char *)d, .n = n};
    bool ok = na_json_skip(&j, 0);
    check_state(&j, ok);

    /* The reader's contract (as the checkpoint loader uses it): the text was checked to be
     * UTF-8 first; then every decoded string is UTF-8 too (escapes included). */
    size_t bad = na_utf8_check(d, n);
    FUZZ_CHECK(bad <= n);
    na_json js = {.s = (const char *)d, .n = n};
    char *s = NULL;
    ok = na_json_string(&js, &s);
    check_state(&js, ok);
    if (ok) {
        FUZZ_CHECK(s != NULL);
        if (bad == 0) FUZZ_CHECK(na_utf8_check((const unsigned char *)s, strlen(s)) == 0);
    }
    free(s);

    na_json ju = {.s = (const char *)d, .n = n};
    uint64_t v;
    check_state(&ju, na_json_uint(&ju, &v));
    return 0;
}
