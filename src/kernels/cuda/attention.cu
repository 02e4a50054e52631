/* attention.cu: the tiled (FlashAttention-2-class) causal grouped-query attention of the CUDA
 * table, f32 in and out with f32 accumulation, and the choice between it, the plain
 * row-per-thread kernels of llama.cu and the cuBLAS GEMM path of attention_gemm.cu
 * (fsdp_cuda_thread_set_attention, FSDP_CUDA_ATTENTION).
 * Query and key tiles of FA_TILE rows live in shared memory; the forward keeps a running row
 * maximum and sum (online softmax) and never stores a score block in global memory; tiles above
 * the diagonal are skipped. The backward runs two kernels without atomics: dq per query tile
 * over its key tiles, dk and dv per key-value head and key tile over the group's query heads and
 * query tiles, both recomputing probabilities from the saved lse (deterministic, at the price of
 * computing q k^T and dout v^T twice). cuDNN's fused attention (sdpa.c) is tried first by the bf16
 * policy's entries under FSDP_CUDA_ATTENTION=auto (the default) and by every entry under
 * FSDP_CUDA_ATTENTION=cudnn; the tiled kernels run what it cannot (on bf16 tensors: widened
 * batch by batch in the caller's scratch). FSDP_CUDA_ATTENTION=gemm runs the GEMM path for
 * every entry, the tiled kernels where its score blocks cannot be allocated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/llama_cuda.h"

#define FA_TILE    32                           // query and key rows per tile
#define FA_THREADS 256                          // 16 x 16 threads: ty picks rows, tx columns
#define FA_RPT     (FA_TILE / 16)               // rows of a tile per thread
#define FA_DPT     (FSDP_CUDA_FLASH_MAX_D / 16) // head-dimension columns per thread
#define FA_LDS     (FA_TILE + 1)                // row stride of a score tile in shared memory

/* Copies rows [row0, row0 + FA_TILE) of a (T, stride) head view into a (FA_TILE, D + 1) tile,
 * zeros past T. */
__device__ inline void fa_load(float *dst, const float *src, int64_t row0, int64_t T,
                               int64_t stride, int D) {
    for (int e = threadIdx.x; e < FA_TILE * D; e += FA_THREADS) {
        int r = e / D, d = e % D;
        dst[r * (D + 1) + d] = row0 + r < T ? src[(row0 + r) * stride + d] : 0.0f;
    }
}

