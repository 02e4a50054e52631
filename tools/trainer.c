/* trainer.c: fsdp-train's training run: an MLP fits a dataset (a fixed random teacher network
 * on inputs drawn from the counter RNG by global sample index, or an HDF5 file's samples) by
 * regression (MSE) or classification (cross-entropy), with SGD, Adam or AdamW under a learning
 * rate schedule, on a world of ranks: tensor parallelism over tp, FSDP or replicas over dp,
 * each dp rank on its slice of every batch; the held-out split is evaluated as it goes. The
 * tool and tests/test_train.c share it. */
#define _POSIX_C_SOURCE 200809L // clock_gettime, open_memstream, mkdtemp, stat

#include "trainer.h"

#include <errno.h>
#include <float.h>   // defines: FLT_EPSILON
#include <fnmatch.h> // defines: fnmatch
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: stat, mkdir, S_ISDIR, S_ISREG
#include <time.h>
#include <unistd.h> // defines: isatty

#include "fsdp/version.h" // defines: FSDP_VERSION_STRING
#include "train_ckpt.h"   // defines: train_sources, train_saver, train_ckpt_resume
#include "train_data.h"   // defines: train_data_load, train_order_sample
#include "train_finite.h" // defines: train_params_finite
#include "train_llama.h"  // defines: train_llama_build, train_llama_forward_loss, train_llama_loss
#include "train_tokens.h" // defines: train_tokens_load

atomic_int train_stop_signal = 0;

/* Returns the status of expr when it fails. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        fsdp_status try_st_ = (expr);                                                              \
        if (try_st_ != FSDP_OK) return try_st_;                                                    \
    } while (0)

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void format_widths(const int64_t *w, int n, char *buf, size_t size) {
    buf[0] = '\0';
    for (int i = 0; i < n; i++) train_append(buf, size, "%s%lld", i ? "-" : "", (long long)w[i]);
}

/* The teacher's widths: the model's input, data.teacher_widths, the model's output. */
static int teacher_widths(const train_config *cfg, int64_t *w) {
    int n = 0;
    w[n++] = cfg->model.widths.v[0];
    for (int i = 0; i < cfg->data.teacher_widths.n; i++) w[n++] = cfg->data.teacher_widths.v[i];
    w[n++] = cfg->model.widths.v[cfg->model.widths.n - 1];
    return n;
}

/* Dataset streams and the teacher's seed: fixed functions of data.seed, distinct from any
 * parameter's stream so the teacher never equals the student's initialisation. */
#define STREAM_INPUTS  "fsdp-train/inputs"
#define STREAM_NOISE   "fsdp-train/noise"
#define STREAM_TEACHER "fsdp-train/teacher"

/* x (samples, in): x[i][j] = normal(data.seed, inputs, i*in + j); y (samples, out) = teacher(x)
 * + noise. Both are functions of the global sample index only. */
static fsdp_status make_dataset(fsdp_ctx *ctx, const train_config *cfg, fsdp_tensor *x,
                                fsdp_tensor *y) {
    uint64_t seed = (uint64_t)cfg->data.seed;
    int64_t n = fsdp_tensor_numel(x);
    float *xs = fsdp_tensor_f32(x);
    uint64_t inputs = fsdp_rng_stream(STREAM_INPUTS);
    for (int64_t i = 0; i < n; i++) xs[i] = fsdp_rng_normal(seed, inputs, (uint64_t)i);

    int64_t w[TRAIN_MAX_LIST];
    int nw = teacher_widths(cfg, w);
    fsdp_module *teacher = NULL;
    const fsdp_tensor *out = NULL;
    fsdp_status st = fsdp_model_mlp(ctx, nw, w, cfg->model.activation, &teacher);
    if (st == FSDP_OK)
        st = fsdp_module_reset_parameters(ctx, teacher, seed ^ fsdp_rng_stream(STREAM_TEACHER));
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, teacher, x, &out);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, y, out);
    fsdp_module_free(teacher);
    if (st != FSDP_OK || cfg->data.noise == 0) return st;
    float *ys = fsdp_tensor_f32(y);
    uint64_t noise = fsdp_rng_stream(STREAM_NOISE);
    for (int64_t i = 0; i < fsdp_tensor_numel(y); i++)
        ys[i] += (float)cfg->data.noise * fsdp_rng_normal(seed, noise, (uint64_t)i);
    return FSDP_OK;
}

/* Class ids (samples) of a synthetic classification dataset: the argmax of the teacher's
 * output row (the first maximum). */
static void argmax_rows(const float *v, int64_t rows, int64_t cols, int32_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        int32_t best = 0;
        for (int64_t c = 1; c < cols; c++)
            if (v[r * cols + c] > v[r * cols + best]) best = (int32_t)c;
        out[r] = best;
    }
}

/* Parameters of the MLP over widths (the whole model, whatever the layout). */
static int64_t mlp_param_count(const train_int_list *w) {
    int64_t n = 0;
    for (int i = 0; i + 1 < w->n; i++) n += w->v[i] * w->v[i + 1] + w->v[i + 1];
    return n;
}

/* Collectives of the training steps since the last metrics record, on rank 0 (from its
 * comm-debug counters): per op (fsdp_comm_op) calls, bytes and seconds; the steps' wall time. */
typedef struct train_comm {
    fsdp_comm_count count[FSDP_COMM_OP_COUNT];
    double seconds[FSDP_COMM_OP_COUNT];
    double step_seconds;
} train_comm;

/* The progress bar on rank 0's output, redrawn in place between the log lines. */
typedef struct train_bar {
    bool on;          /* [log] progress = bar, or auto on a terminal */
    bool shown;       /* a bar is on the line now */
    double last_draw; /* when it was drawn */
} train_bar;

/* What one rank holds. Linear i of the MLP is child "2i" of its Sequential ("2i+1" with
 * norm = rmsnorm, whose RMSNorm is child "0"). */
typedef struct train_state {
    train_layout layout;
    fsdp_mesh *mesh;                /* (dp, tp), or (replicate, shard, tp) for hybrid_shard */
    fsdp_group *dp;                 /* the data-parallel group: the mesh's, or dp_owned */
    fsdp_group *dp_owned;           /* hybrid_shard: the replicate x shard ranks of this tp index */
    int dp_rank;                    /* this rank's index in dp */
    char paths[TRAIN_MAX_LIST][12]; /* module paths of the Linear layers, "0", "2", ... (with
                                       norm = rmsnorm "1", "3", ...) */
    const char *path_ptrs[TRAIN_MAX_LIST];
    fsdp_tp_plan_entry plan[TRAIN_MAX_LIST];
    fsdp_module *model;
    fsdp_sharded *sh;    /* mode fsdp */
    fsdp_replicate *rep; /* mode replicate: borrowed from the model */
    int64_t micro;       /* samples of a micro-batch: batch_size / grad_accum */
    fsdp_optimizer *opt;
    fsdp_lr_schedule sched;  /* [optim] schedule over [train] steps */
    bool classify;           /* [data] task = classification */
    fsdp_tensor *x, *y;      /* the dataset, on every rank: (samples, in), (samples, out) */
    int32_t *labels;         /* classification: (samples) class ids */
    int64_t n_train, n_eval; /* training samples [0, n_train), held-out [n_train, samples) */
    train_order order;       /* the training samples' order */
    fsdp_tensor *xb, *yb;    /* this rank's slice of a batch: (len, in), (len, out) */
    int32_t *lb;             /* classification: (len) the slice's class ids */
    fsdp_tensor *dout;       /* d(global loss)/d(prediction) * dp: (len, out) */
    fsdp_tensor *loss;       /* (2): this rank's shares of a loss and a count, then sums */
    int64_t off, len;        /* the slice: samples [off, off + len) of each batch */
    FILE *out;               /* rank 0's progress stream, or NULL */
    const char *out_name;    /* "the progress to stdout", for messages */
    FILE *metrics;           /* rank 0's metrics file, or NULL */
    char metrics_name[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64]; /* for messages */
    train_saver saver; /* [checkpoint] dir set: the writer and the state it saves */
    bool saving;       /* saver is made */
    fsdp_tensor *stop; /* (1): the stop flag, the max over the world (several ranks) */
    bool counting;     /* rank 0 counts its collectives: [log] comm_debug or metrics */
    train_comm comm;   /* what the steps since the last record communicated */
    train_bar bar;     /* the progress bar */
    /* [model] kind = llama: the token file's sequences (then x, y, xb, yb are unused; n_train
     * and n_eval count the probe and held-out sequences) */
    train_llama *llama;
    const train_tokens *tokens;
} train_state;

static void train_state_free(fsdp_ctx *ctx, train_state *s) {
    if (s->saving) train_saver_free(ctx, &s->saver); /* commits a save in flight */
    train_llama_free(s->llama);
    fsdp_tensor_free(s->stop);
    fsdp_optimizer_free(s->opt);
    fsdp_sharded_free(s->sh);
    fsdp_module_free(s->model);
    fsdp_tensor_free(s->x);
    fsdp_tensor_free(s->y);
    free(s->labels);
    free(s->lb);
    train_order_free(&s->order);
    fsdp_tensor_free(s->xb);
    fsdp_tensor_free(s->yb);
    fsdp_tensor_free(s->dout);
    fsdp_tensor_free(s->loss);
    fsdp_group_free(s->dp_owned);
    fsdp_mesh_free(s->mesh);
    if (s->metrics) fclose(s->metrics);
}

