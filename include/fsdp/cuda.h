/* cuda.h: settings of the CUDA kernels. Every function here exists in every build; without
 * CUDA support they return FSDP_ERR_DEVICE. Settings apply to the calling thread, which in
 * libfsdp is one rank (one context): ranks sharing a GPU choose independently. */
#ifndef FSDP_CUDA_H
#define FSDP_CUDA_H

#include <stdbool.h>

#include "fsdp/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Lets f32 GEMMs on the GPU use TF32 tensor cores (10-bit mantissa products, f32 accumulate),
 * as PyTorch's torch.backends.cuda.matmul.allow_tf32. Default false: exact f32. */
fsdp_status fsdp_cuda_set_allow_tf32(fsdp_ctx *ctx, bool allow);

#ifdef __cplusplus
}
#endif
#endif
