/* parallel.c: the CPU table's entries that split one call over the calling rank's threads
 * (workers.c): GEMM by blocks of rows or columns of C, the elementwise kernels and the
 * optimizer updates by cache-line aligned ranges. An elementwise or optimizer element is
 * computed by the same single-threaded code as without workers, so those results are bitwise
 * the same for any thread count; a GEMM block is OpenBLAS's single-threaded GEMM on that block,
 * equal to the whole to float32 rounding (OpenBLAS's edge kernels order some sums differently),
 * as OpenBLAS's own threads are. Small calls, and threads without workers, run on the calling
 * thread. */
#include <stddef.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/workers.h"

#define LINE      16      /* floats per 64-byte cache line */
#define MIN_SPLIT 32768   /* elements per thread below which a call is not split */
#define MIN_FLOPS 4000000 /* multiply-adds of a GEMM below which it is not split */
#define GEMM_LINE 64      /* rows or columns of C per block */

/* Enough elements for `parts` threads to be worth waking. */
static bool worth(int64_t n) {
    int parts = fsdp_cpu_workers_count();
    return parts > 1 && n >= 2 * MIN_SPLIT;
}

/* ---- GEMM ---- */

typedef struct gemm_job {
    bool ta, tb, by_rows;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
} gemm_job;

static void gemm_part(void *arg, int part, int parts) {
    const gemm_job *j = arg;
    int64_t b, e;
    fsdp_cpu_split(j->by_rows ? j->M : j->N, GEMM_LINE, part, parts, &b, &e);
    if (b >= e) return;
    if (j->by_rows) { /* rows b..e of C: rows of op(A) */
        const float *A = j->ta ? j->A + b : j->A + b * j->lda;
        fsdp_cpu_gemm(j->ta, j->tb, e - b, j->N, j->K, j->alpha, A, j->lda, j->B, j->ldb, j->beta,
                      j->C + b * j->ldc, j->ldc);
    } else { /* columns b..e of C: columns of op(B) */
        const float *B = j->tb ? j->B + b * j->ldb : j->B + b;
        fsdp_cpu_gemm(j->ta, j->tb, j->M, e - b, j->K, j->alpha, j->A, j->lda, B, j->ldb, j->beta,
                      j->C + b, j->ldc);
    }
}

