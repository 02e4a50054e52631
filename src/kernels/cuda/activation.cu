/* activation.cu: ReLU, sigmoid and GELU (tanh approximation) on the device, forward and
 * backward, with the CPU's formulas (kernels/cpu/activation.c). out may be an input. */
#include "kernels/cuda/common.cuh"

#define GELU_K 0.7978845608028654f // sqrt(2 / pi)
#define GELU_C 0.044715f

struct relu_op {
    __device__ float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct relu_back_op {
    __device__ float operator()(float x, float g) const { return x > 0.0f ? g : 0.0f; }
};
/* 1 / (1 + e^-x) from z = e^-|x| <= 1, so nothing overflows */
struct sigmoid_op {
    __device__ float operator()(float x) const {
        float z = expf(-fabsf(x));
        float s = 1.0f / (1.0f + z);
        return x >= 0.0f ? s : z * s;
    }
};
struct sigmoid_back_op {
    __device__ float operator()(float y, float g) const { return g * y * (1.0f - y); }
};
struct gelu_op {
    __device__ float operator()(float x) const {
        float u = GELU_K * (x + GELU_C * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
};
/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(u) */
struct gelu_back_op {
    __device__ float operator()(float x, float g) const {
        float t = tanhf(GELU_K * (x + GELU_C * x * x * x));
        float sech2 = 1.0f - t * t; // 0 once |x| is large, where du may overflow to inf
        float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        float right = sech2 == 0.0f ? 0.0f : 0.5f * x * sech2 * du;
        return g * (0.5f * (1.0f + t) + right);
    }
};

extern "C" void fsdp_cuda_relu_forward(float *out, const float *inp, int64_t n) {
    fsdp_map1("relu_forward", out, inp, n, relu_op{});
}

extern "C" void fsdp_cuda_relu_backward(float *dinp, const float *inp, const float *dout,
                                        int64_t n) {
    fsdp_map2("relu_backward", dinp, inp, dout, n, relu_back_op{});
}

extern "C" void fsdp_cuda_sigmoid_forward(float *out, const float *inp, int64_t n) {
    fsdp_map1("sigmoid_forward", out, inp, n, sigmoid_op{});
}

extern "C" void fsdp_cuda_sigmoid_backward(float *dinp, const float *out, const float *dout,
                                           int64_t n) {
    fsdp_map2("sigmoid_backward", dinp, out, dout, n, sigmoid_back_op{});
}

extern "C" void fsdp_cuda_gelu_forward(float *out, const float *inp, int64_t n) {
    fsdp_map1("gelu_forward", out, inp, n, gelu_op{});
}

extern "C" void fsdp_cuda_gelu_backward(float *dinp, const float *inp, const float *dout,
                                        int64_t n) {
    fsdp_map2("gelu_backward", dinp, inp, dout, n, gelu_back_op{});
}
