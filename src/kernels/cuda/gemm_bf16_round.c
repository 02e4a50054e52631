/* gemm_bf16_round.c: row-major C (bf16) = op(A) op(B) rounded to bf16, bf16 A and B, through
 * cublasGemmEx with a bf16 C and f32 accumulation (CUBLAS_COMPUTE_32F): the f32 sum rounded once
 * as cuBLAS writes it. Row-major as gemm.c: cuBLAS gets the column-major C^T = op(B)^T op(A)^T. */
#include <limits.h>

#include "kernels/cuda/cuda_impl.h"

void fsdp_cuda_gemm_bf16_round(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                               fsdp_bf16 *C, int64_t ldc) {
    FSDP_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    FSDP_ASSERT(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX);
    FSDP_ASSERT(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    FSDP_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
    if (K == 0) { /* the zero matrix (cuBLAS would check lda against K) */
        size_t row = sizeof(fsdp_bf16);
        FSDP_CUDA_CHECK(cudaMemset2DAsync(C, (size_t)ldc * row, 0, (size_t)N * row, (size_t)M,
                                          fsdp_cuda_stream()));
        fsdp_cuda_count_launch(-1);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    FSDP_CUDA_CHECK_BLAS(cublasGemmEx(
        fsdp_cuda_blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        (int)N, (int)M, (int)K, &one, B, CUDA_R_16BF, (int)ldb, A, CUDA_R_16BF, (int)lda, &zero, C,
        CUDA_R_16BF, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    fsdp_cuda_count_launch(-1);
}
