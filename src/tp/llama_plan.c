/* llama_plan.c: torchtitan's tensor-parallel plan for the Llama model, in Hugging Face's module
 * names: the embedding and the projections sharded over heads, the MLP over its hidden width
 * and the norms over the sequence (SequenceParallel). */
#include "core/error.h"
#include "fsdp/tp.h"

fsdp_status fsdp_llama_tp_plan(fsdp_ctx *ctx, const fsdp_llama_config *cfg, int tp_size,
                               bool loss_parallel, fsdp_tp_plan_entry *plan, int *n) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cfg);
    FSDP_ARG_NOT_NULL(ctx, plan);
    FSDP_ARG_NOT_NULL(ctx, n);
    fsdp_llama_config c;
    FSDP_TRY_AT(ctx, fsdp_llama_config_resolve(ctx, cfg, &c));
    if (tp_size < 1)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama TP plan: tp size %d; it must be >= 1", tp_size);
    if (tp_size > 1 && c.logits_dtype == FSDP_DTYPE_BF16)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama TP plan: logits_dtype = bf16 with tp size %d: the "
                         "vocabulary-sharded lm_head's redistribution and loss parallel's "
                         "kernels read f32 logits; build the model with logits_dtype "
                         "FSDP_DTYPE_F32 (the default) for tensor parallelism",
                         tp_size);
    if (c.n_heads % tp_size || c.n_kv_heads % tp_size)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama TP plan: n_heads = %d and n_kv_heads = %d must both be divisible "
                         "by the tp size %d (each rank takes whole query and key/value heads)",
                         c.n_heads, c.n_kv_heads, tp_size);
    if (c.ffn_hidden % tp_size)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama TP plan: ffn_hidden = %lld must be divisible by the tp size %d",
                         (long long)c.ffn_hidden, tp_size);
    fsdp_tp_style out =
        loss_parallel
            ? FSDP_COLWISE(.input_layouts = FSDP_SHARD(1), .output_layouts = FSDP_SHARD(-1),
                           .use_local_output = FSDP_TP_NO)
            : FSDP_COLWISE(.input_layouts = FSDP_SHARD(1), .output_layouts = FSDP_REPLICATE);
    const fsdp_tp_plan_entry p[FSDP_LLAMA_TP_PLAN_LEN] = {
        {"model.embed_tokens",
         FSDP_ROWWISE(.input_layouts = FSDP_REPLICATE, .output_layouts = FSDP_SHARD(1))},
        {"model.norm", FSDP_SEQUENCE_PARALLEL()},
        {"lm_head", out},
        {"model.layers.*.input_layernorm", FSDP_SEQUENCE_PARALLEL()},
        {"model.layers.*.self_attn", FSDP_PREPARE_INPUT(.input_layouts = FSDP_SHARD(1),
                                                        .desired_input_layouts = FSDP_REPLICATE)},
        {"model.layers.*.self_attn.q_proj", FSDP_COLWISE()},
        {"model.layers.*.self_attn.k_proj", FSDP_COLWISE()},
        {"model.layers.*.self_attn.v_proj", FSDP_COLWISE()},
        {"model.layers.*.self_attn.o_proj", FSDP_ROWWISE(.output_layouts = FSDP_SHARD(1))},
        {"model.layers.*.post_attention_layernorm", FSDP_SEQUENCE_PARALLEL()},
        {"model.layers.*.mlp", FSDP_PREPARE_INPUT(.input_layouts = FSDP_SHARD(1),
                                                  .desired_input_layouts = FSDP_REPLICATE)},
        {"model.layers.*.mlp.gate_proj", FSDP_COLWISE()},
        {"model.layers.*.mlp.up_proj", FSDP_COLWISE()},
        {"model.layers.*.mlp.down_proj", FSDP_ROWWISE(.output_layouts = FSDP_SHARD(1))},
    };
    for (int i = 0; i < FSDP_LLAMA_TP_PLAN_LEN; i++) plan[i] = p[i];
    *n = FSDP_LLAMA_TP_PLAN_LEN;
    return FSDP_OK;
}
