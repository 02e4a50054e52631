/* allocator.c: the sim device's caching allocator, with CUDA's semantics: blocks rounded as
 * CUDA rounds them (512 bytes below 1 MiB, 2 MiB above), kept when freed and handed out again
 * for about their size, so a steady-state step takes no device memory. A freed block remembers
 * the stream it was freed on and an event recorded there; a later owner on another stream makes
 * its stream wait for that event (no host wait), so its work cannot overtake the work queued
 * before the free. Fresh blocks hold the NaN pattern of memory.c. The rounding's slack past
 * what was asked for is a guard: filled with a pattern when the block is handed out and checked,
 * in stream order, when it is freed, so work that wrote past the end of its allocation ends the
 * process with a message naming the allocation. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/sim/sim_impl.h"

#define SMALL_LIMIT ((size_t)1 << 20)
#define LARGE_ROUND ((size_t)2 << 20)
#define BUCKETS     1024

typedef struct block {
    void *ptr;
    size_t size;      // rounded
    uint64_t stream;  // the serial of the stream it was last freed on (0: never freed)
    sim_event *freed; // recorded there at that free
    struct block *next;
} block;

typedef struct pool {
    pthread_mutex_t mu;
    block *cached;            // free blocks
    block *used[BUCKETS];     // blocks handed out, hashed by address
    fsdp_device_memory stats; // capacity aside
} pool;

#define GUARD_BYTE 0xcd

/* ---- the guard past the asked size, written and checked on the owner's stream ---- */

typedef struct guard_args {
    unsigned char *tail; // shadow address of the slack
    size_t n;
    sim_alloc_site site; // check only: the allocation, for the message
} guard_args;

static void run_guard_set(void *arg) {
    guard_args *a = arg;
    memset(a->tail, GUARD_BYTE, a->n);
}

static void run_guard_check(void *arg) {
    guard_args *a = arg;
    size_t last = a->n;
    while (last > 0 && a->tail[last - 1] == GUARD_BYTE) last--;
    if (last == 0) return;
    fprintf(stderr,
            "libfsdp: sim:%d: work on the device wrote up to %zu bytes past the end of an "
            "allocation of %zu bytes at %p (a kernel or copy given too small a buffer); the "
            "allocation was made by:\n",
            a->site.device, last, a->site.asked, a->site.ptr);
    fflush(stderr);
    sim_fault_print_site(&a->site);
    abort();
}

static pool pools[SIM_MAX_DEVICES] = {
    [0 ... SIM_MAX_DEVICES - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER},
};

static size_t round_size(size_t nbytes) {
    size_t r = nbytes < SMALL_LIMIT ? SIM_ALIGN : LARGE_ROUND;
    return (nbytes + r - 1) / r * r;
}

static size_t bucket_of(const void *ptr) {
    return ((uintptr_t)ptr / SIM_ALIGN) % BUCKETS;
}

/* The cached block that fits `size` best without wasting more than a quarter of itself;
 * unlinked. Called with the pool's lock. */
static block *take_cached(pool *p, size_t size) {
    block **best = NULL;
    for (block **at = &p->cached; *at; at = &(*at)->next) {
        size_t have = (*at)->size;
        if (have < size || have - size > have / 4) continue;
        if (!best || have < (*best)->size) best = at;
    }
    if (!best) return NULL;
    block *b = *best;
    *best = b->next;
    return b;
}

/* Returns every cached block of the pool to the device, after the work before its free. */
static void release_cached(int device) {
    pool *p = &pools[device];
    pthread_mutex_lock(&p->mu);
    block *list = p->cached;
    p->cached = NULL;
    for (block *b = list; b; b = b->next) p->stats.reserved -= (int64_t)b->size;
    pthread_mutex_unlock(&p->mu);
    while (list) {
        block *b = list;
        list = b->next;
        if (b->freed) sim_event_sync(b->freed);
        sim_event_free(b->freed);
        sim_device_give(device, b->ptr, b->size);
        free(b);
    }
}

static fsdp_status out_of_memory(fsdp_ctx *ctx, int device, size_t size) {
    fsdp_device_memory s = fsdp_sim_memory_stats_get(device);
    return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                     "sim:%d is out of memory: tried to allocate %zu bytes with %lld of %lld "
                     "bytes in use (%lld held); the simulated device has FSDP_SIM_MEMORY=%lld "
                     "bytes: raise it, or use less memory (smaller batch or model, more sharding)",
                     device, size, (long long)s.in_use, (long long)s.capacity,
                     (long long)s.reserved, (long long)s.capacity);
}

