/* bench_adam.c: one fused Adam step (fsdp_adam_update, the loop fsdp_optimizer_step runs over
 * every parameter range) over --params f32 elements (default 100 M), against this machine's
 * memory bandwidth measured in the same run, on one thread and on all cores: memcpy, a
 * STREAM-style triad, a read of the four arrays, and Adam's own traffic without its arithmetic.
 * Adam must read p, g, m, v (16 B) and write p, m, v (12 B) per element: bytes/s = 28 n / time,
 * reported as a fraction of the best measured bandwidth. */
#define _POSIX_C_SOURCE 200809L // sysconf

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_cli.h"    // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h"   // defines: bench_now, bench_median
#include "optim/update.h" // defines: fsdp_adam_update

#define MAX_THREADS 256
#define MAX_REPS    100

typedef enum pass_kind {
    PASS_COPY,
    PASS_TRIAD,
    PASS_READ4,
    PASS_STREAMS,
    PASS_ADAM,
    PASS_COUNT
} pass_kind;

static const char *const pass_names[PASS_COUNT] = {"memcpy (8 B/elem)", "triad a = b + s*c (12 B)",
                                                   "read p, g, m, v (16 B)",
                                                   "p, m, v += s*g (28 B)", "fused AdamW (28 B)"};
static const double pass_bytes[PASS_COUNT] = {8.0, 12.0, 16.0, 28.0, 28.0}; /* per element */

/* The arrays (n floats each) and the range [begin, end) one thread works on. */
typedef struct job {
    pass_kind kind;
    float *p, *g, *m, *v;
    size_t begin, end;
    const fsdp_adam_options *o;
    int64_t step;
    uint32_t bits; /* PASS_READ4's result, so the reads cannot be dropped */
} job;

static void run_job(job *j) {
    size_t b = j->begin, e = j->end;
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const float *restrict g = j->g;
    switch (j->kind) {
    case PASS_COPY: /* 4 B read + 4 B written per element (non-temporal stores for large n) */
        memcpy(m + b, g + b, (e - b) * sizeof(float));
        break;
    case PASS_TRIAD: /* 8 B read + 4 B written, plus the write-allocate read STREAM ignores */
        for (size_t i = b; i < e; i++) v[i] = g[i] + 0.5f * p[i];
        break;
    case PASS_READ4: { /* an OR of the bits: integer lanes, so it vectorises */
        const uint32_t *u[4] = {(const void *)p, (const void *)g, (const void *)m, (const void *)v};
        uint32_t acc = 0;
        for (size_t i = b; i < e; i++) acc |= u[0][i] | u[1][i] | u[2][i] | u[3][i];
        j->bits = acc;
        break;
    }
    case PASS_STREAMS: /* Adam's traffic without its arithmetic: 16 B read + 12 B written */
        for (size_t i = b; i < e; i++) {
            float d = 1e-6f * g[i];
            p[i] -= d, m[i] += d, v[i] += d;
        }
        break;
    default:
        fsdp_adam_update(FSDP_CPU, p + b, g + b, m + b, v + b, NULL, (int64_t)(e - b), j->o, true,
                         j->step);
    }
}

static volatile uint32_t read_sink;

static void *thread_main(void *arg) {
    run_job(arg);
    return NULL;
}

/* Seconds for one pass over all n elements, split in `threads` contiguous ranges. */
static double timed_pass(job base, size_t n, int threads) {
    job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        jobs[t] = base;
        jobs[t].begin = n / (size_t)threads * (size_t)t;
        jobs[t].end = t == threads - 1 ? n : n / (size_t)threads * (size_t)(t + 1);
    }
    bool running[MAX_THREADS] = {false};
    double t0 = bench_now();
    for (int t = 1; t < threads; t++)
        running[t] = pthread_create(&tid[t], NULL, thread_main, &jobs[t]) == 0;
    for (int t = 0; t < threads; t++)
        if (!running[t]) run_job(&jobs[t]); /* this thread's share, and any failed start's */
    for (int t = 1; t < threads; t++)
        if (running[t]) pthread_join(tid[t], NULL);
    double seconds = bench_now() - t0;
    for (int t = 0; t < threads; t++) read_sink |= jobs[t].bits;
    return seconds;
}

static float *alloc_filled(size_t n, float value) {
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_adam: cannot allocate %zu floats\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = value + (float)(i % 97) * 1e-3f;
    return p;
}

