/* rmsnorm.c: RMSNorm, y = x / sqrt(mean(x^2) + eps) * weight over the last dimension. */
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"

typedef struct rmsnorm {
    float eps;
    fsdp_param *weight;        /* (C) */
    const fsdp_tensor *input;  /* (rows, C) */
    fsdp_tensor *output;       /* (rows, C) */
    fsdp_tensor *rstd;         /* (rows) */
    fsdp_tensor *dinput;       /* (rows, C) */
    fsdp_tensor *dweight_sink; /* (C): where the weight grad goes when it is not wanted */
} rmsnorm;

static void rmsnorm_free(void *impl) {
    rmsnorm *r = impl;
    fsdp_tensor_free(r->output);
    fsdp_tensor_free(r->rstd);
    fsdp_tensor_free(r->dinput);
    fsdp_tensor_free(r->dweight_sink);
    free(r);
}

static fsdp_status rmsnorm_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                   const fsdp_tensor **out) {
    rmsnorm *r = m->impl;
    int64_t C = fsdp_tensor_numel(r->weight->data);
    FSDP_TRY_AT(ctx, fsdp_nn_check_input(ctx, m, in, C));
    int64_t rows = fsdp_tensor_numel(in) / C;
    fsdp_device dev = fsdp_tensor_device(in);
    FSDP_TRY_AT(ctx,
                fsdp_nn_buffer(ctx, &r->output, dev, fsdp_tensor_ndim(in), fsdp_tensor_shape(in)));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &r->rstd, dev, 1, &rows));
    fsdp_kernels_for(dev)->rmsnorm_forward(fsdp_tensor_f32(r->output), fsdp_tensor_f32(r->rstd),
                                           fsdp_tensor_f32(in), fsdp_tensor_f32(r->weight->data),
                                           r->eps, rows, C);
    r->input = in;
    *out = r->output;
    return FSDP_OK;
}

static fsdp_status rmsnorm_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                    const fsdp_tensor **din) {
    rmsnorm *r = m->impl;
    if (!r->input || !fsdp_tensor_same_shape(dout, r->output)) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s: backward needs a forward first, and an output gradient of the "
                         "output's shape",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    int64_t C = fsdp_tensor_numel(r->weight->data), rows = fsdp_tensor_numel(dout) / C;
    fsdp_device dev = fsdp_tensor_device(dout);
    /* The kernel computes both gradients in one pass; it always needs an input-grad buffer. */
    FSDP_TRY_AT(
        ctx, fsdp_nn_buffer(ctx, &r->dinput, dev, fsdp_tensor_ndim(dout), fsdp_tensor_shape(dout)));
    if (!r->weight->requires_grad && !din) return FSDP_OK;
    fsdp_tensor *dweight = r->weight->grad;
    if (!r->weight->requires_grad) { /* input gradient only: the weight grad goes to a sink */
        FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &r->dweight_sink, dev, 1, &C));
        dweight = r->dweight_sink;
    }
    fsdp_kernels_for(dev)->rmsnorm_backward(fsdp_tensor_f32(r->dinput), fsdp_tensor_f32(dweight),
                                            fsdp_tensor_f32(dout), fsdp_tensor_f32(r->input),
                                            fsdp_tensor_f32(r->weight->data),
                                            fsdp_tensor_f32(r->rstd), rows, C);
    if (din) *din = r->dinput;
    return FSDP_OK;
}

static const fsdp_module_ops rmsnorm_ops = {.kind = "RMSNorm",
                                            .forward = rmsnorm_forward,
                                            .backward = rmsnorm_backward,
                                            .free_impl = rmsnorm_free};

fsdp_status fsdp_rmsnorm_create(fsdp_ctx *ctx, int64_t dim, float eps, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (dim <= 0 || !(eps >= 0.0f))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "RMSNorm(%lld, eps=%g): dim must be positive and eps >= 0", (long long)dim,
                         (double)eps);
    rmsnorm *r = calloc(1, sizeof *r);
    if (!r) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an RMSNorm layer");
    r->eps = eps;
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &rmsnorm_ops, r, &m));
    fsdp_status st = fsdp_module_add_param(ctx, m, "weight", 1, &dim,
                                           (fsdp_init){.kind = FSDP_INIT_ONES}, &r->weight);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}
