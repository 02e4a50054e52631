/* sdpa_graph.c: cuDNN's fused attention as an operation graph of its C backend API, forward and
 * backward, causal, grouped-query heads, bf16 tensors with f32 softmax and f32 statistics, and
 * its execution plan from cuDNN's heuristics. The graphs are the operations cuDNN's fused
 * flash-attention engines recognise (the ones its C++ frontend lowers an SDPA node to):
 * forward S = Q K^T, S *= scale, causal mask (row index >= column index, else -FLT_MAX), the
 * softmax with its statistics (max, exp, sum, log), O = P V; backward the softmax sum
 * rowsum(dO * O), P recomputed from the statistics, dV = P^T dO, dS = P (dO V^T - sum) scale,
 * dK = dS^T Q, dQ = dS K (accumulated in f32), with dK and dV summed over each group's query
 * heads for grouped-query attention. */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/sdpa_impl.h"

/* The graph under construction: every descriptor made (destroyed with it), the operations, the
 * next virtual id, and the first failure (later calls then do nothing). */
typedef struct gb {
    const fsdp_cudnn_lib *L;
    fsdp_sdpa_plan *p;
    cudnnBackendDescriptor_t ops[48];
    int n_ops;
    int64_t next_uid;
    cudnnStatus_t st;
    char *why;
    size_t why_size;
} gb;

static void gb_fail(gb *g, cudnnStatus_t st, const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = st;
    char detail[256] = "";
    if (g->L->GetLastErrorString) g->L->GetLastErrorString(detail, sizeof detail);
    snprintf(g->why, g->why_size, "%s: %s%s%s", what, g->L->GetErrorString(st),
             detail[0] ? ": " : "", detail);
}

static cudnnBackendDescriptor_t gb_new(gb *g, cudnnBackendDescriptorType_t type, const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->p->n_desc == SDPA_MAX_DESCS) {
        gb_fail(g, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors for one graph");
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = g->L->BackendCreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, st, what);
        return NULL;
    }
    g->p->desc[g->p->n_desc++] = d;
    return d;
}

static void gb_set(gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void *values,
                   const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t st = g->L->BackendSetAttribute(d, name, type, count, values);
    if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, st, what);
}

static void gb_finalize(gb *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t st = g->L->BackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, st, what);
}

/* ---- tensors ---- */

typedef struct shape4 {
    int64_t dim[4], stride[4];
} shape4;

static shape4 sh(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1, int64_t s2,
                 int64_t s3) {
    return (shape4){{d0, d1, d2, d3}, {s0, s1, s2, s3}};
}

/* A packed (d0, d1, d2, d3) tensor. */
static shape4 packed(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return sh(d0, d1, d2, d3, d1 * d2 * d3, d2 * d3, d3, 1);
}

/* uid 0: a virtual tensor (the next virtual id); by_value: a host scalar in the variant pack. */
static cudnnBackendDescriptor_t tensor(gb *g, int64_t uid, cudnnDataType_t type, shape4 s,
                                       bool by_value, const char *name) {
    cudnnBackendDescriptor_t t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    bool is_virtual = uid == 0;
    if (is_virtual) uid = g->next_uid++;
    int64_t align = SDPA_ALIGN;
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, name);
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, s.dim, name);
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, s.stride, name);
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, name);
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, name);
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, name);
    if (by_value)
        gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, name);
    if (uid == SDPA_DQ_ACCUM) {
        cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F16x16;
        gb_set(g, t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &r,
               name);
    }
    gb_finalize(g, t, name);
    return t;
}

static cudnnBackendDescriptor_t virt(gb *g, cudnnDataType_t type, shape4 s, const char *name) {
    return tensor(g, 0, type, s, false, name);
}

/* ---- operations ---- */

static void add_op(gb *g, cudnnBackendDescriptor_t op, const char *name) {
    gb_finalize(g, op, name);
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (g->n_ops == (int)(sizeof g->ops / sizeof *g->ops)) {
        gb_fail(g, CUDNN_STATUS_INTERNAL_ERROR, "too many operations for one graph");
        return;
    }
    g->ops[g->n_ops++] = op;
}

