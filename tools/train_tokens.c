/* train_tokens.c: fsdp-train's token files: read once per process with every header field
 * checked against the file's size, every id against the vocabulary, the held-out split, the
 * unigram entropy, and where each sequence a step or an evaluation scores starts. */
#define _POSIX_C_SOURCE 200809L // fileno, fstat

#include "train_tokens.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: stat, fstat, S_ISREG

#include "train_data.h" // defines: TRAIN_MAX_DATA_BYTES

#define STREAM_TOKENS "fsdp-train/tokens"

static uint64_t le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static uint32_t le32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* "'path' ([data] path, origin)" for messages. */
static void file_text(const train_config *cfg, char *buf, size_t size) {
    snprintf(buf, size, "token file '%s' ([data] path, %s)", cfg->data.path,
             train_config_origin(cfg, "data", "path"));
}

/* Reads the header and checks it against the file's size; on success *count and *bytes hold
 * the ids that follow. */
static fsdp_status read_header(const train_config *cfg, FILE *f, const char *name, train_tokens *t,
                               char *err, size_t err_size) {
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, err_size, "cannot read %s: not a regular file; give the path of a token file",
                 name);
        return FSDP_ERR_IO;
    }
    int64_t size = (int64_t)sb.st_size;
    unsigned char h[TRAIN_TOKENS_HEADER];
    if (size < TRAIN_TOKENS_HEADER || fread(h, 1, sizeof h, f) != sizeof h) {
        snprintf(err, err_size,
                 "%s is %lld bytes, shorter than the %d-byte header of a token file: it is "
                 "truncated or not a token file; write it with tools/text_to_tokens.py",
                 name, (long long)size, TRAIN_TOKENS_HEADER);
        return FSDP_ERR_CONFIG;
    }
    if (memcmp(h, TRAIN_TOKENS_MAGIC, 8) != 0) { /* the magic with its NUL */
        char shown[40] = "";
        for (int i = 0; i < 8; i++)
            train_append(shown, sizeof shown, "%02x%s", h[i], i < 7 ? " " : "");
        snprintf(err, err_size,
                 "%s does not start with the magic \"%s\\0\" (its first bytes are %s): it is "
                 "not a token file; write one with tools/text_to_tokens.py",
                 name, TRAIN_TOKENS_MAGIC, shown);
        return FSDP_ERR_CONFIG;
    }
    uint32_t version = le32(h + 8), bytes = le32(h + 12);
    uint64_t count = le64(h + 16), vocab = le64(h + 24);
    if (version != TRAIN_TOKENS_VERSION) {
        snprintf(err, err_size,
                 "%s has format version %u, but this fsdp-train reads version %d; write it again "
                 "with this version's tools/text_to_tokens.py",
                 name, version, TRAIN_TOKENS_VERSION);
        return FSDP_ERR_CONFIG;
    }
    if (bytes != 2 && bytes != 4) {
        snprintf(err, err_size,
                 "%s says its token ids take %u bytes each, but only 2 (uint16) and 4 (uint32) "
                 "exist: the header is damaged; write the file again",
                 name, bytes);
        return FSDP_ERR_CONFIG;
    }
    int64_t body = size - TRAIN_TOKENS_HEADER;
    if (count > (uint64_t)body / bytes || count * bytes != (uint64_t)body) {
        snprintf(err, err_size,
                 "%s: its header says %llu tokens of %u bytes, but the file has %lld bytes after "
                 "the %d-byte header (%lld tokens and %lld bytes over): the count does not match "
                 "the size, so the file is truncated or was not written whole; write it again",
                 name, (unsigned long long)count, bytes, (long long)body, TRAIN_TOKENS_HEADER,
                 (long long)(body / bytes), (long long)(body % bytes));
        return FSDP_ERR_CONFIG;
    }
    if (count == 0) {
        snprintf(err, err_size, "%s holds no tokens; tokenize a text into it", name);
        return FSDP_ERR_CONFIG;
    }
    if ((int64_t)count > TRAIN_MAX_DATA_BYTES / 4) {
        snprintf(err, err_size,
                 "%s holds %llu tokens, more than the %lld that fsdp-train holds in memory "
                 "(TRAIN_MAX_DATA_BYTES, 4 bytes each); use a shorter text",
                 name, (unsigned long long)count, (long long)(TRAIN_MAX_DATA_BYTES / 4));
        return FSDP_ERR_CONFIG;
    }
    char k[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
    if (vocab > (uint64_t)cfg->model.vocab_size) {
        snprintf(err, err_size,
                 "%s was written by a tokenizer of %llu ids (the header's vocab), but %s: the "
                 "model cannot score them all; set vocab_size to at least %llu",
                 name, (unsigned long long)vocab,
                 train_config_key_text(cfg, "model", "vocab_size", k, sizeof k),
                 (unsigned long long)vocab);
        return FSDP_ERR_CONFIG;
    }
    t->count = (int64_t)count;
    t->bytes = (int)bytes;
    t->file_vocab = (int64_t)vocab;
    return FSDP_OK;
}

