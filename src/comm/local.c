/* local.c: the local backend: the ranks are threads of one process. Each group has a shared
 * rendezvous (mutex, condition variable, stage counter) where every rank posts its call; the
 * last to arrive checks that the calls agree, then each rank reads its peers' buffers
 * directly and a second stage waits until nobody reads them any more. Each byte is moved once:
 * an all_gather copies straight from the peers' shards, a reduce_scatter reduces straight
 * into the owner's shard (every rank its own chunk, a block at a time in cache), a large
 * all_reduce reduces each chunk in place on its owner, which the others then copy. Reductions
 * run in rank order, so every rank gets bitwise the same result. Every wait has a deadline. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "comm/local_impl.h"
#include "core/array.h"
#include "core/error.h"
#include "core/prof_impl.h" // defines: fsdp_prof_now
#include "core/tensor_impl.h"

/* ---- group states ---- */

static void group_state_free(local_group *lg) {
    pthread_mutex_destroy(&lg->mu);
    pthread_cond_destroy(&lg->cv);
    free(lg->ranks);
    free(lg->entered);
    free(lg->calls);
    free(lg->srcs);
    free(lg->scratch);
    free(lg->split_group);
    free(lg->split_rank);
    fsdp_local_events_free(lg->events, lg->size);
    free(lg);
}

/* A new group state over `size` world ranks, added to the world's list. NULL when out of
 * memory. */
static local_group *group_state_new(local_world *lw, int size, const int *ranks) {
    local_group *lg = calloc(1, sizeof *lg);
    if (!lg) return NULL;
    size_t n = (size_t)size;
    lg->ranks = malloc(n * sizeof *lg->ranks);
    lg->entered = calloc(n, sizeof *lg->entered);
    lg->calls = calloc(n, sizeof *lg->calls);
    lg->srcs = calloc(n, sizeof *lg->srcs);
    lg->split_group = calloc(n, sizeof *lg->split_group);
    lg->split_rank = calloc(n, sizeof *lg->split_rank);
    lg->events = calloc(n, sizeof *lg->events);
    pthread_condattr_t attr;
    bool sync_ok = pthread_condattr_init(&attr) == 0;
    sync_ok = sync_ok && pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
              pthread_cond_init(&lg->cv, &attr) == 0;
    pthread_condattr_destroy(&attr);
    if (sync_ok && pthread_mutex_init(&lg->mu, NULL) != 0) {
        pthread_cond_destroy(&lg->cv);
        sync_ok = false;
    }
    if (!sync_ok || !lg->ranks || !lg->entered || !lg->calls || !lg->srcs || !lg->split_group ||
        !lg->split_rank || !lg->events) {
        if (sync_ok) {
            group_state_free(lg);
        } else {
            free(lg->ranks), free(lg->entered), free(lg->calls), free(lg->srcs);
            free(lg->split_group), free(lg->split_rank), free(lg->events), free(lg);
        }
        return NULL;
    }
    memcpy(lg->ranks, ranks, n * sizeof *lg->ranks);
    lg->size = size;
    lg->lw = lw;
    local_group *head = atomic_load(&lw->groups);
    do lg->next = head;
    while (!atomic_compare_exchange_weak(&lw->groups, &head, lg));
    return lg;
}

/* ---- judging a call ---- */

/* Sets the verdict to `status` with a printf-style message. */
static void set_verdict(local_group *lg, fsdp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_verdict(local_group *lg, fsdp_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lg->verdict_msg, sizeof lg->verdict_msg, fmt, ap);
    va_end(ap);
    lg->verdict = status;
}

