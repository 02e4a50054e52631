/* shard_impl.h: the state of an FSDP wrapping (units, flat buffers, the pool) and the
 * functions its files share: units.c builds and frees it, hooks.c runs the gathers and
 * reductions, summon.c and shards.c read it. Internal to src/fsdp. */
#ifndef FSDP_FSDP_SHARD_IMPL_H
#define FSDP_FSDP_SHARD_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/pool_impl.h"
#include "fsdp/wrap.h"

/* One FSDP unit: a module whose parameters (nested units' excluded) share a flat buffer. */
typedef struct unit {
    fsdp_sharded *owner;
    int index; /* in owner->units (pre-order) */
    fsdp_module *module;
    char *path; /* relative to the root, "" for the root */
    bool is_root;
    fsdp_param **params; /* pre-order, registration order, nested units' excluded */
    int64_t *offsets;    /* of each parameter in the flat buffer */
    int n_params;
    int64_t numel;       /* N: the flat elements (parameters and alignment gaps) */
    int64_t shard_numel; /* S = ceil(N / W) when sharded, else N */
    int64_t padded;      /* W * S when sharded, else N */
    /* NO_SHARD (or a group of one) without offload: the full flat parameter is the optimizer's
     * parameter itself, always bound; nothing to gather. */
    bool resident;
    fsdp_tensor *full; /* (padded): bound to a pool block while unsharded */
    /* (padded) Rank threads: the block where the group's shards of this unit live side by side
     * (fsdp_group_share_shards, made at the unit's first gather): the forward and backward
     * gathers bind the parameters here, and the all_gather into it moves nothing. NULL when
     * the backend has no such blocks, under offload or a low param_dtype. */
    fsdp_tensor *shared_full;
    bool share_asked;         /* fsdp_group_share_shards was called (once per unit) */
    fsdp_tensor *full_grad;   /* (padded): bound from pre-backward to the reduction */
    fsdp_tensor *reduced;     /* (S): reduce_scatter output, bound during the reduction */
    fsdp_tensor *mine;        /* (S): this rank's chunk of a gather output, for offload */
    fsdp_tensor *stage;       /* (S): view of the host staging buffer, for offload */
    fsdp_tensor *summon_host; /* summon_full_params(offload_to_cpu): the host copy */
    /* Mixed precision and the low-precision comm hooks: pool-bound handles of that dtype */
    fsdp_tensor *low_full;    /* (padded) param_dtype: the gather of the rounded shards */
    fsdp_tensor *low_mine;    /* (S) param_dtype: this rank's chunk of low_full */
    fsdp_tensor *low_grad;    /* (padded) grad_dtype: the rounded full gradient */
    fsdp_tensor *low_reduced; /* (S) grad_dtype: its reduce_scatter output */
    fsdp_param *flat;         /* the shard (S) the optimizer steps; resident: views full */
    bool unsharded;           /* the parameters are bound to full, which holds current values */
    bool grad_bound;          /* the parameter gradients are bound to full_grad */
    bool grad_pending;        /* full_grad holds gradients of no_sync backwards */
    bool summon_was_unsharded;
    int hook_ids[4];
} unit;

struct fsdp_sharded {
    fsdp_fully_shard_options opts;
    fsdp_group *group;     /* shards the parameters */
    fsdp_group *replicate; /* HYBRID_SHARD: holds copies of the same shard; else NULL */
    int world, rank;       /* in group */
    int dp_size;           /* world times the replicate group's size */
    double pre_factor, post_factor;
    fsdp_dtype param_dtype; /* what parameters are gathered in */
    fsdp_dtype grad_dtype;  /* what a built-in comm hook reduces in (f32 for a user hook) */
    fsdp_module *root;
    fsdp_module *flat_store; /* owns the flat shard parameters (impl: this object) */
    fsdp_module *orig;       /* use_orig_params: the mirror tree of shard views; else NULL */
    unit **units;            /* pre-order; units[0] is the root */
    int n_units;
    fsdp_flat_segment *segments;
    int n_segments;
    fsdp_pool pool;          /* gathered parameters and gradients, on the compute device */
    fsdp_tensor *host_stage; /* offload: reduced gradient shards arrive here (max S) */
    bool sync;
    bool summoned;
    fsdp_summon_options summon;
    /* Ownership: the state lives while the model (until fsdp_module_free) or the caller's
     * handle (until fsdp_sharded_free) holds it; the last to let go frees it. */
    bool model_held, handle_held;
    bool unwrapping; /* fsdp_sharded_free is removing the hooks */
};

/* Whether the strategy shards (not NO_SHARD, more than one rank). */
bool fsdp_shard_sharded_strategy(const fsdp_sharded *sh);
/* FULL_SHARD and HYBRID_SHARD free non-root parameters after forward and every backward. */
bool fsdp_shard_reshard_after_forward(const fsdp_sharded *sh);
/* Points the unit's parameters into base at their offsets / takes their storage away. */
fsdp_status fsdp_shard_bind_params(fsdp_ctx *ctx, unit *u, const fsdp_tensor *base);
void fsdp_shard_release_params(unit *u);
/* full <- every rank's shard, in order (through the device with offload). */
fsdp_status fsdp_shard_gather(fsdp_ctx *ctx, unit *u, fsdp_tensor *full, const fsdp_tensor *shard);
/* Gathers the unit's full parameters and points its parameters into them / lets them go. The
 * gather runs in `dtype` (the shards rounded to it; f32: exact), the values widened into
 * u->full, a pool block; in f32 on rank threads it is in place in u->shared_full instead. */
fsdp_status fsdp_shard_unshard(fsdp_ctx *ctx, unit *u, fsdp_dtype dtype);
/* The same into a pool block of this rank's own, always (summon_full_params: what the caller
 * writes there must not reach the peers' shards). */
fsdp_status fsdp_shard_unshard_copy(fsdp_ctx *ctx, unit *u);
void fsdp_shard_reshard(unit *u);
/* Binds the parameter gradients to a zeroed full gradient block / gives it back. */
fsdp_status fsdp_shard_take_grads(fsdp_ctx *ctx, unit *u);
void fsdp_shard_give_grads(unit *u);

/* The four hooks of a unit (user: the unit). */
fsdp_status fsdp_shard_pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                   const fsdp_tensor **io, void *user);
fsdp_status fsdp_shard_post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user);
fsdp_status fsdp_shard_pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                    const fsdp_tensor **io, void *user);
fsdp_status fsdp_shard_post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                     const fsdp_tensor **io, void *user);

/* FSDP_ERR_STATE naming `what` when the model was freed before the state. */
fsdp_status fsdp_shard_check_model(fsdp_ctx *ctx, const fsdp_sharded *sh, const char *what);

#endif
