/* dtensor.c: the DTensor handle (a local tensor that knows its spec): from_local,
 * distribute_tensor, redistribute and its backward, full_tensor, and the global view of a
 * distributed parameter. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "nn/nn.h"
#include "tp/tp_impl.h"

fsdp_status tp_dtensor_wrap(fsdp_ctx *ctx, const fsdp_tensor *t, const fsdp_dtensor_spec *spec,
                            fsdp_dtensor **out) {
    fsdp_dtensor *dt = calloc(1, sizeof *dt);
    if (!dt) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a DTensor");
    fsdp_status st = fsdp_tensor_view(ctx, t, 0, t->ndim, t->shape, &dt->local);
    if (st != FSDP_OK) {
        free(dt);
        return FSDP_PASS(ctx, st);
    }
    dt->local->dist = dt;
    dt->spec = *spec;
    *out = dt;
    return FSDP_OK;
}

void fsdp_dtensor_free(fsdp_dtensor *dt) {
    if (!dt) return;
    fsdp_tensor_free(dt->local);
    free(dt);
}

fsdp_tensor *fsdp_dtensor_local(const fsdp_dtensor *dt) {
    return dt->local;
}

const fsdp_dtensor_spec *fsdp_dtensor_spec_of(const fsdp_dtensor *dt) {
    return &dt->spec;
}

fsdp_dtensor *fsdp_dtensor_of(const fsdp_tensor *t) {
    return t ? t->dist : NULL;
}

/* Checks that local has the shape of this rank's block of spec. */
static fsdp_status check_block(fsdp_ctx *ctx, const fsdp_dtensor_spec *spec,
                               const fsdp_tensor *local, const char *what) {
    int64_t off[FSDP_MAX_DIMS], len[FSDP_MAX_DIMS];
    tp_spec_block(spec, off, len);
    for (int d = 0; d < spec->ndim; d++)
        if (local->shape[d] != len[d]) {
            char buf[64];
            return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                             "%s: the local tensor is %s, but this rank's block of the global "
                             "shape has %lld elements in dim %d (torch.chunk sizes); pass the "
                             "global shape that matches the shards",
                             what, fsdp_tensor_shape_string(local, buf, sizeof buf),
                             (long long)len[d], d);
        }
    return FSDP_OK;
}

fsdp_status fsdp_dtensor_from_local(fsdp_ctx *ctx, const fsdp_tensor *local, const fsdp_mesh *mesh,
                                    const fsdp_placement *placements, const int64_t *global_shape,
                                    fsdp_dtensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, local);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    FSDP_ARG_NOT_NULL(ctx, placements);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    fsdp_dtensor_spec spec;
    FSDP_TRY_AT(ctx, tp_spec_init(ctx, &spec, mesh, placements, local->ndim, local->shape,
                                  "fsdp_dtensor_from_local"));
    if (global_shape) {
        for (int d = 0; d < local->ndim; d++) spec.shape[d] = global_shape[d];
    } else {
        for (int i = 0; i < spec.mesh_ndim; i++)
            if (spec.placements[i].kind == FSDP_PLACEMENT_SHARD)
                spec.shape[spec.placements[i].dim] *= fsdp_mesh_size(mesh, i);
    }
    FSDP_TRY_AT(ctx, check_block(ctx, &spec, local, "fsdp_dtensor_from_local"));
    return tp_dtensor_wrap(ctx, local, &spec, out);
}

