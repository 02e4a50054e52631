/* device.h: the record of a device kind, its three faces (DESIGN.md decision 6): memory
 * (allocate, free, copy, fill, convert, pinned host memory), queues (streams and events) and
 * its operator table; and the registry that holds one record per kind. Core moves tensor memory
 * only through it, so no core code ever touches device memory with a host instruction. The
 * CPU's memory face is core's own (cpu_device.c); the device layer (src/kernels/devices.c)
 * registers the full record of every kind this build has when the library loads. */
#ifndef FSDP_CORE_DEVICE_H
#define FSDP_CORE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/tensor.h"

struct fsdp_kernels_i; // kernels/kernels.h: core stores the table, never calls it

typedef struct fsdp_device_i {
    const char *name; /* "cpu", "cuda", "sim" */

    /* How many devices of this kind the machine has (0 when none can be used), and what a user
     * can do about it, said when an index is out of range. */
    int (*device_count)(void);
    const char *count_note;

    /* ---- memory ---- */

    /* nbytes (> 0) of zeroed memory on device `index`, aligned to at least 64 bytes. The
     * zeroing is queued on the calling thread's current stream of that device. */
    fsdp_status (*alloc)(fsdp_ctx *ctx, int index, size_t nbytes, void **out);
    /* alloc without the zeroing, for memory the caller writes whole before it reads any of it
     * (optional: NULL makes core call alloc). A device that runs asynchronously fills it with a
     * pattern the caller cannot mistake for data if it can (sim: 0xFF bytes, a NaN in f32, bf16
     * and f16, -1 in i32), a debugging aid queued like any work but not counted as a launch,
     * so that a read before the write shows where a GPU would read stale bytes. */
    fsdp_status (*alloc_uninit)(fsdp_ctx *ctx, int index, size_t nbytes, void **out);
    /* NULL does nothing. The memory may be handed out again at once: work queued on the
     * thread's current stream before the free still sees it (the allocator orders reuse by
     * events, as CUDA's caching allocator does). */
    void (*free)(int index, void *ptr);
    /* nbytes from src to dst, where one side is this device kind and the other is this kind
     * or the CPU (the `dst_dev` / `src_dev` say which), queued on the current stream of the
     * device side (dst's when both are devices). The regions may overlap only when both are on
     * one device. A copy to the host returns after the bytes arrived; one from pageable host
     * memory after the bytes were taken (the caller may reuse its buffer); one from pinned host
     * memory (host_alloc) before they are read: the caller must not change them until the
     * stream has passed the copy (an event or a synchronize says when). */
    fsdp_status (*copy)(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, const void *src,
                        fsdp_device src_dev, size_t nbytes);
    /* `rows` runs of `width` bytes: dst + r * dst_pitch <- src + r * src_pitch, with the sides
     * placed and ordered as for copy. Runs do not overlap. */
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
    /* Waits until the calling thread's current stream of device `index` has finished its
     * queued work (optional: NULL for devices that never run asynchronously). */
    fsdp_status (*synchronize)(fsdp_ctx *ctx, int index);

    /* The caching allocator's figures of device `index`, every thread together, and its
     * peaks restarted, its cached blocks given back (optional as a group: NULL on the CPU,
     * which keeps no allocator). */
    void (*memory_stats)(int index, fsdp_device_memory *out);
    void (*memory_reset_peak)(int index);
    void (*empty_cache)(int index);
    /* *out <- what device `index` is, name included (optional: NULL gives the record's name
     * and zeros). */
    void (*properties)(int index, fsdp_device_properties *out);

    /* nbytes (> 0) of zeroed page-locked host memory, which copies to and from this kind of
     * device read and write asynchronously; host_free releases it (NULL does nothing). The CPU
     * hands out plain memory. */
    fsdp_status (*host_alloc)(fsdp_ctx *ctx, size_t nbytes, void **out);
    void (*host_free)(void *ptr);

    /* ---- queues (optional as a group: NULL on devices that run synchronously, whose
     * streams and events are no-ops) ----
     * A stream handle NULL names the calling thread's default stream of the device, which is
     * its rank's compute stream. Every kernel, copy and fill runs on the calling thread's
     * current stream (the default until set otherwise). */
    fsdp_status (*stream_create)(fsdp_ctx *ctx, int index, void **out);
    /* After the stream's queued work has finished. */
    void (*stream_destroy)(int index, void *stream);
    void *(*stream_current)(int index);
    void (*stream_set_current)(int index, void *stream);
    fsdp_status (*stream_synchronize)(fsdp_ctx *ctx, int index, void *stream);
    fsdp_status (*event_create)(fsdp_ctx *ctx, int index, void **out);
    void (*event_destroy)(int index, void *event);
    /* The event completes when the stream has passed the work queued on it before this call.
     * Recording again moves the event; waits refer to the latest record at their call. */
    fsdp_status (*event_record)(fsdp_ctx *ctx, int index, void *event, void *stream);
    /* Work queued on `stream` after this call starts after the event completes; the host does
     * not wait. An event never recorded is complete. */
    fsdp_status (*stream_wait_event)(fsdp_ctx *ctx, int index, void *stream, void *event);
    fsdp_status (*event_synchronize)(fsdp_ctx *ctx, int index, void *event);
    /* Whether the event has completed, without waiting. */
    bool (*event_query)(int index, void *event);

    /* ---- kernels ---- */

    /* The operator table of this kind (kernels/kernels.h), for the calling thread. */
    const struct fsdp_kernels_i *(*kernels)(void);
} fsdp_device_i;

/* The record of a device kind, or NULL when this build has none for it. */
const fsdp_device_i *fsdp_device_for(fsdp_device_type type);

/* The CPU's memory face (cpu_device.c): the device layer completes it with the CPU's kernels
 * and registers the whole. */
const fsdp_device_i *fsdp_device_cpu_memory(void);

/* Installs the record of a device kind. Called when the library loads, before any tensor of
 * that kind exists (src/kernels/devices.c). */
void fsdp_device_register(fsdp_device_type type, const fsdp_device_i *record);

/* The record that moves bytes between two devices: the non-CPU side's (dst's when both are
 * devices). */
const fsdp_device_i *fsdp_device_between(fsdp_device dst, fsdp_device src);

/* FSDP_OK when device (kind and index) can hold tensors in this build on this machine;
 * otherwise FSDP_ERR_DEVICE with a message naming the device and what the build has. */
fsdp_status fsdp_device_check(fsdp_ctx *ctx, fsdp_device device);

#endif
