/* test_llama.c: the Llama layers and fsdp_model_llama. The model against a tiny Hugging Face
 * LlamaForCausalLM (tests/fixtures/llama_tiny.bin, from tools/gen_llama_fixture.py): parameter
 * names and order one to one, logits, loss and every parameter gradient within the float32
 * rounding of both (TOL below); plus the configuration defaults, refusals that name the fix,
 * and the layers on their own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_common.h" // defines: ckpt_test_tmp_root, ckpt_test_latest, ckpt_test_remove_tree
#include "fixture.h"
#include "fsdp/tp.h"
#include "harness.h"
#include "nn/nn.h"    // defines: fsdp_nn_param_replace
#include "numerics.h" // defines: fsdp_test_sum_tol, fsdp_test_max_abs

/* libfsdp and PyTorch both compute in float32, in other orders: |got - want| <= TOL x max|want|
 * per tensor (tests/numerics.h, fsdp_test_sum_tol). The fixture's sums have at most 64 terms
 * (the vocabulary's softmax; dim 32, ffn 48, 16 positions), and the deepest gradient, the
 * embedding's, passes through about 44 of them: 22 forward (per layer 2 norms, q/k/v,
 * scores, softmax, x V, o, gate/up, down; the final norm, lm_head, the loss's softmax) and
 * as many back. TOL = 2.5e-5; seen at most 1.2e-6 (0.046 of it, gate_proj's and q_proj's
 * gradients) under OpenBLAS's Haswell, Sandybridge and Prescott kernels. */
#define TOL fsdp_test_sum_tol(64, 44)

static bool check_tensor(const char *label, const fsdp_tensor *got, const fixture *fx,
                         const char *name) {
    const fixture_tensor *want = fixture_require(fx, name, FIXTURE_F32);
    if (!want || !got || !fixture_shape_equal(want, got)) {
        fprintf(stderr, "\n    %s: missing or of another shape\n", label);
        return false;
    }
    const float *w = want->data;
    return fsdp_test_close(label, fsdp_tensor_f32(got), w, want->numel, 0,
                           TOL * fsdp_test_max_abs(w, want->numel));
}

/* The fixture's configuration. */
static fsdp_llama_config fixture_config(const fixture *fx) {
    const fixture_tensor *ci = fixture_require(fx, "config", FIXTURE_I32);
    const fixture_tensor *cf = fixture_require(fx, "config_f", FIXTURE_F64);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ci);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cf);
    const int32_t *i = ci->data;
    const double *f = cf->data;
    fsdp_llama_config c = {.dim = i[0],
                           .n_layers = i[1],
                           .n_heads = i[2],
                           .n_kv_heads = i[3],
                           .vocab_size = i[4],
                           .ffn_hidden = i[5],
                           .max_seq_len = i[6],
                           .norm_eps = (float)f[0],
                           .rope_theta = (float)f[1]};
    c.tie_word_embeddings = !fixture_get(fx, "grad.lm_head.weight"); /* llama_tied */
    const fixture_tensor *rs = fixture_get(fx, "rope_scaling");      /* llama_rope3 */
    if (rs && rs->dtype == FIXTURE_F64 && rs->numel == 4) {
        const double *r = rs->data;
        c.rope_scaling = (fsdp_llama_rope_scaling){.type = FSDP_LLAMA_ROPE_LLAMA3,
                                                   .factor = (float)r[0],
                                                   .low_freq_factor = (float)r[1],
                                                   .high_freq_factor = (float)r[2],
                                                   .original_max_len = (int64_t)r[3]};
    }
    return c;
}

typedef struct name_check {
    const fixture *fx;
    int i;
    bool ok;
} name_check;

/* The i-th parameter of the C model must be the fixture's i-th, with its shape. */
static fsdp_status check_name(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx;
    name_check *c = user;
    const fixture_tensor *t = fixture_param(c->fx, c->i++);
    if (!t || strcmp(t->name, name) != 0 || !fixture_shape_equal(t, fsdp_param_data(p))) {
        fprintf(stderr, "\n    parameter %d: %s in libfsdp, %s in PyTorch", c->i - 1, name,
                t ? t->name : "(none)");
        c->ok = false;
    }
    return FSDP_OK;
}

