/* storage.c: the sim device's record (core/device.h): memory from the caching allocator,
 * copies, fills and conversions queued on the calling thread's current stream and run there on
 * the shadow addresses, pinned host memory whose copies read it late (as a GPU's DMA does),
 * streams and events, and the exit that runs and joins every stream and frees the bookkeeping. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/sim/sim_impl.h"

/* ---- the exit ---- */

static void pinned_release(void);

static void shutdown(void) {
    sim_streams_release(); // every queued piece of work runs first
    sim_fault_report_live();
    sim_blocks_release();
    sim_fault_release();
    pinned_release();
    sim_window_release();
}

static pthread_once_t begun = PTHREAD_ONCE_INIT;
static void register_exit(void) {
    atexit(shutdown);
}

/* Checks the device index, and arranges the exit at the first use. */
static fsdp_status begin(fsdp_ctx *ctx, int index) {
    pthread_once(&begun, register_exit);
    int count = sim_device_count();
    if (index < 0 || index >= count)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "device sim:%d is not available: there %s %d simulated device%s "
                         "(FSDP_SIM_DEVICES sets how many, up to %d)",
                         index, count == 1 ? "is" : "are", count, count == 1 ? "" : "s",
                         SIM_MAX_DEVICES);
    return sim_window_ensure(ctx);
}

/* A device address of sim:index, or a failure naming where it is. */
static fsdp_status check_on(fsdp_ctx *ctx, const void *p, int index, const char *what) {
    int on = sim_device_of(p);
    if (on == index) return FSDP_OK;
    if (on < 0)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE, "%s: %p is not memory of sim:%d (a host pointer?)",
                         what, p, index);
    return FSDP_FAIL(ctx, FSDP_ERR_DEVICE, "%s: %p is memory of sim:%d, not of sim:%d", what, p, on,
                     index);
}

static sim_stream *current(int index) {
    return sim_stream_of(index, sim_stream_current_handle(index));
}

/* ---- pinned host memory: plain memory the copies know ---- */

typedef struct pinned {
    char *ptr;
    size_t size;
    struct pinned *next;
} pinned;

static pthread_mutex_t pinned_mu = PTHREAD_MUTEX_INITIALIZER;
static pinned *pins;

static bool is_pinned(const void *p, size_t n) {
    pthread_mutex_lock(&pinned_mu);
    bool found = false;
    for (const pinned *q = pins; q && !found; q = q->next)
        found = (const char *)p >= q->ptr && (const char *)p + n <= q->ptr + q->size;
    pthread_mutex_unlock(&pinned_mu);
    return found;
}

static fsdp_status sim_host_alloc(fsdp_ctx *ctx, size_t nbytes, void **out) {
    pthread_once(&begun, register_exit);
    size_t size = (nbytes + 63) / 64 * 64;
    pinned *q = malloc(sizeof *q);
    void *p = size >= nbytes ? aligned_alloc(64, size ? size : 64) : NULL;
    if (!q || !p) {
        free(q);
        free(p);
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of pinned memory",
                         nbytes);
    }
    memset(p, 0, size ? size : 64);
    *q = (pinned){p, nbytes, NULL};
    pthread_mutex_lock(&pinned_mu);
    q->next = pins;
    pins = q;
    pthread_mutex_unlock(&pinned_mu);
    *out = p;
    return FSDP_OK;
}

static void pinned_release(void) {
    pthread_mutex_lock(&pinned_mu);
    while (pins) { // pinned memory never freed: the caller's leak, reported by LeakSanitizer
        pinned *q = pins;
        pins = q->next;
        free(q);
    }
    pthread_mutex_unlock(&pinned_mu);
}

size_t fsdp_sim_pinned_bytes(void) {
    size_t n = 0;
    pthread_mutex_lock(&pinned_mu);
    for (const pinned *q = pins; q; q = q->next) n += q->size;
    pthread_mutex_unlock(&pinned_mu);
    return n;
}

static void sim_host_free(void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&pinned_mu);
    pinned *gone = NULL;
    for (pinned **at = &pins; *at; at = &(*at)->next)
        if ((*at)->ptr == ptr) {
            gone = *at;
            *at = gone->next;
            break;
        }
    pthread_mutex_unlock(&pinned_mu);
    FSDP_ASSERT(gone); // pinned memory of another kind, or freed twice
    free(gone->ptr);
    free(gone);
}

/* ---- memory ---- */

static int sim_count(void) {
    return sim_device_count();
}

/* The pieces of work the memory face queues; pointers are shadow or host addresses. */
typedef struct bytes_args {
    void *dst;
    const void *src; // NULL: n bytes of `fill`
    size_t n;
    unsigned char fill;
} bytes_args;

