/* comm_cases.h: the table of collective calls that the suites of collectives on device tensors
 * share (test_comm_device: the local backend; test_comm_nccl: the nccl backend over the stand-in
 * NCCL), with the inputs they fill and the call each makes. Static definitions: include it in
 * one file of a suite. */
#ifndef FSDP_TESTS_COMM_CASES_H
#define FSDP_TESTS_COMM_CASES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_device.h" // defines: fsdp_comm_work_wait_stream
#include "core/stream.h"      // defines: fsdp_stream_current
#include "fsdp/comm.h"
#include "harness.h"

typedef enum kind {
    K_ALL_REDUCE,
    K_START_HOST,   /* fsdp_all_reduce_start_ex, then fsdp_comm_work_test and _wait */
    K_START_STREAM, /* fsdp_all_reduce_start_ex, then fsdp_comm_work_wait_stream */
    K_REDUCE_SCATTER,
    K_ALL_GATHER,
    K_BROADCAST,
    K_ALL_TO_ALL,
    K_BARRIER,
} kind;

/* How a case's call is made: blocking, or started on a work (fsdp_*_start), some unrelated
 * device work queued, then the work tested and waited for on the host or on the caller's
 * current stream. */
typedef enum wait_kind { W_BLOCK, W_HOST, W_STREAM } wait_kind;

/* One call. shape is the global shape (all_reduce, broadcast: the tensor; reduce_scatter: the
 * input; all_gather: the output; all_to_all: the shape both are chunks of); a first dim of
 * -k means k x the world size. */
typedef struct coll_case {
    kind kind;
    fsdp_dtype dtype;
    fsdp_reduce_op op;
    int ndim;
    int64_t shape[3];
    int dim, dim2; /* all_to_all: split_dim, concat_dim */
    int root;      /* broadcast: -1 for the last rank */
    fsdp_reduce_options opts;
    wait_kind wait; /* K_START_HOST and K_START_STREAM: W_HOST and W_STREAM */
} coll_case;

#define F32  FSDP_DTYPE_F32
#define BF16 FSDP_DTYPE_BF16
#define F16  FSDP_DTYPE_F16
#define I32  FSDP_DTYPE_I32
#define SUM  FSDP_REDUCE_SUM
#define AVG  FSDP_REDUCE_AVG
#define MAX  FSDP_REDUCE_MAX

