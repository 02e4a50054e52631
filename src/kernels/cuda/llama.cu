/* llama.cu: the Llama layers' kernels on the device, with the CPU's semantics
 * (kernels/cpu/llama.h; the embedding's are in embedding.cu). Straightforward first versions,
 * deterministic (no atomics): the plain attention (attention.cu
 * chooses it or the tiled one) runs one thread per score row, recomputing scores from q and k in
 * backward and never storing a (T, T) block (the scratch argument is unused); the key/value
 * gradients are summed per key row over the query rows and heads of its group. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/llama_cuda.h"

/* ---- rotary embedding ---- */

/* one thread per (b, t, head, i < D/2) pair; sign -1 rotates back (the backward) */
__global__ void rope_kernel(float *out, const float *inp, const float *cos, const float *sin,
                            float sign, int64_t B, int64_t T, int64_t H, int64_t D) {
    int64_t h = D / 2, pairs = B * T * H * h;
    for (int64_t e = fsdp_tid(); e < pairs; e += fsdp_stride()) {
        int64_t i = e % h, row = e / h, t = (row / H) % T;
        const float *x = inp + row * D;
        float *y = out + row * D;
        float c = cos[t * h + i], s = sign * sin[t * h + i], x1 = x[i], x2 = x[i + h];
        y[i] = x1 * c - x2 * s;
        y[i + h] = x2 * c + x1 * s;
    }
}

static void rope(const char *name, float *out, const float *inp, const float *cos, const float *sin,
                 float sign, int64_t B, int64_t T, int64_t H, int64_t D) {
    int64_t pairs = B * T * H * (D / 2);
    if (pairs <= 0) return;
    rope_kernel<<<fsdp_grid(pairs), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(out, inp, cos, sin,
                                                                                sign, B, T, H, D);
    FSDP_CUDA_LAUNCHED(name);
}

extern "C" void fsdp_cuda_rope_forward(float *out, const float *inp, const float *cos,
                                       const float *sin, int64_t B, int64_t T, int64_t H,
                                       int64_t D) {
    rope("rope_forward", out, inp, cos, sin, 1.0f, B, T, H, D);
}

extern "C" void fsdp_cuda_rope_backward(float *dinp, const float *dout, const float *cos,
                                        const float *sin, int64_t B, int64_t T, int64_t H,
                                        int64_t D) {
    rope("rope_backward", dinp, dout, cos, sin, -1.0f, B, T, H, D);
}

/* q (B, T, NH, D) into qo and k (B, T, NKV, D) into ko in one launch: element e is one pair
 * (i, i + h) of one head of one position, the heads of q first, then those of k. */
__global__ void rope_qk_kernel(float *qo, float *ko, const float *q, const float *k,
                               const float *cos, const float *sin, float sign, int64_t B, int64_t T,
                               int64_t NH, int64_t NKV, int64_t D) {
    int64_t h = D / 2, heads = NH + NKV, pairs = B * T * heads * h;
    for (int64_t e = fsdp_tid(); e < pairs; e += fsdp_stride()) {
        int64_t i = e % h, head = (e / h) % heads, row = e / (h * heads), t = row % T;
        bool is_q = head < NH;
        const float *x = is_q ? q + (row * NH + head) * D : k + (row * NKV + head - NH) * D;
        float *y = is_q ? qo + (row * NH + head) * D : ko + (row * NKV + head - NH) * D;
        float c = cos[t * h + i], s = sign * sin[t * h + i], x1 = x[i], x2 = x[i + h];
        y[i] = x1 * c - x2 * s;
        y[i + h] = x2 * c + x1 * s;
    }
}

static void rope_qk(const char *name, float *qo, float *ko, const float *q, const float *k,
                    const float *cos, const float *sin, float sign, int64_t B, int64_t T,
                    int64_t NH, int64_t NKV, int64_t D) {
    int64_t pairs = B * T * (NH + NKV) * (D / 2);
    if (pairs <= 0) return;
    rope_qk_kernel<<<fsdp_grid(pairs), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        qo, ko, q, k, cos, sin, sign, B, T, NH, NKV, D);
    FSDP_CUDA_LAUNCHED(name);
}

