/* bench_llama_gpu.c: libfsdp's side of bench/llama_gpu.sh: one Llama training step (forward,
 * cross-entropy, backward, AdamW) on one device, per shape and compute mode, as the median of
 * the timed steps, tokens/s and MFU. bench/llama_gpu.py times PyTorch on the same shapes.
 * Modes: f32, tf32 (CUDA only) and bf16 (the model's bf16 compute policy, fsdp_module_set_autocast:
 * bf16 GEMMs with f32 accumulation, f32 master weights and AdamW; bf16 logits and logit
 * gradients, the cross-entropy's math in f32).
 * Shapes: S (dim 768, 12 layers), M (the Llama-3.2-1B shape) and tiny (for the CTest on sim).
 * A deadline (--budget-s) skips, with the reason, every run that would not finish before it.
 * --breakdown adds, after each mode's timed steps, steps that time every part of the step
 * (llama_breakdown.c). --checkpoint checkpoints every decoder layer (fsdp_checkpoint_wrap, as
 * PyTorch's checkpoint_wrapper); its modes are written MODE+ckpt. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"  // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h" // defines: bench_now, bench_median
#include "fsdp/cuda.h"  // defines: fsdp_cuda_set_allow_tf32
#include "fsdp/fsdp.h"
#include "kernels/kernels.h" // defines: fsdp_kernels_counts
#include "llama_breakdown.h" // defines: llama_breakdown_attach, llama_breakdown_mark

#define MAX_STEPS 1000

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        fsdp_status st_ = (expr);                                                                  \
        if (st_ != FSDP_OK) return st_;                                                            \
    } while (0)

typedef struct shape {
    const char *name;
    int64_t dim, ffn, vocab;
    int layers, heads, kv_heads, seq, batch;
} shape;

static const shape SHAPES[] = {
    {"S", 768, 2048, 32000, 12, 12, 4, 1024, 16},
    {"M", 2048, 8192, 128256, 16, 32, 8, 2048, 4},
    {"tiny", 64, 128, 256, 2, 4, 2, 32, 2},
};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static const char *const MODES[] = {"f32", "tf32", "bf16"};
static const char *const MODES_CKPT[] = {"f32+ckpt", "tf32+ckpt", "bf16+ckpt"};
#define N_MODES 3

typedef struct opts {
    fsdp_device dev;
    bool shape_on[N_SHAPES], mode_on[N_MODES];
    double peak_tflops[N_MODES]; /* 0: unknown, no MFU */
    int steps, warmup;
    int breakdown_steps; /* 0: no breakdown */
    bool checkpoint;     /* every decoder layer checkpointed */
    double budget_s;
    bool peaks_given; /* --peaks: else the device's own */
    bool print_peaks; /* --print-peaks: that line, nothing timed */
} opts;

