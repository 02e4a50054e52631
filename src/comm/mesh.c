/* mesh.c: the N-d device mesh over the world: ranks laid out row-major, one group per dim
 * (labelled with the dim's name) made by splitting the world, 1-d sub-meshes by name, and
 * this rank's coordinate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "core/error.h"

struct fsdp_mesh {
    int ndim;
    int shape[FSDP_MESH_MAX_DIMS];
    char names[FSDP_MESH_MAX_DIMS][FSDP_GROUP_LABEL_MAX];
    int coord[FSDP_MESH_MAX_DIMS]; /* this rank's */
    int *ranks;                    /* world ranks in row-major order of the coordinates */
    fsdp_group *groups[FSDP_MESH_MAX_DIMS];
    fsdp_mesh *dims[FSDP_MESH_MAX_DIMS]; /* the 1-d sub-meshes (a sub-mesh: itself) */
    bool sub;                            /* a sub-mesh: owned by its parent, and so is its group */
};

static void mesh_destroy(fsdp_mesh *m) {
    if (!m) return;
    for (int k = 0; k < m->ndim; k++) {
        if (!m->sub) fsdp_group_destroy(m->groups[k]);
        if (m->dims[k] != m) mesh_destroy(m->dims[k]);
    }
    free(m->ranks);
    free(m);
}

void fsdp_mesh_free(fsdp_mesh *mesh) {
    if (mesh && !mesh->sub) mesh_destroy(mesh);
}

static bool name_ok(const char *name) {
    if (!name || !name[0] || strlen(name) >= FSDP_GROUP_LABEL_MAX) return false;
    for (const char *p = name; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

/* "dp, tp" */
static const char *list_names(const fsdp_mesh *m, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < m->ndim && used < size; k++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", k ? ", " : "", m->names[k]);
    return buf;
}

static fsdp_status check_args(fsdp_ctx *ctx, int ndim, const int *shape, const char *const *names) {
    static const char what[] = "fsdp_mesh_create";
    if (ndim < 1 || ndim > FSDP_MESH_MAX_DIMS)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: %d dims; a mesh has 1 to %d", what,
                         ndim, FSDP_MESH_MAX_DIMS);
    if (!shape || !names)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", what,
                         shape ? "names" : "shape");
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 1)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: dim %d ('%s') has size %d; sizes are at least 1", what, k,
                             names[k] ? names[k] : "", shape[k]);
        if (!name_ok(names[k]))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: dim %d's name '%s' is not allowed; use 1 to %d letters, digits "
                             "or '_' (e.g. \"dp\", \"tp\")",
                             what, k, names[k] ? names[k] : "(NULL)", FSDP_GROUP_LABEL_MAX - 1);
        for (int j = 0; j < k; j++)
            if (strcmp(names[j], names[k]) == 0)
                return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                                 "%s: dims %d and %d are both named '%s'; names must differ", what,
                                 j, k, names[k]);
    }
    return FSDP_OK;
}

/* The 1-d sub-mesh along dim k of m, sharing m's group. */
static fsdp_status make_sub(fsdp_ctx *ctx, fsdp_mesh *m, int k) {
    const fsdp_group *g = m->groups[k];
    fsdp_mesh *s = calloc(1, sizeof *s);
    int *ranks = malloc((size_t)g->size * sizeof *ranks);
    if (!s || !ranks) {
        free(s);
        free(ranks);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_mesh_create: out of memory");
    }
    memcpy(ranks, g->ranks, (size_t)g->size * sizeof *ranks);
    s->ndim = 1;
    s->shape[0] = g->size;
    memcpy(s->names[0], m->names[k], sizeof s->names[0]);
    s->coord[0] = g->rank;
    s->ranks = ranks;
    s->groups[0] = m->groups[k];
    s->dims[0] = s;
    s->sub = true;
    m->dims[k] = s;
    return FSDP_OK;
}

static fsdp_status build(fsdp_ctx *ctx, fsdp_mesh *m, const char *agree) {
    fsdp_group *world = NULL;
    FSDP_TRY_AT(ctx, fsdp_group_resolve_parent(ctx, &world, "fsdp_mesh_create"));
    for (int k = 0; k < m->ndim; k++) {
        /* Ranks that share every coordinate but k form dim k's group, ordered along k. */
        int color = 0;
        for (int j = 0; j < m->ndim; j++)
            if (j != k) color = color * m->shape[j] + m->coord[j];
        FSDP_TRY_AT(ctx, fsdp_group_split_agreed(ctx, world, color, m->coord[k], m->names[k], agree,
                                                 &m->groups[k]));
        m->groups[k]->borrowed = true;
    }
    for (int k = 0; k < m->ndim; k++) FSDP_TRY_AT(ctx, make_sub(ctx, m, k));
    return FSDP_OK;
}

