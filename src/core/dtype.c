/* dtype.c: element types and devices by name and size, and the f32 <-> bf16 and f32 <-> f16
 * conversions every layer shares (round to nearest even, NaN stays a quiet NaN). Calls nothing. */
#include <string.h>

#include "fsdp/tensor.h"

size_t fsdp_dtype_size(fsdp_dtype dtype) {
    switch (dtype) {
    case FSDP_DTYPE_F32:
        return 4;
    case FSDP_DTYPE_BF16:
        return 2;
    case FSDP_DTYPE_I32:
        return 4;
    case FSDP_DTYPE_F16:
        return 2;
    default:
        return 0;
    }
}

const char *fsdp_dtype_to_string(fsdp_dtype dtype) {
    switch (dtype) {
    case FSDP_DTYPE_F32:
        return "f32";
    case FSDP_DTYPE_BF16:
        return "bf16";
    case FSDP_DTYPE_I32:
        return "i32";
    case FSDP_DTYPE_F16:
        return "f16";
    default:
        return "unknown";
    }
}

const char *fsdp_device_to_string(fsdp_device device) {
    return device.type == FSDP_DEVICE_CPU    ? "cpu"
           : device.type == FSDP_DEVICE_CUDA ? "cuda"
           : device.type == FSDP_DEVICE_SIM  ? "sim"
                                             : "unknown";
}

fsdp_bf16 fsdp_bf16_from_f32(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (fsdp_bf16)((bits >> 16) | 0x40); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (fsdp_bf16)(bits >> 16);
}

float fsdp_bf16_to_f32(fsdp_bf16 x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The rule of c10's fp16_ieee_from_fp32_value (what torch's .to(float16) computes), on the bits:
 * rebias the exponent (f32 127, f16 15) and round the 23-bit mantissa to 10 bits to nearest
 * even; below 2^-14 the value is rounded to a multiple of 2^-24 (a subnormal, or zero). */
fsdp_f16 fsdp_f16_from_f32(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t sign = (bits >> 16) & 0x8000u, a = bits & 0x7fffffffu;
    if (a > 0x7f800000u) return (fsdp_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (fsdp_f16)(sign | 0x7c00u); /* >= 65520 (and inf): inf */
    if (a >= 0x38800000u) {                                  /* >= 2^-14: normal */
        uint32_t r = a - 0x38000000u;                        /* exponent - 112 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (fsdp_f16)(sign | (r >> 13));
    }
    if (a <= 0x33000000u) return (fsdp_f16)sign; /* <= 2^-25 (a tie to the even 0) */
    /* A subnormal: the 24-bit significand m times 2^(e - 150) is q units of 2^-24, q = m >> s */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, s = 126u - e; /* s in 14..24 */
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++; /* may carry into the smallest normal */
    return (fsdp_f16)(sign | q);
}

float fsdp_f16_to_f32(fsdp_f16 x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13); /* inf, or NaN with its payload */
    } else if (e) {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    } else {
        float f = (float)m * 0x1p-24f; /* zero or a subnormal: exact */
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
