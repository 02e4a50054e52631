/* comm.h: the communication layer: a world of ranks, process groups, collectives on f32, bf16
 * and f16 tensors, the N-d device mesh, and the comm-debug counters every collective passes.
 *
 * A world is created once per process and runs one function per rank (fsdp_world_run); each
 * rank gets its own fsdp_ctx bound to the world, and every call below takes that context.
 * Backends: `local` (the ranks are threads of this process sharing memory, also on devices; the
 * embedded default) is always built; `mpi` (one process per rank under mpirun, CPU tensors) is
 * built when CMake finds an MPI (fsdp_backend_available tells); `nccl` (rank threads of this
 * process, one GPU each, NCCL moving their device tensors; host tensors move as on `local`) is
 * built with CUDA when CMake finds NCCL; `nccl-mpi` (one process per rank and GPU under mpirun,
 * NCCL moving device tensors, host tensors as on `mpi`) when both are. `local` and `mpi` give
 * bitwise the same results; NCCL's reductions are not in rank order, so on `nccl` they agree within
 * rounding (docs/comm.md).
 *
 * Ownership: the caller owns a world (fsdp_world_free), groups made by fsdp_group_split and
 * fsdp_group_new (fsdp_group_free) and meshes (fsdp_mesh_free). Handles returned by accessors
 * (the world group of a context, a mesh's groups and sub-meshes) are borrowed: they belong to
 * the context or mesh they came from. A group or mesh handle belongs to the rank that made it
 * and is used only on that rank's context, inside its fsdp_world_run function. */
#ifndef FSDP_COMM_H
#define FSDP_COMM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fsdp/ctx.h"
#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_world fsdp_world;
typedef struct fsdp_group fsdp_group;
typedef struct fsdp_mesh fsdp_mesh;

/* ---- world ---- */

typedef enum fsdp_backend {
    FSDP_BACKEND_LOCAL = 0, /* ranks are threads of this process; CPU and device tensors */
    FSDP_BACKEND_MPI,       /* one process per rank under mpirun; CPU tensors */
    FSDP_BACKEND_NCCL,      /* rank threads of this process, NCCL on their GPUs (docs/comm.md) */
    /* one process per rank (one GPU each) under mpirun: NCCL moves device tensors, MPI host
     * tensors and the world's unique id (docs/comm.md) */
    FSDP_BACKEND_NCCL_MPI,
    FSDP_BACKEND_COUNT
} fsdp_backend;

#define FSDP_COMM_DEFAULT_TIMEOUT_MS 300000 /* 5 minutes */
/* The environment variable that sets the grace period (milliseconds) of worlds whose options
 * leave grace_ms 0; without it the grace period is timeout_ms, but at least
 * FSDP_COMM_MIN_DEFAULT_GRACE_MS. */
#define FSDP_COMM_GRACE_ENV            "FSDP_COMM_GRACE_MS"
#define FSDP_COMM_MIN_DEFAULT_GRACE_MS 10000 /* 10 s */
/* The environment variable naming the directory of flight-recorder dumps for worlds whose
 * options leave trace_dir NULL (see fsdp_world_options.trace_dir). */
#define FSDP_COMM_TRACE_DIR_ENV "FSDP_COMM_TRACE_DIR"
/* The environment variable that turns the mpi backend's communication thread on for worlds
 * whose options leave comm_thread false (see fsdp_world_options.comm_thread): "1". */
#define FSDP_COMM_THREAD_ENV      "FSDP_COMM_THREAD"
#define FSDP_LOCAL_MAX_RANKS      1024 /* rank threads of one local world */
#define FSDP_MAX_THREADS_PER_RANK 1024 /* fsdp_world_options.threads_per_rank */

