/* timed.c: the CPU table with timers (fsdp/profile.h): while the calling thread profiles,
 * fsdp_kernels_cpu() hands out this table, whose entries time the entry of the plain table
 * they call and add the time to the profile's GEMM, elementwise or optimizer total. The Llama
 * entries are not timed. */
#include "kernels/cpu/timed.h"
#include "core/prof_impl.h"
#include "kernels/cpu/cpu.h"

enum { T_GEMM, T_ELEMENTWISE, T_OPTIMIZER };

static void add_time(int kind, double t0) {
    fsdp_profile *p = fsdp_prof_current();
    if (!p) return;
    double dt = fsdp_prof_now() - t0;
    if (kind == T_GEMM) p->gemm_s += dt, p->gemm_calls++;
    if (kind == T_ELEMENTWISE) p->elementwise_s += dt, p->elementwise_calls++;
    if (kind == T_OPTIMIZER) p->optimizer_s += dt, p->optimizer_calls++;
}

static const fsdp_kernels_i *plain;

/* A void entry: time the plain table's entry of the same name. */
#define TIMED_VOID(kind, name, params, args)                                                       \
    static void timed_##name params {                                                              \
        double t0 = fsdp_prof_now();                                                               \
        plain->name args;                                                                          \
        add_time(kind, t0);                                                                        \
    }
#define TIMED_DOUBLE(kind, name, params, args)                                                     \
    static double timed_##name params {                                                            \
        double t0 = fsdp_prof_now();                                                               \
        double r = plain->name args;                                                               \
        add_time(kind, t0);                                                                        \
        return r;                                                                                  \
    }