extern "C" void fsdp_cuda_rope_qk_forward(float *qo, float *ko, const float *q, const float *k,
                                          const float *cos, const float *sin, int64_t B, int64_t T,
                                          int64_t NH, int64_t NKV, int64_t D) {
    rope_qk("rope_qk_forward", qo, ko, q, k, cos, sin, 1.0f, B, T, NH, NKV, D);
}

/* rope_qk_kernel's forward on bf16 q and k, widened exactly: the same f32 operations */
__global__ void rope_qk_bf16_kernel(float *qo, float *ko, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                    const float *cos, const float *sin, int64_t B, int64_t T,
                                    int64_t NH, int64_t NKV, int64_t D) {
    int64_t h = D / 2, heads = NH + NKV, pairs = B * T * heads * h;
    for (int64_t e = fsdp_tid(); e < pairs; e += fsdp_stride()) {
        int64_t i = e % h, head = (e / h) % heads, row = e / (h * heads), t = row % T;
        bool is_q = head < NH;
        const fsdp_bf16 *x = is_q ? q + (row * NH + head) * D : k + (row * NKV + head - NH) * D;
        float *y = is_q ? qo + (row * NH + head) * D : ko + (row * NKV + head - NH) * D;
        float c = cos[t * h + i], s = sin[t * h + i];
        float x1 = __uint_as_float((uint32_t)x[i] << 16),
              x2 = __uint_as_float((uint32_t)x[i + h] << 16);
        y[i] = x1 * c - x2 * s;
        y[i + h] = x2 * c + x1 * s;
    }
}

extern "C" void fsdp_cuda_rope_qk_forward_bf16(float *qo, float *ko, const fsdp_bf16 *q,
                                               const fsdp_bf16 *k, const float *cos,
                                               const float *sin, int64_t B, int64_t T, int64_t NH,
                                               int64_t NKV, int64_t D) {
    int64_t pairs = B * T * (NH + NKV) * (D / 2);
    if (pairs <= 0) return;
    rope_qk_bf16_kernel<<<fsdp_grid(pairs), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        qo, ko, q, k, cos, sin, B, T, NH, NKV, D);
    FSDP_CUDA_LAUNCHED("rope_qk_forward_bf16");
}

extern "C" void fsdp_cuda_rope_qk_backward(float *dq, float *dk, const float *dqo, const float *dko,
                                           const float *cos, const float *sin, int64_t B, int64_t T,
                                           int64_t NH, int64_t NKV, int64_t D) {
    rope_qk("rope_qk_backward", dq, dk, dqo, dko, cos, sin, -1.0f, B, T, NH, NKV, D);
}

/* rope_qk_kernel's backward (rotation by -angle) with dq, dk rounded as convert.cu's
 * f32_to_bf16 rounds: what q_proj's and k_proj's bf16 GEMMs read as their output gradients */
__global__ void rope_qk_backward_round_kernel(fsdp_bf16 *dq, fsdp_bf16 *dk, const float *dqo,
                                              const float *dko, const float *cos, const float *sin,
                                              int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                              int64_t D) {
    int64_t h = D / 2, heads = NH + NKV, pairs = B * T * heads * h;
    for (int64_t e = fsdp_tid(); e < pairs; e += fsdp_stride()) {
        int64_t i = e % h, head = (e / h) % heads, row = e / (h * heads), t = row % T;
        bool is_q = head < NH;
        int64_t at = is_q ? (row * NH + head) * D : (row * NKV + head - NH) * D;
        const float *x = (is_q ? dqo : dko) + at;
        fsdp_bf16 *y = (is_q ? dq : dk) + at;
        float c = cos[t * h + i], s = -1.0f * sin[t * h + i], x1 = x[i], x2 = x[i + h];
        y[i] = bf16_from_bits(__float_as_uint(x1 * c - x2 * s));
        y[i + h] = bf16_from_bits(__float_as_uint(x2 * c + x1 * s));
    }
}

