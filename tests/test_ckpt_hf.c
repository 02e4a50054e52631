/* test_ckpt_hf.c: Hugging Face interchange without Python: the Llama config.json written and
 * read back (and refused where fsdp_model_llama cannot build it), a checkpoint saved with its
 * model configuration exported as a model directory and imported back bitwise (whole and
 * split into safetensors shards with an index), and the refusals of bad directories.
 * tools/check_hf_export.py (CTest check_hf_export) is the live check against transformers. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_common.h" // defines: ckpt_test_tmp_root, ckpt_test_remove_tree
#include "harness.h"

static const fsdp_llama_config tiny = {.dim = 16,
                                       .n_layers = 2,
                                       .n_heads = 4,
                                       .n_kv_heads = 2,
                                       .vocab_size = 24,
                                       .ffn_hidden = 20,
                                       .max_seq_len = 64,
                                       .norm_eps = 1e-5f,
                                       .rope_theta = 500000.0f,
                                       .init_std = 0.05f};

static bool same_config(const fsdp_llama_config *a, const fsdp_llama_config *b) {
    return a->dim == b->dim && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->vocab_size == b->vocab_size &&
           a->ffn_hidden == b->ffn_hidden && a->max_seq_len == b->max_seq_len &&
           a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta &&
           a->init_std == b->init_std;
}

static void test_config_roundtrip(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char *json = NULL;
    fsdp_llama_config back;
    FSDP_TEST_OK(fsdp_llama_config_to_hf_json(ctx, &tiny, &json));
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, json, &back));
    CU_ASSERT_TRUE(same_config(&tiny, &back));
    /* What transformers needs, with the shortest decimals. */
    CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"architectures\": [\n    \"LlamaForCausalLM\"\n  ]"));
    CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"model_type\": \"llama\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"rms_norm_eps\": 1e-5,"));
    CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"initializer_range\": 0.05,"));
    CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"tie_word_embeddings\": false"));
    free(json);
    /* The keys a transformers 4 config.json has, defaults left out: HF's defaults. */
    const char *v4 =
        "{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 3,"
        " \"num_attention_heads\": 4, \"vocab_size\": 100, \"intermediate_size\": 64,"
        " \"rope_theta\": 20000.0, \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1}";
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, v4, &back));
    fsdp_llama_config want = {.dim = 32,
                              .n_layers = 3,
                              .n_heads = 4,
                              .n_kv_heads = 4,
                              .vocab_size = 100,
                              .ffn_hidden = 64,
                              .max_seq_len = 2048,
                              .norm_eps = 1e-6f,
                              .rope_theta = 20000.0f,
                              .init_std = 0.02f};
    CU_ASSERT_TRUE(same_config(&want, &back));
    /* transformers 5: rope_parameters wins over the old key. */
    const char *v5 = "{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 3,"
                     " \"num_attention_heads\": 4, \"vocab_size\": 100, \"intermediate_size\": 64,"
                     " \"rope_theta\": 1.0e4, \"rope_parameters\": {\"rope_type\": \"default\","
                     " \"rope_theta\": 30000}, \"rope_scaling\": null}";
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, v5, &back));
    CU_ASSERT_EQUAL(back.rope_theta, 30000.0f);
    CU_ASSERT_EQUAL(back.rope_scaling.type, FSDP_LLAMA_ROPE_DEFAULT);
    /* Llama 3's rope scaling: the old "type" spelling, original_max_position_embeddings from
     * max_position_embeddings when absent (transformers' fallback); written back as
     * rope_parameters and rope_scaling, which read back the same */
    const char *l3 = "{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 3,"
                     " \"num_attention_heads\": 4, \"vocab_size\": 100, \"intermediate_size\": 64,"
                     " \"max_position_embeddings\": 4096, \"rope_scaling\": {\"type\": \"llama3\","
                     " \"factor\": 8.0, \"low_freq_factor\": 1, \"high_freq_factor\": 4.0}}";
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, l3, &back));
    CU_ASSERT_EQUAL(back.rope_scaling.type, FSDP_LLAMA_ROPE_LLAMA3);
    CU_ASSERT_EQUAL(back.rope_scaling.factor, 8.0f);
    CU_ASSERT_EQUAL(back.rope_scaling.low_freq_factor, 1.0f);
    CU_ASSERT_EQUAL(back.rope_scaling.high_freq_factor, 4.0f);
    CU_ASSERT_EQUAL(back.rope_scaling.original_max_len, 4096);
    char *text = NULL;
    fsdp_llama_config again;
    FSDP_TEST_OK(fsdp_llama_config_to_hf_json(ctx, &back, &text));
    CU_ASSERT_TRUE(text && strstr(text, "\"rope_scaling\"") && strstr(text, "\"rope_parameters\""));
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, text ? text : "", &again));
    CU_ASSERT_TRUE(same_config(&back, &again));
    CU_ASSERT_EQUAL(memcmp(&back.rope_scaling, &again.rope_scaling, sizeof back.rope_scaling), 0);
    free(text);
    /* tied embeddings: read, and written back */
    const char *tied =
        "{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 3,"
        " \"num_attention_heads\": 4, \"vocab_size\": 100, \"intermediate_size\": 64,"
        " \"tie_word_embeddings\": true}";
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, tied, &back));
    CU_ASSERT_TRUE(back.tie_word_embeddings);
    FSDP_TEST_OK(fsdp_llama_config_to_hf_json(ctx, &back, &text));
    CU_ASSERT_TRUE(text && strstr(text, "\"tie_word_embeddings\": true"));
    free(text);
}

