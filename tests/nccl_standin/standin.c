/* standin.c: a stand-in for the NCCL library, for tests on machines without GPUs: the functions
 * the nccl backend calls, with NCCL's semantics, over the simulated GPU's streams. A
 * communicator belongs to a clique (the ranks of one ncclCommInitRank id, or of one color of an
 * ncclCommSplit). A collective is enqueued on the caller's stream as a closure; when the stream
 * reaches it, the closure meets the other members' closures of the same sequence number, reads
 * their buffers, and writes its result after all have read (so in-place calls are safe), as a
 * kernel would. Sums are not in rank order: they start at a member that depends on the call and
 * round to the element type at every step, as a ring does, so tests must compare within a
 * bound. A group (ncclGroupStart/End) becomes one closure. ncclCommAbort releases every closure
 * waiting on the clique, whose members then report ncclRemoteError. Faults are injected through
 * fsdpStandinInject (standin.h).
 *
 * Cross-process mode (fsdpStandinCrossProcess, built with MPI): the ranks of a communicator are
 * the processes of an MPI job, one rank each (the world's rank r is MPI_COMM_WORLD's rank r).
 * ncclCommInitRank duplicates MPI_COMM_WORLD for the clique, ncclCommSplit splits the parent's
 * communicator; a closure sends its operations and its input bytes (read on the stream's thread
 * from the sim device's memory) to every member and receives theirs, then computes its result
 * as above. ncclCommAbort tells the other members, whose closures then end with ncclRemoteError.
 * The closures call MPI on the streams' threads while the host thread calls it too, so the
 * program must have initialised MPI with MPI_THREAD_MULTIPLE (ncclCommInitRank refuses
 * otherwise). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kernels/sim/sim_impl.h"
#include "standin.h"
#include "standin_impl.h"

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static clique *registry;
static atomic_ullong next_id = 1;
static atomic_int live_comms;

static struct {
    pthread_mutex_t mu;
    int nranks, rank;
    standin_fault fault;
} inject = {PTHREAD_MUTEX_INITIALIZER, 0, 0, STANDIN_FAULT_NONE};

/* The stand-in's marker (STANDIN_DEVICE_KIND_SYMBOL): opened through FSDP_NCCL_LIBRARY it
 * serves sim tensors and is named "stand-in NCCL" (src/comm/nccl_lib.c). */
extern const int fsdpStandinDeviceKind;
const int fsdpStandinDeviceKind = FSDP_DEVICE_SIM;

void fsdpStandinInject(int nranks, int rank, standin_fault fault);
int fsdpStandinLiveComms(void);
int fsdpStandinCrossProcess(int on);

static atomic_bool cross_process; /* ids made from now on are for processes */

int fsdpStandinCrossProcess(int on) {
#ifdef FSDP_STANDIN_MPI
    atomic_store(&cross_process, on != 0);
    return 1;
#else
    (void)on;
    return 0;
#endif
}

void fsdpStandinInject(int nranks, int rank, standin_fault fault) {
    pthread_mutex_lock(&inject.mu);
    inject.nranks = nranks;
    inject.rank = rank;
    inject.fault = fault;
    pthread_mutex_unlock(&inject.mu);
}

int fsdpStandinLiveComms(void) {
    return atomic_load(&live_comms);
}

static standin_fault take_fault(const struct ncclComm *c) {
    pthread_mutex_lock(&inject.mu);
    standin_fault f = STANDIN_FAULT_NONE;
    if (inject.fault && inject.fault != STANDIN_FAULT_NO_ID && inject.nranks == c->cl->n &&
        inject.rank == c->rank) {
        f = inject.fault;
        inject.fault = STANDIN_FAULT_NONE;
    }
    pthread_mutex_unlock(&inject.mu);
    return f;
}

/* ---- cliques and communicators ---- */

clique *clique_new(int n) {
    clique *cl = calloc(1, sizeof *cl);
    if (!cl) return NULL;
    pthread_mutex_init(&cl->mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&cl->cv, &a);
    pthread_condattr_destroy(&a);
    cl->n = n;
    return cl;
}

