/* ctx.c: the per-rank context: creation, logging and the module scope stack (the failure a
 * context records lives in status.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/ctx_impl.h"
#include "core/device.h" // defines: fsdp_device_check
#include "core/error.h"

static const char *const level_names[] = {"default", "debug", "info", "warn", "error", "off"};

const char *fsdp_log_level_to_string(fsdp_log_level level) {
    if ((int)level < 0 || level > FSDP_LOG_OFF) return "unknown";
    return level_names[level];
}

fsdp_status fsdp_log_level_parse(const char *text, fsdp_log_level *out) {
    FSDP_ARG_NOT_NULL(NULL, text);
    FSDP_ARG_NOT_NULL(NULL, out);
    for (int l = FSDP_LOG_DEBUG; l <= FSDP_LOG_OFF; l++) {
        if (strcasecmp(text, level_names[l]) == 0) {
            *out = (fsdp_log_level)l;
            return FSDP_OK;
        }
    }
    return FSDP_ERR_INVALID_ARGUMENT;
}

static fsdp_log_level level_from_env(void) {
    fsdp_log_level level = FSDP_LOG_WARN;
    const char *env = getenv("FSDP_LOG_LEVEL");
    if (env && fsdp_log_level_parse(env, &level) != FSDP_OK) level = FSDP_LOG_WARN;
    return level;
}

/* The rank this thread runs as (-1: none); see fsdp_log_thread_rank_swap. */
static _Thread_local int thread_rank = -1;

int fsdp_log_thread_rank_swap(int rank) {
    int previous = thread_rank;
    thread_rank = rank;
    return previous;
}

static void log_to_stderr(void *user, fsdp_log_level level, const char *message) {
    const fsdp_ctx *ctx = user;
    int rank = thread_rank >= 0 ? thread_rank : ctx->rank;
    fprintf(stderr, "[fsdp r%d %s] %s\n", rank, fsdp_log_level_to_string(level), message);
}

fsdp_status fsdp_ctx_create(const fsdp_ctx_options *opts, fsdp_ctx **out) {
    FSDP_ARG_NOT_NULL(NULL, out);
    *out = NULL;
    fsdp_ctx_options o = opts ? *opts : (fsdp_ctx_options){0};
    if ((int)o.log_level < 0 || o.log_level > FSDP_LOG_OFF) return FSDP_ERR_INVALID_ARGUMENT;
    fsdp_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return FSDP_ERR_OUT_OF_MEMORY;
    ctx->seed = o.seed;
    ctx->rank = o.rank;
    ctx->device = FSDP_CPU;
    ctx->comm_stream = (fsdp_stream){FSDP_CPU, NULL};
    ctx->log_level = o.log_level == FSDP_LOG_DEFAULT ? level_from_env() : o.log_level;
    ctx->log_fn = o.log_fn ? o.log_fn : log_to_stderr;
    ctx->log_user = o.log_fn ? o.log_user : ctx;
    *out = ctx;
    return FSDP_OK;
}

void fsdp_ctx_free(fsdp_ctx *ctx) {
    if (ctx && ctx->prof_on) fsdp_profile_stop(ctx);
    if (ctx && ctx->comm_release) ctx->comm_release(ctx->comm);
    if (ctx) fsdp_stream_destroy(ctx->comm_stream);
    free(ctx);
}

fsdp_status fsdp_ctx_set_device(fsdp_ctx *ctx, fsdp_device device) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, device));
    if (device.type == ctx->device.type && device.index == ctx->device.index) return FSDP_OK;
    fsdp_stream_destroy(ctx->comm_stream); // after the work queued on it
    ctx->comm_stream = (fsdp_stream){device, NULL};
    ctx->device = device;
    return FSDP_OK;
}

fsdp_device fsdp_ctx_device(const fsdp_ctx *ctx) {
    return ctx->device;
}

fsdp_stream fsdp_ctx_compute_stream(const fsdp_ctx *ctx) {
    return (fsdp_stream){ctx->device, NULL};
}

fsdp_status fsdp_ctx_comm_stream(fsdp_ctx *ctx, fsdp_stream *out) {
    if (!ctx->comm_stream.handle && ctx->device.type != FSDP_DEVICE_CPU)
        FSDP_TRY_AT(ctx, fsdp_stream_create(ctx, ctx->device, &ctx->comm_stream));
    *out = ctx->comm_stream;
    return FSDP_OK;
}

uint64_t fsdp_ctx_seed(const fsdp_ctx *ctx) {
    return ctx->seed;
}
int fsdp_ctx_rank(const fsdp_ctx *ctx) {
    return ctx->rank;
}

void fsdp_ctx_set_log_level(fsdp_ctx *ctx, fsdp_log_level level) {
    ctx->log_level = level == FSDP_LOG_DEFAULT ? level_from_env() : level;
}

fsdp_log_level fsdp_ctx_log_level(const fsdp_ctx *ctx) {
    return ctx->log_level;
}

void fsdp_vlog(fsdp_ctx *ctx, fsdp_log_level level, const char *fmt, va_list ap) {
    if (!ctx || level < ctx->log_level || level >= FSDP_LOG_OFF) return;
    char message[2048];
    vsnprintf(message, sizeof message, fmt, ap);
    ctx->log_fn(ctx->log_user, level, message);
}

void fsdp_log(fsdp_ctx *ctx, fsdp_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fsdp_vlog(ctx, level, fmt, ap);
    va_end(ap);
}

void fsdp_ctx_scope_push(fsdp_ctx *ctx, const char *name) {
    if (ctx->scope_depth < FSDP_SCOPE_MAX) ctx->scope[ctx->scope_depth] = name;
    ctx->scope_depth++;
}

void fsdp_ctx_scope_pop(fsdp_ctx *ctx) {
    FSDP_ASSERT(ctx->scope_depth > 0);
    ctx->scope_depth--;
}

const char *fsdp_ctx_scope_top(const fsdp_ctx *ctx) {
    if (ctx->scope_depth == 0) return "";
    int top = ctx->scope_depth < FSDP_SCOPE_MAX ? ctx->scope_depth : FSDP_SCOPE_MAX;
    return ctx->scope[top - 1];
}
