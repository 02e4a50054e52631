/* bench_llama.c: one training step (forward, cross-entropy, backward, AdamW) of a Llama on the
 * CPU, on one rank with all of OpenBLAS's threads: tokens per second, the step split into its
 * phases, and the time by module kind (exclusive of children, from module hooks). bench/llama.sh
 * runs it beside bench/llama_cpu.py (transformers' LlamaForCausalLM, same configuration, batch
 * and threads) and prints the ratio. Default: a ~100 M parameter Llama (dim 768, 8 layers, 12
 * query and 4 key/value heads, ffn 2048, vocabulary 32000) on 2 x 64 tokens. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h> // defines: openblas_get_num_threads, openblas_set_num_threads
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"  // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h" // defines: bench_now, bench_median
#include "fsdp/fsdp.h"

#define MAX_KINDS 32
#define MAX_DEPTH 64

typedef struct opts {
    fsdp_llama_config cfg;
    int batch, seq, steps, warmup, threads;
    bool profile;
} opts;

/* ---- time by module kind: hooks at the four points keep a stack of running modules ---- */

typedef struct profile {
    const char *kind[MAX_KINDS];
    double fwd[MAX_KINDS], bwd[MAX_KINDS];
    int n_kinds;
    double start[MAX_DEPTH], child[MAX_DEPTH];
    int depth;
    bool on;
} profile;

static int kind_index(profile *p, const char *kind) {
    for (int i = 0; i < p->n_kinds; i++)
        if (!strcmp(p->kind[i], kind)) return i;
    if (p->n_kinds == MAX_KINDS) return MAX_KINDS - 1;
    p->kind[p->n_kinds] = kind;
    return p->n_kinds++;
}

static fsdp_status profile_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                const fsdp_tensor **io, void *user) {
    (void)ctx, (void)io;
    profile *p = user;
    if (!p->on) return FSDP_OK;
    double now = bench_now();
    if (point == FSDP_HOOK_PRE_FORWARD || point == FSDP_HOOK_PRE_BACKWARD) {
        if (p->depth < MAX_DEPTH) p->start[p->depth] = now, p->child[p->depth] = 0.0;
        p->depth++;
        return FSDP_OK;
    }
    if (--p->depth >= MAX_DEPTH || p->depth < 0) return FSDP_OK;
    double incl = now - p->start[p->depth], excl = incl - p->child[p->depth];
    if (p->depth > 0) p->child[p->depth - 1] += incl;
    int k = kind_index(p, fsdp_module_kind(m));
    *(point == FSDP_HOOK_POST_FORWARD ? &p->fwd[k] : &p->bwd[k]) += excl;
    return FSDP_OK;
}

static fsdp_status add_profile_hooks(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    for (int pt = 0; pt < FSDP_HOOK_POINT_COUNT; pt++)
        if (fsdp_module_add_observer(ctx, m, (fsdp_hook_point)pt, profile_hook, user, NULL, NULL))
            return fsdp_last_status(ctx);
    return FSDP_OK;
}

/* ---- the run ---- */

#define NAME "bench_llama"
static const char usage[] =
    "usage: bench_llama [--batch B] [--seq T] [--steps N] [--warmup W] [--threads N]\n"
    "                   [--dim D] [--layers L] [--heads H] [--kv-heads K] [--ffn F]\n"
    "                   [--vocab V] [--big] [--no-profile]\n"
    "One training step (forward, cross-entropy, backward, AdamW) of a Llama on the CPU, on one\n"
    "rank; bench/llama.sh runs it beside bench/llama_cpu.py and prints the ratio.\n"
    "options (each number 1 to 2^30):\n"
    "  --batch B, --seq T   sequences per step and their length (default 2 x 64)\n"
    "  --steps N            timed steps (default 5), --warmup W warm-up steps (default 2)\n"
    "  --threads N          OpenBLAS threads (default: all of OpenBLAS's)\n"
    "  --dim D, --layers L, --heads H, --kv-heads K, --ffn F, --vocab V\n"
    "                       the model (default 768, 8, 12, 4, 2048, 32000: ~100 M parameters)\n"
    "  --big                batch 4, seq 512\n"
    "  --no-profile         no time by module kind (no module hooks)\n"
    "  --help, -h           prints this help\n"
    "prints: the model, the loss after the last step, the step split into its phases, the time\n"
    "by module kind (exclusive of children), then\n"
    "  libfsdp fwd_bwd_ms X (...)\n"
    "  libfsdp step_ms X tokens_per_s Y\n"
    "Writes no file.\n"
    "exit status: 0 done; 1 a library call failed; 2 bad command line\n";

