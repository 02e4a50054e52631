/* kind_mlp.c: [model] kind = mlp: an nn.Sequential of Linear layers over [model] widths with
 * an activation between them (and an RMSNorm first with norm = rmsnorm), tensor parallel by
 * [model] tp_plan or the Megatron pairs, trained on samples (train_samples.h). */
#include <float.h> // defines: FLT_EPSILON
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fsdp/version.h"  // defines: FSDP_VERSION_STRING
#include "train_kind.h"    // defines: train_kind
#include "train_plan.h"    // defines: train_plan_apply, train_plan_check_checkpointing
#include "train_samples.h" // defines: train_samples_create, train_samples_step

#include "train_estimate.h" // defines: train_estimate_mlp

extern const train_kind train_kind_mlp; /* below */

static const char *const g_activation_names[] = {"relu", "gelu", "sigmoid", NULL};
/* train_norm is the index of the name. */
static const char *const g_norm_names[] = {"none", "rmsnorm", NULL};
_Static_assert(sizeof(fsdp_activation) == sizeof(int) && sizeof(train_norm) == sizeof(int) &&
                   TRAIN_NORM_RMSNORM == 1,
               "enum keys are stored as int, the index of their name");

static bool parse_activation(const char *text, int *value) {
    fsdp_activation act;
    if (fsdp_activation_parse(text, &act) != FSDP_OK) return false;
    *value = (int)act;
    return true;
}

static const train_key g_keys[] = {
    LIST_KEY("model", "widths", model.widths, "32,64,64,8", 2, TRAIN_MAX_LIST, 1, TRAIN_WIDTH_MAX,
             "layer widths, input first and output last: 32,64,8 is Linear(32, 64), "
             "activation, Linear(64, 8)"),
    ENUM_KEY("model", "activation", model.activation, "relu", g_activation_names, parse_activation,
             "activation between the Linear layers (the teacher uses it too)"),
    ENUM_KEY("model", "norm", model.norm, "none", g_norm_names, NULL,
             "normalisation of the input: none, or rmsnorm (an RMSNorm over widths[0] before "
             "the first Linear, as nn.Sequential(RMSNorm(w0), Linear, ...): the module names "
             "shift by one, the Linear layers become 1, 3, 5, ...)"),
    STRING_KEY("model", "tp_plan", model.tp_plan, "",
               "tensor-parallel plan with tp > 1: comma-separated name=style pairs over the "
               "model's module names (fnmatch patterns allowed), style colwise or rowwise, "
               "e.g. 0=colwise,2=rowwise; a colwise Linear needs a rowwise one after it. Empty: "
               "the Megatron pairs (Linear 2k colwise, 2k+1 rowwise)"),
};

/* tp against the widths the Colwise/Rowwise pairs split; every checkpoint_activations pattern
 * names a module; classification has classes. */
