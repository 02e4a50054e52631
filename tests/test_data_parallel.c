/* test_data_parallel.c: the fully_shard half of PyTorch's test_data_parallel.py (the replicate
 * half is test_replicate.c): SimpleMLP, and the seed's transposing WrapperModule for
 * input_batch_dim 1, wrapped with fsdp_fully_shard and trained with SGD ({lr 0.1},
 * {+ momentum 0.9}, {+ foreach}) and fused Adam on a global batch that each rank slices by
 * sample index. Every rank also trains the DDP-style reference (the model on one rank, the
 * whole batch, the loss divided by the data-parallel size) through the seed's three steps,
 * and compares every parameter after each step, read inside summon_full_params; the
 * collectives of each step are pinned. Each runs with use_orig_params off and on. Also
 * per-parameter optimizer options (param_groups) over use_orig_params shards. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dp_common.h" // defines: dp_build_model, dp_batch_block, dp_forward_backward
#include "harness.h"
#include "numerics.h" // defines: fsdp_test_adam_check, fsdp_test_nudge_params

typedef struct scenario {
    const char *name;
    int world;     /* data-parallel ranks */
    int64_t batch; /* global batch */
    int batch_dim; /* 0; 1: the seed's WrapperModule, input (50, batch), output (8, batch) */
    bool adam;     /* Adam (always fused here) instead of SGD */
    fsdp_sgd_options sgd;
    fsdp_adam_options adam_opts;
    bool per_layer; /* net1 and net2 their own units; the root keeps no parameter */
    bool use_orig_params;
} scenario;

typedef struct rank_state {
    fsdp_group *dp; /* the world group */
    fsdp_module *ref, *dist;
    fsdp_sharded *sh;
    fsdp_optimizer *ref_opt, *dist_opt;
    fsdp_tensor *x, *labels, *x_local, *labels_local, *dref, *ddist;
    /* Adam: the reference again from parameters nudged by one ulp (its rounding noise), and
     * twice the largest move Adam has made so far (numerics.h) */
    dp_adam_noise noise;
} rank_state;

static void rank_state_release(rank_state *rs) {
    fsdp_optimizer_free(rs->ref_opt);
    fsdp_optimizer_free(rs->dist_opt);
    fsdp_sharded_free(rs->sh);
    fsdp_module_free(rs->ref);
    fsdp_module_free(rs->dist);
    dp_adam_noise_release(&rs->noise);
    fsdp_tensor *t[] = {rs->x, rs->labels, rs->x_local, rs->labels_local, rs->dref, rs->ddist};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) fsdp_tensor_free(t[i]);
}

static int64_t calls(fsdp_ctx *ctx, fsdp_comm_op op, fsdp_comm_phase phase) {
    fsdp_comm_filter f = {.op = op, .phase = phase};
    return fsdp_comm_debug_query(ctx, &f).calls;
}

/* ---- setup ---- */

/* The reference, and the sharded model: every rank initialises it from its own seed (rank 0's
 * is the reference's), so only sync_module_states (the broadcast DDP also makes) makes the
 * replicas equal before sharding. */
static fsdp_status setup_models(fsdp_ctx *ctx, int rank, const scenario *s, rank_state *rs) {
    rs->dp = fsdp_ctx_world_group(ctx);
    FSDP_TRY(dp_build_model(ctx, s->batch_dim, DP_SEED, &rs->ref));
    FSDP_TRY(dp_build_model(ctx, s->batch_dim, DP_SEED + (uint64_t)rank, &rs->dist));
    const char *paths[2] = {"net1", "net2"}, *wrapped_paths[2] = {"mlp.net1", "mlp.net2"};
    fsdp_fully_shard_options o = {.group = rs->dp,
                                  .wrap_paths = s->batch_dim ? wrapped_paths : paths,
                                  .n_wrap_paths = s->per_layer ? 2 : 0,
                                  .sync_module_states = true,
                                  .use_orig_params = s->use_orig_params,
                                  .poison_resharded = true};
    FSDP_TRY(fsdp_fully_shard(ctx, rs->dist, &o, &rs->sh));
    int units = fsdp_sharded_num_units(rs->sh);
    FSDP_RANK_CHECK(ctx, units >= (s->per_layer ? 2 : 1) && units <= (s->per_layer ? 3 : 1),
                    "%s: %d units", s->name, units);
    return FSDP_OK;
}

