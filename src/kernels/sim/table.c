/* table.c: the sim operator table, fsdp_kernels_sim(): one wrapper per entry that checks its
 * arrays' device, copies its arguments (scalars and argument structs by value, arrays as shadow
 * addresses) into a closure and queues the CPU table's entry on the calling thread's current
 * stream; the entries that hand a value to the host (sums, losses) wait for it, as CUDA's do. On
 * a stream's thread the CPU kernels run single-threaded. The Llama entries are in
 * table_llama.c, the fused GEMMs in table_epilogue.c. */
#include "kernels/sim/sim_impl.h"

typedef struct gemm_args {
    bool trans_a;
    bool trans_b;
    int64_t M;
    int64_t N;
    int64_t K;
    float alpha;
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb;
    float beta;
    float *C;
    int64_t ldc;
} gemm_args;

static void run_gemm(void *arg) {
    gemm_args *a = arg;
    fsdp_kernels_cpu()->gemm(a->trans_a, a->trans_b, a->M, a->N, a->K, a->alpha, a->A, a->lda, a->B,
                             a->ldb, a->beta, a->C, a->ldc);
}

static void sim_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                     int64_t ldc) {
    int dev = sim_kernel_device(A, "gemm");
    gemm_args call = {trans_a,
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
    sim_kernel_launch(dev, run_gemm, &call, sizeof call);
}

typedef struct bias_add_args {
    float *out;
    const float *bias;
    int64_t rows;
    int64_t cols;
} bias_add_args;

static void run_bias_add(void *arg) {
    bias_add_args *a = arg;
    fsdp_kernels_cpu()->bias_add(a->out, a->bias, a->rows, a->cols);
}

static void sim_bias_add(float *out, const float *bias, int64_t rows, int64_t cols) {
    int dev = sim_kernel_device(out, "bias_add");
    bias_add_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, bias), rows, cols};
    sim_kernel_launch(dev, run_bias_add, &call, sizeof call);
}

typedef struct bias_backward_args {
    float *dbias;
    const float *dout;
    int64_t rows;
    int64_t cols;
} bias_backward_args;

static void run_bias_backward(void *arg) {
    bias_backward_args *a = arg;
    fsdp_kernels_cpu()->bias_backward(a->dbias, a->dout, a->rows, a->cols);
}

static void sim_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols) {
    int dev = sim_kernel_device(dbias, "bias_backward");
    bias_backward_args call = {sim_kernel_ptr(dev, dbias), sim_kernel_ptr(dev, dout), rows, cols};
    sim_kernel_launch(dev, run_bias_backward, &call, sizeof call);
}

typedef struct relu_forward_args {
    float *out;
    const float *inp;
    int64_t n;
} relu_forward_args;

static void run_relu_forward(void *arg) {
    relu_forward_args *a = arg;
    fsdp_kernels_cpu()->relu_forward(a->out, a->inp, a->n);
}

static void sim_relu_forward(float *out, const float *inp, int64_t n) {
    int dev = sim_kernel_device(out, "relu_forward");
    relu_forward_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, inp), n};
    sim_kernel_launch(dev, run_relu_forward, &call, sizeof call);
}

typedef struct relu_backward_args {
    float *dinp;
    const float *inp;
    const float *dout;
    int64_t n;
} relu_backward_args;

static void run_relu_backward(void *arg) {
    relu_backward_args *a = arg;
    fsdp_kernels_cpu()->relu_backward(a->dinp, a->inp, a->dout, a->n);
}

static void sim_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    int dev = sim_kernel_device(dinp, "relu_backward");
    relu_backward_args call = {sim_kernel_ptr(dev, dinp), sim_kernel_ptr(dev, inp),
                               sim_kernel_ptr(dev, dout), n};
    sim_kernel_launch(dev, run_relu_backward, &call, sizeof call);
}

typedef struct sigmoid_forward_args {
    float *out;
    const float *inp;
    int64_t n;
} sigmoid_forward_args;

static void run_sigmoid_forward(void *arg) {
    sigmoid_forward_args *a = arg;
    fsdp_kernels_cpu()->sigmoid_forward(a->out, a->inp, a->n);
}

