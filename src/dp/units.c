/* units.c: wrapping a model in FSDP units: choosing the units, flattening each one's
 * parameters into a padded flat buffer and sharding it, the module the optimizer steps, the
 * hooks' installation, and who holds the state until it is freed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "dp/dp_impl.h"
#include "dp/flat.h"
#include "dp/shard_impl.h"
#include "nn/nn.h"

/* With use_orig_params every parameter starts at a multiple of this many elements (16 bytes of
 * f32), as PyTorch aligns them. */
#define ORIG_PARAM_ALIGN 4
/* sync_module_states broadcasts in buckets of at most this many bytes (PyTorch's
 * PARAM_BROADCAST_BUCKET_SIZE). */
#define SYNC_BUCKET_BYTES ((int64_t)250 * 1024 * 1024)

/* What a user who reaches a managed parameter is told (nn/nn.h). */
static const char managed_advice[] =
    "FSDP (fsdp_fully_shard) keeps it in flat shards: create the optimizer over "
    "fsdp_sharded_flat_params(sh), zero gradients with fsdp_optimizer_zero_grad on that "
    "optimizer (or fsdp_module_zero_grad on fsdp_sharded_flat_params(sh)), read values inside "
    "fsdp_summon_full_params, and apply tensor parallelism before fsdp_fully_shard";

static void sharded_destroy(fsdp_sharded *sh);

/* The root unit's hook lets go of the model's hold when the model is freed: from then on
 * nothing of the state points into the model. */
static void model_released(void *user) {
    fsdp_sharded *sh = ((unit *)user)->owner;
    if (sh->unwrapping || !sh->model_held) return;
    sh->model_held = false;
    for (int i = 0; i < sh->n_units; i++) {
        sh->units[i]->module = NULL;
        sh->units[i]->n_params = 0;
    }
    for (int i = 0; i < sh->n_segments; i++) sh->segments[i].param = NULL;
    sh->root = NULL;
    if (!sh->handle_held) sharded_destroy(sh);
}

fsdp_status fsdp_shard_check_model(fsdp_ctx *ctx, const fsdp_sharded *sh, const char *what) {
    if (sh->model_held) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "%s: the model this FSDP state wrapped has been freed; only "
                     "fsdp_sharded_flat_params and fsdp_sharded_free remain usable (free the "
                     "model after fsdp_sharded_free to read it back)",
                     what);
}

const char *fsdp_sharding_strategy_to_string(fsdp_sharding_strategy s) {
    static const char *names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
    return (int)s >= 0 && s < FSDP_SHARDING_STRATEGY_COUNT ? names[s] : "unknown";
}

/* ---- choosing units ---- */

typedef struct chooser {
    fsdp_sharded *sh;
    fsdp_module **picked; /* modules that become nested units */
    int n_picked;
    int64_t cap;
} chooser;

static bool listed(const char *s, const char *const *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i] && strcmp(list[i], s) == 0) return true;
    return false;
}

static bool is_unit_module(const chooser *c, const fsdp_module *m) {
    for (int i = 0; i < c->n_picked; i++)
        if (c->picked[i] == m) return true;
    return false;
}

/* Post-order: returns the parameter elements of m's subtree not yet in a unit. */
static fsdp_status choose(fsdp_ctx *ctx, chooser *c, fsdp_module *m, int64_t *left) {
    int64_t own = 0;
    for (int i = 0; i < fsdp_module_num_params(m); i++)
        own += fsdp_tensor_numel(fsdp_param_data(fsdp_module_param(m, i)));
    for (int i = 0; i < fsdp_module_num_children(m); i++) {
        int64_t sub;
        FSDP_TRY_AT(ctx, choose(ctx, c, fsdp_module_child(m, i), &sub));
        own += sub;
    }
    const fsdp_fully_shard_options *o = &c->sh->opts;
    bool wrap =
        m != c->sh->root && (listed(fsdp_module_kind(m), o->wrap_kinds, o->n_wrap_kinds) ||
                             listed(fsdp_module_fqn(m) + strlen(fsdp_module_fqn(c->sh->root)) +
                                        (fsdp_module_fqn(c->sh->root)[0] ? 1 : 0),
                                    o->wrap_paths, o->n_wrap_paths) ||
                             (o->min_num_params > 0 && own >= o->min_num_params));
    if (wrap && own > 0) {
        if (!fsdp_array_reserve((void **)&c->picked, &c->cap, c->n_picked + 1, sizeof *c->picked))
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot list FSDP units");
        c->picked[c->n_picked++] = m;
        own = 0;
    }
    *left = own;
    return FSDP_OK;
}

