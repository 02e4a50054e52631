/* bench_cuda_gemm.c: the CUDA table's GEMMs (what every Linear runs) against the libraries
 * called directly with the same operation and compute type, in the same run: TFLOP/s of each
 * and their ratio. `f32`: gemm, f32 and TF32, against cublasGemmEx, for square shapes and the
 * shapes of the 134 M MLP's step. `bf16`: gemm_bf16 on cuBLASLt (fsdp_cuda_thread_set_gemm)
 * against cublasLtMatmul called directly (its heuristic asked once), and gemm_bf16 on cuBLAS
 * for reference, at the GEMMs of the Llama benchmark's shapes S and M; the last line is the
 * smallest ratio. `epilogue`: the fused forward gemm_bf16_bias_act (bias, bias + GELU) on
 * cuBLASLt against cublasLtMatmul called directly with the same epilogue (BIAS, GELU_BIAS), and
 * on cuBLAS (the separate entries) for reference, at those shapes' forward GEMMs. No argument
 * runs all three. Built only with CUDA; prints why it skipped when no GPU is usable. */
#define _POSIX_C_SOURCE 200809L

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cli.h"         // defines: bench_cli_help, bench_cli_fail
#include "bench_cuda_util.h"   // defines: BENCH_CUDA_OK, bench_cuda_median
#include "kernels/cuda/cuda.h" // defines: fsdp_cuda_thread_set_tf32
#include "kernels/kernels.h"   // defines: fsdp_kernels_for

#define REPS 20

typedef struct shape {
    const char *what;
    bool ta, tb;
    int m, n, k;
} shape;

typedef struct gemm_call {
    cublasHandle_t direct; /* NULL: the table's entry */
    const shape *s;
    bool tf32;
    const float *A, *B;
    float *C;
} gemm_call;

static void run_gemm(void *arg) {
    const gemm_call *c = arg;
    const shape *s = c->s;
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n, ldc = s->n;
    float one = 1.0f, zero = 0.0f;
    if (c->direct)
        cublasGemmEx(
            c->direct, s->tb ? CUBLAS_OP_T : CUBLAS_OP_N, s->ta ? CUBLAS_OP_T : CUBLAS_OP_N, s->n,
            s->m, s->k, &one, c->B, CUDA_R_32F, ldb, c->A, CUDA_R_32F, lda, &zero, c->C, CUDA_R_32F,
            ldc, c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0})
            ->gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, c->A, lda, c->B, ldb, 0.0f, c->C, ldc);
}

static void bench_f32(void) {
    static const shape shapes[] = {
        {"square 4096", false, false, 4096, 4096, 4096},
        {"square 8192", false, false, 8192, 8192, 8192},
        {"MLP fwd 8192x8192 <- 4096", false, true, 8192, 8192, 4096},
        {"MLP fwd 8192x8192 <- 8192", false, true, 8192, 8192, 8192},
        {"MLP dW 8192x4096 (T,N)", true, false, 8192, 4096, 8192},
        {"MLP dX 8192x4096 (N,N)", false, false, 8192, 4096, 8192},
    };
    size_t most = (size_t)8192 * 8192;
    float *A, *B, *C;
    BENCH_CUDA_OK(cudaMalloc((void **)&A, most * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc((void **)&B, most * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc((void **)&C, most * sizeof(float)));
    BENCH_CUDA_OK(cudaMemset(A, 0x3c, most * sizeof(float))); /* small positive values */
    BENCH_CUDA_OK(cudaMemset(B, 0x3c, most * sizeof(float)));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) exit(1);
    cublasSetStream(h, cudaStreamPerThread);
    printf("%-28s %5s %12s %12s %8s\n", "shape", "math", "table TF/s", "cuBLAS TF/s", "ratio");
    for (int tf = 0; tf < 2; tf++) {
        fsdp_cuda_thread_set_tf32(tf);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const shape *s = &shapes[i];
            double flop = 2.0 * s->m * s->n * (double)s->k;
            gemm_call ours_call = {NULL, s, tf, A, B, C}, theirs_call = {h, s, tf, A, B, C};
            double ours = bench_cuda_median(run_gemm, &ours_call, REPS);
            double theirs = bench_cuda_median(run_gemm, &theirs_call, REPS);
            printf("%-28s %5s %12.1f %12.1f %8.3f\n", s->what, tf ? "tf32" : "f32",
                   flop / ours / 1e12, flop / theirs / 1e12, theirs / ours);
        }
    }
    cublasDestroy(h);
    cudaFree(A), cudaFree(B), cudaFree(C);
}