static void parse(int argc, char **argv, opts *o) {
    *o = (opts){.cfg = {.dim = 768,
                        .n_layers = 8,
                        .n_heads = 12,
                        .n_kv_heads = 4,
                        .vocab_size = 32000,
                        .ffn_hidden = 2048,
                        .max_seq_len = 2048},
                .batch = 2,
                .seq = 64,
                .steps = 5,
                .warmup = 2,
                .profile = true};
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--big")) {
            o->batch = 4, o->seq = 512;
            continue;
        }
        if (!strcmp(a, "--no-profile")) {
            o->profile = false;
            continue;
        }
        int *ip = !strcmp(a, "--batch")      ? &o->batch
                  : !strcmp(a, "--seq")      ? &o->seq
                  : !strcmp(a, "--steps")    ? &o->steps
                  : !strcmp(a, "--warmup")   ? &o->warmup
                  : !strcmp(a, "--threads")  ? &o->threads
                  : !strcmp(a, "--layers")   ? &o->cfg.n_layers
                  : !strcmp(a, "--heads")    ? &o->cfg.n_heads
                  : !strcmp(a, "--kv-heads") ? &o->cfg.n_kv_heads
                                             : NULL;
        int64_t *lp = !strcmp(a, "--dim")     ? &o->cfg.dim
                      : !strcmp(a, "--ffn")   ? &o->cfg.ffn_hidden
                      : !strcmp(a, "--vocab") ? &o->cfg.vocab_size
                                              : NULL;
        if (!ip && !lp) bench_cli_fail(NAME, usage, "unknown argument '%s'", a);
        long long n = bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i), 1,
                                    1L << 30);
        if (ip)
            *ip = (int)n;
        else
            *lp = n;
    }
    if (o->seq > o->cfg.max_seq_len) o->cfg.max_seq_len = o->seq;
}

enum { PH_FWD, PH_LOSS, PH_BWD, PH_OPT, PH_COUNT };
static const char *const phase_names[PH_COUNT] = {"forward", "loss", "backward", "adamw+zero"};

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((st = (x)) != FSDP_OK) goto done;                                                      \
    } while (0)

