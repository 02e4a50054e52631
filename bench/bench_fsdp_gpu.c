/* bench_fsdp_gpu.c: FSDP on one GPU, libfsdp's side of bench/fsdp_gpu.sh.
 *
 * Mode "mp": one rank (world 1), the MLP (default 4096-8192-8192-4096, 134 M parameters, batch
 * 8192, ReLU, MSE, AdamW) with every Linear its own FULL_SHARD unit, bf16 mixed precision
 * (param_dtype bf16, reduce_dtype f32, f32 master shards) and the bf16 compute policy
 * (fsdp_module_set_autocast: bf16 GEMMs with f32 accumulation): median ms per step.
 * bench/fsdp_gpu.py times PyTorch FSDP2 (fully_shard per Linear, MixedPrecisionPolicy bf16,
 * fused AdamW) at world 1 on the same model.
 *
 * Mode "overlap": two rank threads sharing the device, the same model and policy, each rank half
 * of the batch; the step timed without prefetch and with forward_prefetch, BACKWARD_PRE and
 * limit_all_gathers; then the step's all_gathers alone (the units' bf16 shards, twice each:
 * forward and backward gather, in unit order). The fraction of all_gather time that prefetch
 * hides is estimated as (step without - step with) / all_gathers alone, each a median, printed
 * with its parts. Without prefetch a unit's gather starts only once the compute before it has
 * finished (its READY event is recorded behind that compute), so its whole time is exposed;
 * what prefetch takes off the step is gather time moved under compute.
 *
 * Every step ends with a device synchronize (the loss also reaches the host), as the PyTorch
 * side's steps end with torch.cuda.synchronize; times are host clock around the step.
 * Usage: bench_fsdp_gpu [--device cuda|sim] [--mode mp|overlap|all] [--widths a,b,...]
 *                       [--batch N] [--steps N] [--warmup N]
 * Prints "result libfsdp mp step_ms X", "result libfsdp overlap off_ms A on_ms B gathers_ms G
 * hidden H (unclamped R)" (H is R clamped to [0, 1]) or "skip ...: REASON". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"  // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h" // defines: bench_now, bench_median
#include "fsdp/fsdp.h"

#define MAX_WIDTHS 16
#define MAX_STEPS  200
#define RANKS      2

typedef struct args {
    fsdp_device_type type;
    const char *mode;
    int n_widths;
    int64_t widths[MAX_WIDTHS];
    int64_t batch;
    int steps, warmup;
} args;

#define NAME "bench_fsdp_gpu"
static const char usage[] =
    "usage: bench_fsdp_gpu [--device cuda|sim] [--mode mp|overlap|all] [--widths a,b,...]\n"
    "                      [--batch N] [--steps N] [--warmup N]\n"
    "FSDP on one device, libfsdp's side of bench/fsdp_gpu.sh: an MLP (ReLU, MSE, AdamW) with\n"
    "every Linear its own FULL_SHARD unit, bf16 mixed precision and the bf16 compute policy.\n"
    "  mp       one rank: the median ms per step\n"
    "  overlap  two rank threads sharing the device, half the batch each: the step without\n"
    "           prefetch, with forward_prefetch, BACKWARD_PRE and limit_all_gathers, and the\n"
    "           step's all_gathers alone; hidden = (without - with) / gathers alone\n"
    "options:\n"
    "  --device D        cuda or sim (default cuda)\n"
    "  --mode M          mp, overlap or all (default all)\n"
    "  --widths a,b,...  the layer widths, 2 to 16 (default 4096,8192,8192,4096: 134 M\n"
    "                    parameters)\n"
    "  --batch N         rows per step, at least 2 (default 8192)\n"
    "  --steps N         timed steps, median (default 10, 1 to 200)\n"
    "  --warmup N        warm-up steps (default 3)\n"
    "  --help, -h        prints this help\n"
    "prints: a line naming the model, then\n"
    "  result libfsdp mp step_ms X\n"
    "  result libfsdp overlap off_ms A on_ms B gathers_ms G hidden H (unclamped R)\n"
    "(H is R clamped to [0, 1]), or \"skip libfsdp: REASON\" when the device is missing.\n"
    "Writes no file.\n"
    "exit status: 0 done or skipped; 1 a library call failed; 2 bad command line\n";

static void parse(int argc, char **argv, args *a) {
    *a = (args){.type = FSDP_DEVICE_CUDA,
                .mode = "all",
                .n_widths = 4,
                .widths = {4096, 8192, 8192, 4096},
                .batch = 8192,
                .steps = 10,
                .warmup = 3};
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--device")) {
            const char *v = bench_cli_value(NAME, usage, argc, argv, &i);
            if (strcmp(v, "cuda") && strcmp(v, "sim"))
                bench_cli_fail(NAME, usage, "--device takes cuda or sim, got '%s'", v);
            a->type = strcmp(v, "sim") ? FSDP_DEVICE_CUDA : FSDP_DEVICE_SIM;
        } else if (!strcmp(k, "--mode")) {
            const char *v = bench_cli_value(NAME, usage, argc, argv, &i);
            if (strcmp(v, "mp") && strcmp(v, "overlap") && strcmp(v, "all"))
                bench_cli_fail(NAME, usage, "--mode takes mp, overlap or all, got '%s'", v);
            a->mode = v;
        } else if (!strcmp(k, "--widths")) {
            long long w[MAX_WIDTHS];
            a->n_widths = bench_cli_widths(
                NAME, usage, k, bench_cli_value(NAME, usage, argc, argv, &i), w, 2, MAX_WIDTHS);
            for (int j = 0; j < a->n_widths; j++) a->widths[j] = w[j];
        } else if (!strcmp(k, "--batch")) {
            a->batch = bench_cli_int(NAME, usage, k, bench_cli_value(NAME, usage, argc, argv, &i),
                                     RANKS, 1 << 24);
        } else if (!strcmp(k, "--steps")) {
            a->steps = (int)bench_cli_int(
                NAME, usage, k, bench_cli_value(NAME, usage, argc, argv, &i), 1, MAX_STEPS);
        } else if (!strcmp(k, "--warmup")) {
            a->warmup = (int)bench_cli_int(NAME, usage, k,
                                           bench_cli_value(NAME, usage, argc, argv, &i), 0, 1000);
        } else {
            bench_cli_fail(NAME, usage, "unknown argument '%s'", k);
        }
    }
}

/* One rank's model, optimizer and data on its device. */
typedef struct rank_state {
    fsdp_module *m;
    fsdp_sharded *sh;
    fsdp_optimizer *opt;
    fsdp_tensor *x, *y, *dout;
} rank_state;