/* Reads the ids into t->ids (u32) and checks each against vocab_size. */
static fsdp_status read_ids(const train_config *cfg, FILE *f, const char *name, train_tokens *t,
                            char *err, size_t err_size) {
    size_t n = (size_t)t->count;
    if (!(t->ids = malloc(n * sizeof *t->ids))) {
        snprintf(err, err_size, "out of memory for the %lld tokens of %s", (long long)t->count,
                 name);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    unsigned char *raw = (unsigned char *)t->ids; /* read in place, widened from the end */
    if (fread(raw, (size_t)t->bytes, n, f) != n) {
        snprintf(err, err_size, "cannot read %s: %s", name,
                 ferror(f) ? strerror(errno) : "it ended early");
        return FSDP_ERR_IO;
    }
    if (t->bytes == 2)
        for (size_t i = n; i-- > 0;) {
            uint32_t v = (uint32_t)raw[2 * i] | (uint32_t)raw[2 * i + 1] << 8;
            t->ids[i] = v;
        }
    else
        for (size_t i = 0; i < n; i++) t->ids[i] = le32(raw + 4 * i);
    int64_t vocab = cfg->model.vocab_size, first_bad = -1;
    uint32_t max_id = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->ids[i] > max_id) max_id = t->ids[i];
        if (first_bad < 0 && (int64_t)t->ids[i] >= vocab) first_bad = (int64_t)i;
    }
    if (first_bad < 0) return FSDP_OK;
    char k[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
    snprintf(err, err_size,
             "%s: token %lld (counting from 0) is %u, not below %s; the largest id in the file is "
             "%u: set vocab_size to at least %lld, or write the file with a tokenizer of "
             "vocab_size ids",
             name, (long long)first_bad, t->ids[first_bad],
             train_config_key_text(cfg, "model", "vocab_size", k, sizeof k), max_id,
             (long long)max_id + 1);
    return FSDP_ERR_CONFIG;
}

