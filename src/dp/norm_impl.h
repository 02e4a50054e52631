/* norm_impl.h: the global gradient norm over distributed gradients, in pieces. Each piece is
 * a run of local gradient values with the groups over which its |g|^p sum must be added up
 * (the mesh dims that shard it; none for a replicated value, which counts once). Pieces that
 * share a group set share one accumulator, and fsdp_norm_acc_total makes one all_reduce per
 * distinct group. The optimizers' fsdp_clip_grad_norm adds a module's parameters this way;
 * FSDP's flat shards add their segments with the data-parallel group as well. It lives in
 * src/dp, below both users (optim calls fsdp, never the reverse). Internal to libfsdp. */
#ifndef FSDP_DP_NORM_IMPL_H
#define FSDP_DP_NORM_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/comm.h"
#include "fsdp/module.h"
#include "fsdp/tp.h"

#define FSDP_NORM_MAX_GROUPS 8  /* groups per piece: mesh dims plus a data-parallel group */
#define FSDP_NORM_MAX_KEYS   32 /* distinct group sets in one norm */

typedef struct fsdp_norm_key {
    fsdp_group *groups[FSDP_NORM_MAX_GROUPS]; /* in the order they were given */
    int n_groups;
    double acc; /* sum of |g|^p, or max |g| */
} fsdp_norm_key;

typedef struct fsdp_norm_acc {
    bool inf; /* max |g| instead of the sum of |g|^2 */
    fsdp_norm_key keys[FSDP_NORM_MAX_KEYS];
    int n_keys;
} fsdp_norm_acc;

/* Starts a norm of type norm_type (2.0 or INFINITY; the caller has checked it). */
void fsdp_norm_acc_init(fsdp_norm_acc *a, double norm_type);

/* Adds n local gradient values (f32, in device memory) whose |g|^p sum (max |g| for inf) must be
 * added up over every group of groups[0..n_groups): the groups that shard them. n_groups 0 (or only
 * groups of size 1, which are dropped) means the values are replicated wherever they are, and
 * count once. Every rank of a group must add pieces with the same group sets in the same order
 * (n may differ, 0 included): pieces of the same model on every rank do. */
fsdp_status fsdp_norm_acc_add(fsdp_ctx *ctx, fsdp_norm_acc *a, fsdp_device device, const float *g,
                              int64_t n, fsdp_group *const *groups, int n_groups);

/* The groups of the mesh dims where spec (p's placement) shards it; *n of them. Refuses a
 * placement that is neither Shard nor Replicate. */
fsdp_status fsdp_norm_spec_groups(fsdp_ctx *ctx, const fsdp_param *p, const fsdp_dtensor_spec *spec,
                                  fsdp_group **groups, int *n);

/* Reduces the accumulators (one all_reduce, sum or max, per distinct group, in the order the
 * groups first appeared, of the f32 vector of the accumulators that hold that group) and
 * writes the global norm to *total: equal on every rank that added the same pieces. */
fsdp_status fsdp_norm_acc_total(fsdp_ctx *ctx, fsdp_norm_acc *a, double *total);

/* Checks clip_grad_norm's arguments: max_norm > 0, norm_type 2.0 or INFINITY. */
fsdp_status fsdp_clip_check(fsdp_ctx *ctx, double max_norm, double norm_type);

/* PyTorch's clip coefficient max_norm / (total + 1e-6); true when it is below 1 and gradients
 * must be scaled by *coef. */
bool fsdp_clip_coef(double max_norm, double total, float *coef);

#endif