extern "C" void fsdp_cuda_rope_qk_backward_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const float *dqo,
                                                 const float *dko, const float *cos,
                                                 const float *sin, int64_t B, int64_t T, int64_t NH,
                                                 int64_t NKV, int64_t D) {
    int64_t pairs = B * T * (NH + NKV) * (D / 2);
    if (pairs <= 0) return;
    rope_qk_backward_round_kernel<<<fsdp_grid(pairs), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dq, dk, dqo, dko, cos, sin, B, T, NH, NKV, D);
    FSDP_CUDA_LAUNCHED("rope_qk_backward_round");
}

/* rope_qk_kernel from bf16 x into bf16 y (y may be x), by sign * angle: the same f32
 * operations on the widened values, each result rounded as convert.cu's f32_to_bf16 rounds */
__global__ void rope_qk_b16_kernel(fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q,
                                   const fsdp_bf16 *k, const float *cos, const float *sin,
                                   float sign, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                   int64_t D) {
    int64_t h = D / 2, heads = NH + NKV, pairs = B * T * heads * h;
    for (int64_t e = fsdp_tid(); e < pairs; e += fsdp_stride()) {
        int64_t i = e % h, head = (e / h) % heads, row = e / (h * heads), t = row % T;
        bool is_q = head < NH;
        int64_t at = is_q ? (row * NH + head) * D : (row * NKV + head - NH) * D;
        const fsdp_bf16 *x = (is_q ? q : k) + at;
        fsdp_bf16 *y = (is_q ? qo : ko) + at;
        float c = cos[t * h + i], s = sign * sin[t * h + i];
        float x1 = __uint_as_float((uint32_t)x[i] << 16),
              x2 = __uint_as_float((uint32_t)x[i + h] << 16);
        y[i] = bf16_from_bits(__float_as_uint(x1 * c - x2 * s));
        y[i + h] = bf16_from_bits(__float_as_uint(x2 * c + x1 * s));
    }
}

static void rope_qk_b16(const char *name, fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q,
                        const fsdp_bf16 *k, const float *cos, const float *sin, float sign,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    int64_t pairs = B * T * (NH + NKV) * (D / 2);
    if (pairs <= 0) return;
    rope_qk_b16_kernel<<<fsdp_grid(pairs), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        qo, ko, q, k, cos, sin, sign, B, T, NH, NKV, D);
    FSDP_CUDA_LAUNCHED(name);
}

extern "C" void fsdp_cuda_rope_qk_forward_bf16_round(fsdp_bf16 *qo, fsdp_bf16 *ko,
                                                     const fsdp_bf16 *q, const fsdp_bf16 *k,
                                                     const float *cos, const float *sin, int64_t B,
                                                     int64_t T, int64_t NH, int64_t NKV,
                                                     int64_t D) {
    rope_qk_b16("rope_qk_forward_bf16_round", qo, ko, q, k, cos, sin, 1.0f, B, T, NH, NKV, D);
}

extern "C" void fsdp_cuda_rope_qk_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk,
                                                      const fsdp_bf16 *dqo, const fsdp_bf16 *dko,
                                                      const float *cos, const float *sin, int64_t B,
                                                      int64_t T, int64_t NH, int64_t NKV,
                                                      int64_t D) {
    rope_qk_b16("rope_qk_backward_bf16_round", dq, dk, dqo, dko, cos, sin, -1.0f, B, T, NH, NKV, D);
}

/* ---- attention ---- */

