/* mpi_world.c: the MPI backend's world: initialising MPI, the world and group states (an
 * MPI communicator each), group splits, the ranks' exit notes and results, and the backend's
 * vtable. One process per rank under mpirun; CPU tensors. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_impl.h"
#include "core/error.h"

/* Under AddressSanitizer, LeakSanitizer does not report what this thread allocates inside
 * MPI_Init_thread and MPI_Finalize: Open MPI keeps much of it until exit, and most of that
 * comes from components it unloads in MPI_Finalize, whose stacks no suppression can name (and
 * whose every unnamed frame makes LeakSanitizer reread the process's memory map). libfsdp's
 * own code does not run inside these calls. Open MPI's other threads and its allocations in
 * later calls are still checked (tests/lsan.supp names the libraries they may keep). */
#if defined(__SANITIZE_ADDRESS__)
#define FSDP_MPI_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FSDP_MPI_LSAN 1
#endif
#endif
#ifdef FSDP_MPI_LSAN
#include <sanitizer/lsan_interface.h>
#define MPI_LEAKS_IGNORED(call) (__lsan_disable(), (call), __lsan_enable())
#else
#define MPI_LEAKS_IGNORED(call) ((void)(call))
#endif

/* The process-wide state, under init_mu: MPI's initialisation, and the buffers of notes MPI
 * may still send after their world was freed. */
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending_send *graveyard;

/* ---- MPI itself ---- */

static void finalise_at_exit(void) {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_LEAKS_IGNORED(MPI_Finalize());
}

static fsdp_status ensure_initialised(fsdp_ctx *ctx) {
    pthread_mutex_lock(&init_mu);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    fsdp_status st = FSDP_OK;
    if (finalised) {
        st = FSDP_FAIL(ctx, FSDP_ERR_STATE,
                       "fsdp_world_create: MPI has been finalised in this process; create MPI "
                       "worlds before MPI_Finalize");
    } else if (!initialised) {
        int provided = 0, rc = MPI_SUCCESS;
        MPI_LEAKS_IGNORED(rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided));
        if (rc != MPI_SUCCESS) {
            st = fsdp_mpi_fail(ctx, rc, "MPI_Init_thread", "fsdp_world_create");
        } else {
            if (atexit(finalise_at_exit) != 0)
                fsdp_log(ctx, FSDP_LOG_WARN, "cannot register MPI_Finalize to run at exit");
        }
    }
    pthread_mutex_unlock(&init_mu);
    return FSDP_PASS(ctx, st);
}

/* ---- group states ---- */

static void group_state_free(mpi_group *mg) {
    if (!mg) return;
    fsdp_mpi_works_detach(mg);
    if (mg->comm != MPI_COMM_NULL) MPI_Comm_free(&mg->comm);
    free(mg->ranks), free(mg->descs), free(mg->ready), free(mg->calls), free(mg->call_ptrs);
    free(mg->srcs);
    fsdp_mpi_reqs_release(&mg->rq);
    free(mg->scratch);
    free(mg);
}

/* A group state over comm (taken over) whose members are the given world ranks. */
static mpi_group *group_state_new(mpi_world *mw, MPI_Comm comm, int size, int rank,
                                  const int *ranks) {
    mpi_group *mg = calloc(1, sizeof *mg);
    if (!mg) return NULL;
    size_t n = (size_t)size;
    mg->mw = mw;
    mg->comm = comm;
    mg->size = size;
    mg->rank = rank;
    mg->ranks = malloc(n * sizeof *mg->ranks);
    mg->descs = calloc(n, sizeof *mg->descs);
    mg->ready = calloc(n, sizeof *mg->ready);
    mg->calls = calloc(n, sizeof *mg->calls);
    mg->call_ptrs = calloc(n, sizeof *mg->call_ptrs);
    mg->srcs = calloc(n, sizeof *mg->srcs);
    if (!mg->ranks || !mg->descs || !mg->ready || !mg->calls || !mg->call_ptrs || !mg->srcs) {
        group_state_free(mg);
        return NULL;
    }
    memcpy(mg->ranks, ranks, n * sizeof *ranks);
    for (int i = 0; i < size; i++) mg->call_ptrs[i] = &mg->calls[i];
    return mg;
}