/* Names, order and shapes of every parameter are Hugging Face's. */
static void test_names_match_hf(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("llama_tiny", &fx), 0);
    fsdp_llama_config cfg = fixture_config(&fx);
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
    name_check c = {&fx, 0, true};
    FSDP_TEST_OK(fsdp_module_visit_params(ctx, m, check_name, &c));
    CU_ASSERT_TRUE(c.ok);
    CU_ASSERT_EQUAL(c.i, fixture_num_params(&fx));
    CU_ASSERT_EQUAL(c.i, 2 + 9 * cfg.n_layers + 1);
    CU_ASSERT_STRING_EQUAL(fsdp_module_kind(fsdp_module_find(m, "model.layers.1")),
                           "LlamaDecoderLayer");
    fsdp_module_free(m);
    fixture_free(&fx);
}

/* One forward, loss and backward of the fixture's batch against PyTorch: logits, loss and
 * every parameter gradient; then a second step on the reused buffers gives the same bits. */
static void matches_hf(const char *fixture_name) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named(fixture_name, &fx), 0);
    fsdp_llama_config cfg = fixture_config(&fx);
    const fixture_tensor *tok = fixture_require(&fx, "tokens", FIXTURE_I32);
    const fixture_tensor *tgt = fixture_require(&fx, "targets", FIXTURE_I32);
    const fixture_tensor *loss_want = fixture_require(&fx, "loss", FIXTURE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tok);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tgt);
    CU_ASSERT_PTR_NOT_NULL_FATAL(loss_want);
    fsdp_module *m = NULL;
    fsdp_tensor *tokens = NULL, *dlogits = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
    for (int i = 0; i < fixture_num_params(&fx); i++) {
        const fixture_tensor *t = fixture_param(&fx, i);
        fsdp_param *p = fsdp_module_get_param(m, t->name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT_EQUAL_FATAL(fixture_copy_into(ctx, t, fsdp_param_data(p)), 0);
    }
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, tok->data, FSDP_DTYPE_I32, FSDP_CPU, tok->ndim,
                                       tok->shape, &tokens));
    float *first = NULL;
    for (int step = 0; step < 2; step++) {
        const fsdp_tensor *logits = NULL;
        float loss = NAN;
        FSDP_TEST_OK(fsdp_module_forward(ctx, m, tokens, &logits));
        if (!dlogits) FSDP_TEST_OK(fsdp_tensor_create_like(ctx, logits, &dlogits));
        FSDP_TEST_OK(fsdp_loss_cross_entropy_ignore(ctx, logits, tgt->data, FSDP_IGNORE_INDEX,
                                                    &loss, dlogits));
        FSDP_TEST_OK(fsdp_module_zero_grad(ctx, m));
        FSDP_TEST_OK(fsdp_module_backward(ctx, m, dlogits, NULL));
        int64_t n = fsdp_module_param_count(m), at = 0;
        float *grads = calloc((size_t)n, sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(grads);
        for (int i = 0; i < fixture_num_params(&fx); i++) {
            const fsdp_tensor *g =
                fsdp_param_grad(fsdp_module_get_param(m, fixture_param(&fx, i)->name));
            memcpy(grads + at, fsdp_tensor_f32(g), sizeof(float) * (size_t)fsdp_tensor_numel(g));
            at += fsdp_tensor_numel(g);
        }
        if (step == 0) {
            CU_ASSERT_TRUE(check_tensor("logits", logits, &fx, "logits"));
            float want = *(const float *)loss_want->data;
            printf("\n    loss %.9g, PyTorch %.9g (rel diff %.3g)", loss, want,
                   fabs(loss - want) / fabs(want));
            CU_ASSERT_TRUE(fabs(loss - want) <= TOL * fabs(want));
            char key[160];
            for (int i = 0; i < fixture_num_params(&fx); i++) {
                const char *name = fixture_param(&fx, i)->name;
                snprintf(key, sizeof key, "grad.%s", name);
                CU_ASSERT_TRUE(
                    check_tensor(key, fsdp_param_grad(fsdp_module_get_param(m, name)), &fx, key));
            }
            first = grads;
        } else {
            CU_ASSERT_EQUAL(memcmp(first, grads, sizeof(float) * (size_t)n), 0);
            free(grads);
        }
    }
    free(first);
    /* generation: the first sequence fed a token at a time through the key/value cache gives
     * the fixture's logits of its last position (the cache's rotary table is the forward's) */
    const fixture_tensor *lw = fixture_require(&fx, "logits", FIXTURE_F32);
    int64_t T = tok->shape[1], V = cfg.vocab_size;
    fsdp_llama_cache *cache = NULL;
    const float *dl = NULL;
    FSDP_TEST_OK(fsdp_llama_cache_create(ctx, m, 0, &cache));
    for (int64_t t = 0; cache && t < T; t++)
        FSDP_TEST_OK(fsdp_llama_decode(ctx, cache, (const int32_t *)tok->data + t, 1, &dl));
    if (dl && lw) {
        const float *want = (const float *)lw->data + (T - 1) * V;
        double worst = 0, bound = TOL * fsdp_test_max_abs(want, V);
        for (int64_t v = 0; v < V; v++) worst = fmax(worst, fabs(dl[v] - want[v]));
        printf("\n    decoded token by token: last logits within %.3g (bound %.3g)", worst, bound);
        CU_ASSERT_TRUE(worst <= bound);
    }
    fsdp_llama_cache_free(cache);
    fsdp_tensor_free(dlogits);
    fsdp_tensor_free(tokens);
    fsdp_module_free(m);
    fixture_free(&fx);
}

