/* module.c: the module tree: names, children, parameters, buffers, and helpers for layers (the
 * hooks and the forward and backward wrappers that run them are in hooks.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/ctx_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "nn/module_impl.h"

static char *dup_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

fsdp_status fsdp_module_create(fsdp_ctx *ctx, const fsdp_module_ops *ops, void *impl,
                               fsdp_module **out) {
    /* impl is the module's from the call on: a refused call releases it too. */
    if ((!ctx || !out) && ops && ops->free_impl) ops->free_impl(impl);
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ops);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (!ops->forward || !ops->backward || !ops->kind) {
        if (ops->free_impl) ops->free_impl(impl);
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_module_create: ops needs kind, forward and backward");
    }
    fsdp_module *m = calloc(1, sizeof *m);
    if (m) {
        m->name = dup_string("");
        m->fqn = dup_string("");
    }
    if (!m || !m->name || !m->fqn) {
        if (m) {
            free(m->name);
            free(m->fqn);
        }
        free(m);
        if (ops->free_impl) ops->free_impl(impl);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a %s module", ops->kind);
    }
    m->ops = ops;
    m->impl = impl;
    *out = m;
    return FSDP_OK;
}

static void param_free(fsdp_param *p) {
    if (!p) return;
    if (p->free_dist) p->free_dist(p->dist);
    fsdp_tensor_free(p->data);
    fsdp_tensor_free(p->grad);
    fsdp_tensor_free(p->mirror);
    free(p->name);
    free(p);
}

void fsdp_module_free(fsdp_module *m) {
    if (!m) return;
    for (int i = 0; i < m->n_children; i++) fsdp_module_free(m->children[i]);
    for (int i = 0; i < m->n_params; i++) param_free(m->params[i]);
    for (int i = 0; i < m->n_buffers; i++) {
        fsdp_tensor_free(m->buffers[i].data);
        free(m->buffers[i].name);
    }
    for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++) {
        for (int i = 0; i < m->n_hooks[p]; i++)
            if (m->hooks[p][i].free_user) m->hooks[p][i].free_user(m->hooks[p][i].user);
        free(m->hooks[p]);
    }
    if (m->ops->free_impl) m->ops->free_impl(m->impl);
    if (m->ckpt.iface) m->ckpt.iface->release(m);
    free(m->acts);
    free(m->children);
    free(m->params);
    free(m->buffers);
    free(m->name);
    free(m->fqn);
    free(m);
}

void *fsdp_module_impl(const fsdp_module *m) {
    return m->impl;
}
const fsdp_module_ops *fsdp_nn_module_ops(const fsdp_module *m) {
    return m->ops;
}
const char *fsdp_module_kind(const fsdp_module *m) {
    return m->ops->kind;
}
const char *fsdp_module_name(const fsdp_module *m) {
    return m->name;
}
const char *fsdp_module_fqn(const fsdp_module *m) {
    return m->fqn;
}
fsdp_module *fsdp_module_parent(const fsdp_module *m) {
    return m->parent;
}
int fsdp_module_num_children(const fsdp_module *m) {
    return m->n_children;
}
fsdp_module *fsdp_module_child(const fsdp_module *m, int i) {
    return i >= 0 && i < m->n_children ? m->children[i] : NULL;
}

fsdp_status fsdp_nn_set_input_readers(fsdp_ctx *ctx, fsdp_module *m, fsdp_module *const *readers,
                                      int n) {
    char desc[160];
    if (n < 0 || n > FSDP_NN_MAX_INPUT_READERS || (n > 0 && !readers))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: %d input readers; a module declares 0 to %d",
                         fsdp_nn_describe(m, desc, sizeof desc), n, FSDP_NN_MAX_INPUT_READERS);
    for (int i = 0; i < n; i++) {
        bool twice = false;
        for (int j = 0; j < i; j++) twice = twice || readers[j] == readers[i];
        if (!readers[i] || readers[i]->parent != m || twice)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "%s: input reader %d is %s; the readers are distinct children of "
                             "the module",
                             fsdp_nn_describe(m, desc, sizeof desc), i,
                             !readers[i] ? "NULL"
                             : twice     ? "named twice"
                                         : "not its child");
    }
    for (int i = 0; i < n; i++) m->input_readers[i] = readers[i];
    m->n_input_readers = n;
    return FSDP_OK;
}

int fsdp_nn_input_readers(const fsdp_module *m, fsdp_module *const **readers) {
    if (readers) *readers = m && m->n_input_readers ? m->input_readers : NULL;
    return m ? m->n_input_readers : 0;
}

