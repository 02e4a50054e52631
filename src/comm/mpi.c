/* mpi.c: the MPI backend: one process per rank under mpirun, CPU tensors. Every call starts
 * with a point-to-point exchange of small descriptors, so each rank knows which peers have
 * arrived and judges the calls exactly as the local backend does (fsdp_call_judge); then the
 * data moves point-to-point and reductions run in rank order with fsdp_reduce_run, bitwise
 * equal to the local backend. Every request is non-blocking and polled against a deadline. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h"

/* Message kinds. A tag is (run % RUN_TAGS) * TAG_KINDS + kind: messages left over from an
 * earlier run of the world (after a timeout) never match a later run's. The largest tag,
 * 29999, is below 32767, the least MPI_TAG_UB the standard allows. TAG_READY is the second
 * round of the calls that must not end differently on different ranks (split, barrier). */
enum { TAG_DESC, TAG_DATA, TAG_POISON, TAG_EXIT, TAG_READY, TAG_KINDS };
#define RUN_TAGS 6000

#define SEGMENT_BYTES (1 << 30) /* MPI counts are int: larger pieces go as several messages */
#define GONE_GRACE_S  0.1   /* how long to wait for a message of a rank known to have returned */
#define ENTRY_PROBES  4     /* looks for a poison note as a call starts */
#define SETTLE_S      0.005 /* before reporting a disagreement: time for a poison note to land */
#define WARN_EVERY_S  10.0  /* at least, between warnings while a run waits for other ranks */

/* A call as it travels: the fields of fsdp_call that must agree, then `text` (the reject
 * message or the split's agree text), of which only the used part is sent. */
typedef struct mpi_desc {
    int32_t op, rejected, dtype, ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int32_t dim, dim2, root, reduce, color, key, has_text, pad;
    char text[FSDP_ERROR_MAX];
} mpi_desc;

/* What a rank tells the others when its function returns (TAG_EXIT, on the world's
 * communicator) and when a group fails on it (TAG_POISON, on the group's). */
typedef struct mpi_note {
    int32_t status, pad;
    double finished; /* CLOCK_REALTIME seconds */
    char message[FSDP_ERROR_MAX];
    char origin[FSDP_ORIGIN_MAX];
    char trail[FSDP_TRAIL_MAX];
} mpi_note;

typedef struct mpi_group mpi_group;

/* A send still in flight whose buffer must outlive it (notes). */
typedef struct pending_send {
    struct pending_send *next;
    MPI_Request req;
    mpi_note note;
} pending_send;

typedef struct mpi_world {
    fsdp_world *world;
    MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD: the world group's */
    int rank, size;
    int run; /* runs started: the tags' epoch */
    mpi_group *world_group;
    mpi_group *groups; /* groups split in the current run */
    bool *noted;       /* per world rank: its exit note of this run has arrived */
    double *finished;  /* per world rank: when its function returned */
    pending_send *sends;
} mpi_world;

struct mpi_group {
    mpi_world *mw;
    mpi_group *next;
    MPI_Comm comm; /* its rank in comm is its group rank */
    int size, rank;
    int *ranks; /* world ranks of the members */
    bool poisoned;
    fsdp_status poison_status;
    char poison_msg[FSDP_ERROR_MAX];
    mpi_desc *descs;  /* per member: the call it sent */
    int32_t *ready;   /* per member: its confirmation (confirm) */
    fsdp_call *calls; /* per member: decoded */
    const fsdp_call **call_ptrs;
    const void **srcs; /* per member: its piece of a reduction */
    /* The requests of the current step, with the member each talks to. */
    MPI_Request *reqs;
    int *req_member;
    bool *req_recv;
    int *done_idx;
    int n_reqs, cap_reqs;
    void *scratch; /* received and packed pieces */
    size_t scratch_cap;
    char msg[FSDP_ERROR_MAX];
};

/* The process-wide state, under init_mu: MPI's initialisation, and the buffers of notes MPI
 * may still send after their world was freed. */
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending_send *graveyard;

static double now_s(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int tag_of(const mpi_world *mw, int kind) {
    return (mw->run % RUN_TAGS) * TAG_KINDS + kind;
}

/* "where: MPI_Comm_split failed: <MPI's text>"; `what` may be the call's text, of which the
 * function's name is kept. */
static fsdp_status fail_mpi(fsdp_ctx *ctx, int rc, const char *what, const char *where) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return FSDP_FAIL(ctx, FSDP_ERR_COMM, "%s%s%.*s failed: %s", where ? where : "",
                     where ? ": " : "", (int)strcspn(what, "("), what, text);
}

#define MPI_TRY(ctx, call, where)                                                                  \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) return fail_mpi((ctx), mpi_rc_, #call, (where));               \
    } while (0)

/* ---- MPI itself ---- */

static void finalise_at_exit(void) {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Finalize();
}

static fsdp_status ensure_initialised(fsdp_ctx *ctx) {
    pthread_mutex_lock(&init_mu);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    fsdp_status st = FSDP_OK;
    if (finalised) {
        st = FSDP_FAIL(ctx, FSDP_ERR_STATE,
                       "fsdp_world_create: MPI has been finalised in this process; create MPI "
                       "worlds before MPI_Finalize");
    } else if (!initialised) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) {
            st = fail_mpi(ctx, rc, "MPI_Init_thread", "fsdp_world_create");
        } else {
            if (atexit(finalise_at_exit) != 0)
                fsdp_log(ctx, FSDP_LOG_WARN, "cannot register MPI_Finalize to run at exit");
        }
    }
    pthread_mutex_unlock(&init_mu);
    return st;
}

/* ---- sends that outlive their call ---- */