static void test_matches_hf(void) {
    matches_hf("llama_tiny");
}

/* Tied embeddings (llama_tied.bin): lm_head over model.embed_tokens.weight, one parameter whose
 * gradient sums both uses; the parameters are transformers' named_parameters(), lm_head
 * absent. */
static void test_tied_matches_hf(void) {
    matches_hf("llama_tied");
}

/* Llama 3's rope scaling (llama_rope3.bin: frequencies kept, interpolated and divided). */
static void test_rope3_matches_hf(void) {
    matches_hf("llama_rope3");
}

/* Zero fields take the documented defaults. */
static void test_config_defaults(void) {
    fsdp_llama_config c;
    FSDP_TEST_OK(fsdp_llama_config_resolve(fsdp_test_ctx(),
                                           &(fsdp_llama_config){.dim = 4096, .n_heads = 32}, &c));
    CU_ASSERT_EQUAL(c.n_kv_heads, 32);
    CU_ASSERT_EQUAL(c.ffn_hidden, 11008); /* Llama 2 7B's intermediate_size */
    CU_ASSERT_EQUAL(c.max_seq_len, 2048);
    CU_ASSERT_EQUAL(c.norm_eps, 1e-6f);
    CU_ASSERT_EQUAL(c.rope_theta, 10000.0f);
    CU_ASSERT_EQUAL(c.init_std, 0.02f);
}

/* A small Llama of n_layers of dim 32 (4 query, 2 key/value heads, ffn 48, vocabulary 61,
 * sequences up to 16), its embedding tied to lm_head or not. */
static fsdp_llama_config small_llama(int n_layers, bool tied) {
    return (fsdp_llama_config){.dim = 32,
                               .n_layers = n_layers,
                               .n_heads = 4,
                               .n_kv_heads = 2,
                               .ffn_hidden = 48,
                               .vocab_size = 61,
                               .max_seq_len = 16,
                               .tie_word_embeddings = tied};
}

/* fsdp_llama_flops_per_token against the model built: 6 N + 12 L d T with N the built model's
 * parameters less the embedding table (untied), or all of them (tied: lm_head's GEMM reads the
 * embedding's weight, counted once); shape S's figure; a seq outside [1, max_seq_len] and a bad
 * config refused. */
