/* test_train_plan.c: fsdp-train --plan (tools/train_estimate.h) against real runs of the same
 * configuration. For each layout (the MLP and the Llama at (dp, tp) = (2, 1) FULL_SHARD and
 * (2, 2) FSDP + TP, both with a unit per layer, and a few more options) the estimate is compared
 * with:
 *   - the collectives of step 2 that fsdp-train's own loop (train_run with [log] comm_debug)
 *     prints for rank 0: calls and bytes per op and mesh dim;
 *   - on every rank, a run of the same layout built here the way trainer.c builds it (the
 *     kind's model, its TP plan, checkpointing, fsdp_fully_shard, the optimizer, the kind's
 *     feed), two steps and a loss evaluation between them: fsdp_sharded_memory's shard_bytes
 *     (parameters and gradients) and peak_device_bytes (the pool's peak plus the shards), the
 *     optimizer's state tensors, and fsdp_module_activation_bytes right after the first
 *     forward, without and with activation checkpointing.
 * Every figure is a size or a count (no timing), and the estimate replays the pool's block rule
 * and the hooks' order, so each is required to equal the measured one exactly: stricter than the
 * 5% a plan could be allowed, and possible because these figures hold none of what the plan
 * leaves out (the model input, the loss's and backward's buffers, TP's hook-owned tensors,
 * evaluations, the allocator's overhead: docs/train.md, "Planning a run"). */
#define _POSIX_C_SOURCE 200809L // open_memstream

#include <inttypes.h> // defines: SCNd64
#include <jansson.h>
#include <math.h> // defines: ceil
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h> // defines: WIFEXITED, WEXITSTATUS

#include "harness.h"
#include "train_config.h"   // defines: train_config_init, train_config_set, train_layout_resolve
#include "train_estimate.h" // defines: train_estimate_make
#include "train_kind.h"     // defines: train_kind_of
#include "train_plan.h"     // defines: train_plan_checkpoint
#include "trainer.h"        // defines: train_run

static train_config g_cfg; /* large: keep it off the stack */

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

static bool configure(const char *const *base, const char *const *extra) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int k = 0; k < 2; k++)
        for (int i = 0; (k ? extra : base) && (k ? extra : base)[i]; i++)
            if (train_config_set(&g_cfg, (k ? extra : base)[i], err, sizeof err) != FSDP_OK) {
                printf("\n    %s", err);
                return false;
            }
    if (train_config_check(&g_cfg, err, sizeof err) == FSDP_OK) return true;
    printf("\n    %s", err);
    return false;
}

/* ---- what a real run measures, per rank ------------------------------------------------------
 */

#define MAX_RANKS 8

typedef struct measured {
    int64_t shard_bytes, device_bytes, optim_bytes, act_bytes;
} measured;

typedef struct harness {
    const train_config *cfg;
    train_layout layout;
    const void *input; /* the kind's data, loaded once */
    measured out[MAX_RANKS];
} harness;

static int64_t optimizer_bytes(fsdp_ctx *ctx, const fsdp_optimizer *opt) {
    int64_t n = 0;
    for (int i = 0; i < fsdp_optimizer_num_states(opt); i++) {
        fsdp_optim_state s;
        if (fsdp_optimizer_get_state(ctx, opt, i, &s) == FSDP_OK)
            n += (int64_t)fsdp_tensor_nbytes(s.value);
    }
    return n;
}

/* One step of the trainer's (trainer.c's train_step) on this rank's slices, reduced by the last
 * micro-batch's backward; act: the activation bytes after the first forward (or NULL). */
