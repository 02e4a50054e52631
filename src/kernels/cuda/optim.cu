/* optim.cu: the fused SGD and Adam/AdamW steps on the device, one kernel per shard, float4
 * loads when every array is 16-byte aligned. Each element takes the CPU loop's IEEE f32
 * operations in its order (kernels/cpu/optim.c), spelled as _rn intrinsics so that no
 * compiler flag can contract or approximate them: the bits equal the CPU's. Adam can also
 * write the updated parameters rounded to bf16 in the same pass (adam_update_bf16). The
 * multi-tensor forms (adam_update_multi, fill_multi) take a chunk of tensors per launch. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dtype.cuh"

__device__ inline void sgd_element(float &p, float g, float *buf, const fsdp_sgd_step_args &a) {
    float d = __fadd_rn(__fmul_rn(a.sign, g), __fmul_rn(a.weight_decay, p));
    if (buf) {
        float b = a.first ? d : __fadd_rn(__fmul_rn(*buf, a.momentum), __fmul_rn(a.keep, d));
        *buf = b;
        d = a.nesterov ? __fadd_rn(d, __fmul_rn(a.momentum, b)) : b;
    }
    p = __fadd_rn(p, __fmul_rn(a.neg_lr, d));
}

__device__ inline void adam_element(float &p, float g, float &m, float &v, float *vmax,
                                    const fsdp_adam_step_args &a) {
    float gi = __fadd_rn(__fmul_rn(a.sign, g), __fmul_rn(a.l2, p));
    float pi = __fmul_rn(p, a.shrink);
    m = __fadd_rn(m, __fmul_rn(a.w1, __fsub_rn(gi, m)));
    v = __fadd_rn(__fmul_rn(v, a.beta2), __fmul_rn(__fmul_rn(a.w2, gi), gi));
    float vv = v;
    if (vmax) vv = *vmax = fmaxf(*vmax, v);
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv), a.bc2_sqrt), a.eps);
    p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(a.neg_step_size, m), denom));
}

__global__ void sgd_kernel(float *p, const float *g, float *buf, int64_t n, bool vec,
                           fsdp_sgd_step_args a) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            float4 pv = reinterpret_cast<float4 *>(p)[j];
            float4 gv = reinterpret_cast<const float4 *>(g)[j];
            float4 bv = buf ? reinterpret_cast<float4 *>(buf)[j] : make_float4(0, 0, 0, 0);
            float *b = buf ? &bv.x : nullptr;
            sgd_element(pv.x, gv.x, b, a);
            sgd_element(pv.y, gv.y, b ? b + 1 : b, a);
            sgd_element(pv.z, gv.z, b ? b + 2 : b, a);
            sgd_element(pv.w, gv.w, b ? b + 3 : b, a);
            reinterpret_cast<float4 *>(p)[j] = pv;
            if (buf) reinterpret_cast<float4 *>(buf)[j] = bv;
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) sgd_element(p[j], g[j], buf ? buf + j : buf, a);
}

/* LP: also lp[j] = p[j] rounded to bf16 (a template argument, so plain Adam has no test). */
template <bool LP>
__global__ void adam_kernel(float *p, uint16_t *lp, const float *g, float *m, float *v, float *vmax,
                            int64_t n, bool vec, fsdp_adam_step_args a) {
    int64_t i = fsdp_tid(), stride = fsdp_stride(), done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            float4 pv = reinterpret_cast<float4 *>(p)[j];
            float4 gv = reinterpret_cast<const float4 *>(g)[j];
            float4 mv = reinterpret_cast<float4 *>(m)[j];
            float4 vv = reinterpret_cast<float4 *>(v)[j];
            float4 xv = vmax ? reinterpret_cast<float4 *>(vmax)[j] : make_float4(0, 0, 0, 0);
            float *x = vmax ? &xv.x : nullptr;
            adam_element(pv.x, gv.x, mv.x, vv.x, x, a);
            adam_element(pv.y, gv.y, mv.y, vv.y, x ? x + 1 : x, a);
            adam_element(pv.z, gv.z, mv.z, vv.z, x ? x + 2 : x, a);
            adam_element(pv.w, gv.w, mv.w, vv.w, x ? x + 3 : x, a);
            reinterpret_cast<float4 *>(p)[j] = pv;
            reinterpret_cast<float4 *>(m)[j] = mv;
            reinterpret_cast<float4 *>(v)[j] = vv;
            if (vmax) reinterpret_cast<float4 *>(vmax)[j] = xv;
            if (LP) {
                lp[4 * j] = bf16_from_bits(__float_as_uint(pv.x));
                lp[4 * j + 1] = bf16_from_bits(__float_as_uint(pv.y));
                lp[4 * j + 2] = bf16_from_bits(__float_as_uint(pv.z));
                lp[4 * j + 3] = bf16_from_bits(__float_as_uint(pv.w));
            }
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) {
        adam_element(p[j], g[j], m[j], v[j], vmax ? vmax + j : vmax, a);
        if (LP) lp[j] = bf16_from_bits(__float_as_uint(p[j]));
    }
}

