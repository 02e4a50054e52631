/* train_tokens.c: fsdp-train's token stream: one file or the sorted matches of a glob pattern,
 * each mapped read-only with its header checked against its size (train_token_formats.c), every
 * id against the vocabulary, the held-out split, the unigram entropy, and where each sequence a
 * step or an evaluation scores starts. */
#define _POSIX_C_SOURCE 200809L // fstat, mmap, glob

#include "train_tokens.h"

#include <errno.h>
#include <fcntl.h> // defines: open
#include <glob.h>  // defines: glob, globfree
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h> // defines: mmap, munmap
#include <sys/stat.h> // defines: stat, fstat, S_ISREG
#include <unistd.h>   // defines: close

#define STREAM_TOKENS "fsdp-train/tokens"
#define NAME_SIZE     (2 * TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 96)

/* "token file 'path' ([data] path, origin)", or for a match of a pattern "token file 'path'
 * (matched by [data] path 'pattern', origin)", for messages. */
static void file_text(const train_config *cfg, const char *path, char *buf, size_t size) {
    if (strcmp(path, cfg->data.path) == 0)
        snprintf(buf, size, "token file '%s' ([data] path, %s)", path,
                 train_config_origin(cfg, "data", "path"));
    else
        snprintf(buf, size, "token file '%s' (matched by [data] path '%s', %s)", path,
                 cfg->data.path, train_config_origin(cfg, "data", "path"));
}