typedef struct fsdp_world_options {
    fsdp_backend backend; /* default FSDP_BACKEND_LOCAL */
    /* local and nccl: the number of rank threads; default 1, at most FSDP_LOCAL_MAX_RANKS. mpi
     * and nccl-mpi: 0 (the default) or the number of processes of the MPI job (MPI_COMM_WORLD's
     * size), which is always the world size. */
    int nranks;
    /* Longest wait inside a collective, in milliseconds, before it fails with
     * FSDP_ERR_TIMEOUT; default FSDP_COMM_DEFAULT_TIMEOUT_MS. */
    int timeout_ms;
    /* Template of every rank's context; .rank is set to the rank. Default: all defaults. */
    fsdp_ctx_options ctx;
    /* Once a rank has failed, how long fsdp_world_run waits for the ranks still running
     * before it ends the run without them, in milliseconds. Default (0): the
     * FSDP_COMM_GRACE_MS environment variable when it holds a positive number, else
     * timeout_ms but at least 10 s (FSDP_COMM_MIN_DEFAULT_GRACE_MS). See fsdp_world_run. */
    int grace_ms;
    /* Threads of each rank while fsdp_world_run runs: the rank's own thread plus
     * threads_per_rank - 1 workers, over which it splits its GEMMs, elementwise kernels and
     * optimizer updates (elementwise and optimizer results bitwise the same for any count,
     * GEMM to float32 rounding, as with OpenBLAS's own threads). 0, the default: the
     * process's cores (OPENBLAS_NUM_THREADS when set, else the cores OpenBLAS found) divided by
     * the ranks on this machine (local: the rank threads; mpi: the processes on the node as
     * the launcher counts them, OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS), at least 1, so
     * ranks x threads never exceeds the cores by accident (a count that does is used, with a
     * warning). At most
     * FSDP_MAX_THREADS_PER_RANK. OpenBLAS itself runs single-threaded during the run (its
     * threaded GEMMs from several rank threads would wait for each other) and gets its count
     * back afterwards. */
    int threads_per_rank;
    /* Pin each rank's threads to cores: the k-th rank on this machine's thread t to the
     * (k * T + t)-th of the CPUs the process may use (its affinity mask, modulo their count;
     * T its threads), for the length of the run. Default false (the system places them).
     * Helps when the machine runs nothing else. */
    bool pin_threads;
    /* Where a rank writes its flight recorder (its last 64 collectives, see
     * fsdp_comm_trace_print) when a collective of its fails for a communication reason
     * (FSDP_ERR_TIMEOUT, or FSDP_ERR_COMM: a peer gone, a group failed, ranks making different
     * collectives): DIR/comm-trace-rank<R>.txt, the error on its first line, once per run and
     * rank; the directory is created when missing. For runs on several machines, where each
     * process's stderr goes its own way. Default (NULL): the FSDP_COMM_TRACE_DIR environment
     * variable when set and not empty, else no dumps. The string is copied. */
    const char *trace_dir;
    /* mpi backend: a communication thread in each process, which advances the process's
     * non-blocking calls in flight (the steps fsdp_comm_work_test would take) while its rank
     * computes, so that their data move without the rank calling test or wait; results are
     * bitwise the same. Every MPI call of the process is then made under one lock (MPI stays at
     * MPI_THREAD_SERIALIZED); the thread stops when the world is freed. Default false: on when
     * the FSDP_COMM_THREAD environment variable is "1" (other backends ignore the variable).
     * Refused on the other backends (the local backend's host calls complete in their start;
     * nccl and nccl-mpi leave their calls to NCCL's streams). */
    bool comm_thread;
} fsdp_world_options;

/* Creates a world. opts may be NULL for all defaults. ctx (may be NULL) receives the message
 * of a failure. On success the caller owns *out (fsdp_world_free). A backend this build does
 * not have fails with FSDP_ERR_UNSUPPORTED.
 * mpi: every process of the job calls it (it duplicates MPI_COMM_WORLD, waiting at most
 * timeout_ms for the others). It initialises MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED)
 * when nobody has, and then finalises it at process exit (atexit); MPI initialised by the
 * program stays the program's to finalise, after the last fsdp_world_free. libfsdp calls MPI
 * only inside fsdp_world_create, fsdp_world_run and fsdp_world_free. */
fsdp_status fsdp_world_create(fsdp_ctx *ctx, const fsdp_world_options *opts, fsdp_world **out);
/* Frees the world and every group's shared state. Not while fsdp_world_run runs. NULL does
 * nothing. A world whose run left rank threads running (see fsdp_world_run) is freed when the
 * last of them returns. */
void fsdp_world_free(fsdp_world *world);
/* Whether this build has the backend. */
bool fsdp_backend_available(fsdp_backend backend);

/* The function each rank runs: ctx is this rank's context (bound to the world, rank set,
 * log lines tagged "r<rank>"), valid until fn returns. */
typedef fsdp_status (*fsdp_rank_fn)(fsdp_ctx *ctx, int rank, void *user);

