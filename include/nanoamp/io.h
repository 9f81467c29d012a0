/* nanoamp/io.h — checkpoints in the safetensors format.
 *
 * File layout (huggingface/safetensors): an 8-byte little-endian u64 N, N bytes of UTF-8 JSON
 *   {"__metadata__":{"epoch":"3"},"fc.weight":{"dtype":"F32","shape":[10,64],
 *    "data_offsets":[0,2560]}, ...}
 * padded with spaces to a multiple of 8, then the raw little-endian C-order data; offsets are
 * relative to the start of the data. nanoamp reads and writes the dtypes F64 F32 F16 BF16 I32
 * U8, and reads I64 (PyTorch stores BatchNorm's num_batches_tracked so): an I64 tensor is
 * converted by na_checkpoint_copy_into into the model tensor's dtype, each value checked to
 * fit exactly, so a state dict saved from PyTorch with safetensors loads. Files written here are byte-identical to what safetensors itself writes for the same
 * tensors and metadata (tensors ordered by dtype alignment, then by name; compact JSON).
 *
 * Saving is atomic: the file is written to "<path>.tmp.<pid>", flushed and fsync'ed, then
 * renamed over <path>; on any failure the temporary is removed and an existing <path> is left
 * untouched. A save that was killed (SIGKILL, or SIGXFSZ, below) cannot clean up: the next
 * save of the same <path> removes the "<path>.tmp.<pid>" files beside it whose process no
 * longer exists (never another checkpoint's, never a live process's). A failed write is
 * NA_EIO with a message naming the file and the cause: EFBIG (the file-size limit), ENOSPC
 * (disk full), EIO.
 *
 * File-size limits (ulimit -f, RLIMIT_FSIZE): by default the kernel kills a process that
 * writes past the limit with SIGXFSZ, silently, before the library can report anything. A
 * program that saves checkpoints should ignore that signal once at startup,
 *     signal(SIGXFSZ, SIG_IGN);   // <signal.h>: oversized writes then fail with EFBIG
 * so that na_checkpoint_save returns the error instead (the library never changes signal
 * dispositions itself).
 *
 * Loading validates the file as safetensors does and reports what is wrong with the file
 * name, the tensor and the offending values.
 *
 *     na_checkpoint *ck = na_checkpoint_new();
 *     na_checkpoint_add(ck, "fc.weight", w);          // any device; w must live until save
 *     na_checkpoint_set_meta(ck, "epoch", "3");
 *     if (na_checkpoint_save(ck, "model.safetensors")) fprintf(stderr, "%s\n", na_last_error());
 *     na_checkpoint_free(ck);
 *
 *     na_checkpoint *in = na_checkpoint_load("model.safetensors");
 *     if (!in || na_checkpoint_copy_into(in, "fc.weight", w)) fprintf(stderr, "%s\n",
 *                                                                    na_last_error());
 *     const char *epoch = na_checkpoint_get_meta(in, "epoch");   // NULL when absent
 *     na_checkpoint_free(in);
 *
 * A stateful object's state (a module's, an optimizer's, a scaler's: nanoamp/state.h) is a
 * named list; checkpoints know nothing else: na_checkpoint_add_list / na_checkpoint_copy_list,
 * or na_checkpoint_save_list / na_checkpoint_load_list with a file.
 */
#ifndef NANOAMP_IO_H
#define NANOAMP_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nanoamp/dtype.h"
#include "nanoamp/state.h"
#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NA_SAFETENSORS_MAX_HEADER 100000000 /* bytes of JSON, as safetensors */
#define NA_CHECKPOINT_MAX_DIMS 64           /* rank limit of a tensor in a loaded file */

typedef struct na_checkpoint na_checkpoint;

/* One tensor of a checkpoint, in host memory owned by the checkpoint. */
typedef struct {
    const char *name;
    na_dtype dtype;         /* NA_DTYPE_COUNT for an I64 tensor (no nanoamp dtype) */
    const char *file_dtype; /* the dtype as the file names it: "F32", "I64", ... */
    int ndim;               /* 0 for a scalar */
    const int64_t *shape;   /* ndim values */
    int64_t numel;          /* product of shape (1 for a scalar, 0 for an empty tensor) */
    const void *data;       /* numel elements of file_dtype, little-endian, C order, aligned */
    size_t nbytes;
} na_checkpoint_entry;

/* ---- writing ------------------------------------------------------------------------ */
na_checkpoint *na_checkpoint_new(void);
void na_checkpoint_free(na_checkpoint *ck); /* NULL is fine */

