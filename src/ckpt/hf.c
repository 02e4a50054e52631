/* hf.c: Hugging Face interchange for Llama models: a config.json written from and read into
 * fsdp_llama_config (with jansson), and a checkpoint exported as a model directory
 * (config.json + model.safetensors, and for a byte-level model of vocabulary 256 its tokenizer)
 * that transformers' LlamaForCausalLM.from_pretrained and AutoTokenizer.from_pretrained load. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_impl.h"
#include "core/error.h"

#define HF_MAX_LAYERS 100000

/* ---- config.json ---- */

/* The shortest decimal that reads back as the float f, as a double (so 1e-6f is 1e-06 in the
 * JSON, not 9.99999997e-07). */
static double short_real(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

/* Llama 3's rope scaling as Hugging Face writes it (with rope_theta in rope_parameters). */
static json_t *rope_llama3_json(const fsdp_llama_rope_scaling *rs, bool with_theta, float theta) {
    json_t *r =
        json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor",
                  short_real(rs->factor), "low_freq_factor", short_real(rs->low_freq_factor),
                  "high_freq_factor", short_real(rs->high_freq_factor),
                  "original_max_position_embeddings", (json_int_t)rs->original_max_len);
    if (r && with_theta && json_object_set_new(r, "rope_theta", json_real(short_real(theta))) != 0)
        json_decref(r), r = NULL;
    return r;
}

fsdp_status fsdp_llama_config_to_hf_json(fsdp_ctx *ctx, const fsdp_llama_config *cfg, char **out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, cfg);
    FSDP_ARG_NOT_NULL(ctx, out);
    fsdp_llama_config c;
    FSDP_TRY_AT(ctx, fsdp_llama_config_resolve(ctx, cfg, &c));
    if (c.n_layers < 1 || c.vocab_size < 1)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Llama config for Hugging Face: n_layers (%d) and vocab_size (%lld) must "
                         "be at least 1",
                         c.n_layers, (long long)c.vocab_size);
    const fsdp_llama_rope_scaling *rs = &c.rope_scaling;
    bool llama3 = rs->type == FSDP_LLAMA_ROPE_LLAMA3;
    json_t *rope = llama3 ? rope_llama3_json(rs, true, c.rope_theta)
                          : json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta",
                                      short_real(c.rope_theta));
    json_t *j = json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:o, s:f, s:s, s:b, s:b, "
        "s:b, s:s}",
        "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size",
        (json_int_t)c.dim, "intermediate_size", (json_int_t)c.ffn_hidden, "num_attention_heads",
        (json_int_t)c.n_heads, "num_key_value_heads", (json_int_t)c.n_kv_heads, "num_hidden_layers",
        (json_int_t)c.n_layers, "head_dim", (json_int_t)(c.dim / c.n_heads), "vocab_size",
        (json_int_t)c.vocab_size, "max_position_embeddings", (json_int_t)c.max_seq_len,
        "rms_norm_eps", short_real(c.norm_eps), "rope_theta", short_real(c.rope_theta),
        "rope_parameters", rope, "initializer_range", short_real(c.init_std), "hidden_act", "silu",
        "attention_bias", 0, "mlp_bias", 0, "tie_word_embeddings", (int)c.tie_word_embeddings,
        "torch_dtype", "float32");
    /* transformers 4 reads rope_scaling, 5 rope_parameters (and takes rope_scaling first) */
    if (j && llama3 && json_object_set_new(j, "rope_scaling", rope_llama3_json(rs, false, 0)) != 0)
        json_decref(j), j = NULL;
    char *text =
        j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!text) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "Llama config.json");
    /* A copy with a final newline, which the caller frees with free(). */
    size_t n = strlen(text);
    *out = malloc(n + 2);
    if (*out) memcpy(*out, text, n), memcpy(*out + n, "\n", 2);
    free(text);
    return *out ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "Llama config.json");
}

