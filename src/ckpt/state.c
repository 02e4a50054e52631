/* state.c: the state API: every parameter, buffer and optimizer state tensor of a model by
 * name, with the regions of its global tensor this rank holds under TP, FSDP and replicate. */
#define _POSIX_C_SOURCE 200809L /* strdup, strnlen, stpcpy, fsync */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/state_impl.h"
#include "core/array.h"
#include "core/error.h"

const char *fsdp_state_kind_to_string(fsdp_state_kind kind) {
    static const char *const names[] = {"param", "buffer", "optim"};
    return kind >= 0 && kind < FSDP_STATE_KIND_COUNT ? names[kind] : "unknown";
}

/* ---- building ---- */

static fsdp_status add_entry(fsdp_ctx *ctx, fsdp_state *st, const char *name,
                             const char *param_name, fsdp_state_kind kind, fsdp_dtype dtype,
                             int ndim, const int64_t *shape, state_entry **out) {
    if (strlen(name) >= FSDP_STATE_NAME_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "state name '%.64s...' is longer than %d bytes: shorten the module names",
                         name, FSDP_STATE_NAME_MAX - 1);
    if (dtype != FSDP_DTYPE_F32 && dtype != FSDP_DTYPE_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s' is %s; checkpoints hold f32 and bf16 tensors only: keep integer "
                         "values out of the model's parameters and buffers",
                         name, fsdp_dtype_to_string(dtype));
    for (int i = 0; i < st->n_entries; i++)
        if (!strcmp(st->entries[i].name, name))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "two state entries are called '%s': rename a module or parameter",
                             name);
    if (!fsdp_array_reserve((void **)&st->entries, &st->cap_entries, st->n_entries + 1,
                            sizeof *st->entries))
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot list the state");
    state_entry *e = &st->entries[st->n_entries];
    *e = (state_entry){.kind = kind, .dtype = dtype, .ndim = ndim};
    memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->name = strdup(name);
    e->param_name = strdup(param_name);
    st->n_entries++;
    if (!e->name || !e->param_name)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot name a state entry");
    *out = e;
    return FSDP_OK;
}

typedef struct emit_ctx {
    state_entry *e;
    fsdp_tensor *src;
    int64_t elem; /* where the next box's values start in src */
} emit_ctx;

static int emit_piece(const region *box, void *user) {
    emit_ctx *ec = user;
    state_entry *e = ec->e;
    if (!fsdp_array_reserve((void **)&e->pieces, &e->cap_pieces, e->n_pieces + 1,
                            sizeof *e->pieces))
        return 1;
    e->pieces[e->n_pieces++] = (state_piece){.box = *box, .src = ec->src, .elem = ec->elem};
    ec->elem += region_numel(box);
    return 0;
}

/* Where a parameter's local data lies in its global tensor. */
typedef struct block {
    int ndim;
    int64_t shape[FSDP_MAX_DIMS]; /* global */
    int64_t offset[FSDP_MAX_DIMS], len[FSDP_MAX_DIMS];
} block;

static fsdp_status block_of(fsdp_ctx *ctx, const fsdp_param *p, block *b) {
    const fsdp_tensor *local = fsdp_param_data(p);
    const fsdp_dtensor_spec *spec = fsdp_param_dtensor_spec(p);
    if (!spec) {
        b->ndim = fsdp_tensor_ndim(local);
        for (int d = 0; d < b->ndim; d++) {
            b->shape[d] = b->len[d] = fsdp_tensor_dim(local, d);
            b->offset[d] = 0;
        }
        return FSDP_OK;
    }
    b->ndim = spec->ndim;
    memcpy(b->shape, spec->shape, sizeof b->shape);
    return fsdp_placement_local_block(ctx, spec->mesh, spec->placements, spec->ndim, spec->shape,
                                      b->offset, b->len);
}

/* Elements [lo, hi) of the block, whose values start at element elem of src. */
static fsdp_status add_range(fsdp_ctx *ctx, state_entry *e, const block *b, int64_t lo, int64_t hi,
                             fsdp_tensor *src, int64_t elem) {
    emit_ctx ec = {.e = e, .src = src, .elem = elem};
    if (region_from_flat_range(b->ndim, b->offset, b->len, lo, hi, emit_piece, &ec))
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot list the regions of '%s'", e->name);
    return FSDP_OK;
}

