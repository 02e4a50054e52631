/* models.c: the seed scenarios' models, named as PyTorch names them, and the trainer's MLP.
 * Named containers are Sequentials with named children: their forward order is their
 * registration order. SimpleMLP applies a sigmoid that is not a module, so it has a kind of
 * its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "fsdp/models.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"
#include "nn/nn.h" // defines: fsdp_nn_defer_init

/* A linear layer added to parent under `name`. */
static fsdp_status add_linear(fsdp_ctx *ctx, fsdp_module *parent, const char *name, int64_t in,
                              int64_t out) {
    fsdp_module *l;
    FSDP_TRY_AT(ctx, fsdp_linear_create(ctx, in, out, true, &l));
    return fsdp_module_add_child(ctx, parent, name, l);
}

static fsdp_status add_relu(fsdp_ctx *ctx, fsdp_module *parent, const char *name) {
    fsdp_module *r;
    FSDP_TRY_AT(ctx, fsdp_relu_create(ctx, &r));
    return fsdp_module_add_child(ctx, parent, name, r);
}

/* Finishes a model: parameters drawn from the ctx seed under their final names (the build ran
 * with the fills on creation deferred, started by fsdp_nn_defer_init(ctx, true), which returned
 * was: each parameter is filled once, here). */
static fsdp_status finish(fsdp_ctx *ctx, fsdp_module *m, fsdp_status st, bool was,
                          fsdp_module **out) {
    fsdp_nn_defer_init(ctx, was);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, m, fsdp_ctx_seed(ctx));
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}

static fsdp_status build_mlp_module(fsdp_ctx *ctx, fsdp_module *m) {
    FSDP_TRY_AT(ctx, add_linear(ctx, m, "net1", 10, 16));
    FSDP_TRY_AT(ctx, add_relu(ctx, m, "relu"));
    return add_linear(ctx, m, "net2", 16, 10);
}

fsdp_status fsdp_model_mlp_module(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &m));
    bool was = fsdp_nn_defer_init(ctx, true);
    fsdp_status st = build_mlp_module(ctx, m);
    return finish(ctx, m, st, was, out);
}

static fsdp_status build_mlp_stacked(fsdp_ctx *ctx, fsdp_module *m, int n_layers) {
    fsdp_module *layers;
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &layers));
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, m, "layers", layers));
    for (int i = 0; i < n_layers; i++) {
        fsdp_module *block;
        FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &block));
        FSDP_TRY_AT(ctx, fsdp_sequential_append(ctx, layers, block));
        FSDP_TRY_AT(ctx, build_mlp_module(ctx, block));
    }
    return FSDP_OK;
}

fsdp_status fsdp_model_mlp_stacked(fsdp_ctx *ctx, int n_layers, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (n_layers < 1)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "MLPStacked: n_layers is %d; it must be >= 1", n_layers);
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &m));
    bool was = fsdp_nn_defer_init(ctx, true);
    fsdp_status st = build_mlp_stacked(ctx, m, n_layers);
    return finish(ctx, m, st, was, out);
}

/* SimpleMLP: sigmoid(net2(relu(net1(x)))). */
typedef struct simple_mlp {
    fsdp_tensor *output;  /* (B, 8) after the sigmoid */
    fsdp_tensor *dlogits; /* (B, 8) gradient before the sigmoid */
} simple_mlp;

static void simple_mlp_free(void *impl) {
    simple_mlp *s = impl;
    fsdp_tensor_free(s->output);
    fsdp_tensor_free(s->dlogits);
    free(s);
}

static fsdp_status simple_mlp_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                      const fsdp_tensor **out) {
    simple_mlp *s = m->impl;
    const fsdp_tensor *x;
    FSDP_TRY_AT(ctx, fsdp_nn_chain_forward(ctx, m->children, m->n_children, in, &x));
    fsdp_device dev = fsdp_tensor_device(x);
    FSDP_TRY_AT(ctx,
                fsdp_nn_buffer(ctx, &s->output, dev, fsdp_tensor_ndim(x), fsdp_tensor_shape(x)));
    fsdp_kernels_for(dev)->sigmoid_forward(fsdp_tensor_f32(s->output), fsdp_tensor_f32(x),
                                           fsdp_tensor_numel(x));
    *out = s->output;
    return FSDP_OK;
}

static fsdp_status simple_mlp_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                       const fsdp_tensor **din) {
    simple_mlp *s = m->impl;
    if (!s->output || !fsdp_tensor_same_shape(dout, s->output))
        return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                         "SimpleMLP: backward needs a forward first, and an output gradient of the "
                         "output's shape");
    fsdp_device dev = fsdp_tensor_device(dout);
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &s->dlogits, dev, fsdp_tensor_ndim(dout),
                                    fsdp_tensor_shape(dout)));
    fsdp_kernels_for(dev)->sigmoid_backward(fsdp_tensor_f32(s->dlogits), fsdp_tensor_f32(s->output),
                                            fsdp_tensor_f32(dout), fsdp_tensor_numel(dout));
    return fsdp_nn_chain_backward(ctx, m->children, m->n_children, s->dlogits, din);
}

