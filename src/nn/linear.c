/* linear.c: Linear, y = x W^T + b over the last dimension. The feature counts are read from
 * the weight's current shape, so a tensor-parallel shard of the weight just works. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"

typedef struct linear {
    fsdp_param *weight;       /* (out, in) */
    fsdp_param *bias;         /* (out), or NULL */
    const fsdp_tensor *input; /* (rows, in), kept for backward */
    fsdp_tensor *output;      /* (rows, out) */
    fsdp_tensor *dinput;      /* (rows, in) */
} linear;

static void linear_free(void *impl) {
    linear *l = impl;
    fsdp_tensor_free(l->output);
    fsdp_tensor_free(l->dinput);
    free(l);
}

static fsdp_status linear_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                  const fsdp_tensor **out) {
    linear *l = m->impl;
    const fsdp_tensor *w = l->weight->data;
    int64_t OC = fsdp_tensor_dim(w, 0), C = fsdp_tensor_dim(w, 1);
    FSDP_TRY_AT(ctx, fsdp_nn_check_input(ctx, m, in, C));
    int64_t rows = fsdp_tensor_numel(in) / (C ? C : 1);
    int64_t shape[FSDP_MAX_DIMS];
    int nd = fsdp_tensor_ndim(in);
    for (int i = 0; i < nd; i++) shape[i] = fsdp_tensor_dim(in, i);
    shape[nd - 1] = OC;
    fsdp_device dev = fsdp_tensor_device(in);
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &l->output, dev, nd, shape));
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    float *y = fsdp_tensor_f32(l->output);
    k->gemm(false, true, rows, OC, C, 1.0f, fsdp_tensor_f32(in), C, fsdp_tensor_f32(w), C, 0.0f, y,
            OC);
    if (l->bias && !l->bias->hook_applied) k->bias_add(y, fsdp_tensor_f32(l->bias->data), rows, OC);
    l->input = in;
    *out = l->output;
    return FSDP_OK;
}

static fsdp_status linear_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                   const fsdp_tensor **din) {
    linear *l = m->impl;
    const fsdp_tensor *w = l->weight->data;
    int64_t OC = fsdp_tensor_dim(w, 0), C = fsdp_tensor_dim(w, 1);
    if (!l->input || !l->output || !fsdp_tensor_same_shape(dout, l->output)) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s: backward needs a forward first, and an output gradient of the "
                         "output's shape",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    int64_t rows = fsdp_tensor_numel(dout) / (OC ? OC : 1);
    const fsdp_kernels_i *k = fsdp_kernels_for(fsdp_tensor_device(dout));
    const float *dy = fsdp_tensor_f32(dout), *x = fsdp_tensor_f32(l->input);
    if (l->weight->requires_grad) /* dW (OC, C) += dy^T (OC, rows) @ x (rows, C) */
        k->gemm(true, false, OC, C, rows, 1.0f, dy, OC, x, C, 1.0f,
                fsdp_tensor_f32(l->weight->grad), C);
    if (l->bias && l->bias->requires_grad && !l->bias->hook_applied)
        k->bias_backward(fsdp_tensor_f32(l->bias->grad), dy, rows, OC);
    if (din) { /* dx (rows, C) = dy (rows, OC) @ W (OC, C) */
        FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &l->dinput, fsdp_tensor_device(dout),
                                        fsdp_tensor_ndim(l->input), fsdp_tensor_shape(l->input)));
        k->gemm(false, false, rows, C, OC, 1.0f, dy, OC, fsdp_tensor_f32(w), C, 0.0f,
                fsdp_tensor_f32(l->dinput), C);
        *din = l->dinput;
    }
    return FSDP_OK;
}

static const fsdp_module_ops linear_ops = {.kind = "Linear",
                                           .forward = linear_forward,
                                           .backward = linear_backward,
                                           .free_impl = linear_free};

bool fsdp_nn_is_linear(const fsdp_module *m) {
    return m && m->ops == &linear_ops;
}

fsdp_param *fsdp_nn_linear_weight(const fsdp_module *m) {
    return fsdp_nn_is_linear(m) ? ((const linear *)m->impl)->weight : NULL;
}

fsdp_status fsdp_nn_linear_create_tied(fsdp_ctx *ctx, fsdp_param *weight, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, weight);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (fsdp_tensor_ndim(weight->data) != 2)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "a tied Linear needs a 2-d (out, in) weight; '%s' has %d dims",
                         weight->name, fsdp_tensor_ndim(weight->data));
    linear *l = calloc(1, sizeof *l);
    if (!l) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a Linear layer");
    l->weight = weight; /* not registered: its owner holds it */
    return fsdp_module_create(ctx, &linear_ops, l, out);
}

fsdp_status fsdp_linear_create(fsdp_ctx *ctx, int64_t in_features, int64_t out_features, bool bias,
                               fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (in_features <= 0 || out_features <= 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Linear(%lld, %lld): feature counts must be positive",
                         (long long)in_features, (long long)out_features);
    linear *l = calloc(1, sizeof *l);
    if (!l) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a Linear layer");
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &linear_ops, l, &m));
    float bound = 1.0f / sqrtf((float)in_features); /* PyTorch's nn.Linear default */
    fsdp_init init = {.kind = FSDP_INIT_UNIFORM, .a = -bound, .b = bound};
    fsdp_status st = fsdp_module_add_param(
        ctx, m, "weight", 2, (int64_t[]){out_features, in_features}, init, &l->weight);
    if (st == FSDP_OK && bias)
        st = fsdp_module_add_param(ctx, m, "bias", 1, (int64_t[]){out_features}, init, &l->bias);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}
