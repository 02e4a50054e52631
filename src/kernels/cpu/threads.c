/* threads.c: the threads of the rank threads of the worlds running in this process
 * (fsdp_world_run). Each rank splits its kernels over threads of its own (workers.c), so
 * OpenBLAS, whose thread count is one setting for the whole process, runs single-threaded
 * while a world runs. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h> // defines: openblas_get_num_threads, openblas_set_num_threads
#include <pthread.h>

#include "kernels/kernels.h"

/* Process-wide because OpenBLAS's count is: the runs in progress and the count before them. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_runs;
static int g_saved;

int fsdp_kernels_cpu_threads_enter(int ranks, int per_rank) {
    pthread_mutex_lock(&g_mu);
    if (g_runs++ == 0) {
        g_saved = openblas_get_num_threads();
        if (g_saved != 1) openblas_set_num_threads(1);
    }
    int want = per_rank > 0 ? per_rank : g_saved / (ranks > 0 ? ranks : 1);
    pthread_mutex_unlock(&g_mu);
    return want < 1 ? 1 : want;
}

void fsdp_kernels_cpu_threads_leave(void) {
    pthread_mutex_lock(&g_mu);
    if (g_runs > 0 && --g_runs == 0 && g_saved != 1) openblas_set_num_threads(g_saved);
    pthread_mutex_unlock(&g_mu);
}