static fsdp_status mlp_check(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE], c[TRAIN_KEY_TEXT_SIZE];
    int64_t classes = cfg->model.widths.v[cfg->model.widths.n - 1];
    if (cfg->data.task == TRAIN_TASK_CLASSIFICATION && classes < 2) {
        snprintf(err, err_size,
                 "%s needs an output width of at least 2 (the number of classes), but %s ends "
                 "in %lld; set the last width to the number of classes",
                 train_config_key_text(cfg, "data", "task", a, sizeof a),
                 train_config_key_text(cfg, "model", "widths", b, sizeof b), (long long)classes);
        return FSDP_ERR_CONFIG;
    }
    fsdp_status cst = train_plan_check_checkpointing(&train_kind_mlp, cfg, err, err_size);
    if (cst != FSDP_OK) return cst;
    int64_t tp = cfg->parallel.tp;
    int n_linear = cfg->model.widths.n - 1;
    train_tp_style styles[TRAIN_MAX_LIST];
    fsdp_status st =
        train_plan_styles_list(&train_kind_mlp, cfg, styles, TRAIN_MAX_LIST, err, err_size);
    if (st != FSDP_OK) return st;
    if (train_config_key_not_for(cfg, "model", "tp_plan", tp > 1, "tp > 1", "parallel", "tp", err,
                                 err_size))
        return FSDP_ERR_CONFIG;
    if (tp > 1 && n_linear < 2) {
        snprintf(err, err_size,
                 "%s needs at least two Linear layers to pair (Colwise, then Rowwise), but %s "
                 "has one; add a hidden width or set tp = 1",
                 train_config_key_text(cfg, "parallel", "tp", a, sizeof a),
                 train_config_key_text(cfg, "model", "widths", c, sizeof c));
        return FSDP_ERR_CONFIG;
    }
    for (int i = 0; tp > 1 && i + 1 < n_linear; i++) { /* a colwise Linear i, rowwise i + 1 */
        int64_t width = cfg->model.widths.v[i + 1];
        if (styles[i] == TRAIN_TP_COLWISE && width % tp != 0) {
            snprintf(err, err_size,
                     "%s must divide the hidden width %lld (entry %d of %s), which Linear %d "
                     "(Colwise) and Linear %d (Rowwise) split over the tp ranks; use a tp that "
                     "divides it or another width",
                     train_config_key_text(cfg, "parallel", "tp", a, sizeof a), (long long)width,
                     i + 2, train_config_key_text(cfg, "model", "widths", c, sizeof c), i, i + 1);
            return FSDP_ERR_CONFIG;
        }
    }
    return FSDP_OK;
}

/* The model [model] describes, initialised from train.seed (shape_only: at width 1):
 * fsdp_model_mlp, or with norm = rmsnorm the same layers after an RMSNorm over the input
 * (nn.RMSNorm's default eps, float32's machine epsilon), as nn.Sequential(RMSNorm(w0), Linear, act,
 * ..., Linear) names them. */
static fsdp_status mlp_build(fsdp_ctx *ctx, const train_config *cfg, bool shape_only,
                             fsdp_module **out) {
    train_int_list ones = {.n = cfg->model.widths.n}; /* shape_only: every width 1 */
    for (int i = 0; i < ones.n; i++) ones.v[i] = 1;
    const train_int_list *w = shape_only ? &ones : &cfg->model.widths;
    uint64_t seed = (uint64_t)cfg->train.seed;
    if (cfg->model.norm == TRAIN_NORM_NONE) {
        TRAIN_TRY(fsdp_model_mlp(ctx, w->n, w->v, cfg->model.activation, out));
        return fsdp_ctx_seed(ctx) == seed ? FSDP_OK : fsdp_module_reset_parameters(ctx, *out, seed);
    }
    fsdp_module *m = NULL, *layer = NULL;
    TRAIN_TRY(fsdp_sequential_create(ctx, &m));
    fsdp_status st = fsdp_rmsnorm_create(ctx, w->v[0], FLT_EPSILON, &layer);
    if (st == FSDP_OK) st = fsdp_sequential_append(ctx, m, layer);
    for (int i = 0; st == FSDP_OK && i + 1 < w->n; i++) {
        st = fsdp_linear_create(ctx, w->v[i], w->v[i + 1], true, &layer);
        if (st == FSDP_OK) st = fsdp_sequential_append(ctx, m, layer);
        if (st != FSDP_OK || i + 2 == w->n) continue;
        fsdp_activation act = cfg->model.activation;
        st = act == FSDP_ACT_GELU      ? fsdp_gelu_create(ctx, &layer)
             : act == FSDP_ACT_SIGMOID ? fsdp_sigmoid_create(ctx, &layer)
                                       : fsdp_relu_create(ctx, &layer);
        if (st == FSDP_OK) st = fsdp_sequential_append(ctx, m, layer);
    }
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m, seed);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return st;
    }
    *out = m;
    return FSDP_OK;
}