/* The optimizer over the reference and over the shards. With use_orig_params the shards'
 * optimizer must see the model's own parameter names. */
static fsdp_status setup_optimizers(fsdp_ctx *ctx, const scenario *s, rank_state *rs) {
    fsdp_module *flat = fsdp_sharded_flat_params(rs->sh);
    if (s->adam) {
        FSDP_TRY(fsdp_adam_create(ctx, rs->ref, &s->adam_opts, &rs->ref_opt));
        FSDP_TRY(fsdp_adam_create(ctx, flat, &s->adam_opts, &rs->dist_opt));
        FSDP_TRY(dp_adam_noise_init(ctx, &rs->noise, s->batch_dim, &s->adam_opts, false));
    } else {
        FSDP_TRY(fsdp_sgd_create(ctx, rs->ref, &s->sgd, &rs->ref_opt));
        FSDP_TRY(fsdp_sgd_create(ctx, flat, &s->sgd, &rs->dist_opt));
    }
    if (s->use_orig_params) {
        int group;
        const char *name = s->batch_dim ? "mlp.net2.bias" : "net2.bias";
        FSDP_TRY(fsdp_optimizer_param_group(ctx, rs->dist_opt, name, &group));
    }
    return FSDP_OK;
}

static fsdp_status setup_data(fsdp_ctx *ctx, const scenario *s, rank_state *rs) {
    int64_t off, len;
    fsdp_batch_range(ctx, rs->dp, s->batch, &off, &len);
    FSDP_TRY(dp_batch_block(ctx, s->batch, DP_IN_DIM, s->batch_dim, 0, s->batch, 1, &rs->x));
    FSDP_TRY(dp_batch_block(ctx, s->batch, DP_OUT_DIM, s->batch_dim, 0, s->batch, 2, &rs->labels));
    FSDP_TRY(dp_batch_block(ctx, s->batch, DP_IN_DIM, s->batch_dim, off, len, 1, &rs->x_local));
    return dp_batch_block(ctx, s->batch, DP_OUT_DIM, s->batch_dim, off, len, 2, &rs->labels_local);
}

/* ---- comparisons ---- */

typedef struct param_cmp {
    fsdp_module *dist;
    const char *stage;
    double max_abs;
    double bulk_used;   /* Adam: the largest difference over the rule's bulk bound */
    int64_t exceptions; /* Adam: the most elements beyond the bulk after one step */
} param_cmp;

static fsdp_status compare_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    param_cmp *c = user;
    fsdp_param *q = fsdp_module_get_param(c->dist, name);
    FSDP_RANK_CHECK(ctx, q != NULL, "the sharded model has no parameter '%s'", name);
    char what[160];
    snprintf(what, sizeof what, "%s %s", c->stage, name);
    return fsdp_test_rank_close(ctx, what, fsdp_param_data(q), fsdp_param_data(p), 1e-5, 1e-6,
                                &c->max_abs);
}

/* Every parameter of the sharded model, gathered by summon_full_params, against the
 * reference's. SGD: every element within rtol 1e-5, atol 1e-6. SGD moves a parameter by lr
 * times its gradient, a sum over the 128 samples whose terms the ranks add in another order
 * (f32: a few u of their magnitudes, about 1e-7 of gradients up to ~10; lr 0.1, 3 steps,
 * momentum 0.9: about 5e-7 of parameters up to 4.6, seen 3.6e-7). Adam (after a step): the
 * statistical rule of tests/numerics.h against the reference's rounding noise (dp_common.h). */
