/* world.c: the world: choosing a backend from the table of those built, running one function
 * per rank this process hosts (each on its own context bound to the world), collecting what
 * the ranks returned, the grace period after a failure (a rank thread that has not returned
 * by then is left running, detached), and the context accessors. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h> // defines: sysconf

#include "comm/comm_impl.h"
#include "core/clock.h"
#include "core/error.h"
#include "kernels/kernels.h" // defines: fsdp_kernels_cpu_threads_enter

/* The backends this build has. One that is not listed is refused with a message. */
static const struct backend_entry {
    fsdp_backend kind;
    fsdp_status (*create)(fsdp_ctx *ctx, fsdp_world *world, int nranks);
} backends[] = {
    {FSDP_BACKEND_LOCAL, fsdp_local_backend_create},
#ifdef FSDP_HAVE_MPI
    {FSDP_BACKEND_MPI, fsdp_mpi_backend_create},
#endif
#ifdef FSDP_HAVE_NCCL
    {FSDP_BACKEND_NCCL, fsdp_nccl_backend_create},
#endif
#if defined(FSDP_HAVE_NCCL) && defined(FSDP_HAVE_MPI)
    {FSDP_BACKEND_NCCL_MPI, fsdp_nccl_mpi_backend_create},
#endif
};

static const struct backend_entry *find_backend(fsdp_backend kind) {
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (backends[i].kind == kind) return &backends[i];
    return NULL;
}

bool fsdp_backend_available(fsdp_backend backend) {
    return find_backend(backend) != NULL;
}

const char *fsdp_backend_to_string(fsdp_backend backend) {
    switch (backend) {
    case FSDP_BACKEND_LOCAL:
        return "local";
    case FSDP_BACKEND_MPI:
        return "mpi";
    case FSDP_BACKEND_NCCL:
        return "nccl";
    case FSDP_BACKEND_NCCL_MPI:
        return "nccl-mpi";
    default:
        return "unknown";
    }
}

/* The grace period when the options leave it 0: FSDP_COMM_GRACE_ENV (milliseconds, > 0),
 * else the larger of the timeout and FSDP_COMM_MIN_DEFAULT_GRACE_MS. */
static int default_grace(int timeout_ms) {
    const char *env = getenv(FSDP_COMM_GRACE_ENV);
    char *end = NULL;
    errno = 0;
    long v = env && *env ? strtol(env, &end, 10) : 0;
    if (env && *env && !errno && !*end && v > 0 && v <= INT_MAX) return (int)v;
    return timeout_ms > FSDP_COMM_MIN_DEFAULT_GRACE_MS ? timeout_ms
                                                       : FSDP_COMM_MIN_DEFAULT_GRACE_MS;
}

/* Whether FSDP_COMM_THREAD_ENV asks for the mpi backend's communication thread. */
static bool comm_thread_env(void) {
    const char *env = getenv(FSDP_COMM_THREAD_ENV);
    return env && strcmp(env, "1") == 0;
}