static void rank_state_free(rank_state *r) {
    fsdp_tensor_free(r->x), fsdp_tensor_free(r->y), fsdp_tensor_free(r->dout);
    fsdp_optimizer_free(r->opt);
    fsdp_sharded_free(r->sh);
    fsdp_module_free(r->m);
    *r = (rank_state){0};
}

/* rows x cols uniform values in [-1, 1) on dev, drawn by the library's RNG (fsdp_init_tensor)
 * on the host from seed (each rank its own) and copied over. */
static fsdp_status random_on(fsdp_ctx *ctx, fsdp_device dev, int64_t rows, int64_t cols,
                             unsigned seed, fsdp_tensor **out) {
    fsdp_tensor *host = NULL;
    fsdp_status st =
        fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, cols}, &host);
    if (st == FSDP_OK)
        st = fsdp_init_tensor(ctx, host, &(fsdp_init){FSDP_INIT_UNIFORM, -1.0f, 1.0f}, seed, 0);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, (int64_t[]){rows, cols}, out);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, *out, host);
    fsdp_tensor_free(host);
    return st;
}

static fsdp_status build(fsdp_ctx *ctx, const args *a, fsdp_device dev, int rank, int world,
                         bool prefetch, rank_state *r) {
    static const char *const kinds[] = {"Linear"};
    fsdp_status st = fsdp_ctx_set_device(ctx, dev);
    if (st == FSDP_OK) st = fsdp_model_mlp(ctx, a->n_widths, a->widths, FSDP_ACT_RELU, &r->m);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, r->m, 1);
    if (st == FSDP_OK) st = fsdp_module_to(ctx, r->m, dev);
    fsdp_fully_shard_options o = {
        .wrap_kinds = kinds,
        .n_wrap_kinds = 1,
        .mixed_precision = {.param_dtype = FSDP_DTYPE_BF16, .reduce_dtype = FSDP_DTYPE_F32},
        .forward_prefetch = prefetch,
        .backward_prefetch = prefetch ? FSDP_BACKWARD_PRE : FSDP_BACKWARD_PREFETCH_NONE,
        .limit_all_gathers = prefetch};
    if (st == FSDP_OK) st = fsdp_fully_shard(ctx, r->m, &o, &r->sh);
    if (st == FSDP_OK) st = fsdp_module_set_autocast(ctx, r->m, FSDP_DTYPE_BF16);
    if (st == FSDP_OK)
        st = fsdp_adamw_create(ctx, fsdp_sharded_flat_params(r->sh),
                               &(fsdp_adam_options){.lr = 1e-4, .weight_decay = 0.01}, &r->opt);
    int64_t rows = a->batch / world, in = a->widths[0], out = a->widths[a->n_widths - 1];
    if (st == FSDP_OK) st = random_on(ctx, dev, rows, in, 100u + (unsigned)rank, &r->x);
    if (st == FSDP_OK) st = random_on(ctx, dev, rows, out, 200u + (unsigned)rank, &r->y);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, (int64_t[]){rows, out}, &r->dout);
    return st;
}

