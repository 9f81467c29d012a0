/* What the trainers do differently under mpirun (see trainer_internal.h): each rank's view of
 * the options, the check at start that all ranks run the same training, and agreeing on
 * failures so that no rank waits forever in a collective that another one left. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_internal.h"

trainer_opts trainer_rank_opts(const trainer_opts *o, na_dist *d, char *program, size_t size) {
    trainer_opts r = *o;
    int rank = na_dist_rank(d);
    if (na_dist_world_size(d) == 1 || rank == 0) return r;
    /* rank 0 alone prints, logs, writes the report and the checkpoint; the others only say
     * what failed */
    snprintf(program, size, "%s (rank %d)", o->program, rank);
    r.program = program;
    r.quiet = true, r.json = false, r.amp_trace = false;
    r.log_path = NULL, r.save_path = NULL, r.report_path = NULL;
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

bool trainer_ranks_all_ok(na_dist *d, const trainer_opts *o, int status, const char *option,
                          const char *value) {
    if (status)
        fprintf(stderr, "%s: %s%s%s%s%s\n", o->program, option ? option : "",
                option && value ? " " : "", value ? value : "", option ? ": " : "",
                na_last_error());
    return trainer_ranks_ok(d, o, status == NA_OK);
}

/* ---- the same training on every rank --------------------------------------------------- */

/* hashes of one flag's value (na_dist_hash: FNV-1a) */
static uint64_t hash_str(const char *s) {
    return s ? na_dist_hash(NA_DIST_HASH_START, s, strlen(s) + 1) : 0;
}
static uint64_t hash_f64(double v) { return na_dist_hash(NA_DIST_HASH_START, &v, sizeof v); }
static uint64_t hash_i64(int64_t v) { return na_dist_hash(NA_DIST_HASH_START, &v, sizeof v); }

/* ---- failures before training ---------------------------------------------------------- */

/* The first collective of a run: every rank says whether it got to trainer_run (error NULL)
 * or failed before it (error: its message, without the program name). A failure that every
 * rank shares (a typo in the flags, data missing everywhere) is printed once, by rank 0; one
 * that is a rank's own is printed by that rank after "(rank r)", and rank 0, if it was fine,
 * names the ranks that stop the run. Whether every rank got there. */
static bool ranks_started(na_dist *d, const char *program, const char *error) {
    int world = na_dist_world_size(d), rank = na_dist_rank(d);
    if (world == 1) {
        if (error) fprintf(stderr, "%s: %s\n", program, error);
        return !error;
    }
    /* an all-gather of each rank's (hash of its) message, 0 for none, as a sum */
    int64_t *said = calloc((size_t)world, sizeof *said);
    if (said) said[rank] = error ? (int64_t)(hash_str(error) >> 2) | 1 : 0;
    if (!said || na_dist_all_reduce_i64(d, said, world, NA_DIST_SUM)) {
        if (error) fprintf(stderr, "%s (rank %d): %s\n", program, rank, error);
        fprintf(stderr, "%s (rank %d): %s\n", program, rank,
                said ? na_last_error() : "out of memory");
        free(said);
        return false;
    }
    int failed = 0;
    bool shared = true;
    char who[256] = "";
    for (int r = 0; r < world; r++) {
        shared = shared && said[r] == said[0];
        if (!said[r]) continue;
        size_t len = strlen(who);
        if (failed++ < 8) snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", r);
        else if (failed == 9) snprintf(who + len, sizeof who - len, ", ...");
    }
    free(said);
    if (error && shared) {
        if (!rank) fprintf(stderr, "%s: %s\n", program, error);
    } else if (error) {
        fprintf(stderr, "%s (rank %d): %s\n", program, rank, error);
    } else if (failed && !rank) {
        fprintf(stderr, "%s: stopping: rank%s %s failed before training (%s why)\n", program,
                failed > 1 ? "s" : "", who, failed > 1 ? "their messages say" : "its message says");
    }
    return !failed;
}

