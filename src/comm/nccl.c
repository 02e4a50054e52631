/* nccl.c: the nccl backend: rank threads of one process (the local backend's, which judge every
 * call at their rendezvous and move host tensors) with one NCCL communicator per rank and group
 * for device tensors. The world's communicator is made from one unique id shared in memory
 * (ncclCommInitRank on each rank thread at its first device collective), each split's by
 * ncclCommSplit of its parent's. A device call enqueues NCCL's work on the rank's communication
 * stream after the caller's stream; a blocking call then polls its end against the world's
 * deadline and the communicator's asynchronous error, and on either aborts the communicator
 * (ncclCommAbort) and fails naming the rank and the call, so nothing waits forever. Every
 * message names the library ("NCCL 2.28.9", or a stand-in's name). docs/comm.md. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/nccl_impl.h"
#include "core/clock.h"
#include "core/device.h"
#include "core/error.h"

static atomic_bool skip_ready_wait;

void fsdp_nccl_test_skip_ready_wait(bool on) {
    atomic_store(&skip_ready_wait, on);
}

/* ---- groups ---- */

static nccl_group *group_of(const fsdp_group *g) {
    return g->state;
}

fsdp_group fsdp_nccl_host_view(const fsdp_group *g) {
    fsdp_group h = *g;
    h.state = group_of(g)->lg;
    return h;
}

/* The group state over lg (made once, by whichever member comes first). NULL: out of memory. */
static nccl_group *group_for(nccl_world *nw, local_group *lg) {
    pthread_mutex_lock(&nw->mu);
    nccl_group *ng = nw->groups;
    while (ng && ng->lg != lg) ng = ng->next;
    if (!ng && (ng = calloc(1, sizeof *ng)) != NULL) {
        ng->comms = calloc((size_t)lg->size, sizeof *ng->comms);
        if (!ng->comms) {
            free(ng);
            ng = NULL;
        } else {
            ng->nw = nw;
            ng->lg = lg;
            ng->size = lg->size;
            ng->next = nw->groups;
            nw->groups = ng;
        }
    }
    pthread_mutex_unlock(&nw->mu);
    return ng;
}

static void group_free(nccl_group *ng) {
    const fsdp_nccl_lib *lib = ng->nw->lib;
    for (int m = 0; m < ng->size; m++)
        if (ng->comms[m]) (void)lib->CommDestroy(ng->comms[m]);
    free(ng->comms);
    free(ng);
}

/* ---- failures ---- */

static const char *call_name(const nccl_call *c) {
    return fsdp_call_op_name(c->op);
}

static int world_rank(const fsdp_group *g) {
    return g->ranks[g->rank];
}

/* Aborts this member's communicator and poisons the group with the failure in ctx, so that the
 * peers fail at their next meeting instead of waiting. */
static void abort_comm(nccl_call *c, fsdp_status st) {
    if (c->ng->comms[c->g->rank]) {
        (void)c->lib->CommAbort(c->ng->comms[c->g->rank]);
        c->ng->comms[c->g->rank] = NULL;
    }
    fsdp_group hv = fsdp_nccl_host_view(c->g);
    fsdp_local_poison(&hv, st, fsdp_error_of(c->ctx)->message);
}

fsdp_status fsdp_nccl_fail(nccl_call *c, const char *what, ncclResult_t r) {
    fsdp_status st = FSDP_FAIL(c->ctx, FSDP_ERR_COMM,
                               "%s: %s on group %s failed on rank %d: %s returned %d (%s); the "
                               "communicator was aborted. Rerun with NCCL_DEBUG=WARN to see why",
                               c->lib->name, call_name(c), c->g->desc, world_rank(c->g), what,
                               (int)r, c->lib->GetErrorString(r));
    abort_comm(c, st);
    return st;
}

ncclDataType_t fsdp_nccl_dtype(fsdp_dtype d) {
    switch (d) {
    case FSDP_DTYPE_BF16:
        return ncclBfloat16;
    case FSDP_DTYPE_F16:
        return ncclFloat16;
    case FSDP_DTYPE_I32:
        return ncclInt32;
    default:
        return ncclFloat32;
    }
}

/* ---- a call ---- */

