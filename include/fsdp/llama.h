/* llama.h: a Llama-style decoder-only transformer and its layers, with the module and
 * parameter names of Hugging Face's LlamaForCausalLM, so a state dict maps one to one
 * (docs/models.md). Each constructor returns a module the caller owns (until it is added to a
 * parent). Activations are (B, T, C) f32; token ids are (B, T) i32 tensors. A tensor on a
 * device whose kernel table lacks the Llama entries is refused with FSDP_ERR_DEVICE. */
#ifndef FSDP_LLAMA_H
#define FSDP_LLAMA_H

#include "fsdp/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rotary embedding's frequencies: Llama's own (theta^(-2i / hd)), or Llama 3's scaling of
 * them (Hugging Face's rope_scaling / rope_parameters with rope_type "llama3", as transformers'
 * _compute_llama3_parameters: a frequency whose wavelength 2 pi / f exceeds
 * original_max_len / low_freq_factor is divided by factor, one whose wavelength is below
 * original_max_len / high_freq_factor is kept, and those between are interpolated with
 * s = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
 * as (1 - s) f / factor + s f; in float32). */
typedef enum fsdp_llama_rope_type {
    FSDP_LLAMA_ROPE_DEFAULT = 0, /* theta^(-2i / hd), no scaling */
    FSDP_LLAMA_ROPE_LLAMA3 = 1,  /* Llama 3.1 / 3.2's scaling */
} fsdp_llama_rope_type;

typedef struct fsdp_llama_rope_scaling {
    fsdp_llama_rope_type type; /* default FSDP_LLAMA_ROPE_DEFAULT; the fields below then unused */
    float factor;              /* llama3: >= 1 (Llama 3.1: 8, Llama 3.2: 32) */
    float low_freq_factor;     /* llama3: > 0 (1) */
    float high_freq_factor;    /* llama3: > low_freq_factor (4) */
    int64_t original_max_len;  /* llama3: original_max_position_embeddings, >= 1 (8192) */
} fsdp_llama_rope_scaling;

/* The shape of a Llama model. Zero fields take the documented default, so designated
 * initialisers name only what differs:
 *   fsdp_llama_config cfg = {.dim = 32, .n_layers = 2, .n_heads = 4, .vocab_size = 64}; */
typedef struct fsdp_llama_config {
    int64_t dim;         /* hidden size (HF hidden_size); required */
    int n_layers;        /* decoder layers (num_hidden_layers); required for the model */
    int n_heads;         /* query heads (num_attention_heads); must divide dim */
    int n_kv_heads;      /* key/value heads (num_key_value_heads); 0: n_heads; divides n_heads */
    int64_t vocab_size;  /* tokens (vocab_size); required for the model */
    int64_t ffn_hidden;  /* SwiGLU width (intermediate_size); 0: Meta's rule, 8 dim / 3
                          * rounded up to a multiple of 256 */
    int64_t max_seq_len; /* longest sequence (max_position_embeddings); 0: 2048 */
    float norm_eps;      /* RMSNorm epsilon (rms_norm_eps); 0: 1e-6, HF's default */
    float rope_theta;    /* rotary base (rope_theta); 0: 10000 */
    float init_std;      /* Linear and Embedding weights ~ normal(0, init_std)
                          * (initializer_range); 0: 0.02. Norm weights are ones. */
    fsdp_llama_rope_scaling rope_scaling; /* (rope_scaling); zero: none */
    /* (tie_word_embeddings) lm_head shares model.embed_tokens.weight: one parameter, the
     * gradients of both uses summed into it; lm_head then has no parameter of its own. */
    bool tie_word_embeddings;
    /* The compute policy (fsdp_module_set_autocast, docs/models.md "bf16 compute"):
     * FSDP_DTYPE_F32 (0, the default) or FSDP_DTYPE_BF16, the Linear layers' GEMMs on bf16
     * inputs with f32 accumulation and bf16 outputs; norms, attention, loss and optimizer f32.
     * Parameters, their gradients and the optimizer's state stay f32 either way. */
    fsdp_dtype compute_dtype;
    /* The logits' dtype: FSDP_DTYPE_F32 (0, the default: an f32 tensor, as PyTorch's eager f32
     * model) or FSDP_DTYPE_BF16, under compute_dtype FSDP_DTYPE_BF16 only (else refused):
     * lm_head gives its output, the values the policy rounds to bf16 anyway, as a bf16 tensor
     * (autocast's bf16 logits), and takes a bf16 output gradient, which
     * fsdp_loss_cross_entropy_ignore writes for bf16 logits (its math f32 on the widened logits:
     * the same loss and gradients, bit for bit, in half the bytes). An f32 output gradient is
     * still taken. Tensor parallelism (fsdp_llama_tp_plan with tp > 1) refuses it: the
     * vocabulary-sharded lm_head's redistribution and loss parallel read f32 logits
     * (docs/models.md, "bf16 logits"). */
    fsdp_dtype logits_dtype;
} fsdp_llama_config;