static fsdp_status bad_key(fsdp_ctx *ctx, const char *key, const char *what) {
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT, "Hugging Face config.json: \"%s\" %s", key,
                     what);
}

/* An integer key in [lo, hi]; absent: *v keeps its default unless required. */
static fsdp_status get_int(fsdp_ctx *ctx, json_t *j, const char *key, bool required, int64_t lo,
                           int64_t hi, int64_t *v) {
    json_t *x = json_object_get(j, key);
    if (!x || json_is_null(x))
        return required ? bad_key(ctx, key, "is missing; a LlamaConfig names it") : FSDP_OK;
    if (!json_is_integer(x)) return bad_key(ctx, key, "must be a whole number");
    json_int_t n = json_integer_value(x);
    if (n < lo || n > hi)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Hugging Face config.json: \"%s\" is %lld; libfsdp takes %lld .. %lld",
                         key, (long long)n, (long long)lo, (long long)hi);
    *v = n;
    return FSDP_OK;
}

/* A positive finite number key; absent or null keeps the default. */
static fsdp_status get_real(fsdp_ctx *ctx, json_t *j, const char *key, float *v) {
    json_t *x = json_object_get(j, key);
    if (!x || json_is_null(x)) return FSDP_OK;
    double d = json_number_value(x);
    if (!json_is_number(x) || !(d > 0) || !isfinite((float)d))
        return bad_key(ctx, key, "must be a positive number within float32's range");
    *v = (float)d;
    return FSDP_OK;
}

/* A boolean key that libfsdp supports only as `want` (absent: HF's default, which is `want`). */
static fsdp_status require_bool(fsdp_ctx *ctx, json_t *j, const char *key, bool want,
                                const char *why) {
    json_t *x = json_object_get(j, key);
    if (!x || json_is_null(x)) return FSDP_OK;
    if (!json_is_boolean(x)) return bad_key(ctx, key, "must be true or false");
    if (json_is_true(x) == want) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED, "Hugging Face config.json: \"%s\" is %s: %s", key,
                     want ? "false" : "true", why);
}

/* What fsdp_model_llama does not build is refused. */
static fsdp_status check_supported(fsdp_ctx *ctx, json_t *j) {
    json_t *mt = json_object_get(j, "model_type");
    if (!json_is_string(mt) || strcmp(json_string_value(mt), "llama"))
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "Hugging Face config.json: \"model_type\" is %s%.32s%s; libfsdp builds "
                         "\"llama\" models only",
                         json_is_string(mt) ? "\"" : "",
                         json_is_string(mt) ? json_string_value(mt) : "missing",
                         json_is_string(mt) ? "\"" : "");
    FSDP_TRY_AT(ctx, require_bool(ctx, j, "attention_bias", false,
                                  "libfsdp's Llama attention has no biases"));
    FSDP_TRY_AT(ctx, require_bool(ctx, j, "mlp_bias", false, "libfsdp's Llama MLP has no biases"));
    json_t *act = json_object_get(j, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return bad_key(ctx, "hidden_act", "must be \"silu\" (SwiGLU), the only MLP libfsdp builds");
    return FSDP_OK;
}

/* A number of the rope scaling object `key` names, > 0 and finite. */
static fsdp_status rope_real(fsdp_ctx *ctx, json_t *r, const char *key, const char *field,
                             float *v) {
    json_t *x = json_object_get(r, field);
    double d = json_number_value(x);
    if (!json_is_number(x) || !(d > 0) || !isfinite((float)d))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Hugging Face config.json: \"%s\".\"%s\" %s; Llama 3's rope scaling "
                         "needs it as a positive number",
                         key, field,
                         x ? "is not a positive number within float32's range" : "is missing");
    *v = (float)d;
    return FSDP_OK;
}

/* The rotary scaling: "rope_scaling" (transformers 4, and first in 5) or else
 * "rope_parameters" (5): none, "default" or "llama3"; any other type is refused. */
