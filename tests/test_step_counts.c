/* test_step_counts.c: the launches and host waits of one steady-state training step, pinned per
 * phase as test_llama_2d pins its collectives (kernels.h fsdp_launch_counts; docs/device.md
 * "Launches and host waits"). The tiny Llama (tests/tiny_llama.c) on the run's device, AdamW:
 * zero_grad, forward, cross-entropy with ignored targets, backward, optimizer step, under the
 * bf16 policy and in f32, plain and with every decoder layer checkpointed; and the stacked MLP
 * under FSDP on two rank threads, each on its own sim device. A warm-up step first (the
 * optimizer's state, the gradients and the layers' buffers are made there), then one step
 * counted. On sim both counts are pinned exactly; on CUDA (label gpu), which counts its own
 * launches (a table entry may launch a few, cuda.h), the host waits are pinned and the launches
 * printed. Two observers show that the counts see what a layer adds: one that synchronizes the
 * device after every decoder layer's forward, one that fills a scratch tensor there. */
#include <stdio.h>

#include "harness.h"         // defines: fsdp_test_run, fsdp_test_ctx, fsdp_test_run_world
#include "kernels/kernels.h" // defines: fsdp_kernels_counts, fsdp_kernels_counts_reset
#include "kernels/sim/sim.h" // defines: fsdp_sim_memory_stats_get
#include "on_device.h"       // defines: fsdp_test_device
#include "stacked_batches.h" // defines: stacked_batch_rows, STACKED_BATCH
#include "tiny_llama.h"      // defines: tiny_model, tiny_tokens, TINY_*

enum { PH_ZERO_GRAD, PH_FORWARD, PH_LOSS, PH_BACKWARD, PH_OPTIMIZER, PHASES };
static const char *const PHASE_NAMES[PHASES] = {"zero_grad", "forward", "loss", "backward",
                                                "optimizer"};

typedef struct phase_counts {
    int64_t launches[PHASES], host_waits[PHASES];
    int64_t
        allocs[PHASES]; /* on sim: allocations (fsdp_sim_memory_stats_get), printed, not pinned */
} phase_counts;

/* ---- the tiny Llama on one device ---- */

typedef struct llama_pin {
    const char *name;
    fsdp_dtype compute;
    bool ckpt;
    phase_counts want; /* on sim */
} llama_pin;

/* The pins, per phase: {zero_grad, forward, loss, backward, optimizer}.
 *
 * Host waits: one a step, in the loss. fsdp_loss_cross_entropy_ignore hands the loss to the host
 * as a float (the table's cross_entropy_ignore is an entry that returns to the host: sim enqueues
 * and waits, CUDA copies the total back and synchronizes), and the caller reads it at once. No
 * other phase blocks the host: zero_grad fills, the forward and backward queue kernels and
 * allocate from the cache (a block freed on this stream is reused in stream order, no wait),
 * checkpointing recomputes in the backward on the same stream, and AdamW queues its updates
 * (its step count is host state). A pin that rises here is a new stall of the GPU's queue.
 *
 * Launches are regression pins, read from a run (the sim counts one per table entry, fill,
 * conversion, allocation's zeroing and copy): a change that fuses or adds kernels changes them,
 * and updates them here on purpose, saying why in its commit. What they hold now:
 * - zero_grad and the optimizer: one launch each, a multi-tensor fill_multi and
 *   adam_update_multi over the 21 parameters (the embedding, 9 per decoder layer, the final
 *   norm, lm_head: one device, one group, under FSDP_ADAM_MULTI_CHUNK); the per-tensor entries
 *   took 21 each;
 * - loss: 2, the entry, and the copy that stages the targets (host memory) on the device each
 *   call into a fresh tensor (fsdp_tensor_create_uninit: not zeroed, the copy writes it whole);
 * - forward and backward: the layers' kernels. Under the bf16 policy the 15 Linears read their
 *   weights' bf16 mirrors, which AdamW's step wrote in its pass (src/nn/mirror.c): the forward
 *   converts no weight (it converted all 15 before mirrors, 47 launches), 1 launch more than in
 *   f32;
 * - checkpointed: the forward releases a layer's activations, so it and the backward's recompute
 *   allocate them again (40 allocations in the f32 forward, 44 in bf16), not zeroed (the layers
 *   write their buffers whole: fsdp_nn_buffer); the forward's 2 launches more are one copy of
 *   each layer's output, the backward's 28 the two layers' recomputed forwards. Each allocation
 *   was zeroed before (a memset on CUDA: forward 73 f32 and 78 bf16, backward 112 and 122). A
 *   mirror is the parameter's, not an activation: before mirrors the 14 layer Linears' weight
 *   copies were released too, allocated and converted again in the forward and the recompute
 *   (bf16 forward 107, backward 150). */