/* a . b over D, with a and b rows of tiles */
__device__ inline float fa_dot(const float *a, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* Sum and max over the 16 lanes sharing ty (one half of a warp). */
__device__ inline float fa_sum16(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float fa_max16(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The n-th block of a grid over (tiles, heads, B), heaviest (last) tiles first. */
__device__ inline void fa_block(int64_t tiles, int64_t heads, int64_t *tile, int64_t *head,
                                int64_t *b) {
    int64_t e = blockIdx.x;
    *tile = tiles - 1 - e % tiles;
    *head = (e / tiles) % heads;
    *b = e / (tiles * heads);
}

/* Block (b, h, query tile): out and lse of its rows, key tiles 0..qt (causal skipping). */
__global__ void __launch_bounds__(FA_THREADS)
    flash_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                         int64_t T, int64_t NH, int64_t NKV, int D, float scale) {
    extern __shared__ float sm[];
    int ld = D + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float *Qs = sm, *Ks = Qs + FA_TILE * ld, *Vs = Ks + FA_TILE * ld, *Ps = Vs + FA_TILE * ld;
    int64_t qt, h, b, tiles = (T + FA_TILE - 1) / FA_TILE;
    fa_block(tiles, NH, &qt, &h, &b);
    int64_t g = h / (NH / NKV), q0 = qt * FA_TILE;
    const float *kb = k + (b * T * NKV + g) * D, *vb = v + (b * T * NKV + g) * D;
    fa_load(Qs, q + (b * T * NH + h) * D, q0, T, NH * D, D);
    float m[FA_RPT], l[FA_RPT], acc[FA_RPT][FA_DPT];
#pragma unroll
    for (int r = 0; r < FA_RPT; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
        for (int c = 0; c < FA_DPT; c++) acc[r][c] = 0.0f;
    }
    for (int64_t kt = 0; kt <= qt; kt++) {
        int64_t k0 = kt * FA_TILE;
        __syncthreads(); // the previous tile's reads are done
        fa_load(Ks, kb, k0, T, NKV * D, D);
        fa_load(Vs, vb, k0, T, NKV * D, D);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < FA_RPT; r++) {
            int i = ty * FA_RPT + r;
            float s[FA_TILE / 16], mt = -INFINITY;
#pragma unroll
            for (int c = 0; c < FA_TILE / 16; c++) {
                int j = tx + 16 * c;
                bool seen = k0 + j <= q0 + i && k0 + j < T; // key 0 is seen by every row
                s[c] = seen ? scale * fa_dot(Qs + i * ld, Ks + j * ld, D) : -INFINITY;
                mt = fmaxf(mt, s[c]);
            }
            float mn = fmaxf(m[r], fa_max16(mt)), alpha = expf(m[r] - mn), ps = 0.0f;
#pragma unroll
            for (int c = 0; c < FA_TILE / 16; c++) {
                float p = expf(s[c] - mn);
                Ps[i * FA_LDS + tx + 16 * c] = p;
                ps += p;
            }
            l[r] = l[r] * alpha + fa_sum16(ps);
            m[r] = mn;
#pragma unroll
            for (int c = 0; c < FA_DPT; c++) acc[r][c] *= alpha;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < FA_RPT; r++) {
            const float *p = Ps + (ty * FA_RPT + r) * FA_LDS;
#pragma unroll
            for (int c = 0; c < FA_DPT; c++) {
                int d = tx + 16 * c;
                if (d >= D) continue;
                float a = 0.0f;
                for (int j = 0; j < FA_TILE; j++) a += p[j] * Vs[j * ld + d];
                acc[r][c] += a;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < FA_RPT; r++) {
        int64_t i = q0 + ty * FA_RPT + r;
        if (i >= T) continue;
        float *o = out + ((b * T + i) * NH + h) * D;
        for (int c = 0; c < FA_DPT; c++)
            if (tx + 16 * c < D) o[tx + 16 * c] = acc[r][c] / l[r];
        if (tx == 0) lse[(b * NH + h) * T + i] = m[r] + logf(l[r]);
    }
}

/* For this thread's rows of a query tile (Qs, dOs loaded): lse (0 past T) and
 * delta_i = dout_i . out_i. */
__device__ inline void fa_row_stats(float *L, float *Dl, const float *dOs, const float *out,
                                    const float *lse, int64_t b, int64_t h, int64_t q0, int64_t T,
                                    int64_t NH, int D) {
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int r = 0; r < FA_RPT; r++) {
        int i = ty * FA_RPT + r;
        bool in = q0 + i < T;
        const float *o = out + ((b * T + q0 + i) * NH + h) * D;
        float s = 0.0f;
        for (int d = tx; d < D && in; d += 16) s += dOs[i * (D + 1) + d] * o[d];
        Dl[r] = fa_sum16(s);
        L[r] = in ? lse[(b * NH + h) * T + q0 + i] : 0.0f;
    }
}

/* P and dS = P (dout v^T - delta) of a (query tile at q0, key tile at k0) pair into Ps, dSs
 * (FA_TILE, FA_LDS); Ps may be NULL. Zero outside the causal, in-range part. */
__device__ inline void fa_scores(float *Ps, float *dSs, const float *Qs, const float *dOs,
                                 const float *Ks, const float *Vs, const float *L, const float *Dl,
                                 int64_t q0, int64_t k0, int64_t T, int D, float scale) {
    int ld = D + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int r = 0; r < FA_RPT; r++) {
        int i = ty * FA_RPT + r;
#pragma unroll
        for (int c = 0; c < FA_TILE / 16; c++) {
            int j = tx + 16 * c;
            float p = 0.0f, ds = 0.0f;
            if (k0 + j <= q0 + i && q0 + i < T) { // then k0 + j < T too
                p = expf(scale * fa_dot(Qs + i * ld, Ks + j * ld, D) - L[r]);
                ds = p * (fa_dot(dOs + i * ld, Vs + j * ld, D) - Dl[r]);
            }
            if (Ps) Ps[i * FA_LDS + j] = p;
            dSs[i * FA_LDS + j] = ds;
        }
    }
}

/* Block (b, h, query tile): dq_i = scale sum_j dS_ij k_j over key tiles 0..qt. */
__global__ void __launch_bounds__(FA_THREADS)
    flash_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v,
                    const float *out, const float *lse, int64_t T, int64_t NH, int64_t NKV, int D,
                    float scale) {
    extern __shared__ float sm[];
    int ld = D + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float *Qs = sm, *dOs = Qs + FA_TILE * ld, *Ks = dOs + FA_TILE * ld, *Vs = Ks + FA_TILE * ld;
    float *dSs = Vs + FA_TILE * ld;
    int64_t qt, h, b, tiles = (T + FA_TILE - 1) / FA_TILE;
    fa_block(tiles, NH, &qt, &h, &b);
    int64_t g = h / (NH / NKV), q0 = qt * FA_TILE;
    const float *kb = k + (b * T * NKV + g) * D, *vb = v + (b * T * NKV + g) * D;
    fa_load(Qs, q + (b * T * NH + h) * D, q0, T, NH * D, D);
    fa_load(dOs, dout + (b * T * NH + h) * D, q0, T, NH * D, D);
    __syncthreads();
    float L[FA_RPT], Dl[FA_RPT], acc[FA_RPT][FA_DPT] = {};
    fa_row_stats(L, Dl, dOs, out, lse, b, h, q0, T, NH, D);
    for (int64_t kt = 0; kt <= qt; kt++) {
        __syncthreads();
        fa_load(Ks, kb, kt * FA_TILE, T, NKV * D, D);
        fa_load(Vs, vb, kt * FA_TILE, T, NKV * D, D);
        __syncthreads();
        fa_scores(NULL, dSs, Qs, dOs, Ks, Vs, L, Dl, q0, kt * FA_TILE, T, D, scale);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < FA_RPT; r++) {
            const float *ds = dSs + (ty * FA_RPT + r) * FA_LDS;
#pragma unroll
            for (int c = 0; c < FA_DPT; c++) {
                if (tx + 16 * c >= D) continue;
                float a = 0.0f;
                for (int j = 0; j < FA_TILE; j++) a += ds[j] * Ks[j * ld + tx + 16 * c];
                acc[r][c] += a;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < FA_RPT; r++) {
        int64_t i = q0 + ty * FA_RPT + r;
        if (i >= T) continue;
        float *o = dq + ((b * T + i) * NH + h) * D;
        for (int c = 0; c < FA_DPT; c++)
            if (tx + 16 * c < D) o[tx + 16 * c] = scale * acc[r][c];
    }
}

/* Block (b, key-value head g, key tile): dv_j = sum P_ij dout_i and dk_j = scale sum dS_ij q_i
 * over the group's query heads and the query tiles kt.. (one writer per dk, dv row). */
__global__ void __launch_bounds__(FA_THREADS)
    flash_dkv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k,
                     const float *v, const float *out, const float *lse, int64_t T, int64_t NH,
                     int64_t NKV, int D, float scale) {
    extern __shared__ float sm[];
    int ld = D + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float *Ks = sm, *Vs = Ks + FA_TILE * ld, *Qs = Vs + FA_TILE * ld, *dOs = Qs + FA_TILE * ld;
    float *Ps = dOs + FA_TILE * ld, *dSs = Ps + FA_TILE * FA_LDS;
    int64_t kt, g, b, tiles = (T + FA_TILE - 1) / FA_TILE, group = NH / NKV;
    fa_block(tiles, NKV, &kt, &g, &b);
    int64_t k0 = kt * FA_TILE;
    fa_load(Ks, k + (b * T * NKV + g) * D, k0, T, NKV * D, D);
    fa_load(Vs, v + (b * T * NKV + g) * D, k0, T, NKV * D, D);
    float adk[FA_RPT][FA_DPT] = {}, adv[FA_RPT][FA_DPT] = {};
    for (int64_t h = g * group; h < (g + 1) * group; h++) {
        for (int64_t qt = kt; qt < tiles; qt++) {
            int64_t q0 = qt * FA_TILE;
            __syncthreads();
            fa_load(Qs, q + (b * T * NH + h) * D, q0, T, NH * D, D);
            fa_load(dOs, dout + (b * T * NH + h) * D, q0, T, NH * D, D);
            __syncthreads();
            float L[FA_RPT], Dl[FA_RPT];
            fa_row_stats(L, Dl, dOs, out, lse, b, h, q0, T, NH, D);
            fa_scores(Ps, dSs, Qs, dOs, Ks, Vs, L, Dl, q0, k0, T, D, scale);
            __syncthreads();
#pragma unroll
            for (int r = 0; r < FA_RPT; r++) {
                int j = ty * FA_RPT + r;
#pragma unroll
                for (int c = 0; c < FA_DPT; c++) {
                    int d = tx + 16 * c;
                    if (d >= D) continue;
                    float a = 0.0f, e = 0.0f;
                    for (int i = 0; i < FA_TILE; i++) {
                        a += Ps[i * FA_LDS + j] * dOs[i * ld + d];
                        e += dSs[i * FA_LDS + j] * Qs[i * ld + d];
                    }
                    adv[r][c] += a, adk[r][c] += e;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < FA_RPT; r++) {
        int64_t j = k0 + ty * FA_RPT + r;
        if (j >= T) continue;
        int64_t o = ((b * T + j) * NKV + g) * D;
        for (int c = 0; c < FA_DPT; c++) {
            if (tx + 16 * c >= D) continue;
            dk[o + tx + 16 * c] = scale * adk[r][c];
            dv[o + tx + 16 * c] = adv[r][c];
        }
    }
}

/* Shared memory of a kernel with `tiles` (FA_TILE, D + 1) tiles and `scores` score tiles; asks
 * for more than the default 48 KiB when it needs it (at most 74.5 KiB, at D = 128). */
template <class K> static size_t fa_smem(K kernel, int tiles, int scores, int64_t D) {
    size_t bytes = sizeof(float) *
                   ((size_t)tiles * FA_TILE * (size_t)(D + 1) + (size_t)scores * FA_TILE * FA_LDS);
    if (bytes > 48 * 1024)
        FSDP_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return bytes;
}

static unsigned fa_grid(int64_t T, int64_t heads, int64_t B) {
    return (unsigned)((T + FA_TILE - 1) / FA_TILE * heads * B);
}

extern "C" void fsdp_cuda_attention_forward_flash(float *out, float *lse, const float *q,
                                                  const float *k, const float *v, int64_t B,
                                                  int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0) return;
    size_t smem = fa_smem(flash_forward_kernel, 3, 1, D);
    flash_forward_kernel<<<fa_grid(T, NH, B), FA_THREADS, smem, fsdp_cuda_stream()>>>(
        out, lse, q, k, v, T, NH, NKV, (int)D, 1.0f / sqrtf((float)D));
    FSDP_CUDA_LAUNCHED("attention_forward (flash)");
}

extern "C" void fsdp_cuda_attention_backward_flash(float *dq, float *dk, float *dv,
                                                   const float *dout, const float *q,
                                                   const float *k, const float *v, const float *out,
                                                   const float *lse, int64_t B, int64_t T,
                                                   int64_t NH, int64_t NKV, int64_t D) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0) return;
    float scale = 1.0f / sqrtf((float)D);
    {
        size_t smem = fa_smem(flash_dq_kernel, 4, 1, D);
        flash_dq_kernel<<<fa_grid(T, NH, B), FA_THREADS, smem, fsdp_cuda_stream()>>>(
            dq, dout, q, k, v, out, lse, T, NH, NKV, (int)D, scale);
        FSDP_CUDA_LAUNCHED("attention_backward (flash dq)");
    }
    {
        size_t smem = fa_smem(flash_dkv_kernel, 4, 2, D);
        flash_dkv_kernel<<<fa_grid(T, NKV, B), FA_THREADS, smem, fsdp_cuda_stream()>>>(
            dk, dv, dout, q, k, v, out, lse, T, NH, NKV, (int)D, scale);
        FSDP_CUDA_LAUNCHED("attention_backward (flash dk, dv)");
    }
}

