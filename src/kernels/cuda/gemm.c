/* gemm.c: row-major C = alpha op(A) op(B) + beta C through cuBLAS (column-major): the
 * row-major C is the column-major C^T = op(B)^T op(A)^T, so cuBLAS gets B before A. f32, or
 * TF32 tensor cores when this thread allows them (fsdp_cuda_thread_set_tf32; public:
 * fsdp_cuda_set_allow_tf32); and bf16 A and B with f32 C and f32 accumulation (gemm_bf16). */
#include <limits.h>

#include "kernels/cuda/cuda_impl.h"

void fsdp_cuda_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc) {
    FSDP_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K == 0) { // op(A) op(B) is the zero matrix; cuBLAS would check lda against K
        fsdp_cuda_scale_matrix(C, ldc, M, N, beta);
        return;
    }
    FSDP_ASSERT(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX);
    FSDP_ASSERT(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    FSDP_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
    cublasHandle_t h = fsdp_cuda_blas();
    cublasComputeType_t compute =
        fsdp_cuda_thread_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    FSDP_CUDA_CHECK_BLAS(
        cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                     (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F, (int)ldb, A, CUDA_R_32F,
                     (int)lda, &beta, C, CUDA_R_32F, (int)ldc, compute, CUBLAS_GEMM_DEFAULT));
}

void fsdp_cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                         float beta, float *C, int64_t ldc) {
    FSDP_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K == 0) {
        fsdp_cuda_scale_matrix(C, ldc, M, N, beta);
        return;
    }
    FSDP_ASSERT(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX);
    FSDP_ASSERT(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    FSDP_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
    FSDP_CUDA_CHECK_BLAS(cublasGemmEx(
        fsdp_cuda_blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        (int)N, (int)M, (int)K, &alpha, B, CUDA_R_16BF, (int)ldb, A, CUDA_R_16BF, (int)lda, &beta,
        C, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
