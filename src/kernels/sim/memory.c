/* memory.c: the sim device's address window and its memory, cudaMalloc's counterpart: one
 * reservation whose first half (the device addresses) is never readable and whose second half
 * holds the data at a fixed offset, handed out first-fit per device. The settings
 * FSDP_SIM_DEVICES and FSDP_SIM_MEMORY are read here, once. */
#define _GNU_SOURCE /* MAP_NORESERVE, madvise */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/sim/sim_impl.h"

#define DEFAULT_DEVICES  2
#define DEFAULT_CAPACITY ((size_t)8 << 30)
#define CAPACITY_ROUND   ((size_t)2 << 20)

/* ---- settings ---- */

static pthread_once_t settings_once = PTHREAD_ONCE_INIT;
static int devices;
static size_t capacity;

/* "8G", "512M", "65536": bytes, or 0 when the text is not such a size. */
static size_t parse_size(const char *text) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text) return 0;
    int shift = 0;
    switch (*end) {
    case 'K':
    case 'k':
        shift = 10;
        end++;
        break;
    case 'M':
    case 'm':
        shift = 20;
        end++;
        break;
    case 'G':
    case 'g':
        shift = 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v == 0 || v > (SIZE_MAX >> 1 >> shift) / SIM_MAX_DEVICES / 2) return 0;
    return (size_t)v << shift;
}

static void read_settings(void) {
    devices = DEFAULT_DEVICES;
    const char *d = getenv("FSDP_SIM_DEVICES");
    if (d && *d) {
        char *end = NULL;
        long v = strtol(d, &end, 10);
        if (*end || v < 0 || v > SIM_MAX_DEVICES)
            fprintf(stderr,
                    "libfsdp: FSDP_SIM_DEVICES=%s is not a device count from 0 to %d; using %d\n",
                    d, SIM_MAX_DEVICES, DEFAULT_DEVICES);
        else
            devices = (int)v;
    }
    capacity = DEFAULT_CAPACITY;
    const char *m = getenv("FSDP_SIM_MEMORY");
    if (m && *m) {
        size_t v = parse_size(m);
        if (v < ((size_t)1 << 20))
            fprintf(stderr,
                    "libfsdp: FSDP_SIM_MEMORY=%s is not a memory size of at least 1M (bytes, or "
                    "with a suffix K, M or G: e.g. 512M); using 8G\n",
                    m);
        else
            capacity = v;
    }
    capacity = (capacity + CAPACITY_ROUND - 1) / CAPACITY_ROUND * CAPACITY_ROUND;
}

int sim_device_count(void) {
    pthread_once(&settings_once, read_settings);
    return devices;
}

size_t sim_capacity(void) {
    pthread_once(&settings_once, read_settings);
    return capacity;
}

/* ---- the window ---- */

static pthread_mutex_t window_mu = PTHREAD_MUTEX_INITIALIZER;
static char *_Atomic base; // NULL until reserved
static size_t span;        // devices * capacity, fixed once base is set

fsdp_status sim_window_ensure(fsdp_ctx *ctx) {
    if (base) return FSDP_OK;
    pthread_mutex_lock(&window_mu);
    fsdp_status st = FSDP_OK;
    if (!base) {
        size_t s = (size_t)(sim_device_count() ? sim_device_count() : 1) * sim_capacity();
        void *p = mmap(NULL, 2 * s, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void *shadow = p == MAP_FAILED
                           ? MAP_FAILED
                           : mmap((char *)p + s, s, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        if (shadow == MAP_FAILED) {
            int err = errno;
            if (p != MAP_FAILED) munmap(p, 2 * s);
            st = FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                           "sim: cannot reserve %zu MiB of address space for %d simulated "
                           "device(s) of %zu MiB: %s (lower FSDP_SIM_MEMORY or FSDP_SIM_DEVICES)",
                           2 * s >> 20, sim_device_count(), sim_capacity() >> 20, strerror(err));
        } else {
            span = s;
            base = p;
        }
    }
    pthread_mutex_unlock(&window_mu);
    return FSDP_PASS(ctx, st);
}

int sim_device_of(const void *p) {
    const char *b = base;
    if (!b || (const char *)p < b || (const char *)p >= b + span) return -1;
    return (int)((size_t)((const char *)p - b) / sim_capacity());
}

void *sim_shadow(const void *p) {
    return p ? (char *)p + span : NULL;
}

/* ---- the memory of each device: free ranges, first fit ---- */

typedef struct range {
    size_t offset, size;
    struct range *next; // by offset
} range;

typedef struct device_memory {
    pthread_mutex_t mu;
    bool ready;
    range *free; // NULL before the first take: then the whole device is free
} device_memory;

static device_memory memory[SIM_MAX_DEVICES] = {
    [0 ... SIM_MAX_DEVICES - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER},
};

void *sim_device_take(int device, size_t size) {
    FSDP_ASSERT(base && device >= 0 && device < sim_device_count() && size % SIM_ALIGN == 0);
    device_memory *m = &memory[device];
    void *out = NULL;
    pthread_mutex_lock(&m->mu);
    if (!m->ready) {
        m->free = calloc(1, sizeof *m->free);
        if (m->free) {
            m->free->size = sim_capacity();
            m->ready = true;
        }
    }
    for (range **at = &m->free; m->ready && *at; at = &(*at)->next) {
        range *r = *at;
        if (r->size < size) continue;
        out = base + (size_t)device * sim_capacity() + r->offset;
        r->offset += size;
        r->size -= size;
        if (r->size == 0) {
            *at = r->next;
            free(r);
        }
        break;
    }
    pthread_mutex_unlock(&m->mu);
    if (out) memset(sim_shadow(out), 0xff, size); // NaN in f32, bf16 and f16
    return out;
}

void sim_device_give(int device, void *ptr, size_t size) {
    if (!ptr) return;
    device_memory *m = &memory[device];
    size_t offset = (size_t)((char *)ptr - base) - (size_t)device * sim_capacity();
    if (size >= ((size_t)2 << 20)) madvise(sim_shadow(ptr), size, MADV_DONTNEED);
    pthread_mutex_lock(&m->mu);
    range **at = &m->free;
    while (*at && (*at)->offset < offset) at = &(*at)->next;
    range *next = *at;
    range *prev = at == &m->free ? NULL : (range *)((char *)at - offsetof(range, next));
    if (prev && prev->offset + prev->size == offset) { // grow the range before
        prev->size += size;
        if (next && prev->offset + prev->size == next->offset) {
            prev->size += next->size;
            prev->next = next->next;
            free(next);
        }
    } else if (next && offset + size == next->offset) { // grow the range after
        next->offset = offset;
        next->size += size;
    } else {
        range *r = malloc(sizeof *r);
        FSDP_ASSERT(r); // a few bytes of bookkeeping
        *r = (range){offset, size, next};
        *at = r;
    }
    pthread_mutex_unlock(&m->mu);
}

void sim_window_release(void) {
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        while (memory[d].free) {
            range *r = memory[d].free;
            memory[d].free = r->next;
            free(r);
        }
        memory[d].ready = false;
    }
    // The mapping stays: a tensor freed later in the exit (another atexit handler) may still
    // name its address; the system reclaims it with the process.
}
