/* embedding.cu: the token embedding on the device, with the CPU's semantics and bits
 * (kernels/cpu/embedding.c): a row gather forward, and a backward that adds each table row's
 * output-gradient rows in token order, column by column (no atomics: the same bits every run,
 * and the CPU's). Tokens outside the vocabulary range [start, start + rows) give zero rows and
 * add nothing.
 *
 * The backward sorts the token positions by row first (CUB's radix sort, which is stable, so
 * each row's positions stay in token order), then gives each run of one row to a block whose
 * threads take the columns: every (row, column) sum runs in parallel, as PyTorch's embedding
 * backward does after its sort. Without the sort (no scratch memory), one thread per column
 * walks every token in turn: the same sums, with C threads for the whole GPU. */
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/llama_cuda.h"

__global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const float *weight,
                                         int64_t n, int64_t C, int64_t start, int64_t rows) {
    for (int64_t e = fsdp_tid(); e < n * C; e += fsdp_stride()) {
        int64_t r = (int64_t)tokens[e / C] - start;
        out[e] = r >= 0 && r < rows ? weight[r * C + e % C] : 0.0f;
    }
}

extern "C" void fsdp_cuda_embedding_forward(float *out, const int32_t *tokens, const float *weight,
                                            int64_t n, int64_t C, int64_t start, int64_t rows) {
    if (n <= 0 || C <= 0) return;
    embedding_forward_kernel<<<fsdp_grid(n * C), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, tokens, weight, n, C, start, rows);
    FSDP_CUDA_LAUNCHED("embedding_forward");
}

/* one thread per column, rows in token order: the fallback, without scratch memory */
__global__ void embedding_backward_kernel(float *dweight, const float *dout, const int32_t *tokens,
                                          int64_t n, int64_t C, int64_t start, int64_t rows) {
    for (int64_t c = fsdp_tid(); c < C; c += fsdp_stride())
        for (int64_t i = 0; i < n; i++) {
            int64_t r = (int64_t)tokens[i] - start;
            if (r >= 0 && r < rows) dweight[r * C + c] += dout[i * C + c];
        }
}

/* keys[i]: token i's row of the range, or `rows` (after every row) outside it; pos[i] = i */
__global__ void embedding_keys_kernel(int32_t *keys, int32_t *pos, const int32_t *tokens, int64_t n,
                                      int64_t start, int64_t rows) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) {
        int64_t r = (int64_t)tokens[i] - start;
        keys[i] = (int32_t)(r >= 0 && r < rows ? r : rows);
        pos[i] = (int32_t)i;
    }
}

/* The end of the run of row r that starts at sorted position j: the block probes the keys after
 * j a window of blockDim at a time. The keys are sorted, so "key != r" holds from the run's end
 * on: the first window where some thread sees it holds the end, at the count of threads before
 * it. Block-uniform (every thread takes the same windows and gets the same end). */
__device__ inline int64_t embedding_run_end(const int32_t *keys, int64_t j, int64_t n, int64_t r) {
    for (int64_t base = j + 1; base < n; base += blockDim.x) {
        int64_t k = base + threadIdx.x;
        bool stop = k < n && keys[k] != r;
        if (__syncthreads_or(stop)) return base + __syncthreads_count(k < n && !stop);
    }
    return n;
}

#define EMB_UNROLL 8 /* gradient rows whose loads a thread has in flight at once */

/* Over the sorted keys: the block of position j, when j starts a run of one row, adds the run's
 * gradient rows (pos[j], pos[j + 1], ...: token order) into that row, a thread per column. The
 * run's end is found first, so a thread issues the loads of EMB_UNROLL rows before adding them
 * one by one in order (the same additions as a loop of one row at a time): a long run (a
 * frequent token, padding) is bound by bandwidth, not by one load's latency per row. */
__global__ void embedding_runs_kernel(float *dweight, const float *dout, const int32_t *keys,
                                      const int32_t *pos, int64_t n, int64_t C, int64_t rows) {
    for (int64_t j = blockIdx.x; j < n; j += gridDim.x) {
        int64_t r = keys[j];
        if (r >= rows || (j > 0 && keys[j - 1] == keys[j])) continue; // the same for the block
        int64_t end = embedding_run_end(keys, j, n, r);
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = dweight[r * C + c];
            int64_t k = j;
            for (; k + EMB_UNROLL <= end; k += EMB_UNROLL) {
                float v[EMB_UNROLL];
#pragma unroll
                for (int u = 0; u < EMB_UNROLL; u++) v[u] = dout[(int64_t)pos[k + u] * C + c];
#pragma unroll
                for (int u = 0; u < EMB_UNROLL; u++) acc += v[u];
            }
            for (; k < end; k++) acc += dout[(int64_t)pos[k] * C + c];
            dweight[r * C + c] = acc;
        }
    }
}

static size_t align256(size_t bytes) {
    return (bytes + 255) & ~(size_t)255;
}

/* The sorted path; false (nothing launched) when it cannot run: counts beyond int32, or no
 * scratch memory. */
static bool backward_sorted(float *dweight, const float *dout, const int32_t *tokens, int64_t n,
                            int64_t C, int64_t start, int64_t rows) {
    if (n > INT32_MAX - 1 || rows > INT32_MAX - 1) return false;
    int end_bit = 1; // bits enough for the keys 0..rows
    while (end_bit < 31 && ((int64_t)1 << end_bit) <= rows) end_bit++;
    cudaStream_t stream = fsdp_cuda_stream();
    size_t sort_bytes = 0;
    if (cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (const int32_t *)nullptr,
                                        (int32_t *)nullptr, (const int32_t *)nullptr,
                                        (int32_t *)nullptr, (int)n, 0, end_bit,
                                        stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    size_t array = align256((size_t)n * sizeof(int32_t));
    int device = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&device));
    void *scratch = NULL;
    if (fsdp_cuda_block_alloc(NULL, device, 4 * array + align256(sort_bytes), &scratch) != FSDP_OK)
        return false;
    char *base = (char *)scratch;
    int32_t *keys = (int32_t *)base, *pos = (int32_t *)(base + array);
    int32_t *sorted_keys = (int32_t *)(base + 2 * array),
            *sorted_pos = (int32_t *)(base + 3 * array);
    void *sort_scratch = base + 4 * array;
    embedding_keys_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, stream>>>(keys, pos, tokens, n,
                                                                          start, rows);
    FSDP_CUDA_LAUNCHED("embedding_backward (keys)");
    FSDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, keys, sorted_keys,
                                                    pos, sorted_pos, (int)n, 0, end_bit, stream));
    fsdp_cuda_count_launch(device);
    embedding_runs_kernel<<<fsdp_row_blocks(n), FSDP_CUDA_THREADS, 0, stream>>>(
        dweight, dout, sorted_keys, sorted_pos, n, C, rows);
    FSDP_CUDA_LAUNCHED("embedding_backward (runs)");
    fsdp_cuda_block_free(device,
                         scratch); // after the kernels on this stream (the allocator's event)
    return true;
}

extern "C" void fsdp_cuda_embedding_backward(float *dweight, const float *dout,
                                             const int32_t *tokens, int64_t n, int64_t C,
                                             int64_t start, int64_t rows) {
    if (n <= 0 || C <= 0 || rows <= 0) return;
    if (backward_sorted(dweight, dout, tokens, n, C, start, rows)) return;
    embedding_backward_kernel<<<fsdp_grid(C), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dweight, dout, tokens, n, C, start, rows);
    FSDP_CUDA_LAUNCHED("embedding_backward");
}
