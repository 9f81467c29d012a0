/* tests/test_welford.c — the BatchNorm statistics of kernels/common/welford.h on the CPU.
 *
 * The CUDA BatchNorm (NANOAMP_CUDA_BN=v2) computes a channel's mean and variance from
 * per-tile Welford partials combined in a fixed order; this suite runs that same algorithm on
 * the host (emulate_channel: the kernel's tiles, vector loads, per-thread folds, block trees
 * and the combining warp, through the functions the kernel calls) and checks it against a
 * two-pass reference in f64, on random inputs including channels whose mean dwarfs their
 * spread (where sum(x^2) - n*mean^2 in f32 loses every digit: the control below shows it).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/welford.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static double urand(void) { /* [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

/* x [N, C, S] with x = offset + spread * u, u uniform in [-1, 1) */
static float *random_nchw(int64_t n, int64_t c, int64_t s, double offset, double spread) {
    float *x = malloc((size_t)(n * c * s) * sizeof *x);
    cr_assert_not_null(x);
    for (int64_t i = 0; i < n * c * s; i++) x[i] = (float)(offset + spread * (2 * urand() - 1));
    return x;
}

/* The exact statistics of the f32 values (f64 two-pass: the values are exact in f64). */
static void reference(const float *x, int64_t n, int64_t c, int64_t s, int64_t ch, double *mean,
                      double *var) {
    double sum = 0, q = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < s; j++) sum += x[(i * c + ch) * s + j];
    *mean = sum / (double)(n * s);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < s; j++) {
            double d = x[(i * c + ch) * s + j] - *mean;
            q += d * d;
        }
    *var = q / (double)(n * s);
}

/* The CUDA kernels' algorithm for channel ch: vectors of v floats (4 when S allows, as the
 * kernel's 16-byte loads; 1 is its scalar path), `grid` blocks striding over the tiles, one
 * partial per tile, then the combining warp. */
static na_welford_f emulate_channel(const float *x, int64_t n, int64_t c, int64_t s, int64_t ch,
                                    int v, int64_t grid, int64_t *n_partials) {
    const int64_t sv = s / v, nvec = n * sv, tiles = na_bn_tiles(nvec);
    na_welford_f *parts = malloc((size_t)tiles * sizeof *parts);
    na_welford_f lanes[NA_BN_THREADS];
    cr_assert_not_null(parts);
    for (int64_t b = 0; b < grid; b++)
        for (int64_t t = b; t < tiles; t += grid) {
            for (int th = 0; th < NA_BN_THREADS; th++) {
                na_welford_f acc = na_welford_empty_f();
                for (int j = 0; j < NA_BN_VPT; j++) {
                    int64_t k = na_bn_tile_vec(t, j, th);
                    if (k >= nvec) continue;
                    int64_t row = k / sv, col = k - row * sv;
                    acc = na_welford_merge_f(acc, na_welford_of_f(x + (row * c + ch) * s + col * v, v));
                }
                lanes[th] = acc;
            }
            parts[t] = na_welford_block_f(lanes, NA_BN_THREADS);
        }
    na_welford_f r = na_welford_combine_f(parts, tiles);
    free(parts);
    *n_partials = tiles;
    return r;
}

static double rel(double got, double want) {
    return want != 0 ? fabs(got - want) / fabs(want) : fabs(got);
}

/* f32 accumulation of sum and sum of squares: the formula that cancels (the control). */
static double naive_var(const float *x, int64_t n, int64_t c, int64_t s, int64_t ch) {
    float sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < s; j++) {
            float v = x[(i * c + ch) * s + j];
            sum += v;
            sq += v * v;
        }
    float m = sum / (float)(n * s);
    return (double)(sq / (float)(n * s) - m * m);
}

typedef struct {
    int64_t n, c, s;
    double offset, spread;
} stats_case;