static void sim_sigmoid_forward(float *out, const float *inp, int64_t n) {
    int dev = sim_kernel_device(out, "sigmoid_forward");
    sigmoid_forward_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, inp), n};
    sim_kernel_launch(dev, run_sigmoid_forward, &call, sizeof call);
}

typedef struct sigmoid_backward_args {
    float *dinp;
    const float *out;
    const float *dout;
    int64_t n;
} sigmoid_backward_args;

static void run_sigmoid_backward(void *arg) {
    sigmoid_backward_args *a = arg;
    fsdp_kernels_cpu()->sigmoid_backward(a->dinp, a->out, a->dout, a->n);
}

static void sim_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t n) {
    int dev = sim_kernel_device(dinp, "sigmoid_backward");
    sigmoid_backward_args call = {sim_kernel_ptr(dev, dinp), sim_kernel_ptr(dev, out),
                                  sim_kernel_ptr(dev, dout), n};
    sim_kernel_launch(dev, run_sigmoid_backward, &call, sizeof call);
}

typedef struct gelu_forward_args {
    float *out;
    const float *inp;
    int64_t n;
} gelu_forward_args;

static void run_gelu_forward(void *arg) {
    gelu_forward_args *a = arg;
    fsdp_kernels_cpu()->gelu_forward(a->out, a->inp, a->n);
}

static void sim_gelu_forward(float *out, const float *inp, int64_t n) {
    int dev = sim_kernel_device(out, "gelu_forward");
    gelu_forward_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, inp), n};
    sim_kernel_launch(dev, run_gelu_forward, &call, sizeof call);
}

typedef struct gelu_backward_args {
    float *dinp;
    const float *inp;
    const float *dout;
    int64_t n;
} gelu_backward_args;

static void run_gelu_backward(void *arg) {
    gelu_backward_args *a = arg;
    fsdp_kernels_cpu()->gelu_backward(a->dinp, a->inp, a->dout, a->n);
}

static void sim_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    int dev = sim_kernel_device(dinp, "gelu_backward");
    gelu_backward_args call = {sim_kernel_ptr(dev, dinp), sim_kernel_ptr(dev, inp),
                               sim_kernel_ptr(dev, dout), n};
    sim_kernel_launch(dev, run_gelu_backward, &call, sizeof call);
}

typedef struct rmsnorm_forward_args {
    float *out;
    float *rstd;
    const float *inp;
    const float *weight;
    float eps;
    int64_t rows;
    int64_t cols;
} rmsnorm_forward_args;

static void run_rmsnorm_forward(void *arg) {
    rmsnorm_forward_args *a = arg;
    fsdp_kernels_cpu()->rmsnorm_forward(a->out, a->rstd, a->inp, a->weight, a->eps, a->rows,
                                        a->cols);
}

static void sim_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                float eps, int64_t rows, int64_t cols) {
    int dev = sim_kernel_device(out, "rmsnorm_forward");
    rmsnorm_forward_args call = {sim_kernel_ptr(dev, out),
                                 sim_kernel_ptr(dev, rstd),
                                 sim_kernel_ptr(dev, inp),
                                 sim_kernel_ptr(dev, weight),
                                 eps,
                                 rows,
                                 cols};
    sim_kernel_launch(dev, run_rmsnorm_forward, &call, sizeof call);
}

typedef struct rmsnorm_backward_args {
    float *dinp;
    float *dweight;
    const float *dout;
    const float *inp;
    const float *weight;
    const float *rstd;
    int64_t rows;
    int64_t cols;
} rmsnorm_backward_args;

static void run_rmsnorm_backward(void *arg) {
    rmsnorm_backward_args *a = arg;
    fsdp_kernels_cpu()->rmsnorm_backward(a->dinp, a->dweight, a->dout, a->inp, a->weight, a->rstd,
                                         a->rows, a->cols);
}

static void sim_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int64_t rows,
                                 int64_t cols) {
    int dev = sim_kernel_device(dinp, "rmsnorm_backward");
    rmsnorm_backward_args call = {sim_kernel_ptr(dev, dinp),
                                  sim_kernel_ptr(dev, dweight),
                                  sim_kernel_ptr(dev, dout),
                                  sim_kernel_ptr(dev, inp),
                                  sim_kernel_ptr(dev, weight),
                                  sim_kernel_ptr(dev, rstd),
                                  rows,
                                  cols};
    sim_kernel_launch(dev, run_rmsnorm_backward, &call, sizeof call);
}