fsdp_status fsdp_world_create(fsdp_ctx *ctx, const fsdp_world_options *opts, fsdp_world **out) {
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    fsdp_world_options o = opts ? *opts : (fsdp_world_options){0};
    if ((int)o.backend < 0 || o.backend >= FSDP_BACKEND_COUNT)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: unknown backend %d; use FSDP_BACKEND_LOCAL",
                         (int)o.backend);
    const struct backend_entry *entry = find_backend(o.backend);
    if (!entry && o.backend == FSDP_BACKEND_MPI)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "fsdp_world_create: the 'mpi' backend is not part of this build (CMake "
                         "found no MPI, or FSDP_WITH_MPI is OFF); install an MPI (Debian: "
                         "libopenmpi-dev openmpi-bin) and reconfigure, or use FSDP_BACKEND_LOCAL");
    if (!entry && o.backend == FSDP_BACKEND_NCCL)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "fsdp_world_create: the 'nccl' backend is not part of this build (it "
                         "needs CUDA and NCCL: CMake found no NCCL, or FSDP_CUDA or FSDP_NCCL is "
                         "OFF); install NCCL and reconfigure, or use FSDP_BACKEND_LOCAL");
    if (!entry && o.backend == FSDP_BACKEND_NCCL_MPI)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "fsdp_world_create: the 'nccl-mpi' backend is not part of this build (it "
                         "needs both the mpi and the nccl backends: CUDA, NCCL and an MPI); "
                         "install what is missing and reconfigure, or use FSDP_BACKEND_MPI");
    if (!entry)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "fsdp_world_create: the '%s' backend is not part of this build; use "
                         "FSDP_BACKEND_LOCAL",
                         fsdp_backend_to_string(o.backend));
    if (o.nranks < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: nranks is %d; use 1 or more (0 means 1, or under MPI "
                         "the MPI world size)",
                         o.nranks);
    if (o.timeout_ms < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: timeout_ms is %d; use a positive number of "
                         "milliseconds (0 means %d)",
                         o.timeout_ms, FSDP_COMM_DEFAULT_TIMEOUT_MS);
    if (o.grace_ms < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: grace_ms is %d; use a positive number of "
                         "milliseconds (0 means the %s environment variable, else timeout_ms "
                         "but at least %d)",
                         o.grace_ms, FSDP_COMM_GRACE_ENV, FSDP_COMM_MIN_DEFAULT_GRACE_MS);
    if (o.threads_per_rank < 0 || o.threads_per_rank > FSDP_MAX_THREADS_PER_RANK)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: threads_per_rank is %d; use 1 to %d, or 0 for "
                         "the cores shared out among the rank threads",
                         o.threads_per_rank, FSDP_MAX_THREADS_PER_RANK);
    if (o.comm_thread && o.backend != FSDP_BACKEND_MPI)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: comm_thread is on for the '%s' backend, but only the "
                         "'mpi' backend has a communication thread (the local backend completes "
                         "calls on host tensors in their start); leave comm_thread false",
                         fsdp_backend_to_string(o.backend));
    if ((int)o.ctx.log_level < 0 || o.ctx.log_level > FSDP_LOG_OFF)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: unknown log level %d in the rank context options",
                         (int)o.ctx.log_level);
    fsdp_world *w = calloc(1, sizeof *w);
    if (!w) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a world");
    if (pthread_mutex_init(&w->run_mu, NULL) != 0) {
        free(w);
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "cannot create the world's mutex");
    }
    pthread_condattr_t attr;
    bool cv_ok = pthread_condattr_init(&attr) == 0;
    cv_ok = cv_ok && pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
            pthread_cond_init(&w->run_cv, &attr) == 0;
    if (cv_ok) pthread_condattr_destroy(&attr);
    if (!cv_ok) {
        pthread_mutex_destroy(&w->run_mu);
        free(w);
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "cannot create the world's condition variable");
    }
    w->kind = o.backend;
    w->timeout_ms = o.timeout_ms ? o.timeout_ms : FSDP_COMM_DEFAULT_TIMEOUT_MS;
    w->grace_ms = o.grace_ms ? o.grace_ms : default_grace(w->timeout_ms);
    w->threads_per_rank = o.threads_per_rank;
    w->pin_threads = o.pin_threads;
    w->comm_thread = o.backend == FSDP_BACKEND_MPI && (o.comm_thread || comm_thread_env());
    w->ctx_options = o.ctx;
    const char *dir = o.trace_dir ? o.trace_dir : getenv(FSDP_COMM_TRACE_DIR_ENV);
    if (dir && *dir && !(w->trace_dir = strdup(dir))) {
        pthread_mutex_destroy(&w->run_mu);
        pthread_cond_destroy(&w->run_cv);
        free(w);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot copy the world's trace_dir");
    }
    atomic_init(&w->running, false);
    atomic_init(&w->failures, 0);
    atomic_init(&w->refs, 1);
    fsdp_status st = entry->create(ctx, w, o.nranks); /* sets w->size */
    if (st != FSDP_OK) {
        pthread_mutex_destroy(&w->run_mu);
        pthread_cond_destroy(&w->run_cv);
        free(w->trace_dir);
        free(w);
        return FSDP_PASS(ctx, st);
    }
    w->results = calloc((size_t)w->size, sizeof *w->results);
    if (!w->results) {
        int size = w->size;
        fsdp_world_free(w);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a world of %d ranks", size);
    }
    for (int r = 0; r < w->size; r++) {
        atomic_init(&w->results[r].exited, false);
        atomic_init(&w->results[r].left_running, false);
    }
    int first = 0, count = 0;
    w->backend.iface.hosted_ranks(w->backend.context, &first, &count);
    w->traces = calloc((size_t)w->size, sizeof *w->traces);
    bool traced = w->traces != NULL;
    for (int r = first; traced && r < first + count; r++) {
        w->traces[r] = fsdp_trace_ring_new();
        traced = w->traces[r] != NULL;
    }
    if (!traced) {
        int size = w->size;
        fsdp_world_free(w);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                         "cannot allocate the collective records of a world of %d ranks", size);
    }
    *out = w;
    return FSDP_OK;
}