#define NAME "bench_llama_gpu"
static const char usage[] =
    "usage: bench_llama_gpu [--device cuda|sim] [--shapes S,M,tiny] [--modes f32,tf32,bf16]\n"
    "                       [--steps N] [--warmup W] [--budget-s SEC]\n"
    "                       [--peaks F32,TF32,BF16 (TFLOP/s, for MFU)]\n"
    "                       [--breakdown] [--breakdown-steps N] [--checkpoint]\n"
    "       bench_llama_gpu [--device cuda|sim] --print-peaks   (the peaks line alone)\n"
    "One Llama training step (forward, cross-entropy, backward, AdamW) on one device per shape\n"
    "and compute mode, libfsdp's side of bench/llama_gpu.sh. --help, -h prints this help.\n"
    "Default: cuda, shapes S,M, modes f32,tf32,bf16, 2 warm-up and 10 timed steps, a\n"
    "budget of 600 s, no breakdown, the device's own peaks for MFU (fsdp_device_get_properties:\n"
    "none on sim or a card outside libfsdp's table: mfu n/a; --peaks gives them). Prints one\n"
    "line per run (L: the last step's\n"
    "loss, 9 significant digits):\n"
    "  result libfsdp SHAPE MODE step_ms MS tokens_per_s TPS mfu X peak_mib P loss L\n"
    "    (P: the device allocator's most bytes in use over the mode's warm-up and timed\n"
    "    steps in MiB, fsdp_device_memory_stats' peak_in_use after a reset before them)\n"
    "  counts libfsdp SHAPE MODE step launches N host_waits W   (the last timed step's,\n"
    "    before the synchronize that ends it: docs/device.md 'Launches and host waits')\n"
    "  skip libfsdp SHAPE MODE: REASON\n"
    "--breakdown: then N more steps (--breakdown-steps N, default 5; it implies --breakdown)\n"
    "that synchronise the device at every hook point of the timed modules, and per part\n"
    "(embedding, input_norm, attn_proj, attn_core, post_attn_norm, mlp_proj, mlp_rest,\n"
    "residual, final_norm, lm_head, loss, optimizer, other) the median of its forward and\n"
    "backward time (loss and optimizer: one call each, its time as fwd_ms):\n"
    "  breakdown libfsdp SHAPE MODE PART fwd_ms X bwd_ms Y share Z\n"
    "  breakdown libfsdp SHAPE MODE total step_ms X parts_ms Y timed_step_ms Z steps N\n"
    "    idle_sync_us S loss L   (one line)\n"
    "and the launches of the last breakdown step per part, and its launches and host waits\n"
    "less the breakdown's own synchronizes (the same as a timed step's):\n"
    "  counts libfsdp SHAPE MODE PART launches_fwd X launches_bwd Y\n"
    "  counts libfsdp SHAPE MODE breakdown_step launches N host_waits W\n"
    "or a line saying it skipped when the device is missing. --checkpoint: every decoder\n"
    "layer checkpointed (fsdp_checkpoint_wrap: its activations freed after its forward and\n"
    "recomputed in its backward); MODE is then written f32+ckpt, tf32+ckpt, bf16+ckpt.\n"
    "--checkpoint with --breakdown is refused (exit 2): the breakdown's hooks would time each\n"
    "layer's recompute, which runs in backward, as forward time. Writes no file.\n"
    "exit status: 0 done or skipped; 1 a library call failed; 2 bad command line\n";

/* The mode as the output lines write it. */
static const char *mode_name(const opts *o, int mode) {
    return o->checkpoint ? MODES_CKPT[mode] : MODES[mode];
}

/* Sets on[i] for each comma-separated name of names[] in list; false on an unknown name. */
static void parse_list(const char *list, const char *const *names, int n, bool *on) {
    memset(on, 0, (size_t)n * sizeof *on);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int i = 0;
        while (i < n && strcmp(tok, names[i])) i++;
        if (i == n) bench_cli_fail(NAME, usage, "unknown name '%s' in '%s'", tok, list);
        on[i] = true;
    }
}