static fsdp_status step(fsdp_ctx *ctx, const harness *h, const train_kind *kind, void *feed,
                        fsdp_module *model, fsdp_sharded *sh, fsdp_replicate *rep,
                        fsdp_optimizer *opt, int64_t k0, int64_t micro, int64_t *act) {
    TRAIN_TRY(fsdp_optimizer_zero_grad(ctx, opt));
    int64_t n = h->cfg->train.grad_accum;
    for (int64_t m = 0; m < n; m++) {
        float loss;
        fsdp_tensor *dout = NULL;
        if (n > 1 && sh) fsdp_sharded_set_sync(sh, m == n - 1);
        if (n > 1 && rep) fsdp_replicate_set_sync(rep, m == n - 1);
        TRAIN_TRY(kind->step(ctx, feed, model, k0 + m * micro, &loss, &dout));
        if (act && m == 0) TRAIN_TRY(fsdp_module_activation_bytes(ctx, model, act));
        TRAIN_TRY(fsdp_module_backward(ctx, model, dout, NULL));
    }
    return fsdp_optimizer_step(ctx, opt);
}

static fsdp_status measure_rank(fsdp_ctx *ctx, int rank, void *user) {
    harness *h = user;
    const train_config *cfg = h->cfg;
    const train_layout *l = &h->layout;
    const train_kind *kind = train_kind_of(cfg);
    fsdp_mesh *mesh = NULL, *tp = NULL;
    fsdp_group *dp = NULL;
    fsdp_module *model = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    void *feed = NULL;
    const char *wrap[TRAIN_MAX_LAYERS];
    bool hybrid = cfg->parallel.strategy == FSDP_HYBRID_SHARD;
    fsdp_group *dp_owned = NULL, *shard = NULL, *replicate = NULL;
    fsdp_status st;
    if (hybrid) { /* (replicate, shard, tp), dp the replicate x shard ranks of a tp index */
        st = fsdp_mesh_create(ctx, 3, (int[]){l->replicas, l->shard, l->tp},
                              (const char *[]){"replicate", "shard", "tp"}, &mesh);
        if (st == FSDP_OK)
            st = fsdp_group_split(ctx, NULL, fsdp_mesh_coordinate(mesh, 2), fsdp_ctx_rank(ctx),
                                  "dp", &dp_owned);
        if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "shard", &shard);
        if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "replicate", &replicate);
        dp = dp_owned;
    } else {
        st = fsdp_mesh_create(ctx, 2, (int[]){l->dp, l->tp}, (const char *[]){"dp", "tp"}, &mesh);
        if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, mesh, "dp", &dp);
        shard = dp;
    }
    if (st == FSDP_OK) st = kind->build(ctx, cfg, false, &model);
    if (st == FSDP_OK && l->tp > 1) st = fsdp_mesh_dim(ctx, mesh, "tp", &tp);
    if (st == FSDP_OK && l->tp > 1) st = kind->parallelize(ctx, cfg, model, tp);
    if (st == FSDP_OK) st = train_plan_checkpoint(ctx, kind, cfg, model);
    fsdp_fully_shard_options o = {.strategy = cfg->parallel.strategy,
                                  .group = shard,
                                  .replicate_group = replicate,
                                  .offload_params = cfg->parallel.offload,
                                  .use_orig_params = cfg->parallel.use_orig_params,
                                  .comm_hook = {.kind = cfg->parallel.comm_hook},
                                  .mixed_precision = train_config_mixed_precision(cfg)};
    if (cfg->parallel.wrap == TRAIN_WRAP_LAYER)
        kind->wrap_layers(model, &o, wrap, TRAIN_MAX_LAYERS);
    fsdp_replicate *rep = NULL;
    bool replicas = cfg->parallel.mode == TRAIN_MODE_REPLICATE;
    double mb = cfg->parallel.bucket_mb;
    fsdp_replicate_options ro = {.group = dp,
                                 .src_rank = FSDP_NO_SRC_RANK,
                                 .bucket_bytes = mb > 0 ? (int64_t)ceil(mb * 1024 * 1024) : 0,
                                 .comm_hook = {.kind = cfg->parallel.comm_hook},
                                 .mixed_precision = train_config_mixed_precision(cfg)};
    if (st == FSDP_OK && replicas) st = fsdp_replicate_apply(ctx, model, &ro, &rep);
    if (st == FSDP_OK && !replicas) st = fsdp_fully_shard(ctx, model, &o, &sh);
    if (st == FSDP_OK) {
        fsdp_module *params = replicas ? model : fsdp_sharded_flat_params(sh);
        if (cfg->optim.name == TRAIN_OPTIM_SGD)
            st = fsdp_sgd_create(
                ctx, params,
                &(fsdp_sgd_options){.lr = cfg->optim.lr, .momentum = cfg->optim.momentum}, &opt);
        else
            st = fsdp_adamw_create(ctx, params, &(fsdp_adam_options){.lr = cfg->optim.lr}, &opt);
    }
    int64_t micro = cfg->data.batch_size / cfg->train.grad_accum;
    train_rank_env env = {.cfg = cfg,
                          .layout = l,
                          .mesh = mesh,
                          .dp = dp,
                          .dp_rank = rank / l->tp,
                          .tp_rank = rank % l->tp,
                          .micro = micro,
                          .input = h->input};
    train_feed_info info;
    if (st == FSDP_OK) st = kind->feed_create(ctx, &env, &feed, &info);
    measured *m = &h->out[rank];
    double loss, accuracy;
    /* the first step's forward shows the activations before anything else grew their buffers;
     * then the loss evaluation fsdp-train makes before training, and the second step */
    if (st == FSDP_OK) st = step(ctx, h, kind, feed, model, sh, rep, opt, 0, micro, &m->act_bytes);
    if (st == FSDP_OK) st = kind->loss(ctx, feed, model, false, &loss, &accuracy);
    if (st == FSDP_OK)
        st = step(ctx, h, kind, feed, model, sh, rep, opt, cfg->data.batch_size, micro, NULL);
    if (st == FSDP_OK && sh) {
        fsdp_memory_stats ms;
        fsdp_sharded_memory(sh, &ms);
        m->shard_bytes = ms.shard_bytes;
        m->device_bytes = ms.peak_device_bytes;
    }
    if (st == FSDP_OK && rep) { /* whole parameters and their gradients; no pool to read */
        m->shard_bytes = 2 * 4 * fsdp_module_param_count(model);
        m->device_bytes = -1;
    }
    if (st == FSDP_OK) m->optim_bytes = optimizer_bytes(ctx, opt);
    if (feed) kind->feed_free(feed);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(model);
    fsdp_group_free(dp_owned);
    fsdp_mesh_free(mesh);
    return st;
}