/* Median ms of the timed steps (warm-up first); every rank steps, rank 0's times count. */
static fsdp_status time_steps(fsdp_ctx *ctx, const args *a, fsdp_device dev, rank_state *r,
                              double *ms) {
    double t[MAX_STEPS];
    fsdp_status st = FSDP_OK;
    for (int s = -a->warmup; st == FSDP_OK && s < a->steps; s++) {
        float loss;
        const fsdp_tensor *pred;
        st = fsdp_barrier(ctx, NULL);
        double t0 = bench_now();
        if (st == FSDP_OK) st = fsdp_optimizer_zero_grad(ctx, r->opt);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, r->m, r->x, &pred);
        if (st == FSDP_OK) st = fsdp_loss_mse(ctx, pred, r->y, &loss, r->dout);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, r->m, r->dout, NULL);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, r->opt);
        if (st == FSDP_OK) st = fsdp_device_synchronize(ctx, dev);
        if (s >= 0) t[s] = 1e3 * (bench_now() - t0);
    }
    if (st == FSDP_OK) *ms = bench_median(t, a->steps);
    return st;
}

/* The step's all_gathers alone: each Linear unit's bf16 shard (its padded flat numel / world),
 * gathered once for forward and once for backward, in unit order; median ms. */
static fsdp_status time_gathers(fsdp_ctx *ctx, const args *a, fsdp_device dev, int world,
                                double *ms) {
    int units = a->n_widths - 1;
    fsdp_tensor *in[MAX_WIDTHS] = {0}, *out[MAX_WIDTHS] = {0};
    fsdp_status st = FSDP_OK;
    for (int u = 0; st == FSDP_OK && u < units; u++) {
        int64_t n = a->widths[u] * a->widths[u + 1] + a->widths[u + 1];
        int64_t shard = (n + world - 1) / world, full = shard * world;
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, dev, 1, &shard, &in[u]);
        if (st == FSDP_OK) st = fsdp_tensor_create(ctx, FSDP_DTYPE_BF16, dev, 1, &full, &out[u]);
    }
    double t[MAX_STEPS];
    for (int s = -a->warmup; st == FSDP_OK && s < a->steps; s++) {
        st = fsdp_barrier(ctx, NULL);
        double t0 = bench_now();
        for (int pass = 0; pass < 2; pass++)
            for (int u = 0; st == FSDP_OK && u < units; u++)
                st = fsdp_all_gather(ctx, NULL, out[u], in[u], 0);
        if (st == FSDP_OK) st = fsdp_device_synchronize(ctx, dev);
        if (s >= 0) t[s] = 1e3 * (bench_now() - t0);
    }
    for (int u = 0; u < units; u++) fsdp_tensor_free(in[u]), fsdp_tensor_free(out[u]);
    if (st == FSDP_OK) *ms = bench_median(t, a->steps);
    return st;
}

typedef struct run {
    const args *a;
    double mp_ms, off_ms, on_ms, gather_ms;
} run;

static fsdp_device device_of(const args *a, int rank) {
    /* rank threads share cuda:0; on sim each rank its own device where there are enough */
    int n = fsdp_device_count(a->type);
    return (fsdp_device){a->type, a->type == FSDP_DEVICE_SIM && n > 0 ? rank % n : 0};
}

