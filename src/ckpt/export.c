/* export.c: a checkpoint as one unsharded file, written one tensor at a time: HDF5, one dataset
 * per tensor with its global shape (fsdp_ckpt_export_h5), or safetensors
 * (fsdp_ckpt_export_safetensors). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h> // defines: json_pack, json_dumps

#include "ckpt/ckpt_impl.h"
#include "ckpt/h5.h"
#include "core/error.h"

/* Tensor t read whole and written as the dataset of its name (with the HDF5 lock taken only
 * around the write: fsdp_ckpt_read takes it itself). */
static fsdp_status export_tensor(fsdp_ctx *ctx, fsdp_ckpt *ck, int t, hid_t file, int level) {
    fsdp_ckpt_tensor x;
    FSDP_TRY_AT(ctx, fsdp_ckpt_tensor_get(ctx, ck, t, &x));
    fsdp_state_region all = {.ndim = x.ndim};
    int64_t n = 1;
    for (int d = 0; d < x.ndim; d++) n *= all.count[d] = x.shape[d];
    void *buf = malloc((size_t)n * fsdp_dtype_size(x.dtype) + 1);
    if (!buf) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "exporting '%s'", x.name);
    fsdp_status s = fsdp_ckpt_read(ctx, ck, t, &all, buf);
    if (s == FSDP_OK) s = h5_lock(ctx);
    if (s == FSDP_OK) {
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
    return FSDP_PASS(ctx, s);
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
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    fsdp_status s = h5_create(ctx, path, &file);
    h5_unlock();
    FSDP_TRY_AT(ctx, s);
    for (int t = 0; s == FSDP_OK && t < ck->meta.n_tensors; t++)
        if (o.with_optim || ck->meta.tensors[t].kind != FSDP_STATE_OPTIM)
            s = export_tensor(ctx, ck, t, file, level);
    if (s != FSDP_OK)
        s = fsdp_error_hop(ctx, s, __FILE__, __LINE__, __func__, "export to '%s'", path);
    fsdp_status locked = h5_lock(ctx); /* not taken: the file stays open */
    if (locked == FSDP_OK) {
        if (H5Fclose(file) < 0 && s == FSDP_OK) s = h5_fail(ctx, "cannot close", path);
        h5_unlock();
    } else if (s == FSDP_OK) {
        s = locked;
    }
    if (s != FSDP_OK) ckpt_remove_partial(path);
    return FSDP_PASS(ctx, s);
}

/* ---- safetensors ---- */

static bool exported(const ckpt_tensor *x, bool with_optim) {
    return with_optim || x->kind != FSDP_STATE_OPTIM;
}

static int64_t tensor_bytes(const ckpt_tensor *x) {
    int64_t n = (int64_t)fsdp_dtype_size(x->dtype);
    for (int d = 0; d < x->ndim; d++) n *= x->shape[d];
    return n;
}

/* Appends to head one tensor's entry: its name -> {dtype, shape, data_offsets} (in this order);
 * a name that is not UTF-8 (which a JSON key must be) is refused. */
static fsdp_status header_entry(fsdp_ctx *ctx, const ckpt_tensor *x, int64_t off, json_t *head) {
    json_t *shape = json_array();
    for (int d = 0; shape && d < x->ndim; d++)
        if (json_array_append_new(shape, json_integer((json_int_t)x->shape[d])) != 0)
            json_decref(shape), shape = NULL;
    json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                          x->dtype == FSDP_DTYPE_BF16 ? "BF16" : "F32", "shape", shape,
                          "data_offsets", (json_int_t)off, (json_int_t)(off + tensor_bytes(x)));
    if (!e) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "safetensors header");
    if (json_object_set_new(head, x->name, e) == 0) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                     "tensor '%s': its name is not UTF-8 text, which a safetensors header (JSON) "
                     "needs; export to HDF5 instead",
                     x->name);
}

/* *text = the safetensors header (malloc'ed): metadata, then every exported tensor with its byte
 * range (data in this order), compact JSON in insertion order. */
