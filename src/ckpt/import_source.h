/* import_source.h: a state dict that fsdp_ckpt_import reads (safetensors.c, import_h5.c, a
 * Hugging Face directory in import_hf.c): its tensors listed and checked when opened, then read
 * one at a time. Internal to src/ckpt. */
#ifndef FSDP_CKPT_IMPORT_SOURCE_H
#define FSDP_CKPT_IMPORT_SOURCE_H

#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>

#include "fsdp/ckpt.h"

/* The element types a state dict may hold that import converts (the others are refused). */
typedef enum import_dtype {
    IMPORT_F32 = 0,
    IMPORT_F16,
    IMPORT_BF16,
    IMPORT_F64,
    IMPORT_UNSUPPORTED, /* a known type that is not floating point (integers, bool, fp8) */
} import_dtype;

typedef struct import_tensor {
    char name[FSDP_STATE_NAME_MAX]; /* the state_dict key */
    import_dtype dtype;
    char dtype_name[16]; /* as the file names it, for messages ("I64", "int32") */
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;  /* safetensors: the byte range in the data section */
    char *h5_path;        /* HDF5: the dataset's path in the file (malloc'ed) */
    int part, part_index; /* a directory: tensor part_index of its file parts[part] */
} import_tensor;

typedef struct import_source import_source;

/* How a source is read: the functions of one file format. */
typedef struct import_source_i {
    /* Tensor i's values into dst (numel elements): little-endian bytes of its dtype. */
    fsdp_status (*read)(fsdp_ctx *ctx, import_source *src, int i, void *dst);
    void (*close)(import_source *src);
} import_source_i;

struct import_source {
    const import_source_i *iface;
    const char *path;
    import_tensor *tensors; /* malloc'ed, in the order they are written */
    int n_tensors;
    FILE *file;           /* safetensors */
    uint64_t data_start;  /* safetensors: the first byte of the data section */
    hid_t h5;             /* HDF5 */
    int lock_ms;          /* HDF5: how long closing waits for the HDF5 lock (h5_lock_ms) */
    import_source *parts; /* a Hugging Face directory: its safetensors files */
    int n_parts;
    char *model_config; /* a Hugging Face directory: the text of its config.json */
};

/* Bytes of one element of a convertible dtype (import_source.c). */
size_t import_dtype_size(import_dtype d);

/* Opens path as a safetensors file and checks its header: its length, the JSON, every
 * tensor's dtype, shape and byte range, that the ranges tile the data section and that the
 * file ends with it. Every failure names the file (and the tensor) and is FSDP_ERR_IO, or
 * FSDP_ERR_UNSUPPORTED for a dtype that cannot be imported. */
fsdp_status import_open_safetensors(fsdp_ctx *ctx, const char *path, import_source *out);
/* Opens path as an HDF5 state dict: every dataset (groups a/b/c name "a.b.c") is a tensor.
 * Takes the HDF5 lock itself. */
fsdp_status import_open_h5(fsdp_ctx *ctx, const char *path, import_source *out);
/* Opens dir as a Hugging Face model directory (import_hf.c): config.json (a JSON object, kept
 * as model_config) and model.safetensors, or the files model.safetensors.index.json maps the
 * tensors to, which must agree with it exactly. */
fsdp_status import_open_hf_dir(fsdp_ctx *ctx, const char *dir, import_source *out);

#endif