fsdp_status fsdp_mesh_create(fsdp_ctx *ctx, int ndim, const int *shape, const char *const *names,
                             fsdp_mesh **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, shape);
    FSDP_ARG_NOT_NULL(ctx, names);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    const fsdp_world *world = fsdp_ctx_world(ctx);
    if (!world)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_mesh_create: this context is not bound to a world; create the "
                         "mesh inside fsdp_world_run, on the context passed to the rank's "
                         "function");
    FSDP_TRY_AT(ctx, check_args(ctx, ndim, shape, names));
    char agree[160];
    size_t used = (size_t)snprintf(agree, sizeof agree, "mesh (");
    int64_t total = 1;
    for (int k = 0; k < ndim; k++) {
        total *= shape[k];
        if (used < sizeof agree)
            used += (size_t)snprintf(agree + used, sizeof agree - used, "%s%s %d", k ? ", " : "",
                                     names[k], shape[k]);
    }
    if (used < sizeof agree) snprintf(agree + used, sizeof agree - used, ")");
    if (total != world->size)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "fsdp_mesh_create: %s has %lld ranks but the world has %d; the sizes' "
                         "product must be the world size",
                         agree, (long long)total, world->size);
    fsdp_mesh *m = calloc(1, sizeof *m);
    int *ranks = malloc((size_t)total * sizeof *ranks);
    if (!m || !ranks) {
        free(m);
        free(ranks);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_mesh_create: out of memory");
    }
    for (int r = 0; r < total; r++) ranks[r] = r;
    m->ndim = ndim;
    m->ranks = ranks;
    for (int k = ndim - 1, rest = ctx->rank; k >= 0; k--) {
        m->shape[k] = shape[k];
        snprintf(m->names[k], sizeof m->names[k], "%s", names[k]);
        m->coord[k] = rest % shape[k];
        rest /= shape[k];
    }
    fsdp_status st = build(ctx, m, agree);
    if (st != FSDP_OK) {
        mesh_destroy(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}

int fsdp_mesh_ndim(const fsdp_mesh *mesh) {
    return mesh ? mesh->ndim : 0;
}

int fsdp_mesh_size(const fsdp_mesh *mesh, int dim) {
    return mesh && dim >= 0 && dim < mesh->ndim ? mesh->shape[dim] : 0;
}

const char *fsdp_mesh_dim_name(const fsdp_mesh *mesh, int dim) {
    return mesh && dim >= 0 && dim < mesh->ndim ? mesh->names[dim] : NULL;
}

int fsdp_mesh_dim_index(const fsdp_mesh *mesh, const char *name) {
    for (int k = 0; mesh && name && k < mesh->ndim; k++)
        if (strcmp(mesh->names[k], name) == 0) return k;
    return -1;
}

int fsdp_mesh_coordinate(const fsdp_mesh *mesh, int dim) {
    return mesh && dim >= 0 && dim < mesh->ndim ? mesh->coord[dim] : -1;
}

int fsdp_mesh_rank_at(const fsdp_mesh *mesh, const int *coord) {
    if (!mesh || !coord) return -1;
    int index = 0;
    for (int k = 0; k < mesh->ndim; k++) {
        if (coord[k] < 0 || coord[k] >= mesh->shape[k]) return -1;
        index = index * mesh->shape[k] + coord[k];
    }
    return mesh->ranks[index];
}

static fsdp_status find_dim(fsdp_ctx *ctx, const fsdp_mesh *mesh, const char *name, int *k,
                            const char *what) {
    if (!mesh) return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: mesh is NULL", what);
    char names[FSDP_MESH_MAX_DIMS * (FSDP_GROUP_LABEL_MAX + 2)];
    if (!name) {
        if (mesh->ndim == 1) {
            *k = 0;
            return FSDP_OK;
        }
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: the mesh has %d dims; name one of them (%s)", what, mesh->ndim,
                         list_names(mesh, names, sizeof names));
    }
    *k = fsdp_mesh_dim_index(mesh, name);
    if (*k >= 0) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND, "%s: the mesh has no dim '%s'; its dims are %s", what,
                     name, list_names(mesh, names, sizeof names));
}

fsdp_status fsdp_mesh_dim(fsdp_ctx *ctx, const fsdp_mesh *mesh, const char *name, fsdp_mesh **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    FSDP_ARG_NOT_NULL(ctx, name);
    FSDP_ARG_NOT_NULL(ctx, out);
    int k;
    *out = NULL;
    FSDP_TRY_AT(ctx, find_dim(ctx, mesh, name, &k, "fsdp_mesh_dim"));
    *out = mesh->dims[k];
    return FSDP_OK;
}

fsdp_status fsdp_mesh_get_group(fsdp_ctx *ctx, const fsdp_mesh *mesh, const char *name,
                                fsdp_group **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, mesh);
    FSDP_ARG_NOT_NULL(ctx, out);
    int k;
    *out = NULL;
    FSDP_TRY_AT(ctx, find_dim(ctx, mesh, name, &k, "fsdp_mesh_get_group"));
    *out = mesh->groups[k];
    return FSDP_OK;
}
