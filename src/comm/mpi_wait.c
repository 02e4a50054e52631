/* mpi_wait.c: the MPI backend's waits: every call's descriptor exchange and judgement
 * (arrive), the confirmation round (confirm), posting and polling requests against their
 * deadlines, and failing: poison notes, timeouts, ranks that have returned. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_impl.h"
#include "core/array.h"
#include "core/error.h"

/* "where: MPI_Comm_split failed: <MPI's text>"; `what` may be the call's text, of which the
 * function's name is kept. */
fsdp_status fsdp_mpi_fail(fsdp_ctx *ctx, int rc, const char *what, const char *where) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return FSDP_FAIL(ctx, FSDP_ERR_COMM, "%s%s%.*s failed: %s", where ? where : "",
                     where ? ": " : "", (int)strcspn(what, "("), what, text);
}

#define MPI_TRY(ctx, call, where)                                                                  \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) return fsdp_mpi_fail((ctx), mpi_rc_, #call, (where));          \
    } while (0)

/* ---- sends that outlive their call ---- */

void fsdp_mpi_reap_sends(mpi_world *mw) {
    pending_send **p = &mw->sends;
    while (*p) {
        int done = 0;
        if (MPI_Test(&(*p)->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
        if (done) {
            pending_send *d = *p;
            *p = d->next;
            free(d);
        } else {
            p = &(*p)->next;
        }
    }
}

void fsdp_mpi_send_copy(mpi_world *mw, MPI_Comm comm, int dest, int kind, const void *data,
                        size_t len) {
    pending_send *s = malloc(sizeof *s + len);
    if (!s) return; /* the peer will time out (or go without the answer) instead */
    s->len = len;
    memcpy(s->data, data, len);
    if (MPI_Isend(s->data, (int)len, MPI_BYTE, dest, tag_of(mw, kind), comm, &s->req) !=
        MPI_SUCCESS) {
        free(s);
        return;
    }
    s->next = mw->sends;
    mw->sends = s;
}

/* Sends `note` to world rank `dest` on comm without waiting for it. */
void fsdp_mpi_send_note(mpi_world *mw, MPI_Comm comm, int dest, int kind, const mpi_note *note) {
    fsdp_mpi_send_copy(mw, comm, dest, kind, note, sizeof *note);
}

/* ---- the flight recorder's queries ---- */

void fsdp_mpi_serve_trace(mpi_world *mw) {
    for (;;) {
        int flag = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, tag_of(mw, TAG_TRACE_ASK), mw->comm, &flag, &status) !=
                MPI_SUCCESS ||
            !flag)
            return;
        mpi_trace_ask ask;
        if (MPI_Recv(&ask, (int)sizeof ask, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, mw->comm,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
        mpi_trace_answer answer = {.ask_id = ask.ask_id};
        fsdp_trace_view_build(mw->world->traces[mw->rank], ask.group_id, &answer.view);
        fsdp_mpi_send_copy(mw, mw->comm, status.MPI_SOURCE, TAG_TRACE_ANSWER, &answer,
                           sizeof answer);
    }
}

/* Asks the missing members (at most FSDP_TRACE_EXPLAINED of them) for their recent
 * collectives and writes what they answer within TRACE_ASK_MS about call #group_seq of g into
 * buf; a member that does not answer is not waiting in a collective. */
static void forensics(const fsdp_group *g, mpi_world *mw, const bool *missing, uint64_t group_seq,
                      char *buf, size_t size) {
    buf[0] = '\0';
    const size_t n = g->size > 0 ? (size_t)g->size : 1;
    fsdp_trace_view *views = calloc(n, sizeof *views);
    uint64_t *ids = calloc(n, sizeof *ids);
    if (!views || !ids) {
        free(views), free(ids);
        return;
    }
    int asked = 0, answered = 0;
    for (int m = 0; m < g->size && asked < FSDP_TRACE_EXPLAINED; m++) {
        if (!missing[m]) continue;
        mpi_trace_ask ask = {.group_id = g->id, .ask_id = ++mw->trace_asks};
        ids[m] = ask.ask_id;
        fsdp_mpi_send_copy(mw, mw->comm, g->ranks[m], TAG_TRACE_ASK, &ask, sizeof ask);
        asked++;
    }
    const double start = fsdp_clock_now();
    for (int polls = 0; answered < asked && fsdp_clock_now() - start < 1e-3 * TRACE_ASK_MS;
         polls++) {
        fsdp_mpi_serve_trace(mw); /* a member may be asking this rank at the same time */
        int flag = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, tag_of(mw, TAG_TRACE_ANSWER), mw->comm, &flag, &status) ==
                MPI_SUCCESS &&
            flag) {
            mpi_trace_answer answer;
            if (MPI_Recv(&answer, (int)sizeof answer, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG,
                         mw->comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                break;
            for (int m = 0; m < g->size; m++) {
                if (g->ranks[m] != status.MPI_SOURCE || ids[m] != answer.ask_id) continue;
                fsdp_trace_view *v = &views[m];
                *v = answer.view;
                /* From the network: nothing in it is trusted. */
                v->n = v->n < 0 ? 0 : v->n > FSDP_TRACE_VIEW_MAX ? FSDP_TRACE_VIEW_MAX : v->n;
                for (int i = 0; i < v->n; i++) {
                    fsdp_trace_rec *r = &v->rec[i];
                    r->group[sizeof r->group - 1] = r->module[sizeof r->module - 1] = '\0';
                    r->ndim = r->ndim < 0 ? 0 : r->ndim > FSDP_MAX_DIMS ? FSDP_MAX_DIMS : r->ndim;
                }
                v->answered = 1;
                answered++;
            }
            polls = 0;
            continue;
        }
        fsdp_mpi_pause(polls, fsdp_clock_now() - start);
    }
    fsdp_trace_forensics(buf, size, group_seq, g->desc, g->size, g->ranks, missing, views,
                         TRACE_ASK_MS);
    free(views), free(ids);
}

/* ---- failing: poison, timeouts, ranks that have gone ---- */

/* Marks the group unusable and tells the other members, so that they fail at once. */
void fsdp_mpi_poison(mpi_group *mg, fsdp_status status, const char *msg) {
    if (mg->poisoned) return;
    mg->poisoned = true;
    mg->poison_status = status;
    snprintf(mg->poison_msg, sizeof mg->poison_msg, "%s", msg);
    mpi_note note = {.status = status};
    snprintf(note.message, sizeof note.message, "%s", msg);
    for (int m = 0; m < mg->size; m++)
        if (m != mg->rank) fsdp_mpi_send_note(mg->mw, mg->comm, m, TAG_POISON, &note);
}

/* Drops the requests still open after a failed wait: receives are cancelled; sends are left
 * to finish on their own (small ones already have). */
void fsdp_mpi_abandon(mpi_reqs *rs) {
    for (int i = 0; i < rs->n; i++) {
        if (rs->reqs[i] == MPI_REQUEST_NULL) continue;
        if (rs->recv[i]) {
            MPI_Cancel(&rs->reqs[i]);
            MPI_Wait(&rs->reqs[i], MPI_STATUS_IGNORE);
        } else {
            MPI_Request_free(&rs->reqs[i]);
        }
    }
    rs->n = 0;
}

void fsdp_mpi_reqs_release(mpi_reqs *rs) {
    free(rs->reqs), free(rs->member), free(rs->recv), free(rs->done_idx);
    *rs = (mpi_reqs){0};
}

fsdp_status fsdp_mpi_fail_and_poison_set(fsdp_ctx *ctx, mpi_group *mg, mpi_reqs *rs,
                                         fsdp_status status, const char *msg) {
    fsdp_mpi_abandon(rs);
    fsdp_mpi_poison(mg, status, msg);
    return FSDP_FAIL(ctx, status, "%s", msg);
}

fsdp_status fsdp_mpi_fail_and_poison(fsdp_ctx *ctx, mpi_group *mg, fsdp_status status,
                                     const char *msg) {
    return fsdp_mpi_fail_and_poison_set(ctx, mg, &mg->rq, status, msg);
}

/* Per member whether this rank still has an open receive from it (recv: it has not sent its
 * part of the step) or an open send to it (it has not taken this rank's part). Returns a
 * calloc'd array, NULL when out of memory. */
static bool *members_with_open(const mpi_group *mg, const mpi_reqs *rs, bool recv) {
    bool *open = calloc((size_t)mg->size, sizeof *open);
    for (int i = 0; open && i < rs->n; i++)
        if (rs->reqs[i] != MPI_REQUEST_NULL && rs->recv[i] == recv) open[rs->member[i]] = true;
    return open;
}

static bool *open_members(const mpi_group *mg, const mpi_reqs *rs) {
    return members_with_open(mg, rs, true);
}

/* The members this rank waits for: those it has an open receive from or, when none (*unsent),
 * those whose sends from this rank have not completed: they have not taken its data. */
static bool *waited_members(const mpi_group *mg, const mpi_reqs *rs, bool *unsent) {
    bool *open = members_with_open(mg, rs, true);
    *unsent = false;
    for (int m = 0; open && m < mg->size; m++)
        if (open[m]) return open;
    free(open);
    *unsent = true;
    return members_with_open(mg, rs, false);
}

/* The wait failed (f: what went wrong): open requests are dropped and the group is
 * poisoned, so that every member fails. */
static fsdp_status fail_wait(fsdp_ctx *ctx, mpi_group *mg, mpi_reqs *rs,
                             const fsdp_comm_failure *f) {
    char msg[FSDP_ERROR_MAX];
    fsdp_status st = fsdp_comm_failure_format(f, msg, sizeof msg);
    return fsdp_mpi_fail_and_poison_set(ctx, mg, rs, st, msg);
}

static fsdp_status fail_timeout(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                                int op, bool arrival) {
    bool unsent = false;
    bool *open = arrival ? open_members(mg, rs) : waited_members(mg, rs, &unsent);
    char why[FSDP_ERROR_MAX] = "";
    if (arrival && open)
        forensics(g, mg->mw, open, rs->group_seq ? rs->group_seq : g->calls, why, sizeof why);
    fsdp_comm_failure f = {.kind = arrival ? FSDP_FAILURE_ARRIVAL : FSDP_FAILURE_DATA,
                           .op = op,
                           .group_desc = g->desc,
                           .timeout_ms = mg->mw->world->timeout_ms,
                           .n_members = mg->size,
                           .ranks = g->ranks,
                           .missing = open,
                           .unsent = unsent,
                           .forensics = why};
    fsdp_status st = fail_wait(ctx, mg, rs, &f);
    free(open);
    return FSDP_PASS(ctx, st);
}

static fsdp_status fail_gone(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                             int op, int world_rank) {
    fsdp_comm_failure f = {.kind = FSDP_FAILURE_GONE,
                           .op = op,
                           .group_desc = g->desc,
                           .gone_rank = world_rank,
                           .gone = &mg->mw->world->results[world_rank],
                           .group_id = g->id,
                           .group_seq = rs->group_seq ? rs->group_seq : g->calls};
    return fail_wait(ctx, mg, rs, &f);
}

/* Receives the exit notes that have arrived: their ranks' results go into the world. */
void fsdp_mpi_receive_exit_notes(mpi_world *mw) {
    for (;;) {
        int flag = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, tag_of(mw, TAG_EXIT), mw->comm, &flag, &status) !=
                MPI_SUCCESS ||
            !flag)
            return;
        mpi_note note;
        if (MPI_Recv(&note, (int)sizeof note, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, mw->comm,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
        int r = status.MPI_SOURCE;
        fsdp_rank_result *res = &mw->world->results[r];
        res->status = (fsdp_status)note.status;
        note.message[sizeof note.message - 1] = note.origin[sizeof note.origin - 1] = '\0';
        note.trail[sizeof note.trail - 1] = '\0';
        snprintf(res->message, sizeof res->message, "%s", note.message);
        snprintf(res->origin, sizeof res->origin, "%s", note.origin);
        snprintf(res->trail, sizeof res->trail, "%s", note.trail);
        res->calls = note.calls;
        if (res->calls.n < 0 || res->calls.n > FSDP_TRACE_GROUPS) res->calls.n = 0; /* untrusted */
        mw->finished[r] = note.finished;
        mw->noted[r] = true;
        atomic_store(&res->exited, true);
    }
}

/* A poison note another member sent on this group, if one has arrived: the group fails. */
static bool receive_poison(mpi_group *mg) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag_of(mg->mw, TAG_POISON), mg->comm, &flag, &status) !=
            MPI_SUCCESS ||
        !flag)
        return false;
    mpi_note note;
    if (MPI_Recv(&note, (int)sizeof note, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, mg->comm,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return false;
    note.message[sizeof note.message - 1] = '\0';
    if (!mg->poisoned) {
        mg->poisoned = true;
        mg->poison_status = (fsdp_status)note.status;
        snprintf(mg->poison_msg, sizeof mg->poison_msg, "%s", note.message);
    }
    return true;
}

/* The world rank of a member this rank still waits for whose function has returned, or -1: a
 * receive from it, or a send to it (its works were abandoned as it returned, so nothing will
 * take the data: with a communication thread it may have sent its part and returned before
 * taking ours). */
static int gone_member(const fsdp_group *g, const mpi_group *mg, const mpi_reqs *rs) {
    for (int i = 0; i < rs->n; i++) {
        if (rs->reqs[i] == MPI_REQUEST_NULL) continue;
        int r = g->ranks[rs->member[i]];
        if (mg->mw->noted[r]) return r;
    }
    return -1;
}

/* ---- requests ---- */

/* Room for `need` requests in each of rs's four arrays. */
static bool grow_requests(mpi_reqs *rs, int need) {
    int64_t cap[4] = {rs->cap, rs->cap, rs->cap, rs->cap};
    if (!fsdp_array_reserve((void **)&rs->reqs, &cap[0], need, sizeof *rs->reqs) ||
        !fsdp_array_reserve((void **)&rs->member, &cap[1], need, sizeof *rs->member) ||
        !fsdp_array_reserve((void **)&rs->recv, &cap[2], need, sizeof *rs->recv) ||
        !fsdp_array_reserve((void **)&rs->done_idx, &cap[3], need, sizeof *rs->done_idx))
        return false;
    rs->cap = cap[0];
    return true;
}

/* Posts a receive (recv) or a send of `bytes` at buf with group member `member`, as
 * several messages when it is larger than SEGMENT_BYTES. Nothing for 0 bytes. A failure
 * poisons the group: the peers must not wait for this rank's half of the step. */
fsdp_status fsdp_mpi_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, bool recv, int member,
                          int kind, void *buf, size_t bytes) {
    return fsdp_mpi_post_in(ctx, g, mg, &mg->rq, recv, member, kind, buf, bytes);
}