/* ---- groups ---- */

static fsdp_status mpi_split(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                             const char *agree, fsdp_group_info *out) {
    fsdp_call c = {.op = FSDP_OP_SPLIT, .color = color, .key = key, .agree = agree};
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, parent, &c));
    FSDP_TRY_AT(ctx, fsdp_mpi_confirm(ctx, parent, c.op));
    mpi_group *pg = parent->state;
    mpi_world *mw = pg->mw;
    /* Every member has arrived and confirmed, so MPI_Comm_split (which has no non-blocking
     * form) cannot wait for an absent one. Members: the parent's of this color, by (key,
     * parent rank). */
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_TRY(ctx, MPI_Comm_split(pg->comm, color >= 0 ? color : MPI_UNDEFINED, key, &comm),
            "group split");
    *out = (fsdp_group_info){0};
    if (color < 0) return FSDP_OK;
    int *order = malloc((size_t)parent->size * sizeof *order), m = 0, mine = -1;
    for (int p = 0; order && p < parent->size; p++) {
        if (pg->calls[p].color != color) continue;
        int at = m++;
        while (at > 0 && pg->calls[order[at - 1]].key > pg->calls[p].key)
            order[at] = order[at - 1], at--;
        order[at] = p;
    }
    for (int i = 0; order && i < m; i++) {
        if (order[i] == parent->rank) mine = i;
        order[i] = parent->ranks[order[i]];
    }
    int comm_size = 0, comm_rank = -1;
    MPI_Comm_size(comm, &comm_size);
    MPI_Comm_rank(comm, &comm_rank);
    mpi_group *child = NULL;
    bool allocated = order != NULL, agrees = allocated && comm_size == m && comm_rank == mine;
    if (agrees) {
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        child = group_state_new(mw, comm, m, mine, order);
    }
    free(order);
    if (!child) {
        MPI_Comm_free(&comm);
        if (allocated && !agrees)
            return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                             "group split of %s: MPI's new communicator has %d members and this "
                             "rank at %d, but the descriptors say %d and %d",
                             parent->desc, comm_size, comm_rank, m, mine);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                         "group split of %s: cannot allocate the new group of %d members",
                         parent->desc, m);
    }
    child->next = mw->groups;
    mw->groups = child;
    *out = (fsdp_group_info){
        .state = child, .size = child->size, .rank = child->rank, .ranks = child->ranks};
    return FSDP_OK;
}

/* ---- the world ---- */

static void mpi_hosted_ranks(void *context, int *first, int *count) {
    const mpi_world *mw = context;
    *first = mw->rank;
    *count = 1;
}

static void mpi_world_group(void *context, int rank, fsdp_group_info *out) {
    const mpi_world *mw = context;
    *out = (fsdp_group_info){
        .state = mw->world_group, .size = mw->size, .rank = rank, .ranks = mw->world_group->ranks};
}

static void free_run_groups(mpi_world *mw) {
    while (mw->groups) {
        mpi_group *next = mw->groups->next;
        group_state_free(mw->groups);
        mw->groups = next;
    }
}

static void mpi_reset(void *context) {
    mpi_world *mw = context;
    mw->run++;
    free_run_groups(mw);
    mw->world_group->poisoned = false;
    fsdp_mpi_works_detach(mw->world_group);
    mw->world_group->rq.n = 0;
    for (int r = 0; r < mw->size; r++) mw->noted[r] = false, mw->finished[r] = 0;
}

/* This process's rank has returned: its calls still in flight are abandoned (the communication
 * thread must not finish them for it), and every other rank is told, with its result. */
