/* dtype.cuh: the CPU's bf16 and f16 rounding rules on the bits (kernels/cpu/convert.c, core's
 * fsdp_f16_from_f32), for the .cu files that widen or round: convert.cu, reduce_n.cu. */
#ifndef FSDP_KERNELS_CUDA_DTYPE_CUH
#define FSDP_KERNELS_CUDA_DTYPE_CUH

#include <stdint.h>

/* round to nearest even; NaN stays a quiet NaN */
__device__ inline uint16_t bf16_from_bits(uint32_t bits) {
    uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    uint32_t nan = (bits >> 16) | 0x40u;
    return (uint16_t)((bits & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

/* fsdp_f16_from_f32's rule (src/core/dtype.c), on the bits */
__device__ inline uint16_t f16_from_bits(uint32_t bits) {
    uint32_t sign = (bits >> 16) & 0x8000u, a = bits & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a <= 0x33000000u) return (uint16_t)sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, s = 126u - e;
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

__device__ inline float f16_to_float(uint16_t x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
    return __uint_as_float(__float_as_uint((float)m * 0x1p-24f) | sign);
}

#endif
