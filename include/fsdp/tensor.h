/* tensor.h: fsdp_tensor, a contiguous n-d array (up to 4 dims) of f32, bf16 or f16 (or i32
 * token ids) on one device.
 *
 * Ownership: every fsdp_tensor handle is owned by whoever created it and released with
 * fsdp_tensor_free. Handles share reference-counted storage: a view keeps its storage alive
 * after its base is freed, and the storage is released with the last handle. A tensor made
 * by fsdp_tensor_from_blob never frees the caller's memory, which must outlive it. */
#ifndef FSDP_TENSOR_H
#define FSDP_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_MAX_DIMS 4

typedef enum fsdp_dtype {
    FSDP_DTYPE_F32 = 0,
    FSDP_DTYPE_BF16 = 1, /* storage type: kernels compute in f32 */
    FSDP_DTYPE_I32 = 2,  /* integers: token ids and class targets (never a parameter) */
    FSDP_DTYPE_F16 = 3,  /* IEEE binary16, a storage type like bf16 */
    FSDP_DTYPE_COUNT
} fsdp_dtype;

/* The kinds of device. FSDP_DEVICE_SIM is a simulated GPU, built in every build: CPU kernels
 * run asynchronously on streams over memory the host cannot read (docs/device.md); tests and CI
 * run the device path on it where no GPU is present. */
typedef enum fsdp_device_type {
    FSDP_DEVICE_CPU = 0,
    FSDP_DEVICE_CUDA = 1,
    FSDP_DEVICE_SIM = 2,
    FSDP_DEVICE_KINDS /* how many kinds there are */
} fsdp_device_type;

typedef struct fsdp_device {
    fsdp_device_type type;
    int index; /* GPU (or simulated GPU) ordinal; 0 for the CPU */
} fsdp_device;

#define FSDP_CPU ((fsdp_device){FSDP_DEVICE_CPU, 0})

typedef uint16_t fsdp_bf16;
typedef uint16_t fsdp_f16; /* IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits */

typedef struct fsdp_tensor fsdp_tensor;

/* How many devices of a type this build can use on this machine: 1 for the CPU; for CUDA, the
 * visible GPUs (0 when the build has no CUDA support or no GPU is usable). */
int fsdp_device_count(fsdp_device_type type);

/* Waits until `device` has finished the work the calling rank queued on it (kernels run
 * asynchronously on a GPU; reading a value back to the host already waits). Nothing to do for
 * the CPU. For timing and for handing device memory to code outside libfsdp. */
fsdp_status fsdp_device_synchronize(fsdp_ctx *ctx, fsdp_device device);

/* The caching allocator of a GPU (or simulated GPU), over every thread of the process that
 * uses the device: what torch.cuda.memory_allocated, max_memory_allocated, memory_reserved and
 * max_memory_reserved report. Bytes are the allocator's rounded blocks (under 1 MiB a multiple
 * of 512 bytes, from 1 MiB a multiple of 2 MiB), so in_use is at least the bytes asked for.
 * Tensors, layers' buffers and scratch, FSDP's gathered parameters, communication buffers and
 * cuBLASLt's and cuDNN's workspaces all come from it; not counted: what CUDA, cuBLAS, cuDNN or
 * NCCL allocate themselves (their contexts and internal buffers) and pinned host memory. */
typedef struct fsdp_device_memory {
    int64_t in_use;        /* bytes handed out and not yet freed */
    int64_t peak_in_use;   /* the most in_use since the process began or the last reset */
    int64_t reserved;      /* bytes held from the device: in use plus cached for reuse */
    int64_t peak_reserved; /* the most reserved since the process began or the last reset */
    int64_t device_allocs; /* blocks taken from the device (cudaMalloc calls that succeeded) */
    int64_t cache_hits;    /* allocations served from the cache */
    int64_t capacity;      /* the device's memory (a GPU's total; sim: FSDP_SIM_MEMORY) */
} fsdp_device_memory;

/* The allocator figures of a cuda or sim device (zeros but capacity before its first use).
 * The CPU keeps none: FSDP_ERR_UNSUPPORTED; a device this build or machine lacks:
 * FSDP_ERR_DEVICE. */
