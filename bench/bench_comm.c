/* bench_comm.c: the collectives from 1 KiB to 256 MiB on the local backend (rank threads) or,
 * run under mpirun, on the MPI backend (one rank per process), reported as nccl-tests does:
 * algbw = bytes / time, busbw = algbw * 2(n-1)/n for all_reduce and * (n-1)/n for all_gather
 * and reduce_scatter, where bytes is the full tensor (all_reduce: each rank's buffer;
 * all_gather: the gathered output; reduce_scatter: the input). The ceiling is this machine's
 * memcpy bandwidth, measured in the same run. With --overlap: instead, an all_gather started
 * before a stretch of compute and waited for after it, against the blocking gather followed by
 * the same compute (under mpirun, with the mpi backend's communication thread when
 * FSDP_COMM_THREAD=1). */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"   // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h"  // defines: bench_now, bench_median
#include "bench_world.h" // defines: bench_world_open
#include "fsdp/fsdp.h"

typedef enum bench_op { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_COUNT } bench_op;
static const char *const op_names[OP_COUNT] = {"all_reduce", "all_gather", "reduce_scatter"};

typedef struct bench_run {
    bench_op op;
    int64_t bytes; /* the full tensor */
    int iters;
    double seconds; /* per call, measured on rank 0 */
} bench_run;

/* Repetitions for a size: enough work to time (about 64 MiB moved), at least 3. */
static int iters_for(int64_t bytes) {
    int64_t n = (64ll << 20) / bytes;
    return n < 3 ? 3 : n > 200 ? 200 : (int)n;
}

static fsdp_status one_call(fsdp_ctx *ctx, fsdp_group *g, bench_op op, fsdp_tensor *full,
                            fsdp_tensor *chunk) {
    switch (op) {
    case OP_ALL_REDUCE:
        return fsdp_all_reduce(ctx, g, full, FSDP_REDUCE_SUM);
    case OP_ALL_GATHER:
        return fsdp_all_gather(ctx, g, full, chunk, 0);
    default:
        return fsdp_reduce_scatter(ctx, g, chunk, full, 0, FSDP_REDUCE_SUM);
    }
}

static fsdp_status run_rank(fsdp_ctx *ctx, int rank, void *user) {
    bench_run *r = user;
    fsdp_group *g = fsdp_ctx_world_group(ctx);
    int W = fsdp_group_size(g);
    int64_t n = r->bytes / 4, off, len;
    fsdp_chunk_range(n, W, rank, &off, &len);
    fsdp_tensor *full = NULL, *chunk = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &full);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &len, &chunk);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, full, 1e-3f);   /* pages touched, finite sums */
    if (st == FSDP_OK) st = one_call(ctx, g, r->op, full, chunk); /* warm-up */
    if (st == FSDP_OK) st = fsdp_barrier(ctx, g);
    double t0 = bench_now();
    for (int i = 0; i < r->iters && st == FSDP_OK; i++) st = one_call(ctx, g, r->op, full, chunk);
    if (st == FSDP_OK) st = fsdp_barrier(ctx, g);
    if (rank == 0) r->seconds = (bench_now() - t0) / r->iters;
    fsdp_tensor_free(full);
    fsdp_tensor_free(chunk);
    return st;
}

/* ---- --overlap: a gather hidden under compute ---- */

typedef struct overlap_run {
    int64_t bytes;                                   /* the gathered output */
    double gather_s, compute_s, serial_s, started_s; /* per step, rank 0's */
} overlap_run;

#define OVERLAP_STEPS 10

/* Compute for `seconds`: arithmetic on registers, no call into the library (the core stays
 * busy, as under a GEMM). */
static void compute_for(double seconds) {
    volatile double x = 1.0;
    const double t0 = bench_now();
    while (bench_now() - t0 < seconds)
        for (int i = 0; i < 1000; i++) x = x * 1.0000001 + 1e-9;
}

/* One step: the gather blocking then the compute, or started, the compute, then the wait. */
static fsdp_status overlap_step(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out, fsdp_tensor *in,
                                fsdp_comm_work *work, double compute_s) {
    fsdp_status st = work ? fsdp_all_gather_start(ctx, g, out, in, 0, work)
                          : fsdp_all_gather(ctx, g, out, in, 0);
    if (st != FSDP_OK) return st;
    compute_for(compute_s);
    return work ? fsdp_comm_work_wait(ctx, work) : FSDP_OK;
}