fsdp_status fsdp_mpi_post_in(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                             bool recv, int member, int kind, void *buf, size_t bytes) {
    int tag = tag_of(mg->mw, kind);
    for (size_t at = 0; at < bytes; at += SEGMENT_BYTES) {
        int n = (int)(bytes - at < SEGMENT_BYTES ? bytes - at : SEGMENT_BYTES);
        char msg[FSDP_ERROR_MAX];
        if (!grow_requests(rs, rs->n + 1)) {
            snprintf(msg, sizeof msg, "group %s: cannot grow the requests (out of memory)",
                     g->desc);
            return fsdp_mpi_fail_and_poison_set(ctx, mg, rs, FSDP_ERR_OUT_OF_MEMORY, msg);
        }
        MPI_Request *req = &rs->reqs[rs->n];
        char *p = (char *)buf + at;
        int rc = recv ? MPI_Irecv(p, n, MPI_BYTE, member, tag, mg->comm, req)
                      : MPI_Isend(p, n, MPI_BYTE, member, tag, mg->comm, req);
        if (rc != MPI_SUCCESS) {
            fsdp_mpi_fail(ctx, rc, recv ? "MPI_Irecv" : "MPI_Isend", g->desc);
            snprintf(msg, sizeof msg, "%s", fsdp_last_error(ctx));
            return fsdp_mpi_fail_and_poison_set(ctx, mg, rs, FSDP_ERR_COMM, msg);
        }
        rs->member[rs->n] = member;
        rs->recv[rs->n] = recv;
        rs->n++;
    }
    return FSDP_OK;
}

