/* shards.c: what FSDP's shards hold, read across ranks or counted: the gradient norm over all
 * shards and clipping by it, and the memory a wrapping holds. */
#include <string.h>

#include "core/error.h"
#include "dp/norm_impl.h"
#include "dp/shard_impl.h"
#include "fsdp/tp.h"
#include "kernels/kernels.h"

fsdp_status fsdp_sharded_clip_grad_norm(fsdp_ctx *ctx, fsdp_sharded *sh, double max_norm,
                                        double norm_type, double *total_norm) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, sh);
    FSDP_TRY_AT(ctx, fsdp_clip_check(ctx, max_norm, norm_type));
    FSDP_TRY_AT(ctx, fsdp_shard_check_model(ctx, sh, "fsdp_sharded_clip_grad_norm"));
    fsdp_norm_acc a;
    fsdp_norm_acc_init(&a, norm_type);
    /* Each parameter's part of the shard: summed over the group when sharded (replicas hold
     * equal gradients and count once), and over the TP mesh dims that shard the parameter. */
    for (int i = 0; i < sh->n_segments; i++) {
        const fsdp_flat_segment *s = &sh->segments[i];
        if (!fsdp_param_requires_grad(s->param)) continue;
        const unit *u = sh->units[s->unit];
        fsdp_group *groups[FSDP_NORM_MAX_GROUPS];
        int n = 0;
        if (fsdp_shard_sharded_strategy(sh)) groups[n++] = sh->group;
        const fsdp_dtensor_spec *spec = fsdp_param_dtensor_spec(s->param);
        int n_tp = 0;
        if (spec) FSDP_TRY_AT(ctx, fsdp_norm_spec_groups(ctx, s->param, spec, groups + n, &n_tp));
        FSDP_TRY_AT(ctx,
                    fsdp_norm_acc_add(ctx, &a, fsdp_tensor_device(fsdp_param_grad(u->flat)),
                                      fsdp_tensor_f32(fsdp_param_grad(u->flat)) + s->shard_offset,
                                      s->shard_numel, groups, n + n_tp));
    }
    double total;
    FSDP_TRY_AT(ctx, fsdp_norm_acc_total(ctx, &a, &total));
    if (total_norm) *total_norm = total;
    float coef;
    if (fsdp_clip_coef(max_norm, total, &coef))
        for (int i = 0; i < sh->n_units; i++) {
            fsdp_tensor *g = fsdp_param_grad(sh->units[i]->flat);
            fsdp_kernels_for(fsdp_tensor_device(g))
                ->scale(fsdp_tensor_f32(g), fsdp_tensor_f32(g), coef, fsdp_tensor_numel(g));
        }
    return FSDP_OK;
}

/* ---- memory ---- */

void fsdp_sharded_memory(const fsdp_sharded *sh, fsdp_memory_stats *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < sh->n_units; i++)
        out->shard_bytes += 2 * sh->units[i]->shard_numel * (int64_t)sizeof(float);
    int64_t on_device = sh->opts.offload_params ? 0 : out->shard_bytes;
    if (sh->opts.offload_params)
        out->host_bytes = out->shard_bytes + (int64_t)fsdp_tensor_nbytes(sh->host_stage);
    out->full_bytes = sh->pool.in_use_bytes;
    out->peak_full_bytes = sh->pool.peak_in_use_bytes;
    out->reserved_bytes = sh->pool.reserved_bytes;
    out->device_bytes = sh->pool.reserved_bytes + on_device;
    out->peak_device_bytes = sh->pool.peak_reserved_bytes + on_device;
    for (int i = 0; i < sh->n_units; i++)
        if (sh->units[i]->shared_full)
            out->shared_full_bytes += sh->units[i]->padded * (int64_t)sizeof(float);
}

void fsdp_sharded_reset_peak(fsdp_sharded *sh) {
    fsdp_pool_reset_peak(&sh->pool);
}
