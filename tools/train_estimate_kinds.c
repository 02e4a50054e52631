/* train_estimate_kinds.c: what each model kind tells fsdp-train --plan about its model on one rank
 * (train_kind.estimate, train_estimate.h): its parameters by FSDP unit with their local sizes
 * under tensor parallelism, the activation bytes a forward keeps, and its collectives on tp,
 * written from the layers' own buffers (src/nn) and the TP styles' redistributions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_estimate.h"
#include "train_kind.h"  // defines: train_kind
#include "train_llama.h" // defines: train_llama_config
#include "train_plan.h"  // defines: train_plan_styles_list

/* What fsdp_module_activation_bytes leaves out, for every kind. */
static const char g_act_note[] =
    "the layers' forward buffers (outputs and what they keep for backward), as "
    "fsdp_module_activation_bytes counts them; not counted: the model input, the loss's "
    "buffers, backward's gradient buffers and the tensors TP's hooks own (redistributed "
    "activations)";

static int64_t chunk_len(int64_t n, int parts, int index) {
    int64_t off, len;
    fsdp_chunk_range(n, parts, index, &off, &len);
    return len;
}

static fsdp_status out_of_memory(char *err, size_t err_size) {
    snprintf(err, err_size, "--plan: out of memory");
    return FSDP_ERR_OUT_OF_MEMORY;
}

/* ---- the kinds made of Linear layers (mlp, mlp_stacked) -------------------------------------- */

/* One module of the chain the MLP kinds run: a Linear (in -> out), an element-wise activation or
 * an RMSNorm (over `in`); `group` is the checkpointable module it is in (its name in `names`),
 * `unit` its FSDP unit. */
typedef struct chain_mod {
    char kind; /* 'L', 'A', 'N' */
    int64_t in, out;
    int group, unit;
} chain_mod;

#define CHAIN_MAX (3 * TRAIN_MAX_LAYERS)

typedef struct chain {
    chain_mod mods[CHAIN_MAX];
    int n;
    char names[TRAIN_MAX_LAYERS][32]; /* the checkpointable modules' names */
    int n_groups;
    bool nested; /* the checkpointable modules hold the chain's modules (else they are them) */
} chain;

/* Adds the chain's parameters, activations and tp collectives to m. The Linear layers take the
 * styles of [model] tp_plan; a colwise layer's output and a rowwise one's input are split over
 * tp; a rowwise output is all_reduced in forward (its own Partial buffer left behind, the
 * Replicate result the hook's); a colwise input's gradient is all_reduced in backward unless
 * the layer is the first module (no input gradient). A checkpointed module keeps a copy of its
 * output when that output is its own buffer. */
static fsdp_status chain_estimate(const train_kind *kind, const train_config *cfg,
                                  const train_layout *l, int tp_index, int64_t rows, const chain *c,
                                  train_est_model *m, char *err, size_t err_size) {
    train_tp_style styles[TRAIN_MAX_PLAN_LINEAR];
    if (l->tp > 1)
        TRAIN_TRY(train_plan_styles_list(kind, cfg, styles, TRAIN_MAX_PLAN_LINEAR, err, err_size));
    int tp = l->tp, linear = 0;
    int64_t width = c->n ? c->mods[0].in : 0; /* the local width flowing in */
    int64_t group_act[TRAIN_MAX_LAYERS] = {0}, group_out[TRAIN_MAX_LAYERS] = {0};
    for (int i = 0; i < c->n; i++) {
        const chain_mod *d = &c->mods[i];
        int64_t own = 0; /* the output buffer, when the output leaving the module is it */
        if (d->kind == 'L') {
            train_tp_style s = tp > 1 && linear < TRAIN_MAX_PLAN_LINEAR ? styles[linear] : 0;
            int64_t out = s == TRAIN_TP_COLWISE ? chunk_len(d->out, tp, tp_index) : d->out;
            int64_t in = s == TRAIN_TP_ROWWISE ? chunk_len(d->in, tp, tp_index) : d->in;
            bool sharded = s != TRAIN_TP_NONE;
            if (!train_est_param_add(m, d->unit, out * in, sharded) ||
                !train_est_param_add(m, d->unit, out, s == TRAIN_TP_COLWISE))
                return out_of_memory(err, err_size);
            group_act[d->group] += 4 * rows * out;
            own = s == TRAIN_TP_ROWWISE ? 0 : 4 * rows * out;
            if (s == TRAIN_TP_ROWWISE)
                train_est_comm_add(m, false, FSDP_COMM_ALL_REDUCE, FSDP_COMM_PHASE_FORWARD, 1,
                                   4 * rows * d->out);
            if (s == TRAIN_TP_COLWISE && i > 0)
                train_est_comm_add(m, false, FSDP_COMM_ALL_REDUCE, FSDP_COMM_PHASE_BACKWARD, 1,
                                   4 * rows * d->in);
            width = out;
            linear++;
        } else if (d->kind == 'N') {
            if (!train_est_param_add(m, d->unit, d->in, false)) return out_of_memory(err, err_size);
            group_act[d->group] += 4 * (rows * width + rows); /* output and 1 / rms */
            own = 4 * rows * width;
        } else {
            group_act[d->group] += 4 * rows * width;
            own = 4 * rows * width;
        }
        group_out[d->group] = own;
        /* a checkpointed module's recompute runs the post-forward hooks of the modules inside
         * it (their redistributions again), not its own */
        if (d->kind == 'L' && c->nested && tp > 1 && styles[linear - 1] == TRAIN_TP_ROWWISE &&
            train_est_checkpointed(cfg, c->names[d->group], false))
            train_est_comm_add(m, true, FSDP_COMM_ALL_REDUCE, FSDP_COMM_PHASE_BACKWARD, 1,
                               4 * rows * d->out);
    }
    for (int g = 0; g < c->n_groups; g++) {
        m->act_bytes += group_act[g];
        m->act_ckpt_bytes +=
            train_est_checkpointed(cfg, c->names[g], true) ? group_out[g] : group_act[g];
    }
    m->activation_note = g_act_note;
    return FSDP_OK;
}

