/* libFuzzer harness: na_checkpoint_load on a whole file; what loads is read back entry by
 * entry and copied into tensors of the same shape (I64 through the conversion), and the
 * metadata is looked up by key. */
#include "fuzz_util.h"
#include "nanoamp/io.h"
#include "nanoamp/tensor.h"

static void copy_out(const na_checkpoint *ck, const na_checkpoint_entry *e, na_dtype dt) {
    if (e->ndim > NA_MAX_DIMS || e->numel > 4096) return;
    na_tensor *t = na_tensor_new(dt, NA_DEVICE_CPU, e->ndim, e->shape);
    if (!t) return;
    na_clear_error();
    int st = na_checkpoint_copy_into(ck, e->name, t);
    if (st) FUZZ_CHECK(e->dtype == NA_DTYPE_COUNT && st == NA_EDTYPE && strstr(na_last_error(), e->name));
    na_tensor_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    static fuzz_file f;
    const char *path = fuzz_file_set(&f, d, n);
    na_clear_error();
    na_checkpoint *ck = na_checkpoint_load(path);
    if (!ck) {
        FUZZ_CHECK_FAILURE("na_checkpoint_load");
        return 0;
    }
    for (int64_t i = 0; i < na_checkpoint_count(ck); i++) {
        na_checkpoint_entry e;
        FUZZ_CHECK(na_checkpoint_entry_at(ck, i, &e) == NA_OK);
        FUZZ_CHECK(na_checkpoint_has(ck, e.name));
        size_t esize = e.dtype == NA_DTYPE_COUNT ? 8 : na_dtype_size(e.dtype);
        FUZZ_CHECK(e.nbytes == (size_t)e.numel * esize && e.nbytes <= n);
        unsigned sum = 0;
        for (size_t k = 0; k < e.nbytes; k++) sum += ((const uint8_t *)e.data)[k];
        (void)sum;
        copy_out(ck, &e, e.dtype == NA_DTYPE_COUNT ? NA_DTYPE_I32 : e.dtype);
        if (e.dtype == NA_DTYPE_COUNT) copy_out(ck, &e, NA_DTYPE_F32);
    }
    for (int64_t i = 0; i < na_checkpoint_meta_count(ck); i++) {
        const char *k, *v;
        FUZZ_CHECK(na_checkpoint_meta_at(ck, i, &k, &v) == NA_OK);
        FUZZ_CHECK(na_checkpoint_get_meta(ck, k) == v);
    }
    na_checkpoint_free(ck);
    na_step_end();
    return 0;
}
