/* test_comm_nccl.c: the nccl backend (src/comm/nccl*.c) over the stand-in NCCL
 * (tests/nccl_standin: NCCL's functions over simulated-GPU streams, rank threads meeting in one
 * process). Every collective of the shared table (comm_cases.h) on 2, 4 and 8 rank threads, one
 * sim device each (deferred streams), f32, bf16, f16 and i32, compared with the local backend's
 * results on the same device tensors: moves bit for bit, max bit for bit, sums and averages
 * within the rounding bound of a sum taken in another order (below); comm-debug counts equal to
 * the local backend's; splits of 2x2 and 2x4 meshes by ncclCommSplit; a rank that skips a
 * collective, a rank that stops before one, and a rank that hangs inside one end within the
 * timeout naming the rank and the collective; an injected asynchronous error aborts every
 * rank's communicator, leaving none alive. Skipped in builds without the nccl backend.
 *
 * Under mpirun (builds with MPI; the CTest entries labelled mpi) the same cases run on the
 * nccl-mpi backend, one process per rank: the stand-in in its cross-process mode carries the
 * collectives between the processes over MPI, and the world's unique id is rank 0's, broadcast
 * over MPI (the stand-in refuses members with different ids, and makes each process's ids
 * differ). The stand-in's closures call MPI on the streams' threads, so the program initialises
 * MPI with MPI_THREAD_MULTIPLE before the harness joins the job; the library itself keeps
 * asking for MPI_THREAD_SERIALIZED, which is all real NCCL needs. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h" // defines: fsdp_test_run, FSDP_TEST_OK, FSDP_RANK_CHECK

#ifndef FSDP_TEST_NCCL_STANDIN
static void test_not_built(void) {
    fsdp_test_skip("this build has no nccl backend (it needs CUDA and NCCL)");
}

int main(int argc, char **argv) {
    static const fsdp_test_case tests[] = {{"not_built", test_not_built}};
    return fsdp_test_run(argc, argv, "comm_nccl", tests, 1);
}
#else

#include <dlfcn.h>
#include <math.h>
#include <stdatomic.h>

#include "comm/nccl_impl.h"  // defines: fsdp_nccl_library_use, fsdp_nccl_test_skip_ready_wait
#include "comm_cases.h"      // defines: cases, run_case, shapes_of, fill
#include "core/clock.h"      // defines: fsdp_clock_now
#include "kernels/kernels.h" // defines: fsdp_kernels_for
#include "kernels/sim/sim.h"
#include "nccl_standin/standin.h" // defines: standin_inject_fn, standin_live_fn

#ifdef FSDP_TEST_NCCL_MPI
#include <mpi.h>
#endif

#define MAX_W 8

static standin_inject_fn inject;
static standin_live_fn live_comms;
/* The backend the cases test: nccl (rank threads), or under mpirun nccl-mpi (processes). */
static fsdp_backend nccl_backend = FSDP_BACKEND_NCCL;
static int mpi_size; /* under mpirun: the job's processes, else 0 */

/* The sum over the processes of the job (x itself without MPI). */
static long sum_over_processes(long x) {
#ifdef FSDP_TEST_NCCL_MPI
    long all = x;
    if (mpi_size > 0) MPI_Allreduce(&x, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return all;
#else
    return x;
#endif
}

/* One simulated GPU per rank, as NCCL wants (before 2.30 it refuses two ranks on one GPU).
 * Ranks sharing a device would share its caching allocator, whose cross-stream rule can make
 * one rank's communication stream wait for another's, behind a collective that waits for the
 * first: the deadlock two ranks on one GPU risk. */
static bool real_nccl; /* FSDP_TEST_NCCL_REAL=1: the real NCCL on CUDA devices */
static bool one_gpu;   /* every rank on cuda:0 (two ranks on one GPU, NCCL 2.30+) */
static fsdp_device rank_device(int rank) {
    if (real_nccl) return (fsdp_device){FSDP_DEVICE_CUDA, one_gpu ? 0 : rank};
    return (fsdp_device){FSDP_DEVICE_SIM, rank};
}

/* Runs fn on a fresh world of n ranks of `backend` (grace 2 s after a failure); *world_out
 * (may be NULL) receives the statuses of the ranks before the world is freed. */
static fsdp_status run_world(fsdp_backend backend, int n, int timeout_ms, fsdp_rank_fn fn,
                             void *user, fsdp_status *rank_status) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_world_options o = {
        .backend = backend, .nranks = n, .timeout_ms = timeout_ms, .grace_ms = 2000};
    fsdp_world *w = NULL;
    FSDP_TRY(fsdp_world_create(ctx, &o, &w));
    fsdp_status st = fsdp_world_run(ctx, w, fn, user);
    for (int r = 0; rank_status && r < n; r++) rank_status[r] = fsdp_world_rank_status(w, r);
    fsdp_world_free(w);
    return st;
}

/* ---- every collective, against the local backend ---- */

typedef struct reference {
    bool record; /* the local pass writes, the nccl pass compares */
    unsigned char *want[MAX_W][N_CASES];
    size_t want_n[MAX_W][N_CASES];
    int64_t calls[MAX_W][FSDP_COMM_OP_COUNT], bytes[MAX_W][FSDP_COMM_OP_COUNT];
    atomic_long differ;   /* sum and average elements whose bits differ from the local's */
    atomic_long compared; /* sum and average elements compared */
} reference;