static void test_flops_per_token(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int tied = 0; tied < 2; tied++) {
        fsdp_llama_config cfg = small_llama(3, tied);
        fsdp_module *m = NULL;
        FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
        int64_t n = fsdp_module_param_count(m) - (tied ? 0 : 61 * 32);
        double f = 0;
        FSDP_TEST_OK(fsdp_llama_flops_per_token(ctx, &cfg, 10, &f));
        CU_ASSERT_EQUAL(f, 6.0 * (double)n + 12.0 * 3 * 32 * 10);
        fsdp_module_free(m);
    }
    /* shape S of bench/llama_gpu.sh: 124.7 M parameters, 100.1 M of them in the GEMMs */
    fsdp_llama_config s = {.dim = 768,
                           .n_layers = 12,
                           .n_heads = 12,
                           .n_kv_heads = 4,
                           .ffn_hidden = 2048,
                           .vocab_size = 32000,
                           .max_seq_len = 1024};
    double f = 0;
    FSDP_TEST_OK(fsdp_llama_flops_per_token(ctx, &s, 1024, &f));
    CU_ASSERT_EQUAL(f, 6.0 * 100092672 + 12.0 * 12 * 768 * 1024);
    FSDP_TEST_FAILS(fsdp_llama_flops_per_token(ctx, &s, 1025, &f), FSDP_ERR_INVALID_ARGUMENT,
                    "seq = 1025", "max_seq_len = 1024");
    FSDP_TEST_FAILS(fsdp_llama_flops_per_token(ctx, &s, 0, &f), FSDP_ERR_INVALID_ARGUMENT,
                    "seq = 0");
    s.n_kv_heads = 5;
    FSDP_TEST_FAILS(fsdp_llama_flops_per_token(ctx, &s, 8, &f), FSDP_ERR_INVALID_ARGUMENT,
                    "n_kv_heads");
}

/* fsdp_model_llama defers the layers' own fills on adding to its final reset (each element
 * drawn once, not twice): the model's values are a reset's, bit for bit, untied and tied, and
 * drawn (not the zeros a new tensor holds); a Linear made afterwards on the same context is
 * filled at once again (the deferral ended: it would hold zeros). */
static void test_build_deferred_fill(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    for (int tied = 0; tied < 2; tied++) {
        fsdp_llama_config cfg = small_llama(2, tied);
        fsdp_module *m = NULL;
        FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
        int64_t n;
        float *built = fsdp_test_param_values(m, &n);
        FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, m, fsdp_ctx_seed(ctx)));
        float *reset = fsdp_test_param_values(m, NULL);
        CU_ASSERT_EQUAL(memcmp(built, reset, (size_t)n * sizeof(float)), 0);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < n; i++) nonzero += built[i] != 0.0f;
        CU_ASSERT_TRUE(nonzero > n / 2); // drawn, not left as made
        free(built), free(reset);
        fsdp_module_free(m);
    }
    fsdp_module *lin = NULL;
    FSDP_TEST_OK(fsdp_linear_create(ctx, 8, 8, false, &lin));
    int64_t n;
    float *w = fsdp_test_param_values(lin, &n);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) nonzero += w[i] != 0.0f;
    CU_ASSERT_EQUAL(nonzero, n);
    free(w);
    fsdp_module_free(lin);
}

/* Bad shapes are refused naming the field and the rule. */
static void test_config_refused(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *m = NULL;
    fsdp_llama_config base = {.dim = 32, .n_layers = 1, .n_heads = 4, .vocab_size = 16};
    fsdp_llama_config c = base;
    c.n_kv_heads = 3;
    FSDP_TEST_FAILS(fsdp_model_llama(ctx, &c, &m), FSDP_ERR_INVALID_ARGUMENT, "n_kv_heads = 3",
                    "divide n_heads");
    c = base;
    c.n_heads = 5;
    FSDP_TEST_FAILS(fsdp_model_llama(ctx, &c, &m), FSDP_ERR_INVALID_ARGUMENT, "n_heads = 5");
    c = base;
    c.n_heads = 32; /* head size 1: odd */
    FSDP_TEST_FAILS(fsdp_model_llama(ctx, &c, &m), FSDP_ERR_INVALID_ARGUMENT, "even");
    c = base;
    c.n_layers = 0;
    FSDP_TEST_FAILS(fsdp_model_llama(ctx, &c, &m), FSDP_ERR_INVALID_ARGUMENT, "n_layers = 0");
    CU_ASSERT_PTR_NULL(m);
}

/* A token outside the vocabulary, f32 "tokens" and a sequence over max_seq_len are refused
 * naming the module; so is backward before forward. */