/* Logs whom a wait that has lasted waited_s waits for: the members it has an open receive
 * from (for data: those it has an open send to when there are none); for an arrival, with what
 * they do meanwhile (asked, as at a timeout). */
static void log_wait(fsdp_ctx *ctx, const fsdp_group *g, const mpi_group *mg, const mpi_reqs *rs,
                     int op, wait_kind kind, double waited_s) {
    bool unsent = false;
    bool *late = kind == WAIT_DATA ? waited_members(mg, rs, &unsent) : open_members(mg, rs);
    if (!late) return;
    if (kind == WAIT_CONFIRM) {
        char missing[256] = "";
        fsdp_comm_rank_list(g->ranks, late, mg->size, true, missing, sizeof missing);
        fsdp_log(ctx, FSDP_LOG_WARN,
                 "%s on group %s: every rank arrived, but rank(s) %s have not confirmed after "
                 "%.0f s",
                 fsdp_call_op_name(op), g->desc, missing, waited_s);
    } else {
        char why[FSDP_ERROR_MAX] = "";
        if (kind == WAIT_ARRIVAL)
            forensics(g, mg->mw, late, rs->group_seq ? rs->group_seq : g->calls, why, sizeof why);
        fsdp_wait_log_kind lk = kind != WAIT_DATA ? FSDP_WAIT_LOG_ARRIVAL
                                : unsent          ? FSDP_WAIT_LOG_UNSENT
                                                  : FSDP_WAIT_LOG_DATA;
        fsdp_comm_wait_log(ctx, op, g->desc, mg->size, g->ranks, late, lk, waited_s,
                           mg->mw->world->timeout_ms, why);
    }
    free(late);
}

