/* comm_impl.h: the bodies of fsdp_world, fsdp_group and fsdp_mesh, the backend vtable
 * (fsdp_comm_backend_i) and the per-rank binding a context carries while it runs inside
 * fsdp_world_run. Internal to src/comm. */
#ifndef FSDP_COMM_IMPL_H
#define FSDP_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/ctx_impl.h"
#include "fsdp/comm.h"
#include "kernels/kernels.h" // defines: fsdp_reduce_n_args

#define FSDP_GROUP_DESC_MAX 160

/* What a backend reports about one rank's membership of a group. */
typedef struct fsdp_group_info {
    void *state;      /* the backend's state of the group (shared or per rank) */
    int size;         /* members */
    int rank;         /* this rank's index */
    const int *ranks; /* world ranks of the members, in group order (copied by the caller) */
} fsdp_group_info;

/* A communication backend: one instance per world. Entries receive this rank's context and
 * its group handle (the backend's state is group->state, its world context is
 * group->world->backend.context). Collective entries run after collectives.c has validated
 * this rank's arguments (dims are normalised to 0..ndim-1) and counted the call; they check
 * what only the backend can see (other ranks' arguments), move the data and report timeouts.
 * Entries marked (optional) may be NULL. */
typedef struct fsdp_comm_backend_i {
    const char *name;
    fsdp_device_type device; /* whose tensors it moves */
    /* It also moves device tensors (every tensor of a call on the context's device, one device
     * kind on every rank), on the ranks' streams (docs/device.md). */
    bool moves_devices;

    /* The ranks this process hosts: [*first, *first + *count). */
    void (*hosted_ranks)(void *context, int *first, int *count);
    /* Rank `rank`'s membership of the group of all ranks. */
    void (*world_group)(void *context, int rank, fsdp_group_info *out);
    /* Collective over parent: ranks passing the same color >= 0 form a group ordered by
     * (key, parent rank); FSDP_GROUP_NO_COLOR gives out->state = NULL. `agree` (may be NULL)
     * is text every rank must pass identically (a mesh shape, a rank list). */
    fsdp_status (*split)(fsdp_ctx *ctx, fsdp_group *parent, int color, int key, const char *agree,
                         fsdp_group_info *out);
    /* (optional, backends whose ranks share memory) fsdp_group_share_shards: the shard is
     * checked (1-D, relocatable); *full is NULL until it succeeds. NULL: *full stays NULL. */
    fsdp_status (*share_shards)(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *shard,
                                fsdp_tensor **full);

    /* Every collective entry takes `work`: NULL for a blocking call; else the call is a start
     * (fsdp_*_start), on a work that collectives.c has readied (idle, its op, group, comm-debug
     * row and flight-recorder record set). An entry that leaves the call in flight sets
     * work->pending and keeps what work_test / work_wait need in work->state (the backend's,
     * kept from call to call: an entry that finds another backend's state there frees it by
     * work->free_state and sets its own free_state with it); one that completes the call at
     * once (its only form of the op, or a host tensor where only device calls are queued)
     * leaves work->pending false, and the start returns with the work complete. A failed start
     * leaves the work idle. */
    fsdp_status (*all_gather)(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out, const fsdp_tensor *in,
                              int dim, fsdp_comm_work *work);
    /* fuse (here and in the all_reduces): NULL, or the options of fsdp_reduce_scatter_ex /
     * fsdp_all_reduce_ex (f32, normalised: scales of 1 for 0), applied by
     * fsdp_reduce_run_fused. */
    fsdp_status (*reduce_scatter)(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                  const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                  const fsdp_reduce_options *fuse, fsdp_comm_work *work);
    fsdp_status (*all_reduce)(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                              const fsdp_reduce_options *fuse, fsdp_comm_work *work);
    fsdp_status (*broadcast)(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                             fsdp_comm_work *work);
    fsdp_status (*all_to_all)(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out, const fsdp_tensor *in,
                              int split_dim, int concat_dim, fsdp_comm_work *work);
    fsdp_status (*barrier)(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_work *work);
    /* The works the entries above left in flight: work_test advances one without blocking,
     * work_wait completes it; both report a failure once and leave the work done. (The local
     * backend's are device calls, whose work holds the call's completion event; the mpi
     * backend's are all_reduces on host tensors; the nccl backend's are NCCL calls.) */
    fsdp_status (*work_test)(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done);
    fsdp_status (*work_wait)(fsdp_ctx *ctx, fsdp_comm_work *work);
    /* (optional) Completes the work without a host wait where it can: work queued on `stream`
     * from now on runs after the call. NULL: work_wait. */
    fsdp_status (*work_wait_stream)(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream);

    /* (optional) This rank will not make collective `op` on g because its arguments were
     * invalid (the message is in ctx): let the peers fail at once naming this rank instead
     * of timing out. */
    void (*reject)(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op);
    /* (optional) Called before fsdp_world_run starts the ranks: forget earlier failures. */
    void (*reset)(void *context);
    /* (optional) Rank `rank` has returned from its function (its result is recorded in the
     * world): wake peers that wait for it. */
    void (*rank_exited)(void *context, int rank);
    /* (optional) After this process's ranks have returned: wait until the ranks other
     * processes host have returned too, and record their results in the world, with
     * failure_order across all ranks, so that every process reports the same outcome. ctx
     * (may be NULL) is fsdp_world_run's, for warnings while it waits. */
    void (*collect_results)(fsdp_ctx *ctx, void *context);
    /* (optional) Releases the context and every group state. */
    void (*free)(void *context);
} fsdp_comm_backend_i;

