/* group.c: process-group handles: splitting a group into sub-groups (by color and key, or by
 * a list of ranks), the accessors, and torch.chunk's split of a dimension among ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h"

void fsdp_chunk_range(int64_t n, int parts, int index, int64_t *offset, int64_t *length) {
    int64_t chunk = parts > 0 ? (n + parts - 1) / parts : 0;
    int64_t begin = (int64_t)index * chunk, end = begin + chunk;
    if (begin > n) begin = n;
    if (end > n) end = n;
    if (offset) *offset = begin;
    if (length) *length = end - begin;
}

/* "0,1,2,3" or, for long lists, "0,1,2,3,...,63". */
static void format_ranks(char *buf, size_t size, const int *ranks, int n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < size; i++) {
        if (n > 16 && i == 8) {
            used += (size_t)snprintf(buf + used, size - used, ",...");
            i = n - 2;
            continue;
        }
        used += (size_t)snprintf(buf + used, size - used, "%s%d", i ? "," : "", ranks[i]);
    }
}

fsdp_status fsdp_group_check_label(fsdp_ctx *ctx, const char *label, const char *what) {
    if (!label || !label[0])
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: the group label is empty", what);
    if (strlen(label) >= FSDP_GROUP_LABEL_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: group label '%s' is %zu bytes; at most %d fit", what, label,
                         strlen(label), FSDP_GROUP_LABEL_MAX - 1);
    return FSDP_OK;
}

fsdp_status fsdp_group_make(fsdp_ctx *ctx, fsdp_world *world, const fsdp_group_info *info,
                            const char *label, fsdp_group **out) {
    fsdp_group *g = calloc(1, sizeof *g);
    int *ranks = malloc((size_t)info->size * sizeof *ranks);
    if (!g || !ranks) {
        free(g);
        free(ranks);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a group handle of %d ranks",
                         info->size);
    }
    memcpy(ranks, info->ranks, (size_t)info->size * sizeof *ranks);
    g->world = world;
    g->state = info->state;
    g->rank = info->rank;
    g->size = info->size;
    g->ranks = ranks;
    snprintf(g->label, sizeof g->label, "%s", label);
    char list[FSDP_GROUP_DESC_MAX - FSDP_GROUP_LABEL_MAX - 24];
    format_ranks(list, sizeof list, ranks, info->size);
    snprintf(g->desc, sizeof g->desc, "'%s' (world ranks %s)", g->label, list);
    *out = g;
    return FSDP_OK;
}

void fsdp_group_destroy(fsdp_group *g) {
    if (!g) return;
    free(g->ranks);
    free(g);
}

void fsdp_group_free(fsdp_group *group) {
    if (group && !group->borrowed) fsdp_group_destroy(group);
}

fsdp_status fsdp_group_resolve_parent(fsdp_ctx *ctx, fsdp_group **parent, const char *what) {
    fsdp_comm_binding *b = fsdp_comm_binding_of(ctx);
    if (!b)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s: this context is not bound to a world; call it inside "
                         "fsdp_world_run, on the context passed to the rank's function",
                         what);
    if (!*parent) *parent = b->world_group;
    fsdp_group *g = *parent;
    if (g->world != b->world || g->ranks[g->rank] != ctx->rank)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: group %s belongs to another rank or world than this context "
                         "(rank %d); use the handles made on this rank",
                         what, g->desc, ctx->rank);
    return FSDP_OK;
}

/* A split's group id: the same on every member (they share the parent, the split's call
 * number on it and the color), different for each color and each split (splitmix64). */
static uint64_t child_id(uint64_t parent, uint64_t split_no, int color) {
    uint64_t z = parent * 0x9e3779b97f4a7c15u ^ split_no * 0xbf58476d1ce4e5b9u ^ (uint64_t)color;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

fsdp_status fsdp_group_split_agreed(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                                    const char *label, const char *agree, fsdp_group **out) {
    fsdp_group_info info = {0};
    const uint64_t seq = fsdp_trace_begin(ctx, parent, FSDP_OP_SPLIT);
    const uint64_t split_no = parent->calls;
    fsdp_status st = parent->world->backend.iface.split(ctx, parent, color, key, agree, &info);
    fsdp_trace_end(ctx, seq, st, false);
    FSDP_TRY_AT(ctx, st);
    if (!info.state) return FSDP_OK;
    FSDP_TRY_AT(ctx, fsdp_group_make(ctx, parent->world, &info, label ? label : "group", out));
    (*out)->id = child_id(parent->id, split_no, color);
    return FSDP_OK;
}

fsdp_status fsdp_group_split(fsdp_ctx *ctx, fsdp_group *parent, int color, int key,
                             const char *label, fsdp_group **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    static const char what[] = "fsdp_group_split";
    *out = NULL;
    FSDP_TRY_AT(ctx, fsdp_group_resolve_parent(ctx, &parent, what));
    if (label) FSDP_TRY_AT(ctx, fsdp_group_check_label(ctx, label, what));
    if (color < 0 && color != FSDP_GROUP_NO_COLOR)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: color %d is negative; use a color >= 0, or FSDP_GROUP_NO_COLOR "
                         "for a rank that joins no group",
                         what, color);
    return fsdp_group_split_agreed(ctx, parent, color, key, label, NULL, out);
}

