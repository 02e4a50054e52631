/* fully_shard.c: FSDP units over flat parameters: choosing the units, flattening their
 * parameters into one padded buffer, sharding it, and the hooks that gather before forward and
 * backward, reshard after, and reduce-scatter the flat gradient into the shard. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "fsdp/wrap.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"

typedef struct unit {
    fsdp_sharded *owner;
    fsdp_module *module;
    char *path; /* relative to the root, "" for the root */
    bool is_root;
    fsdp_param **params; /* pre-order, registration order, nested units' excluded */
    int64_t *offsets;    /* of each parameter in the flat buffer */
    int n_params;
    int64_t numel;          /* N: the parameters' elements */
    int64_t shard_numel;    /* S = ceil(N / W); the flat buffer has W * S */
    fsdp_tensor *full;      /* (W*S) the gathered flat parameter; parameters view into it */
    fsdp_tensor *full_grad; /* (W*S) parameter gradients view into it */
    fsdp_tensor *reduced;   /* (S) reduce_scatter output, added to the shard's gradient */
    fsdp_param *flat;       /* the shard (S) the optimizer steps; NO_SHARD: views full */
    bool unsharded;         /* full holds the current parameters */
    bool grad_pending;      /* full_grad holds gradients of no_sync backwards */
    int hook_ids[4];
} unit;

struct fsdp_sharded {
    fsdp_fully_shard_options opts;
    fsdp_group *group;
    int world, rank;
    double pre_factor, post_factor;
    fsdp_module *root;
    fsdp_module *flat_params; /* owns the flat shard parameters */
    unit **units;             /* pre-order; units[0] is the root */
    int n_units;
    bool sync;
    bool summoned;
    fsdp_summon_options summon;
    bool *summon_was_unsharded;
};

const char *fsdp_sharding_strategy_to_string(fsdp_sharding_strategy s) {
    static const char *names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
    return (int)s >= 0 && s < FSDP_SHARDING_STRATEGY_COUNT ? names[s] : "unknown";
}

/* ---- gather, reshard, reduce ---- */

static bool sharded_strategy(const fsdp_sharded *sh) {
    return sh->opts.strategy != FSDP_NO_SHARD && sh->world > 1;
}

static fsdp_status unshard(fsdp_ctx *ctx, unit *u) {
    if (u->unsharded || u->numel == 0) return FSDP_OK; /* a unit without parameters is silent */
    fsdp_sharded *sh = u->owner;
    /* The shard is rank r's chunk of full: gather in place. */
    fsdp_tensor *mine;
    FSDP_TRY(fsdp_tensor_view(ctx, u->full, (int64_t)sh->rank * u->shard_numel, 1, &u->shard_numel,
                              &mine));
    fsdp_status st = fsdp_tensor_copy(ctx, mine, u->flat->data);
    if (st == FSDP_OK) st = fsdp_all_gather(ctx, sh->group, u->full, mine, 0);
    fsdp_tensor_free(mine);
    if (st == FSDP_OK) u->unsharded = true;
    return st;
}

static void reshard(unit *u) {
    fsdp_sharded *sh = u->owner;
    if (!u->unsharded || !sharded_strategy(sh)) return;
    u->unsharded = false;
    if (!sh->opts.poison_resharded) return;
    float *f = fsdp_tensor_f32(u->full);
    int64_t lo = (int64_t)sh->rank * u->shard_numel, hi = lo + u->shard_numel;
    for (int64_t i = 0; i < fsdp_tensor_numel(u->full); i++)
        if (i < lo || i >= hi) f[i] = NAN;
}

static void scale(fsdp_tensor *t, double factor) {
    if (factor == 1.0) return;
    fsdp_kernels_for(fsdp_tensor_device(t))
        ->scale(fsdp_tensor_f32(t), fsdp_tensor_f32(t), (float)(1.0 / factor),
                fsdp_tensor_numel(t));
}

/* Averages the unit's full gradient over the group into its shard's gradient: divide by the
 * pre factor, reduce (reduce_scatter, or all_reduce for NO_SHARD), divide by the post factor,
 * add to the shard gradient. */
