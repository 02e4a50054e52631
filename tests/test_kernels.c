/* test_kernels.c: every entry of the CPU operator table against a naive double-precision
 * reference written here, backward kernels also against central finite differences of the
 * double forward, plus edge cases (zero sizes, in-place calls, huge logits, bf16 ties/NaN). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/profile.h"    // defines: fsdp_profile_start, fsdp_profile_read
#include "harness.h"         // defines: fsdp_test_run, fsdp_test_close, FSDP_TEST_CLOSE
#include "kernel_check.h"    // defines: new_floats, new_uniform, CLOSE_D, CLOSE_S, finite_diff
#include "kernel_rng.h"      // defines: rng_seed, rng_u32, rng_uniform
#include "kernels/kernels.h" // defines: fsdp_kernels_i, fsdp_kernels_cpu, fsdp_kernels_for

/* ---- dispatch ---- */

static void test_dispatch(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    CU_ASSERT_PTR_EQUAL(fsdp_kernels_for(FSDP_CPU), k);
#ifdef FSDP_HAVE_CUDA // the CUDA table's own tests are in test_kernels_cuda.c
    CU_ASSERT_PTR_NOT_NULL(fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0}));
#else
    CU_ASSERT_PTR_NULL(fsdp_kernels_for((fsdp_device){FSDP_DEVICE_CUDA, 0}));
#endif
    CU_ASSERT_STRING_EQUAL(k->name, "cpu");
    bool all = k->gemm && k->bias_add && k->bias_backward && k->relu_forward && k->relu_backward &&
               k->sigmoid_forward && k->sigmoid_backward && k->gelu_forward && k->gelu_backward &&
               k->rmsnorm_forward && k->rmsnorm_backward && k->add && k->axpy && k->scale &&
               k->copy && k->fill && k->sum && k->sum_squares && k->max_abs && k->mse_loss &&
               k->cross_entropy && k->f32_to_bf16 && k->bf16_to_f32 && k->f32_to_f16 &&
               k->f16_to_f32 && k->gemm_bias_act && k->gemm_bf16_bias_act && k->gemm_bgrad &&
               k->rmsnorm_backward_add;
    CU_ASSERT_TRUE(all);
}

/* ---- GEMM ---- */

/* C (M, N), dense, = alpha op(A) op(B) + beta C0 (row stride ldc); beta == 0 ignores C0. */
static void ref_gemm(double *C, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, double beta,
                     const float *C0, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t p = 0; p < K; p++) {
                double a = ta ? A[p * lda + i] : A[i * lda + p];
                double b = tb ? B[j * ldb + p] : B[p * ldb + j];
                s += a * b;
            }
            C[i * N + j] = alpha * s + (beta == 0.0 ? 0.0 : beta * C0[i * ldc + j]);
        }
}

#define PAD_SENTINEL 12345.0f

/* Runs one gemm with padded strides and checks C against ref_gemm and the padding intact. */
static void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                       double atol) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 7;
    float *A = new_uniform((ta ? K : M) * lda, -1, 1); // op(A) (M, K)
    float *B = new_uniform((tb ? N : K) * ldb, -1, 1); // op(B) (K, N)
    float *C = new_uniform(M * ldc, -1, 1);            // (M, N), stride ldc
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++) C[i * ldc + j] = PAD_SENTINEL;
    double *want = new_doubles(M * N);
    ref_gemm(want, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    k->gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    float *got = new_floats(M * N);
    bool pad_ok = true;
    for (int64_t i = 0; i < M; i++) {
        memcpy(got + i * N, C + i * ldc, (size_t)N * sizeof(float));
        for (int64_t j = N; j < ldc; j++) pad_ok = pad_ok && C[i * ldc + j] == PAD_SENTINEL;
    }
    char name[96];
    snprintf(name, sizeof name, "gemm %c%c %lldx%lldx%lld", ta ? 'T' : 'N', tb ? 'T' : 'N',
             (long long)M, (long long)N, (long long)K);
    CLOSE_D(name, got, want, M * N, 1e-5, atol);
    CU_ASSERT_TRUE(pad_ok);
    free(A), free(B), free(C), free(want), free(got);
}

/* All four transpose combinations, non-square, lda/ldb/ldc above the minimum, alpha and beta
 * not 0 or 1. Tolerance: rtol 1e-5, atol 5e-6 (K = 19) and 5e-5 (K = 300), against the double
 * result. Any order of the K products (whichever OpenBLAS kernel) errs by at most gamma_K
 * sum |alpha a b| (inputs in [-1, 1]): 4e-6 at K = 19, so 5e-6 is the worst case; at K = 300
 * the worst case is 7e-4, but the errors add as a random walk, about 1.2e-6 (tests/numerics.h),
 * and 5e-5 is 40 times that. Seen at most 0.08 of the bound under the Haswell, Sandybridge and
 * Prescott kernels. */
static void test_gemm_transposes(void) {
    rng_seed(1);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        check_gemm(ta, tb, 37, 23, 19, 0.75f, -1.25f, 5e-6);
        check_gemm(ta, tb, 130, 70, 300, -0.5f, 0.25f, 5e-5);
    }
}

/* beta = 0 overwrites C, NaN included (BLAS semantics), for every transpose combination. */
static void test_gemm_beta_zero(void) {
    rng_seed(2);
    for (int t = 0; t < 4; t++) {
        const fsdp_kernels_i *k = fsdp_kernels_cpu();
        bool ta = t & 1, tb = t & 2;
        enum { M = 9, N = 14, K = 6 };
        float *A = new_uniform(M * K, -1, 1), *B = new_uniform(K * N, -1, 1);
        float *C = new_floats(M * N);
        for (int i = 0; i < M * N; i++) C[i] = NAN;
        double want[M * N];
        ref_gemm(want, ta, tb, M, N, K, 1.0, A, ta ? M : K, B, tb ? K : N, 0.0, C, N);
        k->gemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C, N);
        CLOSE_D("gemm beta=0 over NaN", C, want, M * N, 1e-5, 1e-6);
        free(A), free(B), free(C);
    }
}

/* M or N == 0 touches nothing; K == 0 gives C = beta C without reading A or B (NULL here,
 * so calling BLAS would fail). */