static void refused(const char *json, fsdp_status want, const char *needle) {
    fsdp_llama_config c;
    FSDP_TEST_FAILS(fsdp_llama_config_from_hf_json(fsdp_test_ctx(), json, &c), want, needle);
}

#define BASE                                                                                       \
    "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": "  \
    "10, \"intermediate_size\": 8"

static void test_config_refused(void) {
    refused("{\"model_type\": \"llama\", " BASE, FSDP_ERR_INVALID_ARGUMENT, "not valid JSON");
    refused("[1, 2]", FSDP_ERR_INVALID_ARGUMENT, "not a JSON object");
    refused("{\"model_type\": \"gpt2\", " BASE "}", FSDP_ERR_UNSUPPORTED, "\"gpt2\"");
    refused("{" BASE "}", FSDP_ERR_UNSUPPORTED, "\"model_type\" is missing");
    refused("{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 4, \"intermediate_size\": 8}",
            FSDP_ERR_INVALID_ARGUMENT, "\"vocab_size\" is missing");
    refused("{\"model_type\": \"llama\", " BASE ", \"tie_word_embeddings\": 1}",
            FSDP_ERR_INVALID_ARGUMENT, "\"tie_word_embeddings\" must be true or false");
    refused("{\"model_type\": \"llama\", " BASE ", \"attention_bias\": true}", FSDP_ERR_UNSUPPORTED,
            "attention_bias");
    refused("{\"model_type\": \"llama\", " BASE ", \"mlp_bias\": true}", FSDP_ERR_UNSUPPORTED,
            "mlp_bias");
    refused("{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"gelu\"}",
            FSDP_ERR_INVALID_ARGUMENT, "hidden_act");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\": \"linear\"}}",
            FSDP_ERR_UNSUPPORTED, "rope_scaling");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"rope_type\": "
            "\"yarn\"}}",
            FSDP_ERR_UNSUPPORTED, "rope_type");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", "
            "\"low_freq_factor\": 1, \"high_freq_factor\": 4}}",
            FSDP_ERR_INVALID_ARGUMENT, "\"factor\" is missing");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", "
            "\"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1}}",
            FSDP_ERR_INVALID_ARGUMENT, "low_freq_factor < high_freq_factor");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", "
            "\"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
            "\"original_max_position_embeddings\": -1}}",
            FSDP_ERR_INVALID_ARGUMENT, "original_max_position_embeddings");
    refused("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": [1]}",
            FSDP_ERR_INVALID_ARGUMENT, "\"rope_scaling\" must be an object or null");
    refused("{\"model_type\": \"llama\", " BASE ", \"head_dim\": 16}", FSDP_ERR_UNSUPPORTED,
            "head_dim 16");
    refused("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}",
            FSDP_ERR_INVALID_ARGUMENT, "n_kv_heads = 3");
    refused("{\"model_type\": \"llama\", \"hidden_size\": \"32\", \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 4, \"vocab_size\": 10, \"intermediate_size\": 8}",
            FSDP_ERR_INVALID_ARGUMENT, "\"hidden_size\" must be a whole number");
    refused("{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 0, "
            "\"num_attention_heads\": 4, \"vocab_size\": 10, \"intermediate_size\": 8}",
            FSDP_ERR_INVALID_ARGUMENT, "\"num_hidden_layers\" is 0");
    refused("{\"model_type\": \"llama\", " BASE ", \"rms_norm_eps\": -1}",
            FSDP_ERR_INVALID_ARGUMENT, "rms_norm_eps");
    refused("{\"model_type\": \"llama\", \"model_type\": \"llama\", " BASE "}",
            FSDP_ERR_INVALID_ARGUMENT, "duplicate");
}

