/* gemm_bf16.c: C (f32) = alpha op(A) op(B) + beta C with bf16 A and B on the CPU: blocks of
 * op(A) and op(B) widened to f32 (exactly) in stack buffers and multiplied by cblas_sgemm,
 * accumulating in f32 across the blocks of K, so the entry allocates nothing. And the same
 * product rounded to a bf16 C (gemm_bf16_round), accumulated per block of C on the stack. */
#include <cblas.h> // defines: cblas_sgemm
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include "core/error.h" // defines: FSDP_ASSERT
#include "kernels/cpu/cpu.h"

enum { BM = 32, BN = 128, BK = 128 }; /* 80 KiB of stack for the two widened blocks */

static float widen(fsdp_bf16 x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* dst (rows, cols), row-major and dense, = the block at (r0, c0) of op(X), X (row stride ld)
 * stored transposed when trans. */
static void widen_block(float *dst, const fsdp_bf16 *X, int64_t ld, bool trans, int64_t r0,
                        int64_t c0, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[r * cols + c] =
                widen(trans ? X[(c0 + c) * ld + (r0 + r)] : X[(r0 + r) * ld + (c0 + c)]);
}

void fsdp_cpu_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                        float beta, float *C, int64_t ldc) {
    FSDP_ASSERT(M >= 0 && N >= 0 && K >= 0);
    FSDP_ASSERT(M <= INT_MAX && N <= INT_MAX && ldc >= N && ldc <= INT_MAX);
    FSDP_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N));
    if (M == 0 || N == 0) return;
    if (K == 0) { // op(A) op(B) is the zero matrix: C = beta C, beta 0 overwriting
        float none = 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, 0, alpha, &none, 1,
                    &none, (int)N, beta, C, (int)ldc);
        return;
    }
    float a[BM * BK], b[BK * BN];
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        int64_t kb = K - k0 < BK ? K - k0 : BK;
        float blend = k0 == 0 ? beta : 1.0f; /* the first block of K applies beta */
        for (int64_t i0 = 0; i0 < M; i0 += BM) {
            int64_t mb = M - i0 < BM ? M - i0 : BM;
            widen_block(a, A, lda, trans_a, i0, k0, mb, kb);
            for (int64_t j0 = 0; j0 < N; j0 += BN) {
                int64_t nb = N - j0 < BN ? N - j0 : BN;
                widen_block(b, B, ldb, trans_b, k0, j0, kb, nb);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mb, (int)nb, (int)kb,
                            alpha, a, (int)kb, b, (int)nb, blend, C + i0 * ldc + j0, (int)ldc);
            }
        }
    }
}

/* The calls of fsdp_cpu_gemm_bf16 (alpha 1, beta 0) in another order: per (BM, BN) block of C,
 * every block of K into a stack tile by the same cblas_sgemm call (the same sizes, operands and
 * beta; only C's row stride differs, which the product does not read), then rounded into C. So
 * each element gets gemm_bf16's f32 value and f32_to_bf16's rounding of it. */
void fsdp_cpu_gemm_bf16_round(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                              fsdp_bf16 *C, int64_t ldc) {
    FSDP_ASSERT(M >= 0 && N >= 0 && K >= 0);
    FSDP_ASSERT(M <= INT_MAX && N <= INT_MAX && ldc >= N && ldc <= INT_MAX);
    FSDP_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N));
    float a[BM * BK], b[BK * BN], c[BM * BN];
    for (int64_t i0 = 0; i0 < M; i0 += BM) {
        int64_t mb = M - i0 < BM ? M - i0 : BM;
        for (int64_t j0 = 0; j0 < N; j0 += BN) {
            int64_t nb = N - j0 < BN ? N - j0 : BN;
            if (K == 0) memset(c, 0, sizeof(float) * (size_t)(mb * nb));
            for (int64_t k0 = 0; k0 < K; k0 += BK) {
                int64_t kb = K - k0 < BK ? K - k0 : BK;
                widen_block(a, A, lda, trans_a, i0, k0, mb, kb);
                widen_block(b, B, ldb, trans_b, k0, j0, kb, nb);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mb, (int)nb, (int)kb,
                            1.0f, a, (int)kb, b, (int)nb, k0 == 0 ? 0.0f : 1.0f, c, (int)nb);
            }
            for (int64_t r = 0; r < mb; r++)
                fsdp_cpu_f32_to_bf16(C + (i0 + r) * ldc + j0, c + r * nb, nb);
        }
    }
}
