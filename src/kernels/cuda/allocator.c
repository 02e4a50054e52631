/* allocator.c: the caching allocator of device memory. Freed blocks stay cached per device and
 * serve later allocations of about their size, so a steady-state training step makes no
 * cudaMalloc (which is slow and synchronizes); several rank threads may share a device.
 *
 * Stream safety: every thread queues its work on its current stream (its own default stream
 * unless set otherwise). When a block is freed, an event is recorded on the freeing thread's
 * current stream; a taker on another stream (another thread, or the same thread on another
 * stream) makes its stream wait for that event (cudaStreamWaitEvent: no host wait), so its
 * writes cannot overtake the previous owner's queued reads and writes. The same thread on the
 * same stream reuses its blocks without waiting: its stream runs in order. Threads are told
 * apart by a serial number that is never reused (every thread's default stream has the same
 * handle, cudaStreamPerThread). A block must be freed by the thread whose stream last
 * used it (one rank = one thread), or after that thread's work has finished. */
#include <pthread.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_impl.h"

#define MAX_DEVICES  64
#define SMALL_LIMIT  ((size_t)1 << 20) // below: 512-byte granularity
#define SMALL_ROUND  ((size_t)512)
#define LARGE_ROUND  ((size_t)2 << 20)
#define USED_BUCKETS 1024

typedef struct block {
    void *ptr;
    size_t size;       // rounded
    cudaEvent_t freed; // recorded at the last free; created on the first
    uint64_t freer;    // the serial of the thread that last freed it
    cudaStream_t on;   // and the stream it was current on then
    struct block *next;
} block;

typedef struct device_pool {
    pthread_mutex_t mu;
    block *cached;             // free blocks
    block *used[USED_BUCKETS]; // blocks handed out, hashed by address
    fsdp_device_memory stats;  // capacity aside
} device_pool;

static device_pool pools[MAX_DEVICES];
static pthread_once_t pools_once = PTHREAD_ONCE_INIT;

static void pools_init(void) {
    for (int d = 0; d < MAX_DEVICES; d++) pthread_mutex_init(&pools[d].mu, NULL);
}

static device_pool *pool_of(int device) {
    FSDP_ASSERT(device >= 0 && device < MAX_DEVICES);
    pthread_once(&pools_once, pools_init);
    return &pools[device];
}

static size_t round_size(size_t nbytes) {
    size_t r = nbytes < SMALL_LIMIT ? SMALL_ROUND : LARGE_ROUND;
    return (nbytes + r - 1) / r * r;
}

static size_t bucket_of(const void *ptr) {
    return ((uintptr_t)ptr >> 9) % USED_BUCKETS; // blocks are at least 512 bytes apart
}

/* The cached block that fits `size` best without wasting more than a quarter of itself (small
 * blocks serve only small requests), unlinked from the cache; NULL when none. Holds p->mu. */
static block *take_cached(device_pool *p, size_t size) {
    block **best = NULL;
    for (block **b = &p->cached; *b; b = &(*b)->next) {
        size_t s = (*b)->size;
        if (s < size || (size < SMALL_LIMIT) != (s < SMALL_LIMIT) || s - size > s / 4) continue;
        if (!best || s < (*best)->size) best = b;
        if (s == size) break;
    }
    if (!best) return NULL;
    block *found = *best;
    *best = found->next;
    return found;
}

static void add_used(device_pool *p, block *b) {
    size_t h = bucket_of(b->ptr);
    b->next = p->used[h];
    p->used[h] = b;
    p->stats.in_use += (int64_t)b->size;
    if (p->stats.in_use > p->stats.peak_in_use) p->stats.peak_in_use = p->stats.in_use;
}

static block *remove_used(device_pool *p, void *ptr) {
    for (block **b = &p->used[bucket_of(ptr)]; *b; b = &(*b)->next)
        if ((*b)->ptr == ptr) {
            block *found = *b;
            *b = found->next;
            p->stats.in_use -= (int64_t)found->size;
            return found;
        }
    return NULL;
}

/* Gives every cached block of the device back to CUDA once its last user's work is done.
 * The device is current. */
static void release_cached(int device) {
    device_pool *p = pool_of(device);
    pthread_mutex_lock(&p->mu);
    block *list = p->cached;
    p->cached = NULL;
    pthread_mutex_unlock(&p->mu);
    size_t released = 0;
    while (list) {
        block *b = list;
        list = b->next;
        if (b->freed) {
            fsdp_cuda_count_host_wait(device);
            cudaEventSynchronize(b->freed);
            cudaEventDestroy(b->freed);
        }
        cudaFree(b->ptr);
        released += b->size;
        free(b);
    }
    (void)cudaGetLastError();
    pthread_mutex_lock(&p->mu);
    p->stats.reserved -= (int64_t)released;
    pthread_mutex_unlock(&p->mu);
}