__device__ inline float dot(const float *a, const float *b, int64_t D) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* Thread (b, h, i): lse_i over keys j <= i, then out_i = sum_j exp(s_ij - lse_i) v_j. */
__global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k,
                                         const float *v, int64_t B, int64_t T, int64_t NH,
                                         int64_t NKV, int64_t D, float scale) {
    int64_t rows = B * NH * T, group = NH / NKV;
    for (int64_t e = fsdp_tid(); e < rows; e += fsdp_stride()) {
        int64_t i = e % T, h = (e / T) % NH, b = e / (T * NH), g = h / group;
        const float *qi = q + ((b * T + i) * NH + h) * D;
        const float *kb = k + b * T * NKV * D + g * D, *vb = v + b * T * NKV * D + g * D;
        float m = -INFINITY;
        for (int64_t j = 0; j <= i; j++) m = fmaxf(m, scale * dot(qi, kb + j * NKV * D, D));
        double se = 0.0;
        for (int64_t j = 0; j <= i; j++)
            se += exp((double)(scale * dot(qi, kb + j * NKV * D, D)) - (double)m);
        double l = (double)m + log(se);
        lse[(b * NH + h) * T + i] = (float)l;
        float *oi = out + ((b * T + i) * NH + h) * D;
        for (int64_t d = 0; d < D; d++) oi[d] = 0.0f;
        for (int64_t j = 0; j <= i; j++) {
            float p = (float)exp((double)(scale * dot(qi, kb + j * NKV * D, D)) - l);
            for (int64_t d = 0; d < D; d++) oi[d] += p * vb[j * NKV * D + d];
        }
    }
}

extern "C" void fsdp_cuda_attention_forward_plain(float *out, float *lse, float *scratch,
                                                  const float *q, const float *k, const float *v,
                                                  int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                                  int64_t D) {
    (void)scratch;
    int64_t rows = B * NH * T;
    if (rows <= 0) return;
    attention_forward_kernel<<<fsdp_grid(rows), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, lse, q, k, v, B, T, NH, NKV, D, 1.0f / sqrtf((float)D));
    FSDP_CUDA_LAUNCHED("attention_forward");
}

/* dS_ij = P_ij (dO_i . v_j - dO_i . O_i), P_ij = exp(s_ij - lse_i), for j <= i */
__device__ inline float score_grad(const float *qi, const float *kj, const float *vj,
                                   const float *doi, float di, float l, float scale, int64_t D) {
    float p = (float)exp((double)(scale * dot(qi, kj, D)) - (double)l);
    return p * (dot(doi, vj, D) - di);
}

/* Thread (b, h, i): dq_i = scale sum_{j <= i} dS_ij k_j. */
__global__ void attention_dq_kernel(float *dq, const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse, int64_t B,
                                    int64_t T, int64_t NH, int64_t NKV, int64_t D, float scale) {
    int64_t rows = B * NH * T, group = NH / NKV;
    for (int64_t e = fsdp_tid(); e < rows; e += fsdp_stride()) {
        int64_t i = e % T, h = (e / T) % NH, b = e / (T * NH), g = h / group;
        int64_t qo = ((b * T + i) * NH + h) * D;
        const float *kb = k + b * T * NKV * D + g * D, *vb = v + b * T * NKV * D + g * D;
        float di = dot(dout + qo, out + qo, D), l = lse[(b * NH + h) * T + i];
        float *dqi = dq + qo;
        for (int64_t d = 0; d < D; d++) dqi[d] = 0.0f;
        for (int64_t j = 0; j <= i; j++) {
            const float *kj = kb + j * NKV * D;
            float ds = score_grad(q + qo, kj, vb + j * NKV * D, dout + qo, di, l, scale, D);
            for (int64_t d = 0; d < D; d++) dqi[d] += scale * ds * kj[d];
        }
    }
}

/* Thread (b, g, j): over the group's heads h and rows i >= j,
 * dv_j += P_ij dO_i and dk_j += scale dS_ij q_i. */
__global__ void attention_dkv_kernel(float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, const float *out,
                                     const float *lse, int64_t B, int64_t T, int64_t NH,
                                     int64_t NKV, int64_t D, float scale) {
    int64_t rows = B * NKV * T, group = NH / NKV;
    for (int64_t e = fsdp_tid(); e < rows; e += fsdp_stride()) {
        int64_t j = e % T, g = (e / T) % NKV, b = e / (T * NKV);
        int64_t ko = ((b * T + j) * NKV + g) * D;
        const float *kj = k + ko, *vj = v + ko;
        float *dkj = dk + ko, *dvj = dv + ko;
        for (int64_t d = 0; d < D; d++) dkj[d] = 0.0f, dvj[d] = 0.0f;
        for (int64_t h = g * group; h < (g + 1) * group; h++) {
            for (int64_t i = j; i < T; i++) {
                int64_t qo = ((b * T + i) * NH + h) * D;
                const float *qi = q + qo, *doi = dout + qo;
                float l = lse[(b * NH + h) * T + i];
                float p = (float)exp((double)(scale * dot(qi, kj, D)) - (double)l);
                float ds = p * (dot(doi, vj, D) - dot(doi, out + qo, D));
                for (int64_t d = 0; d < D; d++) {
                    dvj[d] += p * doi[d];
                    dkj[d] += scale * ds * qi[d];
                }
            }
        }
    }
}