static fsdp_status reduce_grad(fsdp_ctx *ctx, unit *u) {
    fsdp_sharded *sh = u->owner;
    if (u->numel == 0) return FSDP_OK;
    const fsdp_kernels_i *k = fsdp_kernels_for(fsdp_tensor_device(u->full_grad));
    const fsdp_tensor *src = u->full_grad;
    if (sh->world > 1) {
        scale(u->full_grad, sh->pre_factor);
        if (sharded_strategy(sh)) {
            FSDP_TRY(
                fsdp_reduce_scatter(ctx, sh->group, u->reduced, u->full_grad, 0, FSDP_REDUCE_SUM));
            src = u->reduced;
        } else {
            FSDP_TRY(fsdp_all_reduce(ctx, sh->group, u->full_grad, FSDP_REDUCE_SUM));
        }
        scale((fsdp_tensor *)src, sh->post_factor);
    }
    k->axpy(fsdp_tensor_f32(u->flat->grad), 1.0f, fsdp_tensor_f32(src),
            fsdp_tensor_numel(u->flat->grad));
    u->grad_pending = false;
    return FSDP_OK;
}

/* ---- hooks ---- */

static fsdp_status pre_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                               const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    return unshard(ctx, user);
}

static fsdp_status post_forward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point, (void)io;
    unit *u = user;
    /* FULL_SHARD frees non-root parameters until backward; the root keeps them, since its
     * backward starts right after forward. */
    if (u->owner->opts.strategy == FSDP_FULL_SHARD && !u->is_root) reshard(u);
    return FSDP_OK;
}

static fsdp_status pre_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    unit *u = user;
    FSDP_TRY(unshard(ctx, u));
    if (!u->grad_pending) FSDP_TRY(fsdp_tensor_fill(ctx, u->full_grad, 0.0f));
    return FSDP_OK;
}

static fsdp_status post_backward(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 const fsdp_tensor **io, void *user) {
    (void)m, (void)point, (void)io;
    unit *u = user;
    if (!u->owner->sync) {
        u->grad_pending = true;
        return FSDP_OK;
    }
    FSDP_TRY(reduce_grad(ctx, u));
    reshard(u);
    return FSDP_OK;
}

/* ---- choosing units ---- */

typedef struct chooser {
    fsdp_sharded *sh;
    fsdp_module **picked; /* modules that become nested units */
    int n_picked;
    int cap;
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
    for (int i = 0; i < m->n_params; i++) own += fsdp_tensor_numel(m->params[i]->data);
    for (int i = 0; i < m->n_children; i++) {
        int64_t sub;
        FSDP_TRY(choose(ctx, c, m->children[i], &sub));
        own += sub;
    }
    const fsdp_fully_shard_options *o = &c->sh->opts;
    bool wrap = m != c->sh->root &&
                (listed(m->ops->kind, o->wrap_kinds, o->n_wrap_kinds) ||
                 listed(m->fqn + strlen(c->sh->root->fqn) + (c->sh->root->fqn[0] ? 1 : 0),
                        o->wrap_paths, o->n_wrap_paths) ||
                 (o->min_num_params > 0 && own >= o->min_num_params));
    if (wrap && own > 0) {
        if (c->n_picked == c->cap) {
            int cap = c->cap ? 2 * c->cap : 8;
            fsdp_module **p = realloc(c->picked, (size_t)cap * sizeof *p);
            if (!p) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot list FSDP units");
            c->picked = p;
            c->cap = cap;
        }
        c->picked[c->n_picked++] = m;
        own = 0;
    }
    *left = own;
    return FSDP_OK;
}

/* Pre-order over m's subtree, skipping other units: the unit's parameters. */
static fsdp_status collect(fsdp_ctx *ctx, const chooser *c, unit *u, fsdp_module *m, bool count) {
    if (m != u->module && is_unit_module(c, m)) return FSDP_OK;
    for (int i = 0; i < m->n_params; i++) {
        if (!count) {
            u->params[u->n_params] = m->params[i];
            u->offsets[u->n_params] = u->numel;
        }
        u->n_params++;
        u->numel += fsdp_tensor_numel(m->params[i]->data);
    }
    for (int i = 0; i < m->n_children; i++) FSDP_TRY(collect(ctx, c, u, m->children[i], count));
    return FSDP_OK;
}

/* ---- building a unit ---- */

static void unit_free(unit *u) {
    if (!u) return;
    fsdp_tensor_free(u->full);
    fsdp_tensor_free(u->full_grad);
    fsdp_tensor_free(u->reduced);
    free(u->params);
    free(u->offsets);
    free(u->path);
    free(u);
}

