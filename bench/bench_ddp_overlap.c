/* bench_ddp_overlap.c: what reducing gradient buckets during backward buys. Seed 004's Net (four
 * Linear(2000, 2000), no activation) under replicate on 4 ranks, one training step (zero_grad,
 * forward, backward of sum(out), SGD) timed per schedule: per-parameter all_reduce after
 * backward, DDP's buckets after backward, buckets during backward (the default), and, as the
 * floor, the same step without any reduction. Local backend (rank threads), or the MPI backend
 * under mpirun. The schedules take turns, round after round (a fresh model each time), so that
 * a machine whose load changes affects them alike; the ratios are against the
 * buckets-after-backward row of the same run. */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"   // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h"  // defines: bench_now, bench_median
#include "bench_world.h" // defines: bench_world_open
#include "fsdp/fsdp.h"

typedef struct schedule {
    const char *name;
    bool replicate;       /* false: no gradient reduction at all (the compute floor) */
    int64_t bucket_bytes; /* 1: one bucket per parameter; 0: DDP's caps (1 MiB, then 25 MiB) */
    bool after;           /* reduce_after_backward */
} schedule;

static const schedule schedules[] = {
    {"no reduction (compute only)", false, 0, false},
    {"per-parameter, after backward", true, 1, true},
    {"buckets, after backward", true, 0, true},
    {"buckets, during backward", true, 0, false},
    {"per-parameter, during backward", true, 1, false},
};
#define N_SCHEDULES ((int)(sizeof schedules / sizeof schedules[0]))
#define BASELINE    2 /* buckets, after backward */
#define MAX_STEPS   1000

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        fsdp_status st_ = (expr);                                                                  \
        if (st_ != FSDP_OK) return st_;                                                            \
    } while (0)

typedef struct bench_run {
    const schedule *s;
    int64_t dim, batch;
    int warmup, steps;
    /* rank 0's results: every timed step's seconds, appended */
    double *step_s, *bwd_s;
    int n_timed;
    int buckets;
} bench_run;

static fsdp_status run_steps(fsdp_ctx *ctx, int rank, bench_run *b, fsdp_module *m,
                             fsdp_optimizer *opt, fsdp_tensor *x, fsdp_tensor **dout) {
    fsdp_group *g = fsdp_ctx_world_group(ctx);
    for (int i = 0; i < b->warmup + b->steps; i++) {
        const fsdp_tensor *y;
        TRY(fsdp_barrier(ctx, g));
        double t0 = bench_now();
        TRY(fsdp_optimizer_zero_grad(ctx, opt));
        TRY(fsdp_module_forward(ctx, m, x, &y));
        if (!*dout) {
            TRY(fsdp_tensor_create_like(ctx, y, dout));
            TRY(fsdp_tensor_fill(ctx, *dout, 1e-3f));
        }
        double t1 = bench_now();
        TRY(fsdp_module_backward(ctx, m, *dout, NULL));
        double t2 = bench_now();
        TRY(fsdp_optimizer_step(ctx, opt));
        double t3 = bench_now();
        if (rank == 0 && i >= b->warmup) {
            b->step_s[b->n_timed] = t3 - t0;
            b->bwd_s[b->n_timed++] = t2 - t1;
        }
    }
    return FSDP_OK;
}

static fsdp_status run_rank(fsdp_ctx *ctx, int rank, void *user) {
    bench_run *b = user;
    fsdp_module *m = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_tensor *x = NULL, *dout = NULL;
    fsdp_replicate *r = NULL;
    const int64_t shape[2] = {b->batch, b->dim};
    fsdp_status st = fsdp_model_net(ctx, b->dim, &m);
    if (st == FSDP_OK && b->s->replicate) {
        fsdp_replicate_options o = {.bucket_bytes = b->s->bucket_bytes,
                                    .reduce_after_backward = b->s->after};
        st = fsdp_replicate_apply(ctx, m, &o, &r);
    }
    if (st == FSDP_OK) st = fsdp_sgd_create(ctx, m, &(fsdp_sgd_options){.lr = 1e-6}, &opt);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &x);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, x, 1e-2f);
    if (st == FSDP_OK) st = run_steps(ctx, rank, b, m, opt, x, &dout);
    if (rank == 0) b->buckets = r ? fsdp_replicate_num_buckets(r) : 0;
    fsdp_tensor_free(dout);
    fsdp_tensor_free(x);
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
    return st;
}

