/* train_token_formats.h: the token file formats fsdp-train reads ([data] kind = tokens): its own
 * token file, llm.c's .bin shards and NumPy .npy arrays, told apart by their first bytes; each
 * header is checked against the file's size before anything is read by it. */
#ifndef FSDP_TOOLS_TRAIN_TOKEN_FORMATS_H
#define FSDP_TOOLS_TRAIN_TOKEN_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/status.h" // defines: fsdp_status

#ifdef __cplusplus
extern "C" {
#endif

/* fsdp-train's token file: a 32-byte header, then `count` token ids, one flat array,
 * little-endian.
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

/* llm.c's data shards (its dev/data scripts, llmc/dataloader.h): 256 little-endian int32, then the
 * ids. header[0] is the magic, header[1] the version (1), header[2] the token count; the rest
 * is unused. Magic 20240520 (GPT-2): uint16 ids; 20240801 (Llama 3): uint32 ids. The file is
 * exactly 1024 + count * (bytes per id) bytes. */
#define TRAIN_LLMC_HEADER      1024
#define TRAIN_LLMC_MAGIC_GPT2  20240520
#define TRAIN_LLMC_MAGIC_LLAMA 20240801
#define TRAIN_LLMC_VERSION     1

/* NumPy's .npy (format versions 1.0, 2.0, 3.0): "\x93NUMPY", the version, the header's length
 * (u16 in 1.0, u32 after), a Python dict literal {'descr': ..., 'fortran_order': False,
 * 'shape': (N,)}, then the data. Read: 1-D, C order, descr '<u2', '<i4', '<u4' or '<i8'. */
#define TRAIN_NPY_MAGIC     "\x93NUMPY"
#define TRAIN_NPY_MAGIC_LEN 6

typedef enum train_token_format {
    TRAIN_TOKEN_FORMAT_FSDPTOK, /* fsdp-train's token file */
    TRAIN_TOKEN_FORMAT_LLMC,    /* llm.c .bin shard */
    TRAIN_TOKEN_FORMAT_NPY,     /* NumPy .npy array */
} train_token_format;

/* Where a file's ids lie and how each is stored. */
typedef struct train_token_layout {
    train_token_format format;
    int64_t offset; /* bytes before the first id */
    int64_t count;  /* ids in the file */
    int bytes;      /* bytes per id: 2, 4 or 8, little-endian */
    bool is_signed; /* two's complement ids (npy '<i4', '<i8'): a negative one is refused */
    uint64_t vocab; /* the vocabulary the file states (FSDPTOK's header), 0: none */
} train_token_layout;

/* The name of a format for messages: "token file", "llm.c .bin shard", ".npy array". */
const char *train_token_format_name(train_token_format f);

/* Reads the layout of a file from its first bytes: `head` holds min(n, size) bytes of the file
 * of `size` bytes that `name` names in messages. Every field is checked (magic, version, id
 * size or dtype, order, shape, header length, count) and the ids must fill the rest of the file
 * exactly. On failure returns FSDP_ERR_CONFIG with a message naming the file, the field and the
 * fix in err. */
fsdp_status train_token_layout_read(const unsigned char *head, size_t n, int64_t size,
                                    const char *name, train_token_layout *out, char *err,
                                    size_t err_size);

/* Id i of a file whose ids start at `data`, as a 64-bit signed value. */
static inline int64_t train_token_layout_id(const train_token_layout *l, const unsigned char *data,
                                            int64_t i) {
    const unsigned char *p = data + i * l->bytes;
    uint64_t v = 0;
    for (int b = l->bytes - 1; b >= 0; b--) v = v << 8 | p[b];
    if (l->is_signed && l->bytes == 4) return (int64_t)(int32_t)(uint32_t)v;
    return (int64_t)v; /* uint16, uint32, and int64 by two's complement */
}

#ifdef __cplusplus
}
#endif
#endif
