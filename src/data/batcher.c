/* na_batcher: seeded shuffling, normalization, crop/flip augmentation, optional prefetch.
 *
 * Determinism: batch `step` of `epoch` is a pure function of (dataset, cfg, epoch, step).
 *  - order: the epoch's permutation (Fisher-Yates driven by splitmix64 seeded from seed and
 *    epoch), or the identity without shuffle;
 *  - augmentation of a sample: crop offsets and flip drawn from splitmix64 seeded from
 *    (seed, epoch, dataset index), so they do not depend on the batch size or on which thread
 *    prepares the batch.
 * Sharding (world_size > 1): position p of this rank's shard is position p * world_size +
 * rank of the epoch's order, taken modulo n (the padding wraps around to the start), so the
 * augmentation, seeded by dataset index, is the same whichever rank reads a sample.
 * Normalization goes through a per-channel table of the 256 possible values, computed in
 * double and rounded once to f32.
 *
 * Prefetch: one worker thread and one internal batch buffer. After each na_batcher_next
 * copies the ready batch out, the worker starts preparing the next one while the caller
 * trains on the current one (the caller's buffer is the second buffer). The worker runs the
 * very same produce() as the synchronous path, so the output is identical. */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/data.h"
#include "nanoamp/error.h"
#include "splitmix.h"

#define MAX_CROP_PAD 4096

struct na_batcher {
    const na_dataset *ds;
    na_batcher_cfg cfg; /* mean/std pointers cleared: the tables below replace them */
    float *lut;         /* [channels][256]: (p/255 - mean[c]) / std[c] */
    int64_t *perm;      /* [n] dataset index at each position of the current epoch */
    int64_t epoch;
    int64_t pos;        /* position (in samples) of the next batch */
    int64_t limit;      /* positions [0, limit) of the shard are served this epoch */
    int64_t shard_n;    /* positions in this rank's shard (ds->n for one rank) */
    int world, rank;
    int64_t sample_floats;

    /* prefetch */
    bool threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* worker waits for a job */
    pthread_cond_t cv_done; /* caller waits for a result */
    bool stop, job_pending, busy, ready;
    int64_t job_pos, ready_pos, ready_count;
    float *pf_images;
    int32_t *pf_labels;
};

