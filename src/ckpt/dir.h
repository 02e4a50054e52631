/* dir.h: the checkpoint directory: a temporary directory per save, the commit (a marker file,
 * then an atomic rename), keeping the newest K, finding the newest. Internal to src/ckpt. */
#ifndef FSDP_CKPT_DIR_H
#define FSDP_CKPT_DIR_H

#include "fsdp/ckpt.h"

/* Rank 0 before a save: creates dir (and its parents), removes what earlier saves left
 * (temporary directories of failed saves, step directories without their commit marker, as a
 * removal cut short leaves them), and creates tmp. */
fsdp_status ckpt_dir_begin(fsdp_ctx *ctx, const char *dir, const char *tmp);
/* Rank 0 after every rank wrote: the commit marker into tmp, flushed; tmp renamed to final
 * (replacing an older final); then all but the newest `keep` checkpoints removed (keep 0: all
 * kept). */
fsdp_status ckpt_dir_commit(fsdp_ctx *ctx, const char *tmp, const char *final, const char *dir,
                            int keep);
/* Removes a checkpoint directory (the files in it, then itself); 0 on success or when it does
 * not exist. */
int ckpt_dir_remove(const char *path);
/* FSDP_OK when path is a committed checkpoint directory; else FSDP_ERR_NOT_FOUND naming why. */
fsdp_status ckpt_dir_check_committed(fsdp_ctx *ctx, const char *path);

#endif
