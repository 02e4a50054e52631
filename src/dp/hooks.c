/* hooks.c: what an FSDP unit does while the model runs: gather its flat parameter into a pool
 * block before forward and backward (in param_dtype under mixed precision), free it after, and
 * after backward reduce the flat gradient over the data-parallel ranks into the shard the
 * optimizer steps, through the comm hook. */
#include "comm/comm_device.h" // defines: fsdp_comm_work_wait_stream
#include "core/ctx_impl.h"    // defines: recompute_depth
#include "core/error.h"
#include "core/tensor_impl.h"
#include "dp/shard_impl.h"

/* FULL_SHARD and HYBRID_SHARD free non-root parameters after forward and after every
 * backward; the others keep them until the synchronising backward ends. */
bool fsdp_shard_reshard_after_forward(const fsdp_sharded *sh) {
    return sh->opts.strategy == FSDP_FULL_SHARD || sh->opts.strategy == FSDP_HYBRID_SHARD;
}

fsdp_status fsdp_shard_bind_params(fsdp_ctx *ctx, unit *u, const fsdp_tensor *base) {
    for (int i = 0; i < u->n_params; i++)
        FSDP_TRY_AT(ctx,
                    fsdp_tensor_rebind(ctx, fsdp_param_data(u->params[i]), base, u->offsets[i]));
    return FSDP_OK;
}

void fsdp_shard_release_params(unit *u) {
    for (int i = 0; i < u->n_params; i++)
        fsdp_tensor_release_storage(fsdp_param_data(u->params[i]));
}

/* The unit's all_gather: while a prefetch issues it, started on the unit's gather work (the
 * prefetched unit's wait completes it, fsdp_prefetch_wait); otherwise the blocking call. */
static fsdp_status unit_all_gather(fsdp_ctx *ctx, unit *u, fsdp_tensor *full,
                                   const fsdp_tensor *in) {
    fsdp_sharded *sh = u->owner;
    if (!sh->prefetching || fsdp_works_blocking())
        return fsdp_all_gather(ctx, sh->group, full, in, 0);
    return fsdp_all_gather_start(ctx, sh->group, full, in, 0, u->gather_work);
}

/* full <- the concatenation of every rank's shard. With offload the shard is in host memory:
 * it is copied to the device first, into this rank's chunk of full (u->mine, released by
 * fsdp_shard_gather_finish), and gathered in place. */
fsdp_status fsdp_shard_gather(fsdp_ctx *ctx, unit *u, fsdp_tensor *full, const fsdp_tensor *shard) {
    fsdp_sharded *sh = u->owner;
    if (!sh->opts.offload_params) return unit_all_gather(ctx, u, full, shard);
    FSDP_TRY_AT(
        ctx, fsdp_tensor_rebind(ctx, u->mine, full, (int64_t)fsdp_shard_rank(sh) * u->shard_numel));
    fsdp_status st = fsdp_tensor_copy(ctx, u->mine, shard);
    if (st == FSDP_OK) st = unit_all_gather(ctx, u, full, u->mine);
    if (st != FSDP_OK || !sh->prefetching) fsdp_tensor_release_storage(u->mine);
    return FSDP_PASS(ctx, st);
}

/* The f32 shard where a rounding copy can read it: itself, or with offload on a device (a copy
 * cannot convert between devices) a copy on the device in u->full at `at`, which the widening
 * overwrites later. */
static fsdp_status shard_on_device(fsdp_ctx *ctx, unit *u, int64_t at, const fsdp_tensor **out) {
    const fsdp_tensor *shard = fsdp_param_data(u->flat);
    *out = shard;
    if (!fsdp_offload_on_device(u->owner)) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_tensor_rebind(ctx, u->mine, u->full, at));
    fsdp_status st = fsdp_tensor_copy(ctx, u->mine, shard);
    if (st != FSDP_OK) fsdp_tensor_release_storage(u->mine);
    *out = u->mine;
    return FSDP_PASS(ctx, st);
}