void na_shuffle_permutation(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    uint64_t s = na_splitmix64_mix(seed ^ na_splitmix64_mix((uint64_t)epoch + 0x51ED5EED0001ull));
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)na_splitmix64_below(&s, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* The dataset index at position pos of this rank's shard. */
static int64_t shard_index(const na_batcher *b, int64_t pos) {
    return b->perm[(pos * b->world + b->rank) % b->ds->n];
}

/* Writes the batch at position pos; returns the number of samples. Reads only immutable
 * state (ds, cfg, lut, perm, epoch), so it may run on the worker thread. */
static int64_t produce(const na_batcher *b, int64_t pos, float *images, int32_t *labels) {
    const na_dataset *ds = b->ds;
    const int C = ds->channels, H = ds->height, W = ds->width, pad = b->cfg.crop_pad;
    int64_t count = b->limit - pos < b->cfg.batch_size ? b->limit - pos : b->cfg.batch_size;
    for (int64_t k = 0; k < count; k++) {
        int64_t idx = shard_index(b, pos + k);
        const uint8_t *src = ds->images + idx * b->sample_floats;
        float *dst = images + k * b->sample_floats;
        labels[k] = ds->labels[idx];
        int oy = pad, ox = pad; /* window offset in the padded image; pad = no shift */
        bool flip = false;
        if (pad > 0 || b->cfg.hflip) {
            uint64_t s = na_splitmix64_mix(b->cfg.seed ^ 0xA11CE5EEDull) ^
                         na_splitmix64_mix((uint64_t)b->epoch * 0x9E3779B97F4A7C15ull + 1) ^
                         na_splitmix64_mix((uint64_t)idx + 0xC0FFEEull);
            if (pad > 0) {
                oy = (int)na_splitmix64_below(&s, (uint64_t)(2 * pad + 1));
                ox = (int)na_splitmix64_below(&s, (uint64_t)(2 * pad + 1));
            }
            if (b->cfg.hflip) flip = (na_splitmix64_next(&s) >> 63) != 0;
        }
        for (int c = 0; c < C; c++) {
            const float *lut = b->lut + c * 256;
            const uint8_t *sc = src + (int64_t)c * H * W;
            float *dc = dst + (int64_t)c * H * W;
            for (int y = 0; y < H; y++) {
                int sy = y + oy - pad;
                float *drow = dc + (int64_t)y * W;
                if (sy < 0 || sy >= H) {
                    for (int x = 0; x < W; x++) drow[x] = lut[0];
                    continue;
                }
                const uint8_t *srow = sc + (int64_t)sy * W;
                for (int x = 0; x < W; x++) {
                    /* out = crop[y][flip ? W-1-x : x], crop[y][x'] = padded[y+oy][x'+ox] */
                    int sx = (flip ? W - 1 - x : x) + ox - pad;
                    drow[x] = (sx < 0 || sx >= W) ? lut[0] : lut[srow[sx]];
                }
            }
        }
    }
    return count;
}

static void *worker(void *arg) {
    na_batcher *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stop && !b->job_pending) pthread_cond_wait(&b->cv_work, &b->mu);
        if (b->stop) break;
        b->job_pending = false;
        b->busy = true;
        int64_t pos = b->job_pos;
        pthread_mutex_unlock(&b->mu);
        int64_t count = produce(b, pos, b->pf_images, b->pf_labels);
        pthread_mutex_lock(&b->mu);
        b->busy = false;
        b->ready = true;
        b->ready_pos = pos;
        b->ready_count = count;
        pthread_cond_signal(&b->cv_done);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Caller holds mu. */
static void request(na_batcher *b, int64_t pos) {
    b->ready = false;
    b->job_pos = pos;
    b->job_pending = true;
    pthread_cond_signal(&b->cv_work);
}

/* Waits until the worker is idle and drops any pending or finished batch. */
static void quiesce(na_batcher *b) {
    if (!b->threaded) return;
    pthread_mutex_lock(&b->mu);
    b->job_pending = false;
    while (b->busy) pthread_cond_wait(&b->cv_done, &b->mu);
    b->ready = false;
    pthread_mutex_unlock(&b->mu);
}

int64_t na_batcher_steps_per_epoch(const na_batcher *b) {
    int64_t n = b->shard_n, B = b->cfg.batch_size;
    return b->cfg.drop_last ? n / B : (n + B - 1) / B;
}

na_batcher *na_batcher_new(const na_dataset *ds, const na_batcher_cfg *cfg) {
    const char *fn = "na_batcher_new";
    if (!ds || !cfg) {
        na_set_error(NA_EINVAL, "%s: %s is NULL", fn, ds ? "cfg" : "ds");
        return NULL;
    }
    if (ds->n <= 0 || ds->channels <= 0 || ds->height <= 0 || ds->width <= 0 || !ds->images ||
        !ds->labels) {
        na_set_error(NA_EINVAL, "%s: empty or invalid dataset (n=%lld, %dx%dx%d)", fn,
                     (long long)ds->n, ds->channels, ds->height, ds->width);
        return NULL;
    }
    if (cfg->batch_size <= 0 || cfg->batch_size > ((int64_t)1 << 31)) {
        na_set_error(NA_EINVAL, "%s: batch_size is %lld, expected 1..2^31", fn,
                     (long long)cfg->batch_size);
        return NULL;
    }
    int64_t batch_floats;
    if (__builtin_mul_overflow(cfg->batch_size, (int64_t)ds->channels * ds->height * ds->width,
                               &batch_floats) ||
        batch_floats > ((int64_t)1 << 36)) {
        na_set_error(NA_EINVAL, "%s: a batch of %lld images of %dx%dx%d is too large", fn,
                     (long long)cfg->batch_size, ds->channels, ds->height, ds->width);
        return NULL;
    }
    int world = cfg->world_size ? cfg->world_size : 1;
    if (world < 1 || cfg->rank < 0 || cfg->rank >= world) {
        na_set_error(NA_EINVAL, "%s: rank %d of world_size %d: expected 0 <= rank < world_size",
                     fn, cfg->rank, cfg->world_size);
        return NULL;
    }
    /* padded: ceil(n / world) for every rank; unpadded: positions rank, rank + world, ... < n */
    int64_t shard_n = cfg->shard_no_pad ? (ds->n - cfg->rank + world - 1) / world
                                        : (ds->n + world - 1) / world;
    if (cfg->drop_last && cfg->batch_size > shard_n) {
        na_set_error(NA_EINVAL,
                     "%s: drop_last with batch_size %lld > %lld samples (of rank %d) leaves no "
                     "batch", fn, (long long)cfg->batch_size, (long long)shard_n, cfg->rank);
        return NULL;
    }
    if (cfg->crop_pad < 0 || cfg->crop_pad > MAX_CROP_PAD) {
        na_set_error(NA_EINVAL, "%s: crop_pad is %d, expected 0..%d", fn, cfg->crop_pad,
                     MAX_CROP_PAD);
        return NULL;
    }
    for (int c = 0; cfg->std && c < ds->channels; c++) {
        if (!(fabsf(cfg->std[c]) > 0) || !isfinite(cfg->std[c])) {
            na_set_error(NA_EINVAL, "%s: std[%d] is %g, expected a finite non-zero value", fn, c,
                         (double)cfg->std[c]);
            return NULL;
        }
    }
    for (int c = 0; cfg->mean && c < ds->channels; c++) {
        if (!isfinite(cfg->mean[c])) {
            na_set_error(NA_EINVAL, "%s: mean[%d] is %g, expected a finite value", fn, c,
                         (double)cfg->mean[c]);
            return NULL;
        }
    }
    na_batcher *b = calloc(1, sizeof *b);
    if (!b) goto oom;
    b->ds = ds;
    b->cfg = *cfg;
    b->cfg.mean = b->cfg.std = NULL;
    b->sample_floats = (int64_t)ds->channels * ds->height * ds->width;
    b->shard_n = shard_n, b->world = world, b->rank = cfg->rank;
    b->lut = malloc((size_t)ds->channels * 256 * sizeof(float));
    b->perm = malloc((size_t)ds->n * sizeof(int64_t));
    if (!b->lut || !b->perm) goto oom;
    for (int c = 0; c < ds->channels; c++) {
        double m = cfg->mean ? cfg->mean[c] : 0.0, s = cfg->std ? cfg->std[c] : 1.0;
        for (int p = 0; p < 256; p++) b->lut[c * 256 + p] = (float)((p / 255.0 - m) / s);
    }
    if (cfg->prefetch) {
        b->pf_images = malloc((size_t)(cfg->batch_size * b->sample_floats) * sizeof(float));
        b->pf_labels = malloc((size_t)cfg->batch_size * sizeof(int32_t));
        if (!b->pf_images || !b->pf_labels) goto oom;
        if (pthread_mutex_init(&b->mu, NULL) == 0) {
            if (pthread_cond_init(&b->cv_work, NULL) == 0) {
                if (pthread_cond_init(&b->cv_done, NULL) == 0) {
                    if (pthread_create(&b->thread, NULL, worker, b) == 0)
                        b->threaded = true;
                    else
                        pthread_cond_destroy(&b->cv_done);
                }
                if (!b->threaded) pthread_cond_destroy(&b->cv_work);
            }
            if (!b->threaded) pthread_mutex_destroy(&b->mu);
        }
        /* Without a thread the batcher silently works synchronously: same output. */
    }
    b->epoch = -1;
    na_batcher_start_epoch(b, 0);
    return b;
oom:
    na_batcher_free(b);
    na_set_error(NA_ENOMEM, "%s: out of memory", fn);
    return NULL;
}

void na_batcher_free(na_batcher *b) {
    if (!b) return;
    if (b->threaded) {
        pthread_mutex_lock(&b->mu);
        b->stop = true;
        pthread_cond_signal(&b->cv_work);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->thread, NULL);
        pthread_cond_destroy(&b->cv_work);
        pthread_cond_destroy(&b->cv_done);
        pthread_mutex_destroy(&b->mu);
    }
    free(b->pf_images);
    free(b->pf_labels);
    free(b->lut);
    free(b->perm);
    free(b);
}

