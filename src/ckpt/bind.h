/* bind.h: what binds the files of one checkpoint together (format 2): a random 128-bit
 * checkpoint id written in metadata.h5 and in every shard, each shard's rank, and a digest of
 * every piece's values as written (XXH64, seed 0, over the values' little-endian bytes in
 * row-major order) recorded in metadata.h5. Internal to src/ckpt. */
#ifndef FSDP_CKPT_BIND_H
#define FSDP_CKPT_BIND_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/ckpt.h"

#define CKPT_ID_ATTR   "checkpoint_id" /* metadata.h5 and every shard: 32 hex digits */
#define CKPT_RANK_ATTR "rank"          /* every shard: the rank that wrote it */
#define CKPT_ID_CHARS  32

typedef struct ckpt_id {
    uint64_t hi, lo;
} ckpt_id;

/* A new id: 128 bits from the system's random source, or when none can be read, from the
 * clock, the process id and a counter. Never all zero. */
ckpt_id ckpt_id_new(void);
/* 32 lowercase hex digits and a NUL into buf. */
void ckpt_id_format(ckpt_id id, char buf[CKPT_ID_CHARS + 1]);
/* Parses exactly 32 hex digits; false otherwise. */
bool ckpt_id_parse(const char *s, ckpt_id *out);

/* XXH64 (seed 0), fed in pieces. */
typedef struct ckpt_digest {
    uint64_t v[4], total;
    unsigned char buf[32];
    size_t n;
} ckpt_digest;

void ckpt_digest_init(ckpt_digest *d);
/* Adds n values of elem bytes (1, 2, 4 or 8), in host byte order: digested as little-endian. */
void ckpt_digest_values(ckpt_digest *d, const void *values, size_t n, size_t elem);
uint64_t ckpt_digest_final(const ckpt_digest *d);

/* Writes the id and the rank as attributes of a shard file being written. Call with the HDF5
 * lock held. */
fsdp_status ckpt_shard_bind(fsdp_ctx *ctx, hid_t file, ckpt_id id, int rank);
/* Checks that the shard file of `rank` (opened from `path`, named as `name` in messages) is
 * bound to the checkpoint `id`: FSDP_ERR_IO naming the file, both ids and the fix otherwise.
 * Call with the HDF5 lock held. */
fsdp_status ckpt_shard_check(fsdp_ctx *ctx, hid_t file, const char *name, int rank, ckpt_id id);

#endif