#define PIN(l0, l1, l2, l3, l4)                                                                    \
    {                                                                                              \
        .launches = {l0, l1, l2, l3, l4}, .host_waits = { 0, 0, 1, 0, 0 }                          \
    }
static const llama_pin LLAMA_PINNED[] = {
    {"bf16", FSDP_DTYPE_BF16, false, PIN(1, 32, 2, 52, 1)},
    {"bf16 checkpointed", FSDP_DTYPE_BF16, true, PIN(1, 34, 2, 80, 1)},
    {"f32", FSDP_DTYPE_F32, false, PIN(1, 31, 2, 46, 1)},
    {"f32 checkpointed", FSDP_DTYPE_F32, true, PIN(1, 33, 2, 74, 1)},
};
#define N_LLAMA (int)(sizeof LLAMA_PINNED / sizeof LLAMA_PINNED[0])

/* The allocations made on dev so far (sim only; 0 elsewhere). */
static int64_t allocs_of(fsdp_device dev) {
    if (dev.type != FSDP_DEVICE_SIM) return 0;
    fsdp_device_memory m = fsdp_sim_memory_stats_get(dev.index);
    return m.device_allocs + m.cache_hits;
}

/* The counts of dev since the last mark into phase ph, and a new mark. */
static void take(fsdp_device dev, phase_counts *c, int ph, int64_t *allocs) {
    fsdp_launch_counts n = fsdp_kernels_counts(dev);
    c->launches[ph] = n.launches;
    c->host_waits[ph] = n.host_waits;
    fsdp_kernels_counts_reset(dev);
    int64_t now = allocs_of(dev);
    c->allocs[ph] = now - *allocs;
    *allocs = now;
}

typedef struct llama_run {
    fsdp_module *m;
    fsdp_optimizer *opt;
    fsdp_tensor *tokens, *dlogits;
    int32_t targets[TINY_TOKENS];
    float loss;
} llama_run;

/* One training step of r on dev; with c, its counts per phase. */
static fsdp_status llama_step(fsdp_ctx *ctx, llama_run *r, fsdp_device dev, phase_counts *c) {
    const fsdp_tensor *logits = NULL;
    int64_t allocs = allocs_of(dev);
    if (c) fsdp_kernels_counts_reset(dev);
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, r->opt));
    if (c) take(dev, c, PH_ZERO_GRAD, &allocs);
    FSDP_TRY(fsdp_module_forward(ctx, r->m, r->tokens, &logits));
    if (c) take(dev, c, PH_FORWARD, &allocs);
    if (!r->dlogits) FSDP_TRY(fsdp_tensor_create_like(ctx, logits, &r->dlogits));
    FSDP_TRY(fsdp_loss_cross_entropy_ignore(ctx, logits, r->targets, FSDP_IGNORE_INDEX, &r->loss,
                                            r->dlogits));
    if (c) take(dev, c, PH_LOSS, &allocs);
    FSDP_TRY(fsdp_module_backward(ctx, r->m, r->dlogits, NULL));
    if (c) take(dev, c, PH_BACKWARD, &allocs);
    FSDP_TRY(fsdp_optimizer_step(ctx, r->opt));
    if (c) take(dev, c, PH_OPTIMIZER, &allocs);
    return FSDP_OK;
}

static void print_counts(const char *what, const phase_counts *c) {
    int64_t l = 0, w = 0;
    printf("\n    %s:", what);
    for (int ph = 0; ph < PHASES; ph++) {
        printf(" %s %lld/%lld/%lld", PHASE_NAMES[ph], (long long)c->launches[ph],
               (long long)c->host_waits[ph], (long long)c->allocs[ph]);
        l += c->launches[ph], w += c->host_waits[ph];
    }
    printf(" (launches/host waits/allocations); step %lld/%lld", (long long)l, (long long)w);
}