static void test_inputs_refused(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_llama_config cfg = {
        .dim = 8, .n_layers = 1, .n_heads = 2, .vocab_size = 10, .max_seq_len = 4};
    fsdp_module *m = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
    const fsdp_tensor *y = NULL;
    int32_t ids[5] = {1, 2, 10, 3, 4};
    fsdp_tensor *t = NULL, *f = NULL, *d = NULL;
    FSDP_TEST_OK(
        fsdp_tensor_from_blob(ctx, ids, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){1, 4}, &t));
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, m, t, &y), FSDP_ERR_INVALID_ARGUMENT,
                    "model.embed_tokens", "token 10", "[0, 10)");
    fsdp_tensor_free(t);
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){1, 4}, &f));
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, m, f, &y), FSDP_ERR_DTYPE, "i32 token ids");
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 3, (int64_t[]){1, 4, 10}, &d));
    FSDP_TEST_FAILS(fsdp_module_backward(ctx, m, d, NULL), FSDP_ERR_STATE, "forward first");
    ids[2] = 0;
    FSDP_TEST_OK(
        fsdp_tensor_from_blob(ctx, ids, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){1, 5}, &t));
    FSDP_TEST_FAILS(fsdp_module_forward(ctx, m, t, &y), FSDP_ERR_SHAPE, "self_attn",
                    "max_seq_len 4");
    fsdp_tensor_free(t);
    fsdp_tensor_free(f);
    fsdp_tensor_free(d);
    fsdp_module_free(m);
}

/* Replaces the weight of child `name` of m by rows (dim 0) or columns (dim 1) [start, start+len)
 * of the same weight in full: a tensor-parallel shard by hand. */
static void shard_weight(fsdp_module *m, fsdp_module *full, const char *name, int dim,
                         int64_t start, int64_t len) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_param *p = fsdp_module_get_param(m, name);
    const fsdp_tensor *w = fsdp_param_data(fsdp_module_get_param(full, name));
    int64_t R = fsdp_tensor_dim(w, 0), C = fsdp_tensor_dim(w, 1);
    int64_t shape[2] = {dim == 0 ? len : R, dim == 0 ? C : len};
    fsdp_tensor *data = NULL, *grad = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &data));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &grad));
    const float *src = fsdp_tensor_f32(w);
    float *dst = fsdp_tensor_f32(data);
    for (int64_t r = 0; r < shape[0]; r++)
        for (int64_t c = 0; c < shape[1]; c++)
            dst[r * shape[1] + c] = dim == 0 ? src[(start + r) * C + c] : src[r * C + start + c];
    fsdp_nn_param_replace(p, data, grad, NULL, NULL);
}

/* Heads split as tensor parallelism will split them: rank r keeps query heads [2r, 2r+2) and
 * key/value head r (q/k/v rows, o columns). Each rank's attention reads its head counts from
 * its shards, and the two partial outputs sum to the unsplit module's output: o_proj's 16-term
 * sums become two 8-term halves added after, a few u of outputs of order 1 (rtol 1e-5, atol
 * 1e-6; seen 0.19 of it). */