const char *fsdp_nn_describe(const fsdp_module *m, char *buf, size_t size) {
    if (m->fqn[0])
        snprintf(buf, size, "%s '%s'", m->ops->kind, m->fqn);
    else
        snprintf(buf, size, "%s (root)", m->ops->kind);
    return buf;
}

/* Recomputes the fully qualified names of m's subtree after m got a parent. */
static fsdp_status update_fqn(fsdp_ctx *ctx, fsdp_module *m) {
    const char *pfqn = m->parent ? m->parent->fqn : "";
    size_t n = strlen(pfqn) + strlen(m->name) + 2;
    char *fqn = malloc(n);
    if (!fqn) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a module name");
    snprintf(fqn, n, "%s%s%s", pfqn, pfqn[0] ? "." : "", m->name);
    free(m->fqn);
    m->fqn = fqn;
    for (int i = 0; i < m->n_children; i++) FSDP_TRY_AT(ctx, update_fqn(ctx, m->children[i]));
    return FSDP_OK;
}

static bool valid_name(const char *name) {
    if (!name || !name[0]) return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_'))
            return false;
    return true;
}

/* Whether `name` is taken among m's children, parameters and buffers. */
static bool name_taken(const fsdp_module *m, const char *name) {
    for (int i = 0; i < m->n_children; i++)
        if (strcmp(m->children[i]->name, name) == 0) return true;
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i]->name, name) == 0) return true;
    for (int i = 0; i < m->n_buffers; i++)
        if (strcmp(m->buffers[i].name, name) == 0) return true;
    return false;
}

static fsdp_status check_new_name(fsdp_ctx *ctx, const fsdp_module *m, const char *name,
                                  const char *what) {
    char desc[160];
    if (!valid_name(name))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s name '%s' under %s: use letters, digits and '_' only", what,
                         name ? name : "(null)", fsdp_nn_describe(m, desc, sizeof desc));
    if (name_taken(m, name))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s name '%s' is already taken in %s; names must be unique", what, name,
                         fsdp_nn_describe(m, desc, sizeof desc));
    return FSDP_OK;
}

/* Whether a is m or one of m's ancestors: adding a under m would close a cycle. */
static bool is_self_or_ancestor(const fsdp_module *a, const fsdp_module *m) {
    for (; m; m = m->parent)
        if (m == a) return true;
    return false;
}

/* A refused child is freed (m owned it from the call on), unless it belongs to a tree already:
 * it has a parent, or it is m or an ancestor of m. */
static void free_refused_child(const fsdp_module *m, fsdp_module *child) {
    if (!child->parent && !is_self_or_ancestor(child, m)) fsdp_module_free(child);
}

fsdp_status fsdp_module_add_child(fsdp_ctx *ctx, fsdp_module *m, const char *name,
                                  fsdp_module *child) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, name);
    FSDP_ARG_NOT_NULL(ctx, child);
    fsdp_status st = FSDP_OK;
    char desc[160], where[160];
    if (is_self_or_ancestor(child, m))
        st = FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                       "fsdp_module_add_child: %s is %s %s: a module cannot be its own "
                       "descendant (the tree would have a cycle)",
                       fsdp_nn_describe(child, desc, sizeof desc),
                       child == m ? "the parent" : "an ancestor of the parent",
                       fsdp_nn_describe(m, where, sizeof where));
    else if (child->parent)
        st = FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                       "fsdp_module_add_child: module '%s' already has a parent", child->fqn);
    if (st == FSDP_OK) st = check_new_name(ctx, m, name, "child");
    char *copy = st == FSDP_OK ? dup_string(name) : NULL;
    if (st == FSDP_OK && (!copy || !fsdp_array_reserve((void **)&m->children, &m->cap_children,
                                                       m->n_children + 1, sizeof *m->children)))
        st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot add child '%s'", name);
    if (st != FSDP_OK) {
        free(copy);
        free_refused_child(m, child);
        return FSDP_PASS(ctx, st);
    }
    free(child->name);
    child->name = copy;
    child->parent = m;
    m->children[m->n_children++] = child;
    return update_fqn(ctx, child);
}

fsdp_module *fsdp_module_find(const fsdp_module *m, const char *path) {
    const fsdp_module *cur = m;
    const char *seg = path;
    while (cur && *seg) {
        const char *dot = strchr(seg, '.');
        size_t len = dot ? (size_t)(dot - seg) : strlen(seg);
        const fsdp_module *next = NULL;
        for (int i = 0; i < cur->n_children && !next; i++)
            if (strlen(cur->children[i]->name) == len &&
                strncmp(cur->children[i]->name, seg, len) == 0)
                next = cur->children[i];
        cur = next;
        seg = dot ? dot + 1 : seg + len;
    }
    return (fsdp_module *)cur;
}

