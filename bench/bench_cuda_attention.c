/* bench_cuda_attention.c: the CUDA table's causal grouped-query attention, forward and backward,
 * with the plain kernels (one thread per score row), the tiled ones (FlashAttention-2-class), the
 * GEMM path (cuBLAS GEMMs over (T, T) score blocks, in f32 and in TF32) and cuDNN's fused
 * attention, at the Llama benchmark's shapes: S (B 16, T 1024, NH 12, NKV 4, D 64) and M (B 4,
 * T 2048, NH 32, NKV 8, D 64). The inputs are bf16 values (uniform in [-1, 1], rounded), so every
 * path sees the same numbers. Per shape: the tiled and the f32 GEMM results against the plain
 * ones (norm-wise, with the bound of test_kernels_cuda's attention_flash case; the TF32 GEMM
 * path's differences printed, not judged), cuDNN's out and
 * lse against the plain ones within a bf16 bound (its gradients' differences are printed; the
 * test checks them per element), and the median time of a forward plus a backward of each:
 * cuDNN through the table's f32 entries (cudnn-f32: the conversions to and from bf16 included)
 * and on bf16 tensors directly (cudnn-bf16). Built only with CUDA; skips when no GPU is usable,
 * and skips the cuDNN rows (saying why) where cuDNN cannot be loaded. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"         // defines: bench_cli_help, bench_cli_fail, bench_cli_int
#include "bench_cuda_util.h"   // defines: BENCH_CUDA_OK, bench_cuda_median
#include "kernels/cuda/cuda.h" // defines: fsdp_cuda_thread_set_attention, fsdp_cuda_thread_set_tf32
#include "kernels/kernels.h"   // defines: fsdp_kernels_for

typedef struct shape {
    const char *name;
    int64_t B, T, NH, NKV, D;
} shape;

static const shape shapes[] = {{"S", 16, 1024, 12, 4, 64}, {"M", 4, 2048, 32, 8, 64}};

/* Device arrays of one run: inputs q, k, v, dout; outputs out, lse, dq, dk, dv. */
typedef struct attn_run {
    const shape *s;
    float *q, *k, *v, *dout, *o[5];
    int64_t n[5]; // elements of out, lse, dq, dk, dv
} attn_run;

static const char *const names[5] = {"out", "lse", "dq", "dk", "dv"};

static void fwd_bwd(void *arg) {
    const attn_run *r = arg;
    const shape *s = r->s;
    const fsdp_kernels_i *K = fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0});
    K->attention_forward(r->o[0], r->o[1], NULL, r->q, r->k, r->v, s->B, s->T, s->NH, s->NKV, s->D);
    K->attention_backward(r->o[2], r->o[3], r->o[4], NULL, r->dout, r->q, r->k, r->v, r->o[0],
                          r->o[1], s->B, s->T, s->NH, s->NKV, s->D);
}

