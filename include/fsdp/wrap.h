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
 * Ownership (the rule replicate.h follows too): a wrapper's state is held by the model it wraps
 * and lives as long as something holds it. The model holds it until fsdp_module_free; here the
 * caller's handle *out holds it too, until fsdp_sharded_free. Either order is safe: freeing the
 * handle first unwraps the model (its parameters get storage of their own); freeing the model
 * first detaches the state, which keeps the flat shards (fsdp_sharded_flat_params, so an
 * optimizer over them stays valid) and refuses whatever needs the model, until
 * fsdp_sharded_free.
 *
 * Misuse is refused with the fix named, and nothing changed: a group that holds ranks of
 * different coordinates along a tensor-parallel mesh dim where a parameter is Shard or Partial
 * (also the default world group on a TP model: there is no guessing; pass the mesh's dp
 * group); fsdp_module_zero_grad, an optimizer, or fsdp_tp_parallelize on the wrapped model's
 * own parameters (FSDP keeps them in its shards: use fsdp_sharded_flat_params(sh));
 * fsdp_summon_full_params inside forward or backward; a model whose parameters, gradients and
 * buffers are not all on one device, or on a device other than the rank's (FSDP_ERR_DEVICE:
 * call fsdp_ctx_set_device, or move the model with fsdp_module_to, before wrapping it).
 *
 * A model on the rank's device (fsdp_ctx_set_device, then fsdp_module_to) is wrapped there: its
 * flat shards, their gradients, the pool and every gathered buffer are device tensors, and the
 * collectives run on the rank's communication stream (docs/fsdp.md, "On a device"). */
#ifndef FSDP_WRAP_H
#define FSDP_WRAP_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/comm.h"
#include "fsdp/comm_hook.h"
#include "fsdp/module.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_sharded fsdp_sharded;

typedef enum fsdp_sharding_strategy {
    FSDP_FULL_SHARD = 0, /* parameters, gradients (and optimizer state) sharded; non-root units
                            reshard after forward and gather again for backward */
    FSDP_SHARD_GRAD_OP,  /* units keep full parameters from forward to the end of backward */
    FSDP_NO_SHARD,       /* DDP-like: full parameters everywhere, gradients all_reduced */
    FSDP_HYBRID_SHARD,   /* FULL_SHARD within `group`, replicated across `replicate_group`:
                            gradients reduce_scatter on group, then all_reduce on replicate_group */
    FSDP_SHARDING_STRATEGY_COUNT
} fsdp_sharding_strategy;

const char *fsdp_sharding_strategy_to_string(fsdp_sharding_strategy s); /* "FULL_SHARD", ... */

/* FSDP1's BackwardPrefetch: which hook of a unit also gathers the unit that runs next in
 * backward. */
typedef enum fsdp_backward_prefetch {
    FSDP_BACKWARD_PREFETCH_NONE = 0, /* each unit gathers in its own pre-backward hook */
    FSDP_BACKWARD_PRE,  /* the pre-backward hook: the next unit in backward order, before this
                           unit's backward computes (PyTorch's BackwardPrefetch.BACKWARD_PRE) */
    FSDP_BACKWARD_POST, /* the post-backward hook: the first unit whose backward has not
                           started, after this unit's gradients are computed and reduced
                           (BackwardPrefetch.BACKWARD_POST) */
    FSDP_BACKWARD_PREFETCH_COUNT
} fsdp_backward_prefetch;

/* fsdp_mixed_precision (comm_hook.h): FSDP1's MixedPrecision; see its fields there. */

