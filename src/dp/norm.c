/* norm.c: the global gradient norm over distributed gradients, in pieces (norm_impl.h), and
 * clip_grad_norm's argument check and coefficient. Below both of its users: the optimizers'
 * fsdp_clip_grad_norm and FSDP's fsdp_sharded_clip_grad_norm. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "dp/norm_impl.h"
#include "kernels/kernels.h"

void fsdp_norm_acc_init(fsdp_norm_acc *a, double norm_type) {
    memset(a, 0, sizeof *a);
    a->inf = isinf(norm_type) != 0;
}

/* The accumulator of a group set, made when it is new. */
static fsdp_status find_key(fsdp_ctx *ctx, fsdp_norm_acc *a, fsdp_group *const *groups,
                            int n_groups, fsdp_norm_key **out) {
    for (int k = 0; k < a->n_keys; k++) {
        fsdp_norm_key *key = &a->keys[k];
        if (key->n_groups == n_groups &&
            memcmp(key->groups, groups, (size_t)n_groups * sizeof *groups) == 0) {
            *out = key;
            return FSDP_OK;
        }
    }
    if (a->n_keys == FSDP_NORM_MAX_KEYS)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "clip_grad_norm: more than %d distinct sets of groups shard the "
                         "gradients",
                         FSDP_NORM_MAX_KEYS);
    fsdp_norm_key *key = &a->keys[a->n_keys++];
    memcpy(key->groups, groups, (size_t)n_groups * sizeof *groups);
    key->n_groups = n_groups;
    key->acc = 0.0;
    *out = key;
    return FSDP_OK;
}

fsdp_status fsdp_norm_acc_add(fsdp_ctx *ctx, fsdp_norm_acc *a, fsdp_device device, const float *g,
                              int64_t n, fsdp_group *const *groups, int n_groups) {
    if (n_groups < 0 || n_groups > FSDP_NORM_MAX_GROUPS)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "clip_grad_norm: %d groups for one gradient; at most %d", n_groups,
                         FSDP_NORM_MAX_GROUPS);
    fsdp_group *used[FSDP_NORM_MAX_GROUPS];
    int n_used = 0;
    for (int i = 0; i < n_groups; i++)
        if (groups[i] && fsdp_group_size(groups[i]) > 1) used[n_used++] = groups[i];
    fsdp_norm_key *key = NULL;
    FSDP_TRY_AT(ctx, find_key(ctx, a, used, n_used, &key));
    if (n <= 0) return FSDP_OK;
    const fsdp_kernels_i *k = fsdp_kernels_for(device);
    if (a->inf)
        key->acc = fmax(key->acc, k->max_abs(g, n));
    else
        key->acc += k->sum_squares(g, n);
    return FSDP_OK;
}

fsdp_status fsdp_norm_spec_groups(fsdp_ctx *ctx, const fsdp_param *p, const fsdp_dtensor_spec *spec,
                                  fsdp_group **groups, int *n) {
    *n = 0;
    for (int d = 0; d < spec->mesh_ndim; d++) {
        fsdp_placement_kind kind = spec->placements[d].kind;
        if (kind == FSDP_PLACEMENT_REPLICATE) continue;
        if (kind != FSDP_PLACEMENT_SHARD)
            return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                             "clip_grad_norm: parameter '%s' of '%s' has a placement that is "
                             "neither Shard nor Replicate on mesh dim %d",
                             fsdp_param_name(p), fsdp_module_fqn(fsdp_param_module(p)), d);
        FSDP_TRY_AT(ctx, fsdp_mesh_get_group(ctx, spec->mesh, fsdp_mesh_dim_name(spec->mesh, d),
                                             &groups[(*n)++]));
    }
    return FSDP_OK;
}

fsdp_status fsdp_norm_acc_total(fsdp_ctx *ctx, fsdp_norm_acc *a, double *total) {
    /* Each distinct group, in the order of first appearance, reduces the vector of the
     * accumulators that hold it; a key with several groups is reduced over each in turn. */
    fsdp_group *done[FSDP_NORM_MAX_KEYS * FSDP_NORM_MAX_GROUPS];
    int n_done = 0;
    float vec[FSDP_NORM_MAX_KEYS];
    for (int k = 0; k < a->n_keys; k++) {
        for (int i = 0; i < a->keys[k].n_groups; i++) {
            fsdp_group *g = a->keys[k].groups[i];
            bool seen = false;
            for (int j = 0; j < n_done && !seen; j++) seen = done[j] == g;
            if (seen) continue;
            done[n_done++] = g;
            int64_t len = 0;
            for (int q = k; q < a->n_keys; q++)
                for (int r = 0; r < a->keys[q].n_groups; r++)
                    if (a->keys[q].groups[r] == g) vec[len++] = (float)a->keys[q].acc;
            fsdp_tensor *t;
            FSDP_TRY_AT(ctx,
                        fsdp_tensor_from_blob(ctx, vec, FSDP_DTYPE_F32, FSDP_CPU, 1, &len, &t));
            fsdp_status st = fsdp_all_reduce(ctx, g, t, a->inf ? FSDP_REDUCE_MAX : FSDP_REDUCE_SUM);
            fsdp_tensor_free(t);
            FSDP_TRY_AT(ctx, st);
            len = 0;
            for (int q = k; q < a->n_keys; q++)
                for (int r = 0; r < a->keys[q].n_groups; r++)
                    if (a->keys[q].groups[r] == g) a->keys[q].acc = vec[len++];
        }
    }
    double acc = 0.0;
    for (int k = 0; k < a->n_keys; k++)
        acc = a->inf ? fmax(acc, a->keys[k].acc) : acc + a->keys[k].acc;
    *total = a->inf ? acc : sqrt(acc);
    return FSDP_OK;
}

fsdp_status fsdp_clip_check(fsdp_ctx *ctx, double max_norm, double norm_type) {
    if (!(max_norm > 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "clip_grad_norm: max_norm is %g; it must be > 0", max_norm);
    if (norm_type != 2.0 && !isinf(norm_type))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "clip_grad_norm: norm_type %g is not supported; use 2.0 or INFINITY",
                         norm_type);
    return FSDP_OK;
}

bool fsdp_clip_coef(double max_norm, double total, float *coef) {
    double c = max_norm / (total + 1e-6);
    *coef = (float)c;
    return c < 1.0;
}
