/* optim.h: optimizers over a module's parameters: SGD, Adam and AdamW with PyTorch's update
 * equations, each a single pass over every parameter that reads and writes each value once. */
#ifndef FSDP_OPTIM_H
#define FSDP_OPTIM_H

#include "fsdp/module.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_optimizer fsdp_optimizer;

/* PyTorch's SGD: g += weight_decay*p; with momentum, buf = g on the first step, then
 * buf = momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g. */
/* Hyperparameters are doubles, as PyTorch's are Python floats; each is rounded to f32 where
 * PyTorch rounds it. */
typedef struct fsdp_sgd_options {
    double lr;           /* required, > 0 */
    double momentum;     /* default 0 */
    double dampening;    /* default 0 */
    double weight_decay; /* default 0 */
    bool nesterov;       /* needs momentum > 0 and dampening == 0 */
    bool maximize;       /* ascend instead of descend */
} fsdp_sgd_options;

/* An SGD optimizer over every parameter of m that requires a gradient. The caller owns
 * *out (release with fsdp_optimizer_free); m must outlive it. */
fsdp_status fsdp_sgd_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_sgd_options *opts,
                            fsdp_optimizer **out);

/* PyTorch's Adam and AdamW, in the order of its single-tensor implementation:
 * g = maximize ? -g : g; Adam: g += weight_decay*p; AdamW: p *= 1 - lr*weight_decay;
 * m += (1-beta1)*(g - m); v = beta2*v + (1-beta2)*g*g; vmax = max(vmax, v) with amsgrad;
 * p += (-lr/(1-beta1^t)) * m / (sqrt(amsgrad ? vmax : v) / sqrt(1-beta2^t) + eps).
 * Zero in beta1, beta2 or eps selects PyTorch's default (0.9, 0.999, 1e-8); a beta of
 * exactly 0 cannot be asked for, but 1e-30 computes the same in f32. */
typedef struct fsdp_adam_options {
    double lr;           /* required, > 0 */
    double beta1;        /* default 0.9, in [0, 1) */
    double beta2;        /* default 0.999, in [0, 1) */
    double eps;          /* default 1e-8 */
    double weight_decay; /* default 0 (Adam: L2 in the gradient; AdamW: decoupled) */
    bool amsgrad;        /* keep the running maximum of v */
    bool maximize;
} fsdp_adam_options;

fsdp_status fsdp_adam_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                             fsdp_optimizer **out);
fsdp_status fsdp_adamw_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_adam_options *opts,
                              fsdp_optimizer **out);
/* One update from the current gradients. */
fsdp_status fsdp_optimizer_step(fsdp_ctx *ctx, fsdp_optimizer *opt);
/* Steps taken so far. */
int64_t fsdp_optimizer_steps(const fsdp_optimizer *opt);
fsdp_status fsdp_optimizer_zero_grad(fsdp_ctx *ctx, fsdp_optimizer *opt);
void fsdp_optimizer_set_lr(fsdp_optimizer *opt, double lr);
double fsdp_optimizer_lr(const fsdp_optimizer *opt);
void fsdp_optimizer_free(fsdp_optimizer *opt); /* NULL does nothing */

#ifdef __cplusplus
}
#endif
#endif
