/* box.c: the data movement of the backends: copying an n-d box between contiguous row-major
 * tensors in as few runs as the shapes allow (on the host, or on a device through its record),
 * and reducing one run of elements over the ranks in rank order with the kernel table's
 * reduce_n (f32; bf16 and f16 widened exactly, reduced, and rounded once to nearest even). */
#include <stdbool.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "kernels/kernels.h"

fsdp_status fsdp_box_runs(const int64_t *dst_shape, const int64_t *dst_at, const int64_t *src_shape,
                          const int64_t *src_at, const int64_t *box, int ndim, size_t esize,
                          fsdp_box_run_fn run, void *user) {
    for (int j = 0; j < ndim; j++)
        if (box[j] == 0) return FSDP_OK;
    if (ndim == 0) return run(user, 0, 0, esize, 1, 0, 0);
    int64_t dst_stride[FSDP_MAX_DIMS], src_stride[FSDP_MAX_DIMS];
    dst_stride[ndim - 1] = src_stride[ndim - 1] = 1;
    for (int j = ndim - 2; j >= 0; j--) {
        dst_stride[j] = dst_stride[j + 1] * dst_shape[j + 1];
        src_stride[j] = src_stride[j + 1] * src_shape[j + 1];
    }
    /* Trailing dims the box covers whole in both tensors join the run of dim k; dim k - 1 (if
     * any) gives the rows of one call, the dims before it are walked. */
    int k = ndim - 1;
    int64_t run_len = 1;
    while (k > 0 && box[k] == dst_shape[k] && box[k] == src_shape[k]) run_len *= box[k--];
    run_len *= box[k];
    const size_t run_bytes = (size_t)run_len * esize;
    const int r = k - 1; /* the rows' dim, -1 for none */
    const size_t rows = r >= 0 ? (size_t)box[r] : 1;
    const size_t dst_pitch = r >= 0 ? (size_t)dst_stride[r] * esize : 0;
    const size_t src_pitch = r >= 0 ? (size_t)src_stride[r] * esize : 0;

    int64_t idx[FSDP_MAX_DIMS] = {0};
    for (;;) {
        int64_t d = dst_at[k] * dst_stride[k], s = src_at[k] * src_stride[k];
        for (int j = 0; j < k; j++) {
            int64_t i = j < r ? idx[j] : 0;
            d += (dst_at[j] + i) * dst_stride[j];
            s += (src_at[j] + i) * src_stride[j];
        }
        FSDP_TRY(
            run(user, (size_t)d * esize, (size_t)s * esize, run_bytes, rows, dst_pitch, src_pitch));
        int j = r - 1;
        while (j >= 0 && ++idx[j] == box[j]) idx[j--] = 0;
        if (j < 0) return FSDP_OK;
    }
}

typedef struct host_box {
    char *dst;
    const char *src;
} host_box;

/* A run whose source is its destination is skipped (in-place all_gather). */
static fsdp_status host_run(void *user, size_t dst_off, size_t src_off, size_t bytes, size_t rows,
                            size_t dst_pitch, size_t src_pitch) {
    const host_box *h = user;
    for (size_t i = 0; i < rows; i++) {
        char *dp = h->dst + dst_off + i * dst_pitch;
        const char *sp = h->src + src_off + i * src_pitch;
        if (dp != sp) memcpy(dp, sp, bytes);
    }
    return FSDP_OK;
}

void fsdp_box_copy(void *dst, const int64_t *dst_shape, const int64_t *dst_at, const void *src,
                   const int64_t *src_shape, const int64_t *src_at, const int64_t *box, int ndim,
                   size_t esize) {
    host_box h = {dst, src};
    (void)fsdp_box_runs(dst_shape, dst_at, src_shape, src_at, box, ndim, esize, host_run, &h);
}

/* The arguments of reduce_n for a collective's reduction (fuse: NULL, or checked options). */
fsdp_reduce_n_args fsdp_reduce_args(fsdp_reduce_op op, const fsdp_reduce_options *fuse) {
    fsdp_reduce_kind kind = op == FSDP_REDUCE_MAX   ? FSDP_REDUCE_KIND_MAX
                            : op == FSDP_REDUCE_AVG ? FSDP_REDUCE_KIND_AVG
                                                    : FSDP_REDUCE_KIND_SUM;
    if (!fuse) return (fsdp_reduce_n_args){kind, 1.0f, 1.0f, false};
    return (fsdp_reduce_n_args){kind, fuse->pre_scale, fuse->post_scale, fuse->accumulate};
}

void fsdp_reduce_run_fused(void *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                           fsdp_dtype dtype, fsdp_reduce_op op, const fsdp_reduce_options *fuse) {
    fsdp_reduce_n_args args = fsdp_reduce_args(op, fuse);
    fsdp_kernels_cpu_reduce_at(dst, srcs, nsrc, offset, n, dtype, &args);
}

void fsdp_reduce_run(void *dst, const void *const *srcs, int nsrc, int64_t offset, int64_t n,
                     fsdp_dtype dtype, fsdp_reduce_op op) {
    fsdp_reduce_run_fused(dst, srcs, nsrc, offset, n, dtype, op, NULL);
}