/* This member's communicator on the group: the world's is made at its first use. */
static fsdp_status member_comm(nccl_call *c) {
    nccl_group *ng = c->ng;
    const int m = c->g->rank;
    if (!ng->comms[m] && ng == ng->nw->world_group) {
        ncclResult_t r = c->lib->CommInitRank(&ng->comms[m], ng->size, ng->nw->id, m);
        if (r != ncclSuccess) {
            ng->comms[m] = NULL;
            return fsdp_nccl_fail(c, "ncclCommInitRank", r);
        }
    }
    if (!ng->comms[m])
        return FSDP_FAIL(c->ctx, FSDP_ERR_STATE,
                         "%s: %s on group %s: rank %d has no communicator on the group (an "
                         "earlier failure aborted it); make a new world",
                         c->lib->name, call_name(c), c->g->desc, world_rank(c->g));
    c->comm = ng->comms[m];
    return FSDP_OK;
}

/* Posts a rejection for this member (its failure is in ctx) so the peers fail naming it. */
static fsdp_status reject(nccl_call *c, fsdp_status st) {
    fsdp_error_record own;
    fsdp_error_save(c->ctx, &own);
    fsdp_call rej = {.op = c->op, .rejected = st, .reject_msg = own.message};
    fsdp_group hv = fsdp_nccl_host_view(c->g);
    (void)fsdp_local_rendezvous(c->ctx, &hv, c->op, &rej);
    fsdp_error_restore(c->ctx, &own);
    return FSDP_PASS(c->ctx, st);
}

fsdp_status fsdp_nccl_call_begin(nccl_call *c, fsdp_ctx *ctx, fsdp_group *g, fsdp_device dev,
                                 const fsdp_call *post) {
    nccl_group *ng = group_of(g);
    *c = (nccl_call){.ctx = ctx, .g = g, .ng = ng, .lib = ng->nw->lib, .op = post->op, .dev = dev};
    c->rec = fsdp_device_for(dev.type);
    c->caller = fsdp_stream_current(dev);
    c->ready = c->end = (fsdp_event){dev, NULL};
    fsdp_status st = FSDP_OK;
    if (dev.type != c->lib->device)
        st = FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                       "%s: %s on group %s: rank %d's tensors are on %s:%d, and %s moves %s "
                       "memory; move the tensors to the rank's %s device, or use the local "
                       "backend",
                       c->lib->name, call_name(c), g->desc, world_rank(g),
                       fsdp_device_to_string(dev), dev.index, c->lib->name,
                       fsdp_device_to_string((fsdp_device){c->lib->device, 0}),
                       fsdp_device_to_string((fsdp_device){c->lib->device, 0}));
    if (st == FSDP_OK) st = fsdp_ctx_comm_stream(ctx, &c->comm_stream);
    if (st == FSDP_OK) st = fsdp_event_create(ctx, dev, &c->ready);
    if (st == FSDP_OK) st = fsdp_event_create(ctx, dev, &c->end);
    if (st != FSDP_OK) {
        fsdp_event_destroy(c->ready);
        fsdp_event_destroy(c->end);
        return reject(c, st);
    }
    fsdp_group hv = fsdp_nccl_host_view(g);
    st = fsdp_local_rendezvous(ctx, &hv, post->op, post);
    if (st == FSDP_OK) st = member_comm(c);
    if (st == FSDP_OK) st = fsdp_event_record(ctx, c->ready, c->caller);
    if (st == FSDP_OK && !atomic_load(&skip_ready_wait))
        st = fsdp_stream_wait(ctx, c->comm_stream, c->ready);
    if (st != FSDP_OK) {
        fsdp_event_destroy(c->ready);
        fsdp_event_destroy(c->end);
        return FSDP_PASS(ctx, st);
    }
    c->saved = fsdp_stream_set_current(c->comm_stream);
    c->deadline = fsdp_clock_now() + 1e-3 * g->world->timeout_ms;
    return FSDP_OK;
}

fsdp_status fsdp_nccl_call_launched(nccl_call *c, fsdp_status st) {
    (void)fsdp_stream_set_current(c->saved);
    if (st == FSDP_OK) st = fsdp_event_record(c->ctx, c->end, c->comm_stream);
    if (st != FSDP_OK) {
        fsdp_event_destroy(c->ready);
        fsdp_event_destroy(c->end);
        c->ready.handle = c->end.handle = NULL;
    }
    return FSDP_PASS(c->ctx, st);
}

/* One look at the call: *done when its end has passed; a failure (asynchronous error, or the
 * deadline passed) aborts the communicator. */