fsdp_param *fsdp_module_get_param(const fsdp_module *m, const char *path) {
    const char *dot = strrchr(path, '.');
    const fsdp_module *owner = m;
    if (dot) {
        size_t len = (size_t)(dot - path);
        char prefix[512];
        if (len >= sizeof prefix) return NULL;
        memcpy(prefix, path, len);
        prefix[len] = '\0';
        owner = fsdp_module_find(m, prefix);
    }
    const char *leaf = dot ? dot + 1 : path;
    for (int i = 0; owner && i < owner->n_params; i++)
        if (strcmp(owner->params[i]->name, leaf) == 0) return owner->params[i];
    return NULL;
}

/* The fully qualified name of a parameter or buffer of m: "net1.weight". */
static void member_fqn(const fsdp_module *m, const char *name, char *buf, size_t size) {
    snprintf(buf, size, "%s%s%s", m->fqn, m->fqn[0] ? "." : "", name);
}

fsdp_status fsdp_module_add_param(fsdp_ctx *ctx, fsdp_module *m, const char *name, int ndim,
                                  const int64_t *shape, fsdp_init init, fsdp_param **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, name);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    FSDP_TRY_AT(ctx, check_new_name(ctx, m, name, "parameter"));
    fsdp_param *p = calloc(1, sizeof *p);
    if (!p || !(p->name = dup_string(name)) ||
        !fsdp_array_reserve((void **)&m->params, &m->cap_params, m->n_params + 1,
                            sizeof *m->params)) {
        param_free(p);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot add parameter '%s'", name);
    }
    p->module = m;
    p->requires_grad = true;
    p->init = init;
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, ndim, shape, &p->data);
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, ndim, shape, &p->grad);
    char fqn[512];
    member_fqn(m, name, fqn, sizeof fqn);
    if (st == FSDP_OK && !ctx->defer_param_init)
        st = fsdp_init_tensor(ctx, p->data, &init, ctx->seed, fsdp_rng_stream(fqn));
    if (st != FSDP_OK) {
        param_free(p);
        return FSDP_PASS(ctx, st);
    }
    m->params[m->n_params++] = p;
    if (out) *out = p;
    return FSDP_OK;
}

fsdp_status fsdp_module_add_buffer(fsdp_ctx *ctx, fsdp_module *m, const char *name, int ndim,
                                   const int64_t *shape, fsdp_init init, fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, name);
    if (ndim > 0) FSDP_ARG_NOT_NULL(ctx, shape);
    FSDP_TRY_AT(ctx, check_new_name(ctx, m, name, "buffer"));
    fsdp_buffer b = {.name = dup_string(name), .init = init};
    if (!b.name || !fsdp_array_reserve((void **)&m->buffers, &m->cap_buffers, m->n_buffers + 1,
                                       sizeof *m->buffers)) {
        free(b.name);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot add buffer '%s'", name);
    }
    char fqn[512];
    member_fqn(m, name, fqn, sizeof fqn);
    fsdp_status st = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, ndim, shape, &b.data);
    if (st == FSDP_OK && !ctx->defer_param_init)
        st = fsdp_init_tensor(ctx, b.data, &init, ctx->seed, fsdp_rng_stream(fqn));
    if (st != FSDP_OK) {
        fsdp_tensor_free(b.data);
        free(b.name);
        return FSDP_PASS(ctx, st);
    }
    m->buffers[m->n_buffers++] = b;
    if (out) *out = b.data;
    return FSDP_OK;
}

int fsdp_module_num_params(const fsdp_module *m) {
    return m->n_params;
}
fsdp_param *fsdp_module_param(const fsdp_module *m, int i) {
    return i >= 0 && i < m->n_params ? m->params[i] : NULL;
}
int fsdp_module_num_buffers(const fsdp_module *m) {
    return m->n_buffers;
}
fsdp_tensor *fsdp_module_buffer(const fsdp_module *m, int i) {
    return i >= 0 && i < m->n_buffers ? m->buffers[i].data : NULL;
}
const char *fsdp_module_buffer_name(const fsdp_module *m, int i) {
    return i >= 0 && i < m->n_buffers ? m->buffers[i].name : NULL;
}

