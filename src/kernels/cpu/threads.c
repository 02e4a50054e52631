/* threads.c: OpenBLAS's thread count, one setting for the whole process, shared out among the
 * rank threads of the worlds running in it (fsdp_world_run). */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h> // defines: openblas_get_num_threads, openblas_set_num_threads
#include <pthread.h>

#include "kernels/kernels.h"

/* Process-wide because OpenBLAS's count is: the runs in progress and the count before them. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_runs;
static int g_saved;
static int g_current;

int fsdp_kernels_cpu_threads_enter(int ranks, int per_rank) {
    pthread_mutex_lock(&g_mu);
    if (g_runs++ == 0) g_saved = g_current = openblas_get_num_threads();
    int want = per_rank > 0 ? per_rank : g_saved / (ranks > 0 ? ranks : 1);
    if (want < 1) want = 1;
    /* A second run at once can only lower the count: the first one's ranks are running. */
    if (g_runs == 1 || want < g_current) {
        if (want != g_current) openblas_set_num_threads(want);
        g_current = want;
    }
    int in_effect = g_current;
    pthread_mutex_unlock(&g_mu);
    return in_effect;
}

void fsdp_kernels_cpu_threads_leave(void) {
    pthread_mutex_lock(&g_mu);
    if (g_runs > 0 && --g_runs == 0 && g_current != g_saved) {
        openblas_set_num_threads(g_saved);
        g_current = g_saved;
    }
    pthread_mutex_unlock(&g_mu);
}
