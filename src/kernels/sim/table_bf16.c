/* table_bf16.c: the simulated GPU's entries with bf16 operands (table.c lists them): gemm_bf16,
 * gemm_bf16_round, the SwiGLU on bf16 gate and up (its backward also into bf16 gradients), RoPE
 * on bf16 q and k (and its backward into bf16 gradients, and bf16 to bf16 both ways), the
 * attention on bf16 tensors and RMSNorm with a bf16 output, each the CPU entry run on the device's
 * stream over the shadow memory, as every other entry. */
#include "kernels/sim/sim_impl.h"

typedef struct gemm_bf16_args {
    bool trans_a, trans_b;
    int64_t M, N, K;
    float alpha;
    const fsdp_bf16 *A;
    int64_t lda;
    const fsdp_bf16 *B;
    int64_t ldb;
    float beta;
    float *C;
    int64_t ldc;
} gemm_bf16_args;

static void run_gemm_bf16(void *arg) {
    gemm_bf16_args *a = arg;
    fsdp_kernels_cpu()->gemm_bf16(a->trans_a, a->trans_b, a->M, a->N, a->K, a->alpha, a->A, a->lda,
                                  a->B, a->ldb, a->beta, a->C, a->ldc);
}

void sim_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb, float beta,
                   float *C, int64_t ldc) {
    int dev = sim_kernel_device(C, "gemm_bf16");
    gemm_bf16_args call = {trans_a,
                           trans_b,
                           M,
                           N,
                           K,
                           alpha,
                           sim_kernel_ptr(dev, A),
                           lda,
                           sim_kernel_ptr(dev, B),
                           ldb,
                           beta,
                           sim_kernel_ptr(dev, C),
                           ldc};
    sim_kernel_launch(dev, run_gemm_bf16, &call, sizeof call);
}

typedef struct gemm_bf16_round_args {
    bool trans_a, trans_b;
    int64_t M, N, K;
    const fsdp_bf16 *A;
    int64_t lda;
    const fsdp_bf16 *B;
    int64_t ldb;
    fsdp_bf16 *C;
    int64_t ldc;
} gemm_bf16_round_args;

static void run_gemm_bf16_round(void *arg) {
    gemm_bf16_round_args *a = arg;
    fsdp_kernels_cpu()->gemm_bf16_round(a->trans_a, a->trans_b, a->M, a->N, a->K, a->A, a->lda,
                                        a->B, a->ldb, a->C, a->ldc);
}

void sim_gemm_bf16_round(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                         fsdp_bf16 *C, int64_t ldc) {
    int dev = sim_kernel_device(C, "gemm_bf16_round");
    gemm_bf16_round_args call = {trans_a, trans_b,
                                 M,       N,
                                 K,       sim_kernel_ptr(dev, A),
                                 lda,     sim_kernel_ptr(dev, B),
                                 ldb,     sim_kernel_ptr(dev, C),
                                 ldc};
    sim_kernel_launch(dev, run_gemm_bf16_round, &call, sizeof call);
}

typedef struct swiglu_bf16_args {
    fsdp_bf16 *out;    /* forward */
    float *dgate;      /* backward */
    float *dup;        /* backward */
    const float *dout; /* backward */
    const fsdp_bf16 *gate;
    const fsdp_bf16 *up;
    int64_t n;
} swiglu_bf16_args;

static void run_swiglu_forward_bf16(void *arg) {
    swiglu_bf16_args *a = arg;
    fsdp_kernels_cpu()->swiglu_forward_bf16(a->out, a->gate, a->up, a->n);
}

void sim_swiglu_forward_bf16(fsdp_bf16 *out, const fsdp_bf16 *gate, const fsdp_bf16 *up,
                             int64_t n) {
    int dev = sim_kernel_device(out, "swiglu_forward_bf16");
    swiglu_bf16_args call = {.out = sim_kernel_ptr(dev, out),
                             .gate = sim_kernel_ptr(dev, gate),
                             .up = sim_kernel_ptr(dev, up),
                             .n = n};
    sim_kernel_launch(dev, run_swiglu_forward_bf16, &call, sizeof call);
}

