/* cuda_impl.h: what the files of src/kernels/cuda share and nothing outside reads: the kernel
 * entries behind fsdp_kernels_cuda() (semantics in kernels/kernels.h), this thread's cuBLAS
 * handle and scratch memory, and CUDA error handling. */
#ifndef FSDP_KERNELS_CUDA_IMPL_H
#define FSDP_KERNELS_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"
#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"

/* ---- errors ---- */

/* A CUDA failure as a status: FSDP_ERR_OUT_OF_MEMORY for cudaErrorMemoryAllocation, else
 * FSDP_ERR_DEVICE; the message names what failed and CUDA's own words. Clears the error. */
fsdp_status fsdp_cuda_fail(fsdp_ctx *ctx, cudaError_t err, const char *file, int line,
                           const char *what);
#define FSDP_CUDA_TRY(ctx, call)                                                                   \
    do {                                                                                           \
        cudaError_t fsdp_cuda_err_ = (call);                                                       \
        if (fsdp_cuda_err_ != cudaSuccess)                                                         \
            return fsdp_cuda_fail((ctx), fsdp_cuda_err_, __FILE__, __LINE__, #call);               \
    } while (0)

/* Table entries return no status: a CUDA or cuBLAS failure inside one (a bad launch, a fault
 * left by earlier work) is reported on stderr with CUDA's message and aborts, as FSDP_ASSERT. */
void fsdp_cuda_check(cudaError_t err, const char *file, int line, const char *what);
void fsdp_cuda_check_blas(cublasStatus_t st, const char *file, int line, const char *what);
#define FSDP_CUDA_CHECK(call)      fsdp_cuda_check((call), __FILE__, __LINE__, #call)
#define FSDP_CUDA_CHECK_BLAS(call) fsdp_cuda_check_blas((call), __FILE__, __LINE__, #call)
/* The same for a cuBLASLt call: the message names cuBLASLt and the status. */
void fsdp_cuda_check_lt(cublasStatus_t st, const char *file, int line, const char *what);
#define FSDP_CUDA_CHECK_LT(call) fsdp_cuda_check_lt((call), __FILE__, __LINE__, #call)
/* After a kernel launch: counts it and checks that it was launched. */
#define FSDP_CUDA_LAUNCHED(name)                                                                   \
    (fsdp_cuda_count_launch(-1), fsdp_cuda_check(cudaGetLastError(), __FILE__, __LINE__, (name)))

/* ---- launch and host-wait counts (counts.c; cuda.h says what counts) ----
 * Called after each piece of work queued on a stream (a kernel, through FSDP_CUDA_LAUNCHED; a
 * cuBLAS, cuBLASLt, cuDNN or CUB call; a memset; a copy) and at each call that blocks the host
 * on the device (a stream or event synchronize), for `device`, or the current one when -1. */
void fsdp_cuda_count_launch(int device);
void fsdp_cuda_count_host_wait(int device);

/* ---- this thread's state (thread.c) ---- */

/* The most devices a thread keeps a current stream for. */
#define FSDP_CUDA_MAX_DEVICES 64

/* This thread's current stream of its current device (of `device`): the one set with
 * fsdp_cuda_stream_set, else its default stream (cudaStreamPerThread). Every kernel, copy and
 * fill of the CUDA device runs on it. */
cudaStream_t fsdp_cuda_stream(void);
cudaStream_t fsdp_cuda_stream_of(int device);
/* Makes `stream` (NULL: the default) this thread's current stream of `device`; returns the
 * previous setting (NULL for the default). */
cudaStream_t fsdp_cuda_stream_set(int device, cudaStream_t stream);

/* This thread's cuBLAS handle for its current device, on its current stream, with the math
 * mode of fsdp_cuda_thread_set_tf32; created on first use, destroyed when the thread exits. */
cublasHandle_t fsdp_cuda_blas(void);

/* FSDP_CUDA_SCRATCH doubles of device memory on the current device, private to this thread:
 * the block partials and results of the reductions and losses. */
#define FSDP_CUDA_SCRATCH 2048
double *fsdp_cuda_scratch(void);

/* The value at a device address, after this thread's queued work (synchronizes). */
double fsdp_cuda_fetch_double(const double *dev);

/* A number for this thread, never reused within the process. */
uint64_t fsdp_cuda_thread_serial(void);

/* This thread's cuBLASLt state (gemm_lt.c's: a handle and a workspace per device), NULL until
 * gemm_lt.c sets it. `release` (the same function on every call) is what thread.c calls with
 * it when the thread exits, before the rest of the thread's state goes: thread.c knows the
 * state only through it, so the thread's state does not depend on the GEMM code above it. */
void **fsdp_cuda_thread_lt(void (*release)(void *state));
/* The same for sdpa.c's cuDNN state (a handle and the execution plans per device). */
void **fsdp_cuda_thread_sdpa(void (*release)(void *state));

/* ---- the caching allocator (allocator.c) ---- */

/* nbytes (> 0) on `device`, which is current; not zeroed. Freed with fsdp_cuda_block_free from
 * any thread (NULL does nothing). */
fsdp_status fsdp_cuda_block_alloc(fsdp_ctx *ctx, int device, size_t nbytes, void **out);
void fsdp_cuda_block_free(int device, void *ptr);

/* ---- launch shapes ---- */

#define FSDP_CUDA_THREADS    256
#define FSDP_CUDA_MAX_BLOCKS 16384
/* Whether p is aligned to 16 bytes (a float4). */
#define FSDP_CUDA_ALIGNED16(p) ((((uintptr_t)(const void *)(p)) & 15u) == 0)

/* ---- kernels: one function per table entry, then helpers ---- */

/* gemm.c: one GEMM as both libraries take it, after the table's checks (M, N, K > 0, every
 * size and leading dimension within int, each leading dimension at least its row's length):
 * row-major C (M, N) = alpha op(A) op(B) + beta C, A and B of ab_type, C f32. */
typedef struct fsdp_cuda_gemm_args {
    bool trans_a, trans_b;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const void *A, *B;
    float *C;
    cudaDataType_t ab_type;      // CUDA_R_32F or CUDA_R_16BF
    cublasComputeType_t compute; // CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_FAST_TF32
    /* cuBLASLt only (epilogue.c sets them, cuBLAS refuses them): a cublasLtEpilogue_t (0: none,
     * as CUBLASLT_EPILOGUE_DEFAULT); its f32 bias (read) or bias gradient (written) vector; the
     * f32 GELU input it saves (aux, row-major rows of aux_ld floats, aux_ld a multiple of 8). */
    int epilogue;
    float *bias;
    float *aux;
    int64_t aux_ld;
} fsdp_cuda_gemm_args;
void fsdp_cuda_gemm_cublas(const fsdp_cuda_gemm_args *g);
/* gemm_lt.c: the same through cuBLASLt (its heuristic cached); false, having done nothing,
 * where cuBLASLt has no algorithm for the key (the caller runs fsdp_cuda_gemm_cublas). */
bool fsdp_cuda_gemm_lt(const fsdp_cuda_gemm_args *g);
void fsdp_cuda_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc);
/* epilogue.c: the fused entries, through cuBLASLt's epilogues when this thread runs its GEMMs
 * there and cuBLASLt has an algorithm, else the separate entries */
