/* norm.cu: RMSNorm on the device, one block per row with the row's sums in double, as the CPU
 * (kernels/cpu/norm.c): rstd = 1/sqrt(mean(x^2) + eps), out = x * rstd * weight, stored in f32
 * or rounded to bf16 as convert.cu's f32_to_bf16 rounds; the backward, with a residual's
 * gradient added to the input gradient or not, and the weight gradient's column sums in the same
 * pass over dy and x where they fit a block's shared memory. */
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dtype.cuh"

/* how the forward stores one f32 value */
struct store_f32 {
    __device__ void operator()(float *o, float y) const { *o = y; }
};
struct store_bf16 {
    __device__ void operator()(fsdp_bf16 *o, float y) const {
        *o = bf16_from_bits(__float_as_uint(y));
    }
};

/* One kernel body for both outputs: the same rstd and products (--fmad=false), so the bf16
 * output is the f32 one rounded, bit for bit. */
template <typename T, typename Store>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const float *inp, const float *weight,
                                       float eps, int64_t rows, int64_t cols) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = inp + r * cols; // (cols)
        T *o = out + r * cols;           // (cols)
        double ss = 0.0;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += (double)x[c] * (double)x[c];
        ss = fsdp_block_sum_all(ss);
        double ms = cols > 0 ? ss / (double)cols : 0.0;
        float s = (float)(1.0 / sqrt(ms + (double)eps));
        if (threadIdx.x == 0) rstd[r] = s;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            Store()(&o[c], x[c] * s * weight[c]);
    }
}

extern "C" void fsdp_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                          const float *weight, float eps, int64_t rows,
                                          int64_t cols) {
    if (rows <= 0) return;
    unsigned blocks = fsdp_row_blocks(rows);
    rmsnorm_forward_kernel<float, store_f32><<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, rstd, inp, weight, eps, rows, cols);
    FSDP_CUDA_LAUNCHED("rmsnorm_forward");
}

extern "C" void fsdp_cuda_rmsnorm_forward_bf16(fsdp_bf16 *out, float *rstd, const float *inp,
                                               const float *weight, float eps, int64_t rows,
                                               int64_t cols) {
    if (rows <= 0) return;
    unsigned blocks = fsdp_row_blocks(rows);
    rmsnorm_forward_kernel<fsdp_bf16, store_bf16>
        <<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(out, rstd, inp, weight, eps, rows,
                                                               cols);
    FSDP_CUDA_LAUNCHED("rmsnorm_forward_bf16");
}

/* One row's input gradient, dinp_j = rstd w_j dy_j - (rstd^3 / cols) x_j sum_k dy_k w_k x_k,
 * plus dres_j when ADD: that f32 value then one add (--fmad=false), the bits of the plain
 * kernel then add's. The whole block takes the row (a block sum); each thread also hands
 * each of its columns' (c, dy_c, x_c) to `col` (the fused weight gradient's term). */
template <bool ADD, typename Col>
__device__ inline void rmsnorm_backward_row(float *dx, const float *dy, const float *dres_row,
                                            const float *x, const float *weight, float sf,
                                            int64_t cols, Col col) {
    double dot = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        dot += (double)dy[c] * (double)weight[c] * (double)x[c];
    dot = fsdp_block_sum_all(dot);
    double s = (double)sf;
    float coef = (float)(s * s * s * dot / (double)cols);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float g = sf * weight[c] * dy[c] - coef * x[c];
        dx[c] = ADD ? dres_row[c] + g : g;
        col(c, dy[c], x[c]);
    }
}

struct no_col {
    __device__ void operator()(int64_t, float, float) const {}
};

template <bool ADD>
__global__ void rmsnorm_backward_kernel(float *dinp, const float *dout, const float *dres,
                                        const float *inp, const float *weight, const float *rstd,
                                        int64_t rows, int64_t cols) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
        rmsnorm_backward_row<ADD>(dinp + r * cols, dout + r * cols, ADD ? dres + r * cols : NULL,
                                  inp + r * cols, weight, rstd[r], cols, no_col{});
}

/* the fused weight gradient's term of a row: dw_acc[c] += dy_c x_c rstd in double */
struct dw_col {
    double *acc;
    double s;
    __device__ void operator()(int64_t c, float dy, float x) const {
        acc[c] += (double)dy * (double)x * s;
    }
};

/* The fused backward: a block takes a chunk of consecutive rows and, per row, computes the input
 * gradient as rmsnorm_backward_kernel does, while each thread adds dy x rstd (in double, the
 * column sums' term) for its own columns (threadIdx.x + k blockDim.x) into its own slots of a
 * shared array, row after row. The chunk's sums go to chunk_sums[chunk][c], which
 * fsdp_cuda_column_chunks adds in chunk order: a fixed order, the same bits every run. dy and x
 * are read once from global memory for both gradients; the two-pass form (the kernel above,
 * then fsdp_cuda_column_sum) reads them again for the weight gradient: 2 x 50 MB per norm at
 * shape S (16384 rows of 768), 25 norms a step. */