extern "C" void fsdp_cuda_sgd_update(float *p, const float *g, float *buf, int64_t n,
                                     const fsdp_sgd_step_args *a) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(p) && FSDP_CUDA_ALIGNED16(g) && FSDP_CUDA_ALIGNED16(buf);
    sgd_kernel<<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        p, g, buf, n, vec, *a);
    FSDP_CUDA_LAUNCHED("sgd_update");
}

extern "C" void fsdp_cuda_adam_update(float *p, const float *g, float *m, float *v, float *vmax,
                                      int64_t n, const fsdp_adam_step_args *a) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(p) && FSDP_CUDA_ALIGNED16(g) && FSDP_CUDA_ALIGNED16(m) &&
               FSDP_CUDA_ALIGNED16(v) && FSDP_CUDA_ALIGNED16(vmax);
    adam_kernel<false><<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        p, nullptr, g, m, v, vmax, n, vec, *a);
    FSDP_CUDA_LAUNCHED("adam_update");
}

extern "C" void fsdp_cuda_adam_update_bf16(float *p, uint16_t *p_bf16, const float *g, float *m,
                                           float *v, float *vmax, int64_t n,
                                           const fsdp_adam_step_args *a) {
    if (n <= 0) return;
    bool vec = FSDP_CUDA_ALIGNED16(p) && FSDP_CUDA_ALIGNED16(g) && FSDP_CUDA_ALIGNED16(m) &&
               FSDP_CUDA_ALIGNED16(v) && FSDP_CUDA_ALIGNED16(vmax);
    adam_kernel<true><<<fsdp_grid(vec ? n / 4 : n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        p, p_bf16, g, m, v, vmax, n, vec, *a);
    FSDP_CUDA_LAUNCHED("adam_update_bf16");
}

/* ---- multi-tensor forms: one launch per chunk of tensors (kernels.h FSDP_*_MULTI_CHUNK) ----
 * The chunk travels by value in the kernel's parameters, as PyTorch's multi_tensor_apply passes
 * its list: 4 KiB of parameters is the limit on every architecture and CUDA version we build
 * for (CUDA 12.1 raised it to 32 KiB on Volta and later only). Tensor k owns the blocks
 * [first_block[k], first_block[k + 1]), at most MULTI_MAX_BLOCKS, which stride over its
 * elements; the block finds its tensor by a binary search of the prefix. Tensors without
 * elements are left out of the chunk. Each element runs adam_element (the per-tensor kernels'
 * function), so the bits are adam_update's. */
#define MULTI_MAX_BLOCKS  4096 /* per tensor: enough to fill the device for one large tensor */
#define MULTI_PARAM_LIMIT 4096

struct adam_multi_chunk {
    fsdp_adam_step_args a;
    int count;
    int first_block[FSDP_ADAM_MULTI_CHUNK + 1];
    fsdp_adam_tensor t[FSDP_ADAM_MULTI_CHUNK];
};
static_assert(sizeof(adam_multi_chunk) <= MULTI_PARAM_LIMIT, "adam_multi_chunk exceeds 4 KiB");