/* The mesh and the dp group. hybrid_shard's mesh is (replicate, shard, tp) and its dp group
 * the replicate x shard ranks sharing this tp index, in world-rank order (= dp index). */
static fsdp_status setup_mesh(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    const train_layout *l = &s->layout;
    bool hybrid =
        cfg->parallel.mode == TRAIN_MODE_FSDP && cfg->parallel.strategy == FSDP_HYBRID_SHARD;
    fsdp_status st;
    if (hybrid) {
        st = fsdp_mesh_create(ctx, 3, (int[]){l->replicas, l->shard, l->tp},
                              (const char *[]){"replicate", "shard", "tp"}, &s->mesh);
        if (st == FSDP_OK)
            st = fsdp_group_split(ctx, NULL, fsdp_mesh_coordinate(s->mesh, 2), fsdp_ctx_rank(ctx),
                                  "dp", &s->dp_owned);
        s->dp = s->dp_owned;
    } else {
        st =
            fsdp_mesh_create(ctx, 2, (int[]){l->dp, l->tp}, (const char *[]){"dp", "tp"}, &s->mesh);
        if (st == FSDP_OK) st = fsdp_mesh_get_group(ctx, s->mesh, "dp", &s->dp);
    }
    if (st == FSDP_OK) s->dp_rank = fsdp_group_rank(s->dp);
    return st;
}

/* Tensor parallelism as [model] tp_plan says (by default Linear 2k Colwise and Linear 2k+1
 * Rowwise over tp, so the hidden width between them is sharded and the pair's output is
 * replicated again; with an odd number of Linear layers the last one stays whole on every tp
 * rank). The plan was checked with the configuration. */
static fsdp_status apply_tp(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    train_tp_style styles[TRAIN_MAX_LIST];
    char err[TRAIN_ERROR_SIZE];
    if (train_config_tp_plan(cfg, styles, err, sizeof err) != FSDP_OK)
        return FSDP_ERR_CONFIG; /* not reached: train_run checked the configuration */
    int n = 0;
    for (int i = 0; i + 1 < cfg->model.widths.n; i++)
        if (styles[i] != TRAIN_TP_NONE)
            s->plan[n++] = (fsdp_tp_plan_entry){
                s->paths[i], styles[i] == TRAIN_TP_COLWISE ? FSDP_COLWISE() : FSDP_ROWWISE()};
    fsdp_mesh *tp = NULL;
    TRY(fsdp_mesh_dim(ctx, s->mesh, "tp", &tp));
    /* every rank initialised the same values from train.seed: no broadcast needed */
    fsdp_tp_options o = {.src_rank = cfg->parallel.sync_module_states ? 0 : FSDP_NO_SRC_RANK};
    return fsdp_tp_parallelize(ctx, s->model, tp, n, s->plan, &o);
}

/* [model] checkpoint_activations: every module a pattern matches recomputes its activations in
 * backward (the patterns were checked with the configuration). */
static fsdp_status apply_checkpointing(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING];
    train_module_info m[TRAIN_MAX_MODULES];
    int n = train_config_checkpoint_patterns(cfg, patterns), n_mod = train_config_modules(cfg, m);
    for (int i = 0; i < n_mod; i++) {
        bool match = false;
        for (int p = 0; p < n && !match; p++) match = fnmatch(patterns[p], m[i].name, 0) == 0;
        if (match) TRY(fsdp_checkpoint_wrap(ctx, fsdp_module_find(s->model, m[i].name)));
    }
    return FSDP_OK;
}

/* FSDP over dp (hybrid_shard: over shard, replicated over replicate), or replicas. */
static fsdp_status apply_dp(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    if (cfg->parallel.mode == TRAIN_MODE_REPLICATE) {
        double mb = cfg->parallel.bucket_mb;
        fsdp_replicate_options o = {.group = s->dp,
                                    .src_rank =
                                        cfg->parallel.sync_module_states ? 0 : FSDP_NO_SRC_RANK,
                                    .bucket_bytes = mb > 0 ? (int64_t)ceil(mb * 1024 * 1024) : 0,
                                    .comm_hook = {.kind = cfg->parallel.comm_hook},
                                    .mixed_precision = train_config_mixed_precision(cfg)};
        return fsdp_replicate_apply(ctx, s->model, &o, &s->rep);
    }
    fsdp_fully_shard_options o = {.strategy = cfg->parallel.strategy,
                                  .group = s->dp,
                                  .offload_params = cfg->parallel.offload,
                                  .sync_module_states = cfg->parallel.sync_module_states,
                                  .use_orig_params = cfg->parallel.use_orig_params,
                                  .comm_hook = {.kind = cfg->parallel.comm_hook},
                                  .mixed_precision = train_config_mixed_precision(cfg)};
    if (cfg->parallel.strategy == FSDP_HYBRID_SHARD) {
        TRY(fsdp_mesh_get_group(ctx, s->mesh, "shard", &o.group));
        TRY(fsdp_mesh_get_group(ctx, s->mesh, "replicate", &o.replicate_group));
    }
    static const char *const llama_layer[] = {TRAIN_LLAMA_LAYER_KIND};
    if (cfg->parallel.wrap == TRAIN_WRAP_LAYER && s->llama) { /* a unit per decoder layer */
        o.wrap_kinds = llama_layer;
        o.n_wrap_kinds = 1;
    } else if (cfg->parallel.wrap == TRAIN_WRAP_LAYER) { /* every Linear but the output one */
        o.wrap_paths = s->path_ptrs;
        o.n_wrap_paths = cfg->model.widths.n - 2;
    }
    return fsdp_fully_shard(ctx, s->model, &o, &s->sh);
}

static fsdp_status new_f32(fsdp_ctx *ctx, int64_t rows, int64_t cols, fsdp_tensor **out) {
    return fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){rows, cols}, out);
}

/* The optimizer [optim] names over params, with weight_decay 0 for the no_decay patterns
 * (the library's parameter groups), and the lr schedule. */
static fsdp_status make_optimizer(fsdp_ctx *ctx, const train_config *cfg, fsdp_module *params,
                                  train_state *s) {
    char patterns[TRAIN_MAX_NO_DECAY][TRAIN_MAX_STRING];
    fsdp_param_group groups[TRAIN_MAX_NO_DECAY];
    int n = train_config_no_decay(cfg, patterns);
    for (int i = 0; i < n; i++)
        groups[i] = (fsdp_param_group){.pattern = patterns[i], .weight_decay = FSDP_OVERRIDE(0.0)};
    n = n < 0 ? 0 : n;
    s->sched = (fsdp_lr_schedule){.kind = (fsdp_lr_schedule_kind)cfg->optim.schedule,
                                  .base_lr = cfg->optim.lr,
                                  .warmup_steps = cfg->optim.warmup_steps,
                                  .total_steps = cfg->train.steps,
                                  .min_lr = cfg->optim.min_lr};
    TRY(fsdp_lr_schedule_check(ctx, &s->sched));
    if (cfg->optim.name == TRAIN_OPTIM_SGD) {
        fsdp_sgd_options o = {.lr = cfg->optim.lr,
                              .momentum = cfg->optim.momentum,
                              .weight_decay = cfg->optim.weight_decay,
                              .nesterov = cfg->optim.nesterov,
                              .param_groups = n ? groups : NULL,
                              .n_param_groups = n};
        return fsdp_sgd_create(ctx, params, &o, &s->opt);
    }
    fsdp_adam_options o = {.lr = cfg->optim.lr,
                           .beta1 = cfg->optim.betas.v[0],
                           .beta2 = cfg->optim.betas.v[1],
                           .eps = cfg->optim.eps,
                           .weight_decay = cfg->optim.weight_decay,
                           .param_groups = n ? groups : NULL,
                           .n_param_groups = n};
    if (o.beta1 == 0) o.beta1 = 1e-30; /* 0 would select the default (optim.h) */
    if (o.beta2 == 0) o.beta2 = 1e-30;
    return cfg->optim.name == TRAIN_OPTIM_ADAM ? fsdp_adam_create(ctx, params, &o, &s->opt)
                                               : fsdp_adamw_create(ctx, params, &o, &s->opt);
}

/* The model [model] describes, initialised from train.seed: fsdp_model_mlp, or with norm =
 * rmsnorm the same layers after an RMSNorm over the input (nn.RMSNorm's default eps, float32's
 * machine epsilon), as nn.Sequential(RMSNorm(w0), Linear, act, ..., Linear) names them. */
static fsdp_status build_model(fsdp_ctx *ctx, const train_config *cfg, fsdp_module **out) {
    const train_int_list *w = &cfg->model.widths;
    uint64_t seed = (uint64_t)cfg->train.seed;
    if (cfg->model.norm == TRAIN_NORM_NONE) {
        TRY(fsdp_model_mlp(ctx, w->n, w->v, cfg->model.activation, out));
        return fsdp_ctx_seed(ctx) == seed ? FSDP_OK : fsdp_module_reset_parameters(ctx, *out, seed);
    }
    fsdp_module *m = NULL, *layer = NULL;
    TRY(fsdp_sequential_create(ctx, &m));
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

/* The rank's copy of the dataset: the h5 data read by the process, or the synthetic teacher's;
 * with classification the class ids. */
static fsdp_status make_data(fsdp_ctx *ctx, const train_config *cfg, const train_data *data,
                             train_state *s) {
    int64_t n = fsdp_tensor_dim(s->x, 0), in = fsdp_tensor_dim(s->x, 1);
    int64_t out = fsdp_tensor_dim(s->y, 1);
    if (data) {
        memcpy(fsdp_tensor_f32(s->x), data->x, (size_t)(n * in) * sizeof(float));
        if (data->y) memcpy(fsdp_tensor_f32(s->y), data->y, (size_t)(n * out) * sizeof(float));
    } else {
        TRY(make_dataset(ctx, cfg, s->x, s->y));
    }
    if (!s->classify) return FSDP_OK;
    if (!(s->labels = malloc((size_t)n * sizeof *s->labels))) return FSDP_ERR_OUT_OF_MEMORY;
    if (data)
        memcpy(s->labels, data->labels, (size_t)n * sizeof *s->labels);
    else
        argmax_rows(fsdp_tensor_f32(s->y), n, out, s->labels);
    return FSDP_OK;
}

/* [model] kind = llama (after the mesh): the model with TP (train_llama.c), FSDP or replicate
 * over dp, the optimizer and this rank's batch of sequences. */
static fsdp_status llama_setup(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                               const char **what) {
    s->n_train = s->tokens->n_probe;
    s->n_eval = s->tokens->n_eval;
    s->micro = cfg->data.batch_size / cfg->train.grad_accum;
    fsdp_chunk_range(s->micro, s->layout.dp, s->dp_rank, &s->off, &s->len);
    fsdp_status st = train_llama_build(ctx, cfg, s->mesh, &s->model);
    if (st == FSDP_OK && fsdp_ctx_seed(ctx) != (uint64_t)cfg->train.seed)
        st = fsdp_module_reset_parameters(ctx, s->model, (uint64_t)cfg->train.seed);
    *what = "allocating the batch";
    if (st == FSDP_OK)
        st = train_llama_create(
            ctx, cfg, s->tokens, s->micro, s->dp, s->layout.dp, s->dp_rank, s->layout.tp,
            fsdp_mesh_coordinate(s->mesh, fsdp_mesh_ndim(s->mesh) - 1), &s->llama, &s->dout);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){2}, &s->loss);
    if (st == FSDP_OK) st = train_order_init(&s->order, cfg, s->n_train);
    *what = cfg->parallel.mode == TRAIN_MODE_FSDP ? "applying FSDP" : "making the replicas";
    if (st == FSDP_OK) st = apply_dp(ctx, cfg, s);
    *what = "creating the optimizer";
    fsdp_module *params = s->sh ? fsdp_sharded_flat_params(s->sh) : s->model;
    return st == FSDP_OK ? make_optimizer(ctx, cfg, params, s) : st;
}

/* Builds the mesh, the model with its parallelism, the optimizer, the dataset and this rank's
 * batch tensors; all allocation of a run is here. data: the h5 dataset, NULL for synthetic. */
static fsdp_status train_setup(fsdp_ctx *ctx, const train_config *cfg, const train_data *data,
                               train_state *s, const char **what) {
    const train_int_list *w = &cfg->model.widths;
    int64_t in = w->v[0], out = w->v[w->n - 1];
    int64_t n = data ? data->n : cfg->data.samples, b = cfg->data.batch_size;
    s->classify = cfg->data.task == TRAIN_TASK_CLASSIFICATION;
    s->n_eval = train_data_eval_count(cfg, n);
    s->n_train = n - s->n_eval;
    train_module_info mods[TRAIN_MAX_MODULES];
    int n_mod = train_config_modules(cfg, mods);
    for (int i = 0; i < n_mod; i++) {
        if (mods[i].linear < 0) continue;
        memcpy(s->paths[mods[i].linear], mods[i].name, sizeof s->paths[0]); /* both 12 bytes */
        s->path_ptrs[mods[i].linear] = s->paths[mods[i].linear];
    }
    fsdp_status st;
    *what = "creating the device mesh";
    if ((st = setup_mesh(ctx, cfg, s))) return st;
    *what = "building the model";
    if (s->tokens) return llama_setup(ctx, cfg, s, what);
    if ((st = build_model(ctx, cfg, &s->model))) return st;
    *what = "applying tensor parallelism";
    if (s->layout.tp > 1 && (st = apply_tp(ctx, cfg, s))) return st;
    *what = "checkpointing activations";
    if ((st = apply_checkpointing(ctx, cfg, s))) return st;
    *what = cfg->parallel.mode == TRAIN_MODE_FSDP ? "applying FSDP" : "making the replicas";
    if ((st = apply_dp(ctx, cfg, s))) return st;
    *what = "creating the optimizer";
    fsdp_module *params = s->sh ? fsdp_sharded_flat_params(s->sh) : s->model;
    if ((st = make_optimizer(ctx, cfg, params, s))) return st;
    *what = "allocating the dataset";
    s->micro = b / cfg->train.grad_accum;
    fsdp_chunk_range(s->micro, s->layout.dp, s->dp_rank, &s->off, &s->len);
    if ((st = new_f32(ctx, n, in, &s->x)) || (st = new_f32(ctx, n, out, &s->y)) ||
        (st = new_f32(ctx, s->len, in, &s->xb)) || (st = new_f32(ctx, s->len, out, &s->yb)) ||
        (st = new_f32(ctx, s->len, out, &s->dout)) ||
        (st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){2}, &s->loss)) ||
        (st = train_order_init(&s->order, cfg, s->n_train)))
        return st;
    if (s->classify && !(s->lb = malloc((size_t)(s->len ? s->len : 1) * sizeof *s->lb)))
        return FSDP_ERR_OUT_OF_MEMORY;
    *what = data ? "copying the dataset" : "computing the teacher's targets";
    return make_data(ctx, cfg, data, s);
}

/* The sums over dp of each rank's `share` (the rank's loss weighted by its part of the
 * samples) and `count` (its correct predictions, exact in f32 below 2^24): the global values,
 * the same on every rank. One rank: its own. */
static fsdp_status sum_over_dp(fsdp_ctx *ctx, train_state *s, double share, double count,
                               double *total, double *total_count) {
    if (s->layout.dp == 1) {
        *total = share;
        if (total_count) *total_count = count;
        return FSDP_OK;
    }
    fsdp_tensor_f32(s->loss)[0] = (float)share;
    fsdp_tensor_f32(s->loss)[1] = (float)count;
    TRY(fsdp_all_reduce(ctx, s->dp, s->loss, FSDP_REDUCE_SUM));
    *total = fsdp_tensor_f32(s->loss)[0];
    if (total_count) *total_count = fsdp_tensor_f32(s->loss)[1];
    return FSDP_OK;
}

/* Rows of pred (rows, out) whose argmax is the label. */
static int64_t count_correct(const fsdp_tensor *pred, const int32_t *labels, int64_t rows) {
    int32_t *best = malloc((size_t)(rows ? rows : 1) * sizeof *best);
    if (!best) return -1;
    argmax_rows(fsdp_tensor_f32(pred), rows, fsdp_tensor_dim(pred, 1), best);
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) n += best[r] == labels[r];
    free(best);
    return n;
}

/* The loss of the model over samples [first, first + n) (one forward, no gradients), and
 * with classification the fraction of them it classifies right (else NAN): each dp rank takes
 * its torch.chunk of the samples. */
static fsdp_status range_loss(fsdp_ctx *ctx, train_state *s, int64_t first, int64_t n, double *loss,
                              double *accuracy) {
    if (s->llama) { /* [0, n_train): the probe sequences; else the held-out ones */
        if (accuracy) *accuracy = NAN;
        return train_llama_loss(ctx, s->llama, s->model, first > 0, loss);
    }
    int64_t off, len;
    int64_t in = fsdp_tensor_dim(s->x, 1), out = fsdp_tensor_dim(s->y, 1);
    fsdp_chunk_range(n, s->layout.dp, s->dp_rank, &off, &len);
    off += first;
    fsdp_tensor *x = NULL, *y = NULL;
    const fsdp_tensor *pred = NULL;
    float l = 0;
    int64_t right = 0;
    fsdp_status st = fsdp_tensor_view(ctx, s->x, off * in, 2, (int64_t[]){len, in}, &x);
    if (st == FSDP_OK) st = fsdp_tensor_view(ctx, s->y, off * out, 2, (int64_t[]){len, out}, &y);
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, s->model, x, &pred); /* every rank joins */
    if (st == FSDP_OK && len > 0 && s->classify)
        st = fsdp_loss_cross_entropy(ctx, pred, s->labels + off, &l, NULL);
    else if (st == FSDP_OK && len > 0)
        st = fsdp_loss_mse(ctx, pred, y, &l, NULL);
    if (st == FSDP_OK && len > 0 && s->classify &&
        (right = count_correct(pred, s->labels + off, len)) < 0)
        st = FSDP_ERR_OUT_OF_MEMORY;
    double total_right = 0;
    if (st == FSDP_OK)
        st = sum_over_dp(ctx, s, (double)l * (double)len / (double)n, (double)right, loss,
                         &total_right);
    if (accuracy) *accuracy = s->classify ? total_right / (double)n : NAN;
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    return st;
}

/* The loss over the training samples. */
static fsdp_status dataset_loss(fsdp_ctx *ctx, train_state *s, double *loss) {
    return range_loss(ctx, s, 0, s->n_train, loss, NULL);
}

/* Copies the rows of the batch slice into xb, yb (regression) or lb (classification): row r is
 * sample train_order_sample(k0 + off + r). */
static void gather_batch(train_state *s, int64_t k0) {
    int64_t in = fsdp_tensor_dim(s->x, 1), out = fsdp_tensor_dim(s->y, 1);
    const float *x = fsdp_tensor_f32(s->x), *y = fsdp_tensor_f32(s->y);
    float *xb = fsdp_tensor_f32(s->xb), *yb = fsdp_tensor_f32(s->yb);
    for (int64_t r = 0; r < s->len; r++) {
        int64_t i = train_order_sample(&s->order, k0 + s->off + r);
        memcpy(xb + r * in, x + i * in, (size_t)in * sizeof(float));
        if (s->classify)
            s->lb[r] = s->labels[i];
        else
            memcpy(yb + r * out, y + i * out, (size_t)out * sizeof(float));
    }
}

/* Gradient reduction on (sync) or off (no_sync: backward accumulates locally) for the
 * backwards that follow. */
static void set_sync(train_state *s, bool sync) {
    if (s->sh) fsdp_sharded_set_sync(s->sh, sync);
    if (s->rep) fsdp_replicate_set_sync(s->rep, sync);
}

/* One training step on the batch that starts at position `start` of the sample stream
 * (train_order): zero the gradients, then for each of the grad_accum micro-batches (micro
 * samples each, consecutive in the batch) forward and backward on this rank's slice of it, the
 * gradients reduced by the last backward only (no_sync before it); *loss is the global batch
 * loss. The gradient of the mean over a slice is scaled by len * dp / B, so that dp's average
 * (FSDP's and replicate's reductions divide by dp) of the sum over the micro-batches is the
 * gradient of the mean over the whole batch, also when the slices are uneven (or empty). */
static fsdp_status train_step(fsdp_ctx *ctx, const train_config *cfg, train_state *s, int64_t start,
                              double *loss) {
    int64_t b = cfg->data.batch_size, n_micro = cfg->train.grad_accum;
    double share = 0; /* this rank's part of the batch loss */
    TRY(fsdp_optimizer_zero_grad(ctx, s->opt));
    for (int64_t m = 0; m < n_micro; m++) {
        const fsdp_tensor *pred = NULL;
        float l = 0;
        if (n_micro > 1) set_sync(s, m == n_micro - 1);
        if (s->llama) { /* the slice's sequences of the token file */
            TRY(train_llama_forward_loss(ctx, s->llama, s->model, start + m * s->micro, s->dout,
                                         &l));
        } else {
            gather_batch(s, start + m * s->micro);
            TRY(fsdp_module_forward(ctx, s->model, s->xb, &pred));
            if (s->len > 0 && s->classify)
                TRY(fsdp_loss_cross_entropy(ctx, pred, s->lb, &l, s->dout));
            else if (s->len > 0)
                TRY(fsdp_loss_mse(ctx, pred, s->yb, &l, s->dout));
        }
        double scale = (double)s->len * s->layout.dp / (double)b;
        if (scale != 1.0) {
            float *d = fsdp_tensor_f32(s->dout);
            for (int64_t i = 0; i < fsdp_tensor_numel(s->dout); i++) d[i] *= (float)scale;
        }
        TRY(fsdp_module_backward(ctx, s->model, s->dout, NULL)); /* no input gradient */
        share += (double)l * (double)s->len / (double)b;
    }
    return sum_over_dp(ctx, s, share, 0, loss, NULL);
}

/* Flushes f; when that or an earlier write to f failed, writes "cannot write <name>: <why>"
 * into err. A full disk, or stdout on /dev/full, fails the run instead of passing unseen. */
static fsdp_status flush_checked(FILE *f, const char *name, char *err, size_t err_size) {
    errno = 0;
    if (fflush(f) == 0 && !ferror(f)) return FSDP_OK;
    snprintf(err, err_size, "cannot write %s: %s", name, errno ? strerror(errno) : "write error");
    return FSDP_ERR_IO;
}

/* What a logged step reports. */
typedef struct train_report {
    bool progress;        /* a progress line: loss, samples_per_s, elapsed, lr, grad_norm */
    double loss;          /* batch losses averaged since the last line */
    double samples_per_s; /* since the last line */
    double elapsed;       /* seconds since the loop started */
    double lr;            /* of the step's update */
    double grad_norm;     /* before clipping; NAN without clipping */
    bool eval;            /* an evaluation: eval_loss, eval_accuracy */
    double eval_loss;
    double eval_accuracy;   /* NAN for regression */
    const train_comm *comm; /* progress with counting on: the steps' collectives, else NULL */
} train_report;

/* Takes the progress bar off its line, so that a line can be written there. */
static void bar_clear(train_state *s) {
    if (!s->bar.shown) return;
    fputs("\r\033[K", s->out);
    s->bar.shown = false;
}