static fsdp_status read_rope_scaling(fsdp_ctx *ctx, json_t *j, int64_t max_pos,
                                     fsdp_llama_rope_scaling *out) {
    const char *key = "rope_scaling";
    json_t *r = json_object_get(j, key);
    if (!r || json_is_null(r)) r = json_object_get(j, key = "rope_parameters");
    *out = (fsdp_llama_rope_scaling){0};
    if (!r || json_is_null(r)) return FSDP_OK;
    if (!json_is_object(r)) return bad_key(ctx, key, "must be an object or null");
    json_t *t = json_object_get(r, "rope_type");
    if (!t) t = json_object_get(r, "type"); /* the older spelling */
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (!t || (type && !strcmp(type, "default"))) return FSDP_OK;
    if (!type || strcmp(type, "llama3"))
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "Hugging Face config.json: \"%s\".\"rope_type\" is %s%.32s%s; libfsdp "
                         "implements \"default\" (no scaling) and \"llama3\" (Llama 3.1 and "
                         "3.2) only",
                         key, type ? "\"" : "", type ? type : "not a string", type ? "\"" : "");
    out->type = FSDP_LLAMA_ROPE_LLAMA3;
    FSDP_TRY_AT(ctx, rope_real(ctx, r, key, "factor", &out->factor));
    FSDP_TRY_AT(ctx, rope_real(ctx, r, key, "low_freq_factor", &out->low_freq_factor));
    FSDP_TRY_AT(ctx, rope_real(ctx, r, key, "high_freq_factor", &out->high_freq_factor));
    out->original_max_len = max_pos; /* transformers' fallback */
    json_t *o = json_object_get(r, "original_max_position_embeddings");
    if (o && !json_is_null(o)) {
        if (!json_is_integer(o) || json_integer_value(o) < 1 ||
            json_integer_value(o) > ((json_int_t)1 << 24))
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "Hugging Face config.json: \"%s\".\"original_max_position_"
                             "embeddings\" must be a whole number in 1 .. 2^24",
                             key);
        out->original_max_len = json_integer_value(o);
    }
    return FSDP_OK;
}

static fsdp_status read_config(fsdp_ctx *ctx, json_t *j, fsdp_llama_config *c) {
    if (!json_is_object(j))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Hugging Face config.json is not a JSON object");
    FSDP_TRY_AT(ctx, check_supported(ctx, j));
    int64_t dim = 0, layers = 0, heads = 0, kv = 0, vocab = 0, ffn = 0, seq = 2048;
    FSDP_TRY_AT(ctx, get_int(ctx, j, "hidden_size", true, 1, 1 << 20, &dim));
    FSDP_TRY_AT(ctx, get_int(ctx, j, "num_hidden_layers", true, 1, HF_MAX_LAYERS, &layers));
    FSDP_TRY_AT(ctx, get_int(ctx, j, "num_attention_heads", true, 1, 1 << 20, &heads));
    FSDP_TRY_AT(ctx, get_int(ctx, j, "num_key_value_heads", false, 1, 1 << 20, &kv));
    FSDP_TRY_AT(ctx, get_int(ctx, j, "vocab_size", true, 1, INT32_MAX, &vocab));
    FSDP_TRY_AT(ctx, get_int(ctx, j, "intermediate_size", true, 1, (int64_t)1 << 24, &ffn));
    FSDP_TRY_AT(ctx, get_int(ctx, j, "max_position_embeddings", false, 1, (int64_t)1 << 24, &seq));
    int64_t head_dim = dim / heads;
    FSDP_TRY_AT(ctx, get_int(ctx, j, "head_dim", false, 1, 1 << 20, &head_dim));
    if (head_dim * heads != dim)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "Hugging Face config.json: head_dim %lld times num_attention_heads %lld "
                         "is not hidden_size %lld; libfsdp's head size is hidden_size / "
                         "num_attention_heads",
                         (long long)head_dim, (long long)heads, (long long)dim);
    *c = (fsdp_llama_config){.dim = dim,
                             .n_layers = (int)layers,
                             .n_heads = (int)heads,
                             .n_kv_heads = (int)kv,
                             .vocab_size = vocab,
                             .ffn_hidden = ffn,
                             .max_seq_len = seq,
                             .norm_eps = 1e-6f,
                             .rope_theta = 10000.0f,
                             .init_std = 0.02f};
    FSDP_TRY_AT(ctx, get_real(ctx, j, "rms_norm_eps", &c->norm_eps));
    FSDP_TRY_AT(ctx, get_real(ctx, j, "initializer_range", &c->init_std));
    json_t *rp = json_object_get(j, "rope_parameters"); /* transformers 5; wins over the old key */
    FSDP_TRY_AT(ctx, get_real(ctx, j, "rope_theta", &c->rope_theta));
    if (json_is_object(rp)) FSDP_TRY_AT(ctx, get_real(ctx, rp, "rope_theta", &c->rope_theta));
    json_t *tie = json_object_get(j, "tie_word_embeddings"); /* LlamaConfig's default: false */
    if (tie && !json_is_null(tie) && !json_is_boolean(tie))
        return bad_key(ctx, "tie_word_embeddings", "must be true or false");
    c->tie_word_embeddings = json_is_true(tie);
    return read_rope_scaling(ctx, j, seq, &c->rope_scaling);
}