static void test_gemm_zero_size(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    float C[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8}; // (2, 3), ldc 4
    const float orig[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    k->gemm(false, false, 0, 3, 5, 1.0f, NULL, 5, NULL, 3, 0.0f, C, 4);
    k->gemm(true, false, 2, 0, 5, 1.0f, NULL, 2, NULL, 1, 0.0f, C, 4);
    FSDP_TEST_CLOSE("gemm M=0, N=0: untouched", C, orig, 8, 0, 0);
    k->gemm(false, true, 2, 3, 0, 1.0f, NULL, 1, NULL, 1, 0.5f, C, 4);
    const float halved[8] = {0.5f, 1, 1.5f, 4, 2.5f, 3, 3.5f, 8};
    FSDP_TEST_CLOSE("gemm K=0, beta=0.5: C = beta C", C, halved, 8, 0, 0);
    C[0] = NAN;
    k->gemm(true, true, 2, 3, 0, 1.0f, NULL, 1, NULL, 1, 0.0f, C, 4);
    const float zeroed[8] = {0, 0, 0, 4, 0, 0, 0, 8};
    FSDP_TEST_CLOSE("gemm K=0, beta=0: C = 0", C, zeroed, 8, 0, 0);
}

/* ---- bias ---- */

typedef struct bias_aux {
    const double *G, *X; // (rows, cols): upstream gradient and input
    int64_t rows, cols;
} bias_aux;

/* L(b) = sum G * (X + b broadcast over rows) */
static double bias_loss(const double *b, const void *aux) {
    const bias_aux *a = aux;
    double L = 0.0;
    for (int64_t r = 0; r < a->rows; r++)
        for (int64_t c = 0; c < a->cols; c++)
            L += a->G[r * a->cols + c] * (a->X[r * a->cols + c] + b[c]);
    return L;
}

/* bias_add (exact: one float add) and bias_backward (+=, double sum: rtol 1e-6, atol 1e-6);
 * cols = 300 crosses the kernel's column block of 256. */
static void test_bias(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { R = 7, C = 300 };
    rng_seed(3);
    float *out = new_uniform(R * C, -1, 1), *bias = new_uniform(C, -1, 1);
    float *want_out = new_floats(R * C);
    for (int i = 0; i < R * C; i++) want_out[i] = out[i] + bias[i % C];
    k->bias_add(out, bias, R, C);
    FSDP_TEST_CLOSE("bias_add", out, want_out, R * C, 0, 0);

    float *dout = new_uniform(R * C, -1, 1), *dbias = new_uniform(C, -1, 1);
    double want[C], fd[C];
    for (int c = 0; c < C; c++) {
        want[c] = dbias[c];
        for (int r = 0; r < R; r++) want[c] += dout[r * C + c];
    }
    k->bias_backward(dbias, dout, R, C);
    CLOSE_D("bias_backward (+=)", dbias, want, C, 1e-6, 1e-6);

    double *G = to_doubles(dout, R * C), *X = to_doubles(out, R * C), *b = to_doubles(bias, C);
    bias_aux aux = {G, X, R, C};
    float *db = new_floats(C);
    memset(db, 0, sizeof(float) * C);
    k->bias_backward(db, dout, R, C);
    finite_diff(fd, bias_loss, b, C, 1e-3, &aux);
    CLOSE_D("bias_backward vs finite diff", db, fd, C, 1e-5, 1e-6);
    free(out), free(bias), free(want_out), free(dout), free(dbias), free(G), free(X), free(b);
    free(db);
}

/* ---- activations ---- */

static double relu_d(double x) {
    return x > 0 ? x : 0;
}
static double sigmoid_d(double x) {
    return 1.0 / (1.0 + exp(-x));
}
#define SQRT_2_OVER_PI 0.79788456080286535588

static double gelu_d(double x) {
    const double k = SQRT_2_OVER_PI, c = 0.044715;
    return 0.5 * x * (1.0 + tanh(k * (x + c * x * x * x)));
}
static double gelu_grad_d(double x) {
    const double k = SQRT_2_OVER_PI, c = 0.044715;
    double t = tanh(k * (x + c * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
}

typedef struct act_case {
    const char *name;
    double (*f)(double);
    double rtol, atol; // forward against f
} act_case;

static void act_forward(const fsdp_kernels_i *k, int which, float *out, const float *x, int64_t n) {
    if (which == 0) k->relu_forward(out, x, n);
    if (which == 1) k->sigmoid_forward(out, x, n);
    if (which == 2) k->gelu_forward(out, x, n);
}

static void act_backward(const fsdp_kernels_i *k, int which, float *dinp, const float *x,
                         const float *out, const float *dout, int64_t n) {
    if (which == 0) k->relu_backward(dinp, x, dout, n);
    if (which == 1) k->sigmoid_backward(dinp, out, dout, n);
    if (which == 2) k->gelu_backward(dinp, x, dout, n);
}

static const act_case act_cases[3] = {
    {"relu", relu_d, 0, 0},
    {"sigmoid", sigmoid_d, 1e-6, 1e-30},
    {"gelu", gelu_d, 1e-5, 1e-6},
};

/* x in [-6, 6] away from 0 (ReLU's kink) plus the ends of the float range. */
static float *activation_inputs(int64_t n) {
    float *x = new_uniform(n, -6, 6);
    for (int64_t i = 0; i < n; i++)
        if (fabsf(x[i]) < 1e-2f) x[i] = 0.5f;
    const float edges[] = {100.0f, -100.0f, 1000.0f, -1000.0f, 3e38f, -3e38f, 0.0f, -0.0f};
    memcpy(x, edges, sizeof edges);
    return x;
}

/* Forward against the double formula (relu exact; sigmoid rtol 1e-6 with atol 1e-30 for the
 * denormal tail; gelu rtol 1e-5, atol 1e-6), finite for huge |x|, and in place. */
static void test_activation_forward(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { N = 1003 };
    rng_seed(4);
    float *x = activation_inputs(N), *out = new_floats(N);
    double want[N];
    for (int w = 0; w < 3; w++) {
        const act_case *a = &act_cases[w];
        for (int i = 0; i < N; i++) want[i] = a->f(x[i]);
        act_forward(k, w, out, x, N);
        char name[64];
        snprintf(name, sizeof name, "%s_forward", a->name);
        CLOSE_D(name, out, want, N, a->rtol, a->atol);
        bool finite = true;
        for (int i = 0; i < N; i++) finite = finite && isfinite(out[i]);
        CU_ASSERT_TRUE(finite);
        float *inplace = new_floats(N);
        memcpy(inplace, x, sizeof(float) * N);
        act_forward(k, w, inplace, inplace, N);
        snprintf(name, sizeof name, "%s_forward in place", a->name);
        FSDP_TEST_CLOSE(name, inplace, out, N, 0, 0);
        free(inplace);
    }
    free(x), free(out);
}

/* Backward against the closed form in double (relu exact; sigmoid from the float forward
 * output, rtol 1e-6, atol 1e-7; gelu rtol 1e-5, atol 2e-6) and against central differences
 * of the double forward (h = 1e-4; rtol 1e-5, atol 2e-6) on x in [-6, 6]. */
static void test_activation_backward(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { N = 1001, SKIP = 8 }; // SKIP: the edge values of activation_inputs
    rng_seed(5);
    float *x = activation_inputs(N), *dout = new_uniform(N, -1, 1);
    float *out = new_floats(N), *dinp = new_floats(N);
    double want[N], fd[N];
    for (int w = 0; w < 3; w++) {
        const act_case *a = &act_cases[w];
        act_forward(k, w, out, x, N);
        for (int i = 0; i < N; i++) dinp[i] = NAN; // written, not accumulated
        act_backward(k, w, dinp, x, out, dout, N);
        for (int i = 0; i < N; i++) {
            double s = out[i];
            double g = w == 0 ? (x[i] > 0) : w == 1 ? s * (1.0 - s) : gelu_grad_d(x[i]);
            want[i] = (double)dout[i] * g;
            double h = 1e-4, xi = x[i];
            fd[i] = (double)dout[i] * (a->f(xi + h) - a->f(xi - h)) / (2 * h);
        }
        char name[64];
        snprintf(name, sizeof name, "%s_backward", a->name);
        double rtol = w == 0 ? 0 : w == 1 ? 1e-6 : 1e-5, atol = w == 0 ? 0 : w == 1 ? 1e-7 : 2e-6;
        CLOSE_D(name, dinp, want, N, rtol, atol);
        snprintf(name, sizeof name, "%s_backward vs finite diff", a->name);
        CLOSE_D(name, dinp + SKIP, fd + SKIP, N - SKIP, 1e-5, 2e-6);
    }
    free(x), free(dout), free(out), free(dinp);
}

/* ---- RMSNorm ---- */

/* out (rows, cols) = x * rstd * w in double; rstd (rows) may be NULL */
static void ref_rmsnorm(double *out, double *rstd, const double *x, const double *w, double eps,
                        int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += x[r * cols + c] * x[r * cols + c];
        double s = 1.0 / sqrt(ss / (double)cols + eps);
        if (rstd) rstd[r] = s;
        for (int64_t c = 0; c < cols; c++) out[r * cols + c] = x[r * cols + c] * s * w[c];
    }
}

typedef struct rms_aux {
    const double *G; // (rows, cols) upstream gradient
    const double *w; // (cols), when differentiating by x
    const double *x; // (rows, cols), when differentiating by w
    double *scratch; // (rows, cols)
    double eps;
    int64_t rows, cols;
} rms_aux;

static double rms_loss_dot(const rms_aux *a) {
    double L = 0.0;
    for (int64_t i = 0; i < a->rows * a->cols; i++) L += a->G[i] * a->scratch[i];
    return L;
}

static double rms_loss_by_x(const double *x, const void *aux) { // L = sum G * rmsnorm(x, w)
    const rms_aux *a = aux;
    ref_rmsnorm(a->scratch, NULL, x, a->w, a->eps, a->rows, a->cols);
    return rms_loss_dot(a);
}

static double rms_loss_by_w(const double *w, const void *aux) {
    const rms_aux *a = aux;
    ref_rmsnorm(a->scratch, NULL, a->x, w, a->eps, a->rows, a->cols);
    return rms_loss_dot(a);
}

/* Forward: rstd rtol 1e-6, out rtol 1e-5 atol 1e-6 against double (5 x 300, eps 1e-5). */
static void test_rmsnorm_forward(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { R = 5, C = 300 };
    rng_seed(6);
    float *x = new_uniform(R * C, -2, 2), *w = new_uniform(C, 0.5f, 1.5f);
    for (int c = 0; c < C; c++) x[C + c] *= 1e-3f; // a row of small values: eps matters
    float *out = new_floats(R * C), rstd[R];
    double *xd = to_doubles(x, R * C), *wd = to_doubles(w, C), *want = new_doubles(R * C);
    double want_rstd[R];
    ref_rmsnorm(want, want_rstd, xd, wd, 1e-5, R, C);
    k->rmsnorm_forward(out, rstd, x, w, 1e-5f, R, C);
    CLOSE_D("rmsnorm_forward rstd", rstd, want_rstd, R, 1e-6, 0);
    CLOSE_D("rmsnorm_forward out", out, want, R * C, 1e-5, 1e-6);
    free(x), free(w), free(out), free(xd), free(wd), free(want);
}

/* dinp (rows, cols) and dweight (cols) from the closed form in double:
 * dinp_j = rstd w_j g_j - rstd^3 / cols x_j sum_k g_k w_k x_k, dweight_j = sum_rows g_j x_j rstd */
static void ref_rmsnorm_backward(double *dinp, double *dweight, const double *g, const double *x,
                                 const double *w, double eps, int64_t rows, int64_t cols) {
    for (int64_t c = 0; c < cols; c++) dweight[c] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * cols, *gr = g + r * cols;
        double ss = 0.0, dot = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c], dot += gr[c] * w[c] * xr[c];
        double s = 1.0 / sqrt(ss / (double)cols + eps);
        for (int64_t c = 0; c < cols; c++) {
            dinp[r * cols + c] = s * w[c] * gr[c] - s * s * s / (double)cols * xr[c] * dot;
            dweight[c] += gr[c] * xr[c] * s;
        }
    }
}

