/* state_sync.c: the one module-state broadcast of data parallelism: every parameter and
 * buffer of a model from one rank of a group, packed in buckets. FSDP's sync_module_states and
 * replicate's initial sync (DDP's _sync_module_states) both call it. */
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/error.h"
#include "dp/dp_impl.h"

typedef struct state_list {
    fsdp_tensor **t;
    const char **name; /* parameters only; buffers by their module's */
    int n;
    int64_t cap;     /* of both arrays, which grow together */
    fsdp_device dev; /* where the packed tensors are: the first f32 tensor's device */
} state_list;

static fsdp_status list_push(fsdp_ctx *ctx, state_list *l, fsdp_tensor *t, const char *name) {
    int64_t cap_t = l->cap, cap_name = l->cap;
    if (!fsdp_array_reserve((void **)&l->t, &cap_t, l->n + 1, sizeof *l->t) ||
        !fsdp_array_reserve((void **)&l->name, &cap_name, l->n + 1, sizeof *l->name))
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot list module states");
    l->cap = cap_t;
    l->t[l->n] = t;
    l->name[l->n++] = name;
    return FSDP_OK;
}

static fsdp_status list_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    return list_push(ctx, user, fsdp_param_data(p), fsdp_param_name(p));
}

static fsdp_status list_buffers(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    for (int i = 0; i < fsdp_module_num_buffers(m); i++)
        FSDP_TRY_AT(ctx,
                    list_push(ctx, user, fsdp_module_buffer(m, i), fsdp_module_buffer_name(m, i)));
    return FSDP_OK;
}

static bool is_f32_cpu(const fsdp_tensor *t) {
    return fsdp_tensor_dtype(t) == FSDP_DTYPE_F32 && fsdp_tensor_device(t).type == FSDP_DEVICE_CPU;
}

/* Packed into buckets: the f32 tensors on the list's device (a model on one device: all its f32
 * tensors); the others are broadcast alone. */
static bool is_packed(const state_list *l, const fsdp_tensor *t) {
    fsdp_device d = fsdp_tensor_device(t);
    return fsdp_tensor_dtype(t) == FSDP_DTYPE_F32 && d.type == l->dev.type &&
           d.index == l->dev.index;
}

/* dst[dst_at..) <- src[src_at..), n elements, through the device record (no host access). */
static fsdp_status copy_flat(fsdp_ctx *ctx, fsdp_tensor *dst, int64_t dst_at,
                             const fsdp_tensor *src, int64_t src_at, int64_t n) {
    fsdp_tensor *to = NULL, *from = NULL;
    fsdp_status st = fsdp_tensor_view(ctx, dst, dst_at, 1, &n, &to);
    if (st == FSDP_OK) st = fsdp_tensor_view(ctx, src, src_at, 1, &n, &from);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, to, from);
    fsdp_tensor_free(to);
    fsdp_tensor_free(from);
    return FSDP_PASS(ctx, st);
}

/* Broadcasts the f32 tensors t[first..last) through stage, packed in order. */
static fsdp_status broadcast_bucket(fsdp_ctx *ctx, fsdp_group *group, const state_list *l,
                                    int first, int last, fsdp_tensor *stage, int src) {
    int count = 0;
    for (int i = first; i < last; i++) count += is_packed(l, l->t[i]);
    if (count == 1) return fsdp_broadcast(ctx, group, l->t[first], src);
    bool is_src = fsdp_group_rank(group) == src;
    int64_t fill = 0;
    for (int i = first; i < last; i++) {
        if (!is_packed(l, l->t[i])) continue;
        int64_t n = fsdp_tensor_numel(l->t[i]);
        if (is_src) FSDP_TRY_AT(ctx, copy_flat(ctx, stage, fill, l->t[i], 0, n));
        fill += n;
    }
    fsdp_tensor *view;
    FSDP_TRY_AT(ctx, fsdp_tensor_view(ctx, stage, 0, 1, &fill, &view));
    fsdp_status st = fsdp_broadcast(ctx, group, view, src);
    fsdp_tensor_free(view);
    FSDP_TRY_AT(ctx, st);
    if (is_src) return FSDP_OK;
    fill = 0;
    for (int i = first; i < last; i++) {
        if (!is_packed(l, l->t[i])) continue;
        int64_t n = fsdp_tensor_numel(l->t[i]);
        FSDP_TRY_AT(ctx, copy_flat(ctx, l->t[i], 0, stage, fill, n));
        fill += n;
    }
    return FSDP_OK;
}

