/* wrap.h: fully sharded data parallelism (PyTorch FSDP1's flat parameters). fsdp_fully_shard
 * splits a model into FSDP units (the root and nested units chosen by an auto-wrap policy or
 * by path); each unit's parameters live in one flat buffer, padded to a multiple of the
 * data-parallel size W and sharded in W equal pieces. The unit's hooks gather the full flat
 * parameter before forward and backward, free it (logically) after, and reduce the flat
 * gradient to the shards after backward, as docs/fsdp.md describes.
 *
 * After wrapping, the optimizer works on the shards: pass fsdp_sharded_flat_params(sh) (a
 * module holding one flat shard parameter per unit) to fsdp_sgd_create / fsdp_adam_create.
 * The model's own parameters are views into the gathered buffers; read them inside
 * fsdp_summon_full_params.
 *
 * Ownership: the caller owns *out (fsdp_sharded_free) and keeps the model alive while it
 * exists; freeing the model first is not allowed. */
#ifndef FSDP_WRAP_H
#define FSDP_WRAP_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/comm.h"
#include "fsdp/module.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_sharded fsdp_sharded;

typedef enum fsdp_sharding_strategy {
    FSDP_FULL_SHARD = 0, /* parameters, gradients (and optimizer state) sharded; non-root units
                            reshard after forward and gather again for backward */
    FSDP_SHARD_GRAD_OP,  /* units keep full parameters from forward to backward */
    FSDP_NO_SHARD,       /* DDP-like: full parameters everywhere, gradients all_reduced */
    FSDP_HYBRID_SHARD,   /* planned: not in this build (refused with a message) */
    FSDP_SHARDING_STRATEGY_COUNT
} fsdp_sharding_strategy;

const char *fsdp_sharding_strategy_to_string(fsdp_sharding_strategy s); /* "FULL_SHARD", ... */

typedef struct fsdp_fully_shard_options {
    fsdp_sharding_strategy strategy; /* default FSDP_FULL_SHARD */
    fsdp_group *group;               /* the data-parallel group; NULL: the world group */
    /* Nested units (auto-wrap policy), decided bottom-up so a module's count excludes units
     * below it; the root is always a unit:
     * - every module whose kind is in wrap_kinds (e.g. "MLPModule");
     * - every module whose path (relative to the root) is in wrap_paths;
     * - every module whose parameters not yet in a unit number at least min_num_params
     *   (size_based_auto_wrap_policy; 0: off). */
    const char *const *wrap_kinds;
    int n_wrap_kinds;
    const char *const *wrap_paths;
    int n_wrap_paths;
    int64_t min_num_params;
    /* Debugging: when a unit reshards, fill the parts of its full flat parameter this rank
     * does not own with NaN, so a computation that misses a gather cannot go unnoticed. */
    bool poison_resharded;
} fsdp_fully_shard_options;

/* Wraps root: chooses the units, flattens and shards their parameters (local TP shards for
 * distributed parameters) and installs the hooks. Every rank of the group calls it with the
 * same model structure. opts may be NULL for all defaults. */
fsdp_status fsdp_fully_shard(fsdp_ctx *ctx, fsdp_module *root, const fsdp_fully_shard_options *opts,
                             fsdp_sharded **out);
/* Removes the hooks and frees the flat buffers. The model's parameters keep the values of
 * their last gather. NULL does nothing. */
void fsdp_sharded_free(fsdp_sharded *sh);

/* The flat shard parameters, one per unit in pre-order ("_flat_param" for the root,
 * "<path with _ for .>_flat_param" for nested units): hand this module to an optimizer.
 * Owned by sh. */
fsdp_module *fsdp_sharded_flat_params(const fsdp_sharded *sh);

int fsdp_sharded_num_units(const fsdp_sharded *sh);
/* A unit's module path relative to the root ("" for the root), its number of parameter
 * elements (unpadded) and elements per shard. */
const char *fsdp_sharded_unit_path(const fsdp_sharded *sh, int unit);
int64_t fsdp_sharded_unit_numel(const fsdp_sharded *sh, int unit);
int64_t fsdp_sharded_unit_shard_numel(const fsdp_sharded *sh, int unit);

/* no_sync: with sync false, backward accumulates gradients in the units' full gradient
 * buffers without communicating; the first backward after sync is set true again reduces
 * everything accumulated. */
void fsdp_sharded_set_sync(fsdp_sharded *sh, bool sync);

/* summon_full_params: gathers every unit's full parameters so the model's parameters hold
 * their whole values (all ranks call it). Refused inside forward or backward. End it with
 * fsdp_sharded_release_full_params; with writeback, each rank then copies its own part of
 * every flat parameter back into its shard (edits outside that part are lost, as in
 * PyTorch). */
fsdp_status fsdp_summon_full_params(fsdp_ctx *ctx, fsdp_sharded *sh);
fsdp_status fsdp_release_full_params(fsdp_ctx *ctx, fsdp_sharded *sh, bool writeback);

#ifdef __cplusplus
}
#endif
#endif
