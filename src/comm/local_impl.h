/* local_impl.h: the state the files of the local backend share (local_group.c: the group
 * states and their rendezvous; local.c: the host collectives and the world; local_device.c: the
 * collectives on device tensors). Internal to src/comm. */
#ifndef FSDP_COMM_LOCAL_IMPL_H
#define FSDP_COMM_LOCAL_IMPL_H

#include "comm/comm_impl.h"
#include "core/stream.h"

#define LOCAL_MAX_RANKS FSDP_LOCAL_MAX_RANKS

/* From this size up a host all_reduce works in place (three stages); below it through the
 * shared scratch (two stages: a rendezvous costs more than copying a small tensor twice). Every
 * rank takes the same way: the ranks agree on the shape. */
#define ALL_REDUCE_IN_PLACE_BYTES (256 * 1024)

/* The events a member of a group publishes for a device collective (local_device.c): READY on
 * its current stream at entry (its input is ready), S1 and S2 on its communication stream after
 * each stage of data movement (it has read and written what that stage moves), END when its
 * collective is complete on every member's side. Each is made on the member's device by the
 * member itself, and made again when its device changes. */
enum { LOCAL_EV_READY, LOCAL_EV_S1, LOCAL_EV_S2, LOCAL_EV_END, LOCAL_EV_COUNT };
typedef struct local_events {
    fsdp_event ev[LOCAL_EV_COUNT];
    struct local_retired_events *retired; /* made on devices the member left */
} local_events;

/* Events a member made on an earlier device: peers may still read their handles until the
 * group is freed, so they are kept until then. */
typedef struct local_retired_events {
    struct local_retired_events *next;
    local_events events;
} local_retired_events;

typedef struct local_group local_group;

typedef struct local_world {
    fsdp_world *world;
    int size;
    local_group *world_group;
    _Atomic(local_group *) groups; /* every group state, newest first; freed with the world */
} local_world;

struct local_group {
    local_world *lw;
    local_group *next;
    int size;
    int *ranks; /* world ranks of the members */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* The rendezvous, under mu. */
    uint64_t stage;          /* stages every member has completed */
    int waiting;             /* members in the current stage */
    uint64_t *entered;       /* per member: stages entered */
    const fsdp_call **calls; /* per member: its current call, on its stack */
    fsdp_status verdict;     /* the judgement of the current call */
    char verdict_msg[FSDP_ERROR_MAX];
    bool poisoned; /* a wait failed: the group is unusable */
    fsdp_status poison_status;
    char poison_msg[FSDP_ERROR_MAX];
    /* Set by the judge for the current call, read by every member. */
    const void **srcs;         /* per member: its input data */
    void *scratch;             /* all_reduce result */
    int64_t scratch_cap;       /* bytes */
    local_group **split_group; /* split: per member, its new group (NULL for no color) */
    int *split_rank;
    struct shared_block *share_block; /* fsdp_group_share_shards: the block being shared */
    /* Per member, its events for device collectives: made by the member before it posts a
     * call, their handles read by the others once every member has posted it. A member
     * records an event again only after a stage that its readers enter after waiting for it. */
    local_events *events;
};

/* ---- local_group.c ---- */

/* A new group state over `size` world ranks, added to the world's list. NULL when out of
 * memory. */
local_group *fsdp_local_group_new(local_world *lw, int size, const int *ranks);
/* Frees it, with its members' events. */
void fsdp_local_group_free(local_group *lg);

/* A block of shards (fsdp_group_share_shards), made by the judge: a count of the storages on
 * the block, then its data from SHARED_HEADER bytes on. Every member holds two (its relocated
 * shard and its full tensor); the last to let go frees it (fsdp_local_shared_release). */
typedef struct shared_block {
    atomic_int refs;
} shared_block;
#define SHARED_HEADER 64
void fsdp_local_shared_release(void *block);

/* Enters the next stage of g's rendezvous and waits for every member (each wait has the
 * world's deadline). The first stage of a call posts it (`post`); the last rank to post judges
 * the call, and every rank returns the verdict. */
fsdp_status fsdp_local_rendezvous(fsdp_ctx *ctx, const fsdp_group *g, int op,
                                  const fsdp_call *post);

/* Poisons g's group state with a failure of this member (status, msg): every member fails at
 * its next meeting, naming it. */
void fsdp_local_poison(const fsdp_group *g, fsdp_status status, const char *msg);

/* ---- local_device.c: the collectives on device tensors (semantics in docs/device.md) ---- */

/* Whether a call with tensor t goes to the device path (t is not on the CPU). */
static inline bool fsdp_local_on_device(const fsdp_tensor *t) {
    return fsdp_tensor_device(t).type != FSDP_DEVICE_CPU;
}

/* work NULL: a blocking call (the caller's current stream waits for it); else the call's
 * completion event goes to the work (left pending), which the caller waits for. */
fsdp_status fsdp_local_device_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                         const fsdp_tensor *in, int dim, fsdp_comm_work *work);
fsdp_status fsdp_local_device_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                             const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                             const fsdp_reduce_options *fuse, fsdp_comm_work *work);
fsdp_status fsdp_local_device_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t,
                                         fsdp_reduce_op op, const fsdp_reduce_options *fuse,
                                         fsdp_comm_work *work);
fsdp_status fsdp_local_device_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                                        fsdp_comm_work *work);
fsdp_status fsdp_local_device_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                         const fsdp_tensor *in, int split_dim, int concat_dim,
                                         fsdp_comm_work *work);
/* The work entries of the local backend: a work of a device call completes when its event
 * does. */
fsdp_status fsdp_local_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done);
fsdp_status fsdp_local_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work);
fsdp_status fsdp_local_work_wait_stream(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream);
/* A test's negative control: while on, a device collective does not make its communication
 * stream wait for the peers' READY events (only its own), so it reads inputs their streams
 * have not written yet. Never on outside the tests. */
void fsdp_local_test_skip_input_wait(bool on);

#endif
