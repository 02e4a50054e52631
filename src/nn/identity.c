/* identity.c: Identity, y = x. Its output is its input tensor itself (no copy) and its input
 * gradient the output gradient: a module for hooks to act on (PrepareModuleInput/Output). */
#include "core/error.h"
#include "fsdp/layers.h"
#include "nn/module_impl.h"

static fsdp_status identity_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                    const fsdp_tensor **out) {
    (void)ctx;
    (void)m;
    *out = in;
    return FSDP_OK;
}

static fsdp_status identity_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                     const fsdp_tensor **din) {
    (void)ctx;
    (void)m;
    if (din) *din = dout;
    return FSDP_OK;
}

static const fsdp_module_ops identity_ops = {
    .kind = "Identity", .forward = identity_forward, .backward = identity_backward};

fsdp_status fsdp_identity_create(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    return fsdp_module_create(ctx, &identity_ops, NULL, out);
}
