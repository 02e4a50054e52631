/* mpi_async.c: the MPI backend's non-blocking all_reduce. The start exchanges descriptors (as
 * every call does) and posts the first step, every rank's pieces of each chunk; the rank-order
 * reduction and the gather of the reduced chunks follow when a test or wait sees that step
 * complete. The steps and arithmetic are the blocking all_reduce's (mpi_collectives.c), so the
 * bits are too, and the waits are mpi_wait.c's, with their deadlines and failure notes. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h"

struct mpi_work {
    mpi_work *next; /* the group's pending works, in start order */
    mpi_group *mg;  /* while pending; NULL once complete, failed or detached */
    const fsdp_group *g;
    fsdp_tensor *t;
    fsdp_reduce_op op;
    bool gathering; /* the first step has completed and the gather is posted */
    mpi_reqs rq;
    const void **srcs; /* per member: its piece of this rank's chunk */
    int cap_srcs;
    char *buf; /* the pieces received */
    size_t cap_buf;
    fsdp_status failed; /* detached by a failure: its status and message */
    char msg[FSDP_ERROR_MAX];
};

static const int OP = FSDP_COMM_ALL_REDUCE;

static void unlink_work(mpi_work *w) {
    if (!w->mg) return;
    mpi_work **p = &w->mg->works;
    while (*p && *p != w) p = &(*p)->next;
    if (*p) *p = w->next;
    w->next = NULL;
    w->mg = NULL;
}

/* Every pending work of the group fails (the group is poisoned already): its requests are
 * dropped, and its wait reports status and msg. */
static void fail_all(mpi_group *mg, fsdp_status status, const char *msg) {
    while (mg->works) {
        mpi_work *w = mg->works;
        fsdp_mpi_abandon(&w->rq);
        w->failed = status;
        snprintf(w->msg, sizeof w->msg, "%s", msg);
        unlink_work(w);
    }
}

static fsdp_status fail_all_with(fsdp_ctx *ctx, mpi_group *mg, fsdp_status st) {
    fail_all(mg, st, fsdp_last_error(ctx));
    return st;
}

void fsdp_mpi_works_detach(mpi_group *mg) {
    if (!mg->works) return;
    char msg[FSDP_ERROR_MAX];
    snprintf(msg, sizeof msg,
             "a non-blocking all_reduce on a group of %d ranks was still in flight when its run "
             "ended or its world was freed; wait for it (fsdp_comm_work_wait) inside the run",
             mg->size);
    fail_all(mg, FSDP_ERR_STATE, msg);
}

static void work_free_state(void *state) {
    mpi_work *w = state;
    if (!w) return;
    if (w->mg) { /* still in flight: abandoned, and the group fails as after a timeout */
        mpi_group *mg = w->mg;
        char msg[FSDP_ERROR_MAX];
        snprintf(msg, sizeof msg,
                 "all_reduce on group %s: its work was freed while the call was in flight; wait "
                 "for a work (fsdp_comm_work_wait) before freeing it",
                 w->g->desc);
        fsdp_mpi_abandon(&w->rq);
        unlink_work(w);
        fsdp_mpi_poison(mg, FSDP_ERR_STATE, msg);
        fail_all(mg, FSDP_ERR_STATE, msg);
    }
    fsdp_mpi_reqs_release(&w->rq);
    free(w->srcs);
    free(w->buf);
    free(w);
}

/* Room for W sources and `bytes` of received pieces. */
static bool reserve(mpi_work *w, int W, size_t bytes) {
    if (W > w->cap_srcs) {
        const void **s = realloc(w->srcs, (size_t)W * sizeof *s);
        if (!s) return false;
        w->srcs = s;
        w->cap_srcs = W;
    }
    if (bytes > w->cap_buf) {
        char *b = realloc(w->buf, bytes);
        if (!b) return false;
        w->buf = b;
        w->cap_buf = bytes;
    }
    return true;
}