/* The held-out split and the sequences evaluations score. */
static fsdp_status split(const train_config *cfg, const char *name, train_tokens *t, char *err,
                         size_t err_size) {
    int64_t T = cfg->model.max_seq_len, B = cfg->data.batch_size;
    int64_t held = (int64_t)floor((double)t->count * cfg->data.eval_fraction);
    char a[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64], b[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
    t->n_train = t->count - held;
    if (t->n_train < T + 1) {
        snprintf(err, err_size,
                 "%s has %lld training tokens (of %lld; %s holds out %lld), fewer than one "
                 "sequence of max_seq_len + 1 = %lld tokens (%s); use a longer text, a shorter "
                 "max_seq_len or a smaller eval_fraction",
                 name, (long long)t->n_train, (long long)t->count,
                 train_config_key_text(cfg, "data", "eval_fraction", a, sizeof a), (long long)held,
                 (long long)(T + 1),
                 train_config_key_text(cfg, "model", "max_seq_len", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    int64_t max = cfg->data.eval_batches * B;
    t->n_probe = max;
    if (held == 0) return FSDP_OK;
    int64_t windows = held >= T + 1 ? (held - 1) / T : 0; /* consecutive ones share a token */
    t->n_eval = windows / B * B;
    if (t->n_eval > max) t->n_eval = max;
    if (t->n_eval == 0) {
        snprintf(err, err_size,
                 "%s: the %lld held-out tokens (%s) make %lld sequences of max_seq_len + 1 = %lld "
                 "tokens, fewer than one batch of %s; raise eval_fraction, or lower batch_size "
                 "or max_seq_len",
                 name, (long long)held,
                 train_config_key_text(cfg, "data", "eval_fraction", a, sizeof a),
                 (long long)windows, (long long)(T + 1),
                 train_config_key_text(cfg, "data", "batch_size", b, sizeof b));
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* -sum p log p over the training tokens' frequencies, in nats. */
static fsdp_status unigram_entropy(const train_config *cfg, train_tokens *t) {
    uint32_t *counts = calloc((size_t)cfg->model.vocab_size, sizeof *counts);
    if (!counts) return FSDP_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < t->n_train; i++) counts[t->ids[i]]++;
    double h = 0, n = (double)t->n_train;
    for (int64_t v = 0; v < cfg->model.vocab_size; v++)
        if (counts[v]) h -= (double)counts[v] / n * log((double)counts[v] / n);
    t->entropy = h;
    free(counts);
    return FSDP_OK;
}

fsdp_status train_tokens_load(const train_config *cfg, train_tokens *t, char *err,
                              size_t err_size) {
    memset(t, 0, sizeof *t);
    char name[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
    file_text(cfg, name, sizeof name);
    /* Refused before it is opened: opening a FIFO would wait for a writer forever. */
    struct stat sb;
    if (stat(cfg->data.path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        snprintf(err, err_size,
                 "cannot read %s: not a regular file (a %s); give the path of a token file "
                 "(write one with tools/text_to_tokens.py)",
                 name,
                 S_ISFIFO(sb.st_mode)  ? "FIFO"
                 : S_ISDIR(sb.st_mode) ? "directory"
                                       : "device or socket");
        return FSDP_ERR_IO;
    }
    FILE *f = fopen(cfg->data.path, "rb");
    if (!f) {
        snprintf(err, err_size, "cannot open %s: %s", name, strerror(errno));
        return FSDP_ERR_IO;
    }
    fsdp_status st = read_header(cfg, f, name, t, err, err_size);
    if (st == FSDP_OK) st = read_ids(cfg, f, name, t, err, err_size);
    fclose(f);
    if (st == FSDP_OK) st = split(cfg, name, t, err, err_size);
    if (st == FSDP_OK && (st = unigram_entropy(cfg, t)) != FSDP_OK)
        snprintf(err, err_size, "out of memory for the unigram counts of %s", name);
    if (st != FSDP_OK) train_tokens_free(t);
    return st;
}

void train_tokens_free(train_tokens *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}

int64_t train_tokens_train_start(const train_config *cfg, const train_tokens *t, int64_t k) {
    int64_t range = t->n_train - cfg->model.max_seq_len; /* >= 1: split() checked */
    float u =
        fsdp_rng_uniform((uint64_t)cfg->data.seed, fsdp_rng_stream(STREAM_TOKENS), (uint64_t)k);
    int64_t start = (int64_t)((double)u * (double)range);
    return start < range ? start : range - 1;
}

int64_t train_tokens_eval_start(const train_config *cfg, const train_tokens *t, int64_t j) {
    return t->n_train + j * cfg->model.max_seq_len;
}

int64_t train_tokens_probe_start(const train_config *cfg, const train_tokens *t, int64_t j) {
    int64_t range = t->n_train - cfg->model.max_seq_len;
    if (t->n_probe < 2) return 0;
    return (int64_t)((double)j * (double)(range - 1) / (double)(t->n_probe - 1));
}
