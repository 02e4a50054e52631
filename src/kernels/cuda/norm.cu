/* norm.cu: RMSNorm on the device, one block per row with the row's sums in double, as the CPU
 * (kernels/cpu/norm.c): rstd = 1/sqrt(mean(x^2) + eps), out = x * rstd * weight, stored in f32
 * or rounded to bf16 as convert.cu's f32_to_bf16 rounds; the backward, with a residual's
 * gradient added to the input gradient or not. */
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

/* dinp_j = rstd w_j dy_j - (rstd^3 / cols) x_j sum_k dy_k w_k x_k, plus dres_j when ADD: that
 * f32 value then one add (--fmad=false), the bits of the plain kernel then add's */
template <bool ADD>
__global__ void rmsnorm_backward_kernel(float *dinp, const float *dout, const float *dres,
                                        const float *inp, const float *weight, const float *rstd,
                                        int64_t rows, int64_t cols) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = inp + r * cols;   // (cols)
        const float *dy = dout + r * cols; // (cols)
        float *dx = dinp + r * cols;       // (cols)
        double dot = 0.0;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            dot += (double)dy[c] * (double)weight[c] * (double)x[c];
        dot = fsdp_block_sum_all(dot);
        double s = (double)rstd[r];
        float coef = (float)(s * s * s * dot / (double)cols);
        float sf = rstd[r];
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float g = sf * weight[c] * dy[c] - coef * x[c];
            dx[c] = ADD ? dres[r * cols + c] + g : g;
        }
    }
}

/* the input gradient (plus dres when given) by one block per row, then the weight gradient */
static void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *dres,
                             const float *inp, const float *weight, const float *rstd, int64_t rows,
                             int64_t cols) {
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