/* Waits until every posted request has completed, with the deadline `kind` says. Meanwhile:
 * a poison note on the group fails the wait at once, and so does a member it waits for whose
 * function has returned, and every fsdp_comm_log_every_s it logs whom it waits for. A
 * confirmation round has no deadline: it only logs. */
fsdp_status fsdp_mpi_wait_all(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, int op,
                              wait_kind kind) {
    return fsdp_mpi_wait_set(ctx, g, mg, &mg->rq, op, kind);
}

fsdp_status fsdp_mpi_wait_set(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                              int op, wait_kind kind) {
    mpi_world *mw = mg->mw;
    const double start = fsdp_clock_now(), limit = 1e-3 * mw->world->timeout_ms;
    const double every = fsdp_comm_log_every_s(mw->world->timeout_ms);
    double progress = start, next_check = start, gone_since = -1, warned = start;
    int open = rs->n;
    for (int polls = 0; open > 0; polls++) {
        int done = 0;
        int rc = MPI_Testsome(rs->n, rs->reqs, &done, rs->done_idx, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char msg[FSDP_ERROR_MAX];
            fsdp_mpi_fail(ctx, rc, "MPI_Testsome", g->desc);
            snprintf(msg, sizeof msg, "%s on group %s: %s", fsdp_call_op_name(op), g->desc,
                     fsdp_last_error(ctx));
            return fsdp_mpi_fail_and_poison_set(ctx, mg, rs, FSDP_ERR_COMM, msg);
        }
        double t = fsdp_clock_now();
        if (done == MPI_UNDEFINED) break;
        if (done > 0) {
            open -= done;
            progress = t;
            polls = 0;
            continue;
        }
        if (t >= next_check) {
            next_check = t + 1e-3;
            /* (poisoned here: by the communication thread, between polls) */
            if (receive_poison(mg) || mg->poisoned) {
                fsdp_mpi_abandon(rs);
                return fsdp_comm_fail_poisoned(ctx, g, op, mg->poison_status, mg->poison_msg);
            }
            fsdp_mpi_receive_exit_notes(mw);
            fsdp_mpi_serve_trace(mw);
            int gone = gone_member(g, mg, rs);
            if (gone < 0)
                gone_since = -1;
            else if (gone_since < 0)
                gone_since = t;
            else if (t - gone_since > GONE_GRACE_S)
                return fail_gone(ctx, g, mg, rs, op, gone);
            if (kind != WAIT_CONFIRM && t - (kind == WAIT_ARRIVAL ? start : progress) >= limit)
                return fail_timeout(ctx, g, mg, rs, op, kind == WAIT_ARRIVAL);
            if (t - warned >= every) {
                warned = t;
                log_wait(ctx, g, mg, rs, op, kind, t - start);
            }
        }
        fsdp_mpi_pause(polls, t - progress);
    }
    rs->n = 0;
    return FSDP_OK;
}