static double element(const unsigned char *p, fsdp_dtype d, int64_t i) {
    switch (d) {
    case FSDP_DTYPE_BF16:
        return fsdp_bf16_to_f32(((const fsdp_bf16 *)p)[i]);
    case FSDP_DTYPE_F16:
        return fsdp_f16_to_f32(((const fsdp_f16 *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

/* The unit roundoff of the type a sum is stored in, and the spacing of its subnormals. */
static double roundoff(fsdp_dtype d) {
    return d == FSDP_DTYPE_BF16 ? 0x1p-8 : d == FSDP_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}
static double tiny(fsdp_dtype d) {
    return d == FSDP_DTYPE_BF16 ? 0x1p-133 : d == FSDP_DTYPE_F16 ? 0x1p-24 : 0x1p-149;
}

/* The largest |input| any of the W ranks passes in case c (salt as run_case's). */
static fsdp_status max_input(fsdp_ctx *ctx, const coll_case *c, int W, uint64_t salt, double *out) {
    *out = 0;
    for (int r = 0; r < W; r++) {
        int64_t in[3], o[3];
        shapes_of(c, r, W, in, o);
        fsdp_tensor *t = NULL;
        FSDP_TRY(fsdp_tensor_create(ctx, c->dtype, FSDP_CPU, c->ndim, in, &t));
        fill(t, salt * 131u + (uint64_t)r);
        for (int64_t i = 0; i < fsdp_tensor_numel(t); i++) {
            double v = fabs(element(fsdp_tensor_data(t), c->dtype, i));
            if (v > *out) *out = v;
        }
        fsdp_tensor_free(t);
    }
    return FSDP_OK;
}

static bool is_sum(const coll_case *c) {
    return (c->kind == K_ALL_REDUCE || c->kind == K_START_HOST || c->kind == K_START_STREAM ||
            c->kind == K_REDUCE_SCATTER) &&
           c->op != FSDP_REDUCE_MAX;
}

/* Case c's result on NCCL (got) against the local backend's (want), both the output then (for
 * the calls that are not in place) the input, copied back. Everything but the output of a sum
 * or average must be bitwise equal. The bound of a sum or average:
 *   both backends add the same W terms x_r (each input times pre_scale, rounded to f32 alike),
 *   S = W max|x_r|. The local backend adds in rank order in f32 and rounds once to the type:
 *   error <= (W-1) u32 S + u |s|. NCCL (and the stand-in, on purpose) adds in another order
 *   and rounds to the type at every step, as a ring's hops do: error <= (W-1) u S. So the two
 *   differ by at most W (u + u32) S (|s| <= S), to first order (1% slack for the second).
 *   An average divides that by W; post_scale multiplies it by |post|. Each backend then rounds
 *   the division, the scaling and the accumulation once (6 u |ref| for the three, both sides),
 *   and an f16 result may be subnormal (W x its spacing). u is the type's unit roundoff (f32
 *   2^-24, bf16 2^-8, f16 2^-11). Nothing here depends on the BLAS (no GEMM runs). */
static fsdp_status compare(fsdp_ctx *ctx, int rank, int W, int k, const unsigned char *got,
                           size_t n, const unsigned char *want, size_t want_n, reference *ref) {
    const coll_case *c = &cases[k];
    FSDP_RANK_CHECK(ctx, n == want_n, "case %d: %zu bytes back, the local backend's %zu", k, n,
                    want_n);
    if (!is_sum(c)) {
        FSDP_RANK_CHECK(ctx, memcmp(got, want, n) == 0,
                        "case %d (kind %d, %s): the result differs from the local backend's", k,
                        (int)c->kind, fsdp_dtype_to_string(c->dtype));
        return FSDP_OK;
    }
    int64_t in[3], out[3];
    shapes_of(c, rank, W, in, out);
    const size_t esize = fsdp_dtype_size(c->dtype);
    int64_t n_out = 1;
    for (int i = 0; i < c->ndim; i++) n_out *= out[i];
    const size_t out_bytes = (size_t)n_out * esize;
    FSDP_RANK_CHECK(ctx, memcmp(got + out_bytes, want + out_bytes, n - out_bytes) == 0,
                    "case %d: the input changed", k);
    double maxabs = 0;
    FSDP_TRY(max_input(ctx, c, W, (uint64_t)k + 1, &maxabs));
    const double pre = c->opts.pre_scale != 0.0f ? fabs(c->opts.pre_scale) : 1.0;
    const double post = c->opts.post_scale != 0.0f ? fabs(c->opts.post_scale) : 1.0;
    const double u = roundoff(c->dtype), S = W * maxabs * pre;
    const double base = 1.01 * W * (u + 0x1p-24) * S * post / (c->op == FSDP_REDUCE_AVG ? W : 1) +
                        W * tiny(c->dtype);
    long differ = 0;
    for (int64_t i = 0; i < n_out; i++) {
        const double g = element(got, c->dtype, i), w = element(want, c->dtype, i);
        const double tol = base + 6 * u * fabs(w);
        FSDP_RANK_CHECK(ctx, fabs(g - w) <= tol,
                        "case %d (kind %d, %s, %s): element %lld is %.9g on NCCL, %.9g on the "
                        "local backend: off by %.3g, beyond the bound %.3g",
                        k, (int)c->kind, fsdp_dtype_to_string(c->dtype),
                        fsdp_reduce_op_to_string(c->op), (long long)i, g, w, fabs(g - w), tol);
        differ += memcmp(got + (size_t)i * esize, want + (size_t)i * esize, esize) != 0;
    }
    atomic_fetch_add(&ref->differ, differ);
    atomic_fetch_add(&ref->compared, n_out);
    return FSDP_OK;
}

/* Whether a started case's work is in flight between its start and its wait: every collective
 * on device tensors but the barrier (the local backend's END, NCCL's end event); on host
 * tensors only the mpi backend's all_reduce (under mpirun, inside nccl-mpi). */
static _Thread_local bool tl_on_device, tl_host_mpi_pends;
static atomic_int starts_seen;

static fsdp_status check_pending(fsdp_ctx *ctx, const coll_case *c, fsdp_comm_work *work) {
    /* on host tensors, the mpi backend's non-blocking calls (all_gather, reduce_scatter,
     * all_reduce) pend under nccl-mpi; the others complete in their start */
    const bool mpi_non_blocking = c->kind == K_ALL_REDUCE || c->kind == K_START_HOST ||
                                  c->kind == K_START_STREAM || c->kind == K_REDUCE_SCATTER ||
                                  c->kind == K_ALL_GATHER;
    const bool want = tl_on_device ? c->kind != K_BARRIER : mpi_non_blocking && tl_host_mpi_pends;
    atomic_fetch_add(&starts_seen, 1);
    FSDP_RANK_CHECK(ctx, fsdp_comm_work_pending(work) == want,
                    "a started %s on %s tensors: its work is %spending after the start",
                    fsdp_dtype_to_string(c->dtype), tl_on_device ? "device" : "host",
                    want ? "not " : "");
    return FSDP_OK;
}

static fsdp_status all_cases_body(fsdp_ctx *ctx, int rank, void *user) {
    reference *ref = user;
    tl_on_device = true;
    tl_host_mpi_pends = !ref->record && mpi_size > 0;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const fsdp_device dev = rank_device(rank);
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    fsdp_status st = FSDP_OK;
    for (int k = 0; k < N_CASES && st == FSDP_OK; k++) {
        unsigned char *got = NULL;
        size_t n = 0;
        st = run_case(ctx, rank, W, &cases[k], dev, (uint64_t)k + 1, &got, &n);
        if (st != FSDP_OK) break;
        if (ref->record) {
            ref->want[rank][k] = got;
            ref->want_n[rank][k] = n;
            continue;
        }
        st = compare(ctx, rank, W, k, got, n, ref->want[rank][k], ref->want_n[rank][k], ref);
        free(got);
    }
    for (int op = 0; op < FSDP_COMM_OP_COUNT && st == FSDP_OK; op++) {
        fsdp_comm_count cnt = fsdp_comm_debug_count(ctx, (fsdp_comm_op)op, NULL);
        if (ref->record) {
            ref->calls[rank][op] = cnt.calls;
            ref->bytes[rank][op] = cnt.bytes;
            continue;
        }
        FSDP_RANK_CHECK(ctx, cnt.calls == ref->calls[rank][op] && cnt.bytes == ref->bytes[rank][op],
                        "comm-debug counts %s %lld calls, %lld bytes on NCCL and %lld, %lld on "
                        "the local backend",
                        fsdp_comm_op_to_string((fsdp_comm_op)op), (long long)cnt.calls,
                        (long long)cnt.bytes, (long long)ref->calls[rank][op],
                        (long long)ref->bytes[rank][op]);
    }
    fsdp_status end = fsdp_comm_debug_end(ctx);
    if (st == FSDP_OK) st = end;
    /* The same calls on host tensors (metadata) take the local backend's host path inside the
     * nccl backend: bitwise the local backend's device results (test_comm_device shows those
     * equal to its host results). */
    tl_on_device = false;
    for (int k = 0; k < N_CASES && st == FSDP_OK && !ref->record; k++) {
        unsigned char *got = NULL;
        size_t n = 0;
        st = run_case(ctx, rank, W, &cases[k], FSDP_CPU, (uint64_t)k + 1, &got, &n);
        const bool same =
            st == FSDP_OK && n == ref->want_n[rank][k] && memcmp(got, ref->want[rank][k], n) == 0;
        free(got);
        FSDP_RANK_CHECK(ctx, st != FSDP_OK || same,
                        "case %d on host tensors: not the local backend's bits", k);
    }
    return st;
}

static void every_collective(int W) {
    reference *ref = calloc(1, sizeof *ref);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    ref->record = true;
    between_start_and_wait = check_pending;
    atomic_store(&starts_seen, 0);
    FSDP_TEST_OK(run_world(FSDP_BACKEND_LOCAL, W, 60000, all_cases_body, ref, NULL));
    ref->record = false;
    FSDP_TEST_OK(run_world(nccl_backend, W, 60000, all_cases_body, ref, NULL));
    between_start_and_wait = NULL;
    CU_ASSERT_TRUE(atomic_load(&starts_seen) > 0);
    /* Under mpirun each process compared its own rank's results. */
    const long differ = sum_over_processes(atomic_load(&ref->differ));
    const long compared = sum_over_processes(atomic_load(&ref->compared));
    printf("\n  %d ranks: %ld of %ld sum and average elements differ in their bits from the local "
           "backend's (within the bound)\n",
           W, differ, compared);
    CU_ASSERT_TRUE(atomic_load(&ref->compared) > 0);
    /* Two terms add alike in either order; from 4 ranks on the order shows in the bits, which
     * is why the comparison needs the bound. */
    if (W >= 4) CU_ASSERT_TRUE(differ > 0);
    for (int r = 0; r < MAX_W; r++)
        for (int k = 0; k < N_CASES; k++) free(ref->want[r][k]);
    free(ref);
    if (live_comms) CU_ASSERT_EQUAL(live_comms(), 0);
}

static void test_two_ranks(void) {
    every_collective(2);
}
static void test_four_ranks(void) {
    every_collective(4);
}
static void test_eight_ranks(void) {
    every_collective(8);
}

/* ---- splits: the groups of a mesh by ncclCommSplit ---- */

typedef struct mesh_case {
    int shape[2];
} mesh_case;

/* On each dim's group: an all_reduce of integers (exact in any order) and an all_gather, both
 * on device tensors, checked against the members the group names. */
static fsdp_status mesh_body(fsdp_ctx *ctx, int rank, void *user) {
    const mesh_case *m = user;
    static const char *const names[2] = {"dp", "tp"};
    FSDP_TRY(fsdp_ctx_set_device(ctx, rank_device(rank)));
    fsdp_mesh *mesh = NULL;
    FSDP_TRY(fsdp_mesh_create(ctx, 2, m->shape, names, &mesh));
    fsdp_status st = FSDP_OK;
    for (int d = 0; d < 2 && st == FSDP_OK; d++) {
        fsdp_group *g = NULL;
        st = fsdp_mesh_get_group(ctx, mesh, names[d], &g);
        if (st != FSDP_OK) break;
        const int n = fsdp_group_size(g);
        const int64_t len = 5, glen = 3 * (int64_t)n, piece = 3;
        fsdp_tensor *h = NULL, *t = NULL, *hg = NULL, *part = NULL, *gathered = NULL;
        st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &len, &h);
        if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &glen, &hg);
        for (int64_t i = 0; st == FSDP_OK && i < len; i++)
            fsdp_tensor_f32(h)[i] = (float)((rank + 1) * (i + 1));
        if (st == FSDP_OK) st = on(ctx, h, rank_device(rank), &t);
        if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, t, SUM);
        if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, h, t);
        int sum = 0;
        for (int q = 0; q < n; q++) sum += fsdp_group_world_rank(g, q) + 1;
        for (int64_t i = 0; st == FSDP_OK && i < len; i++)
            if (fsdp_tensor_f32(h)[i] != (float)(sum * (i + 1)))
                st =
                    FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                              "all_reduce on mesh dim %s: element %lld is %g, want %g", names[d],
                              (long long)i, (double)fsdp_tensor_f32(h)[i], (double)(sum * (i + 1)));
        if (st == FSDP_OK)
            st = fsdp_tensor_create(ctx, F32, rank_device(rank), 1, &glen, &gathered);
        if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &piece, &part);
        for (int64_t i = 0; st == FSDP_OK && i < piece; i++)
            fsdp_tensor_f32(part)[i] = (float)(100 * rank + i);
        fsdp_tensor *dpart = NULL;
        if (st == FSDP_OK) st = on(ctx, part, rank_device(rank), &dpart);
        if (st == FSDP_OK) st = fsdp_all_gather(ctx, g, gathered, dpart, 0);
        if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, hg, gathered);
        for (int64_t i = 0; st == FSDP_OK && i < glen; i++) {
            const float want =
                (float)(100 * fsdp_group_world_rank(g, (int)(i / piece)) + i % piece);
            if (fsdp_tensor_f32(hg)[i] != want)
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                               "all_gather on mesh dim %s: element %lld is %g, want %g", names[d],
                               (long long)i, (double)fsdp_tensor_f32(hg)[i], (double)want);
        }
        fsdp_tensor_free(h), fsdp_tensor_free(t), fsdp_tensor_free(hg), fsdp_tensor_free(part);
        fsdp_tensor_free(gathered), fsdp_tensor_free(dpart);
    }
    fsdp_mesh_free(mesh);
    return st;
}

