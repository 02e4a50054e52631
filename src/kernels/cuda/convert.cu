/* convert.cu: f32 <-> bf16 and f32 <-> f16 on the device with the CPU's integer rules
 * (kernels/cpu/convert.c, core's fsdp_f16_from_f32): round to nearest even, NaN stays a quiet
 * NaN, f16 subnormals and overflow to inf, so the bits equal the CPU's. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dtype.cuh"

/* vec: src 16-byte and dst 8-byte aligned, four elements a thread */
__global__ void f32_to_bf16_kernel(uint16_t *dst, const float *src, int64_t n, bool vec) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            uint4 b = reinterpret_cast<const uint4 *>(src)[j];
            ushort4 h = make_ushort4(bf16_from_bits(b.x), bf16_from_bits(b.y), bf16_from_bits(b.z),
                                     bf16_from_bits(b.w));
            reinterpret_cast<ushort4 *>(dst)[j] = h;
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) dst[j] = bf16_from_bits(__float_as_uint(src[j]));
}

__global__ void bf16_to_f32_kernel(float *dst, const uint16_t *src, int64_t n, bool vec) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            ushort4 h = reinterpret_cast<const ushort4 *>(src)[j];
            reinterpret_cast<uint4 *>(dst)[j] = make_uint4(
                (uint32_t)h.x << 16, (uint32_t)h.y << 16, (uint32_t)h.z << 16, (uint32_t)h.w << 16);
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) dst[j] = __uint_as_float((uint32_t)src[j] << 16);
}

static bool aligned8(const void *p) {
    return ((uintptr_t)p & 7u) == 0;
}

extern "C" void fsdp_cuda_f32_to_bf16(fsdp_bf16 *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(src) && aligned8(dst);
    f32_to_bf16_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        (uint16_t *)dst, src, n, vec);
    FSDP_CUDA_LAUNCHED("f32_to_bf16");
}

extern "C" void fsdp_cuda_bf16_to_f32(float *dst, const fsdp_bf16 *src, int64_t n) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(dst) && aligned8(src);
    bf16_to_f32_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dst, (const uint16_t *)src, n, vec);
    FSDP_CUDA_LAUNCHED("bf16_to_f32");
}

/* x rounded to bf16 values in place; vec: 16-byte aligned, four elements a thread */
__global__ void round_bf16_kernel(float *x, int64_t n, bool vec) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            uint4 b = reinterpret_cast<const uint4 *>(x)[j];
            reinterpret_cast<uint4 *>(x)[j] = make_uint4(
                (uint32_t)bf16_from_bits(b.x) << 16, (uint32_t)bf16_from_bits(b.y) << 16,
                (uint32_t)bf16_from_bits(b.z) << 16, (uint32_t)bf16_from_bits(b.w) << 16);
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride)
        x[j] = __uint_as_float((uint32_t)bf16_from_bits(__float_as_uint(x[j])) << 16);
}

extern "C" void fsdp_cuda_round_bf16(float *x, int64_t n) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(x);
    round_bf16_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        x, n, vec);
    FSDP_CUDA_LAUNCHED("round_bf16");
}

__global__ void f32_to_f16_kernel(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t j = fsdp_tid(); j < n; j += fsdp_stride())
        dst[j] = f16_from_bits(__float_as_uint(src[j]));
}

__global__ void f16_to_f32_kernel(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t j = fsdp_tid(); j < n; j += fsdp_stride()) dst[j] = f16_to_float(src[j]);
}

extern "C" void fsdp_cuda_f32_to_f16(fsdp_f16 *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    f32_to_f16_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>((uint16_t *)dst,
                                                                                  src, n);
    FSDP_CUDA_LAUNCHED("f32_to_f16");
}

extern "C" void fsdp_cuda_f16_to_f32(float *dst, const fsdp_f16 *src, int64_t n) {
    if (n <= 0) return;
    f16_to_f32_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dst, (const uint16_t *)src, n);
    FSDP_CUDA_LAUNCHED("f16_to_f32");
}
