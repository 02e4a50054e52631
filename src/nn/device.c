/* device.c: fsdp_module_to, moving a module tree's parameters, gradients and buffers to
 * another device before the model is parallelised or given hooks, and the check of the
 * parallel layers that run on CPU tensors only (fsdp_nn_check_on_cpu). */
#include "core/error.h"
#include "core/tensor_impl.h"
#include "nn/module_impl.h"
#include "nn/nn.h"

typedef struct move_args {
    fsdp_device device;
} move_args;

/* Refuses a tree that anything has attached to (hooks: TP styles, FSDP, replicate or a
 * user's; TP-distributed parameters): they hold tensors on the old device. Changes nothing. */
static fsdp_status check_movable(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    (void)user;
    char desc[160];
    for (int point = 0; point < FSDP_HOOK_POINT_COUNT; point++)
        if (m->n_hooks[point] > 0)
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "fsdp_module_to: %s has hooks (tensor parallelism, FSDP, replicate or "
                             "your own), which may hold tensors on the old device; move the model "
                             "first, then parallelise it and add hooks",
                             fsdp_nn_describe(m, desc, sizeof desc));
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->dist)
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "fsdp_module_to: parameter '%s' of %s is already tensor-parallel; "
                             "move the model to the device before parallelising it",
                             m->params[i]->name, fsdp_nn_describe(m, desc, sizeof desc));
    return FSDP_OK;
}

static bool on_device(const fsdp_tensor *t, fsdp_device d) {
    return fsdp_device_same(fsdp_tensor_device(t), d);
}

/* Whether `found` holds for m or a module under it, in fsdp_module_visit's order (stopping at
 * the first). A search records nothing on a context, where a visit stopped by a failure
 * would leave that failure behind after a call that then succeeds. */
static bool search(const fsdp_module *m, bool (*found)(const fsdp_module *m, void *user),
                   void *user) {
    if (found(m, user)) return true;
    for (int i = 0; i < m->n_children; i++)
        if (search(m->children[i], found, user)) return true;
    return false;
}

/* Some tensor of m is not on the device yet. */
static bool elsewhere(const fsdp_module *m, void *user) {
    const move_args *a = user;
    for (int i = 0; i < m->n_params; i++)
        if (!on_device(m->params[i]->data, a->device) || !on_device(m->params[i]->grad, a->device))
            return true;
    for (int i = 0; i < m->n_buffers; i++)
        if (!on_device(m->buffers[i].data, a->device)) return true;
    return false;
}

static fsdp_status move_module(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    const move_args *a = user;
    for (int i = 0; i < m->n_params; i++) {
        FSDP_TRY_AT(ctx, fsdp_tensor_move(ctx, m->params[i]->data, a->device));
        FSDP_TRY_AT(ctx, fsdp_tensor_move(ctx, m->params[i]->grad, a->device));
    }
    for (int i = 0; i < m->n_buffers; i++)
        FSDP_TRY_AT(ctx, fsdp_tensor_move(ctx, m->buffers[i].data, a->device));
    return FSDP_OK;
}

fsdp_status fsdp_module_to(fsdp_ctx *ctx, fsdp_module *m, fsdp_device device) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, m);
    move_args a = {device};
    if (!search(m, elsewhere, &a)) return FSDP_OK; /* all there */
    FSDP_TRY_AT(ctx, fsdp_nn_check_unmanaged(ctx, m, "fsdp_module_to"));
    FSDP_TRY_AT(ctx, fsdp_module_visit(ctx, m, check_movable, NULL));
    return fsdp_module_visit(ctx, m, move_module, &a);
}

/* ---- the parallel layers' check (nn/nn.h) ---- */

typedef struct cpu_check {
    const char *kind; /* "parameter", "gradient of parameter", "buffer" */
    const fsdp_module *module;
    const char *name;   /* local name in module */
    fsdp_device device; /* where it is */
} cpu_check;

