/* stream.h: streams and events as small values (c10's Stream and Event): a device plus the
 * handle its record hands out. Every kernel, copy and fill runs on the calling thread's current
 * stream of its device; events order streams against each other and against the host. On the
 * CPU, which runs everything at once, they are no-ops. */
#ifndef FSDP_CORE_STREAM_H
#define FSDP_CORE_STREAM_H

#include <stdbool.h>

#include "fsdp/tensor.h"

/* handle NULL: the calling thread's default stream of the device (its rank's compute stream). */
typedef struct fsdp_stream {
    fsdp_device device;
    void *handle;
} fsdp_stream;

/* handle NULL: an event that was never created, or one on the CPU; it is always complete. */
typedef struct fsdp_event {
    fsdp_device device;
    void *handle;
} fsdp_event;

/* A new stream on device (owned by the caller: fsdp_stream_destroy). */
fsdp_status fsdp_stream_create(fsdp_ctx *ctx, fsdp_device device, fsdp_stream *out);
/* Waits for the stream's queued work, then frees it. A default stream (handle NULL) is kept. */
void fsdp_stream_destroy(fsdp_stream stream);

/* The calling thread's current stream of device. */
fsdp_stream fsdp_stream_current(fsdp_device device);
/* Makes `stream` the calling thread's current stream of its device; returns the previous one,
 * for the caller to restore. */
fsdp_stream fsdp_stream_set_current(fsdp_stream stream);
/* Waits on the host until the stream has finished its queued work. */
fsdp_status fsdp_stream_synchronize(fsdp_ctx *ctx, fsdp_stream stream);

/* A new event on device (owned by the caller: fsdp_event_destroy, NULL-handle safe). */
fsdp_status fsdp_event_create(fsdp_ctx *ctx, fsdp_device device, fsdp_event *out);
void fsdp_event_destroy(fsdp_event event);
/* The event completes when `stream` has passed the work queued on it so far. */
fsdp_status fsdp_event_record(fsdp_ctx *ctx, fsdp_event event, fsdp_stream stream);
/* Work queued on `stream` from now on starts after the event completes (no host wait). */
fsdp_status fsdp_stream_wait(fsdp_ctx *ctx, fsdp_stream stream, fsdp_event event);
/* Waits on the host until the event completes. */
fsdp_status fsdp_event_synchronize(fsdp_ctx *ctx, fsdp_event event);
/* Whether the event has completed, without waiting. */
bool fsdp_event_query(fsdp_event event);

/* Page-locked host memory for copies to and from devices of `type` (plain host memory for the
 * CPU), nbytes > 0, zeroed; a copy from it returns before it is read (core/device.h). Owned by
 * the caller: fsdp_host_free with the same type (NULL does nothing). */
fsdp_status fsdp_host_alloc(fsdp_ctx *ctx, fsdp_device_type type, size_t nbytes, void **out);
void fsdp_host_free(fsdp_device_type type, void *ptr);

#endif
