/* activation.c: ReLU, sigmoid and GELU (tanh approximation) on the CPU, forward and
 * backward. Elementwise over n floats; out may be the same array as an input (in place). */
#include <math.h>

#include "kernels/cpu/cpu.h"

void fsdp_cpu_relu_forward(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void fsdp_cpu_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i], g = dout[i];
        dinp[i] = x > 0.0f ? g : 0.0f;
    }
}

/* 1 / (1 + e^-x) from z = e^-|x| <= 1, so nothing overflows: x >= 0 gives 1 / (1 + z),
 * x < 0 gives z / (1 + z). */
void fsdp_cpu_sigmoid_forward(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float z = expf(-fabsf(inp[i]));
        float s = 1.0f / (1.0f + z);
        out[i] = inp[i] >= 0.0f ? s : z * s;
    }
}

void fsdp_cpu_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) dinp[i] = dout[i] * out[i] * (1.0f - out[i]);
}

/* GELU as PyTorch's gelu(approximate='tanh'): 0.5 x (1 + tanh(u)), u = k (x + c x^3). */
#define GELU_K 0.7978845608028654f // sqrt(2 / pi)
#define GELU_C 0.044715f

void fsdp_cpu_gelu_forward(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_C * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(u) */
void fsdp_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float t = tanhf(GELU_K * (x + GELU_C * x * x * x));
        float sech2 = 1.0f - t * t; // 0 once |x| is large, where du may overflow to inf
        float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        float right = sech2 == 0.0f ? 0.0f : 0.5f * x * sech2 * du;
        dinp[i] = dout[i] * (0.5f * (1.0f + t) + right);
    }
}
