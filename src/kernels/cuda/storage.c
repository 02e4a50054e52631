/* storage.c: the CUDA storage interface (core/device.h): memory from the caching allocator,
 * copies, fills and conversions queued on the calling thread's default stream (its rank's
 * compute stream), and pinned host memory. Every CUDA failure becomes a status with CUDA's
 * message. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/gpu_peaks.h"

/* Makes `index` the calling thread's device, after checking that it exists. */
static fsdp_status use_device(fsdp_ctx *ctx, int index) {
    char why[160] = "";
    int count = fsdp_cuda_device_count(why, sizeof why);
    if (index < 0 || index >= count)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "device cuda:%d is not available: this machine has %d cuda device%s%s%s",
                         index, count, count == 1 ? "" : "s", count ? "" : " ", why);
    FSDP_CUDA_TRY(ctx, cudaSetDevice(index)); // cheap when it is current already
    return FSDP_OK;
}

static int cuda_device_count(void) {
    return fsdp_cuda_device_count(NULL, 0);
}

/* Zeroed on this thread's stream: the zeros come before any later work of the thread. */
static fsdp_status cuda_alloc(fsdp_ctx *ctx, int index, size_t nbytes, void **out) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    void *p = NULL;
    FSDP_TRY_AT(ctx, fsdp_cuda_block_alloc(ctx, index, nbytes, &p));
    cudaError_t err = cudaMemsetAsync(p, 0, nbytes, fsdp_cuda_stream());
    fsdp_cuda_count_launch(index);
    if (err != cudaSuccess) {
        fsdp_cuda_block_free(index, p);
        return fsdp_cuda_fail(ctx, err, __FILE__, __LINE__, "cudaMemsetAsync (zeroing)");
    }
    *out = p;
    return FSDP_OK;
}

/* A block of the cache as it is: no memset, no launch (core/device.h). */
static fsdp_status cuda_alloc_uninit(fsdp_ctx *ctx, int index, size_t nbytes, void **out) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    return fsdp_cuda_block_alloc(ctx, index, nbytes, out);
}

static void cuda_free(int index, void *ptr) {
    fsdp_cuda_block_free(index, ptr);
}

/* The device whose stream a copy runs on: dst's when it is a CUDA device, else src's. */
static int copy_device(fsdp_device dst_dev, fsdp_device src_dev) {
    return dst_dev.type == FSDP_DEVICE_CUDA ? dst_dev.index : src_dev.index;
}

/* After a copy queued on the current device's stream: counts it and, to the host, waits for it
 * (the host reads right after). */
static fsdp_status copied(fsdp_ctx *ctx, fsdp_device dst_dev) {
    fsdp_cuda_count_launch(-1);
    if (dst_dev.type != FSDP_DEVICE_CPU) return FSDP_OK;
    fsdp_cuda_count_host_wait(-1);
    FSDP_CUDA_TRY(ctx, cudaStreamSynchronize(fsdp_cuda_stream()));
    return FSDP_OK;
}

/* Device to host waits for the copy (the host reads right after). Host to device from pageable
 * memory returns once the runtime has staged the bytes, so the caller may reuse its buffer at
 * once; from pinned memory (host_alloc) it is asynchronous (core/device.h). Device to
 * device is asynchronous, in stream order. */
static fsdp_status cuda_copy(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, const void *src,
                             fsdp_device src_dev, size_t nbytes) {
    if (nbytes == 0 || dst == src) return FSDP_OK;
    FSDP_TRY_AT(ctx, use_device(ctx, copy_device(dst_dev, src_dev)));
    FSDP_CUDA_TRY(ctx, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, fsdp_cuda_stream()));
    return copied(ctx, dst_dev);
}

static fsdp_status cuda_copy_2d(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, size_t dst_pitch,
                                const void *src, fsdp_device src_dev, size_t src_pitch,
                                size_t width, size_t rows) {
    if (width == 0 || rows == 0) return FSDP_OK;
    FSDP_TRY_AT(ctx, use_device(ctx, copy_device(dst_dev, src_dev)));
    if (rows == 1)
        FSDP_CUDA_TRY(ctx, cudaMemcpyAsync(dst, src, width, cudaMemcpyDefault, fsdp_cuda_stream()));
    else
        FSDP_CUDA_TRY(ctx, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                             cudaMemcpyDefault, fsdp_cuda_stream()));
    return copied(ctx, dst_dev);
}

