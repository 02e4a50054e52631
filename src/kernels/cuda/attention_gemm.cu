/* attention_gemm.cu: the f32 causal grouped-query attention of the CUDA table through cuBLAS
 * GEMMs and two row kernels (PyTorch's "math" SDPA), the path FSDP_CUDA_ATTENTION=gemm. Per
 * (b, h) pair the forward computes the (T, T) score block S = q k^T / sqrt(D) (GEMM), a row
 * kernel masks it, takes each row's log-sum-exp (saved) and writes P in its place, and
 * out = P v (GEMM). The backward recomputes S (GEMM) and dP = dout v^T (GEMM); a row kernel
 * writes P = exp(S - lse) over S and dS = P (dP - rowsum(dout * out)) over dP; then
 * dq = dS k / sqrt(D), dv += P^T dout and dk += dS^T q / sqrt(D) (GEMMs). The row kernels follow
 * the CPU's rules (kernels/cpu/attention.c): f32 row maximum, exponentials and the row sums in
 * double, P rounded once to f32.
 *
 * Batching: cublasGemmBatchedEx over device pointer arrays, built for every pair by one kernel
 * per call. A pair's q rows start at b T NH D + h D and its k, v rows at b T NKV D + g D
 * (g = h / group), which no single stride over a flattened (b, h) index gives, and strided
 * batches over h alone would take B launches per GEMM (16 at shape S) and still not map the
 * grouped keys (h / group). The pairs are ordered (i, b, g), i the query head within its group
 * (h = g group + i): pairs of one i write distinct dk, dv rows, so one batched GEMM adds a run
 * of them with beta 1 (beta 0 for i = 0), runs being split where i changes; dk and dv sum the
 * group's heads in the order i = 0, 1, ... (the CPU's order), without atomics: the same bits
 * every run.
 *
 * Scratch: one (T, T) f32 block per pair in the forward, two in the backward, from the caching
 * allocator, with the pointer arrays (9 per pair) before them. At most
 * FSDP_CUDA_ATTENTION_GEMM_SCRATCH bytes of blocks (1 GiB; fsdp_cuda_thread_set_attention_scratch
 * lowers it) are held at once, so the pairs run in equal chunks: at shape S (B 16, T 1024, 12/4
 * heads) the forward takes all 192 pairs in one chunk (768 MiB), the backward two of 96
 * (768 MiB); at shape M (B 4, T 2048, 32/8 heads) two chunks of 64 (1 GiB) and four of 32
 * (1 GiB). Launches per call: 1 + 3 per chunk forward, 1 + 4 per chunk + 2 per run of one i
 * backward (4 and 17 at S). Where the allocator cannot give even one pair's blocks (or one pair
 * needs more than the bound: T above 11585 backward) the entries return false and the caller
 * runs the tiled kernels. */
#include <limits.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/llama_cuda.h"

#define AG_WARPS     8     // rows per block of the row kernels: one warp per row
#define AG_MAX_PAIRS 65535 // pairs per batched GEMM at most

/* The pointer arrays, each `pairs` long: q, k, v, out (forward) or dout (backward), the score
 * block S (P), the backward's dP (dS) block, dq, and the dk and dv rows of the pair's kv head. */
enum { AQ, AK, AV, AO, AS, ADP, ADQ, ADK, ADV, AN };

typedef struct ag_bases {
    const float *q, *k, *v, *o;
    float *s, *dp, *dq, *dk, *dv; // s, dp: the chunk's blocks; dp, dq, dk, dv NULL forward
} ag_bases;

/* Pair p's batch b, query head h and key-value head g (the order (i, b, g) above). */
__device__ inline void ag_pair(int64_t p, int64_t B, int64_t NH, int64_t NKV, int64_t *b,
                               int64_t *h, int64_t *g) {
    int64_t bg = B * NKV, r = p % bg;
    *b = r / NKV;
    *g = r % NKV;
    *h = *g * (NH / NKV) + p / bg;
}

