/* reduce_n.c: the CPU's fused reduction of n arrays (fsdp_kernels_i.reduce_n), which the comm
 * backends run on host memory and the sim device on its streams: per element, the inputs in
 * order (in[0] first, left to right) in f32 (bf16 and f16 widened exactly, the result rounded
 * once to nearest even), so every caller gets the same bits. */
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"

#define REDUCE_BLOCK 256

static void load_f32(float *acc, const void *src, int64_t offset, int64_t n, fsdp_dtype dtype) {
    if (dtype == FSDP_DTYPE_F32)
        memcpy(acc, (const float *)src + offset, (size_t)n * sizeof(float));
    else if (dtype == FSDP_DTYPE_F16)
        fsdp_cpu_f16_to_f32(acc, (const fsdp_f16 *)src + offset, n);
    else
        fsdp_cpu_bf16_to_f32(acc, (const fsdp_bf16 *)src + offset, n);
}

static void combine(float *restrict acc, const float *restrict x, int64_t n, bool max) {
    if (max) {
        for (int64_t i = 0; i < n; i++)
            acc[i] = (acc[i] != acc[i] || acc[i] >= x[i]) ? acc[i] : x[i]; /* NaN wins */
    } else {
        for (int64_t i = 0; i < n; i++) acc[i] += x[i];
    }
}

/* f32 sums a block at a time, (x0 + x1) + x2 ... as the general loop below, without staging
 * a source in a buffer first: with two sources (or one) the block is reduced and stored in
 * one pass that streams every source and dst together; with more, the sources but the last
 * are summed into `acc` (L1) and the last pass adds the last source and stores. Every source's
 * element is read before dst's is written, so dst may be one of the sources (the all_reduces reduce
 * into their own chunk). With `pre` (P) each source element
 * is multiplied by it first, the sum divided by the number of sources for avg (A), multiplied
 * by `post` (Q), and with `add` (D) added to dst instead of stored: the operations of a scaling
 * pass, the reduction, a scaling pass and an add pass, in that order, each rounded to f32 (the
 * library is built without FMA contraction), in one pass over the data. The flags are
 * constants at each call of sum_blocks, so every combination is its own loop. */
#define SUM_BLOCK 1024

static inline __attribute__((always_inline)) void sum_blocks(float *dst, const void *const *srcs,
                                                             int nsrc, int64_t offset, int64_t n,
                                                             float pre, float post, bool P, bool A,
                                                             bool Q, bool D) {
    const float div = (float)nsrc;
    float acc[SUM_BLOCK];
#define SCALED(x) (P ? (x)*pre : (x))
#define FINISH(v)                                                                                  \
    do {                                                                                           \
        float f_ = (v);                                                                            \
        if (A) f_ /= div;                                                                          \
        if (Q) f_ *= post;                                                                         \
        d[j] = D ? d[j] + f_ : f_;                                                                 \
    } while (0)
    for (int64_t i = 0; i < n; i += SUM_BLOCK) {
        int64_t m = n - i < SUM_BLOCK ? n - i : SUM_BLOCK;
        const float *x0 = (const float *)srcs[0] + offset + i;
        const float *last = (const float *)srcs[nsrc - 1] + offset + i;
        float *d = dst + i;
        if (nsrc == 1) {
            for (int64_t j = 0; j < m; j++) FINISH(SCALED(x0[j]));
        } else if (nsrc == 2) {
            for (int64_t j = 0; j < m; j++) FINISH(SCALED(x0[j]) + SCALED(last[j]));
        } else {
            const float *x1 = (const float *)srcs[1] + offset + i;
            for (int64_t j = 0; j < m; j++) acc[j] = SCALED(x0[j]) + SCALED(x1[j]);
            for (int r = 2; r < nsrc - 1; r++) {
                const float *x = (const float *)srcs[r] + offset + i;
                for (int64_t j = 0; j < m; j++) acc[j] += SCALED(x[j]);
            }
            for (int64_t j = 0; j < m; j++) FINISH(acc[j] + SCALED(last[j]));
        }
    }
#undef FINISH
#undef SCALED
}

