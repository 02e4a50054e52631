/* workers.h: the threads a rank owns beyond its own (fsdp_world_options.threads_per_rank - 1),
 * and the split of one kernel call over them. Internal to src/kernels/cpu. */
#ifndef FSDP_KERNELS_CPU_WORKERS_H
#define FSDP_KERNELS_CPU_WORKERS_H

#include <stdint.h>

/* Runs fn(arg, part, parts) for part = 0 .. parts-1, part 0 on the calling thread and the
 * others on its workers, and returns when all have returned. parts is the calling thread's
 * thread count (1 without workers: fn(arg, 0, 1) on the calling thread). */
void fsdp_cpu_workers_run(void (*fn)(void *arg, int part, int parts), void *arg);

/* The calling thread's thread count: 1 + its workers. */
int fsdp_cpu_workers_count(void);

/* [*begin, *end) of part `part` of `parts` over n elements, cut at multiples of `align`
 * elements (a cache line's worth, so no two parts write the same line). */
void fsdp_cpu_split(int64_t n, int64_t align, int part, int parts, int64_t *begin, int64_t *end);

#endif