static bool measure(const train_config *cfg, const train_layout *l, measured *out) {
    const train_kind *kind = train_kind_of(cfg);
    harness *h = calloc(1, sizeof *h);
    char err[TRAIN_ERROR_SIZE] = "";
    void *input = NULL;
    bool ok = h && l->world <= MAX_RANKS;
    if (ok && kind->load && kind->load(cfg, &input, err, sizeof err) != FSDP_OK) {
        printf("\n    load: %s", err);
        ok = false;
    }
    if (ok) {
        *h = (harness){.cfg = cfg, .layout = *l, .input = input};
        ok = fsdp_test_run_world(l->world, 60000, measure_rank, h) == FSDP_OK;
        memcpy(out, h->out, sizeof h->out);
    }
    if (input && kind->unload) kind->unload(input);
    free(h);
    return ok;
}

/* ---- what fsdp-train's loop counts (rank 0, step 2) ------------------------------------------
 */

typedef struct table_row {
    char op[24], dim[16];
    int64_t calls, bytes;
} table_row;

/* Runs fsdp-train's loop for two steps with [log] comm_debug and adds up its table by op and
 * dim into rows; returns their number, or -1. */
static int tool_table(table_row *rows, int max) {
    char *text = NULL, err[TRAIN_ERROR_SIZE] = "";
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    train_config cfg = g_cfg;
    char *sets[] = {"log.comm_debug=true", "log.level=info", "train.steps=2", "train.log_every=1"};
    for (int i = 0; i < 4; i++) train_config_set(&cfg, sets[i], err, sizeof err);
    train_result res;
    fsdp_status st = f ? train_run(NULL, &cfg, f, &res, err, sizeof err) : FSDP_ERR_IO;
    if (f) fclose(f);
    if (st != FSDP_OK) {
        printf("\n    train_run: %s", err);
        free(text);
        return -1;
    }
    int n = 0;
    bool in_table = false;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "op ", 3) == 0) {
            in_table = true;
            continue;
        }
        table_row r;
        char phase[16];
        if (!in_table || sscanf(line, "%23s %15s %15s %" SCNd64 " %" SCNd64, r.op, r.dim, phase,
                                &r.calls, &r.bytes) != 5) {
            in_table = false;
            continue;
        }
        int i = 0;
        while (i < n && (strcmp(rows[i].op, r.op) != 0 || strcmp(rows[i].dim, r.dim) != 0)) i++;
        if (i == n && n < max) rows[n++] = (table_row){.calls = 0};
        if (i < max) {
            snprintf(rows[i].op, sizeof rows[i].op, "%s", r.op);
            snprintf(rows[i].dim, sizeof rows[i].dim, "%s", r.dim);
            rows[i].calls += r.calls, rows[i].bytes += r.bytes;
        }
    }
    free(text);
    return n;
}