/* Runs fn once for every rank this process hosts (local: all of them, each on a new thread
 * while the calling thread watches them, or a single rank on the calling thread; mpi: this
 * process's rank, on the calling thread) and waits for all of them (mpi: for every process's
 * rank, so every process gets the same answer; a warning naming the missing ranks is logged
 * every half timeout_ms, at least 1 s and at most 10 s, while some rank is still running). Returns
 * FSDP_OK when every rank returned FSDP_OK; otherwise the status of the rank that failed first in
 * time, with its message prefixed "rank R: " recorded in ctx (may be NULL). When a rank returns,
 * peers waiting for it in a collective fail at once (FSDP_ERR_COMM) instead of waiting out the
 * timeout. Groups start fresh on every run (earlier failures are forgotten); group handles
 * from an earlier run must not be used. mpi: every process calls it, with the same function.
 *
 * A rank that never returns does not hold the run forever: once some rank has failed and the
 * world's grace period (grace_ms) has passed,
 * - local: fsdp_world_run returns the first failure, its message naming the ranks still
 *   running; their threads are left running, detached, and their results
 *   (fsdp_world_rank_status/_error) say so (FSDP_ERR_TIMEOUT). Such a thread may still touch
 *   the world and whatever fn uses: the world stays allocated until the last of them
 *   returns (fsdp_world_free then only drops the caller's reference), a new run of the world
 *   fails with FSDP_ERR_STATE until they have returned, and `user` and everything fn reaches
 *   must stay valid as long (or the process must end);
 * - mpi: every process still waiting logs the ranks that have not returned with the first
 *   failure (which names the collective and the rank that did not arrive) and aborts the
 *   whole job (MPI_Abort on MPI_COMM_WORLD, error code the failure's status), so no process
 *   of the job is left waiting for a rank that is stopped, dead or stuck. */
fsdp_status fsdp_world_run(fsdp_ctx *ctx, fsdp_world *world, fsdp_rank_fn fn, void *user);

int fsdp_world_size(const fsdp_world *world);
/* Whether this process runs rank `rank` of the world (local: every rank; mpi: its own). */
bool fsdp_world_hosts_rank(const fsdp_world *world, int rank);
/* The world's timeout (fsdp_world_options.timeout_ms, or its default) in milliseconds; 0 for
 * NULL. What waits on other ranks (a collective, or libfsdp's HDF5 lock) waits at most this. */
int fsdp_world_timeout_ms(const fsdp_world *world);
fsdp_backend fsdp_world_backend(const fsdp_world *world);
/* Whether the world runs a communication thread (fsdp_world_options.comm_thread, or its
 * environment variable, on the mpi backend); false for NULL. */
bool fsdp_world_comm_thread(const fsdp_world *world);
const char *fsdp_backend_to_string(fsdp_backend backend); /* "local", "mpi", "nccl" */
/* How many rank threads that runs of this world left running after their grace period have
 * not returned yet (local; 0 under mpi). While any has not, it may hold locks (a stdio stream's,
 * HDF5's): a program that ends then should flush what it must and leave with _exit, since exit
 * handlers could wait for those locks forever. */
int fsdp_world_threads_left(fsdp_world *world);
/* After fsdp_world_run: what rank `rank` returned, and its message ("" when FSDP_OK). */
fsdp_status fsdp_world_rank_status(const fsdp_world *world, int rank);
const char *fsdp_world_rank_error(const fsdp_world *world, int rank);

/* The world a rank's context is bound to, or NULL outside fsdp_world_run. */
fsdp_world *fsdp_ctx_world(const fsdp_ctx *ctx);
/* This rank's handle on the group of all ranks (label "world"), owned by ctx; NULL when ctx
 * is not bound to a world. */
fsdp_group *fsdp_ctx_world_group(const fsdp_ctx *ctx);

/* ---- groups ---- */

#define FSDP_GROUP_LABEL_MAX 32 /* bytes, with the terminating NUL */
#define FSDP_GROUP_NO_COLOR  (-1)

/* Splits `parent` (NULL: the world group) into sub-groups, like MPI_Comm_split. Every rank
 * of parent calls it; ranks passing the same color >= 0 form one group, ordered by
 * (key, parent rank); a rank passing FSDP_GROUP_NO_COLOR gets *out = NULL. label (NULL:
 * "group") names the group in messages and comm-debug, e.g. a mesh dim name; at most
 * FSDP_GROUP_LABEL_MAX - 1 bytes. The caller owns *out (fsdp_group_free). */