fsdp_status fsdp_llama_config_from_hf_json(fsdp_ctx *ctx, const char *json,
                                           fsdp_llama_config *out) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, json);
    FSDP_ARG_NOT_NULL(ctx, out);
    if (strlen(json) > FSDP_HF_CONFIG_MAX)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Hugging Face config.json: %zu bytes, more than the %d read", strlen(json),
                         FSDP_HF_CONFIG_MAX);
    json_error_t err;
    json_t *j = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!j)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "Hugging Face config.json is not valid JSON: %s (line %d, column %d)",
                         err.text, err.line, err.column);
    fsdp_llama_config c;
    fsdp_status s = read_config(ctx, j, &c);
    json_decref(j);
    if (s == FSDP_OK) s = fsdp_llama_config_resolve(ctx, &c, out);
    if (s != FSDP_OK)
        s = fsdp_error_hop(ctx, s, __FILE__, __LINE__, __func__, "Hugging Face config.json");
    return FSDP_PASS(ctx, s);
}

/* ---- export as a model directory ---- */

/* The i-th parameter of a Llama of config c in named_parameters() order, or false past the end. */
static bool llama_param(const fsdp_llama_config *c, int i, char *name, size_t size, int *ndim,
                        int64_t shape[2]) {
    int64_t hd = c->dim / c->n_heads, q = c->n_heads * hd, kv = c->n_kv_heads * hd;
    static const char *const per_layer[] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
        "mlp.down_proj",    "input_layernorm",  "post_attention_layernorm"};
    const int64_t rows[] = {q,      kv,     kv,    c->dim, c->ffn_hidden, c->ffn_hidden,
                            c->dim, c->dim, c->dim};
    const int64_t cols[] = {c->dim, c->dim, c->dim, q, c->dim, c->dim, c->ffn_hidden, 0, 0};
    int n_layer = 9, last = 1 + n_layer * c->n_layers;
    if (i == 0) {
        snprintf(name, size, "model.embed_tokens.weight");
        *ndim = 2, shape[0] = c->vocab_size, shape[1] = c->dim;
    } else if (i < last) {
        int l = (i - 1) / n_layer, k = (i - 1) % n_layer;
        snprintf(name, size, "model.layers.%d.%s.weight", l, per_layer[k]);
        *ndim = cols[k] ? 2 : 1, shape[0] = rows[k], shape[1] = cols[k];
    } else if (i == last) {
        snprintf(name, size, "model.norm.weight");
        *ndim = 1, shape[0] = c->dim;
    } else if (i == last + 1 && !c->tie_word_embeddings) { /* tied: the embedding's, once */
        snprintf(name, size, "lm_head.weight");
        *ndim = 2, shape[0] = c->vocab_size, shape[1] = c->dim;
    } else {
        return false;
    }
    return true;
}

