/* nccl.c: the nccl backend: the ranks of a host backend (the local backend's rank threads, or
 * the mpi backend's processes, mpi_nccl.c; it judges every call and moves host tensors) with one
 * NCCL communicator per rank and group for device tensors. The world's communicator is made
 * from one unique id (shared in memory by rank threads, broadcast over MPI to processes;
 * ncclCommInitRank on each rank at its first device collective), each split's by ncclCommSplit
 * of its parent's. A device call enqueues NCCL's work on the rank's communication
 * stream after the caller's stream; a blocking call then polls its end against the world's
 * deadline and the communicator's asynchronous error, and on either aborts the communicator
 * (ncclCommAbort) and fails naming the rank and the call, so nothing waits forever. Every
 * message names the library ("NCCL 2.28.9", or a stand-in's name). docs/comm.md. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/nccl_impl.h"
#include "core/clock.h"
#include "core/device.h"
#include "core/error.h"

/* ---- the vtable: device tensors to NCCL, the rest to the local backend ---- */

static nccl_world *world_of(const fsdp_group *g) {
    return fsdp_nccl_group_of(g)->nw;
}

#define HOST(g) (&world_of(g)->host.iface)

static void nccl_hosted_ranks(void *context, int *first, int *count) {
    nccl_world *nw = context;
    nw->host.iface.hosted_ranks(nw->host.context, first, count);
}

static void nccl_world_group(void *context, int rank, fsdp_group_info *out) {
    nccl_world *nw = context;
    nw->host.iface.world_group(nw->host.context, rank, out);
    out->state = nw->world_group;
}

static fsdp_status nccl_split(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                              const char *agree, fsdp_group_info *out) {
    nccl_world *nw = world_of(parent);
    fsdp_group hv = fsdp_nccl_host_view(parent);
    FSDP_TRY_AT(ctx, HOST(parent)->split(ctx, &hv, color, key, agree, out));
    nccl_group *child = out->state ? fsdp_nccl_group_for(nw, out->state, out->size) : NULL;
    if (out->state && !child)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an NCCL group state");
    /* Every member of the parent takes part in ncclCommSplit, also those left out. */
    nccl_call c = {.ctx = ctx,
                   .g = parent,
                   .ng = fsdp_nccl_group_of(parent),
                   .lib = nw->lib,
                   .op = FSDP_OP_SPLIT};
    FSDP_TRY_AT(ctx, fsdp_nccl_member_comm(&c));
    ncclComm_t comm = NULL;
    ncclResult_t r =
        nw->lib->CommSplit(c.comm, child ? color : NCCL_SPLIT_NOCOLOR, key, &comm, NULL);
    if (r != ncclSuccess) return fsdp_nccl_fail(&c, "ncclCommSplit", r);
    if (child) child->comms[out->rank] = comm;
    if (child) out->state = child;
    return FSDP_OK;
}

static fsdp_status nccl_share_shards(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *shard,
                                     fsdp_tensor **full) {
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->share_shards(ctx, &hv, shard, full);
}

static bool on_device(const fsdp_tensor *t) {
    return fsdp_tensor_device(t).type != FSDP_DEVICE_CPU;
}

/* A start (work) on host tensors goes to the host backend with the handle kept in the group
 * state (its works may keep it, as the mpi backend's all_reduce does). */
static fsdp_group *host_view(const fsdp_group *g, fsdp_group *hv, const fsdp_comm_work *work) {
    if (work) return fsdp_nccl_host_view_kept(g);
    *hv = fsdp_nccl_host_view(g);
    return hv;
}

static fsdp_status nccl_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                   const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    if (on_device(out)) return fsdp_nccl_all_gather(ctx, g, out, in, dim, work);
    fsdp_group hv;
    return HOST(g)->all_gather(ctx, host_view(g, &hv, work), out, in, dim, work);
}

static fsdp_status nccl_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                       const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                       const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    if (on_device(out)) return fsdp_nccl_reduce_scatter(ctx, g, out, in, dim, op, fuse, work);
    fsdp_group hv;
    return HOST(g)->reduce_scatter(ctx, host_view(g, &hv, work), out, in, dim, op, fuse, work);
}

static fsdp_status nccl_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                                   const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    if (on_device(t)) return fsdp_nccl_all_reduce(ctx, g, t, op, fuse, work);
    fsdp_group hv;
    return HOST(g)->all_reduce(ctx, host_view(g, &hv, work), t, op, fuse, work);
}

static fsdp_status nccl_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                                  fsdp_comm_work *work) {
    if (on_device(t)) return fsdp_nccl_broadcast(ctx, g, t, root, work);
    fsdp_group hv;
    return HOST(g)->broadcast(ctx, host_view(g, &hv, work), t, root, work);
}

static fsdp_status nccl_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                   const fsdp_tensor *in, int split_dim, int concat_dim,
                                   fsdp_comm_work *work) {
    if (on_device(out)) return fsdp_nccl_all_to_all(ctx, g, out, in, split_dim, concat_dim, work);
    fsdp_group hv;
    return HOST(g)->all_to_all(ctx, host_view(g, &hv, work), out, in, split_dim, concat_dim, work);
}