/* arr[a * pairs + p]: pair p's pointer a; its blocks are slot p % chunk of the chunk's. */
__global__ void ag_pointers_kernel(void **arr, ag_bases x, int64_t pairs, int64_t chunk, int64_t B,
                                   int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, b, h, g;
    if (p >= pairs) return;
    ag_pair(p, B, NH, NKV, &b, &h, &g);
    int64_t qo = b * T * NH * D + h * D, ko = b * T * NKV * D + g * D, so = (p % chunk) * T * T;
    arr[AQ * pairs + p] = (void *)(x.q + qo);
    arr[AK * pairs + p] = (void *)(x.k + ko);
    arr[AV * pairs + p] = (void *)(x.v + ko);
    arr[AO * pairs + p] = (void *)(x.o + qo);
    arr[AS * pairs + p] = x.s + so;
    arr[ADP * pairs + p] = x.dp ? x.dp + so : NULL;
    arr[ADQ * pairs + p] = x.dq ? x.dq + qo : NULL;
    arr[ADK * pairs + p] = x.dk ? x.dk + ko : NULL;
    arr[ADV * pairs + p] = x.dv ? x.dv + ko : NULL;
}

/* Butterfly reductions over a warp: every lane ends with the same bits (a + b == b + a). */
__device__ inline float ag_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ inline double ag_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The row of the warp: rows of pairs p0 .. p0 + n - 1 in order; false past them. */
__device__ inline bool ag_row(int64_t p0, int64_t n, int64_t T, int64_t *p, int64_t *i) {
    int64_t row = (int64_t)blockIdx.x * AG_WARPS + threadIdx.x / 32;
    if (row >= n * T) return false;
    *p = p0 + row / T;
    *i = row % T;
    return true;
}

/* Forward, per score row i of a pair (s: its block, scale already applied by the GEMM):
 * lse_i = m + log sum_{j <= i} exp(s_j - m), then s_j = exp(s_j - lse_i) for j <= i, 0 above. */
__global__ void __launch_bounds__(AG_WARPS * 32)
    ag_softmax_kernel(float *lse, float *sblocks, int64_t p0, int64_t n, int64_t chunk, int64_t B,
                      int64_t T, int64_t NH, int64_t NKV) {
    int64_t p, i, b, h, g;
    if (!ag_row(p0, n, T, &p, &i)) return; // the whole warp: the shuffles below stay full
    ag_pair(p, B, NH, NKV, &b, &h, &g);
    int lane = threadIdx.x % 32;
    float *s = sblocks + ((p % chunk) * T + i) * T; // (T)
    float m = -INFINITY;
    for (int64_t j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
    m = ag_warp_max(m);
    double se = 0.0;
    for (int64_t j = lane; j <= i; j += 32) se += exp((double)s[j] - (double)m);
    double l = (double)m + log(ag_warp_sum(se));
    if (lane == 0) lse[(b * NH + h) * T + i] = (float)l;
    for (int64_t j = lane; j < T; j += 32) s[j] = j <= i ? (float)exp((double)s[j] - l) : 0.0f;
}

/* Backward, per row i of a pair: P_j = exp(s_j - lse_i) over s and dS_j = P_j (dP_j - delta_i)
 * over dp for j <= i (0 above), delta_i = dout_i . out_i in double. */
__global__ void __launch_bounds__(AG_WARPS * 32)
    ag_grad_rows_kernel(float *sblocks, float *dpblocks, const float *lse, const float *dout,
                        const float *out, int64_t p0, int64_t n, int64_t chunk, int64_t B,
                        int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    int64_t p, i, b, h, g;
    if (!ag_row(p0, n, T, &p, &i)) return;
    ag_pair(p, B, NH, NKV, &b, &h, &g);
    int lane = threadIdx.x % 32;
    int64_t at = ((p % chunk) * T + i) * T, ro = ((b * T + i) * NH + h) * D;
    float *s = sblocks + at, *dp = dpblocks + at; // (T) each
    double di = 0.0;
    for (int64_t d = lane; d < D; d += 32) di += (double)dout[ro + d] * (double)out[ro + d];
    di = ag_warp_sum(di);
    double l = (double)lse[(b * NH + h) * T + i];
    for (int64_t j = lane; j < T; j += 32) {
        float pj = 0.0f, ds = 0.0f;
        if (j <= i) {
            pj = (float)exp((double)s[j] - l);
            ds = pj * (float)((double)dp[j] - di);
        }
        s[j] = pj;
        dp[j] = ds;
    }
}

/* Row-major C_p (M, N) = alpha op(A_p) op(B_p) + beta C_p for `count` pairs of pointer arrays
 * (column-major cuBLAS gets B before A, as gemm.c), f32, TF32 where this thread's f32 GEMMs
 * may use it (fsdp_cuda_thread_tf32, as the table's gemm). */
static void ag_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, void *const *A,
                    int64_t lda, void *const *B, int64_t ldb, float beta, void *const *C,
                    int64_t ldc, int64_t count) {
    cublasComputeType_t compute =
        fsdp_cuda_thread_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    FSDP_CUDA_CHECK_BLAS(cublasGemmBatchedEx(
        fsdp_cuda_blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N,
        (int)M, (int)K, &alpha, (const void *const *)B, CUDA_R_32F, (int)ldb,
        (const void *const *)A, CUDA_R_32F, (int)lda, &beta, C, CUDA_R_32F, (int)ldc, (int)count,
        compute, CUBLAS_GEMM_DEFAULT));
    fsdp_cuda_count_launch(-1);
}

