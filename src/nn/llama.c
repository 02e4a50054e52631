/* llama.c: LlamaDecoderLayer and LlamaForCausalLM with Hugging Face's module and parameter
 * names (the configuration and shared helpers are in llama_common.c). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "fsdp/layers.h"
#include "nn/llama_common.h"
#include "nn/module_impl.h"
#include "nn/nn.h" // defines: fsdp_nn_defer_init, fsdp_nn_rmsnorm_set_bf16_output,
                   // fsdp_nn_rmsnorm_set_grad_residual, fsdp_nn_num_acting_hooks,
                   // fsdp_nn_linear_set_bf16_output, fsdp_nn_llama_set_bf16_branches

/* ---- LlamaDecoderLayer ---- */

typedef struct decoder_layer {
    fsdp_module *self_attn, *mlp, *input_layernorm, *post_attention_layernorm;
    /* ask each norm for a bf16 output when its readers' projections run the bf16 policy (they
     * round it anyway: one rounding, in the norm, instead of one per projection) */
    bool bf16_norms;
    /* ask the attention and the MLP for o_proj's and down_proj's bf16 outputs (bf16 values under
     * the policy), which the residual adds widen as they read them (add_bf16) */
    bool bf16_branches;
    fsdp_tensor *h;      /* (B, T, C) = x + self_attn(input_layernorm(x)) */
    fsdp_tensor *output; /* (B, T, C) = h + mlp(post_attention_layernorm(h)) */
    fsdp_tensor *dh;     /* (B, T, C): dL/dh, when the norm does not add it (norm_backward_add) */
    fsdp_tensor *dinput; /* (B, T, C): dL/dx, the same */
} decoder_layer;

static void decoder_layer_free(void *impl) {
    decoder_layer *d = impl;
    fsdp_tensor_free(d->h);
    fsdp_tensor_free(d->output);
    fsdp_tensor_free(d->dh);
    fsdp_tensor_free(d->dinput);
    free(d);
}

static atomic_llong bf16_adds;

void fsdp_llama_test_bf16_branches(int64_t *adds) {
    int64_t n = atomic_exchange(&bf16_adds, 0);
    if (adds) *adds = n;
}

/* *dst = x + y, shaped like x, on x's device; y f32, or bf16 (widened as read: add_bf16) */
static fsdp_status residual(fsdp_ctx *ctx, const fsdp_module *m, fsdp_tensor **dst,
                            const fsdp_tensor *x, const fsdp_tensor *y) {
    if (!fsdp_tensor_same_shape(x, y)) {
        char desc[160], a[64], b[64];
        return FSDP_FAIL(ctx, FSDP_ERR_SHAPE, "%s: residual %s and branch %s differ in shape",
                         fsdp_nn_describe(m, desc, sizeof desc),
                         fsdp_tensor_shape_string(x, a, sizeof a),
                         fsdp_tensor_shape_string(y, b, sizeof b));
    }
    if (fsdp_tensor_dtype(y) != FSDP_DTYPE_BF16)
        return fsdp_llama_sum_grads(ctx, dst, x, y, NULL, false);
    fsdp_device dev = fsdp_tensor_device(x);
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, dst, dev, fsdp_tensor_ndim(x), fsdp_tensor_shape(x)));
    /* a bf16 branch is given only where the table has add_bf16 (branch_forward) */
    fsdp_kernels_for(dev)->add_bf16(fsdp_tensor_f32(*dst), fsdp_tensor_f32(x), fsdp_tensor_data(y),
                                    fsdp_tensor_numel(x));
    atomic_fetch_add(&bf16_adds, 1);
    return FSDP_OK;
}

/* branch's (the attention's or the MLP's) forward of x into *y, its output asked in bf16 for this
 * call (set: its setter) when bf16, the device's table can add it widened, and no post-forward
 * hook of the branch would read it */
static fsdp_status branch_forward(fsdp_ctx *ctx, fsdp_module *branch,
                                  void (*set)(fsdp_module *, bool), bool bf16, const fsdp_tensor *x,
                                  const fsdp_tensor **y) {
    bf16 = bf16 && fsdp_kernels_for(fsdp_tensor_device(x))->add_bf16 &&
           fsdp_nn_num_acting_hooks(branch, FSDP_HOOK_POST_FORWARD) == 0;
    set(branch, bf16);
    fsdp_status st = fsdp_module_forward(ctx, branch, x, y);
    set(branch, false);
    return FSDP_PASS(ctx, st);
}

/* norm's forward of x into *y, its output asked in bf16 for this call when bf16 */
static fsdp_status norm_forward(fsdp_ctx *ctx, fsdp_module *norm, bool bf16, const fsdp_tensor *x,
                                const fsdp_tensor **y) {
    fsdp_nn_rmsnorm_set_bf16_output(norm, bf16);
    fsdp_status st = fsdp_module_forward(ctx, norm, x, y);
    fsdp_nn_rmsnorm_set_bf16_output(norm, false);
    return FSDP_PASS(ctx, st);
}

