/* kernel_rng.h: the kernel suites' private random inputs (xorshift64*, one stream per test
 * program, reseeded per case), independent of the library's own Philox RNG under test. */
#ifndef FSDP_TESTS_KERNEL_RNG_H
#define FSDP_TESTS_KERNEL_RNG_H

#include <stdint.h>

static uint64_t rng_state;

static inline void rng_seed(uint64_t seed) {
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
}

static inline uint32_t rng_u32(void) { // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static inline float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)rng_u32() / 4294967296.0);
}

#endif
