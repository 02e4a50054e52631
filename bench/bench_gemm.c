/* bench_gemm.c: sgemm through the CPU kernel table (fsdp_kernels_cpu()->gemm) against
 * cblas_sgemm called directly, in the same run: warm-up, then the median of --reps timed
 * repetitions of each, interleaved. GFLOP/s = 2 M N K / time; ratio = table / direct. */

#include <cblas.h> // defines: cblas_sgemm, openblas_get_num_threads, openblas_get_config
#include <math.h>
#include <stdio.h>

#include "bench_cli.h"  // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_util.h" // defines: bench_now, bench_median
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h" // defines: fsdp_kernels_cpu

typedef struct gemm_shape {
    bool ta, tb;
    int64_t M, N, K;
} gemm_shape;

typedef struct operands {
    float *A, *B, *C; // op(A) (M, K), op(B) (K, N), C (M, N), all dense
    int64_t lda, ldb, ldc;
} operands;

typedef void (*gemm_runner)(const gemm_shape *s, const operands *o);

static void run_table(const gemm_shape *s, const operands *o) {
    fsdp_kernels_cpu()->gemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, o->A, o->lda, o->B, o->ldb, 0.0f,
                             o->C, o->ldc);
}

static void run_cblas(const gemm_shape *s, const operands *o) {
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                (int)s->M, (int)s->N, (int)s->K, 1.0f, o->A, (int)o->lda, o->B, (int)o->ldb, 0.0f,
                o->C, (int)o->ldc);
}

/* Seconds per call, averaged over `inner` back-to-back calls. */
static double time_calls(gemm_runner run, const gemm_shape *s, const operands *o, int inner) {
    double t0 = bench_now();
    for (int i = 0; i < inner; i++) run(s, o);
    return (bench_now() - t0) / inner;
}

static float *new_random(int64_t n, unsigned *seed) {
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory (%lld floats)\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)(*seed >> 8) / 8388608.0f - 1.0f; // uniform in [-1, 1)
    }
    return p;
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* Times one shape and prints its row. Each repetition times the table and the direct call
 * back to back, alternating which goes first; tiny shapes repeat calls so one timing is
 * at least about 2 ms. */
static void bench_shape(const gemm_shape *s, int reps) {
    unsigned seed = 42;
    operands o = {.lda = s->ta ? s->M : s->K, .ldb = s->tb ? s->K : s->N, .ldc = s->N};
    o.A = new_random(s->M * s->K, &seed);
    o.B = new_random(s->K * s->N, &seed);
    o.C = new_random(s->M * s->N, &seed);
    float *C_direct = new_random(s->M * s->N, &seed);

    for (int i = 0; i < 3; i++) run_table(s, &o), run_cblas(s, &o);
    double once = time_calls(run_cblas, s, &o, 1);
    int inner = once >= 2e-3 ? 1 : (int)(2e-3 / fmax(once, 1e-7)) + 1;

    double *t_table = malloc(2 * (size_t)reps * sizeof(double)), *t_direct = t_table + reps;
    if (!t_table) exit(1);
    for (int r = 0; r < reps; r++) {
        if (r % 2) t_direct[r] = time_calls(run_cblas, s, &o, inner);
        t_table[r] = time_calls(run_table, s, &o, inner);
        if (!(r % 2)) t_direct[r] = time_calls(run_cblas, s, &o, inner);
    }
    double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
    double g_table = flop / bench_median(t_table, reps) * 1e-9;
    double g_direct = flop / bench_median(t_direct, reps) * 1e-9;

    run_table(s, &o);
    operands od = o;
    od.C = C_direct;
    run_cblas(s, &od);
    double diff = max_abs_diff(o.C, C_direct, s->M * s->N);

    printf("%c%c  %5lld %5lld %5lld  %12.1f %12.1f  %6.3f  %9.3f  %8.2g\n", s->ta ? 'T' : 'N',
           s->tb ? 'T' : 'N', (long long)s->M, (long long)s->N, (long long)s->K, g_table, g_direct,
           g_table / g_direct, 1e3 * bench_median(t_direct, reps), diff);
    free(o.A), free(o.B), free(o.C), free(C_direct), free(t_table);
}

#define NAME "bench_gemm"
static const char usage[] =
    "usage: bench_gemm [--reps N]\n"
    "sgemm through the CPU kernel table (fsdp_kernels_cpu()->gemm) against cblas_sgemm called\n"
    "directly, in the same run, on OpenBLAS's threads: NN, NT, TN, TT at 512^3 and NN at\n"
    "1024^3, 4096x64x512 and 64^3; 3 warm-up calls, then N timed repetitions of each,\n"
    "interleaved.\n"
    "options:\n"
    "  --reps N    timed repetitions, median (default 21, 1 to 100000)\n"
    "  --help, -h  prints this help\n"
    "prints: per shape GFLOP/s (2 M N K / time) of each, their ratio (table / direct), the\n"
    "direct call's ms and the largest difference between the two results. Writes no file.\n"
    "exit status: 0 done; 1 out of memory; 2 bad command line\n";

static int parse_reps(int argc, char **argv) {
    int reps = 21;
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = (int)bench_cli_int(NAME, usage, argv[i],
                                      bench_cli_value(NAME, usage, argc, argv, &i), 1, 100000);
        else
            bench_cli_fail(NAME, usage, "unknown argument '%s'", argv[i]);
    }
    return reps;
}

int main(int argc, char **argv) {
    int reps = parse_reps(argc, argv);
    static const gemm_shape shapes[] = {
        {false, false, 512, 512, 512},    {false, true, 512, 512, 512},
        {true, false, 512, 512, 512},     {true, true, 512, 512, 512},
        {false, false, 1024, 1024, 1024}, {false, false, 4096, 64, 512},
        {false, false, 64, 64, 64},
    };
    printf("bench_gemm: C = op(A) op(B), f32, row-major; table = fsdp_kernels_cpu()->gemm, "
           "direct = cblas_sgemm\n");
    printf("%s, %d threads; median of %d reps after 3 warm-up calls\n\n", openblas_get_config(),
           openblas_get_num_threads(), reps);
    printf("op      M     N     K  table GFLOP/s direct GFLOP/s  ratio  direct ms  max diff\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) bench_shape(&shapes[i], reps);
    return 0;
}
