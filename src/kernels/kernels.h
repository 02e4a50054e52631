/* kernels.h: the operator table of one device. Callers never branch on the device: they
 * fetch the table for a tensor's device and call through it. Pointers are that device's
 * memory; sizes are element counts; all math is f32, row-major, contiguous.
 * Conventions (llm.c style): outputs first, then saved state, then inputs, then sizes.
 * "+=" marks entries that accumulate into their output; all others overwrite it.
 * No entry allocates memory. On CUDA and sim every entry runs on the calling thread's current
 * stream of the arrays' device (its default stream, the rank's compute stream, unless another
 * was made current: the collectives run reduce_n on the communication stream); entries that
 * return a value to the host (reductions, losses) wait for it. */
#ifndef FSDP_KERNELS_H
#define FSDP_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/tensor.h"

/* The scalars of one SGD step (src/optim/update.c computes them from the options, rounded to
 * f32 where PyTorch rounds them). Per element, with d the update direction:
 *   d = sign * g + weight_decay * p
 *   with a buffer: buf = first ? d : buf * momentum + keep * d;
 *                  d = nesterov ? d + momentum * buf : buf
 *   p += neg_lr * d */
typedef struct fsdp_sgd_step_args {
    float sign, weight_decay, momentum, keep, neg_lr;
    bool nesterov, first;
} fsdp_sgd_step_args;

/* The scalars of one Adam/AdamW step. Per element:
 *   g' = sign * g + l2 * p;  p' = p * shrink;  m = m + w1 * (g' - m);
 *   v = v * beta2 + w2 * g' * g';  vv = amsgrad ? (vmax = max(vmax, v)) : v
 *   p = p' + neg_step_size * m / (sqrt(vv) / bc2_sqrt + eps) */
typedef struct fsdp_adam_step_args {
    float sign, l2, shrink, w1, beta2, w2, eps, neg_step_size, bc2_sqrt;
} fsdp_adam_step_args;

/* One tensor of a multi-tensor Adam/AdamW step (adam_update_multi): p, g, m, v (n) each, this
 * device's memory; vmax (n) or NULL (no amsgrad); p_bf16 (n) or NULL (no bf16 copy). */
typedef struct fsdp_adam_tensor {
    float *p;
    const float *g;
    float *m, *v, *vmax;
    fsdp_bf16 *p_bf16;
    int64_t n;
} fsdp_adam_tensor;

/* The tensors one launch of adam_update_multi and fill_multi takes at most: CUDA passes the
 * list by value in the kernel's parameters (4 KiB on every architecture, kernels/cuda/optim.cu
 * checks the size), so a longer list is split into chunks of these; the sim splits it alike,
 * so that both count the same launches. */
#define FSDP_ADAM_MULTI_CHUNK 48
#define FSDP_FILL_MULTI_CHUNK 160

/* How reduce_n combines its inputs: the collectives' reductions. */
typedef enum fsdp_reduce_kind {
    FSDP_REDUCE_KIND_SUM = 0,
    FSDP_REDUCE_KIND_AVG, /* the sum divided by n */
    FSDP_REDUCE_KIND_MAX, /* NaN wins */
} fsdp_reduce_kind;

/* What reduce_n does besides combining. The scales and accumulate apply to f32 sums and
 * averages only (the other reductions ignore them); per element, each input times pre_scale,
 * the reduction, times post_scale, then stored or (accumulate) added to out, each step rounded
 * to f32 as separate passes would round it. */
typedef struct fsdp_reduce_n_args {
    fsdp_reduce_kind kind;
    float pre_scale;  /* 1: none */
    float post_scale; /* 1: none */
    bool accumulate;
} fsdp_reduce_n_args;

/* The activation a fused GEMM epilogue applies (gemm_bias_act, gemm_bf16_bias_act): the
 * table's own relu_forward and gelu_forward (GELU's tanh approximation, the form cuBLASLt's
 * GELU epilogue computes). */