/* ---- the comparison ---------------------------------------------------------------------------
 */

static bool equal(const char *what, int rank, int64_t got, int64_t want) {
    if (got == want) return true;
    printf("\n    rank %d %s: plan %lld, measured %lld", rank, what, (long long)got,
           (long long)want);
    return false;
}

/* The plan of g_cfg against the tool's table and the runs, without and with checkpointing. */
static void check_layout(const char *name, const char *ckpt_pattern) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_estimate e;
    if (train_estimate_make(&g_cfg, 0, &e, err, sizeof err) != FSDP_OK) {
        printf("\n    %s: %s", name, err);
        CU_FAIL("train_estimate_make");
        return;
    }
    printf("\n    %s:", name);
    /* the collectives, as fsdp-train's comm_debug table shows rank 0's */
    table_row rows[32];
    int n = tool_table(rows, 32);
    CU_ASSERT_FATAL(n > 0);
    const train_est_rank *r0 = &e.ranks[0];
    CU_ASSERT_EQUAL(n, r0->n_comm);
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < r0->n_comm && (strcmp(fsdp_comm_op_to_string(r0->comm[j].op), rows[i].op) != 0 ||
                                  strcmp(r0->comm[j].dim, rows[i].dim) != 0))
            j++;
        bool found = j < r0->n_comm;
        if (!found) printf("\n    %s on %s: measured, not in the plan", rows[i].op, rows[i].dim);
        CU_ASSERT(found);
        if (!found) continue;
        printf(" %s/%s %lld B", rows[i].op, rows[i].dim, (long long)rows[i].bytes);
        CU_ASSERT(equal(rows[i].op, 0, r0->comm[j].calls, rows[i].calls));
        CU_ASSERT(equal(rows[i].op, 0, r0->comm[j].bytes, rows[i].bytes));
    }
    /* memory, every rank, without checkpointing (the configuration has none) */
    measured m[MAX_RANKS];
    CU_ASSERT_FATAL(measure(&g_cfg, &e.layout, m));
    for (int r = 0; r < e.layout.world; r++) {
        const train_est_rank *x = &e.ranks[r];
        CU_ASSERT(equal("params + grads", r, x->param_bytes + x->grad_bytes, m[r].shard_bytes));
        if (m[r].device_bytes >= 0)
            CU_ASSERT(equal("peak device bytes", r, x->device_bytes, m[r].device_bytes));
        CU_ASSERT(equal("optimizer bytes", r, x->optim_bytes, m[r].optim_bytes));
        CU_ASSERT(equal("activation bytes", r, x->act_bytes, m[r].act_bytes));
    }
    if (m[0].device_bytes >= 0) printf(" device %lld B,", (long long)m[0].device_bytes);
    printf(" activations %lld B", (long long)m[0].act_bytes);
    /* with the checkpointing the plan's act_ckpt column assumes (every checkpointable module) */
    char set[128];
    snprintf(set, sizeof set, "model.checkpoint_activations=%s", ckpt_pattern);
    CU_ASSERT_FATAL(train_config_set(&g_cfg, set, err, sizeof err) == FSDP_OK);
    CU_ASSERT_FATAL(measure(&g_cfg, &e.layout, m));
    for (int r = 0; r < e.layout.world; r++) {
        CU_ASSERT(
            equal("checkpointed activation bytes", r, e.ranks[r].act_ckpt_bytes, m[r].act_bytes));
        if (m[r].device_bytes >= 0)
            CU_ASSERT(equal("peak device bytes, checkpointed", r, e.ranks[r].device_bytes,
                            m[r].device_bytes));
    }
    printf(", checkpointed %lld B", (long long)m[0].act_bytes);
    /* and the tool's table with the recompute's collectives */
    train_estimate e2;
    CU_ASSERT_FATAL(train_estimate_make(&g_cfg, 0, &e2, err, sizeof err) == FSDP_OK);
    n = tool_table(rows, 32);
    CU_ASSERT_EQUAL(n, e2.ranks[0].n_comm);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < e2.ranks[0].n_comm; j++)
            if (strcmp(fsdp_comm_op_to_string(e2.ranks[0].comm[j].op), rows[i].op) == 0 &&
                strcmp(e2.ranks[0].comm[j].dim, rows[i].dim) == 0) {
                CU_ASSERT(equal(rows[i].op, 0, e2.ranks[0].comm[j].calls, rows[i].calls));
                CU_ASSERT(equal(rows[i].op, 0, e2.ranks[0].comm[j].bytes, rows[i].bytes));
            }
    train_estimate_free(&e2);
    train_estimate_free(&e);
}

