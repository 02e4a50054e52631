/* elementwise.cu: add, axpy, scale, copy and fill over n floats on the device (float4 when
 * aligned), and the 2- or 4-byte fill behind the storage interface. out may be an input. */
#include "kernels/cuda/common.cuh"

struct add_op {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct axpy_op {
    float alpha;
    __device__ float operator()(float y, float x) const { return y + alpha * x; }
};
struct scale_op {
    float alpha;
    __device__ float operator()(float x) const { return alpha * x; }
};
struct fill_op {
    float value;
    __device__ float operator()(float) const { return value; }
};

extern "C" void fsdp_cuda_add(float *out, const float *a, const float *b, int64_t n) {
    fsdp_map2("add", out, a, b, n, add_op{});
}

extern "C" void fsdp_cuda_axpy(float *y, float alpha, const float *x, int64_t n) {
    fsdp_map2("axpy", y, y, x, n, axpy_op{alpha});
}

extern "C" void fsdp_cuda_scale(float *out, const float *inp, float alpha, int64_t n) {
    fsdp_map1("scale", out, inp, n, scale_op{alpha});
}

extern "C" void fsdp_cuda_copy(float *dst, const float *src, int64_t n) {
    if (n <= 0 || dst == src) return;
    FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                    fsdp_cuda_stream()));
}

extern "C" void fsdp_cuda_fill(float *out, float value, int64_t n) {
    fsdp_map1("fill", out, out, n, fill_op{value});
}

template <class T> __global__ void fill_bits_kernel(T *dst, T bits, int64_t n) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) dst[i] = bits;
}

extern "C" cudaError_t fsdp_cuda_fill_bits(void *dst, uint32_t bits, size_t elem_size, int64_t n) {
    if (n <= 0) return cudaSuccess;
    if (elem_size == 4)
        fill_bits_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            (uint32_t *)dst, bits, n);
    else
        fill_bits_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            (uint16_t *)dst, (uint16_t)bits, n);
    return cudaGetLastError();
}