fsdp_status fsdp_group_split(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                             const char *label, fsdp_group **out);
/* The group of the given world ranks, in that order (torch.distributed.new_group). Every
 * rank of parent calls it with the same list; ranks not in it get *out = NULL. */
fsdp_status fsdp_group_new(fsdp_ctx *ctx, fsdp_group *parent, int nranks, const int *ranks,
                           const char *label, fsdp_group **out);
/* NULL, and the borrowed handles of contexts and meshes, do nothing. */
void fsdp_group_free(fsdp_group *group);

int fsdp_group_size(const fsdp_group *group);
int fsdp_group_rank(const fsdp_group *group); /* this rank's index in the group */
/* The world rank of the group's member `group_rank`, or -1 when out of range. */
int fsdp_group_world_rank(const fsdp_group *group, int group_rank);
const char *fsdp_group_label(const fsdp_group *group);

/* Shards that live side by side. Rank threads (the local backend) share one address space, so
 * a group's members can keep their shards of one flat buffer next to each other in one block
 * of memory: an fsdp_all_gather into that block then moves nothing, as every member's input
 * already lies where the output wants it. A collective of `group` (NULL: the world group):
 * every member passes its shard, a 1-D tensor of its own CPU memory (fsdp_tensor_create, not a
 * view), with the same dtype and numel n on every member. The shards' values move into one
 * block of W x n elements in group-rank order; `shard` and every view of it now point there
 * with the same values, and *full (the caller frees it) is a 1-D tensor of W x n elements over
 * the whole block. The block is freed when the last handle on it, on any member, goes. From
 * then on a write to a shard is seen by every member that reads full: write the shards only
 * while no member reads full (FSDP writes them in the optimizer step, between the collectives
 * that bracket every read). On backends whose ranks do not share memory (MPI) it does nothing
 * and sets *full to NULL. Not a data collective: comm-debug does not count it; the flight
 * recorder lists it. */
fsdp_status fsdp_group_share_shards(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *shard,
                                    fsdp_tensor **full);

/* torch.chunk sizes: `n` elements in `parts` chunks of ceil(n / parts); chunk `index` is
 * [offset, offset + length) = [index * chunk, min(n, (index + 1) * chunk)), possibly empty.
 * This is how every collective below splits a dimension among the ranks of a group. */
void fsdp_chunk_range(int64_t n, int parts, int index, int64_t *offset, int64_t *length);

/* ---- collectives ----
 * Every rank of the group calls the same collective with the same global shape, dtype and
 * parameters, in the same order. group NULL means the world group. Tensors are f32, bf16 or
 * f16 (the collectives that only copy, all_gather, broadcast and all_to_all, also i32, bit for
 * bit), the same dtype for input and output; dims may be negative (counted from the end). They
 * are CPU tensors, or on the local backend tensors on the rank's device (fsdp_ctx_set_device),
 * of one device kind on every rank: the data then moves on the rank's streams and the call
 * returns without waiting for it (the caller's current stream waits; docs/device.md). Any
 * other device is refused (FSDP_ERR_DEVICE, naming the fix).
 * Reductions run in rank order 0..W-1 in f32 (bf16 and f16 are widened exactly, reduced, then
 * rounded once to nearest even: a sum of f16 values beyond 65504 becomes inf),
 * so results are deterministic and replicated results are bitwise equal on every rank.
 * Mismatches between ranks (op, dtype, shape, dim, root, reduction) are reported on every
 * rank with each rank's value; a rank whose own arguments are invalid fails with its message
 * and its peers fail at once naming it. A wait longer than the world's timeout fails with
 * FSDP_ERR_TIMEOUT naming the group, the op and the ranks that did not arrive; the group is
 * then unusable (every later call fails at once). */

typedef enum fsdp_reduce_op {
    FSDP_REDUCE_SUM = 0,
    FSDP_REDUCE_AVG, /* the sum in rank order, divided by the group size */
    FSDP_REDUCE_MAX, /* NaN wins */
    FSDP_REDUCE_OP_COUNT
} fsdp_reduce_op;

const char *fsdp_reduce_op_to_string(fsdp_reduce_op op); /* "sum", "avg", "max" */

