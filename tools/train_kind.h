/* train_kind.h: fsdp-train's model kinds. A kind is one entry of the table in train_kinds.c:
 * its name ([model] kind), its own [model] keys with their help, its rules, how it builds the
 * model, lays it over tp, checkpoints and wraps it, the data it trains on and how a rank feeds
 * it, and what it exports with a checkpoint. The trainer (trainer.c) runs any of them the same
 * way. Adding a kind: a file of its own (tools/kind_<name>.c) and a line in the table. */
#ifndef FSDP_TOOLS_TRAIN_KIND_H
#define FSDP_TOOLS_TRAIN_KIND_H

#include "train_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns the status of expr when it fails (the trainer's and the kinds' files). */
#define TRAIN_TRY(expr)                                                                            \
    do {                                                                                           \
        fsdp_status train_try_st_ = (expr);                                                        \
        if (train_try_st_ != FSDP_OK) return train_try_st_;                                        \
    } while (0)

/* What a rank's feed of data is told about the rank. */
typedef struct train_rank_env {
    const train_config *cfg;
    const train_layout *layout;
    const fsdp_mesh *mesh; /* (dp, tp), or (replicate, shard, tp) for hybrid_shard */
    fsdp_group *dp;        /* the data-parallel group */
    int dp_rank;
    int tp_rank;
    int64_t micro;     /* samples of a micro-batch: batch_size / grad_accum */
    const void *input; /* what the kind's load read for this process, or NULL */
} train_rank_env;

/* What a rank's feed tells the trainer. */
typedef struct train_feed_info {
    int64_t n_train;        /* stream positions of an epoch (training samples, probe sequences) */
    int64_t n_eval;         /* held-out samples or sequences; 0: no evaluation */
    int64_t len;            /* this rank's rows of every micro-batch */
    const char *train_part; /* what the loss before and after training is over: "training
                               samples", "whole dataset", ... */
} train_feed_info;

struct train_est_model; /* train_estimate.h */

#define TRAIN_MAX_LAYERS 1024 /* modules a kind offers for checkpointing or wrapping */

typedef struct train_kind {
    const char *name;      /* the value of [model] kind */
    const char *help;      /* its part of [model] kind's help */
    const train_key *keys; /* its [model] keys (errors when set under another kind) */
    int n_keys;
    /* the [data] kinds it trains on (bit 1 << train_data_kind), and the advice when [data]
     * kind is another */
    unsigned data_kinds;
    const char *data_advice;
    /* Language model: its samples are sequences of tokens_per_sample(cfg) targets; progress
     * counts tokens and evaluations report perplexity. NULL: samples. (optional) */
    int64_t (*tokens_per_sample)(const train_config *cfg);
    /* *out <- the model FLOPs of one sample's forward and backward (no activation
     * checkpoint's recompute), which the progress lines' mfu counts; a failure is the ctx's.
     * (optional: a kind without it gets no mfu) */
    fsdp_status (*flops_per_sample)(fsdp_ctx *ctx, const train_config *cfg, double *out);

    /* When [model] init names a description of the model's shape (a Hugging Face directory's
     * config.json), its [model] keys left at their defaults take the described values and
     * those set in the configuration must agree: FSDP_ERR_CONFIG naming both values and both
     * places otherwise. *changed tells whether a key took a value. Before check; a second call
     * changes nothing. (optional) */
    fsdp_status (*adopt_init)(train_config *cfg, bool *changed, char *err, size_t err_size);
    /* What a state of initial parameters ([model] init) must hold, and which [model] keys give
     * the shape of its tensors, for the messages of a state that does not fit. */
    const char *state_advice;
    const char *shape_keys;

    /* Rules that join its keys with the others, after every key was parsed. (optional) */
    fsdp_status (*check)(const train_config *cfg, char *err, size_t err_size);
    /* Rules on the layout. (optional) */
    fsdp_status (*check_layout)(const train_config *cfg, const train_layout *l, char *err,
                                size_t err_size);

    /* The model, its parameters drawn from the ctx seed. shape_only: the same module tree (the
     * same names and kinds) at the smallest sizes, for the checks of module names. */
    fsdp_status (*build)(fsdp_ctx *ctx, const train_config *cfg, bool shape_only,
                         fsdp_module **out);
    /* The modules [model] checkpoint_activations patterns are matched against (by their fully
     * qualified names), into out (at most max): their number. */
    int (*checkpointable)(fsdp_module *model, fsdp_module **out, int max);
    /* Tensor parallelism over the tp mesh (of more than one rank), after build and before
     * activation checkpointing. */
    fsdp_status (*parallelize)(fsdp_ctx *ctx, const train_config *cfg, fsdp_module *model,
                               const fsdp_mesh *tp);
    /* [parallel] wrap = layer: the nested FSDP units, set in o (by kind or by path; paths point
     * into storage, which outlives o). */
    void (*wrap_layers)(fsdp_module *model, fsdp_fully_shard_options *o, const char **storage,
                        int max);

    /* The data, read once per process before any rank starts, or NULL. (optional) */
    fsdp_status (*load)(const train_config *cfg, void **input, char *err, size_t err_size);
    void (*unload)(void *input);
    /* A rank's feed: its slice of every batch (the kind's own struct). */
    fsdp_status (*feed_create)(fsdp_ctx *ctx, const train_rank_env *env, void **out,
                               train_feed_info *info);
    void (*feed_free)(void *f);
    /* Forward of this rank's slice of the micro-batch that starts at stream position k0, and
     * its loss: *loss the mean over the slice (0 when empty), *dout its gradient (the feed's). */
    fsdp_status (*step)(fsdp_ctx *ctx, void *f, fsdp_module *model, int64_t k0, float *loss,
                        fsdp_tensor **dout);
    /* The loss over the training part (held_out false) or the held-out one, the same on every
     * rank, and the fraction classified right (NAN when not a classification). */
    fsdp_status (*loss)(fsdp_ctx *ctx, void *f, fsdp_module *model, bool held_out, double *loss,
                        double *accuracy);
    /* The first lines of the run's output: the model and the data. */
    void (*banner)(const train_config *cfg, const void *f, FILE *out);
    /* The end of the "done: ..." line, after the steps and time. */
    void (*done)(const train_config *cfg, const void *f, FILE *out, double first_loss,
                 double last_loss);

    /* The model's configuration for other programs, kept with each checkpoint (Hugging Face's
     * config.json); *json is the caller's, NULL when none. (optional) */
    fsdp_status (*export_config)(fsdp_ctx *ctx, const train_config *cfg, char **json);

    /* fsdp-train --plan: the model on the rank of tp index tp_index whose dp slice of a
     * micro-batch has `rows` samples, without building it: its parameters by FSDP unit, the
     * activations a forward keeps and its collectives on tp (train_estimate.h). (optional: a
     * kind without it is refused by --plan) */
    fsdp_status (*estimate)(const train_config *cfg, const train_layout *l, int tp_index,
                            int64_t rows, struct train_est_model *m, char *err, size_t err_size);
} train_kind;

/* The table (train_kinds.c). */
int train_kind_count(void);
const train_kind *train_kind_at(int i);
const train_kind *train_kind_of(const train_config *cfg);
/* Joins the kinds' own keys to the list of keys (train_config_register_kinds), once; before
 * any key is read (train_config_init and train_config_print_help call it). */
void train_kinds_register(void);

#ifdef __cplusplus
}
#endif
#endif
