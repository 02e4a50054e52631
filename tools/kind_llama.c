/* kind_llama.c: [model] kind = llama: fsdp_model_llama over [model] dim, n_layers, ... with
 * Hugging Face's names, torchtitan's plan over tp with loss parallel, a unit per decoder layer,
 * activation checkpointing per decoder layer, trained on a token file (train_llama.h,
 * train_tokens.h); its checkpoints keep Hugging Face's config.json. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_kind.h"   // defines: train_kind
#include "train_llama.h"  // defines: train_llama_create, train_llama_forward_loss,
                          // train_llama_adopt_init
#include "train_tokens.h" // defines: train_tokens_load

#include "train_estimate.h" // defines: train_estimate_llama

static const char *const g_rope_scalings[] = {"none", "llama3", NULL};
static const char *const g_autocasts[] = {"f32", "bf16", NULL};

static const train_key g_keys[] = {
    INT_KEY("model", "dim", model.dim, "64", 2, TRAIN_WIDTH_MAX,
            "hidden size (Hugging Face's hidden_size); n_heads divides it into heads of "
            "an even size"),
    INT_KEY("model", "n_layers", model.n_layers, "2", 1, 1024,
            "decoder layers (num_hidden_layers)"),
    INT_KEY("model", "n_heads", model.n_heads, "4", 1, 4096,
            "query heads (num_attention_heads); tp must divide it"),
    INT_KEY("model", "n_kv_heads", model.n_kv_heads, "0", 0, 4096,
            "key/value heads (num_key_value_heads), dividing n_heads (grouped-query "
            "attention); 0: n_heads. tp must divide it"),
    INT_KEY("model", "vocab_size", model.vocab_size, "256", 2, INT64_C(1) << 24,
            "tokens of the vocabulary (256 for the byte tokenizer of "
            "tools/text_to_tokens.py); every id of the token file must be below it; the "
            "embedding and lm_head split it over tp (unevenly when tp does not divide it)"),
    INT_KEY("model", "ffn_hidden", model.ffn_hidden, "0", 0, INT64_C(1) << 24,
            "SwiGLU width (intermediate_size); 0: Meta's rule, 8 dim / 3 rounded up to a "
            "multiple of 256. tp must divide it"),
    INT_KEY("model", "max_seq_len", model.max_seq_len, "64", 1, 65536,
            "the sequence length trained on (max_position_embeddings): each sequence "
            "is max_seq_len + 1 tokens of the token file, inputs and next-token targets"),
    FLOAT_KEY("model", "norm_eps", model.norm_eps, "1e-06", 0, EXCL, 1, EXCL,
              "RMSNorm epsilon (rms_norm_eps)"),
    FLOAT_KEY("model", "rope_theta", model.rope_theta, "10000", 1, EXCL, 1e30, INCL,
              "base of the rotary embedding (rope_theta)"),
    BOOL_KEY("model", "tie_embeddings", model.tie_embeddings, "false",
             "lm_head shares model.embed_tokens.weight (tie_word_embeddings): one parameter, "
             "saved once; the root FSDP unit holds both uses"),
    ENUM_KEY("model", "rope_scaling", model.rope_scaling, "none", g_rope_scalings, NULL,
             "scaling of the rotary frequencies (rope_scaling's rope_type): none, or llama3 "
             "(Llama 3.1 and 3.2's, over rope_factor, rope_low_freq_factor, "
             "rope_high_freq_factor and rope_original_max_len)"),
    FLOAT_KEY("model", "rope_factor", model.rope_factor, "8", 1, INCL, 1e30, INCL,
              "rope_scaling = llama3: the low frequencies' divisor (factor)"),
    FLOAT_KEY("model", "rope_low_freq_factor", model.rope_low_freq_factor, "1", 0, EXCL, 1e30, INCL,
              "rope_scaling = llama3: low_freq_factor"),
    FLOAT_KEY("model", "rope_high_freq_factor", model.rope_high_freq_factor, "4", 0, EXCL, 1e30,
              INCL, "rope_scaling = llama3: high_freq_factor, above rope_low_freq_factor"),
    INT_KEY("model", "rope_original_max_len", model.rope_original_max_len, "8192", 1,
            INT64_C(1) << 24,
            "rope_scaling = llama3: the context length the model was pretrained on "
            "(original_max_position_embeddings)"),
    ENUM_KEY("model", "autocast", model.autocast, "f32", g_autocasts, NULL,
             "the compute policy (fsdp_llama_config.compute_dtype): f32, or bf16 (every "
             "Linear's GEMMs on bf16 inputs with f32 accumulation, their outputs rounded to "
             "bf16, the MLP's and q/k's activations kept in bf16 tensors, and at tp 1 the "
             "logits (logits_dtype bf16: the loss computes in f32 on them and writes a bf16 "
             "gradient, f32 where the trainer rescales it); norms, attention, loss and optimizer "
             "f32, master weights f32)"),

};

/* tp must divide the count a Llama key names (heads, key/value heads, the SwiGLU width). */
static bool llama_tp_divides(const train_config *cfg, const char *name, int64_t count,
                             const char *what, char *err, size_t err_size) {
    int64_t tp = cfg->parallel.tp;
    if (count % tp == 0) return false;
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    snprintf(err, err_size,
             "%s must divide %s: %lld %s, which the tensor-parallel ranks split between them; "
             "use a tp that divides %lld, or change %s",
             train_config_key_text(cfg, "parallel", "tp", a, sizeof a),
             train_config_key_text(cfg, "model", name, b, sizeof b), (long long)count, what,
             (long long)count, name);
    return true;
}