/* cfg with every zero field replaced by its default; FSDP_ERR_INVALID_ARGUMENT naming the
 * field when a value is out of range (the model's n_layers and vocab_size are checked by
 * fsdp_model_llama). */
fsdp_status fsdp_llama_config_resolve(fsdp_ctx *ctx, const fsdp_llama_config *cfg,
                                      fsdp_llama_config *out);

/* *out <- the model FLOPs of one token of a training step (forward and backward; not an
 * activation checkpoint's recompute) of the Llama of cfg on sequences of seq tokens (1 ..
 * max_seq_len): 6 N + 12 L d seq, the count PaLM (appendix B), llm.c and torchtitan measure
 * model-FLOP utilisation (MFU) by. N: the weights the GEMMs read, every parameter but the
 * embedding table's lookup (norm weights too, a rounding), lm_head's (vocab, dim) counted also
 * when it is tied to the embedding; 12 L d seq: the attention's q k^T and P v over the whole
 * (seq, seq) square, as those counts take it (the causal half a kernel skips is counted).
 * Errors: cfg's (fsdp_llama_config_resolve), and a seq outside its range. */
fsdp_status fsdp_llama_flops_per_token(fsdp_ctx *ctx, const fsdp_llama_config *cfg, int64_t seq,
                                       double *out);

/* nn.Embedding: input i32 token ids in [0, num_embeddings) of shape (...) (up to 3 dims),
 * output (..., dim) f32. Parameter "weight" (num_embeddings, dim) ~ normal(0, 1) as PyTorch.
 * Token ids have no gradient: backward only accumulates the weight gradient and hands back no
 * input gradient (NULL). */
fsdp_status fsdp_embedding_create(fsdp_ctx *ctx, int64_t num_embeddings, int64_t dim,
                                  fsdp_module **out);

/* LlamaAttention: children q_proj (n_heads * hd, dim), k_proj and v_proj (n_kv_heads * hd,
 * dim), o_proj (dim, n_heads * hd), all without bias, hd = dim / n_heads. Input (B, T, dim),
 * positions 0 .. T-1 (T <= max_seq_len); rotary embedding on q and k (rotate_half layout),
 * causal softmax attention, each group of n_heads / n_kv_heads query heads sharing one
 * key/value head. The head counts it uses are read from the projections' weights at each
 * forward, so a tensor-parallel split of heads (q/k/v by rows, o by columns) just works. */
fsdp_status fsdp_llama_attention_create(fsdp_ctx *ctx, const fsdp_llama_config *cfg,
                                        fsdp_module **out);

/* LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x)); children gate_proj (hidden, dim),
 * up_proj (hidden, dim), down_proj (dim, hidden), no bias; Meta's w1, w3, w2. */
fsdp_status fsdp_llama_mlp_create(fsdp_ctx *ctx, int64_t dim, int64_t hidden, fsdp_module **out);

/* LlamaDecoderLayer: h = x + self_attn(input_layernorm(x)); y = h +
 * mlp(post_attention_layernorm(h)). Children, in Hugging Face's order: self_attn, mlp,
 * input_layernorm, post_attention_layernorm. Kind "LlamaDecoderLayer". */
fsdp_status fsdp_llama_decoder_layer_create(fsdp_ctx *ctx, const fsdp_llama_config *cfg,
                                            fsdp_module **out);