static fsdp_status compare_all(fsdp_ctx *ctx, rank_state *rs, param_cmp *cmp) {
    FSDP_TRY(fsdp_summon_full_params(ctx, rs->sh, NULL));
    fsdp_status st;
    if (rs->noise.steps > 0) {
        fsdp_test_adam_check c;
        st = dp_adam_compare(ctx, &rs->noise, rs->ref, rs->dist, cmp->stage, &c);
        if (st == FSDP_OK) {
            cmp->max_abs = fmax(cmp->max_abs, c.max_abs);
            cmp->bulk_used = fmax(cmp->bulk_used, c.max_abs / c.bulk);
            if (c.exceptions > cmp->exceptions) cmp->exceptions = c.exceptions;
        }
    } else {
        st = fsdp_module_visit_params(ctx, rs->ref, compare_param, cmp);
    }
    fsdp_status rel = fsdp_release_full_params(ctx, rs->sh);
    return st != FSDP_OK ? st : rel;
}

/* ---- the seed's _test_data_parallel ---- */

/* One of the seed's steps on both models (zero_grad, forward, backward, step). The sharded
 * model's step makes exactly FULL_SHARD's collectives (as PyTorch's FSDP makes them; the table
 * in docs/fsdp.md): one all_gather per unit in forward, one more in backward for every unit but
 * the root (which does not reshard after forward), one reduce_scatter per unit, and nothing in
 * the optimizer step;
 * a unit without parameters (the root of per-layer units) communicates nothing. */
static fsdp_status train_step(fsdp_ctx *ctx, const scenario *s, rank_state *rs, int step,
                              param_cmp *cmp) {
    double ref_loss, loss;
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, rs->ref_opt));
    FSDP_TRY(fsdp_optimizer_zero_grad(ctx, rs->dist_opt));
    FSDP_TRY(dp_forward_backward(ctx, rs->ref, rs->x, rs->labels, (float)(1.0 / s->world),
                                 &rs->dref, &ref_loss));
    FSDP_TRY(fsdp_comm_debug_begin(ctx));
    FSDP_TRY(
        dp_forward_backward(ctx, rs->dist, rs->x_local, rs->labels_local, 1.0f, &rs->ddist, &loss));
    FSDP_TRY(fsdp_optimizer_step(ctx, rs->dist_opt));
    FSDP_TRY(fsdp_comm_debug_end(ctx));
    int units = 0, nonroot = 0; /* units that hold parameters (a root may hold none) */
    for (int u = 0; u < fsdp_sharded_num_units(rs->sh); u++)
        if (fsdp_sharded_unit_numel(rs->sh, u) > 0) {
            units++;
            nonroot += fsdp_sharded_unit_path(rs->sh, u)[0] != '\0';
        }
    int64_t ag_f = calls(ctx, FSDP_COMM_ALL_GATHER, FSDP_COMM_PHASE_FORWARD);
    int64_t ag_b = calls(ctx, FSDP_COMM_ALL_GATHER, FSDP_COMM_PHASE_BACKWARD);
    int64_t rs_b = calls(ctx, FSDP_COMM_REDUCE_SCATTER, FSDP_COMM_PHASE_BACKWARD);
    int64_t total = fsdp_comm_debug_total(ctx).calls;
    FSDP_RANK_CHECK(
        ctx, ag_f == units && ag_b == nonroot && rs_b == units && total == ag_f + ag_b + rs_b,
        "%s step %d: %lld all_gather in forward (want %d), %lld in backward (want "
        "%d), %lld reduce_scatter (want %d), %lld collectives in all",
        s->name, step, (long long)ag_f, units, (long long)ag_b, nonroot, (long long)rs_b, units,
        (long long)total);
    FSDP_TRY(fsdp_optimizer_step(ctx, rs->ref_opt));
    if (rs->noise.model)
        FSDP_TRY(dp_adam_noise_step(ctx, &rs->noise, rs->x, rs->labels, (float)(1.0 / s->world),
                                    fsdp_optimizer_lr(rs->ref_opt)));
    /* The ranks' losses add up to the reference's. */
    char stage[96];
    snprintf(stage, sizeof stage, "%s step %d", s->name, step);
    FSDP_TRY(dp_check_loss_sum(ctx, rs->dp, loss, ref_loss, stage));
    cmp->stage = stage;
    return compare_all(ctx, rs, cmp);
}

