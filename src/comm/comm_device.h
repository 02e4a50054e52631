/* comm_device.h: the collectives' face for device tensors that the layers above comm use
 * besides the public calls (fsdp/comm.h): the wait of a work on a stream. A collective on
 * device tensors runs on the rank's communication stream (fsdp_ctx_comm_stream); its blocking
 * form makes the caller's current stream wait for it, its non-blocking form leaves that to the
 * work (docs/device.md). */
#ifndef FSDP_COMM_DEVICE_H
#define FSDP_COMM_DEVICE_H

#include "core/stream.h"
#include "fsdp/comm.h"

/* Completes the work without blocking the host where its call ran on a device: work queued on
 * `stream` from now on runs after the call, and the work is idle. A call on host tensors (or a
 * backend without stream waits) is waited for on the host, as fsdp_comm_work_wait. An idle
 * work returns FSDP_OK at once. A failure of the call is reported here, as by the host wait. */
fsdp_status fsdp_comm_work_wait_stream(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream);

#endif