/* Flattens the unit's parameters into its full buffer, points them (and their gradients) into
 * it, and makes the shard parameter. */
static fsdp_status unit_build(fsdp_ctx *ctx, fsdp_sharded *sh, const chooser *c, fsdp_module *m,
                              unit **out) {
    unit *u = calloc(1, sizeof *u);
    if (!u) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an FSDP unit");
    u->owner = sh;
    u->module = m;
    u->is_root = m == sh->root;
    const char *rel = m->fqn + strlen(sh->root->fqn) + (sh->root->fqn[0] && !u->is_root ? 1 : 0);
    u->path = strdup(rel);
    fsdp_status st = u->path ? collect(ctx, c, u, m, true) : FSDP_ERR_OUT_OF_MEMORY;
    int n = u->n_params;
    u->params = calloc((size_t)n + 1, sizeof *u->params);
    u->offsets = calloc((size_t)n + 1, sizeof *u->offsets);
    if (st != FSDP_OK || !u->params || !u->offsets) {
        unit_free(u);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an FSDP unit");
    }
    u->n_params = 0;
    u->numel = 0;
    collect(ctx, c, u, m, false);
    int64_t W = sh->world;
    u->shard_numel = sharded_strategy(sh) ? (u->numel + W - 1) / W : u->numel;
    int64_t padded = sharded_strategy(sh) ? u->shard_numel * W : u->numel;
    st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &padded, &u->full);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &padded, &u->full_grad);
    if (st == FSDP_OK && sharded_strategy(sh))
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, &u->shard_numel, &u->reduced);
    for (int i = 0; st == FSDP_OK && i < u->n_params; i++) {
        fsdp_param *p = u->params[i];
        if (fsdp_tensor_dtype(p->data) != FSDP_DTYPE_F32) {
            st = FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "FSDP flattens f32 parameters; '%s' of '%s' is %s",
                           p->name, p->module->fqn,
                           fsdp_dtype_to_string(fsdp_tensor_dtype(p->data)));
            break;
        }
        memcpy(fsdp_tensor_f32(u->full) + u->offsets[i], fsdp_tensor_f32(p->data),
               fsdp_tensor_nbytes(p->data));
        memcpy(fsdp_tensor_f32(u->full_grad) + u->offsets[i], fsdp_tensor_f32(p->grad),
               fsdp_tensor_nbytes(p->grad));
        st = fsdp_tensor_rebind(ctx, p->data, u->full, u->offsets[i]);
        if (st == FSDP_OK) st = fsdp_tensor_rebind(ctx, p->grad, u->full_grad, u->offsets[i]);
    }
    if (st != FSDP_OK) {
        unit_free(u);
        return st;
    }
    u->unsharded = true;
    *out = u;
    return FSDP_OK;
}

/* The optimizer's view of the unit: a parameter of S elements holding this rank's chunk of
 * the flat buffer (NO_SHARD: the whole buffer itself). */
static fsdp_status unit_flat_param(fsdp_ctx *ctx, fsdp_sharded *sh, unit *u) {
    char name[256];
    size_t len = 0;
    for (const char *s = u->path; *s && len + 12 < sizeof name; s++)
        name[len++] = *s == '.' ? '_' : *s;
    snprintf(name + len, sizeof name - len, "%s_flat_param", len ? "_" : "");
    FSDP_TRY(fsdp_module_add_param(ctx, sh->flat_params, name, 1, &u->shard_numel,
                                   (fsdp_init){.kind = FSDP_INIT_ZEROS}, &u->flat));
    if (!sharded_strategy(sh)) return fsdp_tensor_rebind(ctx, u->flat->data, u->full, 0);
    memcpy(fsdp_tensor_f32(u->flat->data),
           fsdp_tensor_f32(u->full) + (int64_t)sh->rank * u->shard_numel,
           (size_t)u->shard_numel * sizeof(float));
    return FSDP_OK;
}

static fsdp_status flat_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out) {
    (void)m, (void)in, (void)out;
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "the FSDP flat-parameter module only holds parameters for an optimizer; "
                     "run the model itself");
}

static fsdp_status flat_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    (void)dout, (void)din;
    return flat_forward(ctx, m, NULL, NULL);
}