/* The unit module that holds m's parameters: m's nearest picked ancestor (itself included),
 * else the root. */
static const fsdp_module *unit_of(const chooser *c, const fsdp_module *m) {
    for (; m && m != c->sh->root; m = fsdp_module_parent(m))
        if (is_unit_module(c, m)) return m;
    return c->sh->root;
}

/* A Linear over a weight another module owns (tied weights) must be in that module's unit, as
 * FSDP1 requires of a shared parameter: another unit would read it resharded. */
static fsdp_status check_tied(fsdp_ctx *ctx, const chooser *c, const fsdp_module *m) {
    const fsdp_param *w = fsdp_nn_linear_weight(m);
    const fsdp_module *owner = w ? fsdp_param_module(w) : NULL;
    if (owner && owner != m && unit_of(c, owner) != unit_of(c, m)) {
        char a[200], b[200];
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_fully_shard: %s uses the weight of %s (tied weights), but the wrap "
                         "puts them in two units (%s and %s); a shared parameter lives in one "
                         "unit: wrap a module that holds both (the root), not %s alone",
                         fsdp_nn_describe(m, a, sizeof a), fsdp_nn_describe(owner, b, sizeof b),
                         unit_of(c, m) == c->sh->root ? "the root" : fsdp_module_fqn(unit_of(c, m)),
                         unit_of(c, owner) == c->sh->root ? "the root"
                                                          : fsdp_module_fqn(unit_of(c, owner)),
                         unit_of(c, owner) != c->sh->root ? fsdp_module_fqn(unit_of(c, owner))
                                                          : fsdp_module_fqn(unit_of(c, m)));
    }
    for (int i = 0; i < fsdp_module_num_children(m); i++)
        FSDP_TRY_AT(ctx, check_tied(ctx, c, fsdp_module_child(m, i)));
    return FSDP_OK;
}

/* Pre-order over m's subtree, skipping other units: the unit's parameters, each at the next
 * free offset (aligned with use_orig_params). */
static void collect(const chooser *c, unit *u, fsdp_module *m, bool count) {
    if (m != u->module && is_unit_module(c, m)) return;
    int64_t align = c->sh->opts.use_orig_params ? ORIG_PARAM_ALIGN : 1;
    for (int i = 0; i < fsdp_module_num_params(m); i++) {
        int64_t at = (u->numel + align - 1) / align * align;
        if (!count) {
            u->params[u->n_params] = fsdp_module_param(m, i);
            u->offsets[u->n_params] = at;
        }
        u->n_params++;
        u->numel = at + fsdp_tensor_numel(fsdp_param_data(fsdp_module_param(m, i)));
    }
    for (int i = 0; i < fsdp_module_num_children(m); i++)
        collect(c, u, fsdp_module_child(m, i), count);
}

/* A module's path relative to the root ("" for the root). */
static const char *rel_path(const fsdp_sharded *sh, const fsdp_module *m) {
    if (m == sh->root) return "";
    return fsdp_module_fqn(m) + strlen(fsdp_module_fqn(sh->root)) +
           (fsdp_module_fqn(sh->root)[0] ? 1 : 0);
}

/* ---- building a unit ---- */

static void unit_free(unit *u) {
    if (!u) return;
    fsdp_tensor_free(u->full);
    fsdp_tensor_free(u->shared_full);
    fsdp_tensor_free(u->full_grad);
    fsdp_tensor_free(u->reduced);
    fsdp_tensor_free(u->mine);
    fsdp_tensor_free(u->stage);
    fsdp_tensor_free(u->summon_host);
    fsdp_tensor_free(u->low_full);
    fsdp_tensor_free(u->low_mine);
    fsdp_tensor_free(u->low_copy);
    fsdp_tensor_free(u->low_grad);
    fsdp_tensor_free(u->low_reduced);
    free(u->params);
    free(u->offsets);
    free(u->path);
    free(u);
}

/* A handle of n elements on the model's device that holds no memory until the pool binds it. */
static fsdp_status empty_handle(fsdp_ctx *ctx, const fsdp_sharded *sh, int64_t n,
                                fsdp_tensor **out) {
    return fsdp_tensor_create_unbound(ctx, FSDP_DTYPE_F32, sh->pool.device, 1, &n, out);
}

