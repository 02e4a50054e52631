/* mpi_collectives.c: the MPI backend's collectives: after the descriptor exchange
 * (mpi_wait.c), the data moves point-to-point in torch.chunk pieces, and reductions run in
 * rank order with fsdp_reduce_run, bitwise equal to the local backend. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_impl.h"
#include "core/array.h"
#include "core/error.h"
#include "core/tensor_impl.h"

/* ---- the collectives ---- */

static const int64_t zeros[FSDP_MAX_DIMS] = {0};

/* A scratch buffer of at least `bytes`, kept by the group. */
static fsdp_status scratch(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, size_t bytes,
                           char **out) {
    if (!fsdp_array_reserve(&mg->scratch, &mg->scratch_cap, (int64_t)bytes, 1)) {
        char msg[FSDP_ERROR_MAX];
        snprintf(msg, sizeof msg, "group %s: cannot allocate %zu bytes of scratch", g->desc, bytes);
        return fsdp_mpi_fail_and_poison(ctx, mg, FSDP_ERR_OUT_OF_MEMORY, msg);
    }
    *out = mg->scratch;
    return FSDP_OK;
}

/* The elements before and after dim of a shape. */
static void outer_inner(const int64_t *shape, int ndim, int dim, int64_t *outer, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < dim; i++) *outer *= shape[i];
    for (int i = dim + 1; i < ndim; i++) *inner *= shape[i];
}

fsdp_status fsdp_mpi_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    (void)work; /* blocking: a start is complete when it returns */
    fsdp_call c = fsdp_call_all_gather(out, in, dim);
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    const size_t esize = fsdp_dtype_size(out->dtype);
    int64_t outer, inner, n = out->shape[dim], off, len, at[FSDP_MAX_DIMS] = {0};
    outer_inner(out->shape, out->ndim, dim, &outer, &inner);
    char *o = fsdp_tensor_data(out), *buf = NULL;
    if (outer > 1) { /* the pieces are not contiguous in out: receive them packed */
        int64_t total = 0;
        for (int m = 0; m < g->size; m++) {
            fsdp_chunk_range(n, g->size, m, NULL, &len);
            if (m != g->rank) total += outer * len * inner;
        }
        FSDP_TRY_AT(ctx, scratch(ctx, g, mg, (size_t)total * esize, &buf));
    }
    int64_t packed = 0;
    for (int m = 0; m < g->size; m++) {
        fsdp_chunk_range(n, g->size, m, &off, &len);
        if (m == g->rank) continue;
        size_t bytes = (size_t)(outer * len * inner) * esize;
        void *dst = outer > 1 ? buf + (size_t)packed * esize : o + (size_t)(off * inner) * esize;
        FSDP_TRY_AT(ctx, fsdp_mpi_post(ctx, g, mg, true, m, TAG_DATA, dst, bytes));
        packed += outer * len * inner;
    }
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY_AT(ctx, fsdp_mpi_post(ctx, g, mg, false, m, TAG_DATA, fsdp_tensor_data(in),
                                           fsdp_tensor_nbytes(in)));
    fsdp_chunk_range(n, g->size, g->rank, &at[dim], NULL);
    fsdp_box_copy(o, out->shape, at, fsdp_tensor_data(in), in->shape, zeros, in->shape, out->ndim,
                  esize);
    FSDP_TRY_AT(ctx, fsdp_mpi_wait_all(ctx, g, mg, c.op, WAIT_DATA));
    if (outer == 1) return FSDP_OK;
    int64_t shape[FSDP_MAX_DIMS];
    memcpy(shape, out->shape, sizeof shape);
    packed = 0;
    for (int m = 0; m < g->size; m++) {
        fsdp_chunk_range(n, g->size, m, &at[dim], &shape[dim]);
        if (m == g->rank) continue;
        fsdp_box_copy(o, out->shape, at, buf + (size_t)packed * esize, shape, zeros, shape,
                      out->ndim, esize);
        packed += outer * shape[dim] * inner;
    }
    return FSDP_OK;
}

