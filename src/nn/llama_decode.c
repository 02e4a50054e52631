/* llama_decode.c: generation with a Llama: a key/value cache per decoder layer, a prompt fed
 * at once (prefill) and then one token at a time, each position's queries attending to the
 * cached rotated keys and values, the logits of the last position. The layers' own modules run
 * the norms, projections and MLPs; the attention over the cache mirrors the CPU kernel's
 * arithmetic (kernels/cpu/attention.c), so a whole sequence fed at once is the full forward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "nn/llama_common.h"
#include "nn/module_impl.h"

typedef struct cache_layer {
    fsdp_module *attn_norm, *mlp_norm, *mlp;
    fsdp_llama_attention_info a;
    float *k, *v; /* (max_len, NKV * hd): rotated keys and values of the positions fed */
} cache_layer;

struct fsdp_llama_cache {
    fsdp_module *model; /* borrowed */
    fsdp_module *embed, *norm, *lm_head;
    cache_layer *layers;
    int n_layers;
    int64_t dim, vocab, NH, NKV, hd, max_len, len;
    fsdp_tensor *ids;     /* (1, n) i32 of the call, storage for max_len */
    fsdp_tensor *x, *h;   /* (1, n, dim): the residual stream, and after attention */
    fsdp_tensor *q, *att; /* (1, n, NH * hd): rotated queries, attention output */
    fsdp_tensor *rope;    /* (2, n, hd / 2): cos then sin of the call's positions */
    fsdp_tensor *scores;  /* (n, len + n): one head's probabilities */
    float *logits;        /* (vocab): the last position's logits */
};

void fsdp_llama_cache_free(fsdp_llama_cache *c) {
    if (!c) return;
    for (int l = 0; c->layers && l < c->n_layers; l++) {
        free(c->layers[l].k);
        free(c->layers[l].v);
    }
    free(c->layers);
    free(c->logits);
    fsdp_tensor *own[] = {c->ids, c->x, c->h, c->q, c->att, c->rope, c->scores};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) fsdp_tensor_free(own[i]);
    free(c);
}

void fsdp_llama_cache_reset(fsdp_llama_cache *c) {
    if (c) c->len = 0;
}

int64_t fsdp_llama_cache_len(const fsdp_llama_cache *c) {
    return c ? c->len : 0;
}

static fsdp_status not_llama(fsdp_ctx *ctx, const char *what) {
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "fsdp_llama_cache_create: the model is not a fsdp_model_llama (%s); build "
                     "it with fsdp_model_llama",
                     what);
}

/* FSDP_ERR_STATE when a parameter is distributed by tensor parallelism. */
static fsdp_status check_plain(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)user;
    if (!fsdp_nn_param_dist(p)) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_STATE,
                     "fsdp_llama_cache_create: parameter '%s' is distributed by tensor "
                     "parallelism; generate with the plain model on one rank (load the "
                     "checkpoint into a fsdp_model_llama that is not parallelized)",
                     name);
}

/* The weight's rows (dim 0) of a Linear or Embedding child. */
static int64_t rows_of(const fsdp_module *m) {
    const fsdp_param *w = fsdp_nn_is_linear(m) ? fsdp_nn_linear_weight(m) : fsdp_module_param(m, 0);
    return fsdp_tensor_dim(w->data, 0);
}