static void parse(int argc, char **argv, opts *o) {
    *o = (opts){.dev = {FSDP_DEVICE_CUDA, 0}, .steps = 10, .warmup = 2, .budget_s = 600};
    o->shape_on[0] = o->shape_on[1] = true;
    for (int m = 0; m < N_MODES; m++) o->mode_on[m] = true;
    const char *shape_names[N_SHAPES];
    for (int s = 0; s < N_SHAPES; s++) shape_names[s] = SHAPES[s].name;
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--print-peaks")) {
            o->print_peaks = true;
            continue;
        }
        if (!strcmp(a, "--breakdown")) {
            o->breakdown_steps = o->breakdown_steps ? o->breakdown_steps : 5;
            continue;
        }
        if (!strcmp(a, "--checkpoint")) {
            o->checkpoint = true;
            continue;
        }
        bool known = !strcmp(a, "--device") || !strcmp(a, "--shapes") || !strcmp(a, "--modes") ||
                     !strcmp(a, "--steps") || !strcmp(a, "--warmup") ||
                     !strcmp(a, "--breakdown-steps") || !strcmp(a, "--budget-s") ||
                     !strcmp(a, "--peaks");
        if (!known) bench_cli_fail(NAME, usage, "unknown argument '%s'", a);
        const char *v = bench_cli_value(NAME, usage, argc, argv, &i);
        if (!strcmp(a, "--device")) {
            if (strcmp(v, "cuda") && strcmp(v, "sim"))
                bench_cli_fail(NAME, usage, "--device takes cuda or sim, got '%s'", v);
            o->dev.type = strcmp(v, "sim") ? FSDP_DEVICE_CUDA : FSDP_DEVICE_SIM;
        } else if (!strcmp(a, "--shapes")) {
            parse_list(v, shape_names, N_SHAPES, o->shape_on);
        } else if (!strcmp(a, "--modes")) {
            parse_list(v, MODES, N_MODES, o->mode_on);
        } else if (!strcmp(a, "--steps")) {
            o->steps = (int)bench_cli_int(NAME, usage, a, v, 1, MAX_STEPS);
        } else if (!strcmp(a, "--warmup")) {
            o->warmup = (int)bench_cli_int(NAME, usage, a, v, 1, 100);
        } else if (!strcmp(a, "--breakdown-steps")) {
            o->breakdown_steps = (int)bench_cli_int(NAME, usage, a, v, 1, 100);
        } else if (!strcmp(a, "--budget-s")) {
            char *end;
            o->budget_s = strtod(v, &end);
            if (end == v || *end || !(o->budget_s > 0))
                bench_cli_fail(NAME, usage, "--budget-s wants seconds > 0, got '%s'", v);
        } else {
            double *p = o->peak_tflops;
            char tail;
            o->peaks_given = true;
            if (sscanf(v, "%lf,%lf,%lf%c", &p[0], &p[1], &p[2], &tail) != 3)
                bench_cli_fail(NAME, usage, "--peaks wants three numbers F32,TF32,BF16, got '%s'",
                               v);
        }
    }
    if (o->checkpoint && o->breakdown_steps)
        bench_cli_fail(NAME, usage,
                       "--checkpoint with --breakdown is not supported: the breakdown's hooks "
                       "would time each layer's recompute, which runs in backward, as forward "
                       "time; run them separately");
}

typedef struct run {
    fsdp_ctx *ctx;
    fsdp_device dev;
    fsdp_module *model;
    fsdp_optimizer *opt;
    fsdp_tensor *tokens, *dlogits;
    int32_t *targets; /* host: the next token, the last of each row ignored */
    float loss;
    double flops;              /* per token of a step (fsdp_llama_flops_per_token: 6N + 12 L d T) */
    fsdp_launch_counts counts; /* the last step's, before its closing synchronize */
    llama_breakdown *bd;       /* while the breakdown's steps run */
} run;

static void run_free(run *r) {
    fsdp_tensor_free(r->dlogits);
    fsdp_tensor_free(r->tokens);
    fsdp_optimizer_free(r->opt);
    fsdp_module_free(r->model);
    free(r->targets);
    *r = (run){.ctx = r->ctx, .dev = r->dev};
}

/* Checkpoints every decoder layer of the model ("model.layers.N", Hugging Face's names). */
static fsdp_status checkpoint_layers(fsdp_ctx *ctx, fsdp_module *model) {
    fsdp_module *layers = fsdp_module_find(model, "model.layers");
    int n = layers ? fsdp_module_num_children(layers) : 0;
    if (n < 1) {
        fprintf(stderr, "bench_llama_gpu: the model has no decoder layers under 'model.layers'\n");
        return FSDP_ERR_NOT_FOUND;
    }
    for (int l = 0; l < n; l++) TRY(fsdp_checkpoint_wrap(ctx, fsdp_module_child(layers, l)));
    return FSDP_OK;
}

/* The model (initialised on the CPU, then moved; its decoder layers checkpointed when
 * checkpoint), its AdamW and a batch of tokens on r->dev. */
