/* train_world.c: fsdp-train's world: train_run makes the world of ranks (rank threads, or this
 * process's rank of an MPI job), checks that the processes agree on the configuration, lays it
 * out, reads the kind's data once per process and runs train_rank on every rank. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_kind.h" // defines: train_kind_of
#include "train_rank.h" // defines: train_rank

typedef struct train_job {
    const train_config *cfg;
    const train_sources *src;
    const void *input; /* the kind's data, read once by this process, or NULL */
    train_layout layout;
    FILE *out;
    bool mpi;
    train_result result; /* rank 0's; under mpi this process's rank's */
    int my_rank;         /* the rank that wrote result */
    fsdp_status my_status;
    char *messages; /* world size x TRAIN_ERROR_SIZE: each hosted rank's message, "" if none */
} train_job;

static fsdp_status rank_main(fsdp_ctx *ctx, int rank, void *user) {
    train_job *job = user;
    train_result res = {.layout = job->layout, .rank = rank};
    char *err = job->messages + (size_t)rank * TRAIN_ERROR_SIZE;
    fsdp_status st = train_rank(ctx, job->cfg, &job->layout, job->src, job->input,
                                rank == 0 ? job->out : NULL, &res, err, TRAIN_ERROR_SIZE);
    /* A failure of the trainer's own (a file, a diverged loss) goes on the context too, so
     * that the world tells the other ranks this one's message; a library failure is there
     * already, with its trail, and the message holds it. */
    if (st != FSDP_OK && err[0] &&
        (fsdp_last_status(ctx) != st || !strstr(err, fsdp_last_error(ctx))))
        fsdp_ctx_set_error(ctx, st, "%s", err);
    if (rank == 0 || job->mpi) {
        job->result = res;
        job->my_rank = rank;
        job->my_status = st;
    }
    return st;
}

/* Under mpi, before anything else: the processes compare their configurations, which each
 * read from its own command line and files (rank threads share one). */
static fsdp_status agree_main(fsdp_ctx *ctx, int rank, void *user) {
    train_job *job = user;
    fsdp_status st = train_config_agree(
        ctx, NULL, job->cfg, job->messages + (size_t)rank * TRAIN_ERROR_SIZE, TRAIN_ERROR_SIZE);
    job->my_rank = rank;
    job->my_status = st;
    return st;
}

/* The message of a failed run, from the ranks this process hosts: the rank that failed first
 * (fsdp_world_run's choice) when it is here, else this process's own rank when it failed the
 * same way (under mpi the other processes' tool messages do not travel), else the library's. */
static void failure_message(fsdp_ctx *ctx, fsdp_world *world, const train_job *job, fsdp_status st,
                            char *err, size_t err_size) {
    const char *library = ctx ? fsdp_last_error(ctx) : "";
    int size = fsdp_world_size(world), failed = -1;
    for (int r = 0; r < size && failed < 0; r++) {
        char text[TRAIN_ERROR_SIZE + 32];
        snprintf(text, sizeof text, "rank %d: %s", r, fsdp_world_rank_error(world, r));
        if (fsdp_world_rank_status(world, r) != FSDP_OK && strcmp(text, library) == 0) failed = r;
    }
    int pick = -1;
    if (failed >= 0 && (!job->mpi || failed == job->my_rank) &&
        job->messages[(size_t)failed * TRAIN_ERROR_SIZE])
        pick = failed;
    else if (job->my_rank >= 0 && job->my_status == st &&
             job->messages[(size_t)job->my_rank * TRAIN_ERROR_SIZE])
        pick = job->my_rank;
    if (pick < 0)
        snprintf(err, err_size, "%s", library);
    else if (size == 1)
        snprintf(err, err_size, "%s", job->messages + (size_t)pick * TRAIN_ERROR_SIZE);
    else
        snprintf(err, err_size, "rank %d: %s", pick,
                 job->messages + (size_t)pick * TRAIN_ERROR_SIZE);
}

static fsdp_status train_run_checked(fsdp_ctx *ctx, const train_config *cfg, FILE *out,
                                     train_result *result, char *err, size_t err_size);

