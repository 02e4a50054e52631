/* dp_common.h: what the data-parallel suites (test_replicate, test_data_parallel) share: the
 * models of PyTorch's test_data_parallel.py (SimpleMLP, and the WrapperModule that transposes
 * its input for a non-0 batch dim), its data by global sample index, and its training step's
 * forward and backward with the loss (out - labels).sum(). */
#ifndef FSDP_TEST_DP_COMMON_H
#define FSDP_TEST_DP_COMMON_H

#include <stdint.h>

#include "fsdp/fsdp.h"
#include "numerics.h" // defines: fsdp_test_adam_check

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

/* ---- Adam scenarios: the reference's rounding noise ---- */

/* The reference of an Adam scenario trained a second time, from its parameters nudged by one
 * ulp (fsdp_test_nudge_params): its difference from the reference is the reference's rounding
 * noise, which the statistical rule of tests/numerics.h scales. SimpleMLP has 1896
 * parameters, so the noise is the 0.99 quantile (the 19th largest difference) rather than
 * the 0.999 of larger models. Every element within DP_NOISE_K x the noise, but at most
 * DP_MAX_EXCEPTIONS, each within twice the largest move Adam has made. Seen over the 72
 * comparisons (3 steps, 8 runs) under OpenBLAS's Haswell, Sandybridge and Prescott kernels: on
 * average 0.22 elements beyond 8 x the noise, 0.06 beyond 16 x, never more than 1; the nudged
 * copy itself, as noisy as a reordering can be, has 0.21 beyond 16 x, so 5 beyond it in one
 * comparison is a defect, not a draw. */
#define DP_NOISE_Q        0.99
#define DP_NOISE_K        16.0
#define DP_MAX_EXCEPTIONS 4

typedef struct dp_adam_noise {
    fsdp_module *model;
    fsdp_optimizer *opt;
    fsdp_tensor *dout;
    fsdp_adam_options opts; /* the scenario's, for the betas of every group */
    double move;            /* twice the largest move of all steps so far, summed */
    int steps;
} dp_adam_noise;

/* Builds the nudged copy of dp_build_model(batch_dim, DP_SEED) and its Adam (AdamW when adamw)
 * with opts (copied; its param_groups must outlive n). */
fsdp_status dp_adam_noise_init(fsdp_ctx *ctx, dp_adam_noise *n, int batch_dim,
                               const fsdp_adam_options *opts, bool adamw);
/* One step of the copy on the reference's batch (dp_forward_backward with dscale, then the
 * optimizer at learning rate lr, the scenario's lr for this step); adds twice Adam's largest
 * move at that step for the largest group lr to n->move. */
fsdp_status dp_adam_noise_step(fsdp_ctx *ctx, dp_adam_noise *n, const fsdp_tensor *x,
                               const fsdp_tensor *labels, float dscale, double lr);
/* Compares every parameter of `got` (whole: gathered over tp, or inside summon_full_params)
 * with ref's by the rule, the noise measured between ref and n's copy now; fails naming
 * `stage`. *out (may be NULL) receives what the check saw. */
fsdp_status dp_adam_compare(fsdp_ctx *ctx, const dp_adam_noise *n, fsdp_module *ref,
                            fsdp_module *got, const char *stage, fsdp_test_adam_check *out);
void dp_adam_noise_release(dp_adam_noise *n);

#endif
