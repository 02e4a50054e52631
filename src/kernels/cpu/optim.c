/* optim.c: the fused SGD and Adam/AdamW element loops on the CPU, over the step's scalars
 * (kernels.h: fsdp_sgd_step_args, fsdp_adam_step_args) in PyTorch's operation order. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* On x86-64 each loop is also built for AVX2, picked at load time when the CPU has it: twice
 * the lanes of the baseline's SSE2 for the square root and the divisions, which otherwise
 * keep one core's Adam step below its memory bandwidth. AVX2 without FMA computes every
 * element with the same IEEE operations, so both builds give the same bits.
 * Not under ThreadSanitizer: the clones' ifunc resolver runs while the dynamic loader
 * relocates the program, before TSan's runtime is initialised, and the instrumented resolver
 * crashes the process at load. The default clone alone gives the same bits. */
#if defined(__SANITIZE_THREAD__)
#define FSDP_NO_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FSDP_NO_CLONES 1
#endif
#endif
/* gcc only: clang (14) emits no resolver for a target_clones function its file does not call,
 * so the library would not link (the fuzz build uses clang); clang builds take the baseline.
 * ifunc needs glibc. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) &&       \
    !defined(FSDP_NO_CLONES)
#define FSDP_UPDATE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FSDP_UPDATE_CLONES
#endif

/* The scalars are copied to locals: the arrays could alias the struct's floats, which would
 * keep the compiler from hoisting them out of the loop. */
FSDP_UPDATE_CLONES
void fsdp_cpu_sgd_update(float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                         const fsdp_sgd_step_args *a) {
    const float sign = a->sign, wd = a->weight_decay, mom = a->momentum;
    const float keep = a->keep, neg_lr = a->neg_lr;
    const bool nesterov = a->nesterov, first = a->first;
    for (int64_t i = 0; i < n; i++) {
        float d = sign * g[i] + wd * p[i];
        if (buf) {
            buf[i] = first ? d : buf[i] * mom + keep * d;
            d = nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] += neg_lr * d;
    }
}

/* x rounded to bf16 to nearest even, NaN kept a quiet NaN: fsdp_bf16_from_f32's rule (and
 * convert.c's), inline so that the loop stays vectorisable. */
static inline fsdp_bf16 round_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    uint32_t nan = (bits >> 16) | 0x40u;
    return (fsdp_bf16)((bits & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

/* The Adam loop; lp (may be NULL) gets each updated p rounded to bf16. Inlined into both entry
 * points, where lp is a constant NULL or not, so neither loop tests it per element. */
static inline __attribute__((always_inline)) void
adam_loop(float *restrict p, fsdp_bf16 *restrict lp, const float *restrict g, float *restrict m,
          float *restrict v, float *restrict vmax, int64_t n, const fsdp_adam_step_args *a) {
    const float sign = a->sign, l2 = a->l2, shrink = a->shrink, w1 = a->w1, beta2 = a->beta2;
    const float w2 = a->w2, eps = a->eps, neg_step_size = a->neg_step_size;
    const float bc2_sqrt = a->bc2_sqrt;
    for (int64_t i = 0; i < n; i++) {
        float gi = sign * g[i] + l2 * p[i];
        float pi = p[i] * shrink;
        m[i] = m[i] + w1 * (gi - m[i]); /* PyTorch's lerp for a weight below 0.5 */
        v[i] = v[i] * beta2 + w2 * gi * gi;
        float vv = v[i];
        if (vmax) vv = vmax[i] = fmaxf(vmax[i], v[i]);
        float denom = sqrtf(vv) / bc2_sqrt + eps;
        p[i] = pi + neg_step_size * m[i] / denom;
        if (lp) lp[i] = round_bf16(p[i]);
    }
}

FSDP_UPDATE_CLONES
void fsdp_cpu_adam_update(float *restrict p, const float *restrict g, float *restrict m,
                          float *restrict v, float *restrict vmax, int64_t n,
                          const fsdp_adam_step_args *a) {
    adam_loop(p, NULL, g, m, v, vmax, n, a);
}

FSDP_UPDATE_CLONES
void fsdp_cpu_adam_update_bf16(float *restrict p, fsdp_bf16 *restrict p_bf16,
                               const float *restrict g, float *restrict m, float *restrict v,
                               float *restrict vmax, int64_t n, const fsdp_adam_step_args *a) {
    adam_loop(p, p_bf16, g, m, v, vmax, n, a);
}