/* Adds tensor t under `name` (the name is copied). The tensor itself is referenced, not
 * copied: it must stay valid until na_checkpoint_save, which reads it (any device, any layout;
 * views are written in C order). Fails on a duplicate name, "__metadata__", or a name that is
 * not valid UTF-8. Not allowed on a checkpoint read from a file. */
int na_checkpoint_add(na_checkpoint *ck, const char *name, const na_tensor *t);
/* The same for host memory holding numel elements of dtype (referenced, like a tensor). */
int na_checkpoint_add_host(na_checkpoint *ck, const char *name, na_dtype dtype, int ndim,
                           const int64_t *shape, const void *data);
/* Sets (or replaces) a metadata string; key and value are copied. */
int na_checkpoint_set_meta(na_checkpoint *ck, const char *key, const char *value);
/* Writes every tensor and the metadata to path, atomically (see above). */
int na_checkpoint_save(const na_checkpoint *ck, const char *path);

/* ---- reading ------------------------------------------------------------------------ */
/* Reads and validates a whole file; NULL with a message on any problem. */
na_checkpoint *na_checkpoint_load(const char *path);

int64_t na_checkpoint_count(const na_checkpoint *ck);
/* Entry i (0 <= i < count) in file order (data offset) for a loaded checkpoint, in the order
 * added for one being written (data NULL for a device tensor). */
int na_checkpoint_entry_at(const na_checkpoint *ck, int64_t i, na_checkpoint_entry *out);
/* The entry named `name`; NA_EINVAL with "no tensor 'x' in checkpoint 'file'" if absent. */
int na_checkpoint_get(const na_checkpoint *ck, const char *name, na_checkpoint_entry *out);
bool na_checkpoint_has(const na_checkpoint *ck, const char *name);
/* Copies tensor `name` into dst (any device, contiguous). dtype and shape must match
 * exactly, else NA_EDTYPE / NA_ESHAPE: "checkpoint tensor 'fc.weight' has shape [10, 128]
 * but the model's is [10, 64]". An I64 tensor goes into a dst of any dtype when every value
 * is exactly representable there, else NA_EDTYPE naming the tensor, the value and the
 * element. */
int na_checkpoint_copy_into(const na_checkpoint *ck, const char *name, na_tensor *dst);

/* Whether every value of tensor `name` is finite: NA_OK (integer tensors always are), or
 * NA_EINVAL naming the file, the tensor and its first inf or NaN, "checkpoint 'ck.safetensors':
 * tensor 'fc.weight' holds nan at element 1234 (of 200704)". Loading never checks values (as
 * PyTorch's load_state_dict takes NaN weights): a program that must not resume from a
 * diverged state asks for each tensor that must be finite (the trainers' --resume does). */
int na_checkpoint_check_finite(const na_checkpoint *ck, const char *name);

/* The metadata value for key, or NULL. */
const char *na_checkpoint_get_meta(const na_checkpoint *ck, const char *key);
int64_t na_checkpoint_meta_count(const na_checkpoint *ck);
/* Metadata pair i (sorted by key for a loaded file, insertion order otherwise). */
int na_checkpoint_meta_at(const na_checkpoint *ck, int64_t i, const char **key,
                          const char **value);

/* The dtype string of the format ("F32", "BF16", ...) and its inverse (false if unknown). */
const char *na_safetensors_dtype_name(na_dtype dt);
bool na_safetensors_dtype_parse(const char *s, na_dtype *out);

/* ---- state lists (nanoamp/state.h) ------------------------------------------------ */
/* Adds every item of l (na_checkpoint_add for each: the tensors must live until the save). */
int na_checkpoint_add_list(na_checkpoint *ck, const na_named_tensors *l);
/* Copies each named tensor of ck into its item of l (na_checkpoint_copy_into for each; a
 * missing name fails). strict: ck must hold no other tensor. All or nothing: every item is
 * checked (name, dtype, shape, I64 values, strict) before the first is written, so a failing
 * call leaves every tensor of l as it was (short of a device failing mid-copy). */
int na_checkpoint_copy_list(const na_checkpoint *ck, const na_named_tensors *l, bool strict);
/* The same with a file: save exactly l's tensors to path; load path into l's tensors. */
int na_checkpoint_save_list(const char *path, const na_named_tensors *l);
int na_checkpoint_load_list(const char *path, const na_named_tensors *l, bool strict);

#ifdef __cplusplus
}
#endif
#endif