typedef struct fsdp_comm_backend {
    fsdp_comm_backend_i iface;
    void *context;
} fsdp_comm_backend;

/* How many calls a rank made on each of the groups its flight recorder (trace.c) holds calls
 * of, newest group first, at most FSDP_TRACE_GROUPS of them. Plain data: it travels as bytes. */
#define FSDP_TRACE_GROUPS 8
typedef struct fsdp_trace_counts {
    int32_t n, pad;
    uint64_t id[FSDP_TRACE_GROUPS];    /* fsdp_group.id */
    uint64_t calls[FSDP_TRACE_GROUPS]; /* the number of its newest call on that group */
} fsdp_trace_counts;

/* What one rank's function returned, kept for fsdp_world_run's answer and for peers that
 * wait for a rank that has gone. */
typedef struct fsdp_rank_result {
    atomic_bool exited; /* set (release) after the fields below are written */
    /* Its thread was left running by the run (world.c) and has not returned yet. */
    atomic_bool left_running;
    fsdp_status status;
    int failure_order; /* 1 for the first rank to fail in time, 2 for the next, ... */
    char message[FSDP_ERROR_MAX];
    char origin[FSDP_ORIGIN_MAX];
    char trail[FSDP_TRAIL_MAX];
    fsdp_trace_counts calls; /* its calls per group when it returned */
} fsdp_rank_result;

struct fsdp_world {
    fsdp_backend kind;
    fsdp_comm_backend backend;
    int size;
    int timeout_ms;
    int grace_ms;         /* after the first failure, how long a run waits for the other ranks */
    int threads_per_rank; /* fsdp_world_options.threads_per_rank */
    bool pin_threads;     /* fsdp_world_options.pin_threads */
    bool comm_thread;     /* fsdp_world_options.comm_thread or its environment variable (mpi) */
    int rank_threads;     /* threads of each hosted rank in the current run */
    int first_hosted;     /* the first rank this process hosts, in the current run */
    int pin_slot0;        /* its place among the ranks on this machine (pinning) */
    fsdp_ctx_options ctx_options;
    atomic_bool running;
    atomic_int failures;
    fsdp_rank_result *results; /* one per world rank */
    /* The run's rank threads, under run_mu: how many have not returned yet, and when
     * (CLOCK_MONOTONIC seconds) the first of them failed (0: none has) and which. run_cv is
     * signalled as each returns. */
    pthread_mutex_t run_mu;
    pthread_cond_t run_cv;
    int run_left;
    double first_failure_at;
    int first_failed; /* its rank */
    /* Rank threads left running by a run that ended without them (world.c): each holds a
     * reference to the world, so that the world outlives them; fsdp_world_free drops the
     * caller's. abandoned counts those that have not returned (under run_mu). */
    atomic_int refs;
    int abandoned;
    /* The flight recorders (trace.c) of the ranks this process hosts, indexed by world rank
     * (NULL for the others); cleared as each run starts. */
    struct fsdp_trace_ring **traces;
    char *trace_dir; /* fsdp_world_options.trace_dir, or its environment variable; NULL: none */
};