fsdp_status fsdp_device_memory_stats(fsdp_ctx *ctx, fsdp_device device, fsdp_device_memory *out);
/* Starts the peaks over from the present in_use and reserved (torch.cuda.
 * reset_peak_memory_stats), e.g. before the part of a run to measure. Errors as above. */
fsdp_status fsdp_device_reset_peak_memory(fsdp_ctx *ctx, fsdp_device device);
/* Gives the device's cached free blocks back to it once the work that last used them has
 * finished (torch.cuda.empty_cache): reserved drops to in_use, and the memory is free for other
 * processes and libraries. In-use memory is untouched; later allocations are slower until the
 * cache fills again. Errors as above. */
fsdp_status fsdp_device_empty_cache(fsdp_ctx *ctx, fsdp_device device);

/* What a device is (torch.cuda.get_device_properties), and the dense peak throughputs of its
 * GEMMs that model-FLOP utilisation (MFU) is measured against. */
typedef struct fsdp_device_properties {
    char name[256];       /* a GPU's name as CUDA gives it ("NVIDIA H200"); "sim"; "cpu" */
    int64_t total_memory; /* bytes of device memory (sim: FSDP_SIM_MEMORY); 0 on the CPU */
    int major, minor;     /* CUDA compute capability (9, 0 on an H100); 0 elsewhere */
    int multiprocessors;  /* CUDA's streaming multiprocessors; 0 elsewhere */
    /* Dense peak TFLOP/s from the maker's data sheet (without sparsity) of f32 GEMMs, of f32
     * GEMMs on TF32 tensor cores (fsdp_cuda_set_allow_tf32) and of bf16 GEMMs with f32
     * accumulation; 0 where this libfsdp keeps no figure for the device (sim, the CPU, a GPU
     * outside its table: A100, H100 SXM and PCIe, H200, GH200). */
    double peak_tflops_f32, peak_tflops_tf32, peak_tflops_bf16;
} fsdp_device_properties;

/* *out <- the device's properties. Works for every device this build and machine have (the
 * CPU: name "cpu", nothing else known); another: FSDP_ERR_DEVICE. */
fsdp_status fsdp_device_get_properties(fsdp_ctx *ctx, fsdp_device device,
                                       fsdp_device_properties *out);

/* The device a rank computes on (default: the cpu). Setting it checks that the device exists
 * and gives the rank its streams there: its compute stream (the calling thread's default stream
 * of the device, where its kernels run) and a communication stream of its own, made on first
 * use and released with the context. Streams and events are internal (src/core/stream.h). */
fsdp_status fsdp_ctx_set_device(fsdp_ctx *ctx, fsdp_device device);
fsdp_device fsdp_ctx_device(const fsdp_ctx *ctx);

size_t fsdp_dtype_size(fsdp_dtype dtype);              /* bytes per element; 0 if unknown */
const char *fsdp_dtype_to_string(fsdp_dtype dtype);    /* "f32", "bf16", "i32", "f16" */
const char *fsdp_device_to_string(fsdp_device device); /* "cpu", "cuda", "sim" */

/* bf16 <-> f32, round to nearest even; NaN stays NaN. */
fsdp_bf16 fsdp_bf16_from_f32(float x);
float fsdp_bf16_to_f32(fsdp_bf16 x);
/* f32 -> f16 as torch's .to(torch.float16): round to nearest even, also into the subnormals
 * (steps of 2^-24); magnitudes from 65520 up (and inf) become inf; a NaN stays a quiet NaN
 * with x's sign and the top 10 bits of its payload (as torch's CPU conversion). f16 -> f32 is
 * exact (NaN stays NaN, its payload kept). */
fsdp_f16 fsdp_f16_from_f32(float x);
float fsdp_f16_to_f32(fsdp_f16 x);

/* A new zero-filled tensor. shape has ndim entries, each >= 0 (0 makes an empty tensor);
 * ndim is 0 (a scalar) to FSDP_MAX_DIMS. */