static void world_destroy(fsdp_world *world) {
    if (world->backend.iface.free) world->backend.iface.free(world->backend.context);
    pthread_mutex_destroy(&world->run_mu);
    pthread_cond_destroy(&world->run_cv);
    free(world->results);
    for (int r = 0; world->traces && r < world->size; r++) fsdp_trace_ring_free(world->traces[r]);
    free(world->traces);
    free(world->trace_dir);
    free(world);
}

/* Drops a reference: the caller's (fsdp_world_free) or a left-running rank thread's. */
static void world_release(fsdp_world *world) {
    if (atomic_fetch_sub(&world->refs, 1) == 1) world_destroy(world);
}

void fsdp_world_free(fsdp_world *world) {
    if (world) world_release(world);
}

int fsdp_world_size(const fsdp_world *world) {
    return world ? world->size : 0;
}
bool fsdp_world_hosts_rank(const fsdp_world *world, int rank) {
    if (!world) return false;
    int first = 0, count = 0;
    world->backend.iface.hosted_ranks(world->backend.context, &first, &count);
    return rank >= first && rank < first + count;
}
int fsdp_world_timeout_ms(const fsdp_world *world) {
    return world ? world->timeout_ms : 0;
}
bool fsdp_world_comm_thread(const fsdp_world *world) {
    return world && world->comm_thread;
}
fsdp_backend fsdp_world_backend(const fsdp_world *world) {
    return world->kind;
}

fsdp_status fsdp_world_rank_status(const fsdp_world *world, int rank) {
    if (!world || rank < 0 || rank >= world->size) return FSDP_ERR_INVALID_ARGUMENT;
    return world->results[rank].status;
}
const char *fsdp_world_rank_error(const fsdp_world *world, int rank) {
    if (!world || rank < 0 || rank >= world->size) return "";
    return world->results[rank].message;
}

/* ---- binding a rank's context ---- */

static void binding_release(void *comm) {
    fsdp_comm_binding *b = comm;
    fsdp_group_destroy(b->world_group);
    fsdp_comm_debug_release(&b->debug);
    free(b);
}

static fsdp_status bind(fsdp_ctx *ctx, fsdp_world *world, int rank) {
    fsdp_comm_binding *b = calloc(1, sizeof *b);
    if (!b)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate rank %d's binding", rank);
    fsdp_group_info info;
    world->backend.iface.world_group(world->backend.context, rank, &info);
    fsdp_status st = fsdp_group_make(ctx, world, &info, "world", &b->world_group);
    if (st != FSDP_OK) {
        free(b);
        return FSDP_PASS(ctx, st);
    }
    b->world_group->borrowed = true;
    b->world_group->id = 1;
    b->world = world;
    b->trace = world->traces[rank];
    ctx->comm = b;
    ctx->comm_release = binding_release;
    return FSDP_OK;
}

fsdp_world *fsdp_ctx_world(const fsdp_ctx *ctx) {
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    return b ? b->world : NULL;
}

