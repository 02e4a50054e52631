/* bench_scaling.c: how a training step scales over the cores of one machine. The MLP of
 * --widths (default 1024-4096-4096-1024, ReLU, 25 M parameters) trained with MSE and SGD on a
 * global batch of --batch (default 256) rows, under FULL_SHARD, SHARD_GRAD_OP, replicate and
 * 2x2 TP (FSDP over dp) on rank threads, and in one rank with several threads of its own.
 * Every layout is timed against one rank on one thread measured in the same run: speed-up,
 * fraction of linear in the cores used, and the process's CPU time per step against the
 * baseline's (the work a layout adds, steady on a busy machine). --profile adds, per layout, the
 * step split into GEMM, elementwise kernels, optimizer, each collective (copy and wait) and the
 * rest (idle: framework and waiting outside collectives), averaged over the ranks (fsdp/profile.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h> // defines: clock_gettime (the process's CPU time)
#include <unistd.h>

#include "bench_cli.h" // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h"
#include "fsdp/fsdp.h"

#define MAX_WIDTHS 8
#define MAX_RANKS  16

typedef enum { L_NONE, L_FULL, L_GRAD_OP, L_REPLICATE, L_TP } layout_kind;
static const char *const layout_names[] = {"one rank", "FULL_SHARD", "SHARD_GRAD_OP", "replicate",
                                           "2x2 TP+FSDP"};

typedef struct bench_cfg {
    int n_widths;
    int64_t widths[MAX_WIDTHS];
    int64_t batch;
    int steps, warmup;
    bool profile, pin;
    int only_kind, only_ranks, only_threads; /* --only: one layout (only_kind >= 0) */
} bench_cfg;

typedef struct run {
    const bench_cfg *cfg;
    layout_kind kind;
    int ranks, threads;
    double step_s;                /* rank 0's median step */
    double cpu_s;                 /* CPU time of the whole process per step, all threads */
    fsdp_profile prof[MAX_RANKS]; /* per rank, over the timed steps */
    double wall_s[MAX_RANKS];     /* per rank: the timed steps' wall time */
    float loss;
} run;

#define TRY(x)                                                                                     \
    do {                                                                                           \
        fsdp_status st_ = (x);                                                                     \
        if (st_ != FSDP_OK) return st_;                                                            \
    } while (0)

/* CPU seconds of this process: every rank thread and worker. */
static double process_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static fsdp_status setup(fsdp_ctx *ctx, run *r, fsdp_module **model, fsdp_mesh **mesh,
                         fsdp_group **dp, fsdp_sharded **sh, fsdp_optimizer **opt) {
    const bench_cfg *c = r->cfg;
    TRY(fsdp_model_mlp(ctx, c->n_widths, c->widths, FSDP_ACT_RELU, model));
    int tp = r->kind == L_TP ? 2 : 1;
    TRY(fsdp_mesh_create(ctx, 2, (int[]){r->ranks / tp, tp}, (const char *[]){"dp", "tp"}, mesh));
    TRY(fsdp_mesh_get_group(ctx, *mesh, "dp", dp));
    if (r->kind == L_TP) {
        fsdp_mesh *tpm = NULL;
        TRY(fsdp_mesh_dim(ctx, *mesh, "tp", &tpm));
        fsdp_tp_plan_entry plan[] = {{"0", FSDP_COLWISE()}, {"2", FSDP_ROWWISE()}};
        fsdp_tp_options o = {.src_rank = FSDP_NO_SRC_RANK}; /* same seed on every rank */
        TRY(fsdp_tp_parallelize(ctx, *model, tpm, 2, plan, &o));
    }
    fsdp_module *params = *model;
    if (r->kind == L_REPLICATE) {
        fsdp_replicate_options o = {.group = *dp, .src_rank = FSDP_NO_SRC_RANK};
        TRY(fsdp_replicate_apply(ctx, *model, &o, NULL));
    } else if (r->kind != L_NONE) {
        fsdp_fully_shard_options o = {
            .strategy = r->kind == L_GRAD_OP ? FSDP_SHARD_GRAD_OP : FSDP_FULL_SHARD, .group = *dp};
        TRY(fsdp_fully_shard(ctx, *model, &o, sh));
        params = fsdp_sharded_flat_params(*sh);
    }
    return fsdp_sgd_create(ctx, params, &(fsdp_sgd_options){.lr = 1e-4}, opt);
}

