/* Helpers shared by the benchmark programs (see bench_util.h). */
#define _GNU_SOURCE
#include "bench_util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_now_s(void) { return clock_s(CLOCK_MONOTONIC); }

double bench_cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.percentile's default ("linear"): position q*(n-1) between order statistics */
static double quantile(const double *sorted, int n, double q) {
    double pos = q * (double)(n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    double f = pos - (double)lo;
    return sorted[lo] + f * (sorted[hi] - sorted[lo]);
}

bench_stats bench_stats_of(double *v, int n) {
    bench_stats s = {.n = n};
    if (n <= 0) {
        s.median = s.min = s.max = s.q1 = s.q3 = NAN;
        return s;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.min = v[0], s.max = v[n - 1];
    s.median = quantile(v, n, 0.5);
    s.q1 = quantile(v, n, 0.25);
    s.q3 = quantile(v, n, 0.75);
    return s;
}

double bench_peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return NAN;
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

double bench_rss_now_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (!f) return 0;
    int ok = fscanf(f, "%ld %ld", &size, &resident) == 2;
    fclose(f);
    return ok ? (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0) : 0;
}

const char *bench_arg_str(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

int64_t bench_arg_i64(int argc, char **argv, int *i, int64_t min) {
    const char *flag = argv[*i];
    const char *s = bench_arg_str(argc, argv, i);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < min) {
        fprintf(stderr, "%s: %s expects an integer >= %lld, got '%s'\n", argv[0], flag,
                (long long)min, s);
        exit(2);
    }
    return v;
}

int bench_nproc(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void bench_json_begin(bench_json *j, FILE *out) {
    j->out = out;
    j->first = true;
    fputc('{', out);
}

static void key(bench_json *j, const char *k) {
    fprintf(j->out, "%s\"%s\": ", j->first ? "" : ", ", k);
    j->first = false;
}

void bench_json_str(bench_json *j, const char *k, const char *value) {
    key(j, k);
    fputc('"', j->out);
    for (const unsigned char *p = (const unsigned char *)(value ? value : ""); *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(j->out, "\\%c", *p);
        else if (*p < 0x20) fprintf(j->out, "\\u%04x", *p);
        else fputc(*p, j->out);
    }
    fputc('"', j->out);
}

void bench_json_num(bench_json *j, const char *k, double value) {
    key(j, k);
    if (isfinite(value)) fprintf(j->out, "%.6g", value);
    else fputs("null", j->out);
}

void bench_json_int(bench_json *j, const char *k, int64_t value) {
    key(j, k);
    fprintf(j->out, "%lld", (long long)value);
}

void bench_json_bool(bench_json *j, const char *k, bool value) {
    key(j, k);
    fputs(value ? "true" : "false", j->out);
}

void bench_json_stats(bench_json *j, const char *k, const bench_stats *s) {
    key(j, k);
    bench_json inner;
    bench_json_begin(&inner, j->out);
    bench_json_num(&inner, "median", s->median);
    bench_json_num(&inner, "min", s->min);
    bench_json_num(&inner, "max", s->max);
    bench_json_num(&inner, "q1", s->q1);
    bench_json_num(&inner, "q3", s->q3);
    bench_json_int(&inner, "n", s->n);
    fputc('}', j->out);
}

void bench_json_end(bench_json *j) {
    fputs("}\n", j->out);
    fflush(j->out);
}
