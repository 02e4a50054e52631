/* h5.c: HDF5 files, attributes and datasets for checkpoints, with HDF5's errors as messages. */
#define _POSIX_C_SOURCE 200809L /* strdup, strnlen, stpcpy, fsync */
#include "ckpt/h5.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/region.h"
#include "ckpt/zstd_filter.h"
#include "core/error.h"

static pthread_mutex_t h5_mutex = PTHREAD_MUTEX_INITIALIZER;

int h5_lock_ms(const fsdp_ctx *ctx) {
    return ctx ? fsdp_world_timeout_ms(fsdp_ctx_world(ctx)) : 0;
}

bool h5_lock_within(int ms) {
    if (ms <= 0) {
        pthread_mutex_lock(&h5_mutex);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until); /* the clock pthread_mutex_timedlock reads */
        until.tv_sec += ms / 1000;
        until.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        if (pthread_mutex_timedlock(&h5_mutex, &until) != 0) return false;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* HDF5 prints nothing; h5_fail reports */
    return true;
}

fsdp_status h5_lock(fsdp_ctx *ctx) {
    return h5_lock_for(ctx, h5_lock_ms(ctx));
}

fsdp_status h5_lock_for(fsdp_ctx *ctx, int ms) {
    if (h5_lock_within(ms)) return FSDP_OK;
    return FSDP_FAIL(ctx, FSDP_ERR_TIMEOUT,
                     "waited %d ms (the world's timeout) to use HDF5: another thread of this "
                     "process has been inside an HDF5 call all that time (libfsdp makes one HDF5 "
                     "call at a time), reading or writing a file that does not answer (a hung "
                     "network file system?)",
                     ms);
}

void h5_unlock(void) {
    pthread_mutex_unlock(&h5_mutex);
}

fsdp_status h5_create(fsdp_ctx *ctx, const char *path, hid_t *out) {
    *out = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    return *out < 0 ? h5_fail(ctx, "cannot create", path) : FSDP_OK;
}

fsdp_status h5_open(fsdp_ctx *ctx, const char *path, hid_t *out) {
    *out = -1;
    FSDP_TRY_AT(ctx, ckpt_check_regular(ctx, path));
    *out = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    return *out < 0 ? h5_fail(ctx, "cannot open", path) : FSDP_OK;
}

fsdp_status h5_attr_write_i64(fsdp_ctx *ctx, hid_t loc, const char *name, int64_t v) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_INT64, &v);
    if (a >= 0) H5Aclose(a);
    H5Sclose(space);
    return rc < 0 ? h5_fail(ctx, "cannot write attribute", name) : FSDP_OK;
}

fsdp_status h5_attr_write_str(fsdp_ctx *ctx, hid_t loc, const char *name, const char *s) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(s) + 1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = a < 0 ? -1 : H5Awrite(a, type, s);
    if (a >= 0) H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
    return rc < 0 ? h5_fail(ctx, "cannot write attribute", name) : FSDP_OK;
}

/* The attribute, which must be a scalar of the given class: an integer exactly as libfsdp
 * writes it (a flipped byte order or size would change the value HDF5 converts). */
static fsdp_status open_scalar_attr(fsdp_ctx *ctx, hid_t loc, const char *name, H5T_class_t cls,
                                    hid_t *out) {
    *out = H5Aopen(loc, name, H5P_DEFAULT);
    if (*out < 0) return h5_fail(ctx, "missing attribute", name);
    hid_t space = H5Aget_space(*out), type = H5Aget_type(*out);
    bool ok = space >= 0 && type >= 0 && H5Sget_simple_extent_type(space) == H5S_SCALAR &&
              H5Tget_class(type) == cls &&
              (cls != H5T_INTEGER || H5Tequal(type, H5T_STD_I64LE) > 0);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (ok) return FSDP_OK;
    H5Aclose(*out);
    H5Eclear2(H5E_DEFAULT);
    return FSDP_FAIL(ctx, FSDP_ERR_IO, "attribute '%s' is not a scalar %s", name,
                     cls == H5T_INTEGER ? "little-endian 64-bit integer" : "string");
}

fsdp_status h5_attr_read_i64(fsdp_ctx *ctx, hid_t loc, const char *name, int64_t *v) {
    hid_t a;
    FSDP_TRY_AT(ctx, open_scalar_attr(ctx, loc, name, H5T_INTEGER, &a));
    herr_t rc = H5Aread(a, H5T_NATIVE_INT64, v);
    H5Aclose(a);
    return rc < 0 ? h5_fail(ctx, "cannot read attribute", name) : FSDP_OK;
}