void fsdp_cpu_par_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc) {
    int parts = fsdp_cpu_workers_count();
    int64_t big = M > N ? M : N;
    if (parts == 1 || M * N * K < MIN_FLOPS || big < 2 * GEMM_LINE) {
        fsdp_cpu_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    gemm_job j = {.ta = trans_a,
                  .tb = trans_b,
                  .by_rows = M > N,
                  .M = M,
                  .N = N,
                  .K = K,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = alpha,
                  .beta = beta,
                  .A = A,
                  .B = B,
                  .C = C};
    fsdp_cpu_workers_run(gemm_part, &j);
}

/* ---- elementwise ---- */

/* One job shape serves every elementwise entry: up to four arrays and two scalars. */
typedef struct ew_job {
    int kind;
    int64_t n, cols;
    float *out;
    const float *a, *b, *c; /* c: add3's third input, or NULL */
    float s;
    const void *args;
    float *m, *v, *vmax;
    fsdp_bf16 *lp;        /* adam_update_bf16's copy */
    const fsdp_bf16 *b16; /* add_bf16's second input */
} ew_job;

enum {
    EW_ADD,
    EW_ADD3,
    EW_ADD3_ROUND_BF16,
    EW_ADD_BF16,
    EW_AXPY,
    EW_SCALE,
    EW_COPY,
    EW_FILL,
    EW_RELU_F,
    EW_RELU_B,
    EW_SIGMOID_F,
    EW_SIGMOID_B,
    EW_GELU_F,
    EW_GELU_B,
    EW_BIAS_ADD,
    EW_BIAS_BACKWARD,
    EW_SGD,
    EW_ADAM
};

static void ew_part(void *arg, int part, int parts) {
    const ew_job *j = arg;
    int64_t b, e;
    if (j->kind == EW_BIAS_ADD) { /* whole rows */
        fsdp_cpu_split(j->n, 1, part, parts, &b, &e);
        if (b < e) fsdp_cpu_bias_add(j->out + b * j->cols, j->a, e - b, j->cols);
        return;
    }
    if (j->kind == EW_BIAS_BACKWARD) { /* blocks of columns: each column summed as alone */
        fsdp_cpu_split(j->cols, LINE, part, parts, &b, &e);
        if (b < e) fsdp_cpu_column_sum_ld(j->out + b, j->a + b, NULL, NULL, j->n, e - b, j->cols);
        return;
    }
    fsdp_cpu_split(j->n, LINE, part, parts, &b, &e);
    int64_t n = e - b;
    if (n <= 0) return;
    float *o = j->out ? j->out + b : NULL;
    const float *a = j->a ? j->a + b : NULL, *bb = j->b ? j->b + b : NULL;
    const float *c = j->c ? j->c + b : NULL;
    switch (j->kind) {
    case EW_ADD:
        fsdp_cpu_add(o, a, bb, n);
        break;
    case EW_ADD3:
        fsdp_cpu_add3(o, a, bb, c, n);
        break;
    case EW_ADD3_ROUND_BF16:
        fsdp_cpu_add3_round_bf16(o, a, bb, c, n);
        break;
    case EW_ADD_BF16:
        fsdp_cpu_add_bf16(o, a, j->b16 + b, n);
        break;
    case EW_AXPY:
        fsdp_cpu_axpy(o, j->s, a, n);
        break;
    case EW_SCALE:
        fsdp_cpu_scale(o, a, j->s, n);
        break;
    case EW_COPY:
        fsdp_cpu_copy(o, a, n);
        break;
    case EW_FILL:
        fsdp_cpu_fill(o, j->s, n);
        break;
    case EW_RELU_F:
        fsdp_cpu_relu_forward(o, a, n);
        break;
    case EW_RELU_B:
        fsdp_cpu_relu_backward(o, a, bb, n);
        break;
    case EW_SIGMOID_F:
        fsdp_cpu_sigmoid_forward(o, a, n);
        break;
    case EW_SIGMOID_B:
        fsdp_cpu_sigmoid_backward(o, a, bb, n);
        break;
    case EW_GELU_F:
        fsdp_cpu_gelu_forward(o, a, n);
        break;
    case EW_GELU_B:
        fsdp_cpu_gelu_backward(o, a, bb, n);
        break;
    case EW_SGD:
        fsdp_cpu_sgd_update(o, a, j->m ? j->m + b : NULL, n, (const fsdp_sgd_step_args *)j->args);
        break;
    case EW_ADAM:
        if (j->lp)
            fsdp_cpu_adam_update_bf16(o, j->lp + b, a, j->m + b, j->v + b,
                                      j->vmax ? j->vmax + b : NULL, n,
                                      (const fsdp_adam_step_args *)j->args);
        else
            fsdp_cpu_adam_update(o, a, j->m + b, j->v + b, j->vmax ? j->vmax + b : NULL, n,
                                 (const fsdp_adam_step_args *)j->args);
        break;
    }
}

static void ew_run(ew_job j) {
    fsdp_cpu_workers_run(ew_part, &j);
}

void fsdp_cpu_par_add(float *out, const float *a, const float *b, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_add(out, a, b, n);
        return;
    }
    ew_run((ew_job){.kind = EW_ADD, .n = n, .out = out, .a = a, .b = b});
}
void fsdp_cpu_par_add3(float *out, const float *a, const float *b, const float *c, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_add3(out, a, b, c, n);
        return;
    }
    ew_run((ew_job){.kind = EW_ADD3, .n = n, .out = out, .a = a, .b = b, .c = c});
}
void fsdp_cpu_par_add3_round_bf16(float *out, const float *a, const float *b, const float *c,
                                  int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_add3_round_bf16(out, a, b, c, n);
        return;
    }
    ew_run((ew_job){.kind = EW_ADD3_ROUND_BF16, .n = n, .out = out, .a = a, .b = b, .c = c});
}
void fsdp_cpu_par_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_add_bf16(out, a, b, n);
        return;
    }
    ew_run((ew_job){.kind = EW_ADD_BF16, .n = n, .out = out, .a = a, .b16 = b});
}
void fsdp_cpu_par_axpy(float *y, float alpha, const float *x, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_axpy(y, alpha, x, n);
        return;
    }
    ew_run((ew_job){.kind = EW_AXPY, .n = n, .out = y, .a = x, .s = alpha});
}
void fsdp_cpu_par_scale(float *out, const float *inp, float alpha, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_scale(out, inp, alpha, n);
        return;
    }
    ew_run((ew_job){.kind = EW_SCALE, .n = n, .out = out, .a = inp, .s = alpha});
}
void fsdp_cpu_par_copy(float *dst, const float *src, int64_t n) {
    if (!worth(n) || dst == src) {
        fsdp_cpu_copy(dst, src, n);
        return;
    }
    ew_run((ew_job){.kind = EW_COPY, .n = n, .out = dst, .a = src});
}
void fsdp_cpu_par_fill(float *out, float value, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_fill(out, value, n);
        return;
    }
    ew_run((ew_job){.kind = EW_FILL, .n = n, .out = out, .s = value});
}
void fsdp_cpu_par_relu_forward(float *out, const float *inp, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_relu_forward(out, inp, n);
        return;
    }
    ew_run((ew_job){.kind = EW_RELU_F, .n = n, .out = out, .a = inp});
}
void fsdp_cpu_par_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_relu_backward(dinp, inp, dout, n);
        return;
    }
    ew_run((ew_job){.kind = EW_RELU_B, .n = n, .out = dinp, .a = inp, .b = dout});
}
void fsdp_cpu_par_sigmoid_forward(float *out, const float *inp, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_sigmoid_forward(out, inp, n);
        return;
    }
    ew_run((ew_job){.kind = EW_SIGMOID_F, .n = n, .out = out, .a = inp});
}
void fsdp_cpu_par_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_sigmoid_backward(dinp, out, dout, n);
        return;
    }
    ew_run((ew_job){.kind = EW_SIGMOID_B, .n = n, .out = dinp, .a = out, .b = dout});
}
void fsdp_cpu_par_gelu_forward(float *out, const float *inp, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_gelu_forward(out, inp, n);
        return;
    }
    ew_run((ew_job){.kind = EW_GELU_F, .n = n, .out = out, .a = inp});
}
void fsdp_cpu_par_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    if (!worth(n)) {
        fsdp_cpu_gelu_backward(dinp, inp, dout, n);
        return;
    }
    ew_run((ew_job){.kind = EW_GELU_B, .n = n, .out = dinp, .a = inp, .b = dout});
}
void fsdp_cpu_par_bias_add(float *out, const float *bias, int64_t rows, int64_t cols) {
    if (!worth(rows * cols) || rows < 2) {
        fsdp_cpu_bias_add(out, bias, rows, cols);
        return;
    }
    ew_run((ew_job){.kind = EW_BIAS_ADD, .n = rows, .cols = cols, .out = out, .a = bias});
}
void fsdp_cpu_par_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols) {
    if (!worth(rows * cols) || cols < 2 * LINE) {
        fsdp_cpu_bias_backward(dbias, dout, rows, cols);
        return;
    }
    ew_run((ew_job){.kind = EW_BIAS_BACKWARD, .n = rows, .cols = cols, .out = dbias, .a = dout});
}
void fsdp_cpu_par_sgd_update(float *p, const float *g, float *buf, int64_t n,
                             const fsdp_sgd_step_args *args) {
    if (!worth(n)) {
        fsdp_cpu_sgd_update(p, g, buf, n, args);
        return;
    }
    ew_run((ew_job){.kind = EW_SGD, .n = n, .out = p, .a = g, .m = buf, .args = args});
}
void fsdp_cpu_par_adam_update(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                              const fsdp_adam_step_args *args) {
    if (!worth(n)) {
        fsdp_cpu_adam_update(p, g, m, v, vmax, n, args);
        return;
    }
    ew_run((ew_job){
        .kind = EW_ADAM, .n = n, .out = p, .a = g, .m = m, .v = v, .vmax = vmax, .args = args});
}
void fsdp_cpu_par_adam_update_bf16(float *p, fsdp_bf16 *p_bf16, const float *g, float *m, float *v,
                                   float *vmax, int64_t n, const fsdp_adam_step_args *args) {
    if (!worth(n)) {
        fsdp_cpu_adam_update_bf16(p, p_bf16, g, m, v, vmax, n, args);
        return;
    }
    ew_run((ew_job){.kind = EW_ADAM,
                    .n = n,
                    .out = p,
                    .a = g,
                    .m = m,
                    .v = v,
                    .vmax = vmax,
                    .lp = p_bf16,
                    .args = args});
}
