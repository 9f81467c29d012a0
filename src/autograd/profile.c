/* The profiler (nanoamp/profile.h): per-op and per-layer time of a step.
 *
 * A mark is taken at the end of every op (the recorder) and every backward node (the
 * engine); the time between a mark and the one before it is that op's. Marks keep the host
 * clock and, for ops on a device with events (CUDA), an event on its stream; the intervals
 * are worked out at na_profile_end, between two events where both exist (device time), else
 * on the host clock. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "src/autograd/profile.h"
#include "src/tensor/arena.h"

#define MAX_DEPTH 32
#define OUTSIDE_OPS "(outside ops)"
#define NO_MODULE "(no module)"

typedef struct {
    int op, layer; /* row of ops, index into layers (0: no module) */
    double host_s;
    void *event; /* NULL: none (CPU, or the backend has no events) */
    const na_backend *be;
} mark;

typedef struct {
    na_profile_row *items;
    int n, cap;
} rows;

bool na_profile_on_;
static bool finished;
static double begin_s, wall_ms;
static mark *marks;
static size_t n_marks, cap_marks;
static rows ops, layers; /* layers.items[k].name: the interned label of layer k (0: none) */
static na_profile_row *sorted_ops, *sorted_layers;
static int n_sorted_ops, n_sorted_layers;
static char path[512];
static int depth, path_len[MAX_DEPTH], layer_of_depth[MAX_DEPTH], current_layer;
static bool out_of_memory; /* a record was lost: said by na_profile_print */

static clockid_t host_clock = CLOCK_MONOTONIC; /* NANOAMP_PROFILE_CLOCK=cpu: CPU time */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(host_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool grow(void **items, int *cap, int want, size_t size) {
    if (want <= *cap) return true;
    int c = *cap ? 2 * *cap : 32;
    void *p = realloc(*items, (size_t)c * size);
    if (!p) return false;
    *items = p;
    *cap = c;
    return true;
}

/* The row called `name` (added with zero counts if new), or -1 when out of memory. */
static int row_index(rows *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->items[i].name, name)) return i;
    char *copy = malloc(strlen(name) + 1);
    if (!copy || !grow((void **)&r->items, &r->cap, r->n + 1, sizeof *r->items)) {
        free(copy);
        out_of_memory = true;
        return -1;
    }
    r->items[r->n] = (na_profile_row){.name = strcpy(copy, name)};
    return r->n++;
}

static void rows_free(rows *r) {
    for (int i = 0; i < r->n; i++) free((char *)r->items[i].name);
    free(r->items);
    *r = (rows){0};
}

static void free_results(void) {
    rows_free(&ops);
    free(sorted_ops);
    free(sorted_layers);
    sorted_ops = sorted_layers = NULL;
    n_sorted_ops = n_sorted_layers = 0;
    finished = false;
}

void na_profile_reset(void) {
    for (size_t i = 0; i < n_marks; i++)
        if (marks[i].event) marks[i].be->event_free(marks[i].event);
    free(marks);
    marks = NULL;
    n_marks = cap_marks = 0;
    free_results();
    rows_free(&layers);
    na_profile_on_ = false;
    depth = current_layer = 0;
}

int na_profile_begin(void) {
    if (na_profile_on_)
        return na_set_error(NA_ESTATE, "na_profile_begin: a profile is already running");
    free_results();
    for (int i = 0; i < layers.n; i++) layers.items[i].calls = 0, layers.items[i].ms = 0;
    if (!layers.n && row_index(&layers, NO_MODULE) != 0)
        return na_set_error(NA_ENOMEM, "na_profile_begin: out of host memory");
    out_of_memory = false;
    depth = current_layer = 0;
    const char *clk = getenv("NANOAMP_PROFILE_CLOCK");
    host_clock = clk && !strcmp(clk, "cpu") ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
    na_profile_on_ = true;
    begin_s = now_s();
    return NA_OK;
}

bool na_profile_running(void) { return na_profile_on_; }

void na_profile_mark(const char *name, bool backward, na_device dev, int layer) {
    if (!na_profile_on_) return;
    char key[160];
    snprintf(key, sizeof key, backward ? "%s backward" : "%s", name);
    int op = row_index(&ops, key);
    if (op < 0 || n_marks == cap_marks) {
        size_t c = cap_marks ? 2 * cap_marks : 256;
        mark *p = op < 0 ? NULL : realloc(marks, c * sizeof *p);
        if (!p) {
            out_of_memory = true;
            return;
        }
        marks = p;
        cap_marks = c;
    }
    const na_backend *be = dev == NA_DEVICE_CPU ? NULL : na_backend_get(dev);
    void *event = be && be->event_record ? be->event_record() : NULL;
    marks[n_marks++] = (mark){op, layer >= 0 && layer < layers.n ? layer : 0, now_s(), event, be};
}

