/* local_group.c: the local backend's group states and their rendezvous: each group has a
 * shared state (mutex, condition variable, stage counter) where every member posts its call;
 * the last to arrive judges the calls (and prepares what the members share for it: split
 * groups, a block of shards, the scratch), and every wait has the world's deadline, after which
 * the group is poisoned and every member fails naming whom it waited for. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/local_impl.h"
#include "core/array.h"
#include "core/error.h"
#include "core/tensor_impl.h"

/* ---- events of device collectives ---- */

static void events_destroy(local_events *e) {
    for (int k = 0; k < LOCAL_EV_COUNT; k++) fsdp_event_destroy(e->ev[k]);
}

static void events_free(local_events *events, int n) {
    if (!events) return;
    for (int r = 0; r < n; r++) {
        events_destroy(&events[r]);
        for (local_retired_events *old = events[r].retired, *next; old; old = next) {
            next = old->next;
            events_destroy(&old->events);
            free(old);
        }
    }
    free(events);
}

/* ---- group states ---- */

void fsdp_local_group_free(local_group *lg) {
    pthread_mutex_destroy(&lg->mu);
    pthread_cond_destroy(&lg->cv);
    free(lg->ranks);
    free(lg->entered);
    free(lg->calls);
    free(lg->srcs);
    free(lg->scratch);
    free(lg->split_group);
    free(lg->split_rank);
    events_free(lg->events, lg->size);
    free(lg);
}

local_group *fsdp_local_group_new(local_world *lw, int size, const int *ranks) {
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
            fsdp_local_group_free(lg);
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
        local_group *child = fsdp_local_group_new(lg->lw, m, world_ranks);
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

void fsdp_local_shared_release(void *arg) {
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
    fsdp_comm_wait_log(ctx, op, g->desc, lg->size, lg->ranks, missing, FSDP_WAIT_LOG_ARRIVAL,
                       waited_s, lg->lw->world->timeout_ms, why);
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
    return FSDP_PASS(ctx, st);
}