static void run_swiglu_backward_bf16(void *arg) {
    swiglu_bf16_args *a = arg;
    fsdp_kernels_cpu()->swiglu_backward_bf16(a->dgate, a->dup, a->dout, a->gate, a->up, a->n);
}

void sim_swiglu_backward_bf16(float *dgate, float *dup, const float *dout, const fsdp_bf16 *gate,
                              const fsdp_bf16 *up, int64_t n) {
    int dev = sim_kernel_device(dgate, "swiglu_backward_bf16");
    swiglu_bf16_args call = {.dgate = sim_kernel_ptr(dev, dgate),
                             .dup = sim_kernel_ptr(dev, dup),
                             .dout = sim_kernel_ptr(dev, dout),
                             .gate = sim_kernel_ptr(dev, gate),
                             .up = sim_kernel_ptr(dev, up),
                             .n = n};
    sim_kernel_launch(dev, run_swiglu_backward_bf16, &call, sizeof call);
}

typedef struct rope_qk_forward_bf16_args {
    float *qo, *ko;
    const fsdp_bf16 *q, *k;
    const float *cos, *sin;
    int64_t B, T, NH, NKV, D;
} rope_qk_forward_bf16_args;

static void run_rope_qk_forward_bf16(void *arg) {
    rope_qk_forward_bf16_args *a = arg;
    fsdp_kernels_cpu()->rope_qk_forward_bf16(a->qo, a->ko, a->q, a->k, a->cos, a->sin, a->B, a->T,
                                             a->NH, a->NKV, a->D);
}

void sim_rope_qk_forward_bf16(float *qo, float *ko, const fsdp_bf16 *q, const fsdp_bf16 *k,
                              const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                              int64_t NKV, int64_t D) {
    int dev = sim_kernel_device(qo, "rope_qk_forward_bf16");
    rope_qk_forward_bf16_args call = {sim_kernel_ptr(dev, qo),
                                      sim_kernel_ptr(dev, ko),
                                      sim_kernel_ptr(dev, q),
                                      sim_kernel_ptr(dev, k),
                                      sim_kernel_ptr(dev, cos),
                                      sim_kernel_ptr(dev, sin),
                                      B,
                                      T,
                                      NH,
                                      NKV,
                                      D};
    sim_kernel_launch(dev, run_rope_qk_forward_bf16, &call, sizeof call);
}

typedef struct rmsnorm_forward_bf16_args {
    fsdp_bf16 *out;
    float *rstd;
    const float *inp, *weight;
    float eps;
    int64_t rows, cols;
} rmsnorm_forward_bf16_args;

static void run_rmsnorm_forward_bf16(void *arg) {
    rmsnorm_forward_bf16_args *a = arg;
    fsdp_kernels_cpu()->rmsnorm_forward_bf16(a->out, a->rstd, a->inp, a->weight, a->eps, a->rows,
                                             a->cols);
}

void sim_rmsnorm_forward_bf16(fsdp_bf16 *out, float *rstd, const float *inp, const float *weight,
                              float eps, int64_t rows, int64_t cols) {
    int dev = sim_kernel_device(out, "rmsnorm_forward_bf16");
    rmsnorm_forward_bf16_args call = {.out = sim_kernel_ptr(dev, out),
                                      .rstd = sim_kernel_ptr(dev, rstd),
                                      .inp = sim_kernel_ptr(dev, inp),
                                      .weight = sim_kernel_ptr(dev, weight),
                                      .eps = eps,
                                      .rows = rows,
                                      .cols = cols};
    sim_kernel_launch(dev, run_rmsnorm_forward_bf16, &call, sizeof call);
}

typedef struct swiglu_backward_round_args {
    fsdp_bf16 *dgate, *dup;
    const float *dout;
    const fsdp_bf16 *gate, *up;
    int64_t n;
} swiglu_backward_round_args;

static void run_swiglu_backward_bf16_round(void *arg) {
    swiglu_backward_round_args *a = arg;
    fsdp_kernels_cpu()->swiglu_backward_bf16_round(a->dgate, a->dup, a->dout, a->gate, a->up, a->n);
}

