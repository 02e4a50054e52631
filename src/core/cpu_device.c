/* cpu_device.c: the registry of device records (core/device.h) and the CPU's memory face:
 * aligned host memory, memmove, element fill and the f32 <-> bf16 and f32 <-> f16
 * conversions. The CPU runs everything at once: it has no queues. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"

#define CPU_ALIGN 64

static int cpu_device_count(void) {
    return 1;
}

static fsdp_status cpu_alloc(fsdp_ctx *ctx, int index, size_t nbytes, void **out) {
    (void)index;
    size_t padded = (nbytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (padded < nbytes)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a tensor",
                         nbytes);
    void *p = aligned_alloc(CPU_ALIGN, padded ? padded : CPU_ALIGN);
    if (!p)
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a tensor",
                         nbytes);
    memset(p, 0, padded ? padded : CPU_ALIGN);
    *out = p;
    return FSDP_OK;
}

static void cpu_free(int index, void *ptr) {
    (void)index;
    free(ptr);
}

static fsdp_status cpu_copy(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, const void *src,
                            fsdp_device src_dev, size_t nbytes) {
    (void)ctx, (void)dst_dev, (void)src_dev;
    if (nbytes && dst != src) memmove(dst, src, nbytes);
    return FSDP_OK;
}

static fsdp_status cpu_copy_2d(fsdp_ctx *ctx, void *dst, fsdp_device dst_dev, size_t dst_pitch,
                               const void *src, fsdp_device src_dev, size_t src_pitch, size_t width,
                               size_t rows) {
    (void)ctx, (void)dst_dev, (void)src_dev;
    for (size_t r = 0; r < rows; r++) {
        char *d = (char *)dst + r * dst_pitch;
        const char *s = (const char *)src + r * src_pitch;
        if (d != s) memcpy(d, s, width);
    }
    return FSDP_OK;
}

static fsdp_status cpu_fill(fsdp_ctx *ctx, int index, void *dst, const void *value,
                            size_t elem_size, int64_t n) {
    (void)index;
    if (elem_size == 4) {
        uint32_t v, *p = dst;
        memcpy(&v, value, sizeof v);
        if (v == 0) { /* +0.0f: memset's stores are wider (a gradient buffer zeroed per step) */
            if (n > 0) memset(dst, 0, (size_t)n * sizeof v);
            return FSDP_OK;
        }
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } else if (elem_size == 2) {
        uint16_t v, *p = dst;
        memcpy(&v, value, sizeof v);
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } else {
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "fill: elements of %zu bytes are not supported",
                         elem_size);
    }
    return FSDP_OK;
}

static fsdp_status cpu_convert(fsdp_ctx *ctx, int index, void *dst, fsdp_dtype dst_dtype,
                               const void *src, fsdp_dtype src_dtype, int64_t n) {
    (void)index;
    if (dst_dtype == FSDP_DTYPE_BF16 && src_dtype == FSDP_DTYPE_F32) {
        fsdp_bf16 *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = fsdp_bf16_from_f32(s[i]);
    } else if (dst_dtype == FSDP_DTYPE_F32 && src_dtype == FSDP_DTYPE_BF16) {
        float *d = dst;
        const fsdp_bf16 *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = fsdp_bf16_to_f32(s[i]);
    } else if (dst_dtype == FSDP_DTYPE_F16 && src_dtype == FSDP_DTYPE_F32) {
        fsdp_f16 *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = fsdp_f16_from_f32(s[i]);
    } else if (dst_dtype == FSDP_DTYPE_F32 && src_dtype == FSDP_DTYPE_F16) {
        float *d = dst;
        const fsdp_f16 *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = fsdp_f16_to_f32(s[i]);
    } else {
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE, "no conversion from %s to %s",
                         fsdp_dtype_to_string(src_dtype), fsdp_dtype_to_string(dst_dtype));
    }
    return FSDP_OK;
}

/* Pinned memory is plain memory on the CPU: nothing runs asynchronously. */
static fsdp_status cpu_host_alloc(fsdp_ctx *ctx, size_t nbytes, void **out) {
    return cpu_alloc(ctx, 0, nbytes, out);
}

static const fsdp_device_i cpu_memory = {
    .name = "cpu",
    .device_count = cpu_device_count,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .copy_2d = cpu_copy_2d,
    .fill = cpu_fill,
    .convert = cpu_convert,
    .synchronize = NULL,
    .host_alloc = cpu_host_alloc,
    .host_free = free,
};