typedef struct add_args {
    float *out;
    const float *a;
    const float *b;
    int64_t n;
} add_args;

static void run_add(void *arg) {
    add_args *a = arg;
    fsdp_kernels_cpu()->add(a->out, a->a, a->b, a->n);
}

static void sim_add(float *out, const float *a, const float *b, int64_t n) {
    int dev = sim_kernel_device(out, "add");
    add_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, a), sim_kernel_ptr(dev, b), n};
    sim_kernel_launch(dev, run_add, &call, sizeof call);
}

typedef struct axpy_args {
    float *y;
    float alpha;
    const float *x;
    int64_t n;
} axpy_args;

static void run_axpy(void *arg) {
    axpy_args *a = arg;
    fsdp_kernels_cpu()->axpy(a->y, a->alpha, a->x, a->n);
}

static void sim_axpy(float *y, float alpha, const float *x, int64_t n) {
    int dev = sim_kernel_device(y, "axpy");
    axpy_args call = {sim_kernel_ptr(dev, y), alpha, sim_kernel_ptr(dev, x), n};
    sim_kernel_launch(dev, run_axpy, &call, sizeof call);
}

typedef struct scale_args {
    float *out;
    const float *inp;
    float alpha;
    int64_t n;
} scale_args;

static void run_scale(void *arg) {
    scale_args *a = arg;
    fsdp_kernels_cpu()->scale(a->out, a->inp, a->alpha, a->n);
}

static void sim_scale(float *out, const float *inp, float alpha, int64_t n) {
    int dev = sim_kernel_device(out, "scale");
    scale_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, inp), alpha, n};
    sim_kernel_launch(dev, run_scale, &call, sizeof call);
}

typedef struct copy_args {
    float *dst;
    const float *src;
    int64_t n;
} copy_args;

static void run_copy(void *arg) {
    copy_args *a = arg;
    fsdp_kernels_cpu()->copy(a->dst, a->src, a->n);
}

static void sim_copy(float *dst, const float *src, int64_t n) {
    int dev = sim_kernel_device(dst, "copy");
    copy_args call = {sim_kernel_ptr(dev, dst), sim_kernel_ptr(dev, src), n};
    sim_kernel_launch(dev, run_copy, &call, sizeof call);
}

typedef struct fill_args {
    float *out;
    float value;
    int64_t n;
} fill_args;

static void run_fill(void *arg) {
    fill_args *a = arg;
    fsdp_kernels_cpu()->fill(a->out, a->value, a->n);
}

static void sim_fill(float *out, float value, int64_t n) {
    int dev = sim_kernel_device(out, "fill");
    fill_args call = {sim_kernel_ptr(dev, out), value, n};
    sim_kernel_launch(dev, run_fill, &call, sizeof call);
}

typedef struct sum_args {
    const float *x;
    int64_t n;
    double *result;
} sum_args;

static void run_sum(void *arg) {
    sum_args *a = arg;
    *a->result = fsdp_kernels_cpu()->sum(a->x, a->n);
}

static double sim_sum(const float *x, int64_t n) {
    int dev = sim_kernel_device(x, "sum");
    double result = 0.0;
    sum_args call = {sim_kernel_ptr(dev, x), n, &result};
    sim_kernel_call(dev, run_sum, &call, sizeof call);
    return result;
}

typedef struct sum_squares_args {
    const float *x;
    int64_t n;
    double *result;
} sum_squares_args;

static void run_sum_squares(void *arg) {
    sum_squares_args *a = arg;
    *a->result = fsdp_kernels_cpu()->sum_squares(a->x, a->n);
}

static double sim_sum_squares(const float *x, int64_t n) {
    int dev = sim_kernel_device(x, "sum_squares");
    double result = 0.0;
    sum_squares_args call = {sim_kernel_ptr(dev, x), n, &result};
    sim_kernel_call(dev, run_sum_squares, &call, sizeof call);
    return result;
}

typedef struct max_abs_args {
    const float *x;
    int64_t n;
    double *result;
} max_abs_args;