fsdp_status fsdp_mpi_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                    const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                    const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    (void)work; /* blocking: a start is complete when it returns */
    fsdp_call c = fsdp_call_reduce_scatter(out, in, dim, op);
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    const int W = g->size, r = g->rank;
    const size_t esize = fsdp_dtype_size(in->dtype);
    int64_t outer, inner, n = in->shape[dim], off, len;
    outer_inner(in->shape, in->ndim, dim, &outer, &inner);
    const char *x = fsdp_tensor_data(in);
    /* Scratch: W-1 received pieces of this rank's chunk; with outer > 1 also every piece of
     * this rank's input, packed (they are not contiguous in it). */
    const int64_t mine = outer * out->shape[dim] * inner;
    size_t recv_bytes = (size_t)((W - 1) * mine) * esize;
    size_t bytes = recv_bytes + (outer > 1 ? fsdp_tensor_nbytes(in) : 0);
    char *buf = NULL;
    FSDP_TRY_AT(ctx, scratch(ctx, g, mg, bytes, &buf));
    int64_t shape[FSDP_MAX_DIMS], at[FSDP_MAX_DIMS] = {0};
    memcpy(shape, in->shape, sizeof shape);
    for (int m = 0, slot = 0; m < W; m++) {
        fsdp_chunk_range(n, W, m, &off, &len);
        const char *piece = x + (size_t)(off * inner) * esize;
        if (outer > 1) { /* pack piece m */
            char *p = buf + recv_bytes + (size_t)(outer * off * inner) * esize;
            at[dim] = off;
            shape[dim] = len;
            fsdp_box_copy(p, shape, zeros, x, in->shape, at, shape, in->ndim, esize);
            piece = p;
        }
        if (m == r) {
            mg->srcs[m] = piece;
            continue;
        }
        mg->srcs[m] = buf + (size_t)(slot++ * mine) * esize;
        FSDP_TRY_AT(ctx, fsdp_mpi_post(ctx, g, mg, false, m, TAG_DATA, (void *)piece,
                                       (size_t)(outer * len * inner) * esize));
    }
    for (int m = 0; m < W; m++)
        if (m != r)
            FSDP_TRY_AT(ctx, fsdp_mpi_post(ctx, g, mg, true, m, TAG_DATA, (void *)mg->srcs[m],
                                           (size_t)mine * esize));
    FSDP_TRY_AT(ctx, fsdp_mpi_wait_all(ctx, g, mg, c.op, WAIT_DATA));
    if (mine > 0)
        fsdp_reduce_run_fused(fsdp_tensor_data(out), mg->srcs, W, 0, mine, in->dtype, op, fuse);
    return FSDP_OK;
}

fsdp_status fsdp_mpi_all_reduce_exchange(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg,
                                         mpi_reqs *rs, fsdp_tensor *t, const void **srcs, char *buf,
                                         int kind) {
    const int W = g->size, r = g->rank;
    const size_t esize = fsdp_dtype_size(t->dtype);
    char *x = fsdp_tensor_data(t);
    int64_t begin, len, off, n;
    fsdp_chunk_range(t->numel, W, r, &begin, &len);
    for (int m = 0, slot = 0; m < W; m++) {
        if (m == r) {
            srcs[m] = x + (size_t)begin * esize;
            continue;
        }
        srcs[m] = buf + (size_t)(slot++ * len) * esize;
        FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, true, m, kind, (void *)srcs[m],
                                          (size_t)len * esize));
        fsdp_chunk_range(t->numel, W, m, &off, &n);
        FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, false, m, kind, x + (size_t)off * esize,
                                          (size_t)n * esize));
    }
    return FSDP_OK;
}

fsdp_status fsdp_mpi_all_reduce_gather(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg,
                                       mpi_reqs *rs, fsdp_tensor *t, fsdp_reduce_op op,
                                       const fsdp_reduce_options *fuse, const void **srcs,
                                       int kind) {
    const int W = g->size, r = g->rank;
    const size_t esize = fsdp_dtype_size(t->dtype);
    char *x = fsdp_tensor_data(t);
    int64_t begin, len, off, n;
    fsdp_chunk_range(t->numel, W, r, &begin, &len);
    if (len > 0)
        fsdp_reduce_run_fused(x + (size_t)begin * esize, srcs, W, 0, len, t->dtype, op, fuse);
    for (int m = 0; m < W; m++) {
        if (m == r) continue;
        fsdp_chunk_range(t->numel, W, m, &off, &n);
        FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, true, m, kind, x + (size_t)off * esize,
                                          (size_t)n * esize));
        FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, false, m, kind, x + (size_t)begin * esize,
                                          (size_t)len * esize));
    }
    return FSDP_OK;
}

fsdp_status fsdp_mpi_all_reduce_blocking(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t,
                                         fsdp_reduce_op op, const fsdp_reduce_options *fuse) {
    fsdp_call c = fsdp_call_all_reduce(t, op);
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    int64_t len;
    fsdp_chunk_range(t->numel, g->size, g->rank, NULL, &len);
    char *buf = NULL;
    FSDP_TRY_AT(
        ctx, scratch(ctx, g, mg, (size_t)((g->size - 1) * len) * fsdp_dtype_size(t->dtype), &buf));
    /* 1: each rank gathers every rank's values of its chunk of the elements and reduces them
     * in rank order into its own tensor (reading its own block before writing it)... */
    FSDP_TRY_AT(ctx, fsdp_mpi_all_reduce_exchange(ctx, g, mg, &mg->rq, t, mg->srcs, buf, TAG_DATA));
    FSDP_TRY_AT(ctx, fsdp_mpi_wait_all(ctx, g, mg, c.op, WAIT_DATA));
    /* 2: ...then every rank sends its reduced chunk to all (an all_gather of the chunks). */
    FSDP_TRY_AT(ctx,
                fsdp_mpi_all_reduce_gather(ctx, g, mg, &mg->rq, t, op, fuse, mg->srcs, TAG_DATA));
    return fsdp_mpi_wait_all(ctx, g, mg, c.op, WAIT_DATA);
}