static const char usage[] =
    "usage: bench_adam [--params N] [--reps R] [--threads T]\n"
    "One fused Adam step (fsdp_adam_update) over N f32 elements against this machine's memory\n"
    "bandwidth measured in the same run (memcpy, a STREAM-style triad, a read of the four\n"
    "arrays, Adam's traffic without its arithmetic), on one thread and on T threads.\n"
    "options:\n"
    "  --params N   elements per array (default 100000000; p, g, m, v: 16 N bytes)\n"
    "  --reps R     timed repetitions, the median reported (default 5, at most 100)\n"
    "  --threads T  threads of the multi-threaded rows (default: the online cores, at most 256)\n"
    "  --help, -h   prints this help\n"
    "prints: a table of GB/s per row (Adam: 28 bytes per element) and Adam's fraction of the\n"
    "best measured bandwidth, per thread count. Writes no file.\n"
    "exit status: 0 done; 1 out of memory; 2 bad command line\n";

int main(int argc, char **argv) {
    long long n = 100000000;
    int reps = 5;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores > 0 ? (int)(cores < MAX_THREADS ? cores : MAX_THREADS) : 1;
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--params") == 0)
            n = bench_cli_int("bench_adam", usage, a,
                              bench_cli_value("bench_adam", usage, argc, argv, &i), 1, 1ll << 40);
        else if (strcmp(a, "--reps") == 0)
            reps = (int)bench_cli_int("bench_adam", usage, a,
                                      bench_cli_value("bench_adam", usage, argc, argv, &i), 1,
                                      MAX_REPS);
        else if (strcmp(a, "--threads") == 0)
            threads = (int)bench_cli_int("bench_adam", usage, a,
                                         bench_cli_value("bench_adam", usage, argc, argv, &i), 1,
                                         MAX_THREADS);
        else
            bench_cli_fail("bench_adam", usage, "unknown argument '%s'", a);
    }
    size_t N = (size_t)n;
    float *p = alloc_filled(N, 0.5f), *g = alloc_filled(N, 0.01f);
    float *m = alloc_filled(N, 0.0f), *v = alloc_filled(N, 0.0f);
    fsdp_adam_options o = {
        .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    job base = {.p = p, .g = g, .m = m, .v = v, .o = &o, .step = 1};
    int counts[2] = {1, threads}, n_counts = threads > 1 ? 2 : 1;

    /* times[c][k][r]: thread count c, pass k, repetition r; passes interleaved per repetition,
     * so drift in the machine's state hits them alike. The Adam step count keeps rising. */
    static double times[2][PASS_COUNT][MAX_REPS];
    base.kind = PASS_ADAM;
    timed_pass(base, N, 1); /* warm-up: every page touched */
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < n_counts; c++)
            for (int k = 0; k < PASS_COUNT; k++) {
                base.kind = (pass_kind)k;
                base.step++;
                times[c][k][r] = timed_pass(base, N, counts[c]);
            }
    double bw[2][PASS_COUNT], best[2] = {0, 0};
    for (int c = 0; c < n_counts; c++)
        for (int k = 0; k < PASS_COUNT; k++) {
            bw[c][k] = pass_bytes[k] * (double)n / bench_median(times[c][k], reps);
            if (k != PASS_ADAM && bw[c][k] > best[c]) best[c] = bw[c][k];
        }
    double machine = best[n_counts - 1] > best[0] ? best[n_counts - 1] : best[0];

    printf("bench_adam: fused AdamW step over %lld f32 elements (%.2f GB of p, g, m, v), "
           "median of %d, %ld cores online\n\n",
           n, 16.0 * (double)n / 1e9, reps, cores);
    printf("%-26s %7s %9s %11s %10s %10s\n", "pass", "threads", "ms", "GB/s moved", "of 1-thr",
           "of best");
    for (int c = 0; c < n_counts; c++)
        for (int k = 0; k < PASS_COUNT; k++)
            printf("%-26s %7d %9.1f %11.2f %9.0f%% %9.0f%%\n", pass_names[k], counts[c],
                   pass_bytes[k] * (double)n / bw[c][k] * 1e3, bw[c][k] / 1e9,
                   100 * bw[c][k] / best[0], 100 * bw[c][k] / machine);
    printf("\nThe library's step (one thread) moves 28 B per element at %.2f GB/s:\n"
           "  %.2f of one thread's best measured bandwidth (%.2f GB/s),\n"
           "  %.2f of the machine's (%.2f GB/s, the best pass without Adam on 1 or %d threads),\n"
           "  %.2f of the same traffic without Adam's arithmetic on one thread (%.2f GB/s).\n",
           bw[0][PASS_ADAM] / 1e9, bw[0][PASS_ADAM] / best[0], best[0] / 1e9,
           bw[0][PASS_ADAM] / machine, machine / 1e9, counts[n_counts - 1],
           bw[0][PASS_ADAM] / bw[0][PASS_STREAMS], bw[0][PASS_STREAMS] / 1e9);
    volatile float sink = p[N / 2] + v[N / 3] + m[N / 5];
    (void)sink;
    free(p), free(g), free(m), free(v);
    return 0;
}
