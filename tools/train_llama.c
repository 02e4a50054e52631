/* train_llama.c: fsdp-train's Llama (kind_llama.c): fsdp_model_llama's config from the [model]
 * keys, and one rank's sequences of a token file fed through it for a step or an
 * evaluation. */
#include "train_llama.h"

#include "train_device.h" // defines: train_device_mirror

#include <fnmatch.h> // defines: fnmatch
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Returns the status of expr when it fails. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        fsdp_status try_st_ = (expr);                                                              \
        if (try_st_ != FSDP_OK) return try_st_;                                                    \
    } while (0)

struct train_llama {
    const train_config *cfg;
    const train_tokens *tokens;
    fsdp_group *dp;     /* borrowed */
    int dp_size;        /* data-parallel ranks */
    bool loss_parallel; /* tp > 1: lm_head's output is sharded over the vocabulary */
    int64_t T;          /* max_seq_len */
    int64_t batch;      /* sequences of a forward, over every dp rank */
    int64_t off, len;   /* this rank's rows of every batch */
    int32_t *ids;       /* (len, T) inputs */
    int32_t *targets;   /* (len, T) next tokens */
    fsdp_tensor *input; /* ids as an i32 (len, T) tensor */
    fsdp_tensor *dev;   /* input on the ctx's device (NULL: the CPU's), each forward's */
    fsdp_tensor *sum;   /* (1): a loss share, summed over dp */
};

fsdp_llama_config train_llama_config(const train_config *cfg) {
    return (fsdp_llama_config){
        .dim = cfg->model.dim,
        .n_layers = (int)cfg->model.n_layers,
        .n_heads = (int)cfg->model.n_heads,
        .n_kv_heads = (int)cfg->model.n_kv_heads,
        .vocab_size = cfg->model.vocab_size,
        .ffn_hidden = cfg->model.ffn_hidden,
        .max_seq_len = cfg->model.max_seq_len,
        .norm_eps = (float)cfg->model.norm_eps,
        .rope_theta = (float)cfg->model.rope_theta,
        .rope_scaling = {.type = cfg->model.rope_scaling ? FSDP_LLAMA_ROPE_LLAMA3
                                                         : FSDP_LLAMA_ROPE_DEFAULT,
                         .factor = (float)cfg->model.rope_factor,
                         .low_freq_factor = (float)cfg->model.rope_low_freq_factor,
                         .high_freq_factor = (float)cfg->model.rope_high_freq_factor,
                         .original_max_len = cfg->model.rope_original_max_len},
        .tie_word_embeddings = cfg->model.tie_embeddings,
        .compute_dtype = cfg->model.autocast ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32,
        /* bf16 logits under the bf16 policy, but for tp > 1: loss parallel reads f32 */
        .logits_dtype =
            cfg->model.autocast && cfg->parallel.tp <= 1 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32};
}

/* The config with its defaults filled in (the keys were checked by train_config_check). */
static fsdp_llama_config resolved(const train_config *cfg) {
    fsdp_llama_config c = train_llama_config(cfg);
    if (!c.n_kv_heads) c.n_kv_heads = c.n_heads;
    if (!c.ffn_hidden) c.ffn_hidden = (8 * c.dim / 3 + 255) / 256 * 256;
    return c;
}

int64_t train_llama_param_count(const train_config *cfg) {
    fsdp_llama_config c = resolved(cfg);
    int64_t hd = c.dim / c.n_heads;
    int64_t attn = c.dim * hd * (2 * c.n_heads + 2 * c.n_kv_heads);
    int64_t layer = attn + 3 * c.dim * c.ffn_hidden + 2 * c.dim;
    return (c.tie_word_embeddings ? 1 : 2) * c.vocab_size * c.dim + c.dim + c.n_layers * layer;
}

bool train_llama_checkpointed(const train_config *cfg, int64_t layer, int pattern) {
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING], name[32];
    int n = train_config_checkpoint_patterns(cfg, patterns);
    snprintf(name, sizeof name, "model.layers.%lld", (long long)layer);
    for (int p = 0; p < n; p++)
        if ((pattern < 0 || p == pattern) && fnmatch(patterns[p], name, 0) == 0) return true;
    return false;
}

void train_llama_describe(const train_config *cfg, char *buf, size_t size) {
    fsdp_llama_config c = resolved(cfg);
    char ckpt[64] = "";
    int n_ckpt = 0;
    for (int i = 0; i < c.n_layers; i++) n_ckpt += train_llama_checkpointed(cfg, i, -1);
    if (n_ckpt) snprintf(ckpt, sizeof ckpt, ", activations of %d checkpointed", n_ckpt);
    snprintf(buf, size,
             "Llama dim %lld, %d layer%s, %d heads (%d key/value), ffn %lld, vocab %lld, "
             "sequences of %lld (%lld parameters%s)",
             (long long)c.dim, c.n_layers, c.n_layers == 1 ? "" : "s", c.n_heads, c.n_kv_heads,
             (long long)c.ffn_hidden, (long long)c.vocab_size, (long long)c.max_seq_len,
             (long long)train_llama_param_count(cfg), ckpt);
}

