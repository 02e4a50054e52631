/* redistribute.c: placements, specs and local blocks, and the redistribution engine: a plan of
 * one-mesh-dim steps (all_gather, all_reduce, reduce_scatter, all_to_all, local chunk,
 * Replicate -> Partial) that moves a local tensor from one set of placements to another. */
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"
#include "tp/tp_impl.h"

const char *fsdp_placement_to_string(fsdp_placement p, char *buf, size_t size) {
    switch (p.kind) {
    case FSDP_PLACEMENT_REPLICATE:
        snprintf(buf, size, "Replicate()");
        break;
    case FSDP_PLACEMENT_SHARD:
        snprintf(buf, size, "Shard(%d)", p.dim);
        break;
    case FSDP_PLACEMENT_PARTIAL:
        snprintf(buf, size, "Partial(sum)");
        break;
    case FSDP_PLACEMENT_DEFAULT:
        snprintf(buf, size, "default");
        break;
    default:
        snprintf(buf, size, "unknown(%d)", (int)p.kind);
    }
    return buf;
}

bool fsdp_placement_equal(fsdp_placement a, fsdp_placement b) {
    return a.kind == b.kind && (a.kind != FSDP_PLACEMENT_SHARD || a.dim == b.dim);
}

static bool is_shard(fsdp_placement p, int dim) {
    return p.kind == FSDP_PLACEMENT_SHARD && p.dim == dim;
}

fsdp_status tp_spec_init(fsdp_ctx *ctx, fsdp_dtensor_spec *spec, const fsdp_mesh *mesh,
                         const fsdp_placement *placements, int ndim, const int64_t *shape,
                         const char *what) {
    if (!mesh || !placements)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: mesh and placements are required",
                         what);
    if (ndim < 0 || ndim > FSDP_MAX_DIMS)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "%s: %d dims; at most %d", what, ndim, FSDP_MAX_DIMS);
    memset(spec, 0, sizeof *spec);
    spec->mesh = mesh;
    spec->mesh_ndim = fsdp_mesh_ndim(mesh);
    spec->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "%s: dim %d of the global shape is %lld", what, d,
                             (long long)shape[d]);
        spec->shape[d] = shape[d];
    }
    for (int i = 0; i < spec->mesh_ndim; i++) {
        fsdp_placement p = placements[i];
        char buf[24];
        if (p.kind != FSDP_PLACEMENT_REPLICATE && p.kind != FSDP_PLACEMENT_SHARD &&
            p.kind != FSDP_PLACEMENT_PARTIAL)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: placement %d (mesh dim '%s') is %s; give one of FSDP_REPLICATE, "
                             "FSDP_SHARD(d), FSDP_PARTIAL per mesh dim",
                             what, i, fsdp_mesh_dim_name(mesh, i),
                             fsdp_placement_to_string(p, buf, sizeof buf));
        if (p.kind == FSDP_PLACEMENT_SHARD) {
            int d = p.dim < 0 ? p.dim + ndim : p.dim;
            if (d < 0 || d >= ndim)
                return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                                 "%s: Shard(%d) on mesh dim '%s' is outside a %d-dim tensor", what,
                                 p.dim, fsdp_mesh_dim_name(mesh, i), ndim);
            p.dim = d;
        } else {
            p.dim = 0;
        }
        spec->placements[i] = p;
    }
    return FSDP_OK;
}

void tp_spec_block(const fsdp_dtensor_spec *spec, int64_t *offset, int64_t *length) {
    for (int d = 0; d < spec->ndim; d++) {
        offset[d] = 0;
        length[d] = spec->shape[d];
    }
    for (int i = 0; i < spec->mesh_ndim; i++) {
        fsdp_placement p = spec->placements[i];
        if (p.kind != FSDP_PLACEMENT_SHARD) continue;
        int64_t o, l;
        fsdp_chunk_range(length[p.dim], fsdp_mesh_size(spec->mesh, i),
                         fsdp_mesh_coordinate(spec->mesh, i), &o, &l);
        offset[p.dim] += o;
        length[p.dim] = l;
    }
}

fsdp_status fsdp_placement_local_block(fsdp_ctx *ctx, const fsdp_mesh *mesh,
                                       const fsdp_placement *placements, int ndim,
                                       const int64_t *shape, int64_t *offset, int64_t *length) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    FSDP_ARG_NOT_NULL(ctx, placements);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, offset);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, length);
    fsdp_dtensor_spec spec;
    FSDP_TRY_AT(
        ctx, tp_spec_init(ctx, &spec, mesh, placements, ndim, shape, "fsdp_placement_local_block"));
    tp_spec_block(&spec, offset, length);
    return FSDP_OK;
}

void tp_backward_placements(const fsdp_dtensor_spec *from, fsdp_placement *to) {
    for (int i = 0; i < from->mesh_ndim; i++)
        to[i] = from->placements[i].kind == FSDP_PLACEMENT_PARTIAL ? FSDP_REPLICATE
                                                                   : from->placements[i];
}

