/* train_estimate.h: fsdp-train --plan: the memory and the communication of the run a
 * configuration describes, computed from the configuration alone (no rank runs, no model is
 * built, nothing communicates): per rank the bytes of parameters, gradients and optimizer state
 * (sharded), of the gathered FSDP units in flight (the caching pool's peak, simulated block by
 * block as src/dp/pool.c takes and gives them), of the activations a forward keeps (with and
 * without activation checkpointing), and the collectives of one step by op and mesh dim, as
 * comm-debug counts them. Each model kind describes its model on one rank (train_kind.estimate). */
#ifndef FSDP_TOOLS_TRAIN_ESTIMATE_H
#define FSDP_TOOLS_TRAIN_ESTIMATE_H

#include <stdio.h>

#include "train_config.h"
#include "train_device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_EST_MAX_COMM 32 /* (op, phase) entries a kind lists for one micro-batch */

/* One parameter of the model on one rank, in the order FSDP flattens them (pre-order over the
 * module tree, registration order): its FSDP unit (0 the root, then the nested units in
 * pre-order, which is the order forward runs them) and its elements on this tp rank. */
typedef struct train_est_param {
    int unit;
    int64_t numel;
    bool tp_sharded; /* a DTensor sharded over tp (its gradient norm is summed over tp) */
} train_est_param;

/* Collectives on the tp mesh dim for one micro-batch (calls and bytes as comm-debug counts them:
 * all_gather its output, reduce_scatter its input, all_reduce its tensor). */
typedef struct train_est_comm {
    fsdp_comm_op op;
    fsdp_comm_phase phase;
    int64_t calls;
    int64_t bytes;
} train_est_comm;

/* What a kind tells about its model on one rank (tp index, and rows: this dp rank's samples of
 * a micro-batch). */
typedef struct train_est_model {
    train_est_param *params; /* owned: train_est_model_free */
    int n_params, cap_params;
    int n_units;
    /* bytes of activation memory one forward of the micro-batch leaves for backward, as
     * fsdp_module_activation_bytes counts them: without checkpointing, and with the modules
     * [model] checkpoint_activations names (every module the kind offers when it names none) */
    int64_t act_bytes, act_ckpt_bytes;
    train_est_comm tp[TRAIN_EST_MAX_COMM]; /* the micro-batch's collectives on tp */
    int n_tp;
    /* what the recompute of the checkpointed modules adds in backward (same patterns) */
    train_est_comm tp_ckpt[TRAIN_EST_MAX_COMM];
    int n_tp_ckpt;
    const char *activation_note; /* what the activation count leaves out, for the docs and JSON */
} train_est_model;

/* Appends a parameter (false when out of memory). */
bool train_est_param_add(train_est_model *m, int unit, int64_t numel, bool tp_sharded);
/* Adds calls and bytes to the (op, phase) entry of m->tp (recompute false) or m->tp_ckpt. */
void train_est_comm_add(train_est_model *m, bool recompute, fsdp_comm_op op, fsdp_comm_phase phase,
                        int64_t calls, int64_t bytes);
void train_est_model_free(train_est_model *m);

/* Whether module `name` is checkpointed: it matches a [model] checkpoint_activations pattern, or
 * with none set (all true) any name does. */
bool train_est_checkpointed(const train_config *cfg, const char *name, bool all);

/* The kinds' estimates (train_estimate_kinds.c), for their entries of the table. */
fsdp_status train_estimate_mlp(const train_config *cfg, const train_layout *l, int tp_index,
                               int64_t rows, train_est_model *m, char *err, size_t err_size);
fsdp_status train_estimate_mlp_stacked(const train_config *cfg, const train_layout *l, int tp_index,
                                       int64_t rows, train_est_model *m, char *err,
                                       size_t err_size);
fsdp_status train_estimate_llama(const train_config *cfg, const train_layout *l, int tp_index,
                                 int64_t rows, train_est_model *m, char *err, size_t err_size);

/* One row of a step's collectives: an op on a mesh dim ("dp", "tp", "shard", "replicate",
 * "world"), the calls and bytes of one optimizer step (grad_accum micro-batches). */
typedef struct train_est_step_comm {
    fsdp_comm_op op;
    char dim[16];
    int64_t calls;
    int64_t bytes;
} train_est_step_comm;

#define TRAIN_EST_MAX_STEP_COMM 16

/* The figures of one rank. Bytes per rank. */
typedef struct train_est_rank {
    int rank, dp_index, tp_index;
    int64_t param_bytes;    /* FSDP's flat shards (f32), on the host with offload */
    int64_t grad_bytes;     /* their gradients, the same */
    int64_t optim_bytes;    /* optimizer state (momentum, Adam's moments), beside the shards */
    int64_t gathered_bytes; /* the pool's peak: gathered parameters, full gradients and
                               reduction buffers in flight (replicate: its buckets' buffers) */
    int64_t device_bytes;   /* fsdp_sharded_memory's peak_device_bytes: the pool's peak plus the
                               shards on the device */
    int64_t act_bytes, act_ckpt_bytes; /* one micro-batch (above) */
    int64_t total_bytes; /* device_bytes + optimizer state (not offloaded) + activations as
                            configured */
    train_est_step_comm comm[TRAIN_EST_MAX_STEP_COMM];
    int n_comm;
} train_est_rank;

typedef struct train_estimate {
    train_layout layout;
    int64_t micro; /* samples (sequences) of a micro-batch */
    const char *activation_note;
    train_est_rank *ranks; /* layout.world of them; owned: train_estimate_free */
    /* the model FLOPs of a sample and the peak they would be measured against: fsdp-train's
     * mfu, with the device's figure where this machine has the configured device */
    train_mfu mfu;
} train_estimate;

/* The estimate of cfg's run on a world of `world` ranks (0: train_config_world_size, or under
 * mpi without ranks, refused: the world size is needed). FSDP_ERR_CONFIG with a message when the
 * kind has no estimate. */
fsdp_status train_estimate_make(const train_config *cfg, int world, train_estimate *out, char *err,
                                size_t err_size);
void train_estimate_free(train_estimate *e);

/* The estimate as a table (ranks whose figures are equal share a row), or as one JSON object. */
void train_estimate_print(const train_config *cfg, const train_estimate *e, FILE *f);
void train_estimate_write_json(const train_config *cfg, const train_estimate *e, FILE *f);

/* fsdp-train --plan [--json]: the estimate of cfg's run, printed to out. Returns the exit status
 * (0, or 2 with the message on stderr). */
int train_estimate_main(const train_config *cfg, bool json, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