/* LlamaForCausalLM: model.embed_tokens, model.layers.0 .. n_layers-1, model.norm, lm_head
 * (untied, or with tie_word_embeddings a Linear over the embedding's weight). Input (B, T) i32
 * token ids, output (B, T, vocab_size) logits. Parameters are initialised as described in
 * fsdp_llama_config from the ctx seed. For Hugging Face's loss, score logits[b, t] against
 * labels[b, t + 1] with fsdp_loss_cross_entropy_ignore (the last position and padding get
 * FSDP_IGNORE_INDEX). */
fsdp_status fsdp_model_llama(fsdp_ctx *ctx, const fsdp_llama_config *cfg, fsdp_module **out);

/* ---- generation (docs/models.md, "Generation") ---- */

/* A key/value cache over a Llama (fsdp_model_llama, plain: one rank, no tensor parallelism or
 * FSDP, on the CPU) for generating: each decoder layer's rotated keys and values of the
 * positions fed so far, up to max_len of them. */
typedef struct fsdp_llama_cache fsdp_llama_cache;

/* A cache for model, which it borrows (the model must outlive it and keep its structure) for
 * max_len positions (0: the model's max_seq_len; at most that). FSDP_ERR_INVALID_ARGUMENT when
 * model is not a fsdp_model_llama; FSDP_ERR_STATE when its parameters are distributed (TP or
 * FSDP); FSDP_ERR_DEVICE when they are not on the CPU. The caller owns *out. */
fsdp_status fsdp_llama_cache_create(fsdp_ctx *ctx, fsdp_module *model, int64_t max_len,
                                    fsdp_llama_cache **out);
void fsdp_llama_cache_free(fsdp_llama_cache *cache); /* NULL does nothing */
/* Forgets every position: the next fsdp_llama_decode starts a new sequence at position 0. */
void fsdp_llama_cache_reset(fsdp_llama_cache *cache);
int64_t fsdp_llama_cache_len(const fsdp_llama_cache *cache); /* positions fed so far */

/* Feeds tokens[0..n) at positions len .. len + n - 1 (len = the positions fed before): a
 * prompt at once (prefill), then one token at a time. Each layer's queries attend to the cached
 * keys and values of every earlier position and their own, with the grouped-query heads and the
 * rotary positions of the full forward. *logits (vocab_size floats, owned by the cache, valid
 * until its next call) are those of the last token fed. Feeding a whole sequence at once from
 * position 0 computes exactly what fsdp_module_forward does on it (the same kernels on the same
 * shapes, so the last position's logits are bitwise equal on a rank without worker threads;
 * with threads_per_rank > 1 the attention's GEMMs may be split over them where the kernel's are
 * not, to float32 rounding); position by position the products are summed in other orders
 * (float32 rounding). Refused: n < 1, a token outside
 * [0, vocab_size), len + n beyond the cache's max_len (the message names the lengths and the
 * fix). On failure the cache is unchanged. */
fsdp_status fsdp_llama_decode(fsdp_ctx *ctx, fsdp_llama_cache *cache, const int32_t *tokens,
                              int64_t n, const float **logits);

/* How fsdp_sample_logits picks a token. Zero fields: greedy. */
typedef struct fsdp_sample_options {
    /* 0 (default): greedy, the largest logit (the first of equal ones); > 0: draw from
     * softmax(logits / temperature) */
    float temperature;
    int64_t top_k; /* 0 (default): the whole vocabulary; k > 0: only the k largest logits */
    uint64_t seed; /* with draw, picks the random number: the same (seed, draw), the same token */
} fsdp_sample_options;

/* A token from logits (n of them, finite) into *token: greedy, or the draw-th random choice of
 * seed, u = fsdp_rng_uniform(seed, fsdp_rng_stream("fsdp/sample"), draw) in [0, 1), taken
 * through the cumulative probabilities of the kept logits in decreasing order (ties by index),
 * computed in double. Deterministic: no state besides the arguments. opts may be NULL
 * (greedy). FSDP_ERR_INVALID_ARGUMENT for n < 1, a negative or non-finite temperature, a
 * negative top_k or a logit that is NaN or infinite. */
fsdp_status fsdp_sample_logits(fsdp_ctx *ctx, const float *logits, int64_t n,
                               const fsdp_sample_options *opts, uint64_t draw, int32_t *token);

#ifdef __cplusplus
}
#endif
#endif