fsdp_status fsdp_mpi_test_set(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                              int op, bool *done) {
    int flag = 1;
    int rc = rs->n > 0 ? MPI_Testall(rs->n, rs->reqs, &flag, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) {
        char msg[FSDP_ERROR_MAX];
        fsdp_mpi_fail(ctx, rc, "MPI_Testall", g->desc);
        snprintf(msg, sizeof msg, "%s on group %s: %s", fsdp_call_op_name(op), g->desc,
                 fsdp_last_error(ctx));
        return fsdp_mpi_fail_and_poison_set(ctx, mg, rs, FSDP_ERR_COMM, msg);
    }
    *done = flag != 0;
    if (*done) rs->n = 0;
    return FSDP_OK;
}

/* ---- arriving: exchange the calls, judge them ---- */

static size_t encode(mpi_desc *d, const fsdp_call *c) {
    *d = (mpi_desc){.op = c->op,
                    .rejected = c->rejected,
                    .dtype = c->dtype,
                    .ndim = c->ndim,
                    .dim = c->dim,
                    .dim2 = c->dim2,
                    .root = c->root,
                    .reduce = c->reduce,
                    .color = c->color,
                    .key = c->key};
    memcpy(d->shape, c->shape, sizeof d->shape);
    const char *text = c->rejected != FSDP_OK ? c->reject_msg : c->agree;
    d->has_text = text != NULL;
    snprintf(d->text, sizeof d->text, "%s", text ? text : "");
    return offsetof(mpi_desc, text) + strlen(d->text) + 1;
}

