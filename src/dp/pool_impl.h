/* pool_impl.h: the caching pool FSDP gathers into. A unit's full parameter, its full gradient and
 * the reduce_scatter output are bound to a pool block only while they are in use, and the
 * block goes back to the pool (not to the allocator) when they are not: after the first step
 * every request finds a cached block, so nothing is allocated per step, and memory held is the
 * most that was in use at once (what PyTorch's caching allocator gives FSDP). Internal. */
#ifndef FSDP_DP_POOL_IMPL_H
#define FSDP_DP_POOL_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/stream.h"
#include "fsdp/tensor.h"

typedef struct fsdp_pool_block {
    fsdp_tensor *buf;    /* 1-D, the block's memory, of the dtype of the first tensor bound to it */
    bool in_use;         /* a tensor is bound to it */
    bool open;           /* in use by a collective left in flight on the host (fsdp_pool_hold) */
    fsdp_stream last_on; /* the current stream when it was given back (its last user's) */
    /* On a device: recorded on last_on when it was given back (after its last use there);
     * freed_set: that record succeeded. given: the pool's count of gives at its last give. */
    fsdp_event freed;
    bool freed_set;
    uint64_t given;
} fsdp_pool_block;

typedef struct fsdp_pool {
    fsdp_device device;
    bool poison; /* fill blocks with NaN when they come back */
    fsdp_pool_block *blocks;
    int n_blocks;
    int64_t cap_blocks;
    int64_t in_use_bytes; /* bytes of the tensors bound now */
    int64_t peak_in_use_bytes;
    int64_t reserved_bytes; /* bytes of all blocks */
    int64_t peak_reserved_bytes;
    /* The caching allocator's cross-stream rule: a block given back on one stream and taken on
     * another makes the taker's stream wait for the block's freed event (or, when that could
     * not be recorded, for all the giver's stream has queued: this event). */
    fsdp_event cross;
    uint64_t gives;
    /* Completes the collectives that hold open blocks (they give them back): called by a take
     * whose best block is open, instead of allocating another (FSDP: fsdp_works_settle). */
    fsdp_status (*settle)(fsdp_ctx *ctx, void *user);
    void *settle_user;
} fsdp_pool;

/* Binds t (any dtype and shape, without storage or not) to the smallest free block of its
 * dtype that holds it, allocating a block of exactly t's size when none does (not zeroed: a
 * block's contents are whatever its last user or the allocation left). Blocks last used
 * on the current stream come first; a block given back on another stream is taken only when
 * that stream has given back another block since (so its last user is not the work just
 * queued there, which the taker would otherwise wait for: a reduce_scatter still reading the
 * gradient block on the post-backward stream), and then the current stream waits for that
 * block's own freed event. Otherwise a new block is allocated: at most one more per stream
 * and size than a single stream needs, as CUDA's caching allocator allocates while an event
 * is pending. */
fsdp_status fsdp_pool_take(fsdp_ctx *ctx, fsdp_pool *pool, fsdp_tensor *t);
/* Marks t's block (held) as open: a collective left in flight on the host still uses it, and
 * whoever completes that collective gives it back. A take counts an open block as free: when it
 * is the best fit, the take calls pool->settle first (so the blocks, and the memory held, are
 * those of the blocking calls'). give clears the mark. */
void fsdp_pool_hold(fsdp_pool *pool, const fsdp_tensor *t);
/* Unbinds t (it is left without storage) and frees its block for the next take. A tensor not
 * bound to one of the pool's blocks, and NULL, are left alone. */
void fsdp_pool_give(fsdp_pool *pool, fsdp_tensor *t);
/* Blocks last used on `from` count as last used on `to`: `to` has waited for all `from` had
 * queued (the end of backward joins the post-backward stream). */
void fsdp_pool_adopt(fsdp_pool *pool, fsdp_stream from, fsdp_stream to);
/* Frees every block (bound tensors must have been given back). */
void fsdp_pool_clear(fsdp_pool *pool);
void fsdp_pool_reset_peak(fsdp_pool *pool);

#endif