/* Backward against the closed form and central differences (h = 1e-5) of the double
 * forward: rtol 1e-5, atol 2e-6. dinp is written (NaN before), dweight accumulates: two
 * calls from dweight0 give dweight0 + 2 dweight. */
static void test_rmsnorm_backward(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { R = 4, C = 33 };
    const double eps = 1e-5;
    rng_seed(7);
    float *x = new_uniform(R * C, -2, 2), *w = new_uniform(C, 0.5f, 1.5f);
    float *g = new_uniform(R * C, -1, 1), *dw0 = new_uniform(C, -1, 1);
    float out[R * C], rstd[R], dinp[R * C], dweight[C];
    k->rmsnorm_forward(out, rstd, x, w, (float)eps, R, C);
    for (int i = 0; i < R * C; i++) dinp[i] = NAN;
    memcpy(dweight, dw0, sizeof dweight);
    k->rmsnorm_backward(dinp, dweight, g, x, w, rstd, R, C);

    double *xd = to_doubles(x, R * C), *wd = to_doubles(w, C), *gd = to_doubles(g, R * C);
    double want_dinp[R * C], want_dw[C], want_acc[C], fd_x[R * C], fd_w[C], scratch[R * C];
    ref_rmsnorm_backward(want_dinp, want_dw, gd, xd, wd, eps, R, C);
    for (int c = 0; c < C; c++) want_acc[c] = dw0[c] + want_dw[c];
    CLOSE_D("rmsnorm_backward dinp", dinp, want_dinp, R * C, 1e-5, 2e-6);
    CLOSE_D("rmsnorm_backward dweight (+=)", dweight, want_acc, C, 1e-5, 2e-6);

    rms_aux aux = {gd, wd, xd, scratch, eps, R, C};
    finite_diff(fd_x, rms_loss_by_x, xd, R * C, 1e-5, &aux);
    finite_diff(fd_w, rms_loss_by_w, wd, C, 1e-5, &aux);
    CLOSE_D("rmsnorm_backward dinp vs finite diff", dinp, fd_x, R * C, 1e-5, 2e-6);
    for (int c = 0; c < C; c++) fd_w[c] += dw0[c];
    CLOSE_D("rmsnorm_backward dweight vs finite diff", dweight, fd_w, C, 1e-5, 2e-6);

    k->rmsnorm_backward(dinp, dweight, g, x, w, rstd, R, C);
    for (int c = 0; c < C; c++) want_acc[c] = dw0[c] + 2.0 * want_dw[c];
    CLOSE_D("rmsnorm_backward dinp again (written)", dinp, want_dinp, R * C, 1e-5, 2e-6);
    CLOSE_D("rmsnorm_backward dweight twice (+=)", dweight, want_acc, C, 1e-5, 2e-6);
    free(x), free(w), free(g), free(dw0), free(xd), free(wd), free(gd);
}

/* ---- elementwise ---- */

/* Each result is one float operation (axpy two), so: add, scale, copy, fill exact against
 * float arithmetic; axpy rtol 1e-6, atol 1e-7 against double. In place where allowed. */
static void test_elementwise(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { N = 1031 };
    rng_seed(8);
    float *a = new_uniform(N, -1, 1), *b = new_uniform(N, -1, 1), *out = new_floats(N);
    float *want = new_floats(N);
    double wantd[N];

    for (int i = 0; i < N; i++) want[i] = a[i] + b[i];
    k->add(out, a, b, N);
    FSDP_TEST_CLOSE("add", out, want, N, 0, 0);
    memcpy(out, a, sizeof(float) * N);
    k->add(out, out, b, N);
    FSDP_TEST_CLOSE("add in place", out, want, N, 0, 0);

    for (int i = 0; i < N; i++) wantd[i] = (double)b[i] + 0.3 * (double)a[i];
    memcpy(out, b, sizeof(float) * N);
    k->axpy(out, 0.3f, a, N);
    CLOSE_D("axpy", out, wantd, N, 1e-6, 1e-7);

    for (int i = 0; i < N; i++) want[i] = -1.7f * a[i];
    k->scale(out, a, -1.7f, N);
    FSDP_TEST_CLOSE("scale", out, want, N, 0, 0);
    memcpy(out, a, sizeof(float) * N);
    k->scale(out, out, -1.7f, N);
    FSDP_TEST_CLOSE("scale in place", out, want, N, 0, 0);

    k->copy(out, b, N);
    FSDP_TEST_CLOSE("copy", out, b, N, 0, 0);
    k->copy(out, out, N);
    FSDP_TEST_CLOSE("copy onto itself", out, b, N, 0, 0);
    k->fill(out, 2.5f, N);
    for (int i = 0; i < N; i++) want[i] = 2.5f;
    FSDP_TEST_CLOSE("fill", out, want, N, 0, 0);

    out[0] = 9.0f; // n == 0 touches nothing
    k->add(out, a, b, 0);
    k->axpy(out, 1.0f, a, 0);
    k->scale(out, a, 2.0f, 0);
    k->copy(out, a, 0);
    k->fill(out, 0.0f, 0);
    CU_ASSERT_EQUAL(out[0], 9.0f);
    free(a), free(b), free(out), free(want);
}

