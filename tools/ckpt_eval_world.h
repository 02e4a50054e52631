/* ckpt_eval_world.h: fsdp-ckpt eval's loss computed batch by batch (one rank, or a world of rank
 * threads or MPI processes at a (dp, tp) layout: ckpt_eval_world.c). */
#ifndef FSDP_TOOLS_CKPT_EVAL_WORLD_H
#define FSDP_TOOLS_CKPT_EVAL_WORLD_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

/* n_seq sequences of T + 1 tokens (sequence j starts at token j * T of ids), scored B at a time:
 * batch b holds sequences b * B .. b * B + B - 1. */
typedef struct ckpt_eval_data {
    const int32_t *ids;
    int64_t n_seq, B, T;
} ckpt_eval_data;

/* Computes the loss of batches first, first + stride, ... (< n_seq / B) with model (plain, or
 * tensor-parallel with loss parallel: every tp rank calls it with the same batches; on the ctx's
 * device) into losses[b]; the other entries are left alone. */
fsdp_status ckpt_eval_batches(fsdp_ctx *ctx, fsdp_module *model, const ckpt_eval_data *d,
                              int64_t first, int64_t stride, float *losses);

/* The mean loss of the batches' losses, summed in batch order as fsdp-train's evaluation sums
 * them (each batch weighs B / n_seq), so that any layout sums the same numbers the same way. */
double ckpt_eval_mean(const ckpt_eval_data *d, const float *losses);

/* What a world evaluation needs: the checkpoint (a step directory), its Llama, the layout. */
typedef struct ckpt_eval_layout {
    const char *ckpt; /* a checkpoint directory (metadata.h5), already checked */
    const char *arg;  /* as the user named it, for messages */
    const fsdp_llama_config *cfg;
    int world;               /* rank threads; 0 under mpirun (the job's processes) */
    int tp;                  /* tensor-parallel size; dp = world / tp */
    fsdp_device_type device; /* where the ranks compute: the CPU, or rank r on device r mod count */
} ckpt_eval_layout;

/* The model moved to device r mod the count of kind `type` here, which becomes the ctx's device
 * (nothing for the CPU): fsdp-ckpt eval --device. */
fsdp_status ckpt_eval_to_device(fsdp_ctx *ctx, fsdp_device_type type, int rank, fsdp_module *model);

/* Runs the evaluation on a world of l->world rank threads (or, when this process runs under
 * mpirun, one rank per process), each loading its part of the Llama from the checkpoint (the
 * resharding load) at the mesh (dp, tp): torchtitan's plan with loss parallel over tp, the
 * batches dealt over dp (batch b to dp rank b mod dp), the losses gathered over dp. *loss
 * receives ckpt_eval_mean of them, and *printer whether this process hosts rank 0 (the one that
 * prints). Prints the problem and the fix on failure; returns the tool's exit status. */
int ckpt_eval_world(fsdp_ctx *ctx, const ckpt_eval_layout *l, const ckpt_eval_data *d, double *loss,
                    bool *printer);

/* Generates max_new tokens after prompt[0..n) on a world as ckpt_eval_world makes it, the Llama
 * split over tp by the plan with its logits gathered (no loss parallel): each token is sampled by
 * fsdp_sample_logits (so: temperature, top-k, seed; step i) from a full forward of the sequence
 * so far (no key/value cache), the same on every rank; rank 0 passes each to emit (false: stop,
 * the output failed). *printer: whether this process hosts rank 0. Prints the problem on
 * failure; returns the tool's exit status. */
int ckpt_generate_world(fsdp_ctx *ctx, const ckpt_eval_layout *l, const int32_t *prompt, int64_t n,
                        int64_t max_new, const fsdp_sample_options *so,
                        bool (*emit)(void *user, int64_t i, int32_t tok), void *user,
                        bool *printer);

/* Whether this process was started by mpirun (Open MPI or a PMI launcher). */
bool ckpt_under_mpirun(void);

#endif