static fsdp_status cuda_fill(fsdp_ctx *ctx, int index, void *dst, const void *value,
                             size_t elem_size, int64_t n) {
    uint32_t bits = 0;
    if (elem_size == 4) {
        memcpy(&bits, value, 4);
    } else if (elem_size == 2) {
        uint16_t h;
        memcpy(&h, value, 2);
        bits = h;
    } else {
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "fill: elements of %zu bytes are not supported",
                         elem_size);
    }
    if (n <= 0) return FSDP_OK;
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    FSDP_CUDA_TRY(ctx, fsdp_cuda_fill_bits(dst, bits, elem_size, n));
    fsdp_cuda_count_launch(index);
    return FSDP_OK;
}

static fsdp_status cuda_convert(fsdp_ctx *ctx, int index, void *dst, fsdp_dtype dst_dtype,
                                const void *src, fsdp_dtype src_dtype, int64_t n) {
    bool narrow = dst_dtype == FSDP_DTYPE_BF16 && src_dtype == FSDP_DTYPE_F32;
    bool widen = dst_dtype == FSDP_DTYPE_F32 && src_dtype == FSDP_DTYPE_BF16;
    bool narrow16 = dst_dtype == FSDP_DTYPE_F16 && src_dtype == FSDP_DTYPE_F32;
    bool widen16 = dst_dtype == FSDP_DTYPE_F32 && src_dtype == FSDP_DTYPE_F16;
    if (!narrow && !widen && !narrow16 && !widen16)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "no conversion from %s to %s",
                         fsdp_dtype_to_string(src_dtype), fsdp_dtype_to_string(dst_dtype));
    if (n <= 0) return FSDP_OK;
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    FSDP_CUDA_TRY(ctx, cudaGetLastError()); // an earlier failure is not this conversion's
    if (narrow)
        fsdp_cuda_f32_to_bf16(dst, src, n);
    else if (widen)
        fsdp_cuda_bf16_to_f32(dst, src, n);
    else if (narrow16)
        fsdp_cuda_f32_to_f16(dst, src, n);
    else
        fsdp_cuda_f16_to_f32(dst, src, n);
    return FSDP_OK;
}

static fsdp_status cuda_synchronize(fsdp_ctx *ctx, int index) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    fsdp_cuda_count_host_wait(index);
    FSDP_CUDA_TRY(ctx, cudaStreamSynchronize(fsdp_cuda_stream()));
    return FSDP_OK;
}

/* ---- pinned host memory ---- */

static fsdp_status cuda_host_alloc(fsdp_ctx *ctx, size_t nbytes, void **out) {
    char why[160] = "";
    if (fsdp_cuda_device_count(why, sizeof why) == 0)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "pinned host memory needs a CUDA device, and there is none: %s", why);
    void *p = NULL;
    FSDP_CUDA_TRY(ctx, cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable));
    memset(p, 0, nbytes);
    *out = p;
    return FSDP_OK;
}

static void cuda_host_free(void *ptr) {
    if (ptr && cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
}

/* ---- streams and events ---- */

static fsdp_status cuda_stream_create(fsdp_ctx *ctx, int index, void **out) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    cudaStream_t s = NULL;
    FSDP_CUDA_TRY(ctx, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return FSDP_OK;
}

/* cudaStreamDestroy returns at once and frees the stream after its queued work. */
static void cuda_stream_destroy(int index, void *stream) {
    int previous = 0;
    cudaGetDevice(&previous);
    if (previous != index) cudaSetDevice(index);
    if (cudaStreamDestroy(stream) != cudaSuccess) (void)cudaGetLastError();
    if (previous != index) cudaSetDevice(previous);
}

static void *cuda_stream_current(int index) {
    return fsdp_cuda_stream_of(index) == cudaStreamPerThread ? NULL : fsdp_cuda_stream_of(index);
}

static void cuda_stream_set_current(int index, void *stream) {
    fsdp_cuda_stream_set(index, stream);
}

/* The stream a handle names (NULL: the thread's current stream of device index). */
static cudaStream_t stream_of(int index, void *handle) {
    return handle ? (cudaStream_t)handle : fsdp_cuda_stream_of(index);
}

static fsdp_status cuda_stream_synchronize(fsdp_ctx *ctx, int index, void *stream) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    fsdp_cuda_count_host_wait(index);
    FSDP_CUDA_TRY(ctx, cudaStreamSynchronize(stream_of(index, stream)));
    return FSDP_OK;
}