void sim_swiglu_backward_bf16_round(fsdp_bf16 *dgate, fsdp_bf16 *dup, const float *dout,
                                    const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n) {
    int dev = sim_kernel_device(dgate, "swiglu_backward_bf16_round");
    swiglu_backward_round_args call = {.dgate = sim_kernel_ptr(dev, dgate),
                                       .dup = sim_kernel_ptr(dev, dup),
                                       .dout = sim_kernel_ptr(dev, dout),
                                       .gate = sim_kernel_ptr(dev, gate),
                                       .up = sim_kernel_ptr(dev, up),
                                       .n = n};
    sim_kernel_launch(dev, run_swiglu_backward_bf16_round, &call, sizeof call);
}

typedef struct rope_qk_backward_round_args {
    fsdp_bf16 *dq, *dk;
    const float *dqo, *dko, *cos, *sin;
    int64_t B, T, NH, NKV, D;
} rope_qk_backward_round_args;

static void run_rope_qk_backward_round(void *arg) {
    rope_qk_backward_round_args *a = arg;
    fsdp_kernels_cpu()->rope_qk_backward_round(a->dq, a->dk, a->dqo, a->dko, a->cos, a->sin, a->B,
                                               a->T, a->NH, a->NKV, a->D);
}

void sim_rope_qk_backward_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const float *dqo, const float *dko,
                                const float *cos, const float *sin, int64_t B, int64_t T,
                                int64_t NH, int64_t NKV, int64_t D) {
    int dev = sim_kernel_device(dq, "rope_qk_backward_round");
    rope_qk_backward_round_args call = {.dq = sim_kernel_ptr(dev, dq),
                                        .dk = sim_kernel_ptr(dev, dk),
                                        .dqo = sim_kernel_ptr(dev, dqo),
                                        .dko = sim_kernel_ptr(dev, dko),
                                        .cos = sim_kernel_ptr(dev, cos),
                                        .sin = sim_kernel_ptr(dev, sin),
                                        .B = B,
                                        .T = T,
                                        .NH = NH,
                                        .NKV = NKV,
                                        .D = D};
    sim_kernel_launch(dev, run_rope_qk_backward_round, &call, sizeof call);
}

typedef struct rope_b16_args {
    fsdp_bf16 *qo, *ko;
    const fsdp_bf16 *q, *k;
    const float *cos, *sin;
    int64_t B, T, NH, NKV, D;
    bool backward;
} rope_b16_args;

static void run_rope_b16(void *arg) {
    rope_b16_args *a = arg;
    const fsdp_kernels_i *cpu = fsdp_kernels_cpu();
    (a->backward ? cpu->rope_qk_backward_bf16_round : cpu->rope_qk_forward_bf16_round)(
        a->qo, a->ko, a->q, a->k, a->cos, a->sin, a->B, a->T, a->NH, a->NKV, a->D);
}

static void rope_b16(const char *name, bool backward, fsdp_bf16 *qo, fsdp_bf16 *ko,
                     const fsdp_bf16 *q, const fsdp_bf16 *k, const float *cos, const float *sin,
                     int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    int dev = sim_kernel_device(qo, name);
    rope_b16_args call = {.qo = sim_kernel_ptr(dev, qo),
                          .ko = sim_kernel_ptr(dev, ko),
                          .q = sim_kernel_ptr(dev, q),
                          .k = sim_kernel_ptr(dev, k),
                          .cos = sim_kernel_ptr(dev, cos),
                          .sin = sim_kernel_ptr(dev, sin),
                          .B = B,
                          .T = T,
                          .NH = NH,
                          .NKV = NKV,
                          .D = D,
                          .backward = backward};
    sim_kernel_launch(dev, run_rope_b16, &call, sizeof call);
}

void sim_rope_qk_forward_bf16_round(fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q,
                                    const fsdp_bf16 *k, const float *cos, const float *sin,
                                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    rope_b16("rope_qk_forward_bf16_round", false, qo, ko, q, k, cos, sin, B, T, NH, NKV, D);
}

void sim_rope_qk_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const fsdp_bf16 *dqo,
                                     const fsdp_bf16 *dko, const float *cos, const float *sin,
                                     int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    rope_b16("rope_qk_backward_bf16_round", true, dq, dk, dqo, dko, cos, sin, B, T, NH, NKV, D);
}

