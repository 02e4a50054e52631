/* reduce.cu: reductions on the device, summed in double: sum, sum of squares and max |x| of n
 * floats (block partials, then one block over them: a fixed order, so the same bits every
 * run), and the column sums behind the bias and RMSNorm weight gradients. */
#include <string.h>

#include "kernels/cuda/common.cuh"

__global__ void sum_partials_kernel(double *partial, const float *x, int64_t n, bool square) {
    double acc = 0.0;
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) {
        double v = (double)x[i];
        acc += square ? v * v : v;
    }
    acc = fsdp_block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

static double sum_of(const float *x, int64_t n, bool square) {
    if (n <= 0) return 0.0;
    double *scratch = fsdp_cuda_scratch();
    unsigned blocks = fsdp_partial_blocks(n);
    sum_partials_kernel<<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(scratch, x, n,
                                                                              square);
    FSDP_CUDA_LAUNCHED("sum (partials)");
    fsdp_sum_partials_kernel<<<1, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        scratch + FSDP_CUDA_PARTIALS, scratch, (int)blocks);
    FSDP_CUDA_LAUNCHED("sum (final)");
    return fsdp_cuda_fetch_double(scratch + FSDP_CUDA_PARTIALS);
}

extern "C" double fsdp_cuda_sum(const float *x, int64_t n) {
    return sum_of(x, n, false);
}

extern "C" double fsdp_cuda_sum_squares(const float *x, int64_t n) {
    return sum_of(x, n, true);
}

/* With the sign cleared, f32 bit patterns order like the values and every NaN sorts above
 * inf: an integer max gives max |x|, or NaN if any (as the CPU). */
__global__ void max_abs_kernel(unsigned int *out, const float *x, int64_t n) {
    unsigned int m = 0;
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride())
        m = max(m, __float_as_uint(x[i]) & 0x7FFFFFFFu);
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) atomicMax(out, m); // max is order-free: still deterministic
}

extern "C" double fsdp_cuda_max_abs(const float *x, int64_t n) {
    if (n <= 0) return 0.0;
    double *scratch = fsdp_cuda_scratch();
    unsigned int *bits = (unsigned int *)scratch;
    FSDP_CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof *bits, fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
    max_abs_kernel<<<fsdp_partial_blocks(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(bits, x,
                                                                                         n);
    FSDP_CUDA_LAUNCHED("max_abs");
    unsigned int m = 0;
    FSDP_CUDA_CHECK(
        cudaMemcpyAsync(&m, bits, sizeof m, cudaMemcpyDeviceToHost, fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
    fsdp_cuda_count_host_wait(-1);
    FSDP_CUDA_CHECK(cudaStreamSynchronize(fsdp_cuda_stream()));
    float best;
    memcpy(&best, &m, sizeof best);
    return (double)best;
}

/* Column sums: a block takes 32 columns and one chunk of the rows; its 8 rows of threads take
 * every 8th row of the chunk each, and their 8 partials are added in order. One chunk (a short
 * matrix, or no scratch memory) adds straight into dst; several write their sums to a scratch
 * block, which one thread per column then adds in chunk order: a fixed order either way, so the
 * same bits every run. Chunks keep the GPU busy when the columns are few: RMSNorm's weight
 * gradient at dim 768 has 24 blocks of columns for 16384 rows, which one chunk ran on 24 SMs,
 * each thread over 2048 rows in turn. */
#define COL_X          32
#define COL_Y          8
#define COL_BLOCKS     1024 /* the blocks worth aiming for: several per SM on any GPU */
#define COL_MIN_ROWS   256  /* rows a chunk has at least */
#define COL_MAX_CHUNKS 65535

__global__ void column_sum_kernel(float *dst, double *chunk_sums, const float *a, const float *b,
                                  const float *scale, int64_t rows, int64_t cols,
                                  int64_t chunk_rows) {
    __shared__ double part[COL_Y][COL_X];
    int64_t c = (int64_t)blockIdx.x * COL_X + threadIdx.x;
    int64_t first = (int64_t)blockIdx.y * chunk_rows;
    int64_t end = first + chunk_rows < rows ? first + chunk_rows : rows;
    double acc = 0.0;
    if (c < cols) {
        for (int64_t r = first + threadIdx.y; r < end; r += COL_Y) {
            if (b) {
                double s = scale ? (double)scale[r] : 1.0;
                acc += (double)a[r * cols + c] * (double)b[r * cols + c] * s;
            } else {
                acc += (double)a[r * cols + c];
            }
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        double total = 0.0;
        for (int y = 0; y < COL_Y; y++) total += part[y][threadIdx.x];
        if (chunk_sums)
            chunk_sums[(int64_t)blockIdx.y * cols + c] = total;
        else
            dst[c] = (float)((double)dst[c] + total);
    }
}

/* dst[c] += the chunks' sums of column c, in chunk order */
__global__ void column_chunks_kernel(float *dst, const double *chunk_sums, int64_t chunks,
                                     int64_t cols) {
    for (int64_t c = fsdp_tid(); c < cols; c += fsdp_stride()) {
        double total = 0.0;
        for (int64_t k = 0; k < chunks; k++) total += chunk_sums[k * cols + c];
        dst[c] = (float)((double)dst[c] + total);
    }
}

extern "C" void fsdp_cuda_column_chunks(float *dst, const double *chunk_sums, int64_t chunks,
                                        int64_t cols) {
    if (cols <= 0) return;
    column_chunks_kernel<<<fsdp_grid(cols), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dst, chunk_sums, chunks, cols);
    FSDP_CUDA_LAUNCHED("column_sum (chunks)");
}

extern "C" void fsdp_cuda_column_sum(float *dst, const float *a, const float *b, const float *scale,
                                     int64_t rows, int64_t cols) {
    if (cols <= 0) return;
    int64_t col_blocks = (cols + COL_X - 1) / COL_X, chunks = 1;
    if (col_blocks < COL_BLOCKS && rows >= 2 * COL_MIN_ROWS) {
        chunks = (COL_BLOCKS + col_blocks - 1) / col_blocks;
        if (chunks > rows / COL_MIN_ROWS) chunks = rows / COL_MIN_ROWS;
        if (chunks > COL_MAX_CHUNKS) chunks = COL_MAX_CHUNKS;
    }
    int64_t chunk_rows = (rows + chunks - 1) / chunks;
    if (chunk_rows < 1) chunk_rows = 1;
    chunks = rows > 0 ? (rows + chunk_rows - 1) / chunk_rows : 1;
    void *sums = NULL;
    int device = 0;
    if (chunks > 1) {
        FSDP_CUDA_CHECK(cudaGetDevice(&device));
        if (fsdp_cuda_block_alloc(NULL, device, (size_t)(chunks * cols) * sizeof(double), &sums) !=
            FSDP_OK) {
            chunks = 1; // one chunk needs no memory: slower, the same sums
            chunk_rows = rows > 0 ? rows : 1;
        }
    }
    dim3 block(COL_X, COL_Y), grid((unsigned)col_blocks, (unsigned)chunks);
    column_sum_kernel<<<grid, block, 0, fsdp_cuda_stream()>>>(dst, (double *)sums, a, b, scale,
                                                              rows, cols, chunk_rows);
    FSDP_CUDA_LAUNCHED("column_sum");
    if (!sums) return;
    fsdp_cuda_column_chunks(dst, (const double *)sums, chunks, cols);
    fsdp_cuda_block_free(device, sums); // after the kernels on this stream (the allocator's event)
}
