/* bench_world.h: the world of a benchmark that runs on rank threads or, under mpirun, as
 * MPI processes: a context, the world, and this process's rank. */
#ifndef FSDP_BENCH_WORLD_H
#define FSDP_BENCH_WORLD_H

#include <stdbool.h>
#include <stdio.h>

#include "fsdp/fsdp.h"

static inline fsdp_status bench_world_tell_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)ctx;
    *(int *)user = rank;
    return FSDP_OK;
}

/* Creates *ctx and *world: `ranks` rank threads, or with mpi one rank per MPI process (*rank
 * this process's; 0 on rank threads). On failure prints "<name>: <error>" and returns false. */
static inline bool bench_world_open(const char *name, bool mpi, int ranks, fsdp_ctx **ctx,
                                    fsdp_world **world, int *rank) {
    *rank = 0;
    if (fsdp_ctx_create(NULL, ctx) != FSDP_OK) {
        fprintf(stderr, "%s: cannot create a context\n", name);
        return false;
    }
    fsdp_world_options o = {.backend = mpi ? FSDP_BACKEND_MPI : FSDP_BACKEND_LOCAL,
                            .nranks = mpi ? 0 : ranks};
    if (fsdp_world_create(*ctx, &o, world) != FSDP_OK ||
        (mpi && fsdp_world_run(*ctx, *world, bench_world_tell_rank, rank) != FSDP_OK)) {
        fprintf(stderr, "%s: %s\n", name, fsdp_last_error(*ctx));
        return false;
    }
    return true;
}

#endif