typedef enum fsdp_gemm_act {
    FSDP_GEMM_ACT_NONE = 0,
    FSDP_GEMM_ACT_RELU,
    FSDP_GEMM_ACT_GELU,
} fsdp_gemm_act;

/* The inputs one reduce_n takes at most (CUDA passes their pointers as a launch argument). */
#define FSDP_REDUCE_N_MAX 256

/* The floats of scratch the bf16-tensor attention entries take (attention_forward_bf16_round,
 * attention_backward_bf16_round): the (2, T, T) score blocks, then one batch's widened tensors
 * (the backward's dout, q, out, dq (T, NH, D) and k, v, dk, dv (T, NKV, D)). */
#define FSDP_ATTENTION_BF16_SCRATCH(T, NH, NKV, D) (2 * (T) * (T) + 4 * (T) * ((NH) + (NKV)) * (D))

typedef struct fsdp_kernels_i {
    const char *name; /* "cpu", "cuda" */

    /* C (M, N) = alpha * op(A) op(B) + beta * C, op(X) = X or X^T. op(A) is (M, K), op(B)
     * (K, N); lda/ldb/ldc are the row strides of A, B, C as stored. */
    void (*gemm)(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc);
    /* gemm with bf16 A and B (widened exactly) and f32 C: every product exact, accumulated in
     * f32 in an order each device chooses (the CPU by blocks of K, CUDA on tensor cores), so
     * devices agree to f32 accumulation rounding, not bit for bit. C is not rounded to bf16:
     * the caller rounds where its precision policy says. */
    void (*gemm_bf16)(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb, float beta,
                      float *C, int64_t ldc);
    /* Linear's forward GEMM with its epilogue: out (rows, OC) = act(inp (rows, C) weight (OC, C)^T
     * + bias (OC)); bias may be NULL (none); pre (rows, OC) may be NULL, else it gets the
     * pre-activation (what act's backward reads). The result is that of gemm (beta 0), bias_add,
     * copy to pre, then act's forward in place, in that order: the CPU and sim run exactly those
     * entries (bitwise); CUDA fuses them in cuBLASLt's epilogue where it can (docs/cuda.md) and
     * agrees to the GEMM's rounding. */
    void (*gemm_bias_act)(float *out, float *pre, const float *inp, const float *weight,
                          const float *bias, int64_t rows, int64_t C, int64_t OC,
                          fsdp_gemm_act act);
    /* the same with bf16 inp and weight, as gemm_bf16 then the epilogue: f32 accumulation, f32
     * bias, f32 out and pre (not rounded to bf16) */
    void (*gemm_bf16_bias_act)(float *out, float *pre, const fsdp_bf16 *inp,
                               const fsdp_bf16 *weight, const float *bias, int64_t rows, int64_t C,
                               int64_t OC, fsdp_gemm_act act);
    /* Linear's weight gradient with the bias gradient: dweight (OC, C) += dout (rows, OC)^T inp
     * (rows, C); dbias (OC) += the column sums of dout (NULL: none). The result is that of gemm
     * (beta 1) then bias_backward: bitwise on the CPU and sim; CUDA fuses the sums into the
     * GEMM (cuBLASLt's BGRADB epilogue) where it can. */
    void (*gemm_bgrad)(float *dweight, float *dbias, const float *dout, const float *inp,
                       int64_t rows, int64_t C, int64_t OC);
    /* C (M, N) bf16 = op(A) op(B) rounded to bf16 (nearest even), bf16 A and B: on the CPU (and
     * sim) each element the bits of gemm_bf16 (alpha 1, beta 0) then f32_to_bf16, through the
     * same blocks of K and cblas_sgemm calls; on CUDA cuBLAS writes bf16 (its f32 accumulation
     * rounded once). What a layer that keeps its output in bf16 runs, with no f32 copy. */
    void (*gemm_bf16_round)(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                            fsdp_bf16 *C, int64_t ldc);
    /* out (rows, cols) += bias (cols) broadcast over rows */
    void (*bias_add)(float *out, const float *bias, int64_t rows, int64_t cols);
    /* dbias (cols) += sum over rows of dout (rows, cols) */
    void (*bias_backward)(float *dbias, const float *dout, int64_t rows, int64_t cols);

    void (*relu_forward)(float *out, const float *inp, int64_t n);
    /* dinp = dout * (inp > 0) */
    void (*relu_backward)(float *dinp, const float *inp, const float *dout, int64_t n);
    void (*sigmoid_forward)(float *out, const float *inp, int64_t n);
    /* dinp = dout * out * (1 - out), from the forward output */
    void (*sigmoid_backward)(float *dinp, const float *out, const float *dout, int64_t n);
    /* GELU, tanh approximation */
    void (*gelu_forward)(float *out, const float *inp, int64_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, int64_t n);

    /* out (rows, cols) = inp * rstd[row] * weight; rstd (rows) = 1/sqrt(mean(inp^2) + eps) */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                            float eps, int64_t rows, int64_t cols);
    /* dinp (rows, cols) = written; dweight (cols) += */
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int64_t rows, int64_t cols);
    /* rmsnorm_forward with out (rows, cols) in bf16, in one pass: each element the bits
     * f32_to_bf16 gives rmsnorm_forward's f32 value, rstd rmsnorm_forward's (the Llama's norms
     * under the bf16 compute policy, whose projections round the output anyway). A table may
     * leave it NULL: RMSNorm then gives f32. */
    void (*rmsnorm_forward_bf16)(fsdp_bf16 *out, float *rstd, const float *inp, const float *weight,
                                 float eps, int64_t rows, int64_t cols);
    /* rmsnorm_backward with a residual's gradient added, in one pass: dinp (rows, cols) = dres +
     * the input gradient rmsnorm_backward writes, each element the bits of rmsnorm_backward then
     * add(dinp, dres, dinp); dweight (cols) += as rmsnorm_backward. dinp overlaps no input. The
     * Llama decoder layer's norms, whose input gradient joins the residual stream's (no f32 pass
     * of its own). A table may leave it NULL: the norm then runs rmsnorm_backward and add. */
    void (*rmsnorm_backward_add)(float *dinp, float *dweight, const float *dout, const float *dres,
                                 const float *inp, const float *weight, const float *rstd,
                                 int64_t rows, int64_t cols);

    void (*add)(float *out, const float *a, const float *b, int64_t n); /* out = a + b */
    /* out (n) = (a + b) + c in f32, in one pass: each element the bits of add(out, a, b) then
     * add(out, out, c); c may be NULL (then add's bits). Where two NaN inputs meet the result is
     * a NaN whose payload IEEE 754 leaves open (x86 takes an operand's by position, which the
     * compiler may swap; GPUs give the canonical NaN), as in add. out may be one of the inputs
     * (the same elements), else overlaps none. The sum of parallel branches' input gradients. */
    void (*add3)(float *out, const float *a, const float *b, const float *c, int64_t n);
    /* add3 on a, b and c each rounded to bf16 first (read, not written): each element the bits
     * round_bf16 on every input then add3 give it, NaN, infinities and values that round up to
     * infinity included. The bf16 compute policy's sum of the Linears' unrounded input
     * gradients (as the GPU writes each in bf16 and sums the bf16 values in f32). */
    void (*add3_round_bf16)(float *out, const float *a, const float *b, const float *c, int64_t n);
    /* out (n) = a + b with b bf16, widened exactly as read: each element the bits of add(out, a,
     * bf16_to_f32(b)) (NaN, infinities, subnormals included; where two NaNs meet, a NaN, as in
     * add). out may be a (the same elements), else overlaps none. The bf16 compute policy's
     * residual add of a bf16 branch (o_proj's and down_proj's outputs). A table may leave it
     * NULL: the branch is then given in f32. */
    void (*add_bf16)(float *out, const float *a, const fsdp_bf16 *b, int64_t n);
    void (*axpy)(float *y, float alpha, const float *x, int64_t n);      /* y += alpha * x */
    void (*scale)(float *out, const float *inp, float alpha, int64_t n); /* out = alpha * inp */
    void (*copy)(float *dst, const float *src, int64_t n);
    void (*fill)(float *out, float value, int64_t n);

    /* Reductions, accumulated in double and returned to the host. */
    double (*sum)(const float *x, int64_t n);
    double (*sum_squares)(const float *x, int64_t n);
    double (*max_abs)(const float *x, int64_t n);

    /* out (count) = in[0] op in[1] op ... op in[n-1], each in (count), 1 <= n <=
     * FSDP_REDUCE_N_MAX, per element left to right (in[0] first) in f32: bf16 and f16 widened
     * exactly and the result rounded once to nearest even, so every device gives the CPU's
     * bits (the collectives run it in rank order). `in` is a host array of this device's
     * pointers; out may be one of them (the same elements), else overlaps none. */
    void (*reduce_n)(void *out, const void *const *in, int n, int64_t count, fsdp_dtype dtype,
                     const fsdp_reduce_n_args *args);

    /* Losses: the scalar to *loss (host); dout (may be NULL) = d(loss)/d(out), written.
     * targets, like every other array, are this device's memory. */
    void (*mse_loss)(float *loss, float *dout, const float *out, const float *target, int64_t n);
    /* logits (rows, classes), targets (rows) in [0, classes); mean over rows */
    void (*cross_entropy)(float *loss, float *dlogits, const float *logits, const int32_t *targets,
                          int64_t rows, int64_t classes);

    /* dtype conversion, round to nearest even; the bits equal fsdp_bf16_from_f32's and
     * fsdp_f16_from_f32's (subnormals, overflow to inf, NaN included); widening is exact */
    void (*f32_to_bf16)(fsdp_bf16 *dst, const float *src, int64_t n);
    void (*bf16_to_f32)(float *dst, const fsdp_bf16 *src, int64_t n);
    /* x (n) rounded to bf16 values in place: each element the bits f32_to_bf16 then bf16_to_f32
     * give it, in one pass (the bf16 compute policy rounds a Linear's f32 outputs so) */
    void (*round_bf16)(float *x, int64_t n);
    void (*f32_to_f16)(fsdp_f16 *dst, const float *src, int64_t n);
    void (*f16_to_f32)(float *dst, const fsdp_f16 *src, int64_t n);

    /* Fused optimizer steps over n elements of a flat shard, the loops of fsdp_sgd_step_args
     * and fsdp_adam_step_args in that order of IEEE f32 operations (so every device gives the
     * CPU's bits). p, g, state (n) each; buf and vmax may be NULL (no momentum, no amsgrad). */
    void (*sgd_update)(float *p, const float *g, float *buf, int64_t n,
                       const fsdp_sgd_step_args *args);
    void (*adam_update)(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                        const fsdp_adam_step_args *args);
    /* adam_update, and in the same pass p_bf16 (n) = the updated p rounded to bf16 (the bits of
     * fsdp_bf16_from_f32): the f32 master shard and the bf16 copy a bf16 forward reads, with one
     * read of the state. p, m, v and vmax get adam_update's bits. */
    void (*adam_update_bf16)(float *p, fsdp_bf16 *p_bf16, const float *g, float *m, float *v,
                             float *vmax, int64_t n, const fsdp_adam_step_args *args);
    /* Multi-tensor forms, one launch per chunk of tensors (FSDP_*_MULTI_CHUNK) where per-tensor
     * entries launch one per tensor; t, out and n are host arrays of count entries, any count
     * (0: nothing), each tensor on this device and overlapping no other. adam_update_multi: each
     * tensor t[i] gets the bits adam_update (p_bf16 NULL) or adam_update_bf16 (p_bf16 set)
     * gives it alone, with the same args for all. fill_multi: out[i] (n[i]) = value, fill's bits.
     * (optional: NULL where the device has none; the optimizer then runs the per-tensor
     * entries) */
    void (*adam_update_multi)(const fsdp_adam_tensor *t, int count,
                              const fsdp_adam_step_args *args);
    void (*fill_multi)(float *const *out, const int64_t *n, int count, float value);

    /* ---- the Llama layers (docs/models.md). A table may leave them NULL: the layers then
     * refuse tensors of its device. ---- */

    /* weight (rows, C) holds the vocabulary rows [start, start + rows) (the whole table: start
     * 0, rows V; a vocabulary shard of tensor parallelism: its range). out (n, C) row i =
     * weight[tokens[i] - start] when tokens[i] is in the range, zeros otherwise; tokens (n) in
     * [0, V). */
    void (*embedding_forward)(float *out, const int32_t *tokens, const float *weight, int64_t n,
                              int64_t C, int64_t start, int64_t rows);
    /* dweight (rows, C) += dout (n, C) row i added to row tokens[i] - start for the tokens in
     * the range (the others add nothing), in order of i */
    void (*embedding_backward)(float *dweight, const float *dout, const int32_t *tokens, int64_t n,
                               int64_t C, int64_t start, int64_t rows);
    /* Rotary position embedding in Hugging Face Llama's rotate_half layout over x (B, T, H, D),
     * D even, h = D / 2: with c = cos[t, i], s = sin[t, i] (cos, sin (T, h)), for i < h
     *   out[i] = x[i] c - x[i + h] s;  out[i + h] = x[i + h] c + x[i] s.
     * out may be inp. */
    void (*rope_forward)(float *out, const float *inp, const float *cos, const float *sin,
                         int64_t B, int64_t T, int64_t H, int64_t D);
    /* its transpose: dinp (B, T, H, D) from dout; dinp may be dout */
    void (*rope_backward)(float *dinp, const float *dout, const float *cos, const float *sin,
                          int64_t B, int64_t T, int64_t H, int64_t D);
    /* rope_forward of q (B, T, NH, D) into qo and of k (B, T, NKV, D) into ko in one pass (one
     * launch), each element the bits rope_forward gives it; qo may be q and ko may be k. */
    void (*rope_qk_forward)(float *qo, float *ko, const float *q, const float *k, const float *cos,
                            const float *sin, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                            int64_t D);
    /* rope_qk_forward on bf16 q and k (widened exactly): qo, ko f32, each element the bits
     * rope_qk_forward gives it on the widened inputs (the bf16 compute policy's attention keeps
     * q_proj's and k_proj's outputs in bf16) */
    void (*rope_qk_forward_bf16)(float *qo, float *ko, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                 const float *cos, const float *sin, int64_t B, int64_t T,
                                 int64_t NH, int64_t NKV, int64_t D);
    /* the same for rope_backward: dq (B, T, NH, D), dk (B, T, NKV, D) from dqo, dko */
    void (*rope_qk_backward)(float *dq, float *dk, const float *dqo, const float *dko,
                             const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                             int64_t NKV, int64_t D);
    /* rope_qk_backward with dq, dk rounded to bf16: each element the bits f32_to_bf16 gives
     * rope_qk_backward's value (the bf16 compute policy's q_proj and k_proj read their output
     * gradients so). (optional: NULL where the device has none) */
    void (*rope_qk_backward_round)(fsdp_bf16 *dq, fsdp_bf16 *dk, const float *dqo, const float *dko,
                                   const float *cos, const float *sin, int64_t B, int64_t T,
                                   int64_t NH, int64_t NKV, int64_t D);
    /* Causal attention with grouped-query heads. q (B, T, NH, D), k and v (B, T, NKV, D), NKV
     * divides NH: query head h reads key/value head h / (NH / NKV). Per (b, h):
     *   out (T, D) = softmax(q k^T / sqrt(D), keys j <= i only) v;
     *   lse (B, NH, T) = each score row's log-sum-exp, saved for backward.
     * scratch (T, T) holds one score block at a time on the CPU (and sim); CUDA leaves it
     * unused: the plain and the tiled (FlashAttention-2-class) kernels need none, and the GEMM
     * path (FSDP_CUDA_ATTENTION=gemm) takes its (T, T) score blocks, one per (b, h) pair, from
     * the caching allocator, at most 1 GiB at once (pairs in chunks; the tiled kernels run it
     * where not even one pair's block can be had). */
    void (*attention_forward)(float *out, float *lse, float *scratch, const float *q,
                              const float *k, const float *v, int64_t B, int64_t T, int64_t NH,
                              int64_t NKV, int64_t D);
    /* dq (B, T, NH, D), dk and dv (B, T, NKV, D) written (dk, dv sum over the heads of a
     * group), from dout and the forward's q, k, v, out and lse. Each (b, h) probability block is
     * recomputed from q, k and lse in scratch (2, T, T), one block at a time, beside the block
     * dout v^T (the CPU computes both with GEMMs); CUDA leaves scratch unused (it recomputes
     * probabilities per row, or per tile in shared memory, or, on the GEMM path, into two
     * (T, T) blocks per (b, h) pair from the caching allocator, at most 1 GiB at once). */
    void (*attention_backward)(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const float *q, const float *k, const float *v, const float *out,
                               const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t D);
    /* attention_forward and attention_backward as the bf16 compute policy runs them on f32
     * tensors (the Llama's attention when q_proj and k_proj compute in bf16 and the bf16-tensor
     * entries below do not apply): the same tensors, but the device may compute as autocast's
     * bf16 attention does. CUDA: cuDNN's fused attention where it loads and takes the shape
     * (q, k, v and dout rounded to bf16, the probabilities rounded before the products that read
     * them, f32 softmax and accumulation: the per-element bound of test_kernels_cuda's
     * attention_cudnn), else the tiled kernels. The CPU and sim run the f32 entries, whose
     * results lie within that bound. */
    void (*attention_forward_bf16)(float *out, float *lse, float *scratch, const float *q,
                                   const float *k, const float *v, int64_t B, int64_t T, int64_t NH,
                                   int64_t NKV, int64_t D);
    void (*attention_backward_bf16)(float *dq, float *dk, float *dv, float *scratch,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse, int64_t B,
                                    int64_t T, int64_t NH, int64_t NKV, int64_t D);
    /* The bf16 compute policy's attention on bf16 tensors (the Llama's attention when q_proj,
     * k_proj and v_proj compute in bf16; optional: NULL where the device has none, and the
     * attention then runs the entries above). Each bf16 result is rounded once, to nearest
     * even, from an f32 value:
     * rope_qk_forward_bf16_round: qo, ko the bits f32_to_bf16 gives rope_qk_forward_bf16's
     * values; rope_qk_backward_bf16_round: dq, dk the bits rope_qk_backward_round gives on the
     * widened dqo, dko. qo may be q, ko k, dq dqo and dk dko. */
    void (*rope_qk_forward_bf16_round)(fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q,
                                       const fsdp_bf16 *k, const float *cos, const float *sin,
                                       int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
    void (*rope_qk_backward_bf16_round)(fsdp_bf16 *dq, fsdp_bf16 *dk, const fsdp_bf16 *dqo,
                                        const fsdp_bf16 *dko, const float *cos, const float *sin,
                                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
    /* attention_forward_bf16 on bf16 q, k, v: out (bf16) and lse (f32), and
     * attention_backward_bf16 on bf16 dout, q, k, v, out (lse f32): dq, dk, dv (bf16; dk, dv
     * summed over a group in f32, then rounded). The CPU and sim: each element the bits
     * f32_to_bf16 gives the f32 entry's value on the widened tensors (lse its bits), computed
     * batch by batch in scratch, FSDP_ATTENTION_BF16_SCRATCH(T, NH, NKV, D) floats of the
     * caller's (nothing allocated). CUDA: cuDNN's fused attention directly on the tensors where
     * it loads and takes the shape (attention_forward_bf16's bound), else the same batch by
     * batch widening in scratch around the f32 kernels. */
    void (*attention_forward_bf16_round)(fsdp_bf16 *out, float *lse, float *scratch,
                                         const fsdp_bf16 *q, const fsdp_bf16 *k, const fsdp_bf16 *v,
                                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
    void (*attention_backward_bf16_round)(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                                          float *scratch, const fsdp_bf16 *dout, const fsdp_bf16 *q,
                                          const fsdp_bf16 *k, const fsdp_bf16 *v,
                                          const fsdp_bf16 *out, const float *lse, int64_t B,
                                          int64_t T, int64_t NH, int64_t NKV, int64_t D);
    /* out (n) = silu(gate) * up, silu(x) = x sigmoid(x); out may be gate or up */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, int64_t n);
    /* dgate = dout * up * silu'(gate), dup = dout * silu(gate) (n each), written */
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int64_t n);
    /* swiglu_forward on bf16 gate and up (widened exactly) with out (n) rounded to bf16: each
     * element the bits f32_to_bf16 gives swiglu_forward's value on the widened inputs (the bf16
     * compute policy's MLP keeps gate and up in bf16; down_proj reads out as its bf16 input) */
    void (*swiglu_forward_bf16)(fsdp_bf16 *out, const fsdp_bf16 *gate, const fsdp_bf16 *up,
                                int64_t n);
    /* swiglu_backward on bf16 gate and up: dgate, dup (n) f32, the bits swiglu_backward gives
     * on the widened inputs */
    void (*swiglu_backward_bf16)(float *dgate, float *dup, const float *dout, const fsdp_bf16 *gate,
                                 const fsdp_bf16 *up, int64_t n);
    /* swiglu_backward_bf16 with dgate, dup rounded to bf16: each element the bits f32_to_bf16
     * gives swiglu_backward_bf16's value (the bf16 compute policy's gate_proj and up_proj read
     * their output gradients so). (optional) */
    void (*swiglu_backward_bf16_round)(fsdp_bf16 *dgate, fsdp_bf16 *dup, const float *dout,
                                       const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
    /* swiglu_backward_bf16_round on a bf16 dout (widened exactly: down_proj's input gradient
     * written in bf16): each element the bits swiglu_backward_bf16_round gives on the widened
     * dout. (optional) */
    void (*swiglu_backward_bf16io)(fsdp_bf16 *dgate, fsdp_bf16 *dup, const fsdp_bf16 *dout,
                                   const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
    /* cross_entropy where rows whose target is ignore_index count for nothing (PyTorch's
     * ignore_index): loss = mean over the other rows (NaN when there are none, as PyTorch);
     * dlogits (may be NULL) = (softmax - onehot) / counted rows, 0 on ignored rows. Every
     * other target is in [0, classes). */
    void (*cross_entropy_ignore)(float *loss, float *dlogits, const float *logits,
                                 const int32_t *targets, int32_t ignore_index, int64_t rows,
                                 int64_t classes);
    /* cross_entropy_ignore over bf16 logits (rows, classes), each widened exactly: the loss the
     * bits cross_entropy_ignore gives on the widened logits, and dlogits (may be NULL) its
     * gradient, f32 (dlogits_dtype FSDP_DTYPE_F32: the same bits) or bf16 (FSDP_DTYPE_BF16:
     * each element the bits f32_to_bf16 gives the f32 gradient), in one pass that reads the bf16
     * row (the bf16 compute policy's lm_head keeps its logits in bf16: docs/models.md). */
    void (*cross_entropy_ignore_bf16)(float *loss, void *dlogits, fsdp_dtype dlogits_dtype,
                                      const fsdp_bf16 *logits, const int32_t *targets,
                                      int32_t ignore_index, int64_t rows, int64_t classes);

    /* Cross-entropy over logits (rows, V) that hold the classes [start, start + V) of a
     * vocabulary sharded over ranks (loss parallel, src/tp/loss_parallel.c), in three steps
     * with collectives between; targets (rows) are this device's memory, each ignore_index or
     * a class of the whole vocabulary. Sums run in double per row (the CPU's in class order,
     * a device's in a fixed order of its own: the same bits every run).
     * mx (rows) = each row's largest logit (-inf when V is 0). */
    void (*vocab_row_max)(float *mx, const float *logits, int64_t rows, int64_t V);
    /* With mx the rows' maxima over every shard: se (rows) = sum over c of exp(x[c] - mx), in
     * double rounded once; xt (rows) = x[target - start] when the target's class is here, else
     * 0; both 0 on ignored rows. */
    void (*vocab_exp_sums)(float *se, float *xt, const float *logits, const float *mx,
                           const int32_t *targets, int32_t ignore_index, int64_t start,
                           int64_t rows, int64_t V);
    /* With se summed over every shard and lse = mx + log(se) in double: dlogits (rows, V) =
     * exp(x - lse) / n, minus 1 / n at the target's class when it is here, each rounded once;
     * 0 on ignored rows. n: the rows not ignored over the whole batch. */
    void (*vocab_ce_grad)(float *dlogits, const float *logits, const float *mx, const float *se,
                          const int32_t *targets, int32_t ignore_index, int64_t start, int64_t rows,
                          int64_t V, int64_t n);
} fsdp_kernels_i;

/* The table for a device, or NULL when this build has none for it. */
const fsdp_kernels_i *fsdp_kernels_for(fsdp_device device);

/* What a device has been asked to do, counted since its last reset (docs/device.md "Launches
 * and host waits"; sim.h and cuda.h say what each kind counts). Relaxed atomics, over every
 * thread using the device; counting changes no result. */
typedef struct fsdp_launch_counts {
    int64_t launches;   /* work queued on its streams: kernels, library calls, memsets, copies */
    int64_t host_waits; /* times a host thread blocked until work of the device had finished */
} fsdp_launch_counts;

/* The counts of a device (kernels/devices.c asks its kind: sim or CUDA), and their reset;
 * zeroes for the CPU, a kind this build lacks or an index out of range. */
fsdp_launch_counts fsdp_kernels_counts(fsdp_device device);
void fsdp_kernels_counts_reset(fsdp_device device);

/* The CPU table (src/kernels/cpu/). The CUDA table is fsdp_kernels_cuda() in
 * kernels/cuda/cuda.h, in builds with CUDA. */
const fsdp_kernels_i *fsdp_kernels_cpu(void);

/* The CPU's reduce_n with `offset` elements added to every input (not to out), for host callers
 * holding arrays of any number of inputs (the comm backends reduce host tensors with it). */
void fsdp_kernels_cpu_reduce_at(void *out, const void *const *in, int n, int64_t offset,
                                int64_t count, fsdp_dtype dtype, const fsdp_reduce_n_args *args);

/* Threads of rank threads (src/kernels/cpu/threads.c). OpenBLAS has one thread count for the
 * whole process, and its threaded GEMMs do not run side by side: calls from several rank
 * threads at once wait for each other, and hundreds of them in flight exhaust its table of
 * memory regions and abort the process ("too many memory regions"). So while any world runs,
 * OpenBLAS runs single-threaded, and each rank splits its own kernels over per_rank threads of
 * its own (fsdp_kernels_cpu_workers_start). enter returns that count: per_rank, or when
 * per_rank is 0 the count OpenBLAS had (OPENBLAS_NUM_THREADS, else the cores it found) divided
 * by `ranks`, at least 1. Runs may overlap; the last leave restores OpenBLAS's count. */
int fsdp_kernels_cpu_threads_enter(int ranks, int per_rank);
void fsdp_kernels_cpu_threads_leave(void);

/* A rank's own threads (src/kernels/cpu/workers.c): gives the calling thread n - 1 worker
 * threads over which the CPU table splits GEMM, the elementwise kernels and the optimizer
 * updates (each thread a contiguous, cache-line aligned range: elementwise and optimizer
 * results are bitwise those of one thread, GEMM equal to float32 rounding). first_core >= 0
 * pins the caller to the first_core-th CPU of those its affinity allows and worker i to the
 * (first_core + i)-th (modulo their count); -1 leaves placement to the system. Returns the
 * thread count in effect (1 when threads cannot be started). _stop joins the workers and
 * undoes the pinning; the thread's next _start replaces them. */
int fsdp_kernels_cpu_workers_start(int n, int first_core);
void fsdp_kernels_cpu_workers_stop(void);

#endif
