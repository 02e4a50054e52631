/* error.h: how libfsdp code reports failure. FSDP_FAIL records a message and its origin
 * (file:line) in the context and returns the status; FSDP_TRY propagates a failure;
 * FSDP_TRY_AT and FSDP_TRYF propagate it and add a hop to its trail; FSDP_ARG_NOT_NULL refuses a
 * NULL required argument of a public function; FSDP_ASSERT aborts on a broken invariant (a
 * libfsdp bug, never bad input). */
#ifndef FSDP_CORE_ERROR_H
#define FSDP_CORE_ERROR_H

#include <stdio.h>
#include <stdlib.h>

#include "fsdp/ctx.h"

#define FSDP_ERROR_MAX  2048
#define FSDP_ORIGIN_MAX 128
#define FSDP_TRAIL_MAX  1024

/* The failure a context records (fsdp_last_error and friends). A failure starts at its
 * origin (FSDP_FAIL: message, origin and a trail that is the origin alone); every hop on the
 * way up (FSDP_TRY_AT, FSDP_TRYF) puts its file:line in front of the trail, and FSDP_TRYF also
 * puts its context in front of the message:
 *   message "loading 'fc1.weight': all_gather on group 'dp' ...: the input is (3, 2) ..."
 *   trail   "src/dp/unit.c:80 -> src/comm/collectives.c:190 -> src/comm/local.c:310"
 *   origin  "src/comm/local.c:310" */
typedef struct fsdp_error_record {
    fsdp_status status;
    char message[FSDP_ERROR_MAX];
    char origin[FSDP_ORIGIN_MAX];
    char trail[FSDP_TRAIL_MAX];
} fsdp_error_record;

/* Records status and a printf-style message in ctx, raised at file:line; returns status.
 * ctx may be NULL. */
fsdp_status fsdp_error_set(fsdp_ctx *ctx, fsdp_status status, const char *file, int line,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A failure `status` passing file:line in function `func` on its way up: "file:line (func)"
 * goes in front of the trail and, when fmt is not NULL, "<fmt>: " in front of the message. A
 * callee that returned a failure without recording one gets the status's name as its message.
 * Returns status. */
fsdp_status fsdp_error_hop(fsdp_ctx *ctx, fsdp_status status, const char *file, int line,
                           const char *func, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Copies the context's failure out and back (a call that must fail with its own failure
 * after a step that may record another). */
void fsdp_error_save(const fsdp_ctx *ctx, fsdp_error_record *out);
void fsdp_error_restore(fsdp_ctx *ctx, const fsdp_error_record *rec);
/* The context's failure, read-only (never NULL for a non-NULL ctx). */
const fsdp_error_record *fsdp_error_of(const fsdp_ctx *ctx);

#define FSDP_FAIL(ctx, status, ...) fsdp_error_set((ctx), (status), __FILE__, __LINE__, __VA_ARGS__)

/* Returns the status of expr when it fails, as it is: only for code that has no context to
 * record a hop in (every relay that has one uses FSDP_TRY_AT, so a trail has a line per hop). */
#define FSDP_TRY(expr)                                                                             \
    do {                                                                                           \
        fsdp_status fsdp_try_st_ = (expr);                                                         \
        if (fsdp_try_st_ != FSDP_OK) return fsdp_try_st_;                                          \
    } while (0)

/* `st` (an fsdp_status, checked at compile time), adding this file:line and function to the
 * failure's trail when it is one: for a relay that cleans up before it passes a failure on
 * (`return FSDP_PASS(ctx, st);`). */
#define FSDP_PASS(ctx, st)                                                                         \
    fsdp_error_hop((ctx), _Generic((st), fsdp_status : (st)), __FILE__, __LINE__, __func__, NULL)

/* Returns the status of expr when it fails, adding this file:line and function to the failure's
 * trail: the library's way of passing a failure up. */
#define FSDP_TRY_AT(ctx, expr)                                                                     \
    do {                                                                                           \
        fsdp_status fsdp_try_st_ = (expr);                                                         \
        if (fsdp_try_st_ != FSDP_OK)                                                               \
            return fsdp_error_hop((ctx), fsdp_try_st_, __FILE__, __LINE__, __func__, NULL);        \
    } while (0)

/* Returns the status of expr when it fails, adding this file:line to the trail and the
 * printf-style context in front of the message ("loading 'fc1.weight': <the message>"). */
#define FSDP_TRYF(ctx, expr, ...)                                                                  \
    do {                                                                                           \
        fsdp_status fsdp_try_st_ = (expr);                                                         \
        if (fsdp_try_st_ != FSDP_OK)                                                               \
            return fsdp_error_hop((ctx), fsdp_try_st_, __FILE__, __LINE__, __func__, __VA_ARGS__); \
    } while (0)

/* The entry check of a public function (docs/api.md, "NULL arguments"): when the required
 * pointer argument `arg` is NULL, records "<function>: <arg> is NULL ..." in ctx and returns
 * FSDP_ERR_INVALID_ARGUMENT. One line per argument, ctx first: FSDP_ARG_NOT_NULL(ctx, ctx)
 * returns the status alone, as a NULL context has nowhere to keep a message. */
#define FSDP_ARG_NOT_NULL(ctx, arg) FSDP_ARG_NOT_NULL_AS(ctx, arg, arg)
/* The same for a parameter whose definition names it differently from the public header:
 * the message names `name`, as the header does. */
#define FSDP_ARG_NOT_NULL_AS(ctx, arg, name)                                                       \
    do {                                                                                           \
        if ((arg) == NULL)                                                                         \
            return fsdp_error_set((ctx), FSDP_ERR_INVALID_ARGUMENT, __FILE__, __LINE__,            \
                                  "%s: %s is NULL (a required argument)", __func__, #name);        \
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