/* The unbound handles of mixed precision and of the low-precision comm hooks. */
static fsdp_status low_handles(fsdp_ctx *ctx, const fsdp_sharded *sh, unit *u, bool sharded) {
    const fsdp_device dev = sh->pool.device;
    if (sh->param_dtype != FSDP_DTYPE_F32) {
        FSDP_TRY_AT(ctx, fsdp_tensor_create_unbound(ctx, sh->param_dtype, dev, 1, &u->padded,
                                                    &u->low_full));
        FSDP_TRY_AT(ctx, fsdp_tensor_create_unbound(ctx, sh->param_dtype, dev, 1, &u->shard_numel,
                                                    &u->low_mine));
    }
    if (sh->grad_dtype != FSDP_DTYPE_F32) {
        FSDP_TRY_AT(
            ctx, fsdp_tensor_create_unbound(ctx, sh->grad_dtype, dev, 1, &u->padded, &u->low_grad));
        if (sharded)
            FSDP_TRY_AT(ctx, fsdp_tensor_create_unbound(ctx, sh->grad_dtype, dev, 1,
                                                        &u->shard_numel, &u->low_reduced));
    }
    return FSDP_OK;
}

/* Collects the unit's parameters and checks them. */
static fsdp_status unit_collect(fsdp_ctx *ctx, fsdp_sharded *sh, const chooser *c, fsdp_module *m,
                                unit **out) {
    unit *u = calloc(1, sizeof *u);
    if (!u) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an FSDP unit");
    u->owner = sh;
    u->state = u->summon_from = UNIT_SHARDED;
    u->module = m;
    u->is_root = m == sh->root;
    for (int h = 0; h < 4; h++) u->hook_ids[h] = -1;
    u->path = strdup(rel_path(sh, m));
    if (u->path) collect(c, u, m, true);
    u->params = calloc((size_t)u->n_params + 1, sizeof *u->params);
    u->offsets = calloc((size_t)u->n_params + 1, sizeof *u->offsets);
    if (!u->path || !u->params || !u->offsets) {
        unit_free(u);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an FSDP unit");
    }
    u->n_params = 0;
    u->numel = 0;
    collect(c, u, m, false);
    *out = u;
    for (int i = 0; i < u->n_params; i++) {
        fsdp_param *p = u->params[i];
        if (fsdp_tensor_dtype(fsdp_param_data(p)) != FSDP_DTYPE_F32)
            return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                             "FSDP flattens f32 parameters; '%s' of '%s' is %s", fsdp_param_name(p),
                             fsdp_module_fqn(fsdp_param_module(p)),
                             fsdp_dtype_to_string(fsdp_tensor_dtype(fsdp_param_data(p))));
        if (!fsdp_tensor_has_storage(fsdp_param_data(p)))
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "fsdp_fully_shard: parameter '%s' of '%s' has no storage: is the "
                             "model already wrapped by another fsdp_fully_shard?",
                             fsdp_param_name(p), fsdp_module_fqn(fsdp_param_module(p)));
        if (!sh->opts.use_orig_params &&
            fsdp_param_requires_grad(p) != fsdp_param_requires_grad(u->params[0]))
            return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                             "FSDP unit '%s' mixes frozen and trainable parameters ('%s' of '%s' "
                             "and '%s' of '%s'); set use_orig_params, or wrap them in separate "
                             "units",
                             u->path, fsdp_param_name(u->params[0]),
                             fsdp_module_fqn(fsdp_param_module(u->params[0])), fsdp_param_name(p),
                             fsdp_module_fqn(fsdp_param_module(p)));
    }
    return FSDP_OK;
}

/* dst <- the `n` elements of src starting at `at`, through the device record (src may be on a
 * device: no host access). dst_at: where in dst. */
static fsdp_status copy_range(fsdp_ctx *ctx, fsdp_tensor *dst, int64_t dst_at,
                              const fsdp_tensor *src, int64_t at, int64_t n) {
    fsdp_tensor *to = NULL, *from = NULL;
    fsdp_status st = fsdp_tensor_view(ctx, dst, dst_at, 1, &n, &to);
    if (st == FSDP_OK) st = fsdp_tensor_view(ctx, src, at, 1, &n, &from);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, to, from);
    fsdp_tensor_free(to);
    fsdp_tensor_free(from);
    return FSDP_PASS(ctx, st);
}

