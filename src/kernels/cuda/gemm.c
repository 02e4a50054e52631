/* gemm.c: row-major C = alpha op(A) op(B) + beta C through cuBLAS (column-major): the
 * row-major C is the column-major C^T = op(B)^T op(A)^T, so cuBLAS gets B before A. f32, or
 * TF32 tensor cores when this thread allows them (fsdp_cuda_thread_set_tf32; public:
 * fsdp_cuda_set_allow_tf32); and bf16 A and B with f32 C and f32 accumulation (gemm_bf16).
 * Both entries check their arguments here and run through cublasGemmEx or, when this thread
 * chose it (fsdp_cuda_thread_set_gemm, FSDP_CUDA_GEMM), cuBLASLt (gemm_lt.c). */
#include <limits.h>

#include "kernels/cuda/cuda_impl.h"

void fsdp_cuda_gemm_cublas(const fsdp_cuda_gemm_args *g) {
    FSDP_ASSERT(g->epilogue == 0); // cuBLAS has no epilogue: epilogue.c runs the separate entries
    FSDP_CUDA_CHECK_BLAS(cublasGemmEx(fsdp_cuda_blas(), g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->N, (int)g->M,
                                      (int)g->K, &g->alpha, g->B, g->ab_type, (int)g->ldb, g->A,
                                      g->ab_type, (int)g->lda, &g->beta, g->C, CUDA_R_32F,
                                      (int)g->ldc, g->compute, CUBLAS_GEMM_DEFAULT));
    fsdp_cuda_count_launch(-1);
}

/* Checks the arguments and runs the GEMM through this thread's library. K == 0: op(A) op(B)
 * is the zero matrix (cuBLAS would check lda against K), so C = beta C. */
static void gemm_run(const fsdp_cuda_gemm_args *g) {
    FSDP_ASSERT(g->M >= 0 && g->N >= 0 && g->K >= 0);
    if (g->M == 0 || g->N == 0) return;
    if (g->K == 0) {
        fsdp_cuda_scale_matrix(g->C, g->ldc, g->M, g->N, g->beta);
        return;
    }
    FSDP_ASSERT(g->M <= INT_MAX && g->N <= INT_MAX && g->K <= INT_MAX);
    FSDP_ASSERT(g->lda <= INT_MAX && g->ldb <= INT_MAX && g->ldc <= INT_MAX);
    FSDP_ASSERT(g->lda >= (g->trans_a ? g->M : g->K) && g->ldb >= (g->trans_b ? g->K : g->N) &&
                g->ldc >= g->N);
    if (fsdp_cuda_thread_gemm() != FSDP_CUDA_GEMM_LT || !fsdp_cuda_gemm_lt(g))
        fsdp_cuda_gemm_cublas(g);
}

/* The two entries' arguments, A and B of ab_type, run with the given compute type. */
static void gemm_entry(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C,
                       int64_t ldc, cudaDataType_t ab_type, cublasComputeType_t compute) {
    gemm_run(&(fsdp_cuda_gemm_args){.trans_a = trans_a,
                                    .trans_b = trans_b,
                                    .M = M,
                                    .N = N,
                                    .K = K,
                                    .lda = lda,
                                    .ldb = ldb,
                                    .ldc = ldc,
                                    .alpha = alpha,
                                    .beta = beta,
                                    .A = A,
                                    .B = B,
                                    .C = C,
                                    .ab_type = ab_type,
                                    .compute = compute});
}

void fsdp_cuda_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc) {
    gemm_entry(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_32F,
               fsdp_cuda_thread_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
}

void fsdp_cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                         float beta, float *C, int64_t ldc) {
    gemm_entry(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_16BF,
               CUBLAS_COMPUTE_32F);
}