static void run_max_abs(void *arg) {
    max_abs_args *a = arg;
    *a->result = fsdp_kernels_cpu()->max_abs(a->x, a->n);
}

static double sim_max_abs(const float *x, int64_t n) {
    int dev = sim_kernel_device(x, "max_abs");
    double result = 0.0;
    max_abs_args call = {sim_kernel_ptr(dev, x), n, &result};
    sim_kernel_call(dev, run_max_abs, &call, sizeof call);
    return result;
}

typedef struct mse_loss_args {
    float *loss;
    float *dout;
    const float *out;
    const float *target;
    int64_t n;
} mse_loss_args;

static void run_mse_loss(void *arg) {
    mse_loss_args *a = arg;
    fsdp_kernels_cpu()->mse_loss(a->loss, a->dout, a->out, a->target, a->n);
}

static void sim_mse_loss(float *loss, float *dout, const float *out, const float *target,
                         int64_t n) {
    int dev = sim_kernel_device(out, "mse_loss");
    mse_loss_args call = {loss, sim_kernel_ptr(dev, dout), sim_kernel_ptr(dev, out),
                          sim_kernel_ptr(dev, target), n};
    sim_kernel_call(dev, run_mse_loss, &call, sizeof call);
}

typedef struct cross_entropy_args {
    float *loss;
    float *dlogits;
    const float *logits;
    const int32_t *targets;
    int64_t rows;
    int64_t classes;
} cross_entropy_args;

static void run_cross_entropy(void *arg) {
    cross_entropy_args *a = arg;
    fsdp_kernels_cpu()->cross_entropy(a->loss, a->dlogits, a->logits, a->targets, a->rows,
                                      a->classes);
}

static void sim_cross_entropy(float *loss, float *dlogits, const float *logits,
                              const int32_t *targets, int64_t rows, int64_t classes) {
    int dev = sim_kernel_device(logits, "cross_entropy");
    cross_entropy_args call = {loss,
                               sim_kernel_ptr(dev, dlogits),
                               sim_kernel_ptr(dev, logits),
                               sim_kernel_ptr(dev, targets),
                               rows,
                               classes};
    sim_kernel_call(dev, run_cross_entropy, &call, sizeof call);
}

typedef struct f32_to_bf16_args {
    fsdp_bf16 *dst;
    const float *src;
    int64_t n;
} f32_to_bf16_args;

static void run_f32_to_bf16(void *arg) {
    f32_to_bf16_args *a = arg;
    fsdp_kernels_cpu()->f32_to_bf16(a->dst, a->src, a->n);
}

static void sim_f32_to_bf16(fsdp_bf16 *dst, const float *src, int64_t n) {
    int dev = sim_kernel_device(dst, "f32_to_bf16");
    f32_to_bf16_args call = {sim_kernel_ptr(dev, dst), sim_kernel_ptr(dev, src), n};
    sim_kernel_launch(dev, run_f32_to_bf16, &call, sizeof call);
}

typedef struct bf16_to_f32_args {
    float *dst;
    const fsdp_bf16 *src;
    int64_t n;
} bf16_to_f32_args;

static void run_bf16_to_f32(void *arg) {
    bf16_to_f32_args *a = arg;
    fsdp_kernels_cpu()->bf16_to_f32(a->dst, a->src, a->n);
}

static void sim_bf16_to_f32(float *dst, const fsdp_bf16 *src, int64_t n) {
    int dev = sim_kernel_device(dst, "bf16_to_f32");
    bf16_to_f32_args call = {sim_kernel_ptr(dev, dst), sim_kernel_ptr(dev, src), n};
    sim_kernel_launch(dev, run_bf16_to_f32, &call, sizeof call);
}

typedef struct round_bf16_args {
    float *x;
    int64_t n;
} round_bf16_args;

static void run_round_bf16(void *arg) {
    round_bf16_args *a = arg;
    fsdp_kernels_cpu()->round_bf16(a->x, a->n);
}

static void sim_round_bf16(float *x, int64_t n) {
    int dev = sim_kernel_device(x, "round_bf16");
    round_bf16_args call = {sim_kernel_ptr(dev, x), n};
    sim_kernel_launch(dev, run_round_bf16, &call, sizeof call);
}