static const fsdp_module_ops flat_ops = {
    .kind = "FlatParams", .forward = flat_forward, .backward = flat_backward};

fsdp_status fsdp_fully_shard(fsdp_ctx *ctx, fsdp_module *root, const fsdp_fully_shard_options *opts,
                             fsdp_sharded **out) {
    if (!root || !out)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_fully_shard: NULL argument");
    *out = NULL;
    fsdp_fully_shard_options o = opts ? *opts : (fsdp_fully_shard_options){0};
    if ((int)o.strategy < 0 || o.strategy >= FSDP_SHARDING_STRATEGY_COUNT)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_fully_shard: unknown strategy %d; use FSDP_FULL_SHARD, "
                         "FSDP_SHARD_GRAD_OP or FSDP_NO_SHARD",
                         (int)o.strategy);
    if (o.strategy == FSDP_HYBRID_SHARD)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "fsdp_fully_shard: HYBRID_SHARD is not written yet; use FULL_SHARD over "
                         "the whole data-parallel group");
    fsdp_group *group = o.group ? o.group : fsdp_ctx_world_group(ctx);
    if (!group)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "fsdp_fully_shard: the context is not bound to a world; call it inside "
                         "fsdp_world_run");
    for (int i = 0; i < root->n_hooks[FSDP_HOOK_PRE_FORWARD]; i++)
        if (root->hooks[FSDP_HOOK_PRE_FORWARD][i].fn == pre_forward)
            return FSDP_FAIL(ctx, FSDP_ERR_STATE, "fsdp_fully_shard: the model is already wrapped");
    fsdp_sharded *sh = calloc(1, sizeof *sh);
    if (!sh) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate FSDP state");
    sh->opts = o;
    sh->group = group;
    sh->world = fsdp_group_size(group);
    sh->rank = fsdp_group_rank(group);
    sh->root = root;
    sh->sync = true;
    /* REFERENCE.md section 4: pre doubles while D % pre == 0 and D / pre > pre. */
    int pre = 1;
    while (sh->world % (pre * 2) == 0 && sh->world / pre > pre) pre *= 2;
    sh->pre_factor = pre;
    sh->post_factor = (double)sh->world / pre;
    chooser c = {.sh = sh};
    int64_t left;
    fsdp_status st = choose(ctx, &c, root, &left);
    if (st == FSDP_OK) st = fsdp_module_create(ctx, &flat_ops, NULL, &sh->flat_params);
    int n_units = c.n_picked + 1;
    if (st == FSDP_OK) {
        sh->units = calloc((size_t)n_units, sizeof *sh->units);
        if (!sh->units) st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate FSDP units");
    }
    /* Units in pre-order: the root, then nested units as the tree visits them (picked is
     * post-order; order them by walking the tree). */
    fsdp_module **order = calloc((size_t)n_units, sizeof *order);
    int n_order = 0;
    if (st == FSDP_OK && !order) st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot order units");
    if (st == FSDP_OK) {
        order[n_order++] = root;
        /* An explicit stack walk in pre-order. */
        fsdp_module **stack = calloc(1024, sizeof *stack);
        int top = 0;
        if (!stack) st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot order units");
        for (int i = root->n_children - 1; st == FSDP_OK && i >= 0 && top < 1024; i--)
            stack[top++] = root->children[i];
        while (st == FSDP_OK && top > 0) {
            fsdp_module *m = stack[--top];
            if (is_unit_module(&c, m)) order[n_order++] = m;
            for (int i = m->n_children - 1; i >= 0; i--) {
                if (top == 1024) {
                    st = FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED, "model tree too wide or deep");
                    break;
                }
                stack[top++] = m->children[i];
            }
        }
        free(stack);
    }
    for (int i = 0; st == FSDP_OK && i < n_order; i++) {
        st = unit_build(ctx, sh, &c, order[i], &sh->units[i]);
        if (st == FSDP_OK) sh->n_units++;
        if (st == FSDP_OK) st = unit_flat_param(ctx, sh, sh->units[i]);
    }
    free(order);
    free(c.picked);
    static const fsdp_hook_fn fns[4] = {pre_forward, post_forward, pre_backward, post_backward};
    for (int i = 0; st == FSDP_OK && i < sh->n_units; i++) {
        unit *u = sh->units[i];
        for (int h = 0; h < 4; h++) u->hook_ids[h] = -1;
        for (int h = 0; st == FSDP_OK && h < 4; h++) {
            /* Pre-hooks run before TP's (parameters first), post-hooks after them. */
            bool front = h == FSDP_HOOK_PRE_FORWARD || h == FSDP_HOOK_PRE_BACKWARD;
            st = front ? fsdp_nn_add_hook_front(ctx, u->module, (fsdp_hook_point)h, fns[h], u, NULL,
                                                &u->hook_ids[h])
                       : fsdp_module_add_hook(ctx, u->module, (fsdp_hook_point)h, fns[h], u, NULL,
                                              &u->hook_ids[h]);
        }
    }
    if (st == FSDP_OK) {
        sh->summon_was_unsharded = calloc((size_t)sh->n_units + 1, sizeof(bool));
        if (!sh->summon_was_unsharded) st = FSDP_ERR_OUT_OF_MEMORY;
    }
    if (st != FSDP_OK) {
        fsdp_sharded_free(sh);
        return st;
    }
    /* Start sharded, as after a step. */
    for (int i = 0; i < sh->n_units; i++) reshard(sh->units[i]);
    *out = sh;
    return FSDP_OK;
}