/* The cases on rank threads compare every rank of worlds of several sizes: under mpirun only
 * mpi_pool runs. */
static bool skip_under_mpi(void) {
    if (!fsdp_test_mpi()) return false;
    fsdp_test_skip("the rank-thread layouts run outside mpirun; mpi_pool runs here");
    return true;
}

static const char *const g_mlp[] = {"model.widths=16,32,32,32,8",
                                    "model.norm=rmsnorm",
                                    "data.samples=256",
                                    "data.batch_size=16",
                                    "optim.name=sgd",
                                    "optim.lr=0.05",
                                    "log.level=off",
                                    "parallel.backend=local",
                                    "parallel.timeout_s=60",
                                    "parallel.wrap=layer",
                                    NULL};

static void test_mlp_layouts(void) {
    if (skip_under_mpi()) return;
    struct {
        const char *name;
        const char *const *set;
    } layouts[] = {
        {"mlp (2, 1) full_shard", SET("parallel.ranks=2")},
        {"mlp (2, 2) fsdp + tp", SET("parallel.ranks=4", "parallel.tp=2")},
        {"mlp (2, 2) shard_grad_op, use_orig_params, grad_accum 2, adamw, clipping",
         SET("parallel.ranks=4", "parallel.tp=2", "parallel.strategy=shard_grad_op",
             "parallel.use_orig_params=true", "train.grad_accum=2", "optim.name=adamw",
             "optim.lr=0.001", "optim.clip_grad_norm=1")},
        {"mlp (2, 1) bf16 mixed precision",
         SET("parallel.ranks=2", "parallel.mixed_precision=bf16")},
        {"mlp (2, 2) offload, bf16 comm hook",
         SET("parallel.ranks=4", "parallel.tp=2", "parallel.offload=true",
             "parallel.comm_hook=bf16")},
        {"mlp (2, 1) bf16 parameters, fp16 comm hook",
         SET("parallel.ranks=2", "parallel.mixed_precision=bf16,f32", "parallel.comm_hook=fp16")},
        {"mlp (2, 1) no_shard", SET("parallel.ranks=2", "parallel.strategy=no_shard")},
        {"mlp (4, 1) hybrid_shard, 2 replicas",
         SET("parallel.ranks=4", "parallel.strategy=hybrid_shard", "parallel.replicas=2")},
        {"mlp (3, 1) full_shard, uneven slices and shards",
         SET("parallel.ranks=3", "data.batch_size=10")},
        {"mlp (2, 2) replicate, buckets of 2 KiB, clipping",
         SET("parallel.ranks=4", "parallel.tp=2", "parallel.mode=replicate", "parallel.wrap=none",
             "parallel.bucket_mb=0.002", "optim.clip_grad_norm=1")},
        {"mlp (2, 1) replicate, bf16 hook", SET("parallel.ranks=2", "parallel.mode=replicate",
                                                "parallel.wrap=none", "parallel.comm_hook=bf16")},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        CU_ASSERT_FATAL(configure(g_mlp, layouts[i].set));
        check_layout(layouts[i].name, "*");
    }
}

