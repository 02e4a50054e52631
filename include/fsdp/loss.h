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
/* Cross-entropy of logits (N, C) against class indices targets[N] in [0, C), mean over N. */
fsdp_status fsdp_loss_cross_entropy(fsdp_ctx *ctx, const fsdp_tensor *logits,
                                    const int32_t *targets, float *loss, fsdp_tensor *dlogits);

#ifdef __cplusplus
}
#endif
#endif
