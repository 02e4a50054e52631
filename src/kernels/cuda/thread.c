/* thread.c: the CUDA state of a host thread (its current stream per device, its cuBLAS handle,
 * TF32 setting and scratch memory, freed when the thread exits), the process's device count, and
 * CUDA errors turned into statuses or, inside table entries, into an abort with CUDA's message. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>

#include "fsdp/cuda.h"
#include "kernels/cuda/cuda_impl.h"

/* ---- errors ---- */

fsdp_status fsdp_cuda_fail(fsdp_ctx *ctx, cudaError_t err, const char *file, int line,
                           const char *what) {
    (void)cudaGetLastError(); // a non-sticky error is not reported again by the next call
    fsdp_status st = err == cudaErrorMemoryAllocation ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_DEVICE;
    return fsdp_error_set(ctx, st, file, line, "CUDA: %s failed: %s (%s)", what,
                          cudaGetErrorString(err), cudaGetErrorName(err));
}

void fsdp_cuda_check(cudaError_t err, const char *file, int line, const char *what) {
    if (err == cudaSuccess) return;
    fprintf(stderr, "libfsdp: CUDA error at %s:%d: %s failed: %s (%s)\n", file, line, what,
            cudaGetErrorString(err), cudaGetErrorName(err));
    abort();
}

void fsdp_cuda_check_blas(cublasStatus_t st, const char *file, int line, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "libfsdp: cuBLAS error at %s:%d: %s failed: %s (%s)\n", file, line, what,
            cublasGetStatusString(st), cublasGetStatusName(st));
    abort();
}

void fsdp_cuda_check_lt(cublasStatus_t st, const char *file, int line, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "libfsdp: cuBLASLt error at %s:%d: %s failed: %s (%s)\n", file, line, what,
            cublasLtGetStatusString(st), cublasLtGetStatusName(st));
    abort();
}

/* ---- the device count, asked once ---- */

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int count_value;
static cudaError_t count_error;

static void count_devices(void) {
    int n = 0;
    count_error = cudaGetDeviceCount(&n);
    if (count_error != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    count_value = n;
}

int fsdp_cuda_device_count(char *why, size_t why_size) {
    pthread_once(&count_once, count_devices);
    if (count_value == 0 && why && why_size > 0) {
        if (count_error != cudaSuccess)
            snprintf(why, why_size, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(count_error),
                     cudaGetErrorName(count_error));
        else
            snprintf(why, why_size, "cudaGetDeviceCount: 0 devices");
    }
    return count_value;
}

/* ---- this thread's state ---- */

typedef struct cuda_thread {
    uint64_t serial;
    bool allow_tf32;
    cublasHandle_t blas; // on blas_device, NULL until first use
    int blas_device;
    bool blas_tf32;           // the math mode blas was last set to
    cudaStream_t blas_stream; // the stream blas was last set to
    double *scratch;          // FSDP_CUDA_SCRATCH doubles on scratch_device, NULL until first use
    int scratch_device;
    cudaStream_t current[FSDP_CUDA_MAX_DEVICES]; // NULL: the thread's default stream
    void *lt;                                    // gemm_lt.c's, NULL until it sets it
    void (*lt_release)(void *);                  // how gemm_lt.c frees it
    void *sdpa;                                  // sdpa.c's, NULL until it sets it
    void (*sdpa_release)(void *);                // how sdpa.c frees it
} cuda_thread;

static pthread_key_t thread_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static _Thread_local cuda_thread *current;
static atomic_uint_fast64_t next_serial = 1;

/* Frees what the thread holds on its devices (the thread's work there is finished or ends with
 * it: cuBLAS and cudaFree wait for it). */
static void thread_release(void *arg) {
    cuda_thread *t = arg;
    if (t->sdpa) t->sdpa_release(t->sdpa); // these read the thread's streams: first
    if (t->lt) t->lt_release(t->lt);
    if (t->blas) {
        cudaSetDevice(t->blas_device);
        cublasDestroy(t->blas);
    }
    if (t->scratch) {
        cudaSetDevice(t->scratch_device);
        cudaFree(t->scratch);
    }
    (void)cudaGetLastError();
    free(t);
}

static void make_key(void) {
    FSDP_ASSERT(pthread_key_create(&thread_key, thread_release) == 0);
}

static cuda_thread *this_thread(void) {
    if (current) return current;
    pthread_once(&key_once, make_key);
    cuda_thread *t = calloc(1, sizeof *t);
    FSDP_ASSERT(t);
    t->serial = atomic_fetch_add(&next_serial, 1);
    FSDP_ASSERT(pthread_setspecific(thread_key, t) == 0);
    current = t;
    return t;
}

uint64_t fsdp_cuda_thread_serial(void) {
    return this_thread()->serial;
}

void **fsdp_cuda_thread_lt(void (*release)(void *state)) {
    cuda_thread *t = this_thread();
    t->lt_release = release;
    return &t->lt;
}

void **fsdp_cuda_thread_sdpa(void (*release)(void *state)) {
    cuda_thread *t = this_thread();
    t->sdpa_release = release;
    return &t->sdpa;
}

void fsdp_cuda_thread_set_tf32(bool allow) {
    this_thread()->allow_tf32 = allow;
}

bool fsdp_cuda_thread_tf32(void) {
    return this_thread()->allow_tf32;
}

static int current_device(void) {
    int dev = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&dev));
    return dev;
}