static void test_mesh_splits(void) {
    mesh_case m22 = {{2, 2}}, m24 = {{2, 4}};
    FSDP_TEST_OK(run_world(FSDP_BACKEND_NCCL, 4, 20000, mesh_body, &m22, NULL));
    FSDP_TEST_OK(run_world(FSDP_BACKEND_NCCL, 8, 20000, mesh_body, &m24, NULL));
    CU_ASSERT_EQUAL(live_comms(), 0);
}

/* ---- failures end within the timeout, naming the rank and the collective ---- */

typedef enum misstep { SKIP, STOP, HANG, ASYNC } misstep;

typedef struct failure_case {
    misstep how;
    int bad_rank;
} failure_case;

/* An all_reduce on device tensors, then a barrier. The bad rank skips the all_reduce (goes on
 * to the barrier), stops (returns) before it, or (through the stand-in) hangs inside it or
 * fails in it with an asynchronous error. */
static fsdp_status failure_body(fsdp_ctx *ctx, int rank, void *user) {
    const failure_case *f = user;
    const int64_t n = 11;
    FSDP_TRY(fsdp_ctx_set_device(ctx, rank_device(rank)));
    fsdp_tensor *h = NULL, *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h));
    fsdp_status st = on(ctx, h, rank_device(rank), &t);
    const bool bad = rank == f->bad_rank;
    if (bad && f->how == STOP) {
        fsdp_tensor_free(h), fsdp_tensor_free(t);
        return st;
    }
    if (st == FSDP_OK && !(bad && f->how == SKIP)) st = fsdp_all_reduce(ctx, NULL, t, SUM);
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    fsdp_tensor_free(h), fsdp_tensor_free(t);
    return st;
}

