/* optim.cu: the fused SGD and Adam/AdamW steps on the device, one kernel per shard, float4
 * loads when every array is 16-byte aligned. Each element takes the CPU loop's IEEE f32
 * operations in its order (kernels/cpu/optim.c), spelled as _rn intrinsics so that no
 * compiler flag can contract or approximate them: the bits equal the CPU's. Adam can also
 * write the updated parameters rounded to bf16 in the same pass (adam_update_bf16). */
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