static fsdp_status run_build(run *r, const shape *s, bool checkpoint) {
    fsdp_ctx *ctx = r->ctx;
    fsdp_llama_config cfg = {.dim = s->dim,
                             .n_layers = s->layers,
                             .n_heads = s->heads,
                             .n_kv_heads = s->kv_heads,
                             .vocab_size = s->vocab,
                             .ffn_hidden = s->ffn,
                             .max_seq_len = s->seq,
                             /* bf16 logits in the bf16 mode (autocast's); time_mode sets each
                              * mode's policy, and under f32 compute the logits are f32 */
                             .compute_dtype = FSDP_DTYPE_BF16,
                             .logits_dtype = FSDP_DTYPE_BF16};
    int64_t n = (int64_t)s->batch * s->seq;
    fsdp_tensor *host = NULL;
    r->targets = malloc((size_t)n * sizeof *r->targets);
    if (!r->targets) {
        fprintf(stderr, "bench_llama_gpu: cannot allocate %lld targets\n", (long long)n);
        return FSDP_ERR_INTERNAL;
    }
    TRY(fsdp_model_llama(ctx, &cfg, &r->model));
    TRY(fsdp_llama_flops_per_token(ctx, &cfg, s->seq, &r->flops));
    TRY(fsdp_module_to(ctx, r->model, r->dev));
    if (checkpoint) TRY(checkpoint_layers(ctx, r->model));
    TRY(fsdp_adamw_create(ctx, r->model, &(fsdp_adam_options){.lr = 1e-4, .weight_decay = 0.01},
                          &r->opt));
    int64_t shp[2] = {s->batch, s->seq};
    TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 2, shp, &host));
    int32_t *ids = fsdp_tensor_data(host);
    uint32_t lcg = 12345;
    for (int64_t i = 0; i < n; i++) {
        lcg = lcg * 1664525u + 1013904223u;
        ids[i] = (int32_t)((lcg >> 8) % (uint32_t)s->vocab);
    }
    for (int64_t i = 0; i < n; i++)
        r->targets[i] = (i + 1) % s->seq ? ids[i + 1] : FSDP_IGNORE_INDEX;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, r->dev, 2, shp, &r->tokens);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, r->tokens, host);
    fsdp_tensor_free(host);
    return st;
}

/* One step, ended by a device synchronize; its seconds to *secs, its launches and host waits
 * before that synchronize to r->counts. With r->bd its phases are marked (without, the marks do
 * nothing). */
static fsdp_status run_step(run *r, double *secs) {
    fsdp_ctx *ctx = r->ctx;
    double t0 = bench_now();
    fsdp_launch_counts c0 = fsdp_kernels_counts(r->dev);
    const fsdp_tensor *logits;
    TRY(llama_breakdown_mark(ctx, r->bd, LLAMA_BD_START));
    TRY(fsdp_optimizer_zero_grad(ctx, r->opt));
    TRY(fsdp_module_forward(ctx, r->model, r->tokens, &logits));
    TRY(llama_breakdown_mark(ctx, r->bd, LLAMA_BD_FORWARD_DONE));
    if (r->dlogits && fsdp_tensor_dtype(r->dlogits) != fsdp_tensor_dtype(logits)) {
        fsdp_tensor_free(r->dlogits); /* another mode's: the gradient's dtype is the logits' */
        r->dlogits = NULL;
    }
    if (!r->dlogits) TRY(fsdp_tensor_create_like(ctx, logits, &r->dlogits));
    TRY(fsdp_loss_cross_entropy_ignore(ctx, logits, r->targets, FSDP_IGNORE_INDEX, &r->loss,
                                       r->dlogits));
    TRY(llama_breakdown_mark(ctx, r->bd, LLAMA_BD_LOSS_DONE));
    TRY(fsdp_module_backward(ctx, r->model, r->dlogits, NULL));
    TRY(llama_breakdown_mark(ctx, r->bd, LLAMA_BD_BACKWARD_DONE));
    TRY(fsdp_optimizer_step(ctx, r->opt));
    fsdp_launch_counts c1 = fsdp_kernels_counts(r->dev);
    r->counts = (fsdp_launch_counts){c1.launches - c0.launches, c1.host_waits - c0.host_waits};
    TRY(fsdp_device_synchronize(ctx, r->dev));
    TRY(llama_breakdown_mark(ctx, r->bd, LLAMA_BD_END));
    *secs = bench_now() - t0;
    return FSDP_OK;
}

/* Why a mode cannot run on this device, or NULL. */
static const char *mode_unavailable(const opts *o, int mode) {
    if (mode == 1 && o->dev.type != FSDP_DEVICE_CUDA)
        return "TF32 is a CUDA tensor-core mode; this device has none";
    return NULL;
}

/* The breakdown's steps of one mode after its timed steps (a median step of `sec` seconds), or
 * a skip line when they would pass the deadline: the hooks are removed after, also on failure. */