static void decode(fsdp_call *c, mpi_desc *d) {
    d->text[sizeof d->text - 1] = '\0';
    int ndim = d->ndim < 0 ? 0 : d->ndim > FSDP_MAX_DIMS ? FSDP_MAX_DIMS : d->ndim;
    *c = (fsdp_call){.op = d->op,
                     .rejected = (fsdp_status)d->rejected,
                     .dtype = (fsdp_dtype)d->dtype,
                     .ndim = ndim,
                     .dim = d->dim,
                     .dim2 = d->dim2,
                     .root = d->root,
                     .reduce = (fsdp_reduce_op)d->reduce,
                     .color = d->color,
                     .key = d->key};
    memcpy(c->shape, d->shape, sizeof c->shape);
    const char *text = d->has_text ? d->text : NULL;
    if (c->rejected != FSDP_OK)
        c->reject_msg = text;
    else
        c->agree = text;
}

fsdp_status fsdp_mpi_arrive_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                                 mpi_desc *descs, const fsdp_call *mine) {
    /* A poison note that has arrived may need a few rounds of MPI's progress to be seen. */
    for (int i = 0; i < ENTRY_PROBES && !mg->poisoned; i++) receive_poison(mg);
    if (mg->poisoned)
        return fsdp_comm_fail_poisoned(ctx, g, mine->op, mg->poison_status, mg->poison_msg);
    fsdp_mpi_reap_sends(mg->mw);
    size_t len = encode(&descs[g->rank], mine);
    rs->n = 0;
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, true, m, TAG_DESC, &descs[m],
                                              sizeof(mpi_desc)));
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY_AT(ctx,
                        fsdp_mpi_post_in(ctx, g, mg, rs, false, m, TAG_DESC, &descs[g->rank], len));
    return FSDP_OK;
}