/* ---- reductions ---- */

/* sum and sum_squares against a sequential double sum (rtol 1e-12, atol 1e-12); sums that
 * float accumulation would lose (1e8 + 1000 ones), exact; max_abs exact, inf and NaN
 * propagate; n == 0 gives 0. */
static void test_reductions(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { N = 1001 };
    rng_seed(9);
    float *x = new_uniform(N, -1, 1);
    x[17] = -3.5f;
    double s = 0.0, ss = 0.0;
    for (int i = 0; i < N; i++) s += x[i], ss += (double)x[i] * x[i];
    CLOSE_S("sum", k->sum(x, N), s, 1e-12, 1e-12);
    CLOSE_S("sum_squares", k->sum_squares(x, N), ss, 1e-12, 1e-12);
    CLOSE_S("max_abs", k->max_abs(x, N), 3.5, 0, 0);
    CLOSE_S("sum n=7 (tail only)", k->sum(x, 7),
            x[0] + (double)x[1] + x[2] + x[3] + x[4] + x[5] + x[6], 1e-15, 0);

    float *big = new_floats(N); // in float, 1e8 + 1 == 1e8
    big[0] = 1e8f;
    for (int i = 1; i < N; i++) big[i] = 1.0f;
    CLOSE_S("sum 1e8 + 1000 ones (in double)", k->sum(big, N), 1e8 + 1000, 0, 0);
    big[0] = 1e4f;
    CLOSE_S("sum_squares 1e4^2 + 1000 ones", k->sum_squares(big, N), 1e8 + 1000, 0, 0);

    CU_ASSERT_EQUAL(k->sum(x, 0), 0.0);
    CU_ASSERT_EQUAL(k->sum_squares(x, 0), 0.0);
    CU_ASSERT_EQUAL(k->max_abs(x, 0), 0.0);
    x[500] = -INFINITY;
    CU_ASSERT_TRUE(isinf(k->max_abs(x, N)) && k->max_abs(x, N) > 0);
    x[900] = NAN;
    CU_ASSERT_TRUE(isnan(k->max_abs(x, N)));
    CU_ASSERT_TRUE(isnan(k->sum(x, N)));
    CU_ASSERT_TRUE(isnan(k->sum_squares(x, N)));
    free(x), free(big);
}

/* ---- losses ---- */

typedef struct mse_aux {
    const double *target;
    int64_t n;
} mse_aux;

static double mse_d(const double *out, const void *aux) {
    const mse_aux *a = aux;
    double L = 0.0;
    for (int64_t i = 0; i < a->n; i++) L += (out[i] - a->target[i]) * (out[i] - a->target[i]);
    return L / (double)a->n;
}

/* loss rtol 1e-6, dout rtol 1e-6 against double; dout against central differences (h 1e-4)
 * rtol 1e-5, atol 1e-9; dout may be NULL. */
static void test_mse(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { N = 257 };
    rng_seed(10);
    float *out = new_uniform(N, -2, 2), *target = new_uniform(N, -2, 2), *dout = new_floats(N);
    double *od = to_doubles(out, N), *td = to_doubles(target, N), want[N], fd[N];
    mse_aux aux = {td, N};
    float loss = NAN, loss2 = NAN;
    k->mse_loss(&loss, dout, out, target, N);
    CLOSE_S("mse loss", loss, mse_d(od, &aux), 1e-6, 0);
    for (int i = 0; i < N; i++) want[i] = 2.0 * (od[i] - td[i]) / N;
    CLOSE_D("mse dout", dout, want, N, 1e-6, 0);
    finite_diff(fd, mse_d, od, N, 1e-4, &aux);
    CLOSE_D("mse dout vs finite diff", dout, fd, N, 1e-5, 1e-9);
    k->mse_loss(&loss2, NULL, out, target, N);
    CU_ASSERT_EQUAL(loss2, loss);
    free(out), free(target), free(dout), free(od), free(td);
}

typedef struct ce_aux {
    const int32_t *targets;
    int64_t rows, classes;
} ce_aux;

/* mean over rows of logsumexp(x_r) - x_r[t_r], stable, in double */
static double ce_d(const double *x, const void *aux) {
    const ce_aux *a = aux;
    double L = 0.0;
    for (int64_t r = 0; r < a->rows; r++) {
        const double *xr = x + r * a->classes;
        double m = xr[0], se = 0.0;
        for (int64_t c = 1; c < a->classes; c++) m = fmax(m, xr[c]);
        for (int64_t c = 0; c < a->classes; c++) se += exp(xr[c] - m);
        L += m + log(se) - xr[a->targets[r]];
    }
    return L / (double)a->rows;
}

/* dlogits (rows, classes) = (softmax - onehot) / rows, in double */
static void ce_grad_d(double *d, const double *x, const ce_aux *a) {
    for (int64_t r = 0; r < a->rows; r++) {
        const double *xr = x + r * a->classes;
        double m = xr[0], se = 0.0;
        for (int64_t c = 1; c < a->classes; c++) m = fmax(m, xr[c]);
        for (int64_t c = 0; c < a->classes; c++) se += exp(xr[c] - m);
        for (int64_t c = 0; c < a->classes; c++)
            d[r * a->classes + c] = (exp(xr[c] - m) / se - (c == a->targets[r])) / a->rows;
    }
}

/* Against double: loss rtol 1e-6, dlogits rtol 1e-5 atol 1e-8; against central differences
 * (h 1e-5): rtol 1e-5, atol 1e-8. dlogits may be NULL or the logits array itself. */
static void test_cross_entropy(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { R = 6, C = 11 };
    rng_seed(11);
    float *x = new_uniform(R * C, -3, 3), dl[R * C], loss = NAN, loss2 = NAN;
    int32_t t[R] = {0, 10, 3, 3, 7, 5};
    ce_aux aux = {t, R, C};
    double *xd = to_doubles(x, R * C), want[R * C], fd[R * C];
    k->cross_entropy(&loss, dl, x, t, R, C);
    CLOSE_S("cross_entropy loss", loss, ce_d(xd, &aux), 1e-6, 0);
    ce_grad_d(want, xd, &aux);
    CLOSE_D("cross_entropy dlogits", dl, want, R * C, 1e-5, 1e-8);
    finite_diff(fd, ce_d, xd, R * C, 1e-5, &aux);
    CLOSE_D("cross_entropy dlogits vs finite diff", dl, fd, R * C, 1e-5, 1e-8);
    k->cross_entropy(&loss2, NULL, x, t, R, C);
    CU_ASSERT_EQUAL(loss2, loss);
    k->cross_entropy(&loss2, x, x, t, R, C); // in place
    CU_ASSERT_EQUAL(loss2, loss);
    FSDP_TEST_CLOSE("cross_entropy dlogits in place", x, dl, R * C, 0, 0);
    free(x), free(xd);
}

