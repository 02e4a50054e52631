/* prefetch.c: FSDP1's prefetch: a unit's hook starts the gather of the unit that runs after it
 * (forward_prefetch: the next in forward order, before the unit computes; BACKWARD_PRE: the
 * next in backward order, before the unit computes; BACKWARD_POST: the first unit in backward
 * order whose backward has not started, after the unit's gradients were reduced) on that unit's
 * gather work, with the state's unshard stream current (FSDP's own copies and roundings before
 * the collective queue there), so that the all_gather runs while computation goes on; the unit
 * that was prefetched completes the work before its parameters are read: on a device the
 * compute stream waits for it (and for the unshard stream's event), on the host
 * fsdp_comm_work_wait.
 * limit_all_gathers holds the gathered units (the root excluded) to FSDP_PREFETCH_LIMIT when
 * prefetching. The order is the order the hooks first ran in (the first step's), as PyTorch
 * records it; nothing is prefetched before a unit has run once. */
#include <stdatomic.h>
#include <stdlib.h>

#include "comm/comm_device.h" // defines: fsdp_comm_work_wait_stream
#include "core/ctx_impl.h"    // defines: recompute_depth
#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_release_storage
#include "dp/shard_impl.h"

static atomic_bool skip_wait;

void fsdp_shard_test_skip_prefetch_wait(bool on) {
    atomic_store(&skip_wait, on);
}

void fsdp_shard_test_trace(fsdp_sharded *sh, fsdp_prefetch_trace_fn fn, void *user) {
    sh->trace = fn;
    sh->trace_user = user;
}

void fsdp_prefetch_trace(const unit *u, fsdp_prefetch_event ev) {
    const fsdp_sharded *sh = u->owner;
    if (sh->trace) sh->trace(sh->trace_user, u->index, ev, fsdp_prefetch_in_flight(sh));
}

int fsdp_prefetch_in_flight(const fsdp_sharded *sh) {
    int n = 0;
    for (int i = 0; i < sh->n_units; i++)
        n += !sh->units[i]->is_root && fsdp_unit_gathered(sh->units[i]);
    return n;
}

fsdp_status fsdp_prefetch_note(fsdp_ctx *ctx, unit *u, bool backward) {
    fsdp_sharded *sh = u->owner;
    int b = backward;
    if (ctx->recompute_depth > 0) return FSDP_OK; /* a recompute is not the forward order */
    if (backward) {
        u->backward_started = true;
    } else if (u->is_root) { /* a new pass: no unit's backward has started */
        for (int i = 0; i < sh->n_units; i++) sh->units[i]->backward_started = false;
    }
    for (int i = 0; i < sh->n_order[b]; i++)
        if (sh->order[b][i] == u) return FSDP_OK;
    if (!sh->order[b]) {
        sh->order[b] = calloc((size_t)sh->n_units, sizeof *sh->order[b]);
        if (!sh->order[b])
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot record FSDP's unit order");
    }
    if (sh->n_order[b] < sh->n_units) sh->order[b][sh->n_order[b]++] = u;
    return FSDP_OK;
}

/* The unit after u in the recorded order, or NULL. */
static unit *next_of(const fsdp_sharded *sh, const unit *u, int b) {
    for (int i = 0; i + 1 < sh->n_order[b]; i++)
        if (sh->order[b][i] == u) return sh->order[b][i + 1];
    return NULL;
}

/* The first unit in backward order whose backward has not started (a post-backward hook's
 * next: with nested units, the unit after u in that order may have run already), or NULL. */
static unit *first_not_started(const fsdp_sharded *sh) {
    for (int i = 0; i < sh->n_order[1]; i++)
        if (!sh->order[1][i]->backward_started) return sh->order[1][i];
    return NULL;
}

/* The unshard stream and the event that orders it after the compute stream, made once. */
static fsdp_status ready(fsdp_ctx *ctx, fsdp_sharded *sh) {
    if (sh->prefetch_ready) return FSDP_OK;
    fsdp_device dev = sh->pool.device;
    sh->unshard = (fsdp_stream){dev, NULL};
    sh->issue = (fsdp_event){dev, NULL};
    if (dev.type != FSDP_DEVICE_CPU) {
        FSDP_TRY_AT(ctx, fsdp_stream_create(ctx, dev, &sh->unshard));
        FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &sh->issue));
    }
    for (int i = 0; i < sh->n_units; i++) {
        sh->units[i]->gathered = (fsdp_event){dev, NULL};
        if (dev.type != FSDP_DEVICE_CPU)
            FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &sh->units[i]->gathered));
    }
    sh->prefetch_ready = true;
    return FSDP_OK;
}

