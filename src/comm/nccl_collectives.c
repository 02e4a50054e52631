/* nccl_collectives.c: the nccl backend's collectives on device tensors. NCCL moves contiguous
 * pieces of equal size, so a call whose pieces are not (a dim other than the outermost, or
 * torch.chunk's uneven last pieces) is staged: the pieces are copied into padded contiguous
 * device buffers, NCCL moves those, and the result is copied out, all on the communication
 * stream. Scales that NCCL cannot apply (fsdp_reduce_options) run as passes of the device's
 * reduce_n on the same stream: before the reduction over a staged copy of the input, after it
 * over the result. ncclAvg serves FSDP_REDUCE_AVG. */
#include <string.h>

#include "comm/nccl_impl.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor_impl.h"

/* ---- device copies and buffers on the communication stream ---- */

typedef struct dev_box {
    const nccl_call *c;
    char *dst;
    const char *src;
} dev_box;

static fsdp_status dev_run(void *user, size_t dst_off, size_t src_off, size_t bytes, size_t rows,
                           size_t dst_pitch, size_t src_pitch) {
    const dev_box *b = user;
    char *dst = b->dst + dst_off;
    const char *src = b->src + src_off;
    if (dst == src && (rows == 1 || dst_pitch == src_pitch)) return FSDP_OK;
    if (rows == 1) return b->c->rec->copy(b->c->ctx, dst, b->c->dev, src, b->c->dev, bytes);
    return b->c->rec->copy_2d(b->c->ctx, dst, b->c->dev, dst_pitch, src, b->c->dev, src_pitch,
                              bytes, rows);
}

/* Copies a box of `box` elements per dim from src (shape src_shape, at src_at) into dst (shape
 * dst_shape, at dst_at), both on the call's device. */
static fsdp_status box_copy(const nccl_call *c, void *dst, const int64_t *dst_shape,
                            const int64_t *dst_at, const void *src, const int64_t *src_shape,
                            const int64_t *src_at, const int64_t *box, int ndim, size_t esize) {
    dev_box b = {c, dst, src};
    return fsdp_box_runs(dst_shape, dst_at, src_shape, src_at, box, ndim, esize, dev_run, &b);
}

/* Device memory for the call, ordered on the communication stream (current while the call
 * enqueues); NULL for 0 bytes. Freed by buf_free on the same stream, after its readers. */
static fsdp_status buf_alloc(const nccl_call *c, size_t bytes, char **out) {
    *out = NULL;
    if (bytes == 0) return FSDP_OK;
    void *p = NULL;
    FSDP_TRY_AT(c->ctx, c->rec->alloc(c->ctx, c->dev.index, bytes, &p));
    *out = p;
    return FSDP_OK;
}

static void buf_free(const nccl_call *c, char *p) {
    if (p) c->rec->free(c->dev.index, p);
}

static int64_t prod(const int64_t *shape, int from, int to) {
    int64_t n = 1;
    for (int i = from; i < to; i++) n *= shape[i];
    return n;
}

static int64_t chunk_len(int64_t n, int parts, int index) {
    int64_t b, len;
    fsdp_chunk_range(n, parts, index, &b, &len);
    return len;
}

static fsdp_status check(nccl_call *c, const char *what, ncclResult_t r) {
    return r == ncclSuccess ? FSDP_OK : fsdp_nccl_fail(c, what, r);
}

static ncclRedOp_t red_op(fsdp_reduce_op op) {
    return op == FSDP_REDUCE_AVG ? ncclAvg : op == FSDP_REDUCE_MAX ? ncclMax : ncclSum;
}

/* dst = scale pass over src (n elements): SUM of one input with the given scales, so each
 * element is rounded as the local backend's fused pass rounds that step. */
static void scale_pass(const nccl_call *c, void *dst, const void *src, int64_t n, fsdp_dtype dtype,
                       float pre, float post, bool accumulate) {
    const fsdp_reduce_n_args args = {FSDP_REDUCE_KIND_SUM, pre, post, accumulate};
    const void *in[1] = {src};
    if (n > 0) fsdp_kernels_for(c->dev)->reduce_n(dst, in, 1, n, dtype, &args);
}

/* ---- all_gather ---- */

