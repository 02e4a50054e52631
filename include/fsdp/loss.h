/* loss.h: losses with their gradients. Each returns the scalar loss in *loss and, when
 * dout is not NULL, writes d(loss)/d(out) into dout, which must have out's shape. */
#ifndef FSDP_LOSS_H
#define FSDP_LOSS_H

#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* loss = sum(out); dout = 1. */
fsdp_status fsdp_loss_sum(fsdp_ctx *ctx, const fsdp_tensor *out, float *loss, fsdp_tensor *dout);
/* loss = mean((out - target)^2) over all elements. */
fsdp_status fsdp_loss_mse(fsdp_ctx *ctx, const fsdp_tensor *out, const fsdp_tensor *target,
                          float *loss, fsdp_tensor *dout);
/* Cross-entropy of logits (N, C) against class indices targets[N] in [0, C), mean over N.
 * Both cross-entropies take f32 or bf16 logits: bf16 ones are widened and the math is the f32
 * one (the same loss bits as on f32 logits holding those values); dlogits is then f32, or bf16
 * holding each f32 gradient element rounded to nearest even (a Llama with logits_dtype bf16,
 * docs/models.md "bf16 logits"). A bf16 dlogits for f32 logits is refused (FSDP_ERR_DTYPE). */
fsdp_status fsdp_loss_cross_entropy(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                    const int32_t *targets, float *loss, fsdp_tensor *dlogits);

/* PyTorch's default ignore_index. */
#define FSDP_IGNORE_INDEX (-100)
/* Cross-entropy of logits (..., C) (the leading dims are rows: (B, T, V) works) against
 * targets[rows] (host memory), each in [0, C) or equal to ignore_index: mean over the rows
 * that are not ignored, which get zero gradient (PyTorch's cross_entropy with ignore_index and
 * reduction "mean"). When every row is ignored the loss is NaN, as PyTorch's. */
fsdp_status fsdp_loss_cross_entropy_ignore(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           float *loss, fsdp_tensor *dlogits);

/* dout *= factor (f32, with storage; a bf16 gradient is refused: scale the f32 one), on dout's
 * device: a loss gradient rescaled where this rank's share of the batch or the gradient
 * accumulation makes its mean differ from the batch's. Each element is one f32 product, the same
 * on every device. */
fsdp_status fsdp_loss_scale_grad(fsdp_ctx *ctx, fsdp_tensor *dout, float factor);

#ifdef __cplusplus
}
#endif
#endif
