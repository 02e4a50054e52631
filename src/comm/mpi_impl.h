/* mpi_impl.h: what the MPI backend's files share: message tags, the descriptor and note that
 * travel between ranks, the world and group states, and the entries of the waits
 * (mpi_wait.c), the collectives (mpi_collectives.c, and their non-blocking form in mpi_async.c)
 * and the lock (mpi_lock.c) and communication thread (mpi_thread.c) that the world (mpi_world.c)
 * builds on. Internal to the MPI backend; included only by src/comm/mpi_*.c. */
#ifndef FSDP_COMM_MPI_IMPL_H
#define FSDP_COMM_MPI_IMPL_H

#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "core/clock.h"

/* Message kinds. A tag is (run % RUN_TAGS) * TAG_KINDS + kind: messages left over from an
 * earlier run of the world (after a timeout) never match a later run's. The largest tag,
 * 32399, is below 32767, the least MPI_TAG_UB the standard allows. TAG_READY is the second
 * round of the calls that must not end differently on different ranks (split, barrier).
 * TAG_EXCHANGE and TAG_GATHER carry the first and second data steps of all_gather,
 * reduce_scatter and all_reduce, blocking or not: a non-blocking call (mpi_async.c) posts a step
 * when a rank sees the step before complete, at a point that differs from rank to rank, and a
 * peer may make the same call blocking. Their own tags keep them from matching the data of the
 * other calls (TAG_DATA: broadcast, all_to_all); a blocking call first waits for the group's
 * works started before it, so that every rank posts them in start order. TAG_TRACE_ASK and
 * TAG_TRACE_ANSWER are the flight recorder's (trace.c): a rank whose wait for members timed out
 * asks each missing one, on the world's communicator, for its recent collectives; a rank answers
 * while it waits in a collective. */
enum {
    TAG_DESC,
    TAG_DATA,
    TAG_POISON,
    TAG_EXIT,
    TAG_READY,
    TAG_EXCHANGE,
    TAG_GATHER,
    TAG_TRACE_ASK,
    TAG_TRACE_ANSWER,
    TAG_KINDS
};
#define RUN_TAGS 3600

/* The kind of data step `step` (1-based) of all_gather, reduce_scatter and all_reduce. */
static inline int fsdp_mpi_step_kind(int step) {
    return step == 1 ? TAG_EXCHANGE : TAG_GATHER;
}

#define SEGMENT_BYTES (1 << 30) /* MPI counts are int: larger pieces go as several messages */
#define GONE_GRACE_S  0.1   /* how long to wait for a message of a rank known to have returned */
#define ENTRY_PROBES  4     /* looks for a poison note as a call starts */
#define SETTLE_S      0.005 /* before reporting a disagreement: time for a poison note to land */

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
    fsdp_trace_counts calls; /* TAG_EXIT: its calls per group (fsdp_rank_result.calls) */
} mpi_note;

typedef struct mpi_group mpi_group;
typedef struct mpi_work mpi_work;

/* Requests posted together, with the member each talks to: a call's current step (the
 * group's), or a non-blocking call's (its work's). */
typedef struct mpi_reqs {
    MPI_Request *reqs;
    int *member;
    bool *recv;
    int *done_idx;
    int n;
    int64_t cap;        /* of the four arrays, which grow together */
    uint64_t group_seq; /* the call's number on its group when it is not the group's newest
                         * (a non-blocking call's), else 0 */
} mpi_reqs;

/* A query for a rank's recent collectives (TAG_TRACE_ASK) and its answer (TAG_TRACE_ANSWER):
 * the view of its flight recorder for the group the asker waits on. ask_id pairs them, so
 * that an answer that came too late is not taken for a later query's. */
typedef struct mpi_trace_ask {
    uint64_t group_id, ask_id;
} mpi_trace_ask;

typedef struct mpi_trace_answer {
    uint64_t ask_id;
    fsdp_trace_view view;
} mpi_trace_answer;

/* How long a rank whose wait timed out waits for the answers of the members it waited for;
 * a member waiting in a collective answers within a millisecond or two. */
#define TRACE_ASK_MS 250

/* A send still in flight whose buffer must outlive it (notes, answers). */
typedef struct pending_send {
    struct pending_send *next;
    MPI_Request req;
    size_t len;
    _Alignas(8) char data[];
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
    uint64_t trace_asks; /* queries this rank has sent (their ask_id) */
    /* The communication thread (mpi_thread.c), while threaded: the state above and below is
     * then read and written only under the process's MPI lock. */
    bool threaded, stop;
    pthread_t thread;
    pthread_cond_t wake; /* a start wakes it; a stop too */
    fsdp_ctx *thread_ctx;
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
    const void **srcs;   /* per member: its piece of a reduction */
    mpi_reqs rq;         /* the requests of the current step of a blocking call */
    mpi_work *works;     /* non-blocking calls not yet complete, in start order */
    bool waiting;        /* the rank waits for one of them (the thread leaves them alone) */
    void *scratch;       /* received and packed pieces */
    int64_t scratch_cap; /* bytes */
    char msg[FSDP_ERROR_MAX];
};