static void reap_sends(mpi_world *mw) {
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

/* Sends `note` to world rank `dest` on comm without waiting for it. */
static void send_note(mpi_world *mw, MPI_Comm comm, int dest, int kind, const mpi_note *note) {
    pending_send *s = malloc(sizeof *s);
    if (!s) return; /* the peer will time out instead of failing at once */
    s->note = *note;
    if (MPI_Isend(&s->note, (int)sizeof s->note, MPI_BYTE, dest, tag_of(mw, kind), comm, &s->req) !=
        MPI_SUCCESS) {
        free(s);
        return;
    }
    s->next = mw->sends;
    mw->sends = s;
}

/* ---- group states ---- */

static void group_state_free(mpi_group *mg) {
    if (!mg) return;
    if (mg->comm != MPI_COMM_NULL) MPI_Comm_free(&mg->comm);
    free(mg->ranks), free(mg->descs), free(mg->ready), free(mg->calls), free(mg->call_ptrs);
    free(mg->srcs);
    free(mg->reqs), free(mg->req_member), free(mg->req_recv), free(mg->done_idx);
    free(mg->scratch);
    free(mg);
}

/* A group state over comm (taken over) whose members are the given world ranks. */
static mpi_group *group_state_new(mpi_world *mw, MPI_Comm comm, int size, int rank,
                                  const int *ranks) {
    mpi_group *mg = calloc(1, sizeof *mg);
    if (!mg) return NULL;
    size_t n = (size_t)size;
    mg->mw = mw;
    mg->comm = comm;
    mg->size = size;
    mg->rank = rank;
    mg->ranks = malloc(n * sizeof *mg->ranks);
    mg->descs = calloc(n, sizeof *mg->descs);
    mg->ready = calloc(n, sizeof *mg->ready);
    mg->calls = calloc(n, sizeof *mg->calls);
    mg->call_ptrs = calloc(n, sizeof *mg->call_ptrs);
    mg->srcs = calloc(n, sizeof *mg->srcs);
    if (!mg->ranks || !mg->descs || !mg->ready || !mg->calls || !mg->call_ptrs || !mg->srcs) {
        group_state_free(mg);
        return NULL;
    }
    memcpy(mg->ranks, ranks, n * sizeof *ranks);
    for (int i = 0; i < size; i++) mg->call_ptrs[i] = &mg->calls[i];
    return mg;
}

/* ---- failing: poison, timeouts, ranks that have gone ---- */

static fsdp_status fail_poisoned(fsdp_ctx *ctx, const fsdp_group *g, const mpi_group *mg, int op) {
    char msg[FSDP_ERROR_MAX];
    fsdp_comm_failure f = {.kind = FSDP_FAILURE_POISONED,
                           .op = op,
                           .group_desc = g->desc,
                           .poison_status = mg->poison_status,
                           .poison_msg = mg->poison_msg};
    fsdp_status st = fsdp_comm_failure_format(&f, msg, sizeof msg);
    return FSDP_FAIL(ctx, st, "%s", msg);
}

/* Marks the group unusable and tells the other members, so that they fail at once. */
static void poison(mpi_group *mg, fsdp_status status, const char *msg) {
    if (mg->poisoned) return;
    mg->poisoned = true;
    mg->poison_status = status;
    snprintf(mg->poison_msg, sizeof mg->poison_msg, "%s", msg);
    mpi_note note = {.status = status};
    snprintf(note.message, sizeof note.message, "%s", msg);
    for (int m = 0; m < mg->size; m++)
        if (m != mg->rank) send_note(mg->mw, mg->comm, m, TAG_POISON, &note);
}

/* Drops the requests still open after a failed wait: receives are cancelled; sends are left
 * to finish on their own (small ones already have). */
static void abandon_requests(mpi_group *mg) {
    for (int i = 0; i < mg->n_reqs; i++) {
        if (mg->reqs[i] == MPI_REQUEST_NULL) continue;
        if (mg->req_recv[i]) {
            MPI_Cancel(&mg->reqs[i]);
            MPI_Wait(&mg->reqs[i], MPI_STATUS_IGNORE);
        } else {
            MPI_Request_free(&mg->reqs[i]);
        }
    }
    mg->n_reqs = 0;
}

static fsdp_status fail_and_poison(fsdp_ctx *ctx, mpi_group *mg, fsdp_status status,
                                   const char *msg) {
    abandon_requests(mg);
    poison(mg, status, msg);
    return FSDP_FAIL(ctx, status, "%s", msg);
}

/* Per member: whether this rank still has an open receive from it (it has not sent its part
 * of the step). Returns a calloc'd array, NULL when out of memory. */
static bool *open_members(const mpi_group *mg) {
    bool *open = calloc((size_t)mg->size, sizeof *open);
    for (int i = 0; open && i < mg->n_reqs; i++)
        if (mg->reqs[i] != MPI_REQUEST_NULL && mg->req_recv[i]) open[mg->req_member[i]] = true;
    return open;
}

/* What a wait is for, which decides its deadline. */
typedef enum wait_kind {
    WAIT_ARRIVAL, /* the descriptor exchange: timeout_ms after it started */
    WAIT_DATA,    /* a data step: timeout_ms without any request completing */
    WAIT_CONFIRM, /* confirm's second round: none (see confirm) */
} wait_kind;

/* The wait failed (f: what went wrong): open requests are dropped and the group is
 * poisoned, so that every member fails. */
static fsdp_status fail_wait(fsdp_ctx *ctx, mpi_group *mg, const fsdp_comm_failure *f) {
    char msg[FSDP_ERROR_MAX];
    fsdp_status st = fsdp_comm_failure_format(f, msg, sizeof msg);
    return fail_and_poison(ctx, mg, st, msg);
}

static fsdp_status fail_timeout(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, int op,
                                bool arrival) {
    bool *open = open_members(mg);
    fsdp_comm_failure f = {.kind = arrival ? FSDP_FAILURE_ARRIVAL : FSDP_FAILURE_DATA,
                           .op = op,
                           .group_desc = g->desc,
                           .timeout_ms = mg->mw->world->timeout_ms,
                           .n_members = mg->size,
                           .ranks = g->ranks,
                           .missing = open};
    fsdp_status st = fail_wait(ctx, mg, &f);
    free(open);
    return st;
}

static fsdp_status fail_gone(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, int op,
                             int world_rank) {
    fsdp_comm_failure f = {.kind = FSDP_FAILURE_GONE,
                           .op = op,
                           .group_desc = g->desc,
                           .gone_rank = world_rank,
                           .gone = &mg->mw->world->results[world_rank]};
    return fail_wait(ctx, mg, &f);
}

/* Receives the exit notes that have arrived: their ranks' results go into the world. */
static void receive_exit_notes(mpi_world *mw) {
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

/* The world rank of a member this rank still waits for whose function has returned, or -1. */
static int gone_member(const fsdp_group *g, const mpi_group *mg) {
    for (int i = 0; i < mg->n_reqs; i++) {
        if (mg->reqs[i] == MPI_REQUEST_NULL || !mg->req_recv[i]) continue;
        int r = g->ranks[mg->req_member[i]];
        if (mg->mw->noted[r]) return r;
    }
    return -1;
}

/* ---- requests ---- */

static bool grow_requests(mpi_group *mg, int need) {
    if (need <= mg->cap_reqs) return true;
    int cap = mg->cap_reqs ? mg->cap_reqs : 16;
    while (cap < need) cap *= 2;
    MPI_Request *reqs = realloc(mg->reqs, (size_t)cap * sizeof *reqs);
    if (reqs) mg->reqs = reqs;
    int *member = realloc(mg->req_member, (size_t)cap * sizeof *member);
    if (member) mg->req_member = member;
    bool *recv = realloc(mg->req_recv, (size_t)cap * sizeof *recv);
    if (recv) mg->req_recv = recv;
    int *idx = realloc(mg->done_idx, (size_t)cap * sizeof *idx);
    if (idx) mg->done_idx = idx;
    if (!reqs || !member || !recv || !idx) return false;
    mg->cap_reqs = cap;
    return true;
}

/* Posts a receive (recv) or a send of `bytes` at buf with group member `member`, as
 * several messages when it is larger than SEGMENT_BYTES. Nothing for 0 bytes. A failure
 * poisons the group: the peers must not wait for this rank's half of the step. */
static fsdp_status post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, bool recv, int member,
                        int kind, void *buf, size_t bytes) {
    int tag = tag_of(mg->mw, kind);
    for (size_t at = 0; at < bytes; at += SEGMENT_BYTES) {
        int n = (int)(bytes - at < SEGMENT_BYTES ? bytes - at : SEGMENT_BYTES);
        char msg[FSDP_ERROR_MAX];
        if (!grow_requests(mg, mg->n_reqs + 1)) {
            snprintf(msg, sizeof msg, "group %s: cannot grow the requests (out of memory)",
                     g->desc);
            return fail_and_poison(ctx, mg, FSDP_ERR_OUT_OF_MEMORY, msg);
        }
        MPI_Request *req = &mg->reqs[mg->n_reqs];
        char *p = (char *)buf + at;
        int rc = recv ? MPI_Irecv(p, n, MPI_BYTE, member, tag, mg->comm, req)
                      : MPI_Isend(p, n, MPI_BYTE, member, tag, mg->comm, req);
        if (rc != MPI_SUCCESS) {
            fail_mpi(ctx, rc, recv ? "MPI_Irecv" : "MPI_Isend", g->desc);
            snprintf(msg, sizeof msg, "%s", fsdp_last_error(ctx));
            return fail_and_poison(ctx, mg, FSDP_ERR_COMM, msg);
        }
        mg->req_member[mg->n_reqs] = member;
        mg->req_recv[mg->n_reqs] = recv;
        mg->n_reqs++;
    }
    return FSDP_OK;
}

/* Between polls: spin first (latency), then yield the core, then sleep a little. */
static void back_off(int polls, double waited) {
    if (polls < 32) return;
    if (waited < 0.002) {
        sched_yield();
        return;
    }
    long ns = waited < 0.05 ? 20000L : 200000L;
    nanosleep(&(struct timespec){.tv_nsec = ns}, NULL);
}

/* Waits until every posted request has completed, with the deadline `kind` says. Meanwhile:
 * a poison note on the group fails the wait at once, and so does a member it waits for whose
 * function has returned. A confirmation round has no deadline: it warns every
 * max(timeout_ms, WARN_EVERY_S) instead. */
static fsdp_status wait_all(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, int op,
                            wait_kind kind) {
    mpi_world *mw = mg->mw;
    const double start = now_s(CLOCK_MONOTONIC), limit = 1e-3 * mw->world->timeout_ms;
    double progress = start, next_check = start, gone_since = -1, warned = start;
    int open = mg->n_reqs;
    for (int polls = 0; open > 0; polls++) {
        int done = 0;
        int rc = MPI_Testsome(mg->n_reqs, mg->reqs, &done, mg->done_idx, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char msg[FSDP_ERROR_MAX];
            fail_mpi(ctx, rc, "MPI_Testsome", g->desc);
            snprintf(msg, sizeof msg, "%s on group %s: %s", fsdp_call_op_name(op), g->desc,
                     fsdp_last_error(ctx));
            return fail_and_poison(ctx, mg, FSDP_ERR_COMM, msg);
        }
        double t = now_s(CLOCK_MONOTONIC);
        if (done == MPI_UNDEFINED) break;
        if (done > 0) {
            open -= done;
            progress = t;
            polls = 0;
            continue;
        }
        if (t >= next_check) {
            next_check = t + 1e-3;
            if (receive_poison(mg)) {
                abandon_requests(mg);
                return fail_poisoned(ctx, g, mg, op);
            }
            receive_exit_notes(mw);
            int gone = gone_member(g, mg);
            if (gone < 0)
                gone_since = -1;
            else if (gone_since < 0)
                gone_since = t;
            else if (t - gone_since > GONE_GRACE_S)
                return fail_gone(ctx, g, mg, op, gone);
            if (kind == WAIT_CONFIRM && t - warned >= fmax(limit, WARN_EVERY_S)) {
                char missing[256] = "";
                bool *late = open_members(mg);
                if (late) fsdp_comm_rank_list(g->ranks, late, mg->size, true, missing, 256);
                free(late);
                warned = t;
                fsdp_log(ctx, FSDP_LOG_WARN,
                         "%s on group %s: every rank arrived, but rank(s) %s have not confirmed "
                         "after %.0f s",
                         fsdp_call_op_name(op), g->desc, missing, t - start);
            } else if (kind != WAIT_CONFIRM &&
                       t - (kind == WAIT_ARRIVAL ? start : progress) >= limit) {
                return fail_timeout(ctx, g, mg, op, kind == WAIT_ARRIVAL);
            }
        }
        back_off(polls, t - progress);
    }
    mg->n_reqs = 0;
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

/* Sends this rank's call to every member and receives theirs; returns once all have arrived
 * and the calls are judged (every member reaches the same verdict from the same calls). */
static fsdp_status arrive(fsdp_ctx *ctx, const fsdp_group *g, const fsdp_call *mine) {
    mpi_group *mg = g->state;
    /* A poison note that has arrived may need a few rounds of MPI's progress to be seen. */
    for (int i = 0; i < ENTRY_PROBES && !mg->poisoned; i++) receive_poison(mg);
    if (mg->poisoned) return fail_poisoned(ctx, g, mg, mine->op);
    reap_sends(mg->mw);
    size_t len = encode(&mg->descs[g->rank], mine);
    mg->n_reqs = 0;
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY(post(ctx, g, mg, true, m, TAG_DESC, &mg->descs[m], sizeof(mpi_desc)));
    for (int m = 0; m < g->size; m++)
        if (m != g->rank) FSDP_TRY(post(ctx, g, mg, false, m, TAG_DESC, &mg->descs[g->rank], len));
    FSDP_TRY(wait_all(ctx, g, mg, mine->op, WAIT_ARRIVAL));
    for (int m = 0; m < g->size; m++) decode(&mg->calls[m], &mg->descs[m]);
    fsdp_status st = fsdp_call_judge(mg->call_ptrs, g->size, g->rank, g->ranks, g->desc, mg->msg,
                                     sizeof mg->msg);
    if (st == FSDP_OK) {
        /* A member may have given up on this very call (timed out) after its descriptor had
         * left: then ours matched its stale one. Its poison note usually is here by now; the
         * data step must not start (a send of its still in flight could be read), and a call
         * without one (barrier, split) is settled by confirm. */
        for (int i = 0; i < ENTRY_PROBES && !mg->poisoned; i++) receive_poison(mg);
        return mg->poisoned ? fail_poisoned(ctx, g, mg, mine->op) : FSDP_OK;
    }
    /* Peers that gave up on an earlier call (timed out, then poisoned the group) left their
     * calls of it behind; their poison notes follow them. */
    for (double t0 = now_s(CLOCK_MONOTONIC); now_s(CLOCK_MONOTONIC) - t0 < SETTLE_S;)
        if (receive_poison(mg)) return fail_poisoned(ctx, g, mg, mine->op);
    return FSDP_FAIL(ctx, st, "%s", mg->msg);
}

/* The second round of a call that moves no data (barrier, split): once a rank has every
 * member's descriptor it sends each a confirmation and waits for theirs, without a deadline.
 * A member that timed out in the exchange (its deadline passed just before the last
 * descriptor came, while the latecomer found every descriptor waiting) never confirms and
 * has poisoned the group, so the others fail on its note instead of succeeding alone, or,
 * for a split, entering MPI_Comm_split (which blocks) without it. A member confirms at once
 * after its exchange, so the wait is short; and since every member that confirmed waits for
 * all the others, either every member gets past confirm or none does. */
static fsdp_status confirm(fsdp_ctx *ctx, const fsdp_group *g, int op) {
    mpi_group *mg = g->state;
    if (g->size == 1) return FSDP_OK;
    mg->n_reqs = 0;
    mg->ready[g->rank] = 1;
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY(post(ctx, g, mg, true, m, TAG_READY, &mg->ready[m], sizeof *mg->ready));
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY(post(ctx, g, mg, false, m, TAG_READY, &mg->ready[g->rank], sizeof *mg->ready));
    return wait_all(ctx, g, mg, op, WAIT_CONFIRM);
}

/* ---- the collectives ---- */

static const int64_t zeros[FSDP_MAX_DIMS] = {0};

/* A scratch buffer of at least `bytes`, kept by the group. */
static fsdp_status scratch(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, size_t bytes,
                           char **out) {
    if (bytes > mg->scratch_cap) {
        size_t cap = mg->scratch_cap ? mg->scratch_cap : 4096;
        while (cap < bytes) cap *= 2;
        void *p = realloc(mg->scratch, cap);
        if (!p) {
            char msg[FSDP_ERROR_MAX];
            snprintf(msg, sizeof msg, "group %s: cannot allocate %zu bytes of scratch", g->desc,
                     cap);
            return fail_and_poison(ctx, mg, FSDP_ERR_OUT_OF_MEMORY, msg);
        }
        mg->scratch = p;
        mg->scratch_cap = cap;
    }
    *out = mg->scratch;
    return FSDP_OK;
}

/* The elements before and after dim of a shape. */
static void outer_inner(const int64_t *shape, int ndim, int dim, int64_t *outer, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < dim; i++) *outer *= shape[i];
    for (int i = dim + 1; i < ndim; i++) *inner *= shape[i];
}

static fsdp_status mpi_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                  const fsdp_tensor *in, int dim) {
    fsdp_call c = fsdp_call_all_gather(out, in, dim);
    FSDP_TRY(arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    const size_t esize = fsdp_dtype_size(out->dtype);
    int64_t outer, inner, n = out->shape[dim], off, len, at[FSDP_MAX_DIMS] = {0};
    outer_inner(out->shape, out->ndim, dim, &outer, &inner);
    char *o = fsdp_tensor_data(out), *buf = NULL;
    if (outer > 1) { /* the pieces are not contiguous in out: receive them packed */
        int64_t total = 0;
        for (int m = 0; m < g->size; m++) {
            fsdp_chunk_range(n, g->size, m, NULL, &len);
            if (m != g->rank) total += outer * len * inner;
        }
        FSDP_TRY(scratch(ctx, g, mg, (size_t)total * esize, &buf));
    }
    int64_t packed = 0;
    for (int m = 0; m < g->size; m++) {
        fsdp_chunk_range(n, g->size, m, &off, &len);
        if (m == g->rank) continue;
        size_t bytes = (size_t)(outer * len * inner) * esize;
        void *dst = outer > 1 ? buf + (size_t)packed * esize : o + (size_t)(off * inner) * esize;
        FSDP_TRY(post(ctx, g, mg, true, m, TAG_DATA, dst, bytes));
        packed += outer * len * inner;
    }
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY(
                post(ctx, g, mg, false, m, TAG_DATA, fsdp_tensor_data(in), fsdp_tensor_nbytes(in)));
    fsdp_chunk_range(n, g->size, g->rank, &at[dim], NULL);
    fsdp_box_copy(o, out->shape, at, fsdp_tensor_data(in), in->shape, zeros, in->shape, out->ndim,
                  esize);
    FSDP_TRY(wait_all(ctx, g, mg, c.op, WAIT_DATA));
    if (outer == 1) return FSDP_OK;
    int64_t shape[FSDP_MAX_DIMS];
    memcpy(shape, out->shape, sizeof shape);
    packed = 0;
    for (int m = 0; m < g->size; m++) {
        fsdp_chunk_range(n, g->size, m, &at[dim], &shape[dim]);
        if (m == g->rank) continue;
        fsdp_box_copy(o, out->shape, at, buf + (size_t)packed * esize, shape, zeros, shape,
                      out->ndim, esize);
        packed += outer * shape[dim] * inner;
    }
    return FSDP_OK;
}

static fsdp_status mpi_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                      const fsdp_tensor *in, int dim, fsdp_reduce_op op) {
    fsdp_call c = fsdp_call_reduce_scatter(out, in, dim, op);
    FSDP_TRY(arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    const int W = g->size, r = g->rank;
    const size_t esize = fsdp_dtype_size(in->dtype);
    int64_t outer, inner, n = in->shape[dim], off, len;
    outer_inner(in->shape, in->ndim, dim, &outer, &inner);
    const char *x = fsdp_tensor_data(in);
    /* Scratch: W-1 received pieces of this rank's chunk; with outer > 1 also every piece of
     * this rank's input, packed (they are not contiguous in it). */
    const int64_t mine = outer * out->shape[dim] * inner;
    size_t recv_bytes = (size_t)((W - 1) * mine) * esize;
    size_t bytes = recv_bytes + (outer > 1 ? fsdp_tensor_nbytes(in) : 0);
    char *buf = NULL;
    FSDP_TRY(scratch(ctx, g, mg, bytes, &buf));
    int64_t shape[FSDP_MAX_DIMS], at[FSDP_MAX_DIMS] = {0};
    memcpy(shape, in->shape, sizeof shape);
    for (int m = 0, slot = 0; m < W; m++) {
        fsdp_chunk_range(n, W, m, &off, &len);
        const char *piece = x + (size_t)(off * inner) * esize;
        if (outer > 1) { /* pack piece m */
            char *p = buf + recv_bytes + (size_t)(outer * off * inner) * esize;
            at[dim] = off;
            shape[dim] = len;
            fsdp_box_copy(p, shape, zeros, x, in->shape, at, shape, in->ndim, esize);
            piece = p;
        }
        if (m == r) {
            mg->srcs[m] = piece;
            continue;
        }
        mg->srcs[m] = buf + (size_t)(slot++ * mine) * esize;
        FSDP_TRY(post(ctx, g, mg, false, m, TAG_DATA, (void *)piece,
                      (size_t)(outer * len * inner) * esize));
    }
    for (int m = 0; m < W; m++)
        if (m != r)
            FSDP_TRY(
                post(ctx, g, mg, true, m, TAG_DATA, (void *)mg->srcs[m], (size_t)mine * esize));
    FSDP_TRY(wait_all(ctx, g, mg, c.op, WAIT_DATA));
    if (mine > 0) fsdp_reduce_run(fsdp_tensor_data(out), mg->srcs, W, 0, mine, in->dtype, op);
    return FSDP_OK;
}

static fsdp_status mpi_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op) {
    fsdp_call c = fsdp_call_all_reduce(t, op);
    FSDP_TRY(arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    const int W = g->size, r = g->rank;
    const size_t esize = fsdp_dtype_size(t->dtype);
    char *x = fsdp_tensor_data(t), *buf = NULL;
    int64_t begin, len, off, n;
    fsdp_chunk_range(t->numel, W, r, &begin, &len);
    FSDP_TRY(scratch(ctx, g, mg, (size_t)((W - 1) * len) * esize, &buf));
    /* 1: each rank gathers every rank's values of its chunk of the elements and reduces them
     * in rank order into its own tensor (reading its own block before writing it)... */
    for (int m = 0, slot = 0; m < W; m++) {
        if (m == r) {
            mg->srcs[m] = x + (size_t)begin * esize;
            continue;
        }
        mg->srcs[m] = buf + (size_t)(slot++ * len) * esize;
        FSDP_TRY(post(ctx, g, mg, true, m, TAG_DATA, (void *)mg->srcs[m], (size_t)len * esize));
        fsdp_chunk_range(t->numel, W, m, &off, &n);
        FSDP_TRY(post(ctx, g, mg, false, m, TAG_DATA, x + (size_t)off * esize, (size_t)n * esize));
    }
    FSDP_TRY(wait_all(ctx, g, mg, c.op, WAIT_DATA));
    if (len > 0) fsdp_reduce_run(x + (size_t)begin * esize, mg->srcs, W, 0, len, t->dtype, op);
    /* 2: ...then every rank sends its reduced chunk to all (an all_gather of the chunks). */
    for (int m = 0; m < W; m++) {
        if (m == r) continue;
        fsdp_chunk_range(t->numel, W, m, &off, &n);
        FSDP_TRY(post(ctx, g, mg, true, m, TAG_DATA, x + (size_t)off * esize, (size_t)n * esize));
        FSDP_TRY(
            post(ctx, g, mg, false, m, TAG_DATA, x + (size_t)begin * esize, (size_t)len * esize));
    }
    return wait_all(ctx, g, mg, c.op, WAIT_DATA);
}

static fsdp_status mpi_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root) {
    fsdp_call c = fsdp_call_broadcast(t, root);
    FSDP_TRY(arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    for (int m = 0; m < g->size; m++) {
        if (m == g->rank || (g->rank != root && m != root)) continue;
        FSDP_TRY(post(ctx, g, mg, g->rank != root, m, TAG_DATA, fsdp_tensor_data(t),
                      fsdp_tensor_nbytes(t)));
    }
    return wait_all(ctx, g, mg, c.op, WAIT_DATA);
}

static fsdp_status mpi_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                  const fsdp_tensor *in, int split_dim, int concat_dim) {
    fsdp_call c = fsdp_call_all_to_all(out, in, split_dim, concat_dim);
    FSDP_TRY(arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    const int W = g->size, r = g->rank, nd = in->ndim, s = split_dim, k = concat_dim;
    const size_t esize = fsdp_dtype_size(in->dtype);
    /* The box rank m sends to rank q: m's input (the global shape with concat_dim cut to
     * chunk m, or the one shape when s == k) with split_dim cut to chunk q. */
    int64_t send_box[FSDP_MAX_DIMS], recv_box[FSDP_MAX_DIMS];
    int64_t src_at[FSDP_MAX_DIMS] = {0}, dst_at[FSDP_MAX_DIMS] = {0};
    size_t total = fsdp_tensor_nbytes(in) + fsdp_tensor_nbytes(out);
    char *buf = NULL, *send_area, *recv_area;
    FSDP_TRY(scratch(ctx, g, mg, total, &buf));
    send_area = buf;
    recv_area = buf + fsdp_tensor_nbytes(in);
    size_t sent = 0, received = 0;
    int64_t at = 0; /* where along concat_dim the next rank's piece goes */
    for (int m = 0; m < W; m++) {
        memcpy(send_box, in->shape, sizeof send_box);
        fsdp_chunk_range(in->shape[s], W, m, &src_at[s], &send_box[s]);
        memcpy(recv_box, c.shape, sizeof recv_box);
        if (s != k) fsdp_chunk_range(c.shape[k], W, m, NULL, &recv_box[k]);
        fsdp_chunk_range(recv_box[s], W, r, NULL, &recv_box[s]);
        dst_at[k] = at;
        at += recv_box[k];
        if (m == r) {
            fsdp_box_copy(fsdp_tensor_data(out), out->shape, dst_at, fsdp_tensor_data(in),
                          in->shape, src_at, send_box, nd, esize);
            continue;
        }
        size_t send_bytes = esize, recv_bytes = esize;
        for (int i = 0; i < nd; i++) send_bytes *= (size_t)send_box[i];
        for (int i = 0; i < nd; i++) recv_bytes *= (size_t)recv_box[i];
        fsdp_box_copy(send_area + sent, send_box, zeros, fsdp_tensor_data(in), in->shape, src_at,
                      send_box, nd, esize);
        FSDP_TRY(post(ctx, g, mg, true, m, TAG_DATA, recv_area + received, recv_bytes));
        FSDP_TRY(post(ctx, g, mg, false, m, TAG_DATA, send_area + sent, send_bytes));
        sent += send_bytes;
        received += recv_bytes;
    }
    FSDP_TRY(wait_all(ctx, g, mg, c.op, WAIT_DATA));
    received = 0;
    at = 0;
    for (int m = 0; m < W; m++) {
        memcpy(recv_box, c.shape, sizeof recv_box);
        if (s != k) fsdp_chunk_range(c.shape[k], W, m, NULL, &recv_box[k]);
        fsdp_chunk_range(recv_box[s], W, r, NULL, &recv_box[s]);
        dst_at[k] = at;
        at += recv_box[k];
        if (m == r) continue;
        size_t bytes = esize;
        for (int i = 0; i < nd; i++) bytes *= (size_t)recv_box[i];
        fsdp_box_copy(fsdp_tensor_data(out), out->shape, dst_at, recv_area + received, recv_box,
                      zeros, recv_box, nd, esize);
        received += bytes;
    }
    return FSDP_OK;
}

static fsdp_status mpi_barrier(fsdp_ctx *ctx, fsdp_group *g) {
    fsdp_call c = {.op = FSDP_COMM_BARRIER};
    FSDP_TRY(arrive(ctx, g, &c));
    return confirm(ctx, g, c.op);
}

static void mpi_reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op) {
    fsdp_call c = {.op = op, .rejected = ctx->error.status, .reject_msg = ctx->error.message};
    (void)arrive(ctx, g, &c);
}