static void test_attention_heads_split(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    enum { B = 2, T = 5, DIM = 16, NH = 4, NKV = 2, HD = DIM / NH };
    fsdp_llama_config cfg = {.dim = DIM, .n_heads = NH, .n_kv_heads = NKV, .init_std = 0.5f};
    fsdp_module *full = NULL, *part[2] = {NULL, NULL};
    FSDP_TEST_OK(fsdp_llama_attention_create(ctx, &cfg, &full));
    FSDP_TEST_OK(fsdp_module_reset_parameters(ctx, full, 7));
    int64_t shape[3] = {B, T, DIM};
    fsdp_tensor *x = fsdp_test_random(3, shape, -1, 1, 5);
    CU_ASSERT_PTR_NOT_NULL_FATAL(x);
    const fsdp_tensor *y = NULL, *yp[2] = {NULL, NULL};
    FSDP_TEST_OK(fsdp_module_forward(ctx, full, x, &y));
    for (int r = 0; r < 2; r++) {
        FSDP_TEST_OK(fsdp_llama_attention_create(ctx, &cfg, &part[r]));
        shard_weight(part[r], full, "q_proj.weight", 0, r * (NH / 2) * HD, (NH / 2) * HD);
        shard_weight(part[r], full, "k_proj.weight", 0, r * HD, HD);
        shard_weight(part[r], full, "v_proj.weight", 0, r * HD, HD);
        shard_weight(part[r], full, "o_proj.weight", 1, r * (NH / 2) * HD, (NH / 2) * HD);
        FSDP_TEST_OK(fsdp_module_forward(ctx, part[r], x, &yp[r]));
    }
    int64_t n = fsdp_tensor_numel(y);
    float *sum = calloc((size_t)n, sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(sum);
    for (int64_t i = 0; i < n; i++) sum[i] = fsdp_tensor_f32(yp[0])[i] + fsdp_tensor_f32(yp[1])[i];
    FSDP_TEST_CLOSE("attention: sum of two head shards", sum, fsdp_tensor_f32(y), n, 1e-5, 1e-6);
    free(sum);
    fsdp_tensor_free(x);
    fsdp_module_free(full);
    fsdp_module_free(part[0]);
    fsdp_module_free(part[1]);
}

/* FSDP_DTYPE_I32, the token dtype: size, name, fill (truncating like a C cast; a value outside
 * i32 refused), a copy between i32 tensors, and no conversion to or from f32. */
static void test_i32_tensor(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    CU_ASSERT_EQUAL(fsdp_dtype_size(FSDP_DTYPE_I32), 4);
    CU_ASSERT_STRING_EQUAL(fsdp_dtype_to_string(FSDP_DTYPE_I32), "i32");
    fsdp_tensor *a = NULL, *b = NULL, *x = NULL;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 2, (int64_t[]){2, 3}, &a));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_I32, FSDP_CPU, 1, (int64_t[]){6}, &b));
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 1, (int64_t[]){6}, &x));
    CU_ASSERT_PTR_NULL(fsdp_tensor_f32(a));
    FSDP_TEST_OK(fsdp_tensor_fill(ctx, a, -7.9f));
    FSDP_TEST_OK(fsdp_tensor_copy(ctx, b, a));
    const int32_t *v = fsdp_tensor_data(b);
    for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(v[i], -7);
    FSDP_TEST_FAILS(fsdp_tensor_fill(ctx, a, 3e9f), FSDP_ERR_INVALID_ARGUMENT, "i32");
    CU_ASSERT_NOT_EQUAL(fsdp_tensor_copy(ctx, x, a), FSDP_OK);
    fsdp_tensor_free(a);
    fsdp_tensor_free(b);
    fsdp_tensor_free(x);
}

/* Hugging Face's state_dict() of the fixture's model (llama_tiny.safetensors) imported with
 * fsdp_ckpt_import and loaded strictly into fsdp_model_llama (every name on both sides must
 * match): the model then gives PyTorch's logits. */
static void test_import_hf_state_dict(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("llama_tiny", &fx), 0);
    fsdp_llama_config cfg = fixture_config(&fx);
    const fixture_tensor *tok = fixture_require(&fx, "tokens", FIXTURE_I32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tok);
    char *root = ckpt_test_tmp_root();
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    FSDP_TEST_OK(fsdp_ckpt_import(ctx, FSDP_FIXTURE_DIR "/llama_tiny.safetensors", root, NULL));
    char *path = ckpt_test_latest(root);
    fsdp_module *m = NULL;
    fsdp_ckpt *ck = NULL;
    fsdp_state *st = NULL;
    fsdp_tensor *tokens = NULL;
    FSDP_TEST_OK(fsdp_model_llama(ctx, &cfg, &m));
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, path, &ck));
    FSDP_TEST_OK(fsdp_state_create(ctx, &(fsdp_state_sources){.model = m}, &st));
    FSDP_TEST_OK(fsdp_ckpt_load(ctx, ck, st, NULL));
    FSDP_TEST_OK(fsdp_tensor_from_blob(ctx, tok->data, FSDP_DTYPE_I32, FSDP_CPU, tok->ndim,
                                       tok->shape, &tokens));
    const fsdp_tensor *logits = NULL;
    FSDP_TEST_OK(fsdp_module_forward(ctx, m, tokens, &logits));
    CU_ASSERT_TRUE(check_tensor("logits after import", logits, &fx, "logits"));
    fsdp_tensor_free(tokens);
    fsdp_state_free(st);
    fsdp_ckpt_close(ck);
    fsdp_module_free(m);
    ckpt_test_remove_tree(root);
    free(path);
    free(root);
    fixture_free(&fx);
}

/* ---- under FSDP ---- */

typedef struct fsdp_job {
    const fixture *fx;
    fsdp_llama_config cfg;
} fsdp_job;