/* ---- bf16: the table on cuBLASLt against cublasLtMatmul called directly ---- */

#define LT_OK(expr)                                                                                \
    do {                                                                                           \
        cublasStatus_t st_ = (expr);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "%s: %s\n", #expr, cublasLtGetStatusName(st_));                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One cublasLtMatmul set up once: the row-major C = op(A) op(B) as the column-major
 * C^T = op(B)^T op(A)^T, bf16 A and B, f32 C, f32 compute, the heuristic's first algorithm. */
typedef struct direct_lt {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t b, a, c;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    const shape *s;
    const fsdp_bf16 *A, *B;
    float *C;
    bool table; /* true: the table's gemm_bf16 instead */
    /* epilogue mode: cuBLASLt's epilogue (0: none) with its f32 bias, and the activation the
     * table's gemm_bf16_bias_act is asked for (the same operation) */
    int epilogue;
    const float *bias;
    fsdp_gemm_act act;
} direct_lt;

static void direct_lt_init(direct_lt *d, const shape *s) {
    int32_t op_b = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_OK(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_OK(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
    LT_OK(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
    int ldb = s->tb ? s->k : s->n, lda = s->ta ? s->m : s->k;
    LT_OK(cublasLtMatrixLayoutCreate(&d->b, CUDA_R_16BF, s->tb ? s->k : s->n, s->tb ? s->n : s->k,
                                     ldb));
    LT_OK(cublasLtMatrixLayoutCreate(&d->a, CUDA_R_16BF, s->ta ? s->m : s->k, s->ta ? s->k : s->m,
                                     lda));
    LT_OK(cublasLtMatrixLayoutCreate(&d->c, CUDA_R_32F, s->n, s->m, s->n));
    if (d->epilogue) {
        uint32_t epilogue = (uint32_t)d->epilogue;
        int32_t type = CUDA_R_32F;
        LT_OK(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                             sizeof epilogue));
        LT_OK(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d->bias,
                                             sizeof d->bias));
        LT_OK(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type,
                                             sizeof type));
    }
    cublasLtMatmulPreference_t pref;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = FSDP_CUDA_LT_WORKSPACE;
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof ws));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    LT_OK(cublasLtMatmulAlgoGetHeuristic(d->h, d->op, d->b, d->a, d->c, d->c, pref, 1, &r, &found));
    if (found < 1) {
        fprintf(stderr, "bench_cuda_gemm: cuBLASLt has no algorithm for %s\n", s->what);
        exit(1);
    }
    d->algo = r.algo;
    cublasLtMatmulPreferenceDestroy(pref);
}

static void direct_lt_free(direct_lt *d) {
    cublasLtMatrixLayoutDestroy(d->a), cublasLtMatrixLayoutDestroy(d->b);
    cublasLtMatrixLayoutDestroy(d->c), cublasLtMatmulDescDestroy(d->op);
}

