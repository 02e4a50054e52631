/* import_h5.c: reading an HDF5 state dict (what h5py writes for {key: tensor.numpy()}) for
 * fsdp_ckpt_import: every dataset is a tensor, named by its path with '/' as '.' (a dataset
 * "layers.0.net1.weight" at the root, or "layers/0/net1/weight" in nested groups). Floating
 * point datasets of 2, 4 or 8 bytes are read; uint16 with the attribute dtype = "bf16" (what
 * fsdp_ckpt_export_h5 writes) is bf16. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdlib.h>
#include <string.h>

#include "ckpt/h5.h"
#include "ckpt/import_source.h"
#include "ckpt/zstd_filter.h"
#include "core/array.h"
#include "core/error.h"

/* H5Ovisit's callback and its object info changed in HDF5 1.12. */
#if H5_VERSION_GE(1, 12, 0)
typedef H5O_info2_t obj_info;
#define VISIT_OBJECTS(f, op, data)                                                                 \
    H5Ovisit3(f, H5_INDEX_NAME, H5_ITER_INC, op, data, H5O_INFO_BASIC)
#else
typedef H5O_info_t obj_info;
#define VISIT_OBJECTS(f, op, data)                                                                 \
    H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_INC, op, data, H5O_INFO_BASIC)
#endif

typedef struct visit {
    fsdp_ctx *ctx;
    import_source *src;
    int64_t cap; /* of src->tensors */
    fsdp_status status;
} visit;

/* Whether the dataset carries the string attribute dtype = "bf16", fixed-length (as
 * fsdp_ckpt_export_h5 writes it) or variable-length (as h5py writes a str). */
static bool has_bf16_attr(hid_t ds) {
    if (H5Aexists(ds, "dtype") <= 0) return false;
    hid_t a = H5Aopen(ds, "dtype", H5P_DEFAULT);
    hid_t ftype = a >= 0 ? H5Aget_type(a) : -1, space = a >= 0 ? H5Aget_space(a) : -1;
    bool yes = false;
    if (ftype >= 0 && space >= 0 && H5Tget_class(ftype) == H5T_STRING &&
        H5Sget_simple_extent_type(space) == H5S_SCALAR) {
        hid_t mem = H5Tcopy(H5T_C_S1);
        H5Tset_cset(mem, H5Tget_cset(ftype)); /* h5py writes UTF-8 */
        if (H5Tis_variable_str(ftype) > 0) {
            char *v = NULL;
            H5Tset_size(mem, H5T_VARIABLE);
            if (H5Aread(a, mem, &v) >= 0 && v) yes = !strcmp(v, "bf16");
            if (v) H5free_memory(v);
        } else if (H5Tget_size(ftype) <= 15) {
            char v[16] = {0};
            H5Tset_size(mem, sizeof v);
            if (H5Aread(a, mem, v) >= 0) yes = !strcmp(v, "bf16");
        }
        H5Tclose(mem);
    }
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    if (a >= 0) H5Aclose(a);
    H5Eclear2(H5E_DEFAULT);
    return yes;
}

/* The dtype of dataset ds from its HDF5 type. */
static void classify(hid_t ds, import_tensor *t) {
    hid_t type = H5Dget_type(ds);
    H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    size_t size = type >= 0 ? H5Tget_size(type) : 0;
    bool sign = cls == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_2;
    if (type >= 0) H5Tclose(type);
    t->dtype = IMPORT_UNSUPPORTED;
    if (cls == H5T_FLOAT && (size == 2 || size == 4 || size == 8)) {
        t->dtype = size == 2 ? IMPORT_F16 : size == 4 ? IMPORT_F32 : IMPORT_F64;
        snprintf(t->dtype_name, sizeof t->dtype_name, "float%zu", 8 * size);
    } else if (cls == H5T_INTEGER && size == 2 && !sign && has_bf16_attr(ds)) {
        t->dtype = IMPORT_BF16;
        snprintf(t->dtype_name, sizeof t->dtype_name, "bf16");
    } else if (cls == H5T_INTEGER) {
        snprintf(t->dtype_name, sizeof t->dtype_name, "%sint%zu", sign ? "" : "u", 8 * size);
    } else {
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s",
                 cls == H5T_STRING     ? "a string"
                 : cls == H5T_COMPOUND ? "a compound"
                                       : "not numeric");
    }
}