void clique_free(clique *cl) {
    pthread_mutex_lock(&registry_mu);
    for (clique **p = &registry; *p; p = &(*p)->next)
        if (*p == cl) {
            *p = cl->next;
            break;
        }
    pthread_mutex_unlock(&registry_mu);
    if (cl->mpi) xp_comm_free(cl->mpi);
    free(cl->mpi);
    while (cl->colls) {
        coll *c = cl->colls;
        cl->colls = c->next;
        free(c->ops);
        free(c->nops);
        free(c);
    }
    while (cl->splits) {
        split_rec *s = cl->splits;
        cl->splits = s->next;
        free(s->color);
        free(s->key);
        free(s->result);
        free(s);
    }
    pthread_mutex_destroy(&cl->mu);
    pthread_cond_destroy(&cl->cv);
    free(cl);
}

struct ncclComm *comm_new(clique *cl, int rank) {
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cl = cl;
    c->rank = rank;
    c->refs = 1;
    atomic_init(&c->async_error, ncclSuccess);
    cl->refs++;
    atomic_fetch_add(&live_comms, 1);
    return c;
}

/* Drops one reference (cl->mu held; released here). */
void comm_unref_unlock(struct ncclComm *c) {
    clique *cl = c->cl;
    bool free_cl = false;
    if (--c->refs == 0) {
        free(c);
        free_cl = --cl->refs == 0;
    }
    pthread_mutex_unlock(&cl->mu);
    if (free_cl) clique_free(cl);
}

/* Waits on the clique's condition until the deadline; false when it passed. */
static bool wait_until(clique *cl, const struct timespec *deadline) {
    return pthread_cond_timedwait(&cl->cv, &cl->mu, deadline) != ETIMEDOUT;
}

struct timespec deadline_in(int seconds) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += seconds;
    return t;
}

/* Cross-process mode (below the data). */

/* ---- the library's own functions ---- */

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclSystemError:
        return "unhandled system error (stand-in)";
    case ncclInvalidArgument:
        return "invalid argument (stand-in)";
    case ncclInvalidUsage:
        return "invalid usage (stand-in)";
    case ncclRemoteError:
        return "remote process exited or there was a network error (stand-in)";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code (stand-in)";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    pthread_mutex_lock(&inject.mu);
    const bool refuse = inject.fault == STANDIN_FAULT_NO_ID;
    if (refuse) inject.fault = STANDIN_FAULT_NONE;
    pthread_mutex_unlock(&inject.mu);
    if (refuse) return ncclSystemError;
    memset(id, 0, sizeof *id);
    /* The process's id and the mode tell ids made by different processes apart. */
    const uint64_t words[3] = {MAGIC, atomic_fetch_add(&next_id, 1),
                               (uint64_t)getpid() << 1 | (uint64_t)atomic_load(&cross_process)};
    memcpy(id->internal, words, sizeof words);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    uint64_t words[3];
    memcpy(words, id.internal, sizeof words);
    if (!out || words[0] != MAGIC || nranks < 1 || nranks > 256 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    if (words[2] & 1) return xp_init_rank(out, nranks, rank, words);
    if (words[2] >> 1 != (uint64_t)getpid()) return ncclInvalidUsage; /* another process's */
    pthread_mutex_lock(&registry_mu);
    clique *cl = registry;
    while (cl && cl->id != words[1]) cl = cl->next;
    if (!cl && (cl = clique_new(nranks)) != NULL) {
        cl->id = words[1];
        cl->next = registry;
        registry = cl;
    }
    if (cl) pthread_mutex_lock(&cl->mu);
    pthread_mutex_unlock(&registry_mu);
    if (!cl) return ncclSystemError;
    if (cl->n != nranks) {
        pthread_mutex_unlock(&cl->mu);
        return ncclInvalidUsage;
    }
    struct ncclComm *c = comm_new(cl, rank);
    if (!c) {
        pthread_mutex_unlock(&cl->mu);
        return ncclSystemError;
    }
    cl->joined++;
    pthread_cond_broadcast(&cl->cv);
    const struct timespec end = deadline_in(WAIT_LIMIT_S);
    bool ok = true;
    while (cl->joined < cl->n && ok) ok = wait_until(cl, &end);
    if (!ok) {
        comm_unref_unlock(c);
        atomic_fetch_sub(&live_comms, 1);
        return ncclSystemError;
    }
    pthread_mutex_unlock(&cl->mu);
    *out = c;
    return ncclSuccess;
}