/* out = the concatenation along `dim` of every rank's `in`, in group-rank order. out has the
 * full shape on every rank; rank r's in has out's shape with dim `dim` replaced by its
 * fsdp_chunk_range(out dim, W, r) length (possibly 0). in may be exactly rank r's chunk of
 * out itself (in-place) when that chunk is contiguous; any other overlap is refused. */
fsdp_status fsdp_all_gather(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                            const fsdp_tensor *in, int dim);
/* out[r * n + i] = in[i] of group rank r: n 64-bit integers per rank, gathered exactly (one
 * all_gather of 2n i32 elements per rank, their bits copied, counted by comm-debug as such). For
 * metadata such as hashes and sizes; group NULL is the world group. */
fsdp_status fsdp_all_gather_u64(fsdp_ctx *ctx, fsdp_group *group, const uint64_t *in, int64_t n,
                                uint64_t *out);
/* out = rank r's chunk along `dim` of the reduction over ranks of `in` (full shape on every
 * rank). out has in's shape with `dim` replaced by its chunk length. out must not overlap in. */
fsdp_status fsdp_reduce_scatter(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                const fsdp_tensor *in, int dim, fsdp_reduce_op op);
/* What fsdp_reduce_scatter_ex and fsdp_all_reduce_ex(_start) do besides the reduction.
 * Zero-initialised: nothing (a plain call). */
typedef struct fsdp_reduce_options {
    float pre_scale;  /* every rank's input is multiplied by this as it is read (0: 1) */
    float post_scale; /* the reduced result is multiplied by this (0: 1) */
    bool accumulate;  /* reduce_scatter only: out += the result, instead of out = the result */
} fsdp_reduce_options;
/* out (+)= post_scale * reduce over ranks r of (pre_scale * in of rank r), this rank's chunk:
 * one reduce_scatter (checked, counted and traced as fsdp_reduce_scatter's) that folds the
 * scaling before and after and the accumulation into its one pass over the data. FSDP reduces
 * gradients with it (pre- and post-divide, then add to the shard's gradient) instead of three
 * more passes. Element by element it computes exactly what the separate steps compute: (x0 *
 * pre + x1 * pre) + ... in rank order, the division of FSDP_REDUCE_AVG, * post, then out + that
 * (each operation rounded to f32, none contracted). Each rank applies its own options; in is
 * not modified. f32 with FSDP_REDUCE_SUM or FSDP_REDUCE_AVG when any option is set; opts NULL
 * is a plain reduce_scatter. */
fsdp_status fsdp_reduce_scatter_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                   const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                   const fsdp_reduce_options *opts);
/* t = the reduction over ranks of t, in place. */
fsdp_status fsdp_all_reduce(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, fsdp_reduce_op op);
/* t = post_scale * reduce over ranks r of (pre_scale * t of rank r), in place: fsdp_all_reduce
 * with the scaling folded into its pass over the data, exactly as for fsdp_reduce_scatter_ex
 * (replicate divides its buckets this way). accumulate is refused (FSDP_ERR_INVALID_ARGUMENT).
 * Each rank's options apply to the elements it reduces, so every rank passes the same ones for
 * a replicated result. opts NULL is fsdp_all_reduce. */
fsdp_status fsdp_all_reduce_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, fsdp_reduce_op op,
                               const fsdp_reduce_options *opts);