fsdp_group *fsdp_ctx_world_group(const fsdp_ctx *ctx) {
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    return b ? b->world_group : NULL;
}

/* ---- running the ranks ---- */

/* A rank's job. Its state is RUNNING until its function returns, then FINISHING while the
 * rank records its result (the run waits for that); or ABANDONED, set by the run when the
 * grace period after the first failure has passed without the rank returning: its thread is
 * detached, owns the job, and when its function returns at last it records nothing and drops
 * its reference to the world. */
enum { JOB_RUNNING, JOB_FINISHING, JOB_ABANDONED };

typedef struct rank_job {
    fsdp_world *world;
    int rank;
    fsdp_rank_fn fn;
    void *user;
    atomic_int state;
    bool started; /* on a thread of its own */
    pthread_t thread;
} rank_job;

/* Records what a rank returned (its context's failure, when it recorded one), tells the
 * backend it has gone, and the run that it has returned. */
static void finish_rank(fsdp_world *w, int rank, fsdp_status st, const fsdp_error_record *err) {
    fsdp_rank_result *res = &w->results[rank];
    res->status = st;
    if (st != FSDP_OK) {
        res->failure_order = atomic_fetch_add(&w->failures, 1) + 1;
        const bool has = err && err->status != FSDP_OK && err->message[0];
        snprintf(res->message, sizeof res->message, "%s",
                 has ? err->message : "(the function set no message)");
        snprintf(res->origin, sizeof res->origin, "%s", err ? err->origin : "");
        snprintf(res->trail, sizeof res->trail, "%s", err ? err->trail : "");
    }
    fsdp_trace_counts_of(w->traces[rank], &res->calls);
    atomic_store(&res->exited, true);
    if (w->backend.iface.rank_exited) w->backend.iface.rank_exited(w->backend.context, rank);
    pthread_mutex_lock(&w->run_mu);
    if (st != FSDP_OK && w->first_failure_at == 0) {
        w->first_failure_at = fsdp_clock_now();
        w->first_failed = rank;
    }
    w->run_left--;
    pthread_cond_broadcast(&w->run_cv);
    pthread_mutex_unlock(&w->run_mu);
}

/* A failure of the world's own, raised here, for finish_rank. */
static fsdp_error_record world_failure(fsdp_status st, int line, const char *message) {
    fsdp_error_record e = {.status = st};
    snprintf(e.message, sizeof e.message, "%s", message);
    snprintf(e.origin, sizeof e.origin, "src/comm/world.c:%d", line);
    snprintf(e.trail, sizeof e.trail, "%s", e.origin);
    return e;
}

/* Runs the rank's function on its own context, under its rank in log lines, and records the
 * result; a rank the run has given up on (ABANDONED) records nothing and lets go of the world
 * and its job. */
static void run_rank(rank_job *job) {
    fsdp_world *w = job->world;
    int previous = fsdp_log_thread_rank_swap(job->rank);
    fsdp_ctx_options o = w->ctx_options;
    o.rank = job->rank;
    fsdp_ctx *ctx = NULL;
    /* The rank's own threads: the k-th rank on this machine on CPUs [k T, (k + 1) T) when
     * pinned. */
    const int threads = w->rank_threads;
    const int slot = w->pin_slot0 + job->rank - w->first_hosted;
    fsdp_kernels_cpu_workers_start(threads, w->pin_threads ? slot * threads : -1);
    fsdp_status st = fsdp_ctx_create(&o, &ctx);
    fsdp_error_record e = {0};
    if (st != FSDP_OK) {
        e = world_failure(st, __LINE__, "cannot create the rank's context");
    } else {
        st = bind(ctx, w, job->rank);
        if (st == FSDP_OK) st = job->fn(ctx, job->rank, job->user);
        if (st != FSDP_OK) e = *fsdp_error_of(ctx);
    }
    int running = JOB_RUNNING;
    if (atomic_compare_exchange_strong(&job->state, &running, JOB_FINISHING)) {
        fsdp_kernels_cpu_workers_stop();
        finish_rank(w, job->rank, st, st != FSDP_OK ? &e : NULL);
        fsdp_ctx_free(ctx);
    } else {
        fsdp_ctx_free(ctx);
        fsdp_kernels_cpu_workers_stop();
        pthread_mutex_lock(&w->run_mu);
        w->abandoned--;
        atomic_store(&w->results[job->rank].left_running, false);
        pthread_mutex_unlock(&w->run_mu);
        free(job);
        world_release(w);
    }
    fsdp_log_thread_rank_swap(previous);
}