/* The member that completes a split builds the new cliques: each color's members ordered by
 * (key, rank). */
static bool split_build(clique *cl, split_rec *s) {
    for (int m = 0; m < cl->n; m++) {
        if (s->color[m] < 0 || s->result[m]) continue;
        int n = 0;
        for (int q = 0; q < cl->n; q++) n += s->color[q] == s->color[m];
        clique *child = clique_new(n);
        if (!child) return false;
        child->joined = n;
        pthread_mutex_lock(&child->mu);
        for (int q = 0; q < cl->n; q++) {
            if (s->color[q] != s->color[m]) continue;
            int r = 0;
            for (int p = 0; p < cl->n; p++)
                r += s->color[p] == s->color[q] &&
                     (s->key[p] < s->key[q] || (s->key[p] == s->key[q] && p < q));
            s->result[q] = comm_new(child, r);
        }
        pthread_mutex_unlock(&child->mu);
    }
    return true;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *out,
                           ncclConfig_t *config) {
    (void)config;
    if (!comm || !out) return ncclInvalidArgument;
    clique *cl = comm->cl;
    if (cl->xp) return xp_split(comm, color, key, out);
    pthread_mutex_lock(&cl->mu);
    const uint64_t no = comm->splits++;
    split_rec *s = cl->splits;
    while (s && s->no != no) s = s->next;
    if (!s) {
        s = calloc(1, sizeof *s);
        if (s) {
            s->color = calloc((size_t)cl->n, sizeof *s->color);
            s->key = calloc((size_t)cl->n, sizeof *s->key);
            s->result = calloc((size_t)cl->n, sizeof *s->result);
        }
        if (!s || !s->color || !s->key || !s->result) {
            pthread_mutex_unlock(&cl->mu);
            return ncclSystemError;
        }
        s->no = no;
        s->next = cl->splits;
        cl->splits = s;
    }
    s->color[comm->rank] = color == NCCL_SPLIT_NOCOLOR ? -1 : color;
    s->key[comm->rank] = key;
    if (++s->posted == cl->n) {
        s->built = split_build(cl, s);
        pthread_cond_broadcast(&cl->cv);
    }
    const struct timespec end = deadline_in(WAIT_LIMIT_S);
    bool ok = true;
    while (s->posted < cl->n && ok && !cl->aborted) ok = wait_until(cl, &end);
    ncclResult_t r = s->posted == cl->n && s->built ? ncclSuccess : ncclSystemError;
    *out = r == ncclSuccess ? s->result[comm->rank] : NULL;
    if (++s->taken == cl->n) { /* unlink: every member has its result */
        for (split_rec **p = &cl->splits; *p; p = &(*p)->next)
            if (*p == s) {
                *p = s->next;
                break;
            }
        free(s->color);
        free(s->key);
        free(s->result);
        free(s);
    }
    pthread_mutex_unlock(&cl->mu);
    return r;
}