/* ---- a saved Llama ---- */

typedef struct save_job {
    const char *dir;
    const char *model_config;
} save_job;

static fsdp_status save_rank(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    const save_job *jb = user;
    fsdp_module *m = NULL;
    fsdp_state *st = NULL;
    fsdp_ckpt_writer *w = NULL;
    fsdp_status s = fsdp_model_llama(ctx, &tiny, &m);
    if (s == FSDP_OK) s = fsdp_state_create(ctx, &(fsdp_state_sources){.model = m}, &st);
    if (s == FSDP_OK) s = fsdp_ckpt_writer_create(ctx, jb->dir, NULL, &w);
    if (s == FSDP_OK)
        s = fsdp_ckpt_save(ctx, w, st,
                           &(fsdp_ckpt_meta){.step = 1, .model_config = jb->model_config});
    fsdp_ckpt_writer_free(ctx, w);
    fsdp_state_free(st);
    fsdp_module_free(m);
    return s;
}

/* Saves the tiny Llama into root/name (with its config.json when with_config) and opens it. */
static fsdp_ckpt *saved_llama(const char *root, const char *name, bool with_config) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char dir[700], *json = NULL;
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    if (with_config) FSDP_TEST_OK(fsdp_llama_config_to_hf_json(ctx, &tiny, &json));
    save_job jb = {.dir = dir, .model_config = json};
    FSDP_TEST_OK(fsdp_test_run_world(1, 30000, save_rank, &jb));
    free(json);
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/step-00000001");
    fsdp_ckpt *ck = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, dir, &ck));
    return ck;
}

/* Every tensor of a is in b with the same shape and bits; both have as many. */
static void assert_same_tensors(fsdp_ckpt *a, fsdp_ckpt *b) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    CU_ASSERT_EQUAL_FATAL(fsdp_ckpt_num_tensors(a), fsdp_ckpt_num_tensors(b));
    for (int t = 0; t < fsdp_ckpt_num_tensors(a); t++) {
        fsdp_ckpt_tensor x, y;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, a, t, &x));
        int u = fsdp_ckpt_find(b, x.name);
        CU_ASSERT_TRUE_FATAL(u >= 0);
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, b, u, &y));
        CU_ASSERT_EQUAL_FATAL(x.ndim, y.ndim);
        fsdp_state_region all = {.ndim = x.ndim};
        int64_t n = 1;
        for (int d = 0; d < x.ndim; d++) {
            CU_ASSERT_EQUAL_FATAL(x.shape[d], y.shape[d]);
            n *= all.count[d] = x.shape[d];
        }
        float *va = malloc((size_t)n * 4), *vb = malloc((size_t)n * 4);
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, a, t, &all, va));
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, b, u, &all, vb));
        CU_ASSERT_EQUAL(memcmp(va, vb, (size_t)n * 4), 0);
        free(va);
        free(vb);
    }
}

static fsdp_ckpt *import_dir(const char *src, const char *root, const char *name) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char out[700];
    snprintf(out, sizeof out, "%s/%s", root, name);
    FSDP_TEST_OK(fsdp_ckpt_import(ctx, src, out, NULL));
    snprintf(out + strlen(out), sizeof out - strlen(out), "/step-00000000");
    fsdp_ckpt *ck = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, out, &ck));
    return ck;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1 << 16, 1);
    if (f && buf) (void)!fread(buf, 1, (1 << 16) - 1, f);
    if (f) fclose(f);
    return buf;
}

