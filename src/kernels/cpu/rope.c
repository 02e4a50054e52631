/* rope.c: rotary position embedding on the CPU in Hugging Face Llama's rotate_half layout (the
 * two halves of each head rotate together, not interleaved pairs), and its transpose. */
#include "kernels/cpu/llama.h"

/* x (B, T, H, D) rotated by +angle (sign 1) or -angle (sign -1); cos, sin (T, D / 2). */
static void rotate(float *out, const float *inp, const float *cos, const float *sin, float sign,
                   int64_t B, int64_t T, int64_t H, int64_t D) {
    int64_t h = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *c = cos + t * h, *s = sin + t * h; // (h)
            for (int64_t hd = 0; hd < H; hd++) {
                int64_t off = ((b * T + t) * H + hd) * D;
                const float *x = inp + off; // (D)
                float *y = out + off;       // (D)
                for (int64_t i = 0; i < h; i++) {
                    float x1 = x[i], x2 = x[i + h], si = sign * s[i];
                    y[i] = x1 * c[i] - x2 * si;
                    y[i + h] = x2 * c[i] + x1 * si;
                }
            }
        }
    }
}

void fsdp_cpu_rope_forward(float *out, const float *inp, const float *cos, const float *sin,
                           int64_t B, int64_t T, int64_t H, int64_t D) {
    rotate(out, inp, cos, sin, 1.0f, B, T, H, D);
}

/* A rotation's transpose is the rotation by the opposite angle. */
void fsdp_cpu_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin,
                            int64_t B, int64_t T, int64_t H, int64_t D) {
    rotate(dinp, dout, cos, sin, -1.0f, B, T, H, D);
}