bool trainer_ranks_started(na_dist *d, const trainer_opts *o) {
    return ranks_started(d, o->program, NULL);
}

void trainer_start_failed(const trainer_opts *o, const char *fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* alone (no launcher): no MPI at all, not even to start it */
    const char *launched = getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE")
                                                           : getenv("WORLD_SIZE");
    na_dist *d = launched && strcmp(launched, "1") ? na_dist_init() : NULL;
    if (launched && strcmp(launched, "1") && !d) /* cannot agree: say both */
        fprintf(stderr, "%s: %s\n", o->program, na_last_error());
    ranks_started(d, o->program, msg);
    na_dist_free(d);
}

/* The model: every parameter's and buffer's name, dtype and shape. */
static uint64_t hash_model(na_module *net) {
    na_named_tensors state = {0};
    if (na_module_state(net, "", &state) != NA_OK) return 0; /* never equal to a real hash */
    uint64_t h = na_dist_hash_state(NA_DIST_HASH_START, &state);
    na_named_tensors_free(&state);
    return h;
}

/* h extended by n bytes, 8 at a time (~20 ms for Fashion-MNIST's training images). */
static uint64_t hash_bytes(uint64_t h, const uint8_t *p, size_t n) {
    if (!n) return h; /* an empty tensor's data may be NULL */
    uint64_t w = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    return na_dist_hash(h, p + n / 8 * 8, n % 8);
}

/* A data set: its shape and all its labels and pixels. */
static uint64_t hash_data(const na_dataset *ds) {
    int64_t head[5] = {ds->n, ds->channels, ds->height, ds->width, ds->num_classes};
    uint64_t h = na_dist_hash(NA_DIST_HASH_START, head, sizeof head);
    h = na_dist_hash(h, ds->labels, (size_t)ds->n * sizeof *ds->labels);
    size_t bytes = (size_t)ds->n * (size_t)ds->channels * (size_t)ds->height * (size_t)ds->width;
    return hash_bytes(h, ds->images, bytes);
}

/* A --resume checkpoint as read: every tensor's name, dtype, shape and bytes, and the
 * metadata (0 without one): ranks that read different files disagree on it. */
static uint64_t hash_checkpoint(const na_checkpoint *ck) {
    if (!ck) return 0;
    uint64_t h = NA_DIST_HASH_START;
    na_checkpoint_entry e;
    for (int64_t i = 0; i < na_checkpoint_count(ck) && !na_checkpoint_entry_at(ck, i, &e); i++) {
        h = na_dist_hash(h, e.name, strlen(e.name) + 1);
        h = na_dist_hash(h, e.file_dtype, strlen(e.file_dtype) + 1);
        h = na_dist_hash(h, e.shape, (size_t)e.ndim * sizeof *e.shape);
        h = hash_bytes(h, e.data, e.nbytes);
    }
    const char *key, *value;
    for (int64_t i = 0; !na_checkpoint_meta_at(ck, i, &key, &value); i++)
        h = na_dist_hash(na_dist_hash(h, key, strlen(key) + 1), value, strlen(value) + 1);
    return h;
}

int trainer_check_ranks_agree(na_dist *d, const trainer_opts *o, const trainer_job *job,
                              const na_checkpoint *resumed) {
    if (na_dist_world_size(d) == 1) return 0;
    /* what changes the math or the collectives (--save, --log, --json, --quiet do not); the
     * checkpoint first: the flags it fills in differ when the files do */
    const struct {
        const char *what;
        uint64_t hash;
    } items[] = {
        {"--resume (given or not)", hash_i64(o->resume_path != NULL)},
        {"--resume checkpoint (its tensors and metadata)", hash_checkpoint(resumed)},
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
    };
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        if (na_dist_check_same(d, items[i].hash, items[i].what) != NA_OK) {
            fprintf(stderr, "%s: %s\n", o->program, na_last_error());
            return -1;
        }
    return 0;
}