static int64_t block_numel(const block *b) {
    int64_t n = 1;
    for (int d = 0; d < b->ndim; d++) n *= b->len[d];
    return n;
}

/* name relative to root: the module's fully qualified name without root's prefix. */
static void relative_name(const fsdp_module *root, const fsdp_module *m, const char *leaf,
                          char *buf, size_t size) {
    const char *rf = fsdp_module_fqn(root), *mf = fsdp_module_fqn(m);
    size_t rl = strlen(rf);
    const char *rel = mf + rl;
    if (rl && *rel == '.') rel++;
    snprintf(buf, size, "%s%s%s", rel, *rel ? "." : "", leaf);
}

typedef struct build {
    fsdp_state *st;
    const fsdp_state_sources *src;
} build;

static fsdp_status add_model_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    build *bd = user;
    fsdp_tensor *data = fsdp_param_data(p);
    if (!fsdp_tensor_has_storage(data))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "parameter '%s' has no storage (FSDP keeps it in its flat shards): pass "
                         "the fsdp_sharded handle as fsdp_state_sources.sharded",
                         name);
    block b;
    FSDP_TRYF(ctx, block_of(ctx, p, &b), "parameter '%s'", name);
    state_entry *e;
    FSDP_TRY_AT(ctx, add_entry(ctx, bd->st, name, name, FSDP_STATE_PARAM, fsdp_tensor_dtype(data),
                               b.ndim, b.shape, &e));
    return add_range(ctx, e, &b, 0, block_numel(&b), data, 0);
}

static fsdp_status add_sharded_params(fsdp_ctx *ctx, fsdp_state *st, fsdp_sharded *sh) {
    int n = fsdp_sharded_num_segments(sh);
    for (int i = 0; i < n; i++) {
        fsdp_flat_segment s;
        FSDP_TRY_AT(ctx, fsdp_sharded_segment(ctx, sh, i, &s));
        fsdp_tensor *flat = fsdp_param_data(fsdp_sharded_unit_flat_param(sh, s.unit));
        block b;
        FSDP_TRYF(ctx, block_of(ctx, s.param, &b), "parameter '%s'", s.fqn);
        state_entry *e;
        FSDP_TRY_AT(ctx, add_entry(ctx, st, s.fqn, s.fqn, FSDP_STATE_PARAM, fsdp_tensor_dtype(flat),
                                   b.ndim, b.shape, &e));
        FSDP_TRY_AT(ctx, add_range(ctx, e, &b, s.shard_begin, s.shard_begin + s.shard_numel, flat,
                                   s.shard_offset));
    }
    return FSDP_OK;
}

static fsdp_status add_buffers(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    build *bd = user;
    for (int i = 0; i < fsdp_module_num_buffers(m); i++) {
        fsdp_tensor *t = fsdp_module_buffer(m, i);
        char name[FSDP_STATE_NAME_MAX + 64];
        relative_name(bd->src->model, m, fsdp_module_buffer_name(m, i), name, sizeof name);
        block b = {.ndim = fsdp_tensor_ndim(t)};
        for (int d = 0; d < b.ndim; d++) b.shape[d] = b.len[d] = fsdp_tensor_dim(t, d);
        state_entry *e;
        FSDP_TRY_AT(ctx, add_entry(ctx, bd->st, name, name, FSDP_STATE_BUFFER, fsdp_tensor_dtype(t),
                                   b.ndim, b.shape, &e));
        FSDP_TRY_AT(ctx, add_range(ctx, e, &b, 0, fsdp_tensor_numel(t), t, 0));
    }
    return FSDP_OK;
}

static fsdp_status add_optim_entry(fsdp_ctx *ctx, fsdp_state *st, const fsdp_optim_state *os,
                                   const char *param_name, const fsdp_param *p, int64_t lo,
                                   int64_t hi, int64_t elem) {
    char name[FSDP_STATE_NAME_MAX + 64];
    snprintf(name, sizeof name, "optim/%s/%s", param_name,
             fsdp_optim_state_kind_to_string(os->kind));
    block b;
    FSDP_TRYF(ctx, block_of(ctx, p, &b), "optimizer state of '%s'", param_name);
    state_entry *e;
    FSDP_TRY_AT(ctx, add_entry(ctx, st, name, param_name, FSDP_STATE_OPTIM,
                               fsdp_tensor_dtype(os->value), b.ndim, b.shape, &e));
    e->optim_kind = os->kind;
    return add_range(ctx, e, &b, lo < 0 ? 0 : lo, lo < 0 ? block_numel(&b) : hi, os->value, elem);
}