static void run_bytes(void *arg) {
    bytes_args *a = arg;
    if (a->src)
        memmove(a->dst, a->src, a->n);
    else
        memset(a->dst, a->fill, a->n);
}

/* A copy from pageable host memory carries the bytes with it (taken at the call). */
static void run_staged(void *arg) {
    bytes_args *a = arg;
    memcpy(a->dst, a + 1, a->n);
}

typedef struct rows_args {
    char *dst;
    const char *src;
    size_t dst_pitch, src_pitch, width, rows;
} rows_args;

static void run_rows(void *arg) {
    rows_args *a = arg;
    for (size_t r = 0; r < a->rows; r++)
        memmove(a->dst + r * a->dst_pitch, a->src + r * a->src_pitch, a->width);
}

typedef struct fill_args {
    void *dst;
    uint32_t bits;
    size_t elem_size;
    int64_t n;
} fill_args;

static void run_fill(void *arg) {
    fill_args *a = arg;
    if (a->elem_size == 4) {
        uint32_t *p = a->dst;
        for (int64_t i = 0; i < a->n; i++) p[i] = a->bits;
    } else {
        uint16_t *p = a->dst;
        for (int64_t i = 0; i < a->n; i++) p[i] = (uint16_t)a->bits;
    }
}

typedef struct convert_args {
    void *dst;
    const void *src;
    fsdp_dtype dst_dtype, src_dtype;
    int64_t n;
} convert_args;

static void run_convert(void *arg) {
    convert_args *a = arg;
    const fsdp_kernels_i *cpu = fsdp_kernels_cpu();
    if (a->dst_dtype == FSDP_DTYPE_BF16)
        cpu->f32_to_bf16(a->dst, a->src, a->n);
    else if (a->dst_dtype == FSDP_DTYPE_F16)
        cpu->f32_to_f16(a->dst, a->src, a->n);
    else if (a->src_dtype == FSDP_DTYPE_BF16)
        cpu->bf16_to_f32(a->dst, a->src, a->n);
    else
        cpu->f16_to_f32(a->dst, a->src, a->n);
}

/* A block of the caching allocator, filled on the current stream (the bytes come before any
 * later work of the thread): zeros, counted as a launch (a memset on CUDA); or, `uninit`,
 * 0xFF bytes unseen by the launch counts (core/device.h), as a GPU would hand the block over
 * as it is. */
static fsdp_status alloc_filled(fsdp_ctx *ctx, int index, size_t nbytes, bool uninit, void **out) {
    FSDP_TRY_AT(ctx, begin(ctx, index));
    void *p = NULL;
    FSDP_TRY_AT(ctx, sim_block_alloc(ctx, index, nbytes, &p));
    bytes_args a = {.dst = sim_shadow(p), .n = nbytes, .fill = uninit ? 0xFF : 0};
    (uninit ? sim_launch_unseen : sim_launch)(current(index), run_bytes, &a, sizeof a);
    *out = p;
    return FSDP_OK;
}

static fsdp_status sim_alloc(fsdp_ctx *ctx, int index, size_t nbytes, void **out) {
    return alloc_filled(ctx, index, nbytes, false, out);
}

static fsdp_status sim_alloc_uninit(fsdp_ctx *ctx, int index, size_t nbytes, void **out) {
    return alloc_filled(ctx, index, nbytes, true, out);
}

static void sim_free(int index, void *ptr) {
    sim_block_free(index, ptr);
}

/* Checks the sides of a copy; *index is the device whose stream runs it. */
static fsdp_status copy_sides(fsdp_ctx *ctx, const void *dst, fsdp_device dst_dev, const void *src,
                              fsdp_device src_dev, int *index) {
    bool dst_sim = dst_dev.type == FSDP_DEVICE_SIM, src_sim = src_dev.type == FSDP_DEVICE_SIM;
    *index = dst_sim ? dst_dev.index : src_dev.index;
    FSDP_TRY_AT(ctx, begin(ctx, *index));
    if (dst_sim)
        FSDP_TRY_AT(ctx, check_on(ctx, dst, dst_dev.index, "copy to the simulated device"));
    if (src_sim)
        FSDP_TRY_AT(ctx, check_on(ctx, src, src_dev.index, "copy from the simulated device"));
    return FSDP_OK;
}

/* To the host: waits for the bytes. From pinned memory: reads them when the stream gets
 * there. From other host memory: takes them now. Between devices: in stream order. */
