/* table_llama.c: the Llama entries of the sim operator table (table.c): each queues the CPU
 * table's entry on the calling thread's current stream over shadow addresses;
 * cross_entropy_ignore (and its bf16 form) waits for its loss. */
#include "kernels/sim/sim_impl.h"

typedef struct embedding_forward_args {
    float *out;
    const int32_t *tokens;
    const float *weight;
    int64_t n, C, start, rows;
} embedding_forward_args;

static void run_embedding_forward(void *arg) {
    embedding_forward_args *a = arg;
    fsdp_kernels_cpu()->embedding_forward(a->out, a->tokens, a->weight, a->n, a->C, a->start,
                                          a->rows);
}

void sim_embedding_forward(float *out, const int32_t *tokens, const float *weight, int64_t n,
                           int64_t C, int64_t start, int64_t rows) {
    int dev = sim_kernel_device(out, "embedding_forward");
    embedding_forward_args call = {sim_kernel_ptr(dev, out),
                                   sim_kernel_ptr(dev, tokens),
                                   sim_kernel_ptr(dev, weight),
                                   n,
                                   C,
                                   start,
                                   rows};
    sim_kernel_launch(dev, run_embedding_forward, &call, sizeof call);
}

typedef struct embedding_backward_args {
    float *dweight;
    const float *dout;
    const int32_t *tokens;
    int64_t n, C, start, rows;
} embedding_backward_args;

static void run_embedding_backward(void *arg) {
    embedding_backward_args *a = arg;
    fsdp_kernels_cpu()->embedding_backward(a->dweight, a->dout, a->tokens, a->n, a->C, a->start,
                                           a->rows);
}

void sim_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int64_t n,
                            int64_t C, int64_t start, int64_t rows) {
    int dev = sim_kernel_device(dweight, "embedding_backward");
    embedding_backward_args call = {sim_kernel_ptr(dev, dweight),
                                    sim_kernel_ptr(dev, dout),
                                    sim_kernel_ptr(dev, tokens),
                                    n,
                                    C,
                                    start,
                                    rows};
    sim_kernel_launch(dev, run_embedding_backward, &call, sizeof call);
}

typedef struct rope_forward_args {
    float *out;
    const float *inp;
    const float *cos;
    const float *sin;
    int64_t B;
    int64_t T;
    int64_t H;
    int64_t D;
} rope_forward_args;

static void run_rope_forward(void *arg) {
    rope_forward_args *a = arg;
    fsdp_kernels_cpu()->rope_forward(a->out, a->inp, a->cos, a->sin, a->B, a->T, a->H, a->D);
}

void sim_rope_forward(float *out, const float *inp, const float *cos, const float *sin, int64_t B,
                      int64_t T, int64_t H, int64_t D) {
    int dev = sim_kernel_device(out, "rope_forward");
    rope_forward_args call = {sim_kernel_ptr(dev, out),
                              sim_kernel_ptr(dev, inp),
                              sim_kernel_ptr(dev, cos),
                              sim_kernel_ptr(dev, sin),
                              B,
                              T,
                              H,
                              D};
    sim_kernel_launch(dev, run_rope_forward, &call, sizeof call);
}

typedef struct rope_qk_args {
    float *qo, *ko;
    const float *q, *k, *cos, *sin;
    int64_t B, T, NH, NKV, D;
    bool backward;
} rope_qk_args;

static void run_rope_qk(void *arg) {
    rope_qk_args *a = arg;
    const fsdp_kernels_i *cpu = fsdp_kernels_cpu();
    (a->backward ? cpu->rope_qk_backward : cpu->rope_qk_forward)(
        a->qo, a->ko, a->q, a->k, a->cos, a->sin, a->B, a->T, a->NH, a->NKV, a->D);
}