/* The unit whose flat shard p is, or -1. */
static int unit_of_flat(const fsdp_sharded *sh, const fsdp_param *p) {
    for (int u = 0; u < fsdp_sharded_num_units(sh); u++)
        if (fsdp_sharded_unit_flat_param(sh, u) == p) return u;
    return -1;
}

/* An optimizer state of an FSDP model: of a flat shard (one entry per parameter in it) or of
 * an original parameter's shard view (use_orig_params). */
static fsdp_status add_sharded_optim(fsdp_ctx *ctx, fsdp_state *st, fsdp_sharded *sh,
                                     const fsdp_optim_state *os) {
    int unit = unit_of_flat(sh, os->param);
    bool found = false;
    for (int i = 0; i < fsdp_sharded_num_segments(sh); i++) {
        fsdp_flat_segment s;
        FSDP_TRY_AT(ctx, fsdp_sharded_segment(ctx, sh, i, &s));
        bool mine = unit >= 0 ? s.unit == unit : !strcmp(s.fqn, os->param_name);
        if (!mine) continue;
        found = true;
        int64_t elem = unit >= 0 ? s.shard_offset : 0;
        FSDP_TRY_AT(ctx, add_optim_entry(ctx, st, os, s.fqn, s.param, s.shard_begin,
                                         s.shard_begin + s.shard_numel, elem));
    }
    if (!found && unit < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "the optimizer steps '%s', which is not in the FSDP wrapping given: "
                         "create it over fsdp_sharded_flat_params(sharded)",
                         os->param_name);
    return FSDP_OK;
}

static fsdp_status add_optim(fsdp_ctx *ctx, build *bd) {
    fsdp_optimizer *opt = bd->src->optimizer;
    for (int i = 0; i < fsdp_optimizer_num_states(opt); i++) {
        fsdp_optim_state os;
        FSDP_TRY_AT(ctx, fsdp_optimizer_get_state(ctx, opt, i, &os));
        if (bd->src->sharded)
            FSDP_TRY_AT(ctx, add_sharded_optim(ctx, bd->st, bd->src->sharded, &os));
        else
            FSDP_TRY_AT(ctx, add_optim_entry(ctx, bd->st, &os, os.param_name, os.param, -1, -1, 0));
    }
    return FSDP_OK;
}

fsdp_status fsdp_state_create(fsdp_ctx *ctx, const fsdp_state_sources *src, fsdp_state **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, src);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (!src->model)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_state_create: sources->model is NULL (the model is required)");
    *out = NULL;
    fsdp_state *st = calloc(1, sizeof *st);
    if (!st) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a state");
    st->optimizer = src->optimizer;
    build bd = {.st = st, .src = src};
    fsdp_status s = src->sharded ? add_sharded_params(ctx, st, src->sharded)
                                 : fsdp_module_visit_params(ctx, src->model, add_model_param, &bd);
    if (s == FSDP_OK) s = fsdp_module_visit(ctx, src->model, add_buffers, &bd);
    if (s == FSDP_OK && src->optimizer) s = add_optim(ctx, &bd);
    if (s != FSDP_OK) {
        fsdp_state_free(st);
        return FSDP_PASS(ctx, s);
    }
    *out = st;
    return FSDP_OK;
}

void fsdp_state_free(fsdp_state *st) {
    if (!st) return;
    for (int i = 0; i < st->n_entries; i++) {
        free(st->entries[i].name);
        free(st->entries[i].param_name);
        free(st->entries[i].pieces);
    }
    free(st->entries);
    free(st);
}

/* ---- reading ---- */

int fsdp_state_num_entries(const fsdp_state *st) {
    return st ? st->n_entries : 0;
}

int fsdp_state_find(const fsdp_state *st, const char *name) {
    for (int i = 0; st && name && i < st->n_entries; i++)
        if (!strcmp(st->entries[i].name, name)) return i;
    return -1;
}