fsdp_status fsdp_prefetch_begin(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_stream *compute) {
    FSDP_TRY_AT(ctx, ready(ctx, sh));
    *compute = fsdp_stream_current(sh->pool.device);
    FSDP_TRY_AT(ctx, fsdp_event_record(ctx, sh->issue, *compute));
    FSDP_TRY_AT(ctx, fsdp_stream_wait(ctx, sh->unshard, sh->issue));
    fsdp_stream_set_current(sh->unshard);
    sh->prefetching = true;
    return FSDP_OK;
}

fsdp_status fsdp_prefetch_end(fsdp_ctx *ctx, unit *v, fsdp_stream compute, fsdp_status st) {
    fsdp_sharded *sh = v->owner;
    sh->prefetching = false;
    fsdp_stream_set_current(compute);
    if (st == FSDP_OK) st = fsdp_event_record(ctx, v->gathered, sh->unshard);
    if (st != FSDP_OK) return FSDP_PASS(ctx, st);
    v->prefetched = true;
    if (fsdp_comm_work_pending(v->gather_work)) fsdp_prefetch_trace(v, FSDP_GATHER_IN_FLIGHT);
    fsdp_prefetch_trace(v, FSDP_PREFETCH_ISSUED);
    return FSDP_OK;
}

unit *fsdp_prefetch_pick(fsdp_ctx *ctx, unit *u, fsdp_prefetch_at at) {
    fsdp_sharded *sh = u->owner;
    bool on =
        at == FSDP_PREFETCH_AT_FORWARD
            ? sh->opts.forward_prefetch
            : sh->opts.backward_prefetch ==
                  (at == FSDP_PREFETCH_AT_PRE_BACKWARD ? FSDP_BACKWARD_PRE : FSDP_BACKWARD_POST);
    if (!on || ctx->recompute_depth > 0) return NULL;
    /* The root's post-backward hook is the end of backward: nothing runs after it. */
    if (at == FSDP_PREFETCH_AT_POST_BACKWARD && u->is_root) return NULL;
    unit *v = at == FSDP_PREFETCH_AT_POST_BACKWARD
                  ? first_not_started(sh)
                  : next_of(sh, u, at == FSDP_PREFETCH_AT_PRE_BACKWARD);
    if (!v || v->numel == 0 || (v->state != UNIT_SHARDED && v->state != UNIT_GRAD_PENDING))
        return NULL;
    if (sh->opts.limit_all_gathers && fsdp_prefetch_in_flight(sh) >= FSDP_PREFETCH_LIMIT) {
        fsdp_prefetch_trace(v, FSDP_PREFETCH_SKIPPED);
        return NULL;
    }
    return v;
}

fsdp_status fsdp_shard_gather_finish(fsdp_ctx *ctx, unit *u, fsdp_status st) {
    if (u->low_mine) fsdp_tensor_release_storage(u->low_mine);
    if (u->mine) fsdp_tensor_release_storage(u->mine);
    if (!u->gather_widen) return st;
    u->gather_widen = false;
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, u->full, u->low_full);
    fsdp_pool_give(&u->owner->pool, u->low_full);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_prefetch_wait(fsdp_ctx *ctx, unit *u) {
    if (!u->prefetched) return FSDP_OK;
    fsdp_sharded *sh = u->owner;
    u->prefetched = false;
    fsdp_prefetch_trace(u, FSDP_PREFETCH_WAITED);
    fsdp_status st;
    if (sh->pool.device.type == FSDP_DEVICE_CPU) {
        st = fsdp_comm_work_wait(ctx, u->gather_work);
    } else if (atomic_load(&skip_wait)) { /* the work completes, but not for the compute stream */
        st = fsdp_comm_work_wait_stream(ctx, u->gather_work, sh->unshard);
    } else {
        fsdp_stream compute = fsdp_stream_current(sh->pool.device);
        st = fsdp_comm_work_wait_stream(ctx, u->gather_work, compute);
        /* FSDP's own copies on the unshard stream (a gather without a collective has only these) */
        if (st == FSDP_OK) st = fsdp_stream_wait(ctx, compute, u->gathered);
    }
    return fsdp_shard_gather_finish(ctx, u, st);
}

fsdp_status fsdp_prefetch_join(fsdp_ctx *ctx, fsdp_sharded *sh) {
    for (int i = 0; i < sh->n_units; i++) FSDP_TRY_AT(ctx, fsdp_prefetch_wait(ctx, sh->units[i]));
    return FSDP_OK;
}

void fsdp_prefetch_release(fsdp_sharded *sh) {
    for (int i = 0; i < sh->n_units; i++) {
        fsdp_event_destroy(sh->units[i]->gathered);
        sh->units[i]->gathered = (fsdp_event){0};
    }
    if (sh->prefetch_ready) {
        fsdp_stream_destroy(sh->unshard); /* waits for its work */
        fsdp_event_destroy(sh->issue);
    }
    sh->prefetch_ready = false;
    free(sh->order[0]);
    free(sh->order[1]);
}
