/* summon.c: summon_full_params: every unit's full parameters (and optionally gradients)
 * gathered between steps, handed out in place or as host copies, and on release written back
 * into each rank's shard or dropped. */
#include "core/ctx_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "dp/shard_impl.h"

/* Binds the parameter gradients to a full buffer holding the reduced gradient: the shards
 * gathered (or, unsharded, copied). */
static fsdp_status summon_grads(fsdp_ctx *ctx, unit *u) {
    FSDP_TRY_AT(ctx, fsdp_shard_bind_grads(ctx, u));
    if (fsdp_shard_sharded_strategy(u->owner))
        return fsdp_shard_gather(ctx, u, u->full_grad, fsdp_param_grad(u->flat));
    fsdp_tensor *part;
    FSDP_TRY_AT(ctx, fsdp_tensor_view(ctx, u->full_grad, 0, 1, &u->numel, &part));
    fsdp_status st = fsdp_tensor_copy(ctx, part, fsdp_param_grad(u->flat));
    fsdp_tensor_free(part);
    return FSDP_PASS(ctx, st);
}

static bool gathered_before(const unit *u) {
    return u->summon_from == UNIT_GATHERED || u->summon_from == UNIT_GATHERED_GRAD_PENDING;
}

/* Moves the unit's parameters to a copy of the full buffer on `where`, freeing the device
 * block when the unit was sharded before the summon: a host copy for offload_to_cpu, a copy on
 * the unit's own device for a resident unit summoned without writeback. */
static fsdp_status summon_to_copy(fsdp_ctx *ctx, unit *u, fsdp_device where) {
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, where, 1, &u->padded, &u->summon_host);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, u->summon_host, u->full);
    if (st == FSDP_OK) st = fsdp_shard_bind_params(ctx, u, u->summon_host);
    if (st != FSDP_OK) { /* still SUMMONED: the parameters go back to the device copy */
        if (fsdp_shard_bind_params(ctx, u, u->full) != FSDP_OK) fsdp_shard_release_params(u);
        fsdp_tensor_free(u->summon_host);
        u->summon_host = NULL;
        return FSDP_PASS(ctx, st);
    }
    FSDP_TRY_AT(ctx, fsdp_shard_move(ctx, u, UNIT_SUMMON_TO_HOST, "fsdp_summon_full_params"));
    if (!gathered_before(u) && !fsdp_shard_resident(u->owner))
        fsdp_pool_give(&u->owner->pool, u->full);
    return FSDP_OK;
}

/* One unit into SUMMONED (its own full copy, with_grads: the reduced gradient); on failure
 * it is left in the state it was found in. */
static fsdp_status summon_unit(fsdp_ctx *ctx, unit *u, const fsdp_summon_options *o) {
    bool was_gathered = fsdp_unit_gathered(u);
    FSDP_TRY_AT(ctx, fsdp_shard_move(ctx, u, UNIT_SUMMON, "fsdp_summon_full_params"));
    /* A failed gather leaves nothing bound. */
    fsdp_status st = was_gathered ? FSDP_OK : fsdp_shard_gather_copy(ctx, u);
    if (st == FSDP_OK && o->with_grads) {
        st = summon_grads(ctx, u);
        if (st != FSDP_OK) {
            fsdp_shard_unbind_grads(u);
            if (!was_gathered) fsdp_shard_free_full(u);
        }
    }
    if (st != FSDP_OK) /* undone: back where it was (a legal move, which cannot fail) */
        (void)fsdp_shard_move(ctx, u, UNIT_RELEASE, "fsdp_summon_full_params");
    return FSDP_PASS(ctx, st);
}

/* rank0_only on another rank: every rank gathers, the others free at once. */
static fsdp_status unsummon_unit(fsdp_ctx *ctx, unit *u) {
    static const char call[] = "fsdp_summon_full_params(rank0_only)";
    if (u->owner->summon.with_grads) fsdp_shard_unbind_grads(u);
    if (!gathered_before(u)) fsdp_shard_free_full(u);
    return fsdp_shard_move(ctx, u, UNIT_RELEASE, call);
}