static fsdp_status data_parallel_run(fsdp_ctx *ctx, int rank, const scenario *s, rank_state *rs) {
    FSDP_TRY(setup_models(ctx, rank, s, rs));
    FSDP_TRY(setup_optimizers(ctx, s, rs));
    FSDP_TRY(setup_data(ctx, s, rs));
    param_cmp cmp = {.dist = rs->dist, .stage = "after sync_module_states"};
    FSDP_TRY(compare_all(ctx, rs, &cmp));
    /* The seed: train_step (the warm-up), then zero_grad and one more forward, backward and
     * step, then the step under test; parameters are compared after each. */
    for (int step = 1; step <= 3; step++) FSDP_TRY(train_step(ctx, s, rs, step, &cmp));
    if (rank == 0)
        printf("\n    %s (%d ranks, batch %lld, %d units): max abs diff %.3g", s->name, s->world,
               (long long)s->batch, fsdp_sharded_num_units(rs->sh), cmp.max_abs);
    if (rank == 0 && rs->noise.model)
        printf(" (%.2g x the bound, at most %lld elements beyond it)", cmp.bulk_used,
               (long long)cmp.exceptions);
    return FSDP_OK;
}

static fsdp_status data_parallel_rank(fsdp_ctx *ctx, int rank, void *user) {
    rank_state rs = {0};
    fsdp_status st = data_parallel_run(ctx, rank, user, &rs);
    rank_state_release(&rs);
    return st;
}

/* The seed's 2 ranks, and 3 and 4 for uneven batch slices (128 samples: 43/43/42; 127 on 4,
 * as test_replicate.c explains), each with use_orig_params off and on. */
static void run_on_worlds_2_to_4(scenario s) {
    for (int w = 2; w <= 4; w++)
        for (int orig = 0; orig < 2; orig++) {
            scenario sw = s;
            char name[96];
            snprintf(name, sizeof name, "%s%s", s.name, orig ? " use_orig_params" : "");
            sw.name = name;
            sw.world = w;
            sw.batch = w == 4 ? 127 : 128;
            sw.use_orig_params = orig;
            FSDP_TEST_OK(fsdp_test_run_world(w, 0, data_parallel_rank, &sw));
        }
}

/* The seed's three SGD configs. foreach=True only changes how PyTorch groups its kernels; the
 * update is the same math here, so the third config varies the grouping of the parameters
 * instead: net1 and net2 become units of their own. */
static void test_fully_shard_sgd(void) {
    static const scenario configs[] = {
        {.name = "sgd{lr 0.1}", .sgd = {.lr = 0.1}},
        {.name = "sgd{lr 0.1, momentum 0.9}", .sgd = {.lr = 0.1, .momentum = 0.9}},
        {.name = "sgd{lr 0.1, momentum 0.9, foreach} per-layer units",
         .sgd = {.lr = 0.1, .momentum = 0.9},
         .per_layer = true},
    };
    for (int c = 0; c < 3; c++) run_on_worlds_2_to_4(configs[c]);
}

static void test_fully_shard_adam_fused(void) {
    /* fused=True: libfsdp's Adam is always one pass per parameter range (src/optim/update.c). */
    scenario s = {.name = "adam{lr 0.1, fused}", .adam = true, .adam_opts = {.lr = 0.1}};
    run_on_worlds_2_to_4(s);
}

/* WrapperModule transposes its (50, batch) input; each rank slices the batch along dim 1
 * (input_batch_dim = 1). */
static void test_fully_shard_non_0_batch_dim(void) {
    scenario s = {.name = "non_0_batch_dim adam{lr 0.1, fused}",
                  .batch_dim = 1,
                  .adam = true,
                  .adam_opts = {.lr = 0.1}};
    run_on_worlds_2_to_4(s);
}

/* ---- per-parameter options over FSDP shards ---- */

