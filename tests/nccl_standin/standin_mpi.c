/* standin_mpi.c: the stand-in NCCL's cross-process mode (built with MPI): the members of a
 * communicator are the processes of an MPI job, and a closure exchanges its operations and inputs
 * with them over MPI from its stream's thread (standin.c says how; docs/comm.md). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/sim/sim_impl.h" // defines: sim_shadow
#include "standin_impl.h"

enum { TAG_ABORT = 0 }; /* then two tags per sequence number: the operations, the inputs */

typedef struct wire_op {
    int32_t kind, type, red, peer;
    uint64_t count;
} wire_op;

typedef struct wire { /* a member's operations as they travel */
    int32_t nops, pad;
    wire_op ops[MAX_OPS];
} wire;

static ncclResult_t xp_refuse(const char *why) {
    fprintf(stderr, "stand-in NCCL WARN %s\n", why);
    return ncclInvalidUsage;
}

static bool past(const struct timespec *end) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > end->tv_sec || (now.tv_sec == end->tv_sec && now.tv_nsec >= end->tv_nsec);
}

static void nap(void) {
    const struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

/* A set-up request of the host thread (a duplicate, an exchange of ids), until the deadline. */
static bool xp_wait_setup(MPI_Request *req) {
    const struct timespec end = deadline_in(WAIT_LIMIT_S);
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
        if (done) return true;
        if (past(&end)) return false; /* a member never came; the request is left to MPI */
        nap();
    }
}

/* A communicator of the clique over comm (taken over), this process its rank in comm. */
static ncclResult_t xp_clique(MPI_Comm comm, ncclComm_t *out) {
    int n = 0, r = 0;
    MPI_Comm_size(comm, &n);
    MPI_Comm_rank(comm, &r);
    clique *cl = n <= 256 ? clique_new(n) : NULL;
    MPI_Comm *held = malloc(sizeof *held);
    if (!cl || !held) {
        free(held);
        if (cl) clique_free(cl);
        MPI_Comm_free(&comm);
        return ncclSystemError;
    }
    *held = comm;
    cl->mpi = held;
    cl->xp = true;
    cl->joined = n;
    pthread_mutex_lock(&cl->mu);
    struct ncclComm *c = comm_new(cl, r);
    pthread_mutex_unlock(&cl->mu);
    if (!c) {
        clique_free(cl);
        return ncclSystemError;
    }
    *out = c;
    return ncclSuccess;
}

ncclResult_t xp_init_rank(ncclComm_t *out, int nranks, int rank, const uint64_t *words) {
    int init = 0, level = 0, size = 0, me = -1;
    MPI_Initialized(&init);
    if (!init) return xp_refuse("cross-process mode: MPI is not initialised");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return xp_refuse("cross-process mode needs MPI initialised with MPI_THREAD_MULTIPLE (the "
                         "closures call MPI on the streams' threads)");
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (nranks != size || rank != me)
        return xp_refuse("cross-process mode: ncclCommInitRank's nranks and rank must be "
                         "MPI_COMM_WORLD's size and this process's rank");
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Request req;
    if (MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req) != MPI_SUCCESS) return ncclSystemError;
    if (!xp_wait_setup(&req)) return ncclSystemError;
    /* Every member must pass the same id, as NCCL requires: the one rank 0 made. */
    uint64_t mine[2] = {words[1], words[2]}, *all = calloc((size_t)size * 2, sizeof *all);
    bool same = all && MPI_Iallgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, comm, &req) ==
                           MPI_SUCCESS;
    same = same && xp_wait_setup(&req);
    for (int m = 0; same && m < size; m++)
        same = all[2 * m] == mine[0] && all[2 * m + 1] == mine[1];
    free(all);
    if (!same) {
        MPI_Comm_free(&comm);
        return xp_refuse("cross-process mode: the members of ncclCommInitRank passed different "
                         "unique ids (every rank must use the id rank 0 made)");
    }
    return xp_clique(comm, out);
}

ncclResult_t xp_split(ncclComm_t comm, int color, int key, ncclComm_t *out) {
    MPI_Comm child = MPI_COMM_NULL;
    *out = NULL;
    if (MPI_Comm_split(*(MPI_Comm *)comm->cl->mpi,
                       color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key,
                       &child) != MPI_SUCCESS)
        return ncclSystemError;
    return child == MPI_COMM_NULL ? ncclSuccess : xp_clique(child, out);
}