/* Seconds per step of OVERLAP_STEPS steps between barriers. */
static fsdp_status overlap_time(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out, fsdp_tensor *in,
                                fsdp_comm_work *work, double compute_s, double *per_step) {
    fsdp_status st = fsdp_barrier(ctx, g);
    double t0 = bench_now();
    for (int i = 0; i < OVERLAP_STEPS && st == FSDP_OK; i++)
        st = overlap_step(ctx, g, out, in, work, compute_s);
    if (st == FSDP_OK) st = fsdp_barrier(ctx, g);
    *per_step = (bench_now() - t0) / OVERLAP_STEPS;
    return st;
}

static fsdp_status overlap_rank(fsdp_ctx *ctx, int rank, void *user) {
    overlap_run *r = user;
    fsdp_group *g = fsdp_ctx_world_group(ctx);
    int W = fsdp_group_size(g);
    int64_t n = r->bytes / 4, len;
    fsdp_chunk_range(n, W, rank, NULL, &len);
    fsdp_tensor *out = NULL, *in = NULL, *t = NULL;
    fsdp_comm_work *work = NULL;
    double gather = 0, serial = 0, started = 0;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &n, &out);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &len, &in);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &t);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &work);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, in, 1e-3f);
    if (st == FSDP_OK) st = overlap_step(ctx, g, out, in, NULL, 0); /* warm-up */
    /* The compute lasts as long as the gather alone (the slowest rank's): the most there is to
     * hide. */
    if (st == FSDP_OK) st = overlap_time(ctx, g, out, in, NULL, 0, &gather);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, t, (float)gather);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, g, t, FSDP_REDUCE_MAX);
    const double compute = st == FSDP_OK ? (double)fsdp_tensor_f32(t)[0] : 0;
    if (st == FSDP_OK) st = overlap_time(ctx, g, out, in, NULL, compute, &serial);
    if (st == FSDP_OK) st = overlap_time(ctx, g, out, in, work, compute, &started);
    if (rank == 0)
        *r = (overlap_run){.bytes = r->bytes,
                           .gather_s = gather,
                           .compute_s = compute,
                           .serial_s = serial,
                           .started_s = started};
    fsdp_comm_work_free(work);
    fsdp_tensor_free(out), fsdp_tensor_free(in), fsdp_tensor_free(t);
    return st;
}

static int run_overlap(fsdp_ctx *ctx, fsdp_world *world, int rank, long long max_bytes) {
    if (rank == 0) {
        printf("bench_comm --overlap: %s backend, %d ranks, communication thread %s; all_gather "
               "f32, %d steps each, compute as long as the gather alone\n\n",
               fsdp_backend_to_string(fsdp_world_backend(world)), fsdp_world_size(world),
               fsdp_world_comm_thread(world) ? "on" : "off", OVERLAP_STEPS);
        printf("%12s %11s %11s %16s %17s %9s\n", "bytes", "gather ms", "compute ms",
               "gather+compute", "started+compute", "hidden");
    }
    for (long long bytes = 1ll << 20; bytes <= max_bytes; bytes *= 4) {
        overlap_run r = {.bytes = bytes};
        if (fsdp_world_run(ctx, world, overlap_rank, &r) != FSDP_OK) {
            fprintf(stderr, "bench_comm: %s\n", fsdp_last_error(ctx));
            return 1;
        }
        if (rank != 0) continue;
        /* hidden: the share of the gather the started form took off the serial step */
        double hideable = r.gather_s < r.compute_s ? r.gather_s : r.compute_s;
        printf("%12lld %11.2f %11.2f %13.2f ms %14.2f ms %8.0f%%\n", bytes, 1e3 * r.gather_s,
               1e3 * r.compute_s, 1e3 * r.serial_s, 1e3 * r.started_s,
               hideable > 0 ? 100 * (r.serial_s - r.started_s) / hideable : 0.0);
        fflush(stdout);
    }
    return 0;
}

/* memcpy GB/s over a buffer of `bytes`, median of 5. */
static double memcpy_bandwidth(size_t bytes) {
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a), free(b);
        return 0;
    }
    memset(a, 1, bytes), memset(b, 2, bytes);
    double t[5];
    for (int i = 0; i < 5; i++) {
        double t0 = bench_now();
        memcpy(b, a, bytes);
        t[i] = bench_now() - t0;
    }
    volatile char sink = b[bytes / 2];
    (void)sink;
    free(a), free(b);
    return (double)bytes / bench_median(t, 5) / 1e9;
}