static void test_stacked_layouts(void) {
    if (skip_under_mpi()) return;
    CU_ASSERT_FATAL(
        configure(SET("model.kind=mlp_stacked", "model.n_layers=3", "data.samples=64",
                      "data.batch_size=8", "optim.name=sgd", "log.level=off",
                      "parallel.backend=local", "parallel.timeout_s=60", "parallel.wrap=layer"),
                  SET("parallel.ranks=4", "parallel.tp=2")));
    check_layout("mlp_stacked (2, 2) fsdp + tp", "layers.*");
}

static const char *const g_llama[] = {"model.kind=llama",
                                      "model.dim=32",
                                      "model.n_layers=2",
                                      "model.n_heads=4",
                                      "model.n_kv_heads=2",
                                      "model.vocab_size=256",
                                      "model.max_seq_len=16",
                                      "data.kind=tokens",
                                      "data.path=" FSDP_SOURCE_DIR
                                      "/examples/data/austen-pride.tok",
                                      "data.batch_size=4",
                                      "data.eval_batches=1",
                                      "optim.name=adamw",
                                      "optim.lr=0.001",
                                      "optim.clip_grad_norm=1",
                                      "log.level=off",
                                      "parallel.backend=local",
                                      "parallel.timeout_s=60",
                                      "parallel.wrap=layer",
                                      NULL};

static void test_llama_layouts(void) {
    if (skip_under_mpi()) return;
    struct {
        const char *name;
        const char *const *set;
    } layouts[] = {
        {"llama (2, 1) full_shard", SET("parallel.ranks=2")},
        {"llama (2, 2) fsdp + tp", SET("parallel.ranks=4", "parallel.tp=2")},
        {"llama (2, 2) replicate, buckets of 16 KiB",
         SET("parallel.ranks=4", "parallel.tp=2", "parallel.mode=replicate", "parallel.wrap=none",
             "parallel.bucket_mb=0.015625")},
        {"llama (1, 2) tp, uneven vocabulary",
         SET("parallel.ranks=2", "parallel.tp=2", "model.vocab_size=257")},
        /* the bf16 compute policy: each Linear's bf16 copies and scratch, the bf16 activations */
        {"llama (2, 1) full_shard, bf16 policy", SET("parallel.ranks=2", "model.autocast=bf16")},
        {"llama (2, 2) fsdp + tp, bf16 policy",
         SET("parallel.ranks=4", "parallel.tp=2", "model.autocast=bf16")},
        {"llama (1, 2) tp, bf16 policy, tied embeddings, uneven vocabulary",
         SET("parallel.ranks=2", "parallel.tp=2", "model.vocab_size=257", "model.autocast=bf16",
             "model.tie_embeddings=true")},
        /* bf16 logits (the policy at tp 1): the logits in bf16 and no scratch in lm_head, with a
         * bf16 logit gradient above and an f32 one where the trainer rescales it (accumulated
         * micro-batches) */
        {"llama (2, 1) bf16 logits, tied embeddings, grad_accum 2",
         SET("parallel.ranks=2", "model.autocast=bf16", "model.tie_embeddings=true",
             "train.grad_accum=2")},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        CU_ASSERT_FATAL(configure(g_llama, layouts[i].set));
        check_layout(layouts[i].name, "model.layers.*");
    }
}