/* AdamW with no weight decay for the biases and its own lr and betas for net2, on the shards
 * of a use_orig_params model and on the reference, under an lr schedule: the same
 * parameters after every step. Some ranks' views of a parameter are empty (3 ranks: the biases
 * lie in the last shard); the group still matches them by name on every rank. Without
 * use_orig_params the optimizer sees only flat parameters, and the error says so. */
static fsdp_status groups_run(fsdp_ctx *ctx, int rank, const scenario *s, rank_state *rs) {
    static const fsdp_param_group groups[] = {
        {.pattern = "*.bias", .weight_decay = FSDP_OVERRIDE(0.0)},
        {.pattern = "*net2.weight",
         .lr = FSDP_OVERRIDE(0.03),
         .beta1 = FSDP_OVERRIDE(0.8),
         .beta2 = FSDP_OVERRIDE(0.99)},
    };
    fsdp_adam_options o = {
        .lr = 0.01, .weight_decay = 0.1, .param_groups = groups, .n_param_groups = 2};
    FSDP_TRY(setup_models(ctx, rank, s, rs));
    fsdp_module *flat = fsdp_sharded_flat_params(rs->sh);
    if (!s->use_orig_params) {
        fsdp_status bad = fsdp_adamw_create(ctx, flat, &o, &rs->dist_opt);
        FSDP_RANK_CHECK(ctx,
                        bad == FSDP_ERR_INVALID_ARGUMENT &&
                            strstr(fsdp_last_error(ctx), "'*.bias' matches no") &&
                            strstr(fsdp_last_error(ctx), "_flat_param") &&
                            strstr(fsdp_last_error(ctx), "use_orig_params"),
                        "param_groups over flat parameters: %s", fsdp_last_error(ctx));
        return FSDP_OK;
    }
    FSDP_TRY(fsdp_adamw_create(ctx, rs->ref, &o, &rs->ref_opt));
    FSDP_TRY(fsdp_adamw_create(ctx, flat, &o, &rs->dist_opt));
    FSDP_TRY(dp_adam_noise_init(ctx, &rs->noise, s->batch_dim, &o, true));
    int g;
    FSDP_TRY(fsdp_optimizer_param_group(ctx, rs->dist_opt, "net2.weight", &g));
    FSDP_RANK_CHECK(ctx, g == 1, "net2.weight is in group %d, want 1", g);
    FSDP_TRY(setup_data(ctx, s, rs));
    param_cmp cmp = {.dist = rs->dist};
    for (int step = 1; step <= 3; step++) {
        double lr = 0.01 / step;
        fsdp_optimizer_set_lr(rs->ref_opt, lr);
        fsdp_optimizer_set_lr(rs->dist_opt, lr);
        FSDP_TRY(train_step(ctx, s, rs, step, &cmp));
    }
    if (rank == 0)
        printf("\n    %s (%d ranks): max abs diff %.3g (%.2g x the bound, at most %lld elements "
               "beyond it)",
               s->name, s->world, cmp.max_abs, cmp.bulk_used, (long long)cmp.exceptions);
    return FSDP_OK;
}

static fsdp_status groups_rank(fsdp_ctx *ctx, int rank, void *user) {
    rank_state rs = {0};
    fsdp_status st = groups_run(ctx, rank, user, &rs);
    rank_state_release(&rs);
    return st;
}

static void test_fully_shard_param_groups(void) {
    for (int w = 2; w <= 3; w++)
        for (int orig = 0; orig < 2; orig++) {
            scenario s = {
                .name = "adamw param_groups", .world = w, .batch = 128, .use_orig_params = orig};
            FSDP_TEST_OK(fsdp_test_run_world(w, 0, groups_rank, &s));
        }
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"fully_shard_sgd", test_fully_shard_sgd},
        {"fully_shard_adam_fused", test_fully_shard_adam_fused},
        {"fully_shard_non_0_batch_dim", test_fully_shard_non_0_batch_dim},
        {"fully_shard_param_groups", test_fully_shard_param_groups},
    };
    return fsdp_test_run(argc, argv, "data_parallel", cases, sizeof cases / sizeof cases[0]);
}