/* Whether got is want: the host waits always, the launches where the counts are sim's. */
static bool same_counts(const phase_counts *got, const phase_counts *want, bool launches) {
    bool same = true;
    for (int ph = 0; ph < PHASES; ph++) {
        if (got->host_waits[ph] != want->host_waits[ph]) {
            printf("\n      %s: %lld host waits, pinned %lld", PHASE_NAMES[ph],
                   (long long)got->host_waits[ph], (long long)want->host_waits[ph]);
            same = false;
        }
        if (launches && got->launches[ph] != want->launches[ph]) {
            printf("\n      %s: %lld launches, pinned %lld", PHASE_NAMES[ph],
                   (long long)got->launches[ph], (long long)want->launches[ph]);
            same = false;
        }
    }
    return same;
}

/* What the planted observers act on: the device, and a scratch tensor there. */
typedef struct hook_user {
    fsdp_device dev;
    fsdp_tensor *scratch;
} hook_user;

/* The model of p on dev with AdamW and batch 0, one warm-up step, then a counted step into c.
 * With `hook`, an observer at every decoder layer's post-forward (user: dev). */
static void llama_counts(const llama_pin *p, fsdp_device dev, fsdp_hook_fn hook, phase_counts *c) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    llama_run r = {.m = tiny_model(p->compute, dev, p->ckpt)};
    FSDP_TEST_OK(fsdp_adamw_create(ctx, r.m, &(fsdp_adam_options){.lr = 1e-3, .weight_decay = 0.01},
                                   &r.opt));
    FSDP_TEST_OK(tiny_tokens(ctx, dev, 0, r.targets, &r.tokens));
    hook_user u = {.dev = dev};
    if (hook)
        FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 1, (int64_t[]){8}, &u.scratch));
    for (int l = 0; hook && l < TINY_LAYERS; l++) {
        char name[32];
        snprintf(name, sizeof name, "model.layers.%d", l);
        FSDP_TEST_OK(fsdp_module_add_observer(ctx, fsdp_module_find(r.m, name),
                                              FSDP_HOOK_POST_FORWARD, hook, &u, NULL, NULL));
    }
    FSDP_TEST_OK(llama_step(ctx, &r, dev, NULL));
    FSDP_TEST_OK(llama_step(ctx, &r, dev, c));
    printf("\n    %s on %s: loss %.6g", p->name, fsdp_device_to_string(dev), r.loss);
    fsdp_tensor_free(r.dlogits);
    fsdp_tensor_free(r.tokens);
    fsdp_tensor_free(u.scratch);
    fsdp_optimizer_free(r.opt);
    fsdp_module_free(r.m);
}

static void test_llama(void) {
    fsdp_device dev = fsdp_test_device();
    bool sim = dev.type == FSDP_DEVICE_SIM;
    for (int i = 0; i < N_LLAMA; i++) {
        phase_counts c;
        llama_counts(&LLAMA_PINNED[i], dev, NULL, &c);
        print_counts(LLAMA_PINNED[i].name, &c);
        CU_ASSERT_TRUE(same_counts(&c, &LLAMA_PINNED[i].want, sim));
    }
}

/* ---- the counts see what a layer adds ---- */

static fsdp_status sync_after(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                              const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    return fsdp_device_synchronize(ctx, ((hook_user *)user)->dev);
}

static fsdp_status fill_after(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                              const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    return fsdp_tensor_fill(ctx, ((hook_user *)user)->scratch, 1.0f);
}

/* A synchronize after each decoder layer's forward adds TINY_LAYERS host waits to the forward
 * and nothing else; a fill there adds TINY_LAYERS launches. */
static void test_planted(void) {
    fsdp_device dev = fsdp_test_device();
    const llama_pin *p = &LLAMA_PINNED[0];
    phase_counts base, synced, filled;
    llama_counts(p, dev, NULL, &base);
    llama_counts(p, dev, sync_after, &synced);
    llama_counts(p, dev, fill_after, &filled);
    print_counts("unhooked", &base);
    print_counts("a synchronize after each layer", &synced);
    print_counts("a fill after each layer", &filled);
    phase_counts want = base;
    want.host_waits[PH_FORWARD] += TINY_LAYERS;
    CU_ASSERT_TRUE(same_counts(&synced, &want, true));
    CU_ASSERT_FALSE(same_counts(&synced, &p->want, false));
    want = base;
    want.launches[PH_FORWARD] += TINY_LAYERS;
    CU_ASSERT_TRUE(same_counts(&filled, &want, true));
}

/* ---- the stacked MLP under FSDP on two rank threads ---- */