static float *dev_random(int64_t n, unsigned *seed) {
    float *h = malloc((size_t)n * sizeof(float)), *d;
    if (!h) exit(1);
    for (int64_t i = 0; i < n; i++)
        h[i] = fsdp_bf16_to_f32(
            fsdp_bf16_from_f32(2.0f * (float)rand_r(seed) / (float)RAND_MAX - 1.0f));
    BENCH_CUDA_OK(cudaMalloc((void **)&d, (size_t)n * sizeof(float)));
    BENCH_CUDA_OK(cudaMemcpy(d, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static float *to_host(const float *d, int64_t n) {
    float *h = malloc((size_t)n * sizeof(float));
    if (!h) exit(1);
    BENCH_CUDA_OK(cudaMemcpy(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

/* The outputs of one path, on the host, and its median seconds per forward plus backward. */
static double run_path(attn_run *r, fsdp_cuda_attention kind, int reps, float *host[5]) {
    fsdp_cuda_thread_set_attention(kind);
    fwd_bwd(r);
    for (int i = 0; i < 5; i++) host[i] = to_host(r->o[i], r->n[i]);
    double t = bench_cuda_median(fwd_bwd, r, reps);
    fsdp_cuda_thread_set_attention(FSDP_CUDA_ATTENTION_DEFAULT);
    return t;
}

/* Returns 1 when a tensor of path `what` is out of its bound (test_kernels_cuda's, for inputs in
 * [-1, 1]); with judge false, prints the differences as "info" and returns 0. */
static int compare(const shape *s, const char *what, bool judge, float *got[5], float *plain[5],
                   const int64_t n[5]) {
    const double u = 0x1p-24, D = (double)s->D, T = (double)s->T;
    double ts = 2.0 * D * u * sqrt(D), group = (double)(s->NH / s->NKV);
    double bwd = 6 * ts + 4.0 * (group * T + D) * u;
    double tol[5] = {3 * ts + 2.0 * (T + D) * u, ts + 2.0 * T * u * (1.0 + sqrt(D) + log(T + 1)),
                     bwd, bwd, bwd};
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        double maxd = 0, maxw = 0;
        for (int64_t e = 0; e < n[i]; e++) {
            double dd = fabs((double)got[i][e] - plain[i][e]);
            if (!(dd <= maxd) && !isnan(maxd)) maxd = dd; // a NaN stays
            maxw = fmax(maxw, fabs((double)plain[i][e]));
        }
        if (!judge) {
            printf("info %s %-3s max|%s-plain| %.3g max|plain| %.3g\n", s->name, names[i], what,
                   maxd, maxw);
            continue;
        }
        double bound = tol[i] * fmax(1.0, maxw);
        int ok = maxd <= bound; // NaN fails
        printf("compare %s %-3s max|%s-plain| %.3g max|plain| %.3g bound %.3g %s\n", s->name,
               names[i], what, maxd, maxw, bound, ok ? "ok" : "FAIL");
        bad |= !ok;
    }
    return bad;
}

/* cuDNN on bf16 tensors: the run's inputs and outputs as bf16 copies (out, dq, dk, dv), lse f32 */
typedef struct bf16_run {
    const attn_run *r;
    fsdp_bf16 *in[4], *out[4]; // q, k, v, dout | out, dq, dk, dv
    float *lse;
} bf16_run;

static void fwd_bwd_bf16(void *arg) {
    const bf16_run *b = arg;
    const shape *s = b->r->s;
    bool ok =
        fsdp_cuda_sdpa_forward_bf16(b->out[0], b->lse, b->in[0], b->in[1], b->in[2], s->B, s->T,
                                    s->NH, s->NKV, s->D) &&
        fsdp_cuda_sdpa_backward_bf16(b->out[1], b->out[2], b->out[3], b->in[3], b->in[0], b->in[1],
                                     b->in[2], b->out[0], b->lse, s->B, s->T, s->NH, s->NKV, s->D);
    if (!ok) {
        fprintf(stderr, "bench_cuda_attention: cuDNN refused the shape it had accepted\n");
        exit(1);
    }
}

static double time_bf16(attn_run *r, int reps) {
    const fsdp_kernels_i *K = fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0});
    bf16_run b = {.r = r};
    const float *src[4] = {r->q, r->k, r->v, r->dout};
    const int64_t len[4] = {r->n[0], r->n[3], r->n[3], r->n[0]},
                  olen[4] = {r->n[0], r->n[2], r->n[3], r->n[4]};
    for (int i = 0; i < 4; i++) {
        BENCH_CUDA_OK(cudaMalloc((void **)&b.in[i], (size_t)len[i] * sizeof(fsdp_bf16)));
        BENCH_CUDA_OK(cudaMalloc((void **)&b.out[i], (size_t)olen[i] * sizeof(fsdp_bf16)));
        K->f32_to_bf16(b.in[i], src[i], len[i]);
    }
    BENCH_CUDA_OK(cudaMalloc((void **)&b.lse, (size_t)r->n[1] * sizeof(float)));
    double t = bench_cuda_median(fwd_bwd_bf16, &b, reps);
    for (int i = 0; i < 4; i++) cudaFree(b.in[i]), cudaFree(b.out[i]);
    cudaFree(b.lse);
    return t;
}

/* cuDNN's results against the plain kernels' on the same bf16 inputs. out: each weight P_ij is
 * rounded to bf16 before P V (ub relative, ub = 2^-8, bf16 keeping 8 significant bits) and out
 * itself is rounded: |diff| <= 2 ub max(1, max|out|) (sum_j P_ij |v_j| <= 1), plus the f32 orders
 * of the flash bound; lse: f32 throughout, flash's bound. Returns 1 when out or lse is out of
 * bound; the gradients' norm-wise differences are printed ("info"): their per-element bound needs
 * the magnitudes test_kernels_cuda's attention_cudnn computes. */
static int compare_cudnn(const shape *s, float *cudnn[5], float *plain[5], const int64_t n[5]) {
    const double u = 0x1p-24, ub = 0x1p-8, D = (double)s->D, T = (double)s->T;
    double ts = 2.0 * D * u * sqrt(D);
    double tol[2] = {2 * ub + 3 * ts + 2.0 * (T + D) * u,
                     ts + 2.0 * T * u * (1.0 + sqrt(D) + log(T + 1))};
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        double maxd = 0, maxw = 0;
        for (int64_t e = 0; e < n[i]; e++) {
            double dd = fabs((double)cudnn[i][e] - plain[i][e]);
            if (!(dd <= maxd) && !isnan(maxd)) maxd = dd;
            maxw = fmax(maxw, fabs((double)plain[i][e]));
        }
        if (i >= 2) {
            printf("info %s %-3s max|cudnn-plain| %.3g max|plain| %.3g\n", s->name, names[i], maxd,
                   maxw);
            continue;
        }
        double bound = tol[i] * fmax(1.0, maxw);
        int ok = maxd <= bound;
        printf("compare %s %-3s max|cudnn-plain| %.3g max|plain| %.3g bound %.3g %s\n", s->name,
               names[i], maxd, maxw, bound, ok ? "ok" : "FAIL");
        bad |= !ok;
    }
    return bad;
}

static int bench_shape(const shape *s, int reps_flash, int reps_plain) {
    attn_run r = {.s = s};
    int64_t tq = s->B * s->T * s->NH * s->D, tk = s->B * s->T * s->NKV * s->D;
    int64_t n[5] = {tq, s->B * s->NH * s->T, tq, tk, tk};
    memcpy(r.n, n, sizeof n);
    unsigned seed = 7;
    r.q = dev_random(tq, &seed), r.k = dev_random(tk, &seed), r.v = dev_random(tk, &seed);
    r.dout = dev_random(tq, &seed);
    for (int i = 0; i < 5; i++)
        BENCH_CUDA_OK(cudaMalloc((void **)&r.o[i], (size_t)n[i] * sizeof(float)));
    float *plain[5], *flash[5], *gemm[5], *gemm_tf32[5];
    double tp = run_path(&r, FSDP_CUDA_ATTENTION_PLAIN, reps_plain, plain);
    double tf = run_path(&r, FSDP_CUDA_ATTENTION_FLASH, reps_flash, flash);
    double tg = run_path(&r, FSDP_CUDA_ATTENTION_GEMM, reps_flash, gemm);
    fsdp_cuda_thread_set_tf32(true);
    double tt = run_path(&r, FSDP_CUDA_ATTENTION_GEMM, reps_flash, gemm_tf32);
    fsdp_cuda_thread_set_tf32(false);
    int bad = compare(s, "flash", true, flash, plain, n);
    bad |= compare(s, "gemm", true, gemm, plain, n);
    compare(s, "gemm-tf32", false, gemm_tf32, plain, n);
    /* causal attention: 4 T^2 D / 2 flops forward (two GEMMs, half the scores), 10 T^2 D / 2
     * backward (five GEMMs), per (b, h) */
    double flops = 7.0 * (double)(s->B * s->NH) * (double)s->T * (double)s->T * (double)s->D;
    printf("result %s plain %.3f ms %.2f TFLOP/s\n", s->name, 1e3 * tp, flops / tp * 1e-12);
    printf("result %s flash %.3f ms %.2f TFLOP/s\n", s->name, 1e3 * tf, flops / tf * 1e-12);
    printf("result %s gemm %.3f ms %.2f TFLOP/s\n", s->name, 1e3 * tg, flops / tg * 1e-12);
    printf("result %s gemm-tf32 %.3f ms %.2f TFLOP/s\n", s->name, 1e3 * tt, flops / tt * 1e-12);
    printf("speedup %s flash/plain %.2fx\n", s->name, tp / tf);
    printf("speedup %s gemm/flash %.2fx\n", s->name, tf / tg);
    printf("speedup %s gemm-tf32/flash %.2fx\n", s->name, tf / tt);
    char why[512];
    if (fsdp_cuda_cudnn_version(why, sizeof why) == 0) {
        printf("cudnn %s skipped: %s\n", s->name, why);
    } else {
        float *cudnn[5];
        int64_t refused = fsdp_cuda_sdpa_stats_get().refusals;
        double tc = run_path(&r, FSDP_CUDA_ATTENTION_CUDNN, reps_flash, cudnn);
        if (fsdp_cuda_sdpa_stats_get().refusals > refused) {
            printf("cudnn %s skipped: cuDNN refused the shape (its message above); the tiled "
                   "kernels ran it\n",
                   s->name);
        } else {
            bad |= compare_cudnn(s, cudnn, plain, n);
            double tb = time_bf16(&r, reps_flash);
            printf("result %s cudnn-f32 %.3f ms %.2f TFLOP/s\n", s->name, 1e3 * tc,
                   flops / tc * 1e-12);
            printf("result %s cudnn-bf16 %.3f ms %.2f TFLOP/s\n", s->name, 1e3 * tb,
                   flops / tb * 1e-12);
            printf("ratio %s cudnn-f32/flash %.2fx cudnn-bf16/flash %.2fx (above 1: cuDNN faster); "
                   "the f32 boundary's conversions take %.3f ms\n",
                   s->name, tf / tc, tf / tb, 1e3 * (tc - tb));
        }
        for (int i = 0; i < 5; i++) free(cudnn[i]);
    }
    for (int i = 0; i < 5; i++)
        free(plain[i]), free(flash[i]), free(gemm[i]), free(gemm_tf32[i]), cudaFree(r.o[i]);
    cudaFree(r.q), cudaFree(r.k), cudaFree(r.v), cudaFree(r.dout);
    return bad;
}

#define NAME "bench_cuda_attention"
static const char usage[] =
    "usage: bench_cuda_attention [--shapes SM] [--reps N] [--plain-reps N]\n"
    "Causal grouped-query attention, forward and backward, on cuda:0: the plain kernels, the\n"
    "tiled ones, the GEMM path (f32 and TF32) and cuDNN's fused attention (f32 entries and bf16),\n"
    "at shape S (B 16, T 1024, NH 12, NKV 4, D 64) and M (B 4, T 2048, NH 32, NKV 8, D 64).\n"
    "options:\n"
    "  --shapes SM       the shapes, letters S and M (default SM)\n"
    "  --reps N          timed runs of the fast paths, median (default 10, 1 to 100)\n"
    "  --plain-reps N    timed runs of the plain kernels (default 3, 1 to 100)\n"
    "  --help, -h        prints this help\n"
    "prints: per shape each path's differences from the plain kernels and its verdict, and the\n"
    "median ms of a forward plus a backward of each; a line saying why when it skips (no usable\n"
    "CUDA device; the cuDNN rows when cuDNN cannot be loaded). Writes no file.\n"
    "exit status: 0 done or skipped; 1 a result out of its bound or a CUDA call failed; 2 bad\n"
    "command line\n";

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); // each line reaches the log before a timeout's kill
    const char *which = "SM";
    int reps_flash = 10, reps_plain = 3;
    bench_cli_help(argc, argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--shapes")) {
            which = bench_cli_value(NAME, usage, argc, argv, &i);
            if (!which[0] || which[strspn(which, "SM")])
                bench_cli_fail(NAME, usage, "--shapes takes the letters S and M, got '%s'", which);
        } else if (!strcmp(a, "--reps")) {
            reps_flash =
                (int)bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i), 1,
                                   BENCH_CUDA_MAX_REPS);
        } else if (!strcmp(a, "--plain-reps")) {
            reps_plain =
                (int)bench_cli_int(NAME, usage, a, bench_cli_value(NAME, usage, argc, argv, &i), 1,
                                   BENCH_CUDA_MAX_REPS);
        } else {
            bench_cli_fail(NAME, usage, "unknown argument '%s'", a);
        }
    }
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        printf("bench_cuda_attention: skipped: no usable CUDA device\n");
        return 0;
    }
    int bad = 0;
    printf("flops per forward + backward: 7 B NH T^2 D (causal: half of 14)\n");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (strchr(which, shapes[i].name[0]))
            bad |= bench_shape(&shapes[i], reps_flash, reps_plain);
    return bad;
}
