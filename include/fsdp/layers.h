/* layers.h: the built-in layers. Each constructor returns a module the caller owns (until it
 * is added to a parent). Shapes: a layer reads the last dimension of its input as features
 * and treats all leading dimensions as rows, so (B, C) and (B, T, C) inputs both work. */
#ifndef FSDP_LAYERS_H
#define FSDP_LAYERS_H

#include "fsdp/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x W^T + b. Parameters "weight" (out_features, in_features) and "bias" (out_features),
 * both uniform in +-1/sqrt(in_features) as PyTorch initialises nn.Linear. */
fsdp_status fsdp_linear_create(fsdp_ctx *ctx, int64_t in_features, int64_t out_features, bool bias,
                               fsdp_module **out);
/* y = x: the output is the input tensor itself and the input gradient is the output gradient. */
fsdp_status fsdp_identity_create(fsdp_ctx *ctx, fsdp_module **out);
fsdp_status fsdp_relu_create(fsdp_ctx *ctx, fsdp_module **out);
fsdp_status fsdp_sigmoid_create(fsdp_ctx *ctx, fsdp_module **out);
/* GELU with the tanh approximation (PyTorch's approximate="tanh"). */
fsdp_status fsdp_gelu_create(fsdp_ctx *ctx, fsdp_module **out);
/* y = x / sqrt(mean(x^2, last dim) + eps) * weight. Parameter "weight" (dim), ones. */
fsdp_status fsdp_rmsnorm_create(fsdp_ctx *ctx, int64_t dim, float eps, fsdp_module **out);
/* Runs its children in order (add them with fsdp_module_add_child; PyTorch names them
 * "0", "1", ...) and backward in reverse. An empty Sequential passes its input through. */
fsdp_status fsdp_sequential_create(fsdp_ctx *ctx, fsdp_module **out);
/* Adds child to a Sequential under the name of its position ("0", "1", ...). */
fsdp_status fsdp_sequential_append(fsdp_ctx *ctx, fsdp_module *seq, fsdp_module *child);

#ifdef __cplusplus
}
#endif
#endif