/* ---- groups ---- */

static fsdp_status mpi_split(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                             const char *agree, fsdp_group_info *out) {
    fsdp_call c = {.op = FSDP_OP_SPLIT, .color = color, .key = key, .agree = agree};
    FSDP_TRY(arrive(ctx, parent, &c));
    FSDP_TRY(confirm(ctx, parent, c.op));
    mpi_group *pg = parent->state;
    mpi_world *mw = pg->mw;
    /* Every member has arrived and confirmed, so MPI_Comm_split (which has no non-blocking
     * form) cannot wait for an absent one. Members: the parent's of this color, by (key,
     * parent rank). */
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_TRY(ctx, MPI_Comm_split(pg->comm, color >= 0 ? color : MPI_UNDEFINED, key, &comm),
            "group split");
    *out = (fsdp_group_info){0};
    if (color < 0) return FSDP_OK;
    int *order = malloc((size_t)parent->size * sizeof *order), m = 0, mine = -1;
    for (int p = 0; order && p < parent->size; p++) {
        if (pg->calls[p].color != color) continue;
        int at = m++;
        while (at > 0 && pg->calls[order[at - 1]].key > pg->calls[p].key)
            order[at] = order[at - 1], at--;
        order[at] = p;
    }
    for (int i = 0; order && i < m; i++) {
        if (order[i] == parent->rank) mine = i;
        order[i] = parent->ranks[order[i]];
    }
    int comm_size = 0, comm_rank = -1;
    MPI_Comm_size(comm, &comm_size);
    MPI_Comm_rank(comm, &comm_rank);
    mpi_group *child = NULL;
    bool allocated = order != NULL, agrees = allocated && comm_size == m && comm_rank == mine;
    if (agrees) {
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        child = group_state_new(mw, comm, m, mine, order);
    }
    free(order);
    if (!child) {
        MPI_Comm_free(&comm);
        if (allocated && !agrees)
            return FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                             "group split of %s: MPI's new communicator has %d members and this "
                             "rank at %d, but the descriptors say %d and %d",
                             parent->desc, comm_size, comm_rank, m, mine);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                         "group split of %s: cannot allocate the new group of %d members",
                         parent->desc, m);
    }
    child->next = mw->groups;
    mw->groups = child;
    *out = (fsdp_group_info){
        .state = child, .size = child->size, .rank = child->rank, .ranks = child->ranks};
    return FSDP_OK;
}

