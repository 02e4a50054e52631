/* dp_group.c: the checks and numbers every data-parallel wrapper (FSDP, replicate) needs
 * about its group: that it does not cross tensor-parallel shards, and PyTorch's gradient
 * divide factors for its size. */
#include <stdio.h>

#include "core/error.h"
#include "dp/dp_impl.h"
#include "fsdp/tp.h"

void fsdp_dp_divide_factors(int dp_size, double *pre, double *post) {
    int factor = 1;
    while (dp_size % factor == 0 && dp_size / factor > factor) factor *= 2;
    *pre = factor;
    *post = (double)dp_size / factor;
}

typedef struct group_check {
    fsdp_group *group;
    fsdp_param *bad; /* the first parameter the group would mix */
    const char *dim; /* its mesh dim */
    int rank_a, rank_b;
} group_check;

/* The coordinate of world rank w along the mesh dim whose group (this rank's line along it) is
 * line: meshes lay world ranks out row-major, so it is (w / stride) % size, where stride is the
 * distance between neighbours on the line. */
static int line_coordinate(const fsdp_group *line, int w) {
    int stride = fsdp_group_world_rank(line, 1) - fsdp_group_world_rank(line, 0);
    return stride > 0 ? (w / stride) % fsdp_group_size(line) : 0;
}

static fsdp_status check_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    group_check *c = user;
    const fsdp_dtensor_spec *spec = fsdp_param_dtensor_spec(p);
    if (!spec || c->bad) return FSDP_OK;
    for (int d = 0; d < spec->mesh_ndim; d++) {
        if (spec->placements[d].kind == FSDP_PLACEMENT_REPLICATE) continue;
        fsdp_group *line;
        FSDP_TRY_AT(ctx,
                    fsdp_mesh_get_group(ctx, spec->mesh, fsdp_mesh_dim_name(spec->mesh, d), &line));
        if (fsdp_group_size(line) < 2) continue;
        int first = fsdp_group_world_rank(c->group, 0);
        int want = line_coordinate(line, first);
        for (int i = 1; i < fsdp_group_size(c->group); i++) {
            int w = fsdp_group_world_rank(c->group, i);
            if (line_coordinate(line, w) == want) continue;
            c->bad = p;
            c->dim = fsdp_mesh_dim_name(spec->mesh, d);
            c->rank_a = first;
            c->rank_b = w;
            return FSDP_OK;
        }
    }
    return FSDP_OK;
}

fsdp_status fsdp_dp_check_group(fsdp_ctx *ctx, fsdp_module *root, fsdp_group *group,
                                const char *who, const char *field, bool given_null) {
    if (!group || fsdp_group_size(group) < 2) return FSDP_OK;
    group_check c = {.group = group};
    FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, root, check_param, &c));
    if (!c.bad) return FSDP_OK;
    const char *pfqn = fsdp_module_fqn(fsdp_param_module(c.bad));
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "%s: the data-parallel group '%s'%s holds world ranks %d and %d, which hold "
                     "different shards along tensor-parallel mesh dim '%s' (parameter '%s%s%s' "
                     "is distributed there): averaging gradients over it would mix those "
                     "shards. Set %s to the group of the mesh's data-parallel dim, e.g. "
                     "fsdp_mesh_get_group(ctx, mesh, \"dp\", &group)",
                     who, fsdp_group_label(group),
                     given_null ? " (the default: no group given)" : "", c.rank_a, c.rank_b, c.dim,
                     pfqn, *pfqn ? "." : "", fsdp_param_name(c.bad), field);
}

fsdp_status fsdp_dp_check_rank_device(fsdp_ctx *ctx, fsdp_device dev, const char *who,
                                      const char *doing) {
    if (dev.type == FSDP_DEVICE_CPU) return FSDP_OK;
    fsdp_device mine = fsdp_ctx_device(ctx);
    if (mine.type != dev.type || mine.index != dev.index)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "%s: the model is on %s:%d but this rank's device is %s:%d; data "
                         "parallelism gathers and reduces on the rank's device: call "
                         "fsdp_ctx_set_device(ctx, the model's device) before %s, or move the "
                         "model with fsdp_module_to(ctx, model, fsdp_ctx_device(ctx))",
                         who, fsdp_device_to_string(dev), dev.index, fsdp_device_to_string(mine),
                         mine.index, doing);
    return FSDP_OK;
}
