/* dp_impl.h: what FSDP (fully_shard) and replicate share below both: the check that a
 * data-parallel group does not cross tensor-parallel shards, the one module-state broadcast
 * (FSDP's sync_module_states, replicate's initial sync), the gradient divide factors, and the
 * one body that reduces a gradient through a comm hook (comm_hook.c). Internal to src/dp. */
#ifndef FSDP_DP_DP_IMPL_H
#define FSDP_DP_DP_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/comm.h"
#include "fsdp/comm_hook.h"
#include "fsdp/module.h"

/* Refuses (FSDP_ERR_INVALID_ARGUMENT, nothing changed, no collective) a data-parallel group
 * that holds two ranks with different coordinates on a mesh dim where some parameter of root
 * is Shard or Partial: averaging over it would mix different TP shards. `who` and `field`
 * name the call and the option in the message ("fsdp_fully_shard", ".group"); given_null says
 * the group was defaulted to the world, so the message says to pass one. */
fsdp_status fsdp_dp_check_group(fsdp_ctx *ctx, fsdp_module *root, fsdp_group *group,
                                const char *who, const char *field, bool given_null);

/* How fsdp_dp_sync_states forms its buckets of f32 tensors. */
typedef struct fsdp_dp_sync_options {
    int64_t bucket_bytes;
    /* true (DDP): a bucket closes once it holds bucket_bytes or more. false (FSDP): a bucket
     * holds at most bucket_bytes and a larger tensor is broadcast on its own. */
    bool close_at_least;
    int src;         /* group rank whose values everyone takes */
    const char *who; /* names the caller in messages */
    bool f32_only;   /* refuse other dtypes and non-CPU tensors (else: one broadcast each) */
} fsdp_dp_sync_options;

/* Broadcasts every parameter (named_parameters order; the local block of a TP parameter) and
 * then every buffer (module pre-order) of root from group rank o->src: f32 tensors packed into
 * buckets, one broadcast per bucket (a bucket of one tensor is broadcast in place), others one
 * by one first. A group of one rank does nothing. */
fsdp_status fsdp_dp_sync_states(fsdp_ctx *ctx, fsdp_module *root, fsdp_group *group,
                                const fsdp_dp_sync_options *o);

/* PyTorch's gradient divide factors for a data-parallel size D (FSDP's
 * _get_gradient_predivide_factor): pre starts at 1 and doubles while D % pre == 0 and
 * D / pre > pre (tested before each doubling); post = D / pre. */
void fsdp_dp_divide_factors(int dp_size, double *pre, double *post);

/* FSDP_ERR_INVALID_ARGUMENT naming `who` for an unknown kind, USER without fn, or fn without
 * USER. */
fsdp_status fsdp_dp_check_hook(fsdp_ctx *ctx, const fsdp_comm_hook *hook, const char *who);
/* The dtype a built-in hook reduces in: bf16 for BF16, f16 for FP16, else reduce_dtype. */
fsdp_dtype fsdp_dp_hook_dtype(fsdp_comm_hook_kind kind, fsdp_dtype reduce_dtype);
/* mp's dtypes are f32, bf16 or f16, and a reduce_dtype other than f32 comes with the default
 * hook; else FSDP_ERR_INVALID_ARGUMENT naming the field, `who` the caller. */
/* A model on a device (dev: fsdp_nn_check_one_device's answer) must be on the rank's device,
 * where its collectives run; who names the caller, doing what it was about to do. */
fsdp_status fsdp_dp_check_rank_device(fsdp_ctx *ctx, fsdp_device dev, const char *who,
                                      const char *doing);
fsdp_status fsdp_dp_check_mixed_precision(fsdp_ctx *ctx, const fsdp_mixed_precision *mp,
                                          const fsdp_comm_hook *hook, const char *who);

/* One reduction of a data-parallel gradient. */
typedef struct fsdp_dp_reduce_args {
    const fsdp_comm_hook *hook;
    fsdp_dtype reduce_dtype; /* what FSDP_COMM_HOOK_DEFAULT reduces in (FSDP's reduce_dtype) */
    fsdp_group *group;       /* reduces first: reduce_scatter into out, or all_reduce */
    fsdp_group *replicate;   /* then all_reduce of the result over this (HYBRID_SHARD), or NULL */
    double pre, post;        /* built-ins: grad /= pre before, result /= post after (in f32) */
    int index;               /* the bucket or unit, for a user hook */
    fsdp_tensor *grad;       /* 1-D f32, this rank's gradient; overwritten */
    fsdp_tensor *out;        /* 1-D f32 of numel(grad) / W for a reduce_scatter, or NULL */
    /* When the built-in's dtype is not f32: buffers of that dtype with storage, as many
     * elements as grad and out. */
    fsdp_tensor *low_grad, *low_out;
} fsdp_dp_reduce_args;

/* A user hook: fn(ctx, {grad, out, group, index}, user). A built-in: divide by pre; in f32:
 * reduce_scatter into out (all_reduce of grad when out is NULL, nothing for a group of one),
 * all_reduce over replicate; in bf16/f16: grad rounded into low_grad, the same collectives on
 * low_grad / low_out, the result widened into out (or grad); divide by post. The result is in
 * out, or in grad when out is NULL. */
fsdp_status fsdp_dp_reduce(fsdp_ctx *ctx, const fsdp_dp_reduce_args *a);
/* What the built-ins multiply by to divide by `factor` (1 / factor rounded to f32). */
float fsdp_dp_inverse(double factor);
/* A bf16/f16 built-in's passes before and after its collectives, for a caller that starts the
 * collectives itself (FSDP's started reductions): grad /= pre in f32, then low = grad rounded
 * once (low: the hook's dtype, numel(grad) elements, with storage); and res = low widened
 * exactly, then res /= post in f32. fsdp_dp_reduce runs the same two around its collectives,
 * so both ways give the same bits. */
fsdp_status fsdp_dp_round(fsdp_ctx *ctx, fsdp_tensor *low, fsdp_tensor *grad, double pre);
fsdp_status fsdp_dp_widen(fsdp_ctx *ctx, fsdp_tensor *res, const fsdp_tensor *low, double post);

#endif