void xp_comm_free(void *mpi) {
    MPI_Comm_free((MPI_Comm *)mpi);
}

void xp_tell_abort(clique *cl, int me) {
    static const int note = 1;
    for (int m = 0; m < cl->n; m++) {
        MPI_Request req;
        if (m != me &&
            MPI_Isend(&note, 1, MPI_INT, m, TAG_ABORT, *(MPI_Comm *)cl->mpi, &req) == MPI_SUCCESS)
            MPI_Request_free(&req);
    }
}

/* Sends of failed closures still in flight, with the buffers they read: freed once MPI has
 * finished them (looked at as each closure starts), else kept to the end of the process. */
typedef struct parked {
    struct parked *next;
    MPI_Request *req;
    int nreq;
    void *bufs[2];
} parked;
static pthread_mutex_t parked_mu = PTHREAD_MUTEX_INITIALIZER;
static parked *parked_sends;

static void park(MPI_Request *req, int nreq, void *a, void *b) {
    parked *p = malloc(sizeof *p);
    if (!p) return; /* the buffers stay allocated: MPI may still read them */
    *p = (parked){.req = req, .nreq = nreq, .bufs = {a, b}};
    pthread_mutex_lock(&parked_mu);
    p->next = parked_sends;
    parked_sends = p;
    pthread_mutex_unlock(&parked_mu);
}

static void reap_parked(void) {
    pthread_mutex_lock(&parked_mu);
    for (parked **at = &parked_sends; *at;) {
        parked *p = *at;
        int done = 0;
        MPI_Testall(p->nreq, p->req, &done, MPI_STATUSES_IGNORE);
        if (!done) {
            at = &p->next;
            continue;
        }
        *at = p->next;
        free(p->req), free(p->bufs[0]), free(p->bufs[1]), free(p);
    }
    pthread_mutex_unlock(&parked_mu);
}

/* Waits for the requests, as long as the clique is not aborted (here or by a member's note)
 * and the time is not up. On failure the receives are cancelled and the sends left in req;
 * *keep is set when one has not completed (it and its buffers are then parked). */
static ncclResult_t xp_wait(clique *cl, MPI_Request *req, const bool *recv, int nreq,
                            const struct timespec *end, bool *keep) {
    MPI_Comm mc = *(MPI_Comm *)cl->mpi;
    ncclResult_t r = ncclSystemError;
    for (;;) {
        int done = 0, note = 0;
        if (MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
        if (done) return ncclSuccess;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_ABORT, mc, &note, MPI_STATUS_IGNORE);
        pthread_mutex_lock(&cl->mu);
        if (note) cl->aborted = true;
        const bool aborted = cl->aborted;
        pthread_mutex_unlock(&cl->mu);
        if (aborted) {
            r = ncclRemoteError;
            break;
        }
        if (past(end)) break;
        nap();
    }
    for (int i = 0; i < nreq; i++) {
        if (req[i] == MPI_REQUEST_NULL) continue;
        if (recv[i]) {
            MPI_Cancel(&req[i]);
            MPI_Wait(&req[i], MPI_STATUS_IGNORE);
        } else {
            int sent = 0;
            MPI_Test(&req[i], &sent, MPI_STATUS_IGNORE);
            *keep = *keep || !sent;
        }
    }
    return r;
}

/* One closure across the processes: every member's operations, then their inputs, to every
 * member; then this member's results. */
