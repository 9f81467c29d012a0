/* kernels/cpu/cpu_parallel.c — the thread pool (cpu_parallel.h, nanoamp/threads.h).
 *
 * One loop at a time: the caller publishes the job (function, context, task count) under the
 * pool's mutex, bumps the generation and wakes the workers; everyone then claims tasks from
 * one atomic counter until none are left. Workers that wake after the tasks are gone do
 * nothing, so the caller never waits for a sleeping worker to be scheduled, only for those
 * that are still running a task it must not outlive.
 *
 * Waiting: a worker that finished a job polls for the next one for at most SPIN_NS, then
 * sleeps on a condition variable; the caller polls the same way for workers still in its job.
 * A training step runs many short loops back to back (an MLP step, about ten in a millisecond)
 * and a wake-up through the scheduler costs tens of microseconds each time; the bound keeps
 * an idle pool asleep (OpenBLAS's workers, which yielded without bound between calls, cost
 * 35-40 s of system time per CNN epoch).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "cpu/cpu_parallel.h"
#include "nanoamp/error.h"
#include "nanoamp/threads.h"

/* OpenBLAS, when it is the BLAS linked in: kept to one thread, as the pool splits large GEMMs
 * itself (OpenBLAS's own workers spin in sched_yield between calls and would compete with
 * the pool's; with a pool of one, one thread is what was asked for). */
void openblas_set_num_threads(int n) __attribute__((weak));

int64_t na_cpu_pool_threads_started = 0;

static atomic_int pool_size; /* 0 until resolved */

static pthread_mutex_t caller_mu = PTHREAD_MUTEX_INITIALIZER; /* one loop (or resize) at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;        /* guards what follows */
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER;     /* workers wait for a job */
static pthread_cond_t idle_cv = PTHREAD_COND_INITIALIZER;     /* the caller waits for them */
static pthread_t *workers;
static int n_workers;
static atomic_bool stopping;
static _Atomic uint64_t generation; /* written under mu; polled without it */
static atomic_int running;          /* workers inside the current job; written under mu */

#define SPIN_NS 50000 /* 50 us */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Polls until done(arg) or SPIN_NS have passed; true when done. */
static bool spin_until(bool (*done)(uint64_t), uint64_t arg) {
    int64_t end = 0;
    for (unsigned i = 0;; i++) {
        if (done(arg)) return true;
        if ((i & 63) == 0) {
            int64_t t = now_ns();
            if (!end) end = t + SPIN_NS;
            else if (t >= end) return false;
        }
        cpu_relax();
    }
}
static bool new_job_or_stop(uint64_t seen) {
    return atomic_load_explicit(&generation, memory_order_acquire) != seen ||
           atomic_load_explicit(&stopping, memory_order_relaxed);
}
static bool workers_done(uint64_t unused) {
    (void)unused;
    return atomic_load_explicit(&running, memory_order_acquire) == 0;
}
static struct {
    void (*fn)(void *, int64_t);
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next;
} job;

static _Thread_local bool in_task;

bool na_cpu_in_parallel(void) { return in_task; }

static void run_tasks(void) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&job.next, 1, memory_order_relaxed);
        if (t >= job.n_tasks) return;
        job.fn(job.ctx, t);
    }
}

