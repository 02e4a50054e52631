/* clip.c: gradient clipping by global norm over a module's trainable parameters. */
#include <math.h>

#include "core/error.h"
#include "fsdp/optim.h"
#include "kernels/kernels.h"
#include "nn/module_impl.h"

typedef struct norm_acc {
    bool inf; /* max |g| instead of the sum of |g|^2 */
    double acc;
} norm_acc;

static fsdp_status accumulate(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    norm_acc *a = user;
    if (!p->requires_grad) return FSDP_OK;
    const fsdp_kernels_i *k = fsdp_kernels_for(fsdp_tensor_device(p->grad));
    const float *g = fsdp_tensor_f32(p->grad);
    int64_t n = fsdp_tensor_numel(p->grad);
    if (a->inf)
        a->acc = fmax(a->acc, k->max_abs(g, n));
    else
        a->acc += k->sum_squares(g, n);
    return FSDP_OK;
}

static fsdp_status scale(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    if (!p->requires_grad) return FSDP_OK;
    float *g = fsdp_tensor_f32(p->grad);
    fsdp_kernels_for(fsdp_tensor_device(p->grad))
        ->scale(g, g, *(const float *)user, fsdp_tensor_numel(p->grad));
    return FSDP_OK;
}

fsdp_status fsdp_clip_grad_norm(fsdp_ctx *ctx, fsdp_module *m, double max_norm, double norm_type,
                                double *total_norm) {
    if (!(max_norm > 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "clip_grad_norm: max_norm is %g; it must be > 0", max_norm);
    if (norm_type != 2.0 && !isinf(norm_type))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "clip_grad_norm: norm_type %g is not supported; use 2.0 or INFINITY",
                         norm_type);
    norm_acc a = {.inf = isinf(norm_type) != 0};
    FSDP_TRY(fsdp_module_visit_params(ctx, m, accumulate, &a));
    double total = a.inf ? a.acc : sqrt(a.acc);
    if (total_norm) *total_norm = total;
    double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
        float c = (float)coef;
        FSDP_TRY(fsdp_module_visit_params(ctx, m, scale, &c));
    }
    return FSDP_OK;
}
