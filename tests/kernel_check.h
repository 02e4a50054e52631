/* kernel_check.h: what the CPU kernel suites share to check a kernel against a double-precision
 * reference: allocation, random inputs (kernel_rng.h's private stream, one per test program),
 * comparisons of float results with double references, and central finite differences.
 * Header-only, like kernel_rng.h, so every program keeps its own RNG stream. */
#ifndef FSDP_TESTS_KERNEL_CHECK_H
#define FSDP_TESTS_KERNEL_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"    // defines: fsdp_test_close
#include "kernel_rng.h" // defines: rng_uniform

/* n floats, zeroed (at least one, so a zero-size case still has a valid pointer). */
static inline float *new_floats(int64_t n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static inline double *new_doubles(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

/* n floats uniform in [lo, hi) from the program's stream. */
static inline float *new_uniform(int64_t n, float lo, float hi) {
    float *p = new_floats(n);
    for (int64_t i = 0; i < n; i++) p[i] = rng_uniform(lo, hi);
    return p;
}

static inline double *to_doubles(const float *x, int64_t n) {
    double *d = new_doubles(n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* fsdp_test_close against a double reference (rounded to float for the comparison). */
static inline bool close_to_double(const char *name, const float *got, const double *want,
                                   int64_t n, double rtol, double atol) {
    float *w = new_floats(n);
    for (int64_t i = 0; i < n; i++) w[i] = (float)want[i];
    bool ok = fsdp_test_close(name, got, w, n, rtol, atol);
    free(w);
    return ok;
}
#define CLOSE_D(name, got, want, n, rtol, atol)                                                    \
    CU_ASSERT_TRUE(close_to_double((name), (got), (want), (n), (rtol), (atol)))

/* A scalar result: prints the difference like fsdp_test_close and checks it. */
static inline bool close_scalar(const char *name, double got, double want, double rtol,
                                double atol) {
    double d = fabs(got - want);
    printf("\n    %-40s got %.17g want %.17g (abs diff %.3g)", name, got, want, d);
    return d <= atol + rtol * fabs(want);
}
#define CLOSE_S(name, got, want, rtol, atol)                                                       \
    CU_ASSERT_TRUE(close_scalar((name), (got), (want), (rtol), (atol)))

/* A scalar loss of n double parameters (the forward in double), for finite differences. */
typedef double (*loss_fn)(const double *x, const void *aux);

/* grad (n) = central differences (L(x + h e_i) - L(x - h e_i)) / 2h; x is restored. */
static inline void finite_diff(double *grad, loss_fn loss, double *x, int64_t n, double h,
                               const void *aux) {
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double up = loss(x, aux);
        x[i] = x0 - h;
        double down = loss(x, aux);
        x[i] = x0;
        grad[i] = (up - down) / (2.0 * h);
    }
}

#endif