extern "C" void fsdp_cuda_attention_backward_plain(float *dq, float *dk, float *dv, float *scratch,
                                                   const float *dout, const float *q,
                                                   const float *k, const float *v, const float *out,
                                                   const float *lse, int64_t B, int64_t T,
                                                   int64_t NH, int64_t NKV, int64_t D) {
    (void)scratch;
    if (B <= 0 || T <= 0) return;
    float scale = 1.0f / sqrtf((float)D);
    if (NH > 0) {
        attention_dq_kernel<<<fsdp_grid(B * NH * T), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            dq, dout, q, k, v, out, lse, B, T, NH, NKV, D, scale);
        FSDP_CUDA_LAUNCHED("attention_backward (dq)");
    }
    if (NKV > 0) {
        attention_dkv_kernel<<<fsdp_grid(B * NKV * T), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
            dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, D, scale);
        FSDP_CUDA_LAUNCHED("attention_backward (dk, dv)");
    }
}

/* ---- SwiGLU ---- */

__device__ inline float sigmoid_f(float x) {
    float z = expf(-fabsf(x));
    float s = 1.0f / (1.0f + z);
    return x >= 0.0f ? s : z * s;
}

/* swiglu_backward's two gradients of one element, in its f32 operations (one body for every
 * variant: f32, bf16 inputs, rounded outputs) */
__device__ inline void swiglu_grads(float g, float u, float dy, float *dg, float *du) {
    float s = sigmoid_f(g);
    *dg = dy * u * s * (1.0f + g * (1.0f - s));
    *du = dy * g * s;
}

struct swiglu_op {
    __device__ float operator()(float g, float u) const { return g * sigmoid_f(g) * u; }
};

extern "C" void fsdp_cuda_swiglu_forward(float *out, const float *gate, const float *up,
                                         int64_t n) {
    fsdp_map2("swiglu_forward", out, gate, up, n, swiglu_op());
}

__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
                                       const float *gate, const float *up, int64_t n) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) {
        swiglu_grads(gate[i], up[i], dout[i], &dgate[i], &dup[i]);
    }
}

extern "C" void fsdp_cuda_swiglu_backward(float *dgate, float *dup, const float *dout,
                                          const float *gate, const float *up, int64_t n) {
    if (n <= 0) return;
    swiglu_backward_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dgate, dup, dout, gate, up, n);
    FSDP_CUDA_LAUNCHED("swiglu_backward");
}

/* The SwiGLU on bf16 gate and up: widened exactly, then swiglu_op and the backward's f32
 * operations (--fmad=false: the same bits as the f32 kernels on widened inputs); the forward
 * rounded as convert.cu's f32_to_bf16 rounds. */
__device__ inline float bf16_widen(fsdp_bf16 x) {
    return __uint_as_float((uint32_t)x << 16);
}

__global__ void swiglu_forward_bf16_kernel(fsdp_bf16 *out, const fsdp_bf16 *gate,
                                           const fsdp_bf16 *up, int64_t n) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride())
        out[i] =
            bf16_from_bits(__float_as_uint(swiglu_op()(bf16_widen(gate[i]), bf16_widen(up[i]))));
}

extern "C" void fsdp_cuda_swiglu_forward_bf16(fsdp_bf16 *out, const fsdp_bf16 *gate,
                                              const fsdp_bf16 *up, int64_t n) {
    if (n <= 0) return;
    swiglu_forward_bf16_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        out, gate, up, n);
    FSDP_CUDA_LAUNCHED("swiglu_forward_bf16");
}