/* y = mode(x[, b][, t]) elementwise, computed in prec; axis >= 0 for GEN_INDEX. */
static cudnnBackendDescriptor_t pw(gb *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                   int64_t axis, cudnnBackendDescriptor_t x,
                                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                                   cudnnBackendDescriptor_t y, const char *name) {
    cudnnBackendDescriptor_t d = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    gb_set(g, d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name);
    gb_set(g, d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, name);
    if (axis >= 0) gb_set(g, d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, name);
    gb_finalize(g, d, name);
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, D, 1, &d, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, D, 1, &x, name);
    if (b) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, D, 1, &b, name);
    if (t) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, D, 1, &t, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, D, 1, &y, name);
    add_op(g, op, name);
    return y;
}

/* f32 y = mode(x, b) of two f32 (or broadcast) tensors; y virtual of shape s. */
static cudnnBackendDescriptor_t pw_f32(gb *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t b, shape4 s, const char *name) {
    return pw(g, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, virt(g, CUDNN_DATA_FLOAT, s, name), name);
}

/* y = the sum or maximum of x onto y's shape (over the dimensions where y has size 1, or over
 * each group of heads where y has fewer) */
static cudnnBackendDescriptor_t reduce(gb *g, cudnnReduceTensorOp_t mode,
                                       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                                       const char *name) {
    cudnnBackendDescriptor_t d = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    gb_set(g, d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, name);
    gb_set(g, d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name);
    gb_finalize(g, d, name);
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, D, 1, &d, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, D, 1, &x, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, D, 1, &y, name);
    add_op(g, op, name);
    return y;
}

/* c = a b (batched over the first two dimensions, b's heads broadcast over a's), f32 compute */
static cudnnBackendDescriptor_t matmul(gb *g, cudnnBackendDescriptor_t a,
                                       cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
                                       const char *name) {
    cudnnBackendDescriptor_t d = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    gb_set(g, d, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name);
    gb_finalize(g, d, name);
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, D, 1, &a, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, D, 1, &b, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, D, 1, &c, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, D, 1, &d, name);
    add_op(g, op, name);
    return c;
}

/* y: x's elements seen through another shape (a transpose here) */
static cudnnBackendDescriptor_t reshape(gb *g, cudnnBackendDescriptor_t x,
                                        cudnnBackendDescriptor_t y, const char *name) {
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, D, 1, &x, name);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, D, 1, &y, name);
    add_op(g, op, name);
    return y;
}

/* ---- the attention ---- */

typedef struct dims {
    int64_t B, T, NH, NKV, D;
} dims;

/* Row-major (B, T, H, D) seen as (B, H, T, D), and its (B, H, D, T) transpose. */
static shape4 bhtd(const dims *d, int64_t H) {
    return sh(d->B, H, d->T, d->D, d->T * H * d->D, d->D, H * d->D, 1);
}

static shape4 bhdt(const dims *d, int64_t H) {
    return sh(d->B, H, d->D, d->T, d->T * H * d->D, d->D, 1, H * d->D);
}

static shape4 row_stats(const dims *d) {
    return packed(d->B, d->NH, d->T, 1);
}

static shape4 scores(const dims *d) {
    return packed(d->B, d->NH, d->T, d->T);
}

/* s (the scaled scores) with the keys after each query set to `neg`: row index >= column index */
static cudnnBackendDescriptor_t causal(gb *g, const dims *d, cudnnBackendDescriptor_t s,
                                       cudnnBackendDescriptor_t neg) {
    shape4 S = scores(d);
    cudnnBackendDescriptor_t row = pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 2, s, NULL,
                                      NULL, virt(g, CUDNN_DATA_INT32, S, "row index"), "row index");
    cudnnBackendDescriptor_t col =
        pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 3, s, NULL, NULL,
           virt(g, CUDNN_DATA_INT32, S, "column index"), "column index");
    cudnnBackendDescriptor_t keep =
        pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL,
           virt(g, CUDNN_DATA_BOOLEAN, S, "causal mask"), "causal mask");
    return pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg, keep,
              virt(g, CUDNN_DATA_FLOAT, S, "masked scores"), "masked scores");
}

/* The scaled, masked scores Q K^T / sqrt(D) of the graph, f32 (B, NH, T, T). */
static cudnnBackendDescriptor_t masked_scores(gb *g, const dims *d, cudnnBackendDescriptor_t q,
                                              cudnnBackendDescriptor_t kt,
                                              cudnnBackendDescriptor_t scale,
                                              cudnnBackendDescriptor_t neg) {
    shape4 S = scores(d);
    cudnnBackendDescriptor_t s = matmul(g, q, kt, virt(g, CUDNN_DATA_FLOAT, S, "q k^T"), "q k^T");
    s = pw_f32(g, CUDNN_POINTWISE_MUL, s, scale, S, "scaled scores");
    return causal(g, d, s, neg);
}

