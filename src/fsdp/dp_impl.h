/* dp_impl.h: what FSDP (fully_shard) and replicate share below both: the check that a
 * data-parallel group does not cross tensor-parallel shards, the one module-state broadcast
 * (FSDP's sync_module_states, replicate's initial sync), and the gradient divide factors.
 * Internal to src/fsdp. */
#ifndef FSDP_FSDP_DP_IMPL_H
#define FSDP_FSDP_DP_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/comm.h"
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

#endif