/* The root's children: "0", "1", ... */
static int mlp_checkpointable(fsdp_module *model, fsdp_module **out, int max) {
    int n = fsdp_module_num_children(model);
    for (int i = 0; i < n && i < max; i++) out[i] = fsdp_module_child(model, i);
    return n < max ? n : max;
}

/* wrap = layer: a unit per Linear but the output one (the root keeps it). */
static void mlp_wrap_layers(fsdp_module *model, fsdp_fully_shard_options *o, const char **storage,
                            int max) {
    int n = 0;
    for (int i = 0; i < fsdp_module_num_children(model); i++) {
        fsdp_module *c = fsdp_module_child(model, i);
        if (strcmp(fsdp_module_kind(c), "Linear") == 0 && n < max)
            storage[n++] = fsdp_module_fqn(c);
    }
    o->wrap_paths = storage;
    o->n_wrap_paths = n > 0 ? n - 1 : 0;
}

static fsdp_status mlp_feed(fsdp_ctx *ctx, const train_rank_env *env, void **feed,
                            train_feed_info *info) {
    const train_int_list *w = &env->cfg->model.widths;
    return train_samples_create(ctx, env, w->v[0], w->v[w->n - 1], feed, info);
}

/* Parameters of the MLP over widths (the whole model, whatever the layout). */
static int64_t mlp_param_count(const train_int_list *w) {
    int64_t n = 0;
    for (int i = 0; i + 1 < w->n; i++) n += w->v[i] * w->v[i + 1] + w->v[i + 1];
    return n;
}

/* "MLP 32-64-64-8 (relu, N parameters), teacher ..." */
static void mlp_banner(const train_config *cfg, const void *feed, FILE *out) {
    char mw[256] = "";
    const train_int_list *w = &cfg->model.widths;
    for (int i = 0; i < w->n; i++)
        train_append(mw, sizeof mw, "%s%lld", i ? "-" : "", (long long)w->v[i]);
    fprintf(out, "MLP %s (%s, %lld parameters), ", mw,
            fsdp_activation_to_string(cfg->model.activation), (long long)mlp_param_count(w));
    train_samples_banner(cfg, feed, out);
}

/* 6 N, N the Linear layers' weights (2 N multiply-adds forward, 4 N backward). */
static fsdp_status mlp_flops_per_sample(fsdp_ctx *ctx, const train_config *cfg, double *out) {
    (void)ctx;
    const train_int_list *w = &cfg->model.widths;
    double n = 0;
    for (int i = 0; i + 1 < w->n; i++) n += (double)w->v[i] * (double)w->v[i + 1];
    *out = 6 * n;
    return FSDP_OK;
}

const train_kind train_kind_mlp = {
    .name = "mlp",
    .help = "Linear layers over widths, with an activation between them",
    .state_advice = "nn.Sequential(Linear, activation, Linear, ...) names them (0.weight, "
                    "0.bias, 2.weight, ...)",
    .keys = g_keys,
    .n_keys = (int)(sizeof g_keys / sizeof g_keys[0]),
    .data_kinds = 1u << TRAIN_DATA_SYNTHETIC | 1u << TRAIN_DATA_H5,
    .data_advice = "a token file trains a Llama model; set [model] kind = llama (or another "
                   "[data] kind)",
    .check = mlp_check,
    .build = mlp_build,
    .checkpointable = mlp_checkpointable,
    .parallelize = train_plan_apply,
    .wrap_layers = mlp_wrap_layers,
    .load = train_samples_load,
    .unload = train_samples_unload,
    .feed_create = mlp_feed,
    .feed_free = train_samples_free,
    .step = train_samples_step,
    .loss = train_samples_loss,
    .banner = mlp_banner,
    .done = train_samples_done,
    .flops_per_sample = mlp_flops_per_sample,
    .estimate = train_estimate_mlp,
};