/* The score blocks S = q k^T scale of pairs p0 .. p0 + n - 1 (one batched GEMM): the forward's,
 * and the backward's recomputation. */
static void ag_scores(void **a, int64_t pairs, int64_t p0, int64_t n, int64_t T, int64_t NH,
                      int64_t NKV, int64_t D, float scale) {
    ag_gemm(false, true, T, T, D, scale, a + AQ * pairs + p0, NH * D, a + AK * pairs + p0, NKV * D,
            0.0f, a + AS * pairs + p0, T, n);
}

static thread_local size_t scratch_bound = 0; // 0: FSDP_CUDA_ATTENTION_GEMM_SCRATCH

extern "C" void fsdp_cuda_thread_set_attention_scratch(size_t bytes) {
    scratch_bound = bytes;
}

/* One call's scratch: the pointer arrays, then `blocks` (T, T) blocks per pair of a chunk. */
typedef struct ag_scratch {
    void **arr;
    float *blocks; // (blocks, chunk, T, T)
    int64_t chunk;
    int device;
} ag_scratch;

static size_t align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* Equal chunks of at most `most` pairs. */
static int64_t ag_chunk(int64_t pairs, int64_t most) {
    int64_t chunks = (pairs + most - 1) / most;
    return (pairs + chunks - 1) / chunks;
}

/* Takes the scratch from the allocator, halving the chunk while it cannot; false where not
 * even one pair's blocks fit the bound or the allocator. */
static bool ag_scratch_take(ag_scratch *sc, int blocks, int64_t pairs, int64_t T) {
    size_t bound = scratch_bound ? scratch_bound : FSDP_CUDA_ATTENTION_GEMM_SCRATCH;
    int64_t most = (int64_t)(bound / (size_t)blocks / (size_t)T / (size_t)T / sizeof(float));
    if (most < 1) return false;
    if (most > AG_MAX_PAIRS) most = AG_MAX_PAIRS;
    FSDP_CUDA_CHECK(cudaGetDevice(&sc->device));
    size_t arrays = align256((size_t)(AN * pairs) * sizeof(void *));
    size_t block = (size_t)(T * T) * sizeof(float);
    for (sc->chunk = ag_chunk(pairs, most);; sc->chunk = ag_chunk(pairs, (sc->chunk + 1) / 2)) {
        void *mem = NULL;
        size_t bytes = arrays + (size_t)blocks * (size_t)sc->chunk * block;
        if (fsdp_cuda_block_alloc(NULL, sc->device, bytes, &mem) == FSDP_OK) {
            sc->arr = (void **)mem;
            sc->blocks = (float *)((char *)mem + arrays);
            return true;
        }
        if (sc->chunk == 1) return false;
    }
}

/* Fills the pointer arrays of every pair (one launch). */
static void ag_pointers(const ag_scratch *sc, ag_bases x, int64_t pairs, int64_t B, int64_t T,
                        int64_t NH, int64_t NKV, int64_t D) {
    ag_pointers_kernel<<<(unsigned)((pairs + 255) / 256), 256, 0, fsdp_cuda_stream()>>>(
        sc->arr, x, pairs, sc->chunk, B, T, NH, NKV, D);
    FSDP_CUDA_LAUNCHED("attention (gemm pointers)");
}

static unsigned ag_row_grid(int64_t n, int64_t T) {
    FSDP_ASSERT((n * T + AG_WARPS - 1) / AG_WARPS <= INT_MAX);
    return (unsigned)((n * T + AG_WARPS - 1) / AG_WARPS);
}

