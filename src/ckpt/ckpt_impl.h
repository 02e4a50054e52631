/* ckpt_impl.h: an opened checkpoint (metadata read and checked) and the metadata a save
 * writes, and the files of a checkpoint directory, shared by meta.c, shard.c, save.c, load.c,
 * dir.c and import.c. Internal to src/ckpt. */
#ifndef FSDP_CKPT_CKPT_IMPL_H
#define FSDP_CKPT_CKPT_IMPL_H

#include <hdf5.h>

#include "ckpt/bind.h"
#include "ckpt/region.h"

#define CKPT_FORMAT_NAME    "libfsdp-checkpoint"
#define CKPT_METADATA       "metadata.h5"
#define CKPT_COMMIT         "commit"
#define CKPT_TENSOR_COLS    7  /* kind, dtype, ndim, shape[4] */
#define CKPT_PIECE_COLS     11 /* tensor, file_rank, id, offset[4], count[4] */
#define CKPT_HEADER_COLS    6  /* format_version, step, optim_steps, world_size, id (2 words) */
#define CKPT_MAX_TENSORS    (1 << 24)
#define CKPT_MAX_PIECES     (1 << 28)
#define CKPT_MAX_WORLD      (1 << 20)
#define CKPT_MAX_TEXT       (16 << 20) /* config and layout text */
#define CKPT_EXTRA_NAME_MAX 64

typedef struct ckpt_tensor {
    char *name; /* points into the names block */
    fsdp_state_kind kind;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int first_piece, n_pieces; /* into pieces, grouped by tensor */
} ckpt_tensor;

typedef struct ckpt_piece {
    int tensor, file_rank, id;
    region box;
    uint64_t digest; /* of its values as written (format 2; bind.h) */
} ckpt_piece;

/* What metadata.h5 holds. */
typedef struct ckpt_meta {
    int64_t version, step, optim_steps, world_size;
    /* Format 2: the checkpoint id that every shard carries, and the pieces' digests. A reader
     * of format 1 (bound false) has neither to check. */
    bool bound;
    ckpt_id id;
    char *library_version, *layout, *config, *names, *extra_names;
    char *model_config; /* "" when the optional dataset is absent */
    ckpt_tensor *tensors;
    int n_tensors;
    ckpt_piece *pieces;
    int n_pieces;
    char *extra_name[FSDP_CKPT_MAX_EXTRAS];
    int64_t extra_value[FSDP_CKPT_MAX_EXTRAS];
    int n_extras;
} ckpt_meta;

struct fsdp_ckpt {
    char *path;
    ckpt_meta meta;
    hid_t *files;   /* per file rank, opened and checked on first use (-1 before) */
    bool *verified; /* per piece: its digest was checked (format 2) */
    int lock_ms;    /* how long closing waits for the HDF5 lock (h5_lock_ms of the opener) */
};

/* "<dir>/shard-<5 digits>.h5" into buf. */
void ckpt_shard_path(const char *dir, int rank, char *buf, size_t size);
/* "<tensor name>/<id>": the dataset of a piece in its shard file. */
void ckpt_piece_dataset(const char *tensor, int id, char *buf, size_t size);

/* Writes metadata.h5 into dir (rank 0 of a save). Takes the HDF5 lock. */
fsdp_status ckpt_meta_write(fsdp_ctx *ctx, const char *dir, const ckpt_meta *m);
/* Reads and checks metadata.h5 of dir into *m (ckpt_meta_free releases it). */
fsdp_status ckpt_meta_read(fsdp_ctx *ctx, const char *dir, ckpt_meta *m);
void ckpt_meta_free(ckpt_meta *m);

/* FSDP_OK when path is a regular file (after symbolic links), else FSDP_ERR_IO naming it and
 * what it is. Checked before a file is opened: opening a FIFO waits for a writer forever. */
fsdp_status ckpt_check_regular(fsdp_ctx *ctx, const char *path);
/* Removes what a failed export or save left at path, when it is a regular file: never a
 * device, a FIFO or a link the caller named as the output (only the file behind a link was
 * written). */
void ckpt_remove_partial(const char *path);
/* fsync a file or directory by path (durability before the commit). */
fsdp_status ckpt_sync_path(fsdp_ctx *ctx, const char *path);

/* A shard file being written, one piece (dataset "<tensor name>/<id>") at a time: by a save
 * (save.c) and by an import (import.c). Call these with the HDF5 lock held (h5.h). */
typedef struct ckpt_shard_writer {
    hid_t file;
    char path[4200];
    int level; /* zstd level of every piece, or FSDP_CKPT_NO_COMPRESSION */
} ckpt_shard_writer;

/* Creates "<dir>/shard-<5 digits>.h5" (truncating), bound to checkpoint `id` as `rank`. */
fsdp_status ckpt_shard_create(fsdp_ctx *ctx, const char *dir, int rank, int level, ckpt_id id,
                              ckpt_shard_writer *w);
/* Writes the values of box (row-major, dtype) as piece `id` of `tensor`; *digest receives the
 * digest of the values (bind.h) that the metadata records. */
fsdp_status ckpt_shard_put(fsdp_ctx *ctx, ckpt_shard_writer *w, const char *tensor, int id,
                           fsdp_dtype dtype, const region *box, const void *data, uint64_t *digest);
/* Closes the file; returns s, or the close's failure when s is FSDP_OK. The caller flushes it
 * (ckpt_sync_path on w->path) after releasing the lock. */
fsdp_status ckpt_shard_close(fsdp_ctx *ctx, ckpt_shard_writer *w, fsdp_status s);

#endif
