/* shard.c: the files of a checkpoint directory: shard paths, piece dataset names, a shard file
 * written piece by piece (by a save and by an import), flushing a file to disk. */
#define _POSIX_C_SOURCE 200809L /* fsync */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/h5.h"
#include "core/error.h"

void ckpt_shard_path(const char *dir, int rank, char *buf, size_t size) {
    snprintf(buf, size, "%s/shard-%05d.h5", dir, rank);
}

void ckpt_piece_dataset(const char *tensor, int id, char *buf, size_t size) {
    snprintf(buf, size, "%s/%d", tensor, id);
}

fsdp_status ckpt_sync_path(fsdp_ctx *ctx, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) {
        if (fd >= 0) close(fd);
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot flush '%s' to disk", path);
    }
    close(fd);
    return FSDP_OK;
}

fsdp_status ckpt_shard_create(fsdp_ctx *ctx, const char *dir, int rank, int level, ckpt_id id,
                              ckpt_shard_writer *w) {
    ckpt_shard_path(dir, rank, w->path, sizeof w->path);
    w->level = level;
    FSDP_TRY_AT(ctx, h5_create(ctx, w->path, &w->file));
    fsdp_status s = ckpt_shard_bind(ctx, w->file, id, rank);
    return s == FSDP_OK ? s : ckpt_shard_close(ctx, w, s);
}

fsdp_status ckpt_shard_put(fsdp_ctx *ctx, ckpt_shard_writer *w, const char *tensor, int id,
                           fsdp_dtype dtype, const region *box, const void *data,
                           uint64_t *digest) {
    char ds[FSDP_STATE_NAME_MAX + 32];
    ckpt_piece_dataset(tensor, id, ds, sizeof ds);
    ckpt_digest d;
    ckpt_digest_init(&d);
    ckpt_digest_values(&d, data, (size_t)region_numel(box), fsdp_dtype_size(dtype));
    *digest = ckpt_digest_final(&d);
    return h5_write(ctx, w->file, ds, dtype, box->ndim, box->count, data, w->level);
}

fsdp_status ckpt_shard_close(fsdp_ctx *ctx, ckpt_shard_writer *w, fsdp_status s) {
    if (H5Fclose(w->file) < 0 && s == FSDP_OK) s = h5_fail(ctx, "cannot close", w->path);
    w->file = -1;
    return FSDP_PASS(ctx, s);
}
