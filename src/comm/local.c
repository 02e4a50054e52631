/* local.c: the local backend: the ranks are threads of one process. Each group has a shared
 * rendezvous (local_group.c) where every rank posts its call; the last to arrive checks that
 * the calls agree, then each rank reads its peers' buffers directly and a second stage waits
 * until nobody reads them any more. Device tensors go to local_device.c. Each byte is moved once:
 * an all_gather copies straight from the peers' shards, a reduce_scatter reduces straight
 * into the owner's shard (every rank its own chunk, a block at a time in cache), a large
 * all_reduce reduces each chunk in place on its owner, which the others then copy. Reductions
 * run in rank order, so every rank gets bitwise the same result. Every wait has a deadline. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "comm/local_impl.h"
#include "core/error.h"
#include "core/prof_impl.h" // defines: fsdp_prof_now
#include "core/tensor_impl.h"

/* ---- the collectives ---- */

static const int64_t zeros[FSDP_MAX_DIMS] = {0};

/* The profile's copy time (fsdp/profile.h): the data movement between the rendezvous. */
static double copy_begin(const fsdp_ctx *ctx) {
    return ctx->prof_on ? fsdp_prof_now() : 0.0;
}

static void copy_end(fsdp_ctx *ctx, int op, double t0) {
    if (ctx->prof_on) ctx->prof.comm_copy_s[op] += fsdp_prof_now() - t0;
}

/* Each entry's work (a start's, comm_impl.h): a call on device tensors leaves its completion
 * event in it (local_device.c); one on host tensors is complete when the entry returns. */
static fsdp_status local_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                    const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    if (fsdp_local_on_device(out)) return fsdp_local_device_all_gather(ctx, g, out, in, dim, work);
    fsdp_call c = fsdp_call_all_gather(out, in, dim);
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    const double t0 = copy_begin(ctx);
    int64_t at[FSDP_MAX_DIMS] = {0};
    for (int r = 0; r < g->size; r++) {
        const fsdp_tensor *src = lg->calls[r]->in;
        fsdp_chunk_range(out->shape[dim], g->size, r, &at[dim], NULL);
        fsdp_box_copy(fsdp_tensor_data(out), out->shape, at, fsdp_tensor_data(src), src->shape,
                      zeros, src->shape, out->ndim, fsdp_dtype_size(out->dtype));
    }
    copy_end(ctx, c.op, t0);
    return fsdp_local_rendezvous(ctx, g, c.op, NULL);
}

static fsdp_status local_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                        const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                        const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    if (fsdp_local_on_device(out))
        return fsdp_local_device_reduce_scatter(ctx, g, out, in, dim, op, fuse, work);
    fsdp_call c = fsdp_call_reduce_scatter(out, in, dim, op);
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    int64_t outer = 1, inner = 1, n = in->shape[dim], begin, len;
    for (int i = 0; i < dim; i++) outer *= in->shape[i];
    for (int i = dim + 1; i < in->ndim; i++) inner *= in->shape[i];
    fsdp_chunk_range(n, g->size, g->rank, &begin, &len);
    char *dst = fsdp_tensor_data(out);
    size_t esize = fsdp_dtype_size(in->dtype);
    const double t0 = copy_begin(ctx);
    for (int64_t o = 0; o < outer && len > 0; o++)
        fsdp_reduce_run_fused(dst + (size_t)(o * len * inner) * esize, lg->srcs, g->size,
                              (o * n + begin) * inner, len * inner, in->dtype, op, fuse);
    copy_end(ctx, c.op, t0);
    return fsdp_local_rendezvous(ctx, g, c.op, NULL);
}