static void test_export_import(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char *root = ckpt_test_tmp_root(), hf[700], path[800];
    fsdp_ckpt *ck = saved_llama(root, "saved", true), *bare = saved_llama(root, "bare", false);
    snprintf(hf, sizeof hf, "%s/hf", root);
    FSDP_TEST_OK(fsdp_ckpt_export_hf(ctx, ck, hf, NULL));
    /* config.json is the saved configuration's; the import keeps it as the model's. */
    fsdp_ckpt *back = import_dir(hf, root, "imported");
    snprintf(path, sizeof path, "%s/config.json", hf);
    char *json = read_file(path);
    CU_ASSERT_STRING_EQUAL(fsdp_ckpt_model_config(back), json);
    CU_ASSERT_STRING_EQUAL(fsdp_ckpt_model_config(ck), json);
    CU_ASSERT_STRING_EQUAL(fsdp_ckpt_model_config(bare), "");
    free(json);
    assert_same_tensors(ck, back);
    /* What cannot be exported as a Hugging Face model. */
    snprintf(hf, sizeof hf, "%s/hf_bare", root);
    FSDP_TEST_FAILS(fsdp_ckpt_export_hf(ctx, bare, hf, NULL), FSDP_ERR_INVALID_ARGUMENT,
                    "no model configuration", "--format safetensors");
    FSDP_TEST_FAILS(fsdp_ckpt_export_hf(ctx, ck, hf, &(fsdp_ckpt_export_options){.with_optim = 1}),
                    FSDP_ERR_INVALID_ARGUMENT, "with_optim");
    struct stat sb;
    CU_ASSERT_NOT_EQUAL(stat(hf, &sb), 0); /* nothing made */
    fsdp_ckpt_close(back);
    fsdp_ckpt_close(bare);
    fsdp_ckpt_close(ck);
    ckpt_test_remove_tree(root);
    free(root);
}

/* A checkpoint whose configuration does not describe its tensors is refused by name. */
static void test_export_mismatch(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char *root = ckpt_test_tmp_root(), hf[700];
    fsdp_llama_config other = tiny;
    other.ffn_hidden = 24;
    char *json = NULL;
    FSDP_TEST_OK(fsdp_llama_config_to_hf_json(ctx, &other, &json));
    char dir[700];
    snprintf(dir, sizeof dir, "%s/wrong", root);
    save_job jb = {.dir = dir, .model_config = json};
    FSDP_TEST_OK(fsdp_test_run_world(1, 30000, save_rank, &jb));
    free(json);
    fsdp_ckpt *ck = NULL;
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/step-00000001");
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, dir, &ck));
    snprintf(hf, sizeof hf, "%s/hf", root);
    FSDP_TEST_FAILS(fsdp_ckpt_export_hf(ctx, ck, hf, NULL), FSDP_ERR_INVALID_ARGUMENT,
                    "model.layers.0.mlp.gate_proj.weight", "(20, 16) where", "wants (24, 16)");
    fsdp_ckpt_close(ck);
    /* Too long a configuration is refused when saving. */
    char *big = malloc(FSDP_HF_CONFIG_MAX + 2);
    memset(big, ' ', FSDP_HF_CONFIG_MAX + 1);
    big[FSDP_HF_CONFIG_MAX + 1] = '\0';
    snprintf(dir, sizeof dir, "%s/big", root);
    jb = (save_job){.dir = dir, .model_config = big};
    CU_ASSERT_NOT_EQUAL(fsdp_test_run_world(1, 30000, save_rank, &jb), FSDP_OK);
    free(big);
    ckpt_test_remove_tree(root);
    free(root);
}

/* ---- sharded directories, written by hand ---- */

