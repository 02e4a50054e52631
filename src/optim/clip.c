/* clip.c: gradient clipping by global norm over a module's trainable parameters, on one rank
 * or across the ranks that shard them: local |g|^p sums are kept apart by the groups that
 * shard them and added up over exactly those groups (fsdp/norm_impl.h). */
#include <math.h>

#include "core/error.h"
#include "dp/flat.h"
#include "dp/norm_impl.h"
#include "fsdp/optim.h"
#include "fsdp/tp.h"
#include "fsdp/wrap.h"
#include "kernels/kernels.h"

static fsdp_status add_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    if (!fsdp_param_requires_grad(p)) return FSDP_OK;
    /* FSDP's shards are clipped through fsdp_sharded_clip_grad_norm, which knows which group
     * shards each part of them; a part of its module tree cannot be clipped alone. */
    if (fsdp_module_is_flat_params(fsdp_param_module(p)))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "clip_grad_norm: '%s' is an FSDP shard inside the optimizer's module; "
                         "pass the whole fsdp_sharded_flat_params(sh) module (or call "
                         "fsdp_sharded_clip_grad_norm)",
                         fsdp_param_name(p));
    fsdp_tensor *grad = fsdp_param_grad(p);
    const float *g = fsdp_tensor_f32(grad);
    if (!g)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "clip_grad_norm: the gradient of '%s' of '%s' must be an f32 tensor",
                         fsdp_param_name(p), fsdp_module_fqn(fsdp_param_module(p)));
    fsdp_group *groups[FSDP_MESH_MAX_DIMS];
    int n_groups = 0;
    const fsdp_dtensor_spec *spec = fsdp_param_dtensor_spec(p);
    if (spec) FSDP_TRY_AT(ctx, fsdp_norm_spec_groups(ctx, p, spec, groups, &n_groups));
    return fsdp_norm_acc_add(ctx, user, fsdp_tensor_device(grad), g, fsdp_tensor_numel(grad),
                             groups, n_groups);
}

/* Adds every trainable parameter gradient of m: a plain parameter counts once; a TP parameter
 * is summed over the group of each mesh dim where its placement is Shard. */
static fsdp_status norm_acc_add_module(fsdp_ctx *ctx, fsdp_norm_acc *a, fsdp_module *m) {
    return fsdp_module_visit_params(ctx, m, add_param, a);
}

static fsdp_status scale(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    if (!fsdp_param_requires_grad(p)) return FSDP_OK;
    fsdp_tensor *grad = fsdp_param_grad(p);
    float *g = fsdp_tensor_f32(grad);
    fsdp_kernels_for(fsdp_tensor_device(grad))
        ->scale(g, g, *(const float *)user, fsdp_tensor_numel(grad));
    return FSDP_OK;
}

fsdp_status fsdp_clip_grad_norm(fsdp_ctx *ctx, fsdp_module *m, double max_norm, double norm_type,
                                double *total_norm) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_TRY_AT(ctx, fsdp_clip_check(ctx, max_norm, norm_type));
    /* The module FSDP hands the optimizer: its shards are summed over the groups that shard
     * each part of them. */
    fsdp_sharded *sh = fsdp_module_flat_params_owner(m);
    if (sh) return fsdp_sharded_clip_grad_norm(ctx, sh, max_norm, norm_type, total_norm);
    fsdp_norm_acc a;
    fsdp_norm_acc_init(&a, norm_type);
    FSDP_TRY_AT(ctx, norm_acc_add_module(ctx, &a, m));
    double total;
    FSDP_TRY_AT(ctx, fsdp_norm_acc_total(ctx, &a, &total));
    if (total_norm) *total_norm = total;
    float coef;
    if (fsdp_clip_coef(max_norm, total, &coef))
        FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, m, scale, &coef));
    return FSDP_OK;
}