static bool found_off_cpu(cpu_check *c, const fsdp_module *m, const char *kind, const char *name,
                          const fsdp_tensor *t) {
    if (!t || fsdp_tensor_device(t).type == FSDP_DEVICE_CPU) return false;
    *c = (cpu_check){kind, m, name, fsdp_tensor_device(t)};
    return true;
}

/* At the first tensor of m that is not on the CPU, described in *user. */
static bool off_cpu(const fsdp_module *m, void *user) {
    cpu_check *c = user;
    for (int i = 0; i < m->n_params; i++) {
        const fsdp_param *p = m->params[i];
        if (found_off_cpu(c, m, "parameter", p->name, p->data) ||
            found_off_cpu(c, m, "gradient of parameter", p->name, p->grad))
            return true;
    }
    for (int i = 0; i < m->n_buffers; i++)
        if (found_off_cpu(c, m, "buffer", m->buffers[i].name, m->buffers[i].data)) return true;
    return false;
}

fsdp_status fsdp_nn_check_on_cpu(fsdp_ctx *ctx, fsdp_module *m, const char *who, const char *layer,
                                 const char *before) {
    cpu_check c = {0};
    if (!search(m, off_cpu, &c)) return FSDP_OK;
    const char *fqn = c.module->fqn;
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                     "%s: %s '%s%s%s' is on %s:%d, and %s does not take device tensors yet (it "
                     "runs on CPU tensors only in this version): move the model to the CPU with "
                     "fsdp_module_to(ctx, model, FSDP_CPU) before %s",
                     who, c.kind, fqn, fqn[0] ? "." : "", c.name, fsdp_device_to_string(c.device),
                     c.device.index, layer, before);
}

/* ---- one device for a whole tree ---- */

typedef struct one_device {
    bool have;        /* the first tensor was seen */
    fsdp_device want; /* its device */
    cpu_check found;  /* the first tensor elsewhere */
} one_device;

static bool found_elsewhere(one_device *o, const fsdp_module *m, const char *kind, const char *name,
                            const fsdp_tensor *t) {
    if (!t) return false;
    fsdp_device d = fsdp_tensor_device(t);
    if (!o->have) {
        o->have = true;
        o->want = d;
        return false;
    }
    if (fsdp_device_same(d, o->want)) return false;
    o->found = (cpu_check){kind, m, name, d};
    return true;
}

/* At the first tensor of m on another device than the first tensor seen, described in
 * *user. */
static bool second_device(const fsdp_module *m, void *user) {
    one_device *o = user;
    for (int i = 0; i < m->n_params; i++) {
        const fsdp_param *p = m->params[i];
        if (found_elsewhere(o, m, "parameter", p->name, p->data) ||
            found_elsewhere(o, m, "gradient of parameter", p->name, p->grad))
            return true;
    }
    for (int i = 0; i < m->n_buffers; i++)
        if (found_elsewhere(o, m, "buffer", m->buffers[i].name, m->buffers[i].data)) return true;
    return false;
}

fsdp_status fsdp_nn_check_one_device(fsdp_ctx *ctx, fsdp_module *m, const char *who,
                                     const char *layer, const char *before, fsdp_device *device) {
    one_device o = {0};
    o.want = FSDP_CPU;
    *device = FSDP_CPU;
    if (!search(m, second_device, &o)) {
        *device = o.want;
        return FSDP_OK;
    }
    const char *fqn = o.found.module->fqn;
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                     "%s: %s '%s%s%s' is on %s:%d but the model's first tensor is on %s:%d; %s "
                     "takes a model whose parameters, gradients and buffers are all on one "
                     "device: move the whole model with fsdp_module_to(ctx, model, device) "
                     "before %s",
                     who, o.found.kind, fqn, fqn[0] ? "." : "", o.found.name,
                     fsdp_device_to_string(o.found.device), o.found.device.index,
                     fsdp_device_to_string(o.want), o.want.index, layer, before);
}
