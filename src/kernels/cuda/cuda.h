/* cuda.h: what the CUDA device offers beyond its record (core/device.h) and its operator table:
 * the probe that tests skip on, the caching allocator's counters, the launch and host-wait
 * counts, TF32 and the library of this thread's GEMMs (cuBLAS or cuBLASLt, with the cuBLASLt
 * heuristics' cache counters) and its attention kernels. Internal to libfsdp (tests and benchmarks
 * read it); it includes no CUDA header, so any C file can include it. */
#ifndef FSDP_KERNELS_CUDA_H
#define FSDP_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/device.h"     // defines: fsdp_device_i
#include "kernels/kernels.h" // defines: fsdp_kernels_i

/* The CUDA operator table and the CUDA device's record (kernels/devices.c registers it). */
const fsdp_kernels_i *fsdp_kernels_cuda(void);
const fsdp_device_i *fsdp_cuda_device(void);

/* How many CUDA devices this process can use; when none, and why is not NULL, writes the
 * reason (the runtime's error, e.g. "cudaGetDeviceCount: CUDA driver version is insufficient
 * ...") to why. Asked once per process; leaves no CUDA error behind. */
int fsdp_cuda_device_count(char *why, size_t why_size);

/* The caching allocator of one device (all threads together), as fsdp_device_memory_stats
 * reports it: zeroes (capacity aside) when the device was never used; zeroes when the index is
 * out of range. The device's capacity is its total memory. */
fsdp_device_memory fsdp_cuda_memory_stats_get(int device);
/* Restarts the peaks from the present in_use and reserved. */
void fsdp_cuda_memory_reset_peak(int device);

/* Returns the cached (free) blocks of a device to CUDA, after the work that last used them. */
void fsdp_cuda_empty_cache(int device);

/* The launches and host waits of one device since its last reset (counts.c; zeroes for an index
 * out of range), all threads together, counted where libfsdp calls CUDA:
 *   launches:   each kernel launch, each cuBLAS, cuBLASLt or cuDNN execution and CUB sort call
 *               (one, whatever it launches inside), each memset and each copy (cudaMemcpy*Async);
 *               so an entry of the operator table may count a few (a reduction: two kernels
 *               and the copy of its value), where sim counts it once;
 *   host_waits: each cudaStreamSynchronize and cudaEventSynchronize: an event or stream
 *               synchronize, a copy to host memory, a table entry that hands a value to the host,
 *               the allocator's return of its cache and the release of a cached cuDNN plan.
 *               Not counted: cudaEventQuery (no block), cudaStreamWaitEvent (the device waits),
 *               a copy from pageable host memory (the runtime stages it and returns, though a
 *               large one can wait for staging space), and the implicit synchronisation of
 *               cudaMalloc and cudaFree (the allocator's cache avoids them in a steady step). */
fsdp_launch_counts fsdp_cuda_counts_get(int device);
void fsdp_cuda_counts_reset(int device);

/* Whether this thread's f32 GEMMs may use TF32 tensor cores (10-bit mantissa inputs, f32
 * accumulation; about 1e-3 relative). Off by default: GEMMs are exact f32. */
void fsdp_cuda_thread_set_tf32(bool allow);
bool fsdp_cuda_thread_tf32(void);

/* Which library this thread's gemm and gemm_bf16 call: cuBLAS (cublasGemmEx) or cuBLASLt
 * (cublasLtMatmul with the algorithm of cublasLtMatmulAlgoGetHeuristic, cached per device for
 * FSDP_CUDA_LT_CACHE_SLOTS shapes, and a workspace of FSDP_CUDA_LT_WORKSPACE bytes per thread
 * and device from the caching allocator). Both compute in f32 (TF32 where this thread allows
 * it). DEFAULT follows the environment variable FSDP_CUDA_GEMM (lt or cublas, read once; unset
 * means lt; any other value aborts with a message). Measured on an H200 (bench_cuda_gemm, the
 * Llama shapes' bf16 GEMMs): the two within 3% of each other alone, cuBLASLt 1.3 to 2.3 times
 * faster where its epilogue fuses a bias (and GELU), and within 1% of cublasLtMatmul called
 * directly. */