fsdp_status h5_attr_read_str(fsdp_ctx *ctx, hid_t loc, const char *name, size_t max_len,
                             char **out) {
    hid_t a;
    FSDP_TRY_AT(ctx, open_scalar_attr(ctx, loc, name, H5T_STRING, &a));
    hid_t ftype = H5Aget_type(a);
    size_t size = H5Tget_size(ftype);
    bool variable = H5Tis_variable_str(ftype) > 0;
    H5Tclose(ftype);
    if (variable || size == 0 || size > max_len + 1) {
        H5Aclose(a);
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "attribute '%s' is a string of %zu bytes; at most %zu fixed-length bytes "
                         "are read",
                         name, size, max_len);
    }
    char *s = calloc(size + 1, 1);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, size);
    herr_t rc = s ? H5Aread(a, type, s) : -1;
    H5Tclose(type);
    H5Aclose(a);
    if (rc < 0) {
        free(s);
        return h5_fail(ctx, "cannot read attribute", name);
    }
    *out = s;
    return FSDP_OK;
}

static hid_t file_type(fsdp_dtype dtype) {
    return dtype == FSDP_DTYPE_BF16 ? H5T_STD_U16LE : H5T_IEEE_F32LE;
}
static hid_t mem_type(fsdp_dtype dtype) {
    return dtype == FSDP_DTYPE_BF16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;
}

/* Chunks of about 1 MiB: whole trailing dims, as many leading rows as fit. */
static void chunk_dims(int ndim, const hsize_t *dims, size_t elem, hsize_t *chunk) {
    hsize_t budget = (1u << 20) / elem;
    for (int d = ndim - 1; d >= 0; d--) {
        hsize_t c = dims[d] < budget ? dims[d] : budget;
        chunk[d] = c ? c : 1;
        budget = budget / chunk[d] ? budget / chunk[d] : 1;
    }
}

static hid_t dataset_props(fsdp_ctx *ctx, int ndim, const hsize_t *dims, size_t elem, int level,
                           fsdp_status *st) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t n = 1, chunk[FSDP_MAX_DIMS];
    for (int d = 0; d < ndim; d++) n *= dims[d];
    if (ndim == 0 || n == 0) return dcpl;
    chunk_dims(ndim, dims, elem, chunk);
    H5Pset_chunk(dcpl, ndim, chunk);
    if (level != FSDP_CKPT_NO_COMPRESSION) {
        *st = fsdp_zstd_filter_register(ctx);
        unsigned cd = (unsigned)(level > 0 ? level : 3);
        if (*st == FSDP_OK && H5Pset_filter(dcpl, FSDP_H5Z_ZSTD, H5Z_FLAG_MANDATORY, 1, &cd) < 0)
            *st = h5_fail(ctx, "cannot set the zstd filter on", "dataset");
    }
    if (*st == FSDP_OK && H5Pset_fletcher32(dcpl) < 0)
        *st = h5_fail(ctx, "cannot set Fletcher32 on", "dataset");
    return dcpl;
}

