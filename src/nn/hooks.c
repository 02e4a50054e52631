/* hooks.c: a module's hooks (acting hooks and observers: fsdp_module_add_hook,
 * fsdp_module_add_observer) and the forward and backward wrappers that run them and keep the
 * context's module scope and phase. */
#include <string.h>

#include "core/array.h"
#include "core/ctx_impl.h"
#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_device_same
#include "nn/module_impl.h"
#include "nn/nn.h"

/* Adds a hook (an observer when observer) for fsdp_module_add_hook / _add_observer (`what`). */
static fsdp_status add_hook(fsdp_ctx *ctx, const char *what, fsdp_module *m, fsdp_hook_point point,
                            fsdp_hook_fn fn, void *user, void (*free_user)(void *), int *id,
                            bool observer) {
    if ((int)point < 0 || point >= FSDP_HOOK_POINT_COUNT) {
        if (free_user) free_user(user);
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: hook point %d or function invalid",
                         what, (int)point);
    }
    if (!fsdp_array_reserve((void **)&m->hooks[point], &m->cap_hooks[point], m->n_hooks[point] + 1,
                            sizeof(fsdp_hook))) {
        if (free_user) free_user(user);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot add a hook");
    }
    int hook_id = ++m->next_hook_id;
    m->hooks[point][m->n_hooks[point]++] = (fsdp_hook){
        .id = hook_id, .fn = fn, .user = user, .free_user = free_user, .observer = observer};
    if (id) *id = hook_id;
    return FSDP_OK;
}

fsdp_status fsdp_module_add_hook(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                 fsdp_hook_fn fn, void *user, void (*free_user)(void *), int *id) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, fn);
    return add_hook(ctx, __func__, m, point, fn, user, free_user, id, false);
}

fsdp_status fsdp_module_add_observer(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                     fsdp_hook_fn fn, void *user, void (*free_user)(void *),
                                     int *id) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, fn);
    return add_hook(ctx, __func__, m, point, fn, user, free_user, id, true);
}

fsdp_status fsdp_nn_add_hook_front(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                                   fsdp_hook_fn fn, void *user, void (*free_user)(void *),
                                   int *id) {
    FSDP_TRY_AT(ctx, fsdp_module_add_hook(ctx, m, point, fn, user, free_user, id));
    fsdp_hook *h = m->hooks[point];
    fsdp_hook added = h[m->n_hooks[point] - 1];
    memmove(&h[1], &h[0], (size_t)(m->n_hooks[point] - 1) * sizeof *h);
    h[0] = added;
    return FSDP_OK;
}

bool fsdp_nn_remove_hook(fsdp_module *m, int id) {
    for (int p = 0; p < FSDP_HOOK_POINT_COUNT; p++) {
        for (int i = 0; i < m->n_hooks[p]; i++) {
            if (m->hooks[p][i].id != id) continue;
            if (m->hooks[p][i].free_user) m->hooks[p][i].free_user(m->hooks[p][i].user);
            memmove(&m->hooks[p][i], &m->hooks[p][i + 1],
                    (size_t)(m->n_hooks[p] - i - 1) * sizeof(fsdp_hook));
            m->n_hooks[p]--;
            return true;
        }
    }
    return false;
}

fsdp_status fsdp_module_remove_hook(fsdp_ctx *ctx, fsdp_module *m, int id) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    if (fsdp_nn_remove_hook(m, id)) return FSDP_OK;
    char desc[160];
    return FSDP_FAIL(ctx, FSDP_ERR_NOT_FOUND, "no hook with id %d on %s", id,
                     fsdp_nn_describe(m, desc, sizeof desc));
}

bool fsdp_nn_has_hook(const fsdp_module *m, fsdp_hook_point point, fsdp_hook_fn fn) {
    if ((int)point < 0 || point >= FSDP_HOOK_POINT_COUNT) return false;
    for (int i = 0; i < m->n_hooks[point]; i++)
        if (m->hooks[point][i].fn == fn) return true;
    return false;
}

void *fsdp_nn_hook_user(const fsdp_module *m, fsdp_hook_point point, fsdp_hook_fn fn) {
    if (!m || (int)point < 0 || point >= FSDP_HOOK_POINT_COUNT) return NULL;
    for (int i = 0; i < m->n_hooks[point]; i++)
        if (m->hooks[point][i].fn == fn) return m->hooks[point][i].user;
    return NULL;
}

int fsdp_nn_num_acting_hooks(const fsdp_module *m, fsdp_hook_point point) {
    int n = 0;
    for (int i = 0; i < m->n_hooks[point]; i++) n += !m->hooks[point][i].observer;
    return n;
}

