/* post_backward.c: the post-backward stream (PyTorch FSDP1's): a unit's gradient reduction
 * (reduce_scatter, the replicas' all_reduce, the add into the shard's gradient) runs on a
 * stream of the state's own, after the compute stream's backward of the unit, so that on a
 * device the next unit's backward computes while the gradient is reduced. The end of backward
 * (the root's post-backward hook) joins it: the compute stream waits for every reduction, and
 * the pool's blocks given back on it count as the compute stream's. On the CPU the streams are
 * no-ops and nothing changes. */
#include <stdatomic.h>

#include "core/error.h"
#include "dp/shard_impl.h"

static atomic_bool skip_join;

void fsdp_shard_test_skip_reduce_join(bool on) {
    atomic_store(&skip_join, on);
}

/* The stream and its events, made once. */
static fsdp_status ready(fsdp_ctx *ctx, fsdp_sharded *sh) {
    if (sh->post_ready) return FSDP_OK;
    fsdp_device dev = sh->pool.device;
    FSDP_TRY_AT(ctx, fsdp_stream_create(ctx, dev, &sh->post));
    FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &sh->grads_done));
    FSDP_TRY_AT(ctx, fsdp_event_create(ctx, dev, &sh->reduced));
    sh->post_ready = true;
    return FSDP_OK;
}

fsdp_status fsdp_post_backward_begin(fsdp_ctx *ctx, fsdp_sharded *sh, fsdp_stream *compute) {
    *compute = fsdp_stream_current(sh->pool.device);
    if (sh->pool.device.type == FSDP_DEVICE_CPU) return FSDP_OK;
    FSDP_TRY_AT(ctx, ready(ctx, sh));
    FSDP_TRY_AT(ctx, fsdp_event_record(ctx, sh->grads_done, *compute));
    FSDP_TRY_AT(ctx, fsdp_stream_wait(ctx, sh->post, sh->grads_done));
    fsdp_stream_set_current(sh->post);
    return FSDP_OK;
}

void fsdp_post_backward_end(fsdp_sharded *sh, fsdp_stream compute) {
    if (sh->pool.device.type != FSDP_DEVICE_CPU) fsdp_stream_set_current(compute);
}

fsdp_status fsdp_post_backward_join(fsdp_ctx *ctx, fsdp_sharded *sh) {
    if (!sh->post_ready) return FSDP_OK;
    fsdp_stream compute = fsdp_stream_current(sh->pool.device);
    fsdp_prefetch_trace(sh->units[0], FSDP_REDUCE_JOINED);
    if (atomic_load(&skip_join)) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_event_record(ctx, sh->reduced, sh->post));
    FSDP_TRY_AT(ctx, fsdp_stream_wait(ctx, compute, sh->reduced));
    fsdp_pool_adopt(&sh->pool, sh->post, compute);
    return FSDP_OK;
}

void fsdp_post_backward_release(fsdp_sharded *sh) {
    if (!sh->post_ready) return;
    fsdp_stream_destroy(sh->post); /* waits for its work */
    fsdp_event_destroy(sh->grads_done);
    fsdp_event_destroy(sh->reduced);
    sh->post_ready = false;
}