fsdp_status fsdp_mpi_arrive_judge(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg,
                                  mpi_desc *descs, fsdp_call *calls, const fsdp_call **call_ptrs,
                                  int op) {
    for (int m = 0; m < g->size; m++) decode(&calls[m], &descs[m]);
    fsdp_status st =
        fsdp_call_judge(call_ptrs, g->size, g->rank, g->ranks, g->desc, mg->msg, sizeof mg->msg);
    if (st == FSDP_OK) {
        /* A member may have given up on this very call (timed out) after its descriptor had
         * left: then ours matched its stale one. Its poison note usually is here by now; the
         * data step must not start (a send of its still in flight could be read), and a call
         * without one (barrier, split) is settled by confirm. */
        for (int i = 0; i < ENTRY_PROBES && !mg->poisoned; i++) receive_poison(mg);
        return mg->poisoned ? fsdp_comm_fail_poisoned(ctx, g, op, mg->poison_status, mg->poison_msg)
                            : FSDP_OK;
    }
    /* Peers that gave up on an earlier call (timed out, then poisoned the group) left their
     * calls of it behind; their poison notes follow them. */
    for (double t0 = fsdp_clock_now(); fsdp_clock_now() - t0 < SETTLE_S;)
        if (receive_poison(mg))
            return fsdp_comm_fail_poisoned(ctx, g, op, mg->poison_status, mg->poison_msg);
    return FSDP_FAIL(ctx, st, "%s", mg->msg);
}

/* Sends this rank's call to every member and receives theirs; returns once all have arrived
 * and the calls are judged (every member reaches the same verdict from the same calls). */
fsdp_status fsdp_mpi_arrive(fsdp_ctx *ctx, const fsdp_group *g, const fsdp_call *mine) {
    mpi_group *mg = g->state;
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive_post(ctx, g, mg, &mg->rq, mg->descs, mine));
    FSDP_TRY_AT(ctx, fsdp_mpi_wait_all(ctx, g, mg, mine->op, WAIT_ARRIVAL));
    return fsdp_mpi_arrive_judge(ctx, g, mg, mg->descs, mg->calls, mg->call_ptrs, mine->op);
}

/* The second round of a call that moves no data (barrier, split): once a rank has every
 * member's descriptor it sends each a confirmation and waits for theirs, without a deadline.
 * A member that timed out in the exchange (its deadline passed just before the last
 * descriptor came, while the latecomer found every descriptor waiting) never confirms and
 * has poisoned the group, so the others fail on its note instead of succeeding alone, or,
 * for a split, entering MPI_Comm_split (which blocks) without it. A member confirms at once
 * after its exchange, so the wait is short; and since every member that confirmed waits for
 * all the others, either every member gets past confirm or none does. */
fsdp_status fsdp_mpi_confirm(fsdp_ctx *ctx, const fsdp_group *g, int op) {
    mpi_group *mg = g->state;
    if (g->size == 1) return FSDP_OK;
    mg->rq.n = 0;
    mg->ready[g->rank] = 1;
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY_AT(ctx, fsdp_mpi_post(ctx, g, mg, true, m, TAG_READY, &mg->ready[m],
                                           sizeof *mg->ready));
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY_AT(ctx, fsdp_mpi_post(ctx, g, mg, false, m, TAG_READY, &mg->ready[g->rank],
                                           sizeof *mg->ready));
    return fsdp_mpi_wait_all(ctx, g, mg, op, WAIT_CONFIRM);
}