static void rope_qk(const char *name, bool backward, float *qo, float *ko, const float *q,
                    const float *k, const float *cos, const float *sin, int64_t B, int64_t T,
                    int64_t NH, int64_t NKV, int64_t D) {
    int dev = sim_kernel_device(qo, name);
    rope_qk_args call = {sim_kernel_ptr(dev, qo),
                         sim_kernel_ptr(dev, ko),
                         sim_kernel_ptr(dev, q),
                         sim_kernel_ptr(dev, k),
                         sim_kernel_ptr(dev, cos),
                         sim_kernel_ptr(dev, sin),
                         B,
                         T,
                         NH,
                         NKV,
                         D,
                         backward};
    sim_kernel_launch(dev, run_rope_qk, &call, sizeof call);
}

void sim_rope_qk_forward(float *qo, float *ko, const float *q, const float *k, const float *cos,
                         const float *sin, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                         int64_t D) {
    rope_qk("rope_qk_forward", false, qo, ko, q, k, cos, sin, B, T, NH, NKV, D);
}

void sim_rope_qk_backward(float *dq, float *dk, const float *dqo, const float *dko,
                          const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                          int64_t NKV, int64_t D) {
    rope_qk("rope_qk_backward", true, dq, dk, dqo, dko, cos, sin, B, T, NH, NKV, D);
}

typedef struct rope_backward_args {
    float *dinp;
    const float *dout;
    const float *cos;
    const float *sin;
    int64_t B;
    int64_t T;
    int64_t H;
    int64_t D;
} rope_backward_args;

static void run_rope_backward(void *arg) {
    rope_backward_args *a = arg;
    fsdp_kernels_cpu()->rope_backward(a->dinp, a->dout, a->cos, a->sin, a->B, a->T, a->H, a->D);
}

void sim_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin,
                       int64_t B, int64_t T, int64_t H, int64_t D) {
    int dev = sim_kernel_device(dinp, "rope_backward");
    rope_backward_args call = {sim_kernel_ptr(dev, dinp),
                               sim_kernel_ptr(dev, dout),
                               sim_kernel_ptr(dev, cos),
                               sim_kernel_ptr(dev, sin),
                               B,
                               T,
                               H,
                               D};
    sim_kernel_launch(dev, run_rope_backward, &call, sizeof call);
}

typedef struct attention_forward_args {
    float *out;
    float *lse;
    float *scratch;
    const float *q;
    const float *k;
    const float *v;
    int64_t B;
    int64_t T;
    int64_t NH;
    int64_t NKV;
    int64_t D;
} attention_forward_args;

static void run_attention_forward(void *arg) {
    attention_forward_args *a = arg;
    fsdp_kernels_cpu()->attention_forward(a->out, a->lse, a->scratch, a->q, a->k, a->v, a->B, a->T,
                                          a->NH, a->NKV, a->D);
}

void sim_attention_forward(float *out, float *lse, float *scratch, const float *q, const float *k,
                           const float *v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                           int64_t D) {
    int dev = sim_kernel_device(out, "attention_forward");
    attention_forward_args call = {sim_kernel_ptr(dev, out),
                                   sim_kernel_ptr(dev, lse),
                                   sim_kernel_ptr(dev, scratch),
                                   sim_kernel_ptr(dev, q),
                                   sim_kernel_ptr(dev, k),
                                   sim_kernel_ptr(dev, v),
                                   B,
                                   T,
                                   NH,
                                   NKV,
                                   D};
    sim_kernel_launch(dev, run_attention_forward, &call, sizeof call);
}

typedef struct attention_backward_args {
    float *dq;
    float *dk;
    float *dv;
    float *scratch;
    const float *dout;
    const float *q;
    const float *k;
    const float *v;
    const float *out;
    const float *lse;
    int64_t B;
    int64_t T;
    int64_t NH;
    int64_t NKV;
    int64_t D;
} attention_backward_args;

static void run_attention_backward(void *arg) {
    attention_backward_args *a = arg;
    fsdp_kernels_cpu()->attention_backward(a->dq, a->dk, a->dv, a->scratch, a->dout, a->q, a->k,
                                           a->v, a->out, a->lse, a->B, a->T, a->NH, a->NKV, a->D);
}