fsdp_status fsdp_summon_full_params(fsdp_ctx *ctx, fsdp_sharded *sh,
                                    const fsdp_summon_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, sh);
    FSDP_TRY_AT(ctx, fsdp_shard_check_model(ctx, sh, "fsdp_summon_full_params"));
    if (ctx->phase != FSDP_PHASE_NONE)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "summon_full_params inside %s: call it between steps, outside the "
                         "model's forward and backward",
                         ctx->phase == FSDP_PHASE_FORWARD ? "forward" : "backward");
    if (sh->summoned)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "summon_full_params is already active; call fsdp_release_full_params "
                         "first");
    fsdp_summon_options o = opts ? *opts : (fsdp_summon_options){.writeback = true};
    if (o.rank0_only && o.writeback)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "summon_full_params: rank0_only with writeback is not allowed (the "
                         "other ranks have nothing to write back); set writeback false");
    for (int i = 0; o.with_grads && i < sh->n_units; i++)
        if (fsdp_unit_grad_pending(sh->units[i]))
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "summon_full_params(with_grads): gradients of no_sync backwards "
                             "are not reduced yet; run a backward with sync on first");
    FSDP_TRY_AT(ctx, fsdp_works_settle(ctx, sh));
    FSDP_TRY_AT(ctx, fsdp_prefetch_join(ctx, sh));
    FSDP_TRY_AT(ctx, fsdp_offload_sync(ctx, sh));
    sh->summon = o;
    bool keep = !o.rank0_only || fsdp_shard_rank(sh) == 0;
    fsdp_status st = FSDP_OK;
    for (int i = 0; st == FSDP_OK && i < sh->n_units; i++) {
        unit *u = sh->units[i];
        /* Parameters gathered in a low param_dtype are gathered again, in f32: summon hands
         * out (and writes back) the f32 values. So are those gathered in place in the block
         * the group's shards share: summon hands out a copy of this rank's own, which the
         * caller may write without touching the peers' shards. */
        if (fsdp_unit_gathered(u) && (sh->param_dtype != FSDP_DTYPE_F32 || u->shared_full))
            st = fsdp_shard_reshard(ctx, u, "fsdp_summon_full_params");
        if (st != FSDP_OK) break;
        u->summon_from = u->state;
        if (u->numel == 0) continue;
        st = summon_unit(ctx, u, &o);
        if (st != FSDP_OK) break;
        if (!keep) {
            st = unsummon_unit(ctx, u);
        } else if (o.offload_to_cpu || (fsdp_shard_resident(sh) && !o.writeback)) {
            /* A resident unit's parameters are the flat parameter itself: without writeback
             * they are handed out as a copy, so edits are dropped as for the others. */
            st = summon_to_copy(ctx, u, o.offload_to_cpu ? FSDP_CPU : fsdp_tensor_device(u->full));
        }
    }
    sh->summoned = true; /* release undoes whatever was done, also after a failure */
    if (st != FSDP_OK) { /* undo, keeping this failure's message */
        fsdp_error_record failure;
        fsdp_error_save(ctx, &failure);
        fsdp_release_full_params(ctx, sh);
        fsdp_error_restore(ctx, &failure);
    }
    return FSDP_PASS(ctx, st);
}

/* writeback: this rank's part of the full values goes back into its shard. */
static fsdp_status write_back(fsdp_ctx *ctx, unit *u, const fsdp_tensor *full) {
    fsdp_sharded *sh = u->owner;
    /* the parameters are the flat param */
    if (full == u->full && fsdp_shard_resident(sh)) return FSDP_OK;
    int64_t at =
        fsdp_shard_sharded_strategy(sh) ? (int64_t)fsdp_shard_rank(sh) * u->shard_numel : 0;
    fsdp_tensor *part;
    FSDP_TRY_AT(ctx, fsdp_tensor_view(ctx, full, at, 1, &u->shard_numel, &part));
    fsdp_status st = fsdp_tensor_copy(ctx, fsdp_param_data(u->flat), part);
    fsdp_tensor_free(part);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_release_full_params(fsdp_ctx *ctx, fsdp_sharded *sh) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, sh);
    FSDP_TRY_AT(ctx, fsdp_shard_check_model(ctx, sh, "fsdp_release_full_params"));
    if (!sh->summoned)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "release_full_params without summon_full_params first");
    /* offload on a device: the summon's copies have read the shards the write-back writes */
    FSDP_TRY_AT(ctx, fsdp_offload_sync(ctx, sh));
    fsdp_status st = FSDP_OK;
    bool writeback = sh->summon.writeback && !sh->summon.rank0_only;
    for (int i = 0; i < sh->n_units; i++) {
        unit *u = sh->units[i];
        if (u->state != UNIT_SUMMONED && u->state != UNIT_SUMMONED_ON_HOST) continue;
        fsdp_status s = FSDP_OK;
        bool kept_full = fsdp_unit_gathered(u); /* the device copy is still held */
        if (u->state == UNIT_SUMMONED_ON_HOST) {
            if (writeback) s = write_back(ctx, u, u->summon_host);
            if (kept_full) {
                if (s == FSDP_OK) s = fsdp_shard_bind_params(ctx, u, u->full);
                if (s == FSDP_OK && writeback && fsdp_shard_resident(sh))
                    s = fsdp_tensor_copy(ctx, u->full, u->summon_host);
            } else {
                fsdp_shard_release_params(u);
            }
            fsdp_tensor_free(u->summon_host);
            u->summon_host = NULL;
        } else if (writeback) {
            s = write_back(ctx, u, u->full);
        }
        if (sh->summon.with_grads) fsdp_shard_unbind_grads(u);
        if (!gathered_before(u) && kept_full) fsdp_shard_free_full(u);
        fsdp_status m = fsdp_shard_move(ctx, u, UNIT_RELEASE, "fsdp_release_full_params");
        if (s == FSDP_OK) s = m;
        if (st == FSDP_OK) st = s;
    }
    sh->summoned = false;
    return FSDP_PASS(ctx, st);
}