int na_batcher_seek(na_batcher *b, int64_t epoch, int64_t step) {
    if (!b) return na_set_error(NA_EINVAL, "na_batcher_seek: batcher is NULL");
    int64_t steps = na_batcher_steps_per_epoch(b);
    if (epoch < 0 || step < 0 || step > steps)
        return na_set_error(NA_EINVAL,
                            "na_batcher_seek: epoch %lld, step %lld: expected epoch >= 0 and "
                            "step in 0..%lld",
                            (long long)epoch, (long long)step, (long long)steps);
    quiesce(b);
    if (epoch != b->epoch) {
        if (b->cfg.shuffle)
            na_shuffle_permutation(b->perm, b->ds->n, b->cfg.seed, epoch);
        else
            for (int64_t i = 0; i < b->ds->n; i++) b->perm[i] = i;
        b->epoch = epoch;
    }
    b->limit = b->cfg.drop_last ? steps * b->cfg.batch_size : b->shard_n;
    b->pos = step * b->cfg.batch_size;
    if (b->pos > b->limit) b->pos = b->limit;
    if (b->threaded && b->pos < b->limit) {
        pthread_mutex_lock(&b->mu);
        request(b, b->pos);
        pthread_mutex_unlock(&b->mu);
    }
    return NA_OK;
}