static fsdp_status sim_copy(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, const void *src,
                            fsdp_device src_dev, size_t nbytes) {
    if (nbytes == 0 || dst == src) return FSDP_OK;
    int index;
    FSDP_TRY_AT(ctx, copy_sides(ctx, dst, dst_dev, src, src_dev, &index));
    sim_stream *s = current(index);
    bool from_host = src_dev.type != FSDP_DEVICE_SIM, to_host = dst_dev.type != FSDP_DEVICE_SIM;
    void *d = to_host ? dst : sim_shadow(dst);
    if (from_host && !is_pinned(src, nbytes)) {
        bytes_args *a = malloc(sizeof *a + nbytes);
        if (!a)
            return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                             "cannot stage %zu bytes for a copy to sim:%d", nbytes, index);
        *a = (bytes_args){.dst = d, .n = nbytes};
        memcpy(a + 1, src, nbytes);
        sim_launch(s, run_staged, a, sizeof *a + nbytes);
        free(a);
        return FSDP_OK;
    }
    bytes_args a = {.dst = d, .src = from_host ? src : sim_shadow(src), .n = nbytes};
    sim_launch(s, run_bytes, &a, sizeof a);
    if (to_host) sim_stream_sync(s);
    return FSDP_OK;
}

static fsdp_status sim_copy_2d(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, size_t dst_pitch,
                               const void *src, fsdp_device src_dev, size_t src_pitch, size_t width,
                               size_t rows) {
    if (width == 0 || rows == 0) return FSDP_OK;
    if (rows == 1) return sim_copy(ctx, dst, dst_dev, src, src_dev, width);
    bool from_host = src_dev.type != FSDP_DEVICE_SIM, to_host = dst_dev.type != FSDP_DEVICE_SIM;
    if (from_host && !is_pinned(src, (rows - 1) * src_pitch + width)) {
        // Pageable rows: one row at a time, each taken now.
        for (size_t r = 0; r < rows; r++)
            FSDP_TRY_AT(ctx, sim_copy(ctx, (char *)dst + r * dst_pitch, dst_dev,
                                      (const char *)src + r * src_pitch, src_dev, width));
        return FSDP_OK;
    }
    int index;
    FSDP_TRY_AT(ctx, copy_sides(ctx, dst, dst_dev, src, src_dev, &index));
    sim_stream *s = current(index);
    rows_args a = {to_host ? dst : sim_shadow(dst),
                   from_host ? src : sim_shadow(src),
                   dst_pitch,
                   src_pitch,
                   width,
                   rows};
    sim_launch(s, run_rows, &a, sizeof a);
    if (to_host) sim_stream_sync(s);
    return FSDP_OK;
}

static fsdp_status sim_fill(fsdp_ctx *ctx, int index, void *dst, const void *value,
                            size_t elem_size, int64_t n) {
    fill_args a = {NULL, 0, elem_size, n};
    if (elem_size == 4) {
        memcpy(&a.bits, value, 4);
    } else if (elem_size == 2) {
        uint16_t h;
        memcpy(&h, value, 2);
        a.bits = h;
    } else {
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "fill: elements of %zu bytes are not supported",
                         elem_size);
    }
    if (n <= 0) return FSDP_OK;
    FSDP_TRY_AT(ctx, begin(ctx, index));
    FSDP_TRY_AT(ctx, check_on(ctx, dst, index, "fill"));
    a.dst = sim_shadow(dst);
    sim_launch(current(index), run_fill, &a, sizeof a);
    return FSDP_OK;
}

static fsdp_status sim_convert(fsdp_ctx *ctx, int index, void *dst, fsdp_dtype dst_dtype,
                               const void *src, fsdp_dtype src_dtype, int64_t n) {
    bool narrow = src_dtype == FSDP_DTYPE_F32 &&
                  (dst_dtype == FSDP_DTYPE_BF16 || dst_dtype == FSDP_DTYPE_F16);
    bool widen = dst_dtype == FSDP_DTYPE_F32 &&
                 (src_dtype == FSDP_DTYPE_BF16 || src_dtype == FSDP_DTYPE_F16);
    if (!narrow && !widen)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "no conversion from %s to %s",
                         fsdp_dtype_to_string(src_dtype), fsdp_dtype_to_string(dst_dtype));
    if (n <= 0) return FSDP_OK;
    FSDP_TRY_AT(ctx, begin(ctx, index));
    FSDP_TRY_AT(ctx, check_on(ctx, dst, index, "convert"));
    FSDP_TRY_AT(ctx, check_on(ctx, src, index, "convert"));
    convert_args a = {sim_shadow(dst), sim_shadow(src), dst_dtype, src_dtype, n};
    sim_launch(current(index), run_convert, &a, sizeof a);
    return FSDP_OK;
}

