/* Bump allocators for everything one training step makes (see arena.h). */
#include "src/tensor/arena.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "nanoamp/error.h"
#include "nanoamp/tensor.h"

#define ARENA_ALIGN 256
#define ARENA_MIN_CHUNK ((size_t)1 << 20)
#define ARENA_MAX_CHUNKS 64

typedef struct {
    char *base;
    size_t size, used; /* used: the bump pointer of the host arena */
} chunk;

/* A free range of a data arena's chunk; the list is sorted by address. */
typedef struct {
    char *p;
    size_t size;
    int chunk;
} range;

typedef struct {
    chunk chunks[ARENA_MAX_CHUNKS];
    int n_chunks;
    size_t raw_allocs; /* how many times memory was asked of the allocator */
    size_t used_total, peak;
    bool reuses;       /* a data arena: blocks can be freed and are reused (best fit) */
    range *free;       /* the free ranges of every chunk, by address */
    int n_free, cap_free;
} arena;

static arena host_arena;
static arena data_arenas[NA_DEVICE_COUNT];

static void *host_raw_alloc(size_t bytes) { return aligned_alloc(ARENA_ALIGN, bytes); }
static void host_raw_free(void *p) { free(p); }

typedef struct {
    void *(*alloc)(size_t);
    void (*free)(void *);
} raw_allocator;