/* Mixed precision: full <- the gather of every rank's shard rounded to low_full's dtype, widened
 * exactly. This rank's shard is rounded into its chunk of low_full (from the host with offload),
 * which is then gathered in place; unsharded, the whole flat parameter is rounded. While the
 * optimizer's bf16 copy of the shard is current (low_copy.c) it is gathered instead: the same
 * bits, without reading the f32 shard. */
static fsdp_status gather_low(fsdp_ctx *ctx, unit *u) {
    fsdp_sharded *sh = u->owner;
    FSDP_TRY_AT(ctx, fsdp_pool_take(ctx, &sh->pool, u->low_full));
    const fsdp_tensor *shard;
    bool sharded = fsdp_shard_sharded_strategy(sh);
    fsdp_status st = shard_on_device(
        ctx, u, sharded ? (int64_t)fsdp_shard_rank(sh) * u->shard_numel : 0, &shard);
    if (st != FSDP_OK) {
        fsdp_pool_give(&sh->pool, u->low_full);
        return FSDP_PASS(ctx, st);
    }
    u->gather_widen = true;      /* fsdp_shard_gather_finish widens and gives low_full back */
    if (fsdp_low_copy_take(u)) { /* the optimizer's rounding of the shard as it stands */
        st = sharded ? unit_all_gather(ctx, u, u->low_full, u->low_copy)
                     : fsdp_tensor_copy(ctx, u->low_full, u->low_copy);
    } else if (sharded) {
        st = fsdp_tensor_rebind(ctx, u->low_mine, u->low_full,
                                (int64_t)fsdp_shard_rank(sh) * u->shard_numel);
        if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, u->low_mine, shard);
        if (st == FSDP_OK) st = unit_all_gather(ctx, u, u->low_full, u->low_mine);
    } else {
        st = fsdp_tensor_copy(ctx, u->low_full, shard);
    }
    return FSDP_PASS(ctx, st);
}

/* After a gather's collective was issued (st: how that went): finished at once unless a
 * prefetch left it in flight. A prefetch on a device that widens after the collective completes
 * it on the unshard stream (the widening is FSDP's own kernel there); on the host it is left to
 * the prefetched unit's wait, as is an f32 gather on either. */
static fsdp_status gather_issued(fsdp_ctx *ctx, unit *u, fsdp_status st) {
    fsdp_sharded *sh = u->owner;
    if (!sh->prefetching || st != FSDP_OK) return fsdp_shard_gather_finish(ctx, u, st);
    if (!fsdp_comm_work_pending(u->gather_work)) return fsdp_shard_gather_finish(ctx, u, st);
    if (sh->pool.device.type == FSDP_DEVICE_CPU) {
        if (u->gather_widen) fsdp_pool_hold(&sh->pool, u->low_full);
        return FSDP_OK;
    }
    if (!u->gather_widen) return FSDP_OK;
    st = fsdp_comm_work_wait_stream(ctx, u->gather_work, fsdp_stream_current(sh->pool.device));
    return fsdp_shard_gather_finish(ctx, u, st);
}

/* Rank threads, f32, sharded, without offload: the group's shards of the unit move side by
 * side into one block at its first gather (fsdp_group_share_shards; every rank gathers the unit
 * at the same point, so they ask together), and from then on its gathers bind the parameters
 * there: the all_gather finds every shard in place and copies nothing. The shards are written
 * only by the optimizer step, after the reduce_scatter that follows every rank's last read of
 * the unit in a step and before the all_gather that precedes the first in the next. The blocks
 * are host memory, so a model on a device gathers into its pool instead. */
static fsdp_status gather_shared(fsdp_ctx *ctx, unit *u, bool *done) {
    fsdp_sharded *sh = u->owner;
    *done = false;
    /* The backend's shared blocks are host memory: a model on a device gathers into the pool. */
    if (!fsdp_shard_sharded_strategy(sh) || sh->opts.offload_params ||
        sh->pool.device.type != FSDP_DEVICE_CPU)
        return FSDP_OK;
    fsdp_tensor *shard = fsdp_param_data(u->flat);
    if (!u->share_asked) {
        u->share_asked = true;
        FSDP_TRY_AT(ctx, fsdp_group_share_shards(ctx, sh->group, shard, &u->shared_full));
    }
    if (!u->shared_full) return FSDP_OK;
    FSDP_TRY_AT(ctx, gather_issued(ctx, u, unit_all_gather(ctx, u, u->shared_full, shard)));
    fsdp_status st = fsdp_shard_bind_params(ctx, u, u->shared_full);
    if (st != FSDP_OK) {
        st = fsdp_works_drain(ctx, sh, st);
        fsdp_shard_release_params(u);
        return FSDP_PASS(ctx, st);
    }
    *done = true;
    return FSDP_OK;
}