static fsdp_status check_index(fsdp_ctx *ctx, const fsdp_state *st, int i, int k) {
    if (!st) return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_state: NULL state");
    if (i < 0 || i >= st->n_entries)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "state entry %d does not exist; the state has %d", i, st->n_entries);
    if (k != -1 && (k < 0 || k >= st->entries[i].n_pieces))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "region %d of '%s' does not exist; this rank holds %d", k,
                         st->entries[i].name, st->entries[i].n_pieces);
    return FSDP_OK;
}

fsdp_status fsdp_state_entry_get(fsdp_ctx *ctx, const fsdp_state *st, int i,
                                 fsdp_state_entry *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, st);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_TRY_AT(ctx, check_index(ctx, st, i, -1));
    const state_entry *e = &st->entries[i];
    *out = (fsdp_state_entry){.name = e->name,
                              .param_name = e->param_name,
                              .kind = e->kind,
                              .optim_kind = e->optim_kind,
                              .dtype = e->dtype,
                              .ndim = e->ndim,
                              .n_regions = e->n_pieces};
    memcpy(out->shape, e->shape, sizeof out->shape);
    for (int k = 0; k < e->n_pieces; k++) out->numel_held += region_numel(&e->pieces[k].box);
    return FSDP_OK;
}

fsdp_status fsdp_state_region_get(fsdp_ctx *ctx, const fsdp_state *st, int i, int k,
                                  fsdp_state_region *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, st);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_TRY_AT(ctx, check_index(ctx, st, i, k));
    *out = st->entries[i].pieces[k].box;
    return FSDP_OK;
}

void *state_piece_host(const state_entry *e, int k) {
    const state_piece *p = &e->pieces[k];
    if (fsdp_tensor_device(p->src).type != FSDP_DEVICE_CPU || !fsdp_tensor_has_storage(p->src))
        return NULL;
    return (char *)fsdp_tensor_data(p->src) + (size_t)p->elem * fsdp_dtype_size(e->dtype);
}

/* A device tensor's piece through a view and a host tensor over the caller's memory. */
static fsdp_status piece_copy(fsdp_ctx *ctx, const state_entry *e, int k, void *host,
                              bool to_host) {
    const state_piece *p = &e->pieces[k];
    int64_t n = region_numel(&p->box);
    fsdp_tensor *view = NULL, *blob = NULL;
    fsdp_status s = fsdp_tensor_view(ctx, p->src, p->elem, 1, &n, &view);
    if (s == FSDP_OK) s = fsdp_tensor_from_blob(ctx, host, e->dtype, FSDP_CPU, 1, &n, &blob);
    if (s == FSDP_OK)
        s = to_host ? fsdp_tensor_copy(ctx, blob, view) : fsdp_tensor_copy(ctx, view, blob);
    fsdp_tensor_free(view);
    fsdp_tensor_free(blob);
    return s == FSDP_OK
               ? s
               : fsdp_error_hop(ctx, s, __FILE__, __LINE__, __func__, "state '%s'", e->name);
}

static fsdp_status check_storage(fsdp_ctx *ctx, const state_entry *e, int k) {
    if (fsdp_tensor_has_storage(e->pieces[k].src)) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "state '%s' has no storage now: save and load between steps, outside "
                     "forward, backward and summon_full_params",
                     e->name);
}

fsdp_status state_piece_read(fsdp_ctx *ctx, const state_entry *e, int k, void *dst) {
    FSDP_TRY_AT(ctx, check_storage(ctx, e, k));
    void *host = state_piece_host(e, k);
    if (!host) return piece_copy(ctx, e, k, dst, true);
    memcpy(dst, host, (size_t)region_numel(&e->pieces[k].box) * fsdp_dtype_size(e->dtype));
    return FSDP_OK;
}

fsdp_status state_piece_write(fsdp_ctx *ctx, const state_entry *e, int k, const void *src) {
    FSDP_TRY_AT(ctx, check_storage(ctx, e, k));
    void *host = state_piece_host(e, k);
    if (!host) return piece_copy(ctx, e, k, (void *)src, false);
    memmove(host, src, (size_t)region_numel(&e->pieces[k].box) * fsdp_dtype_size(e->dtype));
    return FSDP_OK;
}