static void mpi_rank_exited(void *context, int rank) {
    mpi_world *mw = context;
    fsdp_mpi_works_detach(mw->world_group);
    for (mpi_group *mg = mw->groups; mg; mg = mg->next) fsdp_mpi_works_detach(mg);
    const fsdp_rank_result *res = &mw->world->results[rank];
    mpi_note note = {.status = res->status, .finished = realtime_s()};
    snprintf(note.message, sizeof note.message, "%s", res->message);
    snprintf(note.origin, sizeof note.origin, "%s", res->origin);
    snprintf(note.trail, sizeof note.trail, "%s", res->trail);
    note.calls = res->calls;
    mw->finished[rank] = note.finished;
    mw->noted[rank] = true;
    for (int r = 0; r < mw->size; r++)
        if (r != rank) fsdp_mpi_send_note(mw, mw->comm, r, TAG_EXIT, &note);
}

/* The rank whose exit note says it failed first in time, or -1 when none has. */
static int first_failed(const mpi_world *mw) {
    int first = -1;
    for (int r = 0; r < mw->size; r++) {
        if (!mw->noted[r] || mw->world->results[r].status == FSDP_OK) continue;
        if (first < 0 || mw->finished[r] < mw->finished[first]) first = r;
    }
    return first;
}

/* The grace period after the first failure has passed and the ranks in `list` (n of them)
 * have still not returned: stopped, dead, or stuck in their function. Ends the whole job,
 * saying why; does not return. */
static void abort_job(fsdp_ctx *ctx, const mpi_world *mw, const char *list, int n, int failed) {
    const fsdp_rank_result *res = &mw->world->results[failed];
    char msg[FSDP_ERROR_MAX + 512];
    snprintf(msg, sizeof msg,
             "fsdp_world_run: rank%s %s %s not returned from %s function %d ms (the grace "
             "period) after rank %d failed (rank %d: %.700s); aborting the MPI job (MPI_Abort) "
             "so that no process waits for %s forever",
             n > 1 ? "s" : "", list, n > 1 ? "have" : "has", n > 1 ? "their" : "its",
             mw->world->grace_ms, failed, failed, res->message, n > 1 ? "them" : "it");
    if (ctx && fsdp_ctx_log_level(ctx) <= FSDP_LOG_ERROR)
        fsdp_log(ctx, FSDP_LOG_ERROR, "%s", msg);
    else
        fprintf(stderr, "[fsdp r%d error] %s\n", mw->rank, msg);
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, res->status > 0 ? (int)res->status : 1);
    abort(); /* MPI_Abort does not return */
}

/* Waits for every other rank's exit note, logging the ranks it waits for; orders the failures
 * by the time they happened. Once a rank has failed, the others get the world's grace period
 * to return; after it the job is aborted (abort_job). */
static void mpi_collect_results(fsdp_ctx *ctx, void *context) {
    mpi_world *mw = context;
    fsdp_world *w = mw->world;
    const double every = fsdp_comm_log_every_s(w->timeout_ms);
    double start = fsdp_clock_now(), warned = start, failure_seen = -1;
    for (int polls = 0;; polls++) {
        fsdp_mpi_receive_exit_notes(mw);
        fsdp_mpi_reap_sends(mw);
        int missing = 0;
        for (int r = 0; r < mw->size; r++) missing += !mw->noted[r];
        if (missing == 0) break;
        double t = fsdp_clock_now();
        char list[256];
        fsdp_comm_rank_list(NULL, mw->noted, mw->size, false, list, sizeof list);
        int failed = first_failed(mw);
        if (failed >= 0 && failure_seen < 0) failure_seen = t;
        if (failed >= 0 && t - failure_seen >= 1e-3 * w->grace_ms)
            abort_job(ctx, mw, list, missing, failed);
        if (t - warned >= every) {
            warned = t;
            fsdp_log(ctx, FSDP_LOG_WARN,
                     "fsdp_world_run: rank %d has waited %.0f s for rank%s %s to return from "
                     "its function%s",
                     mw->rank, t - start, missing > 1 ? "s" : "", list,
                     failed >= 0 ? " (some rank has failed: the job ends after the grace period)"
                                 : "");
        }
        fsdp_mpi_pause(polls, t - start);
    }
    int failures = 0;
    for (int r = 0; r < mw->size; r++) {
        w->results[r].failure_order = 0;
        failures += w->results[r].status != FSDP_OK;
    }
    for (int order = 1; order <= failures; order++) {
        int first = -1;
        for (int r = 0; r < mw->size; r++) {
            if (w->results[r].status == FSDP_OK || w->results[r].failure_order) continue;
            if (first < 0 || mw->finished[r] < mw->finished[first]) first = r;
        }
        w->results[first].failure_order = order;
    }
}

