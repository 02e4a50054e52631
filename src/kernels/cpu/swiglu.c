/* swiglu.c: the SwiGLU gate of the Llama feed-forward on the CPU, out = silu(gate) * up, and
 * its backward; and both on bf16 gate and up, the forward rounded to bf16 (and the backward's
 * gradients too, in its _round form). Elementwise. */
#include <math.h>

#include "kernels/cpu/cpu.h" // defines: fsdp_cpu_f32_to_bf16, fsdp_cpu_bf16_to_f32
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

/* The bf16 entries widen blocks of gate and up on the stack (exactly) and run the f32 kernels
 * on them, rounding the forward's block with the table's own conversion: the bits are those of
 * the f32 entries on widened inputs (then f32_to_bf16) by construction; nothing is allocated. */
enum { BLOCK = 512 };

void fsdp_cpu_swiglu_forward_bf16(fsdp_bf16 *out, const fsdp_bf16 *gate, const fsdp_bf16 *up,
                                  int64_t n) {
    float g[BLOCK], u[BLOCK], y[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        fsdp_cpu_bf16_to_f32(g, gate + i, m);
        fsdp_cpu_bf16_to_f32(u, up + i, m);
        fsdp_cpu_swiglu_forward(y, g, u, m);
        fsdp_cpu_f32_to_bf16(out + i, y, m);
    }
}

void fsdp_cpu_swiglu_backward_bf16(float *dgate, float *dup, const float *dout,
                                   const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n) {
    float g[BLOCK], u[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        fsdp_cpu_bf16_to_f32(g, gate + i, m);
        fsdp_cpu_bf16_to_f32(u, up + i, m);
        fsdp_cpu_swiglu_backward(dgate + i, dup + i, dout + i, g, u, m);
    }
}

void fsdp_cpu_swiglu_backward_bf16_round(fsdp_bf16 *dgate, fsdp_bf16 *dup, const float *dout,
                                         const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n) {
    float g[BLOCK], u[BLOCK], dg[BLOCK], du[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        fsdp_cpu_bf16_to_f32(g, gate + i, m);
        fsdp_cpu_bf16_to_f32(u, up + i, m);
        fsdp_cpu_swiglu_backward(dg, du, dout + i, g, u, m);
        fsdp_cpu_f32_to_bf16(dgate + i, dg, m);
        fsdp_cpu_f32_to_bf16(dup + i, du, m);
    }
}

void fsdp_cpu_swiglu_backward_bf16io(fsdp_bf16 *dgate, fsdp_bf16 *dup, const fsdp_bf16 *dout,
                                     const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n) {
    float dy[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        fsdp_cpu_bf16_to_f32(dy, dout + i, m);
        fsdp_cpu_swiglu_backward_bf16_round(dgate + i, dup + i, dy, gate + i, up + i, m);
    }
}