static fsdp_status gather_enqueue(nccl_call *c, fsdp_tensor *out, const fsdp_tensor *in, int dim) {
    const int W = c->g->size, nd = out->ndim;
    const size_t esize = fsdp_dtype_size(out->dtype);
    const ncclDataType_t dt = fsdp_nccl_dtype(out->dtype);
    const int64_t n = out->shape[dim], chunk = (n + W - 1) / W;
    const int64_t outer = prod(out->shape, 0, dim), inner = prod(out->shape, dim + 1, nd);
    const int64_t piece = outer * chunk * inner;
    if (out->numel == 0) return FSDP_OK;
    if (outer == 1 && n % W == 0)
        return check(c, "ncclAllGather",
                     c->lib->AllGather(fsdp_tensor_data(in), fsdp_tensor_data(out), (size_t)piece,
                                       dt, c->comm, (cudaStream_t)c->comm_stream.handle));
    int64_t padded[FSDP_MAX_DIMS], at[FSDP_MAX_DIMS] = {0}, zeros[FSDP_MAX_DIMS] = {0};
    memcpy(padded, out->shape, sizeof padded);
    padded[dim] = chunk;
    char *send = NULL, *recv = NULL;
    fsdp_status st = buf_alloc(c, (size_t)piece * esize, &send);
    if (st == FSDP_OK) st = buf_alloc(c, (size_t)(W * piece) * esize, &recv);
    if (st == FSDP_OK && in->numel > 0)
        st = box_copy(c, send, padded, zeros, fsdp_tensor_data(in), in->shape, zeros, in->shape, nd,
                      esize);
    if (st == FSDP_OK)
        st = check(c, "ncclAllGather",
                   c->lib->AllGather(send, recv, (size_t)piece, dt, c->comm,
                                     (cudaStream_t)c->comm_stream.handle));
    for (int r = 0; r < W && st == FSDP_OK; r++) {
        int64_t box[FSDP_MAX_DIMS];
        memcpy(box, padded, sizeof box);
        fsdp_chunk_range(n, W, r, &at[dim], &box[dim]);
        if (box[dim] > 0)
            st = box_copy(c, fsdp_tensor_data(out), out->shape, at,
                          recv + (size_t)(r * piece) * esize, padded, zeros, box, nd, esize);
    }
    buf_free(c, send);
    buf_free(c, recv);
    return st;
}

/* The call is enqueued: a blocking call polls it to its end, a start hands it to its work. */
static fsdp_status finish(nccl_call *c, fsdp_comm_work *work) {
    return work ? fsdp_nccl_call_to_work(c, work) : fsdp_nccl_call_finish(c);
}

fsdp_status fsdp_nccl_all_gather(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                 const fsdp_tensor *in, int dim, fsdp_comm_work *work) {
    fsdp_call post = fsdp_call_all_gather(out, in, dim);
    nccl_call c;
    FSDP_TRY_AT(ctx, fsdp_nccl_call_begin(&c, ctx, g, fsdp_tensor_device(out), &post));
    FSDP_TRY_AT(ctx, fsdp_nccl_call_launched(&c, gather_enqueue(&c, out, in, dim)));
    return finish(&c, work);
}

/* ---- reduce_scatter ---- */

static fsdp_status scatter_enqueue(nccl_call *c, fsdp_tensor *out, const fsdp_tensor *in, int dim,
                                   fsdp_reduce_op op, const fsdp_reduce_options *fuse) {
    const int W = c->g->size, nd = in->ndim;
    const size_t esize = fsdp_dtype_size(in->dtype);
    const ncclDataType_t dt = fsdp_nccl_dtype(in->dtype);
    const int64_t n = in->shape[dim], chunk = (n + W - 1) / W;
    const int64_t outer = prod(in->shape, 0, dim), inner = prod(in->shape, dim + 1, nd);
    const int64_t piece = outer * chunk * inner;
    const bool pre = fuse && fuse->pre_scale != 1.0f;
    const bool after = fuse && (fuse->post_scale != 1.0f || fuse->accumulate);
    const bool direct = outer == 1 && n % W == 0;
    if (in->numel == 0) return FSDP_OK;
    int64_t padded[FSDP_MAX_DIMS], at[FSDP_MAX_DIMS] = {0}, zeros[FSDP_MAX_DIMS] = {0};
    memcpy(padded, in->shape, sizeof padded);
    padded[dim] = chunk;
    char *send = NULL, *recv = NULL, *result = NULL;
    const char *src = fsdp_tensor_data(in);
    fsdp_status st = FSDP_OK;
    if (!direct || pre) {
        st = buf_alloc(c, (size_t)(W * piece) * esize, &send);
        for (int r = 0; r < W && st == FSDP_OK && !direct; r++) {
            int64_t box[FSDP_MAX_DIMS];
            memcpy(box, padded, sizeof box);
            fsdp_chunk_range(n, W, r, &at[dim], &box[dim]);
            if (box[dim] > 0)
                st = box_copy(c, send + (size_t)(r * piece) * esize, padded, zeros, src, in->shape,
                              at, box, nd, esize);
        }
        if (st == FSDP_OK && pre)
            scale_pass(c, send, direct ? src : send, W * piece, in->dtype, fuse->pre_scale, 1.0f,
                       false);
        src = send;
    }
    /* The result lands in out when it has out's layout and needs no pass after. */
    const int64_t mine = chunk_len(n, W, c->g->rank);
    const bool same_layout = outer == 1 || mine == chunk;
    char *dst = fsdp_tensor_data(out);
    if (st == FSDP_OK && (!same_layout || after || mine < chunk))
        st = buf_alloc(c, (size_t)piece * esize, &recv);
    if (st == FSDP_OK)
        st = check(c, "ncclReduceScatter",
                   c->lib->ReduceScatter(src, recv ? recv : dst, (size_t)piece, dt, red_op(op),
                                         c->comm, (cudaStream_t)c->comm_stream.handle));
    if (st == FSDP_OK && recv && mine > 0) {
        const char *res = recv;
        if (!same_layout) { /* into out's layout: through `result` when a pass follows */
            int64_t box[FSDP_MAX_DIMS];
            memcpy(box, padded, sizeof box);
            box[dim] = mine;
            if (after) st = buf_alloc(c, (size_t)out->numel * esize, &result);
            if (st == FSDP_OK)
                st = box_copy(c, after ? result : dst, out->shape, zeros, recv, padded, zeros, box,
                              nd, esize);
            res = result;
        }
        if (st == FSDP_OK && after)
            scale_pass(c, dst, res, out->numel, in->dtype, 1.0f, fuse->post_scale,
                       fuse->accumulate);
        else if (st == FSDP_OK && same_layout)
            st = c->rec->copy(c->ctx, dst, c->dev, recv, c->dev, (size_t)out->numel * esize);
    }
    buf_free(c, send);
    buf_free(c, recv);
    buf_free(c, result);
    return st;
}

