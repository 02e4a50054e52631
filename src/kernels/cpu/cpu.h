/* cpu.h: the CPU kernels behind fsdp_kernels_cpu(), one function per table entry
 * (semantics in kernels/kernels.h). Internal: callers go through the table. */
#ifndef FSDP_KERNELS_CPU_H
#define FSDP_KERNELS_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/tensor.h"
#include "kernels/kernels.h" // defines: fsdp_sgd_step_args, fsdp_adam_step_args

/* gemm.c */
void fsdp_cpu_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                   int64_t ldc);
void fsdp_cpu_bias_add(float *out, const float *bias, int64_t rows, int64_t cols);
void fsdp_cpu_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols);

/* epilogue.c */
void fsdp_cpu_gemm_bias_act(float *out, float *pre, const float *inp, const float *weight,
                            const float *bias, int64_t rows, int64_t C, int64_t OC,
                            fsdp_gemm_act act);
void fsdp_cpu_gemm_bf16_bias_act(float *out, float *pre, const fsdp_bf16 *inp,
                                 const fsdp_bf16 *weight, const float *bias, int64_t rows,
                                 int64_t C, int64_t OC, fsdp_gemm_act act);
void fsdp_cpu_gemm_bgrad(float *dweight, float *dbias, const float *dout, const float *inp,
                         int64_t rows, int64_t C, int64_t OC);

/* activation.c */
void fsdp_cpu_relu_forward(float *out, const float *inp, int64_t n);
void fsdp_cpu_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void fsdp_cpu_sigmoid_forward(float *out, const float *inp, int64_t n);
void fsdp_cpu_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t n);
void fsdp_cpu_gelu_forward(float *out, const float *inp, int64_t n);
void fsdp_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

/* norm.c */
void fsdp_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                              float eps, int64_t rows, int64_t cols);
void fsdp_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int64_t rows, int64_t cols);
void fsdp_cpu_rmsnorm_forward_bf16(fsdp_bf16 *out, float *rstd, const float *inp,
                                   const float *weight, float eps, int64_t rows, int64_t cols);
void fsdp_cpu_rmsnorm_backward_add(float *dinp, float *dweight, const float *dout,
                                   const float *dres, const float *inp, const float *weight,
                                   const float *rstd, int64_t rows, int64_t cols);

/* elementwise.c */
void fsdp_cpu_add(float *out, const float *a, const float *b, int64_t n);
void fsdp_cpu_add3(float *out, const float *a, const float *b, const float *c, int64_t n);
void fsdp_cpu_axpy(float *y, float alpha, const float *x, int64_t n);
void fsdp_cpu_scale(float *out, const float *inp, float alpha, int64_t n);
void fsdp_cpu_copy(float *dst, const float *src, int64_t n);
void fsdp_cpu_fill(float *out, float value, int64_t n);

/* reduce.c */
double fsdp_cpu_sum(const float *x, int64_t n);
double fsdp_cpu_sum_squares(const float *x, int64_t n);
double fsdp_cpu_max_abs(const float *x, int64_t n);
/* dst (cols) += sum over rows r of a[r, c] * b[r, c] * scale[r], summed in double; b and
 * scale may be NULL (read as 1). a, b (rows, cols). Serves bias and RMSNorm weight grads. */
void fsdp_cpu_column_sum(float *dst, const float *a, const float *b, const float *scale,
                         int64_t rows, int64_t cols);
/* The same over `cols` columns of arrays whose rows are `ld` floats apart (a block of columns
 * of wider arrays). */
void fsdp_cpu_column_sum_ld(float *dst, const float *a, const float *b, const float *scale,
                            int64_t rows, int64_t cols, int64_t ld);

/* reduce_n.c */
void fsdp_cpu_reduce_n(void *out, const void *const *in, int n, int64_t count, fsdp_dtype dtype,
                       const fsdp_reduce_n_args *args);

/* loss.c */
void fsdp_cpu_mse_loss(float *loss, float *dout, const float *out, const float *target, int64_t n);
void fsdp_cpu_cross_entropy(float *loss, float *dlogits, const float *logits,
                            const int32_t *targets, int64_t rows, int64_t classes);

/* convert.c */
void fsdp_cpu_f32_to_bf16(fsdp_bf16 *dst, const float *src, int64_t n);
void fsdp_cpu_bf16_to_f32(float *dst, const fsdp_bf16 *src, int64_t n);
void fsdp_cpu_round_bf16(float *x, int64_t n);
void fsdp_cpu_add3_round_bf16(float *out, const float *a, const float *b, const float *c,
                              int64_t n);
void fsdp_cpu_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n);
void fsdp_cpu_f32_to_f16(fsdp_f16 *dst, const float *src, int64_t n);
void fsdp_cpu_f16_to_f32(float *dst, const fsdp_f16 *src, int64_t n);

/* optim.c */
void fsdp_cpu_sgd_update(float *p, const float *g, float *buf, int64_t n,
                         const fsdp_sgd_step_args *a);
void fsdp_cpu_adam_update(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                          const fsdp_adam_step_args *a);
void fsdp_cpu_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                        float beta, float *C, int64_t ldc);
void fsdp_cpu_gemm_bf16_round(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                              fsdp_bf16 *C, int64_t ldc);
void fsdp_cpu_adam_update_bf16(float *p, fsdp_bf16 *p_bf16, const float *g, float *m, float *v,
                               float *vmax, int64_t n, const fsdp_adam_step_args *a);

#endif