void sim_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                            int64_t D) {
    int dev = sim_kernel_device(dq, "attention_backward");
    attention_backward_args call = {sim_kernel_ptr(dev, dq),
                                    sim_kernel_ptr(dev, dk),
                                    sim_kernel_ptr(dev, dv),
                                    sim_kernel_ptr(dev, scratch),
                                    sim_kernel_ptr(dev, dout),
                                    sim_kernel_ptr(dev, q),
                                    sim_kernel_ptr(dev, k),
                                    sim_kernel_ptr(dev, v),
                                    sim_kernel_ptr(dev, out),
                                    sim_kernel_ptr(dev, lse),
                                    B,
                                    T,
                                    NH,
                                    NKV,
                                    D};
    sim_kernel_launch(dev, run_attention_backward, &call, sizeof call);
}

typedef struct swiglu_forward_args {
    float *out;
    const float *gate;
    const float *up;
    int64_t n;
} swiglu_forward_args;

static void run_swiglu_forward(void *arg) {
    swiglu_forward_args *a = arg;
    fsdp_kernels_cpu()->swiglu_forward(a->out, a->gate, a->up, a->n);
}

void sim_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    int dev = sim_kernel_device(out, "swiglu_forward");
    swiglu_forward_args call = {sim_kernel_ptr(dev, out), sim_kernel_ptr(dev, gate),
                                sim_kernel_ptr(dev, up), n};
    sim_kernel_launch(dev, run_swiglu_forward, &call, sizeof call);
}

typedef struct swiglu_backward_args {
    float *dgate;
    float *dup;
    const float *dout;
    const float *gate;
    const float *up;
    int64_t n;
} swiglu_backward_args;

static void run_swiglu_backward(void *arg) {
    swiglu_backward_args *a = arg;
    fsdp_kernels_cpu()->swiglu_backward(a->dgate, a->dup, a->dout, a->gate, a->up, a->n);
}

void sim_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n) {
    int dev = sim_kernel_device(dgate, "swiglu_backward");
    swiglu_backward_args call = {sim_kernel_ptr(dev, dgate), sim_kernel_ptr(dev, dup),
                                 sim_kernel_ptr(dev, dout),  sim_kernel_ptr(dev, gate),
                                 sim_kernel_ptr(dev, up),    n};
    sim_kernel_launch(dev, run_swiglu_backward, &call, sizeof call);
}

typedef struct cross_entropy_ignore_args {
    float *loss;
    float *dlogits;
    const float *logits;
    const int32_t *targets;
    int32_t ignore_index;
    int64_t rows;
    int64_t classes;
} cross_entropy_ignore_args;

static void run_cross_entropy_ignore(void *arg) {
    cross_entropy_ignore_args *a = arg;
    fsdp_kernels_cpu()->cross_entropy_ignore(a->loss, a->dlogits, a->logits, a->targets,
                                             a->ignore_index, a->rows, a->classes);
}

void sim_cross_entropy_ignore(float *loss, float *dlogits, const float *logits,
                              const int32_t *targets, int32_t ignore_index, int64_t rows,
                              int64_t classes) {
    int dev = sim_kernel_device(logits, "cross_entropy_ignore");
    cross_entropy_ignore_args call = {loss,
                                      sim_kernel_ptr(dev, dlogits),
                                      sim_kernel_ptr(dev, logits),
                                      sim_kernel_ptr(dev, targets),
                                      ignore_index,
                                      rows,
                                      classes};
    sim_kernel_call(dev, run_cross_entropy_ignore, &call, sizeof call);
}

typedef struct cross_entropy_ignore_bf16_args {
    float *loss;
    void *dlogits;
    fsdp_dtype dlogits_dtype;
    const fsdp_bf16 *logits;
    const int32_t *targets;
    int32_t ignore_index;
    int64_t rows;
    int64_t classes;
} cross_entropy_ignore_bf16_args;

