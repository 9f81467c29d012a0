#include "nanoamp/dtype.h"

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} dtype_info[] = {
    [NA_DTYPE_F64] = {"f64", 8, true},  [NA_DTYPE_F32] = {"f32", 4, true},
    [NA_DTYPE_F16] = {"f16", 2, true},  [NA_DTYPE_BF16] = {"bf16", 2, true},
    [NA_DTYPE_I32] = {"i32", 4, false}, [NA_DTYPE_U8] = {"u8", 1, false},
    [NA_DTYPE_F8E4M3] = {"f8e4m3", 1, false}, [NA_DTYPE_F8E5M2] = {"f8e5m2", 1, false},
};
_Static_assert(sizeof dtype_info / sizeof dtype_info[0] == NA_DTYPE_COUNT,
               "dtype_info and na_dtype out of step");

static bool valid(na_dtype dt) { return (unsigned)dt < NA_DTYPE_COUNT; }

size_t na_dtype_size(na_dtype dt) { return valid(dt) ? dtype_info[dt].size : 0; }
const char *na_dtype_name(na_dtype dt) { return valid(dt) ? dtype_info[dt].name : "?"; }
bool na_dtype_is_float(na_dtype dt) { return valid(dt) && dtype_info[dt].is_float; }
bool na_dtype_is_fp8(na_dtype dt) { return dt == NA_DTYPE_F8E4M3 || dt == NA_DTYPE_F8E5M2; }
const char *na_device_name(na_device dev) {
    return dev == NA_DEVICE_CPU ? "cpu" : dev == NA_DEVICE_CUDA ? "cuda" : "?";
}