/* Reads the layers and their sizes from the model's tree. */
static fsdp_status read_model(fsdp_ctx *ctx, fsdp_llama_cache *c, fsdp_module *model) {
    fsdp_module *body = fsdp_module_find(model, "model");
    fsdp_module *layers = fsdp_module_find(model, "model.layers");
    c->embed = fsdp_module_find(model, "model.embed_tokens");
    c->norm = fsdp_module_find(model, "model.norm");
    c->lm_head = fsdp_module_find(model, "lm_head");
    if (fsdp_module_num_children(model) != 2 || !body || fsdp_module_num_children(body) != 3 ||
        !layers || !fsdp_nn_is_embedding(c->embed) || !c->norm || !fsdp_nn_is_linear(c->lm_head))
        return not_llama(ctx, "no model.embed_tokens, model.layers, model.norm and lm_head");
    c->n_layers = fsdp_module_num_children(layers);
    if (c->n_layers < 1) return not_llama(ctx, "no decoder layer");
    if (!(c->layers = calloc((size_t)c->n_layers, sizeof *c->layers)))
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a Llama cache");
    for (int l = 0; l < c->n_layers; l++) {
        fsdp_module *parts[4];
        cache_layer *L = &c->layers[l];
        if (!fsdp_llama_decoder_layer_parts(fsdp_module_child(layers, l), parts) ||
            !fsdp_llama_attention_parts(parts[1], &L->a))
            return not_llama(ctx, "a child of model.layers is not a LlamaDecoderLayer");
        L->attn_norm = parts[0], L->mlp_norm = parts[2], L->mlp = parts[3];
    }
    const fsdp_llama_attention_info *a = &c->layers[0].a;
    c->dim = fsdp_tensor_dim(fsdp_module_param(c->embed, 0)->data, 1);
    c->vocab = rows_of(c->lm_head);
    c->hd = a->head_dim;
    c->NH = rows_of(a->q_proj) / c->hd;
    c->NKV = rows_of(a->k_proj) / c->hd;
    if (rows_of(c->embed) != c->vocab || c->NKV < 1 || c->NH % c->NKV)
        return not_llama(ctx, "its embedding, lm_head or heads do not agree");
    return FSDP_OK;
}

fsdp_status fsdp_llama_cache_create(fsdp_ctx *ctx, fsdp_module *model, int64_t max_len,
                                    fsdp_llama_cache **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, model);
    FSDP_ARG_NOT_NULL(ctx, out);
    FSDP_TRY_AT(ctx, fsdp_nn_check_unmanaged(ctx, model, "fsdp_llama_cache_create"));
    FSDP_TRY_AT(ctx, fsdp_nn_check_on_cpu(ctx, model, "fsdp_llama_cache_create", "generation",
                                          "creating the cache"));
    FSDP_TRY_AT(ctx, fsdp_module_visit_params(ctx, model, check_plain, NULL));
    fsdp_llama_cache *c = calloc(1, sizeof *c);
    if (!c) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate a Llama cache");
    c->model = model;
    fsdp_status st = read_model(ctx, c, model);
    int64_t longest = st == FSDP_OK ? c->layers[0].a.max_seq_len : 0;
    if (st == FSDP_OK && (max_len < 0 || max_len > longest))
        st = FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                       "fsdp_llama_cache_create: max_len %lld is not in [0, max_seq_len %lld]; "
                       "pass 0 for the model's max_seq_len",
                       (long long)max_len, (long long)longest);
    c->max_len = max_len ? max_len : longest;
    size_t kv = (size_t)(c->max_len * c->NKV * c->hd);
    for (int l = 0; st == FSDP_OK && l < c->n_layers; l++) {
        c->layers[l].k = malloc(kv * sizeof(float));
        c->layers[l].v = malloc(kv * sizeof(float));
        if (!c->layers[l].k || !c->layers[l].v)
            st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY,
                           "cannot allocate the key/value cache of %lld positions",
                           (long long)c->max_len);
    }
    if (st == FSDP_OK && !(c->logits = malloc((size_t)c->vocab * sizeof(float))))
        st = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "cannot allocate the logits of a Llama cache");
    if (st == FSDP_OK)
        st = fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){1, c->max_len},
                                &c->ids);
    if (st != FSDP_OK) {
        fsdp_llama_cache_free(c);
        return FSDP_PASS(ctx, st);
    }
    *out = c;
    return FSDP_OK;
}

/* One head's attention of the n queries at positions p0 .. p0 + n - 1 over the keys and values
 * of positions 0 .. p0 + n - 1 (L of them), as the CPU kernel's `probabilities` and its P V
 * product compute them: scores by GEMM, each row's log-sum-exp in double, masked above the
 * diagonal. q, out (n, D) with row stride NH * D; k, v (L, D) with row stride NKV * D. */
