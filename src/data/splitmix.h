/* src/data/splitmix.h — splitmix64, the small seeded generator behind shuffles and
 * augmentation (internal). Pure functions of their state: the same seed gives the same
 * stream on every platform. */
#ifndef NA_DATA_SPLITMIX_H
#define NA_DATA_SPLITMIX_H

#include <stdint.h>

/* The splitmix64 finalizer: a bijective 64-bit hash. */
static inline uint64_t na_splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t na_splitmix64_next(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    return na_splitmix64_mix(*s);
}

/* Uniform in [0, bound) without modulo bias (rejection), bound > 0. */
static inline uint64_t na_splitmix64_below(uint64_t *s, uint64_t bound) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound; /* accept r < limit */
    for (;;) {
        uint64_t r = na_splitmix64_next(s);
        if (r < limit) return r % bound;
    }
}

#endif
