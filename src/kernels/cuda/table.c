/* table.c: the CUDA operator table, fsdp_kernels_cuda() (kernels/devices.c registers it with
 * the CUDA device's record). */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/llama_cuda.h"

static const fsdp_kernels_i cuda_kernels = {
    .name = "cuda",
    .gemm = fsdp_cuda_gemm,
    .bias_add = fsdp_cuda_bias_add,
    .bias_backward = fsdp_cuda_bias_backward,
    .relu_forward = fsdp_cuda_relu_forward,
    .relu_backward = fsdp_cuda_relu_backward,
    .sigmoid_forward = fsdp_cuda_sigmoid_forward,
    .sigmoid_backward = fsdp_cuda_sigmoid_backward,
    .gelu_forward = fsdp_cuda_gelu_forward,
    .gelu_backward = fsdp_cuda_gelu_backward,
    .rmsnorm_forward = fsdp_cuda_rmsnorm_forward,
    .rmsnorm_backward = fsdp_cuda_rmsnorm_backward,
    .add = fsdp_cuda_add,
    .axpy = fsdp_cuda_axpy,
    .scale = fsdp_cuda_scale,
    .copy = fsdp_cuda_copy,
    .fill = fsdp_cuda_fill,
    .sum = fsdp_cuda_sum,
    .sum_squares = fsdp_cuda_sum_squares,
    .max_abs = fsdp_cuda_max_abs,
    .reduce_n = fsdp_cuda_reduce_n,
    .mse_loss = fsdp_cuda_mse_loss,
    .cross_entropy = fsdp_cuda_cross_entropy,
    .f32_to_bf16 = fsdp_cuda_f32_to_bf16,
    .bf16_to_f32 = fsdp_cuda_bf16_to_f32,
    .f32_to_f16 = fsdp_cuda_f32_to_f16,
    .f16_to_f32 = fsdp_cuda_f16_to_f32,
    .sgd_update = fsdp_cuda_sgd_update,
    .adam_update = fsdp_cuda_adam_update,
    .adam_update_bf16 = fsdp_cuda_adam_update_bf16,
    .gemm_bf16 = fsdp_cuda_gemm_bf16,
    .gemm_bias_act = fsdp_cuda_gemm_bias_act,
    .gemm_bf16_bias_act = fsdp_cuda_gemm_bf16_bias_act,
    .gemm_bgrad = fsdp_cuda_gemm_bgrad,
    .embedding_forward = fsdp_cuda_embedding_forward,
    .embedding_backward = fsdp_cuda_embedding_backward,
    .rope_forward = fsdp_cuda_rope_forward,
    .rope_backward = fsdp_cuda_rope_backward,
    .rope_qk_forward = fsdp_cuda_rope_qk_forward,
    .rope_qk_backward = fsdp_cuda_rope_qk_backward,
    .attention_forward = fsdp_cuda_attention_forward,
    .attention_backward = fsdp_cuda_attention_backward,
    .swiglu_forward = fsdp_cuda_swiglu_forward,
    .swiglu_backward = fsdp_cuda_swiglu_backward,
    .cross_entropy_ignore = fsdp_cuda_cross_entropy_ignore,
    .vocab_row_max = fsdp_cuda_vocab_row_max,
    .vocab_exp_sums = fsdp_cuda_vocab_exp_sums,
    .vocab_ce_grad = fsdp_cuda_vocab_ce_grad,
};

const fsdp_kernels_i *fsdp_kernels_cuda(void) {
    return &cuda_kernels;
}