struct fsdp_group {
    fsdp_world *world;
    void *state; /* the backend's */
    int rank;
    int size;
    int *ranks;    /* world ranks, group order */
    bool borrowed; /* owned by a context or a mesh: fsdp_group_free leaves it alone */
    char label[FSDP_GROUP_LABEL_MAX];
    char desc[FSDP_GROUP_DESC_MAX]; /* "'tp' (world ranks 0,1)", for messages */
    /* The same on every member: the world group's is 1, a split's derives from its parent's
     * id, the split's call number on the parent and the color (the flight recorder tells
     * groups apart by it). */
    uint64_t id;
    uint64_t calls; /* collectives and splits this rank has made on the group */
};

/* A non-blocking call's handle (fsdp_comm_work_*, work.c). */
struct fsdp_comm_work {
    bool pending;      /* started and not yet complete */
    int op;            /* the call's fsdp_comm_op while pending */
    fsdp_group *group; /* its group while pending */
    int debug_row;     /* its comm-debug row and session (fsdp_comm_debug_last), -1: none */
    unsigned debug_session;
    uint64_t trace_seq; /* its flight-recorder record (trace.c) */
    void *state;        /* the backend's, kept from call to call */
    /* Frees state; a work still pending is abandoned first. */
    void (*free_state)(void *state);
};

/* One row of the comm-debug counters. */
typedef struct fsdp_comm_debug_row {
    fsdp_comm_op op;
    fsdp_comm_phase phase;
    char group[FSDP_GROUP_LABEL_MAX];
    char *module;
    fsdp_comm_count count;
    double seconds; /* in the backend's calls (fsdp_comm_debug_timed) */
} fsdp_comm_debug_row;

typedef struct fsdp_comm_debug {
    bool active;
    fsdp_comm_debug_row *rows;
    int n_rows;
    int64_t cap_rows;
    int last_row;     /* the row of the collective noted last, which fsdp_comm_debug_timed times */
    unsigned session; /* counts fsdp_comm_debug_begin calls: rows of an earlier one are gone */
} fsdp_comm_debug;

/* What ctx->comm points at while a rank runs. */
typedef struct fsdp_comm_binding {
    fsdp_world *world;
    fsdp_group *world_group;
    fsdp_comm_debug debug;
    struct fsdp_trace_ring *trace; /* world->traces[rank] */
} fsdp_comm_binding;

/* ctx's binding, or NULL when ctx runs outside fsdp_world_run. */
static inline fsdp_comm_binding *fsdp_comm_binding_of(const fsdp_ctx *ctx) {
    return ctx ? (fsdp_comm_binding *)ctx->comm : NULL;
}

/* group.c: a handle for this rank from a backend's membership info (copies info->ranks). */
fsdp_status fsdp_group_make(fsdp_ctx *ctx, fsdp_world *world, const fsdp_group_info *info,
                            const char *label, fsdp_group **out);
/* Frees a handle whatever its owner (fsdp_group_free skips borrowed ones). */
void fsdp_group_destroy(fsdp_group *g);
/* The parent of a split (NULL: ctx's world group), checked to be this rank's handle; `what`
 * names the caller in messages. */
fsdp_status fsdp_group_resolve_parent(fsdp_ctx *ctx, fsdp_group **parent, const char *what);
/* fsdp_group_split on a resolved parent, with `agree`: text every rank must pass
 * identically (the backend compares it where it can). */
fsdp_status fsdp_group_split_agreed(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                                    const char *label, const char *agree, fsdp_group **out);
/* Checks a label: non-empty, shorter than FSDP_GROUP_LABEL_MAX. */
fsdp_status fsdp_group_check_label(fsdp_ctx *ctx, const char *label, const char *what);