static void expect_failure(misstep how, int W, standin_fault fault, fsdp_status want,
                           const char *const *needles) {
    failure_case f = {how, W - 1};
    fsdp_status ranks[MAX_W];
    if (fault) inject(W, W - 1, fault);
    const int timeout_ms = 1500;
    const double t0 = fsdp_clock_now();
    fsdp_status st = run_world(nccl_backend, W, timeout_ms, failure_body, &f, ranks);
    const double took = fsdp_clock_now() - t0;
    if (fault) inject(0, 0, STANDIN_FAULT_NONE);
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    printf("\n  (%.2f s) %s\n", took, msg);
    /* A hang: the first rank past the deadline times out and aborts; a peer still polling may
     * then see the abort as an asynchronous error first, and its failure may be the run's. */
    if (how == HANG) {
        CU_ASSERT_TRUE(st == FSDP_ERR_TIMEOUT || st == FSDP_ERR_COMM);
    } else {
        CU_ASSERT_EQUAL(st, want);
    }
    CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
    /* The run ends after the timeout (polls, each failure) and the grace period at most. */
    CU_ASSERT_TRUE(took < 3.0 * timeout_ms * 1e-3 + 2.0 + 2.0);
    bool wanted = false; /* some rank failed with `want` (a hang: the one that timed out) */
    for (int r = 0; r < W; r++) { /* a rank that stops returns FSDP_OK; every other fails */
        if (!(how == STOP && r == f.bad_rank)) CU_ASSERT_NOT_EQUAL(ranks[r], FSDP_OK);
        wanted = wanted || ranks[r] == want;
    }
    CU_ASSERT_TRUE(wanted);
    CU_ASSERT_EQUAL(live_comms(), 0); /* every communicator destroyed or aborted */
}

