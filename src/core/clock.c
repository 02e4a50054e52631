/* clock.c: fsdp_clock_now, monotonic seconds. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "core/clock.h"

double fsdp_clock_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
