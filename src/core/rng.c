/* rng.c: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") and
 * tensor initialisation from global coordinates; a large fill is split into ranges of the
 * block over threads, each element's value a function of its global index alone. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> // defines: sysconf
#if defined(__SSE2__)
#include <emmintrin.h> // defines: _mm_mul_epu32
#endif

#include "core/error.h"
#include "core/rng_fill.h"
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

/* Uniform in [0, 1) from one random word: its top 24 bits. */
static float uniform_from(uint32_t word) {
    return (float)(word >> 8) * 0x1.0p-24f;
}

/* A standard normal from the first two words of a block (Box-Muller in double). */
static float normal_from(uint32_t r0, uint32_t r1) {
    double u1 = ((double)r0 + 1.0) * 0x1.0p-32; /* (0, 1]: log is finite */
    double u2 = (double)r1 * 0x1.0p-32;
    return (float)(sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2));
}

float fsdp_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    draw(seed, stream, index >> 2, 0, r);
    return uniform_from(r[index & 3]);
}

float fsdp_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    draw(seed, stream, index, NORMAL_KEY_TWEAK, r);
    return normal_from(r[0], r[1]);
}

#define RUN   256 /* values drawn before they are stored */
#define LANES 8   /* normal draws' Philox blocks computed together (two SSE2 registers) */

/* fsdp_philox4x32 on LANES counters at once under one key: c[w][l] is word w of counter l
 * in, of block l out. The same integer operations as fsdp_philox4x32, so the same words; on
 * x86-64, four counters to an SSE2 register (GCC 12 does not vectorise the 32 x 32 -> 64-bit
 * products of the plain loop below by itself). */
#if defined(__SSE2__)
static __m128i mul_lo(__m128i even, __m128i odd) { /* low words of the 4 products */
    return _mm_or_si128(_mm_and_si128(even, _mm_set1_epi64x(0xffffffff)), _mm_slli_epi64(odd, 32));
}
static __m128i mul_hi(__m128i even, __m128i odd) { /* high words of the 4 products */
    return _mm_or_si128(_mm_srli_epi64(even, 32),
                        _mm_andnot_si128(_mm_set1_epi64x(0xffffffff), odd));
}

static void philox_lanes(uint32_t c[4][LANES], uint32_t k0, uint32_t k1) {
    const __m128i m0 = _mm_set1_epi32((int)PHILOX_M0), m1 = _mm_set1_epi32((int)PHILOX_M1);
    for (int l = 0; l < LANES; l += 4) {
        __m128i c0 = _mm_loadu_si128((const __m128i *)&c[0][l]);
        __m128i c1 = _mm_loadu_si128((const __m128i *)&c[1][l]);
        __m128i c2 = _mm_loadu_si128((const __m128i *)&c[2][l]);
        __m128i c3 = _mm_loadu_si128((const __m128i *)&c[3][l]);
        uint32_t key0 = k0, key1 = k1;
        for (int round = 0; round < 10; round++) {
            __m128i p0e = _mm_mul_epu32(c0, m0), p0o = _mm_mul_epu32(_mm_srli_epi64(c0, 32), m0);
            __m128i p1e = _mm_mul_epu32(c2, m1), p1o = _mm_mul_epu32(_mm_srli_epi64(c2, 32), m1);
            c0 = _mm_xor_si128(_mm_xor_si128(mul_hi(p1e, p1o), c1), _mm_set1_epi32((int)key0));
            c2 = _mm_xor_si128(_mm_xor_si128(mul_hi(p0e, p0o), c3), _mm_set1_epi32((int)key1));
            c1 = mul_lo(p1e, p1o);
            c3 = mul_lo(p0e, p0o);
            key0 += PHILOX_W0;
            key1 += PHILOX_W1;
        }
        _mm_storeu_si128((__m128i *)&c[0][l], c0);
        _mm_storeu_si128((__m128i *)&c[1][l], c1);
        _mm_storeu_si128((__m128i *)&c[2][l], c2);
        _mm_storeu_si128((__m128i *)&c[3][l], c3);
    }
}
#else
static void philox_lanes(uint32_t c[4][LANES], uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        for (int l = 0; l < LANES; l++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c[0][l], p1 = (uint64_t)PHILOX_M1 * c[2][l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1][l] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3][l] ^ k1;
            c[0][l] = n0;
            c[1][l] = (uint32_t)p1;
            c[2][l] = n2;
            c[3][l] = (uint32_t)p0;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
}
#endif

/* v[k] (k < n <= RUN) = the value of the element at global index g + k: the same expressions
 * as fsdp_rng_uniform and fsdp_rng_normal give, with the kind chosen once per run and one
 * uniform block drawn for the 4 consecutive elements it serves. */