typedef struct f32_to_f16_args {
    fsdp_f16 *dst;
    const float *src;
    int64_t n;
} f32_to_f16_args;

static void run_f32_to_f16(void *arg) {
    f32_to_f16_args *a = arg;
    fsdp_kernels_cpu()->f32_to_f16(a->dst, a->src, a->n);
}

static void sim_f32_to_f16(fsdp_f16 *dst, const float *src, int64_t n) {
    int dev = sim_kernel_device(dst, "f32_to_f16");
    f32_to_f16_args call = {sim_kernel_ptr(dev, dst), sim_kernel_ptr(dev, src), n};
    sim_kernel_launch(dev, run_f32_to_f16, &call, sizeof call);
}

typedef struct f16_to_f32_args {
    float *dst;
    const fsdp_f16 *src;
    int64_t n;
} f16_to_f32_args;

static void run_f16_to_f32(void *arg) {
    f16_to_f32_args *a = arg;
    fsdp_kernels_cpu()->f16_to_f32(a->dst, a->src, a->n);
}

static void sim_f16_to_f32(float *dst, const fsdp_f16 *src, int64_t n) {
    int dev = sim_kernel_device(dst, "f16_to_f32");
    f16_to_f32_args call = {sim_kernel_ptr(dev, dst), sim_kernel_ptr(dev, src), n};
    sim_kernel_launch(dev, run_f16_to_f32, &call, sizeof call);
}

typedef struct sgd_update_args {
    float *p;
    const float *g;
    float *buf;
    int64_t n;
    fsdp_sgd_step_args args;
} sgd_update_args;

static void run_sgd_update(void *arg) {
    sgd_update_args *a = arg;
    fsdp_kernels_cpu()->sgd_update(a->p, a->g, a->buf, a->n, &a->args);
}

static void sim_sgd_update(float *p, const float *g, float *buf, int64_t n,
                           const fsdp_sgd_step_args *args) {
    int dev = sim_kernel_device(p, "sgd_update");
    sgd_update_args call = {sim_kernel_ptr(dev, p), sim_kernel_ptr(dev, g),
                            sim_kernel_ptr(dev, buf), n, *args};
    sim_kernel_launch(dev, run_sgd_update, &call, sizeof call);
}

typedef struct adam_update_args {
    float *p;
    const float *g;
    float *m;
    float *v;
    float *vmax;
    int64_t n;
    fsdp_adam_step_args args;
} adam_update_args;

static void run_adam_update(void *arg) {
    adam_update_args *a = arg;
    fsdp_kernels_cpu()->adam_update(a->p, a->g, a->m, a->v, a->vmax, a->n, &a->args);
}

static void sim_adam_update(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                            const fsdp_adam_step_args *args) {
    int dev = sim_kernel_device(p, "adam_update");
    adam_update_args call = {sim_kernel_ptr(dev, p),
                             sim_kernel_ptr(dev, g),
                             sim_kernel_ptr(dev, m),
                             sim_kernel_ptr(dev, v),
                             sim_kernel_ptr(dev, vmax),
                             n,
                             *args};
    sim_kernel_launch(dev, run_adam_update, &call, sizeof call);
}

typedef struct adam_update_bf16_args {
    adam_update_args base;
    fsdp_bf16 *p_bf16;
} adam_update_bf16_args;

static void run_adam_update_bf16(void *arg) {
    adam_update_bf16_args *c = arg;
    adam_update_args *a = &c->base;
    fsdp_kernels_cpu()->adam_update_bf16(a->p, c->p_bf16, a->g, a->m, a->v, a->vmax, a->n,
                                         &a->args);
}

static void sim_adam_update_bf16(float *p, fsdp_bf16 *p_bf16, const float *g, float *m, float *v,
                                 float *vmax, int64_t n, const fsdp_adam_step_args *args) {
    int dev = sim_kernel_device(p, "adam_update_bf16");
    adam_update_bf16_args call = {{sim_kernel_ptr(dev, p), sim_kernel_ptr(dev, g),
                                   sim_kernel_ptr(dev, m), sim_kernel_ptr(dev, v),
                                   sim_kernel_ptr(dev, vmax), n, *args},
                                  sim_kernel_ptr(dev, p_bf16)};
    sim_kernel_launch(dev, run_adam_update_bf16, &call, sizeof call);
}

