/* workers.c: a rank's worker threads. fsdp_kernels_cpu_workers_start gives the calling thread
 * (a rank) n - 1 workers, pinned to cores when asked; kernels split one call over the rank's
 * threads with fsdp_cpu_workers_run. A worker spins briefly for the next call, then sleeps on
 * a condition variable, so idle workers leave their cores to others. */
#define _GNU_SOURCE /* pthread_setaffinity_np, CPU_SET */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "kernels/cpu/workers.h"
#include "kernels/kernels.h"

#define SPIN_ROUNDS 2000 /* a few microseconds: back-to-back kernels find the workers awake */

typedef struct workers {
    int n; /* threads, the owner included */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    _Atomic uint64_t gen; /* calls started; a worker runs each once */
    atomic_int pending;   /* workers still running the current call */
    atomic_bool stop;
    void (*fn)(void *arg, int part, int parts);
    void *arg;
} workers;

typedef struct worker_arg {
    workers *w;
    int part;
} worker_arg;

static _Thread_local workers *mine;
/* The owner's affinity before it was pinned, restored when its workers stop. */
static _Thread_local cpu_set_t saved_affinity;
static _Thread_local bool pinned;

/* Pins thread t to the slot-th CPU (modulo their count) of `allowed`, the CPUs the process
 * may use, so that a cpuset or taskset is respected. A refusal changes no result: ignored. */
static void pin_to(pthread_t t, const cpu_set_t *allowed, int slot) {
    int count = CPU_COUNT(allowed);
    if (count <= 0) return;
    slot %= count;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, allowed) || slot-- > 0) continue;
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        (void)pthread_setaffinity_np(t, sizeof set, &set);
        return;
    }
}

static void *worker_main(void *p) {
    worker_arg a = *(worker_arg *)p;
    free(p);
    workers *w = a.w;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&w->gen, memory_order_acquire);
        for (int i = 0; i < SPIN_ROUNDS && g == seen && !atomic_load(&w->stop); i++) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            g = atomic_load_explicit(&w->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&w->mu);
            while ((g = atomic_load(&w->gen)) == seen && !atomic_load(&w->stop))
                pthread_cond_wait(&w->start_cv, &w->mu);
            pthread_mutex_unlock(&w->mu);
        }
        if (atomic_load(&w->stop)) return NULL;
        seen = g;
        w->fn(w->arg, a.part, w->n);
        if (atomic_fetch_sub_explicit(&w->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&w->mu);
            pthread_cond_signal(&w->done_cv);
            pthread_mutex_unlock(&w->mu);
        }
    }
}

static void workers_free(workers *w) {
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->stop, true);
    pthread_cond_broadcast(&w->start_cv);
    pthread_mutex_unlock(&w->mu);
    for (int i = 1; i < w->n; i++) pthread_join(w->threads[i], NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->start_cv);
    pthread_cond_destroy(&w->done_cv);
    free(w->threads);
    free(w);
}

int fsdp_kernels_cpu_workers_start(int n, int first_core) {
    fsdp_kernels_cpu_workers_stop();
    if (first_core >= 0 &&
        pthread_getaffinity_np(pthread_self(), sizeof saved_affinity, &saved_affinity) == 0) {
        pinned = true;
        pin_to(pthread_self(), &saved_affinity, first_core);
    }
    if (n <= 1) return 1;
    workers *w = calloc(1, sizeof *w);
    if (!w) return 1;
    w->threads = calloc((size_t)n, sizeof *w->threads);
    if (!w->threads || pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w->threads), free(w);
        return 1;
    }
    pthread_cond_init(&w->start_cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    atomic_init(&w->gen, 0);
    atomic_init(&w->pending, 0);
    atomic_init(&w->stop, false);
    w->n = 1;
    for (int i = 1; i < n; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) break;
        *a = (worker_arg){.w = w, .part = i};
        if (pthread_create(&w->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            break;
        }
        if (pinned) pin_to(w->threads[i], &saved_affinity, first_core + i);
        w->n = i + 1;
    }
    mine = w;
    return w->n;
}

void fsdp_kernels_cpu_workers_stop(void) {
    if (pinned)
        (void)pthread_setaffinity_np(pthread_self(), sizeof saved_affinity, &saved_affinity);
    pinned = false;
    if (!mine) return;
    workers_free(mine);
    mine = NULL;
}

int fsdp_cpu_workers_count(void) {
    return mine ? mine->n : 1;
}

void fsdp_cpu_workers_run(void (*fn)(void *arg, int part, int parts), void *arg) {
    workers *w = mine;
    if (!w || w->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    w->fn = fn;
    w->arg = arg;
    atomic_store_explicit(&w->pending, w->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&w->mu);
    atomic_fetch_add_explicit(&w->gen, 1, memory_order_release);
    pthread_cond_broadcast(&w->start_cv);
    pthread_mutex_unlock(&w->mu);
    fn(arg, 0, w->n);
    for (int i = 0; i < SPIN_ROUNDS && atomic_load_explicit(&w->pending, memory_order_acquire);
         i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    if (atomic_load_explicit(&w->pending, memory_order_acquire)) {
        pthread_mutex_lock(&w->mu);
        while (atomic_load(&w->pending) > 0) pthread_cond_wait(&w->done_cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
    }
}

void fsdp_cpu_split(int64_t n, int64_t align, int part, int parts, int64_t *begin, int64_t *end) {
    int64_t units = (n + align - 1) / align; /* whole aligned blocks; the last may be short */
    int64_t per = units / parts, extra = units % parts;
    int64_t b = (int64_t)part * per + (part < extra ? part : extra);
    int64_t e = b + per + (part < extra ? 1 : 0);
    b *= align, e *= align;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}
