/* kind_llama_init.c: [model] init = <Hugging Face directory> for kind = llama: the model's
 * shape comes from its config.json (read and checked by fsdp_llama_config_from_hf_json); every
 * [model] key left at its default takes the file's value, and one set in the configuration
 * must agree, or the message names both values and both places. */
#define _POSIX_C_SOURCE 200809L // open flags, fstat

#include <errno.h>
#include <fcntl.h> // defines: open, O_NONBLOCK
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: stat, fstat, S_ISDIR, S_ISREG
#include <unistd.h>   // defines: read, close

#include "train_kind.h"  // defines: train_kind, train_config_set_from
#include "train_llama.h" // defines: train_llama_adopt_init

/* One [model] key and the config.json key it comes from. */
typedef struct hf_key {
    const char *key;  /* [model] key */
    const char *hf;   /* config.json key */
    double value;     /* the file's, resolved */
    double have;      /* this configuration's, resolved (0 for a default of "take the model's") */
    bool is_float;    /* compared as float32 */
    bool upper_bound; /* max_seq_len: a set value may be shorter than the file's */
    const char *text; /* the value as the key's text when not a number (an enum) */
} hf_key;

/* The whole config.json (at most FSDP_HF_CONFIG_MAX bytes, a regular file, no NUL byte) into
 * *text, malloc'ed. */
static fsdp_status read_config(const char *path, const char *key, char **text, char *err,
                               size_t err_size) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO: no wait */
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > FSDP_HF_CONFIG_MAX) {
        snprintf(err, err_size,
                 "%s: cannot read '%s'%s%s; a Hugging Face model directory holds config.json, "
                 "a regular file of at most %d bytes",
                 key, path, fd < 0 ? ": " : "", fd < 0 ? strerror(errno) : "", FSDP_HF_CONFIG_MAX);
        if (fd >= 0) close(fd);
        return FSDP_ERR_CONFIG;
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = malloc(n + 1);
    while (buf && got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0 && !(r < 0 && errno == EINTR)) break;
        if (r > 0) got += (size_t)r;
    }
    close(fd);
    if (!buf || got != n || memchr(buf, '\0', n)) {
        snprintf(err, err_size, "%s: cannot read '%s'%s", key, path,
                 buf && got == n ? ": it holds a NUL byte, it is not JSON text" : "");
        free(buf);
        return FSDP_ERR_CONFIG;
    }
    buf[n] = '\0';
    *text = buf;
    return FSDP_OK;
}

/* The [model] keys config.json describes, with both sides resolved. */
static int hf_keys(const train_config *cfg, const fsdp_llama_config *c, hf_key *k) {
    int64_t heads = cfg->model.n_heads, dim = cfg->model.dim;
    int64_t kv = cfg->model.n_kv_heads ? cfg->model.n_kv_heads : heads;
    int64_t ffn = cfg->model.ffn_hidden ? cfg->model.ffn_hidden : (8 * dim / 3 + 255) / 256 * 256;
    int n = 0;
#define HF_KEY(k_, hf_, v_, h_, ...)                                                               \
    k[n++] = (hf_key){                                                                             \
        .key = (k_), .hf = (hf_), .value = (double)(v_), .have = (double)(h_), __VA_ARGS__}
    HF_KEY("dim", "hidden_size", c->dim, dim, .is_float = false);
    HF_KEY("n_layers", "num_hidden_layers", c->n_layers, cfg->model.n_layers, .is_float = false);
    HF_KEY("n_heads", "num_attention_heads", c->n_heads, heads, .is_float = false);
    HF_KEY("n_kv_heads", "num_key_value_heads", c->n_kv_heads, kv, .is_float = false);
    HF_KEY("vocab_size", "vocab_size", c->vocab_size, cfg->model.vocab_size, .is_float = false);
    HF_KEY("ffn_hidden", "intermediate_size", c->ffn_hidden, ffn, .is_float = false);
    HF_KEY("max_seq_len", "max_position_embeddings", c->max_seq_len, cfg->model.max_seq_len,
           .upper_bound = true);
    HF_KEY("norm_eps", "rms_norm_eps", c->norm_eps, (float)cfg->model.norm_eps, .is_float = true);
    HF_KEY("rope_theta", "rope_theta", c->rope_theta, (float)cfg->model.rope_theta,
           .is_float = true);
    HF_KEY("tie_embeddings", "tie_word_embeddings", c->tie_word_embeddings,
           cfg->model.tie_embeddings, .text = c->tie_word_embeddings ? "true" : "false");
    const fsdp_llama_rope_scaling *r = &c->rope_scaling;
    bool llama3 = r->type == FSDP_LLAMA_ROPE_LLAMA3;
    HF_KEY("rope_scaling", "rope_scaling", llama3, cfg->model.rope_scaling,
           .text = llama3 ? "llama3" : "none");
    if (llama3) {
        HF_KEY("rope_factor", "rope_scaling.factor", r->factor, (float)cfg->model.rope_factor,
               .is_float = true);
        HF_KEY("rope_low_freq_factor", "rope_scaling.low_freq_factor", r->low_freq_factor,
               (float)cfg->model.rope_low_freq_factor, .is_float = true);
        HF_KEY("rope_high_freq_factor", "rope_scaling.high_freq_factor", r->high_freq_factor,
               (float)cfg->model.rope_high_freq_factor, .is_float = true);
        HF_KEY("rope_original_max_len", "rope_scaling.original_max_position_embeddings",
               r->original_max_len, cfg->model.rope_original_max_len, .is_float = false);
    }
#undef HF_KEY
    return n;
}

