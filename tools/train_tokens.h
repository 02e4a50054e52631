/* train_tokens.h: fsdp-train's token stream ([data] kind = tokens): one file or a glob of
 * shards, mapped and checked once per process, the held-out split, and which sequences a step, an
 * evaluation and the loss before and after training score. */
#ifndef FSDP_TOOLS_TRAIN_TOKENS_H
#define FSDP_TOOLS_TRAIN_TOKENS_H

#include "train_config.h"
#include "train_token_formats.h" // defines: train_token_layout, TRAIN_TOKENS_MAGIC

#ifdef __cplusplus
extern "C" {
#endif

/* One file of the token stream, mapped read-only (the ids are read where they lie, never
 * copied whole into memory). */
typedef struct train_token_shard {
    char *path;                /* owned */
    train_token_layout layout; /* format, offset, count, id size */
    const unsigned char *map;  /* the whole file, mmap'd (map_size bytes) */
    size_t map_size;
    int64_t first; /* index of its first id in the stream */
} train_token_shard;

typedef struct train_tokens {
    int64_t count;      /* token ids in the stream: the shards' ids, in order */
    int64_t n_train;    /* [0, n_train): the training tokens; [n_train, count) held out */
    int64_t file_vocab; /* the largest vocabulary a header states (0: none) */
    int n_shards;
    train_token_shard *shards; /* (n_shards), sorted by path */
    double entropy;            /* unigram entropy of the training tokens, nats per token */
    int64_t n_eval;            /* held-out sequences an evaluation scores: a multiple of batch_size,
                                  0 without a held-out split */
    int64_t n_probe;           /* training sequences the loss before and after training scores */
} train_tokens;

/* Opens [data] path as a token stream: one file in any format of train_token_formats.h (told
 * apart by its first bytes, not its name), or a glob pattern (`*`, `?`, `[...]`; a path that
 * names an existing file is that file) whose matches, sorted by name (strcmp), are read in
 * order as one stream. Each file is mapped, not read into memory. Every header field is
 * checked against its file's size before anything is read by it (see train_token_layout_read),
 * a header's stated vocabulary against [model] vocab_size, every id (non-negative and below
 * vocab_size; one pass over the files), enough training tokens for one sequence of
 * max_seq_len + 1 and, with eval_fraction > 0, enough held-out tokens for one batch of them.
 * On failure returns FSDP_ERR_IO (a file cannot be read) or FSDP_ERR_CONFIG (a bad or
 * unfitting file, a pattern that matches nothing) with a message naming the file, the field
 * and the fix in err. The caller owns t (train_tokens_free). The files must not change while
 * they are mapped. */
fsdp_status train_tokens_load(const train_config *cfg, train_tokens *t, char *err, size_t err_size);
void train_tokens_free(train_tokens *t); /* unmaps the files, frees and zeroes t */

/* Ids [start, start + n) of the stream into out (n of them); the range lies in [0, count).
 * Every id was checked at load, so each is in [0, vocab_size). */
void train_tokens_read(const train_tokens *t, int64_t start, int64_t n, uint32_t *out);

/* The first token of a sequence of max_seq_len + 1 tokens:
 * - train: the k-th of the training stream (k = (step - 1) * batch_size + row), at
 *   floor(u * (n_train - max_seq_len)) with u = fsdp_rng_uniform([data] seed,
 *   fsdp_rng_stream("fsdp-train/tokens"), k): a function of k alone, so every layout trains on
 *   the same sequences;
 * - eval: held-out sequence j in [0, n_eval), at n_train + j * max_seq_len;
 * - probe: training sequence j in [0, n_probe), evenly spaced over the training tokens. */
int64_t train_tokens_train_start(const train_config *cfg, const train_tokens *t, int64_t k);
int64_t train_tokens_eval_start(const train_config *cfg, const train_tokens *t, int64_t j);
int64_t train_tokens_probe_start(const train_config *cfg, const train_tokens *t, int64_t j);

#ifdef __cplusplus
}
#endif
#endif
