/* nccl_impl.h: the state the files of the nccl backend share (nccl.c: the vtable and the
 * world; nccl_call.c: the groups and their communicators, one call's start and end, the works
 * and the deadline; nccl_collectives.c: the collectives on device tensors; mpi_nccl.c: the world
 * of one process per rank over the mpi backend). The backend runs over a host backend: the local
 * backend's rank threads, or the mpi backend's processes. The host backend judges every call (its
 * rendezvous or descriptor exchange, so a rank that skips or stops is named as there) and moves
 * host tensors; NCCL moves device tensors on each rank's communication stream. Internal to
 * src/comm. */
#ifndef FSDP_COMM_NCCL_IMPL_H
#define FSDP_COMM_NCCL_IMPL_H

#include "comm/local_impl.h"
#include "comm/nccl_lib.h"
#include "core/device.h" // defines: fsdp_device_i

typedef struct nccl_group nccl_group;

/* How the host backend takes part in a device call. hv is the host view of the group
 * (fsdp_nccl_host_view). */
typedef struct nccl_host_ops {
    /* Every member posts `mine` (a rejection, or the call it makes) and the calls are judged
     * together: the local rendezvous, or the mpi backend's descriptor exchange. */
    fsdp_status (*arrive)(fsdp_ctx *ctx, const fsdp_group *hv, const fsdp_call *mine);
    /* The group failed on this member: its peers fail at their next meeting. */
    void (*poison)(const fsdp_group *hv, fsdp_status status, const char *msg);
    /* The host backend frees the states of the groups split in a run when the next run starts
     * (mpi), so their NCCL groups go then too: a new state may reuse an old one's address. */
    bool groups_per_run;
} nccl_host_ops;

typedef struct nccl_world {
    fsdp_world *world;
    fsdp_comm_backend host; /* the host backend: judging, splits, host tensors */
    nccl_host_ops ops;
    const fsdp_nccl_lib *lib;
    /* The world communicator's: shared by the rank threads (local), or made by rank 0 and
     * broadcast over MPI (mpi). */
    ncclUniqueId id;
    nccl_group *world_group;
    pthread_mutex_t mu; /* guards groups */
    nccl_group *groups; /* every group state, newest first; freed with the world */
} nccl_world;

struct nccl_group {
    nccl_group *next;
    nccl_world *nw;
    void *host; /* its host backend's state (a local_group, or an mpi_group) */
    int size;
    /* Per member, written by that member only: its communicator (NULL before its first device
     * collective on the world group, and after an abort). */
    ncclComm_t *comms;
    /* Per member, written by that member only: its host view for the host backend's works,
     * which keep the group handle they were started with (fsdp_nccl_host_view_kept). */
    fsdp_group *views;
};

/* What one member's call on the device path holds from its start to its end. */
typedef struct nccl_call {
    fsdp_ctx *ctx;
    fsdp_group *g;
    nccl_group *ng;
    const fsdp_nccl_lib *lib;
    int op;
    ncclComm_t comm;
    fsdp_device dev;
    const fsdp_device_i *rec;
    fsdp_stream caller; /* the caller's current stream at entry */
    fsdp_stream comm_stream;
    fsdp_stream saved; /* the current stream while the call enqueues */
    fsdp_event ready;  /* on the caller's stream: the inputs are written */
    fsdp_event end;    /* on the communication stream: the call is complete */
    double deadline;   /* fsdp_clock_now() seconds */
} nccl_call;

/* ---- nccl_call.c ---- */

/* g's state on this backend. */
nccl_group *fsdp_nccl_group_of(const fsdp_group *g);
/* The group state over the host state `host` of a group of `size` members (made once, by
 * whichever member comes first). NULL: out of memory. */
nccl_group *fsdp_nccl_group_for(nccl_world *nw, void *host, int size);
/* Destroys the members' communicators and frees ng (the world's end). */
void fsdp_nccl_group_free(nccl_group *ng);
/* c's member's communicator on c->ng into c->comm: the world group's is made at its first use
 * (ncclCommInitRank); a split's was made by the split (ncclCommSplit); none after an abort is
 * an error. */