/* comm_debug.c: counts one call of g's collective `op` moving `bytes`, attributed to the
 * running module and phase of ctx; a no-op while counting is off. Fails only when a new row
 * cannot be allocated. */
fsdp_status fsdp_comm_debug_note(fsdp_ctx *ctx, const fsdp_group *g, fsdp_comm_op op,
                                 int64_t bytes);
void fsdp_comm_debug_release(fsdp_comm_debug *d);
/* The comm-debug phase of what ctx runs now. */
fsdp_comm_phase fsdp_comm_phase_of(const fsdp_ctx *ctx);
/* comm_debug.c: the timing of the collective just noted, around the backend's call: the clock
 * (CLOCK_MONOTONIC seconds) while counting is on, else 0 without reading it; then the seconds
 * since t0 added to that collective's row (nothing for t0 = 0). */
double fsdp_comm_debug_clock(const fsdp_ctx *ctx);
void fsdp_comm_debug_timed(fsdp_ctx *ctx, double t0);
/* For a non-blocking call, whose waits are timed after other calls were noted: the row of the
 * collective just noted and the counting session it belongs to (-1: counting is off); then the
 * seconds since t0 added to that row, unless counting has restarted since (or t0 = 0). */
int fsdp_comm_debug_last(const fsdp_ctx *ctx, unsigned *session);
void fsdp_comm_debug_timed_row(fsdp_ctx *ctx, int row, unsigned session, double t0);

/* The backends' constructors: each fills world->backend and sets world->size from
 * `nranks` (fsdp_world_options.nranks, already checked to be >= 0). */
/* local.c: the local backend (rank threads sharing memory): nranks threads, 0 meaning 1. */
fsdp_status fsdp_local_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks);
/* mpi_world.c (built with FSDP_HAVE_MPI): the MPI backend (one process per rank),
 * initialising MPI when nobody has; nranks must be 0 or the MPI world size. */
fsdp_status fsdp_mpi_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks);
/* nccl.c (built with FSDP_HAVE_NCCL): the nccl backend over nranks rank threads (0 meaning 1),
 * NCCL moving their device tensors. */
fsdp_status fsdp_nccl_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks);
/* mpi_nccl.c (built with both): the nccl backend with one process per rank over the mpi
 * backend; nranks as the mpi backend's. */
fsdp_status fsdp_nccl_mpi_backend_create(fsdp_ctx *ctx, fsdp_world *world, int nranks);

/* ---- call.c: what a rank asks of a group, compared across the ranks ---- */

#define FSDP_OP_SPLIT FSDP_COMM_OP_COUNT       /* a group split, beside the collectives */
#define FSDP_OP_SHARE (FSDP_COMM_OP_COUNT + 1) /* fsdp_group_share_shards */

/* One rank's call on a group. */
typedef struct fsdp_call {
    int op;                  /* fsdp_comm_op, or FSDP_OP_SPLIT */
    fsdp_status rejected;    /* not FSDP_OK: this rank's arguments were invalid... */
    const char *reject_msg;  /* ...and why */
    fsdp_dtype dtype;        /* the fields below must agree on every rank */
    fsdp_device_type device; /* the tensors' kind (CPU for calls without tensors) */
    int ndim;
    int64_t shape[FSDP_MAX_DIMS]; /* the global shape of the call */
    int dim, dim2, root;
    fsdp_reduce_op reduce;
    const char *agree; /* split: text every rank must pass identically (may be NULL) */
    int color, key;    /* split; these and the buffers need not agree */
    const fsdp_tensor *in;
    fsdp_tensor *out;
} fsdp_call;

/* "all_gather", ..., "group split" */
const char *fsdp_call_op_name(int op);
/* The calls of the collectives, with their global shape (all_gather: the output;
 * reduce_scatter: the input; all_reduce, broadcast: the tensor; all_to_all: the shape in and
 * out are chunks of, or their one shape when split_dim == concat_dim). Dims are normalised. */
fsdp_call fsdp_call_all_gather(fsdp_tensor *out, const fsdp_tensor *in, int dim);
fsdp_call fsdp_call_reduce_scatter(fsdp_tensor *out, const fsdp_tensor *in, int dim,
                                   fsdp_reduce_op op);
