/* world.c: the world: choosing a backend from the table of those built, running one function
 * per rank this process hosts (each on its own context bound to the world), collecting what
 * the ranks returned, and the context accessors. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
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
    default:
        return "unknown";
    }
}

fsdp_status fsdp_world_create(fsdp_ctx *ctx, const fsdp_world_options *opts, fsdp_world **out) {
    if (!out) return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_world_create: out is NULL");
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
    if (!entry)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "fsdp_world_create: the '%s' backend is not part of this build (it is "
                         "planned, not written yet); use FSDP_BACKEND_LOCAL",
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
    if (o.threads_per_rank < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: threads_per_rank is %d; use 1 or more, or 0 for "
                         "the BLAS threads shared out among the rank threads",
                         o.threads_per_rank);
    if ((int)o.ctx.log_level < 0 || o.ctx.log_level > FSDP_LOG_OFF)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: unknown log level %d in the rank context options",
                         (int)o.ctx.log_level);
    fsdp_world *w = calloc(1, sizeof *w);
    if (!w) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a world");
    w->kind = o.backend;
    w->timeout_ms = o.timeout_ms ? o.timeout_ms : FSDP_COMM_DEFAULT_TIMEOUT_MS;
    w->threads_per_rank = o.threads_per_rank;
    w->ctx_options = o.ctx;
    atomic_init(&w->running, false);
    atomic_init(&w->failures, 0);
    fsdp_status st = entry->create(ctx, w, o.nranks); /* sets w->size */
    if (st != FSDP_OK) {
        free(w);
        return st;
    }
    w->results = calloc((size_t)w->size, sizeof *w->results);
    if (!w->results) {
        int size = w->size;
        fsdp_world_free(w);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a world of %d ranks", size);
    }
    for (int r = 0; r < w->size; r++) atomic_init(&w->results[r].exited, false);
    *out = w;
    return FSDP_OK;
}

void fsdp_world_free(fsdp_world *world) {
    if (!world) return;
    if (world->backend.iface.free) world->backend.iface.free(world->backend.context);
    free(world->results);
    free(world);
}

int fsdp_world_size(const fsdp_world *world) {
    return world ? world->size : 0;
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
        return st;
    }
    b->world_group->borrowed = true;
    b->world = world;
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

typedef struct rank_job {
    fsdp_world *world;
    int rank;
    fsdp_rank_fn fn;
    void *user;
} rank_job;

/* Records what a rank returned (its context's failure, when it recorded one) and tells the
 * backend it has gone. */
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
    atomic_store(&res->exited, true);
    if (w->backend.iface.rank_exited) w->backend.iface.rank_exited(w->backend.context, rank);
}

/* A failure of the world's own, raised here, for finish_rank. */
static fsdp_error_record world_failure(fsdp_status st, int line, const char *message) {
    fsdp_error_record e = {.status = st};
    snprintf(e.message, sizeof e.message, "%s", message);
    snprintf(e.origin, sizeof e.origin, "src/comm/world.c:%d", line);
    snprintf(e.trail, sizeof e.trail, "%s", e.origin);
    return e;
}

static void run_rank(const rank_job *job) {
    fsdp_world *w = job->world;
    fsdp_ctx_options o = w->ctx_options;
    o.rank = job->rank;
    fsdp_ctx *ctx = NULL;
    fsdp_status st = fsdp_ctx_create(&o, &ctx);
    if (st != FSDP_OK) {
        fsdp_error_record e = world_failure(st, __LINE__, "cannot create the rank's context");
        finish_rank(w, job->rank, st, &e);
        return;
    }
    st = bind(ctx, w, job->rank);
    if (st == FSDP_OK) st = job->fn(ctx, job->rank, job->user);
    finish_rank(w, job->rank, st, st != FSDP_OK ? fsdp_error_of(ctx) : NULL);
    fsdp_ctx_free(ctx);
}

static void *rank_thread(void *arg) {
    run_rank(arg);
    return NULL;
}

fsdp_status fsdp_world_run(fsdp_ctx *ctx, fsdp_world *world, fsdp_rank_fn fn, void *user) {
    if (!world || !fn)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_world_run: %s is NULL",
                         world ? "fn" : "world");
    if (atomic_exchange(&world->running, true))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_world_run: this world is already running; runs of one world "
                         "happen one after another");
    if (world->backend.iface.reset) world->backend.iface.reset(world->backend.context);
    atomic_store(&world->failures, 0);
    for (int r = 0; r < world->size; r++) {
        fsdp_rank_result *res = &world->results[r];
        atomic_store(&res->exited, false);
        res->status = FSDP_OK;
        res->failure_order = 0;
        res->message[0] = res->origin[0] = '\0';
    }
    int first = 0, count = 0;
    world->backend.iface.hosted_ranks(world->backend.context, &first, &count);
    rank_job *jobs = calloc((size_t)count, sizeof *jobs);
    pthread_t *threads = calloc((size_t)count, sizeof *threads);
    bool *started = calloc((size_t)count, sizeof *started);
    if (!jobs || !threads || !started) {
        free(jobs), free(threads), free(started);
        atomic_store(&world->running, false);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_world_run: cannot start %d ranks",
                         count);
    }
    for (int i = 0; i < count; i++)
        jobs[i] = (rank_job){.world = world, .rank = first + i, .fn = fn, .user = user};
    /* The first hosted rank runs on this thread, the others on their own, each with its share
     * of the BLAS threads. */
    fsdp_kernels_cpu_threads_enter(count, world->threads_per_rank);
    for (int i = 1; i < count; i++) {
        int err = pthread_create(&threads[i], NULL, rank_thread, &jobs[i]);
        started[i] = err == 0;
        if (err) {
            char message[160];
            snprintf(message, sizeof message, "cannot start the thread of rank %d (%s)",
                     jobs[i].rank, strerror(err));
            fsdp_error_record e = world_failure(FSDP_ERR_INTERNAL, __LINE__, message);
            finish_rank(world, jobs[i].rank, FSDP_ERR_INTERNAL, &e);
        }
    }
    if (count > 0) run_rank(&jobs[0]);
    for (int i = 1; i < count; i++)
        if (started[i]) pthread_join(threads[i], NULL);
    fsdp_kernels_cpu_threads_leave();
    free(jobs), free(threads), free(started);
    if (world->backend.iface.collect_results)
        world->backend.iface.collect_results(ctx, world->backend.context);

    const fsdp_rank_result *first_failure = NULL;
    int failed_rank = -1;
    for (int r = 0; r < world->size; r++) {
        const fsdp_rank_result *res = &world->results[r];
        if (res->status == FSDP_OK) continue;
        if (!first_failure || res->failure_order < first_failure->failure_order)
            first_failure = res, failed_rank = r;
    }
    atomic_store(&world->running, false);
    if (!first_failure) return FSDP_OK;
    /* The rank's failure, crossing into the caller's context: "rank R: " in front, its
     * origin kept, and this line in front of its trail. */
    if (!ctx) return first_failure->status;
    fsdp_error_record e = {.status = first_failure->status};
    snprintf(e.message, sizeof e.message, "rank %d: %.1000s", failed_rank, first_failure->message);
    snprintf(e.origin, sizeof e.origin, "%s", first_failure->origin);
    snprintf(e.trail, sizeof e.trail, "%s", first_failure->trail);
    fsdp_error_restore(ctx, &e);
    return fsdp_error_hop(ctx, e.status, __FILE__, __LINE__, NULL);
}