fsdp_status fsdp_cuda_block_alloc(fsdp_ctx *ctx, int device, size_t nbytes, void **out) {
    device_pool *p = pool_of(device);
    size_t size = round_size(nbytes);
    if (size < nbytes)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes on cuda:%d",
                         nbytes, device);
    uint64_t me = fsdp_cuda_thread_serial();
    pthread_mutex_lock(&p->mu);
    block *b = take_cached(p, size);
    if (b) {
        add_used(p, b);
        p->stats.cache_hits++;
    }
    pthread_mutex_unlock(&p->mu);
    if (b) {
        if (b->freer != me || b->on != fsdp_cuda_stream())
            FSDP_CUDA_TRY(ctx, cudaStreamWaitEvent(fsdp_cuda_stream(), b->freed, 0));
        *out = b->ptr;
        return FSDP_OK;
    }

    b = calloc(1, sizeof *b);
    if (!b) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a block record");
    b->size = size;
    b->freer = me;
    b->on = fsdp_cuda_stream();
    cudaError_t err = cudaMalloc(&b->ptr, size);
    if (err == cudaErrorMemoryAllocation) { // the cache may hold what is missing
        (void)cudaGetLastError();
        release_cached(device);
        err = cudaMalloc(&b->ptr, size);
    }
    if (err != cudaSuccess) {
        free(b);
        (void)cudaGetLastError();
        fsdp_device_memory s = fsdp_cuda_memory_stats_get(device);
        bool oom = err == cudaErrorMemoryAllocation;
        return FSDP_FAIL(
            ctx, oom ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_DEVICE,
            "CUDA: cannot allocate %zu bytes on cuda:%d (libfsdp holds %lld bytes in "
            "use, %lld reserved, of %lld): cudaMalloc: %s (%s)%s",
            nbytes, device, (long long)s.in_use, (long long)s.reserved, (long long)s.capacity,
            cudaGetErrorString(err), cudaGetErrorName(err),
            oom ? "; use less memory: a smaller batch, activation checkpointing "
                  "(fsdp_checkpoint_wrap), more sharding (FSDP full_shard, CPU offload), or "
                  "fewer processes on this GPU"
                : "");
    }
    pthread_mutex_lock(&p->mu);
    p->stats.device_allocs++;
    p->stats.reserved += (int64_t)size;
    if (p->stats.reserved > p->stats.peak_reserved) p->stats.peak_reserved = p->stats.reserved;
    add_used(p, b);
    pthread_mutex_unlock(&p->mu);
    *out = b->ptr;
    return FSDP_OK;
}

void fsdp_cuda_block_free(int device, void *ptr) {
    if (!ptr) return;
    device_pool *p = pool_of(device);
    pthread_mutex_lock(&p->mu);
    block *b = remove_used(p, ptr);
    pthread_mutex_unlock(&p->mu);
    FSDP_ASSERT(b); // freed twice, or not from this allocator

    int previous = 0;
    cudaGetDevice(&previous);
    if (previous != device) cudaSetDevice(device);
    if (!b->freed) FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&b->freed, cudaEventDisableTiming));
    b->on = fsdp_cuda_stream();
    FSDP_CUDA_CHECK(cudaEventRecord(b->freed, b->on));
    if (previous != device) cudaSetDevice(previous);
    b->freer = fsdp_cuda_thread_serial();

    pthread_mutex_lock(&p->mu);
    b->next = p->cached;
    p->cached = b;
    pthread_mutex_unlock(&p->mu);
}

/* The device's total memory, asked once (no context is made for it). */
static int64_t capacity_of(int device) {
    static _Atomic int64_t known[MAX_DEVICES];
    int64_t c = known[device];
    if (c) return c;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return known[device] = (int64_t)prop.totalGlobalMem;
}

fsdp_device_memory fsdp_cuda_memory_stats_get(int device) {
    fsdp_device_memory s = {0};
    if (device < 0 || device >= MAX_DEVICES) return s;
    device_pool *p = pool_of(device);
    pthread_mutex_lock(&p->mu);
    s = p->stats;
    pthread_mutex_unlock(&p->mu);
    s.capacity = capacity_of(device);
    return s;
}

void fsdp_cuda_memory_reset_peak(int device) {
    if (device < 0 || device >= MAX_DEVICES) return;
    device_pool *p = pool_of(device);
    pthread_mutex_lock(&p->mu);
    p->stats.peak_in_use = p->stats.in_use;
    p->stats.peak_reserved = p->stats.reserved;
    pthread_mutex_unlock(&p->mu);
}

void fsdp_cuda_empty_cache(int device) {
    if (device < 0 || device >= MAX_DEVICES) return;
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) {
        (void)cudaGetLastError();
        return; // no usable device: nothing was ever cached
    }
    if (previous != device) cudaSetDevice(device);
    release_cached(device);
    if (previous != device) cudaSetDevice(previous);
}