__global__ void swiglu_backward_bf16_kernel(float *dgate, float *dup, const float *dout,
                                            const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) {
        swiglu_grads(bf16_widen(gate[i]), bf16_widen(up[i]), dout[i], &dgate[i], &dup[i]);
    }
}

extern "C" void fsdp_cuda_swiglu_backward_bf16(float *dgate, float *dup, const float *dout,
                                               const fsdp_bf16 *gate, const fsdp_bf16 *up,
                                               int64_t n) {
    if (n <= 0) return;
    swiglu_backward_bf16_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dgate, dup, dout, gate, up, n);
    FSDP_CUDA_LAUNCHED("swiglu_backward_bf16");
}

/* swiglu_backward_bf16_kernel's gradients rounded as convert.cu's f32_to_bf16 rounds (what the
 * projections' bf16 GEMMs read): 2 bytes written per gradient instead of 4, and no conversion
 * pass of their own */
__global__ void swiglu_backward_bf16_round_kernel(fsdp_bf16 *dgate, fsdp_bf16 *dup,
                                                  const float *dout, const fsdp_bf16 *gate,
                                                  const fsdp_bf16 *up, int64_t n) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) {
        float dg, du;
        swiglu_grads(bf16_widen(gate[i]), bf16_widen(up[i]), dout[i], &dg, &du);
        dgate[i] = bf16_from_bits(__float_as_uint(dg));
        dup[i] = bf16_from_bits(__float_as_uint(du));
    }
}

extern "C" void fsdp_cuda_swiglu_backward_bf16_round(fsdp_bf16 *dgate, fsdp_bf16 *dup,
                                                     const float *dout, const fsdp_bf16 *gate,
                                                     const fsdp_bf16 *up, int64_t n) {
    if (n <= 0) return;
    swiglu_backward_bf16_round_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dgate, dup, dout, gate, up, n);
    FSDP_CUDA_LAUNCHED("swiglu_backward_bf16_round");
}

/* swiglu_backward_bf16_round_kernel on a bf16 dout, widened exactly (down_proj's bf16 dx) */
__global__ void swiglu_backward_bf16io_kernel(fsdp_bf16 *dgate, fsdp_bf16 *dup,
                                              const fsdp_bf16 *dout, const fsdp_bf16 *gate,
                                              const fsdp_bf16 *up, int64_t n) {
    for (int64_t i = fsdp_tid(); i < n; i += fsdp_stride()) {
        float dg, du;
        swiglu_grads(bf16_widen(gate[i]), bf16_widen(up[i]), bf16_widen(dout[i]), &dg, &du);
        dgate[i] = bf16_from_bits(__float_as_uint(dg));
        dup[i] = bf16_from_bits(__float_as_uint(du));
    }
}

extern "C" void fsdp_cuda_swiglu_backward_bf16io(fsdp_bf16 *dgate, fsdp_bf16 *dup,
                                                 const fsdp_bf16 *dout, const fsdp_bf16 *gate,
                                                 const fsdp_bf16 *up, int64_t n) {
    if (n <= 0) return;
    swiglu_backward_bf16io_kernel<<<fsdp_grid(n), FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        dgate, dup, dout, gate, up, n);
    FSDP_CUDA_LAUNCHED("swiglu_backward_bf16io");
}

/* ---- cross-entropy with an ignored target ---- */