static fsdp_status rank_fn(fsdp_ctx *ctx, int rank, void *user) {
    run *r = user;
    const bench_cfg *c = r->cfg;
    fsdp_module *model = NULL;
    fsdp_mesh *mesh = NULL;
    fsdp_group *dp = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_tensor *x = NULL, *y = NULL, *dout = NULL;
    fsdp_status st = setup(ctx, r, &model, &mesh, &dp, &sh, &opt);
    int64_t off = 0, rows = c->batch;
    if (st == FSDP_OK) fsdp_batch_range(ctx, dp, c->batch, &off, &rows);
    int64_t in_w = c->widths[0], out_w = c->widths[c->n_widths - 1];
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, in_w}, &x);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, out_w}, &y);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, out_w}, &dout);
    if (st == FSDP_OK) { /* rows of the global batch: the same data on every layout */
        float *px = fsdp_tensor_f32(x), *py = fsdp_tensor_f32(y);
        for (int64_t i = 0; i < rows * in_w; i++)
            px[i] = (float)(((off * in_w + i) * 2654435761u) % 1000) / 1000.0f - 0.5f;
        for (int64_t i = 0; i < rows * out_w; i++)
            py[i] = (float)(((off * out_w + i) * 40503u) % 1000) / 1000.0f - 0.5f;
    }
    double t[64];
    int total = c->warmup + c->steps;
    double wall0 = 0, cpu0 = 0;
    for (int s = 0; st == FSDP_OK && s < total; s++) {
        if (s == c->warmup) {
            st = fsdp_barrier(ctx, NULL);
            if (c->profile && st == FSDP_OK) st = fsdp_profile_start(ctx);
            wall0 = bench_now();
            cpu0 = process_cpu();
        }
        double t0 = bench_now();
        const fsdp_tensor *out = NULL;
        if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, opt);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, model, x, &out);
        if (st == FSDP_OK) st = fsdp_loss_mse(ctx, out, y, &r->loss, dout);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, model, dout, NULL);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        if (s >= c->warmup && s - c->warmup < 64) t[s - c->warmup] = bench_now() - t0;
    }
    if (st == FSDP_OK) {
        r->wall_s[rank] = bench_now() - wall0;
        if (c->profile) { /* before the barrier below, which is the benchmark's own */
            fsdp_profile_stop(ctx);
            fsdp_profile_read(ctx, &r->prof[rank]);
        }
        st = fsdp_barrier(ctx, NULL); /* every rank's steps are in the process's CPU time */
        if (rank == 0) r->cpu_s = (process_cpu() - cpu0) / c->steps;
        if (rank == 0) r->step_s = bench_median(t, c->steps < 64 ? c->steps : 64);
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    fsdp_tensor_free(dout);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(model);
    fsdp_mesh_free(mesh);
    return st;
}

static int run_one(fsdp_ctx *ctx, run *r) {
    fsdp_world *w = NULL;
    fsdp_world_options o = {.nranks = r->ranks,
                            .threads_per_rank = r->threads,
                            .pin_threads = r->cfg->pin,
                            .ctx = {.log_level = FSDP_LOG_ERROR}};
    fsdp_status st = fsdp_world_create(ctx, &o, &w);
    if (st == FSDP_OK) st = fsdp_world_run(ctx, w, rank_fn, r);
    fsdp_world_free(w);
    if (st != FSDP_OK) fprintf(stderr, "bench_scaling: %s\n", fsdp_last_error(ctx));
    return st == FSDP_OK ? 0 : 1;
}

static void print_profile(const run *r) {
    fsdp_profile avg = {0};
    double wall = 0;
    for (int k = 0; k < r->ranks; k++) {
        const fsdp_profile *p = &r->prof[k];
        avg.gemm_s += p->gemm_s, avg.elementwise_s += p->elementwise_s;
        avg.optimizer_s += p->optimizer_s;
        for (int op = 0; op < FSDP_COMM_OP_COUNT; op++) {
            avg.comm_copy_s[op] += p->comm_copy_s[op];
            avg.comm_wait_s[op] += p->comm_wait_s[op];
        }
        wall += r->wall_s[k];
    }
    double per = 1e3 / (r->ranks * (double)r->cfg->steps); /* ms per step, rank average */
    double step = wall * per, known = avg.gemm_s + avg.elementwise_s + avg.optimizer_s;
    printf("  %-13s %dx%d   step %7.1f ms = gemm %6.1f  elementwise %5.1f  optimizer %5.1f",
           layout_names[r->kind], r->ranks, r->threads, step, avg.gemm_s * per,
           avg.elementwise_s * per, avg.optimizer_s * per);
    static const char *const short_names[] = {"", "ag", "rs", "ar", "bc", "a2a", "barrier"};
    for (int op = 1; op < FSDP_COMM_OP_COUNT; op++) {
        known += avg.comm_copy_s[op] + avg.comm_wait_s[op];
        if (avg.comm_copy_s[op] + avg.comm_wait_s[op] > 0)
            printf("  %s copy %5.1f wait %5.1f", short_names[op], avg.comm_copy_s[op] * per,
                   avg.comm_wait_s[op] * per);
    }
    printf("  idle %5.1f\n", step - known * per);
}

