/* stream.c: streams, events and pinned host memory through the device records
 * (core/device.h): each call goes to the record of its device, and a device without queues
 * (the CPU) makes it a no-op. */
#include <stdlib.h>

#include "core/device.h"
#include "core/error.h"
#include "core/stream.h"

/* The record of an existing device kind with queues, or NULL when its streams are no-ops. */
static const fsdp_device_i *queues_of(fsdp_device device) {
    const fsdp_device_i *d = fsdp_device_for(device.type);
    return d && d->stream_create ? d : NULL;
}

fsdp_status fsdp_stream_create(fsdp_ctx *ctx, fsdp_device device, fsdp_stream *out) {
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = (fsdp_stream){device, NULL};
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, device));
    const fsdp_device_i *d = queues_of(device);
    return d ? d->stream_create(ctx, device.index, &out->handle) : FSDP_OK;
}

void fsdp_stream_destroy(fsdp_stream stream) {
    const fsdp_device_i *d = queues_of(stream.device);
    if (d && stream.handle) d->stream_destroy(stream.device.index, stream.handle);
}

fsdp_stream fsdp_stream_current(fsdp_device device) {
    const fsdp_device_i *d = queues_of(device);
    return (fsdp_stream){device, d ? d->stream_current(device.index) : NULL};
}

fsdp_stream fsdp_stream_set_current(fsdp_stream stream) {
    fsdp_stream previous = fsdp_stream_current(stream.device);
    const fsdp_device_i *d = queues_of(stream.device);
    if (d) d->stream_set_current(stream.device.index, stream.handle);
    return previous;
}

fsdp_status fsdp_stream_synchronize(fsdp_ctx *ctx, fsdp_stream stream) {
    const fsdp_device_i *d = queues_of(stream.device);
    return d ? d->stream_synchronize(ctx, stream.device.index, stream.handle) : FSDP_OK;
}

fsdp_status fsdp_event_create(fsdp_ctx *ctx, fsdp_device device, fsdp_event *out) {
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = (fsdp_event){device, NULL};
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, device));
    const fsdp_device_i *d = queues_of(device);
    return d ? d->event_create(ctx, device.index, &out->handle) : FSDP_OK;
}

void fsdp_event_destroy(fsdp_event event) {
    const fsdp_device_i *d = queues_of(event.device);
    if (d && event.handle) d->event_destroy(event.device.index, event.handle);
}

/* An event and a stream meet only on one device. */
static fsdp_status check_same_device(fsdp_ctx *ctx, fsdp_event event, fsdp_stream stream,
                                     const char *what) {
    if (event.device.type == stream.device.type && event.device.index == stream.device.index)
        return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                     "%s: the event is on %s:%d and the stream on %s:%d; events and streams "
                     "meet only on one device",
                     what, fsdp_device_to_string(event.device), event.device.index,
                     fsdp_device_to_string(stream.device), stream.device.index);
}

fsdp_status fsdp_event_record(fsdp_ctx *ctx, fsdp_event event, fsdp_stream stream) {
    FSDP_TRY_AT(ctx, check_same_device(ctx, event, stream, "fsdp_event_record"));
    const fsdp_device_i *d = queues_of(event.device);
    if (!d || !event.handle) return FSDP_OK;
    return d->event_record(ctx, event.device.index, event.handle, stream.handle);
}

fsdp_status fsdp_stream_wait(fsdp_ctx *ctx, fsdp_stream stream, fsdp_event event) {
    FSDP_TRY_AT(ctx, check_same_device(ctx, event, stream, "fsdp_stream_wait"));
    const fsdp_device_i *d = queues_of(event.device);
    if (!d || !event.handle) return FSDP_OK;
    return d->stream_wait_event(ctx, event.device.index, stream.handle, event.handle);
}

fsdp_status fsdp_event_synchronize(fsdp_ctx *ctx, fsdp_event event) {
    const fsdp_device_i *d = queues_of(event.device);
    if (!d || !event.handle) return FSDP_OK;
    return d->event_synchronize(ctx, event.device.index, event.handle);
}

bool fsdp_event_query(fsdp_event event) {
    const fsdp_device_i *d = queues_of(event.device);
    return !d || !event.handle || d->event_query(event.device.index, event.handle);
}

fsdp_status fsdp_host_alloc(fsdp_ctx *ctx, fsdp_device_type type, size_t nbytes, void **out) {
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = NULL;
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, (fsdp_device){type, 0}));
    return fsdp_device_for(type)->host_alloc(ctx, nbytes, out);
}

void fsdp_host_free(fsdp_device_type type, void *ptr) {
    const fsdp_device_i *d = fsdp_device_for(type);
    if (ptr && d) d->host_free(ptr);
}