fsdp_call fsdp_call_all_reduce(fsdp_tensor *t, fsdp_reduce_op op);
fsdp_call fsdp_call_broadcast(fsdp_tensor *t, int root);
fsdp_call fsdp_call_all_to_all(fsdp_tensor *out, const fsdp_tensor *in, int split_dim,
                               int concat_dim);
/* Judges the calls of a group's n members (calls[i] is member i's, ranks[i] its world rank,
 * `mine` the judging member): the first rank that rejected its arguments, else the first
 * field the calls disagree on, in a fixed order. Returns FSDP_OK when they agree; otherwise
 * the status, with a message in msg naming the op, the group (group_desc) and, for a
 * disagreement, every rank's value. Every member judging the same calls gets the same
 * verdict. */
fsdp_status fsdp_call_judge(const fsdp_call *const *calls, int n, int mine, const int *ranks,
                            const char *group_desc, char *msg, size_t size);

/* ---- failure.c: the backends' failure messages ---- */

typedef enum fsdp_comm_failure_kind {
    FSDP_FAILURE_ARRIVAL,  /* members did not arrive by the deadline (missing: who) */
    FSDP_FAILURE_DATA,     /* a data step made no progress (missing: who sent nothing more) */
    FSDP_FAILURE_GONE,     /* a member's function returned without making the call */
    FSDP_FAILURE_POISONED, /* the group failed earlier */
} fsdp_comm_failure_kind;

/* What went wrong in a wait of `op` (fsdp_comm_op or FSDP_OP_SPLIT) on a group. */
typedef struct fsdp_comm_failure {
    fsdp_comm_failure_kind kind;
    int op;
    const char *group_desc; /* fsdp_group.desc */
    int timeout_ms;         /* ARRIVAL, DATA */
    int n_members;          /* ARRIVAL, DATA: the group's size, */
    const int *ranks;       /* its world ranks, */
    const bool *missing;    /* and per member whether it is missing (NULL: none) */
    /* DATA: `missing` are the members that have not taken this rank's data (its sends are all
     * that is left open), not those whose data has not come */
    bool unsent;
    int gone_rank;                /* GONE: the world rank that returned, */
    const fsdp_rank_result *gone; /* and its result */
    uint64_t group_id, group_seq; /* GONE: the group's id and this rank's call number on it */
    fsdp_status poison_status;    /* POISONED: the earlier failure */
    const char *poison_msg;
    /* ARRIVAL (may be NULL): what the missing members did instead (fsdp_trace_explain_rank),
     * in place of the general advice. */
    const char *forensics;
} fsdp_comm_failure;

/* How often a long wait logs whom it waits for: half the timeout, at least 1 s and at most
 * 10 s (a wait shorter than that logs nothing). */
static inline double fsdp_comm_log_every_s(int timeout_ms) {
    double s = 0.5e-3 * timeout_ms;
    return s < 1.0 ? 1.0 : s > 10.0 ? 10.0 : s;
}

/* What a long wait waits for: members to arrive, data from members (every member arrived), or
 * members to take this rank's data (every member arrived, and only its sends are open). */
typedef enum { FSDP_WAIT_LOG_ARRIVAL, FSDP_WAIT_LOG_DATA, FSDP_WAIT_LOG_UNSENT } fsdp_wait_log_kind;

/* Logs (a warning on ctx, under its rank) that a wait of `op` on a group has lasted waited_s:
 * the members it waits for (missing[m]; world ranks ranks[m]) and those that have arrived, as
 * `kind` says. forensics (may be NULL): what the missing members do instead
 * (fsdp_trace_forensics), appended. */
void fsdp_comm_wait_log(fsdp_ctx *ctx, int op, const char *group_desc, int n_members,
                        const int *ranks, const bool *missing, fsdp_wait_log_kind kind,
                        double waited_s, int timeout_ms, const char *forensics);

/* Writes the message of f into msg ("all_reduce on group 'world' (world ranks 0,1,2,3) timed
 * out after 100 ms: rank 3 did not arrive (arrived: 0,1,2). ..."); returns its status
 * (FSDP_ERR_TIMEOUT, FSDP_ERR_COMM, or the poisoning failure's). */