void tp_work_release(tp_work *w) {
    for (int i = 0; i < 2; i++) {
        fsdp_tensor_free(w->buf[i]);
        w->buf[i] = NULL;
    }
}

fsdp_status tp_buffer(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_dtype dtype, fsdp_device device,
                      int ndim, const int64_t *shape) {
    int64_t numel = fsdp_shape_numel(ndim, shape);
    if (*t && (*t)->dtype == dtype && fsdp_tensor_device(*t).type == device.type &&
        fsdp_tensor_device(*t).index == device.index && numel <= fsdp_tensor_capacity(*t))
        return fsdp_tensor_resize(ctx, *t, ndim, shape);
    fsdp_tensor *fresh; // each step's collective or copy writes it whole, as a reused one
    FSDP_TRY_AT(ctx, fsdp_tensor_create_uninit(ctx, dtype, device, ndim, shape, &fresh));
    fsdp_tensor_free(*t);
    *t = fresh;
    return FSDP_OK;
}

/* ---- planning ---- */

#define MAX_STEPS (2 * FSDP_MESH_MAX_DIMS + FSDP_MESH_MAX_DIMS)

typedef struct step {
    int mesh_dim;
    fsdp_placement to;
} step;

/* Whether mesh dim i shards a tensor dim (now or in the target) that another mesh dim also
 * shards (now or in the target): then the nesting order of the chunks matters, and the dim
 * is moved through Replicate (inner dims gathered first, outer dims chunked first). */
static bool entangled(const fsdp_placement *cur, const fsdp_placement *to, int n, int i) {
    for (int side = 0; side < 2; side++) {
        fsdp_placement p = side ? to[i] : cur[i];
        if (p.kind != FSDP_PLACEMENT_SHARD) continue;
        for (int j = 0; j < n; j++)
            if (j != i && (is_shard(cur[j], p.dim) || is_shard(to[j], p.dim))) return true;
    }
    return false;
}

/* The steps from cur to to (both normalised). Phase 1, inner to outer mesh dim: entangled
 * dims that change, or that sit inside a changing dim on the same tensor dim, go to
 * Replicate. Phase 2, outer to inner: every dim that still differs moves directly. */
static int plan(const fsdp_placement *from, const fsdp_placement *to, int n, step *steps) {
    fsdp_placement cur[FSDP_MESH_MAX_DIMS];
    memcpy(cur, from, sizeof(fsdp_placement) * (size_t)n);
    bool via[FSDP_MESH_MAX_DIMS] = {false};
    for (int i = 0; i < n; i++) {
        if (!entangled(cur, to, n, i)) continue;
        if (!fsdp_placement_equal(cur[i], to[i])) via[i] = true;
        for (int k = 0; k < i && !via[i]; k++)
            if (!fsdp_placement_equal(cur[k], to[k]) && cur[i].kind == FSDP_PLACEMENT_SHARD &&
                (is_shard(cur[k], cur[i].dim) || is_shard(to[k], cur[i].dim)))
                via[i] = true;
    }
    int ns = 0;
    for (int i = n - 1; i >= 0; i--)
        if (via[i] && cur[i].kind != FSDP_PLACEMENT_REPLICATE) {
            steps[ns++] = (step){i, FSDP_REPLICATE};
            cur[i] = FSDP_REPLICATE;
        }
    for (int i = 0; i < n; i++) {
        if (fsdp_placement_equal(cur[i], to[i])) continue;
        /* Shard -> Partial has no single collective: gather, then partition. */
        if (cur[i].kind == FSDP_PLACEMENT_SHARD && to[i].kind == FSDP_PLACEMENT_PARTIAL)
            steps[ns++] = (step){i, FSDP_REPLICATE};
        steps[ns++] = (step){i, to[i]};
        cur[i] = to[i];
    }
    return ns;
}

/* ---- execution ---- */

/* dst = src's elements [off, off + dst dim d) along dim d (all other dims equal), as `outer`
 * runs of one contiguous block each, through the device record of the tensors' device: on a
 * device the runs are queued on the calling thread's current stream (the rank's compute
 * stream), after the collective that made src (its blocking form made that stream wait). */
static fsdp_status slice_copy(fsdp_ctx *ctx, fsdp_tensor *dst, const fsdp_tensor *src, int d,
                              int64_t off) {
    size_t es = fsdp_dtype_size(src->dtype);
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < d; k++) outer *= src->shape[k];
    for (int k = d + 1; k < src->ndim; k++) inner *= src->shape[k];
    int64_t len = dst->shape[d], full = src->shape[d];
    if (outer == 0 || len == 0 || inner == 0) return FSDP_OK;
    fsdp_device dev = fsdp_tensor_device(src);
    const fsdp_device_i *rec = fsdp_device_for(dev.type);
    FSDP_ASSERT(rec && rec->copy_2d);
    const char *s = fsdp_tensor_data(src);
    char *t = fsdp_tensor_data(dst);
    return rec->copy_2d(ctx, t, dev, (size_t)(len * inner) * es, s + (size_t)(off * inner) * es,
                        dev, (size_t)(full * inner) * es, (size_t)(len * inner) * es,
                        (size_t)outer);
}