static void head_attention(const fsdp_kernels_i *k, float *out, float *P, const float *q,
                           const float *kc, const float *vc, int64_t p0, int64_t n, int64_t NH,
                           int64_t NKV, int64_t D) {
    int64_t L = p0 + n;
    float scale = 1.0f / sqrtf((float)D);
    k->gemm(false, true, n, L, D, scale, q, NH * D, kc, NKV * D, 0.0f, P, L);
    for (int64_t i = 0; i < n; i++) {
        float *row = P + i * L; // (L)
        int64_t last = p0 + i;  /* the keys this query sees: 0 .. last */
        float m = row[0];
        for (int64_t j = 1; j <= last; j++) m = row[j] > m ? row[j] : m;
        double se = exp((double)row[0] - (double)m);
        for (int64_t j = 1; j <= last; j++) se += exp((double)row[j] - (double)m);
        double l = (double)m + log(se);
        for (int64_t j = 0; j <= last; j++) row[j] = (float)exp((double)row[j] - l);
        for (int64_t j = last + 1; j < L; j++) row[j] = 0.0f;
    }
    k->gemm(false, false, n, D, L, 1.0f, P, L, vc, NKV * D, 0.0f, out, NH * D);
}

/* Layer L's attention block for the call's n positions from p0: q, k, v of the normed input
 * n1, rotated, k and v appended to the cache, attention into c->att; *a = o_proj's output. */
static fsdp_status attend(fsdp_ctx *ctx, fsdp_llama_cache *c, cache_layer *L, const fsdp_tensor *n1,
                          int64_t p0, int64_t n, const fsdp_tensor **a) {
    const fsdp_kernels_i *k = fsdp_kernels_for(FSDP_CPU);
    int64_t NH = c->NH, NKV = c->NKV, hd = c->hd, kvw = NKV * hd;
    const fsdp_tensor *q, *kk, *v;
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, L->a.q_proj, n1, &q));
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, L->a.k_proj, n1, &kk));
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, L->a.v_proj, n1, &v));
    const float *cos = fsdp_tensor_f32(c->rope), *sin = cos + n * (hd / 2);
    k->rope_forward(fsdp_tensor_f32(c->q), fsdp_tensor_f32(q), cos, sin, 1, n, NH, hd);
    k->rope_forward(L->k + p0 * kvw, fsdp_tensor_f32(kk), cos, sin, 1, n, NKV, hd);
    memcpy(L->v + p0 * kvw, fsdp_tensor_f32(v), (size_t)(n * kvw) * sizeof(float));
    int64_t group = NH / NKV;
    for (int64_t h = 0; h < NH; h++) {
        int64_t g = h / group;
        head_attention(k, fsdp_tensor_f32(c->att) + h * hd, fsdp_tensor_f32(c->scores),
                       fsdp_tensor_f32(c->q) + h * hd, L->k + g * hd, L->v + g * hd, p0, n, NH, NKV,
                       hd);
    }
    return fsdp_module_forward(ctx, L->a.o_proj, c->att, a);
}

/* One decoder layer over the call's positions: c->x = h + mlp(norm(h)), h = x + attn(norm(x)). */
static fsdp_status layer_step(fsdp_ctx *ctx, fsdp_llama_cache *c, cache_layer *L, int64_t p0,
                              int64_t n) {
    const fsdp_kernels_i *k = fsdp_kernels_for(FSDP_CPU);
    int64_t numel = n * c->dim;
    const fsdp_tensor *n1, *a, *n2, *f;
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, L->attn_norm, c->x, &n1));
    FSDP_TRY_AT(ctx, attend(ctx, c, L, n1, p0, n, &a));
    k->add(fsdp_tensor_f32(c->h), fsdp_tensor_f32(c->x), fsdp_tensor_f32(a), numel);
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, L->mlp_norm, c->h, &n2));
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, L->mlp, n2, &f));
    k->add(fsdp_tensor_f32(c->x), fsdp_tensor_f32(c->h), fsdp_tensor_f32(f), numel);
    return FSDP_OK;
}

