/* llama_cuda.h: the CUDA kernels of the Llama layers behind fsdp_kernels_cuda() (semantics in
 * kernels/kernels.h; implementation in llama.cu). Internal to src/kernels/cuda. */
#ifndef FSDP_KERNELS_CUDA_LLAMA_H
#define FSDP_KERNELS_CUDA_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/tensor.h" // defines: fsdp_bf16

#ifdef __cplusplus
extern "C" {
#endif

void fsdp_cuda_embedding_forward(float *out, const int32_t *tokens, const float *weight, int64_t n,
                                 int64_t C, int64_t start, int64_t rows);
void fsdp_cuda_embedding_backward(float *dweight, const float *dout, const int32_t *tokens,
                                  int64_t n, int64_t C, int64_t start, int64_t rows);
void fsdp_cuda_rope_forward(float *out, const float *inp, const float *cos, const float *sin,
                            int64_t B, int64_t T, int64_t H, int64_t D);
void fsdp_cuda_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin,
                             int64_t B, int64_t T, int64_t H, int64_t D);
void fsdp_cuda_rope_qk_forward(float *qo, float *ko, const float *q, const float *k,
                               const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                               int64_t NKV, int64_t D);
void fsdp_cuda_rope_qk_backward(float *dq, float *dk, const float *dqo, const float *dko,
                                const float *cos, const float *sin, int64_t B, int64_t T,
                                int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_attention_forward(float *out, float *lse, float *scratch, const float *q,
                                 const float *k, const float *v, int64_t B, int64_t T, int64_t NH,
                                 int64_t NKV, int64_t D);
void fsdp_cuda_attention_backward(float *dq, float *dk, float *dv, float *scratch,
                                  const float *dout, const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, int64_t B, int64_t T,
                                  int64_t NH, int64_t NKV, int64_t D);
/* The bf16 compute policy's entries: cuDNN's fused attention where the thread's choice allows
 * it (AUTO or CUDNN), else as the f32 entries. */
void fsdp_cuda_attention_forward_bf16(float *out, float *lse, float *scratch, const float *q,
                                      const float *k, const float *v, int64_t B, int64_t T,
                                      int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_attention_backward_bf16(float *dq, float *dk, float *dv, float *scratch,
                                       const float *dout, const float *q, const float *k,
                                       const float *v, const float *out, const float *lse,
                                       int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
/* The attention paths behind the entries above (attention.cu chooses): the plain kernels
 * (llama.cu, one thread per score row), the tiled ones (attention.cu, D <= 128, no scratch) and
 * the GEMM one (below). */
void fsdp_cuda_attention_forward_plain(float *out, float *lse, float *scratch, const float *q,
                                       const float *k, const float *v, int64_t B, int64_t T,
                                       int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_attention_backward_plain(float *dq, float *dk, float *dv, float *scratch,
                                        const float *dout, const float *q, const float *k,
                                        const float *v, const float *out, const float *lse,
                                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_attention_forward_flash(float *out, float *lse, const float *q, const float *k,
                                       const float *v, int64_t B, int64_t T, int64_t NH,
                                       int64_t NKV, int64_t D);
void fsdp_cuda_attention_backward_flash(float *dq, float *dk, float *dv, const float *dout,
                                        const float *q, const float *k, const float *v,
                                        const float *out, const float *lse, int64_t B, int64_t T,
                                        int64_t NH, int64_t NKV, int64_t D);
/* The GEMM path (attention_gemm.cu, any D): false, having done nothing, where the caching
 * allocator cannot give one (b, h) pair's score blocks (the caller runs another path). */
bool fsdp_cuda_attention_forward_gemm(float *out, float *lse, const float *q, const float *k,
                                      const float *v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                      int64_t D);
bool fsdp_cuda_attention_backward_gemm(float *dq, float *dk, float *dv, const float *dout,
                                       const float *q, const float *k, const float *v,
                                       const float *out, const float *lse, int64_t B, int64_t T,
                                       int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
void fsdp_cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                               const float *up, int64_t n);
void fsdp_cuda_rope_qk_forward_bf16(float *qo, float *ko, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                    const float *cos, const float *sin, int64_t B, int64_t T,
                                    int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_swiglu_forward_bf16(fsdp_bf16 *out, const fsdp_bf16 *gate, const fsdp_bf16 *up,
                                   int64_t n);
void fsdp_cuda_swiglu_backward_bf16(float *dgate, float *dup, const float *dout,
                                    const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
void fsdp_cuda_swiglu_backward_bf16io(fsdp_bf16 *dgate, fsdp_bf16 *dup, const fsdp_bf16 *dout,
                                      const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
void fsdp_cuda_swiglu_backward_bf16_round(fsdp_bf16 *dgate, fsdp_bf16 *dup, const float *dout,
                                          const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
void fsdp_cuda_rope_qk_backward_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const float *dqo,
                                      const float *dko, const float *cos, const float *sin,
                                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_rope_qk_forward_bf16_round(fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q,
                                          const fsdp_bf16 *k, const float *cos, const float *sin,
                                          int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
void fsdp_cuda_rope_qk_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const fsdp_bf16 *dqo,
                                           const fsdp_bf16 *dko, const float *cos, const float *sin,
                                           int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                           int64_t D);
/* The bf16-tensor attention (attention.cu): cuDNN's where the thread's choice allows it and it
 * takes the shape, else the f32 path on batches widened in scratch */
void fsdp_cuda_attention_forward_bf16_round(fsdp_bf16 *out, float *lse, float *scratch,
                                            const fsdp_bf16 *q, const fsdp_bf16 *k,
                                            const fsdp_bf16 *v, int64_t B, int64_t T, int64_t NH,
                                            int64_t NKV, int64_t D);
void fsdp_cuda_attention_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                                             float *scratch, const fsdp_bf16 *dout,
                                             const fsdp_bf16 *q, const fsdp_bf16 *k,
                                             const fsdp_bf16 *v, const fsdp_bf16 *out,
                                             const float *lse, int64_t B, int64_t T, int64_t NH,
                                             int64_t NKV, int64_t D);
void fsdp_cuda_cross_entropy_ignore(float *loss, float *dlogits, const float *logits,
                                    const int32_t *targets, int32_t ignore_index, int64_t rows,
                                    int64_t classes);
void fsdp_cuda_cross_entropy_ignore_bf16(float *loss, void *dlogits, fsdp_dtype dlogits_dtype,
                                         const fsdp_bf16 *logits, const int32_t *targets,
                                         int32_t ignore_index, int64_t rows, int64_t classes);
void fsdp_cuda_vocab_row_max(float *mx, const float *logits, int64_t rows, int64_t V);
void fsdp_cuda_vocab_exp_sums(float *se, float *xt, const float *logits, const float *mx,
                              const int32_t *targets, int32_t ignore_index, int64_t start,
                              int64_t rows, int64_t V);
void fsdp_cuda_vocab_ce_grad(float *dlogits, const float *logits, const float *mx, const float *se,
                             const int32_t *targets, int32_t ignore_index, int64_t start,
                             int64_t rows, int64_t V, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