static fsdp_status sim_synchronize(fsdp_ctx *ctx, int index) {
    FSDP_TRY_AT(ctx, begin(ctx, index));
    sim_stream_sync(current(index));
    return FSDP_OK;
}

/* ---- streams and events ---- */

/* The stream a handle names on device index (NULL: the thread's current). */
static fsdp_status stream_on(fsdp_ctx *ctx, int index, void *handle, sim_stream **out) {
    FSDP_TRY_AT(ctx, begin(ctx, index));
    if (handle && sim_stream_device(handle) != index)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE, "a stream of sim:%d used as one of sim:%d",
                         sim_stream_device(handle), index);
    *out = handle ? handle : current(index);
    return FSDP_OK;
}

static fsdp_status sim_stream_create(fsdp_ctx *ctx, int index, void **out) {
    FSDP_TRY_AT(ctx, begin(ctx, index));
    sim_stream *s = sim_stream_new(index);
    if (!s)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "sim:%d: cannot start the thread of a new stream (too many threads?)",
                         index);
    *out = s;
    return FSDP_OK;
}

static void sim_stream_destroy(int index, void *stream) {
    (void)index;
    sim_stream_free(stream);
}

static void *sim_stream_current(int index) {
    return sim_stream_current_handle(index);
}

static void sim_stream_set_current(int index, void *stream) {
    sim_stream_set_current_handle(index, stream);
}

static fsdp_status sim_stream_synchronize(fsdp_ctx *ctx, int index, void *stream) {
    sim_stream *s = NULL;
    FSDP_TRY_AT(ctx, stream_on(ctx, index, stream, &s));
    sim_stream_sync(s);
    return FSDP_OK;
}

static fsdp_status sim_event_create(fsdp_ctx *ctx, int index, void **out) {
    FSDP_TRY_AT(ctx, begin(ctx, index));
    sim_event *e = sim_event_new(index);
    if (!e) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "sim:%d: no memory for an event", index);
    *out = e;
    return FSDP_OK;
}

static void sim_event_destroy(int index, void *event) {
    (void)index;
    sim_event_free(event);
}

static fsdp_status sim_event_record_on(fsdp_ctx *ctx, int index, void *event, void *stream) {
    sim_stream *s = NULL;
    FSDP_TRY_AT(ctx, stream_on(ctx, index, stream, &s));
    sim_event_record(event, s);
    return FSDP_OK;
}

static fsdp_status sim_stream_wait(fsdp_ctx *ctx, int index, void *stream, void *event) {
    sim_stream *s = NULL;
    FSDP_TRY_AT(ctx, stream_on(ctx, index, stream, &s));
    sim_stream_wait_event(s, event);
    return FSDP_OK;
}

static fsdp_status sim_event_synchronize(fsdp_ctx *ctx, int index, void *event) {
    (void)ctx, (void)index;
    sim_event_sync(event);
    return FSDP_OK;
}

static bool sim_event_query(int index, void *event) {
    (void)index;
    return sim_event_done(event);
}

static void sim_memory_stats(int index, fsdp_device_memory *out) {
    *out = fsdp_sim_memory_stats_get(index);
}

/* A simulated GPU: its name and memory; no peaks (its speed is the host's). */
static void sim_properties(int index, fsdp_device_properties *out) {
    (void)index;
    snprintf(out->name, sizeof out->name, "sim");
    out->total_memory = (int64_t)sim_capacity();
}

static const fsdp_device_i sim_record = {
    .name = "sim",
    .device_count = sim_count,
    .count_note = "FSDP_SIM_DEVICES sets how many, up to " SIM_STR(SIM_MAX_DEVICES),
    .alloc = sim_alloc,
    .alloc_uninit = sim_alloc_uninit,
    .free = sim_free,
    .copy = sim_copy,
    .copy_2d = sim_copy_2d,
    .fill = sim_fill,
    .convert = sim_convert,
    .synchronize = sim_synchronize,
    .memory_stats = sim_memory_stats,
    .memory_reset_peak = fsdp_sim_memory_reset_peak,
    .empty_cache = fsdp_sim_empty_cache,
    .properties = sim_properties,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_current = sim_stream_current,
    .stream_set_current = sim_stream_set_current,
    .stream_synchronize = sim_stream_synchronize,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record_on,
    .stream_wait_event = sim_stream_wait,
    .event_synchronize = sim_event_synchronize,
    .event_query = sim_event_query,
    .kernels = fsdp_kernels_sim,
};

const fsdp_device_i *fsdp_device_sim(void) {
    return &sim_record;
}
