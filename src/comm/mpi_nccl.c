/* mpi_nccl.c: the nccl backend with one process per rank (FSDP_BACKEND_NCCL_MPI, under mpirun):
 * the mpi backend is its host backend (it judges every call by its descriptor exchange, moves
 * host tensors, times out naming the rank), and the world's ncclUniqueId is made by rank 0 and
 * broadcast over MPI while the world is created. Built with both MPI and NCCL. docs/comm.md. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <string.h>

#include "comm/mpi_impl.h"
#include "comm/nccl_impl.h"
#include "core/error.h"

static fsdp_status mpi_arrive(fsdp_ctx *ctx, const fsdp_group *hv, const fsdp_call *mine) {
    return fsdp_mpi_arrive(ctx, hv, mine);
}

static void mpi_poison(const fsdp_group *hv, fsdp_status status, const char *msg) {
    fsdp_mpi_poison(hv->state, status, msg);
}

/* What rank 0 sends: ncclGetUniqueId's result, and the id when it succeeded. */
typedef struct id_note {
    int32_t result, pad;
    ncclUniqueId id;
} id_note;

/* Rank 0's id to every process over comm, waiting at most timeout_ms (a process that never
 * creates its world must not leave the others waiting). */
static fsdp_status broadcast_id(fsdp_ctx *ctx, MPI_Comm comm, int rank, int timeout_ms,
                                id_note *note) {
    MPI_Request req;
    MPI_TRY(ctx, MPI_Ibcast(note, (int)sizeof *note, MPI_BYTE, 0, comm, &req),
            "fsdp_world_create (the NCCL unique id)");
    const double start = fsdp_clock_now();
    for (int polls = 0;; polls++) {
        int done = 0;
        MPI_TRY(ctx, MPI_Test(&req, &done, MPI_STATUS_IGNORE),
                "fsdp_world_create (the NCCL unique id)");
        if (done) return FSDP_OK;
        const double waited = fsdp_clock_now() - start;
        if (waited * 1e3 >= timeout_ms) {
            /* MPI has no way to withdraw a collective: the request is left to MPI. */
            return FSDP_FAIL(
                ctx, FSDP_ERR_TIMEOUT,
                "fsdp_world_create: rank %d timed out after %d ms waiting for the NCCL "
                "unique id from rank 0; every process must create the world with "
                "the nccl-mpi backend, in the same order",
                rank, timeout_ms);
        }
        fsdp_mpi_back_off(polls, waited);
    }
}

fsdp_status fsdp_nccl_mpi_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks) {
    const fsdp_nccl_lib *lib = NULL;
    FSDP_TRY_AT(ctx, fsdp_nccl_library_open(ctx, &lib));
    FSDP_TRY_AT(ctx, fsdp_mpi_backend_create(ctx, world, nranks));
    const mpi_world *mw = world->backend.context;
    id_note note = {0};
    if (mw->rank == 0) note.result = (int32_t)lib->GetUniqueId(&note.id);
    fsdp_status st = broadcast_id(ctx, mw->comm, mw->rank, world->timeout_ms, &note);
    if (st == FSDP_OK && note.result != ncclSuccess) {
        if (mw->rank == 0)
            st = fsdp_nccl_id_fail(ctx, lib, (ncclResult_t)note.result);
        else
            st = FSDP_FAIL(ctx, FSDP_ERR_COMM,
                           "%s: rank 0 could not make the world's unique id (ncclGetUniqueId "
                           "returned %d: %s); see rank 0's message, and rerun with "
                           "NCCL_DEBUG=WARN",
                           lib->name, (int)note.result,
                           lib->GetErrorString((ncclResult_t)note.result));
    }
    if (st != FSDP_OK) {
        world->backend.iface.free(world->backend.context);
        world->backend = (fsdp_comm_backend){0};
        return FSDP_PASS(ctx, st);
    }
    static const nccl_host_ops ops = {
        .arrive = mpi_arrive, .poison = mpi_poison, .groups_per_run = true};
    return fsdp_nccl_backend_wrap(ctx, world, &ops, lib, &note.id);
}