const char *fsdp_param_name(const fsdp_param *p) {
    return p->name;
}
fsdp_module *fsdp_param_module(const fsdp_param *p) {
    return p->module;
}
fsdp_tensor *fsdp_param_data(const fsdp_param *p) {
    return p->data;
}
fsdp_tensor *fsdp_param_grad(const fsdp_param *p) {
    return p->grad;
}
bool fsdp_param_requires_grad(const fsdp_param *p) {
    return p->requires_grad;
}
void fsdp_param_set_requires_grad(fsdp_param *p, bool requires_grad) {
    p->requires_grad = requires_grad;
}
const fsdp_init *fsdp_param_init(const fsdp_param *p) {
    return &p->init;
}

fsdp_status fsdp_module_visit(fsdp_ctx *ctx, fsdp_module *m, fsdp_module_visit_fn fn, void *user) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, fn);
    FSDP_TRY_AT(ctx, fn(ctx, m, user));
    for (int i = 0; i < m->n_children; i++)
        FSDP_TRY_AT(ctx, fsdp_module_visit(ctx, m->children[i], fn, user));
    return FSDP_OK;
}

typedef struct param_walk {
    fsdp_param_visit_fn fn;
    void *user;
    size_t root_len; /* characters of the root's fqn (plus its dot) to strip */
} param_walk;

static fsdp_status visit_module_params(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    param_walk *w = user;
    char fqn[512];
    for (int i = 0; i < m->n_params; i++) {
        member_fqn(m, m->params[i]->name, fqn, sizeof fqn);
        FSDP_TRY_AT(ctx, w->fn(ctx, m->params[i], fqn + w->root_len, w->user));
    }
    return FSDP_OK;
}

fsdp_status fsdp_module_visit_params(fsdp_ctx *ctx, fsdp_module *m, fsdp_param_visit_fn fn,
                                     void *user) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, fn);
    param_walk w = {.fn = fn, .user = user, .root_len = m->fqn[0] ? strlen(m->fqn) + 1 : 0};
    return fsdp_module_visit(ctx, m, visit_module_params, &w);
}

int64_t fsdp_module_param_count(const fsdp_module *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += fsdp_tensor_numel(m->params[i]->data);
    for (int i = 0; i < m->n_children; i++) n += fsdp_module_param_count(m->children[i]);
    return n;
}

static fsdp_status reset_module(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    uint64_t seed = *(const uint64_t *)user;
    char fqn[512];
    for (int i = 0; i < m->n_params; i++) {
        fsdp_param *p = m->params[i];
        member_fqn(m, p->name, fqn, sizeof fqn);
        FSDP_TRY_AT(ctx, fsdp_init_tensor(ctx, p->data, &p->init, seed, fsdp_rng_stream(fqn)));
    }
    for (int i = 0; i < m->n_buffers; i++) {
        member_fqn(m, m->buffers[i].name, fqn, sizeof fqn);
        FSDP_TRY_AT(ctx, fsdp_init_tensor(ctx, m->buffers[i].data, &m->buffers[i].init, seed,
                                          fsdp_rng_stream(fqn)));
    }
    return FSDP_OK;
}

bool fsdp_nn_defer_init(fsdp_ctx *ctx, bool on) {
    bool was = ctx->defer_param_init;
    ctx->defer_param_init = on;
    return was;
}

fsdp_status fsdp_module_reset_parameters(fsdp_ctx *ctx, fsdp_module *m, uint64_t seed) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    return fsdp_module_visit(ctx, m, reset_module, &seed);
}

static fsdp_status zero_module_grads(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    (void)user;
    /* A gradient without storage (an FSDP unit's, while sharded) holds nothing to zero. */
    for (int i = 0; i < m->n_params; i++)
        if (fsdp_tensor_has_storage(m->params[i]->grad))
            FSDP_TRY_AT(ctx, fsdp_tensor_fill(ctx, m->params[i]->grad, 0.0f));
    return FSDP_OK;
}

fsdp_status fsdp_module_zero_grad(fsdp_ctx *ctx, fsdp_module *m) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    /* A wrapper (FSDP) keeps these gradients in its shards: zeroing the model would leave the
     * ones the optimizer steps untouched. Refused before anything is zeroed. */
    FSDP_TRY_AT(ctx, fsdp_nn_check_unmanaged(ctx, m, "fsdp_module_zero_grad"));
    return fsdp_module_visit(ctx, m, zero_module_grads, NULL);
}

/* ---- what the layers above nn may do (nn/nn.h) ---- */

void *fsdp_nn_param_dist(const fsdp_param *p) {
    return p->dist;
}