fsdp_status fsdp_group_new(fsdp_ctx *ctx, fsdp_group *parent, int nranks, const int *ranks,
                           const char *label, fsdp_group **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ranks);
    FSDP_ARG_NOT_NULL(ctx, out);
    static const char what[] = "fsdp_group_new";
    *out = NULL;
    FSDP_TRY_AT(ctx, fsdp_group_resolve_parent(ctx, &parent, what));
    if (label) FSDP_TRY_AT(ctx, fsdp_group_check_label(ctx, label, what));
    if (nranks < 1)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: a group needs at least one rank (nranks %d)", what, nranks);
    int mine = -1;
    for (int i = 0; i < nranks; i++) {
        int in_parent = 0;
        for (int p = 0; p < parent->size; p++) in_parent |= parent->ranks[p] == ranks[i];
        if (!in_parent)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: rank %d (entry %d) is not a member of the parent group %s", what,
                             ranks[i], i, parent->desc);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                                 "%s: rank %d is listed twice (entries %d and %d)", what, ranks[i],
                                 j, i);
        if (ranks[i] == ctx->rank) mine = i;
    }
    /* Every rank of the parent must pass the same list: the backend compares this text, whose
     * hash covers lists too long to print whole. */
    uint64_t hash = 0xcbf29ce484222325u;
    for (int i = 0; i < nranks; i++) hash = (hash ^ (uint64_t)(unsigned)ranks[i]) * 0x100000001b3u;
    char list[160], agree[256];
    format_ranks(list, sizeof list, ranks, nranks);
    snprintf(agree, sizeof agree, "group [%s] (%d ranks, hash %016llx)", list, nranks,
             (unsigned long long)hash);
    return fsdp_group_split_agreed(ctx, parent, mine >= 0 ? 0 : FSDP_GROUP_NO_COLOR, mine, label,
                                   agree, out);
}

int fsdp_group_size(const fsdp_group *group) {
    return group ? group->size : 0;
}
int fsdp_group_rank(const fsdp_group *group) {
    return group ? group->rank : -1;
}
int fsdp_group_world_rank(const fsdp_group *group, int group_rank) {
    if (!group || group_rank < 0 || group_rank >= group->size) return -1;
    return group->ranks[group_rank];
}
const char *fsdp_group_label(const fsdp_group *group) {
    return group ? group->label : "";
}

fsdp_status fsdp_group_share_shards(fsdp_ctx *ctx, fsdp_group *group, fsdp_tensor *shard,
                                    fsdp_tensor **full) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, shard);
    FSDP_ARG_NOT_NULL(ctx, full);
    *full = NULL;
    FSDP_TRY_AT(ctx, fsdp_group_resolve_parent(ctx, &group, "fsdp_group_share_shards"));
    const fsdp_comm_backend_i *b = &group->world->backend.iface;
    fsdp_status st = fsdp_tensor_ndim(shard) == 1
                         ? fsdp_tensor_relocatable(ctx, shard, "fsdp_group_share_shards")
                         : FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                                     "fsdp_group_share_shards: the shard must be 1-D, not %d-D",
                                     fsdp_tensor_ndim(shard));
    if (!b->share_shards) return FSDP_PASS(ctx, st);
    const uint64_t seq = fsdp_trace_begin(ctx, group, FSDP_OP_SHARE);
    if (st != FSDP_OK) {
        fsdp_trace_end(ctx, seq, st, false);
        if (b->reject) { /* the peers fail at once, naming this rank */
            fsdp_error_record mine;
            fsdp_error_save(ctx, &mine);
            b->reject(ctx, group, (fsdp_comm_op)FSDP_OP_SHARE);
            fsdp_error_restore(ctx, &mine);
        }
        return FSDP_PASS(ctx, st);
    }
    fsdp_trace_describe(ctx, seq, shard);
    st = b->share_shards(ctx, group, shard, full);
    fsdp_trace_end(ctx, seq, st, false);
    FSDP_TRY_AT(ctx, st);
    return FSDP_OK;
}