/* The fixture's tensor `name` against got (CPU f32, same numel) with check_tensor's rule. */
static bool rank_close(const char *label, const fsdp_tensor *got, const fixture *fx,
                       const char *name) {
    const fixture_tensor *want = fixture_get(fx, name);
    if (!want || fsdp_tensor_numel(got) != want->numel) return false;
    return fsdp_test_close(label, fsdp_tensor_f32(got), want->data, want->numel, 0,
                           TOL * fsdp_test_max_abs(want->data, want->numel));
}

/* One rank: the fixture's model under FULL_SHARD, one unit per decoder layer plus the root,
 * forward and backward of the whole fixture batch (every rank the same batch, so the averaged
 * gradient is the batch's); summoned with gradients, logits and every gradient are PyTorch's. */
static fsdp_status llama_fsdp_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    const fsdp_job *job = user;
    const fixture *fx = job->fx;
    const fixture_tensor *tok = fixture_get(fx, "tokens"), *tgt = fixture_get(fx, "targets");
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_tensor *tokens = NULL, *dlogits = NULL;
    fsdp_status st = fsdp_model_llama(ctx, &job->cfg, &m);
    for (int i = 0; st == FSDP_OK && i < fixture_num_params(fx); i++) {
        const fixture_tensor *t = fixture_param(fx, i);
        if (fixture_copy_into(ctx, t, fsdp_param_data(fsdp_module_get_param(m, t->name))))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "cannot load %s", t->name);
    }
    const char *kinds[] = {"LlamaDecoderLayer"};
    if (st == FSDP_OK)
        st = fsdp_fully_shard(
            ctx, m, &(fsdp_fully_shard_options){.wrap_kinds = kinds, .n_wrap_kinds = 1}, &sh);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, fsdp_sharded_num_units(sh) == 1 + job->cfg.n_layers,
                        "%d FSDP units; expected the root and one per layer",
                        fsdp_sharded_num_units(sh));
    if (st == FSDP_OK)
        st = fsdp_tensor_from_blob(ctx, tok->data, FSDP_DTYPE_I32, FSDP_CPU, tok->ndim, tok->shape,
                                   &tokens);
    const fsdp_tensor *logits = NULL;
    float loss = NAN;
    if (st == FSDP_OK) st = fsdp_module_forward(ctx, m, tokens, &logits);
    if (st == FSDP_OK) st = fsdp_tensor_create_like(ctx, logits, &dlogits);
    if (st == FSDP_OK)
        st = fsdp_loss_cross_entropy_ignore(ctx, logits, tgt->data, FSDP_IGNORE_INDEX, &loss,
                                            dlogits);
    if (st == FSDP_OK)
        FSDP_RANK_CHECK(ctx, rank_close("FSDP logits", logits, fx, "logits"), "logits differ");
    if (st == FSDP_OK) st = fsdp_module_backward(ctx, m, dlogits, NULL);
    if (st == FSDP_OK)
        st = fsdp_summon_full_params(ctx, sh, &(fsdp_summon_options){.with_grads = true});
    char key[160];
    for (int i = 0; st == FSDP_OK && i < fixture_num_params(fx); i++) {
        const char *name = fixture_param(fx, i)->name;
        snprintf(key, sizeof key, "grad.%s", name);
        FSDP_RANK_CHECK(ctx,
                        rank_close(key, fsdp_param_grad(fsdp_module_get_param(m, name)), fx, key),
                        "%s differs from PyTorch's under FSDP", key);
    }
    if (st == FSDP_OK) st = fsdp_release_full_params(ctx, sh);
    fsdp_tensor_free(tokens);
    fsdp_tensor_free(dlogits);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

static void fsdp_matches_hf(const char *fixture_name) {
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named(fixture_name, &fx), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fixture_require(&fx, "tokens", FIXTURE_I32));
    CU_ASSERT_PTR_NOT_NULL_FATAL(fixture_require(&fx, "targets", FIXTURE_I32));
    fsdp_job job = {&fx, fixture_config(&fx)};
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, llama_fsdp_rank, &job));
    fixture_free(&fx);
}

static void test_fsdp_matches_hf(void) {
    fsdp_matches_hf("llama_tiny");
}