/* A barrier has no tensors: the ranks meet in the host backend. */
static fsdp_status nccl_barrier(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_work *work) {
    fsdp_group hv;
    return HOST(g)->barrier(ctx, host_view(g, &hv, work), work);
}

static void nccl_reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op) {
    fsdp_group hv = fsdp_nccl_host_view(g);
    HOST(g)->reject(ctx, &hv, op);
}

static void nccl_reset(void *context) {
    nccl_world *nw = context;
    if (nw->ops.groups_per_run) { /* no rank runs now: the groups are nobody's */
        for (nccl_group **at = &nw->groups; *at;) {
            nccl_group *ng = *at;
            if (ng == nw->world_group) {
                at = &ng->next;
                continue;
            }
            *at = ng->next;
            fsdp_nccl_group_free(ng);
        }
    }
    if (nw->host.iface.reset) nw->host.iface.reset(nw->host.context);
}

static void nccl_rank_exited(void *context, int rank) {
    nccl_world *nw = context;
    if (nw->host.iface.rank_exited) nw->host.iface.rank_exited(nw->host.context, rank);
}

static void nccl_collect_results(fsdp_ctx *ctx, void *context) {
    nccl_world *nw = context;
    nw->host.iface.collect_results(ctx, nw->host.context);
}

static void nccl_free(void *context) {
    nccl_world *nw = context;
    if (!nw) return;
    nccl_group *ng = nw->groups;
    while (ng) {
        nccl_group *next = ng->next;
        fsdp_nccl_group_free(ng);
        ng = next;
    }
    if (nw->host.iface.free) nw->host.iface.free(nw->host.context);
    pthread_mutex_destroy(&nw->mu);
    free(nw);
}

static const fsdp_comm_backend_i nccl_iface = {
    .name = "nccl",
    .device = FSDP_DEVICE_CPU,
    .moves_devices = true,
    .hosted_ranks = nccl_hosted_ranks,
    .world_group = nccl_world_group,
    .split = nccl_split,
    .share_shards = nccl_share_shards,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .all_to_all = nccl_all_to_all,
    .barrier = nccl_barrier,
    .work_test = fsdp_nccl_work_test,
    .work_wait = fsdp_nccl_work_wait,
    .work_wait_stream = fsdp_nccl_work_wait_stream,
    .reject = nccl_reject,
    .reset = nccl_reset,
    .rank_exited = nccl_rank_exited,
    .free = nccl_free,
};

fsdp_status fsdp_nccl_id_fail(fsdp_ctx *ctx, const fsdp_nccl_lib *lib, ncclResult_t r) {
    return FSDP_FAIL(ctx, FSDP_ERR_COMM,
                     "%s: ncclGetUniqueId returned %d (%s); rerun with NCCL_DEBUG=WARN to see why",
                     lib->name, (int)r, lib->GetErrorString(r));
}

fsdp_status fsdp_nccl_backend_wrap(fsdp_ctx *ctx, fsdp_world *world, const nccl_host_ops *ops,
                                   const fsdp_nccl_lib *lib, const ncclUniqueId *id) {
    nccl_world *nw = calloc(1, sizeof *nw);
    if (!nw) {
        if (world->backend.iface.free) world->backend.iface.free(world->backend.context);
        world->backend = (fsdp_comm_backend){0};
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate the nccl backend");
    }
    pthread_mutex_init(&nw->mu, NULL);
    nw->world = world;
    nw->lib = lib;
    nw->ops = *ops;
    nw->id = *id;
    nw->host = world->backend;
    fsdp_group_info info = {0};
    nw->host.iface.world_group(nw->host.context, 0, &info);
    nw->world_group = fsdp_nccl_group_for(nw, info.state, info.size);
    fsdp_comm_backend_i iface = nccl_iface;
    if (nw->host.iface.collect_results) iface.collect_results = nccl_collect_results;
    world->backend = (fsdp_comm_backend){.iface = iface, .context = nw};
    if (!nw->world_group) {
        nccl_free(nw);
        world->backend = (fsdp_comm_backend){0};
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate the nccl backend");
    }
    return FSDP_OK;
}

static fsdp_status local_arrive(fsdp_ctx *ctx, const fsdp_group *hv, const fsdp_call *mine) {
    return fsdp_local_rendezvous(ctx, hv, mine->op, mine);
}

fsdp_status fsdp_nccl_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks) {
    const fsdp_nccl_lib *lib = NULL;
    FSDP_TRY_AT(ctx, fsdp_nccl_library_open(ctx, &lib));
    ncclUniqueId id;
    ncclResult_t r = lib->GetUniqueId(&id);
    if (r != ncclSuccess) return fsdp_nccl_id_fail(ctx, lib, r);
    FSDP_TRY_AT(ctx, fsdp_local_backend_create(ctx, world, nranks));
    static const nccl_host_ops ops = {.arrive = local_arrive, .poison = fsdp_local_poison};
    return fsdp_nccl_backend_wrap(ctx, world, &ops, lib, &id);
}