static ncclResult_t comm_release(ncclComm_t comm, bool abort) {
    if (!comm) return ncclInvalidArgument;
    clique *cl = comm->cl;
    if (abort && cl->xp) xp_tell_abort(cl, comm->rank);
    pthread_mutex_lock(&cl->mu);
    if (abort) {
        cl->aborted = true;
        pthread_cond_broadcast(&cl->cv);
    }
    atomic_fetch_sub(&live_comms, 1);
    comm_unref_unlock(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    return comm_release(comm, false);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    return comm_release(comm, true);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
    if (!comm || !error) return ncclInvalidArgument;
    *error = atomic_load(&comm->async_error);
    return ncclSuccess;
}

/* ---- the data: computed by the closures on the streams' threads ---- */

bool type_of(ncclDataType_t t, fsdp_dtype *out) {
    switch (t) {
    case ncclFloat32:
        *out = FSDP_DTYPE_F32;
        return true;
    case ncclBfloat16:
        *out = FSDP_DTYPE_BF16;
        return true;
    case ncclFloat16:
        *out = FSDP_DTYPE_F16;
        return true;
    case ncclInt32:
        *out = FSDP_DTYPE_I32;
        return true;
    default:
        return false;
    }
}

/* out (count elements) = the reduction of src[0..n) over the members, starting at member
 * `first` and going down: a sum rounds to the type at every step, as a ring's hops do. */
static void reduce(void *out, const void *const *src, int n, int first, size_t count, fsdp_dtype dt,
                   ncclRedOp_t red) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    const void *order[256];
    for (int i = 0; i < n; i++) order[i] = src[(first - i + n) % n];
    if (red == ncclSum) {
        const fsdp_reduce_n_args sum = {FSDP_REDUCE_KIND_SUM, 1.0f, 1.0f, false};
        memcpy(out, order[0], count * fsdp_dtype_size(dt));
        for (int i = 1; i < n; i++) {
            const void *pair[2] = {out, order[i]};
            k->reduce_n(out, pair, 2, (int64_t)count, dt, &sum);
        }
        return;
    }
    const fsdp_reduce_n_args args = {red == ncclAvg ? FSDP_REDUCE_KIND_AVG : FSDP_REDUCE_KIND_MAX,
                                     1.0f, 1.0f, false};
    k->reduce_n(out, order, n, (int64_t)count, dt, &args);
}

/* The bytes operation o reads from its send buffer. */
size_t send_bytes(const op *o, int n) {
    fsdp_dtype dt = FSDP_DTYPE_F32;
    (void)type_of(o->type, &dt);
    if (o->kind == K_RECV) return 0;
    return o->count * fsdp_dtype_size(dt) * (o->kind == K_REDUCE_SCATTER ? (size_t)n : 1);
}

/* What member m's i-th operation sends: in its device memory, or (cross-process) in data[m],
 * the inputs of its operations one after the other. */
static const void *source(const coll *c, const char *const *data, int n, int m, int i) {
    if (!data) return sim_shadow(c->ops[m][i].send);
    size_t off = 0;
    for (int j = 0; j < i; j++) off += send_bytes(&c->ops[m][j], n);
    return data[m] + off;
}