static fsdp_status breakdown_mode(run *r, const opts *o, const shape *s, int mode, double deadline,
                                  double sec) {
    /* the synchronising hooks make a step slower: twice the timed one is the estimate */
    double need = 2 * sec * o->breakdown_steps, left = deadline - bench_now();
    if (need > left) {
        printf("skip libfsdp %s %s breakdown: %d steps need about %.0f s; %.0f s of the budget "
               "are left\n",
               s->name, mode_name(o, mode), o->breakdown_steps, need, left > 0 ? left : 0);
        return FSDP_OK;
    }
    TRY(llama_breakdown_attach(r->ctx, r->model, r->dev, o->breakdown_steps, &r->bd));
    fsdp_status st = FSDP_OK;
    double secs;
    for (int i = 0; st == FSDP_OK && i < o->breakdown_steps; i++) st = run_step(r, &secs);
    llama_bd_report rep;
    if (st == FSDP_OK) llama_breakdown_report(r->bd, &rep);
    fsdp_status st_detach = llama_breakdown_detach(r->ctx, r->bd);
    r->bd = NULL;
    if (st == FSDP_OK) {
        llama_breakdown_print(&rep, s->name, mode_name(o, mode), 1e3 * sec, r->loss);
        llama_breakdown_print_counts(&rep, s->name, mode_name(o, mode), r->counts);
    }
    return st != FSDP_OK ? st : st_detach;
}

/* The warm-up, then the timed steps of one mode, or a skip line when they would pass the
 * deadline. Returns non-OK only for a failure of the library. */
static fsdp_status time_mode(run *r, const opts *o, const shape *s, int mode, double deadline) {
    fsdp_ctx *ctx = r->ctx;
    if (r->dev.type == FSDP_DEVICE_CUDA) TRY(fsdp_cuda_set_allow_tf32(ctx, mode == 1));
    TRY(fsdp_module_set_autocast(ctx, r->model, mode == 2 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32));
    double t[MAX_STEPS], last = 0;
    /* the peak over this mode's warm-up and timed steps (torch.cuda.reset_peak_memory_stats) */
    TRY(fsdp_device_reset_peak_memory(ctx, r->dev));
    for (int w = 0; w < o->warmup; w++) TRY(run_step(r, &last));
    double left = deadline - bench_now();
    if (last * o->steps > left) {
        printf("skip libfsdp %s %s: a step takes %.2f s, so %d steps need %.0f s; %.0f s of the "
               "budget are left\n",
               s->name, mode_name(o, mode), last, o->steps, last * o->steps, left > 0 ? left : 0);
        return FSDP_OK;
    }
    for (int i = 0; i < o->steps; i++) TRY(run_step(r, &t[i]));
    double sec = bench_median(t, o->steps), tps = (double)s->batch * s->seq / sec;
    double peak = o->peak_tflops[mode];
    char mfu[32] = "n/a";
    if (peak > 0) snprintf(mfu, sizeof mfu, "%.4f", tps * r->flops / (peak * 1e12));
    fsdp_device_memory mem;
    TRY(fsdp_device_memory_stats(ctx, r->dev, &mem));
    printf("result libfsdp %s %s step_ms %.2f tokens_per_s %.1f mfu %s peak_mib %.1f loss %.9g\n",
           s->name, mode_name(o, mode), 1e3 * sec, tps, mfu, (double)mem.peak_in_use / (1 << 20),
           (double)r->loss);
    printf("counts libfsdp %s %s step launches %lld host_waits %lld\n", s->name, mode_name(o, mode),
           (long long)r->counts.launches, (long long)r->counts.host_waits);
    return o->breakdown_steps ? breakdown_mode(r, o, s, mode, deadline, sec) : FSDP_OK;
}