/* ---- non-blocking collectives (PyTorch's async_op=True and Work.wait()) ----
 *
 * A work is a reusable handle for one collective in flight at a time. Every collective has a
 * started form, fsdp_<op>_start, on a work: it makes the same call as the blocking one (same
 * checks, counted the same in comm-debug, at the module and phase running when it starts, and
 * recorded by the flight recorder as in flight until the work completes; every rank of the
 * group starts it in the same order relative to its other calls on the group) and returns once
 * the call is under way; fsdp_comm_work_wait completes it. The result is bitwise equal to the
 * blocking call's. Until the wait returns, the call's tensors must stay allocated, its output
 * (an in-place call's tensor) must be neither read nor written and its input not written. A
 * work that is still in flight is refused by a start (FSDP_ERR_STATE, naming the call in
 * flight), and a call refused for its own arguments leaves the work idle.
 *
 * What is left in flight depends on the backend and the tensors: on the local backend a start
 * on device tensors queues the call on the rank's communication stream and the wait
 * synchronizes its completion (or fsdp_comm_work_wait_stream makes a stream wait for it;
 * docs/device.md), and on host tensors it makes the whole call and the work is complete when
 * it returns (fsdp_comm_work_pending says which). The nccl backend leaves its NCCL calls on
 * device tensors in flight the same way (host tensors: as the backend below it). On the MPI
 * backend all_gather, reduce_scatter(_ex) and all_reduce(_ex) are truly non-blocking: the start
 * waits for no one (it posts this rank's part of the descriptor exchange), the steps of the call
 * (the blocking call's, so the bits are its) advance whenever fsdp_comm_work_test or the wait
 * finds the step before complete, or, with the world's communication thread
 * (fsdp_world_options.comm_thread), whenever that thread finds it, while the rank computes;
 * without the thread the data moves inside MPI calls (the tests, the wait, other libfsdp calls
 * on the backend). The wait has the deadlines of a blocking call (timeout_ms for the peers to
 * arrive and without data progress; a member that returned or poisoned the group fails it at
 * once) and reports a disagreement among the ranks' calls as the blocking call does. Its
 * broadcast, all_to_all and barrier starts make the blocking call (the work is complete at
 * once). Several works may be in flight on one group; wait for them in any order. */
typedef struct fsdp_comm_work fsdp_comm_work;

/* A new idle work; the caller owns it (fsdp_comm_work_free). */
fsdp_status fsdp_comm_work_create(fsdp_ctx *ctx, fsdp_comm_work **out);
/* Frees a work (NULL: nothing). Wait for it first: a work still in flight is abandoned, and its
 * group fails (every member's next wait or call on it reports the failure), as after a
 * timeout; MPI may still read its tensor until fsdp_world_run returns. */
void fsdp_comm_work_free(fsdp_comm_work *work);
/* Starts t = the reduction over ranks of t, in place, on work, which must be idle (never
 * started, or waited for). */
fsdp_status fsdp_all_reduce_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t,
                                  fsdp_reduce_op op, fsdp_comm_work *work);
/* The same with fsdp_all_reduce_ex's options (copied: opts need not outlive the call). */
fsdp_status fsdp_all_reduce_start_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t,
                                     fsdp_reduce_op op, const fsdp_reduce_options *opts,
                                     fsdp_comm_work *work);
/* Starts fsdp_all_gather on work. */
fsdp_status fsdp_all_gather_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                  const fsdp_tensor *in, int dim, fsdp_comm_work *work);
/* Starts fsdp_reduce_scatter on work; _ex: fsdp_reduce_scatter_ex's (opts copied). */
fsdp_status fsdp_reduce_scatter_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                      const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                      fsdp_comm_work *work);
fsdp_status fsdp_reduce_scatter_start_ex(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                         const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                         const fsdp_reduce_options *opts, fsdp_comm_work *work);
/* Starts fsdp_broadcast on work. */
fsdp_status fsdp_broadcast_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, int root,
                                 fsdp_comm_work *work);
/* Starts fsdp_all_to_all on work. */
fsdp_status fsdp_all_to_all_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                                  const fsdp_tensor *in, int split_dim, int concat_dim,
                                  fsdp_comm_work *work);
/* Starts fsdp_barrier on work (every backend meets at once: the work is complete when it
 * returns). */
fsdp_status fsdp_barrier_start(fsdp_ctx *ctx, fsdp_group *group, fsdp_comm_work *work);
/* Completes the work's call (an idle work returns FSDP_OK at once); the work is idle after,
 * also when it fails. Call it from the rank that started it. */
fsdp_status fsdp_comm_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work);
/* Advances the work's call without blocking: *done is true once it has completed (the work is
 * then idle, as after a wait); a failure is reported as by the wait. */
fsdp_status fsdp_comm_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done);
/* Whether a call was started on the work and has not completed yet. */
bool fsdp_comm_work_pending(const fsdp_comm_work *work);
/* t = group rank `root`'s t, on every rank. */
fsdp_status fsdp_broadcast(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *t, int root);
/* The exchange behind Shard(concat_dim) -> Shard(split_dim): every rank splits its `in`
 * along split_dim into W torch.chunk pieces and sends piece s to rank s; out is the
 * concatenation along concat_dim of the pieces received from ranks 0..W-1.
 * With split_dim != concat_dim, in and out are rank r's chunks of one global shape G: in is G
 * with concat_dim cut to chunk r, out is G with split_dim cut to chunk r.
 * With split_dim == concat_dim, in and out have one shape whose dim is a multiple of W
 * (torch's all_to_all_single with equal splits). out must not overlap in. */