/* Flattens the unit's parameters (zeros in the gaps and the padding), makes its shard
 * parameter, and leaves the model's parameters views of the full buffer when resident, without
 * storage otherwise. Everything is made on the model's device (sh->pool.device) and filled by
 * its copies: the host never touches device memory. */
static fsdp_status unit_build(fsdp_ctx *ctx, fsdp_sharded *sh, unit *u) {
    int64_t W = fsdp_shard_world(sh);
    bool sharded = fsdp_shard_sharded_strategy(sh);
    const fsdp_device dev = sh->pool.device;
    u->shard_numel = sharded ? (u->numel + W - 1) / W : u->numel;
    u->padded = sharded ? u->shard_numel * W : u->numel;
    fsdp_status st = fsdp_tensor_create_uninit(ctx, FSDP_DTYPE_F32, dev, 1, &u->padded, &u->full);
    if (st == FSDP_OK) st = low_handles(ctx, sh, u, sharded);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, u->full, 0.0f);
    if (st == FSDP_OK) st = empty_handle(ctx, sh, u->padded, &u->full_grad);
    if (st == FSDP_OK && sharded) st = empty_handle(ctx, sh, u->shard_numel, &u->reduced);
    if (st == FSDP_OK && (sharded || sh->opts.offload_params))
        st = empty_handle(ctx, sh, u->shard_numel, &u->mine);
    for (int i = 0; st == FSDP_OK && i < u->n_params; i++) {
        fsdp_param *p = u->params[i];
        st = copy_range(ctx, u->full, u->offsets[i], fsdp_param_data(p), 0,
                        fsdp_tensor_numel(fsdp_param_data(p)));
        if (st == FSDP_OK) st = fsdp_tensor_rebind(ctx, fsdp_param_data(p), u->full, u->offsets[i]);
        fsdp_tensor_release_storage(fsdp_param_grad(p));
    }
    /* The optimizer's view: this rank's chunk (resident: the whole buffer itself). */
    char name[256];
    size_t len = 0;
    for (const char *s = u->path; *s && len + 12 < sizeof name; s++)
        name[len++] = *s == '.' ? '_' : *s;
    snprintf(name + len, sizeof name - len, "%s_flat_param", len ? "_" : "");
    if (st == FSDP_OK)
        st = fsdp_module_add_param(ctx, sh->flat_store, name, 1, &u->shard_numel,
                                   (fsdp_init){.kind = FSDP_INIT_ZEROS}, &u->flat);
    if (st == FSDP_OK && u->n_params)
        fsdp_param_set_requires_grad(u->flat, fsdp_param_requires_grad(u->params[0]));
    /* made on the CPU (zeros): the shard and its gradient live on the model's device, or with
     * offload in host memory (pinned for a device model) */
    if (st == FSDP_OK && !sh->opts.offload_params)
        st = fsdp_tensor_move(ctx, fsdp_param_data(u->flat), dev);
    if (st == FSDP_OK && !sh->opts.offload_params)
        st = fsdp_tensor_move(ctx, fsdp_param_grad(u->flat), dev);
    if (st == FSDP_OK) st = fsdp_offload_pin(ctx, sh, u);
    if (st != FSDP_OK) return FSDP_PASS(ctx, st);
    /* Under mixed precision the parameters are a rounded copy, never the flat parameter. */
    if (fsdp_shard_resident(sh)) {
        u->state = UNIT_GATHERED; /* and so for its whole life */
        return fsdp_tensor_rebind(ctx, fsdp_param_data(u->flat), u->full, 0);
    }
    FSDP_TRY_AT(ctx, copy_range(ctx, fsdp_param_data(u->flat), 0, u->full,
                                sharded ? (int64_t)fsdp_shard_rank(sh) * u->shard_numel : 0,
                                u->shard_numel));
    /* Start sharded, as after a step: the flattening buffer is freed. */
    fsdp_shard_release_params(u);
    fsdp_tensor_release_storage(u->full);
    return FSDP_OK;
}

