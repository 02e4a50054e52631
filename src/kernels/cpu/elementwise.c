/* elementwise.c: add, add3, axpy, scale, copy and fill over n floats on the CPU. out may be the
 * same array as an input (in place); otherwise arrays must not overlap. */
#include <math.h> // defines: signbit
#include <string.h>

#include "kernels/cpu/cpu.h"

void fsdp_cpu_add(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void fsdp_cpu_add3(float *out, const float *a, const float *b, const float *c, int64_t n) {
    if (!c) {
        fsdp_cpu_add(out, a, b, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = (a[i] + b[i]) + c[i];
}

void fsdp_cpu_axpy(float *y, float alpha, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

void fsdp_cpu_scale(float *out, const float *inp, float alpha, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = alpha * inp[i];
}

void fsdp_cpu_copy(float *dst, const float *src, int64_t n) {
    if (n > 0 && dst != src) memcpy(dst, src, (size_t)n * sizeof(float));
}

void fsdp_cpu_fill(float *out, float value, int64_t n) {
    if (value == 0.0f && !signbit(value)) { /* +0.0: all bits zero, and memset's stores are wider */
        if (n > 0) memset(out, 0, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = value;
}
