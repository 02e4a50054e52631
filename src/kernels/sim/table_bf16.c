/* table_bf16.c: the simulated GPU's entries with bf16 operands (table.c lists them): the CPU
 * entry run on the device's stream over the shadow memory, as every other entry. */
#include "kernels/sim/sim_impl.h"

typedef struct gemm_bf16_args {
    bool trans_a, trans_b;
    int64_t M, N, K;
    float alpha;
    const fsdp_bf16 *A;
    int64_t lda;
    const fsdp_bf16 *B;
    int64_t ldb;
    float beta;
    float *C;
    int64_t ldc;
} gemm_bf16_args;

static void run_gemm_bf16(void *arg) {
    gemm_bf16_args *a = arg;
    fsdp_kernels_cpu()->gemm_bf16(a->trans_a, a->trans_b, a->M, a->N, a->K, a->alpha, a->A, a->lda,
                                  a->B, a->ldb, a->beta, a->C, a->ldc);
}

void sim_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb, float beta,
                   float *C, int64_t ldc) {
    int dev = sim_kernel_device(C, "gemm_bf16");
    gemm_bf16_args call = {trans_a,
                           trans_b,
                           M,
                           N,
                           K,
                           alpha,
                           sim_kernel_ptr(dev, A),
                           lda,
                           sim_kernel_ptr(dev, B),
                           ldb,
                           beta,
                           sim_kernel_ptr(dev, C),
                           ldc};
    sim_kernel_launch(dev, run_gemm_bf16, &call, sizeof call);
}