fsdp_status fsdp_nccl_member_comm(nccl_call *c);
/* The vtable's work entries: a work the nccl backend started, or the local backend's. */
fsdp_status fsdp_nccl_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done);
fsdp_status fsdp_nccl_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work);
fsdp_status fsdp_nccl_work_wait_stream(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream);
/* The host view of g: the same handle with the host backend's group state, for its entries. */
fsdp_group fsdp_nccl_host_view(const fsdp_group *g);
/* The same, kept in g's group state for the host backend's non-blocking calls, whose works
 * keep the handle (a later call of this member rewrites it with the same fields but the call
 * count, which a work takes at its start). */
fsdp_group *fsdp_nccl_host_view_kept(const fsdp_group *g);
/* Starts a device call: checks the device against the library's, posts `post` to the host
 * backend's judging (a rank that cannot take part posts a rejection), makes this member's
 * communicator, and makes the communication stream (current until fsdp_nccl_call_launched)
 * wait for the caller's stream. */
fsdp_status fsdp_nccl_call_begin(nccl_call *c, fsdp_ctx *ctx, fsdp_group *g, fsdp_device dev,
                                 const fsdp_call *post);
/* The NCCL calls are enqueued (st: how that went): restores the caller's stream and records
 * the end. */
fsdp_status fsdp_nccl_call_launched(nccl_call *c, fsdp_status st);
/* Completes a blocking call: polls its end against the deadline and the communicator's
 * asynchronous error (a failure aborts the communicator and poisons the group), then the
 * caller's stream waits for it. Frees the call's events. */
fsdp_status fsdp_nccl_call_finish(nccl_call *c);
/* Hands the call to a start's work instead (left pending: its wait polls the end). */
fsdp_status fsdp_nccl_call_to_work(nccl_call *c, fsdp_comm_work *work);
/* Fails the call after an NCCL function returned r (not ncclSuccess): names the library, the
 * call, the group and the rank. */
fsdp_status fsdp_nccl_fail(nccl_call *c, const char *what, ncclResult_t r);
/* NCCL's type for d. */
ncclDataType_t fsdp_nccl_dtype(fsdp_dtype d);

/* A test's negative control: while on, the communication stream does not wait for the caller's
 * stream before the NCCL calls, so they read inputs the caller's stream has not written yet.
 * Never on outside the tests. */
void fsdp_nccl_test_skip_ready_wait(bool on);

/* ---- nccl.c: the world ---- */

/* Puts the nccl backend over the host backend world->backend has (made by the caller; taken
 * over, freed with the nccl backend even on failure), with `ops`, library `lib` and the world
 * communicator's `id`. */
fsdp_status fsdp_nccl_backend_wrap(fsdp_ctx *ctx, fsdp_world *world, const nccl_host_ops *ops,
                                   const fsdp_nccl_lib *lib, const ncclUniqueId *id);
/* The message of a failed ncclGetUniqueId. */
fsdp_status fsdp_nccl_id_fail(fsdp_ctx *ctx, const fsdp_nccl_lib *lib, ncclResult_t r);

/* ---- nccl_collectives.c ---- */

/* work NULL: blocking (polled to its end); else a start, whose work holds the call. */
fsdp_status fsdp_nccl_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                 const fsdp_tensor *in, int dim, fsdp_comm_work *work);
fsdp_status fsdp_nccl_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                     const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                     const fsdp_reduce_options *fuse, fsdp_comm_work *work);
fsdp_status fsdp_nccl_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                                 const fsdp_reduce_options *fuse, fsdp_comm_work *work);
fsdp_status fsdp_nccl_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                                fsdp_comm_work *work);
fsdp_status fsdp_nccl_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                 const fsdp_tensor *in, int split_dim, int concat_dim,
                                 fsdp_comm_work *work);

#endif