static void *worker_main(void *arg) {
    uint64_t seen = (uint64_t)(uintptr_t)arg;
    in_task = true; /* a worker's own loops run inline */
    pthread_mutex_lock(&mu);
    for (;;) {
        if (generation == seen && !stopping) {
            pthread_mutex_unlock(&mu);
            spin_until(new_job_or_stop, seen);
            pthread_mutex_lock(&mu);
        }
        while (generation == seen && !stopping) pthread_cond_wait(&wake_cv, &mu);
        if (stopping) break;
        seen = generation;
        if (atomic_load(&job.next) >= job.n_tasks) continue; /* all claimed already */
        running++;
        pthread_mutex_unlock(&mu);
        run_tasks();
        pthread_mutex_lock(&mu);
        if (--running == 0) pthread_cond_signal(&idle_cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Joins every worker; caller_mu held (or at exit). */
static void stop_workers(void) {
    pthread_mutex_lock(&mu);
    stopping = true;
    pthread_cond_broadcast(&wake_cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    free(workers);
    workers = NULL;
    n_workers = 0;
    stopping = false;
}

static void stop_at_exit(void) {
    pthread_mutex_lock(&caller_mu);
    stop_workers();
    pthread_mutex_unlock(&caller_mu);
}

/* Starts workers until there are `want` (fewer if the system refuses threads: the loops still
 * run, on fewer threads); caller_mu held. */
static void start_workers(int want) {
    static bool exit_hook;
    if (!exit_hook) exit_hook = atexit(stop_at_exit) == 0;
    workers = calloc((size_t)want, sizeof *workers);
    if (!workers) return;
    for (n_workers = 0; n_workers < want; n_workers++) {
        if (pthread_create(&workers[n_workers], NULL, worker_main,
                           (void *)(uintptr_t)generation))
            break;
        na_cpu_pool_threads_started++;
    }
}

static int default_size(void) {
    const char *env = getenv("NANOAMP_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (!*end && v >= 1 && v <= NA_MAX_THREADS) return (int)v;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > NA_MAX_THREADS ? NA_MAX_THREADS : (int)cores;
}

static void apply_size(int n) {
    atomic_store(&pool_size, n);
    if (openblas_set_num_threads) openblas_set_num_threads(1);
}

int na_get_num_threads(void) {
    int n = atomic_load(&pool_size);
    if (n) return n;
    pthread_mutex_lock(&caller_mu);
    if (!atomic_load(&pool_size)) apply_size(default_size());
    pthread_mutex_unlock(&caller_mu);
    return atomic_load(&pool_size);
}

int na_set_num_threads(int n) {
    if (n < 1 || n > NA_MAX_THREADS)
        return na_set_error(NA_EINVAL, "na_set_num_threads: n must be in [1, %d], got %d",
                            NA_MAX_THREADS, n);
    pthread_mutex_lock(&caller_mu);
    apply_size(n); /* the workers follow on the next loop */
    pthread_mutex_unlock(&caller_mu);
    return NA_OK;
}

int na_cpu_parallel_for(int64_t n_tasks, void (*fn)(void *ctx, int64_t task), void *ctx) {
    int size = n_tasks > 1 && !in_task ? na_get_num_threads() : 1;
    if (size <= 1 || pthread_mutex_trylock(&caller_mu)) {
        bool outer = in_task;
        in_task = true; /* the same for the tasks however they run */
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t);
        in_task = outer;
        return 0;
    }
    size = atomic_load(&pool_size); /* as of now, under caller_mu */
    if (n_workers != size - 1) {
        stop_workers();
        if (size > 1) start_workers(size - 1);
    }
    pthread_mutex_lock(&mu);
    job.fn = fn;
    job.ctx = ctx;
    job.n_tasks = n_tasks;
    atomic_store(&job.next, 0);
    generation++;
    pthread_cond_broadcast(&wake_cv);
    pthread_mutex_unlock(&mu);

    in_task = true;
    run_tasks();
    in_task = false;

    spin_until(workers_done, 0);
    pthread_mutex_lock(&mu);
    while (running > 0) pthread_cond_wait(&idle_cv, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&caller_mu);
    return 0;
}

/* ---- task errors ------------------------------------------------------------------------ */

static pthread_mutex_t status_mu = PTHREAD_MUTEX_INITIALIZER;

void na_cpu_task_fail(na_cpu_task_status *s) {
    pthread_mutex_lock(&status_mu);
    if (!s->status) {
        s->status = na_last_status() ? na_last_status() : NA_ENOMEM;
        snprintf(s->msg, sizeof s->msg, "%s", na_last_error());
    }
    pthread_mutex_unlock(&status_mu);
}

int na_cpu_task_status_raise(const na_cpu_task_status *s) {
    if (!s->status) return 0;
    return na_set_error(s->status, "%s", s->msg);
}
