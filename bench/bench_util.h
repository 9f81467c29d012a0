/* bench/bench_util.h — what the benchmark programs share: a monotonic clock, summary
 * statistics over repeated runs, host memory figures, small argument helpers and the JSON line
 * every program prints (bench/run joins them with PyTorch's by their "key").
 *
 * Statistics are those bench/torch/common.py computes the same way: the median, the min and
 * max, and the quartiles (linear interpolation between order statistics, as numpy's default). */
#ifndef NANOAMP_BENCH_UTIL_H
#define NANOAMP_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

double bench_now_s(void); /* CLOCK_MONOTONIC in seconds */
/* the process's CPU time in seconds, all threads' (--cpu-clock: the figure a loaded shared
 * machine's descheduling does not inflate; meant for one thread) */
double bench_cpu_s(void);

typedef struct {
    double median, min, max, q1, q3;
    int n;
} bench_stats;
/* Sorts v (n >= 1) in place and summarizes it. */
bench_stats bench_stats_of(double *v, int n);

/* Host memory of this process in MiB: the peak resident set so far (getrusage ru_maxrss) and
 * the resident set now (/proc/self/statm; 0 where unavailable). */
double bench_peak_rss_mib(void);
double bench_rss_now_mib(void);

/* argv helpers: the value after flag i (exits 2 with a message if missing or malformed). */
const char *bench_arg_str(int argc, char **argv, int *i);
int64_t bench_arg_i64(int argc, char **argv, int *i, int64_t min);

/* Number of online CPUs. */
int bench_nproc(void);

/* ---- one JSON object per line ------------------------------------------------------------ */
typedef struct {
    FILE *out;
    bool first;
} bench_json;
void bench_json_begin(bench_json *j, FILE *out);
void bench_json_str(bench_json *j, const char *key, const char *value);  /* escaped */
void bench_json_num(bench_json *j, const char *key, double value);       /* null if not finite */
void bench_json_int(bench_json *j, const char *key, int64_t value);
void bench_json_bool(bench_json *j, const char *key, bool value);
void bench_json_stats(bench_json *j, const char *key, const bench_stats *s); /* an object */
void bench_json_end(bench_json *j); /* closes the object, newline, flush */

#endif
