/* nccl_call.c: the life of one call on the nccl backend's device path: the group states and
 * each member's communicator, the start (device check, the host backend's judging, the
 * communication stream after the caller's), the end polled against the deadline and the
 * communicator's asynchronous error (a failure aborts the communicator, ncclCommAbort, and names
 * the rank and the call), and the works of non-blocking calls. nccl.c (the vtable and the world)
 * and nccl_collectives.c (the NCCL calls) use it; it calls neither. docs/comm.md. */
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

nccl_group *fsdp_nccl_group_of(const fsdp_group *g) {
    return g->state;
}

fsdp_group fsdp_nccl_host_view(const fsdp_group *g) {
    fsdp_group h = *g;
    h.state = fsdp_nccl_group_of(g)->host;
    return h;
}

fsdp_group *fsdp_nccl_host_view_kept(const fsdp_group *g) {
    fsdp_group *kept = &fsdp_nccl_group_of(g)->views[g->rank];
    *kept = fsdp_nccl_host_view(g);
    return kept;
}

nccl_group *fsdp_nccl_group_for(nccl_world *nw, void *host, int size) {
    pthread_mutex_lock(&nw->mu);
    nccl_group *ng = nw->groups;
    while (ng && ng->host != host) ng = ng->next;
    if (!ng && (ng = calloc(1, sizeof *ng)) != NULL) {
        ng->comms = calloc((size_t)size, sizeof *ng->comms);
        ng->views = calloc((size_t)size, sizeof *ng->views);
        if (!ng->comms || !ng->views) {
            free(ng->comms);
            free(ng->views);
            free(ng);
            ng = NULL;
        } else {
            ng->nw = nw;
            ng->host = host;
            ng->size = size;
            ng->next = nw->groups;
            nw->groups = ng;
        }
    }
    pthread_mutex_unlock(&nw->mu);
    return ng;
}

void fsdp_nccl_group_free(nccl_group *ng) {
    const fsdp_nccl_lib *lib = ng->nw->lib;
    for (int m = 0; m < ng->size; m++)
        if (ng->comms[m]) (void)lib->CommDestroy(ng->comms[m]);
    free(ng->comms);
    free(ng->views);
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
    c->ng->nw->ops.poison(&hv, st, fsdp_error_of(c->ctx)->message);
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
fsdp_status fsdp_nccl_member_comm(nccl_call *c) {
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
    (void)c->ng->nw->ops.arrive(c->ctx, &hv, &rej);
    fsdp_error_restore(c->ctx, &own);
    return FSDP_PASS(c->ctx, st);
}

fsdp_status fsdp_nccl_call_begin(nccl_call *c, fsdp_ctx *ctx, fsdp_group *g, fsdp_device dev,
                                 const fsdp_call *post) {
    nccl_group *ng = fsdp_nccl_group_of(g);
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
    st = ng->nw->ops.arrive(ctx, &hv, post);
    if (st == FSDP_OK) st = fsdp_nccl_member_comm(c);
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
    work->pending = true;
    return FSDP_OK;
}

static nccl_work *work_of(const fsdp_comm_work *work) {
    return work->free_state == nccl_work_free ? work->state : NULL;
}

/* The host backend of ctx's world, whose works are those the nccl backend did not start. */
static const fsdp_comm_backend_i *host_of(fsdp_ctx *ctx) {
    const nccl_world *nw = fsdp_ctx_world(ctx)->backend.context;
    return &nw->host.iface;
}

fsdp_status fsdp_nccl_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done) {
    nccl_work *w = work_of(work);
    if (!w) return host_of(ctx)->work_test(ctx, work, done);
    w->call.ctx = ctx;
    return poll_once(&w->call, done);
}

fsdp_status fsdp_nccl_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work) {
    nccl_work *w = work_of(work);
    if (!w) return host_of(ctx)->work_wait(ctx, work);
    w->call.ctx = ctx;
    return poll_until_done(&w->call);
}

/* The stream wait comes after the host has seen the call end (or fail): a call that never ends
 * must fail here rather than leave the stream waiting forever. */
fsdp_status fsdp_nccl_work_wait_stream(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream) {
    nccl_work *w = work_of(work);
    if (!w) {
        const fsdp_comm_backend_i *h = host_of(ctx);
        return h->work_wait_stream ? h->work_wait_stream(ctx, work, stream)
                                   : h->work_wait(ctx, work);
    }
    w->call.ctx = ctx;
    FSDP_TRY_AT(ctx, poll_until_done(&w->call));
    return fsdp_stream_wait(ctx, stream, w->call.end);
}