static void make_split_groups(local_group *lg, const fsdp_group *g) {
    int n = lg->size;
    int *order = malloc((size_t)n * sizeof *order);
    for (int r = 0; r < n; r++) lg->split_group[r] = NULL, lg->split_rank[r] = -1;
    for (int first = 0; order && first < n; first++) {
        int color = lg->calls[first]->color;
        if (color < 0 || lg->split_rank[first] >= 0) continue;
        int m = 0; /* members of this color, sorted by (key, parent rank) */
        for (int r = first; r < n; r++) {
            if (lg->calls[r]->color != color) continue;
            int key = lg->calls[r]->key, at = m++;
            while (at > 0 && lg->calls[order[at - 1]]->key > key) order[at] = order[at - 1], at--;
            order[at] = r;
        }
        int world_ranks[LOCAL_MAX_RANKS];
        for (int i = 0; i < m; i++) world_ranks[i] = lg->ranks[order[i]];
        local_group *child = group_state_new(lg->lw, m, world_ranks);
        if (!child) break;
        for (int i = 0; i < m; i++) lg->split_group[order[i]] = child, lg->split_rank[order[i]] = i;
    }
    for (int r = 0; r < n; r++) {
        if (lg->calls[r]->color >= 0 && !lg->split_group[r]) {
            set_verdict(lg, FSDP_ERR_OUT_OF_MEMORY, "group split of %s: out of memory", g->desc);
            break;
        }
    }
    free(order);
}

/* ---- blocks of shards (fsdp_group_share_shards) ---- */

/* A count of the storages on the block, then its data from SHARED_HEADER bytes on. Every
 * member holds two (its relocated shard and its full tensor); the last to let go frees it. */
typedef struct shared_block {
    atomic_int refs;
} shared_block;
#define SHARED_HEADER 64

static void shared_block_release(void *arg) {
    shared_block *b = arg;
    if (atomic_fetch_sub(&b->refs, 1) == 1) free(b);
}

/* Run by the judge: the block for `size` members' shards of `shard_bytes` each. */
static void make_share_block(local_group *lg, const fsdp_group *g, size_t shard_bytes) {
    void *p = NULL;
    size_t bytes = SHARED_HEADER + (size_t)lg->size * shard_bytes;
    if (posix_memalign(&p, SHARED_HEADER, bytes) != 0) {
        set_verdict(lg, FSDP_ERR_OUT_OF_MEMORY,
                    "shard sharing on group %s: cannot allocate %zu bytes for the shards", g->desc,
                    bytes);
        return;
    }
    lg->share_block = p;
    atomic_init(&lg->share_block->refs, 2 * lg->size);
}

/* Run by the last rank to arrive, under the lock, with every call posted: decides whether
 * the call goes ahead and prepares what the ranks share for it. */
static void judge(local_group *lg, const fsdp_group *g) {
    const fsdp_call *mine = lg->calls[g->rank];
    lg->verdict = fsdp_call_judge(lg->calls, lg->size, g->rank, lg->ranks, g->desc, lg->verdict_msg,
                                  sizeof lg->verdict_msg);
    if (lg->verdict != FSDP_OK) return;
    if (mine->op == FSDP_OP_SPLIT) {
        make_split_groups(lg, g);
        return;
    }
    if (mine->op == FSDP_OP_SHARE) {
        make_share_block(lg, g, (size_t)mine->shape[0] * fsdp_dtype_size(mine->dtype));
        return;
    }
    if (mine->op == FSDP_COMM_REDUCE_SCATTER || mine->op == FSDP_COMM_ALL_REDUCE) {
        for (int r = 0; r < lg->size; r++)
            lg->srcs[r] = fsdp_tensor_data(mine->op == FSDP_COMM_ALL_REDUCE ? lg->calls[r]->out
                                                                            : lg->calls[r]->in);
    }
    if (mine->op == FSDP_COMM_ALL_REDUCE &&
        fsdp_tensor_nbytes(mine->out) < ALL_REDUCE_IN_PLACE_BYTES) {
        size_t need = fsdp_tensor_nbytes(mine->out);
        if (!fsdp_array_reserve(&lg->scratch, &lg->scratch_cap, (int64_t)need, 1)) {
            set_verdict(lg, FSDP_ERR_OUT_OF_MEMORY,
                        "all_reduce on group %s: cannot allocate %zu bytes of shared scratch",
                        g->desc, need);
            return;
        }
    }
}

