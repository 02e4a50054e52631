/* h5_error.c: HDF5's failures as libfsdp's messages (h5_fail), the one place the checkpoint
 * code reads HDF5's error stack. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/h5.h"
#include "core/error.h"

/* HDF5's innermost error as one line. A failed system call ("file write failed: time = ...,
 * filename = ..., errno = 28, error message = ..., buf = 0x5651681fbbd8, ...") becomes what
 * failed and why ("file write failed: No space left on device"): the rest repeats the path and
 * shows addresses that mean nothing to the reader. */
static herr_t innermost(unsigned n, const H5E_error2_t *err, void *user) {
    if (n != 0) return 0;
    const char *at = strstr(err->desc, "errno = ");
    const char *colon = strchr(err->desc, ':');
    int code = at ? atoi(at + 8) : 0;
    if (code > 0 && colon)
        snprintf(user, 256, "%.*s: %s", (int)(colon - err->desc), err->desc, strerror(code));
    else
        snprintf(user, 256, "%s (in %s)", err->desc, err->func_name);
    for (char *c = user; *c; c++) /* one line: HDF5's own text has newlines */
        if (*c == '\n') *c = ' ';
    return 0;
}

fsdp_status h5_fail(fsdp_ctx *ctx, const char *what, const char *path) {
    char msg[256] = "no detail from HDF5";
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, msg);
    H5Eclear2(H5E_DEFAULT);
    return FSDP_FAIL(ctx, FSDP_ERR_IO, "%s '%s': %s", what, path, msg);
}
