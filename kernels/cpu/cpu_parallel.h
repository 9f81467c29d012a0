/* kernels/cpu/cpu_parallel.h — the CPU backend's thread pool (nanoamp/threads.h is its public
 * face).
 *
 * na_cpu_parallel_for runs fn(ctx, t) once for every task t in [0, n_tasks), on the calling
 * thread and the pool's workers, and returns when all have run. Tasks must be independent
 * (disjoint outputs; scratch from na_cpu_scratch is per thread). It runs inline, in task
 * order, when the pool has one thread, there is one task, or it is called from inside a task
 * (nested) or while another thread's loop holds the pool.
 *
 * Determinism is the caller's part: cut the work by the problem's size only
 * (na_cpu_split), never by na_get_num_threads(), and add per-task partial results in task
 * order after the loop. Then results do not depend on the thread count.
 *
 * Tasks return nothing. One that fails records it with na_cpu_task_fail; the kernel then
 * returns na_cpu_task_status_raise (the error message set on the calling thread).
 */
#ifndef NANOAMP_KERNELS_CPU_PARALLEL_H
#define NANOAMP_KERNELS_CPU_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

int na_cpu_parallel_for(int64_t n_tasks, void (*fn)(void *ctx, int64_t task), void *ctx);

/* Whether the calling thread is running a pool task (then a parallel loop runs inline). */
bool na_cpu_in_parallel(void);

/* Tasks for n items in pieces of about `grain` items, at most max_tasks (grain, max_tasks
 * >= 1): 1 for n <= grain, so small problems run inline. */
static inline int64_t na_cpu_split(int64_t n, int64_t grain, int64_t max_tasks) {
    int64_t t = n > grain ? (n + grain - 1) / grain : 1;
    return t < max_tasks ? t : max_tasks;
}

/* Items [lo, hi) of task t when n items are cut into `tasks` near-equal ranges, each a
 * multiple of `align` long except the last (align >= 1). */
static inline void na_cpu_task_range(int64_t n, int64_t tasks, int64_t t, int64_t align,
                                     int64_t *lo, int64_t *hi) {
    int64_t units = (n + align - 1) / align;
    int64_t a = units * t / tasks * align, b = units * (t + 1) / tasks * align;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

/* The first failure among a loop's tasks: status and message, copied from the task's thread. */
typedef struct {
    int status;
    char msg[512];
} na_cpu_task_status;

/* Records the calling thread's last error (na_last_status / na_last_error) in s unless s
 * already holds one. Thread-safe. */
void na_cpu_task_fail(na_cpu_task_status *s);

/* NA_OK, or s's status with its message set as the calling thread's error. */
int na_cpu_task_status_raise(const na_cpu_task_status *s);

/* Test hook: the pool's workers (threads other than the caller) started so far. */
extern int64_t na_cpu_pool_threads_started;

#endif
