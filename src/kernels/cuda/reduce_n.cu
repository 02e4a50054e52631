/* reduce_n.cu: the fused reduction of n arrays (fsdp_kernels_i.reduce_n) with the CPU's
 * arithmetic (kernels/cpu/reduce_n.c): one thread per element reads the inputs in order, in[0]
 * first, and combines them left to right in f32 (built with --fmad=false, so nothing is
 * contracted); bf16 and f16 are widened exactly and the result rounded once with the CPU's
 * rule. The input pointers travel by value in the launch's arguments. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dtype.cuh"

struct reduce_n_ptrs {
    const void *in[FSDP_REDUCE_N_MAX];
};
/* kernel parameters: 4 KiB on every architecture and CUDA version the build targets */
static_assert(sizeof(reduce_n_ptrs) + sizeof(fsdp_reduce_n_args) + 64 <= 4096,
              "reduce_n's kernel parameters exceed 4 KiB");

__device__ inline float load_widened(const void *p, fsdp_dtype dtype, int64_t i) {
    if (dtype == FSDP_DTYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dtype == FSDP_DTYPE_BF16 ? __uint_as_float((uint32_t)h << 16) : f16_to_float(h);
}

/* f32 sums and averages, with the scales and accumulate (the CPU's sum_f32) */
__global__ void reduce_n_sum_kernel(float *out, reduce_n_ptrs p, int n, int64_t count,
                                    fsdp_reduce_n_args a) {
    const bool avg = a.kind == FSDP_REDUCE_KIND_AVG, pre = a.pre_scale != 1.0f,
               post = a.post_scale != 1.0f;
    for (int64_t i = fsdp_tid(); i < count; i += fsdp_stride()) {
        float x0 = ((const float *)p.in[0])[i];
        if (n == 1 && !pre && !post && !a.accumulate) { /* the CPU copies: x / 1 is x */
            out[i] = x0;
            continue;
        }
        float acc = pre ? x0 * a.pre_scale : x0;
        for (int r = 1; r < n; r++) {
            float x = ((const float *)p.in[r])[i];
            acc = acc + (pre ? x * a.pre_scale : x);
        }
        if (avg) acc = acc / (float)n;
        if (post) acc = acc * a.post_scale;
        out[i] = a.accumulate ? out[i] + acc : acc;
    }
}

/* max of any dtype, and bf16/f16 sums and averages (the CPU's reduce_widened) */
__global__ void reduce_n_widened_kernel(void *out, reduce_n_ptrs p, int n, int64_t count,
                                        fsdp_dtype dtype, bool max, bool avg) {
    for (int64_t i = fsdp_tid(); i < count; i += fsdp_stride()) {
        float acc = load_widened(p.in[0], dtype, i);
        for (int r = 1; r < n; r++) {
            float x = load_widened(p.in[r], dtype, i);
            if (max)
                acc = (acc != acc || acc >= x) ? acc : x; /* NaN wins */
            else
                acc = acc + x;
        }
        if (avg) acc = acc / (float)n;
        if (dtype == FSDP_DTYPE_F32)
            ((float *)out)[i] = acc;
        else if (dtype == FSDP_DTYPE_BF16)
            ((uint16_t *)out)[i] = bf16_from_bits(__float_as_uint(acc));
        else
            ((uint16_t *)out)[i] = f16_from_bits(__float_as_uint(acc));
    }
}

extern "C" void fsdp_cuda_reduce_n(void *out, const void *const *in, int n, int64_t count,
                                   fsdp_dtype dtype, const fsdp_reduce_n_args *args) {
    if (n <= 0 || count <= 0) return;
    if (n > FSDP_REDUCE_N_MAX) {
        fprintf(stderr, "libfsdp: the CUDA kernel reduce_n was given %d inputs (at most %d)\n", n,
                FSDP_REDUCE_N_MAX);
        abort();
    }
    reduce_n_ptrs p;
    for (int r = 0; r < n; r++) p.in[r] = in[r];
    const bool max = args->kind == FSDP_REDUCE_KIND_MAX;
    if (dtype == FSDP_DTYPE_F32 && !max) {
        reduce_n_sum_kernel<<<fsdp_grid(count), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            (float *)out, p, n, count, *args);
    } else {
        reduce_n_widened_kernel<<<fsdp_grid(count), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            out, p, n, count, dtype, max, args->kind == FSDP_REDUCE_KIND_AVG);
    }
    FSDP_CUDA_LAUNCHED("reduce_n");
}