typedef struct fsdp_fully_shard_options {
    fsdp_sharding_strategy strategy; /* default FSDP_FULL_SHARD */
    /* The group that shards the parameters (the data-parallel group; with a device mesh,
     * fsdp_mesh_get_group(mesh, "dp")). NULL: the world group, refused (not guessed) when a
     * parameter is distributed by TP across the world's ranks. */
    fsdp_group *group;
    /* HYBRID_SHARD only (required there, NULL otherwise): the ranks that hold the same shard,
     * e.g. mesh dim "replicate" of a (replicate, shard) mesh. The data-parallel size is
     * size(group) * size(replicate_group). */
    fsdp_group *replicate_group;
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
    /* CPU offload (PyTorch's CPUOffload(offload_params=True)): the flat shards and their
     * gradients live in host memory and the optimizer steps them there; each gather copies the
     * shard to the compute device first, and each reduced gradient shard is copied back and
     * added to the host gradient (so no_sync accumulation works under offload too). With the
     * model on a device the host memory is pinned, the copies to the device are asynchronous,
     * and the host waits for them at the end of the root's forward and backward and around
     * summon_full_params, before anything may write a shard. */
    bool offload_params;
    /* Before flattening, broadcast every managed parameter (the local block of a TP parameter)
     * and every buffer of the model from rank 0 of the group (and of replicate_group), so all
     * replicas start equal whatever each rank initialised. */
    bool sync_module_states;
    /* The optimizer sees the original parameters (see fsdp_sharded_flat_params), so options
     * can differ per parameter. Each parameter starts at a 16-byte aligned offset of the flat
     * buffer. */
    bool use_orig_params;
    /* Debugging: fill every full-parameter buffer with NaN when it goes back to the pool, so a
     * computation that reads a stale gathered value cannot go unnoticed. */
    bool poison_resharded;
    /* How each unit's flat gradient is reduced (FSDP1's register_comm_hook; comm_hook.h):
     * default (divide by the pre factor, reduce_scatter / all_reduce in f32 or reduce_dtype,
     * divide by the post factor); FSDP_COMM_HOOK_BF16 / _FP16, the same in bf16 / f16 (PyTorch's
     * bf16/fp16_compress_hook); FSDP_COMM_HOOK_USER, .fn gets the unit's padded f32 flat
     * gradient undivided, output this rank's shard (NULL for NO_SHARD or a group of one rank:
     * leave the average in grad) and index the unit. Not with HYBRID_SHARD for a user hook (as
     * PyTorch), and not with a reduce_dtype other than f32 for a non-default hook. */
    fsdp_comm_hook comm_hook;
    fsdp_mixed_precision mixed_precision; /* default: everything f32 */
    /* Prefetch (FSDP1's forward_prefetch, backward_prefetch, limit_all_gathers): a unit's
     * pre-forward hook (forward_prefetch), pre-backward hook (FSDP_BACKWARD_PRE) or post-backward
     * hook (FSDP_BACKWARD_POST) also starts the gather of the unit that runs next (a started
     * collective on a work of that unit), in the order the hooks ran in the first step, before
     * the unit computes; that unit's own hook completes it before its parameters are read. On a
     * device the gather runs on the communication stream while the unit computes, and the next
     * unit's compute stream waits for it; on the host the next unit's hook waits for it (a start
     * on rank threads completes at once, so there only the order changes). Gradient reductions
     * are started collectives too (docs/fsdp.md, "Started collectives"), completed at the latest
     * at the end of backward. limit_all_gathers: a prefetch is not issued while
     * FSDP_PREFETCH_LIMIT (2) non-root units hold gathered parameters (a unit's own gather is never
     * held back). Results are bitwise those without prefetch. Defaults: off. */
    bool forward_prefetch;
    fsdp_backward_prefetch backward_prefetch;
    bool limit_all_gathers;
} fsdp_fully_shard_options;

/* The most gathered non-root units a prefetch may leave under limit_all_gathers (PyTorch's
 * rate limiter allows two all_gathers in flight). */
#define FSDP_PREFETCH_LIMIT 2

/* Wraps root: chooses the units, flattens and shards their parameters (local TP shards for
 * distributed parameters) and installs the hooks. Every rank of the group calls it with the
 * same model structure. opts may be NULL for all defaults.
 *
 * While a unit is sharded its parameters have no storage (fsdp_tensor_has_storage is false,
 * fsdp_tensor_data NULL), as PyTorch frees them: read them inside fsdp_summon_full_params.
 * Gathered buffers come from a caching pool owned by *out: after the first step nothing is
 * allocated, and FULL_SHARD holds only the units in flight. */
fsdp_status fsdp_fully_shard(fsdp_ctx *ctx, fsdp_module *root, const fsdp_fully_shard_options *opts,
                             fsdp_sharded **out);
/* Lets go of the caller's hold. While the model lives: removes the hooks and frees the flat
 * buffers, and each parameter gets storage of its own: its full value when its unit is
 * unsharded (inside fsdp_summon_full_params, say), zeros otherwise. After the model was freed:
 * frees what is left. NULL does nothing. */
void fsdp_sharded_free(fsdp_sharded *sh);

/* What the optimizer steps, owned by sh:
 * - use_orig_params false: one flat shard parameter per unit in pre-order, named "_flat_param"
 *   for the root and "<path with _ for .>_" + "_flat_param" for nested units (layers.1:
 *   "layers_1__flat_param");
 * - use_orig_params true: a module tree mirroring the model's, each original parameter under
 *   its own name ("net1.weight") as a 1-D view of the part of it in this rank's shard (empty
 *   when none is), its gradient a view of the shard's gradient.
 * fsdp_clip_grad_norm on this module clips over all shards (see fsdp_sharded_clip_grad_norm). */
fsdp_module *fsdp_sharded_flat_params(const fsdp_sharded *sh);

int fsdp_sharded_num_units(const fsdp_sharded *sh);
/* A unit's module path relative to the root ("" for the root), its number of flat elements
 * (parameters plus alignment gaps, before padding to the group size) and elements per shard. */
