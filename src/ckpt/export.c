/* export.c: a checkpoint as one unsharded HDF5 file, one dataset per tensor with its global
 * shape, written one tensor at a time (fsdp_ckpt_export_h5). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/h5.h"
#include "core/error.h"

/* Tensor t read whole and written as the dataset of its name (with the HDF5 lock taken only
 * around the write: fsdp_ckpt_read takes it itself). */
static fsdp_status export_tensor(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, hid_t file, int level) {
    fsdp_ckpt_tensor x;
    FSDP_TRY(fsdp_ckpt_tensor_get(ctx, ck, t, &x));
    fsdp_state_region all = {.ndim = x.ndim};
    int64_t n = 1;
    for (int d = 0; d < x.ndim; d++) n *= all.count[d] = x.shape[d];
    void *buf = malloc((size_t)n * fsdp_dtype_size(x.dtype) + 1);
    if (!buf) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "exporting '%s'", x.name);
    fsdp_status s = fsdp_ckpt_read(ctx, ck, t, &all, buf);
    if (s == FSDP_OK) {
        h5_lock();
        s = h5_write(ctx, file, x.name, x.dtype, x.ndim, x.shape, buf, level);
        if (s == FSDP_OK && x.dtype == FSDP_DTYPE_BF16) {
            hid_t ds = H5Dopen2(file, x.name, H5P_DEFAULT);
            s = ds < 0 ? h5_fail(ctx, "cannot open dataset", x.name)
                       : h5_attr_write_str(ctx, ds, "dtype", "bf16");
            if (ds >= 0) H5Dclose(ds);
        }
        h5_unlock();
    }
    free(buf);
    return s;
}

fsdp_status fsdp_ckpt_export_h5(fsdp_ctx *ctx, fsdp_ckpt *ck, const char *path,
                                const fsdp_ckpt_export_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, path);
    fsdp_ckpt_export_options o = opts ? *opts : (fsdp_ckpt_export_options){0};
    if (o.zstd_level < 0 || o.zstd_level > 19)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "export to '%s': zstd level %d; use 0 (none) or 1..19", path,
                         o.zstd_level);
    int level = o.zstd_level > 0 ? o.zstd_level : FSDP_CKPT_NO_COMPRESSION;
    hid_t file;
    h5_lock();
    fsdp_status s = h5_create(ctx, path, &file);
    h5_unlock();
    FSDP_TRY(s);
    for (int t = 0; s == FSDP_OK && t < ck->meta.n_tensors; t++)
        if (o.with_optim || ck->meta.tensors[t].kind != FSDP_STATE_OPTIM)
            s = export_tensor(ctx, ck, t, file, level);
    if (s != FSDP_OK) s = fsdp_error_hop(ctx, s, __FILE__, __LINE__, "export to '%s'", path);
    h5_lock();
    if (H5Fclose(file) < 0 && s == FSDP_OK) s = h5_fail(ctx, "cannot close", path);
    h5_unlock();
    if (s != FSDP_OK) remove(path);
    return s;
}