/* ---- waiting ---- */

static void poison(local_group *lg, fsdp_status status, const char *msg) {
    lg->poisoned = true;
    lg->poison_status = status;
    snprintf(lg->poison_msg, sizeof lg->poison_msg, "%s", msg);
    pthread_cond_broadcast(&lg->cv);
}

void fsdp_local_poison(const fsdp_group *g, fsdp_status status, const char *msg) {
    local_group *lg = g->state;
    pthread_mutex_lock(&lg->mu);
    char why[FSDP_ERROR_MAX];
    snprintf(why, sizeof why, "%s on group %s failed on world rank %d: %s",
             fsdp_call_op_name(lg->calls[g->rank] ? lg->calls[g->rank]->op : 0), g->desc,
             lg->ranks[g->rank], msg);
    poison(lg, status, why);
    pthread_mutex_unlock(&lg->mu);
}

/* The first member that has not entered stage `target` and whose function has returned, or
 * -1. */
static int gone_member(const local_group *lg, uint64_t target) {
    for (int r = 0; r < lg->size; r++) {
        if (lg->entered[r] >= target) continue;
        if (atomic_load(&lg->lw->world->results[lg->ranks[r]].exited)) return r;
    }
    return -1;
}

/* The wait failed (f: what went wrong): the group is poisoned, so that every member fails. */
static fsdp_status fail_and_poison(fsdp_ctx *ctx, local_group *lg, const fsdp_comm_failure *f) {
    char msg[FSDP_ERROR_MAX];
    fsdp_status st = fsdp_comm_failure_format(f, msg, sizeof msg);
    poison(lg, st, msg);
    return FSDP_FAIL(ctx, st, "%s", msg);
}

static fsdp_status fail_gone(fsdp_ctx *ctx, const fsdp_group *g, local_group *lg, int op,
                             int member) {
    fsdp_comm_failure f = {.kind = FSDP_FAILURE_GONE,
                           .op = op,
                           .group_desc = g->desc,
                           .gone_rank = lg->ranks[member],
                           .gone = &lg->lw->world->results[lg->ranks[member]],
                           .group_id = g->id,
                           .group_seq = g->calls};
    return fail_and_poison(ctx, lg, &f);
}

/* The forensics of a timed-out arrival: the missing members' flight recorders, read
 * directly (the ranks share the address space). */
static void forensics(const fsdp_group *g, const local_group *lg, const bool *missing, char *buf,
                      size_t size) {
    buf[0] = '\0';
    const size_t n = lg->size > 0 ? (size_t)lg->size : 1;
    fsdp_trace_view *views = calloc(n, sizeof *views);
    if (!views) return;
    int shown = 0;
    for (int m = 0; m < lg->size && shown < FSDP_TRACE_EXPLAINED; m++) {
        if (!missing[m]) continue;
        fsdp_trace_view_build(lg->lw->world->traces[lg->ranks[m]], g->id, &views[m]);
        shown++;
    }
    fsdp_trace_forensics(buf, size, g->calls, g->desc, lg->size, lg->ranks, missing, views, 0);
    free(views);
}

static fsdp_status fail_timeout(fsdp_ctx *ctx, const fsdp_group *g, local_group *lg, int op,
                                uint64_t target) {
    bool missing[LOCAL_MAX_RANKS];
    for (int r = 0; r < lg->size; r++) missing[r] = lg->entered[r] < target;
    char why[FSDP_ERROR_MAX];
    forensics(g, lg, missing, why, sizeof why);
    fsdp_comm_failure f = {.kind = FSDP_FAILURE_ARRIVAL,
                           .op = op,
                           .group_desc = g->desc,
                           .timeout_ms = lg->lw->world->timeout_ms,
                           .n_members = lg->size,
                           .ranks = lg->ranks,
                           .missing = missing,
                           .forensics = why};
    return fail_and_poison(ctx, lg, &f);
}

