/* dp_common.h: what the data-parallel suites (test_replicate, test_data_parallel) share: the
 * models of PyTorch's test_data_parallel.py (SimpleMLP, and the WrapperModule that transposes
 * its input for a non-0 batch dim), its data by global sample index, and its training step's
 * forward and backward with the loss (out - labels).sum(). */
#ifndef FSDP_TEST_DP_COMMON_H
#define FSDP_TEST_DP_COMMON_H

#include <stdint.h>

#include "fsdp/fsdp.h"

#define DP_SEED      7  /* the reference's parameter seed */
#define DP_DATA_SEED 11 /* the batch's */
#define DP_IN_DIM    50
#define DP_OUT_DIM   8

/* SimpleMLP (net1 Linear(50, 32), relu, net2 Linear(32, 8), sigmoid) or, with batch_dim 1, the
 * seed's WrapperModule around it (child "mlp"): forward(x) = mlp(x.t()).t(). Parameters from
 * seed. The caller owns *out. */
fsdp_status dp_build_model(fsdp_ctx *ctx, int batch_dim, uint64_t seed, fsdp_module **out);

/* Samples [off, off + len) of a global batch of `batch` samples with `features` each, laid out
 * (batch, features) or, with batch_dim 1, (features, batch): standard normal values drawn from
 * their global coordinates, so any rank makes exactly its own samples. The caller owns *out. */
fsdp_status dp_batch_block(fsdp_ctx *ctx, int64_t batch, int64_t features, int batch_dim,
                           int64_t off, int64_t len, uint64_t stream, fsdp_tensor **out);

/* Forward, loss and backward of m on (x, labels), with every output gradient dscale (the loss
 * times dscale); *loss is the unscaled loss. *dout is a buffer kept between steps (the caller
 * owns it; NULL the first time). */
fsdp_status dp_forward_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *x,
                                const fsdp_tensor *labels, float dscale, fsdp_tensor **dout,
                                double *loss);

/* Checks that the losses of the ranks of group add up to the reference's loss (every rank of the
 * group calls it); `what` names the step in the message. */
fsdp_status dp_check_loss_sum(fsdp_ctx *ctx, fsdp_group *group, double loss, double ref_loss,
                              const char *what);

#endif
