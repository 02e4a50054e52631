/* table.c: the CPU operator table, fsdp_kernels_cpu(): the entries that can use the rank's
 * threads split over them (parallel.c); while the calling thread profiles, the timed table. */
#include "core/prof_impl.h" // defines: fsdp_prof_current
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/llama.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/timed.h"
#include "kernels/kernels.h"

static const fsdp_kernels_i cpu_kernels = {
    .name = "cpu",
    .gemm = fsdp_cpu_par_gemm,
    .bias_add = fsdp_cpu_par_bias_add,
    .bias_backward = fsdp_cpu_par_bias_backward,
    .relu_forward = fsdp_cpu_par_relu_forward,
    .relu_backward = fsdp_cpu_par_relu_backward,
    .sigmoid_forward = fsdp_cpu_par_sigmoid_forward,
    .sigmoid_backward = fsdp_cpu_par_sigmoid_backward,
    .gelu_forward = fsdp_cpu_par_gelu_forward,
    .gelu_backward = fsdp_cpu_par_gelu_backward,
    .rmsnorm_forward = fsdp_cpu_rmsnorm_forward,
    .rmsnorm_backward = fsdp_cpu_rmsnorm_backward,
    .rmsnorm_forward_bf16 = fsdp_cpu_rmsnorm_forward_bf16,
    .rmsnorm_backward_add = fsdp_cpu_rmsnorm_backward_add,
    .add = fsdp_cpu_par_add,
    .add3 = fsdp_cpu_par_add3,
    .add3_round_bf16 = fsdp_cpu_par_add3_round_bf16,
    .add_bf16 = fsdp_cpu_par_add_bf16,
    .axpy = fsdp_cpu_par_axpy,
    .scale = fsdp_cpu_par_scale,
    .copy = fsdp_cpu_par_copy,
    .fill = fsdp_cpu_par_fill,
    .sum = fsdp_cpu_sum,
    .sum_squares = fsdp_cpu_sum_squares,
    .max_abs = fsdp_cpu_max_abs,
    .reduce_n = fsdp_cpu_reduce_n,
    .mse_loss = fsdp_cpu_mse_loss,
    .cross_entropy = fsdp_cpu_cross_entropy,
    .f32_to_bf16 = fsdp_cpu_f32_to_bf16,
    .bf16_to_f32 = fsdp_cpu_bf16_to_f32,
    .round_bf16 = fsdp_cpu_round_bf16,
    .f32_to_f16 = fsdp_cpu_f32_to_f16,
    .f16_to_f32 = fsdp_cpu_f16_to_f32,
    .sgd_update = fsdp_cpu_par_sgd_update,
    .adam_update = fsdp_cpu_par_adam_update,
    .adam_update_bf16 = fsdp_cpu_par_adam_update_bf16,
    .adam_update_multi = fsdp_cpu_par_adam_update_multi,
    .fill_multi = fsdp_cpu_par_fill_multi,
    .gemm_bf16 = fsdp_cpu_gemm_bf16,
    .gemm_bias_act = fsdp_cpu_gemm_bias_act,
    .gemm_bf16_bias_act = fsdp_cpu_gemm_bf16_bias_act,
    .gemm_bgrad = fsdp_cpu_gemm_bgrad,
    .gemm_bf16_round = fsdp_cpu_gemm_bf16_round,
    .embedding_forward = fsdp_cpu_embedding_forward,
    .embedding_backward = fsdp_cpu_embedding_backward,
    .rope_forward = fsdp_cpu_rope_forward,
    .rope_backward = fsdp_cpu_rope_backward,
    .rope_qk_forward = fsdp_cpu_rope_qk_forward,
    .rope_qk_backward = fsdp_cpu_rope_qk_backward,
    .rope_qk_backward_round = fsdp_cpu_rope_qk_backward_round,
    .attention_forward = fsdp_cpu_attention_forward,
    .attention_backward = fsdp_cpu_attention_backward,
    .attention_forward_bf16 = fsdp_cpu_attention_forward, /* f32: within the bf16 bound */
    .attention_backward_bf16 = fsdp_cpu_attention_backward,
    .swiglu_forward = fsdp_cpu_swiglu_forward,
    .swiglu_backward = fsdp_cpu_swiglu_backward,
    .swiglu_forward_bf16 = fsdp_cpu_swiglu_forward_bf16,
    .rope_qk_forward_bf16 = fsdp_cpu_rope_qk_forward_bf16,
    .rope_qk_forward_bf16_round = fsdp_cpu_rope_qk_forward_bf16_round,
    .rope_qk_backward_bf16_round = fsdp_cpu_rope_qk_backward_bf16_round,
    .attention_forward_bf16_round = fsdp_cpu_attention_forward_bf16_round,
    .attention_backward_bf16_round = fsdp_cpu_attention_backward_bf16_round,
    .swiglu_backward_bf16 = fsdp_cpu_swiglu_backward_bf16,
    .swiglu_backward_bf16_round = fsdp_cpu_swiglu_backward_bf16_round,
    .swiglu_backward_bf16io = fsdp_cpu_swiglu_backward_bf16io,
    .cross_entropy_ignore = fsdp_cpu_cross_entropy_ignore,
    .cross_entropy_ignore_bf16 = fsdp_cpu_cross_entropy_ignore_bf16,
    .vocab_row_max = fsdp_cpu_vocab_row_max,
    .vocab_exp_sums = fsdp_cpu_vocab_exp_sums,
    .vocab_ce_grad = fsdp_cpu_vocab_ce_grad,
};

const fsdp_kernels_i *fsdp_kernels_cpu(void) {
    if (fsdp_prof_current()) return fsdp_cpu_timed_table(&cpu_kernels);
    return &cpu_kernels;
}