fsdp_status fsdp_comm_failure_format(const fsdp_comm_failure *f, char *msg, size_t size);
/* A call of `op` on group g, whose group an earlier failure poisoned (poison_status and
 * poison_msg, as the backend kept them): records that failure's message, named by this call,
 * in ctx and returns its status. Both backends fail this way. */
fsdp_status fsdp_comm_fail_poisoned(fsdp_ctx *ctx, const fsdp_group *g, int op,
                                    fsdp_status poison_status, const char *poison_msg);
/* "1,3,8-15": the members m < n with mask[m] == want, as world ranks (ranks[m]; ranks NULL: m
 * itself), a run of 4 or more consecutive ranks as "first-last"; when buf is too small, the
 * items that fit and ",..." (never part of a number). Returns how many members there are. */
int fsdp_comm_rank_list(const int *ranks, const bool *mask, int n, bool want, char *buf,
                        size_t size);

/* ---- trace.c: the flight recorder ---- */

#define FSDP_TRACE_DEPTH      64 /* calls each rank remembers */
#define FSDP_TRACE_MODULE_MAX 64
#define FSDP_TRACE_VIEW_MAX   6 /* records a rank shows a peer that waits for it */

enum {
    FSDP_TRACE_RUNNING = 1, /* inside the call */
    FSDP_TRACE_IN_FLIGHT,   /* a non-blocking call started, its work not complete */
    FSDP_TRACE_DONE,
    FSDP_TRACE_FAILED,
};

/* One call. In a view, t_start and t_end are seconds before the view was taken (t_end 0
 * while running); in the ring, CLOCK_MONOTONIC seconds. Plain data: it travels as bytes. */
typedef struct fsdp_trace_rec {
    uint64_t seq;       /* the rank's calls, from 1 */
    uint64_t group_id;  /* fsdp_group.id */
    uint64_t group_seq; /* the rank's calls on the group, from 1 */
    int32_t op;         /* fsdp_comm_op or FSDP_OP_SPLIT */
    int32_t state;      /* FSDP_TRACE_* */
    int32_t phase;      /* fsdp_comm_phase */
    int32_t dtype;      /* -1: not known (its arguments were not checked) */
    int32_t ndim, pad;
    int64_t shape[FSDP_MAX_DIMS]; /* the tensor the call is counted by in comm-debug */
    double t_start, t_end;
    char group[FSDP_GROUP_DESC_MAX];
    char module[FSDP_TRACE_MODULE_MAX];
} fsdp_trace_rec;

typedef struct fsdp_trace_ring {
    pthread_mutex_t mu; /* the owner writes, peers (local backend) read */
    uint64_t calls;     /* records written; call seq is at rec[(seq - 1) % FSDP_TRACE_DEPTH] */
    bool dumped;        /* written to the world's trace_dir in this run (owner only) */
    fsdp_trace_rec rec[FSDP_TRACE_DEPTH];
} fsdp_trace_ring;

/* What a rank shows a peer waiting for it on a group: its newest call on that group (rec[0],
 * when has_on_group), then the calls it made after it, oldest first: the first and the last
 * few, left_out of them omitted before rec[n_before_gap]. Plain data. */
typedef struct fsdp_trace_view {
    int32_t answered; /* 0: the rank did not answer (MPI: not waiting in a collective) */
    int32_t has_on_group;
    int32_t n, n_before_gap;
    uint64_t calls; /* the rank's calls in all */
    uint64_t left_out;
    fsdp_trace_rec rec[FSDP_TRACE_VIEW_MAX];
} fsdp_trace_view;

/* NULL when out of memory. */
fsdp_trace_ring *fsdp_trace_ring_new(void);
void fsdp_trace_ring_free(fsdp_trace_ring *ring);
void fsdp_trace_ring_clear(fsdp_trace_ring *ring);
/* A call of `op` on g starts: counts it on g (g->calls) and records it; returns its seq (0
 * when ctx records nothing), for the two below. */