static fsdp_status local_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                                    const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    if (fsdp_local_on_device(t)) return fsdp_local_device_all_reduce(ctx, g, t, op, fuse, work);
    fsdp_call c = fsdp_call_all_reduce(t, op);
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    int64_t begin, len;
    fsdp_chunk_range(t->numel, g->size, g->rank, &begin, &len);
    size_t esize = fsdp_dtype_size(t->dtype);
    if (fsdp_tensor_nbytes(t) >= ALL_REDUCE_IN_PLACE_BYTES) {
        /* Each rank reduces its chunk of every rank's tensor into its own tensor's chunk (the
         * only rank that reads that chunk), each byte read once... */
        double t0 = copy_begin(ctx);
        char *mine = fsdp_tensor_data(t);
        if (len > 0)
            fsdp_reduce_run_fused(mine + (size_t)begin * esize, lg->srcs, g->size, begin, len,
                                  t->dtype, op, fuse);
        copy_end(ctx, c.op, t0);
        FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, NULL));
        /* ...then copies every other rank's reduced chunk from that rank's tensor... */
        t0 = copy_begin(ctx);
        for (int r = 0; r < g->size; r++) {
            int64_t b, n;
            fsdp_chunk_range(t->numel, g->size, r, &b, &n);
            if (r != g->rank && n > 0)
                memcpy(mine + (size_t)b * esize, (const char *)lg->srcs[r] + (size_t)b * esize,
                       (size_t)n * esize);
        }
        copy_end(ctx, c.op, t0);
        /* ...and returns once nobody reads its tensor any more. */
        return fsdp_local_rendezvous(ctx, g, c.op, NULL);
    }
    /* Each rank reduces its chunk of the elements into the shared scratch... */
    double t0 = copy_begin(ctx);
    if (len > 0)
        fsdp_reduce_run_fused((char *)lg->scratch + (size_t)begin * esize, lg->srcs, g->size, begin,
                              len, t->dtype, op, fuse);
    copy_end(ctx, c.op, t0);
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, NULL));
    /* ...and once all are written (and nobody reads the inputs), every rank copies the whole.
     * The scratch is not touched again before every rank has arrived at its next call. An
     * empty tensor (a dp rank without samples) has no storage and the scratch may be NULL:
     * memcpy must not see them even for 0 bytes. */
    t0 = copy_begin(ctx);
    if (t->numel > 0) memcpy(fsdp_tensor_data(t), lg->scratch, fsdp_tensor_nbytes(t));
    copy_end(ctx, c.op, t0);
    return FSDP_OK;
}

static fsdp_status local_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                                   fsdp_comm_work *work) {
    if (fsdp_local_on_device(t)) return fsdp_local_device_broadcast(ctx, g, t, root, work);
    fsdp_call c = fsdp_call_broadcast(t, root);
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    const double t0 = copy_begin(ctx);
    if (g->rank != root && t->numel > 0)
        memcpy(fsdp_tensor_data(t), fsdp_tensor_data(lg->calls[root]->out), fsdp_tensor_nbytes(t));
    copy_end(ctx, c.op, t0);
    return fsdp_local_rendezvous(ctx, g, c.op, NULL);
}

static fsdp_status local_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                    const fsdp_tensor *in, int split_dim, int concat_dim,
                                    fsdp_comm_work *work) {
    if (fsdp_local_on_device(out))
        return fsdp_local_device_all_to_all(ctx, g, out, in, split_dim, concat_dim, work);
    fsdp_call c = fsdp_call_all_to_all(out, in, split_dim, concat_dim);
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    const double t0 = copy_begin(ctx);
    int64_t at = 0; /* where along concat_dim the next rank's piece goes */
    for (int r = 0; r < g->size; r++) {
        const fsdp_tensor *src = lg->calls[r]->in;
        int64_t box[FSDP_MAX_DIMS], src_at[FSDP_MAX_DIMS] = {0}, dst_at[FSDP_MAX_DIMS] = {0};
        memcpy(box, src->shape, sizeof box);
        fsdp_chunk_range(src->shape[split_dim], g->size, g->rank, &src_at[split_dim],
                         &box[split_dim]);
        dst_at[concat_dim] = at;
        fsdp_box_copy(fsdp_tensor_data(out), out->shape, dst_at, fsdp_tensor_data(src), src->shape,
                      src_at, box, out->ndim, fsdp_dtype_size(out->dtype));
        at += box[concat_dim];
    }
    copy_end(ctx, c.op, t0);
    return fsdp_local_rendezvous(ctx, g, c.op, NULL);
}

static fsdp_status local_barrier(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_work *work) {
    (void)work; /* the ranks meet on the host: complete when it returns */
    fsdp_call c = {.op = FSDP_COMM_BARRIER};
    return fsdp_local_rendezvous(ctx, g, c.op, &c);
}

static void local_reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op) {
    fsdp_call c = {.op = op, .rejected = ctx->error.status, .reject_msg = ctx->error.message};
    (void)fsdp_local_rendezvous(ctx, g, op, &c);
}

static fsdp_status local_split(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                               const char *agree, fsdp_group_info *out) {
    fsdp_call c = {.op = FSDP_OP_SPLIT, .color = color, .key = key, .agree = agree};
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, parent, c.op, &c));
    const local_group *lg = parent->state;
    local_group *child = lg->split_group[parent->rank];
    *out = (fsdp_group_info){0};
    if (child)
        *out = (fsdp_group_info){.state = child,
                                 .size = child->size,
                                 .rank = lg->split_rank[parent->rank],
                                 .ranks = child->ranks};
    return FSDP_OK;
}

/* Every member's shard moves into one block, side by side in group-rank order (the judge
 * allocates it); each member relocates its own, then waits until all have. */