/* CLOCK_REALTIME seconds: a time other processes compare with theirs (mpi_note.finished).
 * Durations and deadlines read the monotonic fsdp_clock_now. */
static inline double realtime_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int tag_of(const mpi_world *mw, int kind) {
    return (mw->run % RUN_TAGS) * TAG_KINDS + kind;
}

/* What a wait is for, which decides its deadline. */
typedef enum wait_kind {
    WAIT_ARRIVAL, /* the descriptor exchange: timeout_ms after it started */
    WAIT_DATA,    /* a data step: timeout_ms without any request completing */
    WAIT_CONFIRM, /* confirm's second round: none (see confirm) */
} wait_kind;

/* ---- mpi_wait.c ---- */

/* "where: MPI_Comm_split failed: <MPI's text>"; `what` may be the call's text, of which the
 * function's name is kept. */
fsdp_status fsdp_mpi_fail(fsdp_ctx *ctx, int rc, const char *what, const char *where);
#define MPI_TRY(ctx, call, where)                                                                  \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) return fsdp_mpi_fail((ctx), mpi_rc_, #call, (where));          \
    } while (0)
/* Frees the notes whose sends have completed. */
void fsdp_mpi_reap_sends(mpi_world *mw);
/* Sends `note` to rank `dest` of comm without waiting for it. */
void fsdp_mpi_send_note(mpi_world *mw, MPI_Comm comm, int dest, int kind, const mpi_note *note);
/* The same for `len` bytes at data (copied). */
void fsdp_mpi_send_copy(mpi_world *mw, MPI_Comm comm, int dest, int kind, const void *data,
                        size_t len);
/* Answers the flight-recorder queries that have arrived (from a rank whose wait for this one
 * timed out). */
void fsdp_mpi_serve_trace(mpi_world *mw);
/* Drops the open requests, poisons the group (telling its members) and fails with msg. */
fsdp_status fsdp_mpi_fail_and_poison(fsdp_ctx *ctx, mpi_group *mg, fsdp_status status,
                                     const char *msg);
/* The same for the requests of rs instead of the group's. */
fsdp_status fsdp_mpi_fail_and_poison_set(fsdp_ctx *ctx, mpi_group *mg, mpi_reqs *rs,
                                         fsdp_status status, const char *msg);
/* Drops rs's open requests: receives are cancelled, sends left to finish on their own. */
void fsdp_mpi_abandon(mpi_reqs *rs);
/* Marks the group unusable and tells its members, so that they fail at once. */
void fsdp_mpi_poison(mpi_group *mg, fsdp_status status, const char *msg);
/* Receives the exit notes that have arrived: their ranks' results go into the world. */
void fsdp_mpi_receive_exit_notes(mpi_world *mw);
/* Posts a receive (recv) or send of `bytes` at buf with group member `member`, into the
 * group's requests (fsdp_mpi_post) or into rs. */
fsdp_status fsdp_mpi_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, bool recv, int member,
                          int kind, void *buf, size_t bytes);
fsdp_status fsdp_mpi_post_in(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                             bool recv, int member, int kind, void *buf, size_t bytes);
/* Between polls: spin, then yield, then sleep a little. */
void fsdp_mpi_back_off(int polls, double waited);

/* Waits until every posted request (of the group, or of rs) has completed, with the deadline
 * `kind` says. */
fsdp_status fsdp_mpi_wait_all(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, int op,
                              wait_kind kind);
fsdp_status fsdp_mpi_wait_set(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                              int op, wait_kind kind);
/* Whether every request of rs has completed, without waiting; a failure poisons the group. */
fsdp_status fsdp_mpi_test_set(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                              int op, bool *done);
/* Frees rs's arrays (its requests must be complete or abandoned). */
void fsdp_mpi_reqs_release(mpi_reqs *rs);
/* The descriptor exchange and judgement every call starts with. */
fsdp_status fsdp_mpi_arrive(fsdp_ctx *ctx, const fsdp_group *g, const fsdp_call *mine);
/* Its two halves, for a call that does not wait for its peers there (mpi_async.c): posting
 * this rank's descriptor to every member and the receives of theirs into descs (one per
 * member) through rs; and, once rs has completed, judging them (calls and call_ptrs: one per
 * member, call_ptrs[m] = &calls[m]). */
fsdp_status fsdp_mpi_arrive_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                                 mpi_desc *descs, const fsdp_call *mine);
fsdp_status fsdp_mpi_arrive_judge(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg,
                                  mpi_desc *descs, fsdp_call *calls, const fsdp_call **call_ptrs,
                                  int op);
/* The second round of a call that moves no data (barrier, split). */
fsdp_status fsdp_mpi_confirm(fsdp_ctx *ctx, const fsdp_group *g, int op);

/* ---- mpi_collectives.c: the backend's collectives ---- */

/* all_gather, reduce_scatter (with reduce_scatter_ex's options) or all_reduce (in place: out is
 * its tensor, in == out) as its data steps see it; the blocking call and the non-blocking one
 * (mpi_async.c) run the same steps, so their bits agree. */
