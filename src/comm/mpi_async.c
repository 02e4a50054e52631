/* mpi_async.c: the MPI backend's entries of all_gather, reduce_scatter and all_reduce, and their
 * non-blocking form. The start posts this rank's descriptor and the receives of its peers' (the
 * first half of every call's arrival) and returns without waiting for anyone; a test or wait
 * that finds the descriptors in judges them as every call is judged and posts the call's first
 * data step; one that finds a step done posts the next (all_reduce: the reduction in rank order
 * and the gather of the reduced chunks), and one that finds the last done finishes the call
 * (all_gather unpacks, reduce_scatter reduces in rank order). The steps and arithmetic are the
 * blocking call's (mpi_collectives.c), so the bits are too, and the waits are mpi_wait.c's, with
 * their deadlines and failure notes. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_impl.h"
#include "core/array.h"
#include "core/error.h"
#include "core/tensor_impl.h"

/* A work's step: what its requests in flight are for: the descriptors (0), then data step
 * 1..steps of its call (fsdp_mpi_coll_post), whose messages have kind fsdp_mpi_step_kind(s), as
 * the blocking call's. */
enum { STEP_ARRIVE, STEP_LAST = 2 };

struct mpi_work {
    mpi_work *next; /* the group's pending works, in start order */
    mpi_group *mg;  /* while pending; NULL once complete, failed or detached */
    const fsdp_group *g;
    mpi_coll c;
    int step, steps;
    mpi_reqs rq;
    /* per member: its descriptor, decoded call, and piece of this rank's chunk */
    mpi_desc *descs;
    fsdp_call *calls;
    const fsdp_call **call_ptrs;
    const void **srcs;
    int cap_members;
    char *buf; /* the pieces received and packed (fsdp_mpi_coll_scratch) */
    int64_t cap_buf;
    fsdp_status failed; /* detached by a failure: its status and message */
    char msg[FSDP_ERROR_MAX];
};

static void unlink_work(mpi_work *w) {
    if (!w->mg) return;
    mpi_work **p = &w->mg->works;
    while (*p && *p != w) p = &(*p)->next;
    if (*p) *p = w->next;
    w->next = NULL;
    w->mg = NULL;
}

/* w fails alone (its requests are dropped, its wait reports status and msg). */
static void fail_one(mpi_work *w, fsdp_status status, const char *msg) {
    fsdp_mpi_abandon(&w->rq);
    w->failed = status;
    snprintf(w->msg, sizeof w->msg, "%s", msg);
    unlink_work(w);
}

/* Every pending work of the group fails (the group is poisoned already). */
static void fail_all(mpi_group *mg, fsdp_status status, const char *msg) {
    while (mg->works) fail_one(mg->works, status, msg);
}

static fsdp_status fail_all_with(fsdp_ctx *ctx, mpi_group *mg, fsdp_status st) {
    fail_all(mg, st, fsdp_last_error(ctx));
    return FSDP_PASS(ctx, st);
}

void fsdp_mpi_works_detach(mpi_group *mg) {
    if (!mg->works) return;
    char msg[FSDP_ERROR_MAX];
    snprintf(msg, sizeof msg,
             "a non-blocking %s on a group of %d ranks was still in flight when its rank "
             "returned, its run ended or its world was freed; wait for it (fsdp_comm_work_wait) "
             "before the rank's function returns",
             fsdp_call_op_name(mg->works->c.op), mg->size);
    fail_all(mg, FSDP_ERR_STATE, msg);
}

static void work_free_state(void *state) {
    mpi_work *w = state;
    if (!w) return;
    fsdp_mpi_lock(); /* the communication thread may be moving it */
    if (w->mg) {     /* still in flight: abandoned, and the group fails as after a timeout */
        mpi_group *mg = w->mg;
        char msg[FSDP_ERROR_MAX];
        snprintf(msg, sizeof msg,
                 "%s on group %s: its work was freed while the call was in flight; wait "
                 "for a work (fsdp_comm_work_wait) before freeing it",
                 fsdp_call_op_name(w->c.op), w->g->desc);
        fail_one(w, FSDP_ERR_STATE, msg);
        fsdp_mpi_poison(mg, FSDP_ERR_STATE, msg);
        fail_all(mg, FSDP_ERR_STATE, msg);
    }
    fsdp_mpi_unlock();
    fsdp_mpi_reqs_release(&w->rq);
    free(w->descs), free(w->calls), free(w->call_ptrs), free(w->srcs);
    free(w->buf);
    free(w);
}