/* Under mpirun (CTest's test_train_plan_mpi2 and _mpi4): with [parallel] backend = mpi the
 * gathered parameters take pool blocks (no group-shared block between processes), and the plan
 * models that: this process's rank of each layout whose world is the job's size, its shard,
 * peak device, optimizer and activation bytes against the plan's. */
static void test_mpi_pool(void) {
    if (!fsdp_test_mpi()) {
        fsdp_test_skip("runs under mpirun (CTest's test_train_plan_mpi2 and test_train_plan_mpi4)");
        return;
    }
    struct {
        const char *name;
        const char *const *base, *const *set;
    } layouts[] = {
        {"mlp (2, 1) full_shard", g_mlp, SET("parallel.backend=mpi", "parallel.ranks=2")},
        {"mlp (2, 2) fsdp + tp", g_mlp,
         SET("parallel.backend=mpi", "parallel.ranks=4", "parallel.tp=2")},
        {"mlp (2, 2) shard_grad_op, grad_accum 2", g_mlp,
         SET("parallel.backend=mpi", "parallel.ranks=4", "parallel.tp=2",
             "parallel.strategy=shard_grad_op", "train.grad_accum=2")},
        {"llama (2, 1) full_shard", g_llama, SET("parallel.backend=mpi", "parallel.ranks=2")},
        {"llama (2, 2) fsdp + tp", g_llama,
         SET("parallel.backend=mpi", "parallel.ranks=4", "parallel.tp=2")},
    };
    char err[TRAIN_ERROR_SIZE] = "";
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        CU_ASSERT_FATAL(configure(layouts[i].base, layouts[i].set));
        train_estimate e;
        CU_ASSERT_FATAL(train_estimate_make(&g_cfg, 0, &e, err, sizeof err) == FSDP_OK);
        int first, n = fsdp_test_hosted_ranks(e.layout.world, &first);
        measured m[MAX_RANKS];
        CU_ASSERT_FATAL(measure(&g_cfg, &e.layout, m));
        for (int r = first; r < first + n; r++) {
            const train_est_rank *x = &e.ranks[r];
            CU_ASSERT(equal("params + grads", r, x->param_bytes + x->grad_bytes, m[r].shard_bytes));
            CU_ASSERT(equal("peak device bytes", r, x->device_bytes, m[r].device_bytes));
            CU_ASSERT(equal("optimizer bytes", r, x->optim_bytes, m[r].optim_bytes));
            CU_ASSERT(equal("activation bytes", r, x->act_bytes, m[r].act_bytes));
            printf("\n    %s, rank %d: device %lld B (gathered %lld B)", layouts[i].name, r,
                   (long long)m[r].device_bytes, (long long)x->gathered_bytes);
        }
        train_estimate_free(&e);
    }
}