static void run_bf16(void *arg) {
    const direct_lt *d = arg;
    const shape *s = d->s;
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n, ldc = s->n;
    float one = 1.0f, zero = 0.0f;
    if (d->table && d->epilogue) /* forward shapes: A is X (m, k), B is W (n, k) */
        fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0})
            ->gemm_bf16_bias_act(d->C, NULL, d->A, d->B, d->bias, s->m, s->k, s->n, d->act);
    else if (d->table)
        fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0})
            ->gemm_bf16(s->ta, s->tb, s->m, s->n, s->k, 1.0f, d->A, lda, d->B, ldb, 0.0f, d->C,
                        ldc);
    else
        LT_OK(cublasLtMatmul(d->h, d->op, &one, d->B, d->b, d->A, d->a, &zero, d->C, d->c, d->C,
                             d->c, &d->algo, d->ws, FSDP_CUDA_LT_WORKSPACE, cudaStreamPerThread));
}

/* The GEMMs of one Llama step (bench/llama_gpu.sh's shapes) per Linear: forward Y = X W^T
 * (A^T no, B^T yes), input gradient dX = dY W (none), weight gradient dW = dY^T X (A^T).
 * S: B*T 16384, dim 768, q+k+v 768+2*256, ffn 2048, vocab 32000. M: B*T 8192, dim 2048, q+k+v
 * 2048+2*512, ffn 8192, vocab 128256. */
static const shape llama_shapes[] = {
    {"S qkv fwd", false, true, 16384, 1280, 768},
    {"S wo fwd", false, true, 16384, 768, 768},
    {"S ffn up fwd", false, true, 16384, 2048, 768},
    {"S ffn down fwd", false, true, 16384, 768, 2048},
    {"S ffn down dX", false, false, 16384, 2048, 768},
    {"S ffn down dW", true, false, 768, 2048, 16384},
    {"S head fwd", false, true, 16384, 32000, 768},
    {"M qkv fwd", false, true, 8192, 3072, 2048},
    {"M wo fwd", false, true, 8192, 2048, 2048},
    {"M ffn up fwd", false, true, 8192, 8192, 2048},
    {"M ffn down fwd", false, true, 8192, 2048, 8192},
    {"M ffn down dX", false, false, 8192, 8192, 2048},
    {"M ffn down dW", true, false, 2048, 8192, 8192},
    {"M head fwd", false, true, 8192, 128256, 2048},
};

static void bench_bf16(void) {
    size_t most_a = 0, most_b = 0, most_c = 0;
    for (size_t i = 0; i < sizeof llama_shapes / sizeof *llama_shapes; i++) {
        const shape *s = &llama_shapes[i];
        size_t a = (size_t)s->m * s->k, b = (size_t)s->k * s->n, c = (size_t)s->m * s->n;
        most_a = a > most_a ? a : most_a, most_b = b > most_b ? b : most_b;
        most_c = c > most_c ? c : most_c;
    }
    fsdp_bf16 *A, *B;
    float *C;
    void *ws;
    BENCH_CUDA_OK(cudaMalloc((void **)&A, most_a * 2));
    BENCH_CUDA_OK(cudaMalloc((void **)&B, most_b * 2));
    BENCH_CUDA_OK(cudaMalloc((void **)&C, most_c * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc(&ws, FSDP_CUDA_LT_WORKSPACE));
    BENCH_CUDA_OK(cudaMemset(A, 0x3c, most_a * 2)); /* bf16 0x3c3c: about 0.0115 */
    BENCH_CUDA_OK(cudaMemset(B, 0x3c, most_b * 2));
    cublasLtHandle_t h;
    LT_OK(cublasLtCreate(&h));
    printf("%-16s %6s %6s %6s %12s %12s %8s %14s\n", "bf16 shape", "M", "N", "K", "table-lt TF/s",
           "direct TF/s", "ratio", "table-cublas");
    double worst = 1e30;
    for (size_t i = 0; i < sizeof llama_shapes / sizeof *llama_shapes; i++) {
        const shape *s = &llama_shapes[i];
        double flop = 2.0 * s->m * s->n * (double)s->k;
        direct_lt d = {.h = h, .ws = ws, .s = s, .A = A, .B = B, .C = C};
        direct_lt_init(&d, s);
        double theirs = bench_cuda_median(run_bf16, &d, REPS);
        d.table = true;
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_LT);
        double ours = bench_cuda_median(run_bf16, &d, REPS);
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_CUBLAS);
        double cublas = bench_cuda_median(run_bf16, &d, REPS);
        fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_DEFAULT);
        double ratio = theirs / ours;
        worst = ratio < worst ? ratio : worst;
        printf("%-16s %6d %6d %6d %12.1f %12.1f %8.3f %14.1f\n", s->what, s->m, s->n, s->k,
               flop / ours / 1e12, flop / theirs / 1e12, ratio, flop / cublas / 1e12);
        direct_lt_free(&d);
    }
    fsdp_cuda_gemm_lt_stats st = fsdp_cuda_gemm_lt_stats_get(0);
    printf("lt cache: %lld queries, %lld hits, %lld fallbacks\n", (long long)st.queries,
           (long long)st.hits, (long long)st.fallbacks);
    printf("lt_ratio_min %.3f (table on cuBLASLt / cublasLtMatmul called directly; goal >= 0.95)\n",
           worst);
    cublasLtDestroy(h);
    cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(ws);
}