/* ---- the choice ---- */

/* FSDP_CUDA_ATTENTION, read once: auto (the default), plain, flash, cudnn or gemm; anything
 * else aborts. */
static fsdp_cuda_attention env_attention(void) {
    static const fsdp_cuda_attention chosen = [] {
        const char *s = getenv("FSDP_CUDA_ATTENTION");
        if (!s || !*s || strcmp(s, "auto") == 0) return FSDP_CUDA_ATTENTION_AUTO;
        if (strcmp(s, "plain") == 0) return FSDP_CUDA_ATTENTION_PLAIN;
        if (strcmp(s, "flash") == 0) return FSDP_CUDA_ATTENTION_FLASH;
        if (strcmp(s, "cudnn") == 0) return FSDP_CUDA_ATTENTION_CUDNN;
        if (strcmp(s, "gemm") == 0) return FSDP_CUDA_ATTENTION_GEMM;
        fprintf(stderr,
                "libfsdp: FSDP_CUDA_ATTENTION=%s is not an attention kernel: set it to auto, "
                "plain, flash, cudnn or gemm, or unset it (auto)\n",
                s);
        abort();
    }();
    return chosen;
}

static thread_local fsdp_cuda_attention thread_choice = FSDP_CUDA_ATTENTION_DEFAULT;

extern "C" void fsdp_cuda_thread_set_attention(fsdp_cuda_attention kind) {
    thread_choice = kind;
}

extern "C" fsdp_cuda_attention fsdp_cuda_thread_attention(void) {
    return thread_choice != FSDP_CUDA_ATTENTION_DEFAULT ? thread_choice : env_attention();
}

/* Whether this call takes the tiled path: chosen (or cuDNN or the GEMM path chosen and
 * refused, which the caller has tried), and D within its register tiles. */
static bool use_flash(int64_t D) {
    return fsdp_cuda_thread_attention() != FSDP_CUDA_ATTENTION_PLAIN && D <= FSDP_CUDA_FLASH_MAX_D;
}

/* Whether this call tries cuDNN first: chosen, or AUTO on the bf16 policy's entries. */
static bool use_cudnn(bool bf16) {
    fsdp_cuda_attention c = fsdp_cuda_thread_attention();
    return c == FSDP_CUDA_ATTENTION_CUDNN || (bf16 && c == FSDP_CUDA_ATTENTION_AUTO);
}

static void attention_forward(float *out, float *lse, float *scratch, const float *q,
                              const float *k, const float *v, int64_t B, int64_t T, int64_t NH,
                              int64_t NKV, int64_t D, bool bf16) {
    if (use_cudnn(bf16) && fsdp_cuda_sdpa_forward(out, lse, q, k, v, B, T, NH, NKV, D)) return;
    if (fsdp_cuda_thread_attention() == FSDP_CUDA_ATTENTION_GEMM &&
        fsdp_cuda_attention_forward_gemm(out, lse, q, k, v, B, T, NH, NKV, D))
        return;
    if (use_flash(D))
        fsdp_cuda_attention_forward_flash(out, lse, q, k, v, B, T, NH, NKV, D);
    else
        fsdp_cuda_attention_forward_plain(out, lse, scratch, q, k, v, B, T, NH, NKV, D);
}