static void run_cross_entropy_ignore_bf16(void *arg) {
    cross_entropy_ignore_bf16_args *a = arg;
    fsdp_kernels_cpu()->cross_entropy_ignore_bf16(a->loss, a->dlogits, a->dlogits_dtype, a->logits,
                                                  a->targets, a->ignore_index, a->rows, a->classes);
}

void sim_cross_entropy_ignore_bf16(float *loss, void *dlogits, fsdp_dtype dlogits_dtype,
                                   const fsdp_bf16 *logits, const int32_t *targets,
                                   int32_t ignore_index, int64_t rows, int64_t classes) {
    int dev = sim_kernel_device(logits, "cross_entropy_ignore_bf16");
    cross_entropy_ignore_bf16_args call = {loss,
                                           sim_kernel_ptr(dev, dlogits),
                                           dlogits_dtype,
                                           sim_kernel_ptr(dev, logits),
                                           sim_kernel_ptr(dev, targets),
                                           ignore_index,
                                           rows,
                                           classes};
    sim_kernel_call(dev, run_cross_entropy_ignore_bf16, &call, sizeof call);
}

typedef struct vocab_args {
    float *a, *b;           /* mx; se, xt; dlogits */
    const float *x, *m, *s; /* logits, mx, se */
    const int32_t *targets;
    int32_t ignore_index;
    int64_t start, rows, V, n;
} vocab_args;

static void run_vocab_row_max(void *arg) {
    vocab_args *a = arg;
    fsdp_kernels_cpu()->vocab_row_max(a->a, a->x, a->rows, a->V);
}

void sim_vocab_row_max(float *mx, const float *logits, int64_t rows, int64_t V) {
    int dev = sim_kernel_device(mx, "vocab_row_max");
    vocab_args call = {
        .a = sim_kernel_ptr(dev, mx), .x = sim_kernel_ptr(dev, logits), .rows = rows, .V = V};
    sim_kernel_launch(dev, run_vocab_row_max, &call, sizeof call);
}

static void run_vocab_exp_sums(void *arg) {
    vocab_args *a = arg;
    fsdp_kernels_cpu()->vocab_exp_sums(a->a, a->b, a->x, a->m, a->targets, a->ignore_index,
                                       a->start, a->rows, a->V);
}

void sim_vocab_exp_sums(float *se, float *xt, const float *logits, const float *mx,
                        const int32_t *targets, int32_t ignore_index, int64_t start, int64_t rows,
                        int64_t V) {
    int dev = sim_kernel_device(se, "vocab_exp_sums");
    vocab_args call = {.a = sim_kernel_ptr(dev, se),
                       .b = sim_kernel_ptr(dev, xt),
                       .x = sim_kernel_ptr(dev, logits),
                       .m = sim_kernel_ptr(dev, mx),
                       .targets = sim_kernel_ptr(dev, targets),
                       .ignore_index = ignore_index,
                       .start = start,
                       .rows = rows,
                       .V = V};
    sim_kernel_launch(dev, run_vocab_exp_sums, &call, sizeof call);
}

static void run_vocab_ce_grad(void *arg) {
    vocab_args *a = arg;
    fsdp_kernels_cpu()->vocab_ce_grad(a->a, a->x, a->m, a->s, a->targets, a->ignore_index, a->start,
                                      a->rows, a->V, a->n);
}

void sim_vocab_ce_grad(float *dlogits, const float *logits, const float *mx, const float *se,
                       const int32_t *targets, int32_t ignore_index, int64_t start, int64_t rows,
                       int64_t V, int64_t n) {
    int dev = sim_kernel_device(dlogits, "vocab_ce_grad");
    vocab_args call = {.a = sim_kernel_ptr(dev, dlogits),
                       .x = sim_kernel_ptr(dev, logits),
                       .m = sim_kernel_ptr(dev, mx),
                       .s = sim_kernel_ptr(dev, se),
                       .targets = sim_kernel_ptr(dev, targets),
                       .ignore_index = ignore_index,
                       .start = start,
                       .rows = rows,
                       .V = V,
                       .n = n};
    sim_kernel_launch(dev, run_vocab_ce_grad, &call, sizeof call);
}
