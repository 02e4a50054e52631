/* swiglu.c: the SwiGLU gate of the Llama feed-forward on the CPU, out = silu(gate) * up, and
 * its backward; and the forward rounded to bf16. Elementwise over n floats. */
#include <math.h>

#include "kernels/cpu/cpu.h" // defines: fsdp_cpu_f32_to_bf16
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

/* Blocks of the f32 forward on the stack, each rounded by the table's own conversion: the bits
 * are those of swiglu_forward then f32_to_bf16 by construction, and nothing is allocated. */
void fsdp_cpu_swiglu_forward_bf16(fsdp_bf16 *out, const float *gate, const float *up, int64_t n) {
    enum { BLOCK = 512 };
    float y[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        fsdp_cpu_swiglu_forward(y, gate + i, up + i, m);
        fsdp_cpu_f32_to_bf16(out + i, y, m);
    }
}