static fsdp_status cuda_event_create(fsdp_ctx *ctx, int index, void **out) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    cudaEvent_t e = NULL;
    FSDP_CUDA_TRY(ctx, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = e;
    return FSDP_OK;
}

static void cuda_event_destroy(int index, void *event) {
    (void)index;
    if (cudaEventDestroy(event) != cudaSuccess) (void)cudaGetLastError();
}

static fsdp_status cuda_event_record(fsdp_ctx *ctx, int index, void *event, void *stream) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    FSDP_CUDA_TRY(ctx, cudaEventRecord(event, stream_of(index, stream)));
    return FSDP_OK;
}

static fsdp_status cuda_stream_wait_event(fsdp_ctx *ctx, int index, void *stream, void *event) {
    FSDP_TRY_AT(ctx, use_device(ctx, index));
    FSDP_CUDA_TRY(ctx, cudaStreamWaitEvent(stream_of(index, stream), event, 0));
    return FSDP_OK;
}

static fsdp_status cuda_event_synchronize(fsdp_ctx *ctx, int index, void *event) {
    fsdp_cuda_count_host_wait(index);
    FSDP_CUDA_TRY(ctx, cudaEventSynchronize(event));
    return FSDP_OK;
}

static bool cuda_event_query(int index, void *event) {
    (void)index;
    cudaError_t err = cudaEventQuery(event);
    if (err == cudaErrorNotReady) (void)cudaGetLastError();
    return err == cudaSuccess;
}

static void cuda_memory_stats(int index, fsdp_device_memory *out) {
    *out = fsdp_cuda_memory_stats_get(index);
}

/* What CUDA says of the device, and the peaks of its name (kernels/gpu_peaks.c); a device CUDA
 * cannot describe keeps the zeros, named "cuda". */
static void cuda_properties(int index, fsdp_device_properties *out) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out->name, sizeof out->name, "cuda");
        return;
    }
    snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof prop.name, prop.name);
    out->total_memory = (int64_t)prop.totalGlobalMem;
    out->major = prop.major;
    out->minor = prop.minor;
    out->multiprocessors = prop.multiProcessorCount;
    fsdp_gpu_peaks(out->name, &out->peak_tflops_f32, &out->peak_tflops_tf32,
                   &out->peak_tflops_bf16);
}

static const fsdp_device_i cuda_record = {
    .name = "cuda",
    .device_count = cuda_device_count,
    .count_note = "is the driver loaded and the device visible? CUDA_VISIBLE_DEVICES selects them",
    .alloc = cuda_alloc,
    .alloc_uninit = cuda_alloc_uninit,
    .free = cuda_free,
    .copy = cuda_copy,
    .copy_2d = cuda_copy_2d,
    .fill = cuda_fill,
    .convert = cuda_convert,
    .synchronize = cuda_synchronize,
    .memory_stats = cuda_memory_stats,
    .memory_reset_peak = fsdp_cuda_memory_reset_peak,
    .empty_cache = fsdp_cuda_empty_cache,
    .properties = cuda_properties,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_current = cuda_stream_current,
    .stream_set_current = cuda_stream_set_current,
    .stream_synchronize = cuda_stream_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_synchronize = cuda_event_synchronize,
    .event_query = cuda_event_query,
    .kernels = fsdp_kernels_cuda,
};

const fsdp_device_i *fsdp_cuda_device(void) {
    return &cuda_record;
}