/* Shape and dtype of the dataset at `name` into a new tensor of v->src. */
static fsdp_status add_dataset(visit *v, const char *name) {
    import_source *src = v->src;
    fsdp_ctx *ctx = v->ctx;
    if (!fsdp_array_reserve((void **)&src->tensors, &v->cap, src->n_tensors + 1,
                            sizeof *src->tensors))
        return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    import_tensor *t = &src->tensors[src->n_tensors];
    *t = (import_tensor){.numel = 1};
    if (strlen(name) >= sizeof t->name)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s': dataset '%s' has a name of %zu bytes; tensor names have at most "
                         "%d",
                         src->path, name, strlen(name), FSDP_STATE_NAME_MAX - 1);
    if (!(t->h5_path = strdup(name))) return FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "import");
    src->n_tensors++;
    for (size_t i = 0; name[i]; i++) t->name[i] = name[i] == '/' ? '.' : name[i];
    hid_t ds = H5Dopen2(src->h5, name, H5P_DEFAULT);
    if (ds < 0) return h5_fail(ctx, "cannot open dataset", name);
    hid_t space = H5Dget_space(ds);
    bool null = space >= 0 && H5Sget_simple_extent_type(space) == H5S_NULL;
    int nd = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    hsize_t dims[FSDP_MAX_DIMS];
    if (nd >= 0 && nd <= FSDP_MAX_DIMS) H5Sget_simple_extent_dims(space, dims, NULL);
    if (space >= 0) H5Sclose(space);
    classify(ds, t);
    H5Dclose(ds);
    if (null)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s': dataset '%s' has no dataspace (no values): remove it", src->path,
                         name);
    if (nd < 0 || nd > FSDP_MAX_DIMS)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "'%s': dataset '%s' has %d dimensions; libfsdp tensors have at most %d",
                         src->path, name, nd, FSDP_MAX_DIMS);
    t->ndim = nd;
    for (int d = 0; d < nd; d++) {
        if (dims[d] > (hsize_t)INT64_MAX ||
            (dims[d] && t->numel > (INT64_MAX / 8) / (int64_t)dims[d]))
            return FSDP_FAIL(ctx, FSDP_ERR_IO, "'%s': dataset '%s' is too large", src->path, name);
        t->shape[d] = (int64_t)dims[d];
        t->numel *= t->shape[d];
    }
    return FSDP_OK;
}

static herr_t on_object(hid_t root, const char *name, const obj_info *info, void *user) {
    (void)root;
    visit *v = user;
    if (info->type != H5O_TYPE_DATASET) return 0;
    v->status = add_dataset(v, name);
    return v->status == FSDP_OK ? 0 : 1;
}

/* IEEE half precision, little-endian (as h5py defines float16). */
static hid_t half_le(void) {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0 || H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_precision(t, 16) < 0 ||
        H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0) {
        if (t >= 0) H5Tclose(t);
        return -1;
    }
    return t;
}

/* The values as little-endian bytes of the tensor's dtype (HDF5 converts the byte order). */
static fsdp_status h5src_read(fsdp_ctx *ctx, import_source *src, int i, void *dst) {
    const import_tensor *t = &src->tensors[i];
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    hid_t mem = t->dtype == IMPORT_F16    ? half_le()
                : t->dtype == IMPORT_F32  ? H5Tcopy(H5T_IEEE_F32LE)
                : t->dtype == IMPORT_F64  ? H5Tcopy(H5T_IEEE_F64LE)
                : t->dtype == IMPORT_BF16 ? H5Tcopy(H5T_STD_U16LE)
                                          : -1;
    hid_t ds = mem < 0 ? -1 : H5Dopen2(src->h5, t->h5_path, H5P_DEFAULT);
    herr_t rc = ds < 0 ? -1 : H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst);
    if (ds >= 0) H5Dclose(ds);
    if (mem >= 0) H5Tclose(mem);
    fsdp_status s = rc < 0 ? h5_fail(ctx, "cannot read dataset", t->h5_path) : FSDP_OK;
    h5_unlock();
    if (s != FSDP_OK)
        s = fsdp_error_hop(ctx, s, __FILE__, __LINE__, __func__, "import '%s'", src->path);
    return FSDP_PASS(ctx, s);
}

static void h5src_close(import_source *src) {
    if (src->h5 >= 0 && h5_lock_within(src->lock_ms)) { /* not taken: the file stays open */
        H5Fclose(src->h5);
        h5_unlock();
    }
    src->h5 = -1;
    for (int i = 0; i < src->n_tensors; i++) free(src->tensors[i].h5_path);
}

static const import_source_i h5_iface = {.read = h5src_read, .close = h5src_close};

fsdp_status import_open_h5(fsdp_ctx *ctx, const char *path, import_source *out) {
    *out = (import_source){.iface = &h5_iface, .path = path, .h5 = -1, .lock_ms = h5_lock_ms(ctx)};
    FSDP_TRY_AT(ctx, fsdp_zstd_filter_register(ctx)); /* a zstd-compressed export reads back */
    FSDP_TRY_AT(ctx, h5_lock(ctx));
    fsdp_status s = h5_open(ctx, path, &out->h5);
    visit v = {.ctx = ctx, .src = out};
    if (s == FSDP_OK && VISIT_OBJECTS(out->h5, on_object, &v) < 0 && v.status == FSDP_OK)
        s = h5_fail(ctx, "cannot list the datasets of", path);
    if (s == FSDP_OK) s = v.status;
    h5_unlock();
    return FSDP_PASS(ctx, s);
}
