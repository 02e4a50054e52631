/* bench_cuda_gemm.c: the CUDA table's GEMM (what every Linear runs) against cuBLAS called
 * directly with the same operation and compute type, in the same run: TFLOP/s of each and
 * their ratio, f32 and TF32, for square shapes and the shapes of the 134 M MLP's step.
 * Built only with CUDA; prints why it skipped when no GPU is usable. */
#define _POSIX_C_SOURCE 200809L

#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_cuda_util.h"   // defines: BENCH_CUDA_OK, bench_cuda_median
#include "kernels/cuda/cuda.h" // defines: fsdp_cuda_thread_set_tf32
#include "kernels/kernels.h"   // defines: fsdp_kernels_for

#define REPS 20

typedef struct shape {
    const char *what;
    bool ta, tb;
    int m, n, k;
} shape;

typedef struct gemm_call {
    cublasHandle_t direct; /* NULL: the table's entry */
    const shape *s;
    bool tf32;
    const float *A, *B;
    float *C;
} gemm_call;

static void run_gemm(void *arg) {
    const gemm_call *c = arg;
    const shape *s = c->s;
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n, ldc = s->n;
    float one = 1.0f, zero = 0.0f;
    if (c->direct)
        cublasGemmEx(
            c->direct, s->tb ? CUBLAS_OP_T : CUBLAS_OP_N, s->ta ? CUBLAS_OP_T : CUBLAS_OP_N, s->n,
            s->m, s->k, &one, c->B, CUDA_R_32F, ldb, c->A, CUDA_R_32F, lda, &zero, c->C, CUDA_R_32F,
            ldc, c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0})
            ->gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, c->A, lda, c->B, ldb, 0.0f, c->C, ldc);
}

int main(void) {
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        printf("bench_cuda_gemm: skipped: no usable CUDA device\n");
        return 0;
    }
    static const shape shapes[] = {
        {"square 4096", false, false, 4096, 4096, 4096},
        {"square 8192", false, false, 8192, 8192, 8192},
        {"MLP fwd 8192x8192 <- 4096", false, true, 8192, 8192, 4096},
        {"MLP fwd 8192x8192 <- 8192", false, true, 8192, 8192, 8192},
        {"MLP dW 8192x4096 (T,N)", true, false, 8192, 4096, 8192},
        {"MLP dX 8192x4096 (N,N)", false, false, 8192, 4096, 8192},
    };
    size_t most = (size_t)8192 * 8192;
    float *A, *B, *C;
    BENCH_CUDA_OK(cudaMalloc((void **)&A, most * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc((void **)&B, most * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc((void **)&C, most * sizeof(float)));
    BENCH_CUDA_OK(cudaMemset(A, 0x3c, most * sizeof(float))); /* small positive values */
    BENCH_CUDA_OK(cudaMemset(B, 0x3c, most * sizeof(float)));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    cublasSetStream(h, cudaStreamPerThread);
    printf("%-28s %5s %12s %12s %8s\n", "shape", "math", "table TF/s", "cuBLAS TF/s", "ratio");
    for (int tf = 0; tf < 2; tf++) {
        fsdp_cuda_thread_set_tf32(tf);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const shape *s = &shapes[i];
            double flop = 2.0 * s->m * s->n * (double)s->k;
            gemm_call ours_call = {NULL, s, tf, A, B, C}, theirs_call = {h, s, tf, A, B, C};
            double ours = bench_cuda_median(run_gemm, &ours_call, REPS);
            double theirs = bench_cuda_median(run_gemm, &theirs_call, REPS);
            printf("%-28s %5s %12.1f %12.1f %8.3f\n", s->what, tf ? "tf32" : "f32",
                   flop / ours / 1e12, flop / theirs / 1e12, theirs / ours);
        }
    }
    cublasDestroy(h);
    cudaFree(A), cudaFree(B), cudaFree(C);
    return 0;
}