int main(int argc, char **argv) {
    opts o;
    parse(argc, argv, &o);
    if (o.threads) openblas_set_num_threads(o.threads);
    fsdp_ctx *ctx = NULL;
    if (fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1}, &ctx) != FSDP_OK) return 1;
    fsdp_module *m = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_tensor *tokens = NULL, *dlogits = NULL;
    static profile prof;
    int64_t n = (int64_t)o.batch * o.seq;
    int32_t *ids = malloc((size_t)n * sizeof *ids), *tgt = malloc((size_t)n * sizeof *tgt);
    double *times[PH_COUNT + 1];
    for (int p = 0; p <= PH_COUNT; p++) times[p] = calloc((size_t)o.steps, sizeof(double));
    double *fwd_bwd = calloc((size_t)o.steps, sizeof(double));
    uint32_t lcg = 12345;
    for (int64_t i = 0; i < n; i++) {
        lcg = lcg * 1664525u + 1013904223u;
        ids[i] = (int32_t)((lcg >> 8) % (uint32_t)o.cfg.vocab_size);
    }
    for (int64_t i = 0; i < n; i++) /* the next token; the last of each row is ignored */
        tgt[i] = (i + 1) % o.seq ? ids[i + 1] : FSDP_IGNORE_INDEX;
    fsdp_status st;
    TRY(fsdp_model_llama(ctx, &o.cfg, &m));
    TRY(fsdp_adamw_create(ctx, m, &(fsdp_adam_options){.lr = 1e-4, .weight_decay = 0.01}, &opt));
    if (o.profile) TRY(fsdp_module_visit(ctx, m, add_profile_hooks, &prof));
    TRY(fsdp_tensor_from_blob(ctx, ids, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){o.batch, o.seq},
                              &tokens));
    printf("libfsdp llama: %.1f M parameters (dim %lld, %d layers, %d/%d heads, ffn %lld, vocab "
           "%lld), batch %d x seq %d, %d OpenBLAS threads, %d warm-up + %d timed steps\n",
           (double)fsdp_module_param_count(m) / 1e6, (long long)o.cfg.dim, o.cfg.n_layers,
           o.cfg.n_heads, o.cfg.n_kv_heads, (long long)o.cfg.ffn_hidden,
           (long long)o.cfg.vocab_size, o.batch, o.seq, openblas_get_num_threads(), o.warmup,
           o.steps);
    float loss = NAN;
    for (int step = 0; step < o.warmup + o.steps; step++) {
        bool timed = step >= o.warmup;
        prof.on = timed;
        const fsdp_tensor *logits;
        double t[PH_COUNT + 1];
        t[0] = bench_now();
        TRY(fsdp_module_forward(ctx, m, tokens, &logits));
        t[1] = bench_now();
        if (!dlogits) TRY(fsdp_tensor_create_like(ctx, logits, &dlogits));
        TRY(fsdp_loss_cross_entropy_ignore(ctx, logits, tgt, FSDP_IGNORE_INDEX, &loss, dlogits));
        t[2] = bench_now();
        TRY(fsdp_module_backward(ctx, m, dlogits, NULL));
        t[3] = bench_now();
        TRY(fsdp_optimizer_step(ctx, opt));
        TRY(fsdp_optimizer_zero_grad(ctx, opt));
        t[4] = bench_now();
        if (!timed) continue;
        for (int p = 0; p < PH_COUNT; p++) times[p][step - o.warmup] = t[p + 1] - t[p];
        times[PH_COUNT][step - o.warmup] = t[PH_COUNT] - t[0];
        fwd_bwd[step - o.warmup] = t[PH_BWD + 1] - t[0];
    }
    double step_s = bench_median(times[PH_COUNT], o.steps);
    printf("loss after the last step %.4f\n", loss);
    for (int p = 0; p < PH_COUNT; p++) {
        double s = bench_median(times[p], o.steps);
        printf("  %-11s %9.1f ms  %5.1f%%\n", phase_names[p], 1e3 * s, 100.0 * s / step_s);
    }
    if (o.profile) {
        printf("  by module kind (exclusive of children, mean per step; forward / backward):\n");
        for (int k = 0; k < prof.n_kinds; k++)
            printf("    %-20s %9.1f ms %9.1f ms\n", prof.kind[k], 1e3 * prof.fwd[k] / o.steps,
                   1e3 * prof.bwd[k] / o.steps);
    }
    printf("libfsdp fwd_bwd_ms %.2f (forward, loss and backward, without the optimizer)\n",
           1e3 * bench_median(fwd_bwd, o.steps));
    printf("libfsdp step_ms %.2f tokens_per_s %.1f\n", 1e3 * step_s, (double)n / step_s);
done:
    if (st != FSDP_OK) fprintf(stderr, "bench_llama: %s\n", fsdp_last_error(ctx));
    for (int p = 0; p <= PH_COUNT; p++) free(times[p]);
    free(fwd_bwd);
    fsdp_tensor_free(dlogits);
    fsdp_tensor_free(tokens);
    fsdp_optimizer_free(opt);
    fsdp_module_free(m);
    fsdp_ctx_free(ctx);
    free(ids);
    free(tgt);
    return st == FSDP_OK ? 0 : 1;
}
