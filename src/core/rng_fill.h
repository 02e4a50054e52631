/* rng_fill.h: how fsdp_init_block spreads a fill over threads, for the library and its tests.
 * Each element's value is a function of its global index alone, so any split gives the same
 * bits as one thread. */
#ifndef FSDP_CORE_RNG_FILL_H
#define FSDP_CORE_RNG_FILL_H

#include "fsdp/rng.h"

/* Fills below this many elements stay on the calling thread. A serial fill of 2^20 f32 took
 * 5.5 ms (uniform), 56 ms (normal) or 0.36 ms (a constant) on 2 x86-64 cores, and starting and
 * joining 16 threads 1.6 ms: the random fills gain from here on; the tensors below it (norms,
 * biases, small layers) are many, and a world's rank threads may initialise at once. */
#define FSDP_INIT_SERIAL_BELOW (INT64_C(1) << 20)
/* The default thread count: the online CPUs, at most this many. */
#define FSDP_INIT_THREADS_DEFAULT_MAX 16
/* The most threads FSDP_INIT_THREADS (or a caller of fsdp_init_block_threads) may ask for. */
#define FSDP_INIT_THREADS_MAX 64

/* The threads fsdp_init_block uses for a fill of numel elements: 1 below
 * FSDP_INIT_SERIAL_BELOW; otherwise the environment variable FSDP_INIT_THREADS (1 to
 * FSDP_INIT_THREADS_MAX; 1 fills on the calling thread) or, unset, the online CPUs capped at
 * FSDP_INIT_THREADS_DEFAULT_MAX. A malformed FSDP_INIT_THREADS is refused with
 * FSDP_ERR_INVALID_ARGUMENT, whatever numel is. */
fsdp_status fsdp_init_threads(fsdp_ctx *ctx, int64_t numel, int *threads);

/* fsdp_init_block split into `threads` (1 to FSDP_INIT_THREADS_MAX) ranges whatever the
 * size, of which at most `spawn` run on new threads (negative: all but the first); the others
 * are filled on the calling thread, as when a thread cannot be created. *started (when not
 * NULL) receives the threads started. */
fsdp_status fsdp_init_block_threads(fsdp_ctx *ctx, fsdp_tensor *t, const fsdp_init *init,
                                    uint64_t seed, uint64_t stream, int global_ndim,
                                    const int64_t *global_shape, const int64_t *block_start,
                                    int threads, int spawn, int *started);

#endif
