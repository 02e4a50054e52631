/* train_check.c: the rules of fsdp-train's configuration that join several keys (a model
 * kind's own rules are its check, train_kind.h) and the layout of a world of ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train_config.h"
#include "train_device.h" // defines: train_device_check, train_nccl_check
#include "train_kind.h"   // defines: train_kind_of

static int smallest_prime_factor(int n) {
    for (int p = 2; p * p <= n; p++)
        if (n % p == 0) return p;
    return n;
}

fsdp_status train_layout_resolve(const train_config *cfg, int world, train_layout *out, char *err,
                                 size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE], w[TRAIN_KEY_TEXT_SIZE + 64];
    int tp = (int)cfg->parallel.tp;
    train_config_describe_world(cfg, world, w, sizeof w);
    if (world < 1 || world % tp != 0) {
        snprintf(err, err_size,
                 "%s does not divide %s; world = dp * tp: use a multiple of %d ranks or "
                 "another tp",
                 train_config_key_text(cfg, "parallel", "tp", a, sizeof a), w, tp);
        return FSDP_ERR_CONFIG;
    }
    train_layout l = {.backend = train_config_backend(cfg),
                      .world = world,
                      .dp = world / tp,
                      .tp = tp,
                      .replicas = 1,
                      .shard = world / tp};
    int64_t micro = cfg->data.batch_size / cfg->train.grad_accum;
    if (cfg->train.grad_accum > 1 && micro < l.dp) {
        snprintf(err, err_size,
                 "%s split into %s micro-batches of %lld samples is smaller than the %d "
                 "data-parallel ranks (dp = world / tp, %s and tp %d); each dp rank trains on "
                 "its slice of every micro-batch: raise batch_size to at least %lld, or lower "
                 "grad_accum, or use fewer ranks",
                 train_config_key_text(cfg, "data", "batch_size", a, sizeof a),
                 train_config_key_text(cfg, "train", "grad_accum", b, sizeof b), (long long)micro,
                 l.dp, w, tp, (long long)l.dp * cfg->train.grad_accum);
        return FSDP_ERR_CONFIG;
    }
    if (cfg->data.batch_size < l.dp) {
        snprintf(err, err_size,
                 "%s is smaller than the %d data-parallel ranks (dp = world / tp, %s and tp "
                 "%d); each dp rank trains on its slice of every batch: raise batch_size to at "
                 "least %d, or use fewer ranks",
                 train_config_key_text(cfg, "data", "batch_size", a, sizeof a), l.dp, w, tp, l.dp);
        return FSDP_ERR_CONFIG;
    }
    const train_kind *kind = train_kind_of(cfg);
    if (kind->check_layout) {
        fsdp_status st = kind->check_layout(cfg, &l, err, err_size);
        if (st != FSDP_OK) return st;
    }
    bool hybrid =
        cfg->parallel.mode == TRAIN_MODE_FSDP && cfg->parallel.strategy == FSDP_HYBRID_SHARD;
    if (hybrid && l.dp < 2) {
        snprintf(err, err_size,
                 "%s needs at least 2 data-parallel ranks to split into replicas and shards, but "
                 "dp = world / tp = 1 (%s and tp %d); add ranks or use full_shard",
                 train_config_key_text(cfg, "parallel", "strategy", a, sizeof a), w, tp);
        return FSDP_ERR_CONFIG;
    }
    if (hybrid) {
        int r = cfg->parallel.replicas ? (int)cfg->parallel.replicas : smallest_prime_factor(l.dp);
        if (l.dp % r != 0) {
            snprintf(err, err_size,
                     "%s does not divide the %d data-parallel ranks (dp = world / tp, %s and "
                     "tp %d); hybrid_shard splits dp into replicas x shard: use a divisor of %d, "
                     "or 0 to pick one",
                     train_config_key_text(cfg, "parallel", "replicas", b, sizeof b), l.dp, w, tp,
                     l.dp);
            return FSDP_ERR_CONFIG;
        }
        l.replicas = r;
        l.shard = l.dp / r;
    }
    if (out) *out = l;
    return FSDP_OK;
}

void train_layout_describe(const train_config *cfg, const train_layout *l, char *buf, size_t size) {
    char v[64];
    buf[0] = '\0';
    train_append(buf, size, "%d rank%s (%s): dp %d x tp %d, ", l->world, l->world == 1 ? "" : "s",
                 train_backend_name(l->backend), l->dp, l->tp);
    if (cfg->parallel.mode == TRAIN_MODE_REPLICATE) {
        train_append(buf, size, "replicate");
    } else {
        train_append(buf, size, "fsdp %s",
                     train_config_value(cfg, "parallel", "strategy", v, sizeof v));
        if (cfg->parallel.strategy == FSDP_HYBRID_SHARD)
            train_append(buf, size, " (%d replicas x shard %d)", l->replicas, l->shard);
        if (cfg->parallel.wrap == TRAIN_WRAP_LAYER) train_append(buf, size, ", wrap layer");
        if (cfg->parallel.offload) train_append(buf, size, ", offload");
        if (cfg->parallel.use_orig_params) train_append(buf, size, ", use_orig_params");
        if (cfg->parallel.mixed_precision)
            train_append(buf, size, ", mixed_precision %s",
                         train_config_value(cfg, "parallel", "mixed_precision", v, sizeof v));
    }
    if (cfg->parallel.comm_hook != FSDP_COMM_HOOK_DEFAULT)
        train_append(buf, size, ", %s comm hook",
                     train_config_value(cfg, "parallel", "comm_hook", v, sizeof v));
    if (cfg->parallel.sync_module_states) train_append(buf, size, ", sync_module_states");
}

/* The [parallel] rules that do not depend on the world size. */
static fsdp_status check_parallel(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    static const char *const fsdp_only[] = {"strategy", "offload", "wrap", "use_orig_params",
                                            "replicas"};
    if (cfg->parallel.mode == TRAIN_MODE_REPLICATE)
        for (size_t i = 0; i < sizeof fsdp_only / sizeof fsdp_only[0]; i++)
            if (train_config_changed(cfg, "parallel", fsdp_only[i])) {
                snprintf(err, err_size,
                         "%s applies to mode = fsdp, but %s; remove it or set mode = fsdp",
                         train_config_key_text(cfg, "parallel", fsdp_only[i], a, sizeof a),
                         train_config_key_text(cfg, "parallel", "mode", b, sizeof b));
                return FSDP_ERR_CONFIG;
            }
    if (train_config_key_not_for(cfg, "parallel", "bucket_mb",
                                 cfg->parallel.mode == TRAIN_MODE_REPLICATE,
                                 "mode = replicate (FSDP reduces each unit's gradient whole)",
                                 "parallel", "mode", err, err_size))
        return FSDP_ERR_CONFIG;
    if (cfg->parallel.comm_hook != FSDP_COMM_HOOK_DEFAULT &&
        train_config_mixed_precision(cfg).reduce_dtype != FSDP_DTYPE_F32) {
        snprintf(err, err_size,
                 "%s and %s both choose the dtype gradients are reduced in; keep one (a "
                 "mixed_precision that reduces in f32, such as bf16,f32, or comm_hook = default)",
                 train_config_key_text(cfg, "parallel", "comm_hook", a, sizeof a),
                 train_config_key_text(cfg, "parallel", "mixed_precision", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    if (cfg->parallel.replicas && cfg->parallel.mode == TRAIN_MODE_FSDP &&
        cfg->parallel.strategy != FSDP_HYBRID_SHARD) {
        snprintf(err, err_size, "%s is for strategy = hybrid_shard, but %s; remove it",
                 train_config_key_text(cfg, "parallel", "replicas", a, sizeof a),
                 train_config_key_text(cfg, "parallel", "strategy", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    const train_kind *kind = train_kind_of(cfg); /* its own rules: tp against its widths, ... */
    fsdp_status st = kind->check ? kind->check(cfg, err, err_size) : FSDP_OK;
    if (st != FSDP_OK) return st;
    int world = train_config_world_size(cfg);
    if (!train_backend_processes(train_config_backend(cfg)) && world > FSDP_LOCAL_MAX_RANKS) {
        snprintf(err, err_size,
                 "%s asks for %d rank threads, but the local backend runs at most %d "
                 "(FSDP_LOCAL_MAX_RANKS); use at most %d ranks, or run one process per rank "
                 "under mpirun (backend = mpi)",
                 cfg->parallel.ranks > 0
                     ? train_config_key_text(cfg, "parallel", "ranks", a, sizeof a)
                     : train_config_key_text(cfg, "parallel", "tp", a, sizeof a),
                 world, FSDP_LOCAL_MAX_RANKS, FSDP_LOCAL_MAX_RANKS);
        return FSDP_ERR_CONFIG;
    }
    if (train_config_backend(cfg) == TRAIN_BACKEND_MPI &&
        !fsdp_backend_available(FSDP_BACKEND_MPI)) {
        if (cfg->parallel.backend == TRAIN_BACKEND_MPI)
            snprintf(err, err_size,
                     "%s, but this build has no MPI backend (CMake found no MPI); use backend "
                     "= local, or install an MPI (Debian: libopenmpi-dev openmpi-bin) and "
                     "rebuild",
                     train_config_key_text(cfg, "parallel", "backend", a, sizeof a));
        else
            snprintf(err, err_size,
                     "started by mpirun (%s), but this build has no MPI backend (CMake found no "
                     "MPI): every process would train alone; install an MPI and rebuild, or "
                     "run without mpirun",
                     train_config_key_text(cfg, "parallel", "backend", a, sizeof a));
        return FSDP_ERR_CONFIG;
    }
    if (cfg->parallel.comm_thread && train_config_backend(cfg) != TRAIN_BACKEND_MPI) {
        snprintf(err, err_size,
                 "%s moves the mpi backend's started collectives, but %s: rank threads and "
                 "NCCL have no use for it; remove it, or run under mpirun with backend = mpi",
                 train_config_key_text(cfg, "parallel", "comm_thread", a, sizeof a),
                 train_config_key_text(cfg, "parallel", "backend", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    if ((st = train_nccl_check(cfg, err, err_size)) != FSDP_OK) return st;
    return train_device_check(cfg, err, err_size); /* mpi, or a kind with no device here */
}

/* The [data] rules that join keys. */
static fsdp_status check_data(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    bool h5 = cfg->data.kind == TRAIN_DATA_H5, tokens = cfg->data.kind == TRAIN_DATA_TOKENS;
    bool synthetic = cfg->data.kind == TRAIN_DATA_SYNTHETIC;
    static const char *const synthetic_only[] = {"samples", "teacher_widths", "noise"};
    static const char *const h5_only[] = {"x", "y"};
    for (int i = 0; i < 3; i++)
        if (train_config_key_not_for(cfg, "data", synthetic_only[i], synthetic, "kind = synthetic",
                                     "data", "kind", err, err_size) ||
            (i < 2 && train_config_key_not_for(cfg, "data", h5_only[i], h5, "kind = h5", "data",
                                               "kind", err, err_size)))
            return FSDP_ERR_CONFIG;
    if (train_config_key_not_for(cfg, "data", "path", h5 || tokens, "kind = h5 or tokens", "data",
                                 "kind", err, err_size) ||
        train_config_key_not_for(cfg, "data", "task", !tokens, "kind = synthetic or h5", "data",
                                 "kind", err, err_size) ||
        train_config_key_not_for(cfg, "data", "shuffle", !tokens,
                                 "kind = synthetic or h5 (kind = tokens "
                                 "draws every sequence's offset from seed)",
                                 "data", "kind", err, err_size) ||
        train_config_key_not_for(cfg, "data", "eval_batches", tokens, "kind = tokens", "data",
                                 "kind", err, err_size))
        return FSDP_ERR_CONFIG;
    if ((h5 || tokens) && !cfg->data.path[0]) {
        snprintf(err, err_size, "%s needs [data] path, the %s to read; set it",
                 train_config_key_text(cfg, "data", "kind", a, sizeof a),
                 h5 ? "HDF5 file (with datasets x and y)"
                    : "token file (tools/text_to_tokens.py writes one)");
        return FSDP_ERR_CONFIG;
    }
    const train_kind *kind = train_kind_of(cfg);
    if (!(kind->data_kinds & 1u << cfg->data.kind)) {
        snprintf(err, err_size, "%s and %s do not go together: %s",
                 train_config_key_text(cfg, "model", "kind", a, sizeof a),
                 train_config_key_text(cfg, "data", "kind", b, sizeof b), kind->data_advice);
        return FSDP_ERR_CONFIG;
    }
    bool classify = cfg->data.task == TRAIN_TASK_CLASSIFICATION;
    if (train_config_key_not_for(cfg, "data", "noise", !classify, "task = regression", "data",
                                 "task", err, err_size))
        return FSDP_ERR_CONFIG;
    if (synthetic && cfg->data.eval_fraction > 0) {
        int64_t n_eval = (int64_t)floor((double)cfg->data.samples * cfg->data.eval_fraction);
        if (n_eval < 1 || n_eval >= cfg->data.samples) {
            snprintf(err, err_size,
                     "%s holds out %lld of the %lld samples (%s); both the held-out and the "
                     "training part need at least one: change eval_fraction or samples",
                     train_config_key_text(cfg, "data", "eval_fraction", a, sizeof a),
                     (long long)n_eval, (long long)cfg->data.samples,
                     train_config_key_text(cfg, "data", "samples", b, sizeof b));
            return FSDP_ERR_CONFIG;
        }
    }
    if (cfg->train.eval_every > 0 && cfg->data.eval_fraction == 0) {
        snprintf(err, err_size,
                 "%s evaluates on the held-out split, but %s holds out nothing; set "
                 "eval_fraction (e.g. 0.2) or eval_every = 0",
                 train_config_key_text(cfg, "train", "eval_every", a, sizeof a),
                 train_config_key_text(cfg, "data", "eval_fraction", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* The [optim] rules that join keys. */
static fsdp_status check_optim(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE], c[TRAIN_KEY_TEXT_SIZE];
    bool sgd = cfg->optim.name == TRAIN_OPTIM_SGD;
    if (train_config_key_not_for(cfg, "optim", "momentum", sgd, "name = sgd", "optim", "name", err,
                                 err_size) ||
        train_config_key_not_for(cfg, "optim", "nesterov", sgd, "name = sgd", "optim", "name", err,
                                 err_size) ||
        train_config_key_not_for(cfg, "optim", "betas", !sgd, "name = adam or adamw", "optim",
                                 "name", err, err_size) ||
        train_config_key_not_for(cfg, "optim", "eps", !sgd, "name = adam or adamw", "optim", "name",
                                 err, err_size))
        return FSDP_ERR_CONFIG;
    if (cfg->optim.nesterov && cfg->optim.momentum <= 0) {
        snprintf(err, err_size,
                 "[optim] nesterov = true (%s) needs [optim] momentum > 0, but momentum is %g "
                 "(%s)",
                 train_config_origin(cfg, "optim", "nesterov"), cfg->optim.momentum,
                 train_config_origin(cfg, "optim", "momentum"));
        return FSDP_ERR_CONFIG;
    }
    train_schedule sched = cfg->optim.schedule;
    if (train_config_key_not_for(cfg, "optim", "warmup_steps", sched != TRAIN_SCHEDULE_CONSTANT,
                                 "schedule = warmup or cosine", "optim", "schedule", err,
                                 err_size) ||
        train_config_key_not_for(cfg, "optim", "min_lr", sched == TRAIN_SCHEDULE_COSINE,
                                 "schedule = cosine", "optim", "schedule", err, err_size))
        return FSDP_ERR_CONFIG;
    if (sched == TRAIN_SCHEDULE_COSINE && cfg->optim.warmup_steps >= cfg->train.steps) {
        snprintf(err, err_size,
                 "%s leaves no steps for the cosine decay of %s: warmup_steps must be below %s",
                 train_config_key_text(cfg, "optim", "warmup_steps", a, sizeof a),
                 train_config_key_text(cfg, "optim", "schedule", b, sizeof b),
                 train_config_key_text(cfg, "train", "steps", c, sizeof c));
        return FSDP_ERR_CONFIG;
    }
    if (sched == TRAIN_SCHEDULE_COSINE && cfg->optim.min_lr > cfg->optim.lr) {
        snprintf(err, err_size, "%s is above %s; the cosine schedule decays from lr to min_lr",
                 train_config_key_text(cfg, "optim", "min_lr", a, sizeof a),
                 train_config_key_text(cfg, "optim", "lr", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    if (cfg->optim.no_decay[0]) {
        char patterns[TRAIN_MAX_NO_DECAY][TRAIN_MAX_STRING];
        if (train_config_no_decay(cfg, patterns) < 0) {
            snprintf(err, err_size,
                     "%s: expected up to %d comma-separated non-empty patterns, e.g. *.bias",
                     train_config_key_text(cfg, "optim", "no_decay", a, sizeof a),
                     TRAIN_MAX_NO_DECAY);
            return FSDP_ERR_CONFIG;
        }
        if (cfg->parallel.mode == TRAIN_MODE_FSDP && !cfg->parallel.use_orig_params) {
            snprintf(err, err_size,
                     "%s needs the parameters' own names, which FSDP's optimizer sees only with "
                     "use_orig_params = true, but %s; set it to true (or use mode = replicate)",
                     train_config_key_text(cfg, "optim", "no_decay", a, sizeof a),
                     train_config_key_text(cfg, "parallel", "use_orig_params", b, sizeof b));
            return FSDP_ERR_CONFIG;
        }
    }
    return FSDP_OK;
}

/* The kinds of a mask, "kind = mlp or mlp_stacked", into buf. */
static void describe_kinds(unsigned kinds, char *buf, size_t size) {
    int n = 0, total = 0;
    for (int c = 0; train_key_kind_name(c); c++) total += (kinds >> c) & 1u;
    snprintf(buf, size, "kind = ");
    for (int c = 0; train_key_kind_name(c); c++)
        if (kinds & 1u << c)
            train_append(buf, size, "%s%s", n++ ? (n == total ? " or " : ", ") : "",
                         train_key_kind_name(c));
}

/* The [model] rules: a key of a kind is set only under that kind; the checkpoint_activations
 * patterns are a list (the kind checks them against its modules). */
static fsdp_status check_model(const train_config *cfg, char *err, size_t err_size) {
    unsigned mine = 1u << (int)cfg->model.kind;
    for (int i = 0; i < train_key_count(); i++) {
        unsigned kinds = train_key_kinds(i);
        char to[256];
        describe_kinds(kinds, to, sizeof to);
        if (kinds && train_config_key_not_for(cfg, train_key_at(i)->section, train_key_at(i)->name,
                                              kinds & mine, to, "model", "kind", err, err_size))
            return FSDP_ERR_CONFIG;
    }
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING], key[TRAIN_KEY_TEXT_SIZE];
    if (train_config_checkpoint_patterns(cfg, patterns) < 0) {
        snprintf(err, err_size,
                 "%s: expected up to %d comma-separated non-empty module name patterns, e.g. 0,2",
                 train_config_key_text(cfg, "model", "checkpoint_activations", key, sizeof key),
                 TRAIN_MAX_ACT_PATTERNS);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* The [train] rules: grad_accum divides the batch. */
static fsdp_status check_train(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    if (cfg->data.batch_size % cfg->train.grad_accum == 0) return FSDP_OK;
    snprintf(err, err_size,
             "%s does not divide %s: a step splits its batch into grad_accum micro-batches of "
             "equal size; use a divisor of %lld",
             train_config_key_text(cfg, "train", "grad_accum", a, sizeof a),
             train_config_key_text(cfg, "data", "batch_size", b, sizeof b),
             (long long)cfg->data.batch_size);
    return FSDP_ERR_CONFIG;
}

fsdp_status train_config_check(const train_config *cfg, char *err, size_t err_size) {
    fsdp_status st = check_model(cfg, err, err_size);
    if (st == FSDP_OK) st = check_data(cfg, err, err_size);
    if (st == FSDP_OK) st = check_optim(cfg, err, err_size);
    if (st == FSDP_OK) st = check_train(cfg, err, err_size);
    if (st != FSDP_OK) return st;
    st = check_parallel(cfg, err, err_size);
    if (st != FSDP_OK) return st;
    int world = train_config_world_size(cfg);
    return world > 0 ? train_layout_resolve(cfg, world, NULL, err, err_size) : FSDP_OK;
}
