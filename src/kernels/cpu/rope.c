/* rope.c: rotary position embedding on the CPU in Hugging Face Llama's rotate_half layout (the
 * two halves of each head rotate together, not interleaved pairs), and its transpose; for one
 * tensor, or for q and k in one pass (also from bf16 q and k, and the backward into bf16
 * gradients), and bf16 to bf16 both ways. */
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/cpu.h" // defines: fsdp_cpu_f32_to_bf16
#include "kernels/cpu/llama.h"

/* The H heads of one position, x (H, D) into y (H, D), rotated by +angle (sign 1) or -angle
 * (sign -1); c, s (D / 2): that position's cos and sin. */
static void rotate_heads(float *y, const float *x, const float *c, const float *s, float sign,
                         int64_t H, int64_t D) {
    int64_t h = D / 2;
    for (int64_t hd = 0; hd < H; hd++, x += D, y += D) {
        for (int64_t i = 0; i < h; i++) {
            float x1 = x[i], x2 = x[i + h], si = sign * s[i];
            y[i] = x1 * c[i] - x2 * si;
            y[i + h] = x2 * c[i] + x1 * si;
        }
    }
}

/* q (B, T, NH, D) into qo and, when k is not NULL, k (B, T, NKV, D) into ko, position by
 * position; cos, sin (T, D / 2). */
static void rotate(float *qo, float *ko, const float *q, const float *k, const float *cos,
                   const float *sin, float sign, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                   int64_t D) {
    int64_t h = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *c = cos + t * h, *s = sin + t * h; // (h)
            int64_t row = b * T + t;
            rotate_heads(qo + row * NH * D, q + row * NH * D, c, s, sign, NH, D);
            if (k) rotate_heads(ko + row * NKV * D, k + row * NKV * D, c, s, sign, NKV, D);
        }
    }
}

void fsdp_cpu_rope_forward(float *out, const float *inp, const float *cos, const float *sin,
                           int64_t B, int64_t T, int64_t H, int64_t D) {
    rotate(out, NULL, inp, NULL, cos, sin, 1.0f, B, T, H, 0, D);
}

/* A rotation's transpose is the rotation by the opposite angle. */
void fsdp_cpu_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin,
                            int64_t B, int64_t T, int64_t H, int64_t D) {
    rotate(dinp, NULL, dout, NULL, cos, sin, -1.0f, B, T, H, 0, D);
}

void fsdp_cpu_rope_qk_forward(float *qo, float *ko, const float *q, const float *k,
                              const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                              int64_t NKV, int64_t D) {
    rotate(qo, ko, q, k, cos, sin, 1.0f, B, T, NH, NKV, D);
}

void fsdp_cpu_rope_qk_backward(float *dq, float *dk, const float *dqo, const float *dko,
                               const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                               int64_t NKV, int64_t D) {
    rotate(dq, dk, dqo, dko, cos, sin, -1.0f, B, T, NH, NKV, D);
}

static float widen(fsdp_bf16 x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* rotate_heads by +angle from bf16 x: the same f32 operations on the widened values */
static void rotate_heads_bf16(float *y, const fsdp_bf16 *x, const float *c, const float *s,
                              int64_t H, int64_t D) {
    int64_t h = D / 2;
    for (int64_t hd = 0; hd < H; hd++, x += D, y += D) {
        for (int64_t i = 0; i < h; i++) {
            float x1 = widen(x[i]), x2 = widen(x[i + h]), si = s[i];
            y[i] = x1 * c[i] - x2 * si;
            y[i + h] = x2 * c[i] + x1 * si;
        }
    }
}

void fsdp_cpu_rope_qk_forward_bf16(float *qo, float *ko, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                   const float *cos, const float *sin, int64_t B, int64_t T,
                                   int64_t NH, int64_t NKV, int64_t D) {
    int64_t h = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *c = cos + t * h, *s = sin + t * h; // (h)
            int64_t row = b * T + t;
            rotate_heads_bf16(qo + row * NH * D, q + row * NH * D, c, s, NH, D);
            rotate_heads_bf16(ko + row * NKV * D, k + row * NKV * D, c, s, NKV, D);
        }
    }
}