static int by_time(const void *a, const void *b) {
    const na_profile_row *x = a, *y = b;
    if (x->ms != y->ms) return x->ms < y->ms ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* A sorted copy of the rows that were called (NULL, 0 when none or out of memory). */
static na_profile_row *sorted(const rows *r, int *n) {
    na_profile_row *s = malloc((size_t)(r->n ? r->n : 1) * sizeof *s);
    *n = 0;
    for (int i = 0; s && i < r->n; i++)
        if (r->items[i].calls) s[(*n)++] = r->items[i];
    if (s) qsort(s, (size_t)*n, sizeof *s, by_time);
    return s;
}

int na_profile_end(void) {
    if (!na_profile_on_) return na_set_error(NA_ESTATE, "na_profile_end: no profile is running");
    na_profile_on_ = false;
    int rc = NA_OK;
    double prev_s = begin_s;
    void *prev_event = NULL;
    for (size_t i = 0; i < n_marks; i++) {
        mark *m = &marks[i];
        double ms = (m->host_s - prev_s) * 1e3;
        if (prev_event && m->event && marks[i - 1].be == m->be && rc == NA_OK)
            rc = m->be->event_elapsed_ms(prev_event, m->event, &ms);
        ops.items[m->op].calls++;
        ops.items[m->op].ms += ms;
        layers.items[m->layer].calls++;
        layers.items[m->layer].ms += ms;
        if (prev_event) marks[i - 1].be->event_free(prev_event);
        prev_s = m->host_s;
        prev_event = m->event;
    }
    if (prev_event) marks[n_marks - 1].be->event_free(prev_event);
    double end_s = now_s();
    int outside = row_index(&ops, OUTSIDE_OPS);
    if (outside >= 0) {
        ops.items[outside].calls++;
        ops.items[outside].ms += (end_s - prev_s) * 1e3;
    }
    wall_ms = (end_s - begin_s) * 1e3;
    n_marks = 0;
    sorted_ops = sorted(&ops, &n_sorted_ops);
    sorted_layers = sorted(&layers, &n_sorted_layers);
    finished = true;
    return rc;
}

int na_profile_ops(const na_profile_row **r) {
    *r = finished && n_sorted_ops ? sorted_ops : NULL;
    return finished ? n_sorted_ops : 0;
}
int na_profile_layers(const na_profile_row **r) {
    *r = finished && n_sorted_layers ? sorted_layers : NULL;
    return finished ? n_sorted_layers : 0;
}
const na_profile_row *na_profile_op(const char *name) {
    for (int i = 0; finished && name && i < n_sorted_ops; i++)
        if (!strcmp(sorted_ops[i].name, name)) return &sorted_ops[i];
    return NULL;
}
double na_profile_wall_ms(void) { return finished ? wall_ms : 0.0; }

static void print_rows(FILE *out, const char *title, const na_profile_row *r, int n) {
    fprintf(out, "  %-40s %7s %11s %7s\n", title, "calls", "total ms", "% step");
    for (int i = 0; i < n; i++)
        fprintf(out, "  %-40s %7lld %11.3f %7.1f\n", r[i].name, (long long)r[i].calls, r[i].ms,
                wall_ms > 0 ? 100.0 * r[i].ms / wall_ms : 0.0);
}

void na_profile_print(FILE *out) {
    if (!finished) {
        fprintf(out, "nanoamp profile: none recorded\n");
        return;
    }
    fprintf(out, "nanoamp profile: one step, %.3f ms wall%s\n", wall_ms,
            out_of_memory ? " (some ops were not recorded: out of host memory)" : "");
    print_rows(out, "op", sorted_ops, n_sorted_ops);
    print_rows(out, "layer", sorted_layers, n_sorted_layers);
}

/* ---- layers ----------------------------------------------------------------------------- */

int na_profile_layer(void) { return na_profile_on_ ? current_layer : 0; }

void na_profile_layer_push(const char *name, const char *type) {
    if (!na_profile_on_) return;
    int len = depth ? path_len[depth - 1] : 0;
    if (depth == MAX_DEPTH) { /* deeper than any real model: count it in its parent */
        depth++;
        return;
    }
    int n = snprintf(path + len, sizeof path - (size_t)len, "%s%s", len ? "." : "", name);
    int end = len + n < (int)sizeof path ? len + n : (int)sizeof path - 1;
    char label[sizeof path + 64];
    snprintf(label, sizeof label, "%s (%s)", path, type);
    path_len[depth] = end;
    layer_of_depth[depth] = current_layer;
    depth++;
    int k = row_index(&layers, label);
    current_layer = k > 0 ? k : 0;
    path[end] = '\0';
}

void na_profile_layer_pop(void) {
    if (!na_profile_on_ || depth == 0) return;
    depth--;
    if (depth >= MAX_DEPTH) return;
    current_layer = layer_of_depth[depth];
    path[depth ? path_len[depth - 1] : 0] = '\0';
}

/* ---- NANOAMP_PROFILE=1: the third step of the process, on stderr ------------------------ */

static int env_steps; /* steps ended since the library loaded */

static void env_step_end(void) {
    env_steps++;
    if (env_steps == 2) {
        na_profile_begin();
    } else if (env_steps == 3 && na_profile_on_) {
        na_profile_end();
        na_profile_print(stderr);
        na_profile_reset();
    }
}

__attribute__((constructor)) static void read_env(void) {
    const char *e = getenv("NANOAMP_PROFILE");
    if (e && *e && strcmp(e, "0")) na_arena_set_step_hook(env_step_end);
}
