/* pool.c: the caching pool of pool_impl.h: a short list of blocks of one dtype each, best fit
 * among those of the tensor's dtype, no splitting (FSDP asks for the same few sizes in the same
 * order every step). */
#include "dp/pool_impl.h"

#include <math.h>
#include <stdlib.h>

#include "core/array.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "kernels/kernels.h"

static fsdp_pool_block *block_of(const fsdp_pool *pool, const fsdp_tensor *t) {
    for (int i = 0; i < pool->n_blocks; i++)
        if (pool->blocks[i].in_use && pool->blocks[i].buf->storage == t->storage)
            return &pool->blocks[i];
    return NULL;
}

/* A block last used on another stream than the current one: the current stream waits for the
 * block's freed event, or for all that stream has queued (which includes the block's last use)
 * when the event could not be recorded. */
static fsdp_status after_last_user(fsdp_ctx *ctx, fsdp_pool *pool, const fsdp_pool_block *b) {
    fsdp_stream now = fsdp_stream_current(pool->device);
    if (now.handle == b->last_on.handle) return FSDP_OK;
    if (b->freed_set) return fsdp_stream_wait(ctx, now, b->freed);
    if (!pool->cross.handle) FSDP_TRY_AT(ctx, fsdp_event_create(ctx, pool->device, &pool->cross));
    FSDP_TRY_AT(ctx, fsdp_event_record(ctx, pool->cross, b->last_on));
    return fsdp_stream_wait(ctx, now, pool->cross);
}

/* Whether the stream b was given back on has given back another block since. */
static bool settled(const fsdp_pool *pool, const fsdp_pool_block *b) {
    for (int i = 0; i < pool->n_blocks; i++) {
        const fsdp_pool_block *c = &pool->blocks[i];
        if (c != b && c->last_on.handle == b->last_on.handle && c->given > b->given) return true;
    }
    return false;
}

/* When b was given back, for ties: an open block (fsdp_pool_hold) is given back last. */
static uint64_t given_at(const fsdp_pool_block *b) {
    return b->open ? UINT64_MAX : b->given;
}

/* Whether b is a better fit than best (NULL: none yet): smaller, or as small and given back
 * earlier (its last user more likely done). */
static bool better(const fsdp_pool_block *b, const fsdp_pool_block *best) {
    if (!best) return true;
    int64_t nb = fsdp_tensor_numel(b->buf), nbest = fsdp_tensor_numel(best->buf);
    return nb < nbest || (nb == nbest && given_at(b) < given_at(best));
}

fsdp_status fsdp_pool_take(fsdp_ctx *ctx, fsdp_pool *pool, fsdp_tensor *t) {
    int64_t n = fsdp_tensor_numel(t);
    fsdp_dtype dtype = fsdp_tensor_dtype(t);
    int64_t esize = (int64_t)fsdp_dtype_size(dtype);
    fsdp_stream now = fsdp_stream_current(pool->device);
    fsdp_pool_block *best = NULL, *other = NULL; /* on this stream; on another, settled */
    for (int i = 0; i < pool->n_blocks; i++) {
        fsdp_pool_block *b = &pool->blocks[i];
        if ((b->in_use && !b->open) || fsdp_tensor_dtype(b->buf) != dtype ||
            fsdp_tensor_numel(b->buf) < n)
            continue;
        if (b->last_on.handle == now.handle) {
            if (better(b, best)) best = b;
        } else if (settled(pool, b) && better(b, other)) {
            other = b;
        }
    }
    if (!best) best = other;
    if (best && best->open) { /* its collective completes and gives it back, then it is free */
        FSDP_ASSERT(pool->settle != NULL);
        FSDP_TRY_AT(ctx, pool->settle(ctx, pool->settle_user));
        FSDP_ASSERT(!best->in_use);
    }
    if (!best) {
        if (!fsdp_array_reserve((void **)&pool->blocks, &pool->cap_blocks, pool->n_blocks + 1,
                                sizeof *pool->blocks))
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "FSDP pool: cannot grow");
        best = &pool->blocks[pool->n_blocks];
        int64_t len = n > 0 ? n : 1;
        fsdp_status st = fsdp_tensor_create_uninit(ctx, dtype, pool->device, 1, &len, &best->buf);
        if (st != FSDP_OK) return FSDP_PASS(ctx, st);
        best->in_use = best->open = false;
        best->last_on = now;
        best->freed = (fsdp_event){pool->device, NULL};
        best->freed_set = false;
        best->given = 0;
        pool->n_blocks++;
        pool->reserved_bytes += len * esize;
        if (pool->reserved_bytes > pool->peak_reserved_bytes)
            pool->peak_reserved_bytes = pool->reserved_bytes;
        if (pool->device.type != FSDP_DEVICE_CPU)
            FSDP_TRY_AT(ctx, fsdp_event_create(ctx, pool->device, &best->freed));
    }
    FSDP_TRY_AT(ctx, after_last_user(ctx, pool, best));
    FSDP_TRY_AT(ctx, fsdp_tensor_rebind(ctx, t, best->buf, 0));
    best->in_use = true;
    pool->in_use_bytes += n * esize;
    if (pool->in_use_bytes > pool->peak_in_use_bytes) pool->peak_in_use_bytes = pool->in_use_bytes;
    return FSDP_OK;
}

void fsdp_pool_hold(fsdp_pool *pool, const fsdp_tensor *t) {
    fsdp_pool_block *b = t ? block_of(pool, t) : NULL;
    if (b) b->open = true;
}

void fsdp_pool_give(fsdp_pool *pool, fsdp_tensor *t) {
    fsdp_pool_block *b = t ? block_of(pool, t) : NULL;
    if (!b) return;
    b->open = false;
    pool->in_use_bytes -= fsdp_tensor_numel(t) * (int64_t)fsdp_dtype_size(fsdp_tensor_dtype(t));
    b->in_use = false;
    b->last_on = fsdp_stream_current(pool->device);
    b->given = ++pool->gives;
    fsdp_tensor_release_storage(t);
    /* Low-precision blocks are scratch, written whole before every read: not poisoned. */
    if (pool->poison && fsdp_tensor_dtype(b->buf) == FSDP_DTYPE_F32)
        fsdp_kernels_for(pool->device)
            ->fill(fsdp_tensor_f32(b->buf), NAN, fsdp_tensor_numel(b->buf));
    /* after the poison: it is the block's last use here. No context to report a failure to:
     * the taker then waits for the whole stream instead (after_last_user). */
    b->freed_set = b->freed.handle && fsdp_event_record(NULL, b->freed, b->last_on) == FSDP_OK;
}

void fsdp_pool_adopt(fsdp_pool *pool, fsdp_stream from, fsdp_stream to) {
    for (int i = 0; i < pool->n_blocks; i++)
        if (pool->blocks[i].last_on.handle == from.handle) pool->blocks[i].last_on = to;
}

void fsdp_pool_clear(fsdp_pool *pool) {
    for (int i = 0; i < pool->n_blocks; i++) {
        fsdp_tensor_free(pool->blocks[i].buf);
        fsdp_event_destroy(pool->blocks[i].freed);
    }
    free(pool->blocks);
    pool->blocks = NULL;
    pool->n_blocks = pool->cap_blocks = 0;
    pool->reserved_bytes = pool->in_use_bytes = 0;
    fsdp_event_destroy(pool->cross);
    pool->cross = (fsdp_event){0};
}

void fsdp_pool_reset_peak(fsdp_pool *pool) {
    pool->peak_in_use_bytes = pool->in_use_bytes;
    pool->peak_reserved_bytes = pool->reserved_bytes;
}