fsdp_status fsdp_tensor_create(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device, int ndim,
                               const int64_t *shape, fsdp_tensor **out);
/* fsdp_tensor_create without the zero fill (torch.empty): the elements are unspecified until
 * written, so write every element before reading any. On a GPU this saves a memset pass over
 * the memory; the simulated device fills it with 0xFF bytes (NaN in the float dtypes, -1 in
 * i32) so that a read before the write shows. */
fsdp_status fsdp_tensor_create_uninit(fsdp_ctx *ctx, fsdp_dtype dtype, fsdp_device device, int ndim,
                                      const int64_t *shape, fsdp_tensor **out);
/* A new zero-filled tensor with src's dtype, device and shape. */
fsdp_status fsdp_tensor_create_like(fsdp_ctx *ctx, const fsdp_tensor *src, fsdp_tensor **out);
/* Wraps caller memory (not copied, never freed by libfsdp). */
fsdp_status fsdp_tensor_from_blob(fsdp_ctx *ctx, void *data, fsdp_dtype dtype, fsdp_device device,
                                  int ndim, const int64_t *shape, fsdp_tensor **out);
/* A view of numel(shape) elements of base starting at element `offset`; shares base's storage. */
fsdp_status fsdp_tensor_view(fsdp_ctx *ctx, const fsdp_tensor *base, int64_t offset, int ndim,
                             const int64_t *shape, fsdp_tensor **out);
/* Changes the shape of an existing handle. Storage is kept when it is large enough;
 * otherwise new zeroed storage is allocated, which only an owning tensor that shares its
 * storage with no other handle may do (FSDP_ERR_STATE otherwise). Module buffers are
 * resized this way, so steady-state steps allocate nothing. */
fsdp_status fsdp_tensor_resize(fsdp_ctx *ctx, fsdp_tensor *t, int ndim, const int64_t *shape);
void fsdp_tensor_free(fsdp_tensor *t); /* NULL does nothing */

fsdp_dtype fsdp_tensor_dtype(const fsdp_tensor *t);
fsdp_device fsdp_tensor_device(const fsdp_tensor *t);
int fsdp_tensor_ndim(const fsdp_tensor *t);
/* Size of dimension `dim`; negative dims count from the end (-1 is the last). */
int64_t fsdp_tensor_dim(const fsdp_tensor *t, int dim);
const int64_t *fsdp_tensor_shape(const fsdp_tensor *t);
int64_t fsdp_tensor_numel(const fsdp_tensor *t);
size_t fsdp_tensor_nbytes(const fsdp_tensor *t);
/* First element. The memory belongs to the tensor's storage. NULL when the tensor has no
 * storage (see fsdp_tensor_has_storage). */
void *fsdp_tensor_data(const fsdp_tensor *t);
/* False for a tensor that keeps its shape but holds no memory: the parameters (and
 * gradients) of an FSDP unit while it is sharded. Copying or filling one is an error. */
bool fsdp_tensor_has_storage(const fsdp_tensor *t);
/* First element as float*, or NULL when the tensor is not f32. */
float *fsdp_tensor_f32(const fsdp_tensor *t);
bool fsdp_tensor_same_shape(const fsdp_tensor *a, const fsdp_tensor *b);
/* Formats the shape as "(12, 10)" into buf ("(12,)" for one dim, "()" for none, as Python
 * writes a tuple); returns buf. */
const char *fsdp_tensor_shape_string(const fsdp_tensor *t, char *buf, size_t size);
/* The same for any shape of ndim sizes (a checkpoint's, a file's). */
const char *fsdp_shape_string(int ndim, const int64_t *shape, char *buf, size_t size);

/* dst <- src. Same numel; dtypes may differ (f32 <-> bf16 and f32 <-> f16 conversion). */
fsdp_status fsdp_tensor_copy(fsdp_ctx *ctx, fsdp_tensor *dst, const fsdp_tensor *src);
fsdp_status fsdp_tensor_fill(fsdp_ctx *ctx, fsdp_tensor *t, float value);

#ifdef __cplusplus
}
#endif
#endif
