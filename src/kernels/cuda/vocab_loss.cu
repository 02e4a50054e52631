/* vocab_loss.cu: loss parallel's per-row pieces on the device, with the CPU's semantics
 * (kernels/cpu/vocab_loss.c): one block per row for the maxima and the sums (its threads over the
 * classes, then across the block in a fixed order: the maxima the CPU's, the sums in double in
 * another order than the CPU's class order, the same bits every run), one thread per element for
 * the gradient. Deterministic (no atomics). Before, one thread per row walked its classes in
 * turn, neighbouring threads V floats apart. */
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/llama_cuda.h"

__global__ void vocab_row_max_kernel(float *mx, const float *logits, int64_t rows, int64_t V) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * V; // (V)
        float m = -INFINITY;
        for (int64_t c = threadIdx.x; c < V; c += blockDim.x) m = x[c] > m ? x[c] : m;
        m = fsdp_block_max_all(m);
        if (threadIdx.x == 0) mx[r] = m;
    }
}

extern "C" void fsdp_cuda_vocab_row_max(float *mx, const float *logits, int64_t rows, int64_t V) {
    if (rows <= 0) return;
    vocab_row_max_kernel<<<fsdp_row_blocks(rows), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        mx, logits, rows, V);
    FSDP_CUDA_LAUNCHED("vocab_row_max");
}

__global__ void vocab_exp_sums_kernel(float *se, float *xt, const float *logits, const float *mx,
                                      const int32_t *targets, int32_t ignore_index, int64_t start,
                                      int64_t rows, int64_t V) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * V;  // (V)
        if (targets[r] == ignore_index) { // the same for the whole block
            if (threadIdx.x == 0) se[r] = 0.0f, xt[r] = 0.0f;
            continue;
        }
        double m = (double)mx[r], s = 0.0;
        for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += exp((double)x[c] - m);
        s = fsdp_block_sum_all(s);
        if (threadIdx.x == 0) {
            se[r] = (float)s;
            int64_t t = (int64_t)targets[r] - start;
            xt[r] = t >= 0 && t < V ? x[t] : 0.0f;
        }
    }
}

extern "C" void fsdp_cuda_vocab_exp_sums(float *se, float *xt, const float *logits, const float *mx,
                                         const int32_t *targets, int32_t ignore_index,
                                         int64_t start, int64_t rows, int64_t V) {
    if (rows <= 0) return;
    vocab_exp_sums_kernel<<<fsdp_row_blocks(rows), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        se, xt, logits, mx, targets, ignore_index, start, rows, V);
    FSDP_CUDA_LAUNCHED("vocab_exp_sums");
}

__global__ void vocab_ce_grad_kernel(float *dlogits, const float *logits, const float *mx,
                                     const float *se, const int32_t *targets, int32_t ignore_index,
                                     int64_t start, int64_t rows, int64_t V, double n) {
    for (int64_t e = fsdp_tid(); e < rows * V; e += fsdp_stride()) {
        int64_t r = e / V, c = e % V;
        if (targets[r] == ignore_index) {
            dlogits[e] = 0.0f;
            continue;
        }
        double lse = (double)mx[r] + log((double)se[r]);
        double p = exp((double)logits[e] - lse);
        dlogits[e] = (float)((c == (int64_t)targets[r] - start ? p - 1.0 : p) / n);
    }
}

extern "C" void fsdp_cuda_vocab_ce_grad(float *dlogits, const float *logits, const float *mx,
                                        const float *se, const int32_t *targets,
                                        int32_t ignore_index, int64_t start, int64_t rows,
                                        int64_t V, int64_t n) {
    if (rows <= 0 || V <= 0) return;
    vocab_ce_grad_kernel<<<fsdp_grid(rows * V), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dlogits, logits, mx, se, targets, ignore_index, start, rows, V, (double)n);
    FSDP_CUDA_LAUNCHED("vocab_ce_grad");
}
