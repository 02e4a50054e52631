/* box.c: the data movement of the local backend: copying an n-d box between contiguous
 * row-major tensors in as few memcpy runs as the shapes allow, and reducing one run of
 * elements over the ranks in rank order, in f32 (bf16 and f16 are widened exactly, reduced,
 * and rounded once to nearest even). */
#include <stdbool.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "kernels/kernels.h"

void fsdp_box_copy(void *dst, const int64_t *dst_shape, const int64_t *dst_at, const void *src,
                   const int64_t *src_shape, const int64_t *src_at, const int64_t *box, int ndim,
                   size_t esize) {
    for (int j = 0; j < ndim; j++)
        if (box[j] == 0) return;
    if (ndim == 0) {
        if (dst != src) memcpy(dst, src, esize);
        return;
    }
    int64_t dst_stride[FSDP_MAX_DIMS], src_stride[FSDP_MAX_DIMS];
    dst_stride[ndim - 1] = src_stride[ndim - 1] = 1;
    for (int j = ndim - 2; j >= 0; j--) {
        dst_stride[j] = dst_stride[j + 1] * dst_shape[j + 1];
        src_stride[j] = src_stride[j + 1] * src_shape[j + 1];
    }
    /* Trailing dims the box covers whole in both tensors join the run of dim k. */
    int k = ndim - 1;
    int64_t run = 1;
    while (k > 0 && box[k] == dst_shape[k] && box[k] == src_shape[k]) run *= box[k--];
    run *= box[k];
    size_t run_bytes = (size_t)run * esize;

    int64_t idx[FSDP_MAX_DIMS] = {0};
    for (;;) {
        int64_t d = dst_at[k] * dst_stride[k], s = src_at[k] * src_stride[k];
        for (int j = 0; j < k; j++) {
            d += (dst_at[j] + idx[j]) * dst_stride[j];
            s += (src_at[j] + idx[j]) * src_stride[j];
        }
        char *dp = (char *)dst + (size_t)d * esize;
        const char *sp = (const char *)src + (size_t)s * esize;
        if (dp != sp) memcpy(dp, sp, run_bytes);
        int j = k - 1;
        while (j >= 0 && ++idx[j] == box[j]) idx[j--] = 0;
        if (j < 0) return;
    }
}

#define REDUCE_BLOCK 256

static void load_f32(float *acc, const void *src, int64_t offset, int64_t n, fsdp_dtype dtype) {
    if (dtype == FSDP_DTYPE_F32)
        memcpy(acc, (const float *)src + offset, (size_t)n * sizeof(float));
    else if (dtype == FSDP_DTYPE_F16)
        fsdp_kernels_cpu()->f16_to_f32(acc, (const fsdp_f16 *)src + offset, n);
    else
        fsdp_kernels_cpu()->bf16_to_f32(acc, (const fsdp_bf16 *)src + offset, n);
}

static void combine(float *restrict acc, const float *restrict x, int64_t n, fsdp_reduce_op op) {
    if (op == FSDP_REDUCE_MAX) {
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
 * element is read before dst's is written, so dst may be one of the sources (the MPI all_reduce
 * and the local in-place one reduce into their own chunk). With `pre` (P) each source element
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

void fsdp_reduce_run_fused(void *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                           fsdp_dtype dtype, fsdp_reduce_op op, const fsdp_reduce_options *fuse) {
    if (!fuse) {
        fsdp_reduce_run(dst, srcs, nsrc, offset, n, dtype, op);
        return;
    }
    sum_f32(dst, srcs, nsrc, offset, n, op == FSDP_REDUCE_AVG, fuse->pre_scale, fuse->post_scale,
            fuse->accumulate);
}

void fsdp_reduce_run(void *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                     fsdp_dtype dtype, fsdp_reduce_op op) {
    if (dtype == FSDP_DTYPE_F32 && op != FSDP_REDUCE_MAX) {
        sum_f32(dst, srcs, nsrc, offset, n, op == FSDP_REDUCE_AVG, 1.0f, 1.0f, false);
        return;
    }
    float acc[REDUCE_BLOCK], x[REDUCE_BLOCK];
    for (int64_t i = 0; i < n; i += REDUCE_BLOCK) {
        int64_t m = n - i < REDUCE_BLOCK ? n - i : REDUCE_BLOCK;
        load_f32(acc, srcs[0], offset + i, m, dtype);
        for (int r = 1; r < nsrc; r++) {
            load_f32(x, srcs[r], offset + i, m, dtype);
            combine(acc, x, m, op);
        }
        if (op == FSDP_REDUCE_AVG)
            for (int64_t j = 0; j < m; j++) acc[j] /= (float)nsrc;
        if (dtype == FSDP_DTYPE_F32)
            memcpy((float *)dst + i, acc, (size_t)m * sizeof(float));
        else if (dtype == FSDP_DTYPE_F16)
            fsdp_kernels_cpu()->f32_to_f16((fsdp_f16 *)dst + i, acc, m);
        else
            fsdp_kernels_cpu()->f32_to_bf16((fsdp_bf16 *)dst + i, acc, m);
    }
}