static void test_rank_skips(void) {
    /* The rendezvous sees rank 3 at the barrier while the others are at the all_reduce. */
    const char *const needles[] = {"all_reduce", "barrier", "3", NULL};
    expect_failure(SKIP, 4, STANDIN_FAULT_NONE, FSDP_ERR_COMM, needles);
}

static void test_rank_stops(void) {
    const char *const needles[] = {"all_reduce", "rank 3", NULL};
    expect_failure(STOP, 4, STANDIN_FAULT_NONE, FSDP_ERR_COMM, needles);
}

static void test_rank_hangs_in_nccl(void) {
    /* Every rank posted the call; rank 1's work never ends: each rank's poll times out, aborts
     * its communicator and names itself and the call. */
    const char *const needles[] = {"stand-in NCCL", "all_reduce", "aborted", NULL};
    expect_failure(HANG, 2, STANDIN_FAULT_HANG, FSDP_ERR_TIMEOUT, needles);
}

static void test_async_error(void) {
    const char *const needles[] = {"stand-in NCCL", "all_reduce", "asynchronous error", "aborted",
                                   NULL};
    expect_failure(ASYNC, 2, STANDIN_FAULT_ASYNC_ERROR, FSDP_ERR_COMM, needles);
}

/* ---- a work that never completes; the negative control of the stream order ---- */

/* The non-blocking all_reduce whose NCCL work hangs on rank 1: fsdp_comm_work_wait polls it
 * against the deadline too, aborts and names the call. */
static fsdp_status work_hang_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int64_t n = 9;
    FSDP_TRY(fsdp_ctx_set_device(ctx, rank_device(rank)));
    fsdp_tensor *h = NULL, *t = NULL;
    fsdp_comm_work *work = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h));
    fsdp_status st = on(ctx, h, rank_device(rank), &t);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &work);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, t, SUM, work);
    bool done = false;
    if (st == FSDP_OK) st = fsdp_comm_work_test(ctx, work, &done);
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, work);
    fsdp_comm_work_free(work);
    fsdp_tensor_free(h), fsdp_tensor_free(t);
    return st;
}

static void test_work_hangs_in_nccl(void) {
    fsdp_status ranks[MAX_W];
    const int W = mpi_size ? mpi_size : 2;
    inject(W, 1, STANDIN_FAULT_HANG);
    const double t0 = fsdp_clock_now();
    fsdp_status st = run_world(nccl_backend, W, 1000, work_hang_body, NULL, ranks);
    const double took = fsdp_clock_now() - t0;
    inject(0, 0, STANDIN_FAULT_NONE);
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    printf("\n  (%.2f s) %s\n", took, msg);
    const char *const needles[] = {"stand-in NCCL", "all_reduce", "aborted", NULL};
    /* The first rank past the deadline times out; the other may see its abort first. */
    CU_ASSERT_TRUE(st == FSDP_ERR_TIMEOUT || st == FSDP_ERR_COMM);
    CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
    CU_ASSERT_TRUE(took < 3.0 + 2.0 + 2.0); /* timeout, polls and the grace period at most */
    bool timed_out = false;
    for (int r = 0; r < W; r++) {
        CU_ASSERT_NOT_EQUAL(ranks[r], FSDP_OK);
        timed_out = timed_out || ranks[r] == FSDP_ERR_TIMEOUT;
    }
    CU_ASSERT_TRUE(timed_out);
    CU_ASSERT_EQUAL(live_comms(), 0);
}