static fsdp_status poll_once(nccl_call *c, bool *done) {
    *done = fsdp_event_query(c->end);
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = c->lib->CommGetAsyncError(c->comm, &async);
    if (r != ncclSuccess) return fsdp_nccl_fail(c, "ncclCommGetAsyncError", r);
    if (async != ncclSuccess && async != ncclInProgress) {
        fsdp_status st = FSDP_FAIL(
            c->ctx, FSDP_ERR_COMM,
            "%s: %s on group %s failed on rank %d: the communicator reported an asynchronous "
            "error %d (%s); the communicator was aborted. A peer process died or its network "
            "failed: see its own message, and rerun with NCCL_DEBUG=WARN",
            c->lib->name, call_name(c), c->g->desc, world_rank(c->g), (int)async,
            c->lib->GetErrorString(async));
        abort_comm(c, st);
        *done = true;
        return st;
    }
    if (*done || fsdp_clock_now() < c->deadline) return FSDP_OK;
    fsdp_status st = FSDP_FAIL(
        c->ctx, FSDP_ERR_TIMEOUT,
        "%s: %s on group %s timed out after %d ms on rank %d: every rank posted the call, but "
        "it did not complete on this rank's communication stream (a peer stopped inside it, or "
        "its device or network hangs); the communicator was aborted. Rerun with NCCL_DEBUG=WARN",
        c->lib->name, call_name(c), c->g->desc, c->g->world->timeout_ms, world_rank(c->g));
    abort_comm(c, st);
    *done = true;
    return st;
}

static fsdp_status poll_until_done(nccl_call *c) {
    long sleep_ns = 20000;
    for (;;) {
        bool done = false;
        FSDP_TRY_AT(c->ctx, poll_once(c, &done));
        if (done) return FSDP_OK;
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000) sleep_ns *= 2;
    }
}

static void call_release(nccl_call *c) {
    fsdp_event_destroy(c->ready);
    fsdp_event_destroy(c->end);
    c->ready.handle = c->end.handle = NULL;
}

fsdp_status fsdp_nccl_call_finish(nccl_call *c) {
    fsdp_status st = poll_until_done(c);
    if (st == FSDP_OK) st = fsdp_stream_wait(c->ctx, c->caller, c->end);
    call_release(c);
    return FSDP_PASS(c->ctx, st);
}

/* ---- works ---- */

typedef struct nccl_work {
    nccl_call call;
} nccl_work;

static void nccl_work_free(void *state) {
    nccl_work *w = state;
    if (!w) return;
    call_release(&w->call);
    free(w);
}

fsdp_status fsdp_nccl_call_to_work(nccl_call *c, fsdp_comm_work *work) {
    if (work->state && work->free_state) work->free_state(work->state);
    work->state = NULL;
    work->free_state = NULL;
    nccl_work *w = malloc(sizeof *w);
    if (!w) {
        fsdp_status st = poll_until_done(c); /* nobody would wait for it otherwise */
        call_release(c);
        FSDP_TRY_AT(c->ctx, st);
        return FSDP_FAIL(c->ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a comm work");
    }
    w->call = *c;
    work->state = w;
    work->free_state = nccl_work_free;
    return FSDP_OK;
}

static nccl_work *work_of(const fsdp_comm_work *work) {
    return work->free_state == nccl_work_free ? work->state : NULL;
}

static fsdp_status nccl_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done) {
    nccl_work *w = work_of(work);
    if (!w) return fsdp_local_work_test(ctx, work, done);
    w->call.ctx = ctx;
    return poll_once(&w->call, done);
}

static fsdp_status nccl_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work) {
    nccl_work *w = work_of(work);
    if (!w) return fsdp_local_work_wait(ctx, work);
    w->call.ctx = ctx;
    return poll_until_done(&w->call);
}

/* The stream wait comes after the host has seen the call end (or fail): a call that never ends
 * must fail here rather than leave the stream waiting forever. */
static fsdp_status nccl_work_wait_stream(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream) {
    nccl_work *w = work_of(work);
    if (!w) return fsdp_local_work_wait_stream(ctx, work, stream);
    w->call.ctx = ctx;
    FSDP_TRY_AT(ctx, poll_until_done(&w->call));
    return fsdp_stream_wait(ctx, stream, w->call.end);
}

/* ---- the vtable: device tensors to NCCL, the rest to the local backend ---- */

static nccl_world *world_of(const fsdp_group *g) {
    return group_of(g)->nw;
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
    nccl_group *child = out->state ? group_for(nw, out->state) : NULL;
    if (out->state && !child)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an NCCL group state");
    /* Every member of the parent takes part in ncclCommSplit, also those left out. */
    nccl_call c = {
        .ctx = ctx, .g = parent, .ng = group_of(parent), .lib = nw->lib, .op = FSDP_OP_SPLIT};
    FSDP_TRY_AT(ctx, member_comm(&c));
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

static fsdp_status nccl_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                   const fsdp_tensor *in, int dim) {
    if (on_device(out)) return fsdp_nccl_all_gather(ctx, g, out, in, dim);
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->all_gather(ctx, &hv, out, in, dim);
}

