/* nanoamp/dtype.h — element types and devices.
 *
 * f64 exists for gradient checks on the CPU; f32 is the default; f16 and bf16 are the mixed
 * precision storage types (computed as a GPU would: widened to f32, f32 accumulation, one
 * rounding to nearest even on store); i32 holds class labels, u8 raw image bytes.
 * f8e4m3 / f8e5m2 are the two FP8 formats (OCP E4M3 "fn": max 448, no inf; E5M2: max 57344,
 * with inf), one byte each: storage only. na_cast converts them to and from every float
 * dtype (bit-identical to PyTorch 2.15's casts: E4M3 saturates, E5M2 overflows to inf) and
 * na_scaled_mm multiplies them; every other op rejects them (na_dtype_is_float is false for
 * them, unlike PyTorch's is_floating_point), naming the op and the dtype.
 */
#ifndef NANOAMP_DTYPE_H
#define NANOAMP_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    NA_DTYPE_F64,
    NA_DTYPE_F32,
    NA_DTYPE_F16,
    NA_DTYPE_BF16,
    NA_DTYPE_I32,
    NA_DTYPE_U8,
    NA_DTYPE_F8E4M3,
    NA_DTYPE_F8E5M2,
    NA_DTYPE_COUNT
} na_dtype;

typedef enum { NA_DEVICE_CPU, NA_DEVICE_CUDA, NA_DEVICE_COUNT } na_device;

size_t na_dtype_size(na_dtype dt);      /* bytes per element; 0 for an invalid value */
const char *na_dtype_name(na_dtype dt); /* "f32", "bf16", ...; "?" for an invalid value */
bool na_dtype_is_float(na_dtype dt);    /* f64, f32, f16, bf16 (the dtypes ops compute in) */
bool na_dtype_is_fp8(na_dtype dt);      /* f8e4m3, f8e5m2 */
const char *na_device_name(na_device dev); /* "cpu", "cuda" */

#ifdef __cplusplus
}
#endif
#endif