static const stats_case cases[] = {
    {1, 1, 1, 0, 1},          {3, 2, 7, 0.5, 1},       {512, 3, 16, 0, 1},
    {64, 2, 1024, -2, 3},     {128, 2, 64, 1e4, 1},    {33, 3, 100, 1e6, 0.5},
    {256, 1, 1024, 3e4, 0.1}, {2, 5, 4099, 1e3, 2},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

/* f32 Welford keeps the mean to ~1e-6 and the variance to 2e-6 relative plus the merges'
 * first-order term, delta * rounding(mean) / var, i.e. about ulp(|mean|) / spread; seen
 * (seeded inputs): at most 0.3 of that term, on the 1e6-mean case. */
static double var_bound(const stats_case *k) {
    return 2e-6 + (fabs(k->offset) + k->spread) * 0x1p-24 / k->spread;
}

Test(welford, blocked_fixed_order_matches_f64_two_pass) {
    for (int i = 0; i < N_CASES; i++) {
        const stats_case *k = &cases[i];
        float *x = random_nchw(k->n, k->c, k->s, k->offset, k->spread);
        for (int64_t ch = 0; ch < k->c; ch++) {
            double mean, var;
            reference(x, k->n, k->c, k->s, ch, &mean, &var);
            for (int v = 1; v <= 4; v *= 4) {
                if (k->s % v) continue;
                int64_t parts;
                na_welford_f w = emulate_channel(x, k->n, k->c, k->s, ch, v, 7, &parts);
                double got_var = (double)w.m2 / (double)w.n;
                cr_assert_eq(w.n, k->n * k->s, "case %d ch %lld: count %lld", i, (long long)ch,
                             (long long)w.n);
                cr_assert(fabs(w.mean - mean) <= 2e-6 * (fabs(mean) + k->spread),
                          "case %d ch %lld v%d (%lld partials): mean %.9g, want %.9g", i,
                          (long long)ch, v, (long long)parts, (double)w.mean, mean);
                cr_assert(rel(got_var, var) <= var_bound(k),
                          "case %d ch %lld v%d (%lld partials): var %.9g, want %.9g (rel %.3g > %.3g)",
                          i, (long long)ch, v, (long long)parts, got_var, var, rel(got_var, var),
                          var_bound(k));
            }
        }
        free(x);
    }
}

/* The control: on the large-mean cases the cancelling formula misses the bound by far, so
 * the check above would catch a kernel that used it. */
Test(welford, large_mean_cases_defeat_the_cancelling_formula) {
    int hard = 0;
    for (int i = 0; i < N_CASES; i++) {
        const stats_case *k = &cases[i];
        if (fabs(k->offset) < 1e4 * k->spread) continue;
        float *x = random_nchw(k->n, k->c, k->s, k->offset, k->spread);
        double mean, var;
        reference(x, k->n, k->c, k->s, 0, &mean, &var);
        double e = rel(naive_var(x, k->n, k->c, k->s, 0), var);
        cr_assert(e > 100 * var_bound(k), "case %d: naive variance error only %.3g", i, e);
        hard++;
        free(x);
    }
    cr_assert_geq(hard, 3);
}

/* Same block size, any grid: each tile makes its own partial, so how many blocks share the
 * tiles changes nothing, bit for bit (the GPU's grid depends on its SM count). */
Test(welford, result_does_not_depend_on_the_grid) {
    const stats_case k = {96, 2, 1024, 1e4, 1};
    float *x = random_nchw(k.n, k.c, k.s, k.offset, k.spread);
    int64_t parts;
    na_welford_f one = emulate_channel(x, k.n, k.c, k.s, 1, 4, 1, &parts);
    cr_assert_geq(parts, 20, "want many partials, got %lld", (long long)parts);
    static const int64_t grids[] = {2, 3, 7, 24, 1000};
    for (int g = 0; g < 5; g++) {
        na_welford_f w = emulate_channel(x, k.n, k.c, k.s, 1, 4, grids[g], &parts);
        cr_assert(w.n == one.n && memcmp(&w.mean, &one.mean, sizeof w.mean) == 0 &&
                      memcmp(&w.m2, &one.m2, sizeof w.m2) == 0,
                  "grid %lld: (%.9g, %.9g) vs one block (%.9g, %.9g)", (long long)grids[g],
                  (double)w.mean, (double)w.m2, (double)one.mean, (double)one.m2);
    }
    free(x);
}

/* One data set cut into 1 .. 4000 partials of random sizes, each partial exact (rounded
 * from f64), so only the combination's error shows: the fixed-order combination stays within
 * the same bound of the f64 statistics whatever the number of partials. */
Test(welford, combine_accuracy_does_not_depend_on_the_number_of_partials) {
    const int64_t m = 20000;
    const double offset = 1e4, spread = 1;
    float *x = random_nchw(1, 1, m, offset, spread);
    double mean, var;
    reference(x, 1, 1, m, 0, &mean, &var);
    const stats_case k = {1, 1, m, offset, spread};
    static const int64_t counts[] = {1, 2, 31, 32, 33, 100, 1000, 4000};
    na_welford_f *parts = malloc(4000 * sizeof *parts);
    for (int c = 0; c < 8; c++) {
        int64_t p = counts[c], start = 0;
        for (int64_t i = 0; i < p; i++) { /* random cut points, every partial non-empty */
            int64_t left = m - start, need = p - i - 1;
            int64_t len = i == p - 1 ? left : 1 + (int64_t)(urand() * (double)(left - need - 1) * 2.0 / (double)(p - i));
            if (len > left - need) len = left - need;
            double pm, pv;
            reference(x + start, 1, 1, len, 0, &pm, &pv);
            na_welford_f acc = {len, (float)pm, (float)(pv * (double)len)};
            parts[i] = acc;
            start += len;
        }
        cr_assert_eq(start, m);
        na_welford_f w = na_welford_combine_f(parts, p);
        cr_assert_eq(w.n, m);
        double got = (double)w.m2 / (double)w.n;
        cr_assert(fabs(w.mean - mean) <= 2e-6 * offset, "%lld partials: mean %.9g, want %.9g",
                  (long long)p, (double)w.mean, mean);
        cr_assert(rel(got, var) <= var_bound(&k),
                  "%lld partials: var %.9g, want %.9g (rel %.3g > %.3g)", (long long)p, got, var,
                  rel(got, var), var_bound(&k));
    }
    free(parts);
    free(x);
}

/* The combinations see every partial once: a block of 256 lanes, a tree of 32 one-value
 * partials (exact here: mean 15.5, M2 = sum (i - 15.5)^2) and a fold of 70 partials. */
Test(welford, combinations_take_every_partial_once) {
    na_sum2_d lanes[NA_BN_THREADS];
    for (int i = 0; i < NA_BN_THREADS; i++) lanes[i] = (na_sum2_d){(double)i, 1.0};
    na_sum2_d b = na_sum2_block_d(lanes, NA_BN_THREADS);
    cr_assert_eq(b.a, 255.0 * 256.0 / 2.0);
    cr_assert_eq(b.b, 256.0);
    na_welford_d w[32];
    for (int i = 0; i < 32; i++) w[i] = (na_welford_d){1, (double)i, 0.0};
    na_welford_d t = na_welford_tree32_d(w);
    cr_assert_eq(t.n, 32);
    cr_assert_eq(t.mean, 15.5);
    cr_assert_eq(t.m2, 2728.0); /* sum (i - 15.5)^2, i = 0..31 */
    na_welford_d parts[70];
    for (int i = 0; i < 70; i++) parts[i] = (na_welford_d){i % 3 + 1, (double)(i % 5), 0.25};
    na_welford_d all = na_welford_combine_d(parts, 70);
    int64_t total = 0;
    for (int i = 0; i < 70; i++) total += parts[i].n;
    cr_assert_eq(all.n, total);
}

Test(welford, tiles_cover_every_vector_once) {
    static const int64_t nvecs[] = {1, 1023, 1024, 1025, 5000};
    for (int c = 0; c < 5; c++) {
        int64_t nvec = nvecs[c], tiles = na_bn_tiles(nvec);
        char *seen = calloc((size_t)nvec, 1);
        for (int64_t t = 0; t < tiles; t++)
            for (int th = 0; th < NA_BN_THREADS; th++)
                for (int j = 0; j < NA_BN_VPT; j++) {
                    int64_t k = na_bn_tile_vec(t, j, th);
                    if (k < nvec) seen[k]++;
                }
        for (int64_t k = 0; k < nvec; k++)
            cr_assert_eq(seen[k], 1, "nvec %lld: vector %lld seen %d times", (long long)nvec,
                         (long long)k, seen[k]);
        free(seen);
    }
}
