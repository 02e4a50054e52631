/* epilogue.c: the fused-GEMM entries on CUDA. Where this thread runs its GEMMs through
 * cuBLASLt (FSDP_CUDA_GEMM=lt) the bias, the activation (cuBLASLt's GELU is the tanh
 * approximation, the table's own) and the saved GELU input go into the GEMM's epilogue, and the
 * weight gradient's GEMM sums the bias gradient (BGRADB: the row-major dout is cuBLASLt's B);
 * where cuBLASLt has no algorithm for the epilogue, or the thread runs cuBLAS, the separate
 * entries run in kernels.h's order. */
#include <cublasLt.h>
#include <limits.h>

#include "kernels/cuda/cuda_impl.h"

static bool lt_fits(int64_t M, int64_t N, int64_t K) {
    return fsdp_cuda_thread_gemm() == FSDP_CUDA_GEMM_LT && M > 0 && N > 0 && K > 0 &&
           M <= INT_MAX && N <= INT_MAX && K <= INT_MAX;
}

static void act_forward(float *out, const float *inp, int64_t n, fsdp_gemm_act act) {
    if (act == FSDP_GEMM_ACT_RELU) fsdp_cuda_relu_forward(out, inp, n);
    if (act == FSDP_GEMM_ACT_GELU) fsdp_cuda_gelu_forward(out, inp, n);
    if (act == FSDP_GEMM_ACT_NONE && out != inp) fsdp_cuda_copy(out, inp, n);
}

/* The epilogue of bias (or none) and act with nothing saved. */
static int epilogue_of(bool bias, fsdp_gemm_act act) {
    if (act == FSDP_GEMM_ACT_RELU)
        return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    if (act == FSDP_GEMM_ACT_GELU)
        return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    return bias ? CUBLASLT_EPILOGUE_BIAS : 0; // 0: no epilogue, the plain GEMM's cache key
}

/* g: the forward GEMM into out (M rows, N = OC). Runs it with the epilogue through cuBLASLt;
 * false, having done nothing, where it cannot. With pre: GELU saves its input in the epilogue
 * (GELU_AUX, whose leading dimension must be a multiple of 8); otherwise the GEMM and bias
 * write pre and act runs from it (ReLU's saved form in cuBLASLt is a bit mask, not the input). */
static bool lt_bias_act(fsdp_cuda_gemm_args g, float *out, float *pre, const float *bias,
                        fsdp_gemm_act act) {
    if (!lt_fits(g.M, g.N, g.K)) return false;
    int64_t n = g.M * g.N;
    g.bias = (float *)bias; // read only: a BIAS epilogue does not write it
    if (pre && act == FSDP_GEMM_ACT_GELU && g.N % 8 == 0) {
        g.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        g.aux = pre;
        g.aux_ld = g.N;
        return fsdp_cuda_gemm_lt(&g);
    }
    if (!pre) {
        g.epilogue = epilogue_of(bias, act);
        return fsdp_cuda_gemm_lt(&g);
    }
    g.epilogue = epilogue_of(bias, FSDP_GEMM_ACT_NONE);
    if (act != FSDP_GEMM_ACT_NONE) g.C = pre; // the pre-activation, then act from it
    if (!fsdp_cuda_gemm_lt(&g)) return false;
    if (act == FSDP_GEMM_ACT_NONE)
        fsdp_cuda_copy(pre, out, n);
    else
        act_forward(out, pre, n, act);
    return true;
}

/* The separate entries, in kernels.h's order, after the GEMM wrote out. */
static void epilogue_apart(float *out, float *pre, const float *bias, int64_t rows, int64_t OC,
                           fsdp_gemm_act act) {
    if (bias) fsdp_cuda_bias_add(out, bias, rows, OC);
    if (pre) fsdp_cuda_copy(pre, out, rows * OC);
    if (act != FSDP_GEMM_ACT_NONE) act_forward(out, out, rows * OC, act);
}