static void init_values(const fsdp_init *init, uint64_t seed, uint64_t stream, uint64_t g,
                        int64_t n, float *v) {
    uint32_t r[4];
    switch (init->kind) {
    case FSDP_INIT_ZEROS:
    case FSDP_INIT_ONES:
    case FSDP_INIT_CONSTANT: {
        float c = init->kind == FSDP_INIT_ZEROS  ? 0.0f
                  : init->kind == FSDP_INIT_ONES ? 1.0f
                                                 : init->a;
        for (int64_t k = 0; k < n; k++) v[k] = c;
        return;
    }
    case FSDP_INIT_UNIFORM: {
        float a = init->a, width = init->b - init->a;
        for (int64_t k = 0; k < n; k++) {
            uint64_t i = g + (uint64_t)k;
            if (k == 0 || (i & 3) == 0) draw(seed, stream, i >> 2, 0, r);
            v[k] = a + width * uniform_from(r[i & 3]);
        }
        return;
    }
    case FSDP_INIT_NORMAL:
        for (int64_t k = 0; k < n; k += LANES) {
            uint32_t c[4][LANES];
            for (int l = 0; l < LANES; l++) { /* draw's counter for element g + k + l */
                uint64_t i = g + (uint64_t)(k + l);
                c[0][l] = (uint32_t)i;
                c[1][l] = (uint32_t)(i >> 32);
                c[2][l] = (uint32_t)stream;
                c[3][l] = (uint32_t)(stream >> 32);
            }
            philox_lanes(c, (uint32_t)seed, (uint32_t)(seed >> 32) ^ NORMAL_KEY_TWEAK);
            for (int l = 0; l < LANES && k + l < n; l++)
                v[k + l] = init->a + init->b * normal_from(c[0][l], c[1][l]);
        }
        return;
    }
}

/* Elements [at, at + n) of t receive v (bf16 and f16 the rounded value). */
static void store_values(fsdp_tensor *t, int64_t at, const float *v, int64_t n) {
    void *data = fsdp_tensor_data(t);
    if (t->dtype == FSDP_DTYPE_F32) {
        memcpy((float *)data + at, v, (size_t)n * sizeof *v);
    } else if (t->dtype == FSDP_DTYPE_F16) {
        fsdp_f16 *out = (fsdp_f16 *)data + at;
        for (int64_t k = 0; k < n; k++) out[k] = fsdp_f16_from_f32(v[k]);
    } else {
        fsdp_bf16 *out = (fsdp_bf16 *)data + at;
        for (int64_t k = 0; k < n; k++) out[k] = fsdp_bf16_from_f32(v[k]);
    }
}

typedef struct fill_plan {
    fsdp_tensor *t; /* the block */
    const fsdp_init *init;
    uint64_t seed, stream;
    int64_t gstride[FSDP_MAX_DIMS]; /* the global tensor's strides */
    int64_t start[FSDP_MAX_DIMS];   /* the block's first element in global coordinates */
} fill_plan;