/* rotate_heads by -angle with y rounded to bf16: the same f32 operations on blocks of each
 * head's two halves, rounded by the table's conversion (nothing allocated) */
enum { HALF_BLOCK = 256 };

static void unrotate_heads_round(fsdp_bf16 *y, const float *x, const float *c, const float *s,
                                 int64_t H, int64_t D) {
    int64_t h = D / 2;
    float y1[HALF_BLOCK], y2[HALF_BLOCK];
    for (int64_t hd = 0; hd < H; hd++, x += D, y += D) {
        for (int64_t i0 = 0; i0 < h; i0 += HALF_BLOCK) {
            int64_t m = h - i0 < HALF_BLOCK ? h - i0 : HALF_BLOCK;
            for (int64_t j = 0; j < m; j++) {
                int64_t i = i0 + j;
                float x1 = x[i], x2 = x[i + h], si = -1.0f * s[i];
                y1[j] = x1 * c[i] - x2 * si;
                y2[j] = x2 * c[i] + x1 * si;
            }
            fsdp_cpu_f32_to_bf16(y + i0, y1, m);
            fsdp_cpu_f32_to_bf16(y + i0 + h, y2, m);
        }
    }
}

void fsdp_cpu_rope_qk_backward_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const float *dqo,
                                     const float *dko, const float *cos, const float *sin,
                                     int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    int64_t h = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *c = cos + t * h, *s = sin + t * h; // (h)
            int64_t row = b * T + t;
            unrotate_heads_round(dq + row * NH * D, dqo + row * NH * D, c, s, NH, D);
            unrotate_heads_round(dk + row * NKV * D, dko + row * NKV * D, c, s, NKV, D);
        }
    }
}

/* rotate_heads from bf16 x into bf16 y (y may be x), by +angle (sign 1) or -angle (sign -1):
 * the same f32 operations on the widened values, in blocks of each head's two halves, rounded
 * by the table's conversion (nothing allocated) */
static void rotate_heads_b16(fsdp_bf16 *y, const fsdp_bf16 *x, const float *c, const float *s,
                             float sign, int64_t H, int64_t D) {
    int64_t h = D / 2;
    float y1[HALF_BLOCK], y2[HALF_BLOCK];
    for (int64_t hd = 0; hd < H; hd++, x += D, y += D) {
        for (int64_t i0 = 0; i0 < h; i0 += HALF_BLOCK) {
            int64_t m = h - i0 < HALF_BLOCK ? h - i0 : HALF_BLOCK;
            for (int64_t j = 0; j < m; j++) {
                int64_t i = i0 + j;
                float x1 = widen(x[i]), x2 = widen(x[i + h]), si = sign * s[i];
                y1[j] = x1 * c[i] - x2 * si;
                y2[j] = x2 * c[i] + x1 * si;
            }
            fsdp_cpu_f32_to_bf16(y + i0, y1, m);
            fsdp_cpu_f32_to_bf16(y + i0 + h, y2, m);
        }
    }
}

static void rotate_b16(fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q, const fsdp_bf16 *k,
                       const float *cos, const float *sin, float sign, int64_t B, int64_t T,
                       int64_t NH, int64_t NKV, int64_t D) {
    int64_t h = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *c = cos + t * h, *s = sin + t * h; // (h)
            int64_t row = b * T + t;
            rotate_heads_b16(qo + row * NH * D, q + row * NH * D, c, s, sign, NH, D);
            rotate_heads_b16(ko + row * NKV * D, k + row * NKV * D, c, s, sign, NKV, D);
        }
    }
}

void fsdp_cpu_rope_qk_forward_bf16_round(fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q,
                                         const fsdp_bf16 *k, const float *cos, const float *sin,
                                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    rotate_b16(qo, ko, q, k, cos, sin, 1.0f, B, T, NH, NKV, D);
}

void fsdp_cpu_rope_qk_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const fsdp_bf16 *dqo,
                                          const fsdp_bf16 *dko, const float *cos, const float *sin,
                                          int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                          int64_t D) {
    rotate_b16(dq, dk, dqo, dko, cos, sin, -1.0f, B, T, NH, NKV, D);
}
