/* train_tokens.h: fsdp-train's token files ([data] kind = tokens): the format, reading and
 * checking one once per process, the held-out split, and which sequences a step, an evaluation
 * and the loss before and after training score. */
#ifndef FSDP_TOOLS_TRAIN_TOKENS_H
#define FSDP_TOOLS_TRAIN_TOKENS_H

#include "train_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A token file: a 32-byte header, then `count` token ids, one flat array, little-endian.
 *   bytes  0..7   magic "FSDPTOK" and a NUL byte
 *   bytes  8..11  version, u32: 1
 *   bytes 12..15  bytes per token id, u32: 2 (uint16) or 4 (uint32)
 *   bytes 16..23  count, u64: the number of token ids that follow
 *   bytes 24..31  vocab, u64: the tokenizer's vocabulary size (every id is below it); 0: not
 *                 stated
 * The file is exactly 32 + count * (bytes per id) bytes. tools/text_to_tokens.py writes it. */
#define TRAIN_TOKENS_MAGIC   "FSDPTOK"
#define TRAIN_TOKENS_VERSION 1
#define TRAIN_TOKENS_HEADER  32

typedef struct train_tokens {
    int64_t count;      /* token ids in the file */
    int64_t n_train;    /* [0, n_train): the training tokens; [n_train, count) held out */
    int64_t file_vocab; /* the header's vocab (0: not stated) */
    int bytes;          /* bytes per id in the file: 2 or 4 */
    uint32_t *ids;      /* (count) */
    double entropy;     /* unigram entropy of the training tokens, nats per token */
    int64_t n_eval;     /* held-out sequences an evaluation scores: a multiple of batch_size,
                           0 without a held-out split */
    int64_t n_probe;    /* training sequences the loss before and after training scores */
} train_tokens;

/* Reads [data] path as a token file and checks every field against the file's size before
 * anything is read by it: the magic, the version, the id size, the count (the file holds
 * exactly that many ids), the header's vocab against [model] vocab_size, every id below
 * vocab_size, at most TRAIN_MAX_DATA_BYTES of ids, enough training tokens for one sequence of
 * max_seq_len + 1 and, with eval_fraction > 0, enough held-out tokens for one batch of them.
 * On failure returns FSDP_ERR_IO (the file cannot be read) or FSDP_ERR_CONFIG (a bad or
 * unfitting file) with a message naming the file, the field and the fix in err. The caller
 * owns t (train_tokens_free). */
fsdp_status train_tokens_load(const train_config *cfg, train_tokens *t, char *err, size_t err_size);
void train_tokens_free(train_tokens *t); /* frees the ids and zeroes t */

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
