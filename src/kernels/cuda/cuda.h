/* cuda.h: what the CUDA device offers beyond its record (core/device.h) and its operator table:
 * the probe that tests skip on, the caching allocator's counters, TF32 and the library of this
 * thread's GEMMs (cuBLAS or cuBLASLt, with the cuBLASLt heuristics' cache counters) and its
 * attention kernels. Internal to libfsdp (tests and benchmarks read it); it includes no
 * CUDA header, so any C file can include it. */
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

/* The caching allocator of one device (all threads together). Sizes are of the rounded blocks:
 * under 1 MiB a multiple of 512 bytes, from 1 MiB a multiple of 2 MiB. */
typedef struct fsdp_cuda_memory_stats {
    int64_t malloc_calls; /* cudaMalloc calls that succeeded */
    int64_t cache_hits;   /* allocations served from the cache */
    size_t reserved;      /* bytes held from cudaMalloc: in use plus cached */
    size_t in_use;        /* bytes handed out and not yet freed */
    size_t peak_in_use;   /* highest in_use so far */
} fsdp_cuda_memory_stats;

/* Zeroes when the device index is out of range or the device was never used. */
fsdp_cuda_memory_stats fsdp_cuda_memory_stats_get(int device);

/* Returns the cached (free) blocks of a device to CUDA, after the work that last used them. */
void fsdp_cuda_empty_cache(int device);

/* Whether this thread's f32 GEMMs may use TF32 tensor cores (10-bit mantissa inputs, f32
 * accumulation; about 1e-3 relative). Off by default: GEMMs are exact f32. */
void fsdp_cuda_thread_set_tf32(bool allow);
bool fsdp_cuda_thread_tf32(void);

/* Which library this thread's gemm and gemm_bf16 call: cuBLAS (cublasGemmEx) or cuBLASLt
 * (cublasLtMatmul with the algorithm of cublasLtMatmulAlgoGetHeuristic, cached per device for
 * FSDP_CUDA_LT_CACHE_SLOTS shapes, and a workspace of FSDP_CUDA_LT_WORKSPACE bytes per thread
 * and device from the caching allocator). Both compute in f32 (TF32 where this thread allows
 * it). DEFAULT follows the environment variable FSDP_CUDA_GEMM (cublas or lt, read once; unset
 * means cublas, since the cuBLASLt path has not run on a GPU yet; any other value aborts with a
 * message). */
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

/* Which kernels this thread's attention_forward / attention_backward run: the plain ones (one
 * thread per score row) or the tiled FlashAttention-2-class ones (shared-memory tiles, online
 * softmax, no scratch), which cover head dimensions up to FSDP_CUDA_FLASH_MAX_D (the plain ones
 * run above). DEFAULT follows the environment variable FSDP_CUDA_ATTENTION (plain or flash, read
 * once; unset means plain, since the tiled kernels have not run on a GPU yet; any other value
 * aborts with a message). */
#define FSDP_CUDA_FLASH_MAX_D 128
typedef enum fsdp_cuda_attention {
    FSDP_CUDA_ATTENTION_DEFAULT = 0,
    FSDP_CUDA_ATTENTION_PLAIN,
    FSDP_CUDA_ATTENTION_FLASH,
} fsdp_cuda_attention;
void fsdp_cuda_thread_set_attention(fsdp_cuda_attention kind);
/* The path chosen for this thread (never DEFAULT). */
fsdp_cuda_attention fsdp_cuda_thread_attention(void);

#endif