#define NAME "bench_scaling"
static const char usage[] =
    "usage: bench_scaling [--widths a,b,c,...] [--batch N] [--steps N] [--warmup N]\n"
    "                     [--profile] [--pin] [--quick] [--only LAYOUT RANKS THREADS]\n"
    "How a training step (MLP, ReLU, MSE, SGD) scales over the cores of one machine: FULL_SHARD,\n"
    "SHARD_GRAD_OP, replicate and 2x2 TP+FSDP on rank threads, and one rank with several\n"
    "threads, each against one rank on one thread measured in the same run.\n"
    "options:\n"
    "  --widths   MLP widths (default 1024,4096,4096,1024; 3 to 8, the\n"
    "             first two Linear layers are the TP pair)\n"
    "  --batch    global batch rows, a multiple of 4 (default 256)\n"
    "  --steps    timed steps per layout (default 5; median), --warmup N (default 1)\n"
    "  --profile  the step split into GEMM, elementwise, optimizer, each collective\n"
    "             (copy and wait) and idle, per layout at 1, 2 and 4 ranks\n"
    "  --pin      pin rank threads to cores (fsdp_world_options.pin_threads)\n"
    "  --quick    2 timed steps, no warm-up: a smoke run\n"
    "  --only LAYOUT RANKS THREADS  one layout alone (none, full, grad_op,\n"
    "             replicate, tp; none needs 1 rank, tp 4; ranks 1 to 16), e.g. under perf\n"
    "  --help, -h prints this help\n"
    "prints: per layout ms/step, speed-up, fraction of linear in the cores used, CPU ms per step\n"
    "and the baseline's CPU time against it (--only: one line, \"LAYOUT RxT: X ms/step\").\n"
    "Writes no file.\n"
    "exit status: 0 done; 1 a library call failed; 2 bad command line\n";

/* --only LAYOUT RANKS THREADS (v[0..2]) into c. */
static void parse_only(char **v, bench_cfg *c) {
    static const char *const keys[] = {"none", "full", "grad_op", "replicate", "tp"};
    int k = 0;
    while (k < 5 && strcmp(v[0], keys[k])) k++;
    if (k == 5)
        bench_cli_fail(NAME, usage, "--only takes none, full, grad_op, replicate or tp, got '%s'",
                       v[0]);
    c->only_kind = k;
    c->only_ranks = (int)bench_cli_int(NAME, usage, "--only RANKS", v[1], 1, MAX_RANKS);
    c->only_threads = (int)bench_cli_int(NAME, usage, "--only THREADS", v[2], 1, 1024);
    if ((k == L_TP && c->only_ranks != 4) || (k == L_NONE && c->only_ranks != 1))
        bench_cli_fail(NAME, usage, "--only %s takes %d ranks", v[0], k == L_TP ? 4 : 1);
}