cublasHandle_t fsdp_cuda_blas(void) {
    cuda_thread *t = this_thread();
    int dev = current_device();
    if (t->blas && t->blas_device != dev) { // the thread moved to another device
        int keep = dev;
        FSDP_CUDA_CHECK(cudaSetDevice(t->blas_device));
        cublasDestroy(t->blas);
        t->blas = NULL;
        FSDP_CUDA_CHECK(cudaSetDevice(keep));
    }
    if (!t->blas) {
        FSDP_CUDA_CHECK_BLAS(cublasCreate(&t->blas));
        t->blas_stream = NULL;
        t->blas_device = dev;
        t->blas_tf32 = !t->allow_tf32; // forces the mode below
    }
    cudaStream_t stream = fsdp_cuda_stream();
    if (!t->blas_stream || t->blas_stream != stream) {
        FSDP_CUDA_CHECK_BLAS(cublasSetStream(t->blas, stream));
        t->blas_stream = stream;
    }
    if (t->blas_tf32 != t->allow_tf32) {
        FSDP_CUDA_CHECK_BLAS(cublasSetMathMode(t->blas, t->allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                      : CUBLAS_DEFAULT_MATH));
        t->blas_tf32 = t->allow_tf32;
    }
    return t->blas;
}

cudaStream_t fsdp_cuda_stream_of(int device) {
    FSDP_ASSERT(device >= 0 && device < FSDP_CUDA_MAX_DEVICES);
    cudaStream_t s = this_thread()->current[device];
    return s ? s : cudaStreamPerThread;
}

cudaStream_t fsdp_cuda_stream(void) {
    return fsdp_cuda_stream_of(current_device());
}

cudaStream_t fsdp_cuda_stream_set(int device, cudaStream_t stream) {
    FSDP_ASSERT(device >= 0 && device < FSDP_CUDA_MAX_DEVICES);
    cuda_thread *t = this_thread();
    cudaStream_t previous = t->current[device];
    t->current[device] = stream;
    return previous;
}

double *fsdp_cuda_scratch(void) {
    cuda_thread *t = this_thread();
    int dev = current_device();
    if (t->scratch && t->scratch_device != dev) {
        FSDP_CUDA_CHECK(cudaSetDevice(t->scratch_device));
        FSDP_CUDA_CHECK(cudaFree(t->scratch));
        t->scratch = NULL;
        FSDP_CUDA_CHECK(cudaSetDevice(dev));
    }
    if (!t->scratch) {
        FSDP_CUDA_CHECK(cudaMalloc((void **)&t->scratch, FSDP_CUDA_SCRATCH * sizeof(double)));
        t->scratch_device = dev;
    }
    return t->scratch;
}

double fsdp_cuda_fetch_double(const double *dev) {
    double v = 0.0;
    FSDP_CUDA_CHECK(cudaMemcpyAsync(&v, dev, sizeof v, cudaMemcpyDeviceToHost, fsdp_cuda_stream()));
    fsdp_cuda_count_launch(-1);
    fsdp_cuda_count_host_wait(-1);
    FSDP_CUDA_CHECK(cudaStreamSynchronize(fsdp_cuda_stream()));
    return v;
}

fsdp_status fsdp_cuda_set_allow_tf32(fsdp_ctx *ctx, bool allow) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    (void)ctx;
    fsdp_cuda_thread_set_tf32(allow);
    return FSDP_OK;
}