/* llama: every checkpoint_activations pattern matches a decoder layer. */
static fsdp_status check_llama_checkpointing(const train_config *cfg, char *err, size_t err_size) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING], key[TRAIN_KEY_TEXT_SIZE];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    for (int p = 0; p < n; p++) {
        bool matched = false;
        for (int64_t i = 0; i < cfg->model.n_layers && !matched; i++)
            matched = train_llama_checkpointed(cfg, i, p);
        if (matched) continue;
        snprintf(err, err_size,
                 "%s: pattern '%s' matches no decoder layer of the Llama; they are "
                 "model.layers.0 to model.layers.%lld: use model.layers.* for every one",
                 train_config_key_text(cfg, "model", "checkpoint_activations", key, sizeof key),
                 patterns[p], (long long)cfg->model.n_layers - 1);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* The heads and tp fit; every checkpoint_activations pattern names a decoder layer. */
static fsdp_status llama_check(const train_config *cfg, char *err, size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE];
    int64_t dim = cfg->model.dim, heads = cfg->model.n_heads;
    if (dim % heads != 0 || (dim / heads) % 2 != 0) {
        snprintf(err, err_size,
                 "%s must divide %s into heads of an even size (the rotary embedding rotates "
                 "pairs of a head's dimensions), but %lld / %lld is %s; pick n_heads so that "
                 "dim / n_heads is an even integer",
                 train_config_key_text(cfg, "model", "n_heads", a, sizeof a),
                 train_config_key_text(cfg, "model", "dim", b, sizeof b), (long long)dim,
                 (long long)heads, dim % heads ? "not an integer" : "odd");
        return FSDP_ERR_CONFIG;
    }
    int64_t kv = cfg->model.n_kv_heads ? cfg->model.n_kv_heads : heads;
    if (heads % kv != 0) {
        snprintf(err, err_size,
                 "%s must divide %s: each key/value head serves n_heads / n_kv_heads query "
                 "heads; use a divisor of %lld (or 0 for n_heads)",
                 train_config_key_text(cfg, "model", "n_kv_heads", a, sizeof a),
                 train_config_key_text(cfg, "model", "n_heads", b, sizeof b), (long long)heads);
        return FSDP_ERR_CONFIG;
    }
    if (cfg->model.rope_scaling &&
        cfg->model.rope_high_freq_factor <= cfg->model.rope_low_freq_factor) {
        snprintf(err, err_size,
                 "%s must be above %s (llama3's frequencies between the two "
                 "wavelength bounds are interpolated)",
                 train_config_key_text(cfg, "model", "rope_high_freq_factor", a, sizeof a),
                 train_config_key_text(cfg, "model", "rope_low_freq_factor", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    static const char *const rope_keys[] = {"rope_factor", "rope_low_freq_factor",
                                            "rope_high_freq_factor", "rope_original_max_len"};
    for (int i = 0; i < 4; i++)
        if (train_config_key_not_for(cfg, "model", rope_keys[i], cfg->model.rope_scaling != 0,
                                     "rope_scaling = llama3", "model", "rope_scaling", err,
                                     err_size))
            return FSDP_ERR_CONFIG;
    int64_t ffn = cfg->model.ffn_hidden ? cfg->model.ffn_hidden : (8 * dim / 3 + 255) / 256 * 256;
    if (llama_tp_divides(cfg, "n_heads", heads, "query heads", err, err_size) ||
        llama_tp_divides(cfg, "n_kv_heads", kv, "key/value heads", err, err_size) ||
        llama_tp_divides(cfg, "ffn_hidden", ffn, "SwiGLU width", err, err_size))
        return FSDP_ERR_CONFIG;
    return check_llama_checkpointing(cfg, err, err_size);
}

/* Every dp rank gets the same number of sequences. */
static fsdp_status llama_check_layout(const train_config *cfg, const train_layout *l, char *err,
                                      size_t err_size) {
    char a[TRAIN_KEY_TEXT_SIZE], b[TRAIN_KEY_TEXT_SIZE], w[TRAIN_KEY_TEXT_SIZE + 64];
    int64_t micro = cfg->data.batch_size / cfg->train.grad_accum;
    int tp = l->tp;
    train_config_describe_world(cfg, l->world, w, sizeof w);
    if (micro % l->dp != 0) {
        snprintf(err, err_size,
                 "%s (in micro-batches of %lld, %s) does not split evenly over the %d "
                 "data-parallel ranks (dp = world / tp, %s and tp %d); a Llama run gives every "
                 "dp rank the same number of sequences: use a multiple of %lld",
                 train_config_key_text(cfg, "data", "batch_size", a, sizeof a), (long long)micro,
                 train_config_key_text(cfg, "train", "grad_accum", b, sizeof b), l->dp, w, tp,
                 (long long)l->dp * cfg->train.grad_accum);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

static int64_t llama_tokens_per_sample(const train_config *cfg) {
    return cfg->model.max_seq_len;
}

/* A sequence of max_seq_len tokens at fsdp_llama_flops_per_token's count each. */
static fsdp_status llama_flops_per_sample(fsdp_ctx *ctx, const train_config *cfg, double *out) {
    fsdp_llama_config c = train_llama_config(cfg);
    TRAIN_TRY(fsdp_llama_flops_per_token(ctx, &c, cfg->model.max_seq_len, out));
    *out *= (double)cfg->model.max_seq_len;
    return FSDP_OK;
}

/* shape_only: the same layers at the smallest sizes. */
static fsdp_status llama_build(fsdp_ctx *ctx, const train_config *cfg, bool shape_only,
                               fsdp_module **out) {
    fsdp_llama_config c = train_llama_config(cfg);
    if (shape_only)
        c = (fsdp_llama_config){.dim = 2,
                                .n_layers = c.n_layers,
                                .n_heads = 1,
                                .n_kv_heads = 1,
                                .vocab_size = 2,
                                .ffn_hidden = 1,
                                .max_seq_len = 1,
                                .norm_eps = c.norm_eps,
                                .rope_theta = c.rope_theta};
    TRAIN_TRY(fsdp_model_llama(ctx, &c, out));
    if (shape_only || fsdp_ctx_seed(ctx) == (uint64_t)cfg->train.seed) return FSDP_OK;
    return fsdp_module_reset_parameters(ctx, *out, (uint64_t)cfg->train.seed);
}

/* The decoder layers, model.layers.<i>. */
static int llama_checkpointable(fsdp_module *model, fsdp_module **out, int max) {
    fsdp_module *layers = fsdp_module_find(model, "model.layers");
    int n = layers ? fsdp_module_num_children(layers) : 0;
    for (int i = 0; i < n && i < max; i++) out[i] = fsdp_module_child(layers, i);
    return n < max ? n : max;
}

/* torchtitan's plan with loss parallel. */
static fsdp_status llama_parallelize(fsdp_ctx *ctx, const train_config *cfg, fsdp_module *model,
                                     const fsdp_mesh *tp) {
    fsdp_llama_config c = train_llama_config(cfg);
    fsdp_tp_plan_entry plan[FSDP_LLAMA_TP_PLAN_LEN];
    int n = 0;
    TRAIN_TRY(fsdp_llama_tp_plan(ctx, &c, fsdp_mesh_size(tp, 0), true, plan, &n));
    fsdp_tp_options o = {.src_rank = cfg->parallel.sync_module_states ? 0 : FSDP_NO_SRC_RANK};
    return fsdp_tp_parallelize(ctx, model, tp, n, plan, &o);
}

/* wrap = layer: a unit per decoder layer. */
static void llama_wrap_layers(fsdp_module *model, fsdp_fully_shard_options *o, const char **storage,
                              int max) {
    (void)model;
    (void)max;
    storage[0] = TRAIN_LLAMA_LAYER_KIND;
    o->wrap_kinds = storage;
    o->n_wrap_kinds = 1;
}

static fsdp_status llama_load(const train_config *cfg, void **input, char *err, size_t err_size) {
    train_tokens *t = calloc(1, sizeof *t);
    *input = t;
    if (!t) {
        snprintf(err, err_size, "out of memory for the token file");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    return train_tokens_load(cfg, t, err, err_size);
}

static void llama_unload(void *input) {
    train_tokens_free(input);
    free(input);
}

/* A rank's sequences. */
typedef struct llama_feed {
    const train_tokens *tokens;
    train_llama *llama;
    fsdp_tensor *dout; /* (len, max_seq_len, local vocab) */
} llama_feed;

static fsdp_status llama_feed_create(fsdp_ctx *ctx, const train_rank_env *env, void **feed,
                                     train_feed_info *info) {
    llama_feed *f = calloc(1, sizeof *f);
    if (!f) return fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory");
    *feed = f;
    f->tokens = env->input;
    int64_t off, len;
    fsdp_chunk_range(env->micro, env->layout->dp, env->dp_rank, &off, &len);
    *info = (train_feed_info){.n_train = f->tokens->n_probe,
                              .n_eval = f->tokens->n_eval,
                              .len = len,
                              .train_part = "probe sequences of the training tokens"};
    return train_llama_create(ctx, env->cfg, f->tokens, env->micro, env->dp, env->layout->dp,
                              env->dp_rank, env->layout->tp, env->tp_rank, &f->llama, &f->dout);
}

static void llama_feed_free(void *feed) {
    llama_feed *f = feed;
    if (!f) return;
    train_llama_free(f->llama);
    fsdp_tensor_free(f->dout);
    free(f);
}

static fsdp_status llama_step(fsdp_ctx *ctx, void *feed, fsdp_module *model, int64_t k0,
                              float *loss, fsdp_tensor **dout) {
    llama_feed *f = feed;
    *dout = f->dout;
    return train_llama_forward_loss(ctx, f->llama, model, k0, f->dout, loss);
}

/* [0, n_train): the probe sequences; else the held-out ones. */
static fsdp_status llama_loss(fsdp_ctx *ctx, void *feed, fsdp_module *model, bool held_out,
                              double *loss, double *accuracy) {
    *accuracy = NAN;
    return train_llama_loss(ctx, ((llama_feed *)feed)->llama, model, held_out, loss);
}

/* The model and data lines of a Llama run. */
static void llama_banner(const train_config *cfg, const void *feed, FILE *out) {
    char model[256];
    const train_tokens *t = ((const llama_feed *)feed)->tokens;
    train_llama_describe(cfg, model, sizeof model);
    fprintf(out, "%s\n", model);
    fprintf(out,
            "data: %s, %lld tokens (%lld held out), batches of %lld sequences (%lld tokens); "
            "unigram entropy %.4f nats/token (perplexity %.2f)\n",
            cfg->data.path, (long long)t->count, (long long)(t->count - t->n_train),
            (long long)cfg->data.batch_size,
            (long long)(cfg->data.batch_size * cfg->model.max_seq_len), t->entropy,
            exp(t->entropy));
}

static void llama_done(const train_config *cfg, const void *feed, FILE *out, double first_loss,
                       double last_loss) {
    (void)cfg;
    const train_tokens *t = ((const llama_feed *)feed)->tokens;
    fprintf(out,
            "; probe-sequence loss %.6f -> %.6f, %.1fx lower; %.4f nats/token %s the unigram "
            "entropy %.4f\n",
            first_loss, last_loss, first_loss / fmax(last_loss, 1e-30),
            fabs(last_loss - t->entropy), last_loss < t->entropy ? "below" : "above", t->entropy);
}

/* The model's shape as Hugging Face writes it, so that a checkpoint of the run exports as a
 * model directory transformers loads. */
static fsdp_status llama_export_config(fsdp_ctx *ctx, const train_config *cfg, char **json) {
    fsdp_llama_config lc = train_llama_config(cfg);
    return fsdp_llama_config_to_hf_json(ctx, &lc, json);
}

const train_kind train_kind_llama = {
    .name = "llama",
    .help = "a Llama-style decoder with Hugging Face's names over dim, n_layers, n_heads, ...; "
            "needs [data] kind = tokens",
    .keys = g_keys,
    .n_keys = (int)(sizeof g_keys / sizeof g_keys[0]),
    .data_kinds = 1u << TRAIN_DATA_TOKENS,
    .data_advice = "a Llama model trains on a token file; set [data] kind = tokens and [data] path",
    .tokens_per_sample = llama_tokens_per_sample,
    .flops_per_sample = llama_flops_per_sample,
    .adopt_init = train_llama_adopt_init,
    .state_advice = "Hugging Face's LlamaForCausalLM names (model.embed_tokens.weight, "
                    "model.layers.<i>.self_attn.q_proj.weight, ..., model.norm.weight, "
                    "lm_head.weight)",
    .shape_keys = "dim, n_layers, n_heads, n_kv_heads, vocab_size and ffn_hidden",
    .check = llama_check,
    .check_layout = llama_check_layout,
    .build = llama_build,
    .checkpointable = llama_checkpointable,
    .parallelize = llama_parallelize,
    .wrap_layers = llama_wrap_layers,
    .load = llama_load,
    .unload = llama_unload,
    .feed_create = llama_feed_create,
    .feed_free = llama_feed_free,
    .step = llama_step,
    .loss = llama_loss,
    .banner = llama_banner,
    .done = llama_done,
    .export_config = llama_export_config,
    .estimate = train_estimate_llama,
};