static void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const float *q, const float *k, const float *v, const float *out,
                               const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t D, bool bf16) {
    if (use_cudnn(bf16) &&
        fsdp_cuda_sdpa_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, D))
        return;
    if (fsdp_cuda_thread_attention() == FSDP_CUDA_ATTENTION_GEMM &&
        fsdp_cuda_attention_backward_gemm(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, D))
        return;
    if (use_flash(D))
        fsdp_cuda_attention_backward_flash(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, D);
    else
        fsdp_cuda_attention_backward_plain(dq, dk, dv, scratch, dout, q, k, v, out, lse, B, T, NH,
                                           NKV, D);
}

extern "C" void fsdp_cuda_attention_forward(float *out, float *lse, float *scratch, const float *q,
                                            const float *k, const float *v, int64_t B, int64_t T,
                                            int64_t NH, int64_t NKV, int64_t D) {
    attention_forward(out, lse, scratch, q, k, v, B, T, NH, NKV, D, false);
}

extern "C" void fsdp_cuda_attention_forward_bf16(float *out, float *lse, float *scratch,
                                                 const float *q, const float *k, const float *v,
                                                 int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                                 int64_t D) {
    attention_forward(out, lse, scratch, q, k, v, B, T, NH, NKV, D, true);
}

extern "C" void fsdp_cuda_attention_backward(float *dq, float *dk, float *dv, float *scratch,
                                             const float *dout, const float *q, const float *k,
                                             const float *v, const float *out, const float *lse,
                                             int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                             int64_t D) {
    attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, lse, B, T, NH, NKV, D, false);
}