/* The call's buffers for n positions from p0. */
static fsdp_status make_buffers(fsdp_ctx *ctx, fsdp_llama_cache *c, int64_t p0, int64_t n) {
    int64_t qw = c->NH * c->hd, h = c->hd / 2;
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &c->x, FSDP_CPU, 3, (int64_t[]){1, n, c->dim}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &c->h, FSDP_CPU, 3, (int64_t[]){1, n, c->dim}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &c->q, FSDP_CPU, 3, (int64_t[]){1, n, qw}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &c->att, FSDP_CPU, 3, (int64_t[]){1, n, qw}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &c->rope, FSDP_CPU, 3, (int64_t[]){2, n, h}));
    FSDP_TRY_AT(ctx, fsdp_nn_buffer(ctx, &c->scores, FSDP_CPU, 2, (int64_t[]){n, p0 + n}));
    float *cos = fsdp_tensor_f32(c->rope);
    fsdp_llama_rope_table(cos, cos + n * h, p0, n, c->hd, c->layers[0].a.rope_theta,
                          &c->layers[0].a.rope_scaling);
    return fsdp_tensor_resize(ctx, c->ids, 2, (int64_t[]){1, n});
}

static fsdp_status check_call(fsdp_ctx *ctx, const fsdp_llama_cache *c, const int32_t *tokens,
                              int64_t n) {
    if (n < 1)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_llama_decode: %lld tokens; feed at least one", (long long)n);
    if (n > c->max_len - c->len)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "fsdp_llama_decode: %lld positions fed and %lld more exceed the cache's "
                         "%lld; feed fewer tokens, or make the cache longer (at most the model's "
                         "max_seq_len)",
                         (long long)c->len, (long long)n, (long long)c->max_len);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "fsdp_llama_decode: token %d (at %lld) is not in the model's "
                             "vocabulary [0, %lld)",
                             tokens[i], (long long)i, (long long)c->vocab);
    return FSDP_OK;
}

fsdp_status fsdp_llama_decode(fsdp_ctx *ctx, fsdp_llama_cache *cache, const int32_t *tokens,
                              int64_t n, const float **logits) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cache);
    fsdp_llama_cache *c = cache;
    FSDP_ARG_NOT_NULL(ctx, tokens);
    FSDP_ARG_NOT_NULL(ctx, logits);
    FSDP_TRY_AT(ctx, check_call(ctx, c, tokens, n));
    int64_t p0 = c->len;
    FSDP_TRY_AT(ctx, make_buffers(ctx, c, p0, n));
    memcpy(fsdp_tensor_data(c->ids), tokens, (size_t)n * sizeof *tokens);
    const fsdp_tensor *e, *y, *out;
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, c->embed, c->ids, &e));
    FSDP_TRY_AT(ctx, fsdp_tensor_copy(ctx, c->x, e));
    for (int l = 0; l < c->n_layers; l++)
        FSDP_TRY_AT(ctx, layer_step(ctx, c, &c->layers[l], p0, n));
    /* Every position through the norm and lm_head, as the full forward: the same shapes. */
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, c->norm, c->x, &y));
    FSDP_TRY_AT(ctx, fsdp_module_forward(ctx, c->lm_head, y, &out));
    c->len = p0 + n;
    if (fsdp_tensor_dtype(out) == FSDP_DTYPE_BF16) { /* a model with bf16 logits: widened */
        const fsdp_bf16 *last = (const fsdp_bf16 *)fsdp_tensor_data(out) + (n - 1) * c->vocab;
        for (int64_t i = 0; i < c->vocab; i++) c->logits[i] = fsdp_bf16_to_f32(last[i]);
    } else {
        memcpy(c->logits, fsdp_tensor_f32(out) + (n - 1) * c->vocab,
               (size_t)c->vocab * sizeof(float));
    }
    *logits = c->logits;
    return FSDP_OK;
}
