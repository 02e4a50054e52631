/* storage.h: the memory interface of a device type. Core allocates, frees, copies, fills and
 * converts tensor memory only through it, so no core code ever touches device memory with a
 * host instruction. The CPU fills it here (storage.c); a device built into the library
 * (CUDA, in src/kernels/cuda) registers its own when the library loads. */
#ifndef FSDP_CORE_STORAGE_H
#define FSDP_CORE_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/tensor.h"

typedef struct fsdp_storage_i {
    const char *name; /* "cpu", "cuda" */

    /* How many devices of this type the machine has (0 when none can be used). */
    int (*device_count)(void);
    /* nbytes (> 0) of zeroed memory on device `index`, aligned to at least 64 bytes. */
    fsdp_status (*alloc)(fsdp_ctx *ctx, int index, size_t nbytes, void **out);
    void (*free)(int index, void *ptr); /* NULL does nothing */
    /* nbytes from src to dst, where one side is this device type and the other is this type
     * or the CPU (the `dst_dev` / `src_dev` say which). The regions may overlap only when both
     * are on one device. */
    fsdp_status (*copy)(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, const void *src,
                        fsdp_device src_dev, size_t nbytes);
    /* `rows` runs of `width` bytes: dst + r * dst_pitch <- src + r * src_pitch, with the sides
     * placed as for copy. Runs do not overlap. */
    fsdp_status (*copy_2d)(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, size_t dst_pitch,
                           const void *src, fsdp_device src_dev, size_t src_pitch, size_t width,
                           size_t rows);
    /* n elements of `elem_size` bytes (2 or 4) at dst, all set to the bytes at *value (host). */
    fsdp_status (*fill)(fsdp_ctx *ctx, int index, void *dst, const void *value, size_t elem_size,
                        int64_t n);
    /* n elements converted from src_dtype to dst_dtype (round to nearest even), both on
     * device `index`; dst and src do not overlap. */
    fsdp_status (*convert)(fsdp_ctx *ctx, int index, void *dst, fsdp_dtype dst_dtype,
                           const void *src, fsdp_dtype src_dtype, int64_t n);
    /* Waits until the device has finished the work this thread queued on it (optional: NULL
     * for devices that never run asynchronously). */
    fsdp_status (*synchronize)(fsdp_ctx *ctx, int index);
} fsdp_storage_i;

/* The interface of a device type, or NULL when this build has none for it. */
const fsdp_storage_i *fsdp_storage_for(fsdp_device_type type);

/* Installs the interface of a device type (not the CPU's, which is fixed). Called once per type
 * when the library loads, before any tensor of that type exists. */
void fsdp_storage_register(fsdp_device_type type, const fsdp_storage_i *iface);

/* The interface that moves bytes between two devices: the non-CPU side's (dst's when both
 * are devices). */
const fsdp_storage_i *fsdp_storage_between(fsdp_device dst, fsdp_device src);

/* FSDP_OK when device (type and index) can hold tensors in this build on this machine;
 * otherwise FSDP_ERR_DEVICE with a message naming the device and what the build has. */
fsdp_status fsdp_storage_check_device(fsdp_ctx *ctx, fsdp_device device);

#endif