fsdp_status fsdp_nccl_reduce_scatter(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                     const fsdp_tensor *in, int dim, fsdp_reduce_op op,
                                     const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    fsdp_call post = fsdp_call_reduce_scatter(out, in, dim, op);
    nccl_call c;
    FSDP_TRY_AT(ctx, fsdp_nccl_call_begin(&c, ctx, g, fsdp_tensor_device(out), &post));
    FSDP_TRY_AT(ctx, fsdp_nccl_call_launched(&c, scatter_enqueue(&c, out, in, dim, op, fuse)));
    return finish(&c, work);
}

/* ---- all_reduce, broadcast ---- */

static fsdp_status reduce_enqueue(nccl_call *c, fsdp_tensor *t, fsdp_reduce_op op,
                                  const fsdp_reduce_options *fuse) {
    void *data = fsdp_tensor_data(t);
    if (t->numel == 0) return FSDP_OK;
    if (fuse && fuse->pre_scale != 1.0f)
        scale_pass(c, data, data, t->numel, t->dtype, fuse->pre_scale, 1.0f, false);
    FSDP_TRY_AT(c->ctx,
                check(c, "ncclAllReduce",
                      c->lib->AllReduce(data, data, (size_t)t->numel, fsdp_nccl_dtype(t->dtype),
                                        red_op(op), c->comm, (cudaStream_t)c->comm_stream.handle)));
    if (fuse && fuse->post_scale != 1.0f)
        scale_pass(c, data, data, t->numel, t->dtype, 1.0f, fuse->post_scale, false);
    return FSDP_OK;
}

fsdp_status fsdp_nccl_all_reduce(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, fsdp_reduce_op op,
                                 const fsdp_reduce_options *fuse, fsdp_comm_work *work) {
    fsdp_call post = fsdp_call_all_reduce(t, op);
    nccl_call c;
    FSDP_TRY_AT(ctx, fsdp_nccl_call_begin(&c, ctx, g, fsdp_tensor_device(t), &post));
    FSDP_TRY_AT(ctx, fsdp_nccl_call_launched(&c, reduce_enqueue(&c, t, op, fuse)));
    return finish(&c, work);
}

fsdp_status fsdp_nccl_broadcast(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *t, int root,
                                fsdp_comm_work *work) {
    fsdp_call post = fsdp_call_broadcast(t, root);
    nccl_call c;
    FSDP_TRY_AT(ctx, fsdp_nccl_call_begin(&c, ctx, g, fsdp_tensor_device(t), &post));
    fsdp_status st = FSDP_OK;
    if (t->numel > 0)
        st = check(&c, "ncclBroadcast",
                   c.lib->Broadcast(fsdp_tensor_data(t), fsdp_tensor_data(t), (size_t)t->numel,
                                    fsdp_nccl_dtype(t->dtype), root, c.comm,
                                    (cudaStream_t)c.comm_stream.handle));
    FSDP_TRY_AT(ctx, fsdp_nccl_call_launched(&c, st));
    return finish(&c, work);
}

