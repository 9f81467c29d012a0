/* nanoamp/data.h — datasets (MNIST-style IDX, CIFAR-10 binary, synthetic) and batching.
 *
 * A dataset is raw bytes in host memory: n images of channels x height x width u8 pixels (C
 * order, CHW) and n i32 labels. Readers treat files as hostile: magic, dims, counts and sizes
 * are checked before anything is allocated, nothing is read past what the file holds, and a
 * failure returns NULL with a message (na_last_error) naming the file, what was expected and
 * what was found (and the byte offset where it matters).
 *
 * A batcher turns a dataset into host f32 batches [B, C, H, W] (pixel/255, then per-channel
 * (x - mean) / std), with a seeded shuffle per epoch and, for CIFAR, random crop with zero
 * padding and horizontal flip. Everything is a pure function of (seed, epoch, step): the same
 * configuration gives the same batches on every run, with or without the prefetch thread, and
 * na_batcher_seek resumes in the middle of an epoch.
 *
 *     na_dataset *ds = na_cifar10_load("data/cifar", true);
 *     if (!ds) { fprintf(stderr, "%s\n", na_last_error()); return 1; }
 *     static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.247f, 0.243f, 0.261f};
 *     na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){ .batch_size = 128, .seed = 1,
 *         .shuffle = true, .mean = mean, .std = std, .crop_pad = 4, .hflip = true,
 *         .prefetch = true });
 *     float *x = malloc(na_batcher_batch_bytes(b));   // B*C*H*W floats
 *     int32_t y[128]; int64_t n;
 *     for (int64_t epoch = 0; epoch < 10; epoch++) {
 *         na_batcher_start_epoch(b, epoch);
 *         while (na_batcher_next(b, x, y, &n)) { ... upload, train on n samples ... }
 *     }
 *     na_batcher_free(b); na_dataset_free(ds); free(x);
 */
#ifndef NANOAMP_DATA_H
#define NANOAMP_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets ----------------------------------------------------------------------- */
typedef struct na_dataset {
    int64_t n;                   /* number of samples */
    int channels, height, width; /* 1x28x28 for MNIST, 3x32x32 for CIFAR-10 */
    int num_classes;             /* labels are in [0, num_classes) */
    uint8_t *images;             /* (n, channels, height, width), C order */
    int32_t *labels;             /* (n) */
} na_dataset;

/* A zero-filled dataset to fill by hand (tests, custom loaders). */
na_dataset *na_dataset_new(int64_t n, int channels, int height, int width, int num_classes);
void na_dataset_free(na_dataset *ds); /* NULL is fine */

/* IDX files (MNIST, Fashion-MNIST): images magic 0x00000803 with dims (N, rows, cols), labels
 * magic 0x00000801 with dim (N), big-endian, u8 data, labels 0..9. Each file may be plain or
 * gzip-compressed (detected by the gzip magic bytes, not the name). The file must hold exactly
 * the bytes its header announces: a short file and trailing bytes are both errors. A gzip file
 * must be complete: every member's CRC-32 and length trailer is checked, concatenated members
 * are read as one stream (as gzip -d does), and a missing trailer or any byte after the last
 * member that does not start another member is an error. The two headers are compared before
 * any data is read, and memory grows with the data actually present, never with what a
 * header announces. */
na_dataset *na_idx_load(const char *images_path, const char *labels_path);
/* Loads <dir>/train-images-idx3-ubyte + train-labels-idx1-ubyte (train) or t10k-images-idx3-
 * ubyte + t10k-labels-idx1-ubyte (test), each with or without a .gz suffix. */
na_dataset *na_mnist_load(const char *dir, bool train);

/* CIFAR-10 binary files: records of 1 label byte (0..9) + 3072 pixel bytes (3x32x32, CHW).
 * With exact_size each file must hold exactly 10000 records (30,730,000 bytes), as the
 * official files do; without it any positive multiple of 3073 bytes is accepted. */
#define NA_CIFAR_RECORD_BYTES 3073
#define NA_CIFAR_FILE_RECORDS 10000
na_dataset *na_cifar_load_files(const char *const *paths, int n_paths, bool exact_size);
/* <dir>/data_batch_1.bin .. data_batch_5.bin (train) or <dir>/test_batch.bin (test); also
 * looks in <dir>/cifar-10-batches-bin/, where the official tarball extracts to. */