static void mpi_free(void *context) {
    mpi_world *mw = context;
    if (!mw) return;
    fsdp_mpi_thread_stop(mw);
    free_run_groups(mw);
    group_state_free(mw->world_group);
    /* A note still in flight (never, in practice: notes are small enough to be sent eagerly)
     * is left to MPI, and its buffer to the graveyard. */
    fsdp_mpi_reap_sends(mw);
    for (pending_send *s = mw->sends, *next; s; s = next) {
        next = s->next;
        MPI_Request_free(&s->req);
        pthread_mutex_lock(&init_mu);
        s->next = graveyard;
        graveyard = s;
        pthread_mutex_unlock(&init_mu);
    }
    free(mw->noted);
    free(mw->finished);
    free(mw);
}

/* ---- the entries, under the process's MPI lock (the communication thread's) ---- */

#define LOCKED(call)                                                                               \
    do {                                                                                           \
        fsdp_mpi_lock();                                                                           \
        fsdp_status st_ = (call);                                                                  \
        fsdp_mpi_unlock();                                                                         \
        return st_;                                                                                \
    } while (0)

static fsdp_status locked_split(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                                const char *agree, fsdp_group_info *out) {
    LOCKED(mpi_split(ctx, parent, color, key, agree, out));
}

static fsdp_status locked_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                     const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    LOCKED(fsdp_mpi_all_gather(ctx, g, out, in, dim, work));
}

static fsdp_status locked_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                         const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                         const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    LOCKED(fsdp_mpi_reduce_scatter(ctx, g, out, in, dim, op, fuse, work));
}

static fsdp_status locked_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t,
                                     fsdp_reduce_op op, const fsdp_reduce_options *fuse,
                                     fsdp_comm_work *work) {
    LOCKED(fsdp_mpi_all_reduce(ctx, g, t, op, fuse, work));
}

static fsdp_status locked_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done) {
    LOCKED(fsdp_mpi_work_test(ctx, work, done));
}

static fsdp_status locked_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work) {
    LOCKED(fsdp_mpi_work_wait(ctx, work));
}

static fsdp_status locked_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                                    fsdp_comm_work *work) {
    LOCKED(fsdp_mpi_broadcast(ctx, g, t, root, work));
}

static fsdp_status locked_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                     const fsdp_tensor *in, int split_dim, int concat_dim,
                                     fsdp_comm_work *work) {
    LOCKED(fsdp_mpi_all_to_all(ctx, g, out, in, split_dim, concat_dim, work));
}

static fsdp_status locked_barrier(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_work *work) {
    LOCKED(fsdp_mpi_barrier(ctx, g, work));
}

static void locked_reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op) {
    fsdp_mpi_lock();
    fsdp_mpi_reject(ctx, g, op);
    fsdp_mpi_unlock();
}

static void locked_reset(void *context) {
    fsdp_mpi_lock();
    mpi_reset(context);
    fsdp_mpi_unlock();
}

static void locked_rank_exited(void *context, int rank) {
    fsdp_mpi_lock();
    mpi_rank_exited(context, rank);
    fsdp_mpi_unlock();
}

static void locked_collect_results(fsdp_ctx *ctx, void *context) {
    fsdp_mpi_lock();
    mpi_collect_results(ctx, context);
    fsdp_mpi_unlock();
}