const fsdp_device_i *fsdp_device_cpu_memory(void) {
    return &cpu_memory;
}

/* Written once per kind while the library loads (before main or any rank thread), read after.
 * The CPU's memory face serves until the device layer registers the CPU's whole record. */
static _Atomic(const fsdp_device_i *) registered[FSDP_DEVICE_KINDS] = {&cpu_memory};

const fsdp_device_i *fsdp_device_for(fsdp_device_type type) {
    if ((int)type < 0 || type >= FSDP_DEVICE_KINDS) return NULL;
    return atomic_load(&registered[type]);
}

const fsdp_device_i *fsdp_device_between(fsdp_device dst, fsdp_device src) {
    return fsdp_device_for(dst.type != FSDP_DEVICE_CPU ? dst.type : src.type);
}

void fsdp_device_register(fsdp_device_type type, const fsdp_device_i *record) {
    FSDP_ASSERT((int)type >= 0 && type < FSDP_DEVICE_KINDS && record);
    atomic_store(&registered[type], record);
}

int fsdp_device_count(fsdp_device_type type) {
    const fsdp_device_i *s = fsdp_device_for(type);
    return s ? s->device_count() : 0;
}

fsdp_status fsdp_device_synchronize(fsdp_ctx *ctx, fsdp_device device) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, device));
    const fsdp_device_i *s = fsdp_device_for(device.type);
    return s->synchronize ? s->synchronize(ctx, device.index) : FSDP_OK;
}

/* The record of a device whose allocator the memory calls ask: *out, or an error naming why
 * there is none. */
static fsdp_status memory_record(fsdp_ctx *ctx, const char *fn, fsdp_device device,
                                 const fsdp_device_i **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, device));
    const fsdp_device_i *s = fsdp_device_for(device.type);
    if (!s->memory_stats)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "%s: %s:%d has no caching allocator to report on (its tensors are the "
                         "process's heap memory); ask a cuda or sim device",
                         fn, fsdp_device_to_string(device), device.index);
    *out = s;
    return FSDP_OK;
}

fsdp_status fsdp_device_memory_stats(fsdp_ctx *ctx, fsdp_device device, fsdp_device_memory *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    const fsdp_device_i *s = NULL;
    FSDP_TRY_AT(ctx, memory_record(ctx, __func__, device, &s));
    s->memory_stats(device.index, out);
    return FSDP_OK;
}

fsdp_status fsdp_device_reset_peak_memory(fsdp_ctx *ctx, fsdp_device device) {
    const fsdp_device_i *s = NULL;
    FSDP_TRY_AT(ctx, memory_record(ctx, __func__, device, &s));
    s->memory_reset_peak(device.index);
    return FSDP_OK;
}

fsdp_status fsdp_device_empty_cache(fsdp_ctx *ctx, fsdp_device device) {
    const fsdp_device_i *s = NULL;
    FSDP_TRY_AT(ctx, memory_record(ctx, __func__, device, &s));
    s->empty_cache(device.index);
    return FSDP_OK;
}

fsdp_status fsdp_device_get_properties(fsdp_ctx *ctx, fsdp_device device,
                                       fsdp_device_properties *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_TRY_AT(ctx, fsdp_device_check(ctx, device));
    const fsdp_device_i *s = fsdp_device_for(device.type);
    *out = (fsdp_device_properties){0};
    if (s->properties)
        s->properties(device.index, out);
    else
        snprintf(out->name, sizeof out->name, "%s", s->name);
    return FSDP_OK;
}

fsdp_status fsdp_device_check(fsdp_ctx *ctx, fsdp_device device) {
    const fsdp_device_i *s = fsdp_device_for(device.type);
    if (!s)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "device %s:%d is not available: this build of libfsdp has no %s support "
                         "(rebuild with the CUDA toolkit installed, or use the cpu or sim)",
                         fsdp_device_to_string(device), device.index,
                         fsdp_device_to_string(device));
    int count = s->device_count();
    if (device.index < 0 || device.index >= count)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE,
                         "device %s:%d is not available: this machine has %d %s device%s%s%s%s",
                         fsdp_device_to_string(device), device.index, count,
                         fsdp_device_to_string(device), count == 1 ? "" : "s",
                         s->count_note ? " (" : "", s->count_note ? s->count_note : "",
                         s->count_note ? ")" : "");
    return FSDP_OK;
}