na_dataset *na_cifar10_load(const char *dir, bool train);

/* n learnable 3x32x32 images in 10 classes: each class has its own colour and stripe pattern
 * (orientation, frequency) at a random phase, plus per-pixel noise; labels are uniform at
 * random. The same (n, seed) always gives the same bytes. */
na_dataset *na_dataset_synthetic_cifar(int64_t n, uint64_t seed);

/* ---- batching ------------------------------------------------------------------------ */
typedef struct {
    int64_t batch_size; /* > 0 */
    uint64_t seed;      /* shuffle and augmentation */
    bool shuffle;       /* a fresh permutation per epoch (Fisher-Yates driven by splitmix64) */
    bool drop_last;     /* skip the final partial batch of an epoch */
    /* Per-channel normalization of x = pixel/255: (x - mean[c]) / std[c]. Arrays of
     * ds->channels values, copied by na_batcher_new; NULL means mean 0 / std 1. */
    const float *mean;
    const float *std;
    /* Random crop: the image is padded with crop_pad zero pixels on every side and a window
     * of the original size is cut at a random offset (0 = off). Padded pixels are zero
     * bytes, i.e. (0 - mean)/std after normalization, as torchvision's RandomCrop(padding). */
    int crop_pad;
    bool hflip;    /* random horizontal flip with probability 1/2 (after the crop) */
    bool prefetch; /* prepare the next batch on a background thread */
    /* Data-parallel sharding, PyTorch's DistributedSampler: rank r of world_size ranks reads
     * positions r, r + world_size, r + 2*world_size, ... of the epoch's order (the same seeded
     * permutation on every rank), so the shards are disjoint and batch k of all ranks together
     * is batch k of one rank with world_size times the batch size. The order is padded by
     * wrapping around to its start up to a multiple of world_size (at most world_size - 1
     * samples seen twice per epoch), so every rank takes the same number of steps (a rank
     * that ran out would wait forever in the gradient all-reduce); drop_last then applies to
     * each rank's shard. 0/0 means one rank. */
    int world_size, rank;
    /* Evaluation: no padding (every sample exactly once over all ranks); shards then differ by
     * at most one sample and ranks may take different numbers of steps, so use it only where
     * no collective runs per step, and sum counts across ranks afterwards. */
    bool shard_no_pad;
} na_batcher_cfg;

typedef struct na_batcher na_batcher;

/* The batcher reads ds (which must outlive it). It starts at epoch 0, step 0. */
na_batcher *na_batcher_new(const na_dataset *ds, const na_batcher_cfg *cfg);
void na_batcher_free(na_batcher *b); /* NULL is fine; joins the prefetch thread */

/* Rewinds to step 0 of `epoch` (>= 0) with that epoch's permutation. */
int na_batcher_start_epoch(na_batcher *b, int64_t epoch);
/* Positions the batcher so that the next na_batcher_next returns batch `step` of `epoch`:
 * the very batch an uninterrupted run would produce there (for resuming from a checkpoint).
 * step may equal na_batcher_steps_per_epoch (the epoch is then finished). */
int na_batcher_seek(na_batcher *b, int64_t epoch, int64_t step);

/* Writes the next batch: images_out holds batch_size*C*H*W floats ([B, C, H, W]),
 * labels_out batch_size labels; *batch_size_out gets the number of samples written (less
 * than batch_size only for the final batch of an epoch without drop_last). Returns false at
 * the end of the epoch (nothing written; call na_batcher_start_epoch for the next one). */
bool na_batcher_next(na_batcher *b, float *images_out, int32_t *labels_out,
                     int64_t *batch_size_out);

int64_t na_batcher_steps_per_epoch(const na_batcher *b); /* this rank's */
int64_t na_batcher_epoch(const na_batcher *b);
int64_t na_batcher_step(const na_batcher *b);  /* the batch the next call returns */
size_t na_batcher_batch_bytes(const na_batcher *b); /* bytes of one full images_out buffer */

/* The permutation of epoch `epoch` for n samples and `seed` (the batcher's order when
 * shuffle is on): perm[i] is the dataset index at position i. */
void na_shuffle_permutation(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch);

#ifdef __cplusplus
}
#endif
#endif
