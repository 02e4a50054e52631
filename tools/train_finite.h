/* train_finite.h: whether every parameter of a trained model is finite. The loss does not tell:
 * a ReLU turns a NaN input into 0, so a model can hold NaN parameters with a finite loss. */
#ifndef FSDP_TOOLS_TRAIN_FINITE_H
#define FSDP_TOOLS_TRAIN_FINITE_H

#include <stddef.h>

#include "fsdp/fsdp.h"

/* Reads every value of the parameters this rank holds (src: the model, its FSDP wrapping or
 * NULL; the optimizer is not looked at) and agrees with the other ranks of the world (one
 * all_reduce of one float per parameter; none with a single rank). Writes into bad, the same on
 * every rank, "'0.weight' holds NaN or infinite values" (or "'0.weight' and 2 other parameters
 * hold ...") when some parameter is not finite anywhere, else "". Every rank calls it. */
fsdp_status train_params_finite(fsdp_ctx *ctx, const fsdp_state_sources *src, char *bad,
                                size_t size);

#endif
