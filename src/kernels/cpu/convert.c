/* convert.c: f32 <-> bf16 and f32 <-> f16 on the CPU, add3 of inputs rounded to bf16 and an add
 * of a widened bf16 array. bf16
 * is the top 16 bits of an f32; narrowing rounds to nearest even and keeps NaN a (quiet) NaN, the
 * same rule as fsdp_bf16_from_f32. f16 uses core's rule (fsdp_f16_from_f32: subnormals, overflow
 * to inf). */
#include <string.h>

#include "kernels/cpu/cpu.h"

/* The bf16 bits of the f32 x: rounded to nearest even, a NaN kept a (quiet) NaN. */
static inline uint32_t bf16_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    uint32_t nan = (bits >> 16) | 0x40u;
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
}

void fsdp_cpu_f32_to_bf16(fsdp_bf16 *restrict dst, const float *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = (fsdp_bf16)bf16_bits(src[i]);
}

/* The narrowing above then the widening, in one pass. */
void fsdp_cpu_round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = bf16_bits(x[i]) << 16;
        memcpy(&x[i], &bits, sizeof bits);
    }
}

/* x rounded to a bf16 value, widened back */
static inline float round_bf16(float x) {
    uint32_t bits = bf16_bits(x) << 16;
    float r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

void fsdp_cpu_add3_round_bf16(float *out, const float *a, const float *b, const float *c,
                              int64_t n) {
    if (!c) {
        for (int64_t i = 0; i < n; i++) out[i] = round_bf16(a[i]) + round_bf16(b[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = (round_bf16(a[i]) + round_bf16(b[i])) + round_bf16(c[i]);
}

void fsdp_cpu_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)b[i] << 16;
        float w;
        memcpy(&w, &bits, sizeof w);
        out[i] = a[i] + w;
    }
}

void fsdp_cpu_bf16_to_f32(float *restrict dst, const fsdp_bf16 *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &bits, sizeof bits);
    }
}

void fsdp_cpu_f32_to_f16(fsdp_f16 *restrict dst, const float *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = fsdp_f16_from_f32(src[i]);
}

void fsdp_cpu_f16_to_f32(float *restrict dst, const fsdp_f16 *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = fsdp_f16_to_f32(src[i]);
}