/* "1m05s", "2h03m", "12s" */
static void format_duration(double seconds, char *buf, size_t size) {
    long long t = (long long)(seconds + 0.5);
    if (t >= 3600)
        snprintf(buf, size, "%lldh%02lldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, size, "%lldm%02llds", t / 60, t % 60);
    else
        snprintf(buf, size, "%llds", t);
}

/* Redraws the bar after `step` (of this run's first..last), at most 10 times a second:
 * "step 1200/5000 [#####...............]  24%  loss 0.012345  51234 samples/s  ETA 7s". */
static fsdp_status bar_draw(const train_config *cfg, train_state *s, const train_progress *prog,
                            int64_t first, double loss, double elapsed, char *err,
                            size_t err_size) {
    double now = now_seconds();
    if (s->bar.shown && now - s->bar.last_draw < 0.1) return FSDP_OK;
    enum { WIDTH = 24 };
    int64_t step = prog->step, total = cfg->train.steps, done = step - first + 1;
    int filled = (int)((double)WIDTH * (double)step / (double)total);
    char bar[WIDTH + 1], eta[32];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    format_duration(elapsed / (double)done * (double)(total - step), eta, sizeof eta);
    int digits = snprintf(NULL, 0, "%lld", (long long)total);
    int64_t per_step = cfg->data.batch_size * (s->llama ? cfg->model.max_seq_len : 1);
    fprintf(s->out, "\r\033[Kstep %*lld/%lld [%s] %3d%%  loss %.6f  %.0f %s/s  ETA %s", digits,
            (long long)step, (long long)total, bar, (int)(100 * step / total),
            prog->since ? prog->loss_sum / (double)prog->since : loss,
            (double)(done * per_step) / fmax(elapsed, 1e-9), s->llama ? "tokens" : "samples", eta);
    s->bar.shown = true;
    s->bar.last_draw = now;
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* The seconds of the steps in collectives, and the rest of the steps' wall time. */
static double comm_seconds(const train_comm *c) {
    double sum = 0;
    for (int op = FSDP_COMM_ANY + 1; op < FSDP_COMM_OP_COUNT; op++) sum += c->seconds[op];
    return sum;
}

static double comm_compute_seconds(const train_comm *c) {
    return fmax(c->step_seconds - comm_seconds(c), 0);
}

static const fsdp_comm_op g_comm_ops[] = {FSDP_COMM_ALL_GATHER, FSDP_COMM_REDUCE_SCATTER,
                                          FSDP_COMM_ALL_REDUCE, FSDP_COMM_BROADCAST,
                                          FSDP_COMM_ALL_TO_ALL};

/* The metrics fields of the steps' collectives: compute and communication seconds, calls and
 * bytes per op. */
static void write_comm(FILE *f, const train_comm *c) {
    fprintf(f, ", \"compute_s\": %.6f, \"comm_s\": %.6f", comm_compute_seconds(c), comm_seconds(c));
    for (int k = 0; k < 2; k++) {
        fprintf(f, ", \"comm_%s\": {", k ? "bytes" : "calls");
        for (size_t i = 0; i < sizeof g_comm_ops / sizeof g_comm_ops[0]; i++) {
            const fsdp_comm_count *n = &c->count[g_comm_ops[i]];
            fprintf(f, "%s\"%s\": %lld", i ? ", " : "", fsdp_comm_op_to_string(g_comm_ops[i]),
                    (long long)(k ? n->bytes : n->calls));
        }
        fputc('}', f);
    }
}

/* The progress and evaluation lines and one metrics record of a logged step. */
static fsdp_status report(const train_config *cfg, train_state *s, int64_t step,
                          const train_report *r, char *err, size_t err_size) {
    int digits = snprintf(NULL, 0, "%lld", (long long)cfg->train.steps);
    if (s->out && (r->progress || r->eval)) bar_clear(s);
    if (s->out && r->progress) {
        fprintf(s->out, "step %*lld/%lld  loss %.6f  lr %.3g", digits, (long long)step,
                (long long)cfg->train.steps, r->loss, r->lr);
        if (!isnan(r->grad_norm)) fprintf(s->out, "  grad_norm %.3g", r->grad_norm);
        if (s->llama) /* sequences of max_seq_len targets */
            fprintf(s->out, "  tokens/s %.0f  time %.2fs",
                    r->samples_per_s * (double)cfg->model.max_seq_len, r->elapsed);
        else
            fprintf(s->out, "  samples/s %.0f  time %.2fs", r->samples_per_s, r->elapsed);
        if (r->comm) /* the steps' time since the last line, split */
            fprintf(s->out, "  compute %.3fs  comm %.3fs", comm_compute_seconds(r->comm),
                    comm_seconds(r->comm));
        fputc('\n', s->out);
    }
    if (s->out && r->eval) {
        fprintf(s->out, "eval %*lld/%lld  loss %.6f", digits, (long long)step,
                (long long)cfg->train.steps, r->eval_loss);
        if (!isnan(r->eval_accuracy))
            fprintf(s->out, "  accuracy %.2f%%", 100.0 * r->eval_accuracy);
        if (s->llama)
            fprintf(s->out, "  perplexity %.3f  (%lld held-out sequences)\n", exp(r->eval_loss),
                    (long long)s->n_eval);
        else
            fprintf(s->out, "  (%lld held-out samples)\n", (long long)s->n_eval);
    }
    if (s->out) TRY(flush_checked(s->out, s->out_name, err, err_size));
    if (s->metrics) {
        fprintf(s->metrics, "{\"step\": %lld", (long long)step);
        if (r->progress) {
            fprintf(s->metrics, ", \"loss\": %.9g, \"samples_per_s\": %.1f, \"time_s\": %.6f",
                    r->loss, r->samples_per_s, r->elapsed);
            if (s->llama)
                fprintf(s->metrics, ", \"tokens_per_s\": %.1f",
                        r->samples_per_s * (double)cfg->model.max_seq_len);
            fprintf(s->metrics, ", \"lr\": %.9g", r->lr);
            if (!isnan(r->grad_norm)) fprintf(s->metrics, ", \"grad_norm\": %.9g", r->grad_norm);
            if (r->comm) write_comm(s->metrics, r->comm);
        }
        if (r->eval) {
            fprintf(s->metrics, ", \"eval_loss\": %.9g", r->eval_loss);
            if (!isnan(r->eval_accuracy))
                fprintf(s->metrics, ", \"eval_accuracy\": %.9g", r->eval_accuracy);
            if (s->llama) fprintf(s->metrics, ", \"eval_perplexity\": %.9g", exp(r->eval_loss));
        }
        fprintf(s->metrics, "}\n");
        TRY(flush_checked(s->metrics, s->metrics_name, err, err_size));
    }
    return FSDP_OK;
}

/* The first line of an MLP run: the model and the data. */
static void mlp_banner(const train_config *cfg, train_state *s) {
    char mw[256], tw[256];
    int64_t w[TRAIN_MAX_LIST];
    format_widths(cfg->model.widths.v, cfg->model.widths.n, mw, sizeof mw);
    format_widths(w, teacher_widths(cfg, w), tw, sizeof tw);
    fprintf(s->out, "fsdp-train %s: MLP %s (%s, %lld parameters), ", FSDP_VERSION_STRING, mw,
            fsdp_activation_to_string(cfg->model.activation),
            (long long)mlp_param_count(&cfg->model.widths));
    if (cfg->data.kind == TRAIN_DATA_H5)
        fprintf(s->out, "data %s", cfg->data.path);
    else
        fprintf(s->out, "teacher %s", tw);
    fprintf(s->out, ", %lld samples (%lld held out), batch %lld, %s\n",
            (long long)(s->n_train + s->n_eval), (long long)s->n_eval,
            (long long)cfg->data.batch_size, s->classify ? "classification" : "regression");
}

/* The model and data lines of a Llama run. */
static void llama_banner(const train_config *cfg, train_state *s) {
    char model[256];
    const train_tokens *t = s->tokens;
    train_llama_describe(cfg, model, sizeof model);
    fprintf(s->out, "fsdp-train %s: %s\n", FSDP_VERSION_STRING, model);
    fprintf(s->out,
            "data: %s, %lld tokens (%lld held out), batches of %lld sequences (%lld tokens); "
            "unigram entropy %.4f nats/token (perplexity %.2f)\n",
            cfg->data.path, (long long)t->count, (long long)(t->count - t->n_train),
            (long long)cfg->data.batch_size,
            (long long)(cfg->data.batch_size * cfg->model.max_seq_len), t->entropy,
            exp(t->entropy));
}

/* The model and layout lines (and under debug the configuration). */
static void print_banner(const train_config *cfg, train_state *s) {
    char lw[256];
    train_layout_describe(cfg, &s->layout, lw, sizeof lw);
    static const char *const optim[] = {"SGD", "Adam", "AdamW"};
    static const char *const sched[] = {"constant", "warmup", "cosine"};
    if (s->llama)
        llama_banner(cfg, s);
    else
        mlp_banner(cfg, s);
    fprintf(s->out, "optim: %s lr %g, %s schedule", optim[cfg->optim.name], cfg->optim.lr,
            sched[cfg->optim.schedule]);
    if (cfg->optim.name == TRAIN_OPTIM_SGD) fprintf(s->out, ", momentum %g", cfg->optim.momentum);
    if (cfg->optim.weight_decay > 0) fprintf(s->out, ", weight_decay %g", cfg->optim.weight_decay);
    if (cfg->optim.no_decay[0]) fprintf(s->out, " (none for %s)", cfg->optim.no_decay);
    if (cfg->optim.clip_grad_norm > 0)
        fprintf(s->out, ", clip_grad_norm %g", cfg->optim.clip_grad_norm);
    fprintf(s->out, "\n");
    fprintf(s->out, "parallel: %s\n", lw);
    if (cfg->log.level == FSDP_LOG_DEBUG) train_config_write(cfg, s->out);
}

/* The whole-dataset loss where the run starts: step 0, or the resumed step. */
static fsdp_status print_first_loss(const train_config *cfg, train_state *s, double first_loss,
                                    int64_t step, char *err, size_t err_size) {
    int digits = snprintf(NULL, 0, "%lld", (long long)cfg->train.steps);
    fprintf(s->out, "step %*lld/%lld  loss %.6f  (%s, %s)\n", digits, (long long)step,
            (long long)cfg->train.steps, first_loss,
            s->llama    ? "probe sequences of the training tokens"
            : s->n_eval ? "training samples"
                        : "whole dataset",
            step ? "at the resumed step" : "before training");
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* Makes directory path and those that lead to it (mkdir -p); an error shows when a file in it
 * is opened. */
static void make_dirs(const char *path) {
    char dir[TRAIN_MAX_STRING];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(dir, 0755);
        *p = '/';
    }
    mkdir(dir, 0755);
}

/* Rank 0's metrics file, opened for appending. A file inside [checkpoint] dir may come
 * before the first checkpoint: the dir is made then. */
static fsdp_status open_metrics(const train_config *cfg, train_state *s, char *err,
                                size_t err_size) {
    snprintf(s->metrics_name, sizeof s->metrics_name, "metrics file '%s' ([log] metrics, %s)",
             cfg->log.metrics, train_config_origin(cfg, "log", "metrics"));
    size_t n = strlen(cfg->checkpoint.dir);
    if (n && strncmp(cfg->log.metrics, cfg->checkpoint.dir, n) == 0 && cfg->log.metrics[n] == '/')
        make_dirs(cfg->checkpoint.dir);
    if ((s->metrics = fopen(cfg->log.metrics, "a"))) return FSDP_OK;
    snprintf(err, err_size, "cannot open %s: %s", s->metrics_name, strerror(errno));
    return FSDP_ERR_IO;
}

/* Closes the metrics file; its last write may fail only here. */
static fsdp_status close_metrics(train_state *s, char *err, size_t err_size) {
    fsdp_status st = flush_checked(s->metrics, s->metrics_name, err, err_size);
    errno = 0;
    if (fclose(s->metrics) != 0 && st == FSDP_OK) {
        snprintf(err, err_size, "cannot write %s: %s", s->metrics_name,
                 errno ? strerror(errno) : "write error");
        st = FSDP_ERR_IO;
    }
    s->metrics = NULL;
    return st;
}

/* A loss that is not finite: writes "<what>; lower <the keys that can have caused it>" into
 * err. The keys are those the run uses: lr once a step was taken, weight_decay when not 0, the
 * label noise when not 0; each with its value and origin. Before any step of a run that did not
 * start from random parameters, `start` (train_ckpt_start_blame) is blamed instead. */
static fsdp_status not_finite(const train_config *cfg, bool trained, const char *start, char *err,
                              size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static fsdp_status not_finite(const train_config *cfg, bool trained, const char *start, char *err,
                              size_t err_size, const char *fmt, ...) {
    const char *keys[3][2];
    int n = 0;
    if (trained) keys[n][0] = "optim", keys[n++][1] = "lr";
    if (trained && cfg->optim.weight_decay > 0) keys[n][0] = "optim", keys[n++][1] = "weight_decay";
    if (cfg->data.noise > 0) keys[n][0] = "data", keys[n++][1] = "noise";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    if (!trained && start && *start) n = 0;
    if (n == 0)
        train_append(err, err_size, "; %s",
                     start && *start ? start
                     : cfg->data.kind == TRAIN_DATA_SYNTHETIC
                         ? "the teacher's targets or the initial model overflow float32"
                         : "the initial model overflows float32 on this data");
    for (int i = 0; i < n; i++) {
        char text[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
        const char *sep = i == 0 ? "; lower " : i < n - 1 ? ", " : " or ";
        train_append(err, err_size, "%s%s", sep,
                     train_config_key_text(cfg, keys[i][0], keys[i][1], text, sizeof text));
    }
    return FSDP_ERR_STATE;
}

/* Saves the run at prog->step and says so; commit: wait for the commit (a sync save always
 * does). */
static fsdp_status save(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                        const train_progress *prog, bool commit, train_result *res, char *err,
                        size_t err_size) {
    double blocked = 0;
    fsdp_status st = train_saver_save(ctx, &s->saver, prog, commit, &blocked);
    if (st != FSDP_OK) { /* named here: a save inside the loop is no failure of "training" */
        snprintf(err, err_size, "saving the checkpoint of step %lld: %s", (long long)prog->step,
                 fsdp_last_error(ctx));
        return st;
    }
    snprintf(res->saved, sizeof res->saved, "%s", fsdp_ckpt_writer_last_path(s->saver.writer));
    if (!s->out) return FSDP_OK;
    bar_clear(s);
    char path[TRAIN_CKPT_PATH];
    train_ckpt_step_path(cfg, prog->step, path, sizeof path);
    if (commit || !cfg->checkpoint.async)
        fprintf(s->out, "checkpoint: saved %s (%.3fs)\n", path, blocked);
    else
        fprintf(s->out, "checkpoint: writing %s in the background (the step waited %.3fs)\n", path,
                blocked);
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* Whether the ranks stop after this step: a SIGINT or SIGTERM (train_stop_signal) on any rank
 * of the world. Several ranks agree with one all_reduce (max) of one float over the world, so
 * that every rank stops after the same step. */
static fsdp_status agree_stop(fsdp_ctx *ctx, train_state *s, bool *stop) {
    float mine = train_stop_signal != 0 ? 1.0f : 0.0f;
    if (s->layout.world == 1) {
        *stop = mine > 0;
        return FSDP_OK;
    }
    fsdp_tensor_f32(s->stop)[0] = mine;
    TRY(fsdp_all_reduce(ctx, fsdp_ctx_world_group(ctx), s->stop, FSDP_REDUCE_MAX));
    *stop = fsdp_tensor_f32(s->stop)[0] > 0;
    return FSDP_OK;
}

/* Rank 0's comm-debug counters per op, and the seconds in each op's calls. */
static void comm_read(const fsdp_ctx *ctx, train_comm *c) {
    for (int op = FSDP_COMM_ANY + 1; op < FSDP_COMM_OP_COUNT; op++) {
        fsdp_comm_filter f = {.op = (fsdp_comm_op)op};
        c->count[op] = fsdp_comm_debug_query(ctx, &f);
        c->seconds[op] = fsdp_comm_debug_seconds(ctx, &f);
    }
}

/* Adds what the counters gained from `before` to `after` to sum. */
static void comm_add(train_comm *sum, const train_comm *before, const train_comm *after) {
    for (int op = FSDP_COMM_ANY + 1; op < FSDP_COMM_OP_COUNT; op++) {
        sum->count[op].calls += after->count[op].calls - before->count[op].calls;
        sum->count[op].bytes += after->count[op].bytes - before->count[op].bytes;
        sum->seconds[op] += after->seconds[op] - before->seconds[op];
    }
}

/* [log] comm_debug: rank 0's collectives of one step, as a table. */
static fsdp_status print_comm_table(fsdp_ctx *ctx, train_state *s, int64_t step, char *err,
                                    size_t err_size) {
    bar_clear(s);
    fprintf(s->out, "comm_debug: the collectives of step %lld on rank 0\n", (long long)step);
    TRY(fsdp_comm_debug_print(ctx, s->out));
    return flush_checked(s->out, s->out_name, err, err_size);
}

/* The steps after prog->step, from t0 on. A failure of the tool's own (a loss that is not
 * finite, output that cannot be written) is written into err; a library failure leaves err
 * empty. Progress lines average the batch losses since the previous line of a log_every step
 * (prog->loss_sum, also across a resume), so a resumed run prints the lines of an
 * uninterrupted one. */
static fsdp_status train_loop(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                              train_progress *prog, train_result *res, double t0, char *err,
                              size_t err_size) {
    double t_last = t0;
    int64_t since_line = 0, first = prog->step + 1;
    /* comm_debug's table shows the second step: the first may find parameters that the loss
     * evaluation before it left gathered (FSDP's root keeps them after forward) */
    int64_t table_step = first < cfg->train.steps ? first + 1 : first;
    train_comm before = {0}, after = {0}; /* op 0 (FSDP_COMM_ANY) stays 0 */
    if (s->counting) TRY(fsdp_comm_debug_begin(ctx));
    /* no allocation in here (but in a checkpoint's save, and comm-debug's first counts) */
    for (int64_t step = first; step <= cfg->train.steps; step++) {
        double loss = 0, lr = fsdp_lr_at(&s->sched, step - 1), grad_norm = NAN;
        int64_t k0 = (step - 1) * cfg->data.batch_size; /* the batch's first stream position */
        double t_step = now_seconds();
        if (s->counting && step == table_step && step > first) { /* count it alone */
            TRY(fsdp_comm_debug_end(ctx));
            TRY(fsdp_comm_debug_begin(ctx));
        }
        if (s->counting) comm_read(ctx, &before);
        TRY(train_step(ctx, cfg, s, k0, &loss));
        prog->position = (k0 + cfg->data.batch_size) % s->n_train;
        if (!isfinite(loss)) /* the same global loss on every rank: all stop here */
            return not_finite(cfg, true, NULL, err, err_size, "the loss became %g at step %lld",
                              loss, (long long)step);
        if (cfg->optim.clip_grad_norm > 0 && s->sh)
            TRY(fsdp_sharded_clip_grad_norm(ctx, s->sh, cfg->optim.clip_grad_norm, 2.0,
                                            &grad_norm));
        else if (cfg->optim.clip_grad_norm > 0)
            TRY(fsdp_clip_grad_norm(ctx, s->model, cfg->optim.clip_grad_norm, 2.0, &grad_norm));
        fsdp_optimizer_set_lr(s->opt, lr);
        TRY(fsdp_optimizer_step(ctx, s->opt));
        if (s->counting) {
            comm_read(ctx, &after);
            comm_add(&s->comm, &before, &after);
            s->comm.step_seconds += now_seconds() - t_step;
        }
        if (s->counting && cfg->log.comm_debug && s->out && step == table_step)
            TRY(print_comm_table(ctx, s, step, err, err_size));
        prog->step = res->steps = step;
        res->grad_norm = grad_norm;
        if (res->n_step_losses < TRAIN_TRACE_STEPS) res->step_loss[res->n_step_losses++] = loss;
        prog->loss_sum += loss;
        prog->since++;
        since_line++;
        bool stop = false, regular = step % cfg->train.log_every == 0;
        if (s->saving) TRY(agree_stop(ctx, s, &stop));
        stop = stop && step < cfg->train.steps; /* the last step: the run ends anyway */
        bool last = step == cfg->train.steps;
        train_report r = {.progress = regular || last || stop,
                          .lr = lr,
                          .grad_norm = grad_norm,
                          .comm = s->counting ? &s->comm : NULL};
        if (s->n_eval > 0 &&
            (last || (cfg->train.eval_every > 0 && step % cfg->train.eval_every == 0))) {
            r.eval = true;
            TRY(range_loss(ctx, s, s->n_train, s->n_eval, &r.eval_loss, &r.eval_accuracy));
            res->eval_loss = r.eval_loss;
            res->eval_accuracy = r.eval_accuracy;
            if (res->n_evals < TRAIN_TRACE_STEPS) res->eval_step[res->n_evals++] = step;
        }
        if (r.progress || r.eval) {
            double t = now_seconds();
            r.loss = prog->loss_sum / (double)prog->since;
            r.samples_per_s = (double)(since_line * cfg->data.batch_size) / fmax(t - t_last, 1e-9);
            r.elapsed = t - t0;
            TRY(report(cfg, s, step, &r, err, err_size));
            if (r.progress) {
                t_last = t;
                since_line = 0;
                memset(&s->comm, 0, sizeof s->comm);
            }
            if (regular) prog->loss_sum = 0, prog->since = 0;
        }
        if (stop) {
            res->interrupted = true;
            return save(ctx, cfg, s, prog, true, res, err, err_size);
        }
        if (s->saving && cfg->checkpoint.every > 0 && step % cfg->checkpoint.every == 0 &&
            step < cfg->train.steps)
            TRY(save(ctx, cfg, s, prog, false, res, err, err_size));
        if (s->bar.on && step < cfg->train.steps)
            TRY(bar_draw(cfg, s, prog, first, loss, now_seconds() - t0, err, err_size));
    }
    return s->counting ? fsdp_comm_debug_end(ctx) : FSDP_OK;
}

/* Where the run starts: [model] init, or the checkpoint it resumes from (said in one line). */
static fsdp_status start_from(fsdp_ctx *ctx, const train_config *cfg, train_state *s,
                              const train_sources *src, train_progress *prog, train_result *res,
                              const char **what, char *err, size_t err_size) {
    fsdp_state_sources from = {.model = s->model, .sharded = s->sh, .optimizer = s->opt};
    if (src->init[0]) {
        *what = "loading [model] init";
        TRY(train_ckpt_init(ctx, cfg, &from, src->init, err, err_size));
        if (s->out) fprintf(s->out, "init: parameters from %s\n", cfg->model.init);
    }
    if (src->resume[0]) {
        char layout[256] = "";
        *what = "resuming";
        TRY(train_ckpt_resume(ctx, cfg, &from, src->resume, s->n_train, prog, layout, sizeof layout,
                              err, err_size));
        res->start_step = res->steps = prog->step;
        snprintf(res->resumed_from, sizeof res->resumed_from, "%s", src->resume);
        if (s->out)
            fprintf(s->out, "resume: from %s at step %lld (saved by %s)\n", src->resume,
                    (long long)prog->step, layout[0] ? layout : "an unknown layout");
    }
    if (s->out && src->note[0]) fprintf(s->out, "%s\n", src->note);
    if (s->out && prog->step >= cfg->train.steps)
        fprintf(s->out, "nothing to train: the run is at step %lld, and [train] steps = %lld\n",
                (long long)prog->step, (long long)cfg->train.steps);
    return s->out ? flush_checked(s->out, s->out_name, err, err_size) : FSDP_OK;
}

/* The checkpoint writer and the stop flag, when [checkpoint] dir is set. */
static fsdp_status setup_saving(fsdp_ctx *ctx, const train_config *cfg, train_state *s) {
    if (!cfg->checkpoint.dir[0]) return FSDP_OK;
    char layout[256];
    train_layout_describe(cfg, &s->layout, layout, sizeof layout);
    fsdp_state_sources from = {.model = s->model, .sharded = s->sh, .optimizer = s->opt};
    fsdp_status st = train_saver_create(ctx, cfg, &from, layout, &s->saver);
    s->saving = true; /* freed either way */
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &s->stop);
    return st;
}

/* The run on one rank of the world (ctx bound to it). out: rank 0's progress stream or NULL;
 * metrics are written by rank 0. */
static fsdp_status train_rank(fsdp_ctx *ctx, const train_config *cfg, const train_layout *layout,
                              const train_sources *src, const train_data *data,
                              const train_tokens *tokens, FILE *out, train_result *res, char *err,
                              size_t err_size) {
    bool rank0 = fsdp_ctx_rank(ctx) == 0;
    train_state s = {.layout = *layout,
                     .tokens = tokens,
                     .out = rank0 ? out : NULL,
                     .out_name = out == stdout ? "the progress to stdout" : "the progress output"};
    train_progress prog = {0};
    const char *what = "";
    err[0] = '\0';
    res->eval_loss = res->eval_accuracy = res->grad_norm = NAN;
    fsdp_status st = train_setup(ctx, cfg, data, &s, &what);
    if (st == FSDP_OK) {
        what = "setting up checkpoints";
        st = setup_saving(ctx, cfg, &s);
    }
    if (st == FSDP_OK && s.out) print_banner(cfg, &s);
    if (st == FSDP_OK) st = start_from(ctx, cfg, &s, src, &prog, res, &what, err, err_size);
    if (st == FSDP_OK && rank0 && cfg->log.metrics[0]) st = open_metrics(cfg, &s, err, err_size);
    s.counting = rank0 && ((cfg->log.comm_debug && s.out) || s.metrics);
    s.bar.on = s.out && (cfg->log.progress == TRAIN_PROGRESS_BAR ||
                         (cfg->log.progress == TRAIN_PROGRESS_AUTO && isatty(fileno(s.out))));
    if (st == FSDP_OK) {
        what = "evaluating the initial loss";
        st = dataset_loss(ctx, &s, &res->first_loss);
    }
    if (st == FSDP_OK && !isfinite(res->first_loss)) {
        char start[3 * TRAIN_CKPT_PATH];
        train_ckpt_start_blame(cfg, src, start, sizeof start);
        st = not_finite(cfg, false, start, err, err_size, "the whole-dataset loss %s is %g",
                        prog.step ? "at the resumed step" : "before training", res->first_loss);
    }
    if (st == FSDP_OK && s.out)
        st = print_first_loss(cfg, &s, res->first_loss, prog.step, err, err_size);
    if (st == FSDP_OK && prog.step > 0 && s.n_eval > 0) { /* where a resumed run stands */
        train_report r = {.eval = true};
        what = "evaluating at the resumed step";
        st = range_loss(ctx, &s, s.n_train, s.n_eval, &r.eval_loss, &r.eval_accuracy);
        if (st == FSDP_OK) {
            res->eval_loss = r.eval_loss, res->eval_accuracy = r.eval_accuracy;
            FILE *metrics = s.metrics; /* a line for the reader, no record */
            s.metrics = NULL;
            st = report(cfg, &s, prog.step, &r, err, err_size);
            s.metrics = metrics;
        }
    }
    double t0 = now_seconds();
    if (st == FSDP_OK) {
        what = "training";
        st = train_loop(ctx, cfg, &s, &prog, res, t0, err, err_size);
    }
    res->seconds = now_seconds() - t0;
    if (s.out) bar_clear(&s); /* before any other line, or an error on the terminal */
    int64_t ran = res->steps - res->start_step;
    res->samples_per_s = (double)(ran * cfg->data.batch_size) / fmax(res->seconds, 1e-9);
    if (st == FSDP_OK && s.saving && ran > 0 && !res->interrupted) {
        what = "saving the final checkpoint";
        st = save(ctx, cfg, &s, &prog, true, res, err, err_size);
    }
    if (st == FSDP_OK && res->interrupted) res->last_loss = NAN;
    if (st == FSDP_OK && !res->interrupted) {
        what = "evaluating the final loss";
        st = dataset_loss(ctx, &s, &res->last_loss);
    }
    if (st == FSDP_OK && !res->interrupted && !isfinite(res->last_loss))
        /* the last update is checked only here */
        st = not_finite(cfg, true, NULL, err, err_size,
                        "the whole-dataset loss after training is %g (%g before): the update "
                        "of step %lld diverged",
                        res->last_loss, res->first_loss, (long long)res->steps);
    char bad[TRAIN_MAX_STRING] = ""; /* a ReLU hides NaN parameters from the loss */
    if (st == FSDP_OK && !res->interrupted) {
        what = "checking the final parameters";
        fsdp_state_sources params = {.model = s.model, .sharded = s.sh};
        st = train_params_finite(ctx, &params, bad, sizeof bad);
    }
    if (st == FSDP_OK && bad[0])
        st = not_finite(cfg, true, NULL, err, err_size,
                        "after training, %s, though the whole-dataset loss is %g", bad,
                        res->last_loss);
    if (st == FSDP_OK && s.metrics) st = close_metrics(&s, err, err_size);
    if (st == FSDP_OK && s.out && !res->interrupted && s.llama) {
        fprintf(s.out,
                "done: %lld steps in %.2fs (%.0f tokens/s); probe-sequence loss %.6f -> %.6f, "
                "%.1fx lower; %.4f nats/token %s the unigram entropy %.4f\n",
                (long long)ran, res->seconds, res->samples_per_s * (double)cfg->model.max_seq_len,
                res->first_loss, res->last_loss, res->first_loss / fmax(res->last_loss, 1e-30),
                fabs(res->last_loss - s.tokens->entropy),
                res->last_loss < s.tokens->entropy ? "below" : "above", s.tokens->entropy);
        st = flush_checked(s.out, s.out_name, err, err_size);
    } else if (st == FSDP_OK && s.out && !res->interrupted) {
        fprintf(s.out,
                "done: %lld steps in %.2fs (%.0f samples/s); %s loss %.6f -> %.6f, "
                "%.1fx lower\n",
                (long long)ran, res->seconds, res->samples_per_s,
                s.n_eval ? "training-samples" : "whole-dataset", res->first_loss, res->last_loss,
                res->first_loss / fmax(res->last_loss, 1e-30));
        st = flush_checked(s.out, s.out_name, err, err_size);
    }
    if (st != FSDP_OK && !err[0]) snprintf(err, err_size, "%s: %s", what, fsdp_last_error(ctx));
    train_state_free(ctx, &s);
    return st;
}

/* ---- the world ---------------------------------------------------------------------------- */

typedef struct train_job {
    const train_config *cfg;
    const train_sources *src;
    const train_data *data;     /* kind = h5: read once by this process; else NULL */
    const train_tokens *tokens; /* kind = tokens: read once by this process; else NULL */
    train_layout layout;
    FILE *out;
    bool mpi;
    train_result result; /* rank 0's; under mpi this process's rank's */
    int my_rank;         /* the rank that wrote result */
    fsdp_status my_status;
    char *messages; /* world size x TRAIN_ERROR_SIZE: each hosted rank's message, "" if none */
} train_job;

static fsdp_status rank_main(fsdp_ctx *ctx, int rank, void *user) {
    train_job *job = user;
    train_result res = {.layout = job->layout, .rank = rank};
    char *err = job->messages + (size_t)rank * TRAIN_ERROR_SIZE;
    fsdp_status st = train_rank(ctx, job->cfg, &job->layout, job->src, job->data, job->tokens,
                                rank == 0 ? job->out : NULL, &res, err, TRAIN_ERROR_SIZE);
    if (rank == 0 || job->mpi) {
        job->result = res;
        job->my_rank = rank;
        job->my_status = st;
    }
    return st;
}

/* Under mpi, before anything else: the processes compare their configurations, which each
 * read from its own command line and files (rank threads share one). */
static fsdp_status agree_main(fsdp_ctx *ctx, int rank, void *user) {
    train_job *job = user;
    fsdp_status st = train_config_agree(
        ctx, NULL, job->cfg, job->messages + (size_t)rank * TRAIN_ERROR_SIZE, TRAIN_ERROR_SIZE);
    job->my_rank = rank;
    job->my_status = st;
    return st;
}

/* The message of a failed run, from the ranks this process hosts: the rank that failed first
 * (fsdp_world_run's choice) when it is here, else this process's own rank when it failed the
 * same way (under mpi the other processes' tool messages do not travel), else the library's. */
static void failure_message(fsdp_ctx *ctx, fsdp_world *world, const train_job *job, fsdp_status st,
                            char *err, size_t err_size) {
    const char *library = ctx ? fsdp_last_error(ctx) : "";
    int size = fsdp_world_size(world), failed = -1;
    for (int r = 0; r < size && failed < 0; r++) {
        char text[TRAIN_ERROR_SIZE + 32];
        snprintf(text, sizeof text, "rank %d: %s", r, fsdp_world_rank_error(world, r));
        if (fsdp_world_rank_status(world, r) != FSDP_OK && strcmp(text, library) == 0) failed = r;
    }
    int pick = -1;
    if (failed >= 0 && (!job->mpi || failed == job->my_rank) &&
        job->messages[(size_t)failed * TRAIN_ERROR_SIZE])
        pick = failed;
    else if (job->my_rank >= 0 && job->my_status == st &&
             job->messages[(size_t)job->my_rank * TRAIN_ERROR_SIZE])
        pick = job->my_rank;
    if (pick < 0)
        snprintf(err, err_size, "%s", library);
    else if (size == 1)
        snprintf(err, err_size, "%s", job->messages + (size_t)pick * TRAIN_ERROR_SIZE);
    else
        snprintf(err, err_size, "rank %d: %s", pick,
                 job->messages + (size_t)pick * TRAIN_ERROR_SIZE);
}

fsdp_status train_run(fsdp_ctx *ctx, const train_config *cfg, FILE *out, train_result *result,
                      char *err, size_t err_size) {
    train_result res = {.rank = -1};
    if (result) *result = res;
    err[0] = '\0';
    if (cfg->log.level != FSDP_LOG_DEBUG && cfg->log.level != FSDP_LOG_INFO) out = NULL;
    fsdp_status st = train_config_check(cfg, err, err_size);
    if (st != FSDP_OK) return st;
    bool mpi = train_config_backend(cfg) == TRAIN_BACKEND_MPI;
    fsdp_world_options wo = {.backend = mpi ? FSDP_BACKEND_MPI : FSDP_BACKEND_LOCAL,
                             .nranks = mpi ? 0 : train_config_world_size(cfg),
                             .timeout_ms = (int)(cfg->parallel.timeout_s * 1000),
                             .threads_per_rank = (int)cfg->parallel.threads_per_rank,
                             .pin_threads = cfg->parallel.pin_threads,
                             .ctx = train_config_ctx_options(cfg)};
    fsdp_world *world = NULL;
    if ((st = fsdp_world_create(ctx, &wo, &world)) != FSDP_OK) {
        snprintf(err, err_size, "creating the %s world: %s", mpi ? "mpi" : "local",
                 ctx ? fsdp_last_error(ctx) : fsdp_status_to_string(st));
        return st;
    }
    int size = fsdp_world_size(world);
    train_job job = {.cfg = cfg, .out = out, .mpi = mpi, .my_rank = -1};
    if (!(job.messages = calloc((size_t)size, TRAIN_ERROR_SIZE))) {
        snprintf(err, err_size, "out of memory for the messages of %d ranks", size);
        st = FSDP_ERR_OUT_OF_MEMORY;
    }
    if (st == FSDP_OK && mpi && size > 1 &&
        (st = fsdp_world_run(ctx, world, agree_main, &job)) != FSDP_OK) {
        /* every process has the same message: rank 0 tells it (result.rank) */
        const char *mine =
            job.my_rank >= 0 ? job.messages + (size_t)job.my_rank * TRAIN_ERROR_SIZE : "";
        if (*mine)
            snprintf(err, err_size, "%s", mine);
        else
            failure_message(ctx, world, &job, st, err, err_size);
        if (result) result->rank = job.my_rank;
    } else if (st == FSDP_OK && mpi && cfg->parallel.ranks > 0 && cfg->parallel.ranks != size) {
        snprintf(err, err_size,
                 "[parallel] ranks = %lld (%s), but mpirun started %d processes; under mpi the "
                 "process count decides: set ranks = 0 (or %d), or start %lld processes "
                 "(mpirun -np %lld)",
                 (long long)cfg->parallel.ranks, train_config_origin(cfg, "parallel", "ranks"),
                 size, size, (long long)cfg->parallel.ranks, (long long)cfg->parallel.ranks);
        st = FSDP_ERR_CONFIG;
    } else if (st == FSDP_OK) {
        st = train_layout_resolve(cfg, size, &job.layout, err, err_size);
    }
    int lock = -1; /* [checkpoint] dir, claimed before anything reads or writes it */
    if (st == FSDP_OK && cfg->checkpoint.dir[0] && fsdp_world_hosts_rank(world, 0))
        st = train_ckpt_claim_dir(cfg, &lock, err, err_size);
    train_sources src; /* resolved once per process: the ranks only read it */
    memset(&src, 0, sizeof src);
    job.src = &src;
    if (st == FSDP_OK) st = train_sources_resolve(ctx, cfg, &src, err, err_size);
    train_data data = {0};
    if (st == FSDP_OK && cfg->data.kind == TRAIN_DATA_H5) {
        st = train_data_load(cfg, &data, err, err_size);
        job.data = &data;
    }
    train_tokens tokens = {0};
    if (st == FSDP_OK && cfg->data.kind == TRAIN_DATA_TOKENS) {
        st = train_tokens_load(cfg, &tokens, err, err_size);
        job.tokens = &tokens;
    }
    int left = 0;
    if (st == FSDP_OK) {
        job.my_rank = -1;
        /* on the heap: a rank thread left running may write to it after this returns */
        train_job *run = malloc(sizeof *run);
        if (run) *run = job;
        st = run ? fsdp_world_run(ctx, world, rank_main, run) : FSDP_ERR_OUT_OF_MEMORY;
        if (run) job = *run;
        if (st != FSDP_OK && run) failure_message(ctx, world, &job, st, err, err_size);
        if (!run) snprintf(err, err_size, "out of memory for the run of %d ranks", size);
        left = fsdp_world_threads_left(world);
        if (result) *result = job.result, result->threads_left = left;
        if (!left) free(run);
    }
    if (left) { /* a thread left running may still read what the job points to: nothing is
                   freed (src, data and tokens live in this frame: the process must end now) */
        fsdp_world_free(world);
        return st;
    }
    train_sources_free(&src);
    train_data_free(&data);
    train_tokens_free(&tokens);
    free(job.messages);
    fsdp_world_free(world);
    train_ckpt_release_dir(lock);
    return st;
}