fsdp_status sim_block_alloc(fsdp_ctx *ctx, int device, size_t nbytes, void **out) {
    FSDP_TRY_AT(ctx, sim_window_ensure(ctx));
    size_t size = round_size(nbytes);
    if (size < nbytes || size > sim_capacity()) return out_of_memory(ctx, device, nbytes);
    pool *p = &pools[device];
    pthread_mutex_lock(&p->mu);
    block *b = take_cached(p, size);
    bool fresh = !b;
    if (b) p->stats.cache_hits++;
    pthread_mutex_unlock(&p->mu);
    if (b) {
        /* Told by serial, not address: the freeing thread's default stream may be gone (its
         * thread ended) and a new stream made at its address, whose work is not ordered after
         * the old one's. */
        sim_stream *now = sim_stream_of(device, sim_stream_current_handle(device));
        if (b->stream != sim_stream_serial(now) && b->freed) sim_stream_wait_event(now, b->freed);
    } else {
        void *ptr = sim_device_take(device, size);
        if (!ptr) {
            release_cached(device); // as CUDA's allocator frees its cache before it gives up
            ptr = sim_device_take(device, size);
        }
        if (!ptr) return out_of_memory(ctx, device, nbytes);
        b = calloc(1, sizeof *b);
        if (!b) {
            sim_device_give(device, ptr, size);
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "sim: no host memory for a block");
        }
        b->ptr = ptr;
        b->size = size;
    }
    pthread_mutex_lock(&p->mu);
    if (fresh) {
        p->stats.device_allocs++;
        p->stats.reserved += (int64_t)size;
        if (p->stats.reserved > p->stats.peak_reserved) p->stats.peak_reserved = p->stats.reserved;
    }
    size_t k = bucket_of(b->ptr);
    b->next = p->used[k];
    p->used[k] = b;
    p->stats.in_use += (int64_t)b->size;
    if (p->stats.in_use > p->stats.peak_in_use) p->stats.peak_in_use = p->stats.in_use;
    pthread_mutex_unlock(&p->mu);
    sim_fault_track(b->ptr, b->size, nbytes, device);
    if (nbytes < b->size) {
        guard_args g = {(unsigned char *)sim_shadow(b->ptr) + nbytes, b->size - nbytes, {0}};
        sim_launch_unseen(sim_stream_of(device, sim_stream_current_handle(device)), run_guard_set,
                          &g, sizeof g);
    }
    *out = b->ptr;
    return FSDP_OK;
}

void sim_block_free(int device, void *ptr) {
    if (!ptr) return;
    pool *p = &pools[device];
    pthread_mutex_lock(&p->mu);
    block *b = NULL;
    for (block **at = &p->used[bucket_of(ptr)]; *at; at = &(*at)->next)
        if ((*at)->ptr == ptr) {
            b = *at;
            *at = b->next;
            break;
        }
    if (b) p->stats.in_use -= (int64_t)b->size;
    pthread_mutex_unlock(&p->mu);
    if (!b) {
        fprintf(stderr, "libfsdp: sim:%d: free of %p, which this device did not hand out\n", device,
                ptr);
        abort();
    }
    guard_args g = {0};
    sim_fault_untrack(ptr, &g.site);
    sim_stream *now = sim_stream_of(device, sim_stream_current_handle(device));
    if (g.site.asked < b->size) {
        g.tail = (unsigned char *)sim_shadow(ptr) + g.site.asked;
        g.n = b->size - g.site.asked;
        sim_launch_unseen(now, run_guard_check, &g, sizeof g);
    }
    if (!b->freed) b->freed = sim_event_new(device);
    FSDP_ASSERT(b->freed);
    b->stream = sim_stream_serial(now);
    sim_event_record(b->freed, now);
    pthread_mutex_lock(&p->mu);
    b->next = p->cached;
    p->cached = b;
    pthread_mutex_unlock(&p->mu);
}

fsdp_device_memory fsdp_sim_memory_stats_get(int device) {
    if (device < 0 || device >= sim_device_count()) return (fsdp_device_memory){0};
    pool *p = &pools[device];
    pthread_mutex_lock(&p->mu);
    fsdp_device_memory s = p->stats;
    pthread_mutex_unlock(&p->mu);
    s.capacity = (int64_t)sim_capacity();
    return s;
}

void fsdp_sim_memory_reset_peak(int device) {
    if (device < 0 || device >= sim_device_count()) return;
    pool *p = &pools[device];
    pthread_mutex_lock(&p->mu);
    p->stats.peak_in_use = p->stats.in_use;
    p->stats.peak_reserved = p->stats.reserved;
    pthread_mutex_unlock(&p->mu);
}

void fsdp_sim_empty_cache(int device) {
    if (device >= 0 && device < sim_device_count()) release_cached(device);
}

void sim_blocks_release(void) {
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        release_cached(d);
        pool *p = &pools[d];
        pthread_mutex_lock(&p->mu);
        for (int k = 0; k < BUCKETS; k++)
            while (p->used[k]) { // leaked: fault.c has reported them
                block *b = p->used[k];
                p->used[k] = b->next;
                sim_event_free(b->freed);
                free(b);
            }
        pthread_mutex_unlock(&p->mu);
    }
}