/* One step on mesh dim i: out (already shaped for the new placements) from in. */
static fsdp_status run_step(fsdp_ctx *ctx, const fsdp_dtensor_spec *spec, int i, fsdp_placement to,
                            const fsdp_tensor *in, fsdp_tensor *out) {
    fsdp_placement from = spec->placements[i];
    fsdp_group *g;
    FSDP_TRY_AT(ctx, fsdp_mesh_get_group(ctx, spec->mesh, fsdp_mesh_dim_name(spec->mesh, i), &g));
    int coord = fsdp_mesh_coordinate(spec->mesh, i), size = fsdp_mesh_size(spec->mesh, i);
    switch (from.kind) {
    case FSDP_PLACEMENT_SHARD:
        if (to.kind == FSDP_PLACEMENT_REPLICATE) return fsdp_all_gather(ctx, g, out, in, from.dim);
        FSDP_ASSERT(to.kind == FSDP_PLACEMENT_SHARD);
        return fsdp_all_to_all(ctx, g, out, in, to.dim, from.dim);
    case FSDP_PLACEMENT_PARTIAL:
        if (to.kind == FSDP_PLACEMENT_SHARD)
            return fsdp_reduce_scatter(ctx, g, out, in, to.dim, FSDP_REDUCE_SUM);
        FSDP_TRY_AT(ctx, fsdp_tensor_copy(ctx, out, in));
        return fsdp_all_reduce(ctx, g, out, FSDP_REDUCE_SUM);
    case FSDP_PLACEMENT_REPLICATE:
        if (to.kind == FSDP_PLACEMENT_SHARD) {
            int64_t off, len;
            fsdp_chunk_range(in->shape[to.dim], size, coord, &off, &len);
            return slice_copy(ctx, out, in, to.dim, off);
        }
        /* Replicate -> Partial: the value on coordinate 0, zeros elsewhere: the sum is exact. */
        if (coord == 0) return fsdp_tensor_copy(ctx, out, in);
        return fsdp_tensor_fill(ctx, out, 0.0f);
    default:
        FSDP_ASSERT(!"unreachable placement");
        return FSDP_ERR_INTERNAL;
    }
}

fsdp_status tp_redistribute(fsdp_ctx *ctx, const fsdp_dtensor_spec *from, const fsdp_tensor *in,
                            const fsdp_placement *to, tp_work *w, fsdp_tensor **out,
                            const fsdp_tensor **result) {
    fsdp_dtensor_spec target, cur = *from;
    FSDP_TRY_AT(
        ctx, tp_spec_init(ctx, &target, from->mesh, to, from->ndim, from->shape, "redistribute"));
    int64_t off[FSDP_MAX_DIMS], len[FSDP_MAX_DIMS];
    tp_spec_block(from, off, len);
    for (int d = 0; d < from->ndim; d++)
        if (in->ndim != from->ndim || in->shape[d] != len[d]) {
            char buf[64];
            return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                             "redistribute: the local tensor is %s but this rank's block of the "
                             "global tensor has %lld in dim %d",
                             fsdp_tensor_shape_string(in, buf, sizeof buf), (long long)len[d], d);
        }
    step steps[MAX_STEPS];
    int ns = plan(from->placements, target.placements, from->mesh_ndim, steps);
    /* Mesh dims of size 1 only relabel: the local tensor is the whole along them. */
    int nlive = 0;
    for (int s = 0; s < ns; s++) nlive += fsdp_mesh_size(from->mesh, steps[s].mesh_dim) > 1;
    const fsdp_tensor *x = in;
    int k = 0;
    for (int s = 0; s < ns; s++) {
        fsdp_dtensor_spec next = cur;
        next.placements[steps[s].mesh_dim] = steps[s].to;
        if (fsdp_mesh_size(from->mesh, steps[s].mesh_dim) > 1) {
            fsdp_tensor **dst = k == nlive - 1 ? out : &w->buf[k % 2];
            tp_spec_block(&next, off, len);
            FSDP_TRY_AT(ctx,
                        tp_buffer(ctx, dst, in->dtype, fsdp_tensor_device(in), from->ndim, len));
            FSDP_TRY_AT(ctx, run_step(ctx, &cur, steps[s].mesh_dim, steps[s].to, x, *dst));
            x = *dst;
            k++;
        }
        cur = next;
    }
    *result = x;
    return FSDP_OK;
}
