/* bench_cuda_adam.c: the CUDA table's fused AdamW step over --params f32 elements (default
 * 100 M) against a device-to-device copy measured in the same run. AdamW reads p, g, m, v and
 * writes p, m, v: 28 bytes per element; a copy moves 8. Bandwidth = bytes / time, and AdamW's
 * as a fraction of the copy's. Built only with CUDA; skips when no GPU is usable. */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"      // defines: bench_median
#include "kernels/kernels.h" // defines: fsdp_kernels_for, fsdp_adam_step_args

#define REPS 20

#define CUDA_OK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef enum pass { PASS_COPY, PASS_ADAMW } pass;

static double time_pass(pass which, float *p, float *g, float *m, float *v, int64_t n) {
    const fsdp_kernels_i *k = fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0});
    fsdp_adam_step_args a = {.sign = 1.0f,
                             .l2 = 0.0f,
                             .shrink = 1.0f - 1e-3f * 0.01f,
                             .w1 = 0.1f,
                             .beta2 = 0.999f,
                             .w2 = 0.001f,
                             .eps = 1e-8f,
                             .neg_step_size = -1e-3f,
                             .bc2_sqrt = 0.5f};
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    double t[REPS];
    for (int r = -2; r < REPS; r++) {
        CUDA_OK(cudaEventRecord(e0, cudaStreamPerThread));
        if (which == PASS_COPY)
            CUDA_OK(cudaMemcpyAsync(m, g, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                    cudaStreamPerThread));
        else
            k->adam_update(p, g, m, v, NULL, n, &a);
        CUDA_OK(cudaEventRecord(e1, cudaStreamPerThread));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = 1e-3 * ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return bench_median(t, REPS);
}

int main(int argc, char **argv) {
    int64_t n = 100 * 1000 * 1000;
    if (argc == 3 && !strcmp(argv[1], "--params")) n = strtoll(argv[2], NULL, 10);
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        printf("bench_cuda_adam: skipped: no usable CUDA device\n");
        return 0;
    }
    float *p, *g, *m, *v;
    size_t bytes = (size_t)n * sizeof(float);
    CUDA_OK(cudaMalloc((void **)&p, bytes));
    CUDA_OK(cudaMalloc((void **)&g, bytes));
    CUDA_OK(cudaMalloc((void **)&m, bytes));
    CUDA_OK(cudaMalloc((void **)&v, bytes));
    CUDA_OK(cudaMemset(p, 0x3c, bytes));
    CUDA_OK(cudaMemset(g, 0x3b, bytes));
    CUDA_OK(cudaMemset(m, 0, bytes));
    CUDA_OK(cudaMemset(v, 0, bytes));
    double copy = time_pass(PASS_COPY, p, g, m, v, n), adam = time_pass(PASS_ADAMW, p, g, m, v, n);
    double copy_bw = 8.0 * (double)n / copy, adam_bw = 28.0 * (double)n / adam;
    printf("%lld parameters on cuda:0\n", (long long)n);
    printf("device copy (8 B/elem)   %8.3f ms %8.1f GB/s\n", 1e3 * copy, copy_bw / 1e9);
    printf("fused AdamW (28 B/elem)  %8.3f ms %8.1f GB/s  %.3f of copy\n", 1e3 * adam,
           adam_bw / 1e9, adam_bw / copy_bw);
    cudaFree(p), cudaFree(g), cudaFree(m), cudaFree(v);
    return 0;
}
