/* llama_common.h: what the Llama layers (embedding.c, llama_attention.c, llama_mlp.c, llama.c)
 * share inside src/nn (llama_common.c, but for fsdp_llama_mlp_build in llama_mlp.c and the
 * accessors of llama_attention.c and llama.c that generation reads): the kernel
 * table check, the bias-free projections they own, and the configuration's checks. */
#ifndef FSDP_NN_LLAMA_COMMON_H
#define FSDP_NN_LLAMA_COMMON_H

#include <stdbool.h>

#include "fsdp/llama.h"
#include "kernels/kernels.h"

/* The table of dev when it has the Llama kernels (checked with has, one of its entries);
 * otherwise NULL, with FSDP_ERR_DEVICE naming m and the device in the ctx. */
const fsdp_kernels_i *fsdp_llama_kernels(fsdp_ctx *ctx, const fsdp_module *m, fsdp_device dev,
                                         bool has, fsdp_status *st);
#define LLAMA_KERNELS(ctx, m, dev, entry, kvar)                                                    \
    do {                                                                                           \
        fsdp_status st_;                                                                           \
        const fsdp_kernels_i *k_ = fsdp_kernels_for(dev);                                          \
        (kvar) = fsdp_llama_kernels((ctx), (m), (dev), k_ && k_->entry, &st_);                     \
        if (!(kvar)) return st_;                                                                   \
    } while (0)

/* A Linear(in, out) without bias, weight ~ normal(0, std), added to parent as `name`; *child
 * (may be NULL) is the new module. */
fsdp_status fsdp_llama_add_proj(fsdp_ctx *ctx, fsdp_module *parent, const char *name, int64_t in,
                                int64_t out, float std, fsdp_module **child);

/* Sums the input gradients of parallel branches in one pass (add3): *dst (shaped like a) = (a +
 * b) + c (c may be NULL), a buffer of the caller's; with round_bf16, each input rounded to bf16
 * first (add3_round_bf16: the branches are bf16-policy Linears that left their input gradients
 * unrounded, fsdp_llama_branch_grads). */
fsdp_status fsdp_llama_sum_grads(fsdp_ctx *ctx, fsdp_tensor **dst, const fsdp_tensor *a,
                                 const fsdp_tensor *b, const fsdp_tensor *c, bool round_bf16);

/* The backward of n (2 or 3) Linear branches that read one input: branch i from dout[i], each
 * input gradient (when din) into dx[i]. Returns in *unrounded whether they are left unrounded
 * for fsdp_llama_sum_grads to round: when the device has add3_round_bf16 and every branch can
 * leave it so (fsdp_nn_linear_can_leave_dx_unrounded: the bf16 policy, no post-backward hook).
 * Branches whose gradients are Partial addends (tensor parallelism, fsdp_nn_linear_set_dx_partial)
 * have a post-backward hook: *unrounded is false and the sum of their f32 gradients stays f32,
 * unrounded, for the reduction over ranks that follows. */
fsdp_status fsdp_llama_branch_grads(fsdp_ctx *ctx, fsdp_module *const *branch,
                                    const fsdp_tensor *const *dout, int n, bool din,
                                    const fsdp_tensor **dx, bool *unrounded);

/* Whether the n Linear branches of a block take bf16 output gradients, which the block's
 * backward then writes rounded with a device entry (`entry`: the table has it; the bits
 * f32_to_bf16 gives the f32 gradient, which the Linear would round the same way): every branch
 * takes one (fsdp_nn_linear_takes_bf16_grad: the bf16 policy, no bias gradient), and the test
 * switch below is off. Counted for fsdp_llama_test_grads16. With next, whether they will in the
 * backward of their next forward (not counted): a forward asks its branches for no bf16 scratch of
 * their own for rounding an f32 gradient (fsdp_nn_linear_set_bf16_grad). */
bool fsdp_llama_grads16(fsdp_module *const *branch, int n, bool entry, bool next);
/* For tests: how many blocks gave their branches bf16 output gradients since the last call. */
int64_t fsdp_llama_test_grads16(void);
/* Whether the fused paths run (false on the test switch's path before, fsdp_llama_test_sums): a
 * block that asks a child for a cheaper form of a gradient asks only then. */
bool fsdp_llama_fused_on(void);
/* A block read a child's input gradient written in bf16 (fsdp_nn_linear_set_bf16_dx): counted
 * for tests, which read and zero the count with fsdp_llama_test_dx16. */
void fsdp_llama_dx16_ran(void);
int64_t fsdp_llama_test_dx16(void);

/* For tests (test_dx_sum, which includes this header): with old_path, the sums run as before add3
 * (add, then add again for a third input), the branches round their own input gradients and take
 * f32 output gradients (fsdp_llama_grads16 is false); *fused
 * (may be NULL) gets the sums that rounded their inputs (add3_round_bf16) since the last call,
 * *add3 those that ran add3 on three inputs. Process-wide. */