/* Room for W members and `bytes` of received pieces. */
static bool reserve(mpi_work *w, int W, size_t bytes) {
    if (W > w->cap_members) {
        free(w->descs), free(w->calls), free(w->call_ptrs), free(w->srcs);
        w->descs = calloc((size_t)W, sizeof *w->descs);
        w->calls = calloc((size_t)W, sizeof *w->calls);
        w->call_ptrs = calloc((size_t)W, sizeof *w->call_ptrs);
        w->srcs = calloc((size_t)W, sizeof *w->srcs);
        w->cap_members = w->descs && w->calls && w->call_ptrs && w->srcs ? W : 0;
        if (!w->cap_members) return false;
        for (int m = 0; m < W; m++) w->call_ptrs[m] = &w->calls[m];
    }
    return fsdp_array_reserve((void **)&w->buf, &w->cap_buf, (int64_t)bytes, 1);
}

/* With a work, the non-blocking call; without one, the blocking call, once the group's works
 * started before it have completed: its steps share their tags (a peer may have started this
 * call), so those works post theirs first, as on every rank. */
static fsdp_status coll_call(fsdp_ctx *ctx, fsdp_group *g, const mpi_coll *c,
                             fsdp_comm_work *work) {
    if (work) return fsdp_mpi_coll_start(ctx, g, c, work);
    FSDP_TRY_AT(ctx, fsdp_mpi_works_complete(ctx, g->state));
    return fsdp_mpi_coll_run(ctx, g, c);
}

fsdp_status fsdp_mpi_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    mpi_coll c = {.op = FSDP_COMM_ALL_GATHER, .out = out, .in = in, .dim = dim};
    return coll_call(ctx, g, &c, work);
}

fsdp_status fsdp_mpi_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                    const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                    const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    mpi_coll c = {.op = FSDP_COMM_REDUCE_SCATTER,
                  .out = out,
                  .in = in,
                  .dim = dim,
                  .reduce = op,
                  .fused = fuse != NULL};
    if (fuse) c.fuse = *fuse;
    return coll_call(ctx, g, &c, work);
}

fsdp_status fsdp_mpi_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                                const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    mpi_coll c = {
        .op = FSDP_COMM_ALL_REDUCE, .out = t, .in = t, .reduce = op, .fused = fuse != NULL};
    if (fuse) c.fuse = *fuse;
    return coll_call(ctx, g, &c, work);
}

fsdp_status fsdp_mpi_coll_start(fsdp_ctx *ctx, fsdp_group *g, const mpi_coll *c,
                                fsdp_comm_work *work) {
    mpi_group *mg = g->state;
    const char *name = fsdp_call_op_name(c->op);
    if (work->state && work->free_state != work_free_state) {
        work->free_state(work->state); /* another backend's (the nccl backend's NCCL calls) */
        work->state = NULL;
        work->free_state = NULL;
    }
    mpi_work *w = work->state;
    size_t bytes = fsdp_mpi_coll_scratch(g, c);
    if (!w && (w = calloc(1, sizeof *w)) != NULL) {
        work->state = w;
        work->free_state = work_free_state;
    }
    if (!w || !reserve(w, g->size, bytes)) {
        /* The peers fail at once instead of waiting for this rank's descriptor. */
        FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                  "%s on group %s: cannot allocate %zu bytes for a non-blocking call", name,
                  g->desc, bytes);
        fsdp_mpi_reject(ctx, g, (fsdp_comm_op)c->op);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    w->g = g;
    w->c = *c;
    w->step = STEP_ARRIVE;
    w->steps = fsdp_mpi_coll_steps(c);
    w->failed = FSDP_OK;
    w->next = NULL;
    w->rq.group_seq = g->calls;
    fsdp_call call = fsdp_mpi_coll_call(c);
    fsdp_status st = fsdp_mpi_arrive_post(ctx, g, mg, &w->rq, w->descs, &call);
    if (st != FSDP_OK) return mg->poisoned ? fail_all_with(ctx, mg, st) : st;
    w->mg = mg;
    mpi_work **tail = &mg->works;
    while (*tail) tail = &(*tail)->next;
    *tail = w;
    work->pending = true;
    fsdp_mpi_thread_wake(mg->mw);
    return FSDP_OK;
}

/* Moves x on by one step once its current one has completed (with `block`, waits for it);
 * *moved says whether it did. Once its last step has completed the call is finished and x
 * leaves the group's works (complete). A failure of the group fails every work and is returned;
 * a disagreement among the calls fails x alone (as a blocking call's leaves the group usable)
 * and is recorded in it, not returned. */