/* Gathers the unit's parameters into its pool block (or in place in the group's shared block)
 * and binds them there; on failure they are left without storage and the block given back. */
static fsdp_status gather_params(fsdp_ctx *ctx, unit *u, fsdp_dtype dtype, bool may_share) {
    if (u->numel == 0) return FSDP_OK; /* a unit without parameters is silent */
    fsdp_sharded *sh = u->owner;
    if (may_share && dtype == FSDP_DTYPE_F32) {
        bool done;
        FSDP_TRY_AT(ctx, gather_shared(ctx, u, &done));
        if (done) return FSDP_OK;
    }
    FSDP_TRY_AT(ctx, fsdp_pool_take(ctx, &sh->pool, u->full));
    fsdp_status st = dtype != FSDP_DTYPE_F32 ? gather_low(ctx, u)
                     : fsdp_shard_sharded_strategy(sh)
                         ? fsdp_shard_gather(ctx, u, u->full, fsdp_param_data(u->flat))
                         : fsdp_tensor_copy(ctx, u->full, fsdp_param_data(u->flat));
    st = gather_issued(ctx, u, st);
    if (st == FSDP_OK) st = fsdp_shard_bind_params(ctx, u, u->full);
    if (st != FSDP_OK) {
        st = fsdp_works_drain(ctx, sh, st); /* nothing left writing into the block */
        fsdp_shard_release_params(u);
        fsdp_pool_give(&sh->pool, u->full);
    }
    return FSDP_PASS(ctx, st);
}

static bool gathered(const unit *u) {
    return u->state == UNIT_GATHERED || u->state == UNIT_BACKWARD ||
           u->state == UNIT_GATHERED_GRAD_PENDING;
}

fsdp_status fsdp_shard_unshard(fsdp_ctx *ctx, unit *u, fsdp_dtype dtype, const char *call) {
    if (gathered(u)) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_shard_check_move(ctx, u, UNIT_UNSHARD, call));
    if (!u->owner->prefetching && u->numel) fsdp_prefetch_trace(u, FSDP_PREFETCH_OWN);
    FSDP_TRY_AT(ctx, gather_params(ctx, u, dtype, true));
    return fsdp_shard_move(ctx, u, UNIT_UNSHARD, call);
}

/* Gathers the unit that runs after u (fsdp_prefetch_pick) on the unshard stream, after
 * everything the compute stream has queued (the shard's last write, the last use of the pool
 * blocks it takes); its gathered event fires when done. */
static fsdp_status prefetch_next(fsdp_ctx *ctx, unit *u, fsdp_prefetch_at at) {
    unit *v = fsdp_prefetch_pick(ctx, u, at);
    if (!v) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_works_ready(ctx, v->owner));
    fsdp_stream compute;
    FSDP_TRY_AT(ctx, fsdp_prefetch_begin(ctx, v->owner, &compute));
    fsdp_status st = fsdp_shard_unshard(ctx, v, v->owner->param_dtype,
                                        at == FSDP_PREFETCH_AT_FORWARD ? "the forward prefetch"
                                                                       : "the backward prefetch");
    return fsdp_prefetch_end(ctx, v, compute, st);
}

fsdp_status fsdp_shard_gather_copy(fsdp_ctx *ctx, unit *u) {
    return gather_params(ctx, u, FSDP_DTYPE_F32, false);
}

/* Frees the gathered parameters: the parameters lose their storage, the block goes back to
 * the pool (gathered in place: nothing to give back). */
