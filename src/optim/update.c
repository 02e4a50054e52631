/* update.c: the fused SGD and Adam/AdamW steps: the step's scalars, rounded to f32 where
 * PyTorch rounds them, then the element loop of the device's operator table (kernels.h), so
 * results agree with PyTorch to f32 rounding and are the same bits on every device. */
#include <math.h>

#include "kernels/kernels.h" // defines: fsdp_kernels_for, fsdp_sgd_step_args, fsdp_adam_step_args
#include "optim/update.h"

void fsdp_sgd_update(fsdp_device device, float *p, const float *g, float *buf, int64_t n,
                     const fsdp_sgd_options *o, bool first) {
    const fsdp_sgd_step_args a = {
        .sign = o->maximize ? -1.0f : 1.0f,
        .weight_decay = (float)o->weight_decay,
        .momentum = (float)o->momentum,
        .keep = (float)(1.0 - o->dampening),
        .neg_lr = (float)-o->lr,
        .nesterov = o->nesterov,
        .first = first,
    };
    fsdp_kernels_for(device)->sgd_update(p, g, buf, n, &a);
}

/* The step's scalars, as PyTorch computes them. */
static fsdp_adam_step_args adam_args(const fsdp_adam_options *o, bool decoupled, int64_t step) {
    /* Step-dependent scalars in double, as PyTorch computes them from Python floats. */
    const double bc1 = 1.0 - pow(o->beta1, (double)step);
    const double bc2 = 1.0 - pow(o->beta2, (double)step);
    return (fsdp_adam_step_args){
        .sign = o->maximize ? -1.0f : 1.0f,
        .l2 = decoupled ? 0.0f : (float)o->weight_decay,
        .shrink = decoupled ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f,
        .w1 = (float)(1.0 - o->beta1),
        .beta2 = (float)o->beta2,
        .w2 = (float)(1.0 - o->beta2),
        .eps = (float)o->eps,
        .neg_step_size = (float)(-(o->lr / bc1)),
        .bc2_sqrt = (float)sqrt(bc2),
    };
}

void fsdp_adam_update(fsdp_device device, float *p, const float *g, float *m, float *v, float *vmax,
                      int64_t n, const fsdp_adam_options *o, bool decoupled, int64_t step) {
    const fsdp_adam_step_args a = adam_args(o, decoupled, step);
    fsdp_kernels_for(device)->adam_update(p, g, m, v, vmax, n, &a);
}

void fsdp_adam_update_bf16(fsdp_device device, float *p, fsdp_bf16 *p_bf16, const float *g,
                           float *m, float *v, float *vmax, int64_t n, const fsdp_adam_options *o,
                           bool decoupled, int64_t step) {
    const fsdp_adam_step_args a = adam_args(o, decoupled, step);
    fsdp_kernels_for(device)->adam_update_bf16(p, p_bf16, g, m, v, vmax, n, &a);
}

void fsdp_adam_update_multi(fsdp_device device, const fsdp_adam_tensor *t, int count,
                            const fsdp_adam_options *o, bool decoupled, int64_t step) {
    const fsdp_adam_step_args a = adam_args(o, decoupled, step);
    const fsdp_kernels_i *k = fsdp_kernels_for(device);
    if (k->adam_update_multi) {
        k->adam_update_multi(t, count, &a);
        return;
    }
    for (int i = 0; i < count; i++) {
        if (t[i].n <= 0) continue;
        if (t[i].p_bf16)
            k->adam_update_bf16(t[i].p, t[i].p_bf16, t[i].g, t[i].m, t[i].v, t[i].vmax, t[i].n, &a);
        else
            k->adam_update(t[i].p, t[i].g, t[i].m, t[i].v, t[i].vmax, t[i].n, &a);
    }
}