static fsdp_status step_on(fsdp_ctx *ctx, mpi_group *mg, mpi_work *x, bool block, bool *moved) {
    bool done = true;
    const int op = x->c.op;
    wait_kind kind = x->step == STEP_ARRIVE ? WAIT_ARRIVAL : WAIT_DATA;
    fsdp_status st = block ? fsdp_mpi_wait_set(ctx, x->g, mg, &x->rq, op, kind)
                           : fsdp_mpi_test_set(ctx, x->g, mg, &x->rq, op, &done);
    *moved = false;
    if (st != FSDP_OK) return fail_all_with(ctx, mg, st);
    if (!done) return FSDP_OK;
    *moved = true;
    if (x->step == x->steps) { /* the call's data are all in */
        fsdp_mpi_coll_finish(x->g, &x->c, x->buf, x->srcs);
        unlink_work(x);
        return FSDP_OK;
    }
    if (x->step == STEP_ARRIVE) {
        st = fsdp_mpi_arrive_judge(ctx, x->g, mg, x->descs, x->calls, x->call_ptrs, op);
        if (st != FSDP_OK && mg->poisoned) return fail_all_with(ctx, mg, st);
        if (st != FSDP_OK) {
            fail_one(x, st, fsdp_last_error(ctx));
            fsdp_clear_error(ctx);
            return FSDP_OK;
        }
    }
    x->step++;
    st = fsdp_mpi_coll_post(ctx, x->g, mg, &x->rq, &x->c, x->step, x->buf, x->srcs,
                            fsdp_mpi_step_kind(x->step));
    if (st != FSDP_OK) return fail_all_with(ctx, mg, st);
    return FSDP_OK;
}

/* Advances the group's works in start order up to `until` (NULL: all). The messages of each
 * data step share a tag, so every rank must post them in the same order: a work posts step s
 * only once every work started before it has posted its step s (or all of its steps). With
 * `block` the works up to `until` are waited for until `until` is complete; otherwise each
 * moves as far as what has completed allows. */
static fsdp_status advance(fsdp_ctx *ctx, mpi_group *mg, const mpi_work *until, bool block) {
    int floor = STEP_LAST; /* the least step posted by the works before x */
    for (mpi_work *x = mg->works, *next; x; x = next) {
        next = x->next;
        bool last = x == until, moved = true;
        while (moved && x->mg && (x->step == x->steps || x->step + 1 <= floor))
            FSDP_TRY_AT(
                ctx, step_on(ctx, mg, x, block && (!until || x->step < x->steps || last), &moved));
        if (x->mg && x->step < x->steps && x->step < floor) floor = x->step;
        if (last) break;
    }
    return FSDP_OK;
}

/* The work failed earlier, or its group did: report it. */
static fsdp_status check_live(fsdp_ctx *ctx, mpi_work *w) {
    if (!w->mg) return w->failed == FSDP_OK ? FSDP_OK : FSDP_FAIL(ctx, w->failed, "%s", w->msg);
    if (!w->mg->poisoned) return FSDP_OK;
    mpi_group *mg = w->mg;
    return fail_all_with(
        ctx, mg, fsdp_comm_fail_poisoned(ctx, w->g, w->c.op, mg->poison_status, mg->poison_msg));
}

fsdp_status fsdp_mpi_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done) {
    mpi_work *w = work->state;
    *done = false;
    FSDP_TRY_AT(ctx, check_live(ctx, w));
    if (w->mg) FSDP_TRY_AT(ctx, advance(ctx, w->mg, NULL, false));
    FSDP_TRY_AT(ctx, check_live(ctx, w));
    *done = w->mg == NULL;
    return FSDP_OK;
}

fsdp_status fsdp_mpi_works_progress(fsdp_ctx *ctx, mpi_group *mg) {
    return advance(ctx, mg, NULL, false);
}

/* Waits for the group's works up to `until` (NULL: all) to complete. */
static fsdp_status wait_works(fsdp_ctx *ctx, mpi_group *mg, const mpi_work *until) {
    mg->waiting = true; /* its waits let go of the lock between polls */
    fsdp_status st = advance(ctx, mg, until, true);
    mg->waiting = false;
    return st;
}

fsdp_status fsdp_mpi_works_complete(fsdp_ctx *ctx, mpi_group *mg) {
    if (!mg->works || mg->poisoned) return FSDP_OK; /* poisoned: the call fails as it arrives */
    return wait_works(ctx, mg, NULL);
}

fsdp_status fsdp_mpi_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work) {
    mpi_work *w = work->state;
    FSDP_TRY_AT(ctx, check_live(ctx, w));
    if (w->mg) FSDP_TRY_AT(ctx, wait_works(ctx, w->mg, w));
    FSDP_TRY_AT(ctx, check_live(ctx, w));
    if (w->mg) /* advance waits for every step of w: a broken invariant, never a silent return */
        return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "%s on group %s: the wait returned in flight",
                         fsdp_call_op_name(w->c.op), w->g->desc);
    return FSDP_OK;
}