static int get_allocator(arena *a, raw_allocator *out) {
    if (a == &host_arena) {
        *out = (raw_allocator){host_raw_alloc, host_raw_free};
        return NA_OK;
    }
    na_device dev = (na_device)(a - data_arenas);
    const na_backend *be = na_backend_get(dev);
    if (!be) return na_last_status();
    *out = (raw_allocator){be->alloc, be->free};
    return NA_OK;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void count_in(arena *a, size_t bytes) {
    a->used_total += bytes;
    if (a->used_total > a->peak) a->peak = a->used_total;
}

/* Inserts a free range at index i (the list has room). */
static void insert_range(arena *a, int i, range r) {
    memmove(&a->free[i + 1], &a->free[i], (size_t)(a->n_free - i) * sizeof *a->free);
    a->free[i] = r;
    a->n_free++;
}
static void remove_range(arena *a, int i) {
    a->n_free--;
    memmove(&a->free[i], &a->free[i + 1], (size_t)(a->n_free - i) * sizeof *a->free);
}
static bool reserve_ranges(arena *a, int n) {
    if (n <= a->cap_free) return true;
    int cap = a->cap_free ? 2 * a->cap_free : 64;
    while (cap < n) cap *= 2;
    range *f = realloc(a->free, (size_t)cap * sizeof *f);
    if (!f) return false;
    a->free = f;
    a->cap_free = cap;
    return true;
}

/* Best fit over the free ranges (the smallest that holds `bytes`, the lowest address on a
 * tie): deterministic, and it keeps big ranges whole for big tensors. */
static void *take_free(arena *a, size_t bytes) {
    int best = -1;
    for (int i = 0; i < a->n_free; i++)
        if (a->free[i].size >= bytes && (best < 0 || a->free[i].size < a->free[best].size))
            best = i;
    if (best < 0) return NULL;
    range *r = &a->free[best];
    void *p = r->p;
    r->p += bytes;
    r->size -= bytes;
    if (!r->size) remove_range(a, best);
    return p;
}

/* Back into the free list, merged with the ranges it touches in its chunk; false (the bytes
 * stay taken until the step ends) when the list cannot grow. */
static bool give_back(arena *a, char *p, size_t bytes, int chunk_index) {
    if (!reserve_ranges(a, a->n_free + 1)) return false;
    int i = 0;
    while (i < a->n_free && a->free[i].p < p) i++;
    range *prev = i > 0 ? &a->free[i - 1] : NULL, *next = i < a->n_free ? &a->free[i] : NULL;
    bool join_prev = prev && prev->chunk == chunk_index && prev->p + prev->size == p;
    bool join_next = next && next->chunk == chunk_index && p + bytes == next->p;
    if (join_prev && join_next) {
        prev->size += bytes + next->size;
        remove_range(a, i);
    } else if (join_prev) {
        prev->size += bytes;
    } else if (join_next) {
        next->p = p;
        next->size += bytes;
    } else {
        insert_range(a, i, (range){p, bytes, chunk_index});
    }
    return true;
}

static int by_address(const void *x, const void *y) {
    const range *a = x, *b = y;
    return a->p < b->p ? -1 : a->p > b->p;
}

static void *arena_alloc(arena *a, size_t bytes, const char *what) {
    bytes = round_up(bytes ? bytes : 1, ARENA_ALIGN);
    if (a->reuses) {
        void *p = take_free(a, bytes);
        if (p) {
            count_in(a, bytes);
            return p;
        }
    } else if (a->n_chunks > 0) {
        chunk *c = &a->chunks[a->n_chunks - 1];
        if (c->size - c->used >= bytes) {
            void *p = c->base + c->used;
            c->used += bytes;
            count_in(a, bytes);
            return p;
        }
    }
    if (a->n_chunks == ARENA_MAX_CHUNKS) {
        na_set_error(NA_ENOMEM, "step arena (%s): needed %zu more bytes but all %d chunks are in "
                     "use (%zu bytes); call na_step_end() once per step", what, bytes,
                     ARENA_MAX_CHUNKS, a->used_total);
        return NULL;
    }
    raw_allocator ra = {0};
    if (get_allocator(a, &ra) != NA_OK) return NULL;
    /* A data arena grows by a quarter of what it holds, so it ends near the step's
     * high-water mark; the host arena, never freed within a step, doubles. */
    size_t have = 0;
    for (int i = 0; i < a->n_chunks; i++) have += a->chunks[i].size;
    size_t last = a->n_chunks ? a->chunks[a->n_chunks - 1].size : 0;
    size_t size = a->reuses ? round_up(have / 4, ARENA_ALIGN) : 2 * last;
    if (size < bytes) size = bytes;
    if (size < ARENA_MIN_CHUNK) size = ARENA_MIN_CHUNK;
    char *base = ra.alloc(size);
    if (!base) {
        na_set_error(NA_ENOMEM, "step arena (%s): could not grow by %zu bytes (needed %zu, %zu "
                     "in use)", what, size, bytes, a->used_total);
        return NULL;
    }
    a->raw_allocs++;
    int k = a->n_chunks++;
    a->chunks[k] = (chunk){base, size, bytes};
    if (a->reuses && size > bytes) give_back(a, base + bytes, size - bytes, k);
    count_in(a, bytes);
    return base;
}

/* Keep the memory. The host arena, if the step spilled over several chunks, merges them into
 * one; a data arena keeps its chunks (grown by quarters, they are near the high-water mark,
 * where one merged buffer would hold their sum) and frees all of each. */
static void arena_reset(arena *a) {
    if (!a->reuses && a->n_chunks > 1) {
        raw_allocator ra = {0};
        if (get_allocator(a, &ra) == NA_OK) {
            size_t total = 0;
            for (int i = 0; i < a->n_chunks; i++) {
                total += a->chunks[i].size;
                ra.free(a->chunks[i].base);
            }
            a->n_chunks = 0;
            char *base = ra.alloc(total);
            if (base) {
                a->raw_allocs++;
                a->chunks[a->n_chunks++] = (chunk){base, total, 0};
            }
        }
    }
    for (int i = 0; i < a->n_chunks; i++) a->chunks[i].used = 0;
    a->used_total = 0;
    if (a->reuses) {
        a->n_free = 0;
        for (int i = 0; i < a->n_chunks; i++)
            if (reserve_ranges(a, a->n_free + 1))
                a->free[a->n_free++] = (range){a->chunks[i].base, a->chunks[i].size, i};
        qsort(a->free, (size_t)a->n_free, sizeof *a->free, by_address);
    }
}

void *na_arena_host_alloc(size_t bytes) {
    void *p = arena_alloc(&host_arena, bytes, "host");
    if (p) memset(p, 0, bytes);
    return p;
}

void *na_arena_data_alloc(na_device dev, size_t bytes) {
    if ((unsigned)dev >= NA_DEVICE_COUNT) {
        na_set_error(NA_EINVAL, "step arena: unknown device %d", (int)dev);
        return NULL;
    }
    arena *a = &data_arenas[dev];
    a->reuses = true;
    return arena_alloc(a, bytes, na_device_name(dev));
}

void na_arena_data_free(na_device dev, void *p, size_t bytes) {
    if (!p || (unsigned)dev >= NA_DEVICE_COUNT) return;
    arena *a = &data_arenas[dev];
    bytes = round_up(bytes ? bytes : 1, ARENA_ALIGN);
    for (int i = 0; i < a->n_chunks; i++) {
        chunk *c = &a->chunks[i];
        if ((char *)p >= c->base && (char *)p < c->base + c->size) {
            if (give_back(a, p, bytes, i)) a->used_total -= bytes;
            return;
        }
    }
}

na_arena_mark na_arena_host_mark(void) {
    const arena *a = &host_arena;
    return (na_arena_mark){a->n_chunks - 1, a->n_chunks ? a->chunks[a->n_chunks - 1].used : 0};
}

bool na_arena_host_newer(na_arena_mark m, const void *p) {
    const arena *a = &host_arena;
    for (int i = a->n_chunks - 1; i >= 0 && i >= m.chunk; i--) {
        const chunk *c = &a->chunks[i];
        if ((const char *)p >= c->base && (const char *)p < c->base + c->used)
            return i > m.chunk || (size_t)((const char *)p - c->base) >= m.used;
    }
    return false;
}

static unsigned long generation;
unsigned long na_arena_generation(void) { return generation; }

void na_arena_reset(void) {
    generation++;
    arena_reset(&host_arena);
    for (int d = 0; d < NA_DEVICE_COUNT; d++) arena_reset(&data_arenas[d]);
}

static size_t capacity(const arena *a) {
    size_t s = 0;
    for (int i = 0; i < a->n_chunks; i++) s += a->chunks[i].size;
    return s;
}

size_t na_arena_capacity(na_device dev) {
    return (unsigned)dev < NA_DEVICE_COUNT ? capacity(&data_arenas[dev]) : 0;
}
size_t na_arena_used(na_device dev) {
    return (unsigned)dev < NA_DEVICE_COUNT ? data_arenas[dev].used_total : 0;
}
size_t na_arena_peak(na_device dev) {
    return (unsigned)dev < NA_DEVICE_COUNT ? data_arenas[dev].peak : 0;
}
void na_arena_peak_reset(void) {
    for (int d = 0; d < NA_DEVICE_COUNT; d++) data_arenas[d].peak = data_arenas[d].used_total;
}
size_t na_arena_chunk_allocs(na_device dev) {
    return (unsigned)dev < NA_DEVICE_COUNT ? data_arenas[dev].raw_allocs : 0;
}