/* ---- the world ---- */

static void mpi_hosted_ranks(void *context, int *first, int *count) {
    const mpi_world *mw = context;
    *first = mw->rank;
    *count = 1;
}

static void mpi_world_group(void *context, int rank, fsdp_group_info *out) {
    const mpi_world *mw = context;
    *out = (fsdp_group_info){
        .state = mw->world_group, .size = mw->size, .rank = rank, .ranks = mw->world_group->ranks};
}

static void free_run_groups(mpi_world *mw) {
    while (mw->groups) {
        mpi_group *next = mw->groups->next;
        group_state_free(mw->groups);
        mw->groups = next;
    }
}

static void mpi_reset(void *context) {
    mpi_world *mw = context;
    mw->run++;
    free_run_groups(mw);
    mw->world_group->poisoned = false;
    mw->world_group->n_reqs = 0;
    for (int r = 0; r < mw->size; r++) mw->noted[r] = false, mw->finished[r] = 0;
}

/* This process's rank has returned: tell every other rank, with its result. */
static void mpi_rank_exited(void *context, int rank) {
    mpi_world *mw = context;
    const fsdp_rank_result *res = &mw->world->results[rank];
    mpi_note note = {.status = res->status, .finished = now_s(CLOCK_REALTIME)};
    snprintf(note.message, sizeof note.message, "%s", res->message);
    snprintf(note.origin, sizeof note.origin, "%s", res->origin);
    snprintf(note.trail, sizeof note.trail, "%s", res->trail);
    mw->finished[rank] = note.finished;
    mw->noted[rank] = true;
    for (int r = 0; r < mw->size; r++)
        if (r != rank) send_note(mw, mw->comm, r, TAG_EXIT, &note);
}