void fsdp_nn_param_replace(fsdp_param *p, fsdp_tensor *data, fsdp_tensor *grad, void *dist,
                           void (*free_dist)(void *)) {
    if (p->free_dist && p->dist != dist) p->free_dist(p->dist);
    if (p->data != data) fsdp_tensor_free(p->data);
    if (p->grad != grad) fsdp_tensor_free(p->grad);
    p->data = data;
    p->grad = grad;
    p->dist = dist;
    p->free_dist = free_dist;
}

fsdp_tensor *fsdp_nn_param_swap_grad(fsdp_param *p, fsdp_tensor *g) {
    fsdp_tensor *old = p->grad;
    p->grad = g;
    return old;
}

void fsdp_nn_param_set_hook_applied(fsdp_param *p, bool on) {
    p->hook_applied = on;
}

void fsdp_nn_param_set_manager(fsdp_param *p, const char *manager) {
    p->manager = manager;
}

static fsdp_status find_managed(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    if (p->manager) {
        *(fsdp_param **)user = p;
        return FSDP_ERR_STATE; /* stops the walk; no message set */
    }
    return FSDP_OK;
}

fsdp_status fsdp_nn_check_unmanaged(fsdp_ctx *ctx, fsdp_module *m, const char *what) {
    fsdp_param *p = NULL;
    if (fsdp_module_visit_params(ctx, m, find_managed, &p) == FSDP_OK || !p) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "%s: parameter '%s' of '%s' is managed by a wrapper that keeps its values "
                     "and gradient elsewhere; %s",
                     what, p->name, p->module->fqn, p->manager);
}

/* ---- helpers for layers ---- */

fsdp_status fsdp_nn_record_activation(fsdp_ctx *ctx, fsdp_tensor *t) {
    fsdp_module *m = ctx->running_module;
    if (!m || (ctx->phase != FSDP_PHASE_FORWARD && ctx->recompute_depth == 0)) return FSDP_OK;
    for (int i = 0; i < m->n_acts; i++)
        if (m->acts[i] == t) return FSDP_OK;
    if (!fsdp_array_reserve((void **)&m->acts, &m->cap_acts, m->n_acts + 1, sizeof *m->acts))
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot record an activation");
    m->acts[m->n_acts++] = t;
    return FSDP_OK;
}

fsdp_status fsdp_nn_buffer(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_device device, int ndim,
                           const int64_t *shape) {
    return fsdp_nn_buffer_dtype(ctx, t, FSDP_DTYPE_F32, device, ndim, shape);
}

fsdp_status fsdp_nn_buffer_dtype(fsdp_ctx *ctx, fsdp_tensor **t, fsdp_dtype dtype,
                                 fsdp_device device, int ndim, const int64_t *shape) {
    if (!*t) {
        FSDP_TRY_AT(ctx, fsdp_tensor_create_uninit(ctx, dtype, device, ndim, shape, t));
    } else if (!fsdp_tensor_has_storage(*t) || !fsdp_device_same(fsdp_tensor_device(*t), device)) {
        /* Released by activation checkpointing, or on the device the module was on before
         * fsdp_module_to: new storage under the same handle. */
        fsdp_tensor *fresh;
        FSDP_TRY_AT(ctx, fsdp_tensor_create_uninit(ctx, dtype, device, ndim, shape, &fresh));
        fsdp_tensor_alias(*t, fresh);
        fsdp_tensor_free(fresh);
    } else {
        FSDP_TRY_AT(ctx, fsdp_tensor_resize_uninit(ctx, *t, ndim, shape));
    }
    return fsdp_nn_record_activation(ctx, *t);
}

fsdp_status fsdp_nn_check_input(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tensor *in,
                                int64_t features) {
    return fsdp_nn_check_input_bf16(ctx, m, in, features, false);
}

fsdp_status fsdp_nn_check_input_bf16(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tensor *in,
                                     int64_t features, bool allow_bf16) {
    char desc[160], shape[64];
    fsdp_dtype dt = fsdp_tensor_dtype(in);
    if (dt != FSDP_DTYPE_F32 && !(dt == FSDP_DTYPE_BF16 && allow_bf16))
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "%s: input is %s; layers compute on f32 tensors",
                         fsdp_nn_describe(m, desc, sizeof desc), fsdp_dtype_to_string(dt));
    if (features >= 0 && (fsdp_tensor_ndim(in) < 1 || fsdp_tensor_dim(in, -1) != features))
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s: input %s must have %lld features in its last dimension",
                         fsdp_nn_describe(m, desc, sizeof desc),
                         fsdp_tensor_shape_string(in, shape, sizeof shape), (long long)features);
    return FSDP_OK;
}