static const fsdp_comm_backend_i mpi_iface = {
    .name = "mpi",
    .device = FSDP_DEVICE_CPU,
    .hosted_ranks = mpi_hosted_ranks,
    .world_group = mpi_world_group,
    .split = locked_split,
    .all_gather = locked_all_gather,
    .reduce_scatter = locked_reduce_scatter,
    .all_reduce = locked_all_reduce,
    .work_test = locked_work_test,
    .work_wait = locked_work_wait,
    .broadcast = locked_broadcast,
    .all_to_all = locked_all_to_all,
    .barrier = locked_barrier,
    .reject = locked_reject,
    .reset = locked_reset,
    .rank_exited = locked_rank_exited,
    .collect_results = locked_collect_results,
    .free = mpi_free,
};

/* Duplicates MPI_COMM_WORLD, waiting at most timeout_ms for the other processes. */
static fsdp_status dup_world(fsdp_ctx *ctx, int timeout_ms, MPI_Comm *comm) {
    MPI_Request req;
    MPI_TRY(ctx, MPI_Comm_idup(MPI_COMM_WORLD, comm, &req), "fsdp_world_create");
    double start = fsdp_clock_now();
    for (int polls = 0;; polls++) {
        int done = 0;
        MPI_TRY(ctx, MPI_Test(&req, &done, MPI_STATUS_IGNORE), "fsdp_world_create");
        if (done) break;
        double waited = fsdp_clock_now() - start;
        if (waited * 1e3 >= timeout_ms)
            return FSDP_FAIL(ctx, FSDP_ERR_TIMEOUT,
                             "fsdp_world_create: timed out after %d ms waiting for the other "
                             "processes of the MPI job to create the world; every process must "
                             "call fsdp_world_create with the mpi backend, in the same order",
                             timeout_ms);
        fsdp_mpi_back_off(polls, waited);
    }
    MPI_TRY(ctx, MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN), "fsdp_world_create");
    return FSDP_OK;
}

fsdp_status fsdp_mpi_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks) {
    FSDP_TRY_AT(ctx, ensure_initialised(ctx));
    int size = 0, rank = 0;
    MPI_TRY(ctx, MPI_Comm_size(MPI_COMM_WORLD, &size), "fsdp_world_create");
    MPI_TRY(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &rank), "fsdp_world_create");
    if (nranks != 0 && nranks != size)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: nranks is %d but the MPI world has %d process%s; "
                         "pass nranks 0 (the MPI world size) or %d, or start %d processes "
                         "(mpirun -np %d)",
                         nranks, size, size == 1 ? "" : "es", size, nranks, nranks);
    mpi_world *mw = calloc(1, sizeof *mw);
    int *ranks = malloc((size_t)size * sizeof *ranks);
    if (mw) {
        mw->noted = calloc((size_t)size, sizeof *mw->noted);
        mw->finished = calloc((size_t)size, sizeof *mw->finished);
    }
    if (!mw || !ranks || !mw->noted || !mw->finished) {
        free(ranks);
        if (mw) free(mw->noted), free(mw->finished), free(mw);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                         "cannot allocate the MPI backend for %d ranks", size);
    }
    MPI_Comm comm = MPI_COMM_NULL;
    fsdp_status st = dup_world(ctx, world->timeout_ms, &comm);
    for (int r = 0; r < size; r++) ranks[r] = r;
    if (st == FSDP_OK) {
        mw->world_group = group_state_new(mw, comm, size, rank, ranks);
        if (!mw->world_group) {
            MPI_Comm_free(&comm);
            st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                           "cannot allocate the MPI backend for %d ranks", size);
        }
    }
    free(ranks);
    if (st != FSDP_OK) {
        free(mw->noted), free(mw->finished), free(mw);
        return FSDP_PASS(ctx, st);
    }
    mw->world = world;
    mw->comm = comm;
    mw->rank = rank;
    mw->size = size;
    world->size = size;
    world->backend = (fsdp_comm_backend){.iface = mpi_iface, .context = mw};
    st = world->comm_thread ? fsdp_mpi_thread_start(ctx, mw) : FSDP_OK;
    if (st != FSDP_OK) {
        mpi_free(mw);
        world->backend = (fsdp_comm_backend){0};
        return FSDP_PASS(ctx, st);
    }
    return FSDP_OK;
}
