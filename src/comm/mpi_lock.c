/* mpi_lock.c: the mpi backend's process-wide MPI lock, below everything else of the backend: the
 * entries take it (mpi_world.c's vtable), a blocking wait lets go of it between polls
 * (fsdp_mpi_pause, with the back-off of every poll loop), a start wakes the communication thread
 * (mpi_thread.c), which sleeps on it. With no thread it is never contended. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "comm/mpi_impl.h"

/* The lock, and how deep this thread holds it (an entry may reach code that takes it again: a
 * work freed inside a call). A pause lets go of it whatever the depth. */
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int depth;

void fsdp_mpi_lock(void) {
    if (depth++ == 0) pthread_mutex_lock(&mpi_mu);
}

void fsdp_mpi_unlock(void) {
    if (--depth == 0) pthread_mutex_unlock(&mpi_mu);
}

void fsdp_mpi_pause(int polls, double waited) {
    if (depth == 0) { /* a caller outside the entries (the nccl-mpi backend's arrival) */
        fsdp_mpi_back_off(polls, waited);
        return;
    }
    const int held = depth;
    depth = 0;
    pthread_mutex_unlock(&mpi_mu);
    fsdp_mpi_back_off(polls, waited);
    pthread_mutex_lock(&mpi_mu);
    depth = held;
}

void fsdp_mpi_thread_wake(mpi_world *mw) {
    if (mw->threaded) pthread_cond_signal(&mw->wake);
}

void fsdp_mpi_lock_timedwait(pthread_cond_t *cond, const struct timespec *until) {
    const int held = depth; /* the thread waits holding the lock once */
    depth = 0;
    pthread_cond_timedwait(cond, &mpi_mu, until);
    depth = held;
}

/* Between polls: spin first (latency), then yield the core, then sleep a little. */
void fsdp_mpi_back_off(int polls, double waited) {
    if (polls < 32) return;
    if (waited < 0.002) {
        sched_yield();
        return;
    }
    long ns = waited < 0.05 ? 20000L : 200000L;
    nanosleep(&(struct timespec){.tv_nsec = ns}, NULL);
}