static const coll_case cases[] = {
    {.kind = K_ALL_REDUCE, .dtype = F32, .op = SUM, .ndim = 1, .shape = {1}},
    {.kind = K_ALL_REDUCE, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}},
    {.kind = K_ALL_REDUCE, .dtype = F32, .op = SUM, .ndim = 2, .shape = {3, 5}},
    {.kind = K_ALL_REDUCE,
     .dtype = F32,
     .op = SUM,
     .ndim = 1,
     .shape = {70001}}, /* above the host's in-place threshold */
    {.kind = K_ALL_REDUCE, .dtype = F32, .op = AVG, .ndim = 1, .shape = {7}},
    {.kind = K_ALL_REDUCE, .dtype = F32, .op = MAX, .ndim = 1, .shape = {13}},
    {.kind = K_ALL_REDUCE, .dtype = BF16, .op = SUM, .ndim = 1, .shape = {7}},
    {.kind = K_ALL_REDUCE, .dtype = F16, .op = AVG, .ndim = 1, .shape = {9}},
    {.kind = K_ALL_REDUCE, .dtype = BF16, .op = MAX, .ndim = 1, .shape = {5}},
    {.kind = K_ALL_REDUCE,
     .dtype = F32,
     .op = SUM,
     .ndim = 1,
     .shape = {7},
     .opts = {.pre_scale = 0.25f, .post_scale = 3.0f}},
    {.kind = K_ALL_REDUCE,
     .dtype = F32,
     .op = AVG,
     .ndim = 1,
     .shape = {11},
     .opts = {.post_scale = 0.5f}},
    {.kind = K_START_HOST, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}},
    {.kind = K_START_HOST, .dtype = BF16, .op = AVG, .ndim = 1, .shape = {1}},
    {.kind = K_START_STREAM, .dtype = F32, .op = AVG, .ndim = 1, .shape = {13}},
    {.kind = K_START_STREAM,
     .dtype = F32,
     .op = SUM,
     .ndim = 1,
     .shape = {7},
     .opts = {.post_scale = 0.5f}},
    {.kind = K_REDUCE_SCATTER,
     .dtype = F32,
     .op = SUM,
     .ndim = 1,
     .shape = {1}}, /* every rank but 0 gets nothing */
    {.kind = K_REDUCE_SCATTER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}},
    {.kind = K_REDUCE_SCATTER, .dtype = F32, .op = SUM, .ndim = 2, .shape = {3, 7}, .dim = 1},
    {.kind = K_REDUCE_SCATTER, .dtype = F32, .op = AVG, .ndim = 2, .shape = {7, 2}},
    {.kind = K_REDUCE_SCATTER, .dtype = F32, .op = MAX, .ndim = 1, .shape = {9}},
    {.kind = K_REDUCE_SCATTER, .dtype = BF16, .op = SUM, .ndim = 1, .shape = {6}},
    {.kind = K_REDUCE_SCATTER, .dtype = F16, .op = AVG, .ndim = 1, .shape = {10}},
    {.kind = K_REDUCE_SCATTER,
     .dtype = F32,
     .op = SUM,
     .ndim = 1,
     .shape = {7},
     .opts = {.pre_scale = 0.5f, .post_scale = 2.0f}},
    {.kind = K_REDUCE_SCATTER,
     .dtype = F32,
     .op = AVG,
     .ndim = 2,
     .shape = {3, 5},
     .dim = 1,
     .opts = {.accumulate = true}},
    {.kind = K_REDUCE_SCATTER,
     .dtype = F32,
     .op = SUM,
     .ndim = 1,
     .shape = {7},
     .opts = {.post_scale = 0.5f, .accumulate = true}},
    {.kind = K_ALL_GATHER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {1}},
    {.kind = K_ALL_GATHER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}},
    {.kind = K_ALL_GATHER, .dtype = F32, .op = SUM, .ndim = 2, .shape = {3, 7}, .dim = 1},
    {.kind = K_ALL_GATHER, .dtype = F32, .op = SUM, .ndim = 3, .shape = {4, 5, 3}, .dim = 1},
    {.kind = K_ALL_GATHER, .dtype = BF16, .op = SUM, .ndim = 1, .shape = {7}},
    {.kind = K_ALL_GATHER, .dtype = I32, .op = SUM, .ndim = 1, .shape = {9}},
    {.kind = K_BROADCAST, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}, .root = 0},
    {.kind = K_BROADCAST, .dtype = F32, .op = SUM, .ndim = 1, .shape = {1}, .root = 1},
    {.kind = K_BROADCAST, .dtype = BF16, .op = SUM, .ndim = 2, .shape = {5, 3}, .root = -1},
    {.kind = K_ALL_TO_ALL,
     .dtype = F32,
     .op = SUM,
     .ndim = 2,
     .shape = {7, 5},
     .dim = 0,
     .dim2 = 1},
    {.kind = K_ALL_TO_ALL,
     .dtype = F32,
     .op = SUM,
     .ndim = 2,
     .shape = {5, 7},
     .dim = 1,
     .dim2 = 0},
    {.kind = K_ALL_TO_ALL,
     .dtype = F32,
     .op = SUM,
     .ndim = 2,
     .shape = {-2, 3},
     .dim = 0,
     .dim2 = 0},
    {.kind = K_ALL_TO_ALL,
     .dtype = I32,
     .op = SUM,
     .ndim = 3,
     .shape = {3, 7, 2},
     .dim = 1,
     .dim2 = 2},
    {.kind = K_BARRIER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {1}},
    /* every other collective started, waited for on the host and on a stream */
    {.kind = K_REDUCE_SCATTER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}, .wait = W_HOST},
    {.kind = K_REDUCE_SCATTER,
     .dtype = BF16,
     .op = AVG,
     .ndim = 2,
     .shape = {3, 7},
     .dim = 1,
     .wait = W_STREAM},
    {.kind = K_REDUCE_SCATTER,
     .dtype = F32,
     .op = AVG,
     .ndim = 2,
     .shape = {3, 5},
     .dim = 1,
     .opts = {.pre_scale = 0.5f, .accumulate = true},
     .wait = W_HOST},
    {.kind = K_ALL_GATHER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}, .wait = W_STREAM},
    {.kind = K_ALL_GATHER,
     .dtype = I32,
     .op = SUM,
     .ndim = 3,
     .shape = {4, 5, 3},
     .dim = 1,
     .wait = W_HOST},
    {.kind = K_BROADCAST,
     .dtype = F16,
     .op = SUM,
     .ndim = 2,
     .shape = {5, 3},
     .root = -1,
     .wait = W_HOST},
    {.kind = K_BROADCAST, .dtype = F32, .op = SUM, .ndim = 1, .shape = {7}, .wait = W_STREAM},
    {.kind = K_ALL_TO_ALL,
     .dtype = F32,
     .op = SUM,
     .ndim = 2,
     .shape = {7, 5},
     .dim = 0,
     .dim2 = 1,
     .wait = W_STREAM},
    {.kind = K_ALL_TO_ALL,
     .dtype = BF16,
     .op = SUM,
     .ndim = 2,
     .shape = {-2, 3},
     .dim = 0,
     .dim2 = 0,
     .wait = W_HOST},
    {.kind = K_BARRIER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {1}, .wait = W_HOST},
    {.kind = K_BARRIER, .dtype = F32, .op = SUM, .ndim = 1, .shape = {1}, .wait = W_STREAM},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Values of mixed magnitude and sign, so that the order of a sum shows in its bits. */