void fsdp_sharded_free(fsdp_sharded *sh) {
    if (!sh) return;
    for (int i = 0; i < sh->n_units; i++) {
        unit *u = sh->units[i];
        for (int h = 0; h < 4; h++)
            if (u->hook_ids[h] > 0) fsdp_module_remove_hook(NULL, u->module, u->hook_ids[h]);
        /* The parameters keep their last values in storage of their own. */
        for (int p = 0; p < u->n_params; p++) {
            fsdp_tensor *data = u->params[p]->data, *grad = u->params[p]->grad, *d2, *g2;
            if (fsdp_tensor_create_like(NULL, data, &d2) == FSDP_OK) {
                fsdp_tensor_copy(NULL, d2, data);
                fsdp_tensor_rebind(NULL, data, d2, 0);
                fsdp_tensor_free(d2);
            }
            if (fsdp_tensor_create_like(NULL, grad, &g2) == FSDP_OK) {
                fsdp_tensor_copy(NULL, g2, grad);
                fsdp_tensor_rebind(NULL, grad, g2, 0);
                fsdp_tensor_free(g2);
            }
        }
        unit_free(u);
    }
    free(sh->units);
    free(sh->summon_was_unsharded);
    fsdp_module_free(sh->flat_params);
    free(sh);
}

fsdp_module *fsdp_sharded_flat_params(const fsdp_sharded *sh) {
    return sh->flat_params;
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
void fsdp_sharded_set_sync(fsdp_sharded *sh, bool sync) {
    sh->sync = sync;
}

fsdp_status fsdp_summon_full_params(fsdp_ctx *ctx, fsdp_sharded *sh,
                                    const fsdp_summon_options *opts) {
    sh->summon = opts ? *opts : (fsdp_summon_options){.writeback = true};
    if (ctx->phase != FSDP_PHASE_NONE)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "summon_full_params inside %s: call it between steps, outside the "
                         "model's forward and backward",
                         ctx->phase == FSDP_PHASE_FORWARD ? "forward" : "backward");
    if (sh->summoned) return FSDP_FAIL(ctx, FSDP_ERR_STATE, "summon_full_params is already active");
    for (int i = 0; i < sh->n_units; i++) {
        sh->summon_was_unsharded[i] = sh->units[i]->unsharded;
        FSDP_TRY(unshard(ctx, sh->units[i]));
    }
    sh->summoned = true;
    return FSDP_OK;
}

fsdp_status fsdp_release_full_params(fsdp_ctx *ctx, fsdp_sharded *sh) {
    bool writeback = sh->summon.writeback;
    if (!sh->summoned)
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "release_full_params without summon_full_params first");
    for (int i = 0; i < sh->n_units; i++) {
        unit *u = sh->units[i];
        if (writeback && sharded_strategy(sh))
            memcpy(fsdp_tensor_f32(u->flat->data),
                   fsdp_tensor_f32(u->full) + (int64_t)sh->rank * u->shard_numel,
                   (size_t)u->shard_numel * sizeof(float));
        if (!sh->summon_was_unsharded[i]) reshard(u);
    }
    sh->summoned = false;
    return FSDP_OK;
}
