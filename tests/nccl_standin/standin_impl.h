/* standin_impl.h: what the two files of the stand-in NCCL share (standin.c: the library's
 * functions and the in-process cliques; standin_mpi.c: the cross-process mode): the
 * communicators, cliques and closures, and the helpers both use. Internal to the stand-in
 * (hidden in the module). */
#ifndef FSDP_NCCL_STANDIN_IMPL_H
#define FSDP_NCCL_STANDIN_IMPL_H

#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "fsdp/tensor.h" // defines: fsdp_dtype
#include "standin.h"

#pragma GCC visibility push(hidden)

#define MAGIC        0x5354414e44494e31ull
#define WAIT_LIMIT_S 120 /* a closure gives up (ncclSystemError) after this long */
#define MAX_OPS      64  /* operations in one group */

enum { K_ALL_REDUCE, K_REDUCE_SCATTER, K_ALL_GATHER, K_BROADCAST, K_SEND, K_RECV };

typedef struct op {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t red;
    int peer; /* root of a broadcast, peer of a send or receive */
} op;

typedef struct coll { /* one sequence number's meeting */
    struct coll *next;
    uint64_t seq;
    int arrived, computed, left;
    const op **ops; /* per member: its operations */
    int *nops;
} coll;

typedef struct split_rec {
    struct split_rec *next;
    uint64_t no;
    int posted, taken;
    bool built;
    int *color, *key;
    struct ncclComm **result;
} split_rec;

typedef struct clique {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct clique *next; /* in the registry (made by ncclCommInitRank) */
    uint64_t id;
    int n, joined, refs; /* refs: communicators not yet freed */
    bool aborted;
    bool xp;   /* cross-process: the members are MPI processes */
    void *mpi; /* cross-process: the clique's MPI communicator (an MPI_Comm, malloc'd) */
    coll *colls;
    split_rec *splits;
} clique;

struct ncclComm {
    clique *cl;
    int rank;
    uint64_t seq, splits; /* collectives and splits enqueued (owner thread) */
    _Atomic ncclResult_t async_error;
    int refs; /* under cl->mu: the owner until destroy or abort, plus closures not yet run */
};

/* A closure's arguments (copied at launch). */
typedef struct launch {
    struct ncclComm *comm;
    uint64_t seq;
    standin_fault fault;
    int nops;
    op ops[MAX_OPS];
} launch;

clique *clique_new(int n);
/* Unlinks cl from the registry and frees it (its MPI communicator too). */
void clique_free(clique *cl);
/* A communicator of rank `rank` in cl (cl->mu held). NULL: out of memory. */
struct ncclComm *comm_new(clique *cl, int rank);
/* Drops one reference (cl->mu held; released here). */
void comm_unref_unlock(struct ncclComm *c);
/* CLOCK_MONOTONIC now + seconds. */
struct timespec deadline_in(int seconds);
bool type_of(ncclDataType_t t, fsdp_dtype *out);
/* The bytes operation o reads from its send buffer (n members). */
size_t send_bytes(const op *o, int n);
/* The result of member `me`'s operation o into a new host buffer (*out; NULL for a send),
 * from the members' inputs in their device memory (data NULL) or in data[m]. */
ncclResult_t compute(const coll *c, const char *const *data, int n, int me, uint64_t seq,
                     const op *o, int nth, void **out);
/* Sets c's asynchronous error unless one is set. */
void fail(struct ncclComm *c, ncclResult_t r);

/* ---- standin_mpi.c (stubs refusing in builds without MPI) ---- */

/* ncclCommInitRank for an id made for processes (words: the id's). */
ncclResult_t xp_init_rank(ncclComm_t *out, int nranks, int rank, const uint64_t *words);
ncclResult_t xp_split(ncclComm_t comm, int color, int key, ncclComm_t *out);
/* Frees a clique's MPI communicator (clique.mpi). */
void xp_comm_free(void *mpi);
/* ncclCommAbort of member `me`: tells the other members. */
void xp_tell_abort(clique *cl, int me);
/* A closure (cl->mu not held) whose members are processes. */
void xp_run(launch *a);

#pragma GCC visibility pop

#endif
