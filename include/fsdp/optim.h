/* optim.h: optimizers over a module's parameters. */
#ifndef FSDP_OPTIM_H
#define FSDP_OPTIM_H

#include "fsdp/module.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_optimizer fsdp_optimizer;

/* PyTorch's SGD: g += weight_decay*p; with momentum, buf = g on the first step, then
 * buf = momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g. */
typedef struct fsdp_sgd_options {
    float lr;           /* required, > 0 */
    float momentum;     /* default 0 */
    float dampening;    /* default 0 */
    float weight_decay; /* default 0 */
    bool nesterov;      /* needs momentum > 0 and dampening == 0 */
    bool maximize;      /* ascend instead of descend */
} fsdp_sgd_options;

/* An SGD optimizer over every parameter of m that requires a gradient. The caller owns
 * *out (release with fsdp_optimizer_free); m must outlive it. */
fsdp_status fsdp_sgd_create(fsdp_ctx *ctx, fsdp_module *m, const fsdp_sgd_options *opts,
                            fsdp_optimizer **out);
/* One update from the current gradients. */
fsdp_status fsdp_optimizer_step(fsdp_ctx *ctx, fsdp_optimizer *opt);
fsdp_status fsdp_optimizer_zero_grad(fsdp_ctx *ctx, fsdp_optimizer *opt);
void fsdp_optimizer_set_lr(fsdp_optimizer *opt, float lr);
float fsdp_optimizer_lr(const fsdp_optimizer *opt);
void fsdp_optimizer_free(fsdp_optimizer *opt); /* NULL does nothing */

#ifdef __cplusplus
}
#endif
#endif