void fsdp_cuda_gemm_bias_act(float *out, float *pre, const float *inp, const float *weight,
                             const float *bias, int64_t rows, int64_t C, int64_t OC,
                             fsdp_gemm_act act);
void fsdp_cuda_gemm_bf16_bias_act(float *out, float *pre, const fsdp_bf16 *inp,
                                  const fsdp_bf16 *weight, const float *bias, int64_t rows,
                                  int64_t C, int64_t OC, fsdp_gemm_act act);
void fsdp_cuda_gemm_bgrad(float *dweight, float *dbias, const float *dout, const float *inp,
                          int64_t rows, int64_t C, int64_t OC);
/* bias.cu */
void fsdp_cuda_bias_add(float *out, const float *bias, int64_t rows, int64_t cols);
void fsdp_cuda_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols);
/* C (M, N), row stride ldc, = beta * C (0 when beta == 0): GEMM with K == 0 */
void fsdp_cuda_scale_matrix(float *C, int64_t ldc, int64_t M, int64_t N, float beta);

/* activation.cu */
void fsdp_cuda_relu_forward(float *out, const float *inp, int64_t n);
void fsdp_cuda_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void fsdp_cuda_sigmoid_forward(float *out, const float *inp, int64_t n);
void fsdp_cuda_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t n);
void fsdp_cuda_gelu_forward(float *out, const float *inp, int64_t n);
void fsdp_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