void fsdp_shard_free_full(unit *u) {
    if (u->numel == 0) return;
    fsdp_shard_release_params(u);
    fsdp_pool_give(&u->owner->pool, u->full);
}

fsdp_status fsdp_shard_reshard(fsdp_ctx *ctx, unit *u, const char *call) {
    if (fsdp_shard_resident(u->owner) || u->state == UNIT_SHARDED || u->state == UNIT_GRAD_PENDING)
        return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_prefetch_wait(ctx, u)); /* its gather ends before its block is freed */
    FSDP_TRY_AT(ctx, fsdp_shard_move(ctx, u, UNIT_RESHARD, call));
    fsdp_shard_free_full(u);
    return FSDP_OK;
}

/* Binds the parameter gradients to a zeroed full gradient buffer. */
fsdp_status fsdp_shard_bind_grads(fsdp_ctx *ctx, unit *u) {
    if (u->numel == 0) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_pool_take(ctx, &u->owner->pool, u->full_grad));
    fsdp_status st = fsdp_tensor_fill(ctx, u->full_grad, 0.0f);
    for (int i = 0; st == FSDP_OK && i < u->n_params; i++)
        st = fsdp_tensor_rebind(ctx, fsdp_param_grad(u->params[i]), u->full_grad, u->offsets[i]);
    if (st != FSDP_OK) fsdp_shard_unbind_grads(u);
    return FSDP_PASS(ctx, st);
}

void fsdp_shard_unbind_grads(unit *u) {
    if (u->numel == 0) return;
    for (int i = 0; i < u->n_params; i++)
        fsdp_tensor_release_storage(fsdp_param_grad(u->params[i]));
    fsdp_pool_give(&u->owner->pool, u->full_grad);
}

fsdp_status fsdp_shard_take_grads(fsdp_ctx *ctx, unit *u, const char *call) {
    if (u->state == UNIT_BACKWARD) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_shard_check_move(ctx, u, UNIT_TAKE_GRADS, call));
    /* Pending gradients are bound already and accumulate. */
    if (u->state == UNIT_GATHERED) FSDP_TRY_AT(ctx, fsdp_shard_bind_grads(ctx, u));
    return fsdp_shard_move(ctx, u, UNIT_TAKE_GRADS, call);
}

/* ---- hooks ---- */

/* Each hook's body; the hooks (at the end) drain the works when it fails. */
static fsdp_status pre_forward(fsdp_ctx *ctx, unit *u) {
    /* a step that failed outside FSDP's hooks may have left a work in flight */
    if (u->is_root && ctx->recompute_depth == 0) FSDP_TRY_AT(ctx, fsdp_works_settle(ctx, u->owner));
    FSDP_TRY_AT(ctx, fsdp_prefetch_note(ctx, u, false));
    FSDP_TRY_AT(ctx, fsdp_shard_unshard(ctx, u, u->owner->param_dtype, "the pre-forward hook"));
    FSDP_TRY_AT(ctx, fsdp_prefetch_wait(ctx, u));
    return prefetch_next(ctx, u, FSDP_PREFETCH_AT_FORWARD); /* before this unit computes */
}

static fsdp_status post_forward(fsdp_ctx *ctx, unit *u) {
    /* A checkpointed module re-running its forward inside backward: the unit's backward
     * follows at once, so the parameters gathered for the recompute stay (PyTorch's FSDP skips
     * its post-forward logic in the recomputed forward too). */
    if (ctx->recompute_depth > 0) return FSDP_OK;
    /* Offload on a device: the forward's copies have read the pinned shards. */
    if (u->is_root) FSDP_TRY_AT(ctx, fsdp_offload_sync(ctx, u->owner));
    /* The root keeps its parameters: its backward starts right after forward. */
    if (fsdp_shard_reshard_after_forward(u->owner) && !u->is_root)
        return fsdp_shard_reshard(ctx, u, "the post-forward hook");
    return FSDP_OK;
}