/* --plan and --plan --json on the command line; what the plan does not model is refused. */
static void test_command_line(void) {
    char err[TRAIN_ERROR_SIZE] = "", path[] = "/tmp/test_train_plan-XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "[model]\nwidths = 8,16,4\n[parallel]\nranks = 2\n[data]\nbatch_size = 8\n");
    fclose(f);
    train_config cfg;
    train_cli_action action;
    char *plan_json[] = {"fsdp-train", "--config", path, "--plan", "--json"};
    CU_ASSERT(train_cli_parse(5, plan_json, &cfg, &action, err, sizeof err) == FSDP_OK);
    CU_ASSERT_EQUAL(action, TRAIN_CLI_PLAN_JSON);
    char *plan[] = {"fsdp-train", "--plan", "--config", path};
    CU_ASSERT(train_cli_parse(4, plan, &cfg, &action, err, sizeof err) == FSDP_OK);
    CU_ASSERT_EQUAL(action, TRAIN_CLI_PLAN);
    char *json_alone[] = {"fsdp-train", "--config", path, "--json"};
    CU_ASSERT(train_cli_parse(4, json_alone, &cfg, &action, err, sizeof err) == FSDP_ERR_CONFIG);
    CU_ASSERT(strstr(err, "--json goes with --plan") != NULL);

    /* the JSON holds the estimate's figures */
    CU_ASSERT_FATAL(train_cli_parse(5, plan_json, &cfg, &action, err, sizeof err) == FSDP_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(train_estimate_main(&cfg, true, mem), 0);
    fclose(mem);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    CU_ASSERT_FATAL(root != NULL);
    train_estimate e;
    CU_ASSERT_FATAL(train_estimate_make(&cfg, 0, &e, err, sizeof err) == FSDP_OK);
    json_t *ranks = json_object_get(root, "ranks");
    CU_ASSERT_EQUAL(json_array_size(ranks), 2);
    for (size_t r = 0; r < json_array_size(ranks) && r < 2; r++) {
        json_t *x = json_array_get(ranks, r);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(x, "device_bytes")),
                        e.ranks[r].device_bytes);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(x, "activation_bytes")),
                        e.ranks[r].act_bytes);
        CU_ASSERT_EQUAL(json_array_size(json_object_get(x, "collectives")),
                        (size_t)e.ranks[r].n_comm);
    }
    /* the model FLOPs of a step: 6 x the Linear weights (8 x 16 + 16 x 4) x batch_size 8, no
     * peak on the cpu; the 2 ranks are 2 devices */
    CU_ASSERT_EQUAL(json_real_value(json_object_get(root, "flops_per_step")), 6.0 * 192 * 8);
    CU_ASSERT_EQUAL(json_real_value(json_object_get(root, "peak_tflops")), 0.0);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(root, "devices")), 2);
    train_estimate_free(&e);
    json_decref(root);
    free(text);
    /* with a peak, the text's line gives the step's time at full and 40% utilisation */
    char set_err[TRAIN_ERROR_SIZE] = "";
    CU_ASSERT(train_config_set(&cfg, "log.peak_tflops=0.001", set_err, sizeof set_err) == FSDP_OK);
    mem = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(train_estimate_main(&cfg, false, mem), 0);
    fclose(mem);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "plan: 9216 model FLOP per step (6N); at 0.001 TFLOP/s "
                                        "(f32, [log] peak_tflops) x 2 devices: 0.004608 ms a "
                                        "step at 100% mfu, 0.01152 at 40%\n"));
    if (!strstr(text, "0.004608 ms")) printf("\n%s", text);
    free(text);

    /* the binary: --plan --json on stdout (status 0), the same figures; --json alone: status 2 */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --config %s --plan --json 2>&1", FSDP_TRAIN_EXE, path);
    FILE *p = popen(cmd, "r");
    CU_ASSERT_FATAL(p != NULL);
    json_t *tool = json_loadf(p, JSON_DISABLE_EOF_CHECK, &jerr);
    CU_ASSERT_EQUAL(pclose(p), 0);
    CU_ASSERT_FATAL(tool != NULL);
    CU_ASSERT_FATAL(train_estimate_make(&cfg, 0, &e, err, sizeof err) == FSDP_OK);
    json_t *r1 = json_array_get(json_object_get(tool, "ranks"), 1);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(r1, "total_bytes")), e.ranks[1].total_bytes);
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(r1, "gathered_bytes")),
                    e.ranks[1].gathered_bytes);
    train_estimate_free(&e);
    json_decref(tool);
    snprintf(cmd, sizeof cmd, "%s --config %s --json > /dev/null 2>&1", FSDP_TRAIN_EXE, path);
    int status = system(cmd);
    CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 2);

    remove(path);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"mlp_layouts", test_mlp_layouts},     {"stacked_layouts", test_stacked_layouts},
        {"llama_layouts", test_llama_layouts}, {"mpi_pool", test_mpi_pool},
        {"command_line", test_command_line},
    };
    return fsdp_test_run(argc, argv, "train_plan", cases, (int)(sizeof cases / sizeof cases[0]));
}