extern "C" void fsdp_cuda_attention_backward_bf16(float *dq, float *dk, float *dv, float *scratch,
                                                  const float *dout, const float *q, const float *k,
                                                  const float *v, const float *out,
                                                  const float *lse, int64_t B, int64_t T,
                                                  int64_t NH, int64_t NKV, int64_t D) {
    attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, lse, B, T, NH, NKV, D, true);
}

/* ---- on bf16 tensors: cuDNN directly where it takes them, else batch b widened into scratch
 * after its (2, T, T) blocks and the f32 path above run on it (as the CPU does) ---- */

extern "C" void fsdp_cuda_attention_forward_bf16_round(fsdp_bf16 *out, float *lse, float *scratch,
                                                       const fsdp_bf16 *q, const fsdp_bf16 *k,
                                                       const fsdp_bf16 *v, int64_t B, int64_t T,
                                                       int64_t NH, int64_t NKV, int64_t D) {
    if (use_cudnn(true) && fsdp_cuda_sdpa_forward_bf16(out, lse, q, k, v, B, T, NH, NKV, D)) return;
    int64_t nq = T * NH * D, nk = T * NKV * D; /* one batch's */
    float *qf = scratch + 2 * T * T, *of = qf + nq, *kf = of + nq, *vf = kf + nk;
    for (int64_t b = 0; b < B; b++) {
        fsdp_cuda_bf16_to_f32(qf, q + b * nq, nq);
        fsdp_cuda_bf16_to_f32(kf, k + b * nk, nk);
        fsdp_cuda_bf16_to_f32(vf, v + b * nk, nk);
        attention_forward(of, lse + b * NH * T, scratch, qf, kf, vf, 1, T, NH, NKV, D, false);
        fsdp_cuda_f32_to_bf16(out + b * nq, of, nq);
    }
}

extern "C" void fsdp_cuda_attention_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                                                        float *scratch, const fsdp_bf16 *dout,
                                                        const fsdp_bf16 *q, const fsdp_bf16 *k,
                                                        const fsdp_bf16 *v, const fsdp_bf16 *out,
                                                        const float *lse, int64_t B, int64_t T,
                                                        int64_t NH, int64_t NKV, int64_t D) {
    if (use_cudnn(true) &&
        fsdp_cuda_sdpa_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, D))
        return;
    int64_t nq = T * NH * D, nk = T * NKV * D; /* one batch's */
    float *dof = scratch + 2 * T * T, *qf = dof + nq, *of = qf + nq, *dqf = of + nq;
    float *kf = dqf + nq, *vf = kf + nk, *dkf = vf + nk, *dvf = dkf + nk;
    for (int64_t b = 0; b < B; b++) {
        fsdp_cuda_bf16_to_f32(dof, dout + b * nq, nq);
        fsdp_cuda_bf16_to_f32(qf, q + b * nq, nq);
        fsdp_cuda_bf16_to_f32(of, out + b * nq, nq);
        fsdp_cuda_bf16_to_f32(kf, k + b * nk, nk);
        fsdp_cuda_bf16_to_f32(vf, v + b * nk, nk);
        attention_backward(dqf, dkf, dvf, scratch, dof, qf, kf, vf, of, lse + b * NH * T, 1, T, NH,
                           NKV, D, false);
        fsdp_cuda_f32_to_bf16(dq + b * nq, dqf, nq);
        fsdp_cuda_f32_to_bf16(dk + b * nk, dkf, nk);
        fsdp_cuda_f32_to_bf16(dv + b * nk, dvf, nk);
    }
}