static void forward_ops(gb *g, const dims *d) {
    shape4 S = scores(d), R = row_stats(d), one = packed(1, 1, 1, 1);
    cudnnBackendDescriptor_t q = tensor(g, SDPA_Q, CUDNN_DATA_BFLOAT16, bhtd(d, d->NH), false, "q");
    cudnnBackendDescriptor_t kt =
        tensor(g, SDPA_K, CUDNN_DATA_BFLOAT16, bhdt(d, d->NKV), false, "k");
    cudnnBackendDescriptor_t v =
        tensor(g, SDPA_V, CUDNN_DATA_BFLOAT16, bhtd(d, d->NKV), false, "v");
    cudnnBackendDescriptor_t o =
        tensor(g, SDPA_O, CUDNN_DATA_BFLOAT16, bhtd(d, d->NH), false, "out");
    cudnnBackendDescriptor_t stats = tensor(g, SDPA_STATS, CUDNN_DATA_FLOAT, R, false, "lse");
    cudnnBackendDescriptor_t scale = tensor(g, SDPA_SCALE, CUDNN_DATA_FLOAT, one, true, "scale");
    cudnnBackendDescriptor_t neg = tensor(g, SDPA_NEG, CUDNN_DATA_FLOAT, one, true, "mask value");
    cudnnBackendDescriptor_t s = masked_scores(g, d, q, kt, scale, neg);
    // softmax with statistics: m = max, e = exp(s - m), z = sum e, lse = m + log z, p = e / z
    cudnnBackendDescriptor_t m =
        reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, virt(g, CUDNN_DATA_FLOAT, R, "row max"), "row max");
    cudnnBackendDescriptor_t e = pw_f32(g, CUDNN_POINTWISE_SUB, s, m, S, "s - max");
    e = pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, e, NULL, NULL,
           virt(g, CUDNN_DATA_FLOAT, S, "exp"), "exp");
    cudnnBackendDescriptor_t z =
        reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, virt(g, CUDNN_DATA_FLOAT, R, "row sum"), "row sum");
    cudnnBackendDescriptor_t lz = pw(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, -1, z, NULL, NULL,
                                     virt(g, CUDNN_DATA_FLOAT, R, "log sum"), "log sum");
    pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, -1, m, lz, NULL, stats, "lse");
    // the probabilities go into the second GEMM as bf16, as the engines require
    cudnnBackendDescriptor_t p =
        pw(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, -1, e, z, NULL,
           virt(g, CUDNN_DATA_BFLOAT16, S, "probabilities"), "probabilities");
    matmul(g, p, v, o, "p v");
}

/* dst = x (B, NH, T, D) summed over each group of NH / NKV query heads, or x itself when
 * there is one head per group: x is then the matmul's output, dst. */
static cudnnBackendDescriptor_t group_sum_target(gb *g, const dims *d, cudnnBackendDescriptor_t dst,
                                                 const char *name) {
    if (d->NH == d->NKV) return dst;
    return virt(g, CUDNN_DATA_BFLOAT16, packed(d->B, d->NH, d->T, d->D), name);
}