/* ---- all_to_all: ncclSend/ncclRecv in a group, through packed buffers ---- */

/* The shape of member p's piece for member q: p's input (the global shape with concat_dim cut
 * to p's chunk, when the dims differ) with split_dim cut to q's chunk. */
static void piece_shape(const fsdp_call *post, int W, int p, int q, int64_t *shape) {
    memcpy(shape, post->shape, sizeof(int64_t) * FSDP_MAX_DIMS);
    const int split = post->dim, concat = post->dim2;
    if (split != concat) shape[concat] = chunk_len(post->shape[concat], W, p);
    shape[split] = split == concat ? shape[split] / W : chunk_len(shape[split], W, q);
}

static fsdp_status a2a_enqueue(nccl_call *c, const fsdp_call *post, fsdp_tensor *out,
                               const fsdp_tensor *in) {
    const int W = c->g->size, me = c->g->rank, nd = in->ndim, split = post->dim,
              concat = post->dim2;
    const size_t esize = fsdp_dtype_size(in->dtype);
    const ncclDataType_t dt = fsdp_nccl_dtype(in->dtype);
    int64_t zeros[FSDP_MAX_DIMS] = {0}, shape[FSDP_MAX_DIMS];
    char *send = NULL, *recv = NULL;
    fsdp_status st = buf_alloc(c, (size_t)in->numel * esize, &send);
    if (st == FSDP_OK) st = buf_alloc(c, (size_t)out->numel * esize, &recv);
    int64_t off = 0;
    for (int p = 0; p < W && st == FSDP_OK; p++) { /* pack: piece p of my input, for p */
        int64_t at[FSDP_MAX_DIMS] = {0};
        piece_shape(post, W, me, p, shape);
        fsdp_chunk_range(in->shape[split], W, p, &at[split], NULL);
        const int64_t count = prod(shape, 0, nd);
        if (count > 0)
            st = box_copy(c, send + (size_t)off * esize, shape, zeros, fsdp_tensor_data(in),
                          in->shape, at, shape, nd, esize);
        off += count;
    }
    const bool grouped = st == FSDP_OK;
    if (grouped) st = check(c, "ncclGroupStart", c->lib->GroupStart());
    int64_t soff = 0, roff = 0;
    for (int p = 0; p < W && st == FSDP_OK; p++) {
        piece_shape(post, W, me, p, shape);
        const int64_t scount = prod(shape, 0, nd);
        piece_shape(post, W, p, me, shape);
        const int64_t rcount = prod(shape, 0, nd);
        cudaStream_t s = (cudaStream_t)c->comm_stream.handle;
        /* Empty pieces too: every member posts a send and a receive for every peer. */
        st = check(c, "ncclSend",
                   c->lib->Send(send ? send + (size_t)soff * esize : NULL, (size_t)scount, dt, p,
                                c->comm, s));
        if (st == FSDP_OK)
            st = check(c, "ncclRecv",
                       c->lib->Recv(recv ? recv + (size_t)roff * esize : NULL, (size_t)rcount, dt,
                                    p, c->comm, s));
        soff += scount;
        roff += rcount;
    }
    if (grouped) { /* closes the group also after a failure */
        ncclResult_t end = c->lib->GroupEnd();
        if (st == FSDP_OK) st = check(c, "ncclGroupEnd", end);
    }
    int64_t at[FSDP_MAX_DIMS] = {0};
    roff = 0;
    for (int p = 0; p < W && st == FSDP_OK; p++) { /* unpack along concat_dim */
        piece_shape(post, W, p, me, shape);
        const int64_t count = prod(shape, 0, nd);
        if (count > 0)
            st = box_copy(c, fsdp_tensor_data(out), out->shape, at, recv + (size_t)roff * esize,
                          shape, zeros, shape, nd, esize);
        at[concat] += shape[concat];
        roff += count;
    }
    buf_free(c, send);
    buf_free(c, recv);
    return st;
}

fsdp_status fsdp_nccl_all_to_all(fsdp_ctx *ctx, fsdp_group *g, fsdp_tensor *out,
                                 const fsdp_tensor *in, int split_dim, int concat_dim,
                                 fsdp_comm_work *work) {
    fsdp_call post = fsdp_call_all_to_all(out, in, split_dim, concat_dim);
    nccl_call c;
    FSDP_TRY_AT(ctx, fsdp_nccl_call_begin(&c, ctx, g, fsdp_tensor_device(out), &post));
    FSDP_TRY_AT(ctx, fsdp_nccl_call_launched(&c, a2a_enqueue(&c, &post, out, in)));
    return finish(&c, work);
}