fsdp_status train_run(fsdp_ctx *ctx, const train_config *cfg, FILE *out, train_result *result,
                      char *err, size_t err_size) {
    train_result res = {.rank = -1};
    if (result) *result = res;
    err[0] = '\0';
    if (cfg->log.level != FSDP_LOG_DEBUG && cfg->log.level != FSDP_LOG_INFO) out = NULL;
    /* [model] init's shape taken into a copy (on the heap, large; like the job below, kept
     * when a rank thread is left running) */
    train_config *adopted = malloc(sizeof *adopted);
    bool changed = false;
    if (!adopted) {
        snprintf(err, err_size, "out of memory for the configuration");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    *adopted = *cfg;
    fsdp_status st = train_config_adopt_init(adopted, &changed, err, err_size);
    if (st != FSDP_OK || !changed) free(adopted);
    if (st != FSDP_OK) return st;
    if (changed) cfg = adopted;
    train_result mine;
    st = train_run_checked(ctx, cfg, out, &mine, err, err_size);
    if (result) *result = mine;
    if (changed && !mine.threads_left) free(adopted);
    return st;
}

static fsdp_status train_run_checked(fsdp_ctx *ctx, const train_config *cfg, FILE *out,
                                     train_result *result, char *err, size_t err_size) {
    *result = (train_result){.rank = -1};
    fsdp_status st = train_config_check(cfg, err, err_size);
    if (st != FSDP_OK) return st;
    train_backend backend = train_config_backend(cfg);
    bool mpi = train_backend_processes(backend);
    fsdp_world_options wo = {.backend = train_backend_world(backend),
                             .nranks = mpi ? 0 : train_config_world_size(cfg),
                             .timeout_ms = (int)(cfg->parallel.timeout_s * 1000),
                             .threads_per_rank = (int)cfg->parallel.threads_per_rank,
                             .pin_threads = cfg->parallel.pin_threads,
                             .comm_thread = cfg->parallel.comm_thread,
                             .ctx = train_config_ctx_options(cfg)};
    fsdp_world *world = NULL;
    if ((st = fsdp_world_create(ctx, &wo, &world)) != FSDP_OK) {
        snprintf(err, err_size, "creating the %s world: %s", train_backend_name(backend),
                 ctx ? fsdp_last_error(ctx) : fsdp_status_to_string(st));
        return st;
    }
    int size = fsdp_world_size(world);
    train_job job = {.cfg = cfg, .out = out, .mpi = mpi, .my_rank = -1};
    if (!(job.messages = calloc((size_t)size, TRAIN_ERROR_SIZE))) {
        snprintf(err, err_size, "out of memory for the messages of %d ranks", size);
        st = FSDP_ERR_OUT_OF_MEMORY;
    }
    if (st == FSDP_OK && mpi && size > 1 &&
        (st = fsdp_world_run(ctx, world, agree_main, &job)) != FSDP_OK) {
        /* every process has the same message: rank 0 tells it (result.rank) */
        const char *mine =
            job.my_rank >= 0 ? job.messages + (size_t)job.my_rank * TRAIN_ERROR_SIZE : "";
        if (*mine)
            snprintf(err, err_size, "%s", mine);
        else
            failure_message(ctx, world, &job, st, err, err_size);
        if (result) result->rank = job.my_rank;
    } else if (st == FSDP_OK && mpi && cfg->parallel.ranks > 0 && cfg->parallel.ranks != size) {
        snprintf(err, err_size,
                 "[parallel] ranks = %lld (%s), but mpirun started %d processes; under mpi the "
                 "process count decides: set ranks = 0 (or %d), or start %lld processes "
                 "(mpirun -np %lld)",
                 (long long)cfg->parallel.ranks, train_config_origin(cfg, "parallel", "ranks"),
                 size, size, (long long)cfg->parallel.ranks, (long long)cfg->parallel.ranks);
        st = FSDP_ERR_CONFIG;
    } else if (st == FSDP_OK) {
        st = train_layout_resolve(cfg, size, &job.layout, err, err_size);
    }
    int lock = -1; /* [checkpoint] dir, claimed before anything reads or writes it */
    if (st == FSDP_OK && cfg->checkpoint.dir[0] && fsdp_world_hosts_rank(world, 0))
        st = train_ckpt_claim_dir(cfg, &lock, err, err_size);
    train_sources src; /* resolved once per process: the ranks only read it */
    memset(&src, 0, sizeof src);
    job.src = &src;
    if (st == FSDP_OK) st = train_sources_resolve(ctx, cfg, &src, err, err_size);
    const train_kind *kind = train_kind_of(cfg);
    void *input = NULL;
    if (st == FSDP_OK && kind->load) st = kind->load(cfg, &input, err, err_size);
    job.input = input;
    int left = 0;
    if (st == FSDP_OK) {
        job.my_rank = -1;
        /* on the heap: a rank thread left running may write to it after this returns */
        train_job *run = malloc(sizeof *run);
        if (run) *run = job;
        st = run ? fsdp_world_run(ctx, world, rank_main, run) : FSDP_ERR_OUT_OF_MEMORY;
        if (run) job = *run;
        if (st != FSDP_OK && run) failure_message(ctx, world, &job, st, err, err_size);
        if (!run) snprintf(err, err_size, "out of memory for the run of %d ranks", size);
        left = fsdp_world_threads_left(world);
        if (result) *result = job.result, result->threads_left = left;
        if (!left) free(run);
    }
    if (left) { /* a thread left running may still read what the job points to: nothing is
                   freed (src lives in this frame: the process must end now) */
        fsdp_world_free(world);
        return st;
    }
    train_sources_free(&src);
    if (input) kind->unload(input);
    free(job.messages);
    fsdp_world_free(world);
    train_ckpt_release_dir(lock);
    return st;
}