fsdp_status fsdp_all_to_all(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *out,
                            const fsdp_tensor *in, int split_dim, int concat_dim);
/* Returns once every rank of the group has entered it. */
fsdp_status fsdp_barrier(fsdp_ctx *ctx, fsdp_group *group);

/* ---- device mesh ---- */

#define FSDP_MESH_MAX_DIMS 4

/* An N-d mesh over the world (ndim 1..FSDP_MESH_MAX_DIMS): world rank = the row-major index
 * of its coordinate, so with shape (dp 4, tp 2) the tp groups are [0,1] [2,3] [4,5] [6,7] and
 * the dp groups [0,2,4,6] [1,3,5,7]. The product of shape must be the world size. names are
 * distinct, non-empty, letters, digits and '_', each at most FSDP_GROUP_LABEL_MAX - 1 bytes;
 * each dim's group is labelled with its name. Every rank calls it (it splits the world once
 * per dim). The caller owns *out (fsdp_mesh_free). */
fsdp_status fsdp_mesh_create(fsdp_ctx *ctx, int ndim, const int *shape, const char *const *names,
                             fsdp_mesh **out);
/* Frees a mesh made by fsdp_mesh_create with its groups and sub-meshes. NULL and sub-meshes
 * do nothing. */
void fsdp_mesh_free(fsdp_mesh *mesh);

int fsdp_mesh_ndim(const fsdp_mesh *mesh);
int fsdp_mesh_size(const fsdp_mesh *mesh, int dim);               /* 0 when dim is out of range */
const char *fsdp_mesh_dim_name(const fsdp_mesh *mesh, int dim);   /* NULL when out of range */
int fsdp_mesh_dim_index(const fsdp_mesh *mesh, const char *name); /* -1 when there is none */
/* This rank's coordinate along dim (-1 when dim is out of range). */
int fsdp_mesh_coordinate(const fsdp_mesh *mesh, int dim);
/* The world rank at a coordinate (ndim entries), or -1 when it is outside the mesh. */
int fsdp_mesh_rank_at(const fsdp_mesh *mesh, const int *coord);
/* mesh["name"]: the 1-d mesh of this rank along dimension `name`, owned by mesh (freeing it
 * does nothing). */
fsdp_status fsdp_mesh_dim(fsdp_ctx *ctx, const fsdp_mesh *mesh, const char *name, fsdp_mesh **out);
/* The group of this rank along dimension `name` (NULL: the only dim of a 1-d mesh), owned by
 * mesh. */
fsdp_status fsdp_mesh_get_group(fsdp_ctx *ctx, const fsdp_mesh *mesh, const char *name,
                                fsdp_group **out);

/* ---- comm-debug ----
 * Between fsdp_comm_debug_begin and _end, every collective on this rank's context is counted
 * once its arguments are valid (before it communicates): calls and bytes per op, per group
 * label (a mesh dim name, "world", or a split's label), per running module (the fully
 * qualified name of the innermost module in forward or backward, "" outside any module) and
 * per phase. Bytes: all_gather counts its output, reduce_scatter and all_to_all their input,
 * all_reduce and broadcast their tensor. Barriers are counted as op FSDP_COMM_BARRIER with 0
 * bytes and are left out of FSDP_COMM_ANY and the totals, so pinned counts of a training step
 * do not change when a barrier is added. Counters are per rank. */

typedef enum fsdp_comm_op {
    FSDP_COMM_ANY = 0, /* in queries: every op but the barrier */
    FSDP_COMM_ALL_GATHER,
    FSDP_COMM_REDUCE_SCATTER,
    FSDP_COMM_ALL_REDUCE,
    FSDP_COMM_BROADCAST,
    FSDP_COMM_ALL_TO_ALL,
    FSDP_COMM_BARRIER,
    FSDP_COMM_OP_COUNT
} fsdp_comm_op;

/* "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "barrier", "any" */
const char *fsdp_comm_op_to_string(fsdp_comm_op op);