static struct timespec deadline_after(int ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

static bool before(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Logs whom a wait of stage `target` that has lasted waited_s waits for, and what they do
 * meanwhile (their flight recorders). */
static void log_wait(fsdp_ctx *ctx, const fsdp_group *g, const local_group *lg, int op,
                     uint64_t target, double waited_s) {
    bool missing[LOCAL_MAX_RANKS];
    for (int r = 0; r < lg->size; r++) missing[r] = lg->entered[r] < target;
    char why[FSDP_ERROR_MAX];
    forensics(g, lg, missing, why, sizeof why);
    fsdp_comm_wait_log(ctx, op, g->desc, lg->size, lg->ranks, missing, false, waited_s,
                       lg->lw->world->timeout_ms, why);
}

/* Waits (holding lg->mu) until every member has entered stage `target`; logs whom it waits
 * for every fsdp_comm_log_every_s of the timeout. */
static fsdp_status wait_stage(fsdp_ctx *ctx, const fsdp_group *g, local_group *lg, int op,
                              uint64_t target) {
    const int timeout_ms = lg->lw->world->timeout_ms;
    const int every_ms = (int)(1e3 * fsdp_comm_log_every_s(timeout_ms));
    struct timespec deadline = deadline_after(timeout_ms), next_log = deadline_after(every_ms);
    int logs = 0;
    bool timed_out = false;
    for (;;) {
        if (lg->stage >= target) return FSDP_OK;
        if (lg->poisoned)
            return fsdp_comm_fail_poisoned(ctx, g, op, lg->poison_status, lg->poison_msg);
        int gone = gone_member(lg, target);
        if (gone >= 0) return fail_gone(ctx, g, lg, op, gone);
        if (timed_out) return fail_timeout(ctx, g, lg, op, target);
        const bool log_first = before(&next_log, &deadline);
        if (pthread_cond_timedwait(&lg->cv, &lg->mu, log_first ? &next_log : &deadline) !=
            ETIMEDOUT)
            continue;
        if (!log_first) {
            timed_out = true;
        } else {
            log_wait(ctx, g, lg, op, target, 1e-3 * every_ms * ++logs);
            next_log = deadline_after(every_ms);
        }
    }
}

fsdp_status fsdp_local_rendezvous(fsdp_ctx *ctx, const fsdp_group *g, int op,
                                  const fsdp_call *post) {
    local_group *lg = g->state;
    pthread_mutex_lock(&lg->mu);
    fsdp_status st = FSDP_OK;
    if (lg->poisoned) {
        st = fsdp_comm_fail_poisoned(ctx, g, op, lg->poison_status, lg->poison_msg);
    } else {
        if (post) lg->calls[g->rank] = post;
        uint64_t target = ++lg->entered[g->rank];
        if (++lg->waiting == lg->size) {
            lg->waiting = 0;
            if (post) judge(lg, g);
            lg->stage = target;
            pthread_cond_broadcast(&lg->cv);
        } else {
            st = wait_stage(ctx, g, lg, op, target);
        }
        if (st == FSDP_OK && post && lg->verdict != FSDP_OK)
            st = FSDP_FAIL(ctx, lg->verdict, "%s", lg->verdict_msg);
    }
    pthread_mutex_unlock(&lg->mu);
    return st;
}

/* ---- the collectives ---- */

static const int64_t zeros[FSDP_MAX_DIMS] = {0};

/* The profile's copy time (fsdp/profile.h): the data movement between the rendezvous. */
static double copy_begin(const fsdp_ctx *ctx) {
    return ctx->prof_on ? fsdp_prof_now() : 0.0;
}

static void copy_end(fsdp_ctx *ctx, int op, double t0) {
    if (ctx->prof_on) ctx->prof.comm_copy_s[op] += fsdp_prof_now() - t0;
}

static fsdp_status local_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                    const fsdp_tensor *in, int dim) {
    if (fsdp_local_on_device(out)) return fsdp_local_device_all_gather(ctx, g, out, in, dim);
    fsdp_call c = fsdp_call_all_gather(out, in, dim);
    FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, &c));
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
                                        const fsdp_reduce_options *fuse) {
    if (fsdp_local_on_device(out))
        return fsdp_local_device_reduce_scatter(ctx, g, out, in, dim, op, fuse);
    fsdp_call c = fsdp_call_reduce_scatter(out, in, dim, op);
    FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, &c));
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
                                    const fsdp_reduce_options *fuse) {
    if (fsdp_local_on_device(t)) return fsdp_local_device_all_reduce(ctx, g, t, op, fuse, NULL);
    fsdp_call c = fsdp_call_all_reduce(t, op);
    FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, &c));
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
        FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, NULL));
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
    FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, NULL));
    /* ...and once all are written (and nobody reads the inputs), every rank copies the whole.
     * The scratch is not touched again before every rank has arrived at its next call. An
     * empty tensor (a dp rank without samples) has no storage and the scratch may be NULL:
     * memcpy must not see them even for 0 bytes. */
    t0 = copy_begin(ctx);
    if (t->numel > 0) memcpy(fsdp_tensor_data(t), lg->scratch, fsdp_tensor_nbytes(t));
    copy_end(ctx, c.op, t0);
    return FSDP_OK;
}

