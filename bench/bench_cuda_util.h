/* bench_cuda_util.h: what the CUDA benchmarks share: a check that exits with CUDA's message,
 * and the median time of a piece of GPU work measured with events on this thread's stream. */
#ifndef FSDP_BENCH_CUDA_UTIL_H
#define FSDP_BENCH_CUDA_UTIL_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h" // defines: bench_median

#define BENCH_CUDA_OK(expr)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define BENCH_CUDA_MAX_REPS 100

/* Median seconds of reps (<= BENCH_CUDA_MAX_REPS) runs of work(arg) after 2 warm-up runs, each
 * timed by events recorded around it on cudaStreamPerThread. */
static inline double bench_cuda_median(void (*work)(void *), void *arg, int reps) {
    cudaEvent_t e0, e1;
    BENCH_CUDA_OK(cudaEventCreate(&e0));
    BENCH_CUDA_OK(cudaEventCreate(&e1));
    double t[BENCH_CUDA_MAX_REPS];
    for (int r = -2; r < reps; r++) {
        BENCH_CUDA_OK(cudaEventRecord(e0, cudaStreamPerThread));
        work(arg);
        BENCH_CUDA_OK(cudaEventRecord(e1, cudaStreamPerThread));
        BENCH_CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        BENCH_CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = 1e-3 * ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return bench_median(t, reps);
}

#endif
