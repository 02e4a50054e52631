/* bench_adam.c: one fused Adam step (fsdp_adam_update) over --params f32 elements (default
 * 100 M), against this machine's memory bandwidth measured in the same run with memcpy and a
 * STREAM-style triad. Adam must read p, g, m, v (16 B) and write p, m, v (12 B) per element:
 * bytes/s = 28 n / time, reported as a fraction of the measured bandwidth. */
#define _POSIX_C_SOURCE 200809L // clock_gettime

#include <stdio.h>

#include "bench_util.h" // defines: bench_now, bench_median
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optim/update.h" // defines: fsdp_adam_update

static float *alloc_filled(size_t n, float value) {
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_adam: cannot allocate %zu floats\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = value + (float)(i % 97) * 1e-3f;
    return p;
}

int main(int argc, char **argv) {
    long long n = 100000000;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--params") == 0 && i + 1 < argc)
            n = atoll(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: bench_adam [--params N (default 1e8)] [--reps R (default 5)]\n");
            return 2;
        }
    }
    if (n <= 0 || reps <= 0 || reps > 100) {
        fprintf(stderr, "bench_adam: --params must be > 0 and --reps in [1, 100]\n");
        return 2;
    }
    size_t N = (size_t)n;
    float *p = alloc_filled(N, 0.5f), *g = alloc_filled(N, 0.01f);
    float *m = alloc_filled(N, 0.0f), *v = alloc_filled(N, 0.0f);
    fsdp_adam_options o = {
        .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};

    double t_adam[100], t_copy[100], t_triad[100];
    fsdp_adam_update(p, g, m, v, NULL, n, &o, true, 1); /* warm-up: pages touched */
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        fsdp_adam_update(p, g, m, v, NULL, n, &o, true, r + 2);
        t_adam[r] = bench_now() - t0;
        t0 = bench_now();
        memcpy(m, g, N * sizeof(float)); /* 4 B read + 4 B written per element */
        t_copy[r] = bench_now() - t0;
        t0 = bench_now();
        for (size_t i = 0; i < N; i++) v[i] = g[i] + 0.5f * p[i]; /* 8 B read + 4 B written */
        t_triad[r] = bench_now() - t0;
    }
    double adam = bench_median(t_adam, reps), copy = bench_median(t_copy, reps),
           triad = bench_median(t_triad, reps);
    double bw_adam = 28.0 * (double)n / adam, bw_copy = 8.0 * (double)n / copy;
    double bw_triad = 12.0 * (double)n / triad;
    double best = bw_copy > bw_triad ? bw_copy : bw_triad;
    printf("bench_adam: fused AdamW step over %lld f32 elements (%.2f GB of p, g, m, v), "
           "single thread, median of %d\n\n",
           n, 16.0 * (double)n / 1e9, reps);
    printf("%-28s %10s %12s %10s\n", "pass", "ms", "GB/s moved", "of best");
    printf("%-28s %10.1f %12.2f %9.0f%%\n", "memcpy (8 B/elem)", copy * 1e3, bw_copy / 1e9,
           100 * bw_copy / best);
    printf("%-28s %10.1f %12.2f %9.0f%%\n", "triad a = b + s*c (12 B)", triad * 1e3, bw_triad / 1e9,
           100 * bw_triad / best);
    printf("%-28s %10.1f %12.2f %9.0f%%\n", "fused AdamW (28 B/elem)", adam * 1e3, bw_adam / 1e9,
           100 * bw_adam / best);
    printf("\nAdam reaches %.2f of the best measured bandwidth (%.2f GB/s).\n", bw_adam / best,
           best / 1e9);
    volatile float sink = p[N / 2] + v[N / 3] + m[N / 5];
    (void)sink;
    free(p), free(g), free(m), free(v);
    return 0;
}
