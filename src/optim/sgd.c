/* sgd.c: SGD with PyTorch's update equations (momentum, dampening, nesterov, weight decay,
 * maximize), one pass over each parameter that reads and writes every value once. */
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/optim.h"
#include "nn/module_impl.h"

typedef struct sgd_slot {
    fsdp_param *param;
    float *momentum_buffer; /* numel floats once momentum is in use, else NULL */
} sgd_slot;

struct fsdp_optimizer {
    fsdp_sgd_options opts;
    sgd_slot *slots;
    int n_slots;
    int64_t steps;
};

/* One SGD update of n elements. On the first step the buffer takes the gradient as is. */
static void sgd_update(float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                       const fsdp_sgd_options *o, bool first) {
    float sign = o->maximize ? -1.0f : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = sign * g[i] + o->weight_decay * p[i];
        if (buf) {
            buf[i] = first ? d : o->momentum * buf[i] + (1.0f - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * buf[i] : buf[i];
        }
        p[i] -= o->lr * d;
    }
}

static fsdp_status count_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    if (p->requires_grad) (*(int *)user)++;
    return FSDP_OK;
}

static fsdp_status collect_param(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)name;
    fsdp_optimizer *opt = user;
    if (p->requires_grad) opt->slots[opt->n_slots++].param = p;
    return FSDP_OK;
}

static fsdp_status check_options(fsdp_ctx *ctx, const fsdp_sgd_options *o) {
    if (!(o->lr > 0.0f))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "SGD: lr is %g; it must be > 0",
                         (double)o->lr);
    if (!(o->momentum >= 0.0f) || !(o->weight_decay >= 0.0f) || !(o->dampening >= 0.0f))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "SGD: momentum %g, dampening %g and weight_decay %g must be >= 0",
                         (double)o->momentum, (double)o->dampening, (double)o->weight_decay);
    if (o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "SGD: nesterov needs momentum > 0 and dampening 0 (got %g and %g)",
                         (double)o->momentum, (double)o->dampening);
    return FSDP_OK;
}

fsdp_status fsdp_sgd_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_sgd_options *opts,
                            fsdp_optimizer **out) {
    if (!m || !opts || !out)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_sgd_create: NULL argument");
    FSDP_TRY(check_options(ctx, opts));
    int n = 0;
    FSDP_TRY(fsdp_module_visit_params(ctx, m, count_param, &n));
    fsdp_optimizer *opt = calloc(1, sizeof *opt);
    sgd_slot *slots = calloc((size_t)(n ? n : 1), sizeof *slots);
    if (!opt || !slots) {
        free(opt);
        free(slots);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an SGD optimizer");
    }
    opt->opts = *opts;
    opt->slots = slots;
    FSDP_TRY(fsdp_module_visit_params(ctx, m, collect_param, opt)); /* cannot fail */
    if (opts->momentum > 0.0f) {
        for (int i = 0; i < opt->n_slots; i++) {
            size_t numel = (size_t)fsdp_tensor_numel(opt->slots[i].param->data);
            opt->slots[i].momentum_buffer = calloc(numel ? numel : 1, sizeof(float));
            if (!opt->slots[i].momentum_buffer) {
                fsdp_optimizer_free(opt);
                return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                                 "cannot allocate SGD momentum buffers");
            }
        }
    }
    *out = opt;
    return FSDP_OK;
}

fsdp_status fsdp_optimizer_step(fsdp_ctx *ctx, fsdp_optimizer *opt) {
    for (int i = 0; i < opt->n_slots; i++) {
        fsdp_param *p = opt->slots[i].param;
        float *data = fsdp_tensor_f32(p->data), *grad = fsdp_tensor_f32(p->grad);
        if (!data || !grad || fsdp_tensor_device(p->data).type != FSDP_DEVICE_CPU)
            return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                             "SGD: parameter '%s' must be an f32 CPU tensor", p->name);
        sgd_update(data, grad, opt->slots[i].momentum_buffer, fsdp_tensor_numel(p->data),
                   &opt->opts, opt->steps == 0);
    }
    opt->steps++;
    return FSDP_OK;
}

fsdp_status fsdp_optimizer_zero_grad(fsdp_ctx *ctx, fsdp_optimizer *opt) {
    for (int i = 0; i < opt->n_slots; i++)
        FSDP_TRY(fsdp_tensor_fill(ctx, opt->slots[i].param->grad, 0.0f));
    return FSDP_OK;
}

void fsdp_optimizer_set_lr(fsdp_optimizer *opt, float lr) {
    opt->opts.lr = lr;
}
float fsdp_optimizer_lr(const fsdp_optimizer *opt) {
    return opt->opts.lr;
}

void fsdp_optimizer_free(fsdp_optimizer *opt) {
    if (!opt) return;
    for (int i = 0; i < opt->n_slots; i++) free(opt->slots[i].momentum_buffer);
    free(opt->slots);
    free(opt);
}