static fsdp_status fill(fsdp_tensor *t, uint64_t salt) {
    void *p = fsdp_tensor_data(t);
    for (int64_t i = 0; i < fsdp_tensor_numel(t); i++) {
        uint64_t h = mix(salt * 1000003u + (uint64_t)i);
        float v = (float)((int64_t)(h % 20001) - 10000) * 1e-4f * (float)(1 + (h >> 32) % 1000);
        switch (fsdp_tensor_dtype(t)) {
        case FSDP_DTYPE_F32:
            ((float *)p)[i] = v;
            break;
        case FSDP_DTYPE_BF16:
            ((fsdp_bf16 *)p)[i] = fsdp_bf16_from_f32(v);
            break;
        case FSDP_DTYPE_F16:
            ((fsdp_f16 *)p)[i] = fsdp_f16_from_f32(v * 1e-3f);
            break;
        default:
            ((int32_t *)p)[i] = (int32_t)(h % 100000);
            break;
        }
    }
    return FSDP_OK;
}

/* The shapes of this rank's input and output for case c in a world of W. */
static void shapes_of(const coll_case *c, int rank, int W, int64_t *in, int64_t *out) {
    int64_t g[3];
    memcpy(g, c->shape, sizeof g);
    if (g[0] < 0) g[0] = -g[0] * W;
    memcpy(in, g, sizeof g);
    memcpy(out, g, sizeof g);
    if (c->kind == K_REDUCE_SCATTER) fsdp_chunk_range(g[c->dim], W, rank, NULL, &out[c->dim]);
    if (c->kind == K_ALL_GATHER) fsdp_chunk_range(g[c->dim], W, rank, NULL, &in[c->dim]);
    if (c->kind == K_ALL_TO_ALL && c->dim != c->dim2) {
        fsdp_chunk_range(g[c->dim2], W, rank, NULL, &in[c->dim2]);
        fsdp_chunk_range(g[c->dim], W, rank, NULL, &out[c->dim]);
    }
}

static bool in_place(const coll_case *c) {
    return c->kind == K_ALL_REDUCE || c->kind == K_START_HOST || c->kind == K_START_STREAM ||
           c->kind == K_BROADCAST;
}

static const fsdp_reduce_options *opts_of(const coll_case *c) {
    const fsdp_reduce_options *o = &c->opts;
    return o->pre_scale == 0.0f && o->post_scale == 0.0f && !o->accumulate ? NULL : o;
}

static wait_kind wait_of(const coll_case *c) {
    return c->kind == K_START_HOST ? W_HOST : c->kind == K_START_STREAM ? W_STREAM : c->wait;
}

/* Case c's call on out and in (one tensor for the in-place ones), started on work when it is
 * not NULL. */
static fsdp_status issue_call(fsdp_ctx *ctx, const coll_case *c, int W, fsdp_tensor *out,
                              fsdp_tensor *in, fsdp_comm_work *work) {
    const int root = c->root < 0 ? W - 1 : c->root % W; // a world of one has root 0 only
    switch (c->kind) {
    case K_ALL_REDUCE:
    case K_START_HOST:
    case K_START_STREAM:
        return work ? fsdp_all_reduce_start_ex(ctx, NULL, out, c->op, opts_of(c), work)
                    : fsdp_all_reduce_ex(ctx, NULL, out, c->op, opts_of(c));
    case K_REDUCE_SCATTER:
        return work ? fsdp_reduce_scatter_start_ex(ctx, NULL, out, in, c->dim, c->op, opts_of(c),
                                                   work)
                    : fsdp_reduce_scatter_ex(ctx, NULL, out, in, c->dim, c->op, opts_of(c));
    case K_ALL_GATHER:
        return work ? fsdp_all_gather_start(ctx, NULL, out, in, c->dim, work)
                    : fsdp_all_gather(ctx, NULL, out, in, c->dim);
    case K_BROADCAST:
        return work ? fsdp_broadcast_start(ctx, NULL, out, root, work)
                    : fsdp_broadcast(ctx, NULL, out, root);
    case K_ALL_TO_ALL:
        return work ? fsdp_all_to_all_start(ctx, NULL, out, in, c->dim, c->dim2, work)
                    : fsdp_all_to_all(ctx, NULL, out, in, c->dim, c->dim2);
    case K_BARRIER:
        return work ? fsdp_barrier_start(ctx, NULL, work) : fsdp_barrier(ctx, NULL);
    }
    return FSDP_ERR_INTERNAL;
}