/* Every selected mode of one shape, on one model (the modes continue its training). */
static fsdp_status time_shape(fsdp_ctx *ctx, const opts *o, const shape *s, double deadline) {
    run r = {.ctx = ctx, .dev = o->dev};
    bool any = false;
    for (int m = 0; m < N_MODES; m++) {
        if (!o->mode_on[m]) continue;
        const char *why = mode_unavailable(o, m);
        if (why) printf("skip libfsdp %s %s: %s\n", s->name, mode_name(o, m), why);
        any |= !why;
    }
    if (!any) return FSDP_OK;
    double t0 = bench_now();
    if (deadline - t0 < 10) {
        printf("skip libfsdp %s: %.0f s of the budget left, too few to build it\n", s->name,
               deadline - t0 > 0 ? deadline - t0 : 0);
        return FSDP_OK;
    }
    fsdp_status st = run_build(&r, s, o->checkpoint);
    if (st == FSDP_ERR_OUT_OF_MEMORY) {
        printf("skip libfsdp %s: out of device memory building it: %s\n", s->name,
               fsdp_last_error(ctx));
        run_free(&r);
        return FSDP_OK;
    }
    int64_t params = r.model ? fsdp_module_param_count(r.model) : 0;
    if (st == FSDP_OK)
        printf("libfsdp %s: %.1f M parameters, batch %d x seq %d, built and moved to %s:%d in "
               "%.1f s, FLOP/token 6N + 12 L d T = %.4g\n",
               s->name, (double)params / 1e6, s->batch, s->seq, fsdp_device_to_string(o->dev),
               o->dev.index, bench_now() - t0, r.flops);
    /* bf16 first (the goals' mode), then TF32 and f32: a budget that runs out loses the least */
    static const int order[N_MODES] = {2, 1, 0};
    for (int i = 0; st == FSDP_OK && i < N_MODES; i++) {
        int m = order[i];
        if (o->mode_on[m] && !mode_unavailable(o, m)) {
            if (bench_now() >= deadline)
                printf("skip libfsdp %s %s: the budget of %.0f s is spent\n", s->name,
                       mode_name(o, m), o->budget_s);
            else
                st = time_mode(&r, o, s, m, deadline);
        }
    }
    if (st == FSDP_ERR_OUT_OF_MEMORY) {
        printf("skip libfsdp %s: out of device memory: %s\n", s->name, fsdp_last_error(ctx));
        st = FSDP_OK;
    }
    run_free(&r);
    return st;
}

int main(int argc, char **argv) {
    opts o;
    parse(argc, argv, &o);
    double deadline = bench_now() + o.budget_s;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line out as it is made: a timeout keeps them */
    if (fsdp_device_count(o.dev.type) == 0) {
        printf("bench_llama_gpu: skipped: no %s device in this build or on this machine\n",
               fsdp_device_to_string(o.dev));
        return 0;
    }
    fsdp_ctx *ctx;
    if (fsdp_ctx_create(&(fsdp_ctx_options){.seed = 1}, &ctx) != FSDP_OK) return 1;
    printf("libfsdp llama on %s:%d: AdamW (lr 1e-4, weight decay 0.01), %d warm-up + median of %d "
           "timed steps, budget %.0f s%s\n",
           fsdp_device_to_string(o.dev), o.dev.index, o.warmup, o.steps, o.budget_s,
           o.checkpoint ? ", every decoder layer checkpointed" : "");
    fsdp_status st = FSDP_OK;
    double *peaks = o.peak_tflops;
    if (!o.peaks_given) { /* the device's own figures (zeros where libfsdp has none) */
        fsdp_device_properties p;
        st = fsdp_device_get_properties(ctx, o.dev, &p);
        peaks[0] = p.peak_tflops_f32, peaks[1] = p.peak_tflops_tf32, peaks[2] = p.peak_tflops_bf16;
        printf("peaks of %s (TFLOP/s f32,tf32,bf16): %g,%g,%g\n", p.name, peaks[0], peaks[1],
               peaks[2]);
    }
    if (o.print_peaks) {
        fsdp_ctx_free(ctx);
        return st == FSDP_OK ? 0 : 1;
    }
    for (int s = 0; st == FSDP_OK && s < N_SHAPES; s++)
        if (o.shape_on[s]) st = time_shape(ctx, &o, &SHAPES[s], deadline);
    if (st != FSDP_OK) fprintf(stderr, "bench_llama_gpu: %s\n", fsdp_last_error(ctx));
    fsdp_ctx_free(ctx);
    return st == FSDP_OK ? 0 : 1;
}