typedef struct mpi_coll {
    int op; /* FSDP_COMM_ALL_GATHER, FSDP_COMM_REDUCE_SCATTER or FSDP_COMM_ALL_REDUCE */
    fsdp_tensor *out;
    const fsdp_tensor *in;
    int dim; /* all_gather, reduce_scatter */
    fsdp_reduce_op reduce;
    bool fused; /* the _ex options, applied where the reduction runs */
    fsdp_reduce_options fuse;
} mpi_coll;

/* The call its descriptor carries. */
fsdp_call fsdp_mpi_coll_call(const mpi_coll *c);
/* Its data steps (1 or 2), each a round of messages that must complete before the next posts. */
int fsdp_mpi_coll_steps(const mpi_coll *c);
/* The bytes of buffer its steps need (received and packed pieces). */
size_t fsdp_mpi_coll_scratch(const fsdp_group *g, const mpi_coll *c);
/* Posts data step `step` (1-based) into rs, messages of kind `kind`: buf has
 * fsdp_mpi_coll_scratch bytes; srcs (one per member) keeps where each member's piece of a
 * reduction lies between the steps and the finish. */
fsdp_status fsdp_mpi_coll_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                               const mpi_coll *c, int step, char *buf, const void **srcs, int kind);
/* After the last step has completed: all_gather unpacks, reduce_scatter reduces in rank order. */
void fsdp_mpi_coll_finish(const fsdp_group *g, const mpi_coll *c, const char *buf,
                          const void **srcs);
/* The blocking call (its caller, mpi_async.c, first completes the group's works:
 * fsdp_mpi_works_complete): arrival, then every step posted and waited for, then the finish. */
fsdp_status fsdp_mpi_coll_run(fsdp_ctx *ctx, fsdp_group *g, const mpi_coll *c);
/* ---- mpi_async.c: the collective entries, and the non-blocking calls ---- */

/* With a work, all_gather, reduce_scatter and all_reduce start the non-blocking call
 * (fsdp_mpi_coll_start); without one, the blocking call (fsdp_mpi_coll_run). */
fsdp_status fsdp_mpi_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                const fsdp_tensor *in, int dim, fsdp_comm_work *work);
fsdp_status fsdp_mpi_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                    const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                    const fsdp_reduce_options *fuse, fsdp_comm_work *work);
fsdp_status fsdp_mpi_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                                const fsdp_reduce_options *fuse, fsdp_comm_work *work);
/* Starts c on work, left pending. */
fsdp_status fsdp_mpi_coll_start(fsdp_ctx *ctx, fsdp_group *g, const mpi_coll *c,
                                fsdp_comm_work *work);
fsdp_status fsdp_mpi_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done);
fsdp_status fsdp_mpi_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work);
/* The group's state goes (a new run, or the world is freed): its works still pending are
 * abandoned and fail when waited for. */
void fsdp_mpi_works_detach(mpi_group *mg);
/* Waits for every pending work of the group to complete (a blocking all_gather,
 * reduce_scatter or all_reduce, whose data steps have the works' tags, before it arrives);
 * nothing when the group is poisoned (the call fails at its arrival, as before any call). A
 * failure of the group is returned; a disagreement fails its work alone. */
fsdp_status fsdp_mpi_works_complete(fsdp_ctx *ctx, mpi_group *mg);
/* Moves every work of the group on as far as what has completed allows, without waiting (the
 * communication thread's pass); a failure is recorded in the works it fails. */
fsdp_status fsdp_mpi_works_progress(fsdp_ctx *ctx, mpi_group *mg);

/* ---- mpi_collectives.c: the collectives that are blocking (a start completes them) ---- */

fsdp_status fsdp_mpi_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                               fsdp_comm_work *work);
fsdp_status fsdp_mpi_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                const fsdp_tensor *in, int split_dim, int concat_dim,
                                fsdp_comm_work *work);
fsdp_status fsdp_mpi_barrier(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_work *work);
void fsdp_mpi_reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op);

/* ---- mpi_lock.c: the process's MPI lock, below the rest of the backend ---- */

/* Around every backend entry (and a work's freeing); this thread may take it again inside. */
void fsdp_mpi_lock(void);
void fsdp_mpi_unlock(void);
/* fsdp_mpi_back_off for a wait: without the lock, if this thread holds it. */
void fsdp_mpi_pause(int polls, double waited);
/* A work was started: the thread, if idle, looks at once (under the lock). */
void fsdp_mpi_thread_wake(mpi_world *mw);
/* The communication thread's sleep: waits on cond until signalled or until, letting go of the
 * lock (which the caller holds once) meanwhile. */
void fsdp_mpi_lock_timedwait(pthread_cond_t *cond, const struct timespec *until);

/* ---- mpi_thread.c: the communication thread ---- */

/* Starts the thread (fsdp_world_options.comm_thread); stops and joins it (nothing when none). */
fsdp_status fsdp_mpi_thread_start(fsdp_ctx *ctx, mpi_world *mw);
void fsdp_mpi_thread_stop(mpi_world *mw);

#endif