/* Every parameter's place in its unit's flat buffer and in this rank's shard. */
static fsdp_status make_segments(fsdp_ctx *ctx, fsdp_sharded *sh) {
    int n = 0;
    for (int i = 0; i < sh->n_units; i++) n += sh->units[i]->n_params;
    sh->segments = calloc((size_t)n + 1, sizeof *sh->segments);
    if (!sh->segments) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot list FSDP segments");
    for (int i = 0; i < sh->n_units; i++) {
        unit *u = sh->units[i];
        int64_t lo_shard =
            fsdp_shard_sharded_strategy(sh) ? (int64_t)fsdp_shard_rank(sh) * u->shard_numel : 0;
        int64_t hi_shard = lo_shard + u->shard_numel;
        for (int k = 0; k < u->n_params; k++) {
            fsdp_flat_segment *s = &sh->segments[sh->n_segments];
            fsdp_param *p = u->params[k];
            const char *mod = rel_path(sh, fsdp_param_module(p));
            size_t len = strlen(mod) + strlen(fsdp_param_name(p)) + 2;
            char *fqn = malloc(len);
            if (!fqn) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot name a segment");
            snprintf(fqn, len, "%s%s%s", mod, *mod ? "." : "", fsdp_param_name(p));
            s->fqn = fqn;
            sh->n_segments++;
            s->param = p;
            s->unit = i;
            s->offset = u->offsets[k];
            s->numel = fsdp_tensor_numel(fsdp_param_data(p));
            int64_t lo = s->offset > lo_shard ? s->offset : lo_shard;
            int64_t hi = s->offset + s->numel < hi_shard ? s->offset + s->numel : hi_shard;
            if (hi > lo) {
                s->shard_begin = lo - s->offset;
                s->shard_numel = hi - lo;
                s->shard_offset = lo - lo_shard;
            }
        }
    }
    return FSDP_OK;
}

/* use_orig_params: a module tree mirroring the model's, whose parameters are 1-D views of each
 * original parameter's part of the shards, created in the model's named_parameters() order. */
static fsdp_status mirror_module(fsdp_ctx *ctx, fsdp_sharded *sh, const fsdp_module *m,
                                 fsdp_module **out) {
    if (m == sh->root) {
        *out = sh->orig;
        return FSDP_OK;
    }
    fsdp_module *parent = NULL;
    FSDP_TRY_AT(ctx, mirror_module(ctx, sh, fsdp_module_parent(m), &parent));
    fsdp_module *child = fsdp_module_find(parent, fsdp_module_name(m));
    if (!child) {
        FSDP_TRY_AT(ctx, fsdp_module_create(ctx, fsdp_flat_params_ops(), NULL, &child));
        FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, parent, fsdp_module_name(m), child));
    }
    *out = child;
    return FSDP_OK;
}

static fsdp_status mirror_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)name;
    fsdp_sharded *sh = user;
    const fsdp_flat_segment *s = NULL;
    for (int i = 0; i < sh->n_segments && !s; i++)
        if (sh->segments[i].param == p) s = &sh->segments[i];
    if (!s) return FSDP_OK;
    const unit *u = sh->units[s->unit];
    fsdp_module *at;
    fsdp_param *view;
    FSDP_TRY_AT(ctx, mirror_module(ctx, sh, fsdp_param_module(p), &at));
    FSDP_TRY_AT(ctx, fsdp_module_add_param(ctx, at, fsdp_param_name(p), 1, &s->shard_numel,
                                           (fsdp_init){.kind = FSDP_INIT_ZEROS}, &view));
    fsdp_param_set_requires_grad(view, fsdp_param_requires_grad(p));
    FSDP_TRY_AT(ctx, fsdp_tensor_rebind(ctx, fsdp_param_data(view), fsdp_param_data(u->flat),
                                        s->shard_offset));
    return fsdp_tensor_rebind(ctx, fsdp_param_grad(view), fsdp_param_grad(u->flat),
                              s->shard_offset);
}

/* ---- wrapping ---- */

