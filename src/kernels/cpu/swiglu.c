/* swiglu.c: the SwiGLU gate of the Llama feed-forward on the CPU, out = silu(gate) * up, and
 * its backward. Elementwise over n floats. */
#include <math.h>

#include "kernels/cpu/llama.h"

/* sigmoid(x) from z = e^-|x| <= 1, so nothing overflows (as activation.c) */
static inline float sigmoid(float x) {
    float z = expf(-fabsf(x));
    float s = 1.0f / (1.0f + z);
    return x >= 0.0f ? s : z * s;
}

void fsdp_cpu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g * sigmoid(g) * up[i];
    }
}

/* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g) */
void fsdp_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], dy = dout[i], s = sigmoid(g);
        dgate[i] = dy * u * s * (1.0f + g * (1.0f - s));
        dup[i] = dy * g * s;
    }
}
