/* dtype.c: element types and devices by name and size, and the f32 <-> bf16 conversions every
 * layer shares (round to nearest even, NaN stays a quiet NaN). Calls nothing. */
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
    default:
        return "unknown";
    }
}

const char *fsdp_device_to_string(fsdp_device device) {
    return device.type == FSDP_DEVICE_CPU    ? "cpu"
           : device.type == FSDP_DEVICE_CUDA ? "cuda"
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