#define FSDP_CUDA_LT_CACHE_SLOTS 64
#define FSDP_CUDA_LT_WORKSPACE   ((size_t)32 << 20)
typedef enum fsdp_cuda_gemm_lib {
    FSDP_CUDA_GEMM_DEFAULT = 0,
    FSDP_CUDA_GEMM_CUBLAS,
    FSDP_CUDA_GEMM_LT,
} fsdp_cuda_gemm_lib;
void fsdp_cuda_thread_set_gemm(fsdp_cuda_gemm_lib lib);
/* The library chosen for this thread (never DEFAULT). */
fsdp_cuda_gemm_lib fsdp_cuda_thread_gemm(void);

/* The cuBLASLt path's counters on one device (all threads together; zeroes for a device out of
 * range or never used). A GEMM looks its key up (shape, transposes, leading dimensions, data
 * and compute type, the alignment of its three pointers): a hit reuses the cached algorithm, a
 * miss asks cublasLtMatmulAlgoGetHeuristic once and fills a free slot or, when all are taken,
 * replaces the least recently used entry. A key with no algorithm (the heuristic found none) is
 * cached too and runs through cublasGemmEx (a fallback). */
typedef struct fsdp_cuda_gemm_lt_stats {
    int64_t queries;   /* cublasLtMatmulAlgoGetHeuristic calls */
    int64_t hits;      /* GEMMs that found their key cached */
    int64_t evictions; /* entries replaced by a newer key */
    int64_t fallbacks; /* GEMMs run through cublasGemmEx because no algorithm was found */
    int slots_used;    /* entries held (<= FSDP_CUDA_LT_CACHE_SLOTS) */
} fsdp_cuda_gemm_lt_stats;
fsdp_cuda_gemm_lt_stats fsdp_cuda_gemm_lt_stats_get(int device);

/* Which kernels this thread's attention entries run: the plain ones (one thread per score
 * row), the tiled FlashAttention-2-class ones (shared-memory tiles, online softmax, no scratch),
 * which cover head dimensions up to FSDP_CUDA_FLASH_MAX_D (the plain ones run above), or
 * cuDNN's fused attention in bf16 (sdpa.c; where cuDNN is missing or refuses a shape, the tiled
 * kernels run it, logged once on stderr). AUTO: the tiled kernels for the f32 entries, cuDNN's
 * for the bf16 policy's (attention_forward_bf16, attention_backward_bf16); PLAIN, FLASH and
 * CUDNN run that path for both. GEMM: f32 (TF32 where this thread's GEMMs may use it) through
 * cuBLAS batched GEMMs and row kernels over (T, T) score blocks (attention_gemm.cu, PyTorch's
 * "math" SDPA), for both kinds of entry, any D; where the caching allocator cannot give one
 * (b, h) pair's blocks, the tiled kernels run it (the plain ones above FSDP_CUDA_FLASH_MAX_D).
 * DEFAULT follows the environment variable FSDP_CUDA_ATTENTION (auto, plain, flash, cudnn or
 * gemm, read once; unset means auto; any other value aborts with a message). Measured on an
 * H200 (bench_cuda_attention, shape S forward plus backward): plain 1071 ms, tiled 17.5 ms,
 * cuDNN 0.41 ms; GEMM not yet measured. */