/* Waits for every other rank's exit note; orders the failures by the time they happened. */
static void mpi_collect_results(fsdp_ctx *ctx, void *context) {
    mpi_world *mw = context;
    fsdp_world *w = mw->world;
    double start = now_s(CLOCK_MONOTONIC), warned = start;
    for (int polls = 0;; polls++) {
        receive_exit_notes(mw);
        reap_sends(mw);
        int missing = 0;
        for (int r = 0; r < mw->size; r++) missing += !mw->noted[r];
        if (missing == 0) break;
        double t = now_s(CLOCK_MONOTONIC);
        if (t - warned >= fmax(1e-3 * w->timeout_ms, WARN_EVERY_S)) {
            warned = t;
            char list[256];
            fsdp_comm_rank_list(NULL, mw->noted, mw->size, false, list, sizeof list);
            fsdp_log(ctx, FSDP_LOG_WARN,
                     "fsdp_world_run: rank %d has waited %.0f s for rank%s %s to return from "
                     "its function",
                     mw->rank, t - start, missing > 1 ? "s" : "", list);
        }
        back_off(polls, t - start);
    }
    int failures = 0;
    for (int r = 0; r < mw->size; r++) {
        w->results[r].failure_order = 0;
        failures += w->results[r].status != FSDP_OK;
    }
    for (int order = 1; order <= failures; order++) {
        int first = -1;
        for (int r = 0; r < mw->size; r++) {
            if (w->results[r].status == FSDP_OK || w->results[r].failure_order) continue;
            if (first < 0 || mw->finished[r] < mw->finished[first]) first = r;
        }
        w->results[first].failure_order = order;
    }
}

