/* cuda_absent.c: the public CUDA settings in a build without CUDA support (CMake compiles it
 * only then): each says so. */
#include "core/error.h"
#include "fsdp/cuda.h"

fsdp_status fsdp_cuda_set_allow_tf32(fsdp_ctx *ctx, bool allow) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    (void)allow;
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                     "fsdp_cuda_set_allow_tf32: this build of libfsdp has no CUDA support "
                     "(rebuild with the CUDA toolkit installed)");
}