const char *fsdp_sharded_unit_path(const fsdp_sharded *sh, int unit);
int64_t fsdp_sharded_unit_numel(const fsdp_sharded *sh, int unit);
int64_t fsdp_sharded_unit_shard_numel(const fsdp_sharded *sh, int unit);
/* A unit's flat shard (shard_numel elements; under use_orig_params the original parameters of
 * fsdp_sharded_flat_params are views into it), or NULL when unit is out of range. */
fsdp_param *fsdp_sharded_unit_flat_param(const fsdp_sharded *sh, int unit);

/* Where each original parameter lies: in its unit's flat buffer and in this rank's shard. */
typedef struct fsdp_flat_segment {
    const char *fqn;      /* relative to the root: "layers.0.net1.weight" */
    fsdp_param *param;    /* the model's parameter (its local TP block when distributed) */
    int unit;             /* index of the unit that owns it */
    int64_t offset;       /* first element in the unit's flat buffer */
    int64_t numel;        /* the parameter's local elements */
    int64_t shard_begin;  /* the first of its elements in this rank's shard (0 when none) */
    int64_t shard_numel;  /* how many of its elements this rank's shard holds (may be 0) */
    int64_t shard_offset; /* where they start in the shard */
} fsdp_flat_segment;
int fsdp_sharded_num_segments(const fsdp_sharded *sh);
/* Segment i, units in pre-order and parameters in flat order within each. */
fsdp_status fsdp_sharded_segment(fsdp_ctx *ctx, const fsdp_sharded *sh, int i,
                                 fsdp_flat_segment *out);

/* no_sync: with sync false, backward accumulates gradients in the units' full gradient
 * buffers without communicating (they stay allocated); the first backward after sync is set
 * true again reduces everything accumulated. */
void fsdp_sharded_set_sync(fsdp_sharded *sh, bool sync);

/* summon_full_params. Every rank of the group calls it; refused inside forward or backward
 * and while already summoned. opts NULL means PyTorch's defaults: writeback only. */
typedef struct fsdp_summon_options {
    bool writeback;      /* on release, each rank copies its own part of every flat parameter
                            back into its shard (edits elsewhere are lost, as in PyTorch) */
    bool rank0_only;     /* only rank 0 of the group keeps the full parameters; the others
                            stay sharded. Not with writeback */
    bool offload_to_cpu; /* the full parameters are copies in host memory */
    bool with_grads;     /* gather the sharded gradients too: each parameter's gradient holds
                            its full reduced gradient until release */
} fsdp_summon_options;
fsdp_status fsdp_summon_full_params(fsdp_ctx *ctx, fsdp_sharded *sh,
                                    const fsdp_summon_options *opts);
fsdp_status fsdp_release_full_params(fsdp_ctx *ctx, fsdp_sharded *sh);

/* Gradient clipping over every shard (PyTorch's FullyShardedDataParallel.clip_grad_norm_):
 * the norm of the whole model's gradient, summed over the group for sharded units and over the
 * TP mesh dims where a parameter is Shard, with one all_reduce per distinct group; then the
 * shard gradients are scaled by max_norm / (total + 1e-6) when that is below 1. norm_type 2.0
 * or INFINITY. Every rank calls it after backward; *total_norm may be NULL. */
fsdp_status fsdp_sharded_clip_grad_norm(fsdp_ctx *ctx, fsdp_sharded *sh, double max_norm,
                                        double norm_type, double *total_norm);

/* Bytes FSDP holds on this rank (optimizer state is the optimizer's, not counted here). */
typedef struct fsdp_memory_stats {
    int64_t shard_bytes;       /* flat parameter shards and their gradients */
    int64_t host_bytes;        /* of which in host memory (offload_params), plus staging */
    int64_t full_bytes;        /* gathered parameters and full gradients in use now */
    int64_t peak_full_bytes;   /* the most full_bytes since wrapping or the last reset */
    int64_t reserved_bytes;    /* the caching pool: blocks held, in use or kept for reuse */
    int64_t device_bytes;      /* on the compute device now: the pool plus on-device shards */
    int64_t peak_device_bytes; /* the most device_bytes since wrapping or the last reset */
    /* Rank threads: the padded bytes of the units whose group's shards live side by side in one
     * block (fsdp_group_share_shards), so that their parameters are gathered in place there
     * without a pool block (nor a copy); 0 on MPI and when none is. */
    int64_t shared_full_bytes;
} fsdp_memory_stats;
void fsdp_sharded_memory(const fsdp_sharded *sh, fsdp_memory_stats *out);
void fsdp_sharded_reset_peak(fsdp_sharded *sh);

#ifdef __cplusplus
}
#endif
#endif