typedef struct control {
    uint64_t salt;
    bool right; /* out: rank 0's result was the CPU's */
} control;

/* An all_reduce of fresh device tensors whose inputs are queued (deferred) on each rank's
 * stream; rank 0 reads its result first while rank 1 waits at a host barrier. Two addends sum
 * alike in any order, so the right result is the CPU's bits. */
static fsdp_status control_body(fsdp_ctx *ctx, int rank, void *user) {
    control *ctl = user;
    const fsdp_device dev = rank_device(rank);
    const int64_t n = 37;
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    fsdp_tensor *h = NULL, *want = NULL, *d = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &want);
    if (st == FSDP_OK) st = fill(want, ctl->salt + (uint64_t)rank);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, want, SUM); /* host: the local path */
    if (st == FSDP_OK) st = fill(h, ctl->salt + (uint64_t)rank);
    if (st == FSDP_OK) st = on(ctx, h, dev, &d);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, d, SUM);
    if (st == FSDP_OK && rank == 0) {
        st = fsdp_tensor_copy(ctx, h, d);
        if (st == FSDP_OK) ctl->right = !memcmp(fsdp_tensor_data(h), fsdp_tensor_data(want), 4 * n);
    }
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    if (st == FSDP_OK && rank == 1) st = fsdp_tensor_copy(ctx, h, d);
    fsdp_tensor_free(h), fsdp_tensor_free(want), fsdp_tensor_free(d);
    return st;
}

static void test_negative_control(void) {
#ifdef UNDER_TSAN
    fsdp_test_skip("the dropped wait is a data race, which ThreadSanitizer reports (as it must)");
    return;
#endif
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_mode_get(), FSDP_SIM_DEFERRED);
    for (int i = 0; i < 3; i++) {
        control with = {.salt = 2000u + 2u * (uint64_t)i}, without = {.salt = with.salt + 1u};
        FSDP_TEST_OK(run_world(FSDP_BACKEND_NCCL, 2, 20000, control_body, &with, NULL));
        fsdp_nccl_test_skip_ready_wait(true);
        fsdp_status st = run_world(FSDP_BACKEND_NCCL, 2, 20000, control_body, &without, NULL);
        fsdp_nccl_test_skip_ready_wait(false);
        FSDP_TEST_OK(st);
        CU_ASSERT_TRUE(with.right);     /* with the wait: the CPU's bits */
        CU_ASSERT_FALSE(without.right); /* without it: stale inputs, every time */
    }
}

/* ---- the library: the real one named by its version, a missing one refused ---- */

static void test_library(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_nccl_library_use("/nonexistent/libnccl.so.2", NULL, FSDP_DEVICE_CUDA);
    fsdp_world_options o = {.backend = FSDP_BACKEND_NCCL, .nranks = 2};
    fsdp_world *w = NULL;
    FSDP_TEST_FAILS(fsdp_world_create(ctx, &o, &w), FSDP_ERR_UNSUPPORTED,
                    "/nonexistent/libnccl.so.2", FSDP_NCCL_LIBRARY_ENV);
    CU_ASSERT_PTR_NULL(w);
    /* The library CMake found (this build has the backend, so it found one): opened and named
     * by its version without a GPU. */
    fsdp_nccl_library_use(NULL, NULL, FSDP_DEVICE_CUDA);
    const fsdp_nccl_lib *lib = NULL;
    FSDP_TEST_OK(fsdp_nccl_library_open(ctx, &lib));
    if (lib) {
        printf("\n  default: %s (%s)\n", lib->name, lib->path);
        CU_ASSERT_EQUAL(strncmp(lib->name, "NCCL 2.", 7), 0);
        CU_ASSERT_EQUAL(lib->device, FSDP_DEVICE_CUDA);
    }
    fsdp_nccl_library_use(FSDP_TEST_NCCL_STANDIN, "stand-in NCCL", FSDP_DEVICE_SIM);
    FSDP_TEST_OK(fsdp_nccl_library_open(ctx, &lib));
    if (lib) CU_ASSERT_STRING_EQUAL(lib->name, "stand-in NCCL");
}

/* ---- the real NCCL on a GPU (scripts/gpu-session.sh: FSDP_TEST_NCCL_REAL=1) ---- */

static bool have_gpu(void) {
    if (fsdp_device_count(FSDP_DEVICE_CUDA) > 0) return true;
    fsdp_test_skip("no CUDA device: the real NCCL runs on a GPU");
    return false;
}

static void test_real_world1(void) {
    if (have_gpu()) every_collective(1);
}

static void test_real_split(void) {
    mesh_case m11 = {{1, 1}};
    if (have_gpu()) FSDP_TEST_OK(run_world(FSDP_BACKEND_NCCL, 1, 20000, mesh_body, &m11, NULL));
}

