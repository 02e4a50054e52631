/* rmsnorm.c: RMSNorm, y = x / sqrt(mean(x^2) + eps) * weight over the last dimension; for a
 * parent that asks, y rounded to bf16 in a bf16 tensor (fsdp_nn_rmsnorm_set_bf16_output), and a
 * residual's gradient added to the input gradient in the backward's pass
 * (fsdp_nn_rmsnorm_set_grad_residual). */
#include <stdlib.h>

#include "core/error.h"
#include "core/tensor_impl.h" // defines: fsdp_tensor_release_storage
#include "fsdp/layers.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"
#include "nn/nn.h" // defines: fsdp_nn_rmsnorm_set_bf16_output

typedef struct rmsnorm {
    float eps;
    fsdp_param *weight;          /* (C) */
    const fsdp_tensor *input;    /* (rows, C) */
    fsdp_tensor *output;         /* (rows, C) */
    fsdp_tensor *output16;       /* (rows, C) bf16: the output when the parent asks (bf16_out) */
    const fsdp_tensor *last_out; /* output or output16, of the last forward */
    fsdp_tensor *rstd;           /* (rows) */
    fsdp_tensor *dinput;         /* (rows, C) */
    fsdp_tensor *dweight_sink;   /* (C): where the weight grad goes when it is not wanted */
    bool bf16_out;               /* the parent asks for the output in bf16 (this call only) */
    const fsdp_tensor *dres;     /* (rows, C): the parent asks for dinput + dres (this call) */
} rmsnorm;

static void rmsnorm_free(void *impl) {
    rmsnorm *r = impl;
    fsdp_tensor_free(r->output);
    fsdp_tensor_free(r->output16);
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
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    bool out16 = r->bf16_out && k->rmsnorm_forward_bf16;
    fsdp_tensor **o = out16 ? &r->output16 : &r->output, *unused = out16 ? r->output : r->output16;
    /* the other kind's storage, of an earlier forward, is not needed */
    if (unused) fsdp_tensor_release_storage(unused);
    FSDP_TRY_AT(ctx, fsdp_nn_buffer_dtype(ctx, o, out16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32, dev,
                                          fsdp_tensor_ndim(in), fsdp_tensor_shape(in)));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &r->rstd, dev, 1, &rows));
    const float *x = fsdp_tensor_f32(in), *w = fsdp_tensor_f32(r->weight->data);
    float *rstd = fsdp_tensor_f32(r->rstd);
    if (out16)
        k->rmsnorm_forward_bf16(fsdp_tensor_data(*o), rstd, x, w, r->eps, rows, C);
    else
        k->rmsnorm_forward(fsdp_tensor_f32(*o), rstd, x, w, r->eps, rows, C);
    r->input = in;
    r->last_out = *o;
    *out = *o;
    return FSDP_OK;
}

static fsdp_status rmsnorm_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                    const fsdp_tensor **din) {
    rmsnorm *r = m->impl;
    if (!r->input || !r->last_out || !fsdp_tensor_same_shape(dout, r->last_out)) {
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
        /* never read, but added into: zeroed when new, so that no kernel reads memory no one
         * wrote (a fresh buffer is not zeroed: compute-sanitizer's initcheck would say so) */
        bool fresh = !r->dweight_sink || !fsdp_tensor_has_storage(r->dweight_sink);
        FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &r->dweight_sink, dev, 1, &C));
        if (fresh) FSDP_TRY_AT(ctx, fsdp_tensor_fill(ctx, r->dweight_sink, 0.0f));
        dweight = r->dweight_sink;
    }
    const fsdp_tensor *dres = din ? r->dres : NULL;
    if (dres &&
        (fsdp_tensor_dtype(dres) != FSDP_DTYPE_F32 || !fsdp_tensor_same_shape(dres, dout))) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "%s: the residual gradient to add must be f32 and shaped like the output "
                         "gradient",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    float *dx = fsdp_tensor_f32(r->dinput), *dw = fsdp_tensor_f32(dweight);
    const float *dy = fsdp_tensor_f32(dout), *x = fsdp_tensor_f32(r->input);
    const float *w = fsdp_tensor_f32(r->weight->data), *rstd = fsdp_tensor_f32(r->rstd);
    if (dres && k->rmsnorm_backward_add) {
        k->rmsnorm_backward_add(dx, dw, dy, fsdp_tensor_f32(dres), x, w, rstd, rows, C);
    } else {
        k->rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, C);
        if (dres) k->add(dx, fsdp_tensor_f32(dres), dx, rows * C); /* the same bits */
    }
    if (din) *din = r->dinput;
    return FSDP_OK;
}

static const fsdp_module_ops rmsnorm_ops = {.kind = "RMSNorm",
                                            .forward = rmsnorm_forward,
                                            .backward = rmsnorm_backward,
                                            .free_impl = rmsnorm_free};

void fsdp_nn_rmsnorm_set_bf16_output(fsdp_module *m, bool on) {
    if (m && m->ops == &rmsnorm_ops) ((rmsnorm *)m->impl)->bf16_out = on;
}

void fsdp_nn_rmsnorm_set_grad_residual(fsdp_module *m, const fsdp_tensor *dres) {
    if (m && m->ops == &rmsnorm_ops) ((rmsnorm *)m->impl)->dres = dres;
}

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