/* The checkpoint's parameters and buffers are exactly the Llama's, by name and shape. */
static fsdp_status check_llama_tensors(fsdp_ctx *ctx, const fsdp_ckpt *ck,
                                       const fsdp_llama_config *c) {
    char name[FSDP_STATE_NAME_MAX];
    int ndim, n = 0;
    int64_t shape[2];
    for (; llama_param(c, n, name, sizeof name, &ndim, shape); n++) {
        int t = fsdp_ckpt_find(ck, name);
        const ckpt_tensor *x = t >= 0 ? &ck->meta.tensors[t] : NULL;
        if (!x || x->kind != FSDP_STATE_PARAM)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "checkpoint '%s' has no parameter '%s', which its model configuration "
                             "(a Llama of %d layers) has: was it saved from another model?",
                             ck->path, name, c->n_layers);
        bool same = x->ndim == ndim;
        for (int d = 0; same && d < ndim; d++) same = x->shape[d] == shape[d];
        if (!same) {
            char has[128], wants[128];
            fsdp_shape_string(x->ndim, x->shape, has, sizeof has);
            fsdp_shape_string(ndim, shape, wants, sizeof wants);
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "checkpoint '%s': parameter '%s' is %s where its model configuration "
                             "wants %s: the configuration does not describe this checkpoint",
                             ck->path, name, has, wants);
        }
    }
    for (int t = 0; t < ck->meta.n_tensors; t++) {
        const ckpt_tensor *x = &ck->meta.tensors[t];
        if (x->kind == FSDP_STATE_OPTIM) continue;
        bool known = false;
        for (int i = 0; !known && llama_param(c, i, name, sizeof name, &ndim, shape); i++)
            known = !strcmp(name, x->name);
        if (!known)
            return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                             "checkpoint '%s' has tensor '%s', which LlamaForCausalLM does not "
                             "have (from_pretrained would call it unexpected): export with "
                             "--format safetensors instead",
                             ck->path, x->name);
    }
    return FSDP_OK;
}

static fsdp_status write_text(fsdp_ctx *ctx, const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot create '%s': %s; check the directory", path,
                         strerror(errno));
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok) ckpt_remove_partial(path);
    return ok ? FSDP_OK
              : FSDP_FAIL(ctx, FSDP_ERR_IO,
                          "writing '%s' failed: %s; check that its disk has room and that it is "
                          "writable",
                          path, strerror(errno));
}

/* ---- the byte tokenizer ---- */

#define BYTE_VOCAB 256 /* tools/text_to_tokens.py's byte tokenizer: token id = byte value */

/* The character GPT-2's byte-level pre-tokenizer shows byte b as (bytes_to_unicode: printable
 * Latin-1 bytes as themselves, the others as U+0100 onwards in byte order), UTF-8 into out. */
static void byte_char(int b, char out[3]) {
    int cp = b, extra = 0;
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    if (!printable) {
        for (int c = 0; c < b; c++)
            extra += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE));
        cp = 256 + extra;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = '\0';
    }
}

/* tokenizer.json (Hugging Face tokenizers) of the byte tokenizer: a ByteLevel pre-tokenizer and
 * decoder around a BPE without merges whose 256 tokens are the bytes, id = byte value; and a
 * tokenizer_config.json naming PreTrainedTokenizerFast, so AutoTokenizer.from_pretrained(dir)
 * encodes and decodes text for the model. */