static fsdp_status check_options(fsdp_ctx *ctx, const fsdp_fully_shard_options *o) {
    if ((int)o->strategy < 0 || o->strategy >= FSDP_SHARDING_STRATEGY_COUNT)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_fully_shard: unknown strategy %d; use FSDP_FULL_SHARD, "
                         "FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD or FSDP_HYBRID_SHARD",
                         (int)o->strategy);
    if (o->strategy == FSDP_HYBRID_SHARD && !o->replicate_group)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_fully_shard: HYBRID_SHARD needs replicate_group (the ranks that "
                         "hold the same shard) besides group (the ranks that shard); with a "
                         "(replicate, shard) mesh pass its two dims' groups");
    if (o->strategy != FSDP_HYBRID_SHARD && o->replicate_group)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_fully_shard: replicate_group is only for HYBRID_SHARD; strategy "
                         "is %s",
                         fsdp_sharding_strategy_to_string(o->strategy));
    if (o->min_num_params < 0 || o->n_wrap_kinds < 0 || o->n_wrap_paths < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_fully_shard: negative min_num_params or list length");
    if ((int)o->backward_prefetch < 0 || o->backward_prefetch >= FSDP_BACKWARD_PREFETCH_COUNT)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_fully_shard: unknown backward_prefetch %d; use "
                         "FSDP_BACKWARD_PREFETCH_NONE, FSDP_BACKWARD_PRE or FSDP_BACKWARD_POST",
                         (int)o->backward_prefetch);
    FSDP_TRY_AT(ctx, fsdp_dp_check_hook(ctx, &o->comm_hook, "fsdp_fully_shard"));
    if (o->comm_hook.kind == FSDP_COMM_HOOK_USER && o->strategy == FSDP_HYBRID_SHARD)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "fsdp_fully_shard: a user comm hook is not supported with HYBRID_SHARD "
                         "(as in PyTorch); use the default, BF16 or FP16 hook, or another "
                         "strategy");
    FSDP_TRY_AT(ctx, fsdp_dp_check_mixed_precision(ctx, &o->mixed_precision, &o->comm_hook,
                                                   "fsdp_fully_shard"));
    return FSDP_OK;
}

/* The units' modules in pre-order: the root, then the picked modules as the tree visits them. */
static fsdp_status order_units(fsdp_ctx *ctx, const chooser *c, fsdp_module *m, fsdp_module **order,
                               int *n) {
    if (m == c->sh->root || is_unit_module(c, m)) order[(*n)++] = m;
    for (int i = 0; i < fsdp_module_num_children(m); i++)
        FSDP_TRY_AT(ctx, order_units(ctx, c, fsdp_module_child(m, i), order, n));
    return FSDP_OK;
}