static fsdp_cuda_gemm_args forward_args(float *out, const void *inp, const void *weight,
                                        int64_t rows, int64_t C, int64_t OC, cudaDataType_t type,
                                        cublasComputeType_t compute) {
    return (fsdp_cuda_gemm_args){.trans_b = true,
                                 .M = rows,
                                 .N = OC,
                                 .K = C,
                                 .lda = C,
                                 .ldb = C,
                                 .ldc = OC,
                                 .alpha = 1.0f,
                                 .A = inp,
                                 .B = weight,
                                 .C = out,
                                 .ab_type = type,
                                 .compute = compute};
}

void fsdp_cuda_gemm_bias_act(float *out, float *pre, const float *inp, const float *weight,
                             const float *bias, int64_t rows, int64_t C, int64_t OC,
                             fsdp_gemm_act act) {
    FSDP_ASSERT(act >= FSDP_GEMM_ACT_NONE && act <= FSDP_GEMM_ACT_GELU);
    cublasComputeType_t compute =
        fsdp_cuda_thread_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (lt_bias_act(forward_args(out, inp, weight, rows, C, OC, CUDA_R_32F, compute), out, pre,
                    bias, act))
        return;
    fsdp_cuda_gemm(false, true, rows, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    epilogue_apart(out, pre, bias, rows, OC, act);
}

void fsdp_cuda_gemm_bf16_bias_act(float *out, float *pre, const fsdp_bf16 *inp,
                                  const fsdp_bf16 *weight, const float *bias, int64_t rows,
                                  int64_t C, int64_t OC, fsdp_gemm_act act) {
    FSDP_ASSERT(act >= FSDP_GEMM_ACT_NONE && act <= FSDP_GEMM_ACT_GELU);
    if (lt_bias_act(forward_args(out, inp, weight, rows, C, OC, CUDA_R_16BF, CUBLAS_COMPUTE_32F),
                    out, pre, bias, act))
        return;
    fsdp_cuda_gemm_bf16(false, true, rows, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    epilogue_apart(out, pre, bias, rows, OC, act);
}

/* dweight += dout^T inp with BGRADB writing the bias gradient to an f32 block of the caching
 * allocator (the epilogue overwrites its vector), which is then added to dbias. */
static bool lt_bgrad(float *dweight, float *dbias, const float *dout, const float *inp,
                     int64_t rows, int64_t C, int64_t OC) {
    if (!dbias || !lt_fits(OC, C, rows)) return false;
    int device = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&device));
    void *sums = NULL;
    if (fsdp_cuda_block_alloc(NULL, device, (size_t)OC * sizeof(float), &sums) != FSDP_OK)
        return false; // the separate entries need no memory
    fsdp_cuda_gemm_args g = {.trans_a = true,
                             .M = OC,
                             .N = C,
                             .K = rows,
                             .lda = OC,
                             .ldb = C,
                             .ldc = C,
                             .alpha = 1.0f,
                             .beta = 1.0f,
                             .A = dout,
                             .B = inp,
                             .C = dweight,
                             .ab_type = CUDA_R_32F,
                             .compute = fsdp_cuda_thread_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                : CUBLAS_COMPUTE_32F,
                             .epilogue = CUBLASLT_EPILOGUE_BGRADB,
                             .bias = sums};
    bool done = fsdp_cuda_gemm_lt(&g);
    if (done) fsdp_cuda_axpy(dbias, 1.0f, sums, OC);
    fsdp_cuda_block_free(device, sums); // ordered after the axpy on this stream
    return done;
}

void fsdp_cuda_gemm_bgrad(float *dweight, float *dbias, const float *dout, const float *inp,
                          int64_t rows, int64_t C, int64_t OC) {
    if (lt_bgrad(dweight, dbias, dout, inp, rows, C, OC)) return;
    fsdp_cuda_gemm(true, false, OC, C, rows, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) fsdp_cuda_bias_backward(dbias, dout, rows, OC);
}
