/* rng.c: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") and
 * tensor initialisation from global coordinates. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/tensor_impl.h"
#include "fsdp/rng.h"

#define PHILOX_M0        0xD2511F53u
#define PHILOX_M1        0xCD9E8D57u
#define PHILOX_W0        0x9E3779B9u
#define PHILOX_W1        0xBB67AE85u
#define TWO_PI           6.283185307179586476925286766559
#define NORMAL_KEY_TWEAK 0x4E4F524Du /* separates normal draws from uniform ones */

void fsdp_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t fsdp_rng_stream(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

static void draw(uint64_t seed, uint64_t stream, uint64_t block, uint32_t tweak, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ tweak};
    fsdp_philox4x32(ctr, key, out);
}

float fsdp_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    draw(seed, stream, index >> 2, 0, r);
    return (float)(r[index & 3] >> 8) * 0x1.0p-24f;
}

float fsdp_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    draw(seed, stream, index, NORMAL_KEY_TWEAK, r);
    double u1 = ((double)r[0] + 1.0) * 0x1.0p-32; /* (0, 1]: log is finite */
    double u2 = (double)r[1] * 0x1.0p-32;
    return (float)(sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2));
}

static float init_value(const fsdp_init *init, uint64_t seed, uint64_t stream, uint64_t g) {
    switch (init->kind) {
    case FSDP_INIT_ZEROS:
        return 0.0f;
    case FSDP_INIT_ONES:
        return 1.0f;
    case FSDP_INIT_CONSTANT:
        return init->a;
    case FSDP_INIT_UNIFORM:
        return init->a + (init->b - init->a) * fsdp_rng_uniform(seed, stream, g);
    case FSDP_INIT_NORMAL:
        return init->a + init->b * fsdp_rng_normal(seed, stream, g);
    }
    return 0.0f;
}

static void store(fsdp_tensor *t, int64_t i, float v) {
    if (t->dtype == FSDP_DTYPE_F32)
        ((float *)fsdp_tensor_data(t))[i] = v;
    else if (t->dtype == FSDP_DTYPE_F16)
        ((fsdp_f16 *)fsdp_tensor_data(t))[i] = fsdp_f16_from_f32(v);
    else
        ((fsdp_bf16 *)fsdp_tensor_data(t))[i] = fsdp_bf16_from_f32(v);
}

fsdp_status fsdp_init_block(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                            uint64_t stream, int global_ndim, const int64_t *global_shape,
                            const int64_t *block_start) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, init);
    if (global_ndim > 0) FSDP_ARG_NOT_NULL(ctx, global_shape);
    if (global_ndim > 0) FSDP_ARG_NOT_NULL(ctx, block_start);
    if (init->kind < FSDP_INIT_ZEROS || init->kind > FSDP_INIT_NORMAL)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "fsdp_init_block: unknown init kind %d",
                         (int)init->kind);
    if (global_ndim != t->ndim)
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                         "fsdp_init_block: a %d-d block of a %d-d tensor; they must match", t->ndim,
                         global_ndim);
    if (t->storage->device.type != FSDP_DEVICE_CPU)
        return FSDP_FAIL(ctx, FSDP_ERR_DEVICE, "fsdp_init_block: initialise on the CPU, then copy");
    if (t->dtype != FSDP_DTYPE_F32 && t->dtype != FSDP_DTYPE_BF16 && t->dtype != FSDP_DTYPE_F16)
        return FSDP_FAIL(ctx, FSDP_ERR_DTYPE,
                         "fsdp_init_block: the tensor is %s; random initialisation fills f32, bf16 "
                         "and f16 tensors (fill integer tensors with fsdp_tensor_fill or your own "
                         "values)",
                         fsdp_dtype_to_string(t->dtype));
    int64_t gstride[FSDP_MAX_DIMS], stride = 1;
    for (int d = global_ndim - 1; d >= 0; d--) {
        if (block_start[d] < 0 || block_start[d] + t->shape[d] > global_shape[d])
            return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                             "fsdp_init_block: dim %d: block [%lld, %lld) is outside the global "
                             "size %lld",
                             d, (long long)block_start[d],
                             (long long)(block_start[d] + t->shape[d]), (long long)global_shape[d]);
        gstride[d] = stride;
        stride *= global_shape[d];
    }
    if (t->numel == 0) return FSDP_OK;
    int64_t idx[FSDP_MAX_DIMS] = {0};
    int last = t->ndim - 1;
    int64_t row = last >= 0 ? t->shape[last] : 1;
    for (int64_t i = 0; i < t->numel; i += row) {
        uint64_t g = 0;
        for (int d = 0; d < t->ndim; d++) g += (uint64_t)((block_start[d] + idx[d]) * gstride[d]);
        for (int64_t j = 0; j < row; j++)
            store(t, i + j, init_value(init, seed, stream, g + (uint64_t)j));
        for (int d = last - 1; d >= 0; d--) { /* next row: odometer over the leading dims */
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    return FSDP_OK;
}

fsdp_status fsdp_init_tensor(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                             uint64_t stream) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, init);
    const int64_t zeros[FSDP_MAX_DIMS] = {0};
    return fsdp_init_block(ctx, t, init, seed, stream, t->ndim, t->shape, zeros);
}
