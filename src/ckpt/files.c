/* files.c: what libfsdp asks of a path before it opens or after it fails to write one: only
 * regular files are opened (a FIFO could block forever), and only a regular file left by a
 * failed write is removed (never what a symbolic link points to). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "core/error.h"

fsdp_status ckpt_check_regular(fsdp_ctx *ctx, const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return FSDP_FAIL(ctx, FSDP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (S_ISREG(sb.st_mode)) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_IO,
                     "'%s' is not a regular file (a %s): libfsdp reads checkpoints and data only "
                     "from regular files (opening a FIFO could wait forever); put the file "
                     "itself there, or copy the data into a regular file and use that",
                     path,
                     S_ISFIFO(sb.st_mode)   ? "FIFO"
                     : S_ISDIR(sb.st_mode)  ? "directory"
                     : S_ISCHR(sb.st_mode)  ? "character device"
                     : S_ISBLK(sb.st_mode)  ? "block device"
                     : S_ISSOCK(sb.st_mode) ? "socket"
                                            : "special file");
}

void ckpt_remove_partial(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode)) unlink(path);
}
