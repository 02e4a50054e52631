/* rng.h: counter-based random numbers (Philox4x32-10). Any element of any tensor is drawn
 * from (seed, stream, global index) alone, so a parameter initialised in pieces on many ranks
 * equals the same parameter initialised whole on one. */
#ifndef FSDP_RNG_H
#define FSDP_RNG_H

#include <stdint.h>

#include "fsdp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32-10 block: 4 random words from a 128-bit counter and a 64-bit key. */
void fsdp_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* A stream id for a name (64-bit FNV-1a), e.g. a parameter's fully qualified name. */
uint64_t fsdp_rng_stream(const char *name);

/* Element `index` of stream `stream` under `seed`: uniform in [0, 1), 24 random bits. */
float fsdp_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Element `index` of stream `stream` under `seed`: standard normal (Box-Muller). */
float fsdp_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

typedef enum fsdp_init_kind {
    FSDP_INIT_ZEROS = 0,
    FSDP_INIT_ONES,
    FSDP_INIT_CONSTANT, /* a */
    FSDP_INIT_UNIFORM,  /* uniform in [a, b) */
    FSDP_INIT_NORMAL    /* mean a, standard deviation b */
} fsdp_init_kind;

typedef struct fsdp_init {
    fsdp_init_kind kind;
    float a, b;
} fsdp_init;

/* Fills t, which holds the block of a larger (global) tensor whose first element sits at
 * global coordinates block_start: the element at global flat index g receives draw g of
 * (seed, stream). t's shape is the block's shape and has global_ndim dims. Pass
 * global_shape = t's shape and block_start = zeros (or use fsdp_init_tensor) for a whole
 * tensor. bf16 and f16 tensors receive the rounded f32 draw; other dtypes (i32) are refused
 * with FSDP_ERR_DTYPE. A fill of 2^20 elements or more is split over threads (the online CPUs
 * up to 16, or the environment variable FSDP_INIT_THREADS, 1 to 64) with the same bits; a
 * malformed FSDP_INIT_THREADS is refused with FSDP_ERR_INVALID_ARGUMENT. */
fsdp_status fsdp_init_block(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                            uint64_t stream, int global_ndim, const int64_t *global_shape,
                            const int64_t *block_start);
fsdp_status fsdp_init_tensor(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init, uint64_t seed,
                             uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif
