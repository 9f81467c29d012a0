/* bench/bench.h — the na-bench program: subcommands and the helpers they share.
 *
 *   na-bench info                        what this build and machine offer (one JSON line)
 *   na-bench overhead [--device D] ...   bench/overhead.c
 *   na-bench train --model M ...         bench/train.c
 *
 * Each subcommand prints one JSON line on stdout; on failure the line carries "error" and the
 * exit status is nonzero (3: the device is not available). */
#ifndef NANOAMP_BENCH_H
#define NANOAMP_BENCH_H

#include "nanoamp.h"

int bench_overhead_main(int argc, char **argv);
int bench_train_main(int argc, char **argv);

/* "cpu" or "cuda" into *dev; prints a message and returns -1 otherwise. */
int bench_parse_device(const char *s, na_device *dev);
/* NA_OK when dev can run; otherwise prints an error JSON line for key and returns -1. */
int bench_check_device(na_device dev, const char *key);
/* Waits for the device (a no-op on the CPU). */
void bench_sync(na_device dev);
/* Prints {"key": key, "impl": "nanoamp", "error": "<what>: <na_last_error()>"} and returns 1. */
int bench_fail(const char *key, const char *what);

#endif
