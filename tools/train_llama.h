/* train_llama.h: fsdp-train's [model] kind = llama (kind_llama.c): the model's config, and what
 * one rank does with a token file's sequences: a step's forward and loss (loss parallel over
 * tp), and the loss over the held-out or probe sequences. FSDP and the optimizer stay the
 * trainer's. */
#ifndef FSDP_TOOLS_TRAIN_LLAMA_H
#define FSDP_TOOLS_TRAIN_LLAMA_H

#include "train_config.h"
#include "train_tokens.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The module kind FSDP wraps as a unit per decoder layer ([parallel] wrap = layer). */
#define TRAIN_LLAMA_LAYER_KIND "LlamaDecoderLayer"

/* The fsdp_llama_config of the [model] keys. */
fsdp_llama_config train_llama_config(const train_config *cfg);

/* The model's parameters, whatever the layout. */
int64_t train_llama_param_count(const train_config *cfg);

/* "Llama dim 64, 2 layers, 4 heads (4 key/value), ffn 256, vocab 256, sequences of 64 (N
 * parameters)" into buf. */
void train_llama_describe(const train_config *cfg, char *buf, size_t size);

/* Whether decoder layer `layer` (model.layers.<layer>) matches pattern number `pattern` of
 * [model] checkpoint_activations, or any of them when pattern < 0. */
bool train_llama_checkpointed(const train_config *cfg, int64_t layer, int pattern);

/* What one rank holds to feed the model: its slice [off, off + len) of every (micro-)batch of
 * `batch` sequences (batch_size / grad_accum), as (len, max_seq_len) token ids and next-token
 * targets. */
typedef struct train_llama train_llama;

/* tokens and dp (the data-parallel group) are borrowed and must outlive the state. *dout
 * receives a new (len, max_seq_len, local vocab) tensor for the logits' gradient (the
 * caller's). The model's inputs and dout are on the ctx's device (fsdp_ctx_device); the token
 * ids are read on the host and uploaded at each forward. */
fsdp_status train_llama_create(fsdp_ctx *ctx, const train_config *cfg, const train_tokens *tokens,
                               int64_t batch, fsdp_group *dp, int dp_size, int dp_rank, int tp_size,
                               int tp_rank, train_llama **out, fsdp_tensor **dout);
void train_llama_free(train_llama *l);

/* The forward of the (micro-)batch that starts at position k0 of the training stream, and its
 * loss: *loss is the mean cross-entropy over this rank's len * max_seq_len targets (0 when len
 * is 0) and dout its gradient (scaled by the caller). */
fsdp_status train_llama_forward_loss(fsdp_ctx *ctx, train_llama *l, fsdp_module *model, int64_t k0,
                                     fsdp_tensor *dout, float *loss);

/* The mean loss over the held-out sequences (held_out) or the probe sequences of the training
 * tokens, `batch` sequences at a time, each dp rank on its slice; the same on every rank (one
 * all_reduce over dp). */
fsdp_status train_llama_loss(fsdp_ctx *ctx, train_llama *l, fsdp_module *model, bool held_out,
                             double *loss);

/* [model] init = <Hugging Face model directory>: the [model] keys from its config.json
 * (kind_llama_init.c; train_kind.h's adopt_init). */
fsdp_status train_llama_adopt_init(train_config *cfg, bool *changed, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif
