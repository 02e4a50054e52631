/* bench_fsdp_memory.c: what FSDP holds per rank, and what a step costs, under each sharding
 * strategy, against NO_SHARD measured in the same run. A stack of --layers blocks
 * (Linear(--width, --width) + ReLU), each block its own FSDP unit, trained for 3 SGD steps on
 * --ranks local rank threads. Per strategy: the bytes held (shards and their gradients), the
 * peak of gathered parameters and gradients and of everything on the device, the theoretical
 * peak of gathered bytes (docs/fsdp.md), and the median step time; ratios against NO_SHARD. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h" // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h"
#include "core/error.h"
#include "fsdp/fsdp.h"

typedef struct run {
    fsdp_sharding_strategy strategy;
    int layers;
    int64_t width, batch;
    fsdp_memory_stats mem; /* rank 0's, after the steps */
    int64_t theory;        /* peak gathered bytes by the formula */
    double step_s;         /* rank 0's median step */
} run;

static fsdp_status build(fsdp_ctx *ctx, const run *r, fsdp_module **m) {
    FSDP_TRY(fsdp_sequential_create(ctx, m));
    for (int i = 0; i < r->layers; i++) {
        fsdp_module *block, *lin, *act;
        FSDP_TRY(fsdp_sequential_create(ctx, &block));
        FSDP_TRY(fsdp_sequential_append(ctx, *m, block));
        FSDP_TRY(fsdp_linear_create(ctx, r->width, r->width, true, &lin));
        FSDP_TRY(fsdp_sequential_append(ctx, block, lin));
        FSDP_TRY(fsdp_relu_create(ctx, &act));
        FSDP_TRY(fsdp_sequential_append(ctx, block, act));
    }
    return fsdp_module_reset_parameters(ctx, *m, 1);
}

static fsdp_status run_rank(fsdp_ctx *ctx, int rank, void *user) {
    run *r = user;
    int world = fsdp_group_size(fsdp_ctx_world_group(ctx));
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_tensor *x = NULL, *dy = NULL;
    const fsdp_tensor *out;
    fsdp_status st = build(ctx, r, &m);
    /* Every block its own unit; the root (the Sequential) owns no parameters. */
    if (st == FSDP_OK)
        st = fsdp_fully_shard(ctx, m,
                              &(fsdp_fully_shard_options){.strategy = r->strategy,
                                                          .wrap_kinds = (const char *[]){"Linear"},
                                                          .n_wrap_kinds = 1},
                              &sh);
    if (st == FSDP_OK)
        st = fsdp_sgd_create(ctx, fsdp_sharded_flat_params(sh), &(fsdp_sgd_options){.lr = 1e-3},
                             &opt);
    int64_t rows = r->batch / world;
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, r->width}, &x);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, x, 0.5f);
    double t[3];
    for (int s = 0; st == FSDP_OK && s < 3; s++) {
        double t0 = bench_now();
        st = fsdp_optimizer_zero_grad(ctx, opt);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
        if (st == FSDP_OK && !dy) st = fsdp_tensor_create_like(ctx, out, &dy);
        if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, dy, 1e-3f);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dy, NULL);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        t[s] = bench_now() - t0;
    }
    if (st == FSDP_OK && rank == 0) {
        fsdp_sharded_memory(sh, &r->mem);
        r->step_s = bench_median(t, 3);
        /* The root unit has no parameters here, so the formulas of docs/fsdp.md reduce to one
         * unit's worth. The f32 reduce_scatter adds straight into the shard's gradient (no
         * output block); on rank threads the parameters are gathered in place in the block the
         * group's shards share (no block either) when shared_full_bytes says so. */
        const bool in_place = r->mem.shared_full_bytes > 0;
        int64_t most = 0;
        for (int u = 1; u < fsdp_sharded_num_units(sh); u++) {
            int64_t s_u = fsdp_sharded_unit_shard_numel(sh, u);
            int64_t p_u =
                r->strategy == FSDP_NO_SHARD ? fsdp_sharded_unit_numel(sh, u) : s_u * world;
            int64_t at = r->strategy == FSDP_FULL_SHARD && !in_place ? 2 * p_u : p_u;
            if (at > most) most = at;
        }
        if (r->strategy == FSDP_SHARD_GRAD_OP && !in_place) {
            /* Every unit's parameters are kept from forward to its backward: all of them, plus
             * the first unit's gradient in backward. */
            most = 0;
            for (int u = 1; u < fsdp_sharded_num_units(sh); u++)
                most += fsdp_sharded_unit_shard_numel(sh, u) * world;
            int64_t last = fsdp_sharded_num_units(sh) - 1;
            most += fsdp_sharded_unit_shard_numel(sh, (int)last) * world;
        }
        r->theory = most * (int64_t)sizeof(float);
    }
    fsdp_tensor_free(x);
    fsdp_tensor_free(dy);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

#define NAME "bench_fsdp_memory"
static const char usage[] =
    "usage: bench_fsdp_memory [--ranks N] [--layers L] [--width D]\n"
    "What FSDP holds per rank, and what a step costs, under each sharding strategy, against\n"
    "NO_SHARD measured in the same run: L blocks (Linear(D, D) + ReLU), each its own FSDP unit,\n"
    "trained for 3 SGD steps (batch 64) on N local rank threads.\n"
    "options:\n"
    "  --ranks N   rank threads (default 4, 1 to 64)\n"
    "  --layers L  blocks (default 8)\n"
    "  --width D   the Linear width (default 1024)\n"
    "  --help, -h  prints this help\n"
    "prints: per strategy the MiB (rank 0) of shards held, the peak of gathered parameters and "
    "gradients\n"
    "and of everything on the device, the theoretical peak of gathered bytes (docs/fsdp.md)\n"
    "and the median step time, with ratios against NO_SHARD. Writes no file.\n"
    "exit status: 0 done; 1 a library call failed; 2 bad command line\n";

int main(int argc, char **argv) {
    int ranks = 4, layers = 8;
    int64_t width = 1024, batch = 64;
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--ranks") == 0)
            ranks = (int)bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i),
                                       1, 64);
        else if (strcmp(a, "--layers") == 0)
            layers = (int)bench_cli_int(NAME, usage, a,
                                        bench_cli_value(NAME, usage, argc, argv, &i), 1, 4096);
        else if (strcmp(a, "--width") == 0)
            width = bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i), 1,
                                  1 << 20);
        else
            bench_cli_fail(NAME, usage, "unknown argument '%s'", a);
    }
    fsdp_ctx *ctx;
    fsdp_world *world;
    if (fsdp_ctx_create(NULL, &ctx) != FSDP_OK) return 1;
    if (fsdp_world_create(ctx, &(fsdp_world_options){.nranks = ranks}, &world) != FSDP_OK) {
        fprintf(stderr, "bench_fsdp_memory: %s\n", fsdp_last_error(ctx));
        return 1;
    }
    double params = (double)layers * (double)(width * width + width);
    printf("bench_fsdp_memory: %d rank threads, %d units of Linear(%lld, %lld) (%.1f M "
           "parameters, %.1f MiB f32), batch %lld; bytes per rank (rank 0), MiB\n\n",
           ranks, layers, (long long)width, (long long)width, params / 1e6, params * 4 / (1 << 20),
           (long long)batch);
    printf("%-14s %10s %12s %12s %12s %12s %10s %10s\n", "strategy", "shards", "peak gathered",
           "theory", "peak device", "vs NO_SHARD", "step ms", "vs NO_SHARD");
    fsdp_sharding_strategy order[] = {FSDP_NO_SHARD, FSDP_SHARD_GRAD_OP, FSDP_FULL_SHARD};
    run base = {0};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        run r = {.strategy = order[i], .layers = layers, .width = width, .batch = batch};
        if (fsdp_world_run(ctx, world, run_rank, &r) != FSDP_OK) {
            fprintf(stderr, "bench_fsdp_memory: %s\n", fsdp_last_error(ctx));
            rc = 1;
            break;
        }
        if (i == 0) base = r;
        const double mib = 1 << 20;
        printf("%-14s %10.2f %12.2f %12.2f %12.2f %11.2fx %10.1f %9.2fx\n",
               fsdp_sharding_strategy_to_string(r.strategy), r.mem.shard_bytes / mib,
               r.mem.peak_full_bytes / mib, r.theory / mib, r.mem.peak_device_bytes / mib,
               (double)r.mem.peak_device_bytes / (double)base.mem.peak_device_bytes, r.step_s * 1e3,
               r.step_s / base.step_s);
    }
    fsdp_world_free(world);
    fsdp_ctx_free(ctx);
    return rc;
}