/* The compute stream busy with GEMMs for far longer than the timeout, then an all_reduce queued
 * behind them: the poll times out and aborts the communicator. */
static fsdp_status abort_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const fsdp_device dev = rank_device(rank);
    const int64_t n = 4096, shape[2] = {n, n}, len = 1024;
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    fsdp_tensor *a = NULL, *c = NULL, *t = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, F32, dev, 2, shape, &a);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, dev, 2, shape, &c);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, dev, 1, &len, &t);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, a, 1e-3f);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, t, 1.0f);
    for (int i = 0; i < 200 && st == FSDP_OK; i++) /* 200 x 137 GFLOP: a second or more */
        fsdp_kernels_for(dev)->gemm(false, false, n, n, n, 1.0f, fsdp_tensor_f32(a), n,
                                    fsdp_tensor_f32(a), n, 0.0f, fsdp_tensor_f32(c), n);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, t, SUM);
    fsdp_tensor_free(a), fsdp_tensor_free(c), fsdp_tensor_free(t);
    return st;
}

static void test_real_abort(void) {
    if (!have_gpu()) return;
    fsdp_status ranks[1];
    const double t0 = fsdp_clock_now();
    fsdp_status st = run_world(FSDP_BACKEND_NCCL, 1, 50, abort_body, NULL, ranks);
    const char *msg = fsdp_last_error(fsdp_test_ctx());
    printf("\n  (%.2f s) %s\n", fsdp_clock_now() - t0, msg);
    const char *const needles[] = {"NCCL 2.", "all_reduce", "timed out", "aborted", NULL};
    CU_ASSERT_EQUAL(st, FSDP_ERR_TIMEOUT);
    CU_ASSERT_TRUE(fsdp_test_message_has(msg, needles));
}

/* Two ranks on one GPU: NCCL refuses it before 2.30, and 2.30 allows it experimentally
 * (NCCL_MULTI_RANK_GPU_ENABLE=1, set by the session). */
static void test_real_two_ranks_one_gpu(void) {
    if (!have_gpu()) return;
    const fsdp_nccl_lib *lib = NULL;
    FSDP_TEST_OK(fsdp_nccl_library_open(fsdp_test_ctx(), &lib));
    printf("\n  %s (%s)\n", lib->name, lib->path);
    if (lib->version < 23000) {
        fsdp_test_skip("%s refuses two ranks on one GPU (2.30 allows it)", lib->name);
        return;
    }
    one_gpu = true;
    every_collective(2);
    one_gpu = false;
}

/* ---- one process per rank under mpirun (the nccl-mpi backend) ---- */

#ifdef FSDP_TEST_NCCL_MPI

static void test_processes(void) {
    every_collective(mpi_size);
}

/* A 2 x (W/2) mesh: every dim's group by ncclCommSplit of the world's communicator. */
static void test_processes_mesh(void) {
    mesh_case m = {{2, mpi_size / 2}};
    if (mpi_size < 2 || mpi_size % 2) {
        fsdp_test_skip("a 2 x (W/2) mesh needs an even number of processes");
        return;
    }
    FSDP_TEST_OK(run_world(nccl_backend, mpi_size, 20000, mesh_body, &m, NULL));
    CU_ASSERT_EQUAL(live_comms(), 0);
    /* One world run three times, its groups split anew each run (the mpi backend frees a run's
     * split groups when the next starts, and their communicators go with them): 3 world
     * communicators' worth of groups would be alive otherwise. */
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_world_options o = {.backend = nccl_backend, .timeout_ms = 20000, .grace_ms = 2000};
    fsdp_world *w = NULL;
    FSDP_TEST_OK(fsdp_world_create(ctx, &o, &w));
    for (int run = 0; run < 3; run++) {
        FSDP_TEST_OK(fsdp_world_run(ctx, w, mesh_body, &m));
        /* the world's communicator and this run's two dims' */
        CU_ASSERT_EQUAL(live_comms(), 3);
    }
    fsdp_world_free(w);
    CU_ASSERT_EQUAL(live_comms(), 0);
}

static void test_process_skips(void) {
    char last[32];
    snprintf(last, sizeof last, "%d", mpi_size - 1);
    const char *const needles[] = {"all_reduce", "barrier", last, NULL};
    expect_failure(SKIP, mpi_size, STANDIN_FAULT_NONE, FSDP_ERR_COMM, needles);
}

static void test_process_stops(void) {
    char last[32];
    snprintf(last, sizeof last, "rank %d", mpi_size - 1);
    const char *const needles[] = {"all_reduce", last, NULL};
    expect_failure(STOP, mpi_size, STANDIN_FAULT_NONE, FSDP_ERR_COMM, needles);
}

/* The last process's work never ends, so no peer's does: each process's poll times out, aborts
 * its communicator and names its own rank ("on rank R"). */
static void test_process_hangs_in_nccl(void) {
    const char *const needles[] = {"stand-in NCCL", "all_reduce", "on rank", "aborted", NULL};
    expect_failure(HANG, mpi_size, STANDIN_FAULT_HANG, FSDP_ERR_TIMEOUT, needles);
}

/* The last process's work fails; its abort reaches the other processes as a remote error. */
static void test_process_async_error(void) {
    const char *const needles[] = {"stand-in NCCL", "all_reduce", "asynchronous error", "aborted",
                                   NULL};
    expect_failure(ASYNC, mpi_size, STANDIN_FAULT_ASYNC_ERROR, FSDP_ERR_COMM, needles);
}