/* A safetensors file of the tensors of ck named in names (in that order). */
static void write_shard(fsdp_ckpt *ck, const char *path, const char *const *names, int n) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char head[4096];
    int64_t off = 0;
    size_t len = (size_t)snprintf(head, sizeof head, "{");
    for (int i = 0; i < n; i++) {
        fsdp_ckpt_tensor x;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ck, fsdp_ckpt_find(ck, names[i]), &x));
        int64_t bytes = 4 * x.shape[0] * (x.ndim == 2 ? x.shape[1] : 1);
        char shape[64];
        if (x.ndim == 2)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)x.shape[0],
                     (long long)x.shape[1]);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)x.shape[0]);
        len += (size_t)snprintf(head + len, sizeof head - len,
                                "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],"
                                "\"data_offsets\":[%lld,%lld]}",
                                i ? "," : "", names[i], shape, (long long)off,
                                (long long)(off + bytes));
        off += bytes;
    }
    len += (size_t)snprintf(head + len, sizeof head - len, "}");
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    uint64_t l = len;
    fwrite(&l, 8, 1, f);
    fwrite(head, 1, len, f);
    for (int i = 0; i < n; i++) {
        int t = fsdp_ckpt_find(ck, names[i]);
        fsdp_ckpt_tensor x;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ck, t, &x));
        fsdp_state_region all = {.ndim = x.ndim};
        int64_t numel = 1;
        for (int d = 0; d < x.ndim; d++) numel *= all.count[d] = x.shape[d];
        float *v = malloc((size_t)numel * 4);
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, ck, t, &all, v));
        fwrite(v, 4, (size_t)numel, f);
        free(v);
    }
    fclose(f);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
}

static void test_sharded_import(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    char *root = ckpt_test_tmp_root(), dir[700], path[800], out[700];
    fsdp_ckpt *ck = saved_llama(root, "saved", true);
    int n = fsdp_ckpt_num_tensors(ck), half = n / 2;
    const char **names = calloc((size_t)n, sizeof *names);
    for (int t = 0; t < n; t++) {
        fsdp_ckpt_tensor x;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ck, t, &x));
        names[t] = x.name;
    }
    snprintf(dir, sizeof dir, "%s/sharded", root);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    write_shard(ck, path, names, half);
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    write_shard(ck, path, names + half, n - half);
    char *index = calloc(1 << 16, 1);
    size_t len = (size_t)snprintf(index, 1 << 16, "{\"metadata\": {}, \"weight_map\": {");
    for (int t = 0; t < n; t++)
        len += (size_t)snprintf(index + len, (1 << 16) - len, "%s\"%s\": \"%s\"", t ? ", " : "",
                                names[t], t < half ? "a.safetensors" : "b.safetensors");
    snprintf(index + len, (1 << 16) - len, "}}");
    write_text(dir, "model.safetensors.index.json", index);
    write_text(dir, "config.json", fsdp_ckpt_model_config(ck));
    fsdp_ckpt *back = import_dir(dir, root, "imported");
    assert_same_tensors(ck, back);
    fsdp_ckpt_close(back);
    /* An index that disagrees with its files. */
    snprintf(out, sizeof out, "%s/bad", root);
    char *moved = strdup(index);
    char *at = strstr(moved, "\"b.safetensors\"");
    at[1] = 'a'; /* the first tensor of b said to be in a */
    write_text(dir, "model.safetensors.index.json", moved);
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "places in another file");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"../a.safetensors\"}}");
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "not the name of a file");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"extra\": \"a.safetensors\"}}");
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "does not list");
    snprintf(index + len, (1 << 16) - len, ", \"missing\": \"b.safetensors\"}}");
    write_text(dir, "model.safetensors.index.json", index);
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "missing from its file");
    write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "weight_map");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    remove(path);
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "neither model.safetensors",
                    "save_pretrained");
    write_text(dir, "config.json", "[]");
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "not a JSON object");
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    FSDP_TEST_FAILS(fsdp_ckpt_import(ctx, dir, out, NULL), FSDP_ERR_IO, "without config.json");
    struct stat sb;
    CU_ASSERT_NOT_EQUAL(stat(out, &sb), 0); /* nothing was committed */
    free(moved);
    free(index);
    free(names);
    fsdp_ckpt_close(ck);
    ckpt_test_remove_tree(root);
    free(root);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"config_roundtrip", test_config_roundtrip}, {"config_refused", test_config_refused},
        {"export_import", test_export_import},       {"export_mismatch", test_export_mismatch},
        {"sharded_import", test_sharded_import},
    };
    return fsdp_test_run(argc, argv, "ckpt_hf", cases, sizeof cases / sizeof cases[0]);
}