static fsdp_status decoder_layer_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                         const fsdp_tensor **out) {
    decoder_layer *d = m->impl;
    const fsdp_tensor *n1, *a, *n2, *f;
    FSDP_TRY_AT(ctx, fsdp_nn_check_input(ctx, m, in, -1));
    bool attn16 = d->bf16_norms && fsdp_llama_attention_reads_bf16(d->self_attn);
    bool mlp16 = d->bf16_norms && fsdp_llama_mlp_reads_bf16(d->mlp);
    FSDP_TRY_AT(ctx, norm_forward(ctx, d->input_layernorm, attn16, in, &n1));
    FSDP_TRY_AT(ctx, branch_forward(ctx, d->self_attn, fsdp_llama_attention_set_bf16_output,
                                    d->bf16_branches, n1, &a));
    FSDP_TRY_AT(ctx, residual(ctx, m, &d->h, in, a));
    FSDP_TRY_AT(ctx, norm_forward(ctx, d->post_attention_layernorm, mlp16, d->h, &n2));
    FSDP_TRY_AT(
        ctx, branch_forward(ctx, d->mlp, fsdp_llama_mlp_set_bf16_output, d->bf16_branches, n2, &f));
    FSDP_TRY_AT(ctx, residual(ctx, m, &d->output, d->h, f));
    *out = d->output;
    return FSDP_OK;
}

static atomic_bool norm_sums_off;
static atomic_llong norm_sums;

void fsdp_llama_test_norm_sums(bool old_path, int64_t *fused) {
    atomic_store(&norm_sums_off, old_path);
    int64_t n = atomic_exchange(&norm_sums, 0);
    if (fused) *fused = n;
}

/* *dsum = dres + norm's input gradient for dy (the residual stream's gradient and the branch's).
 * The norm adds dres in its backward's pass (fsdp_nn_rmsnorm_set_grad_residual, for this call)
 * when the device's table has rmsnorm_backward_add and no acting post-backward hook of the norm
 * would read the sum instead of its own gradient (TP's SequenceParallel has one); otherwise its
 * backward, then the sum into *buf (the path before, the same bits). */
static fsdp_status norm_backward_add(fsdp_ctx *ctx, fsdp_module *norm, const fsdp_tensor *dy,
                                     const fsdp_tensor *dres, fsdp_tensor **buf,
                                     const fsdp_tensor **dsum) {
    bool fuse = fsdp_kernels_for(fsdp_tensor_device(dy))->rmsnorm_backward_add &&
                fsdp_nn_num_acting_hooks(norm, FSDP_HOOK_POST_BACKWARD) == 0 &&
                !atomic_load(&norm_sums_off);
    const fsdp_tensor *dx;
    fsdp_nn_rmsnorm_set_grad_residual(norm, fuse ? dres : NULL);
    fsdp_status st = fsdp_module_backward(ctx, norm, dy, &dx);
    fsdp_nn_rmsnorm_set_grad_residual(norm, NULL);
    FSDP_TRY_AT(ctx, st);
    if (fuse) {
        atomic_fetch_add(&norm_sums, 1);
        *dsum = dx;
        return FSDP_OK;
    }
    FSDP_TRY_AT(ctx, fsdp_llama_sum_grads(ctx, buf, dres, dx, NULL, false));
    *dsum = *buf;
    return FSDP_OK;
}

static fsdp_status decoder_layer_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                          const fsdp_tensor **din) {
    decoder_layer *d = m->impl;
    if (!d->output || !fsdp_tensor_same_shape(dout, d->output))
        return fsdp_llama_no_forward(ctx, m);
    const fsdp_tensor *dn2, *dh, *dn1;
    FSDP_TRY_AT(ctx, fsdp_module_backward(ctx, d->mlp, dout, &dn2));
    FSDP_TRY_AT(ctx, norm_backward_add(ctx, d->post_attention_layernorm, dn2, dout, &d->dh, &dh));
    FSDP_TRY_AT(ctx, fsdp_module_backward(ctx, d->self_attn, dh, &dn1));
    if (!din) return fsdp_module_backward(ctx, d->input_layernorm, dn1, NULL);
    return norm_backward_add(ctx, d->input_layernorm, dn1, dh, &d->dinput, din);
}

static const fsdp_module_ops decoder_layer_ops = {.kind = "LlamaDecoderLayer",
                                                  .forward = decoder_layer_forward,
                                                  .backward = decoder_layer_backward,
                                                  .free_impl = decoder_layer_free};

void fsdp_nn_llama_set_bf16_branches(fsdp_module *m, bool on) {
    if (!m) return;
    if (m->ops == &decoder_layer_ops) ((decoder_layer *)m->impl)->bf16_branches = on;
    for (int i = 0; i < m->n_children; i++) fsdp_nn_llama_set_bf16_branches(m->children[i], on);
}

bool fsdp_llama_decoder_layer_parts(const fsdp_module *m, fsdp_module *parts[4]) {
    if (!m || m->ops != &decoder_layer_ops) return false;
    const decoder_layer *d = m->impl;
    parts[0] = d->input_layernorm, parts[1] = d->self_attn;
    parts[2] = d->post_attention_layernorm, parts[3] = d->mlp;
    return true;
}

/* A norm of c.dim added to parent as name. */
static fsdp_status add_norm(fsdp_ctx *ctx, fsdp_module *parent, const char *name,
                            const fsdp_llama_config *c, fsdp_module **child) {
    fsdp_module *n;
    FSDP_TRY_AT(ctx, fsdp_rmsnorm_create(ctx, c->dim, c->norm_eps, &n));
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, parent, name, n));
    if (child) *child = n;
    return FSDP_OK;
}

/* Children in Hugging Face's registration order (its named_parameters() order). */
static fsdp_status build_decoder_layer(fsdp_ctx *ctx, fsdp_module *m, decoder_layer *d,
                                       const fsdp_llama_config *c) {
    fsdp_module *child;
    FSDP_TRY_AT(ctx, fsdp_llama_attention_create(ctx, c, &child));
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, m, "self_attn", child));
    d->self_attn = child;
    FSDP_TRY_AT(ctx, fsdp_llama_mlp_build(ctx, c->dim, c->ffn_hidden, c->init_std, &child));
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, m, "mlp", child));
    d->mlp = child;
    FSDP_TRY_AT(ctx, add_norm(ctx, m, "input_layernorm", c, &d->input_layernorm));
    return add_norm(ctx, m, "post_attention_layernorm", c, &d->post_attention_layernorm);
}

fsdp_status fsdp_llama_decoder_layer_create(fsdp_ctx *ctx, const fsdp_llama_config *cfg,
                                            fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cfg);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_llama_config c;
    FSDP_TRY_AT(ctx, fsdp_llama_config_resolve(ctx, cfg, &c));
    decoder_layer *d = calloc(1, sizeof *d);
    if (!d) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a LlamaDecoderLayer");
    d->bf16_norms = true, d->bf16_branches = true;
    fsdp_module *m;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &decoder_layer_ops, d, &m));
    fsdp_status st = build_decoder_layer(ctx, m, d, &c);
    if (st == FSDP_OK) st = fsdp_module_set_autocast(ctx, m, c.compute_dtype);
    if (st != FSDP_OK) {
        fsdp_module_free(m);
        return FSDP_PASS(ctx, st);
    }
    *out = m;
    return FSDP_OK;
}

/* ---- LlamaForCausalLM ---- */

/* model (a Sequential: embed_tokens, layers, norm), then lm_head. */
typedef struct causal_lm {
    fsdp_module *model, *norm, *lm_head;
    /* ask model.norm for a bf16 output when lm_head reads bf16 (fsdp_nn_llama_set_bf16_norms) */
    bool bf16_norm;
} causal_lm;

static atomic_llong final_norms16;

int64_t fsdp_llama_test_final_norm16(void) {
    return atomic_exchange(&final_norms16, 0);
}

/* Whether model.norm's output may be bf16 for lm_head: lm_head runs the bf16 policy (it rounds
 * its input to bf16 anyway: one rounding, in the norm, and no copy of its own) and no acting hook
 * would see the bf16 tensor where it saw f32 (model.norm's or model's post-forward, lm_head's
 * pre-forward: tensor parallelism's SequenceParallel and Colwise have them). */
static bool final_norm16(const causal_lm *c) {
    return c->bf16_norm && fsdp_nn_linear_compute(c->lm_head) == FSDP_DTYPE_BF16 &&
           fsdp_nn_num_acting_hooks(c->norm, FSDP_HOOK_POST_FORWARD) == 0 &&
           fsdp_nn_num_acting_hooks(c->model, FSDP_HOOK_POST_FORWARD) == 0 &&
           fsdp_nn_num_acting_hooks(c->lm_head, FSDP_HOOK_PRE_FORWARD) == 0;
}

static fsdp_status causal_lm_forward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                     const fsdp_tensor **out) {
    causal_lm *c = m->impl;
    const fsdp_tensor *h;
    bool norm16 = final_norm16(c);
    fsdp_nn_rmsnorm_set_bf16_output(c->norm, norm16); /* for model's call only */
    fsdp_status st = fsdp_module_forward(ctx, c->model, in, &h);
    fsdp_nn_rmsnorm_set_bf16_output(c->norm, false);
    FSDP_TRY_AT(ctx, st);
    if (fsdp_tensor_dtype(h) == FSDP_DTYPE_BF16) atomic_fetch_add(&final_norms16, 1);
    return fsdp_module_forward(ctx, c->lm_head, h, out);
}

