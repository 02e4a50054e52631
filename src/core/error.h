/* error.h: how libfsdp code reports failure. FSDP_FAIL records a message and its origin
 * (file:line) in the context and returns the status; FSDP_TRY propagates a failure;
 * FSDP_ASSERT aborts on a broken invariant (a libfsdp bug, never bad input). */
#ifndef FSDP_CORE_ERROR_H
#define FSDP_CORE_ERROR_H

#include <stdio.h>
#include <stdlib.h>

#include "fsdp/ctx.h"

/* Records status and a printf-style message in ctx; returns status. ctx may be NULL. */
fsdp_status fsdp_error_set(fsdp_ctx *ctx, fsdp_status status, const char *file, int line,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define FSDP_FAIL(ctx, status, ...) fsdp_error_set((ctx), (status), __FILE__, __LINE__, __VA_ARGS__)

#define FSDP_TRY(expr)                                                                             \
    do {                                                                                           \
        fsdp_status fsdp_try_st_ = (expr);                                                         \
        if (fsdp_try_st_ != FSDP_OK) return fsdp_try_st_;                                          \
    } while (0)

#define FSDP_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "libfsdp: internal invariant broken at %s:%d: %s\n", __FILE__,         \
                    __LINE__, #cond);                                                              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
