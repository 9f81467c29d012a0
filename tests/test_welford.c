/* tests/test_welford.c — the BatchNorm statistics of kernels/common/welford.h on the CPU.
 *
 * The CUDA BatchNorm (NANOAMP_CUDA_BN=v2) computes a channel's mean and variance from
 * per-tile Welford partials combined in a fixed order; this suite runs that same algorithm on
 * the host (emulate_channel: the kernel's tiles, vector loads, per-thread folds, block trees
 * and the combining warp, through the functions the kernel calls) and checks it against a
 * two-pass reference in f64, on random inputs including channels whose mean dwarfs their
 * spread (where sum(x^2) - n*mean^2 in f32 loses every digit: the control below shows it).
 * The row kernels (NANOAMP_CUDA_BN_ROWS=1, x [M, C]) are emulated the same way
 * (emulate_rows: common/bn_rows.h's chunks, steps, per-thread folds and block trees).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/bn_rows.h"
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

/* ---- rows: x [M, C] row-major (common/bn_rows.h) ----------------------------------------- */

/* The row kernels' algorithm for channel ch of x [m, c] with vectors of vw channels: per
 * chunk and thread row ty the steps' partials folded in order, the block's tree over ty, the
 * chunks combined as the finalize does. The kernel computes merge's weight once per step for
 * all its channels (na_welford_merge_fb) and uses na_welford_of_upto for a short last step;
 * welford.identities below shows both give these bits. */
static na_welford_f emulate_rows(const float *x, int64_t m, int64_t c, int vw, int64_t ch,
                                 int64_t *n_partials) {
    const na_bn_rows_geom g = na_bn_rows_geom_of(m, c, vw);
    na_welford_f *parts = malloc((size_t)g.chunks * sizeof *parts);
    na_welford_f lanes[NA_BN_THREADS];
    cr_assert_not_null(parts);
    for (int64_t k = 0; k < g.chunks; k++) {
        for (int ty = 0; ty < g.by; ty++) {
            na_welford_f acc = na_welford_empty_f();
            for (int64_t s = 0; s < g.steps; s++) {
                float col[NA_BN_VPT];
                int cnt = 0;
                for (int j = 0; j < NA_BN_VPT; j++) {
                    int64_t r = na_bn_rows_row(&g, k, s, j, ty);
                    if (r < m) col[j] = x[r * c + ch], cnt = j + 1;
                }
                if (cnt == 0) break;
                acc = na_welford_merge_f(acc, na_welford_of_f(col, cnt));
            }
            lanes[ty] = acc;
        }
        parts[k] = na_welford_tree_f(lanes, g.by);
    }
    na_welford_f r = na_welford_combine_f(parts, g.chunks);
    *n_partials = g.chunks;
    free(parts);
    return r;
}

/* (sum gy, sum gy*xhat) of channel ch in the row kernels' order */
static na_sum2_f emulate_rows_sums(const float *x, const float *gy, int64_t m, int64_t c, int vw,
                                   int64_t ch, float mean, float invstd) {
    const na_bn_rows_geom g = na_bn_rows_geom_of(m, c, vw);
    na_sum2_f *parts = malloc((size_t)g.chunks * sizeof *parts);
    na_sum2_f lanes[NA_BN_THREADS];
    cr_assert_not_null(parts);
    for (int64_t k = 0; k < g.chunks; k++) {
        for (int ty = 0; ty < g.by; ty++) {
            na_sum2_f acc = na_sum2_empty_f();
            for (int64_t s = 0; s < g.steps; s++)
                for (int j = 0; j < NA_BN_VPT; j++) {
                    int64_t r = na_bn_rows_row(&g, k, s, j, ty);
                    if (r >= m) break;
                    float gv = gy[r * c + ch];
                    acc.a += gv;
                    acc.b += gv * ((x[r * c + ch] - mean) * invstd);
                }
            lanes[ty] = acc;
        }
        parts[k] = na_sum2_tree_f(lanes, g.by);
    }
    na_sum2_f r = na_sum2_combine_f(parts, g.chunks);
    free(parts);
    return r;
}

typedef struct {
    int64_t m, c;
    double offset, spread;
} rows_case;

/* M and C as the kernels meet them (BatchNorm1d batches, channels-last layers, C = 3 with
 * vw 1, long channels with many steps per chunk), and large means */
static const rows_case row_cases[] = {
    {1, 1, 0, 1},         {5, 3, 0.5, 1},         {1000, 64, 0, 1},    {20000, 512, -2, 3},
    {3000, 8, 1e4, 1},    {700001, 4, 3e4, 0.1},  {2049, 24, 1e6, 0.5}, {65536, 64, 1e3, 2},
};
#define N_ROW_CASES (int)(sizeof row_cases / sizeof row_cases[0])