static fsdp_status nccl_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                       const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                       const fsdp_reduce_options *fuse) {
    if (on_device(out)) return fsdp_nccl_reduce_scatter(ctx, g, out, in, dim, op, fuse);
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->reduce_scatter(ctx, &hv, out, in, dim, op, fuse);
}

static fsdp_status nccl_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                                   const fsdp_reduce_options *fuse) {
    if (on_device(t)) return fsdp_nccl_all_reduce(ctx, g, t, op, fuse, NULL);
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->all_reduce(ctx, &hv, t, op, fuse);
}

static fsdp_status nccl_all_reduce_start(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t,
                                         fsdp_reduce_op op, const fsdp_reduce_options *fuse,
                                         fsdp_comm_work *work) {
    if (on_device(t)) return fsdp_nccl_all_reduce(ctx, g, t, op, fuse, work);
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->all_reduce_start(ctx, &hv, t, op, fuse, work);
}

static fsdp_status nccl_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root) {
    if (on_device(t)) return fsdp_nccl_broadcast(ctx, g, t, root);
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->broadcast(ctx, &hv, t, root);
}

static fsdp_status nccl_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                   const fsdp_tensor *in, int split_dim, int concat_dim) {
    if (on_device(out)) return fsdp_nccl_all_to_all(ctx, g, out, in, split_dim, concat_dim);
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->all_to_all(ctx, &hv, out, in, split_dim, concat_dim);
}

/* A barrier has no tensors: the rank threads meet at the local rendezvous. */
static fsdp_status nccl_barrier(fsdp_ctx *ctx, fsdp_group *g) {
    fsdp_group hv = fsdp_nccl_host_view(g);
    return HOST(g)->barrier(ctx, &hv);
}

static void nccl_reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op) {
    fsdp_group hv = fsdp_nccl_host_view(g);
    HOST(g)->reject(ctx, &hv, op);
}

static void nccl_reset(void *context) {
    nccl_world *nw = context;
    if (nw->host.iface.reset) nw->host.iface.reset(nw->host.context);
}

static void nccl_rank_exited(void *context, int rank) {
    nccl_world *nw = context;
    if (nw->host.iface.rank_exited) nw->host.iface.rank_exited(nw->host.context, rank);
}

static void nccl_free(void *context) {
    nccl_world *nw = context;
    if (!nw) return;
    nccl_group *ng = nw->groups;
    while (ng) {
        nccl_group *next = ng->next;
        group_free(ng);
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
    .all_reduce_start = nccl_all_reduce_start,
    .work_test = nccl_work_test,
    .work_wait = nccl_work_wait,
    .work_wait_stream = nccl_work_wait_stream,
    .reject = nccl_reject,
    .reset = nccl_reset,
    .rank_exited = nccl_rank_exited,
    .free = nccl_free,
};

fsdp_status fsdp_nccl_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks) {
    const fsdp_nccl_lib *lib = NULL;
    FSDP_TRY_AT(ctx, fsdp_nccl_library_open(ctx, &lib));
    nccl_world *nw = calloc(1, sizeof *nw);
    if (!nw) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate the nccl backend");
    pthread_mutex_init(&nw->mu, NULL);
    nw->world = world;
    nw->lib = lib;
    ncclResult_t r = lib->GetUniqueId(&nw->id);
    if (r != ncclSuccess) {
        pthread_mutex_destroy(&nw->mu);
        free(nw);
        return FSDP_FAIL(ctx, FSDP_ERR_COMM,
                         "%s: ncclGetUniqueId returned %d (%s); rerun with NCCL_DEBUG=WARN to "
                         "see why",
                         lib->name, (int)r, lib->GetErrorString(r));
    }
    fsdp_status st = fsdp_local_backend_create(ctx, world, nranks);
    if (st != FSDP_OK) {
        pthread_mutex_destroy(&nw->mu);
        free(nw);
        return FSDP_PASS(ctx, st);
    }
    nw->host = world->backend;
    fsdp_group_info info = {0};
    nw->host.iface.world_group(nw->host.context, 0, &info);
    nw->world_group = group_for(nw, info.state);
    world->backend = (fsdp_comm_backend){.iface = nccl_iface, .context = nw};
    if (!nw->world_group) {
        nccl_free(nw);
        world->backend = (fsdp_comm_backend){0};
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate the nccl backend");
    }
    return FSDP_OK;
}