static fsdp_status local_share_shards(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *shard,
                                      fsdp_tensor **full) {
    fsdp_call c = {.op = FSDP_OP_SHARE, .dtype = shard->dtype, .ndim = 1, .in = shard};
    c.shape[0] = shard->numel;
    FSDP_TRY_AT(ctx, fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    shared_block *b = lg->share_block; /* read before the next rendezvous lets a new call in */
    char *data = (char *)b + SHARED_HEADER;
    const size_t shard_bytes = (size_t)shard->numel * fsdp_dtype_size(shard->dtype);
    fsdp_tensor_relocate(shard, data + (size_t)g->rank * shard_bytes, fsdp_local_shared_release, b);
    int64_t total = (int64_t)g->size * shard->numel;
    fsdp_status st =
        fsdp_tensor_over(ctx, data, shard->dtype, 1, &total, fsdp_local_shared_release, b, full);
    if (st != FSDP_OK) fsdp_local_shared_release(b); /* the hold *full would have had */
    fsdp_status done = fsdp_local_rendezvous(ctx, g, c.op, NULL);
    if (st == FSDP_OK && done != FSDP_OK) {
        fsdp_tensor_free(*full);
        *full = NULL;
        st = done;
    }
    return FSDP_PASS(ctx, st);
}

/* ---- the world ---- */

static void local_hosted_ranks(void *context, int *first, int *count) {
    const local_world *lw = context;
    *first = 0;
    *count = lw->size;
}

static void local_world_group(void *context, int rank, fsdp_group_info *out) {
    const local_world *lw = context;
    *out = (fsdp_group_info){
        .state = lw->world_group, .size = lw->size, .rank = rank, .ranks = lw->world_group->ranks};
}

static void local_reset(void *context) {
    local_world *lw = context;
    for (local_group *lg = atomic_load(&lw->groups); lg; lg = lg->next) {
        pthread_mutex_lock(&lg->mu);
        lg->stage = 0;
        lg->waiting = 0;
        memset(lg->entered, 0, (size_t)lg->size * sizeof *lg->entered);
        lg->poisoned = false;
        lg->verdict = FSDP_OK;
        pthread_mutex_unlock(&lg->mu);
    }
}

static void local_rank_exited(void *context, int rank) {
    local_world *lw = context;
    (void)rank; /* waiters check every missing member; wake them all */
    for (local_group *lg = atomic_load(&lw->groups); lg; lg = lg->next) {
        pthread_mutex_lock(&lg->mu);
        pthread_cond_broadcast(&lg->cv);
        pthread_mutex_unlock(&lg->mu);
    }
}

static void local_free(void *context) {
    local_world *lw = context;
    if (!lw) return;
    local_group *lg = atomic_load(&lw->groups);
    while (lg) {
        local_group *next = lg->next;
        fsdp_local_group_free(lg);
        lg = next;
    }
    free(lw);
}

static const fsdp_comm_backend_i local_iface = {
    .name = "local",
    .device = FSDP_DEVICE_CPU,
    .moves_devices = true,
    .hosted_ranks = local_hosted_ranks,
    .world_group = local_world_group,
    .split = local_split,
    .share_shards = local_share_shards,
    .all_gather = local_all_gather,
    .reduce_scatter = local_reduce_scatter,
    .all_reduce = local_all_reduce,
    .broadcast = local_broadcast,
    .all_to_all = local_all_to_all,
    .barrier = local_barrier,
    .work_test = fsdp_local_work_test,
    .work_wait = fsdp_local_work_wait,
    .work_wait_stream = fsdp_local_work_wait_stream,
    .reject = local_reject,
    .reset = local_reset,
    .rank_exited = local_rank_exited,
    .free = local_free,
};

fsdp_status fsdp_local_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks) {
    world->size = nranks ? nranks : 1;
    if (world->size > LOCAL_MAX_RANKS)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "the local backend runs at most %d rank threads; %d were asked for",
                         LOCAL_MAX_RANKS, world->size);
    local_world *lw = calloc(1, sizeof *lw);
    int *ranks = malloc((size_t)world->size * sizeof *ranks);
    if (lw && ranks) {
        lw->world = world;
        lw->size = world->size;
        atomic_init(&lw->groups, NULL);
        for (int r = 0; r < world->size; r++) ranks[r] = r;
        lw->world_group = fsdp_local_group_new(lw, world->size, ranks);
    }
    free(ranks);
    if (!lw || !lw->world_group) {
        free(lw);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                         "cannot allocate the local backend for %d ranks", world->size);
    }
    world->backend = (fsdp_comm_backend){.iface = local_iface, .context = lw};
    return FSDP_OK;
}