fsdp_status fsdp_state_read_region(fsdp_ctx *ctx, const fsdp_state *st, int i, int k, void *dst) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, st);
    FSDP_ARG_NOT_NULL(ctx, dst);
    FSDP_TRY_AT(ctx, check_index(ctx, st, i, k));
    return state_piece_read(ctx, &st->entries[i], k, dst);
}

fsdp_status fsdp_state_write_region(fsdp_ctx *ctx, const fsdp_state *st, int i, int k,
                                    const void *src) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, st);
    FSDP_ARG_NOT_NULL(ctx, src);
    FSDP_TRY_AT(ctx, check_index(ctx, st, i, k));
    return state_piece_write(ctx, &st->entries[i], k, src);
}

/* The whole value in host memory: value's own when on the CPU, else a copy in *owned. */
static fsdp_status host_value(fsdp_ctx *ctx, const fsdp_tensor *value, fsdp_tensor **owned,
                              const void **data) {
    *owned = NULL;
    if (fsdp_tensor_device(value).type == FSDP_DEVICE_CPU) {
        *data = fsdp_tensor_data(value);
        return FSDP_OK;
    }
    FSDP_TRY_AT(ctx, fsdp_tensor_create(ctx, fsdp_tensor_dtype(value), FSDP_CPU,
                                        fsdp_tensor_ndim(value), fsdp_tensor_shape(value), owned));
    fsdp_status s = fsdp_tensor_copy(ctx, *owned, value);
    *data = fsdp_tensor_data(*owned);
    return FSDP_PASS(ctx, s);
}

static fsdp_status check_value(fsdp_ctx *ctx, const state_entry *e, const fsdp_tensor *value) {
    bool same = fsdp_tensor_ndim(value) == e->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = fsdp_tensor_dim(value, d) == e->shape[d];
    char want[96], got[96];
    if (!same) {
        region w = {.ndim = e->ndim};
        memcpy(w.count, e->shape, sizeof w.count);
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "loading '%s': the value is %s, the state is %s",
                         e->name, fsdp_tensor_shape_string(value, got, sizeof got),
                         region_to_string(&w, want, sizeof want));
    }
    if (fsdp_tensor_dtype(value) != e->dtype)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "loading '%s': the value is %s, the state is %s",
                         e->name, fsdp_dtype_to_string(fsdp_tensor_dtype(value)),
                         fsdp_dtype_to_string(e->dtype));
    if (!fsdp_tensor_has_storage(value))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE, "loading '%s': the value has no storage", e->name);
    return FSDP_OK;
}

fsdp_status fsdp_state_load_value(fsdp_ctx *ctx, const fsdp_state *st, const char *name,
                                  const fsdp_tensor *value) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, st);
    FSDP_ARG_NOT_NULL(ctx, name);
    FSDP_ARG_NOT_NULL(ctx, value);
    int i = fsdp_state_find(st, name);
    if (i < 0) return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND, "the state has no entry '%s'", name);
    const state_entry *e = &st->entries[i];
    FSDP_TRY_AT(ctx, check_value(ctx, e, value));
    region whole = {.ndim = e->ndim};
    memcpy(whole.count, e->shape, sizeof whole.count);
    fsdp_tensor *owned = NULL;
    const void *data = NULL;
    fsdp_status s = host_value(ctx, value, &owned, &data);
    size_t size = fsdp_dtype_size(e->dtype);
    for (int k = 0; s == FSDP_OK && k < e->n_pieces; k++) {
        const region *box = &e->pieces[k].box;
        void *host = state_piece_host(e, k), *tmp = NULL;
        if (!host) host = tmp = malloc((size_t)region_numel(box) * size + 1);
        if (!host) {
            s = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "loading '%s': no memory", name);
            break;
        }
        region_copy(host, box, data, &whole, box, size);
        if (tmp) s = state_piece_write(ctx, e, k, tmp);
        free(tmp);
    }
    fsdp_tensor_free(owned);
    return FSDP_PASS(ctx, s);
}

int64_t fsdp_state_steps(const fsdp_state *st) {
    return st && st->optimizer ? fsdp_optimizer_steps(st->optimizer) : 0;
}

void fsdp_state_set_steps(fsdp_state *st, int64_t steps) {
    if (st && st->optimizer) fsdp_optimizer_set_steps(st->optimizer, steps);
}
