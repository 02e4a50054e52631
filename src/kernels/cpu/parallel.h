/* parallel.h: the CPU table's entries split over the calling rank's threads (parallel.c);
 * same semantics (and bits) as the cpu.h functions they call. Internal to src/kernels/cpu. */
#ifndef FSDP_KERNELS_CPU_PARALLEL_H
#define FSDP_KERNELS_CPU_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h" // defines: fsdp_sgd_step_args, fsdp_adam_step_args

void fsdp_cpu_par_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc);
void fsdp_cpu_par_bias_add(float *out, const float *bias, int64_t rows, int64_t cols);
void fsdp_cpu_par_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols);
void fsdp_cpu_par_add(float *out, const float *a, const float *b, int64_t n);
void fsdp_cpu_par_add3(float *out, const float *a, const float *b, const float *c, int64_t n);
void fsdp_cpu_par_add3_round_bf16(float *out, const float *a, const float *b, const float *c,
                                  int64_t n);
void fsdp_cpu_par_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n);
void fsdp_cpu_par_axpy(float *y, float alpha, const float *x, int64_t n);
void fsdp_cpu_par_scale(float *out, const float *inp, float alpha, int64_t n);
void fsdp_cpu_par_copy(float *dst, const float *src, int64_t n);
void fsdp_cpu_par_fill(float *out, float value, int64_t n);
void fsdp_cpu_par_relu_forward(float *out, const float *inp, int64_t n);
void fsdp_cpu_par_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void fsdp_cpu_par_sigmoid_forward(float *out, const float *inp, int64_t n);
void fsdp_cpu_par_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t n);
void fsdp_cpu_par_gelu_forward(float *out, const float *inp, int64_t n);
void fsdp_cpu_par_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void fsdp_cpu_par_sgd_update(float *p, const float *g, float *buf, int64_t n,
                             const fsdp_sgd_step_args *args);
void fsdp_cpu_par_adam_update(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                              const fsdp_adam_step_args *args);
void fsdp_cpu_par_adam_update_bf16(float *p, fsdp_bf16 *p_bf16, const float *g, float *m, float *v,
                                   float *vmax, int64_t n, const fsdp_adam_step_args *args);
/* multi.c: the multi-tensor entries, the ones above tensor by tensor */
void fsdp_cpu_par_adam_update_multi(const fsdp_adam_tensor *t, int count,
                                    const fsdp_adam_step_args *args);
void fsdp_cpu_par_fill_multi(float *const *out, const int64_t *n, int count, float value);

#endif
