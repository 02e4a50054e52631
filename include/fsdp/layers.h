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
/* The compute policy of every Linear in m's subtree (an autocast-like policy per model,
 * docs/models.md "bf16 compute"): FSDP_DTYPE_F32 (the default) or FSDP_DTYPE_BF16. Under bf16
 * a Linear's three GEMMs (forward, input gradient, weight gradient) read bf16 copies of their
 * inputs (the input or output gradient, rounded to nearest even, and the f32 weight rounded)
 * and accumulate in f32; the output and the input gradient are rounded to bf16 (stored widened
 * in their f32 tensors), the weight gradient is accumulated in f32 into the f32 gradient, the
 * bias added in f32 before the output's rounding. Every other layer (norms, attention,
 * softmax, losses) and the optimizer compute in f32 on what they receive. The same on every
 * device: the CPU and sim widen exactly and round where a GPU writes bf16, so sim gives the
 * CPU's bits. Under bf16 a Linear also takes a bf16 input tensor (read as its bf16 copy; without
 * the policy a bf16 input is FSDP_ERR_DTYPE), and the Llama's MLP, q/k and decoder-layer norms
 * keep their activations in bf16 tensors (docs/models.md "bf16 activation storage"), bitwise the
 * same results. Takes effect at the next forward; a backward follows its forward's policy.
 * FSDP_ERR_INVALID_ARGUMENT for any other dtype. */
fsdp_status fsdp_module_set_autocast(fsdp_ctx *ctx, fsdp_module *m, fsdp_dtype compute_dtype);
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