static void *rank_thread(void *arg) {
    run_rank(arg);
    return NULL;
}

static struct timespec monotonic_at(double s) {
    struct timespec t = {.tv_sec = (time_t)s};
    t.tv_nsec = (long)((s - (double)t.tv_sec) * 1e9);
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

/* Waits until every rank thread has returned, or the grace period after the first failure
 * has passed: the threads still running then are detached (ABANDONED) and reported in their
 * rank's result. Returns how many were left running. */
static int supervise(fsdp_world *w, rank_job **jobs, int count) {
    pthread_mutex_lock(&w->run_mu);
    while (w->run_left > 0) {
        if (w->first_failure_at == 0) {
            pthread_cond_wait(&w->run_cv, &w->run_mu);
            continue;
        }
        double until = w->first_failure_at + 1e-3 * w->grace_ms;
        if (fsdp_clock_now() >= until) break;
        struct timespec t = monotonic_at(until);
        pthread_cond_timedwait(&w->run_cv, &w->run_mu, &t);
    }
    int left = 0;
    for (int i = 0; i < count; i++) {
        int running = JOB_RUNNING;
        if (!jobs[i]->started ||
            !atomic_compare_exchange_strong(&jobs[i]->state, &running, JOB_ABANDONED))
            continue;
        fsdp_rank_result *res = &w->results[jobs[i]->rank];
        res->status = FSDP_ERR_TIMEOUT;
        res->failure_order = atomic_fetch_add(&w->failures, 1) + 1;
        snprintf(res->message, sizeof res->message,
                 "has not returned from its function %d ms (the grace period) after rank %d "
                 "failed: its thread is still running, detached. The world stays allocated "
                 "until the thread returns and cannot run again before; what the function "
                 "uses (user) must stay valid as long",
                 w->grace_ms, w->first_failed);
        snprintf(res->origin, sizeof res->origin, "src/comm/world.c:%d", __LINE__);
        snprintf(res->trail, sizeof res->trail, "%s", res->origin);
        atomic_store(&res->left_running, true);
        w->abandoned++;
        atomic_fetch_add(&w->refs, 1); /* the thread's, dropped when it returns */
        pthread_detach(jobs[i]->thread);
        jobs[i] = NULL; /* the thread's now */
        left++;
    }
    pthread_mutex_unlock(&w->run_mu);
    for (int i = 0; i < count; i++)
        if (jobs[i] && jobs[i]->started) pthread_join(jobs[i]->thread, NULL);
    return left;
}

int fsdp_world_threads_left(fsdp_world *world) {
    if (!world) return 0;
    pthread_mutex_lock(&world->run_mu);
    int n = world->abandoned;
    pthread_mutex_unlock(&world->run_mu);
    return n;
}

/* Refuses a run while a thread left running by an earlier run still uses the world. */
static fsdp_status check_no_thread_left(fsdp_ctx *ctx, fsdp_world *world) {
    int abandoned = fsdp_world_threads_left(world);
    if (abandoned == 0) return FSDP_OK;
    bool *left = calloc((size_t)world->size, sizeof *left);
    char list[256] = "?";
    int n = abandoned;
    if (left) {
        for (int r = 0; r < world->size; r++)
            left[r] = atomic_load(&world->results[r].left_running);
        n = fsdp_comm_rank_list(NULL, left, world->size, true, list, sizeof list);
        free(left);
    }
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "fsdp_world_run: rank%s %s's thread, left running by an earlier run of this "
                     "world after its grace period, %s not returned from its function yet; the "
                     "world cannot run again until %s (create a new world instead)",
                     n > 1 ? "s" : "", list, n > 1 ? "have" : "has",
                     n > 1 ? "they have" : "it has");
}

