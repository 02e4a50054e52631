/* bench_util.h: what every benchmark shares: a monotonic clock (core's) and the median of
 * timings. */
#ifndef FSDP_BENCH_UTIL_H
#define FSDP_BENCH_UTIL_H

#include <stdlib.h>

#include "core/clock.h"

/* Seconds on the monotonic clock. */
static inline double bench_now(void) {
    return fsdp_clock_now();
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of t[0..n) (sorts t). */
static inline double bench_median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), bench_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

#endif