typedef enum fsdp_comm_phase {
    FSDP_COMM_PHASE_ANY = 0, /* in queries */
    FSDP_COMM_PHASE_NONE,    /* outside forward and backward */
    FSDP_COMM_PHASE_FORWARD,
    FSDP_COMM_PHASE_BACKWARD
} fsdp_comm_phase;

const char *fsdp_comm_phase_to_string(fsdp_comm_phase phase); /* "none", "forward", ... */

typedef struct fsdp_comm_count {
    int64_t calls;
    int64_t bytes;
} fsdp_comm_count;

/* Which counts a query adds up; zero fields match everything. */
typedef struct fsdp_comm_filter {
    fsdp_comm_op op;       /* default FSDP_COMM_ANY */
    const char *group;     /* group label or mesh dim name; default NULL: any */
    const char *module;    /* fully qualified module name, "" outside modules; NULL: any */
    fsdp_comm_phase phase; /* default FSDP_COMM_PHASE_ANY */
} fsdp_comm_filter;

/* One row of the counters: the calls of one (op, group, module, phase). Strings belong to
 * the context and stay valid until the next fsdp_comm_debug_begin. */
typedef struct fsdp_comm_record {
    fsdp_comm_op op;
    const char *group;
    const char *module;
    fsdp_comm_phase phase;
    fsdp_comm_count count;
} fsdp_comm_record;

/* Clears the counters and starts counting. FSDP_ERR_STATE when already counting or when ctx
 * is not bound to a world. */
fsdp_status fsdp_comm_debug_begin(fsdp_ctx *ctx);
/* Stops counting; the counters stay readable. FSDP_ERR_STATE when not counting. */
fsdp_status fsdp_comm_debug_end(fsdp_ctx *ctx);

/* Sums of the records the filter matches (NULL: every op but barriers). */
fsdp_comm_count fsdp_comm_debug_query(const fsdp_ctx *ctx, const fsdp_comm_filter *filter);
/* Shorthands: one op on one group label (NULL: any group); every op but barriers. */
fsdp_comm_count fsdp_comm_debug_count(const fsdp_ctx *ctx, fsdp_comm_op op, const char *group);
fsdp_comm_count fsdp_comm_debug_total(const fsdp_ctx *ctx);
/* The wall seconds this rank spent in the backend's calls of the records the filter matches
 * (NULL: every op but barriers), from just before each call to just after it, waiting for its
 * peers included (the argument checks before are not); for a non-blocking all_reduce, its
 * start and every test and wait of its work, not the time between them. Read from
 * CLOCK_MONOTONIC only while counting is on. */
double fsdp_comm_debug_seconds(const fsdp_ctx *ctx, const fsdp_comm_filter *filter);
/* The records in the order their first call happened. */
int fsdp_comm_debug_num_records(const fsdp_ctx *ctx);
fsdp_status fsdp_comm_debug_record(fsdp_ctx *ctx, int i, fsdp_comm_record *out);
/* Writes the records as an aligned table with a total line. */
fsdp_status fsdp_comm_debug_print(fsdp_ctx *ctx, FILE *f);
/* Writes {"rank":R,"total":{"calls":C,"bytes":B},"records":[{"op":..,"group":..,"module":..,
 * "phase":..,"calls":..,"bytes":..},...]} and a newline. */
fsdp_status fsdp_comm_debug_write_json(fsdp_ctx *ctx, FILE *f);

/* ---- the flight recorder ----
 * Every rank remembers its last 64 collectives and group splits: the op, the group, the
 * call's number on that group, the tensor's dtype and shape, the module and phase (as
 * comm-debug attributes them), and when it started and how it ended. When a collective times
 * out because members did not arrive, its error says what each missing rank did instead (the
 * first call on the group it did not make, and where it went or is stuck), read from its
 * recorder: directly with rank threads, by asking it under MPI (a rank answers while it waits
 * in a collective; one that does not answer is computing or stuck). */

/* Writes this rank's last `last` calls (0: every one remembered), oldest first, one line
 * each: "rank 0 call 12: all_reduce #4 on group 'tp' (world ranks 0,1) of (8, 16) f32 in
 * module 'fc2' (backward): done in 0.310 ms, 0.002 s ago". FSDP_ERR_STATE outside
 * fsdp_world_run. */
fsdp_status fsdp_comm_trace_print(fsdp_ctx *ctx, int last, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