/* Tied embeddings under FSDP: the root unit holds the embedding and lm_head, the shared
 * weight's gradient sums both uses before its reduction: transformers' gradients. */
static void test_fsdp_tied_matches_hf(void) {
    fsdp_matches_hf("llama_tied");
}

/* A wrap that puts the embedding in a unit of its own would leave lm_head reading its tied
 * weight resharded: refused before anything moves, naming both modules and the fix. */
static fsdp_status tied_split_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_status st = fsdp_model_llama(ctx, user, &m);
    const char *paths[] = {"model.embed_tokens"};
    if (st == FSDP_OK) {
        fsdp_status got = fsdp_fully_shard(
            ctx, m, &(fsdp_fully_shard_options){.wrap_paths = paths, .n_wrap_paths = 1}, &sh);
        const char *msg = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx,
                        got == FSDP_ERR_INVALID_ARGUMENT && strstr(msg, "tied weights") &&
                            strstr(msg, "'lm_head'") && strstr(msg, "model.embed_tokens") &&
                            strstr(msg, "wrap a module that holds both"),
                        "a split of tied weights: status %d, '%s'", (int)got, msg);
        if (rank == 0) printf("\n    %s", msg);
    }
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    return st;
}

/* Tensor parallelism on a tied lm_head alone (the embedding not sharded first): its weight has
 * no placement yet, and it would need the embedding's; refused naming both and the fix. */
static fsdp_status tied_tp_rank(fsdp_ctx *ctx, int rank, void *user) {
    fsdp_module *m = NULL;
    fsdp_mesh *tp = NULL;
    fsdp_status st = fsdp_model_llama(ctx, user, &m);
    if (st == FSDP_OK) st = fsdp_mesh_create(ctx, 1, (int[]){2}, (const char *[]){"tp"}, &tp);
    if (st == FSDP_OK) {
        fsdp_tp_plan_entry plan[] = {{"lm_head", FSDP_COLWISE()}};
        fsdp_status got = fsdp_tp_parallelize(ctx, m, tp, 1, plan, NULL);
        const char *msg = fsdp_last_error(ctx);
        FSDP_RANK_CHECK(ctx,
                        got == FSDP_ERR_INVALID_ARGUMENT && strstr(msg, "tied to") &&
                            strstr(msg, "model.embed_tokens") &&
                            strstr(msg, "no style has distributed yet") &&
                            strstr(msg, "RowwiseParallel"),
                        "a tied lm_head alone under TP: status %d, '%s'", (int)got, msg);
        if (rank == 0) printf("\n    %s", msg);
    }
    fsdp_mesh_free(tp);
    fsdp_module_free(m);
    return st;
}

static void test_tp_tied_alone_refused(void) {
    fsdp_llama_config cfg = {
        .dim = 16, .n_layers = 1, .n_heads = 2, .vocab_size = 32, .tie_word_embeddings = true};
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, tied_tp_rank, &cfg));
}

static void test_fsdp_tied_split_refused(void) {
    fsdp_llama_config cfg = {
        .dim = 16, .n_layers = 1, .n_heads = 2, .vocab_size = 32, .tie_word_embeddings = true};
    FSDP_TEST_OK(fsdp_test_run_world(2, 0, tied_split_rank, &cfg));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"names_match_hf", test_names_match_hf},
        {"matches_hf", test_matches_hf},
        {"rope3_matches_hf", test_rope3_matches_hf},
        {"tied_matches_hf", test_tied_matches_hf},
        {"config_defaults", test_config_defaults},
        {"flops_per_token", test_flops_per_token},
        {"build_deferred_fill", test_build_deferred_fill},
        {"config_refused", test_config_refused},
        {"inputs_refused", test_inputs_refused},
        {"attention_heads_split", test_attention_heads_split},
        {"i32_tensor", test_i32_tensor},
        {"import_hf_state_dict", test_import_hf_state_dict},
        {"fsdp_matches_hf", test_fsdp_matches_hf},
        {"fsdp_tied_matches_hf", test_fsdp_tied_matches_hf},
        {"fsdp_tied_split_refused", test_fsdp_tied_split_refused},
        {"tp_tied_alone_refused", test_tp_tied_alone_refused},
    };
    return fsdp_test_run(argc, argv, "llama", cases, (int)(sizeof cases / sizeof cases[0]));
}