template <bool ADD>
__global__ void rmsnorm_backward_fused_kernel(float *dinp, double *chunk_sums, const float *dout,
                                              const float *dres, const float *inp,
                                              const float *weight, const float *rstd, int64_t rows,
                                              int64_t cols, int64_t chunk_rows) {
    extern __shared__ double dw_acc[]; // (cols): thread t owns the slots c with c % blockDim == t
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dw_acc[c] = 0.0;
    int64_t first = (int64_t)blockIdx.x * chunk_rows;
    int64_t end = first + chunk_rows < rows ? first + chunk_rows : rows;
    for (int64_t r = first; r < end; r++) // the same bounds for every thread of the block
        rmsnorm_backward_row<ADD>(dinp + r * cols, dout + r * cols, ADD ? dres + r * cols : NULL,
                                  inp + r * cols, weight, rstd[r], cols,
                                  dw_col{dw_acc, (double)rstd[r]});
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        chunk_sums[(int64_t)blockIdx.x * cols + c] = dw_acc[c];
}

#define NORM_CHUNKS          1024        /* blocks worth aiming for: several per SM on any GPU */
#define NORM_FUSED_MAX_BYTES (48 * 1024) /* the shared memory a block gets without opting in */

/* The fused backward where the weight gradient's per-column sums fit a block's shared memory
 * beside the kernel's own (the block sums': 272 bytes, so cols <= 6110) and the allocator gives
 * the chunk sums; false (nothing launched) otherwise. */
static bool rmsnorm_backward_fused(float *dinp, float *dweight, const float *dout,
                                   const float *dres, const float *inp, const float *weight,
                                   const float *rstd, int64_t rows, int64_t cols) {
    size_t smem = (size_t)cols * sizeof(double);
    /* the kernels' static shared memory, asked once per variant (not in every backward) */
    static std::atomic<size_t> static_smem[2]; /* 0: not asked yet; bytes + 1 once asked */
    size_t known = static_smem[dres != NULL].load(std::memory_order_relaxed);
    if (!known) {
        cudaFuncAttributes attr;
        FSDP_CUDA_CHECK(cudaFuncGetAttributes(&attr, dres ? rmsnorm_backward_fused_kernel<true>
                                                          : rmsnorm_backward_fused_kernel<false>));
        known = attr.sharedSizeBytes + 1;
        static_smem[dres != NULL].store(known, std::memory_order_relaxed);
    }
    if (smem + (known - 1) > NORM_FUSED_MAX_BYTES) return false;
    int64_t chunk_rows = (rows + NORM_CHUNKS - 1) / NORM_CHUNKS;
    int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    int device = 0;
    void *sums = NULL;
    FSDP_CUDA_CHECK(cudaGetDevice(&device));
    if (fsdp_cuda_block_alloc(NULL, device, (size_t)(chunks * cols) * sizeof(double), &sums) !=
        FSDP_OK)
        return false;
    if (dres) {
        rmsnorm_backward_fused_kernel<true>
            <<<(unsigned)chunks, FSDP_CUDA_THREADS, smem, fsdp_cuda_stream()>>>(
                dinp, (double *)sums, dout, dres, inp, weight, rstd, rows, cols, chunk_rows);
        FSDP_CUDA_LAUNCHED("rmsnorm_backward_add");
    } else {
        rmsnorm_backward_fused_kernel<false>
            <<<(unsigned)chunks, FSDP_CUDA_THREADS, smem, fsdp_cuda_stream()>>>(
                dinp, (double *)sums, dout, NULL, inp, weight, rstd, rows, cols, chunk_rows);
        FSDP_CUDA_LAUNCHED("rmsnorm_backward");
    }
    fsdp_cuda_column_chunks(dweight, (const double *)sums, chunks, cols);
    fsdp_cuda_block_free(device, sums); // after the kernels on this stream (the allocator's event)
    return true;
}

/* The fused form where it fits; else the input gradient (plus dres when given) by one block per
 * row, then the weight gradient's column sums. */
static void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *dres,
                             const float *inp, const float *weight, const float *rstd, int64_t rows,
                             int64_t cols) {
    if (rmsnorm_backward_fused(dinp, dweight, dout, dres, inp, weight, rstd, rows, cols)) return;
    unsigned blocks = fsdp_row_blocks(rows);
    if (dres) {
        rmsnorm_backward_kernel<true><<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            dinp, dout, dres, inp, weight, rstd, rows, cols);
        FSDP_CUDA_LAUNCHED("rmsnorm_backward_add");
    } else {
        rmsnorm_backward_kernel<false><<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            dinp, dout, NULL, inp, weight, rstd, rows, cols);
        FSDP_CUDA_LAUNCHED("rmsnorm_backward");
    }
    fsdp_cuda_column_sum(dweight, dout, inp, rstd, rows, cols);
}

extern "C" void fsdp_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                           const float *inp, const float *weight, const float *rstd,
                                           int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    rmsnorm_backward(dinp, dweight, dout, NULL, inp, weight, rstd, rows, cols);
}

extern "C" void fsdp_cuda_rmsnorm_backward_add(float *dinp, float *dweight, const float *dout,
                                               const float *dres, const float *inp,
                                               const float *weight, const float *rstd, int64_t rows,
                                               int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    rmsnorm_backward(dinp, dweight, dout, dres, inp, weight, rstd, rows, cols);
}