struct fill_multi_chunk {
    float value;
    int count;
    int first_block[FSDP_FILL_MULTI_CHUNK + 1];
    float *out[FSDP_FILL_MULTI_CHUNK];
    int64_t n[FSDP_FILL_MULTI_CHUNK];
};
static_assert(sizeof(fill_multi_chunk) <= MULTI_PARAM_LIMIT, "fill_multi_chunk exceeds 4 KiB");

/* The tensor k whose blocks hold block b: the last with first_block[k] <= b. */
__device__ inline int multi_tensor_of(const int *first_block, int count, int b) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first_block[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__global__ void adam_multi_kernel(adam_multi_chunk c) {
    int b = (int)blockIdx.x, k = multi_tensor_of(c.first_block, c.count, b);
    float *p = c.t[k].p, *m = c.t[k].m, *v = c.t[k].v, *vmax = c.t[k].vmax;
    const float *g = c.t[k].g;
    uint16_t *lp = c.t[k].p_bf16;
    int64_t n = c.t[k].n, blocks = c.first_block[k + 1] - c.first_block[k];
    int64_t stride = blocks * blockDim.x;
    for (int64_t j = (int64_t)(b - c.first_block[k]) * blockDim.x + threadIdx.x; j < n;
         j += stride) {
        adam_element(p[j], g[j], m[j], v[j], vmax ? vmax + j : vmax, c.a);
        if (lp) lp[j] = bf16_from_bits(__float_as_uint(p[j]));
    }
}

__global__ void fill_multi_kernel(fill_multi_chunk c) {
    int b = (int)blockIdx.x, k = multi_tensor_of(c.first_block, c.count, b);
    float *out = c.out[k];
    int64_t n = c.n[k], blocks = c.first_block[k + 1] - c.first_block[k];
    int64_t stride = blocks * blockDim.x;
    for (int64_t j = (int64_t)(b - c.first_block[k]) * blockDim.x + threadIdx.x; j < n; j += stride)
        out[j] = c.value;
}

/* The blocks of a tensor of n > 0 elements. */
static int multi_blocks(int64_t n) {
    int64_t b = (n + FSDP_CUDA_THREADS - 1) / FSDP_CUDA_THREADS;
    return (int)(b < MULTI_MAX_BLOCKS ? b : MULTI_MAX_BLOCKS);
}

extern "C" void fsdp_cuda_adam_update_multi(const fsdp_adam_tensor *t, int count,
                                            const fsdp_adam_step_args *a) {
    for (int start = 0; start < count; start += FSDP_ADAM_MULTI_CHUNK) {
        adam_multi_chunk c;
        c.a = *a;
        c.count = 0;
        c.first_block[0] = 0;
        for (int i = start; i < count && i < start + FSDP_ADAM_MULTI_CHUNK; i++) {
            if (t[i].n <= 0) continue;
            c.t[c.count] = t[i];
            c.first_block[c.count + 1] = c.first_block[c.count] + multi_blocks(t[i].n);
            c.count++;
        }
        if (c.count == 0) continue;
        adam_multi_kernel<<<c.first_block[c.count], FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(c);
        FSDP_CUDA_LAUNCHED("adam_update_multi");
    }
}

extern "C" void fsdp_cuda_fill_multi(float *const *out, const int64_t *n, int count, float value) {
    for (int start = 0; start < count; start += FSDP_FILL_MULTI_CHUNK) {
        fill_multi_chunk c;
        c.value = value;
        c.count = 0;
        c.first_block[0] = 0;
        for (int i = start; i < count && i < start + FSDP_FILL_MULTI_CHUNK; i++) {
            if (n[i] <= 0) continue;
            c.out[c.count] = out[i];
            c.n[c.count] = n[i];
            c.first_block[c.count + 1] = c.first_block[c.count] + multi_blocks(n[i]);
            c.count++;
        }
        if (c.count == 0) continue;
        fill_multi_kernel<<<c.first_block[c.count], FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(c);
        FSDP_CUDA_LAUNCHED("fill_multi");
    }
}