/* Starts the jobs: one hosted rank runs on the calling thread; several run on threads of
 * their own while the calling thread watches them (supervise), so that the run can end
 * without a rank that never returns. Returns how many threads were left running. */
static int run_jobs(fsdp_world *world, rank_job **jobs, int count) {
    if (count == 1) {
        run_rank(jobs[0]);
        return 0;
    }
    for (int i = 0; i < count; i++) {
        int err = pthread_create(&jobs[i]->thread, NULL, rank_thread, jobs[i]);
        jobs[i]->started = err == 0;
        if (err) {
            char message[160];
            snprintf(message, sizeof message, "cannot start the thread of rank %d (%s)",
                     jobs[i]->rank, strerror(err));
            fsdp_error_record e = world_failure(FSDP_ERR_INTERNAL, __LINE__, message);
            finish_rank(world, jobs[i]->rank, FSDP_ERR_INTERNAL, &e);
        }
    }
    return supervise(world, jobs, count);
}

/* fsdp_world_run's answer: FSDP_OK, or the first failure in time, crossing into the
 * caller's context: "rank R: " in front, its origin kept, and this line in front of its
 * trail; the ranks whose threads were left running (`left` of them) are named after it. */
static fsdp_status report(fsdp_ctx *ctx, fsdp_world *world, int left) {
    const fsdp_rank_result *first_failure = NULL;
    int failed_rank = -1;
    bool *stuck = left ? calloc((size_t)world->size, sizeof *stuck) : NULL;
    for (int r = 0; r < world->size; r++) {
        const fsdp_rank_result *res = &world->results[r];
        if (stuck) stuck[r] = atomic_load(&res->left_running);
        if (res->status == FSDP_OK) continue;
        if (!first_failure || res->failure_order < first_failure->failure_order)
            first_failure = res, failed_rank = r;
    }
    char list[256] = "";
    int n = stuck ? fsdp_comm_rank_list(NULL, stuck, world->size, true, list, sizeof list) : 0;
    free(stuck);
    atomic_store(&world->running, false);
    if (!first_failure) return FSDP_OK;
    if (n > 0)
        fsdp_log(ctx, FSDP_LOG_ERROR,
                 "fsdp_world_run: rank%s %s %s not returned from %s function %d ms (the grace "
                 "period) after rank %d failed; the run ends without %s: %s thread%s %s still "
                 "running, detached, and the world stays allocated until %s returned",
                 n > 1 ? "s" : "", list, n > 1 ? "have" : "has", n > 1 ? "their" : "its",
                 world->grace_ms, failed_rank, n > 1 ? "them" : "it", n > 1 ? "their" : "its",
                 n > 1 ? "s" : "", n > 1 ? "are" : "is", n > 1 ? "they have" : "it has");
    if (!ctx) return first_failure->status;
    fsdp_error_record e = {.status = first_failure->status};
    if (n > 0)
        snprintf(e.message, sizeof e.message,
                 "rank %d: %.700s; and rank%s %.100s %s not returned from %s function %d ms "
                 "after that (the grace period): left running, detached",
                 failed_rank, first_failure->message, n > 1 ? "s" : "", list,
                 n > 1 ? "have" : "has", n > 1 ? "their" : "its", world->grace_ms);
    else
        snprintf(e.message, sizeof e.message, "rank %d: %.1000s", failed_rank,
                 first_failure->message);
    snprintf(e.origin, sizeof e.origin, "%s", first_failure->origin);
    snprintf(e.trail, sizeof e.trail, "%s", first_failure->trail);
    fsdp_error_restore(ctx, &e);
    return fsdp_error_hop(ctx, e.status, __FILE__, __LINE__, __func__, NULL);
}

/* How many ranks share this machine's cores (*sharing) and where this process's first rank
 * is among them (*slot0, for pinning): the local backend's ranks are all here; under MPI the
 * launcher's node-local size and rank (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE and _RANK,
 * MPICH's MPI_LOCALNRANKS and MPI_LOCALRANKID) times the ranks each process hosts, else this
 * process alone. */