static void backward_ops(gb *g, const dims *d) {
    shape4 S = scores(d), R = row_stats(d), one = packed(1, 1, 1, 1);
    shape4 ST = sh(d->B, d->NH, d->T, d->T, d->NH * d->T * d->T, d->T * d->T, 1, d->T);
    cudnnBackendDescriptor_t q = tensor(g, SDPA_Q, CUDNN_DATA_BFLOAT16, bhtd(d, d->NH), false, "q");
    cudnnBackendDescriptor_t kt =
        tensor(g, SDPA_K, CUDNN_DATA_BFLOAT16, bhdt(d, d->NKV), false, "k");
    cudnnBackendDescriptor_t vt =
        tensor(g, SDPA_V, CUDNN_DATA_BFLOAT16, bhdt(d, d->NKV), false, "v");
    cudnnBackendDescriptor_t o =
        tensor(g, SDPA_O, CUDNN_DATA_BFLOAT16, bhtd(d, d->NH), false, "out");
    cudnnBackendDescriptor_t dout =
        tensor(g, SDPA_DO, CUDNN_DATA_BFLOAT16, bhtd(d, d->NH), false, "dout");
    cudnnBackendDescriptor_t stats = tensor(g, SDPA_STATS, CUDNN_DATA_FLOAT, R, false, "lse");
    cudnnBackendDescriptor_t scale = tensor(g, SDPA_SCALE, CUDNN_DATA_FLOAT, one, true, "scale");
    cudnnBackendDescriptor_t neg = tensor(g, SDPA_NEG, CUDNN_DATA_FLOAT, one, true, "mask value");
    cudnnBackendDescriptor_t unit = tensor(g, SDPA_ONE, CUDNN_DATA_FLOAT, one, true, "one");
    cudnnBackendDescriptor_t dq =
        tensor(g, SDPA_DQ, CUDNN_DATA_BFLOAT16, bhtd(d, d->NH), false, "dq");
    cudnnBackendDescriptor_t dk =
        tensor(g, SDPA_DK, CUDNN_DATA_BFLOAT16, bhtd(d, d->NKV), false, "dk");
    cudnnBackendDescriptor_t dv =
        tensor(g, SDPA_DV, CUDNN_DATA_BFLOAT16, bhtd(d, d->NKV), false, "dv");
    cudnnBackendDescriptor_t dq_acc = tensor(g, SDPA_DQ_ACCUM, CUDNN_DATA_FLOAT,
                                             packed(d->B, d->NH, d->T, d->D), false, "dq (f32)");
    // the softmax sum: rowsum(dout * out)
    cudnnBackendDescriptor_t sum =
        pw_f32(g, CUDNN_POINTWISE_MUL, dout, o, bhtd(d, d->NH), "dout * out");
    sum = reduce(g, CUDNN_REDUCE_TENSOR_ADD, sum, virt(g, CUDNN_DATA_FLOAT, R, "softmax sum"),
                 "softmax sum");
    sum = pw_f32(g, CUDNN_POINTWISE_MUL, sum, unit, R, "softmax sum * 1");
    // p = exp(s - lse), and dv = p^T dout (summed over each group)
    cudnnBackendDescriptor_t s = masked_scores(g, d, q, kt, scale, neg);
    s = pw_f32(g, CUDNN_POINTWISE_SUB, s, stats, S, "s - lse");
    cudnnBackendDescriptor_t p = pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, s, NULL, NULL,
                                    virt(g, CUDNN_DATA_FLOAT, S, "probabilities"), "probabilities");
    cudnnBackendDescriptor_t pt = reshape(g, p, virt(g, CUDNN_DATA_BFLOAT16, ST, "p^T"), "p^T");
    cudnnBackendDescriptor_t dv_full =
        matmul(g, pt, dout, group_sum_target(g, d, dv, "dv per head"), "p^T dout");
    if (dv_full != dv) reduce(g, CUDNN_REDUCE_TENSOR_ADD, dv_full, dv, "dv group sum");
    // ds = p (dout v^T - sum) scale
    cudnnBackendDescriptor_t ds =
        matmul(g, dout, vt, virt(g, CUDNN_DATA_FLOAT, S, "dout v^T"), "dout v^T");
    ds = pw_f32(g, CUDNN_POINTWISE_MUL, ds, unit, S, "dp * 1");
    ds = pw_f32(g, CUDNN_POINTWISE_SUB, ds, sum, S, "dp - softmax sum");
    ds = pw_f32(g, CUDNN_POINTWISE_MUL, ds, p, S, "ds");
    ds = pw_f32(g, CUDNN_POINTWISE_MUL, ds, scale, S, "ds * scale");
    // dk = ds^T q (summed over each group), dq = ds k accumulated in f32, then rounded
    cudnnBackendDescriptor_t dst = reshape(g, ds, virt(g, CUDNN_DATA_BFLOAT16, ST, "ds^T"), "ds^T");
    cudnnBackendDescriptor_t dk_full =
        matmul(g, dst, q, group_sum_target(g, d, dk, "dk per head"), "ds^T q");
    if (dk_full != dk) reduce(g, CUDNN_REDUCE_TENSOR_ADD, dk_full, dk, "dk group sum");
    cudnnBackendDescriptor_t k =
        reshape(g, kt, virt(g, CUDNN_DATA_BFLOAT16, bhtd(d, d->NKV), "k"), "k from k^T");
    matmul(g, ds, k, dq_acc, "ds k");
    pw(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, -1, dq_acc, NULL, NULL, dq, "dq");
}