void fsdp_llama_test_sums(bool old_path, int64_t *fused, int64_t *add3);

/* With on, LlamaAttention m's (LlamaMLP m's) forwards give o_proj's (down_proj's) output as a
 * bf16 tensor when that Linear can (fsdp_nn_linear_can_give_bf16_output), for a parent that adds
 * it widened (LlamaDecoderLayer's residual adds, add_bf16): set on before its call and off after,
 * so a direct call, as generation makes, gets f32. Nothing for other modules. */
void fsdp_llama_attention_set_bf16_output(fsdp_module *m, bool on);
void fsdp_llama_mlp_set_bf16_output(fsdp_module *m, bool on);
/* For tests: *adds (may be NULL) gets the residual adds that read a bf16 branch (add_bf16) since
 * the last call, across the process (llama.c). */
void fsdp_llama_test_bf16_branches(int64_t *adds);
/* For tests: with old_path, LlamaDecoderLayer sums its norms' input gradients with the
 * residual stream's as before (the norm's backward, then add into a buffer of its own) instead of
 * asking the norm to add it in its pass (rmsnorm_backward_add); *fused (may be NULL) gets the
 * norm backwards that added it since the last call (llama.c). Process-wide. */
void fsdp_llama_test_norm_sums(bool old_path, int64_t *fused);
/* For tests: the forwards of LlamaForCausalLM whose model.norm gave lm_head a bf16 output since
 * the last call, across the process (llama.c). */
int64_t fsdp_llama_test_final_norm16(void);
/* Whether a LlamaAttention forward under the bf16 policy runs on bf16 tensors (the table's
 * _bf16_round attention entries: `entries`, the device has them and the projections allow it);
 * false while the test switch below is off. A forward that then ran so counts itself with
 * fsdp_llama_attention16_ran. */
bool fsdp_llama_attention16_on(bool entries);
void fsdp_llama_attention16_ran(void);
/* For tests: with off, the bf16 policy's attention runs as before (f32 q, k, v and out through
 * attention_forward_bf16); *ran (may be NULL) gets the forwards that ran on bf16 tensors since
 * the last call. Process-wide. */
void fsdp_llama_test_attention16(bool off, int64_t *ran);

/* fsdp_llama_mlp_create with the projections' weights ~ normal(0, std) (llama_mlp.c). */
fsdp_status fsdp_llama_mlp_build(fsdp_ctx *ctx, int64_t dim, int64_t hidden, float std,
                                 fsdp_module **out);
/* Whether LlamaMLP m takes a bf16 input: gate_proj and up_proj run the bf16 compute policy
 * (llama_mlp.c); false when m is not one. */
bool fsdp_llama_mlp_reads_bf16(const fsdp_module *m);
/* Whether LlamaAttention m takes a bf16 input: q_proj, k_proj and v_proj run the bf16 compute
 * policy (llama_attention.c); false when m is not one. */
bool fsdp_llama_attention_reads_bf16(const fsdp_module *m);

/* cos (T, hd / 2) and sin (T, hd / 2) of positions t0 .. t0 + T - 1 times Llama's inverse
 * frequencies theta^(-2i / hd), scaled as `scaling` says (fsdp_llama_rope_scaling; NULL or
 * type default: none), in f32 as Hugging Face's rotary embedding computes them: the
 * attention's table (llama_attention.c) and the generation cache's (llama_decode.c) are one. */
void fsdp_llama_rope_table(float *cos, float *sin, int64_t t0, int64_t T, int64_t head_dim,
                           float theta, const fsdp_llama_rope_scaling *scaling);

/* What generation (llama_decode.c) reads of a LlamaAttention (llama_attention.c). */
typedef struct fsdp_llama_attention_info {
    fsdp_module *q_proj, *k_proj, *v_proj, *o_proj;
    int64_t head_dim, max_seq_len;
    float rope_theta;
    fsdp_llama_rope_scaling rope_scaling;
} fsdp_llama_attention_info;
/* false when m is not a LlamaAttention. */
bool fsdp_llama_attention_parts(const fsdp_module *m, fsdp_llama_attention_info *out);
/* A LlamaDecoderLayer's input_layernorm, self_attn, post_attention_layernorm and mlp in
 * parts[0..3] (llama.c); false when m is not one. */
bool fsdp_llama_decoder_layer_parts(const fsdp_module *m, fsdp_module *parts[4]);

/* FSDP_ERR_INVALID_ARGUMENT: "Llama config: field = value; rule". */
fsdp_status fsdp_llama_bad_config(fsdp_ctx *ctx, const char *field, long long value,
                                  const char *rule);

/* "needs a forward first" for m (FSDP_ERR_STATE). */
fsdp_status fsdp_llama_no_forward(fsdp_ctx *ctx, const fsdp_module *m);

#endif