/* Logits of +-1000 (exp overflows unless shifted by the row max): loss and dlogits finite and
 * equal to the stable double reference (loss rtol 1e-6; dlogits rtol 1e-5, atol 1e-8). */
static void test_cross_entropy_large_logits(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { R = 3, C = 4 };
    float x[R * C] = {1000,  999,   -1000, 998,    // target 1: loss about 1.41
                      1000,  1000,  1000,  1000,   // uniform: loss log(4)
                      -1000, -1000, 1000,  -1000}; // target 0 far off: loss 2000
    int32_t t[R] = {1, 2, 0};
    ce_aux aux = {t, R, C};
    float dl[R * C], loss = NAN;
    double *xd = to_doubles(x, R * C), want[R * C];
    k->cross_entropy(&loss, dl, x, t, R, C);
    CU_ASSERT_TRUE(isfinite(loss));
    bool finite = true;
    for (int i = 0; i < R * C; i++) finite = finite && isfinite(dl[i]);
    CU_ASSERT_TRUE(finite);
    CLOSE_S("cross_entropy loss, logits 1000", loss, ce_d(xd, &aux), 1e-6, 0);
    ce_grad_d(want, xd, &aux);
    CLOSE_D("cross_entropy dlogits, logits 1000", dl, want, R * C, 1e-5, 1e-8);
    free(xd);
}

/* ---- bf16 ---- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The rule, written out here: NaN -> quiet NaN with the top bits kept; otherwise round the
 * low 16 bits to nearest, ties to even (an overflow to inf is correct rounding). */
static fsdp_bf16 ref_bf16(uint32_t bits) {
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (fsdp_bf16)((bits >> 16) | 0x40u);
    uint32_t low = bits & 0xFFFFu, high = bits >> 16;
    if (low > 0x8000u || (low == 0x8000u && (high & 1u))) high++;
    return (fsdp_bf16)high;
}

/* Named cases (ties both ways, NaN, inf, overflow, signed zero, denormals), then random bit
 * patterns: the kernel equals ref_bf16 and fsdp_bf16_from_f32 bit for bit. */
static void test_bf16_from_f32(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    static const uint32_t in[][2] = {
        {0x3F800000u, 0x3F80u}, // 1.0
        {0x3F808000u, 0x3F80u}, // tie, even below: down
        {0x3F818000u, 0x3F82u}, // tie, odd below: up to even
        {0x3F808001u, 0x3F81u}, // just above the tie: up
        {0x3F807FFFu, 0x3F80u}, // just below the tie: down
        {0xBF818000u, 0xBF82u}, // negative tie: magnitude to even
        {0x7F800000u, 0x7F80u}, // +inf
        {0xFF800000u, 0xFF80u}, // -inf
        {0x7FC00000u, 0x7FC0u}, // quiet NaN
        {0xFFC00000u, 0xFFC0u}, // negative quiet NaN
        {0x7F800001u, 0x7FC0u}, // signalling NaN, payload below bf16: still NaN
        {0x7FFFFFFFu, 0x7FFFu}, // NaN with all ones: no carry into the sign
        {0x7F7FFFFFu, 0x7F80u}, // FLT_MAX rounds to inf
        {0x80000000u, 0x8000u}, // -0
        {0x00000001u, 0x0000u}, // smallest denormal
        {0x00018000u, 0x0002u}, // denormal tie, odd: up
    };
    enum { NAMED = sizeof in / sizeof in[0], RANDOM = 100000 };
    float src[NAMED];
    fsdp_bf16 dst[NAMED];
    for (int i = 0; i < NAMED; i++) src[i] = bits_f32(in[i][0]);
    k->f32_to_bf16(dst, src, NAMED);
    int bad = 0;
    for (int i = 0; i < NAMED; i++)
        if (dst[i] != in[i][1] || ref_bf16(in[i][0]) != in[i][1]) {
            printf("\n    f32 0x%08X -> bf16 0x%04X, want 0x%04X", in[i][0], dst[i], in[i][1]);
            bad++;
        }
    CU_ASSERT_EQUAL(bad, 0);

    rng_seed(12);
    float *r = new_floats(RANDOM);
    fsdp_bf16 *rb = malloc(RANDOM * sizeof(fsdp_bf16));
    CU_ASSERT_PTR_NOT_NULL_FATAL(rb);
    for (int i = 0; i < RANDOM; i++) r[i] = bits_f32(rng_u32());
    k->f32_to_bf16(rb, r, RANDOM);
    int off_ref = 0, off_core = 0;
    for (int i = 0; i < RANDOM; i++) {
        off_ref += rb[i] != ref_bf16(f32_bits(r[i]));
        off_core += rb[i] != fsdp_bf16_from_f32(r[i]);
    }
    printf("\n    f32_to_bf16 on %d random bit patterns: %d differ from the rule, %d from "
           "fsdp_bf16_from_f32",
           RANDOM, off_ref, off_core);
    CU_ASSERT_EQUAL(off_ref, 0);
    CU_ASSERT_EQUAL(off_core, 0);
    free(r), free(rb);
}

/* bf16 -> f32 is exact (the bits shifted up) and agrees with fsdp_bf16_to_f32; every
 * non-NaN bf16 survives bf16 -> f32 -> bf16, and every NaN stays NaN. */
static void test_bf16_round_trip(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { ALL = 65536 };
    fsdp_bf16 *b = malloc(ALL * sizeof(fsdp_bf16)), *back = malloc(ALL * sizeof(fsdp_bf16));
    float *f = new_floats(ALL);
    CU_ASSERT_FATAL(b && back);
    for (int i = 0; i < ALL; i++) b[i] = (fsdp_bf16)i;
    k->bf16_to_f32(f, b, ALL);
    k->f32_to_bf16(back, f, ALL);
    int widen_bad = 0, trip_bad = 0, nan_bad = 0;
    for (int i = 0; i < ALL; i++) {
        bool nan = (i & 0x7FFF) > 0x7F80;
        widen_bad += f32_bits(f[i]) != ((uint32_t)i << 16);
        widen_bad += f32_bits(f[i]) != f32_bits(fsdp_bf16_to_f32(b[i]));
        if (nan)
            nan_bad += !isnan(f[i]) || !isnan(bits_f32((uint32_t)back[i] << 16));
        else
            trip_bad += back[i] != b[i];
    }
    printf("\n    all 65536 bf16: %d widen wrong, %d round trips changed, %d NaN lost", widen_bad,
           trip_bad, nan_bad);
    CU_ASSERT_EQUAL(widen_bad, 0);
    CU_ASSERT_EQUAL(trip_bad, 0);
    CU_ASSERT_EQUAL(nan_bad, 0);
    free(b), free(back), free(f);
}

/* ---- f16 ---- */

/* The value of an f16 bit pattern from its fields, in double: (-1)^s (1 + m/1024) 2^(e-15), or
 * m 2^-24 when e is 0; e 31 is inf (m 0) or NaN. */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m, -24);
    return s ? -v : v;
}

/* All 65536 f16: widening equals the value of the fields (so it is exact) and core's
 * fsdp_f16_to_f32; every non-NaN survives f16 -> f32 -> f16 with its bits, -0 included; a NaN
 * stays a NaN (the quiet bit set, sign and payload kept). */