static fsdp_status mp_rank(fsdp_ctx *ctx, int rank, void *user) {
    run *rn = user;
    rank_state r = {0};
    fsdp_device dev = device_of(rn->a, rank);
    fsdp_status st = build(ctx, rn->a, dev, rank, 1, false, &r);
    if (st == FSDP_OK) st = time_steps(ctx, rn->a, dev, &r, &rn->mp_ms);
    rank_state_free(&r);
    return st;
}

static fsdp_status overlap_rank(fsdp_ctx *ctx, int rank, void *user) {
    run *rn = user;
    fsdp_device dev = device_of(rn->a, rank);
    double off = 0, on = 0, gathers = 0;
    fsdp_status st = FSDP_OK;
    for (int prefetch = 0; st == FSDP_OK && prefetch < 2; prefetch++) {
        rank_state r = {0};
        st = build(ctx, rn->a, dev, rank, RANKS, prefetch, &r);
        if (st == FSDP_OK) st = time_steps(ctx, rn->a, dev, &r, prefetch ? &on : &off);
        rank_state_free(&r);
    }
    if (st == FSDP_OK) st = time_gathers(ctx, rn->a, dev, RANKS, &gathers);
    if (st == FSDP_OK && rank == 0) rn->off_ms = off, rn->on_ms = on, rn->gather_ms = gathers;
    return st;
}

static bool run_world(fsdp_ctx *ctx, int ranks, fsdp_rank_fn fn, run *rn) {
    fsdp_world *world = NULL;
    fsdp_status st = fsdp_world_create(
        ctx, &(fsdp_world_options){.backend = FSDP_BACKEND_LOCAL, .nranks = ranks}, &world);
    if (st == FSDP_OK) st = fsdp_world_run(ctx, world, fn, rn);
    if (st != FSDP_OK) fprintf(stderr, "bench_fsdp_gpu: %s\n", fsdp_last_error(ctx));
    fsdp_world_free(world);
    return st == FSDP_OK;
}

int main(int argc, char **argv) {
    args a;
    parse(argc, argv, &a);
    const char *dname = a.type == FSDP_DEVICE_CUDA ? "cuda" : "sim";
    if (fsdp_device_count(a.type) == 0) {
        printf("skip libfsdp: no %s device in this build or on this machine\n", dname);
        return 0;
    }
    fsdp_ctx *ctx;
    if (fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1}, &ctx) != FSDP_OK) return 1;
    int64_t params = 0;
    for (int i = 0; i + 1 < a.n_widths; i++)
        params += a.widths[i] * a.widths[i + 1] + a.widths[i + 1];
    printf("libfsdp FSDP on %s:0: MLP widths", dname);
    for (int i = 0; i < a.n_widths; i++) printf("%s%lld", i ? "-" : " ", (long long)a.widths[i]);
    printf(" (%.1f M parameters), batch %lld, ReLU, MSE, AdamW; each Linear a FULL_SHARD unit, "
           "param_dtype bf16, reduce_dtype f32, bf16 compute; median of %d steps after %d\n",
           (double)params / 1e6, (long long)a.batch, a.steps, a.warmup);
    run rn = {.a = &a};
    bool ok = true;
    if (!strcmp(a.mode, "mp") || !strcmp(a.mode, "all")) {
        ok = run_world(ctx, 1, mp_rank, &rn);
        if (ok) printf("result libfsdp mp step_ms %.3f\n", rn.mp_ms);
    }
    if (ok && (!strcmp(a.mode, "overlap") || !strcmp(a.mode, "all"))) {
        ok = run_world(ctx, RANKS, overlap_rank, &rn);
        if (ok) {
            double raw = rn.gather_ms > 0 ? (rn.off_ms - rn.on_ms) / rn.gather_ms : 0;
            double hidden = raw < 0 ? 0 : raw > 1 ? 1 : raw;
            printf("result libfsdp overlap off_ms %.3f on_ms %.3f gathers_ms %.3f hidden %.3f "
                   "(unclamped %.3f)\n",
                   rn.off_ms, rn.on_ms, rn.gather_ms, hidden, raw);
            printf("  %d rank threads on one device; hidden = (step without prefetch - step with) "
                   "/ the step's all_gathers alone = (%.3f - %.3f) / %.3f\n",
                   RANKS, rn.off_ms, rn.on_ms, rn.gather_ms);
        }
    }
    fsdp_ctx_free(ctx);
    return ok ? 0 : 1;
}