uint64_t fsdp_trace_begin(fsdp_ctx *ctx, fsdp_group *g, int op);
/* The call's tensor, once its arguments have been checked. */
void fsdp_trace_describe(fsdp_ctx *ctx, uint64_t seq, const fsdp_tensor *t);
/* A non-blocking call's work is waited for: its record shows it running again. */
void fsdp_trace_waiting(fsdp_ctx *ctx, uint64_t seq);
/* The call returned st (in_flight: a non-blocking call that started). Returns st. */
fsdp_status fsdp_trace_end(fsdp_ctx *ctx, uint64_t seq, fsdp_status st, bool in_flight);
/* The calls per group the ring holds. */
void fsdp_trace_counts_of(fsdp_trace_ring *ring, fsdp_trace_counts *out);
/* The view of ring for a peer waiting on group `group_id`. */
void fsdp_trace_view_build(fsdp_trace_ring *ring, uint64_t group_id, fsdp_trace_view *v);
/* Appends to the text in buf what rank `rank`'s view v says about call #group_seq on the
 * group (group_desc) that it did not arrive at: where it diverged and where it is now.
 * asked_ms: how long an unanswered query waited. */
void fsdp_trace_explain_rank(char *buf, size_t size, int rank, uint64_t group_seq,
                             const char *group_desc, const fsdp_trace_view *v, int asked_ms);

/* The forensics of a timed-out arrival at call #group_seq on a group: for each member m
 * missing (at most FSDP_TRACE_EXPLAINED of them), what views[m] says it did instead. */
#define FSDP_TRACE_EXPLAINED 2
void fsdp_trace_forensics(char *buf, size_t size, uint64_t group_seq, const char *group_desc,
                          int n_members, const int *ranks, const bool *missing,
                          const fsdp_trace_view *views, int asked_ms);

/* box.c: the data movement of the backends, over contiguous row-major tensors. */
/* The runs of a box copy: `rows` runs of `bytes`, the i-th at byte offsets dst_off + i *
 * dst_pitch and src_off + i * src_pitch of the two tensors' data. */
typedef fsdp_status (*fsdp_box_run_fn)(void *user, size_t dst_off, size_t src_off, size_t bytes,
                                       size_t rows, size_t dst_pitch, size_t src_pitch);
/* Calls run for the runs that copy a box of `box` elements per dim from a tensor of shape
 * src_shape (box at src_at) into one of shape dst_shape (box at dst_at), all four arrays of
 * ndim entries: runs contiguous in both are joined, and the rows of the dim before them go in
 * one call. Stops at the first status that is not FSDP_OK and returns it. */
fsdp_status fsdp_box_runs(const int64_t *dst_shape, const int64_t *dst_at, const int64_t *src_shape,
                          const int64_t *src_at, const int64_t *box, int ndim, size_t esize,
                          fsdp_box_run_fn run, void *user);
/* fsdp_box_runs with memcpy on host memory: from src into dst; a run whose source is its
 * destination is skipped (in-place all_gather). */
void fsdp_box_copy(void *dst, const int64_t *dst_shape, const int64_t *dst_at, const void *src,
                   const int64_t *src_shape, const int64_t *src_at, const int64_t *box, int ndim,
                   size_t esize);
/* reduce_n's arguments for a collective's reduction (fuse: NULL, or checked options). */
fsdp_reduce_n_args fsdp_reduce_args(fsdp_reduce_op op, const fsdp_reduce_options *fuse);
/* dst[i] = reduce over r = 0..nsrc-1 (in that order) of srcs[r][offset + i], i < n, on host
 * memory (the CPU's reduce_n), computed in f32 and stored once in dtype. */
void fsdp_reduce_run(void *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                     fsdp_dtype dtype, fsdp_reduce_op op);
/* The same with fsdp_reduce_scatter_ex's options (f32, not MAX; NULL: fsdp_reduce_run): each
 * source element times fuse->pre_scale, the reduction, times fuse->post_scale, then stored or
 * (accumulate) added to dst, in the order the separate passes would run. */
void fsdp_reduce_run_fused(void *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                           fsdp_dtype dtype, fsdp_reduce_op op, const fsdp_reduce_options *fuse);

#endif