/* norm.cu */
void fsdp_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                               float eps, int64_t rows, int64_t cols);
void fsdp_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                const float *weight, const float *rstd, int64_t rows, int64_t cols);
void fsdp_cuda_rmsnorm_forward_bf16(fsdp_bf16 *out, float *rstd, const float *inp,
                                    const float *weight, float eps, int64_t rows, int64_t cols);
void fsdp_cuda_rmsnorm_backward_add(float *dinp, float *dweight, const float *dout,
                                    const float *dres, const float *inp, const float *weight,
                                    const float *rstd, int64_t rows, int64_t cols);

/* elementwise.cu */
void fsdp_cuda_add(float *out, const float *a, const float *b, int64_t n);
void fsdp_cuda_add3(float *out, const float *a, const float *b, const float *c, int64_t n);
void fsdp_cuda_add3_round_bf16(float *out, const float *a, const float *b, const float *c,
                               int64_t n);
void fsdp_cuda_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n);
void fsdp_cuda_axpy(float *y, float alpha, const float *x, int64_t n);
void fsdp_cuda_scale(float *out, const float *inp, float alpha, int64_t n);
void fsdp_cuda_copy(float *dst, const float *src, int64_t n);
void fsdp_cuda_fill(float *out, float value, int64_t n);
/* n elements of elem_size (2 or 4) bytes at dst set to `bits`; returns the launch status */
cudaError_t fsdp_cuda_fill_bits(void *dst, uint32_t bits, size_t elem_size, int64_t n);

/* reduce.cu */
double fsdp_cuda_sum(const float *x, int64_t n);
double fsdp_cuda_sum_squares(const float *x, int64_t n);
double fsdp_cuda_max_abs(const float *x, int64_t n);
/* dst (cols) += sum over rows r of a[r, c] * b[r, c] * scale[r] in double, as
 * fsdp_cpu_column_sum does, in another fixed order (interleaved partials per chunk of rows, then
 * the chunks): the same bits every run, not the CPU's bits; b and scale may be NULL (read as 1). */
void fsdp_cuda_column_sum(float *dst, const float *a, const float *b, const float *scale,
                          int64_t rows, int64_t cols);
/* dst (cols) += the sum over k < chunks of chunk_sums[k * cols + c], in k's order (the second
 * pass of fsdp_cuda_column_sum, and of RMSNorm's fused weight gradient) */
void fsdp_cuda_column_chunks(float *dst, const double *chunk_sums, int64_t chunks, int64_t cols);

/* reduce_n.cu */
void fsdp_cuda_reduce_n(void *out, const void *const *in, int n, int64_t count, fsdp_dtype dtype,
                        const fsdp_reduce_n_args *args);

/* loss.cu */
void fsdp_cuda_mse_loss(float *loss, float *dout, const float *out, const float *target, int64_t n);
void fsdp_cuda_cross_entropy(float *loss, float *dlogits, const float *logits,
                             const int32_t *targets, int64_t rows, int64_t classes);

/* convert.cu */
void fsdp_cuda_f32_to_bf16(fsdp_bf16 *dst, const float *src, int64_t n);
void fsdp_cuda_round_bf16(float *x, int64_t n);
void fsdp_cuda_bf16_to_f32(float *dst, const fsdp_bf16 *src, int64_t n);
void fsdp_cuda_f32_to_f16(fsdp_f16 *dst, const float *src, int64_t n);
void fsdp_cuda_f16_to_f32(float *dst, const fsdp_f16 *src, int64_t n);

/* optim.cu */
void fsdp_cuda_sgd_update(float *p, const float *g, float *buf, int64_t n,
                          const fsdp_sgd_step_args *a);
void fsdp_cuda_adam_update(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                           const fsdp_adam_step_args *a);
void fsdp_cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                         float beta, float *C, int64_t ldc);
/* gemm_bf16_round.c: the table's gemm_bf16_round (bf16 C written by cuBLAS) */
void fsdp_cuda_gemm_bf16_round(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                               fsdp_bf16 *C, int64_t ldc);
void fsdp_cuda_adam_update_bf16(float *p, fsdp_bf16 *p_bf16, const float *g, float *m, float *v,
                                float *vmax, int64_t n, const fsdp_adam_step_args *a);
void fsdp_cuda_adam_update_multi(const fsdp_adam_tensor *t, int count,
                                 const fsdp_adam_step_args *a);
void fsdp_cuda_fill_multi(float *const *out, const int64_t *n, int count, float value);

#ifdef __cplusplus
}
#endif

#endif