/* Splits the f32 tensors into buckets: starts[b] is bucket b's first index, starts[nb] = l->n
 * (non-f32 tensors between are skipped when broadcasting); *most: the largest bucket of two or
 * more tensors, in elements. */
static int form_buckets(const state_list *l, const fsdp_dp_sync_options *o, int *starts,
                        int64_t *most) {
    int64_t cap = o->bucket_bytes / (int64_t)sizeof(float);
    int nb = 0, count = 0;
    int64_t fill = 0;
    *most = 0;
    for (int i = 0; i < l->n; i++) {
        if (!is_packed(l, l->t[i])) continue;
        int64_t n = fsdp_tensor_numel(l->t[i]);
        bool close_before = !o->close_at_least && count > 0 && (n > cap || fill + n > cap);
        if (close_before) {
            if (count > 1 && fill > *most) *most = fill;
            fill = 0;
            count = 0;
        }
        if (count == 0) starts[nb++] = i;
        fill += n;
        count++;
        bool close_after =
            o->close_at_least ? fill * (int64_t)sizeof(float) >= o->bucket_bytes : n > cap;
        if (close_after) {
            if (count > 1 && fill > *most) *most = fill;
            fill = 0;
            count = 0;
        }
    }
    if (count > 1 && fill > *most) *most = fill;
    starts[nb] = l->n;
    return nb;
}

fsdp_status fsdp_dp_sync_states(fsdp_ctx *ctx, fsdp_module *root, fsdp_group *group,
                                const fsdp_dp_sync_options *o) {
    state_list l = {0};
    fsdp_status st = fsdp_module_visit_params(ctx, root, list_param, &l);
    if (st == FSDP_OK) st = fsdp_module_visit(ctx, root, list_buffers, &l);
    for (int i = 0; st == FSDP_OK && o->f32_only && i < l.n; i++)
        if (!is_f32_cpu(l.t[i]))
            st = FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                           "%s: '%s' is not an f32 CPU tensor; %s supports those only", o->who,
                           l.name[i], o->who);
    if (st != FSDP_OK || fsdp_group_size(group) == 1) {
        free(l.t);
        free(l.name);
        return FSDP_PASS(ctx, st);
    }
    l.dev = FSDP_CPU;
    for (int i = 0; i < l.n; i++)
        if (fsdp_tensor_dtype(l.t[i]) == FSDP_DTYPE_F32) {
            l.dev = fsdp_tensor_device(l.t[i]);
            break;
        }
    for (int i = 0; st == FSDP_OK && i < l.n; i++)
        if (!is_packed(&l, l.t[i])) st = fsdp_broadcast(ctx, group, l.t[i], o->src);
    int *starts = malloc(((size_t)l.n + 1) * sizeof *starts);
    if (!starts && st == FSDP_OK)
        st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "%s: cannot form broadcast buckets", o->who);
    int64_t most = 0;
    int nb = st == FSDP_OK ? form_buckets(&l, o, starts, &most) : 0;
    fsdp_tensor *stage = NULL;
    if (st == FSDP_OK && most > 0)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, l.dev, 1, &most, &stage);
    for (int b = 0; st == FSDP_OK && b < nb; b++)
        st = broadcast_bucket(ctx, group, &l, starts[b], starts[b + 1], stage, o->src);
    fsdp_tensor_free(stage);
    free(starts);
    free(l.t);
    free(l.name);
    return FSDP_PASS(ctx, st);
}
