/* gemm.c: the Linear layer's CPU kernels: C = alpha op(A) op(B) + beta C through OpenBLAS
 * cblas_sgemm (row-major), and the bias broadcast and its row sum. */
#include <cblas.h> // defines: cblas_sgemm
#include <limits.h>
#include <stddef.h>

#include "core/error.h" // defines: FSDP_ASSERT
#include "kernels/cpu/cpu.h"

/* C (M, N) with row stride ldc = beta * C; beta == 0 overwrites (NaN in C does not survive),
 * as BLAS does. */
static void scale_matrix(float *C, int64_t ldc, int64_t M, int64_t N, float beta) {
    for (int64_t i = 0; i < M; i++) {
        float *row = C + i * ldc;
        if (beta == 0.0f)
            for (int64_t j = 0; j < N; j++) row[j] = 0.0f;
        else
            for (int64_t j = 0; j < N; j++) row[j] *= beta;
    }
}

void fsdp_cpu_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                   int64_t ldc) {
    FSDP_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K == 0) { // op(A) op(B) is the zero matrix; BLAS would reject lda = 0
        scale_matrix(C, ldc, M, N, beta);
        return;
    }
    // cblas takes int sizes (blasint, 32-bit in the LP64 OpenBLAS we link)
    FSDP_ASSERT(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX);
    FSDP_ASSERT(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    FSDP_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B,
                (int)ldb, beta, C, (int)ldc);
}

void fsdp_cpu_bias_add(float *restrict out, const float *restrict bias, int64_t rows,
                       int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float *restrict row = out + r * cols; // (cols)
        for (int64_t c = 0; c < cols; c++) row[c] += bias[c];
    }
}

void fsdp_cpu_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols) {
    fsdp_cpu_column_sum(dbias, dout, NULL, NULL, rows, cols);
}