static void mpi_free(void *context) {
    mpi_world *mw = context;
    if (!mw) return;
    free_run_groups(mw);
    group_state_free(mw->world_group);
    /* A note still in flight (never, in practice: notes are small enough to be sent eagerly)
     * is left to MPI, and its buffer to the graveyard. */
    reap_sends(mw);
    for (pending_send *s = mw->sends, *next; s; s = next) {
        next = s->next;
        MPI_Request_free(&s->req);
        pthread_mutex_lock(&init_mu);
        s->next = graveyard;
        graveyard = s;
        pthread_mutex_unlock(&init_mu);
    }
    free(mw->noted);
    free(mw->finished);
    free(mw);
}

static const fsdp_comm_backend_i mpi_iface = {
    .name = "mpi",
    .device = FSDP_DEVICE_CPU,
    .hosted_ranks = mpi_hosted_ranks,
    .world_group = mpi_world_group,
    .split = mpi_split,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .all_to_all = mpi_all_to_all,
    .barrier = mpi_barrier,
    .reject = mpi_reject,
    .reset = mpi_reset,
    .rank_exited = mpi_rank_exited,
    .collect_results = mpi_collect_results,
    .free = mpi_free,
};

/* Duplicates MPI_COMM_WORLD, waiting at most timeout_ms for the other processes. */
static fsdp_status dup_world(fsdp_ctx *ctx, int timeout_ms, MPI_Comm *comm) {
    MPI_Request req;
    MPI_TRY(ctx, MPI_Comm_idup(MPI_COMM_WORLD, comm, &req), "fsdp_world_create");
    double start = now_s(CLOCK_MONOTONIC);
    for (int polls = 0;; polls++) {
        int done = 0;
        MPI_TRY(ctx, MPI_Test(&req, &done, MPI_STATUS_IGNORE), "fsdp_world_create");
        if (done) break;
        double waited = now_s(CLOCK_MONOTONIC) - start;
        if (waited * 1e3 >= timeout_ms)
            return FSDP_FAIL(ctx, FSDP_ERR_TIMEOUT,
                             "fsdp_world_create: timed out after %d ms waiting for the other "
                             "processes of the MPI job to create the world; every process must "
                             "call fsdp_world_create with the mpi backend, in the same order",
                             timeout_ms);
        back_off(polls, waited);
    }
    MPI_TRY(ctx, MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN), "fsdp_world_create");
    return FSDP_OK;
}