/* Called between a start and its wait, after the unrelated device work (NULL: nothing); set
 * before a run, read by its ranks. */
static fsdp_status (*between_start_and_wait)(fsdp_ctx *ctx, const coll_case *c,
                                             fsdp_comm_work *work);

/* Device work that has nothing to do with the call in flight, on the caller's stream of dev. */
static fsdp_status unrelated_work(fsdp_ctx *ctx, fsdp_device dev) {
    const int64_t n = 257;
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, dev, 1, &n, &t));
    fsdp_status st = fsdp_tensor_fill(ctx, t, 3.0f);
    fsdp_tensor_free(t);
    return st;
}

/* Makes case c's call on out and in (one tensor for the in-place ones): blocking, or started
 * on work and completed as wait_of(c) says. */
static fsdp_status call(fsdp_ctx *ctx, const coll_case *c, int W, fsdp_tensor *out, fsdp_tensor *in,
                        fsdp_comm_work *work) {
    const wait_kind how = wait_of(c);
    if (how == W_BLOCK) return issue_call(ctx, c, W, out, in, NULL);
    FSDP_TRY(issue_call(ctx, c, W, out, in, work));
    const fsdp_device dev = fsdp_tensor_device(in);
    FSDP_TRY(unrelated_work(ctx, dev));
    if (between_start_and_wait) FSDP_TRY(between_start_and_wait(ctx, c, work));
    if (how == W_STREAM) return fsdp_comm_work_wait_stream(ctx, work, fsdp_stream_current(dev));
    bool done = false;
    FSDP_TRY(fsdp_comm_work_test(ctx, work, &done));
    return fsdp_comm_work_wait(ctx, work);
}

/* A copy of host tensor h on dev. */
static fsdp_status on(fsdp_ctx *ctx, const fsdp_tensor *h, fsdp_device dev, fsdp_tensor **out) {
    FSDP_TRY(fsdp_tensor_create(ctx, fsdp_tensor_dtype(h), dev, fsdp_tensor_ndim(h),
                                fsdp_tensor_shape(h), out));
    return fsdp_tensor_copy(ctx, *out, h);
}

/* Runs case c on tensors of dev (the inputs made on the host with salt, copied over), and
 * leaves the output and then the input, copied back, in *result (malloc'd, *nbytes). */
static fsdp_status run_case(fsdp_ctx *ctx, int rank, int W, const coll_case *c, fsdp_device dev,
                            uint64_t salt, unsigned char **result, size_t *nbytes) {
    int64_t in_shape[3], out_shape[3];
    shapes_of(c, rank, W, in_shape, out_shape);
    fsdp_tensor *hin = NULL, *hout = NULL, *din = NULL, *dout = NULL;
    fsdp_comm_work *work = NULL;
    *result = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, c->dtype, FSDP_CPU, c->ndim, in_shape, &hin);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, c->dtype, FSDP_CPU, c->ndim, out_shape, &hout);
    if (st == FSDP_OK) st = fill(hin, salt * 131u + (uint64_t)rank);
    if (st == FSDP_OK) st = fill(hout, salt * 131u + 64u + (uint64_t)rank); /* accumulate */
    if (st == FSDP_OK) st = on(ctx, hin, dev, &din);
    if (st == FSDP_OK) st = in_place(c) ? FSDP_OK : on(ctx, hout, dev, &dout);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &work);
    if (st == FSDP_OK) st = call(ctx, c, W, in_place(c) ? din : dout, din, work);
    if (st == FSDP_OK && !in_place(c)) st = fsdp_tensor_copy(ctx, hout, dout);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, hin, din);
    size_t a = in_place(c) ? 0 : fsdp_tensor_nbytes(hout), b = fsdp_tensor_nbytes(hin);
    if (st == FSDP_OK && !(*result = malloc(a + b + 1)))
        st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "no memory for a result");
    if (st == FSDP_OK) {
        if (a) memcpy(*result, fsdp_tensor_data(hout), a);
        if (b) memcpy(*result + a, fsdp_tensor_data(hin), b);
        *nbytes = a + b;
    }
    fsdp_comm_work_free(work);
    fsdp_tensor_free(hin), fsdp_tensor_free(hout), fsdp_tensor_free(din), fsdp_tensor_free(dout);
    return st;
}

#endif