extern const train_kind train_kind_mlp, train_kind_mlp_stacked;

fsdp_status train_estimate_mlp(const train_config *cfg, const train_layout *l, int tp_index,
                               int64_t rows, train_est_model *m, char *err, size_t err_size) {
    chain *c = calloc(1, sizeof *c);
    if (!c) return out_of_memory(err, err_size);
    const train_int_list *w = &cfg->model.widths;
    int n_linear = w->n - 1;
    bool wrap = cfg->parallel.wrap == TRAIN_WRAP_LAYER;
    if (cfg->model.norm == TRAIN_NORM_RMSNORM)
        c->mods[c->n++] = (chain_mod){'N', w->v[0], w->v[0], c->n_groups++, 0};
    for (int i = 0; i < n_linear; i++) {
        int unit = wrap && i + 1 < n_linear ? i + 1 : 0; /* the root keeps the output layer */
        c->mods[c->n++] = (chain_mod){'L', w->v[i], w->v[i + 1], c->n_groups++, unit};
        if (i + 1 < n_linear) c->mods[c->n++] = (chain_mod){'A', 0, 0, c->n_groups++, 0};
    }
    for (int g = 0; g < c->n_groups; g++) snprintf(c->names[g], sizeof c->names[g], "%d", g);
    fsdp_status st = chain_estimate(&train_kind_mlp, cfg, l, tp_index, rows, c, m, err, err_size);
    free(c);
    return st;
}

fsdp_status train_estimate_mlp_stacked(const train_config *cfg, const train_layout *l, int tp_index,
                                       int64_t rows, train_est_model *m, char *err,
                                       size_t err_size) {
    chain *c = calloc(1, sizeof *c);
    if (!c) return out_of_memory(err, err_size);
    int64_t n = cfg->model.n_layers;
    bool wrap = cfg->parallel.wrap == TRAIN_WRAP_LAYER;
    c->nested = true;
    for (int b = 0; b < n && b < TRAIN_MAX_LAYERS; b++) { /* net1 Linear(10, 16), relu, net2 */
        int unit = wrap && b + 1 < n ? b + 1 : 0;         /* the root keeps the last block */
        c->mods[c->n++] = (chain_mod){'L', 10, 16, c->n_groups, unit};
        c->mods[c->n++] = (chain_mod){'A', 0, 0, c->n_groups, unit};
        c->mods[c->n++] = (chain_mod){'L', 16, 10, c->n_groups, unit};
        snprintf(c->names[c->n_groups], sizeof c->names[0], "layers.%d", b);
        c->n_groups++;
    }
    fsdp_status st =
        chain_estimate(&train_kind_mlp_stacked, cfg, l, tp_index, rows, c, m, err, err_size);
    free(c);
    return st;
}

/* ---- the Llama ---------------------------------------------------------------------------------
 */

/* The bytes a Linear (rows, in -> out, its local weight) keeps under the bf16 compute policy
 * beyond its output (src/nn/linear.c, bf16_forward; each made with fsdp_nn_buffer_dtype, so
 * fsdp_module_activation_bytes counts it): x16, its input rounded to bf16 (rows, in), unless
 * the input is a bf16 tensor, which it keeps as that copy; w16, the weight rounded (out, in);
 * y16, the scratch for the output's and the output gradient's roundings (rows, max(out, in)),
 * unless the Linear gives a bf16 output and is given a bf16 output gradient (no rounding of its
 * own: q_proj, k_proj, gate_proj and up_proj, whose gradients RoPE's and the SwiGLU's backward
 * write rounded). */