static void test_f16_round_trip(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { ALL = 65536 };
    fsdp_f16 *h = malloc(ALL * sizeof(fsdp_f16)), *back = malloc(ALL * sizeof(fsdp_f16));
    float *f = new_floats(ALL);
    CU_ASSERT_FATAL(h && back);
    for (int i = 0; i < ALL; i++) h[i] = (fsdp_f16)i;
    k->f16_to_f32(f, h, ALL);
    k->f32_to_f16(back, f, ALL);
    int widen_bad = 0, trip_bad = 0, nan_bad = 0, nans = 0;
    for (int i = 0; i < ALL; i++) {
        double want = f16_value((uint16_t)i);
        widen_bad += f32_bits(f[i]) != f32_bits(fsdp_f16_to_f32(h[i]));
        if (isnan(want)) {
            nans++;
            nan_bad +=
                !isnan(f[i]) || back[i] != (h[i] | 0x200u) || fsdp_f16_from_f32(f[i]) != back[i];
        } else {
            widen_bad += (double)f[i] != want || (signbit(f[i]) != 0) != (i >> 15);
            trip_bad += back[i] != h[i] || fsdp_f16_from_f32(f[i]) != h[i];
        }
    }
    printf("\n    all 65536 f16 (%d NaN): %d widen wrong, %d round trips changed, %d NaN wrong",
           nans, widen_bad, trip_bad, nan_bad);
    CU_ASSERT_EQUAL(nans, 2046);
    CU_ASSERT_EQUAL(widen_bad, 0);
    CU_ASSERT_EQUAL(trip_bad, 0);
    CU_ASSERT_EQUAL(nan_bad, 0);
    free(h), free(back), free(f);
}

/* f32 -> f16 against an independent rule in double: |x| is rounded to a multiple of the f16
 * spacing at |x| (2^-24 below 2^-14, else 2^(floor(log2 |x|) - 10)) with rint, ties to even,
 * and a result past 65504 (the largest finite f16) is inf. On random bit patterns, every exact
 * midpoint between neighbouring f16 values (ties) and the f32 values one ulp either side of each:
 * the kernel and fsdp_f16_from_f32 give that value (checked through the exact widening), with x's
 * sign. */
static void test_f16_from_f32(void) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { RANDOM = 100000, MIDS = 3 * 2 * 0x7BFF, N = RANDOM + MIDS };
    float *x = new_floats(N);
    fsdp_f16 *got = malloc(N * sizeof(fsdp_f16));
    CU_ASSERT_FATAL(got != NULL);
    rng_seed(16);
    int n = 0;
    for (; n < RANDOM / 2; n++) x[n] = bits_f32(rng_u32());
    for (; n < RANDOM; n++) /* exponents around the f16 range: subnormal to overflow */
        x[n] = bits_f32((rng_u32() & 0x807FFFFFu) | ((96u + rng_u32() % 50u) << 23));
    for (uint16_t h = 0; h < 0x7BFF; h++) {
        float mid = (float)((f16_value(h) + f16_value((uint16_t)(h + 1))) / 2); /* exact */
        for (int sgn = 0; sgn < 2; sgn++) {
            float m = sgn ? -mid : mid;
            x[n++] = m;
            x[n++] = nextafterf(m, INFINITY);
            x[n++] = nextafterf(m, -INFINITY);
        }
    }
    k->f32_to_f16(got, x, n);
    int bad = 0, bad_core = 0;
    for (int i = 0; i < n; i++) {
        double v = x[i], a = fabs(v), want;
        if (isnan(v)) {
            bad += !isnan(fsdp_f16_to_f32(got[i]));
            bad_core += fsdp_f16_from_f32(x[i]) != got[i];
            continue;
        }
        int e;
        frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
        double ulp = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, e - 1 - 10);
        want = rint(a / ulp) * ulp;
        if (want > 65504.0 || isinf(a)) want = INFINITY; /* past the largest finite f16 */
        float g = fsdp_f16_to_f32(got[i]);
        bool ok = fabs((double)g) == want && !signbit(g) == !signbit(x[i]);
        if (!ok && bad < 5)
            printf("\n    f32 0x%08X (%.9g) -> f16 0x%04X (%.9g), want %.9g", f32_bits(x[i]), v,
                   got[i], (double)g, want);
        bad += !ok;
        bad_core += fsdp_f16_from_f32(x[i]) != got[i];
    }
    printf("\n    f32_to_f16 on %d values: %d differ from the rule, %d from fsdp_f16_from_f32", n,
           bad, bad_core);
    CU_ASSERT_EQUAL(n, N);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(bad_core, 0);
    free(x), free(got);
}

/* ---- fused GEMM epilogues: the separate entries' bits ---- */

/* Counts the elements of the fused entries' results (gemm_bias_act and gemm_bf16_bias_act with
 * every activation, with and without bias and pre, and gemm_bgrad with and without dbias) that
 * differ in any bit from the separate entries run in kernels.h's order on the same inputs (out
 * starting as NaN: beta 0 overwrites it). */
static int64_t epilogue_mismatches(int64_t rows, int64_t C, int64_t OC) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    int64_t nx = rows * C, nw = OC * C, ny = rows * OC;
    float *x = new_uniform(nx, -2, 2), *w = new_uniform(nw, -1, 1), *b = new_uniform(OC, -1, 1);
    float *dy = new_uniform(ny, -1, 1), *g0 = new_uniform(nw, -1, 1), *db0 = new_uniform(OC, -1, 1);
    fsdp_bf16 *x16 = malloc((size_t)nx * 2), *w16 = malloc((size_t)nw * 2);
    k->f32_to_bf16(x16, x, nx), k->f32_to_bf16(w16, w, nw);
    float *out[2], *pre[2], *dw[2], *db[2];
    for (int i = 0; i < 2; i++) {
        out[i] = new_floats(ny), pre[i] = new_floats(ny);
        dw[i] = new_floats(nw), db[i] = new_floats(OC);
    }
    int64_t bad = 0;
    for (int v = 0; v < 24; v++) {
        bool bf16 = v & 1, with_bias = v & 2, with_pre = v & 4;
        fsdp_gemm_act act = (fsdp_gemm_act)(v / 8);
        const float *bias = with_bias ? b : NULL;
        for (int i = 0; i < 2; i++)
            for (int64_t j = 0; j < ny; j++) out[i][j] = NAN, pre[i][j] = -1.0f;
        if (bf16) {
            k->gemm_bf16_bias_act(out[0], with_pre ? pre[0] : NULL, x16, w16, bias, rows, C, OC,
                                  act);
            k->gemm_bf16(false, true, rows, OC, C, 1.0f, x16, C, w16, C, 0.0f, out[1], OC);
        } else {
            k->gemm_bias_act(out[0], with_pre ? pre[0] : NULL, x, w, bias, rows, C, OC, act);
            k->gemm(false, true, rows, OC, C, 1.0f, x, C, w, C, 0.0f, out[1], OC);
        }
        if (bias) k->bias_add(out[1], bias, rows, OC);
        if (with_pre) k->copy(pre[1], out[1], ny);
        if (act == FSDP_GEMM_ACT_RELU) k->relu_forward(out[1], out[1], ny);
        if (act == FSDP_GEMM_ACT_GELU) k->gelu_forward(out[1], out[1], ny);
        for (int64_t j = 0; j < ny; j++)
            bad += f32_bits(out[0][j]) != f32_bits(out[1][j]) ||
                   f32_bits(pre[0][j]) != f32_bits(pre[1][j]);
    }
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (int i = 0; i < 2; i++) {
            memcpy(dw[i], g0, (size_t)nw * 4);
            memcpy(db[i], db0, (size_t)OC * 4);
        }
        k->gemm_bgrad(dw[0], with_bias ? db[0] : NULL, dy, x, rows, C, OC);
        k->gemm(true, false, OC, C, rows, 1.0f, dy, OC, x, C, 1.0f, dw[1], C);
        if (with_bias) k->bias_backward(db[1], dy, rows, OC);
        for (int64_t j = 0; j < nw; j++) bad += f32_bits(dw[0][j]) != f32_bits(dw[1][j]);
        for (int64_t j = 0; j < OC; j++) bad += f32_bits(db[0][j]) != f32_bits(db[1][j]);
    }
    for (int i = 0; i < 2; i++) free(out[i]), free(pre[i]), free(dw[i]), free(db[i]);
    free(x), free(w), free(b), free(dy), free(g0), free(db0), free(x16), free(w16);
    return bad;
}