static fsdp_status write_byte_tokenizer(fsdp_ctx *ctx, const char *dir, int64_t max_len) {
    json_t *vocab = json_object();
    for (int b = 0; vocab && b < BYTE_VOCAB; b++) {
        char ch[3];
        byte_char(b, ch);
        if (json_object_set_new(vocab, ch, json_integer(b)) != 0) json_decref(vocab), vocab = NULL;
    }
    const char *bl = "{s:s, s:b, s:b, s:b}";
    json_t *tok = vocab
                      ? json_pack("{s:s, s:n, s:n, s:[], s:n, s:o, s:n, s:o, s:{s:s, s:n, s:n, "
                                  "s:n, s:n, s:b, s:b, s:b, "
                                  "s:o, s:[]}}",
                                  "version", "1.0", "truncation", "padding", "added_tokens",
                                  "normalizer", "pre_tokenizer",
                                  json_pack(bl, "type", "ByteLevel", "add_prefix_space", 0,
                                            "trim_offsets", 0, "use_regex", 0),
                                  "post_processor", "decoder",
                                  json_pack(bl, "type", "ByteLevel", "add_prefix_space", 0,
                                            "trim_offsets", 0, "use_regex", 0),
                                  "model", "type", "BPE", "dropout", "unk_token",
                                  "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                                  "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges")
                      : NULL;
    json_t *cfg =
        json_pack("{s:s, s:I, s:b}", "tokenizer_class", "PreTrainedTokenizerFast",
                  "model_max_length", (json_int_t)max_len, "clean_up_tokenization_spaces", 0);
    int flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER;
    char *t1 = tok ? json_dumps(tok, flags) : NULL, *t2 = cfg ? json_dumps(cfg, flags) : NULL;
    json_decref(tok);
    json_decref(cfg);
    char path[4200];
    fsdp_status s =
        t1 && t2 ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "the byte tokenizer's JSON");
    if (s == FSDP_OK) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        s = write_text(ctx, path, t1);
    }
    if (s == FSDP_OK) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        s = write_text(ctx, path, t2);
    }
    free(t1);
    free(t2);
    return FSDP_PASS(ctx, s);
}

fsdp_status fsdp_ckpt_export_hf(fsdp_ctx *ctx, fsdp_ckpt *ck, const char *dir,
                                const fsdp_ckpt_export_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, dir);
    if (opts && (opts->with_optim || opts->zstd_level))
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "export to Hugging Face '%s': a model directory holds the parameters "
                         "only, uncompressed; leave with_optim and zstd_level unset",
                         dir);
    if (!*dir || strlen(dir) > 3000)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "export to Hugging Face: the directory name is empty or too long");
    if (!ck->meta.model_config || !*ck->meta.model_config)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "checkpoint '%s' has no model configuration, which config.json needs: "
                         "save it with fsdp_ckpt_meta.model_config set to the text of "
                         "fsdp_llama_config_to_hf_json, or export the weights alone with "
                         "--format safetensors",
                         ck->path);
    fsdp_llama_config c;
    fsdp_status s = fsdp_llama_config_from_hf_json(ctx, ck->meta.model_config, &c);
    if (s != FSDP_OK)
        return fsdp_error_hop(ctx, s, __FILE__, __LINE__, __func__,
                              "the model configuration of '%s'", ck->path);
    FSDP_TRY_AT(ctx, check_llama_tensors(ctx, ck, &c));
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot create directory '%s': %s", dir,
                         strerror(errno));
    char *text = NULL, path[4200];
    FSDP_TRY_AT(ctx, fsdp_llama_config_to_hf_json(ctx, &c, &text));
    snprintf(path, sizeof path, "%s/config.json", dir);
    s = write_text(ctx, path, text);
    free(text);
    if (s != FSDP_OK) return FSDP_PASS(ctx, s);
    char weights[4200];
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    s = fsdp_ckpt_export_safetensors(ctx, ck, weights, NULL);
    if (s == FSDP_OK && c.vocab_size == BYTE_VOCAB)
        s = write_byte_tokenizer(ctx, dir, c.max_seq_len);
    if (s != FSDP_OK) ckpt_remove_partial(path);
    return FSDP_PASS(ctx, s);
}