static void ag_check_sizes(int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    FSDP_ASSERT(NH % NKV == 0);
    FSDP_ASSERT(T <= INT_MAX && NH * D <= INT_MAX && NKV * D <= INT_MAX);
}

extern "C" bool fsdp_cuda_attention_forward_gemm(float *out, float *lse, const float *q,
                                                 const float *k, const float *v, int64_t B,
                                                 int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0) return true;
    ag_check_sizes(T, NH, NKV, D);
    int64_t pairs = B * NH;
    ag_scratch sc;
    if (!ag_scratch_take(&sc, 1, pairs, T)) return false;
    ag_pointers(&sc, ag_bases{q, k, v, out, sc.blocks, NULL, NULL, NULL, NULL}, pairs, B, T, NH,
                NKV, D);
    void **a = sc.arr;
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t p0 = 0; p0 < pairs; p0 += sc.chunk) {
        int64_t n = pairs - p0 < sc.chunk ? pairs - p0 : sc.chunk;
        ag_scores(a, pairs, p0, n, T, NH, NKV, D, scale);
        ag_softmax_kernel<<<ag_row_grid(n, T), AG_WARPS * 32, 0, fsdp_cuda_stream()>>>(
            lse, sc.blocks, p0, n, sc.chunk, B, T, NH, NKV);
        FSDP_CUDA_LAUNCHED("attention_forward (gemm softmax)");
        ag_gemm(false, false, T, D, T, 1.0f, a + AS * pairs + p0, T, a + AV * pairs + p0, NKV * D,
                0.0f, a + AO * pairs + p0, NH * D, n);
    }
    fsdp_cuda_block_free(sc.device, sc.arr); // after the work on this stream (the allocator's)
    return true;
}

extern "C" bool fsdp_cuda_attention_backward_gemm(float *dq, float *dk, float *dv,
                                                  const float *dout, const float *q, const float *k,
                                                  const float *v, const float *out,
                                                  const float *lse, int64_t B, int64_t T,
                                                  int64_t NH, int64_t NKV, int64_t D) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0) return true;
    ag_check_sizes(T, NH, NKV, D);
    int64_t pairs = B * NH, bg = B * NKV;
    ag_scratch sc;
    if (!ag_scratch_take(&sc, 2, pairs, T)) return false;
    float *dpb = sc.blocks + sc.chunk * T * T;
    ag_pointers(&sc, ag_bases{q, k, v, dout, sc.blocks, dpb, dq, dk, dv}, pairs, B, T, NH, NKV, D);
    void **a = sc.arr;
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t p0 = 0; p0 < pairs; p0 += sc.chunk) {
        int64_t n = pairs - p0 < sc.chunk ? pairs - p0 : sc.chunk;
        ag_scores(a, pairs, p0, n, T, NH, NKV, D, scale);
        ag_gemm(false, true, T, T, D, 1.0f, a + AO * pairs + p0, NH * D, a + AV * pairs + p0,
                NKV * D, 0.0f, a + ADP * pairs + p0, T, n);
        ag_grad_rows_kernel<<<ag_row_grid(n, T), AG_WARPS * 32, 0, fsdp_cuda_stream()>>>(
            sc.blocks, dpb, lse, dout, out, p0, n, sc.chunk, B, T, NH, NKV, D);
        FSDP_CUDA_LAUNCHED("attention_backward (gemm rows)");
        ag_gemm(false, false, T, D, T, scale, a + ADP * pairs + p0, T, a + AK * pairs + p0, NKV * D,
                0.0f, a + ADQ * pairs + p0, NH * D, n);
        for (int64_t r0 = p0; r0 < p0 + n;) { // runs of one query head i within the group
            int64_t r1 = (r0 / bg + 1) * bg;
            if (r1 > p0 + n) r1 = p0 + n;
            float beta = r0 < bg ? 0.0f : 1.0f; // i = 0 writes, the later heads add
            ag_gemm(true, false, T, D, T, 1.0f, a + AS * pairs + r0, T, a + AO * pairs + r0, NH * D,
                    beta, a + ADV * pairs + r0, NKV * D, r1 - r0);
            ag_gemm(true, false, T, D, T, scale, a + ADP * pairs + r0, T, a + AQ * pairs + r0,
                    NH * D, beta, a + ADK * pairs + r0, NKV * D, r1 - r0);
            r0 = r1;
        }
    }
    fsdp_cuda_block_free(sc.device, sc.arr);
    return true;
}