static fsdp_status safetensors_header(fsdp_ctx *ctx, const fsdp_ckpt *ck, bool with_optim,
                                      char **text) {
    char step[32], optim_steps[32];
    snprintf(step, sizeof step, "%lld", (long long)ck->meta.step);
    snprintf(optim_steps, sizeof optim_steps, "%lld", (long long)ck->meta.optim_steps);
    json_t *head = json_pack("{s:{s:s, s:s, s:s}}", "__metadata__", "format", "pt", "step", step,
                             "optim_steps", optim_steps);
    fsdp_status s = head ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "safetensors header");
    int64_t off = 0;
    for (int t = 0; s == FSDP_OK && t < ck->meta.n_tensors; t++) {
        const ckpt_tensor *x = &ck->meta.tensors[t];
        if (!exported(x, with_optim)) continue;
        s = header_entry(ctx, x, off, head);
        off += tensor_bytes(x);
    }
    *text = s == FSDP_OK ? json_dumps(head, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(head);
    if (s == FSDP_OK && !*text) s = FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "safetensors header");
    return FSDP_PASS(ctx, s);
}

static bool little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* The header's length (8 bytes, little-endian), the header padded with spaces to a multiple
 * of 8 bytes, then each exported tensor's values. */
static fsdp_status write_safetensors(fsdp_ctx *ctx, fsdp_ckpt *ck, bool with_optim, FILE *f) {
    char *head = NULL;
    FSDP_TRY(safetensors_header(ctx, ck, with_optim, &head));
    size_t len = strlen(head);
    size_t padded = (len + 7) / 8 * 8;
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(n8, 1, 8, f);
    fwrite(head, 1, len, f);
    for (size_t i = len; i < padded; i++) fputc(' ', f);
    free(head);
    fsdp_status s = FSDP_OK;
    for (int t = 0; s == FSDP_OK && t < ck->meta.n_tensors; t++) {
        const ckpt_tensor *x = &ck->meta.tensors[t];
        if (!exported(x, with_optim)) continue;
        fsdp_state_region all = {.ndim = x->ndim};
        for (int d = 0; d < x->ndim; d++) all.count[d] = x->shape[d];
        size_t bytes = (size_t)tensor_bytes(x);
        void *buf = malloc(bytes + 1);
        if (!buf) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "exporting '%s'", x->name);
        s = fsdp_ckpt_read(ctx, ck, t, &all, buf);
        if (s == FSDP_OK && fwrite(buf, 1, bytes, f) != bytes)
            s = FSDP_FAIL(ctx, FSDP_ERR_IO, "writing tensor '%s' failed: %s", x->name,
                          strerror(errno));
        free(buf);
    }
    if (s == FSDP_OK && ferror(f))
        s = FSDP_FAIL(ctx, FSDP_ERR_IO, "writing failed: %s", strerror(errno));
    return FSDP_PASS(ctx, s);
}

fsdp_status fsdp_ckpt_export_safetensors(fsdp_ctx *ctx, fsdp_ckpt *ck, const char *path,
                                         const fsdp_ckpt_export_options *opts) {
    FSDP_ARG_NOT_NULL(ctx, ctx);
    FSDP_ARG_NOT_NULL(ctx, ck);
    FSDP_ARG_NOT_NULL(ctx, path);
    fsdp_ckpt_export_options o = opts ? *opts : (fsdp_ckpt_export_options){0};
    if (o.zstd_level != 0)
        return FSDP_FAIL(ctx, FSDP_ERR_INVALID_ARGUMENT,
                         "export to '%s': safetensors has no compression; leave zstd_level 0 "
                         "(or export to HDF5)",
                         path);
    if (!little_endian())
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "export to '%s': safetensors is little-endian and this host is not; "
                         "export to HDF5 instead",
                         path);
    FILE *f = fopen(path, "wb");
    if (!f)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "export: cannot create '%s': check the directory exists and is writable",
                         path);
    fsdp_status s = write_safetensors(ctx, ck, o.with_optim, f);
    if (fclose(f) != 0 && s == FSDP_OK)
        s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                      "writing '%s' failed: %s; check that its disk has room and that it is "
                      "writable",
                      path, strerror(errno));
    if (s != FSDP_OK) {
        s = fsdp_error_hop(ctx, s, __FILE__, __LINE__, __func__, "export to '%s'", path);
        ckpt_remove_partial(path);
    }
    return FSDP_PASS(ctx, s);
}
