/* mpi_collectives.c: the MPI backend's collectives: after the descriptor exchange
 * (mpi_wait.c), the data moves point-to-point in torch.chunk pieces, and reductions run in
 * rank order with fsdp_reduce_run, bitwise equal to the local backend. all_gather,
 * reduce_scatter and all_reduce are written as data steps (fsdp_mpi_coll_*), which the blocking
 * call runs here and the non-blocking one (mpi_async.c) runs as its requests complete. */
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

fsdp_call fsdp_mpi_coll_call(const mpi_coll *c) {
    if (c->op == FSDP_COMM_ALL_GATHER) return fsdp_call_all_gather(c->out, c->in, c->dim);
    if (c->op == FSDP_COMM_REDUCE_SCATTER)
        return fsdp_call_reduce_scatter(c->out, c->in, c->dim, c->reduce);
    return fsdp_call_all_reduce(c->out, c->reduce);
}

int fsdp_mpi_coll_steps(const mpi_coll *c) {
    return c->op == FSDP_COMM_ALL_REDUCE ? 2 : 1;
}

size_t fsdp_mpi_coll_scratch(const fsdp_group *g, const mpi_coll *c) {
    const int W = g->size;
    const size_t esize = fsdp_dtype_size(c->in->dtype);
    int64_t outer, inner, len;
    if (c->op == FSDP_COMM_ALL_REDUCE) {
        fsdp_chunk_range(c->out->numel, W, g->rank, NULL, &len);
        return (size_t)((W - 1) * len) * esize;
    }
    if (c->op ==
        FSDP_COMM_REDUCE_SCATTER) { /* W-1 received pieces; with outer > 1 the packed input */
        outer_inner(c->in->shape, c->in->ndim, c->dim, &outer, &inner);
        const int64_t mine = outer * c->out->shape[c->dim] * inner;
        return (size_t)((W - 1) * mine) * esize + (outer > 1 ? fsdp_tensor_nbytes(c->in) : 0);
    }
    /* all_gather: the others' pieces, packed, where they are not contiguous in out */
    outer_inner(c->out->shape, c->out->ndim, c->dim, &outer, &inner);
    if (outer == 1) return 0;
    int64_t total = 0;
    for (int m = 0; m < W; m++) {
        fsdp_chunk_range(c->out->shape[c->dim], W, m, NULL, &len);
        if (m != g->rank) total += outer * len * inner;
    }
    return (size_t)total * esize;
}

/* all_gather's step: every other member's piece is received (into out, or packed into buf), this
 * rank's is sent to each and copied into its place. */
static fsdp_status all_gather_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                                   const mpi_coll *c, char *buf, int kind) {
    fsdp_tensor *out = c->out;
    const fsdp_tensor *in = c->in;
    const int dim = c->dim;
    const size_t esize = fsdp_dtype_size(out->dtype);
    int64_t outer, inner, n = out->shape[dim], off, len, at[FSDP_MAX_DIMS] = {0};
    outer_inner(out->shape, out->ndim, dim, &outer, &inner);
    char *o = fsdp_tensor_data(out);
    int64_t packed = 0;
    for (int m = 0; m < g->size; m++) {
        fsdp_chunk_range(n, g->size, m, &off, &len);
        if (m == g->rank) continue;
        size_t bytes = (size_t)(outer * len * inner) * esize;
        void *dst = outer > 1 ? buf + (size_t)packed * esize : o + (size_t)(off * inner) * esize;
        FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, true, m, kind, dst, bytes));
        packed += outer * len * inner;
    }
    for (int m = 0; m < g->size; m++)
        if (m != g->rank)
            FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, false, m, kind, fsdp_tensor_data(in),
                                              fsdp_tensor_nbytes(in)));
    fsdp_chunk_range(n, g->size, g->rank, &at[dim], NULL);
    fsdp_box_copy(o, out->shape, at, fsdp_tensor_data(in), in->shape, zeros, in->shape, out->ndim,
                  esize);
    return FSDP_OK;
}

/* all_gather's end: the packed pieces go to their places in out. */
static void all_gather_unpack(const fsdp_group *g, const mpi_coll *c, const char *buf) {
    fsdp_tensor *out = c->out;
    const size_t esize = fsdp_dtype_size(out->dtype);
    int64_t outer, inner, shape[FSDP_MAX_DIMS], at[FSDP_MAX_DIMS] = {0}, packed = 0;
    outer_inner(out->shape, out->ndim, c->dim, &outer, &inner);
    if (outer == 1) return;
    memcpy(shape, out->shape, sizeof shape);
    for (int m = 0; m < g->size; m++) {
        fsdp_chunk_range(out->shape[c->dim], g->size, m, &at[c->dim], &shape[c->dim]);
        if (m == g->rank) continue;
        fsdp_box_copy(fsdp_tensor_data(out), out->shape, at, buf + (size_t)packed * esize, shape,
                      zeros, shape, out->ndim, esize);
        packed += outer * shape[c->dim] * inner;
    }
}

