/* loss.cu: mean squared error and cross-entropy on the device, with the CPU's conventions
 * (kernels/cpu/loss.c): sums in double, the loss to *loss on the host (these wait for the
 * device), the gradient written on the device when it is not NULL. */
#include "kernels/cuda/common.cuh"

/* partial[block] = sum of (out - target)^2; dout = 2 (out - target) / n when not NULL */
__global__ void mse_kernel(double *partial, float *dout, const float *out, const float *target,
                           int64_t n, double g) {
    double acc = 0.0;
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) {
        double d = (double)out[i] - (double)target[i];
        acc += d * d;
        if (dout) dout[i] = (float)(g * d);
    }
    acc = fsdp_block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

extern "C" void fsdp_cuda_mse_loss(float *loss, float *dout, const float *out, const float *target,
                                   int64_t n) {
    if (n <= 0) {
        *loss = 0.0f;
        return;
    }
    double *scratch = fsdp_cuda_scratch();
    unsigned blocks = fsdp_partial_blocks(n);
    mse_kernel<<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(scratch, dout, out, target, n,
                                                                     2.0 / (double)n);
    FSDP_CUDA_LAUNCHED("mse_loss");
    fsdp_sum_partials_kernel<<<1, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        scratch + FSDP_CUDA_PARTIALS, scratch, (int)blocks);
    FSDP_CUDA_LAUNCHED("mse_loss (total)");
    *loss = (float)(fsdp_cuda_fetch_double(scratch + FSDP_CUDA_PARTIALS) / (double)n);
}

/* One block per row (striding over rows): loss_r = lse - x[t], dlogits = (softmax - onehot(t)) /
 * rows (fsdp_cross_entropy_row); dlogits may be logits. A target outside [0, classes) sets *bad. */
__global__ void cross_entropy_kernel(double *partial, double *bad, float *dlogits,
                                     const float *logits, const int32_t *targets, int64_t rows,
                                     int64_t classes) {
    double acc = 0.0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * classes; // (classes)
        int32_t t = targets[r];
        if (t < 0 || t >= classes) {
            if (threadIdx.x == 0) *bad = 1.0;
            continue; // the same for every thread of the block
        }
        acc += fsdp_cross_entropy_row(dlogits ? dlogits + r * classes : NULL, x, t, classes,
                                      (double)rows);
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

extern "C" void fsdp_cuda_cross_entropy(float *loss, float *dlogits, const float *logits,
                                        const int32_t *targets, int64_t rows, int64_t classes) {
    if (rows <= 0) {
        *loss = 0.0f;
        return;
    }
    double *scratch = fsdp_cuda_scratch();
    unsigned blocks = (unsigned)(rows < FSDP_CUDA_PARTIALS ? rows : FSDP_CUDA_PARTIALS);
    FSDP_CUDA_CHECK(
        cudaMemsetAsync(scratch + FSDP_CUDA_PARTIALS + 1, 0, sizeof(double), fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
    cross_entropy_kernel<<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        scratch, scratch + FSDP_CUDA_PARTIALS + 1, dlogits, logits, targets, rows, classes);
    FSDP_CUDA_LAUNCHED("cross_entropy");
    fsdp_sum_partials_kernel<<<1, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        scratch + FSDP_CUDA_PARTIALS, scratch, (int)blocks);
    FSDP_CUDA_LAUNCHED("cross_entropy (total)");
    double host[2];
    FSDP_CUDA_CHECK(cudaMemcpyAsync(host, scratch + FSDP_CUDA_PARTIALS, sizeof host,
                                    cudaMemcpyDeviceToHost, fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
    fsdp_cuda_count_host_wait(-1);
    FSDP_CUDA_CHECK(cudaStreamSynchronize(fsdp_cuda_stream()));
    FSDP_ASSERT(host[1] == 0.0); // a target outside [0, classes), as the CPU asserts
    *loss = (float)(host[0] / (double)rows);
}
