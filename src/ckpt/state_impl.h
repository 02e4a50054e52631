/* state_impl.h: the body of fsdp_state, which save.c and load.c read. Internal to src/ckpt. */
#ifndef FSDP_CKPT_STATE_IMPL_H
#define FSDP_CKPT_STATE_IMPL_H

#include "ckpt/region.h"

/* A region this rank holds: its values lie contiguous (row-major over the box) in src from
 * element elem. */
typedef struct state_piece {
    region box;
    fsdp_tensor *src; /* borrowed: a parameter, flat shard, buffer or optimizer state tensor */
    int64_t elem;
} state_piece;

typedef struct state_entry {
    char *name;
    char *param_name;
    fsdp_state_kind kind;
    fsdp_optim_state_kind optim_kind;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    state_piece *pieces;
    int n_pieces;
    int64_t cap_pieces;
} state_entry;

struct fsdp_state {
    state_entry *entries;
    int n_entries;
    int64_t cap_entries;
    fsdp_optimizer *optimizer;
};

/* Piece k of entry e to / from host memory. */
fsdp_status state_piece_read(fsdp_ctx *ctx, const state_entry *e, int k, void *dst);
fsdp_status state_piece_write(fsdp_ctx *ctx, const state_entry *e, int k, const void *src);
/* Where piece k's values are in host memory when they can be read and written in place (a
 * CPU tensor with storage), else NULL: then state_piece_read and _write copy, or name why not. */
void *state_piece_host(const state_entry *e, int k);

#endif
