/* What the trainers do differently under mpirun (see trainer_internal.h): each rank's view of
 * the options, the check at start that all ranks run the same training, and agreeing on
 * failures so that no rank waits forever in a collective that another one left. */
#include <stdio.h>
#include <string.h>

#include "trainer_internal.h"

trainer_opts trainer_rank_opts(const trainer_opts *o, na_dist *d, char *program, size_t size) {
    trainer_opts r = *o;
    int rank = na_dist_rank(d);
    if (na_dist_world_size(d) == 1 || rank == 0) return r;
    /* rank 0 alone prints, logs and writes the checkpoint; the others only say what failed */
    snprintf(program, size, "%s (rank %d)", o->program, rank);
    r.program = program;
    r.quiet = true, r.json = false, r.amp_trace = false;
    r.log_path = NULL, r.save_path = NULL;
    return r;
}

bool trainer_ranks_ok(na_dist *d, const trainer_opts *o, bool ok) {
    if (na_dist_world_size(d) == 1) return ok;
    int64_t failed = !ok;
    if (na_dist_all_reduce_i64(d, &failed, 1, NA_DIST_MAX) != NA_OK) {
        fprintf(stderr, "%s: %s\n", o->program, na_last_error());
        return false;
    }
    if (failed && ok)
        fprintf(stderr, "%s: stopping: another rank failed (its message says why)\n", o->program);
    return !failed;
}

/* ---- the same training on every rank --------------------------------------------------- */

/* FNV-1a over bytes (hashes that only have to differ when the inputs do, on one machine or
 * several of the same byte order). */
#define HASH_START 0xcbf29ce484222325ull
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
static uint64_t hash_str(const char *s) { return s ? hash_bytes(HASH_START, s, strlen(s) + 1) : 0; }
static uint64_t hash_f64(double v) { return hash_bytes(HASH_START, &v, sizeof v); }
static uint64_t hash_i64(int64_t v) { return hash_bytes(HASH_START, &v, sizeof v); }

/* The model: every parameter's and buffer's name, dtype and shape. */
static uint64_t hash_model(na_module *net) {
    na_named_tensors state = {0};
    uint64_t h = HASH_START;
    if (na_module_state(net, "", &state) != NA_OK) return 0; /* never equal to a real hash */
    for (int64_t i = 0; i < state.n; i++) {
        const na_tensor *t = state.items[i].tensor;
        h = hash_bytes(h, state.items[i].name, strlen(state.items[i].name) + 1);
        h = hash_bytes(h, &t->dtype, sizeof t->dtype);
        h = hash_bytes(h, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
    }
    na_named_tensors_free(&state);
    return h;
}

/* A data set: its shape and all its labels and pixels, 8 bytes at a time (~20 ms for
 * Fashion-MNIST's training images). */
static uint64_t hash_data(const na_dataset *ds) {
    int64_t head[5] = {ds->n, ds->channels, ds->height, ds->width, ds->num_classes};
    uint64_t h = hash_bytes(HASH_START, head, sizeof head);
    h = hash_bytes(h, ds->labels, (size_t)ds->n * sizeof *ds->labels);
    size_t bytes = (size_t)ds->n * (size_t)ds->channels * (size_t)ds->height * (size_t)ds->width;
    uint64_t w = 0;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        memcpy(&w, ds->images + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    return hash_bytes(h, ds->images + bytes / 8 * 8, bytes % 8);
}

int trainer_check_ranks_agree(na_dist *d, const trainer_opts *o, const trainer_job *job) {
    if (na_dist_world_size(d) == 1) return 0;
    /* what changes the math or the collectives (--save, --log, --json, --quiet do not) */
    const struct {
        const char *what;
        uint64_t hash;
    } items[] = {
        {"--model", hash_str(o->model)},
        {"model (parameter and buffer names, dtypes, shapes)", hash_model(job->net)},
        {"training data (count, shape, labels, pixels)", hash_data(job->train)},
        {"test data (count, shape, labels, pixels)", hash_data(job->test)},
        {"--epochs", hash_i64(o->epochs)},
        {"--batch", hash_i64(o->batch)},
        {"--lr", hash_f64(o->lr)},
        {"--optim", hash_str(o->optim)},
        {"--weight-decay", hash_f64(o->weight_decay)},
        {"--label-smoothing", hash_f64(o->label_smoothing)},
        {"--schedule", hash_str(o->schedule)},
        {"--device", hash_i64(o->device)},
        {"--amp", hash_str(o->amp)},
        {"--loss-scale", hash_str(o->loss_scale)},
        {"--growth-interval", hash_i64(o->growth_interval)},
        {"--seed", hash_i64((int64_t)o->seed)},
        {"--allreduce-dtype", hash_str(o->allreduce_dtype)},
        {"--bucket-mb", hash_i64(o->bucket_mb)},
        {"--sync-bn", hash_i64(o->sync_bn)},
        {"--resume (given or not)", hash_i64(o->resume_path != NULL)},
    };
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        if (na_dist_check_same(d, items[i].hash, items[i].what) != NA_OK) {
            fprintf(stderr, "%s: %s\n", o->program, na_last_error());
            return -1;
        }
    return 0;
}