int main(int argc, char **argv) {
    bench_cfg c = {.n_widths = 4,
                   .widths = {1024, 4096, 4096, 1024},
                   .batch = 256,
                   .steps = 5,
                   .warmup = 1,
                   .only_kind = -1};
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--widths")) {
            long long w[MAX_WIDTHS];
            c.n_widths = bench_cli_widths(
                NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i), w, 3, MAX_WIDTHS);
            for (int k = 0; k < c.n_widths; k++) c.widths[k] = w[k];
        } else if (!strcmp(a, "--batch")) {
            c.batch = bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i), 1,
                                    1 << 24);
            if (c.batch % 4)
                bench_cli_fail(NAME, usage, "--batch must divide by 4 (the most ranks), got %lld",
                               (long long)c.batch);
        } else if (!strcmp(a, "--steps")) {
            c.steps = (int)bench_cli_int(NAME, usage, a,
                                         bench_cli_value(NAME, usage, argc, argv, &i), 1, 1000);
        } else if (!strcmp(a, "--warmup")) {
            c.warmup = (int)bench_cli_int(NAME, usage, a,
                                          bench_cli_value(NAME, usage, argc, argv, &i), 0, 1000);
        } else if (!strcmp(a, "--profile")) {
            c.profile = true;
        } else if (!strcmp(a, "--pin")) {
            c.pin = true;
        } else if (!strcmp(a, "--quick")) {
            c.steps = 2, c.warmup = 0;
        } else if (!strcmp(a, "--only")) {
            if (i + 3 >= argc) bench_cli_fail(NAME, usage, "--only needs LAYOUT RANKS THREADS");
            parse_only(argv + i + 1, &c);
            i += 3;
        } else {
            bench_cli_fail(NAME, usage, "unknown argument '%s'", a);
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t params = 0;
    for (int i = 0; i + 1 < c.n_widths; i++)
        params += c.widths[i] * c.widths[i + 1] + c.widths[i + 1];
    printf("bench_scaling: MLP");
    for (int i = 0; i < c.n_widths; i++) printf("%s%lld", i ? "-" : " ", (long long)c.widths[i]);
    printf(" (%.1f M parameters), global batch %lld, SGD; median of %d steps; %ld online "
           "cores%s\n",
           (double)params / 1e6, (long long)c.batch, c.steps, cores, c.pin ? ", pinned" : "");
    fsdp_ctx *ctx = NULL;
    /* The table marks oversubscribed layouts itself: no warning from fsdp_world_run. */
    if (fsdp_ctx_create(&(fsdp_ctx_options){.log_level = FSDP_LOG_ERROR}, &ctx) != FSDP_OK)
        return 1;

    /* kind, ranks, threads */
    static const int plan[][3] = {
        {L_NONE, 1, 1},    {L_FULL, 2, 1},      {L_FULL, 4, 1},      {L_GRAD_OP, 2, 1},
        {L_GRAD_OP, 4, 1}, {L_REPLICATE, 2, 1}, {L_REPLICATE, 4, 1}, {L_TP, 4, 1},
        {L_NONE, 1, 2},    {L_NONE, 1, 4},
    };
    static const int profile_extra[][3] = {{L_FULL, 1, 1}, {L_GRAD_OP, 1, 1}, {L_REPLICATE, 1, 1}};
    int n = (int)(sizeof plan / sizeof plan[0]);
    if (c.only_kind >= 0) {
        run r = {.cfg = &c, .kind = c.only_kind, .ranks = c.only_ranks, .threads = c.only_threads};
        int failed = run_one(ctx, &r);
        if (!failed)
            printf("%s %dx%d: %.1f ms/step\n", layout_names[r.kind], r.ranks, r.threads,
                   1e3 * r.step_s);
        if (!failed && c.profile) print_profile(&r);
        fsdp_ctx_free(ctx);
        return failed;
    }
    run *runs = calloc((size_t)n + 3, sizeof *runs);
    if (!runs) return 1;
    int failed = 0;
    printf("\n%-14s %5s %7s %10s %9s %6s %10s %9s %6s\n", "layout", "ranks", "threads", "ms/step",
           "speed-up", "cores", "of linear", "cpu ms", "work");
    double base = 0, base_cpu = 0;
    for (int i = 0; i < n; i++) {
        runs[i] = (run){.cfg = &c, .kind = plan[i][0], .ranks = plan[i][1], .threads = plan[i][2]};
        failed |= run_one(ctx, &runs[i]);
        if (failed) break;
        if (i == 0) base = runs[i].step_s, base_cpu = runs[i].cpu_s;
        int used = runs[i].ranks * runs[i].threads;
        int cores_used = used < cores ? used : (int)cores;
        double speed = base / runs[i].step_s;
        printf("%-14s %5d %7d %10.1f %8.2fx %6d %9.0f%% %9.1f %5.0f%%%s\n",
               layout_names[runs[i].kind], runs[i].ranks, runs[i].threads, 1e3 * runs[i].step_s,
               speed, cores_used, 100.0 * speed / cores_used, 1e3 * runs[i].cpu_s,
               100.0 * base_cpu / runs[i].cpu_s, used > cores ? "  (oversubscribed)" : "");
        fflush(stdout);
    }
    if (!failed && c.profile) {
        for (int i = 0; i < 3; i++) {
            runs[n + i] = (run){.cfg = &c,
                                .kind = profile_extra[i][0],
                                .ranks = profile_extra[i][1],
                                .threads = profile_extra[i][2]};
            failed |= run_one(ctx, &runs[n + i]);
        }
        printf("\nprofile: ms per step, average over the ranks (ranks x threads); copy = moving "
               "data inside a collective,\nwait = the rest of it (rendezvous), idle = the step "
               "minus all of these (framework, waiting outside collectives)\n");
        static const int order[] = {0, 10, 1, 2, 11, 3, 4, 12, 5, 6, 7, 8, 9};
        for (int k = 0; !failed && k < (int)(sizeof order / sizeof order[0]); k++)
            print_profile(&runs[order[k]]);
    }
    free(runs);
    fsdp_ctx_free(ctx);
    return failed;
}