/* ---- epilogue: the fused forward (bias, bias + GELU) on cuBLASLt against cublasLtMatmul
 * called directly with the same epilogue, at the Llama shapes' forward GEMMs ---- */

static void bench_epilogue(void) {
    size_t most_a = 0, most_b = 0, most_c = 0, most_n = 0;
    for (size_t i = 0; i < sizeof llama_shapes / sizeof *llama_shapes; i++) {
        const shape *s = &llama_shapes[i];
        size_t a = (size_t)s->m * s->k, b = (size_t)s->k * s->n, c = (size_t)s->m * s->n;
        most_a = a > most_a ? a : most_a, most_b = b > most_b ? b : most_b;
        most_c = c > most_c ? c : most_c, most_n = (size_t)s->n > most_n ? (size_t)s->n : most_n;
    }
    fsdp_bf16 *A, *B;
    float *C, *bias;
    void *ws;
    BENCH_CUDA_OK(cudaMalloc((void **)&A, most_a * 2));
    BENCH_CUDA_OK(cudaMalloc((void **)&B, most_b * 2));
    BENCH_CUDA_OK(cudaMalloc((void **)&C, most_c * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc((void **)&bias, most_n * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc(&ws, FSDP_CUDA_LT_WORKSPACE));
    BENCH_CUDA_OK(cudaMemset(A, 0x3c, most_a * 2));
    BENCH_CUDA_OK(cudaMemset(B, 0x3c, most_b * 2));
    BENCH_CUDA_OK(cudaMemset(bias, 0x3c, most_n * sizeof(float)));
    cublasLtHandle_t h;
    LT_OK(cublasLtCreate(&h));
    static const struct {
        const char *name;
        int epilogue;
        fsdp_gemm_act act;
    } epis[] = {{"bias", CUBLASLT_EPILOGUE_BIAS, FSDP_GEMM_ACT_NONE},
                {"bias+gelu", CUBLASLT_EPILOGUE_GELU_BIAS, FSDP_GEMM_ACT_GELU}};
    printf("%-16s %-10s %6s %6s %6s %12s %12s %8s %14s\n", "fused shape", "epilogue", "M", "N", "K",
           "table-lt TF/s", "direct TF/s", "ratio", "table-cublas");
    double worst = 1e30;
    fsdp_cuda_gemm_lt_stats st0 = fsdp_cuda_gemm_lt_stats_get(0);
    for (size_t i = 0; i < sizeof llama_shapes / sizeof *llama_shapes; i++) {
        const shape *s = &llama_shapes[i];
        if (s->ta || !s->tb) continue; /* forward GEMMs only: Y = X W^T + b */
        double flop = 2.0 * s->m * s->n * (double)s->k;
        for (size_t e = 0; e < sizeof epis / sizeof *epis; e++) {
            direct_lt d = {.h = h, .ws = ws, .s = s, .A = A, .B = B, .C = C};
            d.epilogue = epis[e].epilogue, d.bias = bias, d.act = epis[e].act;
            direct_lt_init(&d, s);
            double theirs = bench_cuda_median(run_bf16, &d, REPS);
            d.table = true;
            fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_LT);
            double ours = bench_cuda_median(run_bf16, &d, REPS);
            fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_CUBLAS); /* the separate entries */
            double apart = bench_cuda_median(run_bf16, &d, REPS);
            fsdp_cuda_thread_set_gemm(FSDP_CUDA_GEMM_DEFAULT);
            double ratio = theirs / ours;
            worst = ratio < worst ? ratio : worst;
            printf("%-16s %-10s %6d %6d %6d %12.1f %12.1f %8.3f %14.1f\n", s->what, epis[e].name,
                   s->m, s->n, s->k, flop / ours / 1e12, flop / theirs / 1e12, ratio,
                   flop / apart / 1e12);
            direct_lt_free(&d);
        }
    }
    fsdp_cuda_gemm_lt_stats st = fsdp_cuda_gemm_lt_stats_get(0);
    printf("lt epilogues: %lld queries, %lld fallbacks to the separate entries\n",
           (long long)(st.queries - st0.queries), (long long)(st.fallbacks - st0.fallbacks));
    printf("epilogue_ratio_min %.3f (fused table entry on cuBLASLt / cublasLtMatmul with the same "
           "epilogue; goal >= 0.95)\n",
           worst);
    cublasLtDestroy(h);
    cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(bias), cudaFree(ws);
}

