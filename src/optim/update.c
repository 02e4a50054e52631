/* update.c: the fused SGD and Adam/AdamW element loops, in PyTorch's operation order with its
 * scalars rounded to f32 where PyTorch rounds them, so results agree to f32 rounding. */
#include <math.h>

#include "optim/update.h"

/* On x86-64 each loop is also built for AVX2, picked at load time when the CPU has it: twice
 * the lanes of the baseline's SSE2 for the square root and the divisions, which otherwise
 * keep one core's Adam step below its memory bandwidth. AVX2 without FMA computes every
 * element with the same IEEE operations, so both builds give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) /* ifunc: glibc */
#define FSDP_UPDATE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FSDP_UPDATE_CLONES
#endif

FSDP_UPDATE_CLONES
void fsdp_sgd_update(float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                     const fsdp_sgd_options *o, bool first) {
    const float sign = o->maximize ? -1.0f : 1.0f;
    const float wd = (float)o->weight_decay, mom = (float)o->momentum;
    const float keep = (float)(1.0 - o->dampening), neg_lr = (float)-o->lr;
    for (int64_t i = 0; i < n; i++) {
        float d = sign * g[i] + wd * p[i];
        if (buf) {
            buf[i] = first ? d : buf[i] * mom + keep * d;
            d = o->nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] += neg_lr * d;
    }
}

FSDP_UPDATE_CLONES
void fsdp_adam_update(float *restrict p, const float *restrict g, float *restrict m,
                      float *restrict v, float *restrict vmax, int64_t n,
                      const fsdp_adam_options *o, bool decoupled, int64_t step) {
    /* Step-dependent scalars in double, as PyTorch computes them from Python floats. */
    const double bc1 = 1.0 - pow(o->beta1, (double)step);
    const double bc2 = 1.0 - pow(o->beta2, (double)step);
    const float neg_step_size = (float)(-(o->lr / bc1));
    const float bc2_sqrt = (float)sqrt(bc2);
    const float sign = o->maximize ? -1.0f : 1.0f;
    const float l2 = decoupled ? 0.0f : (float)o->weight_decay;
    const float shrink = decoupled ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
    const float w1 = (float)(1.0 - o->beta1), beta2 = (float)o->beta2;
    const float w2 = (float)(1.0 - o->beta2), eps = (float)o->eps;
    for (int64_t i = 0; i < n; i++) {
        float gi = sign * g[i] + l2 * p[i];
        float pi = p[i] * shrink;
        m[i] = m[i] + w1 * (gi - m[i]); /* PyTorch's lerp for a weight below 0.5 */
        v[i] = v[i] * beta2 + w2 * gi * gi;
        float vv = v[i];
        if (vmax) vv = vmax[i] = fmaxf(vmax[i], v[i]);
        float denom = sqrtf(vv) / bc2_sqrt + eps;
        p[i] = pi + neg_step_size * m[i] / denom;
    }
}