static fsdp_status wrap(fsdp_ctx *ctx, fsdp_sharded *sh) {
    const fsdp_fully_shard_options *o = &sh->opts;
    /* Before flattening, as PyTorch: the shard group first, then across replicas. */
    if (o->sync_module_states) {
        fsdp_dp_sync_options so = {.bucket_bytes = SYNC_BUCKET_BYTES, .who = "sync_module_states"};
        FSDP_TRY_AT(ctx, fsdp_dp_sync_states(ctx, sh->root, sh->group, &so));
        if (sh->replicate) FSDP_TRY_AT(ctx, fsdp_dp_sync_states(ctx, sh->root, sh->replicate, &so));
    }
    chooser c = {.sh = sh};
    int64_t left;
    fsdp_status st = choose(ctx, &c, sh->root, &left);
    if (st == FSDP_OK) st = check_tied(ctx, &c, sh->root);
    if (st == FSDP_OK) st = fsdp_module_create(ctx, fsdp_flat_params_ops(), sh, &sh->flat_store);
    fsdp_module **order = NULL;
    int n_order = 0;
    if (st == FSDP_OK) {
        order = calloc((size_t)c.n_picked + 1, sizeof *order);
        sh->units = calloc((size_t)c.n_picked + 1, sizeof *sh->units);
        if (!order || !sh->units)
            st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate FSDP units");
    }
    if (st == FSDP_OK) st = order_units(ctx, &c, sh->root, order, &n_order);
    /* Every unit is checked before any parameter is moved. */
    for (int i = 0; st == FSDP_OK && i < n_order; i++) {
        st = unit_collect(ctx, sh, &c, order[i], &sh->units[i]);
        if (sh->units[i]) sh->n_units++;
    }
    for (int i = 0; st == FSDP_OK && i < sh->n_units; i++) {
        sh->units[i]->index = i;
        st = unit_build(ctx, sh, sh->units[i]);
    }
    free(order);
    free(c.picked);
    if (st == FSDP_OK) st = make_segments(ctx, sh);
    if (st == FSDP_OK && o->use_orig_params) {
        st = fsdp_module_create(ctx, fsdp_flat_params_ops(), sh, &sh->orig);
        if (st == FSDP_OK) st = fsdp_module_visit_params(ctx, sh->root, mirror_param, sh);
    }
    if (st == FSDP_OK && o->offload_params) {
        int64_t most = 1;
        for (int i = 0; i < sh->n_units; i++)
            if (sh->units[i]->shard_numel > most) most = sh->units[i]->shard_numel;
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &most, &sh->host_stage);
        for (int i = 0; st == FSDP_OK && i < sh->n_units; i++)
            st = fsdp_tensor_view(ctx, sh->host_stage, 0, 1, &sh->units[i]->shard_numel,
                                  &sh->units[i]->stage);
    }
    static const fsdp_hook_fn fns[4] = {fsdp_shard_pre_forward, fsdp_shard_post_forward,
                                        fsdp_shard_pre_backward, fsdp_shard_post_backward};
    for (int i = 0; st == FSDP_OK && i < sh->n_units; i++) {
        unit *u = sh->units[i];
        for (int h = 0; st == FSDP_OK && h < 4; h++) {
            /* Pre-hooks run before TP's (parameters first), post-hooks after them. The root's
             * post-backward hook carries the model's hold on the state. */
            bool front = h == FSDP_HOOK_PRE_FORWARD || h == FSDP_HOOK_PRE_BACKWARD;
            void (*release)(void *) =
                u->is_root && h == FSDP_HOOK_POST_BACKWARD ? model_released : NULL;
            st = front ? fsdp_nn_add_hook_front(ctx, u->module, (fsdp_hook_point)h, fns[h], u,
                                                release, &u->hook_ids[h])
                       : fsdp_module_add_hook(ctx, u->module, (fsdp_hook_point)h, fns[h], u,
                                              release, &u->hook_ids[h]);
            if (st == FSDP_OK && release) sh->model_held = true;
        }
    }
    for (int i = 0; st == FSDP_OK && i < sh->n_units; i++)
        for (int p = 0; p < sh->units[i]->n_params; p++)
            fsdp_nn_param_set_manager(sh->units[i]->params[p], managed_advice);
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_fully_shard(fsdp_ctx *ctx, fsdp_module *root, const fsdp_fully_shard_options *opts,
                             fsdp_sharded **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, root);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    fsdp_fully_shard_options o = opts ? *opts : (fsdp_fully_shard_options){0};
    FSDP_TRY_AT(ctx, check_options(ctx, &o));
    fsdp_group *group = o.group ? o.group : fsdp_ctx_world_group(ctx);
    if (!group)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_fully_shard: the context is not bound to a world; call it inside "
                         "fsdp_world_run");
    if (fsdp_nn_has_hook(root, FSDP_HOOK_PRE_FORWARD, fsdp_shard_pre_forward))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE, "fsdp_fully_shard: the model is already wrapped");
    fsdp_device dev;
    FSDP_TRY_AT(
        ctx, fsdp_nn_check_one_device(ctx, root, "fsdp_fully_shard", "FSDP", "wrapping it", &dev));
    FSDP_TRY_AT(ctx, fsdp_dp_check_rank_device(ctx, dev, "fsdp_fully_shard", "wrapping"));
    /* Before anything changes: a group across TP shards would average different shards. */
    FSDP_TRY_AT(ctx, fsdp_dp_check_group(ctx, root, group, "fsdp_fully_shard", ".group", !o.group));
    if (o.replicate_group)
        FSDP_TRY_AT(ctx, fsdp_dp_check_group(ctx, root, o.replicate_group, "fsdp_fully_shard",
                                             ".replicate_group", false));
    fsdp_sharded *sh = calloc(1, sizeof *sh);
    if (!sh) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate FSDP state");
    sh->opts = o;
    sh->group = group;
    sh->replicate =
        o.replicate_group && fsdp_group_size(o.replicate_group) > 1 ? o.replicate_group : NULL;
    sh->root = root;
    sh->sync = true;
    sh->handle_held = true;
    sh->pool.device = dev;
    sh->pool.poison = o.poison_resharded;
    /* Over the whole data-parallel size, as PyTorch. */
    int dp_size =
        fsdp_group_size(group) * (o.replicate_group ? fsdp_group_size(o.replicate_group) : 1);
    fsdp_dp_divide_factors(dp_size, &sh->pre_factor, &sh->post_factor);
    sh->param_dtype = o.mixed_precision.param_dtype;
    sh->grad_dtype = o.comm_hook.kind == FSDP_COMM_HOOK_USER
                         ? FSDP_DTYPE_F32
                         : fsdp_dp_hook_dtype(o.comm_hook.kind, o.mixed_precision.reduce_dtype);
    fsdp_status st = wrap(ctx, sh);
    if (st != FSDP_OK) {
        fsdp_sharded_free(sh);
        return FSDP_PASS(ctx, st);
    }
    *out = sh;
    return FSDP_OK;
}

