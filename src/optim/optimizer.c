/* optimizer.c: optimizers over a module's parameters. Each parameter that requires a gradient
 * gets a slot with its state tensors (momentum buffer; or exp_avg, exp_avg_sq and, with amsgrad,
 * max_exp_avg_sq), allocated once at creation; a step runs the fused update of update.c over
 * every slot. The states are enumerated by parameter name for checkpoints. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "nn/module_impl.h"
#include "optim/update.h"

#define MAX_STATE 3

typedef enum optim_kind { OPTIM_SGD, OPTIM_ADAM, OPTIM_ADAMW } optim_kind;

typedef struct optim_slot {
    fsdp_param *param;
    char *name;                    /* fully qualified from the root */
    fsdp_tensor *state[MAX_STATE]; /* the local data's shape, zeroed; NULL when unused */
} optim_slot;

struct fsdp_optimizer {
    optim_kind kind;
    fsdp_sgd_options sgd;
    fsdp_adam_options adam;
    optim_slot *slots;
    int n_slots;
    int n_state; /* state tensors per slot */
    int64_t steps;
};

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

void fsdp_optimizer_free(fsdp_optimizer *opt) {
    if (!opt) return;
    for (int i = 0; i < opt->n_slots; i++) {
        free(opt->slots[i].name);
        for (int s = 0; s < MAX_STATE; s++) fsdp_tensor_free(opt->slots[i].state[s]);
    }
    free(opt->slots);
    free(opt);
}

/* An optimizer over m's trainable parameters with n_state zeroed state arrays per parameter. */
static fsdp_status optimizer_new(fsdp_ctx *ctx, fsdp_module *m, optim_kind kind, int n_state,
                                 fsdp_optimizer **out) {
    int n = 0;
    FSDP_TRY(fsdp_module_visit_params(ctx, m, count_param, &n));
    fsdp_optimizer *opt = calloc(1, sizeof *opt);
    if (opt) opt->slots = calloc((size_t)(n ? n : 1), sizeof *opt->slots);
    if (!opt || !opt->slots) {
        fsdp_optimizer_free(opt);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate an optimizer");
    }
    opt->kind = kind;
    opt->n_state = n_state;
    fsdp_module_visit_params(ctx, m, collect_param, opt); /* cannot fail */
    fsdp_status st = FSDP_OK;
    for (int i = 0; st == FSDP_OK && i < opt->n_slots; i++) {
        optim_slot *slot = &opt->slots[i];
        const char *fqn = fsdp_module_fqn(slot->param->module);
        size_t len = strlen(fqn) + strlen(slot->param->name) + 2;
        slot->name = malloc(len);
        if (!slot->name)
            st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a parameter name");
        else
            snprintf(slot->name, len, "%s%s%s", fqn, *fqn ? "." : "", slot->param->name);
        for (int s = 0; st == FSDP_OK && s < n_state; s++)
            st = fsdp_tensor_create_like(ctx, slot->param->data, &slot->state[s]);
    }
    if (st != FSDP_OK) {
        fsdp_optimizer_free(opt);
        return st;
    }
    *out = opt;
    return FSDP_OK;
}

static fsdp_status check_sgd(fsdp_ctx *ctx, const fsdp_sgd_options *o) {
    if (!(o->lr > 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "SGD: lr is %g; it must be > 0", o->lr);
    if (!(o->momentum >= 0.0) || !(o->weight_decay >= 0.0) || !(o->dampening >= 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "SGD: momentum %g, dampening %g and weight_decay %g must be >= 0",
                         o->momentum, o->dampening, o->weight_decay);
    if (o->nesterov && (o->momentum <= 0.0 || o->dampening != 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "SGD: nesterov needs momentum > 0 and dampening 0 (got %g and %g)",
                         o->momentum, o->dampening);
    return FSDP_OK;
}

fsdp_status fsdp_sgd_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_sgd_options *opts,
                            fsdp_optimizer **out) {
    if (!m || !opts || !out)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_sgd_create: NULL argument");
    FSDP_TRY(check_sgd(ctx, opts));
    FSDP_TRY(optimizer_new(ctx, m, OPTIM_SGD, opts->momentum > 0.0 ? 1 : 0, out));
    (*out)->sgd = *opts;
    return FSDP_OK;
}

/* Fills PyTorch's defaults into the zero fields and checks the ranges. */
static fsdp_status adam_options(fsdp_ctx *ctx, const char *name, const fsdp_adam_options *in,
                                fsdp_adam_options *o) {
    *o = *in;
    if (o->beta1 == 0.0) o->beta1 = 0.9;
    if (o->beta2 == 0.0) o->beta2 = 0.999;
    if (o->eps == 0.0) o->eps = 1e-8;
    if (!(o->lr > 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: lr is %g; it must be > 0", name,
                         o->lr);
    if (!(o->beta1 > 0.0 && o->beta1 < 1.0) || !(o->beta2 > 0.0 && o->beta2 < 1.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: betas (%g, %g) must lie in [0, 1) (0 selects the default)", name,
                         o->beta1, o->beta2);
    if (!(o->eps > 0.0) || !(o->weight_decay >= 0.0))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "%s: eps %g must be > 0 and weight_decay %g >= 0", name, o->eps,
                         o->weight_decay);
    return FSDP_OK;
}

static fsdp_status adam_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                               optim_kind kind, fsdp_optimizer **out) {
    const char *name = kind == OPTIM_ADAMW ? "AdamW" : "Adam";
    if (!m || !opts || !out)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "%s: NULL argument", name);
    fsdp_adam_options o;
    FSDP_TRY(adam_options(ctx, name, opts, &o));
    FSDP_TRY(optimizer_new(ctx, m, kind, o.amsgrad ? 3 : 2, out));
    (*out)->adam = o;
    return FSDP_OK;
}

fsdp_status fsdp_adam_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                             fsdp_optimizer **out) {
    return adam_create(ctx, m, opts, OPTIM_ADAM, out);
}