static fsdp_status write_dataset(fsdp_ctx *ctx, hid_t file, const char *path, hid_t ftype,
                                 hid_t mtype, int ndim, const int64_t *dims, const void *data,
                                 int level) {
    hsize_t hd[FSDP_MAX_DIMS + 1];
    for (int d = 0; d < ndim; d++) hd[d] = (hsize_t)dims[d];
    fsdp_status st = FSDP_OK;
    hid_t dcpl = dataset_props(ctx, ndim, hd, H5Tget_size(mtype), level, &st);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t space = ndim ? H5Screate_simple(ndim, hd, NULL) : H5Screate(H5S_SCALAR);
    hid_t ds = st == FSDP_OK ? H5Dcreate2(file, path, ftype, space, lcpl, dcpl, H5P_DEFAULT) : -1;
    if (st == FSDP_OK && (ds < 0 || H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        st = h5_fail(ctx, "cannot write dataset", path);
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
    return FSDP_PASS(ctx, st);
}

fsdp_status h5_write(fsdp_ctx *ctx, hid_t file, const char *path, fsdp_dtype dtype, int ndim,
                     const int64_t *dims, const void *data, int level) {
    return write_dataset(ctx, file, path, file_type(dtype), mem_type(dtype), ndim, dims, data,
                         level);
}

fsdp_status h5_write_table(fsdp_ctx *ctx, hid_t file, const char *path, int64_t rows, int cols,
                           const int64_t *data) {
    int64_t dims[2] = {rows, cols};
    return write_dataset(ctx, file, path, H5T_STD_I64LE, H5T_NATIVE_INT64, 2, dims, data,
                         FSDP_CKPT_NO_COMPRESSION);
}

fsdp_status h5_write_bytes(fsdp_ctx *ctx, hid_t file, const char *path, const void *data,
                           size_t len) {
    int64_t n = (int64_t)len;
    return write_dataset(ctx, file, path, H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, &n, data,
                         FSDP_CKPT_NO_COMPRESSION);
}

static void to_hsize(const fsdp_state_region *r, const fsdp_state_region *base, hsize_t *off,
                     hsize_t *cnt) {
    for (int d = 0; d < r->ndim; d++) {
        off[d] = (hsize_t)(r->offset[d] - base->offset[d]);
        cnt[d] = (hsize_t)r->count[d];
    }
}

fsdp_status h5_read_part(fsdp_ctx *ctx, hid_t file, const char *path, fsdp_dtype dtype,
                         const fsdp_state_region *stored, const fsdp_state_region *part, void *dst,
                         const fsdp_state_region *dst_box) {
    int nd = stored->ndim;
    hsize_t want[FSDP_MAX_DIMS], dims[FSDP_MAX_DIMS], off[FSDP_MAX_DIMS], cnt[FSDP_MAX_DIMS];
    for (int d = 0; d < nd; d++) want[d] = (hsize_t)stored->count[d];
    hid_t ds;
    FSDP_TRY_AT(ctx, h5_dataset_open(ctx, file, path, file_type(dtype), nd, want, &ds, dims));
    hid_t fspace = H5Dget_space(ds), mspace;
    if (nd == 0) {
        mspace = H5Screate(H5S_SCALAR);
    } else {
        to_hsize(part, stored, off, cnt);
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, off, NULL, cnt, NULL);
        hsize_t mdims[FSDP_MAX_DIMS];
        for (int d = 0; d < nd; d++) mdims[d] = (hsize_t)dst_box->count[d];
        mspace = H5Screate_simple(nd, mdims, NULL);
        to_hsize(part, dst_box, off, cnt);
        H5Sselect_hyperslab(mspace, H5S_SELECT_SET, off, NULL, cnt, NULL);
    }
    herr_t rc = H5Dread(ds, mem_type(dtype), mspace, fspace, H5P_DEFAULT, dst);
    H5Sclose(mspace);
    H5Sclose(fspace);
    H5Dclose(ds);
    return rc < 0 ? h5_fail(ctx,
                            "cannot read (corrupt or truncated: checksum or decompression "
                            "failed)",
                            path)
                  : FSDP_OK;
}

/* The slab of `stored` (ndim >= 1) that iteration `at` covers, given k, the outermost dim read in
 * blocks of `block` (the dims before k one index at a time, those after whole). */
static void slab_of(const fsdp_state_region *stored, int k, int64_t block, const int64_t *at,
                    fsdp_state_region *slab) {
    *slab = *stored;
    for (int d = 0; d < k; d++) slab->offset[d] += at[d], slab->count[d] = 1;
    slab->offset[k] += at[k];
    slab->count[k] = stored->count[k] - at[k] < block ? stored->count[k] - at[k] : block;
}

fsdp_status h5_read_rows(fsdp_ctx *ctx, hid_t file, const char *path, fsdp_dtype dtype,
                         const fsdp_state_region *stored, size_t budget, h5_rows_fn fn,
                         void *user) {
    int nd = stored->ndim, k = 0;
    size_t elem = fsdp_dtype_size(dtype), inner = elem;
    hsize_t want[FSDP_MAX_DIMS], dims[FSDP_MAX_DIMS], off[FSDP_MAX_DIMS], cnt[FSDP_MAX_DIMS];
    for (int d = 0; d < nd; d++) want[d] = (hsize_t)stored->count[d];
    /* k: the outermost dim whose inner rows fit the budget; blocks of it per slab */
    for (k = nd ? nd - 1 : 0; k > 0 && inner * (size_t)stored->count[k] <= budget; k--)
        inner *= (size_t)stored->count[k];
    int64_t block = nd ? (int64_t)(budget / inner) : 1;
    block = block < 1 ? 1 : nd && block > stored->count[k] ? stored->count[k] : block;
    hid_t ds;
    FSDP_TRY_AT(ctx, h5_dataset_open(ctx, file, path, file_type(dtype), nd, want, &ds, dims));
    void *buf = malloc((size_t)block * inner + 1);
    hid_t fspace = H5Dget_space(ds);
    fsdp_status s = buf ? FSDP_OK : FSDP_FAIL(ctx, FSDP_ERR_OUT_OF_MEMORY, "reading '%s'", path);
    int64_t at[FSDP_MAX_DIMS] = {0};
    while (s == FSDP_OK) {
        fsdp_state_region slab = *stored;
        hid_t mspace = H5Screate(H5S_SCALAR);
        if (nd) {
            slab_of(stored, k, block, at, &slab);
            to_hsize(&slab, stored, off, cnt);
            H5Sselect_hyperslab(fspace, H5S_SELECT_SET, off, NULL, cnt, NULL);
            H5Sclose(mspace);
            hsize_t n = (hsize_t)region_numel(&slab);
            mspace = H5Screate_simple(1, &n, NULL);
        }
        if (H5Dread(ds, mem_type(dtype), mspace, fspace, H5P_DEFAULT, buf) < 0)
            s = h5_fail(ctx, "cannot read (corrupt or truncated: checksum or decompression failed)",
                        path);
        H5Sclose(mspace);
        if (s == FSDP_OK) s = fn(ctx, &slab, buf, user);
        int d = nd ? k : -1; /* the next slab: dim k by blocks, the dims before it by one */
        for (at[k] += nd ? slab.count[k] : 0; d >= 0; d--) {
            if (d < k) at[d]++;
            if (at[d] < stored->count[d]) break;
            at[d] = 0;
        }
        if (d < 0) break;
    }
    H5Sclose(fspace);
    H5Dclose(ds);
    free(buf);
    return FSDP_PASS(ctx, s);
}

/* Whether `bytes` of uncompressed data can be in the file at all: no table or string of
 * metadata.h5 is larger than the file, so nothing larger is allocated for one. */
static bool fits_file(hid_t file, uint64_t bytes) {
    hsize_t size = 0;
    bool ok = H5Fget_filesize(file, &size) >= 0 && bytes <= size;
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

fsdp_status h5_read_table(fsdp_ctx *ctx, hid_t file, const char *path, int cols, int64_t max_rows,
                          int64_t *rows, int64_t **out) {
    hid_t ds;
    hsize_t dims[2];
    FSDP_TRY_AT(ctx, h5_dataset_open(ctx, file, path, H5T_STD_I64LE, 2, NULL, &ds, dims));
    if (dims[1] != (hsize_t)cols || dims[0] > (hsize_t)max_rows ||
        !fits_file(file, dims[0] * dims[1] * sizeof(int64_t))) {
        H5Dclose(ds);
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "table '%s' is (%llu, %llu); expected %d columns and at most %lld rows "
                         "(and no more than its file holds)",
                         path, (unsigned long long)dims[0], (unsigned long long)dims[1], cols,
                         (long long)max_rows);
    }
    int64_t *t = malloc((size_t)(dims[0] * dims[1]) * sizeof *t + 1);
    herr_t rc = t ? H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, t) : -1;
    H5Dclose(ds);
    if (rc < 0) {
        free(t);
        return h5_fail(ctx, "cannot read table", path);
    }
    *rows = (int64_t)dims[0];
    *out = t;
    return FSDP_OK;
}

fsdp_status h5_read_bytes(fsdp_ctx *ctx, hid_t file, const char *path, size_t max_len, char **out,
                          size_t *len) {
    hid_t ds;
    hsize_t dims[1];
    FSDP_TRY_AT(ctx, h5_dataset_open(ctx, file, path, H5T_STD_U8LE, 1, NULL, &ds, dims));
    if (dims[0] > max_len || !fits_file(file, dims[0])) {
        H5Dclose(ds);
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "'%s' holds %llu bytes; at most %zu (and no more than its file) are read",
                         path, (unsigned long long)dims[0], max_len);
    }
    char *s = calloc(dims[0] + 1, 1);
    herr_t rc =
        s ? (dims[0] ? H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s) : 0) : -1;
    H5Dclose(ds);
    if (rc < 0) {
        free(s);
        return h5_fail(ctx, "cannot read", path);
    }
    *out = s;
    *len = dims[0];
    return FSDP_OK;
}

int64_t h5_stored_bytes(hid_t file, const char *path) {
    hid_t ds = H5Dopen2(file, path, H5P_DEFAULT);
    if (ds < 0) return -1;
    int64_t n = (int64_t)H5Dget_storage_size(ds);
    H5Dclose(ds);
    return n;
}