/* The result of member `me`'s operation o, into a new host buffer (*out; NULL for a send). */
ncclResult_t compute(const coll *c, const char *const *data, int n, int me, uint64_t seq,
                     const op *o, int nth, void **out) {
    *out = NULL;
    fsdp_dtype dt;
    if (!type_of(o->type, &dt)) return ncclInvalidArgument;
    const size_t es = fsdp_dtype_size(dt);
    if (o->kind == K_SEND) return ncclSuccess;
    size_t bytes = o->count * es * (o->kind == K_ALL_GATHER ? (size_t)n : 1);
    char *buf = malloc(bytes ? bytes : 1);
    if (!buf) return ncclSystemError;
    *out = buf;
    if (o->kind == K_RECV) { /* the nth receive from a peer matches its nth send to me */
        const op *peer = c->ops[o->peer];
        for (int i = 0, k = 0; i < c->nops[o->peer]; i++) {
            if (peer[i].kind != K_SEND || peer[i].peer != me || k++ != nth) continue;
            if (peer[i].count != o->count || peer[i].type != o->type) return ncclInvalidUsage;
            if (bytes) memcpy(buf, source(c, data, n, o->peer, i), bytes);
            return ncclSuccess;
        }
        return ncclInvalidUsage;
    }
    const void *src[256];
    for (int m = 0; m < n; m++) {
        const op *p = &c->ops[m][0];
        if (c->nops[m] != 1 || p->kind != o->kind || p->count != o->count || p->type != o->type ||
            p->red != o->red || p->peer != o->peer)
            return ncclInvalidUsage; /* the members disagree */
        src[m] = source(c, data, n, m, 0);
    }
    const int first = (int)((seq * 5 + 1) % (uint64_t)n);
    switch (o->kind) {
    case K_ALL_REDUCE:
        reduce(buf, src, n, first, o->count, dt, o->red);
        break;
    case K_REDUCE_SCATTER:
        for (int m = 0; m < n; m++) src[m] = (const char *)src[m] + (size_t)me * o->count * es;
        reduce(buf, src, n, first, o->count, dt, o->red);
        break;
    case K_ALL_GATHER:
        for (int m = 0; m < n; m++) memcpy(buf + (size_t)m * o->count * es, src[m], o->count * es);
        break;
    case K_BROADCAST:
        memcpy(buf, src[o->peer], bytes);
        break;
    default:
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

void fail(struct ncclComm *c, ncclResult_t r) {
    ncclResult_t none = ncclSuccess;
    atomic_compare_exchange_strong(&c->async_error, &none, r);
}

/* Waits (cl->mu held) until *count reaches n, or the clique is aborted, or the time is up. */
static ncclResult_t meet(clique *cl, const int *count, const struct timespec *end) {
    bool ok = true;
    while (*count < cl->n && !cl->aborted && ok) ok = wait_until(cl, end);
    return *count >= cl->n ? ncclSuccess : cl->aborted ? ncclRemoteError : ncclSystemError;
}

#ifndef FSDP_STANDIN_MPI /* standin_mpi.c has the cross-process mode */
ncclResult_t xp_init_rank(ncclComm_t *out, int nranks, int rank, const uint64_t *words) {
    (void)out, (void)nranks, (void)rank, (void)words;
    return ncclInvalidUsage;
}
ncclResult_t xp_split(ncclComm_t comm, int color, int key, ncclComm_t *out) {
    (void)comm, (void)color, (void)key, (void)out;
    return ncclInvalidUsage;
}
void xp_comm_free(void *mpi) {
    (void)mpi;
}
void xp_tell_abort(clique *cl, int me) {
    (void)cl, (void)me;
}
void xp_run(launch *a) {
    pthread_mutex_lock(&a->comm->cl->mu);
    fail(a->comm, ncclInvalidUsage);
    comm_unref_unlock(a->comm);
}
#endif

static void run(void *arg) {
    launch *a = arg;
    struct ncclComm *comm = a->comm;
    clique *cl = comm->cl;
    const int n = cl->n, me = comm->rank;
    const struct timespec end = deadline_in(WAIT_LIMIT_S);
    void *results[MAX_OPS] = {0};
    pthread_mutex_lock(&cl->mu);
    if (a->fault == STANDIN_FAULT_ASYNC_ERROR) fail(comm, ncclSystemError);
    if (a->fault == STANDIN_FAULT_HANG) {
        int never = 0;
        (void)meet(cl, &never, &end); /* until somebody aborts the clique */
        fail(comm, ncclRemoteError);
    }
    if (a->fault) {
        comm_unref_unlock(comm);
        return;
    }
    if (cl->xp) {
        pthread_mutex_unlock(&cl->mu);
        xp_run(a);
        return;
    }
    coll *c = cl->colls;
    while (c && c->seq != a->seq) c = c->next;
    if (!c && (c = calloc(1, sizeof *c)) != NULL) {
        c->ops = calloc((size_t)n, sizeof *c->ops);
        c->nops = calloc((size_t)n, sizeof *c->nops);
        c->seq = a->seq;
        c->next = cl->colls;
        cl->colls = c;
    }
    if (!c || !c->ops || !c->nops) { /* out of memory: the clique cannot go on */
        fail(comm, ncclSystemError);
        comm_unref_unlock(comm);
        return;
    }
    c->ops[me] = a->ops;
    c->nops[me] = a->nops;
    if (++c->arrived == n) pthread_cond_broadcast(&cl->cv);
    ncclResult_t r = meet(cl, &c->arrived, &end);
    pthread_mutex_unlock(&cl->mu);
    int nth_recv[256] = {0};
    for (int i = 0; i < a->nops && r == ncclSuccess; i++) {
        const op *o = &a->ops[i];
        r = compute(c, NULL, n, me, a->seq, o, o->kind == K_RECV ? nth_recv[o->peer]++ : 0,
                    &results[i]);
    }
    pthread_mutex_lock(&cl->mu);
    if (r != ncclSuccess) cl->aborted = true; /* the others must not wait for this member */
    if (++c->computed == n) pthread_cond_broadcast(&cl->cv);
    if (r == ncclSuccess) r = meet(cl, &c->computed, &end);
    pthread_mutex_unlock(&cl->mu);
    for (int i = 0; i < a->nops; i++) { /* nobody reads the inputs any more */
        const op *o = &a->ops[i];
        fsdp_dtype dt = FSDP_DTYPE_F32;
        (void)type_of(o->type, &dt);
        const size_t bytes =
            o->count * fsdp_dtype_size(dt) * (o->kind == K_ALL_GATHER ? (size_t)n : 1);
        if (r == ncclSuccess && results[i] && bytes) memcpy(sim_shadow(o->recv), results[i], bytes);
        free(results[i]);
    }
    pthread_mutex_lock(&cl->mu);
    if (r != ncclSuccess) fail(comm, r);
    if (++c->left == n) {
        for (coll **p = &cl->colls; *p; p = &(*p)->next)
            if (*p == c) {
                *p = c->next;
                break;
            }
        free(c->ops);
        free(c->nops);
        free(c);
    }
    comm_unref_unlock(comm);
}

/* ---- enqueueing: one closure per call, or per group ---- */

static _Thread_local struct {
    int depth;
    launch pending;
    cudaStream_t stream;
    bool bad;
} group;

static ncclResult_t flush(launch *l, cudaStream_t stream) {
    struct ncclComm *c = l->comm;
    pthread_mutex_lock(&c->cl->mu);
    c->refs++;
    l->seq = c->seq++;
    pthread_mutex_unlock(&c->cl->mu);
    l->fault = take_fault(c);
    sim_launch((sim_stream *)stream, run, l, sizeof *l);
    return ncclSuccess;
}

static ncclResult_t enqueue(const op *o, ncclComm_t comm, cudaStream_t stream) {
    fsdp_dtype dt;
    if (!comm || !stream || !type_of(o->type, &dt)) return ncclInvalidArgument;
    if (o->kind < K_SEND && (o->red < ncclSum || o->red > ncclAvg)) return ncclInvalidArgument;
    if ((o->kind >= K_BROADCAST) && (o->peer < 0 || o->peer >= comm->cl->n))
        return ncclInvalidArgument;
    if (group.depth == 0) {
        launch l = {.comm = comm, .nops = 1};
        l.ops[0] = *o;
        return flush(&l, stream);
    }
    if (group.pending.nops == MAX_OPS ||
        (group.pending.nops && (group.pending.comm != comm || group.stream != stream))) {
        group.bad = true; /* one communicator and stream per group, MAX_OPS operations */
        return ncclInvalidUsage;
    }
    group.pending.comm = comm;
    group.stream = stream;
    group.pending.ops[group.pending.nops++] = *o;
    return ncclSuccess;
}

/* nccl.h declares these two without a prototype. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void) {
    if (group.depth++ == 0) {
        memset(&group.pending, 0, sizeof group.pending);
        group.bad = false;
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group.depth == 0) return ncclInvalidUsage;
    if (--group.depth > 0) return ncclSuccess;
    if (group.bad) return ncclInvalidUsage;
    if (group.pending.nops == 0) return ncclSuccess;
    return flush(&group.pending, group.stream);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t red, ncclComm_t comm, cudaStream_t stream) {
    const op o = {K_ALL_REDUCE, send, recv, count, type, red, 0};
    return enqueue(&o, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t red, ncclComm_t comm, cudaStream_t stream) {
    const op o = {K_REDUCE_SCATTER, send, recv, count, type, red, 0};
    return enqueue(&o, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
    const op o = {K_ALL_GATHER, send, recv, count, type, ncclSum, 0};
    return enqueue(&o, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
    const op o = {K_BROADCAST, send, recv, count, type, ncclSum, root};
    return enqueue(&o, comm, stream);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    const op o = {K_SEND, send, NULL, count, type, ncclSum, peer};
    return enqueue(&o, comm, stream);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    const op o = {K_RECV, NULL, recv, count, type, ncclSum, peer};
    return enqueue(&o, comm, stream);
}
