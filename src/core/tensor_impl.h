/* tensor_impl.h: the body of fsdp_tensor and its reference-counted storage, for libfsdp's
 * own layers (FSDP re-points parameters into flat buffers through fsdp_tensor_rebind). */
#ifndef FSDP_CORE_TENSOR_IMPL_H
#define FSDP_CORE_TENSOR_IMPL_H

#include <stdatomic.h>

#include "fsdp/tensor.h"

typedef struct fsdp_storage {
    void *data;
    size_t nbytes;
    atomic_int refs; /* handles that point here */
    bool owned;      /* false for fsdp_tensor_from_blob memory */
    fsdp_device device;
} fsdp_storage;

struct fsdp_tensor {
    fsdp_storage *storage;
    int64_t offset; /* elements from the start of storage */
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t numel;
};

/* Makes t a view of base's storage at element `offset`, keeping t's shape and dtype (which
 * must be base's). t's old storage is released. FSDP uses this to point a parameter into
 * its unit's gathered flat buffer and back. */
fsdp_status fsdp_tensor_rebind(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_tensor *base,
                               int64_t offset);

/* numel of a shape; -1 when a dim is negative or ndim out of range. */
int64_t fsdp_shape_numel(int ndim, const int64_t *shape);

#endif