#define NAME "bench_ddp_overlap"
static const char usage[] =
    "usage: bench_ddp_overlap [--ranks N] [--batch B] [--dim D] [--steps S] [--rounds R] [--mpi]\n"
    "       mpirun -np N bench_ddp_overlap [...]   (the MPI backend; --ranks is the process "
    "count)\n"
    "What reducing gradient buckets during backward buys: four Linear(D, D) under replicate,\n"
    "one training step (zero_grad, forward, backward of sum(out), SGD) timed per schedule:\n"
    "per-parameter all_reduce after backward, DDP's buckets after backward, buckets during\n"
    "backward (the default), and the step without any reduction. The schedules take turns,\n"
    "round after round, on a fresh model each time.\n"
    "options:\n"
    "  --ranks N   rank threads of the local backend (default 4, 1 to 64)\n"
    "  --batch B   rows per rank (default 16, 1 to 65536)\n"
    "  --dim D     the Linear width (default 2000, 1 to 16384)\n"
    "  --steps S   timed steps per schedule and round (default 4)\n"
    "  --rounds R  rounds (default 5; steps x rounds at most 1000)\n"
    "  --mpi       the MPI backend even without mpirun's environment\n"
    "  --help, -h  prints this help\n"
    "prints (rank 0): per schedule its buckets, the median step and backward ms, the step's\n"
    "ratio to buckets after backward, and the reduction's ms (step - the step without any).\n"
    "Writes no file.\n"
    "exit status: 0 done; 1 a library call failed; 2 bad command line\n";

int main(int argc, char **argv) {
    int ranks = 4, steps = 4, rounds = 5;
    long long batch = 16, dim = 2000;
    bool mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--mpi") == 0) {
            mpi = true;
            continue;
        }
        long long *dst = strcmp(a, "--batch") == 0 ? &batch : strcmp(a, "--dim") == 0 ? &dim : NULL;
        int *idst = strcmp(a, "--ranks") == 0    ? &ranks
                    : strcmp(a, "--steps") == 0  ? &steps
                    : strcmp(a, "--rounds") == 0 ? &rounds
                                                 : NULL;
        if (!dst && !idst) bench_cli_fail(NAME, usage, "unknown argument '%s'", a);
        long long hi = idst == &ranks  ? 64
                       : dst == &batch ? 65536
                       : dst == &dim   ? 16384
                                       : MAX_STEPS;
        long long v =
            bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i), 1, hi);
        if (dst)
            *dst = v;
        else
            *idst = (int)v;
    }
    if ((long long)steps * rounds > MAX_STEPS)
        bench_cli_fail(NAME, usage, "--steps x --rounds is %lld, more than %d",
                       (long long)steps * rounds, MAX_STEPS);
    fsdp_ctx *ctx;
    fsdp_world *world;
    int rank;
    if (!bench_world_open("bench_ddp_overlap", mpi, ranks, &ctx, &world, &rank)) return 1;
    ranks = fsdp_world_size(world);
    if (rank == 0) {
        printf("bench_ddp_overlap: Net (4 x Linear(%lld, %lld), %.1f M parameters), %lld samples "
               "per rank, %s backend, %d %s; median of %d rounds x %d steps (after 2 warm-up "
               "steps each)\n\n",
               dim, dim, 4.0 * (double)(dim * dim + dim) / 1e6, batch, mpi ? "mpi" : "local", ranks,
               mpi ? "processes" : "rank threads", rounds, steps);
        printf("%-32s %8s %10s %12s %10s %12s\n", "schedule", "buckets", "step ms", "backward ms",
               "vs after", "reduce ms");
    }
    static double step_s[N_SCHEDULES][MAX_STEPS], bwd_s[N_SCHEDULES][MAX_STEPS];
    bench_run runs[N_SCHEDULES];
    for (int i = 0; i < N_SCHEDULES; i++)
        runs[i] = (bench_run){.s = &schedules[i],
                              .dim = dim,
                              .batch = batch,
                              .warmup = 2,
                              .steps = steps,
                              .step_s = step_s[i],
                              .bwd_s = bwd_s[i]};
    int rc = 0;
    for (int round = 0; round < rounds && rc == 0; round++)
        for (int i = 0; i < N_SCHEDULES && rc == 0; i++)
            if (fsdp_world_run(ctx, world, run_rank, &runs[i]) != FSDP_OK) {
                fprintf(stderr, "bench_ddp_overlap: %s\n", fsdp_last_error(ctx));
                rc = 1;
            }
    /* Printed after every schedule has run, so the ratios can use the baseline's row. */
    double step_ms[N_SCHEDULES];
    for (int i = 0; rank == 0 && rc == 0 && i < N_SCHEDULES; i++)
        step_ms[i] = 1e3 * bench_median(step_s[i], runs[i].n_timed);
    for (int i = 0; rank == 0 && rc == 0 && i < N_SCHEDULES; i++) {
        const bench_run *b = &runs[i];
        printf("%-32s %8d %10.1f %12.1f %9.2fx %12.1f\n", b->s->name, b->buckets, step_ms[i],
               1e3 * bench_median(bwd_s[i], b->n_timed), step_ms[i] / step_ms[BASELINE],
               step_ms[i] - step_ms[0]);
    }
    if (rank == 0 && rc == 0)
        printf("\nvs after: step time / the buckets-after-backward step's (below 1: faster); "
               "reduce ms: step time - the step without reduction\n");
    fsdp_world_free(world);
    fsdp_ctx_free(ctx);
    return rc;
}