static void gb_init(gb *g, const fsdp_cudnn_lib *lib, fsdp_sdpa_plan *p, char *why,
                    size_t why_size) {
    memset(p, 0, sizeof *p);
    *g = (gb){.L = lib,
              .p = p,
              .next_uid = SDPA_VIRTUAL,
              .st = CUDNN_STATUS_SUCCESS,
              .why = why,
              .why_size = why_size};
    if (why_size > 0) why[0] = '\0';
}

static void graph_ops(gb *g, bool backward, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                      int64_t D) {
    dims d = {B, T, NH, NKV, D};
    if (backward)
        backward_ops(g, &d);
    else
        forward_ops(g, &d);
}

cudnnStatus_t fsdp_sdpa_ops_check(const fsdp_cudnn_lib *lib, bool backward, int64_t B, int64_t T,
                                  int64_t NH, int64_t NKV, int64_t D, char *why, size_t why_size) {
    fsdp_sdpa_plan p;
    gb g;
    gb_init(&g, lib, &p, why, why_size);
    graph_ops(&g, backward, B, T, NH, NKV, D);
    fsdp_sdpa_plan_free(lib, &p);
    return g.st;
}

/* The heuristics' engine configurations, best first; the first whose plan finalizes wins. */
static void make_plan(gb *g, cudnnHandle_t handle, cudnnBackendDescriptor_t graph) {
    cudnnBackendDescriptor_t heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
           "heuristics");
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    gb_finalize(g, heur, "heuristics");
    enum { MAX_CFGS = 8 };
    cudnnBackendDescriptor_t cfg[MAX_CFGS];
    for (int i = 0; i < MAX_CFGS; i++)
        cfg[i] = gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "configs");
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    int64_t n = 0;
    cudnnStatus_t st = g->L->BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CFGS, &n, cfg);
    if (st != CUDNN_STATUS_SUCCESS || n == 0) {
        gb_fail(g, st != CUDNN_STATUS_SUCCESS ? st : CUDNN_STATUS_NOT_SUPPORTED,
                "the heuristics found no engine for the graph");
        return;
    }
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < n && i < MAX_CFGS; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (g->L->BackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
            CUDNN_STATUS_SUCCESS)
            continue;
        last = g->L->BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                         1, &handle);
        if (last == CUDNN_STATUS_SUCCESS)
            last = g->L->BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (last == CUDNN_STATUS_SUCCESS) last = g->L->BackendFinalize(plan);
        int64_t ws = 0, got = 0;
        if (last == CUDNN_STATUS_SUCCESS)
            last = g->L->BackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                             CUDNN_TYPE_INT64, 1, &got, &ws);
        if (last == CUDNN_STATUS_SUCCESS) {
            g->p->plan = plan;
            g->p->workspace = ws;
            g->p->desc[g->p->n_desc++] = plan; // room: MAX_CFGS + 2 were left for these
            return;
        }
        g->L->BackendDestroyDescriptor(plan);
    }
    gb_fail(g, last, "no engine configuration finalized a plan");
}

cudnnStatus_t fsdp_sdpa_plan_build(const fsdp_cudnn_lib *lib, cudnnHandle_t handle, bool backward,
                                   int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D,
                                   fsdp_sdpa_plan *out, char *why, size_t why_size) {
    gb g;
    gb_init(&g, lib, out, why, why_size);
    graph_ops(&g, backward, B, T, NH, NKV, D);
    cudnnBackendDescriptor_t graph =
        gb_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
           "operation graph");
    gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.n_ops, g.ops,
           "operation graph");
    gb_finalize(&g, graph, "operation graph");
    if (g.st == CUDNN_STATUS_SUCCESS && out->n_desc > SDPA_MAX_DESCS - 10)
        gb_fail(&g, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors for one graph");
    make_plan(&g, handle, graph);
    if (g.st != CUDNN_STATUS_SUCCESS) fsdp_sdpa_plan_free(lib, out);
    return g.st;
}

void fsdp_sdpa_plan_free(const fsdp_cudnn_lib *lib, fsdp_sdpa_plan *p) {
    for (int i = p->n_desc - 1; i >= 0; i--) lib->BackendDestroyDescriptor(p->desc[i]);
    p->n_desc = 0;
    p->plan = NULL;
}
