/* bench_cuda_adam.c: the CUDA table's fused AdamW step over --params f32 elements (default
 * 100 M) against a device-to-device copy measured in the same run. AdamW reads p, g, m, v and
 * writes p, m, v: 28 bytes per element; a copy moves 8. Bandwidth = bytes / time, and AdamW's
 * as a fraction of the copy's. Built only with CUDA; skips when no GPU is usable. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"       // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_cuda_util.h" // defines: BENCH_CUDA_OK, bench_cuda_median
#include "kernels/kernels.h" // defines: fsdp_kernels_for, fsdp_adam_step_args

#define REPS 20

typedef enum pass { PASS_COPY, PASS_ADAMW } pass;

typedef struct adam_call {
    pass which;
    float *p, *g, *m, *v;
    int64_t n;
} adam_call;

static void run_pass(void *arg) {
    const adam_call *c = arg;
    static const fsdp_adam_step_args a = {.sign = 1.0f,
                                          .l2 = 0.0f,
                                          .shrink = 1.0f - 1e-5f,
                                          .w1 = 0.1f,
                                          .beta2 = 0.999f,
                                          .w2 = 0.001f,
                                          .eps = 1e-8f,
                                          .neg_step_size = -1e-3f,
                                          .bc2_sqrt = 0.5f};
    if (c->which == PASS_COPY)
        BENCH_CUDA_OK(cudaMemcpyAsync(c->m, c->g, (size_t)c->n * sizeof(float),
                                      cudaMemcpyDeviceToDevice, cudaStreamPerThread));
    else
        fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0})
            ->adam_update(c->p, c->g, c->m, c->v, NULL, c->n, &a);
}

#define NAME "bench_cuda_adam"
static const char usage[] =
    "usage: bench_cuda_adam [--params N]\n"
    "The CUDA table's fused AdamW step over N f32 elements on cuda:0 against a device-to-device\n"
    "copy measured in the same run (median of 20 after 2 warm-up runs).\n"
    "options:\n"
    "  --params N  elements per array (default 100000000; p, g, m, v: 16 N bytes of GPU\n"
    "              memory)\n"
    "  --help, -h  prints this help\n"
    "prints: ms and GB/s of the copy (8 B per element) and of AdamW (28 B per element), and\n"
    "AdamW's bandwidth as a fraction of the copy's; or a line saying it skipped when no CUDA\n"
    "device is usable. Writes no file.\n"
    "exit status: 0 done or skipped; 1 a CUDA call failed; 2 bad command line\n";

int main(int argc, char **argv) {
    int64_t n = 100 * 1000 * 1000;
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--params") == 0)
            n = bench_cli_int(NAME, usage, argv[i], bench_cli_value(NAME, usage, argc, argv, &i), 1,
                              1ll << 36);
        else
            bench_cli_fail(NAME, usage, "unknown argument '%s'", argv[i]);
    }
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        printf("bench_cuda_adam: skipped: no usable CUDA device\n");
        return 0;
    }
    float *p, *g, *m, *v;
    size_t bytes = (size_t)n * sizeof(float);
    BENCH_CUDA_OK(cudaMalloc((void **)&p, bytes));
    BENCH_CUDA_OK(cudaMalloc((void **)&g, bytes));
    BENCH_CUDA_OK(cudaMalloc((void **)&m, bytes));
    BENCH_CUDA_OK(cudaMalloc((void **)&v, bytes));
    BENCH_CUDA_OK(cudaMemset(p, 0x3c, bytes));
    BENCH_CUDA_OK(cudaMemset(g, 0x3b, bytes));
    BENCH_CUDA_OK(cudaMemset(m, 0, bytes));
    BENCH_CUDA_OK(cudaMemset(v, 0, bytes));
    adam_call copy_call = {PASS_COPY, p, g, m, v, n}, adam_call_ = {PASS_ADAMW, p, g, m, v, n};
    double copy = bench_cuda_median(run_pass, &copy_call, REPS);
    double adam = bench_cuda_median(run_pass, &adam_call_, REPS);
    double copy_bw = 8.0 * (double)n / copy, adam_bw = 28.0 * (double)n / adam;
    printf("%lld parameters on cuda:0\n", (long long)n);
    printf("device copy (8 B/elem)   %8.3f ms %8.1f GB/s\n", 1e3 * copy, copy_bw / 1e9);
    printf("fused AdamW (28 B/elem)  %8.3f ms %8.1f GB/s  %.3f of copy\n", 1e3 * adam,
           adam_bw / 1e9, adam_bw / copy_bw);
    cudaFree(p), cudaFree(g), cudaFree(m), cudaFree(v);
    return 0;
}
