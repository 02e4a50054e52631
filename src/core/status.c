/* status.c: the names of the status codes, and the failure a context records: its message,
 * its origin (file:line) and the trail of calls it passed on the way up (core/error.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/ctx_impl.h"
#include "core/error.h"
#include "fsdp/status.h"

const char *fsdp_status_to_string(fsdp_status status) {
    static const char *const names[FSDP_STATUS_COUNT] = {
        [FSDP_OK] = "FSDP_OK",
        [FSDP_ERR_INVALID_ARGUMENT] = "FSDP_ERR_INVALID_ARGUMENT",
        [FSDP_ERR_SHAPE] = "FSDP_ERR_SHAPE",
        [FSDP_ERR_DTYPE] = "FSDP_ERR_DTYPE",
        [FSDP_ERR_DEVICE] = "FSDP_ERR_DEVICE",
        [FSDP_ERR_OUT_OF_MEMORY] = "FSDP_ERR_OUT_OF_MEMORY",
        [FSDP_ERR_IO] = "FSDP_ERR_IO",
        [FSDP_ERR_CONFIG] = "FSDP_ERR_CONFIG",
        [FSDP_ERR_NOT_FOUND] = "FSDP_ERR_NOT_FOUND",
        [FSDP_ERR_STATE] = "FSDP_ERR_STATE",
        [FSDP_ERR_UNSUPPORTED] = "FSDP_ERR_UNSUPPORTED",
        [FSDP_ERR_COMM] = "FSDP_ERR_COMM",
        [FSDP_ERR_TIMEOUT] = "FSDP_ERR_TIMEOUT",
        [FSDP_ERR_INTERNAL] = "FSDP_ERR_INTERNAL",
    };
    if ((int)status < 0 || status >= FSDP_STATUS_COUNT) return "FSDP_ERR_UNKNOWN";
    return names[status];
}

/* ---- reading and clearing ---- */

const char *fsdp_last_error(const fsdp_ctx *ctx) {
    return ctx ? ctx->error.message : "";
}
fsdp_status fsdp_last_status(const fsdp_ctx *ctx) {
    return ctx ? ctx->error.status : FSDP_OK;
}
const char *fsdp_last_error_origin(const fsdp_ctx *ctx) {
    return ctx ? ctx->error.origin : "";
}
const char *fsdp_last_error_trail(const fsdp_ctx *ctx) {
    return ctx ? ctx->error.trail : "";
}

void fsdp_clear_error(fsdp_ctx *ctx) {
    if (!ctx) return;
    ctx->error.status = FSDP_OK;
    ctx->error.message[0] = ctx->error.origin[0] = ctx->error.trail[0] = '\0';
}

const fsdp_error_record *fsdp_error_of(const fsdp_ctx *ctx) {
    return &ctx->error;
}
void fsdp_error_save(const fsdp_ctx *ctx, fsdp_error_record *out) {
    *out = ctx->error;
}
void fsdp_error_restore(fsdp_ctx *ctx, const fsdp_error_record *rec) {
    ctx->error = *rec;
}

/* ---- recording ---- */

/* "src/core/tensor.c" from whatever absolute path the compiler saw: the path from the first
 * of the repository's top-level source folders. */
static const char *source_relative(const char *file) {
    static const char *const roots[] = {"src/", "tests/", "tools/", "examples/", "bench/"};
    const char *best = NULL;
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        for (const char *s = strstr(file, roots[i]); s; s = strstr(s + 1, roots[i])) {
            if (s != file && s[-1] != '/') continue;
            if (!best || s < best) best = s;
            break;
        }
    }
    return best ? best : file;
}

static void record(fsdp_ctx *ctx, fsdp_status status, const char *file, int line, const char *fmt,
                   va_list ap) {
    fsdp_error_record *e = &ctx->error;
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    if (file)
        snprintf(e->origin, sizeof e->origin, "%s:%d", source_relative(file), line);
    else
        e->origin[0] = '\0';
    snprintf(e->trail, sizeof e->trail, "%s", e->origin);
    e->status = status;
    fsdp_log(ctx, FSDP_LOG_DEBUG, "%s at %s: %s", fsdp_status_to_string(status),
             e->origin[0] ? e->origin : "(the caller)", e->message);
}

fsdp_status fsdp_error_set(fsdp_ctx *ctx, fsdp_status status, const char *file, int line,
                           const char *fmt, ...) {
    if (!ctx) return status;
    va_list ap;
    va_start(ap, fmt);
    record(ctx, status, file, line, fmt, ap);
    va_end(ap);
    return status;
}

fsdp_status fsdp_ctx_set_error(fsdp_ctx *ctx, fsdp_status status, const char *fmt, ...) {
    if (!ctx) return status;
    if (status == FSDP_OK || !fmt) {
        fsdp_clear_error(ctx);
        if (status != FSDP_OK) ctx->error.status = status;
        return status;
    }
    va_list ap;
    va_start(ap, fmt);
    record(ctx, status, NULL, 0, fmt, ap);
    va_end(ap);
    return status;
}

/* Puts `prefix` in front of the text in buf (size bytes), cutting the end when it is full. */
static void prepend(char *buf, size_t size, const char *prefix) {
    size_t p = strlen(prefix), n = strlen(buf);
    if (p >= size) p = size - 1;
    if (p + n >= size) n = size - 1 - p;
    memmove(buf + p, buf, n);
    memcpy(buf, prefix, p);
    buf[p + n] = '\0';
}

fsdp_status fsdp_error_hop(fsdp_ctx *ctx, fsdp_status status, const char *file, int line,
                           const char *func, const char *fmt, ...) {
    if (!ctx || status == FSDP_OK) return status;
    fsdp_error_record *e = &ctx->error;
    if (e->status == FSDP_OK) { /* the callee returned a failure it did not record */
        snprintf(e->message, sizeof e->message, "%s", fsdp_status_to_string(status));
        e->origin[0] = e->trail[0] = '\0';
    }
    e->status = status;
    if (fmt) {
        char context[FSDP_ERROR_MAX];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(context, sizeof context - 2, fmt, ap);
        va_end(ap);
        if (n > 0 && e->message[0]) strcat(context, ": ");
        prepend(e->message, sizeof e->message, context);
    }
    /* A trail that is full keeps its outermost hops and its origin: inner hops give way to
     * "...". */
    char trail[FSDP_TRAIL_MAX + FSDP_ORIGIN_MAX + 512];
    snprintf(trail, sizeof trail, "%s:%d%s%s%s%s%s", source_relative(file), line, func ? " (" : "",
             func ? func : "", func ? ")" : "", e->trail[0] ? " -> " : "", e->trail);
    const size_t origin_len = strlen(e->origin);
    while (strlen(trail) >= sizeof e->trail) {
        /* Drop the innermost hop before "... -> origin" (or before the origin). */
        size_t len = strlen(trail);
        char *end = trail + len - origin_len; /* the origin */
        char *cut = end;
        const char *marker = " -> ... -> ";
        size_t mlen = strlen(marker);
        if ((size_t)(end - trail) >= mlen && strncmp(end - mlen, marker, mlen) == 0)
            cut = end - mlen;
        else
            cut = end - 4; /* " -> " */
        char *prev = cut - 1;
        while (prev > trail && strncmp(prev, " -> ", 4) != 0) prev--;
        if (prev == trail) break;
        memmove(prev + mlen, end, origin_len + 1);
        memcpy(prev, marker, mlen);
    }
    size_t n = strlen(trail) < sizeof e->trail ? strlen(trail) : sizeof e->trail - 1;
    memcpy(e->trail, trail, n);
    e->trail[n] = '\0';
    return status;
}