/* partial[block] = rows whose target is not ignore_index */
__global__ void count_kernel(double *partial, const int32_t *targets, int32_t ignore_index,
                             int64_t rows) {
    double acc = 0.0;
    for (int64_t r = fsdp_tid(); r < rows; r += fsdp_stride()) acc += targets[r] != ignore_index;
    acc = fsdp_block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* As loss.cu's cross_entropy_kernel over counted rows, divided by n; ignored rows get zero. The
 * logits In and the gradient Out are f32 or bf16 (fsdp_cross_entropy_row). */
template <class In, class Out>
__global__ void cross_entropy_ignore_kernel(double *partial, double *bad, Out *dlogits,
                                            const In *logits, const int32_t *targets,
                                            int32_t ignore_index, int64_t rows, int64_t classes,
                                            const double *count) {
    double acc = 0.0, n = *count;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const In *x = logits + r * classes; // (classes)
        Out *d = dlogits ? dlogits + r * classes : NULL;
        int32_t t = targets[r];
        if (t == ignore_index) {
            if (d)
                for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
                    fsdp_ce_store(d, c, 0.0f);
            continue;
        }
        if (t < 0 || t >= classes) {
            if (threadIdx.x == 0) *bad = 1.0;
            continue;
        }
        acc += fsdp_cross_entropy_row(d, x, t, classes, n);
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* The count of rows, then one block per row (loss and gradient in one pass over the row, divided
 * by the count, which the kernel reads from the device), then the loss's total: the f32 and the
 * bf16 entries. The host waits once, for the total, the count and the bad-target flag together
 * (before, it also waited for the count, between the forward's kernels and this one). Scratch:
 * the partials, then [PARTIALS] the total, [+1] the flag, [+2] the count. */
template <class In, class Out>
static void cross_entropy_ignore(float *loss, Out *dlogits, const In *logits,
                                 const int32_t *targets, int32_t ignore_index, int64_t rows,
                                 int64_t classes) {
    if (rows <= 0) {
        *loss = NAN;
        return;
    }
    double *scratch = fsdp_cuda_scratch(), *total = scratch + FSDP_CUDA_PARTIALS;
    unsigned blocks = fsdp_partial_blocks(rows);
    count_kernel<<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(scratch, targets,
                                                                       ignore_index, rows);
    FSDP_CUDA_LAUNCHED("cross_entropy_ignore (count)");
    fsdp_sum_partials_kernel<<<1, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(total + 2, scratch,
                                                                              (int)blocks);
    FSDP_CUDA_LAUNCHED("cross_entropy_ignore (count total)");
    blocks = (unsigned)(rows < FSDP_CUDA_PARTIALS ? rows : FSDP_CUDA_PARTIALS);
    FSDP_CUDA_CHECK(cudaMemsetAsync(total + 1, 0, sizeof(double), fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
    cross_entropy_ignore_kernel<In, Out><<<blocks, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(
        scratch, total + 1, dlogits, logits, targets, ignore_index, rows, classes, total + 2);
    FSDP_CUDA_LAUNCHED("cross_entropy_ignore");
    fsdp_sum_partials_kernel<<<1, FSDP_CUDA_THREADS, 0, fsdp_cuda_stream()>>>(total, scratch,
                                                                              (int)blocks);
    FSDP_CUDA_LAUNCHED("cross_entropy_ignore (total)");
    double host[3];
    FSDP_CUDA_CHECK(
        cudaMemcpyAsync(host, total, sizeof host, cudaMemcpyDeviceToHost, fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
    fsdp_cuda_count_host_wait(-1);
    FSDP_CUDA_CHECK(cudaStreamSynchronize(fsdp_cuda_stream()));
    FSDP_ASSERT(host[1] == 0.0); // a target outside [0, classes), as the CPU asserts
    *loss = (float)(host[0] / host[2]);
}

extern "C" void fsdp_cuda_cross_entropy_ignore(float *loss, float *dlogits, const float *logits,
                                               const int32_t *targets, int32_t ignore_index,
                                               int64_t rows, int64_t classes) {
    cross_entropy_ignore(loss, dlogits, logits, targets, ignore_index, rows, classes);
}

extern "C" void fsdp_cuda_cross_entropy_ignore_bf16(float *loss, void *dlogits,
                                                    fsdp_dtype dlogits_dtype,
                                                    const fsdp_bf16 *logits, const int32_t *targets,
                                                    int32_t ignore_index, int64_t rows,
                                                    int64_t classes) {
    FSDP_ASSERT(dlogits_dtype == FSDP_DTYPE_F32 || dlogits_dtype == FSDP_DTYPE_BF16);
    if (dlogits_dtype == FSDP_DTYPE_BF16)
        cross_entropy_ignore(loss, (fsdp_bf16 *)dlogits, logits, targets, ignore_index, rows,
                             classes);
    else
        cross_entropy_ignore(loss, (float *)dlogits, logits, targets, ignore_index, rows, classes);
}
