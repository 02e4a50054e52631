/* h5.h: the few HDF5 operations checkpoints need, with HDF5's errors turned into fsdp_status
 * messages that name the file. Every HDF5 call of libfsdp runs between h5_lock and h5_unlock
 * (HDF5 builds without thread safety exist; rank threads save at once). Internal to src/ckpt. */
#ifndef FSDP_CKPT_H5_H
#define FSDP_CKPT_H5_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>

#include "fsdp/ckpt.h"

/* Takes libfsdp's HDF5 lock (and turns HDF5's error printing off on this thread). A rank of a
 * world waits at most the world's timeout (h5_lock_ms): a thread stuck inside an HDF5 call (a
 * file system that does not answer) holds the lock, and the other ranks must fail in time
 * instead of waiting for it forever; FSDP_ERR_TIMEOUT then, saying so. Without a world it
 * waits as long as it takes. */
fsdp_status h5_lock(fsdp_ctx *ctx);
/* The bound h5_lock applies for ctx (0: none; ctx may be NULL); h5_lock with another bound (an
 * async writer's, whose context has no world); and taking the lock within ms (0: no bound),
 * false when it was not taken, for what has no context to fail in (closing). */
int h5_lock_ms(const fsdp_ctx *ctx);
fsdp_status h5_lock_for(fsdp_ctx *ctx, int ms);
bool h5_lock_within(int ms);
void h5_unlock(void);

/* FSDP_ERR_IO: "<what> '<path>': <HDF5's innermost message>". */
fsdp_status h5_fail(fsdp_ctx *ctx, const char *what, const char *path);

/* Files: create (truncating) or open read-only (a regular file only:
 * ckpt_check_regular). FSDP_ERR_IO naming the
 * path. */
fsdp_status h5_create(fsdp_ctx *ctx, const char *path, hid_t *out);
fsdp_status h5_open(fsdp_ctx *ctx, const char *path, hid_t *out);

/* Attributes of loc: scalars and strings (strings read into buf of size bytes; longer is an
 * error naming the attribute). */
fsdp_status h5_attr_write_i64(fsdp_ctx *ctx, hid_t loc, const char *name, int64_t v);
fsdp_status h5_attr_write_str(fsdp_ctx *ctx, hid_t loc, const char *name, const char *s);
fsdp_status h5_attr_read_i64(fsdp_ctx *ctx, hid_t loc, const char *name, int64_t *v);
/* *out is malloc'ed (at most max_len bytes plus the NUL). */
fsdp_status h5_attr_read_str(fsdp_ctx *ctx, hid_t loc, const char *name, size_t max_len,
                             char **out);

/* Writes an n-d dataset at path (intermediate groups created): chunked, zstd at `level`
 * (FSDP_CKPT_NO_COMPRESSION: none) and Fletcher32 when it has elements; contiguous for
 * scalars. */
fsdp_status h5_write(fsdp_ctx *ctx, hid_t file, const char *path, fsdp_dtype dtype, int ndim,
                     const int64_t *dims, const void *data, int level);
/* Writes an int64 table (rows, cols), uncompressed but checksummed. */
fsdp_status h5_write_table(fsdp_ctx *ctx, hid_t file, const char *path, int64_t rows, int cols,
                           const int64_t *data);
/* Reads `part` of the dataset at path, which must have exactly the dims `box_count` (ndim)
 * and dtype, into dst laid out as `dst_box`. */
fsdp_status h5_read_part(fsdp_ctx *ctx, hid_t file, const char *path, fsdp_dtype dtype,
                         const fsdp_state_region *stored, const fsdp_state_region *part, void *dst,
                         const fsdp_state_region *dst_box);
/* Reads the whole dataset of a piece at path (its global box `stored`, whose dims it must have)
 * in order, in slabs of at most `budget` bytes (at least one element): whole rows of the inner
 * dims, blocks of one dim, one index of the outer dims, so each slab is a box and their values,
 * row-major, follow each other as in the dataset. Calls fn with each slab (a box in global
 * coordinates) and its values; stops at the first failure. */
typedef fsdp_status (*h5_rows_fn)(fsdp_ctx *ctx, const fsdp_state_region *slab, const void *values,
                                  void *user);
fsdp_status h5_read_rows(fsdp_ctx *ctx, hid_t file, const char *path, fsdp_dtype dtype,
                         const fsdp_state_region *stored, size_t budget, h5_rows_fn fn, void *user);
/* Reads a whole int64 table of `cols` columns; *rows receives its rows (at most max_rows),
 * *out a malloc'ed copy. */
fsdp_status h5_read_table(fsdp_ctx *ctx, hid_t file, const char *path, int cols, int64_t max_rows,
                          int64_t *rows, int64_t **out);
/* A byte string (names, config text) as a 1-d uint8 dataset; reading refuses one longer than
 * max_len and returns a malloc'ed copy with a NUL appended. */
fsdp_status h5_write_bytes(fsdp_ctx *ctx, hid_t file, const char *path, const void *data,
                           size_t len);
fsdp_status h5_read_bytes(fsdp_ctx *ctx, hid_t file, const char *path, size_t max_len, char **out,
                          size_t *len);
/* Opens the dataset at path after checking (h5_check.c) that it has rank ndim, the dims `want`
 * (when not NULL; *dims receives them), exactly the element type ftype, no filter but zstd and
 * Fletcher32, and every chunk stored whole with every filter applied. */
fsdp_status h5_dataset_open(fsdp_ctx *ctx, hid_t file, const char *path, hid_t ftype, int ndim,
                            const hsize_t *want, hid_t *ds, hsize_t *dims);
/* "float of 4 bytes, little-endian, sign bit 31, exponent bits 23..30 (bias 127), ..." */
void h5_type_describe(hid_t type, char *buf, size_t size);

/* Stored (on-disk) bytes of the dataset at path, or -1. */
int64_t h5_stored_bytes(hid_t file, const char *path);

#endif