fsdp_status fsdp_adamw_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                              fsdp_optimizer **out) {
    return adam_create(ctx, m, opts, OPTIM_ADAMW, out);
}

fsdp_status fsdp_optimizer_step(fsdp_ctx *ctx, fsdp_optimizer *opt) {
    for (int i = 0; i < opt->n_slots; i++) {
        optim_slot *s = &opt->slots[i];
        float *data = fsdp_tensor_f32(s->param->data), *grad = fsdp_tensor_f32(s->param->grad);
        if (!data || !grad || fsdp_tensor_device(s->param->data).type != FSDP_DEVICE_CPU)
            return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                             "optimizer: parameter '%s' must be an f32 CPU tensor", s->param->name);
        int64_t n = fsdp_tensor_numel(s->param->data);
        if (opt->n_state > 0 && fsdp_tensor_numel(s->state[0]) != n)
            return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                             "optimizer: parameter '%s' has %lld elements but its state was made "
                             "for %lld; create the optimizer after parallelizing or sharding "
                             "the model",
                             s->name, (long long)n, (long long)fsdp_tensor_numel(s->state[0]));
        float *st[MAX_STATE];
        for (int k = 0; k < MAX_STATE; k++)
            st[k] = s->state[k] ? fsdp_tensor_f32(s->state[k]) : NULL;
        if (opt->kind == OPTIM_SGD)
            fsdp_sgd_update(data, grad, st[0], n, &opt->sgd, opt->steps == 0);
        else
            fsdp_adam_update(data, grad, st[0], st[1], st[2], n, &opt->adam,
                             opt->kind == OPTIM_ADAMW, opt->steps + 1);
    }
    opt->steps++;
    return FSDP_OK;
}

fsdp_status fsdp_optimizer_zero_grad(fsdp_ctx *ctx, fsdp_optimizer *opt) {
    for (int i = 0; i < opt->n_slots; i++)
        FSDP_TRY(fsdp_tensor_fill(ctx, opt->slots[i].param->grad, 0.0f));
    return FSDP_OK;
}

int64_t fsdp_optimizer_steps(const fsdp_optimizer *opt) {
    return opt->steps;
}

void fsdp_optimizer_set_lr(fsdp_optimizer *opt, double lr) {
    if (opt->kind == OPTIM_SGD)
        opt->sgd.lr = lr;
    else
        opt->adam.lr = lr;
}

double fsdp_optimizer_lr(const fsdp_optimizer *opt) {
    return opt->kind == OPTIM_SGD ? opt->sgd.lr : opt->adam.lr;
}

void fsdp_optimizer_set_steps(fsdp_optimizer *opt, int64_t steps) {
    opt->steps = steps;
}

const char *fsdp_optim_state_kind_to_string(fsdp_optim_state_kind kind) {
    static const char *const names[] = {"momentum_buffer", "exp_avg", "exp_avg_sq",
                                        "max_exp_avg_sq"};
    return (int)kind >= 0 && kind < FSDP_OPTIM_STATE_KIND_COUNT ? names[kind] : "unknown";
}

int fsdp_optimizer_num_states(const fsdp_optimizer *opt) {
    return opt->n_slots * opt->n_state;
}

fsdp_status fsdp_optimizer_get_state(fsdp_ctx *ctx, const fsdp_optimizer *opt, int i,
                                     fsdp_optim_state *out) {
    if (!opt || !out)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_optimizer_get_state: NULL argument");
    int n = fsdp_optimizer_num_states(opt);
    if (i < 0 || i >= n)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "optimizer state %d does not exist; this optimizer has %d (0..%d)", i, n,
                         n - 1);
    const optim_slot *s = &opt->slots[i / opt->n_state];
    int k = i % opt->n_state;
    *out = (fsdp_optim_state){
        .param_name = s->name,
        .param = s->param,
        .kind = opt->kind == OPTIM_SGD ? FSDP_OPTIM_MOMENTUM_BUFFER
                                       : (fsdp_optim_state_kind)(FSDP_OPTIM_EXP_AVG + k),
        .value = s->state[k],
        .spec = fsdp_param_dtensor_spec(s->param),
        .step = opt->steps,
    };
    return FSDP_OK;
}
