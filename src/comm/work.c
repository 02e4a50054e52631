/* work.c: the handles of non-blocking collectives (fsdp_comm_work): create, test, wait, free.
 * The call itself starts in collectives.c (fsdp_*_start); a backend entry that has no
 * non-blocking form of the call completes it there, and the work stays idle. A wait is on the host
 * (fsdp_comm_work_wait) or, for a call on device tensors, on a stream (fsdp_comm_work_wait_stream).
 * Tests and waits are timed under the start's comm-debug row. */
#include <stdlib.h>

#include "comm/comm_device.h"
#include "comm/comm_impl.h"
#include "core/error.h"
#include "core/prof_impl.h" // defines: fsdp_prof_now

fsdp_status fsdp_comm_work_create(fsdp_ctx *ctx, fsdp_comm_work **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = calloc(1, sizeof **out);
    if (!*out) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a comm work");
    return FSDP_OK;
}

void fsdp_comm_work_free(fsdp_comm_work *work) {
    if (!work) return;
    if (work->free_state) work->free_state(work->state);
    free(work);
}

bool fsdp_comm_work_pending(const fsdp_comm_work *work) {
    return work && work->pending;
}

/* A wait or test of a pending work is waiting, in the profile (fsdp/profile.h), under the
 * work's op (its call was counted when it started). */
static double prof_begin(const fsdp_ctx *ctx) {
    return ctx->prof_on ? fsdp_prof_now() : 0;
}

static void prof_end(fsdp_ctx *ctx, const fsdp_comm_work *work, double t0) {
    if (ctx->prof_on) ctx->prof.comm_wait_s[work->op] += fsdp_prof_now() - t0;
}

/* The backend of a pending work's group. */
static const fsdp_comm_backend_i *backend_of(const fsdp_comm_work *work) {
    return &work->group->world->backend.iface;
}

/* Completes a pending work by `finish` (the backend's host or stream wait), timed and recorded
 * as its wait. */
static fsdp_status complete(fsdp_ctx *ctx, fsdp_comm_work *work, const fsdp_stream *stream) {
    double t0 = fsdp_comm_debug_clock(ctx), p0 = prof_begin(ctx);
    fsdp_trace_waiting(ctx, work->trace_seq);
    const fsdp_comm_backend_i *be = backend_of(work);
    fsdp_status st = stream && be->work_wait_stream ? be->work_wait_stream(ctx, work, *stream)
                                                    : be->work_wait(ctx, work);
    prof_end(ctx, work, p0);
    fsdp_comm_debug_timed_row(ctx, work->debug_row, work->debug_session, t0);
    fsdp_trace_end(ctx, work->trace_seq, st, false);
    work->pending = false;
    work->group = NULL;
    FSDP_TRY_AT(ctx, st);
    return FSDP_OK;
}

fsdp_status fsdp_comm_work_wait(fsdp_ctx *ctx, fsdp_comm_work *work) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, work);
    if (!work->pending) return FSDP_OK;
    return complete(ctx, work, NULL);
}

fsdp_status fsdp_comm_work_wait_stream(fsdp_ctx *ctx, fsdp_comm_work *work, fsdp_stream stream) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, work);
    if (!work->pending) return FSDP_OK;
    return complete(ctx, work, &stream);
}

fsdp_status fsdp_comm_work_test(fsdp_ctx *ctx, fsdp_comm_work *work, bool *done) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, work);
    FSDP_ARG_NOT_NULL(ctx, done);
    *done = true;
    if (!work->pending) return FSDP_OK;
    double t0 = fsdp_comm_debug_clock(ctx), p0 = prof_begin(ctx);
    fsdp_status st = backend_of(work)->work_test(ctx, work, done);
    prof_end(ctx, work, p0);
    fsdp_comm_debug_timed_row(ctx, work->debug_row, work->debug_session, t0);
    if (st != FSDP_OK || *done) {
        fsdp_trace_end(ctx, work->trace_seq, st, false);
        *done = true;
        work->pending = false;
        work->group = NULL;
    }
    FSDP_TRY_AT(ctx, st);
    return FSDP_OK;
}