/* Gives a tensor storage of its own: a copy of its current value, or zeros when it has none.
 * tmp is a scratch context (NULL when none could be made: then t is left as it is). */
static void own_storage(fsdp_ctx *tmp, fsdp_tensor *t) {
    fsdp_tensor *mine;
    if (!tmp || fsdp_tensor_create_like(tmp, t, &mine) != FSDP_OK) return;
    if (fsdp_tensor_has_storage(t)) fsdp_tensor_copy(tmp, mine, t);
    fsdp_tensor_rebind(tmp, t, mine, 0);
    fsdp_tensor_free(mine);
}

static void sharded_destroy(fsdp_sharded *sh) {
    fsdp_prefetch_release(sh); /* its stream's work ends before the blocks go */
    fsdp_post_backward_release(sh);
    fsdp_works_release(sh);
    for (int i = 0; i < sh->n_units; i++) unit_free(sh->units[i]);
    free(sh->units);
    for (int i = 0; i < sh->n_segments; i++) free((char *)sh->segments[i].fqn);
    free(sh->segments);
    fsdp_tensor_free(sh->host_stage);
    fsdp_pool_clear(&sh->pool);
    fsdp_module_free(sh->orig);
    fsdp_module_free(sh->flat_store);
    free(sh);
}

void fsdp_sharded_free(fsdp_sharded *sh) {
    if (!sh) return;
    sh->handle_held = false;
    /* The model is still there: unwrap it. Otherwise it let go already and nothing points
     * into it. */
    sh->unwrapping = true;
    /* The copies below are public calls, which need a context; nobody reads its messages. */
    fsdp_ctx *tmp = NULL;
    if (sh->root) fsdp_ctx_create(&(fsdp_ctx_options){.log_level = FSDP_LOG_OFF}, &tmp);
    for (int i = 0; sh->root && i < sh->n_units; i++) {
        unit *u = sh->units[i];
        for (int h = 0; h < 4; h++)
            if (u->hook_ids[h] > 0) fsdp_nn_remove_hook(u->module, u->hook_ids[h]);
        /* Parameters bound to a unit's buffers (or left without storage) get their own. */
        for (int p = 0; p < u->n_params; p++) {
            own_storage(tmp, fsdp_param_data(u->params[p]));
            own_storage(tmp, fsdp_param_grad(u->params[p]));
            fsdp_nn_param_set_manager(u->params[p], NULL);
        }
    }
    fsdp_ctx_free(tmp);
    sh->model_held = false;
    sharded_destroy(sh);
}

fsdp_module *fsdp_sharded_flat_params(const fsdp_sharded *sh) {
    return sh->orig ? sh->orig : sh->flat_store;
}
int fsdp_sharded_num_units(const fsdp_sharded *sh) {
    return sh->n_units;
}
const char *fsdp_sharded_unit_path(const fsdp_sharded *sh, int unit_index) {
    return unit_index >= 0 && unit_index < sh->n_units ? sh->units[unit_index]->path : NULL;
}
int64_t fsdp_sharded_unit_numel(const fsdp_sharded *sh, int unit_index) {
    return unit_index >= 0 && unit_index < sh->n_units ? sh->units[unit_index]->numel : -1;
}
int64_t fsdp_sharded_unit_shard_numel(const fsdp_sharded *sh, int unit_index) {
    return unit_index >= 0 && unit_index < sh->n_units ? sh->units[unit_index]->shard_numel : -1;
}
fsdp_param *fsdp_sharded_unit_flat_param(const fsdp_sharded *sh, int unit_index) {
    return unit_index >= 0 && unit_index < sh->n_units ? sh->units[unit_index]->flat : NULL;
}
int fsdp_sharded_num_segments(const fsdp_sharded *sh) {
    return sh->n_segments;
}
fsdp_status fsdp_sharded_segment(fsdp_ctx *ctx, const fsdp_sharded *sh, int i,
                                 fsdp_flat_segment *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, sh);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (i < 0 || i >= sh->n_segments)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_sharded_segment: index %d out of range [0, %d)", i, sh->n_segments);
    *out = sh->segments[i];
    return FSDP_OK;
}
void fsdp_sharded_set_sync(fsdp_sharded *sh, bool sync) {
    sh->sync = sync;
}