#define NAME "bench_cuda_gemm"
static const char usage[] =
    "usage: bench_cuda_gemm [f32|bf16|epilogue]\n"
    "The CUDA table's GEMMs against the libraries called directly with the same operation and\n"
    "compute type, in the same run, on cuda:0.\n"
    "arguments (no argument: all three):\n"
    "  f32         gemm, f32 and TF32, against cublasGemmEx: square shapes and the 134 M MLP's\n"
    "  bf16        gemm_bf16 on cuBLASLt against cublasLtMatmul, and on cuBLAS, at the Llama\n"
    "              benchmark's GEMMs (shapes S and M)\n"
    "  epilogue    the fused gemm_bf16_bias_act (bias, bias + GELU) against cublasLtMatmul\n"
    "              with the same epilogue, and the separate entries on cuBLAS\n"
    "  --help, -h  prints this help\n"
    "prints: TFLOP/s of each and their ratio per shape, then the smallest ratio; a line saying\n"
    "it skipped when no CUDA device is usable. Writes no file.\n"
    "exit status: 0 done or skipped; 1 a CUDA or cuBLAS call failed; 2 bad command line\n";

int main(int argc, char **argv) {
    bench_cli_help(argc, argv, usage);
    if (argc > 2) bench_cli_fail(NAME, usage, "unexpected argument '%s'", argv[2]);
    const char *mode = argc > 1 ? argv[1] : "all";
    bool f32 = strcmp(mode, "all") == 0 || strcmp(mode, "f32") == 0;
    bool bf16 = strcmp(mode, "all") == 0 || strcmp(mode, "bf16") == 0;
    bool epilogue = strcmp(mode, "all") == 0 || strcmp(mode, "epilogue") == 0;
    if (!f32 && !bf16 && !epilogue) bench_cli_fail(NAME, usage, "unknown argument '%s'", mode);
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        printf("bench_cuda_gemm: skipped: no usable CUDA device\n");
        return 0;
    }
    if (f32) bench_f32();
    if (bf16) bench_bf16();
    if (epilogue) bench_epilogue();
    return 0;
}