/* Fills the block's elements [lo, hi) (local flat indices), row by row. */
static void fill_range(const fill_plan *p, int64_t lo, int64_t hi) {
    const fsdp_tensor *t = p->t;
    int last = t->ndim - 1;
    int64_t row = last >= 0 ? t->shape[last] : 1;
    int64_t idx[FSDP_MAX_DIMS] = {0}, rows = lo / row, j = lo % row;
    for (int d = last - 1; d >= 0; d--) { /* lo's row in local coordinates */
        idx[d] = rows % t->shape[d];
        rows /= t->shape[d];
    }
    float v[RUN];
    for (int64_t i = lo; i < hi; j = 0) {
        uint64_t g = 0; /* the row's first element, globally; idx[last] stays 0 */
        for (int d = 0; d < t->ndim; d++) g += (uint64_t)((p->start[d] + idx[d]) * p->gstride[d]);
        int64_t end = row - j < hi - i ? row : j + (hi - i);
        while (j < end) {
            int64_t n = end - j < RUN ? end - j : RUN;
            init_values(p->init, p->seed, p->stream, g + (uint64_t)j, n, v);
            store_values(p->t, i, v, n);
            i += n;
            j += n;
        }
        for (int d = last - 1; d >= 0; d--) { /* next row: odometer over the leading dims */
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

typedef struct fill_part {
    const fill_plan *plan;
    int64_t lo, hi;
    pthread_t thread;
    int started;
} fill_part;

static void *fill_main(void *arg) {
    const fill_part *part = arg;
    fill_range(part->plan, part->lo, part->hi);
    return NULL;
}

/* Splits the block into `parts` ranges of (nearly) equal size; the first and any past the
 * first `spawn` (or whose thread cannot be created) are filled on the calling thread. Returns
 * the threads started. */
static int fill_parallel(const fill_plan *p, int parts, int spawn) {
    int started = 0;
    fill_part part[FSDP_INIT_THREADS_MAX];
    int64_t numel = p->t->numel, each = numel / parts, extra = numel % parts, lo = 0;
    for (int k = 0; k < parts; k++) {
        part[k] = (fill_part){.plan = p, .lo = lo, .hi = lo + each + (k < extra)};
        lo = part[k].hi;
        if (k > 0 && k <= spawn)
            started += part[k].started =
                pthread_create(&part[k].thread, NULL, fill_main, &part[k]) == 0;
    }
    fill_range(p, 0, each + (extra > 0)); /* part 0 */
    for (int k = 1; k < parts; k++) {
        if (part[k].started)
            pthread_join(part[k].thread, NULL);
        else
            fill_range(p, part[k].lo, part[k].hi);
    }
    return started;
}

fsdp_status fsdp_init_threads(fsdp_ctx *ctx, int64_t numel, int *threads) {
    const char *env = getenv("FSDP_INIT_THREADS");
    long want = 0;
    if (env) {
        char *end;
        errno = 0;
        want = strtol(env, &end, 10);
        if (end == env || *end != '\0' || errno != 0 || want < 1 || want > FSDP_INIT_THREADS_MAX)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "FSDP_INIT_THREADS is '%s': set it to a whole number from 1 (fill "
                             "on the calling thread) to %d, or unset it to use the online CPUs "
                             "(at most %d)",
                             env, FSDP_INIT_THREADS_MAX, FSDP_INIT_THREADS_DEFAULT_MAX);
    }
    if (numel < FSDP_INIT_SERIAL_BELOW) {
        *threads = 1;
        return FSDP_OK;
    }
    if (want == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        want = cpus < 1                               ? 1
               : cpus > FSDP_INIT_THREADS_DEFAULT_MAX ? FSDP_INIT_THREADS_DEFAULT_MAX
                                                      : cpus;
    }
    *threads = (int)want;
    return FSDP_OK;
}

/* fsdp_init_block past its NULL checks; threads 0 chooses by fsdp_init_threads. */
static fsdp_status init_block(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                              uint64_t stream, int global_ndim, const int64_t *global_shape,
                              const int64_t *block_start, int threads, int spawn, int *started) {
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
    fill_plan plan = {.t = t, .init = init, .seed = seed, .stream = stream};
    int64_t stride = 1;
    for (int d = global_ndim - 1; d >= 0; d--) {
        if (block_start[d] < 0 || block_start[d] + t->shape[d] > global_shape[d])
            return FSDP_FAIL(ctx, FSDP_ERR_SHAPE,
                             "fsdp_init_block: dim %d: block [%lld, %lld) is outside the global "
                             "size %lld",
                             d, (long long)block_start[d],
                             (long long)(block_start[d] + t->shape[d]), (long long)global_shape[d]);
        plan.gstride[d] = stride;
        plan.start[d] = block_start[d];
        stride *= global_shape[d];
    }
    if (threads == 0) FSDP_TRY(fsdp_init_threads(ctx, t->numel, &threads));
    if (started) *started = 0;
    if (t->numel == 0) return FSDP_OK;
    if (threads > t->numel) threads = (int)t->numel;
    int n = fill_parallel(&plan, threads, spawn < 0 || spawn >= threads ? threads - 1 : spawn);
    if (started) *started = n;
    return FSDP_OK;
}

fsdp_status fsdp_init_block(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                            uint64_t stream, int global_ndim, const int64_t *global_shape,
                            const int64_t *block_start) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, init);
    if (global_ndim > 0) FSDP_ARG_NOT_NULL(ctx, global_shape);
    if (global_ndim > 0) FSDP_ARG_NOT_NULL(ctx, block_start);
    return init_block(ctx, t, init, seed, stream, global_ndim, global_shape, block_start, 0, -1,
                      NULL);
}

fsdp_status fsdp_init_block_threads(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init,
                                    uint64_t seed, uint64_t stream, int global_ndim,
                                    const int64_t *global_shape, const int64_t *block_start,
                                    int threads, int spawn, int *started) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, init);
    if (global_ndim > 0) FSDP_ARG_NOT_NULL(ctx, global_shape);
    if (global_ndim > 0) FSDP_ARG_NOT_NULL(ctx, block_start);
    if (threads < 1 || threads > FSDP_INIT_THREADS_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_init_block_threads: %d threads; pass 1 to %d", threads,
                         FSDP_INIT_THREADS_MAX);
    return init_block(ctx, t, init, seed, stream, global_ndim, global_shape, block_start, threads,
                      spawn, started);
}

fsdp_status fsdp_init_tensor(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                             uint64_t stream) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, t);
    FSDP_ARG_NOT_NULL(ctx, init);
    const int64_t zeros[FSDP_MAX_DIMS] = {0};
    return fsdp_init_block(ctx, t, init, seed, stream, t->ndim, t->shape, zeros);
}
