/* device.c: fsdp_module_to, moving a module tree's parameters, gradients and buffers to
 * another device before the model is parallelised. */
#include "core/error.h"
#include "core/tensor_impl.h"
#include "nn/module_impl.h"

typedef struct move_args {
    fsdp_device device;
} move_args;

static fsdp_status move_module(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    const move_args *a = user;
    for (int i = 0; i < m->n_params; i++) {
        fsdp_param *p = m->params[i];
        if (p->dist)
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "fsdp_module_to: parameter '%s' is already tensor-parallel; move the "
                             "model to the device before parallelising it",
                             p->name);
        FSDP_TRY(fsdp_tensor_move(ctx, p->data, a->device));
        FSDP_TRY(fsdp_tensor_move(ctx, p->grad, a->device));
    }
    for (int i = 0; i < m->n_buffers; i++)
        FSDP_TRY(fsdp_tensor_move(ctx, m->buffers[i].data, a->device));
    return FSDP_OK;
}

fsdp_status fsdp_module_to(fsdp_ctx *ctx, fsdp_module *m, fsdp_device device) {
    if (!m) return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_module_to: the module is NULL");
    return fsdp_module_visit(ctx, m, move_module, &(move_args){device});
}