/* On this thread alone and split over 3 of the rank's threads (the entries split as the
 * separate ones do), shapes from one element to above the split thresholds. Exact: the fused
 * CPU entries are defined as the separate ones. */
static void test_epilogue_bitwise(void) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 33, 8}, {33, 7, 17}, {300, 129, 517}};
    rng_seed(44);
    CU_ASSERT_EQUAL(fsdp_kernels_cpu_threads_enter(1, 1), 1);
    for (int threads = 1; threads <= 3; threads += 2) {
        CU_ASSERT_EQUAL(fsdp_kernels_cpu_workers_start(threads, -1), threads);
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t bad = epilogue_mismatches(shapes[s][0], shapes[s][1], shapes[s][2]);
            printf("\n    %d thread(s), %lldx%lldx%lld: %lld elements differ from the separate "
                   "entries",
                   threads, (long long)shapes[s][0], (long long)shapes[s][1],
                   (long long)shapes[s][2], (long long)bad);
            CU_ASSERT_EQUAL(bad, 0);
        }
        fsdp_kernels_cpu_workers_stop();
    }
    fsdp_kernels_cpu_threads_leave();
}

/* ---- a rank's threads: split calls give bitwise the one-thread results ---- */

/* Runs every entry the table splits once on this thread alone and once over `threads` threads
 * (fsdp_kernels_cpu_workers_start), on the same inputs, and counts the outputs that differ in
 * any bit (elementwise kernels, bias, SGD, Adam) or, for GEMM, lie outside float32's error
 * bound (OpenBLAS single-threaded, as during a run). Sizes are above the split thresholds and not
 * multiples of the block sizes. */
static int split_mismatches(int threads) {
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    enum { N = 200003, ROWS = 1001, COLS = 131 };
    static const int64_t shapes[][3] = {{300, 517, 129}, {700, 130, 64}, {257, 2049, 8}};
    int bad = 0;
    float *x = new_uniform(N, -2, 2), *y = new_uniform(N, -2, 2);
    float *out[2], *p[2], *buf[2], *m[2], *v[2], *vmax[2], *bias_out[2], *c[2], *dbias[2];
    float *bias = new_uniform(COLS, -1, 1);
    int64_t big = 700 * 517;
    float *A = new_uniform(700 * 517, -1, 1), *B = new_uniform(700 * 517, -1, 1);
    float *c0 = new_uniform(big * 2, -1, 1);
    for (int run = 0; run < 2; run++) {
        CU_ASSERT_EQUAL(fsdp_kernels_cpu_workers_start(run ? threads : 1, -1), run ? threads : 1);
        out[run] = new_floats(N * 12);
        p[run] = new_floats(N), buf[run] = new_floats(N), m[run] = new_floats(N);
        v[run] = new_floats(N), vmax[run] = new_floats(N);
        bias_out[run] = new_floats(ROWS * COLS);
        c[run] = new_floats(big * 2 * 12);
        float *o = out[run];
        k->add(o, x, y, N), k->scale(o + N, x, 0.3f, N), k->copy(o + 2 * N, x, N);
        k->fill(o + 3 * N, 1.5f, N), k->relu_forward(o + 4 * N, x, N);
        k->relu_backward(o + 5 * N, x, y, N), k->sigmoid_forward(o + 6 * N, x, N);
        k->sigmoid_backward(o + 7 * N, x, y, N), k->gelu_forward(o + 8 * N, x, N);
        k->gelu_backward(o + 9 * N, x, y, N);
        memcpy(o + 10 * N, y, N * sizeof(float));
        k->axpy(o + 10 * N, -0.7f, x, N);
        k->fill(o + 11 * N, -0.0f, N); /* -0.0 keeps its sign bit (+0.0 is a memset) */
        memcpy(bias_out[run], x, ROWS * COLS * sizeof(float));
        k->bias_add(bias_out[run], bias, ROWS, COLS);
        dbias[run] = new_floats(COLS);
        memcpy(dbias[run], bias, COLS * sizeof(float)); /* bias_backward adds */
        k->bias_backward(dbias[run], x, ROWS, COLS);
        memcpy(p[run], x, N * sizeof(float)), memcpy(buf[run], y, N * sizeof(float));
        fsdp_sgd_step_args sgd = {.sign = 1,
                                  .weight_decay = 0.01f,
                                  .momentum = 0.9f,
                                  .keep = 0.9f,
                                  .neg_lr = -0.1f,
                                  .nesterov = true};
        k->sgd_update(p[run], y, buf[run], N, &sgd);
        k->sgd_update(p[run], x, NULL, N, &sgd);
        memcpy(m[run], y, N * sizeof(float));
        for (int64_t i = 0; i < N; i++) v[run][i] = fabsf(x[i]), vmax[run][i] = fabsf(y[i]);
        fsdp_adam_step_args adam = {.sign = 1,
                                    .l2 = 0.01f,
                                    .shrink = 0.999f,
                                    .w1 = 0.1f,
                                    .beta2 = 0.999f,
                                    .w2 = 0.001f,
                                    .eps = 1e-8f,
                                    .neg_step_size = -1e-3f,
                                    .bc2_sqrt = 0.3f};
        k->adam_update(p[run], x, m[run], v[run], vmax[run], N, &adam);
        k->adam_update(p[run], y, m[run], v[run], NULL, N, &adam);
        for (int s = 0; s < 3; s++) {
            for (int t = 0; t < 4; t++) {
                int64_t M = shapes[s][0], Nn = shapes[s][1], K = shapes[s][2];
                bool ta = t & 1, tb = t & 2;
                float *C = c[run] + (int64_t)(s * 4 + t) * big * 2;
                memcpy(C, c0, (size_t)(M * Nn) * sizeof(float));
                k->gemm(ta, tb, M, Nn, K, 0.5f, A, ta ? M : K, B, tb ? K : Nn,
                        t == 3 ? 0.0f : 0.25f, C, Nn);
            }
        }
        fsdp_kernels_cpu_workers_stop();
    }
    bad += memcmp(out[0], out[1], (size_t)N * 12 * sizeof(float)) != 0;
    bad += f32_bits(out[1][11 * N]) != 0x80000000u || f32_bits(out[1][12 * N - 1]) != 0x80000000u;
    k->fill(out[1], 0.0f, N);
    bad += f32_bits(out[1][0]) != 0 || f32_bits(out[1][N - 1]) != 0;
    bad += memcmp(bias_out[0], bias_out[1], ROWS * COLS * sizeof(float)) != 0;
    bad += memcmp(dbias[0], dbias[1], COLS * sizeof(float)) != 0;
    bad += memcmp(p[0], p[1], N * sizeof(float)) != 0;
    bad += memcmp(buf[0], buf[1], N * sizeof(float)) != 0;
    bad += memcmp(m[0], m[1], N * sizeof(float)) != 0;
    bad += memcmp(v[0], v[1], N * sizeof(float)) != 0;
    bad += memcmp(vmax[0], vmax[1], N * sizeof(float)) != 0;
    /* GEMM: OpenBLAS's blocks of a split C are not always computed in the same order as in
     * the whole (its edge kernels differ), so both are held to the forward error bound of a
     * float32 dot product of length K, |C - C_exact| <= (K + 2) u (|alpha| sum |a b| +
     * |beta c|) with u = 2^-24, against a double-precision reference. */
    int64_t wrong = 0;
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 4; t++) {
            int64_t M = shapes[s][0], Nn = shapes[s][1], K = shapes[s][2];
            bool ta = t & 1, tb = t & 2;
            double beta = t == 3 ? 0.0 : 0.25;
            int64_t at = (int64_t)(s * 4 + t) * big * 2;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < Nn; j++) {
                    double acc = 0, mag = 0;
                    for (int64_t q = 0; q < K; q++) {
                        double a = A[ta ? q * M + i : i * K + q],
                               b = B[tb ? j * K + q : q * Nn + j];
                        acc += a * b, mag += fabs(a * b);
                    }
                    double want = 0.5 * acc + beta * (double)c0[i * Nn + j];
                    double tol =
                        (double)(K + 2) * 0x1p-24 * (0.5 * mag + beta * fabs(c0[i * Nn + j]));
                    for (int run = 0; run < 2; run++)
                        wrong += fabs((double)c[run][at + i * Nn + j] - want) > tol;
                }
        }
    printf("\n    %d threads: %lld GEMM elements outside the float32 error bound", threads,
           (long long)wrong);
    bad += wrong != 0;
    for (int run = 0; run < 2; run++) {
        free(out[run]), free(p[run]), free(buf[run]), free(m[run]), free(v[run]);
        free(vmax[run]), free(bias_out[run]), free(c[run]), free(dbias[run]);
    }
    free(x), free(y), free(bias), free(A), free(B), free(c0);
    return bad;
}

