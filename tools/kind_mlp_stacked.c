/* kind_mlp_stacked.c: [model] kind = mlp_stacked: the seed's MLPStacked
 * (fsdp_model_mlp_stacked): [model] n_layers blocks layers.<i>, each net1 Linear(10, 16), relu,
 * net2 Linear(16, 10), tensor parallel by the seed's plan (layers.*.net1 colwise,
 * layers.*.net2 rowwise: the Megatron pairs, or [model] tp_plan), trained on the synthetic
 * teacher's samples of 10 inputs and 10 outputs (train_samples.h). */
#include <stdio.h>
#include <string.h>

#include "train_kind.h"    // defines: train_kind
#include "train_plan.h"    // defines: train_plan_apply, train_plan_check_checkpointing
#include "train_samples.h" // defines: train_samples_create, train_samples_step

#include "train_estimate.h" // defines: train_estimate_mlp_stacked

enum { WIDTH = 10, HIDDEN = 16 }; /* MLPModule: Linear(10, 16), relu, Linear(16, 10) */

extern const train_kind train_kind_mlp_stacked; /* below */

/* n_layers and tp_plan are the same keys as llama's and mlp's (one value each), with this
 * kind's help. */
static const train_key g_keys[] = {
    INT_KEY("model", "n_layers", model.n_layers, "2", 1, 1024,
            "MLPModule blocks, layers.0 ... layers.<n_layers - 1>"),
    STRING_KEY("model", "tp_plan", model.tp_plan, "",
               "tensor-parallel plan with tp > 1, as for mlp, over the module names "
               "layers.<i>.net1, layers.<i>.relu, layers.<i>.net2, e.g. the seed's "
               "layers.*.net[1]=colwise,layers.*.net[2]=rowwise; empty: that plan, the Megatron "
               "pairs"),
};

/* tp divides the hidden width each block's pair splits; the plan and the checkpointed blocks
 * name modules of the model. */
static fsdp_status stacked_check(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE];
    fsdp_status st = train_plan_check_checkpointing(&train_kind_mlp_stacked, cfg, err, err_size);
    train_tp_style styles[TRAIN_MAX_PLAN_LINEAR];
    int n_linear = 0;
    if (st == FSDP_OK)
        st = train_plan_styles(&train_kind_mlp_stacked, cfg, styles, &n_linear, err, err_size);
    if (st != FSDP_OK) return st;
    if (train_config_key_not_for(cfg, "model", "tp_plan", cfg->parallel.tp > 1, "tp > 1",
                                 "parallel", "tp", err, err_size))
        return FSDP_ERR_CONFIG;
    if (cfg->parallel.tp > 1 && HIDDEN % cfg->parallel.tp != 0) {
        snprintf(err, err_size,
                 "%s must divide the hidden width %d of MLPStacked's blocks, which net1 "
                 "(Colwise) and net2 (Rowwise) split over the tp ranks; use tp 2, 4, 8 or 16",
                 train_config_key_text(cfg, "parallel", "tp", a, sizeof a), HIDDEN);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

static fsdp_status stacked_build(fsdp_ctx *ctx, const train_config *cfg, bool shape_only,
                                 fsdp_module **out) {
    fsdp_status st = fsdp_model_mlp_stacked(ctx, (int)cfg->model.n_layers, out);
    if (st != FSDP_OK || shape_only || fsdp_ctx_seed(ctx) == (uint64_t)cfg->train.seed) return st;
    return fsdp_module_reset_parameters(ctx, *out, (uint64_t)cfg->train.seed);
}

/* The blocks, layers.<i>. */
static int stacked_checkpointable(fsdp_module *model, fsdp_module **out, int max) {
    fsdp_module *layers = fsdp_module_find(model, "layers");
    int n = layers ? fsdp_module_num_children(layers) : 0;
    for (int i = 0; i < n && i < max; i++) out[i] = fsdp_module_child(layers, i);
    return n < max ? n : max;
}

/* wrap = layer: a unit per block but the last (the root keeps it). */
static void stacked_wrap_layers(fsdp_module *model, fsdp_fully_shard_options *o,
                                const char **storage, int max) {
    fsdp_module *blocks[TRAIN_MAX_LAYERS];
    int n = stacked_checkpointable(model, blocks, max < TRAIN_MAX_LAYERS ? max : TRAIN_MAX_LAYERS);
    for (int i = 0; i < n; i++) storage[i] = fsdp_module_fqn(blocks[i]);
    o->wrap_paths = storage;
    o->n_wrap_paths = n > 0 ? n - 1 : 0;
}

static fsdp_status stacked_feed(fsdp_ctx *ctx, const train_rank_env *env, void **feed,
                                train_feed_info *info) {
    return train_samples_create(ctx, env, WIDTH, WIDTH, feed, info);
}

static void stacked_banner(const train_config *cfg, const void *feed, FILE *out) {
    int64_t n = cfg->model.n_layers,
            params = n * (WIDTH * HIDDEN + HIDDEN + HIDDEN * WIDTH + WIDTH);
    fprintf(out, "MLPStacked %lld layer%s of %d-%d-%d (relu, %lld parameters), ", (long long)n,
            n == 1 ? "" : "s", WIDTH, HIDDEN, WIDTH, (long long)params);
    train_samples_banner(cfg, feed, out);
}

/* 6 N, N the blocks' weights: net1 (HIDDEN, WIDTH) and net2 (WIDTH, HIDDEN) each. */
static fsdp_status stacked_flops_per_sample(fsdp_ctx *ctx, const train_config *cfg, double *out) {
    (void)ctx;
    *out = 6.0 * (double)cfg->model.n_layers * 2 * WIDTH * HIDDEN;
    return FSDP_OK;
}

const train_kind train_kind_mlp_stacked = {
    .name = "mlp_stacked",
    .help = "the seed's MLPStacked: n_layers blocks layers.<i> of net1 Linear(10, 16), relu, "
            "net2 Linear(16, 10); synthetic data",
    .state_advice = "MLPStacked names them (layers.<i>.net1.weight, layers.<i>.net1.bias, "
                    "layers.<i>.net2.weight, layers.<i>.net2.bias)",
    .shape_keys = "n_layers",
    .keys = g_keys,
    .n_keys = (int)(sizeof g_keys / sizeof g_keys[0]),
    .data_kinds = 1u << TRAIN_DATA_SYNTHETIC,
    .data_advice = "MLPStacked trains on the synthetic teacher's samples of 10 inputs and 10 "
                   "outputs; set [data] kind = synthetic",
    .check = stacked_check,
    .build = stacked_build,
    .checkpointable = stacked_checkpointable,
    .parallelize = train_plan_apply,
    .wrap_layers = stacked_wrap_layers,
    .load = train_samples_load,
    .unload = train_samples_unload,
    .feed_create = stacked_feed,
    .feed_free = train_samples_free,
    .step = train_samples_step,
    .loss = train_samples_loss,
    .banner = stacked_banner,
    .done = train_samples_done,
    .flops_per_sample = stacked_flops_per_sample,
    .estimate = train_estimate_mlp_stacked,
};