/* Redistributes dt to `to` into a new DTensor (a view of dt's storage when nothing moves). */
static fsdp_status redistribute_new(fsdp_ctx *ctx, const fsdp_dtensor *dt, const fsdp_placement *to,
                                    fsdp_dtensor **out) {
    tp_work w = {0};
    fsdp_tensor *buf = NULL;
    const fsdp_tensor *result;
    fsdp_status st = tp_redistribute(ctx, &dt->spec, dt->local, to, &w, &buf, &result);
    fsdp_dtensor_spec spec;
    if (st == FSDP_OK)
        st = tp_spec_init(ctx, &spec, dt->spec.mesh, to, dt->spec.ndim, dt->spec.shape,
                          "redistribute");
    if (st == FSDP_OK) st = tp_dtensor_wrap(ctx, result, &spec, out);
    tp_work_release(&w);
    fsdp_tensor_free(buf); /* the DTensor holds its own reference */
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_distribute_tensor(fsdp_ctx *ctx, const fsdp_tensor *global, const fsdp_mesh *mesh,
                                   const fsdp_placement *placements, int src_rank,
                                   fsdp_dtensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, global);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    FSDP_ARG_NOT_NULL(ctx, placements);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    int n = fsdp_mesh_ndim(mesh), mesh_size = 1;
    for (int i = 0; i < n; i++) mesh_size *= fsdp_mesh_size(mesh, i);
    if (src_rank != FSDP_NO_SRC_RANK && (src_rank < 0 || src_rank >= mesh_size))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_distribute_tensor: src_rank %d is outside the mesh of %d ranks; "
                         "use 0..%d or FSDP_NO_SRC_RANK",
                         src_rank, mesh_size, mesh_size - 1);
    fsdp_placement replicate[FSDP_MESH_MAX_DIMS];
    for (int i = 0; i < n; i++) replicate[i] = FSDP_REPLICATE;
    fsdp_dtensor_spec spec;
    FSDP_TRY_AT(ctx, tp_spec_init(ctx, &spec, mesh, placements, global->ndim, global->shape,
                                  "fsdp_distribute_tensor"));
    fsdp_dtensor *whole;
    if (src_rank == FSDP_NO_SRC_RANK) {
        FSDP_TRY_AT(ctx, fsdp_dtensor_from_local(ctx, global, mesh, replicate, NULL, &whole));
    } else {
        fsdp_tensor *copy;
        FSDP_TRY_AT(ctx, fsdp_tensor_create_like(ctx, global, &copy));
        fsdp_status st = fsdp_tensor_copy(ctx, copy, global);
        /* One broadcast per mesh dim from the source's coordinate: after dim i, every rank
         * whose coordinates after i equal the source's holds its values; after the last, all. */
        for (int i = 0, rest = src_rank; st == FSDP_OK && i < n; i++) {
            int stride = 1;
            for (int j = i + 1; j < n; j++) stride *= fsdp_mesh_size(mesh, j);
            fsdp_group *g;
            st = fsdp_mesh_get_group(ctx, mesh, fsdp_mesh_dim_name(mesh, i), &g);
            if (st == FSDP_OK) st = fsdp_broadcast(ctx, g, copy, rest / stride);
            rest %= stride;
        }
        if (st == FSDP_OK) st = fsdp_dtensor_from_local(ctx, copy, mesh, replicate, NULL, &whole);
        fsdp_tensor_free(copy);
        FSDP_TRY_AT(ctx, st);
    }
    fsdp_status st = redistribute_new(ctx, whole, spec.placements, out);
    fsdp_dtensor_free(whole);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_dtensor_redistribute(fsdp_ctx *ctx, const fsdp_dtensor *dt,
                                      const fsdp_placement *placements, fsdp_dtensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, dt);
    FSDP_ARG_NOT_NULL(ctx, placements);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    return redistribute_new(ctx, dt, placements, out);
}

fsdp_status fsdp_dtensor_redistribute_backward(fsdp_ctx *ctx, const fsdp_dtensor *grad,
                                               const fsdp_placement *from, fsdp_dtensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, grad);
    FSDP_ARG_NOT_NULL(ctx, from);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    fsdp_dtensor_spec before;
    FSDP_TRY_AT(ctx, tp_spec_init(ctx, &before, grad->spec.mesh, from, grad->spec.ndim,
                                  grad->spec.shape, "fsdp_dtensor_redistribute_backward"));
    fsdp_placement to[FSDP_MESH_MAX_DIMS];
    tp_backward_placements(&before, to);
    return redistribute_new(ctx, grad, to, out);
}

/* The global value of a local tensor under spec, as a new plain tensor. */
static fsdp_status gather_full(fsdp_ctx *ctx, const fsdp_dtensor_spec *spec,
                               const fsdp_tensor *local, fsdp_tensor **out) {
    fsdp_placement replicate[FSDP_MESH_MAX_DIMS];
    for (int i = 0; i < spec->mesh_ndim; i++) replicate[i] = FSDP_REPLICATE;
    tp_work w = {0};
    fsdp_tensor *buf = NULL;
    const fsdp_tensor *result;
    fsdp_status st = tp_redistribute(ctx, spec, local, replicate, &w, &buf, &result);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, result, out);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, *out, result);
    tp_work_release(&w);
    fsdp_tensor_free(buf);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_dtensor_full_tensor(fsdp_ctx *ctx, const fsdp_dtensor *dt, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, dt);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    return gather_full(ctx, &dt->spec, dt->local, out);
}

const fsdp_dtensor_spec *fsdp_param_dtensor_spec(const fsdp_param *p) {
    return p ? fsdp_nn_param_dist(p) : NULL;
}

fsdp_status fsdp_param_full_tensor(fsdp_ctx *ctx, const fsdp_param *p, bool grad,
                                   fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, p);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    const fsdp_tensor *t = grad ? fsdp_param_grad(p) : fsdp_param_data(p);
    const fsdp_dtensor_spec *spec = fsdp_nn_param_dist(p);
    if (!spec) {
        FSDP_TRY_AT(ctx, fsdp_tensor_create_like(ctx, t, out));
        return fsdp_tensor_copy(ctx, *out, t);
    }
    return gather_full(ctx, spec, t, out);
}