/* Rank 0's ncclGetUniqueId fails: every process's fsdp_world_create fails (none waits for an id
 * that never comes), rank 0 with NCCL's error, the others saying that rank 0 could not make it. */
static void test_process_no_unique_id(void) {
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me == 0) inject(0, 0, STANDIN_FAULT_NO_ID);
    fsdp_world_options o = {.backend = nccl_backend, .timeout_ms = 20000};
    fsdp_world *w = NULL;
    if (me == 0)
        FSDP_TEST_FAILS(fsdp_world_create(fsdp_test_ctx(), &o, &w), FSDP_ERR_COMM, "stand-in NCCL",
                        "ncclGetUniqueId returned 2");
    else
        FSDP_TEST_FAILS(fsdp_world_create(fsdp_test_ctx(), &o, &w), FSDP_ERR_COMM,
                        "rank 0 could not make the world's unique id",
                        "ncclGetUniqueId returned 2");
    CU_ASSERT_PTR_NULL(w);
    inject(0, 0, STANDIN_FAULT_NONE);
    /* The next world forms. */
    FSDP_TEST_OK(fsdp_world_create(fsdp_test_ctx(), &o, &w));
    fsdp_world_free(w);
}
#endif

/* Under mpirun: MPI at MPI_THREAD_MULTIPLE (see the top), the stand-in across processes. */
static int main_mpi(int argc, char **argv, void *lib) {
#ifdef FSDP_TEST_NCCL_MPI
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS ||
        provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "comm_nccl: this MPI does not provide MPI_THREAD_MULTIPLE, which the "
                        "stand-in NCCL's cross-process mode needs\n");
        return 1;
    }
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    standin_cross_fn cross = (standin_cross_fn)dlsym(lib, STANDIN_CROSS_SYMBOL);
    if (!cross || !cross(1)) {
        fprintf(stderr, "the stand-in NCCL %s has no cross-process mode\n", FSDP_TEST_NCCL_STANDIN);
        return 1;
    }
    nccl_backend = FSDP_BACKEND_NCCL_MPI;
    static const fsdp_test_case tests[] = {
        {"processes", test_processes},
        {"processes_mesh", test_processes_mesh},
        {"process_skips", test_process_skips},
        {"process_stops", test_process_stops},
        {"process_hangs_in_nccl", test_process_hangs_in_nccl},
        {"process_async_error", test_process_async_error},
        {"process_work_hangs_in_nccl", test_work_hangs_in_nccl},
        {"process_no_unique_id", test_process_no_unique_id},
    };
    const int rc =
        fsdp_test_run(argc, argv, "comm_nccl_mpi", tests, sizeof tests / sizeof tests[0]);
    MPI_Finalize(); /* this program initialised MPI, so the library leaves it to it */
    return rc;
#else
    (void)argc, (void)argv, (void)lib;
    fprintf(stderr, "comm_nccl: this build has no MPI; run it without mpirun\n");
    return 1;
#endif
}

int main(int argc, char **argv) {
    const char *real = getenv("FSDP_TEST_NCCL_REAL");
    if (real && !strcmp(real, "1")) { /* the library CMake found, on the GPUs */
        real_nccl = true;
        static const fsdp_test_case real_tests[] = {
            {"real_world1", test_real_world1},
            {"real_split", test_real_split},
            {"real_abort", test_real_abort},
            {"real_two_ranks_one_gpu", test_real_two_ranks_one_gpu},
        };
        return fsdp_test_run(argc, argv, "comm_nccl_real", real_tests,
                             sizeof real_tests / sizeof real_tests[0]);
    }
    setenv("FSDP_SIM_DEVICES", "8", 1); /* before the first use reads them */
    setenv("FSDP_SIM_MEMORY", "256M", 1);
    unsetenv("FSDP_SIM_MODE"); /* deferred */
    fsdp_nccl_library_use(FSDP_TEST_NCCL_STANDIN, "stand-in NCCL", FSDP_DEVICE_SIM);
    void *lib = dlopen(FSDP_TEST_NCCL_STANDIN, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        inject = (standin_inject_fn)dlsym(lib, STANDIN_INJECT_SYMBOL);
        live_comms = (standin_live_fn)dlsym(lib, STANDIN_LIVE_SYMBOL);
    }
    if (!inject || !live_comms) {
        fprintf(stderr, "cannot load the stand-in NCCL %s: %s\n", FSDP_TEST_NCCL_STANDIN,
                dlerror());
        return 1;
    }
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK"))
        return main_mpi(argc, argv, lib);
    static const fsdp_test_case tests[] = {
        {"two_ranks", test_two_ranks},
        {"four_ranks", test_four_ranks},
        {"eight_ranks", test_eight_ranks},
        {"mesh_splits", test_mesh_splits},
        {"rank_skips", test_rank_skips},
        {"rank_stops", test_rank_stops},
        {"rank_hangs_in_nccl", test_rank_hangs_in_nccl},
        {"async_error", test_async_error},
        {"work_hangs_in_nccl", test_work_hangs_in_nccl},
        {"negative_control", test_negative_control},
        {"library", test_library},
    };
    return fsdp_test_run(argc, argv, "comm_nccl", tests, sizeof tests / sizeof tests[0]);
}
#endif