fsdp_status train_llama_create(fsdp_ctx *ctx, const train_config *cfg, const train_tokens *tokens,
                               int64_t batch, fsdp_group *dp, int dp_size, int dp_rank, int tp_size,
                               int tp_rank, train_llama **out, fsdp_tensor **dout) {
    train_llama *l = calloc(1, sizeof *l);
    if (!l)
        return fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY,
                                  "out of memory for the Llama's state");
    *out = l;
    l->cfg = cfg;
    l->tokens = tokens;
    l->dp = dp;
    l->dp_size = dp_size;
    l->loss_parallel = tp_size > 1;
    l->T = cfg->model.max_seq_len;
    l->batch = batch;
    fsdp_chunk_range(batch, dp_size, dp_rank, &l->off, &l->len);
    size_t n = (size_t)(l->len * l->T);
    l->ids = malloc(n * sizeof *l->ids);
    l->targets = malloc(n * sizeof *l->targets);
    if (!l->ids || !l->targets)
        return fsdp_ctx_set_error(ctx, FSDP_ERR_OUT_OF_MEMORY,
                                  "out of memory for a batch of tokens");
    TRY(fsdp_tensor_from_blob(ctx, l->ids, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){l->len, l->T},
                              &l->input));
    TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){1}, &l->sum));
    TRY(train_device_mirror(ctx, l->input, &l->dev));
    int64_t voff, vlen; /* lm_head's rows on this tp rank */
    fsdp_chunk_range(cfg->model.vocab_size, tp_size, tp_rank, &voff, &vlen);
    /* The gradient's dtype follows the logits', unless the trainer rescales it (train_step in
     * trainer.c: by len dp / batch_size, 1 / grad_accum for a Llama, whose slices are even),
     * which fsdp_loss_scale_grad does in f32: then f32, which lm_head rounds to bf16 after the
     * scaling, as under f32 logits (the same bits either way). */
    bool bf16 = train_llama_config(cfg).logits_dtype == FSDP_DTYPE_BF16 &&
                (double)l->len * dp_size / (double)cfg->data.batch_size == 1.0;
    return fsdp_tensor_create(ctx, bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32, fsdp_ctx_device(ctx), 3,
                              (int64_t[]){l->len, l->T, vlen}, dout);
}

void train_llama_free(train_llama *l) {
    if (!l) return;
    fsdp_tensor_free(l->input);
    fsdp_tensor_free(l->dev);
    fsdp_tensor_free(l->sum);
    free(l->ids);
    free(l->targets);
    free(l);
}

/* Row r of the slice: the sequence that starts at token `start`. */
static void fill_row(train_llama *l, int64_t r, int64_t start) {
    /* ids below vocab_size (checked at load): the same values as int32 */
    train_tokens_read(l->tokens, start, l->T, (uint32_t *)(l->ids + r * l->T));
    train_tokens_read(l->tokens, start + 1, l->T, (uint32_t *)(l->targets + r * l->T));
}

/* Forward of the filled slice and its mean loss (dout may be NULL). */
static fsdp_status forward_loss(fsdp_ctx *ctx, train_llama *l, fsdp_module *model,
                                fsdp_tensor *dout, float *loss) {
    const fsdp_tensor *logits = NULL;
    if (l->dev && l->len > 0) TRY(fsdp_tensor_copy(ctx, l->dev, l->input)); /* once per forward */
    TRY(fsdp_module_forward(ctx, model, l->dev ? l->dev : l->input, &logits));
    return l->loss_parallel ? fsdp_loss_parallel_cross_entropy(ctx, logits, l->targets,
                                                               FSDP_IGNORE_INDEX, loss, dout)
                            : fsdp_loss_cross_entropy_ignore(ctx, logits, l->targets,
                                                             FSDP_IGNORE_INDEX, loss, dout);
}

fsdp_status train_llama_forward_loss(fsdp_ctx *ctx, train_llama *l, fsdp_module *model, int64_t k0,
                                     fsdp_tensor *dout, float *loss) {
    for (int64_t r = 0; r < l->len; r++)
        fill_row(l, r, train_tokens_train_start(l->cfg, l->tokens, k0 + l->off + r));
    return forward_loss(ctx, l, model, dout, loss);
}

fsdp_status train_llama_loss(fsdp_ctx *ctx, train_llama *l, fsdp_module *model, bool held_out,
                             double *loss) {
    int64_t B = l->batch;
    int64_t n = held_out ? l->tokens->n_eval : l->tokens->n_probe; /* a multiple of B */
    double share = 0;
    for (int64_t b0 = 0; b0 < n; b0 += B) {
        for (int64_t r = 0; r < l->len; r++) {
            int64_t j = b0 + l->off + r;
            fill_row(l, r,
                     held_out ? train_tokens_eval_start(l->cfg, l->tokens, j)
                              : train_tokens_probe_start(l->cfg, l->tokens, j));
        }
        float batch = 0;
        TRY(forward_loss(ctx, l, model, NULL, &batch));
        share += (double)batch * (double)l->len / (double)n; /* every batch is whole */
    }
    if (l->dp_size == 1) {
        *loss = share;
        return FSDP_OK;
    }
    fsdp_tensor_f32(l->sum)[0] = (float)share;
    TRY(fsdp_all_reduce(ctx, l->dp, l->sum, FSDP_REDUCE_SUM));
    *loss = fsdp_tensor_f32(l->sum)[0];
    return FSDP_OK;
}