fsdp_status fsdp_mpi_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                               fsdp_comm_work *work) {
    (void)work; /* blocking: a start is complete when it returns */
    fsdp_call c = fsdp_call_broadcast(t, root);
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    for (int m = 0; m < g->size; m++) {
        if (m == g->rank || (g->rank != root && m != root)) continue;
        FSDP_TRY_AT(ctx, fsdp_mpi_post(ctx, g, mg, g->rank != root, m, TAG_DATA,
                                       fsdp_tensor_data(t), fsdp_tensor_nbytes(t)));
    }
    return fsdp_mpi_wait_all(ctx, g, mg, c.op, WAIT_DATA);
}

fsdp_status fsdp_mpi_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                const fsdp_tensor *in, int split_dim, int concat_dim,
                                fsdp_comm_work *work) {
    (void)work; /* blocking: a start is complete when it returns */
    fsdp_call c = fsdp_call_all_to_all(out, in, split_dim, concat_dim);
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, g, &c));
    mpi_group *mg = g->state;
    const int W = g->size, r = g->rank, nd = in->ndim, s = split_dim, k = concat_dim;
    const size_t esize = fsdp_dtype_size(in->dtype);
    /* The box rank m sends to rank q: m's input (the global shape with concat_dim cut to
     * chunk m, or the one shape when s == k) with split_dim cut to chunk q. */
    int64_t send_box[FSDP_MAX_DIMS], recv_box[FSDP_MAX_DIMS];
    int64_t src_at[FSDP_MAX_DIMS] = {0}, dst_at[FSDP_MAX_DIMS] = {0};
    size_t total = fsdp_tensor_nbytes(in) + fsdp_tensor_nbytes(out);
    char *buf = NULL, *send_area, *recv_area;
    FSDP_TRY_AT(ctx, scratch(ctx, g, mg, total, &buf));
    send_area = buf;
    recv_area = buf + fsdp_tensor_nbytes(in);
    size_t sent = 0, received = 0;
    int64_t at = 0; /* where along concat_dim the next rank's piece goes */
    for (int m = 0; m < W; m++) {
        memcpy(send_box, in->shape, sizeof send_box);
        fsdp_chunk_range(in->shape[s], W, m, &src_at[s], &send_box[s]);
        memcpy(recv_box, c.shape, sizeof recv_box);
        if (s != k) fsdp_chunk_range(c.shape[k], W, m, NULL, &recv_box[k]);
        fsdp_chunk_range(recv_box[s], W, r, NULL, &recv_box[s]);
        dst_at[k] = at;
        at += recv_box[k];
        if (m == r) {
            fsdp_box_copy(fsdp_tensor_data(out), out->shape, dst_at, fsdp_tensor_data(in),
                          in->shape, src_at, send_box, nd, esize);
            continue;
        }
        size_t send_bytes = esize, recv_bytes = esize;
        for (int i = 0; i < nd; i++) send_bytes *= (size_t)send_box[i];
        for (int i = 0; i < nd; i++) recv_bytes *= (size_t)recv_box[i];
        fsdp_box_copy(send_area + sent, send_box, zeros, fsdp_tensor_data(in), in->shape, src_at,
                      send_box, nd, esize);
        FSDP_TRY_AT(ctx,
                    fsdp_mpi_post(ctx, g, mg, true, m, TAG_DATA, recv_area + received, recv_bytes));
        FSDP_TRY_AT(ctx,
                    fsdp_mpi_post(ctx, g, mg, false, m, TAG_DATA, send_area + sent, send_bytes));
        sent += send_bytes;
        received += recv_bytes;
    }
    FSDP_TRY_AT(ctx, fsdp_mpi_wait_all(ctx, g, mg, c.op, WAIT_DATA));
    received = 0;
    at = 0;
    for (int m = 0; m < W; m++) {
        memcpy(recv_box, c.shape, sizeof recv_box);
        if (s != k) fsdp_chunk_range(c.shape[k], W, m, NULL, &recv_box[k]);
        fsdp_chunk_range(recv_box[s], W, r, NULL, &recv_box[s]);
        dst_at[k] = at;
        at += recv_box[k];
        if (m == r) continue;
        size_t bytes = esize;
        for (int i = 0; i < nd; i++) bytes *= (size_t)recv_box[i];
        fsdp_box_copy(fsdp_tensor_data(out), out->shape, dst_at, recv_area + received, recv_box,
                      zeros, recv_box, nd, esize);
        received += bytes;
    }
    return FSDP_OK;
}

fsdp_status fsdp_mpi_barrier(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_work *work) {
    (void)work; /* blocking: a start is complete when it returns */
    fsdp_call c = {.op = FSDP_COMM_BARRIER};
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, g, &c));
    return fsdp_mpi_confirm(ctx, g, c.op);
}

void fsdp_mpi_reject(fsdp_ctx *ctx, fsdp_group *g, fsdp_comm_op op) {
    fsdp_call c = {.op = op, .rejected = ctx->error.status, .reject_msg = ctx->error.message};
    (void)fsdp_mpi_arrive(ctx, g, &c);
}