void xp_run(launch *a) {
    struct ncclComm *comm = a->comm;
    clique *cl = comm->cl;
    const int n = cl->n, me = comm->rank, tag = 1 + (int)(a->seq % 10000) * 2;
    const MPI_Comm mc = *(MPI_Comm *)cl->mpi;
    const struct timespec end = deadline_in(WAIT_LIMIT_S);
    reap_parked();
    wire *w = calloc((size_t)n, sizeof *w);
    op *ops = calloc((size_t)n * MAX_OPS, sizeof *ops);
    const op **opp = calloc((size_t)n, sizeof *opp);
    int *nops = calloc((size_t)n, sizeof *nops);
    char **data = calloc((size_t)n, sizeof *data);
    MPI_Request *req = calloc((size_t)n * 2, sizeof *req);
    bool *recv = calloc((size_t)n * 2, sizeof *recv), keep = false;
    void *results[MAX_OPS] = {0};
    ncclResult_t r = w && ops && opp && nops && data && req && recv ? ncclSuccess : ncclSystemError;
    size_t mine = 0;
    for (int i = 0; i < a->nops && r == ncclSuccess; i++) {
        const op *o = &a->ops[i];
        w[me].ops[i] = (wire_op){o->kind, (int32_t)o->type, (int32_t)o->red, o->peer, o->count};
        mine += send_bytes(o, n);
    }
    if (r == ncclSuccess) w[me].nops = a->nops;
    if (r == ncclSuccess && !(data[me] = malloc(mine ? mine : 1))) r = ncclSystemError;
    for (int i = 0, off = 0; i < a->nops && r == ncclSuccess; i++) {
        const size_t b = send_bytes(&a->ops[i], n);
        if (b) memcpy(data[me] + off, sim_shadow(a->ops[i].send), b);
        off += (int)b;
    }
    int nreq = 0;
    for (int m = 0; m < n && r == ncclSuccess; m++) {
        if (m == me) continue;
        recv[nreq] = true;
        MPI_Irecv(&w[m], (int)sizeof *w, MPI_BYTE, m, tag, mc, &req[nreq++]);
        recv[nreq] = false;
        MPI_Isend(&w[me], (int)sizeof *w, MPI_BYTE, m, tag, mc, &req[nreq++]);
    }
    if (r == ncclSuccess) r = xp_wait(cl, req, recv, nreq, &end, &keep);
    if (r == ncclSuccess) nreq = 0; /* else req keeps the sends still in flight */
    for (int m = 0; m < n && r == ncclSuccess; m++) {
        opp[m] = &ops[(size_t)m * MAX_OPS];
        nops[m] = w[m].nops;
        if (nops[m] < 0 || nops[m] > MAX_OPS) r = ncclInvalidUsage;
        size_t bytes = 0;
        for (int i = 0; i < nops[m] && r == ncclSuccess; i++) {
            const wire_op *x = &w[m].ops[i];
            ops[(size_t)m * MAX_OPS + i] =
                (op){x->kind, NULL, NULL, x->count, (ncclDataType_t)x->type, (ncclRedOp_t)x->red,
                     x->peer};
            bytes += send_bytes(&ops[(size_t)m * MAX_OPS + i], n);
        }
        if (m == me || r != ncclSuccess) continue;
        if (bytes > (size_t)INT32_MAX || !(data[m] = malloc(bytes ? bytes : 1))) {
            r = ncclSystemError;
            break;
        }
        recv[nreq] = true;
        MPI_Irecv(data[m], (int)bytes, MPI_BYTE, m, tag + 1, mc, &req[nreq++]);
        recv[nreq] = false;
        MPI_Isend(data[me], (int)mine, MPI_BYTE, m, tag + 1, mc, &req[nreq++]);
    }
    if (r == ncclSuccess) r = xp_wait(cl, req, recv, nreq, &end, &keep);
    const coll c = {.ops = opp, .nops = nops};
    int nth_recv[256] = {0};
    for (int i = 0; i < a->nops && r == ncclSuccess; i++) {
        const op *o = &a->ops[i];
        r = compute(&c, (const char *const *)data, n, me, a->seq, o,
                    o->kind == K_RECV ? nth_recv[o->peer]++ : 0, &results[i]);
    }
    for (int i = 0; i < a->nops; i++) {
        const op *o = &a->ops[i];
        fsdp_dtype dt = FSDP_DTYPE_F32;
        (void)type_of(o->type, &dt);
        const size_t bytes =
            o->count * fsdp_dtype_size(dt) * (o->kind == K_ALL_GATHER ? (size_t)n : 1);
        if (r == ncclSuccess && results[i] && bytes) memcpy(sim_shadow(o->recv), results[i], bytes);
        free(results[i]);
    }
    for (int m = 0; data && m < n; m++)
        if (m != me || !keep) free(data[m]);
    if (keep) {
        park(req, nreq, w, data[me]);
    } else {
        free(w), free(req);
    }
    free(ops), free(opp), free(nops), free(data), free(recv);
    pthread_mutex_lock(&cl->mu);
    if (r != ncclSuccess) fail(comm, r);
    comm_unref_unlock(comm);
}