static fsdp_status pre_backward(fsdp_ctx *ctx, unit *u) {
    FSDP_TRY_AT(ctx, fsdp_prefetch_note(ctx, u, true));
    FSDP_TRY_AT(ctx, fsdp_shard_unshard(ctx, u, u->owner->param_dtype, "the pre-backward hook"));
    FSDP_TRY_AT(ctx, fsdp_prefetch_wait(ctx, u));
    FSDP_TRY_AT(ctx, prefetch_next(ctx, u, FSDP_PREFETCH_AT_PRE_BACKWARD));
    /* under no_sync, still bound with what was accumulated */
    return fsdp_shard_take_grads(ctx, u, "the pre-backward hook");
}

static fsdp_status post_backward(fsdp_ctx *ctx, unit *u) {
    static const char call[] = "the post-backward hook";
    if (!u->owner->sync) {
        /* no_sync: the full gradient stays bound and accumulates; FULL_SHARD still frees the
         * parameters (PyTorch's _should_free_in_backward). */
        FSDP_TRY_AT(ctx, fsdp_shard_move(ctx, u, UNIT_KEEP_GRADS, call));
        if (fsdp_shard_reshard_after_forward(u->owner))
            FSDP_TRY_AT(ctx, fsdp_shard_reshard(ctx, u, call));
        FSDP_TRY_AT(ctx, prefetch_next(ctx, u, FSDP_PREFETCH_AT_POST_BACKWARD));
        return u->is_root ? fsdp_offload_sync(ctx, u->owner) : FSDP_OK;
    }
    FSDP_TRY_AT(ctx, fsdp_shard_check_move(ctx, u, UNIT_REDUCED, call));
    /* The reduction on the post-backward stream, under the next unit's backward. */
    fsdp_stream compute;
    FSDP_TRY_AT(ctx, fsdp_works_ready(ctx, u->owner));
    FSDP_TRY_AT(ctx, fsdp_post_backward_begin(ctx, u->owner, &compute));
    fsdp_status st = fsdp_post_backward_reduce(ctx, u, call);
    fsdp_post_backward_end(u->owner, compute);
    FSDP_TRY_AT(ctx, st);
    if (u->numel) fsdp_prefetch_trace(u, FSDP_REDUCE_ISSUED);
    FSDP_TRY_AT(ctx, fsdp_shard_reshard(ctx, u, call));
    /* BACKWARD_POST: the next unit's gather, while what runs before its backward computes */
    FSDP_TRY_AT(ctx, prefetch_next(ctx, u, FSDP_PREFETCH_AT_POST_BACKWARD));
    if (!u->is_root) return FSDP_OK;
    /* the end of backward: every work completed (on the host: waited for), the gradients are
     * complete on the compute stream; the optimizer may write the pinned shards next */
    FSDP_TRY_AT(ctx, fsdp_works_settle(ctx, u->owner));
    FSDP_TRY_AT(ctx, fsdp_prefetch_join(ctx, u->owner));
    FSDP_TRY_AT(ctx, fsdp_post_backward_join(ctx, u->owner));
    return fsdp_offload_sync(ctx, u->owner);
}

/* A hook's body, after the test-only failure switch; whatever it returns, no unit's work is
 * left in flight on failure (fsdp_works_drain). */
static fsdp_status run_hook(fsdp_ctx *ctx, unit *u, fsdp_hook_point point,
                            fsdp_status (*body)(fsdp_ctx *, unit *)) {
    fsdp_status st = fsdp_works_test_failure(ctx, u, point);
    return fsdp_works_drain(ctx, u->owner, st != FSDP_OK ? st : body(ctx, u));
}

fsdp_status fsdp_shard_pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                   const fsdp_tensor **io, void *user) {
    (void)m, (void)io;
    return run_hook(ctx, user, point, pre_forward);
}

fsdp_status fsdp_shard_post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user) {
    (void)m, (void)io;
    return run_hook(ctx, user, point, post_forward);
}

fsdp_status fsdp_shard_pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user) {
    (void)m, (void)io;
    return run_hook(ctx, user, point, pre_backward);
}

fsdp_status fsdp_shard_post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                     const fsdp_tensor **io, void *user) {
    (void)m, (void)io;
    return run_hook(ctx, user, point, post_backward);
}
