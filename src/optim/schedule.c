/* schedule.c: learning-rate schedules: constant, linear warmup, and linear warmup followed by
 * cosine decay to a floor (the shape of the usual "cosine with warmup" schedule, held at the
 * floor after the last step instead of rising again). */
#include <math.h>

#include "core/error.h"
#include "fsdp/optim.h"

#define PI 3.14159265358979323846

fsdp_status fsdp_lr_schedule_check(fsdp_ctx *ctx, const fsdp_lr_schedule *s) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, s);
    if ((int)s->kind < FSDP_LR_CONSTANT || s->kind > FSDP_LR_COSINE)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "lr schedule: unknown kind %d; use FSDP_LR_CONSTANT, "
                         "FSDP_LR_LINEAR_WARMUP or FSDP_LR_COSINE",
                         (int)s->kind);
    if (!(s->base_lr > 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "lr schedule: base_lr is %g; it must be > 0", s->base_lr);
    if (s->warmup_steps < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "lr schedule: warmup_steps is %lld; it must be >= 0",
                         (long long)s->warmup_steps);
    if (s->kind == FSDP_LR_COSINE && s->total_steps <= s->warmup_steps)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "lr schedule: cosine needs total_steps (%lld) > warmup_steps (%lld)",
                         (long long)s->total_steps, (long long)s->warmup_steps);
    if (s->kind == FSDP_LR_COSINE && !(s->min_lr >= 0.0 && s->min_lr <= s->base_lr))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "lr schedule: min_lr %g must lie in [0, base_lr = %g]", s->min_lr,
                         s->base_lr);
    return FSDP_OK;
}

double fsdp_lr_at(const fsdp_lr_schedule *s, int64_t step) {
    if (s->kind == FSDP_LR_CONSTANT) return s->base_lr;
    if (step < s->warmup_steps) return s->base_lr * (double)step / (double)s->warmup_steps;
    if (s->kind == FSDP_LR_LINEAR_WARMUP) return s->base_lr;
    double progress = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    if (progress > 1.0) progress = 1.0;
    return s->min_lr + (s->base_lr - s->min_lr) * 0.5 * (1.0 + cos(PI * progress));
}