/* reduce_scatter's step: every member's piece of this rank's chunk is received into buf (srcs[m]
 * set to member m's, this rank's own in place), this rank's pieces of the others' chunks are sent
 * (packed into buf first where they are not contiguous in the input). */
static fsdp_status reduce_scatter_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg,
                                       mpi_reqs *rs, const mpi_coll *c, char *buf,
                                       const void **srcs, int kind) {
    const fsdp_tensor *in = c->in;
    const int W = g->size, r = g->rank, dim = c->dim;
    const size_t esize = fsdp_dtype_size(in->dtype);
    int64_t outer, inner, n = in->shape[dim], off, len;
    outer_inner(in->shape, in->ndim, dim, &outer, &inner);
    const char *x = fsdp_tensor_data(in);
    const int64_t mine = outer * c->out->shape[dim] * inner;
    const size_t recv_bytes = (size_t)((W - 1) * mine) * esize;
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
            srcs[m] = piece;
            continue;
        }
        srcs[m] = buf + (size_t)(slot++ * mine) * esize;
        FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, false, m, kind, (void *)piece,
                                          (size_t)(outer * len * inner) * esize));
    }
    for (int m = 0; m < W; m++)
        if (m != r)
            FSDP_TRY_AT(ctx, fsdp_mpi_post_in(ctx, g, mg, rs, true, m, kind, (void *)srcs[m],
                                              (size_t)mine * esize));
    return FSDP_OK;
}

/* all_reduce's two steps. The exchange: every rank's values of this rank's torch.chunk of the
 * elements are received into buf ((W-1) x the chunk), and srcs[m] (W pointers) is set to
 * member m's; this rank's pieces of the others' chunks are sent. The gather: the chunk is
 * reduced in rank order into t, then sent to every member while theirs are received. */
static fsdp_status all_reduce_exchange(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg,
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

static fsdp_status all_reduce_gather(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg,
                                     mpi_reqs *rs, fsdp_tensor *t, fsdp_reduce_op op,
                                     const fsdp_reduce_options *fuse, const void **srcs, int kind) {
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

fsdp_status fsdp_mpi_coll_post(fsdp_ctx *ctx, const fsdp_group *g, mpi_group *mg, mpi_reqs *rs,
                               const mpi_coll *c, int step, char *buf, const void **srcs,
                               int kind) {
    const fsdp_reduce_options *fuse = c->fused ? &c->fuse : NULL;
    if (c->op == FSDP_COMM_ALL_GATHER) return all_gather_post(ctx, g, mg, rs, c, buf, kind);
    if (c->op == FSDP_COMM_REDUCE_SCATTER)
        return reduce_scatter_post(ctx, g, mg, rs, c, buf, srcs, kind);
    /* all_reduce: 1, each rank gathers every rank's values of its chunk of the elements...
     * 2, ...reduces them in rank order into its own tensor (reading its own block before
     * writing it) and sends its reduced chunk to all (an all_gather of the chunks). */
    if (step == 1) return all_reduce_exchange(ctx, g, mg, rs, c->out, srcs, buf, kind);
    return all_reduce_gather(ctx, g, mg, rs, c->out, c->reduce, fuse, srcs, kind);
}

void fsdp_mpi_coll_finish(const fsdp_group *g, const mpi_coll *c, const char *buf,
                          const void **srcs) {
    if (c->op == FSDP_COMM_ALL_GATHER) {
        all_gather_unpack(g, c, buf);
    } else if (c->op == FSDP_COMM_REDUCE_SCATTER) {
        int64_t outer, inner;
        outer_inner(c->in->shape, c->in->ndim, c->dim, &outer, &inner);
        const int64_t mine = outer * c->out->shape[c->dim] * inner;
        if (mine > 0)
            fsdp_reduce_run_fused(fsdp_tensor_data(c->out), srcs, g->size, 0, mine, c->in->dtype,
                                  c->reduce, c->fused ? &c->fuse : NULL);
    }
}

fsdp_status fsdp_mpi_coll_run(fsdp_ctx *ctx, fsdp_group *g, const mpi_coll *c) {
    mpi_group *mg = g->state;
    fsdp_call call = fsdp_mpi_coll_call(c);
    FSDP_TRY_AT(ctx, fsdp_mpi_arrive(ctx, g, &call));
    char *buf = NULL;
    size_t bytes = fsdp_mpi_coll_scratch(g, c);
    if (bytes > 0) FSDP_TRY_AT(ctx, scratch(ctx, g, mg, bytes, &buf));
    for (int step = 1; step <= fsdp_mpi_coll_steps(c); step++) {
        FSDP_TRY_AT(ctx, fsdp_mpi_coll_post(ctx, g, mg, &mg->rq, c, step, buf, mg->srcs,
                                            fsdp_mpi_step_kind(step)));
        FSDP_TRY_AT(ctx, fsdp_mpi_wait_all(ctx, g, mg, c->op, WAIT_DATA));
    }
    fsdp_mpi_coll_finish(g, c, buf, mg->srcs);
    return FSDP_OK;
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