Test(welford, rows_fixed_order_matches_f64_two_pass) {
    int many_steps = 0;
    for (int i = 0; i < N_ROW_CASES; i++) {
        const rows_case *k = &row_cases[i];
        float *x = random_nchw(k->m, k->c, 1, k->offset, k->spread);
        const stats_case bound = {k->m, k->c, 1, k->offset, k->spread};
        for (int vw = 1; vw <= 4; vw *= 4) {
            if (k->c % vw) continue;
            many_steps += na_bn_rows_geom_of(k->m, k->c, vw).steps > 1;
            for (int64_t ch = 0; ch < k->c; ch += 1 + k->c / 5) { /* a few channels each */
                double mean, var;
                reference(x, k->m, k->c, 1, ch, &mean, &var);
                int64_t parts;
                na_welford_f w = emulate_rows(x, k->m, k->c, vw, ch, &parts);
                double got_var = (double)w.m2 / (double)w.n;
                cr_assert_eq(w.n, k->m, "case %d ch %lld: count %lld", i, (long long)ch,
                             (long long)w.n);
                cr_assert(fabs(w.mean - mean) <= 2e-6 * (fabs(mean) + k->spread),
                          "case %d ch %lld vw %d (%lld partials): mean %.9g, want %.9g", i,
                          (long long)ch, vw, (long long)parts, (double)w.mean, mean);
                cr_assert(rel(got_var, var) <= var_bound(&bound),
                          "case %d ch %lld vw %d (%lld partials): var %.9g, want %.9g (rel %.3g)",
                          i, (long long)ch, vw, (long long)parts, got_var, var, rel(got_var, var));
            }
        }
        free(x);
    }
    cr_assert_geq(many_steps, 2, "some cases must fold several steps per chunk");
}

Test(welford, rows_backward_sums_match_f64) {
    const rows_case k = {20000, 64, 0.5, 2};
    float *x = random_nchw(k.m, k.c, 1, k.offset, k.spread);
    float *gy = random_nchw(k.m, k.c, 1, 0, 1);
    for (int vw = 1; vw <= 4; vw *= 4)
        for (int64_t ch = 0; ch < k.c; ch += 7) {
            double mean, var;
            reference(x, k.m, k.c, 1, ch, &mean, &var);
            const float mu = (float)mean, is = (float)(1 / sqrt(var + 1e-5));
            double sa = 0, sb = 0, abs_a = 0, abs_b = 0; /* f64 of the same f32 terms */
            for (int64_t r = 0; r < k.m; r++) {
                double gv = gy[r * k.c + ch], xh = (double)((x[r * k.c + ch] - mu) * is);
                sa += gv, sb += gv * xh, abs_a += fabs(gv), abs_b += fabs(gv * xh);
            }
            na_sum2_f p = emulate_rows_sums(x, gy, k.m, k.c, vw, ch, mu, is);
            cr_assert(fabs(p.a - sa) <= 1e-6 * abs_a && fabs(p.b - sb) <= 1e-6 * abs_b,
                      "vw %d ch %lld: (%.9g, %.9g), want (%.9g, %.9g)", vw, (long long)ch,
                      (double)p.a, (double)p.b, sa, sb);
        }
    free(x);
    free(gy);
}

/* Every row of every channel is read exactly once, and the blocks are what the kernels need:
 * bx * by threads, by a power of 2 (the tree), bx at most a warp. */
Test(welford, rows_geometry_covers_every_row_once) {
    static const int64_t ms[] = {1, 255, 256, 257, 5000, 1 << 20};
    static const int64_t cs[] = {1, 3, 4, 64, 100, 2048};
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++) {
            const int64_t m = ms[a], c = cs[b];
            const na_bn_rows_geom g = na_bn_rows_geom_of(m, c, 1);
            cr_assert_eq(g.bx * g.by, NA_BN_THREADS);
            cr_assert(g.bx <= 32 && (g.by & (g.by - 1)) == 0, "bx %d by %d", g.bx, g.by);
            cr_assert(g.bx >= g.cv || g.bx == 32, "c %lld: bx %d", (long long)c, g.bx);
            cr_assert_leq(g.chunks * g.cblocks, 2 * NA_BN_ROWS_BLOCKS + g.cblocks);
            char *seen = calloc((size_t)m, 1);
            cr_assert_not_null(seen);
            for (int64_t k = 0; k < g.chunks; k++)
                for (int64_t s = 0; s < g.steps; s++)
                    for (int ty = 0; ty < g.by; ty++)
                        for (int j = 0; j < NA_BN_VPT; j++) {
                            int64_t r = na_bn_rows_row(&g, k, s, j, ty);
                            if (r < m) seen[r]++;
                        }
            for (int64_t r = 0; r < m; r++)
                cr_assert_eq(seen[r], 1, "m %lld c %lld: row %lld seen %d times", (long long)m,
                             (long long)c, (long long)r, seen[r]);
            free(seen);
        }
}

/* The kernels' shortcuts are the reference's arithmetic bit for bit: a merge with the weight
 * computed apart, and a partial of a short step from loops of constant length. */
Test(welford, identities) {
    for (int t = 0; t < 2000; t++) {
        float v[NA_BN_VPT];
        for (int j = 0; j < NA_BN_VPT; j++) v[j] = (float)(1e3 + 10 * (2 * urand() - 1));
        const int k = 1 + t % NA_BN_VPT;
        na_welford_f a = na_welford_of_f(v, k), b = na_welford_of_upto_f(v, k);
        cr_assert(a.n == b.n && memcmp(&a.mean, &b.mean, sizeof a.mean) == 0 &&
                  memcmp(&a.m2, &b.m2, sizeof a.m2) == 0, "of_upto differs at k = %d", k);
        na_welford_f acc = {1 + (int64_t)(urand() * 5000), (float)(1e3 + urand()), (float)urand()};
        na_welford_f m1 = na_welford_merge_f(acc, a);
        na_welford_f m2 = na_welford_merge_fb_f(acc, a, na_welford_fb_f(acc.n, a.n));
        cr_assert(m1.n == m2.n && memcmp(&m1.mean, &m2.mean, sizeof m1.mean) == 0 &&
                  memcmp(&m1.m2, &m2.m2, sizeof m1.m2) == 0, "merge_fb differs");
    }
}