TIMED_VOID(T_GEMM, gemm,
           (bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
            int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc),
           (ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
/* the fused entries count as GEMMs (their epilogue's elementwise work included) */
TIMED_VOID(T_GEMM, gemm_bias_act,
           (float *o, float *pre, const float *x, const float *w, const float *b, int64_t r,
            int64_t c, int64_t oc, fsdp_gemm_act act),
           (o, pre, x, w, b, r, c, oc, act))
TIMED_VOID(T_GEMM, gemm_bf16_bias_act,
           (float *o, float *pre, const fsdp_bf16 *x, const fsdp_bf16 *w, const float *b, int64_t r,
            int64_t c, int64_t oc, fsdp_gemm_act act),
           (o, pre, x, w, b, r, c, oc, act))
TIMED_VOID(T_GEMM, gemm_bf16,
           (bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const fsdp_bf16 *A,
            int64_t lda, const fsdp_bf16 *B, int64_t ldb, float beta, float *C, int64_t ldc),
           (ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
TIMED_VOID(T_GEMM, gemm_bf16_round,
           (bool ta, bool tb, int64_t M, int64_t N, int64_t K, const fsdp_bf16 *A, int64_t lda,
            const fsdp_bf16 *B, int64_t ldb, fsdp_bf16 *C, int64_t ldc),
           (ta, tb, M, N, K, A, lda, B, ldb, C, ldc))
TIMED_VOID(T_GEMM, gemm_bgrad,
           (float *dw, float *db, const float *d, const float *x, int64_t r, int64_t c, int64_t oc),
           (dw, db, d, x, r, c, oc))
TIMED_VOID(T_ELEMENTWISE, bias_add, (float *o, const float *b, int64_t r, int64_t c), (o, b, r, c))
TIMED_VOID(T_ELEMENTWISE, bias_backward, (float *o, const float *d, int64_t r, int64_t c),
           (o, d, r, c))
TIMED_VOID(T_ELEMENTWISE, relu_forward, (float *o, const float *i, int64_t n), (o, i, n))
TIMED_VOID(T_ELEMENTWISE, relu_backward, (float *o, const float *i, const float *d, int64_t n),
           (o, i, d, n))
TIMED_VOID(T_ELEMENTWISE, sigmoid_forward, (float *o, const float *i, int64_t n), (o, i, n))
TIMED_VOID(T_ELEMENTWISE, sigmoid_backward, (float *o, const float *i, const float *d, int64_t n),
           (o, i, d, n))
TIMED_VOID(T_ELEMENTWISE, gelu_forward, (float *o, const float *i, int64_t n), (o, i, n))
TIMED_VOID(T_ELEMENTWISE, gelu_backward, (float *o, const float *i, const float *d, int64_t n),
           (o, i, d, n))
TIMED_VOID(T_ELEMENTWISE, rmsnorm_forward,
           (float *o, float *rs, const float *i, const float *w, float eps, int64_t r, int64_t c),
           (o, rs, i, w, eps, r, c))
TIMED_VOID(T_ELEMENTWISE, rmsnorm_forward_bf16,
           (fsdp_bf16 * o, float *rs, const float *i, const float *w, float eps, int64_t r,
            int64_t c),
           (o, rs, i, w, eps, r, c))
TIMED_VOID(T_ELEMENTWISE, rmsnorm_backward,
           (float *di, float *dw, const float *d, const float *i, const float *w, const float *rs,
            int64_t r, int64_t c),
           (di, dw, d, i, w, rs, r, c))
TIMED_VOID(T_ELEMENTWISE, rmsnorm_backward_add,
           (float *di, float *dw, const float *d, const float *dr, const float *i, const float *w,
            const float *rs, int64_t r, int64_t c),
           (di, dw, d, dr, i, w, rs, r, c))
TIMED_VOID(T_ELEMENTWISE, add, (float *o, const float *a, const float *b, int64_t n), (o, a, b, n))
TIMED_VOID(T_ELEMENTWISE, add3,
           (float *o, const float *a, const float *b, const float *c, int64_t n), (o, a, b, c, n))
TIMED_VOID(T_ELEMENTWISE, add3_round_bf16,
           (float *o, const float *a, const float *b, const float *c, int64_t n), (o, a, b, c, n))
TIMED_VOID(T_ELEMENTWISE, add_bf16, (float *o, const float *a, const fsdp_bf16 *b, int64_t n),
           (o, a, b, n))
TIMED_VOID(T_ELEMENTWISE, axpy, (float *y, float al, const float *x, int64_t n), (y, al, x, n))
TIMED_VOID(T_ELEMENTWISE, scale, (float *o, const float *i, float al, int64_t n), (o, i, al, n))
TIMED_VOID(T_ELEMENTWISE, copy, (float *d, const float *s, int64_t n), (d, s, n))
TIMED_VOID(T_ELEMENTWISE, fill, (float *o, float v, int64_t n), (o, v, n))
TIMED_DOUBLE(T_ELEMENTWISE, sum, (const float *x, int64_t n), (x, n))
TIMED_DOUBLE(T_ELEMENTWISE, sum_squares, (const float *x, int64_t n), (x, n))
TIMED_DOUBLE(T_ELEMENTWISE, max_abs, (const float *x, int64_t n), (x, n))
TIMED_VOID(T_ELEMENTWISE, mse_loss, (float *l, float *d, const float *o, const float *t, int64_t n),
           (l, d, o, t, n))
TIMED_VOID(T_ELEMENTWISE, cross_entropy,
           (float *l, float *d, const float *x, const int32_t *t, int64_t r, int64_t c),
           (l, d, x, t, r, c))
TIMED_VOID(T_ELEMENTWISE, f32_to_bf16, (fsdp_bf16 * d, const float *s, int64_t n), (d, s, n))
TIMED_VOID(T_ELEMENTWISE, bf16_to_f32, (float *d, const fsdp_bf16 *s, int64_t n), (d, s, n))
TIMED_VOID(T_ELEMENTWISE, round_bf16, (float *x, int64_t n), (x, n))
TIMED_VOID(T_OPTIMIZER, sgd_update,
           (float *p, const float *g, float *b, int64_t n, const fsdp_sgd_step_args *a),
           (p, g, b, n, a))
TIMED_VOID(T_OPTIMIZER, adam_update,
           (float *p, const float *g, float *m, float *v, float *vm, int64_t n,
            const fsdp_adam_step_args *a),
           (p, g, m, v, vm, n, a))
TIMED_VOID(T_OPTIMIZER, adam_update_bf16,
           (float *p, fsdp_bf16 *lp, const float *g, float *m, float *v, float *vm, int64_t n,
            const fsdp_adam_step_args *a),
           (p, lp, g, m, v, vm, n, a))
TIMED_VOID(T_OPTIMIZER, adam_update_multi,
           (const fsdp_adam_tensor *t, int c, const fsdp_adam_step_args *a), (t, c, a))
TIMED_VOID(T_ELEMENTWISE, fill_multi, (float *const *o, const int64_t *n, int c, float v),
           (o, n, c, v))

const fsdp_kernels_i *fsdp_cpu_timed_table(const fsdp_kernels_i *untimed) {
    static fsdp_kernels_i timed;
    static bool made; /* set once, from the first profiling thread; the entries never change */
    if (!__atomic_load_n(&made, __ATOMIC_ACQUIRE)) {
        static char lock;
        while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE)) {
        }
        if (!made) {
            plain = untimed;
            timed = *untimed;
            timed.gemm = timed_gemm;
            timed.gemm_bias_act = timed_gemm_bias_act;
            timed.gemm_bf16_bias_act = timed_gemm_bf16_bias_act;
            timed.gemm_bgrad = timed_gemm_bgrad;
            timed.gemm_bf16 = timed_gemm_bf16;
            timed.gemm_bf16_round = timed_gemm_bf16_round;
            timed.bias_add = timed_bias_add;
            timed.bias_backward = timed_bias_backward;
            timed.relu_forward = timed_relu_forward;
            timed.relu_backward = timed_relu_backward;
            timed.sigmoid_forward = timed_sigmoid_forward;
            timed.sigmoid_backward = timed_sigmoid_backward;
            timed.gelu_forward = timed_gelu_forward;
            timed.gelu_backward = timed_gelu_backward;
            timed.rmsnorm_forward = timed_rmsnorm_forward;
            timed.rmsnorm_backward = timed_rmsnorm_backward;
            timed.rmsnorm_forward_bf16 = timed_rmsnorm_forward_bf16;
            timed.rmsnorm_backward_add = timed_rmsnorm_backward_add;
            timed.add = timed_add;
            timed.add3 = timed_add3;
            timed.add3_round_bf16 = timed_add3_round_bf16;
            timed.add_bf16 = timed_add_bf16;
            timed.axpy = timed_axpy;
            timed.scale = timed_scale;
            timed.copy = timed_copy;
            timed.fill = timed_fill;
            timed.sum = timed_sum;
            timed.sum_squares = timed_sum_squares;
            timed.max_abs = timed_max_abs;
            timed.mse_loss = timed_mse_loss;
            timed.cross_entropy = timed_cross_entropy;
            timed.f32_to_bf16 = timed_f32_to_bf16;
            timed.bf16_to_f32 = timed_bf16_to_f32;
            timed.round_bf16 = timed_round_bf16;
            timed.sgd_update = timed_sgd_update;
            timed.adam_update = timed_adam_update;
            timed.adam_update_bf16 = timed_adam_update_bf16;
            timed.adam_update_multi = timed_adam_update_multi;
            timed.fill_multi = timed_fill_multi;
            __atomic_store_n(&made, true, __ATOMIC_RELEASE);
        }
        __atomic_clear(&lock, __ATOMIC_RELEASE);
    }
    return &timed;
}