enum { MLP_LAYERS = 3, MLP_WORLD = 2, MLP_ROWS = STACKED_BATCH / MLP_WORLD };

/* Per rank (each on its own sim device, whose counts are then its own; on sim in every mode), the
 * pins per phase. Host waits: one a step, in the loss (fsdp_loss_mse hands the loss to the
 * host). FSDP's all_gathers and reduce_scatters on the local backend wait on the device, not on
 * the host: each reader's stream waits on its peers' events and the work completes in stream
 * order (docs/device.md). Launches (regression pins, as the Llama's): zero_grad and the optimizer
 * one each, a multi-tensor call over the units' flat gradients and shards (3 units, one per
 * layer; the root holds none), which took one per unit before. */
static const phase_counts MLP_PINNED = PIN(1, 15, 1, 32, 1);

typedef struct mlp_world {
    phase_counts out[MLP_WORLD];
} mlp_world;

static fsdp_status mlp_rank(fsdp_ctx *ctx, int rank, void *user) {
    mlp_world *w = user;
    fsdp_device dev = {FSDP_DEVICE_SIM, rank};
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_tensor *xh = NULL, *yh = NULL, *x = NULL, *y = NULL, *dy = NULL;
    static const char *const units[MLP_LAYERS] = {"layers.0", "layers.1", "layers.2"};
    fsdp_status st = fsdp_ctx_set_device(ctx, dev);
    if (st == FSDP_OK) st = fsdp_model_mlp_stacked(ctx, MLP_LAYERS, &m);
    if (st == FSDP_OK) st = fsdp_module_to(ctx, m, dev);
    if (st == FSDP_OK)
        st = fsdp_fully_shard(
            ctx, m, &(fsdp_fully_shard_options){.wrap_paths = units, .n_wrap_paths = MLP_LAYERS},
            &sh);
    if (st == FSDP_OK)
        st = fsdp_adamw_create(ctx, fsdp_sharded_flat_params(sh),
                               &(fsdp_adam_options){.lr = 1e-3, .weight_decay = 0.01}, &opt);
    int64_t off = rank * MLP_ROWS;
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 100, off, MLP_ROWS, &xh);
    if (st == FSDP_OK) st = stacked_batch_rows(ctx, 101, off, MLP_ROWS, &yh);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, fsdp_tensor_shape(xh), &x);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, x, xh);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 2, fsdp_tensor_shape(yh), &y);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, y, yh);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, y, &dy);
    for (int step = 0; st == FSDP_OK && step < 2; step++) {
        phase_counts *c = step == 1 ? &w->out[rank] : NULL;
        int64_t allocs = allocs_of(dev);
        const fsdp_tensor *out = NULL;
        float loss = 0;
        if (c) fsdp_kernels_counts_reset(dev);
        st = fsdp_optimizer_zero_grad(ctx, opt);
        if (c) take(dev, c, PH_ZERO_GRAD, &allocs);
        if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, x, &out);
        if (c) take(dev, c, PH_FORWARD, &allocs);
        if (st == FSDP_OK) st = fsdp_loss_mse(ctx, out, y, &loss, dy);
        if (c) take(dev, c, PH_LOSS, &allocs);
        if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dy, NULL);
        if (c) take(dev, c, PH_BACKWARD, &allocs);
        if (st == FSDP_OK) st = fsdp_optimizer_step(ctx, opt);
        if (c) take(dev, c, PH_OPTIMIZER, &allocs);
    }
    fsdp_tensor *all[] = {xh, yh, x, y, dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fsdp_tensor_free(all[i]);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static void test_mlp_fsdp(void) {
    mlp_world w = {0};
    FSDP_TEST_OK(fsdp_test_run_world(MLP_WORLD, 60000, mlp_rank, &w));
    int first = 0, hosted = fsdp_test_hosted_ranks(MLP_WORLD, &first);
    for (int rank = first; rank < first + hosted; rank++) {
        char what[48];
        snprintf(what, sizeof what, "rank %d on sim:%d", rank, rank);
        print_counts(what, &w.out[rank]);
        CU_ASSERT_TRUE(same_counts(&w.out[rank], &MLP_PINNED, true));
    }
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"llama", test_llama},
        {"planted", test_planted},
        {"mlp_fsdp", test_mlp_fsdp},
    };
    fsdp_test_device(); // chosen, and printed, before the first case
    return fsdp_test_run(argc, argv, "step_counts", cases, (int)(sizeof cases / sizeof cases[0]));
}