fsdp_status fsdp_mpi_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks) {
    FSDP_TRY(ensure_initialised(ctx));
    int size = 0, rank = 0;
    MPI_TRY(ctx, MPI_Comm_size(MPI_COMM_WORLD, &size), "fsdp_world_create");
    MPI_TRY(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &rank), "fsdp_world_create");
    if (nranks != 0 && nranks != size)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_world_create: nranks is %d but the MPI world has %d process%s; "
                         "pass nranks 0 (the MPI world size) or %d, or start %d processes "
                         "(mpirun -np %d)",
                         nranks, size, size == 1 ? "" : "es", size, nranks, nranks);
    mpi_world *mw = calloc(1, sizeof *mw);
    int *ranks = malloc((size_t)size * sizeof *ranks);
    if (mw) {
        mw->noted = calloc((size_t)size, sizeof *mw->noted);
        mw->finished = calloc((size_t)size, sizeof *mw->finished);
    }
    if (!mw || !ranks || !mw->noted || !mw->finished) {
        free(ranks);
        if (mw) free(mw->noted), free(mw->finished), free(mw);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                         "cannot allocate the MPI backend for %d ranks", size);
    }
    MPI_Comm comm = MPI_COMM_NULL;
    fsdp_status st = dup_world(ctx, world->timeout_ms, &comm);
    for (int r = 0; r < size; r++) ranks[r] = r;
    if (st == FSDP_OK) {
        mw->world_group = group_state_new(mw, comm, size, rank, ranks);
        if (!mw->world_group) {
            MPI_Comm_free(&comm);
            st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                           "cannot allocate the MPI backend for %d ranks", size);
        }
    }
    free(ranks);
    if (st != FSDP_OK) {
        free(mw->noted), free(mw->finished), free(mw);
        return st;
    }
    mw->world = world;
    mw->comm = comm;
    mw->rank = rank;
    mw->size = size;
    world->size = size;
    world->backend = (fsdp_comm_backend){.iface = mpi_iface, .context = mw};
    return FSDP_OK;
}