/* A key set in the configuration that the file contradicts: the message names both. */
static fsdp_status disagree(const train_config *cfg, const hf_key *k, const char *path, char *err,
                            size_t err_size) {
    char mine[TRAIN_KEY_TEXT_SIZE], init[TRAIN_KEY_TEXT_SIZE];
    train_config_key_text(cfg, "model", k->key, mine, sizeof mine);
    train_config_key_text(cfg, "model", "init", init, sizeof init);
    if (k->upper_bound)
        snprintf(err, err_size,
                 "%s is longer than %s = %.9g in '%s' (%s): the model was built for sequences "
                 "of at most that many positions; train on at most %.9g, or remove [model] %s "
                 "to take the model's",
                 mine, k->hf, k->value, path, init, k->value, k->key);
    else {
        char value[64];
        if (k->text)
            snprintf(value, sizeof value, "%s", k->text);
        else
            snprintf(value, sizeof value, "%.9g", k->value);
        snprintf(err, err_size,
                 "%s disagrees with %s = %s in '%s' (%s), which gives the model's shape: "
                 "remove [model] %s to take the model's value (or set it to %s), or give "
                 "another [model] init",
                 mine, k->hf, value, path, init, k->key, value);
    }
    return FSDP_ERR_CONFIG;
}

/* The file's values into the keys left at their defaults; the others checked. */
static fsdp_status adopt(train_config *cfg, const fsdp_llama_config *c, const char *path,
                         bool *changed, char *err, size_t err_size) {
    hf_key k[24];
    int n = hf_keys(cfg, c, k);
    for (int i = 0; i < n; i++) {
        const char *origin = train_config_origin(cfg, "model", k[i].key);
        bool same = k[i].is_float ? (float)k[i].have == (float)k[i].value : k[i].have == k[i].value;
        if (origin && strcmp(origin, "default") != 0) {
            bool fits = k[i].upper_bound ? k[i].have <= k[i].value : same;
            if (!fits) return disagree(cfg, &k[i], path, err, err_size);
            continue;
        }
        char text[64], where[TRAIN_MAX_STRING + 128];
        if (k[i].text)
            snprintf(text, sizeof text, "%s", k[i].text);
        else
            snprintf(text, sizeof text, k[i].is_float ? "%.9g" : "%.0f", k[i].value);
        snprintf(where, sizeof where, "%s, %s", path, k[i].hf);
        fsdp_status st = train_config_set_from(cfg, "model", k[i].key, text, where, err, err_size);
        if (st != FSDP_OK) {
            train_append(err, err_size,
                         "; fsdp-train takes this model only with [model] %s set to a value it "
                         "takes (for max_seq_len: the sequence length to train on)",
                         k[i].key);
            return st;
        }
        *changed = true;
    }
    return FSDP_OK;
}

fsdp_status train_llama_adopt_init(train_config *cfg, bool *changed, char *err, size_t err_size) {
    const char *init = cfg->model.init;
    char path[TRAIN_MAX_STRING + 32], key[TRAIN_KEY_TEXT_SIZE];
    struct stat sb;
    *changed = false;
    snprintf(path, sizeof path, "%s/config.json", init);
    if (strcmp(init, "random") == 0 || stat(init, &sb) != 0 || !S_ISDIR(sb.st_mode) ||
        stat(path, &sb) != 0)
        return FSDP_OK; /* a checkpoint, a state dict file or random: no shape to take */
    train_config_key_text(cfg, "model", "init", key, sizeof key);
    char *text = NULL;
    fsdp_status st = read_config(path, key, &text, err, err_size);
    if (st != FSDP_OK) return st;
    fsdp_ctx_options o = {.log_level = FSDP_LOG_OFF};
    fsdp_ctx *ctx = NULL;
    if (fsdp_ctx_create(&o, &ctx) != FSDP_OK) {
        free(text);
        snprintf(err, err_size, "cannot create a context (out of memory?)");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    fsdp_llama_config c;
    st = fsdp_llama_config_from_hf_json(ctx, text, &c);
    free(text);
    if (st != FSDP_OK) {
        snprintf(err, err_size, "%s: '%s': %s", key, path, fsdp_last_error(ctx));
        fsdp_ctx_free(ctx);
        return FSDP_ERR_CONFIG;
    }
    fsdp_ctx_free(ctx);
    return adopt(cfg, &c, path, changed, err, err_size);
}