fsdp_status fsdp_mpi_all_reduce_start(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t,
                                      fsdp_reduce_op op, fsdp_comm_work *work) {
    mpi_group *mg = g->state;
    mpi_work *w = work->state;
    int64_t len;
    fsdp_chunk_range(t->numel, g->size, g->rank, NULL, &len);
    size_t bytes = (size_t)((g->size - 1) * len) * fsdp_dtype_size(t->dtype);
    if (!w && (w = calloc(1, sizeof *w)) != NULL) {
        work->state = w;
        work->free_state = work_free_state;
    }
    if (!w || !reserve(w, g->size, bytes)) {
        /* The peers fail at once instead of waiting for this rank's descriptor. */
        FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                  "all_reduce on group %s: cannot allocate %zu bytes for a non-blocking call",
                  g->desc, bytes);
        fsdp_mpi_reject(ctx, g, FSDP_COMM_ALL_REDUCE);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    fsdp_call c = fsdp_call_all_reduce(t, op);
    FSDP_TRY(fsdp_mpi_arrive(ctx, g, &c));
    *w = (mpi_work){.mg = mg,
                    .g = g,
                    .t = t,
                    .op = op,
                    .rq = w->rq,
                    .srcs = w->srcs,
                    .cap_srcs = w->cap_srcs,
                    .buf = w->buf,
                    .cap_buf = w->cap_buf};
    w->rq.n = 0;
    mpi_work **tail = &mg->works;
    while (*tail) tail = &(*tail)->next;
    *tail = w;
    fsdp_status st = fsdp_mpi_all_reduce_exchange(ctx, g, mg, &w->rq, t, w->srcs, w->buf);
    return st == FSDP_OK ? st : fail_all_with(ctx, mg, st);
}

/* Advances the group's works in start order up to `until` (NULL: all): a work whose first step
 * has completed is reduced and its gather posted. The gathers go out in start order on every
 * rank (their messages share one tag), so a work whose first step is still open stops the
 * others behind it; with `block` its first step is waited for instead. */
static fsdp_status advance(fsdp_ctx *ctx, mpi_group *mg, const mpi_work *until, bool block) {
    for (mpi_work *x = mg->works; x; x = x->next) {
        if (!x->gathering) {
            bool done = true;
            fsdp_status st = block ? fsdp_mpi_wait_set(ctx, x->g, mg, &x->rq, OP, WAIT_DATA)
                                   : fsdp_mpi_test_set(ctx, x->g, mg, &x->rq, OP, &done);
            if (st != FSDP_OK) return fail_all_with(ctx, mg, st);
            if (!done) return FSDP_OK;
            st =
                fsdp_mpi_all_reduce_gather(ctx, x->g, mg, &x->rq, x->t, x->op, x->srcs, TAG_GATHER);
            if (st != FSDP_OK) return fail_all_with(ctx, mg, st);
            x->gathering = true;
        }
        if (x == until) break;
    }
    return FSDP_OK;
}

/* The work failed earlier, or its group did: report it. */
static fsdp_status check_live(fsdp_ctx *ctx, mpi_work *w) {
    if (!w->mg)
        return FSDP_FAIL(ctx, w->failed != FSDP_OK ? w->failed : FSDP_ERR_STATE, "%s", w->msg);
    if (!w->mg->poisoned) return FSDP_OK;
    mpi_group *mg = w->mg;
    return fail_all_with(ctx, mg, fsdp_mpi_fail_poisoned(ctx, w->g, mg, OP));
}

fsdp_status fsdp_mpi_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done) {
    mpi_work *w = work->state;
    *done = false;
    FSDP_TRY(check_live(ctx, w));
    mpi_group *mg = w->mg;
    FSDP_TRY(advance(ctx, mg, NULL, false));
    if (!w->gathering) return FSDP_OK;
    fsdp_status st = fsdp_mpi_test_set(ctx, w->g, mg, &w->rq, OP, done);
    if (st != FSDP_OK) return fail_all_with(ctx, mg, st);
    if (*done) unlink_work(w);
    return FSDP_OK;
}

fsdp_status fsdp_mpi_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work) {
    mpi_work *w = work->state;
    FSDP_TRY(check_live(ctx, w));
    mpi_group *mg = w->mg;
    FSDP_TRY(advance(ctx, mg, w, true));
    fsdp_status st = fsdp_mpi_wait_set(ctx, w->g, mg, &w->rq, OP, WAIT_DATA);
    if (st != FSDP_OK) return fail_all_with(ctx, mg, st);
    unlink_work(w);
    return FSDP_OK;
}
