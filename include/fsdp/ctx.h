/* ctx.h: the per-rank context. Everything a rank owns hangs off its fsdp_ctx (seed, log
 * settings, last error, the stack of running modules), so N ranks can live in one process. */
#ifndef FSDP_CTX_H
#define FSDP_CTX_H

#include <stdarg.h>
#include <stdint.h>

#include "fsdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_ctx fsdp_ctx;

typedef enum fsdp_log_level {
    FSDP_LOG_DEFAULT = 0, /* the FSDP_LOG_LEVEL environment variable, else FSDP_LOG_WARN */
    FSDP_LOG_DEBUG,
    FSDP_LOG_INFO,
    FSDP_LOG_WARN,
    FSDP_LOG_ERROR,
    FSDP_LOG_OFF
} fsdp_log_level;

/* Receives each log line that passes the context's level (no trailing newline). */
typedef void (*fsdp_log_fn)(void *user, fsdp_log_level level, const char *message);

typedef struct fsdp_ctx_options {
    uint64_t seed;            /* parameter-initialisation seed; default 0 */
    fsdp_log_level log_level; /* default FSDP_LOG_DEFAULT */
    fsdp_log_fn log_fn;       /* default: "[fsdp r<rank> LEVEL] message" on stderr */
    void *log_user;           /* passed to log_fn */
    int rank;                 /* this context's rank, used in log lines; default 0 */
} fsdp_ctx_options;

/* Creates a context. opts may be NULL for all defaults. On success *out is owned by the
 * caller and released with fsdp_ctx_free. Fails only with FSDP_ERR_OUT_OF_MEMORY or
 * FSDP_ERR_INVALID_ARGUMENT (out is NULL, or an unknown log level). */
fsdp_status fsdp_ctx_create(const fsdp_ctx_options *opts, fsdp_ctx **out);
void fsdp_ctx_free(fsdp_ctx *ctx); /* NULL does nothing */

uint64_t fsdp_ctx_seed(const fsdp_ctx *ctx);
int fsdp_ctx_rank(const fsdp_ctx *ctx);

/* The message of the most recent failure on this context ("" if none): what went wrong
 * and, where there is one, what to do about it. Valid until the next failing call. */
const char *fsdp_last_error(const fsdp_ctx *ctx);
/* The status of the most recent failure (FSDP_OK if none). A call that succeeds leaves the
 * record as it was (also where it tried something that failed on the way). */
fsdp_status fsdp_last_status(const fsdp_ctx *ctx);
/* Where in libfsdp the most recent failure was raised ("src/core/tensor.c:88"), for bug reports;
 * "" for a failure recorded with fsdp_ctx_set_error. */
const char *fsdp_last_error_origin(const fsdp_ctx *ctx);
/* The way the most recent failure came up, outermost call first and its origin last:
 * "src/comm/world.c:260 -> src/comm/collectives.c:190 -> src/comm/local.c:310". Calls that
 * pass a failure on unchanged add nothing, so the trail may be the origin alone. */
const char *fsdp_last_error_trail(const fsdp_ctx *ctx);
void fsdp_clear_error(fsdp_ctx *ctx);
/* Records a failure on ctx as libfsdp's own functions do: fsdp_last_status(ctx) becomes
 * status and fsdp_last_error(ctx) the printf-style message (origin and trail ""). Returns
 * status, so a function can end with `return fsdp_ctx_set_error(ctx, FSDP_ERR_CONFIG, ...)`.
 * In a rank function, this is the message fsdp_world_run reports ("rank R: <message>") on
 * every backend. status FSDP_OK clears the failure instead. ctx may be NULL. */
fsdp_status fsdp_ctx_set_error(fsdp_ctx *ctx, fsdp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void fsdp_ctx_set_log_level(fsdp_ctx *ctx, fsdp_log_level level);
fsdp_log_level fsdp_ctx_log_level(const fsdp_ctx *ctx);
/* Logs a printf-style message at `level` if it passes the context's level. */
void fsdp_log(fsdp_ctx *ctx, fsdp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void fsdp_vlog(fsdp_ctx *ctx, fsdp_log_level level, const char *fmt, va_list ap);
const char *fsdp_log_level_to_string(fsdp_log_level level);
/* Parses "debug", "info", "warn", "error", "off"; returns FSDP_ERR_INVALID_ARGUMENT otherwise. */
fsdp_status fsdp_log_level_parse(const char *text, fsdp_log_level *out);

#ifdef __cplusplus
}
#endif
#endif