typedef struct attention_b16_args {
    fsdp_bf16 *out, *dq, *dk, *dv; /* the forward's out; the backward's gradients */
    float *lse, *scratch;
    const fsdp_bf16 *dout, *q, *k, *v, *o;
    int64_t B, T, NH, NKV, D;
} attention_b16_args;

static void run_attention_forward_b16(void *arg) {
    attention_b16_args *a = arg;
    fsdp_kernels_cpu()->attention_forward_bf16_round(a->out, a->lse, a->scratch, a->q, a->k, a->v,
                                                     a->B, a->T, a->NH, a->NKV, a->D);
}

void sim_attention_forward_bf16_round(fsdp_bf16 *out, float *lse, float *scratch,
                                      const fsdp_bf16 *q, const fsdp_bf16 *k, const fsdp_bf16 *v,
                                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    int dev = sim_kernel_device(out, "attention_forward_bf16_round");
    attention_b16_args call = {.out = sim_kernel_ptr(dev, out),
                               .lse = sim_kernel_ptr(dev, lse),
                               .scratch = sim_kernel_ptr(dev, scratch),
                               .q = sim_kernel_ptr(dev, q),
                               .k = sim_kernel_ptr(dev, k),
                               .v = sim_kernel_ptr(dev, v),
                               .B = B,
                               .T = T,
                               .NH = NH,
                               .NKV = NKV,
                               .D = D};
    sim_kernel_launch(dev, run_attention_forward_b16, &call, sizeof call);
}

static void run_attention_backward_b16(void *arg) {
    attention_b16_args *a = arg;
    fsdp_kernels_cpu()->attention_backward_bf16_round(a->dq, a->dk, a->dv, a->scratch, a->dout,
                                                      a->q, a->k, a->v, a->o, a->lse, a->B, a->T,
                                                      a->NH, a->NKV, a->D);
}

void sim_attention_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv, float *scratch,
                                       const fsdp_bf16 *dout, const fsdp_bf16 *q,
                                       const fsdp_bf16 *k, const fsdp_bf16 *v, const fsdp_bf16 *out,
                                       const float *lse, int64_t B, int64_t T, int64_t NH,
                                       int64_t NKV, int64_t D) {
    int dev = sim_kernel_device(dq, "attention_backward_bf16_round");
    attention_b16_args call = {.dq = sim_kernel_ptr(dev, dq),
                               .dk = sim_kernel_ptr(dev, dk),
                               .dv = sim_kernel_ptr(dev, dv),
                               .scratch = sim_kernel_ptr(dev, scratch),
                               .dout = sim_kernel_ptr(dev, dout),
                               .q = sim_kernel_ptr(dev, q),
                               .k = sim_kernel_ptr(dev, k),
                               .v = sim_kernel_ptr(dev, v),
                               .o = sim_kernel_ptr(dev, out),
                               .lse = sim_kernel_ptr(dev, lse),
                               .B = B,
                               .T = T,
                               .NH = NH,
                               .NKV = NKV,
                               .D = D};
    sim_kernel_launch(dev, run_attention_backward_b16, &call, sizeof call);
}

typedef struct swiglu_backward_io_args {
    fsdp_bf16 *dgate, *dup;
    const fsdp_bf16 *dout, *gate, *up;
    int64_t n;
} swiglu_backward_io_args;

static void run_swiglu_backward_bf16io(void *arg) {
    swiglu_backward_io_args *a = arg;
    fsdp_kernels_cpu()->swiglu_backward_bf16io(a->dgate, a->dup, a->dout, a->gate, a->up, a->n);
}

void sim_swiglu_backward_bf16io(fsdp_bf16 *dgate, fsdp_bf16 *dup, const fsdp_bf16 *dout,
                                const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n) {
    int dev = sim_kernel_device(dgate, "swiglu_backward_bf16io");
    swiglu_backward_io_args call = {.dgate = sim_kernel_ptr(dev, dgate),
                                    .dup = sim_kernel_ptr(dev, dup),
                                    .dout = sim_kernel_ptr(dev, dout),
                                    .gate = sim_kernel_ptr(dev, gate),
                                    .up = sim_kernel_ptr(dev, up),
                                    .n = n};
    sim_kernel_launch(dev, run_swiglu_backward_bf16io, &call, sizeof call);
}