static fsdp_status causal_lm_backward(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                      const fsdp_tensor **din) {
    return fsdp_nn_chain_backward(ctx, m->children, m->n_children, dout, din);
}

static const fsdp_module_ops causal_lm_ops = {.kind = "LlamaForCausalLM",
                                              .forward = causal_lm_forward,
                                              .backward = causal_lm_backward,
                                              .free_impl = free};

void fsdp_nn_llama_set_bf16_norms(fsdp_module *m, bool on) {
    if (!m) return;
    if (m->ops == &decoder_layer_ops) ((decoder_layer *)m->impl)->bf16_norms = on;
    if (m->ops == &causal_lm_ops) ((causal_lm *)m->impl)->bf16_norm = on;
    for (int i = 0; i < m->n_children; i++) fsdp_nn_llama_set_bf16_norms(m->children[i], on);
}

/* model (embed_tokens, layers, norm) then lm_head, the root's children in that order. */
static fsdp_status build_llama(fsdp_ctx *ctx, fsdp_module *root, const fsdp_llama_config *c) {
    causal_lm *lm = root->impl;
    fsdp_module *model, *embed, *layers, *lm_head;
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &model));
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, root, "model", model));
    FSDP_TRY_AT(ctx, fsdp_embedding_create(ctx, c->vocab_size, c->dim, &embed));
    embed->params[0]->init = (fsdp_init){.kind = FSDP_INIT_NORMAL, .a = 0.0f, .b = c->init_std};
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, model, "embed_tokens", embed));
    FSDP_TRY_AT(ctx, fsdp_sequential_create(ctx, &layers));
    FSDP_TRY_AT(ctx, fsdp_module_add_child(ctx, model, "layers", layers));
    for (int i = 0; i < c->n_layers; i++) {
        fsdp_module *layer;
        FSDP_TRY_AT(ctx, fsdp_llama_decoder_layer_create(ctx, c, &layer));
        FSDP_TRY_AT(ctx, fsdp_sequential_append(ctx, layers, layer));
    }
    FSDP_TRY_AT(ctx, add_norm(ctx, model, "norm", c, &lm->norm));
    lm->model = model;
    if (!c->tie_word_embeddings)
        return fsdp_llama_add_proj(ctx, root, "lm_head", c->dim, c->vocab_size, c->init_std,
                                   &lm->lm_head);
    FSDP_TRY_AT(ctx, fsdp_nn_linear_create_tied(ctx, embed->params[0], &lm_head));
    fsdp_status st = fsdp_module_add_child(ctx, root, "lm_head", lm_head);
    if (st != FSDP_OK) fsdp_module_free(lm_head);
    lm->lm_head = lm_head;
    return FSDP_PASS(ctx, st);
}

fsdp_status fsdp_model_llama(fsdp_ctx *ctx, const fsdp_llama_config *cfg, fsdp_module **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cfg);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_llama_config c;
    FSDP_TRY_AT(ctx, fsdp_llama_config_resolve(ctx, cfg, &c));
    if (c.n_layers < 1)
        return fsdp_llama_bad_config(ctx, "n_layers", c.n_layers, "the model needs >= 1");
    if (c.vocab_size < 1)
        return fsdp_llama_bad_config(ctx, "vocab_size", c.vocab_size, "the model needs >= 1");
    causal_lm *lm = calloc(1, sizeof *lm);
    if (!lm) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a LlamaForCausalLM");
    lm->bf16_norm = true;
    fsdp_module *root;
    FSDP_TRY_AT(ctx, fsdp_module_create(ctx, &causal_lm_ops, lm, &root));
    bool deferred = fsdp_nn_defer_init(ctx, true); /* the reset below fills every parameter */
    fsdp_status st = build_llama(ctx, root, &c);
    fsdp_nn_defer_init(ctx, deferred);
    if (st == FSDP_OK) st = fsdp_module_reset_parameters(ctx, root, fsdp_ctx_seed(ctx));
    if (st == FSDP_OK) st = fsdp_module_set_autocast(ctx, root, c.compute_dtype);
    if (st == FSDP_OK && c.logits_dtype == FSDP_DTYPE_BF16) { /* bf16 logits, bf16 dlogits */
        fsdp_module *lm_head = fsdp_module_find(root, "lm_head");
        fsdp_nn_linear_set_bf16_output(lm_head, true);
        fsdp_nn_linear_set_bf16_grad(lm_head, true);
    }
    if (st != FSDP_OK) {
        fsdp_module_free(root);
        return FSDP_PASS(ctx, st);
    }
    *out = root;
    return FSDP_OK;
}