static bool is_pattern(const char *path) {
    struct stat sb;
    return strpbrk(path, "*?[") && stat(path, &sb) != 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files of the stream: [data] path, or its pattern's matches sorted by name. */
static fsdp_status list_files(const train_config *cfg, char ***paths, int *n, char *err,
                              size_t err_size) {
    const char *path = cfg->data.path;
    if (!is_pattern(path)) {
        *paths = malloc(sizeof **paths);
        if (!*paths || !((*paths)[0] = strdup(path))) return FSDP_ERR_OUT_OF_MEMORY;
        *n = 1;
        return FSDP_OK;
    }
    glob_t g;
    int rc = glob(path, 0, NULL, &g);
    if (rc != 0) {
        if (rc != GLOB_NOMATCH) globfree(&g);
        snprintf(err, err_size,
                 "[data] path '%s' (%s) is a pattern that %s; give a token file, or a pattern "
                 "that matches the shards (e.g. 'data/shard_*.bin')",
                 path, train_config_origin(cfg, "data", "path"),
                 rc == GLOB_NOMATCH ? "matches no file" : "cannot be expanded (a read error)");
        return rc == GLOB_NOMATCH ? FSDP_ERR_CONFIG : FSDP_ERR_IO;
    }
    if (g.gl_pathc > (size_t)INT32_MAX / 2 || !(*paths = calloc(g.gl_pathc, sizeof **paths))) {
        globfree(&g);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    *n = (int)g.gl_pathc;
    for (int i = 0; i < *n; i++)
        if (!((*paths)[i] = strdup(g.gl_pathv[i]))) {
            globfree(&g);
            return FSDP_ERR_OUT_OF_MEMORY;
        }
    globfree(&g);
    qsort(*paths, (size_t)*n, sizeof **paths, by_name);
    return FSDP_OK;
}

/* Maps one file and reads its layout. */
static fsdp_status open_shard(const train_config *cfg, train_token_shard *s, char *err,
                              size_t err_size) {
    char name[NAME_SIZE];
    file_text(cfg, s->path, name, sizeof name);
    /* Refused before it is opened: opening a FIFO would wait for a writer forever. */
    struct stat sb;
    if (stat(s->path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        snprintf(err, err_size,
                 "cannot read %s: not a regular file (a %s); give the path of a token file "
                 "(write one with tools/text_to_tokens.py)",
                 name,
                 S_ISFIFO(sb.st_mode)  ? "FIFO"
                 : S_ISDIR(sb.st_mode) ? "directory"
                                       : "device or socket");
        return FSDP_ERR_IO;
    }
    int fd = open(s->path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, err_size, "cannot open %s: %s", name, strerror(errno));
        return FSDP_ERR_IO;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        snprintf(err, err_size, "cannot read %s: not a regular file; give the path of a token file",
                 name);
        return FSDP_ERR_IO;
    }
    s->map_size = (size_t)sb.st_size;
    if (s->map_size > 0) {
        void *m = mmap(NULL, s->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            snprintf(err, err_size, "cannot map %s (%zu bytes) into memory: %s", name, s->map_size,
                     strerror(errno));
            close(fd);
            s->map_size = 0;
            return FSDP_ERR_IO;
        }
        s->map = m;
    }
    close(fd); /* the mapping stays */
    static const unsigned char none[1];
    fsdp_status st = train_token_layout_read(s->map ? s->map : none, s->map_size,
                                             (int64_t)s->map_size, name, &s->layout, err, err_size);
    if (st != FSDP_OK) return st;
    char k[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
    if (s->layout.vocab > (uint64_t)cfg->model.vocab_size) {
        snprintf(err, err_size,
                 "%s was written by a tokenizer of %llu ids (the header's vocab), but %s: the "
                 "model cannot score them all; set vocab_size to at least %llu",
                 name, (unsigned long long)s->layout.vocab,
                 train_config_key_text(cfg, "model", "vocab_size", k, sizeof k),
                 (unsigned long long)s->layout.vocab);
        return FSDP_ERR_CONFIG;
    }
    return FSDP_OK;
}

/* Every id of a shard in [0, vocab_size). */
static fsdp_status check_ids(const train_config *cfg, const train_token_shard *s, char *err,
                             size_t err_size) {
    const train_token_layout *l = &s->layout;
    const unsigned char *data = s->map + l->offset;
    int64_t vocab = cfg->model.vocab_size, first_bad = -1, max_id = 0, min_id = 0;
    for (int64_t i = 0; i < l->count; i++) {
        int64_t v = train_token_layout_id(l, data, i);
        if (v > max_id) max_id = v;
        if (v < min_id) min_id = v;
        if (first_bad < 0 && (v < 0 || v >= vocab)) first_bad = i;
    }
    if (first_bad < 0) return FSDP_OK;
    char name[NAME_SIZE], k[TRAIN_MAX_STRING + TRAIN_MAX_ORIGIN + 64];
    file_text(cfg, s->path, name, sizeof name);
    int64_t bad = train_token_layout_id(l, data, first_bad);
    if (bad < 0) {
        snprintf(err, err_size,
                 "%s: token %lld (counting from 0) is %lld, negative (the smallest is %lld): a "
                 "token id is in [0, vocab_size); the array holds something else, or was cast "
                 "from a wider type; write the ids again",
                 name, (long long)first_bad, (long long)bad, (long long)min_id);
        return FSDP_ERR_CONFIG;
    }
    snprintf(err, err_size,
             "%s: token %lld (counting from 0) is %lld, not below %s; the largest id in the file "
             "is %lld: set vocab_size to at least %lld, or write the file with a tokenizer of "
             "vocab_size ids",
             name, (long long)first_bad, (long long)bad,
             train_config_key_text(cfg, "model", "vocab_size", k, sizeof k), (long long)max_id,
             (long long)max_id + 1);
    return FSDP_ERR_CONFIG;
}

/* Opens every file of the stream in order and checks its ids. */
static fsdp_status open_stream(const train_config *cfg, train_tokens *t, char *err,
                               size_t err_size) {
    char **paths = NULL;
    int n = 0;
    fsdp_status st = list_files(cfg, &paths, &n, err, err_size);
    if (st == FSDP_OK && !(t->shards = calloc((size_t)n, sizeof *t->shards)))
        st = FSDP_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        if (t->shards)
            t->shards[i].path = paths[i];
        else
            free(paths[i]);
    }
    free(paths);
    if (st == FSDP_ERR_OUT_OF_MEMORY)
        snprintf(err, err_size, "out of memory for the file list of [data] path '%s'",
                 cfg->data.path);
    if (st != FSDP_OK) return st;
    t->n_shards = n;
    for (int i = 0; i < n; i++) {
        train_token_shard *s = &t->shards[i];
        if ((st = open_shard(cfg, s, err, err_size)) != FSDP_OK ||
            (st = check_ids(cfg, s, err, err_size)) != FSDP_OK)
            return st;
        if (s->layout.count > INT64_MAX - t->count) {
            snprintf(err, err_size, "[data] path '%s' holds more than 2^63 tokens", cfg->data.path);
            return FSDP_ERR_CONFIG;
        }
        s->first = t->count;
        t->count += s->layout.count;
        if ((int64_t)s->layout.vocab > t->file_vocab) t->file_vocab = (int64_t)s->layout.vocab;
    }
    return FSDP_OK;
}

void train_tokens_read(const train_tokens *t, int64_t start, int64_t n, uint32_t *out) {
    int lo = 0, hi = t->n_shards - 1; /* the last shard whose first id is <= start */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (t->shards[mid].first <= start)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int s = lo; n > 0 && s < t->n_shards; s++) {
        const train_token_shard *sh = &t->shards[s];
        const unsigned char *data = sh->map + sh->layout.offset;
        int64_t i = start - sh->first, take = sh->layout.count - i;
        if (take > n) take = n;
        for (int64_t j = 0; j < take; j++)
            out[j] = (uint32_t)train_token_layout_id(&sh->layout, data, i + j);
        out += take;
        start += take;
        n -= take;
    }
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

/* -sum p log p over the training tokens' frequencies, in nats (read in windows). */
static fsdp_status unigram_entropy(const train_config *cfg, train_tokens *t) {
    enum { WINDOW = 4096 };
    uint64_t *counts = calloc((size_t)cfg->model.vocab_size, sizeof *counts);
    uint32_t *ids = malloc(WINDOW * sizeof *ids);
    if (!counts || !ids) {
        free(counts);
        free(ids);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < t->n_train; i += WINDOW) {
        int64_t n = t->n_train - i < WINDOW ? t->n_train - i : WINDOW;
        train_tokens_read(t, i, n, ids);
        for (int64_t j = 0; j < n; j++) counts[ids[j]]++;
    }
    free(ids);
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
    char name[NAME_SIZE];
    if (is_pattern(cfg->data.path))
        snprintf(name, sizeof name, "the token files of [data] path '%s' (%s)", cfg->data.path,
                 train_config_origin(cfg, "data", "path"));
    else
        file_text(cfg, cfg->data.path, name, sizeof name);
    fsdp_status st = open_stream(cfg, t, err, err_size);
    if (st == FSDP_OK) st = split(cfg, name, t, err, err_size);
    if (st == FSDP_OK && (st = unigram_entropy(cfg, t)) != FSDP_OK)
        snprintf(err, err_size, "out of memory for the unigram counts of %s", name);
    if (st != FSDP_OK) train_tokens_free(t);
    return st;
}

void train_tokens_free(train_tokens *t) {
    for (int i = 0; t->shards && i < t->n_shards; i++) {
        if (t->shards[i].map) munmap((void *)t->shards[i].map, t->shards[i].map_size);
        free(t->shards[i].path);
    }
    free(t->shards);
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