static void node_share(const fsdp_world *w, int count, int *sharing, int *slot0) {
    *sharing = count;
    *slot0 = 0;
    if (w->kind != FSDP_BACKEND_MPI && w->kind != FSDP_BACKEND_NCCL_MPI) return;
    const char *size = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const char *rank = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!size || !rank) size = getenv("MPI_LOCALNRANKS"), rank = getenv("MPI_LOCALRANKID");
    long n = size ? strtol(size, NULL, 10) : 0, r = rank ? strtol(rank, NULL, 10) : -1;
    if (n >= 1 && n <= FSDP_LOCAL_MAX_RANKS && r >= 0 && r < n) {
        *sharing = (int)n * count;
        *slot0 = (int)r * count;
    }
}

fsdp_status fsdp_world_run(fsdp_ctx *ctx, fsdp_world *world, fsdp_rank_fn fn, void *user) {
    FSDP_ARG_NOT_NULL(ctx, world);
    FSDP_ARG_NOT_NULL(ctx, fn);
    if (atomic_exchange(&world->running, true))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_world_run: this world is already running; runs of one world "
                         "happen one after another");
    fsdp_status st = check_no_thread_left(ctx, world);
    if (st != FSDP_OK) {
        atomic_store(&world->running, false);
        return FSDP_PASS(ctx, st);
    }
    if (world->backend.iface.reset) world->backend.iface.reset(world->backend.context);
    atomic_store(&world->failures, 0);
    for (int r = 0; r < world->size; r++) {
        fsdp_rank_result *res = &world->results[r];
        atomic_store(&res->exited, false);
        res->status = FSDP_OK;
        res->failure_order = 0;
        res->message[0] = res->origin[0] = '\0';
        fsdp_trace_ring_clear(world->traces[r]);
    }
    int first = 0, count = 0;
    world->backend.iface.hosted_ranks(world->backend.context, &first, &count);
    world->run_left = count;
    world->first_failure_at = 0;
    rank_job **jobs = calloc((size_t)count, sizeof *jobs);
    bool allocated = jobs != NULL;
    for (int i = 0; allocated && i < count; i++) {
        jobs[i] = malloc(sizeof *jobs[i]);
        allocated = jobs[i] != NULL;
        if (allocated) {
            *jobs[i] = (rank_job){.world = world, .rank = first + i, .fn = fn, .user = user};
            atomic_init(&jobs[i]->state, JOB_RUNNING);
        }
    }
    if (!allocated) {
        for (int i = 0; jobs && i < count; i++) free(jobs[i]);
        free(jobs);
        atomic_store(&world->running, false);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_world_run: cannot start %d ranks",
                         count);
    }
    /* Under MPI the calling thread is the process's rank, also while it collects the other
     * processes' results: its log lines name that rank. */
    const int previous = fsdp_log_thread_rank_swap(count == 1 ? first : -1);
    /* Each rank thread runs its kernels on its share of the threads. */
    int sharing = count;
    node_share(world, count, &sharing, &world->pin_slot0);
    world->first_hosted = first;
    world->rank_threads = fsdp_kernels_cpu_threads_enter(sharing, world->threads_per_rank);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (world->threads_per_rank > 0 && cores > 0 && (long)sharing * world->rank_threads > cores)
        fsdp_log(ctx, FSDP_LOG_WARN,
                 "fsdp_world_run: %d rank%s x %d threads_per_rank = %ld threads on %ld cores: "
                 "they time-share; leave threads_per_rank 0 to share the cores out",
                 sharing, sharing > 1 ? "s" : "", world->rank_threads,
                 (long)sharing * world->rank_threads, cores);
    int left = run_jobs(world, jobs, count);
    fsdp_kernels_cpu_threads_leave();
    for (int i = 0; i < count; i++) free(jobs[i]);
    free(jobs);
    if (world->backend.iface.collect_results)
        world->backend.iface.collect_results(ctx, world->backend.context);
    fsdp_log_thread_rank_swap(previous);
    return report(ctx, world, left);
}