int na_batcher_start_epoch(na_batcher *b, int64_t epoch) { return na_batcher_seek(b, epoch, 0); }

bool na_batcher_next(na_batcher *b, float *images_out, int32_t *labels_out,
                     int64_t *batch_size_out) {
    if (batch_size_out) *batch_size_out = 0;
    if (!b || !images_out || !labels_out) {
        na_set_error(NA_EINVAL, "na_batcher_next: %s is NULL",
                     !b ? "batcher" : !images_out ? "images_out" : "labels_out");
        return false;
    }
    if (b->pos >= b->limit) return false;
    int64_t count;
    if (!b->threaded) {
        count = produce(b, b->pos, images_out, labels_out);
    } else {
        pthread_mutex_lock(&b->mu);
        if (!b->ready && !b->job_pending && !b->busy) request(b, b->pos);
        while (!b->ready) pthread_cond_wait(&b->cv_done, &b->mu);
        /* The worker is idle while a result is ready: the buffers are ours. */
        assert(b->ready_pos == b->pos);
        count = b->ready_count;
        memcpy(images_out, b->pf_images, (size_t)(count * b->sample_floats) * sizeof(float));
        memcpy(labels_out, b->pf_labels, (size_t)count * sizeof(int32_t));
        b->ready = false;
        if (b->pos + b->cfg.batch_size < b->limit) request(b, b->pos + b->cfg.batch_size);
        pthread_mutex_unlock(&b->mu);
    }
    b->pos += b->cfg.batch_size;
    if (b->pos > b->limit) b->pos = b->limit;
    if (batch_size_out) *batch_size_out = count;
    return true;
}

int64_t na_batcher_epoch(const na_batcher *b) { return b->epoch; }
int64_t na_batcher_step(const na_batcher *b) {
    return (b->pos + b->cfg.batch_size - 1) / b->cfg.batch_size;
}
size_t na_batcher_batch_bytes(const na_batcher *b) {
    return (size_t)(b->cfg.batch_size * b->sample_floats) * sizeof(float);
}
