/* works.c: the started collectives of an FSDP unit (fsdp_comm_work, one for its prefetched
 * gather and one for its gradient reduction): made once, completed where their results are
 * needed (prefetch.c, post_backward.c), settled when the pool needs a block one still holds, at
 * the end of backward and before summon_full_params, and drained when a hook fails, so that no
 * step leaves a collective in flight. */
#include <stdatomic.h>

#include "core/error.h"
#include "dp/shard_impl.h"

static atomic_int fail_unit = -1, fail_point = -1;

void fsdp_shard_test_fail_hook(int unit_index, fsdp_hook_point point) {
    atomic_store(&fail_point, (int)point);
    atomic_store(&fail_unit, unit_index);
}

fsdp_status fsdp_works_test_failure(fsdp_ctx *ctx, const unit *u, fsdp_hook_point point) {
    if (atomic_load(&fail_unit) != u->index || atomic_load(&fail_point) != (int)point)
        return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "FSDP unit %d: the failure a test asked for",
                     u->index);
}

static fsdp_status settle_pool(fsdp_ctx *ctx, void *user) {
    return fsdp_works_settle(ctx, user);
}

fsdp_status fsdp_works_ready(fsdp_ctx *ctx, fsdp_sharded *sh) {
    if (sh->works_ready) return FSDP_OK;
    for (int i = 0; i < sh->n_units; i++) {
        unit *u = sh->units[i];
        if (!u->gather_work) FSDP_TRY_AT(ctx, fsdp_comm_work_create(ctx, &u->gather_work));
        if (!u->reduce_work) FSDP_TRY_AT(ctx, fsdp_comm_work_create(ctx, &u->reduce_work));
    }
    sh->pool.settle = settle_pool;
    sh->pool.settle_user = sh;
    sh->works_ready = true;
    return FSDP_OK;
}

/* Whether a unit's prefetched gather is in flight on the host (on a device its work is
 * completed by the compute stream's wait, which the host does not wait for). */
static bool gather_open_on_host(const unit *u) {
    return u->owner->pool.device.type == FSDP_DEVICE_CPU && u->prefetched &&
           fsdp_comm_work_pending(u->gather_work);
}

fsdp_status fsdp_works_settle(fsdp_ctx *ctx, fsdp_sharded *sh) {
    if (!sh->works_ready) return FSDP_OK;
    for (int i = 0; i < sh->n_units; i++) {
        unit *u = sh->units[i];
        if (gather_open_on_host(u)) FSDP_TRY_AT(ctx, fsdp_prefetch_wait(ctx, u));
        FSDP_TRY_AT(ctx, fsdp_post_backward_finish(ctx, u));
    }
    return FSDP_OK;
}

fsdp_status fsdp_works_drain(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_status st) {
    if (st == FSDP_OK || !sh->works_ready) return st;
    fsdp_error_record first;
    fsdp_error_save(ctx, &first);
    for (int i = 0; i < sh->n_units; i++) {
        unit *u = sh->units[i];
        /* each completed whatever it reports: the failure to report is the hook's */
        (void)fsdp_prefetch_wait(ctx, u);
        (void)fsdp_post_backward_finish(ctx, u);
        (void)fsdp_comm_work_wait(ctx, u->gather_work);
        (void)fsdp_shard_gather_finish(ctx, u, st); /* a gather started by a failed prefetch */
        (void)fsdp_comm_work_wait(ctx, u->reduce_work);
    }
    fsdp_error_restore(ctx, &first);
    return st;
}

void fsdp_works_release(fsdp_sharded *sh) {
    for (int i = 0; i < sh->n_units; i++) {
        fsdp_comm_work_free(sh->units[i]->gather_work);
        fsdp_comm_work_free(sh->units[i]->reduce_work);
        sh->units[i]->gather_work = sh->units[i]->reduce_work = NULL;
    }
    sh->pool.settle = NULL;
    sh->works_ready = false;
}
