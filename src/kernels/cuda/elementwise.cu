/* elementwise.cu: add, add3 (its inputs rounded to bf16 or not), add_bf16 (a bf16 second input
 * widened), axpy, scale, copy and fill over n floats on the device (float4 when aligned), and the
 * 2- or 4-byte fill behind the storage interface. out may be an input. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dtype.cuh"

struct add_op {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct axpy_op {
    float alpha;
    __device__ float operator()(float y, float x) const { return y + alpha * x; }
};
struct scale_op {
    float alpha;
    __device__ float operator()(float x) const { return alpha * x; }
};

extern "C" void fsdp_cuda_add(float *out, const float *a, const float *b, int64_t n) {
    fsdp_map2("add", out, a, b, n, add_op{});
}

/* x, or x rounded to bf16 and widened (round_bf16's bits: dtype.cuh's rule) */
template <bool ROUND> __device__ inline float add3_in(float x) {
    if (!ROUND) return x;
    return __uint_as_float((uint32_t)bf16_from_bits(__float_as_uint(x)) << 16);
}

/* out[i] = (a[i] + b[i]) + c[i], each input rounded to bf16 first when ROUND (c may be NULL: a
 * + b); out may be an input. Separate adds (__fadd_rn), as add's two passes compute them. */
template <bool ROUND>
__global__ void add3_kernel(float *out, const float *a, const float *b, const float *c, int64_t n,
                            bool vec) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            float4 x = reinterpret_cast<const float4 *>(a)[j];
            float4 y = reinterpret_cast<const float4 *>(b)[j];
            float4 z = c ? reinterpret_cast<const float4 *>(c)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 r;
            r.x = __fadd_rn(add3_in<ROUND>(x.x), add3_in<ROUND>(y.x));
            r.y = __fadd_rn(add3_in<ROUND>(x.y), add3_in<ROUND>(y.y));
            r.z = __fadd_rn(add3_in<ROUND>(x.z), add3_in<ROUND>(y.z));
            r.w = __fadd_rn(add3_in<ROUND>(x.w), add3_in<ROUND>(y.w));
            if (c) {
                r.x = __fadd_rn(r.x, add3_in<ROUND>(z.x));
                r.y = __fadd_rn(r.y, add3_in<ROUND>(z.y));
                r.z = __fadd_rn(r.z, add3_in<ROUND>(z.z));
                r.w = __fadd_rn(r.w, add3_in<ROUND>(z.w));
            }
            reinterpret_cast<float4 *>(out)[j] = r;
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) {
        float r = __fadd_rn(add3_in<ROUND>(a[j]), add3_in<ROUND>(b[j]));
        out[j] = c ? __fadd_rn(r, add3_in<ROUND>(c[j])) : r;
    }
}

template <bool ROUND>
static void add3(const char *name, float *out, const float *a, const float *b, const float *c,
                 int64_t n) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(out) && FSDP_CUDA_ALIGNED16(a) && FSDP_CUDA_ALIGNED16(b) &&
               (!c || FSDP_CUDA_ALIGNED16(c));
    add3_kernel<ROUND><<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, a, b, c, n, vec);
    FSDP_CUDA_LAUNCHED(name);
}

extern "C" void fsdp_cuda_add3(float *out, const float *a, const float *b, const float *c,
                               int64_t n) {
    add3<false>("add3", out, a, b, c, n);
}

extern "C" void fsdp_cuda_add3_round_bf16(float *out, const float *a, const float *b,
                                          const float *c, int64_t n) {
    add3<true>("add3_round_bf16", out, a, b, c, n);
}

/* out[i] = a[i] + widen(b[i]) (b bf16: its bits the top half of an f32, exact); out may be a.
 * Vectorised by 4 (a float4 and 8 bytes of b) when out and a are 16-byte aligned and b 8-byte. */
__global__ void add_bf16_kernel(float *out, const float *a, const uint16_t *b, int64_t n,
                                bool vec) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            float4 x = reinterpret_cast<const float4 *>(a)[j];
            uint2 y = reinterpret_cast<const uint2 *>(b)[j];
            float4 r;
            r.x = __fadd_rn(x.x, __uint_as_float(y.x << 16));
            r.y = __fadd_rn(x.y, __uint_as_float(y.x & 0xffff0000u));
            r.z = __fadd_rn(x.z, __uint_as_float(y.y << 16));
            r.w = __fadd_rn(x.w, __uint_as_float(y.y & 0xffff0000u));
            reinterpret_cast<float4 *>(out)[j] = r;
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride)
        out[j] = __fadd_rn(a[j], __uint_as_float((uint32_t)b[j] << 16));
}

extern "C" void fsdp_cuda_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(out) && FSDP_CUDA_ALIGNED16(a) && ((uintptr_t)b % 8) == 0;
    add_bf16_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, a, reinterpret_cast<const uint16_t *>(b), n, vec);
    FSDP_CUDA_LAUNCHED("add_bf16");
}

extern "C" void fsdp_cuda_axpy(float *y, float alpha, const float *x, int64_t n) {
    fsdp_map2("axpy", y, y, x, n, axpy_op{alpha});
}

extern "C" void fsdp_cuda_scale(float *out, const float *inp, float alpha, int64_t n) {
    fsdp_map1("scale", out, inp, n, scale_op{alpha});
}

extern "C" void fsdp_cuda_copy(float *dst, const float *src, int64_t n) {
    if (n <= 0 || dst == src) return;
    FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                    fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
}

/* out[i] = value: stores only (a map over out would load it first, and out may be memory no
 * one has written: a fresh block of the caching allocator) */
__global__ void fill_kernel(float *out, float value, int64_t n, bool vec) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride)
            reinterpret_cast<float4 *>(out)[j] = make_float4(value, value, value, value);
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) out[j] = value;
}

extern "C" void fsdp_cuda_fill(float *out, float value, int64_t n) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(out);
    fill_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, value, n, vec);
    FSDP_CUDA_LAUNCHED("fill");
}

template <class T> __global__ void fill_bits_kernel(T *dst, T bits, int64_t n) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) dst[i] = bits;
}

extern "C" cudaError_t fsdp_cuda_fill_bits(void *dst, uint32_t bits, size_t elem_size, int64_t n) {
    if (n <= 0) return cudaSuccess;
    if (elem_size == 4)
        fill_bits_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            (uint32_t *)dst, bits, n);
    else
        fill_bits_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            (uint16_t *)dst, (uint16_t)bits, n);
    return cudaGetLastError();
}