static int64_t bf16_linear(int64_t rows, int64_t in, int64_t out, bool bf16_input, bool y16) {
    return 2 * ((bf16_input ? 0 : rows * in) + out * in + (y16 ? rows * (out > in ? out : in) : 0));
}

/* torchtitan's plan (src/tp/llama_plan.c) on the decoder of fsdp_model_llama: per layer the norms
 * run on the sequence shard (SequenceParallel), attention and the MLP on the whole sequence with
 * their heads and hidden width split; the embedding and lm_head split the vocabulary; the loss
 * is parallel over it. */
fsdp_status train_estimate_llama(const train_config *cfg, const train_layout *l, int tp_index,
                                 int64_t rows, train_est_model *m, char *err, size_t err_size) {
    fsdp_ctx *ctx = NULL;
    fsdp_ctx_options o = {.log_level = FSDP_LOG_OFF};
    fsdp_llama_config given = train_llama_config(cfg), c;
    fsdp_status st = fsdp_ctx_create(&o, &ctx);
    if (st == FSDP_OK) st = fsdp_llama_config_resolve(ctx, &given, &c);
    if (st != FSDP_OK)
        snprintf(err, err_size, "--plan: the Llama's configuration: %s",
                 ctx ? fsdp_last_error(ctx) : "out of memory");
    fsdp_ctx_free(ctx);
    if (st != FSDP_OK) return st;
    int tp = l->tp;
    int64_t C = c.dim, hd = c.dim / c.n_heads, T = c.max_seq_len, B = rows;
    int64_t NH = c.n_heads / tp, NKV = c.n_kv_heads / tp, F = c.ffn_hidden / tp;
    int64_t V = chunk_len(c.vocab_size, tp, tp_index), Ts = chunk_len(T, tp, tp_index);
    bool wrap = cfg->parallel.wrap == TRAIN_WRAP_LAYER, sh = tp > 1;
    /* parameters in pre-order: model.embed_tokens, model.layers.<i> (self_attn q, k, v, o; mlp
     * gate, up, down; input_layernorm; post_attention_layernorm), model.norm, lm_head (none when
     * tied: it uses the embedding's) */
    bool ok = train_est_param_add(m, 0, V * C, sh);
    for (int64_t i = 0; ok && i < c.n_layers; i++) {
        int u = wrap ? (int)i + 1 : 0;
        ok = train_est_param_add(m, u, NH * hd * C, sh) &&
             train_est_param_add(m, u, NKV * hd * C, sh) &&
             train_est_param_add(m, u, NKV * hd * C, sh) &&
             train_est_param_add(m, u, C * NH * hd, sh) && train_est_param_add(m, u, F * C, sh) &&
             train_est_param_add(m, u, F * C, sh) && train_est_param_add(m, u, C * F, sh) &&
             train_est_param_add(m, u, C, false) && train_est_param_add(m, u, C, false);
    }
    ok = ok && train_est_param_add(m, 0, C, false);                              /* model.norm */
    if (!c.tie_word_embeddings) ok = ok && train_est_param_add(m, 0, V * C, sh); /* lm_head */
    if (!ok) return out_of_memory(err, err_size);

    /* activations, in floats: each norm its output and 1 / rms per row; attention the q, k, v
     * projections, the rotated q and k, its output, the log-sum-exp and a (2, T, T) scratch;
     * the residual sums h and output; the MLP gate, up, their product and down */
    int64_t norm = B * Ts * C + B * Ts;
    int64_t attn = 2 * B * T * NH * hd + 3 * B * T * NKV * hd + B * T * NH * hd + B * NH * T +
                   2 * T * T + B * T * C;
    int64_t layer = 4 * (2 * norm + attn + 2 * B * Ts * C + 3 * B * T * F + B * T * C);
    int64_t root = 4 * (B * T * C + norm + B * T * V); /* embedding, final norm, logits */
    if (cfg->model.autocast) {
        /* the bf16 policy (docs/models.md, "bf16 activation storage"), in bytes: every Linear
         * sees B T rows (on tp its input is whole: the hooks gather the sequence) and its local
         * shard of the weight (q, k, v, gate, up and lm_head colwise: out split; o and down
         * rowwise: in split); q, k, v, gate and up read their norm's bf16 output (on tp the
         * hooks' gathered copy of it) as their bf16 copy */
        int64_t R = B * T, q = NH * hd, kv = NKV * hd;
        layer += bf16_linear(R, C, q, true, false)    /* q_proj */
                 + bf16_linear(R, C, kv, true, false) /* k_proj */
                 + bf16_linear(R, C, kv, true, false) /* v_proj */
                 + bf16_linear(R, q, C, true, true)   /* o_proj, on the attention's bf16 output */
                 - 2 * R * (q + 2 * kv)        /* q_proj's, k_proj's, v_proj's outputs: bf16 */
                 - 2 * R * (2 * q + kv)        /* the rotated q, k and the output: bf16 */
                 + 4 * 4 * T * (NH + NKV) * hd /* its scratch: one batch widened beyond (2, T, T)
                                                  (kernels.h, FSDP_ATTENTION_BF16_SCRATCH) */
                 + 2 * bf16_linear(R, C, F, true, false) /* gate_proj, up_proj */
                 + bf16_linear(R, F, C, true, true) /* down_proj: reads the SwiGLU's bf16 output */
                 - 2 * 2 * R * F                    /* gate_proj's, up_proj's outputs: bf16 */
                 - 2 * R * F                        /* the SwiGLU's output: bf16 (hidden16) */
                 - 2 * 2 * B * Ts * C;              /* the two norms' outputs: bf16 */
        if (tp == 1) /* o_proj's, down_proj's outputs: bf16 (on tp Rowwise's hook keeps f32) */
            layer -= 2 * 2 * R * C;
        /* lm_head (tied or not: a Linear either way); at tp 1 it reads the final norm's bf16
         * output as its copy (on tp SequenceParallel's and Colwise's hooks keep it f32) */
        root += bf16_linear(R, C, V, tp == 1, true);
        if (tp == 1) root -= 2 * R * C;        /* the final norm's output: bf16 */
        if (c.logits_dtype == FSDP_DTYPE_BF16) /* bf16 logits (tp 1), no y16 scratch */
            root -= 2 * R * V + 2 * R * (V > C ? V : C);
    }
    m->act_bytes = root + c.n_layers * layer;
    m->act_ckpt_bytes = root;
    char name[48];
    int64_t n_ckpt = 0;
    for (int64_t i = 0; i < c.n_layers; i++) {
        snprintf(name, sizeof name, "model.layers.%lld", (long long)i);
        bool ck = train_est_checkpointed(cfg, name, true);
        /* a checkpointed layer keeps a copy of its output (the f32 residual sum) only: its
         * Linears' bf16 copies and scratch are released with the rest of its subtree */
        m->act_ckpt_bytes += ck ? 4 * B * Ts * C : layer;
        n_ckpt += train_est_checkpointed(cfg, name, false);
    }
    m->activation_note = g_act_note;
    if (tp == 1) return FSDP_OK;

    /* on tp, A the bytes of a whole (B, T, C) activation: forward, the embedding's and each
     * rowwise projection's Partial -> Shard(1) reduce_scatter, each attention's, MLP's and
     * lm_head's Shard(1) -> Replicate all_gather, the parallel loss's two all_reduces (per row
     * a max, then a sum and the target's logit); backward the adjoints (lm_head's input
     * gradient reduce_scattered, the rowwise projections' and the embedding's all_gathered), each
     * attention's and MLP's input gradient reduce_scattered once (the sum of its colwise
     * projections' Partial gradients, in f32 under the bf16 policy too: src/tp/block_sum.c),
     * each norm's weight gradient all_reduced
     * (its rows are a shard of the sequence); a checkpointed layer's recompute repeats its
     * attention's and MLP's all_gather and reduce_scatter. */
    int64_t A = 4 * B * T * C, L = c.n_layers;
    /* under the bf16 policy the attention's and MLP's gathered inputs are their norms' bf16
     * outputs: half the bytes (lm_head's, the final norm's output, stays f32) */
    int64_t G = cfg->model.autocast ? A / 2 : A;
    fsdp_comm_phase fw = FSDP_COMM_PHASE_FORWARD, bw = FSDP_COMM_PHASE_BACKWARD;
    train_est_comm_add(m, false, FSDP_COMM_REDUCE_SCATTER, fw, 1 + 2 * L, (1 + 2 * L) * A);
    train_est_comm_add(m, false, FSDP_COMM_ALL_GATHER, fw, 2 * L + 1, 2 * L * G + A);
    train_est_comm_add(m, false, FSDP_COMM_ALL_REDUCE, FSDP_COMM_PHASE_NONE, 2, 12 * B * T);
    train_est_comm_add(m, false, FSDP_COMM_REDUCE_SCATTER, bw, 1 + 2 * L, (1 + 2 * L) * A);
    train_est_comm_add(m, false, FSDP_COMM_ALL_GATHER, bw, 2 * L + 1, (2 * L + 1) * A);
    train_est_comm_add(m, false, FSDP_COMM_ALL_REDUCE, bw, 2 * L + 1, (2 * L + 1) * 4 * C);
    train_est_comm_add(m, true, FSDP_COMM_ALL_GATHER, bw, 2 * n_ckpt, 2 * n_ckpt * G);
    train_est_comm_add(m, true, FSDP_COMM_REDUCE_SCATTER, bw, 2 * n_ckpt, 2 * n_ckpt * A);
    return FSDP_OK;
}
