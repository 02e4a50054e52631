/* common.cuh: what the .cu files share: launch sizes, block-wide sums in double and maxima,
 * and elementwise map kernels (float4 loads when every array is 16-byte aligned). */
#ifndef FSDP_KERNELS_CUDA_COMMON_CUH
#define FSDP_KERNELS_CUDA_COMMON_CUH

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/dtype.cuh" // defines: bf16_from_bits

/* Blocks of FSDP_CUDA_THREADS for `work` items, each thread striding over the rest. */
static inline unsigned fsdp_grid(int64_t work) {
    int64_t b = (work + FSDP_CUDA_THREADS - 1) / FSDP_CUDA_THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b < FSDP_CUDA_MAX_BLOCKS ? b : FSDP_CUDA_MAX_BLOCKS);
}

/* One block per row (or run) for `rows` of them, at most 65535 blocks, each striding over the
 * rest: the row-wise kernels' grid (RMSNorm, loss parallel's rows, the embedding's runs). */
#define FSDP_CUDA_ROW_BLOCKS 65535
static inline unsigned fsdp_row_blocks(int64_t rows) {
    return (unsigned)(rows < FSDP_CUDA_ROW_BLOCKS ? (rows > 0 ? rows : 1) : FSDP_CUDA_ROW_BLOCKS);
}

__device__ inline int64_t fsdp_tid() {
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ inline int64_t fsdp_stride() {
    return (int64_t)gridDim.x * blockDim.x;
}

/* The sum of v over the block (blockDim.x a multiple of 32, at most 1024), in a fixed order;
 * valid in thread 0. */
__device__ inline double fsdp_block_sum(double v) {
    __shared__ double warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads(); // warp_sums may still be read by a previous call
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = 0.0;
    if (warp == 0) {
        int nw = (int)blockDim.x / 32;
        v = lane < nw ? warp_sums[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    }
    return v;
}

/* The sum of v over the block, in every thread. */
__device__ inline double fsdp_block_sum_all(double v) {
    __shared__ double total;
    v = fsdp_block_sum(v);
    if (threadIdx.x == 0) total = v;
    __syncthreads();
    return total;
}

/* The max of v over the block, in every thread (as x > m ? x : m). */
__device__ inline float fsdp_block_max_all(float v) {
    __shared__ float warp_max[32];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_down_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) warp_max[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int nw = (int)blockDim.x / 32;
        v = warp_max[lane < nw ? lane : 0];
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_down_sync(0xffffffffu, v, o);
            v = w > v ? w : v;
        }
        if (lane == 0) total = v;
    }
    __syncthreads();
    return total;
}

/* out[i] = f(a[i]) for i < n; out may be a. */
template <class F>
__global__ void fsdp_map1_kernel(float *out, const float *a, int64_t n, bool vec, F f) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            float4 x = reinterpret_cast<const float4 *>(a)[j];
            reinterpret_cast<float4 *>(out)[j] = make_float4(f(x.x), f(x.y), f(x.z), f(x.w));
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) out[j] = f(a[j]);
}

/* out[i] = f(a[i], b[i]) for i < n; out may be a or b. */
template <class F>
__global__ void fsdp_map2_kernel(float *out, const float *a, const float *b, int64_t n, bool vec,
                                 F f) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            float4 x = reinterpret_cast<const float4 *>(a)[j];
            float4 y = reinterpret_cast<const float4 *>(b)[j];
            reinterpret_cast<float4 *>(out)[j] =
                make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w));
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) out[j] = f(a[j], b[j]);
}

template <class F> void fsdp_map1(const char *name, float *out, const float *a, int64_t n, F f) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(out) && FSDP_CUDA_ALIGNED16(a);
    fsdp_map1_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, a, n, vec, f);
    FSDP_CUDA_LAUNCHED(name);
}

template <class F>
void fsdp_map2(const char *name, float *out, const float *a, const float *b, int64_t n, F f) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(out) && FSDP_CUDA_ALIGNED16(a) && FSDP_CUDA_ALIGNED16(b);
    fsdp_map2_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, a, b, n, vec, f);
    FSDP_CUDA_LAUNCHED(name);
}

/* A logit read as f32: an f32 one as is, a bf16 one (fsdp_bf16, its bits) widened exactly. */
__device__ inline float fsdp_ce_load(const float *x, int64_t c) {
    return x[c];
}
__device__ inline float fsdp_ce_load(const fsdp_bf16 *x, int64_t c) {
    return __uint_as_float((uint32_t)x[c] << 16);
}
/* A gradient element stored: f32 as is, bf16 rounded to nearest even (bf16_from_bits: the CPU's
 * f32_to_bf16 bits). */
__device__ inline void fsdp_ce_store(float *d, int64_t c, float v) {
    d[c] = v;
}
__device__ inline void fsdp_ce_store(fsdp_bf16 *d, int64_t c, float v) {
    d[c] = bf16_from_bits(__float_as_uint(v));
}

/* One cross-entropy row for the whole block: returns lse(x) - x[t] and, when d is not NULL,
 * writes d = (softmax(x) - onehot(t)) / n. x is f32 or bf16 (widened), d f32 or bf16 (each
 * value rounded from the f32 one): the same f32 and double operations either way. Every read of
 * x is done before the block sums (which synchronize), so d may be x (of one width); the
 * trailing barrier orders the row's writes before the next row's shared sums. t must be in
 * [0, classes). */
template <class In, class Out>
__device__ inline double fsdp_cross_entropy_row(Out *d, const In *x, int32_t t, int64_t classes,
                                                double n) {
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
        float v = fsdp_ce_load(x, c);
        m = v > m ? v : m;
    }
    m = fsdp_block_max_all(m);
    double xt = (double)fsdp_ce_load(x, t), se = 0.0;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
        se += exp((double)fsdp_ce_load(x, c) - (double)m);
    se = fsdp_block_sum_all(se);
    double lse = (double)m + log(se);
    if (d) {
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
            fsdp_ce_store(d, c,
                          c == t ? (float)((exp(xt - lse) - 1.0) / n)
                                 : (float)(exp((double)fsdp_ce_load(x, c) - lse) / n));
        __syncthreads();
    }
    return lse - xt;
}

/* Two-pass reductions: each block writes its partial sum to scratch[blockIdx.x] (at most
 * FSDP_CUDA_PARTIALS blocks), then one block adds them into scratch[FSDP_CUDA_PARTIALS]; the
 * scratch slots after that are free for the caller's flags. */
#define FSDP_CUDA_PARTIALS 1024

/* The blocks a partial-sum pass over `work` items launches. */
static inline unsigned fsdp_partial_blocks(int64_t work) {
    unsigned b = fsdp_grid(work);
    return b < FSDP_CUDA_PARTIALS ? b : FSDP_CUDA_PARTIALS;
}

/* out[0] = sum of partial[0 .. count), in a fixed order (one block). */
static __global__ void fsdp_sum_partials_kernel(double *out, const double *partial, int count) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = fsdp_block_sum(acc);
    if (threadIdx.x == 0) out[0] = acc;
}

#endif