int fsdp_nn_num_hooks_other_than(const fsdp_module *m, fsdp_hook_point point, fsdp_hook_fn fn) {
    if ((int)point < 0 || point >= FSDP_HOOK_POINT_COUNT) return 0;
    int n = 0;
    for (int i = 0; i < m->n_hooks[point]; i++) n += m->hooks[point][i].fn != fn;
    return n;
}

static fsdp_status run_hooks(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                             const fsdp_tensor **io) {
    for (int i = 0; i < m->n_hooks[point]; i++) {
        const fsdp_hook *h = &m->hooks[point][i];
        const fsdp_tensor *seen = *io; /* an observer's replacement is dropped */
        FSDP_TRY_AT(ctx, h->fn(ctx, m, point, h->observer ? &seen : io, h->user));
    }
    return FSDP_OK;
}

fsdp_status fsdp_nn_check_device(fsdp_ctx *ctx, const fsdp_module *m, const char *style,
                                 const fsdp_param *p, const fsdp_tensor *t, const char *what) {
    fsdp_device a = fsdp_tensor_device(t), b = fsdp_tensor_device(p->data);
    if (fsdp_device_same(a, b)) return FSDP_OK;
    char desc[160];
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                     "%s%s%s: the %s is on %s:%d and the parameters on %s:%d; copy the %s to the "
                     "model's device (fsdp_tensor_copy) first",
                     style ? style : "", style ? " on " : "",
                     fsdp_nn_describe(m, desc, sizeof desc), what, fsdp_device_to_string(a),
                     a.index, fsdp_device_to_string(b), b.index, what);
}

/* t (the input, or the output gradient) where m's own parameters are once its hooks bound them
 * (FSDP's gathers, TP's local shards): a layer would otherwise hand one device's kernels the
 * other's memory (a GPU faults on it; sim ends the process). Modules without parameters of
 * their own pass it on to their children. */
static fsdp_status check_device(fsdp_ctx *ctx, const fsdp_module *m, const fsdp_tensor *t,
                                const char *what) {
    if (m->n_params == 0 || !t) return FSDP_OK;
    return fsdp_nn_check_device(ctx, m, NULL, m->params[0], t, what);
}

fsdp_status fsdp_nn_run_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out, bool post_hooks) {
    fsdp_phase outer = ctx->phase;
    void *outer_module = ctx->running_module;
    /* A checkpoint's recompute runs inside backward and is counted there. */
    ctx->phase = ctx->recompute_depth > 0 ? FSDP_PHASE_BACKWARD : FSDP_PHASE_FORWARD;
    fsdp_ctx_scope_push(ctx, m->fqn);
    const fsdp_tensor *x = in, *y = NULL;
    fsdp_status st = run_hooks(ctx, m, FSDP_HOOK_PRE_FORWARD, &x);
    if (st == FSDP_OK) st = check_device(ctx, m, x, "input");
    ctx->running_module = m;
    if (st == FSDP_OK) st = m->ops->forward(ctx, m, x, &y);
    ctx->running_module = outer_module;
    if (st == FSDP_OK && post_hooks) st = run_hooks(ctx, m, FSDP_HOOK_POST_FORWARD, &y);
    fsdp_ctx_scope_pop(ctx);
    ctx->phase = outer;
    if (st == FSDP_OK) *out = y;
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_module_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, in);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (m->ckpt.iface) return m->ckpt.iface->forward(ctx, m, in, out);
    return fsdp_nn_run_forward(ctx, m, in, out, true);
}

fsdp_status fsdp_nn_run_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    fsdp_phase outer = ctx->phase;
    ctx->phase = FSDP_PHASE_BACKWARD;
    fsdp_ctx_scope_push(ctx, m->fqn);
    const fsdp_tensor *dy = dout, *dx = NULL;
    fsdp_status st = run_hooks(ctx, m, FSDP_HOOK_PRE_BACKWARD, &dy);
    if (st == FSDP_OK) st = check_device(ctx, m, dy, "output gradient");
    if (st == FSDP_OK) st = m->ops->backward(ctx, m, dy, din ? &dx : NULL);
    if (st == FSDP_OK) st = run_hooks(ctx, m, FSDP_HOOK_POST_BACKWARD, &dx);
    fsdp_ctx_scope_pop(ctx);
    ctx->phase = outer;
    if (st == FSDP_OK && din) *din = dx;
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_module_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    FSDP_ARG_NOT_NULL(ctx, dout);
    if (m->ckpt.iface) return m->ckpt.iface->backward(ctx, m, dout, din);
    return fsdp_nn_run_backward(ctx, m, dout, din);
}