#define FSDP_CUDA_FLASH_MAX_D 128
typedef enum fsdp_cuda_attention {
    FSDP_CUDA_ATTENTION_DEFAULT = 0,
    FSDP_CUDA_ATTENTION_PLAIN,
    FSDP_CUDA_ATTENTION_FLASH,
    FSDP_CUDA_ATTENTION_CUDNN,
    FSDP_CUDA_ATTENTION_AUTO,
    FSDP_CUDA_ATTENTION_GEMM,
} fsdp_cuda_attention;
void fsdp_cuda_thread_set_attention(fsdp_cuda_attention kind);
/* The path chosen for this thread (never DEFAULT). */
fsdp_cuda_attention fsdp_cuda_thread_attention(void);
/* The GEMM path's score blocks held at once, at most (bytes, from the caching allocator; the
 * pairs run in chunks that fit): FSDP_CUDA_ATTENTION_GEMM_SCRATCH, or what this thread set
 * (0: the default again; a bound below one pair's blocks sends every call to the tiled
 * kernels, as an allocator failure does). */
#define FSDP_CUDA_ATTENTION_GEMM_SCRATCH ((size_t)1 << 30)
void fsdp_cuda_thread_set_attention_scratch(size_t bytes);

/* ---- cuDNN's fused attention (sdpa.c) ---- */

/* The cuDNN version in use (cudnnGetVersion(), 91900 for 9.19.0), opening libcudnn.so.9 on the
 * first call (FSDP_CUDNN_LIBRARY, else the library the build found, else the loader's search
 * path); 0 where it cannot be used (a build without cuDNN's headers, no library, not cuDNN 9),
 * with the reason in why. Needs no GPU. */
size_t fsdp_cuda_cudnn_version(char *why, size_t why_size);
/* Opens the library at path as the loader would (it stays open): its version, or 0 and why. */
size_t fsdp_cuda_cudnn_try_open(const char *path, char *why, size_t why_size);
/* Builds the forward or backward graph's operations of a shape and finalizes each, without a
 * handle (so without a GPU): false with the first failure in why. */
bool fsdp_cuda_sdpa_check_ops(bool backward, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t D, char *why, size_t why_size);
/* Prints, on stderr, why cuDNN cannot be used (nothing when it can). */
void fsdp_cuda_sdpa_log_absent(void);

/* The causal grouped-query attention of the table (kernels.h) through cuDNN: the f32 entries
 * round q, k, v (out, dout) to bf16 on the stream, run the bf16 graph (f32 softmax, f32 lse,
 * bf16 out, dq, dk, dv) and widen the results; the _bf16 ones take and give bf16 tensors in the
 * same layouts, lse f32 (B, NH, T). All return false, having done nothing, where cuDNN cannot
 * run the call (no cuDNN, D not a multiple of 8 or above 128, no engine, or a tensor cuDNN would
 * be handed not 16-byte aligned, which the plans assume): the caller runs another path. Execution
 * plans are cached per thread and device, FSDP_CUDA_SDPA_CACHE_SLOTS shapes (forward and backward
 * apart), the least recently used replaced. */
#define FSDP_CUDA_SDPA_CACHE_SLOTS 16
bool fsdp_cuda_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                            int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
bool fsdp_cuda_sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
bool fsdp_cuda_sdpa_forward_bf16(fsdp_bf16 *out, float *lse, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                 const fsdp_bf16 *v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                 int64_t D);
bool fsdp_cuda_sdpa_backward_bf16(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                                  const fsdp_bf16 *dout, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                  const fsdp_bf16 *v, const fsdp_bf16 *out, const float *lse,
                                  int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);

/* This thread's plan cache on its current device. */
typedef struct fsdp_cuda_sdpa_stats {
    int64_t builds;    // graphs built (a plan made, or refused)
    int64_t hits;      // calls that found their shape cached
    int64_t evictions; // entries replaced by a newer shape
    int64_t refusals;  // shapes cuDNN could not run (their calls ran another path)
    int slots_used;    // entries held (<= FSDP_CUDA_SDPA_CACHE_SLOTS)
} fsdp_cuda_sdpa_stats;
fsdp_cuda_sdpa_stats fsdp_cuda_sdpa_stats_get(void);

#endif
