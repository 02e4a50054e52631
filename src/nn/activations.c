/* activations.c: the pointwise layers ReLU, Sigmoid and GELU (tanh), one implementation
 * parameterised by kind. ReLU and GELU differentiate from their input, Sigmoid from its
 * output. */
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"

typedef enum act_kind { ACT_RELU, ACT_SIGMOID, ACT_GELU } act_kind;

typedef struct pointwise {
    act_kind kind;
    const fsdp_tensor *input;
    fsdp_tensor *output;
    fsdp_tensor *dinput;
} pointwise;

static void pointwise_free(void *impl) {
    pointwise *p = impl;
    fsdp_tensor_free(p->output);
    fsdp_tensor_free(p->dinput);
    free(p);
}

static fsdp_status pointwise_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                     const fsdp_tensor **out) {
    pointwise *p = m->impl;
    FSDP_TRY_AT(ctx, fsdp_nn_check_input(ctx, m, in, -1));
    fsdp_device dev = fsdp_tensor_device(in);
    FSDP_TRY_AT(ctx,
                fsdp_nn_buffer(ctx, &p->output, dev, fsdp_tensor_ndim(in), fsdp_tensor_shape(in)));
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    float *y = fsdp_tensor_f32(p->output);
    const float *x = fsdp_tensor_f32(in);
    int64_t n = fsdp_tensor_numel(in);
    switch (p->kind) {
    case ACT_RELU:
        k->relu_forward(y, x, n);
        break;
    case ACT_SIGMOID:
        k->sigmoid_forward(y, x, n);
        break;
    case ACT_GELU:
        k->gelu_forward(y, x, n);
        break;
    }
    p->input = in;
    *out = p->output;
    return FSDP_OK;
}

static fsdp_status pointwise_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                      const fsdp_tensor **din) {
    pointwise *p = m->impl;
    if (!p->input || !fsdp_tensor_same_shape(dout, p->output)) {
        char desc[160];
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "%s: backward needs a forward first, and an output gradient of the "
                         "output's shape",
                         fsdp_nn_describe(m, desc, sizeof desc));
    }
    if (!din) return FSDP_OK; /* no parameters: nothing else to do */
    fsdp_device dev = fsdp_tensor_device(dout);
    FSDP_TRY_AT(
        ctx, fsdp_nn_buffer(ctx, &p->dinput, dev, fsdp_tensor_ndim(dout), fsdp_tensor_shape(dout)));
    const fsdp_kernels_i *k = fsdp_kernels_for(dev);
    float *dx = fsdp_tensor_f32(p->dinput);
    const float *dy = fsdp_tensor_f32(dout);
    int64_t n = fsdp_tensor_numel(dout);
    switch (p->kind) {
    case ACT_RELU:
        k->relu_backward(dx, fsdp_tensor_f32(p->input), dy, n);
        break;
    case ACT_SIGMOID:
        k->sigmoid_backward(dx, fsdp_tensor_f32(p->output), dy, n);
        break;
    case ACT_GELU:
        k->gelu_backward(dx, fsdp_tensor_f32(p->input), dy, n);
        break;
    }
    *din = p->dinput;
    return FSDP_OK;
}

static const fsdp_module_ops relu_ops = {.kind = "ReLU",
                                         .forward = pointwise_forward,
                                         .backward = pointwise_backward,
                                         .free_impl = pointwise_free};
static const fsdp_module_ops sigmoid_ops = {.kind = "Sigmoid",
                                            .forward = pointwise_forward,
                                            .backward = pointwise_backward,
                                            .free_impl = pointwise_free};
static const fsdp_module_ops gelu_ops = {.kind = "GELU",
                                         .forward = pointwise_forward,
                                         .backward = pointwise_backward,
                                         .free_impl = pointwise_free};

static fsdp_status pointwise_create(fsdp_ctx *ctx, act_kind kind, const fsdp_module_ops *ops,
                                    fsdp_module **out) {
    pointwise *p = calloc(1, sizeof *p);
    if (!p) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a %s layer", ops->kind);
    p->kind = kind;
    return fsdp_module_create(ctx, ops, p, out);
}

fsdp_status fsdp_relu_create(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    return pointwise_create(ctx, ACT_RELU, &relu_ops, out);
}
fsdp_status fsdp_sigmoid_create(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    return pointwise_create(ctx, ACT_SIGMOID, &sigmoid_ops, out);
}
fsdp_status fsdp_gelu_create(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    return pointwise_create(ctx, ACT_GELU, &gelu_ops, out);
}