#define NAME "bench_comm"
static const char usage[] =
    "usage: bench_comm [--ranks N] [--max-bytes B] [--mpi] [--overlap]\n"
    "       mpirun -np N bench_comm [--max-bytes B] [--overlap]\n"
    "all_reduce, all_gather and reduce_scatter from 1 KiB to B bytes (x4 per row) on the local\n"
    "backend (rank threads) or, under mpirun or with --mpi, the MPI backend (one rank per\n"
    "process), against this machine's memcpy bandwidth measured in the same run.\n"
    "options:\n"
    "  --ranks N      rank threads of the local backend (default 4, 1 to 64; under mpirun the\n"
    "                 process count)\n"
    "  --max-bytes B  the largest tensor (default 268435456, at least 1024)\n"
    "  --mpi          the MPI backend even without mpirun's environment\n"
    "  --overlap      instead: an all_gather started before a stretch of compute and waited\n"
    "                 for after it, against the blocking gather then the same compute\n"
    "  --help, -h     prints this help\n"
    "prints (rank 0): per op and size the time, algbw = bytes / time and busbw (nccl-tests'\n"
    "factors: 2(n-1)/n for all_reduce, (n-1)/n for the others) and busbw as a share of memcpy.\n"
    "Writes no file.\n"
    "exit status: 0 done; 1 a library call failed; 2 bad command line\n";

int main(int argc, char **argv) {
    int ranks = 4;
    long long max_bytes = 256ll << 20;
    bool overlap = false;
    /* Under mpirun (or with --mpi): the MPI backend, one rank per process. */
    bool mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--ranks") == 0)
            ranks = (int)bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i),
                                       1, 64);
        else if (strcmp(a, "--max-bytes") == 0)
            max_bytes = bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i),
                                      1024, 1ll << 40);
        else if (strcmp(a, "--mpi") == 0)
            mpi = true;
        else if (strcmp(a, "--overlap") == 0)
            overlap = true;
        else
            bench_cli_fail(NAME, usage, "unknown argument '%s'", a);
    }
    fsdp_ctx *ctx;
    fsdp_world *world;
    int rank;
    if (!bench_world_open("bench_comm", mpi, ranks, &ctx, &world, &rank)) return 1;
    ranks = fsdp_world_size(world);
    if (overlap) {
        int orc = run_overlap(ctx, world, rank, max_bytes);
        fsdp_world_free(world);
        fsdp_ctx_free(ctx);
        return orc;
    }
    double ceiling = 0;
    if (rank == 0) {
        ceiling = memcpy_bandwidth((size_t)(max_bytes < (64ll << 20) ? (64ll << 20) : max_bytes));
        if (mpi)
            printf("bench_comm: mpi backend, %d processes (one rank each) on this machine; "
                   "memcpy %.2f GB/s (the ceiling, measured by rank 0)\n\n",
                   ranks, ceiling);
        else
            printf("bench_comm: local backend, %d rank threads on this machine; memcpy %.2f GB/s "
                   "(the ceiling)\n\n",
                   ranks, ceiling);
        printf("%-15s %12s %7s %12s %12s %12s %10s\n", "op", "bytes", "iters", "time us",
               "algbw GB/s", "busbw GB/s", "of memcpy");
    }
    const double factor[OP_COUNT] = {2.0 * (ranks - 1) / ranks, (double)(ranks - 1) / ranks,
                                     (double)(ranks - 1) / ranks};
    int rc = 0;
    for (int op = 0; op < OP_COUNT && rc == 0; op++) {
        for (long long bytes = 1024; bytes <= max_bytes; bytes *= 4) {
            bench_run r = {.op = (bench_op)op, .bytes = bytes, .iters = iters_for(bytes)};
            if (fsdp_world_run(ctx, world, run_rank, &r) != FSDP_OK) {
                fprintf(stderr, "bench_comm: %s\n", fsdp_last_error(ctx));
                rc = 1;
                break;
            }
            if (rank != 0) continue; /* rank 0 timed the calls */
            double algbw = (double)bytes / r.seconds / 1e9, busbw = algbw * factor[op];
            printf("%-15s %12lld %7d %12.1f %12.2f %12.2f %9.0f%%\n", op_names[op], bytes, r.iters,
                   r.seconds * 1e6, algbw, busbw, 100 * busbw / ceiling);
            fflush(stdout);
        }
    }
    fsdp_world_free(world);
    fsdp_ctx_free(ctx);
    return rc;
}
