/* mpi_thread.c: the mpi backend's communication thread (fsdp_world_options.comm_thread), over
 * the process's MPI lock (mpi_lock.c). Every entry of the backend runs under the lock
 * (mpi_world.c's vtable; with no thread it is never contended), and the thread, holding it,
 * advances the non-blocking calls in flight (mpi_async.c) of every group whose works the rank is
 * not waiting for; a blocking wait lets go of the lock between its polls (fsdp_mpi_pause). MPI
 * stays at MPI_THREAD_SERIALIZED: no two threads of the process are ever inside MPI at once. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>

#include "comm/mpi_impl.h"
#include "core/error.h"

/* Between the thread's passes while works are in flight: short, so that a step posts soon after
 * the one before completes, yet the rank's compute keeps its core. */
#define THREAD_POLL_NS 20000L
/* While nothing is in flight the thread sleeps until a start wakes it, or this long (a stop). */
#define THREAD_IDLE_MS 10

/* One pass over a group's works; whether some are still in flight. A failure is recorded in
 * the works (their wait reports it), so the thread's own error is dropped. */
static bool pass_group(mpi_world *mw, mpi_group *mg) {
    if (!mg->works || mg->poisoned) return false;
    if (mg->waiting) return true; /* the rank advances them itself */
    (void)fsdp_mpi_works_progress(mw->thread_ctx, mg);
    fsdp_clear_error(mw->thread_ctx);
    return mg->works != NULL && !mg->poisoned;
}

static void *thread_main(void *arg) {
    mpi_world *mw = arg;
    fsdp_mpi_lock();
    while (!mw->stop) {
        bool busy = pass_group(mw, mw->world_group);
        for (mpi_group *mg = mw->groups; mg; mg = mg->next) busy |= pass_group(mw, mg);
        if (busy) {
            fsdp_mpi_unlock();
            nanosleep(&(struct timespec){.tv_nsec = THREAD_POLL_NS}, NULL);
            fsdp_mpi_lock();
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += THREAD_IDLE_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        fsdp_mpi_lock_timedwait(&mw->wake, &until);
    }
    fsdp_mpi_unlock();
    return NULL;
}

fsdp_status fsdp_mpi_thread_start(fsdp_ctx *ctx, mpi_world *mw) {
    int provided = MPI_THREAD_SINGLE;
    MPI_TRY(ctx, MPI_Query_thread(&provided), "fsdp_world_create");
    if (provided < MPI_THREAD_SERIALIZED)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_world_create: comm_thread needs MPI at MPI_THREAD_SERIALIZED or "
                         "above, but this process initialised MPI at thread level %d; initialise "
                         "it with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...) (or leave it "
                         "to libfsdp), or leave comm_thread off",
                         provided);
    FSDP_TRY_AT(ctx, fsdp_ctx_create(NULL, &mw->thread_ctx));
    if (pthread_cond_init(&mw->wake, NULL) != 0) {
        fsdp_ctx_free(mw->thread_ctx);
        mw->thread_ctx = NULL;
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                         "fsdp_world_create: cannot create the "
                         "communication thread's condition variable");
    }
    mw->stop = false;
    mw->threaded = true;
    if (pthread_create(&mw->thread, NULL, thread_main, mw) != 0) {
        mw->threaded = false;
        pthread_cond_destroy(&mw->wake);
        fsdp_ctx_free(mw->thread_ctx);
        mw->thread_ctx = NULL;
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                         "fsdp_world_create: cannot start the communication thread (too many "
                         "threads?); leave comm_thread off");
    }
    return FSDP_OK;
}

void fsdp_mpi_thread_stop(mpi_world *mw) {
    if (!mw->threaded) return;
    fsdp_mpi_lock();
    mw->stop = true;
    pthread_cond_signal(&mw->wake);
    fsdp_mpi_unlock();
    pthread_join(mw->thread, NULL);
    mw->threaded = false;
    pthread_cond_destroy(&mw->wake);
    fsdp_ctx_free(mw->thread_ctx);
    mw->thread_ctx = NULL;
}