static const fsdp_kernels_i sim_kernels = {
    .name = "sim",
    .gemm = sim_gemm,
    .bias_add = sim_bias_add,
    .bias_backward = sim_bias_backward,
    .relu_forward = sim_relu_forward,
    .relu_backward = sim_relu_backward,
    .sigmoid_forward = sim_sigmoid_forward,
    .sigmoid_backward = sim_sigmoid_backward,
    .gelu_forward = sim_gelu_forward,
    .gelu_backward = sim_gelu_backward,
    .rmsnorm_forward = sim_rmsnorm_forward,
    .rmsnorm_backward = sim_rmsnorm_backward,
    .rmsnorm_forward_bf16 = sim_rmsnorm_forward_bf16,
    .rmsnorm_backward_add = sim_rmsnorm_backward_add,
    .add = sim_add,
    .add3 = sim_add3,
    .add3_round_bf16 = sim_add3_round_bf16,
    .add_bf16 = sim_add_bf16,
    .axpy = sim_axpy,
    .scale = sim_scale,
    .copy = sim_copy,
    .fill = sim_fill,
    .sum = sim_sum,
    .sum_squares = sim_sum_squares,
    .max_abs = sim_max_abs,
    .reduce_n = sim_reduce_n,
    .mse_loss = sim_mse_loss,
    .cross_entropy = sim_cross_entropy,
    .f32_to_bf16 = sim_f32_to_bf16,
    .bf16_to_f32 = sim_bf16_to_f32,
    .round_bf16 = sim_round_bf16,
    .f32_to_f16 = sim_f32_to_f16,
    .f16_to_f32 = sim_f16_to_f32,
    .sgd_update = sim_sgd_update,
    .adam_update = sim_adam_update,
    .adam_update_bf16 = sim_adam_update_bf16,
    .adam_update_multi = sim_adam_update_multi,
    .fill_multi = sim_fill_multi,
    .gemm_bf16 = sim_gemm_bf16,
    .gemm_bias_act = sim_gemm_bias_act,
    .gemm_bf16_bias_act = sim_gemm_bf16_bias_act,
    .gemm_bgrad = sim_gemm_bgrad,
    .gemm_bf16_round = sim_gemm_bf16_round,
    .embedding_forward = sim_embedding_forward,
    .embedding_backward = sim_embedding_backward,
    .rope_forward = sim_rope_forward,
    .rope_backward = sim_rope_backward,
    .rope_qk_forward = sim_rope_qk_forward,
    .rope_qk_backward = sim_rope_qk_backward,
    .rope_qk_backward_round = sim_rope_qk_backward_round,
    .attention_forward = sim_attention_forward,
    .attention_backward = sim_attention_backward,
    .attention_forward_bf16 = sim_attention_forward, /* f32: within the bf16 bound */
    .attention_backward_bf16 = sim_attention_backward,
    .swiglu_forward = sim_swiglu_forward,
    .swiglu_backward = sim_swiglu_backward,
    .swiglu_forward_bf16 = sim_swiglu_forward_bf16,
    .rope_qk_forward_bf16 = sim_rope_qk_forward_bf16,
    .rope_qk_forward_bf16_round = sim_rope_qk_forward_bf16_round,
    .rope_qk_backward_bf16_round = sim_rope_qk_backward_bf16_round,
    .attention_forward_bf16_round = sim_attention_forward_bf16_round,
    .attention_backward_bf16_round = sim_attention_backward_bf16_round,
    .swiglu_backward_bf16 = sim_swiglu_backward_bf16,
    .swiglu_backward_bf16_round = sim_swiglu_backward_bf16_round,
    .swiglu_backward_bf16io = sim_swiglu_backward_bf16io,
    .cross_entropy_ignore = sim_cross_entropy_ignore,
    .cross_entropy_ignore_bf16 = sim_cross_entropy_ignore_bf16,
    .vocab_row_max = sim_vocab_row_max,
    .vocab_exp_sums = sim_vocab_exp_sums,
    .vocab_ce_grad = sim_vocab_ce_grad,
};

const fsdp_kernels_i *fsdp_kernels_sim(void) {
    return &sim_kernels;
}