static void test_threads_split(void) {
    /* As inside fsdp_world_run: OpenBLAS single-threaded, the rank's workers split. */
    CU_ASSERT_EQUAL(fsdp_kernels_cpu_threads_enter(1, 1), 1);
    for (int threads = 2; threads <= 5; threads += 3) {
        int bad = split_mismatches(threads);
        printf("\n    %d threads: %d outputs wrong", threads, bad);
        CU_ASSERT_EQUAL(bad, 0);
    }
    CU_ASSERT_EQUAL(fsdp_kernels_cpu_workers_start(0, -1), 1); /* no workers: this thread only */
    fsdp_kernels_cpu_workers_stop();
    fsdp_kernels_cpu_threads_leave();
}

/* The profile times the table's entries on the thread that started it, by kind, and only
 * while it runs; the untimed table is handed out again after it stops. */
static void test_profile_kernels(void) {
    fsdp_ctx *ctx = NULL;
    CU_ASSERT_EQUAL_FATAL(fsdp_ctx_create(NULL, &ctx), FSDP_OK);
    const fsdp_kernels_i *plain = fsdp_kernels_cpu();
    float a[64], b[64], c[64];
    for (int i = 0; i < 64; i++) a[i] = (float)i, b[i] = 1.0f;
    fsdp_profile pr;
    CU_ASSERT_EQUAL(fsdp_profile_read(ctx, &pr), FSDP_OK);
    CU_ASSERT_EQUAL(pr.gemm_calls, 0);
    CU_ASSERT_EQUAL(fsdp_profile_start(ctx), FSDP_OK);
    const fsdp_kernels_i *k = fsdp_kernels_cpu();
    CU_ASSERT_PTR_NOT_EQUAL(k, plain);
    k->gemm(false, false, 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8);
    k->gemm(false, true, 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8);
    CU_ASSERT_EQUAL(c[0], 28.0f); /* row 0 of a (0..7) dotted with ones */
    k->relu_forward(c, a, 64);
    k->add(c, a, b, 64);
    k->scale(c, a, 2.0f, 64);
    fsdp_sgd_step_args sgd = {.sign = 1, .neg_lr = -1};
    k->sgd_update(c, b, NULL, 64, &sgd);
    CU_ASSERT_EQUAL(c[3], 5.0f);           /* 2 * 3 - 1 */
    k->gemm_bgrad(c, NULL, a, b, 8, 8, 8); /* a fused GEMM counts as one GEMM */
    fsdp_bf16 a16[64], b16[64], c16[64];   /* the bf16 policy's GEMMs count too */
    k->f32_to_bf16(a16, a, 64);
    k->f32_to_bf16(b16, b, 64);
    k->gemm_bf16(false, true, 8, 8, 8, 1.0f, a16, 8, b16, 8, 0.0f, c, 8);
    CU_ASSERT_EQUAL(c[0], 28.0f);
    k->gemm_bf16_round(false, true, 8, 8, 8, a16, 8, b16, 8, c16, 8);
    CU_ASSERT_EQUAL(fsdp_profile_stop(ctx), FSDP_OK);
    CU_ASSERT_PTR_EQUAL(fsdp_kernels_cpu(), plain);
    plain->gemm(false, false, 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8); /* not counted */
    CU_ASSERT_EQUAL(fsdp_profile_read(ctx, &pr), FSDP_OK);
    CU_ASSERT_EQUAL(pr.gemm_calls, 5);
    CU_ASSERT_EQUAL(pr.elementwise_calls, 5);
    CU_ASSERT_EQUAL(pr.optimizer_calls, 1);
    CU_ASSERT(pr.gemm_s > 0 && pr.elementwise_s > 0 && pr.optimizer_s > 0);
    for (int op = 0; op < FSDP_COMM_OP_COUNT; op++) CU_ASSERT_EQUAL(pr.comm_calls[op], 0);
    CU_ASSERT_EQUAL(fsdp_profile_start(ctx), FSDP_OK); /* a restart starts from zero */
    CU_ASSERT_EQUAL(fsdp_profile_read(ctx, &pr), FSDP_OK);
    CU_ASSERT_EQUAL(pr.gemm_calls, 0);
    fsdp_ctx_free(ctx); /* stops it */
    CU_ASSERT_PTR_EQUAL(fsdp_kernels_cpu(), plain);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"dispatch", test_dispatch},
        {"gemm_transposes", test_gemm_transposes},
        {"gemm_beta_zero", test_gemm_beta_zero},
        {"gemm_zero_size", test_gemm_zero_size},
        {"bias", test_bias},
        {"activation_forward", test_activation_forward},
        {"activation_backward", test_activation_backward},
        {"rmsnorm_forward", test_rmsnorm_forward},
        {"rmsnorm_backward", test_rmsnorm_backward},
        {"elementwise", test_elementwise},
        {"reductions", test_reductions},
        {"mse", test_mse},
        {"cross_entropy", test_cross_entropy},
        {"cross_entropy_large_logits", test_cross_entropy_large_logits},
        {"bf16_from_f32", test_bf16_from_f32},
        {"bf16_round_trip", test_bf16_round_trip},
        {"f16_round_trip", test_f16_round_trip},
        {"f16_from_f32", test_f16_from_f32},
        {"threads_split", test_threads_split},
        {"epilogue_bitwise", test_epilogue_bitwise},
        {"profile_kernels", test_profile_kernels},
    };
    return fsdp_test_run(argc, argv, "kernels", cases, (int)(sizeof cases / sizeof cases[0]));
}
