/* Bump allocators for everything one training step makes (see arena.h). */
#include "src/tensor/arena.h"

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
    size_t size, used;
} chunk;

typedef struct {
    chunk chunks[ARENA_MAX_CHUNKS];
    int n_chunks;
    size_t raw_allocs; /* how many times memory was asked of the allocator */
    size_t used_total;
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

static void *arena_alloc(arena *a, size_t bytes, const char *what) {
    bytes = round_up(bytes ? bytes : 1, ARENA_ALIGN);
    if (a->n_chunks > 0) {
        chunk *c = &a->chunks[a->n_chunks - 1];
        if (c->size - c->used >= bytes) {
            void *p = c->base + c->used;
            c->used += bytes;
            a->used_total += bytes;
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
    size_t last = a->n_chunks ? a->chunks[a->n_chunks - 1].size : 0;
    size_t size = bytes;
    if (size < 2 * last) size = 2 * last;
    if (size < ARENA_MIN_CHUNK) size = ARENA_MIN_CHUNK;
    char *base = ra.alloc(size);
    if (!base) {
        na_set_error(NA_ENOMEM, "step arena (%s): could not grow by %zu bytes (needed %zu, %zu "
                     "in use)", what, size, bytes, a->used_total);
        return NULL;
    }
    a->raw_allocs++;
    a->chunks[a->n_chunks++] = (chunk){base, size, bytes};
    a->used_total += bytes;
    return base;
}

/* Keep the memory; if the step spilled over several chunks, merge them into one. */
static void arena_reset(arena *a) {
    if (a->n_chunks > 1) {
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
    return arena_alloc(&data_arenas[dev], bytes, na_device_name(dev));
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
size_t na_arena_chunk_allocs(na_device dev) {
    return (unsigned)dev < NA_DEVICE_COUNT ? data_arenas[dev].raw_allocs : 0;
}
