/* bias.cu: the Linear layer's device kernels besides the GEMM: the bias broadcast over rows,
 * its gradient (column sums) and C = beta C for a GEMM with K == 0. */
#include "kernels/cuda/common.cuh"

/* out (rows, cols) += bias (cols): a 2-D grid, x over columns, y striding over rows */
__global__ void bias_add_kernel(float *out, const float *bias, int64_t rows, int64_t cols) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float b = bias[c];
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) out[r * cols + c] += b;
}

extern "C" void fsdp_cuda_bias_add(float *out, const float *bias, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    dim3 grid((unsigned)((cols + FSDP_CUDA_THREADS - 1) / FSDP_CUDA_THREADS),
              (unsigned)(rows < 1024 ? rows : 1024));
    bias_add_kernel<<<grid, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(out, bias, rows, cols);
    FSDP_CUDA_LAUNCHED("bias_add");
}

extern "C" void fsdp_cuda_bias_backward(float *dbias, const float *dout, int64_t rows,
                                        int64_t cols) {
    fsdp_cuda_column_sum(dbias, dout, NULL, NULL, rows, cols);
}

__global__ void scale_matrix_kernel(float *C, int64_t ldc, int64_t M, int64_t N, float beta) {
    for (int64_t k = fsdp_tid(); k < M * N; k += fsdp_stride()) {
        float *x = C + (k / N) * ldc + k % N;
        *x = beta == 0.0f ? 0.0f : *x * beta;
    }
}

extern "C" void fsdp_cuda_scale_matrix(float *C, int64_t ldc, int64_t M, int64_t N, float beta) {
    if (M <= 0 || N <= 0) return;
    scale_matrix_kernel<<<fsdp_grid(M * N), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(C, ldc, M,
                                                                                        N, beta);
    FSDP_CUDA_LAUNCHED("gemm (K = 0)");
}
