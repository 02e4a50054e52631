/* flat_module.c: the module fsdp_sharded_flat_params hands out (and, with use_orig_params, the
 * modules of the tree under it): it holds parameters for an optimizer and refuses to run, and
 * is recognised by its ops (flat.h). Apart from units.c, which makes these modules, so that what
 * asks about them (the optimizer's bf16 copy, clipping) does not depend on the units' code. */
#include "core/error.h"
#include "dp/flat.h"
#include "nn/nn.h"

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

const fsdp_module_ops *fsdp_flat_params_ops(void) {
    return &flat_ops;
}

bool fsdp_module_is_flat_params(const fsdp_module *m) {
    return m && fsdp_nn_module_ops(m) == &flat_ops;
}

fsdp_sharded *fsdp_module_flat_params_owner(const fsdp_module *m) {
    return fsdp_module_is_flat_params(m) ? fsdp_module_impl(m) : NULL;
}
