/* sequential.c: Sequential, which runs its children in order and backward in reverse. */
#include <stdio.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "nn/module_impl.h"

fsdp_status fsdp_nn_chain_forward(fsdp_ctx *ctx, fsdp_module *const *children, int n,
                                  const fsdp_tensor *in, const fsdp_tensor **out) {
    const fsdp_tensor *x = in;
    for (int i = 0; i < n; i++) FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, children[i], x, &x));
    *out = x;
    return FSDP_OK;
}

fsdp_status fsdp_nn_chain_backward(fsdp_ctx *ctx, fsdp_module *const *children, int n,
                                   const fsdp_tensor *dout, const fsdp_tensor **din) {
    const fsdp_tensor *d = dout;
    for (int i = n - 1; i >= 0; i--)
        FSDP_TRY_AT(ctx, fsdp_module_backward(ctx, children[i], d, (i > 0 || din) ? &d : NULL));
    if (din) *din = d;
    return FSDP_OK;
}

static fsdp_status sequential_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                      const fsdp_tensor **out) {
    return fsdp_nn_chain_forward(ctx, m->children, m->n_children, in, out);
}

static fsdp_status sequential_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                       const fsdp_tensor **din) {
    return fsdp_nn_chain_backward(ctx, m->children, m->n_children, dout, din);
}

static const fsdp_module_ops sequential_ops = {
    .kind = "Sequential", .forward = sequential_forward, .backward = sequential_backward};

fsdp_status fsdp_sequential_create(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    return fsdp_module_create(ctx, &sequential_ops, NULL, out);
}

fsdp_status fsdp_sequential_append(fsdp_ctx *ctx, fsdp_module *seq, fsdp_module *child) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, seq);
    FSDP_ARG_NOT_NULL(ctx, child);
    char name[16];
    snprintf(name, sizeof name, "%d", seq->n_children);
    return fsdp_module_add_child(ctx, seq, name, child);
}
