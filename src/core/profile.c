/* profile.c: fsdp_profile_start/stop/read. The running profile is a thread-local pointer
 * into the context that started it, so the kernel table (which has no context) can find it. */
#include <string.h>

#include "core/ctx_impl.h"
#include "core/error.h"
#include "core/prof_impl.h"

static _Thread_local fsdp_profile *current;

fsdp_profile *fsdp_prof_current(void) {
    return current;
}

fsdp_status fsdp_profile_start(fsdp_ctx *ctx) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    memset(&ctx->prof, 0, sizeof ctx->prof);
    ctx->prof_on = true;
    current = &ctx->prof;
    return FSDP_OK;
}

fsdp_status fsdp_profile_stop(fsdp_ctx *ctx) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    ctx->prof_on = false;
    if (current == &ctx->prof) current = NULL;
    return FSDP_OK;
}

fsdp_status fsdp_profile_read(fsdp_ctx *ctx, fsdp_profile *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    *out = ctx->prof;
    return FSDP_OK;
}