static void sum_f32(float *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                    bool avg, float pre, float post, bool add) {
    if (nsrc == 1 && pre == 1.0f && post == 1.0f && !add) { /* avg over one: x / 1 */
        const float *s0 = (const float *)srcs[0] + offset;
        if (n > 0 && dst != s0) memmove(dst, s0, (size_t)n * sizeof(float));
        return;
    }
    const bool p = pre != 1.0f, q = post != 1.0f;
    switch ((int)p | (int)avg << 1 | (int)q << 2 | (int)add << 3) {
#define SUM_CASE(P, A, Q, D)                                                                       \
    case (P) | (A) << 1 | (Q) << 2 | (D) << 3:                                                     \
        sum_blocks(dst, srcs, nsrc, offset, n, pre, post, P, A, Q, D);                             \
        return
        SUM_CASE(0, 0, 0, 0);
        SUM_CASE(1, 0, 0, 0);
        SUM_CASE(0, 1, 0, 0);
        SUM_CASE(1, 1, 0, 0);
        SUM_CASE(0, 0, 1, 0);
        SUM_CASE(1, 0, 1, 0);
        SUM_CASE(0, 1, 1, 0);
        SUM_CASE(1, 1, 1, 0);
        SUM_CASE(0, 0, 0, 1);
        SUM_CASE(1, 0, 0, 1);
        SUM_CASE(0, 1, 0, 1);
        SUM_CASE(1, 1, 0, 1);
        SUM_CASE(0, 0, 1, 1);
        SUM_CASE(1, 0, 1, 1);
        SUM_CASE(0, 1, 1, 1);
        SUM_CASE(1, 1, 1, 1);
#undef SUM_CASE
    }
}

/* Any number of inputs (max, bf16, f16): a block of each widened into f32 in turn. */
static void reduce_widened(void *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                           fsdp_dtype dtype, bool max, bool avg) {
    float acc[REDUCE_BLOCK], x[REDUCE_BLOCK];
    for (int64_t i = 0; i < n; i += REDUCE_BLOCK) {
        int64_t m = n - i < REDUCE_BLOCK ? n - i : REDUCE_BLOCK;
        load_f32(acc, srcs[0], offset + i, m, dtype);
        for (int r = 1; r < nsrc; r++) {
            load_f32(x, srcs[r], offset + i, m, dtype);
            combine(acc, x, m, max);
        }
        if (avg)
            for (int64_t j = 0; j < m; j++) acc[j] /= (float)nsrc;
        if (dtype == FSDP_DTYPE_F32)
            memcpy((float *)dst + i, acc, (size_t)m * sizeof(float));
        else if (dtype == FSDP_DTYPE_F16)
            fsdp_cpu_f32_to_f16((fsdp_f16 *)dst + i, acc, m);
        else
            fsdp_cpu_f32_to_bf16((fsdp_bf16 *)dst + i, acc, m);
    }
}

void fsdp_kernels_cpu_reduce_at(void *out, const void *const *in, int n, int64_t offset,
                                int64_t count, fsdp_dtype dtype, const fsdp_reduce_n_args *args) {
    if (n <= 0 || count <= 0) return;
    const bool max = args->kind == FSDP_REDUCE_KIND_MAX, avg = args->kind == FSDP_REDUCE_KIND_AVG;
    if (dtype == FSDP_DTYPE_F32 && !max)
        sum_f32(out, in, n, offset, count, avg, args->pre_scale, args->post_scale,
                args->accumulate);
    else
        reduce_widened(out, in, n, offset, count, dtype, max, avg);
}

void fsdp_cpu_reduce_n(void *out, const void *const *in, int n, int64_t count, fsdp_dtype dtype,
                       const fsdp_reduce_n_args *args) {
    fsdp_kernels_cpu_reduce_at(out, in, n, 0, count, dtype, args);
}