static const fsdp_module_ops simple_mlp_ops = {.kind = "SimpleMLP",
                                               .forward = simple_mlp_forward,
                                               .backward = simple_mlp_backward,
                                               .free_impl = simple_mlp_free};

fsdp_status fsdp_model_simple_mlp(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    simple_mlp *s = calloc(1, sizeof *s);
    if (!s) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate SimpleMLP");
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &simple_mlp_ops, s, &m));
    bool was = fsdp_nn_defer_init(ctx, true);
    fsdp_status st = add_linear(ctx, m, "net1", 50, 32);
    if (st == FSDP_OK) st = add_relu(ctx, m, "relu");
    if (st == FSDP_OK) st = add_linear(ctx, m, "net2", 32, 8);
    return finish(ctx, m, st, was, out);
}

fsdp_status fsdp_model_simple_model(fsdp_ctx *ctx, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &m));
    bool was = fsdp_nn_defer_init(ctx, true);
    fsdp_status st = add_linear(ctx, m, "net1", 5, 8);
    if (st == FSDP_OK) st = add_relu(ctx, m, "relu");
    if (st == FSDP_OK) st = add_linear(ctx, m, "net2", 8, 4);
    if (st == FSDP_OK) st = add_linear(ctx, m, "net3", 4, 12);
    return finish(ctx, m, st, was, out);
}

fsdp_status fsdp_model_net(fsdp_ctx *ctx, int64_t dim, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (dim <= 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "Net: dim is %lld; it must be positive",
                         (long long)dim);
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &m));
    bool was = fsdp_nn_defer_init(ctx, true);
    fsdp_status st = FSDP_OK;
    for (int i = 1; i <= 4 && st == FSDP_OK; i++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", i);
        st = add_linear(ctx, m, name, dim, dim);
    }
    return finish(ctx, m, st, was, out);
}

static const char *const activation_names[] = {"relu", "gelu", "sigmoid", "none"};

const char *fsdp_activation_to_string(fsdp_activation act) {
    return (int)act >= 0 && act <= FSDP_ACT_NONE ? activation_names[act] : "unknown";
}

fsdp_status fsdp_activation_parse(const char *text, fsdp_activation *out) {
    FSDP_ARG_NOT_NULL(NULL, text);
    FSDP_ARG_NOT_NULL(NULL, out);
    for (int a = 0; a <= FSDP_ACT_NONE; a++) {
        if (strcasecmp(text, activation_names[a]) == 0) {
            *out = (fsdp_activation)a;
            return FSDP_OK;
        }
    }
    return FSDP_ERR_INVALID_ARGUMENT;
}

static fsdp_status append_activation(fsdp_ctx *ctx, fsdp_module *seq, fsdp_activation act) {
    fsdp_module *a = NULL;
    switch (act) {
    case FSDP_ACT_RELU:
        FSDP_TRY_AT(ctx, fsdp_relu_create(ctx, &a));
        break;
    case FSDP_ACT_GELU:
        FSDP_TRY_AT(ctx, fsdp_gelu_create(ctx, &a));
        break;
    case FSDP_ACT_SIGMOID:
        FSDP_TRY_AT(ctx, fsdp_sigmoid_create(ctx, &a));
        break;
    case FSDP_ACT_NONE:
        return FSDP_OK;
    }
    return fsdp_sequential_append(ctx, seq, a);
}

fsdp_status fsdp_model_mlp(fsdp_ctx *ctx, int n_widths, const int64_t *widths, fsdp_activation act,
                           fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, widths);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (n_widths < 2)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "MLP: %d widths given; it needs at least an input and an output width",
                         n_widths);
    if ((int)act < 0 || act > FSDP_ACT_NONE)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "MLP: unknown activation %d", (int)act);
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &m));
    bool was = fsdp_nn_defer_init(ctx, true);
    fsdp_status st = FSDP_OK;
    for (int i = 0; i + 1 < n_widths && st == FSDP_OK; i++) {
        fsdp_module *l;
        st = fsdp_linear_create(ctx, widths[i], widths[i + 1], true, &l);
        if (st == FSDP_OK) st = fsdp_sequential_append(ctx, m, l);
        if (st == FSDP_OK && i + 2 < n_widths) st = append_activation(ctx, m, act);
    }
    return finish(ctx, m, st, was, out);
}