static fsdp_status local_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root) {
    if (fsdp_local_on_device(t)) return fsdp_local_device_broadcast(ctx, g, t, root);
    fsdp_call c = fsdp_call_broadcast(t, root);
    FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    const double t0 = copy_begin(ctx);
    if (g->rank != root && t->numel > 0)
        memcpy(fsdp_tensor_data(t), fsdp_tensor_data(lg->calls[root]->out), fsdp_tensor_nbytes(t));
    copy_end(ctx, c.op, t0);
    return fsdp_local_rendezvous(ctx, g, c.op, NULL);
}

static fsdp_status local_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                    const fsdp_tensor *in, int split_dim, int concat_dim) {
    if (fsdp_local_on_device(out))
        return fsdp_local_device_all_to_all(ctx, g, out, in, split_dim, concat_dim);
    fsdp_call c = fsdp_call_all_to_all(out, in, split_dim, concat_dim);
    FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, &c));
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

/* On the host the call is complete when it returns (the work is idle); on a device the work
 * holds the call's completion event. */
static fsdp_status local_all_reduce_start(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t,
                                          fsdp_reduce_op op, const fsdp_reduce_options *fuse,
                                          fsdp_comm_work *work) {
    if (fsdp_local_on_device(t)) return fsdp_local_device_all_reduce(ctx, g, t, op, fuse, work);
    fsdp_status st = local_all_reduce(ctx, g, t, op, fuse);
    work->pending = false;
    work->group = NULL;
    return st;
}

static fsdp_status local_barrier(fsdp_ctx *ctx, fsdp_group *g) {
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
    FSDP_TRY(fsdp_local_rendezvous(ctx, parent, c.op, &c));
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
    FSDP_TRY(fsdp_local_rendezvous(ctx, g, c.op, &c));
    const local_group *lg = g->state;
    shared_block *b = lg->share_block; /* read before the next rendezvous lets a new call in */
    char *data = (char *)b + SHARED_HEADER;
    const size_t shard_bytes = (size_t)shard->numel * fsdp_dtype_size(shard->dtype);
    fsdp_tensor_relocate(shard, data + (size_t)g->rank * shard_bytes, shared_block_release, b);
    int64_t total = (int64_t)g->size * shard->numel;
    fsdp_status st =
        fsdp_tensor_over(ctx, data, shard->dtype, 1, &total, shared_block_release, b, full);
    if (st != FSDP_OK) shared_block_release(b); /* the hold *full would have had */
    fsdp_status done = fsdp_local_rendezvous(ctx, g, c.op, NULL);
    if (st == FSDP_OK && done != FSDP_OK) {
        fsdp_tensor_free(*full);
        *full = NULL;
        st = done;
    }
    return st;
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
        group_state_free(lg);
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
    .all_reduce_start = local_all_reduce_start,
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
        lw->world_group = group_state_new(lw, world->size, ranks);
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
